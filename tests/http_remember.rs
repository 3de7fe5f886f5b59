//! Idempotent replay (`LockLayer::remember`) through an axum router, against both stores,
//! plus the release-before-last-byte promise that replay and follow-up requests rely on.

mod common;

use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{header, Request, Response, StatusCode};
use axum::routing::post;
use axum::Router;
use common::web::send;
use common::Env;
use futures_util::StreamExt;
use http_body_util::BodyExt;
use lockwarden::{Fingerprint, LockClient, LockLayer};
use tower::ServiceExt;

conformance!(
    a_retry_after_completion_is_replayed_byte_for_byte,
    same_key_different_request_is_422,
    server_errors_are_not_stored_and_the_retry_runs,
    concurrent_duplicates_run_the_handler_once_and_all_get_its_response,
    duplicates_in_flight_without_a_wait_get_409,
    remembered_responses_expire_after_their_keep_time,
    oversize_bodies_are_sent_but_not_stored,
    streaming_bodies_are_stored_whole,
    a_body_that_fails_mid_way_stores_nothing,
    a_panicking_handler_stores_nothing_and_frees_the_key,
    json_field_fingerprint_ignores_other_fields,
    follow_up_right_after_a_response_finds_the_lock_free,
);

#[derive(Clone, Default)]
struct Runs(Arc<AtomicUsize>);

impl Runs {
    fn count(&self) -> usize {
        self.0.load(Ordering::SeqCst)
    }
    fn hit(&self) -> usize {
        self.0.fetch_add(1, Ordering::SeqCst) + 1
    }
}

/// 201 with a body that differs per run, a `location` and an unlisted header.
async fn create(State(runs): State<Runs>, body: Bytes) -> Response<Body> {
    let run = runs.hit();
    tokio::time::sleep(Duration::from_millis(50)).await;
    let mut out = format!("run {run} of ").into_bytes();
    out.extend_from_slice(&body);
    out.push(0xff); // not UTF-8: stored byte for byte
    Response::builder()
        .status(StatusCode::CREATED)
        .header(header::CONTENT_TYPE, "application/x-receipt")
        .header(header::LOCATION, format!("/orders/{run}"))
        .header("x-run", run.to_string())
        .body(Body::from(out))
        .unwrap()
}

async fn fail(State(runs): State<Runs>) -> (StatusCode, String) {
    let run = runs.hit();
    (StatusCode::BAD_GATEWAY, format!("upstream down {run}"))
}

async fn big(State(runs): State<Runs>) -> String {
    let run = runs.hit();
    format!("{run}:{}", "x".repeat(4096))
}

async fn stream(State(runs): State<Runs>) -> Body {
    let run = runs.hit();
    let chunks = futures_util::stream::iter(0..4u8).then(move |i| async move {
        tokio::time::sleep(Duration::from_millis(30)).await;
        Ok::<_, Infallible>(Bytes::from(format!("[{run}.{i}]")))
    });
    Body::from_stream(chunks)
}

async fn broken(State(runs): State<Runs>) -> Body {
    runs.hit();
    let chunks = futures_util::stream::iter(0..3u8).map(|i| {
        if i == 2 {
            Err(std::io::Error::other("disk gone"))
        } else {
            Ok(Bytes::from_static(b"part"))
        }
    });
    Body::from_stream(chunks)
}

async fn panics(State(runs): State<Runs>) -> &'static str {
    if runs.hit() == 1 {
        panic!("handler bug on the first run");
    }
    "fine"
}

fn routes() -> Router<Runs> {
    Router::new()
        .route("/orders", post(create))
        .route("/fail", post(fail))
        .route("/big", post(big))
        .route("/stream", post(stream))
        .route("/broken", post(broken))
        .route("/panics", post(panics))
}

