//! The Lua scripts (top-level `lua/`, shipped inside this crate through the `lua` link)
//! and the one place that knows each script's keys and arguments: every operation of the
//! store contract becomes a [`Call`] here, and every script reply is read here.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::LazyLock;
use std::time::Duration;

use redis::{Cmd, FromRedisValue, ParsingError, Script, Value};

use super::notices::Notices;
use crate::error::BackendError;
use crate::hold::{Exclusive, Hold, HoldKind};
use crate::holder::Holder;
use crate::key::Key;
use crate::store::contract::{
    Acquire, Attempt, How, Outcome, PermitsAsked, PermitsState, Reentries, Released, Renewal,
    Waiter,
};

/// A script of `lua/`, compiled into the crate, with its source files (to say which of
/// its commands Redis refused, by line).
pub(super) struct Lua {
    /// The files it is made of, in order, with their text.
    parts: &'static [(&'static str, &'static str)],
    /// As written: what one server and Sentinel run.
    script: Compiled,
    /// For a cluster, if it counts (after `lua/once.lua`): the call's id read from the last
    /// argument.
    clustered: Option<Compiled>,
    /// For a cluster with sharded notices (`SPUBLISH`), if it publishes any.
    sharded: Option<Compiled>,
}

/// One variant of a script: its digest (in `Script`), and its text, to load it into a
/// server that has lost it.
struct Compiled {
    script: Script,
    source: Box<str>,
}

impl Compiled {
    fn new(source: &str) -> Self {
        Self {
            script: Script::new(source),
            source: source.into(),
        }
    }
}

/// Which variant of every script a connection sends (see [`Lua::with`]). Each call is
/// built for it, digest included: rewriting a built `EVALSHA` for another variant cost a
/// cluster ~1,450 client instructions a call.
#[derive(Debug, Clone, Copy)]
pub(super) struct Variant {
    /// How the scripts publish release notices.
    pub(super) notices: Notices,
    /// Whether the connection is a cluster's, which may send a call twice.
    pub(super) cluster: bool,
}

/// `lua/once.lua`'s line that reads no call id, as written for one server...
const NO_ID: &str = "\nlocal call = ''\n";
/// ...and as a cluster's variant has it, where a call may be sent twice.
const ID: &str = "\nlocal call = ARGV[#ARGV]\n";

impl Lua {
    fn new(parts: &'static [(&'static str, &'static str)], source: &str) -> Self {
        const CLASSIC: &str = "redis.call('PUBLISH'";
        let clustered = source.contains(NO_ID).then(|| source.replace(NO_ID, ID));
        let cluster_source = clustered.as_deref().unwrap_or(source);
        Lua {
            parts,
            script: Compiled::new(source),
            sharded: cluster_source
                .contains(CLASSIC)
                .then(|| Compiled::new(&cluster_source.replace(CLASSIC, "redis.call('SPUBLISH'"))),
            clustered: clustered.map(|source| Compiled::new(&source)),
        }
    }

    /// The script as sent over a connection of `variant`. The variants differ within
    /// lines, never in their number, so an error's line reads the same in each (see
    /// [`Lua::line`]).
    pub(super) fn with(&self, variant: Variant) -> &Script {
        &self.compiled(variant).script
    }

    /// `SCRIPT LOAD` of the script as sent over a connection of `variant`.
    pub(super) fn load(&self, variant: Variant) -> Cmd {
        let mut load = redis::cmd("SCRIPT");
        load.arg("LOAD").arg(&*self.compiled(variant).source);
        load
    }

    fn compiled(&self, variant: Variant) -> &Compiled {
        if !variant.cluster {
            return &self.script;
        }
        let classic = self.clustered.as_ref().unwrap_or(&self.script);
        match variant.notices {
            Notices::Sharded => self.sharded.as_ref().unwrap_or(classic),
            Notices::Classic => classic,
        }
    }

    /// The same script with `from` written as `to` in its text (a line that picks a
    /// behaviour, as [`NO_ID`] does): a script of its own, with its own variants.
    fn replaced(&self, from: &str, to: &str) -> Self {
        let source: String = self.parts.iter().map(|&(_, text)| text).collect();
        debug_assert!(source.contains(from), "{} has no `{from}`", self.name());
        Lua::new(self.parts, &source.replace(from, to))
    }

    /// Every variant.
    fn variants(&self) -> impl Iterator<Item = &Script> {
        std::iter::once(&self.script)
            .chain(self.clustered.as_ref())
            .chain(self.sharded.as_ref())
            .map(|compiled| &compiled.script)
    }

    /// The file that makes it what it is (the last one: the read-write scripts run after
    /// `rw_prelude.lua`).
    pub(super) fn name(&self) -> &'static str {
        self.parts[self.parts.len() - 1].0
    }

    /// The file and the text of line `line` (1-based) of the script as Redis runs it
    /// (its files one after the other), with the line's number in that file.
    pub(super) fn line(&self, line: usize) -> Option<(&'static str, usize, &'static str)> {
        let mut before = 0;
        for &(file, text) in self.parts {
            let lines = text.lines().count();
            if line > before && line <= before + lines {
                let at = line - before;
                return Some((file, at, text.lines().nth(at - 1)?));
            }
            before += lines;
        }
        None
    }
}

