//! The store goes away under a `RateLimitLayer`: it fails closed (`503` with
//! `Retry-After`) within one command timeout, or open with `.fail_open()`. These need a
//! store that can fail, so they run against a real `redis-server` only.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{Request, StatusCode};
use axum::routing::post;
use axum::Router;
use common::web::{send, Answer};
use lockwarden::{LockClient, RateLimitLayer, RateLimiter, RatePolicy};
use lockwarden_testkit::RedisServer;

const COMMAND_TIMEOUT: Duration = Duration::from_millis(300);

async fn limiter(server: &RedisServer) -> RateLimiter {
    let client = LockClient::builder()
        .command_timeout(COMMAND_TIMEOUT)
        .connect(&server.url())
        .await
        .expect("connect");
    client
        .rate_limiter(
            "api",
            [RatePolicy::new("burst", 10, Duration::from_secs(1))],
        )
        .expect("a valid policy")
}

/// The app behind `layer`; `runs` counts the handler's runs.
fn app(layer: RateLimitLayer<lockwarden::http::FromHeader>, runs: &Arc<AtomicUsize>) -> Router {
    let runs = runs.clone();
    Router::new()
        .route(
            "/",
            post(move || async move {
                runs.fetch_add(1, Ordering::SeqCst);
                "handled"
            }),
        )
        .layer(layer)
}

async fn call(app: &Router) -> Answer {
    let request = Request::post("/")
        .header("x-api-key", "k")
        .body(Body::empty())
        .expect("request");
    send(app, request).await
}

/// Promise: with the store gone, a rate-limited request is answered `503` with
/// `Retry-After: 1` and a problem document within one command timeout (and some slack),
/// and never reaches the handler: the limit fails closed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_down_is_503_with_retry_after() {
    let mut server = RedisServer::start().expect("redis-server");
    let runs = Arc::new(AtomicUsize::new(0));
    let app = app(
        RateLimitLayer::limiter(limiter(&server).await).by_header("X-Api-Key"),
        &runs,
    );
    assert_eq!(call(&app).await.status, StatusCode::OK);
    server.kill();
    let started = Instant::now();
    let answer = call(&app).await;
    let took = started.elapsed();
    answer.assert_problem(503, "store-unavailable");
    assert_eq!(answer.retry_after(), 1);
    assert!(
        took <= COMMAND_TIMEOUT + Duration::from_millis(700),
        "took {took:?}"
    );
    assert_eq!(runs.load(Ordering::SeqCst), 1, "a request ran unlimited");
}

/// Promise: `.fail_open()` lets a request through uncharged while the store is down, and
/// the limit applies again once it is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fail_open_passes_while_the_store_is_down() {
    let mut server = RedisServer::start().expect("redis-server");
    let runs = Arc::new(AtomicUsize::new(0));
    let api = limiter(&server).await;
    let app = app(
        RateLimitLayer::limiter(api.clone())
            .by_header("X-Api-Key")
            .fail_open(),
        &runs,
    );
    server.kill();
    for _ in 0..12 {
        assert_eq!(call(&app).await.status, StatusCode::OK);
    }
    assert_eq!(runs.load(Ordering::SeqCst), 12);
    // Back: 10 per second (10 at once) hold again.
    server.restart().expect("restart");
    let deadline = Instant::now() + Duration::from_secs(10);
    while api.peek("k").await.is_err() {
        assert!(Instant::now() < deadline, "the store never came back");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut statuses = Vec::new();
    for _ in 0..20 {
        statuses.push(call(&app).await.status);
    }
    assert!(
        statuses.contains(&StatusCode::TOO_MANY_REQUESTS),
        "the limit did not apply once the store was back: {statuses:?}"
    );
}
