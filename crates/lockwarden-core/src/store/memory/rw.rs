//! The read-write locks in-process: the rules of `lua/rw_*.lua` (see `crate::rw`): holds
//! with leases of their own, waiting writers that hold back new readers, waiting readers
//! admitted all at once by the release that opens the lock to them, a token per phase.

use std::collections::HashMap;
use std::time::Duration;

use tokio::time::Instant;

use super::tokens::fresh_token;
use crate::hold::RwMode;
use crate::holder::Holder;
use crate::key::Key;
use crate::store::contract::{Attempt, Refusal, Released};

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
    /// Waiting readers and when each registration runs out; an admitted reader stays
    /// until it takes its hold up or releases it (see `rw_prelude.lua`).
    readers: HashMap<Holder, Instant>,
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
    /// Every waiting reader, to try again (a force unlock).
    pub(super) readers: bool,
    /// The readers admitted, with the read phase's token.
    pub(super) admitted: Option<(u64, Vec<Holder>)>,
}

impl Entry {
    fn prune(&mut self, now: Instant) {
        self.holds.retain(|_, h| h.expires > now);
        self.writers.retain(|_, until| *until > now);
        self.readers.retain(|_, until| *until > now);
    }

    fn is_empty(&self) -> bool {
        self.holds.is_empty() && self.writers.is_empty() && self.readers.is_empty()
    }

    /// Every waiting reader that holds nothing enters, for what is left of its
    /// registration (see `admit_readers` in `rw_prelude.lua`).
    fn admit_readers(&mut self, last_token: &mut u64) -> Option<(u64, Vec<Holder>)> {
        let admitted: Vec<(Holder, Instant)> = self
            .readers
            .iter()
            .filter(|(holder, _)| !self.holds(holder, RwMode::Read))
            .map(|(holder, until)| (holder.clone(), *until))
            .collect();
        if admitted.is_empty() {
            return None;
        }
        if self.holds.is_empty() {
            self.token = fresh_token(last_token);
        }
        let holders = admitted
            .into_iter()
            .map(|(holder, expires)| {
                let hold = Hold { count: 1, expires };
                self.holds.insert((holder.clone(), RwMode::Read), hold);
                holder
            })
            .collect();
        Some((self.token, holders))
    }

