//! [`LockLayer`] and its builder methods: where the key comes from and how the lock is
//! taken, in one cloneable value that wraps services into [`LockService`]. The settings
//! themselves are in `config.rs`.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::request::Parts;
use http::StatusCode;
use http_body_util::Full;
use tower_layer::Layer;

use super::config::{Config, MissingKey, DEFAULT_BODY_LIMIT};
#[cfg(feature = "axum")]
use super::key::FromPathParam;
use super::key::{FromFn, FromHeader, FromJsonField, FromPath, KeySource};
use super::remember::config::Remembering;
use super::remember::{Fingerprint, Remember};
use super::service::{LockService, Missing};
use crate::LockClient;

/// A tower layer that holds a distributed lock, keyed by something in the request, for
/// the whole life of each request: while the inner service runs and while the response
/// body streams.
///
/// Pick the key with a constructor ([`by_header`](Self::by_header), [`by_path`](Self::by_path),
/// [`by_path_param`](Self::by_path_param), [`by_json_field`](Self::by_json_field),
/// [`by`](Self::by)), then adjust. Defaults: fail fast (no wait), watchdog lease, `409`,
/// reject requests without a key, fail closed (`503`) when the store is down, the
/// process-wide [`default_client`](super::default_client).
///
/// ```
/// use axum::{routing::post, Router};
/// use lockwarden::{LockClient, LockLayer};
/// use std::time::Duration;
///
/// let locks = LockClient::in_memory(); // LockClient::connect(url).await? for Redis
/// let app: Router = Router::new()
///     .route("/webhooks/payments", post(|| async { "ok" }))
///     .layer(
///         LockLayer::by_header("Idempotency-Key")
///             .client(locks)
///             .scope(|parts| parts.headers.get("x-api-key")?.to_str().ok().map(str::to_owned))
///             .wait(Duration::from_millis(100))
///             .conflict_status(http::StatusCode::LOCKED),
///     );
/// ```
///
/// Without [`scope`](Self::scope), keys are global: any client that sends the same key as
/// another blocks it (or learns that the key is in use). Scope keys by the authenticated
/// principal unless that is what you want.
#[derive(Clone)]
#[must_use = "a layer does nothing until it wraps a service"]
pub struct LockLayer<K> {
    pub(crate) source: K,
    pub(crate) config: Arc<Config>,
    /// The source's answer to a request without a key, shared by every service the layer
    /// makes: axum may make one per request.
    missing: Missing,
}

impl<K: fmt::Debug> fmt::Debug for LockLayer<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockLayer")
            .field("source", &self.source)
            .field("config", &self.config)
            .finish()
    }
}

impl LockLayer<FromHeader> {
    /// Keys requests by the value of header `name` (e.g. `Idempotency-Key`).
    ///
    /// ```
    /// use lockwarden::LockLayer;
    /// let layer = LockLayer::by_header("Idempotency-Key");
    /// # let _ = layer;
    /// ```
    ///
    /// # Panics
    /// If `name` is not a valid header name.
    pub fn by_header<N>(name: N) -> Self
    where
        N: TryInto<http::HeaderName>,
        N::Error: fmt::Debug,
    {
        Self::new(FromHeader::new(name))
    }
}

impl LockLayer<FromPath> {
    /// Keys requests by their path (without the query string).
    ///
    /// ```
    /// use lockwarden::LockLayer;
    /// let layer = LockLayer::by_path();
    /// # let _ = layer;
    /// ```
    pub fn by_path() -> Self {
        Self::new(FromPath)
    }
}

#[cfg(feature = "axum")]
impl LockLayer<FromPathParam> {
    /// Keys requests by the axum path parameter `name`. Add it with `Router::route_layer`
    /// (the parameters are known only once a route has matched).
    ///
    /// ```
    /// use axum::{routing::post, Router};
    /// use lockwarden::LockLayer;
    ///
    /// let app: Router = Router::new()
    ///     .route("/orders/{id}/ship", post(|| async { "shipped" }))
    ///     .route_layer(LockLayer::by_path_param("id"));
    /// ```
    pub fn by_path_param(name: &str) -> Self {
        Self::new(FromPathParam::new(name))
    }
}

impl LockLayer<FromJsonField> {
    /// Keys requests by a field of their JSON body, named by a JSON Pointer such as
    /// `/data/object/id`. The body is read up to [`DEFAULT_BODY_LIMIT`] (see
    /// [`body_limit`](Self::body_limit)) and handed on unchanged as a
    /// `http_body_util::Full<Bytes>`. See [`FromJsonField`] for the answers to bad bodies.
    ///
    /// ```
    /// use axum::{routing::post, Router};
    /// use lockwarden::LockLayer;
    ///
    /// let app: Router = Router::new()
    ///     .route("/webhooks/stripe", post(|body: String| async move { body }))
    ///     .layer(LockLayer::by_json_field("/data/object/id"));
    /// ```
    ///
    /// # Panics
    /// If `pointer` is not empty and does not start with `/`.
    pub fn by_json_field(pointer: &str) -> Self {
        Self::new(FromJsonField::new(pointer, DEFAULT_BODY_LIMIT))
    }

