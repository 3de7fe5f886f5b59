//! The guard of a held lock: its token, its lost signal, and its release.

use std::fmt;
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::backend::{Kind, Outcome, Released};
use crate::client::LockClient;
use crate::detach::Detached;
use crate::error::LockError;
use crate::holder::Holder;
use crate::key::Key;
use crate::lost::LostSignal;

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
    client: LockClient,
    kind: Kind,
    key: Key,
    holder: Holder,
    token: u64,
    lost: LostSignal,
    /// The watchdog registration generation; `None` with a fixed lease.
    watched: Option<u64>,
    released: bool,
}

/// What the code running under a lock may want to know about it; cheap to clone.
#[derive(Clone, Debug)]
pub struct LockInfo {
    /// The lock's key.
    pub key: Key,
    /// Who holds it.
    pub holder: Holder,
    /// The fencing token of this hold.
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
    #[expect(
        clippy::too_many_arguments,
        reason = "one call site per lock kind, each passing what it just learnt"
    )]
    pub(crate) fn new(
        client: LockClient,
        kind: Kind,
        key: Key,
        holder: Holder,
        token: u64,
        lease: Option<Duration>,
        max_hold: Option<Duration>,
        sent: Instant,
    ) -> Self {
        let (watched, lost) = match lease {
            Some(lease) => (
                None,
                LostSignal::new(CancellationToken::new(), Some(lease), sent),
            ),
            None => {
                client.ensure_watchdog();
                let r = client
                    .inner
                    .watchdog
                    .register(kind, &key, &holder, sent, max_hold);
                (Some(r.generation), LostSignal::new(r.lost, None, sent))
            }
        };
        Self {
            client,
            kind,
            key,
            holder,
            token,
            lost,
            watched,
            released: false,
        }
    }

    /// The lock's key.
    pub fn key(&self) -> &Key {
        &self.key
    }

    /// The holder this guard holds the lock as.
    pub fn holder(&self) -> &Holder {
        &self.holder
    }

    /// The fencing token of this hold: strictly greater than every token issued for this
    /// key before it (re-entries share their hold's token). Have the protected resource
    /// reject writes carrying a smaller token than one it has seen.
    pub fn fencing_token(&self) -> u64 {
        self.token
    }

    /// Whether the lock has been lost (see [`LostSignal`]).
    pub fn is_lost(&self) -> bool {
        self.lost.is_lost()
    }

    /// Resolves once the lock has been lost.
    pub async fn lost(&self) {
        self.lost.wait().await;
    }

    /// A cloneable handle on the lost signal, to move into other tasks.
    pub fn lost_signal(&self) -> LostSignal {
        self.lost.clone()
    }

    /// Key, holder, token and lost signal in one cloneable value.
    pub fn info(&self) -> LockInfo {
        LockInfo {
            key: self.key.clone(),
            holder: self.holder.clone(),
            fencing_token: self.token,
            lost: self.lost.clone(),
        }
    }

    /// Releases one hold (a re-entered lock stays held by the outer holds), and wakes a
    /// waiter when the lock becomes free.
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
    pub async fn complete(
        self,
        outcome: impl Into<Vec<u8>>,
        keep: Duration,
    ) -> Result<(), LockError> {
        self.finish(Some((outcome.into(), keep))).await
    }

    async fn finish(mut self, outcome: Option<(Vec<u8>, Duration)>) -> Result<(), LockError> {
        self.released = true;
        self.unwatch();
        let completes = outcome.is_some();
        let backend = self.client.inner.backend.clone();
        let (kind, key, holder) = (self.kind, self.key.clone(), self.holder.clone());
        let release = async move {
            backend
                .release(kind, &key, &holder, outcome.as_ref().map(Outcome::from))
                .await
        };
        // Finished in the background if the caller stops waiting (an aborted task, a lost
        // `select!`): otherwise the command might never be sent, leaving the lock held for
        // its lease by a guard that already counts as released.
        let released = Detached::new(release).await;
        tracing::debug!(key = %self.key, ?released, completes, "lock release");
        match released? {
            Released::Freed | Released::Remaining(_) => Ok(()),
            Released::NotHeld if self.lost.is_lost() => Err(LockError::Lost {
                key: self.key.name().to_owned(),
            }),
            Released::NotHeld => Err(LockError::NotHeld {
                key: self.key.name().to_owned(),
            }),
        }
    }

    fn unwatch(&mut self) {
        if let Some(generation) = self.watched.take() {
            self.client
                .inner
                .watchdog
                .unregister(self.kind, &self.key, &self.holder, generation);
        }
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        if self.released {
            return;
        }
        self.unwatch();
        self.client
            .release_dropped(self.kind, self.key.clone(), self.holder.clone());
    }
}

impl fmt::Debug for LockGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockGuard")
            .field("key", &self.key)
            .field("holder", &self.holder)
            .field("fencing_token", &self.token)
            .field("lost", &self.is_lost())
            .finish()
    }
}
