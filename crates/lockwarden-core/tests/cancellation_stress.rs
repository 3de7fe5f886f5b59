//! Cancellation at scale: 10,000 lock operations cut off at random points (acquire futures
//! dropped by tiny timeouts, after a random number of polls, by losing a `select!`; tasks
//! holding or acquiring guards aborted), on free keys, on keys the operations fight over,
//! and on keys another client holds (so many futures are dropped while subscribed and
//! waiting); then the same 10,000 on semaphores of 2 permits (waiters in line cut off,
//! grants given to waiters that went away). Afterwards nothing may be left behind: no
//! lock or permit in Redis, nobody in line, no subscription, no bookkeeping entry in the
//! client, no extra task, no grown heap.
//!
//! The seed of the random plan is printed; set `LOCKWARDEN_SEED=<n>` to replay a plan
//! (timing still varies from run to run).
//!
//! This binary holds this one test only: it counts the live heap bytes of the whole
//! process with a counting global allocator, which another test running alongside
//! would disturb.

use std::alloc::{GlobalAlloc, Layout, System};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicIsize, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use lockwarden_core::{LockClient, LockError, LockGuard};
use lockwarden_testkit::RedisServer;

/// Counts the bytes currently allocated by the whole process.
struct Counting;

static LIVE_BYTES: AtomicIsize = AtomicIsize::new(0);

// SAFETY: every call is forwarded unchanged to the system allocator; only a counter is
// updated besides.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: same contract as ours.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            LIVE_BYTES.fetch_add(layout.size() as isize, Ordering::Relaxed);
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: same contract as ours.
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            LIVE_BYTES.fetch_add(layout.size() as isize, Ordering::Relaxed);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as ours.
        unsafe { System.dealloc(ptr, layout) };
        LIVE_BYTES.fetch_sub(layout.size() as isize, Ordering::Relaxed);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: same contract as ours.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            LIVE_BYTES.fetch_add(
                new_size as isize - layout.size() as isize,
                Ordering::Relaxed,
            );
        }
        p
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

fn live_bytes() -> isize {
    LIVE_BYTES.load(Ordering::Relaxed)
}

/// xorshift64*: small, seeded, good enough to pick cut points.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// What the operations take: plain locks, or permits of semaphores of [`PERMITS`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Family {
    Locks,
    Permits,
}

/// The capacity of the semaphores.
const PERMITS: u32 = 2;

impl Family {
    /// Takes `name`'s lock or one of its permits, waiting as long as it takes.
    async fn acquire(self, client: &LockClient, name: String) -> Result<LockGuard, LockError> {
        match self {
            Family::Locks => client.acquire(name).await,
            Family::Permits => client.semaphore(name, PERMITS).acquire().await,
        }
    }

    /// As [`Family::acquire`], waiting at most `wait`.
    async fn try_acquire(
        self,
        client: &LockClient,
        name: String,
        wait: Duration,
    ) -> Result<LockGuard, LockError> {
        match self {
            Family::Locks => client.try_acquire(name, wait).await,
            Family::Permits => client.semaphore(name, PERMITS).try_acquire(wait).await,
        }
    }

    /// What keeps a hot key from everyone else: its lock, or all its permits.
    async fn take_all(self, client: &LockClient, name: String) -> Option<LockGuard> {
        let wait = Duration::from_millis(200);
        match self {
            Family::Locks => client.try_acquire(name, wait).await.ok(),
            Family::Permits => {
                let sem = client.semaphore(name, PERMITS);
                sem.try_acquire_many(PERMITS, wait).await.ok()
            }
        }
    }

    /// The channel its waiters of `name` sleep on, in the default layout.
    fn channel(self, name: &str) -> String {
        match self {
            Family::Locks => format!("lockwarden:{{{name}}}:released"),
            Family::Permits => format!("lockwarden:{{{name}}}:granted"),
        }
    }
}

/// Keys the operations fight over among themselves.
const KEYS: u64 = 16;
/// Keys mostly held by another client: acquires on them wait (subscribed) and are cut.
const HOT: u64 = 4;
const ITERATIONS: usize = 10_000;
const WARM_UP: usize = 640;
/// Operations in flight at once.
const WAVE: usize = 64;
/// Heap growth allowed between the warmed-up baseline and the end. One-off growth (hash
/// maps and channel buffers that keep their capacity, caches inside tokio and redis-rs)
/// measured 5-20 KB, no more after 30,000 operations than after 1,000; a leak of 13 bytes
/// per operation would exceed it (10,000 × 13 B = 130 KB).
const HEAP_TOLERANCE: isize = 128 * 1024;

