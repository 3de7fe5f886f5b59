//! Redlock: one lock over N independent Redis masters, held only while a majority of them
//! grant it. This module owns the node set and its settings ([`Redlock`],
//! [`RedlockBuilder`]), the acquisition rounds ([`RedlockLock`]) and the guard
//! ([`RedlockGuard`]).
//!
//! The algorithm, and what it does and does not promise, are documented on [`Redlock`].

mod error;
mod guard;

use std::collections::HashSet;
use std::fmt;
use std::hash::{BuildHasher, Hasher};
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::{join_all, select_all, try_join_all};
use tokio::time::Instant;

pub use error::RedlockError;
pub use guard::RedlockGuard;

use crate::backend::{Attempt, Backend, Kind, Released, Renewal};
use crate::client::LockClient;
use crate::error::{BackendError, KeyError, LockError};
use crate::holder::Holder;
use crate::key::Key;

const DEFAULT_LEASE: Duration = Duration::from_secs(30);
const DEFAULT_DRIFT_FACTOR: f64 = 0.01;
/// Added to the drift: Redis expires keys with millisecond precision.
const DRIFT_FLOOR: Duration = Duration::from_millis(2);
const DEFAULT_NODE_TIMEOUT: Duration = Duration::from_millis(100);
const DEFAULT_RETRY_DELAY: Duration = Duration::from_millis(200);
const DEFAULT_MAX_EXTENSIONS: u32 = 10;
/// Without a notice, a waiter re-checks after this many retry delays at the latest.
const RECHECK_DELAYS: u32 = 10;
/// Used when a node reports a lock without expiry (not one of ours).
const NO_TTL_RECHECK: Duration = Duration::from_secs(1);

