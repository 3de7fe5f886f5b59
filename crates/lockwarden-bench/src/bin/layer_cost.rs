//! `layer_cost APP N`: N requests through one axum app in this process, over
//! `LockClient::in_memory()`, with no network and no Redis, so that what the HTTP layers
//! cost the client can be counted in instructions (`scripts/layer_cost.py` runs it under
//! callgrind at two sizes and takes the difference), free of the shared machine's noise
//! that the requests/s of workload 7 carry.
//!
//! Apps: `plain` (no lock), `rate-handler` (`RateLimiter::check` in the handler),
//! `rate-layer` (`RateLimitLayer::by_header`), `lock-handler` (`try_acquire` and
//! `release` in the handler), `lock-layer` (`LockLayer::by_header`), `limit-layer`
//! (`LimitLayer::permits(5).by_header`). Every request has a fresh key and must be
//! answered `201` with proof that the handler saw what was taken; anything else exits
//! non-zero.
//!
//! `layer_cost APP N REDIS_URL` runs the same over Redis at `REDIS_URL` (redis-rs and the
//! engine's calls then count, Redis itself does not), with two more apps that use no
//! library but redis-rs: `raw-rate` (the rate script sent raw from the handler) and
//! `raw-rate-mw` (the same from an axum middleware: the thinnest rate-limit layer), and
//! `raw-lock`: the plain lock's commands sent raw from the handler as `lock-handler`'s
//! client sends them (the take as the Redis function the client loaded, then `HDEL` of
//! the holder and a waiter's mark; nobody waits, so no notice).

use std::process::ExitCode;
use std::time::Duration;

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, Request, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Extension, Router};
use http_body_util::BodyExt;
use lockwarden::{
    LimitLayer, LockClient, LockInfo, LockLayer, PermitInfo, RateDecision, RateLimitLayer,
    RateLimiter, RatePolicy,
};
use redis::aio::ConnectionManager;
use tower::ServiceExt;

const KEY: &str = "idempotency-key";

/// `lua/rate_limit.lua`, sent raw by the two raw apps.
static RATE_LIMIT: std::sync::LazyLock<redis::Script> =
    std::sync::LazyLock::new(|| redis::Script::new(include_str!("../../../../lua/rate_limit.lua")));

fn answer(saw: bool) -> Response {
    match saw {
        true => StatusCode::CREATED.into_response(),
        false => (StatusCode::INTERNAL_SERVER_ERROR, "nothing taken").into_response(),
    }
}

fn key(headers: &HeaderMap) -> &str {
    headers.get(KEY).and_then(|v| v.to_str().ok()).unwrap_or("")
}

async fn plain() -> Response {
    answer(true)
}

async fn rate_handler(State(rates): State<RateLimiter>, headers: HeaderMap) -> Response {
    let decision = rates.check(key(&headers)).await;
    answer(decision.is_ok_and(|d| d.is_allowed()))
}

/// `lua/rate_limit.lua` by `EVALSHA` from the handler with the arguments the limiter
/// sends: the decision with no library but redis-rs (Redis mode only).
async fn raw_rate(State(mut redis): State<ConnectionManager>, headers: HeaderMap) -> Response {
    let mut decision = RATE_LIMIT.key(format!("lockwarden:rate:{{cost:{}}}:second", key(&headers)));
    decision.arg(1).arg(999_999).arg("1:1000000");
    let left = decision.invoke_async::<i64>(&mut redis).await;
    answer(left.is_ok_and(|left| left >= 0))
}

/// The thinnest rate-limit layer: an axum middleware sending the script raw, as
/// [`raw_rate`] does, then the handler (Redis mode only).
async fn raw_rate_middleware(
    State(mut redis): State<ConnectionManager>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let mut decision = RATE_LIMIT.key(format!(
        "lockwarden:rate:{{cost:{}}}:second",
        key(request.headers())
    ));
    decision.arg(1).arg(999_999).arg("1:1000000");
    match decision.invoke_async::<i64>(&mut redis).await {
        Ok(left) if left >= 0 => next.run(request).await,
        _ => answer(false),
    }
}

/// The take's function name, as the client names it (loaded by the client at connect).
static TAKE: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    let take = redis::Script::new(include_str!("../../../../lua/acquire.lua"));
    format!("lockwarden_{}", take.get_hash())
});

/// [`lock_handler`]'s cycle with no library but redis-rs (Redis mode only).
async fn raw_lock(State(mut redis): State<ConnectionManager>, headers: HeaderMap) -> Response {
    let lock = format!("lockwarden:{{http:{}}}", key(&headers));
    let holder = "layer-cost-holder";
    let mut take = redis::cmd("FCALL");
    take.arg(&*TAKE)
        .arg(2)
        .arg(&lock)
        .arg(format!("{lock}:fence"))
        .arg(holder)
        .arg(30_000);
    let Ok(token) = take.query_async::<i64>(&mut redis).await else {
        return answer(false);
    };
    let mut release = redis::cmd("HDEL");
    release.arg(&lock).arg(holder).arg("~w1").arg("~w2");
    let deleted = release.query_async::<i64>(&mut redis).await;
    answer(token > 0 && deleted.is_ok_and(|d| d == 1))
}

