//! Several locks at once in-process: checked and taken under one lock of the store, so
//! all or nothing, as `lua/multi_acquire.lua` does on Redis.

use std::time::Duration;

use tokio::time::Instant;

use crate::backend::{Attempt, MultiAttempt};
use crate::holder::Holder;
use crate::key::Key;
use crate::memory::MemoryBackend;

impl MemoryBackend {
    pub(crate) fn attempt_many(
        &self,
        keys: &[Key],
        holder: &Holder,
        lease: Duration,
    ) -> MultiAttempt {
        let now = Instant::now();
        let mut state = self.state();
        state.sweep(now);
        for (index, key) in keys.iter().enumerate() {
            if let Some(held) = state.live(key, now).filter(|h| h.holder != *holder) {
                return MultiAttempt::Busy {
                    index,
                    ttl: Some(held.expires - now),
                };
            }
        }
        let tokens = keys
            .iter()
            .map(|key| match state.take(key, holder, lease, now) {
                Attempt::Taken { token } | Attempt::Reentered { token } => token,
                // Checked free or ours above, under the same lock.
                Attempt::Busy { .. } | Attempt::Completed { .. } => 0,
            })
            .collect();
        MultiAttempt::Taken { tokens }
    }
}
