//! The rate limiter's promises, checked against both stores (the in-process one and a real
//! `redis-server`, see `common::Env`): the burst then one per interval, the exact wait of
//! a refusal, looks that charge nothing, refunds, several policies charged all or nothing,
//! costs in units, buckets that are forgotten once full, keys and limiters apart, bad input
//! refused with nothing charged; and, in-process with paused time, the exact count over
//! time and the exact wait to the µs, and the metrics.

mod common;

use std::collections::HashMap;
use std::sync::OnceLock;
use std::time::Duration;

use common::Env;
use lockwarden_core::{
    KeyError, LockClient, LockError, RateDecision, RateLimitError, RateLimiter, RatePolicy,
};
use lockwarden_testkit::eventually;
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};

conformance!(
    admits_the_burst_then_refuses_with_the_exact_wait,
    the_wait_is_what_it_takes,
    a_peek_charges_nothing,
    a_refund_gives_back_never_past_full,
    policies_are_charged_all_or_nothing,
    costs_count_in_units_and_a_refused_cost_charges_nothing,
    a_full_bucket_is_forgotten,
    keys_and_limiters_are_apart_and_clients_share,
    reset_empties_every_bucket,
    bad_input_is_refused_and_charges_nothing,
);

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// 10 per second, 3 at once: a 100 ms interval, a 300 ms refill.
fn per_second(name: &str) -> RatePolicy {
    RatePolicy::new(name, 10, Duration::from_secs(1)).burst(3)
}

fn limiter(client: &LockClient, name: &str, policies: &[RatePolicy]) -> RateLimiter {
    client
        .rate_limiter(name, policies.iter().cloned())
        .expect("valid policies")
}

fn refused(decision: &RateDecision) -> Vec<&str> {
    decision.refused_by().map(|s| s.policy().name()).collect()
}

async fn admits_the_burst_then_refuses_with_the_exact_wait(env: Env) {
    let client = env.client().await;
    let api = limiter(&client, "api", &[per_second("second")]);
    for left in [2, 1, 0] {
        let decision = api.check("k").await.unwrap();
        assert!(decision.is_allowed(), "{decision:?}");
        assert_eq!(decision.retry_after(), None);
        assert_eq!(decision.policies()[0].remaining(), left);
    }
    let refused = api.check("k").await.unwrap();
    assert!(!refused.is_allowed());
    let state = &refused.policies()[0];
    assert!(state.refused());
    assert_eq!(state.remaining(), 0);
    // Within one decision the numbers agree to the µs: the bucket is `reset` from full,
    // and one more request fits once it is within the burst, 200 ms of it.
    let wait = refused.retry_after().expect("a wait");
    assert_eq!(wait + ms(200), state.reset(), "{refused:?}");
    assert!(wait <= ms(100) && wait > Duration::ZERO, "{wait:?}");
    // Waiting that long is enough.
    tokio::time::sleep(wait + ms(5)).await;
    let next = api.check("k").await.unwrap();
    assert!(next.is_allowed(), "after the wait: {next:?}");
    assert_eq!(next.policies()[0].remaining(), 0);
}

/// A wait is not longer than needed, nor shorter: halfway through it the request is still
/// refused, with the rest of the wait.
async fn the_wait_is_what_it_takes(env: Env) {
    let client = env.client().await;
    let slow = RatePolicy::new("slow", 1, Duration::from_secs(1));
    let api = limiter(&client, "api", &[slow]);
    assert!(api.check("k").await.unwrap().is_allowed());
    let first = api.check("k").await.unwrap();
    let wait = first.retry_after().expect("refused");
    assert!(wait > ms(800) && wait <= ms(1000), "{wait:?}");
    let started = std::time::Instant::now();
    tokio::time::sleep(ms(400)).await;
    let later = api.peek("k").await.unwrap();
    let elapsed = started.elapsed();
    let rest = later.retry_after().expect("still refused halfway");
    // What is left is what was said less the time that passed (within the round trips).
    let expected = wait.saturating_sub(elapsed);
    let drift = rest.abs_diff(expected);
    assert!(drift < ms(60), "{rest:?} vs {expected:?}");
    tokio::time::sleep(rest + ms(5)).await;
    assert!(api.check("k").await.unwrap().is_allowed());
}

