//! The Redis the inspector reads: one server, or a Redis Cluster. Two kinds of
//! connection: per node (to `SCAN`, `PUBSUB NUMSUB`, `CONFIG GET` and subscribe to
//! keyspace events on every master) and routed by key (one lock's keys, all in one slot).

use std::time::Duration;

use lockwarden_core::redis::{
    self, aio::ConnectionLike, aio::MultiplexedConnection, cluster::ClusterClientBuilder,
    cluster_async::ClusterConnection, AsyncConnectionConfig, Client, ConnectionAddr,
    IntoConnectionInfo, Pipeline, Value,
};

use crate::error::CliError;

/// Where to connect and how patiently.
#[derive(Debug, Clone)]
pub struct Endpoint {
    /// One URL, or a cluster's seed nodes.
    pub urls: Vec<String>,
    /// The URLs are a Redis Cluster's nodes.
    pub cluster: bool,
    /// Bounds connecting and every reply.
    pub timeout: Duration,
}

impl Endpoint {
    /// The URLs with passwords hidden, for messages.
    pub fn display(&self) -> String {
        self.urls
            .iter()
            .map(|u| redact(u))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Checks the URLs before anything connects.
    ///
    /// # Errors
    /// [`CliError::Usage`] for an unparsable URL, or several without `--cluster`.
    pub fn check(&self) -> Result<(), CliError> {
        if self.urls.is_empty() {
            return Err(CliError::Usage(
                "no Redis URL given (--url or REDIS_URL)".into(),
            ));
        }
        if self.urls.len() > 1 && !self.cluster {
            return Err(CliError::Usage(format!(
                "{} URLs given ({}): several URLs are a cluster's seed nodes; add --cluster",
                self.urls.len(),
                self.display()
            )));
        }
        for url in &self.urls {
            url.as_str()
                .into_connection_info()
                .map_err(|e| invalid_url(url, &e))?;
        }
        Ok(())
    }
}

/// The usage error for a URL that does not parse, or that needs what this build lacks.
fn invalid_url(url: &str, e: &redis::RedisError) -> CliError {
    if url.starts_with("rediss:") && e.to_string().contains("TLS") {
        return CliError::Usage(format!(
            "{:?}: this build of lockwarden has no TLS support (it connects as \
             lockwarden-core does, and that was built without TLS)",
            redact(url)
        ));
    }
    CliError::Usage(format!("invalid Redis URL {:?}: {e}", redact(url)))
}

/// Hides the password of a `redis://user:password@host/` URL.
pub fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    match authority.rsplit_once('@') {
        Some((userinfo, host)) => {
            let user = userinfo.split_once(':').map_or(userinfo, |(u, _)| u);
            let hidden = if userinfo.contains(':') || user.is_empty() {
                format!("{user}:***")
            } else {
                "***".to_owned()
            };
            format!("{scheme}://{hidden}@{host}{path}")
        }
        None => url.to_owned(),
    }
}

/// One server of the deployment, connected directly.
#[derive(Clone)]
pub struct Node {
    /// `host:port`, for messages.
    pub addr: String,
    /// For more connections to it (pub/sub).
    pub client: Client,
    /// Its multiplexed connection.
    pub conn: MultiplexedConnection,
}

#[derive(Clone)]
enum Routed {
    Server(MultiplexedConnection),
    Cluster(ClusterConnection),
}

/// A connected deployment.
#[derive(Clone)]
pub struct Target {
    nodes: Vec<Node>,
    routed: Routed,
    db: i64,
    timeout: Duration,
}

