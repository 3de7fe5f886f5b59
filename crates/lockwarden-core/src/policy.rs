//! [`RatePolicy`]: how many requests per window a rate limiter admits for one key, and how
//! many at once; and [`Gcra`], the numbers the stores run it with, checked once when the
//! limiter is made.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::error::RateLimitError;

/// The longest a bucket may take to fill up again from empty (its burst × its emission
/// interval): 2^48 µs, about 8.9 years. TATs are server µs kept exactly in Redis's Lua
/// numbers (doubles, exact below 2^53), and a bucket's key lives that long at most.
pub const MAX_REFILL: Duration = Duration::from_micros(1 << 48);

/// The longest name a limiter or a policy may have, in bytes.
pub const MAX_RATE_NAME: usize = 64;

/// One quota of a [`RateLimiter`](crate::RateLimiter): `quota` requests per `window` for
/// each key, of which up to `burst` (by default `quota`) at once.
///
/// It is run as GCRA (the generic cell rate algorithm): a key's bucket is the time at
/// which it will be full again (its theoretical arrival time), one number per (policy,
/// key). A request costs one *emission interval*, `window ÷ quota`; it is admitted while
/// the bucket is no more than `burst` intervals from full. So over any stretch of time
/// `t`, a key is admitted at most `burst + quota × t ÷ window` requests, and exactly that
/// many while it asks for more. The interval is kept in whole µs (the server's clock
/// ticks in µs), rounded up when `window ÷ quota` is not whole: a policy then admits less
/// than its rate by at most 1 µs per interval (0.0003 % for 3 per second, 2 % for 30,000
/// per second), never more.
///
/// The name tells policies apart, in the Redis keys, the metrics and, through the HTTP
/// layer, the `RateLimit` headers of the IETF draft (`"burst";q=100;w=60`): 1 to
/// [`MAX_RATE_NAME`] ASCII letters, digits, `_`, `-` or `.`.
///
/// ```
/// use std::time::Duration;
/// use lockwarden_core::RatePolicy;
///
/// // 10 per second, 20 at once:
/// let burst = RatePolicy::new("burst", 10, Duration::from_secs(1)).burst(20);
/// assert_eq!(burst.interval(), Duration::from_millis(100));
/// // 1,000 a day, all of them at once if the caller likes:
/// let daily = RatePolicy::new("daily", 1_000, Duration::from_secs(86_400));
/// assert_eq!(daily.burst_size(), 1_000);
/// ```
///
/// Nothing is checked here: [`LockClient::rate_limiter`](crate::LockClient::rate_limiter)
/// checks every policy of a limiter at once (a zero quota or burst, a window too short
/// for one request per µs or too long to keep, a bad name).
#[derive(Clone, PartialEq, Eq)]
#[must_use = "a RatePolicy does nothing until a rate limiter is made with it"]
pub struct RatePolicy {
    name: Arc<str>,
    quota: u32,
    window: Duration,
    burst: Option<u32>,
}

impl RatePolicy {
    /// `quota` requests per `window` for each key, `quota` of them at once (see
    /// [`burst`](Self::burst)).
    pub fn new(name: impl AsRef<str>, quota: u32, window: Duration) -> Self {
        Self {
            name: name.as_ref().into(),
            quota,
            window,
            burst: None,
        }
    }

    /// Admits up to `burst` requests at once for a key whose bucket is full (after which
    /// they come one per [`interval`](Self::interval)); `quota` by default.
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use lockwarden_core::RatePolicy;
    /// let smooth = RatePolicy::new("smooth", 100, Duration::from_secs(60)).burst(1);
    /// assert_eq!(smooth.burst_size(), 1);
    /// ```
    pub fn burst(mut self, burst: u32) -> Self {
        self.burst = Some(burst);
        self
    }

    /// The policy's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Requests per window.
    pub fn quota(&self) -> u32 {
        self.quota
    }

    /// The window the quota is counted over.
    pub fn window(&self) -> Duration {
        self.window
    }

    /// Requests admitted at once when a key's bucket is full.
    pub fn burst_size(&self) -> u32 {
        self.burst.unwrap_or(self.quota)
    }

    /// The emission interval: what one request costs, `window ÷ quota` rounded up to a
    /// whole µs (zero for a zero quota, which a limiter refuses).
    pub fn interval(&self) -> Duration {
        Duration::from_micros(self.interval_micros().unwrap_or(0))
    }

    fn interval_micros(&self) -> Option<u64> {
        let window = self.window.as_micros();
        let quota = u128::from(self.quota);
        (quota > 0).then(|| u64::try_from(window.div_ceil(quota)).unwrap_or(u64::MAX))
    }

