//! The workloads, one module each, and what they share: the run context and helpers
//! to read the server's counters and the process' own resource use.

pub mod family;
pub mod handoff;
pub mod held;
pub mod http;
pub mod many_keys;
pub mod permits;
pub mod rate;
pub mod soak;
pub mod uncontended;
pub mod waiters;
pub mod watchdog;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use lockwarden_testkit::RedisServer;

pub use crate::baselines::join_all;
use crate::baselines::{round_trips, BoxError, Guard, Kind, Locker, Released};
use crate::check::Checks;
use crate::stats::{Report, Row, Summary};

/// What every workload gets.
pub struct Ctx {
    pub server: RedisServer,
    pub url: String,
    pub quick: bool,
    pub checks: Arc<Checks>,
}

impl Ctx {
    /// The quick or the full size of a parameter.
    pub fn pick<T>(&self, quick: T, full: T) -> T {
        if self.quick {
            quick
        } else {
            full
        }
    }

    /// Script calls in `INFO commandstats`, pipelined ones included: `EVALSHA` and
    /// `FCALL` (the plain take, where the server has functions).
    pub fn script_calls(&self) -> Result<u64, BoxError> {
        Ok(scripts_in(&self.command_counts()?))
    }

    /// Commands Redis has run, script-inner calls included (the sum of `calls` in
    /// `INFO commandstats`), leaving out the bench's own `INFO` and `CLIENT LIST`.
    pub fn command_calls(&self) -> Result<u64, BoxError> {
        Ok(self.command_counts()?.values().sum())
    }

    /// `calls` per command in `INFO commandstats` (script-inner calls included), leaving
    /// out the bench's own `INFO` and `CLIENT LIST`.
    pub fn command_counts(&self) -> Result<BTreeMap<String, u64>, BoxError> {
        let info: String = self.admin(&["INFO", "commandstats"])?;
        let mut counts = BTreeMap::new();
        for line in info.lines() {
            let Some((name, stats)) = line
                .strip_prefix("cmdstat_")
                .and_then(|l| l.split_once(':'))
            else {
                continue;
            };
            if name == "info" || name == "client|list" {
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

    /// `total_commands_processed` from `INFO stats` (every command, admin ones included).
    pub fn commands_processed(&self) -> Result<u64, BoxError> {
        self.stat("total_commands_processed")
    }

    /// `total_reads_processed` from `INFO stats`: the socket reads Redis made (Redis
    /// 6.0+), so commands ÷ reads says how many commands each read brought (pipelining,
    /// or calls that queued up on a multiplexed connection).
    pub fn reads_processed(&self) -> Result<u64, BoxError> {
        self.stat("total_reads_processed")
    }

    /// The counter `field` of `INFO stats` (0 if this server has none).
    fn stat(&self, field: &str) -> Result<u64, BoxError> {
        let info: String = self.admin(&["INFO", "stats"])?;
        let value = info
            .lines()
            .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'));
        Ok(value.map_or(Ok(0), |v| v.trim().parse())?)
    }

    /// CPU time the Redis server has used (user + system), from `INFO cpu`.
    pub fn redis_cpu(&self) -> Result<Duration, BoxError> {
        let info: String = self.admin(&["INFO", "cpu"])?;
        let mut secs = 0.0;
        for line in info.lines() {
            if let Some(v) = line
                .strip_prefix("used_cpu_user:")
                .or_else(|| line.strip_prefix("used_cpu_sys:"))
            {
                secs += v.trim().parse::<f64>()?;
            }
        }
        Ok(Duration::from_secs_f64(secs))
    }

    /// Connections opened after connection id `since` and still open (the admin
    /// connection asking is left out), and the highest connection id seen.
    pub fn connections_since(&self, since: u64) -> Result<(usize, u64), BoxError> {
        let list: String = self.admin(&["CLIENT", "LIST"])?;
        let (mut count, mut max) = (0, since);
        for line in list.lines() {
            let id: u64 = line
                .strip_prefix("id=")
                .and_then(|rest| rest.split(' ').next())
                .ok_or("unexpected CLIENT LIST line")?
                .parse()?;
            max = max.max(id);
            if id > since && !line.contains("cmd=client|list") {
                count += 1;
            }
        }
        Ok((count, max))
    }

    /// PING and EVALSHA round trips measured now, pushed as rows of `workload`: the
    /// machine is shared, so ratios use a baseline taken right before.
    pub async fn fresh_baseline(
        &self,
        report: &mut Report,
        workload: &str,
    ) -> Result<(Summary, Summary), BoxError> {
        let (ping, evalsha) = round_trips(&self.url, 500).await?;
        let (ping, evalsha) = (Summary::micros(&ping), Summary::micros(&evalsha));
        report.push(
            Row::new(
                workload,
                "raw ConnectionManager",
                "PING (just before)",
                "µs",
            )
            .summary(ping),
        );
        report.push(
            Row::new(
                workload,
                "raw ConnectionManager",
                "EVALSHA (just before)",
                "µs",
            )
            .summary(evalsha),
        );
        Ok((ping, evalsha))
    }

    /// Channels with at least one subscriber.
    pub fn pubsub_channels(&self) -> Result<usize, BoxError> {
        Ok(self.admin::<Vec<String>>(&["PUBSUB", "CHANNELS"])?.len())
    }

    /// One command on a fresh admin connection (blocking, so off the async workers).
    pub fn admin<T: redis::FromRedisValue>(&self, args: &[&str]) -> Result<T, BoxError> {
        Ok(tokio::task::block_in_place(|| self.server.query(args))?)
    }

    /// Connects a `Locker` of `kind` and warms it up (scripts loaded, connection open).
    pub async fn locker(&self, kind: Kind) -> Result<Arc<Locker>, BoxError> {
        let locker = Locker::connect(kind, &self.url).await?;
        for i in 0..50 {
            let (guard, _) = locker
                .acquire(&format!("{}:warmup:{i}", kind.slug()))
                .await?;
            release(guard, &self.checks, kind, "warm-up").await?;
        }
        Ok(Arc::new(locker))
    }
}

/// Releases and reports a lost lock as a problem.
pub async fn release(
    guard: Guard,
    checks: &Checks,
    kind: Kind,
    what: &str,
) -> Result<(), BoxError> {
    if guard.release().await? == Released::Lost {
        checks.problem(format!("{}: lock lost in {what}", kind.name()));
    }
    Ok(())
}

/// CPU time (user + system) this process has used.
pub fn cpu_time() -> Duration {
    // SAFETY: getrusage only writes into the struct we pass.
    let usage = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut usage);
        usage
    };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(usage.ru_utime) + tv(usage.ru_stime)
}

/// Resident set size of this process, in bytes.
pub fn rss_bytes() -> Result<u64, BoxError> {
    let statm = std::fs::read_to_string("/proc/self/statm")?;
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .ok_or("short /proc/self/statm")?
        .parse()?;
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    Ok(pages * page as u64)
}

/// Script calls among `counts` (`calls` per command of `INFO commandstats`): `EVALSHA`
/// and `FCALL`.
pub fn scripts_in(counts: &BTreeMap<String, u64>) -> u64 {
    ["evalsha", "fcall"]
        .iter()
        .map(|name| counts.get(*name).copied().unwrap_or(0))
        .sum()
}