async fn rate_layer(decision: Option<Extension<RateDecision>>) -> Response {
    answer(decision.is_some())
}

async fn lock_handler(State(client): State<LockClient>, headers: HeaderMap) -> Response {
    let lock = client.lock(format!("http:{}", key(&headers)));
    let Ok(guard) = lock.try_acquire(Duration::ZERO).await else {
        return answer(false);
    };
    answer(guard.release().await.is_ok())
}

async fn lock_layer(lock: Option<Extension<LockInfo>>) -> Response {
    answer(lock.is_some())
}

async fn limit_layer(permit: Option<Extension<PermitInfo>>) -> Response {
    answer(permit.is_some())
}

fn app(
    name: &str,
    client: &LockClient,
    rates: &RateLimiter,
    redis: Option<&ConnectionManager>,
) -> Option<Router> {
    Some(match name {
        "raw-rate-mw" => {
            Router::new()
                .route("/orders", post(plain))
                .layer(axum::middleware::from_fn_with_state(
                    redis?.clone(),
                    raw_rate_middleware,
                ))
        }
        "raw-lock" => Router::new()
            .route("/orders", post(raw_lock))
            .with_state(redis?.clone()),
        "raw-rate" => Router::new()
            .route("/orders", post(raw_rate))
            .with_state(redis?.clone()),
        "plain" => Router::new().route("/orders", post(plain)),
        "rate-handler" => Router::new()
            .route("/orders", post(rate_handler))
            .with_state(rates.clone()),
        "rate-layer" => Router::new()
            .route("/orders", post(rate_layer))
            .layer(RateLimitLayer::limiter(rates.clone()).by_header("Idempotency-Key")),
        "lock-handler" => Router::new()
            .route("/orders", post(lock_handler))
            .with_state(client.clone()),
        "lock-layer" => Router::new()
            .route("/orders", post(lock_layer))
            .layer(LockLayer::by_header("Idempotency-Key").client(client.clone())),
        "limit-layer" => Router::new().route("/orders", post(limit_layer)).layer(
            LimitLayer::permits(5)
                .by_header("Idempotency-Key")
                .client(client.clone()),
        ),
        _ => return None,
    })
}

/// The client over Redis at `url`, and a plain connection beside it for the raw app.
async fn connected(
    url: &str,
) -> Result<(LockClient, Option<ConnectionManager>), Box<dyn std::error::Error>> {
    let client = LockClient::connect(url).await?;
    let redis = redis::Client::open(url)?.get_connection_manager().await?;
    Ok((client, Some(redis)))
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (Some(name), Some(Ok(n))) = (args.first(), args.get(1).map(|n| n.parse::<u64>())) else {
        eprintln!("usage: layer_cost APP N [REDIS_URL] (APP: plain, rate-handler, rate-layer, lock-handler, lock-layer, limit-layer; with REDIS_URL also raw-rate, raw-rate-mw, raw-lock)");
        return ExitCode::FAILURE;
    };
    let (client, redis) = match args.get(2) {
        None => (LockClient::in_memory(), None),
        Some(url) => match connected(url).await {
            Ok(both) => both,
            Err(e) => {
                eprintln!("{url}: {e}");
                return ExitCode::FAILURE;
            }
        },
    };
    // A million a second: every fresh key is admitted.
    let policy = RatePolicy::new("second", 1_000_000, Duration::from_secs(1));
    let rates = match client.rate_limiter("cost", [policy]) {
        Ok(rates) => rates,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::FAILURE;
        }
    };
    let Some(app) = app(name, &client, &rates, redis.as_ref()) else {
        eprintln!("no app `{name}`");
        return ExitCode::FAILURE;
    };
    for i in 0..n {
        let request = Request::post("/orders")
            .header(KEY, format!("k{i}"))
            .body(Body::from(r#"{"sku":"A-1001","qty":2}"#));
        let response = match request {
            Ok(request) => app.clone().oneshot(request).await,
            Err(e) => {
                eprintln!("{e}");
                return ExitCode::FAILURE;
            }
        };
        let Ok(response) = response;
        let status = response.status();
        let body = response.into_body().collect().await.map(|b| b.to_bytes());
        if status != StatusCode::CREATED || body.is_err() {
            eprintln!("{name}: request {i} answered {status}: {body:?}");
            return ExitCode::FAILURE;
        }
    }
    ExitCode::SUCCESS
}
