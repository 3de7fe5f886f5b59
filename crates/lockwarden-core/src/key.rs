//! Lock keys: validation of user-supplied names and their layout in Redis.

use std::fmt;
use std::sync::{Arc, OnceLock};

use crate::error::KeyError;
use crate::holder::Holder;

/// The longest key name accepted by default, in bytes.
pub const DEFAULT_MAX_KEY_LEN: usize = 255;

/// The namespace every Redis key of a lock is placed under by default.
pub const DEFAULT_NAMESPACE: &str = "lockwarden:";

/// How the Redis names of a lock are made from its name (see [`Key`]).
///
/// ```
/// use lockwarden_core::{KeyLayout, LockClient};
/// let client = LockClient::builder().layout(KeyLayout::Redisson).in_memory();
/// let key = client.key("resource:x").unwrap();
/// assert_eq!(key.redis_key(), "resource:x");
/// assert_eq!(key.channel(), "redisson_lock__channel:{resource:x}");
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum KeyLayout {
    /// Everything under `<namespace>{<escaped name>}`: one hash tag, one cluster slot,
    /// nothing a name can do about it. The default.
    #[default]
    Tagged,
    /// Redisson's `RLock` layout: the (namespaced) name itself is the hash and its release
    /// channel is `redisson_lock__channel:{<name>}`, so lockwarden and a JVM service using
    /// Redisson exclude each other and wake each other's waiters. Names are used as they
    /// are, so they must not contain braces (each lock's keys must share a cluster slot).
    Redisson,
}

/// A validated lock name and the Redis keys derived from it.
///
/// The name comes from user input (a header, a path, a JSON field), so it is checked
/// (non-empty, at most [`DEFAULT_MAX_KEY_LEN`] bytes unless configured otherwise, no control
/// characters) and escaped: `{`, `}` and `%` are percent-encoded, so no name can choose the
/// cluster hash slot or reach outside the namespace. Every key that belongs to one lock
/// carries the same `{hash tag}`, so they live in one cluster slot:
///
/// | what | Redis name ([`KeyLayout::Tagged`]) | [`KeyLayout::Redisson`] |
/// |---|---|---|
/// | the lock hash | `<namespace>{<escaped name>}` | `<namespace><name>` |
/// | the fencing key | `<namespace>{<escaped name>}:fence` | `redisson_lock__fence:{<namespace><name>}` |
/// | the release channel | `<namespace>{<escaped name>}:released` | `redisson_lock__channel:{<namespace><name>}` |
/// | the outcome of a completed claim | `<namespace>{<escaped name>}:done` | `redisson_lock__done:{<namespace><name>}` |
/// | a fair lock's queue and its waiters' deadlines | `<lock key>:queue`, `<lock key>:deadlines` | `redisson_lock__queue:{..}`, `redisson_lock__deadlines:{..}` |
/// | the channel on which a fair waiter hears its turn (named in the message) | `<release channel>:<client id>` | the same |
/// | a read-write lock's hold leases, waiting writers and waiting readers | `<lock key>:leases`, `<lock key>:writers`, `<lock key>:readers` | `redisson_lock__leases:{..}`, `redisson_lock__writers:{..}`, `redisson_lock__readers:{..}` |
/// | the channel on which waiting readers hear they were admitted (or may try) | `<lock key>:readable` | `redisson_lock__readable:{..}` |
/// | a semaphore: its capacity, permits held and line of waiters, one sorted set | the lock hash's name | the same |
/// | the channel on which a semaphore's waiters hear they were granted permits (or may try) | `<lock key>:granted` | `redisson_lock__granted:{..}` |
/// | a value only the newest fencing token writes ([`LockClient::fenced`](crate::LockClient::fenced)) | `<lock key>:fenced` | `redisson_lock__fenced:{..}` |
///
/// Keys are made by [`LockClient::key`](crate::LockClient::key), which applies that client's
/// namespace, layout and length limit; cloning one is cheap.
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
    /// The lock key, the fencing key and the channel, one after the other: laid out once,
    /// as every acquire and renewal sends them.
    names: Box<str>,
    lock_end: usize,
    fence_end: usize,
    layout: KeyLayout,
    /// The names only some kinds use, each made on first use and kept with the key.
    few: FewNames,
}