/// The usual remembering router over `client`.
fn remembering(client: &LockClient, keep: Duration, wait: Duration) -> (Router, Runs) {
    let runs = Runs::default();
    let app = routes()
        .layer(
            LockLayer::by_header("Idempotency-Key")
                .client(client.clone())
                .wait(wait)
                .remember(keep)
                .max_stored_body(1024)
                .replay_header(header::LOCATION),
        )
        .with_state(runs.clone());
    (app, runs)
}

fn post_req(path: &str, key: &str, body: &'static str) -> Request<Body> {
    Request::post(path)
        .header("Idempotency-Key", key)
        .body(Body::from(body))
        .unwrap()
}

/// Promise: a retry after the first request completed gets the stored status, content
/// type, allow-listed headers and body byte for byte, marked `Idempotency-Replayed`,
/// and the handler does not run again; unlisted headers are not replayed.
async fn a_retry_after_completion_is_replayed_byte_for_byte(env: Env) {
    let client = env.client().await;
    let (app, runs) = remembering(&client, Duration::from_secs(60), Duration::ZERO);
    let first = send(&app, post_req("/orders", "k1", "pay 5")).await;
    assert_eq!(first.status, StatusCode::CREATED);
    assert!(!first.replayed());
    let retry = send(&app, post_req("/orders", "k1", "pay 5")).await;
    assert_eq!(runs.count(), 1, "the handler ran again");
    assert!(retry.replayed());
    assert_eq!(retry.status, StatusCode::CREATED);
    assert_eq!(retry.body, first.body);
    assert_eq!(retry.headers[header::CONTENT_TYPE], "application/x-receipt");
    assert_eq!(
        retry.headers[header::LOCATION],
        first.headers[header::LOCATION]
    );
    assert!(retry.headers.get("x-run").is_none());
    // Another key is another request.
    let other = send(&app, post_req("/orders", "k2", "pay 5")).await;
    assert!(!other.replayed());
    assert_eq!(runs.count(), 2);
}

/// Promise: the same key with a different method, path or body is answered 422
/// `idempotency-key-reused` (problem+json) and never reaches the handler.
async fn same_key_different_request_is_422(env: Env) {
    let client = env.client().await;
    let (app, runs) = remembering(&client, Duration::from_secs(60), Duration::ZERO);
    send(&app, post_req("/orders", "k", "pay 5")).await;
    for request in [
        post_req("/orders", "k", "pay 6"),
        post_req("/orders?x=1", "k", "pay 5"),
        post_req("/fail", "k", "pay 5"),
    ] {
        let answer = send(&app, request).await;
        assert_eq!(answer.status, StatusCode::UNPROCESSABLE_ENTITY);
        assert_eq!(
            answer.problem_type(),
            "urn:lockwarden:problem:idempotency-key-reused"
        );
    }
    assert_eq!(runs.count(), 1);
    // The original is still answered from the store.
    assert!(send(&app, post_req("/orders", "k", "pay 5"))
        .await
        .replayed());
}

/// Promise: a 5xx response is not stored and frees the key: the retry runs the handler.
async fn server_errors_are_not_stored_and_the_retry_runs(env: Env) {
    let client = env.client().await;
    let (app, runs) = remembering(&client, Duration::from_secs(60), Duration::ZERO);
    let first = send(&app, post_req("/fail", "k", "")).await;
    assert_eq!(first.status, StatusCode::BAD_GATEWAY);
    let retry = send(&app, post_req("/fail", "k", "")).await;
    assert_eq!(retry.status, StatusCode::BAD_GATEWAY);
    assert!(!retry.replayed());
    assert_eq!(retry.body, "upstream down 2");
    assert_eq!(runs.count(), 2);
}

