//! `LimitLayer` and the `Limited<T>` extractor, against both stores: at most N requests
//! per key at once across two servers over real HTTP; 429 with `Retry-After` and a
//! problem document; the permit held while the body streams and given back at its end,
//! on a dropped request and on a panic; capacities by request; bad input answered with
//! nothing held.

mod common;

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{Request, StatusCode};
use axum::routing::post;
use axum::Router;
use common::web::{post_over_http, send, serve};
use common::Env;
use futures_util::FutureExt;
use http_body_util::BodyExt;
use lockwarden::{LimitKey, LimitLayer, Limited, LockClient, LockLayer, PermitInfo, MAX_PERMITS};
use tokio::sync::Notify;
use tower::{Layer, ServiceExt};

conformance!(
    the_limit_holds_across_two_servers,
    a_full_limit_is_429_with_retry_after_and_a_problem,
    the_status_when_full_may_be_503,
    a_waiting_request_gets_the_permit_a_release_frees,
    the_permit_is_held_while_the_body_streams,
    the_permit_goes_back_when_the_request_is_dropped,
    the_permit_goes_back_when_the_handler_panics,
    capacity_by_request,
    a_global_limit_counts_every_request,
    bad_capacities_are_500_and_hold_nothing,
    missing_and_bad_keys_are_400_and_hold_nothing,
    a_limit_and_a_lock_on_one_key_do_not_collide,
    the_limited_extractor_holds_a_permit,
);

/// How many requests each key has running now, and the most seen at once.
#[derive(Clone, Default)]
struct Witness {
    running: Arc<Mutex<HashMap<String, (usize, usize)>>>,
    served: Arc<AtomicUsize>,
    entered: Arc<Notify>,
}

impl Witness {
    fn enter(&self, key: &str) {
        let mut running = self.running.lock().unwrap();
        let (now, most) = running.entry(key.to_owned()).or_default();
        *now += 1;
        *most = (*most).max(*now);
        drop(running);
        self.entered.notify_waiters();
    }

    fn leave(&self, key: &str) {
        let mut running = self.running.lock().unwrap();
        if let Some((now, _)) = running.get_mut(key) {
            *now -= 1;
        }
        self.served.fetch_add(1, Ordering::SeqCst);
    }

    fn most(&self, key: &str) -> usize {
        self.running
            .lock()
            .unwrap()
            .get(key)
            .map_or(0, |(_, most)| *most)
    }

    fn running(&self, key: &str) -> usize {
        self.running
            .lock()
            .unwrap()
            .get(key)
            .map_or(0, |(now, _)| *now)
    }
}

/// The handler: counts itself in for `x-tenant`, works 50 ms, counts itself out.
async fn work(State(w): State<Witness>, request: Request<Body>) -> &'static str {
    let key = tenant(&request);
    w.enter(&key);
    tokio::time::sleep(Duration::from_millis(50)).await;
    w.leave(&key);
    "done"
}

/// Counts itself in and never ends (until the request is dropped).
async fn forever(State(w): State<Witness>, request: Request<Body>) -> &'static str {
    w.enter(&tenant(&request));
    std::future::pending::<()>().await;
    "unreachable"
}

async fn panics(State(w): State<Witness>, request: Request<Body>) -> &'static str {
    w.enter(&tenant(&request));
    panic!("the handler panics");
}

fn tenant(request: &Request<Body>) -> String {
    request
        .headers()
        .get("x-tenant")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned()
}

fn app(layer: LimitLayer<lockwarden::http::FromHeader>, witness: &Witness) -> Router {
    Router::new()
        .route("/work", post(work))
        .route("/forever", post(forever))
        .route("/panic", post(panics))
        .layer(layer)
        .with_state(witness.clone())
}

fn limit(client: &LockClient, permits: u32) -> LimitLayer<lockwarden::http::FromHeader> {
    LimitLayer::permits(permits)
        .by_header("X-Tenant")
        .client(client.clone())
}

fn tenant_req(path: &str, tenant: &str) -> Request<Body> {
    Request::post(path)
        .header("x-tenant", tenant)
        .body(Body::empty())
        .expect("request")
}

