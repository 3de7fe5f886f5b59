//! The [`RedisServer`] process handle and the helpers it needs: locating the
//! binary, picking a free loopback port, spawning, and waiting for readiness.

use std::collections::BTreeSet;
use std::ffi::OsString;
use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread;
use std::time::{Duration, Instant};

use tempfile::TempDir;

use crate::clock::FakeClock;
use crate::tls::TlsCerts;

/// Message of the error returned when no `redis-server` binary can be found.
const NOT_FOUND_MSG: &str =
    "redis-server not found: install it (apt-get install redis-server) or run ./scripts/test.sh";

/// Environment variable that overrides which `redis-server` binary is used.
const BINARY_ENV: &str = "REDIS_SERVER";

/// How long to wait for a freshly spawned server to answer `PING`.
const READY_TIMEOUT: Duration = Duration::from_secs(10);

/// Delay between two readiness probes.
const POLL_INTERVAL: Duration = Duration::from_millis(10);

/// Connect/read/write timeout of a single readiness probe.
const PROBE_TIMEOUT: Duration = Duration::from_millis(250);

/// Connect timeout used by [`RedisServer::connection`], [`RedisServer::cmd`]
/// and [`RedisServer::query`] (it also bounds redis-rs' connection handshake).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Read/write timeout of the connection used by [`RedisServer::cmd`] and
/// [`RedisServer::query`].
const CMD_TIMEOUT: Duration = Duration::from_secs(10);

/// How many fresh ports [`RedisServer::start_with`] tries before giving up.
const START_ATTEMPTS: u32 = 5;

/// How many times [`RedisServer::restart`] tries to re-bind the same port.
const RESTART_ATTEMPTS: u32 = 5;

/// Name of the log file (redis-server's stdout and stderr) in the temp dir.
const LOG_FILE: &str = "redis.log";

/// How many trailing log lines are quoted in startup error messages.
const LOG_TAIL_LINES: usize = 20;

/// A throw-away `redis-server` process listening on `127.0.0.1`.
///
/// The server runs in its own temporary directory with persistence disabled
/// (`--save "" --appendonly no`). Dropping the handle kills the process
/// (resuming it first if it was paused), reaps it and removes the directory.
///
/// ```no_run
/// let server = lockwarden_testkit::RedisServer::start()?;
/// let pong: String = server.query(&["PING"]).map_err(std::io::Error::other)?;
/// assert_eq!(pong, "PONG");
/// # Ok::<(), std::io::Error>(())
/// ```
#[derive(Debug)]
pub struct RedisServer {
    /// The running child; `None` after [`RedisServer::kill`] or once it has
    /// been observed (and reaped) as exited.
    child: Option<Child>,
    /// Loopback port the server listens on; stable across restarts.
    port: u16,
    /// Working directory (`--dir`) and log location; removed on drop.
    dir: TempDir,
    /// The `redis-server` binary used, re-used by [`RedisServer::restart`].
    binary: PathBuf,
    /// Caller-supplied extra arguments, re-used by [`RedisServer::restart`].
    extra_args: Vec<OsString>,
    /// Environment variables set for the process (a [`FakeClock`]'s), re-used by
    /// [`RedisServer::restart`].
    env: Vec<(OsString, OsString)>,
    /// Config file passed as the first argument (inside `dir`), if any;
    /// re-used by [`RedisServer::restart`].
    config_file: Option<PathBuf>,
    /// The TLS listener of a server started with [`RedisServer::start_tls`].
    tls: Option<TlsListener>,
}

/// A server's TLS port and the certificates it serves (kept alive as long as
/// the server may read them: at start and on restart).
#[derive(Debug)]
struct TlsListener {
    port: u16,
    certs: Arc<TlsCerts>,
}

/// Why a single spawn attempt failed.
enum SpawnError {
    /// Probably a port race (address in use, or another server answered on
    /// the port): worth retrying.
    Retryable(io::Error),
    /// Anything else: retrying would not help.
    Fatal(io::Error),
}

impl From<io::Error> for SpawnError {
    fn from(e: io::Error) -> Self {
        SpawnError::Fatal(e)
    }
}

