//! The implementations under test behind one small interface: lockwarden, rslock (its
//! defaults and its fastest retry), and the hand-rolled `SET NX PX` + polling lock;
//! plus the raw round trips (PING, EVALSHA) that bound what any of them can do.

use std::error::Error;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock};
use std::time::{Duration, Instant};

use lockwarden_core::{LockClient, LockError, LockGuard};
use redis::aio::ConnectionManager;
use redis::Script;
use rslock::LockManager;
use tokio::task::JoinSet;

use crate::stats::Windows;

pub type BoxError = Box<dyn Error + Send + Sync>;

/// Lease of the rslock and SET NX locks; long enough never to expire in a cycle.
const TTL: Duration = Duration::from_secs(10);
/// Polling interval of the hand-rolled lock.
const POLL: Duration = Duration::from_millis(1);
/// Connections of the deadpool-redis pool in the bring-your-own-pool rows.
const POOL_SIZE: usize = 16;

/// rslock's release: delete the key only if it still holds this token.
pub static COMPARE_AND_DELETE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end \
         return 0",
    )
});
/// The cheapest script: the round-trip cost of EVALSHA itself.
pub static TRIVIAL: LazyLock<Script> = LazyLock::new(|| Script::new("return 1"));
// As the client sends them: the take alone (it writes out what it needs of the helpers),
// the release after the count-once helpers.
const ACQUIRE_SOURCE: &str = include_str!("../../../lua/acquire.lua");
const RELEASE_SOURCE: &str = concat!(
    include_str!("../../../lua/once.lua"),
    include_str!("../../../lua/release.lua")
);
// A semaphore's acquire, as the client sends it for the first attempt of one permit: its
// prelude (the take of an idle semaphore switched on), then the script, as a Redis
// function. A release nobody of the client waits for is plain commands (see
// `own_permits_pair`).
static PERMITS_ACQUIRE: LazyLock<Function> = LazyLock::new(|| {
    let source = concat!(
        include_str!("../../../lua/permits_prelude.lua"),
        include_str!("../../../lua/permits_acquire.lua")
    );
    Function::new(&source.replace("\nlocal taking = false\n", "\nlocal taking = true\n"))
});
static ACQUIRE: LazyLock<Script> = LazyLock::new(|| Script::new(ACQUIRE_SOURCE));
/// The plain take as a Redis function, as the client calls it.
static TAKE: LazyLock<Function> = LazyLock::new(|| Function::new(ACQUIRE_SOURCE));

/// A script as the client calls it where the server has functions: `FCALL` of a library
/// of its own, named as the client names it (its prefix, then the digest of its text),
/// loaded first if the server lacks it (the client loads the take at connect, the others
/// on first use).
struct Function {
    name: String,
    library: String,
}

impl Function {
    fn new(source: &str) -> Self {
        let name = format!("lockwarden_{}", Script::new(source).get_hash());
        let library = format!(
            "#!lua name={name}\nredis.register_function('{name}', function(KEYS, ARGV)\n{source}end)\n"
        );
        Self { name, library }
    }

    /// `FCALL` with `keys` and `args`, answered as `T`.
    async fn call<T: redis::FromRedisValue>(
        &self,
        conn: &mut impl redis::aio::ConnectionLike,
        keys: &[&str],
        args: &[&str],
    ) -> Result<T, BoxError> {
        let mut call = redis::cmd("FCALL");
        call.arg(&self.name).arg(keys.len()).arg(keys).arg(args);
        match call.query_async(conn).await {
            Err(e) if e.code() == Some("ERR") && e.to_string().contains("not found") => {
                redis::cmd("FUNCTION")
                    .arg("LOAD")
                    .arg(&self.library)
                    .query_async::<redis::Value>(conn)
                    .await?;
                Ok(call.query_async(conn).await?)
            }
            answer => Ok(answer?),
        }
    }
}
static RELEASE: LazyLock<Script> = LazyLock::new(|| Script::new(RELEASE_SOURCE));
// As a cluster client sends them by default (the core's `Lua::with`): the call's id read
// from the last argument, and notices sharded.
static CLUSTER_ACQUIRE: LazyLock<Script> =
    LazyLock::new(|| Script::new(&for_cluster(ACQUIRE_SOURCE)));
