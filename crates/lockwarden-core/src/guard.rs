//! The guard of a held lock: its token, its lost signal, and its release.

use std::fmt;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use tokio::time::Instant;

use crate::engine::Engine;
use crate::error::LockError;
use crate::finish::Finish;
use crate::hold::{Hold, HoldKind};
use crate::holder::Holder;
use crate::key::Key;
use crate::lost::LostSignal;
use crate::metrics::{self, LostBecause, Operation};
use crate::options::HoldOptions;
use crate::settle::settle;
use crate::store::contract::{LockStore, Outcome, Reentries, Released, Renewal};
use crate::watchdog::Watched;

/// Proof that a lock is held. Dropping it releases the lock in the background; call
/// [`release`](Self::release) to release it and learn whether that worked.
///
/// ```
/// # use lockwarden_core::LockClient;
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lockwarden_core::LockError> {
/// let client = LockClient::in_memory();
/// let guard = client.acquire("payout:9").await?;
/// let token = guard.fencing_token(); // give this to the storage you write to
/// tokio::select! {
///     _ = guard.lost() => { /* stop: someone else may hold it now */ }
///     _ = async { /* the protected work */ } => {}
/// }
/// guard.release().await?;
/// # let _ = token; Ok(()) }
/// ```
#[must_use = "the lock is released as soon as the guard is dropped"]
pub struct LockGuard {
    engine: Arc<Engine>,
    hold: Hold,
    token: u64,
    lost: LostSignal,
    /// The watchdog registration generation; `None` with a fixed lease.
    watched: Option<u64>,
    /// When the acquire request was sent: the hold's start, in metrics.
    since: Instant,
    /// The fixed lease or the watchdog's: how long a lost release is retried at most.
    lease: Duration,
    /// Whether its holder was made for its acquisition, so nobody else acquired as it.
    fresh: bool,
    /// Whether its holder is its own: not shared with other guards (a multi-lock's
    /// guards share one, so one guard's holder may re-enter another's key).
    sole: bool,
    /// The semaphore permits it holds (0 for a lock), for the metrics.
    permits: u32,
    /// Its holder as handed out ([`holder`](Self::holder), [`info`](Self::info)): a copy
    /// of its own, so that the release can tell whether any clone of it is left, with
    /// which someone could have re-entered the hold (in this client or another).
    shown: OnceLock<Holder>,
    released: bool,
}

/// What the code running under a lock may want to know about it; cheap to clone.
#[derive(Clone, Debug)]
pub struct LockInfo {
    /// The lock's key.
    pub key: Key,
    /// Who holds it.
    pub holder: Holder,
    /// The fencing token of this hold (see [`LockGuard::fencing_token`]; 0 for a client
    /// built without them).
    pub fencing_token: u64,
    /// Fires if the lock is lost.
    pub lost: LostSignal,
}

impl LockInfo {
    /// The fencing token of this hold.
    pub fn fencing_token(&self) -> u64 {
        self.fencing_token
    }
}

impl LockGuard {
    /// The guard of `hold`, just taken with `token` by a request sent at `sent` (by a
    /// holder made for it if `fresh`): kept by the watchdog unless `options` give it a
    /// fixed lease.
    pub(crate) fn new(
        engine: Arc<Engine>,
        hold: (Hold, bool),
        token: u64,
        options: &HoldOptions,
        sent: Instant,
    ) -> Self {
        let watched = options
            .lease
            .is_none()
            .then(|| engine.watchdog().register(&hold.0, sent, options.max_hold));
        Self::held(engine, hold, token, options, sent, watched)
    }

    /// The guard of a fair lock `hold` granted to its waiter on release with `token`,
    /// held until `expires` unless renewed: the watchdog renews it in its next batch.
    /// Only for holds the watchdog keeps (a fixed lease is set by taking the grant up).
    pub(crate) fn granted(
        engine: Arc<Engine>,
        hold: (Hold, bool),
        token: u64,
        options: &HoldOptions,
        expires: Instant,
    ) -> Self {
        let watched = engine
            .watchdog()
            .register_granted(&hold.0, expires, options.max_hold);
        Self::held(engine, hold, token, options, Instant::now(), Some(watched))
    }

    /// A guard held since `since`: kept by the watchdog if `watched`, else until its
    /// fixed lease ends.
    fn held(
        engine: Arc<Engine>,
        (hold, fresh): (Hold, bool),
        token: u64,
        options: &HoldOptions,
        since: Instant,
        watched: Option<Watched>,
    ) -> Self {
        let lease = options.lease.unwrap_or_else(|| engine.watchdog().lease());
        let (watched, lost) = match watched {
            Some(watched) => (Some(watched.generation), LostSignal::watched(watched.lost)),
            None => (None, LostSignal::expiring(since + lease)),
        };
        engine.live().enter(&hold);
        Self {
            engine,
            hold,
            token,
            lost,
            watched,
            since,
            lease,
            fresh,
            sole: true,
            permits: 0,
            shown: OnceLock::new(),
            released: false,
        }
    }

    /// This guard's holder is shared with other guards (of one multi-lock): whoever got
    /// it from one of them may have re-entered this one's key.
    pub(crate) fn sharing_its_holder(mut self) -> Self {
        self.sole = false;
        self
    }

    /// This guard holds `permits` of a semaphore.
    pub(crate) fn holding_permits(mut self, permits: u32) -> Self {
        metrics::permits_held(f64::from(permits));
        self.permits = permits;
        self
    }

    /// How many permits of a semaphore this guard holds (see
    /// [`Semaphore::acquire_many`](crate::Semaphore::acquire_many)); 0 for a lock's guard.
    ///
    /// ```
    /// # use lockwarden_core::LockClient;
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lockwarden_core::LockError> {
    /// let client = LockClient::in_memory();
    /// let three = client.semaphore("workers", 5).acquire_many(3).await?;
    /// assert_eq!(three.permits(), 3);
    /// assert_eq!(client.acquire("door").await?.permits(), 0);
    /// # three.release().await }
    /// ```
    pub fn permits(&self) -> u32 {
        self.permits
    }

    /// The lock's key (a semaphore's name, for its permits).
    pub fn key(&self) -> &Key {
        &self.hold.key
    }

    /// The holder this guard holds the lock as.
    pub fn holder(&self) -> &Holder {
        self.shown.get_or_init(|| self.hold.holder.copy())
    }

    /// The fencing token of this hold (re-entries share their hold's token). Have the
    /// protected resource reject writes carrying a smaller token than one it has seen. 0
    /// for a plain hold of a client built [without fencing
    /// tokens](crate::LockClientBuilder::without_fencing_tokens).
    ///
    /// # When tokens strictly increase
    ///
    /// On Redis a token is one above the lock's last token, which its fencing key keeps
    /// (`INCR`), or, when that key is missing, the server's clock (`TIME`, µs since
    /// 1970). The key gets an expiry when it is written from the clock (the lease of that
    /// take); renewals, re-entries and the takes of fair and read-write locks and
    /// semaphores move it with their holds, a plain take (or claim, or multi-lock) does
    /// not, so it may run out while the lock is used. Each token costs Redis more than a
    /// microsecond to issue, so the clock is then past every token counted since the key
    /// was written. So a token is strictly greater than every token issued for the key
    /// before it if, when it was issued, **the fencing key still lived or the server's
    /// clock was past the last token**.
    ///
    /// Tokens can go backwards (or repeat) only when both fail: the key is gone (it ran
    /// out, or Redis lost it: a restart without persistence, a failover to a replica it
    /// had not reached, `FLUSHALL`, eviction) *and* the server's clock reads earlier than
    /// the last token (stepped back, or a new primary's clock behind the old one's).
    /// Across a restart the key survives with `appendonly yes` and `appendfsync always`
    /// (every token Redis answered); `everysec` may lose the last second's tokens, and
    /// RDB snapshots alone keep the token of the last snapshot, so the tokens issued
    /// after it are issued again. The in-process store keeps its last token for its whole
    /// life: its tokens always increase. (`tests/fencing_clock.rs` runs each case against
    /// a server whose clock is stepped back an hour.)
    pub fn fencing_token(&self) -> u64 {
        self.token
    }

    /// Whether the lock has been lost (see [`LostSignal`]).
    ///
    /// ```
    /// # use lockwarden_core::LockClient;
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lockwarden_core::LockError> {
    /// let client = LockClient::in_memory();
    /// let guard = client.acquire("ledger").await?;
    /// assert!(!guard.is_lost());
    /// client.lock("ledger").force_unlock().await?; // an operator frees it
    /// # guard.release().await.ok(); Ok(()) }
    /// ```
    pub fn is_lost(&self) -> bool {
        self.lost.is_lost()
    }

    /// Resolves once the lock has been lost: race it against the protected work.
    ///
    /// ```
    /// # use lockwarden_core::LockClient;
    /// # use std::time::Duration;
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lockwarden_core::LockError> {
    /// let client = LockClient::in_memory();
    /// let guard = client.lock("sync").lease(Duration::from_millis(10)).acquire().await?;
    /// tokio::select! {
    ///     () = guard.lost() => { /* the lease ran out: stop writing */ }
    ///     () = tokio::time::sleep(Duration::from_secs(5)) => unreachable!("the work outlived its lease"),
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn lost(&self) {
        self.lost.wait().await;
    }

    /// A cloneable handle on the lost signal, to move into other tasks.
    ///
    /// ```
    /// # use lockwarden_core::LockClient;
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lockwarden_core::LockError> {
    /// let client = LockClient::in_memory();
    /// let guard = client.acquire("export").await?;
    /// let lost = guard.lost_signal();
    /// let worker = tokio::spawn(async move { lost.is_lost() });
    /// assert!(!worker.await.unwrap());
    /// guard.release().await
    /// # }
    /// ```
    pub fn lost_signal(&self) -> LostSignal {
        self.lost.clone()
    }

    /// Key, holder, token and lost signal in one cloneable value.
    pub fn info(&self) -> LockInfo {
        LockInfo {
            key: self.hold.key.clone(),
            holder: self.holder().clone(),
            fencing_token: self.token,
            lost: self.lost.clone(),
        }
    }

    /// Releases one hold (a re-entered lock stays held by the outer holds), and wakes a
    /// waiter when the lock becomes free.
    ///
    /// A release that meets a connection Redis closed (a restart, a failover, a reset) is
    /// sent once more on the new connection, within the command timeout, when a second
    /// run answers as the first would: this guard's holder was made for its acquisition,
    /// never shared with another guard, and its hold has a fencing token (a second run
    /// finds the hold gone and the token still the lock's last: released). So right
    /// after a restart it answers Ok, or [`LockError::NotHeld`] / [`LockError::Lost`] if
    /// the restart wiped the hold, not a connection error. Any other release (it may
    /// count down a re-entry) is not sent twice on one server or Sentinel: it answers
    /// [`LockError::Backend`], and is sent again in the background only if its count was
    /// surely 1.
    ///
    /// # Errors
    /// [`LockError::Lost`] if the lock was lost before the release, [`LockError::NotHeld`]
    /// if this holder does not hold it, [`LockError::Backend`] if Redis failed (the lock
    /// then expires with its lease).
    pub async fn release(self) -> Result<(), LockError> {
        self.finish(None).await
    }

    /// Completes a claim (see [`Lock::try_claim`](crate::Lock::try_claim)): stores
    /// `outcome` under the lock's key for `keep`, releases this hold and wakes every
    /// waiting claim, all in one step. Until `keep` runs out, claims of the key get the
    /// outcome instead of the lock. Nothing is stored unless this holder still holds the
    /// lock, so a holder that lost it cannot overwrite the outcome of the one that took over.
    ///
    /// ```
    /// # use lockwarden_core::{Claim, LockClient};
    /// # use std::time::Duration;
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lockwarden_core::LockError> {
    /// let client = LockClient::in_memory();
    /// if let Claim::Acquired(guard) = client.lock("import:7").try_claim(Duration::ZERO).await? {
    ///     guard.complete(b"imported 310 rows", Duration::from_secs(3600)).await?;
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As [`release`](Self::release); on an error nothing was stored.
    /// [`LockError::NotClaimable`] for the guard of a read-write lock (which keeps no
    /// outcome): the hold is released, nothing is stored.
    pub async fn complete(
        self,
        outcome: impl Into<Vec<u8>>,
        keep: Duration,
    ) -> Result<(), LockError> {
        self.finish(Some((outcome.into(), keep))).await
    }

    /// Moves the end of a fixed-lease hold to `lease` from now, if it is still held (or
    /// later: a renewal never shortens a hold another guard of it asked longer for). A
    /// hold the watchdog keeps is left to it.
    ///
    /// Re-entries share one expiry, so this moves theirs too.
    pub(crate) async fn extend(&mut self, lease: Duration) -> Result<(), LockError> {
        let lost = || LockError::Lost {
            key: self.hold.key.name().to_owned(),
        };
        if self.watched.is_some() {
            return Ok(());
        }
        if self.lost.is_lost() {
            return Err(lost());
        }
        let sent = Instant::now();
        let renewal = [Renewal {
            hold: self.hold.clone(),
            lease,
        }];
        let renewed = self.engine.store().renew_all(&renewal).await;
        if let Some(error) = renewed.error {
            return Err(error.into());
        }
        if renewed.held.first() == Some(&Some(true)) && self.lost.extend_to(sent + lease) {
            return Ok(());
        }
        self.lost.mark_lost();
        Err(lost())
    }

    async fn finish(mut self, outcome: Option<(Vec<u8>, Duration)>) -> Result<(), LockError> {
        let (last, reentries) = self.end_counted();
        // 0 is no token (a client without them): nothing in the store to compare with.
        let token = (self.token != 0).then_some(self.token);
        let (engine, hold) = (self.engine.clone(), self.hold.clone());
        let completes = outcome.is_some();
        // Finished in the background if the caller stops waiting (an aborted task, a lost
        // `select!`): otherwise the command might never be sent, leaving the lock held for
        // its lease by a guard that already counts as released.
        let released = match (outcome, hold.kind) {
            (Some((bytes, keep)), HoldKind::Exclusive(kind)) => {
                let Hold { key, holder, .. } = hold;
                let hold = Hold { kind, key, holder };
                Finish::new(async move {
                    let outcome = Outcome {
                        bytes: &bytes,
                        keep,
                    };
                    engine.store().complete(&hold, token, outcome).await
                })
                .await
            }
            (outcome, _) => {
                let released =
                    Finish::new(
                        async move { engine.store().release(&hold, token, reentries).await },
                    );
                if outcome.is_some() {
                    released.await?;
                    return Err(LockError::NotClaimable {
                        key: self.hold.key.name().to_owned(),
                    });
                }
                released.await
            }
        };
        tracing::debug!(key = %self.hold.key, kind = self.hold.kind.name(), ?released, completes, "lock release");
        if let Err(error) = &released {
            metrics::backend_error(Operation::Release, error);
            // No answer: the release may not have run. With a count of 1, sending it
            // again is exact (a no-op if it ran), so it is, in the background, until
            // Redis answers; a re-entered hold's count must not drop twice.
            if error.is_transient() && last {
                let hold = vec![self.hold.clone()];
                settle(self.engine.store().clone(), hold, None, self.lease);
            }
        }
        match released? {
            Released::Freed | Released::Remaining(_) => Ok(()),
            _ if self.lost.is_lost() => Err(LockError::Lost {
                key: self.hold.key.name().to_owned(),
            }),
            // Nobody took the lock since this hold's token and no loss was seen: this
            // release had run already (sent again by a cluster client).
            Released::Ended => Ok(()),
            Released::NotHeld => Err(LockError::NotHeld {
                key: self.hold.key.name().to_owned(),
            }),
        }
    }

    /// Ends this guard (see [`end`](Self::end)) before its release. Returns whether it
    /// was the last guard of a hold whose holder was made for it (the count in the store
    /// was 1, unless a task re-acquired as `holder()` meanwhile, see the design decisions in `guide/how_it_works.md`), and
    /// whether anyone may have re-entered the hold: not if its holder is its own and
    /// never left this guard, or every clone handed out is gone (a re-entry's guard, its
    /// release still under way and an acquisition in flight each keep one), since nobody,
    /// in this client or another, can acquire as it then.
    fn end_counted(&mut self) -> (bool, Reentries) {
        let last = self.end() == 0 && self.fresh;
        let reentries = match self.shown.get_mut() {
            _ if !(last && self.sole) => Reentries::Possible,
            None => Reentries::None,
            Some(copy) => match copy.is_unique() {
                true => Reentries::NoneLeft,
                false => Reentries::Possible,
            },
        };
        (last, reentries)
    }

    /// The hold ends here (released or dropped): the watchdog lets go of it, and the
    /// metrics learn how long it was held and whether a fixed lease ran out first (the
    /// watchdog reports the holds it loses itself).
    /// Ends this guard here; returns how many guards of its hold this client has left.
    fn end(&mut self) -> u32 {
        self.released = true;
        let kind = self.hold.kind.name();
        metrics::held(kind, self.since.elapsed());
        if self.permits > 0 {
            metrics::permits_held(-f64::from(self.permits));
        }
        match self.watched.take() {
            Some(generation) => self.engine.watchdog().unregister(&self.hold, generation),
            None if self.lost.is_lost() => metrics::lost(kind, LostBecause::LeaseEnded),
            None => {}
        }
        self.engine.live().leave(&self.hold)
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        if self.released {
            return;
        }
        // As in `finish`: the last guard of a hold whose holder was made for it may have
        // its release sent again, until the hold would have run out anyway.
        let (last, reentries) = self.end_counted();
        let resend_until = last.then(|| Instant::now() + self.lease);
        self.engine
            .store()
            .release_later(self.hold.clone(), resend_until, reentries);
    }
}

impl fmt::Debug for LockGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockGuard")
            .field("key", &self.hold.key)
            .field("holder", &self.hold.holder)
            .field("kind", &self.hold.kind.name())
            .field("fencing_token", &self.token)
            .field("lost", &self.is_lost())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `finish` boxes the store's release future on every release. glibc's per-thread
    /// cache serves blocks of up to 1,032 bytes; a larger one takes the arena's slower
    /// path, and the future is copied into it besides (it was 2 KB once).
    #[test]
    fn a_release_future_fits_the_allocators_thread_cache() {
        fn size_of_future<R>(_: impl FnOnce(Arc<Engine>, Hold) -> R) -> usize {
            std::mem::size_of::<R>()
        }
        let boxed = size_of_future(|engine: Arc<Engine>, hold: Hold| async move {
            engine.store().release(&hold, None, Reentries::None).await
        });
        assert!(boxed <= 1032, "a release's future takes {boxed} bytes");
    }
}
