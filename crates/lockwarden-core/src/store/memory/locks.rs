//! The exclusive locks in-process (plain and fair): one holder, a re-entry count, a
//! token and an expiry per key, and the outcomes of completed claims; as `acquire.lua`,
//! `release.lua` and `renew.lua` keep them on Redis.

use std::collections::HashMap;
use std::time::Duration;

use tokio::time::Instant;

use super::tokens::fresh_token;
use crate::holder::Holder;
use crate::key::Key;
use crate::store::contract::{Attempt, Outcome, Released};

#[derive(Default)]
pub(super) struct Locks {
    held: HashMap<Key, Held>,
    /// Outcomes of completed claims and when each is forgotten.
    outcomes: HashMap<Key, (Vec<u8>, Instant)>,
}

pub(super) struct Held {
    pub(super) holder: Holder,
    count: u64,
    token: u64,
    pub(super) expires: Instant,
}

impl Locks {
    /// The live lock at `key`; an expired one is dropped first, as Redis would have.
    pub(super) fn live(&mut self, key: &Key, now: Instant) -> Option<&mut Held> {
        if self.held.get(key).is_some_and(|h| h.expires <= now) {
            self.held.remove(key);
        }
        self.held.get_mut(key)
    }

    /// A stored outcome of `key` that has not run out.
    pub(super) fn outcome(&mut self, key: &Key, now: Instant) -> Option<Vec<u8>> {
        match self.outcomes.get(key) {
            Some((outcome, until)) if *until > now => Some(outcome.clone()),
            Some(_) => {
                self.outcomes.remove(key);
                None
            }
            None => None,
        }
    }

    /// Re-enters `key` if `holder` holds it; otherwise how long its holder has left
    /// (`Ok(None)`: free).
    pub(super) fn reenter(
        &mut self,
        key: &Key,
        holder: &Holder,
        lease: Duration,
        now: Instant,
    ) -> Result<Option<Duration>, Attempt> {
        match self.live(key, now) {
            Some(held) if held.holder == *holder => {
                held.count += 1;
                // A re-entry never shortens the hold (see `acquire.lua`).
                held.expires = held.expires.max(now + lease);
                Err(Attempt::Reentered { token: held.token })
            }
            Some(held) => Ok(Some(held.expires - now)),
            None => Ok(None),
        }
    }

    /// Takes or re-enters `key` for `holder`, as `acquire.lua` does.
    pub(super) fn take(
        &mut self,
        key: &Key,
        holder: &Holder,
        lease: Duration,
        now: Instant,
        last_token: &mut u64,
    ) -> Attempt {
        match self.reenter(key, holder, lease, now) {
            Err(reentered) => reentered,
            Ok(Some(ttl)) => Attempt::Busy { ttl: Some(ttl) },
            Ok(None) => Attempt::Taken {
                token: self.take_until(key, holder, now + lease, last_token),
            },
        }
    }

    /// Takes the free lock `key` for `holder` until `expires`; its new token.
    pub(super) fn take_until(
        &mut self,
        key: &Key,
        holder: &Holder,
        expires: Instant,
        last_token: &mut u64,
    ) -> u64 {
        let token = fresh_token(last_token);
        let held = Held {
            holder: holder.clone(),
            count: 1,
            token,
            expires,
        };
        self.held.insert(key.clone(), held);
        token
    }

    /// Takes up a lock granted to `holder` (its count stays), for `lease` at least; its
    /// token, or `None` if `holder` does not hold it.
    pub(super) fn take_up(
        &mut self,
        key: &Key,
        holder: &Holder,
        lease: Duration,
        now: Instant,
    ) -> Option<u64> {
        let held = self.live(key, now).filter(|h| h.holder == *holder)?;
        held.expires = held.expires.max(now + lease);
        Some(held.token)
    }

    /// Drops one re-entry of `holder`, storing `outcome` with it if given.
    pub(super) fn release(
        &mut self,
        key: &Key,
        holder: &Holder,
        outcome: Option<Outcome<'_>>,
        now: Instant,
    ) -> Released {
        let Some(held) = self.live(key, now).filter(|h| h.holder == *holder) else {
            return Released::NotHeld;
        };
        held.count -= 1;
        let left = held.count;
        if left == 0 {
            self.held.remove(key);
        }
        if let Some(outcome) = outcome {
            let until = now + outcome.keep;
            self.outcomes
                .insert(key.clone(), (outcome.bytes.to_vec(), until));
        }
        match left {
            0 => Released::Freed,
            n => Released::Remaining(n),
        }
    }

    pub(super) fn renew(
        &mut self,
        key: &Key,
        holder: &Holder,
        lease: Duration,
        now: Instant,
    ) -> bool {
        match self.live(key, now) {
            // Never shorter, as `lua/renew.lua`: other guards of the hold may have
            // asked for longer.
            Some(held) if held.holder == *holder => {
                held.expires = held.expires.max(now + lease);
                true
            }
            _ => false,
        }
    }

    /// Deletes `key` whoever holds it; whether it was held.
    pub(super) fn remove(&mut self, key: &Key, now: Instant) -> bool {
        let existed = self.live(key, now).is_some();
        self.held.remove(key);
        existed
    }

    pub(super) fn hold_count(&mut self, key: &Key, holder: &Holder, now: Instant) -> u64 {
        match self.live(key, now) {
            Some(held) if held.holder == *holder => held.count,
            _ => 0,
        }
    }

    /// Forgets what has run out.
    pub(super) fn sweep(&mut self, now: Instant) {
        self.held.retain(|_, h| h.expires > now);
        self.outcomes.retain(|_, (_, until)| *until > now);
    }
}
