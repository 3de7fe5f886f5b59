//! The read-write lock's promises, checked against both stores (see `common::Env`), plus
//! its Redis layout against a real `redis-server`.

mod common;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{connect_with, drive_until, hold_until_killed, spawn_timed, Env};
use lockwarden_core::{LockClient, LockError, LockGuard, RwMode};
use lockwarden_testkit::{eventually, run_child, TestProcess};

conformance!(
    many_readers_hold_at_once,
    writer_excludes_readers_and_writers,
    read_and_write_reenter_per_holder,
    writer_downgrades_to_read,
    upgrade_is_refused_at_once,
    waiting_writer_is_not_starved_by_a_stream_of_readers,
    write_release_wakes_all_waiting_readers_at_once,
    a_write_release_admits_the_waiting_readers_itself,
    an_admission_given_up_frees_the_lock,
    an_admission_late_in_a_wait_is_renewed_before_it_ends,
    a_force_unlock_ends_admissions_for_good,
    a_given_reader_waiting_in_two_tasks_counts_each_once,
    dead_reader_expires_on_its_own_lease_while_others_renew,
    watchdog_keeps_read_and_write_holds_past_their_lease,
    fencing_tokens_increase_with_each_write,
    abandoned_writer_does_not_hold_readers_back,
    dropped_guards_release_both_sides,
    plain_and_read_write_locks_of_one_name_exclude_each_other,
);

fn assert_timeout(result: Result<LockGuard, LockError>, what: &str) {
    match result {
        Err(LockError::Timeout { .. }) => {}
        other => panic!("{what}: expected Timeout, got {other:?}"),
    }
}

/// Asserts that one attempt by a fresh holder of `client` at `side` of `name` is
/// refused with a timeout.
async fn assert_refused(client: &LockClient, name: &str, side: RwMode, what: &str) {
    let rw = client.rw_lock(name);
    let handle = match side {
        RwMode::Read => rw.read(),
        RwMode::Write => rw.write(),
    };
    assert_timeout(handle.try_acquire(Duration::ZERO).await, what);
}

async fn many_readers_hold_at_once(env: Env) {
    let clients = [env.client().await, env.client().await, env.client().await];
    let mut guards = Vec::new();
    for client in &clients {
        for _ in 0..4 {
            let guard = client
                .rw_lock("shared")
                .read()
                .try_acquire(Duration::ZERO)
                .await
                .expect("a reader joins the others without waiting");
            guards.push(guard);
        }
    }
    let rw = clients[0].rw_lock("shared");
    assert!(rw.is_locked().await.unwrap());
    for guard in &guards {
        assert_eq!(rw.read().hold_count(guard.holder()).await.unwrap(), 1);
    }
    assert_timeout(
        rw.write().try_acquire(Duration::ZERO).await,
        "a writer while 12 readers hold",
    );
    for guard in guards {
        guard.release().await.unwrap();
    }
    assert!(!rw.is_locked().await.unwrap());
    let writer = rw.write().try_acquire(Duration::ZERO).await.unwrap();
    writer.release().await.unwrap();
}

async fn writer_excludes_readers_and_writers(env: Env) {
    let a = env.client().await;
    let b = env.client().await;
    let writer = a.rw_lock("excl").write().acquire().await.unwrap();
    assert_eq!(
        a.rw_lock("excl")
            .write()
            .hold_count(writer.holder())
            .await
            .unwrap(),
        1
    );
    assert_refused(&b, "excl", RwMode::Read, "a reader while a writer holds").await;
    assert_refused(&b, "excl", RwMode::Write, "a second writer").await;
    // A waiter is woken by the release, well before the writer's 30 s lease.
    let started = Instant::now();
    let waiter = {
        let b = b.clone();
        tokio::spawn(async move {
            b.rw_lock("excl")
                .read()
                .try_acquire(Duration::from_secs(10))
                .await
        })
    };
    eventually(Duration::from_secs(5), "the reader waits", || async {
        b.stats().waited_channels == 1
    })
    .await;
    writer.release().await.unwrap();
    let reader = waiter
        .await
        .unwrap()
        .expect("the reader gets it after the release");
    assert!(started.elapsed() < Duration::from_secs(5));
    reader.release().await.unwrap();
    let writer = b
        .rw_lock("excl")
        .write()
        .try_acquire(Duration::ZERO)
        .await
        .unwrap();
    writer.release().await.unwrap();
}

async fn read_and_write_reenter_per_holder(env: Env) {
    let client = env.client().await;
    let other = env.client().await;
    let me = client.holder();
    let rw = client.rw_lock("reenter");

    let reads = [
        rw.read().holder(&me).acquire().await.unwrap(),
        rw.read().holder(&me).acquire().await.unwrap(),
        rw.read().holder(&me).acquire().await.unwrap(),
    ];
    assert_eq!(rw.read().hold_count(&me).await.unwrap(), 3);
    assert_eq!(rw.write().hold_count(&me).await.unwrap(), 0);
    assert!(reads
        .iter()
        .all(|g| g.fencing_token() == reads[0].fencing_token()));
    let [r1, r2, r3] = reads;
    r3.release().await.unwrap();
    r2.release().await.unwrap();
    assert_refused(
        &other,
        "reenter",
        RwMode::Write,
        "a writer while one read entry is left",
    )
    .await;
    r1.release().await.unwrap();
    assert!(!rw.is_locked().await.unwrap());

    let w1 = rw.write().holder(&me).acquire().await.unwrap();
    let w2 = rw
        .write()
        .holder(&me)
        .try_acquire(Duration::ZERO)
        .await
        .expect("the writer re-enters without waiting");
    assert_eq!(rw.write().hold_count(&me).await.unwrap(), 2);
    assert_eq!(w1.fencing_token(), w2.fencing_token());
    w2.release().await.unwrap();
    assert_refused(
        &other,
        "reenter",
        RwMode::Read,
        "a reader while one write entry is left",
    )
    .await;
    w1.release().await.unwrap();
    assert!(!rw.is_locked().await.unwrap());
}

