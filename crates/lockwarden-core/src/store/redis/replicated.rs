//! Acquisitions that wait for replicas: the acquire script and a `WAIT` in one pipeline,
//! on a connection of their own.
//!
//! A lock written only to the primary is lost if the primary fails before replicating it
//! (the failover window the Redlock discussion describes). `WAIT n timeout` after the
//! script narrows that window to what `n` replicas have not acknowledged. `WAIT` blocks
//! the connection it is sent on, so it gets a connection of its own: renewals and
//! releases never queue behind a slow replica.

use std::future::Future;
use std::time::Duration;

use redis::RedisResult;

use super::commands::{is_unloaded, Commands};
use super::conn::Conn;
use super::scripts::{self, Call, Reply};
use crate::hold::Hold;

/// Whether `error` is a pipeline's error in which Redis answered the script and refused
/// only the `WAIT` (the second command).
fn only_wait_failed(error: &redis::RedisError) -> bool {
    matches!(
        error.clone().into_server_errors().as_deref(),
        Some([(1, _)])
    ) && !error.is_io_error()
}

#[derive(Clone)]
pub(super) struct Replicated {
    conn: Conn,
    replicas: u32,
    timeout: Duration,
}

impl Replicated {
    pub(super) fn new(conn: Conn, replicas: u32, timeout: Duration) -> Self {
        Self {
            conn,
            replicas,
            timeout,
        }
    }

    pub(super) fn replicas(&self) -> u32 {
        self.replicas
    }

    /// The longest a `WAIT` may add to a command.
    pub(super) fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Sends `call` (prepared as `main` sends it) then `WAIT` in one pipeline on this
    /// connection, loading the script if Redis lacks it; the script's reply and how many
    /// replicas acknowledged it. On a cluster the pipeline goes to the node of `call`'s
    /// key, `WAIT` included, so it counts that node's replicas.
    pub(super) async fn send_waited<T: redis::FromRedisValue>(
        &self,
        main: &Commands,
        call: Call,
    ) -> RedisResult<(T, i64)> {
        let mut conn = self.conn.clone();
        let mut call = main.prepare(call);
        // As `Commands::send`: a given holder's counting calls take turns on a cluster.
        let _turn = match call.turn.take() {
            Some(holder) => Some(super::turns::take(holder).await),
            None => None,
        };
        let slot = super::commands::slot_of(&call.cmd);
        let mut pipe = redis::pipe();
        pipe.add_command(call.cmd)
            .cmd("WAIT")
            .arg(self.replicas)
            .arg(scripts::millis(self.timeout));
        match pipe.query_async(&mut conn).await {
            Err(e) if is_unloaded(&e) => {
                if let Some(lua) = call.script {
                    let load = lua.load(main.variant());
                    conn.load_scripts([load], slot).await?;
                }
                pipe.query_async(&mut conn).await
            }
            other => other,
        }
    }

    /// Runs the acquire `call`, then `WAIT`, in one round trip. A lock it took that too
    /// few replicas acknowledged is released (over `main`) before answering
    /// [`Reply::NotReplicated`], so no caller ever holds a lock it was told it did not get.
    pub(super) fn acquire(
        &self,
        call: Call,
        main: Commands,
        hold: Hold,
    ) -> impl Future<Output = RedisResult<Reply>> + Send + 'static {
        let this = self.clone();
        async move {
            let sent = this.send_waited(&main, call).await;
            let (answer, acked): (Reply, i64) = match sent {
                Ok(replies) => replies,
                Err(error) if only_wait_failed(&error) => {
                    // The script ran (it may have taken the lock) and `WAIT` was refused
                    // (an ACL user without it): give back what the script took.
                    if let Err(release) = main
                        .run::<i64>(scripts::release(&hold, None, main.variant()))
                        .await
                    {
                        tracing::warn!(key = %hold.key, %release,
                            "could not release a lock whose WAIT failed; it expires with its lease");
                    }
                    return Err(error);
                }
                Err(error) => return Err(error),
            };
            if answer.holds() && acked < i64::from(this.replicas) {
                if let Err(error) = main
                    .run::<i64>(scripts::release(&hold, None, main.variant()))
                    .await
                {
                    tracing::warn!(key = %hold.key, %error,
                        "could not release a lock that was not replicated; it expires with its lease");
                }
                return Ok(Reply::NotReplicated(u32::try_from(acked).unwrap_or(0)));
            }
            Ok(answer)
        }
    }
}
