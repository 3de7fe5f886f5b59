//! [`FaultProxy`]: a TCP proxy between clients and one Redis server that a test drives to
//! break the network in the ways a real network breaks: latency, replies held back or
//! lost, a blackhole, and connections reset.

use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::runtime::Runtime;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

/// A loopback TCP proxy in front of a Redis server, with faults a test switches on and
/// off while clients are connected through it.
///
/// It runs on its own single-threaded runtime, so it keeps forwarding whatever the test's
/// runtime does, and it stops (closing every connection) when dropped. Faults apply to
/// connections already open and to new ones:
///
/// * [`set_latency`](Self::set_latency): every byte, either way, is forwarded that long
///   after it arrived;
/// * [`stall_replies`](Self::stall_replies): commands reach Redis (and run), replies are
///   held back until [`heal`](Self::heal), then delivered, as TCP would after a one-way
///   partition;
/// * [`drop_replies`](Self::drop_replies): commands reach Redis, replies are lost; since a
///   TCP stream cannot lose bytes and go on, every connection that lost a reply is reset
///   when the fault ends;
/// * [`blackhole`](Self::blackhole): nothing passes either way until healed;
/// * [`reset`](Self::reset): every open connection is closed with a TCP reset now.
///
/// A new connection while the server is down is reset at once.
///
/// ```no_run
/// use lockwarden_testkit::{FaultProxy, RedisServer};
///
/// let server = RedisServer::start()?;
/// let proxy = FaultProxy::start(server.port())?;
/// let client = redis::Client::open(proxy.url()).map_err(std::io::Error::other)?;
/// # let _ = client;
/// proxy.drop_replies(); // commands run, their replies vanish...
/// proxy.heal(); // ...and the connections that lost one are reset
/// # Ok::<(), std::io::Error>(())
/// ```
pub struct FaultProxy {
    port: u16,
    shared: Arc<Shared>,
    runtime: Option<Runtime>,
}

/// What the proxy's tasks read.
struct Shared {
    faults: watch::Sender<Faults>,
    open: AtomicUsize,
    accepted: AtomicUsize,
    /// Reads from Redis thrown away by [`FaultProxy::drop_replies`].
    lost: AtomicUsize,
}

/// The faults in force. A change is seen at once by every connection.
#[derive(Debug, Clone, Copy, Default)]
struct Faults {
    latency: Duration,
    requests: Flow,
    replies: Flow,
    /// Bumped by [`FaultProxy::reset`]: each connection resets when it changes.
    resets: u64,
}

/// What happens to bytes going one way.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
enum Flow {
    #[default]
    Pass,
    /// Held until the flow passes again.
    Stall,
    /// Discarded (and the connection reset once the flow passes again).
    Drop,
}

/// Which way bytes go.
#[derive(Debug, Clone, Copy)]
enum Way {
    Requests,
    Replies,
}

impl Faults {
    fn flow(&self, way: Way) -> Flow {
        match way {
            Way::Requests => self.requests,
            Way::Replies => self.replies,
        }
    }
}

impl FaultProxy {
    /// Starts a proxy on a free loopback port that forwards to the Redis server on
    /// `127.0.0.1:upstream_port` (connecting to it once per client connection).
    pub fn start(upstream_port: u16) -> io::Result<FaultProxy> {
        let listener = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?;
        Self::start_on(listener, upstream_port)
    }

