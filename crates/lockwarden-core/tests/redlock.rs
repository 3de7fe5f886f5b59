//! Redlock against 3 (and 5) real, independent `redis-server`s: majority rules, node
//! faults (kill, SIGSTOP), validity accounting, capped extensions, lost signal, release.

mod common;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::{finishes, take_and_release};
use lockwarden_core::{LockClient, LockError, Redlock, RedlockBuilder, RedlockError};
use lockwarden_testkit::{eventually, RedisServer};
use tokio::time::Instant;

const LEASE: Duration = Duration::from_secs(5);
const NODE_TIMEOUT: Duration = Duration::from_millis(400);

fn servers(n: usize) -> Vec<RedisServer> {
    (0..n)
        .map(|_| RedisServer::start().expect("start redis-server"))
        .collect()
}

/// Test settings: a node timeout generous for a loaded machine, short retries.
fn settings() -> RedlockBuilder {
    Redlock::builder()
        .lease(LEASE)
        .node_timeout(NODE_TIMEOUT)
        .retry_delay(Duration::from_millis(50))
}

async fn connect(servers: &[RedisServer], builder: RedlockBuilder) -> Redlock {
    let urls: Vec<String> = servers.iter().map(RedisServer::url).collect();
    builder.connect(&urls).await.expect("connect to every node")
}

fn holds(server: &RedisServer, key: &str, holder: &str) -> bool {
    server
        .query::<i64>(&["HEXISTS", key, holder])
        .expect("HEXISTS")
        == 1
}

/// The default clock drift allowance for `lease`: 1 % plus 2 ms.
fn drift(lease: Duration) -> Duration {
    lease.mul_f64(0.01) + Duration::from_millis(2)
}

