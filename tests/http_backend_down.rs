//! The lock store goes away: the layer fails closed (503) within its budget, or open.
//! These need a store that can fail, so they run against a real `redis-server` only.

use std::time::{Duration, Instant};

mod common;

use axum::http::StatusCode;
use axum::routing::post;
use axum::Router;
use common::web::{req, send, Answer};
use lockwarden::{LockClient, LockLayer};
use lockwarden_testkit::{FaultProxy, RedisServer};

const WAIT: Duration = Duration::from_millis(200);
const COMMAND_TIMEOUT: Duration = Duration::from_millis(300);

async fn client(server: &RedisServer) -> LockClient {
    LockClient::builder()
        .command_timeout(COMMAND_TIMEOUT)
        .connect(&server.url())
        .await
        .expect("connect")
}

fn app(layer: LockLayer<lockwarden::http::FromHeader>) -> Router {
    Router::new()
        .route("/", post(|| async { "handled" }))
        .layer(layer)
}

/// One request with the key `k`.
async fn call(app: &Router) -> Answer {
    send(app, req("/", Some("k"))).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_redis_is_503_within_the_budget() {
    let mut server = RedisServer::start().expect("redis-server");
    let app = app(LockLayer::by_header("Idempotency-Key")
        .client(client(&server).await)
        .wait(WAIT));
    assert_eq!(call(&app).await.status, StatusCode::OK);
    server.kill();
    let started = Instant::now();
    let answer = call(&app).await;
    let took = started.elapsed();
    assert_eq!(answer.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(
        answer.problem_type(),
        "urn:lockwarden:problem:store-unavailable"
    );
    assert!(
        took <= WAIT + COMMAND_TIMEOUT + Duration::from_millis(300),
        "took {took:?}"
    );
    // A retry may find the store back: it says when to try.
    assert_eq!(answer.retry_after(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_two_second_wait_is_answered_within_it_and_the_command_timeout() {
    // The defaults: a 2 s command timeout.
    let server = RedisServer::start().expect("redis-server");
    let wait = Duration::from_secs(2);
    let locks = LockClient::connect(&server.url()).await.expect("connect");
    let app = app(LockLayer::by_header("Idempotency-Key")
        .client(locks)
        .wait(wait));
    assert_eq!(call(&app).await.status, StatusCode::OK);
    // SIGSTOP: every command waits out its timeout, the slowest way to fail.
    server.pause();
    let started = Instant::now();
    let answer = call(&app).await;
    let took = started.elapsed();
    server.resume();
    answer.assert_problem(503, "store-unavailable");
    assert_eq!(answer.retry_after(), 1);
    let command_timeout = Duration::from_secs(2);
    assert!(
        took <= wait + command_timeout + Duration::from_millis(300),
        "took {took:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paused_redis_is_503_within_the_budget() {
    let server = RedisServer::start().expect("redis-server");
    let app = app(LockLayer::by_header("Idempotency-Key")
        .client(client(&server).await)
        .wait(WAIT));
    assert_eq!(call(&app).await.status, StatusCode::OK);
    server.pause();
    let started = Instant::now();
    let status = call(&app).await.status;
    let took = started.elapsed();
    server.resume();
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert!(
        took <= WAIT + COMMAND_TIMEOUT + Duration::from_millis(300),
        "took {took:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fail_open_passes_through_unlocked() {
    let mut server = RedisServer::start().expect("redis-server");
    let app = app(LockLayer::by_header("Idempotency-Key")
        .client(client(&server).await)
        .wait(WAIT)
        .fail_open());
    server.kill();
    let answer = call(&app).await;
    assert_eq!(answer.status, StatusCode::OK);
    assert_eq!(answer.body, "handled");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_acquire_reply_does_not_lock_the_key_for_a_lease() {
    let server = RedisServer::start().expect("redis-server");
    let proxy = FaultProxy::start(server.port()).expect("proxy");
    let client = LockClient::builder()
        .command_timeout(COMMAND_TIMEOUT)
        .connect(&proxy.url())
        .await
        .expect("connect");
    let app = app(LockLayer::by_header("Idempotency-Key")
        .client(client)
        .wait(WAIT));
    assert_eq!(call(&app).await.status, StatusCode::OK);

    // The acquire runs in Redis, its reply is lost: the request gets 503.
    proxy.drop_replies();
    assert_eq!(call(&app).await.status, StatusCode::SERVICE_UNAVAILABLE);
    // It ran: the lock took a fencing token (what it took may be given back already).
    assert!(server.exists("lockwarden:{http:k}:fence"));
    proxy.heal();

    // Within a second of the heal the key serves requests again (not 409s for the 30 s
    // watchdog lease the lost acquire asked for).
    let healed = Instant::now();
    loop {
        let status = call(&app).await.status;
        if status == StatusCode::OK {
            break;
        }
        assert!(
            healed.elapsed() < Duration::from_secs(1),
            "still {status} {:?} after the heal",
            healed.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        !server.exists("lockwarden:{k}"),
        "released after the request"
    );
}
