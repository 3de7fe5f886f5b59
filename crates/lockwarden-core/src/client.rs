//! The lock client: one per process and store, cheap to clone. It owns the connections
//! and the background tasks (watchdog, pub/sub, releases of dropped guards).

use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::backend::{Backend, Kind, Released};
use crate::error::{BackendError, KeyError, LockError};
use crate::fair::FairLock;
use crate::guard::{LockGuard, LockInfo};
use crate::holder::Holder;
use crate::key::{Key, KeyLayout, DEFAULT_MAX_KEY_LEN, DEFAULT_NAMESPACE};
use crate::lock::Lock;
use crate::memory::MemoryBackend;
use crate::multi::MultiLock;
use crate::redis::conn::Deployment;
use crate::redis::{pubsub, RedisBackend};
use crate::rw::RwLock;
use crate::waiters::Waiters;
use crate::watchdog::Watchdog;

/// A handle to a lock store (Redis or in-process). Clones share everything.
///
/// Per client there is one command connection, one pub/sub connection that carries every
/// wait, and one watchdog task that renews every held lock.
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
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub(crate) id: String,
    pub(crate) config: Config,
    pub(crate) backend: Backend,
    pub(crate) waiters: Arc<Waiters>,
    pub(crate) watchdog: Arc<Watchdog>,
    watchdog_task: OnceLock<JoinHandle<()>>,
    pubsub_task: Option<JoinHandle<()>>,
    /// Guards dropped without `release().await` (Redis only; in-process releases at once).
    dropped: Option<mpsc::UnboundedSender<(Kind, Key, Holder)>>,
    holders: AtomicU64,
}

#[derive(Clone, Debug)]
pub(crate) struct Config {
    pub(crate) namespace: String,
    pub(crate) layout: KeyLayout,
    pub(crate) max_key_len: usize,
    pub(crate) watchdog_timeout: Duration,
    pub(crate) command_timeout: Duration,
    pub(crate) replicas: Option<(u32, Duration)>,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            namespace: DEFAULT_NAMESPACE.to_owned(),
            layout: KeyLayout::Tagged,
            max_key_len: DEFAULT_MAX_KEY_LEN,
            watchdog_timeout: Duration::from_secs(30),
            command_timeout: Duration::from_secs(2),
            replicas: None,
        }
    }
}

impl LockClient {
    /// A client on a new in-process store: locks exclude each other within this process
    /// only (clones of this client share the store). No Redis needed.
    pub fn in_memory() -> Self {
        LockClientBuilder::default().in_memory()
    }

    /// Connects to Redis at `url` (e.g. `redis://127.0.0.1:6379/`) with default settings.
    ///
    /// # Errors
    /// [`LockError::Backend`] if the URL is invalid or Redis cannot be reached.
    pub async fn connect(url: &str) -> Result<Self, LockError> {
        LockClientBuilder::default().connect(url).await
    }

    /// A builder for a client with non-default settings.
    ///
    /// ```
    /// # use lockwarden_core::LockClient;
    /// # use std::time::Duration;
    /// let client = LockClient::builder()
    ///     .namespace("billing:locks:")
    ///     .watchdog_timeout(Duration::from_secs(10))
    ///     .in_memory();
    /// ```
    pub fn builder() -> LockClientBuilder {
        LockClientBuilder::default()
    }

    /// Validates `name` and lays it out under this client's namespace.
    ///
    /// # Errors
    /// [`LockError::InvalidKey`] if the name is empty, too long or has control characters.
    pub fn key(&self, name: &str) -> Result<Key, LockError> {
        Ok(self.make_key(name)?)
    }

    fn make_key(&self, name: &str) -> Result<Key, KeyError> {
        let config = &self.inner.config;
        Key::new(&config.namespace, config.max_key_len, config.layout, name)
    }

    /// A new holder identity of this client (see [`Holder`]).
    pub fn holder(&self) -> Holder {
        Holder::new(
            &self.inner.id,
            self.inner.holders.fetch_add(1, Ordering::Relaxed),
        )
    }

