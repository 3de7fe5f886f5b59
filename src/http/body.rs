//! [`HeldBody`]: the response body that owns what the request holds (a lock, a permit)
//! and gives it back when the body ends (last frame, trailers, error, `is_end_stream()`),
//! panics, or is dropped.

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
    /// The response body of [`KeyedService`](super::KeyedService): the inner service's
    /// body, holding the request's lock or permit until its last frame (a rate-limited
    /// request holds nothing), or a body the layer made itself (a problem document, a
    /// replayed response).
    ///
    /// The lock or permit is given back as soon as the body reports its end: a `None` frame, a trailers
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
    /// use lockwarden::HeldBody;
    ///
    /// // Problem bodies are made by the layer; an unlocked body just wraps another one.
    /// let body = HeldBody::new(Body::from("hi"));
    /// assert_eq!(body.size_hint().exact(), Some(2));
    /// ```
    pub struct HeldBody<B: Body> {
        #[pin]
        kind: Kind<B>,
        // Boxed: a response is moved several times on its way to the connection, and most
        // bodies hold nothing (a rate decision's, a problem's), so they stay the size of
        // their inner body (a lock's hold is ~500 bytes).
        carried: Option<Box<Carried<B>>>,
    }
}

/// What a body made by [`HeldBody::read_ahead`] carries besides its inner body.
struct Carried<B: Body> {
    phase: Phase,
    // A frame read before it could be handed on (ahead of the response, or before a
    // release), handed on next.
    ahead: Option<Polled<B>>,
}

/// What polling a body for a frame gives.
type Polled<B> = Option<Result<Frame<<B as Body>::Data>, <B as Body>::Error>>;

/// What the body holds, or is giving back.
// Boxed as a whole with the frame read ahead (`Carried`), so no variant needs a box of its own.
#[allow(clippy::large_enum_variant)]
enum Phase {
    /// The request's lock or permit, until the body ends.
    Holding(Held),
    /// The release after the last frame (which waits in `ahead`), in progress.
    Releasing(Release),
    /// The inner body panicked: the release, then the panic goes on.
    Unwinding(Release, SyncWrapper<Box<dyn Any + Send>>),
    /// Nothing held, or given back.
    Free,
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

impl<B: Body> HeldBody<B> {
    /// Wraps `body`, holding nothing.
    pub fn new(body: B) -> Self {
        Self {
            kind: Kind::Inner { body },
            carried: None,
        }
    }

    /// Whether the body still holds its request's lock or permit.
    ///
    /// ```
    /// # use lockwarden::HeldBody;
    /// assert!(!HeldBody::new(axum::body::Body::empty()).is_holding());
    /// ```
    pub fn is_holding(&self) -> bool {
        self.carried
            .as_ref()
            .is_some_and(|carried| !matches!(carried.phase, Phase::Free))
    }

    /// Whether a frame read ahead is still to be handed on.
    fn has_ahead(&self) -> bool {
        self.carried
            .as_ref()
            .is_some_and(|carried| carried.ahead.is_some())
    }
}

impl<B> HeldBody<B>
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
        let mut phase = Phase::Holding(held);
        let mut body = Box::pin(body);
        let (ahead, release) = match body.as_mut().poll_frame(cx) {
            Poll::Pending => (None, None),
            Poll::Ready(mut frame) => {
                let release = on_frame(&mut phase, &mut frame, body.is_end_stream());
                (Some(frame), release)
            }
        };
        let body = Self {
            kind: Kind::Boxed { body },
            carried: Some(Box::new(Carried { phase, ahead })),
        };
        (body, release)
    }
}

