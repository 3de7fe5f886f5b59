//! Redis Cluster: every kind of lock on a real 3-master cluster started by the testkit,
//! with locks whose keys hash to each master, a multi-lock spanning masters, bulk
//! renewals and releases across slots, a held lock whose slot moves to another master
//! while a waiter waits for it, and `wait_for_replicas` counting the replicas of the
//! master that took each lock.
//!
//! A script that touched keys of two slots would fail with CROSSSLOT, and a notice on
//! the wrong node would leave a waiter to its (30 s) lease timeout: these tests would
//! fail in either case.

use std::time::{Duration, Instant};

use lockwarden_core::{
    BackendError, Claim, LockClient, LockClientBuilder, LockError, LockGuard, ReleaseNotices,
};
use lockwarden_testkit::{eventually, RedisCluster};

/// Long enough that a waiter served before it was served by a release notice.
const LEASE: Duration = Duration::from_secs(30);
/// How soon a notified waiter must have the lock (generous: a shared, loaded machine).
const SERVED: Duration = Duration::from_secs(3);

async fn client(cluster: &RedisCluster) -> LockClient {
    client_with(cluster, |b| b).await
}

async fn client_with(
    cluster: &RedisCluster,
    configure: impl FnOnce(LockClientBuilder) -> LockClientBuilder,
) -> LockClient {
    configure(LockClient::builder().watchdog_timeout(LEASE))
        .connect_cluster(cluster.urls())
        .await
        .expect("connect to the cluster")
}

/// Runs `fut` on a task of its own; its output comes with how long it took.
fn timed<F>(fut: F) -> tokio::task::JoinHandle<(F::Output, Duration)>
where
    F: std::future::Future + Send + 'static,
    F::Output: Send + 'static,
{
    tokio::spawn(async move {
        let started = Instant::now();
        let out = fut.await;
        (out, started.elapsed())
    })
}

