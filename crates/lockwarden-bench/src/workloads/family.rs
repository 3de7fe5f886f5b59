//! Workload 8: the lock family's handoffs. The plain, fair and write locks on one hot key
//! (8 tasks over 2 clients, hold ~0), as in workload 2; and a write lock released to 16
//! waiting readers, who must all get in at once.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use lockwarden_core::{LockClient, LockError, LockGuard};
use redis::aio::ConnectionManager;
use tokio::task::JoinSet;

use crate::baselines::{connection_manager, BoxError};
use crate::check::{Checks, Exclusion};
use crate::stats::{Handoff, Report, Row, Summary, Windows};
use crate::workloads::{join_all, Ctx};

const NAME: &str = "8 lock family";
const TASKS: usize = 8;
const CLIENTS: usize = 2;
const READERS: usize = 16;
const WAIT: Duration = Duration::from_secs(10);
/// How long the box idles before the release in the readers' second row.
const IDLE: Duration = Duration::from_millis(20);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Family {
    Plain,
    Fair,
    Write,
}

impl Family {
    fn name(self) -> &'static str {
        match self {
            Family::Plain => "lockwarden lock",
            Family::Fair => "lockwarden fair_lock",
            Family::Write => "lockwarden rw_lock (write)",
        }
    }

    async fn acquire(self, client: &LockClient, key: &str) -> Result<LockGuard, LockError> {
        match self {
            Family::Plain => client.lock(key).try_acquire(WAIT).await,
            Family::Fair => client.fair_lock(key).try_acquire(WAIT).await,
            Family::Write => client.rw_lock(key).write().try_acquire(WAIT).await,
        }
    }
}

struct Shared {
    family: Family,
    key: String,
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
    cross: Vec<Duration>,
}

pub async fn run(ctx: &Ctx, report: &mut Report) -> Result<(), BoxError> {
    let run = ctx.pick(Duration::from_secs(2), Duration::from_secs(8));
    let max_cycles = ctx.pick(50_000, 250_000);
    let (ping, _) = ctx.fresh_baseline(report, NAME).await?;
    for family in [Family::Plain, Family::Fair, Family::Write] {
        let mut clients = Vec::new();
        for _ in 0..CLIENTS {
            clients.push(LockClient::connect(&ctx.url).await?);
        }
        let key = format!("w8:{family:?}");
        let before = ctx.command_counts()?;
        let start = Instant::now();
        let shared = Arc::new(Shared {
            family,
            exclusion: Exclusion::new(format!("{} {key}", family.name()), &ctx.checks),
            key,
            handoff: Handoff::default(),
            windows: Windows::new(start, run),
            checks: ctx.checks.clone(),
            deadline: start + run,
            max_cycles,
        });
        let mut set = JoinSet::new();
        for task in 0..TASKS {
            let client = clients[task % CLIENTS].clone();
            set.spawn(worker(task, client, shared.clone()));
        }
        let outs = join_all(set, run + Duration::from_secs(60)).await?;
        let cycles: u64 = outs.iter().map(|o| o.cycles).sum();
        let cross: Vec<Duration> = outs.iter().flat_map(|o| o.cross.iter().copied()).collect();
        let elapsed = start.elapsed().as_secs_f64();
        let per_cycle = per_cycle(&before, &ctx.command_counts()?, cycles);
        report.push(
            Row::new(NAME, family.name(), "hot key: cycles/s", "/s")
                .summary(shared.windows.summary())
                .redis_commands(per_cycle.all)
                .note(format!(
                    "{cycles} cycles, {:.0}/s overall; per cycle: {:.2} scripts, {:.2} \
                     (un)subscribes",
                    cycles as f64 / elapsed,
                    per_cycle.scripts,
                    per_cycle.subscriptions
                )),
        );
        report.push(
            Row::new(
                NAME,
                family.name(),
                "hot key: handoff to another task",
                "µs",
            )
            .summary(Summary::micros(&cross))
            .ratio_to(ping.median, "round trips: ÷ PING median"),
        );
    }
    readers_at_once(ctx, report, ping.median, None).await?;
    readers_at_once(ctx, report, ping.median, Some(IDLE)).await
}

/// What Redis ran per cycle, from two `INFO commandstats` readings.
struct PerCycle {
    /// Every command, script-inner calls included.
    all: f64,
    /// `EVALSHA` calls.
    scripts: f64,
    /// `SUBSCRIBE` and `UNSUBSCRIBE` calls.
    subscriptions: f64,
}

fn per_cycle(
    before: &BTreeMap<String, u64>,
    after: &BTreeMap<String, u64>,
    cycles: u64,
) -> PerCycle {
    let delta = |name: &str| {
        let was = before.get(name).copied().unwrap_or(0);
        after.get(name).copied().unwrap_or(0).saturating_sub(was) as f64 / cycles.max(1) as f64
    };
    PerCycle {
        all: after.keys().map(|name| delta(name)).sum(),
        scripts: delta("evalsha") + delta("fcall"),
        subscriptions: delta("subscribe") + delta("unsubscribe"),
    }
}

async fn worker(task: usize, client: LockClient, s: Arc<Shared>) -> Result<Out, BoxError> {
    let mut out = Out::default();
    while out.cycles < s.max_cycles && Instant::now() < s.deadline {
        let guard = s.family.acquire(&client, &s.key).await?;
        if let Some((handoff, same)) = s.handoff.acquired(task, Instant::now()) {
            if !same {
                out.cross.push(handoff);
            }
        }
        s.exclusion.enter(Some(guard.fencing_token()));
        s.exclusion.exit();
        s.handoff.releasing(task);
        if let Err(e) = guard.release().await {
            s.checks
                .problem(format!("{} release failed: {e}", s.family.name()));
        }
        s.windows.record();
        out.cycles += 1;
    }
    Ok(out)
}

