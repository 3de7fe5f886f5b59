//! Workload 10: the rate limiter (`client.rate_limiter(name, policies)`).
//!
//! * **A decision at one connection**, against one `EVALSHA` of `return 1` on a raw
//!   `ConnectionManager`, taking turns decision by decision: an admitted decision on one
//!   hot key (its bucket read and written), on a fresh key each time (no bucket yet), one
//!   under two policies, and a refused one (read, nothing written). Then the Redis
//!   commands of a decision, script-inner calls included. Beside them, on the raw
//!   connection, two floors on the same hot key and policy: redis-cell's GCRA written in
//!   Lua (`lua/gcra_cell.lua`) and a cheaper decision that reads its clock from the
//!   key's expiry, cut to the ms (`lua/gcra_expiry.lua`).
//! * **The local anchor**: what one request costs in-process, checked by the `governor`
//!   crate (keyed GCRA, what tower_governor runs) and by lockwarden's in-process store.
//! * **Memory**: 1,000,000 keys (100,000 with `--quick`) each touched once, under a policy
//!   that fills a bucket up again in 60 s (20 s), by 256 tasks on a server of their own:
//!   Redis's bytes per bucket (`INFO memory` and `DBSIZE` before and after), the
//!   decisions per second, and how soon after the last touch every bucket is gone by
//!   itself.
//!
//! Checked: every decision that must be admitted is, every one that must be refused is,
//! and the buckets are gone within the policy's window (and a few seconds of Redis's
//! expiry cycle) after the last touch.

use std::num::NonZeroU32;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use lockwarden_core::{LockClient, RateLimiter, RatePolicy};
use lockwarden_testkit::RedisServer;
use redis::Script;
use tokio::task::JoinSet;

use crate::baselines::{connection_manager, BoxError, TRIVIAL};
use crate::stats::{Report, Row, Summary};
use crate::workloads::{join_all, Ctx};

const NAME: &str = "10 rate limiter";
/// Tasks touching the keys of the memory part.
const TASKS: usize = 256;
/// How long after the window the buckets may take to be deleted (Redis's active expiry
/// runs 10 times a second, a share of a core each time).
const EXPIRY_SLACK: Duration = Duration::from_secs(15);

/// A million per second, as many at once: every request is admitted, each adds 1 µs to
/// its key's bucket.
fn generous(name: &str) -> RatePolicy {
    RatePolicy::new(name, 1_000_000, Duration::from_secs(1))
}

pub async fn run(ctx: &Ctx, report: &mut Report) -> Result<(), BoxError> {
    one_connection(ctx, report).await?;
    in_process(ctx, report).await?;
    memory(ctx, report).await
}

/// What is timed in turns, in the order of its rows.
#[derive(Debug, Clone, Copy)]
enum Turn {
    Evalsha,
    Hot,
    Fresh,
    TwoPolicies,
    Refused,
    Cell,
    Expiry,
}

const TURNS: [Turn; 7] = [
    Turn::Evalsha,
    Turn::Hot,
    Turn::Fresh,
    Turn::TwoPolicies,
    Turn::Refused,
    Turn::Cell,
    Turn::Expiry,
];

