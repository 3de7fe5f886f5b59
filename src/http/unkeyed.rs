//! A layer that starts with its policy and picks its key next (a [`LimitLayer`] starts
//! with its capacity, a [`RateLimitLayer`] with its limiter): [`Unkeyed`], the key of
//! such a layer before one is picked, and the methods that pick it. An unkeyed layer
//! wraps no service: its key source is missing.
//!
//! [`LimitLayer`]: super::LimitLayer
//! [`RateLimitLayer`]: super::RateLimitLayer

use http::request::Parts;

use super::config::DEFAULT_BODY_LIMIT;
use super::key::{FromFn, FromHeader, FromJsonField, FromPath, Global};
use super::layer::KeyedLayer;

/// The key of a layer that has none yet: a [`LimitLayer`](super::LimitLayer) or
/// [`RateLimitLayer`](super::RateLimitLayer) before `.by_header(..)`, `.by_path()`,
/// `.by_path_param(..)`, `.by_json_field(..)`, `.by(..)`, `.global(..)` or
/// `.key_source(..)`. It is no [`KeySource`](super::KeySource): such a layer wraps no
/// service, and an app that tries does not compile.
///
/// ```compile_fail
/// use axum::{routing::post, Router};
/// use lockwarden::LimitLayer;
///
/// // No key: which requests would share the 5 permits?
/// let app: Router = Router::new()
///     .route("/exports", post(|| async { "exported" }))
///     .layer(LimitLayer::permits(5));
/// ```
#[derive(Clone, Copy, Debug, Default)]
pub struct Unkeyed;

/// The policies whose layers start with the policy and pick their key next.
pub trait KeyedLater: super::admission::sealed::Policy {}

impl<P: KeyedLater> KeyedLayer<P, Unkeyed> {
    /// Keys requests by the value of header `name` (e.g. `X-Tenant`, or an API key).
    ///
    /// ```
    /// use lockwarden::LimitLayer;
    /// let layer = LimitLayer::permits(5).by_header("X-Tenant");
    /// # let _ = layer;
    /// ```
    ///
    /// # Panics
    /// If `name` is not a valid header name.
    pub fn by_header<N>(self, name: N) -> KeyedLayer<P, FromHeader>
    where
        N: TryInto<http::HeaderName>,
        N::Error: std::fmt::Debug,
    {
        self.keyed_by(FromHeader::new(name))
    }

    /// Keys requests by their path (without the query string).
    ///
    /// ```
    /// use lockwarden::LimitLayer;
    /// let layer = LimitLayer::permits(2).by_path();
    /// # let _ = layer;
    /// ```
    pub fn by_path(self) -> KeyedLayer<P, FromPath> {
        self.keyed_by(FromPath)
    }

    /// Keys requests by the axum path parameter `name`. Add it with
    /// `Router::route_layer` (the parameters are known only once a route has matched).
    ///
    /// ```
    /// use axum::{routing::post, Router};
    /// use lockwarden::LimitLayer;
    ///
    /// let app: Router = Router::new()
    ///     .route("/accounts/{id}/export", post(|| async { "exported" }))
    ///     .route_layer(LimitLayer::permits(1).by_path_param("id"));
    /// ```
    #[cfg(feature = "axum")]
    #[cfg_attr(docsrs, doc(cfg(feature = "axum")))]
    pub fn by_path_param(self, name: &str) -> KeyedLayer<P, super::key::FromPathParam> {
        self.keyed_by(super::key::FromPathParam::new(name))
    }

    /// Keys requests by a field of their JSON body, named by a JSON Pointer such as
    /// `/account/id`. The body is read up to
    /// [`DEFAULT_BODY_LIMIT`](super::DEFAULT_BODY_LIMIT) (see
    /// [`body_limit`](KeyedLayer::body_limit)) and handed on unchanged as a
    /// `http_body_util::Full<Bytes>`. See [`FromJsonField`](super::FromJsonField) for the
    /// answers to bad bodies.
    ///
    /// ```
    /// use lockwarden::LimitLayer;
    /// let layer = LimitLayer::permits(3).by_json_field("/account/id");
    /// # let _ = layer;
    /// ```
    ///
    /// # Panics
    /// If `pointer` is not empty and does not start with `/`.
    pub fn by_json_field(self, pointer: &str) -> KeyedLayer<P, FromJsonField> {
        self.keyed_by(FromJsonField::new(pointer, DEFAULT_BODY_LIMIT))
    }

    /// Keys requests by a closure over the request head; `None` means "no key".
    ///
    /// ```
    /// use lockwarden::LimitLayer;
    /// let layer = LimitLayer::permits(5).by(|parts| {
    ///     let tenant = parts.headers.get("x-tenant")?.to_str().ok()?;
    ///     Some(format!("{tenant}:{}", parts.method))
    /// });
    /// # let _ = layer;
    /// ```
    pub fn by<F>(self, f: F) -> KeyedLayer<P, FromFn<F>>
    where
        F: Fn(&Parts) -> Option<String> + Clone,
    {
        self.keyed_by(FromFn::new(f))
    }

    /// One key for every request, whatever they carry: a limit for the whole service,
    /// across every replica. `name` names it (give each global limit its own).
    ///
    /// ```
    /// use lockwarden::LimitLayer;
    /// // At most 4 report renderings at once, service-wide.
    /// let layer = LimitLayer::permits(4).global("report-rendering");
    /// # let _ = layer;
    /// ```
    pub fn global(self, name: &str) -> KeyedLayer<P, Global> {
        self.keyed_by(Global::new(name))
    }

    /// Keys requests by any key source (see [`KeySource`](super::KeySource) and
    /// [`PartsKey`](super::PartsKey)).
    ///
    /// ```
    /// use lockwarden::{LimitLayer, http::FromPath};
    /// let layer = LimitLayer::permits(5).key_source(FromPath);
    /// # let _ = layer;
    /// ```
    pub fn key_source<K>(self, source: K) -> KeyedLayer<P, K> {
        self.keyed_by(source)
    }
}
