//! Finding locks: `SCAN` (never `KEYS`) over every node, bounded in keys and time.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use lockwarden_core::redis::{self, Value};
use serde::Serialize;

use crate::error::CliError;
use crate::names::{glob_match, Part, ScanPattern, Space};
use crate::target::{bounded, Target};

/// How far one scan may go.
#[derive(Debug, Clone, Copy)]
pub struct Bounds {
    /// The `COUNT` hint of each `SCAN` call.
    pub count: u64,
    /// Stop once this many matching keys have come back.
    pub max_keys: u64,
    /// Stop once the scan has taken this long.
    pub max_time: Duration,
}

/// How a scan went: whether it saw everything, and if not, why not.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct ScanReport {
    /// Every matching key of every node was seen.
    pub complete: bool,
    /// `"max-keys"` or `"time"` when a bound stopped the scan, else `null`.
    pub stopped_by: Option<&'static str>,
    /// Matching keys the scan returned (repeats included).
    pub keys_scanned: u64,
    /// `SCAN` calls made.
    pub rounds: u64,
    /// How long the scan took.
    pub elapsed_ms: u64,
    /// The bounds in force.
    pub max_keys: u64,
    /// The bounds in force.
    pub max_time_ms: u64,
}

impl ScanReport {
    /// A line for people: how much was scanned, and what to do when cut short.
    pub fn describe(&self) -> String {
        let seen = format!(
            "{} key{} in {} SCAN call{}, {} ms",
            self.keys_scanned,
            plural(self.keys_scanned),
            self.rounds,
            plural(self.rounds),
            self.elapsed_ms
        );
        match self.stopped_by {
            None => format!("scan complete: {seen}"),
            Some("max-keys") => format!(
                "scan INCOMPLETE: stopped at --max-keys {} ({seen}); locks may be missing",
                self.max_keys
            ),
            Some(_) => format!(
                "scan INCOMPLETE: stopped at --scan-time {} ms ({seen}); locks may be missing",
                self.max_time_ms
            ),
        }
    }
}

fn plural(n: u64) -> &'static str {
    if n == 1 {
        ""
    } else {
        "s"
    }
}

/// What a scan found of one lock: which of its keys exist.
pub type Found = BTreeMap<String, BTreeSet<Part>>;

/// Finds the locks whose names match the glob `names`: each node, each pattern of the
/// layout, until every cursor is back at 0 or a bound is hit.
///
/// # Errors
/// [`CliError::Redis`] if a `SCAN` fails.
pub async fn scan(
    target: &Target,
    space: &Space,
    names: &str,
    bounds: Bounds,
) -> Result<(Found, ScanReport), CliError> {
    let mut found = Found::new();
    let patterns = space.scan_patterns(names);
    let report = scan_keys(target, &patterns, bounds, |_, key| {
        if let Some((name, part)) = space.decode(key) {
            if glob_match(names, &name) {
                found.entry(name).or_default().insert(part);
            }
        }
    })
    .await?;
    Ok((found, report))
}

/// Runs `SCAN` with each of `patterns` on every node until every cursor is back at 0 or
/// a bound is hit, handing each key found (UTF-8 only: the core's keys are) to `each`
/// with the index of the node it is on.
///
/// # Errors
/// [`CliError::Redis`] if a `SCAN` fails.
pub async fn scan_keys(
    target: &Target,
    patterns: &[ScanPattern],
    bounds: Bounds,
    mut each: impl FnMut(usize, &str),
) -> Result<ScanReport, CliError> {
    let started = Instant::now();
    let mut report = ScanReport {
        complete: true,
        stopped_by: None,
        keys_scanned: 0,
        rounds: 0,
        elapsed_ms: 0,
        max_keys: bounds.max_keys,
        max_time_ms: u64::try_from(bounds.max_time.as_millis()).unwrap_or(u64::MAX),
    };
    'nodes: for (at, node) in target.nodes().iter().enumerate() {
        for pattern in patterns {
            let mut cursor: u64 = 0;
            loop {
                if report.keys_scanned >= bounds.max_keys {
                    report.stopped_by = Some("max-keys");
                    break 'nodes;
                }
                if started.elapsed() >= bounds.max_time {
                    report.stopped_by = Some("time");
                    break 'nodes;
                }
                let mut cmd = redis::cmd("SCAN");
                cmd.arg(cursor)
                    .arg("MATCH")
                    .arg(&pattern.pattern)
                    .arg("COUNT")
                    .arg(bounds.count);
                if pattern.hashes_only {
                    cmd.arg("TYPE").arg("hash");
                }
                let mut conn = node.conn.clone();
                let (next, keys): (u64, Vec<Value>) =
                    bounded(target.timeout(), cmd.query_async(&mut conn))
                        .await
                        .map_err(|e| CliError::Redis(format!("SCAN on {}: {e}", node.addr)))?;
                report.rounds += 1;
                report.keys_scanned += keys.len() as u64;
                for key in keys {
                    let Value::BulkString(bytes) = key else {
                        continue;
                    };
                    // Our keys are UTF-8 (names are `str`); anything else is not ours.
                    if let Ok(key) = String::from_utf8(bytes) {
                        each(at, &key);
                    }
                }
                cursor = next;
                if cursor == 0 {
                    break;
                }
            }
        }
    }
    report.complete = report.stopped_by.is_none();
    report.elapsed_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
    Ok(report)
}
