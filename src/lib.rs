//! Request-scoped distributed locks for Rust web services.
//!
//! This crate re-exports the lock engine of [`lockwarden_core`].
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lockwarden::LockError> {
//! let client = lockwarden::LockClient::in_memory();
//! let guard = client.acquire("orders:42").await?;
//! guard.release().await?;
//! # Ok(()) }
//! ```

pub use lockwarden_core::*;
