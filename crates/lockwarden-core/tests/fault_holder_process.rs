//! A holder *process* dies (SIGKILL) while it holds a watchdog lock: nobody releases the
//! lock and nobody publishes a release notice, so the lock must simply run out with the
//! lease of the holder's last renewal, and a waiter in another process must take it over
//! then: not earlier (that would break mutual exclusion) and not much later (that would
//! block the key for longer than one watchdog lease).
//!
//! The holder is this test binary itself, re-executed as a child process that runs only
//! [`holder_child`] (see [`HOLDER_ENV`]); run normally, `holder_child` returns at once.

mod common;

use std::time::{Duration, Instant};

use common::{connect_with, finishes, hold_until_killed, spawn_timed};
use lockwarden_core::LockClient;
use lockwarden_testkit::{run_child, RedisServer, TestProcess};

/// Set (to a Redis URL) only in the re-executed child: it makes [`holder_child`] act as
/// the holder process.
const HOLDER_ENV: &str = "LOCKWARDEN_HOLDER_URL";
/// The child test's name, passed to the re-executed binary with `--exact`.
const CHILD_TEST: &str = "holder_child";
const LOCK: &str = "sigkill";
const LOCK_KEY: &str = "lockwarden:{sigkill}";
/// The holder's watchdog lease: renewed every 500 ms.
const LEASE: Duration = Duration::from_millis(1500);

/// Not a test on its own: the body of the holder process. Without [`HOLDER_ENV`] it
/// returns at once. With it, it acquires [`LOCK`] with a 1.5 s watchdog lease, prints
/// `HELD <token> <holder id>` and then sleeps (at most 120 s, in case the parent died)
/// while its watchdog keeps renewing, until the parent SIGKILLs it.
#[test]
fn holder_child() {
    run_child(HOLDER_ENV, |url| async move {
        let client = connect_with(&url, |b| b.watchdog_timeout(LEASE)).await;
        let guard = client
            .try_acquire(LOCK, Duration::from_secs(10))
            .await
            .unwrap();
        let line = format!("HELD {} {}", guard.fencing_token(), guard.holder().id());
        hold_until_killed(line, guard).await;
    });
}

/// Promise: when the process holding a watchdog lock is SIGKILLed, a waiter in another
/// process acquires the lock
/// - never before the lease granted by the holder's last renewal has run out: acquired
///   at or after (time the PTTL was asked just before the kill) + that PTTL, minus
///   100 ms of tolerance for clock granularity; and
/// - no later than one watchdog lease (1.5 s) after the kill, plus 500 ms of slack for
///   scheduling on a loaded machine: the waiter sleeps until the holder's lease end and
///   retries then, it does not need a release notice that a dead holder never sends.
///
/// It also checks that the holder's watchdog really was renewing (the lock outlived one
/// lease before the kill) and that the new holder's fencing token is larger.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_of_a_killed_holder_process_is_taken_over_after_its_last_lease() {
    let server = RedisServer::start().unwrap();
    let mut child = TestProcess::spawn(CHILD_TEST, &[(HOLDER_ENV, &server.url())]).unwrap();
    let held = child.wait_for_line("HELD ", Duration::from_secs(30));
    let (token, child_holder) = held.split_once(' ').unwrap();
    let child_token: u64 = token.parse().unwrap();
    let held_at = Instant::now();

    // Outlive one whole lease: the lock can only still be there if the child's watchdog
    // renewed it.
    tokio::time::sleep(LEASE + Duration::from_millis(300)).await;
    let count: Option<String> = server.query(&["HGET", LOCK_KEY, child_holder]).unwrap();
    assert_eq!(
        count.as_deref(),
        Some("1"),
        "the holder's lock was not renewed past its first lease ({:?} after HELD)",
        held_at.elapsed()
    );

    // A waiter in this process, already waiting when the holder dies.
    let waiter = LockClient::connect(&server.url()).await.unwrap();
    let task = {
        let waiter = waiter.clone();
        spawn_timed(async move { waiter.try_acquire(LOCK, Duration::from_secs(10)).await })
    };
    // Off the renewal beat (renewals every 500 ms from HELD), so the kill usually lands
    // mid-interval and the dead holder's lease has less than a full lease left.
    tokio::time::sleep(Duration::from_millis(450)).await;
    assert!(!task.is_finished(), "the waiter got a lock that is held");

    let asked_at = Instant::now();
    let ttl = server.pttl(LOCK_KEY);
    child.kill();
    let killed_at = Instant::now();
    assert!(
        ttl > 0 && ttl <= LEASE.as_millis() as i64,
        "PTTL before the kill: {ttl}"
    );
    let ttl = Duration::from_millis(ttl as u64);

    let (guard, acquired_at) = finishes(Duration::from_secs(15), "the waiter finishes", task).await;
    let guard = guard.expect("the waiter acquires the dead holder's lock");
    let takeover = acquired_at.saturating_duration_since(killed_at);
    println!(
        "PTTL just before the kill: {ttl:?}; takeover {takeover:?} after the kill \
         (kill took {:?} after the PTTL query)",
        killed_at - asked_at
    );

    let earliest = (asked_at + ttl)
        .checked_sub(Duration::from_millis(100))
        .unwrap();
    assert!(
        acquired_at >= earliest,
        "acquired {takeover:?} after the kill, before the holder's last lease \
         ({ttl:?} left when asked) ran out"
    );
    let latest = killed_at + LEASE + Duration::from_millis(500);
    assert!(
        acquired_at <= latest,
        "acquired only {takeover:?} after the kill, more than one lease ({LEASE:?}) + 500 ms"
    );
    assert!(
        guard.fencing_token() > child_token,
        "fencing token went from {child_token} to {}",
        guard.fencing_token()
    );
    let fields: Vec<(String, String)> = server.query(&["HGETALL", LOCK_KEY]).unwrap();
    assert_eq!(
        fields,
        vec![(guard.holder().id().to_owned(), "1".to_owned())]
    );
    guard.release().await.unwrap();
}
