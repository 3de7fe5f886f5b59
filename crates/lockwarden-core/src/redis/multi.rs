//! Several locks in one script (`lua/multi_acquire.lua`): all or nothing in one round trip.
//!
//! One script may only touch keys of one node; every lock lives on the one server this
//! backend talks to. (On Redis Cluster, keys of different locks live in different slots:
//! there the locks would have to be taken key by key, which this backend does not do.)

use std::future::Future;
use std::pin::Pin;
use std::sync::LazyLock;
use std::time::Duration;

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
        let mut call = MULTI_ACQUIRE.prepare_invoke();
        for key in keys {
            call.key(key.redis_key()).key(key.fence_key());
        }
        call.arg(holder.id()).arg(millis(lease));
        let mut conn = self.conn.clone();
        let reply = async move { call.invoke_async::<Vec<Value>>(&mut conn).await };
        // If the caller goes away while the script is in flight, whatever it took is
        // released once its reply is in.
        let (backend, owned, who) = (self.clone(), keys.to_vec(), holder.clone());
        let undo = Box::new(
            move |reply: redis::RedisResult<Vec<Value>>| -> Pin<Box<dyn Future<Output = ()> + Send>> {
                Box::pin(async move {
                    if !matches!(reply.as_deref(), Ok([Value::Int(1), ..])) {
                        return;
                    }
                    for key in &owned {
                        if let Err(error) = backend.release(Kind::Plain, key, &who, None).await {
                            tracing::warn!(%key, %error, "could not release a lock whose multi-acquire was abandoned; it expires with its lease");
                        }
                    }
                })
            },
        );
        let reply = bounded(self.timeout, Undone::new(reply, undo)).await?;
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
}
