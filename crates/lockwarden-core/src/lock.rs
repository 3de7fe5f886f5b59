//! A handle on one named lock: configure it, acquire it, inspect it.

use std::time::Duration;

use tokio::time::Instant;

use crate::backend::{Attempt, Kind};
use crate::client::LockClient;
use crate::error::{BackendError, KeyError, LockError};
use crate::guard::LockGuard;
use crate::holder::Holder;
use crate::key::Key;
use crate::wait::Wait;

/// Used when Redis reports a lock without expiry: re-check this often.
pub(crate) const NO_TTL_RECHECK: Duration = Duration::from_secs(1);

/// What [`Lock::try_claim`] found: the lock, to do the work, or the outcome of the work
/// done before under the same key.
#[derive(Debug)]
#[must_use = "a claim holds the lock, or carries an outcome to answer with"]
pub enum Claim {
    /// The work is not done yet: do it, then [`LockGuard::complete`] with its outcome.
    Acquired(LockGuard),
    /// The work was done: the outcome its holder stored.
    Completed(Vec<u8>),
}

/// One named lock, made by [`LockClient::lock`]. Set options, then acquire or inspect.
///
/// ```
/// # use lockwarden_core::LockClient;
/// # use std::time::Duration;
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lockwarden_core::LockError> {
/// let client = LockClient::in_memory();
/// let guard = client
///     .lock("export:2026-11")
///     .lease(Duration::from_secs(60)) // fixed lease: expires by itself, no watchdog
///     .try_acquire(Duration::from_millis(500))
///     .await?;
/// assert!(client.lock("export:2026-11").is_locked().await?);
/// guard.release().await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
#[must_use = "a Lock does nothing until it is acquired or inspected"]
pub struct Lock {
    client: LockClient,
    key: Result<Key, KeyError>,
    lease: Option<Duration>,
    max_hold: Option<Duration>,
    holder: Option<Holder>,
}

impl Lock {
    pub(crate) fn new(client: LockClient, key: Result<Key, KeyError>) -> Self {
        Self {
            client,
            key,
            lease: None,
            max_hold: None,
            holder: None,
        }
    }

    /// Holds the lock for a fixed lease instead of keeping it alive with the watchdog:
    /// it expires `lease` after acquisition unless released sooner.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = Some(lease);
        self
    }

    /// Caps how long the watchdog keeps the lock alive; after `max_hold` it expires even
    /// if the guard still lives (and the guard reports it lost).
    pub fn max_hold(mut self, max_hold: Duration) -> Self {
        self.max_hold = Some(max_hold);
        self
    }

    /// Acquires as `holder` (re-entering if it already holds the lock). Without this, the
    /// holder of the enclosing [`Holder::scope`] is used, or else a fresh one.
    pub fn holder(mut self, holder: &Holder) -> Self {
        self.holder = Some(holder.clone());
        self
    }

    /// The validated key.
    ///
    /// # Errors
    /// [`LockError::InvalidKey`] if the name was rejected.
    pub fn key(&self) -> Result<&Key, LockError> {
        self.key
            .as_ref()
            .map_err(|e| LockError::InvalidKey(e.clone()))
    }

    /// Acquires the lock, waiting as long as it takes (also through a Redis outage, retrying
    /// with backoff: use [`try_acquire`](Self::try_acquire) for a bound).
    ///
    /// # Errors
    /// [`LockError::InvalidKey`] or [`LockError::Backend`].
    pub async fn acquire(&self) -> Result<LockGuard, LockError> {
        self.acquire_until(None).await
    }

    /// Acquires the lock, waiting at most `wait` (zero: one attempt). Waiting sleeps until
    /// a release notice or the holder's lease end; it never polls.
    ///
    /// Dropping the returned future at any point never leaves the lock held.
    ///
    /// # Errors
    /// [`LockError::Timeout`] with the holder's remaining lease once `wait` is spent,
    /// [`LockError::InvalidKey`] or [`LockError::Backend`].
    pub async fn try_acquire(&self, wait: Duration) -> Result<LockGuard, LockError> {
        self.acquire_until(Instant::now().checked_add(wait)).await
    }

    /// Claims a piece of work that must be done once: returns the outcome stored by the
    /// holder that completed it (see [`LockGuard::complete`]), else acquires the lock as
    /// [`try_acquire`](Self::try_acquire) does, still looking for an outcome on every
    /// retry. One round trip either way; a completion wakes every claim waiting for it.
    ///
    /// ```
    /// # use lockwarden_core::{Claim, LockClient};
    /// # use std::time::Duration;
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lockwarden_core::LockError> {
    /// let client = LockClient::in_memory();
    /// let charge = client.lock("charge:evt_81");
    /// let receipt = match charge.try_claim(Duration::from_secs(1)).await? {
    ///     Claim::Acquired(guard) => {
    ///         let receipt = b"charged 12.00".to_vec(); // the work, done once
    ///         guard.complete(receipt.clone(), Duration::from_secs(24 * 3600)).await?;
    ///         receipt
    ///     }
    ///     Claim::Completed(receipt) => receipt,
    /// };
    /// // A retry finds the outcome instead of doing the work again.
    /// assert!(matches!(charge.try_claim(Duration::ZERO).await?, Claim::Completed(r) if r == receipt));
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As [`try_acquire`](Self::try_acquire).
    pub async fn try_claim(&self, wait: Duration) -> Result<Claim, LockError> {
        self.claim_until(Instant::now().checked_add(wait), true)
            .await
    }

    async fn acquire_until(&self, deadline: Option<Instant>) -> Result<LockGuard, LockError> {
        match self.claim_until(deadline, false).await? {
            Claim::Acquired(guard) => Ok(guard),
            Claim::Completed(_) => Err(LockError::Backend(BackendError::Protocol(
                "the store answered a plain acquire with a stored outcome".to_owned(),
            ))),
        }
    }

    async fn claim_until(
        &self,
        deadline: Option<Instant>,
        claim: bool,
    ) -> Result<Claim, LockError> {
        let key = self.key()?;
        let holder = self
            .holder
            .clone()
            .or_else(Holder::current)
            .unwrap_or_else(|| self.client.holder());
        let inner = &self.client.inner;
        let lease = self.lease.unwrap_or(inner.config.watchdog_timeout);
        let started = Instant::now();
        let outcome = |outcome: &'static str| {
            tracing::debug!(%key, waited_ms = started.elapsed().as_millis() as u64, outcome, "lock acquire");
        };

        let mut wait = Wait::new(deadline);
        let mut sent = Instant::now();
        let mut attempt = inner.backend.attempt(key, &holder, lease, claim).await;
        loop {
            let ttl = match attempt {
                Ok(Attempt::Taken { token } | Attempt::Reentered { token }) => {
                    outcome("acquired");
                    return Ok(Claim::Acquired(self.guard(key, holder, token, sent)));
                }
                Ok(Attempt::Completed { outcome: stored }) => {
                    outcome("completed before");
                    return Ok(Claim::Completed(stored));
                }
                Ok(Attempt::Busy { ttl }) => ttl.unwrap_or(NO_TTL_RECHECK),
                // Ride out a reconnect within the budget; the store being down is
                // reported once the budget is spent.
                Err(error) if error.is_transient() && wait.can_back_off() => {
                    tracing::debug!(%key, %error, "acquire failed; retrying");
                    wait.back_off().await;
                    sent = Instant::now();
                    attempt = inner.backend.attempt(key, &holder, lease, claim).await;
                    continue;
                }
                Err(error) => {
                    outcome("backend error");
                    return Err(error.into());
                }
            };
            let now = Instant::now();
            if wait.is_over(now) {
                outcome("timeout");
                return Err(LockError::Timeout {
                    key: key.name().to_owned(),
                    retry_after: ttl,
                });
            }
            wait.sleep(&inner.waiters, key.channel(), wait.cap(now + ttl))
                .await;
            sent = Instant::now();
            attempt = inner.backend.attempt(key, &holder, lease, claim).await;
        }
    }

    fn guard(&self, key: &Key, holder: Holder, token: u64, sent: Instant) -> LockGuard {
        LockGuard::new(
            self.client.clone(),
            Kind::Plain,
            key.clone(),
            holder,
            token,
            self.lease,
            self.max_hold,
            sent,
        )
    }

    /// Whether anyone holds the lock.
    ///
    /// # Errors
    /// [`LockError::InvalidKey`] or [`LockError::Backend`].
    pub async fn is_locked(&self) -> Result<bool, LockError> {
        Ok(self.client.inner.backend.is_locked(self.key()?).await?)
    }

    /// Whether `holder` holds the lock.
    ///
    /// # Errors
    /// [`LockError::InvalidKey`] or [`LockError::Backend`].
    pub async fn is_held_by(&self, holder: &Holder) -> Result<bool, LockError> {
        Ok(self.hold_count(holder).await? > 0)
    }

    /// How many times `holder` holds the lock (0 if not at all).
    ///
    /// # Errors
    /// [`LockError::InvalidKey`] or [`LockError::Backend`].
    pub async fn hold_count(&self, holder: &Holder) -> Result<u64, LockError> {
        Ok(self
            .client
            .inner
            .backend
            .hold_count(self.key()?, holder)
            .await?)
    }

    /// The lease the current holder has left, `None` if the lock is free.
    ///
    /// # Errors
    /// [`LockError::InvalidKey`] or [`LockError::Backend`].
    pub async fn remaining_ttl(&self) -> Result<Option<Duration>, LockError> {
        Ok(self.client.inner.backend.remaining_ttl(self.key()?).await?)
    }

    /// Deletes the lock whoever holds it and wakes its waiters. An admin action: the
    /// holder learns of it at its next renewal (its guard reports the lock lost).
    /// Returns whether there was a lock to delete.
    ///
    /// # Errors
    /// [`LockError::InvalidKey`] or [`LockError::Backend`].
    pub async fn force_unlock(&self) -> Result<bool, LockError> {
        let key = self.key()?;
        let deleted = self.client.inner.backend.force_unlock(key).await?;
        tracing::warn!(%key, deleted, "lock force-unlocked");
        Ok(deleted)
    }
}
