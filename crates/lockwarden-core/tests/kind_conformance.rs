//! The promises every kind of lock makes, checked for each kind (plain, fair, the read
//! and the write side of a read-write lock, a multi-lock of two) on both stores: the
//! in-process one and a real `redis-server` (see `common::Env`, `common::kinds::Kind`).
//!
//! For the read side, "another holder is excluded" means a writer is; readers share. The
//! kind-specific promises (queue order, writer preference, all-or-nothing, claims, ...)
//! are in each kind's own test file.

mod common;

use std::fmt;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use common::kinds::{Kind, Opts};
use common::{spawn_timed, take_and_release, Env};
use lockwarden_core::{LockClient, LockError};
use lockwarden_testkit::eventually;

conformance!(
    kinds: excludes_another_holder,
    reenters_per_holder,
    fixed_lease_expires,
    watchdog_keeps_a_hold_past_three_leases_and_stops_after_release,
    dropped_guard_releases_and_wakes_a_waiter,
    cancelled_acquires_leave_nothing_behind,
    fencing_tokens_strictly_increase,
    wait_budget_is_honoured,
    force_unlock_wakes_waiters_at_once_and_the_holder_learns_it,
    a_short_reentry_never_cuts_a_longer_hold,
    a_hold_never_ends_before_one_of_its_guards_leases,
    max_hold_ends_the_hold_on_time,
);

/// The default watchdog lease.
const WATCHDOG_LEASE: Duration = Duration::from_secs(30);

/// Asserts `attempt` was refused with a timeout naming one of `kind`'s locks, with the
/// holder's remaining lease (here a fresh watchdog lease, so over 20 s) as the hint.
fn assert_refused<T: fmt::Debug>(
    kind: Kind,
    name: &str,
    attempt: Result<T, LockError>,
    what: &str,
) {
    match attempt {
        Err(LockError::Timeout { key, retry_after }) => {
            assert!(kind.parts(name).contains(&key), "{what}: names {key:?}");
            assert!(
                retry_after > Duration::from_secs(20) && retry_after <= WATCHDOG_LEASE,
                "{what}: retry after {retry_after:?}"
            );
        }
        other => panic!("{what}: expected a timeout, got {other:?}"),
    }
}

/// Asserts that one attempt of `kind` by a fresh holder of `client` gets the lock at
/// once, and gives it back.
async fn assert_free_for(kind: Kind, client: &LockClient, name: &str, what: &str) {
    let fresh = Opts::default();
    take_and_release(what, kind.try_acquire(client, name, &fresh, Duration::ZERO)).await;
}

/// What `eventually` reports when readers are still refused: the last refusal seen.
#[derive(Default)]
struct LastRefusal(Mutex<String>);

impl fmt::Display for LastRefusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "no writer registration left: readers are admitted (last refusal: {})",
            self.0.lock().unwrap()
        )
    }
}

/// Promise: while one holder holds the lock, another holder (of another client, or of
/// the same client) is refused at once with the remaining lease as the hint; once it is
/// released, the other gets it at once.
async fn excludes_another_holder(env: Env, kind: Kind) {
    let a = env.client().await;
    let b = env.client().await;
    let held = kind.acquire(&a, "excl", &Opts::default()).await.unwrap();
    let rival = kind.rival();
    for (client, who) in [(&b, "another client"), (&a, "the same client")] {
        let attempt = rival
            .try_acquire(client, "excl", &Opts::default(), Duration::ZERO)
            .await;
        assert_refused(kind, "excl", attempt, &format!("{rival:?} of {who}"));
    }
    if kind == Kind::Read {
        assert_free_for(Kind::Read, &b, "excl", "another reader joins").await;
    }
    assert_eq!(kind.hold_count(&a, "excl", held.holder()).await, 1);
    assert!(kind.is_locked(&b, "excl").await);
    held.release().await.unwrap();
    assert!(!kind.is_locked(&b, "excl").await);
    assert_free_for(rival, &b, "excl", "free after the release").await;
}

