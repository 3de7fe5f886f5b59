//! Semaphores in-process: the rules of `lua/permits_*.lua` (see `crate::semaphore`):
//! holds of permits with leases of their own, a line of waiters in arrival order, and
//! releases that grant what they free to the waiters they let in, each with a token.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use tokio::time::Instant;

use super::tokens::fresh_token;
use crate::holder::Holder;
use crate::key::Key;
use crate::store::contract::{Attempt, PermitsAsked, PermitsState, Refusal, Released};

/// The semaphores in use, by key.
#[derive(Default)]
pub(super) struct Semaphores(HashMap<Key, Entry>);

/// Permits a release (or an attempt, a withdrawal, a new capacity) granted to waiters:
/// each holder and its token, to tell them once the state is unlocked.
pub(super) type Grants = Vec<(Holder, u64)>;

#[derive(Default)]
struct Entry {
    /// The capacity and order stored (`None` after a force unlock left waiters in line:
    /// the next attempt stores its own, as on Redis).
    stored: Option<(u32, bool)>,
    holds: HashMap<Holder, Held>,
    /// The line, by arrival.
    line: BTreeMap<u64, Waiting>,
    /// Where each waiter stands in `line`.
    places: HashMap<Holder, u64>,
    arrivals: u64,
}

struct Held {
    permits: u32,
    token: u64,
    expires: Instant,
}

struct Waiting {
    holder: Holder,
    permits: u32,
    /// How long a grant holds the permits.
    lease: Duration,
    /// When its place in line runs out.
    until: Instant,
}

impl Entry {
    fn prune(&mut self, now: Instant) {
        self.holds.retain(|_, held| held.expires > now);
        let places = &mut self.places;
        self.line.retain(|_, waiting| {
            let live = waiting.until > now;
            if !live {
                places.remove(&waiting.holder);
            }
            live
        });
    }

    fn is_idle(&self) -> bool {
        self.holds.is_empty() && self.line.is_empty()
    }

    fn used(&self) -> u32 {
        self.holds.values().map(|held| held.permits).sum()
    }

    fn leave_line(&mut self, holder: &Holder) -> bool {
        match self.places.remove(holder) {
            Some(place) => self.line.remove(&place).is_some(),
            None => false,
        }
    }

    /// Grants free permits to waiters in arrival order, each for its lease from `now`
    /// (see `admit` in `permits_prelude.lua`): strict order stops at the first that does
    /// not fit.
    fn admit(&mut self, now: Instant, last_token: &mut u64) -> Grants {
        let Some((capacity, fifo)) = self.stored else {
            return Grants::new();
        };
        let mut free = capacity.saturating_sub(self.used());
        let span = if fifo { free } else { free + 64 };
        let mut granted = Vec::new();
        for (&place, waiting) in self.line.iter().take(span as usize) {
            if free == 0 {
                break;
            }
            if waiting.permits <= free {
                free -= waiting.permits;
                granted.push(place);
            } else if fifo {
                break;
            }
        }
        granted
            .into_iter()
            .filter_map(|place| self.line.remove(&place))
            .map(|waiting| {
                self.places.remove(&waiting.holder);
                let token = fresh_token(last_token);
                let held = Held {
                    permits: waiting.permits,
                    token,
                    expires: now + waiting.lease,
                };
                self.holds.insert(waiting.holder.clone(), held);
                (waiting.holder, token)
            })
            .collect()
    }

    /// Ends `holder`'s hold and grants what it frees.
    fn give_back(&mut self, holder: &Holder, now: Instant, last_token: &mut u64) -> Option<Grants> {
        self.holds.remove(holder)?;
        Some(self.admit(now, last_token))
    }

    /// How long a refused waiter may sleep: until enough holds could have run out to let
    /// it in (those ahead counted one permit each), `None` if none would.
    fn busy(&self, holder: &Holder, permits: u32, now: Instant) -> Attempt {
        let ahead = match self.places.get(holder) {
            Some(place) => self.line.range(..place).count(),
            None => self.line.len(),
        };
        let free = self
            .stored
            .map_or(0, |(capacity, _)| capacity.saturating_sub(self.used()));
        let needed = (ahead + permits as usize)
            .saturating_sub(free as usize)
            .max(1);
        let mut ends: Vec<Instant> = self.holds.values().map(|held| held.expires).collect();
        ends.sort_unstable();
        Attempt::Busy {
            ttl: ends
                .get(needed - 1)
                .map(|at| at.saturating_duration_since(now)),
        }
    }
}

impl Semaphores {
    /// The pruned entry for `key`, if it is in use.
    fn live(&mut self, key: &Key, now: Instant) -> Option<&mut Entry> {
        let entry = self.0.get_mut(key)?;
        entry.prune(now);
        if entry.is_idle() {
            self.0.remove(key);
            return None;
        }
        self.0.get_mut(key)
    }

    /// Forgets `key` once nothing is held or waited for.
    fn tidy(&mut self, key: &Key) {
        if self.0.get(key).is_some_and(Entry::is_idle) {
            self.0.remove(key);
        }
    }

    /// Forgets semaphores whose holds and registrations all ran out.
    pub(super) fn sweep(&mut self, now: Instant) {
        self.0.retain(|_, entry| {
            entry.prune(now);
            !entry.is_idle()
        });
    }