#[derive(Clone, Copy, Debug)]
enum Step {
    /// `timeout(cut, acquire)`; a guard that made it is dropped at once or after a yield.
    Timeout { key: u64, cut_us: u64, hold: bool },
    /// Polls `acquire` `polls` times, then drops it.
    Polls { key: u64, polls: u32 },
    /// `select!` of `try_acquire(wait)` against a sleep; a winner is released or dropped.
    /// (Tasks that release are not aborted, see [`plan`].)
    Select {
        key: u64,
        wait_us: u64,
        race_us: u64,
        release: bool,
    },
    /// Waits on a key another client holds; cut off after `cut_us`.
    HotWait { hot: u64, cut_us: u64 },
    /// Acquires and holds for `hold_us`, then drops the guard; the task is aborted
    /// somewhere in there (mid-acquire, or holding, so the abort drops the guard).
    Hold { key: u64, hold_us: u64 },
    /// Acquires, then re-enters as the same holder under a cut (for permits: takes a
    /// second one under a cut, as a counting semaphore has no re-entry).
    Reenter { key: u64, cut_us: u64 },
}

#[derive(Clone, Copy, Debug)]
struct Plan {
    step: Step,
    /// Abort the task running the step this long after spawning it.
    abort_after_us: Option<u64>,
}

fn plan(rng: &mut Rng) -> Plan {
    let key = rng.below(KEYS);
    let step = match rng.below(6) {
        0 => Step::Timeout {
            key,
            cut_us: rng.below(1_500),
            hold: rng.below(2) == 0,
        },
        1 => Step::Polls {
            key,
            polls: rng.below(12) as u32,
        },
        2 => Step::Select {
            key,
            wait_us: rng.below(20_000),
            race_us: rng.below(3_000),
            release: rng.below(2) == 0,
        },
        3 => Step::HotWait {
            hot: rng.below(HOT),
            cut_us: rng.below(20_000),
        },
        4 => Step::Hold {
            key,
            hold_us: rng.below(2_000),
        },
        _ => Step::Reenter {
            key,
            cut_us: rng.below(1_500),
        },
    };
    // Tasks are aborted anywhere, also inside `guard.release().await`.
    let abort = matches!(step, Step::Hold { .. }) || rng.below(4) == 0;
    Plan {
        step,
        abort_after_us: abort.then(|| rng.below(3_000)),
    }
}

/// Polls the inner future at most `left + 1` times (yielding in between, so its I/O
/// makes progress), then gives up and drops it.
struct PollN<F> {
    inner: Pin<Box<F>>,
    left: u32,
}

impl<F: Future> Future for PollN<F> {
    type Output = Option<F::Output>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        if let Poll::Ready(out) = self.inner.as_mut().poll(cx) {
            return Poll::Ready(Some(out));
        }
        if self.left == 0 {
            return Poll::Ready(None);
        }
        self.left -= 1;
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}

fn us(n: u64) -> Duration {
    Duration::from_micros(n)
}

async fn run(client: LockClient, family: Family, step: Step) {
    let name = |k: u64| format!("stress:{k}");
    match step {
        Step::Timeout { key, cut_us, hold } => {
            let acquire = family.acquire(&client, name(key));
            if let Ok(Ok(guard)) = tokio::time::timeout(us(cut_us), acquire).await {
                if hold {
                    tokio::task::yield_now().await;
                }
                drop(guard);
            }
        }
        Step::Polls { key, polls } => {
            let acquire = family.acquire(&client, name(key));
            let got = PollN {
                inner: Box::pin(acquire),
                left: polls,
            }
            .await;
            drop(got);
        }
        Step::Select {
            key,
            wait_us,
            race_us,
            release,
        } => {
            tokio::select! {
                got = family.try_acquire(&client, name(key), us(wait_us)) => {
                    if let (Ok(guard), true) = (got, release) {
                        let _ = guard.release().await;
                    }
                }
                _ = tokio::time::sleep(us(race_us)) => {}
            }
        }
        Step::HotWait { hot, cut_us } => {
            let acquire = family.acquire(&client, format!("stress:hot:{hot}"));
            let _ = tokio::time::timeout(us(cut_us), acquire).await;
        }
        Step::Hold { key, hold_us } => {
            if let Ok(guard) = family
                .try_acquire(&client, name(key), Duration::from_millis(20))
                .await
            {
                tokio::time::sleep(us(hold_us)).await;
                drop(guard);
            }
        }
        Step::Reenter { key, cut_us } if family == Family::Permits => {
            let first = family
                .try_acquire(&client, name(key), Duration::from_millis(20))
                .await;
            if let Ok(first) = first {
                let second = tokio::time::timeout(us(cut_us), family.acquire(&client, name(key)));
                drop(second.await);
                drop(first);
            }
        }
        Step::Reenter { key, cut_us } => {
            let me = client.holder();
            let outer = tokio::time::timeout(
                Duration::from_millis(20),
                client.lock(name(key)).holder(&me).acquire(),
            )
            .await;
            if let Ok(Ok(outer)) = outer {
                let inner =
                    tokio::time::timeout(us(cut_us), client.lock(name(key)).holder(&me).acquire())
                        .await;
                drop(inner);
                drop(outer);
            }
        }
    }
}

