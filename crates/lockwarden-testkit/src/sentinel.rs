//! The [`RedisSentinel`] handle: a primary/replica pair of [`RedisServer`]s
//! monitored by one Redis Sentinel process, its start-up (replication link
//! up, Sentinel aware of both servers) and waiting for a failover.

use std::collections::HashMap;
use std::io;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use crate::eventually::poll_until;
use crate::server::RedisServer;
use crate::tls::TlsCerts;

/// Service (master) name the Sentinel monitors the primary under.
const SERVICE: &str = "lockwarden";

/// `down-after-milliseconds`: how long the primary may be silent before the
/// Sentinel considers it down.
const DOWN_AFTER_MS: u32 = 400;

/// `failover-timeout` in milliseconds.
const FAILOVER_TIMEOUT_MS: u32 = 2000;

/// Arguments of both data servers: a primary waits 5 s by default
/// (`repl-diskless-sync-delay`) for more replicas before a full sync; with a
/// single replica that is pure delay. Given to both, since the roles swap.
const NO_SYNC_DELAY: &[&str] = &["--repl-diskless-sync-delay", "0"];

/// Name of the Sentinel's config file in its temp dir.
const CONFIG_FILE: &str = "sentinel.conf";

/// How long [`RedisSentinel::start`] waits for the replication link and for
/// the Sentinel to know both servers.
const START_TIMEOUT: Duration = Duration::from_secs(20);

/// Delay between two probes.
const POLL_INTERVAL: Duration = Duration::from_millis(50);

/// Connect timeout of the helper connections.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

/// Read/write timeout of the helper connections.
const IO_TIMEOUT: Duration = Duration::from_secs(5);

/// A primary and a replica [`RedisServer`], monitored by one Sentinel
/// (quorum 1) under the service name `"lockwarden"`, with
/// `down-after-milliseconds 400`, `failover-timeout 2000` and
/// `parallel-syncs 1`, so that a failover completes within seconds.
///
/// The Sentinel is a `redis-server <config> --sentinel` process on its own
/// free loopback port, with its (writable) config file and its log in its own
/// temp dir. Dropping the handle kills and reaps the Sentinel first, then both
/// servers.
///
/// ```no_run
/// use std::time::Duration;
///
/// let mut pair = lockwarden_testkit::RedisSentinel::start()?;
/// let old = pair.master_port()?;
/// pair.servers_mut()[0].kill();
/// let new = pair.wait_for_failover(old, Duration::from_secs(10))?;
/// assert_eq!(new, pair.servers()[1].port());
/// # Ok::<(), std::io::Error>(())
/// ```
#[derive(Debug)]
pub struct RedisSentinel {
    /// The Sentinel process; declared first so it is dropped first and does
    /// not react to the servers going away.
    sentinel: RedisServer,
    /// Index 0 started as the primary, index 1 as its replica.
    servers: Vec<RedisServer>,
}

impl RedisSentinel {
    /// Starts the primary, the replica (`--replicaof 127.0.0.1 <primary>`)
    /// and the Sentinel, and waits (up to 20 s per stage) until
    ///
    /// * the primary's `INFO replication` lists the replica as
    ///   `state=online` and the replica reports `master_link_status:up`, and
    /// * the Sentinel reports the primary's port for `"lockwarden"` with
    ///   plain `master` flags, and lists the replica as a connected `slave`
    ///   with `master-link-status` `ok` (so it is eligible for promotion).
    ///
    /// Both data servers run with `--repl-diskless-sync-delay 0`, so the
    /// initial sync starts at once instead of after Redis' default 5 s.
    ///
    /// # Errors
    ///
    /// Any error starting a process (see [`RedisServer::start`]), or
    /// `TimedOut` if a stage does not complete, quoting the last state seen
    /// and the relevant log.
    pub fn start() -> io::Result<RedisSentinel> {
        Self::start_inner(None)
    }

    /// Like [`RedisSentinel::start`], over TLS with `certs` (see
    /// [`RedisServer::start_tls`]): the replica replicates from the
    /// primary's TLS port, the Sentinel monitors both over TLS and names
    /// their TLS ports, and [`sentinel_url`](RedisSentinel::sentinel_url) is
    /// the Sentinel's own TLS port (`rediss://`). The plain-text ports stay
    /// open on loopback for the testkit's probes only.
    ///
    /// # Errors
    ///
    /// As for [`RedisSentinel::start`].
    pub fn start_tls(certs: &Arc<TlsCerts>) -> io::Result<RedisSentinel> {
        Self::start_inner(Some(certs))
    }

