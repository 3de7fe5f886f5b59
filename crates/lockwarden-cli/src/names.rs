//! Lock names and the Redis keys they live under, both ways: the keys of one name (its
//! lock hash and channel come from the core's own [`Key`](lockwarden_core::Key); the
//! companions follow the table on that type), and the name a scanned key belongs to.
//!
//! | part | [`KeyLayout::Tagged`] | [`KeyLayout::Redisson`] |
//! |---|---|---|
//! | lock hash | `<escaped namespace>{<escaped name>}` | `<namespace><name>` |
//! | companion `what` | `<lock key>:<what>` | `redisson_lock__<what>:{<lock key>}` |
//! | release channel | `<lock key>:released` | `redisson_lock__channel:{<lock key>}` |
//! | a fair waiter's turn | `<release channel>:<holder id>` | the same |
//! | a semaphore's grants | `<lock key>:granted` | `redisson_lock__granted:{<lock key>}` |
//!
//! Escaping (tagged layout only): `%` → `%25`, `{` → `%7B`, `}` → `%7D`, in the namespace
//! and in the name. Decoding is strict: a key the core could not have made is not a lock.
//!
//! A rate limiter's bucket is `<namespace>rate:{<limiter>:<key>}:<policy>` in either
//! layout, the namespace and the key escaped as above ([`BucketName`]).

use lockwarden_core::{KeyLayout, LockClient, LockError};

/// A key of one lock: which of its parts it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Part {
    /// The lock hash.
    Lock,
    /// The last fencing token (a string).
    Fence,
    /// A completed claim's outcome (a string with a TTL).
    Done,
    /// A fair lock's queue (a list of holder ids, oldest first).
    Queue,
    /// A fair lock's waiters' deadlines (a zset: holder id → server ms).
    Deadlines,
    /// A read-write lock's hold leases (a zset: hold field → server ms).
    Leases,
    /// A read-write lock's waiting writers (a zset: holder id → server ms).
    Writers,
    /// A read-write lock's waiting readers (a zset: holder id → server ms).
    Readers,
}

impl Part {
    /// Every companion (every part but the hash), with the word the layouts use for it.
    /// (A semaphore has none but its fencing key: it is one sorted set at the lock's name.)
    pub const COMPANIONS: [(Part, &'static str); 7] = [
        (Part::Fence, "fence"),
        (Part::Done, "done"),
        (Part::Queue, "queue"),
        (Part::Deadlines, "deadlines"),
        (Part::Leases, "leases"),
        (Part::Writers, "writers"),
        (Part::Readers, "readers"),
    ];

    fn from_word(word: &str) -> Option<Part> {
        Self::COMPANIONS
            .iter()
            .find(|(_, w)| *w == word)
            .map(|(p, _)| *p)
    }
}

/// How lock names are laid out: a namespace and a [`KeyLayout`], as a `LockClient` has.
#[derive(Debug, Clone)]
pub struct Space {
    namespace: String,
    layout: KeyLayout,
    /// A client without a server, only to make keys exactly as the core does.
    keys: LockClient,
}

/// Every Redis name of one lock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LockKeys {
    /// The lock name, unescaped.
    pub name: String,
    /// The lock hash.
    pub lock: String,
    /// The last fencing token.
    pub fence: String,
    /// A completed claim's outcome.
    pub done: String,
    /// A fair lock's queue.
    pub queue: String,
    /// A fair lock's waiters' deadlines.
    pub deadlines: String,
    /// A read-write lock's hold leases.
    pub leases: String,
    /// A read-write lock's waiting writers.
    pub writers: String,
    /// A read-write lock's waiting readers.
    pub waiting_readers: String,
    /// The release channel (plain waiters, waiting writers, Redisson's waiters).
    pub channel: String,
    /// The channel of a read-write lock's waiting readers.
    pub readers_channel: String,
    /// The channel on which a semaphore's waiters hear of grants (and of a force-unlock).
    pub granted_channel: String,
}

