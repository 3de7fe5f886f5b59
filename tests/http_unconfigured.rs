//! A layer or extractor without a client of its own, while `REDIS_URL` is not set: no
//! in-process store is chosen for it. Every locked request is answered 503 (also when
//! failing open), nothing reaches the handler, and the error names `REDIS_URL`. One
//! binary of its own, as the environment is process-wide.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use axum::routing::post;
use axum::Router;
use common::web::{req, send};
use lockwarden::{BackendError, LockError, LockKey, LockLayer, Locked};

#[derive(Clone, Default)]
struct Hits(Arc<AtomicUsize>);

struct Order;

impl LockKey for Order {
    fn lock_key(&self) -> String {
        "order:1".to_owned()
    }
}

impl<S: Send + Sync> axum::extract::FromRequestParts<S> for Order {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(
        _: &mut axum::http::request::Parts,
        _: &S,
    ) -> Result<Self, Self::Rejection> {
        Ok(Order)
    }
}

#[tokio::test]
async fn without_redis_url_nothing_runs_in_process() {
    std::env::remove_var("REDIS_URL");
    match lockwarden::default_client().await {
        Err(LockError::Backend(BackendError::NotConfigured(what))) => {
            assert!(what.contains("REDIS_URL"), "{what}");
            assert!(what.contains("LockClient::in_memory()"), "{what}");
        }
        other => panic!("expected NotConfigured, got {other:?}"),
    }

    let hits = Hits::default();
    let counted = {
        let hits = hits.clone();
        move || async move {
            hits.0.fetch_add(1, Ordering::SeqCst);
            "ran"
        }
    };
    for layer in [
        LockLayer::by_header("Idempotency-Key"),
        LockLayer::by_header("Idempotency-Key").fail_open(),
    ] {
        let app = Router::new().route("/", post(counted.clone())).layer(layer);
        let answer = send(&app, req("/", Some("k1"))).await;
        answer.assert_problem(503, "store-unavailable");
        assert!(
            answer.text().contains("not configured"),
            "{}",
            answer.text()
        );
    }

    let app = Router::new().route(
        "/orders",
        post(|Locked(_order): Locked<Order>| async { "shipped" }),
    );
    send(&app, req("/orders", None))
        .await
        .assert_problem(503, "store-unavailable");
    assert_eq!(hits.0.load(Ordering::SeqCst), 0, "a handler ran unlocked");
}
