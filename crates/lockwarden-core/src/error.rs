//! Errors returned by the lock engine.

use std::time::Duration;

/// Why a lock operation failed.
///
/// Every variant says what happened and what the caller can do about it:
///
/// ```
/// # use lockwarden_core::{LockClient, LockError};
/// # use std::time::Duration;
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let client = LockClient::in_memory();
/// let _held = client.acquire("report").await.unwrap();
/// match client.try_acquire("report", Duration::ZERO).await {
///     Err(LockError::Timeout { retry_after, .. }) => assert!(retry_after > Duration::ZERO),
///     other => panic!("expected a timeout, got {other:?}"),
/// }
/// # }
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LockError {
    /// Another holder kept the lock for the whole wait budget.
    #[error("lock `{key}` is held by another holder and the wait budget is spent; retry after {retry_after:?}")]
    Timeout {
        /// The lock's name.
        key: String,
        /// How long the current holder's lease still runs (a hint; it may be released sooner).
        retry_after: Duration,
    },
    /// The caller does not hold this lock (never did, already released it, or lost it).
    #[error("lock `{key}` is not held by this holder (released already, expired or taken over)")]
    NotHeld {
        /// The lock's name.
        key: String,
    },
    /// The lock was lost while held: its lease ran out or it was deleted or taken over.
    #[error("lock `{key}` was lost while held; the protected work may have overlapped with another holder")]
    Lost {
        /// The lock's name.
        key: String,
    },
    /// A holder that holds only the read side of a read-write lock asked for the write
    /// side. Waiting would deadlock (the write waits for every reader, this holder
    /// included), so it is refused at once: release the read hold, then take the write.
    #[error(
        "lock `{key}`: this holder holds the read lock; release it before taking the write lock"
    )]
    UpgradeRefused {
        /// The lock's name.
        key: String,
    },
    /// A semaphore was asked for a number of permits it can never grant: zero permits, a
    /// capacity of zero or above [`MAX_PERMITS`](crate::MAX_PERMITS). Nothing was sent;
    /// fix the numbers.
    #[error("semaphore `{key}`: {problem}")]
    InvalidPermits {
        /// The semaphore's name.
        key: String,
        /// What is wrong with the numbers.
        problem: String,
    },
    /// More permits were asked at once than the semaphore has: its capacity, as stored by
    /// the client that made it (see [`Semaphore`](crate::Semaphore)). Waiting would never
    /// end, so it is refused at once; nothing is held.
    #[error("semaphore `{key}` has {capacity} permits; {asked} can never be granted at once")]
    TooManyPermits {
        /// The semaphore's name.
        key: String,
        /// The permits asked at once.
        asked: u32,
        /// The semaphore's capacity.
        capacity: u32,
    },
    /// A claim was completed with the guard of a read-write lock: only plain and fair
    /// locks keep a claim's outcome. The hold was released; nothing was stored.
    #[error("lock `{key}` is a read-write lock, which stores no claim outcome; the hold was released without it")]
    NotClaimable {
        /// The lock's name.
        key: String,
    },
    /// A fenced write carried a fencing token older than one that already wrote the value
    /// (see [`FencedValue`](crate::FencedValue)): a newer holder has taken the lock since
    /// this one's token was drawn. Nothing was written; the writer has lost the lock.
    #[error("`{key}`: fencing token {token} is older than {newest}, which already wrote it; a newer holder has the lock")]
    StaleToken {
        /// The fenced value's name.
        key: String,
        /// The token the write carried.
        token: u64,
        /// The newer token that wrote the value.
        newest: u64,
    },
    /// A fenced write carried token 0, which no hold gets but those of a client built
    /// [`without_fencing_tokens`](crate::LockClientBuilder::without_fencing_tokens):
    /// it would fence nothing. Nothing was written.
    #[error("`{key}`: a fenced write needs a fencing token, and 0 is none (the lock was taken by a client built without fencing tokens)")]
    NoFencingToken {
        /// The fenced value's name.
        key: String,
    },
    /// A rate limiter was made with policies it cannot run, or asked to charge a cost no
    /// policy could ever admit (see [`RateLimitError`]). Nothing was charged; fix the
    /// settings or the cost.
    #[error("rate limiter `{limiter}`: {problem}")]
    InvalidRateLimit {
        /// The limiter's name.
        limiter: String,
        /// What is wrong, and what to do.
        problem: RateLimitError,
    },
    /// The lock name was rejected.
    #[error("invalid lock key: {0}")]
    InvalidKey(#[from] KeyError),
    /// The lock store could not be reached or answered with an error.
    #[error("lock backend failed: {0}")]
    Backend(#[from] BackendError),
    /// A [`Redlock`](crate::Redlock) could not get, extend or release a majority, or was
    /// set up wrongly.
    #[error(transparent)]
    Redlock(#[from] RedlockError),
    /// The client was [shut down](crate::LockClient::shutdown): it takes no lock any
    /// more (an acquisition waiting when it shut down ends with this too).
    #[error("lock `{key}`: the lock client was shut down; it takes no more locks")]
    ShutDown {
        /// The lock's name.
        key: String,
    },
}

/// What [`LockClient::shutdown`](crate::LockClient::shutdown) could not release within its
/// timeout: those locks stay held until their leases run out (the watchdog lease, 30 s by
/// default, or their fixed lease).
///
/// ```
/// # use lockwarden_core::LockClient;
/// # use std::time::Duration;
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let client = LockClient::in_memory();
/// let kept = client.acquire("export").await.unwrap();
/// std::mem::forget(kept); // a guard that is never released nor dropped
/// // Released by the shutdown; nothing is left to report.
/// client.shutdown(Duration::from_secs(5)).await.unwrap();
/// # }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ShutdownError {
    /// The names of the locks this client's live guards held whose release the store did
    /// not confirm in time (each name once per hold).
    pub unreleased: Vec<String>,
    /// Whether releases of dropped guards were still waiting for the store's answer when
    /// the timeout ran out (their locks are not named: a dropped guard is gone).
    pub dropped_unconfirmed: bool,
}

impl std::fmt::Display for ShutdownError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the lock client shut down with locks it could not release in time")?;
        if !self.unreleased.is_empty() {
            write!(f, ": `{}`", self.unreleased.join("`, `"))?;
        }
        if self.dropped_unconfirmed {
            f.write_str("; releases of dropped guards were still unanswered")?;
        }
        f.write_str(" (they expire with their leases)")
    }
}

