//! The Redis lock store: the Lua scripts in `lua/`, run over the deployment's connection
//! (`conn.rs`: one server, a cluster, or the primary Sentinel names), plus the client's
//! pub/sub connection (`pubsub.rs`).

pub(crate) mod conn;
mod fair;
mod multi;
pub(crate) mod pubsub;
mod replicated;
mod rw;
pub(crate) mod sentinel;

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::LazyLock;
use std::task::{Context, Poll};
use std::time::Duration;

use redis::cluster_routing::Slot;
use redis::{RedisResult, Script, Value};

use crate::backend::{Attempt, Kind, Outcome, Released, Renewal};
use crate::error::BackendError;
use crate::holder::Holder;
use crate::key::Key;
use conn::{Conn, Deployment};
use replicated::{Replicated, NOT_REPLICATED};

static ACQUIRE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../../../lua/acquire.lua")));
static RENEW: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../../../lua/renew.lua")));
static RELEASE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../../../lua/release.lua")));
static FORCE_RELEASE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../../../../lua/force_release.lua")));

/// Every script that [`RedisBackend::pipelined`] may send (loaded again if Redis lost them).
static PIPELINED: [&LazyLock<Script>; 5] = [
    &RELEASE,
    &RENEW,
    &rw::RELEASE,
    &rw::RENEW,
    &fair::FAIR_RELEASE,
];

/// Commands per pipeline when renewing or releasing in bulk.
const BATCH: usize = 1024;
/// Pipelines sent before the first reply is awaited.
const PIPELINES_IN_FLIGHT: usize = 4;

#[derive(Clone)]
pub(crate) struct RedisBackend {
    conn: Conn,
    timeout: Duration,
    /// Set when acquisitions wait for replicas (`WAIT`).
    replicated: Option<Replicated>,
}

impl RedisBackend {
    /// Connects; with `replicas = Some((n, wait))` acquisitions also wait up to `wait`
    /// for `n` replicas to acknowledge them. Also says where the client's pub/sub
    /// connection goes.
    pub(crate) async fn connect(
        deployment: &Deployment,
        timeout: Duration,
        replicas: Option<(u32, Duration)>,
    ) -> Result<(Self, pubsub::Source), BackendError> {
        let (conn, source) = deployment.connect(timeout, timeout).await?;
        let replicated = match replicas {
            None => None,
            Some((n, wait)) => {
                let (conn, _) = deployment.connect(timeout, timeout + wait).await?;
                Some(Replicated::new(conn, n, wait))
            }
        };
        let backend = Self {
            conn,
            timeout,
            replicated,
        };
        Ok((backend, source))
    }

    pub(crate) async fn attempt(
        &self,
        key: &Key,
        holder: &Holder,
        lease: Duration,
        claim: bool,
    ) -> Result<Attempt, BackendError> {
        let outcome_key;
        let mut keys = vec![key.redis_key(), key.fence_key()];
        if claim {
            outcome_key = key.outcome_key();
            keys.push(&outcome_key);
        }
        let mut call = evalsha(&ACQUIRE, &keys);
        call.arg(holder.id()).arg(millis(lease));
        let (state, value) = self
            .acquired(&ACQUIRE, call, Orphan::new(self, Kind::Plain, key, holder))
            .await?;
        attempted("acquire", state, value)
    }

    /// Sends an acquire script's call (its `EVALSHA`, see [`evalsha`]), with `WAIT` in
    /// the same round trip if acquisitions wait for replicas. An acquisition too few
    /// replicas acknowledged has been released and is `NotReplicated`; one whose caller
    /// goes away while the call is in flight is released once the reply is in.
    pub(crate) async fn acquired(
        &self,
        script: &'static Script,
        call: redis::Cmd,
        orphan: Orphan,
    ) -> Result<(i64, Value), BackendError> {
        let mut limit = self.timeout;
        let reply: Reply = match &self.replicated {
            None => {
                let mut conn = self.conn.clone();
                Box::pin(async move { run_script(&mut conn, script, &call).await })
            }
            Some(replicated) => {
                limit += replicated.timeout();
                let (replicated, undo) = (replicated.clone(), orphan.clone());
                Box::pin(async move { replicated.acquire(script, call, undo).await })
            }
        };
        let (state, value) = bounded(limit, Unclaimed::new(reply, orphan)).await?;
        if state == NOT_REPLICATED {
            return Err(BackendError::NotReplicated {
                acknowledged: match value {
                    Value::Int(n) => u32::try_from(n).unwrap_or(0),
                    _ => 0,
                },
                wanted: self.replicated.as_ref().map_or(0, Replicated::replicas),
            });
        }
        Ok((state, value))
    }

