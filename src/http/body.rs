//! [`LockedBody`]: the response body that owns the request's lock and releases it when the
//! body ends (last frame, trailers, error, `is_end_stream()`), panics, or is dropped.

use std::any::Any;
use std::fmt;
use std::future::Future;
use std::panic::{self, AssertUnwindSafe};
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use bytes::{Buf, Bytes};
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use sync_wrapper::SyncWrapper;

use super::held::{Held, Release};

pin_project! {
    /// The response body of [`LockService`](super::LockService): the inner service's body,
    /// holding the request's lock until its last frame, or a body the layer made itself
    /// (a problem document, a replayed response).
    ///
    /// The lock is released as soon as the body reports its end: a `None` frame, a trailers
    /// frame, an error, or `is_end_stream()` turning true after a data frame (so a body of
    /// known length releases with its last byte). The last frame is handed on only after
    /// the release (and, when remembering, the stored response) is done, so a client that
    /// has the whole response can use the key again at once. A body whose first frame is
    /// ready when the handler returns and is its last (most small responses) is released
    /// before the response is handed on at all, so its head and body go out together. A
    /// body dropped unfinished (the client went away) releases in the background. A body
    /// that panics gives the lock back first, then the panic goes on.
    ///
    /// ```
    /// use axum::body::{Body, HttpBody};
    /// use lockwarden::LockedBody;
    ///
    /// // Problem bodies are made by the layer; an unlocked body just wraps another one.
    /// let body = LockedBody::new(Body::from("hi"));
    /// assert_eq!(body.size_hint().exact(), Some(2));
    /// ```
    pub struct LockedBody<B: Body> {
        #[pin]
        kind: Kind<B>,
        held: Option<Held>,
        // The release in progress; the frame read before it, handed on next.
        finishing: Option<Release>,
        ahead: Option<Option<Result<Frame<B::Data>, B::Error>>>,
        // The inner body panicked: the panic goes on once the release is done.
        panic: Option<SyncWrapper<Box<dyn Any + Send>>>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<B> {
        Inner { #[pin] body: B },
        // Boxed to be polled before the response is handed on, and still move with it.
        Boxed { body: Pin<Box<B>> },
        Made { bytes: Option<Bytes> },
    }
}

impl<B: Body> LockedBody<B> {
    /// Wraps `body` without a lock.
    pub fn new(body: B) -> Self {
        Self {
            kind: Kind::Inner { body },
            held: None,
            finishing: None,
            ahead: None,
            panic: None,
        }
    }

    /// Whether the body still holds its request's lock.
    ///
    /// ```
    /// # use lockwarden::LockedBody;
    /// assert!(!LockedBody::new(axum::body::Body::empty()).holds_lock());
    /// ```
    pub fn holds_lock(&self) -> bool {
        self.held.is_some() || self.finishing.is_some()
    }
}

impl<B> LockedBody<B>
where
    B: Body,
    B::Data: From<Bytes>,
{
    /// Wraps `body`, releasing `held` when it ends, and reads its first frame now if it is
    /// ready. When that frame ends the body (or the body is empty), the release starts
    /// here and is returned, to be awaited before the response is handed on: the head is
    /// then written together with the body, instead of alone while the release runs.
    pub(crate) fn read_ahead(body: B, held: Held, cx: &mut Context<'_>) -> (Self, Option<Release>) {
        if body.is_end_stream() {
            return (Self::new(body), held.finish(true));
        }
        let mut held = Some(held);
        let mut body = Box::pin(body);
        let (ahead, release) = match body.as_mut().poll_frame(cx) {
            Poll::Pending => (None, None),
            Poll::Ready(mut frame) => {
                let release = on_frame(&mut held, &mut frame, body.is_end_stream());
                (Some(frame), release)
            }
        };
        let body = Self {
            kind: Kind::Boxed { body },
            held,
            finishing: None,
            ahead,
            panic: None,
        };
        (body, release)
    }
}

/// Records `frame` of a held body (when remembering) and, if it is the body's last, takes
/// `held` and starts the release; `None` when the frame can be handed on at once.
fn on_frame<D, E>(
    held: &mut Option<Held>,
    frame: &mut Option<Result<Frame<D>, E>>,
    at_end: bool,
) -> Option<Release>
where
    D: Buf + From<Bytes>,
{
    if let Some(recording) = held.as_mut()?.recording() {
        *frame = frame
            .take()
            .map(|frame| frame.map(|frame| frame.map_data(|d| recording.record(d))));
    }
    let completed = match frame {
        None => true,
        Some(Err(_)) => false,
        Some(Ok(frame)) if frame.is_trailers() || at_end => true,
        Some(Ok(_)) => return None,
    };
    held.take()?.finish(completed)
}

impl<B: Body> From<Bytes> for LockedBody<B> {
    /// A body the layer made (a problem document, a replayed response).
    fn from(bytes: Bytes) -> Self {
        Self {
            kind: Kind::Made { bytes: Some(bytes) },
            held: None,
            finishing: None,
            ahead: None,
            panic: None,
        }
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
        if let Some(finishing) = this.finishing.as_mut() {
            // A failed release was logged by itself; the frame goes on regardless.
            ready!(Pin::new(finishing).poll(cx));
            *this.finishing = None;
        }
        if let Some(panic) = this.panic.take() {
            panic::resume_unwind(panic.into_inner());
        }
        if let Some(frame) = this.ahead.take() {
            return Poll::Ready(frame);
        }
        let body = match this.kind.project() {
            KindProj::Made { bytes } => {
                return Poll::Ready(bytes.take().map(|b| Ok(Frame::data(B::Data::from(b)))))
            }
            body => body,
        };
        let polled = panic::catch_unwind(AssertUnwindSafe(|| match body {
            KindProj::Inner { mut body } => body
                .as_mut()
                .poll_frame(cx)
                .map(|frame| (frame, body.is_end_stream())),
            KindProj::Boxed { body } => body
                .as_mut()
                .poll_frame(cx)
                .map(|frame| (frame, body.is_end_stream())),
            KindProj::Made { .. } => Poll::Ready((None, true)),
        }));
        let (mut frame, at_end) = match polled {
            Ok(polled) => ready!(polled),
            Err(panic) => {
                // Give the lock back before the panic leaves the body.
                let Some(mut release) = this.held.take().and_then(|held| held.finish(false)) else {
                    panic::resume_unwind(panic)
                };
                if Pin::new(&mut release).poll(cx).is_ready() {
                    panic::resume_unwind(panic);
                }
                *this.finishing = Some(release);
                *this.panic = Some(SyncWrapper::new(panic));
                return Poll::Pending;
            }
        };
        let Some(mut release) = on_frame(this.held, &mut frame, at_end) else {
            return Poll::Ready(frame);
        };
        match Pin::new(&mut release).poll(cx) {
            Poll::Ready(()) => Poll::Ready(frame),
            Poll::Pending => {
                *this.finishing = Some(release);
                *this.ahead = Some(frame);
                Poll::Pending
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        if self.holds_lock() || self.ahead.is_some() || self.panic.is_some() {
            return false;
        }
        match &self.kind {
            Kind::Inner { body } => body.is_end_stream(),
            Kind::Boxed { body } => body.is_end_stream(),
            Kind::Made { bytes } => bytes.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        let inner = match &self.kind {
            Kind::Inner { body } => body.size_hint(),
            Kind::Boxed { body } => body.size_hint(),
            Kind::Made { bytes } => {
                return SizeHint::with_exact(bytes.as_ref().map_or(0, |b| b.len() as u64))
            }
        };
        // A data frame read ahead is still to come: the length it announces includes it.
        let ahead = match &self.ahead {
            Some(Some(Ok(frame))) => frame.data_ref().map_or(0, |d| d.remaining() as u64),
            _ => 0,
        };
        let mut hint = SizeHint::new();
        hint.set_lower(inner.lower().saturating_add(ahead));
        if let Some(upper) = inner.upper() {
            hint.set_upper(upper.saturating_add(ahead));
        }
        hint
    }
}

impl<B: Body> fmt::Debug for LockedBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match &self.kind {
            Kind::Inner { .. } | Kind::Boxed { .. } => "inner",
            Kind::Made { .. } => "made",
        };
        f.debug_struct("LockedBody")
            .field("kind", &kind)
            .field("holds_lock", &self.holds_lock())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    /// The body stays `Send + Sync` (hyper needs `Send`; `BoxBody` users need `Sync`)
    /// while it drives a release future that is only `Send`.
    #[test]
    fn locked_body_is_send_and_sync() {
        fn send_sync<T: Send + Sync>() {}
        send_sync::<super::LockedBody<http_body_util::Full<bytes::Bytes>>>();
    }
}
