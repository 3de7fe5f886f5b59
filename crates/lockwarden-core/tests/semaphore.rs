//! Semaphores (`LockClient::semaphore`) on both stores (see `common::Env`): never more
//! than the capacity; grants in arrival order to as many waiters as a release lets in;
//! all-or-nothing `acquire_many`; leases per permit (fixed, or renewed by the watchdog);
//! dropped guards and cancelled acquires leave nothing; a token per permit hold; the
//! stored capacity and its admin change; force unlock; bad numbers refused with nothing
//! held; a semaphore and a lock of one name keep each other out. On Redis also: a
//! release nobody waits for is plain commands, and a contended semaphore's the script
//! that grants, counted in commands.

mod common;

use std::collections::HashSet;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{finishes, spawn_timed, Env};
use lockwarden_core::{LockClient, LockError, Semaphore, MAX_PERMITS};
use lockwarden_testkit::eventually;

conformance!(
    never_more_than_the_capacity,
    a_release_grants_in_arrival_order,
    a_release_grants_as_many_waiters_as_it_frees,
    one_release_grants_thousands_of_waiters,
    acquire_many_is_all_or_nothing,
    fair_order_holds_back_smaller_requests_and_newcomers,
    the_default_order_lets_smaller_requests_past_a_large_one,
    a_fixed_lease_ends_and_a_waiter_gets_the_permit_then,
    the_watchdog_keeps_permits_past_three_leases,
    a_dropped_guard_gives_its_permit_to_a_waiter,
    cancelled_acquires_leave_nothing_behind,
    every_permit_hold_gets_a_new_token,
    the_wait_budget_is_honoured,
    the_stored_capacity_wins_while_in_use,
    set_capacity_grants_new_room_and_takes_nothing_back,
    force_unlock_frees_every_permit_and_holders_learn_it,
    bad_numbers_are_refused_with_nothing_held,
    a_semaphore_and_a_lock_of_one_name_keep_each_other_out,
    permits_are_not_reentrant,
);

/// Waits until `sem` has `waiting` acquisitions in line (bounded: 5 s).
async fn until_waiting(sem: &Semaphore, waiting: u32) {
    eventually(Duration::from_secs(5), "waiters in line", || async {
        sem.state().await.unwrap().map(|s| s.waiting) == Some(waiting)
    })
    .await;
}

/// Waits until `sem` is idle (bounded: 5 s).
async fn until_idle(sem: &Semaphore) {
    eventually(Duration::from_secs(5), "the semaphore idle", || async {
        sem.state().await.unwrap().is_none()
    })
    .await;
}

/// Promise: 12 tasks of two clients, 10 cycles each on a semaphore of 3, never hold more
/// than 3 at once, and reach 3.
async fn never_more_than_the_capacity(env: Env) {
    let clients = [env.client().await, env.client().await];
    let inside = Arc::new(AtomicU32::new(0));
    let most = Arc::new(AtomicU32::new(0));
    let mut tasks = Vec::new();
    for t in 0..12 {
        let sem = clients[t % 2].semaphore("never-more", 3);
        let (inside, most) = (inside.clone(), most.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..10 {
                let permit = sem
                    .try_acquire(Duration::from_secs(10))
                    .await
                    .expect("permit");
                let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(now, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(2)).await;
                inside.fetch_sub(1, Ordering::SeqCst);
                assert!(!permit.is_lost());
                permit.release().await.expect("release");
            }
        }));
    }
    for task in tasks {
        finishes(Duration::from_secs(60), "a task's cycles", task).await;
    }
    assert_eq!(most.load(Ordering::SeqCst), 3);
    until_idle(&clients[0].semaphore("never-more", 3)).await;
}