    pub(crate) async fn release(
        &self,
        kind: Kind,
        key: &Key,
        holder: &Holder,
        outcome: Option<Outcome<'_>>,
    ) -> Result<Released, BackendError> {
        match kind {
            Kind::Plain => self.release_plain(key, holder, outcome).await,
            Kind::Fair => self.release_fair(key, holder, outcome).await,
            Kind::Read | Kind::Write => self.rw_release(kind, key, holder).await,
        }
    }

    async fn release_plain(
        &self,
        key: &Key,
        holder: &Holder,
        outcome: Option<Outcome<'_>>,
    ) -> Result<Released, BackendError> {
        let mut conn = self.conn.clone();
        let mut call = RELEASE.prepare_invoke();
        call.key(key.redis_key())
            .arg(holder.id())
            .arg(key.channel());
        if let Some(outcome) = outcome {
            call.key(key.outcome_key())
                .arg(outcome.bytes)
                .arg(millis(outcome.keep));
        }
        let left: i64 = bounded(self.timeout, call.invoke_async(&mut conn)).await?;
        Ok(released(left))
    }

    /// Releases in bulk (guards dropped without `release().await`), one round trip per batch.
    pub(crate) async fn release_many(
        &self,
        items: &[(Kind, Key, Holder)],
    ) -> Result<Vec<Released>, BackendError> {
        let replies = self
            .pipelined(
                items,
                |(_, key, _)| key.redis_key(),
                |pipe, (kind, key, holder)| match kind {
                    Kind::Plain => {
                        eval(pipe, &RELEASE)
                            .arg(1)
                            .arg(key.redis_key())
                            .arg(holder.id())
                            .arg(key.channel());
                    }
                    Kind::Fair => Self::push_fair_release(pipe, key, holder),
                    Kind::Read | Kind::Write => rw::push_release(pipe, *kind, key, holder),
                },
            )
            .await?;
        Ok(replies.into_iter().map(released).collect())
    }

    pub(crate) async fn renew_many(&self, renewals: &[Renewal]) -> Result<Vec<bool>, BackendError> {
        let replies = self
            .pipelined(
                renewals,
                |r| r.key.redis_key(),
                |pipe, r| match r.kind {
                    // A fair lock's hash has the plain shape; its queue needs no renewal.
                    Kind::Plain | Kind::Fair => {
                        eval(pipe, &RENEW)
                            .arg(2)
                            .arg(r.key.redis_key())
                            .arg(r.key.fence_key())
                            .arg(r.holder.id())
                            .arg(millis(r.lease));
                    }
                    Kind::Read | Kind::Write => rw::push_renew(pipe, r),
                },
            )
            .await?;
        Ok(replies.into_iter().map(|r| r == 1).collect())
    }

    pub(crate) async fn force_unlock(&self, key: &Key) -> Result<bool, BackendError> {
        let mut conn = self.conn.clone();
        let deleted: i64 = bounded(
            self.timeout,
            FORCE_RELEASE
                .key(key.redis_key())
                .arg(key.channel())
                .invoke_async(&mut conn),
        )
        .await?;
        Ok(deleted == 1)
    }

    pub(crate) async fn hold_count(&self, key: &Key, holder: &Holder) -> Result<u64, BackendError> {
        let mut conn = self.conn.clone();
        let count: Option<u64> = bounded(
            self.timeout,
            redis::cmd("HGET")
                .arg(key.redis_key())
                .arg(holder.id())
                .query_async(&mut conn),
        )
        .await?;
        Ok(count.unwrap_or(0))
    }

    pub(crate) async fn is_locked(&self, key: &Key) -> Result<bool, BackendError> {
        let mut conn = self.conn.clone();
        let n: i64 = bounded(
            self.timeout,
            redis::cmd("EXISTS")
                .arg(key.redis_key())
                .query_async(&mut conn),
        )
        .await?;
        Ok(n == 1)
    }