impl std::ops::Deref for Lua {
    type Target = Script;

    fn deref(&self) -> &Script {
        &self.script.script
    }
}

/// A script made of files of `lua/` (each ending with a newline, so lines add up).
/// `fair: f` and `rw: f` put a fair or read-write script after the clock, the count-once
/// helpers, the token maker and its kind's prelude (layout, pruning; the fair one also the
/// handoff); `permits: f` a semaphore's after the clock, the token maker and its prelude
/// (its holders are made for each acquisition, so it needs no count-once helpers).
macro_rules! script {
    (permits: $file:literal) => {
        script!("clock.lua", "token.lua", "permits_prelude.lua", $file)
    };
    (fair: $file:literal) => {
        script!("clock.lua", "once.lua", "token.lua", "fair_prelude.lua", $file)
    };
    (rw: $file:literal) => {
        script!("clock.lua", "once.lua", "token.lua", "rw_prelude.lua", $file)
    };
    ($($file:literal),+) => {
        LazyLock::new(|| {
            const PARTS: &[(&str, &str)] = &[$((
                $file,
                include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/lua/", $file)),
            )),+];
            Lua::new(
                PARTS,
                concat!($(include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/lua/", $file))),+),
            )
        })
    };
}

static ACQUIRE: LazyLock<Lua> = script!("once.lua", "token.lua", "acquire.lua");
/// `acquire.lua` for a client built without fencing tokens: no clock read, no fencing key.
static ACQUIRE_UNFENCED: LazyLock<Lua> =
    LazyLock::new(|| ACQUIRE.replaced("\nlocal fenced = true\n", "\nlocal fenced = false\n"));
static RENEW: LazyLock<Lua> = script!("renew.lua");
static RELEASE: LazyLock<Lua> = script!("once.lua", "release.lua");
static FORCE_RELEASE: LazyLock<Lua> = script!("force_release.lua");
static MULTI_ACQUIRE: LazyLock<Lua> = script!("once.lua", "token.lua", "multi_acquire.lua");
static FAIR_ACQUIRE: LazyLock<Lua> = script!(fair: "fair_acquire.lua");
static FAIR_RELEASE: LazyLock<Lua> = script!(fair: "fair_release.lua");
static FAIR_LEAVE: LazyLock<Lua> = script!(fair: "fair_leave.lua");
static READ_ACQUIRE: LazyLock<Lua> = script!(rw: "rw_read_acquire.lua");
static WRITE_ACQUIRE: LazyLock<Lua> = script!(rw: "rw_write_acquire.lua");
static RW_RELEASE: LazyLock<Lua> = script!(rw: "rw_release.lua");
static RW_RENEW: LazyLock<Lua> = script!(rw: "rw_renew.lua");
static RW_WITHDRAW: LazyLock<Lua> = script!(rw: "rw_withdraw.lua");
static RW_COUNT: LazyLock<Lua> = script!(rw: "rw_count.lua");
static PERMITS_ACQUIRE: LazyLock<Lua> = script!(permits: "permits_acquire.lua");
static PERMITS_RELEASE: LazyLock<Lua> = script!(permits: "permits_release.lua");
static PERMITS_RENEW: LazyLock<Lua> = script!(permits: "permits_renew.lua");
static PERMITS_WITHDRAW: LazyLock<Lua> = script!(permits: "permits_withdraw.lua");
static PERMITS_CAPACITY: LazyLock<Lua> = script!(permits: "permits_capacity.lua");
static PERMITS_STATE: LazyLock<Lua> = script!(permits: "permits_state.lua");
static FENCED_WRITE: LazyLock<Lua> = script!("fenced_write.lua");
/// A rate decision (built and read in `rate.rs`).
pub(super) static RATE_LIMIT: LazyLock<Lua> = script!("rate_limit.lua");
// Not a lock operation: the connect-time check of the user's permissions.
static PERMISSIONS: LazyLock<Lua> = script!("permissions.lua");

/// The synthetic acquire state of a lock taken but not acknowledged by enough replicas
/// (and released again); its value is the number that acknowledged.
pub(super) const NOT_REPLICATED: i64 = 4;

/// One command for Redis: a script's `EVALSHA` (with the script, to load it if Redis lost
/// it, e.g. after a restart) or a plain command.
pub(super) struct Call {
    pub(super) script: Option<&'static Lua>,
    /// For a call that changes a hold's count: whether its holder was made for the
    /// acquisition (see [`Call::sent`]).
    counted: Option<bool>,
    /// Whether a second run would answer as the first did, so that it may be sent again
    /// when its connection broke (see [`Call::resendable`]).
    pub(super) resend: bool,
    /// The holder whose counting calls take turns, on a cluster (see `turns.rs`): set for
    /// one that was not made for its acquisition, cleared by [`Call::sent`] elsewhere.
    pub(super) turn: Option<Holder>,
    pub(super) cmd: Cmd,
    /// A command sent right after it, in the same pipeline, whose reply is not read: the
    /// notice of a release without a script.
    pub(super) then: Option<Cmd>,
    /// What it is, for errors: the script's file or the command's name.
    pub(super) what: What,
}

/// What a [`Call`] sends, for errors that must name it.
#[derive(Debug, Clone, Copy)]
pub(super) enum What {
    Script(&'static str),
    Command(&'static str),
}

impl std::fmt::Display for What {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            What::Script(file) => write!(f, "EVALSHA (of {file})"),
            What::Command(name) => f.write_str(name),
        }
    }
}

impl Call {
    pub(super) fn script(script: &'static LazyLock<Lua>, variant: Variant, keys: &[&str]) -> Self {
        let lua: &'static Lua = script;
        let mut cmd = evalsha(keys.len(), keys.iter().map(|k| k.len()).sum());
        cmd.arg(lua.with(variant).get_hash())
            .arg(keys.len())
            .arg(keys);
        Self {
            script: Some(lua),
            counted: None,
            resend: false,
            turn: None,
            cmd,
            then: None,
            what: What::Script(lua.name()),
        }
    }

    fn command(name: &'static str, key: &str) -> Self {
        /// After the key: at most a holder id and its `:op` field (`release_alone`).
        const MORE_ARGS: usize = 2;
        const MORE_BYTES: usize = 128;
        let mut cmd = with_room(name, 1 + MORE_ARGS, key.len() + MORE_BYTES);
        cmd.arg(key);
        Self {
            script: None,
            counted: None,
            resend: false,
            turn: None,
            cmd,
            then: None,
            what: What::Command(name),
        }
    }

    pub(super) fn arg(mut self, arg: impl redis::ToRedisArgs) -> Self {
        self.cmd.arg(arg);
        self
    }

    /// Marks a call that changes `holder`'s count in a hold (on a cluster its script takes
    /// the call's id last, and, unless the holder was made for the acquisition, it waits
    /// for the holder's other counting calls: see `turns.rs`).
    fn counted(self, fresh: bool, holder: &Holder) -> Self {
        Self {
            counted: Some(fresh),
            turn: (!fresh).then(|| holder.clone()),
            ..self
        }
    }

    /// Marks a call that may be sent again after its connection broke, if `safe`: one
    /// whose second run answers as its first did. An acquire by a holder made for it is
    /// (the scripts answer "taken", counted once, when that holder holds the lock
    /// already), and so is the release of a hold nobody can have re-entered, carrying its
    /// fencing token (a second run finds the hold gone and the token still the lock's
    /// last: "ended"). A release that may count down a re-entry is not, on one server:
    /// there no call id tells its second run from another release (`lua/once.lua`).
    pub(super) fn resendable(self, safe: bool) -> Self {
        Self {
            resend: safe,
            ..self
        }
    }

    /// This call as sent over a connection that may send a call twice (`resent`: a
    /// cluster's). There a counting call gets its id (`lua/once.lua`), unique in this
    /// process like the holders it is kept for, or `''` for a holder made for its
    /// acquisition (the scripts tell that apart without one); elsewhere none. The script's
    /// variant was chosen when the call was built. A cluster's client sends a call again
    /// by itself, so `Commands` does not ([`resend`](Self::resend) is cleared).
    pub(super) fn sent(mut self, resent: bool) -> Self {
        static LAST: AtomicU64 = AtomicU64::new(0);
        self.resend &= !resent;
        if !resent {
            self.turn = None;
        }
        if let (Some(fresh), true) = (self.counted.take(), resent) {
            match fresh {
                true => self.cmd.arg(""),
                false => self.cmd.arg(LAST.fetch_add(1, Ordering::Relaxed) + 1),
            };
        }
        self
    }
}

/// An `EVALSHA` command with room for `args` more arguments of `bytes` in all and the
/// script's own (digest, key count, a handful of `ARGV`).
fn evalsha(args: usize, bytes: usize) -> Cmd {
    /// A digest and a key count, and the `ARGV` of the longest scripts.
    const OWN_ARGS: usize = 12;
    /// The 40-byte digest, and `ARGV` such as holder ids and channel names.
    const OWN_BYTES: usize = 256;
    with_room("EVALSHA", args + OWN_ARGS, bytes + OWN_BYTES)
}

/// The command `name` with room for `args` more arguments of `bytes` in all, so building
/// it allocates once: growing from empty reallocated at almost every argument (about
/// 5,000 client instructions a lock cycle in the scripts, 2,200 in a release's `HDEL` and
/// notice; callgrind).
fn with_room(name: &'static str, args: usize, bytes: usize) -> Cmd {
    let mut cmd = Cmd::with_capacity(1 + args, name.len() + bytes);
    cmd.arg(name);
    cmd
}

/// `SCRIPT LOAD` of every script a pipeline may send with `notices` over a connection
/// that is a cluster's or not, to load them all when Redis lost them.
pub(super) fn load_all(variant: Variant) -> [Cmd; 23] {
    every().map(|lua| lua.load(variant))
}

/// The script whose SHA1 digest is `sha` (as Redis names it in errors), any variant.
pub(super) fn by_digest(sha: &str) -> Option<&'static Lua> {
    every()
        .into_iter()
        .find(|lua| lua.variants().any(|script| script.get_hash() == sha))
}

/// The text of every file of every lock script, for tests.
#[cfg(test)]
pub(super) fn sources() -> impl Iterator<Item = &'static str> {
    every()
        .into_iter()
        .flat_map(|lua| lua.parts.iter().map(|&(_, text)| text))
}

