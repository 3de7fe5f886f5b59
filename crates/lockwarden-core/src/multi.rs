//! Several locks taken as one: [`MultiLock`] and its [`MultiGuard`].
//!
//! The locks are taken one by one in the order of their Redis keys, the same order for
//! every caller, so two callers that want overlapping sets cannot each hold a part the
//! other waits for. If one cannot be had within the wait budget, the ones taken are
//! released again: all or nothing.

use std::time::Duration;

use tokio::time::Instant;

use crate::client::LockClient;
use crate::error::LockError;
use crate::guard::LockGuard;
use crate::holder::Holder;
use crate::key::Key;

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
        keys.sort_unstable_by(|a, b| a.redis_key().cmp(b.redis_key()));
        keys.dedup();
        let holder = self
            .holder
            .clone()
            .or_else(Holder::current)
            .unwrap_or_else(|| self.client.holder());
        let mut guards = Vec::with_capacity(keys.len());
        for key in &keys {
            let mut lock = self.client.lock(key.name()).holder(&holder);
            if let Some(lease) = self.lease {
                lock = lock.lease(lease);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            match lock.try_acquire(left).await {
                Ok(guard) => guards.push(guard),
                Err(error) => {
                    MultiGuard { guards }.release_quietly().await;
                    return Err(error);
                }
            }
        }
        Ok(MultiGuard { guards })
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

    /// Releases every lock (in reverse order), all of them even if one fails.
    ///
    /// # Errors
    /// The first failure, as [`LockGuard::release`] reports it.
    pub async fn release(self) -> Result<(), LockError> {
        let mut first = None;
        for guard in self.guards.into_iter().rev() {
            if let Err(error) = guard.release().await {
                first.get_or_insert(error);
            }
        }
        first.map_or(Ok(()), Err)
    }

    async fn release_quietly(self) {
        if let Err(error) = self.release().await {
            tracing::debug!(%error, "releasing the part of a multi-lock already taken failed; it expires with its lease");
        }
    }
}
