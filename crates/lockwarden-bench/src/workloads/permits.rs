//! Workload 9: semaphore permits (`client.semaphore(name, capacity)`), weighed against the
//! plain lock in the same run.
//!
//! * **Uncontended**: one task, on fresh keys, a permit cycle (a semaphore of 10, one
//!   permit taken and given back) and a plain lock cycle, taking turns cycle by cycle (in
//!   a new shuffled order each cycle) with two trivial scripts and each kind's scripts sent
//!   raw (the Redis side of a cycle, with no client work). Then the Redis commands of a cycle of
//!   each, script-inner calls included, counted over cycles of their own.
//! * **Handoff**: a semaphore of 1 permit held by one client while a task of another
//!   waits for it; the holder releases once Redis shows the waiter in line, listening, its
//!   two attempts made. Figure: the release call → the waiter holding, in PING round
//!   trips (PINGs taken in every round). The plain lock the same way, rounds interleaved.
//! * **Waiters at scale**: 1,000 tasks over 2 clients wait on a semaphore of 10 permits
//!   that 10 others hold; once all are in line the 10 release, and every waiter, granted a
//!   permit, holds it ~1 ms and releases. Counted: scripts per handoff (the release, or the
//!   grant after a release sent as plain commands, grants the next waiter, who takes the
//!   permit from the notice without a round trip),
//!   holders named per grant notice (a release wakes only as many waiters as it freed),
//!   and acquire attempts beyond each waiter's first.
//! * **Contended**: 16 tasks of one client take turns at a semaphore of 3 permits, each
//!   holding its permit ~1 ms; the Redis commands (script-inner calls included) a cycle
//!   costs: the difference between a run and one twice as long, over the cycles between
//!   them (the first wave of waiters, which tries once more after subscribing, cancels).
//!
//! Checked: never more holders inside a semaphore than its permits, no fencing token
//! handed out twice, and afterwards nothing held, waiting or subscribed.

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use lockwarden_core::{LockClient, Semaphore};
use redis::aio::ConnectionManager;
use tokio::task::JoinSet;

use crate::baselines::{
    connection_manager, evalsha_pair, own_permits_pair, own_scripts_pair, BoxError, RawRelease,
};
use crate::check::Occupancy;
use crate::stats::{Report, Row, Summary};
use crate::workloads::{join_all, Ctx};

const NAME: &str = "9 semaphore permits";
/// The uncontended semaphore's capacity (one permit taken per cycle).
const CAPACITY: u32 = 10;
/// Waiters of the at-scale part, and the clients they are spread over.
const WAITERS: usize = 1_000;
const CLIENTS: usize = 2;
/// How long a granted waiter holds its permit.
const HOLD: Duration = Duration::from_millis(1);
/// The wait budget of every waiter.
const WAIT: Duration = Duration::from_secs(60);

pub async fn run(ctx: &Ctx, report: &mut Report) -> Result<(), BoxError> {
    uncontended(ctx, report).await?;
    handoff(ctx, report).await?;
    waiters(ctx, report).await?;
    contended(ctx, report).await?;
    left_behind(ctx).await
}

/// The five things timed in turns in the uncontended part, in the order of their rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cycle {
    Floor,
    RawPlain,
    RawPermits,
    Plain,
    Permit,
}

impl Cycle {
    const ALL: [Cycle; 5] = [
        Cycle::Floor,
        Cycle::RawPlain,
        Cycle::RawPermits,
        Cycle::Plain,
        Cycle::Permit,
    ];

    async fn run(
        self,
        client: &LockClient,
        raw: &mut ConnectionManager,
        tag: &str,
    ) -> Result<(), BoxError> {
        match self {
            Cycle::Floor => evalsha_pair(raw).await,
            Cycle::RawPlain => {
                own_scripts_pair(raw, &format!("w9:p:{tag}"), false, RawRelease::Commands).await
            }
            Cycle::RawPermits => own_permits_pair(raw, &format!("w9:s:{tag}"), CAPACITY).await,
            Cycle::Plain => Ok(client
                .acquire(format!("w9:p:{tag}"))
                .await?
                .release()
                .await?),
            Cycle::Permit => Ok(client
                .semaphore(format!("w9:s:{tag}"), CAPACITY)
                .acquire()
                .await?
                .release()
                .await?),
        }
    }
}

/// What Redis ran over some cycles: `calls` per command (script-inner ones included) and
/// the scripts' time on Redis's own clock.
struct Counted {
    calls: BTreeMap<String, u64>,
    cycles: f64,
    script_us: f64,
}

