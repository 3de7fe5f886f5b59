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
use tower::ServiceExt;

const KEY: &str = "idempotency-key";

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

fn app(name: &str, client: &LockClient, rates: &RateLimiter) -> Option<Router> {
    Some(match name {
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

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (Some(name), Some(Ok(n))) = (args.first(), args.get(1).map(|n| n.parse::<u64>())) else {
        eprintln!("usage: layer_cost APP N (APP: plain, rate-handler, rate-layer, lock-handler, lock-layer, limit-layer)");
        return ExitCode::FAILURE;
    };
    let client = LockClient::in_memory();
    // A million a second: every fresh key is admitted.
    let policy = RatePolicy::new("second", 1_000_000, Duration::from_secs(1));
    let rates = match client.rate_limiter("cost", [policy]) {
        Ok(rates) => rates,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::FAILURE;
        }
    };
    let Some(app) = app(name, &client, &rates) else {
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