/// The keys and channels of a lock that only some kinds use (see the table on [`Key`]),
/// each made on first use, then kept with the key (a waiter retrying with one key makes
/// it once; a plain lock never does). One by one: a kind uses one to five of them, and a
/// key made per request (an HTTP layer's) paid for all ten on its first semaphore call,
/// about 5,000 instructions (`scripts/layer_cost.py --redis`).
#[derive(Default)]
struct FewNames {
    outcome: OnceLock<Box<str>>,
    queue: OnceLock<Box<str>>,
    deadlines: OnceLock<Box<str>>,
    wake_prefix: OnceLock<Box<str>>,
    leases: OnceLock<Box<str>>,
    writers: OnceLock<Box<str>>,
    waiting_readers: OnceLock<Box<str>>,
    readers: OnceLock<Box<str>>,
    fenced: OnceLock<Box<str>>,
    granted: OnceLock<Box<str>>,
}

/// The keys and channels of a lock that only some kinds use (see the table on [`Key`]):
/// [`Key::names`].
#[derive(Clone, Copy)]
pub(crate) struct Names<'a>(&'a Key);

impl<'a> Names<'a> {
    /// The companion `what`, kept in `slot` once made.
    fn made(self, slot: fn(&FewNames) -> &OnceLock<Box<str>>, what: &str) -> &'a str {
        let key: &'a Key = self.0;
        slot(&key.0.few).get_or_init(|| key.companion(what))
    }

    /// A completed claim's outcome.
    pub(crate) fn outcome(self) -> &'a str {
        self.made(|few| &few.outcome, "done")
    }

    /// A fair lock's queue: a list of holder ids, oldest first.
    pub(crate) fn queue(self) -> &'a str {
        self.made(|few| &few.queue, "queue")
    }

    /// A fair lock's waiters' deadlines: a sorted set of holder id to server ms.
    pub(crate) fn deadlines(self) -> &'a str {
        self.made(|few| &few.deadlines, "deadlines")
    }

    /// The prefix of a fair waiter's wake channel: the release channel and `:`.
    pub(crate) fn wake_prefix(self) -> &'a str {
        let key: &'a Key = self.0;
        key.0
            .few
            .wake_prefix
            .get_or_init(|| [key.channel(), ":"].concat().into())
    }

    /// A read-write lock's hold leases: a sorted set of hold field to deadline.
    pub(crate) fn leases(self) -> &'a str {
        self.made(|few| &few.leases, "leases")
    }

    /// A read-write lock's waiting writers: a sorted set of holder id to deadline.
    pub(crate) fn writers(self) -> &'a str {
        self.made(|few| &few.writers, "writers")
    }

    /// A read-write lock's waiting readers: a sorted set of holder id to deadline.
    pub(crate) fn waiting_readers(self) -> &'a str {
        self.made(|few| &few.waiting_readers, "readers")
    }

    /// The channel on which a read-write lock's waiting readers are told they were
    /// admitted (or, after a force unlock, that they may try).
    pub(crate) fn readers(self) -> &'a str {
        self.made(|few| &few.readers, "readable")
    }

    /// A value written only by the newest fencing token (see `LockClient::fenced`).
    pub(crate) fn fenced(self) -> &'a str {
        self.made(|few| &few.fenced, "fenced")
    }

    /// The channel on which a semaphore's waiters are told they were granted permits (or,
    /// after a force unlock, that they may try).
    pub(crate) fn granted(self) -> &'a str {
        self.made(|few| &few.granted, "granted")
    }
}

/// How a client lays out lock names: its namespace, layout and length limit.
#[derive(Debug, Clone)]
pub(crate) struct KeySpace {
    pub(crate) namespace: String,
    pub(crate) layout: KeyLayout,
    pub(crate) max_len: usize,
}

