//! Driving an axum `Router` in-process (`tower::ServiceExt::oneshot`) and reading what it
//! answered: the HTTP tests' one copy of the request/answer helpers.

use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, Request, StatusCode};
use axum::Router;
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;
use tower::ServiceExt;

/// How long a response, and then its whole body, may take.
const ANSWER_BOUND: Duration = Duration::from_secs(10);

/// A response with its body read in full.
#[derive(Debug)]
pub struct Answer {
    /// The status.
    pub status: StatusCode,
    /// The headers.
    pub headers: HeaderMap,
    /// The whole body.
    pub body: Bytes,
}

impl Answer {
    /// The body as text (lossy).
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The body as JSON.
    ///
    /// # Panics
    /// If it is not JSON.
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not a JSON body ({e}): {}", self.text()))
    }

    /// Asserts an RFC 9457 problem document with this status and `type` slug
    /// (`urn:lockwarden:problem:<slug>`), a title and a detail.
    pub fn assert_problem(&self, status: u16, slug: &str) {
        assert_eq!(self.status.as_u16(), status, "{}", self.text());
        assert_eq!(
            self.problem_type(),
            format!("urn:lockwarden:problem:{slug}")
        );
        let json = self.json();
        assert!(json["title"].as_str().is_some_and(|t| !t.is_empty()));
        assert!(json["detail"].as_str().is_some_and(|d| !d.is_empty()));
    }

    /// The `type` of a problem document, after checking that it is one (content type
    /// `application/problem+json`, `status` member equal to the response's status).
    pub fn problem_type(&self) -> String {
        assert_eq!(
            self.headers["content-type"],
            "application/problem+json",
            "{}",
            self.text()
        );
        let json = self.json();
        assert_eq!(json["status"], self.status.as_u16());
        json["type"].as_str().expect("a problem type").to_owned()
    }

    /// The `Retry-After` header, in whole seconds.
    pub fn retry_after(&self) -> u64 {
        self.headers["retry-after"]
            .to_str()
            .expect("ascii")
            .parse()
            .expect("whole seconds")
    }

    /// Whether the answer is a replay of a remembered response (`Idempotency-Replayed:
    /// true`).
    pub fn replayed(&self) -> bool {
        self.headers
            .get("idempotency-replayed")
            .is_some_and(|v| v == "true")
    }
}

/// Sends `request` through `app` and reads the whole answer.
///
/// # Panics
/// If the response or its body takes more than 10 s, or the body fails.
pub async fn send(app: &Router, request: Request<Body>) -> Answer {
    let response = tokio::time::timeout(ANSWER_BOUND, app.clone().oneshot(request))
        .await
        .expect("a response within 10 s")
        .expect("infallible");
    let (parts, body) = response.into_parts();
    let body = tokio::time::timeout(ANSWER_BOUND, body.collect())
        .await
        .expect("the whole body within 10 s")
        .expect("the body does not fail")
        .to_bytes();
    Answer {
        status: parts.status,
        headers: parts.headers,
        body,
    }
}

/// An empty `POST` to `path`, with `Idempotency-Key: <key>` if a key is given.
pub fn req(path: &str, key: Option<&str>) -> Request<Body> {
    let mut builder = Request::post(path);
    if let Some(key) = key {
        builder = builder.header("idempotency-key", key);
    }
    builder.body(Body::empty()).expect("request")
}

/// Serves `app` on 127.0.0.1:0, over real HTTP; the server stops with the test's runtime.
pub async fn serve(app: Router) -> std::net::SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move { axum::serve(listener, app).await });
    addr
}

/// One `POST` to `path` as tenant `tenant` (`x-tenant`) over a fresh loopback connection:
/// the status, once the body is read.
pub async fn post_over_http(addr: std::net::SocketAddr, path: &str, tenant: &str) -> StatusCode {
    let stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .expect("handshake");
    tokio::spawn(conn);
    let request = Request::post(path)
        .header("host", "127.0.0.1")
        .header("x-tenant", tenant)
        .body(Empty::<Bytes>::new())
        .expect("request");
    let response = sender.send_request(request).await.expect("response");
    let status = response.status();
    response.into_body().collect().await.expect("body");
    status
}