impl RedisServer {
    /// Starts `redis-server` on a free loopback port (`127.0.0.1`) in its own
    /// temporary directory, with no persistence (`--save "" --appendonly no`),
    /// and waits (up to 10 s) until it answers `PING`.
    ///
    /// The binary is taken from the `REDIS_SERVER` environment variable if
    /// set, otherwise `redis-server` is looked up on `PATH`. If the chosen
    /// port is grabbed by someone else before redis binds it, a new port is
    /// tried (up to 5 attempts).
    ///
    /// # Errors
    ///
    /// Fails if the binary cannot be found (see [`redis_server_available`]),
    /// if the temp dir or log file cannot be created, or if the server does
    /// not become ready; startup failures quote the tail of the server log.
    pub fn start() -> io::Result<RedisServer> {
        Self::start_with(&[])
    }

    /// Like [`RedisServer::start`], with extra `redis-server` arguments
    /// appended after the built-in ones (e.g. `&["--maxclients", "100"]`).
    ///
    /// The extra arguments are kept and re-applied by
    /// [`RedisServer::restart`]. Arguments that make the server listen on
    /// anything other than the chosen loopback port defeat readiness
    /// detection and are not supported.
    ///
    /// # Errors
    ///
    /// Same as [`RedisServer::start`]; an argument redis rejects yields an
    /// error quoting the server log.
    pub fn start_with(args: &[&str]) -> io::Result<RedisServer> {
        Self::start_inner(None, args, None, Vec::new())
    }

    /// Like [`RedisServer::start_with`], on `clock`: the server reads the wall clock
    /// with its offset (see [`FakeClock`]), so a test can step it back while the
    /// server runs or between restarts. With persistence arguments (say `&["--appendonly",
    /// "yes", "--appendfsync", "always"]`, which win over the built-in `--appendonly no`)
    /// the data set outlives [`restart`](RedisServer::restart), whose new process reads
    /// it from the same directory.
    ///
    /// # Errors
    ///
    /// As for [`RedisServer::start_with`].
    pub fn start_with_clock(clock: &FakeClock, args: &[&str]) -> io::Result<RedisServer> {
        Self::start_inner(None, args, None, clock.env())
    }

    /// Like [`RedisServer::start_with`], plus a TLS listener on a second free
    /// loopback port serving `certs`' server certificate (see
    /// [`TlsCerts`]): [`url`](RedisServer::url) is then
    /// `rediss://127.0.0.1:TLS_PORT/`, and replication from or to this
    /// server uses TLS (`--tls-replication yes`). Clients may present a
    /// certificate signed by `certs`' CA but need not
    /// (`--tls-auth-clients optional`; pass `&["--tls-auth-clients", "yes"]`
    /// to require one).
    ///
    /// The plain-text [`port`](RedisServer::port) stays open on loopback for
    /// the testkit alone: readiness checks and every probe
    /// ([`query`](RedisServer::query), [`pttl`](RedisServer::pttl),
    /// [`clients`](RedisServer::clients), ...) use it, so they never depend on
    /// the TLS code under test, and `CLIENT LIST`'s `laddr` tells which port
    /// each of the server's clients came in on.
    ///
    /// # Errors
    ///
    /// As for [`RedisServer::start_with`].
    pub fn start_tls(certs: &Arc<TlsCerts>, args: &[&str]) -> io::Result<RedisServer> {
        Self::start_inner(None, args, Some(certs), Vec::new())
    }

    /// Like [`RedisServer::start_with`], but first writes `contents` to the
    /// file `file_name` in the server's temp dir and passes that file as the
    /// **first** argument (`redis-server <dir>/<file_name> --bind ... <args>`),
    /// which is what Sentinel mode needs: `args` would then contain
    /// `--sentinel`. The file stays writable (Sentinel rewrites it) and is
    /// re-used as it is by [`RedisServer::restart`].
    pub(crate) fn start_with_config_file(
        file_name: &str,
        contents: &str,
        args: &[&str],
        tls: Option<&Arc<TlsCerts>>,
    ) -> io::Result<RedisServer> {
        Self::start_inner(Some((file_name, contents)), args, tls, Vec::new())
    }

