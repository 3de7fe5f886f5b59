//! Graceful shutdown for the examples' servers: they stop on SIGTERM (what an
//! orchestrator sends at a deploy) or Ctrl-C (`lockwarden::shutdown_signal`), let the
//! requests in flight finish, then shut the lock client down so that no lock it holds
//! waits out its lease under the next replica.

use std::time::Duration;

use lockwarden::LockClient;

/// How long the lock client's shutdown may take (a deploy's grace period is longer).
pub const LOCKS_GRACE: Duration = Duration::from_secs(5);

/// Once the server has stopped: sends the releases still queued and releases whatever
/// `client` still holds (see `LockClient::shutdown`); says what it could not.
pub async fn release_locks(client: &LockClient) -> bool {
    match client.shutdown(LOCKS_GRACE).await {
        Ok(()) => true,
        Err(error) => {
            eprintln!("{error}");
            false
        }
    }
}
