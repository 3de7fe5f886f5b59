//! Idempotent replay, request side: [`Remember`], the key source of a layer that remembers
//! completed requests, and the [`Fingerprint`] that tells a retry of a request from a
//! different request that reuses its key.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderName, Request, StatusCode};
use http_body::Body;
use http_body_util::Full;
use pin_project_lite::pin_project;
use sha2::{Digest, Sha256};

use super::buffer::{BoxError, ReadBody};
use super::key::{Extracted, KeySource};
use super::rejection::LockRejection;

/// The largest response body [`LockLayer::remember`](super::LockLayer::remember) stores
/// by default: 1 MiB. A longer response is sent but not remembered.
pub const DEFAULT_MAX_STORED_BODY: usize = 1024 * 1024;

/// What makes two requests with the same key "the same request" for
/// [`LockLayer::remember`](super::LockLayer::remember). A retry must match the stored
/// request's fingerprint to be answered from the store; otherwise it is answered `422`.
///
/// ```
/// use lockwarden::{Fingerprint, LockLayer};
/// use std::time::Duration;
///
/// // Webhook senders re-sign retries: compare the event, not the bytes.
/// let layer = LockLayer::by_header("Idempotency-Key")
///     .remember(Duration::from_secs(24 * 3600))
///     .fingerprint(Fingerprint::json_fields(["/id", "/data/amount"]));
/// # let _ = layer;
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum Fingerprint {
    /// Method, path with query, and the body bytes. The default.
    #[default]
    Request,
    /// Method, path with query, and the values at these JSON Pointers of the body (absent
    /// and `null` fields count as absent); other fields may differ between retries.
    JsonFields(Arc<[String]>),
}

impl Fingerprint {
    /// Fingerprints the values at `pointers` (e.g. `"/data/id"`) instead of the whole body.
    ///
    /// ```
    /// # use lockwarden::Fingerprint;
    /// let fingerprint = Fingerprint::json_fields(["/amount", "/currency"]);
    /// # let _ = fingerprint;
    /// ```
    ///
    /// # Panics
    /// If a pointer is neither empty nor starts with `/` (then it could never match).
    pub fn json_fields<I, S>(pointers: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let pointers: Arc<[String]> = pointers.into_iter().map(Into::into).collect();
        for pointer in pointers.iter() {
            assert!(
                pointer.is_empty() || pointer.starts_with('/'),
                "Fingerprint::json_fields: `{pointer}` is not a JSON Pointer (it must start with `/`)"
            );
        }
        Self::JsonFields(pointers)
    }

    /// SHA-256 over length-prefixed parts, so no two requests share an encoding.
    fn of(
        &self,
        parts: &http::request::Parts,
        body: &[u8],
    ) -> Result<RequestFingerprint, LockRejection> {
        let mut hash = Sha256::new();
        let mut part = |bytes: &[u8]| {
            hash.update((bytes.len() as u64).to_be_bytes());
            hash.update(bytes);
        };
        part(parts.method.as_str().as_bytes());
        part(
            parts
                .uri
                .path_and_query()
                .map_or("/", |p| p.as_str())
                .as_bytes(),
        );
        match self {
            Self::Request => part(body),
            Self::JsonFields(pointers) => {
                let value: serde_json::Value =
                    serde_json::from_slice(body).map_err(|e| LockRejection::InvalidBody {
                        status: StatusCode::BAD_REQUEST,
                        detail: format!("The request body is not valid JSON: {e}."),
                    })?;
                for pointer in pointers.iter() {
                    part(pointer.as_bytes());
                    match value.pointer(pointer) {
                        None | Some(serde_json::Value::Null) => part(b""),
                        Some(field) => part(&serde_json::to_vec(field).unwrap_or_default()),
                    }
                }
            }
        }
        Ok(RequestFingerprint(hash.finalize().into()))
    }
}

/// The fingerprint of one request, put in its extensions by [`Remember`].
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) struct RequestFingerprint(pub(crate) [u8; 32]);

impl fmt::Debug for RequestFingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for byte in &self.0[..6] {
            write!(f, "{byte:02x}")?;
        }
        f.write_str("…")
    }
}

/// Decides which responses are remembered, by status.
pub(crate) type StoreIf = Arc<dyn Fn(StatusCode) -> bool + Send + Sync>;

