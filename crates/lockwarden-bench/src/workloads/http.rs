//! Workload 7: HTTP. One small axum app (`POST /orders`, a JSON order in, a JSON order
//! out) with and without `LockLayer::by_header("Idempotency-Key")`, and with
//! `LimitLayer::permits(5).by_header("Idempotency-Key")` in its place (a permit per
//! request, held as the lock layer holds its lock) or
//! `RateLimitLayer::limiter(..).by_header("Idempotency-Key")` (one rate decision per
//! request under a million a second, nothing held), every request with a fresh key (so no
//! request can conflict or wait), each app served by hyper on its own
//! 127.0.0.1:0 listener in this process and driven by hyper HTTP/1.1 keep-alive client
//! connections, one task per connection:
//!
//! * **1 connection**: sequential requests, the apps taking turns request by request (in
//!   a new shuffled order each turn, so no app always follows the same one: a request
//!   right after one that ran the same scripts and code is faster), so the latency the
//!   lock adds is not hidden by queueing.
//! * **64 connections**: a fixed number of requests per app, bounded by a time limit,
//!   in rounds A B C C B A A B C C B A (each a quarter of the requests) so drift and the
//!   shared machine's bursts hit the apps alike. Requests/s, latency, CPU per
//!   request.
//!
//! Diagnostic apps show where the time goes: two raw `EVALSHA` of a trivial script in the
//! handler (the floor for an acquire and a release on the request path, as the layer has
//! them: it hands on the last body frame only once the release is done), lockwarden's own
//! acquire and release scripts sent raw from the handler (the same floor with the Redis
//! side of a lock cycle), the lock engine called in the handler without the layer
//! (`try_acquire(0)`, build the response, `release().await`), the same through the
//! `Locked<T>` extractor, a rate decision made in the handler (`RateLimiter::check`),
//! the rate decision's script sent raw from the handler (and, at 64 connections, the
//! minimal GCRA, redis-cell's algorithm in Lua: the floors of a decision), the layer
//! keyed by a field
//! of the JSON body (`by_json_field`: the body buffered before the lock), and the layer
//! with a fixed lease instead of the watchdog (1 connection only). Two prototypes, at 64
//! connections only, measure the ceilings the layers' targets are held against: the
//! thinnest rate-limit layer one can write (an axum `from_fn` middleware sending the rate
//! script raw), and the cheapest lock cycle on Redis (`SET NX PX`, then the
//! compare-and-delete script, raw from the handler: what rslock sends, none of
//! lockwarden's promises).
//!
//! Any non-2xx answer, or a handler that did not see the lock, permit or rate decision
//! (or saw one where none was taken), is a problem: the run exits non-zero. Afterwards
//! no lock may be left in Redis.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::{FromRequestParts, State};
use axum::http::request::Parts;
use axum::http::{header, HeaderMap, Request, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{middleware, Extension, Json, Router};
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use hyper_util::service::TowerToHyperService;
use lockwarden::{
    LimitLayer, LockClient, LockInfo, LockKey, LockLayer, Locked, PermitInfo, RateDecision,
    RateLimitLayer, RateLimiter, RatePolicy,
};
use redis::aio::ConnectionManager;
use redis::Script;
use serde_json::{json, Value};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::{JoinHandle, JoinSet};

use crate::baselines::{
    connection_manager, evalsha_pair, own_scripts_pair, BoxError, RawRelease, COMPARE_AND_DELETE,
};
use crate::check::Checks;
use crate::stats::{Report, Row, Summary, Windows};
use crate::workloads::{cpu_time, join_all, Ctx};

/// lockwarden's rate decision script, sent raw by [`App::RawRate`].
static RATE_LIMIT: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../../../lua/rate_limit.lua")));
/// The minimal GCRA, sent raw by [`App::RawGcra`].
static MINIMAL_GCRA: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../lua/gcra_cell.lua")));

const NAME: &str = "7 HTTP";
const SEQUENTIAL: &str = "7 HTTP, 1 connection";
const CONCURRENT: &str = "7 HTTP, 64 connections";
const CONNECTIONS: usize = 64;
const KEY_HEADER: &str = "idempotency-key";
/// Set by the handler when the request carries a `LockInfo`: proof the layer locked.
const TOKEN_HEADER: &str = "x-fencing-token";
/// The order every request posts, after its key as `"order_id"` (see [`order`]).
const ORDER: &str = r#""sku":"A-1001","qty":2}"#;
/// Throughput windows: a quick round of the no-lock app lasts only ~0.2 s.
const WINDOW: Duration = Duration::from_millis(20);
/// Lease of the fixed-lease layer variant.
const LEASE: Duration = Duration::from_secs(10);
/// Permits per key of the limit layer.
const LIMIT: u32 = 5;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum App {
    Plain,
    Evalsha,
    OwnScripts,
    Engine,
    /// The `Locked<T>` extractor, its guard released before answering.
    Extractor,
    Layer,
    /// `LockLayer::by_json_field`: the key read from the buffered body.
    JsonField,
    LayerLease,
    /// `LimitLayer::by_header`: a permit of a semaphore per key instead of a lock.
    Limit,
    /// A permit taken and given back in the handler, without the layer.
    PermitEngine,
    /// `.remember(..)`, every request a retry of one of 64 completed ones: the replay path.
    Replay,
    /// `RateLimitLayer::limiter(..).by_header`: one rate decision per request, nothing held.
    RateLimit,
    /// The same rate decision made in the handler, without the layer.
    RateEngine,
    /// `lua/rate_limit.lua` sent raw from the handler with the arguments the engine sends:
    /// the floor of a rate decision on the request path (no library on the client side).
    RawRate,
    /// The minimal GCRA the script is measured against (redis-cell's algorithm written in
    /// Lua, `lua/gcra_cell.lua`) sent raw from the handler: what any decision on the
    /// server's clock costs (64 connections only).
    RawGcra,
    /// The thinnest rate-limit layer one can write: an axum middleware (`from_fn`) that
    /// reads the key and sends `lua/rate_limit.lua` raw, then runs the handler with what
    /// the decision left (or answers `429`): the floor of a layer (64 connections only).
    RawRateMiddleware,
    /// The cheapest lock cycle on Redis, rslock's commands sent raw from the handler
    /// (`SET NX PX`, then the compare-and-delete script): the floor of any lock on the
    /// request path, with none of lockwarden's promises (64 connections only).
    RawSetNx,
}

impl App {
    /// The apps of the 1-connection part. The first four are the references, in this
    /// order: no lock, the 2 × EVALSHA floor, lockwarden's scripts raw, the lock in the
    /// handler.
    const SEQUENTIAL: [App; 13] = [
        App::Plain,
        App::Evalsha,
        App::OwnScripts,
        App::Engine,
        App::Extractor,
        App::Layer,
        App::Limit,
        App::RateLimit,
        App::RateEngine,
        App::RawRate,
        App::PermitEngine,
        App::JsonField,
        App::LayerLease,
    ];
    /// The apps of the 64-connection part, run in this order and then reversed: the same
    /// references first (no lock first: the others' ratios are to it).
    const CONCURRENT: [App; 15] = [
        App::Plain,
        App::Evalsha,
        App::OwnScripts,
        App::Engine,
        App::Extractor,
        App::Layer,
        App::Limit,
        App::RateLimit,
        App::RateEngine,
        App::RawRate,
        App::RawGcra,
        App::RawRateMiddleware,
        App::RawSetNx,
        App::JsonField,
        App::Replay,
    ];

    fn name(self) -> &'static str {
        match self {
            App::Plain => "axum, no lock",
            App::Evalsha => "axum + 2 × EVALSHA in handler",
            App::OwnScripts => "axum + lockwarden's 2 scripts, raw, in handler",
            App::Engine => "axum + lock in handler (no layer)",
            App::Extractor => "axum + Locked<T> extractor (no layer)",
            App::Layer => "axum + LockLayer::by_header",
            App::JsonField => "axum + LockLayer::by_json_field",
            App::LayerLease => "axum + LockLayer (10 s lease)",
            App::Limit => "axum + LimitLayer::by_header (5 permits)",
            App::PermitEngine => "axum + permit in handler (no layer)",
            App::Replay => "axum + LockLayer.remember, replays",
            App::RateLimit => "axum + RateLimitLayer::by_header",
            App::RateEngine => "axum + rate decision in handler (no layer)",
            App::RawRate => "axum + rate_limit.lua, raw, in handler",
            App::RawGcra => "axum + minimal GCRA (redis-cell's, in Lua), raw, in handler",
            App::RawRateMiddleware => "axum + middleware sending rate_limit.lua raw",
            App::RawSetNx => "axum + SET NX PX and compare-and-delete, raw, in handler",
        }
    }

    fn slug(self) -> &'static str {
        match self {
            App::Plain => "plain",
            App::Evalsha => "eval",
            App::OwnScripts => "own",
            App::Engine => "engine",
            App::Extractor => "extract",
            App::Layer => "layer",
            App::JsonField => "json",
            App::LayerLease => "lease",
            App::Limit => "limit",
            App::PermitEngine => "permit-engine",
            App::Replay => "replay",
            App::RateLimit => "rate",
            App::RateEngine => "rate-engine",
            App::RawRate => "raw-rate",
            App::RawGcra => "raw-gcra",
            App::RawRateMiddleware => "raw-rate-mw",
            App::RawSetNx => "raw-setnx",
        }
    }

    fn locked(self) -> bool {
        matches!(
            self,
            App::Engine
                | App::Extractor
                | App::Layer
                | App::JsonField
                | App::LayerLease
                | App::Limit
                | App::PermitEngine
                | App::RateLimit
                | App::RateEngine
                | App::RawRate
                | App::RawGcra
                | App::RawRateMiddleware
                | App::RawSetNx
        )
    }

    fn router(self, client: &LockClient, redis: &ConnectionManager, rates: &RateLimiter) -> Router {
        let orders = Router::new().route("/orders", post(create_order));
        let layer = LockLayer::by_header("Idempotency-Key").client(client.clone());
        match self {
            App::Plain => orders,
            App::Evalsha => Router::new()
                .route("/orders", post(create_order_after_evalsha))
                .with_state(redis.clone()),
            App::OwnScripts => Router::new()
                .route("/orders", post(create_order_after_own_scripts))
                .with_state(redis.clone()),
            App::Engine => Router::new()
                .route("/orders", post(create_order_under_lock))
                .with_state(client.clone()),
            App::Extractor => Router::new()
                .route("/orders", post(create_order_locked))
                .with_state(client.clone()),
            App::Layer => orders.layer(layer),
            App::JsonField => {
                orders.layer(LockLayer::by_json_field("/order_id").client(client.clone()))
            }
            App::LayerLease => orders.layer(layer.lease(LEASE)),
            // Every request's key is fresh, as for the lock layer: each takes the first
            // permit of an idle semaphore.
            App::Limit => Router::new()
                .route("/orders", post(create_order_limited))
                .layer(
                    LimitLayer::permits(LIMIT)
                        .by_header("Idempotency-Key")
                        .client(client.clone()),
                ),
            App::PermitEngine => Router::new()
                .route("/orders", post(create_order_under_permit))
                .with_state(client.clone()),
            // A retry that overlaps the first request waits for its response.
            App::Replay => orders.layer(
                layer
                    .wait(Duration::from_secs(2))
                    .remember(Duration::from_secs(3600)),
            ),
            // Every request's key is fresh, and its policy admits a million a second: each
            // is one decision that admits it.
            App::RateLimit => Router::new()
                .route("/orders", post(create_order_rated))
                .layer(RateLimitLayer::limiter(rates.clone()).by_header("Idempotency-Key")),
            App::RateEngine => Router::new()
                .route("/orders", post(create_order_after_decision))
                .with_state(rates.clone()),
            App::RawRate | App::RawGcra => Router::new()
                .route("/orders", post(create_order_after_raw_decision))
                .with_state(RawDecision {
                    redis: redis.clone(),
                    minimal: self == App::RawGcra,
                }),
            App::RawRateMiddleware => Router::new()
                .route("/orders", post(create_order_after_raw_middleware))
                .layer(middleware::from_fn_with_state(
                    redis.clone(),
                    raw_rate_middleware,
                )),
            App::RawSetNx => Router::new()
                .route("/orders", post(create_order_under_raw_set_nx))
                .with_state(redis.clone()),
        }
    }
}