fn fence_key(redlock: &Redlock, name: &str) -> String {
    format!("{}:fence", redlock.key(name).unwrap().redis_key())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquires_on_every_node_when_all_are_up() {
    let nodes = servers(3);
    let redlock = connect(&nodes, settings()).await;
    let before = Instant::now();
    let guard = redlock
        .lock("all-up")
        .try_acquire(Duration::ZERO)
        .await
        .unwrap();
    let key = guard.key().redis_key().to_owned();
    for node in &nodes {
        assert!(
            holds(node, &key, guard.holder().id()),
            "every node granted it"
        );
    }
    // Counted from the round's start (after `before`), less the drift.
    assert!(guard.valid_until() >= before + LEASE - drift(LEASE));
    assert!(guard.valid_until() <= Instant::now() + LEASE - drift(LEASE));
    assert!(!guard.is_lost());
    // The token is the largest one the nodes issued.
    let fence = fence_key(&redlock, "all-up");
    let largest = nodes
        .iter()
        .map(|n| n.query::<u64>(&["GET", &fence]).unwrap())
        .max()
        .unwrap();
    assert_eq!(guard.fencing_token(), largest);
    guard.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_redlocks_exclude_each_other() {
    let nodes = servers(3);
    let a = connect(&nodes, settings()).await;
    let b = connect(&nodes, settings()).await;
    let held = a.lock("excl").try_acquire(Duration::ZERO).await.unwrap();
    match b.lock("excl").try_acquire(Duration::from_millis(300)).await {
        Err(LockError::Timeout { retry_after, .. }) => assert!(retry_after > Duration::ZERO),
        other => panic!("expected a timeout, got {other:?}"),
    }
    // B's failed rounds left nothing behind: only A's field on every node.
    let key = held.key().redis_key().to_owned();
    for node in &nodes {
        assert_eq!(node.query::<i64>(&["HLEN", &key]).unwrap(), 1);
    }
    held.release().await.unwrap();

    // Contended: 2 Redlocks x 3 tasks x 5 holds, never two inside at once.
    let inside = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for redlock in [a, b] {
        for _ in 0..3 {
            let (redlock, inside, done) = (redlock.clone(), inside.clone(), done.clone());
            tasks.push(tokio::spawn(async move {
                for _ in 0..5 {
                    let guard = redlock
                        .lock("excl")
                        .try_acquire(Duration::from_secs(30))
                        .await?;
                    assert!(!inside.swap(true, Ordering::SeqCst), "two holders at once");
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    inside.store(false, Ordering::SeqCst);
                    done.fetch_add(1, Ordering::SeqCst);
                    guard.release().await?;
                }
                Ok::<_, LockError>(())
            }));
        }
    }
    for task in tasks {
        finishes(Duration::from_secs(60), "contenders finish", task)
            .await
            .unwrap();
    }
    assert_eq!(done.load(Ordering::SeqCst), 30);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_of_three_down_still_acquires() {
    let mut nodes = servers(3);
    let redlock = connect(&nodes, settings()).await;
    nodes[1].kill();
    let guard = redlock
        .lock("one-down")
        .try_acquire(Duration::from_secs(2))
        .await
        .unwrap();
    let key = guard.key().redis_key().to_owned();
    assert!(holds(&nodes[0], &key, guard.holder().id()));
    assert!(holds(&nodes[2], &key, guard.holder().id()));
    guard.release().await.unwrap();
    assert!(!nodes[0].exists(&key) && !nodes[2].exists(&key));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_of_three_down_fails_and_leaves_no_key() {
    let mut nodes = servers(3);
    let redlock = connect(&nodes, settings()).await;
    nodes[0].kill();
    nodes[2].kill();
    let started = Instant::now();
    match redlock
        .lock("two-down")
        .try_acquire(Duration::from_millis(300))
        .await
    {
        Err(LockError::Redlock(RedlockError::NoQuorum {
            granted: 1,
            needed: 2,
            nodes: 3,
            ..
        })) => {}
        other => panic!("expected no quorum, got {other:?}"),
    }
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "gave up near the budget"
    );
    // The survivor granted every round and each round was undone before the next.
    let key = redlock.key("two-down").unwrap();
    assert!(!nodes[1].exists(key.redis_key()));
    assert!(
        nodes[1].exists(&fence_key(&redlock, "two-down")),
        "it did grant"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_node_costs_at_most_the_node_timeout_and_is_cleaned_up() {
    let nodes = servers(3);
    let redlock = connect(&nodes, settings()).await;
    nodes[0].pause();
    let started = Instant::now();
    let acquired = redlock.lock("paused").try_acquire(Duration::ZERO).await;
    let elapsed = started.elapsed();
    let guard = acquired.unwrap();
    assert!(
        elapsed >= NODE_TIMEOUT,
        "waited for the paused node: {elapsed:?}"
    );
    assert!(
        elapsed < NODE_TIMEOUT + Duration::from_secs(1),
        "{elapsed:?}"
    );
    // The validity lost what the round took: it began a node timeout before it ended.
    assert!(guard.valid_until() + NODE_TIMEOUT <= started + elapsed + LEASE - drift(LEASE));
    let key = guard.key().redis_key().to_owned();
    assert!(holds(&nodes[1], &key, guard.holder().id()));
    assert!(holds(&nodes[2], &key, guard.holder().id()));

    nodes[0].resume();
    // The late attempt runs after SIGCONT (it sets the fence key) and is undone long
    // before its lease would end it.
    let fence = fence_key(&redlock, "paused");
    eventually(
        LEASE / 2,
        "the late hold on the paused node is undone",
        || async { nodes[0].exists(&fence) && !nodes[0].exists(&key) },
    )
    .await;
    guard.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn validity_accounts_for_elapsed_time() {
    let nodes = servers(3);
    let lease = Duration::from_secs(2);
    let node_timeout = Duration::from_millis(600);
    let redlock = connect(&nodes, settings().lease(lease).node_timeout(node_timeout)).await;
    let drift = drift(lease);

    let fast_start = Instant::now();
    let fast = redlock
        .lock("v1")
        .try_acquire(Duration::ZERO)
        .await
        .unwrap();
    let fast_end = Instant::now();
    assert!(fast.valid_until() >= fast_start + lease - drift);
    assert!(fast.valid_until() <= fast_end + lease - drift);

    // A stopped node makes the round last the node timeout, and the validity counts from
    // the round's start: it ends at least a node timeout earlier than lease - drift after
    // the round returned.
    nodes[2].pause();
    let slow_start = Instant::now();
    let slow = redlock
        .lock("v2")
        .try_acquire(Duration::ZERO)
        .await
        .unwrap();
    let slow_end = Instant::now();
    nodes[2].resume();
    assert!(slow_end - slow_start >= node_timeout);
    assert!(slow.valid_until() >= slow_start + lease - drift);
    assert!(
        slow.valid_until() + node_timeout <= slow_end + lease - drift,
        "valid until {:?} after the start of a round that took {:?}",
        slow.valid_until() - slow_start,
        slow_end - slow_start
    );
    assert!(slow.validity() <= lease - drift - node_timeout);
    fast.release().await.unwrap();
    slow.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extension_renews_every_node_and_stops_at_the_cap() {
    let nodes = servers(3);
    let lease = Duration::from_millis(1500);
    let redlock = connect(&nodes, settings().lease(lease).max_extensions(2)).await;
    let acquired_at = Instant::now();
    let mut guard = redlock
        .lock("ext")
        .try_acquire(Duration::ZERO)
        .await
        .unwrap();
    let key = guard.key().redis_key().to_owned();
    let first_end = guard.valid_until();

    for n in 1..=2u32 {
        tokio::time::sleep_until(acquired_at + lease * n / 2).await;
        let validity = guard.extend().await.unwrap();
        assert!(validity > lease / 2, "fresh validity {validity:?}");
        assert_eq!(guard.extensions(), n);
    }
    assert!(guard.valid_until() >= first_end + lease / 2 + lease / 4);
    // Past the first lease, every node still holds it: the renewals reached them.
    tokio::time::sleep_until(acquired_at + lease + Duration::from_millis(200)).await;
    for node in &nodes {
        assert!(holds(node, &key, guard.holder().id()));
        assert!(node.pttl(&key) > 0);
    }
    assert!(!guard.is_lost());

    match guard.extend().await {
        Err(LockError::Redlock(RedlockError::ExtensionLimit { max: 2, .. })) => {}
        other => panic!("expected the extension cap, got {other:?}"),
    }
    assert_eq!(guard.extensions(), 2);
    guard.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_fires_when_the_extension_fails() {
    let mut nodes = servers(3);
    let lease = Duration::from_secs(1);
    let redlock = connect(&nodes, settings().lease(lease)).await;
    let mut guard = redlock
        .lock("lost")
        .try_acquire(Duration::ZERO)
        .await
        .unwrap();
    let valid_until = guard.valid_until();
    let signal = guard.lost_signal();
    nodes[0].kill();
    nodes[1].kill();

    match guard.extend().await {
        Err(LockError::Redlock(RedlockError::NoQuorum {
            granted: 1,
            needed: 2,
            ..
        })) => {}
        other => panic!("expected no quorum, got {other:?}"),
    }
    // The failed extension changes nothing until the old validity runs out.
    assert_eq!(guard.valid_until(), valid_until);
    assert!(!signal.is_lost());
    tokio::time::timeout(lease * 2, guard.lost())
        .await
        .expect("the lost signal fires");
    assert!(
        Instant::now() >= valid_until,
        "not before the validity ran out"
    );
    assert!(guard.is_lost() && signal.is_lost());
    assert!(matches!(guard.extend().await, Err(LockError::Lost { .. })));
    assert!(matches!(guard.release().await, Err(LockError::Lost { .. })));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_and_drop_remove_the_key_on_every_node() {
    let nodes = servers(3);
    let redlock = connect(&nodes, settings()).await;
    let guard = redlock
        .lock("rel")
        .try_acquire(Duration::ZERO)
        .await
        .unwrap();
    let key = guard.key().redis_key().to_owned();
    assert!(nodes.iter().all(|n| n.exists(&key)));
    guard.release().await.unwrap();
    assert!(nodes.iter().all(|n| !n.exists(&key)));

    let dropped = redlock
        .lock("rel")
        .try_acquire(Duration::ZERO)
        .await
        .unwrap();
    assert!(nodes.iter().all(|n| n.exists(&key)));
    drop(dropped);
    // Far sooner than the 5 s lease: the drop released it.
    eventually(
        Duration::from_secs(2),
        "the dropped guard's key is gone",
        || async { nodes.iter().all(|n| !n.exists(&key)) },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_gets_the_lock_soon_after_release() {
    let nodes = servers(3);
    // Long lease and re-check interval: only a release notice can wake the waiter in time.
    let slow_recheck = || {
        settings()
            .lease(Duration::from_secs(30))
            .retry_delay(Duration::from_secs(2))
    };
    let a = connect(&nodes, slow_recheck()).await;
    let b = connect(&nodes, slow_recheck()).await;
    let held = a.lock("handoff").try_acquire(Duration::ZERO).await.unwrap();
    let waiter = tokio::spawn(async move {
        let guard = b
            .lock("handoff")
            .try_acquire(Duration::from_secs(20))
            .await?;
        let got_at = Instant::now();
        guard.release().await?;
        Ok::<_, LockError>(got_at)
    });
    let channel = a.key("handoff").unwrap().channel().to_owned();
    eventually(
        Duration::from_secs(5),
        "the waiter subscribed on every node",
        || async { nodes.iter().all(|n| n.subscribers(&channel) == 1) },
    )
    .await;
    let released_at = Instant::now();
    held.release().await.unwrap();
    let got_at = finishes(Duration::from_secs(10), "the waiter finishes", waiter)
        .await
        .unwrap();
    let handoff = got_at - released_at;
    assert!(handoff < Duration::from_secs(1), "handoff took {handoff:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_nodes_tolerate_two_failures_not_three() {
    let mut nodes = servers(5);
    let redlock = connect(&nodes, settings()).await;
    assert_eq!(redlock.quorum(), 3);
    nodes[0].kill();
    nodes[3].kill();
    let guard = redlock
        .lock("five")
        .try_acquire(Duration::ZERO)
        .await
        .unwrap();
    let key = guard.key().redis_key().to_owned();
    for i in [1, 2, 4] {
        assert!(holds(&nodes[i], &key, guard.holder().id()));
    }
    guard.release().await.unwrap();

    nodes[4].kill();
    match redlock.lock("five").try_acquire(Duration::ZERO).await {
        Err(LockError::Redlock(RedlockError::NoQuorum {
            granted: 2,
            needed: 3,
            nodes: 5,
            ..
        })) => {}
        other => panic!("expected no quorum, got {other:?}"),
    }
    assert!(!nodes[1].exists(&key) && !nodes[2].exists(&key));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_sets_and_settings_that_cannot_work_are_refused() {
    let refused = |result: Result<Redlock, LockError>, expect_nodes: usize| match result {
        Err(LockError::Redlock(RedlockError::InvalidNodes { nodes, .. })) => {
            assert_eq!(nodes, expect_nodes)
        }
        other => panic!("expected a refusal, got {other:?}"),
    };
    refused(Redlock::new(Vec::new()), 0);
    refused(Redlock::new(vec![LockClient::in_memory()]), 1);
    // Checked before connecting: nothing listens on these.
    refused(
        Redlock::connect(&["redis://127.0.0.1:1/", "redis://127.0.0.1:2/"]).await,
        2,
    );
    refused(Redlock::connect(&["redis://127.0.0.1:1/"; 3]).await, 3);
    let node = servers(1);
    // Different URLs, one server: it must not count twice.
    let port = node[0].port();
    refused(
        Redlock::connect(&[
            format!("redis://127.0.0.1:{port}/"),
            format!("redis://localhost:{port}/"),
            format!("redis://127.0.0.1:{port}/0"),
        ])
        .await,
        3,
    );
    let client = LockClient::connect(&node[0].url()).await.unwrap();
    refused(
        Redlock::new(vec![client.clone(), client.clone(), client]),
        3,
    );
    assert!(matches!(
        Redlock::builder()
            .lease(Duration::from_millis(100))
            .node_timeout(Duration::from_millis(100))
            .connect(&[node[0].url()])
            .await,
        Err(LockError::Redlock(RedlockError::InvalidSettings(_)))
    ));
    // One node is allowed for development.
    let single = Redlock::connect(&[node[0].url()]).await.unwrap();
    assert_eq!(single.quorum(), 1);
    take_and_release("one node", single.lock("dev").try_acquire(Duration::ZERO)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_abandoned_acquire_leaves_no_hold_behind() {
    let nodes = servers(3);
    let redlock = connect(&nodes, settings()).await;
    let key = redlock.key("abandoned").unwrap().redis_key().to_owned();
    let fence = fence_key(&redlock, "abandoned");
    // With one node stopped the round lasts the node timeout; give up in the middle of it,
    // after the two live nodes have granted.
    nodes[0].pause();
    let abandoned = tokio::time::timeout(
        NODE_TIMEOUT / 2,
        redlock.lock("abandoned").try_acquire(Duration::ZERO),
    )
    .await;
    assert!(abandoned.is_err(), "the caller went away mid-round");
    assert!(
        nodes[1].exists(&fence) && nodes[2].exists(&fence),
        "they granted"
    );
    // The round finished on its own and released what it won, well before the lease.
    eventually(
        Duration::from_secs(2),
        "the live nodes are free again",
        || async { !nodes[1].exists(&key) && !nodes[2].exists(&key) },
    )
    .await;
    nodes[0].resume();
    eventually(
        LEASE / 2,
        "the stopped node's late hold is undone",
        || async { nodes[0].exists(&fence) && !nodes[0].exists(&key) },
    )
    .await;
    // And the lock is free for the next caller.
    let next = redlock.lock("abandoned");
    take_and_release("free for the next caller", next.try_acquire(Duration::ZERO)).await;
}
