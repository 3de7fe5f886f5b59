//! The command line: flags, and one function per command.

use std::io::{BufRead, IsTerminal, Write};
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};
use lockwarden_core::{KeyLayout, LockClient, ReleaseNotices};
use serde::Serialize;

use crate::error::{CliError, EXIT_CODES};
use crate::inspect::{self, Kind, LockView};
use crate::names::Space;
use crate::rate::{self, RateView};
use crate::render;
use crate::scan::{self, Bounds, ScanReport};
use crate::target::{Endpoint, Target};
use crate::watch;

/// Inspect and manage lockwarden's locks in a live Redis (Redisson-compatible).
#[derive(Debug, Parser)]
#[command(name = "lockwarden", version, after_help = EXIT_CODES)]
pub struct Cli {
    /// Connection and layout flags, common to every command.
    #[command(flatten)]
    pub common: Common,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Flags every command takes.
#[derive(Debug, Args)]
pub struct Common {
    /// Redis URL (`redis://[user:password@]host:port/[db]`, `rediss://` for TLS); with
    /// --cluster, seed nodes (repeat the flag or separate with commas).
    #[arg(
        long,
        env = "REDIS_URL",
        hide_env_values = true,
        default_value = "redis://127.0.0.1:6379/",
        value_delimiter = ',',
        global = true
    )]
    pub url: Vec<String>,
    /// The URLs are nodes of a Redis Cluster: scan every master.
    #[arg(long, global = true)]
    pub cluster: bool,
    /// With --cluster: send an unlock's release notice by classic PUBLISH, for
    /// applications whose clients use `.notices(ReleaseNotices::Classic)` (otherwise it
    /// is sharded when every master runs Redis 7 or later, as the library's notices are).
    #[arg(long, global = true, requires = "cluster")]
    pub classic_notices: bool,
    /// Prefix of every lock key (default `lockwarden:`; empty for --layout redisson).
    #[arg(long, global = true)]
    pub namespace: Option<String>,
    /// How lock names map to keys: lockwarden's tagged layout or Redisson's RLock layout.
    #[arg(long, value_enum, default_value_t = LayoutArg::Tagged, global = true)]
    pub layout: LayoutArg,
    /// Print JSON instead of a table (one object; `watch`: one object per line).
    #[arg(long, global = true)]
    pub json: bool,
    /// Bound on connecting and on every Redis reply.
    #[arg(long, default_value = "2s", value_parser = parse_duration, global = true)]
    pub timeout: Duration,
    /// SCAN's COUNT hint per call.
    #[arg(long, default_value_t = 1000, global = true)]
    pub scan_count: u64,
    /// Stop scanning after this many matching keys (the output then says so).
    #[arg(long, default_value_t = 100_000, global = true)]
    pub max_keys: u64,
    /// Stop scanning after this long (the output then says so).
    #[arg(long, default_value = "5s", value_parser = parse_duration, global = true)]
    pub scan_time: Duration,
}

/// The key layouts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LayoutArg {
    /// `<namespace>{<name>}` and companions `<lock key>:<what>`.
    Tagged,
    /// Redisson's: the name is the hash, companions `redisson_lock__<what>:{<name>}`.
    Redisson,
}

/// The commands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Every lock under the namespace (optionally only names matching a glob), then every
    /// rate limiter's key whose buckets are not full.
    List {
        /// A glob over lock names, and over rate limits' `<limiter>:<key>` (`*`, `?`,
        /// `[a-z]`, `\` quotes).
        #[arg(default_value = "*")]
        pattern: String,
        /// Also list released locks whose fencing key is still there.
        #[arg(long)]
        all: bool,
    },
    /// One lock in full: holders and leases, queue order and deadlines, a semaphore's
    /// capacity and line, outcome; with --limiter, one key of a rate limiter: what each
    /// policy's bucket has left and when it is full again.
    Show {
        /// The lock name, as the application gives it (with --limiter: the limited key).
        name: String,
        /// Show the rate limiter of this name's buckets for the key NAME.
        #[arg(long)]
        limiter: Option<String>,
    },
    /// Force-release a lock of any kind (every permit of a semaphore), waking its waiters.
    Unlock {
        /// The lock name.
        name: String,
        /// Do not ask for confirmation (needed when stdin is not a terminal).
        #[arg(long, short = 'y')]
        yes: bool,
    },
    /// Empty a rate limiter's buckets for one key: its next request finds them full.
    Reset {
        /// The rate limiter's name.
        limiter: String,
        /// The limited key, as the application gives it.
        key: String,
        /// Do not ask for confirmation (needed when stdin is not a terminal).
        #[arg(long, short = 'y')]
        yes: bool,
    },
    /// A refreshing table of the busiest locks.
    Watch {
        /// A glob over lock names.
        #[arg(default_value = "*")]
        pattern: String,
        /// Time between refreshes.
        #[arg(long, default_value = "1s", value_parser = parse_duration)]
        interval: Duration,
        /// Stop after this many refreshes (default: until interrupted).
        #[arg(long)]
        iterations: Option<u64>,
        /// Rows shown.
        #[arg(long, default_value_t = 20)]
        top: usize,
    },
}