async fn writer_downgrades_to_read(env: Env) {
    let client = env.client().await;
    let other = env.client().await;
    let me = client.holder();
    let rw = client.rw_lock("downgrade");
    let write = rw.write().holder(&me).acquire().await.unwrap();
    let read = rw
        .read()
        .holder(&me)
        .try_acquire(Duration::ZERO)
        .await
        .expect("the writer takes the read side without waiting");
    assert_eq!(read.fencing_token(), write.fencing_token());
    // Still in write mode: others are kept out.
    assert_refused(
        &other,
        "downgrade",
        RwMode::Read,
        "another reader before the downgrade",
    )
    .await;

    write.release().await.unwrap();
    assert_eq!(rw.write().hold_count(&me).await.unwrap(), 0);
    assert_eq!(rw.read().hold_count(&me).await.unwrap(), 1);
    assert!(
        rw.is_locked().await.unwrap(),
        "the downgraded read hold keeps it"
    );
    let joined = other
        .rw_lock("downgrade")
        .read()
        .try_acquire(Duration::ZERO)
        .await
        .expect("read mode after the downgrade: readers join");
    assert_refused(
        &other,
        "downgrade",
        RwMode::Write,
        "a writer while the downgraded holder reads",
    )
    .await;
    read.release().await.unwrap();
    joined.release().await.unwrap();
    assert!(!rw.is_locked().await.unwrap());
}

async fn upgrade_is_refused_at_once(env: Env) {
    let client = env.client().await;
    let other = env.client().await;
    let me = client.holder();
    let rw = client.rw_lock("upgrade");
    let read = rw.read().holder(&me).acquire().await.unwrap();

    let started = Instant::now();
    match rw
        .write()
        .holder(&me)
        .try_acquire(Duration::from_secs(5))
        .await
    {
        Err(LockError::UpgradeRefused { key }) => assert_eq!(key, "upgrade"),
        other => panic!("expected UpgradeRefused, got {other:?}"),
    }
    // Unbounded too: refused, not deadlocked.
    match tokio::time::timeout(Duration::from_secs(5), rw.write().holder(&me).acquire()).await {
        Ok(Err(LockError::UpgradeRefused { .. })) => {}
        other => panic!("expected UpgradeRefused at once, got {other:?}"),
    }
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );

    // The refusal changed nothing: the read hold is intact and no writer is waiting, so
    // other readers still join.
    assert_eq!(rw.read().hold_count(&me).await.unwrap(), 1);
    let joined = other
        .rw_lock("upgrade")
        .read()
        .try_acquire(Duration::ZERO)
        .await
        .expect("no writer registration was left behind");
    joined.release().await.unwrap();
    read.release().await.unwrap();
    // Once the read hold is gone the same holder may write.
    let write = rw
        .write()
        .holder(&me)
        .try_acquire(Duration::ZERO)
        .await
        .unwrap();
    write.release().await.unwrap();
}

/// Promise: a waiting writer gets the lock within a bound although readers keep arriving
/// and overlapping (each holds 150 ms, a new one every 40 ms, for 3 s): new readers are
/// refused while it waits, so the readers in place drain. Without writer preference the
/// lock would stay read-held until the stream ends.
async fn waiting_writer_is_not_starved_by_a_stream_of_readers(env: Env) {
    let readers = [env.client().await, env.client().await];
    let writer_client = env.client().await;
    let holding = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let refused = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(AtomicBool::new(false));

    let stream = {
        let (holding, most, refused, stop) =
            (holding.clone(), most.clone(), refused.clone(), stop.clone());
        tokio::spawn(async move {
            let ends = Instant::now() + Duration::from_secs(3);
            let mut tasks = Vec::new();
            let mut n = 0;
            while Instant::now() < ends && !stop.load(Ordering::SeqCst) {
                let client = readers[n % 2].clone();
                n += 1;
                let (holding, most, refused) = (holding.clone(), most.clone(), refused.clone());
                tasks.push(tokio::spawn(async move {
                    match client
                        .rw_lock("stream")
                        .read()
                        .try_acquire(Duration::ZERO)
                        .await
                    {
                        Ok(guard) => {
                            let now = holding.fetch_add(1, Ordering::SeqCst) + 1;
                            most.fetch_max(now, Ordering::SeqCst);
                            tokio::time::sleep(Duration::from_millis(150)).await;
                            holding.fetch_sub(1, Ordering::SeqCst);
                            guard.release().await.unwrap();
                        }
                        Err(LockError::Timeout { .. }) => {
                            refused.fetch_add(1, Ordering::SeqCst);
                        }
                        Err(e) => panic!("reader failed: {e}"),
                    }
                }));
                tokio::time::sleep(Duration::from_millis(40)).await;
            }
            for task in tasks {
                task.await.unwrap();
            }
        })
    };

    eventually(Duration::from_secs(5), "readers overlap", || async {
        most.load(Ordering::SeqCst) >= 2
    })
    .await;
    assert_eq!(
        refused.load(Ordering::SeqCst),
        0,
        "readers were refused before any writer"
    );

    let asked = Instant::now();
    let guard = writer_client
        .rw_lock("stream")
        .write()
        .try_acquire(Duration::from_secs(10))
        .await
        .expect("the writer gets the lock");
    let waited = asked.elapsed();
    assert_eq!(
        holding.load(Ordering::SeqCst),
        0,
        "a reader holds alongside the writer"
    );
    // The readers in place hold at most 150 ms more; 1 s leaves room for a loaded machine
    // and is well short of the 3 s stream.
    assert!(
        waited < Duration::from_secs(1),
        "the writer waited {waited:?}"
    );
    assert!(
        refused.load(Ordering::SeqCst) > 0,
        "no reader was held back for the waiting writer"
    );
    guard.release().await.unwrap();
    stop.store(true, Ordering::SeqCst);
    stream.await.unwrap();
}

