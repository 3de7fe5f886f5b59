//! A rate limit per tenant across two app instances: `RateLimitLayer` admits each tenant
//! at most what its plan allows per unit of time, whichever instance serves it, and tells
//! clients so in the IETF `RateLimit` fields.
//!
//! ```text
//! cargo run --example rate_limit -- --demo   # a burst at two instances, print a table
//! REDIS_URL=redis://127.0.0.1:6379/ cargo run --example rate_limit -- --demo   # on Redis
//! ```
//!
//! The demo starts two instances of the app on loopback ports, sharing one store (two
//! Redis clients with `REDIS_URL`, else one in-process store: the demo is one process),
//! and fires a burst of concurrent requests for three tenants on three plans: 2 at once
//! and 10 a minute, 5 at once and 60 a minute, 10 at once and 600 a minute. It prints,
//! per tenant, how many requests were admitted against what its plan allows over the
//! burst's duration (its burst plus its rate times the time), how many were answered
//! `429 Too Many Requests`, and the fields a client saw on its last admitted and its
//! first refused response.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::get;
use axum::Router;
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;
use lockwarden::{LockClient, LockError, RateLimitLayer, RateLimiter, RatePolicy};

/// The plans: name, burst, requests per minute.
const PLANS: [(&str, u32, u32); 3] = [("free", 2, 10), ("team", 5, 60), ("enterprise", 10, 600)];
/// The tenants, and their plans.
const TENANTS: [(&str, &str); 3] = [
    ("acme", "free"),
    ("globex", "team"),
    ("initech", "enterprise"),
];
/// Requests per tenant in the burst.
const BURST: usize = 30;

/// One limiter per plan, each with a name of its own (its buckets are its own).
fn plans(client: &LockClient) -> Result<Vec<(&'static str, RateLimiter)>, LockError> {
    PLANS
        .iter()
        .map(|&(plan, burst, per_minute)| {
            let policy =
                RatePolicy::new("minute", per_minute, Duration::from_secs(60)).burst(burst);
            Ok((plan, client.rate_limiter(plan, [policy])?))
        })
        .collect()
}

/// The plan of a tenant (in a real app: from the authenticated principal).
fn plan_of(headers: &HeaderMap) -> &'static str {
    let tenant = headers.get("x-tenant").and_then(|v| v.to_str().ok());
    TENANTS
        .iter()
        .find(|(name, _)| Some(*name) == tenant)
        .map_or("free", |(_, plan)| plan)
}

