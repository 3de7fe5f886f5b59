//! The IETF `RateLimit-Policy` and `RateLimit` fields (draft-ietf-httpapi-ratelimit-headers,
//! draft 10), written for a rate decision or a concurrency limit: Structured Field lists,
//! one member per policy, e.g. `RateLimit-Policy: "burst";q=100;w=60` and
//! `RateLimit: "burst";r=50;t=30`.
//!
//! Policy names are checked by the engine (ASCII letters, digits, `_`, `-`, `.`), so each
//! is a Structured Field string as it is; the numbers are non-negative integers.

use std::fmt::Write as _;
use std::time::Duration;

use http::{HeaderName, HeaderValue};

use crate::{PolicyState, RatePolicy};

/// The `RateLimit-Policy` field: the quota policies a response's request is counted by.
pub const RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");

/// The `RateLimit` field: what each policy has left for the request's key.
pub const RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");

/// The policy name a [`LimitLayer`](super::LimitLayer) describes itself by.
pub(crate) const CONCURRENCY: &str = "concurrency";

/// `"<name>";q=<quota>;w=<window>` for each policy. The draft's window is whole seconds:
/// a window that is not is described by the whole seconds just above it and the quota
/// the policy's rate admits in them (10 per 500 ms: `q=20;w=1`).
pub(crate) fn policies<'a>(policies: impl IntoIterator<Item = &'a RatePolicy>) -> HeaderValue {
    let mut field = String::new();
    for policy in policies {
        let (quota, window) = in_whole_seconds(policy);
        member(&mut field, policy.name());
        let _ = write!(field, ";q={quota};w={window}");
    }
    value(field)
}

/// `"<name>";r=<remaining>;t=<seconds>` for each policy of a decision: `r` the units the
/// key may use now, `t` the whole seconds (rounded up) until one more is made available;
/// no `t` for a full bucket, to which nothing more comes.
pub(crate) fn limits(states: &[PolicyState]) -> HeaderValue {
    let mut field = String::new();
    for state in states {
        member(&mut field, state.policy().name());
        let _ = write!(field, ";r={}", state.remaining());
        if let Some(next) = next_unit(state) {
            let _ = write!(field, ";t={}", whole_seconds(next));
        }
    }
    value(field)
}

/// A concurrency limit of `capacity`: `"concurrency";q=<capacity>;qu="concurrent-requests"`.
pub(crate) fn concurrency_policy(capacity: u32) -> HeaderValue {
    value(format!(
        "\"{CONCURRENCY}\";q={capacity};qu=\"concurrent-requests\""
    ))
}

/// A concurrency limit with nothing left: `"concurrency";r=0`.
pub(crate) fn concurrency_full() -> HeaderValue {
    HeaderValue::from_static("\"concurrency\";r=0")
}

/// How long until a policy's bucket holds one more unit than `state` says it has now;
/// `None` when it is full. A bucket `debt` µs from full has `tolerance - debt` µs of room
/// (`tolerance` = burst × interval), of which `remaining` whole intervals: the next unit
/// comes when the room reaches `remaining + 1` intervals.
pub(crate) fn next_unit(state: &PolicyState) -> Option<Duration> {
    let policy = state.policy();
    let burst = policy.burst_size();
    if state.remaining() >= burst {
        return None;
    }
    let interval = policy.interval().as_micros();
    let tolerance = interval * u128::from(burst);
    let room = tolerance.saturating_sub(state.reset().as_micros());
    let wanted = interval * u128::from(state.remaining() + 1);
    let micros = wanted.saturating_sub(room).max(1);
    Some(Duration::from_micros(
        u64::try_from(micros).unwrap_or(u64::MAX),
    ))
}

/// Whole seconds, rounded up: never earlier than the time it stands for.
pub(crate) fn whole_seconds(duration: Duration) -> u64 {
    duration
        .as_secs()
        .saturating_add(u64::from(duration.subsec_nanos() > 0))
}

/// `(q, w)`: the quota and window in the draft's whole seconds.
fn in_whole_seconds(policy: &RatePolicy) -> (u64, u64) {
    let window = policy.window();
    let seconds = whole_seconds(window).max(1);
    let quota = u128::from(policy.quota());
    let micros = window.as_micros().max(1);
    let scaled = quota * u128::from(seconds) * 1_000_000 / micros;
    let quota = match window.subsec_nanos() == 0 && window.as_secs() > 0 {
        true => quota,
        false => scaled,
    };
    (u64::try_from(quota).unwrap_or(u64::MAX), seconds)
}

/// Starts a list member named `name` (a string), after a separator if one came before.
fn member(field: &mut String, name: &str) {
    if !field.is_empty() {
        field.push_str(", ");
    }
    field.push('"');
    field.push_str(name);
    field.push('"');
}

fn value(field: String) -> HeaderValue {
    // Names are checked ASCII, numbers are digits: always a valid field value.
    HeaderValue::try_from(field).unwrap_or_else(|_| HeaderValue::from_static(""))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_in_whole_seconds() {
        let per =
            |quota, ms| in_whole_seconds(&RatePolicy::new("p", quota, Duration::from_millis(ms)));
        assert_eq!(per(100, 60_000), (100, 60));
        assert_eq!(per(10, 500), (20, 1));
        assert_eq!(per(3, 1_500), (4, 2));
        assert_eq!(per(1_000, 86_400_000), (1_000, 86_400));
    }

    #[test]
    fn seconds_round_up() {
        assert_eq!(whole_seconds(Duration::ZERO), 0);
        assert_eq!(whole_seconds(Duration::from_micros(1)), 1);
        assert_eq!(whole_seconds(Duration::from_secs(30)), 30);
        assert_eq!(whole_seconds(Duration::from_millis(30_001)), 31);
    }
}
