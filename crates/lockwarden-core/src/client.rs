//! [`LockClient`]: the facade over one engine — it makes lock handles and keys, and runs
//! a piece of work under a lock. How a client is made is in `builder.rs`.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use crate::engine::Engine;
use crate::error::{LockError, ShutdownError};
use crate::fair::FairLock;
use crate::fenced::FencedValue;
use crate::guard::{LockGuard, LockInfo};
use crate::holder::Holder;
use crate::key::Key;
use crate::lock::Lock;
use crate::multi::MultiLock;
use crate::policy::RatePolicy;
use crate::rate::RateLimiter;
use crate::rw::RwLock;
use crate::semaphore::Semaphore;
use crate::store::contract::LockStore;
use crate::waiters::Waiting;

/// A handle to a lock store (Redis or in-process). Clones share everything.
///
/// Per client there is one command connection, one pub/sub connection that carries every
/// wait, and one watchdog task that renews every held lock.
///
/// When Redis closes the command connection (a restart, a failover, a reset), the first
/// command after it fails and the connection is made again. The calls a second run
/// answers alike (an acquisition by a holder made for it, the release of a hold nobody
/// can have re-entered: see [`LockGuard::release`]) are sent once more on the new
/// connection within the command timeout, so their callers get the true answer; on a
/// cluster every call is (the cluster client sends it again, and the scripts count it
/// once). Before the process exits, call [`shutdown`](Self::shutdown).
///
/// ```
/// use lockwarden_core::LockClient;
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lockwarden_core::LockError> {
/// // LockClient::connect("redis://127.0.0.1:6379/").await? for Redis.
/// let client = LockClient::in_memory();
/// let guard = client.acquire("invoice:17").await?;
/// // ... exclusive work; pass guard.fencing_token() to the resource you write to ...
/// guard.release().await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct LockClient {
    engine: Arc<Engine>,
}

impl LockClient {
    pub(crate) fn from_engine(engine: Engine) -> Self {
        Self {
            engine: Arc::new(engine),
        }
    }

    /// Validates `name` and lays it out under this client's namespace.
    ///
    /// # Errors
    /// [`LockError::InvalidKey`] if the name is empty, too long or has control characters.
    ///
    /// ```
    /// # use lockwarden_core::LockClient;
    /// let client = LockClient::in_memory();
    /// assert_eq!(client.key("orders:42")?.redis_key(), "lockwarden:{orders:42}");
    /// assert!(client.key("").is_err());
    /// # Ok::<(), lockwarden_core::LockError>(())
    /// ```
    pub fn key(&self, name: &str) -> Result<Key, LockError> {
        Ok(self.engine.key(name)?)
    }

    /// A new holder identity of this client (see [`Holder`]).
    pub fn holder(&self) -> Holder {
        self.engine.holder()
    }

    /// This client's id: random (a UUID v4) for each client made, shared by its clones.
    /// Every holder id it makes is `<client id>:<number>`, and that is what Redis keeps
    /// (a lock hash's fields, a fair lock's queue, a semaphore's holders) and what the
    /// `lockwarden` inspector lists: log it at start-up to tell which process holds what.
    ///
    /// ```
    /// # use lockwarden_core::LockClient;
    /// let client = LockClient::in_memory();
    /// let holder = client.holder();
    /// assert!(holder.id().starts_with(&format!("{}:", client.id())));
    /// assert_eq!(client.clone().id(), client.id());
    /// assert_ne!(LockClient::in_memory().id(), client.id());
    /// ```
    pub fn id(&self) -> &str {
        self.engine.waiters().client()
    }

    /// A handle on the lock named `name`, to configure and then acquire or inspect it.
    /// An invalid name is reported by the operation that uses it.
    pub fn lock(&self, name: impl AsRef<str>) -> Lock {
        Lock::new(self.engine.clone(), self.engine.key(name.as_ref()))
    }

