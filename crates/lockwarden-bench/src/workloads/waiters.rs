//! Workload 6: N tasks of one client wait on one key (`try_acquire(key, 60 s)` once
//! each) while it is held; then it is released and they are served one by one, each
//! releasing at once. Connections and Redis commands per handoff must not grow with N.

use std::sync::Arc;
use std::time::{Duration, Instant};

use lockwarden_core::LockClient;
use tokio::task::JoinSet;

use crate::baselines::{BoxError, Guard, Kind};
use crate::check::{Checks, Exclusion};
use crate::stats::{Handoff, Report, Row, Summary};
use crate::workloads::{join_all, release, Ctx};

const NAME: &str = "6 waiters at scale";
const WAIT: Duration = Duration::from_secs(60);

struct Shared {
    key: String,
    exclusion: Exclusion,
    handoff: Handoff,
    checks: Arc<Checks>,
}

pub async fn run(ctx: &Ctx, report: &mut Report) -> Result<(), BoxError> {
    let sizes: &[usize] = ctx.pick(&[100, 1_000], &[100, 1_000, 10_000]);
    let (ping, _) = ctx.fresh_baseline(report, NAME).await?;
    let mut first = None;
    for &n in sizes {
        let per_handoff = once(ctx, report, n, ping.median).await?;
        let first = *first.get_or_insert(per_handoff);
        report.push(
            Row::new(
                NAME,
                &format!("lockwarden, N={n}"),
                "EVALSHA per handoff",
                "",
            )
            .value(per_handoff)
            .ratio_to(first, &format!("÷ N={} figure", sizes[0]))
            .note("1 acquire is 1.0: a fresh holder's release is HDEL (and PUBLISH when someone waits), no script"),
        );
    }
    Ok(())
}

async fn once(ctx: &Ctx, report: &mut Report, n: usize, ping: f64) -> Result<f64, BoxError> {
    let implementation = format!("lockwarden, N={n}");
    let (_, last_id) = ctx.connections_since(0)?;
    let client = LockClient::connect(&ctx.url).await?;
    // The pub/sub connection is opened by a background task: give it a moment.
    let mut opened = 0;
    for _ in 0..50 {
        opened = ctx.connections_since(last_id)?.0;
        if opened >= 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    let key = format!("w6:{n}");
    let holder = client.acquire(&key).await?;
    let shared = Arc::new(Shared {
        exclusion: Exclusion::new(format!("lockwarden {key}"), &ctx.checks),
        key,
        handoff: Handoff::default(),
        checks: ctx.checks.clone(),
    });
    shared.exclusion.enter(Some(holder.fencing_token()));

    let calls_before_wait = ctx.script_calls()?;
    let mut set = JoinSet::new();
    for task in 0..n {
        set.spawn(waiter(task + 1, client.clone(), shared.clone()));
    }
    // Every waiter tries once, subscribes, and tries once more before it sleeps.
    let settle = Instant::now();
    loop {
        let calls = ctx.script_calls()? - calls_before_wait;
        if calls >= 2 * n as u64 {
            break;
        }
        if settle.elapsed() > Duration::from_secs(30) {
            return Err(format!("waiters made only {calls} attempts before sleeping").into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let connections_waiting = ctx.connections_since(last_id)?.0;
    let channels = client.stats().waited_channels;

    let calls_before = ctx.script_calls()?;
    let started = Instant::now();
    shared.exclusion.exit();
    shared.handoff.releasing(0);
    release(
        Guard::Lockwarden(holder),
        &ctx.checks,
        Kind::Lockwarden,
        NAME,
    )
    .await?;
    let handoffs = join_all(set, WAIT + Duration::from_secs(10)).await?;
    let elapsed = started.elapsed();
    let calls = ctx.script_calls()? - calls_before;

    // Nothing may be left subscribed once nobody waits.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let (left_local, left_server) = (client.stats().waited_channels, ctx.pubsub_channels()?);
    if left_local != 0 || left_server != 0 {
        ctx.checks.problem(format!(
            "{NAME} N={n}: subscriptions left behind ({left_local} local, {left_server} on the server)"
        ));
    }

    report.push(
        Row::new(
            NAME,
            &implementation,
            "handoff (release → next acquire)",
            "µs",
        )
        .summary(Summary::micros(&handoffs))
        .ratio_to(ping, "round trips: ÷ PING median")
        .note(format!(
            "all {n} served in {:.0} ms; {channels} channel subscribed while waiting",
            elapsed.as_secs_f64() * 1e3
        )),
    );
    report.push(
        Row::new(
            NAME,
            &implementation,
            "connections opened by the client",
            "",
        )
        .value(connections_waiting as f64)
        .note(format!(
            "{opened} after connect, {connections_waiting} with {n} waiting"
        )),
    );
    Ok(calls as f64 / n as f64)
}

async fn waiter(task: usize, client: LockClient, s: Arc<Shared>) -> Result<Duration, BoxError> {
    let guard = client.try_acquire(&s.key, WAIT).await?;
    let (handoff, _) = s
        .handoff
        .acquired(task, Instant::now())
        .ok_or("acquired without a release before it")?;
    s.exclusion.enter(Some(guard.fencing_token()));
    s.exclusion.exit();
    s.handoff.releasing(task);
    release(Guard::Lockwarden(guard), &s.checks, Kind::Lockwarden, NAME).await?;
    Ok(handoff)
}
