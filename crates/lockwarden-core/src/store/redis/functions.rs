//! Whether a client calls the plain take and a semaphore's acquire and release as Redis
//! functions (`FCALL`) or as scripts (`EVALSHA`), found once at connect by loading the
//! plain take.
//!
//! A function costs Redis ~4,000 instructions less a call (Redis 7 finds it by name once,
//! where it looks a script's digest up twice): a twelfth of a plain lock cycle, a tenth of
//! a waiter's attempt. Redis 7 and Valkey have functions, and the user must be allowed
//! `FUNCTION LOAD` and `FCALL` (asked of `ACL` with the permission check, which logs no
//! refusal; `permissions.rs`). Each variant of the script is a library of its own, named by the
//! script's digest (`scripts.rs`), so the clients of every version of the crate load their
//! own and none replaces another's. Redis 6.2, a server that renamed them away (the check
//! counts a command it does not know as refused), a user refused them, or a client that skips
//! the permission check gets the same text as a script. A server that later loses its functions (a restart without
//! persistence, `FUNCTION FLUSH`, a node added to a cluster) is given them again when a
//! call finds one missing, as it is given lost scripts (`commands.rs`).

use redis::{ErrorKind, RedisError, Value};

use super::commands::Commands;
use super::explain::explain;
use super::scripts;
use crate::error::BackendError;

/// Loads the plain take's function where the client's calls go (on a cluster, on every
/// master) and answers whether every one of them took it (or had it); a server that
/// refuses (no functions after all) answers no, and the client sends scripts, and so
/// does a cluster with a master out of reach. One server that does not answer fails the
/// connect, as every other command of the connect would.
pub(super) async fn load(commands: &Commands) -> Result<bool, BackendError> {
    let load = scripts::load_functions(commands.variant());
    let answers: Vec<(String, Result<(), RedisError>)> = match commands.conn.is_cluster() {
        // Every master, or scripts: a master without functions (an older one, mid-upgrade)
        // would refuse every `FCALL` of its slots. One that cannot be reached now leaves
        // the client on scripts rather than failing a connect that needs no master but
        // the ones it calls.
        true => match commands.within(commands.conn.on_every_master(load)).await {
            Ok(replies) => replies
                .into_iter()
                .map(|(node, reply)| match reply {
                    Value::ServerError(error) => (node, Err(error.into())),
                    _ => (node, Ok(())),
                })
                .collect(),
            Err(error) => {
                tracing::info!(%error,
                    "scripts go as EVALSHA: not every master could be asked to load a function");
                return Ok(false);
            }
        },
        false => {
            let mut conn = commands.conn.clone();
            let sent = tokio::time::timeout(commands.timeout, load.query_async::<Value>(&mut conn));
            match sent.await {
                Ok(Err(error)) if matches!(error.kind(), ErrorKind::Server(_)) => {
                    vec![(String::new(), Err(error))]
                }
                Ok(answer) => vec![(String::new(), answer.map(drop))],
                Err(_) => return Err(BackendError::TimedOut(commands.timeout)),
            }
        }
    };
    for (node, answer) in answers {
        let error = match answer {
            Ok(()) => continue,
            Err(error) if scripts::is_loaded_already(&error) => continue,
            Err(error) if matches!(error.kind(), ErrorKind::Server(_)) => error,
            // Not an answer of the server's: the connection failed.
            Err(error) => return Err(explain(error)),
        };
        tracing::info!(%node, %error,
            "the plain take goes by digest (EVALSHA): the server did not load its function");
        return Ok(false);
    }
    Ok(true)
}
