//! The lock store goes away: the layer fails closed (503) within its budget, or open.
//! These need a store that can fail, so they run against a real `redis-server` only.

use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{Request, StatusCode};
use axum::routing::post;
use axum::Router;
use http_body_util::BodyExt;
use lockwarden::{LockClient, LockLayer};
use lockwarden_testkit::RedisServer;
use tower::ServiceExt;

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

async fn send(app: &Router) -> (StatusCode, serde_json::Value, String) {
    let request = Request::post("/")
        .header("idempotency-key", "k")
        .body(Body::empty())
        .expect("request");
    let response = app.clone().oneshot(request).await.expect("infallible");
    let status = response.status();
    let bytes = response
        .into_body()
        .collect()
        .await
        .expect("body")
        .to_bytes();
    let json = serde_json::from_slice(&bytes).unwrap_or(serde_json::Value::Null);
    (status, json, String::from_utf8_lossy(&bytes).into_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_redis_is_503_within_the_budget() {
    let mut server = RedisServer::start().expect("redis-server");
    let app = app(LockLayer::by_header("Idempotency-Key")
        .client(client(&server).await)
        .wait(WAIT));
    assert_eq!(send(&app).await.0, StatusCode::OK);
    server.kill();
    let started = Instant::now();
    let (status, json, _) = send(&app).await;
    let took = started.elapsed();
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(json["type"], "urn:lockwarden:problem:lock-unavailable");
    assert_eq!(json["status"], 503);
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
    assert_eq!(send(&app).await.0, StatusCode::OK);
    server.pause();
    let started = Instant::now();
    let (status, _, _) = send(&app).await;
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
    let (status, _, body) = send(&app).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body, "handled");
}
