//! The node set of a Redlock and its settings, shared by its handles and guards.

use std::time::Duration;

use crate::client::LockClient;
use crate::error::RedlockError;

const DEFAULT_LEASE: Duration = Duration::from_secs(30);
const DEFAULT_DRIFT_FACTOR: f64 = 0.01;
/// Added to the drift: Redis expires keys with millisecond precision.
const DRIFT_FLOOR: Duration = Duration::from_millis(2);
const DEFAULT_NODE_TIMEOUT: Duration = Duration::from_millis(100);
const DEFAULT_RETRY_DELAY: Duration = Duration::from_millis(200);
const DEFAULT_MAX_EXTENSIONS: u32 = 10;

/// The clients of the nodes, one per independent Redis master, and the settings.
#[derive(Debug)]
pub(super) struct Nodes {
    pub(super) clients: Vec<LockClient>,
    pub(super) config: Config,
}

impl Nodes {
    /// How many nodes must grant a lock: a strict majority.
    pub(super) fn quorum(&self) -> usize {
        self.clients.len() / 2 + 1
    }
}

#[derive(Debug, Clone)]
pub(super) struct Config {
    pub(super) lease: Duration,
    pub(super) drift_factor: f64,
    pub(super) node_timeout: Duration,
    pub(super) retry_delay: Duration,
    pub(super) max_extensions: u32,
    pub(super) namespace: Option<String>,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            lease: DEFAULT_LEASE,
            drift_factor: DEFAULT_DRIFT_FACTOR,
            node_timeout: DEFAULT_NODE_TIMEOUT,
            retry_delay: DEFAULT_RETRY_DELAY,
            max_extensions: DEFAULT_MAX_EXTENSIONS,
            namespace: None,
        }
    }
}

impl Config {
    /// How much earlier than the nodes' expiry the holder must consider the lock gone.
    pub(super) fn drift(&self) -> Duration {
        self.lease.mul_f64(self.drift_factor) + DRIFT_FLOOR
    }

    pub(super) fn validate(&self) -> Result<(), RedlockError> {
        if !(0.0..1.0).contains(&self.drift_factor) {
            return Err(RedlockError::InvalidSettings(
                "the clock drift factor must be at least 0 and below 1",
            ));
        }
        if self.node_timeout.is_zero() {
            return Err(RedlockError::InvalidSettings(
                "the node timeout must be above zero",
            ));
        }
        // A round may take the node timeout; the lease must outlast it and the drift.
        if self.lease <= self.node_timeout + self.drift() {
            return Err(RedlockError::InvalidSettings(
                "the lease must be longer than the node timeout plus the clock drift",
            ));
        }
        Ok(())
    }
}
