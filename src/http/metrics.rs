//! What the lock layer records through the `metrics` facade: one counter of requests by
//! how the layer answered them (the engine records acquisitions, holds and losses
//! itself; the table in the core's `guide/operating.md` lists every name). Labels: the route (axum's
//! matched path, where known: never the raw path or key), the outcome, and the status
//! the layer answered with (`handler` when the handler answered).

use std::cell::Cell;
use std::sync::{Mutex, OnceLock, PoisonError};

use http::Request;
use metrics::{Key, Label, Level, Metadata};

use super::rejection::Rejection;

const REQUESTS: &str = "lockwarden_http_requests_total";

static METADATA: Metadata<'static> =
    Metadata::new(module_path!(), Level::INFO, Some(module_path!()));

/// The `outcome` label values, indexed by [`Answered::labels`].
const OUTCOMES: [&str; 19] = [
    "locked",
    "replayed",
    "passed_unlocked",
    "failed_open",
    "busy",
    "missing_key",
    "invalid_key",
    "invalid_body",
    "body_too_large",
    "unavailable",
    "lost",
    "key_reused",
    "admitted",
    "limit_reached",
    "invalid_limit",
    "shutting_down",
    "internal_error",
    "allowed",
    "quota_exceeded",
];

/// The `status` label values (the handler's answer, or the layer's status).
const STATUSES: [&str; 10] = [
    "handler", "400", "409", "413", "422", "423", "429", "500", "503", "other",
];

/// The route of a request, where the router says it (axum's `MatchedPath`).
#[derive(Clone, Debug, Default)]
pub struct Route {
    #[cfg(feature = "axum")]
    matched: Option<axum::extract::MatchedPath>,
}

impl Route {
    pub(crate) fn of<B>(request: &Request<B>) -> Self {
        Self::in_extensions(request.extensions())
    }

    /// The route a request's extensions name (axum puts it there).
    pub(crate) fn in_extensions(extensions: &http::Extensions) -> Self {
        #[cfg(not(feature = "axum"))]
        let _ = extensions;
        Self {
            #[cfg(feature = "axum")]
            matched: extensions.get().cloned(),
        }
    }

    /// The router's template of the route, if the router says it.
    pub(crate) fn as_str(&self) -> Option<&str> {
        #[cfg(feature = "axum")]
        return self.matched.as_ref().map(|m| m.as_str());
        #[cfg(not(feature = "axum"))]
        None
    }
}

/// How the layer dealt with a request.
#[derive(Debug, Clone, Copy)]
pub enum Answered<'a> {
    /// The handler ran under the lock.
    Locked,
    /// The handler ran holding a permit of its limit.
    Admitted,
    /// The handler ran charged to its rate limits.
    Allowed,
    /// A stored response was replayed.
    Replayed,
    /// The handler ran without a lock: no key, and the layer lets such requests through.
    PassedUnlocked,
    /// The handler ran without a lock: the store was down and the layer fails open.
    FailedOpen,
    /// The layer answered with a problem response.
    Rejected(&'a Rejection),
}

impl Answered<'_> {
    /// The indices of its `outcome` and `status` labels.
    fn labels(self) -> (usize, usize) {
        match self {
            Answered::Locked => (0, 0),
            Answered::Admitted => (12, 0),
            Answered::Allowed => (17, 0),
            Answered::Replayed => (1, 0),
            Answered::PassedUnlocked => (2, 0),
            Answered::FailedOpen => (3, 0),
            Answered::Rejected(rejection) => (outcome(rejection), status(rejection)),
        }
    }
}

/// Counts one request on `route`, answered as `how`. Allocates nothing once the route
/// has been counted before: its keys are made once and kept (see [`RouteKeys`]).
pub(crate) fn answered(route: &Route, how: Answered<'_>) {
    let (outcome, status) = how.labels();
    let key = RouteKeys::of(route.as_str()).key(outcome, status);
    metrics::with_recorder(|recorder| recorder.register_counter(key, &METADATA).increment(1));
}

/// The counter keys of one route (or of requests without one), each made on first use
/// and kept for the life of the process, like the engine's label sets. Routes are the
/// router's templates (never raw paths), so there are few; they are leaked on purpose.
struct RouteKeys {
    route: Option<Box<str>>,
    keys: [OnceLock<Key>; OUTCOMES.len() * STATUSES.len()],
}

static NO_ROUTE: RouteKeys = RouteKeys::new(None);
static ROUTES: Mutex<Vec<&'static RouteKeys>> = Mutex::new(Vec::new());

thread_local! {
    /// The route this thread counted last: consecutive requests mostly share one.
    static LAST: Cell<Option<&'static RouteKeys>> = const { Cell::new(None) };
}

impl RouteKeys {
    const fn new(route: Option<Box<str>>) -> Self {
        Self {
            route,
            keys: [const { OnceLock::new() }; OUTCOMES.len() * STATUSES.len()],
        }
    }

    fn of(route: Option<&str>) -> &'static Self {
        let Some(route) = route else {
            return &NO_ROUTE;
        };
        if let Some(last) = LAST
            .get()
            .filter(|last| last.route.as_deref() == Some(route))
        {
            return last;
        }
        let mut routes = ROUTES.lock().unwrap_or_else(PoisonError::into_inner);
        let keys = match routes.iter().find(|r| r.route.as_deref() == Some(route)) {
            Some(keys) => *keys,
            None => {
                let keys: &'static Self = Box::leak(Box::new(Self::new(Some(route.into()))));
                routes.push(keys);
                keys
            }
        };
        LAST.set(Some(keys));
        keys
    }

    fn key(&'static self, outcome: usize, status: usize) -> &'static Key {
        self.keys[outcome * STATUSES.len() + status].get_or_init(|| {
            let (outcome, status) = (OUTCOMES[outcome], STATUSES[status]);
            let labels: &'static [Label] = match &self.route {
                Some(route) => Box::leak(Box::new([
                    Label::new("route", route.to_string()),
                    Label::from_static_parts("outcome", outcome),
                    Label::from_static_parts("status", status),
                ])),
                None => Box::leak(Box::new([
                    Label::from_static_parts("outcome", outcome),
                    Label::from_static_parts("status", status),
                ])),
            };
            Key::from_static_parts(REQUESTS, labels)
        })
    }
}

/// The index of a rejection's `outcome` label.
fn outcome(rejection: &Rejection) -> usize {
    match rejection {
        Rejection::Busy { .. } => 4,
        Rejection::MissingKey { .. } => 5,
        Rejection::InvalidKey { .. } => 6,
        Rejection::InvalidBody { .. } => 7,
        Rejection::BodyTooLarge { .. } => 8,
        Rejection::Unavailable { .. } => 9,
        Rejection::Lost => 10,
        Rejection::KeyReused => 11,
        Rejection::Full { .. } => 13,
        Rejection::InvalidLimit { .. } => 14,
        Rejection::ShuttingDown => 15,
        Rejection::Internal { .. } => 16,
        Rejection::QuotaExceeded { .. } => 18,
    }
}

/// The index of a rejection's `status` label (the layer answers only these).
fn status(rejection: &Rejection) -> usize {
    match rejection.status().as_u16() {
        400 => 1,
        409 => 2,
        413 => 3,
        422 => 4,
        423 => 5,
        429 => 6,
        500 => 7,
        503 => 8,
        _ => 9,
    }
}
