//! The in-process lock store: the same semantics as the Lua scripts, under one mutex.
//! For single-process apps, tests and zero-setup examples.

mod fair;
mod rw;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::time::Instant;

use crate::backend::{Attempt, Kind, Outcome, Released, Renewal};
use crate::holder::Holder;
use crate::key::Key;
use crate::waiters::Waiters;

mod multi;

/// Operations between sweeps of expired entries.
const SWEEP_EVERY: u32 = 1024;

pub(crate) struct MemoryBackend {
    state: Mutex<State>,
    waiters: Arc<Waiters>,
    /// Read-write locks, kept apart from the plain ones.
    pub(crate) rw: rw::RwStore,
}

#[derive(Default)]
struct State {
    locks: HashMap<Key, Held>,
    /// Outcomes of completed claims and when each is forgotten.
    outcomes: HashMap<Key, (Vec<u8>, Instant)>,
    last_token: u64,
    ops: u32,
    /// Waiters of fair locks (see `fair.rs`).
    queues: HashMap<Key, fair::Queue>,
}

struct Held {
    holder: Holder,
    count: u64,
    token: u64,
    expires: Instant,
}

impl State {
    /// The live entry for `key`; an expired one is dropped first, as Redis would have.
    fn live(&mut self, key: &Key, now: Instant) -> Option<&mut Held> {
        if self.locks.get(key).is_some_and(|h| h.expires <= now) {
            self.locks.remove(key);
        }
        self.locks.get_mut(key)
    }

    /// Takes or re-enters `key` for `holder`, as `acquire.lua` does.
    fn take(&mut self, key: &Key, holder: &Holder, lease: Duration, now: Instant) -> Attempt {
        if let Some(held) = self.live(key, now) {
            if held.holder == *holder {
                held.count += 1;
                held.expires = now + lease;
                return Attempt::Reentered { token: held.token };
            }
            return Attempt::Busy {
                ttl: Some(held.expires - now),
            };
        }
        // Same rule as the script: the clock in µs, never at or below the last token.
        let clock = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX));
        let token = clock.max(self.last_token + 1);
        self.last_token = token;
        self.locks.insert(
            key.clone(),
            Held {
                holder: holder.clone(),
                count: 1,
                token,
                expires: now + lease,
            },
        );
        Attempt::Taken { token }
    }

    fn sweep(&mut self, now: Instant) {
        self.ops += 1;
        if self.ops >= SWEEP_EVERY {
            self.ops = 0;
            self.locks.retain(|_, h| h.expires > now);
            self.outcomes.retain(|_, (_, until)| *until > now);
            self.queues.retain(|_, q| !q.prune(now).is_empty());
        }
    }
}

impl MemoryBackend {
    pub(crate) fn new(waiters: Arc<Waiters>) -> Self {
        Self {
            state: Mutex::default(),
            rw: rw::RwStore::new(waiters.clone()),
            waiters,
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // Every critical section leaves the map consistent, so a poisoned lock is usable.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(crate) fn attempt(
        &self,
        key: &Key,
        holder: &Holder,
        lease: Duration,
        claim: bool,
    ) -> Attempt {
        let now = Instant::now();
        let mut state = self.state();
        state.sweep(now);
        if claim {
            match state.outcomes.get(key) {
                Some((outcome, until)) if *until > now => {
                    return Attempt::Completed {
                        outcome: outcome.clone(),
                    }
                }
                Some(_) => {
                    state.outcomes.remove(key);
                }
                None => {}
            }
        }
        state.take(key, holder, lease, now)
    }

    pub(crate) fn release(
        &self,
        kind: Kind,
        key: &Key,
        holder: &Holder,
        outcome: Option<Outcome<'_>>,
    ) -> Released {
        match kind {
            Kind::Plain => self.release_plain(key, holder, outcome),
            Kind::Read | Kind::Write => self.rw.release(kind, key, holder),
            Kind::Fair => self.release_fair(key, holder, outcome),
        }
    }

    fn release_plain(&self, key: &Key, holder: &Holder, outcome: Option<Outcome<'_>>) -> Released {
        let now = Instant::now();
        let mut state = self.state();
        let Some(held) = state.live(key, now).filter(|h| h.holder == *holder) else {
            return Released::NotHeld;
        };
        held.count -= 1;
        let left = held.count;
        if left == 0 {
            state.locks.remove(key);
        }
        if let Some(outcome) = outcome {
            state
                .outcomes
                .insert(key.clone(), (outcome.bytes.to_vec(), now + outcome.keep));
            drop(state);
            self.waiters.notify_all(key.channel());
        } else if left == 0 {
            drop(state);
            self.waiters.notify_one(key.channel());
        }
        match left {
            0 => Released::Freed,
            n => Released::Remaining(n),
        }
    }

    pub(crate) fn renew(&self, renewal: &Renewal) -> bool {
        match renewal.kind {
            // A fair lock is held as a plain one is; its queue needs no renewal.
            Kind::Plain | Kind::Fair => self.renew_plain(renewal),
            Kind::Read | Kind::Write => self.rw.renew(renewal),
        }
    }

    fn renew_plain(&self, renewal: &Renewal) -> bool {
        let now = Instant::now();
        let mut state = self.state();
        match state.live(&renewal.key, now) {
            Some(held) if held.holder == renewal.holder => {
                held.expires = now + renewal.lease;
                true
            }
            _ => false,
        }
    }

    pub(crate) fn force_unlock(&self, key: &Key) -> bool {
        let now = Instant::now();
        let mut state = self.state();
        let existed = state.live(key, now).is_some();
        state.locks.remove(key);
        drop(state);
        if existed {
            self.waiters.notify_one(key.channel());
        }
        existed
    }

    pub(crate) fn hold_count(&self, key: &Key, holder: &Holder) -> u64 {
        let now = Instant::now();
        match self.state().live(key, now) {
            Some(held) if held.holder == *holder => held.count,
            _ => 0,
        }
    }

    pub(crate) fn remaining_ttl(&self, key: &Key) -> Option<Duration> {
        let now = Instant::now();
        self.state().live(key, now).map(|h| h.expires - now)
    }
}
