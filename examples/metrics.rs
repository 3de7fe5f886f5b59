//! Metrics for Prometheus beside an axum app that locks each order by its
//! `Idempotency-Key`: lockwarden records through the `metrics` facade, and
//! `metrics-exporter-prometheus` renders what it recorded at `GET /metrics`.
//!
//! ```text
//! cargo run --example metrics             # fire duplicates at itself, print lockwarden's series
//! cargo run --example metrics -- --serve  # serve on 127.0.0.1:3001 (POST /orders/{id}, GET /metrics)
//! ```

use std::future::IntoFuture;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

use axum::body::Bytes;
use axum::routing::{get, post};
use axum::Router;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use lockwarden::{LockClient, LockLayer};
use metrics_exporter_prometheus::PrometheusBuilder;

#[path = "support/graceful.rs"]
mod graceful;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

async fn place_order() -> &'static str {
    tokio::time::sleep(Duration::from_millis(200)).await;
    "placed"
}

#[tokio::main]
async fn main() -> Result<ExitCode, BoxError> {
    let prometheus = PrometheusBuilder::new().install_recorder()?;
    let locks = LockClient::in_memory(); // LockClient::connect(url).await? for Redis
    let app = Router::new()
        .route(
            "/orders/{id}",
            post(place_order).layer(LockLayer::by_header("Idempotency-Key").client(locks.clone())),
        )
        .route("/metrics", get(move || async move { prometheus.render() }));

    let serve = std::env::args().any(|a| a == "--serve");
    let addr = if serve {
        "127.0.0.1:3001"
    } else {
        "127.0.0.1:0"
    };
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let addr = listener.local_addr()?;
    if serve {
        println!("serving on http://{addr} (POST /orders/{{id}}, GET /metrics)");
        // On SIGTERM or Ctrl-C: finish the requests in flight, then release what is left.
        axum::serve(listener, app)
            .with_graceful_shutdown(lockwarden::shutdown_signal())
            .await?;
        let released = graceful::release_locks(&locks).await;
        return Ok(if released {
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
        });
    }
    let server = tokio::spawn(axum::serve(listener, app).into_future());

    // Four concurrent deliveries of one order: one places it, three are answered 409.
    let duplicates = (0..4).map(|_| request(addr, "POST", "/orders/17", Some("order-17")));
    let statuses: Vec<u16> = futures_util::future::join_all(duplicates)
        .await
        .into_iter()
        .map(|answer| answer.map_or(0, |(status, _)| status))
        .collect();
    // One without a key: 400.
    let missing = request(addr, "POST", "/orders/18", None).await?.0;
    println!("duplicates answered {statuses:?}, the keyless request {missing}\n");

    let (_, metrics) = request(addr, "GET", "/metrics", None).await?;
    let ours: Vec<&str> = metrics
        .lines()
        .filter(|line| line.starts_with("lockwarden_") && !line.contains("quantile"))
        .collect();
    println!("{}", ours.join("\n"));
    server.abort();
    let expected = [
        r#"lockwarden_http_requests_total{route="/orders/{id}",outcome="locked",status="handler"} 1"#,
        r#"lockwarden_http_requests_total{route="/orders/{id}",outcome="busy",status="409"} 3"#,
        r#"lockwarden_acquisitions_total{kind="plain",outcome="taken"} 1"#,
    ];
    let all = expected.iter().all(|line| ours.contains(line));
    Ok(if all {
        ExitCode::SUCCESS
    } else {
        eprintln!("\nexpected among them:\n{}", expected.join("\n"));
        ExitCode::FAILURE
    })
}

/// One request over a fresh loopback connection: the status and the body.
async fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    key: Option<&str>,
) -> Result<(u16, String), BoxError> {
    let mut builder = axum::http::Request::builder()
        .method(method)
        .uri(path)
        .header("host", addr.to_string());
    if let Some(key) = key {
        builder = builder.header("idempotency-key", key);
    }
    let request = builder.body(Full::new(Bytes::new()))?;
    let answer = async {
        let stream = tokio::net::TcpStream::connect(addr).await?;
        let (mut sender, conn) =
            hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
        tokio::spawn(conn);
        let response = sender.send_request(request).await?;
        let status = response.status().as_u16();
        let body = response.into_body().collect().await?.to_bytes();
        Ok::<_, BoxError>((status, String::from_utf8_lossy(&body).into_owned()))
    };
    tokio::time::timeout(Duration::from_secs(5), answer).await?
}
