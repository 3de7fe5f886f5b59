//! Where a client's commands go: one server, a Redis Cluster, or the primary Sentinel
//! names. [`Deployment`] says which and connects; [`Conn`] is the connection every
//! script and pipeline of the backend is sent over, whatever the deployment.

use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster::{ClusterClient, ClusterClientBuilder};
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{
    MultipleNodeRoutingInfo, Route, RoutingInfo, SingleNodeRoutingInfo, Slot, SlotAddr,
};
use redis::sentinel::SentinelNodeConnectionInfo;
use redis::{Cmd, FromRedisValue, Pipeline, RedisConnectionInfo, RedisFuture, RedisResult, Value};

use std::sync::Arc;

use super::credentials::Credentials;
use super::pubsub::Source;
use super::sentinel::Followed;
use super::timeout::bounded;
use super::tls::Tls;
use crate::error::BackendError;

/// How to reach Redis, as given to the client builder.
#[derive(Clone)]
pub(crate) enum Deployment {
    /// One server.
    Server(redis::Client),
    /// A Redis Cluster, found through any of these nodes.
    Cluster(Vec<String>),
    /// The primary the sentinels name for `service`, followed across failovers, logged in
    /// to as `primary` (else as the default user).
    Sentinel {
        sentinels: Vec<String>,
        service: String,
        primary: Option<Credentials>,
    },
    /// One server through an application's deadpool-redis pool; the pub/sub connection
    /// comes from `notices` (a pooled connection cannot subscribe).
    #[cfg(feature = "deadpool")]
    Pool {
        pool: deadpool_redis::Pool,
        notices: redis::Client,
    },
}

impl Deployment {
    /// Where it connects, for an error that says it could not: `host:port` (a cluster's
    /// nodes, a sentinel service's sentinels), never a password.
    pub(crate) fn address(&self) -> String {
        use redis::IntoConnectionInfo;
        let of_urls = |urls: &[String]| {
            let addresses: Vec<String> = urls
                .iter()
                .filter_map(|url| url.as_str().into_connection_info().ok())
                .map(|info| info.addr().to_string())
                .collect();
            addresses.join(", ")
        };
        match self {
            Deployment::Server(client) => client.get_connection_info().addr().to_string(),
            Deployment::Cluster(nodes) => format!("the cluster nodes {}", of_urls(nodes)),
            Deployment::Sentinel {
                sentinels, service, ..
            } => format!(
                "the primary of `{service}` (sentinels {})",
                of_urls(sentinels)
            ),
            #[cfg(feature = "deadpool")]
            Deployment::Pool { notices, .. } => notices.get_connection_info().addr().to_string(),
        }
    }

    /// Checks the addresses without connecting.
    pub(crate) fn check(&self) -> Result<(), BackendError> {
        if let Deployment::Cluster(urls)
        | Deployment::Sentinel {
            sentinels: urls, ..
        } = self
        {
            Tls::supported(urls.iter().map(String::as_str))?;
        }
        match self {
            Deployment::Server(_) => Ok(()),
            Deployment::Cluster(nodes) => {
                ClusterClient::new(nodes.iter().map(String::as_str))?;
                Ok(())
            }
            Deployment::Sentinel {
                sentinels,
                service,
                primary,
            } => {
                sentinel_client(sentinels, service.clone(), primary.as_ref())?;
                Ok(())
            }
            #[cfg(feature = "deadpool")]
            Deployment::Pool { .. } => Ok(()),
        }
    }

