//! What the inspector's tests share: running the built `lockwarden` binary, and a child
//! process (this test binary re-executed) that holds locks of every kind and waits on
//! them, so the inspector reads locks another process holds.
//!
//! A test binary that uses [`Fixture`] must define the child test:
//!
//! ```ignore
//! #[test]
//! fn child() {
//!     common::child_body();
//! }
//! ```

#![allow(dead_code)] // each test binary uses part of it

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use lockwarden_core::{Claim, KeyLayout, LockClient, LockGuard};
use lockwarden_testkit::{eventually, run_child, RedisServer, TestProcess};

/// The variable that makes the child test run: `<scenario> <url>`.
pub const CHILD_ENV: &str = "LOCKWARDEN_CLI_TEST_CHILD";

/// A plain lock held twice (re-entered) by one holder, one waiter in another client.
pub const PLAIN: &str = "orders:42";
/// A fair lock held, two waiters queued in a known order.
pub const FAIR: &str = "tickets";
/// A read-write lock held by two readers.
pub const READERS: &str = "catalog";
/// A read-write lock held by a writer, two readers (one client) waiting.
pub const WRITER: &str = "report";
/// A completed claim.
pub const CLAIM: &str = "payment:7";
/// Its outcome.
pub const OUTCOME: &[u8] = br#"{"status":200,"id":7}"#;
/// A plain lock with an awkward name.
pub const AWKWARD: &str = "we{ir}d%7B name ünï/✓";
/// A lock in the Redisson layout (empty namespace), one waiter.
pub const REDISSON: &str = "redisson:res";
/// A semaphore of [`SEMAPHORE_CAPACITY`] permits, all held: 2 by one acquisition and 1 by
/// another; one acquisition of 1 permit waits in line (another client).
pub const SEMAPHORE: &str = "exports";
/// Its capacity.
pub const SEMAPHORE_CAPACITY: u32 = 3;
/// The watchdog lease of the semaphore's holders and waiter: long, so that its waiter,
/// which tries again every half of it, gets its permit after an unlock only if the unlock
/// wakes it.
pub const SEMAPHORE_LEASE: Duration = Duration::from_secs(120);
/// A semaphore in the Redisson layout, its 2 permits held at once, one waiter.
pub const REDISSON_SEMAPHORE: &str = "redisson:pool";
/// A semaphore held (with a fixed lease) by the tests of scenario `lapsing`, waited for.
pub const PERMITS: &str = "permits";
/// A plain lock taken and released over and over (scenario `churn`).
pub const HOT: &str = "hot";
/// A read-write lock two readers wait for (scenario `read-after-write`).
pub const LEDGER: &str = "ledger";
/// How long the waiters of scenario `lapsing` keep their places without trying again.
pub const LAPSE: Duration = Duration::from_secs(2);

/// Runs `lockwarden` with `args` (stdin empty, `REDIS_URL` unset), within 60 s.
pub fn lockwarden(args: &[&str]) -> Run {
    let mut child = Command::new(env!("CARGO_BIN_EXE_lockwarden"))
        .args(args)
        .env_remove("REDIS_URL")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start lockwarden");
    let mut stdout = child.stdout.take().unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let out = std::thread::spawn(move || {
        let mut s = String::new();
        stdout.read_to_string(&mut s).unwrap();
        s
    });
    let err = std::thread::spawn(move || {
        let mut s = String::new();
        stderr.read_to_string(&mut s).unwrap();
        s
    });
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("lockwarden {args:?} still ran after 60 s");
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    Run {
        code: status.code(),
        stdout: out.join().unwrap(),
        stderr: err.join().unwrap(),
    }
}

/// What one run of the binary did.
#[derive(Debug)]
pub struct Run {
    /// The exit code (`None`: killed by a signal).
    pub code: Option<i32>,
    /// Its stdout.
    pub stdout: String,
    /// Its stderr.
    pub stderr: String,
}

impl Run {
    /// Asserts exit 0 and returns stdout.
    pub fn ok(&self) -> &str {
        assert_eq!(self.code, Some(0), "{self:#?}");
        &self.stdout
    }

    /// Asserts exit 0 and parses stdout as one JSON value.
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(self.ok()).unwrap_or_else(|e| panic!("not JSON ({e}): {self:#?}"))
    }
}

