//! Redis Sentinel: a client connected through a real sentinel follows the primary across
//! a real failover (the primary SIGKILLed, the replica promoted by the sentinel), keeps
//! the locks the new primary received, and reports the ones it did not as lost.

mod common;

use std::time::{Duration, Instant};

use common::{only_the_locks_user_may_lock, take_and_release};
use lockwarden_core::{BackendError, LockClient, LockClientBuilder, LockError, LockGuard};
use lockwarden_testkit::RedisSentinel;
use tokio::task::JoinHandle;

/// The longest a failover may take here: the sentinel notices after 400 ms, then elects
/// itself and promotes the replica; a loaded machine adds its share.
const FAILOVER: Duration = Duration::from_secs(20);

async fn client_with(
    sentinel: &RedisSentinel,
    configure: impl FnOnce(LockClientBuilder) -> LockClientBuilder,
) -> LockClient {
    configure(LockClient::builder())
        .connect_sentinel([sentinel.sentinel_url()], sentinel.service())
        .await
        .expect("connect through the sentinel")
}

/// A lock `holder` holds with a fixed 30 s lease and `waiter`'s acquisition of it, waiting
/// (for 28 s): served soon after the release only if a notice reached the waiter.
struct Noticed {
    held: LockGuard,
    waiting: JoinHandle<Result<LockGuard, LockError>>,
}

impl Noticed {
    async fn wait_on(holder: &LockClient, waiter: &LockClient, name: &str) -> Self {
        let lock = holder.lock(name).lease(Duration::from_secs(30));
        let held = lock.acquire().await.unwrap();
        let (waiter, name) = (waiter.clone(), name.to_owned());
        let waiting =
            tokio::spawn(async move { waiter.try_acquire(name, Duration::from_secs(28)).await });
        tokio::time::sleep(Duration::from_millis(300)).await;
        Self { held, waiting }
    }

    /// Releases, checks that the waiter holds within 3 s (else `no_notice`), and releases
    /// its hold.
    async fn released_serves(self, no_notice: &str) {
        let released = Instant::now();
        self.held.release().await.unwrap();
        let next = self.waiting.await.unwrap().unwrap();
        assert!(
            released.elapsed() < Duration::from_secs(3),
            "waiter served {:?} after the release: {no_notice}",
            released.elapsed()
        );
        next.release().await.unwrap();
    }
}