    /// Shared body of the constructors: temp dir, optional config file, then
    /// spawn attempts on fresh ports (a fresh TLS port too, with `tls`).
    fn start_inner(
        config: Option<(&str, &str)>,
        args: &[&str],
        tls: Option<&Arc<TlsCerts>>,
        env: Vec<(OsString, OsString)>,
    ) -> io::Result<RedisServer> {
        let binary = find_redis_server()?;
        let dir = tempfile::Builder::new()
            .prefix("lockwarden-redis-")
            .tempdir()?;
        let args: Vec<OsString> = args.iter().map(OsString::from).collect();
        let config_file = match config {
            Some((name, contents)) => {
                let path = dir.path().join(name);
                fs::write(&path, contents).map_err(|e| {
                    io::Error::new(
                        e.kind(),
                        format!("could not write config file {}: {e}", path.display()),
                    )
                })?;
                Some(path)
            }
            None => None,
        };

        let mut last_err = None;
        for _ in 0..START_ATTEMPTS {
            let port = free_port()?;
            // The TLS arguments go first, so that `args` can override them.
            let (tls_listener, mut extra_args) = match tls {
                Some(certs) => {
                    let tls_port = free_port()?;
                    let tls_args = certs.server_args(tls_port).into_iter().map(OsString::from);
                    let listener = TlsListener {
                        port: tls_port,
                        certs: Arc::clone(certs),
                    };
                    (Some(listener), tls_args.collect())
                }
                None => (None, Vec::new()),
            };
            extra_args.extend(args.iter().cloned());
            let spawn = Spawn {
                binary: &binary,
                dir: dir.path(),
                port,
                config_file: config_file.as_deref(),
                extra_args: &extra_args,
                env: &env,
            };
            match spawn_ready(&spawn) {
                Ok(child) => {
                    return Ok(RedisServer {
                        child: Some(child),
                        port,
                        dir,
                        binary,
                        extra_args,
                        env,
                        config_file,
                        tls: tls_listener,
                    });
                }
                Err(SpawnError::Retryable(e)) => last_err = Some(e),
                Err(SpawnError::Fatal(e)) => return Err(e),
            }
        }
        Err(attempts_exhausted("start", START_ATTEMPTS, last_err))
    }

    /// The loopback TCP port the server listens on (unchanged by
    /// [`RedisServer::restart`]). On a [TLS server](RedisServer::start_tls)
    /// this is its plain-text port, which only the testkit's probes use.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The TLS port of a server started with [`RedisServer::start_tls`]
    /// (unchanged by [`RedisServer::restart`]); `None` for a plain server.
    pub fn tls_port(&self) -> Option<u16> {
        self.tls.as_ref().map(|tls| tls.port)
    }

    /// The port clients connect to, and the one Redis reports to clients that
    /// use it (replicas in `INFO replication`, Sentinel's primary, `CLUSTER
    /// SLOTS` over TLS): the [TLS port](RedisServer::tls_port) of a TLS
    /// server, else [`port`](RedisServer::port).
    pub fn client_port(&self) -> u16 {
        self.tls_port().unwrap_or(self.port)
    }

    /// The certificates a [TLS server](RedisServer::start_tls) serves.
    pub fn tls_certs(&self) -> Option<&Arc<TlsCerts>> {
        self.tls.as_ref().map(|tls| &tls.certs)
    }

    /// The connection URL for clients: `redis://127.0.0.1:PORT/`, or
    /// `rediss://127.0.0.1:TLS_PORT/` for a [TLS server](RedisServer::start_tls).
    pub fn url(&self) -> String {
        match self.tls_port() {
            Some(port) => format!("rediss://127.0.0.1:{port}/"),
            None => self.plain_url(),
        }
    }

    /// [`url`](RedisServer::url) with the credentials of the ACL user `user`
    /// (see [`acl_user`](RedisServer::acl_user)); `password` is
    /// percent-encoded.
    pub fn url_as(&self, user: &str, password: &str) -> String {
        let url = self.url();
        let (scheme, rest) = url.split_once("://").expect("a URL has a scheme");
        format!(
            "{scheme}://{}:{}@{rest}",
            percent_encode(user),
            percent_encode(password)
        )
    }

