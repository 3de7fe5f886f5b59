//! The soak (`--soak [SECONDS]`, default 600; not one of the numbered workloads): every
//! lock kind at once, from 16 tasks over 4 clients, on 256 keys for the whole run, to show
//! that nothing grows with time and nothing breaks under a long mixed load.
//!
//! Client RSS and open fds, Redis connections, subscriptions, keys and memory are sampled
//! after a warm-up (under load), every 30 s, and at the end once every task has stopped,
//! the background releases are through and the lock keys have expired. The end may not
//! exceed the start (RSS and Redis memory: 1.5 × + 8 MiB), no subscription and no key of
//! the soak may be left, and closing the clients must give back every connection. Each
//! key has an in-process witness: one exclusive holder or any number of readers inside,
//! fencing tokens that never go back; any overlap is a violation.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use lockwarden_core::{Claim, LockClient, LockError, LockGuard};
use tokio::task::JoinSet;

use crate::baselines::BoxError;
use crate::check::Checks;
use crate::stats::{Report, Row};
use crate::workloads::{join_all, rss_bytes, Ctx};

const NAME: &str = "soak";
const CLIENTS: usize = 4;
const TASKS: usize = 16;
/// Every key of the soak starts with this (the lock names start with `soak:`).
const KEYS_PATTERN: &str = "lockwarden:{soak:*";
/// Half the picks of a key set go to its first `HOT` keys, so that locks are contended.
const HOT: usize = 8;
/// The watchdog timeout of the clients and the fixed lease: short, so the keys a
/// released lock leaves (its fencing key) expire soon after the run.
const LEASE: Duration = Duration::from_secs(5);
/// The wait budget of an ordinary acquire; running out of it is contention, not failure.
const WAIT: Duration = Duration::from_secs(2);
/// The wait budget of the waiters meant to time out.
const SHORT_WAIT: Duration = Duration::from_millis(20);
/// How long a completed claim's outcome is kept.
const KEEP: Duration = Duration::from_secs(1);
const WARM_UP: Duration = Duration::from_secs(10);
const SAMPLE_EVERY: Duration = Duration::from_secs(30);
const MAX_CYCLES_PER_TASK: u64 = 20_000_000;
const MIB: f64 = 1024.0 * 1024.0;

/// What one cycle does. The weights (out of 100) give the mix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Watchdog,
    Leased,
    Reentry,
    Busy,
    WaiterTimeout,
    Dropped,
    Fair,
    FairTimeout,
    Read,
    Write,
    Claim,
    Multi,
}

impl Kind {
    const ALL: [Kind; 12] = [
        Kind::Watchdog,
        Kind::Leased,
        Kind::Reentry,
        Kind::Busy,
        Kind::WaiterTimeout,
        Kind::Dropped,
        Kind::Fair,
        Kind::FairTimeout,
        Kind::Read,
        Kind::Write,
        Kind::Claim,
        Kind::Multi,
    ];

    fn weight(self) -> usize {
        match self {
            Kind::Watchdog | Kind::Fair | Kind::Read | Kind::Claim => 12,
            Kind::Leased | Kind::Reentry | Kind::Dropped | Kind::Multi => 8,
            Kind::Busy | Kind::Write => 7,
            Kind::WaiterTimeout | Kind::FairTimeout => 4,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Kind::Watchdog => "lock (watchdog)",
            Kind::Leased => "lock (5 s lease)",
            Kind::Reentry => "lock re-entered by its holder",
            Kind::Busy => "try_acquire(0) of a held lock",
            Kind::WaiterTimeout => "waiter timing out (20 ms)",
            Kind::Dropped => "guard dropped (background release)",
            Kind::Fair => "fair_lock",
            Kind::FairTimeout => "fair waiter timing out (20 ms)",
            Kind::Read => "rw_lock read",
            Kind::Write => "rw_lock write",
            Kind::Claim => "claim (try_claim + complete)",
            Kind::Multi => "multi_lock (2-3 keys)",
        }
    }

    fn pick(rng: &mut Rng) -> Kind {
        let mut r = rng.below(100);
        for kind in Kind::ALL {
            if r < kind.weight() {
                return kind;
            }
            r -= kind.weight();
        }
        Kind::Watchdog
    }
}