impl Counted {
    /// Commands per cycle.
    fn all(&self) -> f64 {
        self.calls.values().sum::<u64>() as f64 / self.cycles
    }

    fn of(&self, command: &str) -> f64 {
        self.calls.get(command).copied().unwrap_or(0) as f64 / self.cycles
    }

    fn breakdown(&self) -> String {
        breakdown(&self.calls, self.cycles)
    }
}

/// `calls` per command and the `usec` of the scripts (`EVALSHA` and `FCALL`, which include
/// their inner calls), from `INFO commandstats`.
fn command_stats(ctx: &Ctx) -> Result<(BTreeMap<String, u64>, u64), BoxError> {
    let info: String = ctx.admin(&["INFO", "commandstats"])?;
    let mut usec = 0;
    for script in ["cmdstat_evalsha:", "cmdstat_fcall:"] {
        let stats = info.lines().find_map(|l| l.strip_prefix(script));
        let took = stats.and_then(|s| s.split(',').find_map(|kv| kv.strip_prefix("usec=")));
        usec += took.map_or(Ok(0), str::parse::<u64>)?;
    }
    Ok((ctx.command_counts()?, usec))
}

/// The calls per command in `after` that were not in `before`, commands run since only.
fn since(before: &BTreeMap<String, u64>, after: BTreeMap<String, u64>) -> BTreeMap<String, u64> {
    let run = after.into_iter().map(|(command, calls)| {
        let was = before.get(&command).copied().unwrap_or(0);
        (command, calls.saturating_sub(was))
    });
    run.filter(|(_, calls)| *calls > 0).collect()
}

/// Takes a permit of `semaphore` (waiting as long as it takes, within [`WAIT`]), holds it
/// for [`HOLD`] inside `occupancy`, and releases it.
async fn hold_once(semaphore: &Semaphore, occupancy: &Occupancy) -> Result<(), BoxError> {
    let guard = semaphore.try_acquire(WAIT).await?;
    occupancy.enter(guard.fencing_token());
    tokio::time::sleep(HOLD).await;
    occupancy.exit();
    guard.release().await?;
    Ok(())
}

/// Runs `cycles` cycles of `cycle` alone and counts what Redis ran for them.
async fn count(
    ctx: &Ctx,
    cycle: Cycle,
    client: &LockClient,
    raw: &mut ConnectionManager,
    cycles: usize,
) -> Result<Counted, BoxError> {
    let (before, usec_before) = command_stats(ctx)?;
    for i in 0..cycles {
        cycle
            .run(client, raw, &format!("count:{cycle:?}:{i}"))
            .await?;
    }
    let (after, usec_after) = command_stats(ctx)?;
    let calls = since(&before, after);
    Ok(Counted {
        calls,
        cycles: cycles as f64,
        script_us: usec_after.saturating_sub(usec_before) as f64 / cycles as f64,
    })
}