impl LockKeys {
    /// The channel on which the fair waiter `holder` hears its turn (see [`turn_channel`]).
    pub fn turn_channel(&self, holder: &str) -> String {
        turn_channel(&self.channel, holder)
    }

    /// The key of `part`.
    pub fn of(&self, part: Part) -> &str {
        match part {
            Part::Lock => &self.lock,
            Part::Fence => &self.fence,
            Part::Done => &self.done,
            Part::Queue => &self.queue,
            Part::Deadlines => &self.deadlines,
            Part::Leases => &self.leases,
            Part::Writers => &self.writers,
            Part::Readers => &self.waiting_readers,
        }
    }
}

impl Space {
    /// The space of `namespace` (`None`: the layout's default, `lockwarden:` tagged, empty
    /// for Redisson's) and `layout`.
    pub fn new(namespace: Option<&str>, layout: KeyLayout) -> Space {
        let mut builder = LockClient::builder().layout(layout);
        if let Some(ns) = namespace {
            builder = builder.namespace(ns);
        }
        let namespace = match (namespace, layout) {
            (Some(ns), _) => ns.to_owned(),
            (None, KeyLayout::Redisson) => String::new(),
            (None, _) => lockwarden_core::DEFAULT_NAMESPACE.to_owned(),
        };
        Space {
            namespace,
            layout,
            keys: builder.in_memory(),
        }
    }

    /// The namespace, as given.
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// The layout.
    pub fn layout(&self) -> KeyLayout {
        self.layout
    }

    /// `"tagged"` or `"redisson"`.
    pub fn layout_name(&self) -> &'static str {
        match self.layout {
            KeyLayout::Redisson => "redisson",
            _ => "tagged",
        }
    }

    /// Every key and channel of the lock `name`.
    ///
    /// # Errors
    /// [`LockError::InvalidKey`] for a name the core refuses (empty, too long, control
    /// characters; braces in the Redisson layout).
    pub fn keys(&self, name: &str) -> Result<LockKeys, LockError> {
        let key = self.keys.key(name)?;
        let lock = key.redis_key().to_owned();
        let companion = |what: &str| match self.layout {
            KeyLayout::Redisson => format!("redisson_lock__{what}:{{{lock}}}"),
            _ => format!("{lock}:{what}"),
        };
        Ok(LockKeys {
            name: name.to_owned(),
            fence: companion("fence"),
            done: companion("done"),
            queue: companion("queue"),
            deadlines: companion("deadlines"),
            leases: companion("leases"),
            writers: companion("writers"),
            waiting_readers: companion("readers"),
            readers_channel: companion("readable"),
            granted_channel: companion("granted"),
            channel: key.channel().to_owned(),
            lock,
        })
    }

    /// The lock name and part a scanned key belongs to, `None` if the key is not one the
    /// core makes in this space. In the Redisson layout a bare name is taken for a lock
    /// hash (`Part::Lock`) if it is under the namespace and has no braces; whether it
    /// really is a lock is for its contents to say.
    pub fn decode(&self, key: &str) -> Option<(String, Part)> {
        match self.layout {
            KeyLayout::Redisson => self.decode_redisson(key),
            _ => self.decode_tagged(key),
        }
    }

    fn decode_tagged(&self, key: &str) -> Option<(String, Part)> {
        let rest = key
            .strip_prefix(&escape(&self.namespace))?
            .strip_prefix('{')?;
        let (inner, suffix) = rest.split_once('}')?;
        let part = match suffix {
            "" => Part::Lock,
            s => Part::from_word(s.strip_prefix(':')?)?,
        };
        let name = unescape(inner)?;
        valid_name(&name).then_some((name, part))
    }

    fn decode_redisson(&self, key: &str) -> Option<(String, Part)> {
        if let Some(rest) = key.strip_prefix("redisson_lock__") {
            let (word, tagged) = rest.split_once(':')?;
            let part = Part::from_word(word)?;
            let full = tagged.strip_prefix('{')?.strip_suffix('}')?;
            let name = full.strip_prefix(&self.namespace)?;
            return (valid_name(name) && !name.contains(['{', '}']))
                .then(|| (name.to_owned(), part));
        }
        let name = key.strip_prefix(&self.namespace)?;
        (valid_name(name) && !name.contains(['{', '}'])).then(|| (name.to_owned(), Part::Lock))
    }

    /// The `SCAN MATCH` patterns that find every key of every lock whose name matches the
    /// glob `names` (a superset: the names found are to be checked with [`glob_match`]).
    /// Tagged: one pattern. Redisson: the lock hashes (`hash: true`, to scan with
    /// `TYPE hash`) and the companions.
    pub fn scan_patterns(&self, names: &str) -> Vec<ScanPattern> {
        match self.layout {
            KeyLayout::Redisson => {
                let full = format!(
                    "{}{}",
                    glob_escape(&self.namespace),
                    server_glob(names, |c, out| out.push(c))
                );
                vec![
                    ScanPattern {
                        pattern: collapse_stars(&full),
                        hashes_only: true,
                    },
                    ScanPattern {
                        pattern: collapse_stars(&format!("redisson_lock__*:{{{full}}}")),
                        hashes_only: false,
                    },
                ]
            }
            _ => {
                let inner = server_glob(names, escape_char);
                vec![ScanPattern {
                    pattern: collapse_stars(&format!(
                        "{}{{{inner}}}*",
                        glob_escape(&escape(&self.namespace))
                    )),
                    hashes_only: false,
                }]
            }
        }
    }
}