    /// A handle on the lock named `name`, to configure and then acquire or inspect it.
    /// An invalid name is reported by the operation that uses it.
    pub fn lock(&self, name: impl AsRef<str>) -> Lock {
        Lock::new(self.clone(), self.make_key(name.as_ref()))
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
        RwLock::new(self.clone(), self.make_key(name.as_ref()))
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
        FairLock::new(self.clone(), self.make_key(name.as_ref()))
    }

    /// Several locks to take as one (all or nothing, in a fixed order; see [`MultiLock`]).
    pub fn multi_lock<I, S>(&self, names: I) -> MultiLock
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        MultiLock::new(self.clone(), names.into_iter().map(Into::into).collect())
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
    pub fn backend_name(&self) -> &'static str {
        match self.inner.backend {
            Backend::Redis(_) => "redis",
            Backend::Memory(_) => "in-memory",
        }
    }

    /// Counters of the client's bookkeeping, for tests and metrics.
    pub fn stats(&self) -> ClientStats {
        ClientStats {
            watched_locks: self.inner.watchdog.len(),
            waited_channels: self.inner.waiters.len(),
        }
    }

    /// Starts the watchdog task on first use (an in-process client may be made outside a runtime).
    pub(crate) fn ensure_watchdog(&self) {
        self.inner.watchdog_task.get_or_init(|| {
            let watchdog = self.inner.watchdog.clone();
            let backend = self.inner.backend.clone();
            tokio::spawn(async move { watchdog.run(backend).await })
        });
    }

    /// Releases a guard that was dropped: at once in-process, through the release task on Redis.
    pub(crate) fn release_dropped(&self, kind: Kind, key: Key, holder: Holder) {
        match (&self.inner.backend, &self.inner.dropped) {
            (Backend::Memory(memory), _) => {
                memory.release(kind, &key, &holder, None);
            }
            (Backend::Redis(_), Some(dropped)) => {
                let _ = dropped.send((kind, key, holder));
            }
            (Backend::Redis(_), None) => {}
        }
    }
}

impl fmt::Debug for LockClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockClient")
            .field("id", &self.inner.id)
            .field("backend", &self.backend_name())
            .field("namespace", &self.inner.config.namespace)
            .finish()
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        if let Some(task) = self.watchdog_task.get() {
            task.abort();
        }
        if let Some(task) = &self.pubsub_task {
            task.abort();
        }
        // The release task ends by itself once it has drained the queue.
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

/// Settings for a [`LockClient`]; finish with [`in_memory`](Self::in_memory) or
/// [`connect`](Self::connect).
#[derive(Debug, Clone, Default)]
#[must_use = "a builder does nothing until `in_memory()` or `connect()`"]
pub struct LockClientBuilder {
    config: Config,
}

impl LockClientBuilder {
    /// Prefix of every Redis key and channel (default `lockwarden:`).
    pub fn namespace(mut self, namespace: impl Into<String>) -> Self {
        self.config.namespace = namespace.into();
        self
    }

