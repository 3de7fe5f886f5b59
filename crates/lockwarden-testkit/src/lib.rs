//! Test support for lockwarden: throw-away `redis-server` processes.
//!
//! This crate owns the lifecycle of real Redis servers used by lockwarden's
//! tests. A [`RedisServer`] is a `redis-server` child process that
//!
//! * listens only on `127.0.0.1`, on a port picked freshly from the kernel
//!   (never a fixed port),
//! * runs in its own temporary directory with persistence disabled, logging
//!   to a file in that directory,
//! * can be paused (`SIGSTOP`), resumed (`SIGCONT`), killed (`SIGKILL`) and
//!   restarted on the same port to simulate outages, and
//! * is killed, reaped and cleaned up when dropped.
//!
//! Built from such servers:
//!
//! * [`RedisCluster`] forms a master-only Redis Cluster (slots split evenly,
//!   converged before it is returned) and can move a slot, keys included,
//!   from one node to another while the cluster is live;
//!   [`RedisCluster::start_proxied`] puts each node behind a [`FaultProxy`]
//!   that the node announces, so a cluster client goes through the proxies.
//! * [`RedisSentinel`] runs a primary/replica pair watched by one Sentinel
//!   (quorum 1, 400 ms down-after) and waits for a failover.
//!
//! Each of them also comes over TLS ([`RedisServer::start_tls`],
//! [`RedisCluster::start_tls`], [`RedisSentinel::start_tls`]) with
//! certificates made for the test run ([`TlsCerts`]), and a server can be
//! given restricted ACL users ([`RedisServer::acl_user`]).
//!
//! The binary is `$REDIS_SERVER` if that is set, otherwise `redis-server` on
//! `PATH`; [`redis_server_available`] reports whether one can be found.
//!
//! For assertions:
//!
//! * probes on [`RedisServer`] that ask the server what happened:
//!   [`pttl`](RedisServer::pttl), [`exists`](RedisServer::exists),
//!   [`command_calls`](RedisServer::command_calls) (`INFO commandstats`),
//!   [`subscribers`](RedisServer::subscribers) (`PUBSUB NUMSUB`),
//!   [`channels`](RedisServer::channels) (`PUBSUB CHANNELS`),
//!   [`clients`](RedisServer::clients) (`CLIENT LIST`) and
//!   [`keys_matching`](RedisServer::keys_matching) (`SCAN`); on
//!   [`RedisCluster`], [`pttl`](RedisCluster::pttl) and
//!   [`exists_on`](RedisCluster::exists_on);
//! * [`eventually`], which polls a condition within a bound;
//! * [`TestProcess`] and [`run_child`], for tests that re-execute their own
//!   binary to get a second process (to SIGKILL, or many at once);
//! * [`FaultProxy`], a TCP proxy between clients and a server that adds
//!   latency, holds back or loses replies, blackholes and resets connections;
//! * [`FakeClock`], a wall clock a test steps back under a server started with
//!   [`RedisServer::start_with_clock`], or steps either way under a child process
//!   started with [`TestProcess::spawn_on_clock`].
//!
//! ```no_run
//! use lockwarden_testkit::RedisServer;
//!
//! let mut server = RedisServer::start()?;
//! let client = redis::Client::open(server.url()).map_err(std::io::Error::other)?;
//! # let _ = client;
//! server.pause(); // the server stops answering...
//! server.resume(); // ...and answers again
//! server.restart()?; // same port, empty data set
//! # Ok::<(), std::io::Error>(())
//! ```

#![warn(missing_docs)]

mod chaos;
mod child;
mod clock;
mod cluster;
mod eventually;
mod probe;
mod proxy;
mod sentinel;
mod server;
mod tls;

pub use chaos::ChaosRun;
pub use child::{run_child, TestProcess};
pub use clock::FakeClock;
pub use cluster::RedisCluster;
pub use eventually::{eventually, POLL_INTERVAL};
pub use probe::ClientInfo;
pub use proxy::FaultProxy;
pub use sentinel::RedisSentinel;
pub use server::{redis_server_available, RedisServer};
pub use tls::TlsCerts;

#[cfg(test)]
mod tests {
    use super::*;
    use std::io;
    use std::net::{Ipv4Addr, TcpStream};
    use std::path::PathBuf;
    use std::thread;
    use std::time::{Duration, Instant};

    fn start() -> RedisServer {
        match RedisServer::start() {
            Ok(server) => server,
            Err(e) => panic!("could not start redis-server: {e}"),
        }
    }

    fn ping(server: &RedisServer) -> redis::RedisResult<String> {
        server.query(&["PING"])
    }

