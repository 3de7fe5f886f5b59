//! The HTTP layer: hold a distributed lock for the whole life of a request.
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
//! | file | owns |
//! |---|---|
//! | `layer.rs` | [`LockLayer`] and its builder methods |
//! | `config.rs` | the settings a layer shares with its services and futures: [`MissingKey`], the defaults, lock names |
//! | `service.rs` | [`LockService`] |
//! | `future.rs` | [`ResponseFuture`]: extract the key, acquire, call the inner service |
//! | `held.rs` | a held lock: stores the recorded response, then releases, in order |
//! | `body.rs` | [`LockedBody`]: the response body that holds the lock until it ends |
//! | `key.rs` | where a key comes from ([`KeySource`] and its implementations, [`Extracted`]) |
//! | `remember/` | idempotency ([`LockLayer::remember`]): [`Remember`], [`Fingerprint`], recording, storing and replaying responses |
//! | `rejection.rs` | [`LockRejection`]: the problem responses |
//! | `buffer.rs` | reading a request body up to a limit |
//! | `client.rs` | the process-wide [`default_client`] |
//! | `trace.rs` | the request span |
//! | `metrics.rs` | the requests counter, by route, outcome and status |
//! | `extract.rs` | the [`Locked`] extractor (feature `axum`) |
//!
//! Imports point one way: the layer builds the service, the service the future; both read
//! `config.rs`, never `layer.rs`. The request's fingerprint rides in its [`Extracted`]
//! key; the response side reaches `remember/` through `held.rs`, and `remember/` imports
//! neither the body nor the future.
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