impl Target {
    /// Connects to the server, or to the cluster and each of its masters.
    ///
    /// # Errors
    /// [`CliError::Usage`] for a bad URL, [`CliError::Redis`] if a server cannot be
    /// reached (or refuses us) within the timeout.
    pub async fn connect(endpoint: &Endpoint) -> Result<Target, CliError> {
        endpoint.check()?;
        let timeout = endpoint.timeout;
        let seed = endpoint.urls[0]
            .as_str()
            .into_connection_info()
            .map_err(|e| invalid_url(&endpoint.urls[0], &e))?;
        let db = seed.redis_settings().db();
        if !endpoint.cluster {
            let node = connect_node(seed, timeout)
                .await
                .map_err(|e| unreachable(&endpoint.display(), &e))?;
            let routed = Routed::Server(node.conn.clone());
            return Ok(Target {
                nodes: vec![node],
                routed,
                db,
                timeout,
            });
        }
        let client = ClusterClientBuilder::new(endpoint.urls.iter().map(String::as_str))
            .connection_timeout(timeout)
            .response_timeout(timeout)
            .build()
            .map_err(|e| CliError::Usage(format!("invalid cluster URLs: {e}")))?;
        let cluster = bounded(timeout, client.get_async_connection())
            .await
            .map_err(|e| unreachable(&endpoint.display(), &e))?;
        // The masters, from any seed that answers CLUSTER NODES.
        let mut nodes = Vec::new();
        let mut last_err = None;
        for url in &endpoint.urls {
            let info = url
                .as_str()
                .into_connection_info()
                .map_err(|e| invalid_url(url, &e))?;
            let seed_node = match connect_node(info.clone(), timeout).await {
                Ok(n) => n,
                Err(e) => {
                    last_err = Some(e);
                    continue;
                }
            };
            let mut conn = seed_node.conn.clone();
            let listing: String = match redis::cmd("CLUSTER")
                .arg("NODES")
                .query_async(&mut conn)
                .await
            {
                Ok(l) => l,
                Err(e) => {
                    last_err = Some(e);
                    continue;
                }
            };
            for (host, port) in masters(&listing, &seed_node.addr) {
                let addr = match info.addr() {
                    ConnectionAddr::TcpTls {
                        insecure,
                        tls_params,
                        ..
                    } => ConnectionAddr::TcpTls {
                        host: host.clone(),
                        port,
                        insecure: *insecure,
                        tls_params: tls_params.clone(),
                    },
                    _ => ConnectionAddr::Tcp(host.clone(), port),
                };
                let node = connect_node(info.clone().set_addr(addr), timeout)
                    .await
                    .map_err(|e| unreachable(&format!("cluster node {host}:{port}"), &e))?;
                nodes.push(node);
            }
            break;
        }
        if nodes.is_empty() {
            let why = last_err.map_or_else(|| "no master listed".to_owned(), |e| e.to_string());
            return Err(CliError::Redis(format!(
                "cannot list the masters of the cluster at {}: {why}",
                endpoint.display()
            )));
        }
        Ok(Target {
            nodes,
            routed: Routed::Cluster(cluster),
            db: 0,
            timeout,
        })
    }

    /// Every server to scan: the one server, or each master of the cluster.
    pub fn nodes(&self) -> &[Node] {
        &self.nodes
    }

    /// Whether this is a Redis Cluster (whose clients may listen with `SSUBSCRIBE`).
    pub fn is_cluster(&self) -> bool {
        matches!(self.routed, Routed::Cluster(_))
    }

    /// The database number (0 on a cluster).
    pub fn db(&self) -> i64 {
        self.db
    }

    /// The timeout of every reply.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Runs a pipeline whose keys share one slot, on the server that owns it; errors of
    /// single commands come back as [`Value::ServerError`].
    ///
    /// # Errors
    /// [`CliError::Redis`] when the pipeline as a whole fails.
    pub async fn keyed(&self, pipe: &mut Pipeline) -> Result<Vec<Value>, CliError> {
        pipe.ignore_errors();
        let result = match &self.routed {
            Routed::Server(conn) => run(conn.clone(), pipe, self.timeout).await,
            Routed::Cluster(conn) => run(conn.clone(), pipe, self.timeout).await,
        };
        result.map_err(|e| CliError::Redis(format!("reading a lock: {e}")))
    }
}

async fn run<C: ConnectionLike>(
    mut conn: C,
    pipe: &Pipeline,
    timeout: Duration,
) -> redis::RedisResult<Vec<Value>> {
    bounded(timeout, pipe.query_async(&mut conn)).await
}