/// A rate limiter's bucket, named by its key: `<namespace>rate:{<limiter>:<key>}:<policy>`
/// (the namespace and the key escaped as in the tagged layout, whatever the layout).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct BucketName {
    /// The limiter's name.
    pub limiter: String,
    /// The key it limits, unescaped.
    pub key: String,
    /// The policy's name.
    pub policy: String,
}

impl Space {
    /// `<escaped namespace>rate:{`: where every bucket of this space starts.
    fn rate_start(&self) -> String {
        format!("{}rate:{{", escape(&self.namespace))
    }

    /// The prefix of every bucket of `key` under `limiter`, before the policy's name.
    pub fn bucket_prefix(&self, limiter: &str, key: &str) -> String {
        format!("{}{limiter}:{}}}:", self.rate_start(), escape(key))
    }

    /// The `SCAN MATCH` pattern of every bucket whose `<limiter>:<key>` matches the glob
    /// `names` (a superset: check what is found with [`glob_match`]).
    pub fn rate_pattern(&self, names: &str) -> ScanPattern {
        let inner = server_glob(names, escape_char);
        ScanPattern {
            pattern: collapse_stars(&format!("{}{inner}}}:*", glob_escape(&self.rate_start()))),
            hashes_only: false,
        }
    }

    /// The `SCAN MATCH` pattern of the buckets of `key` under `limiter`.
    pub fn buckets_pattern(&self, limiter: &str, key: &str) -> ScanPattern {
        ScanPattern {
            pattern: format!("{}*", glob_escape(&self.bucket_prefix(limiter, key))),
            hashes_only: false,
        }
    }

    /// The bucket a scanned key is, `None` if the core would not have made it in this
    /// space.
    pub fn decode_bucket(&self, redis_key: &str) -> Option<BucketName> {
        let rest = redis_key.strip_prefix(&self.rate_start())?;
        let (inner, policy) = rest.split_once('}')?;
        let policy = policy.strip_prefix(':')?;
        let (limiter, key) = inner.split_once(':')?;
        let key = unescape(key)?;
        let ok = rate_name(limiter) && rate_name(policy) && valid_name(&key);
        ok.then(|| BucketName {
            limiter: limiter.to_owned(),
            key,
            policy: policy.to_owned(),
        })
    }
}