impl std::error::Error for ShutdownError {}

/// Why a lock name was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum KeyError {
    /// The name is empty.
    #[error("the key is empty")]
    Empty,
    /// The name is longer than the configured limit.
    #[error("the key is {len} bytes long; at most {max} are allowed")]
    TooLong {
        /// The name's length in bytes.
        len: usize,
        /// The configured limit in bytes.
        max: usize,
    },
    /// The name contains a control character (newline, NUL, DEL, ...).
    #[error("the key contains a control character at byte {at}")]
    ControlCharacter {
        /// Byte offset of the first control character.
        at: usize,
    },
    /// The name contains `{` or `}`, which the Redisson layout cannot escape (they would
    /// move the lock's keys to different cluster slots).
    #[error("the key contains a brace at byte {at}, which the Redisson layout does not allow")]
    Brace {
        /// Byte offset of the first brace.
        at: usize,
    },
}

/// What is wrong with a rate limiter's settings or with a cost asked of it; reached through
/// [`LockError::InvalidRateLimit`]. Each says what to change.
///
/// ```
/// use std::time::Duration;
/// use lockwarden_core::{LockClient, LockError, RateLimitError, RatePolicy};
///
/// let client = LockClient::in_memory();
/// let zero = RatePolicy::new("burst", 0, Duration::from_secs(1));
/// match client.rate_limiter("api", [zero]) {
///     Err(LockError::InvalidRateLimit { problem: RateLimitError::ZeroQuota { policy }, .. }) => {
///         assert_eq!(policy, "burst")
///     }
///     other => panic!("expected a refusal, got {other:?}"),
/// }
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RateLimitError {
    /// A limiter or policy name that is empty, too long or has other characters than
    /// ASCII letters, digits, `_`, `-` and `.` (it is part of Redis keys and metric
    /// labels).
    #[error("the {what} name {name:?} must be 1 to 64 ASCII letters, digits, `_`, `-` or `.`")]
    InvalidName {
        /// `"limiter"` or `"policy"`.
        what: &'static str,
        /// The name given.
        name: String,
    },
    /// A limiter without any policy.
    #[error("a rate limiter needs at least one policy")]
    NoPolicies,
    /// More policies than one decision checks at once.
    #[error("{count} policies; at most {max} are checked in one decision")]
    TooManyPolicies {
        /// Policies given.
        count: usize,
        /// The most allowed.
        max: usize,
    },
    /// Two policies of one limiter with the same name (they would share their state).
    #[error("two policies are named `{policy}`; give each its own name")]
    DuplicatePolicy {
        /// The name given twice.
        policy: String,
    },
    /// A quota of 0 requests per window.
    #[error(
        "policy `{policy}` has a quota of 0; a policy must admit at least one request per window"
    )]
    ZeroQuota {
        /// The policy's name.
        policy: String,
    },
    /// A burst of 0: no request could ever be admitted.
    #[error("policy `{policy}` has a burst of 0; it must admit at least one request at once")]
    ZeroBurst {
        /// The policy's name.
        policy: String,
    },
    /// More than one request per µs (`window ÷ quota` under 1 µs, or a zero window):
    /// finer than the server's clock.
    #[error("policy `{policy}` admits {quota} per {window:?}, more than one per µs (the server's clock ticks in µs); count in larger units")]
    TooFast {
        /// The policy's name.
        policy: String,
        /// Its quota.
        quota: u32,
        /// Its window.
        window: Duration,
    },
    /// A bucket that would take longer than [`MAX_REFILL`](crate::MAX_REFILL) to fill up
    /// again from empty (burst × interval): a window too long, or a burst too large for it.
    #[error("policy `{policy}`: a burst of {burst} at one per {interval:?} takes longer than {max:?} to refill; shorten the window or the burst", max = crate::MAX_REFILL)]
    TooLong {
        /// The policy's name.
        policy: String,
        /// Its burst.
        burst: u32,
        /// Its emission interval.
        interval: Duration,
    },
    /// A request of cost 0: use [`peek`](crate::RateLimiter::peek) to look without
    /// charging.
    #[error("a cost of 0 charges nothing; use peek to look without charging")]
    ZeroCost,
    /// A cost above a policy's burst: no bucket ever holds that much, so the request
    /// would be refused for ever.
    #[error("a cost of {cost} is above policy `{policy}`'s burst of {burst}: it could never be admitted; split the request or raise the burst")]
    CostAboveBurst {
        /// The policy that can never admit it.
        policy: String,
        /// The cost asked.
        cost: u32,
        /// The policy's burst.
        burst: u32,
    },
}

