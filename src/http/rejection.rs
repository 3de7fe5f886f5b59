//! [`Rejection`]: why a keyed layer (or an extractor) answered a request itself, each
//! reason as an RFC 9457 `application/problem+json` response with the right status (and
//! `Retry-After`); which engine error gets which answer, and how loud each is logged.

use std::fmt;
use std::time::Duration;

use bytes::Bytes;
use http::header::{HeaderValue, CONTENT_TYPE, RETRY_AFTER};
use http::{Response, StatusCode};

use super::retry_after::FLOOR;
use crate::{BackendError, KeyError, LockError};

/// The media type of problem details (RFC 9457).
const PROBLEM_JSON: &str = "application/problem+json";

/// The problem type of a request over its quota, from the IETF draft *RateLimit header
/// fields for HTTP*.
const QUOTA_EXCEEDED: &str = "https://iana.org/assignments/http-problem-types#quota-exceeded";

/// Why a request was answered by a keyed layer ([`LockLayer`](super::LockLayer),
/// [`LimitLayer`](super::LimitLayer), [`RateLimitLayer`](super::RateLimitLayer)) or an
/// extractor ([`Locked`](crate::Locked), [`Limited`](crate::Limited)) instead of the
/// handler.
///
/// Each variant becomes a problem response: `{"type", "title", "status", "detail"}` with
/// content type `application/problem+json`. The `type` URIs are stable
/// (`urn:lockwarden:problem:<slug>`) so clients can match on them.
///
/// | variant | status | `type` slug |
/// |---|---|---|
/// | `Busy` | 409 (or the configured 423) + `Retry-After` | `lock-busy` |
/// | `MissingKey` | 400 (422 for a JSON field) | `missing-key` |
/// | `InvalidKey` | 400 | `invalid-key` |
/// | `InvalidBody` | 400 (body not JSON, unreadable) or 422 (field of the wrong type) | `invalid-body` |
/// | `BodyTooLarge` | 413 | `body-too-large` |
/// | `Unavailable` | 503 (+ `Retry-After: 1` when a retry may find the store back) | `store-unavailable` |
/// | `ShuttingDown` | 503 + `Retry-After: 1` | `shutting-down` |
/// | `Lost` | 503 | `lock-lost` |
/// | `KeyReused` | 422 | `idempotency-key-reused` |
/// | `Full` | 429 (or the configured 503) + `Retry-After` | `limit-reached` |
/// | `QuotaExceeded` | 429 + `Retry-After` | the IETF draft's `https://iana.org/assignments/http-problem-types#quota-exceeded`, with `violated-policies` |
/// | `InvalidLimit` | 500 | `invalid-limit` |
/// | `Internal` | 500 | `internal-error` |
///
/// ```
/// use axum::body::Bytes;
/// use axum::http::{Response, StatusCode};
/// use lockwarden::Rejection;
/// use std::time::Duration;
///
/// let busy = Rejection::Busy {
///     status: StatusCode::CONFLICT,
///     retry_after: Duration::from_millis(1500),
/// };
/// let response: Response<Bytes> = busy.to_response();
/// assert_eq!(response.status(), 409);
/// assert_eq!(response.headers()["retry-after"], "2"); // whole seconds, rounded up
/// assert_eq!(response.headers()["content-type"], "application/problem+json");
/// assert!(String::from_utf8_lossy(response.body()).contains("\"status\":409"));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Rejection {
    /// Another request holds the lock and the wait budget is spent.
    Busy {
        /// 409 Conflict by default, 423 Locked if so configured.
        status: StatusCode,
        /// When a retry may find the lock free (sent as `Retry-After`, in whole seconds
        /// rounded up, at least 1): the layer's estimate from the holds it has seen end,
        /// at most the holder's remaining lease (see [`LockLayer`](super::LockLayer)).
        retry_after: Duration,
    },
    /// The request carries no key (no header, no field, no scope).
    MissingKey {
        /// 400, or 422 for a JSON field absent from a well-formed body.
        status: StatusCode,
        /// What was missing, for the client.
        detail: String,
    },
    /// The key is empty, too long, has control characters or is not UTF-8.
    InvalidKey {
        /// What is wrong with it, for the client.
        detail: String,
    },
    /// The body could not be read, is not JSON, or the field is not a string or number.
    InvalidBody {
        /// 400 for an unreadable or malformed body, 422 for a field of the wrong type.
        status: StatusCode,
        /// What is wrong with it, for the client.
        detail: String,
    },
    /// The body is longer than the layer buffers to find the key.
    BodyTooLarge {
        /// The limit in bytes.
        limit: usize,
    },
    /// The lock store could not be reached, or is not configured (fail closed).
    Unavailable {
        /// What failed (shown to the client without internals).
        detail: String,
        /// When a retry may succeed (sent as `Retry-After`): a second when the store
        /// could not be reached or answered too late, `None` when a retry cannot help
        /// until the server is reconfigured (no `REDIS_URL`, refused by the store's ACL
        /// or TLS).
        retry_after: Option<Duration>,
    },
    /// The lock client was shut down (the server is stopping): the request was not
    /// processed, and is never run without its lock. Another instance may take it.
    ShuttingDown,
    /// The lock was lost while the handler ran and the layer aborts on loss.
    Lost,
    /// The key belongs to a remembered request that differs from this one (method, path
    /// or body); see [`LockLayer::remember`](super::LockLayer::remember).
    KeyReused,
    /// Every permit of the request's limit is held and the wait budget is spent (a
    /// [`LimitLayer`](super::LimitLayer)).
    Full {
        /// 429 Too Many Requests by default, 503 if so configured.
        status: StatusCode,
        /// When a retry may find a permit free (sent as `Retry-After`, in whole seconds
        /// rounded up, at least 1): the layer's estimate from the holds it has seen end,
        /// at most the soonest remaining lease (see [`LockLayer`](super::LockLayer)).
        retry_after: Duration,
    },
    /// A policy of the request's rate limits refused it, and it was charged to none (a
    /// [`RateLimitLayer`](super::RateLimitLayer)). Answered with the problem type of the
    /// IETF draft *RateLimit header fields for HTTP*, `quota-exceeded`, and its
    /// `violated-policies` member.
    QuotaExceeded {
        /// When the same request would be admitted, if nothing else is charged meanwhile
        /// (sent as `Retry-After`, in whole seconds rounded up, at least 1).
        retry_after: Duration,
        /// The names of the policies that refused it.
        violated_policies: Vec<String>,
    },
    /// The limit's capacity cannot be: 0, or above [`MAX_PERMITS`](crate::MAX_PERMITS).
    /// A misconfiguration of the server, not of the request.
    InvalidLimit {
        /// What is wrong, for the logs (the client is told only that the limit is
        /// misconfigured).
        detail: String,
    },
    /// The lock engine answered an acquisition with an error that no acquisition should
    /// get (a bug): the request was not processed, and is never run without its lock.
    Internal {
        /// The error, for the logs (the client is told only that the layer failed).
        detail: String,
    },
}

