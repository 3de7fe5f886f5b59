//! Sending calls to Redis: one at a time or pipelined in bulk, each bounded by the command
//! timeout, loading the scripts again when Redis has lost them (after a restart or a
//! failover).

use std::collections::HashMap;
use std::future::Future;
use std::time::Duration;

use futures_util::future::Either;
use futures_util::FutureExt;
use redis::cluster_routing::Slot;
use redis::{FromRedisValue, RedisResult};
use tokio::time::Instant;

use super::conn::Conn;
use super::explain::naming;
use super::notices::Notices;
use super::scripts::{self, Call, Variant, What};
use super::timeout::{bounded, given_up};
use crate::error::BackendError;

/// Commands per pipeline when renewing or releasing in bulk.
const BATCH: usize = 1024;
/// Pipelines to one server sent before the first reply is awaited.
const PIPELINES_IN_FLIGHT: usize = 4;
/// How often one call may load its script after `NOSCRIPT`: once after a restart, once
/// more (on every node) after a failover that came between that load and the call.
const LOADS_PER_CALL: u8 = 2;

/// What [`Commands::pipelined`] answers: each item's reply, `None` where its pipeline
/// failed (or was not sent), and the first failure.
pub(super) struct Piped {
    pub(super) replies: Vec<Option<i64>>,
    pub(super) error: Option<BackendError>,
}

/// The connection the store's commands go over, with their timeout; cheap to clone.
#[derive(Clone)]
pub(super) struct Commands {
    pub(super) conn: Conn,
    pub(super) timeout: Duration,
    /// How the scripts publish release notices (each call is sent in that variant).
    pub(super) notices: Notices,
    /// Whether the scripts that may be are called as Redis functions (see
    /// `Lua::called_as_function`), found at connect.
    pub(super) functions: bool,
}

impl Commands {
    /// The variant of every script this connection sends (see `Lua::call`).
    pub(super) fn variant(&self) -> Variant {
        Variant {
            notices: self.notices,
            cluster: self.conn.is_cluster(),
            functions: self.functions,
        }
    }

    /// `call` as this connection sends it (see [`Call::sent`]): only a cluster client
    /// sends a call again on a new connection.
    pub(super) fn prepare(&self, call: Call) -> Call {
        call.sent(self.conn.is_cluster())
    }

    /// Runs `call`, waiting at most the command timeout.
    pub(super) fn run<T: FromRedisValue + Send>(
        &self,
        call: Call,
    ) -> impl Future<Output = Result<T, BackendError>> {
        let what = call.what;
        self.within(self.send(call))
            .map(move |reply| reply.map_err(|error| naming(error, what)))
    }

    /// `reply`, one call's on this connection, waited for at most the command timeout:
    /// by redis-rs where it keeps that bound itself ([`Conn::bounds_calls`]; it fires
    /// first anyway, and a second timer per call only costs), else by a timer here.
    /// A plain function, as `run` is (see [`bounded`]): a call's future stays the size of
    /// what it sends.
    pub(super) fn within<T>(
        &self,
        reply: impl Future<Output = RedisResult<T>>,
    ) -> impl Future<Output = Result<T, BackendError>> {
        let timeout = self.timeout;
        match self.conn.bounds_calls() {
            true => Either::Left(
                reply.map(move |reply| reply.map_err(|error| given_up(error, timeout))),
            ),
            false => Either::Right(bounded(timeout, reply)),
        }
    }

