//! The process-wide default lock client: Redis from `REDIS_URL`, else the in-process store.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use tokio::sync::OnceCell;

use crate::{BackendError, LockClient, LockError};

static DEFAULT: OnceCell<LockClient> = OnceCell::const_new();

/// When connecting last failed: requests within [`RECONNECT_AFTER`] of it fail at once.
static LAST_FAILURE: Mutex<Option<Instant>> = Mutex::new(None);

/// How long after a failed connection attempt the next one is made.
const RECONNECT_AFTER: Duration = Duration::from_millis(500);

/// The lock client used by layers and extractors that were not given one.
///
/// Made on first use: a Redis client for `REDIS_URL` if that variable is set, otherwise
/// an in-process store (with a warning, once: locks then exclude requests of this
/// process only). If Redis cannot be reached, this fails (the layer answers `503`) and a
/// later call tries again.
///
/// The client's background tasks (watchdog, pub/sub) run on the Tokio runtime of the
/// first call, so use it from one runtime for the life of the process.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lockwarden::LockError> {
/// // With REDIS_URL unset this is the in-process store.
/// let client = lockwarden::default_client().await?;
/// # if std::env::var_os("REDIS_URL").is_none() {
/// assert_eq!(client.backend_name(), "in-memory");
/// # }
/// # Ok(()) }
/// ```
///
/// # Errors
/// [`LockError::Backend`] if `REDIS_URL` is set and Redis cannot be reached.
pub async fn default_client() -> Result<LockClient, LockError> {
    if let Some(client) = DEFAULT.get() {
        return Ok(client.clone());
    }
    DEFAULT.get_or_try_init(init).await.cloned()
}

/// The default client if it is made already (no waiting).
pub(crate) fn ready_default_client() -> Option<LockClient> {
    DEFAULT.get().cloned()
}

async fn init() -> Result<LockClient, LockError> {
    let url = std::env::var("REDIS_URL").ok().filter(|u| !u.is_empty());
    let Some(url) = url else {
        tracing::warn!(
            "REDIS_URL is not set: lockwarden uses the in-process lock store, so locks \
             exclude requests of this process only"
        );
        return Ok(LockClient::in_memory());
    };
    let since_failure = LAST_FAILURE
        .lock()
        .ok()
        .and_then(|last| last.map(|at| at.elapsed()));
    if let Some(since) = since_failure.filter(|since| *since < RECONNECT_AFTER) {
        return Err(LockError::Backend(BackendError::Unreachable(
            RECONNECT_AFTER - since,
        )));
    }
    match LockClient::connect(&url).await {
        Ok(client) => {
            tracing::info!(backend = "redis", "lockwarden connected to REDIS_URL");
            Ok(client)
        }
        Err(error) => {
            tracing::error!(%error, "lockwarden could not connect to REDIS_URL; will retry");
            if let Ok(mut last) = LAST_FAILURE.lock() {
                *last = Some(Instant::now());
            }
            Err(error)
        }
    }
}
