//! A deploy leaves no lock behind: `LockClient::shutdown` before a process exits sends
//! the releases of dropped guards still queued (which a runtime that stops never sends),
//! releases what live guards still hold, stops the watchdog, and says what it could not
//! release. After it the client takes no lock.
//!
//! The process test runs a real second process (this test binary, re-executed) that
//! drops guards of every kind, keeps others, shuts its client down and exits: nothing is
//! left in Redis, although every lease (30 s) is far from over.

mod common;

use std::time::Duration;

use common::connect_with;
use common::kinds::{Kind, Opts};
use lockwarden_core::{LockClient, LockError};
use lockwarden_testkit::{run_child, RedisServer, TestProcess};

/// Set only in the child process: the server's URL.
const CHILD_URL: &str = "LOCKWARDEN_SHUTDOWN_CHILD_URL";
/// How long the child's shutdown may take.
const SHUTDOWN: Duration = Duration::from_secs(5);
const KINDS: [Kind; 5] = [
    Kind::Plain,
    Kind::Fair,
    Kind::Read,
    Kind::Write,
    Kind::Multi,
];

/// The keys of locks in `server` (not the fencing counters, which outlive a release on
/// purpose).
fn locks_left(server: &RedisServer) -> Vec<String> {
    let keys = server.keys_matching("lockwarden:*");
    keys.into_iter()
        .filter(|k| !k.ends_with(":fence"))
        .collect()
}

/// Not a test on its own: the child of the test below. Drops a guard of every kind with
/// the watchdog and with a fixed lease, keeps one of each (never released nor dropped,
/// as a task that never ends would), a completed claim's guard too, then shuts down.
#[test]
fn child_drops_keeps_and_shuts_down() {
    run_child(CHILD_URL, |url| async move {
        let client = LockClient::connect(&url).await.expect("connect");
        let fixed = Opts::lease(Duration::from_secs(30));
        let mut dropped = Vec::new();
        for kind in KINDS {
            for (how, opts) in [("watched", Opts::default()), ("fixed", fixed.clone())] {
                let name = format!("dropped-{how}-{kind:?}");
                dropped.push(kind.acquire(&client, &name, &opts).await.expect("acquire"));
                let kept = format!("kept-{how}-{kind:?}");
                let held = kind.acquire(&client, &kept, &opts).await.expect("acquire");
                std::mem::forget(held);
            }
        }
        let claimed = client.lock("claimed").try_claim(Duration::ZERO).await;
        let claimed = match claimed.expect("claim") {
            lockwarden_core::Claim::Acquired(guard) => guard,
            other => panic!("a first claim found {other:?}"),
        };
        // Dropped right before the process exits: their releases are only queued.
        drop(dropped);
        drop(claimed);
        let shut = client.shutdown(SHUTDOWN).await;
        println!("SHUTDOWN {shut:?}");
    });
}

#[test]
fn a_process_that_shuts_its_client_down_leaves_no_lock() {
    let server = RedisServer::start().expect("start redis-server");
    let url = server.url();
    let mut child = TestProcess::spawn("child_drops_keeps_and_shuts_down", &[(CHILD_URL, &url)])
        .expect("spawn the child");
    let shut = child.wait_for_line("SHUTDOWN ", Duration::from_secs(30));
    assert_eq!(shut, "Ok(())", "the child's shutdown");
    let status = child.wait_within(Duration::from_secs(10));
    assert!(status.success(), "the child failed: {status}");
    // At once: not after the leases (30 s) ran out.
    let left = locks_left(&server);
    assert!(left.is_empty(), "left behind: {left:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_shutdown_no_lock_is_taken_and_waiters_end() {
    let server = RedisServer::start().expect("start redis-server");
    let client = connect_with(&server.url(), |b| b).await;
    let other = connect_with(&server.url(), |b| b).await;
    let held = other.acquire("busy").await.expect("acquire");
    let waiting = {
        let client = client.clone();
        tokio::spawn(async move { client.try_acquire("busy", Duration::from_secs(20)).await })
    };
    let watched = client.acquire("watched").await.expect("acquire");
    tokio::time::sleep(Duration::from_millis(200)).await;

    client.shutdown(SHUTDOWN).await.expect("shutdown");
    let waited = common::finishes(Duration::from_secs(2), "the waiter ends", waiting).await;
    assert!(
        matches!(waited, Err(LockError::ShutDown { ref key }) if key == "busy"),
        "{waited:?}"
    );
    assert!(watched.is_lost(), "a released watched guard is told");
    assert!(matches!(
        watched.release().await,
        Err(LockError::Lost { .. })
    ));
    assert!(matches!(
        client.try_acquire("fresh", Duration::ZERO).await,
        Err(LockError::ShutDown { .. })
    ));
    held.release()
        .await
        .expect("the other client is not affected");
    assert!(locks_left(&server).is_empty(), "{:?}", locks_left(&server));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shutdown_redis_does_not_answer_names_what_it_left() {
    let server = RedisServer::start().expect("start redis-server");
    let client = connect_with(&server.url(), |b| {
        b.command_timeout(Duration::from_millis(300))
    })
    .await;
    let kept = client.acquire("kept").await.expect("acquire");
    std::mem::forget(kept);
    drop(client.acquire("dropped").await.expect("acquire"));
    server.pause();
    let started = std::time::Instant::now();
    let shut = client.shutdown(Duration::from_secs(1)).await;
    let took = started.elapsed();
    server.resume();
    let error = shut.expect_err("nothing could be confirmed");
    assert_eq!(error.unreleased, ["kept"]);
    assert!(took < Duration::from_secs(3), "bounded: {took:?}");
}
