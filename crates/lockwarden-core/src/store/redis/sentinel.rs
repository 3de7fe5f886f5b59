//! Following the primary that Redis Sentinel names across failovers.
//!
//! One task per connection owns the sentinel client. It asks the sentinels which server is
//! the primary when a command fails the way a failover makes commands fail (the old
//! primary gone, silent, or demoted to a read-only replica), and once a second as a
//! fallback, and swaps the connection when the answer changes. Commands never wait for
//! it: one that failed is reported as failed (it may or may not have run), and the next
//! one goes to the new primary. Whether a lock survived the failover is then for the
//! lock's next renewal to find out: if the new primary never received it, the renewal
//! finds it gone and the guard is marked lost.

use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::sentinel::SentinelClient;
use redis::{
    Cmd, ErrorKind, Pipeline, RedisError, RedisFuture, RedisResult, ServerErrorKind, Value,
};
use tokio::sync::{watch, Notify};
use tokio_util::sync::{CancellationToken, DropGuard};

use super::timeout::bounded;
use crate::error::BackendError;

/// How often the sentinels are asked even when every command succeeds.
const RECHECK: Duration = Duration::from_secs(1);

/// A connection to the current primary; clones share it and its follower task, which
/// stops with the last clone.
#[derive(Clone)]
pub(super) struct Followed {
    shared: Arc<Shared>,
    _stop: Arc<DropGuard>,
}

struct Shared {
    primary: RwLock<Primary>,
    /// Wakes the follower to ask the sentinels now.
    recheck: Notify,
    /// Counts primary switches, for the pub/sub connection to follow too.
    switches: watch::Sender<u64>,
}

struct Primary {
    conn: ConnectionManager,
    client: redis::Client,
}

impl Followed {
    pub(super) async fn connect(
        mut sentinel: SentinelClient,
        config: ConnectionManagerConfig,
        timeout: Duration,
    ) -> Result<Self, BackendError> {
        let client = bounded(timeout, sentinel.async_get_client()).await?;
        let conn = bounded(
            timeout,
            client.get_connection_manager_with_config(config.clone()),
        )
        .await?;
        let shared = Arc::new(Shared {
            primary: RwLock::new(Primary { conn, client }),
            recheck: Notify::new(),
            switches: watch::Sender::new(0),
        });
        let stop = CancellationToken::new();
        tokio::spawn(follow(
            sentinel,
            shared.clone(),
            config,
            timeout,
            stop.clone(),
        ));
        Ok(Self {
            shared,
            _stop: Arc::new(stop.drop_guard()),
        })
    }

    fn primary(&self) -> std::sync::RwLockReadGuard<'_, Primary> {
        self.shared
            .primary
            .read()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// The connection to the current primary (a handle: cloning it is cheap).
    fn conn(&self) -> ConnectionManager {
        self.primary().conn.clone()
    }

    /// A client for the current primary (for the pub/sub connection).
    pub(super) fn client(&self) -> redis::Client {
        self.primary().client.clone()
    }

    /// Changes each time another server becomes the primary.
    pub(super) fn switches(&self) -> watch::Receiver<u64> {
        self.shared.switches.subscribe()
    }

    /// Asks the follower to check the primary now.
    pub(super) fn recheck(&self) {
        self.shared.recheck.notify_one();
    }

    fn observe<T>(&self, reply: &RedisResult<T>) {
        if let Err(error) = reply {
            if failover_symptom(error) {
                self.recheck();
            }
        }
    }

    pub(super) fn req_packed_command<'a>(&'a self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(async move {
            let mut conn = self.conn();
            let reply = conn.req_packed_command(cmd).await;
            self.observe(&reply);
            reply
        })
    }

    pub(super) fn req_packed_commands<'a>(
        &'a self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(async move {
            let mut conn = self.conn();
            let reply = conn.req_packed_commands(pipeline, offset, count).await;
            self.observe(&reply);
            reply
        })
    }
}

/// Errors that a failover causes: the primary unreachable or silent, or no longer the
/// primary (a demoted primary refuses writes).
fn failover_symptom(error: &RedisError) -> bool {
    error.is_io_error()
        || error.is_timeout()
        || error.is_connection_dropped()
        || error.is_connection_refusal()
        || matches!(
            error.kind(),
            ErrorKind::Server(ServerErrorKind::ReadOnly | ServerErrorKind::MasterDown)
        )
}

async fn follow(
    mut sentinel: SentinelClient,
    shared: Arc<Shared>,
    config: ConnectionManagerConfig,
    timeout: Duration,
    stop: CancellationToken,
) {
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            () = shared.recheck.notified() => {}
            () = tokio::time::sleep(RECHECK) => {}
        }
        let client = match bounded(timeout, sentinel.async_get_client()).await {
            Ok(client) => client,
            Err(error) => {
                tracing::debug!(%error, "sentinels did not name a primary; asking again");
                continue;
            }
        };
        let current = shared
            .primary
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .client
            .get_connection_info()
            .addr()
            .clone();
        let named = client.get_connection_info().addr().clone();
        if named == current {
            continue;
        }
        let conn = match bounded(
            timeout,
            client.get_connection_manager_with_config(config.clone()),
        )
        .await
        {
            Ok(conn) => conn,
            Err(error) => {
                tracing::warn!(%error, primary = %named, "could not connect to the new primary; retrying");
                continue;
            }
        };
        *shared
            .primary
            .write()
            .unwrap_or_else(PoisonError::into_inner) = Primary { conn, client };
        shared.switches.send_modify(|n| *n += 1);
        tracing::warn!(from = %current, to = %named,
            "Sentinel named a new primary; locks it did not receive are reported lost at their next renewal");
    }
}