    /// Whether a process with this pid exists (zombies included).
    fn process_exists(pid: u32) -> bool {
        let pid = libc::pid_t::try_from(pid).expect("pid fits pid_t");
        // SAFETY: signal 0 only performs the existence/permission check.
        unsafe { libc::kill(pid, 0) == 0 }
    }

    #[test]
    fn redis_server_is_available() {
        assert!(redis_server_available());
    }

    #[test]
    fn start_and_ping() {
        let server = start();
        assert_ne!(server.port(), 0);
        assert_eq!(
            server.url(),
            format!("redis://127.0.0.1:{}/", server.port())
        );
        assert!(server.pid().is_some());
        assert_eq!(ping(&server).expect("PING"), "PONG");

        let mut con = server.connection().expect("connection");
        let pong: String = redis::cmd("PING").query(&mut con).expect("PING");
        assert_eq!(pong, "PONG");

        match server.cmd(&["ECHO", "hi"]).expect("ECHO") {
            redis::Value::BulkString(bytes) => assert_eq!(bytes, b"hi"),
            other => panic!("unexpected ECHO reply {other:?}"),
        }
    }

    #[test]
    fn server_is_configured_for_tests() {
        let server = start();
        let bind: Vec<String> = server.query(&["CONFIG", "GET", "bind"]).expect("CONFIG");
        assert_eq!(bind, ["bind", "127.0.0.1"]);
        let save: Vec<String> = server.query(&["CONFIG", "GET", "save"]).expect("CONFIG");
        assert_eq!(save, ["save", ""]);
        let aof: Vec<String> = server
            .query(&["CONFIG", "GET", "appendonly"])
            .expect("CONFIG");
        assert_eq!(aof, ["appendonly", "no"]);
    }

    #[test]
    fn a_fake_clock_steps_the_servers_time_back_at_once() {
        let clock = FakeClock::new().expect("a fake clock");
        let server = RedisServer::start_with_clock(&clock, &[]).expect("start");
        let now = |server: &RedisServer| -> i64 {
            let time: Vec<String> = server.query(&["TIME"]).expect("TIME");
            time[0].parse().expect("seconds")
        };
        let real = now(&server);
        clock
            .set_back(Duration::from_secs(3600))
            .expect("step back");
        let back = now(&server);
        assert!((real - 3600 - back).abs() <= 2, "{real} then {back}");
        clock.set_offset(0).expect("back to now");
        assert!((now(&server) - real).abs() <= 2);
    }

    #[test]
    fn empty_command_is_a_client_error() {
        let server = start();
        let err = server.cmd(&[]).expect_err("empty command must fail");
        assert_eq!(err.kind(), redis::ErrorKind::Client);
    }

    #[test]
    fn start_with_appends_arguments() {
        let server = RedisServer::start_with(&["--maxclients", "100"]).expect("start_with");
        let reply: Vec<String> = server
            .query(&["CONFIG", "GET", "maxclients"])
            .expect("CONFIG GET");
        assert_eq!(reply, ["maxclients", "100"]);
    }

    #[test]
    fn start_with_bad_argument_quotes_the_log() {
        let err = RedisServer::start_with(&["--no-such-directive", "1"])
            .expect_err("redis must reject an unknown directive");
        let msg = err.to_string();
        assert!(msg.contains("did not become ready"), "{msg}");
        assert!(msg.contains("no-such-directive"), "{msg}");
    }

    #[test]
    fn pause_blocks_replies_until_resume() {
        let server = start();
        let mut con = server.connection().expect("connection");
        con.set_read_timeout(Some(Duration::from_millis(300)))
            .expect("set_read_timeout");
        let pong: String = redis::cmd("PING").query(&mut con).expect("PING");
        assert_eq!(pong, "PONG");

        server.pause();
        let started = Instant::now();
        let err = redis::cmd("PING")
            .query::<String>(&mut con)
            .expect_err("a paused server must not answer");
        let waited = started.elapsed();
        assert!(err.is_timeout(), "expected a timeout, got {err:?}");
        assert!(waited >= Duration::from_millis(250), "{waited:?}");
        assert!(waited < Duration::from_secs(5), "{waited:?}");

        server.resume();
        // The old connection still has the stale PONG queued; use a new one.
        assert_eq!(ping(&server).expect("PING after resume"), "PONG");
    }

