//! Reading one lock in full: one pipeline per lock (all its keys share a slot), then the
//! subscribers of every lock's channels in a few `PUBSUB NUMSUB` calls per node (and
//! `SHARDNUMSUB` on a cluster).
//!
//! Kind detection (Redis keeps no "kind" field; the shape of the keys says it):
//! - a hash with a `mode` field is a **read-write** lock;
//! - a hash without one is **fair** if the lock has a queue (`…:queue`), else **plain**
//!   (a fair lock nobody waits for looks exactly like a plain one);
//! - no hash, but a queue: **fair** (free, its next waiter about to take it); no hash but
//!   registered writers or readers: **read-write** (free, a waiter about to take it);
//! - no hash, a stored outcome (`…:done`): **claim-outcome** (a completed claim);
//! - only a fencing key (a lock released less than a lease ago): **free**;
//! - nothing: no such lock.
//!
//! In the Redisson layout a hash found by name alone must also look like a lock: every
//! field `<id>:<number>` with a positive count, or a `mode` of `read`/`write`, and an
//! expiry; at most [`MAX_FIELDS`] fields.

use std::collections::{BTreeSet, HashMap};

use futures_util::stream::{self, StreamExt, TryStreamExt};
use lockwarden_core::redis::{self, Value};
use lockwarden_core::KeyLayout;
use serde::Serialize;

use crate::error::CliError;
use crate::names::{turn_channel, LockKeys, Part, Space};
use crate::scan::Found;
use crate::target::{bounded, Target};

/// Queue entries, waiting writers and waiting readers listed per lock (their number is
/// always exact).
pub const SHOWN: usize = 100;
/// A Redisson-layout hash with more fields than this is not taken for a lock.
pub const MAX_FIELDS: i64 = 10_000;

/// The suffix of the fields beside a count that remember the call that changed it last.
const OP_SUFFIX: &str = ":op";
/// Locks read at once.
const CONCURRENCY: usize = 16;
/// Channels per `PUBSUB NUMSUB` call.
const CHANNELS_PER_CALL: usize = 500;

/// What a lock is, judged by its keys (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Kind {
    /// A plain (re-entrant, exclusive) lock.
    Plain,
    /// A fair lock: a plain hash and a queue.
    Fair,
    /// A read-write lock.
    ReadWrite,
    /// A completed claim's stored outcome, no lock.
    ClaimOutcome,
    /// Released: only the fencing key is left.
    Free,
}

impl Kind {
    /// The name in tables and JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Plain => "plain",
            Kind::Fair => "fair",
            Kind::ReadWrite => "read-write",
            Kind::ClaimOutcome => "claim-outcome",
            Kind::Free => "free",
        }
    }
}

/// One hold of a lock.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct HolderView {
    /// The holder id (`<client uuid>:<n>`; Redisson: `<uuid>:<thread id>`).
    pub id: String,
    /// `"exclusive"` (plain, fair), `"read"` or `"write"`.
    pub side: &'static str,
    /// Re-entry count.
    pub count: u64,
    /// The lease this hold has left (read-write: its own; else the lock's), ms.
    pub lease_ms: Option<i64>,
}

/// A fair lock's waiter in the queue.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct QueuedView {
    /// 1 = next.
    pub position: u64,
    /// The waiting holder.
    pub holder: String,
    /// Until the waiter is dropped unless it retries, ms (server clock).
    pub deadline_ms: Option<i64>,
    /// Connections subscribed to its turn channel (its client's, shared by the client's
    /// other waiters of this lock).
    pub subscribers: u64,
}

/// A writer or reader registered as waiting on a read-write lock.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct WaiterView {
    /// The waiting holder.
    pub holder: String,
    /// Until its registration lapses unless it retries, ms.
    pub deadline_ms: Option<i64>,
}

/// A completed claim's stored outcome.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct OutcomeView {
    /// Its size in bytes (the bytes themselves are not shown: they may be a response).
    pub bytes: u64,
    /// How long it is kept yet, ms (`null`: no expiry).
    pub ttl_ms: Option<i64>,
}

/// One channel of a lock and how many connections listen on it.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ChannelView {
    /// The channel.
    pub channel: String,
    /// `"release"`, `"readers"` or `"turn"` (a fair waiter's own).
    pub role: &'static str,
    /// `PUBSUB NUMSUB`, summed over the nodes.
    pub subscribers: u64,
}

