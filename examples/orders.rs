//! Per-order serialization with the `Locked<OrderId>` extractor and a streaming response.
//!
//! ```text
//! cargo run --example orders -- --demo   # ship one order twice at once, print both answers
//! REDIS_URL=redis://127.0.0.1:6379/ cargo run --example orders   # serve on 127.0.0.1:3001
//! ```
//!
//! The extractor takes its lock client from the router's state. The demo is one process,
//! so without `REDIS_URL` it runs on the in-process store; serving needs `REDIS_URL`.
//!
//! `POST /orders/{id}/ship` locks `order:<id>` and streams its progress for a second. The
//! lock moves into the response stream, so it is held until the last line is sent: a second
//! `ship` of the same order meanwhile is answered `409` with `Retry-After`, another order
//! ships in parallel.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{FromRequestParts, Path};
use axum::http::request::Parts;
use axum::routing::post;
use axum::Router;
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;
use lockwarden::{LockClient, LockKey, Locked};

#[path = "support/graceful.rs"]
mod graceful;

/// An order id from the path.
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

/// Streams five progress lines; `order` (and so the lock) lives in the stream until its end.
async fn ship(Locked(order): Locked<OrderId>) -> Body {
    let token = order.fencing_token();
    let steps = ["picking", "packing", "labelling", "handing over", "shipped"];
    let lines = futures_util::stream::unfold((0, order), move |(i, order)| async move {
        if i == steps.len() {
            return None; // `order` is dropped here: the lock is released.
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        let line = format!("order {} (token {token}): {}\n", order.0, steps[i]);
        Some((Ok::<_, Infallible>(Bytes::from(line)), (i + 1, order)))
    });
    Body::from_stream(lines)
}

fn app(locks: LockClient) -> Router {
    Router::new()
        .route("/orders/{id}/ship", post(ship))
        .with_state(locks)
}

#[tokio::main]
async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .init();
    let demo = std::env::args().any(|a| a == "--demo");
    let locks = match std::env::var("REDIS_URL") {
        Ok(url) if !url.is_empty() => match LockClient::connect(&url).await {
            Ok(client) => client,
            Err(e) => {
                eprintln!("cannot reach REDIS_URL: {e}");
                return ExitCode::FAILURE;
            }
        },
        // One process: the in-process store is enough, and chosen here.
        _ if demo => LockClient::in_memory(),
        _ => {
            eprintln!("set REDIS_URL=redis://host:6379/, or run with --demo");
            return ExitCode::FAILURE;
        }
    };
    let addr = if demo {
        "127.0.0.1:0"
    } else {
        "127.0.0.1:3001"
    };
    let listener = match tokio::net::TcpListener::bind(addr).await {
        Ok(listener) => listener,
        Err(e) => {
            eprintln!("cannot listen on {addr}: {e}");
            return ExitCode::FAILURE;
        }
    };
    let Ok(addr) = listener.local_addr() else {
        return ExitCode::FAILURE;
    };
    if !demo {
        println!("listening on http://{addr}\n");
        println!("  curl -N -X POST http://{addr}/orders/42/ship   # in two terminals at once");
        // On SIGTERM or Ctrl-C: finish the shipments in flight, then release what is left.
        let served = axum::serve(listener, app(locks.clone()))
            .with_graceful_shutdown(lockwarden::shutdown_signal())
            .await;
        let released = graceful::release_locks(&locks).await;
        return match (served, released) {
            (Ok(()), true) => ExitCode::SUCCESS,
            _ => ExitCode::FAILURE,
        };
    }
    let server = tokio::spawn(async move { axum::serve(listener, app(locks)).await });
    let (first, second, other) = tokio::join!(
        ship_order(addr, 42),
        async {
            tokio::time::sleep(Duration::from_millis(100)).await;
            ship_order(addr, 42).await
        },
        ship_order(addr, 7),
    );
    server.abort();
    for (name, answer) in [
        ("first 42", &first),
        ("second 42", &second),
        ("order 7", &other),
    ] {
        println!("--- {name}: {}\n{}", answer.0, answer.1.trim_end());
    }
    if first.0 == 200 && second.0 == 409 && other.0 == 200 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// `POST /orders/{id}/ship` over loopback: status and body.
async fn ship_order(addr: SocketAddr, id: u64) -> (u16, String) {
    let result = async {
        let request = axum::http::Request::post(format!("/orders/{id}/ship"))
            .header("host", addr.to_string())
            .body(Empty::<Bytes>::new())?;
        let stream = tokio::net::TcpStream::connect(addr).await?;
        let (mut sender, conn) =
            hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
        tokio::spawn(conn);
        let response = sender.send_request(request).await?;
        let status = response.status().as_u16();
        let body = response.into_body().collect().await?.to_bytes();
        Ok::<_, Box<dyn std::error::Error + Send + Sync>>((
            status,
            String::from_utf8_lossy(&body).into_owned(),
        ))
    };
    match tokio::time::timeout(Duration::from_secs(5), result).await {
        Ok(Ok(answer)) => answer,
        Ok(Err(e)) => (0, format!("error: {e}")),
        Err(_) => (0, "timeout".to_owned()),
    }
}
