//! Redisson interop (`KeyLayout::Redisson`) against a real redis-server: lockwarden and a
//! Redisson `RLock` on the same name exclude each other and wake each other's waiters.
//!
//! No JVM here: "Redisson" is played by the commands its RLock sends, as the seeds
//! describe them (a hash named by the lock, field `<uuid>:<thread id>` = re-entry count,
//! `PEXPIRE` lease; unlock deletes at zero and publishes `0` on
//! `redisson_lock__channel:{<name>}`), restated here as small scripts.

mod common;

use std::time::{Duration, Instant};

use common::{connect_with, finishes, spawn_timed};
use futures_util::StreamExt;
use lockwarden_core::{KeyLayout, LockClient, LockError};
use lockwarden_testkit::{eventually, RedisServer};

/// RLock.tryLockInnerAsync, restated: nil when taken or re-entered, else the PTTL.
const RLOCK_LOCK: &str = "\
if redis.call('exists', KEYS[1]) == 0 or redis.call('hexists', KEYS[1], ARGV[2]) == 1 then \
  redis.call('hincrby', KEYS[1], ARGV[2], 1) \
  redis.call('pexpire', KEYS[1], ARGV[1]) \
  return nil \
end \
return redis.call('pttl', KEYS[1])";

/// RLock.unlockInnerAsync, restated: nil if not held by the field, 0 if re-entries
/// remain, 1 when deleted (and `0` published on the channel).
const RLOCK_UNLOCK: &str = "\
if redis.call('hexists', KEYS[1], ARGV[3]) == 0 then return nil end \
local counter = redis.call('hincrby', KEYS[1], ARGV[3], -1) \
if counter > 0 then redis.call('pexpire', KEYS[1], ARGV[2]) return 0 end \
redis.call('del', KEYS[1]) \
redis.call('publish', KEYS[2], ARGV[1]) \
return 1";

const JVM_THREAD: &str = "5b1f2a0e-3c4d-4e5f-8a9b-0c1d2e3f4a5b:1";

fn channel(name: &str) -> String {
    format!("redisson_lock__channel:{{{name}}}")
}

fn jvm_lock(server: &RedisServer, name: &str) -> Option<i64> {
    ::redis::cmd("EVAL")
        .arg(RLOCK_LOCK)
        .arg(1)
        .arg(name)
        .arg(30_000)
        .arg(JVM_THREAD)
        .query(&mut server.connection().unwrap())
        .unwrap()
}

fn jvm_unlock(server: &RedisServer, name: &str) -> Option<i64> {
    ::redis::cmd("EVAL")
        .arg(RLOCK_UNLOCK)
        .arg(2)
        .arg(name)
        .arg(channel(name))
        .arg(0)
        .arg(30_000)
        .arg(JVM_THREAD)
        .query(&mut server.connection().unwrap())
        .unwrap()
}

async fn interop_client(server: &RedisServer) -> LockClient {
    connect_with(&server.url(), |b| b.layout(KeyLayout::Redisson)).await
}

/// Promise: a lockwarden lock in the Redisson layout is what RLock writes: a hash named
/// exactly by the lock name, field `<uuid>:<n>` holding the re-entry count, the watchdog
/// lease as its expiry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn layout_is_the_rlock_layout() {
    let server = RedisServer::start().unwrap();
    let client = interop_client(&server).await;
    let holder = client.holder();
    let lock = client.lock("resource:x").holder(&holder);
    let outer = lock.acquire().await.unwrap();
    let inner = lock.acquire().await.unwrap();
    let fields: Vec<(String, String)> = server.query(&["HGETALL", "resource:x"]).unwrap();
    assert_eq!(fields, vec![(holder.id().to_owned(), "2".to_owned())]);
    let (uuid, n) = holder.id().split_once(':').unwrap();
    assert!(uuid::Uuid::parse_str(uuid).is_ok(), "{uuid}");
    assert!(n.parse::<u64>().is_ok(), "{n}");
    let ttl: i64 = server.query(&["PTTL", "resource:x"]).unwrap();
    assert!((25_000..=30_000).contains(&ttl), "{ttl}");
    inner.release().await.unwrap();
    outer.release().await.unwrap();
    let exists: i64 = server.query(&["EXISTS", "resource:x"]).unwrap();
    assert_eq!(exists, 0);
}