/// Retries `name` until the client's commands reach a primary again (they fail while
/// the old one is gone and no new one is named).
async fn acquire_after_failover(client: &LockClient, name: &str) -> lockwarden_core::LockGuard {
    let deadline = Instant::now() + FAILOVER;
    loop {
        match client.try_acquire(name, Duration::ZERO).await {
            Ok(guard) => return guard,
            Err(error) => {
                assert!(
                    Instant::now() < deadline,
                    "no primary after the failover: {error}"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replicated_lock_survives_a_failover_and_the_client_follows() {
    let mut sentinel = RedisSentinel::start().unwrap();
    let old = sentinel.master_port().unwrap();
    assert_eq!(old, sentinel.servers()[0].port());
    // Renewed every 2 s: the lease outlives the failover.
    let lease = Duration::from_secs(6);
    let a = client_with(&sentinel, |b| {
        b.watchdog_timeout(lease)
            .wait_for_replicas(1, Duration::from_secs(1))
    })
    .await;
    let b = client_with(&sentinel, |b| b).await;
    let guard = a.acquire("kept").await.unwrap();
    let key = guard.key().redis_key().to_owned();
    // Acknowledged by the replica before acquire returned.
    let on_replica: Option<u64> = sentinel.servers()[1]
        .query(&["HGET", &key, guard.holder().id()])
        .unwrap();
    assert_eq!(on_replica, Some(1));
    // A waiter subscribed on the old primary, to be woken by the new one.
    let noticed = Noticed::wait_on(&a, &b, "noticed").await;

    sentinel.servers_mut()[0].kill();
    let new = sentinel.wait_for_failover(old, FAILOVER).unwrap();
    assert_eq!(new, sentinel.servers()[1].port());

    // Both clients now talk to the new primary, where the lock is.
    let other = acquire_after_failover(&b, "elsewhere").await;
    other.release().await.unwrap();
    assert!(matches!(
        b.try_acquire("kept", Duration::ZERO).await,
        Err(LockError::Timeout { .. })
    ));
    // The watchdog renews it there: past a whole lease after the kill, still held.
    tokio::time::sleep(lease + Duration::from_millis(500)).await;
    assert!(!guard.is_lost(), "a replicated lock was reported lost");
    let ttl: i64 = sentinel.servers()[1].query(&["PTTL", &key]).unwrap();
    assert!(ttl > 0, "lock not renewed on the new primary: PTTL {ttl}");
    assert!(!noticed.waiting.is_finished(), "the waiter got a held lock");
    noticed
        .released_serves("no notice from the new primary")
        .await;

    guard.release().await.unwrap();
    take_and_release("released", b.try_acquire("kept", Duration::ZERO)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_the_new_primary_never_got_is_reported_lost() {
    let mut sentinel = RedisSentinel::start().unwrap();
    let old = sentinel.master_port().unwrap();
    let lease = Duration::from_secs(3);
    let a = client_with(&sentinel, |b| b.watchdog_timeout(lease)).await;
    let waiting = client_with(&sentinel, |b| {
        b.wait_for_replicas(1, Duration::from_millis(300))
    })
    .await;
    let b = client_with(&sentinel, |b| b).await;

    // Cut replication, and keep the replica from coming back (it cannot authenticate),
    // so what the primary takes now never reaches it.
    let replica = &sentinel.servers()[1];
    replica
        .cmd(&["CONFIG", "SET", "masterauth", "not-the-password"])
        .unwrap();
    sentinel.servers()[0]
        .cmd(&["CLIENT", "KILL", "TYPE", "replica"])
        .unwrap();
    let guard = a.acquire("vanishing").await.unwrap();
    let permit = a.semaphore("vanishing-permits", 1).acquire().await.unwrap();
    let key = guard.key().redis_key().to_owned();
    let on_replica: i64 = replica.query(&["EXISTS", &key]).unwrap();
    assert_eq!(on_replica, 0, "the replica got the lock after all");
    // Waiting for a replica would have refused this acquisition rather than grant it.
    assert!(matches!(
        waiting.try_acquire("refused", Duration::ZERO).await,
        Err(LockError::Backend(BackendError::NotReplicated { .. }))
    ));
    assert!(!guard.is_lost());

    sentinel.servers_mut()[0].kill();
    let killed = Instant::now();
    sentinel.wait_for_failover(old, FAILOVER).unwrap();

    // The holder learns that its lock is gone...
    tokio::time::timeout(FAILOVER, guard.lost())
        .await
        .expect("the holder was never told its lock vanished");
    tokio::time::timeout(FAILOVER, permit.lost())
        .await
        .expect("the holder was never told its permit vanished");
    tracing::info!(after = ?killed.elapsed(), "lost reported");
    // ...and it is: another client takes it on the new primary.
    let next = acquire_after_failover(&b, "vanishing").await;
    next.release().await.unwrap();
    let next_permit = b
        .semaphore("vanishing-permits", 1)
        .try_acquire(FAILOVER)
        .await
        .expect("the vanished permit is free on the new primary");
    next_permit.release().await.unwrap();
    assert!(matches!(
        permit.release().await,
        Err(LockError::Lost { .. })
    ));
    // A lost guard's release says so rather than pretending.
    assert!(matches!(guard.release().await, Err(LockError::Lost { .. })));
}

/// How many connections of the current primary are logged in as `user` and subscribed.
fn subscribed_as(sentinel: &RedisSentinel, user: &str) -> usize {
    let port = sentinel.master_port().unwrap();
    let primary = sentinel
        .servers()
        .iter()
        .find(|s| s.port() == port)
        .expect("the primary is one of the pair");
    let clients: String = primary.query(&["CLIENT", "LIST"]).unwrap();
    clients
        .lines()
        .filter(|l| l.contains(&format!(" user={user} ")) && l.contains(" flags=P "))
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_primary_only_an_acl_user_may_use_is_reached_as_that_user_across_a_failover() {
    let mut sentinel = RedisSentinel::start().unwrap();
    only_the_locks_user_may_lock(sentinel.servers());
    let old = sentinel.master_port().unwrap();

    // As the default user (credentials in a sentinel URL are the sentinel's): no lock.
    let as_default = client_with(&sentinel, |b| b).await;
    let refused = as_default.try_acquire("refused", Duration::ZERO).await;
    assert!(
        matches!(
            refused,
            Err(LockError::Backend(BackendError::NotPermitted { .. }))
        ),
        "{refused:?}"
    );
    let wrong = LockClient::builder()
        .primary_credentials("locks", "not-the-password")
        .connect_sentinel([sentinel.sentinel_url()], sentinel.service())
        .await;
    assert!(wrong.is_err(), "a wrong password connected");

    let login = |b: LockClientBuilder| b.primary_credentials("locks", "s3cret");
    let a = client_with(&sentinel, login).await;
    let b = client_with(&sentinel, login).await;
    // Acquisitions that wait for the replica go over a connection of their own: logged
    // in as `locks` too, or the script would be refused.
    let replicated = client_with(&sentinel, |b| {
        login(b).wait_for_replicas(1, Duration::from_secs(1))
    })
    .await;
    let guard = replicated.acquire("replicated").await.unwrap();
    guard.release().await.unwrap();
    // Woken only if its client's pub/sub connection, logged in as `locks`, hears.
    let noticed = Noticed::wait_on(&a, &b, "noticed").await;
    assert!(
        subscribed_as(&sentinel, "locks") >= 1,
        "no pub/sub connection logged in as locks"
    );
    noticed.released_serves("no notice").await;

    // The replica Sentinel promotes is logged in to the same way.
    sentinel.servers_mut()[0].kill();
    sentinel.wait_for_failover(old, FAILOVER).unwrap();
    let after = acquire_after_failover(&a, "after").await;
    // The other client, once it follows too, finds it held there.
    let deadline = Instant::now() + FAILOVER;
    loop {
        match b.try_acquire("after", Duration::ZERO).await {
            Err(LockError::Timeout { .. }) => break,
            Err(LockError::Backend(_)) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            other => panic!("the other client on the new primary: {other:?}"),
        }
    }
    after.release().await.unwrap();
    take_and_release("released", b.try_acquire("after", Duration::ZERO)).await;
}

#[tokio::test]
async fn primary_credentials_are_refused_outside_sentinel_and_never_shown() {
    let builder = LockClient::builder().primary_credentials("locks", "s3cret");
    let shown = format!("{builder:?}");
    assert!(shown.contains("locks"), "{shown}");
    assert!(!shown.contains("s3cret"), "the password shows: {shown}");
    // Refused before any connection is tried (nothing listens on port 1).
    let refused = builder.connect("redis://127.0.0.1:1/").await;
    let message = refused.err().map(|e| e.to_string()).unwrap_or_default();
    assert!(message.contains("connect_sentinel"), "{message}");
}
