//! Lock keys: validation of user-supplied names and their layout in Redis.

use std::fmt;
use std::sync::Arc;

use crate::error::KeyError;

/// The longest key name accepted by default, in bytes.
pub const DEFAULT_MAX_KEY_LEN: usize = 255;

/// The namespace every Redis key of a lock is placed under by default.
pub const DEFAULT_NAMESPACE: &str = "lockwarden:";

/// A validated lock name and the Redis keys derived from it.
///
/// The name comes from user input (a header, a path, a JSON field), so it is checked
/// (non-empty, at most [`DEFAULT_MAX_KEY_LEN`] bytes unless configured otherwise, no control
/// characters) and escaped: `{`, `}` and `%` are percent-encoded, so no name can choose the
/// cluster hash slot or reach outside the namespace. Every key that belongs to one lock
/// carries the same `{hash tag}`, so they live in one cluster slot:
///
/// | what | Redis name |
/// |---|---|
/// | the lock hash | `<namespace>{<escaped name>}` |
/// | the fencing key | `<namespace>{<escaped name>}:fence` |
/// | the release channel | `<namespace>{<escaped name>}:released` |
/// | the outcome of a completed claim | `<namespace>{<escaped name>}:done` |
///
/// Keys are made by [`LockClient::key`](crate::LockClient::key), which applies that client's
/// namespace and length limit; cloning one is cheap.
///
/// ```
/// # use lockwarden_core::LockClient;
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let client = LockClient::in_memory();
/// let key = client.key("orders/{42}").unwrap();
/// assert_eq!(key.name(), "orders/{42}");
/// assert_eq!(key.redis_key(), "lockwarden:{orders/%7B42%7D}");
/// assert!(client.key("").is_err());
/// # }
/// ```
#[derive(Clone)]
pub struct Key(Arc<Layout>);

struct Layout {
    name: Box<str>,
    /// `<namespace>{<escaped>}:released`; the lock key is a prefix of it.
    channel: Box<str>,
    lock_len: usize,
    /// `<namespace>{<escaped>}:fence`, laid out once: it is sent with every acquire and renewal.
    fence: Box<str>,
}

impl Key {
    pub(crate) fn new(namespace: &str, max_len: usize, name: &str) -> Result<Self, KeyError> {
        validate(name, max_len)?;
        let mut channel = String::with_capacity(namespace.len() + name.len() + 16);
        escape_into(&mut channel, namespace);
        channel.push('{');
        escape_into(&mut channel, name);
        channel.push('}');
        let lock_len = channel.len();
        let fence = format!("{channel}:fence").into();
        channel.push_str(":released");
        Ok(Self(Arc::new(Layout {
            name: name.into(),
            channel: channel.into(),
            lock_len,
            fence,
        })))
    }

    /// The name as given by the caller, unescaped.
    pub fn name(&self) -> &str {
        &self.0.name
    }

    /// The Redis key of the lock hash.
    pub fn redis_key(&self) -> &str {
        &self.0.channel[..self.0.lock_len]
    }

    /// The Redis key that holds the last fencing token issued for this lock.
    pub(crate) fn fence_key(&self) -> &str {
        &self.0.fence
    }

    /// The Redis key that keeps the outcome of a completed claim
    /// (see [`Lock::try_claim`](crate::Lock::try_claim)); made on use, as only claims need it.
    pub(crate) fn outcome_key(&self) -> String {
        format!("{}:done", self.redis_key())
    }

    /// The pub/sub channel on which releases of this lock are announced.
    pub fn channel(&self) -> &str {
        &self.0.channel
    }
}

impl PartialEq for Key {
    fn eq(&self, other: &Self) -> bool {
        self.channel() == other.channel()
    }
}

impl Eq for Key {}

impl std::hash::Hash for Key {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.channel().hash(state);
    }
}

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Key").field(&self.name()).finish()
    }
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

fn validate(name: &str, max_len: usize) -> Result<(), KeyError> {
    if name.is_empty() {
        return Err(KeyError::Empty);
    }
    if name.len() > max_len {
        return Err(KeyError::TooLong {
            len: name.len(),
            max: max_len,
        });
    }
    if let Some(at) = name.char_indices().find(|(_, c)| c.is_control()) {
        return Err(KeyError::ControlCharacter { at: at.0 });
    }
    Ok(())
}

/// Percent-encodes the characters that could form or break a hash tag (and `%` itself,
/// so the encoding stays one-to-one).
fn escape_into(out: &mut String, raw: &str) {
    for c in raw.chars() {
        match c {
            '%' => out.push_str("%25"),
            '{' => out.push_str("%7B"),
            '}' => out.push_str("%7D"),
            c => out.push(c),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(name: &str) -> Result<Key, KeyError> {
        Key::new(DEFAULT_NAMESPACE, DEFAULT_MAX_KEY_LEN, name)
    }

    #[test]
    fn layout_shares_one_hash_tag() {
        let k = key("orders:42").unwrap();
        assert_eq!(k.redis_key(), "lockwarden:{orders:42}");
        assert_eq!(k.fence_key(), "lockwarden:{orders:42}:fence");
        assert_eq!(k.channel(), "lockwarden:{orders:42}:released");
    }

    #[test]
    fn braces_cannot_change_the_hash_tag() {
        let k = key("}x{evil}").unwrap();
        assert_eq!(k.redis_key(), "lockwarden:{%7Dx%7Bevil%7D}");
        let inner = &k.redis_key()["lockwarden:{".len()..k.redis_key().len() - 1];
        assert!(!inner.contains('{') && !inner.contains('}'));
    }

    #[test]
    fn escaping_is_one_to_one() {
        assert_ne!(
            key("%7B").unwrap().redis_key(),
            key("{").unwrap().redis_key()
        );
    }

    #[test]
    fn namespace_braces_are_escaped_too() {
        let k = Key::new("app{1}:", 255, "a").unwrap();
        assert_eq!(k.redis_key(), "app%7B1%7D:{a}");
    }

    #[test]
    fn rejects_bad_names() {
        assert_eq!(key("").unwrap_err(), KeyError::Empty);
        assert_eq!(
            key(&"x".repeat(256)).unwrap_err(),
            KeyError::TooLong { len: 256, max: 255 }
        );
        assert!(key(&"x".repeat(255)).is_ok());
        assert_eq!(
            key("a\nb").unwrap_err(),
            KeyError::ControlCharacter { at: 1 }
        );
        assert_eq!(
            key("ab\u{7f}").unwrap_err(),
            KeyError::ControlCharacter { at: 2 }
        );
    }
}
