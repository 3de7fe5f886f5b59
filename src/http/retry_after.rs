//! When a refused request may try again: the `Retry-After` of a `409`/`423` (busy lock)
//! or `429` (full limit), estimated from the holds a layer has seen end.
//!
//! A holder's remaining lease says when its hold *must* end, not when it will: with the
//! watchdog it is 20 to 30 s for a hold of any length, so a client that obeys it waits
//! 60 times too long for half-second work. What a layer can know instead is how long its
//! own holds last, per route, and when each hold it runs began. The rule:
//!
//! - the recent holds of the hold's route (the last [`KEPT`] that ended) that lasted
//!   longer than this hold has run so far; their median, less the time this hold has
//!   already run, is the estimate (the hold of another replica, or of another layer,
//!   counts as just begun, on the refused request's route);
//! - with fewer than [`MIN_SEEN`] holds seen, or a hold that has run longer than every
//!   one of them, the estimate is one second: try again soon;
//! - never more than the holder's remaining lease, never less than one second.
//!
//! For a limit, the soonest of the key's holds in this layer to end counts.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use crate::Key;

/// How many ended holds a route's history keeps.
pub(crate) const KEPT: usize = 32;

/// How many ended holds a route must have seen before they count.
pub(crate) const MIN_SEEN: usize = 3;

/// The shortest `Retry-After`, and the answer when nothing better is known.
pub(crate) const FLOOR: Duration = Duration::from_secs(1);

/// At most this many routes get a history of their own; later ones share one.
const MAX_ROUTES: usize = 256;

/// The holds one layer (or one extractor type) has seen: how long the recent ones lasted,
/// per route, and when each one in progress began.
#[derive(Debug, Default)]
pub(crate) struct HoldTimes {
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// Each route's history; a hold names its route by index.
    routes: Vec<History>,
    /// The holds in progress, by lock: each one's ticket, when it began, and its route.
    running: HashMap<Key, Vec<(u64, Instant, usize)>>,
    /// The number of the last ticket.
    tickets: u64,
}

/// The durations of a route's last [`KEPT`] holds, in ms, the oldest overwritten.
#[derive(Debug)]
struct History {
    route: Option<Box<str>>,
    ended: [u32; KEPT],
    len: usize,
    next: usize,
}

impl History {
    fn new(route: Option<&str>) -> Self {
        Self {
            route: route.map(Into::into),
            ended: [0; KEPT],
            len: 0,
            next: 0,
        }
    }

    fn push(&mut self, held: Duration) {
        self.ended[self.next] = u32::try_from(held.as_millis()).unwrap_or(u32::MAX);
        self.next = (self.next + 1) % KEPT;
        self.len = (self.len + 1).min(KEPT);
    }

    /// How much longer a hold of this route that has run for `elapsed` may last: the
    /// median of the recent holds longer than it, less `elapsed`; `None` if too few
    /// ended, or none lasted longer.
    fn residual(&self, elapsed: Duration) -> Option<Duration> {
        if self.len < MIN_SEEN {
            return None;
        }
        let ran = u32::try_from(elapsed.as_millis()).unwrap_or(u32::MAX);
        let mut longer: Vec<u32> = self.ended[..self.len]
            .iter()
            .copied()
            .filter(|&ms| ms > ran)
            .collect();
        if longer.is_empty() {
            return None;
        }
        longer.sort_unstable();
        let median = longer[longer.len() / 2];
        Some(Duration::from_millis(u64::from(median - ran)))
    }
}

impl State {
    /// The index of `route`'s history, made on first use.
    fn route(&mut self, route: Option<&str>) -> usize {
        if let Some(at) = self.routes.iter().position(|h| h.route.as_deref() == route) {
            return at;
        }
        if self.routes.len() >= MAX_ROUTES {
            return self.route(None);
        }
        self.routes.push(History::new(route));
        self.routes.len() - 1
    }
}

impl HoldTimes {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        // A panic while recording leaves numbers, never a broken invariant.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Notes that a hold of `key` began now, on `route`; the hold ends when the returned
    /// ticket is dropped.
    pub(crate) fn begin(self: &Arc<Self>, key: &Key, route: Option<&str>) -> HoldTicket {
        let started = Instant::now();
        let mut state = self.state();
        let route = state.route(route);
        state.tickets += 1;
        let id = state.tickets;
        state
            .running
            .entry(key.clone())
            .or_default()
            .push((id, started, route));
        HoldTicket {
            times: self.clone(),
            key: key.clone(),
            id,
            started,
            route,
        }
    }

