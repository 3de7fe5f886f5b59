//! Read-write locks: many readers or one writer, on the same engine as [`Lock`](crate::Lock)
//! (watchdog or fixed leases, pub/sub waiting, fencing tokens, [`LockGuard`]s).
//!
//! # What it promises
//!
//! - **Exclusion.** While a holder holds the write side, no other holder holds either side;
//!   any number of holders may hold the read side together.
//! - **Re-entry.** A holder may take each side again; each [`LockGuard`] releases one
//!   entry. Read and write holds are counted (and renewed by the watchdog) separately.
//! - **Downgrade.** The write holder may take the read side too; when it then releases the
//!   write side the lock stays in read mode, held by it, and waiting readers may join.
//! - **No upgrade.** A holder that holds the read side but not the write side gets
//!   [`LockError::UpgradeRefused`] at once when it asks for the write side: it would wait
//!   for itself. Release the read hold first.
//! - **Each hold expires on its own.** A reader that dies (or leaks its guard) stops
//!   counting when its own lease runs out, even while other readers keep renewing theirs.
//!
//! # Fairness: writer preference
//!
//! A writer that finds the lock held registers itself as waiting. While a waiting writer is
//! registered, readers that hold nothing on this lock are refused (holders that already
//! hold a side are admitted, or they would deadlock with the writer waiting for them), so
//! the readers in place drain and the writer gets the lock within the longest of their
//! remaining holds: a stream of readers cannot starve it. The registration is refreshed by
//! each of the writer's retries and lasts the client's watchdog timeout (or the writer's
//! remaining wait, if shorter); a writer that gives up withdraws it, one that dies lets it
//! run out. The price: under a steady stream of writers, readers wait until no writer is
//! waiting. Among writers, as with the plain lock, there is no queue order.
//!
//! # Notices
//!
//! When the lock becomes free, one waiting writer per client is woken (on the lock's
//! release channel, as for the plain lock). When it becomes free or leaves write mode
//! and no writer is waiting, every waiting reader is woken at once (payload `read` on the
//! lock's readers' channel), so they all proceed together. Without a notice a waiter
//! retries when the next hold could expire, never by polling.
//!
//! # Fencing tokens
//!
//! Every write hold taken on a free lock draws a new token, strictly greater than every
//! token issued for the lock before. Readers that start a read phase on a free lock draw
//! one too; readers joining a phase share its token, and a downgrade's read hold carries
//! the write's. So a resource that remembers the highest token it saw can reject a stale
//! writer, and a read carrying a smaller token than the last write's is stale.
//!
//! # Layout on Redis
//!
//! The lock hash at [`Key::redis_key`] holds `mode`, `token` and one re-entry count per
//! hold (`<holder>:r`, `<holder>:w`); `<key>:leases` is a sorted set of each hold's
//! deadline and `<key>:writers` one of waiting writers' registrations, both in the lock's
//! cluster slot. Scripts in `lua/rw_*.lua`. A name is either a plain lock or a read-write
//! lock: a plain lock under the same name keeps both sides refused on Redis (in-process the
//! two kinds are kept apart). Claims ([`LockGuard::complete`]) are for plain locks only.

use std::fmt;
use std::time::Duration;

use tokio::time::Instant;

use crate::backend::{Backend, Kind, RwAttempt};
use crate::client::LockClient;
use crate::error::{KeyError, LockError};
use crate::guard::LockGuard;
use crate::holder::Holder;
use crate::key::Key;
use crate::wait::Wait;

/// The sorted set of each hold's deadline (see the module docs).
pub(crate) fn leases_key(key: &Key) -> String {
    key.companion("leases")
}

/// The sorted set of waiting writers' registrations.
pub(crate) fn writers_key(key: &Key) -> String {
    key.companion("writers")
}

/// The channel on which waiting readers are told they may all proceed.
pub(crate) fn readers_channel(key: &Key) -> String {
    key.companion("readable")
}

/// Which side of a read-write lock a handle takes.
///
/// ```
/// # use lockwarden_core::{LockClient, RwMode};
/// let rw = LockClient::in_memory().rw_lock("stock");
/// assert_eq!(rw.read().mode(), RwMode::Read);
/// assert_eq!(rw.write().mode(), RwMode::Write);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RwMode {
    /// Shared with other readers.
    Read,
    /// Exclusive.
    Write,
}

impl RwMode {
    fn kind(self) -> Kind {
        match self {
            RwMode::Read => Kind::Read,
            RwMode::Write => Kind::Write,
        }
    }
}

