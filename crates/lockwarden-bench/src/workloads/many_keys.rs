//! Workload 4: 64 tasks, each cycling on its own key, over one client. Compared with
//! raw `EVALSHA` throughput at the same concurrency over one connection manager: a cycle
//! is two scripts, so the ideal ratio is 0.5.
//!
//! The implementations take turns in slices (A B … F, then F … A, twice), so a spell of
//! noise on this shared box hits them alike; each row adds up its slices. Every row also
//! says its cycles/s and its Redis CPU per cycle as multiples of rslock's, both taken in
//! the same turns (the goals BENCHMARKS.md states for this workload).

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::task::JoinSet;

use crate::baselines::{evalsha_throughput, BoxError, Kind, Locker};
use crate::check::Exclusion;
use crate::stats::{Report, Row, Summary, Windows};
use crate::workloads::{cpu_time, join_all, release, Ctx};

const NAME: &str = "4 many keys (64 tasks)";
const TASKS: usize = 64;
/// Turns each implementation gets: forward, backward, forward, backward.
const SLICES: u32 = 4;
/// The implementation the others are weighed against.
const PEER: Kind = Kind::RslockDefault;

pub async fn run(ctx: &Ctx, report: &mut Report) -> Result<(), BoxError> {
    let run = ctx.pick(Duration::from_secs(2), Duration::from_secs(10));
    let max_cycles: u64 = ctx.pick(50_000, 250_000);

    let cpu = Cpu::start(ctx)?;
    let (raw, overall) = evalsha_throughput(&ctx.url, TASKS, run, max_cycles).await?;
    let raw = raw.summary();
    let ops = overall * run.as_secs_f64();
    let spent = cpu.spent(ctx)?;
    report.push(
        Row::new(NAME, "raw EVALSHA (return 1)", "EVALSHA/s", "/s")
            .summary(raw)
            .redis_commands(spent.commands as f64 / ops)
            .note(format!("{overall:.0}/s overall; {}", spent.per_op(ops))),
    );

    let mut runs = Vec::new();
    for kind in Kind::UNCONTENDED {
        runs.push(Run::new(ctx, kind).await?);
    }
    let slice = run / SLICES;
    for turn in 0..SLICES {
        for at in 0..runs.len() {
            let at = match turn % 2 {
                0 => at,
                _ => runs.len() - 1 - at,
            };
            runs[at]
                .slice(ctx, slice, max_cycles / u64::from(SLICES))
                .await?;
        }
    }

    let peer = runs
        .iter()
        .find(|r| r.kind == PEER)
        .map(|r| (r.rate(), r.redis_per_cycle()));
    for r in &runs {
        let cycles = r.cycles as f64;
        let mut row = Row::new(NAME, r.kind.name(), "cycles/s", "/s")
            .summary(Summary::rates(r.rates.clone()))
            .ratio_to(raw.median, "÷ raw EVALSHA/s, ideal 0.5")
            .redis_commands(r.spent.commands as f64 / cycles)
            .note(format!(
                "{:.0}/s overall; {}",
                r.rate(),
                r.spent.per_op(cycles)
            ));
        if let Some((rate, redis)) = peer.filter(|_| r.kind != PEER) {
            row = row.note(format!(
                "÷ rslock's, same turns: cycles/s {:.2}, Redis CPU per cycle {:.2}",
                r.rate() / rate,
                r.redis_per_cycle() / redis
            ));
        }
        report.push(row);
    }
    Ok(())
}

/// One implementation's share of the workload, added up over its slices.
struct Run {
    kind: Kind,
    locker: Arc<Locker>,
    /// Each task's key and its witness, kept across slices: fencing order holds over
    /// them all.
    keys: Vec<(String, Arc<Exclusion>)>,
    cycles: u64,
    elapsed: Duration,
    spent: Spent,
    /// Cycles/s in each full window of every slice.
    rates: Vec<f64>,
}

impl Run {
    async fn new(ctx: &Ctx, kind: Kind) -> Result<Self, BoxError> {
        let keys = (0..TASKS)
            .map(|task| {
                let key = format!("{}:w4:{task}", kind.slug());
                let exclusion = Exclusion::new(format!("{} {key}", kind.name()), &ctx.checks);
                (key, Arc::new(exclusion))
            })
            .collect();
        Ok(Self {
            kind,
            locker: ctx.locker(kind).await?,
            keys,
            cycles: 0,
            elapsed: Duration::ZERO,
            spent: Spent::default(),
            rates: Vec::new(),
        })
    }

    /// 64 tasks cycling for `run` (at most `max_cycles` each).
    async fn slice(&mut self, ctx: &Ctx, run: Duration, max_cycles: u64) -> Result<(), BoxError> {
        let cpu = Cpu::start(ctx)?;
        let start = Instant::now();
        let deadline = start + run;
        let windows = Arc::new(Windows::new(start, run));
        let mut set = JoinSet::new();
        for (key, exclusion) in &self.keys {
            let locker = self.locker.clone();
            let windows = windows.clone();
            let checks = ctx.checks.clone();
            let (key, exclusion) = (key.clone(), exclusion.clone());
            let kind = self.kind;
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
        self.elapsed += start.elapsed();
        self.cycles += cycles;
        self.spent.add(cpu.spent(ctx)?);
        self.rates.extend(windows.rates_until(Duration::MAX));
        Ok(())
    }

    fn rate(&self) -> f64 {
        self.cycles as f64 / self.elapsed.as_secs_f64()
    }

    fn redis_per_cycle(&self) -> f64 {
        self.spent.redis.as_secs_f64() / self.cycles as f64
    }
}

/// Client and Redis CPU time and Redis commands at a run's start.
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

    /// What was spent since the start.
    fn spent(self, ctx: &Ctx) -> Result<Spent, BoxError> {
        Ok(Spent {
            client: cpu_time() - self.client,
            redis: ctx.redis_cpu()? - self.redis,
            commands: ctx.command_calls()? - self.commands,
        })
    }
}

/// Client and Redis CPU time and Redis commands spent over a run.
#[derive(Default)]
struct Spent {
    client: Duration,
    redis: Duration,
    commands: u64,
}

impl Spent {
    fn add(&mut self, other: Spent) {
        self.client += other.client;
        self.redis += other.redis;
        self.commands += other.commands;
    }

    /// The CPU note for `ops` operations.
    fn per_op(&self, ops: f64) -> String {
        let per_op = |d: Duration| d.as_secs_f64() * 1e6 / ops;
        format!(
            "CPU per op: client {:.1} µs, redis {:.1} µs",
            per_op(self.client),
            per_op(self.redis)
        )
    }
}
