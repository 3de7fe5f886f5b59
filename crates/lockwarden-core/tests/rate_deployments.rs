//! The rate limiter on every deployment the locks run on: a real 3-master Redis Cluster
//! (each decision's buckets in one slot, on the master that owns it), Sentinel through a
//! real failover (the buckets the new primary received still count), and ACL users: the
//! guide's line is enough, a user without a command the script calls is refused at
//! connect naming it, and with that check skipped the refusal names the command and
//! charges nothing. TLS is `tls.rs`'s `a_rate_limiter_decides_over_tls` (Redis only: the
//! Valkey build the suite uses has no TLS).

use std::time::{Duration, Instant};

use lockwarden_core::{BackendError, LockClient, LockError, RateLimiter, RatePolicy};
use lockwarden_testkit::{eventually, RedisCluster, RedisSentinel, RedisServer};

/// The guide's ACL line for the default namespace (`src/guide/connecting.md`), which the
/// rate limiter needs nothing beyond.
const GUIDE_LINE: &str = "~lockwarden:* &lockwarden:* +evalsha +script|load +subscribe \
+unsubscribe +publish +time +exists +get +set +del +pexpire +pexpireat +pttl +hget +hmget +hset \
+hexists +hincrby +hdel +llen +lindex +lpop +lpos +lrem +rpush +zadd +zrem +zcard +zscore +zrank \
+zrange +zrangebyscore +zremrangebyscore +copy";

/// What `lua/rate_limit.lua` calls.
const SCRIPT_CALLS: [&str; 4] = ["+time", "+get", "+set", "+del"];

/// 3 at once, then one a second; and 5 an hour.
fn policies() -> [RatePolicy; 2] {
    [
        RatePolicy::new("second", 1, Duration::from_secs(1)).burst(3),
        RatePolicy::new("hour", 5, Duration::from_secs(3600)),
    ]
}

fn limiter(client: &LockClient) -> RateLimiter {
    client.rate_limiter("api", policies()).unwrap()
}