    /// A new command connection, and where its client's pub/sub connection goes; fails
    /// if Redis cannot be reached within `timeout`. `response` bounds each reply (longer
    /// than `timeout` for a connection that `WAIT`s); `None` where the caller bounds every
    /// call itself ([`Commands`](super::commands::Commands) does): a second timer per
    /// command in redis-rs only costs (about 1,500 instructions a call, callgrind). A
    /// cluster keeps `timeout` for its own redirects and retries. `tls` secures `rediss://`
    /// addresses (a server's client carries it already).
    pub(super) async fn connect(
        &self,
        timeout: Duration,
        response: Option<Duration>,
        tls: &Tls,
    ) -> Result<(Conn, Source), BackendError> {
        match self {
            Deployment::Server(client) => {
                let conn =
                    client.get_connection_manager_with_config(manager_config(timeout, response));
                let conn = Conn::Server(bounded(timeout, conn).await?);
                Ok((conn, Source::Server(Box::new(client.clone()))))
            }
            Deployment::Cluster(nodes) => {
                tls.check(nodes.iter().map(String::as_str))?;
                // redis-rs bounds each whole call, redirects and retries included: without
                // that bound it may send a call again after the caller gave up on it, and
                // an acquire that lands after its give-back takes the lock again
                // (`fault_cluster.rs` fails so). `Commands::within` relies on it
                // (`bounds_calls`) rather than set a second timer, and no node's reply gets
                // a timer of its own: the whole call's bound covers it. The timers cost a
                // cluster cycle ~3,700 instructions, ~2.5 µs on two cores.
                let client = cluster_builder(nodes, timeout, tls)
                    .overall_response_timeout(Some(response.unwrap_or(timeout)))
                    .build()?;
                let conn = Conn::Cluster(bounded(timeout, client.get_async_connection()).await?);
                let (nodes, tls) = (nodes.clone(), tls.clone());
                let builder = Arc::new(move || cluster_builder(&nodes, timeout, &tls));
                Ok((conn, Source::Cluster(builder)))
            }
            Deployment::Sentinel {
                sentinels,
                service,
                primary,
            } => {
                let primary = primary.as_ref();
                let sentinel = match tls.sentinel_client(sentinels, service, primary)? {
                    Some(over_tls) => over_tls,
                    None => sentinel_client(sentinels, service.clone(), primary)?,
                };
                let config = manager_config(timeout, response);
                let followed = Followed::connect(sentinel, config, timeout).await?;
                Ok((Conn::Sentinel(followed.clone()), Source::Sentinel(followed)))
            }
            #[cfg(feature = "deadpool")]
            Deployment::Pool { pool, notices } => {
                // Check out (and give back) one connection: an unreachable server fails here.
                bounded(timeout, async {
                    pool.get().await.map(drop).map_err(pool_error)
                })
                .await?;
                let source = Source::Server(Box::new(notices.clone()));
                Ok((Conn::Pool(pool.clone()), source))
            }
        }
    }
}

fn manager_config(timeout: Duration, response: Option<Duration>) -> ConnectionManagerConfig {
    ConnectionManagerConfig::new()
        .set_response_timeout(response)
        .set_connection_timeout(Some(timeout))
        .set_number_of_retries(2)
        .set_max_delay(Duration::from_millis(500))
}

/// How often redis-rs retries a cluster call that did not run (the node refused it,
/// could not be reached, or redirected it): as often as fits in the call's bound, which
/// ends them all. A restarted master refuses writes with CLUSTERDOWN for its first 2 s
/// (Redis's `CLUSTER_WRITABLE_DELAY`), which three retries did not outlast.
const CLUSTER_RETRIES: u32 = 64;

fn cluster_builder(nodes: &[String], timeout: Duration, tls: &Tls) -> ClusterClientBuilder {
    // Waits of 10 ms to 200 ms between retries; without `min_retry_wait` redis-rs's
    // default minimum (1,280 ms) would win over the maximum.
    let builder = ClusterClientBuilder::new(nodes.iter().map(String::as_str))
        .connection_timeout(timeout)
        .retries(CLUSTER_RETRIES)
        .min_retry_wait(10)
        .max_retry_wait(200);
    tls.cluster(builder)
}

// `service` by value: `build` takes a `String`, or `impl AsRef<str>` with TLS enabled.
// Credentials in the sentinel URLs are each sentinel's own; `primary` are the data
// servers'.
fn sentinel_client(
    sentinels: &[String],
    service: String,
    primary: Option<&Credentials>,
) -> Result<redis::sentinel::SentinelClient, BackendError> {
    let servers = primary.map(|login| {
        SentinelNodeConnectionInfo::default().set_redis_connection_info(
            RedisConnectionInfo::default()
                .set_username(&login.username)
                .set_password(&login.password),
        )
    });
    Ok(redis::sentinel::SentinelClient::build(
        sentinels.iter().map(String::as_str).collect(),
        service,
        servers,
        redis::sentinel::SentinelServerType::Master,
    )?)
}

