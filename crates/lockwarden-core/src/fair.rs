//! The fair lock, [`FairLock`]: first come, first served across processes. Waiters queue
//! in the store and only the head is woken; one round trip per attempt. Its promises,
//! costs and Redis layout are documented on the type.

use std::time::Duration;

use tokio::time::Instant;

use crate::backend::{Attempt, Backend, Kind};
use crate::client::LockClient;
use crate::error::{BackendError, KeyError, LockError};
use crate::guard::LockGuard;
use crate::holder::Holder;
use crate::key::Key;
use crate::wait::Wait;

/// How long a waiter that stopped trying keeps its place in the queue, by default.
pub const DEFAULT_QUEUE_TIMEOUT: Duration = Duration::from_secs(5);

/// Companion key of the queue of holder ids (see [`Key::companion`]).
pub(crate) const QUEUE: &str = "queue";
/// Companion key of the waiters' deadlines.
pub(crate) const DEADLINES: &str = "deadlines";

/// The prefix of the channels on which waiters of `key` hear that their turn has come:
/// the lock's release channel and `:`; the holder id follows.
pub(crate) fn wake_prefix(key: &Key) -> String {
    format!("{}:", key.channel())
}

/// The channel on which `holder` hears that its turn at `key` has come.
pub(crate) fn wake_channel(key: &Key, holder: &Holder) -> String {
    format!("{}:{}", key.channel(), holder.id())
}

/// One named fair lock, made by [`LockClient::fair_lock`]: waiters get it in the order
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
/// queue at once. On release only the head is woken, through a channel of its own.
///
/// What it costs: one round trip per attempt, as the plain lock; a waiting holder retries
/// by itself every third of the queue timeout besides the wake-up on its turn; on Redis,
/// one pub/sub subscription per waiting holder (not per lock) and two more keys per
/// contended lock, which expire with the last waiter's deadline.
///
/// Held, a fair lock is an ordinary lock: the same hash, so the same re-entry, fencing
/// tokens, watchdog and [`LockGuard`]. Do not also take the same name with
/// [`LockClient::lock`]: that still excludes, but barges past the queue.
///
/// On Redis (6.0.6 or later, for `LPOS`), next to the lock hash and fencing key of
/// [`Key`], all in the lock's slot ([`KeyLayout::Tagged`](crate::KeyLayout::Tagged) names):
///
/// | what | Redis name |
/// |---|---|
/// | the queue: a list of holder ids, oldest first | `<lock key>:queue` |
/// | each waiter's deadline: a zset of holder id to ms, server clock | `<lock key>:deadlines` |
/// | the channel on which a waiter hears its turn | `<release channel>:<holder id>` |
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
    client: LockClient,
    key: Result<Key, KeyError>,
    lease: Option<Duration>,
    max_hold: Option<Duration>,
    holder: Option<Holder>,
    queue_timeout: Duration,
}

impl FairLock {
    pub(crate) fn new(client: LockClient, key: Result<Key, KeyError>) -> Self {
        Self {
            client,
            key,
            lease: None,
            max_hold: None,
            holder: None,
            queue_timeout: DEFAULT_QUEUE_TIMEOUT,
        }
    }

    /// Holds the lock for a fixed lease instead of keeping it alive with the watchdog,
    /// as [`Lock::lease`](crate::Lock::lease).
    ///
    /// ```
    /// # use lockwarden_core::LockClient;
    /// # use std::time::Duration;
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lockwarden_core::LockError> {
    /// let client = LockClient::in_memory();
    /// let guard = client.fair_lock("report").lease(Duration::from_secs(30)).acquire().await?;
    /// assert!(client.fair_lock("report").remaining_ttl().await?.unwrap() <= Duration::from_secs(30));
    /// # guard.release().await }
    /// ```
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = Some(lease);
        self
    }

