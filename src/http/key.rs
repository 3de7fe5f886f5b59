//! Where a request's lock key comes from: [`KeySource`] and the built-in sources (header,
//! path, axum path parameter, JSON body field, closure).
//!
//! A source only finds the raw key; [`KeyedService`](super::KeyedService) then applies the
//! scope and namespace and validates the result (length, control characters).

use std::future::{ready, Future, Ready};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use bytes::Bytes;
use http::request::Parts;
use http::{HeaderName, Request, StatusCode};
use http_body::Body;
use http_body_util::Full;
use pin_project_lite::pin_project;

use super::buffer::{BoxError, ReadBody};
use super::rejection::Rejection;
use super::remember::fingerprint::RequestFingerprint;

/// What a [`KeySource`] found: the request (possibly with a rebuilt body) and its key,
/// `None` if the request carries none. A source makes one with [`Extracted::new`].
#[derive(Debug)]
pub struct Extracted<B> {
    /// The request, to hand on to the inner service.
    pub request: Request<B>,
    /// The raw key, before scope and namespace.
    pub key: Option<String>,
    /// The request's fingerprint when the layer remembers responses (set by
    /// [`Remember`](super::Remember)): it goes with the key to the response side.
    pub(crate) fingerprint: Option<RequestFingerprint>,
}

impl<B> Extracted<B> {
    /// The request and its raw key (`None` if it carries none).
    ///
    /// ```
    /// use lockwarden::http::Extracted;
    ///
    /// let extracted = Extracted::new(axum::http::Request::new(()), Some("order:42".to_owned()));
    /// assert_eq!(extracted.key.as_deref(), Some("order:42"));
    /// ```
    pub fn new(request: Request<B>, key: Option<String>) -> Self {
        Self {
            request,
            key,
            fingerprint: None,
        }
    }

    /// The same, carrying the fingerprint of the request.
    pub(crate) fn fingerprinted(self, fingerprint: RequestFingerprint) -> Self {
        Self {
            fingerprint: Some(fingerprint),
            ..self
        }
    }
}

/// Finds the lock key of a request.
///
/// Implemented by every [`PartsKey`] (header, path, closure: synchronous, the body is
/// untouched) and by [`FromJsonField`] (reads the body, hands on a [`Full`] copy).
///
/// ```
/// use lockwarden::http::{KeySource, FromHeader};
/// use std::future::Future;
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let source = FromHeader::new("idempotency-key");
/// let request = axum::http::Request::builder().header("idempotency-key", "abc").body(()).unwrap();
/// let extracted = KeySource::<()>::extract(&source, request).await.unwrap();
/// assert_eq!(extracted.key.as_deref(), Some("abc"));
/// # }
/// ```
#[diagnostic::on_unimplemented(
    message = "`{Self}` is no key source for requests with a `{B}` body",
    note = "a `LimitLayer` or `RateLimitLayer` picks its key after its policy: add `.by_header(..)`, `.by_path()`, `.by_path_param(..)`, `.by_json_field(..)`, `.by(..)` or `.global(..)`"
)]
pub trait KeySource<B>: Clone {
    /// The body type of the request handed to the inner service.
    type RequestBody;
    /// What [`extract`](Self::extract) returns.
    type Future: Future<Output = Result<Extracted<Self::RequestBody>, Rejection>>;

    /// Finds the key. An `Err` answers the request at once (e.g. the body is too large);
    /// a missing key is `Ok` with `key: None` and handled as configured by
    /// [`LockLayer::on_missing_key`](super::LockLayer::on_missing_key).
    fn extract(&self, request: Request<B>) -> Self::Future;

    /// The answer to a request without a key (unless it is let through).
    fn missing(&self) -> Rejection;

    /// How much of the body this source reads, if it reads it (a remembering layer reads
    /// as much to fingerprint the request; see [`LockLayer::remember`](super::LockLayer::remember)).
    fn body_limit(&self) -> Option<usize> {
        None
    }

    /// Makes this source read at most `limit` bytes of body, if it reads the body (a
    /// longer one is answered `413`); a source that reads none ignores it. A source that
    /// wraps another passes it on, so a layer has one body limit.
    fn set_body_limit(&mut self, limit: usize) {
        let _ = limit;
    }
}

