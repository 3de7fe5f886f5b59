//! The signal that tells a holder its lock is gone.

use std::sync::Arc;

use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// A cloneable handle that tells whether a held lock has been lost.
///
/// A lock kept alive by the watchdog is lost when a renewal finds it gone or owned by
/// someone else, or when renewals keep failing until the lease runs out. A lock with a
/// fixed lease is lost when that lease ends (measured on this machine's clock from the
/// moment the acquire request was sent, so it errs on the early side), unless it is
/// extended first (a Redlock extension). Once lost, it stays lost.
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
    /// The end of a fixed lease; it moves when the hold is extended.
    expires: Option<Arc<watch::Sender<Instant>>>,
}

impl LostSignal {
    /// A hold the watchdog keeps: lost when `token` is cancelled.
    pub(crate) fn watched(token: CancellationToken) -> Self {
        Self {
            token,
            expires: None,
        }
    }

    /// A hold that ends at `at` unless moved with [`extend_to`](Self::extend_to).
    pub(crate) fn expiring(at: Instant) -> Self {
        Self {
            token: CancellationToken::new(),
            expires: Some(Arc::new(watch::Sender::new(at))),
        }
    }

    /// When the hold ends if nothing moves it; `None` for one the watchdog keeps.
    pub(crate) fn deadline(&self) -> Option<Instant> {
        self.expires.as_ref().map(|at| *at.borrow())
    }

    /// Moves the end of a fixed lease to `at`; a lost hold is not revived. Returns
    /// whether it moved.
    pub(crate) fn extend_to(&self, at: Instant) -> bool {
        match &self.expires {
            Some(expires) if !self.is_lost() => {
                expires.send_replace(at);
                true
            }
            _ => false,
        }
    }

    /// Marks the hold lost.
    pub(crate) fn mark_lost(&self) {
        self.token.cancel();
    }

    /// Whether the lock has been lost.
    pub fn is_lost(&self) -> bool {
        if self.token.is_cancelled() {
            return true;
        }
        let over = self.deadline().is_some_and(|at| Instant::now() >= at);
        if over {
            // Sticky: an extension that races the deadline cannot revive it.
            self.token.cancel();
        }
        over
    }

    /// Resolves once the lock has been lost; pending forever while it is held.
    pub async fn wait(&self) {
        let Some(expires) = &self.expires else {
            return self.token.cancelled().await;
        };
        let mut moved = expires.subscribe();
        loop {
            let at = *moved.borrow_and_update();
            tokio::select! {
                () = self.token.cancelled() => return,
                () = tokio::time::sleep_until(at) => {
                    if self.is_lost() {
                        return;
                    }
                }
                _ = moved.changed() => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test(start_paused = true)]
    async fn an_extended_deadline_moves_the_signal() {
        let lost = LostSignal::expiring(Instant::now() + Duration::from_millis(100));
        let waiter = tokio::spawn({
            let lost = lost.clone();
            async move { lost.wait().await }
        });
        tokio::time::sleep(Duration::from_millis(60)).await;
        assert!(lost.extend_to(Instant::now() + Duration::from_millis(100)));
        tokio::time::sleep(Duration::from_millis(60)).await;
        assert!(
            !lost.is_lost() && !waiter.is_finished(),
            "moved past the first deadline"
        );
        tokio::time::sleep(Duration::from_millis(60)).await;
        assert!(lost.is_lost());
        waiter
            .await
            .expect("the wait ends once the moved deadline passes");
    }

    #[tokio::test(start_paused = true)]
    async fn a_lost_hold_is_not_revived() {
        let lost = LostSignal::expiring(Instant::now() + Duration::from_millis(10));
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(lost.is_lost());
        assert!(!lost.extend_to(Instant::now() + Duration::from_secs(10)));
        assert!(lost.is_lost(), "once lost, stays lost");

        let marked = LostSignal::expiring(Instant::now() + Duration::from_secs(10));
        marked.mark_lost();
        assert!(marked.is_lost() && !marked.extend_to(Instant::now() + Duration::from_secs(20)));
    }

    #[tokio::test]
    async fn a_watched_hold_is_lost_only_when_told() {
        let token = CancellationToken::new();
        let lost = LostSignal::watched(token.clone());
        assert!(!lost.is_lost() && lost.deadline().is_none());
        token.cancel();
        lost.wait().await;
        assert!(lost.is_lost());
    }
}
