//! Several locks in one script (`lua/multi_acquire.lua`): all or nothing in one round trip.
//!
//! One script may only touch keys of one slot on a cluster, and the keys of different
//! locks are in different slots (each lock's name is its hash tag). There the set is
//! taken slot by slot, one script per slot, in key order for every caller; when a later
//! slot's lock is busy, what the earlier scripts took is released before answering, so
//! the caller still holds nothing while it waits.
//!
//! With [`wait_for_replicas`](crate::LockClientBuilder::wait_for_replicas), each script
//! goes over the `WAIT` connection with a `WAIT` in the same round trip (on a cluster, to
//! the node that ran it); a set fewer replicas acknowledged is given back and reported as
//! not replicated, as a single lock is.

use std::time::Duration;

use redis::cluster_routing::Slot;
use redis::Value;

use super::commands::Commands;
use super::explain::naming;
use super::replicated::Replicated;
use super::scripts::{self, NOT_REPLICATED};
use super::timeout::bounded;
use crate::error::BackendError;
use crate::finish::{BoxFuture, Finish};
use crate::hold::{Hold, HoldKind};
use crate::holder::Holder;
use crate::key::Key;
use crate::store::contract::{AcquireAll, MultiAttempt};

/// Takes every lock of `keys` (sorted) for `holder`, or none; with `replicated`, only
/// once its replicas acknowledged them all.
pub(super) async fn acquire_all(
    commands: &Commands,
    replicated: Option<&Replicated>,
    &AcquireAll {
        keys,
        holder,
        lease,
        fresh,
    }: &AcquireAll<'_>,
) -> Result<MultiAttempt, BackendError> {
    let groups = slot_groups(commands.conn.is_cluster(), keys);
    let rounds = u32::try_from(groups.len()).unwrap_or(u32::MAX);
    let (owned, who) = (keys.to_vec(), holder.clone());
    let take = take_groups(
        commands.clone(),
        owned.clone(),
        groups,
        who.clone(),
        lease,
        fresh,
        replicated.cloned(),
    );
    // If the caller goes away while a script is in flight, whatever was taken is
    // released once the replies are in.
    let undo_with = commands.clone();
    let undo = Box::new(move |reply: redis::RedisResult<Vec<Value>>| -> BoxFuture {
        Box::pin(async move {
            if matches!(reply.as_deref(), Ok([Value::Int(1), ..])) {
                give_back(&undo_with, &owned, &who).await;
            }
        })
    });
    let limit = commands.timeout * rounds + replicated.map_or(Duration::ZERO, Replicated::timeout);
    let reply = bounded(limit, Finish::new(take).or_undo(undo))
        .await
        .map_err(|error| naming(error, scripts::What::Script("multi_acquire.lua")))?;
    let ints = reply
        .iter()
        .map(|v| match v {
            Value::Int(n) => Ok(*n),
            other => Err(BackendError::Protocol(format!(
                "multi-acquire script returned {other:?}"
            ))),
        })
        .collect::<Result<Vec<i64>, _>>()?;
    match ints.as_slice() {
        [1, tokens @ ..] if tokens.len() == keys.len() => Ok(MultiAttempt::Taken {
            tokens: tokens.iter().map(|&t| t as u64).collect(),
        }),
        [0, index, ttl] if (1..=keys.len() as i64).contains(index) => Ok(MultiAttempt::Busy {
            index: (*index - 1) as usize,
            ttl: scripts::pttl(*ttl),
        }),
        [NOT_REPLICATED, acknowledged] => Err(BackendError::NotReplicated {
            acknowledged: u32::try_from(*acknowledged).unwrap_or(0),
            wanted: replicated.map_or(0, Replicated::replicas),
        }),
        other => Err(BackendError::Protocol(format!(
            "multi-acquire script returned {other:?}"
        ))),
    }
}