/// splitmix64: a cheap per-task stream of picks.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// Counters per kind (indexed by `Kind as usize`) and of the checks.
#[derive(Default)]
struct Counts {
    done: [AtomicU64; 12],
    /// The wait budget ran out on a contended lock (not a failure).
    timed_out: [AtomicU64; 12],
    errors: [AtomicU64; 12],
    outcomes_found: AtomicU64,
    lost: AtomicU64,
    violations: AtomicU64,
}

impl Counts {
    fn get(counters: &[AtomicU64; 12], kind: Kind) -> u64 {
        counters[kind as usize].load(Ordering::Relaxed)
    }

    fn add(counters: &[AtomicU64; 12], kind: Kind) {
        counters[kind as usize].fetch_add(1, Ordering::Relaxed);
    }
}

/// Reports a broken exclusion or fencing promise, counted apart from other problems.
struct Violations<'a> {
    checks: &'a Checks,
    count: &'a AtomicU64,
}

impl Violations<'_> {
    fn report(&self, message: String) {
        self.count.fetch_add(1, Ordering::SeqCst);
        self.checks.problem(format!("{NAME}: {message}"));
    }
}

/// One key's witness: who is inside by our own account. Entered right after an acquire
/// returns and left right before the release is sent, so it is inside the time the lock
/// is held: two holders inside at once means the lock let them both in.
struct Witness {
    name: String,
    inside: Mutex<Inside>,
}

#[derive(Default)]
struct Inside {
    /// The marker of the cycle holding the key exclusively.
    holder: Option<u64>,
    readers: u32,
    /// The highest fencing token seen on the key.
    last_token: u64,
}

impl Witness {
    fn state(&self) -> MutexGuard<'_, Inside> {
        self.inside.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// An exclusive holder (plain, fair, write, claim, one key of a multi-lock) enters:
    /// nobody may be inside, and its token must be new.
    fn enter(&self, marker: u64, token: u64, v: &Violations<'_>) {
        let mut s = self.state();
        if s.holder.is_some() || s.readers > 0 {
            v.report(format!(
                "mutual exclusion violated on `{}`: entered while {} inside",
                self.name,
                if s.readers > 0 {
                    "readers were"
                } else {
                    "a holder was"
                }
            ));
        }
        if token <= s.last_token {
            v.report(format!(
                "fencing token did not increase on `{}`: {token} after {}",
                self.name, s.last_token
            ));
        }
        s.last_token = s.last_token.max(token);
        s.holder = Some(marker);
    }

    fn exit(&self, marker: u64, v: &Violations<'_>) {
        let mut s = self.state();
        if s.holder != Some(marker) {
            v.report(format!(
                "mutual exclusion violated on `{}`: left while another holder or nobody was inside",
                self.name
            ));
        }
        s.holder = None;
    }

    /// A reader enters: no exclusive holder may be inside; its token starts a read phase
    /// (new) or joins the current one (the last token seen), never an older one.
    fn enter_read(&self, token: u64, v: &Violations<'_>) {
        let mut s = self.state();
        if s.holder.is_some() {
            v.report(format!(
                "read-write exclusion violated on `{}`: a reader entered while the writer was inside",
                self.name
            ));
        }
        if token < s.last_token {
            v.report(format!(
                "read token went back on `{}`: {token} after {}",
                self.name, s.last_token
            ));
        }
        s.last_token = s.last_token.max(token);
        s.readers += 1;
    }

    fn exit_read(&self, v: &Violations<'_>) {
        let mut s = self.state();
        match s.readers.checked_sub(1) {
            Some(left) => s.readers = left,
            None => v.report(format!(
                "read-write exclusion violated on `{}`: a reader left while no reader was inside",
                self.name
            )),
        }
    }

    fn last_token(&self) -> u64 {
        self.state().last_token
    }
}

/// The keys of one lock family: a name is only ever used by one family.
struct KeySet {
    witnesses: Vec<Witness>,
    index: HashMap<String, usize>,
}

impl KeySet {
    fn new(prefix: &str, len: usize) -> Self {
        let witnesses: Vec<Witness> = (0..len)
            .map(|i| Witness {
                name: format!("{prefix}{i}"),
                inside: Mutex::default(),
            })
            .collect();
        let index = witnesses
            .iter()
            .enumerate()
            .map(|(i, w)| (w.name.clone(), i))
            .collect();
        Self { witnesses, index }
    }

