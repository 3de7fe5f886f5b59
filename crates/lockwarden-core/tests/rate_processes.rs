//! A rate limit is exact across replicas, by the server's clock: 2 processes × 32 tasks ask
//! for one key as fast as they can for 10 s, and the requests admitted (counted by a
//! witness in Redis, with the server's time of the first and the last) are what GCRA
//! allows over that time, within 1 %. Three runs: one policy (100 per second, 20 at
//! once); two (and 500 per 10 s), whose second bucket must show exactly the admitted
//! requests charged (none refused by the first policy); and the two again with the
//! processes' clocks stepped 5 s ahead and 5 s back (the testkit's `FakeClock`).
//!
//! The processes are this test binary itself, re-executed so that it runs only
//! [`rate_child`]; run normally, `rate_child` returns at once.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use lockwarden_core::{LockClient, RatePolicy};
use lockwarden_testkit::{run_child, FakeClock, RedisServer, TestProcess};

/// Set (to a Redis URL) only in re-executed children.
const CHILD_ENV: &str = "LOCKWARDEN_RATE_URL";
const RUN_MS_ENV: &str = "LOCKWARDEN_RATE_RUN_MS";
/// `1` for the first policy alone, `2` for both.
const POLICIES_ENV: &str = "LOCKWARDEN_RATE_POLICIES";
/// The key (and the witness's prefix) of one run.
const KEY_ENV: &str = "LOCKWARDEN_RATE_KEY";
const CHILD_TEST: &str = "rate_child";
const PROCESSES: usize = 2;
const TASKS: usize = 32;
const RUN: Duration = Duration::from_secs(10);
/// Bounds each task's loop by count as well as by time.
const MAX_PER_TASK: u64 = 200_000;

/// 100 per second, 20 at once: 10,000 µs per request.
const FIRST: (u32, Duration, u32) = (100, Duration::from_secs(1), 20);
/// 500 per 10 s (all of them at once): 20,000 µs per request.
const SECOND: (u32, Duration, u32) = (500, Duration::from_secs(10), 500);

fn policies(count: usize) -> Vec<RatePolicy> {
    let policy = |name, (quota, window, burst)| RatePolicy::new(name, quota, window).burst(burst);
    [policy("second", FIRST), policy("ten-seconds", SECOND)]
        .into_iter()
        .take(count)
        .collect()
}

/// Counts an admitted request, and the server's time (µs) of the first and of the last.
/// KEYS: count, first, last.
const WITNESS: &str = r"
redis.call('INCR', KEYS[1])
local t = redis.call('TIME')
local now = string.format('%d', t[1] * 1000000 + t[2])
redis.call('SET', KEYS[2], now, 'NX')
redis.call('SET', KEYS[3], now)
return 1
";

fn unix_ms() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis())
}

/// Not a test on its own: one replica. Without [`CHILD_ENV`] it returns at once. With it,
/// it prints its wall clock, runs [`TASKS`] tasks asking for one key until the run is
/// over, then prints `DONE admitted=.. refused=.. errors=..`.
#[test]
fn rate_child() {
    run_child(CHILD_ENV, |url| async move {
        println!("CLOCK {}", unix_ms());
        let var = |name| std::env::var(name).unwrap();
        let run = Duration::from_millis(var(RUN_MS_ENV).parse().unwrap());
        let count: usize = var(POLICIES_ENV).parse().unwrap();
        let key = var(KEY_ENV);
        let client = LockClient::connect(&url).await.unwrap();
        let limiter = client.rate_limiter("exact", policies(count)).unwrap();
        let redis = redis::Client::open(url.as_str()).unwrap();
        let witness = redis::Script::new(WITNESS);
        let names = ["count", "first", "last"].map(|n| format!("witness:{key}:{n}"));
        let deadline = tokio::time::Instant::now() + run;
        let mut tasks = Vec::new();
        for _ in 0..TASKS {
            let (limiter, key, names) = (limiter.clone(), key.clone(), names.clone());
            let mut conn = redis.get_multiplexed_async_connection().await.unwrap();
            let witness = witness.clone();
            tasks.push(tokio::spawn(async move {
                let (mut admitted, mut refused, mut errors) = (0u64, 0u64, 0u64);
                for _ in 0..MAX_PER_TASK {
                    if tokio::time::Instant::now() >= deadline {
                        break;
                    }
                    match limiter.check(&key).await {
                        Ok(decision) if decision.is_allowed() => {
                            admitted += 1;
                            let _: i64 = witness
                                .key(&names[0])
                                .key(&names[1])
                                .key(&names[2])
                                .invoke_async(&mut conn)
                                .await
                                .unwrap();
                        }
                        Ok(_) => refused += 1,
                        Err(e) => {
                            eprintln!("check failed: {e}");
                            errors += 1;
                        }
                    }
                }
                (admitted, refused, errors)
            }));
        }
        let (mut admitted, mut refused, mut errors) = (0, 0, 0);
        for task in tasks {
            let (a, r, e) = tokio::time::timeout(run + Duration::from_secs(30), task)
                .await
                .expect("a task ends after its deadline")
                .unwrap();
            admitted += a;
            refused += r;
            errors += e;
        }
        println!("DONE admitted={admitted} refused={refused} errors={errors}");
    });
}