/// Whether the semaphore of tenant `key` holds no permit within `within`.
async fn freed(client: &LockClient, key: &str, within: Duration) -> bool {
    let deadline = Instant::now() + within;
    let sem = client.semaphore(format!("http-limit:{key}"), 1);
    loop {
        if sem.state().await.expect("state").is_none() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Promise: two servers (each its own client on Redis) limit one key together: a burst
/// for three tenants with limits 1, 2 and 3 never runs more than the limit at once, and
/// what is refused is refused with 429.
async fn the_limit_holds_across_two_servers(env: Env) {
    let witness = Witness::default();
    let tiers = |parts: &http::request::Parts| match parts.headers.get("x-tenant") {
        Some(v) if v == "gold" => 3,
        Some(v) if v == "silver" => 2,
        _ => 1,
    };
    let mut addrs = Vec::new();
    for _ in 0..2 {
        let client = env.client().await;
        let layer = LimitLayer::permits_by(tiers)
            .by_header("X-Tenant")
            .client(client)
            .wait(Duration::from_millis(20));
        addrs.push(serve(app(layer, &witness)).await);
    }
    let mut burst = Vec::new();
    for i in 0..60 {
        let addr = addrs[i % 2];
        let tenant = ["gold", "silver", "bronze"][i % 3];
        burst.push(tokio::spawn(async move {
            (tenant, post_over_http(addr, "/work", tenant).await)
        }));
    }
    let mut answers: HashMap<(&str, StatusCode), usize> = HashMap::new();
    for request in burst {
        let answer = tokio::time::timeout(Duration::from_secs(20), request)
            .await
            .expect("answered in time")
            .expect("task");
        *answers.entry(answer).or_default() += 1;
    }
    for (tenant, limit) in [("gold", 3), ("silver", 2), ("bronze", 1)] {
        let most = witness.most(tenant);
        assert!(
            (1..=limit).contains(&most),
            "{tenant}: {most} at once, limit {limit}"
        );
        let ok = answers.get(&(tenant, StatusCode::OK)).copied().unwrap_or(0);
        let full = answers
            .get(&(tenant, StatusCode::TOO_MANY_REQUESTS))
            .copied()
            .unwrap_or(0);
        assert_eq!(ok + full, 20, "{tenant}: {answers:?}");
        assert!(ok >= 1, "{tenant}: none served");
    }
    assert!(
        answers.keys().all(
            |(_, status)| *status == StatusCode::OK || *status == StatusCode::TOO_MANY_REQUESTS
        ),
        "{answers:?}"
    );
}

/// Promise: a request that finds the limit full is answered 429 with `Retry-After` (at
/// least a second) and an RFC 9457 problem document, without reaching the handler.
async fn a_full_limit_is_429_with_retry_after_and_a_problem(env: Env) {
    let client = env.client().await;
    let witness = Witness::default();
    let app = app(limit(&client, 1), &witness);
    let first = tokio::spawn({
        let app = app.clone();
        async move { send(&app, tenant_req("/work", "acme")).await }
    });
    while witness.running("acme") == 0 {
        tokio::task::yield_now().await;
    }
    let refused = send(&app, tenant_req("/work", "acme")).await;
    refused.assert_problem(429, "limit-reached");
    assert!(refused.retry_after() >= 1);
    assert_eq!(first.await.expect("task").status, StatusCode::OK);
    assert_eq!(
        witness.served.load(Ordering::SeqCst),
        1,
        "the refused one ran"
    );
    assert!(freed(&client, "acme", Duration::from_secs(2)).await);
}

async fn the_status_when_full_may_be_503(env: Env) {
    let client = env.client().await;
    let witness = Witness::default();
    let layer = limit(&client, 1).full_status(StatusCode::SERVICE_UNAVAILABLE);
    let app = app(layer, &witness);
    let busy = client
        .semaphore("http-limit:acme", 1)
        .acquire()
        .await
        .unwrap();
    send(&app, tenant_req("/work", "acme"))
        .await
        .assert_problem(503, "limit-reached");
    busy.release().await.unwrap();
    assert_eq!(
        send(&app, tenant_req("/work", "acme")).await.status,
        StatusCode::OK
    );
}

/// Promise: within `.wait(..)`, a request waits for a permit and gets it when one is
/// released (not after a lease).
async fn a_waiting_request_gets_the_permit_a_release_frees(env: Env) {
    let client = env.client().await;
    let witness = Witness::default();
    let app = app(limit(&client, 1).wait(Duration::from_secs(10)), &witness);
    let busy = client
        .semaphore("http-limit:acme", 1)
        .acquire()
        .await
        .unwrap();
    let started = Instant::now();
    let waiting = tokio::spawn({
        let app = app.clone();
        async move { send(&app, tenant_req("/work", "acme")).await }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    busy.release().await.unwrap();
    let answer = waiting.await.expect("task");
    assert_eq!(answer.status, StatusCode::OK);
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
}

/// Promise: the permit is held while the response body streams and given back at its
/// end.
async fn the_permit_is_held_while_the_body_streams(env: Env) {
    let client = env.client().await;
    let (gate, opened) = tokio::sync::oneshot::channel::<()>();
    let opened = Arc::new(Mutex::new(Some(opened)));
    let service = limit(&client, 1).layer(tower::service_fn(move |_req: Request<Body>| {
        let opened = opened.lock().unwrap().take();
        async move {
            let stream = futures_util::stream::once(async move {
                if let Some(opened) = opened {
                    let _ = opened.await;
                }
                Ok::<_, Infallible>(Bytes::from("last"))
            });
            Ok::<_, Infallible>(axum::http::Response::new(Body::from_stream(stream)))
        }
    }));
    let response = service
        .oneshot(tenant_req("/", "acme"))
        .await
        .expect("infallible");
    assert_eq!(response.status(), StatusCode::OK);
    let sem = client.semaphore("http-limit:acme", 1);
    assert_eq!(
        sem.state().await.unwrap().map(|s| s.in_use),
        Some(1),
        "held while streaming"
    );
    gate.send(()).expect("the body waits");
    let body = response
        .into_body()
        .collect()
        .await
        .expect("body")
        .to_bytes();
    assert_eq!(body, "last");
    assert!(freed(&client, "acme", Duration::from_secs(2)).await);
}

/// Promise: a request dropped while its handler runs (the client went away) gives its
/// permit back.
async fn the_permit_goes_back_when_the_request_is_dropped(env: Env) {
    let client = env.client().await;
    let witness = Witness::default();
    let app = app(limit(&client, 1), &witness);
    let mut pending = Box::pin(send(&app, tenant_req("/forever", "acme")));
    // Drive it until the handler runs, then drop it.
    tokio::select! {
        _ = &mut pending => panic!("the handler returned"),
        () = async { while witness.running("acme") == 0 { tokio::time::sleep(Duration::from_millis(2)).await } } => {}
    }
    drop(pending);
    assert!(freed(&client, "acme", Duration::from_secs(2)).await);
    assert_eq!(
        send(&app, tenant_req("/work", "acme")).await.status,
        StatusCode::OK
    );
}

/// Promise: a handler that panics gives its permit back.
async fn the_permit_goes_back_when_the_handler_panics(env: Env) {
    let client = env.client().await;
    let witness = Witness::default();
    let app = app(limit(&client, 1), &witness);
    let outcome = std::panic::AssertUnwindSafe(send(&app, tenant_req("/panic", "acme")))
        .catch_unwind()
        .await;
    assert!(outcome.is_err(), "the panic went through");
    assert!(freed(&client, "acme", Duration::from_secs(2)).await);
}

/// Promise: `permits_by` gives each request's key its own capacity.
async fn capacity_by_request(env: Env) {
    let client = env.client().await;
    let witness = Witness::default();
    let layer = LimitLayer::permits_by(|parts| {
        if parts.headers.contains_key("x-paid") {
            2
        } else {
            1
        }
    })
    .by_header("X-Tenant")
    .client(client.clone());
    let app = app(layer, &witness);
    let paid = |path| {
        Request::post(path)
            .header("x-tenant", "big")
            .header("x-paid", "yes")
            .body(Body::empty())
            .unwrap()
    };
    let first = tokio::spawn({
        let app = app.clone();
        async move { send(&app, paid("/forever")).await }
    });
    while witness.running("big") == 0 {
        tokio::task::yield_now().await;
    }
    assert_eq!(
        send(&app, paid("/work")).await.status,
        StatusCode::OK,
        "2 for paid"
    );
    let free = tokio::spawn({
        let app = app.clone();
        async move { send(&app, tenant_req("/forever", "small")).await }
    });
    while witness.running("small") == 0 {
        tokio::task::yield_now().await;
    }
    send(&app, tenant_req("/work", "small"))
        .await
        .assert_problem(429, "limit-reached");
    first.abort();
    free.abort();
    assert!(freed(&client, "big", Duration::from_secs(2)).await);
    assert!(freed(&client, "small", Duration::from_secs(2)).await);
}

/// Promise: `global` counts every request, whatever it carries.
async fn a_global_limit_counts_every_request(env: Env) {
    let client = env.client().await;
    let witness = Witness::default();
    let app = Router::new()
        .route("/forever", post(forever))
        .route("/work", post(work))
        .layer(
            LimitLayer::permits(1)
                .global("rendering")
                .client(client.clone()),
        )
        .with_state(witness.clone());
    let first = tokio::spawn({
        let app = app.clone();
        async move { send(&app, tenant_req("/forever", "a")).await }
    });
    while witness.running("a") == 0 {
        tokio::task::yield_now().await;
    }
    send(&app, tenant_req("/work", "b"))
        .await
        .assert_problem(429, "limit-reached");
    first.abort();
    let sem = client.semaphore("http-limit:rendering", 1);
    let deadline = Instant::now() + Duration::from_secs(2);
    while sem.state().await.unwrap().is_some() {
        assert!(
            Instant::now() < deadline,
            "the aborted request kept its permit"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Promise: a capacity of 0 or above the largest one is a misconfiguration, answered 500
/// (`invalid-limit`), with nothing held and the handler not reached.
async fn bad_capacities_are_500_and_hold_nothing(env: Env) {
    let client = env.client().await;
    let witness = Witness::default();
    for permits in [0, MAX_PERMITS + 1] {
        let app = app(limit(&client, permits), &witness);
        let answer = send(&app, tenant_req("/work", "acme")).await;
        answer.assert_problem(500, "invalid-limit");
        let detail = answer.json()["detail"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        assert!(!detail.contains("capacity of"), "internals shown: {detail}");
    }
    // A capacity chosen per request is checked per request.
    let app = app(
        LimitLayer::permits_by(|_| 0)
            .by_header("X-Tenant")
            .client(client.clone()),
        &witness,
    );
    send(&app, tenant_req("/work", "acme"))
        .await
        .assert_problem(500, "invalid-limit");
    assert_eq!(witness.served.load(Ordering::SeqCst), 0);
    assert!(freed(&client, "acme", Duration::ZERO).await);
}

/// Promise: a missing key is 400 and an oversized one 400, with nothing held.
async fn missing_and_bad_keys_are_400_and_hold_nothing(env: Env) {
    let client = env.client().await;
    let witness = Witness::default();
    let app = app(limit(&client, 2), &witness);
    let none = Request::post("/work").body(Body::empty()).unwrap();
    send(&app, none).await.assert_problem(400, "missing-key");
    let long = "x".repeat(300);
    send(&app, tenant_req("/work", &long))
        .await
        .assert_problem(400, "invalid-key");
    assert_eq!(witness.served.load(Ordering::SeqCst), 0);
}

/// Promise: a limit layer and a lock layer keyed alike use different names, so neither
/// keeps the other out; the handler sees both its permit and its lock.
async fn a_limit_and_a_lock_on_one_key_do_not_collide(env: Env) {
    let client = env.client().await;
    let app = Router::new()
        .route(
            "/",
            post(
                |permit: axum::Extension<PermitInfo>,
                 lock: axum::Extension<lockwarden::LockInfo>| async move {
                    format!("{} {}", permit.key, lock.key)
                },
            ),
        )
        .layer(LockLayer::by_header("X-Tenant").client(client.clone()))
        .layer(limit(&client, 2));
    let answer = send(&app, tenant_req("/", "acme")).await;
    assert_eq!(answer.status, StatusCode::OK, "{}", answer.text());
    assert_eq!(answer.text(), "http-limit:acme http:acme");
}

struct Account(String);

impl LimitKey for Account {
    fn limit_key(&self) -> String {
        format!("exports:{}", self.0)
    }
    fn permits(&self) -> u32 {
        1
    }
}

impl<S: Send + Sync> axum::extract::FromRequestParts<S> for Account {
    type Rejection = StatusCode;

    async fn from_request_parts(
        parts: &mut http::request::Parts,
        _: &S,
    ) -> Result<Self, Self::Rejection> {
        let tenant = parts
            .headers
            .get("x-tenant")
            .ok_or(StatusCode::BAD_REQUEST)?;
        Ok(Account(
            tenant
                .to_str()
                .map_err(|_| StatusCode::BAD_REQUEST)?
                .to_owned(),
        ))
    }
}

/// Promise: `Limited<T>` holds a permit of `T`'s limit while the handler keeps it, and
/// answers 429 when the limit is full.
async fn the_limited_extractor_holds_a_permit(env: Env) {
    let client = env.client().await;
    let entered = Arc::new(Notify::new());
    let leave = Arc::new(Notify::new());
    let app = Router::new()
        .route(
            "/",
            post({
                let (entered, leave) = (entered.clone(), leave.clone());
                move |Limited(account): Limited<Account>| async move {
                    entered.notify_one();
                    leave.notified().await;
                    account.0.clone()
                }
            }),
        )
        .with_state(client.clone());
    let first = tokio::spawn({
        let app = app.clone();
        async move { send(&app, tenant_req("/", "acme")).await }
    });
    entered.notified().await;
    send(&app, tenant_req("/", "acme"))
        .await
        .assert_problem(429, "limit-reached");
    leave.notify_one();
    let answer = first.await.expect("task");
    assert_eq!(answer.text(), "acme");
    // The extracted value is dropped with the handler: its permit goes back soon after.
    let sem = client.semaphore("exports:acme", 1);
    let deadline = Instant::now() + Duration::from_secs(2);
    while sem.state().await.unwrap().is_some() {
        assert!(Instant::now() < deadline, "the permit was kept");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}
