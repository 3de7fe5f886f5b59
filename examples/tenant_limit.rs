//! A concurrency limit per tenant across two app instances: `LimitLayer` gives each
//! tenant at most as many requests running at once as its plan allows, whichever
//! instance serves them.
//!
//! ```text
//! cargo run --example tenant_limit -- --demo   # a burst at two instances, print a table
//! REDIS_URL=redis://127.0.0.1:6379/ cargo run --example tenant_limit -- --demo   # on Redis
//! ```
//!
//! The demo starts two instances of the app on loopback ports, sharing one lock store
//! (two Redis clients with `REDIS_URL`, else one in-process store: the demo is one
//! process), and fires a burst of concurrent requests for three tenants whose plans allow
//! 1, 2 and 4 requests at once. Each request works for 100 ms. It prints, per tenant, the
//! most requests seen running at once (never above the limit), how many were served and
//! how many were answered `429 Too Many Requests`.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use axum::Router;
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;
use lockwarden::{LimitLayer, LockClient};

/// The tenants, and how many of their requests may run at once.
const TENANTS: [(&str, u32); 3] = [("free", 1), ("team", 2), ("enterprise", 4)];
/// Requests per tenant in the burst.
const BURST: usize = 12;

/// How many requests of each tenant run now, and the most seen at once.
#[derive(Clone, Default)]
struct Running(Arc<Mutex<HashMap<String, (u32, u32)>>>);

impl Running {
    fn enter(&self, tenant: &str) {
        if let Ok(mut running) = self.0.lock() {
            let (now, most) = running.entry(tenant.to_owned()).or_default();
            *now += 1;
            *most = (*most).max(*now);
        }
    }

    fn leave(&self, tenant: &str) {
        if let Ok(mut running) = self.0.lock() {
            if let Some((now, _)) = running.get_mut(tenant) {
                *now -= 1;
            }
        }
    }

    fn most(&self, tenant: &str) -> u32 {
        self.0
            .lock()
            .map(|running| running.get(tenant).map_or(0, |(_, most)| *most))
            .unwrap_or(0)
    }
}

/// An export that takes 100 ms.
async fn export(State(running): State<Running>, headers: HeaderMap) -> &'static str {
    let tenant = headers
        .get("x-tenant")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    running.enter(&tenant);
    tokio::time::sleep(Duration::from_millis(100)).await;
    running.leave(&tenant);
    "exported\n"
}

/// A tenant's plan, from its id (in a real app: from the authenticated principal).
fn plan(headers: &HeaderMap) -> u32 {
    let tenant = headers.get("x-tenant").and_then(|v| v.to_str().ok());
    TENANTS
        .iter()
        .find(|(name, _)| Some(*name) == tenant)
        .map_or(1, |(_, limit)| *limit)
}

fn app(locks: LockClient, running: Running) -> Router {
    Router::new()
        .route("/exports", post(export))
        .layer(
            LimitLayer::permits_by(|parts| plan(&parts.headers))
                .by_header("X-Tenant")
                .client(locks),
        )
        .with_state(running)
}

#[tokio::main]
async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "error".into()),
        )
        .init();
    if !std::env::args().any(|a| a == "--demo") {
        eprintln!("run with --demo (see the example's docs)");
        return ExitCode::FAILURE;
    }
    // Two instances, each with its own client: on Redis they share the limits there;
    // in-process they share one store (a demo is one process).
    let url = std::env::var("REDIS_URL").ok().filter(|u| !u.is_empty());
    let shared = LockClient::in_memory();
    let mut clients = Vec::new();
    for _ in 0..2 {
        let client = match &url {
            Some(url) => match LockClient::connect(url).await {
                Ok(client) => client,
                Err(e) => {
                    eprintln!("cannot reach REDIS_URL: {e}");
                    return ExitCode::FAILURE;
                }
            },
            None => shared.clone(),
        };
        clients.push(client);
    }
    match url {
        Some(_) => println!("lock store: Redis (REDIS_URL), one client per instance"),
        None => println!("lock store: in-process (set REDIS_URL=redis://... to use Redis)"),
    }

    let running = Running::default();
    let mut instances = Vec::new();
    let mut servers = Vec::new();
    for client in clients.clone() {
        let listener = match tokio::net::TcpListener::bind("127.0.0.1:0").await {
            Ok(listener) => listener,
            Err(e) => {
                eprintln!("cannot listen on a loopback port: {e}");
                return ExitCode::FAILURE;
            }
        };
        let Ok(addr) = listener.local_addr() else {
            return ExitCode::FAILURE;
        };
        instances.push(addr);
        let app = app(client, running.clone());
        servers.push(tokio::spawn(
            async move { axum::serve(listener, app).await },
        ));
    }
    println!(
        "burst: {BURST} concurrent requests per tenant, alternating between {} and {}\n",
        instances[0], instances[1]
    );

    let mut burst = Vec::new();
    for i in 0..BURST {
        for (tenant, _) in TENANTS {
            let addr = instances[i % 2];
            burst.push(tokio::spawn(async move {
                (tenant, export_over_http(addr, tenant).await)
            }));
        }
    }
    let mut answers: BTreeMap<&str, BTreeMap<String, usize>> = BTreeMap::new();
    for request in burst {
        if let Ok((tenant, status)) = request.await {
            *answers
                .entry(tenant)
                .or_default()
                .entry(status)
                .or_default() += 1;
        }
    }
    for server in servers {
        server.abort();
    }
    // What the clients still hold or have queued to release goes now, not with a lease.
    for client in &clients {
        if let Err(error) = client.shutdown(Duration::from_secs(5)).await {
            eprintln!("{error}");
        }
    }

    println!(
        "{:<11} {:>5} {:>14} {:>6} {:>5}  other",
        "tenant", "limit", "most at once", "served", "429"
    );
    let mut within = true;
    for (tenant, limit) in TENANTS {
        let seen = answers.get(tenant).cloned().unwrap_or_default();
        let served = seen.get("200").copied().unwrap_or(0);
        let full = seen.get("429").copied().unwrap_or(0);
        let other: Vec<String> = seen
            .iter()
            .filter(|(status, _)| *status != "200" && *status != "429")
            .map(|(status, n)| format!("{status} x{n}"))
            .collect();
        let most = running.most(tenant);
        within &= most <= limit && served > 0 && other.is_empty();
        println!(
            "{tenant:<11} {limit:>5} {most:>14} {served:>6} {full:>5}  {}",
            other.join(", ")
        );
    }
    if within {
        println!("\nno tenant ever ran more requests at once than its limit");
        ExitCode::SUCCESS
    } else {
        println!("\nFAILED: a tenant exceeded its limit, or got no request served");
        ExitCode::FAILURE
    }
}

/// `POST /exports` as `tenant` over a fresh loopback connection: the status, or the error.
async fn export_over_http(addr: SocketAddr, tenant: &str) -> String {
    let result = async {
        let request = axum::http::Request::post("/exports")
            .header("host", addr.to_string())
            .header("x-tenant", tenant)
            .body(Empty::<Bytes>::new())?;
        let stream = tokio::net::TcpStream::connect(addr).await?;
        let (mut sender, conn) =
            hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
        tokio::spawn(conn);
        let response = sender.send_request(request).await?;
        let status = response.status();
        response.into_body().collect().await?;
        Ok::<StatusCode, Box<dyn std::error::Error + Send + Sync>>(status)
    };
    match tokio::time::timeout(Duration::from_secs(10), result).await {
        Ok(Ok(status)) => status.as_u16().to_string(),
        Ok(Err(e)) => format!("error ({e})"),
        Err(_) => "timeout".to_owned(),
    }
}
