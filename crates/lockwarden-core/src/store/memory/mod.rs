//! The in-process lock store: the store contract kept by one mutex over the exclusive
//! locks (`locks.rs`), the fair queues (`queue.rs`), the read-write locks (`rw.rs`),
//! the semaphores (`permits.rs`) and the rate limiters' buckets (`rate.rs`),
//! with the same semantics as the Lua scripts. For single-process apps, tests and
//! zero-setup examples. Waiters are woken directly, once the mutex is released.

mod locks;
mod permits;
mod queue;
mod rate;
mod rw;
mod tokens;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

use crate::hold::{Exclusive, Hold, HoldKind, RwMode};
use crate::holder::Holder;
use crate::key::Key;
use crate::notice::{Holders, Notice};
use crate::store::contract::{
    Acquire, AcquireAll, Attempt, Debts, How, LockStore, MultiAttempt, Outcome, PermitsState,
    RateAsk, Reentries, Refusal, Released, Renewal, Renewed, Result, Waiter,
};
use crate::waiters::Waiters;
use locks::Locks;
use permits::{Grants, Semaphores};
use queue::{Ask, Grant, Queues};
use rw::{Notices, RwLocks};

/// Operations between sweeps of what has run out.
const SWEEP_EVERY: u32 = 1024;

pub(crate) struct MemoryStore {
    state: Mutex<State>,
    waiters: Arc<Waiters>,
}

#[derive(Default)]
struct State {
    locks: Locks,
    /// Fenced values: the newest token that wrote each, and the value.
    fenced: HashMap<Key, (u64, Vec<u8>)>,
    queues: Queues,
    rw: RwLocks,
    permits: Semaphores,
    rate: rate::Buckets,
    last_token: u64,
    ops: u32,
}

impl State {
    fn sweep(&mut self, now: Instant) {
        self.ops += 1;
        if self.ops >= SWEEP_EVERY {
            self.ops = 0;
            self.locks.sweep(now);
            self.queues.sweep(now);
            self.rw.sweep(now);
            self.permits.sweep(now);
            self.rate.sweep(now);
        }
    }

    /// How long a lock of another family than `family` under the same name has left: on
    /// Redis every family is one hash, so each keeps the others out.
    fn held_by_other_family(
        &mut self,
        key: &Key,
        family: Family,
        now: Instant,
    ) -> Option<Duration> {
        let held = match family {
            Family::Exclusive => None,
            _ => self.locks.live(key, now).map(|held| held.expires - now),
        };
        held.or_else(|| match family {
            Family::ReadWrite => None,
            _ => self.rw.remaining_ttl(key, now),
        })
        .or_else(|| match family {
            Family::Permits => None,
            _ => self.permits.remaining_ttl(key, now),
        })
    }
}

/// The families of locks that share a name's one hash on Redis.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Family {
    Exclusive,
    ReadWrite,
    Permits,
}