/// Runs `plans` in waves of [`WAVE`] concurrent tasks, aborting the planned ones.
async fn stress(
    (client, other): (&LockClient, &LockClient),
    family: Family,
    rng: &mut Rng,
    plans: &[Plan],
) {
    let mut hot: Vec<Option<LockGuard>> = (0..HOT).map(|_| None).collect();
    for wave in plans.chunks(WAVE) {
        // The other client holds most hot keys, changing between waves: a release during
        // a wave hands the key to a waiter that may be cut off right after.
        for (h, slot) in hot.iter_mut().enumerate() {
            if rng.below(4) == 0 {
                *slot = None;
            } else if slot.is_none() {
                *slot = family.take_all(other, format!("stress:hot:{h}")).await;
            }
        }
        let started = tokio::time::Instant::now();
        let mut tasks = Vec::with_capacity(wave.len());
        let mut aborts = Vec::new();
        for p in wave {
            let task = tokio::spawn(run(client.clone(), family, p.step));
            if let Some(after) = p.abort_after_us {
                aborts.push((started + us(after), task.abort_handle()));
            }
            tasks.push(task);
        }
        aborts.sort_by_key(|(at, _)| *at);
        for (at, handle) in aborts {
            tokio::time::sleep_until(at).await;
            handle.abort();
        }
        // A release of a hot key mid-wave.
        if let Some(slot) = hot.iter_mut().find(|s| s.is_some()) {
            *slot = None;
        }
        for task in tasks {
            match tokio::time::timeout(Duration::from_secs(10), task).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) if e.is_cancelled() => {}
                Ok(Err(e)) => panic!("a stress task panicked: {e}"),
                Err(_) => panic!("a stress task did not finish within 10 s"),
            }
        }
    }
    drop(hot);
}

/// What is left behind after the stress, as seen from outside and inside the client.
#[derive(Debug, PartialEq)]
struct Leftovers {
    lock_keys: Vec<String>,
    fence_keys_without_ttl: Vec<String>,
    channels: Vec<String>,
    subscribers: u64,
    watched_locks: usize,
    waited_channels: usize,
    extra_tasks: isize,
}

impl Leftovers {
    fn none(&self) -> bool {
        self.lock_keys.is_empty()
            && self.fence_keys_without_ttl.is_empty()
            && self.channels.is_empty()
            && self.subscribers == 0
            && self.watched_locks == 0
            && self.waited_channels == 0
            && self.extra_tasks <= 0
    }
}

fn leftovers(
    server: &RedisServer,
    client: &LockClient,
    family: Family,
    tasks_baseline: usize,
) -> Leftovers {
    let (fences, lock_keys): (Vec<String>, Vec<String>) = server
        .keys_matching("lockwarden:*")
        .into_iter()
        .partition(|k| k.ends_with(":fence"));
    // Fencing keys outlive a release by up to the lease; they must expire by themselves.
    let fence_keys_without_ttl = fences.into_iter().filter(|k| server.pttl(k) < 0).collect();
    let channels = server.channels();
    let subscribers = (0..HOT)
        .map(|h| family.channel(&format!("stress:hot:{h}")))
        .chain((0..KEYS).map(|k| family.channel(&format!("stress:{k}"))))
        .map(|channel| server.subscribers(&channel))
        .sum();
    let stats = client.stats();
    let tasks = tokio::runtime::Handle::current()
        .metrics()
        .num_alive_tasks();
    Leftovers {
        lock_keys,
        fence_keys_without_ttl,
        channels,
        subscribers,
        watched_locks: stats.watched_locks,
        waited_channels: stats.waited_channels,
        extra_tasks: tasks as isize - tasks_baseline as isize,
    }
}