    /// Reads at most `bytes` of body; longer bodies are answered `413`.
    ///
    /// ```
    /// use lockwarden::LockLayer;
    /// let layer = LockLayer::by_json_field("/id").body_limit(1024 * 1024);
    /// # let _ = layer;
    /// ```
    pub fn body_limit(mut self, bytes: usize) -> Self {
        self.source_mut().set_limit(bytes);
        self
    }
}

impl<F> LockLayer<FromFn<F>>
where
    F: Fn(&Parts) -> Option<String> + Clone,
{
    /// Keys requests by a closure over the request head; `None` means "no key".
    ///
    /// ```
    /// use lockwarden::LockLayer;
    /// let layer = LockLayer::by(|parts| {
    ///     let tenant = parts.headers.get("x-tenant")?.to_str().ok()?;
    ///     Some(format!("{tenant}:{}", parts.uri.path()))
    /// });
    /// # let _ = layer;
    /// ```
    pub fn by(f: F) -> Self {
        Self::new(FromFn::new(f))
    }
}

impl<K> LockLayer<K> {
    /// A layer with any key source (see [`KeySource`] and
    /// [`PartsKey`](super::PartsKey)).
    ///
    /// ```
    /// use lockwarden::{LockLayer, http::FromPath};
    /// let layer = LockLayer::new(FromPath);
    /// # let _ = layer;
    /// ```
    pub fn new(source: K) -> Self {
        Self {
            source,
            config: Arc::new(Config::default()),
            missing: Missing::default(),
        }
    }

    fn config(&mut self) -> &mut Config {
        Arc::make_mut(&mut self.config)
    }

    /// The source, to change it: the answer made from the old one no longer applies.
    fn source_mut(&mut self) -> &mut K {
        self.missing = Missing::default();
        &mut self.source
    }

    /// Uses `client` for the locks (default: [`default_client`](super::default_client)).
    ///
    /// ```
    /// use lockwarden::{LockClient, LockLayer};
    /// let layer = LockLayer::by_path().client(LockClient::in_memory());
    /// # let _ = layer;
    /// ```
    pub fn client(mut self, client: LockClient) -> Self {
        self.config().client = Some(client);
        self
    }

    /// Prefixes every lock name (default
    /// [`DEFAULT_HTTP_NAMESPACE`](super::DEFAULT_HTTP_NAMESPACE)); give layers that must not
    /// share locks different namespaces.
    ///
    /// ```
    /// use lockwarden::LockLayer;
    /// let layer = LockLayer::by_path().namespace("billing:");
    /// # let _ = layer;
    /// ```
    pub fn namespace(mut self, namespace: impl Into<Arc<str>>) -> Self {
        self.config().namespace = namespace.into();
        self
    }

    /// Places each key under a scope taken from the request, typically the authenticated
    /// principal, so one client's keys can never block or collide with another's. A
    /// request whose scope is `None` is treated as one without a key.
    ///
    /// ```
    /// use lockwarden::LockLayer;
    ///
    /// #[derive(Clone)]
    /// struct User(String); // put into the extensions by your auth layer
    ///
    /// let layer = LockLayer::by_header("Idempotency-Key")
    ///     .scope(|parts| parts.extensions.get::<User>().map(|u| u.0.clone()));
    /// # let _ = layer;
    /// ```
    pub fn scope<F>(mut self, scope: F) -> Self
    where
        F: Fn(&Parts) -> Option<String> + Send + Sync + 'static,
    {
        self.config().scope = Some(Arc::new(scope));
        self
    }

    /// Waits up to `wait` for a busy lock before answering `409` (default: zero, one
    /// attempt, as a duplicate of an idempotent request is best answered at once).
    ///
    /// ```
    /// use lockwarden::LockLayer;
    /// use std::time::Duration;
    /// let layer = LockLayer::by_path().wait(Duration::from_secs(2));
    /// # let _ = layer;
    /// ```
    pub fn wait(mut self, wait: Duration) -> Self {
        self.config().wait = wait;
        self
    }

    /// Holds each lock for a fixed `lease` instead of renewing it with the watchdog: a
    /// request still running after `lease` loses its lock (see
    /// [`abort_on_loss`](Self::abort_on_loss)).
    ///
    /// ```
    /// use lockwarden::LockLayer;
    /// use std::time::Duration;
    /// let layer = LockLayer::by_path().lease(Duration::from_secs(60));
    /// # let _ = layer;
    /// ```
    pub fn lease(mut self, lease: Duration) -> Self {
        self.config().lease = Some(lease);
        self
    }

