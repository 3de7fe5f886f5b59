//! One lock to acquire as one holder with its options: what the plain, fair and
//! read-write attempts share (each adds only its way of asking).

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::acquire::{Answer, Busy, Tried};
use crate::engine::Engine;
use crate::error::{BackendError, LockError};
use crate::finish::BoxFuture;
use crate::guard::LockGuard;
use crate::hold::{Hold, HoldKind};
use crate::holder::Holder;
use crate::key::Key;
use crate::metrics::Acquired;
use crate::options::HoldOptions;
use crate::settle::settle;
use crate::store::contract::{Acquire, Attempt, How, LockStore, Refusal, Waiter};

pub(crate) struct Target<'a> {
    pub(crate) engine: &'a Arc<Engine>,
    pub(crate) key: &'a Key,
    pub(crate) holder: Holder,
    /// Whether `holder` was made for this acquisition (see [`Target::forget_holder`]).
    fresh: bool,
    /// Whether an attempt was refused, so that the next ones wait (see
    /// [`Acquire::waiting`]); set by the kinds that mark the lock.
    pub(crate) waiting: bool,
    lease: Duration,
    options: &'a HoldOptions,
}

impl<'a> Target<'a> {
    /// `key`, to be acquired with `options` (their holder and lease resolved now).
    pub(crate) fn new(engine: &'a Arc<Engine>, key: &'a Key, options: &'a HoldOptions) -> Self {
        let (holder, fresh) = options.holder(engine);
        Self {
            engine,
            key,
            holder,
            fresh,
            waiting: false,
            lease: options.lease(engine),
            options,
        }
    }

    /// `key`, to be acquired with `options` by a holder made for this acquisition, whatever
    /// holder the options or the enclosing scope give: a semaphore's permits, which are
    /// never re-entered.
    pub(crate) fn fresh(engine: &'a Arc<Engine>, key: &'a Key, options: &'a HoldOptions) -> Self {
        Self {
            engine,
            key,
            holder: engine.holder(),
            fresh: true,
            waiting: false,
            lease: options.lease(engine),
            options,
        }
    }

    /// After an attempt that got no answer: if the holder was made for this acquisition,
    /// settles in the background what the attempt may have taken (a `kind` hold) or left
    /// (its place as `waiter`), and goes on as a new holder. Returns whether it did; a
    /// holder the caller gave may hold the lock already, so what the attempt did cannot be
    /// told apart and runs out with the lease.
    pub(crate) fn forget_holder(&mut self, kind: HoldKind, waiter: Option<Waiter>) -> bool {
        if !self.fresh {
            return false;
        }
        let holder = std::mem::replace(&mut self.holder, self.engine.holder());
        let hold = Hold {
            kind,
            key: self.key.clone(),
            holder,
        };
        settle(self.engine.store().clone(), vec![hold], waiter, self.lease);
        true
    }

    /// One attempt in the way `how`: the store's answer, and when it was asked for (a
    /// fixed lease counts from then).
    pub(crate) async fn ask(&self, how: How) -> Result<(Attempt, Instant), BackendError> {
        let sent = Instant::now();
        let ask = Acquire {
            key: self.key,
            holder: &self.holder,
            lease: self.lease,
            how,
            fresh: self.fresh,
            fenced: self.engine.fenced(),
            waiting: self.waiting,
        };
        Ok((self.engine.store().acquire(&ask).await?, sent))
    }

    /// The loop's view of an answer narrowed to its kind (a `kind` hold): a taken or
    /// re-entered lock is a guard, a refusal to wait is busy. The refusal only its kind
    /// gets (`R`) is handed back for the kind to say what it means.
    pub(crate) fn tried<R>(
        &self,
        (attempt, sent): (Attempt<R>, Instant),
        kind: HoldKind,
    ) -> Result<Tried<LockGuard>, R> {
        let (token, how_won) = match attempt {
            Attempt::Taken { token } => (token, Acquired::Taken),
            Attempt::Reentered { token } => (token, Acquired::Reentered),
            Attempt::Busy { ttl } => return Ok(Tried::Busy(Busy { lock: 0, ttl })),
            Attempt::Refused(refused) => return Err(refused),
        };
        let hold = Hold {
            kind,
            key: self.key.clone(),
            holder: self.holder.clone(),
        };
        let hold = (hold, self.fresh);
        let guard = LockGuard::new(self.engine.clone(), hold, token, self.options, sent);
        Ok(Tried::Won(guard, how_won))
    }

    /// The guard of a `kind` hold a release handed to this waiter, told on `channel` (see
    /// `Waiters::deliver`), which holds until `expires` unless renewed. `None` if there is
    /// none, or if it must be taken up with an attempt instead: a holder the caller gave
    /// may wait in several tasks at once (each must count once), a fixed lease is set by
    /// the attempt, and a grant past `expires` (or of unknown age) may be gone.
    pub(crate) fn granted(
        &self,
        kind: HoldKind,
        channel: &str,
        expires: Option<Instant>,
    ) -> Option<LockGuard> {
        let token = self
            .engine
            .waiters()
            .take_grant(channel, self.holder.id())?;
        // A grant that may have run out already (a waiter kept from running that long) is
        // checked with an attempt rather than believed.
        let expires = expires.filter(|&at| at > Instant::now())?;
        if !self.fresh || self.options.lease.is_some() {
            return None;
        }
        let hold = Hold {
            kind,
            key: self.key.clone(),
            holder: self.holder.clone(),
        };
        let (engine, options) = (self.engine.clone(), self.options);
        Some(LockGuard::granted(
            engine,
            (hold, true),
            token,
            options,
            expires,
        ))
    }

    /// The lease asked for: the fixed one, or the watchdog's.
    pub(crate) fn lease(&self) -> Duration {
        self.lease
    }

    /// Asks once in the way `how`, whose store answer `narrow` narrows to its kind (see
    /// [`Attempt::narrowed`]); `refused` says what its kind's refusal means.
    pub(crate) async fn try_once<R>(
        &self,
        how: How,
        narrow: impl FnOnce(Refusal) -> Option<R>,
        refused: impl FnOnce(R) -> LockError,
    ) -> Answer<LockGuard> {
        let (attempt, sent) = self.ask(how).await?;
        let attempt = attempt.narrowed(how, narrow)?;
        Ok(self
            .tried((attempt, sent), how.kind(self.lease))
            .unwrap_or_else(|r| Tried::Refused(refused(r))))
    }

    /// Takes the waiter out of the store: what a fair or write waiter leaves behind.
    pub(crate) fn withdraw(&self, waiter: Waiter) -> BoxFuture {
        let (engine, key, holder) = (self.engine.clone(), self.key.clone(), self.holder.clone());
        Box::pin(async move {
            if let Err(error) = engine.store().withdraw(waiter, &key, &holder).await {
                tracing::debug!(%key, %error, ?waiter,
                    "could not withdraw a waiter; its place runs out by itself");
            }
        })
    }
}
