//! The guard of a held Redlock: its validity, token, extensions, lost signal and release.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::join_all;
use tokio::time::Instant;

use super::nodes::Nodes;
use super::round::{release_all, Held};
use crate::error::{LockError, RedlockError};
use crate::holder::Holder;
use crate::key::Key;
use crate::lost::LostSignal;

/// Proof that a majority of the nodes granted the lock, valid until
/// [`valid_until`](Self::valid_until). Dropping it releases every node in the background;
/// [`release`](Self::release) releases and reports.
///
/// The lock is not kept alive automatically: call [`extend`](Self::extend) before the
/// validity runs out (at most the configured number of times), and stop the protected
/// work when [`lost`](Self::lost) fires.
///
/// ```no_run
/// # use lockwarden_core::Redlock;
/// # use std::time::Duration;
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lockwarden_core::LockError> {
/// # let redlock = Redlock::connect(&["redis://10.0.0.1/", "redis://10.0.0.2/", "redis://10.0.0.3/"]).await?;
/// let guard = redlock.lock("payout:9").try_acquire(Duration::from_secs(1)).await?;
/// let token = guard.fencing_token(); // the resource must reject smaller tokens
/// tokio::select! {
///     _ = guard.lost() => { /* the validity ran out: someone else may hold it now */ }
///     _ = async { /* the protected work, passing `token` with every write */ } => {}
/// }
/// guard.release().await?;
/// # let _ = token; Ok(()) }
/// ```
#[must_use = "the lock is released as soon as the guard is dropped"]
pub struct RedlockGuard {
    nodes: Arc<Nodes>,
    held: Held,
    extensions: u32,
    /// Fires when the validity runs out; extensions move it.
    lost: LostSignal,
}

impl RedlockGuard {
    pub(super) fn new(nodes: Arc<Nodes>, held: Held) -> Self {
        let lost = LostSignal::expiring(held.valid_until);
        Self {
            nodes,
            held,
            extensions: 0,
            lost,
        }
    }

    /// The lock's key (the same on every node).
    pub fn key(&self) -> &Key {
        &self.held.key
    }

    /// The holder id this guard holds the lock as on every node.
    pub fn holder(&self) -> &Holder {
        &self.held.holder
    }

    /// The fencing token of this hold: the largest of the tokens the granting nodes issued.
    ///
    /// Each node's token is its server clock in microseconds, never below the last token it
    /// issued for this key while that key lived. Any two majorities share a node, and on
    /// that node the later hold gets the larger token (unless its clock stepped back). The
    /// *largest* token across nodes is ordered like the holds only as long as the nodes'
    /// clocks differ by less than the time between two holds; a node whose clock runs
    /// ahead inflates it. It is still the check that matters: a resource that rejects a
    /// token below the highest it has seen turns a holder paused past its validity into a
    /// refused write instead of a corrupted one.
    pub fn fencing_token(&self) -> u64 {
        self.held.token
    }

    /// When the lock stops being valid on this machine's clock: the start of the last
    /// successful round (acquire or extend) plus the lease, minus the clock drift. The
    /// nodes expire it later.
    pub fn valid_until(&self) -> Instant {
        self.lost.deadline().unwrap_or(self.held.valid_until)
    }

    /// How much validity is left (zero once it ran out).
    pub fn validity(&self) -> Duration {
        self.valid_until().saturating_duration_since(Instant::now())
    }

    /// How many times this guard has been extended.
    pub fn extensions(&self) -> u32 {
        self.extensions
    }

    /// Whether the validity has run out (see [`lost`](Self::lost)).
    pub fn is_lost(&self) -> bool {
        self.lost.is_lost()
    }

    /// Resolves once the validity has run out without a successful extension.
    pub async fn lost(&self) {
        self.lost.wait().await;
    }

    /// A cloneable handle on the lost signal, to move into other tasks.
    pub fn lost_signal(&self) -> LostSignal {
        self.lost.clone()
    }

    /// Renews the lease on every node and, if a majority still held the lock, moves the
    /// validity to the start of this call plus the lease, minus the drift. Returns the new
    /// validity.
    ///
    /// ```no_run
    /// # use lockwarden_core::{LockError, Redlock, RedlockError};
    /// # use std::time::Duration;
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), LockError> {
    /// # let redlock = Redlock::builder().max_extensions(1)
    /// #     .connect(&["redis://10.0.0.1/", "redis://10.0.0.2/", "redis://10.0.0.3/"]).await?;
    /// let mut guard = redlock.lock("import").try_acquire(Duration::ZERO).await?;
    /// guard.extend().await?;
    /// assert!(matches!(
    ///     guard.extend().await,
    ///     Err(LockError::Redlock(RedlockError::ExtensionLimit { max: 1, .. }))
    /// ));
    /// # guard.release().await }
    /// ```
    ///
    /// # Errors
    /// [`LockError::Lost`] if the validity already ran out (a lost lock is not revived);
    /// [`RedlockError::ExtensionLimit`] at the cap; [`RedlockError::NoQuorum`] if fewer than
    /// a majority renewed it and [`RedlockError::TooSlow`] if they answered after the new
    /// validity had run out. After an error the old validity still applies.
    pub async fn extend(&mut self) -> Result<Duration, LockError> {
        let config = &self.nodes.config;
        let name = self.held.key.name().to_owned();
        if self.is_lost() {
            return Err(LockError::Lost { key: name });
        }
        if self.extensions >= config.max_extensions {
            return Err(RedlockError::ExtensionLimit {
                key: name,
                max: config.max_extensions,
            }
            .into());
        }
        let started = Instant::now();
        let (lease, node_timeout) = (config.lease, config.node_timeout);
        let renewals = self
            .held
            .guards
            .iter_mut()
            .map(|guard| tokio::time::timeout(node_timeout, guard.extend(lease)));
        let renewed = join_all(renewals)
            .await
            .into_iter()
            .filter(|renewed| matches!(renewed, Ok(Ok(()))))
            .count();
        let valid_until = started + lease.saturating_sub(config.drift());
        let quorum = self.nodes.quorum();
        tracing::debug!(key = %self.held.key, renewed, quorum, "redlock extend");
        if renewed < quorum {
            return Err(RedlockError::NoQuorum {
                key: name,
                granted: renewed,
                needed: quorum,
                nodes: self.nodes.clients.len(),
            }
            .into());
        }
        if Instant::now() >= valid_until {
            return Err(RedlockError::TooSlow {
                key: name,
                elapsed: started.elapsed(),
                lease,
            }
            .into());
        }
        // The validity may have run out while the nodes answered: once lost, stays lost.
        if !self.lost.extend_to(valid_until) {
            return Err(LockError::Lost { key: name });
        }
        self.extensions += 1;
        Ok(self.validity())
    }

    /// Releases the lock on every node (waiting for each at most the node timeout; a
    /// release still in flight then completes in the background).
    ///
    /// # Errors
    /// [`LockError::Lost`] if the validity had run out and fewer than a majority still held
    /// it; [`RedlockError::NoQuorum`] if fewer than a majority confirmed the release (the
    /// rest expire with the lease).
    pub async fn release(self) -> Result<(), LockError> {
        let was_lost = self.is_lost();
        let Self { nodes, held, .. } = self;
        let freed = release_all(held.guards, nodes.config.node_timeout).await;
        let quorum = nodes.quorum();
        tracing::debug!(key = %held.key, freed, quorum, "redlock release");
        let key = held.key.name().to_owned();
        if freed >= quorum {
            Ok(())
        } else if was_lost {
            Err(LockError::Lost { key })
        } else {
            Err(RedlockError::NoQuorum {
                key,
                granted: freed,
                needed: quorum,
                nodes: nodes.clients.len(),
            }
            .into())
        }
    }
}

impl fmt::Debug for RedlockGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedlockGuard")
            .field("key", &self.held.key)
            .field("holder", &self.held.holder)
            .field("fencing_token", &self.held.token)
            .field("validity", &self.validity())
            .field("extensions", &self.extensions)
            .finish()
    }
}