/// Everything the inspector knows about one lock.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct LockView {
    /// The lock name.
    pub name: String,
    /// Its hash's Redis key.
    pub key: String,
    /// See [`Kind`].
    pub kind: Kind,
    /// A read-write lock's mode (`"read"`, `"write"`), else `null`.
    pub mode: Option<String>,
    /// The holds, writer first.
    pub holders: Vec<HolderView>,
    /// The lock's remaining lease (its hash's `PTTL`), ms; `null` when free.
    pub lease_ms: Option<i64>,
    /// The last fencing token issued (read-write: the current phase's).
    pub fencing_token: Option<u64>,
    /// How long the current hold (phase) has lasted, from its token (µs of the server
    /// clock at acquisition), ms.
    pub held_for_ms: Option<u64>,
    /// A fair lock's queue length (waiters whose deadline has not passed: the lock
    /// drops the others at its next call).
    pub queue_length: u64,
    /// The first [`SHOWN`] of the queue, in order.
    pub queue: Vec<QueuedView>,
    /// Writers registered as waiting (read-write), not counting registrations that
    /// lapsed (the lock drops those at its next call and ignores them until then).
    pub writers_waiting: u64,
    /// The first [`SHOWN`] of them, earliest deadline first.
    pub waiting_writers: Vec<WaiterView>,
    /// Readers registered as waiting (read-write). A reader a write release admitted
    /// holds the lock and is no longer counted, though it may stay registered until its
    /// hold ends.
    pub readers_waiting: u64,
    /// Those of the first [`SHOWN`] registered readers that wait, earliest deadline
    /// first.
    pub waiting_readers: Vec<WaiterView>,
    /// Connections subscribed to the lock's channels, in all.
    pub subscribers: u64,
    /// Each channel asked about.
    pub channels: Vec<ChannelView>,
    /// A completed claim's stored outcome.
    pub outcome: Option<OutcomeView>,
}

impl LockView {
    /// Whether someone holds it.
    pub fn is_held(&self) -> bool {
        !self.holders.is_empty()
    }

    /// Queued waiters, waiting writers and readers, plus subscribed connections: what
    /// ranks a lock as busy.
    pub fn waiting(&self) -> u64 {
        self.queue_length + self.writers_waiting + self.readers_waiting + self.subscribers
    }
}

/// Reads every lock of a scan, in name order.
///
/// # Errors
/// [`CliError::Redis`] if Redis fails.
pub async fn read_found(
    target: &Target,
    space: &Space,
    found: &Found,
) -> Result<Vec<LockView>, CliError> {
    let mut views: Vec<LockView> = stream::iter(found.iter())
        .map(|(name, parts)| read_one(target, space, name, Some(parts)))
        .buffered(CONCURRENCY)
        .try_filter_map(|view| async move { Ok(view) })
        .try_collect()
        .await?;
    count_subscribers(target, &mut views).await?;
    Ok(views)
}

/// Reads the lock `name`, `None` if nothing of it is in Redis.
///
/// # Errors
/// [`CliError::Usage`] for a name the core refuses, [`CliError::Redis`] if Redis fails.
pub async fn read(
    target: &Target,
    space: &Space,
    name: &str,
) -> Result<Option<LockView>, CliError> {
    let Some(mut view) = read_one(target, space, name, None).await? else {
        return Ok(None);
    };
    count_subscribers(target, std::slice::from_mut(&mut view)).await?;
    Ok(Some(view))
}