async fn a_peek_charges_nothing(env: Env) {
    let client = env.client().await;
    let api = limiter(&client, "api", &[per_second("second")]);
    for _ in 0..10 {
        let look = api.peek("k").await.unwrap();
        assert!(look.is_allowed());
        assert_eq!(look.policies()[0].remaining(), 3);
        assert_eq!(look.policies()[0].reset(), Duration::ZERO);
    }
    if env.is_redis() {
        let bucket = &api.bucket_keys("k").unwrap()[0];
        assert!(!env.server().exists(bucket), "a look stored nothing");
    }
    assert!(api.check_n("k", 3).await.unwrap().is_allowed());
    let look = api.peek("k").await.unwrap();
    assert!(!look.is_allowed());
    assert!(look.retry_after().unwrap() > Duration::ZERO);
    assert_eq!(refused(&look), ["second"]);
    // A look at a larger cost says how long that cost waits.
    let two = api.peek_n("k", 2).await.unwrap();
    assert!(two.retry_after().unwrap() > look.retry_after().unwrap() + ms(90));
}

async fn a_refund_gives_back_never_past_full(env: Env) {
    let client = env.client().await;
    let minute = RatePolicy::new("minute", 2, Duration::from_secs(60));
    let api = limiter(&client, "api", &[minute]);
    assert!(api.check_n("k", 2).await.unwrap().is_allowed());
    assert!(!api.check("k").await.unwrap().is_allowed());
    api.refund("k", 1).await.unwrap();
    assert!(api.check("k").await.unwrap().is_allowed());
    api.refund("k", 2).await.unwrap();
    assert_eq!(api.peek("k").await.unwrap().policies()[0].remaining(), 2);
    // Full already: a refund gives nothing more than the burst.
    api.refund("k", 5).await.unwrap();
    assert!(api.check_n("k", 2).await.unwrap().is_allowed());
    assert!(!api.check("k").await.unwrap().is_allowed());
}

async fn policies_are_charged_all_or_nothing(env: Env) {
    let client = env.client().await;
    let hour = RatePolicy::new("hour", 5, Duration::from_secs(3600));
    let api = limiter(&client, "api", &[per_second("second"), hour]);
    for _ in 0..3 {
        assert!(api.check("k").await.unwrap().is_allowed());
    }
    // The per-second policy refuses the fourth: the hourly one is not charged for it.
    for _ in 0..5 {
        let no = api.check("k").await.unwrap();
        assert_eq!(refused(&no), ["second"], "{no:?}");
        assert_eq!(no.policies()[1].remaining(), 2);
        assert!(!no.policies()[1].refused());
    }
    let look = api.peek("k").await.unwrap();
    assert_eq!(look.policies()[1].remaining(), 2);
    // The other way round: the hourly policy runs out while the per-second one has room,
    // which it keeps.
    tokio::time::sleep(ms(310)).await;
    assert!(api.check_n("k", 2).await.unwrap().is_allowed());
    let no = api.check("k").await.unwrap();
    assert_eq!(refused(&no), ["hour"], "{no:?}");
    assert_eq!(no.policies()[0].remaining(), 1, "{no:?}");
    assert!(no.retry_after().unwrap() > ms(700_000));
    if env.is_redis() {
        // Both buckets share one hash tag: one slot, one script.
        let keys = api.bucket_keys("k").unwrap();
        let tag = |k: &str| k[k.find('{').unwrap()..=k.find('}').unwrap()].to_owned();
        assert_eq!(tag(&keys[0]), tag(&keys[1]));
    }
}

async fn costs_count_in_units_and_a_refused_cost_charges_nothing(env: Env) {
    let client = env.client().await;
    let kib = RatePolicy::new("kib", 1000, Duration::from_secs(1)).burst(10);
    let api = limiter(&client, "uploads", &[kib]);
    let first = api.check_n("k", 6).await.unwrap();
    assert!(first.is_allowed());
    assert_eq!(first.policies()[0].remaining(), 4);
    let big = api.check_n("k", 9).await.unwrap();
    assert!(!big.is_allowed());
    // Five more units fit after 5 intervals (5 ms) at most.
    assert!(big.retry_after().unwrap() <= ms(5), "{big:?}");
    let small = api.check_n("k", 4).await.unwrap();
    assert!(
        small.is_allowed(),
        "the refused cost took nothing: {small:?}"
    );
}