/// `250ms`, `2s`, `1.5s`, `1m`, or seconds as a bare number.
///
/// # Errors
/// A message for anything else.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let t = text.trim();
    let (number, unit) = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .map_or((t, "s"), |at| t.split_at(at));
    let value: f64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a duration (e.g. 250ms, 2s, 1m)"))?;
    let seconds = match unit.trim() {
        "ms" => value / 1000.0,
        "s" | "" => value,
        "m" | "min" => value * 60.0,
        _ => return Err(format!("{text:?}: unknown unit (use ms, s or m)")),
    };
    Duration::try_from_secs_f64(seconds).map_err(|e| format!("{text:?}: {e}"))
}

impl Common {
    /// The key space of the flags.
    pub fn space(&self) -> Space {
        let layout = match self.layout {
            LayoutArg::Tagged => KeyLayout::Tagged,
            LayoutArg::Redisson => KeyLayout::Redisson,
        };
        Space::new(self.namespace.as_deref(), layout)
    }

    /// Where to connect.
    pub fn endpoint(&self) -> Endpoint {
        Endpoint {
            urls: self.url.clone(),
            cluster: self.cluster,
            timeout: self.timeout,
        }
    }

    /// The scan bounds.
    pub fn bounds(&self) -> Bounds {
        Bounds {
            count: self.scan_count.max(1),
            max_keys: self.max_keys.max(1),
            max_time: self.scan_time,
        }
    }
}

/// `list --json`.
#[derive(Debug, Serialize)]
pub struct ListJson<'a> {
    /// The namespace scanned.
    pub namespace: &'a str,
    /// `"tagged"` or `"redisson"`.
    pub layout: &'static str,
    /// The glob over names.
    pub pattern: &'a str,
    /// How the scan went.
    pub scan: &'a ScanReport,
    /// The locks, by name.
    pub locks: &'a [LockView],
    /// How the scan for rate limiters' buckets went.
    pub rate_scan: &'a ScanReport,
    /// Every rate limiter's key whose buckets are not full, by limiter and key.
    pub rate_limits: &'a [RateView],
}

/// `reset --json`.
#[derive(Debug, Serialize)]
pub struct ResetJson<'a> {
    /// The limiter's name.
    pub limiter: &'a str,
    /// The key.
    pub key: &'a str,
    /// What its buckets had left, just before.
    pub before: &'a RateView,
}

/// `unlock --json`.
#[derive(Debug, Serialize)]
pub struct UnlockJson<'a> {
    /// The lock name.
    pub name: &'a str,
    /// Whether a lock was deleted.
    pub unlocked: bool,
    /// What it was, just before.
    pub before: &'a LockView,
}

