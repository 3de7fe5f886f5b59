//! Acquisitions that wait for replicas: the acquire script and a `WAIT` in one pipeline,
//! on a connection of their own.
//!
//! A lock written only to the primary is lost if the primary fails before replicating it
//! (the failover window the Redlock discussion describes). `WAIT n timeout` after the
//! script narrows that window to what `n` replicas have not acknowledged. `WAIT` blocks
//! the connection it is sent on, so it gets a connection of its own: renewals and
//! releases never queue behind a slow replica.

use std::time::Duration;

use redis::{Cmd, RedisResult, Script, Value};

use crate::redis::conn::Conn;
use crate::redis::{millis, Orphan};

/// The synthetic acquire state of a lock taken but not acknowledged by enough replicas
/// (and released again); its value is the number that acknowledged.
pub(crate) const NOT_REPLICATED: i64 = 4;

#[derive(Clone)]
pub(crate) struct Replicated {
    conn: Conn,
    replicas: u32,
    timeout: Duration,
}

impl Replicated {
    pub(crate) fn new(conn: Conn, replicas: u32, timeout: Duration) -> Self {
        Self {
            conn,
            replicas,
            timeout,
        }
    }

    pub(crate) fn replicas(&self) -> u32 {
        self.replicas
    }

    /// The longest a `WAIT` may add to a command.
    pub(crate) fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Runs `call` then `WAIT` in one round trip. A lock it took that too few replicas
    /// acknowledged is released before answering [`NOT_REPLICATED`], so no caller ever
    /// holds a lock it was told it did not get.
    /// `eval` is the `EVALSHA` of `script`, keys and arguments included.
    pub(crate) async fn acquire(
        &self,
        script: &Script,
        eval: Cmd,
        undo: Orphan,
    ) -> RedisResult<(i64, Value)> {
        let mut conn = self.conn.clone();
        let mut pipe = redis::pipe();
        pipe.add_command(eval)
            .cmd("WAIT")
            .arg(self.replicas)
            .arg(millis(self.timeout));
        let ((state, value), acked): ((i64, Value), i64) = match pipe.query_async(&mut conn).await {
            Err(e) if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) => {
                script.prepare_invoke().load_async(&mut conn).await?;
                pipe.query_async(&mut conn).await?
            }
            other => other?,
        };
        if matches!(state, 1 | 2) && acked < i64::from(self.replicas) {
            let Orphan {
                backend,
                kind,
                key,
                holder,
            } = undo;
            if let Err(error) = backend.release(kind, &key, &holder, None).await {
                tracing::warn!(%key, %error, "could not release a lock that was not replicated; it expires with its lease");
            }
            return Ok((NOT_REPLICATED, Value::Int(acked)));
        }
        Ok((state, value))
    }
}
