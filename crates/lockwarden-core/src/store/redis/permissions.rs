//! The check at connect that the user may run every command lockwarden needs. Without it
//! a missing permission shows only when a script reaches the command, and a script that
//! fails in the middle keeps what it already wrote: an acquire refused its `PEXPIRE`
//! leaves a lock that never expires.
//!
//! Each command is checked as Redis would check it, with well-formed arguments naming a
//! key and a channel of the client's key space (Redis must be given real arguments: it
//! reads a command's keys at their positions). The names the application will lock are
//! not known yet; a user limited to some of them (narrower than the namespace) cannot be
//! checked this way and is let through with a warning.

use super::commands::Commands;
use super::explain;
use super::notices::Notices;
use super::scripts;
use crate::error::BackendError;
use crate::key::Key;

/// The name whose key and channel the check uses.
pub(crate) const PROBE: &str = "lockwarden-permission-check";

/// Every command the store sends or its scripts call, with well-formed arguments (`K` the
/// key, `C` the channel), named as `ACL SETUSER` names it; the ACL line of
/// `guide/connecting.md` lists the same. `EVALSHA` is not listed: the check itself runs as one.
const NEEDED: &[(&str, &str)] = &[
    ("script|load", "script load x"),
    ("subscribe", "subscribe C"),
    ("unsubscribe", "unsubscribe C"),
    ("publish", "publish C x"),
    ("time", "time"),
    ("exists", "exists K"),
    ("get", "get K"),
    ("incr", "incr K"),
    ("incrby", "incrby K 1"),
    ("set", "set K x"),
    ("del", "del K"),
    ("pexpire", "pexpire K 1"),
    ("pexpireat", "pexpireat K 1"),
    ("pttl", "pttl K"),
    ("hget", "hget K x"),
    ("hmget", "hmget K x"),
    ("hset", "hset K x 1"),
    ("hexists", "hexists K x"),
    ("hincrby", "hincrby K x 1"),
    ("hdel", "hdel K x"),
    ("llen", "llen K"),
    ("lindex", "lindex K 0"),
    ("lpop", "lpop K"),
    ("lpos", "lpos K x"),
    ("lrem", "lrem K 0 x"),
    ("rpush", "rpush K x"),
    ("zadd", "zadd K 1 x"),
    ("zrem", "zrem K x"),
    ("zcard", "zcard K"),
    ("zcount", "zcount K 0 1"),
    ("zscore", "zscore K x"),
    ("zrange", "zrange K 0 1"),
    ("zrangebyscore", "zrangebyscore K 0 1"),
    ("zremrangebyscore", "zremrangebyscore K 0 1"),
    ("zremrangebyrank", "zremrangebyrank K -1 0"),
    ("copy", "copy K K"),
    ("type", "type K"),
];

/// With `wait_for_replicas`.
const WAIT: (&str, &str) = ("wait", "wait 0 0");

/// Not needed, but asked with the rest: may the plain take go as a Redis function
/// (`functions.rs`)? Asking `ACL` rather than trying logs no refusal for a user without
/// them.
const FUNCTIONS: [(&str, &str); 2] = [
    ("function|load", "function load x"),
    ("fcall", "fcall f 1 K"),
];

/// What the user may do beyond what lockwarden needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Permitted {
    /// Load and call Redis functions (only Redis 7 and later can tell).
    pub(super) functions: bool,
}

/// With sharded notices (a cluster), in place of `subscribe`, `unsubscribe`, `publish`.
const SHARDED: [(&str, &str); 3] = [
    ("ssubscribe", "ssubscribe C"),
    ("sunsubscribe", "sunsubscribe C"),
    ("spublish", "spublish C x"),
];

