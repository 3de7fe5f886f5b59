//! The first command after a connection is lost: a Redis restart (real: SIGKILL, then a
//! new `redis-server` on the same port, empty) or a reset connection (the testkit's
//! `FaultProxy`), on one server, a cluster and Sentinel.
//!
//! The promise: the calls that are safe to send twice (a fresh holder's acquire, a
//! release of a hold nobody can have re-entered, carrying its fencing token) ride over
//! one reconnect within the command timeout, so the caller gets the true answer: after a
//! restart the first fresh acquire and its release answer Ok, a release of a hold the
//! restart wiped answers "not held" or "lost", and after a reset a release frees the
//! lock and says so. None of them answers a connection error.

mod common;

use std::time::Duration;

use common::connect_with;
use common::kinds::{Held, Kind, Opts};
use lockwarden_core::{LockClient, LockClientBuilder, LockError};
use lockwarden_testkit::{FaultProxy, RedisCluster, RedisSentinel, RedisServer};

/// The kinds held by one guard (a multi-lock's parts share a holder, so one part's
/// release may count down a re-entry another part's holder made: never sent twice on
/// one server).
const KINDS: [Kind; 4] = [Kind::Plain, Kind::Fair, Kind::Read, Kind::Write];
/// A fixed lease, so that no renewal meets the broken connection before the call under
/// test (the watchdog's would, and ride over it itself).
const LEASE: Duration = Duration::from_secs(30);
/// How long the reconnect may take, inside the call.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(2);
/// The command timeout of a cluster client whose master restarts (see there).
const CLUSTER_REJOIN: Duration = Duration::from_secs(5);

fn configured(builder: LockClientBuilder) -> LockClientBuilder {
    builder.command_timeout(COMMAND_TIMEOUT)
}

/// Takes and releases every kind once, so the client's connection is made and its
/// scripts are loaded before the fault (a restart then also loses the scripts).
async fn warm(client: &LockClient) {
    for kind in KINDS {
        let name = format!("warm-{kind:?}");
        let held = kind.acquire(client, &name, &held_for_a_lease()).await;
        let held = held.expect("warm-up acquire");
        held.release().await.expect("warm-up release");
    }
}

fn held_for_a_lease() -> Opts {
    Opts::lease(LEASE)
}

/// The first call after the fault, a fresh acquire that may not wait: taken.
async fn first_acquire(client: &LockClient, kind: Kind, name: &str, fault: &str) -> Held {
    kind.try_acquire(client, name, &held_for_a_lease(), Duration::ZERO)
        .await
        .unwrap_or_else(|e| panic!("{kind:?}: the first acquire after {fault}: {e:?}"))
}