    fn pick(&self, rng: &mut Rng) -> usize {
        if rng.below(2) == 0 {
            rng.below(HOT.min(self.witnesses.len()))
        } else {
            rng.below(self.witnesses.len())
        }
    }

    fn name(&self, k: usize) -> &str {
        &self.witnesses[k].name
    }
}

struct Shared {
    /// Plain locks, also taken two or three at a time by the multi-locks.
    plain: KeySet,
    fair: KeySet,
    rw: KeySet,
    claims: KeySet,
    counts: Counts,
    checks: Arc<Checks>,
    markers: AtomicU64,
}

impl Shared {
    fn violations(&self) -> Violations<'_> {
        Violations {
            checks: &self.checks,
            count: &self.counts.violations,
        }
    }
}

/// One soak task: a client to lock with and another one to stand in the way.
struct Task {
    client: LockClient,
    other: LockClient,
    rng: Rng,
    s: Arc<Shared>,
}

pub async fn run(ctx: &Ctx, report: &mut Report, run: Duration) -> Result<(), BoxError> {
    let warm_up = WARM_UP.min(run / 6);
    let before = sample(ctx, &[], Duration::ZERO)?;
    let mut clients = Vec::with_capacity(CLIENTS);
    for _ in 0..CLIENTS {
        clients.push(
            LockClient::builder()
                .watchdog_timeout(LEASE)
                .connect(&ctx.url)
                .await?,
        );
    }
    let shared = Arc::new(Shared {
        plain: KeySet::new("soak:plain:", 128),
        fair: KeySet::new("soak:fair:", 32),
        rw: KeySet::new("soak:rw:", 48),
        claims: KeySet::new("soak:claim:", 48),
        counts: Counts::default(),
        checks: ctx.checks.clone(),
        markers: AtomicU64::new(1),
    });
    let problems_before = ctx.checks.count();

    let started = Instant::now();
    let deadline = started + run;
    let mut set = JoinSet::new();
    for id in 0..TASKS {
        let task = Task {
            client: clients[id % CLIENTS].clone(),
            other: clients[(id + 1) % CLIENTS].clone(),
            rng: Rng(0x5EED_0000 + id as u64),
            s: shared.clone(),
        };
        set.spawn(task.run(deadline));
    }

    // Samples: the first after the warm-up, then every 30 s until the end of the load.
    let mut series = Vec::new();
    let mut next = started + warm_up;
    while next < deadline {
        tokio::time::sleep_until(next.into()).await;
        let s = sample(ctx, &clients, started.elapsed())?;
        let done: u64 = Kind::ALL
            .iter()
            .map(|&k| Counts::get(&shared.counts.done, k))
            .sum();
        eprintln!(
            "  {:>4} s: {done} cycles, RSS {:.1} MiB, {} fds, {} connections, {} channels, {} keys",
            s.at.as_secs(),
            s.rss as f64 / MIB,
            s.fds,
            s.connections,
            s.channels,
            s.keys
        );
        series.push(s);
        next += SAMPLE_EVERY;
    }
    let cycles: u64 = join_all(set, run + Duration::from_secs(60))
        .await?
        .into_iter()
        .sum();
    let elapsed = started.elapsed();
    let Some(&start) = series.first() else {
        return Err("the soak ended before its first sample".into());
    };

    let drained = drain(ctx, &clients).await?;
    let end = sample(ctx, &clients, started.elapsed())?;
    drop(clients);
    let closed = closed_connections(ctx, before.connections).await?;

    let violations = shared.counts.violations.load(Ordering::SeqCst);
    let lost = shared.counts.lost.load(Ordering::SeqCst);
    push_cycles(report, &shared.counts, cycles, elapsed);
    report.push(
        Row::new(NAME, IMPL, "exclusion and fencing violations", "")
            .value(violations as f64)
            .note(format!(
                "must be 0; {} problems of any kind during the soak",
                ctx.checks.count() - problems_before
            )),
    );
    report.push(
        Row::new(NAME, IMPL, "locks lost", "")
            .value(lost as f64)
            .note("must be 0: is_lost() at release, or release() answering Lost/NotHeld"),
    );
    push_resources(ctx, report, &before, &start, &end, &series, drained, closed);
    Ok(())
}

