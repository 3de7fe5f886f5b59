//! Several locks in one script (`lua/multi_acquire.lua`): all or nothing in one round trip.
//!
//! One script may only touch keys of one slot on a cluster, and the keys of different
//! locks are in different slots (each lock's name is its hash tag). There the set is
//! taken slot by slot, one script per slot, in key order for every caller; when a later
//! slot's lock is busy, what the earlier scripts took is released before answering, so
//! the caller still holds nothing while it waits.

use std::future::Future;
use std::pin::Pin;
use std::sync::LazyLock;
use std::time::Duration;

use redis::cluster_routing::Slot;
use redis::{Script, Value};

use crate::backend::{Kind, MultiAttempt};
use crate::detach::Undone;
use crate::error::BackendError;
use crate::holder::Holder;
use crate::key::Key;
use crate::redis::{bounded, millis, pttl, RedisBackend};

static MULTI_ACQUIRE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../../../lua/multi_acquire.lua")));

impl RedisBackend {
    pub(crate) async fn attempt_many(
        &self,
        keys: &[Key],
        holder: &Holder,
        lease: Duration,
    ) -> Result<MultiAttempt, BackendError> {
        let groups = self.slot_groups(keys);
        let rounds = u32::try_from(groups.len()).unwrap_or(u32::MAX);
        let (backend, owned, who) = (self.clone(), keys.to_vec(), holder.clone());
        let reply = async move { backend.take_groups(&owned, &groups, &who, lease).await };
        // If the caller goes away while a script is in flight, whatever was taken is
        // released once the replies are in.
        let (backend, owned, who) = (self.clone(), keys.to_vec(), holder.clone());
        let undo = Box::new(
            move |reply: redis::RedisResult<Vec<Value>>| -> Pin<Box<dyn Future<Output = ()> + Send>> {
                Box::pin(async move {
                    if matches!(reply.as_deref(), Ok([Value::Int(1), ..])) {
                        backend.give_back(&owned, &who).await;
                    }
                })
            },
        );
        let reply = bounded(self.timeout * rounds, Undone::new(reply, undo)).await?;
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
                ttl: pttl(*ttl),
            }),
            other => Err(BackendError::Protocol(format!(
                "multi-acquire script returned {other:?}"
            ))),
        }
    }

    /// The positions of `keys` (sorted) that one script may take together: all of them
    /// on one server, those of each slot on a cluster (in order of their first key).
    fn slot_groups(&self, keys: &[Key]) -> Vec<Vec<usize>> {
        if !self.conn.is_cluster() {
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

    /// Runs the multi-acquire script for each group in turn; answers as one script over
    /// all `keys` would: `{1, tokens...}` with everything taken, or `{0, i, pttl}` (lock
    /// `i`, 1-based, is busy) with nothing held.
    async fn take_groups(
        &self,
        keys: &[Key],
        groups: &[Vec<usize>],
        holder: &Holder,
        lease: Duration,
    ) -> redis::RedisResult<Vec<Value>> {
        let mut out = vec![Value::Int(1); keys.len() + 1];
        let mut taken: Vec<Key> = Vec::new();
        for group in groups {
            let mut call = MULTI_ACQUIRE.prepare_invoke();
            for &at in group {
                call.key(keys[at].redis_key()).key(keys[at].fence_key());
            }
            call.arg(holder.id()).arg(millis(lease));
            let mut conn = self.conn.clone();
            let reply = call.invoke_async::<Vec<Value>>(&mut conn).await;
            match reply.as_deref() {
                Ok([Value::Int(1), tokens @ ..]) if tokens.len() == group.len() => {
                    for (&at, token) in group.iter().zip(tokens) {
                        out[at + 1] = token.clone();
                        taken.push(keys[at].clone());
                    }
                    continue;
                }
                Ok([Value::Int(0), Value::Int(i), ttl]) if (1..=group.len() as i64).contains(i) => {
                    self.give_back(&taken, holder).await;
                    let at = group[(*i - 1) as usize] + 1;
                    return Ok(vec![Value::Int(0), Value::Int(at as i64), ttl.clone()]);
                }
                _ => {
                    self.give_back(&taken, holder).await;
                    return reply;
                }
            }
        }
        Ok(out)
    }

    /// Releases what a multi-acquire took that nobody will hold: the earlier slots of
    /// one that then found a lock busy, or all of one whose caller went away.
    async fn give_back(&self, taken: &[Key], holder: &Holder) {
        let releases = taken
            .iter()
            .map(|key| self.release(Kind::Plain, key, holder, None));
        for (key, released) in taken
            .iter()
            .zip(futures_util::future::join_all(releases).await)
        {
            if let Err(error) = released {
                tracing::warn!(%key, %error, "could not release a lock of an abandoned multi-acquire; it expires with its lease");
            }
        }
    }
}