/// Runs one command.
///
/// # Errors
/// What went wrong, with its exit code.
pub async fn run(cli: Cli) -> Result<(), CliError> {
    let common = &cli.common;
    let space = common.space();
    let endpoint = common.endpoint();
    endpoint.check()?;
    match &cli.command {
        Command::List { pattern, all } => {
            let target = Target::connect(&endpoint).await?;
            let (found, report) = scan::scan(&target, &space, pattern, common.bounds()).await?;
            let mut views = inspect::read_found(&target, &space, &found).await?;
            if !all {
                views.retain(|v| v.kind != Kind::Free);
            }
            let (limits, rate_report) =
                rate::list(&target, &space, pattern, common.bounds()).await?;
            if common.json {
                print_json(&ListJson {
                    namespace: space.namespace(),
                    layout: space.layout_name(),
                    pattern,
                    scan: &report,
                    locks: &views,
                    rate_scan: &rate_report,
                    rate_limits: &limits,
                })?;
            } else {
                let held = views.iter().filter(|v| v.is_held()).count();
                if views.is_empty() {
                    println!(
                        "no locks under namespace {:?} ({} layout) matching {pattern:?}",
                        space.namespace(),
                        space.layout_name()
                    );
                } else {
                    print!("{}", render::list(&views));
                }
                println!(
                    "{} lock{} ({held} held); {}",
                    views.len(),
                    if views.len() == 1 { "" } else { "s" },
                    report.describe()
                );
                if !limits.is_empty() {
                    print!("\n{}", render::rate_list(&limits));
                    println!(
                        "{} rate-limited key{}; {}",
                        limits.len(),
                        if limits.len() == 1 { "" } else { "s" },
                        rate_report.describe()
                    );
                }
            }
            for report in [&report, &rate_report] {
                if !report.complete {
                    eprintln!("lockwarden: warning: {}", report.describe());
                }
            }
            Ok(())
        }
        Command::Show {
            name,
            limiter: Some(limiter),
        } => {
            let target = Target::connect(&endpoint).await?;
            let view = rate_view(common, &space, &target, limiter, name).await?;
            if common.json {
                print_json(&view)
            } else {
                print!("{}", render::rate_show(&view));
                Ok(())
            }
        }
        Command::Reset { limiter, key, yes } => {
            let target = Target::connect(&endpoint).await?;
            let before = rate_view(common, &space, &target, limiter, key).await?;
            let summary = format!(
                "{key:?} of rate limiter {limiter:?} ({} bucket(s) not full: {})",
                before.buckets.len(),
                before
                    .buckets
                    .iter()
                    .map(|b| format!("{} {}/{} left", b.policy, b.remaining, b.burst))
                    .collect::<Vec<_>>()
                    .join(", ")
            );
            confirm(
                *yes,
                ["Reset", "resetting"],
                &summary,
                "Its next request finds every bucket full.",
            )?;
            let client = connect_client(common, &space, &endpoint).await?;
            rate::reset(&client, &before).await?;
            if common.json {
                print_json(&ResetJson {
                    limiter,
                    key,
                    before: &before,
                })
            } else {
                println!("reset {summary}");
                Ok(())
            }
        }
        Command::Show {
            name,
            limiter: None,
        } => {
            space
                .keys(name)
                .map_err(|e| CliError::Usage(format!("bad lock name {name:?}: {e}")))?;
            let target = Target::connect(&endpoint).await?;
            let view = inspect::read(&target, &space, name)
                .await?
                .ok_or_else(|| not_found(&space, name))?;
            if common.json {
                print_json(&view)
            } else {
                print!("{}", render::show(&view));
                Ok(())
            }
        }
        Command::Unlock { name, yes } => unlock(common, &space, &endpoint, name, *yes).await,
        Command::Watch {
            pattern,
            interval,
            iterations,
            top,
        } => {
            let target = Target::connect(&endpoint).await?;
            watch::watch(
                &target,
                &space,
                &watch::Options {
                    pattern: pattern.clone(),
                    interval: *interval,
                    iterations: *iterations,
                    top: *top,
                    json: common.json,
                    bounds: common.bounds(),
                    url: endpoint.display(),
                },
            )
            .await
        }
    }
}

/// `key`'s buckets under `limiter`, or why there are none to show.
async fn rate_view(
    common: &Common,
    space: &Space,
    target: &Target,
    limiter: &str,
    key: &str,
) -> Result<RateView, CliError> {
    let valid = |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.');
    if limiter.is_empty() || !limiter.chars().all(valid) || key.is_empty() {
        return Err(CliError::Usage(format!(
            "bad rate limit {limiter:?} / {key:?}: a limiter is named with ASCII letters, \
             digits, `_`, `-` and `.`, and a key is not empty"
        )));
    }
    rate::show(target, space, limiter, key, common.bounds())
        .await?
        .ok_or_else(|| {
            CliError::NotFound(format!(
                "rate limiter {limiter:?} stores nothing for {key:?}: every bucket is full \
                 (namespace {:?}; keys {}*)",
                space.namespace(),
                space.bucket_prefix(limiter, key)
            ))
        })
}

/// Passes with `yes` given; else asks for `yes` on a terminal whether to do `act`
/// (`["Force-unlock", "force-unlocking"]`) to `what`, saying `consequence`, and refuses
/// without a terminal.
fn confirm(yes: bool, act: [&str; 2], what: &str, consequence: &str) -> Result<(), CliError> {
    let [ask, doing] = act;
    if yes {
        return Ok(());
    }
    if !std::io::stdin().is_terminal() {
        return Err(CliError::Refused(format!(
            "not {doing} {what}: confirmation needed and stdin is not a terminal; pass --yes"
        )));
    }
    eprint!("{ask} {what}?\n{consequence} Type 'yes' to confirm: ");
    let _ = std::io::stderr().flush();
    let mut answer = String::new();
    std::io::stdin()
        .lock()
        .read_line(&mut answer)
        .map_err(|e| CliError::Refused(format!("no confirmation read: {e}")))?;
    match matches!(answer.trim(), "y" | "yes" | "Y" | "YES" | "Yes") {
        true => Ok(()),
        false => Err(CliError::Refused(format!("not {doing} {what}"))),
    }
}

