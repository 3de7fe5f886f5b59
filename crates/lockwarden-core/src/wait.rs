//! The waiting half that every acquire loop shares: the wait budget, the backoff through
//! a store outage, and sleeping on a release channel until a notice or a given instant.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::waiters::{Waiters, Waiting};

/// Retry pacing while the store is unreachable during a wait.
const MIN_BACKOFF: Duration = Duration::from_millis(20);
const MAX_BACKOFF: Duration = Duration::from_secs(1);

/// One acquisition's wait: its deadline (`None`: as long as it takes), its backoff, and
/// its subscription to the channel it sleeps on.
pub(crate) struct Wait {
    deadline: Option<Instant>,
    backoff: Duration,
    waiting: Option<Waiting>,
    /// Whether notices on the subscribed channel are being received.
    ready: bool,
}

impl Wait {
    pub(crate) fn new(deadline: Option<Instant>) -> Self {
        Self {
            deadline,
            backoff: MIN_BACKOFF,
            waiting: None,
            ready: false,
        }
    }

    /// Whether the budget is spent at `now`.
    pub(crate) fn is_over(&self, now: Instant) -> bool {
        self.deadline.is_some_and(|d| now >= d)
    }

    /// `at`, or the deadline if that comes first.
    pub(crate) fn cap(&self, at: Instant) -> Instant {
        self.deadline.map_or(at, |d| d.min(at))
    }

    /// Whether the budget leaves room for one more backoff after a transient failure.
    pub(crate) fn can_back_off(&self) -> bool {
        self.deadline
            .is_none_or(|d| Instant::now() + self.backoff < d)
    }

    /// Sleeps the current backoff and doubles it (up to a second).
    pub(crate) async fn back_off(&mut self) {
        tokio::time::sleep(self.backoff).await;
        self.backoff = (self.backoff * 2).min(MAX_BACKOFF);
    }

    /// Sleeps until a notice on `channel` or `wake_at`; returns whether a notice woke it.
    /// The first sleep on a channel only subscribes (until notices flow, or `wake_at`), so
    /// the caller retries at once and a release between its attempt and the subscription
    /// is not missed.
    pub(crate) async fn sleep(
        &mut self,
        waiters: &Arc<Waiters>,
        channel: &str,
        wake_at: Instant,
    ) -> bool {
        let w = match &self.waiting {
            Some(w) if w.channel() == channel => w,
            _ => {
                let w = waiters.register(channel);
                self.ready = w.ready_by(wake_at).await;
                self.waiting = Some(w);
                return false;
            }
        };
        tokio::select! {
            _ = w.notified() => true,
            _ = w.ready_by(wake_at), if !self.ready => {
                self.ready = true;
                false
            }
            _ = tokio::time::sleep_until(wake_at) => false,
        }
    }
}
