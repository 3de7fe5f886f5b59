//! The plain lock's promises, checked against both stores: the in-process one and a
//! real `redis-server` (see `common::Env`). The promises every kind of lock makes are
//! also checked for the plain lock in `kind_conformance.rs` (the wait budget only there).

mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{finishes, Env};
use lockwarden_core::{Holder, KeyError, LockError};
use lockwarden_testkit::eventually;

conformance!(
    excludes_other_holders,
    reentry_counts_per_holder,
    fixed_lease_expires,
    watchdog_keeps_lock_past_three_leases_and_stops_after_release,
    lost_signal_fires_when_lock_is_force_unlocked,
    zero_budget_is_one_attempt,
    waiter_is_woken_by_release_not_by_lease,
    dropped_guard_releases_and_wakes_waiter,
    cancelled_acquires_leave_nothing_behind,
    release_of_a_lock_no_longer_held_is_typed_error,
    fencing_tokens_strictly_increase,
    invalid_keys_are_rejected,
    with_lock_releases_on_error_and_panic,
    max_hold_caps_the_watchdog,
    holder_scope_reenters_across_tasks,
    counter_stress_has_no_lost_update,
);

async fn excludes_other_holders(env: Env) {
    let a = env.client().await;
    let b = env.client().await;
    let guard = a.acquire("excl").await.unwrap();
    match b.try_acquire("excl", Duration::ZERO).await {
        Err(LockError::Timeout { key, retry_after }) => {
            assert_eq!(key, "excl");
            assert!(retry_after > Duration::from_secs(20), "{retry_after:?}");
        }
        other => panic!("expected Timeout, got {other:?}"),
    }
    assert!(a.lock("excl").is_held_by(guard.holder()).await.unwrap());
    guard.release().await.unwrap();
    let again = b.try_acquire("excl", Duration::ZERO).await.unwrap();
    again.release().await.unwrap();
}

async fn reentry_counts_per_holder(env: Env) {
    let client = env.client().await;
    let me = client.holder();
    let lock = client.lock("reentry").holder(&me);
    let first = lock.acquire().await.unwrap();
    let second = lock.acquire().await.unwrap();
    let third = lock.acquire().await.unwrap();
    assert_eq!(client.lock("reentry").hold_count(&me).await.unwrap(), 3);
    assert_eq!(first.fencing_token(), third.fencing_token());
    assert_eq!(
        client
            .lock("reentry")
            .hold_count(&client.holder())
            .await
            .unwrap(),
        0
    );

    third.release().await.unwrap();
    second.release().await.unwrap();
    assert!(client.lock("reentry").is_locked().await.unwrap());
    assert!(
        client.try_acquire("reentry", Duration::ZERO).await.is_err(),
        "another holder must still be excluded"
    );
    first.release().await.unwrap();
    assert!(!client.lock("reentry").is_locked().await.unwrap());
}

async fn fixed_lease_expires(env: Env) {
    let client = env.client().await;
    let guard = client
        .lock("lease")
        .lease(Duration::from_millis(200))
        .acquire()
        .await
        .unwrap();
    let ttl = client.lock("lease").remaining_ttl().await.unwrap().unwrap();
    assert!(ttl <= Duration::from_millis(200) && ttl > Duration::from_millis(50));
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!client.lock("lease").is_locked().await.unwrap());
    assert!(guard.is_lost());
    let other = client
        .try_acquire("lease", Duration::ZERO)
        .await
        .expect("free after the lease");
    assert!(matches!(guard.release().await, Err(LockError::Lost { .. })));
    assert!(
        client
            .lock("lease")
            .is_held_by(other.holder())
            .await
            .unwrap(),
        "a late release must not free another holder's lock"
    );
    other.release().await.unwrap();
}