    /// `redis://127.0.0.1:PORT/` on the plain-text port, for the testkit's own
    /// connections.
    fn plain_url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// Creates (or resets) the ACL user `user` with `password` and exactly
    /// `rules` (`ACL SETUSER user reset on >password rules...`, as the default
    /// user), e.g. `&["~app:*", "&app:*", "+get", "+set"]`, and returns
    /// [`url_as`](RedisServer::url_as) for it.
    ///
    /// # Errors
    ///
    /// If the server rejects a rule (its error is quoted) or does not answer.
    pub fn acl_user(&self, user: &str, password: &str, rules: &[&str]) -> io::Result<String> {
        let pass = format!(">{password}");
        let mut args = vec!["ACL", "SETUSER", user, "reset", "on", &pass];
        args.extend_from_slice(rules);
        self.query::<()>(&args).map_err(|e| {
            io::Error::other(format!(
                "ACL SETUSER {user} {} on 127.0.0.1:{}: {e}",
                rules.join(" "),
                self.port
            ))
        })?;
        Ok(self.url_as(user, password))
    }

    /// Opens a new synchronous [`redis::Connection`] to the server, for
    /// assertions in tests, as the default user, on the plain-text
    /// [`port`](RedisServer::port) (also on a TLS server).
    ///
    /// Connecting (including redis-rs' handshake) is bounded by a 5 s
    /// timeout, so this fails rather than hangs while the server is
    /// [paused](RedisServer::pause). The returned connection has no read or
    /// write timeout; set one with [`redis::Connection::set_read_timeout`] if
    /// needed.
    ///
    /// # Errors
    ///
    /// Any connection error, e.g. connection refused after
    /// [`RedisServer::kill`].
    pub fn connection(&self) -> redis::RedisResult<redis::Connection> {
        redis::Client::open(self.plain_url())?.get_connection_with_timeout(CONNECT_TIMEOUT)
    }

    /// Runs one command on a fresh connection and returns the raw reply,
    /// e.g. `server.cmd(&["CLIENT", "LIST"])`.
    ///
    /// The connection uses a 10 s read/write timeout, so a paused server
    /// yields an error instead of a hang.
    ///
    /// # Errors
    ///
    /// Connection errors, timeouts, server error replies, or a client error
    /// if `args` is empty.
    pub fn cmd(&self, args: &[&str]) -> redis::RedisResult<redis::Value> {
        self.query(args)
    }

    /// Typed variant of [`RedisServer::cmd`]: runs one command and converts
    /// the reply, e.g. `server.query::<String>(&["PING"])`.
    ///
    /// # Errors
    ///
    /// As for [`RedisServer::cmd`], plus reply conversion errors.
    pub fn query<T: redis::FromRedisValue>(&self, args: &[&str]) -> redis::RedisResult<T> {
        self.query_within(CONNECT_TIMEOUT, CMD_TIMEOUT, args)
    }

    /// [`RedisServer::query`] with explicit connect and read/write timeouts,
    /// for helpers that poll several servers and must not wait 10 s on a
    /// paused one.
    pub(crate) fn query_within<T: redis::FromRedisValue>(
        &self,
        connect_timeout: Duration,
        io_timeout: Duration,
        args: &[&str],
    ) -> redis::RedisResult<T> {
        let (name, rest) = args
            .split_first()
            .ok_or_else(|| redis::RedisError::from((redis::ErrorKind::Client, "empty command")))?;
        let mut con =
            redis::Client::open(self.plain_url())?.get_connection_with_timeout(connect_timeout)?;
        con.set_read_timeout(Some(io_timeout))?;
        con.set_write_timeout(Some(io_timeout))?;
        let mut cmd = redis::cmd(name);
        for arg in rest {
            cmd.arg(*arg);
        }
        cmd.query(&mut con)
    }