    /// One attempt for `asked` permits as `holder`, which was made for the acquisition.
    pub(super) fn attempt(
        &mut self,
        key: &Key,
        holder: &Holder,
        (lease, asked): (Duration, PermitsAsked),
        now: Instant,
        last_token: &mut u64,
    ) -> (Attempt, Grants) {
        let live = self.live(key, now).is_some();
        let entry = self.0.entry(key.clone()).or_default();
        // Granted while this acquisition waited (its notice missed), or this very
        // attempt ran before: taken, with at least this lease.
        if let Some(held) = entry.holds.get_mut(holder) {
            held.expires = held.expires.max(now + lease);
            let token = held.token;
            entry.leave_line(holder);
            return (Attempt::Taken { token }, Grants::new());
        }
        let (capacity, fifo) = match entry.stored {
            Some(stored) if live => stored,
            _ => (asked.capacity, asked.fifo),
        };
        if asked.permits > capacity {
            self.tidy(key);
            let refused = Refusal::OverCapacity { capacity };
            return (Attempt::Refused(refused), Grants::new());
        }
        entry.stored = Some((capacity, fifo));
        let grants = entry.admit(now, last_token);
        if let Some(&(_, token)) = grants.iter().find(|(h, _)| h == holder) {
            return (Attempt::Taken { token }, grants);
        }
        let head = entry.line.values().next().map(|w| &w.holder);
        let behind = fifo && head.is_some_and(|head| head != holder);
        if asked.permits <= capacity.saturating_sub(entry.used()) && !behind {
            entry.leave_line(holder);
            let token = fresh_token(last_token);
            let held = Held {
                permits: asked.permits,
                token,
                expires: now + lease,
            };
            entry.holds.insert(holder.clone(), held);
            return (Attempt::Taken { token }, grants);
        }
        if !asked.register.is_zero() {
            let until = now + asked.register;
            match entry.places.get(holder) {
                Some(place) => {
                    if let Some(waiting) = entry.line.get_mut(place) {
                        waiting.until = until;
                    }
                }
                None => {
                    entry.arrivals += 1;
                    let place = entry.arrivals;
                    let waiting = Waiting {
                        holder: holder.clone(),
                        permits: asked.permits,
                        lease,
                        until,
                    };
                    entry.line.insert(place, waiting);
                    entry.places.insert(holder.clone(), place);
                }
            }
        }
        let busy = entry.busy(holder, asked.permits, now);
        self.tidy(key);
        (busy, grants)
    }

    /// Gives `holder`'s permits back, granting what they free.
    pub(super) fn release(
        &mut self,
        key: &Key,
        holder: &Holder,
        now: Instant,
        last_token: &mut u64,
    ) -> (Released, Grants) {
        let Some(entry) = self.live(key, now) else {
            return (Released::NotHeld, Grants::new());
        };
        let released = match entry.give_back(holder, now, last_token) {
            Some(grants) => (Released::Freed, grants),
            None => (Released::NotHeld, Grants::new()),
        };
        self.tidy(key);
        released
    }

    /// Renews `holder`'s permits unless their lease ran out already.
    pub(super) fn renew(
        &mut self,
        key: &Key,
        holder: &Holder,
        lease: Duration,
        now: Instant,
    ) -> bool {
        let Some(entry) = self.live(key, now) else {
            return false;
        };
        match entry.holds.get_mut(holder) {
            Some(held) => {
                held.expires = now + lease;
                true
            }
            None => false,
        }
    }

    /// `holder` leaves the line, giving back permits granted to it meanwhile.
    pub(super) fn withdraw(
        &mut self,
        key: &Key,
        holder: &Holder,
        now: Instant,
        last_token: &mut u64,
    ) -> Grants {
        let Some(entry) = self.live(key, now) else {
            return Grants::new();
        };
        entry.leave_line(holder);
        let grants = entry.give_back(holder, now, last_token).unwrap_or_default();
        self.tidy(key);
        grants
    }

    /// How many permits `holder` holds.
    pub(super) fn held_by(&mut self, key: &Key, holder: &Holder, now: Instant) -> u64 {
        self.live(key, now)
            .and_then(|entry| entry.holds.get(holder))
            .map_or(0, |held| u64::from(held.permits))
    }

    pub(super) fn state(&mut self, key: &Key, now: Instant) -> Option<PermitsState> {
        let entry = self.live(key, now)?;
        let (capacity, _) = entry.stored?;
        Some(PermitsState {
            capacity,
            used: entry.used(),
            waiting: u32::try_from(entry.line.len()).unwrap_or(u32::MAX),
        })
    }

    /// A new capacity for a semaphore in use; whether it was in use.
    pub(super) fn set_capacity(
        &mut self,
        key: &Key,
        capacity: u32,
        now: Instant,
        last_token: &mut u64,
    ) -> (bool, Grants) {
        let Some(entry) = self.live(key, now) else {
            return (false, Grants::new());
        };
        let Some((_, fifo)) = entry.stored else {
            return (false, Grants::new());
        };
        entry.stored = Some((capacity, fifo));
        (true, entry.admit(now, last_token))
    }

    /// Drops every hold of `key` (waiters keep their places in line, and the capacity
    /// goes, as on Redis); whether any was held.
    pub(super) fn remove(&mut self, key: &Key, now: Instant) -> bool {
        let Some(entry) = self.live(key, now) else {
            return false;
        };
        let held = !entry.holds.is_empty() || entry.stored.is_some();
        entry.holds.clear();
        entry.stored = None;
        self.tidy(key);
        held
    }

    /// How long the latest live hold has left, as the Redis keys live at least; `None`:
    /// not in use.
    pub(super) fn remaining_ttl(&self, key: &Key, now: Instant) -> Option<Duration> {
        let entry = self.0.get(key)?;
        let last = entry.holds.values().map(|held| held.expires).max()?;
        (last > now).then(|| last - now)
    }
}
