//! How many guards of each hold this client has. A release whose reply was lost may be
//! sent again only when its guard was the hold's last one here (and its holder was made
//! for it): then the count in the store was 1, and a second release is a no-op if the
//! first ran.

use std::sync::{Mutex, PoisonError};

use crate::hold::{Hold, HoldMap};

#[derive(Default)]
pub(crate) struct LiveHolds(Mutex<HoldMap<u32>>);

impl LiveHolds {
    /// A guard of `hold` was made.
    pub(crate) fn enter(&self, hold: &Hold) {
        *self.guards().entry(hold.clone()).or_default() += 1;
    }

    /// A guard of `hold` ended; returns how many are left.
    pub(crate) fn leave(&self, hold: &Hold) -> u32 {
        let mut guards = self.guards();
        let Some(count) = guards.get_mut(hold) else {
            return 0;
        };
        *count -= 1;
        let left = *count;
        if left == 0 {
            guards.remove(hold);
        }
        left
    }

    /// Every hold with guards here, and how many (for the client's shutdown).
    pub(crate) fn snapshot(&self) -> Vec<(Hold, u32)> {
        let guards = self.guards();
        guards.iter().map(|(hold, n)| (hold.clone(), *n)).collect()
    }

    fn guards(&self) -> std::sync::MutexGuard<'_, HoldMap<u32>> {
        // Every critical section leaves the map consistent, so a poisoned lock is usable.
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hold::HoldKind;
    use crate::holder::Holder;
    use crate::key::KeySpace;

    #[test]
    fn counts_guards_per_hold() {
        let keys = KeySpace::default();
        let hold = |name: &str, n| Hold {
            kind: HoldKind::PLAIN,
            key: keys.key(name).expect("key"),
            holder: Holder::new("client", n),
        };
        let live = LiveHolds::default();
        live.enter(&hold("a", 1));
        live.enter(&hold("a", 1));
        live.enter(&hold("a", 2));
        assert_eq!(live.leave(&hold("a", 1)), 1);
        assert_eq!(live.leave(&hold("a", 2)), 0);
        assert_eq!(live.leave(&hold("a", 1)), 0);
        assert!(live.guards().is_empty());
        assert_eq!(live.leave(&hold("b", 1)), 0, "unknown holds count as none");
    }
}