/// Promise: duplicates that arrive while the first is in flight and may wait get the
/// first one's response (replayed) once it completes; the handler runs once.
async fn concurrent_duplicates_run_the_handler_once_and_all_get_its_response(env: Env) {
    let client = env.client().await;
    let (app, runs) = remembering(&client, Duration::from_secs(60), Duration::from_secs(5));
    let mut tasks = Vec::new();
    for _ in 0..10 {
        let app = app.clone();
        tasks.push(tokio::spawn(async move {
            send(&app, post_req("/orders", "dup", "pay 9")).await
        }));
    }
    let mut answers = Vec::new();
    for task in tasks {
        answers.push(task.await.unwrap());
    }
    assert_eq!(runs.count(), 1);
    assert!(answers.iter().all(|a| a.status == StatusCode::CREATED));
    assert!(answers.iter().all(|a| a.body == answers[0].body));
    assert_eq!(answers.iter().filter(|a| !a.replayed()).count(), 1);
}

/// Promise: without a wait budget, a duplicate in flight is answered 409 with
/// `Retry-After` (the first one's fingerprint is not known yet, so no 422).
async fn duplicates_in_flight_without_a_wait_get_409(env: Env) {
    let client = env.client().await;
    let (app, runs) = remembering(&client, Duration::from_secs(60), Duration::ZERO);
    let first = tokio::spawn({
        let app = app.clone();
        async move { send(&app, post_req("/orders", "k", "a")).await }
    });
    tokio::time::sleep(Duration::from_millis(20)).await;
    let duplicate = send(&app, post_req("/orders", "k", "b")).await;
    assert_eq!(duplicate.status, StatusCode::CONFLICT);
    assert!(duplicate.headers.contains_key(header::RETRY_AFTER));
    assert_eq!(duplicate.problem_type(), "urn:lockwarden:problem:lock-busy");
    assert_eq!(first.await.unwrap().status, StatusCode::CREATED);
    assert_eq!(runs.count(), 1);
}

/// Promise: a remembered response is forgotten after its keep time; then the key is new.
async fn remembered_responses_expire_after_their_keep_time(env: Env) {
    let client = env.client().await;
    let (app, runs) = remembering(&client, Duration::from_millis(300), Duration::ZERO);
    send(&app, post_req("/orders", "k", "x")).await;
    assert!(send(&app, post_req("/orders", "k", "x")).await.replayed());
    tokio::time::sleep(Duration::from_millis(600)).await;
    let later = send(&app, post_req("/orders", "k", "x")).await;
    assert!(!later.replayed());
    assert_eq!(runs.count(), 2);
}

/// Promise: a response body over the storage cap is delivered whole but not stored; the
/// key is freed and a retry runs the handler again.
async fn oversize_bodies_are_sent_but_not_stored(env: Env) {
    let client = env.client().await;
    let (app, runs) = remembering(&client, Duration::from_secs(60), Duration::ZERO);
    let first = send(&app, post_req("/big", "k", "")).await;
    assert_eq!(first.body.len(), "1:".len() + 4096);
    let retry = send(&app, post_req("/big", "k", "")).await;
    assert!(!retry.replayed());
    assert!(retry.body.starts_with(b"2:"));
    assert_eq!(runs.count(), 2);
}

/// Promise: a streamed body is recorded as it streams and replayed whole.
async fn streaming_bodies_are_stored_whole(env: Env) {
    let client = env.client().await;
    let (app, runs) = remembering(&client, Duration::from_secs(60), Duration::ZERO);
    let first = send(&app, post_req("/stream", "k", "")).await;
    assert_eq!(first.body, "[1.0][1.1][1.2][1.3]");
    let retry = send(&app, post_req("/stream", "k", "")).await;
    assert!(retry.replayed());
    assert_eq!(retry.body, first.body);
    assert_eq!(runs.count(), 1);
}

/// Promise: a body that errors mid-way is not stored, and the key is free afterwards.
async fn a_body_that_fails_mid_way_stores_nothing(env: Env) {
    let client = env.client().await;
    let (app, runs) = remembering(&client, Duration::from_secs(60), Duration::ZERO);
    let response = app
        .clone()
        .oneshot(post_req("/broken", "k", ""))
        .await
        .unwrap();
    assert!(response.into_body().collect().await.is_err());
    // The retry runs (and fails mid-way) again: nothing was replayed.
    let retry = app
        .clone()
        .oneshot(post_req("/broken", "k", ""))
        .await
        .unwrap();
    assert!(retry.headers().get("idempotency-replayed").is_none());
    assert!(retry.into_body().collect().await.is_err());
    assert_eq!(runs.count(), 2, "the retry did not run");
}