/// The app of one instance: `free` is the limiter of unknown tenants, `limiters` the
/// others by plan.
fn app(free: RateLimiter, limiters: Vec<(&'static str, RateLimiter)>) -> Router {
    let layer = RateLimitLayer::plans(move |parts| {
        let plan = plan_of(&parts.headers);
        let chosen = limiters.iter().find(|(name, _)| *name == plan);
        chosen.map_or_else(|| free.clone(), |(_, limiter)| limiter.clone())
    })
    .by_header("X-Tenant")
    .rate_limit_headers();
    Router::new()
        .route("/search", get(|| async { "results\n" }))
        .layer(layer)
}

/// What a client saw: the status and the rate-limit fields.
struct Seen {
    status: StatusCode,
    fields: String,
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
    // Two instances, each with its own client: on Redis they share the buckets there;
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
        Some(_) => println!("store: Redis (REDIS_URL), one client per instance"),
        None => println!("store: in-process (set REDIS_URL=redis://... to use Redis)"),
    }

    let mut instances = Vec::new();
    let mut servers = Vec::new();
    for client in &clients {
        let limiters = match plans(client) {
            Ok(limiters) => limiters,
            Err(e) => {
                eprintln!("{e}");
                return ExitCode::FAILURE;
            }
        };
        let Some((_, free)) = limiters.first().cloned() else {
            return ExitCode::FAILURE;
        };
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
        let app = app(free, limiters);
        servers.push(tokio::spawn(
            async move { axum::serve(listener, app).await },
        ));
    }
    println!(
        "burst: {BURST} concurrent requests per tenant, alternating between {} and {}\n",
        instances[0], instances[1]
    );

    let started = Instant::now();
    let mut burst = Vec::new();
    for i in 0..BURST {
        for (tenant, _) in TENANTS {
            let addr = instances[i % 2];
            burst.push(tokio::spawn(
                async move { (tenant, search(addr, tenant).await) },
            ));
        }
    }
    let mut seen: BTreeMap<&str, Vec<Seen>> = BTreeMap::new();
    let mut failures = Vec::new();
    for request in burst {
        match request.await {
            Ok((tenant, Ok(answer))) => seen.entry(tenant).or_default().push(answer),
            Ok((tenant, Err(e))) => failures.push(format!("{tenant}: {e}")),
            Err(e) => failures.push(e.to_string()),
        }
    }
    let elapsed = started.elapsed();
    for server in servers {
        server.abort();
    }
    for client in &clients {
        if let Err(error) = client.shutdown(Duration::from_secs(5)).await {
            eprintln!("{error}");
        }
    }

    println!(
        "{:<8} {:<10} {:>8} {:>8} {:>5}   (burst {:.2} s)",
        "tenant",
        "plan",
        "allowed",
        "admitted",
        "429",
        elapsed.as_secs_f64()
    );
    let mut within = failures.is_empty();
    for (tenant, plan) in TENANTS {
        let Some(&(_, burst, per_minute)) = PLANS.iter().find(|(name, _, _)| *name == plan) else {
            continue;
        };
        // What the plan allows over the burst's duration: its burst, plus a unit per
        // interval that passed.
        let allowed = u64::from(burst)
            + (elapsed.as_secs_f64() * f64::from(per_minute) / 60.0).floor() as u64;
        let answers = seen.get(tenant).map(Vec::as_slice).unwrap_or_default();
        let admitted = answers
            .iter()
            .filter(|a| a.status == StatusCode::OK)
            .count() as u64;
        let refused = answers
            .iter()
            .filter(|a| a.status == StatusCode::TOO_MANY_REQUESTS)
            .count();
        within &= admitted <= allowed && admitted >= u64::from(burst);
        println!("{tenant:<8} {plan:<10} {allowed:>8} {admitted:>8} {refused:>5}");
    }
    println!("\nwhat a client saw:");
    for (tenant, _) in TENANTS {
        let answers = seen.get(tenant).map(Vec::as_slice).unwrap_or_default();
        let last_ok = answers.iter().rev().find(|a| a.status == StatusCode::OK);
        let first_refused = answers
            .iter()
            .find(|a| a.status == StatusCode::TOO_MANY_REQUESTS);
        for (what, answer) in [("admitted", last_ok), ("refused", first_refused)] {
            if let Some(answer) = answer {
                println!("  {tenant:<8} {what:<9} {}", answer.fields);
            }
        }
    }
    for failure in &failures {
        println!("  error: {failure}");
    }
    if within {
        println!("\nno tenant was admitted more than its plan allows, and each got its burst");
        ExitCode::SUCCESS
    } else {
        println!(
            "\nFAILED: a tenant was admitted more than its plan allows, or less than its burst"
        );
        ExitCode::FAILURE
    }
}

/// `GET /search` as `tenant` over a fresh loopback connection: what it saw.
async fn search(addr: SocketAddr, tenant: &str) -> Result<Seen, String> {
    let result = async {
        let request = axum::http::Request::get("/search")
            .header("host", addr.to_string())
            .header("x-tenant", tenant)
            .body(Empty::<Bytes>::new())?;
        let stream = tokio::net::TcpStream::connect(addr).await?;
        let (mut sender, conn) =
            hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
        tokio::spawn(conn);
        let response = sender.send_request(request).await?;
        let status = response.status();
        let headers = response.headers().clone();
        response.into_body().collect().await?;
        Ok::<Seen, Box<dyn std::error::Error + Send + Sync>>(Seen {
            status,
            fields: fields(&headers),
        })
    };
    match tokio::time::timeout(Duration::from_secs(10), result).await {
        Ok(Ok(seen)) => Ok(seen),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err("timeout".to_owned()),
    }
}

/// `RateLimit-Policy`, `RateLimit` and `Retry-After`, as a client received them.
fn fields(headers: &HeaderMap) -> String {
    ["ratelimit-policy", "ratelimit", "retry-after"]
        .iter()
        .filter_map(|name| {
            let value = headers.get(*name)?.to_str().ok()?;
            Some(format!("{name}: {value}"))
        })
        .collect::<Vec<_>>()
        .join(" | ")
}