/// The connection a backend sends its commands on; cheap to clone (all clones share the
/// underlying connections).
#[derive(Clone)]
pub(super) enum Conn {
    /// One auto-reconnecting multiplexed connection.
    Server(ConnectionManager),
    /// A multiplexed connection per node: a command goes to the owner of its first key's
    /// slot and follows `MOVED`/`ASK` when slots move.
    Cluster(ClusterConnection),
    /// A connection to the current primary, replaced when Sentinel names another.
    Sentinel(Followed),
    /// A connection checked out of an application's pool for each command.
    #[cfg(feature = "deadpool")]
    Pool(deadpool_redis::Pool),
}

impl Conn {
    /// Whether one pipeline or script may only touch keys of one slot.
    pub(super) fn is_cluster(&self) -> bool {
        matches!(self, Conn::Cluster(_))
    }

    /// Whether redis-rs bounds each call itself, by the timeout given to
    /// [`Deployment::connect`] (a cluster's, see there); it fails the call with an I/O
    /// error of kind `TimedOut` then.
    pub(super) fn bounds_calls(&self) -> bool {
        self.is_cluster()
    }

    /// Loads a script on every node of a cluster the client knows, replicas included
    /// (elsewhere on the one server): for a call that met `NOSCRIPT` again after loading
    /// its script on its slot's master, which a failover had just made a replica (the
    /// client's slot map still named it; the call was redirected to the new master).
    /// A function's library goes to every master only: replicas refuse `FUNCTION LOAD`
    /// and get it from their master.
    pub(super) async fn load_everywhere(&self, load: Cmd) -> RedisResult<()> {
        let nodes = match is_function_load(&load) {
            true => MultipleNodeRoutingInfo::AllMasters,
            false => MultipleNodeRoutingInfo::AllNodes,
        };
        let loaded = match self {
            Conn::Cluster(cluster) => {
                let every = RoutingInfo::MultiNode((nodes, None));
                cluster.clone().route_command(load, every).await.map(drop)
            }
            conn => load.query_async::<Value>(&mut conn.clone()).await.map(drop),
        };
        loaded_already(loaded)
    }

    /// Loads scripts (`SCRIPT LOAD` commands) where a call on `slot` runs: on a cluster,
    /// on the master that owns it only. redis-rs sends `SCRIPT LOAD` to every master and
    /// waits for all of them, so a master that does not answer would hold back (and fail)
    /// the calls of every other master that lost its scripts: a watchdog would lose their
    /// locks with it. Elsewhere, `slot` is `None` and the one server gets them.
    pub(super) async fn load_scripts(
        &self,
        loads: impl IntoIterator<Item = Cmd>,
        slot: Option<Slot>,
    ) -> RedisResult<()> {
        let loads = loads.into_iter().map(|load| {
            let mut conn = self.clone();
            async move {
                match (&mut conn, slot) {
                    (Conn::Cluster(cluster), Some(slot)) => {
                        let owner = Route::with_slot(slot, SlotAddr::Master);
                        let to =
                            RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(owner));
                        cluster.route_command(load, to).await.map(drop)
                    }
                    (conn, _) => load.query_async::<Value>(conn).await.map(drop),
                }
                .or_else(|error| loaded_already(Err(error)))
            }
        });
        // All at once: one after the other they cost a round trip each, which on a slow
        // link outlasted a watchdog lease (tests/fault_network.rs).
        futures_util::future::try_join_all(loads).await.map(drop)
    }

    /// Each master's address and its reply to `cmd` (a server's error as a
    /// [`Value::ServerError`]); empty for anything but a cluster. Fails unless every
    /// master of the slot map answered: redis-rs sends to the masters it holds a
    /// connection to, and leaves out one it cannot reach.
    pub(super) async fn on_every_master(&self, cmd: Cmd) -> RedisResult<Vec<(String, Value)>> {
        let Conn::Cluster(conn) = self else {
            return Ok(Vec::new());
        };
        let mut conn = conn.clone();
        let mut slots = redis::cmd("CLUSTER");
        slots.arg("SLOTS");
        let masters = masters_in(&conn.req_packed_command(&slots).await?);
        let every = RoutingInfo::MultiNode((MultipleNodeRoutingInfo::AllMasters, None));
        // With no response policy the cluster client answers a map of node to reply.
        let replies: Vec<(String, Value)> = match conn.route_command(cmd, every).await? {
            Value::Map(replies) => replies
                .into_iter()
                .map(|(node, reply)| (String::from_redis_value(node).unwrap_or_default(), reply))
                .collect(),
            other => {
                return Err(redis::RedisError::from((
                    redis::ErrorKind::Parse,
                    "a command sent to every master answered no map",
                    format!("{other:?}"),
                )))
            }
        };
        if masters == 0 || replies.len() < masters {
            return Err(redis::RedisError::from((
                redis::ErrorKind::Io,
                "not every master of the cluster could be asked",
                format!("{} of {masters} answered", replies.len()),
            )));
        }
        Ok(replies)
    }
}

