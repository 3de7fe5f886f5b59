//! One counting call at a time per given holder, on a cluster.
//!
//! A cluster client sends a call again when its connection broke before the reply, and
//! a script tells a second run of a call that changes a hold's count by the call's id,
//! which it keeps beside the count (`lua/once.lua`). It keeps the last id only: two calls
//! of one holder that both ran before the connection broke would each find the other's
//! id when sent again, and count twice. A holder made for its acquisition makes one call
//! at a time by itself (nobody else has it); a given holder may be used by several tasks
//! at once, so its counting calls take turns here, process-wide (a holder is never made
//! from its id, so no other process can share it). A turn lasts until the call has its
//! answer or the cluster client gave up on it, after which it is never sent again.
//!
//! Not covered: the release of a dropped guard, pipelined with others by the release
//! task (a pipeline cannot wait for one holder's turn without holding up the rest). A
//! dropped re-entry's release in flight beside another call of its given holder, both
//! sent again, may still count twice; the hold then runs out with its lease.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex, PoisonError};

use tokio::sync::OwnedMutexGuard;

use crate::holder::Holder;

type Turns = HashMap<Holder, Arc<tokio::sync::Mutex<()>>>;

/// The holders with a counting call in flight or waiting, and what they take turns on.
static TURNS: LazyLock<Mutex<Turns>> = LazyLock::new(Mutex::default);

fn turns() -> std::sync::MutexGuard<'static, Turns> {
    // Every critical section leaves the map consistent, so a poisoned lock is usable.
    TURNS.lock().unwrap_or_else(PoisonError::into_inner)
}

/// `holder`'s turn to send a counting call: no other is in flight until it is dropped.
pub(super) struct Turn {
    holder: Holder,
    guard: Option<OwnedMutexGuard<()>>,
}

/// Waits for `holder`'s turn.
pub(super) async fn take(holder: Holder) -> Turn {
    let turn = turns().entry(holder.clone()).or_default().clone();
    let guard = turn.lock_owned().await;
    Turn {
        holder,
        guard: Some(guard),
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        drop(self.guard.take());
        let mut turns = turns();
        // Only the map's own reference left: nobody else sends or waits as this holder.
        if turns
            .get(&self.holder)
            .is_some_and(|turn| Arc::strong_count(turn) == 1)
        {
            turns.remove(&self.holder);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn a_holders_calls_take_turns_and_leave_nothing_behind() {
        let holder = Holder::new("turns-test", 1);
        let first = take(holder.clone()).await;
        let second = tokio::spawn(take(holder.clone()));
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!second.is_finished(), "waits for the first call's turn");
        let other = take(Holder::new("turns-test", 2)).await; // another holder: at once
        drop(other);
        drop(first);
        let second = tokio::time::timeout(Duration::from_secs(1), second).await;
        drop(second.expect("its turn came").expect("no panic"));
        assert!(!turns().contains_key(&holder), "no entry left");
    }
}
