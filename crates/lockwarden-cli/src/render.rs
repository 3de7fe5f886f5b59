//! Output: JSON lines for programs; for people, durations, tables, one lock in full.

use std::fmt::Write as _;

use serde::Serialize;

use crate::error::CliError;
use crate::inspect::{Kind, LockView, SemaphoreView};
use crate::rate::{BucketView, RateView};

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

/// `850ms`, `12.3s`, `5m03s`, `2h05m`, `3d04h`; negative: `overdue`.
pub fn duration_ms(ms: i64) -> String {
    if ms < 0 {
        return "overdue".to_owned();
    }
    let s = ms / 1000;
    match ms {
        0..=999 => format!("{ms}ms"),
        1_000..=59_999 => format!("{}.{}s", s, (ms % 1000) / 100),
        60_000..=3_599_999 => format!("{}m{:02}s", s / 60, s % 60),
        3_600_000..=86_399_999 => format!("{}h{:02}m", s / 3600, (s % 3600) / 60),
        _ => format!("{}d{:02}h", s / 86_400, (s % 86_400) / 3600),
    }
}

fn opt_ms(ms: Option<i64>) -> String {
    ms.map_or_else(|| "-".to_owned(), duration_ms)
}

fn opt_u64_ms(ms: Option<u64>) -> String {
    opt_ms(ms.map(|m| i64::try_from(m).unwrap_or(i64::MAX)))
}

/// A left-aligned table: a header, rows, two spaces between columns, the last column not
/// padded (it may be long).
pub fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let mut line = |cells: &mut dyn Iterator<Item = &str>| {
        let mut text = String::new();
        for (i, cell) in cells.enumerate() {
            if i + 1 == widths.len() {
                text.push_str(cell);
            } else {
                let pad = widths[i] - cell.chars().count();
                text.push_str(cell);
                text.extend(std::iter::repeat_n(' ', pad + 2));
            }
        }
        out.push_str(text.trim_end());
        out.push('\n');
    };
    line(&mut header.iter().copied());
    for row in rows {
        line(&mut row.iter().map(String::as_str));
    }
    out
}