static NEXT_ORDER: AtomicU64 = AtomicU64::new(1);

async fn create_order(lock: Option<Extension<LockInfo>>, Json(order): Json<Value>) -> Response {
    created(&order, lock.map(|Extension(info)| info.fencing_token()))
}

/// The order app behind the limit layer: the same answer, with the permit's token.
async fn create_order_limited(
    permit: Option<Extension<PermitInfo>>,
    Json(order): Json<Value>,
) -> Response {
    created(&order, permit.map(|Extension(info)| info.fencing_token))
}

/// The order app behind the rate-limit layer: the same answer, with what its decision left
/// (in place of a token: the proof the layer decided).
async fn create_order_rated(
    decision: Option<Extension<RateDecision>>,
    Json(order): Json<Value>,
) -> Response {
    let left = decision.and_then(|Extension(d)| d.policies().first().map(|p| p.remaining()));
    created(&order, left.map(u64::from))
}

/// The rate-limit layer's work done by hand: one decision for the request's key, then the
/// order (with what the decision left), or `429`.
async fn create_order_after_decision(
    State(rates): State<RateLimiter>,
    headers: HeaderMap,
    Json(order): Json<Value>,
) -> Response {
    let Some(key) = headers.get(KEY_HEADER).and_then(|v| v.to_str().ok()) else {
        return (StatusCode::BAD_REQUEST, "no key").into_response();
    };
    match rates.check(key).await {
        Ok(decision) if decision.is_allowed() => {
            let left = decision
                .policies()
                .first()
                .map(|p| u64::from(p.remaining()));
            created(&order, left)
        }
        Ok(_) => (StatusCode::TOO_MANY_REQUESTS, "refused").into_response(),
        Err(e) => (StatusCode::SERVICE_UNAVAILABLE, e.to_string()).into_response(),
    }
}