/// The masters in a `CLUSTER NODES` listing (`host`, `port`); a master listed without an
/// address (`:0`, the node answering) is the seed at `seed_addr`.
fn masters(listing: &str, seed_addr: &str) -> Vec<(String, u16)> {
    let mut out = Vec::new();
    for line in listing.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let (Some(addr), Some(flags)) = (fields.get(1), fields.get(2)) else {
            continue;
        };
        let flags: Vec<&str> = flags.split(',').collect();
        if !flags.contains(&"master") || flags.iter().any(|f| *f == "fail" || *f == "noaddr") {
            continue;
        }
        let addr = addr.split(['@', ',']).next().unwrap_or_default();
        let addr = match addr.rsplit_once(':') {
            Some(("", _)) | None => seed_addr,
            Some(_) => addr,
        };
        if let Some((host, port)) = addr.rsplit_once(':') {
            if let Ok(port) = port.parse() {
                out.push((host.trim_matches(['[', ']']).to_owned(), port));
            }
        }
    }
    out.sort();
    out.dedup();
    out
}

async fn connect_node(info: redis::ConnectionInfo, timeout: Duration) -> redis::RedisResult<Node> {
    let addr = match info.addr() {
        ConnectionAddr::Tcp(host, port) | ConnectionAddr::TcpTls { host, port, .. } => {
            format!("{host}:{port}")
        }
        other => other.to_string(),
    };
    let client = Client::open(info)?;
    let config = AsyncConnectionConfig::new()
        .set_connection_timeout(Some(timeout))
        .set_response_timeout(Some(timeout));
    let mut conn = bounded(
        timeout,
        client.get_multiplexed_async_connection_with_config(&config),
    )
    .await?;
    // Connecting may succeed without a round trip; make sure the server answers (and
    // that we are allowed in).
    let _: String = bounded(timeout, redis::cmd("PING").query_async(&mut conn)).await?;
    Ok(Node { addr, client, conn })
}

/// Runs `fut` within `timeout` (plus a little: the connection's own timeouts speak first).
pub async fn bounded<T>(
    timeout: Duration,
    fut: impl std::future::Future<Output = redis::RedisResult<T>>,
) -> redis::RedisResult<T> {
    match tokio::time::timeout(timeout + Duration::from_millis(250), fut).await {
        Ok(result) => result,
        Err(_) => Err(redis::RedisError::from(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!("no answer within {timeout:?}"),
        ))),
    }
}

fn unreachable(what: &str, e: &redis::RedisError) -> CliError {
    CliError::Redis(format!("cannot reach Redis at {what}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_are_hidden() {
        assert_eq!(redact("redis://127.0.0.1:6379/"), "redis://127.0.0.1:6379/");
        assert_eq!(
            redact("redis://user:secret@host:6379/0"),
            "redis://user:***@host:6379/0"
        );
        assert_eq!(redact("rediss://:secret@host/"), "rediss://:***@host/");
        assert_eq!(redact("redis://secret@host"), "redis://***@host");
    }

    #[test]
    fn masters_are_read_from_cluster_nodes() {
        let listing = "\
a1 127.0.0.1:7000@17000 myself,master - 0 0 1 connected 0-5460
b2 127.0.0.1:7001@17001 master - 0 1 2 connected 5461-10922
c3 127.0.0.1:7003@17003 slave b2 0 1 2 connected
d4 127.0.0.1:7002@17002,host.example master,fail - 0 1 3 connected
e5 :0@0 master,noaddr - 0 0 0 disconnected
f6 :7009@17009 myself,master - 0 0 1 connected 10923-16383
";
        assert_eq!(
            masters(listing, "127.0.0.1:7009"),
            [
                ("127.0.0.1".to_owned(), 7000),
                ("127.0.0.1".to_owned(), 7001),
                ("127.0.0.1".to_owned(), 7009)
            ]
        );
    }
}
