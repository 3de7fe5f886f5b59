//! The read-write lock in the in-process store: the rules of `lua/rw_*.lua` (see
//! `crate::rw`), under one mutex.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::time::Instant;

use crate::backend::{Kind, Released, Renewal, RwAttempt};
use crate::holder::Holder;
use crate::key::Key;
use crate::rw::readers_channel;
use crate::waiters::Waiters;

/// Operations between sweeps of locks whose holds all expired untouched.
const SWEEP_EVERY: u32 = 1024;

pub(crate) struct RwStore {
    state: Mutex<State>,
    waiters: Arc<Waiters>,
}

#[derive(Default)]
struct State {
    locks: HashMap<Key, Entry>,
    last_token: u64,
    ops: u32,
}

#[derive(Default)]
struct Entry {
    /// The fencing token of the current phase (the write hold, or the read phase).
    token: u64,
    /// `Kind::Read` or `Kind::Write` holds, each with its own lease.
    holds: HashMap<(Holder, Kind), Hold>,
    /// Waiting writers and when each registration runs out.
    writers: HashMap<Holder, Instant>,
}

struct Hold {
    count: u64,
    expires: Instant,
}

/// What a release or withdrawal has to tell waiters, sent once the state is unlocked.
#[derive(Default)]
struct Notices {
    writer: bool,
    readers: bool,
}

impl Entry {
    fn prune(&mut self, now: Instant) {
        self.holds.retain(|_, h| h.expires > now);
        self.writers.retain(|_, until| *until > now);
    }

    fn is_empty(&self) -> bool {
        self.holds.is_empty() && self.writers.is_empty()
    }

    fn write_held(&self) -> bool {
        self.holds.keys().any(|(_, kind)| *kind == Kind::Write)
    }

    fn holds(&self, holder: &Holder, kind: Kind) -> bool {
        self.holds.contains_key(&(holder.clone(), kind))
    }

    /// Takes or re-enters `holder`'s hold of `kind`; whether it is a new hold.
    fn enter(&mut self, holder: &Holder, kind: Kind, lease: Duration, now: Instant) -> bool {
        let hold = self.holds.entry((holder.clone(), kind)).or_insert(Hold {
            count: 0,
            expires: now,
        });
        hold.count += 1;
        hold.expires = now + lease;
        hold.count == 1
    }

    /// How long a refused caller may sleep: until the first hold runs out, or (a refused
    /// reader) the last waiting writer's registration does.
    fn busy(&self, now: Instant, with_writers: bool) -> RwAttempt {
        let first_hold = self.holds.values().map(|h| h.expires).min();
        let last_writer = with_writers
            .then(|| self.writers.values().max().copied())
            .flatten();
        let at = match (first_hold, last_writer) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        RwAttempt::Busy {
            ttl: at.map_or(Duration::ZERO, |at| at.saturating_duration_since(now)),
        }
    }
}

impl State {
    /// The pruned entry for `key` (a new empty one if there is none).
    fn entry(&mut self, key: &Key, now: Instant) -> &mut Entry {
        self.entry_and_tokens(key, now).0
    }

    /// The entry and the last token issued, to draw a new one while the entry is borrowed.
    fn entry_and_tokens(&mut self, key: &Key, now: Instant) -> (&mut Entry, &mut u64) {
        self.ops += 1;
        if self.ops >= SWEEP_EVERY {
            self.ops = 0;
            self.locks.retain(|_, e| {
                e.prune(now);
                !e.is_empty()
            });
        }
        let entry = self.locks.entry(key.clone()).or_default();
        entry.prune(now);
        (entry, &mut self.last_token)
    }

    /// Forgets `key` once nothing is held or waited for.
    fn tidy(&mut self, key: &Key) {
        if self.locks.get(key).is_some_and(Entry::is_empty) {
            self.locks.remove(key);
        }
    }
}

/// Same rule as the scripts: the clock in µs, never at or below the last token.
fn fresh_token(last: &mut u64) -> u64 {
    let clock = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX));
    *last = clock.max(*last + 1);
    *last
}

impl RwStore {
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

    fn tell(&self, key: &Key, notices: Notices) {
        if notices.writer {
            self.waiters.notify_one(key.channel());
        }
        if notices.readers {
            self.waiters.notify_all(&readers_channel(key));
        }
    }