/// Whether `load` loads a function's library (not a script).
fn is_function_load(load: &Cmd) -> bool {
    matches!(
        load.args_iter().next(),
        Some(redis::Arg::Simple(b"FUNCTION"))
    )
}

/// A load that found its function's library there already did what was asked (ours are
/// named by their text, see `scripts.rs`).
fn loaded_already(loaded: RedisResult<()>) -> RedisResult<()> {
    match loaded {
        Err(error) if super::scripts::is_loaded_already(&error) => Ok(()),
        other => other,
    }
}

/// How many masters own slots in a `CLUSTER SLOTS` reply: each range names its master
/// (address, port, ...) after its first and last slot.
fn masters_in(slots: &Value) -> usize {
    let Value::Array(ranges) = slots else {
        return 0;
    };
    let mut masters: Vec<(&Value, &Value)> = Vec::new();
    for range in ranges {
        let Value::Array(parts) = range else { continue };
        let Some(Value::Array(node)) = parts.get(2) else {
            continue;
        };
        if let (Some(address), Some(port)) = (node.first(), node.get(1)) {
            if !masters.contains(&(address, port)) {
                masters.push((address, port));
            }
        }
    }
    masters.len()
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Conn::Server(conn) => conn.req_packed_command(cmd),
            Conn::Cluster(conn) => conn.req_packed_command(cmd),
            Conn::Sentinel(followed) => followed.req_packed_command(cmd),
            #[cfg(feature = "deadpool")]
            Conn::Pool(pool) => Box::pin(async move {
                let mut conn = pool.get().await.map_err(pool_error)?;
                conn.req_packed_command(cmd).await
            }),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Conn::Server(conn) => conn.req_packed_commands(pipeline, offset, count),
            Conn::Cluster(conn) => conn.req_packed_commands(pipeline, offset, count),
            Conn::Sentinel(followed) => followed.req_packed_commands(pipeline, offset, count),
            #[cfg(feature = "deadpool")]
            Conn::Pool(pool) => Box::pin(async move {
                let mut conn = pool.get().await.map_err(pool_error)?;
                conn.req_packed_commands(pipeline, offset, count).await
            }),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Server(conn) => conn.get_db(),
            Conn::Cluster(conn) => conn.get_db(),
            Conn::Sentinel(_) => 0,
            #[cfg(feature = "deadpool")]
            Conn::Pool(_) => 0,
        }
    }
}

/// A pool that could not hand out a connection, as the connection error it stands for
/// (so an acquire rides it out within its budget, as it would a reconnect).
#[cfg(feature = "deadpool")]
fn pool_error(error: deadpool_redis::PoolError) -> redis::RedisError {
    match error {
        deadpool_redis::PoolError::Backend(error) => error,
        other => redis::RedisError::from((
            redis::ErrorKind::Io,
            "the connection pool gave no connection",
            other.to_string(),
        )),
    }
}