    #[test]
    fn restart_keeps_port_and_loses_data() {
        let mut server = start();
        let port = server.port();
        let old_pid = server.pid().expect("pid");
        let _: () = server.query(&["SET", "k", "v"]).expect("SET");
        let before: Option<String> = server.query(&["GET", "k"]).expect("GET");
        assert_eq!(before.as_deref(), Some("v"));

        server.restart().expect("restart");
        assert_eq!(server.port(), port);
        let new_pid = server.pid().expect("pid after restart");
        assert_ne!(new_pid, old_pid);
        assert!(
            !process_exists(old_pid),
            "old server {old_pid} still exists"
        );
        let after: Option<String> = server.query(&["GET", "k"]).expect("GET");
        assert_eq!(after, None);
    }

    #[test]
    fn restart_of_a_paused_server_works() {
        let mut server = start();
        server.pause();
        server.restart().expect("restart");
        assert_eq!(ping(&server).expect("PING"), "PONG");
    }

    #[test]
    fn kill_refuses_connections() {
        let mut server = start();
        assert!(server.is_running());
        server.kill();
        assert!(!server.is_running());
        assert_eq!(server.pid(), None);

        let err = TcpStream::connect((Ipv4Addr::LOCALHOST, server.port()))
            .expect_err("nothing should listen after kill");
        assert_eq!(err.kind(), io::ErrorKind::ConnectionRefused);
        let Err(err) = server.connection() else {
            panic!("redis connection should fail after kill");
        };
        assert!(err.is_connection_refusal(), "{err:?}");

        server.kill(); // idempotent
        server.pause(); // no-ops without a process
        server.resume();

        server.restart().expect("restart after kill");
        assert_eq!(ping(&server).expect("PING"), "PONG");
    }

    #[test]
    fn is_running_notices_external_death() {
        let mut server = start();
        let pid = libc::pid_t::try_from(server.pid().expect("pid")).expect("pid fits");
        // SAFETY: plain kill(2) on our own, unreaped child.
        assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
        let deadline = Instant::now() + Duration::from_secs(10);
        while server.is_running() {
            assert!(Instant::now() < deadline, "server ignored SIGTERM");
            thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(server.pid(), None);
    }

    #[test]
    fn two_servers_get_different_ports() {
        let a = start();
        let b = start();
        assert_ne!(a.port(), b.port());
        assert_ne!(a.pid(), b.pid());
        let _: () = a.query(&["SET", "only-in-a", "1"]).expect("SET");
        let in_b: Option<String> = b.query(&["GET", "only-in-a"]).expect("GET");
        assert_eq!(in_b, None);
    }

    #[test]
    fn acl_user_has_exactly_its_rules() {
        let server = start();
        let url = server
            .acl_user("app", "p@ss word", &["~app:*", "+get", "+set"])
            .expect("ACL SETUSER");
        assert_eq!(
            url,
            format!("redis://app:p%40ss%20word@127.0.0.1:{}/", server.port())
        );
        let mut con = redis::Client::open(url).unwrap().get_connection().unwrap();
        let _: () = redis::cmd("SET")
            .arg("app:1")
            .arg("v")
            .query(&mut con)
            .unwrap();
        let err = redis::cmd("SET")
            .arg("other:1")
            .arg("v")
            .query::<()>(&mut con)
            .expect_err("a key outside the pattern");
        assert_eq!(
            err.kind(),
            redis::ErrorKind::Server(redis::ServerErrorKind::NoPerm)
        );
        let err = redis::cmd("DEL")
            .arg("app:1")
            .query::<i64>(&mut con)
            .expect_err("a command not granted");
        assert_eq!(
            err.kind(),
            redis::ErrorKind::Server(redis::ServerErrorKind::NoPerm)
        );
        // The probes are the default user's.
        assert!(server.exists("app:1"));
        let err = server
            .acl_user("app", "pw", &["+nonsense"])
            .expect_err("a bad rule");
        assert!(err.to_string().contains("+nonsense"), "{err}");
    }

    #[test]
    fn drop_kills_paused_server_and_removes_dir() {
        let server = start();
        let pid = server.pid().expect("pid");
        let port = server.port();
        let reply: Vec<String> = server.query(&["CONFIG", "GET", "dir"]).expect("CONFIG");
        let dir = PathBuf::from(&reply[1]);
        assert!(dir.is_dir(), "{dir:?}");

        server.pause();
        drop(server);

        assert!(!process_exists(pid), "server {pid} survived drop");
        assert!(!dir.exists(), "{dir:?} survived drop");
        let err = TcpStream::connect((Ipv4Addr::LOCALHOST, port))
            .expect_err("nothing should listen after drop");
        assert_eq!(err.kind(), io::ErrorKind::ConnectionRefused);
    }
}