/// Waits (bounded) until nothing is left behind and the heap is back within tolerance;
/// returns what was left at the end and the heap growth over `heap_baseline`.
async fn settle(
    server: &RedisServer,
    client: &LockClient,
    family: Family,
    tasks_baseline: usize,
    heap_baseline: isize,
    limit: Duration,
) -> (Leftovers, isize, Duration) {
    let started = Instant::now();
    loop {
        let left = leftovers(server, client, family, tasks_baseline);
        let grown = live_bytes() - heap_baseline;
        if (left.none() && grown <= HEAP_TOLERANCE) || started.elapsed() >= limit {
            return (left, grown, started.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Promise: whatever point an acquire, a guard or a task holding one is dropped at, for
/// locks and for semaphore permits, once the background work has settled (bounded: 10 s)
/// - no lock or permit is left in Redis, and nobody in a semaphore's line (every
///   `lockwarden:*` key is a fencing key with a TTL; the default 30 s lease keeps a
///   leaked lock or permit visible for the whole check),
/// - no release channel is subscribed (`PUBSUB CHANNELS` empty, `NUMSUB` 0),
/// - the client tracks no lock and no waited channel (`stats()` zero),
/// - the runtime runs no more tasks than after warm-up (the client's fixed background
///   tasks), and
/// - the live heap is within [`HEAP_TOLERANCE`] of its level after warm-up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_acquires_guards_and_tasks_leave_nothing_behind() {
    let started = Instant::now();
    let seed = std::env::var("LOCKWARDEN_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
                | 1
        });
    println!("cancellation stress seed: {seed} (replay with LOCKWARDEN_SEED={seed})");
    let mut rng = Rng(seed);

    let server = RedisServer::start().unwrap();
    let client = LockClient::connect(&server.url()).await.unwrap();
    let other = LockClient::connect(&server.url()).await.unwrap();

    // Warm up with the same mix, for both families: starts the watchdog and pub/sub
    // connections and grows every buffer and map to its working size before the
    // baselines are taken.
    let clients = (&client, &other);
    for family in [Family::Locks, Family::Permits] {
        let warm: Vec<Plan> = (0..WARM_UP).map(|_| plan(&mut rng)).collect();
        stress(clients, family, &mut rng, &warm).await;
    }
    // The plan is made before the baselines are taken: it is ~48 bytes per operation.
    let plans: Vec<Plan> = (0..ITERATIONS).map(|_| plan(&mut rng)).collect();
    let aborted = plans.iter().filter(|p| p.abort_after_us.is_some()).count();
    // Let the warm-up's background work finish (bounded: 10 s) before taking the
    // baselines: until nothing is left and the task count and heap are steady.
    let warm_settle = Instant::now();
    let mut last = (usize::MAX, isize::MAX);
    for _ in 0..100 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let tasks = tokio::runtime::Handle::current()
            .metrics()
            .num_alive_tasks();
        let now = (tasks, live_bytes());
        let quiet = [Family::Locks, Family::Permits]
            .into_iter()
            .all(|family| leftovers(&server, &client, family, tasks).none());
        if quiet && now.0 == last.0 && (now.1 - last.1).abs() < 4096 {
            break;
        }
        last = now;
    }
    let tasks_baseline = tokio::runtime::Handle::current()
        .metrics()
        .num_alive_tasks();
    let heap_baseline = live_bytes();
    println!(
        "baseline after warm-up ({:?} to settle): {tasks_baseline} tasks, {heap_baseline} live heap bytes",
        warm_settle.elapsed()
    );

    for family in [Family::Locks, Family::Permits] {
        let stress_started = Instant::now();
        stress(clients, family, &mut rng, &plans).await;
        let stress_took = stress_started.elapsed();

        let (left, grown, settled_in) = settle(
            &server,
            &client,
            family,
            tasks_baseline,
            heap_baseline,
            Duration::from_secs(10),
        )
        .await;
        println!(
            "{family:?}: {ITERATIONS} operations ({aborted} in aborted tasks) in {stress_took:?}; \
             settled in {settled_in:?}; heap grew {grown} bytes (tolerance {HEAP_TOLERANCE}); \
             total {:?}; left: {left:?}",
            started.elapsed()
        );
        assert!(
            left.lock_keys.is_empty(),
            "{family:?}: locks or permits left in Redis: {:?}",
            left.lock_keys
        );
        assert!(
            left.fence_keys_without_ttl.is_empty(),
            "{family:?}: fencing keys that never expire: {:?}",
            left.fence_keys_without_ttl
        );
        assert!(
            left.channels.is_empty(),
            "{family:?}: channels still subscribed: {:?}",
            left.channels
        );
        assert_eq!(left.subscribers, 0, "{family:?}: subscribers left");
        assert_eq!(
            left.watched_locks, 0,
            "{family:?}: client.stats().watched_locks"
        );
        assert_eq!(
            left.waited_channels, 0,
            "{family:?}: client.stats().waited_channels"
        );
        assert!(
            left.extra_tasks <= 0,
            "{family:?}: {} more tasks alive than after warm-up",
            left.extra_tasks
        );
        assert!(
            grown <= HEAP_TOLERANCE,
            "{family:?}: live heap grew by {grown} bytes over the warmed-up baseline"
        );
    }
}
