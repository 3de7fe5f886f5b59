//! Bringing your own connection: a client built on an existing `redis::Client`, or on a
//! deadpool-redis pool (feature `deadpool`), against a real `redis-server`. Each keeps
//! lockwarden's own pub/sub connection (waiters woken by notices) and watchdog.

mod common;

use std::time::{Duration, Instant};

use lockwarden_core::{LockClient, LockError};
use lockwarden_testkit::{eventually, RedisServer};

/// A waiter on `client` is handed the lock by `other`'s release well within the holder's
/// 30 s watchdog lease: only a release notice can explain that.
async fn hand_over_by_notice(client: &LockClient, other: &LockClient) {
    let held = other.acquire("handover").await.unwrap();
    let waiter = tokio::spawn({
        let client = client.clone();
        async move {
            let guard = client
                .try_acquire("handover", Duration::from_secs(10))
                .await;
            (guard, Instant::now())
        }
    });
    eventually(Duration::from_secs(5), "the waiter subscribes", || async {
        client.stats().waited_channels == 1
    })
    .await;
    let released = Instant::now();
    held.release().await.unwrap();
    let (guard, woken) = waiter.await.unwrap();
    guard.unwrap().release().await.unwrap();
    assert!(
        woken - released < Duration::from_secs(3),
        "handed over after {:?}, not by the notice",
        woken - released
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_made_from_an_existing_redis_client_locks_and_hands_over() {
    let server = RedisServer::start().unwrap();
    let redis = lockwarden_core::redis::Client::open(server.url()).unwrap();
    let client = LockClient::builder().connect_client(redis).await.unwrap();
    let other = LockClient::connect(&server.url()).await.unwrap();

    let guard = client.acquire("mine").await.unwrap();
    assert!(matches!(
        other.try_acquire("mine", Duration::ZERO).await,
        Err(LockError::Timeout { .. })
    ));
    guard.release().await.unwrap();
    hand_over_by_notice(&client, &other).await;
}

#[cfg(feature = "deadpool")]
mod pool {
    use super::*;
    use deadpool_redis::{Config, PoolConfig, Runtime};

    fn pool(url: &str, max_size: usize) -> deadpool_redis::Pool {
        let mut config = Config::from_url(url);
        config.pool = Some(PoolConfig::new(max_size));
        config.create_pool(Some(Runtime::Tokio1)).unwrap()
    }

    /// Commands go through the app's pool, notices through lockwarden's own pub/sub
    /// connection: exclusion, hand-over by notice, and the watchdog keeping a hold past
    /// three leases.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_pooled_client_excludes_hands_over_and_renews() {
        let server = RedisServer::start().unwrap();
        let notices = lockwarden_core::redis::Client::open(server.url()).unwrap();
        let client = LockClient::builder()
            .watchdog_timeout(Duration::from_secs(1))
            .connect_pool(pool(&server.url(), 4), notices)
            .await
            .unwrap();
        let other = LockClient::connect(&server.url()).await.unwrap();

        let guard = client.acquire("renewed").await.unwrap();
        // Past 3 leases of 1 s (renewed every third: stalls of a loaded machine up to
        // ~600 ms pass; a 300 ms lease lost its hold to one).
        tokio::time::sleep(Duration::from_millis(3_500)).await;
        assert!(!guard.is_lost(), "the watchdog renewed it through the pool");
        assert!(matches!(
            other.try_acquire("renewed", Duration::ZERO).await,
            Err(LockError::Timeout { .. })
        ));
        guard.release().await.unwrap();
        assert!(!server.exists("lockwarden:{renewed}"));
        hand_over_by_notice(&client, &other).await;
    }

    /// A pool of 2 connections serves 32 concurrent holders of distinct locks, and the
    /// commands really go through it: the server sees the pool's `PING`s.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_small_pool_serves_many_holders_and_is_really_used() {
        let server = RedisServer::start().unwrap();
        let config = Config::from_url(server.url());
        let client = LockClient::builder()
            .connect_deadpool(&config)
            .await
            .unwrap();
        let pings_before = server.command_calls("ping");
        let small = LockClient::builder()
            .connect_pool(
                pool(&server.url(), 2),
                lockwarden_core::redis::Client::open(server.url()).unwrap(),
            )
            .await
            .unwrap();
        let tasks: Vec<_> = (0..32)
            .map(|i| {
                let small = small.clone();
                tokio::spawn(async move {
                    let guard = small.acquire(format!("many:{i}")).await.unwrap();
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    guard.release().await.unwrap();
                })
            })
            .collect();
        for task in tasks {
            tokio::time::timeout(Duration::from_secs(10), task)
                .await
                .expect("every holder is served")
                .unwrap();
        }
        assert!(
            server.command_calls("ping") > pings_before,
            "deadpool checks connections back in with a PING"
        );
        // Every lock hash is gone (fencing keys outlive a release until their lease ends).
        assert_eq!(
            server.keys_matching("lockwarden:{many:*}"),
            Vec::<String>::new()
        );
        drop(client);
    }

    /// A deadpool config that names both a URL and connection fields is refused with a
    /// clear error, before anything is connected.
    #[tokio::test]
    async fn a_contradictory_deadpool_config_is_a_clear_error() {
        let mut config = Config::from_url("redis://127.0.0.1:1/");
        config.connection = Some(deadpool_redis::ConnectionInfo::default());
        let error = LockClient::builder()
            .connect_deadpool(&config)
            .await
            .unwrap_err();
        assert!(matches!(error, LockError::Backend(_)), "{error:?}");
        assert!(
            error.to_string().contains("deadpool-redis config"),
            "{error}"
        );
    }

    /// A pool whose server is gone: connecting fails with a backend error within the
    /// command timeout; a client whose server goes away later reports it (no panic) and
    /// holds nothing when the server is back.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_pool_without_a_server_fails_clearly() {
        let mut server = RedisServer::start().unwrap();
        let url = server.url();
        let client = LockClient::builder()
            .command_timeout(Duration::from_millis(500))
            .connect_deadpool(&Config::from_url(url.clone()))
            .await
            .unwrap();
        server.kill();
        let started = Instant::now();
        match client.try_acquire("gone", Duration::from_millis(300)).await {
            Err(LockError::Backend(error)) => assert!(error.is_transient(), "{error}"),
            other => panic!("expected a backend error, got {other:?}"),
        }
        assert!(started.elapsed() < Duration::from_secs(5));
        let refused = LockClient::builder()
            .command_timeout(Duration::from_millis(500))
            .connect_deadpool(&Config::from_url(url))
            .await;
        assert!(matches!(refused, Err(LockError::Backend(_))), "{refused:?}");
    }
}