impl Default for KeySpace {
    fn default() -> Self {
        Self {
            namespace: DEFAULT_NAMESPACE.to_owned(),
            layout: KeyLayout::Tagged,
            max_len: DEFAULT_MAX_KEY_LEN,
        }
    }
}

impl KeySpace {
    /// Validates `name` and lays it out in this space.
    pub(crate) fn key(&self, name: &str) -> Result<Key, KeyError> {
        Key::new(&self.namespace, self.max_len, self.layout, name)
    }
}

impl Key {
    pub(crate) fn new(
        namespace: &str,
        max_len: usize,
        layout: KeyLayout,
        name: &str,
    ) -> Result<Self, KeyError> {
        validate(name, max_len)?;
        let mut names = String::with_capacity(3 * (namespace.len() + name.len()) + 64);
        match layout {
            KeyLayout::Tagged => {
                escape_into(&mut names, namespace);
                names.push('{');
                escape_into(&mut names, name);
                names.push('}');
            }
            KeyLayout::Redisson => {
                let full = [namespace, name];
                if let Some(at) = full.concat().find(['{', '}']) {
                    return Err(KeyError::Brace {
                        at: at.saturating_sub(namespace.len()),
                    });
                }
                names.extend(full);
            }
        }
        let lock_end = names.len();
        push_companion(&mut names, layout, lock_end, "fence");
        let fence_end = names.len();
        push_companion(&mut names, layout, lock_end, "released");
        Ok(Self(Arc::new(Layout {
            name: name.into(),
            names: names.into(),
            lock_end,
            fence_end,
            layout,
            few: FewNames::default(),
        })))
    }

    /// The name as given by the caller, unescaped.
    pub fn name(&self) -> &str {
        &self.0.name
    }

    /// The Redis key of the lock hash.
    pub fn redis_key(&self) -> &str {
        &self.0.names[..self.0.lock_end]
    }

    /// The Redis key that holds the last fencing token issued for this lock.
    pub(crate) fn fence_key(&self) -> &str {
        &self.0.names[self.0.lock_end..self.0.fence_end]
    }

    /// The pub/sub channel on which releases of this lock are announced.
    pub fn channel(&self) -> &str {
        &self.0.names[self.0.fence_end..]
    }

    /// Whether a waiter marks this plain lock, and a release sent as plain commands sends
    /// the notice only if it finds a mark (see `lua/acquire.lua`). Not in Redisson's
    /// layout: a Redisson waiter leaves no mark, so every release there sends the notice,
    /// as Redisson's do.
    pub(crate) fn has_marks(&self) -> bool {
        self.0.layout == KeyLayout::Tagged
    }

    /// The names of the keys and channels only claims, fair and read-write locks and
    /// semaphores use, each made when first asked for.
    pub(crate) fn names(&self) -> Names<'_> {
        Names(self)
    }

    /// The channel on which `holder` hears that its turn at this fair lock has come: its
    /// client's (a holder id is `<client id>:<number>`), so one subscription serves every
    /// waiter of that client, each told by name (see `fair_prelude.lua`'s `wake_channel`).
    pub(crate) fn wake_channel(&self, holder: &Holder) -> String {
        let id = holder.id();
        let client = id.rsplit_once(':').map_or(id, |(client, _)| client);
        [self.names().wake_prefix(), client].concat()
    }

    /// The name of another key (or channel) of this lock, in the lock's slot:
    /// `<lock key>:<what>` in the tagged layout, `redisson_lock__<what>:{<name>}` in
    /// Redisson's.
    fn companion(&self, what: &str) -> Box<str> {
        // Made in one allocation of the exact size: appending to a copy of the lock key
        // (two copies, a cut and a shrink per name) cost an rw or fair acquisition (or a
        // claim) ~11,700 instructions for its nine names, a sixth of a read cycle's work.
        let lock = self.redis_key();
        let texts = companion_pieces(self.0.layout, what).map(|piece| match piece {
            Piece::Text(text) => text,
            Piece::Lock => lock,
        });
        texts.concat().into_boxed_str()
    }
}