    /// A handle on the read-write lock named `name`: many readers or one writer (see
    /// [`RwLock`]). An invalid name is reported by the operation that uses it.
    ///
    /// ```
    /// # use lockwarden_core::LockClient;
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lockwarden_core::LockError> {
    /// let client = LockClient::in_memory();
    /// let a = client.rw_lock("catalog").read().acquire().await?;
    /// let b = client.rw_lock("catalog").read().acquire().await?; // readers share it
    /// a.release().await?;
    /// b.release().await?;
    /// # Ok(()) }
    /// ```
    pub fn rw_lock(&self, name: impl AsRef<str>) -> RwLock {
        RwLock::new(self.engine.clone(), self.engine.key(name.as_ref()))
    }

    /// A handle on the fair lock named `name`: waiters get it first come, first served
    /// (see [`FairLock`]). An invalid name is reported by the operation that uses it.
    ///
    /// ```
    /// # use lockwarden_core::LockClient;
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lockwarden_core::LockError> {
    /// let client = LockClient::in_memory();
    /// let guard = client.fair_lock("tickets").acquire().await?;
    /// guard.release().await
    /// # }
    /// ```
    pub fn fair_lock(&self, name: impl AsRef<str>) -> FairLock {
        FairLock::new(self.engine.clone(), self.engine.key(name.as_ref()))
    }

    /// A handle on the semaphore named `name`: at most `capacity` permits held at once,
    /// across every process that uses it, each a lease of its own (see [`Semaphore`]). An
    /// invalid name or capacity is reported by the operation that uses it.
    ///
    /// ```
    /// # use lockwarden_core::LockClient;
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lockwarden_core::LockError> {
    /// let client = LockClient::in_memory();
    /// // At most 5 exports at once for this account, whichever replica runs them.
    /// let permit = client.semaphore("exports:acct_7", 5).acquire().await?;
    /// permit.release().await
    /// # }
    /// ```
    pub fn semaphore(&self, name: impl AsRef<str>, capacity: u32) -> Semaphore {
        Semaphore::new(
            self.engine.clone(),
            self.engine.key(name.as_ref()),
            capacity,
        )
    }

    /// A value that only the newest fencing token may write: the resource side of
    /// fencing, for data kept in the lock store (see [`FencedValue`]). An invalid name
    /// is reported by the operation that uses it.
    ///
    /// ```
    /// # use lockwarden_core::LockClient;
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lockwarden_core::LockError> {
    /// let client = LockClient::in_memory();
    /// let guard = client.acquire("ledger").await?;
    /// client.fenced("ledger").write(guard.fencing_token(), b"balance=12").await?;
    /// # guard.release().await }
    /// ```
    pub fn fenced(&self, name: impl AsRef<str>) -> FencedValue {
        FencedValue::new(self.engine.clone(), self.engine.key(name.as_ref()))
    }

    /// A rate limiter named `name`: for each key, at most what each of `policies` allows,
    /// counted across every process that uses this limiter on this store (see
    /// [`RateLimiter`]). Every policy is checked here, once.
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use lockwarden_core::{LockClient, RatePolicy};
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lockwarden_core::LockError> {
    /// let client = LockClient::in_memory();
    /// let api = client.rate_limiter("api", [RatePolicy::new("burst", 10, Duration::from_secs(1)).burst(20)])?;
    /// assert!(api.check("tenant:7").await?.is_allowed());
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`LockError::InvalidRateLimit`] naming what is wrong
    /// ([`RateLimitError`](crate::RateLimitError)): a name that is not 1 to 64 ASCII
    /// letters, digits, `_`, `-` or `.`; no policy, more than
    /// [`MAX_POLICIES`](crate::MAX_POLICIES), or two with one name; a zero quota or
    /// burst; more than one request per µs; a bucket that would take longer than
    /// [`MAX_REFILL`](crate::MAX_REFILL) to refill.
    pub fn rate_limiter(
        &self,
        name: impl AsRef<str>,
        policies: impl IntoIterator<Item = RatePolicy>,
    ) -> Result<RateLimiter, LockError> {
        RateLimiter::new(self.engine.clone(), name.as_ref(), policies)
    }

    /// Several locks to take as one (all or nothing, in a fixed order; see [`MultiLock`]).
    pub fn multi_lock<I, S>(&self, names: I) -> MultiLock
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        MultiLock::new(
            self.engine.clone(),
            names.into_iter().map(Into::into).collect(),
        )
    }

    /// Acquires `name`, waiting as long as it takes. Shorthand for `lock(name).acquire()`.
    ///
    /// # Errors
    /// [`LockError::InvalidKey`] or [`LockError::Backend`].
    pub async fn acquire(&self, name: impl AsRef<str>) -> Result<LockGuard, LockError> {
        self.lock(name).acquire().await
    }

    /// Acquires `name`, waiting at most `wait`. Shorthand for `lock(name).try_acquire(wait)`.
    ///
    /// # Errors
    /// [`LockError::Timeout`] once `wait` is spent, [`LockError::InvalidKey`] or
    /// [`LockError::Backend`].
    pub async fn try_acquire(
        &self,
        name: impl AsRef<str>,
        wait: Duration,
    ) -> Result<LockGuard, LockError> {
        self.lock(name).try_acquire(wait).await
    }

    /// Acquires `name` within `wait`, runs `work` with the holder as the current one (so
    /// locking the same name inside re-enters), and releases, also when `work` panics.
    ///
    /// ```
    /// # use lockwarden_core::LockClient;
    /// # use std::time::Duration;
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lockwarden_core::LockError> {
    /// let client = LockClient::in_memory();
    /// let total = client
    ///     .with_lock("ledger", Duration::from_secs(1), |lock| async move {
    ///         assert!(lock.fencing_token() > 0);
    ///         40 + 2
    ///     })
    ///     .await?;
    /// assert_eq!(total, 42);
    /// assert!(!client.lock("ledger").is_locked().await?);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As [`LockClient::try_acquire`]; a failure to release after `work` is returned as
    /// [`LockError::Lost`] or [`LockError::Backend`].
    pub async fn with_lock<F, Fut, T>(
        &self,
        name: impl AsRef<str>,
        wait: Duration,
        work: F,
    ) -> Result<T, LockError>
    where
        F: FnOnce(LockInfo) -> Fut,
        Fut: Future<Output = T>,
    {
        let guard = self.try_acquire(name, wait).await?;
        let out = guard.holder().clone().scope(work(guard.info())).await;
        guard.release().await?;
        Ok(out)
    }

    /// `"redis"` or `"in-memory"`: which store this client uses.
    ///
    /// ```
    /// # use lockwarden_core::LockClient;
    /// assert_eq!(LockClient::in_memory().backend_name(), "in-memory");
    /// ```
    pub fn backend_name(&self) -> &'static str {
        self.engine.store().name()
    }

    /// Counters of the client's bookkeeping, for tests and metrics.
    ///
    /// ```
    /// # use lockwarden_core::LockClient;
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lockwarden_core::LockError> {
    /// let client = LockClient::in_memory();
    /// let guard = client.acquire("kept-by-the-watchdog").await?;
    /// assert_eq!(client.stats().watched_locks, 1);
    /// guard.release().await?;
    /// assert_eq!(client.stats().watched_locks, 0);
    /// # Ok(()) }
    /// ```
    pub fn stats(&self) -> ClientStats {
        ClientStats {
            watched_locks: self.engine.watchdog().len(),
            waited_channels: self.engine.waiters().len(),
        }
    }

    /// Shuts the client down gracefully, before its process exits, taking at most
    /// `timeout`: sends the releases of dropped guards still queued (they go in the
    /// background, which a process that exits never finishes), releases every lock its
    /// live guards still hold, and stops the watchdog; so no lock waits out its lease
    /// (30 s by default) while the next process's requests are refused.
    ///
    /// Afterwards the client takes no lock: every acquisition, one waiting when the
    /// shutdown began included, fails with [`LockError::ShutDown`]. Guards it released
    /// report it: watched ones are [lost](LockGuard::is_lost), and releasing any of them
    /// answers [`LockError::Lost`] or [`LockError::NotHeld`]. Call it once the work that
    /// holds locks has ended (with axum, after `serve(..).with_graceful_shutdown(..)`
    /// returned); a lock acquired while it runs is not released by it. Its
    /// [rate limiters](Self::rate_limiter) keep deciding: a decision holds nothing to give
    /// back.
    ///
    /// ```
    /// # use lockwarden_core::{LockClient, LockError};
    /// # use std::time::Duration;
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let client = LockClient::in_memory();
    /// let dropped = client.acquire("report").await?;
    /// drop(dropped); // its release is queued (on Redis, sent in the background)
    /// let _forgotten = client.acquire("export").await?; // still held
    /// client.shutdown(Duration::from_secs(5)).await?;
    /// assert!(!client.lock("export").is_locked().await?);
    /// assert!(matches!(client.acquire("report").await, Err(LockError::ShutDown { .. })));
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`ShutdownError`] naming the locks whose release Redis did not confirm within
    /// `timeout` (they expire with their leases); the client is shut down all the same.
    pub async fn shutdown(&self, timeout: Duration) -> Result<(), ShutdownError> {
        crate::shutdown::shutdown(&self.engine, timeout).await
    }

    /// Validates `name` and lays it out in this client's key space.
    pub(crate) fn make_key(&self, name: &str) -> Result<Key, crate::error::KeyError> {
        self.engine.key(name)
    }

    /// A handle on the lock at `key` (made by another client: Redlock lays every node's
    /// keys out as its first node does).
    pub(crate) fn lock_at(&self, key: &Key) -> Lock {
        Lock::new(self.engine.clone(), Ok(key.clone()))
    }

    /// Registers a waiter for notices on `channel`.
    pub(crate) fn waiting(&self, channel: &str) -> Waiting {
        self.engine.waiters().register(channel, None).0
    }

    /// Whether `other` is this client or a clone of it.
    pub(crate) fn same_as(&self, other: &LockClient) -> bool {
        Arc::ptr_eq(&self.engine, &other.engine)
    }
}

impl fmt::Debug for LockClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.engine.fmt(f)
    }
}

/// Counters of a client's bookkeeping (see [`LockClient::stats`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct ClientStats {
    /// Holds the watchdog is keeping alive.
    pub watched_locks: usize,
    /// Release channels with local waiters (each one subscription on Redis).
    pub waited_channels: usize,
}
