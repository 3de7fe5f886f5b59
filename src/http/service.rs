//! [`KeyedService`]: the middleware a [`KeyedLayer`](super::KeyedLayer) wraps around a
//! service, for every policy.

use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Request, Response};
use http_body::Body;
use tower_service::Service;

use super::admission::Admission;
use super::body::HeldBody;
use super::config::{Missing, Shared};
use super::future::ResponseFuture;
use super::key::KeySource;
use super::metrics::Route;

/// Admits each call of the inner service under the layer's policy `P` (a lock, a permit, a
/// rate decision); made by a [`KeyedLayer`](super::KeyedLayer) such as
/// [`LockLayer`](super::LockLayer). Works with any `http` service whose response body
/// yields data that can be made from [`Bytes`] (the problem bodies).
///
/// ```
/// use axum::body::Body;
/// use axum::http::{Request, Response, StatusCode};
/// use lockwarden::{LockClient, LockLayer};
/// use tower::{service_fn, ServiceExt, Layer};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let locks = LockClient::in_memory();
/// let service = LockLayer::by_path().client(locks.clone()).layer(service_fn(
///     |_req: Request<Body>| async {
///         Ok::<_, std::convert::Infallible>(Response::new(Body::from("done")))
///     },
/// ));
///
/// let _busy = locks.acquire("http:/jobs/7").await.unwrap(); // someone holds the path's lock
/// let response = service.oneshot(Request::post("/jobs/7").body(Body::empty()).unwrap()).await.unwrap();
/// assert_eq!(response.status(), StatusCode::CONFLICT);
/// assert!(response.headers().contains_key("retry-after"));
/// # }
/// ```
pub struct KeyedService<S, K, P> {
    inner: S,
    source: K,
    shared: Arc<Shared<P>>,
    missing: Missing,
}

impl<S, K, P> KeyedService<S, K, P> {
    pub(crate) fn from_parts(
        inner: S,
        source: K,
        shared: Arc<Shared<P>>,
        missing: Missing,
    ) -> Self {
        Self {
            inner,
            source,
            shared,
            missing,
        }
    }

    /// The wrapped service.
    ///
    /// ```
    /// # use lockwarden::LockLayer;
    /// # use tower::Layer;
    /// let service = LockLayer::by_path().layer(tower::service_fn(|()| async { Ok::<_, ()>(()) }));
    /// let _inner = service.get_ref();
    /// ```
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The wrapped service, mutably.
    ///
    /// ```
    /// # use lockwarden::LockLayer;
    /// # use tower::Layer;
    /// let mut service = LockLayer::by_path().layer(tower::service_fn(|()| async { Ok::<_, ()>(()) }));
    /// let _inner = service.get_mut();
    /// ```
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// Unwraps the inner service.
    ///
    /// ```
    /// # use lockwarden::LockLayer;
    /// # use tower::Layer;
    /// let service = LockLayer::by_path().layer(tower::service_fn(|()| async { Ok::<_, ()>(()) }));
    /// let _inner = service.into_inner();
    /// ```
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S: Clone, K: Clone, P> Clone for KeyedService<S, K, P> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            source: self.source.clone(),
            shared: self.shared.clone(),
            missing: self.missing.clone(),
        }
    }
}

impl<S: fmt::Debug, K: fmt::Debug, P: fmt::Debug> fmt::Debug for KeyedService<S, K, P> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyedService")
            .field("inner", &self.inner)
            .field("source", &self.source)
            .field("settings", &self.shared.settings)
            .field("policy", &self.shared.policy)
            .finish()
    }
}

impl<S, K, P, B, ResBody> Service<Request<B>> for KeyedService<S, K, P>
where
    K: KeySource<B>,
    P: Admission,
    S: Service<Request<K::RequestBody>, Response = Response<ResBody>> + Clone,
    ResBody: Body,
    ResBody::Data: From<Bytes>,
{
    type Response = Response<HeldBody<ResBody>>;
    type Error = S::Error;
    type Future = ResponseFuture<K::Future, S, K::RequestBody, P>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        // The ready service goes into the future; a clone stays for the next call.
        let clone = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, clone);
        let missing = self
            .missing
            .get_or_init(|| Arc::new(self.source.missing()))
            .clone();
        let route = Route::of(&request);
        ResponseFuture::new(
            self.source.extract(request),
            missing,
            inner,
            self.shared.clone(),
            route,
        )
    }
}