/// Fails with [`BackendError::NotPermitted`] naming every command of [`NEEDED`] (and
/// `WAIT` when acquisitions wait for replicas) the user may not run on `probe`'s key and
/// channel; else answers what more it may do ([`FUNCTIONS`]). Passes unchecked (and
/// permits nothing more) on a Redis before 7.0, which cannot tell, and for a user that
/// may not access `probe`'s key.
pub(super) async fn check(
    commands: &Commands,
    probe: &Key,
    wait: bool,
) -> Result<Permitted, BackendError> {
    const NOTHING_MORE: Permitted = Permitted { functions: false };
    let mut needed = NEEDED.to_vec();
    if commands.notices == Notices::Sharded {
        needed.splice(1..4, SHARDED);
    }
    if wait {
        needed.push(WAIT);
    }
    let asked: Vec<&str> = needed
        .iter()
        .chain(&FUNCTIONS)
        .map(|&(_, line)| line)
        .collect();
    let call = scripts::permissions(
        probe.fence_key(),
        probe.channel(),
        &asked,
        commands.variant(),
    );
    let refused: Option<Vec<usize>> = match commands.run(call).await {
        Ok(refused) => refused,
        Err(BackendError::NotPermitted { message, .. }) if explain::refuses_a_key(&message) => {
            tracing::warn!(
                key = probe.fence_key(),
                "permissions not checked: the user may not access this key of the namespace"
            );
            return Ok(NOTHING_MORE);
        }
        Err(other) => return Err(other),
    };
    let Some(refused) = refused else {
        tracing::debug!("permissions not checked: Redis has no redis.acl_check_cmd");
        return Ok(NOTHING_MORE);
    };
    // Positions from 1; those past the needed ones are the functions'.
    let (optional, refused): (Vec<usize>, Vec<usize>) =
        refused.into_iter().partition(|&at| at > needed.len());
    let permitted = Permitted {
        functions: optional.is_empty(),
    };
    if !permitted.functions {
        tracing::info!(
            "the plain take goes by digest (EVALSHA): the user may not load or call Redis \
             functions (+function|load +fcall would let it go as the cheaper FCALL)"
        );
    }
    if refused.is_empty() {
        return Ok(permitted);
    }
    let names: Vec<String> = refused
        .iter()
        .filter_map(|&at| needed.get(at.checked_sub(1)?))
        .map(|&(name, _)| name.to_ascii_uppercase())
        .collect();
    let mut message = "found at connect, before any lock was taken (a command refused inside \
                       a script cannot undo what the script wrote); grant the ACL line of lockwarden_core::guide::connecting \
                       (a command the server does not know, renamed away, counts as refused)"
        .to_owned();
    if commands.notices == Notices::Sharded {
        message.push_str(
            " (every master runs Redis 7 or later, so notices are sharded; \
             `notices(ReleaseNotices::Classic)` keeps PUBLISH and SUBSCRIBE)",
        );
    }
    Err(BackendError::NotPermitted {
        command: names.join(", "),
        message,
    })
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::NEEDED;
    use crate::store::redis::scripts;

    /// The commands named in quotes after `marker` in `text`, lower case.
    fn called<'a>(
        text: &'a str,
        marker: &'a str,
        quote: char,
    ) -> impl Iterator<Item = String> + 'a {
        text.split(marker).skip(1).filter_map(move |rest| {
            let name = rest.strip_prefix(quote)?.split(quote).next()?;
            Some(name.to_ascii_lowercase())
        })
    }

    #[test]
    fn every_command_sent_or_called_is_checked_and_nothing_else() {
        let mut used: BTreeSet<String> = scripts::sources()
            .flat_map(|text| called(text, "redis.call(", '\''))
            .collect();
        used.extend(called(include_str!("scripts.rs"), "Call::command(", '"'));
        used.extend(called(include_str!("scripts.rs"), "plain(", '"'));
        // Not from a script or a call: loading the scripts, and the pub/sub connection.
        used.extend(["script|load", "subscribe", "unsubscribe"].map(str::to_owned));
        let checked: BTreeSet<String> = NEEDED.iter().map(|(c, _)| (*c).to_owned()).collect();
        assert_eq!(used, checked);
        assert!(!scripts::sources().any(|text| text.contains("redis.pcall(")));
        // The sharded notices replace exactly the classic ones.
        let classic: Vec<&str> = NEEDED[1..4].iter().map(|(c, _)| *c).collect();
        let sharded: Vec<String> = super::SHARDED
            .iter()
            .map(|(c, _)| c[1..].to_owned())
            .collect();
        assert_eq!(classic, sharded);
    }

    #[test]
    fn each_check_runs_the_command_it_names() {
        for (name, line) in NEEDED.iter().chain([&super::WAIT]).chain(&super::FUNCTIONS) {
            let words: Vec<&str> = line.split(' ').collect();
            assert_eq!(words[..name.split('|').count()].join("|"), *name);
        }
    }
}
