//! Redis out of memory, on real servers with a small `maxmemory`: with `noeviction` an
//! acquire that cannot write fails clearly and leaves nothing half-written, while held
//! locks can still be released and renewed; with an evicting policy, a held lock that is
//! evicted is reported through `lost()` within one renewal period.

use std::time::{Duration, Instant};

use lockwarden_core::{LockClient, LockError};
use lockwarden_testkit::{eventually, RedisServer};

/// Puts 4 MiB of data in the server, then lowers `maxmemory` to 1 MiB: far over the
/// limit, so every write that could grow memory is refused (not just the next few, as
/// right at the limit, where memory wobbles).
fn out_of_memory(server: &RedisServer) {
    let filler = "x".repeat(64 * 1024);
    for i in 0..64 {
        server.cmd(&["SET", &format!("filler:{i}"), &filler]).unwrap();
    }
    server.cmd(&["CONFIG", "SET", "maxmemory", "1mb"]).unwrap();
    assert!(server.cmd(&["SET", "probe", "1"]).is_err(), "the server is out of memory");
}

/// Promise: under `noeviction`, an acquire that cannot write is a `Backend` error that
/// says so (OOM), and leaves neither the lock nor its fencing key behind; a lock taken
/// before is still renewed by the watchdog and can be released (a release only deletes).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn out_of_memory_refuses_new_locks_cleanly_and_lets_held_ones_go() {
    let server = RedisServer::start_with(&["--maxmemory-policy", "noeviction"]).unwrap();
    let client = LockClient::builder()
        .watchdog_timeout(Duration::from_millis(600))
        .connect(&server.url())
        .await
        .unwrap();
    let held = client.acquire("before").await.unwrap();
    out_of_memory(&server);

    match client.try_acquire("after", Duration::ZERO).await {
        Err(LockError::Backend(error)) => {
            assert!(error.to_string().contains("OOM"), "the error says why: {error}");
        }
        other => panic!("expected a backend error, got {other:?}"),
    }
    assert!(!server.exists("lockwarden:{after}"), "no lock left behind");
    assert!(!server.exists("lockwarden:{after}:fence"), "no fencing key left behind");

    tokio::time::sleep(Duration::from_millis(1000)).await; // > 1 lease: renewals ran
    assert!(!held.is_lost(), "renewals work out of memory");
    held.release().await.unwrap();
    assert!(!server.exists("lockwarden:{before}"));
}

/// Promise: under an evicting policy a held lock can be evicted like any key; its guard
/// then reports the loss within one renewal period (a third of the 600 ms lease).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_evicted_lock_is_reported_lost_within_one_renewal() {
    let server =
        RedisServer::start_with(&["--maxmemory", "4mb", "--maxmemory-policy", "allkeys-random"])
            .unwrap();
    let client = LockClient::builder()
        .watchdog_timeout(Duration::from_millis(600))
        .connect(&server.url())
        .await
        .unwrap();
    let held = client.acquire("evictable").await.unwrap();
    // Write until the lock's hash is evicted (bounded: 20,000 values, 20 s).
    let filler = "x".repeat(10 * 1024);
    let started = Instant::now();
    let mut i = 0;
    while server.exists("lockwarden:{evictable}") {
        assert!(i < 20_000 && started.elapsed() < Duration::from_secs(20), "never evicted");
        let _ = server.cmd(&["SET", &format!("filler:{i}"), &filler]);
        i += 1;
    }
    let evicted = Instant::now();
    eventually(Duration::from_secs(2), "the guard reports the eviction", || async {
        held.is_lost()
    })
    .await;
    let noticed = evicted.elapsed();
    assert!(noticed <= Duration::from_millis(400), "noticed after {noticed:?}");
}
