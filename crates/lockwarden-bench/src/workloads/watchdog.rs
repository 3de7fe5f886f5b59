//! Workload 5: hold many watchdog locks (lease 3 s) for three lease periods and look at
//! what keeping them alive costs: Redis commands and client CPU per renewal period
//! (a third of the lease), client memory per lock, and locks lost (must be 0).

use std::time::{Duration, Instant};

use futures_util::stream::{self, StreamExt, TryStreamExt};
use lockwarden_core::{LockClient, LockError, LockGuard};

use crate::baselines::BoxError;
use crate::stats::{Report, Row, Summary};
use crate::workloads::{cpu_time, rss_bytes, Ctx};

const NAME: &str = "5 watchdog at scale";
const LEASE: Duration = Duration::from_secs(3);
const CONCURRENCY: usize = 256;

pub async fn run(ctx: &Ctx, report: &mut Report) -> Result<(), BoxError> {
    let locks: usize = ctx.pick(10_000, 100_000);
    let period = LEASE / 3;
    let client = LockClient::builder()
        .watchdog_timeout(LEASE)
        .connect(&ctx.url)
        .await?;

    let rss_before = rss_bytes()?;
    let acquiring = Instant::now();
    let guards: Vec<LockGuard> = stream::iter(0..locks)
        .map(|i| {
            let client = client.clone();
            async move { client.acquire(format!("w5:{i}")).await }
        })
        .buffer_unordered(CONCURRENCY)
        .try_collect()
        .await?;
    let acquire_secs = acquiring.elapsed().as_secs_f64();
    let lost_acquiring = guards.iter().filter(|g| g.is_lost()).count();
    let rss_held = rss_bytes()?;
    let watched = client.stats().watched_locks;
    if watched != locks {
        ctx.checks.problem(format!(
            "watchdog watches {watched} locks, {locks} are held"
        ));
    }

    // Sample the counters once per renewal period for three lease periods.
    let (mut commands, mut cpu) = (Vec::new(), Vec::new());
    let mut last = (ctx.script_calls()?, cpu_time());
    let started = Instant::now();
    for n in 1..=9u32 {
        tokio::time::sleep_until((started + period * n).into()).await;
        let now = (ctx.script_calls()?, cpu_time());
        commands.push((now.0 - last.0) as f64);
        cpu.push((now.1 - last.1).as_secs_f64() * 1e3);
        last = now;
    }

    let lost_while_held = guards.iter().filter(|g| g.is_lost()).count();
    let releasing = Instant::now();
    let outcomes: Vec<Result<(), LockError>> = stream::iter(guards)
        .map(LockGuard::release)
        .buffer_unordered(CONCURRENCY)
        .collect()
        .await;
    let release_secs = releasing.elapsed().as_secs_f64();
    let mut lost = 0;
    for outcome in outcomes {
        match outcome {
            Ok(()) => {}
            Err(LockError::Lost { .. } | LockError::NotHeld { .. }) => lost += 1,
            Err(e) => return Err(e.into()),
        }
    }
    let lost = lost.max(lost_while_held);
    if lost > 0 {
        ctx.checks
            .problem(format!("{NAME}: {lost} of {locks} watchdog locks lost"));
    }
    if client.stats().watched_locks != 0 {
        ctx.checks
            .problem(format!("{NAME}: watchdog still watches released locks"));
    }

    let implementation = format!("lockwarden, {locks} locks");
    report.push(
        Row::new(
            NAME,
            &implementation,
            "EVALSHA per renewal period (1 s)",
            "",
        )
        .summary(Summary::of(commands))
        .ratio_to(locks as f64, "÷ locks held, ideal 1.0")
        .note(format!(
            "acquired at {:.0}/s, released at {:.0}/s",
            locks as f64 / acquire_secs,
            locks as f64 / release_secs
        )),
    );
    report.push(
        Row::new(NAME, &implementation, "client CPU per renewal period", "ms")
            .summary(Summary::of(cpu))
            .note("getrusage(RUSAGE_SELF), whole process"),
    );
    let per_lock = rss_held.saturating_sub(rss_before) as f64 / locks as f64;
    report.push(
        Row::new(NAME, &implementation, "client RSS per held lock", "B")
            .value(per_lock)
            .note("RSS delta incl. the bench's LockGuard; freed heap from earlier workloads may be reused"),
    );
    report.push(
        Row::new(NAME, &implementation, "locks lost", "")
            .value(lost as f64)
            .note(format!(
                "must be 0; {lost_acquiring} already lost when the last acquire returned"
            )),
    );
    Ok(())
}
