#![cfg(feature = "axum")]
//! The `Locked<T>` extractor, against both stores (see `common::Env`).

mod common;

use std::time::{Duration, Instant};

use axum::extract::{FromRequestParts, Path};
use axum::http::request::Parts;
use axum::http::StatusCode;
use axum::routing::post;
use axum::{Extension, Router};
use common::web::{req, send, Answer};
use common::Env;
use lockwarden::{LockClient, LockKey, LockLayer, Locked, StateLocked};
use lockwarden_testkit::RedisServer;

conformance!(
    extractor_holds_the_lock_for_the_handler_and_answers_409,
    extractor_passes_the_key_rejection_through,
    extractor_reenters_inside_a_lock_layer_request,
    extractor_waits_and_answers_423_as_configured,
    extractor_takes_the_client_from_the_state,
    state_locked_takes_the_client_with_from_ref,
    locked_path_locks_on_its_parameters,
);

/// Path parameters that name a lock: `Locked<Path<Shipment>>` takes it.
#[derive(serde::Deserialize)]
struct Shipment {
    order: u64,
    parcel: u32,
}

impl LockKey for Shipment {
    fn lock_key(&self) -> String {
        format!("shipment:{}/{}", self.order, self.parcel)
    }
}

async fn send_parcel(Locked(shipment): Locked<Path<Shipment>>) -> String {
    tokio::time::sleep(Duration::from_millis(300)).await;
    let Path(Shipment { order, parcel }) = &*shipment;
    format!("sent {order}/{parcel}")
}

async fn locked_path_locks_on_its_parameters(env: Env) {
    let client = env.client().await;
    let app = Router::new()
        .route("/orders/{order}/parcels/{parcel}", post(send_parcel))
        .with_state(client.clone());
    let (first, duplicate, other) = tokio::join!(
        call(&app, "/orders/7/parcels/1"),
        async {
            tokio::time::sleep(Duration::from_millis(100)).await;
            assert!(client
                .lock("shipment:7/1")
                .is_locked()
                .await
                .expect("is_locked"));
            call(&app, "/orders/7/parcels/1").await
        },
        async {
            tokio::time::sleep(Duration::from_millis(100)).await;
            call(&app, "/orders/7/parcels/2").await
        }
    );
    assert_eq!(first.text(), "sent 7/1");
    assert_busy(&duplicate, 409);
    assert_eq!(other.text(), "sent 7/2");
    wait_free(&client, "shipment:7/1").await;
    // Parameters that do not deserialize: the `Path` rejection, nothing locked.
    let bad = call(&app, "/orders/x/parcels/1").await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST);
}

struct OrderId(u64);

impl LockKey for OrderId {
    fn lock_key(&self) -> String {
        format!("order:{}", self.0)
    }
}

impl<S: Send + Sync> FromRequestParts<S> for OrderId {
    type Rejection = axum::extract::rejection::PathRejection;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        let Path(id) = Path::<u64>::from_request_parts(parts, state).await?;
        Ok(OrderId(id))
    }
}

/// Same key as `OrderId`, but queues for up to 2 s and answers 423.
struct PatientOrder(u64);

impl LockKey for PatientOrder {
    const WAIT: Duration = Duration::from_secs(2);
    const CONFLICT_STATUS: StatusCode = StatusCode::LOCKED;
    fn lock_key(&self) -> String {
        format!("order:{}", self.0)
    }
}

impl<S: Send + Sync> FromRequestParts<S> for PatientOrder {
    type Rejection = axum::extract::rejection::PathRejection;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        let Path(id) = Path::<u64>::from_request_parts(parts, state).await?;
        Ok(PatientOrder(id))
    }
}

async fn ship(Locked(order): Locked<OrderId>) -> String {
    tokio::time::sleep(Duration::from_millis(300)).await;
    format!("shipped {} with token {}", order.0, order.fencing_token())
}

async fn ship_patiently(Locked(order): Locked<PatientOrder>) -> String {
    tokio::time::sleep(Duration::from_millis(300)).await;
    format!("shipped {}", order.0)
}

fn app(client: &LockClient) -> Router {
    Router::new()
        .route("/orders/{id}/ship", post(ship))
        .route("/orders/{id}/patient", post(ship_patiently))
        .layer(Extension(client.clone()))
}

/// Posts to `path` (no body, no key header).
async fn call(app: &Router, path: &str) -> Answer {
    send(app, req(path, None)).await
}