    /// The numbers a store runs this policy with, or what is wrong with it.
    pub(crate) fn checked(&self) -> Result<Gcra, RateLimitError> {
        let policy = || self.name().to_owned();
        check_name("policy", self.name())?;
        let interval = self
            .interval_micros()
            .ok_or_else(|| RateLimitError::ZeroQuota { policy: policy() })?;
        let burst = self.burst_size();
        if burst == 0 {
            return Err(RateLimitError::ZeroBurst { policy: policy() });
        }
        if self.window.as_micros() < u128::from(self.quota) {
            return Err(RateLimitError::TooFast {
                policy: policy(),
                quota: self.quota,
                window: self.window,
            });
        }
        let refill = interval.checked_mul(u64::from(burst));
        let max = u64::try_from(MAX_REFILL.as_micros()).unwrap_or(u64::MAX);
        match refill {
            Some(tolerance) if tolerance <= max => Ok(Gcra {
                interval,
                tolerance,
                burst,
                spec: format!("{interval}:{burst}").into(),
            }),
            _ => Err(RateLimitError::TooLong {
                policy: policy(),
                burst,
                interval: Duration::from_micros(interval),
            }),
        }
    }
}

impl fmt::Debug for RatePolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RatePolicy")
            .field("name", &self.name())
            .field("quota", &self.quota)
            .field("window", &self.window)
            .field("burst", &self.burst_size())
            .finish()
    }
}

/// Whether `name` may name a limiter or a policy (`what`): 1 to [`MAX_RATE_NAME`] ASCII
/// letters, digits, `_`, `-` or `.`; they are parts of Redis keys and metric labels.
pub(crate) fn check_name(what: &'static str, name: &str) -> Result<(), RateLimitError> {
    let allowed = |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.');
    if name.is_empty() || name.len() > MAX_RATE_NAME || !name.chars().all(allowed) {
        return Err(RateLimitError::InvalidName {
            what,
            name: name.to_owned(),
        });
    }
    Ok(())
}

/// A policy as the stores run it: GCRA in whole µs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Gcra {
    /// What one unit costs: the emission interval, µs (at least 1).
    pub(crate) interval: u64,
    /// How far ahead of now a bucket's TAT may run and still admit: burst × interval, µs.
    pub(crate) tolerance: u64,
    /// Units admitted at once from full.
    pub(crate) burst: u32,
    /// `<interval>:<burst>`, kept with the bucket on Redis for the inspector.
    pub(crate) spec: Box<str>,
}

impl Gcra {
    /// Whole units a bucket `debt` µs from full admits now.
    pub(crate) fn remaining(&self, debt: u64) -> u32 {
        let room = self.tolerance.saturating_sub(debt) / self.interval;
        u32::try_from(room).unwrap_or(u32::MAX).min(self.burst)
    }

    /// How long a bucket `debt` µs from full makes a request of `cost` units wait:
    /// zero if it is admitted now.
    pub(crate) fn wait(&self, debt: u64, cost: u32) -> u64 {
        let charged = u64::from(cost).saturating_mul(self.interval);
        debt.saturating_add(charged).saturating_sub(self.tolerance)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn checked(policy: RatePolicy) -> Result<Gcra, RateLimitError> {
        policy.checked()
    }

    #[test]
    fn an_interval_that_is_not_whole_is_rounded_up() {
        let third = checked(RatePolicy::new("p", 3, Duration::from_secs(1))).unwrap();
        assert_eq!(third.interval, 333_334);
        assert_eq!(third.tolerance, 3 * 333_334);
        assert_eq!(&*third.spec, "333334:3");
        let exact = checked(RatePolicy::new("p", 100, Duration::from_secs(1)).burst(20)).unwrap();
        assert_eq!((exact.interval, exact.tolerance), (10_000, 200_000));
        // A full bucket admits the whole burst, then one per interval.
        assert_eq!(exact.remaining(0), 20);
        assert_eq!(exact.remaining(190_000), 1);
        assert_eq!(exact.remaining(190_001), 0);
        assert_eq!(exact.wait(190_000, 1), 0);
        assert_eq!(exact.wait(190_001, 1), 1);
        assert_eq!(exact.wait(200_000, 2), 20_000);
    }

    #[test]
    fn bad_policies_are_named() {
        let zero = RatePolicy::new("z", 0, Duration::from_secs(1));
        assert!(matches!(
            checked(zero),
            Err(RateLimitError::ZeroQuota { .. })
        ));
        let no_burst = RatePolicy::new("b", 5, Duration::from_secs(1)).burst(0);
        assert!(matches!(
            checked(no_burst),
            Err(RateLimitError::ZeroBurst { .. })
        ));
        let fast = RatePolicy::new("f", 2_000_000, Duration::from_secs(1));
        assert!(matches!(checked(fast), Err(RateLimitError::TooFast { .. })));
        let instant = RatePolicy::new("i", 1, Duration::ZERO);
        assert!(matches!(
            checked(instant),
            Err(RateLimitError::TooFast { .. })
        ));
        let long = RatePolicy::new("l", 1, Duration::from_secs(86_400 * 366 * 9));
        assert!(matches!(checked(long), Err(RateLimitError::TooLong { .. })));
        let huge = RatePolicy::new("h", 1, Duration::MAX);
        assert!(matches!(checked(huge), Err(RateLimitError::TooLong { .. })));
        for name in ["", "a b", "a:b", "{x}", &"x".repeat(65)] {
            let bad = RatePolicy::new(name, 1, Duration::from_secs(1));
            assert!(
                matches!(checked(bad), Err(RateLimitError::InvalidName { .. })),
                "{name:?}"
            );
        }
        assert!(checked(RatePolicy::new("per-day_1.x", 1, Duration::from_secs(1))).is_ok());
    }
}