async fn watchdog_keeps_lock_past_three_leases_and_stops_after_release(env: Env) {
    // Renewed every third of it: a 1 s lease rides over stalls of a loaded machine up to
    // ~600 ms (a 300 ms one lost its hold to a 200 ms stall).
    let lease = Duration::from_secs(1);
    let client = env.client_with(|b| b.watchdog_timeout(lease)).await;
    let guard = client.acquire("watched").await.unwrap();
    assert_eq!(client.stats().watched_locks, 1);
    tokio::time::sleep(lease * 4).await;
    assert!(!guard.is_lost());
    let ttl = client
        .lock("watched")
        .remaining_ttl()
        .await
        .unwrap()
        .unwrap();
    assert!(ttl > Duration::ZERO && ttl <= lease, "{ttl:?}");
    guard.release().await.unwrap();
    assert_eq!(client.stats().watched_locks, 0);
    assert!(!client.lock("watched").is_locked().await.unwrap());
    // No renewal may bring it back.
    tokio::time::sleep(lease).await;
    assert!(!client.lock("watched").is_locked().await.unwrap());
}

async fn lost_signal_fires_when_lock_is_force_unlocked(env: Env) {
    let lease = Duration::from_secs(3);
    let client = env.client_with(|b| b.watchdog_timeout(lease)).await;
    let admin = env.client().await;
    let guard = client.acquire("forced").await.unwrap();
    assert!(admin.lock("forced").force_unlock().await.unwrap());
    // A fixed lease, so the only watchdog entry to count is the victim's.
    let thief = admin
        .lock("forced")
        .lease(Duration::from_secs(30))
        .try_acquire(Duration::ZERO)
        .await
        .unwrap();
    // Found out at the next renewal: within one renewal period (lease / 3, 1 s) plus
    // slack for a loaded machine, and well before the lease would have run out.
    tokio::time::timeout(Duration::from_secs(2), guard.lost())
        .await
        .expect("lost() must resolve at the next renewal, not at the lease's end");
    assert!(guard.is_lost());
    assert_eq!(client.stats().watched_locks, 0);
    assert!(matches!(guard.release().await, Err(LockError::Lost { .. })));
    assert!(admin
        .lock("forced")
        .is_held_by(thief.holder())
        .await
        .unwrap());
    thief.release().await.unwrap();
    assert!(!admin.lock("forced").force_unlock().await.unwrap());
}

async fn zero_budget_is_one_attempt(env: Env) {
    let client = env.client().await;
    let _held = client.acquire("zero").await.unwrap();
    let started = Instant::now();
    assert!(client.try_acquire("zero", Duration::ZERO).await.is_err());
    assert!(started.elapsed() < Duration::from_millis(200));
    assert_eq!(
        client.stats().waited_channels,
        0,
        "no subscription for one attempt"
    );
}

