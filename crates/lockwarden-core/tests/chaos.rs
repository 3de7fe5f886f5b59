//! A chaos run: plain, fair and read-write locks and claims under load from three
//! clients, two of them behind the testkit's `FaultProxy`, while the proxy injects latency
//! spikes (up to twice the command timeout), lost replies, blackholes longer than the
//! lease and connection resets, and Redis is restarted twice (losing every lock and every
//! stored claim outcome at once).
//!
//! Mutual exclusion cannot survive a lost lock; what must hold is that nobody *believes*
//! they hold a lock someone else has taken. An in-process witness records who is inside
//! each lock. Checked:
//! - every holder whose lock was taken over while it was inside reported it (`is_lost()`
//!   before its release, or a release that failed) — 0 silent violations;
//! - fencing tokens of each exclusive lock never go backwards, restarts included;
//! - a claim's work, once completed, is not done again by a later claimant (which must
//!   get the stored outcome instead), unless a restart lost that outcome or its completer
//!   was taken over (both counted); every replayed outcome is one a holder of that key
//!   tried to store;
//! - once the faults end, no lock key is left behind (only fencing keys and claim
//!   outcomes, which expire);
//! - the run did real work (acquisitions of every kind, takeovers by the restarts).

mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::connect_with;
use lockwarden_core::{Claim, LockClient, LockError, LockGuard};
use lockwarden_testkit::{ChaosRun, FaultProxy, RedisServer};

const LEASE: Duration = Duration::from_millis(1500);
const COMMAND_TIMEOUT: Duration = Duration::from_millis(300);
/// How long faults are injected; the workers stop with them.
const CHAOS: Duration = Duration::from_secs(24);
const KEYS: usize = 3;
const WORKERS_PER_KIND: usize = 3;
/// When Redis is restarted: at set times, not fault steps, which a loaded machine slows.
const RESTARTS: [Duration; 2] = [Duration::from_secs(8), Duration::from_secs(16)];
/// A bound on each worker's rounds besides `CHAOS`; a normal run stays far below it.
const MAX_ROUNDS: usize = 5000;
/// Outlives the run, so only a restart can make an outcome vanish; the keys expire after.
const OUTCOME_KEEP: Duration = Duration::from_secs(60);
/// Claims move to a new key this often, so claimants wait on a key held long and each
/// key sees a completion; one claim in three goes back to one of the last few keys.
const CLAIM_PERIOD: Duration = Duration::from_millis(500);

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Kind {
    Plain,
    Fair,
    Read,
    Write,
    Claim,
}

impl Kind {
    const LOCKS: [Kind; 4] = [Kind::Plain, Kind::Fair, Kind::Read, Kind::Write];

    /// The lock's name: readers and writers share one read-write lock.
    fn name(self, key: usize) -> String {
        match self {
            Kind::Plain => format!("plain-{key}"),
            Kind::Claim => format!("claim-{key}"),
            Kind::Fair => format!("fair-{key}"),
            Kind::Read | Kind::Write => format!("rw-{key}"),
        }
    }

    async fn try_acquire(self, client: &LockClient, name: &str) -> Result<LockGuard, LockError> {
        let wait = Duration::from_millis(400);
        match self {
            // A claim's lock is a plain lock; claimants use `try_claim` (see `claimer`).
            Kind::Plain | Kind::Claim => client.try_acquire(name, wait).await,
            Kind::Fair => client.fair_lock(name).try_acquire(wait).await,
            Kind::Read => client.rw_lock(name).read().try_acquire(wait).await,
            Kind::Write => client.rw_lock(name).write().try_acquire(wait).await,
        }
    }
}

/// Someone inside a lock, as the witness knows them.
struct Inside {
    id: u64,
    kind: Kind,
    shared: bool,
    taken_over: Arc<AtomicBool>,
}

/// A claim key's history, as the witness knows it.
#[derive(Default)]
struct ClaimRecord {
    /// The outcomes holders tried to store (each holder's entry id).
    tried: Vec<u64>,
    /// The last completion Redis confirmed.
    completed: Option<Completion>,
}

struct Completion {
    token: u64,
    /// The restarts begun before the completion was sent.
    restarts: u64,
    taken_over: Arc<AtomicBool>,
}

