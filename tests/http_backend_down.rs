//! The lock store goes away: the layer fails closed (503) within its budget, or open.
//! These need a store that can fail, so they run against a real `redis-server` only.

use std::time::{Duration, Instant};

mod common;

use axum::http::StatusCode;
use axum::routing::post;
use axum::Router;
use common::web::{req, send, Answer};
use lockwarden::{LockClient, LockLayer};
use lockwarden_testkit::RedisServer;

const WAIT: Duration = Duration::from_millis(200);
const COMMAND_TIMEOUT: Duration = Duration::from_millis(300);

async fn client(server: &RedisServer) -> LockClient {
    LockClient::builder()
        .command_timeout(COMMAND_TIMEOUT)
        .connect(&server.url())
        .await
        .expect("connect")
}

fn app(layer: LockLayer<lockwarden::http::FromHeader>) -> Router {
    Router::new()
        .route("/", post(|| async { "handled" }))
        .layer(layer)
}

/// One request with the key `k`.
async fn call(app: &Router) -> Answer {
    send(app, req("/", Some("k"))).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_redis_is_503_within_the_budget() {
    let mut server = RedisServer::start().expect("redis-server");
    let app = app(LockLayer::by_header("Idempotency-Key")
        .client(client(&server).await)
        .wait(WAIT));
    assert_eq!(call(&app).await.status, StatusCode::OK);
    server.kill();
    let started = Instant::now();
    let answer = call(&app).await;
    let took = started.elapsed();
    assert_eq!(answer.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(
        answer.problem_type(),
        "urn:lockwarden:problem:lock-unavailable"
    );
    assert!(
        took <= WAIT + COMMAND_TIMEOUT + Duration::from_millis(300),
        "took {took:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paused_redis_is_503_within_the_budget() {
    let server = RedisServer::start().expect("redis-server");
    let app = app(LockLayer::by_header("Idempotency-Key")
        .client(client(&server).await)
        .wait(WAIT));
    assert_eq!(call(&app).await.status, StatusCode::OK);
    server.pause();
    let started = Instant::now();
    let status = call(&app).await.status;
    let took = started.elapsed();
    server.resume();
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(
        took <= WAIT + COMMAND_TIMEOUT + Duration::from_millis(300),
        "took {took:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fail_open_passes_through_unlocked() {
    let mut server = RedisServer::start().expect("redis-server");
    let app = app(LockLayer::by_header("Idempotency-Key")
        .client(client(&server).await)
        .wait(WAIT)
        .fail_open());
    server.kill();
    let answer = call(&app).await;
    assert_eq!(answer.status, StatusCode::OK);
    assert_eq!(answer.body, "handled");
}
