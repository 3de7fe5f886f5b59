//! The request span of the lock layer: one `lock_request` span per request with the key
//! (or its hash when redacted), the wait time, the outcome and the hold time.

mod common;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::http::StatusCode;
use axum::routing::post;
use axum::Router;
use common::web::{req, send};
use lockwarden::{LockClient, LockLayer};
use lockwarden_testkit::RedisServer;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::Layer;

type Fields = BTreeMap<String, String>;

/// Keeps the fields of every closed `lock_request` span.
#[derive(Clone, Default)]
struct Spans(Arc<Mutex<Vec<Fields>>>);

struct Collect<'a>(&'a mut Fields);

impl Visit for Collect<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.insert(
            field.name().to_owned(),
            format!("{value:?}").replace('"', ""),
        );
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.0.insert(field.name().to_owned(), value.to_string());
    }
}

impl<S> Layer<S> for Spans
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        if attrs.metadata().name() != "lock_request" {
            return;
        }
        let mut fields = Fields::new();
        attrs.record(&mut Collect(&mut fields));
        if let Some(span) = ctx.span(id) {
            span.extensions_mut().insert(fields);
        }
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
        if let Some(span) = ctx.span(id) {
            if let Some(fields) = span.extensions_mut().get_mut::<Fields>() {
                values.record(&mut Collect(fields));
            }
        }
    }

    fn on_close(&self, id: Id, ctx: Context<'_, S>) {
        if let Some(span) = ctx.span(&id) {
            if let Some(fields) = span.extensions_mut().remove::<Fields>() {
                self.0.lock().unwrap().push(fields);
            }
        }
    }
}

impl Spans {
    fn take(&self) -> Vec<Fields> {
        std::mem::take(&mut *self.0.lock().unwrap())
    }
}

fn app(layer: LockLayer<lockwarden::http::FromHeader>) -> Router {
    Router::new()
        .route(
            "/",
            post(|| async {
                tokio::time::sleep(Duration::from_millis(30)).await;
                "ok"
            }),
        )
        .layer(layer)
}

/// One request (with `Idempotency-Key: <key>` if given); its status.
async fn status(app: &Router, key: Option<&str>) -> StatusCode {
    send(app, req("/", key)).await.status
}

/// Promise: each request gets one span with key, wait_ms, outcome and (when it held the
/// lock) hold_ms; outcomes name what happened; redacted keys never appear in clear.
#[tokio::test(flavor = "current_thread")]
async fn one_span_per_request_with_key_wait_outcome_and_hold() {
    let spans = Spans::default();
    let _default =
        tracing::subscriber::set_default(tracing_subscriber::registry().with(spans.clone()));
    let client = LockClient::in_memory();

    let plain = app(LockLayer::by_header("Idempotency-Key").client(client.clone()));
    assert_eq!(status(&plain, Some("order-1")).await, StatusCode::OK);
    let held = client
        .try_acquire("http:order-2", Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(status(&plain, Some("order-2")).await, StatusCode::CONFLICT);
    held.release().await.unwrap();
    assert_eq!(status(&plain, None).await, StatusCode::BAD_REQUEST);
    let redacted = app(LockLayer::by_header("Idempotency-Key")
        .client(client.clone())
        .redact_keys());
    assert_eq!(
        status(&redacted, Some("secret-customer-key")).await,
        StatusCode::OK
    );
    tokio::time::sleep(Duration::from_millis(50)).await;

    let spans = spans.take();
    assert_eq!(spans.len(), 4, "{spans:#?}");
    let acquired = &spans[0];
    assert_eq!(acquired["key"], "http:order-1");
    assert_eq!(acquired["outcome"], "acquired");
    assert!(acquired.contains_key("wait_ms"));
    let hold: u64 = acquired["hold_ms"].parse().unwrap();
    assert!(hold >= 25, "held {hold} ms for a 30 ms handler");

    assert_eq!(spans[1]["key"], "http:order-2");
    assert_eq!(spans[1]["outcome"], "busy");
    assert!(!spans[1].contains_key("hold_ms"));

    assert_eq!(spans[2]["outcome"], "missing key");
    assert!(!spans[2].contains_key("key"));

    assert!(spans[3]["key"].starts_with("keyed:"), "{:?}", spans[3]);
    assert!(!spans[3]["key"].contains("secret"));
    assert_eq!(spans[3]["outcome"], "acquired");
}

/// Promise: a request answered 503 because Redis is down records `backend error`.
#[tokio::test(flavor = "current_thread")]
async fn backend_errors_are_the_outcome_when_redis_is_down() {
    let spans = Spans::default();
    let _default =
        tracing::subscriber::set_default(tracing_subscriber::registry().with(spans.clone()));
    let mut server = RedisServer::start().expect("redis-server");
    let client = LockClient::builder()
        .command_timeout(Duration::from_millis(300))
        .connect(&server.url())
        .await
        .unwrap();
    server.kill();
    let app = app(LockLayer::by_header("Idempotency-Key")
        .client(client)
        .wait(Duration::from_millis(200)));
    assert_eq!(
        status(&app, Some("k")).await,
        StatusCode::SERVICE_UNAVAILABLE
    );
    let spans = spans.take();
    assert_eq!(spans.len(), 1, "{spans:#?}");
    assert_eq!(spans[0]["outcome"], "backend error");
    assert_eq!(spans[0]["key"], "http:k");
}