impl Rejection {
    /// The HTTP status of the response.
    ///
    /// ```
    /// # use lockwarden::Rejection;
    /// assert_eq!(Rejection::BodyTooLarge { limit: 10 }.status(), 413);
    /// ```
    pub fn status(&self) -> StatusCode {
        match self {
            Self::QuotaExceeded { .. } => StatusCode::TOO_MANY_REQUESTS,
            Self::Busy { status, .. }
            | Self::Full { status, .. }
            | Self::MissingKey { status, .. }
            | Self::InvalidBody { status, .. } => *status,
            Self::InvalidKey { .. } => StatusCode::BAD_REQUEST,
            Self::KeyReused => StatusCode::UNPROCESSABLE_ENTITY,
            Self::BodyTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            Self::Unavailable { .. } | Self::ShuttingDown | Self::Lost => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            Self::InvalidLimit { .. } | Self::Internal { .. } => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// The `type` member: a URI that names the kind of problem.
    ///
    /// ```
    /// # use lockwarden::Rejection;
    /// assert_eq!(Rejection::Lost.problem_type(), "urn:lockwarden:problem:lock-lost");
    /// ```
    pub fn problem_type(&self) -> &'static str {
        match self {
            Self::Busy { .. } => "urn:lockwarden:problem:lock-busy",
            Self::MissingKey { .. } => "urn:lockwarden:problem:missing-key",
            Self::InvalidKey { .. } => "urn:lockwarden:problem:invalid-key",
            Self::InvalidBody { .. } => "urn:lockwarden:problem:invalid-body",
            Self::BodyTooLarge { .. } => "urn:lockwarden:problem:body-too-large",
            Self::Unavailable { .. } => "urn:lockwarden:problem:store-unavailable",
            Self::ShuttingDown => "urn:lockwarden:problem:shutting-down",
            Self::Lost => "urn:lockwarden:problem:lock-lost",
            Self::KeyReused => "urn:lockwarden:problem:idempotency-key-reused",
            Self::Full { .. } => "urn:lockwarden:problem:limit-reached",
            Self::QuotaExceeded { .. } => QUOTA_EXCEEDED,
            Self::InvalidLimit { .. } => "urn:lockwarden:problem:invalid-limit",
            Self::Internal { .. } => "urn:lockwarden:problem:internal-error",
        }
    }

    /// The `title` member: a short summary of the kind of problem.
    ///
    /// ```
    /// # use lockwarden::Rejection;
    /// assert_eq!(Rejection::Lost.title(), "Lock lost");
    /// ```
    pub fn title(&self) -> &'static str {
        match self {
            Self::Busy { .. } => "Resource is locked",
            Self::MissingKey { .. } => "Missing lock key",
            Self::InvalidKey { .. } => "Invalid lock key",
            Self::InvalidBody { .. } => "Invalid request body",
            Self::BodyTooLarge { .. } => "Request body too large",
            Self::Unavailable { .. } => "Lock service unavailable",
            Self::ShuttingDown => "Server shutting down",
            Self::Lost => "Lock lost",
            Self::KeyReused => "Idempotency-Key is already used",
            Self::Full { .. } => "Too many concurrent requests",
            Self::QuotaExceeded { .. } => "Rate limit exceeded",
            Self::InvalidLimit { .. } => "Concurrency limit misconfigured",
            Self::Internal { .. } => "Lock layer error",
        }
    }

