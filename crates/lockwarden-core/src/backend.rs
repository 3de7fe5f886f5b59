//! The two lock stores behind a client, and what their operations answer.

use std::sync::Arc;
use std::time::Duration;

use crate::error::BackendError;
use crate::holder::Holder;
use crate::key::Key;
use crate::memory::MemoryBackend;
use crate::redis::RedisBackend;

/// Which kind of lock a hold belongs to: it decides the scripts that renew and release it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Kind {
    /// The plain re-entrant lock (`acquire.lua`).
    Plain,
    /// The fair lock (`fair_acquire.lua`): the plain hash plus a queue of waiters.
    Fair,
    /// A read hold of a read-write lock (`rw_*.lua`).
    Read,
    /// The write hold of a read-write lock (`rw_*.lua`).
    Write,
}

impl Kind {
    /// The suffix of a read-write hold's field in the lock hash (`<holder>:r`, `<holder>:w`).
    pub(crate) fn side(self) -> &'static str {
        match self {
            Kind::Write => "w",
            Kind::Read | Kind::Plain | Kind::Fair => "r",
        }
    }
}

/// Answer of one acquire attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Attempt {
    /// Was free; now held with one entry and a fresh fencing token.
    Taken { token: u64 },
    /// Was held by the same holder; its count went up by one.
    Reentered { token: u64 },
    /// Held by another holder; `ttl` is its remaining lease (`None`: no expiry set).
    Busy { ttl: Option<Duration> },
    /// A claim found the work done: the outcome its holder stored (no lock was taken).
    Completed { outcome: Vec<u8> },
}

/// Answer of one attempt to take several locks at once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum MultiAttempt {
    /// Every lock is now held by the holder: the token of each, in the order asked.
    Taken { tokens: Vec<u64> },
    /// The lock at `index` is held by another holder (`ttl` as in [`Attempt::Busy`]);
    /// nothing was taken.
    Busy { index: usize, ttl: Option<Duration> },
}

/// Answer of one read-write acquire attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RwAttempt {
    /// A new hold of this holder (its first read or write hold), with its fencing token.
    Taken { token: u64 },
    /// This holder held this side already; its count went up by one.
    Reentered { token: u64 },
    /// Refused for now; retry on a notice or after `ttl` at the latest.
    Busy { ttl: Duration },
    /// A write asked by a holder that holds only the read side: it would wait for itself.
    Upgrade,
}

/// An outcome to store on release, completing a claim.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Outcome<'a> {
    pub bytes: &'a [u8],
    pub keep: Duration,
}

impl<'a> From<&'a (Vec<u8>, Duration)> for Outcome<'a> {
    fn from((bytes, keep): &'a (Vec<u8>, Duration)) -> Self {
        Self { bytes, keep: *keep }
    }
}

/// Answer of one release.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Released {
    /// The count reached zero: the lock is gone and waiters were told.
    Freed,
    /// The holder still holds it this many times.
    Remaining(u64),
    /// The holder did not hold it.
    NotHeld,
}

/// One lock for the watchdog to renew.
#[derive(Debug, Clone)]
pub(crate) struct Renewal {
    pub kind: Kind,
    pub key: Key,
    pub holder: Holder,
    pub lease: Duration,
}

#[derive(Clone)]
pub(crate) enum Backend {
    Redis(RedisBackend),
    Memory(Arc<MemoryBackend>),
}

impl Backend {
    /// One acquire attempt; a `claim` first looks for a stored outcome.
    pub(crate) async fn attempt(
        &self,
        key: &Key,
        holder: &Holder,
        lease: Duration,
        claim: bool,
    ) -> Result<Attempt, BackendError> {
        match self {
            Backend::Redis(r) => r.attempt(key, holder, lease, claim).await,
            Backend::Memory(m) => Ok(m.attempt(key, holder, lease, claim)),
        }
    }

    /// Releases one hold of `holder`, storing `outcome` with it if given.
    pub(crate) async fn release(
        &self,
        kind: Kind,
        key: &Key,
        holder: &Holder,
        outcome: Option<Outcome<'_>>,
    ) -> Result<Released, BackendError> {
        let released = match self {
            Backend::Redis(r) => r.release(kind, key, holder, outcome).await,
            Backend::Memory(m) => Ok(m.release(kind, key, holder, outcome)),
        };
        // The read-write scripts have nowhere to keep a claim's outcome, so the hold was
        // released without storing it (plain and fair locks store it).
        if matches!(kind, Kind::Read | Kind::Write) && outcome.is_some() {
            released?;
            return Err(BackendError::Protocol(
                "only plain locks store outcomes; the read-write hold was released without it"
                    .to_owned(),
            ));
        }
        released
    }