async fn waiter_is_woken_by_release_not_by_lease(env: Env) {
    let holder = env.client().await;
    let waiter = env.client().await;
    // Watchdog lease 30 s: waking on the lease would take ~30 s.
    let guard = holder.acquire("wake").await.unwrap();
    let wait = tokio::spawn(async move {
        let g = waiter.try_acquire("wake", Duration::from_secs(10)).await;
        (g.map(|g| (Instant::now(), g)), waiter)
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let released_at = Instant::now();
    guard.release().await.unwrap();
    let (got, _waiter) = wait.await.unwrap();
    let (acquired_at, g) = got.expect("waiter acquires after release");
    let handoff = acquired_at - released_at;
    assert!(handoff < Duration::from_secs(1), "handoff took {handoff:?}");
    g.release().await.unwrap();
}

async fn dropped_guard_releases_and_wakes_waiter(env: Env) {
    let client = env.client().await;
    let guard = client.acquire("dropped").await.unwrap();
    let c = client.clone();
    let wait = tokio::spawn(async move { c.try_acquire("dropped", Duration::from_secs(5)).await });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let dropped_at = Instant::now();
    drop(guard);
    let g = wait.await.unwrap().expect("waiter gets the dropped lock");
    assert!(dropped_at.elapsed() < Duration::from_secs(1));
    drop(g);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!client.lock("dropped").is_locked().await.unwrap());
}

async fn cancelled_acquires_leave_nothing_behind(env: Env) {
    let client = env.client().await;
    let other = env.client().await;
    // Cut acquires off at every point from before the request to after the reply,
    // on free locks and on busy ones (where the future is subscribed and waiting).
    for i in 0..300u64 {
        let cut = Duration::from_micros((i * 7) % 400);
        let _ = tokio::time::timeout(cut, client.acquire(format!("cancel:{}", i % 5))).await;
        if i % 50 == 0 {
            let busy = other.acquire("cancel:busy").await.unwrap();
            let _ = tokio::time::timeout(Duration::from_millis(20), client.acquire("cancel:busy"))
                .await;
            busy.release().await.unwrap();
        }
    }
    // Abandoned acquires are finished and undone in the background.
    eventually(Duration::from_secs(5), "no lock left held", || async {
        let mut held = false;
        for k in 0..5 {
            held |= client
                .lock(format!("cancel:{k}"))
                .is_locked()
                .await
                .unwrap();
        }
        !held
    })
    .await;
    assert!(!client.lock("cancel:busy").is_locked().await.unwrap());
    let stats = client.stats();
    assert_eq!(stats.watched_locks, 0);
    assert_eq!(stats.waited_channels, 0);
    if env.is_redis() {
        eventually(Duration::from_secs(5), "no subscription left", || async {
            env.server().channels().is_empty()
        })
        .await;
    }
}

async fn release_of_a_lock_no_longer_held_is_typed_error(env: Env) {
    let client = env.client().await;
    let admin = env.client().await;
    let guard = client
        .lock("notheld")
        .lease(Duration::from_secs(30))
        .acquire()
        .await
        .unwrap();
    admin.lock("notheld").force_unlock().await.unwrap();
    let next = admin.acquire("notheld").await.unwrap();
    match guard.release().await {
        Err(LockError::NotHeld { key }) => assert_eq!(key, "notheld"),
        other => panic!("expected NotHeld, got {other:?}"),
    }
    assert!(admin
        .lock("notheld")
        .is_held_by(next.holder())
        .await
        .unwrap());
    next.release().await.unwrap();
}

async fn fencing_tokens_strictly_increase(env: Env) {
    let client = env.client().await;
    let mut last = 0;
    for i in 0..50 {
        let guard = client.acquire("fence").await.unwrap();
        let token = guard.fencing_token();
        assert!(token > last, "token {token} after {last} at round {i}");
        last = token;
        guard.release().await.unwrap();
        if env.is_redis() && i % 10 == 9 {
            // The counter key lost (failover, eviction): tokens must still go up.
            let _: i64 = env
                .server()
                .query(&["DEL", "lockwarden:{fence}:fence"])
                .unwrap();
        }
    }
}

async fn invalid_keys_are_rejected(env: Env) {
    let client = env.client().await;
    let long = "k".repeat(256);
    for (name, expected) in [
        ("", KeyError::Empty),
        (long.as_str(), KeyError::TooLong { len: 256, max: 255 }),
        ("a\nb", KeyError::ControlCharacter { at: 1 }),
        ("\0", KeyError::ControlCharacter { at: 0 }),
    ] {
        match client.try_acquire(name, Duration::ZERO).await {
            Err(LockError::InvalidKey(e)) => assert_eq!(e, expected, "{name:?}"),
            other => panic!("{name:?}: expected InvalidKey, got {other:?}"),
        }
    }
    if env.is_redis() {
        let keys = env.server().keys_matching("*");
        assert!(keys.is_empty(), "rejected keys touched Redis: {keys:?}");
    }
}

async fn with_lock_releases_on_error_and_panic(env: Env) {
    let client = env.client().await;
    let out: Result<u32, &str> = client
        .with_lock("closure", Duration::from_secs(1), |info| async move {
            assert!(info.fencing_token() > 0);
            Err("handler failed")
        })
        .await
        .unwrap();
    assert_eq!(out, Err("handler failed"));
    assert!(!client.lock("closure").is_locked().await.unwrap());

    let c = client.clone();
    let panicked = tokio::spawn(async move {
        c.with_lock("closure", Duration::from_secs(1), |_| async {
            panic!("handler panicked")
        })
        .await
    })
    .await;
    assert!(panicked.unwrap_err().is_panic());
    let next = client
        .try_acquire("closure", Duration::from_secs(1))
        .await
        .expect("free after the panic");
    next.release().await.unwrap();
}

async fn max_hold_caps_the_watchdog(env: Env) {
    // A renewal at 1 s (a third of the lease) is capped at max_hold: 0.5 s more, not 3 s.
    let lease = Duration::from_secs(3);
    let client = env.client_with(|b| b.watchdog_timeout(lease)).await;
    let guard = client
        .lock("capped")
        .max_hold(Duration::from_millis(1_500))
        .acquire()
        .await
        .unwrap();
    tokio::time::timeout(Duration::from_secs(5), guard.lost())
        .await
        .expect("lost once max_hold has run out");
    // Lost is signalled when the lease ends by the client's clock, which starts before
    // Redis applies it: the lock may outlive the signal by that renewal's latency (over
    // 150 ms on a loaded machine). Uncapped, the renewal would leave 2.5 s.
    let left = client.lock("capped").remaining_ttl().await.unwrap();
    assert!(
        left.is_none_or(|t| t < Duration::from_secs(1)),
        "still held {left:?} after lost: renewed past max_hold"
    );
    assert_eq!(client.stats().watched_locks, 0);
}

async fn holder_scope_reenters_across_tasks(env: Env) {
    let client = env.client().await;
    let me = client.holder();
    let outer = client.lock("scoped").holder(&me).acquire().await.unwrap();
    let c = client.clone();
    let expected = me.clone();
    let inner = tokio::spawn(me.clone().scope(async move {
        assert_eq!(Holder::current(), Some(expected));
        c.try_acquire("scoped", Duration::ZERO).await
    }))
    .await
    .unwrap()
    .expect("the same holder re-enters");
    assert_eq!(client.lock("scoped").hold_count(&me).await.unwrap(), 2);
    inner.release().await.unwrap();
    outer.release().await.unwrap();
    assert!(!client.lock("scoped").is_locked().await.unwrap());
}

async fn counter_stress_has_no_lost_update(env: Env) {
    const TASKS: usize = 16;
    const CLIENTS: usize = 4;
    const TOTAL: u64 = 2_000;
    let memory_counter = Arc::new(AtomicU64::new(0));
    let mut clients = Vec::new();
    for _ in 0..CLIENTS {
        clients.push(env.client().await);
    }
    let url = env.server.as_ref().map(|s| s.url());
    let mut tasks = Vec::new();
    for t in 0..TASKS {
        let client = clients[t % CLIENTS].clone();
        let memory_counter = memory_counter.clone();
        let url = url.clone();
        tasks.push(tokio::spawn(async move {
            let mut redis = match url {
                Some(url) => Some(
                    ::redis::Client::open(url)
                        .unwrap()
                        .get_multiplexed_async_connection()
                        .await
                        .unwrap(),
                ),
                None => None,
            };
            for _ in 0..TOTAL / TASKS as u64 {
                let guard = client
                    .try_acquire("counter", Duration::from_secs(30))
                    .await
                    .unwrap();
                // A deliberately non-atomic read-modify-write.
                match &mut redis {
                    Some(conn) => {
                        let v: Option<u64> = ::redis::cmd("GET")
                            .arg("counter")
                            .query_async(conn)
                            .await
                            .unwrap();
                        let _: () = ::redis::cmd("SET")
                            .arg("counter")
                            .arg(v.unwrap_or(0) + 1)
                            .query_async(conn)
                            .await
                            .unwrap();
                    }
                    None => {
                        let v = memory_counter.load(Ordering::SeqCst);
                        tokio::task::yield_now().await;
                        memory_counter.store(v + 1, Ordering::SeqCst);
                    }
                }
                guard.release().await.unwrap();
            }
        }));
    }
    for task in tasks {
        finishes(Duration::from_secs(120), "stress finished in time", task).await;
    }
    let total = match &env.server {
        Some(server) => server.query::<u64>(&["GET", "counter"]).unwrap(),
        None => memory_counter.load(Ordering::SeqCst),
    };
    assert_eq!(total, TOTAL / TASKS as u64 * TASKS as u64);
}