async fn a_full_bucket_is_forgotten(env: Env) {
    let client = env.client().await;
    let fifth = RatePolicy::new("fifth", 5, Duration::from_secs(1)).burst(2);
    let api = limiter(&client, "api", &[fifth]);
    let decision = api.check("k").await.unwrap();
    assert!(decision.is_allowed());
    let reset = decision.policies()[0].reset();
    assert!(reset > ms(150) && reset <= ms(200), "{reset:?}");
    if env.is_redis() {
        let server = env.server();
        let bucket = api.bucket_keys("k").unwrap().remove(0);
        let pttl = server.pttl(&bucket);
        assert!(pttl > 100 && pttl <= 201, "expires with its TAT: {pttl}");
        let value: String = server.query(&["GET", &bucket]).unwrap();
        let (tat, spec) = value.split_at(16);
        assert!(tat.parse::<u64>().is_ok(), "{value}");
        assert_eq!(spec, ":200000:2");
        eventually(ms(2000), "the bucket is gone once full", || async {
            !server.exists(&bucket)
        })
        .await;
    } else {
        tokio::time::sleep(reset + ms(5)).await;
    }
    let look = api.peek("k").await.unwrap();
    assert_eq!(look.policies()[0].remaining(), 2);
    assert_eq!(look.policies()[0].reset(), Duration::ZERO);
}

async fn keys_and_limiters_are_apart_and_clients_share(env: Env) {
    let a = env.client().await;
    let b = env.client().await;
    let one = RatePolicy::new("day", 1, Duration::from_secs(86_400));
    let api_a = limiter(&a, "api", std::slice::from_ref(&one));
    let api_b = limiter(&b, "api", std::slice::from_ref(&one));
    let other = limiter(&a, "other", &[one]);
    assert!(api_a.check("tenant:1").await.unwrap().is_allowed());
    // Another client (another replica) of the same limiter sees the charge.
    assert!(!api_b.check("tenant:1").await.unwrap().is_allowed());
    assert!(api_b.check("tenant:2").await.unwrap().is_allowed());
    assert!(other.check("tenant:1").await.unwrap().is_allowed());
    // Keys with braces and percent signs stay apart from their escapes.
    assert!(api_a.check("{x}").await.unwrap().is_allowed());
    assert!(api_a.check("%7Bx%7D").await.unwrap().is_allowed());
    // A lock of the same name is another thing altogether.
    let guard = a.acquire("tenant:1").await.unwrap();
    assert!(api_a.check("tenant:3").await.unwrap().is_allowed());
    guard.release().await.unwrap();
}

async fn reset_empties_every_bucket(env: Env) {
    let client = env.client().await;
    let hour = RatePolicy::new("hour", 3, Duration::from_secs(3600));
    let api = limiter(&client, "api", &[per_second("second"), hour]);
    assert!(api.check_n("k", 3).await.unwrap().is_allowed());
    assert!(!api.check("k").await.unwrap().is_allowed());
    api.reset("k").await.unwrap();
    let look = api.peek("k").await.unwrap();
    assert_eq!(look.policies()[0].remaining(), 3);
    assert_eq!(look.policies()[1].remaining(), 3);
    if env.is_redis() {
        for bucket in api.bucket_keys("k").unwrap() {
            assert!(!env.server().exists(&bucket), "{bucket}");
        }
    }
    api.reset("never-touched").await.unwrap();
}

