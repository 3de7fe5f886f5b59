//! The one acquire loop, run by every lock kind (plain and claims, fair, read, write,
//! multi): attempt; while the lock is busy, sleep on its channel until a notice or until
//! it could have changed without one, within the wait budget; ride out a store outage
//! with backoff; and when the wait ends without the lock, undo what waiting left in the
//! store. A lock kind supplies only what differs, as an [`Attempts`].

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::error::{BackendError, LockError};
use crate::finish::{BoxFuture, Finish};
use crate::key::Key;
use crate::metrics::{self, Acquired, Operation};
use crate::waiters::{Waiters, Waiting};

/// Used when the store reports a lock without expiry (not one of ours): re-check this often.
pub(crate) const NO_TTL_RECHECK: Duration = Duration::from_secs(1);

/// Retry pacing while the store is unreachable during a wait.
const MIN_BACKOFF: Duration = Duration::from_millis(20);
const MAX_BACKOFF: Duration = Duration::from_secs(1);

/// What one attempt answers: how it went, or why the store failed.
pub(crate) type Answer<W> = Result<Tried<W>, BackendError>;

/// What one lock kind supplies to the acquire loop.
pub(crate) trait Attempts: Send {
    /// What winning yields: a guard, a claim's outcome, several guards.
    type Won: Send;

    /// One attempt, one round trip; `deadline` is the end of the wait budget.
    fn attempt(
        &mut self,
        deadline: Option<Instant>,
    ) -> impl Future<Output = Answer<Self::Won>> + Send;

    /// The kind's name in logs and metrics: `plain`, `fair`, `read`, `write`, `multi`.
    fn kind(&self) -> &'static str;

    /// The lock (of the kind's locks) named `lock` by a [`Busy`] answer.
    fn key(&self, lock: usize) -> &Key;

    /// What is being acquired, in logs.
    fn name(&self) -> &str {
        self.key(0).name()
    }

    /// The channel a waiter for `lock` sleeps on (by default the lock's release channel).
    fn channel(&self, lock: usize) -> &str {
        self.key(lock).channel()
    }

    /// The holder id a release may hand the lock to by name (fair, read), so that its
    /// grant wakes this waiter alone; `None` if releases only notify.
    fn holder(&self) -> Option<&str> {
        None
    }

    /// How often to try again while busy even without a notice: a waiter that keeps a
    /// place in the store must refresh it. `None`: only when the lock could have expired.
    fn recheck(&self) -> Option<Duration> {
        None
    }

    /// What waiting left in the store after the last attempt (a place in a queue, a
    /// registration), to undo if the wait ends without the lock; `None` if nothing.
    fn left_behind(&self) -> Option<BoxFuture> {
        None
    }

    /// The last attempt got no answer, so it may have taken the lock or left a place:
    /// settle that in the background and go on as a new holder, if the holder was made
    /// for this acquisition (`settle.rs`). Returns whether it did (what `left_behind`
    /// said is then settled too).
    fn unanswered(&mut self) -> bool {
        false
    }
}

/// The answer of one attempt, as the loop needs it.
pub(crate) enum Tried<W> {
    /// Acquired (taken or re-entered), or, for a claim, found done.
    Won(W, Acquired),
    /// Busy: retry on a notice or by `ttl` (the holder's remaining lease) at the latest.
    Busy(Busy),
    /// Refused for good (an upgrade from read to write).
    Refused(LockError),
}

impl<W> Tried<W> {
    /// The same answer, with what winning yields made into something else.
    pub(crate) fn map<V>(self, f: impl FnOnce(W) -> V) -> Tried<V> {
        match self {
            Tried::Won(won, how) => Tried::Won(f(won), how),
            Tried::Busy(busy) => Tried::Busy(busy),
            Tried::Refused(error) => Tried::Refused(error),
        }
    }
}