/// A `redis-server` and a child process holding locks in it.
pub struct Fixture {
    /// The server.
    pub server: RedisServer,
    /// The child; dropping it kills it.
    pub child: TestProcess,
    /// The fair lock's waiters' holder ids, first in the queue first.
    pub fair_queue: Vec<String>,
    /// The readers of [`READERS`].
    pub readers: Vec<String>,
    /// The holder of [`PLAIN`].
    pub plain_holder: String,
    /// The holds of [`SEMAPHORE`], in acquisition order: holder id, permits, token.
    pub permit_holders: Vec<(String, u64, u64)>,
    /// The client id of the semaphore's waiter (its holder ids are `<client id>:<n>`).
    pub permit_waiter_client: String,
}

impl Fixture {
    /// Starts a server and the `every-kind` child, and waits until every waiter waits.
    pub fn start(test: &str) -> Fixture {
        Self::start_with(test, &[])
    }

    /// As [`Fixture::start`], with extra `redis-server` arguments.
    pub fn start_with(test: &str, server_args: &[&str]) -> Fixture {
        let server = RedisServer::start_with(server_args).expect("start redis-server");
        let env = format!("every-kind {}", server.url());
        let mut child = TestProcess::spawn(test, &[(CHILD_ENV, &env)]).expect("spawn the child");
        let within = Duration::from_secs(60);
        // In the order the child prints them (lines without the marker are skipped).
        let plain_holder = child.wait_for_line("PLAIN ", within);
        let fair_queue = child
            .wait_for_line("FAIR_QUEUE ", within)
            .split(' ')
            .map(str::to_owned)
            .collect();
        let readers = child
            .wait_for_line("READERS ", within)
            .split(' ')
            .map(str::to_owned)
            .collect();
        let permit_holders = child
            .wait_for_line("PERMITS ", within)
            .split(' ')
            .map(|hold| {
                let (id, numbers) = hold.split_once('=').expect("<id>=<permits>:<token>");
                let (permits, token) = numbers.split_once(':').expect("<permits>:<token>");
                (
                    id.to_owned(),
                    permits.parse().expect("permits"),
                    token.parse().expect("token"),
                )
            })
            .collect();
        let permit_waiter_client = child.wait_for_line("PERMIT_WAITER ", within);
        child.wait_for_line("READY", within);
        let fixture = Fixture {
            server,
            child,
            fair_queue,
            readers,
            plain_holder,
            permit_holders,
            permit_waiter_client,
        };
        fixture.wait_for_waiters();
        fixture
    }

    /// The server's URL.
    pub fn url(&self) -> String {
        self.server.url()
    }

    /// Runs `lockwarden --url <this server> args...`.
    pub fn run(&self, args: &[&str]) -> Run {
        let url = self.url();
        let mut all = vec!["--url", url.as_str()];
        all.extend_from_slice(args);
        lockwarden(&all)
    }

    fn wait_for_waiters(&self) {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let s = &self.server;
        rt.block_on(async {
            let within = Duration::from_secs(30);
            eventually(within, "the plain waiter subscribes", || async {
                s.subscribers("lockwarden:{orders:42}:released") == 1
            })
            .await;
            eventually(within, "the readers wait", || async {
                s.subscribers("lockwarden:{report}:readable") == 1
                    && s.query::<i64>(&["ZCARD", "lockwarden:{report}:readers"])
                        .is_ok_and(|n| n == 2)
            })
            .await;
            eventually(within, "the Redisson waiter subscribes", || async {
                s.subscribers("redisson_lock__channel:{redisson:res}") == 1
            })
            .await;
            // A semaphore's line: the members of its sorted set scored from 1e15.
            let in_line = |key: &str| {
                s.query::<i64>(&["ZCOUNT", key, "1e15", "+inf"])
                    .unwrap_or(0)
            };
            eventually(within, "the semaphores' waiters wait in line", || async {
                s.subscribers("lockwarden:{exports}:granted") == 1
                    && in_line("lockwarden:{exports}") == 1
                    && s.subscribers("redisson_lock__granted:{redisson:pool}") == 1
                    && in_line("redisson:pool") == 1
            })
            .await;
        });
    }

    /// Waits for the child to print `GOT <what>`.
    pub fn wait_got(&mut self, what: &str) {
        let got = self.child.wait_for_line("GOT ", Duration::from_secs(30));
        assert_eq!(got, what);
    }

    /// Waits (at most `within`) for the child to print `GOT <what>`, and returns `<what>`.
    pub fn next_got(&mut self, within: Duration) -> String {
        self.child.wait_for_line("GOT ", within)
    }
}

