//! [`Semaphore`]: at most N holders at once across processes, each permit a lease of its
//! own; and its attempts for the acquire loop. Its promises, costs and Redis layout are
//! documented on the type.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::acquire::{self, Answer, Attempts, Tried};
use crate::engine::Engine;
use crate::error::{KeyError, LockError};
use crate::finish::BoxFuture;
use crate::guard::LockGuard;
use crate::hold::HoldKind;
use crate::key::Key;
use crate::lock::checked;
use crate::metrics::{self, Acquired};
use crate::options::{hold_options, HoldOptions};
use crate::store::contract::{How, LockStore, PermitsAsked, Refusal, Waiter};
use crate::target::Target;

/// The largest capacity a semaphore may have: 2^20 (1,048,576) permits. Each permit may be
/// a hold of its own, with an entry in the semaphore's hash and leases, and a release
/// grants waiters in one script: the bound keeps that work within what one Redis script
/// should do.
pub const MAX_PERMITS: u32 = 1 << 20;

/// The longest a waiter's place in line is kept without its asking again: it asks every
/// half of it (Redis keeps a place at most 509 s: see `lua/permits_prelude.lua`).
const MAX_REGISTRATION: Duration = Duration::from_secs(480);

/// One named semaphore of `capacity` permits, made by
/// [`LockClient::semaphore`](crate::LockClient::semaphore): at most that many permits are
/// held at once, by every process that uses it. Set options, then acquire a permit (or
/// several at once) or inspect it.
///
/// # What it promises
///
/// - **Never more than the capacity.** Permits held at once never add up to more than
///   the capacity stored with the semaphore (see *Capacity* below), while every holder
///   keeps its lease. As for every lock, a holder paused past its lease (or cut off from
///   Redis) loses its permits, and its guard says so ([`LockGuard::lost`]); the fencing
///   token is what a resource checks against a late holder.
/// - **Each permit is a lease.** A permit is held by a holder made for that acquisition,
///   kept alive by the client's one watchdog (or for a fixed [`lease`](Self::lease)), and
///   given back on [`LockGuard::release`], on drop, or when its acquisition is cancelled.
///   A holder that dies without giving it back loses it when its lease ends, **by the
///   server's clock**: the next call that looks at the semaphore takes it back, and a
///   waiter wakes for it without polling (it sleeps until a grant or until enough leases
///   could have ended to let it in, whichever comes first).
/// - **Releases grant, in arrival order.** A waiter that does not get its permits waits
///   in line (on Redis, a sorted set of waiters by arrival, by the server's clock). A
///   release grants what it frees to the waiters it now lets in, in the same step, and
///   tells only them, by name, each with its own fencing token: a waiter holds its
///   permits without asking again, and no other waiter is woken. A waiter keeps its place
///   by trying again every half watchdog lease; one that dies leaves the line within a
///   watchdog lease; one that gives up leaves at once (giving back permits granted to it
///   meanwhile).
/// - **All or nothing.** [`acquire_many`](Self::acquire_many) takes k permits at once or
///   none; asking for more than the capacity is refused at once
///   ([`LockError::TooManyPermits`]).
/// - **A fencing token per permit hold**, strictly greater than every token issued for
///   the semaphore before.
///
/// # Order
///
/// Waiters are granted permits in arrival order. By default a waiter for many permits at
/// the head of the line does not hold back smaller requests behind it, or newcomers,
/// when what is free is too little for it but enough for them (large requests may then
/// wait long). With [`fair`](Self::fair), the order is strict: nobody gets permits before
/// a waiter that arrived earlier, newcomers included. With one permit per acquisition
/// both behave alike.
///
/// # Capacity
///
/// The capacity (and the order) is stored with the semaphore while it is in use: held or
/// waited for. The first acquisition of an idle semaphore stores its own; while it is in
/// use, that stored capacity counts for every client, whatever capacity they were made
/// with (so replicas that disagree for a while, during a deploy, never exceed the stored
/// one). An idle semaphore stores nothing. [`set_capacity`](Self::set_capacity) changes
/// the capacity of a semaphore in use, for every client, until it is idle again: it never
/// takes a held permit back (with less room, new holders wait until enough are released).
/// [`state`](Self::state) says what is stored.
///
/// # Not re-entrant
///
/// Each acquisition is a holder of its own, whatever [`Holder::scope`](crate::Holder::scope)
/// encloses it: a task that takes a permit and then asks again takes a second one (and
/// waits if there is none), as a counting semaphore does.
///
/// # Layout on Redis
///
/// One sorted set at [`Key::redis_key`] holds it all, each part in a range of scores:
/// the member `capacity`, scored `-<capacity>` (`-<capacity> - 0.5` with
/// [`fair`](Self::fair)); each permit held, scored by its lease's deadline (server ms): a
/// hold of k permits is the members `<k>:<lease ms>:<holder id>`, then the same with `#2`
/// .. `#k`; each waiter, the member `<k>:<lease ms>:<holder id>` (what it waits for, and
/// the lease a grant gives it), scored from 1e15 by its place: its arrival (server ms, a
/// ms after the last place at least, so that places never tie) × 1024 plus when its
/// registration runs out (server seconds, modulo 1024). A grant moves
/// a waiter's member to its lease's deadline, and tells `permits:<first token>:<holder
/// id> ..` on `<key>:granted`. So the permits in use are one `ZCOUNT`, holds whose lease
/// ran out go with one `ZREMRANGEBYSCORE` by the server's clock, and a release of a
/// semaphore the client has not seen contended is plain commands in one round trip (`ZREM`
/// of its members, `ZREMRANGEBYRANK <key> -1 0`, which takes the capacity when it is the
/// last member left, `ZCOUNT` of the line), followed by the granting script only when
/// someone waits; while the client sees waiters (its own in line, or left by its last
/// release), it releases with the script, which grants in the same step. `<key>:fence` keeps the last fencing token issued: written with the take's lease
/// when missing, moved with the set by renewals, waiters and takes of a semaphore in use
/// (a lease past their deadline), left alone by the take of an idle one; a token issued
/// while it is missing is the server clock in µs, so tokens still grow, as a lock's do.
/// Scripts in `lua/permits_*.lua`. A name is a
/// semaphore or a lock of another kind, not both: each keeps the other out, on both
/// stores.
///
/// ```
/// use lockwarden_core::{LockClient, LockError};
/// use std::time::Duration;
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), LockError> {
/// let client = LockClient::in_memory(); // LockClient::connect(url).await? for Redis
/// let exports = client.semaphore("exports:acct_7", 2);
/// let first = exports.acquire().await?;
/// let second = exports.acquire().await?;
/// // Both permits are held: a third caller waits, here at most 20 ms.
/// assert!(matches!(
///     exports.try_acquire(Duration::from_millis(20)).await,
///     Err(LockError::Timeout { .. })
/// ));
/// first.release().await?;
/// let third = exports.try_acquire(Duration::from_secs(1)).await?;
/// # drop((second, third));
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
#[must_use = "a Semaphore does nothing until it is acquired or inspected"]
pub struct Semaphore {
    engine: Arc<Engine>,
    key: Result<Key, KeyError>,
    capacity: u32,
    fifo: bool,
    options: HoldOptions,
}

hold_options!(Semaphore, "client.semaphore(\"report\", 4)", leases);

/// What a semaphore in use looks like (see [`Semaphore::state`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct SemaphoreState {
    /// The capacity stored with it.
    pub capacity: u32,
    /// Permits held.
    pub in_use: u32,
    /// Acquisitions waiting in line.
    pub waiting: u32,
}

