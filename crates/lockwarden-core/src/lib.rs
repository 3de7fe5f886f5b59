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

mod backend;
mod client;
mod detach;
mod error;
mod fair;
mod guard;
mod holder;
mod key;
mod lock;
mod lost;
mod memory;
mod multi;
mod redis;
mod redlock;
mod rw;
mod wait;
mod waiters;
mod watchdog;

pub use client::{ClientStats, LockClient, LockClientBuilder};
pub use error::{BackendError, KeyError, LockError};
pub use fair::{FairLock, DEFAULT_QUEUE_TIMEOUT};
pub use guard::{LockGuard, LockInfo};
pub use holder::{Holder, Scoped};
pub use key::{Key, KeyLayout, DEFAULT_MAX_KEY_LEN, DEFAULT_NAMESPACE};
pub use lock::{Claim, Lock};
pub use lost::LostSignal;
pub use multi::{MultiGuard, MultiLock};
pub use redlock::{Redlock, RedlockBuilder, RedlockError, RedlockGuard, RedlockLock};
pub use rw::{RwLock, RwLockHandle, RwMode};