/// One named read-write lock, made by [`LockClient::rw_lock`]: pick a side with
/// [`read`](Self::read) or [`write`](Self::write). See the [module docs](self) for the
/// rules (writer preference, downgrade, no upgrade).
///
/// ```
/// # use lockwarden_core::{LockClient, LockError};
/// # use std::time::Duration;
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), LockError> {
/// let client = LockClient::in_memory();
/// let prices = client.rw_lock("prices");
/// let reader = prices.read().acquire().await?;
/// // A writer waits for the readers...
/// assert!(matches!(
///     prices.write().try_acquire(Duration::ZERO).await,
///     Err(LockError::Timeout { .. })
/// ));
/// reader.release().await?;
/// // ...and excludes everyone while it writes.
/// let writer = prices.write().try_acquire(Duration::from_secs(1)).await?;
/// assert!(prices.read().try_acquire(Duration::ZERO).await.is_err());
/// writer.release().await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
#[must_use = "an RwLock does nothing until one of its sides is acquired or inspected"]
pub struct RwLock {
    client: LockClient,
    key: Result<Key, KeyError>,
}

impl RwLock {
    pub(crate) fn new(client: LockClient, key: Result<Key, KeyError>) -> Self {
        Self { client, key }
    }

    /// The read side: shared with other readers, refused while a writer holds the lock or
    /// waits for it (unless this holder already holds a side).
    pub fn read(&self) -> RwLockHandle {
        self.side(RwMode::Read)
    }

    /// The write side: exclusive.
    pub fn write(&self) -> RwLockHandle {
        self.side(RwMode::Write)
    }

    fn side(&self, mode: RwMode) -> RwLockHandle {
        RwLockHandle {
            client: self.client.clone(),
            key: self.key.clone(),
            mode,
            lease: None,
            max_hold: None,
            holder: None,
        }
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

    /// Whether anyone holds either side.
    ///
    /// ```
    /// # use lockwarden_core::LockClient;
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lockwarden_core::LockError> {
    /// let client = LockClient::in_memory();
    /// let guard = client.rw_lock("menu").read().acquire().await?;
    /// assert!(client.rw_lock("menu").is_locked().await?);
    /// guard.release().await?;
    /// assert!(!client.rw_lock("menu").is_locked().await?);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`LockError::InvalidKey`] or [`LockError::Backend`].
    pub async fn is_locked(&self) -> Result<bool, LockError> {
        Ok(self.client.inner.backend.rw_is_locked(self.key()?).await?)
    }
}

impl fmt::Debug for RwLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RwLock").field("key", &self.key).finish()
    }
}

/// One side of an [`RwLock`], made by [`RwLock::read`] or [`RwLock::write`]. Set options as
/// on a [`Lock`](crate::Lock), then acquire: the [`LockGuard`] it returns works as a plain
/// lock's (fencing token, lost signal, release, release on drop).
///
/// ```
/// # use lockwarden_core::LockClient;
/// # use std::time::Duration;
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lockwarden_core::LockError> {
/// let client = LockClient::in_memory();
/// let me = client.holder();
/// let config = client.rw_lock("config");
/// let write = config.write().holder(&me).acquire().await?;
/// let read = config.read().holder(&me).acquire().await?; // downgrade: keep reading...
/// write.release().await?; // ...while other readers may join
/// let other = config.read().lease(Duration::from_secs(5)).try_acquire(Duration::ZERO).await?;
/// assert_eq!(config.read().hold_count(&me).await?, 1);
/// read.release().await?;
/// other.release().await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
#[must_use = "an RwLockHandle does nothing until it is acquired or inspected"]
pub struct RwLockHandle {
    client: LockClient,
    key: Result<Key, KeyError>,
    mode: RwMode,
    lease: Option<Duration>,
    max_hold: Option<Duration>,
    holder: Option<Holder>,
}

impl RwLockHandle {
    /// Which side this handle takes.
    pub fn mode(&self) -> RwMode {
        self.mode
    }

    /// Holds this side for a fixed lease instead of keeping it alive with the watchdog.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = Some(lease);
        self
    }

    /// Caps how long the watchdog keeps the hold alive (see [`Lock::max_hold`](crate::Lock::max_hold)).
    pub fn max_hold(mut self, max_hold: Duration) -> Self {
        self.max_hold = Some(max_hold);
        self
    }

    /// Acquires as `holder` (re-entering, or downgrading, with what it already holds).
    /// Without this, the holder of the enclosing [`Holder::scope`] is used, or else a fresh one.
    pub fn holder(mut self, holder: &Holder) -> Self {
        self.holder = Some(holder.clone());
        self
    }

    fn key(&self) -> Result<&Key, LockError> {
        self.key
            .as_ref()
            .map_err(|e| LockError::InvalidKey(e.clone()))
    }

    /// Acquires this side, waiting as long as it takes (through a Redis outage too).
    ///
    /// # Errors
    /// [`LockError::UpgradeRefused`] (see the [module docs](self)), [`LockError::InvalidKey`]
    /// or [`LockError::Backend`].
    pub async fn acquire(&self) -> Result<LockGuard, LockError> {
        self.acquire_until(None).await
    }

    /// Acquires this side, waiting at most `wait` (zero: one attempt). Waiting sleeps until
    /// a notice or until the next hold could expire; it never polls. Dropping the future at
    /// any point never leaves a hold behind (a waiting writer's registration is withdrawn).
    ///
    /// # Errors
    /// [`LockError::Timeout`] once `wait` is spent, [`LockError::UpgradeRefused`],
    /// [`LockError::InvalidKey`] or [`LockError::Backend`].
    pub async fn try_acquire(&self, wait: Duration) -> Result<LockGuard, LockError> {
        self.acquire_until(Instant::now().checked_add(wait)).await
    }

    /// How many times `holder` holds this side (0 if not at all).
    ///
    /// # Errors
    /// [`LockError::InvalidKey`] or [`LockError::Backend`].
    pub async fn hold_count(&self, holder: &Holder) -> Result<u64, LockError> {
        let backend = &self.client.inner.backend;
        Ok(backend
            .rw_hold_count(self.mode.kind(), self.key()?, holder)
            .await?)
    }

    async fn acquire_until(&self, deadline: Option<Instant>) -> Result<LockGuard, LockError> {
        let key = self.key()?;
        let holder = self
            .holder
            .clone()
            .or_else(Holder::current)
            .unwrap_or_else(|| self.client.holder());
        let inner = &self.client.inner;
        let backend = &inner.backend;
        let kind = self.mode.kind();
        let lease = self.lease.unwrap_or(inner.config.watchdog_timeout);
        // How long a waiting writer's registration outlives its last attempt: long enough
        // for the retry that refreshes it (at half of it, at the latest; see below).
        let register = inner.config.watchdog_timeout;
        let channel = match self.mode {
            RwMode::Read => readers_channel(key),
            RwMode::Write => key.channel().to_owned(),
        };
        let started = Instant::now();
        let outcome = |outcome: &'static str| {
            tracing::debug!(%key, mode = ?self.mode, waited_ms = started.elapsed().as_millis() as u64, outcome, "rw lock acquire");
        };
        let mut registration = Registration {
            backend: backend.clone(),
            key: key.clone(),
            holder: holder.clone(),
            armed: false,
        };
        // A writer's registration never outlives its wait budget.
        let attempt = || {
            let register = deadline.map_or(register, |d| {
                register.min(d.saturating_duration_since(Instant::now()))
            });
            backend.rw_attempt(kind, key, &holder, lease, register)
        };

        let mut sent = Instant::now();
        let mut attempt_result = attempt().await;
        let mut wait = Wait::new(deadline);
        loop {
            let ttl = match attempt_result {
                Ok(RwAttempt::Taken { token } | RwAttempt::Reentered { token }) => {
                    // Taking the lock ended the writer's registration.
                    registration.armed = false;
                    outcome("acquired");
                    return Ok(LockGuard::new(
                        self.client.clone(),
                        kind,
                        key.clone(),
                        holder,
                        token,
                        self.lease,
                        self.max_hold,
                        sent,
                    ));
                }
                Ok(RwAttempt::Upgrade) => {
                    outcome("upgrade refused");
                    return Err(LockError::UpgradeRefused {
                        key: key.name().to_owned(),
                    });
                }
                Ok(RwAttempt::Busy { ttl }) => {
                    registration.armed = self.mode == RwMode::Write;
                    ttl
                }
                Err(error) if error.is_transient() && wait.can_back_off() => {
                    tracing::debug!(%key, %error, "rw acquire failed; retrying");
                    wait.back_off().await;
                    sent = Instant::now();
                    attempt_result = attempt().await;
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
                registration.withdraw().await;
                return Err(LockError::Timeout {
                    key: key.name().to_owned(),
                    retry_after: ttl,
                });
            }
            let mut wake_at = now + ttl;
            if self.mode == RwMode::Write {
                // Retry before the registration runs out, so readers stay held back.
                wake_at = wake_at.min(now + register / 2);
            }
            wait.sleep(&inner.waiters, &channel, wait.cap(wake_at))
                .await;
            sent = Instant::now();
            attempt_result = attempt().await;
        }
    }
}

impl fmt::Debug for RwLockHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RwLockHandle")
            .field("key", &self.key)
            .field("mode", &self.mode)
            .field("lease", &self.lease)
            .field("max_hold", &self.max_hold)
            .field("holder", &self.holder)
            .finish()
    }
}

/// A waiting writer's registration: withdrawn when the wait ends without the lock (at
/// once on a timeout, in the background if the wait is dropped or fails), so readers held
/// back for it do not wait for it to run out.
struct Registration {
    backend: Backend,
    key: Key,
    holder: Holder,
    armed: bool,
}

impl Registration {
    async fn withdraw(&mut self) {
        if !std::mem::take(&mut self.armed) {
            return;
        }
        if let Err(error) = self.backend.rw_withdraw(&self.key, &self.holder).await {
            tracing::debug!(key = %self.key, %error, "could not withdraw a waiting writer; it runs out");
        }
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (backend, key, holder) = (self.backend.clone(), self.key.clone(), self.holder.clone());
        runtime.spawn(async move {
            if let Err(error) = backend.rw_withdraw(&key, &holder).await {
                tracing::debug!(%key, %error, "could not withdraw a waiting writer; it runs out");
            }
        });
    }
}
