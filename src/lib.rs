//! Request-scoped distributed locks, concurrency limits and rate limits for Rust web
//! services, on Redis.
//!
//! A tower [`LockLayer`] locks each request by a key it carries (a header, the path, a
//! path parameter, a JSON field, or anything a closure finds) and holds the lock while the
//! handler runs and the response body streams; with [`LockLayer::remember`] it is an
//! idempotency layer that answers retries from the stored response. A [`LimitLayer`]
//! holds a permit of a semaphore instead: at most N requests with one key at once, across
//! every replica; a [`RateLimitLayer`] charges each request to its key's rate limits (GCRA
//! on the server's clock, one script per request) and answers the rest `429` with the IETF
//! `RateLimit` fields. The three are one [`KeyedLayer`] over an admission policy. The
//! [`Locked<T>`] and [`Limited<T>`] axum extractors lock or limit one value inside a
//! handler. Underneath is the lock engine of [`lockwarden_core`],
//! re-exported here: Redisson-style re-entrant locks with watchdog leases, waiters woken
//! by a release notice (never polling), fencing tokens, fair, read-write, multi and
//! Redlock variants, and semaphores with leased permits.
//!
//! # Example
//!
//! ```no_run
//! use std::time::Duration;
//!
//! use axum::{routing::post, Router};
//! use lockwarden::{LockClient, LockLayer};
//!
//! /// The authenticated caller, put into the request's extensions by your auth middleware.
//! #[derive(Clone)]
//! struct User {
//!     id: String,
//! }
//!
//! async fn charge() -> &'static str {
//!     "charged"
//! }
//!
//! #[tokio::main]
//! async fn main() -> Result<(), Box<dyn std::error::Error>> {
//!     // Every replica of the service must share this Redis.
//!     let locks = LockClient::connect("redis://127.0.0.1:6379/").await?;
//!
//!     let app = Router::new().route("/payments", post(charge)).layer(
//!         LockLayer::by_header("Idempotency-Key")
//!             .client(locks.clone())
//!             // One client's keys never block or collide with another's.
//!             .scope(|req| req.extensions.get::<User>().map(|user| user.id.clone()))
//!             // Duplicates in flight wait for the first...
//!             .wait(Duration::from_secs(2))
//!             // ...and every retry within a day gets its stored response.
//!             .remember(Duration::from_secs(24 * 3600)),
//!     );
//!     // Add your authentication layer (the one that inserts `User`) after this one, so
//!     // it runs first.
//!
//!     let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
//!     // On SIGTERM or Ctrl-C: finish the requests in flight, then release what is left.
//!     axum::serve(listener, app)
//!         .with_graceful_shutdown(lockwarden::shutdown_signal())
//!         .await?;
//!     locks.shutdown(std::time::Duration::from_secs(5)).await?;
//!     Ok(())
//! }
//! ```
//!
//! What a client of that service sees, here on the in-process store: the first request
//! runs the handler, a retry with the same key is answered from the store.
//!
//! ```
//! use axum::{body::Body, http::Request, routing::post, Router};
//! use lockwarden::{LockClient, LockLayer};
//! use std::time::Duration;
//! use tower::ServiceExt as _;
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! let app = Router::new().route("/payments", post(|| async { "charged" })).layer(
//!     LockLayer::by_header("Idempotency-Key")
//!         .client(LockClient::in_memory())
//!         .remember(Duration::from_secs(60)),
//! );
//! let request = || Request::post("/payments").header("idempotency-key", "k1").body(Body::empty()).unwrap();
//!
//! let first = app.clone().oneshot(request()).await.unwrap();
//! assert_eq!(first.status(), 200);
//! assert!(first.headers().get("idempotency-replayed").is_none());
//!
//! let retry = app.oneshot(request()).await.unwrap();
//! assert_eq!(retry.status(), 200);
//! assert_eq!(retry.headers()["idempotency-replayed"], "true");
//! # }
//! ```
//!
//! # Where the layer gets its lock client
//!
//! A layer (or extractor) given a client with [`LockLayer::client`] uses it. Without one,
//! it uses [`default_client`]: Redis at the URL in the `REDIS_URL` environment variable.
//! If `REDIS_URL` is not set, building the layer logs an error naming it, and every locked
//! request is answered `503` (also with [`LockLayer::fail_open`]): a deployment never runs
//! single-process by accident. The in-process store is used only when you pass it,
//! `.client(LockClient::in_memory())`, and then excludes requests of that one process only.
//!
//! # Keys, scopes and answers
//!
//! The key comes from [`LockLayer::by_header`], [`by_path`](LockLayer::by_path),
//! [`by_path_param`](LockLayer::by_path_param), [`by_json_field`](LockLayer::by_json_field)
//! or [`by`](LockLayer::by) (any [`http::KeySource`] with [`LockLayer::new`]). A request
//! that finds the key busy (after [`wait`](LockLayer::wait), by default one attempt) is
//! answered `409 Conflict` (or `423 Locked`) and an RFC 9457 `application/problem+json`
//! body, without reaching the handler, with a `Retry-After` estimated from how long the
//! layer's holds have lasted (see [`LockLayer`]); the other answers are
//! listed on [`Rejection`]. Every behaviour (streaming bodies, disconnects, panics, a
//! lock lost mid-request) is on [`LockLayer`].
//!
//! **Scope your keys.** Without [`scope`](LockLayer::scope) a key is global: a client that
//! sends another client's `Idempotency-Key` blocks that client's request and learns the
//! key is in use, and with `remember` it is answered with *the other client's stored
//! response*. Scope keys by the authenticated principal; leave them unscoped only when the
//! server makes them or they are meant to be shared.
//!
//! # The lock engine
//!
//! Everything of [`lockwarden_core`] is re-exported here, so `lockwarden::LockClient`
//! and `lockwarden_core::LockClient` are the same type.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lockwarden::LockError> {
//! use lockwarden::LockClient;
//! use std::time::Duration;
//!
//! let client = LockClient::in_memory(); // LockClient::connect("redis://…").await? for Redis
//! let guard = client.try_acquire("orders:42", Duration::from_secs(2)).await?;
//! let token = guard.fencing_token(); // give it to the resource you write to
//! guard.release().await?;
//! # let _ = token; Ok(()) }
//! ```
//!
//! | need | use |
//! |---|---|
//! | one at a time per key, across processes | [`LockClient::acquire`] / [`LockClient::try_acquire`] |
//! | do a piece of work once, hand its result to every retry | [`Lock::try_claim`] + [`LockGuard::complete`] |
//! | several keys at once | [`LockClient::multi_lock`] |
//! | first come, first served | [`LockClient::fair_lock`] |
//! | many readers or one writer | [`LockClient::rw_lock`] |
//! | at most N at once per key, across processes | [`LockClient::semaphore`] |
//! | a value only the newest holder may write | [`LockClient::fenced`] |
//! | a lock that survives a failover to a replica | [`LockClientBuilder::wait_for_replicas`] |
//! | locks shared with a JVM service on Redisson | [`LockClientBuilder::layout`] with [`KeyLayout::Redisson`] |
//! | a lock that outlives the loss of a Redis node | [`Redlock`] |
//! | HTTP requests by key | [`LockLayer`] |
//! | idempotent HTTP endpoints | [`LockLayer::remember`] |
//! | at most N concurrent HTTP requests per key (a tenant, an API key), across replicas | [`LimitLayer`] |
//! | at most N requests per unit of time per key, across replicas | [`LockClient::rate_limiter`]; over HTTP, [`RateLimitLayer`] |
//! | one value inside an axum handler | [`Locked<T>`], or [`Limited<T>`] for a limit |
//!
//! Each row's full promises are in
//! [`lockwarden_core`'s table](lockwarden_core#which-lock-for-which-job).
//!
//! # Guides
//!
//! - [`guide::connecting`]: one server, TLS, Redis Cluster, Sentinel, your own
//!   `redis::Client` or deadpool pool, and the ACL rules lockwarden needs.
//! - [`guide::how_it_works`]: each lock kind's keys, channels and scripts, the watchdog,
//!   waiting, lost replies, and the design decisions.
//! - [`guide::operating`]: memory policy, persistence and clocks, failover, force-unlock,
//!   shutdown, metrics, the inspector.
//!
//! The repository's `examples/` show an idempotent webhook receiver (`webhook`), per-order
//! serialization with [`Locked<T>`] and a streaming response (`orders`), a concurrency
//! limit and a rate limit per tenant across two instances (`tenant_limit`, `rate_limit`),
//! the metrics (`metrics`) and the engine alone (`quickstart`). The servers among them stop on SIGTERM or Ctrl-C
//! ([`shutdown_signal`]) and then shut their lock client down ([`LockClient::shutdown`]),
//! so a deploy leaves no lock behind.
//!
//! # Feature flags
//!
//! | feature | default | what it adds |
//! |---|---|---|
//! | `axum` | yes | the [`Locked<T>`] and [`Limited<T>`] extractors, [`LockLayer::by_path_param`] (and [`LimitLayer`]'s), and `IntoResponse` for [`Rejection`] and [`LockedRejection`] |
//! | `tls` | yes | `rediss://` URLs (TLS through rustls) and [`LockClientBuilder::tls_root_certificate`] / [`tls_client_identity`](LockClientBuilder::tls_client_identity) |
//! | `deadpool` | no | `LockClientBuilder::connect_pool` / `connect_deadpool`: commands through a `deadpool_redis::Pool` you already have |
//!
//! # Supported servers and Rust versions
//!
//! Redis 6.2 or later (every test runs on Redis 7.0) and Valkey 8 (the engine's suites run
//! on Valkey 8.1 too), as
//! one server, a Redis Cluster or a Sentinel-managed primary. The minimum supported Rust
//! version is 1.88.

#![cfg_attr(docsrs, feature(doc_cfg))]
#![warn(missing_docs)]

pub use lockwarden_core::*;

pub mod http;
mod signal;

pub use crate::signal::shutdown_signal;

#[cfg(feature = "axum")]
#[cfg_attr(docsrs, doc(cfg(feature = "axum")))]
pub use crate::http::{Guarded, LimitKey, Limited, LockKey, Locked, LockedRejection, StateLocked};

pub use crate::http::{
    default_client, Fingerprint, HeldBody, KeyedLayer, KeyedService, LimitLayer, LockLayer,
    MissingKey, PermitInfo, RateLimitLayer, Rejection,
};

// Compiles the Rust blocks of README.md as doctests (the crate's own docs are above).
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
