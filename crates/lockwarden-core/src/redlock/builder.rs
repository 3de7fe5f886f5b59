//! How a [`Redlock`] is made: [`RedlockBuilder`], and the shorthands on [`Redlock`].

use std::collections::HashSet;
use std::time::Duration;

use futures_util::future::try_join_all;

use super::client::Redlock;
use super::nodes::{Config, Nodes};
use crate::client::LockClient;
use crate::error::{BackendError, LockError, RedlockError};

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
    ///
    /// ```
    /// # use lockwarden_core::{LockClient, LockError, Redlock, RedlockError};
    /// # use std::time::Duration;
    /// // Settings are checked before the nodes: a lease shorter than a round is refused.
    /// let refused = Redlock::builder()
    ///     .lease(Duration::from_millis(50))
    ///     .build(vec![LockClient::in_memory()]);
    /// assert!(matches!(refused, Err(LockError::Redlock(RedlockError::InvalidSettings(_)))));
    /// ```
    pub fn lease(mut self, lease: Duration) -> Self {
        self.config.lease = lease;
        self
    }

    /// How fast clocks may drift apart, as a fraction of the lease (default 0.01); 2 ms are
    /// added for Redis' millisecond expiry.
    ///
    /// ```
    /// # use lockwarden_core::{LockClient, LockError, Redlock, RedlockError};
    /// let refused = Redlock::builder().clock_drift_factor(1.5).build(vec![LockClient::in_memory()]);
    /// assert!(matches!(refused, Err(LockError::Redlock(RedlockError::InvalidSettings(_)))));
    /// ```
    pub fn clock_drift_factor(mut self, factor: f64) -> Self {
        self.config.drift_factor = factor;
        self
    }

    /// How long one node may take to answer in a round before it counts as failed
    /// (default 100 ms). Keep it far below the lease: a stopped node costs every round
    /// this much validity.
    ///
    /// ```
    /// # use lockwarden_core::{LockClient, LockError, Redlock, RedlockError};
    /// # use std::time::Duration;
    /// let refused = Redlock::builder()
    ///     .lease(Duration::from_secs(1))
    ///     .node_timeout(Duration::from_secs(1)) // as long as the lease: no validity left
    ///     .build(vec![LockClient::in_memory()]);
    /// assert!(matches!(refused, Err(LockError::Redlock(RedlockError::InvalidSettings(_)))));
    /// ```
    pub fn node_timeout(mut self, timeout: Duration) -> Self {
        self.config.node_timeout = timeout;
        self
    }

    /// Upper bound of the random pause after a split vote or with unreachable nodes
    /// (default 200 ms).
    ///
    /// ```
    /// # use lockwarden_core::Redlock;
    /// # use std::time::Duration;
    /// let contenders_spread = Redlock::builder().retry_delay(Duration::from_millis(50));
    /// # let _ = contenders_spread;
    /// ```
    pub fn retry_delay(mut self, delay: Duration) -> Self {
        self.config.retry_delay = delay;
        self
    }

    /// How many times one guard may be extended (default 10); the lock is then held for at
    /// most `lease * (max_extensions + 1)`.
    ///
    /// ```
    /// # use lockwarden_core::Redlock;
    /// # use std::time::Duration;
    /// // Held for 4 minutes at most: the lease and three extensions.
    /// let capped = Redlock::builder().lease(Duration::from_secs(60)).max_extensions(3);
    /// # let _ = capped;
    /// ```
    pub fn max_extensions(mut self, max: u32) -> Self {
        self.config.max_extensions = max;
        self
    }

    /// Key namespace of the node clients made by [`connect`](Self::connect) (default
    /// `lockwarden:`); [`build`](Self::build) uses the first client's.
    ///
    /// ```
    /// # use lockwarden_core::Redlock;
    /// let billing = Redlock::builder().namespace("billing:locks:");
    /// # let _ = billing;
    /// ```
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
        if nodes.iter().any(|n| n.backend_name() == "in-memory") {
            return Err(invalid("in-process clients cannot be Redlock nodes").into());
        }
        let twice = nodes
            .iter()
            .enumerate()
            .any(|(i, a)| nodes[..i].iter().any(|b| a.same_as(b)));
        if twice {
            return Err(invalid("the same client is given twice").into());
        }
        Ok(Redlock::from_nodes(Nodes {
            clients: nodes,
            config: self.config,
        }))
    }
}

/// The `run_id` a Redis server reports in `INFO server`: random per server start.
async fn run_id(url: &str) -> Result<String, BackendError> {
    const TIMEOUT: Duration = Duration::from_secs(2);
    let ask = async {
        let client = redis::Client::open(url)?;
        let mut conn = client.get_multiplexed_async_connection().await?;
        redis::cmd("INFO")
            .arg("server")
            .query_async::<String>(&mut conn)
            .await
    };
    let info = tokio::time::timeout(TIMEOUT, ask)
        .await
        .map_err(|_| BackendError::TimedOut(TIMEOUT))??;
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