static CLUSTER_RELEASE: LazyLock<Script> =
    LazyLock::new(|| Script::new(&for_cluster(RELEASE_SOURCE)));

fn for_cluster(source: &str) -> String {
    source
        .replace("\nlocal call = ''\n", "\nlocal call = ARGV[#ARGV]\n")
        .replace("redis.call('PUBLISH'", "redis.call('SPUBLISH'")
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Lockwarden,
    /// lockwarden with a fixed lease instead of the watchdog (diagnostic).
    LockwardenLease,
    /// lockwarden whose commands go through a deadpool-redis pool (bring your own pool).
    LockwardenPool,
    /// lockwarden built without fencing tokens (what they cost Redis).
    LockwardenUnfenced,
    RslockDefault,
    RslockFast,
    SetNx,
    /// lockwarden's commands for a plain lock sent raw, with no client: the take as a
    /// Redis function, the release `HDEL <lock> <holder> ~w1 ~w2` (a waiter's mark with
    /// the hold), the notice only if it deleted a mark (never here).
    OwnRaw,
    /// The same take, and the release lockwarden sent before waiters marked the lock:
    /// `HDEL` and the notice, pipelined, every time.
    NoticeRaw,
}

impl Kind {
    /// Every implementation; the contended workloads run them all.
    pub const ALL: [Kind; 4] = [
        Kind::Lockwarden,
        Kind::RslockDefault,
        Kind::RslockFast,
        Kind::SetNx,
    ];
    /// Without contention rslock's retry settings never come into play.
    /// The fixed-lease lockwarden variant shows what the watchdog bookkeeping costs, the
    /// pooled one what a pool checkout costs per operation, the unfenced one what the
    /// fencing tokens cost.
    /// The two raw ones bound what lockwarden's client can reach.
    pub const UNCONTENDED: [Kind; 8] = [
        Kind::Lockwarden,
        Kind::LockwardenLease,
        Kind::LockwardenPool,
        Kind::LockwardenUnfenced,
        Kind::RslockDefault,
        Kind::SetNx,
        Kind::OwnRaw,
        Kind::NoticeRaw,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Kind::Lockwarden => "lockwarden",
            Kind::LockwardenLease => "lockwarden (10 s lease, no watchdog)",
            Kind::LockwardenPool => "lockwarden, deadpool-redis pool (16)",
            Kind::LockwardenUnfenced => "lockwarden, without fencing tokens",
            Kind::RslockDefault => "rslock 0.10 (defaults)",
            Kind::RslockFast => "rslock 0.10 (retry 1 ms)",
            Kind::SetNx => "SET NX + 1 ms poll",
            Kind::OwnRaw => "lockwarden's commands, raw (FCALL take, HDEL of holder and mark)",
            Kind::NoticeRaw => "the same take, HDEL + PUBLISH every time (before marks), raw",
        }
    }

    /// Key prefix, so implementations never share a key.
    pub fn slug(self) -> &'static str {
        match self {
            Kind::Lockwarden => "lw",
            Kind::LockwardenLease => "lwl",
            Kind::LockwardenPool => "lwp",
            Kind::LockwardenUnfenced => "lwu",
            Kind::RslockDefault => "rsd",
            Kind::RslockFast => "rsf",
            Kind::SetNx => "setnx",
            Kind::OwnRaw => "own",
            Kind::NoticeRaw => "notice",
        }
    }
}

/// A connected lock client of one [`Kind`].
pub enum Locker {
    Lockwarden(LockClient),
    LockwardenLease(LockClient),
    LockwardenUnfenced(LockClient),
    Rslock(LockManager),
    SetNx(ConnectionManager),
    Raw(ConnectionManager, RawRelease),
}

