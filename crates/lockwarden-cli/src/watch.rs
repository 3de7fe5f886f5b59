//! `lockwarden watch`: the busiest locks, refreshed.
//!
//! Acquisitions per second come from one of two sources, chosen at start and named in
//! every frame:
//! - **keyspace events**, when every node already publishes them for string commands
//!   (`notify-keyspace-events` has `E` and `$` or `A`): every fresh acquisition of any
//!   kind counts up the lock's fencing key with `INCR` (an `incrby` event; a re-entry
//!   does not, nor do readers that join a read phase and share its token), so counting
//!   `incrby` events on fencing keys counts acquisitions exactly, but for a semaphore's
//!   release that grants several waiters at once: it counts the key up once, whatever
//!   their number. The inspector never changes the server's configuration;
//! - otherwise **fencing tokens**: a lock whose token changed between two refreshes was
//!   acquired at least once in between, so the rate is a lower bound (shown with `≥`).

use std::cmp::Reverse;
use std::collections::HashMap;
use std::io::IsTerminal;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use futures_util::StreamExt;
use lockwarden_core::redis::{self, Value};
use serde::Serialize;
use tokio::task::JoinHandle;

use crate::error::CliError;
use crate::inspect::{self, pairs, Kind, LockView};
use crate::names::{Part, Space};
use crate::render::print_json;
use crate::render::{self, duration_ms, table};
use crate::scan::{self, Bounds, ScanReport};
use crate::target::{bounded, Target};

/// What `watch` was asked for.
#[derive(Debug, Clone)]
pub struct Options {
    /// A glob over lock names.
    pub pattern: String,
    /// Time between refreshes.
    pub interval: Duration,
    /// Stop after this many refreshes.
    pub iterations: Option<u64>,
    /// Rows shown.
    pub top: usize,
    /// One JSON object per refresh instead of a table.
    pub json: bool,
    /// Scan bounds, per refresh.
    pub bounds: Bounds,
    /// The URL(s), passwords hidden, for the header.
    pub url: String,
}

/// Where the rates come from.
enum Rates {
    /// Counts of `incrby` events on fencing keys, per lock name, since subscribing.
    Events {
        counts: Arc<Mutex<HashMap<String, u64>>>,
        tasks: Vec<JoinHandle<()>>,
    },
    /// Tokens seen at the last refresh.
    Tokens { why: String },
}

impl Rates {
    fn source(&self) -> &'static str {
        match self {
            Rates::Events { .. } => "keyspace-events",
            Rates::Tokens { .. } => "fencing-tokens",
        }
    }
}

impl Drop for Rates {
    fn drop(&mut self) {
        if let Rates::Events { tasks, .. } = self {
            for task in tasks {
                task.abort();
            }
        }
    }
}

/// Subscribes to `incrby` events on every node if all of them publish them.
async fn start_rates(target: &Target, space: &Space) -> Rates {
    let mut flags_seen = Vec::new();
    for node in target.nodes() {
        let mut conn = node.conn.clone();
        let reply: redis::RedisResult<Value> = bounded(
            target.timeout(),
            redis::cmd("CONFIG")
                .arg("GET")
                .arg("notify-keyspace-events")
                .query_async(&mut conn),
        )
        .await;
        let flags = match reply {
            Ok(v) => pairs(&v)
                .into_iter()
                .next()
                .map(|(_, f)| f)
                .unwrap_or_default(),
            Err(e) => {
                return Rates::Tokens {
                    why: format!("CONFIG GET refused on {}: {e}", node.addr),
                }
            }
        };
        if !(flags.contains('E') && (flags.contains('$') || flags.contains('A'))) {
            return Rates::Tokens {
                why: format!(
                    "notify-keyspace-events is {flags:?} on {}; E$ gives exact counts",
                    node.addr
                ),
            };
        }
        flags_seen.push(flags);
    }
    let counts = Arc::new(Mutex::new(HashMap::new()));
    let channel = format!("__keyevent@{}__:incrby", target.db());
    let mut tasks = Vec::new();
    for node in target.nodes() {
        let subscribed = bounded(target.timeout(), async {
            let mut pubsub = node.client.get_async_pubsub().await?;
            pubsub.subscribe(&channel).await?;
            Ok(pubsub)
        })
        .await;
        let pubsub = match subscribed {
            Ok(p) => p,
            Err(e) => {
                return Rates::Tokens {
                    why: format!("cannot subscribe to {channel} on {}: {e}", node.addr),
                }
            }
        };
        let counts = counts.clone();
        let space = space.clone();
        tasks.push(tokio::spawn(async move {
            let mut messages = pubsub.into_on_message();
            while let Some(msg) = messages.next().await {
                let Ok(key) = std::str::from_utf8(msg.get_payload_bytes()) else {
                    continue;
                };
                if let Some((name, Part::Fence)) = space.decode(key) {
                    if let Ok(mut counts) = counts.lock() {
                        *counts.entry(name).or_default() += 1;
                    }
                }
            }
        }));
    }
    Rates::Events { counts, tasks }
}