/// A lock over N independent Redis masters that holds only with a majority. Cheap to
/// clone; clones share the node clients. Read what it does **not** promise below before
/// using it.
///
/// # The algorithm as implemented
///
/// * **Nodes.** N independent Redis masters (no replication between them), N odd: 1 for
///   development, 3 or 5 in production. Each node is driven by its own [`LockClient`] and
///   the same scripts as a single-node lock, so a node's key is an ordinary lockwarden lock.
/// * **A round.** A fresh holder id (the same on every node) asks every node at once, each
///   answer bounded by the node timeout (default 100 ms, far below the lease). The round
///   started at `t0`; the lock is valid until `t0 + lease - drift`, with
///   `drift = lease * clock_drift_factor + 2 ms` (default factor 0.01). It is held iff a
///   majority (`N / 2 + 1`) took it and that instant is still ahead once every node has
///   answered or timed out.
/// * **A failed round** is undone on every node that did not answer "busy", including the
///   ones that timed out (their script may still run): the releases are sent before the
///   next round, and a fresh holder id per round keeps a late release from touching a
///   later hold.
/// * **Waiting.** While another holder has a majority, the waiter subscribes to the
///   release notices of every node (through each node client's pub/sub) and retries on the
///   first one, when the holder's lease should end, or after ten retry delays at the latest
///   (so a lost notice costs no more). When nobody has a majority (a split vote between
///   contenders, or nodes down) it retries after a random delay up to the retry delay
///   (default 200 ms), so contenders that failed together do not retry together. At the
///   wait budget it gives up with [`LockError::Timeout`] (someone holds it) or
///   [`RedlockError::NoQuorum`] (too few nodes answered to make a majority).
/// * **Extension** renews the lease on every node; it succeeds only if a majority still
///   held it and the fresh validity (from the start of the extension) is still ahead; at
///   most [`max_extensions`](RedlockBuilder::max_extensions) times per guard, so a stuck
///   holder cannot keep the lock forever. A failed extension leaves the old validity; when
///   that runs out the guard is lost ([`RedlockGuard::lost`]).
/// * **Release** is sent to every node; dropping a guard releases in the background.
///
/// # What it promises, and what it does not
///
/// Redlock gives mutual exclusion *while the validity lasts*, under assumptions about time:
/// the clocks of the client and the nodes advance at about the same rate (within the drift
/// factor), nothing (GC, a stopped process, a swapped-out VM, network delay) pauses the
/// holder for longer than its remaining validity between checking it and using the
/// resource, and a node that crashes does not come back without the keys it had granted
/// (run it with `appendfsync always`, or keep it down for longer than the lease before it
/// rejoins: a "delayed restart").
///
/// It does **not** protect against any of these:
/// * a holder paused past its validity keeps acting while a second holder has the lock;
/// * a clock jump on a node (an NTP step, an operator) expires keys early and lets a second
///   holder take a majority;
/// * a node restarted without its data (the throw-away servers in our tests are like that)
///   forgets holds, so two holders can each count it in their majority;
/// * the nodes must not be replicas or failover pairs of each other: a master that fails
///   over before its replica received the key hands the lock out twice. The project's
///   seed articles describe this race from the Redis documentation and conclude that
///   Redisson has not solved it for master-replica, Sentinel or Cluster setups (seed
///   `001_c859c4ef7c70e9e0.txt`, first and last sections); seed `004_dd186fbb8ffead1f.txt`
///   lists Redlock as the fix to that problem and marks it as disputed, and seed
///   `000_f7c8715b0d988db4.txt` points to Redisson's `RedLock` for several masters.
///
/// Martin Kleppmann, "How to do distributed locking" (2016), shows that a lock built on
/// timing cannot be safe in an asynchronous system and that a lock service must hand out
/// *fencing tokens* that the protected resource checks; Salvatore Sanfilippo (antirez)
/// answers in "Is Redlock safe?" (2016) that Redlock is safe under its timing assumptions.
/// Whatever one concludes, **the fencing token, checked by the resource, is the real
/// safety net.** Pass [`RedlockGuard::fencing_token`] with every write and have the
/// resource refuse tokens lower than the highest it has seen. Redlock has no counter that
/// all nodes agree on, so its token is best effort: see that method for what it does and
/// does not order.
///
/// For most web services a single Redis (see [`LockClient`]) is the better choice:
/// replicated, with [`wait_for_replicas`](crate::LockClientBuilder::wait_for_replicas)
/// (Redis `WAIT`) where a failover must not lose a hold, and with fencing tokens.
/// Redlock's extra nodes buy availability through the loss of a node, not a guarantee the
/// fencing token does not already give; choose it for that, knowing its timing
/// assumptions.
///
/// ```no_run
/// use lockwarden_core::{LockError, Redlock};
/// use std::time::Duration;
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), LockError> {
/// let redlock = Redlock::builder()
///     .lease(Duration::from_secs(10))
///     .connect(&["redis://10.0.0.1/", "redis://10.0.0.2/", "redis://10.0.0.3/"])
///     .await?;
/// let guard = redlock.lock("nightly-report").try_acquire(Duration::from_secs(2)).await?;
/// // Give guard.fencing_token() to the resource; stop before guard.valid_until().
/// guard.release().await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Redlock {
    shared: Arc<Shared>,
}

struct Shared {
    nodes: Vec<LockClient>,
    config: Config,
}

#[derive(Debug, Clone)]
struct Config {
    lease: Duration,
    drift_factor: f64,
    node_timeout: Duration,
    retry_delay: Duration,
    max_extensions: u32,
    namespace: Option<String>,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            lease: DEFAULT_LEASE,
            drift_factor: DEFAULT_DRIFT_FACTOR,
            node_timeout: DEFAULT_NODE_TIMEOUT,
            retry_delay: DEFAULT_RETRY_DELAY,
            max_extensions: DEFAULT_MAX_EXTENSIONS,
            namespace: None,
        }
    }
}

impl Config {
    /// How much earlier than the nodes' expiry the holder must consider the lock gone.
    fn drift(&self) -> Duration {
        self.lease.mul_f64(self.drift_factor) + DRIFT_FLOOR
    }

