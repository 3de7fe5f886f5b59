//! A chaos run through the HTTP layer: two replicas of one axum service, each behind
//! `LockLayer::by_header` and served over real TCP on loopback, one reaching Redis through
//! the testkit's `FaultProxy` and one directly, answer concurrent requests for three keys
//! while the proxy cycles latency spikes of twice the command timeout, lost replies,
//! blackholes longer than the lease and resets, and Redis is restarted twice.
//!
//! Mutual exclusion cannot survive a lost lock; what must hold is that no handler runs
//! beside another of its key without being told. An in-process witness records the
//! handlers inside each key. Checked:
//! - a handler whose lock was taken over while it ran (another handler of its key
//!   entered) was told: the lost signal of its request's `LockInfo` had fired when it
//!   returned, or the layer reported the loss before its release (a warning in the
//!   request's span: the lock found lost, or a release that failed) — 0 silent;
//! - fencing tokens seen by the handlers of one key never go back;
//! - every answer is a 2xx, a 409/423 or a 503 with a problem document, none slower than
//!   a bound;
//! - once the faults end, no lock key is left behind;
//! - the run did real work (handled requests, busy and unavailable answers, takeovers).

mod common;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, Request, StatusCode};
use axum::routing::post;
use axum::{Extension, Router};
use common::connect_with;
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;
use lockwarden::{LockClient, LockInfo, LockLayer};
use lockwarden_testkit::{eventually, ChaosRun, FaultProxy, RedisServer};
use tokio::net::{TcpListener, TcpStream};
use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::Layer;

const LEASE: Duration = Duration::from_millis(1500);
const COMMAND_TIMEOUT: Duration = Duration::from_millis(300);
/// How long faults are injected and requests sent.
const CHAOS: Duration = Duration::from_secs(20);
/// When Redis is restarted: at set times, not fault steps, which a loaded machine slows.
const RESTARTS: [Duration; 2] = [Duration::from_secs(6), Duration::from_secs(13)];
const KEYS: usize = 3;
const CLIENTS: usize = 8;
/// A bound on each client's requests besides `CHAOS`; a normal run stays far below it.
const MAX_ROUNDS: usize = 5000;
/// How long a busy key is waited for before the layer answers 409/423.
const WAIT: Duration = Duration::from_millis(200);
/// The longest an answer may take: a long handler, a wait, and a release that times
/// out, with room for a loaded machine. Longer counts as a hang.
const ANSWER_BOUND: Duration = Duration::from_secs(10);

/// What a handler saw, recorded when it returned.
struct Handled {
    id: u64,
    taken_over: bool,
    /// Its lock's lost signal had fired when it returned.
    told: bool,
}

/// A handler inside a key, as the witness knows it.
struct Inside {
    id: u64,
    taken_over: Arc<AtomicBool>,
}

/// The handlers inside each key, and what the run found.
#[derive(Default)]
struct Witness {
    inside: Mutex<HashMap<String, Vec<Inside>>>,
    last_token: Mutex<HashMap<String, u64>>,
    next_id: AtomicU64,
    handled: Mutex<Vec<Handled>>,
    takeovers: AtomicU64,
    tokens_back: AtomicU64,
    /// Handlers inside a long hold now.
    long: AtomicU64,
}

impl Witness {
    /// Records a handler's entry into `name` with `token`; every handler inside is marked
    /// taken over. Returns the entry's id and its taken-over flag.
    fn enter(&self, name: &str, token: u64) -> (u64, Arc<AtomicBool>) {
        let id = self.next_id.fetch_add(1, Ordering::SeqCst);
        let taken_over = Arc::new(AtomicBool::new(false));
        let mut inside = self.inside.lock().unwrap();
        let here = inside.entry(name.to_owned()).or_default();
        for other in here.iter() {
            if !other.taken_over.swap(true, Ordering::SeqCst) {
                self.takeovers.fetch_add(1, Ordering::SeqCst);
            }
        }
        here.push(Inside {
            id,
            taken_over: taken_over.clone(),
        });
        let mut last = self.last_token.lock().unwrap();
        if token <= last.insert(name.to_owned(), token).unwrap_or(0) {
            self.tokens_back.fetch_add(1, Ordering::SeqCst);
        }
        (id, taken_over)
    }