/// Promise: when the write hold ends, every waiting reader proceeds at once, not one per
/// notice: 20 readers on 2 clients, waiting behind a writer whose lease (30 s) is far
/// away, all acquire within 2 s of the release and hold at the same time.
async fn write_release_wakes_all_waiting_readers_at_once(env: Env) {
    let clients = [env.client().await, env.client().await];
    let writer = clients[0].rw_lock("wake").write().acquire().await.unwrap();
    let holding = Arc::new(AtomicUsize::new(0));
    let started = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for i in 0..20 {
        let client = clients[i % 2].clone();
        let (holding, started) = (holding.clone(), started.clone());
        tasks.push(tokio::spawn(async move {
            started.fetch_add(1, Ordering::SeqCst);
            let guard = client
                .rw_lock("wake")
                .read()
                .try_acquire(Duration::from_secs(20))
                .await
                .unwrap();
            let acquired = Instant::now();
            holding.fetch_add(1, Ordering::SeqCst);
            // Hold until all 20 hold: proves they held at the same time.
            let deadline = Instant::now() + Duration::from_secs(5);
            while holding.load(Ordering::SeqCst) < 20 {
                assert!(Instant::now() < deadline, "not all 20 readers held at once");
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            guard.release().await.unwrap();
            acquired
        }));
    }
    eventually(
        Duration::from_secs(5),
        "all readers are waiting",
        || async {
            started.load(Ordering::SeqCst) == 20
                && clients.iter().all(|c| c.stats().waited_channels == 1)
        },
    )
    .await;
    if let Some(server) = &env.server {
        eventually(
            Duration::from_secs(5),
            "both clients subscribed",
            || async { server.subscribers("lockwarden:{wake}:readable") == 2 },
        )
        .await;
    }
    // Let the readers that just subscribed finish their retry and go to sleep.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        holding.load(Ordering::SeqCst),
        0,
        "a reader got past the writer"
    );

    let released = Instant::now();
    writer.release().await.unwrap();
    for task in tasks {
        let acquired = task.await.unwrap();
        let after = acquired.saturating_duration_since(released);
        assert!(
            after < Duration::from_secs(2),
            "a reader acquired {after:?} after the release"
        );
    }
    assert!(!clients[0].rw_lock("wake").is_locked().await.unwrap());
}

/// Three readers (given holders, one client each) wait behind `writer`'s write hold on
/// `name`, then are no longer polled: returns their holders, handles and acquires.
async fn stalled_readers(
    env: &Env,
    name: &str,
) -> Vec<(
    lockwarden_core::Holder,
    lockwarden_core::RwLockHandle,
    std::pin::Pin<Box<dyn std::future::Future<Output = Result<LockGuard, LockError>> + Send>>,
)> {
    let mut readers = Vec::new();
    for _ in 0..3 {
        let client = env.client().await;
        let me = client.holder();
        let side = client.rw_lock(name).read().holder(&me);
        let mut acquire = Box::pin({
            let side = side.clone();
            async move { side.try_acquire(Duration::from_secs(20)).await }
        });
        // Its first attempt was refused (so it registered) once it waits on a channel; in
        // process (one client for all) the first poll does that.
        drive_until(&mut acquire, async {
            if env.is_redis() {
                eventually(Duration::from_secs(5), "the reader waits", || async {
                    client.stats().waited_channels == 1
                })
                .await;
            }
        })
        .await;
        readers.push((me, side, acquire as _));
    }
    readers
}