async fn read_one(
    target: &Target,
    space: &Space,
    name: &str,
    parts: Option<&BTreeSet<Part>>,
) -> Result<Option<LockView>, CliError> {
    let keys = space
        .keys(name)
        .map_err(|e| CliError::Usage(format!("bad lock name {name:?}: {e}")))?;
    let redisson = space.layout() == KeyLayout::Redisson;
    // A Redisson-layout hash is just a name: look before reading it all.
    let mut hash_usable = true;
    if redisson {
        let mut pipe = redis::pipe();
        pipe.cmd("HLEN").arg(&keys.lock).cmd("PTTL").arg(&keys.lock);
        let v = target.keyed(&mut pipe).await?;
        let len = int(&v[0]).unwrap_or(0);
        hash_usable = len <= MAX_FIELDS && int(&v[1]).is_some_and(|ttl| ttl >= 0);
        if parts.is_some_and(|p| p.len() == 1 && p.contains(&Part::Lock)) && !hash_usable {
            return Ok(None);
        }
    }
    let mut pipe = redis::pipe();
    pipe.cmd("TIME");
    if hash_usable {
        pipe.cmd("HGETALL").arg(&keys.lock);
    } else {
        pipe.cmd("ECHO").arg("");
    }
    pipe.cmd("PTTL")
        .arg(&keys.lock)
        .cmd("GET")
        .arg(&keys.fence)
        .cmd("LLEN")
        .arg(&keys.queue)
        .cmd("LRANGE")
        .arg(&keys.queue)
        .arg(0)
        .arg(SHOWN - 1)
        .cmd("ZRANGE")
        .arg(&keys.deadlines)
        .arg(0)
        .arg(-1)
        .arg("WITHSCORES")
        .cmd("ZRANGE")
        .arg(&keys.leases)
        .arg(0)
        .arg(MAX_FIELDS)
        .arg("WITHSCORES")
        .cmd("ZCARD")
        .arg(&keys.writers)
        .cmd("ZRANGE")
        .arg(&keys.writers)
        .arg(0)
        .arg(SHOWN - 1)
        .arg("WITHSCORES")
        .cmd("ZCARD")
        .arg(&keys.waiting_readers)
        .cmd("ZRANGE")
        .arg(&keys.waiting_readers)
        .arg(0)
        .arg(SHOWN - 1)
        .arg("WITHSCORES")
        .cmd("STRLEN")
        .arg(&keys.done)
        .cmd("PTTL")
        .arg(&keys.done);
    let v = target.keyed(&mut pipe).await?;
    let now_us = server_time_us(&v[0])?;
    let now_ms = (now_us / 1000) as i64;
    let mut hash = pairs(&v[1]);
    // The id of the last call that changed a count (`lua/once.lua`) is no holder.
    hash.retain(|(field, _)| !field.ends_with(OP_SUFFIX));
    if redisson && !lock_shaped(&hash) {
        hash.clear();
    }
    let fence = int(&v[3]).and_then(|t| u64::try_from(t).ok());
    // Waiters whose deadline has passed are not counted or listed: the lock's scripts
    // drop them at their next call and take no account of them meanwhile.
    let lapsed = |deadline: f64| deadline <= now_ms as f64;
    let deadlines: HashMap<String, f64> = scored(&v[6])
        .into_iter()
        .filter(|(_, d)| !lapsed(*d))
        .collect();
    let queue_length = uint(&v[4]).min(deadlines.len() as u64);
    let queue_ids: Vec<String> = strings(&v[5])
        .into_iter()
        .filter(|id| deadlines.contains_key(id))
        .collect();
    let leases: HashMap<String, f64> = scored(&v[7]).into_iter().collect();
    let (writers_waiting, writers) =
        live(target, &keys.writers, now_ms, uint(&v[8]), scored(&v[9])).await?;
    let (readers_registered, readers) = live(
        target,
        &keys.waiting_readers,
        now_ms,
        uint(&v[10]),
        scored(&v[11]),
    )
    .await?;
    let outcome = match int(&v[13]) {
        Some(-2) | None => None,
        Some(ttl) => Some(OutcomeView {
            bytes: uint(&v[12]),
            ttl_ms: (ttl >= 0).then_some(ttl),
        }),
    };
    let remaining = |deadline: Option<&f64>| deadline.map(|d| *d as i64 - now_ms);

    let held = !hash.is_empty();
    let mode = hash
        .iter()
        .find(|(f, _)| f == "mode")
        .map(|(_, v)| v.clone());
    let lease_ms = if held {
        int(&v[2]).filter(|ttl| *ttl >= 0)
    } else {
        None
    };
    let kind = match (held, &mode) {
        (true, Some(_)) => Kind::ReadWrite,
        (true, None) if queue_length > 0 => Kind::Fair,
        (true, None) => Kind::Plain,
        (false, _) if queue_length > 0 => Kind::Fair,
        (false, _) if writers_waiting + readers_registered > 0 => Kind::ReadWrite,
        (false, _) if outcome.is_some() => Kind::ClaimOutcome,
        (false, _) if fence.is_some() => Kind::Free,
        (false, _) => return Ok(None),
    };
    let mut holders = Vec::new();
    let mut token = fence;
    for (field, value) in &hash {
        let count = value.parse().unwrap_or(0);
        match &mode {
            Some(mode) => {
                if field == "mode" {
                    continue;
                }
                if field == "token" {
                    token = value.parse().ok();
                    continue;
                }
                let (id, side) = match field.rsplit_once(':') {
                    Some((id, "r")) => (id, "read"),
                    Some((id, "w")) => (id, "write"),
                    // Redisson's own read-write lock: the side is the mode.
                    _ => (
                        field.as_str(),
                        if mode == "write" { "write" } else { "read" },
                    ),
                };
                holders.push(HolderView {
                    id: id.to_owned(),
                    side,
                    count,
                    lease_ms: remaining(leases.get(field)).or(lease_ms),
                });
            }
            None => holders.push(HolderView {
                id: field.clone(),
                side: "exclusive",
                count,
                lease_ms,
            }),
        }
    }
    holders.sort_by(|a, b| (a.side != "write", &a.id).cmp(&(b.side != "write", &b.id)));
    let held_for_ms = token
        .filter(|_| held)
        .and_then(|t| now_us.checked_sub(t))
        .map(|us| us / 1000);
    let queue = queue_ids
        .into_iter()
        .enumerate()
        .map(|(i, holder)| QueuedView {
            position: i as u64 + 1,
            deadline_ms: remaining(deadlines.get(&holder)),
            holder,
            subscribers: 0,
        })
        .collect();
    let registered = |(holder, deadline): (String, f64)| WaiterView {
        holder,
        deadline_ms: Some(deadline as i64 - now_ms),
    };
    let waiting_writers = writers.into_iter().map(registered).collect();
    let reading: BTreeSet<&str> = holders
        .iter()
        .filter(|h| h.side == "read")
        .map(|h| h.id.as_str())
        .collect();
    // A waiting reader is registered by its read hold's field (`<holder>:r`, see
    // `lua/rw_prelude.lua`), so that an admission copies registrations into leases whole.
    let read_fields: BTreeSet<String> = reading.iter().map(|id| format!("{id}:r")).collect();
    let admitted = match readers_registered {
        0 => 0,
        _ => registered_among(target, &keys.waiting_readers, &read_fields, now_ms).await?,
    };
    let readers_waiting = readers_registered.saturating_sub(admitted);
    let waiting_readers = readers
        .into_iter()
        .filter(|(field, _)| !read_fields.contains(field))
        .map(|(field, deadline)| {
            let id = field.strip_suffix(":r").map(str::to_owned).unwrap_or(field);
            registered((id, deadline))
        })
        .collect();
    let channels = channels_of(&keys);
    let mut view = LockView {
        name: name.to_owned(),
        key: keys.lock.clone(),
        kind,
        mode,
        holders,
        lease_ms,
        fencing_token: token,
        held_for_ms,
        queue_length,
        queue,
        writers_waiting,
        waiting_writers,
        readers_waiting,
        waiting_readers,
        subscribers: 0,
        channels,
        outcome,
    };
    // The turn channels are those of the queued holders' clients (one per client).
    let turns: BTreeSet<String> = view
        .queue
        .iter()
        .map(|q| keys.turn_channel(&q.holder))
        .collect();
    let turns = turns.into_iter().map(|channel| ChannelView {
        channel,
        role: "turn",
        subscribers: 0,
    });
    view.channels.extend(turns);
    Ok(Some(view))
}

