//! A handler (or a body) that panics gives its lock back before the panic leaves the
//! layer: the `500` of a panic guard outside the layer (as tower-http's
//! `CatchPanicLayer` answers) goes out after the release, so a retry sent at once finds
//! the key free. Measured under CPU load (two busy loops beside the server), where a
//! release left to the background arrives after the retry. On a real `redis-server`, or
//! `valkey-server` with `REDIS_SERVER` pointing at it.

mod common;

use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::extract::Request;
use axum::http::StatusCode;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use common::web::{req, send};
use futures_util::{FutureExt, StreamExt};
use http_body_util::BodyExt;
use lockwarden::{LimitLayer, LockClient, LockLayer};
use lockwarden_testkit::RedisServer;
use tower::ServiceExt;

const EXPECTED: &str = "panic expected by the test";

/// How many panics each test answers, each followed at once by a retry.
const ROUNDS: usize = 30;

async fn panics() -> &'static str {
    panic!("{EXPECTED}");
}

/// One chunk, then a panic while the body streams.
async fn panics_mid_body() -> Body {
    let chunks = futures_util::stream::iter(0..2).map(|i| {
        if i == 1 {
            panic!("{EXPECTED}");
        }
        Ok::<_, std::convert::Infallible>(Bytes::from_static(b"partial"))
    });
    Body::from_stream(chunks)
}

/// The application's panic guard, outside the lock layer: a panic becomes a `500`.
async fn catch_panic(request: Request, next: Next) -> Response {
    match AssertUnwindSafe(next.run(request)).catch_unwind().await {
        Ok(response) => response,
        Err(_) => StatusCode::INTERNAL_SERVER_ERROR.into_response(),
    }
}

/// Keeps the test's own panics quiet, and every other one loud.
fn quiet_expected_panics() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let message = info
            .payload()
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| info.payload().downcast_ref::<&str>().copied());
        if message != Some(EXPECTED) {
            default(info);
        }
    }));
}

/// Two threads that spin until dropped (or for a minute at most): the CPU load under
/// which a background release came after the retry.
struct BusyLoops {
    stop: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl BusyLoops {
    fn start() -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let threads = (0..2)
            .map(|_| {
                let stop = stop.clone();
                std::thread::spawn(move || {
                    let until = Instant::now() + Duration::from_secs(60);
                    let mut x = 0u64;
                    while !stop.load(Ordering::Relaxed) && Instant::now() < until {
                        x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
                    }
                })
            })
            .collect();
        Self { stop, threads }
    }
}

impl Drop for BusyLoops {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}

async fn redis_client(server: &RedisServer) -> LockClient {
    LockClient::connect(&server.url()).await.expect("connect")
}

/// Every panic's `500`, then at once a retry with the same key: the retry runs.
async fn retries_after_panics(app: Router, what: &str) {
    quiet_expected_panics();
    let _load = BusyLoops::start();
    for round in 0..ROUNDS {
        let key = format!("{what}-{round}");
        let answer = send(&app, req("/panic", Some(&key))).await;
        assert_eq!(answer.status, StatusCode::INTERNAL_SERVER_ERROR);
        let retry = send(&app, req("/ok", Some(&key))).await;
        assert_eq!(
            retry.status,
            StatusCode::OK,
            "round {round}: the retry after the 500 found the {what} still held: {}",
            retry.text()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panics_500_comes_after_the_lock_is_given_back() {
    let server = RedisServer::start().expect("redis-server");
    let app = Router::new()
        .route("/panic", post(panics))
        .route("/ok", post(|| async { "ok" }))
        .layer(LockLayer::by_header("Idempotency-Key").client(redis_client(&server).await))
        .layer(middleware::from_fn(catch_panic));
    retries_after_panics(app, "lock").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panics_500_comes_after_the_permit_is_given_back() {
    let server = RedisServer::start().expect("redis-server");
    let app = Router::new()
        .route("/panic", post(panics))
        .route("/ok", post(|| async { "ok" }))
        .layer(
            LimitLayer::permits(1)
                .by_header("Idempotency-Key")
                .client(redis_client(&server).await),
        )
        .layer(middleware::from_fn(catch_panic));
    retries_after_panics(app, "permit").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_that_panics_gives_the_lock_back_first() {
    quiet_expected_panics();
    let server = RedisServer::start().expect("redis-server");
    let app = Router::new()
        .route("/panic", post(panics_mid_body))
        .route("/ok", post(|| async { "ok" }))
        .layer(LockLayer::by_header("Idempotency-Key").client(redis_client(&server).await));
    let _load = BusyLoops::start();
    for round in 0..ROUNDS {
        let key = format!("body-{round}");
        let response = app
            .clone()
            .oneshot(req("/panic", Some(&key)))
            .await
            .expect("infallible");
        assert_eq!(response.status(), StatusCode::OK);
        let read = tokio::time::timeout(
            Duration::from_secs(10),
            AssertUnwindSafe(response.into_body().collect()).catch_unwind(),
        )
        .await
        .expect("the body ends within 10 s");
        assert!(read.is_err(), "round {round}: the body panicked");
        let retry = send(&app, req("/ok", Some(&key))).await;
        assert_eq!(
            retry.status,
            StatusCode::OK,
            "round {round}: the retry after the panic found the lock still held: {}",
            retry.text()
        );
    }
}
