//! Reading one lock in full: one pipeline per lock (all its keys share a slot), then the
//! subscribers of every lock's channels in a few `PUBSUB NUMSUB` calls per node (and
//! `SHARDNUMSUB` on a cluster).
//!
//! Kind detection (Redis keeps no "kind" field; the shape of the keys says it):
//! - a sorted set at the lock's name is a **semaphore** (its whole state: a `capacity`
//!   member, one member per permit held scored by its lease's deadline, one per waiter
//!   scored by its place; see the core's `permits_prelude.lua`); with no `capacity`
//!   member it was force-unlocked, its waiters about to take their permits in their
//!   places;
//! - a hash with a `mode` field is a **read-write** lock;
//! - a hash without one is **fair** if the lock has a queue (`…:queue`), else **plain**
//!   (a fair lock nobody waits for looks exactly like a plain one);
//! - no hash, but a queue: **fair** (free, its next waiter about to take it); no hash but
//!   registered writers or readers: **read-write** (free, a waiter about to take it);
//! - no hash, a stored outcome (`…:done`): **claim-outcome** (a completed claim);
//! - only a fencing key (a lock released less than a lease ago): **free**;
//! - nothing: no such lock.
//!
//! In the Redisson layout a key found by name alone must also look like a lock: a hash
//! with every field `<id>:<number>` with a positive count, or a `mode` of `read`/`write`,
//! and an expiry, at most [`MAX_FIELDS`] fields; a sorted set whose members are a
//! semaphore's.
//!
//! What a lock's scripts would drop at their next call is not counted: waiters whose
//! places lapsed, and a semaphore's holds whose leases ran out (their permits are free:
//! the core's semaphore scripts take them back before they count).

use std::collections::{BTreeSet, HashMap};

use futures_util::stream::{self, StreamExt, TryStreamExt};
use lockwarden_core::redis::{self, Value};
use lockwarden_core::KeyLayout;
use serde::Serialize;

use crate::error::CliError;
use crate::names::{turn_channel, LockKeys, Part, Space};
use crate::scan::Found;
use crate::target::{bounded, Target};

/// Queue entries, waiting writers and readers, and a semaphore's waiters listed per lock
/// (their number is always exact).
pub const SHOWN: usize = 100;
/// A Redisson-layout hash with more fields than this is not taken for a lock.
pub const MAX_FIELDS: i64 = 10_000;

/// The suffix of the fields beside a count that remember the call that changed it last.
const OP_SUFFIX: &str = ":op";
/// How a waiter's mark's fields begin (`~w1`, `~w2`, see `lua/acquire.lua`): no holder id
/// does.
const MARK_PREFIX: &str = "~";
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
    /// A semaphore: permits of a capacity, each hold a lease of its own.
    Semaphore,
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
            Kind::Semaphore => "semaphore",
        }
    }
}

/// One hold of a lock.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct HolderView {
    /// The holder id (`<client uuid>:<n>`; Redisson: `<uuid>:<thread id>`).
    pub id: String,
    /// `"exclusive"` (plain, fair), `"read"`, `"write"` or `"permits"` (a semaphore).
    pub side: &'static str,
    /// Re-entry count; a semaphore's: the permits this hold has.
    pub count: u64,
    /// The lease this hold has left (read-write, semaphore: its own; else the lock's), ms.
    /// (A semaphore's hold keeps no token in Redis: its holder alone has it.)
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

/// A semaphore's waiter in line.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct PermitWaiterView {
    /// 1 = first in line (arrival order, by the server clock).
    pub position: u64,
    /// The waiting holder (one per acquisition).
    pub holder: String,
    /// Permits it asks for (all at once).
    pub permits: u64,
    /// Until its place lapses unless it tries again, ms (server clock).
    pub deadline_ms: i64,
    /// How long it has been in line, ms.
    pub waited_ms: u64,
}