/// One row of a frame: a lock and its rate.
#[derive(Debug, Serialize)]
pub struct Row<'a> {
    /// The lock.
    #[serde(flatten)]
    pub lock: &'a LockView,
    /// Acquisitions per second over the last interval (`null` on the first refresh with
    /// fencing tokens).
    pub acquisitions_per_sec: Option<f64>,
}

/// One refresh, as `watch --json` prints it (one line each).
#[derive(Debug, Serialize)]
pub struct Frame<'a> {
    /// 1, 2, ...
    pub refresh: u64,
    /// Wall clock of this machine, ms since the Unix epoch.
    pub at_unix_ms: u64,
    /// `"keyspace-events"` or `"fencing-tokens"`.
    pub rate_source: &'static str,
    /// True with fencing tokens: several acquisitions between refreshes count as one.
    pub rate_is_lower_bound: bool,
    /// Locks found (not only the rows).
    pub locks_total: usize,
    /// Of them held.
    pub held_total: usize,
    /// How the scan went.
    pub scan: &'a ScanReport,
    /// The busiest locks, busiest first, at most `--top`.
    pub locks: Vec<Row<'a>>,
}

/// Runs the refresh loop until `iterations` or Ctrl-C.
///
/// # Errors
/// [`CliError::Redis`] if Redis fails.
pub async fn watch(target: &Target, space: &Space, opts: &Options) -> Result<(), CliError> {
    let rates = start_rates(target, space).await;
    let tty = !opts.json && std::io::stdout().is_terminal();
    let mut last_at = Instant::now();
    let mut last_counts: HashMap<String, u64> = HashMap::new();
    let mut last_tokens: Option<HashMap<String, u64>> = None;
    let mut refresh = 0;
    let mut ctrl_c = std::pin::pin!(tokio::signal::ctrl_c());
    loop {
        refresh += 1;
        let (found, report) = scan::scan(target, space, &opts.pattern, opts.bounds).await?;
        let views = inspect::read_found(target, space, &found).await?;
        let now = Instant::now();
        let secs = now.duration_since(last_at).as_secs_f64().max(1e-3);
        let mut rate: HashMap<&str, Option<f64>> = HashMap::new();
        match &rates {
            Rates::Events { counts, .. } => {
                let counts = counts.lock().map(|c| c.clone()).unwrap_or_default();
                for v in &views {
                    let n = counts.get(&v.name).copied().unwrap_or(0);
                    let before = last_counts.get(&v.name).copied().unwrap_or(0);
                    rate.insert(&v.name, Some(n.saturating_sub(before) as f64 / secs));
                }
                last_counts = counts;
            }
            Rates::Tokens { .. } => {
                let tokens: HashMap<String, u64> = views
                    .iter()
                    .filter_map(|v| Some((v.name.clone(), v.fencing_token?)))
                    .collect();
                for v in &views {
                    let r = last_tokens.as_ref().map(|last| {
                        let changed = v.fencing_token.is_some()
                            && last.get(&v.name).copied() != v.fencing_token;
                        if changed {
                            1.0 / secs
                        } else {
                            0.0
                        }
                    });
                    rate.insert(&v.name, r);
                }
                last_tokens = Some(tokens);
            }
        }
        last_at = now;
        let mut rows: Vec<Row<'_>> = views
            .iter()
            .map(|v| Row {
                lock: v,
                acquisitions_per_sec: rate.get(v.name.as_str()).copied().flatten(),
            })
            .filter(|r| {
                r.lock.is_held() || r.lock.waiting() > 0 || r.acquisitions_per_sec > Some(0.0)
            })
            .collect();
        rows.sort_by(|a, b| {
            let key = |r: &Row<'_>| {
                (
                    Reverse(r.lock.waiting()),
                    Reverse((r.acquisitions_per_sec.unwrap_or(0.0) * 1000.0) as u64),
                    Reverse(r.lock.holders.len()),
                    Reverse(r.lock.held_for_ms.unwrap_or(0)),
                )
            };
            key(a)
                .cmp(&key(b))
                .then_with(|| a.lock.name.cmp(&b.lock.name))
        });
        rows.truncate(opts.top);
        let frame = Frame {
            refresh,
            at_unix_ms: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(0)),
            rate_source: rates.source(),
            rate_is_lower_bound: matches!(rates, Rates::Tokens { .. }),
            locks_total: views.len(),
            held_total: views.iter().filter(|v| v.is_held()).count(),
            scan: &report,
            locks: rows,
        };
        if opts.json {
            print_json(&frame)?;
        } else {
            let text = render_frame(&frame, &rates, space, opts);
            if tty {
                print!("\x1b[H\x1b[2J{text}");
            } else {
                println!("{text}");
            }
        }
        use std::io::Write as _;
        let _ = std::io::stdout().flush();
        if opts.iterations.is_some_and(|n| refresh >= n) {
            break;
        }
        tokio::select! {
            () = tokio::time::sleep(opts.interval) => {}
            _ = &mut ctrl_c => break,
        }
    }
    Ok(())
}