/// The release of a hold `fault` wiped: told it was not held (or lost), not that Redis
/// could not be reached.
fn wiped(kind: Kind, fault: &str, released: Result<(), LockError>) {
    assert!(
        matches!(
            released,
            Err(LockError::NotHeld { .. } | LockError::Lost { .. })
        ),
        "{kind:?}: the release of a hold {fault} wiped: {released:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_restart_the_first_calls_answer_on_one_server() {
    let mut server = RedisServer::start().expect("start redis-server");
    let client = connect_with(&server.url(), configured).await;
    warm(&client).await;
    for kind in KINDS {
        let name = format!("restarted-{kind:?}");
        server.restart().expect("restart");
        let held = first_acquire(&client, kind, &name, "a restart").await;
        held.release().await.expect("its release");

        let opts = held_for_a_lease();
        let held = kind.acquire(&client, &name, &opts).await.expect("acquire");
        server.restart().expect("restart");
        wiped(kind, "a restart", held.release().await);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_reset_the_first_calls_answer_on_one_server() {
    let server = RedisServer::start().expect("start redis-server");
    let proxy = FaultProxy::start(server.port()).expect("start the proxy");
    let client = connect_with(&proxy.url(), configured).await;
    warm(&client).await;
    for kind in KINDS {
        let name = format!("reset-{kind:?}");
        reset(&proxy).await;
        let held = first_acquire(&client, kind, &name, "a reset").await;
        // The hold outlives the reset: its release frees it, and says so.
        reset(&proxy).await;
        held.release().await.unwrap_or_else(|e| {
            panic!("{kind:?}: the first release after a reset: {e:?}");
        });
        let left = server.keys_matching(&format!("lockwarden:{{{name}}}*"));
        let left: Vec<_> = left.iter().filter(|k| !k.ends_with(":fence")).collect();
        assert!(left.is_empty(), "{kind:?}: left {left:?}");
    }
}

/// Resets every connection through `proxy` and lets the client's reader see it.
async fn reset(proxy: &FaultProxy) {
    proxy.reset();
    tokio::time::sleep(Duration::from_millis(100)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_restart_the_first_calls_answer_on_sentinel() {
    let mut sentinel = RedisSentinel::start().expect("start sentinel");
    let client = configured(LockClient::builder())
        .connect_sentinel([sentinel.sentinel_url()], sentinel.service())
        .await
        .expect("connect through the sentinel");
    warm(&client).await;
    let primary = sentinel.master_port().expect("the primary");
    let at = sentinel
        .servers()
        .iter()
        .position(|s| s.port() == primary)
        .expect("the primary is one of the pair");
    for kind in KINDS {
        let name = format!("restarted-{kind:?}");
        sentinel.servers_mut()[at].restart().expect("restart");
        let held = first_acquire(&client, kind, &name, "a restart").await;
        held.release().await.expect("its release");

        let opts = held_for_a_lease();
        let held = kind.acquire(&client, &name, &opts).await.expect("acquire");
        sentinel.servers_mut()[at].restart().expect("restart");
        wiped(kind, "a restart", held.release().await);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_restart_the_first_calls_answer_on_a_cluster() {
    let mut cluster = RedisCluster::start(2).expect("start a cluster");
    // A restarted master refuses writes (CLUSTERDOWN) for its first 2 s, to let the
    // cluster reconfigure it first (Redis's `CLUSTER_WRITABLE_DELAY`): the call must be
    // allowed longer than that.
    let client = LockClient::builder()
        .command_timeout(CLUSTER_REJOIN)
        .connect_cluster(cluster.urls())
        .await
        .expect("connect to the cluster");
    warm(&client).await;
    for kind in KINDS {
        let name = format!("restarted-{kind:?}");
        let owner = owner(&cluster, &client, kind, &name);
        cluster.nodes_mut()[owner].restart().expect("restart");
        let held = first_acquire(&client, kind, &name, "a restart").await;
        held.release().await.expect("its release");

        let opts = held_for_a_lease();
        let held = kind.acquire(&client, &name, &opts).await.expect("acquire");
        cluster.nodes_mut()[owner].restart().expect("restart");
        wiped(kind, "a restart", held.release().await);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_reset_the_first_calls_answer_on_a_cluster() {
    let cluster = RedisCluster::start_proxied(2).expect("start a proxied cluster");
    let client = configured(LockClient::builder())
        .connect_cluster(cluster.urls())
        .await
        .expect("connect to the cluster");
    warm(&client).await;
    for kind in KINDS {
        let name = format!("reset-{kind:?}");
        let owner = owner(&cluster, &client, kind, &name);
        let proxy = cluster.proxy(owner).expect("a proxied node");
        reset(proxy).await;
        let held = first_acquire(&client, kind, &name, "a reset").await;
        reset(proxy).await;
        held.release().await.unwrap_or_else(|e| {
            panic!("{kind:?}: the first release after a reset: {e:?}");
        });
        let key = &kind.redis_keys(&client, &name)[0];
        assert!(!cluster.exists_on(owner, key), "{kind:?}: released");
    }
}

/// The master that owns the lock `name` of `kind`.
fn owner(cluster: &RedisCluster, client: &LockClient, kind: Kind, name: &str) -> usize {
    let key = &kind.redis_keys(client, name)[0];
    cluster.owner(key).expect("owner")
}

/// Promise, the other side: a release that may count down a re-entry is not sent again
/// on one server, where no call id tells its second run from another release. Here the
/// inner release ran (count 2 to 1) and its connection broke before the reply: sent
/// again it would end the outer hold too. The caller is told the release failed, and
/// the outer hold stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reentrys_release_whose_connection_broke_is_not_sent_again_on_one_server() {
    let server = RedisServer::start().expect("start redis-server");
    let proxy = FaultProxy::start(server.port()).expect("start the proxy");
    let client = connect_with(&proxy.url(), configured).await;
    // Its pub/sub connection up first: one opening while replies are dropped would lose
    // its handshake's reply instead of the release's.
    common::listening(&client, &server, "listening").await;
    let me = client.holder();
    let lock = client.lock("twice").holder(&me).lease(LEASE);
    // Once through, so release.lua is loaded: the release under test runs at once.
    let warm = lock.acquire().await.expect("warm-up");
    warm.release().await.expect("warm-up release");
    let outer = lock.acquire().await.expect("outer");
    let inner = lock.acquire().await.expect("inner");

    let lost_before = proxy.lost_replies();
    proxy.drop_replies();
    let released = tokio::spawn(inner.release());
    lockwarden_testkit::eventually(Duration::from_secs(1), "the reply is lost", || async {
        proxy.lost_replies() > lost_before
    })
    .await;
    // The connection that lost the reply is reset: the release meets a broken connection.
    proxy.heal();
    let released = common::finishes(Duration::from_secs(5), "the release", released).await;
    assert!(
        matches!(released, Err(LockError::Backend(_))),
        "the caller is told: {released:?}"
    );
    let count: Option<String> = server
        .query(&["HGET", "lockwarden:{twice}", me.id()])
        .expect("HGET");
    assert_eq!(
        count.as_deref(),
        Some("1"),
        "counted down once: the outer hold stays"
    );
    outer.release().await.expect("the outer release");
    assert!(!server.exists("lockwarden:{twice}"));
}