impl Semaphore {
    pub(crate) fn new(engine: Arc<Engine>, key: Result<Key, KeyError>, capacity: u32) -> Self {
        Self {
            engine,
            key,
            capacity,
            fifo: false,
            options: HoldOptions::default(),
        }
    }

    /// The validated key.
    ///
    /// # Errors
    /// [`LockError::InvalidKey`] if the name was rejected.
    pub fn key(&self) -> Result<&Key, LockError> {
        checked(&self.key)
    }

    /// The capacity this handle stores when it finds the semaphore idle.
    pub fn capacity(&self) -> u32 {
        self.capacity
    }

    /// Grants permits in strict arrival order: nobody gets permits before a waiter that
    /// arrived earlier, newcomers included (see *Order* on [`Semaphore`]). Stored with the
    /// semaphore, as its capacity is.
    ///
    /// ```
    /// # use lockwarden_core::LockClient;
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lockwarden_core::LockError> {
    /// let client = LockClient::in_memory();
    /// let three = client.semaphore("render", 4).fair().acquire_many(3).await?;
    /// # three.release().await }
    /// ```
    pub fn fair(mut self) -> Self {
        self.fifo = true;
        self
    }

    /// Acquires one permit, waiting as long as it takes (through a Redis outage too).
    ///
    /// ```
    /// # use lockwarden_core::LockClient;
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lockwarden_core::LockError> {
    /// let client = LockClient::in_memory();
    /// let permit = client.semaphore("downstream", 8).acquire().await?;
    /// permit.release().await
    /// # }
    /// ```
    ///
    /// # Errors
    /// [`LockError::InvalidPermits`] for a capacity of 0 or above [`MAX_PERMITS`],
    /// [`LockError::TooManyPermits`], [`LockError::InvalidKey`] or [`LockError::Backend`].
    pub async fn acquire(&self) -> Result<LockGuard, LockError> {
        self.acquire_until(1, None).await
    }

    /// Acquires one permit, waiting at most `wait` (zero: one attempt, which never waits
    /// in line). Waiting sleeps until a release grants the permit or a lease could have
    /// ended; it never polls. Dropping the future at any point leaves nothing held and
    /// nobody in line.
    ///
    /// ```
    /// # use lockwarden_core::{LockClient, LockError};
    /// # use std::time::Duration;
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), LockError> {
    /// let client = LockClient::in_memory();
    /// let slots = client.semaphore("slots", 1);
    /// let held = slots.acquire().await?;
    /// let late = slots.try_acquire(Duration::from_millis(20)).await;
    /// assert!(matches!(late, Err(LockError::Timeout { .. })));
    /// held.release().await
    /// # }
    /// ```
    ///
    /// # Errors
    /// [`LockError::Timeout`] once `wait` is spent, and as [`acquire`](Self::acquire).
    pub async fn try_acquire(&self, wait: Duration) -> Result<LockGuard, LockError> {
        self.acquire_until(1, Instant::now().checked_add(wait))
            .await
    }

    /// Acquires `permits` permits at once (all or none, one guard), waiting as long as it
    /// takes.
    ///
    /// ```
    /// # use lockwarden_core::LockClient;
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lockwarden_core::LockError> {
    /// let client = LockClient::in_memory();
    /// let pool = client.semaphore("db-connections", 10);
    /// let batch = pool.acquire_many(4).await?;
    /// assert_eq!(pool.state().await?.map(|s| s.in_use), Some(4));
    /// batch.release().await
    /// # }
    /// ```
    ///
    /// # Errors
    /// [`LockError::InvalidPermits`] for 0 permits, and as [`acquire`](Self::acquire).
    pub async fn acquire_many(&self, permits: u32) -> Result<LockGuard, LockError> {
        self.acquire_until(permits, None).await
    }

    /// Acquires `permits` permits at once (all or none), waiting at most `wait`.
    ///
    /// # Errors
    /// As [`try_acquire`](Self::try_acquire) and [`acquire_many`](Self::acquire_many).
    pub async fn try_acquire_many(
        &self,
        permits: u32,
        wait: Duration,
    ) -> Result<LockGuard, LockError> {
        self.acquire_until(permits, Instant::now().checked_add(wait))
            .await
    }

    /// The semaphore's state now (its holds and registrations that ran out taken back
    /// first), `None` if it is idle: nobody holds or waits, nothing is stored.
    ///
    /// ```
    /// # use lockwarden_core::LockClient;
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lockwarden_core::LockError> {
    /// let client = LockClient::in_memory();
    /// let exports = client.semaphore("exports", 3);
    /// assert_eq!(exports.state().await?, None);
    /// let permit = exports.acquire().await?;
    /// let state = exports.state().await?.expect("in use");
    /// assert_eq!((state.capacity, state.in_use, state.waiting), (3, 1, 0));
    /// # permit.release().await }
    /// ```
    ///
    /// # Errors
    /// [`LockError::InvalidKey`] or [`LockError::Backend`].
    pub async fn state(&self) -> Result<Option<SemaphoreState>, LockError> {
        let state = self.engine.store().permits(self.key()?).await?;
        Ok(state.map(|s| SemaphoreState {
            capacity: s.capacity,
            in_use: s.used,
            waiting: s.waiting,
        }))
    }

    /// Changes the capacity of the semaphore while it is in use, for every client, until
    /// it is idle again (an idle one stores nothing: the next acquisition stores its own).
    /// No held permit is taken back; more room is granted to waiters at once. An
    /// operator's action; returns whether the semaphore was in use.
    ///
    /// ```
    /// # use lockwarden_core::LockClient;
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lockwarden_core::LockError> {
    /// let client = LockClient::in_memory();
    /// let uploads = client.semaphore("uploads", 2);
    /// let permit = uploads.acquire().await?;
    /// assert!(uploads.set_capacity(5).await?);
    /// assert_eq!(uploads.state().await?.map(|s| s.capacity), Some(5));
    /// # permit.release().await }
    /// ```
    ///
    /// # Errors
    /// [`LockError::InvalidPermits`] for 0 or more than [`MAX_PERMITS`],
    /// [`LockError::InvalidKey`] or [`LockError::Backend`].
    pub async fn set_capacity(&self, capacity: u32) -> Result<bool, LockError> {
        let key = self.key()?;
        check_capacity(key, capacity)?;
        let changed = self.engine.store().set_capacity(key, capacity).await?;
        tracing::warn!(%key, capacity, changed, "semaphore capacity set");
        Ok(changed)
    }

    /// Frees every permit whoever holds it, and wakes every waiter at once (they keep their
    /// places in line). An operator's action, which breaks the limit for the current
    /// holders: they learn of it at their next renewal (their guards report the permits
    /// lost). Returns whether the semaphore was in use.
    ///
    /// ```
    /// # use lockwarden_core::LockClient;
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lockwarden_core::LockError> {
    /// let client = LockClient::in_memory();
    /// let stuck = client.semaphore("jobs", 1).acquire().await?;
    /// assert!(client.semaphore("jobs", 1).force_unlock().await?);
    /// assert_eq!(client.semaphore("jobs", 1).state().await?, None);
    /// # drop(stuck); Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`LockError::InvalidKey`] or [`LockError::Backend`].
    pub async fn force_unlock(&self) -> Result<bool, LockError> {
        crate::inspect::force_unlock(&self.engine, self.key()?).await
    }

    async fn acquire_until(
        &self,
        permits: u32,
        deadline: Option<Instant>,
    ) -> Result<LockGuard, LockError> {
        let key = self.key()?;
        check_capacity(key, self.capacity)?;
        if permits == 0 {
            return Err(invalid(
                key,
                "0 permits asked; ask for 1 or more".to_owned(),
            ));
        }
        if permits > self.capacity {
            return Err(LockError::TooManyPermits {
                key: key.name().to_owned(),
                asked: permits,
                capacity: self.capacity,
            });
        }
        let attempts = PermitAttempts {
            target: Target::fresh(&self.engine, key, &self.options),
            asked: PermitsAsked {
                permits,
                capacity: self.capacity,
                fifo: self.fifo,
                // How long a place in line outlives the waiter's last attempt: long enough
                // for the retry that keeps it (at half of it, at the latest). Redis keeps a
                // place at most 509 s without asking.
                register: self.engine.watchdog().lease().min(MAX_REGISTRATION),
                queued: false,
            },
            registered: None,
        };
        acquire::acquire(self.engine.waiters(), attempts, deadline).await
    }
}

fn check_capacity(key: &Key, capacity: u32) -> Result<(), LockError> {
    match capacity {
        0 => Err(invalid(
            key,
            "a capacity of 0 permits; a semaphore needs 1 or more".to_owned(),
        )),
        c if c > MAX_PERMITS => Err(invalid(
            key,
            format!("a capacity of {c} permits; at most {MAX_PERMITS} are allowed"),
        )),
        _ => Ok(()),
    }
}

fn invalid(key: &Key, problem: String) -> LockError {
    LockError::InvalidPermits {
        key: key.name().to_owned(),
        problem,
    }
}

/// A semaphore's attempts: a refused one waits in line in the store, to be granted its
/// permits by a release and told so by name on the semaphore's channel.
struct PermitAttempts<'a> {
    target: Target<'a>,
    asked: PermitsAsked,
    /// When the last attempt that kept a place in line was sent (so giving up must leave
    /// it; a grant came after it).
    registered: Option<Instant>,
}

impl PermitAttempts<'_> {
    fn waiter(&self) -> Waiter {
        Waiter::Permits {
            permits: self.asked.permits,
            lease: self.target.lease(),
        }
    }

    /// The kind of the hold this acquisition takes.
    fn hold(&self) -> HoldKind {
        HoldKind::Permits {
            permits: self.asked.permits,
            lease: self.target.lease(),
        }
    }
}

impl Attempts for PermitAttempts<'_> {
    type Won = LockGuard;

    async fn attempt(&mut self, deadline: Option<Instant>) -> Answer<LockGuard> {
        let permits = self.asked.permits;
        // Granted by a release: the permits are ours already, and the notice says the
        // token. A grant is held for this acquisition's lease from when it was made, which
        // is after the last attempt that kept the place in line was sent.
        let expires = self.registered.map(|at| at + self.target.lease());
        let channel = self.target.key.names().granted();
        if let Some(guard) = self.target.granted(self.hold(), channel, expires) {
            return Ok(Tried::Won(guard.holding_permits(permits), Acquired::Taken));
        }
        // A place in line never outlives the wait budget (none for a last attempt).
        let sent = Instant::now();
        let register = deadline.map_or(self.asked.register, |d| {
            self.asked.register.min(d.saturating_duration_since(sent))
        });
        let how = How::Permits(PermitsAsked {
            register,
            queued: self.registered.is_some(),
            ..self.asked
        });
        let target = &self.target;
        let tried = target
            .try_once(how, Refusal::capacity, |capacity| {
                LockError::TooManyPermits {
                    key: target.key.name().to_owned(),
                    asked: permits,
                    capacity,
                }
            })
            .await?;
        if matches!(tried, Tried::Busy(_)) && !register.is_zero() && self.registered.is_none() {
            metrics::permits_waiting(1.0);
        }
        if matches!(tried, Tried::Busy(_)) && !register.is_zero() {
            self.registered = Some(sent);
        }
        Ok(tried.map(|guard| guard.holding_permits(permits)))
    }

    fn key(&self, _lock: usize) -> &Key {
        self.target.key
    }

    fn channel(&self, _lock: usize) -> &str {
        self.target.key.names().granted()
    }

    /// A waiter is granted its permits by name.
    fn holder(&self) -> Option<&str> {
        Some(self.target.holder.id())
    }

    /// A waiter tries again before its place in line runs out.
    fn recheck(&self) -> Option<Duration> {
        Some(self.asked.register / 2)
    }

    fn left_behind(&self) -> Option<BoxFuture> {
        self.registered.map(|_| self.target.withdraw(self.waiter()))
    }

    fn kind(&self) -> &'static str {
        "permits"
    }

    fn unanswered(&mut self) -> bool {
        let waiter = self.waiter();
        let forgot = self.target.forget_holder(self.hold(), Some(waiter));
        if forgot {
            self.stop_waiting();
        }
        forgot
    }
}

impl PermitAttempts<'_> {
    /// This acquisition no longer waits in line (in the metrics).
    fn stop_waiting(&mut self) {
        if self.registered.take().is_some() {
            metrics::permits_waiting(-1.0);
        }
    }
}

impl Drop for PermitAttempts<'_> {
    fn drop(&mut self) {
        self.stop_waiting();
    }
}