/// Promise: the release that opens the lock to readers admits every waiting reader in
/// the same step: right after it, before any reader runs again, each holds a read hold;
/// each then takes it up (here by asking: a given holder) counted once, all with the read
/// phase's token, newer than the writer's; their releases free the lock.
async fn a_write_release_admits_the_waiting_readers_itself(env: Env) {
    let owner = env.client().await;
    let writer = owner.rw_lock("admit").write().acquire().await.unwrap();
    let write_token = writer.fencing_token();
    let readers = stalled_readers(&env, "admit").await;
    for (me, side, _) in &readers {
        assert_eq!(
            side.hold_count(me).await.unwrap(),
            0,
            "a reader got in early"
        );
    }
    writer.release().await.unwrap();
    for (me, side, _) in &readers {
        assert_eq!(
            side.hold_count(me).await.unwrap(),
            1,
            "a waiting reader was not admitted by the release"
        );
    }
    let mut guards = Vec::new();
    for (me, side, acquire) in readers {
        let guard = tokio::time::timeout(Duration::from_secs(5), acquire)
            .await
            .expect("an admitted reader holds")
            .unwrap();
        assert_eq!(side.hold_count(&me).await.unwrap(), 1, "counted twice");
        guards.push(guard);
    }
    let token = guards[0].fencing_token();
    assert!(token > write_token, "the read phase has a newer token");
    assert!(guards.iter().all(|g| g.fencing_token() == token));
    for guard in guards {
        guard.release().await.unwrap();
    }
    assert!(!owner.rw_lock("admit").is_locked().await.unwrap());
}

/// Promise: a given holder waiting as a reader in two tasks gets the lock in both once a
/// release admits it: the admission is taken up once and the other task re-enters, so
/// the count is 2 and two releases free the lock.
async fn a_given_reader_waiting_in_two_tasks_counts_each_once(env: Env) {
    let owner = env.client().await;
    let client = env.client().await;
    let writer = owner.rw_lock("twice").write().acquire().await.unwrap();
    let me = client.holder();
    let side = client.rw_lock("twice").read().holder(&me);
    let tasks: Vec<_> = (0..2)
        .map(|_| {
            let side = side.clone();
            tokio::spawn(async move { side.try_acquire(Duration::from_secs(10)).await })
        })
        .collect();
    // Both have made their first attempt and sleep.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(side.hold_count(&me).await.unwrap(), 0);
    writer.release().await.unwrap();
    let mut guards = Vec::new();
    for task in tasks {
        let guard = tokio::time::timeout(Duration::from_secs(5), task)
            .await
            .expect("both tasks get the lock soon after the release")
            .unwrap()
            .unwrap();
        guards.push(guard);
    }
    assert_eq!(
        side.hold_count(&me).await.unwrap(),
        2,
        "each task counts once"
    );
    let last = guards.pop().unwrap();
    guards.pop().unwrap().release().await.unwrap();
    assert!(owner.rw_lock("twice").is_locked().await.unwrap());
    last.release().await.unwrap();
    assert!(!owner.rw_lock("twice").is_locked().await.unwrap());
}
/// Promise: a reader admitted near the end of its wait budget (its registration, and so
/// its admission, cut short by the budget) is renewed before the admission ends: a writer
/// stays out while the reader holds.
async fn an_admission_late_in_a_wait_is_renewed_before_it_ends(env: Env) {
    let client = env.client().await;
    let writer = client.rw_lock("late").write().acquire().await.unwrap();
    let reader = spawn_timed({
        let client = client.clone();
        async move {
            let read = client.rw_lock("late").read();
            read.try_acquire(Duration::from_secs(4)).await
        }
    });
    // Released when the reader's last registration has 1 s left of its budget (its
    // watchdog renews the admission after a third of that: stalls of a loaded machine
    // up to ~600 ms pass; with 150 ms left, a stall let it run out).
    tokio::time::sleep(Duration::from_secs(3)).await;
    writer.release().await.unwrap();
    let (read, _) = reader.await.unwrap();
    let read = read.expect("admitted before its budget ran out");
    // Well past the admission's end: the reader's watchdog must have renewed it.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(!read.is_lost(), "the admission ran out under its reader");
    assert!(
        matches!(
            client
                .rw_lock("late")
                .write()
                .try_acquire(Duration::ZERO)
                .await,
            Err(LockError::Timeout { .. })
        ),
        "a writer got in while the admitted reader held"
    );
    read.release().await.unwrap();
}

/// Promise: a reader admitted while it was not running that gives up (its acquire is
/// dropped) gives its admission back, so the lock is free for a writer at once, not
/// after the reader's registration runs out.
async fn an_admission_given_up_frees_the_lock(env: Env) {
    let owner = env.client().await;
    let writer = owner.rw_lock("give-back").write().acquire().await.unwrap();
    let readers = stalled_readers(&env, "give-back").await;
    writer.release().await.unwrap();
    let (me, side, _) = &readers[0];
    assert_eq!(side.hold_count(me).await.unwrap(), 1);
    drop(readers);
    let next = owner.rw_lock("give-back").write();
    let guard = next
        .try_acquire(Duration::from_secs(2))
        .await
        .expect("the lock is free once the admitted readers gave up");
    guard.release().await.unwrap();
}

