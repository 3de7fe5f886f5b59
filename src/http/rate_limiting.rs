//! The rate-limit policy, [`RateLimiting`]: each request is charged to its key's rate
//! limits (a [`RateLimiter`]'s policies, all or none) in one script, and holds nothing.
//! [`RateLimitLayer`] is the layer of this policy: it starts with its limiter
//! ([`limiter`](RateLimitLayer::limiter), or one per request with
//! [`plans`](RateLimitLayer::plans)), then its key (`unkeyed.rs`).

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::request::Parts;
use http::{Extensions, HeaderValue};
use tracing::Span;

use super::admission::sealed::Policy;
use super::admission::{BoxFuture, Refusal, Verdict};
use super::config::scoped_name;
use super::held::Held;
use super::layer::KeyedLayer;
use super::metrics::{Answered, Route};
use super::ratelimit_fields::{self, RATELIMIT, RATELIMIT_POLICY};
use super::rejection::Rejection;
use super::remember::fingerprint::RequestFingerprint;
use super::unkeyed::{KeyedLater, Unkeyed};
use crate::{LockError, RateDecision, RateLimiter};

/// A tower layer that limits how many requests with the same key are served per unit of
/// time, across every replica of the service: each request is charged to its key's
/// buckets under a [`RateLimiter`]'s policies (GCRA on the store's clock, every policy or
/// none, one script per request) before the inner service sees it, and holds nothing
/// afterwards. It is the [`KeyedLayer`] of the [`RateLimiting`] policy.
///
/// Start with the limiter, made by [`LockClient::rate_limiter`](crate::LockClient::rate_limiter)
/// (which refuses policies it cannot run: a zero quota or burst, a window too short or
/// too long), or with [`plans`](RateLimitLayer::plans) to choose one per request (a
/// tenant's plan); then pick the key as for the other layers
/// ([`by_header`](KeyedLayer::by_header), [`by_path`](KeyedLayer::by_path),
/// [`by_path_param`](KeyedLayer::by_path_param),
/// [`by_json_field`](KeyedLayer::by_json_field), [`by`](KeyedLayer::by)) or one limit for
/// every request ([`global`](KeyedLayer::global)), and [`scope`](KeyedLayer::scope) it
/// like them. A request's bucket key in the limiter is `[<escaped scope>/]<key>`; a
/// limiter's name keeps its buckets apart from every other limiter's.
///
/// ```
/// use std::time::Duration;
///
/// use axum::{routing::get, Router};
/// use lockwarden::{LockClient, RateLimitLayer, RatePolicy};
///
/// # fn main() -> Result<(), lockwarden::LockError> {
/// let client = LockClient::in_memory(); // LockClient::connect(url).await? for Redis
/// let api = client.rate_limiter(
///     "api",
///     [
///         // 10 per second, 20 at once...
///         RatePolicy::new("burst", 10, Duration::from_secs(1)).burst(20),
///         // ...and 1,000 a day.
///         RatePolicy::new("daily", 1_000, Duration::from_secs(86_400)),
///     ],
/// )?;
/// let app: Router = Router::new()
///     .route("/search", get(|| async { "results" }))
///     .layer(RateLimitLayer::limiter(api).by_header("X-Api-Key").rate_limit_headers());
/// # let _ = app;
/// # Ok(()) }
/// ```
///
/// # The answers
///
/// | request | status | problem `type` |
/// |---|---|---|
/// | admitted: charged to every policy | the handler's, with the `RateLimit` fields if [`rate_limit_headers`](KeyedLayer::rate_limit_headers) | |
/// | a policy refuses it (nothing is charged to any) | `429` with `Retry-After` (whole seconds, rounded up: when the same request would be admitted) and the `RateLimit-Policy` and `RateLimit` fields | `https://iana.org/assignments/http-problem-types#quota-exceeded`, with `violated-policies` |
/// | no key (or no scope) | `400`; `422` for a JSON field absent or `null` (or let through with [`on_missing_key`](KeyedLayer::on_missing_key)) | `urn:lockwarden:problem:missing-key` |
/// | a key that is empty, too long, has control characters | `400`, nothing charged | `urn:lockwarden:problem:invalid-key` |
/// | the store cannot be reached | `503` with `Retry-After: 1` (with [`fail_open`](KeyedLayer::fail_open): passed through uncharged, with a warning) | `urn:lockwarden:problem:store-unavailable` |
///
/// The rate limit fails closed by default: a request is served only once it is charged.
///
/// # The `RateLimit` fields
///
/// A refused request always carries, and with
/// [`rate_limit_headers`](KeyedLayer::rate_limit_headers) every admitted one too, the
/// fields of the IETF draft *RateLimit header fields for HTTP* (draft 10), one list member
/// per policy: `RateLimit-Policy: "burst";q=10;w=1, "daily";q=1000;w=86400` (the quota per
/// window in whole seconds) and `RateLimit: "burst";r=19;t=1, "daily";r=999;t=87` (`r`:
/// what the key may use now; `t`: the whole seconds until one more is made available,
/// left out for a full bucket). A refused request's `Retry-After` is never earlier than
/// the `t` of a policy that refused it. The admitted request carries the decision
/// ([`RateDecision`]) in its extensions.
pub type RateLimitLayer<K> = KeyedLayer<RateLimiting, K>;

