//! [`Remembering`]: the settings of a remembering layer that the response side needs
//! (how long to keep, how large a body, which statuses, which headers), and their defaults.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use http::{HeaderName, StatusCode};

/// The largest response body [`LockLayer::remember`](crate::LockLayer::remember) stores
/// by default: 1 MiB. A longer response is sent but not remembered.
pub const DEFAULT_MAX_STORED_BODY: usize = 1024 * 1024;

/// Decides which responses are remembered, by status.
pub(crate) type StoreIf = Arc<dyn Fn(StatusCode) -> bool + Send + Sync>;

/// The settings of a remembering layer that the response side needs.
#[derive(Clone)]
pub(crate) struct Remembering {
    pub(crate) keep: Duration,
    pub(crate) max_stored_body: usize,
    pub(crate) store_if: StoreIf,
    /// Replayed besides `content-type`.
    pub(crate) replay_headers: Vec<HeaderName>,
}

impl Remembering {
    pub(crate) fn new(keep: Duration) -> Self {
        Self {
            keep,
            max_stored_body: DEFAULT_MAX_STORED_BODY,
            // Success and the client's own mistakes are final; a server error may not be.
            store_if: Arc::new(|status| status.is_success() || status.is_client_error()),
            replay_headers: Vec::new(),
        }
    }
}

impl fmt::Debug for Remembering {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Remembering")
            .field("keep", &self.keep)
            .field("max_stored_body", &self.max_stored_body)
            .field("replay_headers", &self.replay_headers)
            .finish_non_exhaustive()
    }
}