/// Records `frame` of a holding body (when remembering) and, if it is the body's last,
/// ends the hold (`phase` is then free) and starts the release; `None` when the frame can
/// be handed on at once.
fn on_frame<D, E>(
    phase: &mut Phase,
    frame: &mut Option<Result<Frame<D>, E>>,
    at_end: bool,
) -> Option<Release>
where
    D: Buf + From<Bytes>,
{
    let Phase::Holding(held) = phase else {
        return None;
    };
    if let Some(recording) = held.recording() {
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
    match std::mem::replace(phase, Phase::Free) {
        Phase::Holding(held) => held.finish(completed),
        other => {
            *phase = other;
            None
        }
    }
}

impl<B: Body> From<Bytes> for HeldBody<B> {
    /// A body the layer made (a problem document, a replayed response).
    fn from(bytes: Bytes) -> Self {
        Self {
            kind: Kind::Made { bytes: Some(bytes) },
            carried: None,
        }
    }
}

impl<B> Body for HeldBody<B>
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
        if let Some(carried) = this.carried.as_deref_mut() {
            match &mut carried.phase {
                Phase::Releasing(release) | Phase::Unwinding(release, _) => {
                    // A failed release was logged by itself; the frame (or the panic) goes
                    // on regardless.
                    ready!(Pin::new(release).poll(cx));
                    if let Phase::Unwinding(_, panic) =
                        std::mem::replace(&mut carried.phase, Phase::Free)
                    {
                        panic::resume_unwind(panic.into_inner());
                    }
                }
                Phase::Holding(_) | Phase::Free => {}
            }
            if let Some(frame) = carried.ahead.take() {
                return Poll::Ready(frame);
            }
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
                let Some(carried) = this.carried.as_deref_mut() else {
                    panic::resume_unwind(panic)
                };
                let Phase::Holding(held) = std::mem::replace(&mut carried.phase, Phase::Free)
                else {
                    panic::resume_unwind(panic)
                };
                let Some(mut release) = held.finish(false) else {
                    panic::resume_unwind(panic)
                };
                if Pin::new(&mut release).poll(cx).is_ready() {
                    panic::resume_unwind(panic);
                }
                carried.phase = Phase::Unwinding(release, SyncWrapper::new(panic));
                return Poll::Pending;
            }
        };
        let Some(carried) = this.carried.as_deref_mut() else {
            return Poll::Ready(frame);
        };
        let Some(mut release) = on_frame(&mut carried.phase, &mut frame, at_end) else {
            return Poll::Ready(frame);
        };
        match Pin::new(&mut release).poll(cx) {
            Poll::Ready(()) => Poll::Ready(frame),
            Poll::Pending => {
                carried.phase = Phase::Releasing(release);
                carried.ahead = Some(frame);
                Poll::Pending
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        if self.is_holding() || self.has_ahead() {
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
        let ahead = match self
            .carried
            .as_deref()
            .and_then(|carried| carried.ahead.as_ref())
        {
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

impl<B: Body> fmt::Debug for HeldBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match &self.kind {
            Kind::Inner { .. } | Kind::Boxed { .. } => "inner",
            Kind::Made { .. } => "made",
        };
        f.debug_struct("HeldBody")
            .field("kind", &kind)
            .field("holding", &self.is_holding())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    /// The body stays `Send + Sync` (hyper needs `Send`; `BoxBody` users need `Sync`)
    /// while it drives a release future that is only `Send`.
    #[test]
    fn held_body_is_send_and_sync() {
        fn send_sync<T: Send + Sync>() {}
        send_sync::<super::HeldBody<http_body_util::Full<bytes::Bytes>>>();
    }

    /// A body that holds nothing stays about the size of the body it wraps: responses
    /// are moved several times on their way to the connection.
    #[test]
    fn a_body_that_holds_nothing_is_small() {
        use std::mem::size_of;
        type Inner = http_body_util::Full<bytes::Bytes>;
        let wrapped = size_of::<super::HeldBody<Inner>>();
        let room = size_of::<Inner>().max(size_of::<Option<bytes::Bytes>>());
        assert!(
            wrapped <= room + 2 * size_of::<usize>(),
            "{wrapped} bytes around a body of {}",
            size_of::<Inner>()
        );
    }
}