/// The admission policy of a [`RateLimitLayer`]: each request is charged to its key's
/// rate limits, and holds nothing. Made by [`RateLimitLayer::limiter`] or
/// [`RateLimitLayer::plans`].
#[derive(Clone, Debug)]
pub struct RateLimiting {
    plan: Plan,
    /// Whether admitted responses carry the `RateLimit` fields.
    fields: bool,
}

/// Which limiter a request is charged to: one, or one chosen per request.
#[derive(Clone)]
enum Plan {
    Fixed(RateLimiter),
    ByRequest(Arc<dyn Fn(&Parts) -> RateLimiter + Send + Sync>),
}

impl Plan {
    fn of(&self, parts: &Parts) -> RateLimiter {
        match self {
            Plan::Fixed(limiter) => limiter.clone(),
            Plan::ByRequest(of) => of(parts),
        }
    }
}

impl fmt::Debug for Plan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Plan::Fixed(limiter) => limiter.fmt(f),
            Plan::ByRequest(_) => f.write_str("by request"),
        }
    }
}

impl RateLimitLayer<Unkeyed> {
    /// A rate limit by `limiter`'s policies; pick the key next (`.by_header(..)`,
    /// `.global(..)`, ...).
    ///
    /// ```
    /// use std::time::Duration;
    /// use lockwarden::{LockClient, RateLimitLayer, RatePolicy};
    ///
    /// let client = LockClient::in_memory();
    /// let logins = client.rate_limiter("logins", [RatePolicy::new("minute", 5, Duration::from_secs(60))])?;
    /// let layer = RateLimitLayer::limiter(logins).by_json_field("/user");
    /// # let _ = layer;
    /// # Ok::<(), lockwarden::LockError>(())
    /// ```
    pub fn limiter(limiter: RateLimiter) -> Self {
        Self::from_parts(
            RateLimiting {
                plan: Plan::Fixed(limiter),
                fields: false,
            },
            Unkeyed,
        )
    }

    /// A rate limit whose limiter is chosen from each request's head: one of several
    /// (each made once, with a name of its own), e.g. by the tenant's plan. A key that
    /// changes plan starts with full buckets under the new one.
    ///
    /// ```
    /// use std::time::Duration;
    /// use lockwarden::{LockClient, RateLimitLayer, RatePolicy};
    ///
    /// let client = LockClient::in_memory();
    /// let free = client.rate_limiter("free", [RatePolicy::new("minute", 60, Duration::from_secs(60))])?;
    /// let paid = client.rate_limiter("paid", [RatePolicy::new("minute", 6_000, Duration::from_secs(60))])?;
    /// let layer = RateLimitLayer::plans(move |parts| {
    ///     match parts.headers.get("x-plan").and_then(|v| v.to_str().ok()) {
    ///         Some("paid") => paid.clone(),
    ///         _ => free.clone(),
    ///     }
    /// })
    /// .by_header("X-Tenant");
    /// # let _ = layer;
    /// # Ok::<(), lockwarden::LockError>(())
    /// ```
    pub fn plans<F>(plan: F) -> Self
    where
        F: Fn(&Parts) -> RateLimiter + Send + Sync + 'static,
    {
        Self::from_parts(
            RateLimiting {
                plan: Plan::ByRequest(Arc::new(plan)),
                fields: false,
            },
            Unkeyed,
        )
    }
}