    pub(crate) async fn remaining_ttl(&self, key: &Key) -> Result<Option<Duration>, BackendError> {
        let mut conn = self.conn.clone();
        let ms: i64 = bounded(
            self.timeout,
            redis::cmd("PTTL")
                .arg(key.redis_key())
                .query_async(&mut conn),
        )
        .await?;
        // -2: no lock; -1: a lock without expiry (not one of ours).
        Ok(match ms {
            -2 => None,
            -1 => Some(Duration::MAX),
            ms => Some(Duration::from_millis(ms.max(0) as u64)),
        })
    }

    /// Runs one script call per item (`push` adds it, see [`eval`]) pipelined in batches;
    /// loads the scripts and retries once if Redis lost them (e.g. after a restart).
    /// `slot_key` names a key of each item: on a cluster, a pipeline may only hold
    /// commands of one slot, so items are grouped by slot first.
    async fn pipelined<T>(
        &self,
        items: &[T],
        slot_key: impl Fn(&T) -> &str,
        push: impl Fn(&mut redis::Pipeline, &T),
    ) -> Result<Vec<i64>, BackendError> {
        // Each pipeline with the positions of its items.
        let mut pipes: Vec<(redis::Pipeline, Vec<usize>)> = Vec::new();
        let mut open: HashMap<Option<Slot>, usize> = HashMap::new();
        for (at, item) in items.iter().enumerate() {
            let slot = self
                .conn
                .is_cluster()
                .then(|| Slot::for_key(slot_key(item)));
            let pipe = match open.get(&slot) {
                Some(&p) if pipes[p].1.len() < BATCH => p,
                _ => {
                    pipes.push((redis::pipe(), Vec::new()));
                    open.insert(slot, pipes.len() - 1);
                    pipes.len() - 1
                }
            };
            push(&mut pipes[pipe].0, item);
            pipes[pipe].1.push(at);
        }
        // A few pipelines in flight keep Redis busy while replies are decoded.
        let mut out = vec![0; items.len()];
        for group in pipes.chunks(PIPELINES_IN_FLIGHT) {
            let replies = futures_util::future::try_join_all(
                group.iter().map(|(pipe, _)| self.run_pipeline(pipe)),
            )
            .await?;
            for ((_, positions), reply) in group.iter().zip(replies) {
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

    async fn run_pipeline(&self, pipe: &redis::Pipeline) -> Result<Vec<i64>, BackendError> {
        let mut conn = self.conn.clone();
        match bounded(self.timeout, pipe.query_async::<Vec<i64>>(&mut conn)).await {
            Err(BackendError::Redis(e))
                if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) =>
            {
                for script in PIPELINED {
                    bounded(self.timeout, script.prepare_invoke().load_async(&mut conn)).await?;
                }
                bounded(self.timeout, pipe.query_async::<Vec<i64>>(&mut conn)).await
            }
            other => other,
        }
    }
}

/// The `{state, value}` reply of an acquire script (`acquire.lua`, `fair_acquire.lua`):
/// `{1, token}` taken, `{2, token}` re-entered, `{0, pttl}` busy, `{3, outcome}` completed.
pub(crate) fn attempted(script: &str, state: i64, value: Value) -> Result<Attempt, BackendError> {
    match (state, value) {
        (1, Value::Int(token)) => Ok(Attempt::Taken {
            token: token as u64,
        }),
        (2, Value::Int(token)) => Ok(Attempt::Reentered {
            token: token as u64,
        }),
        (0, Value::Int(ms)) => Ok(Attempt::Busy { ttl: pttl(ms) }),
        (3, Value::BulkString(outcome)) => Ok(Attempt::Completed { outcome }),
        (state, other) => Err(BackendError::Protocol(format!(
            "{script} script returned {{{state}, {other:?}}}"
        ))),
    }
}

/// A lock's remaining lease from its `PTTL`: -2 (gone since the check) is zero, -1 (no
/// expiry: not one of ours) is unknown; both mean "retry now or later".
pub(crate) fn pttl(ms: i64) -> Option<Duration> {
    match ms {
        -2 => Some(Duration::ZERO),
        ms if ms < 0 => None,
        ms => Some(Duration::from_millis(ms as u64)),
    }
}

/// An `EVALSHA` of `script` over `keys`; the caller adds the arguments.
pub(crate) fn evalsha<K: AsRef<str>>(script: &Script, keys: &[K]) -> redis::Cmd {
    let mut cmd = redis::cmd("EVALSHA");
    cmd.arg(script.get_hash()).arg(keys.len());
    for key in keys {
        cmd.arg(key.as_ref());
    }
    cmd
}

/// Runs `call`, an `EVALSHA` of `script`, loading the script first if Redis lost it.
async fn run_script<T: redis::FromRedisValue>(
    conn: &mut Conn,
    script: &Script,
    call: &redis::Cmd,
) -> RedisResult<T> {
    match call.query_async(conn).await {
        Err(e) if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) => {
            script.prepare_invoke().load_async(conn).await?;
            call.query_async(conn).await
        }
        other => other,
    }
}

/// Starts an `EVALSHA` of `script` in `pipe`; the caller adds the key count, keys and args.
pub(crate) fn eval<'p>(pipe: &'p mut redis::Pipeline, script: &Script) -> &'p mut redis::Pipeline {
    pipe.cmd("EVALSHA").arg(script.get_hash())
}

