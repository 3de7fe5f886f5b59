//! Workload 1: one task, acquire + release on fresh keys. The physical limit is two
//! script round trips (acquire, release), measured here as well. The implementations
//! take turns cycle by cycle, so machine noise hits them all alike.

use std::time::{Duration, Instant};

use crate::baselines::{connection_manager, evalsha_pair, own_scripts_pair, BoxError, Kind};
use crate::stats::{Report, Row, Summary};
use crate::workloads::{release, Ctx};

const NAME: &str = "1 uncontended";

pub async fn run(ctx: &Ctx, report: &mut Report) -> Result<(), BoxError> {
    let cycles = ctx.pick(2_000, 10_000);
    let mut raw = connection_manager(&ctx.url).await?;
    let mut lockers = Vec::new();
    for kind in Kind::UNCONTENDED {
        lockers.push((kind, ctx.locker(kind).await?));
    }
    for _ in 0..50 {
        evalsha_pair(&mut raw).await?;
    }

    let mut raw_samples = Vec::with_capacity(cycles);
    let mut own_samples = Vec::with_capacity(cycles);
    let mut samples = vec![Vec::<Duration>::with_capacity(cycles); lockers.len()];
    for i in 0..cycles {
        let t = Instant::now();
        evalsha_pair(&mut raw).await?;
        raw_samples.push(t.elapsed());
        let t = Instant::now();
        own_scripts_pair(&mut raw, &format!("w1:{i}")).await?;
        own_samples.push(t.elapsed());
        for ((kind, locker), samples) in lockers.iter().zip(&mut samples) {
            let key = format!("{}:w1:{i}", kind.slug());
            let t = Instant::now();
            let (guard, _) = locker.acquire(&key).await?;
            release(guard, &ctx.checks, *kind, NAME).await?;
            samples.push(t.elapsed());
        }
    }

    let raw = Summary::micros(&raw_samples);
    report.push(
        Row::new(
            NAME,
            "raw ConnectionManager",
            "2 × EVALSHA (return 1)",
            "µs",
        )
        .summary(raw),
    );
    report.push(
        Row::new(
            NAME,
            "raw ConnectionManager",
            "lockwarden's acquire.lua + release.lua, called directly",
            "µs",
        )
        .summary(Summary::micros(&own_samples))
        .ratio_to(raw.median, "÷ 2×EVALSHA median")
        .note("the Redis side of a cycle: scripts, no client work"),
    );
    for ((kind, _), samples) in lockers.iter().zip(&samples) {
        let mut row = Row::new(NAME, kind.name(), "acquire + release", "µs")
            .summary(Summary::micros(samples))
            .ratio_to(raw.median, "÷ 2×EVALSHA median");
        if *kind == Kind::Lockwarden {
            row = row.note("target ≤ 1.15");
        }
        report.push(row);
    }
    Ok(())
}
