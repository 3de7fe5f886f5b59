//! [`RateLimiter`]: requests per unit of time per key, across every process that uses it
//! (GCRA on the store's clock, one round trip per decision); and what a decision says,
//! [`RateDecision`] and [`PolicyState`]. Its promises, costs and Redis layout are
//! documented on the type.

use std::collections::HashSet;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::engine::Engine;
use crate::error::{LockError, RateLimitError};
use crate::metrics::{self, Operation, RateSeries};
use crate::policy::{check_name, Gcra, RatePolicy};
use crate::rate_key::{Buckets, RatePrefix};
use crate::store::contract::{Charge, Debts, LockStore, RateAsk};

/// The most policies one limiter checks in a decision.
pub const MAX_POLICIES: usize = 8;

/// A rate limiter made by [`LockClient::rate_limiter`](crate::LockClient::rate_limiter):
/// for each key, at most what each of its [policies](RatePolicy) allows, counted across
/// every process that uses the same limiter on the same store. Cheap to clone.
///
/// # What it promises
///
/// - **Exact, by the server's clock.** Each policy is GCRA: a key's bucket under it is
///   one number, the time at which it will be full again (its theoretical arrival time,
///   TAT), computed by the store's clock (Redis: `TIME` inside the script), never a
///   client's. Over any stretch of time `t`, a key is admitted at most
///   `burst + quota × t ÷ window` requests per policy, and that many while it asks for
///   more (see [`RatePolicy`] for the rounding of an emission interval that is not a whole
///   µs). A replica whose clock is wrong admits no more and no less.
/// - **All policies or none.** A request is charged to every policy or, when any policy
///   refuses it, to none: a request refused by "10 per second" costs nothing of "1,000 a
///   day".
/// - **One round trip per decision**, whatever the number of policies: one script
///   (`lua/rate_limit.lua`) reads, checks and charges every bucket.
/// - **An exact wait.** A refused decision says how long until the same request would be
///   admitted ([`RateDecision::retry_after`], to the µs), if nothing else is charged
///   meanwhile; each policy says what is left and when its bucket is full again.
/// - **Memory bounded by the keys in use.** A bucket is stored only while it is not
///   full: on Redis one small key per (policy, key) that expires when the bucket is full
///   again. Nothing is stored per request.
///
/// # Costs
///
/// [`check`](Self::check) charges a request of one unit, [`check_n`](Self::check_n) one of
/// several (bytes, rows, tokens: each policy counts in the same units);
/// [`peek`](Self::peek) says what a request would get without charging it;
/// [`refund`](Self::refund) gives back a charged request that was not served;
/// [`reset`](Self::reset) empties a key's buckets (an operator's action).
///
/// # Layout on Redis
///
/// A bucket is the string key `<namespace>rate:{<limiter>:<key>}:<policy>` (the key
/// escaped as a lock name is; every policy's bucket of one key shares its hash tag, so a
/// decision touches one cluster slot), holding the TAT in server µs as 16 digits, then
/// `:<emission interval µs>:<burst>` for the inspector; it expires at the first ms after
/// its TAT. The client's [`KeyLayout`](crate::KeyLayout) does not apply.
///
/// ```
/// use std::time::Duration;
/// use lockwarden_core::{LockClient, RatePolicy};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lockwarden_core::LockError> {
/// let client = LockClient::in_memory(); // LockClient::connect(url).await? for Redis
/// let api = client.rate_limiter(
///     "api",
///     [
///         RatePolicy::new("burst", 10, Duration::from_secs(1)).burst(2),
///         RatePolicy::new("daily", 1_000, Duration::from_secs(86_400)),
///     ],
/// )?;
/// assert!(api.check("tenant:7").await?.is_allowed());
/// assert!(api.check("tenant:7").await?.is_allowed());
/// let third = api.check("tenant:7").await?;
/// assert!(!third.is_allowed());
/// // The burst policy refused it, so the daily one was not charged.
/// assert!(third.retry_after().unwrap() <= Duration::from_millis(100));
/// assert_eq!(third.policies()[1].remaining(), 998);
/// # Ok(()) }
/// ```
#[derive(Clone)]
#[must_use = "a RateLimiter does nothing until it checks a key"]
pub struct RateLimiter {
    engine: Arc<Engine>,
    limiter: Arc<Limiter>,
}

/// What every clone of a limiter shares: its settings, checked, and what each decision
/// reuses.
struct Limiter {
    name: Box<str>,
    policies: Box<[RatePolicy]>,
    gcra: Box<[Gcra]>,
    prefix: RatePrefix,
    series: RateSeries,
}

