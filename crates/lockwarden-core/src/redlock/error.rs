//! What can go wrong with a Redlock beyond what a single-node lock reports.

use std::time::Duration;

/// Why a [`Redlock`](crate::Redlock) operation failed; reached through
/// [`LockError::Redlock`](crate::LockError::Redlock).
///
/// A lock that another holder keeps for the whole wait budget is still reported as
/// [`LockError::Timeout`](crate::LockError::Timeout), and a lock whose validity ran out as
/// [`LockError::Lost`](crate::LockError::Lost), as for single-node locks.
///
/// ```
/// use lockwarden_core::{LockError, Redlock, RedlockError};
///
/// // No nodes at all is refused before anything is sent.
/// match Redlock::new(Vec::new()) {
///     Err(LockError::Redlock(RedlockError::InvalidNodes { nodes: 0, .. })) => {}
///     other => panic!("expected a refusal, got {other:?}"),
/// }
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RedlockError {
    /// Fewer than a majority of the nodes granted the request (acquire, extend or
    /// release), and no other holder was seen: nodes are down, slow or partitioned.
    #[error(
        "lock `{key}`: only {granted} of {nodes} Redis nodes granted it and {needed} are needed; \
         the others are down, slow or did not hold it"
    )]
    NoQuorum {
        /// The lock's name.
        key: String,
        /// Nodes that granted it.
        granted: usize,
        /// The majority needed.
        needed: usize,
        /// Nodes configured.
        nodes: usize,
    },
    /// A majority granted the lock or its extension, but only after its validity had run out
    /// (the nodes answered too slowly for the lease); it was released again.
    #[error(
        "lock `{key}`: a majority answered after {elapsed:?}, too late for a lease of {lease:?}; \
         use a longer lease or a shorter node timeout"
    )]
    TooSlow {
        /// The lock's name.
        key: String,
        /// How long the round took.
        elapsed: Duration,
        /// The lease asked for.
        lease: Duration,
    },
    /// The guard was already extended as often as
    /// [`RedlockBuilder::max_extensions`](crate::RedlockBuilder::max_extensions) allows; it
    /// stays valid until [`RedlockGuard::valid_until`](crate::RedlockGuard::valid_until).
    #[error("lock `{key}` was already extended {max} times, the configured cap")]
    ExtensionLimit {
        /// The lock's name.
        key: String,
        /// The cap.
        max: u32,
    },
    /// The node list cannot make a Redlock (none, an even count, a duplicate, an in-process
    /// client).
    #[error("cannot build a Redlock over {nodes} nodes: {reason}")]
    InvalidNodes {
        /// Nodes given.
        nodes: usize,
        /// What is wrong with them.
        reason: &'static str,
    },
    /// The settings contradict each other (e.g. a node timeout as long as the lease).
    #[error("invalid Redlock settings: {0}")]
    InvalidSettings(&'static str),
}
