//! TLS (`rediss://`): real `redis-server`s that speak TLS on the port the client is given,
//! with certificates made for this run by the testkit (`TlsCerts`: a CA, a server
//! certificate for 127.0.0.1 signed by it, a client certificate, an unrelated CA).
//!
//! The servers keep a plain-text port on loopback for the testkit's probes only. Every
//! test that runs locks also asks the server (`CLIENT LIST`'s `laddr`) which port each of
//! the client's connections came in on: the command connection, the pub/sub connection
//! that carries release notices and the `WAIT` connection must all be on the TLS port, so
//! a connection that skipped TLS would fail these tests.

#![cfg(feature = "tls")]

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{finishes, only_the_locks_user_may_lock, spawn_timed, take_and_release};
use lockwarden_core::{BackendError, LockClient, LockClientBuilder, LockError, LockGuard};
use lockwarden_testkit::{
    eventually, ClientInfo, RedisCluster, RedisSentinel, RedisServer, TlsCerts,
};

/// A fixed lease long enough that a waiter served well before it was served by a
/// release notice, not by the lease running out.
const LEASE: Duration = Duration::from_secs(30);
/// How soon a notified waiter must have the lock (generous: a shared, loaded machine).
const SERVED: Duration = Duration::from_secs(3);
/// How long subscriptions and connections may take to show up on the server.
const SETTLE: Duration = Duration::from_secs(5);

fn certs() -> Arc<TlsCerts> {
    TlsCerts::generate().expect("generate test certificates")
}

/// A builder that trusts the test CA.
fn trusting(certs: &TlsCerts) -> LockClientBuilder {
    LockClient::builder().tls_root_certificate(certs.ca_pem())
}

async fn client(server: &RedisServer, certs: &TlsCerts) -> LockClient {
    trusting(certs)
        .connect(&server.url())
        .await
        .unwrap_or_else(|e| panic!("connect to {}: {e}", server.url()))
}

/// The port a connection came in on (`laddr=127.0.0.1:PORT`).
fn local_port(client: &ClientInfo) -> u16 {
    client
        .field("laddr")
        .and_then(|addr| addr.rsplit_once(':'))
        .and_then(|(_, port)| port.parse().ok())
        .unwrap_or_else(|| panic!("no laddr in {client:?}"))
}

/// Asserts that every client connection of `server` (the probes' own excepted) came in
/// on its TLS port, and returns them.
fn all_over_tls(server: &RedisServer) -> Vec<ClientInfo> {
    let tls_port = server.tls_port().expect("a TLS server");
    let clients = server.clients();
    for client in &clients {
        assert_eq!(
            local_port(client),
            tls_port,
            "a connection on the plain-text port: {client:?}"
        );
    }
    clients
}

/// Spawns `waiter`'s wait for `name` and returns once it is subscribed to `channel` on
/// `server` (the node that owns the channel's slot); the task yields the outcome and
/// when it came.
async fn subscribed_waiter(
    waiter: &LockClient,
    name: &str,
    server: &RedisServer,
    channel: &str,
) -> tokio::task::JoinHandle<(Result<LockGuard, LockError>, Instant)> {
    let waiting = spawn_timed({
        let (waiter, name) = (waiter.clone(), name.to_owned());
        async move { waiter.try_acquire(&name, LEASE - SERVED).await }
    });
    eventually(
        SETTLE,
        format!("the waiter subscribed to {channel}"),
        // Classic on one server and Sentinel; sharded on a cluster of Redis 7.
        || async { server.subscribers(channel) + server.shard_subscribers(channel) == 1 },
    )
    .await;
    waiting
}