/// A held lock.
pub enum Guard {
    Lockwarden(LockGuard),
    Rslock(rslock::LockGuard),
    SetNx {
        conn: ConnectionManager,
        key: String,
        token: String,
    },
    Raw {
        conn: ConnectionManager,
        lock: String,
        holder: String,
        release: RawRelease,
    },
}

/// How a release went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Released {
    Ok,
    /// The lock was no longer ours at release (or lockwarden reported it lost).
    Lost,
}

impl Locker {
    pub async fn connect(kind: Kind, url: &str) -> Result<Self, BoxError> {
        Ok(match kind {
            Kind::Lockwarden => Self::Lockwarden(LockClient::connect(url).await?),
            Kind::LockwardenLease => Self::LockwardenLease(LockClient::connect(url).await?),
            Kind::LockwardenPool => {
                let mut config = deadpool_redis::Config::from_url(url);
                config.pool = Some(deadpool_redis::PoolConfig::new(POOL_SIZE));
                let client = LockClient::builder().connect_deadpool(&config).await?;
                Self::Lockwarden(client)
            }
            Kind::LockwardenUnfenced => {
                let client = LockClient::builder().without_fencing_tokens();
                Self::LockwardenUnfenced(client.connect(url).await?)
            }
            Kind::RslockDefault => Self::Rslock(LockManager::new(vec![url])),
            Kind::RslockFast => {
                let mut manager = LockManager::new(vec![url]);
                // Delays are drawn from 0..delay ms; 1 ms is the smallest that does not
                // panic (an empty range), so every retry sleeps 0 ms: a tight loop.
                manager.set_retry(3, Duration::from_millis(1));
                Self::Rslock(manager)
            }
            Kind::SetNx => Self::SetNx(connection_manager(url).await?),
            Kind::OwnRaw => Self::Raw(connection_manager(url).await?, RawRelease::Commands),
            Kind::NoticeRaw => Self::Raw(connection_manager(url).await?, RawRelease::Notified),
        })
    }

    /// Acquires `key`, waiting as long as it takes; returns the fencing token if the
    /// implementation has one.
    pub async fn acquire(&self, key: &str) -> Result<(Guard, Option<u64>), BoxError> {
        match self {
            Locker::Lockwarden(client) => {
                let guard = client.acquire(key).await?;
                let token = guard.fencing_token();
                Ok((Guard::Lockwarden(guard), Some(token)))
            }
            Locker::LockwardenLease(client) => {
                let guard = client.lock(key).lease(TTL).acquire().await?;
                let token = guard.fencing_token();
                Ok((Guard::Lockwarden(guard), Some(token)))
            }
            // Its token is 0, for every hold: nothing for the fencing check.
            Locker::LockwardenUnfenced(client) => {
                Ok((Guard::Lockwarden(client.acquire(key).await?), None))
            }
            Locker::Rslock(manager) => {
                let guard = manager.acquire(key.as_bytes(), TTL).await?;
                Ok((Guard::Rslock(guard), None))
            }
            Locker::SetNx(conn) => {
                let mut conn = conn.clone();
                let token = new_token();
                loop {
                    let reply: redis::Value = redis::cmd("SET")
                        .arg(key)
                        .arg(&token)
                        .arg("NX")
                        .arg("PX")
                        .arg(TTL.as_millis() as u64)
                        .query_async(&mut conn)
                        .await?;
                    if reply == redis::Value::Okay {
                        let key = key.to_owned();
                        return Ok((Guard::SetNx { conn, key, token }, None));
                    }
                    tokio::time::sleep(POLL).await;
                }
            }
            // Uncontended workloads only: a busy lock is an error.
            Locker::Raw(conn, release) => {
                let mut conn = conn.clone();
                let (lock, holder) = (format!("raw:{{{key}}}"), new_token());
                let token = take(&mut conn, &lock, &holder).await?;
                let guard = Guard::Raw {
                    conn,
                    lock,
                    holder,
                    release: *release,
                };
                Ok((guard, Some(token)))
            }
        }
    }
}

