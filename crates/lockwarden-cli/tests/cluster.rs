//! On a Redis Cluster: locks on every master are found (each master is scanned), shown
//! and force-unlocked, a semaphore's waiters woken as a lock's are.

mod common;

use common::lockwarden;
use std::time::{Duration, Instant};

use lockwarden_core::{LockClient, LockClientBuilder, ReleaseNotices};
use lockwarden_testkit::RedisCluster;

#[test]
fn every_master_is_scanned_and_unlock_follows_the_slot() {
    let cluster = RedisCluster::start(3).expect("start a cluster");
    let urls = cluster.urls();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let names: Vec<String> = (0..12).map(|i| format!("invoice:{i}")).collect();
    let owners: std::collections::BTreeSet<usize> = names
        .iter()
        .map(|n| cluster.owner(&format!("lockwarden:{{{n}}}")).unwrap())
        .collect();
    assert_eq!(owners.len(), 3, "the names span every master");
    let (client, guards) = rt.block_on(async {
        let client = LockClient::builder()
            .connect_cluster(&urls)
            .await
            .expect("connect");
        let mut guards = Vec::new();
        for n in &names {
            guards.push(client.acquire(n).await.unwrap());
        }
        guards.push(client.rw_lock("shelf").read().acquire().await.unwrap());
        guards.push(client.semaphore("pool", 3).acquire_many(2).await.unwrap());
        (client, guards)
    });

    let seeds = urls.join(",");
    let list = lockwarden(&["--cluster", "--url", &seeds, "list", "--json"]).json();
    let locks = list["locks"].as_array().unwrap();
    assert_eq!(locks.len(), 14, "{list:#}");
    assert!(locks.iter().filter(|l| l["kind"] == "plain").count() == 12);
    assert_eq!(
        locks.iter().find(|l| l["name"] == "shelf").unwrap()["kind"],
        "read-write"
    );
    let pool = locks.iter().find(|l| l["name"] == "pool").unwrap();
    assert_eq!(pool["kind"], "semaphore", "{pool:#}");
    assert_eq!(pool["semaphore"]["capacity"], 3);
    assert_eq!(pool["semaphore"]["in_use"], 2);
    assert_eq!(pool["holders"][0]["id"], guards[13].holder().id());
    assert_eq!(pool["holders"][0]["count"], 2);
    // A semaphore keeps its last token only (each hold's is its holder's): this one's.
    assert_eq!(pool["fencing_token"], guards[13].fencing_token());
    // One seed is enough to find every master.
    let one = lockwarden(&["--cluster", "--url", &urls[1], "list", "--json"]).json();
    assert_eq!(one["locks"].as_array().unwrap().len(), 14);

    let shown = lockwarden(&["--cluster", "--url", &seeds, "show", "invoice:3", "--json"]).json();
    assert_eq!(shown["kind"], "plain");
    assert_eq!(shown["holders"][0]["id"], guards[3].holder().id());

    for n in ["invoice:3", "shelf", "pool"] {
        lockwarden(&["--cluster", "--url", &seeds, "unlock", n, "--yes"]).ok();
    }
    let after = lockwarden(&["--cluster", "--url", &seeds, "list", "--json"]).json();
    assert_eq!(after["locks"].as_array().unwrap().len(), 11);
    rt.block_on(async {
        assert!(!client.lock("invoice:3").is_locked().await.unwrap());
        assert!(!client.rw_lock("shelf").is_locked().await.unwrap());
        assert_eq!(client.semaphore("pool", 3).state().await.unwrap(), None);
        assert!(client.lock("invoice:4").is_locked().await.unwrap());
        drop(guards);
    });
}

/// A waiter is woken by an unlock from the CLI at once, not at the holder's 30 s lease
/// (a semaphore's waiter: not at its own retry, 15 s on): the CLI sends its notice the way
/// the application's clients listen, sharded by default on these Redis 7 masters, classic
/// with `--classic-notices` for clients that use `notices(ReleaseNotices::Classic)`.
#[test]
fn an_unlock_wakes_a_waiter_with_either_kind_of_notice() {
    let cluster = RedisCluster::start(3).expect("start a cluster");
    let seeds = cluster.urls().join(",");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let default = |b: LockClientBuilder| b;
    for (flags, configure) in [
        (&[][..], default as fn(_) -> _),
        (&["--classic-notices"][..], |b: LockClientBuilder| {
            b.notices(ReleaseNotices::Classic)
        }),
    ] {
        for semaphore in [false, true] {
            let what = if semaphore { "semaphore" } else { "lock" };
            let name = format!("stuck-{what}{}", flags.len());
            let (guard, waiter) = rt.block_on(async {
                let connect = || async {
                    configure(LockClient::builder().watchdog_timeout(Duration::from_secs(30)))
                        .connect_cluster(cluster.urls())
                        .await
                        .expect("connect")
                };
                let (holder, waiting) = (connect().await, connect().await);
                let guard = match semaphore {
                    true => holder.semaphore(&name, 1).acquire().await,
                    false => holder.acquire(&name).await,
                };
                let guard = guard.unwrap();
                let waiter = tokio::spawn({
                    let name = name.clone();
                    async move {
                        let wait = Duration::from_secs(20);
                        let got = match semaphore {
                            true => waiting.semaphore(&name, 1).try_acquire(wait).await,
                            false => waiting.try_acquire(&name, wait).await,
                        };
                        (got.map(drop), Instant::now())
                    }
                });
                tokio::time::sleep(Duration::from_millis(300)).await; // the waiter subscribes
                assert!(
                    !waiter.is_finished(),
                    "{flags:?}: the waiter got a held {what}"
                );
                (guard, waiter)
            });
            // The waiter's connection counts, however it subscribed.
            let shown = lockwarden(&["--cluster", "--url", &seeds, "show", &name, "--json"]).json();
            assert_eq!(shown["subscribers"], 1, "{flags:?}: {shown:#}");
            if semaphore {
                assert_eq!(shown["semaphore"]["waiting"], 1, "{flags:?}: {shown:#}");
            }
            let mut args = vec!["--cluster", "--url", &seeds];
            args.extend_from_slice(flags);
            args.extend_from_slice(&["unlock", &name, "--yes"]);
            let unlocked = Instant::now();
            lockwarden(&args).ok();
            let (got, at) = rt.block_on(waiter).unwrap();
            got.unwrap_or_else(|e| panic!("{flags:?} {what}: {e}"));
            let served = at.saturating_duration_since(unlocked);
            assert!(
                served < Duration::from_secs(5),
                "{flags:?}: the {what}'s waiter woken {served:?} after the unlock"
            );
            rt.block_on(async { drop(guard) });
        }
    }
}
