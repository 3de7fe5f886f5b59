//! Claims across a Redis restart (SIGKILL, then a new process on the same port and data
//! directory): a completed claim's outcome, and so the replay of its retries, survives
//! only what Redis persists.
//!
//! With `appendonly yes` and `appendfsync always` every write Redis answered is on disk
//! before the answer: the outcome survives, and a retry after the restart gets it instead
//! of doing the work again. Without persistence the outcome is gone with the restart, and
//! the retry does the work again.

mod common;

use std::time::Duration;

use common::connect_with;
use lockwarden_core::{Claim, LockClient};
use lockwarden_testkit::RedisServer;

const OUTCOME: &[u8] = b"charged 12.00";
const KEEP: Duration = Duration::from_secs(3600);

/// Claims `name` once, does "the work" and completes the claim.
async fn claim_and_complete(client: &LockClient, name: &str) {
    match client.lock(name).try_claim(Duration::ZERO).await {
        Ok(Claim::Acquired(guard)) => guard.complete(OUTCOME, KEEP).await.expect("complete"),
        other => panic!("a first claim: {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_aof_always_a_completed_claim_is_replayed_after_a_restart() {
    let mut server = RedisServer::start_with(&["--appendonly", "yes", "--appendfsync", "always"])
        .expect("start redis-server");
    let client = connect_with(&server.url(), |b| b).await;
    claim_and_complete(&client, "charge:evt_1").await;
    server.restart().expect("restart");
    let retry = client.lock("charge:evt_1").try_claim(Duration::ZERO).await;
    match retry.expect("the retry's claim") {
        Claim::Completed(outcome) => assert_eq!(outcome, OUTCOME),
        Claim::Acquired(_) => panic!("the work would run again after the restart"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_persistence_a_restart_forgets_the_claim_and_the_work_runs_again() {
    let mut server = RedisServer::start().expect("start redis-server");
    let client = connect_with(&server.url(), |b| b).await;
    claim_and_complete(&client, "charge:evt_2").await;
    server.restart().expect("restart");
    let retry = client.lock("charge:evt_2").try_claim(Duration::ZERO).await;
    match retry.expect("the retry's claim") {
        Claim::Acquired(guard) => guard.release().await.expect("release"),
        Claim::Completed(_) => panic!("an outcome survived a restart without persistence"),
    }
}
