//! The process-wide default client (no `.client(..)` on the layer): Redis from
//! `REDIS_URL`, 503 while that is unreachable, and a new connection attempt on a later
//! request. One test in this binary, as the default client is process-wide.

mod common;

use std::time::Duration;

use axum::http::StatusCode;
use axum::routing::post;
use axum::Router;
use common::web::{req, send};
use lockwarden::LockLayer;
use lockwarden_testkit::RedisServer;

/// One request with the key `default`; its status.
async fn status(app: &Router) -> StatusCode {
    send(app, req("/", Some("default"))).await.status
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn default_client_connects_lazily_and_retries_after_a_failure() {
    let mut gone = RedisServer::start().expect("redis-server");
    let unreachable = gone.url();
    gone.kill();
    std::env::set_var("REDIS_URL", &unreachable);

    let app = Router::new()
        .route("/", post(|| async { "ok" }))
        .layer(LockLayer::by_header("Idempotency-Key"));
    let started = std::time::Instant::now();
    assert_eq!(status(&app).await, StatusCode::SERVICE_UNAVAILABLE);
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "{:?}",
        started.elapsed()
    );

    let server = RedisServer::start().expect("redis-server");
    std::env::set_var("REDIS_URL", server.url());
    tokio::time::sleep(Duration::from_millis(600)).await; // past the reconnect pause
    assert_eq!(status(&app).await, StatusCode::OK);
    let client = lockwarden::default_client().await.expect("connected");
    assert_eq!(client.backend_name(), "redis");
    // The lock was taken in that server.
    let keys = server.keys_matching("lockwarden:*");
    assert!(keys.iter().any(|k| k.contains("http:default")), "{keys:?}");
}