    /// Like [`start`](Self::start), serving on `listener`, bound beforehand: a cluster
    /// node must be told the proxy's port before the node's own port is known.
    pub(crate) fn start_on(
        listener: std::net::TcpListener,
        upstream_port: u16,
    ) -> io::Result<FaultProxy> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("fault-proxy")
            .enable_all()
            .build()?;
        listener.set_nonblocking(true)?;
        let port = listener.local_addr()?.port();
        let listener = {
            let _entered = runtime.enter();
            TcpListener::from_std(listener)?
        };
        let shared = Arc::new(Shared {
            faults: watch::Sender::new(Faults::default()),
            open: AtomicUsize::new(0),
            accepted: AtomicUsize::new(0),
            lost: AtomicUsize::new(0),
        });
        let upstream = SocketAddr::from((Ipv4Addr::LOCALHOST, upstream_port));
        runtime.spawn(serve(listener, upstream, Arc::clone(&shared)));
        Ok(FaultProxy {
            port,
            shared,
            runtime: Some(runtime),
        })
    }

    /// The port clients connect to.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis://127.0.0.1:<port>/`, the URL clients connect to.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// Forwards every byte, either way, `latency` after it arrived (zero: at once).
    pub fn set_latency(&self, latency: Duration) {
        self.change(|faults| faults.latency = latency);
    }

    /// Holds replies back (commands still reach Redis) until [`heal`](Self::heal).
    pub fn stall_replies(&self) {
        self.change(|faults| faults.replies = Flow::Stall);
    }

    /// Loses replies (commands still reach Redis); when healed, every connection that
    /// lost one is reset.
    pub fn drop_replies(&self) {
        self.change(|faults| faults.replies = Flow::Drop);
    }

    /// Lets nothing through either way until [`heal`](Self::heal); what was held is then
    /// delivered.
    pub fn blackhole(&self) {
        self.change(|faults| {
            faults.requests = Flow::Stall;
            faults.replies = Flow::Stall;
        });
    }

    /// Closes every open connection with a TCP reset, both towards the client and towards
    /// Redis. Later connections are not affected.
    pub fn reset(&self) {
        self.change(|faults| faults.resets += 1);
    }

    /// Ends every fault: no latency, everything passes, held bytes are delivered, and
    /// connections that lost a reply are reset.
    pub fn heal(&self) {
        self.change(|faults| {
            faults.latency = Duration::ZERO;
            faults.requests = Flow::Pass;
            faults.replies = Flow::Pass;
        });
    }

    /// Connections open through the proxy now.
    pub fn open_connections(&self) -> usize {
        self.shared.open.load(Ordering::SeqCst)
    }

    /// Connections accepted since the proxy started.
    pub fn accepted_connections(&self) -> usize {
        self.shared.accepted.load(Ordering::SeqCst)
    }

    /// Step `step` of a chaos run's fault cycle, blocking (run it on a thread of its
    /// own): latency of twice `command_timeout`, lost replies, a blackhole longer than
    /// `lease`, a reset, then light latency; each held for a while, then healed and left
    /// healthy for 800 ms.
    pub fn chaos_step(&self, step: u32, command_timeout: Duration, lease: Duration) {
        let pause = std::thread::sleep;
        match step % 5 {
            0 => {
                self.set_latency(2 * command_timeout);
                pause(Duration::from_millis(600));
            }
            1 => {
                self.drop_replies();
                pause(Duration::from_millis(500));
            }
            2 => {
                // Longer than the lease: clients that reach Redis directly take over.
                self.blackhole();
                pause(lease + Duration::from_millis(700));
            }
            3 => {
                self.reset();
                pause(Duration::from_millis(100));
            }
            _ => {
                self.set_latency(Duration::from_millis(20));
                pause(Duration::from_millis(400));
            }
        }
        self.heal();
        pause(Duration::from_millis(800));
    }

    /// How often replies were lost to [`drop_replies`](Self::drop_replies) since the
    /// proxy started (once per read from Redis, which may hold several replies). A test
    /// that heals only once this went up knows its reply was lost, not still on its way.
    pub fn lost_replies(&self) -> usize {
        self.shared.lost.load(Ordering::SeqCst)
    }

    fn change(&self, edit: impl FnOnce(&mut Faults)) {
        self.shared.faults.send_modify(edit);
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        // Not `Runtime::drop`: that blocks, which a test's async context forbids.
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

impl std::fmt::Debug for FaultProxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FaultProxy")
            .field("port", &self.port)
            .field("faults", &*self.shared.faults.borrow())
            .finish()
    }
}

