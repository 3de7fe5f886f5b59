//! Request-scoped distributed locks for Rust web services.
//!
//! This crate re-exports the lock engine of [`lockwarden_core`] and adds the HTTP layer
//! ([`http`]): a tower [`LockLayer`] that serializes requests by a key taken from the
//! request, and (with the default `axum` feature) the [`Locked`] extractor.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lockwarden::LockError> {
//! let client = lockwarden::LockClient::in_memory();
//! let guard = client.acquire("orders:42").await?;
//! guard.release().await?;
//! # Ok(()) }
//! ```

pub use lockwarden_core::*;

pub mod http;

#[cfg(feature = "axum")]
pub use crate::http::{Guarded, LimitKey, Limited, LockKey, Locked, LockedRejection, StateLocked};

pub use crate::http::{
    default_client, Fingerprint, LimitLayer, LockLayer, LockRejection, LockService, LockedBody,
    MissingKey, PermitInfo,
};
