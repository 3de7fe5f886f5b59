//! The engine's metrics, recorded by a real recorder (`metrics-util`'s debugging
//! recorder, installed for this test binary) through a scripted scenario on both stores.
//! One test function: the recorder is global, so the scenarios run one after the other.

mod common;

use std::collections::HashMap;
use std::time::Duration;

use common::Env;
use lockwarden_core::{Claim, LockClient, LockError};
use lockwarden_testkit::{eventually, RedisServer};
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};

/// Every value recorded so far. The debugging recorder hands out counters and gauges as
/// deltas since its last snapshot (it resets them), so they are summed here.
struct Recorded {
    snapshotter: Snapshotter,
    counters: HashMap<String, u64>,
    gauges: HashMap<String, f64>,
    histograms: HashMap<String, Vec<f64>>,
}

impl Recorded {
    fn take(&mut self) -> &mut Self {
        for (key, _, _, value) in self.snapshotter.snapshot().into_vec() {
            let key = key.key();
            let mut labels: Vec<String> = key
                .labels()
                .map(|l| format!("{}={}", l.key(), l.value()))
                .collect();
            labels.sort();
            let name = format!("{}{{{}}}", key.name(), labels.join(","));
            match value {
                DebugValue::Counter(n) => *self.counters.entry(name).or_default() += n,
                DebugValue::Gauge(g) => *self.gauges.entry(name).or_default() += g.into_inner(),
                DebugValue::Histogram(values) => self
                    .histograms
                    .entry(name)
                    .or_default()
                    .extend(values.into_iter().map(|v| v.into_inner())),
            }
        }
        self
    }

    fn counter(&mut self, name: &str) -> u64 {
        self.take().counters.get(name).copied().unwrap_or(0)
    }

    fn gauge(&mut self, name: &str) -> f64 {
        self.take().gauges.get(name).copied().unwrap_or(0.0)
    }

    fn histogram(&mut self, name: &str) -> Vec<f64> {
        self.take()
            .histograms
            .get(name)
            .cloned()
            .unwrap_or_default()
    }

    fn clear(&mut self) {
        self.take();
        self.counters.clear();
        self.histograms.clear();
        // Gauges are levels, not events: they carry over.
    }
}

/// Polls `check` (which reads the recorder, so cannot be held across an await) for 3 s.
async fn until(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(3);
    while !check() {
        assert!(
            std::time::Instant::now() < deadline,
            "not within 3 s: {what}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn acquisitions(kind: &str, outcome: &str) -> String {
    format!("lockwarden_acquisitions_total{{kind={kind},outcome={outcome}}}")
}

#[test]
fn the_engine_records_its_acquisitions_holds_losses_waiters_and_errors() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    recorder
        .install()
        .expect("the only recorder of this test binary");
    let mut recorded = Recorded {
        snapshotter,
        counters: HashMap::new(),
        gauges: HashMap::new(),
        histograms: HashMap::new(),
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        for env in [Env::memory(), Env::redis()] {
            recorded.clear();
            scenario(&env, &mut recorded).await;
        }
        recorded.clear();
        backend_errors(&mut recorded).await;
    });
}