const IMPL: &str = "lockwarden, 16 tasks over 4 clients";

impl Task {
    async fn run(mut self, deadline: Instant) -> Result<u64, BoxError> {
        let s = self.s.clone();
        let counts = &s.counts;
        let mut cycles = 0;
        while cycles < MAX_CYCLES_PER_TASK && Instant::now() < deadline {
            let kind = Kind::pick(&mut self.rng);
            match self.cycle(kind).await {
                Ok(()) => Counts::add(&counts.done, kind),
                Err(LockError::Timeout { .. }) => Counts::add(&counts.timed_out, kind),
                Err(e) => {
                    Counts::add(&counts.errors, kind);
                    s.checks
                        .problem(format!("{NAME}: {} failed: {e}", kind.name()));
                }
            }
            cycles += 1;
        }
        Ok(cycles)
    }

    /// One cycle of `kind`. `Err(Timeout)` is the first acquire's wait running out.
    async fn cycle(&mut self, kind: Kind) -> Result<(), LockError> {
        let s = self.s.clone();
        match kind {
            Kind::Watchdog | Kind::Leased | Kind::Busy | Kind::WaiterTimeout | Kind::Dropped => {
                let k = s.plain.pick(&mut self.rng);
                let lock = self.client.lock(s.plain.name(k));
                let lock = match kind {
                    Kind::Leased => lock.lease(LEASE),
                    _ => lock,
                };
                let guard = lock.try_acquire(WAIT).await?;
                let marker = self.enter(&s.plain, k, &guard);
                let probed = match kind {
                    Kind::Busy => self.probe(&s.plain, k, Duration::ZERO, false).await,
                    Kind::WaiterTimeout => self.probe(&s.plain, k, SHORT_WAIT, false).await,
                    _ => {
                        self.work().await;
                        Ok(())
                    }
                };
                s.plain.witnesses[k].exit(marker, &s.violations());
                if kind == Kind::Dropped {
                    drop(guard);
                } else {
                    self.release(guard).await;
                }
                probed
            }
            Kind::Reentry => {
                let k = s.plain.pick(&mut self.rng);
                let me = self.client.holder();
                let lock = self.client.lock(s.plain.name(k)).holder(&me);
                let outer = lock.try_acquire(WAIT).await?;
                let marker = self.enter(&s.plain, k, &outer);
                let inside = async {
                    // Its own holder re-enters at once, with the hold's token.
                    let inner = match lock.try_acquire(Duration::ZERO).await {
                        Err(LockError::Timeout { .. }) => {
                            s.checks.problem(format!(
                                "{NAME}: the holder of `{}` could not re-enter it",
                                s.plain.name(k)
                            ));
                            return Ok(());
                        }
                        inner => inner?,
                    };
                    if inner.fencing_token() != outer.fencing_token() {
                        s.checks.problem(format!(
                            "{NAME}: re-entry of `{}` got token {}, its hold has {}",
                            s.plain.name(k),
                            inner.fencing_token(),
                            outer.fencing_token()
                        ));
                    }
                    self.work().await;
                    self.release(inner).await;
                    let count = lock.hold_count(&me).await?;
                    if count != 1 {
                        s.checks.problem(format!(
                            "{NAME}: `{}` held {count} times after leaving a re-entry, not 1",
                            s.plain.name(k)
                        ));
                    }
                    Ok::<_, LockError>(())
                }
                .await;
                s.plain.witnesses[k].exit(marker, &s.violations());
                self.release(outer).await;
                inside
            }
            Kind::Fair | Kind::FairTimeout => {
                let k = s.fair.pick(&mut self.rng);
                let guard = self
                    .client
                    .fair_lock(s.fair.name(k))
                    .try_acquire(WAIT)
                    .await?;
                let marker = self.enter(&s.fair, k, &guard);
                let probed = if kind == Kind::FairTimeout {
                    self.probe(&s.fair, k, SHORT_WAIT, true).await
                } else {
                    self.work().await;
                    Ok(())
                };
                s.fair.witnesses[k].exit(marker, &s.violations());
                self.release(guard).await;
                probed
            }
            Kind::Read => {
                let k = s.rw.pick(&mut self.rng);
                let lock = self.client.rw_lock(s.rw.name(k));
                let guard = lock.read().try_acquire(WAIT).await?;
                let witness = &s.rw.witnesses[k];
                witness.enter_read(guard.fencing_token(), &s.violations());
                self.work().await;
                witness.exit_read(&s.violations());
                self.release(guard).await;
                Ok(())
            }
            Kind::Write => {
                let k = s.rw.pick(&mut self.rng);
                let lock = self.client.rw_lock(s.rw.name(k));
                let guard = lock.write().try_acquire(WAIT).await?;
                let marker = self.enter(&s.rw, k, &guard);
                self.work().await;
                s.rw.witnesses[k].exit(marker, &s.violations());
                self.release(guard).await;
                Ok(())
            }
            Kind::Claim => {
                let k = s.claims.pick(&mut self.rng);
                match self.client.lock(s.claims.name(k)).try_claim(WAIT).await? {
                    Claim::Acquired(guard) => {
                        let marker = self.enter(&s.claims, k, &guard);
                        self.work().await;
                        s.claims.witnesses[k].exit(marker, &s.violations());
                        let (lost, token) = (guard.is_lost(), guard.fencing_token());
                        let completed = guard.complete(token.to_string(), KEEP).await;
                        self.finished(s.claims.name(k), lost, completed);
                    }
                    Claim::Completed(outcome) => {
                        s.counts.outcomes_found.fetch_add(1, Ordering::Relaxed);
                        // The outcome is the token of the holder that did the work: one
                        // this key has seen.
                        let token = String::from_utf8_lossy(&outcome).parse::<u64>().ok();
                        let last = s.claims.witnesses[k].last_token();
                        if !token.is_some_and(|t| t > 0 && t <= last) {
                            s.checks.problem(format!(
                                "{NAME}: claim of `{}` found outcome {:?}, not a token it issued (last {last})",
                                s.claims.name(k),
                                String::from_utf8_lossy(&outcome)
                            ));
                        }
                    }
                }
                Ok(())
            }
            Kind::Multi => {
                let want = 2 + self.rng.below(2);
                let mut picked: Vec<usize> = Vec::with_capacity(want);
                for _ in 0..16 {
                    let k = s.plain.pick(&mut self.rng);
                    if !picked.contains(&k) {
                        picked.push(k);
                    }
                    if picked.len() == want {
                        break;
                    }
                }
                let names = picked.iter().map(|&k| s.plain.name(k).to_owned());
                let held = self.client.multi_lock(names).try_acquire(WAIT).await?;
                let mut inside = Vec::with_capacity(held.guards().len());
                for guard in held.guards() {
                    match s.plain.index.get(guard.key().name()) {
                        Some(&k) => inside.push((k, self.enter(&s.plain, k, guard))),
                        None => s.checks.problem(format!(
                            "{NAME}: multi_lock returned a guard of `{}`, which it was not asked for",
                            guard.key().name()
                        )),
                    }
                }
                self.work().await;
                for (k, marker) in inside {
                    s.plain.witnesses[k].exit(marker, &s.violations());
                }
                let names: Vec<&str> = held.guards().iter().map(|g| g.key().name()).collect();
                let names = names.join(", ");
                let lost = held.is_lost();
                let released = held.release().await;
                self.finished(&names, lost, released);
                Ok(())
            }
        }
    }