/// A key source that needs only the request head (method, URI, headers, extensions).
///
/// ```
/// use axum::http::request::Parts;
/// use lockwarden::{LockLayer, Rejection, http::PartsKey};
///
/// /// The tenant id from a header, lower-cased.
/// #[derive(Clone)]
/// struct Tenant;
///
/// impl PartsKey for Tenant {
///     fn key(&self, parts: &mut Parts) -> Result<Option<String>, Rejection> {
///         Ok(parts.headers.get("x-tenant").and_then(|v| v.to_str().ok()).map(str::to_lowercase))
///     }
///     fn missing(&self) -> Rejection {
///         Rejection::MissingKey { status: axum::http::StatusCode::BAD_REQUEST, detail: "no x-tenant".into() }
///     }
/// }
///
/// let layer = LockLayer::new(Tenant);
/// # let _ = layer;
/// ```
#[diagnostic::on_unimplemented(
    message = "`{Self}` is no key source",
    note = "a `LimitLayer` or `RateLimitLayer` picks its key after its policy: add `.by_header(..)`, `.by_path()`, `.by_path_param(..)`, `.by_json_field(..)`, `.by(..)` or `.global(..)`"
)]
pub trait PartsKey: Clone {
    /// The key, `Ok(None)` if the request has none, `Err` if it has an unusable one.
    ///
    /// # Errors
    /// A rejection to answer with, e.g. [`Rejection::InvalidKey`].
    fn key(&self, parts: &mut Parts) -> Result<Option<String>, Rejection>;

    /// The answer to a request without a key.
    fn missing(&self) -> Rejection;
}

impl<B, K: PartsKey> KeySource<B> for K {
    type RequestBody = B;
    type Future = Ready<Result<Extracted<B>, Rejection>>;

    fn extract(&self, request: Request<B>) -> Self::Future {
        let (mut parts, body) = request.into_parts();
        ready(
            self.key(&mut parts)
                .map(|key| Extracted::new(Request::from_parts(parts, body), key)),
        )
    }

    fn missing(&self) -> Rejection {
        PartsKey::missing(self)
    }
}

fn missing(detail: String) -> Rejection {
    Rejection::MissingKey {
        status: StatusCode::BAD_REQUEST,
        detail,
    }
}

/// Refuses an empty key: with the namespace in front it would still make a valid lock
/// name, one lock shared by every request that sends an empty value.
fn non_empty(key: String, what: impl FnOnce() -> String) -> Result<String, Rejection> {
    if key.is_empty() {
        return Err(Rejection::InvalidKey {
            detail: format!("{} is empty.", what()),
        });
    }
    Ok(key)
}

/// The key is the value of a request header (made by [`LockLayer::by_header`](super::LockLayer::by_header)).
///
/// An empty value, a value that is not UTF-8, or the header sent more than once (which
/// value would the handler use?) is answered 400 `invalid-key`.
///
/// ```
/// # use lockwarden::http::{FromHeader, PartsKey};
/// let source = FromHeader::new("Idempotency-Key");
/// let (mut parts, ()) = axum::http::Request::builder().header("idempotency-key", "k1").body(()).unwrap().into_parts();
/// assert_eq!(source.key(&mut parts).unwrap().as_deref(), Some("k1"));
/// ```
#[derive(Debug, Clone)]
pub struct FromHeader {
    name: HeaderName,
}

impl FromHeader {
    /// The header `name` (case-insensitive).
    ///
    /// # Panics
    /// If `name` is not a valid header name.
    pub fn new<N>(name: N) -> Self
    where
        N: TryInto<HeaderName>,
        N::Error: std::fmt::Debug,
    {
        match name.try_into() {
            Ok(name) => Self { name },
            Err(e) => panic!("by_header: invalid header name: {e:?}"),
        }
    }
}

impl PartsKey for FromHeader {
    fn key(&self, parts: &mut Parts) -> Result<Option<String>, Rejection> {
        let mut values = parts.headers.get_all(&self.name).iter();
        let Some(value) = values.next() else {
            return Ok(None);
        };
        if values.next().is_some() {
            return Err(Rejection::InvalidKey {
                detail: format!("The `{}` header is sent more than once.", self.name),
            });
        }
        match std::str::from_utf8(value.as_bytes()) {
            Ok(value) => {
                non_empty(value.to_owned(), || format!("The `{}` header", self.name)).map(Some)
            }
            Err(_) => Err(Rejection::InvalidKey {
                detail: format!("The `{}` header is not valid UTF-8.", self.name),
            }),
        }
    }