/// The script `file` (the last of its files), for tests.
#[cfg(test)]
pub(super) fn named(file: &str) -> &'static Lua {
    every()
        .into_iter()
        .find(|lua| lua.name() == file)
        .unwrap_or_else(|| panic!("no script {file}"))
}

fn every() -> [&'static Lua; 23] {
    [
        &ACQUIRE,
        &ACQUIRE_UNFENCED,
        &RENEW,
        &RELEASE,
        &FORCE_RELEASE,
        &MULTI_ACQUIRE,
        &FAIR_ACQUIRE,
        &FAIR_RELEASE,
        &FAIR_LEAVE,
        &READ_ACQUIRE,
        &WRITE_ACQUIRE,
        &RW_RELEASE,
        &RW_RENEW,
        &RW_WITHDRAW,
        &RW_COUNT,
        &PERMITS_ACQUIRE,
        &PERMITS_RELEASE,
        &PERMITS_RENEW,
        &PERMITS_WITHDRAW,
        &PERMITS_CAPACITY,
        &PERMITS_STATE,
        &FENCED_WRITE,
        &RATE_LIMIT,
    ]
    .map(|lua| -> &'static Lua { lua })
}

/// The five keys of every read-write script, in the prelude's order.
fn rw_keys(key: &Key) -> [&str; 5] {
    let names = key.names();
    [
        key.redis_key(),
        &names.leases,
        key.fence_key(),
        &names.writers,
        &names.waiting_readers,
    ]
}

/// The five keys of every semaphore script, in the prelude's order.
fn permits_keys(key: &Key) -> [&str; 5] {
    let names = key.names();
    [
        key.redis_key(),
        &names.leases,
        key.fence_key(),
        &names.waiting,
        &names.waiting_until,
    ]
}

/// The four keys of every fair script, in the prelude's order.
fn fair_keys(key: &Key) -> [&str; 4] {
    [
        key.redis_key(),
        key.fence_key(),
        &key.names().queue,
        &key.names().deadlines,
    ]
}

/// One acquire attempt (its reply is an [`Answer`], see [`attempted`]).
pub(super) fn acquire(ask: &Acquire<'_>, variant: Variant) -> Call {
    let (key, how) = (ask.key, ask.how);
    if let How::Permits(asked) = how {
        return acquire_permits(ask, asked, variant);
    }
    let (lock, fence) = (key.redis_key(), key.fence_key());
    let plain = match ask.fenced {
        true => &ACQUIRE,
        false => &ACQUIRE_UNFENCED,
    };
    let call = match how {
        How::Plain => Call::script(plain, variant, &[lock, fence]),
        How::Claim => Call::script(plain, variant, &[lock, fence, &key.names().outcome]),
        How::Fair { .. } => Call::script(&FAIR_ACQUIRE, variant, &fair_keys(key)),
        How::Read { .. } => Call::script(&READ_ACQUIRE, variant, &rw_keys(key)),
        How::Write { .. } => Call::script(&WRITE_ACQUIRE, variant, &rw_keys(key)),
        How::Permits(asked) => return acquire_permits(ask, asked, variant),
    };
    let call = call.arg(ask.holder.id()).arg(millis(ask.lease));
    let call = match how {
        How::Fair {
            queue_timeout,
            join,
            queued,
        } => call
            .arg(millis(queue_timeout))
            .arg(&*key.names().wake_prefix)
            .arg(if join { "1" } else { "0" })
            .arg(if queued { "1" } else { "0" }),
        How::Write { register } => call.arg(registration(register)),
        How::Plain | How::Claim | How::Read { .. } | How::Permits(_) => call,
    };
    let call = call.arg(flag(ask.fresh));
    match how {
        How::Read {
            register,
            registered,
        } => call.arg(registration(register)).arg(flag(registered)),
        _ => call,
    }
    .counted(ask.fresh, ask.holder)
    .resendable(ask.fresh)
}

/// Permits of a semaphore. Its holder is always made for the acquisition, which the
/// script relies on (holding already: this call ran before, or a release granted it), so
/// the call needs no id on a cluster.
fn acquire_permits(ask: &Acquire<'_>, asked: PermitsAsked, variant: Variant) -> Call {
    let key = ask.key;
    Call::script(&PERMITS_ACQUIRE, variant, &permits_keys(key))
        .arg(ask.holder.id())
        .arg(millis(ask.lease))
        .arg(asked.permits)
        .arg(asked.capacity)
        .arg(flag(asked.fifo))
        .arg(registration(asked.register))
        .arg(&*key.names().granted)
        .resendable(true)
}

/// How long a waiter's registration lasts, in ms: `0` for a single try, which never
/// registers (`millis` would make it 1 ms).
fn registration(d: Duration) -> u64 {
    if d.is_zero() {
        0
    } else {
        millis(d)
    }
}

/// A script's yes/no argument.
fn flag(yes: bool) -> &'static str {
    if yes {
        "1"
    } else {
        "0"
    }
}

