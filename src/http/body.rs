//! [`LockedBody`]: the response body that owns the request's lock and releases it when the
//! body ends (last frame, trailers, error, `is_end_stream()`) or is dropped.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

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
    /// has the whole response can use the key again at once. A body dropped unfinished
    /// (the client went away) releases in the background.
    ///
    /// ```
    /// use http_body::Body;
    /// use lockwarden::LockedBody;
    ///
    /// // Problem bodies are made by the layer; an unlocked body just wraps another one.
    /// let body = LockedBody::new(http_body_util::Full::new(bytes::Bytes::from("hi")));
    /// assert_eq!(body.size_hint().exact(), Some(2));
    /// ```
    pub struct LockedBody<B: Body> {
        #[pin]
        kind: Kind<B>,
        held: Option<Held>,
        // The release in progress, and the last frame, handed on when it is done.
        finishing: Option<Release>,
        last: Option<Option<Result<Frame<B::Data>, B::Error>>>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<B> {
        Inner { #[pin] body: B },
        Made { bytes: Option<Bytes> },
    }
}

impl<B: Body> LockedBody<B> {
    /// Wraps `body` without a lock.
    pub fn new(body: B) -> Self {
        Self::locked(body, None)
    }

    /// Wraps `body`, releasing `held` when it ends.
    pub(crate) fn locked(body: B, held: Option<Held>) -> Self {
        Self {
            kind: Kind::Inner { body },
            held,
            finishing: None,
            last: None,
        }
    }

    /// Whether the body still holds its request's lock.
    ///
    /// ```
    /// # use lockwarden::LockedBody;
    /// assert!(!LockedBody::new(http_body_util::Empty::<bytes::Bytes>::new()).holds_lock());
    /// ```
    pub fn holds_lock(&self) -> bool {
        self.held.is_some() || self.finishing.is_some()
    }
}

impl<B: Body> From<Bytes> for LockedBody<B> {
    /// A body the layer made (a problem document, a replayed response).
    fn from(bytes: Bytes) -> Self {
        Self {
            kind: Kind::Made { bytes: Some(bytes) },
            held: None,
            finishing: None,
            last: None,
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
            return Poll::Ready(this.last.take().flatten());
        }
        let mut body = match this.kind.project() {
            KindProj::Made { bytes } => {
                return Poll::Ready(bytes.take().map(|b| Ok(Frame::data(B::Data::from(b)))))
            }
            KindProj::Inner { body } => body,
        };
        let mut frame = ready!(body.as_mut().poll_frame(cx));
        let Some(held) = this.held.as_mut() else {
            return Poll::Ready(frame);
        };
        if let Some(recording) = held.recording() {
            frame = frame.map(|frame| frame.map(|frame| frame.map_data(|d| recording.record(d))));
        }
        let completed = match &frame {
            None => true,
            Some(Err(_)) => false,
            Some(Ok(frame)) if frame.is_trailers() || body.is_end_stream() => true,
            Some(Ok(_)) => return Poll::Ready(frame),
        };
        let finishing = this.held.take().and_then(|held| held.finish(completed));
        match finishing {
            Some(mut finishing) => match Pin::new(&mut finishing).poll(cx) {
                Poll::Ready(()) => Poll::Ready(frame),
                Poll::Pending => {
                    *this.finishing = Some(finishing);
                    *this.last = Some(frame);
                    Poll::Pending
                }
            },
            None => Poll::Ready(frame),
        }
    }

    fn is_end_stream(&self) -> bool {
        if self.holds_lock() {
            return false;
        }
        match &self.kind {
            Kind::Inner { body } => body.is_end_stream(),
            Kind::Made { bytes } => bytes.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Inner { body } => body.size_hint(),
            Kind::Made { bytes } => {
                SizeHint::with_exact(bytes.as_ref().map_or(0, |b| b.len() as u64))
            }
        }
    }
}

impl<B: Body> fmt::Debug for LockedBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match &self.kind {
            Kind::Inner { .. } => "inner",
            Kind::Made { .. } => "made",
        };
        f.debug_struct("LockedBody")
            .field("kind", &kind)
            .field("holds_lock", &self.holds_lock())
            .finish()
    }
}
