//! What a Redis error means for the caller. Two kinds are worth more than redis-rs's
//! text: a TLS failure (the server's certificate not trusted, the client's refused) and
//! an ACL refusal (the user may not run a command, or not on these keys or channels),
//! which must name the refused command. Redis names it for a command sent as it is; for a
//! command a script ran, Redis 7.0 says only `The user executing the script can't run
//! this command or subcommand script: <sha>, on @user_script:<line>.`, so the command is
//! read from that line of the script. Redis 7.2 and later, and Valkey, say `ACL failure in
//! script: User <name> has no permissions to run the '<command>' command script: <sha>,
//! on @user_script:<line>.`, which names it.

use redis::{ErrorKind, RedisError, ServerErrorKind};

use super::scripts::{self, What};
use super::tls;
use crate::error::BackendError;

/// The refused command of an ACL refusal whose text does not say which command it was
/// (keys or channels outside the user's patterns), until [`naming`] names it.
const UNNAMED: &str = "a command";

/// `error` as a [`BackendError`]: [`BackendError::Tls`], [`BackendError::NotPermitted`],
/// or [`BackendError::Redis`] for everything else.
pub(crate) fn explain(error: RedisError) -> BackendError {
    if let Some(problem) = tls::failure(&error) {
        return BackendError::Tls {
            problem,
            source: error,
        };
    }
    match refusal(&error) {
        Some((command, message)) => BackendError::NotPermitted { command, message },
        None => BackendError::Redis(error),
    }
}

/// `error` of `what` (the call that failed): an ACL refusal that did not name its
/// command now names `what`.
pub(super) fn naming(error: BackendError, what: What) -> BackendError {
    match error {
        BackendError::NotPermitted { command, message } if command == UNNAMED => {
            BackendError::NotPermitted {
                command: what.to_string(),
                message,
            }
        }
        other => other,
    }
}

/// Whether `error` says a command met a key of another type (`WRONGTYPE`), as a command or
/// inside a script (Redis 7 keeps the code; 6.2 wraps it in an `ERR` naming the script).
pub(super) fn wrong_type(error: &RedisError) -> bool {
    error.code() == Some("WRONGTYPE")
        || error
            .detail()
            .is_some_and(|detail| detail.contains("WRONGTYPE"))
}

/// The refused command and Redis's text, if `error` is an ACL refusal.
fn refusal(error: &RedisError) -> Option<(String, String)> {
    // A pipeline's error carries its commands' errors (the first one counts).
    let first = error
        .clone()
        .into_server_errors()
        .and_then(|errors| errors.first().map(|(_, error)| error.clone()));
    let (code, detail) = match &first {
        Some(error) => (Some(error.code()), error.details().unwrap_or_default()),
        None => (error.code(), error.detail().unwrap_or_default()),
    };
    let text = match code {
        Some(code) => format!("{code} {detail}"),
        None => detail.to_owned(),
    };
    let in_script = in_script(detail);
    // Inside a script the refusal comes as an `ERR`: `The user executing the script
    // can't ...` (Redis 7.0), `ACL failure in script: ...` (Redis 7.2 and later, Valkey).
    let no_perm = error.kind() == ErrorKind::Server(ServerErrorKind::NoPerm)
        || detail.contains("no permissions to")
        || detail.contains("The user executing the script can't")
        || detail.contains("ACL failure in script: ");
    if !no_perm {
        return None;
    }
    // Redis 7.2 and later name the command, also inside a script: `... run the 'pexpire'
    // command`.
    let named = quoted_command(detail).map(str::to_ascii_uppercase);
    let command = match (in_script, named) {
        (Some((lua, line)), named) => match lua.line(line) {
            Some((file, at, code)) => {
                let called = named.or_else(|| called_on(code));
                let what = called.unwrap_or_else(|| "a command".to_owned());
                format!("{what} (line {at} of {file})")
            }
            None => format!("a command (line {line} of {})", lua.name()),
        },
        (None, Some(named)) => named,
        (None, None) => UNNAMED.to_owned(),
    };
    Some((command, text))
}

/// Whether the text of an ACL refusal says the user may not access a key: `... access one
/// of the keys used as arguments` (Redis 7.0), `No permissions to access a key` (Redis 7.2
/// and later, Valkey).
pub(super) fn refuses_a_key(text: &str) -> bool {
    text.contains("access one of the keys") || text.contains("access a key")
}