    /// The `detail` member: what happened to this request.
    ///
    /// ```
    /// # use lockwarden::Rejection;
    /// assert!(Rejection::BodyTooLarge { limit: 64 }.detail().contains("64 bytes"));
    /// ```
    pub fn detail(&self) -> String {
        match self {
            Self::Busy { retry_after, .. } => format!(
                "Another request holds the lock for this key; retry in {} s.",
                retry_after_secs(*retry_after)
            ),
            Self::MissingKey { detail, .. }
            | Self::InvalidKey { detail }
            | Self::InvalidBody { detail, .. }
            | Self::Unavailable { detail, .. } => detail.clone(),
            Self::ShuttingDown => "This server is shutting down and takes no more locks; the \
                                   request was not processed. Retry it: another instance may \
                                   take it."
                .to_owned(),
            Self::BodyTooLarge { limit } => format!(
                "The request body is longer than the {limit} bytes read to find the lock key."
            ),
            Self::Lost => "The lock protecting this request was lost while it was being \
                           handled; the request was stopped."
                .to_owned(),
            Self::KeyReused => "This key was used for a different request (method, path or \
                                body differ); send a new request with a new key."
                .to_owned(),
            Self::Full { retry_after, .. } => format!(
                "The limit of concurrent requests for this key is reached; retry in {} s.",
                retry_after_secs(*retry_after)
            ),
            Self::QuotaExceeded {
                retry_after,
                violated_policies,
            } => format!(
                "The rate limit for this key is reached (policy {}); retry in {} s.",
                violated_policies
                    .iter()
                    .map(|p| format!("`{p}`"))
                    .collect::<Vec<_>>()
                    .join(", "),
                retry_after_secs(*retry_after)
            ),
            Self::InvalidLimit { .. } => "The server's concurrency limit for this request is \
                                          misconfigured; the request was not processed."
                .to_owned(),
            Self::Internal { .. } => "The lock layer failed unexpectedly; the request was not \
                                      processed."
                .to_owned(),
        }
    }

    /// The `Retry-After` value in whole seconds: for `Busy`, `Full` and `ShuttingDown`,
    /// and for `Unavailable` when a retry may succeed.
    ///
    /// ```
    /// use axum::http::StatusCode;
    /// use lockwarden::Rejection;
    /// use std::time::Duration;
    ///
    /// let busy = Rejection::Busy { status: StatusCode::LOCKED, retry_after: Duration::ZERO };
    /// assert_eq!(busy.retry_after_secs(), Some(1)); // never less than a second
    /// assert_eq!(Rejection::KeyReused.retry_after_secs(), None);
    /// ```
    pub fn retry_after_secs(&self) -> Option<u64> {
        match self {
            Self::Busy { retry_after, .. }
            | Self::Full { retry_after, .. }
            | Self::QuotaExceeded { retry_after, .. } => Some(retry_after_secs(*retry_after)),
            Self::Unavailable { retry_after, .. } => retry_after.map(retry_after_secs),
            Self::ShuttingDown => Some(retry_after_secs(FLOOR)),
            Self::MissingKey { .. }
            | Self::InvalidKey { .. }
            | Self::InvalidBody { .. }
            | Self::BodyTooLarge { .. }
            | Self::Lost
            | Self::KeyReused
            | Self::InvalidLimit { .. }
            | Self::Internal { .. } => None,
        }
    }