    fn validate(&self) -> Result<(), RedlockError> {
        if !(0.0..1.0).contains(&self.drift_factor) {
            return Err(RedlockError::InvalidSettings(
                "the clock drift factor must be at least 0 and below 1",
            ));
        }
        if self.node_timeout.is_zero() {
            return Err(RedlockError::InvalidSettings(
                "the node timeout must be above zero",
            ));
        }
        // A round may take the node timeout; the lease must outlast it and the drift.
        if self.lease <= self.node_timeout + self.drift() {
            return Err(RedlockError::InvalidSettings(
                "the lease must be longer than the node timeout plus the clock drift",
            ));
        }
        Ok(())
    }
}

impl Redlock {
    /// Connects to every node (`redis://host:port/` URLs, one per independent master) with
    /// default settings. Every node must be reachable now; see [`Redlock::new`] to bring
    /// your own clients.
    ///
    /// ```no_run
    /// # use lockwarden_core::Redlock;
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lockwarden_core::LockError> {
    /// let redlock = Redlock::connect(&["redis://10.0.0.1/", "redis://10.0.0.2/", "redis://10.0.0.3/"]).await?;
    /// assert_eq!(redlock.quorum(), 2);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`RedlockError::InvalidNodes`] for zero or an even number of URLs, or two that lead
    /// to the same server; [`LockError::Backend`] if a node cannot be reached.
    pub async fn connect<S: AsRef<str>>(urls: &[S]) -> Result<Self, LockError> {
        RedlockBuilder::default().connect(urls).await
    }

    /// A Redlock over clients you connected yourself, one per independent Redis master.
    /// Lock names are laid out with the first client's namespace and layout on every node.
    ///
    /// ```
    /// use lockwarden_core::{LockClient, LockError, Redlock, RedlockError};
    ///
    /// // In-process clients are refused: Redlock is about independent Redis servers.
    /// let refused = Redlock::new(vec![LockClient::in_memory()]);
    /// assert!(matches!(refused, Err(LockError::Redlock(RedlockError::InvalidNodes { .. }))));
    /// ```
    ///
    /// # Errors
    /// [`RedlockError::InvalidNodes`] for zero or an even number of clients, an in-process
    /// client, or the same client twice.
    pub fn new(nodes: Vec<LockClient>) -> Result<Self, LockError> {
        RedlockBuilder::default().build(nodes)
    }

    /// A builder for non-default settings.
    ///
    /// ```
    /// # use lockwarden_core::Redlock;
    /// # use std::time::Duration;
    /// let builder = Redlock::builder()
    ///     .lease(Duration::from_secs(5))
    ///     .node_timeout(Duration::from_millis(20))
    ///     .max_extensions(3);
    /// # let _ = builder;
    /// ```
    pub fn builder() -> RedlockBuilder {
        RedlockBuilder::default()
    }

    /// A handle on the lock named `name`. An invalid name is reported when it is acquired.
    pub fn lock(&self, name: impl AsRef<str>) -> RedlockLock {
        RedlockLock {
            redlock: self.clone(),
            key: self.make_key(name.as_ref()),
        }
    }

    /// Validates `name` and lays it out as every node stores it.
    ///
    /// # Errors
    /// [`LockError::InvalidKey`] if the name is rejected.
    pub fn key(&self, name: &str) -> Result<Key, LockError> {
        Ok(self.make_key(name)?)
    }

    fn make_key(&self, name: &str) -> Result<Key, KeyError> {
        let config = &self.shared.nodes[0].inner.config;
        Key::new(&config.namespace, config.max_key_len, config.layout, name)
    }

    /// The node clients, in the order given.
    pub fn nodes(&self) -> &[LockClient] {
        &self.shared.nodes
    }

    /// How many nodes must grant a lock: a strict majority.
    pub fn quorum(&self) -> usize {
        self.shared.nodes.len() / 2 + 1
    }

    /// The lease each node grants (and each extension renews).
    pub fn lease(&self) -> Duration {
        self.shared.config.lease
    }
}

impl fmt::Debug for Redlock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Redlock")
            .field("nodes", &self.shared.nodes)
            .field("config", &self.shared.config)
            .finish()
    }
}

