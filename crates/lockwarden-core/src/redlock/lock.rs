//! [`RedlockLock`]: one named Redlock, and the loop that runs rounds until one wins.

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::{join_all, select_all};
use tokio::time::Instant;

use super::guard::RedlockGuard;
use super::nodes::Nodes;
use super::round::{jitter, round, Round};
use crate::error::{KeyError, LockError};
use crate::key::Key;
use crate::lock::checked;
use crate::metrics::{self, Acquired};

/// Without a notice, a waiter re-checks after this many retry delays at the latest.
const RECHECK_DELAYS: u32 = 10;

/// One named Redlock, made by [`Redlock::lock`](crate::Redlock::lock).
///
/// ```no_run
/// # use lockwarden_core::Redlock;
/// # use std::time::Duration;
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lockwarden_core::LockError> {
/// # let redlock = Redlock::connect(&["redis://10.0.0.1/", "redis://10.0.0.2/", "redis://10.0.0.3/"]).await?;
/// let lock = redlock.lock("invoice:17");
/// let guard = lock.try_acquire(Duration::from_millis(500)).await?;
/// # guard.release().await }
/// ```
#[derive(Debug, Clone)]
#[must_use = "a RedlockLock does nothing until it is acquired"]
pub struct RedlockLock {
    nodes: Arc<Nodes>,
    key: Result<Key, KeyError>,
}

impl RedlockLock {
    pub(super) fn new(nodes: Arc<Nodes>, key: Result<Key, KeyError>) -> Self {
        Self { nodes, key }
    }

    /// The validated key.
    ///
    /// # Errors
    /// [`LockError::InvalidKey`] if the name was rejected.
    pub fn key(&self) -> Result<&Key, LockError> {
        checked(&self.key)
    }

    /// Acquires the lock on a majority of the nodes, waiting at most `wait` (zero: one
    /// round). Not re-entrant: a second acquisition waits like any other holder.
    ///
    /// Dropping the returned future at any point never leaves the lock held beyond the
    /// background release (or, for a node that answers too late, beyond its lease).
    ///
    /// # Errors
    /// [`LockError::Timeout`] if another holder kept it for the whole budget;
    /// [`RedlockError::NoQuorum`](crate::RedlockError::NoQuorum) if too few nodes answered; [`RedlockError::TooSlow`](crate::RedlockError::TooSlow)
    /// if a majority answered too late for the lease; [`LockError::InvalidKey`].
    pub async fn try_acquire(&self, wait: Duration) -> Result<RedlockGuard, LockError> {
        let key = self.key()?;
        let started = Instant::now();
        let deadline = started.checked_add(wait);
        let nodes = &self.nodes;
        let config = &nodes.config;
        let mut waiting = None;
        loop {
            let failure = match round(nodes, key).await {
                Round::Won(held) => {
                    metrics::acquired("redlock", Acquired::Taken, started.elapsed());
                    tracing::debug!(%key, waited_ms = started.elapsed().as_millis() as u64,
                        "redlock acquired");
                    return Ok(RedlockGuard::new(nodes.clone(), held));
                }
                Round::Lost(failure) => failure,
            };
            let now = Instant::now();
            if deadline.is_some_and(|d| now >= d) {
                tracing::debug!(%key, ?failure, "redlock acquire gave up");
                let error = failure.into_error(key, nodes.clients.len(), config);
                let outcome = match &error {
                    LockError::Timeout { .. } if wait.is_zero() => Acquired::Busy,
                    LockError::Timeout { .. } => Acquired::Timeout,
                    _ => Acquired::Error,
                };
                metrics::acquired("redlock", outcome, started.elapsed());
                return Err(error);
            }
            let cap = |at: Instant| deadline.map_or(at, |d| at.min(d));
            // Nobody holds a majority (a split vote, or nodes down): retry after a random
            // pause, so contenders that failed together do not retry together.
            let Some(ttl) = failure
                .busy
                .filter(|_| failure.busy_nodes >= nodes.quorum())
            else {
                tokio::time::sleep_until(cap(now + jitter(config.retry_delay))).await;
                continue;
            };
            let wake_at = cap(now + ttl.min(config.retry_delay * RECHECK_DELAYS));
            match &waiting {
                // First wait: subscribe on every node, then retry at once, so a release
                // between the round and the subscriptions is not missed. A stopped node
                // delays this by the node timeout at most.
                None => {
                    let w: Vec<_> = nodes
                        .clients
                        .iter()
                        .map(|n| n.waiting(key.channel()))
                        .collect();
                    let ready_by = wake_at.min(Instant::now() + config.node_timeout);
                    join_all(w.iter().map(|w| w.ready_by(ready_by))).await;
                    waiting = Some(w);
                }
                Some(w) => {
                    let notices = select_all(w.iter().map(|w| Box::pin(w.notified())));
                    tokio::select! {
                        _ = notices => {}
                        _ = tokio::time::sleep_until(wake_at) => {}
                    }
                }
            }
        }
    }
}