    fn leave(&self, name: &str, id: u64, taken_over: &AtomicBool, told: bool) {
        let mut inside = self.inside.lock().unwrap();
        if let Some(here) = inside.get_mut(name) {
            here.retain(|entry| entry.id != id);
        }
        // Read under the lock: nobody can mark an entry that has left.
        let taken_over = taken_over.load(Ordering::SeqCst);
        self.handled.lock().unwrap().push(Handled {
            id,
            taken_over,
            told,
        });
    }
}

/// The handler: inside the witness for a few milliseconds, one request in six for two
/// leases, so faults and restarts catch handlers inside.
async fn handle(
    State(witness): State<Arc<Witness>>,
    Extension(info): Extension<LockInfo>,
    headers: HeaderMap,
) -> StatusCode {
    // The key the client asked for, not the lock's name: the witness knows nothing of
    // how the layer names locks.
    let name = headers["idempotency-key"]
        .to_str()
        .expect("ascii")
        .to_owned();
    let (id, taken_over) = witness.enter(&name, info.fencing_token());
    // Ties this request's span, where the layer reports a loss, to the entry.
    tracing::info!(witness = id, "handler entered");
    let long = id.is_multiple_of(6);
    let work = if long {
        2 * LEASE
    } else {
        Duration::from_millis(2 + id % 5 * 3)
    };
    witness.long.fetch_add(u64::from(long), Ordering::SeqCst);
    tokio::time::sleep(work).await;
    witness.long.fetch_sub(u64::from(long), Ordering::SeqCst);
    witness.leave(&name, id, &taken_over, info.lost.is_lost());
    // An empty body: the layer releases before it answers, so by the time every answer
    // is in, so is every report of a failed release.
    StatusCode::OK
}

/// The witness ids of the requests whose span got a warning from the layer after their
/// handler entered: the lock found lost at the release, or a release that failed.
#[derive(Clone, Default)]
struct LayerReports(Arc<Mutex<HashSet<u64>>>);

/// The witness id a handler recorded in its request's span.
struct WitnessId(u64);

struct FindWitness(Option<u64>);

impl Visit for FindWitness {
    fn record_u64(&mut self, field: &Field, value: u64) {
        if field.name() == "witness" {
            self.0 = Some(value);
        }
    }
    fn record_debug(&mut self, _: &Field, _: &dyn std::fmt::Debug) {}
}

impl<S> Layer<S> for LayerReports
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
        let Some(scope) = ctx.event_scope(event) else {
            return;
        };
        let Some(span) = scope.into_iter().find(|span| span.name() == "lock_request") else {
            return;
        };
        let mut found = FindWitness(None);
        event.record(&mut found);
        if let Some(id) = found.0 {
            span.extensions_mut().insert(WitnessId(id));
        } else if *event.metadata().level() == Level::WARN {
            if let Some(WitnessId(id)) = span.extensions().get::<WitnessId>() {
                self.0.lock().unwrap().insert(*id);
            }
        }
    }
}

/// One replica of the service, served on 127.0.0.1:0 until the test's runtime ends.
async fn replica(client: LockClient, witness: &Arc<Witness>, conflict: StatusCode) -> SocketAddr {
    let app = Router::new()
        .route("/", post(handle))
        .layer(
            LockLayer::by_header("Idempotency-Key")
                .client(client)
                .wait(WAIT)
                .conflict_status(conflict),
        )
        .with_state(witness.clone());
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move { axum::serve(listener, app).await });
    addr
}

/// An answer as the client got it.
struct Answer {
    status: StatusCode,
    content_type: Option<String>,
    body: Bytes,
}