    /// The status of the answer to a request that finds its lock busy: `409 Conflict`
    /// (default) or `423 Locked`.
    ///
    /// ```
    /// use lockwarden::LockLayer;
    /// let layer = LockLayer::by_path().conflict_status(http::StatusCode::LOCKED);
    /// # let _ = layer;
    /// ```
    pub fn conflict_status(mut self, status: StatusCode) -> Self {
        self.config().conflict_status = status;
        self
    }

    /// What to do with a request without a key (default [`MissingKey::Reject`]).
    ///
    /// ```
    /// use lockwarden::{LockLayer, MissingKey};
    /// let layer = LockLayer::by_header("Idempotency-Key").on_missing_key(MissingKey::PassUnlocked);
    /// # let _ = layer;
    /// ```
    pub fn on_missing_key(mut self, policy: MissingKey) -> Self {
        self.config().missing_key = policy;
        self
    }

    /// Lets requests through without a lock (logging a warning) when the lock store
    /// cannot be reached, instead of answering `503`.
    ///
    /// ```
    /// use lockwarden::LockLayer;
    /// let layer = LockLayer::by_path().fail_open();
    /// # let _ = layer;
    /// ```
    pub fn fail_open(mut self) -> Self {
        self.config().fail_open = true;
        self
    }

    /// Stops the inner service and answers `503` when the lock is lost while it runs
    /// (by default the loss is logged and visible through the request's
    /// [`LockInfo`](crate::LockInfo) extension only).
    ///
    /// ```
    /// use lockwarden::LockLayer;
    /// let layer = LockLayer::by_path().abort_on_loss();
    /// # let _ = layer;
    /// ```
    pub fn abort_on_loss(mut self) -> Self {
        self.config().abort_on_loss = true;
        self
    }

    /// Logs a hash of each key instead of the key (for keys that are secrets or personal
    /// data): a SipHash under a random key drawn once per process, so log lines of one key
    /// correlate within a process, and a key cannot be recovered by hashing guesses.
    ///
    /// ```
    /// use lockwarden::LockLayer;
    /// let layer = LockLayer::by_header("Idempotency-Key").redact_keys();
    /// # let _ = layer;
    /// ```
    pub fn redact_keys(mut self) -> Self {
        self.config().redact_keys = true;
        self
    }
}

impl<K> LockLayer<K> {
    /// Makes the layer an idempotency layer: a request whose response completed is
    /// remembered for `keep` (e.g. 24 h), and a retry with the same key is answered with
    /// the stored status, `content-type` (plus [`replay_header`](LockLayer::replay_header)s)
    /// and body, with `Idempotency-Replayed: true`, without reaching the handler.
    ///
    /// A key is then in one of three states, moved atomically in the store: *in flight*
    /// (the lock: a duplicate gets `409`, or waits within [`wait`](Self::wait) and then
    /// gets the replay), *completed* (the stored response), or *absent*.
    ///
    /// - The body is read (up to [`body_limit`](LockLayer::body_limit), default 64 KiB)
    ///   to fingerprint the request; a retry whose [`Fingerprint`] differs from the stored
    ///   one is answered `422` (`idempotency-key-reused`). A duplicate in flight is
    ///   answered `409` whatever its fingerprint: the first one's is not known yet.
    /// - 2xx and 4xx responses are stored, 5xx are not and free the key, so the client can
    ///   retry ([`store_if`](LockLayer::store_if) changes that). A response whose body is
    ///   longer than [`max_stored_body`](LockLayer::max_stored_body) (1 MiB) is sent but
    ///   not stored: the key is freed and a retry runs the handler again.
    /// - A handler that panics, a body that fails mid-way and a client that goes away store
    ///   nothing; the key is freed at once (at the latest when the lease runs out).
    /// - The response is stored before its last byte is sent, so a client that has it can
    ///   retry at once and be answered from the store.
    /// - Stored responses live in Redis, as completed claims do: they outlive a Redis
    ///   restart only as far as Redis persists them (with `appendonly yes` and
    ///   `appendfsync always`, every one it answered; without persistence, none: a retry
    ///   after the restart runs the handler again). See
    ///   [`Lock::try_claim`](lockwarden_core::Lock::try_claim).
    ///
    /// Scope keys by the principal ([`scope`](Self::scope)): with unscoped keys, a client
    /// that guesses another's key is answered with the other's stored response.
    ///
    /// ```
    /// use axum::{routing::post, Router};
    /// use lockwarden::{LockClient, LockLayer};
    /// use std::time::Duration;
    ///
    /// let app: Router = Router::new()
    ///     .route("/payments", post(|| async { "charged" }))
    ///     .layer(
    ///         LockLayer::by_header("Idempotency-Key")
    ///             .client(LockClient::in_memory())
    ///             .scope(|parts| parts.headers.get("x-api-key")?.to_str().ok().map(str::to_owned))
    ///             .remember(Duration::from_secs(24 * 3600)),
    ///     );
    /// ```
    pub fn remember(mut self, keep: Duration) -> LockLayer<Remember<K>>
    where
        K: KeySource<Full<Bytes>>,
    {
        let limit = self.source.body_limit().unwrap_or(DEFAULT_BODY_LIMIT);
        self.config().remember = Some(Remembering::new(keep));
        LockLayer {
            source: Remember::new(self.source, limit),
            config: self.config,
            missing: Missing::default(),
        }
    }
}