    /// Kills the server with `SIGKILL` and waits for it (reaps it).
    ///
    /// Idempotent: does nothing if the server is already gone. Afterwards
    /// connections to [`RedisServer::port`] are refused until
    /// [`RedisServer::restart`].
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            // SIGKILL also terminates a stopped (paused) process. Errors mean
            // the child has already exited; `wait` below reaps it either way.
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Freezes the server with `SIGSTOP`: connections can still be
    /// established by the kernel, but nothing is answered until
    /// [`RedisServer::resume`]. Does nothing if the server is not running.
    pub fn pause(&self) {
        self.signal(libc::SIGSTOP);
    }

    /// Continues a [paused](RedisServer::pause) server with `SIGCONT`. Does
    /// nothing if the server is not running.
    pub fn resume(&self) {
        self.signal(libc::SIGCONT);
    }

    /// Kills the server (`SIGKILL`: it saves nothing on the way out), then starts a
    /// new one on the **same** port, in the same directory, with the same extra
    /// arguments (and clock), and waits until it is ready. All data is lost, unless
    /// the arguments turned persistence on: the new process then loads what the old
    /// one had written to disk (with `--appendonly yes --appendfsync always`, every
    /// write it answered).
    ///
    /// If the port is briefly unavailable, binding is retried a few times
    /// with a short back-off.
    ///
    /// # Errors
    ///
    /// Fails if the server cannot be started on the same port (e.g. another
    /// process took it meanwhile); the handle is then left without a running
    /// server.
    pub fn restart(&mut self) -> io::Result<()> {
        self.resume();
        self.kill();
        let mut last_err = None;
        for attempt in 0..RESTART_ATTEMPTS {
            if attempt > 0 {
                thread::sleep(Duration::from_millis(50 * u64::from(attempt)));
            }
            let spawn = Spawn {
                binary: &self.binary,
                dir: self.dir.path(),
                port: self.port,
                config_file: self.config_file.as_deref(),
                extra_args: &self.extra_args,
                env: &self.env,
            };
            match spawn_ready(&spawn) {
                Ok(child) => {
                    self.child = Some(child);
                    return Ok(());
                }
                Err(SpawnError::Retryable(e)) => last_err = Some(e),
                Err(SpawnError::Fatal(e)) => return Err(e),
            }
        }
        Err(attempts_exhausted("restart", RESTART_ATTEMPTS, last_err))
    }

    /// The server's process id, or `None` after [`RedisServer::kill`] (or
    /// once [`RedisServer::is_running`] has observed that it exited).
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Whether the server process is still alive (a paused server counts as
    /// running). If it has exited, it is reaped and [`RedisServer::pid`]
    /// returns `None` from then on.
    pub fn is_running(&mut self) -> bool {
        let Some(child) = self.child.as_mut() else {
            return false;
        };
        match child.try_wait() {
            Ok(None) => true,
            Ok(Some(_)) | Err(_) => {
                // Exited (now reaped) or no longer waitable: forget the pid so
                // that it is never signalled after possible reuse.
                self.child = None;
                false
            }
        }
    }

    /// The last lines of the server's log (stdout and stderr), for error
    /// messages.
    pub(crate) fn log_tail(&self) -> String {
        log_tail(&self.dir.path().join(LOG_FILE))
    }

    /// Sends `sig` to the (unreaped, hence not reusable) child pid, if any.
    fn signal(&self, sig: libc::c_int) {
        if let Some(pid) = self.pid().and_then(|p| libc::pid_t::try_from(p).ok()) {
            // SAFETY: kill(2) has no memory-safety preconditions. The pid
            // belongs to our child, which has not been reaped, so it cannot
            // refer to an unrelated process.
            unsafe {
                libc::kill(pid, sig);
            }
        }
    }
}

impl Drop for RedisServer {
    /// Resumes the server in case it is paused, kills and reaps it; the temp
    /// dir is removed afterwards.
    fn drop(&mut self) {
        self.resume();
        self.kill();
    }
}

/// Returns `true` if a `redis-server` binary can be found (via the
/// `REDIS_SERVER` environment variable or on `PATH`), i.e. if
/// [`RedisServer::start`] has a chance to succeed. Useful to skip tests.
pub fn redis_server_available() -> bool {
    find_redis_server().is_ok()
}

/// Locates the `redis-server` binary: `$REDIS_SERVER` if set (a path, or a
/// name looked up on `PATH`), else `redis-server` on `PATH`.
fn find_redis_server() -> io::Result<PathBuf> {
    find_redis_server_from(std::env::var_os(BINARY_ENV))
}

/// [`find_redis_server`] with the value of `$REDIS_SERVER` passed in (an
/// empty value counts as unset).
fn find_redis_server_from(env_value: Option<OsString>) -> io::Result<PathBuf> {
    match env_value.filter(|v| !v.is_empty()) {
        Some(value) => resolve_binary(Path::new(&value)).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::NotFound,
                format!(
                    "{NOT_FOUND_MSG} ({BINARY_ENV}={} is not an executable file)",
                    Path::new(&value).display()
                ),
            )
        }),
        None => resolve_binary(Path::new("redis-server"))
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, NOT_FOUND_MSG)),
    }
}