/// Acquisitions of every outcome, hold times, the waiters gauge (and on Redis the
/// subscriptions gauge), renewals and a lost lock: exact counts, since only this scenario
/// acquires.
async fn scenario(env: &Env, recorded: &mut Recorded) {
    let what = if env.is_redis() { "redis" } else { "memory" };
    // Renewed every 333 ms: rides over the stalls of a loaded machine (a 300 ms lease
    // lost its hold to one).
    let short = |b: lockwarden_core::LockClientBuilder| b.watchdog_timeout(Duration::from_secs(1));
    let client = match env.is_redis() {
        true => env.client_with(short).await,
        false => short(LockClient::builder()).in_memory(),
    };

    // Taken, re-entered, refused at once (busy), refused after a wait (timeout).
    let me = client.holder();
    let outer = client.lock("m").holder(&me).acquire().await.unwrap();
    let inner = client.lock("m").holder(&me).acquire().await.unwrap();
    assert!(client.try_acquire("m", Duration::ZERO).await.is_err());
    assert!(client
        .try_acquire("m", Duration::from_millis(50))
        .await
        .is_err());
    assert_eq!(
        recorded.counter(&acquisitions("plain", "taken")),
        1,
        "{what}"
    );
    assert_eq!(
        recorded.counter(&acquisitions("plain", "reentered")),
        1,
        "{what}"
    );
    assert_eq!(
        recorded.counter(&acquisitions("plain", "busy")),
        1,
        "{what}"
    );
    assert_eq!(
        recorded.counter(&acquisitions("plain", "timeout")),
        1,
        "{what}"
    );
    let waits = recorded.histogram("lockwarden_acquire_wait_seconds{kind=plain,outcome=timeout}");
    assert!(
        waits.len() == 1 && waits[0] >= 0.05,
        "{what}: the timeout waited: {waits:?}"
    );

    // Held past a renewal: the watchdog extends it, and the hold time is recorded.
    tokio::time::sleep(Duration::from_millis(500)).await;
    inner.release().await.unwrap();
    outer.release().await.unwrap();
    let holds = recorded.histogram("lockwarden_hold_seconds{kind=plain}");
    assert_eq!(holds.len(), 2, "{what}: two guards ended: {holds:?}");
    assert!(holds.iter().all(|h| *h >= 0.5), "{what}: {holds:?}");
    assert!(
        recorded.counter("lockwarden_renewals_total{outcome=extended}") >= 1,
        "{what}"
    );

    // A claim done once, then found done; a read hold; an upgrade refused.
    match client.lock("c").try_claim(Duration::ZERO).await.unwrap() {
        Claim::Acquired(guard) => guard
            .complete(b"ok".to_vec(), Duration::from_secs(5))
            .await
            .unwrap(),
        Claim::Completed(_) => panic!("{what}: nothing was done yet"),
    }
    assert!(matches!(
        client.lock("c").try_claim(Duration::ZERO).await.unwrap(),
        Claim::Completed(_)
    ));
    assert_eq!(
        recorded.counter(&acquisitions("plain", "completed")),
        1,
        "{what}"
    );
    let reader = client
        .rw_lock("rw")
        .read()
        .holder(&me)
        .acquire()
        .await
        .unwrap();
    assert!(matches!(
        client
            .rw_lock("rw")
            .write()
            .holder(&me)
            .try_acquire(Duration::ZERO)
            .await,
        Err(LockError::UpgradeRefused { .. })
    ));
    reader.release().await.unwrap();
    assert_eq!(
        recorded.counter(&acquisitions("read", "taken")),
        1,
        "{what}"
    );
    assert_eq!(
        recorded.counter(&acquisitions("write", "refused")),
        1,
        "{what}"
    );

    // A waiter: the waiters gauge (and on Redis one subscription) while it waits.
    let held = client.fair_lock("f").acquire().await.unwrap();
    let waiter = tokio::spawn({
        let client = client.clone();
        async move {
            client
                .fair_lock("f")
                .try_acquire(Duration::from_secs(5))
                .await
        }
    });
    eventually(Duration::from_secs(3), "the waiter registers", || async {
        client.stats().waited_channels == 1
    })
    .await;
    // The gauge and the channel count are not set in one step: wait for the gauge too.
    until(&format!("{what}: the waiters gauge reads 1"), || {
        recorded.gauge("lockwarden_waiters{}") == 1.0
    })
    .await;
    if env.is_redis() {
        until("one subscription", || {
            recorded.gauge("lockwarden_subscriptions{}") == 1.0
        })
        .await;
    }
    held.release().await.unwrap();
    waiter.await.unwrap().unwrap().release().await.unwrap();
    assert_eq!(recorded.gauge("lockwarden_waiters{}"), 0.0, "{what}");
    assert_eq!(
        recorded.counter(&acquisitions("fair", "taken")),
        2,
        "{what}"
    );

    // A lock force-unlocked under its holder: lost, found gone at the next renewal.
    let victim = client.acquire("v").await.unwrap();
    client.lock("v").force_unlock().await.unwrap();
    eventually(Duration::from_secs(3), "the loss is noticed", || async {
        victim.is_lost()
    })
    .await;
    assert_eq!(
        recorded.counter("lockwarden_locks_lost_total{kind=plain,reason=gone}"),
        1,
        "{what}"
    );
    assert!(
        recorded.counter("lockwarden_renewals_total{outcome=lost}") >= 1,
        "{what}"
    );
    drop(victim);
    // A fixed lease that ran out before its release.
    let brief = client
        .lock("b")
        .lease(Duration::from_millis(20))
        .acquire()
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(60)).await;
    assert!(brief.release().await.is_err());
    assert_eq!(
        recorded.counter("lockwarden_locks_lost_total{kind=plain,reason=lease_ended}"),
        1,
        "{what}"
    );
    permits(&client, what, recorded).await;
    if env.is_redis() {
        until("no subscription left", || {
            recorded.gauge("lockwarden_subscriptions{}") == 0.0
        })
        .await;
    }
}