/// Whether the core accepts `name` for a limiter or a policy.
fn rate_name(name: &str) -> bool {
    let allowed = |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.');
    !name.is_empty() && name.len() <= lockwarden_core::MAX_RATE_NAME && name.chars().all(allowed)
}

/// One `SCAN` to run: its `MATCH` pattern, and whether only hashes are wanted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScanPattern {
    /// The `MATCH` glob.
    pub pattern: String,
    /// Scan with `TYPE hash`.
    pub hashes_only: bool,
}

/// Whether the core would accept `name` (non-empty, no control characters; the length
/// limit is a client setting, so not checked here).
fn valid_name(name: &str) -> bool {
    !name.is_empty() && !name.chars().any(char::is_control)
}

/// The core's escaping of a namespace or name in the tagged layout.
pub fn escape(raw: &str) -> String {
    let mut out = String::with_capacity(raw.len());
    for c in raw.chars() {
        escape_char(c, &mut out);
    }
    out
}

fn escape_char(c: char, out: &mut String) {
    match c {
        '%' => out.push_str("%25"),
        '{' => out.push_str("%7B"),
        '}' => out.push_str("%7D"),
        c => out.push(c),
    }
}

/// The inverse of [`escape`], strictly: `None` for a `%` not followed by `25`, `7B` or
/// `7D`, or a raw brace (the core never writes either).
pub fn unescape(escaped: &str) -> Option<String> {
    let mut out = String::with_capacity(escaped.len());
    let mut rest = escaped;
    while let Some(at) = rest.find(['%', '{', '}']) {
        out.push_str(&rest[..at]);
        let tail = &rest[at..];
        let (c, len) = if tail.starts_with("%25") {
            ('%', 3)
        } else if tail.starts_with("%7B") {
            ('{', 3)
        } else if tail.starts_with("%7D") {
            ('}', 3)
        } else {
            return None;
        };
        out.push(c);
        rest = &tail[len..];
    }
    out.push_str(rest);
    Some(out)
}

/// Escapes the glob metacharacters of a literal for a `MATCH` pattern.
fn glob_escape(literal: &str) -> String {
    let mut out = String::with_capacity(literal.len());
    for c in literal.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// A server-side glob that matches (at least) the keys of every name `pattern` matches:
/// literals laid out by `lay` and glob-escaped, `*` kept, and `?` and `[..]` widened to
/// `*` (one character of a name may be several bytes of a key: an escape, UTF-8).
fn server_glob(pattern: &str, lay: impl Fn(char, &mut String)) -> String {
    let mut out = String::new();
    let mut chars = pattern.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '*' | '?' => out.push('*'),
            '[' => {
                // Skip to the class's end (as Redis reads it: `]` right after `[` or `[^`
                // is a member); an unclosed class runs to the end.
                if chars.peek() == Some(&'^') {
                    chars.next();
                }
                let mut first = true;
                while let Some(c) = chars.next() {
                    if c == '\\' {
                        chars.next();
                    } else if c == ']' && !first {
                        break;
                    }
                    first = false;
                }
                out.push('*');
            }
            '\\' => {
                // A trailing `\` stands for itself, as Redis matches it.
                let lit = chars.next().unwrap_or('\\');
                let mut laid = String::new();
                lay(lit, &mut laid);
                out.push_str(&glob_escape(&laid));
            }
            c => {
                let mut laid = String::new();
                lay(c, &mut laid);
                out.push_str(&glob_escape(&laid));
            }
        }
    }
    out
}

fn collapse_stars(pattern: &str) -> String {
    let mut out = String::with_capacity(pattern.len());
    let (mut escaped, mut last_star) = (false, false);
    for c in pattern.chars() {
        if escaped {
            escaped = false;
            last_star = false;
        } else if c == '\\' {
            escaped = true;
            last_star = false;
        } else if c == '*' {
            if last_star {
                continue;
            }
            last_star = true;
        } else {
            last_star = false;
        }
        out.push(c);
    }
    out
}

