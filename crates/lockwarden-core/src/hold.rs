//! Holds: which kind of lock a holder holds, and the triple that names one hold.

use std::collections::HashMap;
use std::time::Duration;

use crate::holder::Holder;
use crate::key::Key;

/// Which side of a read-write lock a handle takes.
///
/// ```
/// # use lockwarden_core::{LockClient, RwMode};
/// let rw = LockClient::in_memory().rw_lock("stock");
/// assert_eq!(rw.read().mode(), RwMode::Read);
/// assert_eq!(rw.write().mode(), RwMode::Write);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RwMode {
    /// Shared with other readers.
    Read,
    /// Exclusive.
    Write,
}

impl RwMode {
    /// The suffix of this side's field in the lock hash (`<holder>:r`, `<holder>:w`).
    pub(crate) fn field_suffix(self) -> &'static str {
        match self {
            RwMode::Read => "r",
            RwMode::Write => "w",
        }
    }
}

/// A lock whose hash one holder has to itself: the plain lock, or the fair one (the same
/// hash, plus a queue of waiters). Only these keep a claim's outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Exclusive {
    /// The plain re-entrant lock.
    Plain,
    /// The fair lock: released to the head of its queue.
    Fair,
}

/// The kind of a hold: it picks the scripts that renew and release it. A read-write side
/// exists only on a read-write lock, so no operation can ask for one on a plain lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum HoldKind {
    /// A plain or fair lock.
    Exclusive(Exclusive),
    /// One side of a read-write lock.
    ReadWrite(RwMode),
    /// Permits of a semaphore, held by a holder made for them (never re-entered: each
    /// acquisition takes permits of its own): how many, and the lease their acquisition
    /// asked for (with the holder, they name the hold on Redis: see `permits_prelude.lua`).
    Permits { permits: u32, lease: Duration },
}

impl HoldKind {
    pub(crate) const PLAIN: HoldKind = HoldKind::Exclusive(Exclusive::Plain);
    pub(crate) const FAIR: HoldKind = HoldKind::Exclusive(Exclusive::Fair);

    /// The kind's name in logs: `plain`, `fair`, `read`, `write` or `permits`.
    pub(crate) fn name(self) -> &'static str {
        match self {
            HoldKind::Exclusive(Exclusive::Plain) => "plain",
            HoldKind::Exclusive(Exclusive::Fair) => "fair",
            HoldKind::ReadWrite(RwMode::Read) => "read",
            HoldKind::ReadWrite(RwMode::Write) => "write",
            HoldKind::Permits { .. } => "permits",
        }
    }
}

/// A map from holds, as this client keeps them (its live guards, the watchdog's
/// renewals), hashed with foldhash rather than std's SipHash: each lock cycle hashes its
/// hold five times (a key and a holder id, ~60 bytes), which cost SipHash ~3,400 of a
/// cycle's 43,000 client instructions (callgrind). Its seeds are random per process, and
/// a hold's holder id is this client's own, so keys chosen to collide cannot be
/// precomputed.
pub(crate) type HoldMap<V> = HashMap<Hold, V, foldhash::fast::RandomState>;

/// One hold: a holder's hold of one kind on one lock. Re-entries share it. `K` narrows
/// the kinds an operation accepts (completing a claim takes a `Hold<Exclusive>`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct Hold<K = HoldKind> {
    pub(crate) kind: K,
    pub(crate) key: Key,
    pub(crate) holder: Holder,
}