async fn serve(listener: TcpListener, upstream: SocketAddr, shared: Arc<Shared>) {
    loop {
        let Ok((client, _)) = listener.accept().await else {
            continue;
        };
        shared.accepted.fetch_add(1, Ordering::SeqCst);
        tokio::spawn(connection(client, upstream, Arc::clone(&shared)));
    }
}

/// Counts a connection as open while it lives.
struct OpenGuard(Arc<Shared>);

impl Drop for OpenGuard {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Pipes one client connection to its own connection to Redis until either side closes
/// or a reset is due; a reset closes both with `SO_LINGER` 0, so both peers see a reset.
async fn connection(client: TcpStream, upstream: SocketAddr, shared: Arc<Shared>) {
    shared.open.fetch_add(1, Ordering::SeqCst);
    let _open = OpenGuard(Arc::clone(&shared));
    let Ok(server) = TcpStream::connect(upstream).await else {
        let _ = client.set_zero_linger();
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let mut faults = shared.faults.subscribe();
    let resets = faults.borrow_and_update().resets;
    let lost = AtomicBool::new(false);
    let (mut client_read, mut client_write) = client.into_split();
    let (mut server_read, mut server_write) = server.into_split();
    let reset = {
        let requests = forward(
            &mut client_read,
            &mut server_write,
            Way::Requests,
            faults.clone(),
            (&lost, &shared.lost),
        );
        let replies = forward(
            &mut server_read,
            &mut client_write,
            Way::Replies,
            faults.clone(),
            (&lost, &shared.lost),
        );
        let reset_due = async {
            loop {
                {
                    let now = faults.borrow_and_update();
                    let lost_and_healed = lost.load(Ordering::SeqCst) && now.replies != Flow::Drop;
                    if now.resets != resets || lost_and_healed {
                        return;
                    }
                }
                if faults.changed().await.is_err() {
                    // The proxy is stopping.
                    return std::future::pending().await;
                }
            }
        };
        tokio::select! {
            _ = async { tokio::join!(requests, replies) } => false,
            () = reset_due => true,
        }
    };
    if reset {
        // Whole again, so dropping sends no FIN first (a dropped write half shuts down).
        for (read, write) in [(client_read, client_write), (server_read, server_write)] {
            if let Ok(stream) = read.reunite(write) {
                let _ = stream.set_zero_linger();
            }
        }
    }
}

/// Copies bytes from `from` to `to` one way, applying the faults in force when each chunk
/// is due; passes the end of the stream on. A dropped chunk marks the connection `lost`
/// and counts in `all_lost`.
async fn forward(
    from: &mut OwnedReadHalf,
    to: &mut OwnedWriteHalf,
    way: Way,
    faults: watch::Receiver<Faults>,
    (lost, all_lost): (&AtomicBool, &AtomicUsize),
) {
    // Reading goes on while a chunk waits, so latency delays each chunk from its own
    // arrival rather than adding up.
    let (chunks, mut due) = mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
    let read = async move {
        let mut buf = vec![0; 16 * 1024];
        while let Ok(n @ 1..) = from.read(&mut buf).await {
            if chunks.send((Instant::now(), buf[..n].to_vec())).is_err() {
                break;
            }
        }
    };
    let write = async {
        while let Some((arrived, bytes)) = due.recv().await {
            let mut faults = faults.clone();
            loop {
                let now = *faults.borrow_and_update();
                match now.flow(way) {
                    Flow::Stall => {
                        if faults.changed().await.is_err() {
                            return;
                        }
                    }
                    Flow::Drop => {
                        lost.store(true, Ordering::SeqCst);
                        all_lost.fetch_add(1, Ordering::SeqCst);
                        break;
                    }
                    Flow::Pass if Instant::now() < arrived + now.latency => {
                        // Sleep, but see a change (a heal) at once.
                        tokio::select! {
                            () = tokio::time::sleep_until(arrived + now.latency) => {}
                            changed = faults.changed() => if changed.is_err() { return },
                        }
                    }
                    Flow::Pass => {
                        if to.write_all(&bytes).await.is_err() {
                            return;
                        }
                        break;
                    }
                }
            }
        }
        let _ = to.shutdown().await;
    };
    tokio::join!(read, write);
}

#[cfg(test)]
mod tests {
    use std::io::{ErrorKind, Read, Write};
    use std::net::TcpStream;
    use std::time::Instant;

    use super::*;
    use crate::RedisServer;

    fn server_and_proxy() -> (RedisServer, FaultProxy) {
        let server = RedisServer::start().expect("start redis-server");
        let proxy = FaultProxy::start(server.port()).expect("start proxy");
        (server, proxy)
    }

    /// A raw connection through the proxy, reads bounded by `timeout`.
    fn connect(proxy: &FaultProxy, timeout: Duration) -> TcpStream {
        let stream = TcpStream::connect((Ipv4Addr::LOCALHOST, proxy.port())).expect("connect");
        stream.set_read_timeout(Some(timeout)).expect("timeout");
        stream
    }

    /// Sends `SET key value` in RESP.
    fn send_set(stream: &mut TcpStream, key: &str, value: &str) {
        try_send_set(stream, key, value).expect("write");
    }

    /// Sends `SET key value` in RESP, or says why it could not.
    fn try_send_set(stream: &mut TcpStream, key: &str, value: &str) -> std::io::Result<()> {
        let command = format!(
            "*3\r\n$3\r\nSET\r\n${}\r\n{key}\r\n${}\r\n{value}\r\n",
            key.len(),
            value.len()
        );
        stream.write_all(command.as_bytes())
    }

    /// The next reply's first bytes, or the read error.
    fn read_reply(stream: &mut TcpStream) -> std::io::Result<String> {
        let mut buf = [0; 64];
        match stream.read(&mut buf)? {
            0 => Err(ErrorKind::UnexpectedEof.into()),
            n => Ok(String::from_utf8_lossy(&buf[..n]).into_owned()),
        }
    }

    fn value(server: &RedisServer, key: &str) -> Option<String> {
        server.query(&["GET", key]).expect("GET")
    }

    fn is_timeout(error: &std::io::Error) -> bool {
        matches!(error.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut)
    }

    /// With `fault` on, a `SET` through the proxy runs in Redis but gets no reply; then
    /// the proxy is healed. Returns the connection, reads bounded by 5 s.
    fn ran_without_reply(
        server: &RedisServer,
        proxy: &FaultProxy,
        fault: fn(&FaultProxy),
    ) -> TcpStream {
        let mut stream = connect(proxy, Duration::from_millis(300));
        fault(proxy);
        send_set(&mut stream, "k", "v");
        let error = read_reply(&mut stream).expect_err("no reply");
        assert!(is_timeout(&error), "{error}");
        assert_eq!(value(server, "k").as_deref(), Some("v"), "the command ran");
        proxy.heal();
        stream
            .set_read_timeout(Some(Duration::from_secs(5)))
            .expect("timeout");
        stream
    }

    /// After a reset, a new connection through the proxy gets its replies.
    fn a_new_connection_works(proxy: &FaultProxy) {
        let mut stream = connect(proxy, Duration::from_secs(5));
        send_set(&mut stream, "k", "w");
        assert_eq!(read_reply(&mut stream).expect("reply"), "+OK\r\n");
    }

    #[test]
    fn forwards_commands_and_replies_and_counts_connections() {
        let (server, proxy) = server_and_proxy();
        let mut stream = connect(&proxy, Duration::from_secs(5));
        send_set(&mut stream, "k", "v");
        assert_eq!(read_reply(&mut stream).expect("reply"), "+OK\r\n");
        assert_eq!(value(&server, "k").as_deref(), Some("v"));
        assert_eq!(proxy.accepted_connections(), 1);
        assert_eq!(proxy.open_connections(), 1);
        drop(stream);
        let closed = Instant::now();
        while proxy.open_connections() != 0 {
            assert!(
                closed.elapsed() < Duration::from_secs(5),
                "connection still open"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    #[test]
    fn latency_delays_each_way() {
        let (_server, proxy) = server_and_proxy();
        let mut stream = connect(&proxy, Duration::from_secs(5));
        proxy.set_latency(Duration::from_millis(150));
        let sent = Instant::now();
        send_set(&mut stream, "k", "v");
        assert_eq!(read_reply(&mut stream).expect("reply"), "+OK\r\n");
        // At least one delay each way; the upper bound only says it was not stuck.
        let took = sent.elapsed();
        assert!(
            took >= Duration::from_millis(300),
            "round trip took {took:?}"
        );
        assert!(took < Duration::from_secs(4), "round trip took {took:?}");
    }

    #[test]
    fn stalled_replies_arrive_after_the_heal_and_the_command_ran_before() {
        let (server, proxy) = server_and_proxy();
        let mut stream = ran_without_reply(&server, &proxy, FaultProxy::stall_replies);
        assert_eq!(read_reply(&mut stream).expect("reply"), "+OK\r\n");
        assert_eq!(proxy.lost_replies(), 0, "held back, not lost");
    }

    #[test]
    fn dropped_replies_are_lost_and_the_connection_is_reset_when_healed() {
        let (server, proxy) = server_and_proxy();
        assert_eq!(proxy.lost_replies(), 0);
        let mut stream = ran_without_reply(&server, &proxy, FaultProxy::drop_replies);
        assert_eq!(proxy.lost_replies(), 1);
        let error = read_reply(&mut stream).expect_err("the connection is reset");
        assert_eq!(error.kind(), ErrorKind::ConnectionReset, "{error}");
        a_new_connection_works(&proxy);
    }

    #[test]
    fn a_blackhole_holds_commands_until_healed() {
        let (server, proxy) = server_and_proxy();
        let mut stream = connect(&proxy, Duration::from_millis(300));
        proxy.blackhole();
        send_set(&mut stream, "k", "v");
        let error = read_reply(&mut stream).expect_err("no reply in a blackhole");
        assert!(is_timeout(&error), "{error}");
        assert_eq!(value(&server, "k"), None, "the command did not arrive");
        proxy.heal();
        stream
            .set_read_timeout(Some(Duration::from_secs(5)))
            .expect("timeout");
        assert_eq!(read_reply(&mut stream).expect("reply"), "+OK\r\n");
        assert_eq!(value(&server, "k").as_deref(), Some("v"));
    }

    #[test]
    fn reset_closes_open_connections_only() {
        let (_server, proxy) = server_and_proxy();
        let mut stream = connect(&proxy, Duration::from_secs(5));
        send_set(&mut stream, "k", "v");
        assert_eq!(read_reply(&mut stream).expect("reply"), "+OK\r\n");
        proxy.reset();
        let error = read_reply(&mut stream).expect_err("the connection is reset");
        assert_eq!(error.kind(), ErrorKind::ConnectionReset, "{error}");
        a_new_connection_works(&proxy);
    }

    #[test]
    fn a_connection_while_the_server_is_down_is_reset() {
        let (mut server, proxy) = server_and_proxy();
        server.kill();
        let mut stream = connect(&proxy, Duration::from_secs(5));
        // The reset may come before the command is written: then the write meets it.
        let error = match try_send_set(&mut stream, "k", "v") {
            Ok(()) => read_reply(&mut stream).expect_err("nothing behind the proxy"),
            Err(error) => error,
        };
        assert!(
            matches!(
                error.kind(),
                ErrorKind::ConnectionReset | ErrorKind::UnexpectedEof | ErrorKind::BrokenPipe
            ),
            "{error}"
        );
    }
}
