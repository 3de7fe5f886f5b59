//! Several locks taken as one: [`MultiLock`] and its [`MultiGuard`].
//!
//! All the locks are taken in one step (one script on Redis, one critical section
//! in-process) or none is, so no caller ever holds part of a set while waiting for the
//! rest: two callers wanting overlapping sets cannot deadlock, and no lock is held longer
//! than the work needs. While one of the locks is busy the caller waits for that lock's
//! release notice (or its lease end) and tries the whole set again.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::acquire::{self, Answer, Attempts, Busy, Tried};
use crate::engine::Engine;
use crate::error::LockError;
use crate::guard::LockGuard;
use crate::hold::{Hold, HoldKind};
use crate::holder::Holder;
use crate::key::Key;
use crate::metrics::Acquired;
use crate::options::{hold_options, HoldOptions};
use crate::settle::settle;
use crate::store::contract::{AcquireAll, LockStore, MultiAttempt};

/// Several named locks to acquire as one, made by [`LockClient::multi_lock`](crate::LockClient::multi_lock).
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
    engine: Arc<Engine>,
    names: Vec<String>,
    options: HoldOptions,
}

hold_options!(
    MultiLock,
    "client.multi_lock([\"account:7\", \"account:3\"])"
);

impl MultiLock {
    pub(crate) fn new(engine: Arc<Engine>, names: Vec<String>) -> Self {
        Self {
            engine,
            names,
            options: HoldOptions::default(),
        }
    }

    /// Acquires every lock, waiting as long as it takes; on failure none stays held.
    ///
    /// ```
    /// # use lockwarden_core::LockClient;
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lockwarden_core::LockError> {
    /// let client = LockClient::in_memory();
    /// let both = client.multi_lock(["stock:7", "order:3"]).acquire().await?;
    /// both.release().await
    /// # }
    /// ```
    ///
    /// # Errors
    /// [`LockError::InvalidKey`] (before anything is taken) or [`LockError::Backend`].
    pub async fn acquire(&self) -> Result<MultiGuard, LockError> {
        self.acquire_until(None).await
    }

    /// Acquires every lock, waiting at most `wait` in all; on failure none stays held.
    ///
    /// ```
    /// # use lockwarden_core::{LockClient, LockError};
    /// # use std::time::Duration;
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), LockError> {
    /// let client = LockClient::in_memory();
    /// let one = client.acquire("order:3").await?;
    /// let both = client.multi_lock(["stock:7", "order:3"]).try_acquire(Duration::ZERO).await;
    /// assert!(matches!(both, Err(LockError::Timeout { key, .. }) if key == "order:3"));
    /// assert!(!client.lock("stock:7").is_locked().await?); // nothing taken
    /// one.release().await
    /// # }
    /// ```
    ///
    /// # Errors
    /// [`LockError::Timeout`] naming the lock that could not be had,
    /// [`LockError::InvalidKey`] (before anything is taken) or [`LockError::Backend`].
    pub async fn try_acquire(&self, wait: Duration) -> Result<MultiGuard, LockError> {
        self.acquire_until(Instant::now().checked_add(wait)).await
    }

    /// Deletes every lock of the set whoever holds it, and wakes their waiters at once (see
    /// [`Lock::force_unlock`](crate::Lock::force_unlock)). Returns whether there was any
    /// lock to delete.
    ///
    /// ```
    /// # use lockwarden_core::LockClient;
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lockwarden_core::LockError> {
    /// let client = LockClient::in_memory();
    /// let stuck = client.multi_lock(["stock:7", "order:3"]).acquire().await?;
    /// assert!(client.multi_lock(["stock:7", "order:3"]).force_unlock().await?);
    /// assert!(!client.lock("order:3").is_locked().await?);
    /// # drop(stuck); Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`LockError::InvalidKey`] (before anything is deleted) or [`LockError::Backend`].
    pub async fn force_unlock(&self) -> Result<bool, LockError> {
        let mut deleted = false;
        for key in self.keys()? {
            deleted |= crate::inspect::force_unlock(&self.engine, &key).await?;
        }
        Ok(deleted)
    }

    /// The validated keys, in the one order every caller takes them in.
    fn keys(&self) -> Result<Vec<Key>, LockError> {
        let mut keys: Vec<Key> = self
            .names
            .iter()
            .map(|name| self.engine.key(name))
            .collect::<Result<_, _>>()?;
        // One order for every caller: the guards come back in it, and a store that takes
        // keys one by one (a cluster, slot by slot) needs it to avoid deadlocks.
        keys.sort_unstable_by(|a, b| a.redis_key().cmp(b.redis_key()));
        keys.dedup();
        Ok(keys)
    }

    async fn acquire_until(&self, deadline: Option<Instant>) -> Result<MultiGuard, LockError> {
        let keys = self.keys()?;
        let (holder, fresh) = self.options.holder(&self.engine);
        let attempts = MultiAttempts {
            engine: &self.engine,
            keys,
            holder,
            fresh,
            waiting: false,
            lease: self.options.lease(&self.engine),
            options: &self.options,
        };
        acquire::acquire(self.engine.waiters(), attempts, deadline).await
    }
}

/// A multi-lock's attempts: all the locks in one step, or none; a waiter sleeps on the
/// busy lock's channel.
struct MultiAttempts<'a> {
    engine: &'a Arc<Engine>,
    keys: Vec<Key>,
    holder: Holder,
    /// Whether `holder` was made for this acquisition (see `settle.rs`).
    fresh: bool,
    /// Whether an attempt was refused, so that the next ones wait (see
    /// `AcquireAll::waiting`).
    waiting: bool,
    lease: Duration,
    options: &'a HoldOptions,
}

impl Attempts for MultiAttempts<'_> {
    type Won = MultiGuard;

