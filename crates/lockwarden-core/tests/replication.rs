//! `wait_for_replicas`: an acquisition counts only once a replica has acknowledged it,
//! proved against a real primary and replica, with the replica paused (SIGSTOP) to make
//! acknowledgement impossible.

mod common;

use std::time::{Duration, Instant};

use common::{connect_with, take_and_release};
use lockwarden_core::{BackendError, LockClient, LockError};
use lockwarden_testkit::{eventually, RedisServer};

const WAIT: Duration = Duration::from_millis(300);

/// A primary and one replica in sync with it.
async fn primary_and_replica() -> (RedisServer, RedisServer) {
    let primary = RedisServer::start().unwrap();
    let port = primary.port().to_string();
    let replica = RedisServer::start_with(&["--replicaof", "127.0.0.1", &port]).unwrap();
    eventually(Duration::from_secs(10), "the replica synced", || async {
        let info: String = replica.query(&["INFO", "replication"]).unwrap();
        info.contains("master_link_status:up")
    })
    .await;
    (primary, replica)
}

/// A client whose acquisitions wait (up to [`WAIT`]) for one replica's acknowledgement.
async fn waiting_client(primary: &RedisServer) -> LockClient {
    connect_with(&primary.url(), |b| b.wait_for_replicas(1, WAIT)).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquisition_is_on_the_replica_when_it_returns() {
    let (primary, replica) = primary_and_replica().await;
    let client = waiting_client(&primary).await;
    for i in 0..50 {
        let name = format!("replicated:{i}");
        let guard = client.acquire(&name).await.unwrap();
        // Read from the replica at once: WAIT returned only after it had the write.
        let key = guard.key().redis_key().to_owned();
        let count: Option<u64> = replica.query(&["HGET", &key, guard.holder().id()]).unwrap();
        assert_eq!(count, Some(1), "{key} missing on the replica");
        guard.release().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unacknowledged_acquisition_is_released_and_reported() {
    let (primary, replica) = primary_and_replica().await;
    let waiting = waiting_client(&primary).await;
    let plain = LockClient::connect(&primary.url()).await.unwrap();
    let held = waiting.acquire("held").await.unwrap();

    replica.pause();
    let started = Instant::now();
    let attempt = tokio::spawn({
        let waiting = waiting.clone();
        async move {
            waiting
                .try_acquire("unreplicated", Duration::from_secs(2))
                .await
        }
    });
    // While that WAIT blocks its connection, releases still go through at once.
    tokio::time::sleep(Duration::from_millis(50)).await;
    let release_started = Instant::now();
    held.release().await.unwrap();
    let release_took = release_started.elapsed();

    let outcome = attempt.await.unwrap();
    let took = started.elapsed();
    match outcome {
        Err(LockError::Backend(BackendError::NotReplicated {
            acknowledged: 0,
            wanted: 1,
        })) => {}
        other => panic!("expected NotReplicated, got {other:?}"),
    }
    assert!(took >= WAIT, "answered before the WAIT timeout: {took:?}");
    assert!(took < WAIT + Duration::from_secs(1), "took {took:?}");
    assert!(
        release_took < WAIT / 2,
        "a release queued behind WAIT: {release_took:?}"
    );
    // Nothing left behind on the primary, and a client without the option is not affected.
    assert!(
        !primary.exists("lockwarden:{unreplicated}"),
        "the unacknowledged lock was left on the primary"
    );
    take_and_release(
        "a client without the option",
        plain.try_acquire("unreplicated", Duration::ZERO),
    )
    .await;

    replica.resume();
    take_and_release(
        "acknowledged again",
        waiting.try_acquire("after-resume", Duration::from_secs(2)),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fair_and_read_write_acquisitions_wait_for_the_replica_too() {
    let (primary, replica) = primary_and_replica().await;
    let waiting = waiting_client(&primary).await;
    let plain = LockClient::connect(&primary.url()).await.unwrap();

    // Acknowledged: on the replica when acquire returns.
    let fair = waiting.fair_lock("fair").acquire().await.unwrap();
    let write = waiting.rw_lock("rw").write().acquire().await.unwrap();
    for guard in [&fair, &write] {
        let key = guard.key().redis_key().to_owned();
        assert!(replica.exists(&key), "{key} missing on the replica");
    }
    fair.release().await.unwrap();
    write.release().await.unwrap();

    // Not acknowledged: refused, and nothing left held.
    replica.pause();
    let refused = [
        waiting
            .fair_lock("fair")
            .try_acquire(Duration::ZERO)
            .await
            .map(|_| ()),
        waiting
            .rw_lock("rw")
            .read()
            .try_acquire(Duration::ZERO)
            .await
            .map(|_| ()),
        waiting
            .rw_lock("rw-w")
            .write()
            .try_acquire(Duration::ZERO)
            .await
            .map(|_| ()),
    ];
    replica.resume();
    for outcome in refused {
        assert!(
            matches!(
                outcome,
                Err(LockError::Backend(BackendError::NotReplicated { .. }))
            ),
            "expected NotReplicated, got {outcome:?}"
        );
    }
    assert!(!plain.fair_lock("fair").is_locked().await.unwrap());
    assert_eq!(plain.fair_lock("fair").queued().await.unwrap(), 0);
    let rw = plain.rw_lock("rw");
    take_and_release("nothing left held", rw.write().try_acquire(Duration::ZERO)).await;
    let rw = plain.rw_lock("rw-w");
    take_and_release("nothing left held", rw.read().try_acquire(Duration::ZERO)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_multi_lock_waits_for_the_replica_too() {
    let (primary, replica) = primary_and_replica().await;
    let waiting = waiting_client(&primary).await;
    let plain = LockClient::connect(&primary.url()).await.unwrap();
    let names = ["transfer:from", "transfer:to", "transfer:fee"];

    // Acknowledged: every lock on the replica when acquire returns.
    for _ in 0..20 {
        let guards = waiting
            .multi_lock(names)
            .try_acquire(Duration::ZERO)
            .await
            .unwrap();
        for guard in guards.guards() {
            let key = guard.key().redis_key().to_owned();
            let count: Option<u64> = replica.query(&["HGET", &key, guard.holder().id()]).unwrap();
            assert_eq!(count, Some(1), "{key} missing on the replica");
        }
        guards.release().await.unwrap();
    }

    // Not acknowledged: refused after the WAIT, and none of the locks left held.
    replica.pause();
    let started = Instant::now();
    let refused = waiting
        .multi_lock(names)
        .try_acquire(Duration::ZERO)
        .await
        .map(drop);
    let took = started.elapsed();
    replica.resume();
    match refused {
        Err(LockError::Backend(BackendError::NotReplicated {
            acknowledged: 0,
            wanted: 1,
        })) => {}
        other => panic!("expected NotReplicated, got {other:?}"),
    }
    assert!(took >= WAIT, "answered before the WAIT timeout: {took:?}");
    for name in names {
        take_and_release("nothing left held", plain.try_acquire(name, Duration::ZERO)).await;
    }
}