/// The state of the raw decision apps: the connection, and which script they send.
#[derive(Clone)]
struct RawDecision {
    redis: ConnectionManager,
    /// The minimal GCRA (`lua/gcra_cell.lua`) rather than lockwarden's script.
    minimal: bool,
}

/// A rate decision with no library on the client side, by `EVALSHA` on the bucket the
/// limiter of [`run`] uses for `key` (one policy of a million a second: a 1 µs emission
/// interval, a burst of a million): `lua/rate_limit.lua` with the arguments the client
/// sends, or the minimal GCRA with redis-cell's. Then the order, with the debt (or what
/// is left) the script answered in place of a token.
async fn create_order_after_raw_decision(
    State(RawDecision { mut redis, minimal }): State<RawDecision>,
    headers: HeaderMap,
    Json(order): Json<Value>,
) -> Response {
    let Some(key) = headers.get(KEY_HEADER).and_then(|v| v.to_str().ok()) else {
        return (StatusCode::BAD_REQUEST, "no key").into_response();
    };
    let bucket = raw_bucket(key);
    let decided = match minimal {
        false => {
            let mut decision = RATE_LIMIT.key(bucket);
            decision.arg(1).arg(999_999).arg("1:1000000");
            decision.invoke_async::<i64>(&mut redis).await
        }
        // Its reply: limited (0 or 1), the limit, what is left, retry and reset times.
        true => {
            let mut decision = MINIMAL_GCRA.key(bucket);
            decision.arg(999_999).arg(1_000_000).arg(1).arg(1);
            let reply = decision.invoke_async::<Vec<i64>>(&mut redis).await;
            reply.map(|reply| match reply.as_slice() {
                [0, _, left, ..] => *left,
                _ => -1,
            })
        }
    };
    match decided {
        Ok(left) if left >= 0 => created(&order, Some(left as u64)),
        Ok(_) => (StatusCode::TOO_MANY_REQUESTS, "refused").into_response(),
        Err(e) => (StatusCode::SERVICE_UNAVAILABLE, e.to_string()).into_response(),
    }
}

/// The key's bucket as the limiter of [`run`] names it.
fn raw_bucket(key: &str) -> String {
    format!("lockwarden:rate:{{w7:{key}}}:second")
}

