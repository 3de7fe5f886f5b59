//! An honest `Retry-After`: a refused request is told when a retry can succeed, from the
//! holds the layer (or extractor) has seen end, not the holder's remaining watchdog lease
//! (20 to 30 s for a hold of any length). On a real `redis-server`; a client that obeys
//! the header is measured against the moment the lock actually frees.

mod common;

use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::Path;
use axum::http::{HeaderMap, Request, StatusCode};
use axum::routing::post;
use axum::Router;
use common::web::{send, Answer};
use lockwarden::{LimitLayer, LockClient, LockKey, LockLayer, Locked};
use lockwarden_testkit::RedisServer;
use serde::Deserialize;
use tower::ServiceExt;

/// Holds its request's lock for the milliseconds in `x-hold-ms`.
async fn hold(headers: HeaderMap) -> &'static str {
    let ms = headers
        .get("x-hold-ms")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    tokio::time::sleep(Duration::from_millis(ms)).await;
    "done"
}

/// A request with `Idempotency-Key: <key>` (and `X-Tenant`) whose handler holds for `ms`.
fn holding(key: &str, ms: u64) -> Request<Body> {
    Request::post("/hold")
        .header("idempotency-key", key)
        .header("x-tenant", key)
        .header("x-hold-ms", ms.to_string())
        .body(Body::empty())
        .expect("request")
}

async fn redis_client(server: &RedisServer) -> LockClient {
    LockClient::connect(&server.url()).await.expect("connect")
}

fn app(layer: LockLayer<lockwarden::http::FromHeader>) -> Router {
    Router::new().route("/hold", post(hold)).layer(layer)
}

/// Runs `seen` holds of `ms` one after the other, so the layer has seen them end.
async fn settle(app: &Router, key: &str, seen: usize, ms: u64) {
    for _ in 0..seen {
        assert_eq!(send(app, holding(key, ms)).await.status, StatusCode::OK);
    }
}

