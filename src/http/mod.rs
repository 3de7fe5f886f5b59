//! The HTTP layers: hold a distributed lock, or a permit of a per-key concurrency limit,
//! for the whole life of a request.
//!
//! [`LockLayer`] is a tower layer for any `http` service. For each request it takes a key
//! from the request (a header, the path, an axum path parameter, a JSON field of the body,
//! or a closure), optionally prefixes it with a scope (e.g. the authenticated principal),
//! acquires the lock within a wait budget, runs the inner service as one [`Holder`] and
//! keeps the lock until the response body has been sent (or dropped). A request that
//! finds the lock busy is answered `409 Conflict` (or `423 Locked`) with a `Retry-After`
//! header and an RFC 9457 `application/problem+json` body, without reaching the handler.
//!
//! ```
//! use axum::{routing::post, Router};
//! use lockwarden::LockLayer;
//!
//! async fn handle_payment() -> &'static str { "processed" }
//!
//! let app: Router = Router::new()
//!     .route("/webhooks/payments", post(handle_payment))
//!     .layer(LockLayer::by_header("Idempotency-Key"));
//! ```
//!
//! [`LimitLayer`] holds a semaphore permit instead: at most N requests with one key at
//! once across every replica, the others answered `429 Too Many Requests`.
//!
//! The pieces, for custom setups: [`LockService`] and its [`ResponseFuture`] (what a
//! layer wraps a service in), [`LockedBody`] (the response body that holds the lock until
//! it ends), [`KeySource`] and [`PartsKey`] (where a key comes from, with the built-in
//! sources [`FromHeader`], [`FromPath`], [`FromJsonField`], [`FromFn`], [`Global`] and,
//! with the `axum` feature, [`FromPathParam`]), [`Remember`] and [`Fingerprint`] (idempotent
//! replay, see [`LockLayer::remember`]), and the process-wide [`default_client`].
//!
//! [`Holder`]: crate::Holder

mod body;
mod buffer;
mod client;
mod config;
#[cfg(feature = "axum")]
mod extract;
mod future;
mod held;
mod key;
mod layer;
mod limit;
mod metrics;
mod rejection;
mod remember;
mod retry_after;
mod service;
mod settings;
mod trace;

pub use body::LockedBody;
pub use client::default_client;
pub use config::{MissingKey, DEFAULT_BODY_LIMIT, DEFAULT_LIMIT_PREFIX, DEFAULT_NAME_PREFIX};
#[cfg(feature = "axum")]
pub use extract::{Guarded, LimitKey, Limited, LockKey, Locked, LockedRejection, StateLocked};
pub use future::ResponseFuture;
#[cfg(feature = "axum")]
pub use key::FromPathParam;
pub use key::{
    Extracted, FromFn, FromHeader, FromJsonField, FromPath, Global, JsonKeyFuture, KeySource,
    PartsKey,
};
pub use layer::LockLayer;
pub use limit::{LimitLayer, PermitInfo};
pub use rejection::LockRejection;
pub use remember::{
    Fingerprint, Remember, RememberFuture, DEFAULT_MAX_STORED_BODY, IDEMPOTENCY_REPLAYED,
};
pub use service::LockService;