/// Promise: waiters get permits in the order they arrived.
async fn a_release_grants_in_arrival_order(env: Env) {
    let client = env.client().await;
    let other = env.client().await;
    let sem = client.semaphore("order", 2);
    let (a, b) = (sem.acquire().await.unwrap(), sem.acquire().await.unwrap());
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let mut waiters = Vec::new();
    for i in 0..4u32 {
        let waiter = [&client, &other][i as usize % 2].semaphore("order", 2);
        let tx = tx.clone();
        waiters.push(tokio::spawn(async move {
            let permit = waiter.try_acquire(Duration::from_secs(10)).await.unwrap();
            tx.send(i).unwrap();
            permit
        }));
        until_waiting(&sem, i + 1).await;
    }
    let state = sem.state().await.unwrap().unwrap();
    assert_eq!((state.capacity, state.in_use, state.waiting), (2, 2, 4));
    let next = |rx: &mut tokio::sync::mpsc::UnboundedReceiver<u32>| {
        let got = rx.try_recv();
        async move { got }
    };
    a.release().await.unwrap();
    let first = tokio::time::timeout(Duration::from_secs(5), rx.recv()).await;
    assert_eq!(first.unwrap(), Some(0));
    b.release().await.unwrap();
    let second = tokio::time::timeout(Duration::from_secs(5), rx.recv()).await;
    assert_eq!(second.unwrap(), Some(1));
    assert!(next(&mut rx).await.is_err(), "a third got in");
    let mut held = Vec::new();
    for w in waiters.drain(..2) {
        held.push(finishes(Duration::from_secs(5), "first two", w).await);
    }
    for permit in held {
        permit.release().await.unwrap();
    }
    for w in waiters {
        let permit = finishes(Duration::from_secs(5), "last two", w).await;
        permit.release().await.unwrap();
    }
    until_idle(&sem).await;
}

/// Promise: a release of k permits wakes as many waiters as those k let in: with 8
/// waiters, releasing 3 of 3 lets 3 in, releasing 1 more lets 1 in, never all of them.
async fn a_release_grants_as_many_waiters_as_it_frees(env: Env) {
    let client = env.client().await;
    let sem = client.semaphore("as-many", 3);
    let three = sem.acquire_many(3).await.unwrap();
    let got = Arc::new(AtomicU32::new(0));
    let mut waiters = Vec::new();
    for _ in 0..8 {
        let (waiter, got) = (sem.clone(), got.clone());
        waiters.push(tokio::spawn(async move {
            let permit = waiter.try_acquire(Duration::from_secs(10)).await.unwrap();
            got.fetch_add(1, Ordering::SeqCst);
            permit
        }));
    }
    until_waiting(&sem, 8).await;
    three.release().await.unwrap();
    eventually(Duration::from_secs(5), "three got in", || async {
        got.load(Ordering::SeqCst) == 3
    })
    .await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(got.load(Ordering::SeqCst), 3, "more than freed got in");
    let state = sem.state().await.unwrap().unwrap();
    assert_eq!((state.in_use, state.waiting), (3, 5));
    let mut holders = Vec::new();
    for w in waiters {
        if w.is_finished() {
            holders.push(w.await.unwrap());
        } else {
            w.abort();
        }
    }
    assert_eq!(holders.len(), 3);
    holders.pop().unwrap().release().await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    // The aborted waiters left the line; what the release freed stays free or went to one.
    for permit in holders {
        permit.release().await.unwrap();
    }
    until_idle(&sem).await;
}

/// Promise: a release that frees 5,000 permits grants all 5,000 waiters at once, each
/// its own hold and token (more than one script call can pass at a time on Redis).
async fn one_release_grants_thousands_of_waiters(env: Env) {
    const MANY: u32 = 5_000;
    const BATCH: u32 = 500;
    let client = env.client().await;
    let sem = client.semaphore("thousands", MANY);
    let all = sem.acquire_many(MANY).await.unwrap();
    // In batches: 5,000 acquires in flight at once on one connection queue behind each
    // other for longer than the command timeout on a loaded machine.
    let mut waiters = Vec::new();
    for batch in 1..=MANY / BATCH {
        waiters.extend((0..BATCH).map(|_| {
            let sem = sem.clone();
            tokio::spawn(async move { sem.try_acquire(Duration::from_secs(60)).await })
        }));
        eventually(Duration::from_secs(30), "a batch in line", || async {
            sem.state().await.unwrap().map(|s| s.waiting) == Some(batch * BATCH)
        })
        .await;
    }
    all.release().await.unwrap();
    let mut permits = Vec::new();
    for w in waiters {
        permits.push(
            finishes(Duration::from_secs(30), "a waiter", w)
                .await
                .unwrap(),
        );
    }
    let state = sem.state().await.unwrap().unwrap();
    assert_eq!((state.in_use, state.waiting), (MANY, 0));
    let tokens: HashSet<_> = permits.iter().map(|p| p.fencing_token()).collect();
    assert_eq!(tokens.len(), MANY as usize, "a token handed out twice");
    for permit in permits {
        permit.release().await.unwrap();
    }
    until_idle(&sem).await;
}