    fn missing(&self) -> Rejection {
        missing(format!("The request has no `{}` header.", self.name))
    }
}

/// The key is the same for every request (made by
/// [`LimitLayer::global`](super::LimitLayer::global)): one limit for all of them.
///
/// ```
/// # use lockwarden::http::{Global, PartsKey};
/// let (mut parts, ()) = axum::http::Request::get("/reports").body(()).unwrap().into_parts();
/// assert_eq!(Global::new("reports").key(&mut parts).unwrap().as_deref(), Some("reports"));
/// ```
#[derive(Debug, Clone)]
pub struct Global {
    name: Arc<str>,
}

impl Global {
    /// The key `name` for every request.
    pub fn new(name: impl Into<Arc<str>>) -> Self {
        Self { name: name.into() }
    }
}

impl PartsKey for Global {
    fn key(&self, _parts: &mut Parts) -> Result<Option<String>, Rejection> {
        Ok(Some(self.name.to_string()))
    }

    fn missing(&self) -> Rejection {
        missing("The request has no key.".to_owned())
    }
}

/// The key is the request path, without the query (made by [`LockLayer::by_path`](super::LockLayer::by_path)).
///
/// ```
/// # use lockwarden::http::{FromPath, PartsKey};
/// let (mut parts, ()) = axum::http::Request::get("/orders/42?x=1").body(()).unwrap().into_parts();
/// assert_eq!(FromPath.key(&mut parts).unwrap().as_deref(), Some("/orders/42"));
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct FromPath;

impl PartsKey for FromPath {
    fn key(&self, parts: &mut Parts) -> Result<Option<String>, Rejection> {
        Ok(Some(parts.uri.path().to_owned()))
    }

    fn missing(&self) -> Rejection {
        missing("The request has no path.".to_owned())
    }
}

/// The key is a path parameter matched by axum's router (made by
/// [`LockLayer::by_path_param`](super::LockLayer::by_path_param); add the layer with
/// `Router::route_layer` so the route has been matched when it runs).
///
/// ```
/// use axum::{routing::post, Router};
/// use lockwarden::LockLayer;
///
/// let app: Router = Router::new()
///     .route("/orders/{id}/ship", post(|| async { "shipped" }))
///     .route_layer(LockLayer::by_path_param("id"));
/// ```
#[cfg(feature = "axum")]
#[cfg_attr(docsrs, doc(cfg(feature = "axum")))]
#[derive(Debug, Clone)]
pub struct FromPathParam {
    name: Arc<str>,
}

#[cfg(feature = "axum")]
impl FromPathParam {
    /// The parameter `name` (as in `/orders/{name}`).
    pub fn new(name: impl Into<Arc<str>>) -> Self {
        Self { name: name.into() }
    }
}

#[cfg(feature = "axum")]
impl PartsKey for FromPathParam {
    fn key(&self, parts: &mut Parts) -> Result<Option<String>, Rejection> {
        use axum::extract::{FromRequestParts, RawPathParams};
        // Reading the matched parameters never waits: one poll completes it.
        let future = std::pin::pin!(RawPathParams::from_request_parts(parts, &()));
        let mut cx = Context::from_waker(std::task::Waker::noop());
        match future.poll(&mut cx) {
            Poll::Ready(Ok(params)) => Ok(params
                .iter()
                .find(|(name, _)| *name == &*self.name)
                .map(|(_, value)| value.to_owned())),
            Poll::Ready(Err(
                axum::extract::rejection::RawPathParamsRejection::InvalidUtf8InPathParam(_),
            )) => Err(Rejection::InvalidKey {
                detail: format!("The path parameter `{}` is not valid UTF-8.", self.name),
            }),
            Poll::Ready(Err(_)) | Poll::Pending => {
                tracing::warn!(
                    param = %self.name,
                    "no matched path parameters: add LockLayer::by_path_param with Router::route_layer"
                );
                Ok(None)
            }
        }
    }

