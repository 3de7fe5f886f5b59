//! The fair lock in-process: a queue of waiters per key next to the exclusive locks, and
//! the rules of `fair_prelude.lua`, `fair_acquire.lua`, `fair_release.lua` and
//! `fair_leave.lua` over both.

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use tokio::time::Instant;

use super::locks::Locks;
use crate::holder::Holder;
use crate::key::Key;
use crate::store::contract::Attempt;

/// The fair queues, by key.
#[derive(Default)]
pub(super) struct Queues(HashMap<Key, Queue>);

/// The waiters of one fair lock, oldest first, each with the deadline after which a
/// silent one is dropped; and the waiters granted the lock on release that have not taken
/// the grant up by an attempt (their deadline stays, as on Redis).
#[derive(Default)]
struct Queue {
    waiting: VecDeque<(Holder, Instant)>,
    granted: HashMap<Holder, Instant>,
}

impl Queue {
    /// Drops the waiters whose deadline has passed, wherever they stand.
    fn prune(&mut self, now: Instant) -> &mut Self {
        self.waiting.retain(|(_, deadline)| *deadline > now);
        self.granted.retain(|_, deadline| *deadline > now);
        self
    }

    fn head(&self) -> Option<&Holder> {
        self.waiting.front().map(|(h, _)| h)
    }

    fn is_empty(&self) -> bool {
        self.waiting.is_empty() && self.granted.is_empty()
    }
}

/// A fair lock handed to the head of its queue: who, and the token to tell it.
pub(super) type Grant = (Holder, u64);

/// What a fair attempt answered, and the grant it made to the head of the queue.
pub(super) struct FairAttempt {
    pub(super) attempt: Attempt,
    pub(super) grant: Option<Grant>,
}

/// One fair attempt: who asks, and how (the arguments of `fair_acquire.lua`).
pub(super) struct Ask<'a> {
    pub(super) key: &'a Key,
    pub(super) holder: &'a Holder,
    pub(super) lease: Duration,
    pub(super) queue_timeout: Duration,
    pub(super) join: bool,
    pub(super) queued: bool,
}

impl Queues {
    /// One attempt at a fair lock, as `fair_acquire.lua`.
    pub(super) fn attempt(
        &mut self,
        locks: &mut Locks,
        ask: &Ask<'_>,
        now: Instant,
        last_token: &mut u64,
    ) -> FairAttempt {
        let Ask { key, holder, .. } = *ask;
        let queue = self.0.entry(key.clone()).or_default();
        if ask.queued && queue.granted.contains_key(holder) {
            if let Some(token) = locks.take_up(key, holder, ask.lease, now) {
                // Granted while waiting (the notice was missed): taken up now.
                queue.granted.remove(holder);
                self.tidy(key);
                return FairAttempt {
                    attempt: Attempt::Taken { token },
                    grant: None,
                };
            }
        }
        let held_for = match locks.reenter(key, holder, ask.lease, now) {
            Err(reentered) => {
                self.tidy(key);
                return FairAttempt {
                    attempt: reentered,
                    grant: None,
                };
            }
            Ok(held_for) => held_for,
        };
        let queue = self.0.entry(key.clone()).or_default();
        queue.prune(now);
        let mut grant = None;
        if held_for.is_none() {
            if queue.head().is_none_or(|head| head == holder) {
                queue.waiting.pop_front();
                queue.granted.remove(holder);
                self.tidy(key);
                let attempt = locks.take(key, holder, ask.lease, now, last_token);
                return FairAttempt {
                    attempt,
                    grant: None,
                };
            }
            // Free, but another waiter's turn: it gets the lock now.
            grant = Self::grant(queue, locks, key, last_token);
        }
        if ask.join {
            let deadline = now + ask.queue_timeout;
            match queue.waiting.iter_mut().find(|(h, _)| h == holder) {
                Some(place) => place.1 = deadline,
                None => queue.waiting.push_back((holder.clone(), deadline)),
            }
        }
        // Retry by the deadline of the waiter in front (of the tail, if not queued): if it
        // has died, it can be dropped then.
        let ahead = match queue.waiting.iter().position(|(h, _)| h == holder) {
            Some(0) => None,
            Some(at) => queue.waiting.get(at - 1),
            None => queue.waiting.back(),
        };
        let wait = ahead.map(|(_, deadline)| *deadline - now + Duration::from_millis(1));
        self.tidy(key);
        let ttl = match locks.live(key, now) {
            Some(held) => {
                let ttl = held.expires - now;
                wait.map_or(ttl, |wait| wait.min(ttl))
            }
            None => wait.unwrap_or(Duration::ZERO),
        };
        FairAttempt {
            attempt: Attempt::Busy { ttl: Some(ttl) },
            grant,
        }
    }

