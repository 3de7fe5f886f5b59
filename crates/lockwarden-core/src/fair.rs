//! The fair lock, [`FairLock`]: first come, first served across processes. Waiters queue
//! in the store; a release hands the lock to the head and tells only the head, which then
//! holds it without asking again. Its promises, costs and Redis layout are documented on
//! the type.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::acquire::{self, Answer, Attempts, Tried};
use crate::engine::Engine;
use crate::error::{KeyError, LockError};
use crate::finish::BoxFuture;
use crate::guard::LockGuard;
use crate::hold::{Exclusive, HoldKind};
use crate::inspect::exclusive_inspection;
use crate::key::Key;
use crate::lock::checked;
use crate::metrics::Acquired;
use crate::options::{hold_options, HoldOptions};
use crate::store::contract::{How, LockStore, Refusal, Waiter};
use crate::target::Target;

/// How long a waiter that stopped trying keeps its place in the queue, by default.
pub const DEFAULT_QUEUE_TIMEOUT: Duration = Duration::from_secs(5);

/// One named fair lock, made by [`LockClient::fair_lock`](crate::LockClient::fair_lock): waiters get it in the order
/// they asked for it. Set options, then acquire or inspect.
///
/// What it promises: a waiter that does not get the lock joins a queue kept in the store
/// (on Redis: a list of holder ids in arrival order, plus each waiter's deadline by the
/// server clock), and the lock goes to the head of that queue, never to a newcomer, as
/// long as the head keeps its place. A waiter keeps its place by trying again at least
/// every third of its [queue timeout](FairLock::queue_timeout); one that dies, hangs or
/// is cut off stays silent and is dropped from the queue once its timeout has passed,
/// wherever it stands, so it stalls the ones behind it for at most that long. A waiter
/// that gives up (its wait budget is spent, or its acquire future is dropped) leaves the
/// queue at once.
///
/// On release the lock goes straight to the head of the queue: the release hands it over
/// in the same step and tells the head its fencing token, by name, on its client's channel
/// for the lock, so the head holds the lock without another round trip. The handover lasts what was left of
/// the head's place (at most its queue timeout), and the head's watchdog renews it after a
/// third of that: a head that died meanwhile frees the lock within its queue timeout. A
/// head that misses the notice, holds with a fixed [`lease`](FairLock::lease) or was given
/// its [`holder`](FairLock::holder) takes the handover up with its next attempt instead
/// (a given holder may wait in several tasks, and each must count once). A head that gives
/// up gives the lock on to the next waiter.
///
/// What it costs: one round trip per attempt, as the plain lock, and none to take a lock
/// handed over; a waiter whose client already listens on the lock's channel (other waiters
/// there) makes one attempt before it sleeps, the first one two (it retries once
/// subscribed); a waiting holder retries by itself every third of the queue timeout
/// besides the notice of its turn; on Redis, one pub/sub subscription per client and
/// contended lock, and two more keys per contended lock, which expire with the last
/// waiter's deadline.
///
/// The holder is also the waiter's place in the queue, so one holder waits in one place
/// however many tasks wait as it (and when one of them gives up, the others join again at
/// the tail on their next retry).
///
/// Held, a fair lock is an ordinary lock: the same hash, so the same re-entry, fencing
/// tokens, watchdog and [`LockGuard`]. Do not also take the same name with
/// [`LockClient::lock`](crate::LockClient::lock): that still excludes, but barges past the queue.
///
/// On Redis, next to the lock hash and fencing key of
/// [`Key`], all in the lock's slot ([`KeyLayout::Tagged`](crate::KeyLayout::Tagged) names):
///
/// | what | Redis name |
/// |---|---|
/// | the queue: a list of holder ids, oldest first | `<lock key>:queue` |
/// | each waiter's deadline: a zset of holder id to ms, server clock (a head handed the lock stays in it until it asks again or releases) | `<lock key>:deadlines` |
/// | the channel on which a waiter hears its turn, `granted:<token>:<holder id>`: one per client (every waiter of the client for this lock listens on it; the holder id says whose turn it is) | `<release channel>:<client id>` ([`LockClient::id`](crate::LockClient::id)) |
///
/// ```
/// # use lockwarden_core::LockClient;
/// # use std::time::Duration;
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lockwarden_core::LockError> {
/// let client = LockClient::in_memory();
/// let turn = client.fair_lock("printer").queue_timeout(Duration::from_secs(2));
/// let guard = turn.try_acquire(Duration::from_secs(1)).await?;
/// // ... others queue meanwhile and get it in their order of arrival ...
/// guard.release().await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
#[must_use = "a FairLock does nothing until it is acquired or inspected"]
pub struct FairLock {
    engine: Arc<Engine>,
    key: Result<Key, KeyError>,
    options: HoldOptions,
    queue_timeout: Duration,
}

hold_options!(FairLock, "client.fair_lock(\"report\")");
exclusive_inspection!(FairLock, "client.fair_lock(\"door\")");

impl FairLock {
    pub(crate) fn new(engine: Arc<Engine>, key: Result<Key, KeyError>) -> Self {
        Self {
            engine,
            key,
            options: HoldOptions::default(),
            queue_timeout: DEFAULT_QUEUE_TIMEOUT,
        }
    }

    /// How long a waiter keeps its place in the queue without trying again (default
    /// [`DEFAULT_QUEUE_TIMEOUT`], at least 3 ms). A live waiter tries again every third
    /// of it, so this bounds how long a dead waiter stalls the ones behind it, at the cost
    /// of a retry per third of it per waiter. Each waiter brings its own.
    ///
    /// ```
    /// # use lockwarden_core::LockClient;
    /// # use std::time::Duration;
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lockwarden_core::LockError> {
    /// let client = LockClient::in_memory();
    /// let lock = client.fair_lock("queue:slow").queue_timeout(Duration::from_secs(1));
    /// # lock.acquire().await?.release().await
    /// # }
    /// ```
    pub fn queue_timeout(mut self, timeout: Duration) -> Self {
        self.queue_timeout = timeout.max(Duration::from_millis(3));
        self
    }

    /// The validated key.
    ///
    /// ```
    /// # use lockwarden_core::LockClient;
    /// let client = LockClient::in_memory();
    /// assert_eq!(client.fair_lock("a").key().unwrap().redis_key(), "lockwarden:{a}");
    /// assert!(client.fair_lock("").key().is_err());
    /// ```
    ///
    /// # Errors
    /// [`LockError::InvalidKey`] if the name was rejected.
    pub fn key(&self) -> Result<&Key, LockError> {
        checked(&self.key)
    }

    /// Acquires the lock in its turn, waiting as long as it takes (as
    /// [`Lock::acquire`](crate::Lock::acquire), through a Redis outage too; a waiter cut
    /// off for longer than its queue timeout loses its place and joins again at the tail).
    ///
    /// ```
    /// # use lockwarden_core::LockClient;
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lockwarden_core::LockError> {
    /// let client = LockClient::in_memory();
    /// let first = client.fair_lock("ticket:1").acquire().await?;
    /// let second = tokio::spawn({
    ///     let turn = client.fair_lock("ticket:1");
    ///     async move { turn.acquire().await }
    /// });
    /// while client.fair_lock("ticket:1").queued().await? == 0 {
    ///     tokio::task::yield_now().await; // the second one lines up
    /// }
    /// first.release().await?; // the head of the queue is told its turn has come
    /// second.await.unwrap()?.release().await
    /// # }
    /// ```
    ///
    /// # Errors
    /// [`LockError::InvalidKey`] or [`LockError::Backend`].
    pub async fn acquire(&self) -> Result<LockGuard, LockError> {
        self.acquire_until(None).await
    }

    /// Acquires the lock in its turn, waiting at most `wait`. A zero `wait` is one attempt
    /// that never joins the queue: it gets the lock only if it is free and nobody waits.
    /// A waiter whose budget is spent leaves the queue before this returns; dropping the
    /// future leaves it in the background; either way no lock stays held.
    ///
    /// ```
    /// # use lockwarden_core::{LockClient, LockError};
    /// # use std::time::Duration;
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), LockError> {
    /// let client = LockClient::in_memory();
    /// let printer = client.fair_lock("printer");
    /// let held = printer.acquire().await?;
    /// let gave_up = printer.try_acquire(Duration::from_millis(20)).await;
    /// assert!(matches!(gave_up, Err(LockError::Timeout { .. })));
    /// assert_eq!(printer.queued().await?, 0); // it left the queue as it gave up
    /// held.release().await
    /// # }
    /// ```
    ///
    /// # Errors
    /// [`LockError::Timeout`] once `wait` is spent, [`LockError::InvalidKey`] or
    /// [`LockError::Backend`].
    pub async fn try_acquire(&self, wait: Duration) -> Result<LockGuard, LockError> {
        self.acquire_until(Instant::now().checked_add(wait)).await
    }

    async fn acquire_until(&self, deadline: Option<Instant>) -> Result<LockGuard, LockError> {
        let attempts = FairAttempts {
            target: Target::new(&self.engine, self.key()?, &self.options),
            queue_timeout: self.queue_timeout,
            queued: false,
            wake: None,
            kept_at: None,
        };
        acquire::acquire(self.engine.waiters(), attempts, deadline).await
    }

    /// How many waiters are queued, counting any that died less than their queue timeout
    /// ago (they are dropped when someone next looks at the queue after it).
    ///
    /// ```
    /// # use lockwarden_core::LockClient;
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lockwarden_core::LockError> {
    /// let client = LockClient::in_memory();
    /// assert_eq!(client.fair_lock("idle").queued().await?, 0);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`LockError::InvalidKey`] or [`LockError::Backend`].
    pub async fn queued(&self) -> Result<usize, LockError> {
        Ok(self.engine.store().queued(self.key()?).await?)
    }
}

/// A fair lock's attempts: each keeps (or takes) the waiter's place in the queue, and the
/// waiter sleeps on its client's channel for the lock, told by name when its turn has come.
struct FairAttempts<'a> {
    target: Target<'a>,
    queue_timeout: Duration,
    /// Whether an attempt joined the queue (so giving up must leave it).
    queued: bool,
    /// The channel of this holder's turn (its client's), made on the first wait.
    wake: Option<String>,
    /// When the last attempt that kept the place was sent: a grant lasts a queue timeout
    /// from the place's last refresh (by the server clock, so no earlier than this).
    kept_at: Option<Instant>,
}

impl Attempts for FairAttempts<'_> {
    type Won = LockGuard;

    async fn attempt(&mut self, deadline: Option<Instant>) -> Answer<LockGuard> {
        // Handed over on release: the lock is ours already, and the notice says its token.
        // Granted for what was left of the place the last attempt kept.
        let grant = self.wake.as_deref().and_then(|wake| {
            let expires = self.kept_at.map(|at| at + self.queue_timeout);
            self.target.granted(HoldKind::FAIR, wake, expires)
        });
        if let Some(guard) = grant {
            return Ok(Tried::Won(guard, Acquired::Taken));
        }
        // Join only while there is time left to wait: a last attempt (or a zero budget)
        // takes the lock in its turn but does not line up for another one.
        let join = deadline.is_none_or(|d| d > Instant::now());
        let how = How::Fair {
            queue_timeout: self.queue_timeout,
            join,
            queued: self.queued,
        };
        let sent = Instant::now();
        let tried = self
            .target
            .try_once(how, Refusal::never, |never| match never {})
            .await?;
        if matches!(tried, Tried::Busy(_)) {
            self.queued |= join;
            if join {
                self.kept_at = Some(sent);
            }
            let Target { key, holder, .. } = &self.target;
            self.wake.get_or_insert_with(|| key.wake_channel(holder));
        }
        Ok(tried)
    }

    fn key(&self, _lock: usize) -> &Key {
        self.target.key
    }

    /// Our turn is told on our client's channel for this lock, naming our holder.
    fn channel(&self, _lock: usize) -> &str {
        self.wake.as_deref().unwrap_or(self.target.key.channel())
    }

    fn holder(&self) -> Option<&str> {
        Some(self.target.holder.id())
    }

    /// A waiter keeps its place by trying again every third of its queue timeout (and
    /// takes a lock whose holder's lease ran out).
    fn recheck(&self) -> Option<Duration> {
        Some(self.queue_timeout / 3)
    }

    fn left_behind(&self) -> Option<BoxFuture> {
        self.queued.then(|| self.target.withdraw(Waiter::Queued))
    }

    fn kind(&self) -> &'static str {
        "fair"
    }

    fn unanswered(&mut self) -> bool {
        let kind = HoldKind::Exclusive(Exclusive::Fair);
        let forgot = self.target.forget_holder(kind, Some(Waiter::Queued));
        if forgot {
            self.queued = false;
            self.wake = None;
            self.kept_at = None;
        }
        forgot
    }
}
