//! The fair lock in-process: the same rules as `fair_acquire.lua`, `fair_release.lua` and
//! `fair_leave.lua`, on a queue per key kept next to the locks under the store's mutex.

use std::collections::VecDeque;
use std::time::Duration;

use tokio::time::Instant;

use super::MemoryBackend;
use crate::backend::{Attempt, Outcome, Released};
use crate::fair::wake_channel;
use crate::holder::Holder;
use crate::key::Key;

/// The waiters of one fair lock, oldest first, each with the deadline after which a
/// silent one is dropped.
#[derive(Default)]
pub(super) struct Queue {
    waiting: VecDeque<(Holder, Instant)>,
}

impl Queue {
    /// Drops the waiters whose deadline has passed, wherever they stand.
    pub(super) fn prune(&mut self, now: Instant) -> &mut Self {
        self.waiting.retain(|(_, deadline)| *deadline > now);
        self
    }

    pub(super) fn is_empty(&self) -> bool {
        self.waiting.is_empty()
    }

    fn head(&self) -> Option<&(Holder, Instant)> {
        self.waiting.front()
    }
}

impl MemoryBackend {
    pub(crate) fn fair_attempt(
        &self,
        key: &Key,
        holder: &Holder,
        lease: Duration,
        queue_timeout: Duration,
        join: bool,
    ) -> Attempt {
        let now = Instant::now();
        let mut state = self.state();
        state.sweep(now);
        let held_for = match state.live(key, now) {
            Some(held) if held.holder == *holder => {
                held.count += 1;
                held.expires = now + lease;
                return Attempt::Reentered { token: held.token };
            }
            Some(held) => Some(held.expires - now),
            None => None,
        };
        let queue = state.queues.entry(key.clone()).or_default();
        queue.prune(now);
        let my_turn = queue.head().is_none_or(|(head, _)| head == holder);
        if held_for.is_none() && my_turn {
            queue.waiting.pop_front();
            if queue.is_empty() {
                state.queues.remove(key);
            }
            // Free: `take` takes it.
            return state.take(key, holder, lease, now);
        }
        if join {
            let deadline = now + queue_timeout;
            match queue.waiting.iter_mut().find(|(h, _)| h == holder) {
                Some(place) => place.1 = deadline,
                None => queue.waiting.push_back((holder.clone(), deadline)),
            }
        }
        // Retry by the deadline of the waiter in front (of the tail, if not queued): if
        // it has died, it can be dropped then.
        let ahead = match queue.waiting.iter().position(|(h, _)| h == holder) {
            Some(0) => None,
            Some(at) => queue.waiting.get(at - 1),
            None => queue.waiting.back(),
        };
        let wait = ahead.map(|(_, deadline)| *deadline - now + Duration::from_millis(1));
        let head = queue.head().map(|(h, _)| h.clone());
        if queue.is_empty() {
            state.queues.remove(key);
        }
        drop(state);
        let ttl = match held_for {
            Some(ttl) => wait.map_or(ttl, |wait| wait.min(ttl)),
            None => {
                // Free, but another waiter's turn: tell it (its notice may have been lost,
                // or it has just become head).
                if let Some(head) = head.filter(|h| h != holder) {
                    self.waiters.notify_one(&wake_channel(key, &head));
                }
                wait.unwrap_or(Duration::ZERO)
            }
        };
        Attempt::Busy { ttl: Some(ttl) }
    }

    pub(super) fn release_fair(
        &self,
        key: &Key,
        holder: &Holder,
        outcome: Option<Outcome<'_>>,
    ) -> Released {
        let now = Instant::now();
        let mut state = self.state();
        let Some(held) = state.live(key, now).filter(|h| h.holder == *holder) else {
            return Released::NotHeld;
        };
        held.count -= 1;
        let left = held.count;
        if let Some(outcome) = outcome {
            state
                .outcomes
                .insert(key.clone(), (outcome.bytes.to_vec(), now + outcome.keep));
        }
        let mut next = None;
        if left == 0 {
            state.locks.remove(key);
            if let Some(queue) = state.queues.get_mut(key) {
                next = queue.prune(now).head().map(|(h, _)| h.clone());
                if queue.is_empty() {
                    state.queues.remove(key);
                }
            }
        }
        drop(state);
        if outcome.is_some() {
            self.waiters.notify_all(key.channel());
        }
        if let Some(next) = next {
            self.waiters.notify_one(&wake_channel(key, &next));
        }
        match left {
            0 => Released::Freed,
            n => Released::Remaining(n),
        }
    }

    pub(crate) fn fair_leave(&self, key: &Key, holder: &Holder) -> bool {
        let now = Instant::now();
        let mut state = self.state();
        let free = state.live(key, now).is_none();
        let Some(queue) = state.queues.get_mut(key) else {
            return false;
        };
        let was_head = queue.head().is_some_and(|(h, _)| h == holder);
        let before = queue.waiting.len();
        queue.waiting.retain(|(h, _)| h != holder);
        let removed = queue.waiting.len() < before;
        let next = match (was_head && free, queue.head()) {
            (true, Some((next, _))) => Some(next.clone()),
            _ => None,
        };
        if queue.is_empty() {
            state.queues.remove(key);
        }
        drop(state);
        if let Some(next) = next {
            self.waiters.notify_one(&wake_channel(key, &next));
        }
        removed
    }

    /// As `LLEN` of the Redis queue: every waiter not yet pruned, until the last deadline
    /// has passed (when the Redis keys expire).
    pub(crate) fn fair_queued(&self, key: &Key) -> usize {
        let now = Instant::now();
        match self.state().queues.get(key) {
            Some(queue) if queue.waiting.iter().any(|(_, d)| *d > now) => queue.waiting.len(),
            _ => 0,
        }
    }
}