/// What only a semaphore has.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct SemaphoreView {
    /// The capacity stored with it, `null` when none is (force-unlocked: the next
    /// acquisition stores its own).
    pub capacity: Option<u64>,
    /// Permits held (by live holds).
    pub in_use: u64,
    /// `"arrival"` (a large request does not hold back smaller ones that fit) or
    /// `"strict"` (nobody before an earlier waiter; `Semaphore::fair`).
    pub order: &'static str,
    /// Waiters in line (places not lapsed).
    pub waiting: u64,
    /// The first [`SHOWN`] of them, first in line first.
    pub line: Vec<PermitWaiterView>,
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
    /// `"release"`, `"readers"`, `"turn"` (a fair waiter's own) or `"granted"` (a
    /// semaphore's waiters').
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
    /// The holds, writer first (a semaphore's: oldest first).
    pub holders: Vec<HolderView>,
    /// The lock's remaining lease (its hash's `PTTL`; a semaphore's: its longest hold's
    /// lease, when it is free at the latest unless renewed), ms; `null` when free.
    pub lease_ms: Option<i64>,
    /// The last fencing token issued (read-write: the current phase's).
    pub fencing_token: Option<u64>,
    /// How long the current hold (a read-write lock's: phase) has lasted, from its token
    /// (µs of the server clock at acquisition), ms; `null` for a semaphore (Redis keeps no
    /// hold's own token).
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
    /// A semaphore's capacity, permits in use and line (absent for other kinds).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub semaphore: Option<SemaphoreView>,
}

impl LockView {
    /// Whether someone holds it.
    pub fn is_held(&self) -> bool {
        !self.holders.is_empty()
    }