async fn one_connection(ctx: &Ctx, report: &mut Report) -> Result<(), BoxError> {
    let decisions = ctx.pick(2_000, 10_000);
    let mut raw = connection_manager(&ctx.url).await?;
    let client = LockClient::connect(&ctx.url).await?;
    let one = client.rate_limiter("bench", [generous("second")])?;
    let two = client.rate_limiter(
        "bench2",
        [
            generous("second"),
            RatePolicy::new("day", 100_000_000, Duration::from_secs(86_400)),
        ],
    )?;
    let shut = client.rate_limiter(
        "shut",
        [RatePolicy::new("hour", 1, Duration::from_secs(3600))],
    )?;
    if !shut.check("k").await?.is_allowed() {
        ctx.checks
            .problem(format!("{NAME}: a fresh key was refused"));
    }
    // The floors, under `generous`'s policy: 1 µs a request, a burst of a million.
    let cell = Script::new(include_str!("../../lua/gcra_cell.lua"));
    let expiry = Script::new(include_str!("../../lua/gcra_expiry.lua"));
    let mut samples = vec![Vec::<Duration>::with_capacity(decisions); TURNS.len()];
    for i in 0..decisions + 100 {
        // The order rotates, so no kind always follows another.
        for k in 0..TURNS.len() {
            let at = (i + k) % TURNS.len();
            let t = Instant::now();
            let admitted = match TURNS[at] {
                Turn::Evalsha => {
                    let _: i64 = TRIVIAL.invoke_async(&mut raw).await?;
                    true
                }
                Turn::Hot => one.check("hot").await?.is_allowed(),
                Turn::Fresh => one.check(format!("fresh:{i}")).await?.is_allowed(),
                Turn::TwoPolicies => two.check("hot").await?.is_allowed(),
                Turn::Refused => !shut.check("k").await?.is_allowed(),
                Turn::Cell => {
                    let reply: Vec<i64> = cell
                        .key("floor:cell")
                        .arg(1_000_000)
                        .arg(1_000_000)
                        .arg(1)
                        .arg(1)
                        .invoke_async(&mut raw)
                        .await?;
                    reply.first() == Some(&0)
                }
                Turn::Expiry => {
                    let debt: i64 = expiry
                        .key("floor:expiry")
                        .arg(1)
                        .arg(999_999)
                        .invoke_async(&mut raw)
                        .await?;
                    debt >= 0
                }
            };
            let took = t.elapsed();
            if !admitted {
                ctx.checks
                    .problem(format!("{NAME}: {:?} decided otherwise", TURNS[at]));
            }
            if i >= 100 {
                samples[at].push(took);
            }
        }
    }
    let evalsha = Summary::micros(&samples[0]);
    report
        .push(Row::new(NAME, "raw ConnectionManager", "EVALSHA (return 1)", "µs").summary(evalsha));
    let rows = [
        ("decision, admitted, one hot key", "target ≤ 1.15"),
        ("decision, admitted, a fresh key each", ""),
        ("decision under 2 policies, admitted", ""),
        ("decision, refused", ""),
    ];
    for (samples, (metric, note)) in samples[1..5].iter().zip(rows) {
        let mut row = Row::new(NAME, "lockwarden", metric, "µs")
            .summary(Summary::micros(samples))
            .ratio_to(evalsha.median, "÷ EVALSHA median");
        if !note.is_empty() {
            row = row.note(note);
        }
        report.push(row);
    }
    let floors = [
        (
            "floor: redis-cell's GCRA in Lua",
            "the same hot key and policy",
        ),
        (
            "floor: clock from the key's expiry (ms)",
            "no TIME; admits up to rate × 1 ms more",
        ),
    ];
    for (samples, (metric, note)) in samples[5..].iter().zip(floors) {
        report.push(
            Row::new(NAME, "raw ConnectionManager", metric, "µs")
                .summary(Summary::micros(samples))
                .ratio_to(evalsha.median, "÷ EVALSHA median")
                .note(note),
        );
    }
    // The Redis commands of a decision (the script and the commands it calls).
    let counted = ctx.pick(1_000, 5_000);
    for (limiter, key, what) in [
        (&one, "hot", "admitted, one policy"),
        (&two, "hot", "admitted, two policies"),
        (&shut, "k", "refused"),
    ] {
        let before = ctx.command_calls()?;
        for _ in 0..counted {
            let _ = limiter.check(key).await?;
        }
        let per = (ctx.command_calls()? - before) as f64 / counted as f64;
        report.push(
            Row::new(
                NAME,
                "lockwarden",
                &format!("Redis commands per decision, {what}"),
                "",
            )
            .value(per)
            .redis_commands(per),
        );
    }
    Ok(())
}

/// What one request costs in-process: `governor`'s keyed limiter and lockwarden's
/// in-process store, each over 1,000 keys in turn.
async fn in_process(ctx: &Ctx, report: &mut Report) -> Result<(), BoxError> {
    let requests = ctx.pick(200_000, 1_000_000);
    let keys: Vec<String> = (0..1_000).map(|i| format!("tenant:{i}")).collect();
    let million = NonZeroU32::new(1_000_000).ok_or("a non-zero quota")?;
    let governor = governor::RateLimiter::keyed(governor::Quota::per_second(million));
    for key in &keys {
        let _ = governor.check_key(key);
    }
    let t = Instant::now();
    let mut refused = 0u64;
    for i in 0..requests {
        if governor.check_key(&keys[i % keys.len()]).is_err() {
            refused += 1;
        }
    }
    let governed = t.elapsed().as_secs_f64() * 1e9 / requests as f64;
    let client = LockClient::in_memory();
    let ours = client.rate_limiter("local", [generous("second")])?;
    for key in &keys {
        let _ = ours.check(key).await?;
    }
    let t = Instant::now();
    for i in 0..requests {
        if !ours.check(&keys[i % keys.len()]).await?.is_allowed() {
            refused += 1;
        }
    }
    let local = t.elapsed().as_secs_f64() * 1e9 / requests as f64;
    if refused > 0 {
        ctx.checks
            .problem(format!("{NAME}: {refused} in-process requests refused"));
    }
    report.push(
        Row::new(NAME, "governor (keyed, in-process)", "per request", "ns")
            .value(governed)
            .note("the local anchor: one process's own count"),
    );
    report.push(
        Row::new(NAME, "lockwarden in-process", "per request", "ns")
            .value(local)
            .ratio_to(governed, "÷ governor"),
    );
    Ok(())
}