/// The child test's body: does nothing unless [`CHILD_ENV`] is set.
pub fn child_body() {
    run_child(CHILD_ENV, |value| async move {
        let (scenario, url) = value.split_once(' ').expect("<scenario> <url>");
        match scenario {
            "every-kind" => every_kind(url).await,
            "churn" => churn(url).await,
            "read-after-write" => read_after_write(url).await,
            "lapsing" => lapsing(url).await,
            other => panic!("unknown scenario {other}"),
        }
    });
}

async fn client(url: &str) -> LockClient {
    LockClient::connect(url).await.expect("connect")
}

async fn redisson(url: &str) -> LockClient {
    LockClient::builder()
        .layout(KeyLayout::Redisson)
        .connect(url)
        .await
        .expect("connect")
}

/// A client whose watchdog lease is [`SEMAPHORE_LEASE`].
async fn long_lease(url: &str) -> LockClient {
    LockClient::builder()
        .watchdog_timeout(SEMAPHORE_LEASE)
        .connect(url)
        .await
        .expect("connect")
}

/// Holds one lock of every kind and waits on most of them from other clients (each
/// waiter's client has its own pub/sub connection, so each is one subscriber). Prints
/// `GOT <name>` whenever a waiter gets its lock. Lives until killed (at most 120 s).
async fn every_kind(url: &str) {
    let holder = client(url).await;
    let mut held: Vec<LockGuard> = Vec::new();

    // Plain, re-entered.
    let me = holder.holder();
    held.push(holder.lock(PLAIN).holder(&me).acquire().await.unwrap());
    held.push(holder.lock(PLAIN).holder(&me).acquire().await.unwrap());
    println!("PLAIN {}", me.id());
    let waiter = client(url).await;
    tokio::spawn(async move {
        let g = waiter.lock(PLAIN).acquire().await.unwrap();
        println!("GOT {PLAIN}");
        std::mem::forget(g);
    });

    // Fair, two waiters queued in a known order.
    held.push(holder.fair_lock(FAIR).acquire().await.unwrap());
    let mut queue = Vec::new();
    for i in 0..2 {
        let waiter = client(url).await;
        let h = waiter.holder();
        queue.push(h.id().to_owned());
        tokio::spawn(async move {
            let g = waiter.fair_lock(FAIR).holder(&h).acquire().await.unwrap();
            println!("GOT {FAIR} {i}");
            // Hand over to the next in the queue after a moment.
            tokio::time::sleep(Duration::from_millis(200)).await;
            g.release().await.unwrap();
        });
        let probe = holder.fair_lock(FAIR);
        eventually(Duration::from_secs(30), "the fair waiter queues", || {
            let probe = probe.clone();
            async move { probe.queued().await.unwrap() == i + 1 }
        })
        .await;
    }
    println!("FAIR_QUEUE {}", queue.join(" "));

    // Two readers.
    let mut readers = Vec::new();
    for _ in 0..2 {
        let g = holder.rw_lock(READERS).read().acquire().await.unwrap();
        readers.push(g.holder().id().to_owned());
        held.push(g);
    }
    println!("READERS {}", readers.join(" "));

    // A writer; two readers of one client wait.
    held.push(holder.rw_lock(WRITER).write().acquire().await.unwrap());
    let waiting_readers = client(url).await;
    for _ in 0..2 {
        let lock = waiting_readers.rw_lock(WRITER);
        tokio::spawn(async move {
            let g = lock.read().acquire().await.unwrap();
            println!("GOT {WRITER} read");
            std::mem::forget(g);
        });
    }

    // A completed claim.
    match holder.lock(CLAIM).try_claim(Duration::ZERO).await.unwrap() {
        Claim::Acquired(g) => g
            .complete(OUTCOME, Duration::from_secs(3600))
            .await
            .unwrap(),
        Claim::Completed(_) => panic!("a fresh server has no outcome"),
    }

    // An awkward name.
    held.push(holder.lock(AWKWARD).acquire().await.unwrap());

    // A semaphore: 2 permits held by one acquisition, 1 by another, one waiting in line.
    let permits = long_lease(url).await;
    let sem = permits.semaphore(SEMAPHORE, SEMAPHORE_CAPACITY);
    let two = sem.acquire_many(2).await.unwrap();
    // Leases end in the server's milliseconds: taken in the same one, the holds would
    // tie and be listed by name instead of oldest first.
    tokio::time::sleep(Duration::from_millis(5)).await;
    let one = sem.acquire().await.unwrap();
    let mut holds = Vec::new();
    for (permits, g) in [(2, two), (1, one)] {
        holds.push(format!(
            "{}={permits}:{}",
            g.holder().id(),
            g.fencing_token()
        ));
        held.push(g);
    }
    println!("PERMITS {}", holds.join(" "));
    let sem_waiter = long_lease(url).await;
    let waiter_id = sem_waiter.holder().id().to_owned();
    let (waiter_client, _) = waiter_id.rsplit_once(':').expect("<client id>:<n>");
    println!("PERMIT_WAITER {waiter_client}");
    tokio::spawn(async move {
        let sem = sem_waiter.semaphore(SEMAPHORE, SEMAPHORE_CAPACITY);
        let g = sem.acquire().await.unwrap();
        println!("GOT {SEMAPHORE} {}", g.holder().id());
        std::mem::forget(g);
    });

    // The Redisson layout, one waiter for a lock and one for a semaphore.
    let r = redisson(url).await;
    held.push(r.lock(REDISSON).acquire().await.unwrap());
    let r_waiter = redisson(url).await;
    tokio::spawn(async move {
        let g = r_waiter.lock(REDISSON).acquire().await.unwrap();
        println!("GOT {REDISSON}");
        std::mem::forget(g);
    });
    held.push(
        r.semaphore(REDISSON_SEMAPHORE, 2)
            .acquire_many(2)
            .await
            .unwrap(),
    );
    let r_sem_waiter = redisson(url).await;
    tokio::spawn(async move {
        let g = r_sem_waiter
            .semaphore(REDISSON_SEMAPHORE, 2)
            .acquire()
            .await
            .unwrap();
        println!("GOT {REDISSON_SEMAPHORE}");
        std::mem::forget(g);
    });

    println!("READY");
    tokio::time::sleep(Duration::from_secs(120)).await;
    drop(held);
}