/// A failure of the lock store (Redis): connection, protocol, script or timeout.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BackendError {
    /// Redis returned an error or the connection failed.
    #[error("redis: {0}")]
    Redis(#[from] redis::RedisError),
    /// Redis did not answer within the command timeout.
    #[error("redis did not answer within {0:?}")]
    TimedOut(Duration),
    /// Redis answered with something the scripts never return.
    #[error("unexpected reply from redis: {0}")]
    Protocol(String),
    /// The lock was taken but fewer replicas than asked for acknowledged it within the
    /// `WAIT` timeout (see
    /// [`LockClientBuilder::wait_for_replicas`](crate::LockClientBuilder::wait_for_replicas)),
    /// so it was released again: a failover could have lost it.
    #[error(
        "only {acknowledged} of {wanted} replicas acknowledged the lock in time; it was released"
    )]
    NotReplicated {
        /// Replicas that acknowledged the write.
        acknowledged: u32,
        /// Replicas asked for.
        wanted: u32,
    },
    /// No lock store is configured: the process-wide default client was asked for, and
    /// the setting it reads is missing (the text says which, and what to do). Retrying
    /// does not help until the process is configured.
    #[error("no lock store is configured: {0}")]
    NotConfigured(&'static str),
    /// Redis could not be reached moments ago; the next attempt is not due yet.
    #[error("redis was unreachable moments ago; retrying in {0:?}")]
    Unreachable(Duration),
    /// Connecting found no Redis at the address given, or it did not answer in time:
    /// `address` says where it looked (host and port, never a password), `source` what
    /// happened. Check that the server runs there and the address is the right one.
    #[error("cannot reach Redis at {address}: {source}; check that it runs there and that the address is right")]
    Connect {
        /// Where the client looked: `host:port` (a cluster's or the sentinels' nodes).
        address: String,
        /// What failed.
        source: Box<BackendError>,
    },
    /// A URL given to connect is not a Redis URL: `problem` says what is wrong with it.
    /// Retrying does not help; fix the URL.
    #[error("`{url}` is not a Redis URL ({problem}); write it as redis://[user:password@]host:port/[db], or rediss://… for TLS")]
    InvalidUrl {
        /// The URL, any password in it left out.
        url: String,
        /// What is wrong with it.
        problem: String,
    },
    /// A TLS connection to Redis could not be set up: the server's certificate is not
    /// trusted (signed by a CA the client does not trust, made for another host name,
    /// expired), or the server refused this client's certificate (or its lack of one).
    /// Retrying does not help; fix the trust settings (`LockClientBuilder::
    /// tls_root_certificate`, `tls_client_identity`).
    #[error("TLS with redis failed: {problem}: {source}")]
    Tls {
        /// What went wrong, in words, and what to do about it.
        problem: &'static str,
        /// The error underneath (rustls's, through redis-rs).
        source: redis::RedisError,
    },
    /// The Redis user may not run a command lockwarden needs, or not on the lock's keys or
    /// channels (its ACL rules). Retrying does not help; the guide's
    /// [ACL users](crate::guide::connecting#acl-users) section lists what lockwarden needs.
    #[error("redis refused {command} for this user (ACL): {message}")]
    NotPermitted {
        /// The refused command, e.g. `EVALSHA` or, for a command a script ran,
        /// `PEXPIRE (line 29 of acquire.lua)`; at connect, every refused command
        /// (`PEXPIRE, PEXPIREAT`).
        command: String,
        /// Redis's error text, or at connect what the check found.
        message: String,
    },
}