async fn uncontended(ctx: &Ctx, report: &mut Report) -> Result<(), BoxError> {
    let cycles = ctx.pick(2_000, 10_000);
    let counted = ctx.pick(500, 2_000);
    let limit = ctx.pick(Duration::from_secs(20), Duration::from_secs(90));
    let client = LockClient::connect(&ctx.url).await?;
    let mut raw = connection_manager(&ctx.url).await?;
    for i in 0..50 {
        for cycle in Cycle::ALL {
            cycle.run(&client, &mut raw, &format!("warm:{i}")).await?;
        }
    }

    let deadline = Instant::now() + limit;
    let mut samples = vec![Vec::<Duration>::with_capacity(cycles); Cycle::ALL.len()];
    // A new shuffled order each cycle (seeded: every run alike), so none always follows
    // the same one, whose code and data it would find in the CPU's caches or not.
    let mut rng = fastrand::Rng::with_seed(9);
    let mut turns: Vec<usize> = (0..Cycle::ALL.len()).collect();
    for i in 0..cycles {
        if Instant::now() >= deadline {
            break;
        }
        let tag = i.to_string();
        rng.shuffle(&mut turns);
        for &at in &turns {
            let t = Instant::now();
            Cycle::ALL[at].run(&client, &mut raw, &tag).await?;
            samples[at].push(t.elapsed());
        }
    }
    let mut counts = Vec::new();
    for cycle in Cycle::ALL {
        counts.push(count(ctx, cycle, &client, &mut raw, counted).await?);
    }

    let s: Vec<Summary> = samples.iter().map(|s| Summary::micros(s)).collect();
    let at = |c: Cycle| Cycle::ALL.iter().position(|x| *x == c).unwrap_or(0);
    let (floor, raw_plain, raw_permits, plain, permit) = (
        s[at(Cycle::Floor)],
        s[at(Cycle::RawPlain)],
        s[at(Cycle::RawPermits)],
        s[at(Cycle::Plain)],
        s[at(Cycle::Permit)],
    );
    let stopped = |row: Row, n: usize| match n < cycles {
        true => row.note("stopped by the time limit"),
        false => row,
    };
    let commands_note = |c: &Counted| {
        format!(
            "per cycle: {:.2} scripts, script time {:.1} µs (Redis's clock); {}",
            c.of("evalsha") + c.of("fcall"),
            c.script_us,
            c.breakdown()
        )
    };
    report.push(stopped(
        Row::new(
            NAME,
            "raw ConnectionManager",
            "2 × EVALSHA (return 1)",
            "µs",
        )
        .summary(floor)
        .redis_commands(counts[at(Cycle::Floor)].all()),
        floor.n,
    ));
    report.push(
        Row::new(
            NAME,
            "raw ConnectionManager",
            "lockwarden's take + HDEL of holder and mark, called directly",
            "µs",
        )
        .summary(raw_plain)
        .ratio_to(floor.median, "÷ 2×EVALSHA median")
        .redis_commands(counts[at(Cycle::RawPlain)].all())
        .note(commands_note(&counts[at(Cycle::RawPlain)])),
    );
    report.push(
        Row::new(
            NAME,
            "raw ConnectionManager",
            "lockwarden's permits_acquire.lua + ZREM, ZREMRANGEBYRANK, ZCOUNT, called directly",
            "µs",
        )
        .summary(raw_permits)
        .ratio_to(
            raw_plain.median,
            "÷ the plain lock's scripts, called directly",
        )
        .redis_commands(counts[at(Cycle::RawPermits)].all())
        .note(commands_note(&counts[at(Cycle::RawPermits)]))
        .note(format!(
            "{:+.1} µs vs the plain lock's scripts; p99 ratio {:.2}",
            raw_permits.median - raw_plain.median,
            raw_permits.p99 / raw_plain.p99
        )),
    );
    report.push(
        Row::new(NAME, "lockwarden lock", "acquire + release", "µs")
            .summary(plain)
            .ratio_to(floor.median, "÷ 2×EVALSHA median")
            .redis_commands(counts[at(Cycle::Plain)].all())
            .note(commands_note(&counts[at(Cycle::Plain)])),
    );
    report.push(
        Row::new(
            NAME,
            &format!("lockwarden semaphore({CAPACITY})"),
            "1 permit: acquire + release",
            "µs",
        )
        .summary(permit)
        .ratio_to(plain.median, "÷ the plain lock's median, same turns")
        .redis_commands(counts[at(Cycle::Permit)].all())
        .note(format!(
            "target ≤ 1.1; p99 ratio {:.2}; {:+.1} µs vs the plain lock, of which {:+.1} µs \
             on the Redis side (the raw scripts' difference); ÷ 2×EVALSHA median {:.2}",
            permit.p99 / plain.p99,
            permit.median - plain.median,
            raw_permits.median - raw_plain.median,
            permit.median / floor.median
        ))
        .note(commands_note(&counts[at(Cycle::Permit)])),
    );
    let (plain_cmds, permit_cmds) = (
        counts[at(Cycle::Plain)].all(),
        counts[at(Cycle::Permit)].all(),
    );
    report.push(
        Row::new(
            NAME,
            &format!("lockwarden semaphore({CAPACITY})"),
            "Redis commands per cycle ÷ the plain lock's",
            "",
        )
        .value(permit_cmds / plain_cmds)
        .note(format!(
            "{permit_cmds:.2} vs {plain_cmds:.2}, script-inner calls included, over {counted} \
             cycles of each"
        )),
    );
    Ok(())
}

/// The handoff part's lock kinds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Permit,
    Plain,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Permit => "lockwarden semaphore(1)",
            Kind::Plain => "lockwarden lock",
        }
    }
}

/// What the rounds of one kind add up to.
#[derive(Default)]
struct Handoffs {
    /// Release call → the waiter holding.
    took: Vec<Duration>,
    /// Release call → its reply.
    release: Vec<Duration>,
    /// Release call → the notice heard by a raw subscriber.
    heard: Vec<Duration>,
    /// Commands Redis ran from the release to the waiter holding, added up.
    commands: BTreeMap<String, u64>,
}