    /// Runs `call` without a bound (the caller sets one): a future that owns what it
    /// needs, so it can be finished in the background.
    ///
    /// A [resendable](Call::resendable) call whose connection broke is sent once more:
    /// a `ConnectionManager` fails the first command after its connection was lost (a
    /// restart, a failover, a reset) and reconnects only then, so without this the
    /// caller of a call that is safe to repeat would be told of a failure the next
    /// command no longer meets. The resend waits for the new connection, within the
    /// caller's bound; after a restart it also meets `NOSCRIPT` and loads the script.
    /// Past that bound nobody waits for the answer (an abandoned acquire is finished in
    /// the background only to give back what it took), so nothing is sent again: a
    /// resent acquire would take the lock once more, after the caller was told it failed
    /// and had it released.
    pub(super) fn send<T: FromRedisValue + Send>(
        &self,
        call: Call,
    ) -> impl Future<Output = RedisResult<T>> + Send + 'static {
        let mut conn = self.conn.clone();
        let variant = self.variant();
        let mut resend_by = call.resend.then(|| Instant::now() + self.timeout);
        let mut call = self.prepare(call);
        async move {
            // A given holder's counting calls go one at a time on a cluster (`turns.rs`).
            let _turn = match call.turn.take() {
                Some(holder) => Some(super::turns::take(holder).await),
                None => None,
            };
            let mut resend = || resend_by.take().is_some_and(|by| Instant::now() < by);
            if let Some(then) = call.then {
                let mut pipe = redis::Pipeline::with_capacity(2);
                pipe.add_command(call.cmd).add_command(then);
                loop {
                    // The second reply is read and dropped: `ignore()` would cost the
                    // pipeline a hash set, built and searched on every release.
                    match pipe.query_async::<(T, redis::Value)>(&mut conn).await {
                        Err(e) if e.is_connection_dropped() && resend() => {}
                        reply => return reply.map(|(reply, _)| reply),
                    }
                }
            }
            // `NOSCRIPT` (or a function not found) means the script did not run, so
            // loading it and sending the call again is always safe. A second load covers a
            // failover between the load and the call (the new primary never saw the load);
            // the bound keeps a server that keeps forgetting from holding the call here.
            let mut loads = LOADS_PER_CALL;
            loop {
                match call.cmd.query_async(&mut conn).await {
                    Err(e) if is_unloaded(&e) && loads > 0 => {
                        // Made only now: a load carries the script's whole text. The
                        // second goes to every node: the first went where a failover may
                        // have just moved the slot from.
                        if let Some(lua) = call.script {
                            let load = lua.load(variant);
                            match loads {
                                LOADS_PER_CALL => {
                                    conn.load_scripts([load], slot_of(&call.cmd)).await?
                                }
                                // Boxed: rare, and its future would double the size of
                                // every call's (`guard::tests`).
                                _ => Box::pin(conn.load_everywhere(load)).await?,
                            }
                        }
                        loads -= 1;
                    }
                    // Sent again: with the script a second run needs, if the first send
                    // had one that skipped it (a fresh holder's acquire).
                    Err(e) if e.is_connection_dropped() && resend() => call.again(variant),
                    other => return other,
                }
            }
        }
    }

    /// Runs `pipe`, plain commands on one key (no script to load), within the command
    /// timeout, and reads its replies as `T`. If `resend` (a second run answers as the
    /// first) it is sent once more when its connection broke (see [`send`](Self::send));
    /// a cluster's client does that by itself.
    pub(super) async fn run_pipe<T: FromRedisValue + Send>(
        &self,
        pipe: redis::Pipeline,
        resend: bool,
    ) -> Result<T, BackendError> {
        let mut conn = self.conn.clone();
        let mut resend_by =
            (resend && !self.conn.is_cluster()).then(|| Instant::now() + self.timeout);
        let sent = async move {
            loop {
                match pipe.query_async::<T>(&mut conn).await {
                    Err(e)
                        if e.is_connection_dropped()
                            && resend_by.take().is_some_and(|by| Instant::now() < by) => {}
                    reply => return reply,
                }
            }
        };
        self.within(sent).await
    }

    /// Runs one call per item, pipelined in batches, and returns their integer replies in
    /// the items' order. `slot_key` names a key of each call: on a cluster a pipeline may
    /// only hold commands of one slot, so calls are grouped by slot first.
    ///
    /// On one server the pipelines go a few at a time, and none after one fails (the
    /// others would fail alike). On a cluster they go all at once and each stands alone:
    /// a node that does not answer must neither hold back nor fail the other nodes'
    /// calls (a watchdog would lose their locks with it).
    pub(super) async fn pipelined<'a, T: 'a>(
        &self,
        items: &'a [T],
        slot_key: impl Fn(&'a T) -> &'a str,
        call: impl Fn(&'a T) -> Call,
    ) -> Piped {
        // Each pipeline with the positions of its items, its first call (for errors) and
        // its slot on a cluster.
        let mut pipes: Vec<(redis::Pipeline, Vec<usize>, What, Option<Slot>)> = Vec::new();
        let mut open: HashMap<Option<Slot>, usize> = HashMap::new();
        for (at, item) in items.iter().enumerate() {
            let slot = self
                .conn
                .is_cluster()
                .then(|| Slot::for_key(slot_key(item)));
            let call = self.prepare(call(item));
            let pipe = match open.get(&slot) {
                Some(&p) if pipes[p].1.len() < BATCH => p,
                _ => {
                    pipes.push((redis::pipe(), Vec::new(), call.what, slot));
                    open.insert(slot, pipes.len() - 1);
                    pipes.len() - 1
                }
            };
            pipes[pipe].0.add_command(call.cmd);
            if let Some(then) = call.then {
                pipes[pipe].0.add_command(then).ignore();
            }
            pipes[pipe].1.push(at);
        }
        // A few pipelines in flight keep Redis busy while replies are decoded.
        let cluster = self.conn.is_cluster();
        let in_flight = match cluster {
            true => pipes.len().max(1),
            false => PIPELINES_IN_FLIGHT,
        };
        let mut piped = Piped {
            replies: vec![None; items.len()],
            error: None,
        };
        for group in pipes.chunks(in_flight) {
            let replies = futures_util::future::join_all(
                group
                    .iter()
                    .map(|(pipe, _, what, slot)| self.run_pipeline(pipe, *what, *slot)),
            )
            .await;
            for ((_, positions, _, _), reply) in group.iter().zip(replies) {
                let reply = reply.and_then(|reply| match reply.len() == positions.len() {
                    true => Ok(reply),
                    false => Err(BackendError::Protocol(format!(
                        "{} replies to a pipeline of {}",
                        reply.len(),
                        positions.len()
                    ))),
                });
                match reply {
                    Ok(reply) => {
                        for (&at, value) in positions.iter().zip(reply) {
                            piped.replies[at] = Some(value);
                        }
                    }
                    Err(error) => {
                        piped.error.get_or_insert(error);
                    }
                }
            }
            if piped.error.is_some() && !cluster {
                break;
            }
        }
        piped
    }

    async fn run_pipeline(
        &self,
        pipe: &redis::Pipeline,
        what: What,
        slot: Option<Slot>,
    ) -> Result<Vec<i64>, BackendError> {
        let mut conn = self.conn.clone();
        let sent = bounded(self.timeout, pipe.query_async::<Vec<i64>>(&mut conn)).await;
        match sent.map_err(|error| naming(error, what)) {
            Err(BackendError::Redis(e)) if is_unloaded(&e) => {
                let loads = scripts::load_all(self.variant());
                bounded(self.timeout, conn.load_scripts(loads, slot)).await?;
                bounded(self.timeout, pipe.query_async::<Vec<i64>>(&mut conn)).await
            }
            other => other,
        }
    }
}

/// The slot of a script call's first key (`EVALSHA <digest> <key count> <key> ..`), where
/// its script must be loaded on a cluster; `None` for a call without a key.
pub(super) fn slot_of(cmd: &redis::Cmd) -> Option<Slot> {
    match cmd.args_iter().nth(3)? {
        redis::Arg::Simple(key) => Some(Slot::for_key(key)),
        _ => None,
    }
}

/// Whether Redis answered that it does not know a script (it lost its script cache) or
/// function (it lost its functions, or never had ours): the call did not run.
pub(super) fn is_unloaded(e: &redis::RedisError) -> bool {
    e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript)
        || scripts::is_function_missing(e)
}