/// How many of the read holds `fields` are registered in `key` past `now_ms`: read
/// holders still registered, whom a write release admitted (they stay registered until
/// their holds end).
async fn registered_among(
    target: &Target,
    key: &str,
    fields: &BTreeSet<String>,
    now_ms: i64,
) -> Result<u64, CliError> {
    if fields.is_empty() {
        return Ok(0);
    }
    let mut pipe = redis::pipe();
    for field in fields {
        pipe.cmd("ZSCORE").arg(key).arg(field);
    }
    let scores = target.keyed(&mut pipe).await?;
    let live = |score: &Value| int_or_float(score).is_some_and(|d| d > now_ms as f64);
    Ok(scores.iter().filter(|s| live(s)).count() as u64)
}

/// The registrations in `key` whose deadline is after `now_ms`: how many, and the first
/// [`SHOWN`], earliest deadline first. `count` and `first` are all of them, as read: read
/// again only when a lapsed one is among them (lapsed ones come first).
async fn live(
    target: &Target,
    key: &str,
    now_ms: i64,
    count: u64,
    first: Vec<(String, f64)>,
) -> Result<(u64, Vec<(String, f64)>), CliError> {
    if first.first().is_none_or(|(_, d)| *d > now_ms as f64) {
        return Ok((count, first));
    }
    let after = format!("({now_ms}");
    let mut pipe = redis::pipe();
    pipe.cmd("ZCOUNT")
        .arg(key)
        .arg(&after)
        .arg("+inf")
        .cmd("ZRANGEBYSCORE")
        .arg(key)
        .arg(&after)
        .arg("+inf")
        .arg("WITHSCORES")
        .arg("LIMIT")
        .arg(0)
        .arg(SHOWN);
    let v = target.keyed(&mut pipe).await?;
    Ok((uint(&v[0]), scored(&v[1])))
}