impl Guard {
    pub async fn release(self) -> Result<Released, BoxError> {
        match self {
            Guard::Lockwarden(guard) => {
                let lost_before = guard.is_lost();
                match guard.release().await {
                    Ok(()) if !lost_before => Ok(Released::Ok),
                    Ok(()) | Err(LockError::Lost { .. } | LockError::NotHeld { .. }) => {
                        Ok(Released::Lost)
                    }
                    Err(e) => Err(e.into()),
                }
            }
            // rslock's release reports nothing; a lost lock cannot be seen here.
            Guard::Rslock(guard) => {
                guard.release().await;
                Ok(Released::Ok)
            }
            Guard::SetNx {
                mut conn,
                key,
                token,
            } => {
                let deleted: i64 = COMPARE_AND_DELETE
                    .key(key)
                    .arg(token)
                    .invoke_async(&mut conn)
                    .await?;
                Ok(if deleted == 1 {
                    Released::Ok
                } else {
                    Released::Lost
                })
            }
            Guard::Raw {
                mut conn,
                lock,
                holder,
                release,
            } => {
                let freed = give_back(&mut conn, &lock, &holder, release, false).await?;
                Ok(if freed { Released::Ok } else { Released::Lost })
            }
        }
    }
}

fn new_token() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    format!(
        "{}:{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// The connection type lockwarden uses for commands.
pub async fn connection_manager(url: &str) -> Result<ConnectionManager, BoxError> {
    Ok(redis::Client::open(url)?.get_connection_manager().await?)
}

/// Sequential round trips over one connection manager, PING and `EVALSHA (return 1)`
/// interleaved so both see the same machine noise. Returns (PING, EVALSHA) samples.
pub async fn round_trips(url: &str, n: usize) -> Result<(Vec<Duration>, Vec<Duration>), BoxError> {
    let mut conn = connection_manager(url).await?;
    let (mut ping, mut evalsha) = (Vec::with_capacity(n), Vec::with_capacity(n));
    for i in 0..n + 200 {
        let t = Instant::now();
        let _: String = redis::cmd("PING").query_async(&mut conn).await?;
        let p = t.elapsed();
        let t = Instant::now();
        let _: i64 = TRIVIAL.invoke_async(&mut conn).await?;
        let e = t.elapsed();
        if i >= 200 {
            ping.push(p);
            evalsha.push(e);
        }
    }
    Ok((ping, evalsha))
}

/// Two sequential `EVALSHA (return 1)`: what an acquire + release costs at the least.
pub async fn evalsha_pair(conn: &mut ConnectionManager) -> Result<(), BoxError> {
    let _: i64 = TRIVIAL.invoke_async(conn).await?;
    let _: i64 = TRIVIAL.invoke_async(conn).await?;
    Ok(())
}

/// How the raw floor releases: as the client releases a plain hold whose holder was made
/// for it and never handed out (`HDEL` of the holder and a waiter's two mark fields, the
/// notice only if it deleted a mark: `HDEL`'s count says 1 held, 2 marked, 3 both), or as
/// any other hold (`release.lua`: the HTTP layer's, whose request holder the handler may
/// use).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RawRelease {
    Commands,
    Script,
    /// As the client released a plain hold before waiters marked the lock: `HDEL` and
    /// the notice, pipelined, every time ([`Kind::NoticeRaw`]).
    Notified,
}

/// lockwarden's take of the plain lock `lock` (its fencing key after it) for a fresh
/// `holder`, as the client calls it where the server has functions: `FCALL`, the function
/// loaded first if the server lacks it. Answers the fencing token; a busy lock is an error.
pub async fn take(
    conn: &mut impl redis::aio::ConnectionLike,
    lock: &str,
    holder: &str,
) -> Result<u64, BoxError> {
    let fence = format!("{lock}:fence");
    let lease = TTL.as_millis().to_string();
    let token: i64 = TAKE.call(conn, &[lock, &fence], &[holder, &lease]).await?;
    // A fresh take answers its bare token (see lua/acquire.lua).
    u64::try_from(token)
        .ok()
        .filter(|&t| t > 0)
        .ok_or_else(|| format!("the take answered {token} on a fresh key").into())
}

