//! The settings of a lock layer (`Config`), the defaults, and how a lock's name is made.
//!
//! The layer, every service it makes and every request's future share one `Arc<Config>`;
//! they read it here, so the service and the future do not depend on the builder
//! ([`LockLayer`](super::LockLayer)).

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use http::request::Parts;
use http::StatusCode;

use super::remember::config::Remembering;
use super::retry_after::LayerHoldTimes;
use crate::LockClient;

/// How much of a body [`LockLayer::by_json_field`](super::LockLayer::by_json_field) reads by
/// default: 64 KiB.
pub const DEFAULT_BODY_LIMIT: usize = 64 * 1024;

/// The start of every lock name a layer makes, unless set with
/// [`LockLayer::name_prefix`](super::LockLayer::name_prefix).
pub const DEFAULT_NAME_PREFIX: &str = "http:";

/// The start of every semaphore name a [`LimitLayer`](super::LimitLayer) makes, unless
/// set with [`LimitLayer::name_prefix`](super::LimitLayer::name_prefix): another than the
/// lock layer's, so that a lock and a limit on the same key never share a name.
pub const DEFAULT_LIMIT_PREFIX: &str = "http-limit:";

/// What to do with a request that carries no key (see
/// [`LockLayer::on_missing_key`](super::LockLayer::on_missing_key)).
///
/// ```
/// use lockwarden::{LockLayer, MissingKey};
/// let layer = LockLayer::by_header("Idempotency-Key").on_missing_key(MissingKey::PassUnlocked);
/// # let _ = layer;
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum MissingKey {
    /// Answer 400 (422 for an absent JSON field) with a problem body. The default.
    #[default]
    Reject,
    /// Let the request through without a lock.
    PassUnlocked,
}

pub(crate) type ScopeFn = Arc<dyn Fn(&Parts) -> Option<String> + Send + Sync>;

/// How many permits a limit layer's semaphore has: one number, or one per request (a
/// tenant's tier).
#[derive(Clone)]
pub(crate) enum Capacity {
    Fixed(u32),
    ByRequest(Arc<dyn Fn(&Parts) -> u32 + Send + Sync>),
}

impl Capacity {
    /// The capacity for the request with head `parts`.
    pub(crate) fn of(&self, parts: &Parts) -> u32 {
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

/// The settings shared by a layer and every service and future it makes.
#[derive(Clone)]
pub(crate) struct Config {
    pub(crate) client: Option<LockClient>,
    pub(crate) name_prefix: Arc<str>,
    pub(crate) scope: Option<ScopeFn>,
    pub(crate) wait: Duration,
    pub(crate) lease: Option<Duration>,
    /// The status of a request refused because its lock is busy (409 or 423) or its
    /// limit is full (429 or 503).
    pub(crate) refused_status: StatusCode,
    /// Set for a limit layer: requests hold permits of a semaphore of this capacity,
    /// not a lock.
    pub(crate) permits: Option<Capacity>,
    pub(crate) missing_key: MissingKey,
    pub(crate) fail_open: bool,
    pub(crate) abort_on_loss: bool,
    pub(crate) redact_keys: bool,
    /// Set by [`LockLayer::remember`](super::LockLayer::remember): store completed responses
    /// and replay them.
    pub(crate) remember: Option<Remembering>,
    /// How long the layer's holds last: its `Retry-After` estimates.
    pub(crate) hold_times: LayerHoldTimes,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            client: None,
            name_prefix: DEFAULT_NAME_PREFIX.into(),
            scope: None,
            wait: Duration::ZERO,
            lease: None,
            refused_status: StatusCode::CONFLICT,
            permits: None,
            missing_key: MissingKey::Reject,
            fail_open: false,
            abort_on_loss: false,
            redact_keys: false,
            remember: None,
            hold_times: LayerHoldTimes::default(),
        }
    }
}

impl Config {
    /// A limit layer's settings before its builder methods: no capacity yet (a request is
    /// refused as a misconfiguration until one is set), its own name prefix, `429`.
    pub(crate) fn limit() -> Self {
        Self {
            name_prefix: DEFAULT_LIMIT_PREFIX.into(),
            refused_status: StatusCode::TOO_MANY_REQUESTS,
            permits: Some(Capacity::Fixed(0)),
            ..Self::default()
        }
    }

    /// The lock name of a request: `<name prefix>[<escaped scope>/]<key>`. The scope is
    /// escaped (`%` and `/`), so no scope/key pair can spell another pair's name.
    pub(crate) fn lock_name(&self, scope: Option<&str>, key: &str) -> String {
        let mut name = String::with_capacity(
            self.name_prefix.len() + scope.map_or(0, |s| s.len() + 1) + key.len(),
        );
        name.push_str(&self.name_prefix);
        if let Some(scope) = scope {
            for c in scope.chars() {
                match c {
                    '%' => name.push_str("%25"),
                    '/' => name.push_str("%2F"),
                    c => name.push(c),
                }
            }
            name.push('/');
        }
        name.push_str(key);
        name
    }
}

impl fmt::Debug for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Config")
            .field("client", &self.client)
            .field("name_prefix", &self.name_prefix)
            .field("scoped", &self.scope.is_some())
            .field("wait", &self.wait)
            .field("lease", &self.lease)
            .field("refused_status", &self.refused_status)
            .field("permits", &self.permits)
            .field("missing_key", &self.missing_key)
            .field("fail_open", &self.fail_open)
            .field("abort_on_loss", &self.abort_on_loss)
            .field("redact_keys", &self.redact_keys)
            .field("remember", &self.remember)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scoped_names_cannot_collide() {
        let config = Config::default();
        assert_eq!(config.lock_name(None, "k"), "http:k");
        assert_eq!(config.lock_name(Some("alice"), "k"), "http:alice/k");
        assert_ne!(
            config.lock_name(Some("a/b"), "c"),
            config.lock_name(Some("a"), "b/c")
        );
        assert_ne!(
            config.lock_name(Some("a%2Fb"), "c"),
            config.lock_name(Some("a/b"), "c")
        );
    }
}