/// Promise: one holder takes the lock again without waiting, as often as it likes, with
/// the same fencing token; each release gives back one entry, and the lock excludes
/// others until the last one.
async fn reenters_per_holder(env: Env, kind: Kind) {
    let client = env.client().await;
    let other = env.client().await;
    let me = client.holder();
    let mine = Opts::holder(&me);
    let first = kind.acquire(&client, "reentry", &mine).await.unwrap();
    let second = kind
        .try_acquire(&client, "reentry", &mine, Duration::ZERO)
        .await
        .expect("the holder re-enters without waiting");
    let third = kind.acquire(&client, "reentry", &mine).await.unwrap();
    assert_eq!(kind.hold_count(&client, "reentry", &me).await, 3);
    assert_eq!(
        kind.hold_count(&client, "reentry", &client.holder()).await,
        0
    );
    assert_eq!(first.tokens(), second.tokens());
    assert_eq!(first.tokens(), third.tokens());

    third.release().await.unwrap();
    second.release().await.unwrap();
    assert_eq!(kind.hold_count(&client, "reentry", &me).await, 1);
    let attempt = kind
        .rival()
        .try_acquire(&other, "reentry", &Opts::default(), Duration::ZERO)
        .await;
    assert_refused(kind, "reentry", attempt, "another holder, one entry left");
    first.release().await.unwrap();
    assert!(!kind.is_locked(&client, "reentry").await);
}

/// Promise: a hold with a fixed lease ends with the lease (by the store's clock too: on
/// Redis the keys expire), the guard says it is lost, another holder gets the lock, and
/// the late release is refused without freeing the new holder's lock.
async fn fixed_lease_expires(env: Env, kind: Kind) {
    let client = env.client().await;
    let other = env.client().await;
    let lease = Duration::from_millis(200);
    let held = kind
        .acquire(&client, "lease", &Opts::lease(lease))
        .await
        .unwrap();
    if env.is_redis() {
        for key in kind.redis_keys(&client, "lease") {
            let ttl = env.server().pttl(&key);
            assert!(ttl > 50 && ttl <= 200, "{key}: PTTL {ttl}");
        }
    }
    assert!(!held.is_lost());
    tokio::time::sleep(lease + Duration::from_millis(100)).await;
    assert!(
        !kind.is_locked(&client, "lease").await,
        "held past its lease"
    );
    assert!(held.is_lost(), "the guard does not know its lease ran out");
    let next = kind
        .rival()
        .try_acquire(&other, "lease", &Opts::default(), Duration::ZERO)
        .await
        .expect("free after the lease");
    match held.release().await {
        Err(LockError::Lost { key }) => assert!(kind.parts("lease").contains(&key), "{key}"),
        other => panic!("a release after the lease: expected Lost, got {other:?}"),
    }
    assert_eq!(
        kind.rival()
            .hold_count(&other, "lease", next.holder())
            .await,
        1,
        "a late release freed another holder's lock"
    );
    next.release().await.unwrap();
}

/// Promise: a hold without a lease is kept by the watchdog past three leases (one entry
/// per lock it holds), and once released it is no longer renewed: it stays free.
async fn watchdog_keeps_a_hold_past_three_leases_and_stops_after_release(env: Env, kind: Kind) {
    // Renewed every third of it: a 1 s lease rides over stalls of a loaded machine up to
    // ~600 ms (a 300 ms one lost its hold to a 200 ms stall).
    let lease = Duration::from_secs(1);
    let client = env.client_with(|b| b.watchdog_timeout(lease)).await;
    let other = env.client_with(|b| b.watchdog_timeout(lease)).await;
    let held = kind
        .acquire(&client, "watched", &Opts::default())
        .await
        .unwrap();
    assert_eq!(client.stats().watched_locks, kind.parts("watched").len());
    tokio::time::sleep(lease * 4).await;
    assert!(!held.is_lost(), "lost although the watchdog renews it");
    assert_eq!(kind.hold_count(&client, "watched", held.holder()).await, 1);
    if env.is_redis() {
        for key in kind.redis_keys(&client, "watched") {
            let ttl = env.server().pttl(&key);
            assert!(ttl > 0 && ttl <= 1_000, "{key}: PTTL {ttl}");
        }
    }
    let attempt = kind
        .rival()
        .try_acquire(&other, "watched", &Opts::default(), Duration::ZERO)
        .await;
    assert!(
        matches!(attempt, Err(LockError::Timeout { .. })),
        "another holder past three leases: {attempt:?}"
    );

    held.release().await.unwrap();
    assert_eq!(client.stats().watched_locks, 0);
    assert!(!kind.is_locked(&client, "watched").await);
    // No renewal may bring it back.
    tokio::time::sleep(lease).await;
    assert!(!kind.is_locked(&client, "watched").await);
}

