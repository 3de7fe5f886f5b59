//! The fair lock in-process: a queue of waiters per key next to the exclusive locks, and
//! the rules of `fair_acquire.lua`, `fair_release.lua` and `fair_leave.lua` over both.

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
/// silent one is dropped.
#[derive(Default)]
struct Queue {
    waiting: VecDeque<(Holder, Instant)>,
}

impl Queue {
    /// Drops the waiters whose deadline has passed, wherever they stand.
    fn prune(&mut self, now: Instant) -> &mut Self {
        self.waiting.retain(|(_, deadline)| *deadline > now);
        self
    }

    fn head(&self) -> Option<&Holder> {
        self.waiting.front().map(|(h, _)| h)
    }
}

/// What a fair attempt answered, and whose turn it is to be told of.
pub(super) struct FairAttempt {
    pub(super) attempt: Attempt,
    /// A waiter whose turn has come at a free lock (its notice may have been lost).
    pub(super) wake: Option<Holder>,
}

impl Queues {
    /// One attempt of `holder` at the fair lock `key`; `join` queues it if it does not
    /// get the lock.
    #[expect(
        clippy::too_many_arguments,
        reason = "the script's arguments, one each"
    )]
    pub(super) fn attempt(
        &mut self,
        locks: &mut Locks,
        key: &Key,
        holder: &Holder,
        lease: Duration,
        queue_timeout: Duration,
        join: bool,
        now: Instant,
        last_token: &mut u64,
    ) -> FairAttempt {
        let held_for = match locks.reenter(key, holder, lease, now) {
            Err(reentered) => {
                return FairAttempt {
                    attempt: reentered,
                    wake: None,
                }
            }
            Ok(held_for) => held_for,
        };
        let queue = self.0.entry(key.clone()).or_default();
        queue.prune(now);
        let my_turn = queue.head().is_none_or(|head| head == holder);
        if held_for.is_none() && my_turn {
            queue.waiting.pop_front();
            self.tidy(key);
            let attempt = locks.take(key, holder, lease, now, last_token);
            return FairAttempt {
                attempt,
                wake: None,
            };
        }
        if join {
            let deadline = now + queue_timeout;
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
        // Free, but another waiter's turn: tell it (its notice may have been lost, or it
        // has just become head).
        let wake = match held_for {
            None => queue.head().filter(|head| *head != holder).cloned(),
            Some(_) => None,
        };
        self.tidy(key);
        let ttl = match held_for {
            Some(ttl) => wait.map_or(ttl, |wait| wait.min(ttl)),
            None => wait.unwrap_or(Duration::ZERO),
        };
        FairAttempt {
            attempt: Attempt::Busy { ttl: Some(ttl) },
            wake,
        }
    }

    /// The waiter whose turn comes now that `key` is free.
    pub(super) fn next(&mut self, key: &Key, now: Instant) -> Option<Holder> {
        let next = self.0.get_mut(key)?.prune(now).head().cloned();
        self.tidy(key);
        next
    }

    /// Takes `holder` out of the queue; the next waiter if that makes it first at a free
    /// lock.
    pub(super) fn leave(&mut self, key: &Key, holder: &Holder, free: bool) -> Option<Holder> {
        let queue = self.0.get_mut(key)?;
        let was_head = queue.head() == Some(holder);
        queue.waiting.retain(|(h, _)| h != holder);
        let next = (was_head && free).then(|| queue.head().cloned()).flatten();
        self.tidy(key);
        next
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
        self.0.retain(|_, q| !q.prune(now).waiting.is_empty());
    }

    fn tidy(&mut self, key: &Key) {
        if self.0.get(key).is_some_and(|q| q.waiting.is_empty()) {
            self.0.remove(key);
        }
    }
}