/// Resolves `name` like a shell would: paths with a separator are used as
/// they are, bare names are searched on `PATH`.
fn resolve_binary(name: &Path) -> Option<PathBuf> {
    if name.components().count() > 1 || name.is_absolute() {
        return is_executable(name).then(|| name.to_path_buf());
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|candidate| is_executable(candidate))
}

/// Whether `path` is a regular file with some execute bit set.
fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// Ports [`free_port`] has handed out in this process.
static HANDED_OUT: Mutex<BTreeSet<u16>> = Mutex::new(BTreeSet::new());

/// How many kernel-picked ports [`free_port`] tries before giving up.
const FREE_PORT_ATTEMPTS: u32 = 200;

/// Asks the kernel for a currently free loopback port that this process has
/// not handed out before. The listener is dropped before returning, so the
/// port can (rarely) be taken by someone else before redis binds it; callers
/// retry in that case.
///
/// Ports are never handed out twice because something may still be talking
/// to a dead server's port: a Sentinel keeps probing a failed primary (and
/// turns whatever answers there into a replica of the new primary), cluster
/// nodes keep reconnecting to a killed peer. A concurrent test that got that
/// port from the kernel would have its server hijacked.
pub(crate) fn free_port() -> io::Result<u16> {
    for _ in 0..FREE_PORT_ATTEMPTS {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?;
        let port = listener.local_addr()?.port();
        let mut handed_out = HANDED_OUT.lock().unwrap_or_else(PoisonError::into_inner);
        if handed_out.insert(port) {
            return Ok(port);
        }
    }
    Err(io::Error::new(
        io::ErrorKind::AddrInUse,
        format!(
            "the kernel offered only loopback ports already used by this process \
             ({FREE_PORT_ATTEMPTS} attempts)"
        ),
    ))
}

/// `text` with every byte but ASCII letters, digits and `-._~` percent-encoded
/// (for user names and passwords in URLs).
fn percent_encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                char::from(b).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Everything needed to spawn one redis-server process.
struct Spawn<'a> {
    /// The `redis-server` binary.
    binary: &'a Path,
    /// Working directory (`--dir`), also holding the log.
    dir: &'a Path,
    /// Loopback port to listen on.
    port: u16,
    /// Config file passed as the first argument, if any.
    config_file: Option<&'a Path>,
    /// Arguments appended after the built-in ones.
    extra_args: &'a [OsString],
    /// Environment variables set on top of this process's.
    env: &'a [(OsString, OsString)],
}