/// `used_memory` and `DBSIZE` of `server`.
fn memory_of(server: &RedisServer) -> Result<(u64, u64), BoxError> {
    let info: String = server.query(&["INFO", "memory"])?;
    let used = info
        .lines()
        .find_map(|l| l.strip_prefix("used_memory:"))
        .ok_or("no used_memory in INFO memory")?
        .trim()
        .parse()?;
    Ok((used, server.query(&["DBSIZE"])?))
}

async fn memory(ctx: &Ctx, report: &mut Report) -> Result<(), BoxError> {
    let keys = ctx.pick(100_000, 1_000_000);
    let window = ctx.pick(Duration::from_secs(20), Duration::from_secs(60));
    // A server of its own: its key count and memory are the buckets' alone.
    let server = RedisServer::start()?;
    let client = LockClient::connect(&server.url()).await?;
    let once = RatePolicy::new("window", 1, window);
    let limiter = Arc::new(client.rate_limiter("touched", [once])?);
    let _ = limiter.check("warm-up").await?;
    limiter.reset("warm-up").await?;
    let before = tokio::task::block_in_place(|| memory_of(&server))?;
    let next = Arc::new(AtomicU64::new(0));
    let refused = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let mut tasks = JoinSet::new();
    for _ in 0..TASKS {
        let (limiter, next, refused) = (limiter.clone(), next.clone(), refused.clone());
        tasks.spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= keys as u64 {
                    return Ok::<_, BoxError>(());
                }
                touch(&limiter, i, &refused).await?;
            }
        });
    }
    join_all(tasks, window * 10).await?;
    let touched = started.elapsed();
    let after = tokio::task::block_in_place(|| memory_of(&server))?;
    if refused.load(Ordering::Relaxed) > 0 {
        ctx.checks
            .problem(format!("{NAME}: a key touched once was refused"));
    }
    let buckets = after.1.saturating_sub(before.1);
    let per_bucket = after.0.saturating_sub(before.0) as f64 / buckets.max(1) as f64;
    report.push(
        Row::new(
            NAME,
            "lockwarden",
            "decisions/s touching keys once, 256 tasks",
            "/s",
        )
        .value(keys as f64 / touched.as_secs_f64()),
    );
    report.push(
        Row::new(
            NAME,
            "lockwarden",
            "Redis bytes per bucket (INFO memory)",
            "B",
        )
        .value(per_bucket)
        .note(format!(
            "{buckets} buckets of {keys} keys alive after {:.1} s of touching",
            touched.as_secs_f64()
        )),
    );
    // Every bucket is gone by itself once full again: a window after its touch.
    let deadline = window + EXPIRY_SLACK;
    let gone = loop {
        let (_, left) = tokio::task::block_in_place(|| memory_of(&server))?;
        let since = started.elapsed().saturating_sub(touched);
        if left <= before.1 {
            break Some(since);
        }
        if since > deadline {
            break None;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    match gone {
        Some(after_last) => report.push(
            Row::new(
                NAME,
                "lockwarden",
                "every bucket gone, after the last touch",
                "s",
            )
            .value(after_last.as_secs_f64())
            .note(format!("policy window {} s", window.as_secs())),
        ),
        None => ctx.checks.problem(format!(
            "{NAME}: buckets still stored {deadline:?} after the last touch"
        )),
    }
    Ok(())
}

/// Key `i`'s one decision.
async fn touch(limiter: &RateLimiter, i: u64, refused: &AtomicU64) -> Result<(), BoxError> {
    if !limiter.check(format!("key:{i}")).await?.is_allowed() {
        refused.fetch_add(1, Ordering::Relaxed);
    }
    Ok(())
}
