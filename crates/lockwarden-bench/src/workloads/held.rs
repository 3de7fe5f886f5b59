//! Workload 3: a lock held for 100 ms at a time while 16 others wait for it.
//!
//! 17 tasks take turns: the holder keeps the lock 100 ms, notes when it starts releasing
//! and releases; the waiter that gets it next records the delay. A task that released
//! queues up again only after somebody else has taken the lock, so the delay is always
//! release → a *waiting* task's acquire, never the releaser re-taking its own lock.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::baselines::{connection_manager, BoxError, Kind, Locker};
use crate::check::{Checks, Exclusion};
use crate::stats::{Handoff, Report, Row, Summary};
use crate::workloads::{join_all, release, Ctx};

const NAME: &str = "3 held 100 ms, 16 waiting";
const HOLD: Duration = Duration::from_millis(100);
const TASKS: usize = 17;
const CLIENTS: usize = 2;
/// Acquisition count meaning "stop".
const STOP: u64 = u64::MAX;

struct Shared {
    key: String,
    kind: Kind,
    exclusion: Exclusion,
    handoff: Handoff,
    /// How many acquisitions there have been (or `STOP`).
    acquisitions: watch::Sender<u64>,
    handoffs: u64,
    checks: Arc<Checks>,
    limit: Duration,
}

pub async fn run(ctx: &Ctx, report: &mut Report) -> Result<(), BoxError> {
    let handoffs = ctx.pick(5, 20);
    // Baseline: a round trip from an idle process to an idle server, as after a hold.
    let mut conn = connection_manager(&ctx.url).await?;
    let mut idle = Vec::new();
    for _ in 0..handoffs {
        tokio::time::sleep(HOLD).await;
        let t = Instant::now();
        let _: String = redis::cmd("PING").query_async(&mut conn).await?;
        idle.push(t.elapsed());
    }
    let idle = Summary::micros(&idle);
    report.push(
        Row::new(
            NAME,
            "raw ConnectionManager",
            "PING after 100 ms idle",
            "µs",
        )
        .summary(idle),
    );
    for kind in Kind::ALL {
        let mut lockers = Vec::new();
        for _ in 0..CLIENTS {
            lockers.push(ctx.locker(kind).await?);
        }
        let key = format!("{}:w3:held", kind.slug());
        let limit = (HOLD + Duration::from_secs(1)) * (handoffs as u32 + TASKS as u32);
        let shared = Arc::new(Shared {
            exclusion: Exclusion::new(format!("{} {key}", kind.name()), &ctx.checks),
            key,
            kind,
            handoff: Handoff::default(),
            acquisitions: watch::Sender::new(0),
            handoffs,
            checks: ctx.checks.clone(),
            limit,
        });
        let mut set = JoinSet::new();
        for task in 0..TASKS {
            let locker = lockers[task % CLIENTS].clone();
            set.spawn(worker(task, locker, shared.clone()));
        }
        let delays: Vec<Duration> = join_all(set, limit).await?.concat();
        report.push(
            Row::new(NAME, kind.name(), "release → next acquire", "µs")
                .summary(Summary::micros(&delays))
                .ratio_to(idle.median, "÷ idle PING median"),
        );
    }
    Ok(())
}

async fn worker(
    task: usize,
    locker: Arc<Locker>,
    s: Arc<Shared>,
) -> Result<Vec<Duration>, BoxError> {
    let mut delays = Vec::new();
    let mut seen = s.acquisitions.subscribe();
    loop {
        let (guard, token) = locker.acquire(&s.key).await?;
        let now = Instant::now();
        let mut mine = STOP;
        s.acquisitions.send_if_modified(|n| {
            if *n != STOP {
                *n += 1;
                mine = *n;
            }
            mine != STOP
        });
        if mine == STOP {
            release(guard, &s.checks, s.kind, NAME).await?;
            return Ok(delays);
        }
        if let Some((delay, _)) = s.handoff.acquired(task, now) {
            delays.push(delay);
        }
        s.exclusion.enter(token);
        if mine > s.handoffs {
            // The last sample is in: stop everyone.
            s.acquisitions.send_replace(STOP);
        } else {
            tokio::time::sleep(HOLD).await;
        }
        s.exclusion.exit();
        s.handoff.releasing(task);
        release(guard, &s.checks, s.kind, NAME).await?;
        // Queue up again only once another task holds the lock.
        let next = seen.wait_for(|&n| n > mine);
        match tokio::time::timeout(s.limit, next).await {
            Ok(Ok(n)) if *n != STOP => {}
            Ok(_) => return Ok(delays),
            Err(_) => return Err("nobody took the lock over".into()),
        }
    }
}