impl RateLimiter {
    /// A limiter named `name` on `engine`, once its name and policies are checked.
    pub(crate) fn new(
        engine: Arc<Engine>,
        name: &str,
        policies: impl IntoIterator<Item = RatePolicy>,
    ) -> Result<Self, LockError> {
        let invalid = |problem| LockError::InvalidRateLimit {
            limiter: name.to_owned(),
            problem,
        };
        check_name("limiter", name).map_err(invalid)?;
        let policies: Box<[RatePolicy]> = policies.into_iter().collect();
        if policies.is_empty() {
            return Err(invalid(RateLimitError::NoPolicies));
        }
        if policies.len() > MAX_POLICIES {
            return Err(invalid(RateLimitError::TooManyPolicies {
                count: policies.len(),
                max: MAX_POLICIES,
            }));
        }
        let mut names = HashSet::new();
        let mut gcra = Vec::with_capacity(policies.len());
        for policy in &*policies {
            gcra.push(policy.checked().map_err(invalid)?);
            if !names.insert(policy.name()) {
                return Err(invalid(RateLimitError::DuplicatePolicy {
                    policy: policy.name().to_owned(),
                }));
            }
        }
        let limiter = Limiter {
            prefix: RatePrefix::new(engine.key_space(), name),
            series: RateSeries::new(name, policies.iter().map(RatePolicy::name)),
            name: name.into(),
            gcra: gcra.into(),
            policies,
        };
        Ok(Self {
            engine,
            limiter: Arc::new(limiter),
        })
    }

    /// The limiter's name.
    pub fn name(&self) -> &str {
        &self.limiter.name
    }

    /// Its policies, in the order decisions list them.
    pub fn policies(&self) -> &[RatePolicy] {
        &self.limiter.policies
    }

    /// Charges one request for `key` to every policy if each admits it now, else to none.
    /// One round trip.
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use lockwarden_core::{LockClient, RatePolicy};
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lockwarden_core::LockError> {
    /// let client = LockClient::in_memory();
    /// let logins = client.rate_limiter("logins", [RatePolicy::new("minute", 5, Duration::from_secs(60))])?;
    /// let decision = logins.check("user:alice").await?;
    /// if !decision.is_allowed() {
    ///     let wait = decision.retry_after().unwrap_or_default();
    ///     println!("too many logins; try again in {wait:?}");
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`LockError::InvalidKey`] for an empty key, one longer than the client's limit
    /// ([`DEFAULT_MAX_KEY_LEN`](crate::DEFAULT_MAX_KEY_LEN) bytes by default) or with a
    /// control character, [`LockError::Backend`] if the store failed; nothing is charged.
    /// A refusal is not an error: it is a decision that is not
    /// [allowed](RateDecision::is_allowed).
    pub async fn check(&self, key: impl AsRef<str>) -> Result<RateDecision, LockError> {
        self.check_n(key, 1).await
    }