    pub(crate) fn attempt(
        &self,
        kind: Kind,
        key: &Key,
        holder: &Holder,
        lease: Duration,
        register: Duration,
    ) -> RwAttempt {
        let now = Instant::now();
        let mut state = self.state();
        let (entry, last_token) = state.entry_and_tokens(key, now);
        let free = entry.holds.is_empty();
        let attempt = match kind {
            Kind::Write => {
                if entry.holds(holder, Kind::Write) {
                    entry.enter(holder, kind, lease, now);
                    RwAttempt::Reentered { token: entry.token }
                } else if free {
                    entry.writers.remove(holder);
                    entry.token = fresh_token(last_token);
                    entry.enter(holder, kind, lease, now);
                    RwAttempt::Taken { token: entry.token }
                } else if entry.holds(holder, Kind::Read) {
                    RwAttempt::Upgrade
                } else {
                    entry.writers.insert(holder.clone(), now + register);
                    entry.busy(now, false)
                }
            }
            Kind::Read | Kind::Plain | Kind::Fair => {
                let writers_wait = !entry.writers.is_empty();
                let write_held = entry.write_held();
                if entry.holds(holder, Kind::Read) || entry.holds(holder, Kind::Write) {
                    // Re-entry or downgrade: never refused (the writers wait for this holder).
                    match entry.enter(holder, Kind::Read, lease, now) {
                        true => RwAttempt::Taken { token: entry.token },
                        false => RwAttempt::Reentered { token: entry.token },
                    }
                } else if write_held || writers_wait {
                    entry.busy(now, !write_held)
                } else {
                    if free {
                        entry.token = fresh_token(last_token);
                    }
                    entry.enter(holder, Kind::Read, lease, now);
                    RwAttempt::Taken { token: entry.token }
                }
            }
        };
        state.tidy(key);
        attempt
    }

    pub(crate) fn release(&self, kind: Kind, key: &Key, holder: &Holder) -> Released {
        let now = Instant::now();
        let mut state = self.state();
        let entry = state.entry(key, now);
        let id = (holder.clone(), kind);
        let Some(hold) = entry.holds.get_mut(&id) else {
            state.tidy(key);
            return Released::NotHeld;
        };
        hold.count -= 1;
        if hold.count > 0 {
            return Released::Remaining(hold.count);
        }
        entry.holds.remove(&id);
        let readers_may_go = entry.writers.is_empty();
        let notices = Notices {
            writer: entry.holds.is_empty(),
            readers: readers_may_go && (entry.holds.is_empty() || kind == Kind::Write),
        };
        state.tidy(key);
        drop(state);
        self.tell(key, notices);
        Released::Freed
    }

    pub(crate) fn renew(&self, renewal: &Renewal) -> bool {
        let now = Instant::now();
        let mut state = self.state();
        let entry = state.entry(&renewal.key, now);
        let renewed = match entry.holds.get_mut(&(renewal.holder.clone(), renewal.kind)) {
            Some(hold) => {
                hold.expires = now + renewal.lease;
                true
            }
            None => false,
        };
        state.tidy(&renewal.key);
        renewed
    }

    pub(crate) fn withdraw(&self, key: &Key, holder: &Holder) {
        let now = Instant::now();
        let mut state = self.state();
        let entry = state.entry(key, now);
        let readers = entry.writers.remove(holder).is_some()
            && entry.writers.is_empty()
            && !entry.write_held();
        state.tidy(key);
        drop(state);
        self.tell(
            key,
            Notices {
                writer: false,
                readers,
            },
        );
    }

    pub(crate) fn hold_count(&self, kind: Kind, key: &Key, holder: &Holder) -> u64 {
        let now = Instant::now();
        let mut state = self.state();
        let count = state
            .entry(key, now)
            .holds
            .get(&(holder.clone(), kind))
            .map_or(0, |h| h.count);
        state.tidy(key);
        count
    }

    pub(crate) fn is_locked(&self, key: &Key) -> bool {
        let now = Instant::now();
        let mut state = self.state();
        let locked = !state.entry(key, now).holds.is_empty();
        state.tidy(key);
        locked
    }
}