/// Releases `guard` and checks that `waiting` holds within [`SERVED`] of it (so by the
/// notice: the lease is far longer), then releases that hold; `case` names the deployment.
async fn release_wakes(
    guard: LockGuard,
    waiting: tokio::task::JoinHandle<(Result<LockGuard, LockError>, Instant)>,
    case: &str,
) {
    let released = Instant::now();
    guard.release().await.unwrap();
    let (got, at) = finishes(SERVED * 2, "the woken waiter", waiting).await;
    let took = at.duration_since(released);
    got.expect("the waiter gets the lock")
        .release()
        .await
        .unwrap();
    assert!(
        took < SERVED,
        "{case}: served {took:?} after the release: not by the notice (the lease is {LEASE:?})"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_over_tls_excludes_and_every_connection_is_tls() {
    let certs = certs();
    let server = RedisServer::start_tls(&certs, &[]).unwrap();
    assert!(server.url().starts_with("rediss://"), "{}", server.url());
    let a = client(&server, &certs).await;
    let b = client(&server, &certs).await;

    let guard = a.try_acquire("tls:order", Duration::ZERO).await.unwrap();
    let key = guard.key().redis_key().to_owned();
    assert!(server.pttl(&key) > 0, "the lock is on the server");
    match b.try_acquire("tls:order", Duration::ZERO).await {
        Err(LockError::Timeout { .. }) => {}
        other => panic!("expected the lock to be busy, got {other:?}"),
    }
    assert_eq!(
        a.lock("tls:order")
            .hold_count(guard.holder())
            .await
            .unwrap(),
        1
    );
    guard.release().await.unwrap();
    assert!(!server.exists(&key), "released on the server");
    take_and_release(
        "free after the release",
        b.try_acquire("tls:order", Duration::ZERO),
    )
    .await;

    // Two clients: a command and a pub/sub connection each, all on the TLS port.
    eventually(SETTLE, "both clients' connections are up", || async {
        server.clients().len() == 4
    })
    .await;
    let clients = all_over_tls(&server);
    assert_eq!(clients.len(), 4, "{clients:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_is_woken_by_a_release_notice_over_tls() {
    let certs = certs();
    let server = RedisServer::start_tls(&certs, &[]).unwrap();
    let holder = client(&server, &certs).await;
    let waiter = client(&server, &certs).await;
    let guard = holder
        .lock("tls:notice")
        .lease(LEASE)
        .try_acquire(Duration::ZERO)
        .await
        .unwrap();
    let channel = guard.key().channel().to_owned();

    let waiting = subscribed_waiter(&waiter, "tls:notice", &server, &channel).await;
    // The subscription is on a connection that came in over TLS.
    let subscribed: Vec<ClientInfo> = all_over_tls(&server)
        .into_iter()
        .filter(ClientInfo::is_pubsub)
        .filter(|c| c.subscriptions() > 0)
        .collect();
    assert_eq!(subscribed.len(), 1, "{subscribed:?}");

    release_wakes(guard, waiting, "one server").await;
}

/// A semaphore over TLS: a waiter in line is granted its permit by a release, over the
/// TLS pub/sub connection, at once (its own retry would come a lease later).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_semaphore_grants_over_tls() {
    let certs = certs();
    let server = RedisServer::start_tls(&certs, &[]).unwrap();
    let holder = client(&server, &certs).await;
    let waiter = client(&server, &certs).await;
    let sem = holder.semaphore("tls:permits", 1);
    let held = sem.acquire().await.unwrap();
    let waiting = tokio::spawn({
        let sem = waiter.semaphore("tls:permits", 1);
        async move { sem.try_acquire(Duration::from_secs(10)).await }
    });
    eventually(SETTLE, "the waiter in line and subscribed", || async {
        let in_line = sem.state().await.unwrap().map(|s| s.waiting) == Some(1);
        in_line && !server.channels().is_empty()
    })
    .await;
    // The waiter listens on a connection that came in over TLS.
    assert!(all_over_tls(&server).iter().any(ClientInfo::is_pubsub));
    let released_at = Instant::now();
    held.release().await.unwrap();
    let got = tokio::time::timeout(Duration::from_secs(3), waiting)
        .await
        .expect("granted at once, not after a lease")
        .unwrap()
        .expect("the permit");
    assert!(released_at.elapsed() < Duration::from_secs(3));
    got.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rate_limiter_decides_over_tls() {
    let certs = certs();
    let server = RedisServer::start_tls(&certs, &[]).unwrap();
    let a = client(&server, &certs).await;
    let b = client(&server, &certs).await;
    let policy = || lockwarden_core::RatePolicy::new("minute", 2, Duration::from_secs(60));
    let api_a = a.rate_limiter("tls", [policy()]).unwrap();
    let api_b = b.rate_limiter("tls", [policy()]).unwrap();
    assert!(api_a.check("k").await.unwrap().is_allowed());
    assert!(api_b.check("k").await.unwrap().is_allowed());
    let refused = api_a.check("k").await.unwrap();
    assert!(refused.retry_after().unwrap() > Duration::from_secs(25));
    api_b.refund("k", 1).await.unwrap();
    assert!(api_a.check("k").await.unwrap().is_allowed());
    assert!(
        all_over_tls(&server).len() >= 2,
        "both clients' connections"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_watchdog_renews_over_tls_past_three_leases() {
    let certs = certs();
    let server = RedisServer::start_tls(&certs, &[]).unwrap();
    let lease = Duration::from_millis(600);
    let client = trusting(&certs)
        .watchdog_timeout(lease)
        .connect(&server.url())
        .await
        .unwrap();
    let guard = client
        .try_acquire("tls:renewed", Duration::ZERO)
        .await
        .unwrap();
    let key = guard.key().redis_key().to_owned();
    let renewals_before = server.command_calls("evalsha");
    tokio::time::sleep(lease * 4).await;
    assert!(!guard.is_lost(), "lost although renewed");
    let ttl = server.pttl(&key);
    assert!(ttl > 0 && ttl <= 600, "ttl {ttl} after four leases");
    assert!(
        server.command_calls("evalsha") >= renewals_before + 6,
        "the watchdog renewed every third of the lease"
    );
    assert_eq!(
        client
            .lock("tls:renewed")
            .hold_count(guard.holder())
            .await
            .unwrap(),
        1
    );
    guard.release().await.unwrap();
    assert!(!server.exists(&key));
}

/// What a connect whose server certificate is not trusted must give: a
/// `BackendError::Tls` that says TLS / certificate, within the command timeout (no
/// panic, no hang). The callers check that nothing is left on the servers.
async fn refused(
    connect: impl std::future::Future<Output = Result<LockClient, LockError>>,
) -> String {
    let started = Instant::now();
    let outcome = tokio::time::timeout(Duration::from_secs(10), connect)
        .await
        .expect("the connect gave up within its timeout");
    let error = match outcome {
        Err(LockError::Backend(error @ BackendError::Tls { .. })) => error,
        Err(other) => panic!("expected a TLS error, got {other:?}"),
        Ok(_) => panic!("connected to a server whose certificate is not trusted"),
    };
    let text = LockError::Backend(error).to_string();
    let lower = text.to_lowercase();
    assert!(
        lower.contains("tls") && lower.contains("certificate"),
        "the error does not say TLS / certificate: {text}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    text
}

/// Nothing of a refused client on `server`: no key, no connection.
async fn nothing_on(server: &RedisServer) {
    assert!(
        server.keys_matching("*").is_empty(),
        "{:?}",
        server.keys_matching("*")
    );
    eventually(
        SETTLE,
        "no connection of the refused client is left",
        || async {
            server.clients().iter().all(|c| {
                c.field("flags")
                    .is_some_and(|f| f.contains('S') || f.contains('M'))
            })
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_untrusted_server_certificate_is_a_clear_error_and_nothing_is_held() {
    let certs = certs();
    let server = RedisServer::start_tls(&certs, &[]).unwrap();
    // Signed by a CA the client does not trust; the system's roots do not know it either.
    let url = server.url();
    let other = LockClient::builder().tls_root_certificate(certs.other_ca_pem());
    let other = refused(other.command_timeout(Duration::from_secs(2)).connect(&url)).await;
    let system = LockClient::builder().command_timeout(Duration::from_secs(2));
    let system = refused(system.connect(&url)).await;
    println!("trusting another CA: {other}\ntrusting the system's roots: {system}");
    nothing_on(&server).await;

    // The same server is fine for a client that trusts its CA.
    let client = client(&server, &certs).await;
    take_and_release(
        "a trusting client",
        client.try_acquire("tls:trusted", Duration::ZERO),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_tls_needs_the_client_identity() {
    let certs = certs();
    let server = RedisServer::start_tls(&certs, &["--tls-auth-clients", "yes"]).unwrap();
    let without = trusting(&certs)
        .command_timeout(Duration::from_secs(2))
        .connect(&server.url())
        .await;
    let error =
        without.expect_err("a server that requires a client certificate refuses one without");
    assert!(
        matches!(error, LockError::Backend(BackendError::Tls { .. })),
        "{error:?}"
    );
    assert!(error.to_string().contains("tls_client_identity"), "{error}");

    let with = trusting(&certs)
        .tls_client_identity(certs.client_cert_pem(), certs.client_key_pem())
        .connect(&server.url())
        .await
        .unwrap();
    take_and_release(
        "with a client certificate",
        with.try_acquire("tls:mutual", Duration::ZERO),
    )
    .await;
    all_over_tls(&server);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn certificates_with_a_plain_text_url_are_refused() {
    let certs = certs();
    let server = RedisServer::start().unwrap();
    let error = trusting(&certs)
        .connect(&server.url())
        .await
        .expect_err("TLS settings with redis:// must not connect in plain text");
    assert!(error.to_string().contains("rediss://"), "{error}");
    assert!(server.clients().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_for_replicas_over_tls() {
    let certs = certs();
    let primary = RedisServer::start_tls(&certs, &[]).unwrap();
    let port = primary.client_port().to_string();
    let replica = RedisServer::start_tls(&certs, &["--replicaof", "127.0.0.1", &port]).unwrap();
    eventually(
        Duration::from_secs(10),
        "the replica synced over TLS",
        || async {
            let info: String = replica.query(&["INFO", "replication"]).unwrap();
            info.contains("master_link_status:up")
        },
    )
    .await;
    let client = trusting(&certs)
        .wait_for_replicas(1, Duration::from_secs(1))
        .connect(&primary.url())
        .await
        .unwrap();
    let guard = client
        .try_acquire("tls:replicated", Duration::ZERO)
        .await
        .unwrap();
    let key = guard.key().redis_key().to_owned();
    let on_replica: Option<u64> = replica.query(&["HGET", &key, guard.holder().id()]).unwrap();
    assert_eq!(
        on_replica,
        Some(1),
        "acknowledged by the replica before acquire returned"
    );
    // The WAIT went over a connection of its own, which came in over TLS too.
    let clients = all_over_tls(&primary);
    let replica_link = clients
        .iter()
        .filter(|c| c.field("flags").is_some_and(|f| f.contains('S')));
    assert_eq!(replica_link.count(), 1, "the replica's link: {clients:?}");
    assert!(
        clients.iter().any(|c| c.field("cmd") == Some("wait")),
        "no connection sent WAIT: {clients:?}"
    );
    guard.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_over_tls_locks_and_wakes_on_every_master() {
    let certs = certs();
    let cluster = RedisCluster::start_tls(3, &certs).unwrap();
    assert!(cluster.urls().iter().all(|u| u.starts_with("rediss://")));
    let connect = || async {
        trusting(&certs)
            .connect_cluster(cluster.urls())
            .await
            .expect("connect to the TLS cluster")
    };
    let holder = connect().await;
    let waiter = connect().await;
    for node in 0..3 {
        let name = (0..10_000)
            .map(|i| format!("tls:cluster:{node}:{i}"))
            .find(|name| {
                cluster
                    .owner(holder.key(name).unwrap().redis_key())
                    .unwrap()
                    == node
            })
            .expect("a name on every master");
        let guard = holder
            .lock(&name)
            .lease(LEASE)
            .try_acquire(Duration::ZERO)
            .await
            .unwrap();
        let key = guard.key().redis_key().to_owned();
        assert!(cluster.nodes()[node].pttl(&key) > 0);
        match waiter.try_acquire(&name, Duration::ZERO).await {
            Err(LockError::Timeout { .. }) => {}
            other => panic!("expected busy on master {node}, got {other:?}"),
        }
        let channel = guard.key().channel().to_owned();
        let master = &cluster.nodes()[node];
        let waiting = subscribed_waiter(&waiter, &name, master, &channel).await;
        release_wakes(guard, waiting, &format!("master {node}")).await;
    }
    for node in cluster.nodes() {
        all_over_tls(node);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_over_tls_names_the_primary_and_follows_a_failover() {
    let certs = certs();
    let mut sentinel = RedisSentinel::start_tls(&certs).unwrap();
    assert!(sentinel.sentinel_url().starts_with("rediss://"));
    let connect = || async {
        trusting(&certs)
            .watchdog_timeout(Duration::from_secs(6))
            .connect_sentinel([sentinel.sentinel_url()], sentinel.service())
            .await
            .expect("connect through the TLS sentinel")
    };
    let holder = connect().await;
    let waiter = connect().await;

    // Lock and wake on the primary the sentinel named, over TLS.
    let guard = holder
        .lock("tls:sentinel")
        .lease(LEASE)
        .try_acquire(Duration::ZERO)
        .await
        .unwrap();
    let channel = guard.key().channel().to_owned();
    let primary = &sentinel.servers()[0];
    assert!(primary.pttl(guard.key().redis_key()) > 0);
    let waiting = subscribed_waiter(&waiter, "tls:sentinel", primary, &channel).await;
    release_wakes(guard, waiting, "sentinel").await;
    all_over_tls(primary);
    all_over_tls(sentinel.sentinel());

    // The primary dies; the client follows the promoted replica, over TLS.
    let old = sentinel.master_port().unwrap();
    sentinel.servers_mut()[0].kill();
    let new = sentinel
        .wait_for_failover(old, Duration::from_secs(20))
        .unwrap();
    assert_eq!(new, sentinel.servers()[1].client_port());
    let deadline = Instant::now() + Duration::from_secs(20);
    let guard = loop {
        match holder
            .try_acquire("tls:after-failover", Duration::ZERO)
            .await
        {
            Ok(guard) => break guard,
            Err(error) => {
                assert!(
                    Instant::now() < deadline,
                    "no primary after the failover: {error}"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    };
    assert!(
        sentinel.servers()[1].pttl(guard.key().redis_key()) > 0,
        "on the new primary"
    );
    guard.release().await.unwrap();
    all_over_tls(&sentinel.servers()[1]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_over_tls_logs_in_to_the_primary_as_the_given_user() {
    let certs = certs();
    let sentinel = RedisSentinel::start_tls(&certs).unwrap();
    only_the_locks_user_may_lock(sentinel.servers());
    let (certs, sentinel) = (&certs, &sentinel);
    let connect = |login: bool| async move {
        let builder = trusting(certs);
        let builder = match login {
            true => builder.primary_credentials("locks", "s3cret"),
            false => builder,
        };
        builder
            .connect_sentinel([sentinel.sentinel_url()], sentinel.service())
            .await
            .expect("connect through the TLS sentinel")
    };
    let refused = connect(false)
        .await
        .try_acquire("tls:acl", Duration::ZERO)
        .await;
    assert!(
        matches!(
            refused,
            Err(LockError::Backend(BackendError::NotPermitted { .. }))
        ),
        "{refused:?}"
    );
    let holder = connect(true).await;
    let waiter = connect(true).await;
    let guard = holder
        .lock("tls:acl")
        .lease(LEASE)
        .try_acquire(Duration::ZERO)
        .await
        .unwrap();
    let waiting = spawn_timed(async move { waiter.try_acquire("tls:acl", LEASE / 2).await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    release_wakes(guard, waiting, "sentinel, ACL user").await;
    all_over_tls(&sentinel.servers()[0]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_untrusted_cluster_or_sentinel_is_a_clear_error_too() {
    let certs = certs();
    let cluster = RedisCluster::start_tls(1, &certs).unwrap();
    let untrusting = || {
        LockClient::builder()
            .tls_root_certificate(certs.other_ca_pem())
            .command_timeout(Duration::from_secs(2))
    };
    let text = refused(untrusting().connect_cluster(cluster.urls())).await;
    println!("a cluster: {text}");
    nothing_on(&cluster.nodes()[0]).await;

    let sentinel = RedisSentinel::start_tls(&certs).unwrap();
    let text =
        refused(untrusting().connect_sentinel([sentinel.sentinel_url()], sentinel.service())).await;
    println!("a sentinel: {text}");
    assert!(sentinel.servers()[0]
        .keys_matching("lockwarden:*")
        .is_empty());
}
