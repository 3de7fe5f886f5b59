//! `LockLayer` over real HTTP/1.1 on 127.0.0.1 (port 0) with hyper, against both stores:
//! answers on the wire, and release when the client disconnects mid-handler.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{Request, StatusCode};
use axum::routing::post;
use axum::Router;
use common::Env;
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;
use lockwarden::{LockClient, LockLayer};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;

conformance!(
    duplicates_over_http_get_409_with_retry_after,
    client_disconnect_mid_handler_releases_the_lock,
);

#[derive(Clone, Default)]
struct Probe {
    hits: Arc<AtomicUsize>,
    entered: Arc<Notify>,
}

async fn slow(State(p): State<Probe>) -> &'static str {
    p.hits.fetch_add(1, Ordering::SeqCst);
    p.entered.notify_one();
    tokio::time::sleep(Duration::from_millis(300)).await;
    "done"
}

async fn forever(State(p): State<Probe>) -> &'static str {
    p.hits.fetch_add(1, Ordering::SeqCst);
    p.entered.notify_one();
    std::future::pending::<()>().await;
    "unreachable"
}

/// Serves the app on 127.0.0.1:0; the server stops with the test's runtime.
async fn serve(client: &LockClient, probe: &Probe) -> std::net::SocketAddr {
    let app = Router::new()
        .route("/slow", post(slow))
        .route("/forever", post(forever))
        .layer(LockLayer::by_header("Idempotency-Key").client(client.clone()))
        .with_state(probe.clone());
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move { axum::serve(listener, app).await });
    addr
}

/// A fresh HTTP/1.1 connection; the connection task is returned so it can be aborted.
async fn connect(
    addr: std::net::SocketAddr,
) -> (
    hyper::client::conn::http1::SendRequest<Empty<Bytes>>,
    tokio::task::JoinHandle<()>,
) {
    let stream = TcpStream::connect(addr).await.expect("connect");
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .expect("handshake");
    let task = tokio::spawn(async move {
        let _ = conn.await;
    });
    (sender, task)
}

fn post_to(path: &str, key: &str) -> Request<Empty<Bytes>> {
    Request::post(path)
        .header("host", "127.0.0.1")
        .header("idempotency-key", key)
        .body(Empty::new())
        .expect("request")
}

async fn duplicates_over_http_get_409_with_retry_after(env: Env) {
    let client = env.client().await;
    let probe = Probe::default();
    let addr = serve(&client, &probe).await;
    let mut answers = Vec::new();
    for _ in 0..4 {
        answers.push(tokio::spawn(async move {
            let (mut sender, _conn) = connect(addr).await;
            let response = sender
                .send_request(post_to("/slow", "wire"))
                .await
                .expect("send");
            let status = response.status();
            let retry_after = response.headers().get("retry-after").cloned();
            let body = response
                .into_body()
                .collect()
                .await
                .expect("body")
                .to_bytes();
            (status, retry_after, body)
        }));
    }
    let mut ok = 0;
    for answer in answers {
        let (status, retry_after, body) = answer.await.expect("task");
        if status == StatusCode::OK {
            ok += 1;
            assert_eq!(body, "done");
        } else {
            assert_eq!(status, StatusCode::CONFLICT);
            assert!(retry_after.is_some());
            let json: serde_json::Value = serde_json::from_slice(&body).expect("problem+json");
            assert_eq!(json["status"], 409);
        }
    }
    assert_eq!(ok, 1);
    assert_eq!(probe.hits.load(Ordering::SeqCst), 1);
    // Released before the last frame went out, so free once every body was read.
    assert!(
        !client
            .lock("http:wire")
            .is_locked()
            .await
            .expect("is_locked"),
        "the lock outlived the response"
    );
}

async fn client_disconnect_mid_handler_releases_the_lock(env: Env) {
    let client = env.client().await;
    let probe = Probe::default();
    let addr = serve(&client, &probe).await;
    let (mut sender, conn) = connect(addr).await;
    let pending =
        tokio::spawn(async move { sender.send_request(post_to("/forever", "bye")).await });
    probe.entered.notified().await;
    assert!(client
        .lock("http:bye")
        .is_locked()
        .await
        .expect("is_locked"));
    // The client goes away: drop the request and close the socket.
    pending.abort();
    conn.abort();
    let deadline = Instant::now() + Duration::from_secs(2);
    while client
        .lock("http:bye")
        .is_locked()
        .await
        .expect("is_locked")
    {
        assert!(
            Instant::now() < deadline,
            "lock still held after the client left"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // A new client gets it (and would wait forever in the handler: just see it enter).
    let (mut sender, _conn) = connect(addr).await;
    let _next = tokio::spawn(async move { sender.send_request(post_to("/forever", "bye")).await });
    tokio::time::timeout(Duration::from_secs(2), probe.entered.notified())
        .await
        .expect("the next request reached the handler");
    assert_eq!(probe.hits.load(Ordering::SeqCst), 2);
}
