//! The store contract: what every lock store (Redis, in-process) does, in one trait, and
//! the requests and answers it speaks. Everything above the store talks to this contract.

use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;

use crate::error::BackendError;
use crate::hold::{Exclusive, Hold, HoldKind, RwMode};
use crate::holder::Holder;
use crate::key::Key;
use crate::policy::Gcra;
use crate::rate_key::Buckets;

/// What every store operation returns: its answer, or why the store failed.
pub(crate) type Result<T, E = BackendError> = std::result::Result<T, E>;

/// What every lock store does. Each operation is atomic (one Lua script on Redis, one
/// critical section in-process; on Redis a release nobody can have re-entered is `HDEL`,
/// then its notice if a waiter marked the lock, see [`Reentries::None`]) and one round
/// trip (two for that release when the delete finds the mark); each promise below holds
/// on both stores alike, which the conformance tests check.
///
/// - **Acquire** never blocks: a busy lock is answered with its holder's remaining lease,
///   and the caller waits on the lock's channel (see [`Waiters`](crate::waiters::Waiters),
///   which the store wakes when a lock becomes free). An attempt whose caller goes away
///   while it is in flight is undone once its answer is in: no lock is held for nobody.
/// - **Re-entry** by the same holder counts up; each release counts down; at zero the lock
///   is free and its waiters are woken (the fair lock's head only; every reader of a
///   read-write lock open to readers; every waiter of a completed claim). A semaphore's
///   permits are never re-entered (each acquisition is a holder of its own); a release
///   grants what it frees to as many waiters, in arrival order, as it lets in.
/// - **Fencing tokens** strictly increase per lock, across holders, while the lock's last
///   token is kept (Redis: its fencing key, see `LockGuard::fencing_token`) or the store's
///   clock is past it: a token is one above the last token, or the clock when there is
///   none. With the key lost *and* the clock stepped back, Redis's can go backwards.
/// - **Leases** are kept by the store: a hold not renewed or released in time expires.
///   Re-entries share one expiry, which neither a re-entry nor a renewal ever shortens:
///   a hold lasts as long as the latest any of its guards asked for.
pub(crate) trait LockStore {
    /// `"redis"` or `"in-memory"`.
    fn name(&self) -> &'static str;

