//! Read-write locks: [`RwLock`] and its sides ([`RwLockHandle`]), and their attempts for
//! the acquire loop. The rules are documented on [`RwLock`].

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::acquire::{self, Answer, Attempts, Tried};
use crate::engine::Engine;
use crate::error::{KeyError, LockError};
use crate::finish::BoxFuture;
use crate::guard::LockGuard;
use crate::hold::{Hold, HoldKind, RwMode};
use crate::holder::Holder;
use crate::key::Key;
use crate::lock::checked;
use crate::metrics::Acquired;
use crate::options::{hold_options, HoldOptions};
use crate::store::contract::{How, LockStore, Refusal, Upgrade, Waiter};
use crate::target::Target;

/// One named read-write lock, made by [`LockClient::rw_lock`](crate::LockClient::rw_lock): pick a side with
/// [`read`](Self::read) or [`write`](Self::write). The rules (writer preference,
/// downgrade, no upgrade):
///
/// # What it promises
///
/// - **Exclusion.** While a holder holds the write side, no other holder holds either side;
///   any number of holders may hold the read side together.
/// - **Re-entry.** A holder may take each side again; each [`LockGuard`] releases one
///   entry. Read and write holds are counted (and renewed by the watchdog) separately.
/// - **Downgrade.** The write holder may take the read side too; when it then releases the
///   write side the lock stays in read mode, held by it, and waiting readers may join.
/// - **No upgrade.** A holder that holds the read side but not the write side gets
///   [`LockError::UpgradeRefused`] at once when it asks for the write side: it would wait
///   for itself. Release the read hold first.
/// - **Each hold expires on its own.** A reader that dies (or leaks its guard) stops
///   counting when its own lease runs out, even while other readers keep renewing theirs.
///
/// # Fairness: writer preference
///
/// A writer that finds the lock held registers itself as waiting. While a waiting writer is
/// registered, readers that hold nothing on this lock are refused (holders that already
/// hold a side are admitted, or they would deadlock with the writer waiting for them), so
/// the readers in place drain and the writer gets the lock within the longest of their
/// remaining holds: a stream of readers cannot starve it. The registration is refreshed by
/// each of the writer's retries and lasts the client's watchdog timeout (or the writer's
/// remaining wait, if shorter); a writer that gives up withdraws it, one that dies lets it
/// run out. The price: under a steady stream of writers, readers wait until no writer is
/// waiting. Among writers, as with the plain lock, there is no queue order.
///
/// # Notices
///
/// When the lock becomes free, one waiting writer per client is woken (on the lock's
/// release channel, as for the plain lock). A refused reader registers as waiting (like a
/// writer, for the watchdog timeout or its remaining wait, refreshed by its retries), and
/// when the lock becomes free or leaves write mode while no writer is waiting, the
/// release **admits every waiting reader in the same step**: each gets a read hold for
/// what is left of its registration, and all are told on the lock's readers' channel with
/// the read phase's token, so they hold without asking again (a reader that misses the
/// notice, holds with a fixed lease or was given its holder takes its admission up with
/// its next attempt; one that gives up gives it back; one that died frees it when its
/// registration runs out). Without a notice a waiter retries when the next hold could
/// expire, never by polling.
///
/// # Fencing tokens
///
/// Every write hold taken on a free lock draws a new token, strictly greater than every
/// token issued for the lock before. Readers that start a read phase on a free lock draw
/// one too; readers joining a phase share its token, and a downgrade's read hold carries
/// the write's. So a resource that remembers the highest token it saw can reject a stale
/// writer, and a read carrying a smaller token than the last write's is stale.
///
/// # Layout on Redis
///
/// The lock hash at [`Key::redis_key`] holds `mode`, `token` and one re-entry count per
/// hold (`<holder>:r`, `<holder>:w`); `<key>:leases` is a sorted set of each hold's
/// deadline, `<key>:writers` one of waiting writers' registrations and `<key>:readers`
/// one of waiting readers', by their read holds' fields (an admitted reader stays there
/// until it takes its hold up or releases it), all in the lock's cluster slot; admitted
/// readers are told
/// `granted:<token>:<holder id>:r <holder id>:r..` (their holds' fields) on
/// `<key>:readable`. Scripts in `lua/rw_*.lua`. A name is either a plain lock or a read-write
/// lock: a plain lock under the same name keeps both sides refused, and a held read-write
/// lock keeps the plain one refused, on both stores. Claims ([`LockGuard::complete`]) are
/// for plain and fair locks only ([`LockError::NotClaimable`]).
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
#[derive(Debug, Clone)]
#[must_use = "an RwLock does nothing until one of its sides is acquired or inspected"]
pub struct RwLock {
    engine: Arc<Engine>,
    key: Result<Key, KeyError>,
}