/// Promise: `acquire_many(k)` takes k permits at once or none; it waits while fewer are
/// free and holds nothing meanwhile.
async fn acquire_many_is_all_or_nothing(env: Env) {
    let client = env.client().await;
    let sem = client.semaphore("many", 4);
    let two = sem.acquire_many(2).await.unwrap();
    assert!(matches!(
        sem.try_acquire_many(3, Duration::ZERO).await,
        Err(LockError::Timeout { .. })
    ));
    assert_eq!(
        sem.state().await.unwrap().unwrap().in_use,
        2,
        "a part was taken"
    );
    let three = spawn_timed({
        let sem = sem.clone();
        async move { sem.try_acquire_many(3, Duration::from_secs(10)).await }
    });
    until_waiting(&sem, 1).await;
    assert_eq!(sem.state().await.unwrap().unwrap().in_use, 2);
    two.release().await.unwrap();
    let (three, _) = finishes(Duration::from_secs(5), "the three", three).await;
    let three = three.unwrap();
    assert_eq!(sem.state().await.unwrap().unwrap().in_use, 3);
    let one = sem.try_acquire(Duration::ZERO).await.unwrap();
    three.release().await.unwrap();
    one.release().await.unwrap();
    until_idle(&sem).await;
}

/// Promise: in strict order (`fair`), a waiter for 2 at the head holds back a newcomer and
/// a waiter for 1 behind it, though one permit is free.
async fn fair_order_holds_back_smaller_requests_and_newcomers(env: Env) {
    let client = env.client().await;
    let sem = client.semaphore("fifo", 3).fair();
    let two = sem.acquire_many(2).await.unwrap();
    let big = spawn_timed({
        let sem = sem.clone();
        async move { sem.try_acquire_many(2, Duration::from_secs(10)).await }
    });
    until_waiting(&sem, 1).await;
    let small = spawn_timed({
        let sem = sem.clone();
        async move { sem.try_acquire(Duration::from_secs(10)).await }
    });
    until_waiting(&sem, 2).await;
    assert!(matches!(
        sem.try_acquire(Duration::ZERO).await,
        Err(LockError::Timeout { .. })
    ));
    assert!(!small.is_finished(), "a smaller request went first");
    // One release of two lets both in, in order: the head's 2, then the next one's 1.
    two.release().await.unwrap();
    let (big, _) = finishes(Duration::from_secs(5), "the head", big).await;
    let (small, _) = finishes(Duration::from_secs(5), "the next", small).await;
    big.unwrap().release().await.unwrap();
    small.unwrap().release().await.unwrap();
    until_idle(&sem).await;
}

/// Promise: by default, a waiter for 1 behind a waiter for 2 takes a free permit the head
/// cannot use.
async fn the_default_order_lets_smaller_requests_past_a_large_one(env: Env) {
    let client = env.client().await;
    let sem = client.semaphore("first-fit", 3);
    let two = sem.acquire_many(2).await.unwrap();
    let one = sem.acquire().await.unwrap();
    let big = spawn_timed({
        let sem = sem.clone();
        async move { sem.try_acquire_many(2, Duration::from_secs(10)).await }
    });
    until_waiting(&sem, 1).await;
    let small = spawn_timed({
        let sem = sem.clone();
        async move { sem.try_acquire(Duration::from_secs(10)).await }
    });
    until_waiting(&sem, 2).await;
    one.release().await.unwrap();
    let (small, _) = finishes(Duration::from_secs(5), "the small one", small).await;
    assert!(!big.is_finished());
    two.release().await.unwrap();
    let (big, _) = finishes(Duration::from_secs(5), "the big one", big).await;
    small.unwrap().release().await.unwrap();
    big.unwrap().release().await.unwrap();
    until_idle(&sem).await;
}