    /// The problem document as JSON bytes.
    ///
    /// ```
    /// # use lockwarden::Rejection;
    /// let json: serde_json::Value = serde_json::from_slice(&Rejection::Lost.to_json()).unwrap();
    /// assert_eq!(json["status"], 503);
    /// assert_eq!(json["type"], "urn:lockwarden:problem:lock-lost");
    /// ```
    pub fn to_json(&self) -> Bytes {
        let mut document = serde_json::json!({
            "type": self.problem_type(),
            "title": self.title(),
            "status": self.status().as_u16(),
            "detail": self.detail(),
        });
        if let Self::QuotaExceeded {
            violated_policies, ..
        } = self
        {
            document["violated-policies"] = serde_json::json!(violated_policies);
        }
        Bytes::from(serde_json::to_vec(&document).unwrap_or_default())
    }

    /// The problem response, with any body type that can be made from bytes.
    ///
    /// ```
    /// # use lockwarden::Rejection;
    /// let response: axum::http::Response<axum::body::Bytes> = Rejection::Lost.to_response();
    /// assert_eq!(response.status(), 503);
    /// ```
    pub fn to_response<B: From<Bytes>>(&self) -> Response<B> {
        let mut response = Response::new(B::from(self.to_json()));
        *response.status_mut() = self.status();
        let headers = response.headers_mut();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON));
        if let Some(secs) = self.retry_after_secs() {
            headers.insert(RETRY_AFTER, HeaderValue::from(secs));
        }
        response
    }

    /// The answer to an acquisition that failed with `error`, each error on purpose:
    ///
    /// - `Timeout`: `Busy` (`409`) with the holder's remaining lease as its `Retry-After`
    ///   (a layer answers its own busy or full status, with its estimate, instead);
    /// - `InvalidKey`: `InvalidKey`; a capacity that cannot be: `InvalidLimit`;
    /// - `Backend`: `Unavailable` (the only answer a layer that fails open lets through);
    /// - `ShutDown`: `ShuttingDown`;
    /// - `Lost`: `Lost`;
    /// - what no acquisition answers (the errors of releases, upgrades, claims on a
    ///   read-write lock, fenced writes, Redlock) and variants the engine may add later:
    ///   `Internal`, never an outage, so never passed through unguarded.
    pub(crate) fn from_lock_error(error: &LockError) -> Self {
        match error {
            LockError::Timeout { retry_after, .. } => Self::Busy {
                status: StatusCode::CONFLICT,
                retry_after: *retry_after,
            },
            LockError::InvalidPermits { .. }
            | LockError::TooManyPermits { .. }
            | LockError::InvalidRateLimit { .. } => Self::InvalidLimit {
                detail: error.to_string(),
            },
            LockError::InvalidKey(e) => Self::invalid_key(e),
            LockError::Backend(e) => Self::unavailable(e),
            LockError::ShutDown { .. } => Self::ShuttingDown,
            LockError::Lost { .. } => Self::Lost,
            LockError::NotHeld { .. }
            | LockError::UpgradeRefused { .. }
            | LockError::NotClaimable { .. }
            | LockError::StaleToken { .. }
            | LockError::NoFencingToken { .. }
            | LockError::Redlock(_) => Self::Internal {
                detail: error.to_string(),
            },
            // `LockError` is `non_exhaustive`, so this arm must be; a variant added later is
            // no outage either until it is mapped above.
            _ => Self::Internal {
                detail: error.to_string(),
            },
        }
    }

    /// The answer to a store that failed: `Retry-After: 1` when a retry may find it back
    /// (it could not be reached, answered too late, or too few replicas acknowledged).
    fn unavailable(error: &BackendError) -> Self {
        if let BackendError::NotConfigured(_) = error {
            return Self::Unavailable {
                detail: "The lock store is not configured; the request was not processed."
                    .to_owned(),
                retry_after: None,
            };
        }
        let may_pass = error.is_transient() || matches!(error, BackendError::NotReplicated { .. });
        Self::Unavailable {
            detail: "The lock store could not be reached; the request was not processed."
                .to_owned(),
            retry_after: may_pass.then_some(FLOOR),
        }
    }

    /// Logs the answer, as loud as it is: an answer of the server's own failing (5xx) as
    /// an error (a shutdown as a warning: it is expected), the client's (4xx) at debug.
    /// `cause` is the engine's error behind it, `by` what answered.
    pub(crate) fn log(&self, cause: Option<&LockError>, by: &'static str) {
        let status = self.status().as_u16();
        let outcome = self.outcome();
        let cause = cause.map(tracing::field::display);
        match self {
            Self::ShuttingDown => {
                tracing::warn!(
                    status,
                    outcome,
                    error = cause,
                    "{by}: the lock client is shut down; answering {status}"
                )
            }
            Self::Unavailable { .. }
            | Self::Lost
            | Self::InvalidLimit { .. }
            | Self::Internal { .. } => {
                let detail = self.detail_for_logs();
                tracing::error!(
                    status,
                    outcome,
                    error = cause,
                    "{by}: {detail}; answering {status}"
                )
            }
            _ => tracing::debug!(
                status,
                outcome,
                error = cause,
                "{by} answered the request itself"
            ),
        }
    }

    /// What went wrong, with what the client is not told.
    fn detail_for_logs(&self) -> String {
        match self {
            Self::InvalidLimit { detail } | Self::Internal { detail } => detail.clone(),
            other => other.detail(),
        }
    }

    pub(crate) fn invalid_key(error: &KeyError) -> Self {
        Self::InvalidKey {
            detail: format!("The lock key is not acceptable: {error}."),
        }
    }

    /// A short label for logs and the request span.
    pub(crate) fn outcome(&self) -> &'static str {
        match self {
            Self::Busy { .. } => "busy",
            Self::MissingKey { .. } => "missing key",
            Self::InvalidKey { .. } => "invalid key",
            Self::InvalidBody { .. } => "invalid body",
            Self::BodyTooLarge { .. } => "body too large",
            Self::Unavailable { .. } => "backend error",
            Self::ShuttingDown => "shutting down",
            Self::Lost => "lost",
            Self::KeyReused => "key reused",
            Self::Full { .. } => "limit reached",
            Self::QuotaExceeded { .. } => "quota exceeded",
            Self::InvalidLimit { .. } => "invalid limit",
            Self::Internal { .. } => "internal error",
        }
    }
}