async fn handoff(ctx: &Ctx, report: &mut Report) -> Result<(), BoxError> {
    let rounds = ctx.pick(200, 1_000);
    let limit = ctx.pick(Duration::from_secs(20), Duration::from_secs(90));
    let holder = LockClient::connect(&ctx.url).await?;
    let waiter = LockClient::connect(&ctx.url).await?;
    let mut watch = connection_manager(&ctx.url).await?;
    let mut ear = Ear::listen(ctx, "*w9:handoff:*").await?;
    let mut pings = Vec::with_capacity(rounds);
    let mut all = [Handoffs::default(), Handoffs::default()];
    let deadline = Instant::now() + limit;
    for round in 0..rounds {
        if Instant::now() >= deadline {
            break;
        }
        let kinds = match round % 2 {
            0 => [Kind::Permit, Kind::Plain],
            _ => [Kind::Plain, Kind::Permit],
        };
        for kind in kinds {
            let name = format!("w9:handoff:{kind:?}:{round}");
            let one = Round {
                ctx,
                kind,
                holder: &holder,
                waiter: &waiter,
                name: &name,
            };
            one.run(&mut watch, &mut ear, &mut all[kind as usize])
                .await?;
        }
        let sent = Instant::now();
        let _: String = redis::cmd("PING").query_async(&mut watch).await?;
        pings.push(sent.elapsed());
    }
    ear.stop().await;
    let ping = Summary::micros(&pings);
    report.push(
        Row::new(
            NAME,
            "raw ConnectionManager",
            "PING (one in every handoff round)",
            "µs",
        )
        .summary(ping),
    );
    let plain = Summary::micros(&all[Kind::Plain as usize].took);
    for kind in [Kind::Permit, Kind::Plain] {
        let h = &all[kind as usize];
        let s = Summary::micros(&h.took);
        let n = s.n.max(1) as f64;
        let scripts = crate::workloads::scripts_in(&h.commands) as f64 / n;
        let commands = h.commands.values().sum::<u64>() as f64 / n;
        let what = match kind {
            Kind::Permit => "permit",
            Kind::Plain => "lock",
        };
        let mut row = Row::new(
            NAME,
            kind.name(),
            &format!("release → the waiting task holds the {what}"),
            "µs",
        )
        .summary(s)
        .ratio_to(ping.median, "round trips: ÷ PING median")
        .redis_commands(commands)
        .note(format!(
            "{} rounds, holder and waiter on 2 clients; p99 {:.2} round trips; from the \
             release to holding: {scripts:.2} scripts, {commands:.1} Redis commands ({})",
            s.n,
            s.p99 / ping.median,
            breakdown(&h.commands, n)
        ));
        if kind == Kind::Permit {
            row = row.note(format!(
                "target ≤ 2 round trips; ÷ the plain lock's: median {:.2}, p99 {:.2}",
                s.median / plain.median,
                s.p99 / plain.p99
            ));
        }
        report.push(row);
        let notice = match kind {
            Kind::Permit => "grant",
            Kind::Plain => "release notice",
        };
        for (metric, samples, note) in [
            (
                "release call → its reply".to_owned(),
                &h.release,
                "the holder's side",
            ),
            (
                format!("release → its {notice} heard by a raw redis-rs subscriber"),
                &h.heard,
                "the floor of a handoff told by a notice, same rounds",
            ),
        ] {
            report.push(
                Row::new(NAME, kind.name(), &metric, "µs")
                    .summary(Summary::micros(samples))
                    .ratio_to(ping.median, "round trips: ÷ PING median")
                    .note(note),
            );
        }
    }
    Ok(())
}

/// `EXISTS 3.00, HMGET 1.00, ...` for `counts` over `n` operations, the most called first.
fn breakdown(counts: &BTreeMap<String, u64>, n: f64) -> String {
    let mut commands: Vec<_> = counts.iter().filter(|(_, c)| **c > 0).collect();
    commands.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
    commands
        .iter()
        .map(|(name, c)| format!("{} {:.2}", name.to_uppercase(), **c as f64 / n))
        .collect::<Vec<_>>()
        .join(", ")
}

/// One handoff round: `holder` holds `name`, a task of `waiter` waits for it, and once
/// Redis shows it waiting the holder releases.
struct Round<'a> {
    ctx: &'a Ctx,
    kind: Kind,
    holder: &'a LockClient,
    waiter: &'a LockClient,
    name: &'a str,
}

