//! The read-write lock on Redis: `lua/rw_*.lua`, each run after `lua/rw_prelude.lua`,
//! over the backend's connection. See `crate::rw` for the rules they implement.

use std::sync::LazyLock;
use std::time::Duration;

use redis::{Script, ScriptInvocation, Value};

use super::{bounded, eval, evalsha, millis, released, Orphan, RedisBackend};
use crate::backend::{Kind, Released, Renewal, RwAttempt};
use crate::error::BackendError;
use crate::holder::Holder;
use crate::key::Key;
use crate::rw::{leases_key, readers_channel, writers_key};

/// A script made of the shared prelude and `lua/<file>`.
macro_rules! rw_script {
    ($file:literal) => {
        LazyLock::new(|| {
            Script::new(concat!(
                include_str!("../../../../lua/rw_prelude.lua"),
                include_str!(concat!("../../../../lua/", $file))
            ))
        })
    };
}

static READ_ACQUIRE: LazyLock<Script> = rw_script!("rw_read_acquire.lua");
static WRITE_ACQUIRE: LazyLock<Script> = rw_script!("rw_write_acquire.lua");
pub(super) static RELEASE: LazyLock<Script> = rw_script!("rw_release.lua");
pub(super) static RENEW: LazyLock<Script> = rw_script!("rw_renew.lua");
static WITHDRAW: LazyLock<Script> = rw_script!("rw_withdraw.lua");
static COUNT: LazyLock<Script> = rw_script!("rw_count.lua");

/// The four keys every rw script takes, in the prelude's order.
fn keys(key: &Key) -> [String; 4] {
    [
        key.redis_key().to_owned(),
        leases_key(key),
        key.fence_key().to_owned(),
        writers_key(key),
    ]
}

fn invoke(script: &'static Script, key: &Key) -> ScriptInvocation<'static> {
    let mut call = script.prepare_invoke();
    for k in keys(key) {
        call.key(k);
    }
    call
}

impl RedisBackend {
    pub(crate) async fn rw_attempt(
        &self,
        kind: Kind,
        key: &Key,
        holder: &Holder,
        lease: Duration,
        register: Duration,
    ) -> Result<RwAttempt, BackendError> {
        let script: &'static Script = match kind {
            Kind::Write => &WRITE_ACQUIRE,
            Kind::Read | Kind::Plain | Kind::Fair => &READ_ACQUIRE,
        };
        let mut call = evalsha(script, &keys(key));
        call.arg(holder.id()).arg(millis(lease));
        if kind == Kind::Write {
            call.arg(millis(register));
        }
        // A hold taken after the caller stopped waiting is released (see `Unclaimed`).
        let (state, value) = self
            .acquired(script, call, Orphan::new(self, kind, key, holder))
            .await?;
        let value = match value {
            Value::Int(value) => value,
            other => {
                return Err(BackendError::Protocol(format!(
                    "read-write acquire script returned {{{state}, {other:?}}}"
                )))
            }
        };
        match state {
            1 => Ok(RwAttempt::Taken {
                token: value as u64,
            }),
            2 => Ok(RwAttempt::Reentered {
                token: value as u64,
            }),
            3 => Ok(RwAttempt::Upgrade),
            0 => Ok(RwAttempt::Busy {
                ttl: Duration::from_millis(value.max(0) as u64),
            }),
            _ => Err(BackendError::Protocol(format!(
                "read-write acquire script returned {{{state}, {value}}}"
            ))),
        }
    }

    pub(super) async fn rw_release(
        &self,
        kind: Kind,
        key: &Key,
        holder: &Holder,
    ) -> Result<Released, BackendError> {
        let mut conn = self.conn.clone();
        let mut call = invoke(&RELEASE, key);
        call.arg(holder.id())
            .arg(kind.side())
            .arg(key.channel())
            .arg(readers_channel(key));
        let left: i64 = bounded(self.timeout, call.invoke_async(&mut conn)).await?;
        Ok(released(left))
    }

    pub(crate) async fn rw_withdraw(&self, key: &Key, holder: &Holder) -> Result<(), BackendError> {
        let mut conn = self.conn.clone();
        let mut call = invoke(&WITHDRAW, key);
        call.arg(holder.id()).arg(readers_channel(key));
        bounded(self.timeout, call.invoke_async::<i64>(&mut conn)).await?;
        Ok(())
    }

    pub(crate) async fn rw_hold_count(
        &self,
        kind: Kind,
        key: &Key,
        holder: &Holder,
    ) -> Result<u64, BackendError> {
        let mut conn = self.conn.clone();
        let mut call = invoke(&COUNT, key);
        call.arg(holder.id()).arg(kind.side());
        let count: i64 = bounded(self.timeout, call.invoke_async(&mut conn)).await?;
        Ok(count.max(0) as u64)
    }
}

/// Adds one release of a read or write hold to `pipe` (see `RedisBackend::release_many`).
pub(super) fn push_release(pipe: &mut redis::Pipeline, kind: Kind, key: &Key, holder: &Holder) {
    let call = eval(pipe, &RELEASE).arg(4).arg(&keys(key));
    call.arg(holder.id())
        .arg(kind.side())
        .arg(key.channel())
        .arg(readers_channel(key));
}

/// Adds one renewal of a read or write hold to `pipe` (see `RedisBackend::renew_many`).
pub(super) fn push_renew(pipe: &mut redis::Pipeline, r: &Renewal) {
    eval(pipe, &RENEW)
        .arg(4)
        .arg(&keys(&r.key))
        .arg(r.holder.id())
        .arg(r.kind.side())
        .arg(millis(r.lease));
}