    /// When a request refused for `key`, on `route`, may try again (the rule is in the
    /// module's docs); `lease_left` is the holder's remaining lease.
    pub(crate) fn retry_after(
        &self,
        key: &Key,
        route: Option<&str>,
        lease_left: Duration,
    ) -> Duration {
        let now = Instant::now();
        let mut state = self.state();
        let estimate = match state.running.get(key).filter(|holds| !holds.is_empty()) {
            Some(holds) => holds
                .iter()
                .map(|&(_, started, route)| {
                    state.routes[route]
                        .residual(now.saturating_duration_since(started))
                        .unwrap_or(FLOOR)
                })
                .min(),
            None => {
                let route = state.route(route);
                state.routes[route].residual(Duration::ZERO)
            }
        };
        estimate.unwrap_or(FLOOR).min(lease_left).max(FLOOR)
    }
}

/// A hold in progress in a [`HoldTimes`]: dropped when the hold ends, which records how
/// long it lasted.
#[derive(Debug)]
pub(crate) struct HoldTicket {
    times: Arc<HoldTimes>,
    key: Key,
    id: u64,
    started: Instant,
    route: usize,
}

impl Drop for HoldTicket {
    fn drop(&mut self) {
        let held = self.started.elapsed();
        let mut state = self.times.state();
        if let Some(holds) = state.running.get_mut(&self.key) {
            if let Some(at) = holds.iter().position(|&(id, ..)| id == self.id) {
                holds.swap_remove(at);
            }
            if holds.is_empty() {
                state.running.remove(&self.key);
            }
        }
        if let Some(history) = state.routes.get_mut(self.route) {
            history.push(held);
        }
    }
}

/// A layer's [`HoldTimes`], shared by every service and request the layer makes. A
/// layer's builder changes a copy of its settings: a changed copy is another layer, with
/// a history of its own, so cloning makes a new one.
#[derive(Debug, Default)]
pub(crate) struct LayerHoldTimes(pub(crate) Arc<HoldTimes>);

impl Clone for LayerHoldTimes {
    fn clone(&self) -> Self {
        Self::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn history(ms: &[u64]) -> History {
        let mut history = History::new(None);
        for &ms in ms {
            history.push(Duration::from_millis(ms));
        }
        history
    }

    #[test]
    fn too_few_holds_give_no_estimate() {
        assert_eq!(history(&[500, 500]).residual(Duration::ZERO), None);
        assert_eq!(
            history(&[500, 500, 500]).residual(Duration::ZERO),
            Some(Duration::from_millis(500))
        );
    }

    #[test]
    fn the_median_of_longer_holds_less_the_time_run() {
        let seen = history(&[100, 200, 3000, 4000, 5000]);
        // All five are longer than nothing: median 3000.
        assert_eq!(
            seen.residual(Duration::ZERO),
            Some(Duration::from_millis(3000))
        );
        // Run 1 s: 3000, 4000, 5000 are longer; median 4000, less 1000.
        assert_eq!(
            seen.residual(Duration::from_secs(1)),
            Some(Duration::from_millis(3000))
        );
        // Longer than every one seen: no estimate.
        assert_eq!(seen.residual(Duration::from_secs(6)), None);
    }

    #[test]
    fn only_the_last_holds_are_kept() {
        let mut seen = history(&[60_000; KEPT]);
        for _ in 0..KEPT {
            seen.push(Duration::from_millis(400));
        }
        assert_eq!(
            seen.residual(Duration::ZERO),
            Some(Duration::from_millis(400))
        );
    }

    #[test]
    fn bounded_by_the_lease_and_a_second() {
        let client = crate::LockClient::in_memory();
        let key = client.key("k").expect("a valid key");
        let times = Arc::new(HoldTimes::default());
        // Nothing seen: one second.
        assert_eq!(
            times.retry_after(&key, None, Duration::from_secs(30)),
            FLOOR
        );
        for _ in 0..MIN_SEEN {
            let mut ticket = times.begin(&key, None);
            ticket.started -= Duration::from_secs(20);
            drop(ticket);
        }
        let running = times.begin(&key, None);
        let said = times.retry_after(&key, None, Duration::from_secs(30));
        assert!(said > Duration::from_secs(19) && said <= Duration::from_secs(20));
        // Never past the lease, never under a second.
        assert_eq!(
            times.retry_after(&key, None, Duration::from_secs(5)),
            Duration::from_secs(5)
        );
        assert_eq!(times.retry_after(&key, None, Duration::ZERO), FLOOR);
        drop(running);
        assert!(times.state().running.is_empty());
    }
}