/// Which lock is busy and for how long at most.
pub(crate) struct Busy {
    /// Which of the kind's locks (0 but for a multi-lock).
    pub(crate) lock: usize,
    /// The holder's remaining lease; `None` if the lock has no expiry.
    pub(crate) ttl: Option<Duration>,
}

/// Runs `attempts` until they win, the budget (`deadline`) is spent or the store fails
/// for good. Dropping the future at any point leaves nothing behind.
pub(crate) async fn acquire<A: Attempts>(
    waiters: &Arc<Waiters>,
    mut attempts: A,
    deadline: Option<Instant>,
) -> Result<A::Won, LockError> {
    let started = Instant::now();
    let mut wait = Wait::new(deadline);
    // Undone at once when the wait ends without the lock, in the background if the
    // future is dropped; cancelled once the lock is taken (the store cleared it).
    let mut left_behind: Option<Finish<BoxFuture>> = None;
    // The lock whose notice woke us, if the retry has not used it yet.
    let mut woken: Option<usize> = None;
    let ended = |attempts: &A, outcome: Acquired| {
        let waited = started.elapsed();
        metrics::acquired(attempts.kind(), outcome, waited);
        tracing::debug!(
            kind = attempts.kind(),
            key = attempts.name(),
            waited_ms = waited.as_millis() as u64,
            ?outcome,
            "lock acquire"
        );
    };
    loop {
        // A client that shut down takes no lock, nor waits for one: its waiters were
        // woken to end here.
        if waiters.is_closed() {
            give_up(left_behind).await;
            ended(&attempts, Acquired::Refused);
            let key = attempts.name().to_owned();
            return Err(LockError::ShutDown { key });
        }
        let busy = match attempts.attempt(deadline).await {
            Ok(Tried::Won(won, how)) => {
                if let Some(left_behind) = left_behind {
                    left_behind.cancel();
                }
                ended(&attempts, how);
                return Ok(won);
            }
            Ok(Tried::Busy(busy)) => busy,
            Ok(Tried::Refused(error)) => {
                give_up(left_behind).await;
                ended(&attempts, Acquired::Refused);
                return Err(error);
            }
            Err(error) => {
                metrics::backend_error(Operation::Acquire, &error);
                let transient = error.is_transient();
                // No answer: the attempt may have taken the lock. What it (and the wait
                // before it) left is settled in the background; the next attempt starts
                // afresh.
                if transient && attempts.unanswered() {
                    if let Some(settled) = left_behind.take() {
                        settled.cancel();
                    }
                }
                // Ride out a reconnect within the budget; the store being down is
                // reported once the budget is spent.
                if transient && wait.can_back_off() {
                    tracing::debug!(key = attempts.name(), %error, "acquire failed; retrying");
                    wait.back_off().await;
                    continue;
                }
                give_up(left_behind).await;
                ended(&attempts, Acquired::Error);
                return Err(error.into());
            }
        };
        if left_behind.is_none() {
            left_behind = attempts.left_behind().map(Finish::new);
        }
        // A notice for a lock we then did not take goes to the next local waiter of that
        // lock, which may well get it (only a multi-lock waits on more than one).
        if let Some(other) = woken.take().filter(|&w| w != busy.lock) {
            waiters.notify_one(attempts.channel(other));
        }
        let recheck = attempts.recheck();
        let ttl = busy.ttl.or(recheck).unwrap_or(NO_TTL_RECHECK);
        let now = Instant::now();
        if wait.is_over(now) {
            give_up(left_behind).await;
            // A fail-fast call (no budget) was refused; a waiting one ran out of time.
            let fail_fast = deadline.is_some_and(|d| d <= started);
            ended(
                &attempts,
                if fail_fast {
                    Acquired::Busy
                } else {
                    Acquired::Timeout
                },
            );
            return Err(LockError::Timeout {
                key: attempts.key(busy.lock).name().to_owned(),
                retry_after: ttl,
            });
        }
        let wake_at = now + recheck.map_or(ttl, |recheck| ttl.min(recheck));
        let channel = attempts.channel(busy.lock);
        let holder = attempts.holder();
        match wait
            .sleep(waiters, (channel, holder), wait.cap(wake_at))
            .await
        {
            Ok(true) => woken = Some(busy.lock),
            Ok(false) => {}
            // No notices will come (Redis refused the subscription): say so now rather
            // than wait for every holder's lease to run out.
            Err(error) => {
                metrics::backend_error(Operation::Acquire, &error);
                give_up(left_behind).await;
                ended(&attempts, Acquired::Error);
                return Err(error.into());
            }
        }
    }
}