    /// Charges a request of `cost` units (each policy counts in the same units: bytes,
    /// rows, tokens) for `key` to every policy if each admits it now, else to none.
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use lockwarden_core::{LockClient, RatePolicy};
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lockwarden_core::LockError> {
    /// let client = LockClient::in_memory();
    /// // 1 MiB per second per tenant, counted in KiB, 4 MiB at once.
    /// let upload = RatePolicy::new("kib", 1024, Duration::from_secs(1)).burst(4096);
    /// let uploads = client.rate_limiter("uploads", [upload])?;
    /// assert!(uploads.check_n("tenant:7", 3000).await?.is_allowed());
    /// assert!(!uploads.check_n("tenant:7", 3000).await?.is_allowed());
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As [`check`](Self::check), and [`LockError::InvalidRateLimit`] for a cost of 0
    /// ([`RateLimitError::ZeroCost`]: use [`peek`](Self::peek)) or above a policy's burst
    /// ([`RateLimitError::CostAboveBurst`]: it could never be admitted).
    pub async fn check_n(
        &self,
        key: impl AsRef<str>,
        cost: u32,
    ) -> Result<RateDecision, LockError> {
        self.admissible(cost)?;
        let buckets = self.buckets(key.as_ref())?;
        let debts = self.decide(&buckets, Charge::Take(cost)).await?;
        let decision = self.decision(&debts, cost, !debts.refused);
        let series = &self.limiter.series;
        match decision.allowed {
            true => series.allowed(),
            false => series.refused(decision.states.iter().map(|state| state.refused)),
        }
        Ok(decision)
    }

    /// What [`check`](Self::check) would answer for `key` now, charging nothing.
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use lockwarden_core::{LockClient, RatePolicy};
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lockwarden_core::LockError> {
    /// let client = LockClient::in_memory();
    /// let api = client.rate_limiter("api", [RatePolicy::new("second", 3, Duration::from_secs(1))])?;
    /// api.check("k").await?;
    /// let now = api.peek("k").await?;
    /// assert!(now.is_allowed());
    /// assert_eq!(now.policies()[0].remaining(), 2); // the peek took nothing
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As [`check`](Self::check).
    pub async fn peek(&self, key: impl AsRef<str>) -> Result<RateDecision, LockError> {
        self.peek_n(key, 1).await
    }

    /// What [`check_n`](Self::check_n) would answer for `key` and `cost` now, charging
    /// nothing.
    ///
    /// # Errors
    /// As [`check_n`](Self::check_n).
    pub async fn peek_n(&self, key: impl AsRef<str>, cost: u32) -> Result<RateDecision, LockError> {
        self.admissible(cost)?;
        let buckets = self.buckets(key.as_ref())?;
        let debts = self.decide(&buckets, Charge::Peek).await?;
        Ok(self.decision(&debts, cost, false))
    }

    /// Gives `cost` units back to every policy's bucket of `key`: for a request that was
    /// charged and then not served (its handler failed before doing the work), so that it
    /// does not count. A bucket is never filled past full.
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use lockwarden_core::{LockClient, RatePolicy};
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lockwarden_core::LockError> {
    /// let client = LockClient::in_memory();
    /// let api = client.rate_limiter("api", [RatePolicy::new("minute", 1, Duration::from_secs(60))])?;
    /// assert!(api.check("k").await?.is_allowed());
    /// api.refund("k", 1).await?; // the downstream call failed: it does not count
    /// assert!(api.check("k").await?.is_allowed());
    /// # Ok(()) }
    /// ```
    ///
    /// Give back only what was charged: a refund sent for a request that was refused
    /// gives its key more than its policies allow. On a Redis Cluster a refund whose
    /// connection broke may be sent again by the cluster client, and counted twice.
    ///
    /// # Errors
    /// As [`check`](Self::check); [`RateLimitError::ZeroCost`] for a cost of 0.
    pub async fn refund(&self, key: impl AsRef<str>, cost: u32) -> Result<(), LockError> {
        if cost == 0 {
            return Err(self.invalid(RateLimitError::ZeroCost));
        }
        let buckets = self.buckets(key.as_ref())?;
        self.decide(&buckets, Charge::Refund(cost)).await?;
        Ok(())
    }

    /// Empties every policy's bucket of `key`, whatever it holds: its next request finds
    /// them full. An operator's action (the `lockwarden` inspector's `reset`), as a
    /// force-unlock is for a lock.
    ///
    /// # Errors
    /// As [`check`](Self::check).
    pub async fn reset(&self, key: impl AsRef<str>) -> Result<(), LockError> {
        let buckets = self.buckets(key.as_ref())?;
        self.decide(&buckets, Charge::Reset).await?;
        Ok(())
    }

    /// The Redis keys of `key`'s buckets, one per policy, in order (see *Layout on
    /// Redis*).
    ///
    /// ```
    /// # use std::time::Duration;
    /// # use lockwarden_core::{LockClient, RatePolicy};
    /// let client = LockClient::in_memory();
    /// let api = client.rate_limiter("api", [RatePolicy::new("burst", 10, Duration::from_secs(1))])?;
    /// assert_eq!(api.bucket_keys("tenant:7")?, ["lockwarden:rate:{api:tenant:7}:burst"]);
    /// # Ok::<(), lockwarden_core::LockError>(())
    /// ```
    ///
    /// # Errors
    /// [`LockError::InvalidKey`], as for [`check`](Self::check).
    pub fn bucket_keys(&self, key: impl AsRef<str>) -> Result<Vec<String>, LockError> {
        let buckets = self.buckets(key.as_ref())?;
        Ok(buckets.names().map(str::to_owned).collect())
    }

    fn invalid(&self, problem: RateLimitError) -> LockError {
        LockError::InvalidRateLimit {
            limiter: self.name().to_owned(),
            problem,
        }
    }

    /// Whether a request of `cost` can ever be admitted.
    fn admissible(&self, cost: u32) -> Result<(), LockError> {
        if cost == 0 {
            return Err(self.invalid(RateLimitError::ZeroCost));
        }
        let limiter = &*self.limiter;
        let too_big = limiter.policies.iter().zip(&*limiter.gcra);
        match too_big.into_iter().find(|(_, gcra)| cost > gcra.burst) {
            None => Ok(()),
            Some((policy, gcra)) => Err(self.invalid(RateLimitError::CostAboveBurst {
                policy: policy.name().to_owned(),
                cost,
                burst: gcra.burst,
            })),
        }
    }

    fn buckets(&self, key: &str) -> Result<Buckets, LockError> {
        let limiter = &*self.limiter;
        let policies = limiter.policies.iter().map(RatePolicy::name);
        Ok(limiter.prefix.buckets(key, policies)?)
    }

    /// Applies `charge` to `buckets` in the store.
    async fn decide(&self, buckets: &Buckets, charge: Charge) -> Result<Debts, LockError> {
        let ask = RateAsk {
            buckets,
            policies: &self.limiter.gcra,
            charge,
        };
        let debts = self.engine.store().rate(&ask).await.inspect_err(|error| {
            metrics::backend_error(Operation::Rate, error);
        })?;
        if debts.micros.len() != buckets.len() {
            return Err(crate::error::BackendError::Protocol(format!(
                "{} debts for {} policies",
                debts.micros.len(),
                buckets.len()
            ))
            .into());
        }
        Ok(debts)
    }

    /// What the store's `debts` mean for a request of `cost`: admitted if the store `took`
    /// it (the debts are then after the charge); otherwise (refused, or a look) admitted
    /// only if every policy would take it now, the debts being as they are.
    fn decision(&self, debts: &Debts, cost: u32, took: bool) -> RateDecision {
        let limiter = &*self.limiter;
        let mut wait = 0;
        let states = limiter
            .policies
            .iter()
            .zip(&*limiter.gcra)
            .zip(&debts.micros)
            .map(|((policy, gcra), &debt)| {
                let policy_wait = match took {
                    true => 0,
                    false => gcra.wait(debt, cost),
                };
                wait = wait.max(policy_wait);
                PolicyState {
                    policy: policy.clone(),
                    remaining: gcra.remaining(debt),
                    reset: Duration::from_micros(debt),
                    refused: policy_wait > 0,
                }
            })
            .collect();
        RateDecision {
            allowed: wait == 0,
            retry_after: Duration::from_micros(wait),
            states,
        }
    }
}

impl fmt::Debug for RateLimiter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RateLimiter")
            .field("name", &self.name())
            .field("policies", &self.policies())
            .finish()
    }
}

/// What a rate limiter answered for one request (see [`RateLimiter::check`]): whether it
/// was admitted, the exact wait when it was not, and each policy's state afterwards.
///
/// Enough for the `RateLimit-Policy` and `RateLimit` headers of the IETF draft
/// (`"burst";q=100;w=60` from each [`PolicyState::policy`], `"burst";r=50;t=30` from its
/// [`remaining`](PolicyState::remaining) and [`reset`](PolicyState::reset)) and for
/// `Retry-After` ([`retry_after`](Self::retry_after)).
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use = "a rate decision says whether to serve the request"]
pub struct RateDecision {
    allowed: bool,
    retry_after: Duration,
    states: Vec<PolicyState>,
}