/// Promise: a permit with a fixed lease ends with it: its guard says it is lost, and a
/// waiter gets the permit then, without a notice (nobody released).
async fn a_fixed_lease_ends_and_a_waiter_gets_the_permit_then(env: Env) {
    let client = env.client().await;
    let other = env.client().await;
    let lease = Duration::from_millis(400);
    let held = client
        .semaphore("leased", 1)
        .lease(lease)
        .acquire()
        .await
        .unwrap();
    let taken_at = Instant::now();
    let waiter = spawn_timed(async move {
        other
            .semaphore("leased", 1)
            .try_acquire(Duration::from_secs(5))
            .await
    });
    let (got, at) = finishes(Duration::from_secs(5), "the waiter", waiter).await;
    let got = got.expect("the permit after its lease");
    let after = at.duration_since(taken_at);
    assert!(after >= lease - Duration::from_millis(50), "{after:?}");
    assert!(after < lease + Duration::from_millis(1000), "{after:?}");
    assert!(held.is_lost());
    assert!(matches!(
        held.release().await,
        Err(LockError::Lost { .. } | LockError::NotHeld { .. })
    ));
    assert_eq!(
        client
            .semaphore("leased", 1)
            .state()
            .await
            .unwrap()
            .map(|s| s.in_use),
        Some(1),
        "the late release freed the new holder's permit"
    );
    got.release().await.unwrap();
}

/// Promise: the watchdog keeps a permit past three of its leases, and stops at release.
async fn the_watchdog_keeps_permits_past_three_leases(env: Env) {
    let lease = Duration::from_millis(300);
    let short = |b: lockwarden_core::LockClientBuilder| b.watchdog_timeout(lease);
    let client = match env.is_redis() {
        true => env.client_with(short).await,
        false => short(LockClient::builder()).in_memory(),
    };
    let sem = client.semaphore("watched", 1);
    let held = sem.acquire().await.unwrap();
    assert_eq!(client.stats().watched_locks, 1);
    tokio::time::sleep(lease * 4).await;
    assert!(!held.is_lost(), "lost although the watchdog renews it");
    if env.is_redis() {
        let key = client.key("watched").unwrap();
        let ttl = env.server().pttl(key.redis_key());
        assert!(ttl > 0 && ttl <= 2 * 300 + 50, "PTTL {ttl}");
    }
    assert!(matches!(
        sem.try_acquire(Duration::ZERO).await,
        Err(LockError::Timeout { .. })
    ));
    held.release().await.unwrap();
    assert_eq!(client.stats().watched_locks, 0);
    until_idle(&sem).await;
}

/// Promise: a guard dropped without `release()` frees its permit, and a waiter of another
/// client gets it at once, long before the 30 s lease.
async fn a_dropped_guard_gives_its_permit_to_a_waiter(env: Env) {
    let client = env.client().await;
    let other = env.client().await;
    let held = client.semaphore("dropped", 1).acquire().await.unwrap();
    let waiter = spawn_timed(async move {
        other
            .semaphore("dropped", 1)
            .try_acquire(Duration::from_secs(5))
            .await
    });
    until_waiting(&client.semaphore("dropped", 1), 1).await;
    let dropped_at = Instant::now();
    drop(held);
    let (got, at) = finishes(Duration::from_secs(5), "the waiter", waiter).await;
    let got = got.expect("the dropped permit");
    assert!(at.duration_since(dropped_at) < Duration::from_secs(1));
    drop(got);
    until_idle(&client.semaphore("dropped", 1)).await;
}