    /// Enters `guard`'s key exclusively; returns the marker to leave with.
    fn enter(&self, set: &KeySet, k: usize, guard: &LockGuard) -> u64 {
        let marker = self.s.markers.fetch_add(1, Ordering::Relaxed);
        set.witnesses[k].enter(marker, guard.fencing_token(), &self.s.violations());
        marker
    }

    /// While this task holds key `k`, another client tries it for `wait`: it must time
    /// out. Should it get in, the witness reports the overlap.
    async fn probe(
        &self,
        set: &KeySet,
        k: usize,
        wait: Duration,
        fair: bool,
    ) -> Result<(), LockError> {
        let name = set.name(k);
        let tried = if fair {
            self.other.fair_lock(name).try_acquire(wait).await
        } else {
            self.other.lock(name).try_acquire(wait).await
        };
        match tried {
            Err(LockError::Timeout { .. }) => Ok(()),
            Ok(intruder) => {
                let marker = self.enter(set, k, &intruder);
                set.witnesses[k].exit(marker, &self.s.violations());
                self.release(intruder).await;
                Ok(())
            }
            Err(e) => Err(e),
        }
    }

    /// The protected work: a quarter of the holds last a millisecond, the rest a yield.
    async fn work(&mut self) {
        if self.rng.below(4) == 0 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        } else {
            tokio::task::yield_now().await;
        }
    }

    async fn release(&self, guard: LockGuard) {
        let (name, lost) = (guard.key().name().to_owned(), guard.is_lost());
        let released = guard.release().await;
        self.finished(&name, lost, released);
    }

    /// Books the end of a hold of `name`: lost before its release, or refused by it.
    fn finished(&self, name: &str, lost: bool, released: Result<(), LockError>) {
        let lost = match released {
            Ok(()) => lost,
            Err(LockError::Lost { .. } | LockError::NotHeld { .. }) => true,
            Err(e) => {
                self.s
                    .checks
                    .problem(format!("{NAME}: release of `{name}` failed: {e}"));
                lost
            }
        };
        if lost {
            self.s.counts.lost.fetch_add(1, Ordering::SeqCst);
            self.s
                .checks
                .problem(format!("{NAME}: `{name}` was lost while held"));
        }
    }
}