impl RwLock {
    /// Deletes the lock whoever holds either side, and wakes every waiting reader and a
    /// waiting writer at once. An operator's action, which breaks mutual exclusion for the
    /// current holders: they learn of it at their next renewal (their guards report the
    /// lock lost). Returns whether there was a lock to delete.
    ///
    /// ```
    /// # use lockwarden_core::LockClient;
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lockwarden_core::LockError> {
    /// let client = LockClient::in_memory();
    /// let stuck = client.rw_lock("menu").write().acquire().await?;
    /// assert!(client.rw_lock("menu").force_unlock().await?);
    /// let reader = client.rw_lock("menu").read().try_acquire(std::time::Duration::ZERO).await?;
    /// # drop((stuck, reader)); Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`LockError::InvalidKey`] or [`LockError::Backend`].
    pub async fn force_unlock(&self) -> Result<bool, LockError> {
        crate::inspect::force_unlock(&self.engine, self.key()?).await
    }

    pub(crate) fn new(engine: Arc<Engine>, key: Result<Key, KeyError>) -> Self {
        Self { engine, key }
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
            engine: self.engine.clone(),
            key: self.key.clone(),
            mode,
            options: HoldOptions::default(),
        }
    }

    /// The validated key.
    ///
    /// # Errors
    /// [`LockError::InvalidKey`] if the name was rejected.
    pub fn key(&self) -> Result<&Key, LockError> {
        checked(&self.key)
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
        Ok(self
            .engine
            .store()
            .remaining_ttl(self.key()?)
            .await?
            .is_some())
    }

    /// How many writers wait for the lock (and so hold back new readers), counting any
    /// that died, or stopped waiting without withdrawing, while their registration runs
    /// (they are dropped when someone next tries the lock after it, and all are gone
    /// once the last registration has run out). As [`FairLock::queued`](crate::FairLock::queued)
    /// and [`SemaphoreState::waiting`](crate::SemaphoreState::waiting) for the other kinds.
    ///
    /// ```
    /// # use lockwarden_core::LockClient;
    /// # use std::time::Duration;
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lockwarden_core::LockError> {
    /// let client = LockClient::in_memory();
    /// let prices = client.rw_lock("prices");
    /// let reader = prices.read().acquire().await?;
    /// let writer = tokio::spawn({
    ///     let prices = prices.clone();
    ///     async move { prices.write().try_acquire(Duration::from_secs(5)).await }
    /// });
    /// while prices.waiting_writers().await? == 0 {
    ///     tokio::task::yield_now().await; // the writer registers
    /// }
    /// reader.release().await?; // the writer gets it...
    /// writer.await.unwrap()?.release().await?;
    /// assert_eq!(prices.waiting_writers().await?, 0); // ...and waits no more
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`LockError::InvalidKey`] or [`LockError::Backend`].
    pub async fn waiting_writers(&self) -> Result<usize, LockError> {
        Ok(self.engine.store().waiting_writers(self.key()?).await?)
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
#[derive(Debug, Clone)]
#[must_use = "an RwLockHandle does nothing until it is acquired or inspected"]
pub struct RwLockHandle {
    engine: Arc<Engine>,
    key: Result<Key, KeyError>,
    mode: RwMode,
    options: HoldOptions,
}

hold_options!(RwLockHandle, "client.rw_lock(\"report\").write()");

impl RwLockHandle {
    /// Which side this handle takes.
    pub fn mode(&self) -> RwMode {
        self.mode
    }

    /// Acquires this side, waiting as long as it takes (through a Redis outage too).
    ///
    /// # Errors
    /// [`LockError::UpgradeRefused`] (see [`RwLock`]), [`LockError::InvalidKey`]
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
        let hold = Hold {
            kind: HoldKind::ReadWrite(self.mode),
            key: checked(&self.key)?.clone(),
            holder: holder.clone(),
        };
        Ok(self.engine.store().hold_count(&hold).await?)
    }

    async fn acquire_until(&self, deadline: Option<Instant>) -> Result<LockGuard, LockError> {
        let attempts = RwAttempts {
            target: Target::new(&self.engine, checked(&self.key)?, &self.options),
            mode: self.mode,
            // How long a waiter's registration outlives its last attempt: long enough for
            // the retry that refreshes it (at half of it, at the latest).
            register: self.engine.watchdog().lease(),
            registered: None,
        };
        acquire::acquire(self.engine.waiters(), attempts, deadline).await
    }
}

/// One side's attempts. A refused waiter registers: a writer, which holds back new
/// readers; a reader, which the release that opens the lock to readers admits, telling it
/// on the readers' channel, where all readers of the lock sleep.
struct RwAttempts<'a> {
    target: Target<'a>,
    mode: RwMode,
    register: Duration,
    /// When the last attempt that left a registration was sent, and how long it asked
    /// the registration to last (so giving up must withdraw it, and an admission lasts
    /// until that registration ends: from then, by the server clock no earlier).
    registered: Option<(Instant, Duration)>,
}