/// Promise: a force unlock ends every hold, read holds that a write release admitted
/// included: their readers stay registered while they hold, and the next write release
/// must not admit them again (their guards would renew a hold they lost and never learn).
async fn a_force_unlock_ends_admissions_for_good(env: Env) {
    let owner = env.client().await;
    let readers_client = env.client().await;
    let writer = owner.rw_lock("forced").write().acquire().await.unwrap();
    let waiting: Vec<_> = (0..3)
        .map(|_| {
            let lock = readers_client.rw_lock("forced");
            tokio::spawn(async move { lock.read().try_acquire(Duration::from_secs(10)).await })
        })
        .collect();
    // Each has made its first attempt (and registered) and sleeps.
    tokio::time::sleep(Duration::from_millis(300)).await;
    writer.release().await.unwrap();
    let mut guards = Vec::new();
    for reader in waiting {
        guards.push(reader.await.unwrap().expect("admitted"));
    }
    assert!(owner.rw_lock("forced").force_unlock().await.unwrap());
    let next = owner
        .rw_lock("forced")
        .write()
        .try_acquire(Duration::ZERO)
        .await
        .expect("free after the force unlock");
    next.release().await.unwrap();
    let side = readers_client.rw_lock("forced").read();
    for guard in &guards {
        assert_eq!(
            side.hold_count(guard.holder()).await.unwrap(),
            0,
            "a reader whose hold was force-unlocked was admitted again"
        );
    }
    assert!(!owner.rw_lock("forced").is_locked().await.unwrap());
}

/// Promise: a reader that stops renewing (its guard leaked with a 600 ms lease) stops
/// counting when its own lease ends, although another reader keeps renewing its hold
/// past several leases; a writer then waits only for the live reader.
async fn dead_reader_expires_on_its_own_lease_while_others_renew(env: Env) {
    let lease = Duration::from_millis(900);
    let client = env.client_with(|b| b.watchdog_timeout(lease)).await;
    let writer_client = env.client_with(|b| b.watchdog_timeout(lease)).await;
    let rw = client.rw_lock("dead-reader");

    let started = Instant::now();
    let dead = rw
        .read()
        .lease(Duration::from_millis(600))
        .acquire()
        .await
        .unwrap();
    let dead_holder = dead.holder().clone();
    std::mem::forget(dead); // never released, never renewed: as if its process died
    let live = rw.read().acquire().await.unwrap();

    let writer = {
        let writer_client = writer_client.clone();
        spawn_timed(async move {
            let rw = writer_client.rw_lock("dead-reader");
            rw.write().try_acquire(Duration::from_secs(10)).await
        })
    };

    eventually(
        Duration::from_secs(3),
        "the dead reader's hold runs out",
        || async { rw.read().hold_count(&dead_holder).await.unwrap() == 0 },
    )
    .await;
    let gone_after = started.elapsed();
    assert!(
        gone_after >= Duration::from_millis(550),
        "the dead reader's hold went after {gone_after:?}, before its lease"
    );
    // Outlive three of the live reader's leases: only its watchdog can keep it.
    tokio::time::sleep_until((started + 3 * lease).into()).await;
    assert_eq!(rw.read().hold_count(live.holder()).await.unwrap(), 1);
    assert!(!live.is_lost());
    assert!(
        !writer.is_finished(),
        "the writer got in beside a live reader"
    );

    let released = Instant::now();
    live.release().await.unwrap();
    let (guard, acquired) = writer.await.unwrap();
    let guard = guard.expect("the writer gets the lock once the live reader leaves");
    let after = acquired.saturating_duration_since(released);
    assert!(
        after < Duration::from_millis(500),
        "the writer acquired {after:?} after the live reader left"
    );
    guard.release().await.unwrap();
}

async fn watchdog_keeps_read_and_write_holds_past_their_lease(env: Env) {
    let lease = Duration::from_millis(600);
    let client = env.client_with(|b| b.watchdog_timeout(lease)).await;
    let other = env.client_with(|b| b.watchdog_timeout(lease)).await;
    let me = client.holder();
    let rw = client.rw_lock("watched");

    let write = rw.write().holder(&me).acquire().await.unwrap();
    let read = rw.read().holder(&me).acquire().await.unwrap();
    // One holder's read and write holds are renewed as two entries.
    assert_eq!(client.stats().watched_locks, 2);
    tokio::time::sleep(3 * lease).await;
    assert!(!write.is_lost() && !read.is_lost());
    assert_eq!(rw.write().hold_count(&me).await.unwrap(), 1);
    assert_refused(
        &other,
        "watched",
        RwMode::Read,
        "a reader while the renewed writer holds",
    )
    .await;

    write.release().await.unwrap();
    assert_eq!(client.stats().watched_locks, 1);
    tokio::time::sleep(3 * lease).await;
    assert!(!read.is_lost());
    assert_eq!(rw.read().hold_count(&me).await.unwrap(), 1);
    assert_refused(
        &other,
        "watched",
        RwMode::Write,
        "a writer while the renewed reader holds",
    )
    .await;
    read.release().await.unwrap();
    assert_eq!(client.stats().watched_locks, 0);
    assert!(!rw.is_locked().await.unwrap());
}

