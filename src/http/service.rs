//! [`LockService`]: the middleware a [`LockLayer`](super::LockLayer) wraps around a service.

use std::fmt;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Request, Response};
use http_body::Body;
use tower_service::Service;

use super::body::LockedBody;
use super::config::Config;
use super::future::ResponseFuture;
use super::key::KeySource;
use super::metrics::Route;
use super::rejection::LockRejection;

/// Holds a lock around each call of the inner service; made by
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
pub struct LockService<S, K> {
    inner: S,
    source: K,
    config: Arc<Config>,
    missing: Missing,
}

/// The answer to a request without a key, made on first use and shared by the services
/// of one layer (and their clones).
pub(crate) type Missing = Arc<OnceLock<Arc<LockRejection>>>;

impl<S, K> LockService<S, K> {
    pub(crate) fn from_parts(inner: S, source: K, config: Arc<Config>, missing: Missing) -> Self {
        Self {
            inner,
            source,
            config,
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

impl<S: Clone, K: Clone> Clone for LockService<S, K> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            source: self.source.clone(),
            config: self.config.clone(),
            missing: self.missing.clone(),
        }
    }
}

impl<S: fmt::Debug, K: fmt::Debug> fmt::Debug for LockService<S, K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockService")
            .field("inner", &self.inner)
            .field("source", &self.source)
            .field("config", &self.config)
            .finish()
    }
}

impl<S, K, B, ResBody> Service<Request<B>> for LockService<S, K>
where
    K: KeySource<B>,
    S: Service<Request<K::RequestBody>, Response = Response<ResBody>> + Clone,
    ResBody: Body,
    ResBody::Data: From<Bytes>,
{
    type Response = Response<LockedBody<ResBody>>;
    type Error = S::Error;
    type Future = ResponseFuture<K::Future, S, K::RequestBody>;

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
            self.config.clone(),
            route,
        )
    }
}
