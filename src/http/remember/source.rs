//! [`Remember`]: the key source of a remembering layer. It reads the body, fingerprints
//! the request, finds the key with the wrapped source and hands both on in one
//! [`Extracted`], so the fingerprint travels with the key (not in the request).

use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use bytes::Bytes;
use http::Request;
use http_body::Body;
use http_body_util::Full;
use pin_project_lite::pin_project;

use super::fingerprint::{Fingerprint, RequestFingerprint};
use crate::http::buffer::{BoxError, ReadBody};
use crate::http::key::{Extracted, KeySource};
use crate::http::rejection::Rejection;

/// The key source of a layer that remembers completed requests (made by
/// [`LockLayer::remember`](crate::LockLayer::remember)): reads the body (up to the body
/// limit), fingerprints the request, then finds the key with the wrapped source.
#[derive(Clone, Debug)]
pub struct Remember<K> {
    inner: K,
    fingerprint: Fingerprint,
    limit: usize,
}

impl<K> Remember<K> {
    pub(crate) fn new(inner: K, limit: usize) -> Self {
        Self {
            inner,
            fingerprint: Fingerprint::Request,
            limit,
        }
    }

    pub(crate) fn set_fingerprint(&mut self, fingerprint: Fingerprint) {
        self.fingerprint = fingerprint;
    }
}

impl<B, K> KeySource<B> for Remember<K>
where
    B: Body,
    B::Error: Into<BoxError>,
    K: KeySource<Full<Bytes>>,
{
    type RequestBody = K::RequestBody;
    type Future = RememberFuture<B, K>;

    fn extract(&self, request: Request<B>) -> Self::Future {
        RememberFuture {
            state: RememberState::Reading {
                read: ReadBody::new(request, self.limit),
            },
            source: self.clone(),
        }
    }

    fn missing(&self) -> Rejection {
        self.inner.missing()
    }

    fn body_limit(&self) -> Option<usize> {
        Some(self.limit)
    }

    /// The remembered request's body is read here, and the wrapped source (a JSON field)
    /// reads the copy: both by this one limit.
    fn set_body_limit(&mut self, limit: usize) {
        self.limit = limit;
        KeySource::<Full<Bytes>>::set_body_limit(&mut self.inner, limit);
    }
}

pin_project! {
    /// The future of [`Remember`]: reads and fingerprints the request, then extracts the key.
    pub struct RememberFuture<B, K>
    where
        B: Body,
        B::Error: Into<BoxError>,
        K: KeySource<Full<Bytes>>,
    {
        #[pin]
        state: RememberState<B, K::Future>,
        source: Remember<K>,
    }
}

pin_project! {
    #[project = RememberStateProj]
    enum RememberState<B, F>
    where
        B: Body,
        B::Error: Into<BoxError>,
    {
        Reading { #[pin] read: ReadBody<B> },
        Extracting { #[pin] extract: F, fingerprint: RequestFingerprint },
    }
}

impl<B, K> Future for RememberFuture<B, K>
where
    B: Body,
    B::Error: Into<BoxError>,
    K: KeySource<Full<Bytes>>,
{
    type Output = Result<Extracted<K::RequestBody>, Rejection>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            let (extract, fingerprint) = match this.state.as_mut().project() {
                RememberStateProj::Extracting {
                    extract,
                    fingerprint,
                } => {
                    let extracted = ready!(extract.poll(cx));
                    return Poll::Ready(extracted.map(|e| e.fingerprinted(*fingerprint)));
                }
                RememberStateProj::Reading { read } => {
                    let (parts, body) = match ready!(read.poll(cx)) {
                        Ok(read) => read,
                        Err(rejection) => return Poll::Ready(Err(rejection)),
                    };
                    let fingerprint = match this.source.fingerprint.of(&parts, &body) {
                        Ok(fingerprint) => fingerprint,
                        Err(rejection) => return Poll::Ready(Err(rejection)),
                    };
                    let request = Request::from_parts(parts, Full::new(body));
                    (this.source.inner.extract(request), fingerprint)
                }
            };
            this.state.set(RememberState::Extracting {
                extract,
                fingerprint,
            });
        }
    }
}