/// An acquire script's reply: `{state, value}`, or for a take (of every kind) the bare
/// token (a table costs Redis more to write, see `lua/acquire.lua`), read as `{1, token}`.
pub(super) struct Answer {
    pub(super) state: i64,
    pub(super) value: Value,
}

impl FromRedisValue for Answer {
    fn from_redis_value(reply: Value) -> Result<Self, ParsingError> {
        let (state, value) = match reply {
            Value::Int(token) => (1, Value::Int(token)),
            reply => FromRedisValue::from_redis_value(reply)?,
        };
        Ok(Answer { state, value })
    }
}

/// Reads an acquire script's answer: `{1, token}` taken, `{2, token}` re-entered, `{0,
/// ms}` busy, `{3, outcome}` a claim's stored outcome (a write: `{3, 0}`, an upgrade
/// refused).
pub(super) fn attempted(
    how: How,
    Answer { state, value }: Answer,
) -> Result<Attempt, BackendError> {
    let claim = how == How::Claim;
    let write = matches!(how, How::Write { .. });
    let permits = matches!(how, How::Permits(_));
    match (state, value) {
        (1, Value::Int(token)) => Ok(Attempt::Taken {
            token: token as u64,
        }),
        (2, Value::Int(token)) => Ok(Attempt::Reentered {
            token: token as u64,
        }),
        (0, Value::Int(ms)) => Ok(Attempt::Busy { ttl: pttl(ms) }),
        (3, Value::BulkString(outcome)) if claim => Ok(Attempt::Completed { outcome }),
        (3, Value::Int(_)) if write => Ok(Attempt::Upgrade),
        (3, Value::Int(capacity)) if permits => Ok(Attempt::OverCapacity {
            capacity: u32::try_from(capacity).unwrap_or(u32::MAX),
        }),
        (state, other) => Err(BackendError::Protocol(format!(
            "the {} acquire script returned {{{state}, {other:?}}}",
            how.kind().name()
        ))),
    }
}