/// The script and line of an error raised inside one of our scripts (`... script:
/// <sha>, on @user_script:<line>.`), or inside one called as a function (`... script:
/// <function>, on @user_function:<line>.`, the line of its library). The last `script: `
/// counts: Redis 7.2 and later, and Valkey, begin the text with `ACL failure in script: `.
fn in_script(detail: &str) -> Option<(&'static scripts::Lua, usize)> {
    let (_, after) = detail.rsplit_once("script: ")?;
    let (name, rest) = after.split_once(',')?;
    let (lua, before, line) = match rest.split_once("@user_script:") {
        Some((_, line)) => (scripts::by_digest(name.trim())?, 0, line),
        None => {
            let (_, line) = rest.split_once("@user_function:")?;
            let (lua, before) = scripts::by_function(name.trim())?;
            (lua, before, line)
        }
    };
    let line: String = line.chars().take_while(char::is_ascii_digit).collect();
    let line: usize = line.parse().ok()?;
    Some((lua, line.checked_sub(before)?))
}

/// `pexpire` in `... to run the 'pexpire' command`.
fn quoted_command(detail: &str) -> Option<&str> {
    let (_, after) = detail.split_once("run the '")?;
    let (command, rest) = after.split_once('\'')?;
    rest.trim_start().starts_with("command").then_some(command)
}

