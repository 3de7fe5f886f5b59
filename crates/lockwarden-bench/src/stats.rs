//! Percentiles, throughput windows, handoff timing, and the report (markdown + JSON).

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

/// Median and p99 of a set of samples (nearest rank). `NaN` when there were none.
#[derive(Debug, Clone, Copy)]
pub struct Summary {
    pub n: usize,
    pub median: f64,
    pub p99: f64,
}

impl Summary {
    pub fn of(mut values: Vec<f64>) -> Self {
        values.sort_by(f64::total_cmp);
        Self {
            n: values.len(),
            median: percentile(&values, 0.50),
            p99: percentile(&values, 0.99),
        }
    }

    /// Durations, in microseconds.
    pub fn micros(samples: &[Duration]) -> Self {
        Self::of(samples.iter().map(|d| d.as_secs_f64() * 1e6).collect())
    }

    /// Rates, where the bad tail is the low end: `p99` is the rate 99% of samples beat.
    pub fn rates(mut values: Vec<f64>) -> Self {
        values.sort_by(f64::total_cmp);
        Self {
            n: values.len(),
            median: percentile(&values, 0.50),
            p99: percentile(&values, 0.01),
        }
    }
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = (p * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// Completed operations per window (100 ms unless made [`with_width`](Self::with_width)),
/// for throughput median/p99.
pub struct Windows {
    start: Instant,
    width: Duration,
    full: usize,
    counts: Vec<AtomicU64>,
}

const WINDOW: Duration = Duration::from_millis(100);

impl Windows {
    pub fn new(start: Instant, run: Duration) -> Self {
        Self::with_width(start, run, WINDOW)
    }

    pub fn with_width(start: Instant, run: Duration, width: Duration) -> Self {
        let full = (run.as_nanos() / width.as_nanos()) as usize;
        Self {
            start,
            width,
            full,
            // One overflow window collects completions after the run's end.
            counts: (0..=full).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    pub fn record(&self) {
        let i = (self.start.elapsed().as_nanos() / self.width.as_nanos()) as usize;
        self.counts[i.min(self.full)].fetch_add(1, Ordering::Relaxed);
    }

    /// Operations per second in each full window of the run.
    pub fn summary(&self) -> Summary {
        Summary::rates(self.rates_until(Duration::MAX))
    }

    /// Operations per second in each full window that ended within `end` of the start
    /// (for runs that may stop before their time limit).
    pub fn rates_until(&self, end: Duration) -> Vec<f64> {
        let per_sec = 1.0 / self.width.as_secs_f64();
        let windows = (end.as_nanos() / self.width.as_nanos()).min(self.full as u128) as usize;
        self.counts[..windows]
            .iter()
            .map(|c| c.load(Ordering::Relaxed) as f64 * per_sec)
            .collect()
    }
}

/// Handoff timing on one key: the holder notes when it starts releasing, the next
/// holder reads it as soon as its acquire returns. The lock itself orders the two.
#[derive(Default)]
pub struct Handoff {
    slot: Mutex<Option<(Instant, usize)>>,
}

impl Handoff {
    pub fn releasing(&self, task: usize) {
        *self.slot.lock().unwrap_or_else(|e| e.into_inner()) = Some((Instant::now(), task));
    }

    /// Time since the previous holder started releasing, and whether it was `task` itself.
    pub fn acquired(&self, task: usize, now: Instant) -> Option<(Duration, bool)> {
        let prev = self.slot.lock().unwrap_or_else(|e| e.into_inner()).take();
        prev.map(|(at, by)| (now.saturating_duration_since(at), by == task))
    }
}

/// One line of the results table.
#[derive(Debug, Clone)]
pub struct Row {
    pub workload: String,
    pub implementation: String,
    pub metric: String,
    pub unit: &'static str,
    pub median: f64,
    pub p99: Option<f64>,
    pub n: usize,
    pub ratio: Option<(f64, String)>,
    /// Commands Redis ran per operation, script-inner calls included (`INFO commandstats`).
    pub redis_commands: Option<f64>,
    pub notes: String,
}

impl Row {
    pub fn new(workload: &str, implementation: &str, metric: &str, unit: &'static str) -> Self {
        Self {
            workload: workload.to_owned(),
            implementation: implementation.to_owned(),
            metric: metric.to_owned(),
            unit,
            median: f64::NAN,
            p99: None,
            n: 0,
            ratio: None,
            redis_commands: None,
            notes: String::new(),
        }
    }

    pub fn summary(mut self, s: Summary) -> Self {
        self.median = s.median;
        self.p99 = Some(s.p99);
        self.n = s.n;
        self
    }

    pub fn value(mut self, v: f64) -> Self {
        self.median = v;
        self.n = 1;
        self
    }

    /// The median divided by `baseline`, described as `what`.
    pub fn ratio_to(mut self, baseline: f64, what: &str) -> Self {
        self.ratio = Some((self.median / baseline, what.to_owned()));
        self
    }

    pub fn redis_commands(mut self, per_op: f64) -> Self {
        self.redis_commands = Some(per_op);
        self
    }

    pub fn note(mut self, note: impl Into<String>) -> Self {
        if !self.notes.is_empty() {
            self.notes.push_str("; ");
        }
        self.notes.push_str(&note.into());
        self
    }
}

/// Everything one run produced.
#[derive(Default)]
pub struct Report {
    pub rows: Vec<Row>,
    pub problems: Vec<String>,
}

impl Report {
    pub fn push(&mut self, row: Row) {
        eprintln!(
            "  {:<22} {:<36} median {} p99 {}",
            row.implementation,
            row.metric,
            num(row.median, row.unit),
            row.p99.map_or("-".into(), |p| num(p, row.unit)),
        );
        self.rows.push(row);
    }

    pub fn markdown(&self) -> String {
        let mut out = String::from(
            "| workload | implementation | metric | median | p99 | ratio to baseline | Redis cmds/op | notes |\n\
             |---|---|---|---:|---:|---|---:|---|\n",
        );
        for r in &self.rows {
            let ratio = r
                .ratio
                .as_ref()
                .map_or(String::new(), |(x, what)| format!("{x:.2} ({what})"));
            let _ = writeln!(
                out,
                "| {} | {} | {} | {} | {} | {} | {} | {} |",
                r.workload,
                r.implementation,
                r.metric,
                num(r.median, r.unit),
                r.p99.map_or("-".into(), |p| num(p, r.unit)),
                ratio,
                r.redis_commands
                    .map_or(String::new(), |c| format!("{c:.1}")),
                r.notes,
            );
        }
        out
    }

    pub fn json(&self, meta: Value) -> Value {
        let rows: Vec<Value> = self
            .rows
            .iter()
            .map(|r| {
                json!({
                    "workload": r.workload,
                    "implementation": r.implementation,
                    "metric": r.metric,
                    "unit": r.unit,
                    "median": r.median,
                    "p99": r.p99,
                    "samples": r.n,
                    "ratio": r.ratio.as_ref().map(|(x, _)| *x),
                    "ratio_to": r.ratio.as_ref().map(|(_, what)| what.clone()),
                    "redis_commands": r.redis_commands,
                    "notes": r.notes,
                })
            })
            .collect();
        json!({ "meta": meta, "rows": rows, "problems": self.problems })
    }
}

/// A number with about three significant digits and its unit.
pub fn num(v: f64, unit: &str) -> String {
    let digits = match v.abs() {
        x if x.is_nan() => return "n/a".into(),
        _ if v.fract() == 0.0 => 0,
        x if x >= 100.0 => 0,
        x if x >= 10.0 => 1,
        _ => 2,
    };
    if unit.is_empty() {
        format!("{v:.digits$}")
    } else {
        format!("{v:.digits$} {unit}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let s = Summary::of((1..=100).map(f64::from).collect());
        assert_eq!((s.median, s.p99, s.n), (50.0, 99.0, 100));
        let r = Summary::rates((1..=100).map(f64::from).collect());
        assert_eq!(r.p99, 1.0);
        assert!(Summary::of(vec![]).median.is_nan());
    }

    #[test]
    fn windows_until_leave_out_the_unfinished_ones() {
        let start = Instant::now() - Duration::from_millis(250);
        let windows = Windows::new(start, Duration::from_secs(1));
        windows.record(); // lands in the third window, which has not ended at 250 ms
        assert_eq!(
            windows.rates_until(Duration::from_millis(250)),
            vec![0.0, 0.0]
        );
        assert_eq!(windows.rates_until(Duration::from_millis(300))[2], 10.0);
        assert_eq!(windows.summary().n, 10);
    }
}