/// The release of [`take`]'s hold as `release` says (not [`RawRelease::Script`]); on a
/// `cluster`, `SPUBLISH`. Answers whether the hold was there.
async fn give_back(
    conn: &mut impl redis::aio::ConnectionLike,
    lock: &str,
    holder: &str,
    release: RawRelease,
    cluster: bool,
) -> Result<bool, BoxError> {
    let notice = if cluster { "SPUBLISH" } else { "PUBLISH" };
    let channel = format!("{lock}:released");
    let mut pipe = redis::pipe();
    pipe.cmd("HDEL").arg(lock).arg(holder);
    if release == RawRelease::Notified {
        pipe.cmd(notice).arg(&channel).arg("0").ignore();
    } else {
        pipe.arg("~w1").arg("~w2");
    }
    let (deleted,): (i64,) = pipe.query_async(conn).await?;
    if deleted >= 2 {
        let _: i64 = redis::cmd(notice)
            .arg(&channel)
            .arg("0")
            .query_async(conn)
            .await?;
    }
    Ok(deleted % 2 == 1)
}

/// lockwarden's own take and `release`'s way on `key`, called directly: what the library
/// would cost with no client-side work at all (the Redis side of a cycle). On one server
/// the take goes as a Redis function, as the client's does where the server has them; on a
/// `cluster`, as a cluster client sends them by digest: with call ids, and `SPUBLISH`.
pub async fn own_scripts_pair(
    conn: &mut impl redis::aio::ConnectionLike,
    key: &str,
    cluster: bool,
    release_by: RawRelease,
) -> Result<(), BoxError> {
    let lock = format!("raw:{{{key}}}");
    let holder = "bench-holder";
    if !cluster && release_by != RawRelease::Script {
        take(conn, &lock, holder).await?;
        if !give_back(conn, &lock, holder, release_by, false).await? {
            return Err(format!("own release found no hold on {lock}").into());
        }
        return Ok(());
    }
    let (fence, channel) = (format!("{lock}:fence"), format!("{lock}:released"));
    let (acquire, release) = match cluster {
        true => (&CLUSTER_ACQUIRE, &CLUSTER_RELEASE),
        false => (&ACQUIRE, &RELEASE),
    };
    let mut take = acquire.key(&lock);
    take.key(&fence).arg(holder).arg(30_000);
    let mut give = release.key(&lock);
    give.key(&fence).arg(holder).arg(&channel).arg(""); // the token, needed only to answer a release sent twice
    if cluster {
        // The call ids (once.lua): none for a holder made for its acquisition.
        take.arg("");
        give.arg(format!("bench-release:{key}"));
    }
    let token: i64 = take.invoke_async(conn).await?;
    let left: i64 = match release_by {
        RawRelease::Script => give.invoke_async(conn).await?,
        RawRelease::Commands | RawRelease::Notified => {
            usize::from(!give_back(conn, &lock, holder, release_by, true).await?) as i64
        }
    };
    if token <= 0 || left != 0 {
        return Err(format!("own scripts answered {token} / {left} on a fresh key").into());
    }
    Ok(())
}

