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
        match self {
            Backend::Redis(r) => r.release(kind, key, holder, outcome).await,
            Backend::Memory(m) => Ok(m.release(kind, key, holder, outcome)),
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