/// The positions of `keys` (sorted) that one script may take together: all of them on
/// one server, those of each slot on a cluster (in order of their first key).
fn slot_groups(cluster: bool, keys: &[Key]) -> Vec<Vec<usize>> {
    if !cluster {
        return vec![(0..keys.len()).collect()];
    }
    let mut groups: Vec<(Slot, Vec<usize>)> = Vec::new();
    for (at, key) in keys.iter().enumerate() {
        let slot = Slot::for_key(key.redis_key());
        match groups.iter_mut().find(|(s, _)| *s == slot) {
            Some((_, group)) => group.push(at),
            None => groups.push((slot, vec![at])),
        }
    }
    groups.into_iter().map(|(_, group)| group).collect()
}

/// Runs the multi-acquire script for each group in turn (with `replicated`, each with its
/// `WAIT`); answers as one script over all `keys` would: `{1, tokens...}` with everything
/// taken, or `{0, i, pttl}` (lock `i`, 1-based, is busy) with nothing held; or
/// `{NOT_REPLICATED, acknowledged}`, nothing held.
async fn take_groups(
    commands: Commands,
    keys: Vec<Key>,
    groups: Vec<Vec<usize>>,
    holder: Holder,
    lease: Duration,
    fresh: bool,
    replicated: Option<Replicated>,
) -> redis::RedisResult<Vec<Value>> {
    let mut out = vec![Value::Int(1); keys.len() + 1];
    let mut taken: Vec<Key> = Vec::new();
    for group in &groups {
        let call = scripts::acquire_all(
            group.iter().map(|&at| &keys[at]),
            &holder,
            lease,
            fresh,
            commands.variant(),
        );
        let (reply, acknowledged) = match &replicated {
            None => (commands.send::<Vec<Value>>(call).await, None),
            Some(replicated) => match replicated.send_waited(&commands, call).await {
                Ok((reply, acknowledged)) => (Ok(reply), Some(acknowledged)),
                Err(error) => {
                    // The script may have run (only its `WAIT` failed): its locks too.
                    taken.extend(group.iter().map(|&at| keys[at].clone()));
                    give_back(&commands, &taken, &holder).await;
                    return Err(error);
                }
            },
        };
        match reply.as_deref() {
            Ok([Value::Int(1), tokens @ ..]) if tokens.len() == group.len() => {
                for (&at, token) in group.iter().zip(tokens) {
                    out[at + 1] = token.clone();
                    taken.push(keys[at].clone());
                }
                let wanted = replicated.as_ref().map_or(0, Replicated::replicas);
                if let Some(acknowledged) = acknowledged.filter(|&n| n < i64::from(wanted)) {
                    give_back(&commands, &taken, &holder).await;
                    return Ok(vec![Value::Int(NOT_REPLICATED), Value::Int(acknowledged)]);
                }
                continue;
            }
            Ok([Value::Int(0), Value::Int(i), ttl]) if (1..=group.len() as i64).contains(i) => {
                give_back(&commands, &taken, &holder).await;
                let at = group[(*i - 1) as usize] + 1;
                return Ok(vec![Value::Int(0), Value::Int(at as i64), ttl.clone()]);
            }
            _ => {
                give_back(&commands, &taken, &holder).await;
                return reply;
            }
        }
    }
    Ok(out)
}

/// Releases what a multi-acquire took that nobody will hold: the earlier slots of one
/// that then found a lock busy, or all of one whose caller went away.
async fn give_back(commands: &Commands, taken: &[Key], holder: &Holder) {
    let releases = taken.iter().map(|key| {
        let hold = Hold {
            kind: HoldKind::PLAIN,
            key: key.clone(),
            holder: holder.clone(),
        };
        commands.run::<i64>(scripts::release(&hold, None, commands.variant()))
    });
    for (key, released) in taken
        .iter()
        .zip(futures_util::future::join_all(releases).await)
    {
        if let Err(error) = released {
            tracing::warn!(%key, %error, "could not release a lock of an abandoned multi-acquire; it expires with its lease");
        }
    }
}
