//! Fencing tokens in-process: the same rule as the scripts.

use std::time::{SystemTime, UNIX_EPOCH};

/// A new token from the clock (µs), never at or below `last`, which it then becomes.
pub(super) fn fresh_token(last: &mut u64) -> u64 {
    let clock = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX));
    *last = clock.max(*last + 1);
    *last
}
