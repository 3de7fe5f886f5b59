//! The concurrency-limit policy, [`Limiting`]: a request holds a permit of its key's
//! semaphore while its handler runs and its body streams. [`LimitLayer`] is the layer of
//! this policy: it starts with its capacity ([`permits`](LimitLayer::permits) or
//! [`permits_by`](LimitLayer::permits_by)), then its key (`unkeyed.rs`); the status when
//! full and [`PermitInfo`] are here too.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http::request::Parts;
use http::{Extensions, HeaderValue, StatusCode};
use tracing::Span;

use super::admission::sealed::Policy;
use super::admission::{BoxFuture, Verdict};
use super::config::DEFAULT_LIMIT_PREFIX;
use super::held::Held;
use super::hold::{Hold, Holds, Kept};
use super::layer::KeyedLayer;
use super::metrics::{Answered, Route};
use super::ratelimit_fields::{self, RATELIMIT, RATELIMIT_POLICY};
use super::rejection::Rejection;
use super::remember::fingerprint::RequestFingerprint;
use super::unkeyed::{KeyedLater, Unkeyed};
use crate::{Key, LockClient, LockGuard, LostSignal, MAX_PERMITS};

/// A tower layer that limits how many requests with the same key run at once, across
/// every replica of the service: each request holds a permit of a
/// [`Semaphore`](crate::Semaphore) named by its key while the inner service runs and
/// while the response body streams. It is the [`KeyedLayer`] of the [`Limiting`] policy.
///
/// Start with the capacity, [`permits`](LimitLayer::permits) (a number) or
/// [`permits_by`](LimitLayer::permits_by) (from the request: a tenant's tier), then pick
/// the key as for a [`LockLayer`](super::LockLayer)
/// ([`by_header`](KeyedLayer::by_header), [`by_path`](KeyedLayer::by_path),
/// [`by_path_param`](KeyedLayer::by_path_param),
/// [`by_json_field`](KeyedLayer::by_json_field), [`by`](KeyedLayer::by)) or one limit
/// for every request ([`global`](KeyedLayer::global)): a layer cannot be made without
/// either.
///
/// A request that finds every permit taken waits within [`wait`](KeyedLayer::wait)
/// (default: none), then is answered **429 Too Many Requests** (or
/// [`full_status`](KeyedLayer::full_status)) with `Retry-After` and an RFC 9457
/// `application/problem+json` body (`urn:lockwarden:problem:limit-reached`), without
/// reaching the handler. The permit is held while the handler runs and while the body
/// streams, and given back when the body ends, is dropped, when the client goes away or
/// the handler panics, exactly as the lock layer holds its lock. The store down: `503`,
/// or let through with [`fail_open`](KeyedLayer::fail_open). A capacity of 0 or above
/// [`MAX_PERMITS`](crate::MAX_PERMITS) is a misconfiguration: such requests are answered
/// `500` (`invalid-limit`) and logged, nothing is held. The request carries a
/// [`PermitInfo`] in its extensions.
///
/// Each key's semaphore is named `<name prefix>[<scope>/]<key>`: the prefix is
/// [`name_prefix`](KeyedLayer::name_prefix), by default
/// [`DEFAULT_LIMIT_PREFIX`](super::DEFAULT_LIMIT_PREFIX) (`http-limit:`, not the lock
/// layer's `http:`, so a lock and a limit on one key never share a name), the scope is
/// [`scope`](KeyedLayer::scope)'s, escaped as the lock layer's is; a
/// [`global`](KeyedLayer::global) limit's is `<name prefix><name>`. The name goes under
/// the client's Redis namespace like every lock name: with the defaults, a tenant `acme`
/// limited by `LimitLayer::permits(5).by_header("X-Tenant")` holds permits of the
/// semaphore `http-limit:acme`, the Redis hash `lockwarden:{http-limit:acme}`, which the
/// inspector lists and [`LockClient::semaphore`](crate::LockClient::semaphore) reaches:
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lockwarden::LockError> {
/// use lockwarden::LockClient;
///
/// let client = LockClient::in_memory();
/// let acme = client.semaphore("http-limit:acme", 5);
/// assert_eq!(acme.key()?.redis_key(), "lockwarden:{http-limit:acme}");
/// assert_eq!(acme.state().await?, None); // idle: nobody holds a permit
/// # Ok(()) }
/// ```
///
/// The capacity is stored with the semaphore while it is in use, and the stored one counts
/// for every replica (see [`Semaphore`](crate::Semaphore)): replicas that disagree for a
/// while during a deploy never exceed it, and a new capacity applies once the key is
/// idle (or at once with [`Semaphore::set_capacity`](crate::Semaphore::set_capacity)).
///
/// ```
/// use axum::{routing::post, Router};
/// use lockwarden::{LimitLayer, LockClient};
///
/// #[derive(Clone)]
/// struct Tier(&'static str); // put into the extensions by your auth layer
///
/// let locks = LockClient::in_memory(); // LockClient::connect(url).await? for Redis
/// let app: Router = Router::new()
///     .route("/exports", post(|| async { "exported" }))
///     .layer(
///         LimitLayer::permits_by(|parts| match parts.extensions.get::<Tier>() {
///             Some(Tier("paid")) => 20,
///             _ => 2,
///         })
///         .by_header("X-Tenant")
///         .client(locks),
///     );
/// ```
pub type LimitLayer<K> = KeyedLayer<Limiting, K>;

/// The admission policy of a [`LimitLayer`]: each request holds a permit of its key's
/// semaphore until its response is complete. Made by
/// [`LimitLayer::permits`] or [`LimitLayer::permits_by`].
#[derive(Clone, Debug)]
pub struct Limiting {
    hold: Hold,
    capacity: Capacity,
    /// Whether responses describe the limit in the IETF `RateLimit` fields.
    fields: bool,
}

/// What a request of a limit layer keeps while its handler runs: its permit, and the
/// `RateLimit-Policy` field its response gets, if it gets one.
pub struct HeldPermit {
    kept: Kept,
    field: Option<HeaderValue>,
}

/// How many permits a limit layer's semaphore has: one number, or one per request (a
/// tenant's tier).
#[derive(Clone)]
enum Capacity {
    Fixed(u32),
    ByRequest(Arc<dyn Fn(&Parts) -> u32 + Send + Sync>),
}

impl Capacity {
    /// The capacity for the request with head `parts`.
    fn of(&self, parts: &Parts) -> u32 {
        match self {
            Capacity::Fixed(permits) => *permits,
            Capacity::ByRequest(of) => of(parts),
        }
    }
}

impl fmt::Debug for Capacity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Capacity::Fixed(permits) => write!(f, "{permits}"),
            Capacity::ByRequest(_) => f.write_str("by request"),
        }
    }
}

