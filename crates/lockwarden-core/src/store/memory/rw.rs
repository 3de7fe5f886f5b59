//! The read-write locks in-process: the rules of `lua/rw_*.lua` (see `crate::rw`): holds
//! with leases of their own, waiting writers that hold back new readers, a token per phase.

use std::collections::HashMap;
use std::time::Duration;

use tokio::time::Instant;

use super::tokens::fresh_token;
use crate::hold::RwMode;
use crate::holder::Holder;
use crate::key::Key;
use crate::store::contract::{Attempt, Released};

/// The read-write locks, by key.
#[derive(Default)]
pub(super) struct RwLocks(HashMap<Key, Entry>);

#[derive(Default)]
struct Entry {
    /// The fencing token of the current phase (the write hold, or the read phase).
    token: u64,
    /// Read and write holds, each with its own lease.
    holds: HashMap<(Holder, RwMode), Hold>,
    /// Waiting writers and when each registration runs out.
    writers: HashMap<Holder, Instant>,
}

struct Hold {
    count: u64,
    expires: Instant,
}

/// What a release or withdrawal has to tell waiters, sent once the state is unlocked.
#[derive(Default)]
pub(super) struct Notices {
    /// One waiting writer (the lock is free).
    pub(super) writer: bool,
    /// Every waiting reader (the lock is open to readers).
    pub(super) readers: bool,
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
        self.holds.keys().any(|(_, mode)| *mode == RwMode::Write)
    }

    fn holds(&self, holder: &Holder, mode: RwMode) -> bool {
        self.holds.contains_key(&(holder.clone(), mode))
    }

    /// Takes or re-enters `holder`'s `mode` hold; whether it is a new hold.
    fn enter(&mut self, holder: &Holder, mode: RwMode, lease: Duration, now: Instant) -> bool {
        let hold = self.holds.entry((holder.clone(), mode)).or_insert(Hold {
            count: 0,
            expires: now,
        });
        hold.count += 1;
        // A re-entry never shortens the hold (see `rw_prelude.lua`'s `lease_at_least`).
        hold.expires = hold.expires.max(now + lease);
        hold.count == 1
    }

    /// How long a refused caller may sleep: until the first hold runs out, or (a refused
    /// reader) the last waiting writer's registration does.
    fn busy(&self, now: Instant, with_writers: bool) -> Attempt {
        let first_hold = self.holds.values().map(|h| h.expires).min();
        let last_writer = with_writers
            .then(|| self.writers.values().max().copied())
            .flatten();
        let at = match (first_hold, last_writer) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        Attempt::Busy {
            ttl: Some(at.map_or(Duration::ZERO, |at| at.saturating_duration_since(now))),
        }
    }
}

impl RwLocks {
    /// The pruned entry for `key` (a new empty one if there is none).
    fn entry(&mut self, key: &Key, now: Instant) -> &mut Entry {
        let entry = self.0.entry(key.clone()).or_default();
        entry.prune(now);
        entry
    }

    /// Forgets `key` once nothing is held or waited for.
    fn tidy(&mut self, key: &Key) {
        if self.0.get(key).is_some_and(Entry::is_empty) {
            self.0.remove(key);
        }
    }

    /// Forgets locks whose holds and registrations all ran out.
    pub(super) fn sweep(&mut self, now: Instant) {
        self.0.retain(|_, e| {
            e.prune(now);
            !e.is_empty()
        });
    }

