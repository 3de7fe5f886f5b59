//! Settling a call that got no answer. A reply lost with its connection (or late past the
//! command timeout) leaves the caller not knowing whether the script ran.
//!
//! An acquire may have taken the lock, or queued, in a holder's name nobody will release.
//! When that holder was made for the acquisition (it held nothing before), releasing it
//! is exact: it frees what the attempt took, and is a no-op if the attempt never ran. The
//! acquisition goes on as a new holder, so no retry can re-enter (and inflate) what the
//! lost attempt took.
//!
//! A release may not have run. When its guard's holder was made for it and the guard
//! was the hold's last one in this client (`live.rs`), the count was 1, and sending it
//! again is exact too.
//!
//! Either way the release is sent in the background, retried until the store answers.
//! (A dropped guard's release goes with the batch that releases dropped guards, which
//! sends it again by the same rule: `store/redis`.)

use std::time::Duration;

use tokio::time::Instant;

use crate::hold::Hold;
use crate::store::contract::{LockStore, Reentries, Waiter};
use crate::store::Store;

/// Retry pacing while the store is still unreachable: short, so the lock is freed soon
/// after the connection is back.
const MIN_BACKOFF: Duration = Duration::from_millis(20);
const MAX_BACKOFF: Duration = Duration::from_millis(500);

/// Releases each of `holds` (and withdraws its `waiter`, if the kind waits in the store)
/// in the background, retrying transient failures for at most `lease`: by then whatever
/// the attempt took has run out anyway.
pub(crate) fn settle(store: Store, holds: Vec<Hold>, waiter: Option<Waiter>, lease: Duration) {
    tokio::spawn(async move {
        let until = Instant::now() + lease;
        let mut backoff = MIN_BACKOFF;
        for hold in &holds {
            loop {
                let settled = async {
                    store.release(hold, None, Reentries::Possible).await?;
                    if let Some(waiter) = waiter {
                        store.withdraw(waiter, &hold.key, &hold.holder).await?;
                    }
                    Ok::<_, crate::error::BackendError>(())
                };
                match settled.await {
                    Ok(()) => {
                        tracing::debug!(key = %hold.key, holder = %hold.holder,
                            "released a hold whose call got no answer");
                        break;
                    }
                    Err(error) if error.is_transient() && Instant::now() + backoff < until => {
                        tokio::time::sleep(backoff).await;
                        backoff = (backoff * 2).min(MAX_BACKOFF);
                    }
                    Err(error) => {
                        tracing::warn!(key = %hold.key, %error,
                            "could not release a hold whose call got no answer; it runs \
                             out with its lease");
                        break;
                    }
                }
            }
        }
    });
}