/// Who is inside each lock, and what the run found.
#[derive(Default)]
struct Witness {
    inside: Mutex<HashMap<String, Vec<Inside>>>,
    last_token: Mutex<HashMap<String, u64>>,
    next_id: AtomicU64,
    acquired: Mutex<HashMap<Kind, u64>>,
    /// By the kind of the holder taken over.
    takeovers: Mutex<HashMap<Kind, u64>>,
    reported: AtomicU64,
    silent: AtomicU64,
    tokens_back: AtomicU64,
    /// Bumped by the injector before each restart.
    restarts: AtomicU64,
    /// Claim holders inside a long hold now.
    long_claims: AtomicU64,
    claims: Mutex<HashMap<String, ClaimRecord>>,
    completed: AtomicU64,
    replays: AtomicU64,
    /// Replays of bytes no holder of the key tried to store.
    bad_replays: AtomicU64,
    redone_after_restart: AtomicU64,
    redone_after_loss: AtomicU64,
    /// Work done again after a confirmed completion nothing excuses.
    redone: AtomicU64,
}

impl Witness {
    /// Records `kind`'s entry into `name` with `token`; whoever is inside and excluded
    /// by it is marked taken over. Returns the entry's id and its taken-over flag.
    fn enter(&self, kind: Kind, name: &str, token: u64) -> (u64, Arc<AtomicBool>) {
        let id = self.next_id.fetch_add(1, Ordering::SeqCst);
        let shared = kind == Kind::Read;
        let taken_over = Arc::new(AtomicBool::new(false));
        let mut inside = self.inside.lock().unwrap();
        let here = inside.entry(name.to_owned()).or_default();
        for other in here.iter().filter(|other| !(shared && other.shared)) {
            if !other.taken_over.swap(true, Ordering::SeqCst) {
                *self
                    .takeovers
                    .lock()
                    .unwrap()
                    .entry(other.kind)
                    .or_default() += 1;
            }
        }
        here.push(Inside {
            id,
            kind,
            shared,
            taken_over: taken_over.clone(),
        });
        if !shared {
            let mut last = self.last_token.lock().unwrap();
            let previous = last.insert(name.to_owned(), token).unwrap_or(0);
            if token <= previous {
                self.tokens_back.fetch_add(1, Ordering::SeqCst);
            }
        }
        *self.acquired.lock().unwrap().entry(kind).or_default() += 1;
        (id, taken_over)
    }

    fn leave(&self, name: &str, id: u64) {
        let mut inside = self.inside.lock().unwrap();
        if let Some(here) = inside.get_mut(name) {
            here.retain(|entry| entry.id != id);
        }
    }

    /// A claimant got the lock of `name` with `token`: the work is about to be done. If a
    /// completion with an older token was confirmed, its outcome should have answered
    /// this claim instead.
    fn claim_won(&self, name: &str, token: u64) {
        let claims = self.claims.lock().unwrap();
        let Some(done) = claims.get(name).and_then(|c| c.completed.as_ref()) else {
            return;
        };
        if token <= done.token {
            return; // taken before that completion: a stale hold, not a redo
        }
        if self.restarts.load(Ordering::SeqCst) > done.restarts {
            self.redone_after_restart.fetch_add(1, Ordering::SeqCst);
        } else if done.taken_over.load(Ordering::SeqCst) {
            self.redone_after_loss.fetch_add(1, Ordering::SeqCst);
        } else {
            self.redone.fetch_add(1, Ordering::SeqCst);
            eprintln!(
                "{name}: claimed with token {token} after a completion with {}",
                done.token
            );
        }
    }

    /// Entry `id` is about to store its outcome for `name`.
    fn claim_tried(&self, name: &str, id: u64) {
        let mut claims = self.claims.lock().unwrap();
        claims.entry(name.to_owned()).or_default().tried.push(id);
    }

    /// Redis confirmed a completion of `name` sent after `restarts` restarts had begun.
    fn claim_completed(&self, name: &str, token: u64, restarts: u64, taken_over: Arc<AtomicBool>) {
        self.completed.fetch_add(1, Ordering::SeqCst);
        let mut claims = self.claims.lock().unwrap();
        claims.entry(name.to_owned()).or_default().completed = Some(Completion {
            token,
            restarts,
            taken_over,
        });
    }

    /// A claim of `name` was answered with `outcome`.
    fn claim_replayed(&self, name: &str, outcome: &[u8]) {
        self.replays.fetch_add(1, Ordering::SeqCst);
        let id = std::str::from_utf8(outcome)
            .ok()
            .and_then(|s| s.parse().ok());
        let claims = self.claims.lock().unwrap();
        let tried = claims.get(name).map_or(&[][..], |c| &c.tried[..]);
        if !id.is_some_and(|id| tried.contains(&id)) {
            self.bad_replays.fetch_add(1, Ordering::SeqCst);
            eprintln!("{name}: replayed {outcome:?}, which no holder of it stored");
        }
    }