/// What a raw decision left, put into the request by [`raw_rate_middleware`].
#[derive(Clone, Copy)]
struct RawLeft(u64);

/// The thinnest rate-limit layer: the key read, `lua/rate_limit.lua` sent raw with the
/// limiter's arguments, then the handler with what was left, or `429`.
async fn raw_rate_middleware(
    State(mut redis): State<ConnectionManager>,
    mut request: axum::extract::Request,
    next: middleware::Next,
) -> Response {
    let key = request
        .headers()
        .get(KEY_HEADER)
        .and_then(|v| v.to_str().ok());
    let Some(key) = key else {
        return (StatusCode::BAD_REQUEST, "no key").into_response();
    };
    let mut decision = RATE_LIMIT.key(raw_bucket(key));
    decision.arg(1).arg(999_999).arg("1:1000000");
    match decision.invoke_async::<i64>(&mut redis).await {
        Ok(left) if left >= 0 => {
            request.extensions_mut().insert(RawLeft(left as u64));
            next.run(request).await
        }
        Ok(_) => (StatusCode::TOO_MANY_REQUESTS, "refused").into_response(),
        Err(e) => (StatusCode::SERVICE_UNAVAILABLE, e.to_string()).into_response(),
    }
}

/// The order app behind [`raw_rate_middleware`]: the order, with what the decision left.
async fn create_order_after_raw_middleware(
    left: Option<Extension<RawLeft>>,
    Json(order): Json<Value>,
) -> Response {
    created(&order, left.map(|Extension(RawLeft(left))| left))
}

/// The cheapest lock cycle around the order: `SET <key> <token> NX PX`, the order, then
/// the compare-and-delete script (rslock's commands, no library on the client side).
async fn create_order_under_raw_set_nx(
    State(mut redis): State<ConnectionManager>,
    headers: HeaderMap,
    Json(order): Json<Value>,
) -> Response {
    static TOKEN: AtomicU64 = AtomicU64::new(1);
    let Some(key) = headers.get(KEY_HEADER).and_then(|v| v.to_str().ok()) else {
        return (StatusCode::BAD_REQUEST, "no key").into_response();
    };
    let (lock, token) = (
        format!("raw:{{{key}}}"),
        TOKEN.fetch_add(1, Ordering::Relaxed),
    );
    let taken: redis::RedisResult<Option<String>> = redis::cmd("SET")
        .arg(&lock)
        .arg(token)
        .arg("NX")
        .arg("PX")
        .arg(30_000)
        .query_async(&mut redis)
        .await;
    match taken {
        Ok(Some(_)) => {}
        Ok(None) => return (StatusCode::CONFLICT, "held").into_response(),
        Err(e) => return (StatusCode::SERVICE_UNAVAILABLE, e.to_string()).into_response(),
    }
    let response = created(&order, Some(token));
    let released = COMPARE_AND_DELETE
        .key(lock)
        .arg(token)
        .invoke_async::<i64>(&mut redis)
        .await;
    match released {
        Ok(1) => response,
        Ok(_) => (StatusCode::INTERNAL_SERVER_ERROR, "lost").into_response(),
        Err(e) => (StatusCode::SERVICE_UNAVAILABLE, e.to_string()).into_response(),
    }
}

/// The order made, with the fencing token of the lock (or permit) held, if any.
fn created(order: &Value, token: Option<u64>) -> Response {
    let id = NEXT_ORDER.fetch_add(1, Ordering::Relaxed);
    let body = json!({ "id": id, "sku": order["sku"], "qty": order["qty"], "status": "created" });
    let mut response = (StatusCode::CREATED, Json(body)).into_response();
    if let Some(token) = token {
        response.headers_mut().insert(TOKEN_HEADER, token.into());
    }
    response
}

async fn create_order_after_evalsha(
    State(mut redis): State<ConnectionManager>,
    lock: Option<Extension<LockInfo>>,
    order: Json<Value>,
) -> Response {
    if let Err(e) = evalsha_pair(&mut redis).await {
        return (StatusCode::SERVICE_UNAVAILABLE, e.to_string()).into_response();
    }
    create_order(lock, order).await
}

/// The Redis side of a lock cycle with no client-side work: lockwarden's acquire and
/// release scripts sent raw on the request's key.
async fn create_order_after_own_scripts(
    State(mut redis): State<ConnectionManager>,
    headers: HeaderMap,
    order: Json<Value>,
) -> Response {
    let Some(key) = headers.get(KEY_HEADER).and_then(|v| v.to_str().ok()) else {
        return (StatusCode::BAD_REQUEST, "no key").into_response();
    };
    if let Err(e) = own_scripts_pair(&mut redis, key, false, RawRelease::Script).await {
        return (StatusCode::SERVICE_UNAVAILABLE, e.to_string()).into_response();
    }
    create_order(None, order).await
}

/// The request's key, as the `Locked<T>` extractor takes it.
struct OrderKey(String);

impl LockKey for OrderKey {
    fn lock_key(&self) -> String {
        format!("extract:{}", self.0)
    }
}

impl<S: Send + Sync> FromRequestParts<S> for OrderKey {
    type Rejection = StatusCode;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        let key = parts.headers.get(KEY_HEADER).and_then(|v| v.to_str().ok());
        key.map(|k| OrderKey(k.to_owned()))
            .ok_or(StatusCode::BAD_REQUEST)
    }
}

/// The lock the `Locked<T>` extractor took, released (awaited) before answering, as the
/// layer does.
async fn create_order_locked(Locked(key): Locked<OrderKey>, order: Json<Value>) -> Response {
    let response = create_order(Some(Extension(key.info())), order).await;
    match key.release().await {
        Ok(_) => response,
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    }
}