/// Spawns redis-server as described by `spawn` and waits until it answers
/// `PING` and is verified to be *our* process (not another server that won a
/// port race).
fn spawn_ready(spawn: &Spawn<'_>) -> Result<Child, SpawnError> {
    let Spawn {
        binary,
        dir,
        port,
        config_file,
        extra_args,
        env,
    } = *spawn;
    let log_path = dir.join(LOG_FILE);
    let log = File::create(&log_path)?;
    let log_err = log.try_clone()?;

    let mut command = Command::new(binary);
    if let Some(config_file) = config_file {
        command.arg(config_file);
    }
    let mut child = command
        .arg("--bind")
        .arg("127.0.0.1")
        .arg("--port")
        .arg(port.to_string())
        .arg("--dir")
        .arg(dir)
        .arg("--save")
        .arg("")
        .arg("--appendonly")
        .arg("no")
        .args(extra_args)
        .envs(env.iter().map(|(name, value)| (name, value)))
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::from(log))
        .stderr(Stdio::from(log_err))
        .spawn()
        .map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("failed to spawn {}: {e}", binary.display()),
            )
        })?;

    match wait_ready(&mut child, port) {
        Ok(()) => Ok(child),
        Err(reason) => {
            let _ = child.kill();
            let _ = child.wait();
            let tail = log_tail(&log_path);
            let port_race = matches!(reason, NotReady::OtherServer(_))
                || tail.contains("Address already in use");
            let err = io::Error::other(format!(
                "redis-server on 127.0.0.1:{port} did not become ready: {reason}\n\
                 --- last lines of {} ---\n{tail}",
                log_path.display()
            ));
            Err(if port_race {
                SpawnError::Retryable(err)
            } else {
                SpawnError::Fatal(err)
            })
        }
    }
}

/// Why [`wait_ready`] gave up.
enum NotReady {
    /// The child exited.
    Exited(std::process::ExitStatus),
    /// A different process (this pid) answered on the port.
    OtherServer(u32),
    /// No answer within [`READY_TIMEOUT`].
    Timeout,
    /// `try_wait` itself failed.
    Wait(io::Error),
}

impl std::fmt::Display for NotReady {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NotReady::Exited(status) => write!(f, "process exited ({status})"),
            NotReady::OtherServer(pid) => {
                write!(f, "port is served by another redis-server (pid {pid})")
            }
            NotReady::Timeout => write!(f, "no PONG within {READY_TIMEOUT:?}"),
            NotReady::Wait(e) => write!(f, "waiting for the process failed: {e}"),
        }
    }
}

/// Polls every [`POLL_INTERVAL`] until the server on `port` answers `PING`
/// and reports `child`'s pid, the child exits, or [`READY_TIMEOUT`] passes.
fn wait_ready(child: &mut Child, port: u16) -> Result<(), NotReady> {
    let deadline = Instant::now() + READY_TIMEOUT;
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return Err(NotReady::Exited(status)),
            Ok(None) => {}
            Err(e) => return Err(NotReady::Wait(e)),
        }
        if let Ok(pid) = probe(port) {
            if pid == child.id() {
                return Ok(());
            }
            // Our child may still be starting up and about to fail binding;
            // either way this port is not ours.
            return Err(NotReady::OtherServer(pid));
        }
        if Instant::now() >= deadline {
            return Err(NotReady::Timeout);
        }
        thread::sleep(POLL_INTERVAL);
    }
}

/// One readiness probe over raw RESP: `PING` must answer `+PONG`, then
/// `INFO server` yields the `process_id` of whoever serves the port.
fn probe(port: u16) -> io::Result<u32> {
    let addr = SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::LOCALHOST, port));
    let mut stream = TcpStream::connect_timeout(&addr, PROBE_TIMEOUT)?;
    stream.set_read_timeout(Some(PROBE_TIMEOUT))?;
    stream.set_write_timeout(Some(PROBE_TIMEOUT))?;
    stream.set_nodelay(true)?;

    stream.write_all(b"*1\r\n$4\r\nPING\r\n")?;
    let pong = read_until(&mut stream, |buf| buf.ends_with(b"\r\n"))?;
    if pong != b"+PONG\r\n" {
        return Err(io::Error::other(format!(
            "unexpected PING reply {:?}",
            String::from_utf8_lossy(&pong)
        )));
    }

    stream.write_all(b"*2\r\n$4\r\nINFO\r\n$6\r\nserver\r\n")?;
    let info = read_until(&mut stream, bulk_complete)?;
    let text = String::from_utf8_lossy(&info);
    text.lines()
        .find_map(|line| line.strip_prefix("process_id:"))
        .and_then(|pid| pid.trim().parse().ok())
        .ok_or_else(|| io::Error::other("no process_id in INFO server reply"))
}