    /// One attempt to take or re-enter a lock.
    fn acquire(&self, ask: &Acquire<'_>) -> impl Future<Output = Result<Attempt>> + Send;

    /// Takes (or re-enters) every lock of a multi-lock, or none.
    fn acquire_all(
        &self,
        ask: &AcquireAll<'_>,
    ) -> impl Future<Output = Result<MultiAttempt>> + Send;

    /// Releases one hold, given the fencing token it was given (if known: it tells a
    /// release that ran already from a hold that was lost, see [`Released::Ended`]), and
    /// whether anyone may have re-entered it.
    fn release(
        &self,
        hold: &Hold,
        token: Option<u64>,
        reentries: Reentries,
    ) -> impl Future<Output = Result<Released>> + Send;

    /// Releases a hold whose guard was dropped, without an answer: at once in-process,
    /// batched with others on Redis. `resend_until`: a release that gets no answer may
    /// be sent again until then (its count was 1, see `settle.rs`).
    fn release_later(&self, hold: Hold, resend_until: Option<Instant>, reentries: Reentries);

    /// Resolves once every release [`release_later`](Self::release_later) took before this
    /// call has been answered or given up on (a shutdown waits for it, within its bound).
    fn flush(&self) -> impl Future<Output = ()> + Send;

    /// Completes a claim: releases one hold and, if the holder still held it, stores
    /// `outcome` for claims of the key to find, waking every waiter.
    fn complete(
        &self,
        hold: &Hold<Exclusive>,
        token: Option<u64>,
        outcome: Outcome<'_>,
    ) -> impl Future<Output = Result<Released>> + Send;

    /// Renews each hold whose holder still has it (see [`Renewed`]) for at least its
    /// lease from now; one held longer already (a fixed-lease re-entry) keeps its expiry.
    fn renew_all(&self, renewals: &[Renewal]) -> impl Future<Output = Renewed> + Send;

    /// A waiter gives up: leaves a fair lock's queue, or withdraws a waiting writer.
    fn withdraw(
        &self,
        waiter: Waiter,
        key: &Key,
        holder: &Holder,
    ) -> impl Future<Output = Result<()>> + Send;

    /// Deletes a lock whoever holds it, whatever its kind, and wakes its waiters as its
    /// release would (a plain waiter or writer, every reader, the fair queue's head);
    /// whether there was one.
    fn force_unlock(&self, key: &Key) -> impl Future<Output = Result<bool>> + Send;

    /// How many times the holder holds this hold (0: not at all).
    fn hold_count(&self, hold: &Hold) -> impl Future<Output = Result<u64>> + Send;

    /// The lease the lock has left (any kind), `None` if nobody holds it.
    fn remaining_ttl(&self, key: &Key) -> impl Future<Output = Result<Option<Duration>>> + Send;

    /// Waiters in a fair lock's queue, counting any that died less than their queue
    /// timeout ago.
    fn queued(&self, key: &Key) -> impl Future<Output = Result<usize>> + Send;

    /// Writers registered as waiting for a read-write lock, counting any whose
    /// registration ran out since the lock was last tried (until the last one has).
    fn waiting_writers(&self, key: &Key) -> impl Future<Output = Result<usize>> + Send;

    /// A semaphore's state (its holds and registrations that ran out dropped first);
    /// `None` if it is idle (nothing stored).
    fn permits(&self, key: &Key) -> impl Future<Output = Result<Option<PermitsState>>> + Send;

    /// Changes the capacity of a semaphore in use, granting new room to waiters at once
    /// and taking no held permit back; whether it was in use (an idle one stores nothing).
    fn set_capacity(&self, key: &Key, capacity: u32) -> impl Future<Output = Result<bool>> + Send;

    /// Writes `value` as `key`'s fenced value if no larger token than `token` wrote it
    /// before; `Some(newest)` (the larger token) if refused.
    fn fenced_write(
        &self,
        key: &Key,
        token: u64,
        value: &[u8],
    ) -> impl Future<Output = Result<Option<u64>>> + Send;

    /// `key`'s fenced value and the token that wrote it, if any.
    fn fenced_read(&self, key: &Key)
        -> impl Future<Output = Result<Option<(u64, Vec<u8>)>>> + Send;

    /// One rate decision for one key (see [`RateAsk`]): its charge applied to the key's
    /// bucket under every policy, or under none when any policy refuses it, by the
    /// store's clock (Redis: `TIME` inside the script), in one step; each bucket's debt
    /// afterwards. A bucket is kept only while it is not full.
    fn rate(&self, ask: &RateAsk<'_>) -> impl Future<Output = Result<Debts>> + Send;
}

/// One acquire attempt: who wants which lock, for how long, in which way.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Acquire<'a> {
    pub(crate) key: &'a Key,
    pub(crate) holder: &'a Holder,
    pub(crate) lease: Duration,
    pub(crate) how: How,
    /// Whether `holder` was made for this acquisition (see `settle.rs`). It then holds
    /// the lock only if this very attempt ran before: a cluster client sends a call again
    /// when its connection broke before the reply. Redis answers that as taken, without
    /// counting a re-entry; the in-process store runs each attempt once.
    pub(crate) fresh: bool,
    /// Whether a plain hold (or a claim) taken gets a fencing token; without, its token
    /// is 0 and the store keeps no fencing key for it (fair and read-write holds always
    /// get one).
    pub(crate) fenced: bool,
    /// Whether an earlier attempt of this acquisition was refused, so that it waits: a
    /// plain lock (or a claim) that refuses it then carries a waiter's mark, and the
    /// release that finds the mark sends the notice (see `lua/acquire.lua`). Other kinds
    /// tell their waiters otherwise.
    pub(crate) waiting: bool,
}

impl Acquire<'_> {
    /// What a refused attempt may leave in the store while it waits.
    pub(crate) fn waiter(&self) -> Option<Waiter> {
        match self.how {
            How::Plain | How::Claim => None,
            How::Fair { .. } => Some(Waiter::Queued),
            How::Read { .. } => Some(Waiter::Reader),
            How::Write { .. } => Some(Waiter::Writer),
            How::Permits(asked) => Some(Waiter::Permits {
                permits: asked.permits,
                lease: self.lease,
            }),
        }
    }
}