/// Promise: acquisitions cut off at any point, on a free semaphore and on a full one,
/// leave nothing: no permit held, nobody in line, no watchdog entry, no waited channel,
/// and on Redis no key but the fencing key.
async fn cancelled_acquires_leave_nothing_behind(env: Env) {
    let client = env.client().await;
    let other = env.client().await;
    let full = other
        .semaphore("cancel:full", 2)
        .acquire_many(2)
        .await
        .unwrap();
    for i in 0..200u64 {
        let name = if i % 2 == 0 {
            "cancel:free"
        } else {
            "cancel:full"
        };
        let sem = client.semaphore(name, 2);
        let cut = Duration::from_micros((i * 37) % 3000);
        let permits = 1 + (i % 2) as u32;
        if let Ok(Ok(permit)) =
            tokio::time::timeout(cut, sem.try_acquire_many(permits, Duration::from_secs(5))).await
        {
            if i % 3 == 0 {
                drop(permit);
            } else {
                let _ = permit.release().await;
            }
        }
    }
    full.release().await.unwrap();
    for name in ["cancel:free", "cancel:full"] {
        until_idle(&client.semaphore(name, 2)).await;
    }
    eventually(Duration::from_secs(5), "no bookkeeping left", || async {
        let stats = client.stats();
        stats.watched_locks == 0 && stats.waited_channels == 0
    })
    .await;
    if env.is_redis() {
        eventually(Duration::from_secs(5), "only fencing keys", || async {
            env.server()
                .keys_matching("lockwarden:*")
                .iter()
                .all(|k| k.ends_with(":fence"))
        })
        .await;
        assert!(env.server().channels().is_empty(), "channels left");
    }
}

/// Promise: every permit hold gets a token of its own, greater than every token of the
/// semaphore before it (grants to several waiters at once too).
async fn every_permit_hold_gets_a_new_token(env: Env) {
    let client = env.client().await;
    let sem = client.semaphore("tokens", 3);
    let mut last = 0;
    let mut seen = HashSet::new();
    for _ in 0..5 {
        let permits = [
            sem.acquire().await.unwrap(),
            sem.acquire().await.unwrap(),
            sem.acquire().await.unwrap(),
        ];
        for permit in &permits {
            assert!(permit.fencing_token() > last);
            assert!(seen.insert(permit.fencing_token()), "a token twice");
        }
        last = permits.iter().map(|p| p.fencing_token()).max().unwrap();
        // Three waiters granted by one release of three permits.
        let waiters: Vec<_> = (0..3)
            .map(|_| {
                let sem = sem.clone();
                tokio::spawn(async move { sem.try_acquire(Duration::from_secs(5)).await })
            })
            .collect();
        until_waiting(&sem, 3).await;
        let all = sem.clone();
        drop(all);
        for permit in permits {
            permit.release().await.unwrap();
        }
        let mut granted = Vec::new();
        for w in waiters {
            granted.push(
                finishes(Duration::from_secs(5), "granted", w)
                    .await
                    .unwrap(),
            );
        }
        for permit in &granted {
            assert!(permit.fencing_token() > last, "a grant's token is old");
            assert!(seen.insert(permit.fencing_token()), "a token twice");
        }
        last = granted.iter().map(|p| p.fencing_token()).max().unwrap();
        for permit in granted {
            permit.release().await.unwrap();
        }
    }
}

/// Promise: a waiter gives up when its budget is spent, with the lease of the holds that
/// could end first as the hint, and leaves the line.
async fn the_wait_budget_is_honoured(env: Env) {
    let client = env.client().await;
    let sem = client.semaphore("budget", 1);
    let held = sem.acquire().await.unwrap();
    let started = Instant::now();
    match sem.try_acquire(Duration::from_millis(300)).await {
        Err(LockError::Timeout { key, retry_after }) => {
            assert_eq!(key, "budget");
            assert!(retry_after > Duration::from_secs(20), "{retry_after:?}");
        }
        other => panic!("expected a timeout, got {other:?}"),
    }
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_millis(290) && waited < Duration::from_secs(2),
        "{waited:?}"
    );
    assert_eq!(
        sem.state().await.unwrap().unwrap().waiting,
        0,
        "left in line"
    );
    held.release().await.unwrap();
}