impl RwAttempts<'_> {
    fn waiter(&self) -> Waiter {
        match self.mode {
            RwMode::Read => Waiter::Reader,
            RwMode::Write => Waiter::Writer,
        }
    }
}

impl Attempts for RwAttempts<'_> {
    type Won = LockGuard;

    async fn attempt(&mut self, deadline: Option<Instant>) -> Answer<LockGuard> {
        let kind = HoldKind::ReadWrite(self.mode);
        if self.mode == RwMode::Read {
            // Admitted by a release: the hold is ours already, and the notice says its token.
            // The registration the store admitted it by: what the last one asked for
            // (a wait budget near its end shortens it), from when it was sent.
            let expires = self.registered.map(|(at, register)| at + register);
            let channel = self.target.key.names().readers();
            if let Some(guard) = self.target.granted(kind, channel, expires) {
                return Ok(Tried::Won(guard, Acquired::Taken));
            }
        }
        // A registration never outlives the wait budget (none for a last attempt).
        let sent = Instant::now();
        let register = deadline.map_or(self.register, |d| {
            self.register.min(d.saturating_duration_since(sent))
        });
        let how = match self.mode {
            RwMode::Read => How::Read {
                register,
                registered: self.registered.is_some(),
            },
            RwMode::Write => How::Write { register },
        };
        let target = &self.target;
        let tried = match self.mode {
            RwMode::Read => {
                target
                    .try_once(how, Refusal::never, |never| match never {})
                    .await?
            }
            // A write by a holder of the read side alone would wait for itself.
            RwMode::Write => {
                let key = target.key.name();
                let upgrade = |Upgrade| LockError::UpgradeRefused {
                    key: key.to_owned(),
                };
                target.try_once(how, Refusal::upgrade, upgrade).await?
            }
        };
        if matches!(tried, Tried::Busy(_)) && !register.is_zero() {
            self.registered = Some((sent, register));
        }
        Ok(tried)
    }

    fn key(&self, _lock: usize) -> &Key {
        self.target.key
    }

    fn channel(&self, _lock: usize) -> &str {
        match self.mode {
            RwMode::Read => self.target.key.names().readers(),
            RwMode::Write => self.target.key.channel(),
        }
    }

    /// A reader is admitted by name.
    fn holder(&self) -> Option<&str> {
        (self.mode == RwMode::Read).then(|| self.target.holder.id())
    }

    /// A waiter retries before its registration runs out: a writer so that readers stay
    /// held back, a reader so that it is admitted.
    fn recheck(&self) -> Option<Duration> {
        Some(self.register / 2)
    }

    fn left_behind(&self) -> Option<BoxFuture> {
        self.registered.map(|_| self.target.withdraw(self.waiter()))
    }

    fn kind(&self) -> &'static str {
        HoldKind::ReadWrite(self.mode).name()
    }

    fn unanswered(&mut self) -> bool {
        let forgot = self
            .target
            .forget_holder(HoldKind::ReadWrite(self.mode), Some(self.waiter()));
        if forgot {
            self.registered = None;
        }
        forgot
    }
}
