//! The process-wide default lock client: Redis at `REDIS_URL`, and an error naming that
//! variable when it is not set. The in-process store is never chosen for you: a service
//! deployed as two replicas would then run requests with the same key at once.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use tokio::sync::OnceCell;

use crate::{BackendError, LockClient, LockError};

static DEFAULT: OnceCell<LockClient> = OnceCell::const_new();

/// When connecting last failed: requests within [`RECONNECT_AFTER`] of it fail at once.
static LAST_FAILURE: Mutex<Option<Instant>> = Mutex::new(None);

/// How long after a failed connection attempt the next one is made.
const RECONNECT_AFTER: Duration = Duration::from_millis(500);

/// The variable the default client reads its Redis URL from.
const REDIS_URL: &str = "REDIS_URL";

/// What [`default_client`] answers while `REDIS_URL` is not set.
const NOT_SET: &str = "REDIS_URL is not set. Set it to the Redis every replica shares \
    (redis://host:6379/), or give the layer or extractor a client of its own: \
    `.client(LockClient::connect(url).await?)`, or `.client(LockClient::in_memory())` \
    for locks that exclude requests of this process only";

/// The lock client used by layers and extractors that were not given one: Redis at the
/// URL in the `REDIS_URL` environment variable.
///
/// Made on first use. Without `REDIS_URL` it fails with
/// [`BackendError::NotConfigured`], which names the variable, and the layer answers
/// `503`: the in-process store is used only when you ask for it
/// ([`LockClient::in_memory`], given with `.client(..)`), so a deployment cannot run
/// single-process by accident. If Redis cannot be reached this fails too (the layer
/// answers `503`), and a later call tries again.
///
/// The client's background tasks (watchdog, pub/sub) run on the Tokio runtime of the
/// first call, so use it from one runtime for the life of the process.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// use lockwarden::{BackendError, LockError};
///
/// # if std::env::var_os("REDIS_URL").is_none() {
/// // With REDIS_URL unset there is no default: the error says what to set.
/// match lockwarden::default_client().await {
///     Err(LockError::Backend(BackendError::NotConfigured(what))) => assert!(what.contains("REDIS_URL")),
///     other => panic!("expected NotConfigured, got {other:?}"),
/// }
/// # }
/// # }
/// ```
///
/// # Errors
/// [`BackendError::NotConfigured`] if `REDIS_URL` is not set, [`LockError::Backend`] if
/// Redis cannot be reached.
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

/// Says once, when a layer without a client of its own is built, that its requests will
/// be refused because `REDIS_URL` is not set: at start-up, not at the first request.
pub(crate) fn warn_if_unconfigured() {
    static WARNED: AtomicBool = AtomicBool::new(false);
    if redis_url().is_none() && !WARNED.swap(true, Ordering::Relaxed) {
        tracing::error!("lockwarden: {NOT_SET}; until then, every locked request is answered 503");
        // A service that logs nothing yet (no tracing subscriber) must still be told.
        if !tracing::dispatcher::has_been_set() {
            eprintln!("lockwarden: {NOT_SET}; until then, every locked request is answered 503");
        }
    }
}

fn redis_url() -> Option<String> {
    std::env::var(REDIS_URL).ok().filter(|u| !u.is_empty())
}

async fn init() -> Result<LockClient, LockError> {
    let Some(url) = redis_url() else {
        return Err(LockError::Backend(BackendError::NotConfigured(NOT_SET)));
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