/// Promise: while a semaphore is in use, its stored capacity counts for every client,
/// whatever capacity they ask for; once idle, the next acquisition stores its own.
async fn the_stored_capacity_wins_while_in_use(env: Env) {
    let client = env.client().await;
    let other = env.client().await;
    let first = client.semaphore("stored", 1).acquire().await.unwrap();
    let wider = other.semaphore("stored", 5);
    assert!(
        matches!(
            wider.try_acquire(Duration::ZERO).await,
            Err(LockError::Timeout { .. })
        ),
        "a client asking 5 exceeded the stored 1"
    );
    assert_eq!(wider.state().await.unwrap().unwrap().capacity, 1);
    match other
        .semaphore("stored", 5)
        .try_acquire_many(3, Duration::ZERO)
        .await
    {
        Err(LockError::TooManyPermits {
            asked: 3,
            capacity: 1,
            ..
        }) => {}
        other => panic!("expected TooManyPermits, got {other:?}"),
    }
    first.release().await.unwrap();
    until_idle(&wider).await;
    let five: Vec<_> = {
        let mut five = Vec::new();
        for _ in 0..5 {
            five.push(wider.try_acquire(Duration::ZERO).await.unwrap());
        }
        five
    };
    assert_eq!(wider.state().await.unwrap().unwrap().capacity, 5);
    for permit in five {
        permit.release().await.unwrap();
    }
}

/// Promise: `set_capacity` changes a semaphore in use for every client: more room is
/// granted to waiters at once, less takes no held permit back.
async fn set_capacity_grants_new_room_and_takes_nothing_back(env: Env) {
    let client = env.client().await;
    let sem = client.semaphore("resized", 2);
    assert!(
        !sem.set_capacity(4).await.unwrap(),
        "idle: nothing to change"
    );
    let two = sem.acquire_many(2).await.unwrap();
    let waiter = spawn_timed({
        let sem = sem.clone();
        async move { sem.try_acquire(Duration::from_secs(10)).await }
    });
    until_waiting(&sem, 1).await;
    assert!(sem.set_capacity(3).await.unwrap());
    let (third, _) = finishes(Duration::from_secs(5), "granted the new room", waiter).await;
    let third = third.unwrap();
    assert!(sem.set_capacity(1).await.unwrap());
    assert!(!two.is_lost() && !third.is_lost());
    assert_eq!(
        sem.state().await.unwrap().unwrap().in_use,
        3,
        "a held permit taken back"
    );
    third.release().await.unwrap();
    assert!(matches!(
        sem.try_acquire(Duration::ZERO).await,
        Err(LockError::Timeout { .. })
    ));
    two.release().await.unwrap();
    until_idle(&sem).await;
}

/// Promise: an operator's force unlock frees every permit, wakes the waiters at once, and
/// a holder kept by the watchdog learns through `lost()` within a renewal.
async fn force_unlock_frees_every_permit_and_holders_learn_it(env: Env) {
    let short =
        |b: lockwarden_core::LockClientBuilder| b.watchdog_timeout(Duration::from_millis(600));
    let holder = match env.is_redis() {
        true => env.client_with(short).await,
        false => short(LockClient::builder()).in_memory(),
    };
    let waiter_client = match env.is_redis() {
        true => env.client().await,
        false => holder.clone(),
    };
    let held = holder.semaphore("forced", 2).acquire_many(2).await.unwrap();
    let waiter = spawn_timed(async move {
        waiter_client
            .semaphore("forced", 2)
            .try_acquire(Duration::from_secs(10))
            .await
    });
    until_waiting(&holder.semaphore("forced", 2), 1).await;
    let forced_at = Instant::now();
    assert!(holder.semaphore("forced", 2).force_unlock().await.unwrap());
    let (got, at) = finishes(Duration::from_secs(5), "the waiter", waiter).await;
    let got = got.expect("a permit after the force unlock");
    assert!(
        at.duration_since(forced_at) < Duration::from_secs(1),
        "not woken at once"
    );
    eventually(Duration::from_secs(2), "the holder learns", || async {
        held.is_lost()
    })
    .await;
    got.release().await.unwrap();
}