/// What one sample saw.
#[derive(Debug, Clone, Copy)]
struct Sample {
    at: Duration,
    /// Client resident set size, bytes.
    rss: u64,
    /// Client open file descriptors.
    fds: u64,
    /// Redis connections (`connected_clients`), the probe's own left out.
    connections: u64,
    /// Connections in pub/sub mode.
    pubsub_connections: u64,
    /// Channels with a subscriber (`PUBSUB CHANNELS`).
    channels: u64,
    /// Channel subscriptions over all connections (`sub=` of `CLIENT LIST`).
    subscriptions: u64,
    /// `DBSIZE`.
    keys: u64,
    /// Keys of the soak, and lock hashes among them (found by `SCAN`).
    soak_keys: u64,
    lock_hashes: u64,
    /// Redis `used_memory`, bytes.
    used_memory: u64,
    /// The clients' own bookkeeping: watchdog entries and waited channels.
    watched: u64,
    waited: u64,
}

fn sample(ctx: &Ctx, clients: &[LockClient], at: Duration) -> Result<Sample, BoxError> {
    let info: String = ctx.admin(&["INFO", "clients"])?;
    let connected: u64 = info_field(&info, "connected_clients")?;
    let list: String = ctx.admin(&["CLIENT", "LIST"])?;
    let (mut pubsub, mut subscriptions) = (0, 0);
    for line in list.lines() {
        let field = |name: &str| {
            line.split_whitespace()
                .find_map(|f| f.strip_prefix(name)?.strip_prefix('='))
        };
        let count = |name: &str| field(name).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
        let (sub, psub) = (count("sub"), count("psub"));
        subscriptions += sub;
        if sub + psub > 0 || field("flags").is_some_and(|f| f.contains('P')) {
            pubsub += 1;
        }
    }
    let channels = ctx.pubsub_channels()? as u64;
    // SCAN before DBSIZE: it drops the expired keys it meets.
    let soak_keys = scan(ctx, KEYS_PATTERN)?;
    // A lock hash ends with its `}`; its companion keys (`:fence`, `:queue`, ...) go on.
    let lock_hashes = soak_keys.iter().filter(|k| k.ends_with('}')).count() as u64;
    let keys: u64 = ctx.admin(&["DBSIZE"])?;
    let memory: String = ctx.admin(&["INFO", "memory"])?;
    let (mut watched, mut waited) = (0, 0);
    for client in clients {
        let stats = client.stats();
        watched += stats.watched_locks as u64;
        waited += stats.waited_channels as u64;
    }
    Ok(Sample {
        at,
        rss: rss_bytes()?,
        fds: std::fs::read_dir("/proc/self/fd")?.count() as u64,
        connections: connected.saturating_sub(1),
        pubsub_connections: pubsub,
        channels,
        subscriptions,
        keys,
        soak_keys: soak_keys.len() as u64,
        lock_hashes,
        used_memory: info_field(&memory, "used_memory")?,
        watched,
        waited,
    })
}