async fn fencing_tokens_increase_with_each_write(env: Env) {
    let a = env.client().await;
    let b = env.client().await;
    let mut last = 0;
    for i in 0..5 {
        let client = if i % 2 == 0 { &a } else { &b };
        let write = client.rw_lock("fence").write().acquire().await.unwrap();
        assert!(
            write.fencing_token() > last,
            "write {i}: {} after {last}",
            write.fencing_token()
        );
        last = write.fencing_token();
        write.release().await.unwrap();

        // A read phase on a free lock draws a token too; readers joining it share it.
        let first = a.rw_lock("fence").read().acquire().await.unwrap();
        let joined = b.rw_lock("fence").read().acquire().await.unwrap();
        assert!(first.fencing_token() > last);
        assert_eq!(joined.fencing_token(), first.fencing_token());
        last = first.fencing_token();
        first.release().await.unwrap();
        joined.release().await.unwrap();
    }
}

/// Promise: a writer whose wait is dropped (its task aborted) withdraws its registration,
/// so the readers it held back proceed at once, not when it would have run out (30 s).
async fn abandoned_writer_does_not_hold_readers_back(env: Env) {
    let a = env.client().await;
    let b = env.client().await;
    let first = a.rw_lock("abandon").read().acquire().await.unwrap();
    let writer = {
        let b = b.clone();
        tokio::spawn(async move {
            b.rw_lock("abandon")
                .write()
                .try_acquire(Duration::from_secs(60))
                .await
        })
    };
    eventually(
        Duration::from_secs(5),
        "a reader is held back by the writer",
        || async {
            match a
                .rw_lock("abandon")
                .read()
                .try_acquire(Duration::ZERO)
                .await
            {
                Ok(guard) => {
                    guard.release().await.unwrap();
                    false
                }
                Err(_) => true,
            }
        },
    )
    .await;
    let reader = {
        let a = a.clone();
        tokio::spawn(async move {
            a.rw_lock("abandon")
                .read()
                .try_acquire(Duration::from_secs(20))
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!reader.is_finished(), "a reader got past a waiting writer");

    let aborted = Instant::now();
    writer.abort();
    let guard = reader.await.unwrap().expect("the reader proceeds");
    assert!(
        aborted.elapsed() < Duration::from_secs(2),
        "the reader waited {:?} after the writer gave up",
        aborted.elapsed()
    );
    guard.release().await.unwrap();
    first.release().await.unwrap();
}

async fn dropped_guards_release_both_sides(env: Env) {
    let client = env.client().await;
    let other = env.client().await;
    let rw = client.rw_lock("dropped");
    drop(rw.write().acquire().await.unwrap());
    let read = other
        .rw_lock("dropped")
        .read()
        .try_acquire(Duration::from_secs(5))
        .await
        .expect("the dropped write guard released the lock");
    drop(read);
    let write = other
        .rw_lock("dropped")
        .write()
        .try_acquire(Duration::from_secs(5))
        .await
        .expect("the dropped read guard released the lock");
    write.release().await.unwrap();
}

/// The Redis layout the module docs describe, and how the keys go away.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_layout_holds_one_field_and_one_lease_per_hold() {
    let env = Env::redis();
    let server = env.server();
    let client = env.client().await;
    let me = client.holder();
    let rw = client.rw_lock("layout");
    let write = rw.write().holder(&me).acquire().await.unwrap();

    let key = "lockwarden:{layout}";
    let leases = "lockwarden:{layout}:leases";
    // The hold is the only one: every key, the fencing key too, expires at its deadline.
    let deadline: u64 = server
        .query(&["ZSCORE", leases, &format!("{me}:w")])
        .unwrap();
    for name in [key, leases, "lockwarden:{layout}:fence"] {
        let at: u64 = server.query(&["PEXPIRETIME", name]).unwrap();
        assert_eq!(at, deadline, "{name}");
    }
    let read = rw.read().holder(&me).acquire().await.unwrap();
    let mode: String = server.query(&["HGET", key, "mode"]).unwrap();
    assert_eq!(mode, "write");
    let token: u64 = server.query(&["HGET", key, "token"]).unwrap();
    assert_eq!(token, write.fencing_token());
    let w: u64 = server.query(&["HGET", key, &format!("{me}:w")]).unwrap();
    let r: u64 = server.query(&["HGET", key, &format!("{me}:r")]).unwrap();
    assert_eq!((w, r), (1, 1));
    let members: Vec<String> = server.query(&["ZRANGE", leases, "0", "-1"]).unwrap();
    assert_eq!(members.len(), 2);
    let pttl: i64 = server.query(&["PTTL", key]).unwrap();
    assert!(pttl > 25_000, "{pttl}");

    write.release().await.unwrap();
    let mode: String = server.query(&["HGET", key, "mode"]).unwrap();
    assert_eq!(mode, "read");
    read.release().await.unwrap();
    let exists: i64 = server.query(&["EXISTS", key, leases]).unwrap();
    assert_eq!(exists, 0);
}

/// A plain lock and a read-write lock under one name exclude each other, on both stores
/// (one hash on Redis), each sees the other as locked, and the read-write side never
/// touches the plain lock's hold.
async fn plain_and_read_write_locks_of_one_name_exclude_each_other(env: Env) {
    let client = env.client().await;
    let plain = client.acquire("both").await.unwrap();
    assert!(client.rw_lock("both").is_locked().await.unwrap());
    assert_refused(&client, "both", RwMode::Read, "read over a plain lock").await;
    assert_refused(&client, "both", RwMode::Write, "write over a plain lock").await;
    assert!(client
        .lock("both")
        .is_held_by(plain.holder())
        .await
        .unwrap());
    plain.release().await.unwrap();
    let write = client
        .rw_lock("both")
        .write()
        .try_acquire(Duration::ZERO)
        .await
        .unwrap();
    assert!(client.lock("both").is_locked().await.unwrap());
    assert_timeout(
        client.try_acquire("both", Duration::ZERO).await,
        "plain over rw",
    );
    write.release().await.unwrap();
    assert!(!client.lock("both").is_locked().await.unwrap());
}

/// Set (to a Redis URL) only in the re-executed child: it makes [`rw_reader_child`] act
/// as the reader process.
const READER_ENV: &str = "LOCKWARDEN_RW_READER_URL";
/// The reader process's watchdog lease (renewed every 500 ms).
const CHILD_LEASE: Duration = Duration::from_millis(1500);

/// Not a test on its own: the body of the reader process of
/// [`redis_killed_reader_process_stops_counting_after_its_lease`]. Without [`READER_ENV`]
/// it returns at once; with it, it takes a read hold with a 1.5 s watchdog lease, prints
/// `HELD <holder id>` and sleeps (at most 120 s) until it is SIGKILLed.
#[test]
fn rw_reader_child() {
    run_child(READER_ENV, |url| async move {
        let client = connect_with(&url, |b| b.watchdog_timeout(CHILD_LEASE)).await;
        let guard = client
            .rw_lock("killed-reader")
            .read()
            .acquire()
            .await
            .unwrap();
        hold_until_killed(format!("HELD {}", guard.holder().id()), guard).await;
    });
}

/// Promise: when a reader's *process* is SIGKILLed, its read hold stops counting within
/// one watchdog lease of the kill (+500 ms of slack), while a reader in another process
/// keeps renewing its own; a waiting writer then gets the lock as soon as the live reader
/// leaves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_killed_reader_process_stops_counting_after_its_lease() {
    let env = Env::redis();
    let server = env.server();
    let mut child = TestProcess::spawn("rw_reader_child", &[(READER_ENV, &server.url())]).unwrap();
    let child_holder = child.wait_for_line("HELD ", Duration::from_secs(30));
    let field = format!("{child_holder}:r");

    let client = env.client_with(|b| b.watchdog_timeout(CHILD_LEASE)).await;
    let rw = client.rw_lock("killed-reader");
    let live = rw.read().acquire().await.unwrap();
    let writer = {
        let client = client.clone();
        spawn_timed(async move {
            let rw = client.rw_lock("killed-reader");
            rw.write().try_acquire(Duration::from_secs(20)).await
        })
    };
    // The child's hold outlives one lease only if its watchdog renews it.
    tokio::time::sleep(CHILD_LEASE + Duration::from_millis(300)).await;
    let count: Option<u64> = server
        .query(&["HGET", "lockwarden:{killed-reader}", &field])
        .unwrap();
    assert_eq!(count, Some(1), "the reader process did not renew its hold");

    child.kill();
    let killed = Instant::now();

    // Counted out by the next script that runs (here, the live reader's renewals).
    let gone = eventually(
        Duration::from_secs(10),
        "the killed reader's hold is no longer counted",
        || async {
            let score: Option<String> = server
                .query(&["ZSCORE", "lockwarden:{killed-reader}:leases", &field])
                .unwrap();
            score.is_none()
        },
    )
    .await;
    let after = gone - killed;
    assert!(
        after <= CHILD_LEASE + Duration::from_millis(500),
        "the killed reader counted for {after:?} after the kill"
    );
    assert!(
        !writer.is_finished(),
        "the writer got in beside a live reader"
    );
    assert!(!live.is_lost());

    let released = Instant::now();
    live.release().await.unwrap();
    let (guard, acquired) = writer.await.unwrap();
    let guard = guard.expect("the writer gets the lock once the live reader leaves");
    let after = acquired.saturating_duration_since(released);
    assert!(
        after < Duration::from_millis(500),
        "the writer acquired {after:?} after the release"
    );
    guard.release().await.unwrap();
}

