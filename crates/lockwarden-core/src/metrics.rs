//! What the engine records through the `metrics` facade: every name and label in one
//! place (the table in `guide/operating.md` lists them). Without an installed recorder each
//! call is a thread-local check and an atomic load: every metric's keys (name and labels,
//! hashed) are made once per process and kept, so recording allocates and hashes
//! nothing. Never a lock's name: keys come from requests and would make every series
//! unique.

use std::sync::OnceLock;
use std::time::Duration;

use metrics::{Key, Label, Level, Metadata};

use crate::error::BackendError;

const ACQUISITIONS: &str = "lockwarden_acquisitions_total";
const ACQUIRE_WAIT: &str = "lockwarden_acquire_wait_seconds";
const HOLD: &str = "lockwarden_hold_seconds";
const LOST: &str = "lockwarden_locks_lost_total";
const RENEWALS: &str = "lockwarden_renewals_total";
const RENEWAL_BATCH: &str = "lockwarden_renewal_batch_seconds";
const RENEWAL_OVERRUNS: &str = "lockwarden_renewal_overruns_total";
const WAITERS: &str = "lockwarden_waiters";
const SUBSCRIPTIONS: &str = "lockwarden_subscriptions";
const BACKEND_ERRORS: &str = "lockwarden_backend_errors_total";
const PERMITS_HELD: &str = "lockwarden_permits_held";
const PERMITS_WAITING: &str = "lockwarden_permits_waiting";
const RATE_DECISIONS: &str = "lockwarden_rate_decisions_total";

static METADATA: Metadata<'static> =
    Metadata::new(module_path!(), Level::INFO, Some(module_path!()));

/// Lock kinds, as the `kind` label says them.
const KINDS: [&str; 7] = [
    "plain", "fair", "read", "write", "multi", "redlock", "permits",
];

/// How an acquire call ended (the `outcome` label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Acquired {
    /// A new hold.
    Taken,
    /// The holder held it already.
    Reentered,
    /// A claim found the work done.
    Completed,
    /// Refused at once: the call had no wait budget (a fail-fast attempt).
    Busy,
    /// The wait budget was spent while the lock stayed busy.
    Timeout,
    /// Refused for good (an upgrade from read to write).
    Refused,
    /// The store failed.
    Error,
}

const OUTCOMES: [&str; 7] = [
    "taken",
    "reentered",
    "completed",
    "busy",
    "timeout",
    "refused",
    "error",
];

/// Why a held lock was lost (the `reason` label).
#[derive(Debug, Clone, Copy)]
pub(crate) enum LostBecause {
    /// A renewal found it gone or held by another holder.
    Gone,
    /// Renewals failed until the lease must have run out.
    RenewalsFailed,
    /// The watchdog stopped at `max_hold`.
    MaxHold,
    /// A fixed lease ran out before the release.
    LeaseEnded,
}

const REASONS: [&str; 4] = ["gone", "renewals_failed", "max_hold", "lease_ended"];

/// What a renewal found (the `outcome` label of renewals).
#[derive(Debug, Clone, Copy)]
pub(crate) enum RenewalOutcome {
    /// Still held: its lease was extended.
    Extended,
    /// Gone or held by another holder.
    Lost,
    /// The store failed (retried until the lease runs out).
    Failed,
}

const RENEWED: [&str; 3] = ["extended", "lost", "failed"];

/// The operation a backend error failed (the `operation` label).
#[derive(Debug, Clone, Copy)]
pub(crate) enum Operation {
    Acquire,
    Release,
    Renew,
    /// A rate limiter's decision, look, refund or reset.
    Rate,
}

const OPERATIONS: [&str; 4] = ["acquire", "release", "renew", "rate"];
const ERRORS: [&str; 8] = [
    "timeout",
    "connection",
    "server",
    "not_replicated",
    "protocol",
    "tls",
    "not_permitted",
    "not_configured",
];

/// Which label value a kind name has: one of [`KINDS`] (an unknown one counts as plain).
fn kind_index(kind: &str) -> usize {
    KINDS.iter().position(|k| *k == kind).unwrap_or(0)
}

