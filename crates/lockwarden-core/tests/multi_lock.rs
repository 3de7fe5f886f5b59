//! Multi-locks (several keys as one): the promises of `LockClient::multi_lock`, against
//! the in-process store and a real `redis-server`.

mod common;

use std::time::Duration;

use common::{finishes, Env};
use lockwarden_core::LockError;

conformance!(
    all_or_nothing,
    opposite_orders_do_not_deadlock,
    one_release_frees_every_key,
    nothing_is_held_while_waiting_and_the_set_follows_the_release,
    reenters_locks_the_holder_already_has,
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
        finishes(Duration::from_secs(60), "no deadlock", task).await;
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

/// Promise: a caller waiting for a busy lock of its set holds none of the others
/// meanwhile (so it blocks nobody), and gets the whole set right after the release.
async fn nothing_is_held_while_waiting_and_the_set_follows_the_release(env: Env) {
    let client = env.client().await;
    let other = env.client().await;
    let busy = other.acquire("w:b").await.unwrap();
    let waiter = tokio::spawn({
        let client = client.clone();
        async move {
            let set = client
                .multi_lock(["w:a", "w:b", "w:c"])
                .try_acquire(Duration::from_secs(10))
                .await
                .unwrap();
            (std::time::Instant::now(), set)
        }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    for name in ["w:a", "w:c"] {
        // Anyone else can take and give back the free ones while the set waits.
        let g = other.try_acquire(name, Duration::ZERO).await.unwrap();
        g.release().await.unwrap();
    }
    let released = std::time::Instant::now();
    busy.release().await.unwrap();
    let (got, set) = finishes(
        Duration::from_secs(5),
        "the set follows the release",
        waiter,
    )
    .await;
    assert!(
        got.duration_since(released) < Duration::from_millis(500),
        "took {:?} after the release: the waiter was not notified",
        got.duration_since(released)
    );
    for name in ["w:a", "w:b", "w:c"] {
        assert!(client.lock(name).is_locked().await.unwrap());
    }
    set.release().await.unwrap();
}

/// Promise: keys the holder already holds are re-entered, and releasing the set leaves
/// the outer hold in place.
async fn reenters_locks_the_holder_already_has(env: Env) {
    let client = env.client().await;
    let me = client.holder();
    let outer = client.lock("e:1").holder(&me).acquire().await.unwrap();
    let set = client
        .multi_lock(["e:1", "e:2"])
        .holder(&me)
        .try_acquire(Duration::ZERO)
        .await
        .unwrap();
    assert_eq!(client.lock("e:1").hold_count(&me).await.unwrap(), 2);
    assert_eq!(set.guards()[0].fencing_token(), outer.fencing_token());
    set.release().await.unwrap();
    assert_eq!(client.lock("e:1").hold_count(&me).await.unwrap(), 1);
    assert!(!client.lock("e:2").is_locked().await.unwrap());
    outer.release().await.unwrap();
}

/// Promise (Redis): the whole set is taken in one script call, one round trip.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_set_is_taken_in_one_script_call() {
    let env = Env::redis();
    let client = env.client().await;
    let names: Vec<String> = (0..8).map(|i| format!("one:{i}")).collect();
    // Once first, so the script is loaded (a first EVALSHA is answered NOSCRIPT).
    let warm = client
        .multi_lock(["warm"])
        .try_acquire(Duration::ZERO)
        .await
        .unwrap();
    warm.release().await.unwrap();
    let before = env.server().command_calls("evalsha");
    let set = client
        .multi_lock(names.clone())
        .try_acquire(Duration::ZERO)
        .await
        .unwrap();
    assert_eq!(
        env.server().command_calls("evalsha") - before,
        1,
        "one EVALSHA for 8 locks"
    );
    for name in &names {
        assert!(client.lock(name).is_locked().await.unwrap());
    }
    set.release().await.unwrap();
}