/// Whether `text` matches the glob `pattern`, with Redis's rules (`*`, `?`, `[abc]`,
/// `[^a-z]`, `\` quoting the next character), by characters.
pub fn glob_match(pattern: &str, text: &str) -> bool {
    let p: Vec<char> = pattern.chars().collect();
    let t: Vec<char> = text.chars().collect();
    // Iterative with one backtrack point for the last `*`: linear in practice, and no
    // recursion a hostile pattern could blow up.
    let (mut pi, mut ti) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while ti < t.len() {
        if pi < p.len() {
            match p[pi] {
                '*' => {
                    star = Some((pi, ti));
                    pi += 1;
                    continue;
                }
                '?' => {
                    pi += 1;
                    ti += 1;
                    continue;
                }
                '[' => {
                    if let Some((matched, next)) = class_match(&p, pi, t[ti]) {
                        if matched {
                            pi = next;
                            ti += 1;
                            continue;
                        }
                    }
                }
                '\\' if pi + 1 < p.len() => {
                    if p[pi + 1] == t[ti] {
                        pi += 2;
                        ti += 1;
                        continue;
                    }
                }
                c => {
                    if c == t[ti] {
                        pi += 1;
                        ti += 1;
                        continue;
                    }
                }
            }
        }
        match star {
            Some((sp, st)) => {
                pi = sp + 1;
                ti = st + 1;
                star = Some((sp, st + 1));
            }
            None => return false,
        }
    }
    p[pi..].iter().all(|&c| c == '*')
}

/// Whether `c` is in the class starting at `p[at] == '['`, and where the pattern goes on.
fn class_match(p: &[char], at: usize, c: char) -> Option<(bool, usize)> {
    let mut i = at + 1;
    let negate = p.get(i) == Some(&'^');
    if negate {
        i += 1;
    }
    let mut hit = false;
    let mut first = true;
    loop {
        let &x = p.get(i)?;
        if x == ']' && !first {
            i += 1;
            break;
        }
        first = false;
        if x == '\\' {
            let &lit = p.get(i + 1)?;
            hit |= lit == c;
            i += 2;
        } else if p.get(i + 1) == Some(&'-') && p.get(i + 2).is_some_and(|&e| e != ']') {
            let (lo, hi) = (x.min(p[i + 2]), x.max(p[i + 2]));
            hit |= (lo..=hi).contains(&c);
            i += 3;
        } else {
            hit |= x == c;
            i += 1;
        }
    }
    Some((hit != negate, i))
}