    fn missing(&self) -> Rejection {
        missing(format!(
            "The request has no `{}` path parameter.",
            self.name
        ))
    }
}

/// The key is computed by a closure from the request head (made by [`LockLayer::by`](super::LockLayer::by)).
///
/// ```
/// # use lockwarden::http::{FromFn, PartsKey};
/// let source = FromFn::new(|parts: &axum::http::request::Parts| {
///     Some(format!("{} {}", parts.method, parts.uri.path()))
/// });
/// let (mut parts, ()) = axum::http::Request::post("/a").body(()).unwrap().into_parts();
/// assert_eq!(source.key(&mut parts).unwrap().as_deref(), Some("POST /a"));
/// ```
#[derive(Clone)]
pub struct FromFn<F> {
    f: F,
}

impl<F> FromFn<F>
where
    F: Fn(&Parts) -> Option<String> + Clone,
{
    /// Keys by `f`; `None` means the request has no key, an empty key is answered 400.
    pub fn new(f: F) -> Self {
        Self { f }
    }
}

impl<F> std::fmt::Debug for FromFn<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FromFn").finish_non_exhaustive()
    }
}

impl<F> PartsKey for FromFn<F>
where
    F: Fn(&Parts) -> Option<String> + Clone,
{
    fn key(&self, parts: &mut Parts) -> Result<Option<String>, Rejection> {
        (self.f)(parts)
            .map(|key| non_empty(key, || "The lock key".to_owned()))
            .transpose()
    }

    fn missing(&self) -> Rejection {
        missing("The request has no lock key.".to_owned())
    }
}

/// The key is a field of the JSON request body, found by a JSON Pointer (RFC 6901, e.g.
/// `/data/object/id`); made by [`LockLayer::by_json_field`](super::LockLayer::by_json_field).
///
/// The body is read into memory up to a limit and handed on to the inner service
/// unchanged, as a [`Full`] body (so the inner service must accept `Request<Full<Bytes>>`,
/// as axum routers and generic `Request<B>` services do). A string field is the key as is,
/// a number field its decimal text.
///
/// | request | answer |
/// |---|---|
/// | `Content-Length` or body over the limit | 413 |
/// | body unreadable or not JSON | 400 |
/// | field absent or `null` | missing key: 422 (or let through, see [`LockLayer::on_missing_key`](super::LockLayer::on_missing_key)) |
/// | field is a bool, array or object | 422 |
/// | field is an empty string | 400 |
///
/// ```
/// # use lockwarden::http::{FromJsonField, KeySource};
/// use axum::body::Body;
/// use axum::http::Request;
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let source = FromJsonField::new("/data/id", 1024);
/// let body = Body::from(r#"{"data":{"id":"evt_1"}}"#);
/// let extracted = source.extract(Request::new(body)).await.unwrap();
/// assert_eq!(extracted.key.as_deref(), Some("evt_1"));
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct FromJsonField {
    pointer: Arc<str>,
    limit: usize,
}

impl FromJsonField {
    /// The field at `pointer`, reading at most `limit` bytes of body.
    ///
    /// # Panics
    /// If `pointer` is neither empty nor starts with `/` (then it could never match).
    pub fn new(pointer: impl Into<Arc<str>>, limit: usize) -> Self {
        let pointer = pointer.into();
        assert!(
            pointer.is_empty() || pointer.starts_with('/'),
            "by_json_field: `{pointer}` is not a JSON Pointer (it must start with `/`, e.g. `/data/id`)"
        );
        Self { pointer, limit }
    }

    fn key_of(&self, bytes: &[u8]) -> Result<Option<String>, Rejection> {
        let value: serde_json::Value =
            serde_json::from_slice(bytes).map_err(|e| Rejection::InvalidBody {
                status: StatusCode::BAD_REQUEST,
                detail: format!("The request body is not valid JSON: {e}."),
            })?;
        match value.pointer(&self.pointer) {
            None | Some(serde_json::Value::Null) => Ok(None),
            Some(serde_json::Value::String(s)) => {
                non_empty(s.clone(), || format!("The JSON field `{}`", self.pointer)).map(Some)
            }
            Some(serde_json::Value::Number(n)) => Ok(Some(n.to_string())),
            Some(_) => Err(Rejection::InvalidBody {
                status: StatusCode::UNPROCESSABLE_ENTITY,
                detail: format!(
                    "The JSON field `{}` must be a string or a number.",
                    self.pointer
                ),
            }),
        }
    }
}