/// `INFO commandstats` calls of `EVALSHA` so far: every script Redis ran.
fn scripts_run(server: &lockwarden_testkit::RedisServer) -> u64 {
    let info: String = server.query(&["INFO", "commandstats"]).unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix("cmdstat_evalsha:calls="))
        .and_then(|rest| rest.split(',').next())
        .map_or(0, |calls| calls.parse().unwrap())
}

/// Promise: readers admitted by a release hold on its notice alone: from the write
/// release until 12 waiting readers (fresh holders, over 2 clients) all hold, Redis runs
/// one script, the release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_admitted_readers_hold_without_a_script_of_their_own() {
    let env = Env::redis();
    let server = env.server();
    let clients = [env.client().await, env.client().await];
    // Loads the release script (a first call is sent again after `NOSCRIPT`).
    let warm = clients[0].rw_lock("warm").write().acquire().await.unwrap();
    warm.release().await.unwrap();
    let writer = clients[0]
        .rw_lock("notice")
        .write()
        .acquire()
        .await
        .unwrap();
    let all_in = Arc::new(tokio::sync::Barrier::new(13));
    let counted = Arc::new(tokio::sync::Barrier::new(13));
    let mut tasks = Vec::new();
    for i in 0..12 {
        let (client, all_in, counted) = (clients[i % 2].clone(), all_in.clone(), counted.clone());
        tasks.push(tokio::spawn(async move {
            let side = client.rw_lock("notice").read();
            let guard = side.try_acquire(Duration::from_secs(20)).await.unwrap();
            all_in.wait().await;
            counted.wait().await;
            guard.release().await.unwrap();
        }));
    }
    eventually(Duration::from_secs(5), "12 readers registered", || async {
        server
            .query::<u64>(&["ZCARD", "lockwarden:{notice}:readers"])
            .unwrap()
            == 12
    })
    .await;
    // Let the last ones go from their registration to sleeping on the channel.
    tokio::time::sleep(Duration::from_millis(200)).await;
    // Each registered by its read hold's field, so the release copies them into the
    // leases whole: the same fields, with their registrations' deadlines.
    let registered: Vec<(String, u64)> = server
        .query(&[
            "ZRANGE",
            "lockwarden:{notice}:readers",
            "0",
            "-1",
            "WITHSCORES",
        ])
        .unwrap();
    assert!(
        registered.iter().all(|(field, _)| field.ends_with(":r")),
        "{registered:?}"
    );
    let before = scripts_run(server);
    let published = server.command_calls("publish");
    writer.release().await.unwrap();
    tokio::time::timeout(Duration::from_secs(5), all_in.wait())
        .await
        .expect("every admitted reader holds");
    assert_eq!(scripts_run(server) - before, 1, "readers asked again");
    // The readers' grant alone: no writer waits, and one woken now would find them in.
    assert_eq!(server.command_calls("publish") - published, 1);
    let leases: Vec<(String, u64)> = server
        .query(&[
            "ZRANGE",
            "lockwarden:{notice}:leases",
            "0",
            "-1",
            "WITHSCORES",
        ])
        .unwrap();
    assert_eq!(leases, registered);
    // Every key of the lock expires with the last admitted reader's hold.
    let last = registered.iter().map(|(_, at)| *at).max().unwrap();
    for name in ["", ":leases", ":fence"] {
        let name = format!("lockwarden:{{notice}}{name}");
        let at: u64 = server.query(&["PEXPIRETIME", &name]).unwrap();
        assert_eq!(at, last, "{name}");
    }
    for (field, _) in &registered {
        let count: u64 = server
            .query(&["HGET", "lockwarden:{notice}", field])
            .unwrap();
        assert_eq!(count, 1, "{field}");
    }
    counted.wait().await;
    for task in tasks {
        task.await.unwrap();
    }
    assert!(!clients[0].rw_lock("notice").is_locked().await.unwrap());
    let left: u64 = server
        .query(&["EXISTS", "lockwarden:{notice}:readers"])
        .unwrap();
    assert_eq!(left, 0, "admitted readers left their registration behind");
}

