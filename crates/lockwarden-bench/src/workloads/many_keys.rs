//! Workload 4: 64 tasks, each cycling on its own key, over one client. Compared with
//! raw `EVALSHA` throughput at the same concurrency over one connection manager: a cycle
//! is two scripts, so the ideal ratio is 0.5.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::task::JoinSet;

use crate::baselines::{evalsha_throughput, BoxError, Kind};
use crate::check::Exclusion;
use crate::stats::{Report, Row, Windows};
use crate::workloads::{cpu_time, join_all, release, Ctx};

const NAME: &str = "4 many keys (64 tasks)";
const TASKS: usize = 64;

pub async fn run(ctx: &Ctx, report: &mut Report) -> Result<(), BoxError> {
    let run = ctx.pick(Duration::from_secs(2), Duration::from_secs(10));
    let max_cycles: u64 = ctx.pick(50_000, 250_000);

    let cpu = Cpu::start(ctx)?;
    let (raw, overall) = evalsha_throughput(&ctx.url, TASKS, run, max_cycles).await?;
    let raw = raw.summary();
    let ops = overall * run.as_secs_f64();
    let (cpu, commands) = cpu.per_op(ctx, ops)?;
    report.push(
        Row::new(NAME, "raw EVALSHA (return 1)", "EVALSHA/s", "/s")
            .summary(raw)
            .redis_commands(commands)
            .note(format!("{overall:.0}/s overall; {cpu}")),
    );

    for kind in Kind::UNCONTENDED {
        let locker = ctx.locker(kind).await?;
        let cpu = Cpu::start(ctx)?;
        let start = Instant::now();
        let deadline = start + run;
        let windows = Arc::new(Windows::new(start, run));
        let mut set = JoinSet::new();
        for task in 0..TASKS {
            let locker = locker.clone();
            let windows = windows.clone();
            let checks = ctx.checks.clone();
            let key = format!("{}:w4:{task}", kind.slug());
            let exclusion = Exclusion::new(format!("{} {key}", kind.name()), &checks);
            set.spawn(async move {
                let mut cycles = 0u64;
                while cycles < max_cycles && Instant::now() < deadline {
                    let (guard, token) = locker.acquire(&key).await?;
                    exclusion.enter(token);
                    exclusion.exit();
                    release(guard, &checks, kind, NAME).await?;
                    windows.record();
                    cycles += 1;
                }
                Ok::<_, BoxError>(cycles)
            });
        }
        let cycles: u64 = join_all(set, run + Duration::from_secs(60))
            .await?
            .into_iter()
            .sum();
        let elapsed = start.elapsed().as_secs_f64();
        let (cpu, commands) = cpu.per_op(ctx, cycles as f64)?;
        report.push(
            Row::new(NAME, kind.name(), "cycles/s", "/s")
                .summary(windows.summary())
                .ratio_to(raw.median, "÷ raw EVALSHA/s, ideal 0.5")
                .redis_commands(commands)
                .note(format!("{:.0}/s overall; {cpu}", cycles as f64 / elapsed)),
        );
    }
    Ok(())
}

/// Client and Redis CPU time and Redis commands over a run, per operation.
struct Cpu {
    client: Duration,
    redis: Duration,
    commands: u64,
}

impl Cpu {
    fn start(ctx: &Ctx) -> Result<Self, BoxError> {
        Ok(Self {
            client: cpu_time(),
            redis: ctx.redis_cpu()?,
            commands: ctx.command_calls()?,
        })
    }

    /// The CPU note and the Redis commands per operation.
    fn per_op(self, ctx: &Ctx, ops: f64) -> Result<(String, f64), BoxError> {
        let client = (cpu_time() - self.client).as_secs_f64() * 1e6 / ops;
        let redis = (ctx.redis_cpu()? - self.redis).as_secs_f64() * 1e6 / ops;
        let commands = (ctx.command_calls()? - self.commands) as f64 / ops;
        let note = format!("CPU per op: client {client:.1} µs, redis {redis:.1} µs");
        Ok((note, commands))
    }
}