/// A writer holds; 16 readers (over 2 clients) queue; the writer releases as soon as
/// Redis shows all 16 waiting, or `idle` after that. Measured: from the release call to
/// the last reader holding, with every reader still holding, and the scripts Redis ran
/// meanwhile (the release's included). On these machines the first round trip after
/// ~20 ms idle costs ~3 warm ones, so a release after `idle` is weighed against a PING
/// after the same idle, taken in every round.
async fn readers_at_once(
    ctx: &Ctx,
    report: &mut Report,
    ping: f64,
    idle: Option<Duration>,
) -> Result<(), BoxError> {
    let rounds = ctx.pick(20, 100);
    let writer = LockClient::connect(&ctx.url).await?;
    let mut watch = connection_manager(&ctx.url).await?;
    let mut clients = Vec::new();
    for _ in 0..CLIENTS {
        clients.push(LockClient::connect(&ctx.url).await?);
    }
    let mut samples = Vec::with_capacity(rounds);
    let mut idle_pings = Vec::with_capacity(rounds);
    let mut scripts = 0;
    for round in 0..rounds {
        let key = format!("w8:readers:{round}:{}", idle.is_some());
        let held = writer.rw_lock(&key).write().try_acquire(WAIT).await?;
        let all_in = Arc::new(tokio::sync::Barrier::new(READERS + 1));
        let counted = Arc::new(tokio::sync::Barrier::new(READERS + 1));
        let mut set = JoinSet::new();
        for r in 0..READERS {
            let (client, key) = (clients[r % CLIENTS].clone(), key.clone());
            let (all_in, counted) = (all_in.clone(), counted.clone());
            set.spawn(async move {
                let guard = client.rw_lock(&key).read().try_acquire(WAIT).await?;
                let at = Instant::now();
                // Hold until every reader is in: proves they held the lock together.
                all_in.wait().await;
                // And until the scripts are counted.
                counted.wait().await;
                guard.release().await?;
                Ok::<_, BoxError>(at)
            });
        }
        let lock_key = writer.key(&key)?.redis_key().to_owned();
        if !all_queued(&mut watch, &lock_key).await? {
            ctx.checks.problem(format!(
                "readers of {key} were not all queued within {WAIT:?}"
            ));
            set.abort_all();
            continue;
        }
        let before = ctx.script_calls()?;
        if let Some(idle) = idle {
            tokio::time::sleep(idle).await;
        }
        let released = Instant::now();
        held.release().await?;
        let waited = tokio::time::timeout(WAIT, all_in.wait()).await;
        if waited.is_ok() {
            scripts += ctx.script_calls()? - before;
            counted.wait().await;
        } else {
            ctx.checks.problem(format!(
                "readers of {key} did not all hold the read lock together within {WAIT:?}"
            ));
            set.abort_all();
            continue;
        }
        let last = join_all(set, WAIT)
            .await?
            .into_iter()
            .max()
            .unwrap_or(released);
        samples.push(last.saturating_duration_since(released));
        if let Some(idle) = idle {
            tokio::time::sleep(idle).await;
            let sent = Instant::now();
            let _: String = redis::cmd("PING").query_async(&mut watch).await?;
            idle_pings.push(sent.elapsed());
        }
    }
    let (metric, ping, per) = match idle {
        None => (
            "write released → all 16 waiting readers hold".to_owned(),
            ping,
            "round trips: ÷ PING median",
        ),
        Some(idle) => {
            let pings = Summary::micros(&idle_pings);
            let ping = pings.median;
            report.push(
                Row::new(
                    NAME,
                    "raw ConnectionManager",
                    &format!("PING after {} ms idle", idle.as_millis()),
                    "µs",
                )
                .summary(pings),
            );
            (
                format!("the same, released after {} ms idle", idle.as_millis()),
                ping,
                "round trips: ÷ idle PING median",
            )
        }
    };
    report.push(
        Row::new(NAME, "lockwarden rw_lock", &metric, "µs")
            .summary(Summary::micros(&samples))
            .ratio_to(ping, per)
            .note(format!(
                "{rounds} rounds, readers over {CLIENTS} clients; scripts run from the \
                 release to all holding: {:.1} per round",
                scripts as f64 / samples.len().max(1) as f64
            )),
    );
    Ok(())
}

/// Polls until every reader is registered as waiting for the read-write lock at
/// `lock_key` and both clients listen on its readers' channel (`rw.rs` names the keys);
/// `false` if that takes longer than `WAIT`. Each poll is one round trip.
async fn all_queued(watch: &mut ConnectionManager, lock_key: &str) -> Result<bool, BoxError> {
    let registrations = format!("{lock_key}:readers");
    let channel = format!("{lock_key}:readable");
    let until = Instant::now() + WAIT;
    while Instant::now() < until {
        let (waiting, (_, listening)): (usize, (String, usize)) = redis::pipe()
            .cmd("ZCARD")
            .arg(&registrations)
            .cmd("PUBSUB")
            .arg("NUMSUB")
            .arg(&channel)
            .query_async(watch)
            .await?;
        if waiting == READERS && listening == CLIENTS {
            return Ok(true);
        }
    }
    Ok(false)
}
