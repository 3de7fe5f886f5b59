//! The request span: key (or its hash), wait time, outcome and hold time.

use std::fmt::Write as _;
use std::time::Duration;

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

/// A duration as whole milliseconds, for the span's `wait_ms` and `hold_ms`.
pub(crate) fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

/// `fnv1a:<16 hex digits>`: stable across processes, so logs of one key correlate. Not a
/// secret-proof digest: low-entropy keys can be guessed by hashing candidates.
pub(crate) fn redacted(name: &str) -> String {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in name.bytes() {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    let mut out = String::with_capacity(22);
    out.push_str("fnv1a:");
    let _ = write!(out, "{hash:016x}");
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn redaction_is_stable_and_hides_the_key() {
        let a = super::redacted("secret-key");
        assert_eq!(a, super::redacted("secret-key"));
        assert!(!a.contains("secret"));
        assert_ne!(a, super::redacted("secret-kez"));
        assert_eq!(a.len(), "fnv1a:".len() + 16);
    }
}
