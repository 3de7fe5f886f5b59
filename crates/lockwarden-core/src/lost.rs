//! The signal that tells a holder its lock is gone.

use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// A cloneable handle that tells whether a held lock has been lost.
///
/// A lock kept alive by the watchdog is lost when a renewal finds it gone or owned by
/// someone else, or when renewals keep failing until the lease runs out. A lock with a
/// fixed lease is lost when that lease ends (measured on this machine's clock from the
/// moment the acquire request was sent, so it errs on the early side).
///
/// ```
/// # use lockwarden_core::LockClient;
/// # use std::time::Duration;
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lockwarden_core::LockError> {
/// let client = LockClient::in_memory();
/// let guard = client.lock("job").lease(Duration::from_millis(20)).acquire().await?;
/// let lost = guard.lost_signal();
/// assert!(!lost.is_lost());
/// lost.wait().await; // resolves when the 20 ms lease is over
/// assert!(guard.is_lost());
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct LostSignal {
    token: CancellationToken,
    expires: Option<Instant>,
}

impl LostSignal {
    pub(crate) fn new(token: CancellationToken, lease: Option<Duration>, sent: Instant) -> Self {
        Self {
            token,
            expires: lease.map(|lease| sent + lease),
        }
    }

    /// Whether the lock has been lost.
    pub fn is_lost(&self) -> bool {
        self.token.is_cancelled() || self.expires.is_some_and(|at| Instant::now() >= at)
    }

    /// Resolves once the lock has been lost; pending forever while it is held.
    pub async fn wait(&self) {
        match self.expires {
            Some(at) => {
                tokio::select! {
                    _ = self.token.cancelled() => {}
                    _ = tokio::time::sleep_until(at) => {}
                }
            }
            None => self.token.cancelled().await,
        }
    }
}