impl RateDecision {
    /// Whether the request was admitted (and charged to every policy); for a
    /// [peek](RateLimiter::peek), whether it would be now.
    pub fn is_allowed(&self) -> bool {
        self.allowed
    }

    /// For a refused request, how long until the same request would be admitted (to the
    /// µs, if no other request is charged meanwhile): the longest wait of the policies
    /// that refused it. `None` when it was admitted.
    pub fn retry_after(&self) -> Option<Duration> {
        (!self.allowed).then_some(self.retry_after)
    }

    /// Each policy's state after the decision, in the limiter's order.
    pub fn policies(&self) -> &[PolicyState] {
        &self.states
    }

    /// The policies that refused the request (none when it was admitted).
    pub fn refused_by(&self) -> impl Iterator<Item = &PolicyState> {
        self.states.iter().filter(|state| state.refused)
    }
}

/// One policy's part of a [`RateDecision`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicyState {
    policy: RatePolicy,
    remaining: u32,
    reset: Duration,
    refused: bool,
}

impl PolicyState {
    /// The policy (its name, quota, window and burst).
    pub fn policy(&self) -> &RatePolicy {
        &self.policy
    }

    /// Units this policy admits for the key right now, after this decision (at most its
    /// burst).
    pub fn remaining(&self) -> u32 {
        self.remaining
    }

    /// How long until the key's bucket is full again under this policy (its whole burst
    /// admitted at once), if nothing more is charged; zero when it is full.
    pub fn reset(&self) -> Duration {
        self.reset
    }

    /// Whether this policy refused the request (for a look: would refuse it).
    pub fn refused(&self) -> bool {
        self.refused
    }
}