/// The keys of one metric, for every combination of the values of its labels (`names`,
/// one list of `values` per name): made once per process and handed out by index. A key
/// hashes its name and labels when it is made, ~500 instructions each time, three times a
/// lock cycle when made per call, and a recorder is asked with a key every time (the
/// metrics facade has no handle that survives a recorder installed later).
struct Keys<N, V> {
    cells: OnceLock<Vec<Key>>,
    metric: &'static str,
    names: N,
    values: V,
}

impl<N, V> Keys<N, V> {
    const fn new(metric: &'static str, names: N, values: V) -> Self {
        Self {
            cells: OnceLock::new(),
            metric,
            names,
            values,
        }
    }
}

/// Two labels.
type Keys2 = Keys<(&'static str, &'static str), (&'static [&'static str], &'static [&'static str])>;
/// One label.
type Keys1 = Keys<&'static str, &'static [&'static str]>;

impl Keys2 {
    fn get(&'static self, a: usize, b: usize) -> &'static Key {
        let cells = self.cells.get_or_init(|| {
            let (first, second) = self.values;
            let mut cells = Vec::with_capacity(first.len() * second.len());
            for x in first {
                for y in second {
                    let labels = vec![
                        Label::from_static_parts(self.names.0, x),
                        Label::from_static_parts(self.names.1, y),
                    ];
                    cells.push(Key::from_parts(self.metric, labels));
                }
            }
            cells
        });
        &cells[a * self.values.1.len() + b]
    }
}

impl Keys1 {
    fn get(&'static self, at: usize) -> &'static Key {
        let cells = self.cells.get_or_init(|| {
            let key = |value| {
                let labels = vec![Label::from_static_parts(self.names, value)];
                Key::from_parts(self.metric, labels)
            };
            self.values.iter().copied().map(key).collect()
        });
        &cells[at]
    }
}

static ACQUISITION: Keys2 = Keys2::new(ACQUISITIONS, ("kind", "outcome"), (&KINDS, &OUTCOMES));
static WAITED: Keys2 = Keys2::new(ACQUIRE_WAIT, ("kind", "outcome"), (&KINDS, &OUTCOMES));
static HELD: Keys1 = Keys1::new(HOLD, "kind", &KINDS);
static LOSS: Keys2 = Keys2::new(LOST, ("kind", "reason"), (&KINDS, &REASONS));
static RENEWAL: Keys1 = Keys1::new(RENEWALS, "outcome", &RENEWED);
static BACKEND_ERROR: Keys2 = Keys2::new(
    BACKEND_ERRORS,
    ("operation", "error"),
    (&OPERATIONS, &ERRORS),
);
static RENEWAL_BATCH_TOOK: Key = Key::from_static_name(RENEWAL_BATCH);
static RENEWAL_OVERRAN: Key = Key::from_static_name(RENEWAL_OVERRUNS);
static WAITING: Key = Key::from_static_name(WAITERS);
static SUBSCRIBED: Key = Key::from_static_name(SUBSCRIPTIONS);
static HELD_PERMITS: Key = Key::from_static_name(PERMITS_HELD);
static WAITING_PERMITS: Key = Key::from_static_name(PERMITS_WAITING);

fn counter(key: &Key, by: u64) {
    metrics::with_recorder(|r| r.register_counter(key, &METADATA).increment(by));
}

fn histogram(key: &Key, value: Duration) {
    metrics::with_recorder(|r| {
        r.register_histogram(key, &METADATA)
            .record(value.as_secs_f64())
    });
}

fn gauge(key: &Key, delta: f64) {
    metrics::with_recorder(|r| r.register_gauge(key, &METADATA).increment(delta));
}

/// An acquire call of `kind` ended with `outcome` after `waited`.
pub(crate) fn acquired(kind: &str, outcome: Acquired, waited: Duration) {
    let (kind, outcome) = (kind_index(kind), outcome as usize);
    counter(ACQUISITION.get(kind, outcome), 1);
    histogram(WAITED.get(kind, outcome), waited);
}

/// A hold of `kind` ended (released or dropped) after `held`.
pub(crate) fn held(kind: &str, held: Duration) {
    histogram(HELD.get(kind_index(kind)), held);
}

/// A hold of `kind` was lost.
pub(crate) fn lost(kind: &str, because: LostBecause) {
    counter(LOSS.get(kind_index(kind), because as usize), 1);
}

/// `count` renewals of one batch found `outcome`.
pub(crate) fn renewals(outcome: RenewalOutcome, count: usize) {
    if count > 0 {
        counter(RENEWAL.get(outcome as usize), count as u64);
    }
}

/// One renewal batch took `took`; `overran` if longer than the renewal interval.
pub(crate) fn renewal_batch(took: Duration, overran: bool) {
    histogram(&RENEWAL_BATCH_TOOK, took);
    if overran {
        counter(&RENEWAL_OVERRAN, 1);
    }
}

/// A waiter registered (`+1`) or went away (`-1`).
pub(crate) fn waiters(delta: f64) {
    gauge(&WAITING, delta);
}

/// Semaphore permits this client holds went up or down by `delta`.
pub(crate) fn permits_held(delta: f64) {
    gauge(&HELD_PERMITS, delta);
}

/// Acquisitions of this client waiting in a semaphore's line went up or down by `delta`.
pub(crate) fn permits_waiting(delta: f64) {
    gauge(&WAITING_PERMITS, delta);
}

/// Release channels subscribed on Redis went up or down by `delta`.
pub(crate) fn subscriptions(delta: f64) {
    gauge(&SUBSCRIBED, delta);
}

/// `operation` failed with `error`.
pub(crate) fn backend_error(operation: Operation, error: &BackendError) {
    let kind = match error {
        BackendError::TimedOut(_) => 0,
        BackendError::Redis(e) if e.is_timeout() => 0,
        BackendError::Unreachable(_) => 1,
        BackendError::Redis(e) if e.is_io_error() || e.is_connection_dropped() => 1,
        BackendError::Redis(e) if e.is_connection_refusal() => 1,
        BackendError::Redis(_) => 2,
        BackendError::NotReplicated { .. } => 3,
        BackendError::Protocol(_) => 4,
        BackendError::Tls { .. } => 5,
        BackendError::NotPermitted { .. } => 6,
        // Only connecting answers these two: a URL is a setting too.
        BackendError::NotConfigured(_) | BackendError::InvalidUrl { .. } => 7,
        BackendError::Connect { source, .. } => return backend_error(operation, source),
    };
    counter(BACKEND_ERROR.get(operation as usize, kind), 1);
}

/// The decisions of one rate limiter, per policy (labels `limiter`, `policy`, `outcome`):
/// their keys made once, with the limiter (names are the application's, a few per
/// process; never a request's key).
pub(crate) struct RateSeries {
    /// Per policy: `allowed`, `refused`.
    keys: Box<[[Key; 2]]>,
}

impl RateSeries {
    /// The series of `limiter`'s `policies`, in their order.
    pub(crate) fn new<'a>(limiter: &str, policies: impl Iterator<Item = &'a str>) -> Self {
        let key = |policy: &str, outcome: &'static str| {
            let labels = vec![
                Label::new("limiter", limiter.to_owned()),
                Label::new("policy", policy.to_owned()),
                Label::from_static_parts("outcome", outcome),
            ];
            Key::from_parts(RATE_DECISIONS, labels)
        };
        Self {
            keys: policies
                .map(|policy| [key(policy, "allowed"), key(policy, "refused")])
                .collect(),
        }
    }

    /// A request was admitted, so charged to every policy.
    pub(crate) fn allowed(&self) {
        for [allowed, _] in &*self.keys {
            counter(allowed, 1);
        }
    }

    /// A request was refused, by each policy for which `by` says so (a request two
    /// policies refuse counts for both; one that would have admitted it counts nothing).
    pub(crate) fn refused(&self, by: impl Iterator<Item = bool>) {
        for ([_, refused], by) in self.keys.iter().zip(by) {
            if by {
                counter(refused, 1);
            }
        }
    }
}