/// A lock name whose keys live on master `node`, distinct per `tag`.
fn name_on(cluster: &RedisCluster, client: &LockClient, node: usize, tag: &str) -> String {
    (0..10_000)
        .map(|i| format!("{tag}:{i}"))
        .find(|name| {
            let key = client.key(name).unwrap();
            cluster.owner(key.redis_key()).unwrap() == node
        })
        .expect("some name hashes to every master")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_on_each_master_excludes_and_hands_over_by_notice() {
    let cluster = RedisCluster::start(3).unwrap();
    let (a, b) = (client(&cluster).await, client(&cluster).await);
    for node in 0..3 {
        let name = name_on(&cluster, &a, node, "order");
        let guard = a.acquire(&name).await.unwrap();
        let key = guard.key().redis_key().to_owned();
        assert!(cluster.exists_on(node, &key), "{key} not on master {node}");
        assert!(matches!(
            b.try_acquire(&name, Duration::ZERO).await,
            Err(LockError::Timeout { .. })
        ));

        let waiter = {
            let (b, name) = (b.clone(), name.clone());
            timed(async move { b.try_acquire(&name, Duration::from_secs(10)).await })
        };
        tokio::time::sleep(Duration::from_millis(200)).await;
        let token = guard.fencing_token();
        guard.release().await.unwrap();
        let (next, waited) = waiter.await.unwrap();
        let next = next.unwrap();
        assert!(
            waited < SERVED,
            "waiter on master {node} served after {waited:?}: no notice"
        );
        assert!(next.fencing_token() > token);
        next.release().await.unwrap();
        assert!(!cluster.exists_on(node, &key));
    }
}

/// Promise: a cluster client without fencing tokens (its acquire script's cluster
/// variant, which takes a call id) takes, re-enters and releases on every master with
/// token 0, and the next token of a client with tokens still grows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_without_fencing_tokens_locks_on_each_master() {
    let cluster = RedisCluster::start(3).unwrap();
    let fenced = client(&cluster).await;
    let unfenced = client_with(&cluster, |b| b.without_fencing_tokens()).await;
    for node in 0..3 {
        let name = name_on(&cluster, &fenced, node, "unfenced");
        let key = fenced.key(&name).unwrap().redis_key().to_owned();
        let first = fenced.acquire(&name).await.unwrap();
        let token = first.fencing_token();
        first.release().await.unwrap();

        let guard = unfenced.acquire(&name).await.unwrap();
        // A given holder's call carries its id on a cluster.
        let again = unfenced
            .lock(&name)
            .holder(guard.holder())
            .acquire()
            .await
            .unwrap();
        assert_eq!((guard.fencing_token(), again.fencing_token()), (0, 0));
        assert!(cluster.exists_on(node, &key));
        assert!(matches!(
            fenced.try_acquire(&name, Duration::ZERO).await,
            Err(LockError::Timeout { .. })
        ));
        again.release().await.unwrap();
        guard.release().await.unwrap();
        assert!(!cluster.exists_on(node, &key));

        let next = fenced.acquire(&name).await.unwrap();
        assert!(next.fencing_token() > token, "master {node}");
        next.release().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fair_read_write_and_claims_work_on_each_master() {
    let cluster = RedisCluster::start(3).unwrap();
    let (a, b) = (client(&cluster).await, client(&cluster).await);
    for node in 0..3 {
        // Fair: the queued waiter is woken when the holder releases.
        let name = name_on(&cluster, &a, node, "fair");
        let held = a.fair_lock(&name).acquire().await.unwrap();
        assert!(cluster.exists_on(node, held.key().redis_key()));
        let waiter = {
            let (b, name) = (b.clone(), name.clone());
            timed(async move {
                b.fair_lock(&name)
                    .try_acquire(Duration::from_secs(10))
                    .await
            })
        };
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(a.fair_lock(&name).queued().await.unwrap(), 1);
        held.release().await.unwrap();
        let (next, waited) = waiter.await.unwrap();
        assert!(
            waited < SERVED,
            "fair waiter on {node} served after {waited:?}"
        );
        next.unwrap().release().await.unwrap();

        // Read-write: two readers share, a writer waits for both.
        let name = name_on(&cluster, &a, node, "rw");
        let r1 = a.rw_lock(&name).read().acquire().await.unwrap();
        let r2 = b.rw_lock(&name).read().acquire().await.unwrap();
        assert!(cluster.exists_on(node, r1.key().redis_key()));
        let writer = {
            let (b, name) = (b.clone(), name.clone());
            timed(async move {
                b.rw_lock(&name)
                    .write()
                    .try_acquire(Duration::from_secs(10))
                    .await
            })
        };
        tokio::time::sleep(Duration::from_millis(200)).await;
        r1.release().await.unwrap();
        r2.release().await.unwrap();
        let (w, waited) = writer.await.unwrap();
        assert!(waited < SERVED, "writer on {node} served after {waited:?}");
        w.unwrap().release().await.unwrap();

        // Claims: the outcome key is in the lock's slot too.
        let name = name_on(&cluster, &a, node, "claim");
        let Claim::Acquired(guard) = a.lock(&name).try_claim(Duration::ZERO).await.unwrap() else {
            panic!("a fresh claim is acquired");
        };
        guard
            .complete(b"done".to_vec(), Duration::from_secs(60))
            .await
            .unwrap();
        match b.lock(&name).try_claim(Duration::ZERO).await.unwrap() {
            Claim::Completed(outcome) => assert_eq!(outcome, b"done"),
            Claim::Acquired(_) => panic!("a completed claim was handed out again"),
        }
    }
}

/// A semaphore on each master, both notice kinds: its keys on the master that owns its
/// slot, at most its capacity held, a waiter in line granted its permit by a release
/// (by name, over a sharded or classic notice), nothing left after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_semaphore_on_each_master_grants_by_notice() {
    let cluster = RedisCluster::start(3).unwrap();
    for notices in [ReleaseNotices::Sharded, ReleaseNotices::Classic] {
        let configure = |b: LockClientBuilder| b.notices(notices);
        let (a, b) = (
            client_with(&cluster, configure).await,
            client_with(&cluster, configure).await,
        );
        for node in 0..3 {
            let name = name_on(&cluster, &a, node, "exports");
            let sem = a.semaphore(&name, 2);
            let two = sem.acquire_many(2).await.unwrap();
            let key = two.key().redis_key().to_owned();
            assert!(cluster.exists_on(node, &key), "{key} not on master {node}");
            let fence = format!("{key}:fence");
            assert!(cluster.exists_on(node, &fence), "{fence} elsewhere");
            assert!(matches!(
                b.semaphore(&name, 2).try_acquire(Duration::ZERO).await,
                Err(LockError::Timeout { .. })
            ));
            let waiter = {
                let sem = b.semaphore(&name, 2);
                timed(async move { sem.try_acquire(Duration::from_secs(10)).await })
            };
            eventually(Duration::from_secs(5), "the waiter in line", || async {
                sem.state().await.unwrap().map(|s| s.waiting) == Some(1)
            })
            .await;
            tokio::time::sleep(Duration::from_millis(200)).await; // subscribed
            let released_at = Instant::now();
            two.release().await.unwrap();
            let (got, _) = waiter.await.unwrap();
            let got = got.expect("granted by the release");
            assert!(
                released_at.elapsed() < SERVED,
                "{notices:?}, master {node}: served {:?} after the release",
                released_at.elapsed()
            );
            got.release().await.unwrap();
            assert_eq!(sem.state().await.unwrap(), None);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_multi_lock_spans_masters_and_holds_nothing_while_it_waits() {
    let cluster = RedisCluster::start(3).unwrap();
    let (a, b) = (client(&cluster).await, client(&cluster).await);
    let names: Vec<String> = (0..3).map(|n| name_on(&cluster, &a, n, "acct")).collect();
    let keys: Vec<(usize, String)> = names
        .iter()
        .enumerate()
        .map(|(n, name)| (n, a.key(name).unwrap().redis_key().to_owned()))
        .collect();

    let all = a
        .multi_lock(names.iter().cloned())
        .try_acquire(Duration::from_secs(1))
        .await
        .unwrap();
    assert_eq!(all.guards().len(), 3);
    for (node, key) in &keys {
        assert!(cluster.exists_on(*node, key));
    }
    all.release().await.unwrap();
    for (node, key) in &keys {
        assert!(!cluster.exists_on(*node, key));
    }

    // Master 2's lock is busy: a multi-lock over all three waits, holding none of them.
    let busy = b.acquire(&names[2]).await.unwrap();
    let waiter = {
        let (a, names) = (a.clone(), names.clone());
        timed(async move {
            a.multi_lock(names.iter().cloned())
                .try_acquire(Duration::from_secs(10))
                .await
        })
    };
    for _ in 0..10 {
        tokio::time::sleep(Duration::from_millis(30)).await;
        for (node, key) in &keys[..2] {
            assert!(
                !cluster.exists_on(*node, key),
                "{key} held while the set waits"
            );
        }
    }
    busy.release().await.unwrap();
    let (all, waited) = waiter.await.unwrap();
    assert!(waited < SERVED, "multi-lock served after {waited:?}");
    let all = all.unwrap();
    for (node, key) in &keys {
        assert!(cluster.exists_on(*node, key));
    }
    all.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_watchdog_and_dropped_guards_cover_every_slot() {
    let cluster = RedisCluster::start(3).unwrap();
    // Renewals stalled past a lease lose the hold, as promised: the lease must outlast
    // the stalls of a loaded machine, where this target's tests start 36 servers at once
    // (900 ms did not).
    let lease = Duration::from_secs(2);
    let client = client_with(&cluster, |b| b.watchdog_timeout(lease)).await;
    // Many slots on every master: renewals and releases are pipelined per slot.
    let guards =
        futures_util::future::try_join_all((0..60).map(|i| client.acquire(format!("renewed:{i}"))))
            .await
            .unwrap();
    let mut on = [0; 3];
    for guard in &guards {
        on[cluster.owner(guard.key().redis_key()).unwrap()] += 1;
    }
    assert!(on.iter().all(|&n| n > 0), "locks per master: {on:?}");

    // Past two leases: every hold was renewed at least once.
    tokio::time::sleep(lease * 2).await;
    for guard in &guards {
        assert!(!guard.is_lost(), "{} lost", guard.key());
        let ttl = cluster.pttl(guard.key().redis_key());
        assert!(ttl > 0, "{} not renewed: PTTL {ttl}", guard.key());
    }

    let keys: Vec<String> = guards
        .iter()
        .map(|g| g.key().redis_key().to_owned())
        .collect();
    let owners: Vec<usize> = keys.iter().map(|k| cluster.owner(k).unwrap()).collect();
    drop(guards);
    eventually(
        Duration::from_secs(5),
        "every dropped guard's lock is gone from its master",
        || async {
            keys.iter()
                .zip(&owners)
                .all(|(key, &node)| !cluster.exists_on(node, key))
        },
    )
    .await;
}

/// With sharded notices (the default on a cluster of Redis 7): the waiter's `SSUBSCRIBE`
/// follows the slot too (the old owner drops it when the slot leaves; redis-rs
/// subscribes again on the new one).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_lock_follows_its_slot_to_another_master() {
    follows_its_slot(|b| b).await;
}

/// The same with classic notices.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_lock_follows_its_slot_with_classic_notices() {
    follows_its_slot(|b: LockClientBuilder| b.notices(ReleaseNotices::Classic)).await;
}

async fn follows_its_slot(notices: fn(LockClientBuilder) -> LockClientBuilder) {
    let cluster = RedisCluster::start(3).unwrap();
    let lease = Duration::from_millis(900);
    let a = client_with(&cluster, |b| notices(b).watchdog_timeout(lease)).await;
    let b = client_with(&cluster, notices).await;
    let name = name_on(&cluster, &a, 0, "moving");
    let guard = a.acquire(&name).await.unwrap();
    let key = guard.key().redis_key().to_owned();
    let waiter = {
        let (b, name) = (b.clone(), name.clone());
        tokio::spawn(async move { b.try_acquire(&name, Duration::from_secs(20)).await })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;

    let slot = cluster.slot(&key).unwrap();
    cluster.move_slot(slot, 1).unwrap();
    assert_eq!(cluster.owner(&key).unwrap(), 1);
    assert!(cluster.exists_on(1, &key) && !cluster.exists_on(0, &key));

    // Renewals find the lock on its new master...
    tokio::time::sleep(lease * 2).await;
    assert!(!guard.is_lost(), "lock lost after its slot moved");
    assert!(!waiter.is_finished(), "waiter got a held lock");
    // ...and so do the release and its notice.
    let released = Instant::now();
    guard.release().await.unwrap();
    let next = waiter.await.unwrap().unwrap();
    assert!(
        released.elapsed() < SERVED,
        "waiter served {:?} after the release",
        released.elapsed()
    );
    assert!(cluster.exists_on(1, &key));
    next.release().await.unwrap();
    assert!(!cluster.exists_on(1, &key));
}

/// Promise (sharded notices): on a cluster whose masters all run
/// Redis 7 a release's notice is sharded by default (`SPUBLISH`), processed by the master
/// that owns the lock only, and still wakes a waiter of another client at once; so with
/// `notices(ReleaseNotices::Sharded)`. With `notices(ReleaseNotices::Classic)` notices are relayed to every master, as
/// Redis does with `PUBLISH`. Each round hands the lock over by notice, so a notice that
/// went astray would leave the waiter to the 30 s lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sharded_notices_stay_on_the_owning_master_and_classic_ones_reach_every_master() {
    const ROUNDS: u64 = 5;
    const OWNER: usize = 0;
    let cluster = RedisCluster::start(3).unwrap();
    let default = |b: LockClientBuilder| b;
    for (asked, configure, classic) in [
        ("default", default as fn(_) -> _, false),
        (
            "notices(ReleaseNotices::Sharded)",
            |b: LockClientBuilder| b.notices(ReleaseNotices::Sharded),
            false,
        ),
        (
            "notices(ReleaseNotices::Classic)",
            |b: LockClientBuilder| b.notices(ReleaseNotices::Classic),
            true,
        ),
    ] {
        let a = client_with(&cluster, configure).await;
        let b = client_with(&cluster, configure).await;
        let name = name_on(&cluster, &a, OWNER, &format!("notices-{asked}"));
        let owner = &cluster.nodes()[OWNER];
        let others = [1, 2];
        let relayed_before: Vec<u64> = others
            .iter()
            .map(|&n| cluster.nodes()[n].publishes_received())
            .collect();
        let (spublish_before, publish_before) = (
            owner.command_calls("spublish"),
            owner.command_calls("publish"),
        );
        for _ in 0..ROUNDS {
            let guard = a.acquire(&name).await.unwrap();
            let waiter = timed({
                let (b, name) = (b.clone(), name.clone());
                async move { b.try_acquire(&name, Duration::from_secs(20)).await }
            });
            tokio::time::sleep(Duration::from_millis(200)).await; // the waiter subscribes
            assert!(!waiter.is_finished(), "the waiter got a held lock");
            let released = Instant::now();
            guard.release().await.unwrap();
            let (next, _) = waiter.await.unwrap();
            let next = next.unwrap_or_else(|e| panic!("{asked}: {e}"));
            assert!(
                released.elapsed() < SERVED,
                "{asked}: served {:?} after the release",
                released.elapsed()
            );
            next.release().await.unwrap();
        }
        let relayed: Vec<u64> = others
            .iter()
            .zip(&relayed_before)
            .map(|(&n, before)| cluster.nodes()[n].publishes_received() - before)
            .collect();
        let spublished = owner.command_calls("spublish") - spublish_before;
        let published = owner.command_calls("publish") - publish_before;
        if classic {
            assert!(
                published >= ROUNDS && spublished == 0,
                "{asked}: {published} {spublished}"
            );
            assert!(
                relayed.iter().all(|&n| n >= ROUNDS),
                "{asked}: every master processed each notice: {relayed:?}"
            );
        } else {
            assert!(
                spublished >= ROUNDS && published == 0,
                "{asked}: {spublished} {published}"
            );
            assert_eq!(
                relayed,
                [0, 0],
                "{asked}: no other master processed a notice"
            );
        }
    }
}

/// Promise (sharded notices): a waiter keeps hearing releases
/// with sharded notices when its lock's master changes.
/// - A manual `CLUSTER FAILOVER`: Redis keeps the subscription on the demoted master,
///   which still receives what its shard publishes, so the release (on the new master)
///   wakes the waiter at once.
/// - The master the waiter subscribed on is SIGKILLed and its replica takes over by
///   itself: the subscription moves to the new master, where the release wakes the
///   waiter at once.
///
/// Either way well before the holder's 30 s lease would have.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_follows_a_failover_with_sharded_notices() {
    const FIRST: usize = 0;
    let mut cluster = RedisCluster::start(3).unwrap();
    let second = cluster.add_replica(FIRST).unwrap();
    let a = client_with(&cluster, |b: LockClientBuilder| {
        b.notices(ReleaseNotices::Sharded)
    })
    .await;
    let b = client_with(&cluster, |b: LockClientBuilder| {
        b.notices(ReleaseNotices::Sharded)
    })
    .await;
    let wait = |name: &str| {
        let (b, name) = (b.clone(), name.to_owned());
        tokio::spawn(async move { b.try_acquire(&name, Duration::from_secs(25)).await })
    };

    // A manual failover: FIRST becomes SECOND's replica.
    let name = name_on(&cluster, &a, FIRST, "failover");
    let guard = a.acquire(&name).await.unwrap();
    let (key, channel) = (
        guard.key().redis_key().to_owned(),
        guard.key().channel().to_owned(),
    );
    let waiter = wait(&name);
    subscribed(&cluster, FIRST, &channel).await;
    cluster.fail_over(second).unwrap();
    assert_eq!(cluster.owner(&key).unwrap(), second);
    assert!(
        !waiter.is_finished(),
        "the waiter ended: {:?}",
        waiter.await
    );
    // The new master has the take's function (replicated from the old one): the waiter's
    // take runs there as a function.
    let calls = cluster.nodes()[second].command_calls("fcall");
    served_on_release(guard, waiter).await;
    assert!(cluster.nodes()[second].command_calls("fcall") > calls);

    // SECOND, the master now, dies; FIRST takes over by itself. The waiter's client is
    // new, so it subscribes on SECOND (b's slot map may still name FIRST, and a replica
    // takes a subscription too).
    let name = name_on(&cluster, &a, second, "killed");
    let guard = a.acquire(&name).await.unwrap();
    let (key, channel) = (
        guard.key().redis_key().to_owned(),
        guard.key().channel().to_owned(),
    );
    let c = client_with(&cluster, |b: LockClientBuilder| {
        b.notices(ReleaseNotices::Sharded)
    })
    .await;
    let waiter = {
        let name = name.clone();
        tokio::spawn(async move { c.try_acquire(&name, Duration::from_secs(25)).await })
    };
    subscribed(&cluster, second, &channel).await;
    // The hold reaches the replica before its master dies.
    tokio::time::sleep(Duration::from_millis(300)).await;
    cluster.nodes_mut()[second].kill();
    eventually(
        Duration::from_secs(30),
        "the replica takes over",
        || async { cluster.owner(&key).is_ok_and(|owner| owner == FIRST) },
    )
    .await;
    subscribed(&cluster, FIRST, &channel).await;
    assert!(
        !waiter.is_finished(),
        "the waiter ended: {:?}",
        waiter.await
    );
    served_on_release(guard, waiter).await;
}

/// Waits (bounded) until one connection is subscribed to the shard channel `channel` on
/// node `node`.
async fn subscribed(cluster: &RedisCluster, node: usize, channel: &str) {
    let what = format!("the waiter subscribes on node {node}");
    eventually(Duration::from_secs(15), what, || async {
        cluster.nodes()[node].shard_subscribers(channel) == 1
    })
    .await;
}

/// Releases `guard` and asserts that `waiter` gets the lock within [`SERVED`] (a notice,
/// not the holder's lease), then releases that too.
async fn served_on_release(
    guard: LockGuard,
    waiter: tokio::task::JoinHandle<Result<LockGuard, LockError>>,
) {
    let released = Instant::now();
    guard.release().await.unwrap();
    let next = waiter.await.unwrap().unwrap();
    let served = released.elapsed();
    assert!(served < SERVED, "served {served:?} after the release");
    next.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_for_replicas_counts_the_replicas_of_the_master_that_took_the_lock() {
    const FIRST: usize = 0;
    let mut cluster = RedisCluster::start(3).unwrap();
    let replica = cluster.add_replica(FIRST).unwrap();
    let waiting = client_with(&cluster, |b| {
        b.wait_for_replicas(1, Duration::from_millis(300))
    })
    .await;
    let plain = client_with(&cluster, |b| b).await;
    let on_first = |tag: &str| name_on(&cluster, &waiting, FIRST, tag);
    let (one, pair) = (on_first("one"), [on_first("pair-a"), on_first("pair-b")]);
    let across = [pair[0].clone(), name_on(&cluster, &waiting, 1, "elsewhere")];
    let not_replicated = |outcome: Result<(), LockError>| {
        assert!(
            matches!(
                outcome,
                Err(LockError::Backend(BackendError::NotReplicated { .. }))
            ),
            "expected NotReplicated, got {outcome:?}"
        );
    };

    // On FIRST, whose replica acknowledges: a lock, and a multi-lock of two locks there.
    let guard = waiting.try_acquire(&one, Duration::ZERO).await.unwrap();
    guard.release().await.unwrap();
    let guards = waiting.multi_lock(&pair).try_acquire(Duration::ZERO).await;
    guards.unwrap().release().await.unwrap();
    // Across masters, one of them without a replica: not replicated.
    not_replicated(
        waiting
            .multi_lock(&across)
            .try_acquire(Duration::ZERO)
            .await
            .map(drop),
    );
    // FIRST's replica stopped: neither kind is.
    cluster.nodes()[replica].pause();
    let single = waiting.try_acquire(&one, Duration::ZERO).await.map(drop);
    let multi = waiting.multi_lock(&pair).try_acquire(Duration::ZERO).await;
    cluster.nodes()[replica].resume();
    not_replicated(single);
    not_replicated(multi.map(drop));
    // Nothing refused was left held.
    for name in [&one, &pair[0], &pair[1], &across[1]] {
        let guard = plain.try_acquire(name, Duration::ZERO).await;
        let guard = guard.unwrap_or_else(|e| panic!("{name} was left held: {e}"));
        guard.release().await.unwrap();
    }
}

/// Promise: a cluster client chooses how its notices travel from every master's answer,
/// or not at all. With a master down (and no replica to take over) connecting fails at
/// once with a transient error, where choosing from the masters that answered could pick
/// sharded notices that the missing one (say, one still on Redis 6) cannot run; a client
/// that pins `notices(ReleaseNotices::Classic)` asks nothing and connects.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connecting_with_a_master_down_fails_unless_the_notices_are_pinned() {
    let mut cluster = RedisCluster::start(3).unwrap();
    cluster.nodes_mut()[2].kill();
    let builder = || LockClient::builder().command_timeout(Duration::from_secs(2));
    for (asked, builder) in [
        ("default", builder()),
        (
            "notices(ReleaseNotices::Sharded)",
            builder().notices(ReleaseNotices::Sharded),
        ),
    ] {
        match builder.connect_cluster(cluster.urls()).await {
            Err(LockError::Backend(error)) => {
                assert!(error.is_transient(), "{asked}: {error}");
                let text = error.to_string();
                assert!(text.contains("2 of 3 answered"), "{asked}: {text}");
            }
            Err(other) => panic!("{asked}: not a backend error: {other}"),
            Ok(_) => panic!("{asked}: connected without asking the dead master"),
        }
    }
    let client = builder()
        .notices(ReleaseNotices::Classic)
        .connect_cluster(cluster.urls())
        .await
        .expect("classic notices ask no master");
    let name = name_on(&cluster, &client, 0, "alive");
    // Not every master could load the take's function: it goes by digest everywhere.
    let calls = cluster.nodes()[0].command_calls("fcall");
    client
        .acquire(&name)
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    assert_eq!(cluster.nodes()[0].command_calls("fcall"), calls);
}

/// How many of lockwarden's function libraries node `node` holds (`FUNCTION LIST`).
fn libraries_on(cluster: &RedisCluster, node: usize) -> usize {
    let listed: Vec<redis::Value> = cluster.nodes()[node]
        .query(&["FUNCTION", "LIST", "LIBRARYNAME", "lockwarden_*"])
        .unwrap();
    listed.len()
}

/// Promise: on a cluster the plain take's function is loaded on every master at connect
/// and each master runs the take as a function (`FCALL`, no `EVALSHA`); a master that
/// lost its functions (`FUNCTION FLUSH`) is given them again by the next take there,
/// which then runs once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_plain_take_goes_as_a_function_on_every_master() {
    let cluster = RedisCluster::start(3).unwrap();
    let client = client(&cluster).await;
    for node in 0..3 {
        assert_eq!(libraries_on(&cluster, node), 1, "master {node}");
        let name = name_on(&cluster, &client, node, "function");
        let calls = |c| cluster.nodes()[node].command_calls(c);
        let before = [calls("fcall"), calls("evalsha")];
        let guard = client.acquire(&name).await.unwrap();
        assert_eq!(
            [calls("fcall") - before[0], calls("evalsha") - before[1]],
            [1, 0],
            "master {node}: FCALL, EVALSHA"
        );
        guard.release().await.unwrap();
    }

    let _: String = cluster.nodes()[1].query(&["FUNCTION", "FLUSH"]).unwrap();
    assert_eq!(libraries_on(&cluster, 1), 0);
    let name = name_on(&cluster, &client, 1, "flushed");
    let guard = client.acquire(&name).await.unwrap();
    assert_eq!(libraries_on(&cluster, 1), 1);
    let key = guard.key().redis_key().to_owned();
    let fields: Vec<String> = cluster.nodes()[1].query(&["HKEYS", &key]).unwrap();
    assert_eq!(fields, [guard.holder().id()], "taken once");
    guard.release().await.unwrap();
    assert!(!cluster.exists_on(1, &key));
}