    /// `holder` released the free lock `key`: the head of its queue gets it.
    pub(super) fn released(
        &mut self,
        locks: &mut Locks,
        key: &Key,
        holder: &Holder,
        now: Instant,
        last_token: &mut u64,
    ) -> Option<Grant> {
        let queue = self.0.get_mut(key)?;
        queue.granted.remove(holder);
        queue.prune(now);
        let grant = Self::grant(queue, locks, key, last_token);
        self.tidy(key);
        grant
    }

    /// `holder` found its hold lost at release: its grant's entry goes, unless it also
    /// waits in the queue (as `fair_release.lua`).
    pub(super) fn lost(&mut self, key: &Key, holder: &Holder) {
        let Some(queue) = self.0.get_mut(key) else {
            return;
        };
        if !queue.waiting.iter().any(|(h, _)| h == holder) {
            queue.granted.remove(holder);
        }
        self.tidy(key);
    }

    /// Takes `holder` out of the queue and gives back a grant it never took up; if that
    /// leaves the lock free, the next waiter gets it (as `fair_leave.lua`).
    pub(super) fn leave(
        &mut self,
        locks: &mut Locks,
        key: &Key,
        holder: &Holder,
        now: Instant,
        last_token: &mut u64,
    ) -> Option<Grant> {
        let queue = self.0.get_mut(key)?;
        queue.waiting.retain(|(h, _)| h != holder);
        if queue.granted.remove(holder).is_some() {
            locks.release(key, holder, None, now);
        }
        let grant = match locks.live(key, now) {
            Some(_) => None,
            None => Self::grant(queue.prune(now), locks, key, last_token),
        };
        self.tidy(key);
        grant
    }

    /// The head of `key`'s queue, to wake after a forced unlock (as `force_release.lua`).
    pub(super) fn head(&mut self, key: &Key, now: Instant) -> Option<Holder> {
        let head = self.0.get_mut(key)?.prune(now).head().cloned();
        self.tidy(key);
        head
    }

    /// Hands the free lock to the head of `queue` until the head's deadline.
    fn grant(
        queue: &mut Queue,
        locks: &mut Locks,
        key: &Key,
        last_token: &mut u64,
    ) -> Option<Grant> {
        let (head, deadline) = queue.waiting.pop_front()?;
        let token = locks.take_until(key, &head, deadline, last_token);
        queue.granted.insert(head.clone(), deadline);
        Some((head, token))
    }

    /// As `LLEN` of the Redis queue: every waiter not yet pruned, until the last deadline
    /// has passed (when the Redis keys expire).
    pub(super) fn len(&self, key: &Key, now: Instant) -> usize {
        match self.0.get(key) {
            Some(queue) if queue.waiting.iter().any(|(_, d)| *d > now) => queue.waiting.len(),
            _ => 0,
        }
    }

    /// Forgets queues whose waiters have all run out.
    pub(super) fn sweep(&mut self, now: Instant) {
        self.0.retain(|_, q| !q.prune(now).is_empty());
    }

    fn tidy(&mut self, key: &Key) {
        if self.0.get(key).is_some_and(Queue::is_empty) {
            self.0.remove(key);
        }
    }
}