/// Sends `request` while another request with the same key holds for `ms`, `after` into
/// that hold; returns the refused answer and when the holding request was answered.
async fn refused_during(app: &Router, key: &str, ms: u64, after: Duration) -> Answer {
    let (first, second) = tokio::join!(send(app, holding(key, ms)), async {
        tokio::time::sleep(after).await;
        send(app, holding(key, 0)).await
    });
    assert_eq!(first.status, StatusCode::OK);
    second
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_half_second_handler_gets_retry_after_1() {
    let server = RedisServer::start().expect("redis-server");
    let app = app(LockLayer::by_header("Idempotency-Key").client(redis_client(&server).await));
    // Nothing seen yet: one second, not the 30 s watchdog lease.
    let refused = refused_during(&app, "half", 500, Duration::from_millis(100)).await;
    refused.assert_problem(409, "lock-busy");
    assert_eq!(refused.retry_after(), 1);
    settle(&app, "half", 3, 500).await;
    let refused = refused_during(&app, "half", 500, Duration::from_millis(100)).await;
    refused.assert_problem(409, "lock-busy");
    assert_eq!(refused.retry_after(), 1, "{}", refused.text());
    assert!(
        refused.text().contains("retry in 1 s"),
        "{}",
        refused.text()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_estimate_counts_down_as_the_hold_runs() {
    let server = RedisServer::start().expect("redis-server");
    let app = app(LockLayer::by_header("Idempotency-Key").client(redis_client(&server).await));
    settle(&app, "three", 3, 3000).await;
    let (first, early, late) = tokio::join!(
        send(&app, holding("three", 3000)),
        async {
            tokio::time::sleep(Duration::from_millis(200)).await;
            send(&app, holding("three", 0)).await
        },
        async {
            tokio::time::sleep(Duration::from_millis(2200)).await;
            send(&app, holding("three", 0)).await
        }
    );
    assert_eq!(first.status, StatusCode::OK);
    // Holds of 3 s seen: 2.8 s left (3 rounded up), then 0.8 s (1).
    assert_eq!(early.status, StatusCode::CONFLICT);
    assert_eq!(early.retry_after(), 3, "{}", early.text());
    assert_eq!(late.status, StatusCode::CONFLICT);
    assert_eq!(late.retry_after(), 1, "{}", late.text());
}

/// A client that waits exactly what `Retry-After` says between tries, from `start`;
/// returns when it got in.
async fn obeying_client(app: &Router, key: &str, start: Duration) -> Instant {
    tokio::time::sleep(start).await;
    let deadline = Instant::now() + Duration::from_secs(45);
    loop {
        let answer = send(app, holding(key, 0)).await;
        if answer.status == StatusCode::OK {
            return Instant::now();
        }
        answer.assert_problem(409, "lock-busy");
        assert!(Instant::now() < deadline, "never got in");
        tokio::time::sleep(Duration::from_secs(answer.retry_after())).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_obeying_retry_after_gets_a_20_s_hold_within_a_second_of_its_end() {
    let server = RedisServer::start().expect("redis-server");
    let app = app(LockLayer::by_header("Idempotency-Key").client(redis_client(&server).await));
    // The layer has seen half-second holds; this one runs 20 s.
    settle(&app, "long", 3, 500).await;
    let (freed, got_in) = tokio::join!(
        async {
            // Past `send`'s 10 s bound: its own, 30 s.
            let answer = tokio::time::timeout(
                Duration::from_secs(30),
                app.clone().oneshot(holding("long", 20_000)),
            )
            .await
            .expect("the 20 s hold ends within 30 s")
            .expect("infallible");
            assert_eq!(answer.status(), StatusCode::OK);
            // A small body is released before the response is handed on.
            Instant::now()
        },
        obeying_client(&app, "long", Duration::from_millis(300))
    );
    let late = got_in.saturating_duration_since(freed);
    // Told to retry every second once the hold outran every hold seen: in at most a
    // second after the lock freed, plus the retry's own round trip.
    assert!(
        late <= Duration::from_millis(1250),
        "got in {late:?} after the hold ended"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_limit_of_half_second_work_says_1() {
    let server = RedisServer::start().expect("redis-server");
    let app = Router::new().route("/hold", post(hold)).layer(
        LimitLayer::permits(1)
            .by_header("X-Tenant")
            .client(redis_client(&server).await),
    );
    settle(&app, "tenant", 3, 500).await;
    let refused = refused_during(&app, "tenant", 500, Duration::from_millis(100)).await;
    refused.assert_problem(429, "limit-reached");
    assert_eq!(refused.retry_after(), 1, "{}", refused.text());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_replicas_hold_counts_as_just_begun() {
    let server = RedisServer::start().expect("redis-server");
    let layer = || LockLayer::by_header("Idempotency-Key");
    let a = app(layer().client(redis_client(&server).await));
    let b = app(layer().client(redis_client(&server).await));
    // Replica b has seen 2 s holds end; replica a holds one now.
    settle(&b, "shared", 3, 2000).await;
    let (first, refused) = tokio::join!(send(&a, holding("shared", 2000)), async {
        tokio::time::sleep(Duration::from_millis(300)).await;
        send(&b, holding("shared", 0)).await
    });
    assert_eq!(first.status, StatusCode::OK);
    refused.assert_problem(409, "lock-busy");
    // b never saw this hold begin: the median of its holds, a little over 2 s, rounded up.
    let said = refused.retry_after();
    assert!((2..=3).contains(&said), "Retry-After {said}");
}

#[derive(Deserialize)]
struct Job(u32);

impl LockKey for Job {
    fn lock_key(&self) -> String {
        format!("job:{}", self.0)
    }
}

async fn run_job(Locked(job): Locked<Path<Job>>) -> String {
    tokio::time::sleep(Duration::from_millis(500)).await;
    format!("ran {}", job.0 .0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_locked_extractor_estimates_too() {
    let server = RedisServer::start().expect("redis-server");
    let client = redis_client(&server).await;
    let app = Router::new()
        .route("/jobs/{id}", post(run_job))
        .with_state(client.clone());
    let job = || {
        Request::post("/jobs/7")
            .body(Body::empty())
            .expect("request")
    };
    for _ in 0..3 {
        assert_eq!(send(&app, job()).await.status, StatusCode::OK);
        // The extracted value is dropped with the handler: its lock is released in the
        // background, after the answer.
        let deadline = Instant::now() + Duration::from_secs(1);
        while client.lock("job:7").is_locked().await.expect("is_locked") {
            assert!(Instant::now() < deadline, "job:7 still locked");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    let (first, refused) = tokio::join!(send(&app, job()), async {
        tokio::time::sleep(Duration::from_millis(100)).await;
        send(&app, job()).await
    });
    assert_eq!(first.text(), "ran 7");
    refused.assert_problem(409, "lock-busy");
    assert_eq!(refused.retry_after(), 1, "{}", refused.text());
}