impl<K> LockLayer<Remember<K>> {
    fn remembering(&mut self) -> &mut Remembering {
        // `remember` set it; a layer of this type without it cannot be made.
        self.config()
            .remember
            .get_or_insert_with(|| Remembering::new(Duration::from_secs(24 * 3600)))
    }

    /// What identifies a retry of the same request (default: method, path and body).
    ///
    /// ```
    /// use lockwarden::{Fingerprint, LockLayer};
    /// # use std::time::Duration;
    /// let layer = LockLayer::by_header("Idempotency-Key")
    ///     .remember(Duration::from_secs(3600))
    ///     .fingerprint(Fingerprint::json_fields(["/order_id", "/amount"]));
    /// # let _ = layer;
    /// ```
    pub fn fingerprint(mut self, fingerprint: Fingerprint) -> Self {
        self.source_mut().set_fingerprint(fingerprint);
        self
    }

    /// Reads at most `bytes` of request body to fingerprint it; longer bodies are
    /// answered `413`. (With [`by_json_field`](LockLayer::by_json_field), set the field's
    /// limit before `remember`: `remember` starts from it.)
    ///
    /// ```
    /// # use lockwarden::LockLayer;
    /// # use std::time::Duration;
    /// let layer = LockLayer::by_header("Idempotency-Key")
    ///     .remember(Duration::from_secs(3600))
    ///     .body_limit(256 * 1024);
    /// # let _ = layer;
    /// ```
    pub fn body_limit(mut self, bytes: usize) -> Self {
        self.source_mut().set_limit(bytes);
        self
    }

    /// Stores response bodies up to `bytes` (default
    /// [`DEFAULT_MAX_STORED_BODY`](super::DEFAULT_MAX_STORED_BODY), 1 MiB); a longer one
    /// is sent but not remembered, and a retry runs the handler again.
    ///
    /// ```
    /// # use lockwarden::LockLayer;
    /// # use std::time::Duration;
    /// let layer = LockLayer::by_header("Idempotency-Key")
    ///     .remember(Duration::from_secs(3600))
    ///     .max_stored_body(64 * 1024);
    /// # let _ = layer;
    /// ```
    pub fn max_stored_body(mut self, bytes: usize) -> Self {
        self.remembering().max_stored_body = bytes;
        self
    }

    /// Which responses are remembered, by status (default: 2xx and 4xx). A response that
    /// is not remembered frees its key, so a retry runs the handler again.
    ///
    /// ```
    /// # use lockwarden::LockLayer;
    /// # use std::time::Duration;
    /// // Only successes are final here; a 409 from the handler may be retried.
    /// let layer = LockLayer::by_header("Idempotency-Key")
    ///     .remember(Duration::from_secs(3600))
    ///     .store_if(|status| status.is_success());
    /// # let _ = layer;
    /// ```
    pub fn store_if<F>(mut self, store_if: F) -> Self
    where
        F: Fn(StatusCode) -> bool + Send + Sync + 'static,
    {
        self.remembering().store_if = Arc::new(store_if);
        self
    }

    /// Replays header `name` too (`content-type` always is); e.g. `location`.
    ///
    /// ```
    /// # use lockwarden::LockLayer;
    /// # use std::time::Duration;
    /// let layer = LockLayer::by_header("Idempotency-Key")
    ///     .remember(Duration::from_secs(3600))
    ///     .replay_header(http::header::LOCATION);
    /// # let _ = layer;
    /// ```
    pub fn replay_header(mut self, name: http::HeaderName) -> Self {
        self.remembering().replay_headers.push(name);
        self
    }
}

impl<S, K: Clone> Layer<S> for LockLayer<K> {
    type Service = LockService<S, K>;

    fn layer(&self, inner: S) -> Self::Service {
        LockService::from_parts(
            inner,
            self.source.clone(),
            self.config.clone(),
            self.missing.clone(),
        )
    }
}