fn render_frame(frame: &Frame<'_>, rates: &Rates, space: &Space, opts: &Options) -> String {
    let secs = frame.at_unix_ms / 1000;
    let clock = format!(
        "{:02}:{:02}:{:02} UTC",
        (secs / 3600) % 24,
        (secs / 60) % 60,
        secs % 60
    );
    let mut out = format!(
        "lockwarden watch  {}  namespace {:?} ({})  {clock}  refresh {} every {}\n",
        opts.url,
        space.namespace(),
        space.layout_name(),
        frame.refresh,
        duration_ms(i64::try_from(opts.interval.as_millis()).unwrap_or(i64::MAX)),
    );
    out.push_str(&format!(
        "{} lock{}, {} held; acq/s {}\n\n",
        frame.locks_total,
        if frame.locks_total == 1 { "" } else { "s" },
        frame.held_total,
        match rates {
            Rates::Events { .. } => "from keyspace events (exact)".to_owned(),
            Rates::Tokens { why } => format!("≥ fencing-token changes ({why})"),
        }
    ));
    if frame.locks.is_empty() {
        out.push_str("(no held, waited-for or recently acquired locks)\n");
    } else {
        let lower = if frame.rate_is_lower_bound { "≥" } else { "" };
        let rows: Vec<Vec<String>> = frame
            .locks
            .iter()
            .map(|r| {
                let v = r.lock;
                vec![
                    shorten(&v.name, 48),
                    render::kind_cell(v),
                    holders_count(v),
                    render::queued_cell(v),
                    v.subscribers.to_string(),
                    v.held_for_ms.map_or_else(
                        || "-".into(),
                        |ms| duration_ms(i64::try_from(ms).unwrap_or(i64::MAX)),
                    ),
                    v.lease_ms.map_or_else(|| "-".into(), duration_ms),
                    r.acquisitions_per_sec.map_or_else(
                        || "-".into(),
                        |x| {
                            if x > 0.0 {
                                format!("{lower}{x:.1}")
                            } else {
                                "0".into()
                            }
                        },
                    ),
                ]
            })
            .collect();
        out.push_str(&table(
            &[
                "NAME", "KIND", "HOLDERS", "QUEUED", "SUBS", "HELD", "LEASE", "ACQ/S",
            ],
            &rows,
        ));
    }
    if !frame.scan.complete {
        out.push_str(&format!("\n{}\n", frame.scan.describe()));
    }
    out
}

fn holders_count(v: &LockView) -> String {
    match v.kind {
        Kind::ReadWrite if v.is_held() => {
            let writers = v.holders.iter().filter(|h| h.side == "write").count();
            let readers = v.holders.len() - writers;
            match (writers, readers) {
                (0, r) => format!("{r}r"),
                (w, 0) => format!("{w}w"),
                (w, r) => format!("{w}w+{r}r"),
            }
        }
        _ => v.holders.len().to_string(),
    }
}

/// `name` cut in the middle to `max` characters.
fn shorten(name: &str, max: usize) -> String {
    let n = name.chars().count();
    if n <= max {
        return name.to_owned();
    }
    let keep = max - 1;
    let head: String = name.chars().take(keep / 2).collect();
    let tail: String = name.chars().skip(n - (keep - keep / 2)).collect();
    format!("{head}…{tail}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_names_are_cut_in_the_middle() {
        assert_eq!(shorten("short", 10), "short");
        let cut = shorten("abcdefghijklmnopqrstuvwxyz", 10);
        assert_eq!(cut, "abcd…vwxyz");
        assert_eq!(cut.chars().count(), 10);
    }
}