    /// How lock names become Redis keys (default [`KeyLayout::Tagged`]).
    /// [`KeyLayout::Redisson`] also clears the namespace (Redisson has none); set one
    /// after it if your Redisson lock names carry a prefix.
    ///
    /// ```
    /// use lockwarden_core::{KeyLayout, LockClient};
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lockwarden_core::LockError> {
    /// // Exclude a JVM service that locks `RLock lock = redisson.getLock("invoice:7")`:
    /// let client = LockClient::builder().layout(KeyLayout::Redisson).in_memory();
    /// // LockClient::builder().layout(KeyLayout::Redisson).connect(url).await? on Redis.
    /// let guard = client.acquire("invoice:7").await?;
    /// assert_eq!(guard.key().redis_key(), "invoice:7");
    /// # guard.release().await }
    /// ```
    pub fn layout(mut self, layout: KeyLayout) -> Self {
        if layout == KeyLayout::Redisson {
            self.config.namespace.clear();
        }
        self.config.layout = layout;
        self
    }

    /// Longest accepted key name in bytes (default 255).
    pub fn max_key_len(mut self, bytes: usize) -> Self {
        self.config.max_key_len = bytes;
        self
    }

    /// Lease of locks acquired without an explicit one; the watchdog renews them every
    /// third of it (default 30 s, at least 3 ms).
    pub fn watchdog_timeout(mut self, lease: Duration) -> Self {
        self.config.watchdog_timeout = lease.max(Duration::from_millis(3));
        self
    }

    /// How long one Redis command may take before it fails (default 2 s).
    pub fn command_timeout(mut self, timeout: Duration) -> Self {
        self.config.command_timeout = timeout;
        self
    }

    /// Makes every acquisition wait until `replicas` replicas have acknowledged it (Redis
    /// `WAIT`, sent in the same round trip as the acquire script), for at most `timeout`.
    /// An acquisition fewer replicas acknowledged in time is released and reported as
    /// [`BackendError::NotReplicated`], so a failover to a replica cannot hand a lock
    /// you were told you hold to someone else, as long as that replica is among those
    /// that acknowledged. Costs the replication delay on every acquisition, and acquisitions
    /// share one connection of their own (`WAIT` blocks the connection it is sent on, so
    /// renewals and releases do not queue behind it). Releases and renewals do not wait.
    /// Applies to plain, fair and read-write acquisitions and claims; a
    /// [`multi_lock`](LockClient::multi_lock) does not wait. Ignored by the in-process store.
    ///
    /// ```no_run
    /// # use lockwarden_core::LockClient;
    /// # use std::time::Duration;
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lockwarden_core::LockError> {
    /// let client = LockClient::builder()
    ///     .wait_for_replicas(1, Duration::from_millis(50))
    ///     .connect("redis://127.0.0.1:6379/")
    ///     .await?;
    /// let guard = client.acquire("payout:9").await?; // on the primary and one replica
    /// # guard.release().await }
    /// ```
    pub fn wait_for_replicas(mut self, replicas: u32, timeout: Duration) -> Self {
        self.config.replicas = (replicas > 0).then_some((replicas, timeout));
        self
    }

    /// A client on a new in-process store.
    pub fn in_memory(self) -> LockClient {
        let waiters = Arc::new(Waiters::local());
        let backend = Backend::Memory(Arc::new(MemoryBackend::new(waiters.clone())));
        self.finish(backend, waiters, None, None)
    }

    /// A client on the Redis server at `url`.
    ///
    /// # Errors
    /// [`LockError::Backend`] if the URL is invalid or Redis cannot be reached within the
    /// command timeout.
    pub async fn connect(self, url: &str) -> Result<LockClient, LockError> {
        let client = redis::Client::open(url).map_err(BackendError::from)?;
        self.connect_to(Deployment::Server(client)).await
    }

    /// A client on a Redis Cluster, found through any of `nodes` (one reachable node is
    /// enough; the client learns the others and follows slots as they move).
    ///
    /// Every key of one lock carries the lock's hash tag, so each script touches one slot
    /// and runs on the node that owns it; the release channel is in that slot too. A
    /// [`multi_lock`](LockClient::multi_lock) whose locks live in different slots takes
    /// them slot by slot, in one order for every caller, and gives back what it took if a
    /// later one is busy.
    ///
    /// ```no_run
    /// # use lockwarden_core::LockClient;
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lockwarden_core::LockError> {
    /// let client = LockClient::builder()
    ///     .connect_cluster(["redis://127.0.0.1:7000/", "redis://127.0.0.1:7001/"])
    ///     .await?;
    /// let guard = client.acquire("invoice:7").await?;
    /// # guard.release().await }
    /// ```
    ///
    /// # Errors
    /// [`LockError::Backend`] if an address is invalid or the cluster cannot be reached
    /// within the command timeout.
    pub async fn connect_cluster<I, S>(self, nodes: I) -> Result<LockClient, LockError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let nodes = nodes.into_iter().map(|n| n.as_ref().to_owned()).collect();
        self.connect_to(Deployment::Cluster(nodes)).await
    }

    /// A client on the primary that the Redis Sentinels at `sentinels` name for `service`,
    /// followed across failovers.
    ///
    /// Replication is asynchronous, so a failover can lose a lock the old primary granted
    /// but had not passed on. The client does not hide that: each lock held with the
    /// watchdog is renewed on the new primary, and one that is not there is marked lost
    /// ([`LockGuard::lost`](crate::LockGuard::lost) fires). Commands in flight when the
    /// primary fails return errors; the next ones go to the new primary.
    /// [`wait_for_replicas`](Self::wait_for_replicas) narrows the window.
    ///
    /// ```no_run
    /// # use lockwarden_core::LockClient;
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lockwarden_core::LockError> {
    /// let client = LockClient::builder()
    ///     .connect_sentinel(["redis://127.0.0.1:26379/"], "mymaster")
    ///     .await?;
    /// let guard = client.acquire("invoice:7").await?;
    /// # guard.release().await }
    /// ```
    ///
    /// # Errors
    /// [`LockError::Backend`] if an address is invalid or no sentinel names a reachable
    /// primary within the command timeout.
    pub async fn connect_sentinel<I, S>(
        self,
        sentinels: I,
        service: &str,
    ) -> Result<LockClient, LockError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let sentinels = sentinels
            .into_iter()
            .map(|n| n.as_ref().to_owned())
            .collect();
        self.connect_to(Deployment::Sentinel {
            sentinels,
            service: service.to_owned(),
        })
        .await
    }

    async fn connect_to(self, deployment: Deployment) -> Result<LockClient, LockError> {
        deployment.check()?;
        // Boxed: the cluster and sentinel clients' connect futures are deep enough to
        // overflow the layout depth of the futures that embed this one.
        let (redis, source) = Box::pin(RedisBackend::connect(
            &deployment,
            self.config.command_timeout,
            self.config.replicas,
        ))
        .await?;

        let (changes_tx, changes_rx) = mpsc::unbounded_channel();
        let waiters = Arc::new(Waiters::remote(changes_tx));
        let pubsub_task = tokio::spawn(pubsub::run(source, waiters.clone(), changes_rx));

        let (dropped_tx, dropped_rx) = mpsc::unbounded_channel();
        tokio::spawn(release_dropped(redis.clone(), dropped_rx));

        Ok(self.finish(
            Backend::Redis(redis),
            waiters,
            Some(pubsub_task),
            Some(dropped_tx),
        ))
    }

    fn finish(
        self,
        backend: Backend,
        waiters: Arc<Waiters>,
        pubsub_task: Option<JoinHandle<()>>,
        dropped: Option<mpsc::UnboundedSender<(Kind, Key, Holder)>>,
    ) -> LockClient {
        LockClient {
            inner: Arc::new(Inner {
                id: uuid::Uuid::new_v4().to_string(),
                watchdog: Arc::new(Watchdog::new(self.config.watchdog_timeout)),
                config: self.config,
                backend,
                waiters,
                watchdog_task: OnceLock::new(),
                pubsub_task,
                dropped,
                holders: AtomicU64::new(0),
            }),
        }
    }
}

/// Releases dropped guards, all that queued up meanwhile in one pipeline.
async fn release_dropped(
    redis: RedisBackend,
    mut queue: mpsc::UnboundedReceiver<(Kind, Key, Holder)>,
) {
    let mut batch = Vec::new();
    while queue.recv_many(&mut batch, 1024).await > 0 {
        match redis.release_many(&batch).await {
            Ok(outcomes) => {
                for ((_, key, _), outcome) in batch.iter().zip(outcomes) {
                    if outcome == Released::NotHeld {
                        tracing::debug!(%key, "dropped guard's lock was no longer held");
                    }
                }
            }
            Err(error) => tracing::warn!(%error, locks = batch.len(),
                "could not release dropped guards; their locks expire with their leases"),
        }
        batch.clear();
    }
}