/// The lock's own channels (the turn channels of queued waiters are added to them).
fn channels_of(keys: &LockKeys) -> Vec<ChannelView> {
    vec![
        ChannelView {
            channel: keys.channel.clone(),
            role: "release",
            subscribers: 0,
        },
        ChannelView {
            channel: keys.readers_channel.clone(),
            role: "readers",
            subscribers: 0,
        },
    ]
}

/// Fills in every channel's subscribers: `PUBSUB NUMSUB` on each node, summed (a
/// subscriber may sit on any node of a cluster; classic pub/sub reaches them all), and on
/// a cluster `PUBSUB SHARDNUMSUB` too: its clients listen with `SSUBSCRIBE` when every
/// master runs Redis 7 or later.
async fn count_subscribers(target: &Target, views: &mut [LockView]) -> Result<(), CliError> {
    let channels: Vec<String> = views
        .iter()
        .flat_map(|v| v.channels.iter().map(|c| c.channel.clone()))
        .collect();
    let counters: &[&str] = match target.is_cluster() {
        true => &["NUMSUB", "SHARDNUMSUB"],
        false => &["NUMSUB"],
    };
    let mut counts: HashMap<String, u64> = HashMap::new();
    for node in target.nodes() {
        for (chunk, &counter) in channels
            .chunks(CHANNELS_PER_CALL)
            .flat_map(|chunk| counters.iter().map(move |counter| (chunk, counter)))
        {
            let mut cmd = redis::cmd("PUBSUB");
            cmd.arg(counter).arg(chunk);
            let mut conn = node.conn.clone();
            let reply: Value = match bounded(target.timeout(), cmd.query_async(&mut conn)).await {
                Ok(reply) => reply,
                // A master before Redis 7 has no sharded pub/sub, so no such subscriber.
                Err(e)
                    if counter == "SHARDNUMSUB" && e.to_string().contains("nknown subcommand") =>
                {
                    continue
                }
                Err(e) => {
                    return Err(CliError::Redis(format!(
                        "PUBSUB {counter} on {}: {e}",
                        node.addr
                    )))
                }
            };
            for (channel, n) in pairs(&reply) {
                *counts.entry(channel).or_default() += n.parse::<u64>().unwrap_or(0);
            }
        }
    }
    for view in views {
        for channel in &mut view.channels {
            channel.subscribers = counts.get(&channel.channel).copied().unwrap_or(0);
        }
        for queued in &mut view.queue {
            let turn = turn_channel(&view.channels[0].channel, &queued.holder);
            queued.subscribers = counts.get(&turn).copied().unwrap_or(0);
        }
        view.subscribers = view.channels.iter().map(|c| c.subscribers).sum();
    }
    Ok(())
}

/// Whether a hash looks like a lock of either library (see the module docs).
fn lock_shaped(hash: &[(String, String)]) -> bool {
    if hash.is_empty() {
        return false;
    }
    if let Some((_, mode)) = hash.iter().find(|(f, _)| f == "mode") {
        return mode == "read" || mode == "write";
    }
    hash.iter().all(|(field, value)| {
        field.rsplit_once(':').is_some_and(|(id, n)| {
            !id.is_empty() && !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit())
        }) && value.parse::<u64>().is_ok_and(|n| n > 0)
    })
}