impl Limiting {
    fn new(capacity: Capacity) -> Self {
        Self {
            hold: Hold::new(DEFAULT_LIMIT_PREFIX, StatusCode::TOO_MANY_REQUESTS),
            capacity,
            fields: false,
        }
    }

    /// The answer to a request that found every permit taken for the whole wait.
    pub(crate) fn full(status: StatusCode, retry_after: Duration) -> Rejection {
        Rejection::Full {
            status,
            retry_after,
        }
    }
}

impl LimitLayer<Unkeyed> {
    /// A limit of at most `permits` requests with the same key at once; pick the key next
    /// (`.by_header(..)`, `.global(..)`, ...). A capacity of 0 or above
    /// [`MAX_PERMITS`](crate::MAX_PERMITS) answers every request `500` (`invalid-limit`).
    ///
    /// ```
    /// use lockwarden::LimitLayer;
    /// let layer = LimitLayer::permits(5).by_header("X-Tenant");
    /// # let _ = layer;
    /// ```
    pub fn permits(permits: u32) -> Self {
        Self::from_parts(Limiting::new(Capacity::Fixed(permits)), Unkeyed)
    }

    /// A limit whose capacity comes from each request's head: e.g. by the tenant's plan.
    /// While a key's semaphore is in use its stored capacity counts, so a new tier
    /// applies once the key's requests have all ended. Pick the key next.
    ///
    /// ```
    /// use lockwarden::LimitLayer;
    /// let layer = LimitLayer::permits_by(|parts| {
    ///     match parts.headers.get("x-plan").and_then(|v| v.to_str().ok()) {
    ///         Some("paid") => 20,
    ///         _ => 2,
    ///     }
    /// })
    /// .by_header("X-Tenant");
    /// # let _ = layer;
    /// ```
    pub fn permits_by<F>(permits: F) -> Self
    where
        F: Fn(&Parts) -> u32 + Send + Sync + 'static,
    {
        Self::from_parts(
            Limiting::new(Capacity::ByRequest(Arc::new(permits))),
            Unkeyed,
        )
    }
}

impl<K> LimitLayer<K> {
    /// The status of the answer to a request that finds every permit taken: `429 Too
    /// Many Requests` (default) or `503 Service Unavailable`.
    ///
    /// ```
    /// use axum::http::StatusCode;
    /// use lockwarden::LimitLayer;
    ///
    /// let layer = LimitLayer::permits(8).by_path().full_status(StatusCode::SERVICE_UNAVAILABLE);
    /// # let _ = layer;
    /// ```
    pub fn full_status(mut self, status: StatusCode) -> Self {
        self.policy_mut().hold.refused_status = status;
        self
    }

