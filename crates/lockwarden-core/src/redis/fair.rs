//! The fair lock on Redis: `fair_acquire.lua`, `fair_release.lua` and `fair_leave.lua`
//! over the lock hash, its fencing key, a queue (list of holder ids in arrival order) and
//! the waiters' deadlines (zset, server clock). See `crate::fair` for the promises.

use std::sync::LazyLock;
use std::time::Duration;

use redis::Script;

use super::{attempted, bounded, eval, evalsha, millis, released, Orphan, RedisBackend};
use crate::backend::{Attempt, Kind, Outcome, Released};
use crate::error::BackendError;
use crate::fair::{wake_prefix, DEADLINES, QUEUE};
use crate::holder::Holder;
use crate::key::Key;

pub(super) static FAIR_ACQUIRE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../../../lua/fair_acquire.lua")));
pub(super) static FAIR_RELEASE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../../../lua/fair_release.lua")));
static FAIR_LEAVE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../../../lua/fair_leave.lua")));

impl RedisBackend {
    /// One attempt at a fair lock; `join` queues (or keeps the place of) a waiter that
    /// does not get it.
    pub(crate) async fn fair_attempt(
        &self,
        key: &Key,
        holder: &Holder,
        lease: Duration,
        queue_timeout: Duration,
        join: bool,
    ) -> Result<Attempt, BackendError> {
        let keys = [
            key.redis_key(),
            key.fence_key(),
            &key.companion(QUEUE),
            &key.companion(DEADLINES),
        ];
        let mut call = evalsha(&FAIR_ACQUIRE, &keys);
        call.arg(holder.id())
            .arg(millis(lease))
            .arg(millis(queue_timeout))
            .arg(wake_prefix(key))
            .arg(if join { "1" } else { "0" });
        let (state, value) = self
            .acquired(
                &FAIR_ACQUIRE,
                call,
                Orphan::new(self, Kind::Fair, key, holder),
            )
            .await?;
        match attempted("fair acquire", state, value)? {
            Attempt::Completed { .. } => Err(BackendError::Protocol(
                "fair acquire script returned an outcome".to_owned(),
            )),
            attempt => Ok(attempt),
        }
    }

    pub(super) async fn release_fair(
        &self,
        key: &Key,
        holder: &Holder,
        outcome: Option<Outcome<'_>>,
    ) -> Result<Released, BackendError> {
        let mut conn = self.conn.clone();
        let mut call = FAIR_RELEASE.prepare_invoke();
        call.key(key.redis_key())
            .key(key.companion(QUEUE))
            .key(key.companion(DEADLINES))
            .arg(holder.id())
            .arg(wake_prefix(key));
        if let Some(outcome) = outcome {
            call.key(key.outcome_key())
                .arg(outcome.bytes)
                .arg(millis(outcome.keep))
                .arg(key.channel());
        }
        let left: i64 = bounded(self.timeout, call.invoke_async(&mut conn)).await?;
        Ok(released(left))
    }

    /// Adds the release of one fair hold to a pipeline (see `RedisBackend::pipelined`).
    pub(super) fn push_fair_release(pipe: &mut redis::Pipeline, key: &Key, holder: &Holder) {
        eval(pipe, &FAIR_RELEASE)
            .arg(3)
            .arg(key.redis_key())
            .arg(key.companion(QUEUE))
            .arg(key.companion(DEADLINES))
            .arg(holder.id())
            .arg(wake_prefix(key));
    }

    /// Takes `holder` out of the queue (and wakes the next waiter if that makes it first
    /// at a free lock). Returns whether it was queued.
    pub(crate) async fn fair_leave(
        &self,
        key: &Key,
        holder: &Holder,
    ) -> Result<bool, BackendError> {
        let mut conn = self.conn.clone();
        let removed: i64 = bounded(
            self.timeout,
            FAIR_LEAVE
                .key(key.redis_key())
                .key(key.companion(QUEUE))
                .key(key.companion(DEADLINES))
                .arg(holder.id())
                .arg(wake_prefix(key))
                .invoke_async(&mut conn),
        )
        .await?;
        Ok(removed == 1)
    }

    /// Waiters in the queue, counting any that died less than their queue timeout ago.
    pub(crate) async fn fair_queued(&self, key: &Key) -> Result<usize, BackendError> {
        let mut conn = self.conn.clone();
        bounded(
            self.timeout,
            redis::cmd("LLEN")
                .arg(key.companion(QUEUE))
                .query_async(&mut conn),
        )
        .await
    }
}