    fn start_inner(tls: Option<&Arc<TlsCerts>>) -> io::Result<RedisSentinel> {
        let start = |args: &[&str]| match tls {
            Some(certs) => RedisServer::start_tls(certs, args),
            None => RedisServer::start_with(args),
        };
        let primary = start(NO_SYNC_DELAY)?;
        // The port replicas and the Sentinel reach it on, and report it with.
        let primary_port = primary.client_port().to_string();
        let mut replica_args = NO_SYNC_DELAY.to_vec();
        replica_args.extend(["--replicaof", "127.0.0.1", &primary_port]);
        let replica = start(&replica_args)?;
        let replica_port = replica.client_port();

        let replica_field = format!("port={replica_port},");
        wait_for("the replica to sync", &replica, || {
            let info: String = run(&primary, &["INFO", "replication"])?;
            let online = info
                .lines()
                .any(|l| l.contains(&replica_field) && l.contains("state=online"));
            if !online {
                return Ok(Some(format!("primary reports:\n{}", info.trim())));
            }
            let info: String = run(&replica, &["INFO", "replication"])?;
            Ok((!info.lines().any(|l| l.trim() == "master_link_status:up"))
                .then(|| format!("replica reports:\n{}", info.trim())))
        })?;

        let config = format!(
            "sentinel monitor {SERVICE} 127.0.0.1 {primary_port} 1\n\
             sentinel down-after-milliseconds {SERVICE} {DOWN_AFTER_MS}\n\
             sentinel failover-timeout {SERVICE} {FAILOVER_TIMEOUT_MS}\n\
             sentinel parallel-syncs {SERVICE} 1\n"
        );
        let sentinel =
            RedisServer::start_with_config_file(CONFIG_FILE, &config, &["--sentinel"], tls)?;
        let pair = RedisSentinel {
            sentinel,
            servers: vec![primary, replica],
        };

        wait_for("the sentinel to know both servers", &pair.sentinel, || {
            let port = pair.master_port()?;
            if port != pair.servers[0].client_port() {
                return Ok(Some(format!("sentinel reports master port {port}")));
            }
            let master: HashMap<String, String> =
                run(&pair.sentinel, &["SENTINEL", "MASTER", SERVICE])?;
            if master.get("flags").map(String::as_str) != Some("master") {
                return Ok(Some(format!("sentinel's view of the master: {master:?}")));
            }
            let replicas: Vec<HashMap<String, String>> =
                run(&pair.sentinel, &["SENTINEL", "REPLICAS", SERVICE])?;
            let port = replica_port.to_string();
            let ready = replicas.iter().any(|r| {
                r.get("port") == Some(&port)
                    && r.get("flags").map(String::as_str) == Some("slave")
                    && r.get("master-link-status").map(String::as_str) == Some("ok")
            });
            Ok((!ready).then(|| format!("sentinel's view of the replicas: {replicas:?}")))
        })?;
        Ok(pair)
    }

    /// The service (master) name the Sentinel monitors, `"lockwarden"`.
    pub fn service(&self) -> &str {
        SERVICE
    }

    /// The Sentinel's URL, `redis://127.0.0.1:PORT/` (`rediss://` and its TLS
    /// port for a [TLS pair](RedisSentinel::start_tls)).
    pub fn sentinel_url(&self) -> String {
        self.sentinel.url()
    }

    /// The Sentinel process itself, e.g. to [pause](RedisServer::pause) it or
    /// to send it `SENTINEL` commands.
    pub fn sentinel(&self) -> &RedisServer {
        &self.sentinel
    }

    /// The data servers: index 0 started as the primary, index 1 as its
    /// replica (the roles swap after a failover).
    pub fn servers(&self) -> &[RedisServer] {
        &self.servers
    }

    /// The data servers, mutably, e.g. to [kill](RedisServer::kill) the
    /// primary.
    pub fn servers_mut(&mut self) -> &mut [RedisServer] {
        &mut self.servers
    }