    /// A holder of `kind` left `name` and then released it (`released_ok`): counts a
    /// takeover it reported, or one it did not.
    fn released(
        &self,
        kind: Kind,
        name: &str,
        taken_over: &AtomicBool,
        lost_before: bool,
        released_ok: bool,
    ) {
        if !taken_over.load(Ordering::SeqCst) {
            return;
        }
        if lost_before || !released_ok {
            self.reported.fetch_add(1, Ordering::SeqCst);
        } else {
            self.silent.fetch_add(1, Ordering::SeqCst);
            eprintln!("{kind:?} {name}: taken over, yet released as held");
        }
    }
}

/// Mostly a few milliseconds; one hold in `every` lasts `long`, so faults and restarts
/// catch holders inside.
fn work(round: usize, every: usize, long: Duration) -> Duration {
    if round.is_multiple_of(every) {
        long
    } else {
        Duration::from_millis(2 + (round % 5) as u64 * 3)
    }
}

/// Takes and releases locks of `kind` until `stop`.
async fn worker(client: LockClient, witness: Arc<Witness>, kind: Kind, seed: usize, stop: Instant) {
    for round in seed + 1..=seed + MAX_ROUNDS {
        if Instant::now() >= stop {
            break;
        }
        let name = kind.name(round % KEYS);
        let Ok(guard) = kind.try_acquire(&client, &name).await else {
            continue; // busy, or the store failed: both are expected here
        };
        let (id, taken_over) = witness.enter(kind, &name, guard.fencing_token());
        tokio::time::sleep(work(round, 8, Duration::from_millis(1200))).await;
        witness.leave(&name, id);
        let lost_before = guard.is_lost();
        let released = guard.release().await;
        witness.released(kind, &name, &taken_over, lost_before, released.is_ok());
    }
}