/// The channel on which a queued fair waiter of the lock whose release channel is
/// `release` hears its turn: its client's, the holder id up to its last `:` (the core's
/// `fair_prelude.lua` publishes there, naming the holder).
pub fn turn_channel(release: &str, holder: &str) -> String {
    let client = holder.rsplit_once(':').map_or(holder, |(client, _)| client);
    format!("{release}:{client}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unescape_is_strict() {
        assert_eq!(unescape("a%7Bb%7D%25").as_deref(), Some("a{b}%"));
        assert_eq!(unescape("%7b"), None);
        assert_eq!(unescape("%"), None);
        assert_eq!(unescape("a{b"), None);
        assert_eq!(unescape("100%"), None);
    }

    #[test]
    fn tagged_keys_decode() {
        let s = Space::new(None, KeyLayout::Tagged);
        assert_eq!(
            s.decode("lockwarden:{a:b}"),
            Some(("a:b".into(), Part::Lock))
        );
        assert_eq!(
            s.decode("lockwarden:{%7Bx%7D}:queue"),
            Some(("{x}".into(), Part::Queue))
        );
        assert_eq!(
            s.decode("lockwarden:{a}:deadlines"),
            Some(("a".into(), Part::Deadlines))
        );
        // A semaphore has no companions but its fencing key.
        assert_eq!(s.decode("lockwarden:{a}:waiting-until"), None);
        assert_eq!(s.decode("lockwarden:{a}:released"), None);
        assert_eq!(s.decode("lockwarden:{a}:granted"), None);
        // A fenced value (`LockClient::fenced`) is the resource's, not a lock.
        assert_eq!(s.decode("lockwarden:{a}:fenced"), None);
        assert_eq!(s.decode("lockwarden:{a}:other"), None);
        assert_eq!(s.decode("lockwarden:{}"), None);
        assert_eq!(s.decode("lockwarden:x:{a}"), None);
        assert_eq!(s.decode("other:{a}"), None);
    }

    #[test]
    fn redisson_keys_decode() {
        let s = Space::new(None, KeyLayout::Redisson);
        assert_eq!(s.decode("res:1"), Some(("res:1".into(), Part::Lock)));
        assert_eq!(
            s.decode("redisson_lock__fence:{res:1}"),
            Some(("res:1".into(), Part::Fence))
        );
        assert_eq!(
            s.decode("redisson_lock__writers:{res:1}"),
            Some(("res:1".into(), Part::Writers))
        );
        assert_eq!(s.decode("redisson_lock__waiting:{res:1}"), None);
        assert_eq!(s.decode("redisson_lock__channel:{res:1}"), None);
        assert_eq!(s.decode("redisson_lock__granted:{res:1}"), None);
        assert_eq!(s.decode("redisson_lock__fenced:{res:1}"), None);
        assert_eq!(s.decode("lockwarden:{res}"), None);
        let ns = Space::new(Some("app:"), KeyLayout::Redisson);
        assert_eq!(ns.decode("app:x"), Some(("x".into(), Part::Lock)));
        assert_eq!(ns.decode("x"), None);
        assert_eq!(ns.decode("redisson_lock__done:{x}"), None);
    }

    #[test]
    fn scan_patterns_follow_the_layout() {
        let s = Space::new(None, KeyLayout::Tagged);
        assert_eq!(s.scan_patterns("*")[0].pattern, "lockwarden:{*}*");
        assert_eq!(s.scan_patterns("a{?")[0].pattern, "lockwarden:{a%7B*}*");
        assert_eq!(s.scan_patterns("a[bc]d*")[0].pattern, "lockwarden:{a*d*}*");
        assert_eq!(s.scan_patterns("\\*x")[0].pattern, "lockwarden:{\\*x}*");
        // A trailing backslash is a literal one (Redis matches it so).
        assert_eq!(s.scan_patterns("a\\")[0].pattern, "lockwarden:{a\\\\}*");
        let star = Space::new(Some("a*{"), KeyLayout::Tagged);
        assert_eq!(star.scan_patterns("*")[0].pattern, "a\\*%7B{*}*");
        let r = Space::new(None, KeyLayout::Redisson);
        let p = r.scan_patterns("*");
        assert_eq!(p[0].pattern, "*");
        assert!(p[0].hashes_only);
        assert_eq!(p[1].pattern, "redisson_lock__*:{*}");
    }

    #[test]
    fn globs_match_as_redis_does() {
        assert!(glob_match("*", ""));
        assert!(glob_match("a*", "abc"));
        assert!(glob_match("a?c", "abc"));
        assert!(!glob_match("a?c", "ac"));
        assert!(glob_match("a[bx]c", "axc"));
        assert!(!glob_match("a[^bx]c", "axc"));
        assert!(glob_match("a[a-c]d", "abd"));
        assert!(glob_match("a[]]b", "a]b"));
        assert!(glob_match("a\\*b", "a*b"));
        assert!(!glob_match("a\\*b", "axb"));
        assert!(glob_match("*:{42}", "orders:{42}"));
        assert!(glob_match("ü*", "ünï"));
        assert!(glob_match("*a*b*c*", "xxaxxbxxcxx"));
        assert!(!glob_match("*a*b*c*", "xxaxxcxxbxx"));
    }
}