    /// The primary's port according to the Sentinel
    /// (`SENTINEL get-master-addr-by-name lockwarden`): a server's
    /// [`client_port`](RedisServer::client_port).
    ///
    /// # Errors
    ///
    /// Fails if the Sentinel does not answer or knows no such master.
    pub fn master_port(&self) -> io::Result<u16> {
        let addr: Option<(String, String)> = run(
            &self.sentinel,
            &["SENTINEL", "GET-MASTER-ADDR-BY-NAME", SERVICE],
        )?;
        let (_, port) = addr.ok_or_else(|| {
            io::Error::other(format!("the sentinel does not monitor {SERVICE:?}"))
        })?;
        port.parse().map_err(|e| {
            io::Error::other(format!(
                "the sentinel reported a bad master port {port:?}: {e}"
            ))
        })
    }

    /// Polls until the Sentinel reports a master port other than
    /// `from_port` **and** the server on that port answers `ROLE` as
    /// `master`; returns that port.
    ///
    /// # Errors
    ///
    /// `TimedOut` after `timeout`, quoting the last state seen and the tail of
    /// the Sentinel's log.
    pub fn wait_for_failover(&self, from_port: u16, timeout: Duration) -> io::Result<u16> {
        let deadline = Instant::now() + timeout;
        loop {
            let last = match self.master_port() {
                Ok(port) if port != from_port => match self.role_of(port) {
                    Ok(role) if role == "master" => return Ok(port),
                    Ok(role) => format!("sentinel names port {port}, whose ROLE is {role}"),
                    Err(e) => format!("sentinel names port {port}: {e}"),
                },
                Ok(port) => format!("sentinel still names port {port}"),
                Err(e) => e.to_string(),
            };
            if Instant::now() >= deadline {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!(
                        "no failover away from port {from_port} within {timeout:?}: {last}\n\
                         --- sentinel log (127.0.0.1:{}) ---\n{}",
                        self.sentinel.port(),
                        self.sentinel.log_tail()
                    ),
                ));
            }
            thread::sleep(POLL_INTERVAL);
        }
    }

    /// The first element of `ROLE` (`master`, `slave`, ...) of the server on
    /// `port`, which must be one of [`RedisSentinel::servers`].
    fn role_of(&self, port: u16) -> io::Result<String> {
        let server = self
            .servers
            .iter()
            .find(|s| s.client_port() == port)
            .ok_or_else(|| io::Error::other(format!("port {port} is not one of our servers")))?;
        let role: Vec<redis::Value> = run(server, &["ROLE"])?;
        match role.first() {
            Some(redis::Value::BulkString(bytes)) => Ok(String::from_utf8_lossy(bytes).into()),
            Some(redis::Value::SimpleString(s)) => Ok(s.clone()),
            other => Err(io::Error::other(format!("unexpected ROLE reply {other:?}"))),
        }
    }
}

/// Polls `check` (which returns `Some(reason)` while not there yet) until it
/// returns `None`, or fails with `TimedOut` after [`START_TIMEOUT`], quoting
/// the last reason and `log_of`'s log.
fn wait_for(
    what: &str,
    log_of: &RedisServer,
    check: impl Fn() -> io::Result<Option<String>>,
) -> io::Result<()> {
    poll_until(START_TIMEOUT, check).map_err(|reason| {
        io::Error::new(
            io::ErrorKind::TimedOut,
            format!(
                "timed out after {START_TIMEOUT:?} waiting for {what}: {reason}\n\
                 --- log of 127.0.0.1:{} ---\n{}",
                log_of.port(),
                log_of.log_tail()
            ),
        )
    })
}

