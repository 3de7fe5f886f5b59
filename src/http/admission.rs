//! [`Admission`]: what a keyed layer's policy decides for each request — what it takes (a
//! lock, a permit, or a rate decision that holds nothing), how it is refused, how it
//! decorates the request, and how what it took is given back — and [`Verdict`], what an
//! admission answers. The layer, service, future and body are written once over it; each
//! policy is one file (`locking.rs`, `replaying.rs`, `limiting.rs`, `rate_limiting.rs`).

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use http::request::Parts;
use http::{Extensions, HeaderMap};
use tracing::Span;

use super::held::Held;
use super::metrics::{Answered, Route};
use super::rejection::Rejection;
use super::remember::fingerprint::RequestFingerprint;
use super::remember::stored::Stored;
use crate::LockError;

/// A boxed, sendable future: the engine's calls are `async fn`s, whose futures have no
/// name to store.
pub(crate) type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// The admission policy of a [`KeyedLayer`](super::KeyedLayer): what a request takes
/// before its handler runs and keeps until its response is complete. Implemented by
/// [`Locking`](super::Locking) (a lock: [`LockLayer`](super::LockLayer)),
/// [`Replaying`](super::Replaying) (a lock whose completed responses are replayed:
/// [`LockLayer::remember`](super::LockLayer::remember)), [`Limiting`](super::Limiting)
/// (a permit: [`LimitLayer`](super::LimitLayer)) and [`RateLimiting`](super::RateLimiting)
/// (a rate decision, nothing held: [`RateLimitLayer`](super::RateLimitLayer)); sealed.
pub trait Admission: sealed::Policy {}

impl<P: sealed::Policy> Admission for P {}

/// What an admission answers.
pub enum Verdict<G> {
    /// Run the handler with what was granted.
    Admit(G),
    /// Answer with a stored response (a remembering lock layer's replay).
    Replay(Stored),
    /// Answer with a refusal.
    Refuse(Refusal),
    /// The store failed: an outage is let through with `fail_open`, anything else refused.
    Fail(LockError),
}

/// A refusal: the problem answered, the engine's error behind it (logged with it), and
/// headers that describe the policy (the IETF `RateLimit` fields).
pub struct Refusal {
    pub(crate) rejection: Rejection,
    pub(crate) cause: Option<LockError>,
    pub(crate) headers: HeaderMap,
}

impl From<Rejection> for Refusal {
    fn from(rejection: Rejection) -> Self {
        Self {
            rejection,
            cause: None,
            headers: HeaderMap::new(),
        }
    }
}

pub(crate) mod sealed {
    use super::*;

    /// The steps a policy fills in, in the order the request future calls them.
    pub trait Policy: Clone + Send + Sync + 'static {
        /// What an admission grants (a guard and its client; a rate decision).
        type Grant: Send + 'static;
        /// What the request keeps while its handler runs.
        type Taken: Send + 'static;
        /// The handler's future as the policy runs it: as the lock's holder, or as it is.
        type Run<F: Future>: Future<Output = F::Output>;

        /// How an admitted request is counted (`lockwarden_http_requests_total`).
        const ADMITTED: Answered<'static>;
        /// The request span's `outcome` of an admitted request.
        const OUTCOME: &'static str;
        /// What answered, in the logs.
        const BY: &'static str;
        /// What a request runs without when the layer fails open, in the logs.
        const TAKES: &'static str;

        /// Checks the settings when the layer wraps a service (logs what cannot work).
        fn layered(&self) {}

        /// The name of a request's key, from its scope and raw key.
        fn name(&self, scope: Option<&str>, key: &str) -> String;

        /// Starts the admission of the request with head `parts` under key `name`.
        fn admit(
            &self,
            parts: &Parts,
            name: String,
            fingerprint: Option<RequestFingerprint>,
            route: &Route,
        ) -> BoxFuture<Verdict<Self::Grant>>;

        /// Takes what was granted: puts what the handler may know into the request's
        /// `extensions`, and starts the hold.
        fn take(
            &self,
            grant: Self::Grant,
            extensions: &mut Extensions,
            span: &Span,
            route: &Route,
        ) -> Self::Taken;

        /// Runs the handler's future `fut` as the policy wants it run.
        fn run<F: Future>(taken: &Self::Taken, fut: F) -> Self::Run<F>;

        /// Ready when what was taken is lost and the request must stop (a lock lost with
        /// `abort_on_loss`); otherwise never.
        fn poll_lost(taken: &mut Self::Taken, cx: &mut Context<'_>) -> Poll<()>;

        /// The handler answered `head`: decorates it, and hands on what the body must
        /// give back when it ends (nothing for a rate decision).
        fn respond(&self, taken: Self::Taken, head: &mut http::response::Parts) -> Option<Held>;

        /// The handler panicked: what must be given back before the panic goes on.
        fn give_back(taken: Self::Taken) -> Option<Held>;
    }
}
