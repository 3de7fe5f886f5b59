//! An idempotent webhook receiver: duplicate deliveries of one event are processed once.
//!
//! ```text
//! cargo run --example webhook -- --demo   # fire concurrent duplicates at itself, print a table
//! REDIS_URL=redis://127.0.0.1:6379/ cargo run --example webhook -- --demo   # the same on Redis
//! REDIS_URL=redis://127.0.0.1:6379/ cargo run --example webhook             # serve on 127.0.0.1:3000 (--listen ADDR for another)
//! ```
//!
//! The demo is one process, so without `REDIS_URL` it runs on the in-process store, and
//! says so. Serving needs `REDIS_URL`: a receiver deployed as several replicas must share
//! its locks in Redis.
//!
//! Two routes, two ways to stay idempotent:
//!
//! - `/webhooks/payments`, keyed by the `Idempotency-Key` header, *remembers* each completed
//!   delivery for 24 h: duplicates that overlap the first wait for it (up to 2 s) and, like
//!   any later retry, get its stored response (`Idempotency-Replayed: true`) without
//!   running the handler.
//! - `/webhooks/events`, keyed by the `id` field of the JSON body, only locks: overlapping
//!   duplicates are answered `409` with `Retry-After`, and the handler itself notices a
//!   late retry of an event it processed already.
//!
//! The handler checks whether the event was processed already, then takes 200 ms to process
//! it: without the lock, overlapping duplicates would all pass that check.
//!
//! On SIGTERM (a deploy) or Ctrl-C the server stops taking requests, finishes those in
//! flight, then shuts the lock client down (`LockClient::shutdown`): no lock is left for
//! the next replica to wait out.

use std::collections::{BTreeMap, HashMap};
use std::future::IntoFuture;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::{Json, Router};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use lockwarden::{LockClient, LockLayer};
use serde::Deserialize;

#[path = "support/graceful.rs"]
mod graceful;

/// How many times each event was processed.
#[derive(Clone, Default)]
struct Processed(Arc<Mutex<HashMap<String, u32>>>);

impl Processed {
    fn count(&self, id: &str) -> u32 {
        self.0
            .lock()
            .map(|m| m.get(id).copied().unwrap_or(0))
            .unwrap_or(0)
    }

    fn record(&self, id: &str) {
        if let Ok(mut m) = self.0.lock() {
            *m.entry(id.to_owned()).or_default() += 1;
        }
    }
}

#[derive(Deserialize)]
struct Event {
    id: String,
}

/// Check, then process (slowly): safe only because the lock serializes duplicates.
async fn handle(processed: &Processed, id: &str) -> (StatusCode, String) {
    if processed.count(id) > 0 {
        return (StatusCode::OK, format!("{id}: already processed\n"));
    }
    tokio::time::sleep(Duration::from_millis(200)).await; // call the payment provider, etc.
    processed.record(id);
    (StatusCode::OK, format!("{id}: processed\n"))
}

async fn by_header(
    State(processed): State<Processed>,
    headers: axum::http::HeaderMap,
) -> (StatusCode, String) {
    // The layer guarantees the header is there.
    let id = headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    handle(&processed, &id).await
}

async fn by_body(
    State(processed): State<Processed>,
    Json(event): Json<Event>,
) -> (StatusCode, String) {
    handle(&processed, &event.id).await
}

async fn event_status(
    State(processed): State<Processed>,
    Path(id): Path<String>,
) -> Json<serde_json::Value> {
    Json(serde_json::json!({ "id": id, "processed": processed.count(&id) }))
}

fn app(processed: Processed, locks: LockClient) -> Router {
    let payments = Router::new()
        .route("/webhooks/payments", post(by_header))
        .layer(
            LockLayer::by_header("Idempotency-Key")
                .client(locks.clone())
                .name_prefix("payments:")
                .wait(Duration::from_secs(2))
                .remember(Duration::from_secs(24 * 3600)),
        );
    let events = Router::new()
        .route("/webhooks/events", post(by_body))
        .layer(
            LockLayer::by_json_field("/id")
                .client(locks)
                .name_prefix("events:"),
        );
    Router::new()
        .route("/events/{id}", get(event_status))
        .merge(payments)
        .merge(events)
        .with_state(processed)
}