impl Round<'_> {
    async fn run(
        &self,
        watch: &mut ConnectionManager,
        ear: &mut Ear,
        out: &mut Handoffs,
    ) -> Result<(), BoxError> {
        let name = self.name;
        // A capacity of 1 for both: one holder inside at most, each token issued once.
        let witness = Occupancy::new(format!("{} {name}", self.kind.name()), 1, &self.ctx.checks);
        let held = match self.kind {
            Kind::Permit => self.holder.semaphore(name, 1).acquire().await?,
            Kind::Plain => self.holder.acquire(name).await?,
        };
        witness.enter(held.fencing_token());
        let before = commands_on(watch).await?;
        let (semaphore, lock) = (self.waiter.semaphore(name, 1), self.waiter.lock(name));
        let kind = self.kind;
        let task = tokio::spawn(async move {
            let guard = match kind {
                Kind::Permit => semaphore.try_acquire(WAIT).await?,
                Kind::Plain => lock.try_acquire(WAIT).await?,
            };
            Ok::<_, BoxError>((guard, Instant::now()))
        });
        let key = self.holder.key(name)?;
        let (channel, waiting) = match kind {
            Kind::Permit => (
                format!("{}:granted", key.redis_key()),
                Some(key.redis_key().to_owned()),
            ),
            Kind::Plain => (key.channel().to_owned(), None),
        };
        let attempts = crate::workloads::scripts_in(&before) + 2;
        if let Err(e) = queued(watch, &channel, waiting.as_deref(), attempts).await {
            task.abort();
            return Err(e);
        }
        let before = commands_on(watch).await?;
        witness.exit();
        let released = Instant::now();
        held.release().await?;
        let release = released.elapsed();
        let (guard, at) = tokio::time::timeout(WAIT, task).await???;
        let after = commands_on(watch).await?;
        witness.enter(guard.fencing_token());
        witness.exit();
        guard.release().await?;
        out.took.push(at.saturating_duration_since(released));
        out.release.push(release);
        out.heard.push(ear.heard(&channel, released).await?);
        for (command, calls) in after {
            let was = before.get(&command).copied().unwrap_or(0);
            *out.commands.entry(command).or_default() += calls.saturating_sub(was);
        }
        Ok(())
    }
}

/// The notices of some channels as a raw redis-rs subscriber hears them: the floor of a
/// handoff told by a notice, whatever the client does with it.
struct Ear {
    heard: tokio::sync::mpsc::UnboundedReceiver<(String, Instant)>,
    task: Stop,
}

impl Ear {
    async fn listen(ctx: &Ctx, pattern: &str) -> Result<Self, BoxError> {
        let mut pubsub = redis::Client::open(ctx.url.as_str())?
            .get_async_pubsub()
            .await?;
        pubsub.psubscribe(pattern).await?;
        let (tell, heard) = tokio::sync::mpsc::unbounded_channel();
        let task = Stop(tokio::spawn(async move {
            let mut messages = pubsub.into_on_message();
            while let Some(message) = messages.next().await {
                if tell
                    .send((message.get_channel_name().to_owned(), Instant::now()))
                    .is_err()
                {
                    break;
                }
            }
        }));
        Ok(Self { heard, task })
    }

    /// How long after `since` the first notice on `channel` was heard (notices on other
    /// channels are dropped).
    async fn heard(&mut self, channel: &str, since: Instant) -> Result<Duration, BoxError> {
        let until = tokio::time::Instant::now() + WAIT;
        loop {
            match tokio::time::timeout_at(until, self.heard.recv()).await {
                Ok(Some((on, at))) if on == channel => {
                    return Ok(at.saturating_duration_since(since))
                }
                Ok(Some(_)) => {}
                Ok(None) => return Err("the raw subscriber stopped".into()),
                Err(_) => return Err(format!("no notice on {channel} within {WAIT:?}").into()),
            }
        }
    }

    async fn stop(self) {
        self.task.stop().await;
    }
}

/// A listening task, stopped (and its subscription closed) when dropped, on every way out.
struct Stop(tokio::task::JoinHandle<()>);

impl Stop {
    async fn stop(mut self) {
        self.0.abort();
        let _ = (&mut self.0).await;
    }
}

