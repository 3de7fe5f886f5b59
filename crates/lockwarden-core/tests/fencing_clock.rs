//! Fencing tokens against a server clock that steps back, on a real `redis-server` whose
//! wall clock the testkit's `FakeClock` sets (an hour back here), with and without the
//! lock's fencing key surviving in between.
//!
//! A token is the server clock in µs, or one above the lock's last token (its fencing
//! key) when the clock is not past it. So tokens strictly increase while the fencing key
//! lives (it lives as long as the lock's last hold would have: its lease, renewals
//! included), and across its loss only while the server clock is past the last token.
//! Lost key and a clock stepped back together: tokens go backwards. These tests pin both
//! sides down, and which persistence keeps the key across a restart.

mod common;

use std::time::Duration;

use common::connect_with;
use lockwarden_core::LockClient;
use lockwarden_testkit::{eventually, FakeClock, RedisServer};

/// How far the server's clock steps back: far more than any test takes.
const BACK: Duration = Duration::from_secs(3600);
/// A lease that outlives every test here: the fencing key lives as long.
const LONG: Duration = Duration::from_secs(60);
/// Persistence that keeps every write Redis answered across a SIGKILL.
const AOF_ALWAYS: [&str; 4] = ["--appendonly", "yes", "--appendfsync", "always"];

fn server(clock: &FakeClock, args: &[&str]) -> RedisServer {
    RedisServer::start_with_clock(clock, args).expect("start redis-server on a fake clock")
}

/// Takes `name` with a fixed `lease` and releases it: its token.
async fn token(client: &LockClient, name: &str, lease: Duration) -> u64 {
    let guard = client.lock(name).lease(lease).acquire().await;
    let guard = guard.expect("acquire");
    let token = guard.fencing_token();
    guard.release().await.expect("release");
    token
}

fn fence(name: &str) -> String {
    format!("lockwarden:{{{name}}}:fence")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn while_the_fencing_key_lives_a_clock_stepped_back_still_issues_larger_tokens() {
    let clock = FakeClock::new().expect("a fake clock");
    let server = server(&clock, &[]);
    let client = connect_with(&server.url(), |b| b).await;
    let first = token(&client, "lives", LONG).await;
    clock.set_back(BACK).expect("step back");
    let second = token(&client, "lives", LONG).await;
    let third = token(&client, "lives", LONG).await;
    assert_eq!(second, first + 1, "bumped past the last token");
    assert_eq!(third, second + 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn once_the_fencing_key_ran_out_a_clock_stepped_back_issues_smaller_tokens() {
    let clock = FakeClock::new().expect("a fake clock");
    let server = server(&clock, &[]);
    let client = connect_with(&server.url(), |b| b).await;
    let first = token(&client, "ran-out", Duration::from_millis(200)).await;
    eventually(
        Duration::from_secs(5),
        "the fencing key runs out",
        || async { !server.exists(&fence("ran-out")) },
    )
    .await;
    clock.set_back(BACK).expect("step back");
    let second = token(&client, "ran-out", LONG).await;
    assert!(
        second < first,
        "with its key gone, the token is the stepped-back clock: {second} after {first}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_persistence_a_restart_and_a_clock_stepped_back_issue_smaller_tokens() {
    let clock = FakeClock::new().expect("a fake clock");
    let mut server = server(&clock, &[]);
    let client = connect_with(&server.url(), |b| b).await;
    let first = token(&client, "forgotten", LONG).await;
    server.restart().expect("restart");
    assert!(!server.exists(&fence("forgotten")), "nothing persisted");
    clock.set_back(BACK).expect("step back");
    let second = token(&client, "forgotten", LONG).await;
    assert!(second < first, "{second} after {first}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_aof_always_the_fencing_key_outlives_a_restart_and_tokens_increase() {
    let clock = FakeClock::new().expect("a fake clock");
    let mut server = server(&clock, &AOF_ALWAYS);
    let client = connect_with(&server.url(), |b| b).await;
    let first = token(&client, "kept", LONG).await;
    server.restart().expect("restart");
    assert!(
        server.exists(&fence("kept")),
        "the AOF kept the fencing key"
    );
    clock.set_back(BACK).expect("step back");
    let second = token(&client, "kept", LONG).await;
    assert_eq!(second, first + 1, "bumped past the last token");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_rdb_only_the_tokens_of_the_last_snapshot_are_kept() {
    let clock = FakeClock::new().expect("a fake clock");
    // RDB snapshots only when told (no automatic save points), no AOF.
    let mut server = server(&clock, &["--save", ""]);
    let client = connect_with(&server.url(), |b| b).await;
    let snapshotted = token(&client, "snapshot", LONG).await;
    let _: () = server.query(&["SAVE"]).expect("SAVE");
    let after_snapshot = token(&client, "snapshot", LONG).await;
    server.restart().expect("restart");
    clock.set_back(BACK).expect("step back");
    let restarted = token(&client, "snapshot", LONG).await;
    assert_eq!(restarted, snapshotted + 1, "past the snapshot's token");
    // A token issued after the snapshot was lost with it: the next one counts on from the
    // snapshot's, so it is not past the lost one (tokens count up by one while the key
    // lives, so it is that very token again).
    assert!(
        restarted <= after_snapshot,
        "a token issued after the snapshot is not kept: {restarted} after {after_snapshot}"
    );
}
