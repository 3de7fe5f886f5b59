//! Redlock: one lock over N independent Redis masters, held only while a majority of them
//! grant it. Each node is an ordinary [`LockClient`](crate::LockClient): a round takes the
//! node's plain lock with a fixed lease through its public handle, so Redlock adds only the
//! majority, the validity and the waiting on every node's notices. The algorithm, and what
//! it does and does not promise, are documented on [`Redlock`].
//!
//! | file | owns |
//! |---|---|
//! | `client.rs` | [`Redlock`]: the node set, and lock handles on it |
//! | `builder.rs` | [`RedlockBuilder`]: settings, connecting, checking the nodes |
//! | `nodes.rs` | the node clients and the settings every handle and guard shares |
//! | `lock.rs` | [`RedlockLock`]: the acquire loop |
//! | `round.rs` | one round: a majority within the validity, or undo everywhere |
//! | `guard.rs` | [`RedlockGuard`]: validity, extensions, lost signal, release |

mod builder;
mod client;
mod guard;
mod lock;
mod nodes;
mod round;

pub use builder::RedlockBuilder;
pub use client::Redlock;
pub use guard::RedlockGuard;
pub use lock::RedlockLock;
