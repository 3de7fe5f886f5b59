//! What every keyed layer has, whatever its admission policy: [`Settings`] (the scope, a
//! request without a key, failing open, redacted keys), shared with its services and
//! futures as one [`Shared`] beside the policy; the defaults; and how a key's name is made.

use std::fmt;
use std::sync::{Arc, OnceLock};

use http::request::Parts;

use super::rejection::Rejection;

/// How much of a body a layer keyed by a JSON field (or a remembering layer) reads by
/// default: 64 KiB.
pub const DEFAULT_BODY_LIMIT: usize = 64 * 1024;

/// The start of every lock name a [`LockLayer`](super::LockLayer) makes, unless set with
/// `name_prefix`.
pub const DEFAULT_NAME_PREFIX: &str = "http:";

/// The start of every semaphore name a [`LimitLayer`](super::LimitLayer) makes, unless
/// set with `name_prefix`: another than the lock layer's, so that a lock and a limit on
/// the same key never share a name.
pub const DEFAULT_LIMIT_PREFIX: &str = "http-limit:";

/// What to do with a request that carries no key (see
/// [`on_missing_key`](super::KeyedLayer::on_missing_key)).
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
    /// Let the request through without a lock, a permit or a charge.
    PassUnlocked,
}

pub(crate) type ScopeFn = Arc<dyn Fn(&Parts) -> Option<String> + Send + Sync>;

/// The settings every keyed layer has.
#[derive(Clone, Default)]
pub(crate) struct Settings {
    pub(crate) scope: Option<ScopeFn>,
    pub(crate) missing_key: MissingKey,
    pub(crate) fail_open: bool,
    pub(crate) redact_keys: bool,
}

impl fmt::Debug for Settings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Settings")
            .field("scoped", &self.scope.is_some())
            .field("missing_key", &self.missing_key)
            .field("fail_open", &self.fail_open)
            .field("redact_keys", &self.redact_keys)
            .finish()
    }
}

/// What a layer shares with every service and request future it makes: its settings and
/// its admission policy (`P`), behind one `Arc`.
#[derive(Clone, Debug)]
pub(crate) struct Shared<P> {
    pub(crate) settings: Settings,
    pub(crate) policy: P,
}

/// The answer to a request without a key, made on first use and shared by the services
/// of one layer (and their clones).
pub(crate) type Missing = Arc<OnceLock<Arc<Rejection>>>;

/// The name of a request's key: `<prefix>[<escaped scope>/]<key>`. The scope is escaped
/// (`%` and `/`), so no scope/key pair can spell another pair's name.
pub(crate) fn scoped_name(prefix: &str, scope: Option<&str>, key: &str) -> String {
    let mut name =
        String::with_capacity(prefix.len() + scope.map_or(0, |s| s.len() + 1) + key.len());
    name.push_str(prefix);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scoped_names_cannot_collide() {
        let name = |scope, key| scoped_name(DEFAULT_NAME_PREFIX, scope, key);
        assert_eq!(name(None, "k"), "http:k");
        assert_eq!(name(Some("alice"), "k"), "http:alice/k");
        assert_ne!(name(Some("a/b"), "c"), name(Some("a"), "b/c"));
        assert_ne!(name(Some("a%2Fb"), "c"), name(Some("a/b"), "c"));
    }
}
