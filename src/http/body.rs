//! [`LockedBody`]: the response body that owns the request's lock and releases it when the
//! body ends (last frame, trailers, error, `is_end_stream()`) or is dropped.

use std::fmt;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::Instant;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use tracing::Span;

use crate::LockGuard;

/// A held lock and its request span; dropping it releases the lock and records the hold time.
pub(crate) struct Held {
    guard: Option<LockGuard>,
    span: Span,
    acquired: Instant,
}

impl Held {
    pub(crate) fn new(guard: LockGuard, span: Span) -> Self {
        Self {
            guard: Some(guard),
            span,
            acquired: Instant::now(),
        }
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        let Some(guard) = self.guard.take() else {
            return;
        };
        let hold_ms = u64::try_from(self.acquired.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.span.record("hold_ms", hold_ms);
        if guard.is_lost() {
            tracing::warn!(
                parent: &self.span,
                hold_ms,
                "the request's lock was lost before the request finished; another request may have run concurrently"
            );
        } else {
            tracing::debug!(parent: &self.span, hold_ms, "lock released");
        }
        // Dropping the guard releases the lock (in the background on Redis).
        drop(guard);
    }
}

pin_project! {
    /// The response body of [`LockService`](super::LockService): the inner service's body,
    /// holding the request's lock until its last frame, or a problem document.
    ///
    /// The lock is released as soon as the body reports its end: a `None` frame, a trailers
    /// frame, an error, or `is_end_stream()` turning true after a data frame (so a body of
    /// known length releases with its last byte), and when the body is dropped unfinished
    /// (the client went away).
    ///
    /// ```
    /// use http_body::Body;
    /// use lockwarden::LockedBody;
    ///
    /// // Problem bodies are made by the layer; an unlocked body just wraps another one.
    /// let body = LockedBody::new(http_body_util::Full::new(bytes::Bytes::from("hi")));
    /// assert_eq!(body.size_hint().exact(), Some(2));
    /// ```
    pub struct LockedBody<B> {
        #[pin]
        kind: Kind<B>,
        held: Option<Held>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<B> {
        Inner { #[pin] body: B },
        Problem { bytes: Option<Bytes> },
    }
}

impl<B> LockedBody<B> {
    /// Wraps `body` without a lock.
    pub fn new(body: B) -> Self {
        Self {
            kind: Kind::Inner { body },
            held: None,
        }
    }

    /// Wraps `body`, releasing `held` when it ends (at once if it is empty already).
    pub(crate) fn locked(body: B, held: Option<Held>) -> Self
    where
        B: Body,
    {
        let held = held.filter(|_| !body.is_end_stream());
        Self {
            kind: Kind::Inner { body },
            held,
        }
    }

    /// A problem document (see [`LockRejection`](super::LockRejection)).
    pub(crate) fn problem(bytes: Bytes) -> Self {
        Self {
            kind: Kind::Problem { bytes: Some(bytes) },
            held: None,
        }
    }

    /// Whether the body still holds its request's lock.
    ///
    /// ```
    /// # use lockwarden::LockedBody;
    /// assert!(!LockedBody::new(http_body_util::Empty::<bytes::Bytes>::new()).holds_lock());
    /// ```
    pub fn holds_lock(&self) -> bool {
        self.held.is_some()
    }
}

impl<B> From<Bytes> for LockedBody<B> {
    fn from(bytes: Bytes) -> Self {
        Self::problem(bytes)
    }
}

impl<B> Body for LockedBody<B>
where
    B: Body,
    B::Data: From<Bytes>,
{
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = self.project();
        match this.kind.project() {
            KindProj::Problem { bytes } => {
                Poll::Ready(bytes.take().map(|b| Ok(Frame::data(B::Data::from(b)))))
            }
            KindProj::Inner { mut body } => {
                let frame = ready!(body.as_mut().poll_frame(cx));
                let ended = match &frame {
                    None | Some(Err(_)) => true,
                    Some(Ok(frame)) => frame.is_trailers() || body.is_end_stream(),
                };
                if ended {
                    this.held.take();
                }
                Poll::Ready(frame)
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Inner { body } => body.is_end_stream(),
            Kind::Problem { bytes } => bytes.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Inner { body } => body.size_hint(),
            Kind::Problem { bytes } => {
                SizeHint::with_exact(bytes.as_ref().map_or(0, |b| b.len() as u64))
            }
        }
    }
}

impl<B> fmt::Debug for LockedBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match &self.kind {
            Kind::Inner { .. } => "inner",
            Kind::Problem { .. } => "problem",
        };
        f.debug_struct("LockedBody")
            .field("kind", &kind)
            .field("holds_lock", &self.holds_lock())
            .finish()
    }
}