/// One attempt to take several locks as one.
#[derive(Debug, Clone, Copy)]
pub(crate) struct AcquireAll<'a> {
    /// Sorted by Redis key, without repeats: one order for every caller.
    pub(crate) keys: &'a [Key],
    pub(crate) holder: &'a Holder,
    pub(crate) lease: Duration,
    /// As for [`Acquire::fresh`]; on a cluster also what an earlier attempt of this
    /// acquisition took in one slot and could not give back is held once, not twice.
    pub(crate) fresh: bool,
    /// As for [`Acquire::waiting`]: the busy lock then carries a waiter's mark.
    pub(crate) waiting: bool,
}

/// The way of an acquire attempt, per kind of lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum How {
    /// The plain lock.
    Plain,
    /// The plain lock, unless a stored outcome says the work is done.
    Claim,
    /// The fair lock; `join` queues a waiter that does not get it, for `queue_timeout`.
    /// `queued`: an earlier attempt of this acquisition queued, so finding the lock held
    /// by its holder means the lock was granted to it on release (its notice was missed):
    /// taken, not re-entered.
    Fair {
        queue_timeout: Duration,
        join: bool,
        queued: bool,
    },
    /// The read side of a read-write lock; a refused reader is registered as waiting for
    /// `register` (zero: a single try, never registered), to be admitted by the release
    /// that opens the lock to readers. `registered`: an earlier attempt of this
    /// acquisition registered, so finding the holder's read hold means it was admitted
    /// (its notice was missed): taken, not re-entered.
    Read {
        register: Duration,
        registered: bool,
    },
    /// The write side; a refused writer is registered as waiting for `register`, which
    /// holds back new readers.
    Write { register: Duration },
    /// `permits` of a semaphore of `capacity` (stored if it is idle, else the stored one
    /// counts), in strict arrival order if `fifo` (stored with it); a refused waiter waits
    /// in line for `register` (zero: a single try), to be granted permits by a release,
    /// held for its lease from then.
    Permits(PermitsAsked),
}

/// What an acquisition of a semaphore's permits asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PermitsAsked {
    pub(crate) permits: u32,
    pub(crate) capacity: u32,
    pub(crate) fifo: bool,
    pub(crate) register: Duration,
    /// Whether an earlier attempt of this acquisition waited in line: then it may be there
    /// still, or have been granted its permits (its notice missed). The first attempt can
    /// be neither, and Redis does not look.
    pub(crate) queued: bool,
}

impl How {
    /// The kind of the hold an attempt of this way takes, for `lease`.
    pub(crate) fn kind(self, lease: Duration) -> HoldKind {
        match self {
            How::Plain | How::Claim => HoldKind::PLAIN,
            How::Fair { .. } => HoldKind::FAIR,
            How::Read { .. } => HoldKind::ReadWrite(RwMode::Read),
            How::Write { .. } => HoldKind::ReadWrite(RwMode::Write),
            How::Permits(asked) => HoldKind::Permits {
                permits: asked.permits,
                lease,
            },
        }
    }

    /// The name of the kind of hold it takes, in logs.
    pub(crate) fn name(self) -> &'static str {
        self.kind(Duration::ZERO).name()
    }
}

/// Answer of one acquire attempt. A store answers `Attempt<Refusal>`; the kind that
/// asked narrows it ([`Attempt::narrowed`]) to `Attempt<R>`, `R` being what else that kind
/// may be answered, so no caller meets an answer its kind cannot get (a plain lock's is
/// `Attempt<Never>`), as `Hold<K>` narrows holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Attempt<R = Refusal> {
    /// A new hold, with a fresh fencing token (a read phase's, for a reader joining one).
    Taken { token: u64 },
    /// The holder held it already; its count went up by one.
    Reentered { token: u64 },
    /// Refused for now; retry on a notice or after `ttl` at the latest (`None`: the lock
    /// has no expiry, so it is not one of ours).
    Busy { ttl: Option<Duration> },
    /// Refused in the way only its kind is.
    Refused(R),
}