async fn bad_input_is_refused_and_charges_nothing(env: Env) {
    let client = env.client().await;
    let problem = |made: Result<RateLimiter, LockError>| match made {
        Err(LockError::InvalidRateLimit { problem, limiter }) => {
            assert!(!limiter.is_empty() || matches!(problem, RateLimitError::InvalidName { .. }));
            problem
        }
        other => panic!("expected a refusal, got {other:?}"),
    };
    let second = Duration::from_secs(1);
    let made = |policies: Vec<RatePolicy>| client.rate_limiter("api", policies);
    assert!(matches!(
        problem(made(vec![RatePolicy::new("p", 0, second)])),
        RateLimitError::ZeroQuota { policy } if policy == "p"
    ));
    assert!(matches!(
        problem(made(vec![RatePolicy::new("p", 1, second).burst(0)])),
        RateLimitError::ZeroBurst { .. }
    ));
    assert!(matches!(
        problem(made(vec![RatePolicy::new("p", 2_000_000, second)])),
        RateLimitError::TooFast {
            quota: 2_000_000,
            ..
        }
    ));
    assert!(matches!(
        problem(made(vec![RatePolicy::new("p", 1, Duration::ZERO)])),
        RateLimitError::TooFast { .. }
    ));
    let years = Duration::from_secs(10 * 365 * 86_400);
    assert!(matches!(
        problem(made(vec![RatePolicy::new("p", 1, years)])),
        RateLimitError::TooLong { .. }
    ));
    assert!(matches!(
        problem(made(vec![RatePolicy::new("p", 1, Duration::MAX)])),
        RateLimitError::TooLong { .. }
    ));
    assert!(matches!(problem(made(vec![])), RateLimitError::NoPolicies));
    let many = (0..9).map(|i| RatePolicy::new(format!("p{i}"), 1, second));
    assert!(matches!(
        problem(made(many.collect())),
        RateLimitError::TooManyPolicies { count: 9, max: 8 }
    ));
    let twice = vec![
        RatePolicy::new("p", 1, second),
        RatePolicy::new("p", 2, second),
    ];
    assert!(matches!(
        problem(made(twice)),
        RateLimitError::DuplicatePolicy { policy } if policy == "p"
    ));
    assert!(matches!(
        problem(made(vec![RatePolicy::new("a:b", 1, second)])),
        RateLimitError::InvalidName { what: "policy", .. }
    ));
    assert!(matches!(
        problem(client.rate_limiter("", [RatePolicy::new("p", 1, second)])),
        RateLimitError::InvalidName {
            what: "limiter",
            ..
        }
    ));
    // At the call: each refusal names what is wrong, and nothing is charged.
    let api = limiter(&client, "api", &[per_second("second")]);
    let key_error = |result: Result<RateDecision, LockError>| match result {
        Err(LockError::InvalidKey(e)) => e,
        other => panic!("expected a key error, got {other:?}"),
    };
    assert_eq!(key_error(api.check("").await), KeyError::Empty);
    assert!(matches!(
        key_error(api.check("k".repeat(256)).await),
        KeyError::TooLong { len: 256, max: 255 }
    ));
    assert!(matches!(
        key_error(api.check("a\nb").await),
        KeyError::ControlCharacter { at: 1 }
    ));
    match api.check_n("k", 0).await {
        Err(LockError::InvalidRateLimit {
            problem: RateLimitError::ZeroCost,
            ..
        }) => {}
        other => panic!("expected ZeroCost, got {other:?}"),
    }
    match api.check_n("k", 4).await {
        Err(LockError::InvalidRateLimit {
            problem:
                RateLimitError::CostAboveBurst {
                    policy,
                    cost: 4,
                    burst: 3,
                },
            limiter,
        }) => assert_eq!((policy.as_str(), limiter.as_str()), ("second", "api")),
        other => panic!("expected CostAboveBurst, got {other:?}"),
    }
    assert!(matches!(
        api.refund("k", 0).await,
        Err(LockError::InvalidRateLimit { .. })
    ));
    let message = api.check_n("k", 4).await.unwrap_err().to_string();
    assert!(
        message.contains("burst of 3") && message.contains("raise the burst"),
        "{message}"
    );
    assert_eq!(api.peek("k").await.unwrap().policies()[0].remaining(), 3);
    if env.is_redis() {
        assert!(env.server().keys_matching("lockwarden:rate:*").is_empty());
    }
}

/// In-process, on tokio's paused clock: a request every 1 ms for 20 s at 3 per second (an
/// interval of 333,333.3 µs, kept as 333,334), 3 at once. Every prefix of the run admits
/// at most `3 + 3 t`, and no more than one less (the arrivals' 1 ms, the rounding): exact,
/// never over.
#[tokio::test(start_paused = true)]
async fn over_time_a_key_gets_exactly_its_rate_never_more() {
    let client = LockClient::in_memory();
    let third = RatePolicy::new("third", 3, Duration::from_secs(1));
    let api = limiter(&client, "api", &[third]);
    let started = tokio::time::Instant::now();
    let mut admitted = 0u64;
    for _ in 0..20_000 {
        if api.check("k").await.unwrap().is_allowed() {
            admitted += 1;
        }
        let t = started.elapsed().as_secs_f64();
        let bound = 3.0 + 3.0 * t;
        assert!(admitted as f64 <= bound, "{admitted} admitted by {t} s");
        // Requests come 1 ms apart: the burst is in by 3 ms, then each is admitted at
        // most 1 ms late, at most one behind the exact rate.
        if t >= 0.003 {
            assert!(
                admitted as f64 > bound - 1.1,
                "{admitted} admitted by {t} s"
            );
        }
        tokio::time::advance(ms(1)).await;
    }
    assert_eq!(admitted, 3 + 59, "20 s at 3 per second, 3 at once");
}

