//! Multi-locks (several keys as one): the promises of `LockClient::multi_lock`, against
//! the in-process store and a real `redis-server`.

mod common;

use std::time::Duration;

use common::Env;
use lockwarden::LockError;

conformance!(
    all_or_nothing,
    opposite_orders_do_not_deadlock,
    one_release_frees_every_key,
);

/// Promise: if one key cannot be had within the budget, none stays held, and the error
/// names the busy key.
async fn all_or_nothing(env: Env) {
    let client = env.client().await;
    let other = env.client().await;
    let busy = other.acquire("m:b").await.unwrap();
    match client
        .multi_lock(["m:c", "m:a", "m:b"])
        .try_acquire(Duration::from_millis(200))
        .await
    {
        Err(LockError::Timeout { key, .. }) => assert_eq!(key, "m:b"),
        other => panic!("expected a timeout, got {other:?}"),
    }
    for name in ["m:a", "m:c"] {
        assert!(
            !client.lock(name).is_locked().await.unwrap(),
            "{name} left held"
        );
    }
    busy.release().await.unwrap();
    let all = client
        .multi_lock(["m:c", "m:a", "m:b"])
        .try_acquire(Duration::ZERO)
        .await
        .unwrap();
    let names: Vec<&str> = all.guards().iter().map(|g| g.key().name()).collect();
    assert_eq!(names, ["m:a", "m:b", "m:c"]);
    all.release().await.unwrap();
}

/// Promise: callers asking for the same keys in opposite orders never deadlock (keys are
/// taken in one global order), and never hold them at the same time.
async fn opposite_orders_do_not_deadlock(env: Env) {
    let inside = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for order in [["d:x", "d:y"], ["d:y", "d:x"]] {
        let client = env.client().await;
        let inside = inside.clone();
        tasks.push(tokio::spawn(async move {
            for _ in 0..40 {
                let both = client
                    .multi_lock(order)
                    .try_acquire(Duration::from_secs(10))
                    .await
                    .unwrap();
                assert_eq!(inside.fetch_add(1, std::sync::atomic::Ordering::SeqCst), 0);
                tokio::task::yield_now().await;
                inside.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
                both.release().await.unwrap();
            }
        }));
    }
    for task in tasks {
        tokio::time::timeout(Duration::from_secs(60), task)
            .await
            .expect("no deadlock")
            .unwrap();
    }
}

/// Promise: one guard, one release; duplicates in the list are one lock.
async fn one_release_frees_every_key(env: Env) {
    let client = env.client().await;
    let all = client
        .multi_lock(["r:1", "r:2", "r:1"])
        .try_acquire(Duration::ZERO)
        .await
        .unwrap();
    assert_eq!(all.guards().len(), 2);
    assert!(!all.is_lost());
    all.release().await.unwrap();
    for name in ["r:1", "r:2"] {
        assert!(!client.lock(name).is_locked().await.unwrap());
    }
}
