//! Shared set-up for the engine's integration tests (and, through `#[path]`, the root
//! package's): a lock store that is either in-process or a real throw-away
//! `redis-server` ([`Env`]), the [`conformance!`] macro that runs a test body on both,
//! the lock kinds behind one interface ([`kinds`]), the key layout oracle ([`keys`]), and
//! small helpers for guards and tasks. Server probes and polling are the testkit's.
#![allow(dead_code)]

pub mod keys;
pub mod kinds;

use std::future::Future;
use std::sync::OnceLock;
use std::time::Duration;

use lockwarden_core::{
    BackendError, LockClient, LockClientBuilder, LockError, LockGuard, MultiGuard, RedlockGuard,
};
use lockwarden_testkit::RedisServer;

/// Where the locks live for one test.
pub struct Env {
    pub server: Option<RedisServer>,
    /// The in-process store is per client; every `client()` of a memory env shares it.
    memory: OnceLock<LockClient>,
}

impl Env {
    pub fn memory() -> Self {
        Self {
            server: None,
            memory: OnceLock::new(),
        }
    }

    pub fn redis() -> Self {
        Self {
            server: Some(RedisServer::start().expect("start redis-server")),
            memory: OnceLock::new(),
        }
    }

    pub fn is_redis(&self) -> bool {
        self.server.is_some()
    }

    pub fn server(&self) -> &RedisServer {
        self.server.as_ref().expect("a redis env")
    }

    /// A client with default settings: a new connection on Redis, the shared store in-process.
    pub async fn client(&self) -> LockClient {
        self.client_with(|b| b).await
    }

    /// A client with settings; in-process, the first call's settings apply to all.
    pub async fn client_with(
        &self,
        configure: impl FnOnce(LockClientBuilder) -> LockClientBuilder,
    ) -> LockClient {
        match &self.server {
            Some(server) => connect_with(&server.url(), configure).await,
            None => self
                .memory
                .get_or_init(|| configure(LockClient::builder()).in_memory())
                .clone(),
        }
    }
}

/// A client of the Redis server at `url`, with settings (see [`connected`]).
///
/// # Panics
/// If it cannot connect.
pub async fn connect_with(
    url: &str,
    configure: impl FnOnce(LockClientBuilder) -> LockClientBuilder,
) -> LockClient {
    let builder = configure(LockClient::builder());
    connected(url, || builder.clone().connect(url)).await
}

/// The client `connect` makes, for `what`.
///
/// Connecting is bounded by the command timeout, step by step; tests that set a short
/// one (100-300 ms, so that a lost reply fails fast) could see a machine loaded by other
/// builds stall a step past it. The connect is not what they test: one that timed out is
/// tried again, twice at most.
///
/// # Panics
/// On any other error, or a third timeout, naming every timeout.
pub async fn connected<F, Fut>(what: &str, connect: F) -> LockClient
where
    F: Fn() -> Fut,
    Fut: Future<Output = Result<LockClient, LockError>>,
{
    let mut timeouts = Vec::new();
    loop {
        match connect().await {
            Ok(client) => return client,
            // Connecting names the address of a server it did not reach in time.
            Err(LockError::Backend(BackendError::Connect { source, .. }))
                if matches!(*source, BackendError::TimedOut(_)) && timeouts.len() < 2 =>
            {
                timeouts.push(*source);
            }
            Err(LockError::Backend(e @ BackendError::TimedOut(_))) if timeouts.len() < 2 => {
                timeouts.push(e);
            }
            Err(e) => panic!("connect to {what}: {e} (timed out before: {timeouts:?})"),
        }
    }
}

/// How long one test made by [`conformance!`] may run in all: a wait that a broken
/// promise never ends (a lock that never expires, a notice that never comes) then fails
/// the test, named, instead of hanging the suite. Each test's own waits are bounded
/// tighter; this is the net under them.
pub const TEST_BOUND: Duration = Duration::from_secs(90);

/// Runs the test body `fut` for at most [`TEST_BOUND`].
///
/// # Panics
/// Naming `test`, once the bound is over.
pub async fn bounded<T>(test: &str, fut: impl Future<Output = T>) -> T {
    tokio::time::timeout(TEST_BOUND, fut)
        .await
        .unwrap_or_else(|_| panic!("{test} still ran after {TEST_BOUND:?}: a wait never ended"))
}

/// Awaits a spawned task for at most `within` and returns its output.
///
/// # Panics
/// With `what` if it takes longer; if the task panicked.
pub async fn finishes<T>(within: Duration, what: &str, task: tokio::task::JoinHandle<T>) -> T {
    tokio::time::timeout(within, task)
        .await
        .unwrap_or_else(|_| panic!("not within {within:?}: {what}"))
        .expect("the task panicked")
}

/// Waits (bounded) until `client` hears release notices on `server` (a node, for a lock
/// `name` it owns): a task of it waits for `name`, held by another of its holders, until
/// the server counts it subscribed, and is served on the release. A test that breaks
/// connections on purpose calls this first: a pub/sub connection still opening in the
/// background would have its handshake broken instead of the call the test watches.
pub async fn listening(client: &LockClient, server: &RedisServer, name: &str) {
    let held = client
        .acquire(name)
        .await
        .expect("hold the lock waited for");
    let channel = held.key().channel().to_owned();
    let waiter = {
        let (client, name) = (client.clone(), name.to_owned());
        tokio::spawn(async move { client.try_acquire(&name, Duration::from_secs(10)).await })
    };
    lockwarden_testkit::eventually(
        Duration::from_secs(10),
        "the pub/sub connection is up",
        || async { server.shard_subscribers(&channel) + server.subscribers(&channel) == 1 },
    )
    .await;
    held.release().await.expect("release");
    let served = finishes(Duration::from_secs(5), "the waiter", waiter).await;
    served
        .expect("served on the release")
        .release()
        .await
        .expect("release");
}