/// Settings for a [`Redlock`]; finish with [`connect`](Self::connect) or
/// [`build`](Self::build).
#[derive(Debug, Clone, Default)]
#[must_use = "a builder does nothing until `connect()` or `build()`"]
pub struct RedlockBuilder {
    config: Config,
}

impl RedlockBuilder {
    /// The lease each node grants (default 30 s). The lock is valid for this long minus
    /// the round's duration and the clock drift.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.config.lease = lease;
        self
    }

    /// How fast clocks may drift apart, as a fraction of the lease (default 0.01); 2 ms are
    /// added for Redis' millisecond expiry.
    pub fn clock_drift_factor(mut self, factor: f64) -> Self {
        self.config.drift_factor = factor;
        self
    }

    /// How long one node may take to answer in a round before it counts as failed
    /// (default 100 ms). Keep it far below the lease: a stopped node costs every round
    /// this much validity.
    pub fn node_timeout(mut self, timeout: Duration) -> Self {
        self.config.node_timeout = timeout;
        self
    }

    /// Upper bound of the random pause after a split vote or with unreachable nodes
    /// (default 200 ms).
    pub fn retry_delay(mut self, delay: Duration) -> Self {
        self.config.retry_delay = delay;
        self
    }

    /// How many times one guard may be extended (default 10); the lock is then held for at
    /// most `lease * (max_extensions + 1)`.
    pub fn max_extensions(mut self, max: u32) -> Self {
        self.config.max_extensions = max;
        self
    }

    /// Key namespace of the node clients made by [`connect`](Self::connect) (default
    /// `lockwarden:`); [`build`](Self::build) uses the first client's.
    pub fn namespace(mut self, namespace: impl Into<String>) -> Self {
        self.config.namespace = Some(namespace.into());
        self
    }

    /// Connects one client per URL, in parallel.
    ///
    /// ```no_run
    /// # use lockwarden_core::Redlock;
    /// # use std::time::Duration;
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lockwarden_core::LockError> {
    /// let redlock = Redlock::builder()
    ///     .lease(Duration::from_secs(5))
    ///     .connect(&["redis://10.0.0.1/", "redis://10.0.0.2/", "redis://10.0.0.3/"])
    ///     .await?;
    /// # let _ = redlock; Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As [`Redlock::connect`], and [`RedlockError::InvalidSettings`].
    pub async fn connect<S: AsRef<str>>(self, urls: &[S]) -> Result<Redlock, LockError> {
        self.config.validate()?;
        check_count(urls.len())?;
        let mut seen = HashSet::new();
        if !urls.iter().all(|url| seen.insert(url.as_ref())) {
            return Err(RedlockError::InvalidNodes {
                nodes: urls.len(),
                reason: "a URL is repeated; every node must be a different server",
            }
            .into());
        }
        // Different URLs may still name one server (a hostname and its address): each
        // server's run id is unique, and one server counted twice would fake a majority.
        let run_ids = try_join_all(urls.iter().map(|url| run_id(url.as_ref()))).await?;
        let mut seen = HashSet::new();
        if !run_ids.iter().all(|id| seen.insert(id.as_str())) {
            return Err(RedlockError::InvalidNodes {
                nodes: urls.len(),
                reason: "two URLs lead to the same Redis server",
            }
            .into());
        }
        let nodes = try_join_all(urls.iter().map(|url| {
            let mut builder = LockClient::builder();
            if let Some(namespace) = &self.config.namespace {
                builder = builder.namespace(namespace.clone());
            }
            builder.connect(url.as_ref())
        }))
        .await?;
        self.build(nodes)
    }

    /// A Redlock over clients connected by the caller (see [`Redlock::new`]).
    ///
    /// # Errors
    /// As [`Redlock::new`], and [`RedlockError::InvalidSettings`].
    pub fn build(self, nodes: Vec<LockClient>) -> Result<Redlock, LockError> {
        self.config.validate()?;
        check_count(nodes.len())?;
        let invalid = |reason| RedlockError::InvalidNodes {
            nodes: nodes.len(),
            reason,
        };
        if !nodes
            .iter()
            .all(|n| matches!(n.inner.backend, Backend::Redis(_)))
        {
            return Err(invalid("in-process clients cannot be Redlock nodes").into());
        }
        let mut seen = HashSet::new();
        if !nodes.iter().all(|n| seen.insert(n.inner.id.as_str())) {
            return Err(invalid("the same client is given twice").into());
        }
        Ok(Redlock {
            shared: Arc::new(Shared {
                nodes,
                config: self.config,
            }),
        })
    }
}