pub(crate) fn released(left: i64) -> Released {
    match left {
        n if n < 0 => Released::NotHeld,
        0 => Released::Freed,
        n => Released::Remaining(n as u64),
    }
}

pub(crate) fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1)
}

pub(crate) async fn bounded<T>(
    timeout: Duration,
    fut: impl Future<Output = RedisResult<T>>,
) -> Result<T, BackendError> {
    match tokio::time::timeout(timeout, fut).await {
        Ok(reply) => Ok(reply?),
        Err(_) => Err(BackendError::TimedOut(timeout)),
    }
}

pub(crate) type Reply = Pin<Box<dyn Future<Output = RedisResult<(i64, Value)>> + Send>>;

/// What to undo if an acquire's reply arrives after nobody waits for it any more (or
/// reports a lock too few replicas acknowledged).
#[derive(Clone)]
pub(crate) struct Orphan {
    pub backend: RedisBackend,
    pub kind: Kind,
    pub key: Key,
    pub holder: Holder,
}

impl Orphan {
    pub(crate) fn new(backend: &RedisBackend, kind: Kind, key: &Key, holder: &Holder) -> Self {
        Self {
            backend: backend.clone(),
            kind,
            key: key.clone(),
            holder: holder.clone(),
        }
    }
}

/// An acquire call whose caller may go away (cancellation or a local timeout) while the
/// script is in flight. If it does, the call is finished in the background and an
/// acquisition it made is released, so a dropped acquire never leaves a lock held.
pub(crate) struct Unclaimed {
    reply: Option<Reply>,
    orphan: Option<Orphan>,
}

impl Unclaimed {
    pub(crate) fn new(reply: Reply, orphan: Orphan) -> Self {
        Self {
            reply: Some(reply),
            orphan: Some(orphan),
        }
    }
}

impl Future for Unclaimed {
    type Output = RedisResult<(i64, Value)>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let Some(reply) = self.reply.as_mut() else {
            return Poll::Pending;
        };
        let out = std::task::ready!(reply.as_mut().poll(cx));
        self.reply = None;
        Poll::Ready(out)
    }
}

impl Drop for Unclaimed {
    fn drop(&mut self) {
        let (Some(reply), Some(orphan)) = (self.reply.take(), self.orphan.take()) else {
            return;
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        runtime.spawn(async move {
            let Orphan {
                backend,
                kind,
                key,
                holder,
            } = orphan;
            match (reply.await, kind) {
                // Taken or re-entered: one count is ours and nobody will release it.
                (Ok((1 | 2, _)), _) => match backend.release(kind, &key, &holder, None).await {
                    Ok(_) => tracing::debug!(%key, "released a lock whose acquire was abandoned"),
                    Err(error) => tracing::warn!(%key, %error,
                        "could not release a lock whose acquire was abandoned; it expires with its lease"),
                },
                // Queued for a fair lock: nobody will wait for the turn, so give it up now
                // rather than make the ones behind wait for the queue timeout.
                (Ok((0, _)), Kind::Fair) => {
                    if let Err(error) = backend.fair_leave(&key, &holder).await {
                        tracing::debug!(%key, %error,
                            "could not leave the queue of an abandoned fair acquire; its queue timeout removes it");
                    }
                }
                _ => {}
            }
        });
    }
}
