//! Rate limiters' buckets in a live Redis: `list` shows every key whose buckets are not
//! full with what each policy has left and when it is full again (as the core's own
//! `peek` says), `show --limiter` one key, `reset` empties a key through the core; on one
//! server and on every master of a cluster.

mod common;

use std::time::Duration;

use common::lockwarden;
use lockwarden_core::{LockClient, RateLimiter, RatePolicy};
use lockwarden_testkit::{RedisCluster, RedisServer};
use serde_json::Value;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// 5 a minute (one per 12 s) and 1,000 a day: what is left does not move during a test.
fn api(client: &LockClient) -> RateLimiter {
    let policies = [
        RatePolicy::new("minute", 5, Duration::from_secs(60)),
        RatePolicy::new("day", 1_000, Duration::from_secs(86_400)),
    ];
    client.rate_limiter("api", policies).unwrap()
}

fn limited<'a>(list: &'a Value, limiter: &str, key: &str) -> &'a Value {
    list["rate_limits"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["limiter"] == limiter && v["key"] == key)
        .unwrap_or_else(|| panic!("{limiter}/{key} not listed: {list:#}"))
}

#[test]
fn list_and_show_say_what_each_key_has_left_as_the_core_does() {
    let server = RedisServer::start().unwrap();
    let url = server.url();
    let rt = runtime();
    let awkward = "we{ir}d%7B ünï/✓";
    let (api, peeks) = rt.block_on(async {
        let client = LockClient::connect(&url).await.unwrap();
        let api = api(&client);
        for _ in 0..3 {
            assert!(api.check("tenant:7").await.unwrap().is_allowed());
        }
        assert!(api.check(awkward).await.unwrap().is_allowed());
        let other = client
            .rate_limiter(
                "other",
                [RatePolicy::new("hour", 2, Duration::from_secs(3600))],
            )
            .unwrap();
        assert!(other.check("tenant:7").await.unwrap().is_allowed());
        let peek = api.peek("tenant:7").await.unwrap();
        (api, peek)
    });

    let list = lockwarden(&["--url", &url, "list", "--json"]).json();
    assert_eq!(list["locks"].as_array().unwrap().len(), 0);
    assert_eq!(list["rate_scan"]["complete"], true);
    assert_eq!(list["rate_limits"].as_array().unwrap().len(), 3, "{list:#}");
    let tenant = limited(&list, "api", "tenant:7");
    let buckets = tenant["buckets"].as_array().unwrap();
    let names: Vec<&str> = buckets
        .iter()
        .map(|b| b["policy"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["day", "minute"]);
    let bucket = |policy: &str| buckets.iter().find(|b| b["policy"] == policy).unwrap();
    // What the core's own look said, policy by policy.
    for state in peeks.policies() {
        let b = bucket(state.policy().name());
        assert_eq!(b["remaining"], state.remaining(), "{b}");
        let reset = b["reset_us"].as_u64().unwrap();
        let said = state.reset().as_micros() as u64;
        assert!(
            reset <= said && said - reset < 5_000_000,
            "{reset} vs {said}"
        );
    }
    assert_eq!(bucket("minute")["remaining"], 2);
    assert_eq!(bucket("minute")["burst"], 5);
    assert_eq!(bucket("minute")["interval_us"], 12_000_000);
    assert_eq!(bucket("day")["remaining"], 997);
    // The keys are the core's.
    let keys = api.bucket_keys("tenant:7").unwrap();
    assert_eq!(bucket("minute")["redis_key"], keys[0].as_str());
    assert_eq!(bucket("day")["redis_key"], keys[1].as_str());
    assert_eq!(
        limited(&list, "api", awkward)["buckets"][0]["remaining"],
        999
    );
    assert_eq!(
        limited(&list, "other", "tenant:7")["buckets"][0]["policy"],
        "hour"
    );

    // A glob over `<limiter>:<key>`.
    let only = lockwarden(&["--url", &url, "list", "other:*", "--json"]).json();
    assert_eq!(only["rate_limits"].as_array().unwrap().len(), 1, "{only:#}");
    let text = lockwarden(&["--url", &url, "list", "api:tenant*"]);
    let text = text.ok();
    assert!(text.contains("no locks under namespace"), "{text}");
    let row = text
        .lines()
        .find(|l| l.contains("minute"))
        .unwrap_or_else(|| panic!("{text}"));
    for cell in ["api", "2/5", "12.0s", "tenant:7"] {
        assert!(row.contains(cell), "{cell} in {row:?}");
    }
    assert!(text.contains("1 rate-limited key; scan complete"), "{text}");
    assert!(!text.contains("other"), "{text}");

    // One key.
    let show = lockwarden(&[
        "--url",
        &url,
        "show",
        "tenant:7",
        "--limiter",
        "api",
        "--json",
    ]);
    assert_eq!(show.json()["buckets"].as_array().unwrap().len(), 2);
    let shown = lockwarden(&["--url", &url, "show", awkward, "--limiter", "api"]);
    let shown = shown.ok();
    let row = shown.lines().find(|l| l.contains("minute")).unwrap();
    assert!(row.contains("4/5") && row.contains("12.0s"), "{shown}");
    assert!(
        shown.contains(&api.bucket_keys(awkward).unwrap()[0]),
        "{shown}"
    );
    let full = lockwarden(&["--url", &url, "show", "tenant:8", "--limiter", "api"]);
    assert_eq!(full.code, Some(3), "{full:#?}");
    assert!(full.stderr.contains("every bucket is full"), "{full:#?}");
    let bad = lockwarden(&["--url", &url, "show", "k", "--limiter", "a:b"]);
    assert_eq!(bad.code, Some(2), "{bad:#?}");
}

#[test]
fn reset_empties_a_key_through_the_core_and_asks_first() {
    let server = RedisServer::start().unwrap();
    let url = server.url();
    let rt = runtime();
    let api = rt.block_on(async {
        let client = LockClient::connect(&url).await.unwrap();
        let api = api(&client);
        assert!(api.check_n("k", 5).await.unwrap().is_allowed());
        assert!(!api.check("k").await.unwrap().is_allowed());
        api
    });
    // No terminal, no --yes: refused, nothing changed.
    let refused = lockwarden(&["--url", &url, "reset", "api", "k"]);
    assert_eq!(refused.code, Some(4), "{refused:#?}");
    assert!(refused.stderr.contains("pass --yes"), "{refused:#?}");
    assert!(!rt.block_on(api.check("k")).unwrap().is_allowed());

    let reset = lockwarden(&["--url", &url, "reset", "api", "k", "--yes", "--json"]).json();
    assert_eq!(reset["before"]["buckets"][0]["policy"], "day");
    assert_eq!(reset["before"]["buckets"][1]["remaining"], 0);
    for bucket in api.bucket_keys("k").unwrap() {
        assert!(!server.exists(&bucket), "{bucket}");
    }
    let look = rt.block_on(api.peek("k")).unwrap();
    assert_eq!(look.policies()[0].remaining(), 5);
    let again = lockwarden(&["--url", &url, "reset", "api", "k", "--yes"]);
    assert_eq!(again.code, Some(3), "nothing left to reset: {again:#?}");
}

#[test]
fn every_master_of_a_cluster_is_read() {
    let cluster = RedisCluster::start(3).unwrap();
    let urls = cluster.urls();
    let rt = runtime();
    let keys: Vec<String> = (0..12).map(|i| format!("tenant:{i}")).collect();
    let api = rt.block_on(async {
        let client = LockClient::builder().connect_cluster(&urls).await.unwrap();
        let api = api(&client);
        for key in &keys {
            assert!(api.check(key).await.unwrap().is_allowed());
        }
        api
    });
    let owners: std::collections::BTreeSet<usize> = keys
        .iter()
        .map(|k| cluster.owner(&api.bucket_keys(k).unwrap()[0]).unwrap())
        .collect();
    assert_eq!(owners.len(), 3, "the keys span every master");
    let seeds = urls.join(",");
    let list = lockwarden(&["--cluster", "--url", &seeds, "list", "--json"]).json();
    let limits = list["rate_limits"].as_array().unwrap();
    assert_eq!(limits.len(), 12, "{list:#}");
    assert!(limits.iter().all(|v| v["buckets"][1]["remaining"] == 4));
    let reset = lockwarden(&[
        "--cluster",
        "--url",
        &seeds,
        "reset",
        "api",
        "tenant:3",
        "-y",
    ]);
    reset.ok();
    assert_eq!(
        rt.block_on(api.peek("tenant:3")).unwrap().policies()[0].remaining(),
        5
    );
}