async fn give_up(left_behind: Option<Finish<BoxFuture>>) {
    if let Some(undo) = left_behind {
        undo.await;
    }
}

/// One acquisition's wait: its deadline (`None`: as long as it takes), its backoff, and
/// its subscription to the channel it sleeps on.
struct Wait {
    deadline: Option<Instant>,
    backoff: Duration,
    waiting: Option<Waiting>,
    /// Whether notices on the subscribed channel are being received.
    ready: bool,
}

impl Wait {
    fn new(deadline: Option<Instant>) -> Self {
        Self {
            deadline,
            backoff: MIN_BACKOFF,
            waiting: None,
            ready: false,
        }
    }

    /// Whether the budget is spent at `now`.
    fn is_over(&self, now: Instant) -> bool {
        self.deadline.is_some_and(|d| now >= d)
    }

    /// `at`, or the deadline if that comes first.
    fn cap(&self, at: Instant) -> Instant {
        self.deadline.map_or(at, |d| d.min(at))
    }

    /// Whether the budget leaves room for one more backoff after a transient failure.
    fn can_back_off(&self) -> bool {
        self.deadline
            .is_none_or(|d| Instant::now() + self.backoff < d)
    }

    /// Sleeps the current backoff and doubles it (up to a second).
    async fn back_off(&mut self) {
        tokio::time::sleep(self.backoff).await;
        self.backoff = (self.backoff * 2).min(MAX_BACKOFF);
    }

    /// Sleeps until a notice on `channel` (or one for `holder` on it) or `wake_at`;
    /// returns whether a notice woke it. The first sleep on a channel only subscribes
    /// (until notices flow, or `wake_at`), so the caller retries at once and a release
    /// between its attempt and the subscription is not missed; but a waiter told by name
    /// (`holder`) on a channel other waiters here listen to already sleeps right away: a
    /// grant or turn for it sent meanwhile waits in the registry and wakes it at once.
    /// Fails if Redis refused the subscription.
    async fn sleep(
        &mut self,
        waiters: &Arc<Waiters>,
        (channel, holder): (&str, Option<&str>),
        wake_at: Instant,
    ) -> Result<bool, BackendError> {
        // A new channel, or a new holder (the old one's attempt went unanswered).
        if self
            .waiting
            .as_ref()
            .is_none_or(|w| w.channel() != channel || w.holder() != holder)
        {
            let (w, listened) = waiters.register(channel, holder);
            let w = self.waiting.insert(w);
            self.ready = listened;
            // Only a waiter told by name skips the retry: for one only notified, the retry
            // also takes a lock freed meanwhile, which keeps a hot lock busy (without it,
            // 13 % fewer hot-key cycles/s in the bench's workload 8).
            if !(listened && holder.is_some()) {
                self.ready = w.ready_by(wake_at).await?;
                return Ok(false);
            }
        }
        let Some(w) = &self.waiting else {
            return Ok(false);
        };
        tokio::select! {
            _ = w.notified() => Ok(true),
            ready = w.ready_by(wake_at), if !self.ready => {
                ready?;
                self.ready = true;
                Ok(false)
            }
            _ = tokio::time::sleep_until(wake_at) => Ok(false),
        }
    }
}