impl Drop for Stop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// `calls` per command in `INFO commandstats` (script-inner ones included), asked on
/// `conn` (no fresh connection: the handoffs are timed with the box busy, not idle); the
/// polls' own `INFO`, `PUBSUB` and `ZCARD` left out.
async fn commands_on(conn: &mut ConnectionManager) -> Result<BTreeMap<String, u64>, BoxError> {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(conn)
        .await?;
    let mut counts = BTreeMap::new();
    for line in info.lines() {
        let Some((name, stats)) = line
            .strip_prefix("cmdstat_")
            .and_then(|l| l.split_once(':'))
        else {
            continue;
        };
        if matches!(name, "info" | "pubsub|numsub" | "zcard" | "ping") {
            continue;
        }
        let calls = stats
            .strip_prefix("calls=")
            .and_then(|rest| rest.split(',').next())
            .ok_or("unexpected INFO commandstats line")?
            .parse::<u64>()?;
        counts.insert(name.to_owned(), calls);
    }
    Ok(counts)
}

/// Polls until the waiter made its two attempts (before and after subscribing: EVALSHA
/// reached `attempts`), listens on `channel`, and, for a semaphore, is in line at
/// `waiting`. Each poll is one round trip.
async fn queued(
    watch: &mut ConnectionManager,
    channel: &str,
    waiting: Option<&str>,
    attempts: u64,
) -> Result<(), BoxError> {
    let until = Instant::now() + WAIT;
    while Instant::now() < until {
        let (_, listening): (String, usize) = redis::cmd("PUBSUB")
            .arg("NUMSUB")
            .arg(channel)
            .query_async(watch)
            .await?;
        let in_line: usize = match waiting {
            // A semaphore's line: its members scored from 1e15 (its holds are below).
            Some(key) => {
                redis::cmd("ZCOUNT")
                    .arg(key)
                    .arg("1e15")
                    .arg("+inf")
                    .query_async(watch)
                    .await?
            }
            None => 1,
        };
        let scripts = crate::workloads::scripts_in(&commands_on(watch).await?);
        if listening >= 1 && in_line == 1 && scripts >= attempts {
            return Ok(());
        }
    }
    Err(format!("the waiter on {channel} was not queued within {WAIT:?}").into())
}

/// What the listener on the grant channel heard.
#[derive(Default)]
struct Heard {
    notices: AtomicU64,
    names: AtomicU64,
    most_names: AtomicU64,
    /// Messages that were not grants.
    other: AtomicU64,
    named: Mutex<HashSet<String>>,
    named_twice: AtomicU64,
}

impl Heard {
    /// A grant names its holders: `permits:<first token>:<holder> <holder>..`.
    fn hear(&self, text: &str) {
        let Some((_, holders)) = text
            .strip_prefix("permits:")
            .and_then(|rest| rest.split_once(':'))
        else {
            self.other.fetch_add(1, Ordering::Relaxed);
            return;
        };
        let mut named = self.named.lock().unwrap_or_else(|e| e.into_inner());
        let mut count = 0;
        for holder in holders.split(' ') {
            count += 1;
            if !named.insert(holder.to_owned()) {
                self.named_twice.fetch_add(1, Ordering::Relaxed);
            }
        }
        self.notices.fetch_add(1, Ordering::Relaxed);
        self.names.fetch_add(count, Ordering::Relaxed);
        self.most_names.fetch_max(count, Ordering::Relaxed);
    }
}