async fn wait_free(client: &LockClient, name: &str) {
    let deadline = Instant::now() + Duration::from_millis(500);
    while client.lock(name).is_locked().await.expect("is_locked") {
        assert!(
            Instant::now() < deadline,
            "{name} still locked after the request"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Asserts a `lock-busy` problem with this status and a `Retry-After` of at least 1 s.
fn assert_busy(answer: &Answer, status: u16) {
    answer.assert_problem(status, "lock-busy");
    assert!(answer.retry_after() >= 1);
}

async fn extractor_holds_the_lock_for_the_handler_and_answers_409(env: Env) {
    let client = env.client().await;
    let app = app(&client);
    let (first, second) = tokio::join!(call(&app, "/orders/7/ship"), async {
        tokio::time::sleep(Duration::from_millis(100)).await;
        // Mid-handler: the destructured `order` still holds the lock.
        assert!(client.lock("order:7").is_locked().await.expect("is_locked"));
        call(&app, "/orders/7/ship").await
    });
    assert_eq!(first.status, StatusCode::OK);
    assert!(first.text().starts_with("shipped 7 with token "));
    assert_busy(&second, 409);
    // Released when the handler returned.
    wait_free(&client, "order:7").await;
    // Another order is another lock.
    assert_eq!(call(&app, "/orders/8/ship").await.status, StatusCode::OK);
}

async fn extractor_passes_the_key_rejection_through(env: Env) {
    let client = env.client().await;
    let answer = call(&app(&client), "/orders/not-a-number/ship").await;
    assert_eq!(answer.status, StatusCode::BAD_REQUEST);
    assert_ne!(
        answer.headers.get("content-type").map(|v| v.as_bytes()),
        Some(&b"application/problem+json"[..]),
        "axum's own Path rejection, not ours"
    );
    assert!(answer.text().contains("Cannot parse"), "{}", answer.text());
}

async fn extractor_reenters_inside_a_lock_layer_request(env: Env) {
    let client = env.client().await;
    // The layer locks `order:<id>` by path parameter; the extractor locks the same key
    // with a zero wait: it must re-enter as the request's holder.
    let app = Router::new()
        .route("/orders/{id}/ship", post(ship))
        .route_layer(
            LockLayer::by_path_param("id")
                .client(client.clone())
                .name_prefix("order:"),
        );
    let answer = call(&app, "/orders/9/ship").await;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.text());
    // Both holds (layer and extractor) are given back; on Redis in the background.
    wait_free(&client, "order:9").await;
    let (again, busy) = tokio::join!(call(&app, "/orders/9/ship"), async {
        tokio::time::sleep(Duration::from_millis(100)).await;
        call(&app, "/orders/9/ship").await
    });
    assert_eq!(again.status, StatusCode::OK);
    // The second request is stopped by the layer already.
    assert_busy(&busy, 409);
}

async fn extractor_waits_and_answers_423_as_configured(env: Env) {
    let client = env.client().await;
    let app = app(&client);
    // Queues behind a 300 ms handler within its 2 s budget.
    let (first, second) = tokio::join!(call(&app, "/orders/5/patient"), async {
        tokio::time::sleep(Duration::from_millis(50)).await;
        call(&app, "/orders/5/patient").await
    });
    assert_eq!(
        (first.status, second.status),
        (StatusCode::OK, StatusCode::OK)
    );
    // Held elsewhere for longer than the budget: 423.
    let held = client
        .lock("order:5")
        .lease(Duration::from_secs(10))
        .acquire()
        .await
        .expect("acquire");
    let started = Instant::now();
    let answer = call(&app, "/orders/5/patient").await;
    assert!(started.elapsed() >= Duration::from_secs(2));
    assert_busy(&answer, 423);
    held.release().await.expect("release");
}

async fn extractor_takes_the_client_from_the_state(env: Env) {
    let client = env.client().await;
    let app = Router::new()
        .route("/orders/{id}/ship", post(ship))
        .with_state(client.clone());
    let held = client
        .try_acquire("order:11", Duration::from_secs(5))
        .await
        .expect("acquire");
    assert_busy(&call(&app, "/orders/11/ship").await, 409);
    held.release().await.expect("release");
    assert_eq!(call(&app, "/orders/11/ship").await.status, StatusCode::OK);
}

#[derive(Clone)]
struct AppState {
    locks: LockClient,
}

impl axum::extract::FromRef<AppState> for LockClient {
    fn from_ref(state: &AppState) -> Self {
        state.locks.clone()
    }
}

async fn ship_from_state(StateLocked(order): StateLocked<OrderId>) -> String {
    format!("shipped {}", order.lock_key())
}

/// Promise: `StateLocked<T>` takes the client from a larger state with `FromRef`, not
/// from the extensions or the process default (the default here would be another store).
async fn state_locked_takes_the_client_with_from_ref(env: Env) {
    let client = env.client().await;
    let app = Router::new()
        .route("/orders/{id}/ship", post(ship_from_state))
        .with_state(AppState {
            locks: client.clone(),
        });
    let held = client
        .try_acquire("order:12", Duration::from_secs(5))
        .await
        .expect("acquire");
    assert_busy(&call(&app, "/orders/12/ship").await, 409);
    held.release().await.expect("release");
    let answer = call(&app, "/orders/12/ship").await;
    assert_eq!(answer.status, StatusCode::OK);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extractor_answers_503_when_redis_is_down() {
    let mut server = RedisServer::start().expect("redis-server");
    let client = LockClient::builder()
        .command_timeout(Duration::from_millis(300))
        .connect(&server.url())
        .await
        .expect("connect");
    let app = app(&client);
    server.kill();
    let started = Instant::now();
    let answer = call(&app, "/orders/1/ship").await;
    assert_eq!(answer.status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(answer
        .text()
        .contains("urn:lockwarden:problem:store-unavailable"));
    assert!(started.elapsed() < Duration::from_secs(1));
}
