//! Workload 2: 8 tasks over 2 clients hammer one key, holding it for ~0.
//!
//! Handoff = the next holder's acquire returning − the previous holder starting its
//! release (taken just before `release()` is called). It is reported over all handoffs
//! and over those that went to another task (the releasing task often takes the lock
//! straight back).

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::task::JoinSet;

use crate::baselines::{BoxError, Kind, Locker};
use crate::check::{Checks, Exclusion};
use crate::stats::{Handoff, Report, Row, Summary, Windows};
use crate::workloads::{join_all, release, Ctx};

const NAME: &str = "2 hot key";
const TASKS: usize = 8;
const CLIENTS: usize = 2;

struct Shared {
    key: String,
    kind: Kind,
    exclusion: Exclusion,
    handoff: Handoff,
    windows: Windows,
    checks: Arc<Checks>,
    deadline: Instant,
    max_cycles: u64,
}

#[derive(Default)]
struct Out {
    cycles: u64,
    all: Vec<Duration>,
    cross: Vec<Duration>,
}

pub async fn run(ctx: &Ctx, report: &mut Report) -> Result<(), BoxError> {
    let run = ctx.pick(Duration::from_secs(2), Duration::from_secs(10));
    let max_cycles = ctx.pick(100_000, 500_000);
    let (ping, evalsha) = ctx.fresh_baseline(report, NAME).await?;
    for kind in Kind::ALL {
        let mut lockers = Vec::new();
        for _ in 0..CLIENTS {
            lockers.push(ctx.locker(kind).await?);
        }
        let key = format!("{}:w2:hot", kind.slug());
        let start = Instant::now();
        let shared = Arc::new(Shared {
            exclusion: Exclusion::new(format!("{} {key}", kind.name()), &ctx.checks),
            key,
            kind,
            handoff: Handoff::default(),
            windows: Windows::new(start, run),
            checks: ctx.checks.clone(),
            deadline: start + run,
            max_cycles,
        });
        let mut set = JoinSet::new();
        for task in 0..TASKS {
            let locker = lockers[task % CLIENTS].clone();
            set.spawn(worker(task, locker, shared.clone()));
        }
        let outs = join_all(set, run + Duration::from_secs(60)).await?;
        let elapsed = start.elapsed().as_secs_f64();

        let cycles: u64 = outs.iter().map(|o| o.cycles).sum();
        let all: Vec<Duration> = outs.iter().flat_map(|o| o.all.iter().copied()).collect();
        let cross: Vec<Duration> = outs.iter().flat_map(|o| o.cross.iter().copied()).collect();
        let back = 100.0 * (all.len() - cross.len()) as f64 / all.len().max(1) as f64;
        let busiest = outs.iter().map(|o| o.cycles).max().unwrap_or(0);
        let busiest = 100.0 * busiest as f64 / cycles.max(1) as f64;

        report.push(
            Row::new(NAME, kind.name(), "cycles/s", "/s")
                .summary(shared.windows.summary())
                .ratio_to(1e6 / (2.0 * evalsha.median), "÷ 1/(2×EVALSHA median)")
                .note(format!(
                    "{cycles} cycles, {:.0}/s overall; busiest of {TASKS} tasks did {busiest:.0}%",
                    cycles as f64 / elapsed
                )),
        );
        report.push(
            Row::new(NAME, kind.name(), "handoff, all", "µs")
                .summary(Summary::micros(&all))
                .ratio_to(ping.median, "round trips: ÷ PING median")
                .note(format!("{back:.0}% went back to the releasing task")),
        );
        report.push(
            Row::new(NAME, kind.name(), "handoff to another task", "µs")
                .summary(Summary::micros(&cross))
                .ratio_to(ping.median, "round trips: ÷ PING median"),
        );
    }
    Ok(())
}

async fn worker(task: usize, locker: Arc<Locker>, s: Arc<Shared>) -> Result<Out, BoxError> {
    let mut out = Out::default();
    while out.cycles < s.max_cycles && Instant::now() < s.deadline {
        let (guard, token) = locker.acquire(&s.key).await?;
        if let Some((handoff, same)) = s.handoff.acquired(task, Instant::now()) {
            out.all.push(handoff);
            if !same {
                out.cross.push(handoff);
            }
        }
        s.exclusion.enter(token);
        s.exclusion.exit();
        s.handoff.releasing(task);
        release(guard, &s.checks, s.kind, NAME).await?;
        s.windows.record();
        out.cycles += 1;
    }
    Ok(out)
}