    /// One read (`Kind::Read`) or write (`Kind::Write`) attempt on a read-write lock; a
    /// refused writer stays registered as waiting for `register` (see `crate::rw`).
    pub(crate) async fn rw_attempt(
        &self,
        kind: Kind,
        key: &Key,
        holder: &Holder,
        lease: Duration,
        register: Duration,
    ) -> Result<RwAttempt, BackendError> {
        match self {
            Backend::Redis(r) => r.rw_attempt(kind, key, holder, lease, register).await,
            Backend::Memory(m) => Ok(m.rw.attempt(kind, key, holder, lease, register)),
        }
    }

    /// Drops `holder`'s registration as a waiting writer (it gave up).
    pub(crate) async fn rw_withdraw(&self, key: &Key, holder: &Holder) -> Result<(), BackendError> {
        match self {
            Backend::Redis(r) => r.rw_withdraw(key, holder).await,
            Backend::Memory(m) => {
                m.rw.withdraw(key, holder);
                Ok(())
            }
        }
    }

    /// How many times `holder` holds one side of a read-write lock.
    pub(crate) async fn rw_hold_count(
        &self,
        kind: Kind,
        key: &Key,
        holder: &Holder,
    ) -> Result<u64, BackendError> {
        match self {
            Backend::Redis(r) => r.rw_hold_count(kind, key, holder).await,
            Backend::Memory(m) => Ok(m.rw.hold_count(kind, key, holder)),
        }
    }

    /// Whether anyone holds a read-write lock.
    pub(crate) async fn rw_is_locked(&self, key: &Key) -> Result<bool, BackendError> {
        match self {
            // The hash expires with the latest hold's lease and goes with the last release.
            Backend::Redis(r) => r.is_locked(key).await,
            Backend::Memory(m) => Ok(m.rw.is_locked(key)),
        }
    }

    /// Takes (or re-enters) every lock in `keys` for `holder`, or none, in one step.
    pub(crate) async fn attempt_many(
        &self,
        keys: &[Key],
        holder: &Holder,
        lease: Duration,
    ) -> Result<MultiAttempt, BackendError> {
        match self {
            Backend::Redis(r) => r.attempt_many(keys, holder, lease).await,
            Backend::Memory(m) => Ok(m.attempt_many(keys, holder, lease)),
        }
    }

    /// Renews each lock if its holder still holds it; `Ok(false)` means it is gone.
    pub(crate) async fn renew_many(&self, renewals: &[Renewal]) -> Result<Vec<bool>, BackendError> {
        match self {
            Backend::Redis(r) => r.renew_many(renewals).await,
            Backend::Memory(m) => Ok(renewals.iter().map(|r| m.renew(r)).collect()),
        }
    }

    /// One attempt at a fair lock; `join` queues a waiter that does not get it.
    pub(crate) async fn fair_attempt(
        &self,
        key: &Key,
        holder: &Holder,
        lease: Duration,
        queue_timeout: Duration,
        join: bool,
    ) -> Result<Attempt, BackendError> {
        match self {
            Backend::Redis(r) => {
                r.fair_attempt(key, holder, lease, queue_timeout, join)
                    .await
            }
            Backend::Memory(m) => Ok(m.fair_attempt(key, holder, lease, queue_timeout, join)),
        }
    }

    /// Takes `holder` out of a fair lock's queue; whether it was in it.
    pub(crate) async fn fair_leave(
        &self,
        key: &Key,
        holder: &Holder,
    ) -> Result<bool, BackendError> {
        match self {
            Backend::Redis(r) => r.fair_leave(key, holder).await,
            Backend::Memory(m) => Ok(m.fair_leave(key, holder)),
        }
    }

    /// Waiters in a fair lock's queue.
    pub(crate) async fn fair_queued(&self, key: &Key) -> Result<usize, BackendError> {
        match self {
            Backend::Redis(r) => r.fair_queued(key).await,
            Backend::Memory(m) => Ok(m.fair_queued(key)),
        }
    }

    pub(crate) async fn force_unlock(&self, key: &Key) -> Result<bool, BackendError> {
        match self {
            Backend::Redis(r) => r.force_unlock(key).await,
            Backend::Memory(m) => Ok(m.force_unlock(key)),
        }
    }

    pub(crate) async fn hold_count(&self, key: &Key, holder: &Holder) -> Result<u64, BackendError> {
        match self {
            Backend::Redis(r) => r.hold_count(key, holder).await,
            Backend::Memory(m) => Ok(m.hold_count(key, holder)),
        }
    }

    pub(crate) async fn is_locked(&self, key: &Key) -> Result<bool, BackendError> {
        match self {
            Backend::Redis(r) => r.is_locked(key).await,
            Backend::Memory(m) => Ok(m.remaining_ttl(key).is_some()),
        }
    }

    pub(crate) async fn remaining_ttl(&self, key: &Key) -> Result<Option<Duration>, BackendError> {
        match self {
            Backend::Redis(r) => r.remaining_ttl(key).await,
            Backend::Memory(m) => Ok(m.remaining_ttl(key)),
        }
    }
}
