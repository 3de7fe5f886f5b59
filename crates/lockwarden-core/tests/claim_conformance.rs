//! Claims (work done once, its outcome kept): the promises of `Lock::try_claim` and
//! `LockGuard::complete`, against the in-process store and a real `redis-server`.

mod common;

use std::time::{Duration, Instant};

use common::{finishes, Env};
use lockwarden_core::{Claim, LockError};

conformance!(
    a_completed_claim_answers_later_claims_with_its_outcome,
    completion_wakes_every_waiting_claim_at_once,
    an_outcome_is_forgotten_after_its_keep_time,
    a_holder_that_lost_the_lock_stores_no_outcome,
    a_plain_release_stores_nothing,
    completing_a_read_write_guard_is_refused_and_releases_it,
);

fn acquired(claim: Claim) -> lockwarden_core::LockGuard {
    match claim {
        Claim::Acquired(guard) => guard,
        Claim::Completed(outcome) => panic!("expected the lock, got outcome {outcome:?}"),
    }
}

fn completed(claim: Claim) -> Vec<u8> {
    match claim {
        Claim::Completed(outcome) => outcome,
        Claim::Acquired(guard) => panic!("expected an outcome, got the lock {guard:?}"),
    }
}

/// Promise: after `complete`, every claim of the key (from any client) gets the stored
/// bytes without taking the lock, and the lock itself is free.
async fn a_completed_claim_answers_later_claims_with_its_outcome(env: Env) {
    let a = env.client().await;
    let b = env.client().await;
    let outcome: Vec<u8> = (0..=255).collect(); // not UTF-8: stored byte for byte
    let guard = acquired(a.lock("once").try_claim(Duration::ZERO).await.unwrap());
    // While in flight, another claim is refused like a busy lock.
    assert!(matches!(
        b.lock("once").try_claim(Duration::ZERO).await,
        Err(LockError::Timeout { .. })
    ));
    guard
        .complete(outcome.clone(), Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!(
        completed(b.lock("once").try_claim(Duration::ZERO).await.unwrap()),
        outcome
    );
    assert!(!b.lock("once").is_locked().await.unwrap());
    // Plain locking of the key is unaffected by the outcome.
    b.acquire("once").await.unwrap().release().await.unwrap();
}

/// Promise: a completion wakes every claim waiting on the key (not one per release), and
/// they get the outcome long before the holder's lease or their budget would end.
async fn completion_wakes_every_waiting_claim_at_once(env: Env) {
    let holder = env.client().await;
    let guard = acquired(holder.lock("fan").try_claim(Duration::ZERO).await.unwrap());
    let mut waiters = Vec::new();
    for _ in 0..8 {
        let client = env.client().await;
        waiters.push(tokio::spawn(async move {
            let claim = client
                .lock("fan")
                .try_claim(Duration::from_secs(20))
                .await
                .unwrap();
            (completed(claim), Instant::now())
        }));
    }
    // Let every waiter send its first attempt and subscribe.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let done = Instant::now();
    guard
        .complete(b"receipt-7", Duration::from_secs(60))
        .await
        .unwrap();
    for waiter in waiters {
        let (outcome, at) = finishes(Duration::from_secs(10), "waiter finished", waiter).await;
        assert_eq!(outcome, b"receipt-7");
        // The watchdog lease is 30 s and the budget 20 s: only the notice explains this.
        assert!(
            at.duration_since(done) < Duration::from_secs(3),
            "served {:?} after completion",
            at.duration_since(done)
        );
    }
}

/// Promise: an outcome lives for its keep time only; afterwards the key can be claimed
/// (and the work done) again.
async fn an_outcome_is_forgotten_after_its_keep_time(env: Env) {
    let client = env.client().await;
    let lock = client.lock("short");
    let guard = acquired(lock.try_claim(Duration::ZERO).await.unwrap());
    guard
        .complete(b"v1", Duration::from_millis(300))
        .await
        .unwrap();
    assert_eq!(
        completed(lock.try_claim(Duration::ZERO).await.unwrap()),
        b"v1"
    );
    tokio::time::sleep(Duration::from_millis(600)).await;
    let again = acquired(lock.try_claim(Duration::ZERO).await.unwrap());
    again.release().await.unwrap();
}

/// Promise: a holder whose lease ran out cannot store an outcome over the holder that
/// took over (it gets a typed error and nothing is stored).
async fn a_holder_that_lost_the_lock_stores_no_outcome(env: Env) {
    let a = env.client().await;
    let b = env.client().await;
    let stale = acquired(
        a.lock("stale")
            .lease(Duration::from_millis(150))
            .try_claim(Duration::ZERO)
            .await
            .unwrap(),
    );
    tokio::time::sleep(Duration::from_millis(400)).await;
    let current = acquired(b.lock("stale").try_claim(Duration::ZERO).await.unwrap());
    let err = stale
        .complete(b"stale outcome", Duration::from_secs(60))
        .await
        .unwrap_err();
    assert!(
        matches!(err, LockError::Lost { .. } | LockError::NotHeld { .. }),
        "{err:?}"
    );
    // Still in flight under the new holder, with no outcome.
    assert!(matches!(
        a.lock("stale").try_claim(Duration::ZERO).await,
        Err(LockError::Timeout { .. })
    ));
    current
        .complete(b"fresh outcome", Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!(
        completed(a.lock("stale").try_claim(Duration::ZERO).await.unwrap()),
        b"fresh outcome"
    );
}

/// Promise: releasing a claimed lock without completing it (e.g. the work failed) leaves
/// no outcome: the next claim gets the lock and can try again.
async fn a_plain_release_stores_nothing(env: Env) {
    let client = env.client().await;
    let lock = client.lock("retry");
    acquired(lock.try_claim(Duration::ZERO).await.unwrap())
        .release()
        .await
        .unwrap();
    let again = acquired(lock.try_claim(Duration::ZERO).await.unwrap());
    drop(again); // a dropped guard also stores nothing
    tokio::time::sleep(Duration::from_millis(100)).await;
    let third = acquired(lock.try_claim(Duration::from_secs(2)).await.unwrap());
    third.release().await.unwrap();
}

/// Promise: a read-write lock keeps no claim outcome, so completing one of its guards is a
/// typed error naming the lock; the hold is released all the same, and nothing is stored
/// that a claim of the name could find.
async fn completing_a_read_write_guard_is_refused_and_releases_it(env: Env) {
    let client = env.client().await;
    let write = client.rw_lock("report").write().acquire().await.unwrap();
    match write
        .complete(b"rows".to_vec(), Duration::from_secs(60))
        .await
    {
        Err(LockError::NotClaimable { key }) => assert_eq!(key, "report"),
        other => panic!("expected NotClaimable, got {other:?}"),
    }
    assert!(!client.rw_lock("report").is_locked().await.unwrap());
    let claim = client
        .lock("report")
        .try_claim(Duration::ZERO)
        .await
        .unwrap();
    acquired(claim).release().await.unwrap();
}
