//! What the policies that hold something share (a lock, [`Locking`](super::Locking) and
//! [`Replaying`](super::Replaying); a permit, [`Limiting`](super::Limiting)): their
//! settings ([`Hold`]) and the builder methods that set them, the client (the default one
//! connected within a budget), an acquisition and the answer to its refusal, and what a
//! request keeps while it holds ([`Kept`]). The extractors acquire through the same
//! functions.

use std::future::Future;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http::{HeaderMap, StatusCode};
use tracing::Span;

use super::admission::{BoxFuture, Refusal, Verdict};
use super::client::{default_client, ready_default_client, warn_if_unconfigured};
use super::config::scoped_name;
use super::held::Held;
use super::layer::KeyedLayer;
use super::metrics::Route;
use super::rejection::Rejection;
use super::retry_after::{HoldTimes, LayerHoldTimes};
use crate::{BackendError, LockClient, LockError, LockGuard};

/// How long a request waits for the default client to connect before it is answered 503.
const CONNECT_BUDGET: Duration = Duration::from_secs(3);

/// The settings of a policy whose requests hold a lock or a permit.
#[derive(Clone, Debug)]
pub struct Hold {
    pub(crate) client: Option<LockClient>,
    pub(crate) name_prefix: Arc<str>,
    pub(crate) wait: Duration,
    pub(crate) lease: Option<Duration>,
    /// The status of a refusal: 409 or 423 for a busy lock, 429 or 503 for a full limit.
    pub(crate) refused_status: StatusCode,
    pub(crate) abort_on_loss: bool,
    /// How long the layer's holds last: its `Retry-After` estimates.
    pub(crate) hold_times: LayerHoldTimes,
}

impl Hold {
    pub(crate) fn new(name_prefix: &str, refused_status: StatusCode) -> Self {
        Self {
            client: None,
            name_prefix: name_prefix.into(),
            wait: Duration::ZERO,
            lease: None,
            refused_status,
            abort_on_loss: false,
            hold_times: LayerHoldTimes::default(),
        }
    }

    /// Says at start-up when the layer has no client and `REDIS_URL` is not set.
    pub(crate) fn layered(&self) {
        if self.client.is_none() {
            warn_if_unconfigured();
        }
    }

    pub(crate) fn name(&self, scope: Option<&str>, key: &str) -> String {
        scoped_name(&self.name_prefix, scope, key)
    }

    /// An acquisition: the client (the default one connected first if it is not yet),
    /// then `attempt` with it; `granted` makes the verdict of what it took, and a refusal
    /// is answered by `busy` with this layer's estimate of when to retry, and `fields`.
    pub(crate) fn acquire<T, G, A, Fut>(
        &self,
        route: &Route,
        (busy, fields): (fn(StatusCode, Duration) -> Rejection, HeaderMap),
        attempt: A,
        granted: impl FnOnce(T, LockClient) -> Verdict<G> + Send + 'static,
    ) -> BoxFuture<Verdict<G>>
    where
        A: FnOnce(&LockClient) -> Fut + Send + 'static,
        Fut: Future<Output = Result<T, LockError>> + Send,
    {
        let client = self.client.clone().or_else(ready_default_client);
        let times = self.hold_times.0.clone();
        let status = self.refused_status;
        let route = route.clone();
        Box::pin(async move {
            let client = match connected(client).await {
                Ok(client) => client,
                Err(error) => return Verdict::Fail(error),
            };
            match attempt(&client).await {
                Ok(taken) => granted(taken, client),
                Err(error @ LockError::Backend(_)) => Verdict::Fail(error),
                Err(error) => {
                    let busy_now = matches!(error, LockError::Timeout { .. });
                    let on_busy = |retry_after| busy(status, retry_after);
                    let mut refusal = refusal(error, &client, &times, route.as_str(), on_busy);
                    if busy_now {
                        refusal.headers = fields;
                    }
                    Verdict::Refuse(refusal)
                }
            }
        })
    }

    /// Starts holding `guard` for a request: its hold counted in the layer's hold times,
    /// its loss watched when the layer aborts on loss.
    pub(crate) fn keep(&self, guard: LockGuard, span: &Span, route: &Route) -> Kept {
        let lost = self.abort_on_loss.then(|| {
            let lost = guard.lost_signal();
            Box::pin(async move { lost.wait().await }) as BoxFuture<()>
        });
        let ticket = self.hold_times.0.begin(guard.key(), route.as_str());
        Kept {
            held: Held::new(guard, span.clone(), ticket),
            lost,
        }
    }
}

/// What a request keeps while its handler runs: its hold, and the watch on its loss when
/// the layer aborts on loss.
pub struct Kept {
    pub(crate) held: Held,
    lost: Option<BoxFuture<()>>,
}

impl Kept {
    pub(crate) fn poll_lost(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        match &mut self.lost {
            Some(lost) => lost.as_mut().poll(cx),
            None => Poll::Pending,
        }
    }
}