/// Reads from `stream` until `done(buffer)` holds (bounded to 64 KiB).
fn read_until(stream: &mut TcpStream, done: impl Fn(&[u8]) -> bool) -> io::Result<Vec<u8>> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    while !done(&buf) {
        if buf.len() > 64 * 1024 {
            return Err(io::Error::other("reply too long"));
        }
        let n = stream.read(&mut chunk)?;
        if n == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    Ok(buf)
}

/// Whether `buf` holds a complete RESP reply of the bulk-string form
/// `$<len>\r\n<len bytes>\r\n` (an error reply `-...\r\n` also counts as
/// complete so the caller fails fast).
fn bulk_complete(buf: &[u8]) -> bool {
    let Some(header_end) = buf.windows(2).position(|w| w == b"\r\n") else {
        return false;
    };
    let header = &buf[..header_end];
    match header.first() {
        Some(b'$') => std::str::from_utf8(&header[1..])
            .ok()
            .and_then(|len| len.parse::<usize>().ok())
            .is_some_and(|len| buf.len() >= header_end + 2 + len + 2),
        _ => true,
    }
}

/// The last [`LOG_TAIL_LINES`] lines of the log file (or why it could not be
/// read).
fn log_tail(path: &Path) -> String {
    match fs::read(path) {
        Ok(bytes) => {
            let text = String::from_utf8_lossy(&bytes);
            let lines: Vec<&str> = text.lines().collect();
            let start = lines.len().saturating_sub(LOG_TAIL_LINES);
            if lines.is_empty() {
                "(log is empty)".to_owned()
            } else {
                lines[start..].join("\n")
            }
        }
        Err(e) => format!("(could not read log: {e})"),
    }
}

/// The error returned when every retry hit a (presumed) port race.
fn attempts_exhausted(what: &str, attempts: u32, last: Option<io::Error>) -> io::Error {
    let last = last.map_or_else(|| "no attempt was made".to_owned(), |e| e.to_string());
    io::Error::new(
        io::ErrorKind::AddrInUse,
        format!("could not {what} redis-server after {attempts} attempts; last error: {last}"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn free_port_never_repeats() {
        let ports: Vec<u16> = (0..50).map(|_| free_port().expect("free_port")).collect();
        let unique: BTreeSet<u16> = ports.iter().copied().collect();
        assert_eq!(unique.len(), ports.len(), "{ports:?}");
        assert!(ports
            .iter()
            .all(|p| HANDED_OUT.lock().expect("lock").contains(p)));
    }

    #[test]
    fn bulk_complete_detects_full_replies() {
        assert!(!bulk_complete(b""));
        assert!(!bulk_complete(b"$5\r\nhel"));
        assert!(!bulk_complete(b"$5\r\nhello"));
        assert!(bulk_complete(b"$5\r\nhello\r\n"));
        assert!(bulk_complete(b"-ERR nope\r\n"));
    }

    #[test]
    fn bad_redis_server_env_gives_install_hint() {
        let err = find_redis_server_from(Some("/nonexistent/redis-server".into()))
            .expect_err("a missing binary must not be accepted");
        assert_eq!(err.kind(), io::ErrorKind::NotFound);
        let msg = err.to_string();
        assert!(msg.starts_with(NOT_FOUND_MSG), "{msg}");
        assert!(
            msg.contains("REDIS_SERVER=/nonexistent/redis-server"),
            "{msg}"
        );
    }

    #[test]
    fn empty_redis_server_env_falls_back_to_path() {
        assert_eq!(
            find_redis_server_from(Some(OsString::new())).ok(),
            resolve_binary(Path::new("redis-server"))
        );
    }

    #[test]
    fn resolve_binary_rejects_missing_paths() {
        assert!(resolve_binary(Path::new("/nonexistent/redis-server")).is_none());
        assert!(resolve_binary(Path::new("definitely-not-a-binary-xyz")).is_none());
    }
}
