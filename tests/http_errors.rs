//! What a client and an operator are told when something is wrong: every lock error has
//! its own answer (a shut-down client is never run unlocked, even failing open), a
//! request without a scope is told so, and the logs say what happened at the level it
//! deserves. On a real `redis-server`.

mod common;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{Request, StatusCode};
use axum::routing::post;
use axum::Router;
use common::web::{req, send};
use lockwarden::{LimitKey, LimitLayer, Limited, LockClient, LockKey, LockLayer, Locked};
use lockwarden_testkit::RedisServer;
use serde::Deserialize;
use tokio::sync::Notify;
use tracing::field::{Field, Visit};
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::Layer;

/// How many times the handler ran.
#[derive(Clone, Default)]
struct Hits(Arc<AtomicUsize>);

impl Hits {
    fn count(&self) -> usize {
        self.0.load(Ordering::SeqCst)
    }
}

async fn handled(State(hits): State<Hits>) -> &'static str {
    hits.0.fetch_add(1, Ordering::SeqCst);
    "handled"
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shut_down_client_is_503_and_never_runs_a_request_unlocked() {
    let server = RedisServer::start().expect("redis-server");
    let locks = LockClient::connect(&server.url()).await.expect("connect");
    let hits = Hits::default();
    let app = Router::new()
        .route("/locked", post(handled))
        .route_layer(
            LockLayer::by_header("Idempotency-Key")
                .client(locks.clone())
                .fail_open(),
        )
        .merge(
            Router::new().route("/limited", post(handled)).route_layer(
                LimitLayer::permits(2)
                    .by_header("Idempotency-Key")
                    .client(locks.clone())
                    .fail_open(),
            ),
        )
        .with_state(hits.clone());
    assert_eq!(
        send(&app, req("/locked", Some("k"))).await.status,
        StatusCode::OK
    );
    locks
        .shutdown(Duration::from_secs(5))
        .await
        .expect("shut down");
    for path in ["/locked", "/limited"] {
        let answer = send(&app, req(path, Some("k"))).await;
        answer.assert_problem(503, "shutting-down");
        // Another instance may take it: retry soon.
        assert_eq!(answer.retry_after(), 1);
    }
    assert_eq!(hits.count(), 1, "no request ran after the shutdown");
}

#[derive(Deserialize)]
struct Order(u32);

impl LockKey for Order {
    fn lock_key(&self) -> String {
        format!("order:{}", self.0)
    }
}

impl LimitKey for Order {
    fn limit_key(&self) -> String {
        format!("orders:{}", self.0)
    }
    fn permits(&self) -> u32 {
        2
    }
}

async fn ship(Locked(order): Locked<Path<Order>>) -> String {
    format!("shipped {}", order.0 .0)
}

