//! What an operator reads about locks in use, on both stores: how many writers wait for
//! a read-write lock (as the fair lock's `queued` and the semaphore's `state` say for
//! theirs), and which client holds a lock (`LockClient::id`, the first part of every
//! holder id the store keeps).

mod common;

use std::time::Duration;

use common::Env;
use lockwarden_testkit::eventually;

conformance!(
    waiting_writers_are_counted_until_they_get_the_lock_or_give_up,
    a_holders_id_starts_with_its_clients_id,
);

async fn waiting_writers_are_counted_until_they_get_the_lock_or_give_up(env: Env) {
    let client = env.client().await;
    let prices = client.rw_lock("prices");
    assert_eq!(prices.waiting_writers().await.expect("count"), 0);
    let reader = prices.read().acquire().await.expect("read");
    let writer = |wait| {
        let prices = prices.clone();
        tokio::spawn(async move { prices.write().try_acquire(wait).await })
    };
    let patient = writer(Duration::from_secs(10));
    let hasty = writer(Duration::from_millis(600));
    eventually(Duration::from_secs(5), "two writers wait", || async {
        prices.waiting_writers().await.expect("count") == 2
    })
    .await;
    // The hasty one gives up and withdraws its registration.
    let gave_up = hasty.await.expect("task");
    assert!(gave_up.is_err(), "{gave_up:?}");
    assert_eq!(prices.waiting_writers().await.expect("count"), 1);
    // The patient one gets the lock once the reader is gone, and waits no more.
    reader.release().await.expect("release");
    let write = patient.await.expect("task").expect("the writer's turn");
    assert_eq!(prices.waiting_writers().await.expect("count"), 0);
    write.release().await.expect("release");
}

async fn a_holders_id_starts_with_its_clients_id(env: Env) {
    let client = env.client().await;
    let other = env.client().await;
    let guard = client.acquire("invoice:7").await.expect("acquire");
    let holder = guard.holder().clone();
    assert!(
        holder.id().starts_with(&format!("{}:", client.id())),
        "{} is not {}'s",
        holder.id(),
        client.id()
    );
    if env.is_redis() {
        // What the store keeps, and the inspector lists: the holder id as a field.
        let fields: Vec<String> = env
            .server()
            .query(&["HKEYS", "lockwarden:{invoice:7}"])
            .expect("HKEYS");
        assert!(
            fields.iter().any(|f| f.starts_with(client.id())),
            "{fields:?}"
        );
        assert_ne!(client.id(), other.id(), "each client its own id");
    }
    guard.release().await.expect("release");
}