/// The settings of a remembering layer that the response side needs.
#[derive(Clone)]
pub(crate) struct Remembering {
    pub(crate) keep: Duration,
    pub(crate) max_stored_body: usize,
    pub(crate) store_if: StoreIf,
    /// Replayed besides `content-type`.
    pub(crate) replay_headers: Vec<HeaderName>,
}

impl Remembering {
    pub(crate) fn new(keep: Duration) -> Self {
        Self {
            keep,
            max_stored_body: DEFAULT_MAX_STORED_BODY,
            // Success and the client's own mistakes are final; a server error may not be.
            store_if: Arc::new(|status| status.is_success() || status.is_client_error()),
            replay_headers: Vec::new(),
        }
    }
}

impl fmt::Debug for Remembering {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Remembering")
            .field("keep", &self.keep)
            .field("max_stored_body", &self.max_stored_body)
            .field("replay_headers", &self.replay_headers)
            .finish_non_exhaustive()
    }
}

/// The key source of a layer that remembers completed requests (made by
/// [`LockLayer::remember`](super::LockLayer::remember)): reads the body (up to the body
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

    pub(crate) fn set_limit(&mut self, limit: usize) {
        self.limit = limit;
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

    fn missing(&self) -> LockRejection {
        self.inner.missing()
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
        Extracting { #[pin] extract: F },
    }
}

impl<B, K> Future for RememberFuture<B, K>
where
    B: Body,
    B::Error: Into<BoxError>,
    K: KeySource<Full<Bytes>>,
{
    type Output = Result<Extracted<K::RequestBody>, LockRejection>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            let extract = match this.state.as_mut().project() {
                RememberStateProj::Extracting { extract } => return extract.poll(cx),
                RememberStateProj::Reading { read } => {
                    let (mut parts, body) = match ready!(read.poll(cx)) {
                        Ok(read) => read,
                        Err(rejection) => return Poll::Ready(Err(rejection)),
                    };
                    let fingerprint = match this.source.fingerprint.of(&parts, &body) {
                        Ok(fingerprint) => fingerprint,
                        Err(rejection) => return Poll::Ready(Err(rejection)),
                    };
                    parts.extensions.insert(fingerprint);
                    this.source
                        .inner
                        .extract(Request::from_parts(parts, Full::new(body)))
                }
            };
            this.state.set(RememberState::Extracting { extract });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fp(fingerprint: &Fingerprint, method: &str, uri: &str, body: &[u8]) -> [u8; 32] {
        let (parts, ()) = Request::builder()
            .method(method)
            .uri(uri)
            .body(())
            .unwrap()
            .into_parts();
        fingerprint.of(&parts, body).unwrap().0
    }

    #[test]
    fn request_fingerprint_covers_method_path_query_and_body() {
        let f = Fingerprint::Request;
        let base = fp(&f, "POST", "/pay?x=1", b"{}");
        assert_eq!(base, fp(&f, "POST", "/pay?x=1", b"{}"));
        assert_ne!(base, fp(&f, "PUT", "/pay?x=1", b"{}"));
        assert_ne!(base, fp(&f, "POST", "/pay?x=2", b"{}"));
        assert_ne!(base, fp(&f, "POST", "/pay?x=1", b"{ }"));
        // Length prefixes: moving bytes between parts changes the fingerprint.
        assert_ne!(fp(&f, "POST", "/ab", b"c"), fp(&f, "POST", "/a", b"bc"));
    }

    #[test]
    fn json_field_fingerprint_ignores_other_fields() {
        let f = Fingerprint::json_fields(["/id", "/amount"]);
        let a = fp(&f, "POST", "/", br#"{"id":"e1","amount":5,"sent_at":1}"#);
        assert_eq!(
            a,
            fp(&f, "POST", "/", br#"{"sent_at":2,"amount":5,"id":"e1"}"#)
        );
        assert_ne!(a, fp(&f, "POST", "/", br#"{"id":"e1","amount":6}"#));
        assert_ne!(a, fp(&f, "POST", "/", br#"{"id":"e1","amount":"5"}"#));
        let (parts, ()) = Request::new(()).into_parts();
        assert_eq!(
            f.of(&parts, b"not json").unwrap_err().status(),
            StatusCode::BAD_REQUEST
        );
    }
}
