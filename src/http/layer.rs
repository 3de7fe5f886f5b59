//! [`LockLayer`] and the builder methods only it has (the busy status, idempotent
//! replay); where the key comes from and how the lock is held are shared with the limit
//! layer (`settings.rs`). The settings themselves are in `config.rs`.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::StatusCode;
use http_body_util::Full;
use tower_layer::Layer;

use super::config::{Config, DEFAULT_BODY_LIMIT};
use super::key::KeySource;
use super::remember::config::Remembering;
use super::remember::{Fingerprint, Remember};
use super::service::{LockService, Missing};
use super::settings::layer_settings;

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

layer_settings!(LockLayer, "lock", Config::default(), "LockLayer::by_path()");

impl<K> LockLayer<K> {
    /// The status of the answer to a request that finds its lock busy: `409 Conflict`
    /// (default) or `423 Locked`.
    ///
    /// ```
    /// use lockwarden::LockLayer;
    /// let layer = LockLayer::by_path().conflict_status(http::StatusCode::LOCKED);
    /// # let _ = layer;
    /// ```
    pub fn conflict_status(mut self, status: StatusCode) -> Self {
        self.config().refused_status = status;
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

    /// Reads at most `bytes` of request body (default [`DEFAULT_BODY_LIMIT`], 64 KiB) to
    /// fingerprint it, and to find the key in it with
    /// [`by_json_field`](LockLayer::by_json_field): one limit for both; longer bodies are
    /// answered `413`.
    ///
    /// ```
    /// # use lockwarden::LockLayer;
    /// # use std::time::Duration;
    /// let layer = LockLayer::by_header("Idempotency-Key")
    ///     .remember(Duration::from_secs(3600))
    ///     .body_limit(256 * 1024);
    /// # let _ = layer;
    /// ```
    pub fn body_limit(mut self, bytes: usize) -> Self
    where
        K: KeySource<Full<Bytes>>,
    {
        KeySource::<Full<Bytes>>::set_body_limit(self.source_mut(), bytes);
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
        if self.config.client.is_none() {
            super::client::warn_if_unconfigured();
        }
        LockService::from_parts(
            inner,
            self.source.clone(),
            self.config.clone(),
            self.missing.clone(),
        )
    }
}