/// Takes every lock of `keys` or none (`{1, tokens..}` or `{0, i, pttl}`, see
/// `multi_acquire.lua`).
pub(super) fn acquire_all<'k>(
    keys: impl Iterator<Item = &'k Key>,
    holder: &Holder,
    lease: Duration,
    fresh: bool,
    variant: Variant,
) -> Call {
    let names: Vec<&str> = keys
        .flat_map(|key| [key.redis_key(), key.fence_key()])
        .collect();
    Call::script(&MULTI_ACQUIRE, variant, &names)
        .arg(holder.id())
        .arg(millis(lease))
        .arg(flag(fresh))
        .counted(fresh, holder)
        .resendable(fresh)
}

/// Releases one hold (`-2`, `-1`, `0` or the count left, see [`released`]), given the
/// fencing token it was given, if known.
pub(super) fn release(hold: &Hold, token: Option<u64>, variant: Variant) -> Call {
    let Hold { kind, key, holder } = hold;
    match kind {
        HoldKind::Exclusive(Exclusive::Plain) => {
            Call::script(&RELEASE, variant, &[key.redis_key(), key.fence_key()])
                .arg(holder.id())
                .arg(key.channel())
        }
        HoldKind::Exclusive(Exclusive::Fair) => {
            Call::script(&FAIR_RELEASE, variant, &fair_keys(key))
                .arg(holder.id())
                .arg(&*key.names().wake_prefix)
        }
        HoldKind::ReadWrite(mode) => Call::script(&RW_RELEASE, variant, &rw_keys(key))
            .arg(holder.id())
            .arg(mode.field_suffix())
            .arg(key.channel())
            .arg(&*key.names().readers),
        // Never re-entered, so never counted twice: no call id.
        HoldKind::Permits => {
            return Call::script(&PERMITS_RELEASE, variant, &permits_keys(key))
                .arg(holder.id())
                .arg(&*key.names().granted)
                .arg(token_arg(token))
        }
    }
    .arg(token_arg(token))
    .counted(false, holder)
}