/// POSTs to `addr` with `Idempotency-Key: key`, on a connection of its own.
async fn post_key(addr: SocketAddr, key: &str) -> Result<Answer, String> {
    let stream = TcpStream::connect(addr)
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| format!("handshake: {e}"))?;
    let conn = tokio::spawn(conn);
    let request = Request::post("/")
        .header("host", "127.0.0.1")
        .header("idempotency-key", key)
        .body(Empty::<Bytes>::new())
        .expect("request");
    let response = sender
        .send_request(request)
        .await
        .map_err(|e| format!("send: {e}"))?;
    let status = response.status();
    let content_type = response
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let body = response
        .into_body()
        .collect()
        .await
        .map_err(|e| format!("body: {e}"))?
        .to_bytes();
    conn.abort();
    Ok(Answer {
        status,
        content_type,
        body,
    })
}

/// What the clients got.
#[derive(Default)]
struct Tally {
    statuses: Mutex<BTreeMap<u16, u64>>,
    /// Answers outside the contract, or requests that failed on the HTTP side.
    bad: Mutex<Vec<String>>,
    hung: AtomicU64,
    slowest: Mutex<Duration>,
}

impl Tally {
    fn record(&self, answer: Result<Answer, String>) {
        let answer = match answer {
            Ok(answer) => answer,
            Err(error) => return self.bad.lock().unwrap().push(error),
        };
        let status = answer.status.as_u16();
        *self.statuses.lock().unwrap().entry(status).or_default() += 1;
        let slug = match status {
            200..=299 => return,
            409 | 423 => "lock-busy",
            503 => "store-unavailable",
            _ => "",
        };
        if !is_problem(&answer, slug) {
            let body = String::from_utf8_lossy(&answer.body).into_owned();
            let what = format!("{status} {:?} {body}", answer.content_type);
            self.bad.lock().unwrap().push(what);
        }
    }
}

/// Whether `answer` is an RFC 9457 problem document of type `slug` with its status.
fn is_problem(answer: &Answer, slug: &str) -> bool {
    let Ok(json) = serde_json::from_slice::<serde_json::Value>(&answer.body) else {
        return false;
    };
    !slug.is_empty()
        && answer.content_type.as_deref() == Some("application/problem+json")
        && json["status"] == answer.status.as_u16()
        && json["type"] == format!("urn:lockwarden:problem:{slug}")
}