    /// Caps how long the watchdog keeps the lock alive, as
    /// [`Lock::max_hold`](crate::Lock::max_hold).
    ///
    /// ```
    /// # use lockwarden_core::LockClient;
    /// # use std::time::Duration;
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lockwarden_core::LockError> {
    /// let client = LockClient::in_memory();
    /// let guard = client.fair_lock("batch").max_hold(Duration::from_secs(600)).acquire().await?;
    /// # guard.release().await }
    /// ```
    pub fn max_hold(mut self, max_hold: Duration) -> Self {
        self.max_hold = Some(max_hold);
        self
    }

    /// Acquires as `holder` (re-entering if it already holds the lock), as
    /// [`Lock::holder`](crate::Lock::holder). The holder is also the waiter's place in the
    /// queue, so one holder waits in one place however many tasks wait as it (and when one
    /// of them gives up, the others join again at the tail on their next retry).
    ///
    /// ```
    /// # use lockwarden_core::LockClient;
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lockwarden_core::LockError> {
    /// let client = LockClient::in_memory();
    /// let me = client.holder();
    /// let outer = client.fair_lock("ledger").holder(&me).acquire().await?;
    /// let inner = client.fair_lock("ledger").holder(&me).acquire().await?; // re-enters
    /// assert_eq!(client.fair_lock("ledger").hold_count(&me).await?, 2);
    /// inner.release().await?;
    /// outer.release().await
    /// # }
    /// ```
    pub fn holder(mut self, holder: &Holder) -> Self {
        self.holder = Some(holder.clone());
        self
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
        self.key
            .as_ref()
            .map_err(|e| LockError::InvalidKey(e.clone()))
    }

    /// Acquires the lock in its turn, waiting as long as it takes (also through a Redis
    /// outage, retrying with backoff; a waiter cut off for longer than its queue timeout
    /// loses its place and joins again at the tail).
    ///
    /// ```
    /// # use lockwarden_core::LockClient;
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lockwarden_core::LockError> {
    /// let client = LockClient::in_memory();
    /// let guard = client.fair_lock("ticket:1").acquire().await?;
    /// assert!(guard.fencing_token() > 0);
    /// guard.release().await
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
    /// let held = client.fair_lock("slot").acquire().await?;
    /// let late = client.fair_lock("slot").try_acquire(Duration::from_millis(20)).await;
    /// assert!(matches!(late, Err(LockError::Timeout { .. })));
    /// assert_eq!(client.fair_lock("slot").queued().await?, 0); // it left the queue
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
        let key = self.key()?;
        let holder = self
            .holder
            .clone()
            .or_else(Holder::current)
            .unwrap_or_else(|| self.client.holder());
        let inner = &self.client.inner;
        let backend = &inner.backend;
        let lease = self.lease.unwrap_or(inner.config.watchdog_timeout);
        let refresh = self.queue_timeout / 3;
        let started = Instant::now();
        let outcome = |outcome: &'static str| {
            tracing::debug!(%key, waited_ms = started.elapsed().as_millis() as u64, outcome, "fair lock acquire");
        };
        // Join only while there is time left to wait: a last attempt (or a zero budget)
        // takes the lock in its turn but does not line up for another one.
        let join = |at: Instant| deadline.is_none_or(|d| d > at);

        let mut place = Place {
            backend,
            key,
            holder: &holder,
            queued: false,
        };
        let mut sent = Instant::now();
        let mut joined = join(sent);
        let mut attempt = backend
            .fair_attempt(key, &holder, lease, self.queue_timeout, joined)
            .await;
        let mut wait = Wait::new(deadline);
        let channel = wake_channel(key, &holder);
        loop {
            let ttl = match attempt {
                Ok(Attempt::Taken { token } | Attempt::Reentered { token }) => {
                    place.queued = false;
                    outcome("acquired");
                    return Ok(self.guard(key, holder.clone(), token, sent));
                }
                Ok(Attempt::Busy { ttl }) => {
                    place.queued |= joined;
                    ttl.unwrap_or(refresh)
                }
                Ok(Attempt::Completed { .. }) => {
                    place.leave().await;
                    return Err(LockError::Backend(BackendError::Protocol(
                        "the store answered a fair acquire with a stored outcome".to_owned(),
                    )));
                }
                Err(error) if error.is_transient() && wait.can_back_off() => {
                    tracing::debug!(%key, %error, "fair acquire failed; retrying");
                    wait.back_off().await;
                    sent = Instant::now();
                    joined = join(sent);
                    attempt = backend
                        .fair_attempt(key, &holder, lease, self.queue_timeout, joined)
                        .await;
                    continue;
                }
                Err(error) => {
                    place.leave().await;
                    outcome("backend error");
                    return Err(error.into());
                }
            };
            let now = Instant::now();
            if wait.is_over(now) {
                place.leave().await;
                outcome("timeout");
                return Err(LockError::Timeout {
                    key: key.name().to_owned(),
                    retry_after: ttl,
                });
            }
            // Wake on our turn's notice (on our own channel), or by ourselves to keep our
            // place or to take a lock whose holder's lease ran out.
            let wake_at = wait.cap(now + ttl.min(refresh));
            wait.sleep(&inner.waiters, &channel, wake_at).await;
            sent = Instant::now();
            joined = join(sent);
            attempt = backend
                .fair_attempt(key, &holder, lease, self.queue_timeout, joined)
                .await;
        }
    }

    fn guard(&self, key: &Key, holder: Holder, token: u64, sent: Instant) -> LockGuard {
        LockGuard::new(
            self.client.clone(),
            Kind::Fair,
            key.clone(),
            holder,
            token,
            self.lease,
            self.max_hold,
            sent,
        )
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
        Ok(self.client.inner.backend.fair_queued(self.key()?).await?)
    }

    /// Whether anyone holds the lock.
    ///
    /// ```
    /// # use lockwarden_core::LockClient;
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lockwarden_core::LockError> {
    /// let client = LockClient::in_memory();
    /// let guard = client.fair_lock("door").acquire().await?;
    /// assert!(client.fair_lock("door").is_locked().await?);
    /// # guard.release().await }
    /// ```
    ///
    /// # Errors
    /// [`LockError::InvalidKey`] or [`LockError::Backend`].
    pub async fn is_locked(&self) -> Result<bool, LockError> {
        Ok(self.client.inner.backend.is_locked(self.key()?).await?)
    }

    /// Whether `holder` holds the lock.
    ///
    /// ```
    /// # use lockwarden_core::LockClient;
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lockwarden_core::LockError> {
    /// let client = LockClient::in_memory();
    /// let guard = client.fair_lock("door").acquire().await?;
    /// assert!(client.fair_lock("door").is_held_by(guard.holder()).await?);
    /// # guard.release().await }
    /// ```
    ///
    /// # Errors
    /// [`LockError::InvalidKey`] or [`LockError::Backend`].
    pub async fn is_held_by(&self, holder: &Holder) -> Result<bool, LockError> {
        Ok(self.hold_count(holder).await? > 0)
    }

    /// How many times `holder` holds the lock (0 if not at all).
    ///
    /// ```
    /// # use lockwarden_core::LockClient;
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lockwarden_core::LockError> {
    /// let client = LockClient::in_memory();
    /// assert_eq!(client.fair_lock("door").hold_count(&client.holder()).await?, 0);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`LockError::InvalidKey`] or [`LockError::Backend`].
    pub async fn hold_count(&self, holder: &Holder) -> Result<u64, LockError> {
        Ok(self
            .client
            .inner
            .backend
            .hold_count(self.key()?, holder)
            .await?)
    }

    /// The lease the current holder has left, `None` if the lock is free.
    ///
    /// ```
    /// # use lockwarden_core::LockClient;
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lockwarden_core::LockError> {
    /// let client = LockClient::in_memory();
    /// assert_eq!(client.fair_lock("door").remaining_ttl().await?, None);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`LockError::InvalidKey`] or [`LockError::Backend`].
    pub async fn remaining_ttl(&self) -> Result<Option<Duration>, LockError> {
        Ok(self.client.inner.backend.remaining_ttl(self.key()?).await?)
    }
}

/// A waiter's place in the queue, given up unless the lock was taken: awaited on a
/// timeout or error (so the queue is clean when `try_acquire` returns), in the background
/// when the acquire future is dropped. (An attempt still in flight at the drop is settled
/// by `redis::Unclaimed`, after its reply.)
struct Place<'a> {
    backend: &'a Backend,
    key: &'a Key,
    holder: &'a Holder,
    queued: bool,
}

impl Place<'_> {
    async fn leave(&mut self) {
        if !std::mem::take(&mut self.queued) {
            return;
        }
        if let Err(error) = self.backend.fair_leave(self.key, self.holder).await {
            tracing::debug!(key = %self.key, %error,
                "could not leave the fair queue; the queue timeout removes this waiter");
        }
    }
}

impl Drop for Place<'_> {
    fn drop(&mut self) {
        if !self.queued {
            return;
        }
        match self.backend {
            Backend::Memory(memory) => {
                memory.fair_leave(self.key, self.holder);
            }
            Backend::Redis(redis) => {
                let Ok(runtime) = tokio::runtime::Handle::try_current() else {
                    return;
                };
                let (redis, key, holder) = (redis.clone(), self.key.clone(), self.holder.clone());
                runtime.spawn(async move {
                    if let Err(error) = redis.fair_leave(&key, &holder).await {
                        tracing::debug!(%key, %error,
                            "could not leave the fair queue of a dropped acquire; the queue timeout removes this waiter");
                    }
                });
            }
        }
    }
}