async fn waiters(ctx: &Ctx, report: &mut Report) -> Result<(), BoxError> {
    let name = "w9:waiters";
    let mut clients = Vec::new();
    for _ in 0..CLIENTS {
        clients.push(LockClient::connect(&ctx.url).await?);
    }
    let hash = clients[0].key(name)?.redis_key().to_owned();
    // The line is the semaphore's members scored from 1e15.
    let (waiting, channel) = (hash.clone(), format!("{hash}:granted"));

    // Every grant notice, as a waiting client hears it.
    let mut pubsub = redis::Client::open(ctx.url.as_str())?
        .get_async_pubsub()
        .await?;
    pubsub.subscribe(&channel).await?;
    let heard = Arc::new(Heard::default());
    let listener = {
        let heard = heard.clone();
        Stop(tokio::spawn(async move {
            let mut messages = pubsub.into_on_message();
            while let Some(message) = messages.next().await {
                heard.hear(&String::from_utf8_lossy(message.get_payload_bytes()));
            }
        }))
    };

    let occupancy = Arc::new(Occupancy::new(name, CAPACITY as usize, &ctx.checks));
    let semaphore = clients[0].semaphore(name, CAPACITY);
    let mut first = Vec::new();
    for _ in 0..CAPACITY {
        let guard = semaphore.acquire().await?;
        occupancy.enter(guard.fencing_token());
        first.push(guard);
    }

    let calls_before_wait = ctx.script_calls()?;
    let waited = Instant::now();
    let mut set = JoinSet::new();
    for w in 0..WAITERS {
        let semaphore = clients[w % CLIENTS].semaphore(name, CAPACITY);
        let occupancy = occupancy.clone();
        set.spawn(async move { hold_once(&semaphore, &occupancy).await });
    }
    // Every waiter in line, both clients and the listener subscribed, then a moment for
    // the attempts still in flight.
    let mut watch = connection_manager(&ctx.url).await?;
    loop {
        let (in_line, (_, listening)): (usize, (String, usize)) = redis::pipe()
            .cmd("ZCOUNT")
            .arg(&waiting)
            .arg("1e15")
            .arg("+inf")
            .cmd("PUBSUB")
            .arg("NUMSUB")
            .arg(&channel)
            .query_async(&mut watch)
            .await?;
        if in_line == WAITERS && listening == CLIENTS + 1 {
            break;
        }
        if waited.elapsed() > Duration::from_secs(30) {
            set.abort_all();
            return Err(format!(
                "only {in_line} of {WAITERS} waiters in line ({listening} listening) after 30 s"
            )
            .into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let lined_up = waited.elapsed();
    let waiting_scripts = ctx.script_calls()? - calls_before_wait;

    let calls_before = ctx.script_calls()?;
    let started = Instant::now();
    for guard in first {
        occupancy.exit();
        guard.release().await?;
    }
    join_all(set, WAIT + Duration::from_secs(10)).await?;
    let served = started.elapsed();
    let serving_scripts = ctx.script_calls()? - calls_before;
    let releases = (WAITERS + CAPACITY as usize) as u64;

    // The last notices land; then nothing may be held, in line or subscribed.
    tokio::time::sleep(Duration::from_millis(100)).await;
    listener.stop().await;
    if occupancy.inside() != 0 {
        ctx.checks.problem(format!(
            "{NAME}: {} holders of `{name}` still inside",
            occupancy.inside()
        ));
    }
    if let Some(state) = semaphore.state().await? {
        ctx.checks.problem(format!(
            "{NAME}: `{name}` still in use after every waiter released: {state:?}"
        ));
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    for (i, client) in clients.iter().enumerate() {
        let stats = client.stats();
        if stats.watched_locks != 0 || stats.waited_channels != 0 {
            ctx.checks.problem(format!(
                "{NAME}: client {i} still watches {} holds and waits on {} channels",
                stats.watched_locks, stats.waited_channels
            ));
        }
    }
    let (_, listening): (String, usize) = redis::cmd("PUBSUB")
        .arg("NUMSUB")
        .arg(&channel)
        .query_async(&mut watch)
        .await?;
    if listening != 0 {
        ctx.checks.problem(format!(
            "{NAME}: {listening} subscriptions to `{channel}` left behind"
        ));
    }

    let (notices, names) = (
        heard.notices.load(Ordering::Relaxed),
        heard.names.load(Ordering::Relaxed),
    );
    let named = heard.named.lock().unwrap_or_else(|e| e.into_inner()).len();
    if named != WAITERS || heard.named_twice.load(Ordering::Relaxed) != 0 {
        ctx.checks.problem(format!(
            "{NAME}: grants named {named} distinct waiters of {WAITERS}, {} twice",
            heard.named_twice.load(Ordering::Relaxed)
        ));
    }
    // Beyond each waiter's first attempt: while lining up, and while served (every
    // script then is a release, or an attempt).
    let extra = (waiting_scripts + serving_scripts).saturating_sub(WAITERS as u64 + releases);
    let implementation = format!("lockwarden semaphore({CAPACITY}), {WAITERS} waiters");
    report.push(
        Row::new(NAME, &implementation, "EVALSHA per handoff", "")
            .value(serving_scripts as f64 / WAITERS as f64)
            .note(format!(
                "{serving_scripts} scripts for {WAITERS} handoffs and {releases} releases \
                 (1.01 is one per release); all served in {:.0} ms, holding {} ms each, at \
                 most {} inside at once",
                served.as_secs_f64() * 1e3,
                HOLD.as_millis(),
                occupancy.most()
            )),
    );
    report.push(
        Row::new(NAME, &implementation, "waiters woken per grant notice", "")
            .value(names as f64 / notices.max(1) as f64)
            .note(format!(
                "{notices} notices named {names} waiters ({named} distinct), at most {} in \
                 one; {:.3} notices per release; {} other messages; 1.00 = a release wakes \
                 only the one waiter its permit went to",
                heard.most_names.load(Ordering::Relaxed),
                notices as f64 / releases as f64,
                heard.other.load(Ordering::Relaxed)
            )),
    );
    report.push(
        Row::new(
            NAME,
            &implementation,
            "acquire attempts beyond the first, per waiter",
            "",
        )
        .value(extra as f64 / WAITERS as f64)
        .note(format!(
            "{waiting_scripts} scripts while {WAITERS} lined up over {CLIENTS} clients \
             ({:.0} ms), {serving_scripts} while served",
            lined_up.as_secs_f64() * 1e3
        )),
    );
    Ok(())
}

/// 16 tasks of one client take turns at a semaphore of 3 permits, each holding its permit
/// ~1 ms: what Redis runs per cycle (an acquisition, waiting in line or not, and its
/// release). Run twice, `rounds` and `2 * rounds` cycles a task on a fresh client and
/// semaphore each, the figure is the difference over the cycles between them: the first
/// wave of waiters, which finds the client not yet listening and tries once more after
/// subscribing, cancels out, as start-up does in `scripts/layer_cost.py`. The whole longer
/// run's figure is in the note.
async fn contended(ctx: &Ctx, report: &mut Report) -> Result<(), BoxError> {
    const TASKS: usize = 16;
    const PERMITS: u32 = 3;
    let rounds = ctx.pick(10, 40);
    let short = contended_run(ctx, "w9:contended-short", TASKS, PERMITS, rounds).await?;
    let long = contended_run(ctx, "w9:contended", TASKS, PERMITS, 2 * rounds).await?;
    let cycles = (TASKS * rounds) as f64;
    let whole = long.calls.values().sum::<u64>() as f64 / (2.0 * cycles);
    let steady = since(&short.calls, long.calls);
    let implementation = format!("lockwarden semaphore({PERMITS}), {TASKS} tasks");
    report.push(
        Row::new(
            NAME,
            &implementation,
            "Redis commands per contended cycle",
            "",
        )
        .value(steady.values().sum::<u64>() as f64 / cycles)
        .note(format!(
            "the {cycles} cycles between a run of {} and one of {} cycles, holding {} ms \
             each ({:.0} and {:.0} ms, at most {} inside): {}; over the whole longer run, \
             its first wave of waiters included, {whole:.2}",
            TASKS * rounds,
            2 * TASKS * rounds,
            HOLD.as_millis(),
            short.elapsed.as_secs_f64() * 1e3,
            long.elapsed.as_secs_f64() * 1e3,
            short.most.max(long.most),
            breakdown(&steady, cycles)
        )),
    );
    Ok(())
}

/// What one contended run made Redis do.
struct ContendedRun {
    calls: BTreeMap<String, u64>,
    elapsed: Duration,
    most: usize,
}

/// `tasks` tasks of a new client each take a permit of `name` (`permits` of them) `rounds`
/// times, holding it [`HOLD`].
async fn contended_run(
    ctx: &Ctx,
    name: &str,
    tasks: usize,
    permits: u32,
    rounds: usize,
) -> Result<ContendedRun, BoxError> {
    let client = LockClient::connect(&ctx.url).await?;
    let occupancy = Arc::new(Occupancy::new(name, permits as usize, &ctx.checks));
    let before = ctx.command_counts()?;
    let started = Instant::now();
    let mut set = JoinSet::new();
    for _ in 0..tasks {
        let semaphore = client.semaphore(name, permits);
        let occupancy = occupancy.clone();
        set.spawn(async move {
            for _ in 0..rounds {
                hold_once(&semaphore, &occupancy).await?;
            }
            Ok::<_, BoxError>(())
        });
    }
    join_all(set, WAIT + Duration::from_secs(10)).await?;
    let elapsed = started.elapsed();
    let calls = since(&before, ctx.command_counts()?);
    // Its unsubscribing done before the next run counts.
    client.shutdown(Duration::from_secs(5)).await?;
    Ok(ContendedRun {
        calls,
        elapsed,
        most: occupancy.most(),
    })
}

/// No semaphore or lock of this workload may be left in Redis (fencing keys stay until
/// their lease ends, by design).
async fn left_behind(ctx: &Ctx) -> Result<(), BoxError> {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let left: Vec<String> = ctx
            .admin::<Vec<String>>(&["KEYS", "*w9:*"])?
            .into_iter()
            .filter(|k| !k.ends_with(":fence"))
            .collect();
        if left.is_empty() {
            return Ok(());
        }
        if Instant::now() >= deadline {
            ctx.checks.problem(format!(
                "{NAME}: {} key(s) still in Redis 5 s after the last release, e.g. `{}`",
                left.len(),
                left[0]
            ));
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