/// lockwarden's semaphore calls on `key`, sent directly as the client sends them for one
/// permit of an idle semaphore of `capacity` (watchdog lease, 30 s): the acquire script and
/// the release as plain commands, the Redis side of a permit cycle, with no client-side
/// work.
pub async fn own_permits_pair(
    conn: &mut impl redis::aio::ConnectionLike,
    key: &str,
    capacity: u32,
) -> Result<(), BoxError> {
    let set = format!("raw:{{{key}}}");
    let fence = format!("{set}:fence");
    let channel = format!("{set}:granted");
    // The hold's first member: `<permits>:<lease ms>:<holder id>`.
    let member = "1:30000:bench-holder";
    // Member, lease, capacity as stored (`-<capacity>`), registration (ms), channel.
    let capacity = format!("-{capacity}");
    let args = [member, "30000", &capacity, "30000", &channel];
    let token: i64 = PERMITS_ACQUIRE.call(conn, &[&set, &fence], &args).await?;
    // The release nobody of this client waits for: ZREM, the capacity with the last hold,
    // the waiters in line (none here: no grant follows).
    let (removed, _, waiting): (i64, i64, i64) = redis::pipe()
        .cmd("ZREM")
        .arg(&set)
        .arg(member)
        .cmd("ZREMRANGEBYRANK")
        .arg(&set)
        .arg(-1)
        .arg(0)
        .cmd("ZCOUNT")
        .arg(&set)
        .arg("1e15")
        .arg("+inf")
        .query_async(conn)
        .await?;
    if token <= 0 || removed != 1 || waiting != 0 {
        return Err(format!(
            "own permit calls answered {token} / {removed} / {waiting} on a fresh key"
        )
        .into());
    }
    Ok(())
}

/// `EVALSHA (return 1)` from `tasks` concurrent tasks over one connection manager until
/// `run` is over (or `max` per task). Returns per-window rates and the overall rate.
pub async fn evalsha_throughput(
    url: &str,
    tasks: usize,
    run: Duration,
    max: u64,
) -> Result<(Arc<Windows>, f64), BoxError> {
    let conn = connection_manager(url).await?;
    let start = Instant::now();
    let deadline = start + run;
    let windows = Arc::new(Windows::new(start, run));
    let mut set = JoinSet::new();
    for _ in 0..tasks {
        let mut conn = conn.clone();
        let windows = windows.clone();
        set.spawn(async move {
            let mut done = 0u64;
            while done < max && Instant::now() < deadline {
                let _: i64 = TRIVIAL.invoke_async(&mut conn).await?;
                windows.record();
                done += 1;
            }
            Ok::<_, BoxError>(done)
        });
    }
    let total: u64 = join_all(set, run + Duration::from_secs(30))
        .await?
        .into_iter()
        .sum();
    Ok((windows, total as f64 / start.elapsed().as_secs_f64()))
}

/// Waits for every task, failing on the first error or after `limit` (the rest are
/// aborted when the set is dropped).
pub async fn join_all<T: 'static>(
    mut set: JoinSet<Result<T, BoxError>>,
    limit: Duration,
) -> Result<Vec<T>, BoxError> {
    let mut out = Vec::with_capacity(set.len());
    let all = async {
        while let Some(joined) = set.join_next().await {
            out.push(joined??);
        }
        Ok::<_, BoxError>(())
    };
    match tokio::time::timeout(limit, all).await {
        Ok(result) => result.map(|()| out),
        Err(_) => Err(format!("tasks did not finish within {limit:?}").into()),
    }
}

#[cfg(test)]
mod tests {
    use super::{for_cluster, ACQUIRE_SOURCE, RELEASE_SOURCE};

    /// The cluster floor reads its call id and publishes sharded: if `lua/` changed the
    /// lines rewritten, the rows would silently measure the one-server scripts again.
    #[test]
    fn the_cluster_floor_sends_ids_and_sharded_notices() {
        let (acquire, release) = (for_cluster(ACQUIRE_SOURCE), for_cluster(RELEASE_SOURCE));
        for source in [&acquire, &release] {
            assert!(source.contains("\nlocal call = ARGV[#ARGV]\n"));
            assert!(!source.contains("\nlocal call = ''\n"));
        }
        assert!(release.contains("redis.call('SPUBLISH'"));
        assert!(!release.contains("redis.call('PUBLISH'"));
    }
}