impl<K> RateLimitLayer<K> {
    /// Adds the `RateLimit-Policy` and `RateLimit` fields to every admitted response too
    /// (a refused one always has them): what each policy allows, and what the key has
    /// left.
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use lockwarden::{LockClient, RateLimitLayer, RatePolicy};
    /// # let client = LockClient::in_memory();
    /// # let api = client.rate_limiter("api", [RatePolicy::new("burst", 100, Duration::from_secs(60))])?;
    /// let layer = RateLimitLayer::limiter(api).by_header("X-Api-Key").rate_limit_headers();
    /// # let _ = layer;
    /// # Ok::<(), lockwarden::LockError>(())
    /// ```
    pub fn rate_limit_headers(mut self) -> Self {
        self.policy_mut().fields = true;
        self
    }
}

impl KeyedLater for RateLimiting {}

/// The `RateLimit-Policy` and `RateLimit` fields of a decision.
fn fields(decision: &RateDecision) -> [(http::HeaderName, HeaderValue); 2] {
    let states = decision.policies();
    [
        (
            RATELIMIT_POLICY,
            ratelimit_fields::policies(states.iter().map(|s| s.policy())),
        ),
        (RATELIMIT, ratelimit_fields::limits(states)),
    ]
}

impl Policy for RateLimiting {
    type Grant = RateDecision;
    /// The fields an admitted response gets, if it gets them.
    type Taken = Option<[(http::HeaderName, HeaderValue); 2]>;
    type Run<F: Future> = F;

    const ADMITTED: Answered<'static> = Answered::Allowed;
    const OUTCOME: &'static str = "allowed";
    const BY: &'static str = "the rate limit layer";
    const TAKES: &'static str = "its rate limit";

    fn name(&self, scope: Option<&str>, key: &str) -> String {
        scoped_name("", scope, key)
    }

    fn admit(
        &self,
        parts: &Parts,
        name: String,
        _fingerprint: Option<RequestFingerprint>,
        _route: &Route,
    ) -> BoxFuture<Verdict<RateDecision>> {
        let limiter = self.plan.of(parts);
        Box::pin(async move {
            match limiter.check(&name).await {
                Ok(decision) if decision.is_allowed() => Verdict::Admit(decision),
                Ok(decision) => {
                    let mut refusal = Refusal::from(Rejection::QuotaExceeded {
                        retry_after: decision.retry_after().unwrap_or_default(),
                        violated_policies: decision
                            .refused_by()
                            .map(|state| state.policy().name().to_owned())
                            .collect(),
                    });
                    refusal.headers.extend(fields(&decision));
                    Verdict::Refuse(refusal)
                }
                Err(error @ LockError::Backend(_)) => Verdict::Fail(error),
                Err(error) => Verdict::Refuse(Refusal {
                    rejection: Rejection::from_lock_error(&error),
                    cause: Some(error),
                    headers: http::HeaderMap::new(),
                }),
            }
        })
    }

    /// The request carries its [`RateDecision`].
    fn take(
        &self,
        decision: RateDecision,
        extensions: &mut Extensions,
        _span: &Span,
        _route: &Route,
    ) -> Self::Taken {
        let fields = self.fields.then(|| fields(&decision));
        extensions.insert(decision);
        fields
    }

    fn run<F: Future>(_taken: &Self::Taken, fut: F) -> F {
        fut
    }

    fn poll_lost(_taken: &mut Self::Taken, _cx: &mut Context<'_>) -> Poll<()> {
        Poll::Pending
    }

    fn respond(&self, taken: Self::Taken, head: &mut http::response::Parts) -> Option<Held> {
        if let Some(fields) = taken {
            head.headers.extend(fields);
        }
        None
    }

    fn give_back(_taken: Self::Taken) -> Option<Held> {
        None
    }
}