/// In-process, on the paused clock: the wait of a refusal is exact to the µs (the
/// request is refused 1 µs before it, admitted at it), for costs of several units too.
#[tokio::test(start_paused = true)]
async fn the_wait_is_exact_to_the_microsecond() {
    let client = LockClient::in_memory();
    let policy = RatePolicy::new("p", 7, Duration::from_secs(1)).burst(4);
    let api = limiter(&client, "api", &[policy]);
    for (key, cost) in [("one", 1), ("three", 3)] {
        assert!(api.check_n(key, 4).await.unwrap().is_allowed());
        tokio::time::advance(Duration::from_micros(12_345)).await;
        let look = api.peek_n(key, cost).await.unwrap();
        let wait = look.retry_after().expect("refused");
        // 142,858 µs per unit, less what passed.
        assert_eq!(
            wait,
            Duration::from_micros(u64::from(cost) * 142_858 - 12_345)
        );
        tokio::time::advance(wait - Duration::from_micros(1)).await;
        assert!(!api.peek_n(key, cost).await.unwrap().is_allowed());
        tokio::time::advance(Duration::from_micros(1)).await;
        assert!(api.peek_n(key, cost).await.unwrap().is_allowed());
        assert!(api.check_n(key, cost).await.unwrap().is_allowed());
        assert!(!api.check(key).await.unwrap().is_allowed());
    }
}

/// The decisions counted per limiter, policy and outcome, with a real recorder (this
/// binary's only one; the series are this limiter's alone).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn decisions_are_counted_per_policy() {
    static SNAPSHOTTER: OnceLock<Snapshotter> = OnceLock::new();
    let snapshotter = SNAPSHOTTER.get_or_init(|| {
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        recorder
            .install()
            .expect("the only recorder of this binary");
        snapshotter
    });
    for env in [Env::memory(), Env::redis()] {
        let client = env.client().await;
        let hour = RatePolicy::new("hour", 4, Duration::from_secs(3600));
        let name = if env.is_redis() {
            "counted-redis"
        } else {
            "counted-memory"
        };
        let api = limiter(&client, name, &[per_second("second"), hour]);
        for _ in 0..5 {
            let _ = api.check("k").await.unwrap();
        }
        let _ = api.peek("k").await.unwrap();
        let counts = counters(snapshotter, name);
        let count = |policy: &str, outcome: &str| {
            counts
                .get(&(policy.to_owned(), outcome.to_owned()))
                .copied()
                .unwrap_or(0)
        };
        assert_eq!(count("second", "allowed"), 3, "{counts:?}");
        assert_eq!(count("hour", "allowed"), 3, "{counts:?}");
        assert_eq!(count("second", "refused"), 2, "{counts:?}");
        assert_eq!(count("hour", "refused"), 0, "{counts:?}");
    }
}

/// `lockwarden_rate_decisions_total` of `limiter`, by (policy, outcome).
fn counters(snapshotter: &Snapshotter, limiter: &str) -> HashMap<(String, String), u64> {
    let mut counts = HashMap::new();
    for (key, _, _, value) in snapshotter.snapshot().into_vec() {
        let key = key.key();
        if key.name() != "lockwarden_rate_decisions_total" {
            continue;
        }
        let label = |name: &str| {
            key.labels()
                .find(|l| l.key() == name)
                .map(|l| l.value().to_owned())
                .unwrap_or_default()
        };
        if label("limiter") != limiter {
            continue;
        }
        if let DebugValue::Counter(n) = value {
            *counts
                .entry((label("policy"), label("outcome")))
                .or_default() += n;
        }
    }
    counts
}