    async fn attempt(&mut self, _deadline: Option<Instant>) -> Answer<MultiGuard> {
        let sent = Instant::now();
        let ask = AcquireAll {
            keys: &self.keys,
            holder: &self.holder,
            lease: self.lease,
            fresh: self.fresh,
            waiting: self.waiting,
        };
        match self.engine.store().acquire_all(&ask).await? {
            MultiAttempt::Taken { tokens } => {
                let shared = self.keys.len() > 1;
                let guards = self
                    .keys
                    .iter()
                    .zip(tokens)
                    .map(|(key, token)| {
                        let hold = Hold {
                            kind: HoldKind::PLAIN,
                            key: key.clone(),
                            holder: self.holder.clone(),
                        };
                        let hold = (hold, self.fresh);
                        let guard =
                            LockGuard::new(self.engine.clone(), hold, token, self.options, sent);
                        match shared {
                            true => guard.sharing_its_holder(),
                            false => guard,
                        }
                    })
                    .collect();
                Ok(Tried::Won(MultiGuard { guards }, Acquired::Taken))
            }
            MultiAttempt::Busy { index, ttl } => {
                // Any later attempt waits: a refusal then marks the busy lock.
                self.waiting = true;
                Ok(Tried::Busy(Busy { lock: index, ttl }))
            }
        }
    }

    fn key(&self, lock: usize) -> &Key {
        &self.keys[lock]
    }

    fn name(&self) -> &str {
        self.keys.first().map_or("", Key::name)
    }

    fn kind(&self) -> &'static str {
        "multi"
    }

    /// Like a plain lock's, for every lock at once.
    fn unanswered(&mut self) -> bool {
        if !self.fresh {
            return false;
        }
        let holder = std::mem::replace(&mut self.holder, self.engine.holder());
        let holds = self
            .keys
            .iter()
            .map(|key| Hold {
                kind: HoldKind::PLAIN,
                key: key.clone(),
                holder: holder.clone(),
            })
            .collect();
        settle(self.engine.store().clone(), holds, None, self.lease);
        true
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
