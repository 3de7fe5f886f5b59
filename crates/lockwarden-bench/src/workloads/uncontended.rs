//! Workload 1: one task, acquire + release on fresh keys (and, for lockwarden and its raw
//! commands, on 64 keys taken before in turn: a fresh key's first fencing token reads
//! the server's clock). The physical limit is two script round trips (acquire,
//! release), measured here as well. The implementations take turns cycle by cycle, so
//! machine noise hits them all alike, in a new shuffled order each cycle: none always
//! runs right after another, whose code and data it would find in the CPU's caches or
//! not.

use std::time::{Duration, Instant};

use lockwarden_core::{LockClient, ReleaseNotices};
use lockwarden_testkit::{RedisCluster, RedisServer};

use crate::baselines::{
    connection_manager, evalsha_pair, own_scripts_pair, BoxError, Kind, RawRelease, TRIVIAL,
};
use crate::stats::{Report, Row, Summary};
use crate::workloads::{release, Ctx};

const NAME: &str = "1 uncontended";

pub async fn run(ctx: &Ctx, report: &mut Report) -> Result<(), BoxError> {
    let cycles = ctx.pick(2_000, 10_000);
    let mut raw = connection_manager(&ctx.url).await?;
    // Each on a fresh key a cycle, whose first fencing token reads the server's clock;
    // lockwarden and its raw commands also on keys taken before (64 of them in turn),
    // whose token is one `INCR`: what that first token costs.
    let mut lockers = Vec::new();
    for kind in Kind::UNCONTENDED {
        lockers.push((kind, false, ctx.locker(kind).await?));
    }
    for kind in [Kind::Lockwarden, Kind::OwnRaw] {
        lockers.push((kind, true, ctx.locker(kind).await?));
    }
    for _ in 0..50 {
        evalsha_pair(&mut raw).await?;
    }

    let mut raw_samples = Vec::with_capacity(cycles);
    let mut samples = vec![Vec::<Duration>::with_capacity(cycles); lockers.len()];
    // A new shuffled order each cycle (seeded: every run alike). Rotating where the turns
    // start left each one right after the same other one in all but one turn of every
    // cycle (the hand-rolled `SET NX` after rslock, whose commands it sends).
    let mut rng = fastrand::Rng::with_seed(1);
    let mut turns: Vec<usize> = (0..lockers.len()).collect();
    for i in 0..cycles {
        let t = Instant::now();
        evalsha_pair(&mut raw).await?;
        raw_samples.push(t.elapsed());
        rng.shuffle(&mut turns);
        for &at in &turns {
            let (kind, taken_before, locker) = &lockers[at];
            let key = if *taken_before {
                format!("{}:w1:again:{}", kind.slug(), i % 64)
            } else {
                format!("{}:w1:{i}", kind.slug())
            };
            let t = Instant::now();
            let (guard, _) = locker.acquire(&key).await?;
            release(guard, &ctx.checks, *kind, NAME).await?;
            samples[at].push(t.elapsed());
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
    let summaries: Vec<_> = samples.iter().map(|s| Summary::micros(s)).collect();
    let peer = lockers
        .iter()
        .position(|(kind, _, _)| *kind == Kind::RslockDefault)
        .map(|at| summaries[at].median);
    for ((kind, taken_before, _), summary) in lockers.iter().zip(summaries) {
        let median = summary.median;
        let what = if *taken_before {
            "acquire + release, keys taken before"
        } else {
            "acquire + release"
        };
        let mut row = Row::new(NAME, kind.name(), what, "µs")
            .summary(summary)
            .ratio_to(raw.median, "÷ 2×EVALSHA median");
        if *kind == Kind::Lockwarden && !taken_before {
            row = row.note("target ≤ 1.15");
        }
        if let Some(peer) = peer.filter(|_| *kind != Kind::RslockDefault) {
            row = row.note(format!("÷ rslock's median {:.3}", median / peer));
        }
        report.push(row);
    }
    replicated(ctx, report).await?;
    clustered(ctx, report).await
}

/// The same cycle on a 3-master cluster, against two trivial scripts routed by the same
/// keys over a raw cluster connection: what following slots costs.
async fn clustered(ctx: &Ctx, report: &mut Report) -> Result<(), BoxError> {
    let cycles = ctx.pick(1_000, 5_000);
    let cluster = RedisCluster::start(3)?;
    let mut raw = redis::cluster::ClusterClient::new(cluster.urls())?
        .get_async_connection()
        .await?;
    let client = LockClient::builder()
        .notices(ReleaseNotices::Classic)
        .connect_cluster(cluster.urls())
        .await?;
    // The default on these Redis 7 masters: sharded notices.
    let sharded = LockClient::builder()
        .connect_cluster(cluster.urls())
        .await?;
    let mut raw_samples = Vec::with_capacity(cycles);
    let mut own_samples = Vec::with_capacity(cycles);
    let mut samples = Vec::with_capacity(cycles);
    let mut sharded_samples = Vec::with_capacity(cycles);
    for i in 0..cycles + 50 {
        // Routed like the lock's scripts: by the lock's key, so by its slot.
        let key = client.key(&format!("w1c:{i}"))?.redis_key().to_owned();
        let t = Instant::now();
        let _: i64 = TRIVIAL.key(&key).invoke_async(&mut raw).await?;
        let _: i64 = TRIVIAL.key(&key).invoke_async(&mut raw).await?;
        let raw_took = t.elapsed();
        let t = Instant::now();
        own_scripts_pair(&mut raw, &format!("w1c:{i}"), true, RawRelease::Commands).await?;
        let own_took = t.elapsed();
        let t = Instant::now();
        let guard = client.acquire(format!("w1c:{i}")).await?;
        guard.release().await?;
        let took = t.elapsed();
        let t = Instant::now();
        let guard = sharded.acquire(format!("w1c:{i}")).await?;
        guard.release().await?;
        if i >= 50 {
            raw_samples.push(raw_took);
            own_samples.push(own_took);
            samples.push(took);
            sharded_samples.push(t.elapsed());
        }
    }
    // What one release's notice costs the masters that do not own the lock, each way.
    let relayed = |client: LockClient, tag: &'static str| {
        let cluster = &cluster;
        async move {
            // The bus relays a notice after the script has answered: let the notices
            // already sent land before counting, and this phase's before reading again.
            tokio::time::sleep(RELAY_SETTLE).await;
            let before = relayed_notices(cluster);
            for i in 0..RELAYED_CYCLES {
                client
                    .acquire(format!("{tag}:{i}"))
                    .await?
                    .release()
                    .await?;
            }
            tokio::time::sleep(RELAY_SETTLE).await;
            let after = relayed_notices(cluster);
            Ok::<_, BoxError>((after - before) as f64 / RELAYED_CYCLES as f64)
        }
    };
    let classic_relayed = relayed(client.clone(), "w1c-classic").await?;
    let sharded_relayed = relayed(sharded.clone(), "w1c-sharded").await?;
    let raw = Summary::micros(&raw_samples);
    report.push(
        Row::new(
            NAME,
            "raw cluster connection",
            "2 × EVALSHA (return 1), 3-master cluster",
            "µs",
        )
        .summary(raw),
    );
    report.push(
        Row::new(
            NAME,
            "raw cluster connection",
            "lockwarden's acquire.lua + HDEL of holder and mark, called directly, 3-master cluster",
            "µs",
        )
        .summary(Summary::micros(&own_samples))
        .ratio_to(raw.median, "÷ 2×EVALSHA median (cluster)")
        .note("as the default cluster client sends them: call ids, SPUBLISH when marked"),
    );
    for (implementation, samples, relayed) in [
        (
            "lockwarden, connect_cluster + classic notices",
            &samples,
            classic_relayed,
        ),
        (
            "lockwarden, connect_cluster (sharded notices)",
            &sharded_samples,
            sharded_relayed,
        ),
    ] {
        report.push(
            Row::new(
                NAME,
                implementation,
                "acquire + release, 3-master cluster",
                "µs",
            )
            .summary(Summary::micros(samples))
            .ratio_to(raw.median, "÷ 2×EVALSHA median (cluster)")
            .note(format!(
                "{relayed:.2} notices relayed to other masters per release"
            )),
        );
    }
    Ok(())
}

/// Cycles of each kind of notices whose relayed notices are counted.
const RELAYED_CYCLES: usize = 200;
/// How long the cluster bus is given to deliver the notices already sent.
const RELAY_SETTLE: Duration = Duration::from_millis(300);

/// The messages every master of `cluster` received from another over the cluster bus.
fn relayed_notices(cluster: &RedisCluster) -> u64 {
    cluster
        .nodes()
        .iter()
        .map(|node| node.publishes_received())
        .sum()
}

/// The cost of `wait_for_replicas(1)`: the same cycle on a primary with one replica,
/// with and without waiting for the replica's acknowledgement, cycle by cycle.
async fn replicated(ctx: &Ctx, report: &mut Report) -> Result<(), BoxError> {
    let cycles = ctx.pick(1_000, 5_000);
    let primary = RedisServer::start()?;
    let port = primary.port().to_string();
    let replica = RedisServer::start_with(&["--replicaof", "127.0.0.1", &port])?;
    let synced = Instant::now();
    while !replica
        .query::<String>(&["INFO", "replication"])?
        .contains("master_link_status:up")
    {
        if synced.elapsed() > Duration::from_secs(10) {
            return Err("the benchmark's replica never synced".into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let plain = LockClient::connect(&primary.url()).await?;
    let waiting = LockClient::builder()
        .wait_for_replicas(1, Duration::from_secs(1))
        .connect(&primary.url())
        .await?;
    let (mut plain_samples, mut waiting_samples) =
        (Vec::with_capacity(cycles), Vec::with_capacity(cycles));
    for i in 0..cycles {
        for (client, samples) in [
            (&plain, &mut plain_samples),
            (&waiting, &mut waiting_samples),
        ] {
            let t = Instant::now();
            let guard = client.acquire(format!("w1r:{i}")).await?;
            guard.release().await?;
            samples.push(t.elapsed());
        }
    }
    let plain = Summary::micros(&plain_samples);
    report.push(
        Row::new(
            NAME,
            "lockwarden",
            "acquire + release, primary with 1 replica",
            "µs",
        )
        .summary(plain),
    );
    report.push(
        Row::new(
            NAME,
            "lockwarden, wait_for_replicas(1)",
            "acquire (+ WAIT 1) + release, same primary",
            "µs",
        )
        .summary(Summary::micros(&waiting_samples))
        .ratio_to(plain.median, "÷ without WAIT")
        .note("the price of narrowing the failover window"),
    );
    Ok(())
}