/// Two readers of one client wait for [`LEDGER`] (someone else holds it for writing);
/// prints `GOT ledger read` as each gets it, then holds it until killed (at most 120 s).
async fn read_after_write(url: &str) {
    let readers = client(url).await;
    let waiting: Vec<_> = (0..2)
        .map(|_| {
            let lock = readers.rw_lock(LEDGER);
            tokio::spawn(async move {
                let g = lock.read().acquire().await.unwrap();
                println!("GOT {LEDGER} read");
                g
            })
        })
        .collect();
    let mut held = Vec::new();
    for reader in waiting {
        held.push(reader.await.unwrap());
    }
    tokio::time::sleep(Duration::from_secs(120)).await;
    drop(held);
}

/// Waits as a writer on [`LEDGER`], in the queue of [`FAIR`] and in the line of the
/// semaphore [`PERMITS`] (of 1 permit) twice: first with places kept for [`LAPSE`] unless
/// they try again (a writer's and a semaphore waiter's registration lasts its client's
/// watchdog lease), then with places kept for 60 s; prints `WAITING` once all have
/// tried. Lives until killed (at most 120 s).
async fn lapsing(url: &str) {
    let mut waiting = Vec::new();
    for keep in [LAPSE, Duration::from_secs(60)] {
        let c = LockClient::builder()
            .watchdog_timeout(keep)
            .connect(url)
            .await
            .expect("connect");
        let writer = c.rw_lock(LEDGER).write();
        let fair = c.fair_lock(FAIR).queue_timeout(keep);
        let sem = c.semaphore(PERMITS, 1);
        waiting.push(tokio::spawn(async move {
            let budget = Duration::from_secs(120);
            tokio::join!(
                writer.try_acquire(budget),
                fair.try_acquire(budget),
                sem.try_acquire(budget)
            )
        }));
        // The short-lived places first in the queue.
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    println!("WAITING");
    for w in waiting {
        let _ = w.await;
    }
}

/// Takes and releases [`HOT`] over and over (every 20 ms, at most 60 s), each time as a
/// fresh acquisition with a new fencing token; prints `CHURNING` once going.
async fn churn(url: &str) {
    let c = client(url).await;
    let started = Instant::now();
    let mut n = 0u64;
    while started.elapsed() < Duration::from_secs(60) {
        let g = c.acquire(HOT).await.unwrap();
        tokio::time::sleep(Duration::from_millis(5)).await;
        g.release().await.unwrap();
        n += 1;
        if n == 5 {
            println!("CHURNING");
        }
        tokio::time::sleep(Duration::from_millis(15)).await;
    }
}