/// `client`, or the default client: at once if it is connected, else connected within
/// [`CONNECT_BUDGET`].
pub(crate) async fn connected(client: Option<LockClient>) -> Result<LockClient, LockError> {
    if let Some(client) = client {
        return Ok(client);
    }
    match tokio::time::timeout(CONNECT_BUDGET, default_client()).await {
        Ok(connected) => connected,
        Err(_) => Err(LockError::Backend(BackendError::TimedOut(CONNECT_BUDGET))),
    }
}

/// The answer to an acquisition by `client` refused with `error`: a busy lock or full
/// limit (`busy`, with the `Retry-After` estimated from `times` on `route`), or what
/// the error says.
pub(crate) fn refusal(
    error: LockError,
    client: &LockClient,
    times: &HoldTimes,
    route: Option<&str>,
    busy: impl FnOnce(Duration) -> Rejection,
) -> Refusal {
    let rejection = match &error {
        // The engine names the lock by the name it was given, which made a key before.
        LockError::Timeout { key, retry_after } => match client.key(key) {
            Ok(key) => busy(times.retry_after(&key, route, *retry_after)),
            Err(_) => busy(*retry_after),
        },
        error => Rejection::from_lock_error(error),
    };
    Refusal {
        rejection,
        cause: Some(error),
        headers: HeaderMap::new(),
    }
}

/// The policies whose requests hold a lock or a permit: [`Locking`](super::Locking),
/// [`Replaying`](super::Replaying), [`Limiting`](super::Limiting).
pub trait Holds: super::admission::sealed::Policy {
    /// The settings of the hold, for the builder.
    fn hold_mut(&mut self) -> &mut Hold;
}

impl<P: Holds, K> KeyedLayer<P, K> {
    fn hold(&mut self) -> &mut Hold {
        self.policy_mut().hold_mut()
    }

    /// Takes the locks or permits with `client` (default:
    /// [`default_client`](super::default_client), Redis at `REDIS_URL`).
    ///
    /// ```
    /// use lockwarden::{LimitLayer, LockClient, LockLayer};
    /// let locks = LockClient::in_memory(); // LockClient::connect(url).await? for Redis
    /// let layer = LockLayer::by_header("Idempotency-Key").client(locks.clone());
    /// let limit = LimitLayer::permits(5).by_header("X-Tenant").client(locks);
    /// # let _ = (layer, limit);
    /// ```
    pub fn client(mut self, client: LockClient) -> Self {
        self.hold().client = Some(client);
        self
    }

    /// Starts every name this layer makes with `prefix` (default
    /// [`DEFAULT_NAME_PREFIX`](super::DEFAULT_NAME_PREFIX) for locks,
    /// [`DEFAULT_LIMIT_PREFIX`](super::DEFAULT_LIMIT_PREFIX) for limits); give layers
    /// that must not share locks or permits different prefixes. The name then goes under
    /// the client's Redis key namespace
    /// ([`LockClientBuilder::namespace`](crate::LockClientBuilder::namespace)).
    ///
    /// ```
    /// use lockwarden::LockLayer;
    /// let layer = LockLayer::by_path().name_prefix("billing:");
    /// # let _ = layer;
    /// ```
    pub fn name_prefix(mut self, prefix: impl Into<Arc<str>>) -> Self {
        self.hold().name_prefix = prefix.into();
        self
    }

    /// Waits up to `wait` for the lock or a permit before refusing the request (default:
    /// zero, one attempt).
    ///
    /// ```
    /// use lockwarden::LimitLayer;
    /// use std::time::Duration;
    /// let layer = LimitLayer::permits(5).by_path().wait(Duration::from_secs(2));
    /// # let _ = layer;
    /// ```
    pub fn wait(mut self, wait: Duration) -> Self {
        self.hold().wait = wait;
        self
    }

    /// Holds each lock or permit for a fixed `lease` instead of renewing it with the
    /// watchdog: a request still running after `lease` loses it (see
    /// [`abort_on_loss`](Self::abort_on_loss)).
    ///
    /// ```
    /// use lockwarden::LockLayer;
    /// use std::time::Duration;
    /// let layer = LockLayer::by_path().lease(Duration::from_secs(60));
    /// # let _ = layer;
    /// ```
    pub fn lease(mut self, lease: Duration) -> Self {
        self.hold().lease = Some(lease);
        self
    }

    /// Stops the inner service and answers `503` when the lock or permit is lost while
    /// it runs (by default the loss is logged and visible through the request's
    /// extension only).
    ///
    /// ```
    /// use lockwarden::LockLayer;
    /// let layer = LockLayer::by_path().abort_on_loss();
    /// # let _ = layer;
    /// ```
    pub fn abort_on_loss(mut self) -> Self {
        self.hold().abort_on_loss = true;
        self
    }
}