/// A numeric field of an `INFO` section.
fn info_field(info: &str, name: &str) -> Result<u64, BoxError> {
    let value = info
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
        .ok_or_else(|| format!("no {name} in INFO"))?;
    Ok(value.trim().parse()?)
}

/// The keys matching `pattern`, by `SCAN` (bounded: a million keys at most).
fn scan(ctx: &Ctx, pattern: &str) -> Result<Vec<String>, BoxError> {
    let mut keys = Vec::new();
    let mut cursor = "0".to_owned();
    for _ in 0..1_000 {
        let (next, batch): (String, Vec<String>) =
            ctx.admin(&["SCAN", &cursor, "MATCH", pattern, "COUNT", "1000"])?;
        keys.extend(batch);
        if next == "0" {
            keys.sort();
            keys.dedup();
            return Ok(keys);
        }
        cursor = next;
    }
    Err(format!("SCAN of {pattern} did not finish").into())
}

/// How long the end took to be clean: the background releases through (no lock hash,
/// nothing watched or waited for), then every key of the soak expired.
#[derive(Debug, Clone, Copy)]
struct Drained {
    released: Option<Duration>,
    expired: Option<Duration>,
}

async fn drain(ctx: &Ctx, clients: &[LockClient]) -> Result<Drained, BoxError> {
    let since = Instant::now();
    let mut drained = Drained {
        released: None,
        expired: None,
    };
    // Bounded: the fencing keys live a lease past their lock, fair queues their last
    // waiter's queue timeout (5 s), claim outcomes `KEEP`.
    let limit = since + LEASE + Duration::from_secs(15);
    while Instant::now() < limit {
        let s = sample(ctx, clients, Duration::ZERO)?;
        if drained.released.is_none() && s.lock_hashes == 0 && s.watched == 0 && s.waited == 0 {
            drained.released = Some(since.elapsed());
        }
        if drained.released.is_some() && s.soak_keys == 0 {
            drained.expired = Some(since.elapsed());
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    if drained.released.is_none() {
        ctx.checks.problem(format!(
            "{NAME}: locks still held (or watched, or waited for) {:?} after the load stopped",
            since.elapsed()
        ));
    }
    // A short settle, so the end sample sees an idle client.
    tokio::time::sleep(Duration::from_secs(1)).await;
    Ok(drained)
}

/// Waits (up to 5 s) for the connections to fall back to `before` once the clients are
/// dropped; returns the count seen last.
async fn closed_connections(ctx: &Ctx, before: u64) -> Result<u64, BoxError> {
    let mut now = u64::MAX;
    for _ in 0..50 {
        let info: String = ctx.admin(&["INFO", "clients"])?;
        now = info_field(&info, "connected_clients")?.saturating_sub(1);
        if now <= before {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(now)
}

fn push_cycles(report: &mut Report, counts: &Counts, cycles: u64, elapsed: Duration) {
    let secs = elapsed.as_secs_f64();
    for kind in Kind::ALL {
        let done = Counts::get(&counts.done, kind);
        let mut note = format!(
            "{:.0}/s; {} waits ran out (2 s, contended); {} errors",
            done as f64 / secs,
            Counts::get(&counts.timed_out, kind),
            Counts::get(&counts.errors, kind)
        );
        if kind == Kind::Claim {
            let found = counts.outcomes_found.load(Ordering::Relaxed);
            let _ = write!(
                note,
                "; {found} found the outcome, {} did the work",
                done - found.min(done)
            );
        }
        report.push(
            Row::new(NAME, kind.name(), "cycles", "")
                .value(done as f64)
                .note(note),
        );
    }
    let done: u64 = Kind::ALL
        .iter()
        .map(|&k| Counts::get(&counts.done, k))
        .sum();
    report.push(
        Row::new(NAME, IMPL, "cycles, all kinds", "")
            .value(done as f64)
            .note(format!(
                "{:.0}/s over {:.0} s ({cycles} tried), 256 keys (half the picks on 8 hot ones per family)",
                done as f64 / secs,
                secs
            )),
    );
}

/// The start and end rows of every resource, and the problems if it grew.
#[allow(clippy::too_many_arguments)]
fn push_resources(
    ctx: &Ctx,
    report: &mut Report,
    before: &Sample,
    start: &Sample,
    end: &Sample,
    series: &[Sample],
    drained: Drained,
    closed: u64,
) {
    let warm = start.at.as_secs();
    let mut pair = |what: &str, unit: &'static str, of: fn(&Sample) -> f64, note: String| {
        let (a, b) = (of(start), of(end));
        report.push(
            Row::new(NAME, IMPL, &format!("{what} at start"), unit)
                .value(a)
                .note(format!("after {warm} s, under load")),
        );
        let every: Vec<String> = series.iter().map(|s| trim(of(s))).collect();
        let mut row = Row::new(NAME, IMPL, &format!("{what} at end"), unit).value(b);
        if a > 0.0 {
            row = row.ratio_to(a, "÷ start");
        }
        report.push(
            row.note(note)
                .note(format!("every 30 s under load: {}", every.join(", "))),
        );
    };
    let idle = "idle, all guards gone".to_owned();
    pair("client RSS", "MiB", |s| s.rss as f64 / MIB, idle.clone());
    pair("client open fds", "", |s| s.fds as f64, idle.clone());
    pair(
        "Redis connections",
        "",
        |s| s.connections as f64,
        format!(
            "{} before the clients, {closed} after they were dropped",
            before.connections
        ),
    );
    pair(
        "Redis pub/sub connections",
        "",
        |s| s.pubsub_connections as f64,
        idle.clone(),
    );
    pair(
        "Redis subscribed channels",
        "",
        |s| s.channels as f64,
        format!("{} subscriptions (sub=) at end", end.subscriptions),
    );
    pair(
        "Redis keys (DBSIZE)",
        "",
        |s| s.keys as f64,
        format!(
            "releases through after {}, every soak key expired after {}",
            secs(drained.released),
            secs(drained.expired)
        ),
    );
    pair(
        "Redis lock hashes of the soak",
        "",
        |s| s.lock_hashes as f64,
        idle.clone(),
    );
    pair(
        "Redis used_memory",
        "MiB",
        |s| s.used_memory as f64 / MIB,
        idle,
    );

    let grew = |what: &str, start: f64, end: f64, bound: f64| {
        if end > bound {
            ctx.checks.problem(format!(
                "{NAME}: {what} grew: {} at start, {} at end (bound {})",
                trim(start),
                trim(end),
                trim(bound)
            ));
        }
    };
    let mib = |bytes: u64| bytes as f64 / MIB;
    let (a, b) = (mib(start.rss), mib(end.rss));
    grew("client RSS (MiB)", a, b, 1.5 * a + 8.0);
    let (a, b) = (mib(start.used_memory), mib(end.used_memory));
    grew("Redis used_memory (MiB)", a, b, 1.5 * a + 8.0);
    grew(
        "client open fds",
        start.fds as f64,
        end.fds as f64,
        start.fds as f64,
    );
    let (a, b) = (start.connections as f64, end.connections as f64);
    grew("Redis connections", a, b, a);
    let (a, b) = (start.keys as f64, end.keys as f64);
    grew("Redis keys", a, b, a);
    // Idle, nobody waits: any subscription left is a leak.
    let (a, b) = (start.subscriptions as f64, end.subscriptions as f64);
    grew("Redis subscriptions", a, b, 0.0);
    let (a, b) = (start.channels as f64, end.channels as f64);
    grew("Redis subscribed channels", a, b, 0.0);
    if end.soak_keys > 0 || end.lock_hashes > 0 {
        ctx.checks.problem(format!(
            "{NAME}: {} keys of the soak ({} lock hashes) left at the end",
            end.soak_keys, end.lock_hashes
        ));
    }
    if end.watched > 0 || end.waited > 0 {
        ctx.checks.problem(format!(
            "{NAME}: the clients still watch {} locks and wait on {} channels at the end",
            end.watched, end.waited
        ));
    }
    if closed > before.connections {
        ctx.checks.problem(format!(
            "{NAME}: {closed} connections open after the clients were dropped, {} before them",
            before.connections
        ));
    }
}

fn trim(v: f64) -> String {
    crate::stats::num(v, "")
}

fn secs(d: Option<Duration>) -> String {
    d.map_or("never".into(), |d| format!("{:.1} s", d.as_secs_f64()))
}
