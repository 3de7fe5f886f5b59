//! The request span: key (or its hash), wait time, outcome and hold time.

use std::fmt::Write as _;
use std::hash::{BuildHasher, RandomState};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use tracing::field::Empty;
use tracing::Span;

/// A span for one request through the lock layer; fields are recorded as they are known.
pub(crate) fn request_span() -> Span {
    tracing::info_span!(
        "lock_request",
        key = Empty,
        wait_ms = Empty,
        outcome = Empty,
        hold_ms = Empty,
    )
}

/// Records the key, or a stable hash of it when keys are redacted.
pub(crate) fn record_key(span: &Span, name: &str, redact: bool) {
    if span.is_disabled() {
        return;
    }
    if redact {
        span.record("key", tracing::field::display(redacted(name)));
    } else {
        span.record("key", name);
    }
}

/// The time now if `span` records durations (a subscriber wants it), else `None`: no
/// clock reads for a span nobody listens to.
pub(crate) fn clock(span: &Span) -> Option<Instant> {
    (!span.is_disabled()).then(Instant::now)
}

/// A duration as whole milliseconds, for the span's `wait_ms` and `hold_ms`.
pub(crate) fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// `keyed:<16 hex digits>`: a SipHash of the key under a random key drawn once per
/// process. Stable within the process, so the log lines of one key correlate; keyed, so a
/// low-entropy key (an order number, an email) cannot be recovered by hashing guesses. The
/// price: the same key hashes differently in another process (or after a restart).
pub(crate) fn redacted(name: &str) -> String {
    static KEY: OnceLock<RandomState> = OnceLock::new();
    redacted_with(KEY.get_or_init(RandomState::new), name)
}

fn redacted_with(key: &RandomState, name: &str) -> String {
    let mut out = String::with_capacity(22);
    out.push_str("keyed:");
    let _ = write!(out, "{:016x}", key.hash_one(name));
    out
}

#[cfg(test)]
mod tests {
    use std::hash::RandomState;

    #[test]
    fn redaction_is_stable_and_hides_the_key() {
        let a = super::redacted("secret-key");
        assert_eq!(a, super::redacted("secret-key"));
        assert!(!a.contains("secret"));
        assert_ne!(a, super::redacted("secret-kez"));
        assert_eq!(a.len(), "keyed:".len() + 16);
    }

    #[test]
    fn redaction_is_keyed_so_guesses_do_not_match_it() {
        // Two processes draw two keys: hashing a guess under any key but this process's
        // does not give this process's hash.
        let (ours, theirs) = (RandomState::new(), RandomState::new());
        let guess = super::redacted_with(&theirs, "order-1");
        assert_ne!(super::redacted_with(&ours, "order-1"), guess);
        assert_eq!(
            super::redacted_with(&ours, "order-1"),
            super::redacted_with(&ours, "order-1")
        );
    }
}