/// The release of a plain hold nobody can have re-entered (see
/// [`Reentries::None`]) as two plain commands in one pipeline: `HDEL` of the holder's
/// field, which deletes the hash with its last field, then the notice `release.lua` sends.
/// On a cluster, for a holder that was handed out ([`Reentries::NoneLeft`]), the `HDEL`
/// takes the field's `:op` too (see `lua/once.lua`): a re-entry, counted down since, may
/// have left one there. Not atomic, and need not be: the notice follows the delete either
/// way, and one sent for a hold already gone only makes a waiter try once more. Read its
/// reply with [`released_alone`].
pub(super) fn release_alone(hold: &Hold, reentries: Reentries, variant: Variant) -> Call {
    let publish = match variant.notices {
        Notices::Classic => "PUBLISH",
        Notices::Sharded => "SPUBLISH",
    };
    let channel = hold.key.channel();
    let mut notice = with_room(publish, 2, channel.len() + RELEASED.len());
    notice.arg(channel).arg(RELEASED);
    let mut delete = Call::command("HDEL", hold.key.redis_key()).arg(hold.holder.id());
    if variant.cluster && reentries == Reentries::NoneLeft {
        delete = delete.arg([hold.holder.id(), ":op"].concat());
    }
    Call {
        then: Some(notice),
        ..delete
    }
}

/// [`release_alone`]'s answer from the fields `HDEL` deleted: any, this hold ended (its
/// `:op` goes only with its count); none, not held (whether it ended before takes the
/// lock's last token, see `RedisStore`).
pub(super) fn released_alone(deleted: i64) -> Released {
    match deleted {
        0 => Released::NotHeld,
        _ => Released::Freed,
    }
}

/// The release notice, as `release.lua` sends it: `'0'` is also Redisson's unlock message.
const RELEASED: &str = "0";

/// The lock's last fencing token, as written (`GET` of its fencing key).
pub(super) fn last_token(key: &Key) -> Call {
    Call::command("GET", key.fence_key())
}

/// A fencing token for a script: `''` when unknown.
fn token_arg(token: Option<u64>) -> String {
    token.map_or_else(String::new, |token| token.to_string())
}

/// Releases one hold and stores a claim's outcome with it.
pub(super) fn complete(
    hold: &Hold<Exclusive>,
    token: Option<u64>,
    outcome: Outcome<'_>,
    variant: Variant,
) -> Call {
    let Hold { kind, key, holder } = hold;
    let outcome_key = &*key.names().outcome;
    let call = match kind {
        Exclusive::Plain => Call::script(
            &RELEASE,
            variant,
            &[key.redis_key(), key.fence_key(), outcome_key],
        )
        .arg(holder.id())
        .arg(key.channel()),
        Exclusive::Fair => {
            let [lock, fence, queue, deadlines] = fair_keys(key);
            Call::script(
                &FAIR_RELEASE,
                variant,
                &[lock, fence, queue, deadlines, outcome_key],
            )
            .arg(holder.id())
            .arg(&*key.names().wake_prefix)
        }
    };
    let call = call
        .arg(token_arg(token))
        .arg(outcome.bytes)
        .arg(millis(outcome.keep));
    match kind {
        Exclusive::Plain => call,
        Exclusive::Fair => call.arg(key.channel()),
    }
    .counted(false, holder)
}

/// Renews one hold (`1` renewed, `0` gone).
pub(super) fn renew(renewal: &Renewal, variant: Variant) -> Call {
    let Hold { kind, key, holder } = &renewal.hold;
    match kind {
        // A fair lock's hash has the plain shape; its queue needs no renewal.
        HoldKind::Exclusive(_) => {
            Call::script(&RENEW, variant, &[key.redis_key(), key.fence_key()])
                .arg(holder.id())
                .arg(millis(renewal.lease))
        }
        HoldKind::ReadWrite(mode) => Call::script(&RW_RENEW, variant, &rw_keys(key))
            .arg(holder.id())
            .arg(mode.field_suffix())
            .arg(millis(renewal.lease)),
        HoldKind::Permits => Call::script(&PERMITS_RENEW, variant, &permits_keys(key))
            .arg(holder.id())
            .arg(millis(renewal.lease)),
    }
}

/// A waiter gives up what it left in the store.
pub(super) fn withdraw(waiter: Waiter, key: &Key, holder: &Holder, variant: Variant) -> Call {
    match waiter {
        Waiter::Queued => Call::script(&FAIR_LEAVE, variant, &fair_keys(key))
            .arg(holder.id())
            .arg(&*key.names().wake_prefix),
        Waiter::Writer | Waiter::Reader => Call::script(&RW_WITHDRAW, variant, &rw_keys(key))
            .arg(holder.id())
            .arg(if waiter == Waiter::Reader { "r" } else { "w" })
            .arg(key.channel())
            .arg(&*key.names().readers),
        Waiter::Permits { permits, lease } => {
            Call::script(&PERMITS_WITHDRAW, variant, &permits_keys(key))
                .arg(holder.id())
                .arg(permits)
                .arg(&*key.names().granted)
                .arg(millis(lease))
        }
    }
}

