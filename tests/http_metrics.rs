//! The lock layer's request counter, recorded by a real recorder (`metrics-util`'s
//! debugging recorder, installed for this test binary): every way the layer answers is
//! counted once, by route (axum's matched path, never the raw path or key), outcome and
//! status. One test function: the recorder is global.

mod common;

use std::collections::HashMap;
use std::time::Duration;

use axum::routing::post;
use axum::Router;
use common::web::{req, send};
use lockwarden::{LimitLayer, LockClient, LockLayer};
use lockwarden_testkit::RedisServer;
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};

/// The requests counter, by its labels (`outcome=..,route=..,status=..`), summed over
/// snapshots (the debugging recorder resets counters at each).
fn requests(snapshotter: &Snapshotter, totals: &mut HashMap<String, u64>) {
    for (key, _, _, value) in snapshotter.snapshot().into_vec() {
        let key = key.key();
        if key.name() != "lockwarden_http_requests_total" {
            continue;
        }
        let mut labels: Vec<String> = key
            .labels()
            .map(|l| format!("{}={}", l.key(), l.value()))
            .collect();
        labels.sort();
        if let DebugValue::Counter(n) = value {
            *totals.entry(labels.join(",")).or_default() += n;
        }
    }
}

async fn slow() -> &'static str {
    tokio::time::sleep(Duration::from_millis(300)).await;
    "done"
}

#[test]
fn the_layer_counts_every_answer_by_route_outcome_and_status() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    recorder
        .install()
        .expect("the only recorder of this test binary");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let mut totals = HashMap::new();
    runtime.block_on(async {
        let client = LockClient::in_memory();
        let locked = LockLayer::by_header("Idempotency-Key").client(client.clone());
        let remembered = locked.clone().remember(Duration::from_secs(60));
        let limited = LimitLayer::permits(1)
            .by_header("Idempotency-Key")
            .client(client.clone());
        let misconfigured = LimitLayer::permits(0)
            .by_header("Idempotency-Key")
            .client(client.clone());
        let app = Router::new()
            .route("/orders/{id}", post(slow).layer(locked))
            .route("/pay", post(slow).layer(remembered))
            .route("/exports", post(slow).layer(limited))
            .route("/broken", post(slow).layer(misconfigured));

        // Admitted, and another while the limit is full answered 429.
        let first = tokio::spawn({
            let app = app.clone();
            async move { send(&app, req("/exports", Some("t1"))).await }
        });
        tokio::time::sleep(Duration::from_millis(100)).await;
        send(&app, req("/exports", Some("t1")))
            .await
            .assert_problem(429, "limit-reached");
        assert_eq!(first.await.unwrap().status, 200);
        // A limit without a capacity: 500.
        send(&app, req("/broken", Some("t1")))
            .await
            .assert_problem(500, "invalid-limit");

        // Locked, and a duplicate in flight answered 409.
        let first = tokio::spawn({
            let app = app.clone();
            async move { send(&app, req("/orders/7", Some("k1"))).await }
        });
        tokio::time::sleep(Duration::from_millis(100)).await;
        send(&app, req("/orders/7", Some("k1")))
            .await
            .assert_problem(409, "lock-busy");
        assert_eq!(first.await.unwrap().status, 200);
        // No key: 400.
        send(&app, req("/orders/8", None))
            .await
            .assert_problem(400, "missing-key");
        // Remembered: run once, then replayed.
        assert_eq!(send(&app, req("/pay", Some("p1"))).await.status, 200);
        assert!(send(&app, req("/pay", Some("p1"))).await.replayed());

        // The store is down: 503.
        let mut server = RedisServer::start().unwrap();
        let down = LockClient::builder()
            .command_timeout(Duration::from_millis(300))
            .connect(&server.url())
            .await
            .unwrap();
        server.kill();
        let app = Router::new().route(
            "/down",
            post(slow).layer(LockLayer::by_header("Idempotency-Key").client(down)),
        );
        send(&app, req("/down", Some("d1")))
            .await
            .assert_problem(503, "store-unavailable");
    });
    requests(&snapshotter, &mut totals);
    let count = |labels: &str| totals.get(labels).copied().unwrap_or(0);
    assert_eq!(
        count("outcome=locked,route=/orders/{id},status=handler"),
        1,
        "{totals:?}"
    );
    assert_eq!(
        count("outcome=busy,route=/orders/{id},status=409"),
        1,
        "{totals:?}"
    );
    assert_eq!(
        count("outcome=missing_key,route=/orders/{id},status=400"),
        1,
        "{totals:?}"
    );
    assert_eq!(
        count("outcome=locked,route=/pay,status=handler"),
        1,
        "{totals:?}"
    );
    assert_eq!(
        count("outcome=replayed,route=/pay,status=handler"),
        1,
        "{totals:?}"
    );
    assert_eq!(
        count("outcome=unavailable,route=/down,status=503"),
        1,
        "{totals:?}"
    );
    assert_eq!(
        count("outcome=admitted,route=/exports,status=handler"),
        1,
        "{totals:?}"
    );
    assert_eq!(
        count("outcome=limit_reached,route=/exports,status=429"),
        1,
        "{totals:?}"
    );
    assert_eq!(
        count("outcome=invalid_limit,route=/broken,status=500"),
        1,
        "{totals:?}"
    );
    assert_eq!(
        totals.values().sum::<u64>(),
        9,
        "nothing else counted: {totals:?}"
    );
    assert!(
        totals
            .keys()
            .all(|labels| !labels.contains("k1") && !labels.contains("/orders/7")),
        "never the raw path or key: {totals:?}"
    );
}