impl MemoryStore {
    pub(crate) fn new(waiters: Arc<Waiters>) -> Self {
        Self {
            state: Mutex::default(),
            waiters,
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // Every critical section leaves the maps consistent, so a poisoned lock is usable.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Tells a read-write lock's waiters what a release or withdrawal did, as the scripts
    /// publish it.
    fn tell(&self, key: &Key, notices: Notices) {
        if notices.writer {
            self.waiters.deliver(key.channel(), Notice::Released);
        }
        if notices.readers {
            self.waiters.deliver(key.names().readers(), Notice::Open);
        }
        if let Some((token, holders)) = notices.admitted {
            let ids: Vec<&str> = holders.iter().map(Holder::id).collect();
            let holders = Holders::Ids(&ids);
            let notice = Notice::Granted { token, holders };
            self.waiters.deliver(key.names().readers(), notice);
        }
    }

    fn wake_turn(&self, key: &Key, next: Option<Holder>) {
        if let Some(next) = next {
            let channel = key.wake_channel(&next);
            let holders = Holders::Ids(&[next.id()]);
            self.waiters.deliver(&channel, Notice::Turn { holders });
        }
    }

    /// Tells the waiters a semaphore's permits were granted to, each with its token (a
    /// notice each: in-process tokens of one release need not follow each other).
    fn tell_permits(&self, key: &Key, grants: Grants) {
        for (holder, first) in &grants {
            let holders = Holders::Ids(&[holder.id()]);
            let notice = Notice::Permits {
                first: *first,
                holders,
            };
            self.waiters.deliver(key.names().granted(), notice);
        }
    }

    /// Tells the waiter a fair lock was handed to, with its token.
    fn tell_grant(&self, key: &Key, grant: Option<Grant>) {
        if let Some((holder, token)) = grant {
            let channel = key.wake_channel(&holder);
            let holders = Holders::Ids(&[holder.id()]);
            self.waiters
                .deliver(&channel, Notice::Granted { token, holders });
        }
    }

    fn attempt(&self, ask: &Acquire<'_>) -> Attempt {
        let (key, holder, lease, how) = (ask.key, ask.holder, ask.lease, ask.how);
        let now = Instant::now();
        let mut state = self.state();
        state.sweep(now);
        if how == How::Claim {
            if let Some(outcome) = state.locks.outcome(key, now) {
                return Attempt::Refused(Refusal::Completed { outcome });
            }
        }
        let family = match how {
            How::Read { .. } | How::Write { .. } => Family::ReadWrite,
            How::Permits(_) => Family::Permits,
            _ => Family::Exclusive,
        };
        if let Some(ttl) = state.held_by_other_family(key, family, now) {
            return Attempt::Busy { ttl: Some(ttl) };
        }
        let State {
            locks,
            queues,
            rw,
            permits,
            last_token,
            ..
        } = &mut *state;
        match how {
            How::Plain | How::Claim => match locks.take(key, holder, lease, now, last_token) {
                // As on Redis: no token for a client without them (its holds keep one
                // here, which costs nothing and is never shown).
                Attempt::Taken { .. } if !ask.fenced => Attempt::Taken { token: 0 },
                Attempt::Reentered { .. } if !ask.fenced => Attempt::Reentered { token: 0 },
                attempt => attempt,
            },
            How::Fair {
                queue_timeout,
                join,
                queued,
            } => {
                let ask = Ask {
                    key,
                    holder,
                    lease,
                    queue_timeout,
                    join,
                    queued,
                };
                let fair = queues.attempt(locks, &ask, now, last_token);
                drop(state);
                self.tell_grant(key, fair.grant);
                fair.attempt
            }
            How::Read {
                register,
                registered,
            } => rw.attempt(
                RwMode::Read,
                key,
                holder,
                lease,
                (register, registered),
                now,
                last_token,
            ),
            How::Write { register } => rw.attempt(
                RwMode::Write,
                key,
                holder,
                lease,
                (register, false),
                now,
                last_token,
            ),
            How::Permits(asked) => {
                let (attempt, grants) =
                    permits.attempt(key, holder, (lease, asked), now, last_token);
                drop(state);
                self.tell_permits(key, grants);
                attempt
            }
        }
    }

    fn release_now(
        &self,
        kind: HoldKind,
        key: &Key,
        holder: &Holder,
        outcome: Option<Outcome<'_>>,
    ) -> Released {
        let now = Instant::now();
        let mut state = self.state();
        match kind {
            HoldKind::Exclusive(kind) => {
                let State {
                    locks,
                    queues,
                    last_token,
                    ..
                } = &mut *state;
                let released = locks.release(key, holder, outcome, now);
                let grant = match (kind, released) {
                    (Exclusive::Fair, Released::Freed) => {
                        queues.released(locks, key, holder, now, last_token)
                    }
                    (Exclusive::Fair, Released::NotHeld) => {
                        queues.lost(key, holder);
                        None
                    }
                    _ => None,
                };
                drop(state);
                if released != Released::NotHeld && outcome.is_some() {
                    // Every waiter can use the outcome.
                    self.waiters.deliver(key.channel(), Notice::Completed);
                } else if released == Released::Freed && kind == Exclusive::Plain {
                    self.waiters.deliver(key.channel(), Notice::Released);
                }
                self.tell_grant(key, grant);
                released
            }
            HoldKind::ReadWrite(mode) => {
                let State { rw, last_token, .. } = &mut *state;
                let (released, notices) = rw.release(mode, key, holder, now, last_token);
                drop(state);
                self.tell(key, notices);
                released
            }
            HoldKind::Permits { .. } => {
                let State {
                    permits,
                    last_token,
                    ..
                } = &mut *state;
                let (released, grants) = permits.release(key, holder, now, last_token);
                drop(state);
                self.tell_permits(key, grants);
                released
            }
        }
    }
}

impl LockStore for MemoryStore {
    fn name(&self) -> &'static str {
        "in-memory"
    }

    async fn acquire(&self, ask: &Acquire<'_>) -> Result<Attempt> {
        Ok(self.attempt(ask))
    }

    async fn acquire_all(&self, ask: &AcquireAll<'_>) -> Result<MultiAttempt> {
        let (keys, holder, lease) = (ask.keys, ask.holder, ask.lease);
        let now = Instant::now();
        let mut state = self.state();
        state.sweep(now);
        for (index, key) in keys.iter().enumerate() {
            let busy = match state.locks.live(key, now) {
                Some(held) if held.holder != *holder => Some(held.expires - now),
                _ => state.held_by_other_family(key, Family::Exclusive, now),
            };
            if let Some(ttl) = busy {
                return Ok(MultiAttempt::Busy {
                    index,
                    ttl: Some(ttl),
                });
            }
        }
        let State {
            locks, last_token, ..
        } = &mut *state;
        let tokens = keys
            .iter()
            .map(
                |key| match locks.take(key, holder, lease, now, last_token) {
                    Attempt::Taken { token } | Attempt::Reentered { token } => token,
                    // Checked free or ours above, under the same lock.
                    _ => 0,
                },
            )
            .collect();
        Ok(MultiAttempt::Taken { tokens })
    }

    async fn release(
        &self,
        hold: &Hold,
        _token: Option<u64>,
        _reentries: Reentries,
    ) -> Result<Released> {
        Ok(self.release_now(hold.kind, &hold.key, &hold.holder, None))
    }

    fn release_later(&self, hold: Hold, _resend_until: Option<Instant>, _reentries: Reentries) {
        self.release_now(hold.kind, &hold.key, &hold.holder, None);
    }

    async fn flush(&self) {
        // Released at once: nothing waits.
    }

    async fn complete(
        &self,
        hold: &Hold<Exclusive>,
        _token: Option<u64>,
        outcome: Outcome<'_>,
    ) -> Result<Released> {
        let Hold { kind, key, holder } = hold;
        Ok(self.release_now(HoldKind::Exclusive(*kind), key, holder, Some(outcome)))
    }

    async fn renew_all(&self, renewals: &[Renewal]) -> Renewed {
        let now = Instant::now();
        let mut state = self.state();
        let held = renewals
            .iter()
            .map(|Renewal { hold, lease }| match hold.kind {
                // A fair lock is held as a plain one is; its queue needs no renewal.
                HoldKind::Exclusive(_) => state.locks.renew(&hold.key, &hold.holder, *lease, now),
                HoldKind::ReadWrite(mode) => {
                    state.rw.renew(mode, &hold.key, &hold.holder, *lease, now)
                }
                HoldKind::Permits { .. } => {
                    state.permits.renew(&hold.key, &hold.holder, *lease, now)
                }
            })
            .map(Some)
            .collect();
        Renewed { held, error: None }
    }

    async fn withdraw(&self, waiter: Waiter, key: &Key, holder: &Holder) -> Result<()> {
        let now = Instant::now();
        let mut state = self.state();
        match waiter {
            Waiter::Queued => {
                let State {
                    locks,
                    queues,
                    last_token,
                    ..
                } = &mut *state;
                let grant = queues.leave(locks, key, holder, now, last_token);
                drop(state);
                self.tell_grant(key, grant);
            }
            Waiter::Writer | Waiter::Reader => {
                let mode = match waiter {
                    Waiter::Reader => RwMode::Read,
                    _ => RwMode::Write,
                };
                let State { rw, last_token, .. } = &mut *state;
                let notices = rw.withdraw(mode, key, holder, now, last_token);
                drop(state);
                self.tell(key, notices);
            }
            Waiter::Permits { .. } => {
                let State {
                    permits,
                    last_token,
                    ..
                } = &mut *state;
                let grants = permits.withdraw(key, holder, now, last_token);
                drop(state);
                self.tell_permits(key, grants);
            }
        }
        Ok(())
    }

    async fn force_unlock(&self, key: &Key) -> Result<bool> {
        let now = Instant::now();
        let mut state = self.state();
        let exclusive = state.locks.remove(key, now);
        let read_write = state.rw.remove(key, now);
        let semaphore = state.permits.remove(key, now);
        let next = (exclusive || read_write)
            .then(|| state.queues.head(key, now))
            .flatten();
        drop(state);
        if semaphore {
            // Every permit is free: its waiters try again, in their places in line.
            self.waiters.deliver(key.names().granted(), Notice::Open);
        }
        if exclusive || read_write {
            self.tell(
                key,
                Notices {
                    writer: true,
                    readers: true,
                    admitted: None,
                },
            );
            self.wake_turn(key, next);
        }
        Ok(exclusive || read_write || semaphore)
    }

    async fn hold_count(&self, hold: &Hold) -> Result<u64> {
        let now = Instant::now();
        let mut state = self.state();
        Ok(match hold.kind {
            HoldKind::Exclusive(_) => state.locks.hold_count(&hold.key, &hold.holder, now),
            HoldKind::ReadWrite(mode) => state.rw.hold_count(mode, &hold.key, &hold.holder, now),
            HoldKind::Permits { .. } => state.permits.held_by(&hold.key, &hold.holder, now),
        })
    }

    async fn remaining_ttl(&self, key: &Key) -> Result<Option<Duration>> {
        let now = Instant::now();
        let mut state = self.state();
        let exclusive = state.locks.live(key, now).map(|held| held.expires - now);
        Ok(exclusive
            .or_else(|| state.rw.remaining_ttl(key, now))
            .or_else(|| state.permits.remaining_ttl(key, now)))
    }

    async fn queued(&self, key: &Key) -> Result<usize> {
        Ok(self.state().queues.len(key, Instant::now()))
    }

    async fn waiting_writers(&self, key: &Key) -> Result<usize> {
        Ok(self.state().rw.waiting_writers(key, Instant::now()))
    }

    async fn permits(&self, key: &Key) -> Result<Option<PermitsState>> {
        Ok(self.state().permits.state(key, Instant::now()))
    }

    async fn set_capacity(&self, key: &Key, capacity: u32) -> Result<bool> {
        let mut state = self.state();
        let State {
            permits,
            last_token,
            ..
        } = &mut *state;
        let (changed, grants) = permits.set_capacity(key, capacity, Instant::now(), last_token);
        drop(state);
        self.tell_permits(key, grants);
        Ok(changed)
    }

    async fn fenced_write(&self, key: &Key, token: u64, value: &[u8]) -> Result<Option<u64>> {
        let mut state = self.state();
        match state.fenced.get(key) {
            Some((newest, _)) if *newest > token => Ok(Some(*newest)),
            _ => {
                state.fenced.insert(key.clone(), (token, value.to_vec()));
                Ok(None)
            }
        }
    }

    async fn fenced_read(&self, key: &Key) -> Result<Option<(u64, Vec<u8>)>> {
        Ok(self.state().fenced.get(key).cloned())
    }

    async fn rate(&self, ask: &RateAsk<'_>) -> Result<Debts> {
        let now = Instant::now();
        let mut state = self.state();
        state.sweep(now);
        Ok(state.rate.decide(ask, now))
    }
}