/// The burst, a refusal by the per-second policy that charges the hourly one nothing.
async fn burst_then_refused(api: &RateLimiter, key: &str) {
    for left in [2, 1, 0] {
        let decision = api.check(key).await.unwrap();
        assert!(decision.is_allowed(), "{key}: {decision:?}");
        assert_eq!(decision.policies()[0].remaining(), left);
    }
    let refused = api.check(key).await.unwrap();
    assert!(!refused.is_allowed(), "{key}");
    assert_eq!(refused.policies()[1].remaining(), 2, "{key}: {refused:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_keeps_each_decision_in_one_slot_on_its_master() {
    let cluster = RedisCluster::start(3).unwrap();
    let connect = || async {
        LockClient::builder()
            .connect_cluster(cluster.urls())
            .await
            .expect("connect to the cluster")
    };
    let (a, b) = (connect().await, connect().await);
    let (api_a, api_b) = (limiter(&a), limiter(&b));
    for node in 0..3 {
        let key = (0..10_000)
            .map(|i| format!("tenant:{i}"))
            .find(|key| {
                let bucket = &api_a.bucket_keys(key).unwrap()[0];
                cluster.owner(bucket).unwrap() == node
            })
            .expect("a key on every master");
        burst_then_refused(&api_a, &key).await;
        // Another client (replica) sees the same buckets.
        assert!(!api_b.check(&key).await.unwrap().is_allowed());
        let buckets = api_a.bucket_keys(&key).unwrap();
        let slots: Vec<u16> = buckets.iter().map(|k| cluster.slot(k).unwrap()).collect();
        assert_eq!(slots[0], slots[1], "{buckets:?}");
        for bucket in &buckets {
            assert!(cluster.exists_on(node, bucket), "{bucket} on master {node}");
        }
        api_b.reset(&key).await.unwrap();
        assert!(api_a.check(&key).await.unwrap().is_allowed());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_follows_the_primary_and_the_replicated_buckets_still_count() {
    const FAILOVER: Duration = Duration::from_secs(20);
    let mut sentinel = RedisSentinel::start().unwrap();
    let old = sentinel.master_port().unwrap();
    let client = LockClient::builder()
        .connect_sentinel([sentinel.sentinel_url()], sentinel.service())
        .await
        .expect("connect through the sentinel");
    let api = limiter(&client);
    burst_then_refused(&api, "kept").await;
    // The buckets reached the replica (asynchronously) before the primary dies.
    let buckets = api.bucket_keys("kept").unwrap();
    for bucket in &buckets {
        eventually(
            Duration::from_secs(5),
            "the replica has the bucket",
            || async { sentinel.servers()[1].exists(bucket) },
        )
        .await;
    }
    sentinel.servers_mut()[0].kill();
    let new = sentinel.wait_for_failover(old, FAILOVER).unwrap();
    assert_eq!(new, sentinel.servers()[1].port());
    // Decisions reach the new primary once the client follows it.
    let deadline = Instant::now() + FAILOVER;
    let fresh = loop {
        match api.check("fresh").await {
            Ok(decision) => break decision,
            Err(error) => {
                assert!(
                    Instant::now() < deadline,
                    "no primary after the failover: {error}"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    };
    assert!(fresh.is_allowed());
    // The hourly bucket came over with its charges (the per-second one may have filled
    // up again during the failover).
    let kept = api.peek("kept").await.unwrap();
    assert_eq!(kept.policies()[1].remaining(), 2, "{kept:?}");
}

fn rules(without: &[&str]) -> Vec<String> {
    GUIDE_LINE
        .split_whitespace()
        .filter(|rule| !without.contains(rule))
        .map(str::to_owned)
        .collect()
}

fn user(server: &RedisServer, name: &str, without: &[&str]) -> String {
    let rules = rules(without);
    let rules: Vec<&str> = rules.iter().map(String::as_str).collect();
    server.acl_user(name, "s3cret-pw", &rules).unwrap()
}

#[test]
fn the_guide_gives_this_line() {
    let guide = include_str!("../src/guide/connecting.md");
    let line = format!("ACL SETUSER locks reset on >CHANGE-ME {GUIDE_LINE}");
    assert!(guide.contains(&line), "the guide does not say:\n{line}");
    let script = include_str!("../../../lua/rate_limit.lua");
    for call in SCRIPT_CALLS {
        let name = call.trim_start_matches('+').to_ascii_uppercase();
        assert!(script.contains(&format!("redis.call('{name}'")), "{name}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_guides_acl_line_is_enough_and_a_missing_command_is_named() {
    let server = RedisServer::start().unwrap();
    let url = user(&server, "limits", &[]);
    let client = LockClient::connect(&url).await.unwrap();
    let api = limiter(&client);
    burst_then_refused(&api, "k").await;
    let _ = api.peek("k").await.unwrap();
    api.refund("k", 1).await.unwrap();
    api.reset("k").await.unwrap();
    assert!(api.check("k").await.unwrap().is_allowed());

    // Each command the script calls, missing: refused at connect, named.
    for call in SCRIPT_CALLS {
        let name = call.trim_start_matches('+');
        let url = user(&server, &format!("no-{name}"), &[call]);
        match LockClient::connect(&url).await {
            Err(LockError::Backend(BackendError::NotPermitted { command, .. })) => {
                assert_eq!(command, name.to_ascii_uppercase());
            }
            other => panic!(
                "without {call}: expected a refusal, got {:?}",
                other.map(drop)
            ),
        }
    }

    // With the check skipped: the decision fails naming the command and its line, and
    // nothing is charged.
    let url = user(&server, "no-set-unchecked", &["+set"]);
    let unchecked = LockClient::builder()
        .skip_permission_check()
        .connect(&url)
        .await
        .unwrap();
    match limiter(&unchecked).check("other").await {
        Err(LockError::Backend(BackendError::NotPermitted { command, .. })) => {
            assert!(
                command.starts_with("SET") && command.contains("rate_limit.lua"),
                "{command}"
            );
        }
        other => panic!("expected a refusal naming SET, got {other:?}"),
    }
    for bucket in api.bucket_keys("other").unwrap() {
        assert!(!server.exists(&bucket), "{bucket} was written");
    }
    assert_eq!(
        api.peek("other").await.unwrap().policies()[0].remaining(),
        3
    );
}
