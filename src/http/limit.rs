//! [`LimitLayer`] and the builder methods only it has (the capacity, the status when
//! full, a global limit); where the key comes from and how a permit is held are shared
//! with the lock layer (`settings.rs`).

use std::sync::Arc;

use http::request::Parts;
use http::StatusCode;
use tower_layer::Layer;

use super::config::{Capacity, Config};
use super::key::Global;
use super::service::{LockService, Missing};
use super::settings::layer_settings;
use crate::MAX_PERMITS;
use crate::{Key, LockGuard, LostSignal};

/// A tower layer that limits how many requests with the same key run at once, across
/// every replica of the service: each request holds a permit of a
/// [`Semaphore`](crate::Semaphore) named by its key while the inner service runs and
/// while the response body streams.
///
/// Pick the key as for a [`LockLayer`](super::LockLayer) ([`by_header`](Self::by_header),
/// [`by_path`](Self::by_path), [`by_path_param`](Self::by_path_param),
/// [`by_json_field`](Self::by_json_field), [`by`](Self::by)) or one limit for every
/// request ([`global`](Self::global)), then the capacity: [`permits`](Self::permits), or
/// [`permits_by`](Self::permits_by) from the request (a tenant's tier).
///
/// A request that finds every permit taken waits within [`wait`](Self::wait) (default:
/// none), then is answered **429 Too Many Requests** (or [`full_status`](Self::full_status))
/// with `Retry-After` and an RFC 9457 `application/problem+json` body
/// (`urn:lockwarden:problem:limit-reached`), without reaching the handler. The permit is
/// held while the handler runs and while the body streams, and given back when the body
/// ends, is dropped, when the client goes away or the handler panics, exactly as the lock
/// layer holds its lock. The store down: `503`, or let through with
/// [`fail_open`](Self::fail_open). A capacity of 0 or above
/// [`MAX_PERMITS`](crate::MAX_PERMITS) is a misconfiguration: such requests are answered
/// `500` (`invalid-limit`) and logged, nothing is held. The request carries a
/// [`PermitInfo`](super::PermitInfo) in its extensions.
///
/// Each key's semaphore is named `<name prefix>[<scope>/]<key>`: the prefix is
/// [`name_prefix`](Self::name_prefix), by default
/// [`DEFAULT_LIMIT_PREFIX`](super::DEFAULT_LIMIT_PREFIX) (`http-limit:`, not the lock
/// layer's `http:`, so a lock and a limit on one key never share a name), the scope is
/// [`scope`](Self::scope)'s, escaped as the lock layer's is; a [`global`](Self::global)
/// limit's is `<name prefix><name>`. The name goes under the client's Redis namespace
/// like every lock name: with the defaults, a tenant `acme` limited by
/// `by_header("X-Tenant")` holds permits of the semaphore `http-limit:acme`, the Redis
/// hash `lockwarden:{http-limit:acme}`, which the inspector lists and
/// [`LockClient::semaphore`](crate::LockClient::semaphore) reaches:
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
///         LimitLayer::by_header("X-Tenant")
///             .client(locks)
///             .permits_by(|parts| match parts.extensions.get::<Tier>() {
///                 Some(Tier("paid")) => 20,
///                 _ => 2,
///             }),
///     );
/// ```
#[derive(Clone)]
#[must_use = "a layer does nothing until it wraps a service"]
pub struct LimitLayer<K> {
    pub(crate) source: K,
    pub(crate) config: Arc<Config>,
    /// The source's answer to a request without a key, shared by every service the layer
    /// makes: axum may make one per request.
    missing: Missing,
}

layer_settings!(
    LimitLayer,
    "permit",
    Config::limit(),
    "LimitLayer::by_path().permits(5)"
);

impl LimitLayer<Global> {
    /// One limit for every request: at most the capacity at once, whatever they carry,
    /// across every replica. `name` names its semaphore (give each global limit its own).
    ///
    /// ```
    /// use lockwarden::LimitLayer;
    /// // At most 4 report renderings at once, service-wide.
    /// let layer = LimitLayer::global("report-rendering").permits(4);
    /// # let _ = layer;
    /// ```
    pub fn global(name: &str) -> Self {
        Self::new(Global::new(name))
    }
}

impl<K> LimitLayer<K> {
    /// At most `permits` requests with the same key at once. A capacity of 0 or above
    /// [`MAX_PERMITS`](crate::MAX_PERMITS) answers every request `500` (`invalid-limit`).
    ///
    /// ```
    /// use lockwarden::LimitLayer;
    /// let layer = LimitLayer::by_header("X-Tenant").permits(5);
    /// # let _ = layer;
    /// ```
    pub fn permits(mut self, permits: u32) -> Self {
        self.config().permits = Some(Capacity::Fixed(permits));
        self
    }

    /// The capacity of each request's key, from the request head: e.g. by the tenant's
    /// plan. While a key's semaphore is in use its stored capacity counts, so a new tier
    /// applies once the key's requests have all ended.
    ///
    /// ```
    /// use lockwarden::LimitLayer;
    /// let layer = LimitLayer::by_header("X-Tenant").permits_by(|parts| {
    ///     match parts.headers.get("x-plan").and_then(|v| v.to_str().ok()) {
    ///         Some("paid") => 20,
    ///         _ => 2,
    ///     }
    /// });
    /// # let _ = layer;
    /// ```
    pub fn permits_by<F>(mut self, permits: F) -> Self
    where
        F: Fn(&Parts) -> u32 + Send + Sync + 'static,
    {
        self.config().permits = Some(Capacity::ByRequest(Arc::new(permits)));
        self
    }

    /// The status of the answer to a request that finds every permit taken: `429 Too
    /// Many Requests` (default) or `503 Service Unavailable`.
    ///
    /// ```
    /// use axum::http::StatusCode;
    /// use lockwarden::LimitLayer;
    ///
    /// let layer = LimitLayer::by_path().permits(8).full_status(StatusCode::SERVICE_UNAVAILABLE);
    /// # let _ = layer;
    /// ```
    pub fn full_status(mut self, status: StatusCode) -> Self {
        self.config().refused_status = status;
        self
    }
}

impl<S, K: Clone> Layer<S> for LimitLayer<K> {
    type Service = LockService<S, K>;

    fn layer(&self, inner: S) -> Self::Service {
        if self.config.client.is_none() {
            super::client::warn_if_unconfigured();
        }
        if let Some(Capacity::Fixed(permits)) = self.config.permits {
            if permits == 0 || permits > MAX_PERMITS {
                tracing::error!(
                    permits,
                    "LimitLayer: a capacity of {permits} permits (1 to {MAX_PERMITS} allowed; \
                     set it with .permits(n)); every request is answered 500"
                );
            }
        }
        LockService::from_parts(
            inner,
            self.source.clone(),
            self.config.clone(),
            self.missing.clone(),
        )
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
///     .layer(LimitLayer::global("exports").permits(3).client(LockClient::in_memory()));
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