/// Promise: in Redisson's layout, whose waiters leave no mark, every release sends the
/// notice, as Redisson's own do, and no waiter of ours marks the hash.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_release_sends_the_notice_and_no_waiter_marks_the_hash() {
    let server = RedisServer::start().unwrap();
    let (client, other) = (interop_client(&server).await, interop_client(&server).await);
    let before = server.command_calls("publish");
    client
        .acquire("resource:y")
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    assert_eq!(server.command_calls("publish") - before, 1);

    let guard = client.acquire("resource:y").await.unwrap();
    let waiter = tokio::spawn(async move {
        other
            .try_acquire("resource:y", Duration::from_secs(10))
            .await
            .map(drop)
    });
    eventually(Duration::from_secs(5), "the waiter subscribed", || async {
        server.subscribers("redisson_lock__channel:{resource:y}") == 1
    })
    .await;
    // Its retry after subscribing is refused too: still only the holder's field.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let fields: Vec<String> = server.query(&["HKEYS", "resource:y"]).unwrap();
    assert_eq!(fields, [guard.holder().id()]);
    guard.release().await.unwrap();
    tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .expect("the waiter was served by the notice")
        .unwrap()
        .unwrap();
}

/// Promise: while a Redisson client holds the lock, lockwarden cannot take it; when
/// Redisson unlocks (publishing `0`), a waiting lockwarden task gets it at once, not when
/// the 30 s lease runs out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redisson_unlock_wakes_a_lockwarden_waiter() {
    let server = RedisServer::start().unwrap();
    let client = interop_client(&server).await;
    assert_eq!(jvm_lock(&server, "invoice:7"), None);
    assert!(matches!(
        client.try_acquire("invoice:7", Duration::ZERO).await,
        Err(LockError::Timeout { .. })
    ));
    let waiter = spawn_timed({
        let client = client.clone();
        async move {
            client
                .try_acquire("invoice:7", Duration::from_secs(20))
                .await
        }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let unlocked = Instant::now();
    assert_eq!(jvm_unlock(&server, "invoice:7"), Some(1));
    let (guard, acquired) = finishes(Duration::from_secs(10), "the waiter finishes", waiter).await;
    let guard = guard.unwrap();
    assert!(
        acquired.duration_since(unlocked) < Duration::from_secs(2),
        "woken {:?} after the unlock",
        acquired.duration_since(unlocked)
    );
    // And Redisson now sees it busy.
    assert!(jvm_lock(&server, "invoice:7").is_some_and(|ttl| ttl > 0));
    guard.release().await.unwrap();
}

/// Promise: while lockwarden holds the lock, Redisson's lock script reports it busy (its
/// PTTL), and lockwarden's release publishes Redisson's unlock message `0` on Redisson's
/// channel, after which Redisson takes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lockwarden_release_tells_redisson_waiters() {
    let server = RedisServer::start().unwrap();
    let client = interop_client(&server).await;
    let guard = client.acquire("shipment:3").await.unwrap();
    let busy = jvm_lock(&server, "shipment:3");
    assert!(busy.is_some_and(|ttl| ttl > 20_000), "{busy:?}");
    // Redisson's waiter: a subscription to the lock's channel.
    let mut pubsub = ::redis::Client::open(server.url())
        .unwrap()
        .get_async_pubsub()
        .await
        .unwrap();
    pubsub.subscribe(channel("shipment:3")).await.unwrap();
    guard.release().await.unwrap();
    let message = tokio::time::timeout(Duration::from_secs(5), pubsub.on_message().next())
        .await
        .expect("an unlock message")
        .unwrap();
    assert_eq!(message.get_channel_name(), channel("shipment:3"));
    assert_eq!(message.get_payload::<String>().unwrap(), "0");
    assert_eq!(jvm_lock(&server, "shipment:3"), None);
    // Held by Redisson now: lockwarden is refused until Redisson unlocks.
    assert!(matches!(
        client.try_acquire("shipment:3", Duration::ZERO).await,
        Err(LockError::Timeout { .. })
    ));
    assert_eq!(jvm_unlock(&server, "shipment:3"), Some(1));
}

/// Promise: names with braces are refused in the Redisson layout (a typed error), since
/// they would split a lock's keys over cluster slots.
#[tokio::test(flavor = "current_thread")]
async fn braces_are_refused_in_the_redisson_layout() {
    let client = LockClient::builder()
        .layout(KeyLayout::Redisson)
        .in_memory();
    assert!(matches!(
        client.acquire("a{b}").await,
        Err(LockError::InvalidKey(lockwarden_core::KeyError::Brace {
            at: 1
        }))
    ));
}