/// What a store may answer an attempt besides a take, a re-entry or a wait.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// A claim found the work done: the outcome its holder stored (no lock was taken).
    Completed { outcome: Vec<u8> },
    /// A write asked by a holder that holds only the read side: it would wait for itself.
    Upgrade,
    /// More permits asked than the semaphore has (its stored capacity): never granted.
    OverCapacity { capacity: u32 },
}

/// No answer but a take, a re-entry or a wait: what a plain, fair or read attempt gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Never {}

/// A write's refused upgrade, narrowed (see [`Refusal::Upgrade`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Upgrade;

impl Refusal {
    /// For the kinds no store refuses (plain, fair, read).
    pub(crate) fn never(self) -> Option<Never> {
        None
    }

    /// A claim's: the stored outcome.
    pub(crate) fn outcome(self) -> Option<Vec<u8>> {
        match self {
            Refusal::Completed { outcome } => Some(outcome),
            _ => None,
        }
    }

    /// A write's: an upgrade it would wait for itself in.
    pub(crate) fn upgrade(self) -> Option<Upgrade> {
        matches!(self, Refusal::Upgrade).then_some(Upgrade)
    }

    /// A semaphore's: the capacity the permits asked exceed.
    pub(crate) fn capacity(self) -> Option<u32> {
        match self {
            Refusal::OverCapacity { capacity } => Some(capacity),
            _ => None,
        }
    }
}

impl Attempt {
    /// This answer as the attempt `how` may get it, its refusal kept by `narrow` (one of
    /// [`Refusal`]'s methods): one the kind cannot get is the store breaking the
    /// protocol, said here once rather than by every caller.
    pub(crate) fn narrowed<R>(
        self,
        how: How,
        narrow: impl FnOnce(Refusal) -> Option<R>,
    ) -> Result<Attempt<R>, BackendError> {
        Ok(match self {
            Attempt::Taken { token } => Attempt::Taken { token },
            Attempt::Reentered { token } => Attempt::Reentered { token },
            Attempt::Busy { ttl } => Attempt::Busy { ttl },
            Attempt::Refused(refusal) => {
                let said = format!("{refusal:?}");
                match narrow(refusal) {
                    Some(refused) => Attempt::Refused(refused),
                    None => {
                        return Err(BackendError::Protocol(format!(
                            "the store answered a {} acquire with {said}",
                            how.name()
                        )))
                    }
                }
            }
        })
    }
}

/// Answer of one attempt to take several locks at once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum MultiAttempt {
    /// Every lock is now held by the holder: the token of each, in the order asked.
    Taken { tokens: Vec<u64> },
    /// The lock at `index` is held by another holder (`ttl` as in [`Attempt::Busy`]);
    /// nothing was taken.
    Busy { index: usize, ttl: Option<Duration> },
}

/// Answer of one release.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Released {
    /// This hold ended (the lock is free, or other holds of a read-write lock remain).
    Freed,
    /// The holder still holds it this many times.
    Remaining(u64),
    /// The holder did not hold it.
    NotHeld,
    /// The holder did not hold it, and nobody took the lock since the hold's fencing
    /// token: this very release ran before (a cluster client sent it again when its
    /// connection broke), or the hold ran out with nobody after it. Only Redis answers it.
    Ended,
}

/// Whether a hold may have been re-entered when it is released.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Reentries {
    /// Its holder was made for the acquisition and never handed out, so nobody could
    /// acquire as it: the count is 1. Redis then frees a plain lock with plain commands
    /// instead of `release.lua` (`HDEL` of the holder's field and of a waiter's mark,
    /// which deletes the hash with its last field, and the notice if someone waits): a
    /// third of a cycle's Redis work.
    None,
    /// Its holder was made for the acquisition and handed out, but every clone handed out
    /// is gone: nobody can acquire as it any more, so the count is 1 too. Released as
    /// [`None`](Self::None) is, but a re-entry counted down since may have left its call
    /// id beside the count on a cluster (see `lua/once.lua`).
    NoneLeft,
    /// Anything else: the count is read and decremented.
    Possible,
}