/// The `run_id` a Redis server reports in `INFO server`: random per server start.
async fn run_id(url: &str) -> Result<String, BackendError> {
    const TIMEOUT: Duration = Duration::from_secs(2);
    let client = redis::Client::open(url)?;
    let mut conn =
        crate::redis::bounded(TIMEOUT, client.get_multiplexed_async_connection()).await?;
    let info: String = crate::redis::bounded(
        TIMEOUT,
        redis::cmd("INFO").arg("server").query_async(&mut conn),
    )
    .await?;
    info.lines()
        .find_map(|line| line.strip_prefix("run_id:"))
        .map(|id| id.trim().to_owned())
        .ok_or_else(|| BackendError::Protocol(format!("{url} reports no run_id")))
}

fn check_count(nodes: usize) -> Result<(), RedlockError> {
    let reason = match nodes {
        0 => "at least one node is needed",
        // An even count tolerates no more failures than one node less, and a tie has no
        // majority: almost always a mistake.
        n if n % 2 == 0 => "use an odd number of nodes (1 for development, 3 or 5)",
        _ => return Ok(()),
    };
    Err(RedlockError::InvalidNodes { nodes, reason })
}

/// One named Redlock, made by [`Redlock::lock`].
///
/// ```no_run
/// # use lockwarden_core::Redlock;
/// # use std::time::Duration;
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lockwarden_core::LockError> {
/// # let redlock = Redlock::connect(&["redis://10.0.0.1/", "redis://10.0.0.2/", "redis://10.0.0.3/"]).await?;
/// let lock = redlock.lock("invoice:17");
/// let guard = lock.try_acquire(Duration::from_millis(500)).await?;
/// # guard.release().await }
/// ```
#[derive(Debug, Clone)]
#[must_use = "a RedlockLock does nothing until it is acquired"]
pub struct RedlockLock {
    redlock: Redlock,
    key: Result<Key, KeyError>,
}

impl RedlockLock {
    /// The validated key.
    ///
    /// # Errors
    /// [`LockError::InvalidKey`] if the name was rejected.
    pub fn key(&self) -> Result<&Key, LockError> {
        self.key
            .as_ref()
            .map_err(|e| LockError::InvalidKey(e.clone()))
    }

    /// Acquires the lock on a majority of the nodes, waiting at most `wait` (zero: one
    /// round). Not re-entrant: a second acquisition waits like any other holder.
    ///
    /// Dropping the returned future at any point never leaves the lock held beyond the
    /// background release (or, for a node that answers too late, beyond its lease).
    ///
    /// # Errors
    /// [`LockError::Timeout`] if another holder kept it for the whole budget;
    /// [`RedlockError::NoQuorum`] if too few nodes answered; [`RedlockError::TooSlow`]
    /// if a majority answered too late for the lease; [`LockError::InvalidKey`].
    pub async fn try_acquire(&self, wait: Duration) -> Result<RedlockGuard, LockError> {
        let key = self.key()?.clone();
        let started = Instant::now();
        let deadline = started.checked_add(wait);
        let shared = &self.redlock.shared;
        let config = &shared.config;
        let mut waiting: Option<Vec<crate::waiters::Waiting>> = None;
        loop {
            // On a task of its own: if the caller goes away mid-round, the round still
            // finishes and a won lock is released when its `Held` is dropped.
            let round = tokio::spawn(round(self.redlock.shared.clone(), key.clone()));
            let round = round.await.map_err(|e| {
                BackendError::Protocol(format!("the Redlock acquire task failed: {e}"))
            })?;
            let failure = match round {
                Round::Won(held) => {
                    tracing::debug!(%key, waited_ms = started.elapsed().as_millis() as u64,
                        "redlock acquired");
                    return Ok(RedlockGuard::new(self.redlock.clone(), held));
                }
                Round::Lost(failure) => failure,
            };
            let now = Instant::now();
            if deadline.is_some_and(|d| now >= d) {
                tracing::debug!(%key, ?failure, "redlock acquire gave up");
                return Err(failure.into_error(&key, shared.nodes.len(), config));
            }
            let cap = |at: Instant| deadline.map_or(at, |d| at.min(d));
            // Nobody holds a majority (a split vote, or nodes down): retry after a random
            // pause, so contenders that failed together do not retry together.
            let Some(ttl) = failure
                .busy
                .filter(|_| failure.busy_nodes >= self.redlock.quorum())
            else {
                tokio::time::sleep_until(cap(now + jitter(config.retry_delay))).await;
                continue;
            };
            let wake_at = cap(now + ttl.min(config.retry_delay * RECHECK_DELAYS));
            match &waiting {
                // First wait: subscribe on every node, then retry at once, so a release
                // between the round and the subscriptions is not missed. A stopped node
                // delays this by the node timeout at most.
                None => {
                    let w: Vec<_> = shared
                        .nodes
                        .iter()
                        .map(|n| n.inner.waiters.register(key.channel()))
                        .collect();
                    let ready_by = wake_at.min(Instant::now() + config.node_timeout);
                    join_all(w.iter().map(|w| w.ready_by(ready_by))).await;
                    waiting = Some(w);
                }
                Some(w) => {
                    let notices = select_all(w.iter().map(|w| Box::pin(w.notified())));
                    tokio::select! {
                        _ = notices => {}
                        _ = tokio::time::sleep_until(wake_at) => {}
                    }
                }
            }
        }
    }
}

/// A lock won on a majority: until disarmed, dropping it releases every node in the
/// background (the caller went away, or the guard was dropped).
pub(crate) struct Held {
    shared: Arc<Shared>,
    key: Key,
    holder: Holder,
    token: u64,
    valid_until: Instant,
    armed: bool,
}

impl Drop for Held {
    fn drop(&mut self) {
        if self.armed {
            for node in &self.shared.nodes {
                node.release_dropped(Kind::Plain, self.key.clone(), self.holder.clone());
            }
        }
    }
}

enum Round {
    Won(Held),
    Lost(Failure),
}

/// Why a round did not win, for the next wait and the final error.
#[derive(Debug)]
struct Failure {
    granted: usize,
    /// Nodes that have another holder.
    busy_nodes: usize,
    /// Nodes that failed or did not answer in time.
    failed_nodes: usize,
    /// Some node has another holder: the shortest lease it reported.
    busy: Option<Duration>,
    /// A majority granted, but after the validity had run out.
    too_slow: Option<Duration>,
}

impl Failure {
    fn into_error(self, key: &Key, nodes: usize, config: &Config) -> LockError {
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
    Granted(u64),
    Busy(Option<Duration>),
    Failed(BackendError),
}

async fn round(shared: Arc<Shared>, key: Key) -> Round {
    let config = &shared.config;
    // A fresh holder per round: a release of an earlier round that arrives late cannot
    // free this one's hold.
    let holder = shared.nodes[0].holder();
    let started = Instant::now();
    let answers = join_all(shared.nodes.iter().map(|node| {
        let attempt = node
            .inner
            .backend
            .attempt(&key, &holder, config.lease, false);
        async move {
            // Dropping a timed-out attempt leaves it to finish in the background and undo
            // itself if it took the lock (see `redis::Unclaimed`).
            match tokio::time::timeout(config.node_timeout, attempt).await {
                Ok(Ok(Attempt::Taken { token } | Attempt::Reentered { token })) => {
                    Answer::Granted(token)
                }
                Ok(Ok(Attempt::Busy { ttl })) => Answer::Busy(ttl),
                Ok(Ok(Attempt::Completed { .. })) => Answer::Failed(BackendError::Protocol(
                    "a node answered a Redlock acquire with a stored outcome".to_owned(),
                )),
                Ok(Err(error)) => Answer::Failed(error),
                Err(_) => Answer::Failed(BackendError::TimedOut(config.node_timeout)),
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
    let quorum = shared.nodes.len() / 2 + 1;
    if granted >= quorum && Instant::now() < valid_until {
        // The largest token of the majority: see `RedlockGuard::fencing_token`.
        let token = answers
            .iter()
            .filter_map(|a| match a {
                Answer::Granted(token) => Some(*token),
                _ => None,
            })
            .max()
            .unwrap_or(0);
        return Round::Won(Held {
            shared: shared.clone(),
            key,
            holder,
            token,
            valid_until,
            armed: true,
        });
    }

    for (i, answer) in answers.iter().enumerate() {
        if let Answer::Failed(error) = answer {
            tracing::debug!(%key, node = i, %error, "redlock node failed in a round");
        }
    }
    // Undo the round everywhere it may have taken effect: granted nodes, and failed ones
    // whose script may have run after all. Busy nodes are someone else's.
    let undo = shared
        .nodes
        .iter()
        .zip(&answers)
        .filter(|(_, a)| !matches!(a, Answer::Busy(_)))
        .map(|(node, _)| node.clone());
    release_on(undo, &key, &holder, config.node_timeout).await;
    let busy = answers
        .iter()
        .filter_map(|a| match a {
            Answer::Busy(ttl) => Some(ttl.unwrap_or(NO_TTL_RECHECK)),
            _ => None,
        })
        .min();
    Round::Lost(Failure {
        granted,
        busy_nodes: answers
            .iter()
            .filter(|a| matches!(a, Answer::Busy(_)))
            .count(),
        failed_nodes: answers
            .iter()
            .filter(|a| matches!(a, Answer::Failed(_)))
            .count(),
        busy,
        too_slow: (granted >= quorum).then_some(elapsed),
    })
}

/// Releases `holder`'s hold on each node, every release on a task of its own (so it is
/// sent even if this wait is abandoned), waiting for each at most `timeout`. Returns each
/// node's answer, `None` for a failure or no answer in time.
async fn release_on(
    nodes: impl Iterator<Item = LockClient>,
    key: &Key,
    holder: &Holder,
    timeout: Duration,
) -> Vec<Option<Released>> {
    let releases = nodes.map(|node| {
        let (key, holder) = (key.clone(), holder.clone());
        let task = tokio::spawn(async move {
            node.inner
                .backend
                .release(Kind::Plain, &key, &holder, None)
                .await
        });
        async move {
            match tokio::time::timeout(timeout, task).await {
                Ok(Ok(Ok(released))) => Some(released),
                _ => None,
            }
        }
    });
    join_all(releases).await
}

/// Renews `holder`'s hold on every node; each answer `true` if that node still held it.
async fn renew_on(shared: &Shared, key: &Key, holder: &Holder) -> Vec<bool> {
    let config = &shared.config;
    let renewal = [Renewal {
        kind: Kind::Plain,
        key: key.clone(),
        holder: holder.clone(),
        lease: config.lease,
    }];
    let renewals = shared.nodes.iter().map(|node| {
        let renew = node.inner.backend.renew_many(&renewal);
        async move {
            matches!(
                tokio::time::timeout(config.node_timeout, renew).await,
                Ok(Ok(renewed)) if renewed.first() == Some(&true)
            )
        }
    });
    join_all(renewals).await
}

/// A random duration in `[0, max]`, from the standard library's randomly keyed hasher.
fn jitter(max: Duration) -> Duration {
    let random = std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish();
    max.mul_f64(random as f64 / u64::MAX as f64)
}
