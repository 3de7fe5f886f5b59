//! [`Lock`], a handle on one named plain lock: configure it, acquire it (or claim the work
//! it guards), inspect it; and its attempts for the acquire loop.

use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::acquire::{self, Answer, Attempts, Tried};
use crate::engine::Engine;
use crate::error::{BackendError, KeyError, LockError};
use crate::guard::LockGuard;
use crate::hold::{Hold, HoldKind};
use crate::holder::Holder;
use crate::inspect::exclusive_inspection;
use crate::key::Key;
use crate::metrics::Acquired;
use crate::options::{hold_options, HoldOptions};
use crate::store::contract::{Attempt, How, LockStore, Reentries, Refusal};
use crate::target::Target;

/// What [`Lock::try_claim`] found: the lock, to do the work, or the outcome of the work
/// done before under the same key.
#[derive(Debug)]
#[must_use = "a claim holds the lock, or carries an outcome to answer with"]
pub enum Claim {
    /// The work is not done yet: do it, then [`LockGuard::complete`] with its outcome.
    Acquired(LockGuard),
    /// The work was done: the outcome its holder stored.
    Completed(Vec<u8>),
}

/// One named lock, made by [`LockClient::lock`](crate::LockClient::lock). Set options, then acquire or inspect.
///
/// ```
/// # use lockwarden_core::LockClient;
/// # use std::time::Duration;
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lockwarden_core::LockError> {
/// let client = LockClient::in_memory();
/// let guard = client
///     .lock("export:2026-11")
///     .lease(Duration::from_secs(60)) // fixed lease: expires by itself, no watchdog
///     .try_acquire(Duration::from_millis(500))
///     .await?;
/// assert!(client.lock("export:2026-11").is_locked().await?);
/// guard.release().await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
#[must_use = "a Lock does nothing until it is acquired or inspected"]
pub struct Lock {
    engine: Arc<Engine>,
    key: Result<Key, KeyError>,
    options: HoldOptions,
}

hold_options!(Lock, "client.lock(\"report\")");
exclusive_inspection!(Lock, "client.lock(\"door\")");

impl Lock {
    pub(crate) fn new(engine: Arc<Engine>, key: Result<Key, KeyError>) -> Self {
        Self {
            engine,
            key,
            options: HoldOptions::default(),
        }
    }

    /// The validated key.
    ///
    /// ```
    /// # use lockwarden_core::LockClient;
    /// let client = LockClient::in_memory();
    /// assert_eq!(client.lock("a").key().unwrap().redis_key(), "lockwarden:{a}");
    /// assert!(client.lock("").key().is_err());
    /// ```
    ///
    /// # Errors
    /// [`LockError::InvalidKey`] if the name was rejected.
    pub fn key(&self) -> Result<&Key, LockError> {
        checked(&self.key)
    }

    /// Acquires the lock, waiting as long as it takes (also through a Redis outage, retrying
    /// with backoff: use [`try_acquire`](Self::try_acquire) for a bound).
    ///
    /// ```
    /// # use lockwarden_core::LockClient;
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lockwarden_core::LockError> {
    /// let client = LockClient::in_memory();
    /// let guard = client.lock("nightly-report").acquire().await?;
    /// guard.release().await
    /// # }
    /// ```
    ///
    /// # Errors
    /// [`LockError::InvalidKey`] or [`LockError::Backend`].
    pub async fn acquire(&self) -> Result<LockGuard, LockError> {
        self.acquire_until(None).await
    }

    /// Acquires the lock, waiting at most `wait` (zero: one attempt). Waiting sleeps until
    /// a release notice or the holder's lease end; it never polls.
    ///
    /// Dropping the returned future at any point never leaves the lock held.
    ///
    /// ```
    /// # use lockwarden_core::{LockClient, LockError};
    /// # use std::time::Duration;
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), LockError> {
    /// let client = LockClient::in_memory();
    /// let held = client.lock("slot").acquire().await?;
    /// let late = client.lock("slot").try_acquire(Duration::from_millis(20)).await;
    /// assert!(matches!(late, Err(LockError::Timeout { .. })));
    /// held.release().await
    /// # }
    /// ```
    ///
    /// # Errors
    /// [`LockError::Timeout`] with the holder's remaining lease once `wait` is spent,
    /// [`LockError::InvalidKey`] or [`LockError::Backend`].
    pub async fn try_acquire(&self, wait: Duration) -> Result<LockGuard, LockError> {
        self.acquire_until(Instant::now().checked_add(wait)).await
    }

    /// Claims a piece of work that must be done once: returns the outcome stored by the
    /// holder that completed it (see [`LockGuard::complete`]), else acquires the lock as
    /// [`try_acquire`](Self::try_acquire) does, still looking for an outcome on every
    /// retry. One round trip either way; a completion wakes every claim waiting for it.
    ///
    /// ```
    /// # use lockwarden_core::{Claim, LockClient};
    /// # use std::time::Duration;
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lockwarden_core::LockError> {
    /// let client = LockClient::in_memory();
    /// let charge = client.lock("charge:evt_81");
    /// let receipt = match charge.try_claim(Duration::from_secs(1)).await? {
    ///     Claim::Acquired(guard) => {
    ///         let receipt = b"charged 12.00".to_vec(); // the work, done once
    ///         guard.complete(receipt.clone(), Duration::from_secs(24 * 3600)).await?;
    ///         receipt
    ///     }
    ///     Claim::Completed(receipt) => receipt,
    /// };
    /// // A retry finds the outcome instead of doing the work again.
    /// assert!(matches!(charge.try_claim(Duration::ZERO).await?, Claim::Completed(r) if r == receipt));
    /// # Ok(()) }
    /// ```
    ///
    /// # Across a Redis restart
    ///
    /// The outcome is a Redis key (kept for [`complete`](LockGuard::complete)'s `keep`),
    /// so whether a retry after a restart is answered with it, rather than running the
    /// work again, is up to Redis's persistence:
    ///
    /// - `appendonly yes` with `appendfsync always`: every write Redis answered is on
    ///   disk first, so a claim whose `complete` returned Ok is replayed after a restart
    ///   (or a crash) of the server (`tests/claim_persistence.rs`).
    /// - `appendfsync everysec` (Redis's default with AOF): a crash may lose the last
    ///   second's writes, so a claim completed within it may run again.
    /// - RDB snapshots alone: claims completed since the last snapshot run again.
    /// - No persistence: every claim runs again after a restart.
    ///
    /// With Sentinel or a cluster, a failover keeps what the promoted replica had received;
    /// a completion does not wait for replicas
    /// ([`wait_for_replicas`](crate::LockClientBuilder::wait_for_replicas) holds back
    /// acquisitions only), so a claim completed just before a failover may run again.
    ///
    /// # Errors
    /// As [`try_acquire`](Self::try_acquire).
    pub async fn try_claim(&self, wait: Duration) -> Result<Claim, LockError> {
        self.run(Instant::now().checked_add(wait)).await
    }

    async fn acquire_until(&self, deadline: Option<Instant>) -> Result<LockGuard, LockError> {
        self.run(deadline).await
    }

    /// Acquires as `W` says: the lock (a guard), or a claim (a guard or the outcome).
    async fn run<W: Won>(&self, deadline: Option<Instant>) -> Result<W, LockError> {
        let target = Target::new(&self.engine, self.key()?, &self.options);
        let attempts = PlainAttempts {
            target,
            won: PhantomData,
        };
        acquire::acquire(self.engine.waiters(), attempts, deadline).await
    }

    /// Releases one hold of `holder`, which has no guard for it (a Redlock node whose
    /// answer was lost).
    pub(crate) async fn release_as(&self, holder: &Holder) -> Result<(), LockError> {
        let hold = Hold {
            kind: HoldKind::PLAIN,
            key: self.key()?.clone(),
            holder: holder.clone(),
        };
        let store = self.engine.store();
        store.release(&hold, None, Reentries::Possible).await?;
        Ok(())
    }
}

/// A handle's key, or why its name was rejected.
pub(crate) fn checked(key: &Result<Key, KeyError>) -> Result<&Key, LockError> {
    key.as_ref().map_err(|e| LockError::InvalidKey(e.clone()))
}

/// What a plain lock's attempts yield: the lock, or for a claim the lock or the outcome
/// its holder stored. Each asks its own way and reads only the answers it can get.
trait Won: Sized + Send {
    /// How its attempts ask.
    const HOW: How;

    /// One attempt's answer, narrowed to this way.
    fn won(target: &Target<'_>, answer: (Attempt, Instant)) -> Result<Tried<Self>, BackendError>;
}

impl Won for LockGuard {
    const HOW: How = How::Plain;

    fn won(target: &Target<'_>, (attempt, sent): (Attempt, Instant)) -> Answer<LockGuard> {
        let attempt = attempt.narrowed(Self::HOW, Refusal::never)?;
        let tried = target.tried((attempt, sent), HoldKind::PLAIN);
        Ok(tried.unwrap_or_else(|never| match never {}))
    }
}

impl Won for Claim {
    const HOW: How = How::Claim;

    fn won(target: &Target<'_>, (attempt, sent): (Attempt, Instant)) -> Answer<Claim> {
        let attempt = attempt.narrowed(Self::HOW, Refusal::outcome)?;
        Ok(match target.tried((attempt, sent), HoldKind::PLAIN) {
            Ok(tried) => tried.map(Claim::Acquired),
            Err(outcome) => Tried::Won(Claim::Completed(outcome), Acquired::Completed),
        })
    }
}

/// A plain lock's (or a claim's) attempts.
struct PlainAttempts<'a, W> {
    target: Target<'a>,
    won: PhantomData<fn() -> W>,
}

impl<W: Won> Attempts for PlainAttempts<'_, W> {
    type Won = W;

    async fn attempt(&mut self, _deadline: Option<Instant>) -> Answer<W> {
        let answer = self.target.ask(W::HOW).await?;
        let tried = W::won(&self.target, answer)?;
        // Any later attempt waits: a refusal then marks the lock for its release.
        self.target.waiting |= matches!(tried, Tried::Busy(_));
        Ok(tried)
    }

    fn key(&self, _lock: usize) -> &Key {
        self.target.key
    }

    fn kind(&self) -> &'static str {
        "plain"
    }

    fn unanswered(&mut self) -> bool {
        self.target
            .forget_holder(W::HOW.kind(self.target.lease()), None)
    }
}
