//! Sending calls to Redis: one at a time or pipelined in bulk, each bounded by the command
//! timeout, loading the scripts again when Redis has lost them (after a restart or a
//! failover).

use std::collections::HashMap;
use std::future::Future;
use std::time::Duration;

use redis::cluster_routing::Slot;
use redis::{FromRedisValue, RedisResult};

use super::conn::Conn;
use super::explain::naming;
use super::scripts::{self, Call, What};
use super::timeout::bounded;
use crate::error::BackendError;

/// Commands per pipeline when renewing or releasing in bulk.
const BATCH: usize = 1024;
/// Pipelines sent before the first reply is awaited.
const PIPELINES_IN_FLIGHT: usize = 4;

/// The connection the store's commands go over, with their timeout; cheap to clone.
#[derive(Clone)]
pub(super) struct Commands {
    pub(super) conn: Conn,
    pub(super) timeout: Duration,
}

impl Commands {
    /// Runs `call`, waiting at most the command timeout.
    pub(super) async fn run<T: FromRedisValue + Send>(
        &self,
        call: Call,
    ) -> Result<T, BackendError> {
        let what = call.what;
        bounded(self.timeout, self.send(call))
            .await
            .map_err(|error| naming(error, what))
    }

    /// Runs `call` without a bound (the caller sets one): a future that owns what it
    /// needs, so it can be finished in the background.
    pub(super) fn send<T: FromRedisValue + Send>(
        &self,
        call: Call,
    ) -> impl Future<Output = RedisResult<T>> + Send + 'static {
        let mut conn = self.conn.clone();
        async move {
            match call.cmd.query_async(&mut conn).await {
                Err(e) if is_noscript(&e) => {
                    if let Some(script) = call.script {
                        script.prepare_invoke().load_async(&mut conn).await?;
                    }
                    call.cmd.query_async(&mut conn).await
                }
                other => other,
            }
        }
    }

    /// Runs one call per item, pipelined in batches, and returns their integer replies in
    /// the items' order. `slot_key` names a key of each call: on a cluster a pipeline may
    /// only hold commands of one slot, so calls are grouped by slot first.
    pub(super) async fn pipelined<'a, T: 'a>(
        &self,
        items: &'a [T],
        slot_key: impl Fn(&'a T) -> &'a str,
        call: impl Fn(&'a T) -> Call,
    ) -> Result<Vec<i64>, BackendError> {
        // Each pipeline with the positions of its items (and its first call, for errors).
        let mut pipes: Vec<(redis::Pipeline, Vec<usize>, What)> = Vec::new();
        let mut open: HashMap<Option<Slot>, usize> = HashMap::new();
        for (at, item) in items.iter().enumerate() {
            let slot = self
                .conn
                .is_cluster()
                .then(|| Slot::for_key(slot_key(item)));
            let call = call(item);
            let pipe = match open.get(&slot) {
                Some(&p) if pipes[p].1.len() < BATCH => p,
                _ => {
                    pipes.push((redis::pipe(), Vec::new(), call.what));
                    open.insert(slot, pipes.len() - 1);
                    pipes.len() - 1
                }
            };
            pipes[pipe].0.add_command(call.cmd);
            pipes[pipe].1.push(at);
        }
        // A few pipelines in flight keep Redis busy while replies are decoded.
        let mut out = vec![0; items.len()];
        for group in pipes.chunks(PIPELINES_IN_FLIGHT) {
            let replies = futures_util::future::try_join_all(
                group
                    .iter()
                    .map(|(pipe, _, what)| self.run_pipeline(pipe, *what)),
            )
            .await?;
            for ((_, positions, _), reply) in group.iter().zip(replies) {
                if reply.len() != positions.len() {
                    return Err(BackendError::Protocol(format!(
                        "{} replies to a pipeline of {}",
                        reply.len(),
                        positions.len()
                    )));
                }
                for (&at, value) in positions.iter().zip(reply) {
                    out[at] = value;
                }
            }
        }
        Ok(out)
    }

    async fn run_pipeline(
        &self,
        pipe: &redis::Pipeline,
        what: What,
    ) -> Result<Vec<i64>, BackendError> {
        let mut conn = self.conn.clone();
        let sent = bounded(self.timeout, pipe.query_async::<Vec<i64>>(&mut conn)).await;
        match sent.map_err(|error| naming(error, what)) {
            Err(BackendError::Redis(e)) if is_noscript(&e) => {
                // All at once: one after the other they cost a round trip each, which on
                // a slow link outlasted a watchdog lease (tests/fault_network.rs).
                let loads = scripts::all().map(|script| {
                    let mut conn = conn.clone();
                    async move { script.prepare_invoke().load_async(&mut conn).await }
                });
                bounded(self.timeout, futures_util::future::try_join_all(loads)).await?;
                bounded(self.timeout, pipe.query_async::<Vec<i64>>(&mut conn)).await
            }
            other => other,
        }
    }
}

/// Whether Redis answered that it does not know a script (it lost its script cache).
pub(super) fn is_noscript(e: &redis::RedisError) -> bool {
    e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript)
}