/// Runs one command on `server` with the short helper timeouts, turning redis
/// errors into `io::Error`s that name the server and the command.
fn run<T: redis::FromRedisValue>(server: &RedisServer, args: &[&str]) -> io::Result<T> {
    server
        .query_within(CONNECT_TIMEOUT, IO_TIMEOUT, args)
        .map_err(|e| {
            io::Error::other(format!(
                "{} on 127.0.0.1:{} failed: {e}",
                args.iter().take(2).copied().collect::<Vec<_>>().join(" "),
                server.port()
            ))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whether a process with this pid exists (zombies included).
    fn process_exists(pid: u32) -> bool {
        let pid = libc::pid_t::try_from(pid).expect("pid fits pid_t");
        // SAFETY: signal 0 only performs the existence/permission check.
        unsafe { libc::kill(pid, 0) == 0 }
    }

    fn start() -> RedisSentinel {
        let started = Instant::now();
        let pair = match RedisSentinel::start() {
            Ok(pair) => pair,
            Err(e) => panic!("could not start the sentinel setup: {e}"),
        };
        eprintln!("sentinel setup ready in {:?}", started.elapsed());
        pair
    }

    #[test]
    fn sentinel_is_configured_and_killed_on_drop() {
        let pair = start();
        assert_eq!(pair.service(), "lockwarden");
        let sentinel_port = pair.sentinel().port();
        assert_eq!(
            pair.sentinel_url(),
            format!("redis://127.0.0.1:{sentinel_port}/")
        );
        assert!(pair.servers().iter().all(|s| s.port() != sentinel_port));
        assert_eq!(
            pair.master_port().expect("master_port"),
            pair.servers()[0].port()
        );

        let master: HashMap<String, String> = pair
            .sentinel()
            .query(&["SENTINEL", "MASTER", "lockwarden"])
            .expect("SENTINEL MASTER");
        assert_eq!(master["quorum"], "1", "{master:?}");
        assert_eq!(master["down-after-milliseconds"], "400", "{master:?}");
        assert_eq!(master["failover-timeout"], "2000", "{master:?}");
        assert_eq!(master["parallel-syncs"], "1", "{master:?}");
        assert_eq!(master["num-slaves"], "1", "{master:?}");

        let role: Vec<redis::Value> = pair.servers()[1].query(&["ROLE"]).expect("ROLE");
        assert_eq!(
            role.first(),
            Some(&redis::Value::BulkString(b"slave".to_vec()))
        );

        let pids: Vec<u32> = std::iter::once(pair.sentinel().pid())
            .chain(pair.servers().iter().map(RedisServer::pid))
            .map(|pid| pid.expect("running"))
            .collect();
        drop(pair);
        for pid in pids {
            assert!(!process_exists(pid), "process {pid} survived drop");
        }
    }

    #[test]
    fn killing_the_primary_promotes_the_replica() {
        let mut pair = start();
        let old = pair.master_port().expect("master_port");
        assert_eq!(old, pair.servers()[0].port());
        // Replication is asynchronous: make sure the write reached the
        // replica. WAIT only covers writes made on its own connection (a
        // fresh one returns at once), hence one connection for both.
        let mut con = pair.servers()[0].connection().expect("connection");
        let _: () = redis::cmd("SET")
            .arg("before")
            .arg("1")
            .query(&mut con)
            .expect("SET on primary");
        let acked: i64 = redis::cmd("WAIT")
            .arg(1)
            .arg(5000)
            .query(&mut con)
            .expect("WAIT");
        assert_eq!(acked, 1);
        drop(con);

        pair.servers_mut()[0].kill();
        let killed = Instant::now();
        let new = pair
            .wait_for_failover(old, Duration::from_secs(10))
            .expect("failover");
        eprintln!("failover took {:?}", killed.elapsed());
        assert_eq!(new, pair.servers()[1].port());
        assert_eq!(pair.master_port().expect("master_port"), new);

        let promoted = &pair.servers()[1];
        let _: () = promoted
            .query(&["SET", "after", "2"])
            .expect("SET on promoted");
        let after: Option<String> = promoted.query(&["GET", "after"]).expect("GET");
        assert_eq!(after.as_deref(), Some("2"));
        // Acknowledged by the replica before the kill, so it survived.
        let before: Option<String> = promoted.query(&["GET", "before"]).expect("GET");
        assert_eq!(
            before.as_deref(),
            Some("1"),
            "--- promoted server log ---\n{}\n--- sentinel log ---\n{}",
            promoted.log_tail(),
            pair.sentinel().log_tail()
        );
    }

    #[test]
    fn wait_for_failover_times_out_without_one() {
        let pair = start();
        let old = pair.master_port().expect("master_port");
        let started = Instant::now();
        let err = pair
            .wait_for_failover(old, Duration::from_millis(300))
            .expect_err("nothing failed, so no failover");
        assert_eq!(err.kind(), io::ErrorKind::TimedOut, "{err}");
        assert!(started.elapsed() < Duration::from_secs(5));
        let msg = err.to_string();
        assert!(msg.contains("still names port"), "{msg}");
        assert!(msg.contains("sentinel log"), "{msg}");
    }
}