/// A piece of a companion name: text, or the lock key.
enum Piece<'a> {
    Text(&'a str),
    Lock,
}

/// How `layout` names a lock's companion key or channel `what`, piece by piece: the one
/// place that says it (Redisson calls the release channel `channel`).
fn companion_pieces(layout: KeyLayout, what: &str) -> [Piece<'_>; 5] {
    use Piece::{Lock, Text};
    match layout {
        KeyLayout::Tagged => [Lock, Text(":"), Text(what), Text(""), Text("")],
        KeyLayout::Redisson => {
            let what = if what == "released" { "channel" } else { what };
            [
                Text("redisson_lock__"),
                Text(what),
                Text(":{"),
                Lock,
                Text("}"),
            ]
        }
    }
}

/// Appends the name of a lock's companion key (`what`) to `names`, whose first
/// `lock_end` bytes are the lock key.
fn push_companion(names: &mut String, layout: KeyLayout, lock_end: usize, what: &str) {
    for piece in companion_pieces(layout, what) {
        match piece {
            Piece::Text(text) => names.push_str(text),
            Piece::Lock => names.extend_from_within(..lock_end),
        }
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

pub(crate) fn validate(name: &str, max_len: usize) -> Result<(), KeyError> {
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
pub(crate) fn escape_into(out: &mut String, raw: &str) {
    // Most names have nothing to escape: copied whole, not pushed char by char.
    if !raw.contains(['%', '{', '}']) {
        out.push_str(raw);
        return;
    }
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
        Key::new(
            DEFAULT_NAMESPACE,
            DEFAULT_MAX_KEY_LEN,
            KeyLayout::Tagged,
            name,
        )
    }

    #[test]
    fn redisson_layout_uses_the_name_itself() {
        let k = Key::new("", 255, KeyLayout::Redisson, "resource:x").unwrap();
        assert_eq!(k.redis_key(), "resource:x");
        assert_eq!(k.fence_key(), "redisson_lock__fence:{resource:x}");
        assert_eq!(k.channel(), "redisson_lock__channel:{resource:x}");
        let names = k.names();
        assert_eq!(names.outcome(), "redisson_lock__done:{resource:x}");
        assert_eq!(names.queue(), "redisson_lock__queue:{resource:x}");
        assert_eq!(names.leases(), "redisson_lock__leases:{resource:x}");
        assert_eq!(names.wake_prefix(), "redisson_lock__channel:{resource:x}:");
        assert_eq!(
            Key::new("", 255, KeyLayout::Redisson, "a{b}").unwrap_err(),
            KeyError::Brace { at: 1 }
        );
    }

    #[test]
    fn layout_shares_one_hash_tag() {
        let k = key("orders:42").unwrap();
        assert_eq!(k.redis_key(), "lockwarden:{orders:42}");
        assert_eq!(k.fence_key(), "lockwarden:{orders:42}:fence");
        assert_eq!(k.channel(), "lockwarden:{orders:42}:released");
        let names = k.names();
        assert_eq!(names.outcome(), "lockwarden:{orders:42}:done");
        assert_eq!(names.queue(), "lockwarden:{orders:42}:queue");
        assert_eq!(names.deadlines(), "lockwarden:{orders:42}:deadlines");
        assert_eq!(names.wake_prefix(), "lockwarden:{orders:42}:released:");
        assert_eq!(names.leases(), "lockwarden:{orders:42}:leases");
        assert_eq!(names.writers(), "lockwarden:{orders:42}:writers");
        assert_eq!(names.waiting_readers(), "lockwarden:{orders:42}:readers");
        assert_eq!(names.readers(), "lockwarden:{orders:42}:readable");
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
        let k = Key::new("app{1}:", 255, KeyLayout::Tagged, "a").unwrap();
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