impl<B> KeySource<B> for FromJsonField
where
    B: Body,
    B::Error: Into<BoxError>,
{
    type RequestBody = Full<Bytes>;
    type Future = JsonKeyFuture<B>;

    fn extract(&self, request: Request<B>) -> Self::Future {
        JsonKeyFuture {
            read: ReadBody::new(request, self.limit),
            source: self.clone(),
        }
    }

    fn missing(&self) -> Rejection {
        Rejection::MissingKey {
            status: StatusCode::UNPROCESSABLE_ENTITY,
            detail: format!("The JSON body has no field `{}`.", self.pointer),
        }
    }

    fn body_limit(&self) -> Option<usize> {
        Some(self.limit)
    }

    fn set_body_limit(&mut self, limit: usize) {
        self.limit = limit;
    }
}

pin_project! {
    /// The future of [`FromJsonField`]: reads the body, finds the field, rebuilds the request.
    pub struct JsonKeyFuture<B>
    where
        B: Body,
        B::Error: Into<BoxError>,
    {
        #[pin]
        read: ReadBody<B>,
        source: FromJsonField,
    }
}

impl<B> Future for JsonKeyFuture<B>
where
    B: Body,
    B::Error: Into<BoxError>,
{
    type Output = Result<Extracted<Full<Bytes>>, Rejection>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let (parts, bytes) = match ready!(this.read.poll(cx)) {
            Ok(read) => read,
            Err(rejection) => return Poll::Ready(Err(rejection)),
        };
        Poll::Ready(
            this.source
                .key_of(&bytes)
                .map(|key| Extracted::new(Request::from_parts(parts, Full::new(bytes)), key)),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_field_kinds() {
        let source = FromJsonField::new("/a", 100);
        assert_eq!(
            source.key_of(br#"{"a":"x"}"#).unwrap().as_deref(),
            Some("x")
        );
        assert_eq!(
            source.key_of(br#"{"a":17}"#).unwrap().as_deref(),
            Some("17")
        );
        assert_eq!(source.key_of(br#"{"a":null}"#).unwrap(), None);
        assert_eq!(source.key_of(br#"{"b":1}"#).unwrap(), None);
        assert_eq!(
            source.key_of(br#"{"a":{}}"#).unwrap_err().status(),
            StatusCode::UNPROCESSABLE_ENTITY
        );
        assert_eq!(
            source.key_of(b"not json").unwrap_err().status(),
            StatusCode::BAD_REQUEST
        );
    }

    #[test]
    #[should_panic(expected = "not a JSON Pointer")]
    fn json_pointer_must_start_with_a_slash() {
        let _ = FromJsonField::new("data.id", 10);
    }

    #[test]
    fn empty_and_repeated_keys_are_invalid() {
        let source = FromHeader::new("k");
        let parts = |values: &[&str]| {
            let mut builder = Request::builder();
            for value in values {
                builder = builder.header("k", *value);
            }
            builder.body(()).unwrap().into_parts().0
        };
        for values in [&[""][..], &["a", "b"], &["a", "a"]] {
            assert!(
                matches!(
                    source.key(&mut parts(values)),
                    Err(Rejection::InvalidKey { .. })
                ),
                "{values:?}"
            );
        }
        assert_eq!(
            source.key(&mut parts(&["a"])).unwrap().as_deref(),
            Some("a")
        );
        let json = FromJsonField::new("/a", 100);
        assert_eq!(
            json.key_of(br#"{"a":""}"#).unwrap_err().status(),
            StatusCode::BAD_REQUEST
        );
        let by = FromFn::new(|_: &Parts| Some(String::new()));
        assert!(by.key(&mut parts(&[])).is_err());
    }

    #[test]
    fn header_must_be_utf8() {
        let source = FromHeader::new("k");
        let value = http::HeaderValue::from_bytes(b"\xff\xfe").unwrap();
        let (mut parts, ()) = Request::builder()
            .header("k", value)
            .body(())
            .unwrap()
            .into_parts();
        assert!(matches!(
            source.key(&mut parts),
            Err(Rejection::InvalidKey { .. })
        ));
    }
}
