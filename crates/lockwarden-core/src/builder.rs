//! How a [`LockClient`] is made: [`LockClientBuilder`] and the shorthands on the client.

use std::sync::Arc;
use std::time::Duration;

use crate::client::LockClient;
use crate::engine::Engine;
use crate::error::{BackendError, LockError};
use crate::key::{KeyLayout, KeySpace};
use crate::store::redis::{
    redact, ConnectOptions, Credentials, Deployment, ReleaseNotices, Tls, PROBE,
};
use crate::store::Store;
use crate::waiters::Waiters;

/// The watchdog lease by default: the lease of a hold taken without one of its own.
const DEFAULT_WATCHDOG_LEASE: Duration = Duration::from_secs(30);
/// How long one Redis command may take by default.
const DEFAULT_COMMAND_TIMEOUT: Duration = Duration::from_secs(2);

impl LockClient {
    /// A client on a new in-process store: locks exclude each other within this process
    /// only (clones of this client share the store). No Redis needed.
    ///
    /// ```
    /// # use lockwarden_core::LockClient;
    /// let client = LockClient::in_memory();
    /// let same_store = client.clone();
    /// assert_eq!(same_store.backend_name(), "in-memory");
    /// ```
    pub fn in_memory() -> Self {
        LockClientBuilder::default().in_memory()
    }

    /// Connects to Redis at `url` (e.g. `redis://127.0.0.1:6379/`, or
    /// `rediss://host:6380/` for TLS, trusting the system's root certificates; see
    /// `LockClientBuilder::tls_root_certificate` for a private CA) with default settings.
    ///
    /// ```no_run
    /// # use lockwarden_core::LockClient;
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lockwarden_core::LockError> {
    /// let client = LockClient::connect("redis://127.0.0.1:6379/").await?;
    /// # Ok(()) }
    /// ```
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
}

/// Settings for a [`LockClient`]; finish with [`in_memory`](Self::in_memory) or
/// [`connect`](Self::connect).
#[derive(Debug, Clone)]
#[must_use = "a builder does nothing until `in_memory()` or `connect()`"]
pub struct LockClientBuilder {
    keys: KeySpace,
    watchdog_lease: Duration,
    /// Whether plain holds get fencing tokens.
    fenced: bool,
    connect: ConnectOptions,
    /// Who to log in as on the primary Sentinel names.
    primary: Option<Credentials>,
}

impl Default for LockClientBuilder {
    fn default() -> Self {
        Self {
            keys: KeySpace::default(),
            watchdog_lease: DEFAULT_WATCHDOG_LEASE,
            fenced: true,
            connect: ConnectOptions {
                command_timeout: DEFAULT_COMMAND_TIMEOUT,
                replicas: None,
                tls: Tls::default(),
                check_permissions: true,
                notices: ReleaseNotices::Auto,
            },
            primary: None,
        }
    }
}

impl LockClientBuilder {
    /// Prefix of every Redis key and channel (default `lockwarden:`).
    ///
    /// ```
    /// # use lockwarden_core::LockClient;
    /// let billing = LockClient::builder().namespace("billing:locks:").in_memory();
    /// assert_eq!(billing.key("run:7")?.redis_key(), "billing:locks:{run:7}");
    /// # Ok::<(), lockwarden_core::LockError>(())
    /// ```
    pub fn namespace(mut self, namespace: impl Into<String>) -> Self {
        self.keys.namespace = namespace.into();
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
            self.keys.namespace.clear();
        }
        self.keys.layout = layout;
        self
    }

    /// Longest accepted key name in bytes (default 255).
    ///
    /// ```
    /// # use lockwarden_core::LockClient;
    /// let client = LockClient::builder().max_key_len(8).in_memory();
    /// assert!(client.key("order:42").is_ok());
    /// assert!(client.key("order:4242").is_err());
    /// ```
    pub fn max_key_len(mut self, bytes: usize) -> Self {
        self.keys.max_len = bytes;
        self
    }