#[tokio::main]
async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "error".into()),
        )
        .init();
    let demo = std::env::args().any(|a| a == "--demo");

    let locks = match std::env::var("REDIS_URL") {
        Ok(url) if !url.is_empty() => match LockClient::connect(&url).await {
            Ok(client) => {
                println!("lock backend: Redis (REDIS_URL)");
                client
            }
            Err(e) => {
                eprintln!("cannot reach REDIS_URL: {e}");
                return ExitCode::FAILURE;
            }
        },
        // The demo is one process: the in-process store is enough, and chosen here.
        _ if demo => {
            println!("lock backend: in-process (set REDIS_URL=redis://... to use Redis)");
            LockClient::in_memory()
        }
        _ => {
            eprintln!(
                "set REDIS_URL=redis://host:6379/ (the Redis every replica shares), \
                 or run with --demo"
            );
            return ExitCode::FAILURE;
        }
    };

    let processed = Processed::default();
    let listen = std::env::args()
        .skip_while(|a| a != "--listen")
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:3000".to_owned());
    let addr = if demo { "127.0.0.1:0" } else { &listen };
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
        println!("  curl -i -X POST http://{addr}/webhooks/payments -H 'Idempotency-Key: evt_1'");
        println!(
            "  curl -i -X POST http://{addr}/webhooks/events -H 'content-type: application/json' -d '{{\"id\":\"evt_1\"}}'"
        );
        println!("  curl http://{addr}/events/evt_1");
        println!("\nSend a payment twice to see the second answered from the store");
        println!("(Idempotency-Replayed: true); an event twice within 200 ms to see 409.");
        let served = axum::serve(listener, app(processed, locks.clone()))
            .with_graceful_shutdown(lockwarden::shutdown_signal())
            .await;
        // Every request has ended: what the client still holds or has queued goes now.
        let released = graceful::release_locks(&locks).await;
        return match (served, released) {
            (Ok(()), true) => ExitCode::SUCCESS,
            _ => ExitCode::FAILURE,
        };
    }
    let server =
        tokio::spawn(axum::serve(listener, app(processed.clone(), locks.clone())).into_future());
    let ok = run_demo(addr, &processed).await;
    server.abort();
    let ok = graceful::release_locks(&locks).await && ok;
    if ok {
        println!("\nevery event was processed exactly once");
        ExitCode::SUCCESS
    } else {
        println!("\nFAILED: an event was processed more than once (or never), or a payment retry was not replayed");
        ExitCode::FAILURE
    }
}

/// Events delivered by header (remembered) and by body (locked only).
const EVENTS: [(&str, bool); 4] = [
    ("pay_2001", true),
    ("pay_2002", true),
    ("evt_1001", false),
    ("evt_1002", false),
];
const DUPLICATES: usize = 6;

/// Fires `DUPLICATES` overlapping deliveries of each event, then one late retry each;
/// prints a table and says whether each was processed once.
async fn run_demo(addr: SocketAddr, processed: &Processed) -> bool {
    println!(
        "demo: {} events x {} concurrent deliveries + 1 late retry, on http://{addr}\n",
        EVENTS.len(),
        DUPLICATES
    );
    let mut statuses: BTreeMap<&str, BTreeMap<String, usize>> = BTreeMap::new();
    let mut tasks = Vec::new();
    for (id, by_header) in EVENTS {
        for _ in 0..DUPLICATES {
            tasks.push(tokio::spawn(async move {
                (id, deliver(addr, id, by_header).await)
            }));
        }
    }
    for task in tasks {
        if let Ok((id, status)) = task.await {
            *statuses.entry(id).or_default().entry(status).or_default() += 1;
        }
    }
    // A late retry, after the first delivery has finished: a payment is answered from the
    // store, an event by the handler ("already processed").
    tokio::time::sleep(Duration::from_millis(300)).await;
    for (id, by_header) in EVENTS {
        let status = deliver(addr, id, by_header).await;
        *statuses.entry(id).or_default().entry(status).or_default() += 1;
    }

    println!(
        "{:<10} {:<9} {:>5} {:>10}  statuses",
        "event", "route", "sent", "processed"
    );
    let mut all_once = true;
    for (id, by_header) in EVENTS {
        let route = if by_header { "payments" } else { "events" };
        let times = processed.count(id);
        all_once &= times == 1;
        // Every payment delivery but the first is answered from the store.
        let replays = statuses
            .get(id)
            .and_then(|s| s.get("200 replayed"))
            .copied()
            .unwrap_or(0);
        all_once &= !by_header || replays == DUPLICATES;
        let seen = statuses
            .get(id)
            .map(|s| {
                s.iter()
                    .map(|(status, n)| format!("{status} x{n}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            })
            .unwrap_or_default();
        println!(
            "{id:<10} {route:<9} {:>5} {times:>10}  {seen}",
            DUPLICATES + 1
        );
    }
    all_once
}

/// One delivery over a fresh loopback connection; the status, or the error.
async fn deliver(addr: SocketAddr, id: &str, by_header: bool) -> String {
    let request = if by_header {
        axum::http::Request::post("/webhooks/payments")
            .header("host", addr.to_string())
            .header("idempotency-key", id)
            .body(Full::new(Bytes::new()))
    } else {
        axum::http::Request::post("/webhooks/events")
            .header("host", addr.to_string())
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(format!(r#"{{"id":"{id}"}}"#))))
    };
    let result = async {
        let request = request?;
        let stream = tokio::net::TcpStream::connect(addr).await?;
        let (mut sender, conn) =
            hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
        tokio::spawn(conn);
        let response = sender.send_request(request).await?;
        let status = response.status();
        let replayed = response.headers().contains_key("idempotency-replayed");
        response.into_body().collect().await?;
        Ok::<_, Box<dyn std::error::Error + Send + Sync>>((status, replayed))
    };
    match tokio::time::timeout(Duration::from_secs(5), result).await {
        Ok(Ok((status, false))) => status.as_u16().to_string(),
        Ok(Ok((status, true))) => format!("{} replayed", status.as_u16()),
        Ok(Err(e)) => format!("error ({e})"),
        Err(_) => "timeout".to_owned(),
    }
}