    /// Ends `holder`'s `mode` hold, whose count is down to zero, and says whom to tell
    /// (see `end_hold` in `rw_prelude.lua`).
    fn end_hold(&mut self, holder: &Holder, mode: RwMode, last_token: &mut u64) -> Notices {
        self.holds.remove(&(holder.clone(), mode));
        if mode == RwMode::Read {
            self.readers.remove(holder);
        }
        let free = self.holds.is_empty();
        let readers_may_go = self.writers.is_empty() && (free || mode == RwMode::Write);
        let admitted = readers_may_go
            .then(|| self.admit_readers(last_token))
            .flatten();
        Notices {
            // Readers let in hold it now: a writer woken would find them.
            writer: free && admitted.is_none(),
            readers: false,
            admitted,
        }
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

    /// One attempt at `mode`; a refused waiter is registered as waiting until `register`
    /// from now (not at all for zero). `registered`: an earlier attempt of this reader's
    /// acquisition registered, so finding its read hold means it was admitted.
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
        (register, registered): (Duration, bool),
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
                    Attempt::Refused(Refusal::Upgrade)
                } else {
                    if !register.is_zero() {
                        entry.writers.insert(holder.clone(), now + register);
                    }
                    entry.busy(now, false)
                }
            }
            RwMode::Read => {
                let writers_wait = !entry.writers.is_empty();
                let write_held = entry.write_held();
                if entry.holds(holder, RwMode::Read) {
                    if registered && entry.readers.remove(holder).is_some() {
                        // Admitted while this acquisition waited (its notice missed).
                        if let Some(hold) = entry.holds.get_mut(&(holder.clone(), mode)) {
                            hold.expires = hold.expires.max(now + lease);
                        }
                        Attempt::Taken { token: entry.token }
                    } else {
                        entry.enter(holder, mode, lease, now);
                        Attempt::Reentered { token: entry.token }
                    }
                } else if entry.holds(holder, RwMode::Write) || !(write_held || writers_wait) {
                    // A downgrade (never refused: the writers wait for this holder), or a
                    // reader joining or starting a read phase.
                    if free {
                        entry.token = fresh_token(last_token);
                    }
                    entry.readers.remove(holder);
                    entry.enter(holder, mode, lease, now);
                    Attempt::Taken { token: entry.token }
                } else {
                    if !register.is_zero() {
                        entry.readers.insert(holder.clone(), now + register);
                    }
                    entry.busy(now, !write_held)
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
        last_token: &mut u64,
    ) -> (Released, Notices) {
        let entry = self.entry(key, now);
        let Some(hold) = entry.holds.get_mut(&(holder.clone(), mode)) else {
            self.tidy(key);
            return (Released::NotHeld, Notices::default());
        };
        hold.count -= 1;
        if hold.count > 0 {
            return (Released::Remaining(hold.count), Notices::default());
        }
        let notices = entry.end_hold(holder, mode, last_token);
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
            // Never shorter (see `lua/rw_renew.lua`).
            Some(hold) => {
                hold.expires = hold.expires.max(now + lease);
                true
            }
            None => false,
        };
        self.tidy(key);
        renewed
    }

    /// Drops `holder`'s registration as a waiting `mode` holder, and says whom to tell: the
    /// last waiting writer gone lets the waiting readers in; a reader gives back an
    /// admission it has not taken up, as a release would.
    pub(super) fn withdraw(
        &mut self,
        mode: RwMode,
        key: &Key,
        holder: &Holder,
        now: Instant,
        last_token: &mut u64,
    ) -> Notices {
        let entry = self.entry(key, now);
        let notices = match mode {
            RwMode::Write => {
                let last = entry.writers.remove(holder).is_some() && entry.writers.is_empty();
                Notices {
                    admitted: (last && !entry.write_held())
                        .then(|| entry.admit_readers(last_token))
                        .flatten(),
                    ..Notices::default()
                }
            }
            // An admission not taken up goes back as a release of it would.
            RwMode::Read if entry.readers.remove(holder).is_some() => {
                return self.release(mode, key, holder, now, last_token).1;
            }
            RwMode::Read => Notices::default(),
        };
        self.tidy(key);
        notices
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

    /// Drops every hold of `key` and every reader's registration: an admitted reader's
    /// would get it admitted again by the next write release, a hold it lost and whose
    /// renewal would then succeed. Waiting readers, woken, register again; waiting
    /// writers stay registered. Whether any hold was live.
    pub(super) fn remove(&mut self, key: &Key, now: Instant) -> bool {
        let entry = self.entry(key, now);
        let held = !entry.holds.is_empty();
        entry.holds.clear();
        entry.readers.clear();
        self.tidy(key);
        held
    }

    /// How long the latest live hold has left, as the Redis keys live; `None`: nothing held.
    /// As `ZCARD` of the Redis set: every writer's registration not yet pruned, until
    /// the last one has run out (when the Redis key expires).
    pub(super) fn waiting_writers(&self, key: &Key, now: Instant) -> usize {
        match self.0.get(key) {
            Some(entry) if entry.writers.values().any(|until| *until > now) => entry.writers.len(),
            _ => 0,
        }
    }

    pub(super) fn remaining_ttl(&self, key: &Key, now: Instant) -> Option<Duration> {
        let entry = self.0.get(key)?;
        let last = entry.holds.values().map(|h| h.expires).max()?;
        (last > now).then(|| last - now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A write release wakes a waiting writer only if it let no reader in, as Redis does.
    #[test]
    fn a_release_that_admits_readers_wakes_no_writer() {
        let (writer, reader) = (Holder::new("c", 1), Holder::new("c", 2));
        let later = Instant::now() + Duration::from_secs(30);
        let hold = || Hold {
            count: 1,
            expires: later,
        };
        let mut last_token = 0;

        let mut entry = Entry::default();
        entry.holds.insert((writer.clone(), RwMode::Write), hold());
        entry.readers.insert(reader.clone(), later);
        let told = entry.end_hold(&writer, RwMode::Write, &mut last_token);
        assert!(!told.writer, "a writer was woken with the readers in");
        let admitted = told.admitted.map(|(_, holders)| holders);
        assert_eq!(admitted, Some(vec![reader]));

        let mut entry = Entry::default();
        entry.holds.insert((writer.clone(), RwMode::Write), hold());
        let told = entry.end_hold(&writer, RwMode::Write, &mut last_token);
        assert!(
            told.writer && told.admitted.is_none(),
            "nobody read: wake a writer"
        );
    }
}
