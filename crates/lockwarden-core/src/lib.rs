//! Redisson-style distributed locks and semaphores on Redis, for async Rust: re-entrant
//! locks and leased permits kept alive by a watchdog, waiters woken by a release notice
//! instead of polling, and a fencing token with every hold.
//!
//! A lock is a Redis hash whose field is the holder's id and whose value is its re-entry
//! count; Lua scripts acquire, re-enter, renew and release it in one round trip each. A
//! lock held without an explicit lease is kept alive by the client's watchdog; waiters
//! sleep until a release notice on pub/sub (or the holder's lease end) instead of polling;
//! every fresh acquisition carries a fencing token. [`LockClient::in_memory`] offers the
//! same semantics in-process. This is the engine of
//! [`lockwarden`](https://docs.rs/lockwarden), which re-exports it and adds a tower layer
//! that locks HTTP requests by key; use this crate alone for locks outside HTTP requests.
//!
//! ```no_run
//! use std::time::Duration;
//!
//! use lockwarden_core::{LockClient, LockError};
//!
//! #[tokio::main]
//! async fn main() -> Result<(), LockError> {
//!     let client = LockClient::connect("redis://127.0.0.1:6379/").await?;
//!
//!     // Wait at most 2 s; the watchdog keeps the lock alive while the guard lives.
//!     let guard = client.try_acquire("orders:42", Duration::from_secs(2)).await?;
//!     println!("holding orders:42 with fencing token {}", guard.fencing_token());
//!     guard.release().await?; // or drop it: released in the background
//!
//!     // A fixed lease instead of the watchdog, and re-entry by one holder:
//!     let me = client.holder();
//!     let outer = client.lock("cart:7").holder(&me).lease(Duration::from_secs(10)).acquire().await?;
//!     let inner = client.lock("cart:7").holder(&me).acquire().await?; // re-enters
//!     inner.release().await?;
//!     outer.release().await
//! }
//! ```
//!
//! The same on the in-process store, which needs no server:
//!
//! ```
//! use lockwarden_core::{LockClient, LockError};
//! use std::time::Duration;
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), LockError> {
//! let client = LockClient::in_memory();
//! let guard = client.try_acquire("orders:42", Duration::from_secs(2)).await?;
//! assert!(matches!(
//!     client.try_acquire("orders:42", Duration::ZERO).await,
//!     Err(LockError::Timeout { .. })
//! ));
//! guard.release().await?;
//! # Ok(()) }
//! ```
//!
//! [`LockClient::with_lock`] acquires, runs a closure and releases (also on error and
//! panic). [`LockGuard::lost`] resolves, and [`LockGuard::is_lost`] turns true, if the
//! lock is lost while held. [`Lock::force_unlock`] (an operator's action),
//! [`Lock::is_locked`], [`Lock::is_held_by`], [`Lock::hold_count`] and
//! [`Lock::remaining_ttl`] inspect and manage a lock. [`LockClient::shutdown`], before the
//! process exits, releases what the client still holds or has queued, so the next
//! process does not wait out leases.
//!
//! # Which lock for which job
//!
//! | need | use | promises |
//! |---|---|---|
//! | one at a time per key, across processes | [`client.acquire(name)`](LockClient::acquire) / [`try_acquire(name, wait)`](LockClient::try_acquire) | mutual exclusion while the lease holds; re-entrant per [`Holder`]; watchdog renewal; waiters woken by the release (no polling); a fencing token per hold |
//! | do a piece of work once, hand its result to every retry | [`lock.try_claim(wait)`](Lock::try_claim) + [`guard.complete(outcome, keep)`](LockGuard::complete) | one runs, every waiter and later caller gets the stored outcome (until `keep`); nothing stored by a holder that lost the lock |
//! | several keys at once (transfers, batch updates) | [`client.multi_lock([..])`](LockClient::multi_lock)`.try_acquire(wait)` | all or nothing in one step, so no deadlock between callers and nothing held while waiting; one guard |
//! | first come, first served across processes | [`client.fair_lock(name)`](LockClient::fair_lock)`.try_acquire(wait)` | FIFO by arrival; no barging by newcomers; a release hands the lock to the head, which holds it without another round trip; a waiter that gives up leaves the queue at once, one that dies after its `queue_timeout` (5 s) |
//! | many readers or one writer | [`client.rw_lock(name)`](LockClient::rw_lock)`.read()` / `.write()` | shared reads, exclusive writes, re-entrant per holder; downgrade (write → read) allowed, upgrade refused ([`UpgradeRefused`](LockError::UpgradeRefused)); writer preference (a waiting writer holds back new readers); a write release admits every waiting reader in its own step (they hold without asking again) |
//! | at most N at once per key, across processes (N exports per account, N calls to a downstream that caps its connections) | [`client.semaphore(name, n)`](LockClient::semaphore)`.acquire()` / [`acquire_many(k)`](Semaphore::acquire_many) | at most the stored capacity held at once; each permit a lease of its own (watchdog or fixed), back by the server's clock when its holder dies; a waiter waits in line and a release grants it its permits in the same step, waking only the waiters it lets in; arrival order (strict with [`fair`](Semaphore::fair)); a fencing token per permit; not re-entrant |
//! | requests per unit of time per key (a tenant, an API key, an IP), counted across every process | [`client.rate_limiter(name, policies)`](LockClient::rate_limiter)`?.check(key)` | GCRA by the server's clock, exact across replicas whatever their clocks; several [policies](RatePolicy) (10 per second and 1,000 a day) charged all or nothing in one round trip; a refusal's exact wait; costs in units ([`check_n`](RateLimiter::check_n)), looks, refunds; one small key per (policy, key) while its bucket is not full, nothing per request |
//! | a value only the newest holder may write | [`client.fenced(name)`](LockClient::fenced) | a write carrying a fencing token lower than one already seen is refused ([`StaleToken`](LockError::StaleToken)), in one atomic script |
//! | a lock that survives a failover to a replica | [`LockClient::builder().wait_for_replicas(1, timeout)`](LockClientBuilder::wait_for_replicas) | an acquisition counts only once `n` replicas acknowledged it (else [`NotReplicated`](BackendError::NotReplicated), nothing held); costs the replication delay per acquisition |
//! | the most locks per second from one Redis, for work that fences nothing | [`LockClient::builder().without_fencing_tokens()`](LockClientBuilder::without_fencing_tokens) | plain locks and claims as above but with token 0 ([`FencedValue::write`] refuses it): Redis does not touch a fencing key, about a twelfth less of its work per cycle; fair, read-write and multi locks keep their tokens |
//! | share locks with a JVM service on Redisson | [`LockClient::builder().layout(KeyLayout::Redisson)`](LockClientBuilder::layout) | the `RLock` layout and unlock message: each side excludes and wakes the other |
//! | Redis Cluster | [`LockClient::builder().connect_cluster([url, ..])`](LockClientBuilder::connect_cluster) | every lock above; each lock's keys and channel in one slot, on the master that owns it, followed as slots move; a multi-lock spanning slots is taken slot by slot with the earlier slots given back if a later one is busy |
//! | Redis Sentinel | [`LockClient::builder().connect_sentinel([sentinel, ..], service)`](LockClientBuilder::connect_sentinel) | commands and notices follow the primary the sentinels name; after a failover a lock the new primary received is kept, one it did not is reported through `lost()` at its next renewal (add `wait_for_replicas` to make that rare) |
//! | a lock that outlives the loss of a Redis node | [`Redlock::connect(&[url1, url2, url3])`](Redlock::connect) | held only with a majority of independent masters, for `lease − elapsed − drift`; failed rounds undone on every node; extensions capped; read its assumptions on [`Redlock`] |
//! | HTTP requests by key, idempotent HTTP endpoints | [`lockwarden::LockLayer`](https://docs.rs/lockwarden/latest/lockwarden/http/type.LockLayer.html) | the lock spans handler and response body; `409`/`423` with `Retry-After`; with `.remember(keep)` one handler run per key and retries replayed byte for byte |
//! | at most N concurrent HTTP requests per key, across replicas | [`lockwarden::LimitLayer`](https://docs.rs/lockwarden/latest/lockwarden/http/type.LimitLayer.html) | a semaphore permit spans handler and response body; `429` with `Retry-After` |
//! | at most N HTTP requests per unit of time per key, across replicas | [`lockwarden::RateLimitLayer`](https://docs.rs/lockwarden/latest/lockwarden/http/type.RateLimitLayer.html) | one rate decision per request; `429` with an exact `Retry-After`, the draft's `quota-exceeded` problem and the IETF `RateLimit` fields |
//!
//! Every lock but Redlock, and a semaphore's permits, come as the same [`LockGuard`]
//! (fencing token, `lost()` signal, release on drop) and are offered by the in-process
//! store too; every one of them runs on
//! one server, a Redis Cluster or a Sentinel-managed primary. Fencing tokens are the safety
//! net for what Redis cannot promise: a lock can be lost (lease expiry during a long pause,
//! failover to a replica that had not seen it); the guard's `lost()` signal says so, and a
//! resource that checks fencing tokens refuses the stale writer.
//!
//! # Fencing: the resource checks
//!
//! A lock cannot stop a holder that was paused past its lease (GC, a stopped process, a
//! slow network) from acting on its stale belief; the resource must refuse it.
//! [`client.fenced(name)`](LockClient::fenced) is that check for a value kept in the lock
//! store: [`write(token, bytes)`](FencedValue::write) is applied only if no larger token
//! wrote the value before, else [`LockError::StaleToken`] (one atomic script). For data
//! elsewhere, keep the token with the data and compare on write:
//!
//! ```sql
//! UPDATE orders SET status = $2, fence = $3
//!  WHERE id = $1 AND (fence IS NULL OR fence <= $3);
//! -- 0 rows updated: a newer holder wrote first; stop, the lock is lost.
//! ```
//!
//! The test suite plays Martin Kleppmann's scenario with real processes: a holder checks it
//! holds the lock, is stopped (`SIGSTOP`) past its lease, another holder takes the lock and
//! writes, the first resumes and writes: refused, 20 rounds out of 20.
//!
//! # Guides
//!
//! - [`guide::connecting`]: one server, TLS, Redis Cluster, Sentinel, your own
//!   `redis::Client` or deadpool pool, and the ACL rules lockwarden needs.
//! - [`guide::how_it_works`]: each lock kind's keys, channels and scripts, the watchdog,
//!   waiting, lost replies, and the design decisions.
//! - [`guide::operating`]: memory policy, persistence and clocks, failover,
//!   force-unlock, shutdown, metrics, the inspector.
//!
//! # Feature flags
//!
//! | feature | default | what it adds |
//! |---|---|---|
//! | `tls` | yes | `rediss://` URLs, TLS through rustls (ring as the crypto provider, the system's root certificates), and [`LockClientBuilder::tls_root_certificate`] / [`tls_client_identity`](LockClientBuilder::tls_client_identity) |
//! | `deadpool` | no | `LockClientBuilder::connect_pool` / `connect_deadpool`: commands through a `deadpool_redis::Pool` the application already has |
//!
//! # Supported servers and Rust versions
//!
//! Redis 6.2 or later (the scripts call `SET .. PXAT`, `ZADD .. GT` and `COPY`; every test
//! runs on Redis 7.0) and Valkey 8 (the conformance, semaphore, cluster,
//! pub/sub and ACL tests run on Valkey 8.1). The checks of a user's
//! ACL permissions at connect need Redis 7.0 or later, sharded notices on a cluster too.
//! The minimum supported Rust version is 1.88.

#![cfg_attr(docsrs, feature(doc_cfg))]
#![warn(missing_docs)]

// The layers, from the bottom up (see ARCHITECTURE.md): vocabulary; stores; engine; the
// acquire loop; lock handles and guards; the client facade; Redlock.
mod error;
mod finish;
mod hold;
mod holder;
mod key;
mod lost;
mod metrics;
mod notice;
mod policy;
mod rate_key;
mod waiters;

mod store;

mod engine;
mod live;
mod settle;
mod shutdown;
mod watchdog;

mod acquire;

mod fair;
mod fenced;
mod guard;
mod inspect;
mod lock;
mod multi;
mod options;
mod rate;
mod rw;
mod semaphore;
mod target;

mod builder;
mod client;

mod redlock;

pub mod guide;

/// The Redis client crate lockwarden is built on, for [`LockClientBuilder::connect_client`]
/// and the errors in [`BackendError::Redis`].
pub use redis;

pub use builder::LockClientBuilder;
pub use client::{ClientStats, LockClient};
pub use error::{BackendError, KeyError, LockError, RateLimitError, RedlockError, ShutdownError};
pub use fair::{FairLock, DEFAULT_QUEUE_TIMEOUT};
pub use fenced::FencedValue;
pub use guard::{LockGuard, LockInfo};
pub use hold::RwMode;
pub use holder::{Holder, Scoped};
pub use key::{Key, KeyLayout, DEFAULT_MAX_KEY_LEN, DEFAULT_NAMESPACE};
pub use lock::{Claim, Lock};
pub use lost::LostSignal;
pub use multi::{MultiGuard, MultiLock};
pub use policy::{RatePolicy, MAX_RATE_NAME, MAX_REFILL};
pub use rate::{PolicyState, RateDecision, RateLimiter, MAX_POLICIES};
pub use redlock::{Redlock, RedlockBuilder, RedlockGuard, RedlockLock};
pub use rw::{RwLock, RwLockHandle};
pub use semaphore::{Semaphore, SemaphoreState, MAX_PERMITS};
pub use store::redis::ReleaseNotices;

// Compiles the Rust blocks of the crate's README as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