    /// One attempt at `mode`; a refused writer is registered as waiting until `register`
    /// from now.
    #[expect(
        clippy::too_many_arguments,
        reason = "the script's arguments, one each"
    )]
    pub(super) fn attempt(
        &mut self,
        mode: RwMode,
        key: &Key,
        holder: &Holder,
        lease: Duration,
        register: Duration,
        now: Instant,
        last_token: &mut u64,
    ) -> Attempt {
        let entry = self.entry(key, now);
        let free = entry.holds.is_empty();
        let attempt = match mode {
            RwMode::Write => {
                if entry.holds(holder, RwMode::Write) {
                    entry.enter(holder, mode, lease, now);
                    Attempt::Reentered { token: entry.token }
                } else if free {
                    entry.writers.remove(holder);
                    entry.token = fresh_token(last_token);
                    entry.enter(holder, mode, lease, now);
                    Attempt::Taken { token: entry.token }
                } else if entry.holds(holder, RwMode::Read) {
                    Attempt::Upgrade
                } else {
                    entry.writers.insert(holder.clone(), now + register);
                    entry.busy(now, false)
                }
            }
            RwMode::Read => {
                let writers_wait = !entry.writers.is_empty();
                let write_held = entry.write_held();
                if entry.holds(holder, RwMode::Read) || entry.holds(holder, RwMode::Write) {
                    // Re-entry or downgrade: never refused (the writers wait for this holder).
                    match entry.enter(holder, RwMode::Read, lease, now) {
                        true => Attempt::Taken { token: entry.token },
                        false => Attempt::Reentered { token: entry.token },
                    }
                } else if write_held || writers_wait {
                    entry.busy(now, !write_held)
                } else {
                    if free {
                        entry.token = fresh_token(last_token);
                    }
                    entry.enter(holder, RwMode::Read, lease, now);
                    Attempt::Taken { token: entry.token }
                }
            }
        };
        self.tidy(key);
        attempt
    }

    /// Drops one re-entry of `holder`'s `mode` hold, and says whom to tell.
    pub(super) fn release(
        &mut self,
        mode: RwMode,
        key: &Key,
        holder: &Holder,
        now: Instant,
    ) -> (Released, Notices) {
        let entry = self.entry(key, now);
        let id = (holder.clone(), mode);
        let Some(hold) = entry.holds.get_mut(&id) else {
            self.tidy(key);
            return (Released::NotHeld, Notices::default());
        };
        hold.count -= 1;
        if hold.count > 0 {
            return (Released::Remaining(hold.count), Notices::default());
        }
        entry.holds.remove(&id);
        let readers_may_go = entry.writers.is_empty();
        let notices = Notices {
            writer: entry.holds.is_empty(),
            readers: readers_may_go && (entry.holds.is_empty() || mode == RwMode::Write),
        };
        self.tidy(key);
        (Released::Freed, notices)
    }

    pub(super) fn renew(
        &mut self,
        mode: RwMode,
        key: &Key,
        holder: &Holder,
        lease: Duration,
        now: Instant,
    ) -> bool {
        let entry = self.entry(key, now);
        let renewed = match entry.holds.get_mut(&(holder.clone(), mode)) {
            Some(hold) => {
                hold.expires = now + lease;
                true
            }
            None => false,
        };
        self.tidy(key);
        renewed
    }

    /// Drops `holder`'s registration as a waiting writer; whether readers may now enter.
    pub(super) fn withdraw(&mut self, key: &Key, holder: &Holder, now: Instant) -> Notices {
        let entry = self.entry(key, now);
        let readers = entry.writers.remove(holder).is_some()
            && entry.writers.is_empty()
            && !entry.write_held();
        self.tidy(key);
        Notices {
            writer: false,
            readers,
        }
    }

    pub(super) fn hold_count(
        &mut self,
        mode: RwMode,
        key: &Key,
        holder: &Holder,
        now: Instant,
    ) -> u64 {
        let count = self
            .entry(key, now)
            .holds
            .get(&(holder.clone(), mode))
            .map_or(0, |h| h.count);
        self.tidy(key);
        count
    }

    /// Drops every hold of `key` (waiting writers stay registered); whether any was live.
    pub(super) fn remove(&mut self, key: &Key, now: Instant) -> bool {
        let entry = self.entry(key, now);
        let held = !entry.holds.is_empty();
        entry.holds.clear();
        self.tidy(key);
        held
    }

    /// How long the latest live hold has left, as the Redis keys live; `None`: nothing held.
    pub(super) fn remaining_ttl(&self, key: &Key, now: Instant) -> Option<Duration> {
        let entry = self.0.get(key)?;
        let last = entry.holds.values().map(|h| h.expires).max()?;
        (last > now).then(|| last - now)
    }
}