/// Sends requests for the keys to both replicas in turn until `stop`.
async fn client(replicas: [SocketAddr; 2], tally: Arc<Tally>, seed: usize, stop: Instant) {
    for round in seed + 1..=seed + MAX_ROUNDS {
        if Instant::now() >= stop {
            break;
        }
        let addr = replicas[round % 2];
        let key = format!("k{}", (round / 2 + seed) % KEYS);
        let sent = Instant::now();
        match tokio::time::timeout(ANSWER_BOUND, post_key(addr, &key)).await {
            Ok(answer) => {
                let mut slowest = tally.slowest.lock().unwrap();
                *slowest = sent.elapsed().max(*slowest);
                drop(slowest);
                tally.record(answer);
            }
            Err(_) => {
                tally.hung.fetch_add(1, Ordering::SeqCst);
            }
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_chaos_answers_within_the_contract_and_no_handler_overlaps_unknowingly() {
    let reports = LayerReports::default();
    let only_ours = tracing_subscriber::filter::filter_fn(|meta| {
        meta.target().starts_with("lockwarden") || meta.target().starts_with("http_chaos")
    });
    tracing::subscriber::set_global_default(
        tracing_subscriber::registry().with(reports.clone().with_filter(only_ours)),
    )
    .expect("the only subscriber");

    let server = RedisServer::start().expect("start redis-server");
    let proxy = Arc::new(FaultProxy::start(server.port()).expect("start the proxy"));
    let settings = |b: lockwarden::LockClientBuilder| {
        b.watchdog_timeout(LEASE).command_timeout(COMMAND_TIMEOUT)
    };
    let witness = Arc::new(Witness::default());
    let replicas = [
        replica(
            connect_with(&proxy.url(), settings).await,
            &witness,
            StatusCode::CONFLICT,
        )
        .await,
        replica(
            connect_with(&server.url(), settings).await,
            &witness,
            StatusCode::LOCKED,
        )
        .await,
    ];
    let tally = Arc::new(Tally::default());
    let started = Instant::now();
    let stop = started + CHAOS;

    let mut clients = tokio::task::JoinSet::new();
    for seed in 0..CLIENTS {
        clients.spawn(client(replicas, tally.clone(), seed, stop));
    }
    // Injects one fault after another until `stop`, and restarts the server twice, each
    // time while a handler is inside a long hold, so the restart takes it over.
    let faults = ChaosRun {
        stop,
        restarts_at: &RESTARTS,
        command_timeout: COMMAND_TIMEOUT,
        lease: LEASE,
    };
    let ready = witness.clone();
    let (restarts, server) = faults
        .run(
            proxy.clone(),
            server,
            move || ready.long.load(Ordering::SeqCst) > 0,
            || {},
        )
        .await;
    while let Some(done) = clients.join_next().await {
        done.expect("a client panicked");
    }
    let took = started.elapsed();

    let reported_by_layer = reports.0.lock().unwrap().clone();
    let (mut told, mut by_layer, mut silent) = (0, 0, 0);
    let handled = std::mem::take(&mut *witness.handled.lock().unwrap());
    for entry in handled.iter().filter(|entry| entry.taken_over) {
        if entry.told {
            told += 1;
        } else if reported_by_layer.contains(&entry.id) {
            by_layer += 1;
        } else {
            silent += 1;
            eprintln!("handler {} was taken over and never told", entry.id);
        }
    }
    let takeovers = witness.takeovers.load(Ordering::SeqCst);
    let tokens_back = witness.tokens_back.load(Ordering::SeqCst);
    let statuses = tally.statuses.lock().unwrap().clone();
    let bad = tally.bad.lock().unwrap().clone();
    let hung = tally.hung.load(Ordering::SeqCst);
    let slowest = *tally.slowest.lock().unwrap();
    eprintln!(
        "http chaos: {restarts} restarts, {} handled, answers {statuses:?}, {} bad, {hung} \
         hung (slowest answer {slowest:?}), {takeovers} takeovers: {told} told in the handler, {by_layer} reported by \
         the layer, {silent} silent; {tokens_back} tokens back; {took:?}",
        handled.len(),
        bad.len(),
    );
    // The violations first, then whether the run did enough to find them.
    assert_eq!(
        silent, 0,
        "handlers beside another of their key, never told"
    );
    assert_eq!(tokens_back, 0, "fencing tokens went backwards");
    assert!(bad.is_empty(), "answers outside the contract: {bad:?}");
    assert_eq!(hung, 0, "answers slower than {ANSWER_BOUND:?}");
    assert_eq!(restarts, 2);
    let count = |range: std::ops::RangeInclusive<u16>| -> u64 {
        statuses
            .iter()
            .filter(|(status, _)| range.contains(status))
            .map(|(_, n)| n)
            .sum()
    };
    assert!(count(200..=299) > 50, "few requests handled: {statuses:?}");
    assert!(count(409..=409) > 0 && count(423..=423) > 0, "{statuses:?}");
    assert!(
        count(503..=503) > 0,
        "the faults made the store unavailable"
    );
    assert!(takeovers > 0, "the faults took keys over");
    // Whatever the faults left (lost replies, unreleased holds) is settled or runs out.
    eventually(
        LEASE + Duration::from_secs(2),
        "no lock key left",
        || async {
            server
                .keys_matching("lockwarden:*")
                .iter()
                .all(|key| key.ends_with(":fence"))
        },
    )
    .await;
}
