//! [`KeyedLayer`]: the one layer of every policy (a lock, a permit, a rate decision), and
//! the settings every policy has. What a policy adds is in its own file; the constructors
//! that pick the key are in `locking.rs` (a lock layer starts with its key) and
//! `unkeyed.rs` (the others start with their policy).

use std::fmt;
use std::sync::Arc;

use bytes::Bytes;
use http::request::Parts;
use http_body_util::Full;
use tower_layer::Layer;

use super::admission::Admission;
use super::config::{Missing, MissingKey, Settings, Shared};
use super::key::{FromJsonField, KeySource};
use super::service::KeyedService;

/// A tower layer that admits each request by a key it carries, under an admission policy
/// `P`, before the inner service sees it; `K` is where the key comes from (a
/// [`KeySource`]).
///
/// It is written once for every policy; name it by its policy:
///
/// | layer | policy `P` | a request takes | refused with |
/// |---|---|---|---|
/// | [`LockLayer`](super::LockLayer) | [`Locking`](super::Locking) | the key's lock, held until its response ends | `409` (or `423`) |
/// | [`LockLayer::remember`](super::LockLayer::remember) | [`Replaying`](super::Replaying) | the lock, or the stored response of a completed request | `409`, `422` |
/// | [`LimitLayer`](super::LimitLayer) | [`Limiting`](super::Limiting) | a permit of the key's concurrency limit, held until its response ends | `429` (or `503`) |
/// | [`RateLimitLayer`](super::RateLimitLayer) | [`RateLimiting`](super::RateLimiting) | a charge to the key's rate limits, nothing held | `429` |
///
/// Every policy shares the key sources, [`scope`](Self::scope),
/// [`on_missing_key`](Self::on_missing_key), [`fail_open`](Self::fail_open),
/// [`redact_keys`](Self::redact_keys), the answers to bad input (a problem document, see
/// [`Rejection`](super::Rejection)), the request span and the metrics.
#[must_use = "a layer does nothing until it wraps a service"]
pub struct KeyedLayer<P, K> {
    source: K,
    shared: Arc<Shared<P>>,
    /// The source's answer to a request without a key, shared by every service the layer
    /// makes: axum may make one per request.
    missing: Missing,
}

impl<P, K> KeyedLayer<P, K> {
    /// A layer of `policy`, keyed by `source`.
    pub(crate) fn from_parts(policy: P, source: K) -> Self {
        Self {
            source,
            shared: Arc::new(Shared {
                settings: Settings::default(),
                policy,
            }),
            missing: Missing::default(),
        }
    }

    /// The same layer, keyed by `source` instead.
    pub(crate) fn keyed_by<K2>(self, source: K2) -> KeyedLayer<P, K2> {
        KeyedLayer {
            source,
            shared: self.shared,
            missing: Missing::default(),
        }
    }

    /// The same layer with another policy, made from this one's.
    pub(crate) fn map_policy<P2>(self, to: impl FnOnce(P) -> P2) -> KeyedLayer<P2, K>
    where
        P: Clone,
    {
        let Shared { settings, policy } = Arc::unwrap_or_clone(self.shared);
        KeyedLayer {
            source: self.source,
            shared: Arc::new(Shared {
                settings,
                policy: to(policy),
            }),
            missing: self.missing,
        }
    }

    pub(crate) fn source(&self) -> &K {
        &self.source
    }

    /// The source, to change it: the answer made from the old one no longer applies.
    pub(crate) fn source_mut(&mut self) -> &mut K {
        self.missing = Missing::default();
        &mut self.source
    }
}

impl<P: Clone, K> KeyedLayer<P, K> {
    pub(crate) fn policy_mut(&mut self) -> &mut P {
        &mut Arc::make_mut(&mut self.shared).policy
    }

    fn settings_mut(&mut self) -> &mut Settings {
        &mut Arc::make_mut(&mut self.shared).settings
    }

    /// Places each key under a scope taken from the request, typically the authenticated
    /// principal, so one client's keys can never block, limit or collide with another's. A
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
        self.settings_mut().scope = Some(Arc::new(scope));
        self
    }

    /// What to do with a request without a key (default [`MissingKey::Reject`];
    /// [`MissingKey::PassUnlocked`] runs it without a lock, a permit or a charge).
    ///
    /// ```
    /// use lockwarden::{LimitLayer, MissingKey};
    /// let layer = LimitLayer::permits(5).by_header("X-Tenant").on_missing_key(MissingKey::PassUnlocked);
    /// # let _ = layer;
    /// ```
    pub fn on_missing_key(mut self, policy: MissingKey) -> Self {
        self.settings_mut().missing_key = policy;
        self
    }

    /// Lets requests through without a lock, a permit or a charge (logging a warning)
    /// when the store cannot be reached, instead of answering `503`. A layer without a
    /// client while `REDIS_URL` is not set (see [`default_client`](super::default_client))
    /// still answers `503`: that is a missing setting, not an outage; so does a client
    /// that was shut down.
    ///
    /// ```
    /// use lockwarden::LockLayer;
    /// let layer = LockLayer::by_path().fail_open();
    /// # let _ = layer;
    /// ```
    pub fn fail_open(mut self) -> Self {
        self.settings_mut().fail_open = true;
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
        self.settings_mut().redact_keys = true;
        self
    }
}

impl<P: Clone> KeyedLayer<P, FromJsonField> {
    /// Reads at most `bytes` of request body to find the JSON field (default
    /// [`DEFAULT_BODY_LIMIT`](super::DEFAULT_BODY_LIMIT), 64 KiB); longer bodies are
    /// answered `413`. A remembering lock layer's fingerprint reads the body within this
    /// one limit too.
    ///
    /// ```
    /// use lockwarden::LockLayer;
    /// let layer = LockLayer::by_json_field("/id").body_limit(1024 * 1024);
    /// # let _ = layer;
    /// ```
    pub fn body_limit(mut self, bytes: usize) -> Self {
        KeySource::<Full<Bytes>>::set_body_limit(self.source_mut(), bytes);
        self
    }
}

impl<P, K: Clone> Clone for KeyedLayer<P, K> {
    fn clone(&self) -> Self {
        Self {
            source: self.source.clone(),
            shared: self.shared.clone(),
            missing: self.missing.clone(),
        }
    }
}

impl<P: fmt::Debug, K: fmt::Debug> fmt::Debug for KeyedLayer<P, K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyedLayer")
            .field("source", &self.source)
            .field("settings", &self.shared.settings)
            .field("policy", &self.shared.policy)
            .finish()
    }
}

impl<S, P: Admission, K: Clone> Layer<S> for KeyedLayer<P, K> {
    type Service = KeyedService<S, K, P>;

    fn layer(&self, inner: S) -> Self::Service {
        self.shared.policy.layered();
        KeyedService::from_parts(
            inner,
            self.source.clone(),
            self.shared.clone(),
            self.missing.clone(),
        )
    }
}