    /// Lease of locks acquired without an explicit one; the watchdog renews them every
    /// third of it (default 30 s, at least 3 ms). A holder that dies keeps its lock at
    /// most this long.
    ///
    /// ```
    /// # use lockwarden_core::LockClient;
    /// # use std::time::Duration;
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lockwarden_core::LockError> {
    /// let client = LockClient::builder().watchdog_timeout(Duration::from_secs(9)).in_memory();
    /// let guard = client.acquire("job").await?; // renewed every 3 s while it lives
    /// assert!(client.lock("job").remaining_ttl().await?.unwrap() <= Duration::from_secs(9));
    /// guard.release().await
    /// # }
    /// ```
    pub fn watchdog_timeout(mut self, lease: Duration) -> Self {
        self.watchdog_lease = lease.max(Duration::from_millis(3));
        self
    }

    /// Takes plain locks (and claims, and the HTTP layer's locks) without fencing tokens,
    /// for an application that fences nothing: their guards' [fencing
    /// token](crate::LockGuard::fencing_token) is 0, which no hold ever gets otherwise
    /// and [`FencedValue::write`](crate::FencedValue::write) refuses. Redis then does not
    /// touch the lock's fencing key on acquire, a twelfth of what a lock cycle costs it.
    /// Everything else stays: exclusion, re-entry, the watchdog, notices. Fair,
    /// read-write and multi locks still get tokens, and a client with tokens that takes
    /// the same lock later still gets a token larger than any issued before.
    ///
    /// ```
    /// # use lockwarden_core::LockClient;
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lockwarden_core::LockError> {
    /// let client = LockClient::builder().without_fencing_tokens().in_memory();
    /// let guard = client.acquire("cache:refresh").await?;
    /// assert_eq!(guard.fencing_token(), 0);
    /// guard.release().await
    /// # }
    /// ```
    pub fn without_fencing_tokens(mut self) -> Self {
        self.fenced = false;
        self
    }

    /// How long one Redis command may take before it fails (default 2 s). An acquire
    /// that times out may still have taken the lock: it is given back once its answer
    /// arrives, or, where no answer can come (a cluster drops a call it gave up on), by
    /// the settling of lost replies ([guide](crate::guide::how_it_works#lost-replies)).
    ///
    /// ```no_run
    /// # use lockwarden_core::LockClient;
    /// # use std::time::Duration;
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lockwarden_core::LockError> {
    /// let client = LockClient::builder()
    ///     .command_timeout(Duration::from_millis(500))
    ///     .connect("redis://127.0.0.1:6379/")
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub fn command_timeout(mut self, timeout: Duration) -> Self {
        self.connect.command_timeout = timeout;
        self
    }

    /// Trusts the certificate authorities in `pem` (one or more PEM `CERTIFICATE`
    /// blocks) for `rediss://` connections, **instead of** the system's root
    /// certificates: for a Redis whose certificate a private CA signed (self-hosted, or a
    /// provider that hands out its CA bundle). Call it again to trust more CAs. Needs the
    /// `tls` feature (on by default).
    ///
    /// It applies to every connection the client makes: commands, the pub/sub connection
    /// that carries release notices, the `WAIT` connection of
    /// [`wait_for_replicas`](Self::wait_for_replicas), every node of a cluster, and the
    /// sentinels and the primary they name. Without it, `rediss://` trusts the system's
    /// roots, which is what a managed Redis with a publicly trusted certificate needs.
    /// Certificates given with `redis://` (plain-text) URLs are refused at connect rather
    /// than ignored; a PEM that does not parse fails at connect too. A server whose
    /// certificate is not trusted fails the connect with [`LockError::Backend`] saying so.
    ///
    /// ```no_run
    /// # use lockwarden_core::LockClient;
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let ca = std::fs::read("/etc/redis/tls/ca.crt")?;
    /// let client = LockClient::builder()
    ///     .tls_root_certificate(ca)
    ///     .connect("rediss://redis.internal:6380/")
    ///     .await?;
    /// # Ok(()) }
    /// ```
    #[cfg(feature = "tls")]
    #[cfg_attr(docsrs, doc(cfg(feature = "tls")))]
    pub fn tls_root_certificate(mut self, pem: impl AsRef<[u8]>) -> Self {
        self.connect.tls.add_roots(pem.as_ref());
        self
    }

    /// Presents this client certificate (a PEM chain, leaf first) and its private key
    /// (PEM: PKCS#8, PKCS#1 or SEC1) to servers that ask for one: mutual TLS, for a Redis
    /// started with `tls-auth-clients yes`. Applies to every connection, as
    /// [`tls_root_certificate`](Self::tls_root_certificate) does; only with `rediss://`
    /// URLs. Needs the `tls` feature (on by default).
    ///
    /// ```no_run
    /// # use lockwarden_core::LockClient;
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let client = LockClient::builder()
    ///     .tls_root_certificate(std::fs::read("ca.crt")?)
    ///     .tls_client_identity(std::fs::read("client.crt")?, std::fs::read("client.key")?)
    ///     .connect("rediss://redis.internal:6380/")
    ///     .await?;
    /// # Ok(()) }
    /// ```
    #[cfg(feature = "tls")]
    #[cfg_attr(docsrs, doc(cfg(feature = "tls")))]
    pub fn tls_client_identity(
        mut self,
        certificate_pem: impl Into<Vec<u8>>,
        private_key_pem: impl Into<Vec<u8>>,
    ) -> Self {
        self.connect
            .tls
            .set_identity(certificate_pem.into(), private_key_pem.into());
        self
    }

    /// Makes every acquisition wait until `replicas` replicas have acknowledged it (Redis
    /// `WAIT`, sent in the same round trip as the acquire script), for at most `timeout`.
    /// An acquisition fewer replicas acknowledged in time is released and reported as
    /// [`BackendError::NotReplicated`](crate::BackendError::NotReplicated), so a failover
    /// to a replica cannot hand a lock you were told you hold to someone else, as long as
    /// that replica is among those that acknowledged. Costs the replication delay on every acquisition, and acquisitions
    /// share one connection of their own (`WAIT` blocks the connection it is sent on, so
    /// renewals and releases do not queue behind it). Releases and renewals do not wait.
    /// Applies to every kind: plain, fair and read-write acquisitions, claims and a
    /// [`multi_lock`](LockClient::multi_lock) (a set not acknowledged is given back whole).
    /// On a cluster each `WAIT` goes to the master that took the lock and counts its
    /// replicas. Ignored by the in-process store.
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
        self.connect.replicas = (replicas > 0).then_some((replicas, timeout));
        self
    }

    /// Connects without checking that the Redis user may run every command lockwarden
    /// needs. By default connecting asks Redis (7.0 or later, one script call) and fails
    /// with [`BackendError::NotPermitted`](crate::BackendError::NotPermitted) naming
    /// every command the user's ACL refuses: a command refused in the middle of a script
    /// cannot undo what the script already wrote, so a refused `PEXPIRE` would leave a
    /// lock that never expires. Skip it for a user meant to run only some operations
    /// (an operator's user that only force-unlocks). Ignored by the in-process store.
    ///
    /// ```no_run
    /// # use lockwarden_core::LockClient;
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lockwarden_core::LockError> {
    /// let operator = LockClient::builder()
    ///     .skip_permission_check()
    ///     .connect("redis://unlocker:secret@127.0.0.1:6379/")
    ///     .await?;
    /// operator.lock("invoice:7").force_unlock().await?;
    /// # Ok(()) }
    /// ```
    pub fn skip_permission_check(mut self) -> Self {
        self.connect.check_permissions = false;
        self
    }

    /// How release notices travel on a Redis Cluster (default [`ReleaseNotices::Auto`]:
    /// sharded `SPUBLISH`/`SSUBSCRIBE` when every master runs Redis 7.0 or later, classic
    /// `PUBLISH`/`SUBSCRIBE` otherwise). Pin [`ReleaseNotices::Classic`] when other clients
    /// of the same locks listen classically (Redisson clients configured so), or
    /// [`ReleaseNotices::Sharded`] to refuse to connect to a cluster with an older master
    /// instead of falling back. While a master cannot be reached, connecting fails with a
    /// transient error. Ignored by one server, Sentinel and the in-process store.
    ///
    /// ```no_run
    /// use lockwarden_core::{LockClient, ReleaseNotices};
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lockwarden_core::LockError> {
    /// let client = LockClient::builder()
    ///     .notices(ReleaseNotices::Sharded)
    ///     .connect_cluster(["redis://127.0.0.1:7000/", "redis://127.0.0.1:7001/"])
    ///     .await?;
    /// # drop(client); Ok(()) }
    /// ```
    pub fn notices(mut self, notices: ReleaseNotices) -> Self {
        self.connect.notices = notices;
        self
    }

    /// Logs in to the primary that [`connect_sentinel`](Self::connect_sentinel)'s
    /// sentinels name, and to each replica promoted after it, as the ACL user `username`
    /// with `password` (for a primary with only `requirepass`: the user `default`).
    /// Credentials in the sentinel URLs are the sentinels' own; these are the data
    /// servers', and every connection to the primary uses them: commands, the pub/sub
    /// connection that carries release notices, and the `WAIT` connection of
    /// [`wait_for_replicas`](Self::wait_for_replicas). The user needs what any
    /// lockwarden user needs (see [ACL users](crate::guide::connecting#acl-users)); connecting checks it. The other connects
    /// refuse this setting: a server's or a cluster's credentials go in its URLs.
    ///
    /// ```no_run
    /// # use lockwarden_core::LockClient;
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let client = LockClient::builder()
    ///     .primary_credentials("locks", std::env::var("REDIS_PASSWORD")?)
    ///     .connect_sentinel(["redis://127.0.0.1:26379/"], "mymaster")
    ///     .await?;
    /// # drop(client); Ok(()) }
    /// ```
    pub fn primary_credentials(
        mut self,
        username: impl Into<String>,
        password: impl Into<String>,
    ) -> Self {
        self.primary = Some(Credentials {
            username: username.into(),
            password: password.into(),
        });
        self
    }

    /// A client on a new in-process store.
    ///
    /// ```
    /// # use lockwarden_core::LockClient;
    /// let client = LockClient::builder().namespace("tests:").in_memory();
    /// # let _ = client;
    /// ```
    pub fn in_memory(self) -> LockClient {
        let (store, waiters) = Store::in_memory();
        self.finish(store, waiters)
    }

    /// A client on the Redis server at `url` (`redis://`, or `rediss://` for TLS).
    ///
    /// ```no_run
    /// # use lockwarden_core::LockClient;
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lockwarden_core::LockError> {
    /// let client = LockClient::builder()
    ///     .namespace("orders:")
    ///     .connect("redis://127.0.0.1:6379/")
    ///     .await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`BackendError::InvalidUrl`] saying what is wrong with a URL that is not one,
    /// [`BackendError::Connect`] naming the address if Redis cannot be reached within the
    /// command timeout, or another [`LockError::Backend`] (TLS trust, ACL permissions).
    pub async fn connect(self, url: &str) -> Result<LockClient, LockError> {
        check_url(url)?;
        let client = self.connect.tls.open(url)?;
        self.connect_to(Deployment::Server(client)).await
    }

    /// A client on the Redis server an existing [`redis::Client`] points at: its address,
    /// credentials and TLS settings, configured once by the application. Commands go over
    /// lockwarden's own auto-reconnecting connection made from it, release notices over
    /// its own pub/sub connection.
    ///
    /// ```no_run
    /// # use lockwarden_core::LockClient;
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let redis = lockwarden_core::redis::Client::open("redis://127.0.0.1:6379/")?;
    /// let client = LockClient::builder().connect_client(redis).await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`LockError::Backend`] if Redis cannot be reached within the command timeout.
    pub async fn connect_client(self, client: redis::Client) -> Result<LockClient, LockError> {
        self.connect_to(Deployment::Server(client)).await
    }

    /// A client whose commands go through a deadpool-redis `pool` the application already
    /// has (size, timeouts, credentials and TLS configured once). Release notices need a
    /// connection of their own that subscribes, which a pooled connection cannot be: it
    /// is opened from `notices`, a client for the same server.
    ///
    /// Every command checks a connection out of the pool, and deadpool checks each one
    /// back in with a `PING`, so each lock operation costs the pool's round trip on top of
    /// its own (see `BENCHMARKS.md`); the default [`connect`](Self::connect) multiplexes
    /// one connection instead. Use the pool when the application must bound or account
    /// for every connection it opens.
    ///
    /// ```no_run
    /// # use lockwarden_core::LockClient;
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let url = "redis://127.0.0.1:6379/";
    /// let pool = deadpool_redis::Config::from_url(url).create_pool(Some(deadpool_redis::Runtime::Tokio1))?;
    /// let notices = lockwarden_core::redis::Client::open(url)?;
    /// let client = LockClient::builder().connect_pool(pool, notices).await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`LockError::Backend`] if the pool gives no connection, or Redis cannot be reached,
    /// within the command timeout.
    #[cfg(feature = "deadpool")]
    #[cfg_attr(docsrs, doc(cfg(feature = "deadpool")))]
    pub async fn connect_pool(
        self,
        pool: deadpool_redis::Pool,
        notices: redis::Client,
    ) -> Result<LockClient, LockError> {
        self.connect_to(Deployment::Pool { pool, notices }).await
    }

    /// A client on the server a deadpool-redis `config` names: the pool is made from it
    /// (on Tokio), and the pub/sub connection from its address (see
    /// [`connect_pool`](Self::connect_pool)).
    ///
    /// ```no_run
    /// # use lockwarden_core::LockClient;
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lockwarden_core::LockError> {
    /// let config = deadpool_redis::Config::from_url("redis://127.0.0.1:6379/");
    /// let client = LockClient::builder().connect_deadpool(&config).await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`LockError::Backend`] if the configuration is invalid (e.g. both a URL and
    /// connection fields) or Redis cannot be reached within the command timeout.
    #[cfg(feature = "deadpool")]
    #[cfg_attr(docsrs, doc(cfg(feature = "deadpool")))]
    pub async fn connect_deadpool(
        self,
        config: &deadpool_redis::Config,
    ) -> Result<LockClient, LockError> {
        use crate::error::BackendError;
        let invalid = |what: String| {
            let kind = redis::ErrorKind::InvalidClientConfig;
            BackendError::Redis(redis::RedisError::from((
                kind,
                "deadpool-redis config",
                what,
            )))
        };
        // The pub/sub connection trusts what this builder trusts (`tls_root_certificate`).
        let notices = match (&config.url, &config.connection) {
            (Some(url), None) => self.connect.tls.open(url)?,
            (None, Some(info)) => {
                let info = redis::ConnectionInfo::from(info.clone());
                redis::Client::open(info).map_err(BackendError::from)?
            }
            (None, None) => {
                let info = redis::ConnectionInfo::from(deadpool_redis::ConnectionInfo::default());
                redis::Client::open(info).map_err(BackendError::from)?
            }
            (Some(_), Some(_)) => {
                return Err(invalid("both a URL and connection fields are set".into()).into())
            }
        };
        let pool = config
            .create_pool(Some(deadpool_redis::Runtime::Tokio1))
            .map_err(|e| invalid(e.to_string()))?;
        self.connect_pool(pool, notices).await
    }

    /// A client on a Redis Cluster, found through any of `nodes` (one reachable node is
    /// enough; the client learns the others and follows slots as they move).
    ///
    /// Every key of one lock carries the lock's hash tag, so each script touches one slot
    /// and runs on the node that owns it; the release channel is in that slot too. A
    /// [`multi_lock`](LockClient::multi_lock) whose locks live in different slots takes
    /// them slot by slot, in one order for every caller, and gives back what it took if a
    /// later one is busy. With `rediss://` addresses every node connection uses TLS.
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
        let nodes: Vec<String> = nodes.into_iter().map(|n| n.as_ref().to_owned()).collect();
        for node in &nodes {
            check_url(node)?;
        }
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
    /// [`wait_for_replicas`](Self::wait_for_replicas) narrows the window. With
    /// `rediss://` sentinels, the sentinels and the primary are both reached over TLS.
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
        mut self,
        sentinels: I,
        service: &str,
    ) -> Result<LockClient, LockError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let sentinels: Vec<String> = sentinels
            .into_iter()
            .map(|n| n.as_ref().to_owned())
            .collect();
        for sentinel in &sentinels {
            check_url(sentinel)?;
        }
        let primary = self.primary.take();
        self.connect_to(Deployment::Sentinel {
            sentinels,
            service: service.to_owned(),
            primary,
        })
        .await
    }

    async fn connect_to(self, deployment: Deployment) -> Result<LockClient, LockError> {
        // `connect_sentinel` took them.
        if self.primary.is_some() {
            return Err(BackendError::config(
                "primary_credentials is for connect_sentinel",
                "give a server's or a cluster's credentials in its URL".to_owned(),
            )
            .into());
        }
        deployment.check()?;
        // The user's permissions are checked on a key and channel of this key space.
        let probe = match self.connect.check_permissions {
            true => Some(self.keys.key(PROBE)?),
            false => None,
        };
        // Boxed: the cluster and sentinel clients' connect futures are deep enough to
        // overflow the layout depth of the futures that embed this one.
        let connecting = Store::connect(&deployment, &self.connect, probe.as_ref());
        let (store, waiters) = Box::pin(connecting).await.map_err(|error| {
            // Not reached (refused, no such host, no answer in time): say where it looked.
            match unreached(&error) {
                true => BackendError::Connect {
                    address: deployment.address(),
                    source: Box::new(error),
                },
                false => error,
            }
        })?;
        Ok(self.finish(store, waiters))
    }

    fn finish(self, store: Store, waiters: Arc<Waiters>) -> LockClient {
        let engine = Engine::new(self.keys, self.watchdog_lease, self.fenced, store, waiters);
        LockClient::from_engine(engine)
    }
}

/// Whether `error` says the server was not reached: refused, no such host, a connection
/// that broke, no answer in time (not a server that answered with an error).
fn unreached(error: &BackendError) -> bool {
    match error {
        BackendError::TimedOut(_) | BackendError::Unreachable(_) => true,
        BackendError::Redis(e) => {
            e.is_io_error()
                || e.is_connection_refusal()
                || e.is_connection_dropped()
                || e.is_timeout()
        }
        _ => false,
    }
}

/// The schemes of the URLs Redis (or Valkey) answers on.
const SCHEMES: [&str; 7] = [
    "redis",
    "rediss",
    "valkey",
    "valkeys",
    "redis+unix",
    "valkey+unix",
    "unix",
];

/// Refuses a URL that is not a Redis URL, saying what is wrong with it (redis-rs says
/// only a few words, and `InvalidClientConfig`).
fn check_url(url: &str) -> Result<(), BackendError> {
    use redis::IntoConnectionInfo;
    let Err(error) = url.into_connection_info() else {
        return Ok(());
    };
    let problem = match url.split_once("://") {
        None => "it has no scheme: a Redis URL starts with redis://, rediss:// (TLS), \
                 valkey:// or unix://"
            .to_owned(),
        Some((scheme, _)) if !SCHEMES.contains(&scheme.to_ascii_lowercase().as_str()) => {
            format!("`{scheme}://` is not a scheme Redis answers on")
        }
        Some(_) if redis::parse_redis_url(url).is_none() => {
            "it does not parse as a URL (a space, a stray character, a port that is not a \
             number?)"
                .to_owned()
        }
        Some(_) => reason(&error),
    };
    Err(BackendError::InvalidUrl {
        url: redact(url),
        problem,
    })
}

/// redis-rs's few words on a URL it refused (`Missing hostname`), without the kind.
fn reason(error: &redis::RedisError) -> String {
    let text = error.to_string().replacen(" - InvalidClientConfig", "", 1);
    let mut chars = text.chars();
    match chars.next() {
        Some(first) => first.to_lowercase().chain(chars).collect(),
        None => text,
    }
}