/// What one child said.
#[derive(Debug, Default)]
struct Report {
    admitted: u64,
    refused: u64,
    errors: u64,
}

fn parse(line: &str) -> Report {
    let mut report = Report::default();
    for field in line.split_whitespace() {
        let (name, value) = field.split_once('=').expect("name=value");
        let value = value.parse().expect("a number");
        match name {
            "admitted" => report.admitted = value,
            "refused" => report.refused = value,
            "errors" => report.errors = value,
            other => panic!("unknown field {other}"),
        }
    }
    report
}

/// How many requests GCRA admits, under `policies` (interval µs, burst), to a key asked
/// without pause, from its first admission (bucket full) to `span` µs later.
fn exact(policies: &[(u64, u64)], span: u64) -> u64 {
    let mut tats = vec![0u64; policies.len()];
    let (mut now, mut admitted) = (0u64, 0u64);
    loop {
        // The earliest time every bucket admits one more.
        let at = policies
            .iter()
            .zip(&tats)
            .map(|(&(interval, burst), &tat)| (tat + interval).saturating_sub(interval * burst))
            .fold(now, u64::max);
        if at > span {
            return admitted;
        }
        for ((interval, _), tat) in policies.iter().zip(&mut tats) {
            *tat = (*tat).max(at) + interval;
        }
        (now, admitted) = (at, admitted + 1);
    }
}

