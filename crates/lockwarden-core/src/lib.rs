//! Redisson-style distributed locks on Redis, for async Rust.
//!
//! A lock is a Redis hash whose field is the holder's id and whose value is its re-entry
//! count; Lua scripts acquire, re-enter, renew and release it in one round trip each. A
//! lock held without an explicit lease is kept alive by the client's watchdog; waiters
//! sleep until a release notice on pub/sub (or the holder's lease end) instead of polling;
//! every fresh acquisition carries a fencing token. [`LockClient::in_memory`] offers the
//! same semantics in-process.
//!
//! ```
//! use lockwarden_core::{LockClient, LockError};
//! use std::time::Duration;
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), LockError> {
//! let client = LockClient::in_memory(); // or LockClient::connect("redis://127.0.0.1/").await?
//! let guard = client.try_acquire("orders:42", Duration::from_secs(2)).await?;
//! assert!(matches!(
//!     client.try_acquire("orders:42", Duration::ZERO).await,
//!     Err(LockError::Timeout { .. })
//! ));
//! guard.release().await?;
//! # Ok(()) }
//! ```

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
mod rw;
mod semaphore;
mod target;

mod builder;
mod client;

mod redlock;

/// The Redis client crate lockwarden is built on, for [`LockClientBuilder::connect_client`]
/// and the errors in [`BackendError::Redis`].
pub use redis;

pub use builder::LockClientBuilder;
pub use client::{ClientStats, LockClient};
pub use error::{BackendError, KeyError, LockError, RedlockError, ShutdownError};
pub use fair::{FairLock, DEFAULT_QUEUE_TIMEOUT};
pub use fenced::FencedValue;
pub use guard::{LockGuard, LockInfo};
pub use hold::RwMode;
pub use holder::{Holder, Scoped};
pub use key::{Key, KeyLayout, DEFAULT_MAX_KEY_LEN, DEFAULT_NAMESPACE};
pub use lock::{Claim, Lock};
pub use lost::LostSignal;
pub use multi::{MultiGuard, MultiLock};
pub use redlock::{Redlock, RedlockBuilder, RedlockGuard, RedlockLock};
pub use rw::{RwLock, RwLockHandle};
pub use semaphore::{Semaphore, SemaphoreState, MAX_PERMITS};
pub use store::redis::ReleaseNotices;
