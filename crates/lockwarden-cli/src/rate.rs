//! Rate limiters' buckets: finding them (`SCAN`), reading what each has left by the
//! server's clock, and emptying one key's (through the core's own script).
//!
//! A bucket is a string key holding its theoretical arrival time (TAT, server µs) as 16
//! digits, then `:<emission interval µs>:<burst>` (see lockwarden-core's `RateLimiter`),
//! and expiring when it is full again: a key with no bucket is full under every policy.
//! What is left is read as the core reads it: the debt is `TAT − now` (the server's
//! `TIME`, in the same pipeline as the reads, on the node that has the buckets), and a
//! bucket admits `(interval × burst − debt) ÷ interval` more (at most its burst) and is
//! full again after the debt.

use std::collections::BTreeMap;
use std::time::Duration;

use lockwarden_core::redis::{self, Value};
use lockwarden_core::{LockClient, RatePolicy};
use serde::Serialize;

use crate::error::CliError;
use crate::names::{glob_match, BucketName, ScanPattern, Space};
use crate::scan::{scan_keys, Bounds, ScanReport};
use crate::target::{bounded, Target};

/// Buckets read per pipeline.
const PER_PIPELINE: usize = 1000;

/// One key of one rate limiter: its buckets that are not full.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct RateView {
    /// The limiter's name.
    pub limiter: String,
    /// The key it limits.
    pub key: String,
    /// One per policy whose bucket is not full, by policy name.
    pub buckets: Vec<BucketView>,
}

/// One policy's bucket of a key.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct BucketView {
    /// The policy's name.
    pub policy: String,
    /// The bucket's Redis key.
    pub redis_key: String,
    /// What one unit costs, µs.
    pub interval_us: u64,
    /// Units admitted at once from full.
    pub burst: u64,
    /// Units admitted now.
    pub remaining: u64,
    /// Until the bucket is full again, µs (by the server's clock).
    pub reset_us: u64,
}

/// What is left of a bucket whose stored value is `value`, at server time `now` (µs):
/// `None` if the value is not one the core writes.
pub fn bucket(name: &BucketName, redis_key: &str, value: &str, now: u64) -> Option<BucketView> {
    let tat: u64 = value.get(..16)?.parse().ok()?;
    let (interval, burst) = value.get(16..)?.strip_prefix(':')?.split_once(':')?;
    let (interval, burst): (u64, u64) = (interval.parse().ok()?, burst.parse().ok()?);
    if interval == 0 || burst == 0 {
        return None;
    }
    let debt = tat.saturating_sub(now);
    let room = interval.saturating_mul(burst).saturating_sub(debt) / interval;
    Some(BucketView {
        policy: name.policy.clone(),
        redis_key: redis_key.to_owned(),
        interval_us: interval,
        burst,
        remaining: room.min(burst),
        reset_us: debt,
    })
}

/// The buckets found by a scan, by node, then by their (limiter, key).
type Found = BTreeMap<usize, Vec<(BucketName, String)>>;

/// Every key of every limiter whose `<limiter>:<key>` matches the glob `names`, with
/// what its buckets have left, sorted by limiter and key.
///
/// # Errors
/// [`CliError::Redis`] if a `SCAN` or a read fails.
pub async fn list(
    target: &Target,
    space: &Space,
    names: &str,
    bounds: Bounds,
) -> Result<(Vec<RateView>, ScanReport), CliError> {
    let pattern = space.rate_pattern(names);
    let mut found = Found::new();
    let report = scan(target, space, &pattern, bounds, &mut found, |name| {
        glob_match(names, &format!("{}:{}", name.limiter, name.key))
    })
    .await?;
    Ok((read(target, found).await?, report))
}

/// `key`'s buckets under `limiter`, `None` if every one is full (none is stored).
///
/// # Errors
/// [`CliError::Redis`] if a `SCAN` or a read fails.
pub async fn show(
    target: &Target,
    space: &Space,
    limiter: &str,
    key: &str,
    bounds: Bounds,
) -> Result<Option<RateView>, CliError> {
    let pattern = space.buckets_pattern(limiter, key);
    let mut found = Found::new();
    scan(target, space, &pattern, bounds, &mut found, |name| {
        name.limiter == limiter && name.key == key
    })
    .await?;
    Ok(read(target, found).await?.into_iter().next())
}