/// Whole seconds, rounded up, at least one.
fn retry_after_secs(retry_after: Duration) -> u64 {
    // Saturating: `Duration::MAX` (a caller's "no idea") must not overflow.
    let secs = retry_after
        .as_secs()
        .saturating_add(u64::from(retry_after.subsec_nanos() > 0));
    secs.max(1)
}

impl fmt::Display for Rejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.title(), self.detail())
    }
}

impl std::error::Error for Rejection {}

#[cfg(feature = "axum")]
#[cfg_attr(docsrs, doc(cfg(feature = "axum")))]
impl axum::response::IntoResponse for Rejection {
    fn into_response(self) -> axum::response::Response {
        self.to_response()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_rounds_up_to_whole_seconds() {
        assert_eq!(retry_after_secs(Duration::ZERO), 1);
        assert_eq!(retry_after_secs(Duration::from_millis(1)), 1);
        assert_eq!(retry_after_secs(Duration::from_secs(1)), 1);
        assert_eq!(retry_after_secs(Duration::from_millis(1001)), 2);
        assert_eq!(retry_after_secs(Duration::from_secs(30)), 30);
        assert_eq!(retry_after_secs(Duration::MAX), u64::MAX);
    }

    #[test]
    fn problem_document_has_the_four_members() {
        let rejection = Rejection::MissingKey {
            status: StatusCode::BAD_REQUEST,
            detail: "no header".into(),
        };
        let json: serde_json::Value = serde_json::from_slice(&rejection.to_json()).unwrap();
        assert_eq!(json["status"], 400);
        assert_eq!(json["detail"], "no header");
        assert_eq!(json["title"], "Missing lock key");
        assert_eq!(json["type"], "urn:lockwarden:problem:missing-key");
        let response: Response<Bytes> = rejection.to_response();
        assert!(response.headers().get(RETRY_AFTER).is_none());
    }
}
