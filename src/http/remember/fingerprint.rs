//! [`Fingerprint`]: what makes two requests with the same key the same request, and
//! [`RequestFingerprint`], the digest of one request that a stored response keeps so that
//! a retry is told from a different request reusing its key.

use std::fmt;
use std::sync::Arc;

use http::StatusCode;
use sha2::{Digest, Sha256};

use crate::http::rejection::Rejection;

/// What makes two requests with the same key "the same request" for
/// [`LockLayer::remember`](crate::LockLayer::remember). A retry must match the stored
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
    pub(super) fn of(
        &self,
        parts: &http::request::Parts,
        body: &[u8],
    ) -> Result<RequestFingerprint, Rejection> {
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
                    serde_json::from_slice(body).map_err(|e| Rejection::InvalidBody {
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

/// The fingerprint of one request, made by [`Remember`](super::Remember) and carried to
/// the response side in the request's [`Extracted`](crate::http::Extracted) key.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct RequestFingerprint(pub(super) [u8; 32]);

impl fmt::Debug for RequestFingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for byte in &self.0[..6] {
            write!(f, "{byte:02x}")?;
        }
        f.write_str("…")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::Request;

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