fn server_time_us(v: &Value) -> Result<u64, CliError> {
    let parts = strings(v);
    match (
        parts.first().and_then(|s| s.parse::<u64>().ok()),
        parts.get(1).and_then(|s| s.parse::<u64>().ok()),
    ) {
        (Some(s), Some(us)) => Ok(s * 1_000_000 + us),
        _ => Err(CliError::Redis(format!("unexpected TIME reply {v:?}"))),
    }
}

/// A reply as text (bulk, simple, numbers), `None` for nil, errors and aggregates.
pub(crate) fn text(v: &Value) -> Option<String> {
    match v {
        Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
        Value::SimpleString(s) => Some(s.clone()),
        Value::Int(n) => Some(n.to_string()),
        Value::Double(d) => Some(d.to_string()),
        Value::VerbatimString { text, .. } => Some(text.clone()),
        _ => None,
    }
}

/// A reply as an integer, `None` for nil, errors and non-numbers.
pub(crate) fn int(v: &Value) -> Option<i64> {
    match v {
        Value::Int(n) => Some(*n),
        other => text(other)?.parse().ok(),
    }
}

/// A score: a number, `None` for nil.
fn int_or_float(v: &Value) -> Option<f64> {
    match v {
        Value::Double(d) => Some(*d),
        other => text(other)?.parse().ok(),
    }
}

fn uint(v: &Value) -> u64 {
    int(v).and_then(|n| u64::try_from(n).ok()).unwrap_or(0)
}

fn strings(v: &Value) -> Vec<String> {
    match v {
        Value::Array(items) | Value::Set(items) => items.iter().filter_map(text).collect(),
        _ => Vec::new(),
    }
}

/// A flat `[k, v, k, v]` array (RESP2) or a map (RESP3) as pairs.
pub(crate) fn pairs(v: &Value) -> Vec<(String, String)> {
    match v {
        Value::Array(items) => items
            .chunks_exact(2)
            .filter_map(|kv| Some((text(&kv[0])?, text(&kv[1])?)))
            .collect(),
        Value::Map(items) => items
            .iter()
            .filter_map(|(k, v)| Some((text(k)?, text(v)?)))
            .collect(),
        _ => Vec::new(),
    }
}

/// A `WITHSCORES` reply, flat (RESP2) or of pairs (RESP3).
fn scored(v: &Value) -> Vec<(String, f64)> {
    let Value::Array(items) = v else {
        return Vec::new();
    };
    if items.iter().all(|i| matches!(i, Value::Array(_))) {
        return items
            .iter()
            .filter_map(|pair| match pair {
                Value::Array(kv) if kv.len() == 2 => {
                    Some((text(&kv[0])?, text(&kv[1])?.parse().ok()?))
                }
                _ => None,
            })
            .collect();
    }
    pairs(v)
        .into_iter()
        .filter_map(|(m, s)| Some((m, s.parse().ok()?)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(fields: &[(&str, &str)]) -> Vec<(String, String)> {
        fields
            .iter()
            .map(|(f, v)| ((*f).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn lock_shapes() {
        assert!(lock_shaped(&h(&[("6f1c-uuid:1", "2")])));
        assert!(lock_shaped(&h(&[("mode", "read"), ("a:1:r", "1")])));
        assert!(!lock_shaped(&h(&[])));
        assert!(!lock_shaped(&h(&[("name", "alice")])));
        assert!(!lock_shaped(&h(&[("a:1", "0")])));
        assert!(!lock_shaped(&h(&[("a:x", "1")])));
        assert!(!lock_shaped(&h(&[("mode", "other")])));
    }

    #[test]
    fn replies_of_both_protocols_are_read() {
        let flat = Value::Array(vec![
            Value::BulkString(b"a".to_vec()),
            Value::BulkString(b"1.5".to_vec()),
        ]);
        assert_eq!(scored(&flat), [("a".to_owned(), 1.5)]);
        let nested = Value::Array(vec![Value::Array(vec![
            Value::BulkString(b"a".to_vec()),
            Value::Double(2.0),
        ])]);
        assert_eq!(scored(&nested), [("a".to_owned(), 2.0)]);
        let map = Value::Map(vec![(
            Value::BulkString(b"f".to_vec()),
            Value::BulkString(b"v".to_vec()),
        )]);
        assert_eq!(pairs(&map), [("f".to_owned(), "v".to_owned())]);
    }
}
