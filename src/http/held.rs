//! [`Held`]: a request's lock from acquisition to release, with its span and the response
//! being recorded; it ends in order (store the response, then release) or, dropped
//! unfinished, releases in the background.

use std::time::Instant;

use tokio::task::JoinHandle;
use tracing::{Instrument, Span};

use super::remember::recording::Recording;
use super::trace;
use crate::LockGuard;

/// A held lock, its request span, and the response being recorded for replay, if any.
/// [`finish`](Self::finish) ends it in order; dropping it releases in the background.
pub(crate) struct Held {
    guard: Option<LockGuard>,
    span: Span,
    acquired: Instant,
    recording: Option<Recording>,
}

impl Held {
    pub(crate) fn new(guard: LockGuard, span: Span) -> Self {
        Self {
            guard: Some(guard),
            span,
            acquired: Instant::now(),
            recording: None,
        }
    }

    pub(crate) fn record(&mut self, recording: Option<Recording>) {
        self.recording = recording;
    }

    /// The response being recorded, if the layer remembers it.
    pub(crate) fn recording(&mut self) -> Option<&mut Recording> {
        self.recording.as_mut()
    }

    fn take_guard(&mut self) -> Option<LockGuard> {
        let guard = self.guard.take()?;
        let hold_ms = trace::millis(self.acquired.elapsed());
        self.span.record("hold_ms", hold_ms);
        if guard.is_lost() {
            tracing::warn!(
                parent: &self.span,
                hold_ms,
                "the request's lock was lost before the request finished; another request may have run concurrently"
            );
        }
        Some(guard)
    }

    /// Releases the lock, storing the recorded response first if the body `completed`
    /// (ended without an error) and fit. The release runs as its own task, so a client
    /// that goes away meanwhile cannot cut it short; the handle resolves when it is done.
    pub(crate) fn finish(mut self, completed: bool) -> Option<JoinHandle<()>> {
        let guard = self.take_guard()?;
        let stored = self
            .recording
            .take()
            .filter(|_| completed)
            .and_then(Recording::finish);
        let runtime = tokio::runtime::Handle::try_current().ok()?;
        let task = async move {
            let remembered = stored.is_some();
            let result = match stored {
                Some((bytes, keep)) => guard.complete(bytes, keep).await,
                None => guard.release().await,
            };
            match result {
                Ok(()) => tracing::debug!(remembered, "lock released"),
                Err(error) => {
                    tracing::warn!(%error, remembered, "releasing the request's lock failed; it expires with its lease")
                }
            }
        };
        Some(runtime.spawn(task.instrument(self.span.clone())))
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        // Unfinished (client gone, handler panicked): the guard releases in the background
        // and nothing is remembered.
        if self.take_guard().is_some() {
            tracing::debug!(parent: &self.span, "lock released (response not completed)");
        }
    }
}
