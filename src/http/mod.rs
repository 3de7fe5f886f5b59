//! The HTTP layers: admit each request by a key it carries, holding a distributed lock or
//! a permit of a per-key concurrency limit for the whole life of the request, or charging
//! it to per-key rate limits.
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
//! [`RateLimitLayer`] charges each request to its key's rate limits (a
//! [`RateLimiter`](crate::RateLimiter)'s policies) and holds nothing: at most so many per
//! unit of time across every replica, the others answered `429` with the IETF
//! `RateLimit` fields.
//!
//! Each is one [`KeyedLayer`], written once over its admission policy ([`Locking`],
//! [`Replaying`], [`Limiting`], [`RateLimiting`]): the same key sources, scopes, answers
//! to bad input, span and metrics. The pieces, for custom setups: [`KeyedService`] and its
//! [`ResponseFuture`] (what a layer wraps a service in), [`HeldBody`] (the response body
//! that holds the lock or permit until it ends), [`KeySource`] and [`PartsKey`] (where a
//! key comes from, with the built-in sources [`FromHeader`], [`FromPath`],
//! [`FromJsonField`], [`FromFn`], [`Global`] and, with the `axum` feature,
//! [`FromPathParam`]), [`Remember`] and [`Fingerprint`] (idempotent replay, see
//! [`LockLayer::remember`]), [`Rejection`] (every answer a layer gives itself), and the
//! process-wide [`default_client`].
//!
//! [`Holder`]: crate::Holder

mod admission;
mod body;
mod buffer;
mod client;
mod config;
mod future;
#[cfg(feature = "axum")]
mod guarded;
mod held;
mod hold;
mod key;
mod layer;
#[cfg(feature = "axum")]
mod limited;
mod limiting;
#[cfg(feature = "axum")]
mod locked;
mod locking;
mod metrics;
mod rate_limiting;
mod ratelimit_fields;
mod rejection;
mod remember;
mod replaying;
mod retry_after;
mod service;
mod trace;
mod unkeyed;

pub use admission::Admission;
pub use body::HeldBody;
pub use client::default_client;
pub use config::{MissingKey, DEFAULT_BODY_LIMIT, DEFAULT_LIMIT_PREFIX, DEFAULT_NAME_PREFIX};
pub use future::ResponseFuture;
#[cfg(feature = "axum")]
pub use guarded::{Guarded, LockedRejection};
#[cfg(feature = "axum")]
pub use key::FromPathParam;
pub use key::{
    Extracted, FromFn, FromHeader, FromJsonField, FromPath, Global, JsonKeyFuture, KeySource,
    PartsKey,
};
pub use layer::KeyedLayer;
#[cfg(feature = "axum")]
pub use limited::{LimitKey, Limited};
pub use limiting::{LimitLayer, Limiting, PermitInfo};
#[cfg(feature = "axum")]
pub use locked::{LockKey, Locked, StateLocked};
pub use locking::{LockLayer, Locking};
pub use rate_limiting::{RateLimitLayer, RateLimiting};
pub use ratelimit_fields::{RATELIMIT, RATELIMIT_POLICY};
pub use rejection::Rejection;
pub use remember::{
    Fingerprint, Remember, RememberFuture, DEFAULT_MAX_STORED_BODY, IDEMPOTENCY_REPLAYED,
};
pub use replaying::Replaying;
pub use service::KeyedService;
pub use unkeyed::Unkeyed;
