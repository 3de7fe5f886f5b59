//! [`Held`]: a request's lock from acquisition to release, with its span and the response
//! being recorded; it ends in order (store the response, then release) or, dropped
//! unfinished, releases in the background.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Instant;

use sync_wrapper::SyncFuture;
use tracing::{Instrument, Span};

use super::remember::recording::Recording;
use super::retry_after::HoldTicket;
use super::trace;
use crate::LockGuard;

/// A held lock, its request span, and the response being recorded for replay, if any.
/// [`finish`](Self::finish) ends it in order; dropping it releases in the background.
pub struct Held {
    guard: Option<LockGuard>,
    span: Span,
    acquired: Instant,
    recording: Option<Recording>,
    /// The hold in the layer's record of hold times, ended with the hold.
    ticket: Option<HoldTicket>,
}

impl Held {
    pub(crate) fn new(guard: LockGuard, span: Span, ticket: HoldTicket) -> Self {
        Self {
            guard: Some(guard),
            span,
            acquired: Instant::now(),
            recording: None,
            ticket: Some(ticket),
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
        // The hold ends here for the layer's estimates: its release is under way.
        self.ticket.take();
        let lost = guard.is_lost();
        if lost || !self.span.is_disabled() {
            let hold_ms = trace::millis(self.acquired.elapsed());
            self.span.record("hold_ms", hold_ms);
            if lost {
                tracing::warn!(
                    parent: &self.span,
                    hold_ms,
                    "the request's lock was lost before the request finished; another request may have run concurrently"
                );
            }
        }
        Some(guard)
    }

    /// Releases the lock, storing the recorded response first if the body `completed`
    /// (ended without an error) and fit; the returned future resolves when that is done.
    pub(crate) fn finish(mut self, completed: bool) -> Option<Release> {
        let guard = self.take_guard()?;
        let stored = self
            .recording
            .take()
            .filter(|_| completed)
            .and_then(Recording::finish);
        let release = async move {
            match stored {
                Some((bytes, keep)) => match guard.complete(bytes, keep).await {
                    Ok(()) => tracing::debug!(remembered = true, "lock released"),
                    Err(error) => tracing::warn!(
                        %error,
                        remembered = false,
                        "storing the response, and with it releasing the lock, failed: a retry \
                         runs the handler again, and the lock expires with its lease"
                    ),
                },
                None => match guard.release().await {
                    Ok(()) => tracing::debug!(remembered = false, "lock released"),
                    Err(error) => tracing::warn!(
                        %error,
                        remembered = false,
                        "releasing the request's lock failed; it expires with its lease"
                    ),
                },
            }
        };
        Some(Release(SyncFuture::new(Box::pin(
            release.instrument(self.span.clone()),
        ))))
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        // Unfinished (the client went away): the guard releases in the background
        // and nothing is remembered.
        if self.take_guard().is_some() {
            tracing::debug!(parent: &self.span, "lock released (response not completed)");
        }
    }
}

/// A release (and the storing of the response) in progress, driven inline by the body or
/// the response future that waits for it: no task of its own. Dropped before it is done
/// (the client went away), it still completes: once polled, the core finishes a release
/// whose caller stopped waiting in the background, and a guard never polled releases
/// when dropped.
pub struct Release(SyncFuture<Pin<Box<dyn Future<Output = ()> + Send>>>);

impl Future for Release {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        Pin::new(&mut self.0).poll(cx)
    }
}