    /// Queued waiters, waiting writers and readers, a semaphore's waiters, plus
    /// subscribed connections: what ranks a lock as busy.
    pub fn waiting(&self) -> u64 {
        let in_line = self.semaphore.as_ref().map_or(0, |s| s.waiting);
        self.queue_length + self.writers_waiting + self.readers_waiting + in_line + self.subscribers
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
    // A semaphore is a sorted set at the lock's name, which a hash command would fail on.
    let mut pipe = redis::pipe();
    pipe.cmd("TYPE").arg(&keys.lock);
    let type_of = target.keyed(&mut pipe).await?;
    if type_of.first().and_then(status).as_deref() == Some("zset") {
        return read_semaphore(target, name, &keys, redisson).await;
    }
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
    // The id of the last call that changed a count (`lua/once.lua`) is no holder, nor is a
    // waiter's mark.
    hash.retain(|(field, _)| !field.ends_with(OP_SUFFIX) && !field.starts_with(MARK_PREFIX));
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
        semaphore: None,
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

/// Reads the semaphore at `keys.lock` (a sorted set: see the module docs) as its scripts
/// see it: a hold whose lease ran out holds nothing (its permits are free), a place in
/// line whose registration lapsed is no waiter. Its holds carry no fencing token: each is
/// given to its holder only (the view has the semaphore's last). `None` for a sorted set in
/// the Redisson layout that is no semaphore.
async fn read_semaphore(
    target: &Target,
    name: &str,
    keys: &LockKeys,
    redisson: bool,
) -> Result<Option<LockView>, CliError> {
    let lock = &keys.lock;
    let mut pipe = redis::pipe();
    pipe.cmd("TIME")
        .cmd("ZRANGE")
        .arg(lock)
        .arg(0)
        .arg(0)
        .arg("WITHSCORES")
        .cmd("GET")
        .arg(&keys.fence)
        .cmd("ZCOUNT")
        .arg(lock)
        .arg(0)
        .arg("(1e13")
        .cmd("ZRANGEBYSCORE")
        .arg(lock)
        .arg(0)
        .arg("(1e13")
        .arg("WITHSCORES")
        .arg("LIMIT")
        .arg(0)
        .arg(MAX_FIELDS)
        .cmd("ZCOUNT")
        .arg(lock)
        .arg("1e15")
        .arg("+inf")
        .cmd("ZRANGEBYSCORE")
        .arg(lock)
        .arg("1e15")
        .arg("+inf")
        .arg("WITHSCORES")
        .arg("LIMIT")
        .arg(0)
        .arg(MAX_FIELDS);
    let v = target.keyed(&mut pipe).await?;
    let now_us = server_time_us(&v[0])?;
    let now_ms = (now_us / 1000) as i64;
    let capacity = scored(&v[1])
        .into_iter()
        .find(|(member, _)| member == "capacity")
        .map(|(_, score)| score);
    let (held, places) = (scored(&v[4]), scored(&v[6]));
    if redisson
        && !held
            .iter()
            .chain(&places)
            .all(|(member, _)| permit_shaped(member))
    {
        return Ok(None);
    }
    let (holders, semaphore) = semaphore_of(
        now_ms,
        capacity,
        (uint(&v[3]), &held),
        (uint(&v[5]), &places),
    );
    let view = LockView {
        name: name.to_owned(),
        key: lock.clone(),
        kind: Kind::Semaphore,
        mode: None,
        lease_ms: holders.iter().filter_map(|h| h.lease_ms).max(),
        holders,
        fencing_token: int(&v[2]).and_then(|t| u64::try_from(t).ok()),
        held_for_ms: None,
        queue_length: 0,
        queue: Vec::new(),
        writers_waiting: 0,
        waiting_writers: Vec::new(),
        readers_waiting: 0,
        waiting_readers: Vec::new(),
        subscribers: 0,
        channels: semaphore_channels(keys),
        outcome: None,
        semaphore: Some(semaphore),
    };
    Ok(Some(view))
}

/// A semaphore's holds and numbers from its sorted set as read at `now_ms`: its capacity
/// member's score (`-<capacity>`, `.5` more in strict order), and how many permits held
/// and places in line it has with the first of each (member, score), as read.
fn semaphore_of(
    now_ms: i64,
    capacity: Option<f64>,
    (held_count, held): (u64, &[(String, f64)]),
    (line_count, places): (u64, &[(String, f64)]),
) -> (Vec<HolderView>, SemaphoreView) {
    // Each hold is its first member `<k>:<lease ms>:<holder id>` and `..#2` .. `..#k`,
    // all with its lease's deadline.
    let mut holds: Vec<(String, u64, f64)> = Vec::new();
    let mut lapsed = 0u64;
    for (member, deadline) in held {
        if *deadline <= now_ms as f64 {
            lapsed += 1;
            continue;
        }
        let first = member
            .rsplit_once('#')
            .map_or(member.as_str(), |(first, _)| first);
        match holds.iter_mut().find(|(m, _, _)| m == first) {
            Some(hold) => hold.1 += 1,
            None => holds.push((first.to_owned(), 1, *deadline)),
        }
    }
    holds.sort_by(|a, b| a.2.total_cmp(&b.2).then_with(|| a.0.cmp(&b.0)));
    let holders = holds
        .into_iter()
        .map(|(first, count, deadline)| HolderView {
            id: holder_of(&first).to_owned(),
            side: "permits",
            count,
            lease_ms: Some(deadline as i64 - now_ms),
        })
        .collect();
    // A place is its arrival (server ms) * 1024 + when its registration runs out (server
    // seconds, modulo 1024): it lives while that is 1 to 510 s ahead.
    let now_s = now_ms.div_euclid(1000);
    let mut line = Vec::new();
    let mut gone = 0u64;
    for (member, place) in places {
        let ahead = ((*place as i64).rem_euclid(1024) - now_s).rem_euclid(1024);
        if !(1..=510).contains(&ahead) {
            gone += 1;
            continue;
        }
        if line.len() < SHOWN {
            let arrival_ms = (*place / 1024.0).floor() as i64;
            line.push(PermitWaiterView {
                position: line.len() as u64 + 1,
                holder: holder_of(member).to_owned(),
                permits: member
                    .split(':')
                    .next()
                    .and_then(|k| k.parse().ok())
                    .unwrap_or(0),
                deadline_ms: ahead * 1000 - now_ms.rem_euclid(1000),
                waited_ms: u64::try_from(now_ms - arrival_ms).unwrap_or(0),
            });
        }
    }
    let capacity = capacity.map(|score| -score);
    let semaphore = SemaphoreView {
        capacity: capacity.map(|c| c.floor() as u64),
        in_use: held_count.saturating_sub(lapsed),
        order: match capacity {
            Some(c) if c.fract() != 0.0 => "strict",
            _ => "arrival",
        },
        waiting: line_count.saturating_sub(gone),
        line,
    };
    (holders, semaphore)
}

/// The holder id in a semaphore's member `<k>:<lease ms>:<holder id>`.
fn holder_of(member: &str) -> &str {
    member.splitn(3, ':').nth(2).unwrap_or(member)
}

/// Whether `member` may be a semaphore's: `capacity`, or `<k>:<lease ms>:<holder id>`
/// (with `#<i>` for a hold's further permits).
fn permit_shaped(member: &str) -> bool {
    let number = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    let mut parts = member.splitn(3, ':');
    member == "capacity"
        || matches!((parts.next(), parts.next(), parts.next()),
            (Some(k), Some(lease), Some(holder)) if number(k) && number(lease)
                && holder_id(holder.rsplit_once('#').map_or(holder, |(h, _)| h)))
}

/// The status or text of a reply (`TYPE` answers a status).
fn status(v: &Value) -> Option<String> {
    match v {
        Value::SimpleString(s) => Some(s.clone()),
        Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
        _ => None,
    }
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

/// A semaphore's channels: its waiters listen for grants (and a force-unlock's notice) on
/// `…:granted`; a waiter of another kind for the same name, on the release channel.
fn semaphore_channels(keys: &LockKeys) -> Vec<ChannelView> {
    vec![
        ChannelView {
            channel: keys.granted_channel.clone(),
            role: "granted",
            subscribers: 0,
        },
        ChannelView {
            channel: keys.channel.clone(),
            role: "release",
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
        let release = view.channels.iter().find(|c| c.role == "release");
        if let Some(release) = release.map(|c| c.channel.clone()) {
            for queued in &mut view.queue {
                let turn = turn_channel(&release, &queued.holder);
                queued.subscribers = counts.get(&turn).copied().unwrap_or(0);
            }
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
    hash.iter()
        .all(|(field, value)| holder_id(field) && value.parse::<u64>().is_ok_and(|n| n > 0))
}

/// Whether `field` is a holder id, `<id>:<number>`.
fn holder_id(field: &str) -> bool {
    field.rsplit_once(':').is_some_and(|(id, n)| {
        !id.is_empty() && !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit())
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
        // A semaphore is a sorted set, never a hash.
        assert!(!lock_shaped(&h(&[("permits", "3"), ("used", "0")])));
    }

    #[test]
    fn a_semaphore_reads_as_its_scripts_see_it() {
        let now_ms: i64 = 1_000_000_000_000;
        let at = |ms: i64| (now_ms + ms) as f64;
        let held = [
            ("2:30000:c:1".to_owned(), at(5_000)),
            ("2:30000:c:1#2".to_owned(), at(5_000)),
            ("1:30000:c:2".to_owned(), at(9_000)),
            // Its lease ran out: the next script takes its permit back.
            ("1:30000:dead:1".to_owned(), at(0)),
        ];
        // A place: arrival ms * 1024 + its registration's end, seconds modulo 1024.
        let place = |arrived_ago: i64, lives_s: i64| {
            ((now_ms - arrived_ago) * 1024 + (now_ms / 1000 + lives_s).rem_euclid(1024)) as f64
        };
        let places = [
            ("1:30000:w:1".to_owned(), place(2_000, 28)),
            ("3:400:w:2".to_owned(), place(1_000, 29)),
            // Its registration ran out.
            ("1:30000:gone:1".to_owned(), place(40_000, -10)),
        ];
        let (holders, sem) = semaphore_of(now_ms, Some(-4.0), (4, &held), (3, &places));
        let ids: Vec<(&str, u64)> = holders.iter().map(|h| (h.id.as_str(), h.count)).collect();
        assert_eq!(
            ids,
            [("c:1", 2), ("c:2", 1)],
            "earliest lease first, the dead hold left out"
        );
        assert_eq!(holders[0].lease_ms, Some(5_000));
        assert_eq!(
            (sem.capacity, sem.in_use, sem.order),
            (Some(4), 3, "arrival")
        );
        assert_eq!(sem.waiting, 2);
        let line: Vec<(&str, u64, u64)> = sem
            .line
            .iter()
            .map(|w| (w.holder.as_str(), w.permits, w.waited_ms))
            .collect();
        assert_eq!(line, [("w:1", 1, 2_000), ("w:2", 3, 1_000)]);
        assert!(sem.line[0].deadline_ms > 27_000 && sem.line[0].deadline_ms <= 28_000);
        let (none, forced) = semaphore_of(now_ms, None, (0, &[]), (1, &places[..1]));
        assert!(none.is_empty());
        assert_eq!((forced.capacity, forced.waiting), (None, 1));
        let (_, strict) = semaphore_of(now_ms, Some(-2.5), (0, &[]), (0, &[]));
        assert_eq!((strict.capacity, strict.order), (Some(2), "strict"));
        assert!(permit_shaped("capacity") && permit_shaped("2:30000:c:1#2"));
        assert!(!permit_shaped("member") && !permit_shaped("x:30000:c:1"));
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
