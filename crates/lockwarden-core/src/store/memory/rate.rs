//! Rate limiters' buckets in-process: the same GCRA as `lua/rate_limit.lua`, in whole µs
//! of the store's clock (tokio's, so a test with paused time steps it), each bucket kept
//! only until it is full again.

use std::collections::HashMap;

use tokio::time::Instant;

use crate::store::contract::{Debts, RateAsk};

/// Every bucket that is not full, by its name (as Redis would name it), to its TAT in
/// µs since `epoch`.
pub(super) struct Buckets {
    tats: HashMap<Box<str>, u64>,
    epoch: Instant,
}

impl Default for Buckets {
    fn default() -> Self {
        Self {
            tats: HashMap::new(),
            epoch: Instant::now(),
        }
    }
}

impl Buckets {
    /// µs since the epoch at `now`.
    fn micros(&self, now: Instant) -> u64 {
        let since = now.saturating_duration_since(self.epoch).as_micros();
        u64::try_from(since).unwrap_or(u64::MAX)
    }

    /// One decision at `now`, as the script makes it.
    pub(super) fn decide(&mut self, ask: &RateAsk<'_>, now: Instant) -> Debts {
        let now = self.micros(now);
        let debts: Vec<u64> = ask
            .buckets
            .names()
            .map(|name| {
                let tat = self.tats.get(name).copied().unwrap_or(0);
                tat.saturating_sub(now)
            })
            .collect();
        let refused = debts
            .iter()
            .zip(ask.policies)
            .any(|(&debt, policy)| debt > ask.charge.room(policy));
        if refused {
            return Debts {
                refused,
                micros: debts,
            };
        }
        let mut after = Vec::with_capacity(debts.len());
        for ((name, debt), policy) in ask.buckets.names().zip(debts).zip(ask.policies) {
            let increment = ask.charge.increment(policy);
            if increment == 0 {
                after.push(debt);
                continue;
            }
            let debt = i128::from(debt) + i128::from(increment);
            match u64::try_from(debt) {
                Ok(debt) if debt > 0 => {
                    self.tats.insert(name.into(), now + debt);
                    after.push(debt);
                }
                _ => {
                    self.tats.remove(name);
                    after.push(0);
                }
            }
        }
        Debts {
            refused,
            micros: after,
        }
    }

    /// Forgets the buckets that are full again at `now`.
    pub(super) fn sweep(&mut self, now: Instant) {
        let now = self.micros(now);
        self.tats.retain(|_, tat| *tat > now);
    }

    /// Buckets kept.
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.tats.len()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::key::KeySpace;
    use crate::policy::RatePolicy;
    use crate::rate_key::RatePrefix;
    use crate::store::contract::Charge;

    #[tokio::test(start_paused = true)]
    async fn a_full_bucket_is_forgotten_and_a_refusal_charges_nothing() {
        let burst = RatePolicy::new("burst", 10, Duration::from_secs(1))
            .burst(2)
            .checked()
            .unwrap();
        let daily = RatePolicy::new("daily", 3, Duration::from_secs(3))
            .checked()
            .unwrap();
        let policies = [burst, daily];
        let keys = RatePrefix::new(&KeySpace::default(), "api")
            .buckets("k", ["burst", "daily"].into_iter())
            .unwrap();
        let mut buckets = Buckets::default();
        let ask = |charge| RateAsk {
            buckets: &keys,
            policies: &policies,
            charge,
        };
        let now = Instant::now();
        let taken = buckets.decide(&ask(Charge::Take(1)), now);
        assert_eq!(
            (taken.refused, taken.micros),
            (false, vec![100_000, 1_000_000])
        );
        buckets.decide(&ask(Charge::Take(1)), now);
        // The burst policy is out; the daily one still has room, and is not charged.
        let refused = buckets.decide(&ask(Charge::Take(1)), now);
        assert_eq!(
            (refused.refused, refused.micros),
            (true, vec![200_000, 2_000_000])
        );
        let refund = buckets.decide(&ask(Charge::Refund(1)), now);
        assert_eq!(refund.micros, vec![100_000, 1_000_000]);
        assert_eq!(buckets.len(), 2);
        buckets.sweep(now + Duration::from_millis(100));
        assert_eq!(buckets.len(), 1, "the burst bucket is full again");
        buckets.sweep(now + Duration::from_secs(1));
        assert_eq!(buckets.len(), 0, "nothing is kept for a full bucket");
        buckets.decide(&ask(Charge::Take(2)), now + Duration::from_secs(1));
        let reset = buckets.decide(&ask(Charge::Reset), now + Duration::from_secs(1));
        assert_eq!(reset.micros, vec![0, 0]);
        assert_eq!(buckets.len(), 0);
    }
}
