//! On a Redis Cluster: locks on every master are found (each master is scanned), shown
//! and force-unlocked.

mod common;

use common::lockwarden;
use lockwarden_core::LockClient;
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
        (client, guards)
    });

    let seeds = urls.join(",");
    let list = lockwarden(&["--cluster", "--url", &seeds, "list", "--json"]).json();
    let locks = list["locks"].as_array().unwrap();
    assert_eq!(locks.len(), 13, "{list:#}");
    assert!(locks.iter().filter(|l| l["kind"] == "plain").count() == 12);
    assert_eq!(
        locks.iter().find(|l| l["name"] == "shelf").unwrap()["kind"],
        "read-write"
    );
    // One seed is enough to find every master.
    let one = lockwarden(&["--cluster", "--url", &urls[1], "list", "--json"]).json();
    assert_eq!(one["locks"].as_array().unwrap().len(), 13);

    let shown = lockwarden(&["--cluster", "--url", &seeds, "show", "invoice:3", "--json"]).json();
    assert_eq!(shown["kind"], "plain");
    assert_eq!(shown["holders"][0]["id"], guards[3].holder().id());

    for n in ["invoice:3", "shelf"] {
        lockwarden(&["--cluster", "--url", &seeds, "unlock", n, "--yes"]).ok();
    }
    let after = lockwarden(&["--cluster", "--url", &seeds, "list", "--json"]).json();
    assert_eq!(after["locks"].as_array().unwrap().len(), 11);
    rt.block_on(async {
        assert!(!client.lock("invoice:3").is_locked().await.unwrap());
        assert!(!client.rw_lock("shelf").is_locked().await.unwrap());
        assert!(client.lock("invoice:4").is_locked().await.unwrap());
        drop(guards);
    });
}