/// The layer's work done by hand: lock the key (one attempt, as the layer's default),
/// build the response, release (awaited, as the layer does before the last body frame).
async fn create_order_under_lock(
    State(client): State<LockClient>,
    headers: HeaderMap,
    order: Json<Value>,
) -> Response {
    let Some(key) = headers.get(KEY_HEADER).and_then(|v| v.to_str().ok()) else {
        return (StatusCode::BAD_REQUEST, "no key").into_response();
    };
    match client
        .lock(format!("engine:{key}"))
        .try_acquire(Duration::ZERO)
        .await
    {
        Ok(guard) => {
            let response = create_order(Some(Extension(guard.info())), order).await;
            match guard.release().await {
                Ok(()) => response,
                Err(e) => (StatusCode::SERVICE_UNAVAILABLE, e.to_string()).into_response(),
            }
        }
        Err(e) => (StatusCode::CONFLICT, e.to_string()).into_response(),
    }
}

/// The limit layer's work done by hand: a permit of the request key's semaphore (one
/// attempt, as the layer's default), the response built, the permit given back (awaited).
async fn create_order_under_permit(
    State(client): State<LockClient>,
    headers: HeaderMap,
    Json(order): Json<Value>,
) -> Response {
    let Some(key) = headers.get(KEY_HEADER).and_then(|v| v.to_str().ok()) else {
        return (StatusCode::BAD_REQUEST, "no key").into_response();
    };
    match client
        .semaphore(format!("permit-engine:{key}"), LIMIT)
        .try_acquire(Duration::ZERO)
        .await
    {
        Ok(guard) => {
            let response = created(&order, Some(guard.fencing_token()));
            match guard.release().await {
                Ok(()) => response,
                Err(e) => (StatusCode::SERVICE_UNAVAILABLE, e.to_string()).into_response(),
            }
        }
        Err(e) => (StatusCode::CONFLICT, e.to_string()).into_response(),
    }
}

/// An app served on 127.0.0.1:0; dropping it stops the server and its connections.
struct Server {
    addr: SocketAddr,
    task: JoinHandle<()>,
}