/// The holders of a lock in one cell: `id ×count` (a semaphore's: `id ×permits`),
/// read-write holds prefixed `r`/`w`; a claim's outcome instead when nobody holds it.
pub fn holders_cell(view: &LockView) -> String {
    if view.holders.is_empty() {
        return match (&view.outcome, view.kind) {
            (Some(o), _) => format!(
                "(completed: outcome {} B, {} left)",
                o.bytes,
                opt_ms(o.ttl_ms)
            ),
            (None, Kind::Free) => "(released)".to_owned(),
            (None, _) => "(free)".to_owned(),
        };
    }
    view.holders
        .iter()
        .map(|h| match h.side {
            "read" => format!("r {} ×{}", h.id, h.count),
            "write" => format!("w {} ×{}", h.id, h.count),
            _ => format!("{} ×{}", h.id, h.count),
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// The kind, with the mode of a read-write lock, or a semaphore's permits in use of its
/// capacity (`semaphore (2/3)`).
pub fn kind_cell(view: &LockView) -> String {
    match (&view.mode, view.kind, &view.semaphore) {
        (Some(mode), Kind::ReadWrite, _) => format!("read-write ({mode})"),
        (_, Kind::Semaphore, Some(s)) => match s.capacity {
            Some(capacity) => format!("semaphore ({}/{capacity})", s.in_use),
            None => "semaphore (no capacity stored)".to_owned(),
        },
        _ => view.kind.as_str().to_owned(),
    }
}

/// Queued holders: a fair lock's queue, a read-write lock's waiting writers and readers,
/// or a semaphore's line.
pub fn queued_cell(view: &LockView) -> String {
    match (view.kind, &view.semaphore) {
        (Kind::ReadWrite, _) => (view.writers_waiting + view.readers_waiting).to_string(),
        (Kind::Semaphore, Some(s)) => s.waiting.to_string(),
        _ => view.queue_length.to_string(),
    }
}

/// The table of `lockwarden list`.
pub fn list(views: &[LockView]) -> String {
    let rows: Vec<Vec<String>> = views
        .iter()
        .map(|v| {
            vec![
                v.name.clone(),
                kind_cell(v),
                opt_ms(v.lease_ms),
                v.fencing_token
                    .map_or_else(|| "-".into(), |t| t.to_string()),
                opt_u64_ms(v.held_for_ms),
                queued_cell(v),
                v.subscribers.to_string(),
                holders_cell(v),
            ]
        })
        .collect();
    table(
        &[
            "NAME", "KIND", "LEASE", "TOKEN", "HELD", "QUEUED", "SUBS", "HOLDERS",
        ],
        &rows,
    )
}

/// One lock in full, for `lockwarden show`.
pub fn show(v: &LockView) -> String {
    let mut out = String::new();
    let mut kv = |k: &str, val: String| {
        let _ = writeln!(out, "{k:<12}{val}");
    };
    kv("lock", v.name.clone());
    kv("key", v.key.clone());
    kv("kind", kind_cell(v));
    if let Some(s) = &v.semaphore {
        kv("capacity", capacity_line(s));
    }
    let lease_of = match v.kind {
        Kind::Semaphore => " (the longest hold's)",
        _ => "",
    };
    kv(
        "lease",
        v.lease_ms.map_or_else(
            || "- (not held)".into(),
            |ms| format!("{} left{lease_of}", duration_ms(ms)),
        ),
    );
    kv(
        "token",
        match (v.fencing_token, v.held_for_ms, v.kind) {
            (Some(t), Some(age), _) => {
                format!("{t} (this hold began {} ago)", opt_u64_ms(Some(age)))
            }
            // Each hold's token is its holder's alone: Redis keeps the last one issued.
            (Some(t), None, Kind::Semaphore) => format!("{t} (the last issued)"),
            (Some(t), None, _) => t.to_string(),
            (None, _, _) => "-".into(),
        },
    );
    kv("holders", v.holders.len().to_string());
    for h in &v.holders {
        let _ = write!(
            out,
            "  {:<6} {}  ×{}  lease {}",
            h.side,
            h.id,
            h.count,
            opt_ms(h.lease_ms)
        );
        out.push('\n');
    }
    match &v.semaphore {
        Some(s) => show_line(&mut out, s),
        None => show_queue(&mut out, v),
    }
    if v.kind == Kind::ReadWrite {
        for (side, count, waiters) in [
            ("writers", v.writers_waiting, &v.waiting_writers),
            ("readers", v.readers_waiting, &v.waiting_readers),
        ] {
            let _ = writeln!(out, "{side:<12}{count} waiting");
            for w in waiters {
                let _ = writeln!(
                    out,
                    "  {}  registered for {}",
                    w.holder,
                    opt_ms(w.deadline_ms)
                );
            }
        }
    }
    let _ = writeln!(out, "{:<12}{}", "subscribers", v.subscribers);
    // The channel the kind's waiters listen on (the first) always, the others when heard.
    for (i, c) in v.channels.iter().enumerate() {
        if c.subscribers > 0 || i == 0 {
            let _ = writeln!(out, "  {:<8} {}  {}", c.role, c.channel, c.subscribers);
        }
    }
    let _ = writeln!(
        out,
        "{:<12}{}",
        "outcome",
        v.outcome.as_ref().map_or_else(
            || "none".into(),
            |o| format!(
                "{} bytes, kept {}",
                o.bytes,
                o.ttl_ms
                    .map_or_else(|| "forever".into(), |t| format!("{} more", duration_ms(t)))
            )
        )
    );
    out
}

/// A duration in µs as [`duration_ms`] writes it, rounded up to the ms (`0ms` only when
/// it is zero).
pub fn duration_us(us: u64) -> String {
    duration_ms(i64::try_from(us.div_ceil(1000)).unwrap_or(i64::MAX))
}

/// A bucket's cells in the rate-limit tables: its policy, what is left of its burst, when
/// it is full again, what one unit costs; then `last` (the key, or the Redis key).
fn bucket_row(b: &BucketView, last: &str) -> Vec<String> {
    vec![
        b.policy.clone(),
        format!("{}/{}", b.remaining, b.burst),
        duration_us(b.reset_us),
        duration_us(b.interval_us),
        last.to_owned(),
    ]
}

/// The rate-limit table of `lockwarden list`: one row per bucket that is not full.
pub fn rate_list(views: &[RateView]) -> String {
    let rows: Vec<Vec<String>> = views
        .iter()
        .flat_map(|v| {
            v.buckets.iter().map(|b| {
                let mut row = vec![v.limiter.clone()];
                row.extend(bucket_row(b, &v.key));
                row
            })
        })
        .collect();
    table(
        &["LIMITER", "POLICY", "LEFT", "FULL IN", "PER UNIT", "KEY"],
        &rows,
    )
}

/// One key of a rate limiter, for `lockwarden show --limiter`.
pub fn rate_show(v: &RateView) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "{:<12}{}", "limiter", v.limiter);
    let _ = writeln!(out, "{:<12}{}", "key", v.key);
    let _ = writeln!(
        out,
        "{:<12}{} not full (a full bucket stores nothing)",
        "buckets",
        v.buckets.len()
    );
    let rows: Vec<Vec<String>> = v
        .buckets
        .iter()
        .map(|b| bucket_row(b, &b.redis_key))
        .collect();
    let header = ["POLICY", "LEFT", "FULL IN", "PER UNIT", "REDIS KEY"];
    for line in table(&header, &rows).lines() {
        let _ = writeln!(out, "  {line}");
    }
    out
}

/// `3 permits, 2 in use, 1 free; arrival order`.
fn capacity_line(s: &SemaphoreView) -> String {
    match s.capacity {
        Some(c) => format!(
            "{c} permits, {} in use, {} free; {} order",
            s.in_use,
            c.saturating_sub(s.in_use),
            s.order
        ),
        None => "none stored (the next acquisition stores its own)".into(),
    }
}

/// A fair lock's queue (`queue 0` for the kinds without one).
fn show_queue(out: &mut String, v: &LockView) {
    let _ = writeln!(out, "{:<12}{}", "queue", v.queue_length);
    for q in &v.queue {
        let _ = writeln!(
            out,
            "  {:>3}. {}  deadline in {}  subscribed {}",
            q.position,
            q.holder,
            opt_ms(q.deadline_ms),
            q.subscribers
        );
    }
    if (v.queue.len() as u64) < v.queue_length {
        let _ = writeln!(
            out,
            "  ... and {} more",
            v.queue_length - v.queue.len() as u64
        );
    }
}

/// A semaphore's line, first in line first.
fn show_line(out: &mut String, s: &SemaphoreView) {
    let _ = writeln!(out, "{:<12}{} in line", "waiting", s.waiting);
    for w in &s.line {
        let _ = writeln!(
            out,
            "  {:>3}. {}  asks {}  registered for {}  waited {}",
            w.position,
            w.holder,
            w.permits,
            duration_ms(w.deadline_ms),
            opt_u64_ms(Some(w.waited_ms))
        );
    }
    if (s.line.len() as u64) < s.waiting {
        let _ = writeln!(out, "  ... and {} more", s.waiting - s.line.len() as u64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_at_a_glance() {
        assert_eq!(duration_ms(850), "850ms");
        assert_eq!(duration_ms(12_345), "12.3s");
        assert_eq!(duration_ms(303_000), "5m03s");
        assert_eq!(duration_ms(7_500_000), "2h05m");
        assert_eq!(duration_ms(100_000_000), "1d03h");
        assert_eq!(duration_ms(-1), "overdue");
    }

    #[test]
    fn tables_align() {
        let t = table(
            &["A", "BB", "C"],
            &[vec!["xxx".into(), "y".into(), "long last".into()]],
        );
        assert_eq!(t, "A    BB  C\nxxx  y   long last\n");
    }
}
