//! The semaphores and plain locks whose last release, as this client saw it, left waiters:
//! a semaphore's next release goes by the script that grants in the same step (one round
//! trip) rather than as plain commands followed by the grant (two); a plain lock's (whose
//! last release found a waiter's mark) sends the notice with the delete rather than after
//! it. Remembered per client, by Redis key; an uncontended one is never in it, so its
//! releases stay plain commands, and a lock's sends no notice.

use std::collections::HashSet;
use std::sync::{Mutex, MutexGuard, PoisonError};

/// At most this many semaphores are remembered; past it the memory starts again (a
/// forgotten one's next release is plain commands, then the grant: correct, one round
/// trip more).
const MOST: usize = 4096;

/// See the module docs.
#[derive(Debug, Default)]
pub(super) struct Contended(Mutex<HashSet<Box<str>>>);

impl Contended {
    /// Whether the last release of the semaphore or lock at `key` left waiters.
    pub(super) fn seen(&self, key: &str) -> bool {
        self.set().contains(key)
    }

    /// What a release of the semaphore or lock at `key` saw: waiters left, or none.
    pub(super) fn note(&self, key: &str, waiters: bool) {
        let mut set = self.set();
        if !waiters {
            set.remove(key);
            return;
        }
        if set.len() >= MOST && !set.contains(key) {
            set.clear();
        }
        set.insert(key.into());
    }

    fn set(&self) -> MutexGuard<'_, HashSet<Box<str>>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remembers_what_the_last_release_saw_within_a_bound() {
        let contended = Contended::default();
        assert!(!contended.seen("a"));
        contended.note("a", true);
        assert!(contended.seen("a"));
        contended.note("a", false);
        assert!(!contended.seen("a"));
        for i in 0..MOST {
            contended.note(&i.to_string(), true);
        }
        assert!(contended.seen("0"));
        contended.note("one more", true);
        assert!(contended.seen("one more") && !contended.seen("0"));
        assert_eq!(contended.set().len(), 1);
    }
}