/// Empties `view`'s buckets through the core (`RateLimiter::reset`, the script every
/// application runs), with the policies as the buckets describe them.
///
/// # Errors
/// [`CliError::Redis`] if the core refuses the policies or the reset fails.
pub async fn reset(client: &LockClient, view: &RateView) -> Result<(), CliError> {
    let policies = view.buckets.iter().map(|b| {
        let burst = u32::try_from(b.burst).unwrap_or(u32::MAX);
        RatePolicy::new(&b.policy, 1, Duration::from_micros(b.interval_us)).burst(burst)
    });
    let failed = |e: lockwarden_core::LockError| {
        CliError::Redis(format!(
            "reset of {:?} of rate limiter {:?} failed: {e}",
            view.key, view.limiter
        ))
    };
    let limiter = client
        .rate_limiter(&view.limiter, policies)
        .map_err(failed)?;
    limiter.reset(&view.key).await.map_err(failed)
}

async fn scan(
    target: &Target,
    space: &Space,
    pattern: &ScanPattern,
    bounds: Bounds,
    found: &mut Found,
    wanted: impl Fn(&BucketName) -> bool,
) -> Result<ScanReport, CliError> {
    scan_keys(
        target,
        std::slice::from_ref(pattern),
        bounds,
        |node, key| {
            if let Some(name) = space.decode_bucket(key) {
                if wanted(&name) {
                    found.entry(node).or_default().push((name, key.to_owned()));
                }
            }
        },
    )
    .await
}

/// Reads every bucket found, on its node, with the node's clock.
async fn read(target: &Target, found: Found) -> Result<Vec<RateView>, CliError> {
    let mut views: BTreeMap<(String, String), Vec<BucketView>> = BTreeMap::new();
    for (node, mut buckets) in found {
        buckets.sort();
        buckets.dedup();
        let node = &target.nodes()[node];
        for chunk in buckets.chunks(PER_PIPELINE) {
            let mut pipe = redis::pipe();
            pipe.cmd("TIME");
            for (_, key) in chunk {
                pipe.cmd("GET").arg(key);
            }
            let mut conn = node.conn.clone();
            let replies: Vec<Value> = bounded(target.timeout(), pipe.query_async(&mut conn))
                .await
                .map_err(|e| CliError::Redis(format!("reading buckets on {}: {e}", node.addr)))?;
            let mut replies = replies.into_iter();
            let now = replies
                .next()
                .and_then(|time| server_micros(&time))
                .ok_or_else(|| CliError::Redis(format!("TIME on {} gave no time", node.addr)))?;
            for ((name, key), value) in chunk.iter().zip(replies) {
                // Gone since the scan: full again.
                let Value::BulkString(value) = value else {
                    continue;
                };
                let Some(view) = std::str::from_utf8(&value)
                    .ok()
                    .and_then(|value| bucket(name, key, value, now))
                else {
                    continue;
                };
                let at = (name.limiter.clone(), name.key.clone());
                views.entry(at).or_default().push(view);
            }
        }
    }
    Ok(views
        .into_iter()
        .map(|((limiter, key), mut buckets)| {
            buckets.sort_by(|a, b| a.policy.cmp(&b.policy));
            RateView {
                limiter,
                key,
                buckets,
            }
        })
        .collect())
}

/// `TIME`'s answer in µs.
fn server_micros(time: &Value) -> Option<u64> {
    let Value::Array(parts) = time else {
        return None;
    };
    let number = |v: &Value| match v {
        Value::BulkString(b) => std::str::from_utf8(b).ok()?.parse::<u64>().ok(),
        _ => None,
    };
    Some(number(parts.first()?)? * 1_000_000 + number(parts.get(1)?)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bucket_says_what_is_left_by_the_servers_clock() {
        let name = BucketName {
            limiter: "api".into(),
            key: "k".into(),
            policy: "burst".into(),
        };
        let now = 1_800_000_000_000_000;
        let value = format!("{}:100000:20", now + 250_000);
        let view = bucket(&name, "key", &value, now).unwrap();
        assert_eq!((view.remaining, view.reset_us), (17, 250_000));
        assert_eq!((view.interval_us, view.burst), (100_000, 20));
        let full = bucket(&name, "key", &value, now + 300_000).unwrap();
        assert_eq!((full.remaining, full.reset_us), (20, 0));
        let over = format!("{}:100000:20", now + 5_000_000);
        assert_eq!(bucket(&name, "key", &over, now).unwrap().remaining, 0);
        for bad in [
            "",
            "12",
            "1800000000000000",
            "1800000000000000:0:1",
            "x800000000000000:1:1",
        ] {
            assert!(bucket(&name, "key", bad, now).is_none(), "{bad}");
        }
    }
}