/// Deletes the lock whoever holds it, whatever its kind, and wakes its waiters (`1`
/// deleted, `0` none).
pub(super) fn force_unlock(key: &Key, variant: Variant) -> Call {
    let names = key.names();
    let keys = [
        key.redis_key(),
        &names.leases,
        &names.queue,
        &names.deadlines,
        key.fence_key(),
        &names.waiting_readers,
    ];
    Call::script(&FORCE_RELEASE, variant, &keys)
        .arg(key.channel())
        .arg(&*names.readers)
        .arg(&*names.wake_prefix)
        .arg(&*names.granted)
}

/// How many times the holder holds the hold (an integer, or nil for none; for permits,
/// its field, read with [`permits_held`]).
pub(super) fn hold_count(hold: &Hold, variant: Variant) -> Call {
    match hold.kind {
        HoldKind::Exclusive(_) | HoldKind::Permits => {
            Call::command("HGET", hold.key.redis_key()).arg(hold.holder.id())
        }
        HoldKind::ReadWrite(mode) => Call::script(&RW_COUNT, variant, &rw_keys(&hold.key))
            .arg(hold.holder.id())
            .arg(mode.field_suffix()),
    }
}

/// How many permits a holder's field (`<permits>:<token>`) says it holds.
pub(super) fn permits_held(field: Option<String>) -> u64 {
    field
        .as_deref()
        .and_then(|field| field.split(':').next()?.parse().ok())
        .unwrap_or(0)
}

/// A semaphore's state: `{capacity, used, waiting}`, capacity `-1` idle, `-2` another
/// kind's lock (read with [`permits_state`]).
pub(super) fn permits(key: &Key, variant: Variant) -> Call {
    Call::script(&PERMITS_STATE, variant, &permits_keys(key))
}

/// Reads [`permits`]'s answer.
pub(super) fn permits_state(reply: &[i64]) -> Result<Option<PermitsState>, BackendError> {
    let count = |n: i64| u32::try_from(n).unwrap_or(0);
    match *reply {
        [capacity, used, waiting] if capacity > 0 => Ok(Some(PermitsState {
            capacity: count(capacity),
            used: count(used),
            waiting: count(waiting),
        })),
        [-1 | -2, ..] => Ok(None),
        _ => Err(BackendError::Protocol(format!(
            "the semaphore state script returned {reply:?}"
        ))),
    }
}

/// Changes a semaphore's capacity (`1` changed, `0` idle).
pub(super) fn set_capacity(key: &Key, capacity: u32, variant: Variant) -> Call {
    Call::script(&PERMITS_CAPACITY, variant, &permits_keys(key))
        .arg(capacity)
        .arg(&*key.names().granted)
}

/// The lock's `PTTL` (see [`remaining_ttl`]).
pub(super) fn pttl_of(key: &Key) -> Call {
    Call::command("PTTL", key.redis_key())
}

/// The length of a fair lock's queue.
pub(super) fn queue_length(key: &Key) -> Call {
    Call::command("LLEN", &key.names().queue)
}

/// How many writers a read-write lock's waiting writers' set holds.
pub(super) fn waiting_writers(key: &Key) -> Call {
    Call::command("ZCARD", &key.names().writers)
}

/// Writes a fenced value with `token` (`{1}` written, `{0, newest}` refused).
pub(super) fn fenced_write(key: &Key, token: u64, value: &[u8], variant: Variant) -> Call {
    Call::script(&FENCED_WRITE, variant, &[&key.names().fenced])
        .arg(token)
        .arg(value)
}

/// Reads `fenced_write.lua`'s answer: `None` written, `Some(newest)` refused.
pub(super) fn fenced_written(reply: &[i64]) -> Result<Option<u64>, BackendError> {
    match reply {
        [1] => Ok(None),
        [0, newest] => Ok(Some(*newest as u64)),
        other => Err(BackendError::Protocol(format!(
            "the fenced write script returned {other:?}"
        ))),
    }
}

/// A fenced value and the token that wrote it.
pub(super) fn fenced_read(key: &Key) -> Call {
    Call::command("HMGET", &key.names().fenced)
        .arg("token")
        .arg("value")
}

/// Which of `commands` (each a line of words, `K` for `key` and `C` for `channel`) the
/// user may not run (`permissions.lua`: their positions from 1, or nil on a Redis without
/// `redis.acl_check_cmd`).
pub(super) fn permissions(key: &str, channel: &str, commands: &[&str], variant: Variant) -> Call {
    Call::script(&PERMISSIONS, variant, &[key])
        .arg(channel)
        .arg(commands)
}

