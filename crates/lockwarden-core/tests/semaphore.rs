//! Semaphores (`LockClient::semaphore`) on both stores: never more than the capacity,
//! grants in arrival order to as many waiters as a release lets in, leases per permit,
//! the stored capacity, bad numbers refused with nothing held.

mod common;

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::{finishes, Env};
use lockwarden_core::{LockError, SemaphoreState};

conformance!(
    never_more_than_the_capacity,
    a_release_grants_in_arrival_order,
);

async fn never_more_than_the_capacity(env: Env) {
    let client = env.client().await;
    let sem = client.semaphore("never-more", 3);
    let inside = Arc::new(AtomicU32::new(0));
    let most = Arc::new(AtomicU32::new(0));
    let mut tasks = Vec::new();
    for _ in 0..12 {
        let (sem, inside, most) = (sem.clone(), inside.clone(), most.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..10 {
                let permit = sem
                    .try_acquire(Duration::from_secs(10))
                    .await
                    .expect("permit");
                let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(now, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(2)).await;
                inside.fetch_sub(1, Ordering::SeqCst);
                permit.release().await.expect("release");
            }
        }));
    }
    for task in tasks {
        finishes(Duration::from_secs(60), "a task's cycles", task).await;
    }
    assert_eq!(most.load(Ordering::SeqCst), 3);
    assert_eq!(sem.state().await.unwrap(), None, "nothing left");
}

async fn a_release_grants_in_arrival_order(env: Env) {
    let client = env.client().await;
    let sem = client.semaphore("order", 2);
    let a = sem.acquire().await.unwrap();
    let b = sem.acquire().await.unwrap();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let mut waiters = Vec::new();
    for i in 0..4 {
        let (waiter, tx) = (sem.clone(), tx.clone());
        waiters.push(tokio::spawn(async move {
            let permit = waiter
                .try_acquire(Duration::from_secs(10))
                .await
                .expect("permit");
            tx.send(i).unwrap();
            permit
        }));
        // Each in line before the next.
        loop {
            let state = sem.state().await.unwrap().unwrap();
            if state.waiting == i + 1 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }
    let state: SemaphoreState = sem.state().await.unwrap().unwrap();
    assert_eq!((state.capacity, state.in_use, state.waiting), (2, 2, 4));
    a.release().await.unwrap();
    assert_eq!(
        tokio::time::timeout(Duration::from_secs(5), rx.recv())
            .await
            .unwrap(),
        Some(0)
    );
    b.release().await.unwrap();
    assert_eq!(
        tokio::time::timeout(Duration::from_secs(5), rx.recv())
            .await
            .unwrap(),
        Some(1)
    );
    let _ = LockError::NotHeld { key: String::new() };
    for w in waiters.drain(..2) {
        finishes(Duration::from_secs(5), "first two", w)
            .await
            .release()
            .await
            .unwrap();
    }
    for w in waiters {
        finishes(Duration::from_secs(5), "last two", w)
            .await
            .release()
            .await
            .unwrap();
    }
}