/// Promise: a handler that panics stores nothing and frees the key: the retry runs.
async fn a_panicking_handler_stores_nothing_and_frees_the_key(env: Env) {
    let client = env.client().await;
    let (app, runs) = remembering(&client, Duration::from_secs(60), Duration::from_secs(3));
    let crashed = tokio::spawn({
        let app = app.clone();
        async move { app.oneshot(post_req("/panics", "k", "")).await }
    })
    .await;
    assert!(crashed.unwrap_err().is_panic());
    let retry = send(&app, post_req("/panics", "k", "")).await;
    assert_eq!(retry.status, StatusCode::OK);
    assert_eq!(retry.body, "fine");
    assert_eq!(runs.count(), 2);
}

/// Promise: with a JSON-field fingerprint, a retry whose other fields changed (a new
/// signature, a new timestamp) is still the same request; a changed field is not.
async fn json_field_fingerprint_ignores_other_fields(env: Env) {
    let client = env.client().await;
    let runs = Runs::default();
    let app = routes()
        .layer(
            LockLayer::by_header("Idempotency-Key")
                .client(client.clone())
                .remember(Duration::from_secs(60))
                .fingerprint(Fingerprint::json_fields(["/id", "/amount"])),
        )
        .with_state(runs.clone());
    send(
        &app,
        post_req("/orders", "e", r#"{"id":"e1","amount":5,"sent":1}"#),
    )
    .await;
    let retry = send(
        &app,
        post_req("/orders", "e", r#"{"sent":2,"id":"e1","amount":5}"#),
    )
    .await;
    assert!(retry.replayed());
    let changed = send(&app, post_req("/orders", "e", r#"{"id":"e1","amount":6}"#)).await;
    assert_eq!(changed.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(runs.count(), 1);
}

/// Promise (plain lock, no remembering): the lock is released before the response's last
/// byte is handed on, so the client's next request with the key never finds it busy.
async fn follow_up_right_after_a_response_finds_the_lock_free(env: Env) {
    let client = env.client().await;
    let runs = Runs::default();
    let app = routes()
        .layer(LockLayer::by_header("Idempotency-Key").client(client))
        .with_state(runs.clone());
    for round in 0..50 {
        for path in ["/orders", "/stream", "/fail"] {
            let answer = send(&app, post_req(path, "same", "")).await;
            assert_ne!(
                answer.status,
                StatusCode::CONFLICT,
                "round {round}: {path} found the lock still held"
            );
        }
        if round == 5 && !env.is_redis() {
            break; // in-process releases synchronously; a few rounds suffice
        }
    }
    assert!(runs.count() >= 18);
}

/// Promise (Redis): remembered responses live in Redis, not in the client: a new client
/// (a restarted service) answers a retry from the store, without running the handler.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn remembered_responses_survive_a_client_restart() {
    let env = Env::redis();
    let before = env.client().await;
    let (app, runs) = remembering(&before, Duration::from_secs(60), Duration::ZERO);
    let first = send(&app, post_req("/orders", "k", "pay 1")).await;
    drop(app);
    drop(before);
    let after = env.client().await;
    let (app, runs_after) = remembering(&after, Duration::from_secs(60), Duration::ZERO);
    let retry = send(&app, post_req("/orders", "k", "pay 1")).await;
    assert!(retry.replayed());
    assert_eq!(retry.body, first.body);
    assert_eq!((runs.count(), runs_after.count()), (1, 0));
    // The stored entry carries the keep time as its expiry.
    let ttl: i64 = env
        .server()
        .query(&["PTTL", "lockwarden:{http:k}:done"])
        .unwrap();
    assert!((50_000..=60_000).contains(&ttl), "{ttl}");
}
