//! What the lock layer records through the `metrics` facade: one counter of requests by
//! how the layer answered them (the engine records acquisitions, holds and losses
//! itself; the README's "Operating" table lists every name). Labels: the route (axum's
//! matched path, where known: never the raw path or key), the outcome, and the status
//! the layer answered with (`handler` when the handler answered).

use http::Request;

use super::rejection::LockRejection;

const REQUESTS: &str = "lockwarden_http_requests_total";

/// The route of a request, where the router says it (axum's `MatchedPath`).
#[derive(Clone, Debug, Default)]
pub(crate) struct Route {
    #[cfg(feature = "axum")]
    matched: Option<axum::extract::MatchedPath>,
}

impl Route {
    pub(crate) fn of<B>(request: &Request<B>) -> Self {
        #[cfg(not(feature = "axum"))]
        let _ = request;
        Self {
            #[cfg(feature = "axum")]
            matched: request.extensions().get().cloned(),
        }
    }

    fn as_str(&self) -> Option<&str> {
        #[cfg(feature = "axum")]
        return self.matched.as_ref().map(|m| m.as_str());
        #[cfg(not(feature = "axum"))]
        None
    }
}

/// How the layer dealt with a request.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Answered<'a> {
    /// The handler ran under the lock.
    Locked,
    /// A stored response was replayed.
    Replayed,
    /// The handler ran without a lock: no key, and the layer lets such requests through.
    PassedUnlocked,
    /// The handler ran without a lock: the store was down and the layer fails open.
    FailedOpen,
    /// The layer answered with a problem response.
    Rejected(&'a LockRejection),
}

/// Counts one request on `route`, answered as `how`.
pub(crate) fn answered(route: &Route, how: Answered<'_>) {
    let (outcome, status) = match how {
        Answered::Locked => ("locked", "handler"),
        Answered::Replayed => ("replayed", "handler"),
        Answered::PassedUnlocked => ("passed_unlocked", "handler"),
        Answered::FailedOpen => ("failed_open", "handler"),
        Answered::Rejected(rejection) => (outcome(rejection), status(rejection)),
    };
    match route.as_str() {
        Some(route) => metrics::counter!(REQUESTS, "route" => route.to_owned(), "outcome" => outcome, "status" => status).increment(1),
        None => metrics::counter!(REQUESTS, "outcome" => outcome, "status" => status).increment(1),
    }
}

fn outcome(rejection: &LockRejection) -> &'static str {
    match rejection {
        LockRejection::Busy { .. } => "busy",
        LockRejection::MissingKey { .. } => "missing_key",
        LockRejection::InvalidKey { .. } => "invalid_key",
        LockRejection::InvalidBody { .. } => "invalid_body",
        LockRejection::BodyTooLarge { .. } => "body_too_large",
        LockRejection::Unavailable { .. } => "unavailable",
        LockRejection::Lost => "lost",
        LockRejection::KeyReused => "key_reused",
    }
}

/// The status as a static label (the layer answers only these).
fn status(rejection: &LockRejection) -> &'static str {
    match rejection.status().as_u16() {
        400 => "400",
        409 => "409",
        413 => "413",
        422 => "422",
        423 => "423",
        503 => "503",
        _ => "other",
    }
}