/// Promise: numbers a semaphore can never satisfy are refused before anything is sent:
/// capacity 0 or above the largest, 0 permits, more permits than the capacity; nothing
/// is held.
async fn bad_numbers_are_refused_with_nothing_held(env: Env) {
    let client = env.client().await;
    for capacity in [0, MAX_PERMITS + 1] {
        assert!(matches!(
            client
                .semaphore("bad", capacity)
                .try_acquire(Duration::ZERO)
                .await,
            Err(LockError::InvalidPermits { .. })
        ));
    }
    assert!(matches!(
        client.semaphore("bad", 3).acquire_many(0).await,
        Err(LockError::InvalidPermits { .. })
    ));
    assert!(matches!(
        client.semaphore("bad", 3).acquire_many(4).await,
        Err(LockError::TooManyPermits {
            asked: 4,
            capacity: 3,
            ..
        })
    ));
    assert!(matches!(
        client.semaphore("bad", 3).set_capacity(0).await,
        Err(LockError::InvalidPermits { .. })
    ));
    assert!(matches!(
        client.semaphore("", 3).acquire().await,
        Err(LockError::InvalidKey(_))
    ));
    assert_eq!(client.semaphore("bad", 3).state().await.unwrap(), None);
    assert!(client
        .semaphore(MAX_PERMITS.to_string(), MAX_PERMITS)
        .acquire()
        .await
        .is_ok());
}

/// Promise: a name is a semaphore or a lock of another kind, not both: each keeps the
/// other out until it is free.
async fn a_semaphore_and_a_lock_of_one_name_keep_each_other_out(env: Env) {
    let client = env.client().await;
    let lock = client.acquire("shared-name").await.unwrap();
    assert!(matches!(
        client
            .semaphore("shared-name", 5)
            .try_acquire(Duration::ZERO)
            .await,
        Err(LockError::Timeout { .. })
    ));
    lock.release().await.unwrap();
    let permit = client.semaphore("shared-name", 5).acquire().await.unwrap();
    for attempt in [
        client.try_acquire("shared-name", Duration::ZERO).await,
        client
            .rw_lock("shared-name")
            .read()
            .try_acquire(Duration::ZERO)
            .await,
        client
            .fair_lock("shared-name")
            .try_acquire(Duration::ZERO)
            .await,
    ] {
        assert!(
            matches!(attempt, Err(LockError::Timeout { .. })),
            "{attempt:?}"
        );
    }
    permit.release().await.unwrap();
}

/// Promise: a task that holds a permit and asks again takes a second one (a counting
/// semaphore, not a re-entrant lock), whatever holder scope encloses it.
async fn permits_are_not_reentrant(env: Env) {
    let client = env.client().await;
    let me = client.holder();
    me.scope(async {
        let sem = client.semaphore("counted", 2);
        let first = sem.acquire().await.unwrap();
        let second = sem.acquire().await.unwrap();
        assert_ne!(first.holder(), second.holder());
        assert_eq!(sem.state().await.unwrap().unwrap().in_use, 2);
        assert!(matches!(
            sem.try_acquire(Duration::ZERO).await,
            Err(LockError::Timeout { .. })
        ));
        first.release().await.unwrap();
        second.release().await.unwrap();
    })
    .await;
}

/// Promise (Redis): a release nobody waits for is plain commands (`ZREMRANGEBYRANK` among
/// them, which no script calls); one that finds another client's waiter is the same, then
/// the grant; the next release of that semaphore by the same client is the script that
/// grants in the same step, no plain command. Every waiter gets its permit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_a_contended_semaphore_is_released_by_the_script_that_grants() {
    let env = Env::redis();
    let server = env.server();
    let (a, b) = (env.client().await, env.client().await);
    let (ours, theirs) = (a.semaphore("handoffs", 1), b.semaphore("handoffs", 1));
    let plain = || server.command_calls("zremrangebyrank");

    let held = ours.acquire().await.unwrap();
    let before = plain();
    held.release().await.unwrap();
    assert_eq!(plain(), before + 1, "uncontended: plain commands");

    for (round, sent_plain) in [(1, 1), (2, 0)] {
        let held = ours.acquire().await.unwrap();
        let waiting = theirs.clone();
        let waiter = tokio::spawn(async move { waiting.acquire().await });
        until_waiting(&ours, 1).await;
        let before = plain();
        held.release().await.unwrap();
        let granted = finishes(Duration::from_secs(5), "the waiter granted", waiter)
            .await
            .unwrap();
        assert_eq!(
            plain(),
            before + sent_plain,
            "round {round}: the release's plain commands"
        );
        granted.release().await.unwrap();
    }
    until_idle(&ours).await;
}