/// Claims work until `stop`: does it (inside the witness) and completes it with its
/// entry id as the outcome, or takes the stored outcome.
async fn claimer(client: LockClient, witness: Arc<Witness>, seed: usize, stop: Instant) {
    let started = Instant::now();
    let mut won = seed;
    for round in seed + 1..=seed + MAX_ROUNDS {
        if Instant::now() >= stop {
            break;
        }
        let period = (started.elapsed().as_millis() / CLAIM_PERIOD.as_millis()) as usize;
        let key = if round.is_multiple_of(3) {
            period.saturating_sub(round % 5)
        } else {
            period
        };
        let name = Kind::Claim.name(key);
        let guard = match claim(&client, &name, stop).await {
            Some(Claim::Acquired(guard)) => guard,
            Some(Claim::Completed(outcome)) => {
                witness.claim_replayed(&name, &outcome);
                // A replay costs one round trip: pace them, as a client retrying would.
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
            None => break,
        };
        let token = guard.fencing_token();
        let (id, taken_over) = witness.enter(Kind::Claim, &name, token);
        witness.claim_won(&name, token);
        // Most claims are replays, so a third of the holds are long; outlasting a
        // blackhole's lease lets the direct client's claimant, waiting for this key, take
        // it over.
        won += 1;
        let work = work(won, 3, 2 * LEASE);
        let long = work == 2 * LEASE;
        witness
            .long_claims
            .fetch_add(u64::from(long), Ordering::SeqCst);
        tokio::time::sleep(work).await;
        witness
            .long_claims
            .fetch_sub(u64::from(long), Ordering::SeqCst);
        witness.leave(&name, id);
        let lost_before = guard.is_lost();
        witness.claim_tried(&name, id);
        // Read before sending: a restart during the call may lose what it stores.
        let restarts = witness.restarts.load(Ordering::SeqCst);
        let completed = guard.complete(id.to_string(), OUTCOME_KEEP).await;
        if completed.is_ok() {
            witness.claim_completed(&name, token, restarts, taken_over.clone());
        }
        witness.released(
            Kind::Claim,
            &name,
            &taken_over,
            lost_before,
            completed.is_ok(),
        );
    }
}

/// Claims `name` until it gets the lock or the outcome, as a claimant whose work must
/// be done does: a busy claim or a failed store is tried again. `None` at `stop`.
async fn claim(client: &LockClient, name: &str, stop: Instant) -> Option<Claim> {
    for _ in 0..MAX_ROUNDS {
        if Instant::now() >= stop {
            break;
        }
        match client
            .lock(name)
            .try_claim(Duration::from_millis(400))
            .await
        {
            Ok(claim) => return Some(claim),
            Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    }
    None
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chaos_leaves_no_silent_violation_no_token_going_back_and_no_key_behind() {
    let server = RedisServer::start().expect("start redis-server");
    let proxy = Arc::new(FaultProxy::start(server.port()).expect("start the proxy"));
    let settings = |b: lockwarden_core::LockClientBuilder| {
        b.watchdog_timeout(LEASE).command_timeout(COMMAND_TIMEOUT)
    };
    let clients = [
        connect_with(&proxy.url(), settings).await,
        connect_with(&proxy.url(), settings).await,
        connect_with(&server.url(), settings).await,
    ];
    let witness = Arc::new(Witness::default());
    let stop = Instant::now() + CHAOS;

    let mut workers = tokio::task::JoinSet::new();
    for kind in Kind::LOCKS {
        for seed in 0..WORKERS_PER_KIND {
            let client = clients[seed % clients.len()].clone();
            workers.spawn(worker(client, witness.clone(), kind, seed, stop));
        }
    }
    for seed in 0..WORKERS_PER_KIND {
        let client = clients[seed % clients.len()].clone();
        workers.spawn(claimer(client, witness.clone(), seed, stop));
    }
    // Injects one fault after another until `stop`, and restarts the server twice, each
    // time with a claim held long, so its waiting claimants take it over.
    let faults = ChaosRun {
        stop,
        restarts_at: &RESTARTS,
        command_timeout: COMMAND_TIMEOUT,
        lease: LEASE,
    };
    let (ready, restarting) = (witness.clone(), witness.clone());
    let (restarts, server) = faults
        .run(
            proxy.clone(),
            server,
            move || ready.long_claims.load(Ordering::SeqCst) > 0,
            move || {
                restarting.restarts.fetch_add(1, Ordering::SeqCst);
            },
        )
        .await;
    while let Some(done) = workers.join_next().await {
        done.expect("a worker panicked");
    }

    let acquired = witness.acquired.lock().unwrap().clone();
    let takeovers = witness.takeovers.lock().unwrap().clone();
    let reported = witness.reported.load(Ordering::SeqCst);
    let silent = witness.silent.load(Ordering::SeqCst);
    let tokens_back = witness.tokens_back.load(Ordering::SeqCst);
    let count = |n: &AtomicU64| n.load(Ordering::SeqCst);
    let (completed, replays, bad_replays) = (
        count(&witness.completed),
        count(&witness.replays),
        count(&witness.bad_replays),
    );
    let (redone, after_restart, after_loss) = (
        count(&witness.redone),
        count(&witness.redone_after_restart),
        count(&witness.redone_after_loss),
    );
    eprintln!(
        "chaos: {restarts} restarts, acquired {acquired:?}, takeovers {takeovers:?}, \
         {reported} reported, {silent} silent, {tokens_back} tokens back; claims: \
         {completed} completed, {replays} replays ({bad_replays} bad), redone \
         {after_restart} after a restart, {after_loss} after a loss, {redone} otherwise"
    );
    // The violations first, then whether the run did enough to find them.
    assert_eq!(
        silent, 0,
        "holders that never learned their lock was taken over"
    );
    assert_eq!(tokens_back, 0, "fencing tokens went backwards");
    assert_eq!(redone, 0, "claimed work done again after its completion");
    assert_eq!(bad_replays, 0, "replayed outcomes nobody stored");
    assert_eq!(restarts, 2);
    for kind in Kind::LOCKS.into_iter().chain([Kind::Claim]) {
        assert!(
            acquired.get(&kind).copied().unwrap_or(0) > 10,
            "{kind:?} did little: {acquired:?}"
        );
    }
    assert!(completed > 10 && replays > 10, "claims did little");
    assert!(!takeovers.is_empty(), "the faults took locks over");
    assert!(
        takeovers.contains_key(&Kind::Claim),
        "the restarts, timed for it, took claims over"
    );
    // Whatever the faults left (lost replies, unreleased holds) is settled or runs out.
    // Fencing keys expire with their lock's lease, outcomes after their keep time.
    let left = || {
        let keys = server.keys_matching("lockwarden:*");
        let locks = keys.into_iter();
        let locks = locks.filter(|key| !key.ends_with(":fence") && !key.ends_with(":done"));
        locks
            .map(|key| (server.pttl(&key), key))
            .collect::<Vec<_>>()
    };
    let until = Instant::now() + LEASE + Duration::from_secs(2);
    while !left().is_empty() && Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(left(), vec![], "lock keys left (PTTL ms, key)");
    for key in server.keys_matching("lockwarden:*:done") {
        let ttl = server.pttl(&key);
        assert!(
            ttl > 0 && ttl <= OUTCOME_KEEP.as_millis() as i64,
            "{key}: PTTL {ttl}"
        );
    }
}
