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

use super::commands::Commands;
use super::explain::naming;
use super::replicated::Replicated;
use super::scripts::{self, MultiReply};
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
        waiting,
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
        Asked {
            lease,
            fresh,
            waiting,
        },
        replicated.cloned(),
    );
    // If the caller goes away while a script is in flight, whatever was taken is
    // released once the replies are in.
    let undo_with = commands.clone();
    let undo = Box::new(move |reply: redis::RedisResult<MultiReply>| -> BoxFuture {
        Box::pin(async move {
            if matches!(reply, Ok(MultiReply::Taken(_))) {
                give_back(&undo_with, &owned, &who).await;
            }
        })
    });
    let limit = commands.timeout * rounds + replicated.map_or(Duration::ZERO, Replicated::timeout);
    let reply = bounded(limit, Finish::new(take).or_undo(undo))
        .await
        .map_err(|error| naming(error, scripts::What::Script("multi_acquire.lua")))?;
    match reply {
        MultiReply::Taken(tokens) if tokens.len() == keys.len() => {
            Ok(MultiAttempt::Taken { tokens })
        }
        MultiReply::Busy { index, ttl } if index < keys.len() => {
            Ok(MultiAttempt::Busy { index, ttl })
        }
        MultiReply::NotReplicated(acknowledged) => Err(BackendError::NotReplicated {
            acknowledged,
            wanted: replicated.map_or(0, Replicated::replicas),
        }),
        other => Err(BackendError::Protocol(format!(
            "multi-acquire of {} locks answered {other:?}",
            keys.len()
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

/// How every group is asked: for `lease`, and as [`AcquireAll`]'s `fresh` and `waiting`.
#[derive(Clone, Copy)]
struct Asked {
    lease: Duration,
    fresh: bool,
    waiting: bool,
}

/// Runs the multi-acquire script for each group in turn (with `replicated`, each with its
/// `WAIT`); answers as one script over all `keys` would: every token, in the order of
/// `keys`, or the first busy lock (its position in `keys`) with nothing held; or not
/// replicated, nothing held.
async fn take_groups(
    commands: Commands,
    keys: Vec<Key>,
    groups: Vec<Vec<usize>>,
    holder: Holder,
    asked: Asked,
    replicated: Option<Replicated>,
) -> redis::RedisResult<MultiReply> {
    let mut out = vec![0; keys.len()];
    let mut taken: Vec<Key> = Vec::new();
    for group in &groups {
        let call = scripts::acquire_all(
            group.iter().map(|&at| &keys[at]),
            &holder,
            asked.lease,
            (asked.fresh, asked.waiting),
            commands.variant(),
        );
        let (reply, acknowledged) = match &replicated {
            None => (commands.send::<MultiReply>(call).await, None),
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
        match reply {
            Ok(MultiReply::Taken(tokens)) if tokens.len() == group.len() => {
                for (&at, token) in group.iter().zip(tokens) {
                    out[at] = token;
                    taken.push(keys[at].clone());
                }
                let wanted = replicated.as_ref().map_or(0, Replicated::replicas);
                if let Some(acknowledged) = acknowledged.filter(|&n| n < i64::from(wanted)) {
                    give_back(&commands, &taken, &holder).await;
                    let acknowledged = u32::try_from(acknowledged).unwrap_or(0);
                    return Ok(MultiReply::NotReplicated(acknowledged));
                }
            }
            Ok(MultiReply::Busy { index, ttl }) if index < group.len() => {
                give_back(&commands, &taken, &holder).await;
                let index = group[index];
                return Ok(MultiReply::Busy { index, ttl });
            }
            other => {
                give_back(&commands, &taken, &holder).await;
                return other;
            }
        }
    }
    Ok(MultiReply::Taken(out))
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