/// Promise: a guard dropped without `release().await` frees the lock, and a waiter (of
/// another client) is woken by that, long before the holder's 30 s lease would end.
async fn dropped_guard_releases_and_wakes_a_waiter(env: Env, kind: Kind) {
    let client = env.client().await;
    let other = env.client().await;
    let held = kind
        .acquire(&client, "dropped", &Opts::default())
        .await
        .unwrap();
    let waiter = spawn_timed(async move {
        let wait = Duration::from_secs(5);
        kind.rival()
            .try_acquire(&other, "dropped", &Opts::default(), wait)
            .await
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!waiter.is_finished(), "the waiter got a held lock");
    let dropped_at = Instant::now();
    drop(held);
    let (got, acquired_at) = waiter.await.unwrap();
    let got = got.expect("the waiter gets the dropped lock");
    let handoff = acquired_at.saturating_duration_since(dropped_at);
    assert!(handoff < Duration::from_secs(1), "handoff took {handoff:?}");
    drop(got);
    eventually(
        Duration::from_secs(1),
        "the waiter's dropped guard released too",
        || async { !kind.is_locked(&client, "dropped").await },
    )
    .await;
}

/// Promise: acquires cut off at any point (before the request, while waiting, after the
/// reply; on Redis also with the request surely in flight) on free locks and on busy ones
/// leave nothing behind once the background work has settled: no hold, no queued waiter,
/// no writer registration, no watchdog entry, no waited channel, and on Redis no
/// subscription and no key but the fencing keys.
async fn cancelled_acquires_leave_nothing_behind(env: Env, kind: Kind) {
    let client = env.client().await;
    let other = env.client().await;
    let names: Vec<String> = (0..5)
        .map(|k| format!("cancel:{k}"))
        .chain(["cancel:busy".to_owned()])
        .collect();
    let fresh = Opts::default();
    for i in 0..300u64 {
        let cut = Duration::from_micros((i * 7) % 400);
        let name = &names[(i % 5) as usize];
        let _ = tokio::time::timeout(cut, kind.acquire(&client, name, &fresh)).await;
        if i % 50 == 0 {
            // Busy: the cut acquire is waiting (subscribed, queued or registered).
            let busy = kind
                .blocker()
                .acquire(&other, "cancel:busy", &fresh)
                .await
                .unwrap();
            let waiting = kind.acquire(&client, "cancel:busy", &fresh);
            let _ = tokio::time::timeout(Duration::from_millis(20), waiting).await;
            busy.release().await.unwrap();
        }
    }
    if env.is_redis() {
        // Cut with the attempt certainly in flight: sent to a stopped server, dropped,
        // and only then run (and answered, to nobody) once the server resumes. Once on
        // the busy lock, once on a free one.
        let busy = kind
            .blocker()
            .acquire(&other, "cancel:busy", &fresh)
            .await
            .unwrap();
        for name in ["cancel:busy", "cancel:0"] {
            env.server().pause();
            let in_flight = kind.acquire(&client, name, &fresh);
            let cut = tokio::time::timeout(Duration::from_millis(100), in_flight).await;
            env.server().resume();
            assert!(
                cut.is_err(),
                "{name}: answered by a stopped server: {cut:?}"
            );
        }
        busy.release().await.unwrap();
    }
    eventually(Duration::from_secs(5), "nothing left behind", || async {
        for name in &names {
            if kind.is_locked(&client, name).await || kind.queued(&client, name).await > 0 {
                return false;
            }
        }
        let stats = client.stats();
        stats.watched_locks == 0 && stats.waited_channels == 0
    })
    .await;
    if matches!(kind, Kind::Read | Kind::Write) {
        // A writer registration left behind would refuse readers (for 30 s).
        let refusal = LastRefusal::default();
        eventually(Duration::from_secs(5), &refusal, || async {
            for name in &names {
                match Kind::Read
                    .try_acquire(&other, name, &Opts::default(), Duration::ZERO)
                    .await
                {
                    Ok(reader) => reader.release().await.unwrap(),
                    Err(e) => {
                        *refusal.0.lock().unwrap() = e.to_string();
                        return false;
                    }
                }
            }
            true
        })
        .await;
    }
    if env.is_redis() {
        let server = env.server();
        eventually(Duration::from_secs(5), "no subscription left", || async {
            server.channels().is_empty()
        })
        .await;
        eventually(
            Duration::from_secs(5),
            "no key but fencing keys",
            || async {
                let keys = server.keys_matching("lockwarden:*");
                keys.iter().all(|k| k.ends_with(":fence"))
            },
        )
        .await;
    }
}

/// Promise: every fresh hold gets a fencing token greater than every one before it,
/// from whichever client, and (on Redis) even when the store lost its token counter.
async fn fencing_tokens_strictly_increase(env: Env, kind: Kind) {
    let a = env.client().await;
    let b = env.client().await;
    let mut last = vec![0; kind.parts("fence").len()];
    for i in 0..20 {
        let client = if i % 2 == 0 { &a } else { &b };
        let held = kind
            .acquire(client, "fence", &Opts::default())
            .await
            .unwrap();
        let tokens = held.tokens();
        assert!(
            tokens.iter().zip(&last).all(|(now, before)| now > before),
            "round {i}: tokens {tokens:?} after {last:?}"
        );
        last = tokens;
        held.release().await.unwrap();
        if env.is_redis() && i % 5 == 4 {
            // The counter keys lost (failover, eviction): tokens must still go up.
            for key in kind.redis_keys(&a, "fence") {
                let _: i64 = env
                    .server()
                    .query(&["DEL", &format!("{key}:fence")])
                    .unwrap();
            }
        }
    }
}

/// Promise: an acquire that cannot get the lock gives up when its wait budget is spent,
/// not earlier and not much later, and leaves no subscription or queued place behind.
async fn wait_budget_is_honoured(env: Env, kind: Kind) {
    let client = env.client().await;
    let other = env.client().await;
    let _held = kind
        .blocker()
        .acquire(&other, "budget", &Opts::default())
        .await
        .unwrap();
    let budget = Duration::from_millis(300);
    let started = Instant::now();
    let result = kind
        .try_acquire(&client, "budget", &Opts::default(), budget)
        .await;
    let waited = started.elapsed();
    assert!(
        matches!(result, Err(LockError::Timeout { .. })),
        "{result:?}"
    );
    assert!(waited >= budget, "gave up early: {waited:?}");
    assert!(
        waited < budget + Duration::from_millis(250),
        "overran: {waited:?}"
    );
    assert_eq!(client.stats().waited_channels, 0);
    assert_eq!(kind.queued(&client, "budget").await, 0);
}

/// Promise: an operator's force-unlock of any kind frees the lock and wakes that kind's
/// waiters at once (long before the holder's 30 s lease or their own retry, so only the
/// notice explains it), and a holder kept by the watchdog learns of it through `lost()`
/// within one renewal period.
async fn force_unlock_wakes_waiters_at_once_and_the_holder_learns_it(env: Env, kind: Kind) {
    let holder = env.client().await;
    let other = env.client().await;
    for waiting in [kind.rival(), kind.blocker()] {
        let stuck = kind
            .acquire(&holder, "stuck", &Opts::default())
            .await
            .unwrap();
        let waiter = spawn_timed({
            let other = other.clone();
            async move {
                let wait = Duration::from_secs(10);
                waiting
                    .try_acquire(&other, "stuck", &Opts::default(), wait)
                    .await
            }
        });
        tokio::time::sleep(Duration::from_millis(200)).await; // the waiter subscribes
        if waiter.is_finished() {
            // A reader does not wait for a reader: nothing to wake.
            assert!(
                kind == Kind::Read && waiting == Kind::Read,
                "{waiting:?} got a held lock"
            );
            drop(stuck);
            continue;
        }
        let unlocked_at = Instant::now();
        assert!(
            kind.force_unlock(&holder, "stuck").await,
            "there was a lock"
        );
        let (got, acquired_at) = waiter.await.unwrap();
        let woken = acquired_at.saturating_duration_since(unlocked_at);
        let got = got.unwrap_or_else(|e| panic!("{waiting:?} waiter after force-unlock: {e}"));
        assert!(
            woken < Duration::from_secs(1),
            "{waiting:?} woken after {woken:?}"
        );
        drop(got);
        drop(stuck);
        eventually(Duration::from_secs(2), "all released", || async {
            !kind.is_locked(&holder, "stuck").await
        })
        .await;
    }

    // The holder: a short watchdog lease, renewed every 200 ms (in-process, a store of
    // its own: the env's shared one keeps its first client's settings).
    let short =
        |b: lockwarden_core::LockClientBuilder| b.watchdog_timeout(Duration::from_millis(600));
    let watched = match env.is_redis() {
        true => env.client_with(short).await,
        false => short(LockClient::builder()).in_memory(),
    };
    let held = kind
        .acquire(&watched, "forced", &Opts::default())
        .await
        .unwrap();
    assert!(kind.force_unlock(&watched, "forced").await);
    let forced_at = Instant::now();
    eventually(
        Duration::from_secs(2),
        "the holder learns it lost the lock",
        || async { held.guards().iter().all(|g| g.is_lost()) },
    )
    .await;
    let learnt = forced_at.elapsed();
    assert!(
        learnt <= Duration::from_millis(1000),
        "learnt after {learnt:?}"
    );
    assert!(
        !kind.force_unlock(&watched, "forced").await,
        "nothing left to unlock"
    );

    // A release right after a force-unlock (before any renewal could tell) is told the
    // hold is gone: a force-unlock moves the fencing token on, so it is not taken for
    // this release having run already.
    let held = kind
        .acquire(&holder, "forced-release", &Opts::default())
        .await
        .unwrap();
    assert!(kind.force_unlock(&holder, "forced-release").await);
    let released = held.release().await;
    assert!(
        matches!(
            released,
            Err(LockError::NotHeld { .. } | LockError::Lost { .. })
        ),
        "{kind:?}: {released:?}"
    );
}

/// Promise: a re-entry never shortens the hold it re-enters. The scenario: a holder takes
/// the lock with the watchdog (30 s lease), re-enters it with a 300 ms lease and releases
/// the inner hold; 1.5 s later the lock must still be its alone (a re-entry that set the
/// expiry to its own 300 ms would let another client take the lock while the outer guard
/// still reported it held).
async fn a_short_reentry_never_cuts_a_longer_hold(env: Env, kind: Kind) {
    let client = env.client().await;
    let other = env.client().await;
    let me = client.holder();
    let outer = kind
        .acquire(&client, "kept", &Opts::holder(&me))
        .await
        .unwrap();
    let short = Opts {
        holder: Some(me.clone()),
        lease: Some(Duration::from_millis(300)),
        ..Opts::default()
    };
    let inner = kind.acquire(&client, "kept", &short).await.unwrap();
    inner.release().await.unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let fresh = Opts::default();
    let rival = kind
        .rival()
        .try_acquire(&other, "kept", &fresh, Duration::ZERO)
        .await;
    assert!(
        matches!(rival, Err(LockError::Timeout { .. })),
        "another holder got the lock under the outer hold: {rival:?}"
    );
    assert!(
        outer.guards().iter().all(|g| !g.is_lost()),
        "the outer hold is intact"
    );
    assert_eq!(kind.hold_count(&client, "kept", &me).await, 1);
    outer.release().await.unwrap();
    assert!(!kind.is_locked(&client, "kept").await);
}

/// Promise: a hold never ends before one of its guards' leases (its expiry is the latest
/// any of its guards asked for). The two sequences: a watchdog hold re-entered
/// with a longer fixed lease, or a fixed-lease hold re-entered through the watchdog; the
/// watchdog renews (which set the expiry to its own, shorter lease), then its guard ends.
/// Before the fix the hold ran out a watchdog lease later, under the fixed-lease guard,
/// which still reported it held.
async fn a_hold_never_ends_before_one_of_its_guards_leases(env: Env, kind: Kind) {
    /// Renewed every 300 ms.
    const WATCHDOG: Duration = Duration::from_millis(900);
    /// Well past the two watchdog leases the test waits after the watchdog guard ends.
    const FIXED: Duration = Duration::from_secs(5);
    let client = env.client_with(|b| b.watchdog_timeout(WATCHDOG)).await;
    let other = env.client().await;
    for watchdog_outer in [true, false] {
        let name = format!("longest-{watchdog_outer}");
        let me = client.holder();
        let watched = Opts::holder(&me);
        let fixed = Opts {
            holder: Some(me.clone()),
            lease: Some(FIXED),
            ..Opts::default()
        };
        let (first, second) = match watchdog_outer {
            true => (watched, fixed),
            false => (fixed, watched),
        };
        let outer = kind.acquire(&client, &name, &first).await.unwrap();
        let inner = kind.acquire(&client, &name, &second).await.unwrap();
        let taken = Instant::now();
        // The watchdog renews its hold a few times, then its guard ends.
        tokio::time::sleep(WATCHDOG).await;
        let (watched, fixed) = match watchdog_outer {
            true => (outer, inner),
            false => (inner, outer),
        };
        watched.release().await.unwrap();
        tokio::time::sleep(2 * WATCHDOG).await;
        let what = format!("{kind:?}, watchdog outer: {watchdog_outer}");
        assert!(
            taken.elapsed() < FIXED - Duration::from_secs(1),
            "{what}: the test took too long to tell"
        );
        let rival = kind
            .rival()
            .try_acquire(&other, &name, &Opts::default(), Duration::ZERO)
            .await;
        assert!(
            matches!(rival, Err(LockError::Timeout { .. })),
            "{what}: another holder got the lock inside the fixed lease: {rival:?}"
        );
        assert!(
            !fixed.is_lost(),
            "{what}: the fixed lease's guard is intact"
        );
        assert_eq!(kind.hold_count(&client, &name, &me).await, 1, "{what}");
        fixed.release().await.unwrap();
        assert!(!kind.is_locked(&client, &name).await, "{what}");
    }
}

/// Promise: a hold the watchdog keeps ends at `max_hold` while its guard still lives, and
/// the guard learns it; in the store too when `max_hold` is shorter than the watchdog
/// lease (a renewal only ever extends a hold, so the first lease is cut to `max_hold`).
async fn max_hold_ends_the_hold_on_time(env: Env, kind: Kind) {
    let max_hold = Duration::from_millis(1_500);
    let client = env
        .client_with(|b| b.watchdog_timeout(Duration::from_secs(3)))
        .await;
    let other = env.client().await;
    let started = Instant::now();
    let held = kind
        .acquire(&client, "capped", &Opts::max_hold(max_hold))
        .await
        .unwrap();
    eventually(
        Duration::from_secs(5),
        "lost once max_hold ran out",
        || async { held.is_lost() },
    )
    .await;
    assert!(started.elapsed() >= max_hold, "lost before max_hold");
    // Left in the store by then: the last renewal's latency at most, not the 1.5 s of
    // a first lease of 3 s.
    eventually(
        Duration::from_secs(1),
        "free soon after max_hold",
        || async { !kind.is_locked(&client, "capped").await },
    )
    .await;
    assert_eq!(client.stats().watched_locks, 0);
    let next = kind
        .rival()
        .try_acquire(&other, "capped", &Opts::default(), Duration::ZERO)
        .await
        .expect("free after max_hold");
    assert!(
        matches!(held.release().await, Err(LockError::Lost { .. })),
        "a release after max_hold must answer Lost"
    );
    next.release().await.unwrap();
}