/// An outcome to store on release, completing a claim.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Outcome<'a> {
    pub(crate) bytes: &'a [u8],
    pub(crate) keep: Duration,
}

/// One hold for the watchdog to renew.
#[derive(Debug, Clone)]
pub(crate) struct Renewal {
    pub(crate) hold: Hold,
    pub(crate) lease: Duration,
}

/// What a bulk renewal answers.
#[derive(Debug)]
pub(crate) struct Renewed {
    /// Per renewal, in order: whether its holder still had it (`false`: gone), or `None`
    /// if its call failed. On a cluster a node that does not answer fails only the
    /// renewals of its slots.
    pub(crate) held: Vec<Option<bool>>,
    /// The first failure, if any.
    pub(crate) error: Option<BackendError>,
}

/// A waiter that leaves something in the store while it waits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Waiter {
    /// Its place in a fair lock's queue.
    Queued,
    /// Its registration as a waiting writer of a read-write lock.
    Writer,
    /// Its registration as a waiting reader of a read-write lock (and an admission it
    /// has not taken up).
    Reader,
    /// Its place in a semaphore's line, waiting for `permits` to hold for `lease` (and a
    /// grant it has not taken up).
    Permits { permits: u32, lease: Duration },
}

/// A semaphore in use, as the store has it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PermitsState {
    /// The stored capacity.
    pub(crate) capacity: u32,
    /// Permits held.
    pub(crate) used: u32,
    /// Waiters in line.
    pub(crate) waiting: u32,
}

/// One rate decision: what its charge does to one key's bucket under each policy of a
/// limiter (GCRA: a bucket is its theoretical arrival time, the TAT).
#[derive(Debug, Clone, Copy)]
pub(crate) struct RateAsk<'a> {
    /// One bucket per policy, in the policies' order.
    pub(crate) buckets: &'a Buckets,
    pub(crate) policies: &'a [Gcra],
    pub(crate) charge: Charge,
}

/// What a rate decision does to each bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Charge {
    /// Charges this many units to every bucket if each admits them now, else to none.
    Take(u32),
    /// Charges nothing: reads each bucket.
    Peek,
    /// Gives this many units back to every bucket (a request charged and then not
    /// served), never past full.
    Refund(u32),
    /// Empties every bucket: the key starts full.
    Reset,
}

/// Added to a TAT to empty a bucket whatever its debt (every debt is below 2^53 µs).
const EMPTIED: i64 = -(1 << 53);
/// A debt no bucket reaches: what a charge that is never refused may find.
const UNBOUNDED: u64 = 1 << 53;

impl Charge {
    /// µs this charge adds to a bucket's TAT under `policy` (negative: gives back).
    pub(crate) fn increment(self, policy: &Gcra) -> i64 {
        let units = |n: u32| i64::try_from(u64::from(n) * policy.interval).unwrap_or(i64::MAX);
        match self {
            Charge::Take(n) => units(n),
            Charge::Peek => 0,
            Charge::Refund(n) => -units(n),
            Charge::Reset => EMPTIED,
        }
    }

    /// The most debt (TAT − now, µs) a bucket under `policy` may have and still take this
    /// charge: its tolerance less the charge; unbounded for what is never refused.
    pub(crate) fn room(self, policy: &Gcra) -> u64 {
        match self {
            Charge::Take(n) => policy
                .tolerance
                .saturating_sub(u64::from(n) * policy.interval),
            Charge::Peek | Charge::Refund(_) | Charge::Reset => UNBOUNDED,
        }
    }
}

/// What a rate decision found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Debts {
    /// A policy refused the charge: nothing was charged, and `micros` are the debts as
    /// they were.
    pub(crate) refused: bool,
    /// Per policy, in order: µs until its bucket is full again (0: full).
    pub(crate) micros: Vec<u64>,
}