/// A release script's answer: `-2` not held and nobody took the lock since the hold's
/// token, `-1` not held, `0` this hold ended, `n` re-entries left.
pub(super) fn released(left: i64) -> Released {
    match left {
        -2 => Released::Ended,
        n if n < 0 => Released::NotHeld,
        0 => Released::Freed,
        n => Released::Remaining(n as u64),
    }
}

/// A busy lock's remaining lease from its `PTTL`: -2 (gone since the check) is zero, -1
/// (no expiry: not one of ours) is unknown; both mean "retry now or later".
pub(super) fn pttl(ms: i64) -> Option<Duration> {
    match ms {
        -2 => Some(Duration::ZERO),
        ms if ms < 0 => None,
        ms => Some(Duration::from_millis(ms as u64)),
    }
}

/// A lock's remaining lease from `PTTL` for inspection: -2 no lock; -1 a lock without
/// expiry (not one of ours) that never expires.
pub(super) fn remaining_ttl(ms: i64) -> Option<Duration> {
    match ms {
        -2 => None,
        -1 => Some(Duration::MAX),
        ms => Some(Duration::from_millis(ms.max(0) as u64)),
    }
}

/// Milliseconds for a script argument: at least 1 (0 would mean "no expiry" to some
/// commands), at most `u64::MAX`.
pub(super) fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(reply: Value) -> Result<(i64, Value), ParsingError> {
        Answer::from_redis_value(reply).map(|Answer { state, value }| (state, value))
    }

    #[test]
    fn a_bare_token_is_a_take_and_a_table_says_its_state() {
        let token = 1_795_561_285_892_852;
        assert_eq!(answer(Value::Int(token)).unwrap(), (1, Value::Int(token)));
        let busy = Value::Array(vec![Value::Int(0), Value::Int(250)]);
        assert_eq!(answer(busy).unwrap(), (0, Value::Int(250)));
        let taken = answer(Value::Array(vec![Value::Int(1), Value::Int(token)])).unwrap();
        assert!(matches!(
            attempted(How::Plain, Answer { state: taken.0, value: taken.1 }),
            Ok(Attempt::Taken { token: t }) if t == token as u64
        ));
        assert!(answer(Value::Nil).is_err());
        assert!(answer(Value::BulkString(b"1".to_vec())).is_err());
    }

    /// The words of `call` after `EVALSHA`: digest, key count, keys, arguments.
    fn words(call: &Call) -> Vec<String> {
        let words = call.cmd.args_iter().skip(1).filter_map(|arg| match arg {
            redis::Arg::Simple(bytes) => Some(String::from_utf8_lossy(bytes).into_owned()),
            _ => None,
        });
        words.collect()
    }

    #[test]
    fn only_a_cluster_gets_call_ids_and_the_variant_that_reads_them() {
        let key = crate::key::KeySpace::default().key("ids").unwrap();
        let hold = Hold {
            kind: HoldKind::Exclusive(Exclusive::Plain),
            key,
            holder: Holder::new("client", 1),
        };
        let variant = |notices, cluster| Variant { notices, cluster };
        let sent = |notices, cluster| {
            words(&release(&hold, Some(7), variant(notices, cluster)).sent(cluster))
        };
        let plain = words(&release(&hold, Some(7), variant(Notices::Classic, false)));
        // One server: the script as written, its arguments alone.
        let one = sent(Notices::Classic, false);
        assert_eq!(one, plain);
        assert_eq!(one[0], RELEASE.get_hash());
        // A cluster: the variant that reads an id, and the id, new for every call.
        let first = sent(Notices::Classic, true);
        let second = sent(Notices::Classic, true);
        let clustered = RELEASE.clustered.as_ref().unwrap().script.get_hash();
        assert_eq!(
            (first[0].as_str(), second[0].as_str()),
            (clustered, clustered)
        );
        assert_eq!(first[1..plain.len()], plain[1..]);
        assert_eq!(first.len(), plain.len() + 1);
        assert_ne!(first.last(), second.last());
        assert!(first.last().unwrap().parse::<u64>().unwrap() > 0);
        // Sharded notices: a digest of their own, the id as well.
        let sharded = sent(Notices::Sharded, true);
        assert_eq!(
            sharded[0],
            RELEASE.sharded.as_ref().unwrap().script.get_hash()
        );
        assert_eq!(sharded.len(), plain.len() + 1);
        // Every variant is known by its digest, and has the lines of the script as written.
        for script in RELEASE.variants() {
            assert!(std::ptr::eq(
                by_digest(script.get_hash()).unwrap(),
                &*RELEASE
            ));
        }
        let lines = |source: &str| source.lines().count();
        let written: String = RELEASE.parts.iter().map(|(_, text)| *text).collect();
        let clustered = written.replace(NO_ID, ID);
        assert_ne!(
            clustered, written,
            "once.lua's line is where Lua::new looks for it"
        );
        assert_eq!(lines(&clustered), lines(&written));
    }
}
