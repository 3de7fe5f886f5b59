//! One Redlock round: ask every node at once, count the grants, and keep the lock only
//! with a majority inside the validity; otherwise undo the round everywhere.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::join_all;
use tokio::time::Instant;

use super::nodes::{Config, Nodes};
use crate::error::{BackendError, LockError, RedlockError};
use crate::guard::LockGuard;
use crate::holder::Holder;
use crate::key::Key;

/// A lock won on a majority: the guard of each granting node. Dropping it releases every
/// one in the background (the caller went away, or the guard was dropped).
pub(super) struct Held {
    pub(super) guards: Vec<LockGuard>,
    pub(super) key: Key,
    pub(super) holder: Holder,
    pub(super) token: u64,
    pub(super) valid_until: Instant,
}

pub(super) enum Round {
    Won(Held),
    Lost(Failure),
}

/// Why a round did not win, for the next wait and the final error.
#[derive(Debug)]
pub(super) struct Failure {
    pub(super) granted: usize,
    /// Nodes that have another holder.
    pub(super) busy_nodes: usize,
    /// Nodes that failed or did not answer in time.
    pub(super) failed_nodes: usize,
    /// Some node has another holder: the shortest lease it reported.
    pub(super) busy: Option<Duration>,
    /// A majority granted, but after the validity had run out.
    pub(super) too_slow: Option<Duration>,
}

impl Failure {
    pub(super) fn into_error(self, key: &Key, nodes: usize, config: &Config) -> LockError {
        let key = key.name().to_owned();
        let needed = nodes / 2 + 1;
        // Too few nodes answered for anyone to win: say so rather than blame a holder.
        let reachable = nodes - self.failed_nodes >= needed;
        if let Some(retry_after) = self.busy.filter(|_| reachable) {
            return LockError::Timeout { key, retry_after };
        }
        if let Some(elapsed) = self.too_slow {
            return RedlockError::TooSlow {
                key,
                elapsed,
                lease: config.lease,
            }
            .into();
        }
        RedlockError::NoQuorum {
            key,
            granted: self.granted,
            needed,
            nodes,
        }
        .into()
    }
}

/// One node's answer in a round.
enum Answer {
    Granted(LockGuard),
    /// Another holder has it, for this long at most.
    Busy(Duration),
    Failed(LockError),
}

/// One round for `key`. Dropped midway, it leaves nothing held: a node's acquire that is
/// still in flight gives back what it takes, and a granted node's guard releases on drop.
pub(super) async fn round(nodes: &Arc<Nodes>, key: &Key) -> Round {
    let config = &nodes.config;
    // A fresh holder per round: a release of an earlier round that arrives late cannot
    // free this one's hold.
    let holder = nodes.clients[0].holder();
    let started = Instant::now();
    let answers = join_all(nodes.clients.iter().map(|node| {
        let lock = node.lock_at(key).holder(&holder).lease(config.lease);
        async move {
            match tokio::time::timeout(config.node_timeout, lock.try_acquire(Duration::ZERO)).await
            {
                Ok(Ok(guard)) => Answer::Granted(guard),
                Ok(Err(LockError::Timeout { retry_after, .. })) => Answer::Busy(retry_after),
                Ok(Err(error)) => Answer::Failed(error),
                Err(_) => Answer::Failed(BackendError::TimedOut(config.node_timeout).into()),
            }
        }
    }))
    .await;
    let elapsed = started.elapsed();
    let valid_until = started + config.lease.saturating_sub(config.drift());

    let granted = answers
        .iter()
        .filter(|a| matches!(a, Answer::Granted(_)))
        .count();
    let quorum = nodes.quorum();
    if granted >= quorum && Instant::now() < valid_until {
        let guards: Vec<LockGuard> = answers
            .into_iter()
            .filter_map(|a| match a {
                Answer::Granted(guard) => Some(guard),
                _ => None,
            })
            .collect();
        // The largest token of the majority: see `RedlockGuard::fencing_token`.
        let token = guards
            .iter()
            .map(LockGuard::fencing_token)
            .max()
            .unwrap_or(0);
        return Round::Won(Held {
            guards,
            key: key.clone(),
            holder,
            token,
            valid_until,
        });
    }

    let mut failure = Failure {
        granted,
        busy_nodes: 0,
        failed_nodes: 0,
        busy: None,
        too_slow: (granted >= quorum).then_some(elapsed),
    };
    // Undo the round everywhere it may have taken effect: granted nodes, and failed ones
    // whose script may have run after all. Busy nodes are someone else's.
    let mut granted_guards = Vec::new();
    let mut failed_nodes = Vec::new();
    for (i, answer) in answers.into_iter().enumerate() {
        match answer {
            Answer::Granted(guard) => granted_guards.push(guard),
            Answer::Busy(ttl) => {
                failure.busy_nodes += 1;
                failure.busy = Some(failure.busy.map_or(ttl, |b: Duration| b.min(ttl)));
            }
            Answer::Failed(error) => {
                tracing::debug!(%key, node = i, %error, "redlock node failed in a round");
                failure.failed_nodes += 1;
                failed_nodes.push(nodes.clients[i].lock_at(key));
            }
        }
    }
    release_all(granted_guards, config.node_timeout).await;
    let undo = failed_nodes.into_iter().map(|lock| {
        let holder = holder.clone();
        // On a task of its own, so it is sent even if this wait is abandoned.
        let release = tokio::spawn(async move { lock.release_as(&holder).await });
        tokio::time::timeout(config.node_timeout, release)
    });
    join_all(undo).await;
    Round::Lost(failure)
}

/// Releases each guard, waiting for each at most `timeout` (a release still in flight
/// then completes in the background). Returns how many nodes confirmed the release.
pub(super) async fn release_all(guards: Vec<LockGuard>, timeout: Duration) -> usize {
    let releases = guards
        .into_iter()
        .map(|guard| tokio::time::timeout(timeout, guard.release()));
    join_all(releases)
        .await
        .into_iter()
        .filter(|released| matches!(released, Ok(Ok(()))))
        .count()
}

/// A random duration in `[0, max]`, from the standard library's randomly keyed hasher.
pub(super) fn jitter(max: Duration) -> Duration {
    let random = RandomState::new().build_hasher().finish();
    max.mul_f64(random as f64 / u64::MAX as f64)
}