impl BackendError {
    /// A client setting that cannot work, refused at connect: `what` failed, `detail` says
    /// why.
    pub(crate) fn config(what: &'static str, detail: String) -> Self {
        BackendError::Redis(redis::RedisError::from((
            redis::ErrorKind::InvalidClientConfig,
            what,
            detail,
        )))
    }

    /// Whether retrying may help: the connection failed or Redis was slow, as opposed to
    /// Redis rejecting the command (a wrong type, a script error).
    pub fn is_transient(&self) -> bool {
        match self {
            BackendError::Redis(e) => {
                e.is_io_error()
                    || e.is_connection_dropped()
                    || e.is_connection_refusal()
                    || e.is_timeout()
                    // A slot between masters (MOVED, ASK, TRYAGAIN, CLUSTERDOWN: a failover
                    // or a slot move redis-rs's own retries did not outlast), a master
                    // down or demoted, a server loading its data: none ran the command.
                    || e.is_cluster_error()
                    || matches!(
                        e.kind(),
                        redis::ErrorKind::Server(
                            redis::ServerErrorKind::MasterDown
                                | redis::ServerErrorKind::BusyLoading
                                | redis::ServerErrorKind::ReadOnly
                        )
                    )
            }
            BackendError::TimedOut(_) | BackendError::Unreachable(_) => true,
            BackendError::Connect { source, .. } => source.is_transient(),
            BackendError::InvalidUrl { .. }
            | BackendError::Protocol(_)
            | BackendError::NotReplicated { .. }
            | BackendError::Tls { .. }
            | BackendError::NotPermitted { .. }
            | BackendError::NotConfigured(_) => false,
        }
    }
}

impl From<redis::RedisError> for LockError {
    fn from(e: redis::RedisError) -> Self {
        LockError::Backend(BackendError::Redis(e))
    }
}

/// Why a [`Redlock`](crate::Redlock) operation failed; reached through
/// [`LockError::Redlock`](crate::LockError::Redlock).
///
/// A lock that another holder keeps for the whole wait budget is still reported as
/// [`LockError::Timeout`](crate::LockError::Timeout), and a lock whose validity ran out as
/// [`LockError::Lost`](crate::LockError::Lost), as for single-node locks.
///
/// ```
/// use lockwarden_core::{LockError, Redlock, RedlockError};
///
/// // No nodes at all is refused before anything is sent.
/// match Redlock::new(Vec::new()) {
///     Err(LockError::Redlock(RedlockError::InvalidNodes { nodes: 0, .. })) => {}
///     other => panic!("expected a refusal, got {other:?}"),
/// }
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RedlockError {
    /// Fewer than a majority of the nodes granted the request (acquire, extend or
    /// release), and no other holder was seen: nodes are down, slow or partitioned.
    #[error(
        "lock `{key}`: only {granted} of {nodes} Redis nodes granted it and {needed} are needed; \
         the others are down, slow or did not hold it"
    )]
    NoQuorum {
        /// The lock's name.
        key: String,
        /// Nodes that granted it.
        granted: usize,
        /// The majority needed.
        needed: usize,
        /// Nodes configured.
        nodes: usize,
    },
    /// A majority granted the lock or its extension, but only after its validity had run out
    /// (the nodes answered too slowly for the lease); it was released again.
    #[error(
        "lock `{key}`: a majority answered after {elapsed:?}, too late for a lease of {lease:?}; \
         use a longer lease or a shorter node timeout"
    )]
    TooSlow {
        /// The lock's name.
        key: String,
        /// How long the round took.
        elapsed: Duration,
        /// The lease asked for.
        lease: Duration,
    },
    /// The guard was already extended as often as
    /// [`RedlockBuilder::max_extensions`](crate::RedlockBuilder::max_extensions) allows; it
    /// stays valid until [`RedlockGuard::valid_until`](crate::RedlockGuard::valid_until).
    #[error("lock `{key}` was already extended {max} times, the configured cap")]
    ExtensionLimit {
        /// The lock's name.
        key: String,
        /// The cap.
        max: u32,
    },
    /// The node list cannot make a Redlock (none, an even count, a duplicate, an in-process
    /// client).
    #[error("cannot build a Redlock over {nodes} nodes: {reason}")]
    InvalidNodes {
        /// Nodes given.
        nodes: usize,
        /// What is wrong with them.
        reason: &'static str,
    },
    /// The settings contradict each other (e.g. a node timeout as long as the lease).
    #[error("invalid Redlock settings: {0}")]
    InvalidSettings(&'static str),
}
