//! A client's graceful shutdown: before its process exits, nothing it holds is left to
//! run out with its lease. The releases of dropped guards still queued are sent, every
//! hold a live guard still has is released, the watchdog stops, and no acquisition starts
//! or waits any more; what the store did not confirm in time is reported.
//!
//! It works from what the engine keeps for every kind of hold alike (the live guards per
//! hold, the watchdog, the store's release queue), so a new kind of lock is covered
//! without a line here.

use std::time::Duration;

use tokio::time::Instant;

use crate::engine::Engine;
use crate::error::ShutdownError;
use crate::hold::Hold;
use crate::store::contract::{LockStore, Reentries, Released};

/// Shuts `engine` down within `timeout` (see `LockClient::shutdown`).
pub(crate) async fn shutdown(engine: &Engine, timeout: Duration) -> Result<(), ShutdownError> {
    let deadline = Instant::now() + timeout;
    // First, so that no acquisition takes a lock this releases no more: waiting ones end.
    engine.waiters().close();
    // No renewal from here on; the watched guards learn that their locks go.
    engine.watchdog().stop();
    let holds = engine.live().snapshot();
    let store = engine.store();
    let released = holds
        .iter()
        .map(|(hold, guards)| tokio::time::timeout_at(deadline, release(store, hold, *guards)));
    let (released, flushed) = tokio::join!(
        futures_util::future::join_all(released),
        tokio::time::timeout_at(deadline, store.flush()),
    );
    let unreleased: Vec<String> = holds
        .iter()
        .zip(released)
        .filter(|(_, released)| !matches!(released, Ok(true)))
        .map(|((hold, _), _)| hold.key.name().to_owned())
        .collect();
    let dropped_unconfirmed = flushed.is_err();
    tracing::info!(
        holds = holds.len(),
        unreleased = unreleased.len(),
        dropped_unconfirmed,
        "lock client shut down"
    );
    match unreleased.is_empty() && !dropped_unconfirmed {
        true => Ok(()),
        false => Err(ShutdownError {
            unreleased,
            dropped_unconfirmed,
        }),
    }
}

/// Releases the `guards` counts this client's guards have in `hold` (fewer if the store
/// says the holder holds less); whether the store confirmed it.
async fn release(store: &crate::store::Store, hold: &Hold, guards: u32) -> bool {
    for _ in 0..guards {
        match store.release(hold, None, Reentries::Possible).await {
            Ok(Released::Remaining(_)) => continue,
            Ok(Released::Freed | Released::NotHeld | Released::Ended) => return true,
            Err(error) => {
                tracing::warn!(key = %hold.key, %error,
                    "could not release a lock at shutdown; it expires with its lease");
                return false;
            }
        }
    }
    true
}