impl Drop for Server {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn serve(router: Router) -> Result<Server, BoxError> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let task = tokio::spawn(async move {
        // Owned by the accept loop, so aborting it closes every connection as well.
        let mut connections = JoinSet::new();
        while let Ok((stream, _)) = listener.accept().await {
            let _ = stream.set_nodelay(true);
            let service = TowerToHyperService::new(router.clone());
            connections.spawn(async move {
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    Ok(Server { addr, task })
}

type Sender = SendRequest<Full<Bytes>>;

/// A keep-alive HTTP/1.1 client connection; its task ends when the sender is dropped.
async fn connect(addr: SocketAddr) -> Result<Sender, BoxError> {
    let stream = TcpStream::connect(addr).await?;
    stream.set_nodelay(true)?;
    let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(connection);
    Ok(sender)
}

/// One `POST /orders` with the fresh key `key`, body read to the end; returns its latency.
/// A non-2xx answer or a lock seen where none was expected (or the reverse) is a problem.
async fn order(
    sender: &mut Sender,
    app: App,
    key: &str,
    checks: &Checks,
) -> Result<Duration, BoxError> {
    let started = Instant::now();
    sender.ready().await?;
    let request = Request::post("/orders")
        .header(header::HOST, "127.0.0.1")
        .header(header::CONTENT_TYPE, "application/json")
        .header(KEY_HEADER, key)
        .body(Full::new(Bytes::from(format!(
            r#"{{"order_id":"{key}",{ORDER}"#
        ))))?;
    let response = sender.send_request(request).await?;
    let status = response.status();
    let saw_lock = response.headers().contains_key(TOKEN_HEADER);
    let body = response.into_body().collect().await?.to_bytes();
    let latency = started.elapsed();
    if !status.is_success() {
        checks.problem(format!(
            "{NAME}: {} answered {status} to a request with the fresh key `{key}`: {}",
            app.name(),
            String::from_utf8_lossy(&body)
        ));
    } else if app != App::Replay && saw_lock != app.locked() {
        let saw = if saw_lock { "saw" } else { "did not see" };
        checks.problem(format!(
            "{NAME}: {}: the handler {saw} a lock for `{key}`",
            app.name()
        ));
    }
    Ok(latency)
}

pub async fn run(ctx: &Ctx, report: &mut Report) -> Result<(), BoxError> {
    let sequential_requests = ctx.pick(2_000, 10_000);
    let sequential_limit = ctx.pick(Duration::from_secs(6), Duration::from_secs(30));
    let requests: u64 = ctx.pick(20_000, 200_000);
    let round_limit = ctx.pick(Duration::from_secs(4), Duration::from_secs(30));
    let warmup: u64 = ctx.pick(2_000, 5_000);

    let client = LockClient::connect(&ctx.url).await?;
    let redis = connection_manager(&ctx.url).await?;
    let rates = client.rate_limiter(
        "w7",
        [RatePolicy::new("second", 1_000_000, Duration::from_secs(1))],
    )?;
    let mut servers = Vec::new();
    for app in App::SEQUENTIAL.into_iter().chain([
        App::Replay,
        App::RawGcra,
        App::RawRateMiddleware,
        App::RawSetNx,
    ]) {
        servers.push((app, serve(app.router(&client, &redis, &rates)).await?));
    }
    let addr = |app: App| {
        servers
            .iter()
            .find(|(a, _)| *a == app)
            .map(|(_, s)| s.addr)
            .expect("every app is served")
    };

    let (_, evalsha) = ctx.fresh_baseline(report, NAME).await?;

    // 1 connection per app, sequential, the apps taking turns.
    let mut senders = Vec::new();
    for app in App::SEQUENTIAL {
        let mut sender = connect(addr(app)).await?;
        for i in 0..200 {
            let key = format!("w7-{}-seqwarm-{i}", app.slug());
            order(&mut sender, app, &key, &ctx.checks).await?;
        }
        senders.push(sender);
    }
    let samples = sequential(ctx, &mut senders, sequential_requests, sequential_limit).await?;
    drop(senders);
    let latency: Vec<Summary> = samples.iter().map(|s| Summary::micros(s)).collect();
    let (plain, floor, own, engine) = (latency[0], latency[1], latency[2], latency[3]);
    let permit_engine = App::SEQUENTIAL
        .iter()
        .position(|a| *a == App::PermitEngine)
        .map(|k| latency[k]);
    let rate_engine = App::SEQUENTIAL
        .iter()
        .position(|a| *a == App::RateEngine)
        .map(|k| latency[k]);
    for (app, s) in App::SEQUENTIAL.iter().zip(&latency) {
        let mut row = Row::new(SEQUENTIAL, app.name(), "latency per request", "µs")
            .summary(*s)
            .note(format!("{} sequential requests", s.n));
        if s.n < sequential_requests {
            row = row.note("stopped by the time limit");
        }
        report.push(row);
        if *app == App::Plain {
            continue;
        }
        let mut row = Row::new(
            SEQUENTIAL,
            app.name(),
            "added latency (p50 difference)",
            "µs",
        )
        .value(s.median - plain.median)
        .ratio_to(evalsha.median, "round trips: ÷ EVALSHA median")
        .note(format!("p99 difference {:.0} µs", s.p99 - plain.p99));
        row = match app {
            App::Evalsha => row.note("the floor: two round trips on the request path"),
            App::OwnScripts => row.note(format!(
                "{:+.1} µs vs the 2 × EVALSHA app: the Redis side of a lock cycle",
                s.median - floor.median
            )),
            App::Engine => row.note(format!(
                "{:+.1} µs vs the 2 × EVALSHA app, {:+.1} µs vs lockwarden's scripts raw",
                s.median - floor.median,
                s.median - own.median
            )),
            _ => row.note(format!(
                "{:+.1} µs vs the 2 × EVALSHA app, {:+.1} µs vs lockwarden's scripts raw, \
                 {:+.1} µs vs the lock in the handler",
                s.median - floor.median,
                s.median - own.median,
                s.median - engine.median
            )),
        };
        if let (App::RateLimit, Some(decision)) = (app, rate_engine) {
            row = row.note(format!(
                "{:+.1} µs vs the decision in the handler",
                s.median - decision.median
            ));
        }
        if let (App::Limit, Some(permit)) = (app, permit_engine) {
            row = row.note(format!(
                "{:+.1} µs vs the permit in the handler",
                s.median - permit.median
            ));
        }
        report.push(row);
    }
    let seq_at = |wanted: App| App::SEQUENTIAL.iter().position(|a| *a == wanted);
    if let (Some(layer), Some(limit)) = (seq_at(App::Layer), seq_at(App::Limit)) {
        let (layer, limit) = (latency[layer], latency[limit]);
        let (lock_added, limit_added) = (layer.median - plain.median, limit.median - plain.median);
        report.push(
            Row::new(
                SEQUENTIAL,
                App::Limit.name(),
                "added latency ÷ LockLayer's (p50 differences)",
                "",
            )
            .value(limit_added / lock_added)
            .note(format!(
                "target ≤ 1.1; {limit_added:+.1} µs vs {lock_added:+.1} µs over no lock, \
                 {:+.1} µs between them; p99 differences {:+.0} µs vs {:+.0} µs",
                limit.median - layer.median,
                limit.p99 - plain.p99,
                layer.p99 - plain.p99
            )),
        );
    }

    if let (Some(layer), Some(rate)) = (seq_at(App::Layer), seq_at(App::RateLimit)) {
        let (layer, rate) = (latency[layer], latency[rate]);
        let (lock_added, rate_added) = (layer.median - plain.median, rate.median - plain.median);
        report.push(
            Row::new(
                SEQUENTIAL,
                App::RateLimit.name(),
                "added latency ÷ LockLayer's (p50 differences)",
                "",
            )
            .value(rate_added / lock_added)
            .note(format!(
                "target ≤ 1; {rate_added:+.1} µs vs {lock_added:+.1} µs over no lock; p99 \
                 differences {:+.0} µs vs {:+.0} µs",
                rate.p99 - plain.p99,
                layer.p99 - plain.p99
            )),
        );
    }

    // 64 connections per app, rounds A B C C B A, twice.
    let apps = App::CONCURRENT;
    let mut pools = Vec::new();
    for app in apps {
        let mut pool = Vec::with_capacity(CONNECTIONS);
        for _ in 0..CONNECTIONS {
            pool.push(connect(addr(app)).await?);
        }
        round(ctx, app, &mut pool, "warm", warmup, round_limit).await?;
        pools.push(pool);
    }
    let mut totals: Vec<Totals> = apps.iter().map(|_| Totals::default()).collect();
    let pass = || (0..apps.len()).chain((0..apps.len()).rev());
    let sequence = pass().chain(pass());
    for (i, k) in sequence.enumerate() {
        let phase = format!("r{i}");
        let r = round(
            ctx,
            apps[k],
            &mut pools[k],
            &phase,
            requests / 4,
            round_limit,
        )
        .await?;
        totals[k].add(r);
    }
    drop(pools);
    let rates: Vec<Summary> = totals
        .iter()
        .map(|t| Summary::rates(t.rates.clone()))
        .collect();
    let latencies: Vec<Summary> = totals.iter().map(|t| Summary::micros(&t.samples)).collect();
    let at = |wanted: App| apps.iter().position(|a| *a == wanted).unwrap_or(0);
    let (floor, own) = (at(App::Evalsha), at(App::OwnScripts));
    for (k, (app, t)) in apps.iter().zip(&totals).enumerate() {
        let done = t.samples.len() as f64;
        let mut row = Row::new(CONCURRENT, app.name(), "requests/s", "/s")
            .summary(rates[k])
            .note(format!(
                "{} requests, {:.0}/s overall ({} windows of {} ms)",
                t.samples.len(),
                done / t.elapsed.as_secs_f64(),
                t.rates.len(),
                WINDOW.as_millis()
            ))
            .note(format!(
                "CPU per request: this process {:.1} µs, redis {:.1} µs",
                t.cpu.as_secs_f64() * 1e6 / done,
                t.redis_cpu.as_secs_f64() * 1e6 / done
            ));
        row = row.note(format!(
            "Redis commands per request, incl. in scripts: {:.2} ({:.2} EVALSHA); Redis \
             socket reads per request {:.2}",
            t.commands as f64 / done,
            t.evalsha as f64 / done,
            t.reads as f64 / done
        ));
        if k > 0 {
            row = row.ratio_to(rates[0].median, "÷ no-lock median");
        }
        if app.locked() {
            row = row.note(format!(
                "÷ the 2 × EVALSHA app {:.2}, ÷ lockwarden's scripts raw {:.2}",
                rates[k].median / rates[floor].median,
                rates[k].median / rates[own].median
            ));
        }
        if t.stopped_early {
            row = row.note("stopped by the time limit");
        }
        report.push(row);
        report.push(
            Row::new(CONCURRENT, app.name(), "latency per request", "µs").summary(latencies[k]),
        );
        if k > 0 {
            report.push(
                Row::new(
                    CONCURRENT,
                    app.name(),
                    "added latency (p50 difference)",
                    "µs",
                )
                .value(latencies[k].median - latencies[0].median)
                .ratio_to(evalsha.median, "round trips: ÷ EVALSHA median")
                .note(format!(
                    "p99 difference {:.0} µs; mostly queueing (64 in flight)",
                    latencies[k].p99 - latencies[0].p99
                )),
            );
        }
    }

    let (layer, limit) = (at(App::Layer), at(App::Limit));
    let per_request = |t: &Totals| {
        let done = t.samples.len().max(1) as f64;
        (
            t.commands as f64 / done,
            t.redis_cpu.as_secs_f64() * 1e6 / done,
            t.samples.len() as f64 / t.elapsed.as_secs_f64(),
        )
    };
    let ((lock_cmds, lock_redis, lock_rate), (limit_cmds, limit_redis, limit_rate)) =
        (per_request(&totals[layer]), per_request(&totals[limit]));
    report.push(
        Row::new(
            CONCURRENT,
            App::Limit.name(),
            "requests/s ÷ LockLayer's",
            "",
        )
        .value(rates[limit].median / rates[layer].median)
        .note(format!(
            "target ≥ 0.9; overall {:.2} ({limit_rate:.0}/s vs {lock_rate:.0}/s); per request: \
             Redis commands {limit_cmds:.2} vs {lock_cmds:.2}, Redis CPU {limit_redis:.1} µs \
             vs {lock_redis:.1} µs",
            limit_rate / lock_rate
        )),
    );

    let (rate, raw_rate, raw_gcra, raw_middleware) = (
        at(App::RateLimit),
        at(App::RawRate),
        at(App::RawGcra),
        at(App::RawRateMiddleware),
    );
    let (rate_cmds, rate_redis, rate_rate) = per_request(&totals[rate]);
    report.push(
        Row::new(
            CONCURRENT,
            App::RateLimit.name(),
            "requests/s ÷ LockLayer's",
            "",
        )
        .value(rates[rate].median / rates[layer].median)
        .note(format!(
            "target ≥ 1.5; overall {:.2} ({rate_rate:.0}/s vs {lock_rate:.0}/s); per request: \
             Redis commands {rate_cmds:.2} vs {lock_cmds:.2}, Redis CPU {rate_redis:.1} µs \
             vs {lock_redis:.1} µs; the floors, sent raw from the handler: the script {:.2}, \
             the minimal GCRA {:.2}; the thinnest layer (a middleware sending the script \
             raw) {:.2}",
            rate_rate / lock_rate,
            rates[raw_rate].median / rates[layer].median,
            rates[raw_gcra].median / rates[layer].median,
            rates[raw_middleware].median / rates[layer].median
        )),
    );
    let set_nx = at(App::RawSetNx);
    report.push(
        Row::new(CONCURRENT, App::Layer.name(), "requests/s ÷ no lock's", "")
            .value(rates[layer].median / rates[0].median)
            .note(format!(
                "target ≥ 0.5; the floors, sent raw from the handler: lockwarden's scripts {:.2}, \
             SET NX PX and compare-and-delete (any lock's cheapest cycle) {:.2}, two \
             EVALSHA of `return 1` {:.2}",
                rates[at(App::OwnScripts)].median / rates[0].median,
                rates[set_nx].median / rates[0].median,
                rates[at(App::Evalsha)].median / rates[0].median
            )),
    );

    drop(servers);
    left_behind(ctx).await
}

/// Sequential requests over one connection per app, the apps taking turns in a new
/// shuffled order each turn (seeded: every run visits them alike), until `requests` each
/// or `limit`. A fixed order would favour an app that always follows one that ran the
/// same scripts and code (the permit in the handler after the limit layer).
async fn sequential(
    ctx: &Ctx,
    senders: &mut [Sender],
    requests: usize,
    limit: Duration,
) -> Result<Vec<Vec<Duration>>, BoxError> {
    let apps = App::SEQUENTIAL;
    let deadline = Instant::now() + limit;
    let mut samples = vec![Vec::with_capacity(requests); apps.len()];
    let mut turn: Vec<usize> = (0..apps.len()).collect();
    let mut rng = fastrand::Rng::with_seed(7);
    for i in 0..requests {
        if Instant::now() >= deadline {
            break;
        }
        rng.shuffle(&mut turn);
        for &j in &turn {
            let key = format!("w7-{}-seq-{i}", apps[j].slug());
            samples[j].push(order(&mut senders[j], apps[j], &key, &ctx.checks).await?);
        }
    }
    Ok(samples)
}

/// What the rounds of one app add up to.
#[derive(Default)]
struct Totals {
    samples: Vec<Duration>,
    rates: Vec<f64>,
    elapsed: Duration,
    cpu: Duration,
    redis_cpu: Duration,
    evalsha: u64,
    commands: u64,
    /// Socket reads Redis made (each may bring several commands).
    reads: u64,
    stopped_early: bool,
}

impl Totals {
    fn add(&mut self, other: Totals) {
        self.samples.extend(other.samples);
        self.rates.extend(other.rates);
        self.elapsed += other.elapsed;
        self.cpu += other.cpu;
        self.redis_cpu += other.redis_cpu;
        self.evalsha += other.evalsha;
        self.commands += other.commands;
        self.reads += other.reads;
        self.stopped_early |= other.stopped_early;
    }
}

/// `requests` requests to `app` over the connections of `pool`, one task per connection,
/// keys `w7-<app>-<phase>-<n>`, stopping at `limit`.
async fn round(
    ctx: &Ctx,
    app: App,
    pool: &mut Vec<Sender>,
    phase: &str,
    requests: u64,
    limit: Duration,
) -> Result<Totals, BoxError> {
    let (cpu, redis_cpu) = (cpu_time(), ctx.redis_cpu()?);
    let evalsha = ctx.script_calls()?;
    let reads = ctx.reads_processed()?;
    // Every admin query counts too (with whatever its fresh connection sends): measure it.
    let before = ctx.commands_processed()?;
    let commands = ctx.commands_processed()?;
    let per_query = commands.saturating_sub(before);
    let next = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let deadline = start + limit;
    let windows = Arc::new(Windows::with_width(start, limit, WINDOW));
    let per_task = requests as usize / pool.len() + 1;
    let mut set = JoinSet::new();
    for mut sender in pool.drain(..) {
        let (next, windows, checks) = (next.clone(), windows.clone(), ctx.checks.clone());
        let prefix = format!("w7-{}-{phase}-", app.slug());
        set.spawn(async move {
            let mut samples = Vec::with_capacity(per_task);
            while Instant::now() < deadline {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= requests {
                    break;
                }
                // The replay app answers retries of 64 keys, stored on first use.
                let key = match app {
                    App::Replay => format!("w7-replay-{}", i % CONNECTIONS as u64),
                    _ => format!("{prefix}{i}"),
                };
                samples.push(order(&mut sender, app, &key, &checks).await?);
                windows.record();
            }
            Ok::<_, BoxError>((sender, samples))
        });
    }
    let joined = join_all(set, limit + Duration::from_secs(30)).await?;
    let elapsed = start.elapsed();
    let mut totals = Totals {
        rates: windows.rates_until(elapsed),
        elapsed,
        cpu: cpu_time() - cpu,
        redis_cpu: ctx.redis_cpu()? - redis_cpu,
        evalsha: ctx.script_calls()? - evalsha,
        reads: ctx.reads_processed()?.saturating_sub(reads),
        // Less the three queries after the count (the last one counts only once it has run).
        commands: ctx
            .commands_processed()?
            .saturating_sub(commands + 3 * per_query),
        ..Totals::default()
    };
    for (sender, samples) in joined {
        pool.push(sender);
        totals.samples.extend(samples);
    }
    totals.stopped_early = (totals.samples.len() as u64) < requests;
    Ok(totals)
}

/// Every request has ended, so once the background releases are through no key of this
/// workload (a lock hash, `…{http:w7-…}`, `…{engine:w7-…}`; a semaphore's sorted set,
/// `…{http-limit:w7-…}`) may be left in Redis. Fencing keys (`…}:fence`)
/// stay until their lease ends and remembered responses (`…}:done`) until theirs, by
/// design.
async fn left_behind(ctx: &Ctx) -> Result<(), BoxError> {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let left: Vec<String> = ctx
            .admin::<Vec<String>>(&["KEYS", "*w7-*"])?
            .into_iter()
            .filter(|k| k.ends_with('}'))
            .collect();
        if left.is_empty() {
            return Ok(());
        }
        if Instant::now() >= deadline {
            ctx.checks.problem(format!(
                "{NAME}: {} key(s) still in Redis 5 s after the last request, e.g. `{}`",
                left.len(),
                left[0]
            ));
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