/// Spawns `fut`; the task's output comes with the instant it was ready.
pub fn spawn_timed<F>(fut: F) -> tokio::task::JoinHandle<(F::Output, std::time::Instant)>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    tokio::spawn(async move {
        let out = fut.await;
        (out, std::time::Instant::now())
    })
}

/// The body of a child process that holds a lock until it is killed: prints `line` (the
/// parent waits for it), then keeps `guard` (and its watchdog) alive for at most 120 s,
/// in case the parent died without killing it.
pub async fn hold_until_killed<G>(line: String, guard: G) {
    println!("{line}");
    tokio::time::sleep(Duration::from_secs(120)).await;
    drop(guard);
}

/// Drives `fut` (first, each time) until `until` resolves, then stops polling it without
/// dropping it: a waiter that waits in the store but does not run, as a slow process
/// would.
///
/// # Panics
/// If `fut` finishes first.
pub async fn drive_until<F: Future + Unpin>(fut: &mut F, until: impl Future<Output = ()>) {
    tokio::select! {
        biased;
        _ = fut => panic!("the waiter finished while it should be waiting"),
        _ = until => {}
    }
}

/// A guard of any kind (plain, fair, read-write, multi, Redlock) that can be given back.
pub trait GiveBack {
    /// Releases the lock(s), as the guard's own `release`.
    fn give_back(self) -> impl Future<Output = Result<(), LockError>>;
}

impl GiveBack for LockGuard {
    fn give_back(self) -> impl Future<Output = Result<(), LockError>> {
        self.release()
    }
}

impl GiveBack for MultiGuard {
    fn give_back(self) -> impl Future<Output = Result<(), LockError>> {
        self.release()
    }
}

impl GiveBack for RedlockGuard {
    fn give_back(self) -> impl Future<Output = Result<(), LockError>> {
        self.release()
    }
}

impl GiveBack for kinds::Held {
    fn give_back(self) -> impl Future<Output = Result<(), LockError>> {
        self.release()
    }
}

/// Asserts that `attempt` gets the lock (so it was free: `what` says why it must be),
/// then releases it.
pub async fn take_and_release<G: GiveBack>(
    what: &str,
    attempt: impl Future<Output = Result<G, LockError>>,
) {
    let guard = attempt
        .await
        .unwrap_or_else(|e| panic!("{what}: expected the lock, got {e}"));
    guard
        .give_back()
        .await
        .unwrap_or_else(|e| panic!("{what}: release failed: {e}"));
}

/// Runs async test bodies against both stores.
///
/// `conformance!(name, ...)` makes `memory::name` and `redis::name`, each calling
/// `name(env)` with its store's [`Env`], for at most [`TEST_BOUND`].
///
/// `conformance!(kinds: name, ...)` runs each body for every [`Kind`] of lock on both
/// stores: it makes `<store>::<kind>::name` (stores `memory`, `redis`; kinds `plain`,
/// `fair`, `read`, `write`, `multi`), each calling `name(env, kind)` with a
/// [`kinds::Kind`].
#[macro_export]
macro_rules! conformance {
    (kinds: $($name:ident),* $(,)?) => {
        mod memory {
            $crate::conformance!(@kinds memory; $($name),*);
        }
        mod redis {
            $crate::conformance!(@kinds redis; $($name),*);
        }
    };
    (@kinds $store:ident; $($name:ident),*) => {
        $crate::conformance!(@kind $store, plain, Plain; $($name),*);
        $crate::conformance!(@kind $store, fair, Fair; $($name),*);
        $crate::conformance!(@kind $store, read, Read; $($name),*);
        $crate::conformance!(@kind $store, write, Write; $($name),*);
        $crate::conformance!(@kind $store, multi, Multi; $($name),*);
    };
    (@kind $store:ident, $kind:ident, $variant:ident; $($name:ident),*) => {
        mod $kind {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    let test = super::super::$name(
                        $crate::common::Env::$store(),
                        $crate::common::kinds::Kind::$variant,
                    );
                    $crate::common::bounded(stringify!($name), test).await;
                }
            )*
        }
    };
    ($($name:ident),* $(,)?) => {
        mod memory {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    let test = super::$name($crate::common::Env::memory());
                    $crate::common::bounded(stringify!($name), test).await;
                }
            )*
        }
        mod redis {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    let test = super::$name($crate::common::Env::redis());
                    $crate::common::bounded(stringify!($name), test).await;
                }
            )*
        }
    };
}

/// Leaves `servers`' default user what Sentinel and replication need (every command, no
/// key, only the sentinels' hello channel) and adds the ACL user `locks` (password
/// `s3cret`) on each (ACLs are not replicated), so only `locks` can lock.
pub fn only_the_locks_user_may_lock(servers: &[RedisServer]) {
    let user = [
        "ACL",
        "SETUSER",
        "locks",
        "on",
        ">s3cret",
        "~lockwarden:*",
        "&lockwarden:*",
        "+@all",
    ];
    let default = [
        "ACL",
        "SETUSER",
        "default",
        "resetkeys",
        "resetchannels",
        "&__sentinel__:hello",
    ];
    for server in servers {
        server.cmd(&user).expect("add the ACL user");
        server.cmd(&default).expect("restrict the default user");
    }
}