/// Semaphore permits: held and waiting gauges, acquisitions of kind `permits` (taken,
/// refused at once, timed out), and the gauges back to zero after.
async fn permits(client: &LockClient, what: &str, recorded: &mut Recorded) {
    recorded.clear();
    let sem = client.semaphore("p", 3);
    let two = sem.acquire_many(2).await.unwrap();
    let one = sem.acquire().await.unwrap();
    assert_eq!(recorded.gauge("lockwarden_permits_held{}"), 3.0, "{what}");
    assert!(matches!(
        sem.try_acquire(Duration::ZERO).await,
        Err(LockError::Timeout { .. })
    ));
    let waiter = tokio::spawn({
        let sem = sem.clone();
        async move { sem.try_acquire(Duration::from_secs(5)).await }
    });
    until("one waiting in line", || {
        recorded.gauge("lockwarden_permits_waiting{}") == 1.0
    })
    .await;
    one.release().await.unwrap();
    let granted = waiter.await.unwrap().unwrap();
    assert_eq!(
        recorded.gauge("lockwarden_permits_waiting{}"),
        0.0,
        "{what}"
    );
    assert!(matches!(
        sem.try_acquire(Duration::from_millis(30)).await,
        Err(LockError::Timeout { .. })
    ));
    granted.release().await.unwrap();
    two.release().await.unwrap();
    assert_eq!(recorded.gauge("lockwarden_permits_held{}"), 0.0, "{what}");
    assert_eq!(
        recorded.counter(&acquisitions("permits", "taken")),
        3,
        "{what}"
    );
    assert_eq!(
        recorded.counter(&acquisitions("permits", "busy")),
        1,
        "{what}"
    );
    assert_eq!(
        recorded.counter(&acquisitions("permits", "timeout")),
        1,
        "{what}"
    );
}

/// A store that is gone: the acquire's backend errors are counted by operation and
/// kind, and the call ends as an error.
async fn backend_errors(recorded: &mut Recorded) {
    let mut server = RedisServer::start().unwrap();
    let client = LockClient::builder()
        .command_timeout(Duration::from_millis(300))
        .connect(&server.url())
        .await
        .unwrap();
    server.kill();
    assert!(client
        .try_acquire("e", Duration::from_millis(200))
        .await
        .is_err());
    assert_eq!(recorded.counter(&acquisitions("plain", "error")), 1);
    let connection =
        recorded.counter("lockwarden_backend_errors_total{error=connection,operation=acquire}");
    let timeout =
        recorded.counter("lockwarden_backend_errors_total{error=timeout,operation=acquire}");
    assert!(
        connection + timeout >= 1,
        "connection {connection}, timeout {timeout}"
    );
}