/// The commands a line of Lua calls (`redis.call('HSET', ...)`), e.g. `HSET`, or
/// `EXISTS or HEXISTS` for a line with two.
fn called_on(code: &str) -> Option<String> {
    let mut commands: Vec<&str> = Vec::new();
    let mut rest = code;
    while let Some(at) = rest.find("redis.call(") {
        rest = &rest[at + "redis.call(".len()..];
        let quote = rest.chars().next()?;
        if quote != '\'' && quote != '"' {
            continue;
        }
        let name = rest[1..].split(quote).next()?;
        if !commands.contains(&name) {
            commands.push(name);
        }
    }
    (!commands.is_empty()).then(|| commands.join(" or "))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The error of the server's reply `-<code> <detail>`, parsed as redis-rs parses it.
    fn server_error(code: &str, detail: &str) -> RedisError {
        let reply = format!("-{code} {detail}\r\n");
        match redis::parse_redis_value(reply.as_bytes()) {
            Ok(redis::Value::ServerError(error)) => error.into(),
            other => panic!("{reply:?} parsed as {other:?}"),
        }
    }

    #[test]
    fn commands_are_read_from_a_line_of_lua() {
        assert_eq!(
            called_on("  redis.call('PEXPIRE', KEYS[1], ARGV[2])").as_deref(),
            Some("PEXPIRE")
        );
        assert_eq!(
            called_on("if redis.call('EXISTS', l) == 1 and redis.call('HEXISTS', l, a) == 0 then")
                .as_deref(),
            Some("EXISTS or HEXISTS")
        );
        assert_eq!(called_on("local n = 1"), None);
    }

    /// `acquire.lua`'s digest, and the line of its `PEXPIRE` in the script Redis runs
    /// (it has no prelude) and in `acquire.lua` itself.
    fn acquire_pexpire() -> (String, usize, usize) {
        let prelude = "";
        let own = include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/lua/acquire.lua"));
        let pexpire = own
            .lines()
            .position(|l| l.contains("redis.call('PEXPIRE'"))
            .expect("acquire.lua sets an expiry")
            + 1;
        let hash = scripts::named("acquire.lua").get_hash().to_owned();
        (hash, prelude.lines().count() + pexpire, pexpire)
    }

    #[test]
    fn a_refusal_inside_a_script_names_the_command_on_its_line() {
        let (hash, line, pexpire) = acquire_pexpire();
        let detail = format!(
            "The user executing the script can't run this command or subcommand script: {hash}, on @user_script:{line}.",
        );
        let (command, text) = refusal(&server_error("ERR", &detail)).expect("a refusal");
        assert_eq!(command, format!("PEXPIRE (line {pexpire} of acquire.lua)"));
        assert!(
            text.starts_with("ERR The user executing the script"),
            "{text}"
        );
    }

    #[test]
    fn a_refusal_inside_a_script_that_names_its_command_gets_its_line_too() {
        // Redis 7.2 and later, and Valkey 8 (its text, word for word), name the command.
        let (hash, line, pexpire) = acquire_pexpire();
        let detail = format!(
            "ACL failure in script: User no-pexpire has no permissions to run the 'pexpire' \
             command script: {hash}, on @user_script:{line}.",
        );
        let (command, text) = refusal(&server_error("ERR", &detail)).expect("a refusal");
        assert_eq!(command, format!("PEXPIRE (line {pexpire} of acquire.lua)"));
        assert!(
            text.starts_with("ERR ACL failure in script: User"),
            "{text}"
        );
    }

    #[test]
    fn a_refusal_inside_a_function_names_the_command_on_its_scripts_line() {
        // Redis 7.0 names the function and the line of its library, two lines before
        // the script's own (the library's name, the function's registration).
        let (hash, line, pexpire) = acquire_pexpire();
        let detail = format!(
            "The user executing the script can't run this command or subcommand script: \
             lockwarden_{hash}, on @user_function:{}.",
            line + 2
        );
        let (command, _) = refusal(&server_error("ERR", &detail)).expect("a refusal");
        assert_eq!(command, format!("PEXPIRE (line {pexpire} of acquire.lua)"));
    }

    #[test]
    fn a_key_refusal_is_told_in_each_servers_words() {
        for text in [
            "NOPERM this user has no permissions to access one of the keys used as arguments",
            "NOPERM No permissions to access a key",
        ] {
            assert!(refuses_a_key(text), "{text}");
        }
        for text in [
            "NOPERM this user has no permissions to access one of the channels used as arguments",
            "NOPERM No permissions to access a channel",
            "NOPERM User keymaster has no permissions to run the 'evalsha' command",
            "NOPERM User key has no permissions to run the 'get' command",
        ] {
            assert!(!refuses_a_key(text), "{text}");
        }
        // A key refused to a command inside a script (Redis 7.2 and later, Valkey) is an
        // ACL refusal too, of a command on a line of that script.
        let (hash, line, pexpire) = acquire_pexpire();
        let detail = format!(
            "ACL failure in script: No permissions to access a key script: {hash}, on \
             @user_script:{line}.",
        );
        let (command, text) = refusal(&server_error("ERR", &detail)).expect("a refusal");
        assert_eq!(command, format!("PEXPIRE (line {pexpire} of acquire.lua)"));
        assert!(refuses_a_key(&text), "{text}");
    }

    #[test]
    fn a_read_write_script_line_is_counted_past_the_prelude() {
        let acquire = scripts::named("rw_write_acquire.lua");
        let prelude = [
            include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/lua/clock.lua")),
            include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/lua/once.lua")),
            include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/lua/token.lua")),
            include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/lua/rw_prelude.lua")),
        ]
        .concat();
        let own = include_str!(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/lua/rw_write_acquire.lua"
        ));
        let hmget = own
            .lines()
            .position(|l| l.contains("redis.call('HMGET'"))
            .expect("rw_write_acquire.lua reads the hold")
            + 1;
        let line = prelude.lines().count() + hmget;
        let detail = format!(
            "The user executing the script can't run this command or subcommand script: {}, on @user_script:{line}.",
            acquire.get_hash()
        );
        let (command, _) = refusal(&server_error("ERR", &detail)).expect("a refusal");
        assert_eq!(
            command,
            format!("HMGET (line {hmget} of rw_write_acquire.lua)")
        );
    }

    #[test]
    fn a_refused_command_keeps_its_name_and_keys_get_the_call_named() {
        let (command, text) = refusal(&server_error(
            "NOPERM",
            "this user has no permissions to run the 'evalsha' command",
        ))
        .expect("a refusal");
        assert_eq!(command, "EVALSHA");
        assert_eq!(
            text,
            "NOPERM this user has no permissions to run the 'evalsha' command"
        );

        for detail in [
            "this user has no permissions to access one of the keys used as arguments",
            "No permissions to access a key",
        ] {
            let keys = explain(server_error("NOPERM", detail));
            let named = naming(keys, What::Script("acquire.lua"));
            let text = named.to_string();
            assert!(text.contains("refused EVALSHA (of acquire.lua)"), "{text}");
            assert!(text.contains(detail), "{text}");
        }
    }

    #[test]
    fn other_errors_stay_redis_errors() {
        let error = explain(server_error("WRONGTYPE", "Operation against a key"));
        assert!(matches!(error, BackendError::Redis(_)), "{error:?}");
    }
}