const WAITING_READER_ENV: &str = "LOCKWARDEN_RW_WAITING_READER_URL";

/// Not a test on its own: the body of the reader process of
/// [`redis_an_admitted_reader_that_died_frees_the_lock_within_its_registration`].
/// Without [`WAITING_READER_ENV`] it returns at once; with it, it waits for a read hold
/// with a 1.5 s watchdog lease (so a 1.5 s registration), prints `WAITING` once its first
/// attempt was refused, and sleeps (at most 120 s) until it is SIGKILLed.
#[test]
fn rw_waiting_reader_child() {
    run_child(WAITING_READER_ENV, |url| async move {
        let client = connect_with(&url, |b| b.watchdog_timeout(CHILD_LEASE)).await;
        let side = client.rw_lock("dead-reader").read();
        let waiting = tokio::spawn(async move { side.try_acquire(Duration::from_secs(120)).await });
        eventually(Duration::from_secs(10), "the reader waits", || async {
            client.stats().waited_channels == 1
        })
        .await;
        hold_until_killed("WAITING".to_owned(), waiting).await;
    });
}

/// Promise: a reader admitted after its process died (SIGKILL while it waited) holds the
/// lock only until its registration runs out (one watchdog lease from its last attempt,
/// +500 ms of slack): a writer waiting behind it then gets the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_an_admitted_reader_that_died_frees_the_lock_within_its_registration() {
    let env = Env::redis();
    let server = env.server();
    let client = env.client().await;
    let writer = client
        .rw_lock("dead-reader")
        .write()
        .acquire()
        .await
        .unwrap();
    let mut child = TestProcess::spawn(
        "rw_waiting_reader_child",
        &[(WAITING_READER_ENV, &server.url())],
    )
    .unwrap();
    child.wait_for_line("WAITING", Duration::from_secs(30));
    child.kill();
    let killed = Instant::now();
    writer.release().await.unwrap();
    let admitted: u64 = server
        .query(&["ZCARD", "lockwarden:{dead-reader}:leases"])
        .unwrap();
    assert_eq!(admitted, 1, "the dead reader was not admitted");
    let next = client.rw_lock("dead-reader").write();
    let guard = next
        .try_acquire(Duration::from_secs(10))
        .await
        .expect("the lock is free once the dead reader's registration ran out");
    let after = killed.elapsed();
    assert!(
        after <= CHILD_LEASE + Duration::from_millis(500),
        "the dead reader held the lock {after:?} after it died"
    );
    guard.release().await.unwrap();
}