/// One run: two children (on `clocks`, if given) for [`RUN`], then the checks.
fn run(server: &RedisServer, key: &str, count: usize, clocks: [Option<(&FakeClock, i64)>; 2]) {
    let run_ms = RUN.as_millis().to_string();
    let count_text = count.to_string();
    let env = [
        (CHILD_ENV, server.url()),
        (RUN_MS_ENV, run_ms),
        (POLICIES_ENV, count_text),
        (KEY_ENV, key.to_owned()),
    ];
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let mut children: Vec<(TestProcess, i64)> = clocks
        .iter()
        .map(|clock| match clock {
            None => (TestProcess::spawn(CHILD_TEST, &env).unwrap(), 0),
            Some((clock, offset)) => (
                TestProcess::spawn_on_clock(CHILD_TEST, &env, clock).unwrap(),
                *offset,
            ),
        })
        .collect();
    for (child, offset) in &mut children {
        // The child's wall clock is where the run says: the step was applied.
        let theirs: i128 = child
            .wait_for_line("CLOCK ", Duration::from_secs(60))
            .parse()
            .unwrap();
        let skew = theirs - unix_ms() as i128 - i128::from(*offset) * 1000;
        assert!(
            skew.abs() < 2_000,
            "{key}: the child's clock is {skew} ms off its step"
        );
    }
    let deadline = Instant::now() + RUN + Duration::from_secs(60);
    let mut reports = Vec::new();
    for (child, _) in &mut children {
        let left = deadline.saturating_duration_since(Instant::now());
        reports.push(parse(&child.wait_for_line("DONE ", left)));
        assert!(child.wait_within(Duration::from_secs(30)).success());
    }
    let names = ["count", "first", "last"].map(|n| format!("witness:{key}:{n}"));
    let counted: u64 = server.query(&["GET", &names[0]]).unwrap();
    let first: u64 = server.query(&["GET", &names[1]]).unwrap();
    let last: u64 = server.query(&["GET", &names[2]]).unwrap();
    let admitted: u64 = reports.iter().map(|r| r.admitted).sum();
    let refused: u64 = reports.iter().map(|r| r.refused).sum();
    let errors: u64 = reports.iter().map(|r| r.errors).sum();
    let policies: Vec<(u64, u64)> = [FIRST, SECOND][..count]
        .iter()
        .map(|&(quota, window, burst)| {
            let interval = window.as_micros() as u64 / u64::from(quota);
            (interval, u64::from(burst))
        })
        .collect();
    let span = last - first;
    let expected = exact(&policies, span);
    println!(
        "{key}: {PROCESSES} processes × {TASKS} tasks, clocks {:?} s: admitted {admitted} \
         (witness {counted}; per process {:?}), refused {refused}, errors {errors}, over \
         {:.3} s of the server's clock; GCRA allows {expected}",
        children.iter().map(|(_, o)| *o).collect::<Vec<_>>(),
        reports.iter().map(|r| r.admitted).collect::<Vec<_>>(),
        span as f64 / 1e6,
    );
    assert_eq!(errors, 0);
    assert_eq!(counted, admitted, "the witness saw every admitted request");
    assert!(
        reports.iter().all(|r| r.admitted > 0 && r.refused > 0),
        "every process was admitted and refused: demand exceeded the rate in each"
    );
    assert!(span > 9_000_000, "the run covered {span} µs");
    let off = (admitted as f64 - expected as f64).abs() / expected as f64;
    assert!(
        off <= 0.01,
        "{admitted} admitted, {expected} allowed: {:.2} % off",
        off * 100.0
    );
    if count == 2 {
        // The second bucket was charged for the admitted requests and for nothing else:
        // its TAT is one interval per admitted request after the first admission (it never
        // filled up meanwhile: each request adds 20 ms and they come every 10 ms).
        let value: String = server
            .query(&[
                "GET",
                &format!("lockwarden:rate:{{exact:{key}}}:ten-seconds"),
            ])
            .unwrap();
        let tat: u64 = value[..16].parse().unwrap();
        let charged = (tat - first) as f64 / policies[1].0 as f64;
        println!("{key}: the second policy's TAT says {charged:.1} requests charged");
        assert!(
            (charged - admitted as f64).abs() <= 5.0,
            "{key}: the second policy was charged {charged:.1} requests for {admitted} admitted"
        );
    }
}

#[test]
fn replicas_admit_exactly_the_rate_by_the_servers_clock() {
    let server = RedisServer::start().unwrap();
    run(&server, "one-policy", 1, [None, None]);
    run(&server, "two-policies", 2, [None, None]);
    let ahead = FakeClock::new().unwrap();
    ahead.set_offset(5).unwrap();
    let behind = FakeClock::new().unwrap();
    behind.set_offset(-5).unwrap();
    run(
        &server,
        "stepped-clocks",
        2,
        [Some((&ahead, 5)), Some((&behind, -5))],
    );
}

#[test]
fn the_exact_count_is_the_burst_and_one_per_interval() {
    // One policy: the burst, then one per interval.
    assert_eq!(exact(&[(10_000, 20)], 10_000_000), 20 + 1000);
    assert_eq!(exact(&[(10_000, 20)], 9_999), 20);
    // Both: the first binds until the second's bucket runs dry (after 9.6 s), then the
    // second's one per 20 ms.
    assert_eq!(exact(&[(10_000, 20), (20_000, 500)], 10_000_000), 1000);
}