async fn export(Limited(order): Limited<Path<Order>>) -> String {
    format!("exported {}", order.0 .0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_extractors_answer_a_shut_down_client_503() {
    let server = RedisServer::start().expect("redis-server");
    let locks = LockClient::connect(&server.url()).await.expect("connect");
    let app = Router::new()
        .route("/orders/{id}/ship", post(ship))
        .route("/orders/{id}/export", post(export))
        .with_state(locks.clone());
    let post = |path: &str| Request::post(path).body(Body::empty()).expect("request");
    assert_eq!(send(&app, post("/orders/1/ship")).await.text(), "shipped 1");
    assert_eq!(
        send(&app, post("/orders/1/export")).await.text(),
        "exported 1"
    );
    locks
        .shutdown(Duration::from_secs(5))
        .await
        .expect("shut down");
    for path in ["/orders/1/ship", "/orders/1/export"] {
        send(&app, post(path))
            .await
            .assert_problem(503, "shutting-down");
    }
}

#[derive(Clone)]
struct User(String);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_scope_is_named_not_the_header() {
    let app = Router::new()
        .route("/pay", post(|| async { "paid" }))
        .layer(
            LockLayer::by_header("Idempotency-Key")
                .client(LockClient::in_memory())
                .scope(|parts| parts.extensions.get::<User>().map(|u| u.0.clone())),
        );
    // The header is there; the scope (no authenticated user) is not.
    let answer = send(&app, req("/pay", Some("k1"))).await;
    answer.assert_problem(400, "missing-key");
    let detail = answer.json()["detail"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(detail.contains("scope"), "{detail}");
    assert!(!detail.contains("idempotency-key"), "{detail}");
    // Without the header, the header is what is missing.
    let answer = send(&app, req("/pay", None)).await;
    let detail = answer.json()["detail"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(detail.contains("idempotency-key"), "{detail}");
}

/// One event as logged: its level and fields (`message` among them).
#[derive(Debug, Clone)]
struct Event {
    level: tracing::Level,
    fields: BTreeMap<String, String>,
}

/// Keeps every event logged while it is the default subscriber.
#[derive(Clone, Default)]
struct Events(Arc<Mutex<Vec<Event>>>);

struct Fields<'a>(&'a mut BTreeMap<String, String>);

impl Visit for Fields<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.insert(
            field.name().to_owned(),
            format!("{value:?}").replace('"', ""),
        );
    }
}

impl<S: tracing::Subscriber> Layer<S> for Events {
    fn on_event(&self, event: &tracing::Event<'_>, _: Context<'_, S>) {
        let mut fields = BTreeMap::new();
        event.record(&mut Fields(&mut fields));
        let level = *event.metadata().level();
        self.0.lock().expect("events").push(Event { level, fields });
    }
}

impl Events {
    /// Logs to these events on this thread while the guard lives.
    fn capture(&self) -> tracing::subscriber::DefaultGuard {
        let subscriber = tracing_subscriber::registry().with(self.clone());
        tracing::subscriber::set_default(subscriber)
    }

    fn at(&self, level: tracing::Level) -> Vec<Event> {
        let events = self.0.lock().expect("events");
        events
            .iter()
            .filter(|e| e.level == level)
            .cloned()
            .collect()
    }
}

/// A client that gives up on a command after 300 ms.
async fn quick_client(server: &RedisServer) -> LockClient {
    LockClient::builder()
        .command_timeout(Duration::from_millis(300))
        .connect(&server.url())
        .await
        .expect("connect")
}

// On one thread: the subscriber is this thread's default.
#[tokio::test(flavor = "current_thread")]
async fn an_extractors_503_is_logged_as_an_error() {
    let events = Events::default();
    let _logging = events.capture();
    let mut server = RedisServer::start().expect("redis-server");
    let locks = quick_client(&server).await;
    let app = Router::new()
        .route("/orders/{id}/ship", post(ship))
        .with_state(locks);
    server.kill();
    let answer = send(
        &app,
        Request::post("/orders/1/ship")
            .body(Body::empty())
            .expect("request"),
    )
    .await;
    answer.assert_problem(503, "store-unavailable");
    let errors = events.at(tracing::Level::ERROR);
    assert!(
        errors.iter().any(
            |e| e.fields.get("status").map(String::as_str) == Some("503")
                && e.fields["message"].contains("Locked extractor")
        ),
        "no error logged for the 503: {errors:?}"
    );
}

#[tokio::test(flavor = "current_thread")]
async fn a_response_that_could_not_be_stored_is_not_logged_as_remembered() {
    let events = Events::default();
    let _logging = events.capture();
    let mut server = RedisServer::start().expect("redis-server");
    let locks = quick_client(&server).await;
    let entered = Arc::new(Notify::new());
    let finish = Arc::new(Notify::new());
    let handler = {
        let (entered, finish) = (entered.clone(), finish.clone());
        move || async move {
            entered.notify_one();
            finish.notified().await;
            "charged"
        }
    };
    let app = Router::new().route("/pay", post(handler)).layer(
        LockLayer::by_header("Idempotency-Key")
            .client(locks)
            .remember(Duration::from_secs(60)),
    );
    let (answer, ()) = tokio::join!(send(&app, req("/pay", Some("k"))), async {
        entered.notified().await;
        // The store goes away while the handler runs: its response cannot be stored.
        server.kill();
        finish.notify_one();
    });
    // The client still gets the handler's answer.
    assert_eq!(answer.text(), "charged");
    let warnings = events.at(tracing::Level::WARN);
    let failed: Vec<_> = warnings
        .iter()
        .filter(|e| e.fields["message"].contains("storing the response"))
        .collect();
    assert_eq!(failed.len(), 1, "{warnings:?}");
    assert_eq!(failed[0].fields["remembered"], "false");
    let all = events.0.lock().expect("events");
    assert!(
        !all.iter()
            .any(|e| e.fields.get("remembered").map(String::as_str) == Some("true")),
        "logged as remembered: {all:?}"
    );
}
