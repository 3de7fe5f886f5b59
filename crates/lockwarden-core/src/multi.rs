//! Several locks taken as one: [`MultiLock`] and its [`MultiGuard`].
//!
//! All the locks are taken in one step (one script on Redis, one critical section
//! in-process) or none is, so no caller ever holds part of a set while waiting for the
//! rest: two callers wanting overlapping sets cannot deadlock, and no lock is held longer
//! than the work needs. While one of the locks is busy the caller waits for that lock's
//! release notice (or its lease end) and tries the whole set again.

use std::time::Duration;

use tokio::time::Instant;

use crate::backend::{Kind, MultiAttempt};
use crate::client::LockClient;
use crate::error::LockError;
use crate::guard::LockGuard;
use crate::holder::Holder;
use crate::key::Key;
use crate::lock::NO_TTL_RECHECK;
use crate::wait::Wait;

/// Several named locks to acquire as one, made by [`LockClient::multi_lock`].
///
/// ```
/// # use lockwarden_core::LockClient;
/// # use std::time::Duration;
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lockwarden_core::LockError> {
/// let client = LockClient::in_memory();
/// // Move money between two accounts: both or neither, and no deadlock with a transfer
/// // the other way round.
/// let both = client
///     .multi_lock(["account:7", "account:3"])
///     .try_acquire(Duration::from_secs(1))
///     .await?;
/// assert_eq!(both.guards().len(), 2);
/// both.release().await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
#[must_use = "a MultiLock does nothing until it is acquired"]
pub struct MultiLock {
    client: LockClient,
    names: Vec<String>,
    lease: Option<Duration>,
    holder: Option<Holder>,
}

impl MultiLock {
    pub(crate) fn new(client: LockClient, names: Vec<String>) -> Self {
        Self {
            client,
            names,
            lease: None,
            holder: None,
        }
    }

    /// Holds every lock for a fixed lease instead of keeping them alive with the watchdog.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = Some(lease);
        self
    }

    /// Acquires as `holder` (see [`Lock::holder`](crate::Lock::holder)).
    pub fn holder(mut self, holder: &Holder) -> Self {
        self.holder = Some(holder.clone());
        self
    }

    /// Acquires every lock, waiting at most `wait` in all; on failure none stays held.
    ///
    /// # Errors
    /// [`LockError::Timeout`] naming the lock that could not be had,
    /// [`LockError::InvalidKey`] (before anything is taken) or [`LockError::Backend`].
    pub async fn try_acquire(&self, wait: Duration) -> Result<MultiGuard, LockError> {
        let deadline = Instant::now() + wait;
        let mut keys: Vec<Key> = self
            .names
            .iter()
            .map(|name| self.client.key(name))
            .collect::<Result<_, _>>()?;
        // One order for every caller: the guards come back in it, and a store that
        // takes keys one by one would need it to avoid deadlocks.
        keys.sort_unstable_by(|a, b| a.redis_key().cmp(b.redis_key()));
        keys.dedup();
        let holder = self
            .holder
            .clone()
            .or_else(Holder::current)
            .unwrap_or_else(|| self.client.holder());
        let inner = &self.client.inner;
        let lease = self.lease.unwrap_or(inner.config.watchdog_timeout);
        let mut wait = Wait::new(Some(deadline));
        // The lock whose release notice woke us, if the retry has not used it yet.
        let mut woken_by: Option<usize> = None;
        loop {
            let sent = Instant::now();
            let (index, ttl) = match inner.backend.attempt_many(&keys, &holder, lease).await {
                Ok(MultiAttempt::Taken { tokens }) => {
                    let guards = keys
                        .into_iter()
                        .zip(tokens)
                        .map(|(key, token)| {
                            LockGuard::new(
                                self.client.clone(),
                                Kind::Plain,
                                key,
                                holder.clone(),
                                token,
                                self.lease,
                                None,
                                sent,
                            )
                        })
                        .collect();
                    return Ok(MultiGuard { guards });
                }
                Ok(MultiAttempt::Busy { index, ttl }) => (index, ttl.unwrap_or(NO_TTL_RECHECK)),
                Err(error) if error.is_transient() && wait.can_back_off() => {
                    wait.back_off().await;
                    continue;
                }
                Err(error) => return Err(error.into()),
            };
            // A notice for a lock we then did not take is passed on to the next local
            // waiter of that lock, which may well get it.
            if let Some(woken) = woken_by.take().filter(|&w| w != index) {
                inner.waiters.notify_one(keys[woken].channel());
            }
            let now = Instant::now();
            if wait.is_over(now) {
                return Err(LockError::Timeout {
                    key: keys[index].name().to_owned(),
                    retry_after: ttl,
                });
            }
            let channel = keys[index].channel();
            if wait
                .sleep(&inner.waiters, channel, wait.cap(now + ttl))
                .await
            {
                woken_by = Some(index);
            }
        }
    }
}

/// Proof that every lock of a [`MultiLock`] is held; dropping it releases them all in
/// the background, [`release`](Self::release) releases them and reports.
#[must_use = "the locks are released as soon as the guard is dropped"]
#[derive(Debug)]
pub struct MultiGuard {
    guards: Vec<LockGuard>,
}

impl MultiGuard {
    /// The guard of each lock, in acquisition (key) order.
    pub fn guards(&self) -> &[LockGuard] {
        &self.guards
    }

    /// Whether any of the locks has been lost.
    pub fn is_lost(&self) -> bool {
        self.guards.iter().any(LockGuard::is_lost)
    }

    /// Releases every lock, all of them even if one fails. The releases are sent
    /// together, so on Redis they share one round trip.
    ///
    /// # Errors
    /// The first failure in key order, as [`LockGuard::release`] reports it.
    pub async fn release(self) -> Result<(), LockError> {
        let released =
            futures_util::future::join_all(self.guards.into_iter().map(LockGuard::release));
        released.await.into_iter().collect()
    }
}