    /// Describes the limit in the fields of the IETF draft *RateLimit header fields for
    /// HTTP* (draft 10), as a [`RateLimitLayer`](super::RateLimitLayer) does its rates:
    /// every response gets `RateLimit-Policy: "concurrency";q=<capacity>;
    /// qu="concurrent-requests"`, and a refused one `RateLimit: "concurrency";r=0` too.
    ///
    /// ```
    /// use lockwarden::LimitLayer;
    /// let layer = LimitLayer::permits(5).by_header("X-Tenant").rate_limit_headers();
    /// # let _ = layer;
    /// ```
    pub fn rate_limit_headers(mut self) -> Self {
        self.policy_mut().fields = true;
        self
    }
}

impl Holds for Limiting {
    fn hold_mut(&mut self) -> &mut Hold {
        &mut self.hold
    }
}

impl KeyedLater for Limiting {}

impl Policy for Limiting {
    type Grant = (LockGuard, LockClient, u32);
    type Taken = HeldPermit;
    type Run<F: Future> = F;

    const ADMITTED: Answered<'static> = Answered::Admitted;
    const OUTCOME: &'static str = "acquired";
    const BY: &'static str = "the limit layer";
    const TAKES: &'static str = "its permit";

    fn layered(&self) {
        self.hold.layered();
        if let Capacity::Fixed(permits) = self.capacity {
            if permits == 0 || permits > MAX_PERMITS {
                tracing::error!(
                    permits,
                    "LimitLayer: a capacity of {permits} permits (1 to {MAX_PERMITS} allowed); \
                     every request is answered 500"
                );
            }
        }
    }

    fn name(&self, scope: Option<&str>, key: &str) -> String {
        self.hold.name(scope, key)
    }

    fn admit(
        &self,
        parts: &Parts,
        name: String,
        _fingerprint: Option<RequestFingerprint>,
        route: &Route,
    ) -> BoxFuture<Verdict<Self::Grant>> {
        let capacity = self.capacity.of(parts);
        let (wait, lease) = (self.hold.wait, self.hold.lease);
        let mut fields = http::HeaderMap::new();
        if self.fields {
            fields.insert(
                RATELIMIT_POLICY,
                ratelimit_fields::concurrency_policy(capacity),
            );
            fields.insert(RATELIMIT, ratelimit_fields::concurrency_full());
        }
        self.hold.acquire(
            route,
            (Self::full, fields),
            move |client| {
                let mut permits = client.semaphore(&name, capacity);
                if let Some(lease) = lease {
                    permits = permits.lease(lease);
                }
                async move { permits.try_acquire(wait).await }
            },
            move |guard, client| Verdict::Admit((guard, client, capacity)),
        )
    }

    /// The request carries its [`PermitInfo`] and the client. It keeps the holder it had:
    /// a lock taken inside is its own.
    fn take(
        &self,
        (guard, client, capacity): Self::Grant,
        extensions: &mut Extensions,
        span: &Span,
        route: &Route,
    ) -> HeldPermit {
        extensions.insert(PermitInfo::of(&guard));
        extensions.insert(client);
        HeldPermit {
            kept: self.hold.keep(guard, span, route),
            field: self
                .fields
                .then(|| ratelimit_fields::concurrency_policy(capacity)),
        }
    }

    fn run<F: Future>(_taken: &HeldPermit, fut: F) -> F {
        fut
    }

    fn poll_lost(taken: &mut HeldPermit, cx: &mut Context<'_>) -> Poll<()> {
        taken.kept.poll_lost(cx)
    }

    fn respond(&self, taken: HeldPermit, head: &mut http::response::Parts) -> Option<Held> {
        if let Some(field) = taken.field {
            head.headers.insert(RATELIMIT_POLICY, field);
        }
        Some(taken.kept.held)
    }

    fn give_back(taken: HeldPermit) -> Option<Held> {
        Some(taken.kept.held)
    }
}

/// What a request holding a [`LimitLayer`]'s permit (or a handler with
/// [`Limited`](super::Limited)) can know about it: in the request's extensions.
///
/// ```
/// use axum::{routing::post, Extension, Router};
/// use lockwarden::{LimitLayer, LockClient, PermitInfo};
///
/// async fn export(Extension(permit): Extension<PermitInfo>) -> String {
///     format!("exporting under {} (token {})", permit.key, permit.fencing_token)
/// }
///
/// let app: Router = Router::new()
///     .route("/exports", post(export))
///     .layer(LimitLayer::permits(3).global("exports").client(LockClient::in_memory()));
/// ```
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct PermitInfo {
    /// The semaphore's name.
    pub key: Key,
    /// The fencing token of this permit.
    pub fencing_token: u64,
    /// Fires if the permit is lost.
    pub lost: LostSignal,
}

impl PermitInfo {
    pub(crate) fn of(guard: &LockGuard) -> Self {
        Self {
            key: guard.key().clone(),
            fencing_token: guard.fencing_token(),
            lost: guard.lost_signal(),
        }
    }
}