fn not_found(space: &Space, name: &str) -> CliError {
    let key = space
        .keys(name)
        .map(|k| k.lock)
        .unwrap_or_else(|_| name.to_owned());
    CliError::NotFound(format!(
        "no lock named {name:?} (key {key:?}, namespace {:?}, {} layout)",
        space.namespace(),
        space.layout_name()
    ))
}

async fn unlock(
    common: &Common,
    space: &Space,
    endpoint: &Endpoint,
    name: &str,
    yes: bool,
) -> Result<(), CliError> {
    space
        .keys(name)
        .map_err(|e| CliError::Usage(format!("bad lock name {name:?}: {e}")))?;
    let target = Target::connect(endpoint).await?;
    let before = inspect::read(&target, space, name)
        .await?
        .ok_or_else(|| not_found(space, name))?;
    if !before.is_held() {
        let why = match before.kind {
            Kind::ClaimOutcome => format!(
                "{name:?} is not held: it is a completed claim's outcome ({} bytes); unlock \
                 does not delete outcomes",
                before.outcome.as_ref().map_or(0, |o| o.bytes)
            ),
            Kind::Fair => format!(
                "{name:?} is not held ({} waiter(s) queued take it in turn; the queue clears \
                 itself as their deadlines pass)",
                before.queue_length
            ),
            Kind::Semaphore => format!(
                "{name:?} is not held: no permit of the semaphore is ({} waiter(s) in line \
                 take theirs as they try again)",
                before.semaphore.as_ref().map_or(0, |s| s.waiting)
            ),
            _ => format!("{name:?} is not held"),
        };
        return Err(CliError::NotFound(why));
    }
    let summary = format!(
        "{name:?} ({}, held by {}; {} subscribed connection(s) will be woken)",
        render::kind_cell(&before),
        render::holders_cell(&before),
        before.subscribers
    );
    confirm(
        yes,
        ["Force-unlock", "force-unlocking"],
        &summary,
        "The holder keeps running until its next renewal finds the lock gone.",
    )?;
    let client = connect_client(common, space, endpoint).await?;
    let unlocked = match &before.semaphore {
        // Through the semaphore's own handle, so the CLI does whatever the core does for
        // semaphores (now: free every permit and wake the line, which keeps its places).
        // The capacity matters only to an acquisition.
        Some(s) => {
            let capacity = s.capacity.and_then(|c| u32::try_from(c).ok()).unwrap_or(1);
            client.semaphore(name, capacity).force_unlock().await
        }
        None => client.lock(name).force_unlock().await,
    }
    .map_err(|e| CliError::Redis(format!("force-unlock of {name:?} failed: {e}")))?;
    if common.json {
        print_json(&UnlockJson {
            name,
            unlocked,
            before: &before,
        })?;
    } else if unlocked {
        println!("unlocked {summary}");
    }
    if unlocked {
        Ok(())
    } else {
        Err(CliError::NotFound(format!(
            "{name:?} was released before the force-unlock ran"
        )))
    }
}

/// A library client with the flags' namespace, layout and deployment: force-unlock goes
/// through the core's own script.
async fn connect_client(
    common: &Common,
    space: &Space,
    endpoint: &Endpoint,
) -> Result<LockClient, CliError> {
    // An operator's user may be allowed only what the CLI runs.
    let builder = LockClient::builder()
        .skip_permission_check()
        .layout(space.layout())
        .namespace(space.namespace())
        .command_timeout(common.timeout);
    let client = if endpoint.cluster {
        // Waiters hear the unlock only if it publishes the way their clients listen.
        let builder = match common.classic_notices {
            true => builder.notices(ReleaseNotices::Classic),
            false => builder,
        };
        builder.connect_cluster(&endpoint.urls).await
    } else {
        builder.connect(&endpoint.urls[0]).await
    };
    client
        .map_err(|e| CliError::Redis(format!("cannot reach Redis at {}: {e}", endpoint.display())))
}

/// Prints `value` as one line of JSON.
///
/// # Errors
/// Never in practice (the views serialize).
pub fn print_json(value: &impl Serialize) -> Result<(), CliError> {
    let text = serde_json::to_string(value)
        .map_err(|e| CliError::Redis(format!("cannot write JSON: {e}")))?;
    println!("{text}");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse() {
        assert_eq!(parse_duration("200ms"), Ok(Duration::from_millis(200)));
        assert_eq!(parse_duration("2s"), Ok(Duration::from_secs(2)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("1m"), Ok(Duration::from_secs(60)));
        assert_eq!(parse_duration("3"), Ok(Duration::from_secs(3)));
        assert!(parse_duration("soon").is_err());
        assert!(parse_duration("3h").is_err());
    }

    #[test]
    fn the_command_line_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}
