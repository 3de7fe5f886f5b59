//! How release notices travel. On one server (or a Sentinel's primary) `PUBLISH` reaches
//! the subscribers of that server. On a cluster a classic `PUBLISH` is relayed to every
//! node, so each release costs every node some work; a sharded `SPUBLISH` (Redis ≥ 7)
//! stays on the shard that owns the channel's slot, and every channel of a lock carries
//! the lock's hash tag.
//!
//! Every client of one lock must send and listen the same way, so a cluster client
//! decides from facts every client sees alike: each master's version, as `HELLO` tells
//! it to any user (it needs no ACL permission). Sharded when every master runs Redis ≥ 7,
//! classic otherwise, unless the builder pinned one. Valkey answers `HELLO` with its own
//! version (`server` `valkey`, `version` `8.1.8`; only `INFO` keeps the Redis 7.2.4 it
//! forked from), and every Valkey release has sharded pub/sub, so the same rule holds.

use redis::Value;

use crate::error::BackendError;

/// The first Redis major version with sharded pub/sub.
const SHARDED_SINCE: u32 = 7;

/// How release notices travel: `PUBLISH`/`SUBSCRIBE`, or `SPUBLISH`/`SSUBSCRIBE`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Notices {
    Classic,
    Sharded,
}

/// How a client on a Redis Cluster sends and hears release notices (set with
/// [`LockClientBuilder::notices`](crate::LockClientBuilder::notices)). One server,
/// Sentinel and the in-process store have one way only and ignore it.
///
/// Every client of one lock must send and listen the same way: a waiter that hears
/// nothing waits until the holder's lease ends.
///
/// ```
/// use lockwarden_core::{LockClient, ReleaseNotices};
/// let builder = LockClient::builder().notices(ReleaseNotices::Classic);
/// # let _ = builder;
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum ReleaseNotices {
    /// Sharded (`SPUBLISH`, `SSUBSCRIBE`: each notice stays on the shard that owns the
    /// lock's slot) when every master runs Redis 7.0 or later, classic otherwise. Each
    /// master's version is asked at connect with `HELLO`, which any user may send.
    #[default]
    Auto,
    /// Classic `PUBLISH` and `SUBSCRIBE` (every notice is relayed to every node), even
    /// where every master has sharded pub/sub: for clients of the same locks that listen
    /// classically (Redisson clients configured so).
    Classic,
    /// Sharded, and connecting fails instead of falling back when a master is older than
    /// Redis 7.0. The user needs `+spublish +ssubscribe +sunsubscribe`.
    Sharded,
}

impl Notices {
    /// The notices of a cluster client that `asked` for them, given each master's reply
    /// to a bare `HELLO` (its address, then the reply or the error it answered).
    pub(super) fn on_cluster(
        asked: ReleaseNotices,
        hello: &[(String, Value)],
    ) -> Result<Self, BackendError> {
        let lacking = hello
            .iter()
            .find(|(_, reply)| major_version(reply).is_none_or(|major| major < SHARDED_SINCE));
        match (asked, lacking) {
            (ReleaseNotices::Classic, _) => Ok(Notices::Classic),
            (ReleaseNotices::Auto, None) | (ReleaseNotices::Sharded, None) => Ok(Notices::Sharded),
            (ReleaseNotices::Auto, Some((node, _))) => {
                tracing::info!(
                    node,
                    "classic release notices: this master has no sharded pub/sub"
                );
                Ok(Notices::Classic)
            }
            (ReleaseNotices::Sharded, Some((node, reply))) => Err(BackendError::config(
                "sharded notices need Redis 7 or later on every master",
                format!("{node} answered HELLO with {reply:?}"),
            )),
        }
    }
}

/// The major version a server gave in its reply to `HELLO`: a map (RESP3) or a flat list
/// of names and values (RESP2). `None` for an error (Redis before 6.2 refuses a bare
/// `HELLO`) or a reply without a version.
fn major_version(hello: &Value) -> Option<u32> {
    let text = |value: &Value| match value {
        Value::BulkString(bytes) => std::str::from_utf8(bytes).ok().map(str::to_owned),
        Value::SimpleString(text) => Some(text.clone()),
        _ => None,
    };
    let version = match hello {
        Value::Map(pairs) => pairs
            .iter()
            .find(|(name, _)| text(name).as_deref() == Some("version"))
            .and_then(|(_, version)| text(version)),
        Value::Array(items) => items
            .chunks_exact(2)
            .find(|pair| text(&pair[0]).as_deref() == Some("version"))
            .and_then(|pair| text(&pair[1])),
        _ => None,
    }?;
    version.split('.').next()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use redis::Value;

    use super::{Notices, ReleaseNotices};

    fn bulk(text: &str) -> Value {
        Value::BulkString(text.as_bytes().to_vec())
    }

    /// A RESP2 `HELLO` reply from a Redis server of `version`.
    fn hello(version: &str) -> Value {
        hello_from("redis", version)
    }

    /// A RESP2 `HELLO` reply from `server` (`redis` or `valkey`) of `version`.
    fn hello_from(server: &str, version: &str) -> Value {
        Value::Array(vec![
            bulk("server"),
            bulk(server),
            bulk("version"),
            bulk(version),
            bulk("proto"),
            Value::Int(2),
        ])
    }

    fn masters(replies: Vec<Value>) -> Vec<(String, Value)> {
        replies
            .into_iter()
            .enumerate()
            .map(|(at, reply)| (format!("127.0.0.1:{}", 7000 + at), reply))
            .collect()
    }

    #[test]
    fn sharded_only_when_every_master_runs_redis_7_or_later() {
        let new = masters(vec![hello("7.0.15"), hello("7.2.4"), hello("8.0.0")]);
        let resp3 = masters(vec![Value::Map(vec![(bulk("version"), bulk("7.4.1"))])]);
        // Redis 6.0 refuses a bare HELLO; Redis 6.2 answers it.
        let refused =
            redis::parse_redis_value(b"-ERR Protocol version is not an integer\r\n").unwrap();
        assert!(matches!(refused, Value::ServerError(_)), "{refused:?}");
        let mixed = masters(vec![hello("7.0.15"), hello("6.2.14")]);
        let old = masters(vec![hello("7.0.15"), refused]);
        let unreadable = masters(vec![hello("seven"), Value::Array(vec![bulk("version")])]);
        // Valkey names itself and its own version (8.1.8 here, not the 7.2.4 of `INFO`'s
        // `redis_version`); a cluster may mix it with Redis during a migration.
        let valkey = masters(vec![hello_from("valkey", "8.1.8"), hello("7.0.15")]);

        for (replies, either) in [
            (&new, Notices::Sharded),
            (&valkey, Notices::Sharded),
            (&resp3, Notices::Sharded),
            (&mixed, Notices::Classic),
            (&old, Notices::Classic),
            (&unreadable, Notices::Classic),
        ] {
            assert_eq!(
                Notices::on_cluster(ReleaseNotices::Auto, replies).unwrap(),
                either
            );
            assert_eq!(
                Notices::on_cluster(ReleaseNotices::Classic, replies).unwrap(),
                Notices::Classic
            );
            match Notices::on_cluster(ReleaseNotices::Sharded, replies) {
                Ok(notices) => assert_eq!(notices, either, "{replies:?}"),
                Err(error) => {
                    assert_eq!(either, Notices::Classic, "{error}");
                    let text = error.to_string();
                    assert!(
                        text.contains("Redis 7") && text.contains("127.0.0.1:700"),
                        "{text}"
                    );
                }
            }
        }
    }
}
