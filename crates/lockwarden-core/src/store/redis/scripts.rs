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
    Acquire, Attempt, How, Outcome, PermitsAsked, PermitsState, Reentries, Refusal, Released,
    Renewal, Waiter,
};

/// A script of `lua/`, compiled into the crate, with its source files (to say which of
/// its commands Redis refused, by line).
pub(super) struct Lua {
    /// The files it is made of, in order, with their text.
    parts: &'static [(&'static str, &'static str)],
    /// Whether it is called as a Redis function (`FCALL`) where the server has them (see
    /// [`Lua::called_as_function`]).
    function: bool,
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
    /// Its name as a Redis function, in a library of its own of the same name:
    /// `lockwarden_<digest>`. Named by its text, a function never meets another version
    /// of itself: clients of two versions of the crate load and call their own (one
    /// library per function, since a function's name must be unique across libraries).
    function: Box<str>,
}

impl Compiled {
    fn new(source: &str) -> Self {
        let script = Script::new(source);
        Self {
            function: [FUNCTION_PREFIX, script.get_hash()].concat().into(),
            script,
            source: source.into(),
        }
    }

    /// `FUNCTION LOAD` of the library that holds it as its one function. The body starts
    /// on the library's third line ([`FUNCTION_FIRST_LINE`]).
    fn load_function(&self) -> Cmd {
        let name = &*self.function;
        let library = format!(
            "#!lua name={name}\nredis.register_function('{name}', function(KEYS, ARGV)\n{}end)\n",
            self.source
        );
        let mut load = redis::cmd("FUNCTION");
        load.arg("LOAD").arg(library);
        load
    }
}

/// How every function of ours is named: then its script's digest.
const FUNCTION_PREFIX: &str = "lockwarden_";
/// The line of its library on which a function's script begins (after the library's name
/// and the function's registration), to read Redis's line numbers as the script's.
const FUNCTION_FIRST_LINE: usize = 3;

/// Which variant of every script a connection sends (see [`Lua::with`]). Each call is
/// built for it, digest included: rewriting a built `EVALSHA` for another variant cost a
/// cluster ~1,450 client instructions a call.
#[derive(Debug, Clone, Copy)]
pub(super) struct Variant {
    /// How the scripts publish release notices.
    pub(super) notices: Notices,
    /// Whether the connection is a cluster's, which may send a call twice.
    pub(super) cluster: bool,
    /// Whether the server runs Redis functions and the user may load them: then the
    /// scripts that may be are called with `FCALL` (see [`Lua::called_as_function`]).
    pub(super) functions: bool,
}

/// `lua/once.lua`'s line that reads no call id, as written for one server...
const NO_ID: &str = "\nlocal call = ''\n";
/// ...and as a cluster's variant has it, where a call may be sent twice.
const ID: &str = "\nlocal call = ARGV[#ARGV]\n";

/// How every script calls `PUBLISH`: the sharded variant writes `SPUBLISH` there.
const CLASSIC: &str = "redis.call('PUBLISH'";

impl Lua {
    /// The script of `parts` (their text joined as `source`) and its variants. One that
    /// counts (with [`NO_ID`], `lua/once.lua`'s line) gets a cluster's variant; one that
    /// publishes must write it as [`CLASSIC`]. A script that drifted from either is
    /// refused here, at first use, rather than sent to a cluster in the wrong variant
    /// (`tests::every_variant_exists` names those that count).
    fn new(parts: &'static [(&'static str, &'static str)], source: &str) -> Self {
        let counts = source.contains(NO_ID);
        assert!(
            counts || parts.iter().all(|&(file, _)| file != "once.lua"),
            "{} runs after once.lua but has no `{}`",
            parts[parts.len() - 1].0,
            NO_ID.trim()
        );
        assert!(
            source.matches("'PUBLISH'").count() == source.matches(CLASSIC).count()
                && !source.contains("\"PUBLISH\""),
            "{} publishes other than as `{CLASSIC}`",
            parts[parts.len() - 1].0
        );
        let clustered = counts.then(|| source.replace(NO_ID, ID));
        let cluster_source = clustered.as_deref().unwrap_or(source);
        Lua {
            parts,
            function: false,
            script: Compiled::new(source),
            sharded: cluster_source
                .contains(CLASSIC)
                .then(|| Compiled::new(&cluster_source.replace(CLASSIC, "redis.call('SPUBLISH'"))),
            clustered: clustered.map(|source| Compiled::new(&source)),
        }
    }

    /// The same script, called as a Redis function (`FCALL`) over a connection whose
    /// server has them ([`Variant::functions`]): Redis 7 finds a function by its name
    /// once where it looks an `EVALSHA`'s digest up twice, ~4,000 instructions a call, a
    /// twelfth of a plain lock cycle (`scripts/kind_cost.py`). Only the plain take is
    /// one: the call of every lock cycle and of every attempt a waiter makes.
    fn called_as_function(self) -> Self {
        Self {
            function: true,
            ..self
        }
    }

    /// Whether calls over a connection of `variant` go as `FCALL`.
    fn is_function(&self, variant: Variant) -> bool {
        self.function && variant.functions
    }

    /// The command that calls the script over a connection of `variant`, up to its
    /// keys: `EVALSHA <digest>` or `FCALL <function>`, with room for `args` more
    /// arguments of `bytes` in all. The variants differ within lines, never in their
    /// number, so an error's line reads the same in each (see [`Lua::line`]).
    fn call(&self, variant: Variant, args: usize, bytes: usize) -> Cmd {
        let compiled = self.compiled(variant);
        match self.is_function(variant) {
            true => {
                let mut cmd = with_room("FCALL", args + OWN_ARGS, bytes + OWN_BYTES);
                cmd.arg(&*compiled.function);
                cmd
            }
            false => {
                let mut cmd = with_room("EVALSHA", args + OWN_ARGS, bytes + OWN_BYTES);
                cmd.arg(compiled.script.get_hash());
                cmd
            }
        }
    }

    /// What a call of it over a connection of `variant` is, for errors.
    fn what(&self, variant: Variant) -> What {
        match self.is_function(variant) {
            true => What::Function(self.name()),
            false => What::Script(self.name()),
        }
    }

    /// `SCRIPT LOAD` of the script as sent over a connection of `variant`, or `FUNCTION
    /// LOAD` of its function's library where it is called as one (loading a library
    /// that is there already fails, harmlessly: see [`is_loaded_already`]).
    pub(super) fn load(&self, variant: Variant) -> Cmd {
        let compiled = self.compiled(variant);
        if self.is_function(variant) {
            return compiled.load_function();
        }
        let mut load = redis::cmd("SCRIPT");
        load.arg("LOAD").arg(&*compiled.source);
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
    /// behaviour, as [`NO_ID`] does): a script of its own, with its own variants. Panics
    /// if the text has no `from`, at first use (`tests::every_variant_exists`).
    fn replaced(&self, from: &str, to: &str) -> Self {
        let source = &self.script.source;
        assert!(source.contains(from), "{} has no `{from}`", self.name());
        Lua {
            function: self.function,
            ..Lua::new(self.parts, &source.replace(from, to))
        }
    }

    /// Every variant.
    fn variants(&self) -> impl Iterator<Item = &Script> {
        self.every_compiled().map(|compiled| &compiled.script)
    }

    fn every_compiled(&self) -> impl Iterator<Item = &Compiled> {
        std::iter::once(&self.script)
            .chain(self.clustered.as_ref())
            .chain(self.sharded.as_ref())
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
/// handoff); `permits: f` a semaphore's after its prelude alone (the clock, the take of an
/// idle semaphore, tokens and grants: its holders are made for each acquisition, so it
/// needs no count-once helpers, and each piece is written for the semaphore's few calls);
/// `function: f` (or `function: permits: f`) one called as a Redis function where the
/// server has them.
macro_rules! script {
    (permits: $file:literal) => {
        script!("permits_prelude.lua", $file)
    };
    (fair: $file:literal) => {
        script!("clock.lua", "once.lua", "token.lua", "fair_prelude.lua", $file)
    };
    (rw: $file:literal) => {
        script!("clock.lua", "once.lua", "token.lua", "rw_prelude.lua", $file)
    };
    (function: $file:literal) => {
        LazyLock::new(|| script!(@lua $file).called_as_function())
    };
    (function: permits: $file:literal) => {
        LazyLock::new(|| script!(@lua "permits_prelude.lua", $file).called_as_function())
    };
    ($($file:literal),+) => {
        LazyLock::new(|| script!(@lua $($file),+))
    };
    (@lua $($file:literal),+) => {{
        const PARTS: &[(&str, &str)] = &[$((
            $file,
            include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/lua/", $file)),
        )),+];
        Lua::new(
            PARTS,
            concat!($(include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/lua/", $file))),+),
        )
    }};
}

/// `acquire.lua` for the first send of an attempt of a holder made for the acquisition,
/// on one server, with fencing tokens; it and its variants are called as functions where
/// the server has them.
static ACQUIRE: LazyLock<Lua> = script!(function: "acquire.lua");
/// `acquire.lua` for a client built without fencing tokens: no fencing key.
static ACQUIRE_UNFENCED: LazyLock<Lua> = LazyLock::new(|| ACQUIRE.replaced(FENCED, UNFENCED));
/// `acquire.lua` sent again (or on a cluster, which sends it again by itself): a refused
/// attempt looks whether this very call took the lock before.
static ACQUIRE_AGAIN: LazyLock<Lua> = LazyLock::new(|| ACQUIRE.replaced(FIRST, AGAIN));
/// The same without fencing tokens.
static ACQUIRE_AGAIN_UNFENCED: LazyLock<Lua> =
    LazyLock::new(|| ACQUIRE_AGAIN.replaced(FENCED, UNFENCED));
/// `acquire.lua` for a holder the caller gave, which may hold the lock already.
static ACQUIRE_GIVEN: LazyLock<Lua> = LazyLock::new(|| ACQUIRE_AGAIN.replaced(FRESH, GIVEN));
/// The same without fencing tokens.
static ACQUIRE_GIVEN_UNFENCED: LazyLock<Lua> =
    LazyLock::new(|| ACQUIRE_GIVEN.replaced(FENCED, UNFENCED));
/// Each of the six for an attempt that waits (an earlier one of its acquisition was
/// refused): a refusal leaves the lock a waiter's mark.
static ACQUIRE_WAITING: LazyLock<Lua> = LazyLock::new(|| ACQUIRE.replaced(ALONE, WAITING));
static ACQUIRE_WAITING_UNFENCED: LazyLock<Lua> =
    LazyLock::new(|| ACQUIRE_UNFENCED.replaced(ALONE, WAITING));
static ACQUIRE_AGAIN_WAITING: LazyLock<Lua> =
    LazyLock::new(|| ACQUIRE_AGAIN.replaced(ALONE, WAITING));
static ACQUIRE_AGAIN_WAITING_UNFENCED: LazyLock<Lua> =
    LazyLock::new(|| ACQUIRE_AGAIN_UNFENCED.replaced(ALONE, WAITING));
static ACQUIRE_GIVEN_WAITING: LazyLock<Lua> =
    LazyLock::new(|| ACQUIRE_GIVEN.replaced(ALONE, WAITING));
static ACQUIRE_GIVEN_WAITING_UNFENCED: LazyLock<Lua> =
    LazyLock::new(|| ACQUIRE_GIVEN_UNFENCED.replaced(ALONE, WAITING));
/// `acquire.lua`'s lines that pick a variant: fencing tokens or none, whether the holder
/// was made for the acquisition, whether the attempt looks for its holder, and whether a
/// refusal marks the lock.
const FENCED: &str = "\nlocal fenced = true\n";
const UNFENCED: &str = "\nlocal fenced = false\n";
const FRESH: &str = "\nlocal fresh = true\n";
const GIVEN: &str = "\nlocal fresh = false\n";
const FIRST: &str = "\nlocal first = true\n";
const AGAIN: &str = "\nlocal first = false\n";
const ALONE: &str = "\nlocal waiting = false\n";
const WAITING: &str = "\nlocal waiting = true\n";
static RENEW: LazyLock<Lua> = script!("renew.lua");
static RELEASE: LazyLock<Lua> = script!("once.lua", "release.lua");
static FORCE_RELEASE: LazyLock<Lua> = script!("force_release.lua");
static MULTI_ACQUIRE: LazyLock<Lua> = script!("once.lua", "token.lua", "multi_acquire.lua");
/// `multi_acquire.lua` for an attempt that waits: a refusal marks the busy lock.
static MULTI_ACQUIRE_WAITING: LazyLock<Lua> =
    LazyLock::new(|| MULTI_ACQUIRE.replaced(ALONE, WAITING));
static FAIR_ACQUIRE: LazyLock<Lua> = script!(fair: "fair_acquire.lua");
static FAIR_RELEASE: LazyLock<Lua> = script!(fair: "fair_release.lua");
static FAIR_LEAVE: LazyLock<Lua> = script!(fair: "fair_leave.lua");
static READ_ACQUIRE: LazyLock<Lua> = script!(rw: "rw_read_acquire.lua");
static WRITE_ACQUIRE: LazyLock<Lua> = script!(rw: "rw_write_acquire.lua");
static RW_RELEASE: LazyLock<Lua> = script!(rw: "rw_release.lua");
static RW_RENEW: LazyLock<Lua> = script!(rw: "rw_renew.lua");
static RW_WITHDRAW: LazyLock<Lua> = script!(rw: "rw_withdraw.lua");
static RW_COUNT: LazyLock<Lua> = script!(rw: "rw_count.lua");
/// `permits_acquire.lua` as written, which no call sends: every acquire runs the
/// prelude's take of an idle semaphore first (`TAKING`).
static PERMITS_ACQUIRE_WRITTEN: LazyLock<Lua> = script!(function: permits: "permits_acquire.lua");
/// The first attempt of an acquisition of one permit, on one server: it neither holds nor
/// waits yet, and does not look.
static PERMITS_ACQUIRE: LazyLock<Lua> =
    LazyLock::new(|| PERMITS_ACQUIRE_WRITTEN.replaced(NOT_TAKING, TAKING));
/// A later attempt (or a send again, or any send on a cluster): it looks for its place in
/// line and for permits granted to it.
static PERMITS_ACQUIRE_AGAIN: LazyLock<Lua> =
    LazyLock::new(|| PERMITS_ACQUIRE.replaced(FIRST, AGAIN));
/// The same two for more than one permit at once.
static PERMITS_ACQUIRE_MANY: LazyLock<Lua> = LazyLock::new(|| PERMITS_ACQUIRE.replaced(ONE, MANY));
static PERMITS_ACQUIRE_MANY_AGAIN: LazyLock<Lua> =
    LazyLock::new(|| PERMITS_ACQUIRE_AGAIN.replaced(ONE, MANY));
/// A release of one permit (or a waiter leaving the line), which grants what it frees; also
/// the grant alone, after a release sent as plain commands found waiters.
static PERMITS_RELEASE: LazyLock<Lua> = script!(function: permits: "permits_release.lua");
static PERMITS_RELEASE_MANY: LazyLock<Lua> = LazyLock::new(|| PERMITS_RELEASE.replaced(ONE, MANY));
static PERMITS_RENEW: LazyLock<Lua> = script!(permits: "permits_renew.lua");
static PERMITS_RENEW_MANY: LazyLock<Lua> = LazyLock::new(|| PERMITS_RENEW.replaced(ONE, MANY));
static PERMITS_CAPACITY: LazyLock<Lua> = script!(permits: "permits_capacity.lua");
static PERMITS_STATE: LazyLock<Lua> = script!(permits: "permits_state.lua");
/// `permits_prelude.lua`'s lines that pick a variant: whether the script is an acquire
/// (which takes an idle semaphore before anything else), and whether the hold is of one
/// permit or more.
const NOT_TAKING: &str = "\nlocal taking = false\n";
const TAKING: &str = "\nlocal taking = true\n";
const ONE: &str = "\nlocal many = false\n";
const MANY: &str = "\nlocal many = true\n";
static FENCED_WRITE: LazyLock<Lua> = script!("fenced_write.lua");
/// A rate decision (built and read in `rate.rs`).
pub(super) static RATE_LIMIT: LazyLock<Lua> = script!("rate_limit.lua");
// Not a lock operation: the connect-time check of the user's permissions.
static PERMISSIONS: LazyLock<Lua> = script!("permissions.lua");

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
    /// A script's `EVALSHA`, by its file.
    Script(&'static str),
    /// A script's `FCALL`, by its file.
    Function(&'static str),
    Command(&'static str),
}

impl std::fmt::Display for What {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            What::Script(file) => write!(f, "EVALSHA (of {file})"),
            What::Function(file) => write!(f, "FCALL (of {file})"),
            What::Command(name) => f.write_str(name),
        }
    }
}

impl Call {
    pub(super) fn script(script: &'static LazyLock<Lua>, variant: Variant, keys: &[&str]) -> Self {
        let lua: &'static Lua = script;
        let mut cmd = lua.call(variant, keys.len(), keys.iter().map(|k| k.len()).sum());
        cmd.arg(keys.len()).arg(keys);
        Self {
            script: Some(lua),
            counted: None,
            resend: false,
            turn: None,
            cmd,
            then: None,
            what: lua.what(variant),
        }
    }

    fn command(name: &'static str, key: &str) -> Self {
        /// After the key: at most a holder id and a waiter's mark's two fields
        /// (`release_alone`).
        const MORE_ARGS: usize = 3;
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

    /// The same call, sent again after its connection broke, as `variant`'s connection
    /// sends it: with the script its first send left for a second run, if it has one
    /// (the first send of a fresh holder's acquire skips looking for its own hold).
    pub(super) fn again(&mut self, variant: Variant) {
        // Found from the script, not kept in the call: every release's future carries a
        // call, and must stay small (`guard::tests`).
        let first = self
            .script
            .map_or(std::ptr::null(), |lua| lua as *const Lua);
        let lua: &'static Lua = if std::ptr::eq(first, &*ACQUIRE) {
            &ACQUIRE_AGAIN
        } else if std::ptr::eq(first, &*ACQUIRE_UNFENCED) {
            &ACQUIRE_AGAIN_UNFENCED
        } else if std::ptr::eq(first, &*ACQUIRE_WAITING) {
            &ACQUIRE_AGAIN_WAITING
        } else if std::ptr::eq(first, &*ACQUIRE_WAITING_UNFENCED) {
            &ACQUIRE_AGAIN_WAITING_UNFENCED
        } else if std::ptr::eq(first, &*PERMITS_ACQUIRE) {
            &PERMITS_ACQUIRE_AGAIN
        } else if std::ptr::eq(first, &*PERMITS_ACQUIRE_MANY) {
            &PERMITS_ACQUIRE_MANY_AGAIN
        } else {
            return;
        };
        // The same keys and arguments after the command and the digest or function.
        let mut cmd = lua.call(variant, 0, 0);
        for arg in self.cmd.args_iter().skip(2) {
            if let redis::Arg::Simple(bytes) = arg {
                cmd.arg(bytes);
            }
        }
        self.cmd = cmd;
        self.script = Some(lua);
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

/// The room a script call needs beyond its keys: a digest (or function name) and a key
/// count, and the `ARGV` of the longest scripts...
const OWN_ARGS: usize = 12;
/// ...the digest or function name, and `ARGV` such as holder ids and channel names.
const OWN_BYTES: usize = 256;

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
pub(super) fn load_all(variant: Variant) -> Vec<Cmd> {
    every().map(|lua| lua.load(variant)).collect()
}

/// The script whose SHA1 digest is `sha` (as Redis names it in errors), any variant.
pub(super) fn by_digest(sha: &str) -> Option<&'static Lua> {
    every().find(|lua| lua.variants().any(|script| script.get_hash() == sha))
}

/// The script called as the function `name` (as Redis names it in errors), any variant,
/// and how many lines of its library come before the script's first.
pub(super) fn by_function(name: &str) -> Option<(&'static Lua, usize)> {
    let lua = by_digest(name.strip_prefix(FUNCTION_PREFIX)?)?;
    lua.function.then_some((lua, FUNCTION_FIRST_LINE - 1))
}

/// Whether `error` answers a `FUNCTION LOAD` of a library the server has already: one
/// of ours holds one function named by its text, so it is the same.
pub(super) fn is_loaded_already(error: &redis::RedisError) -> bool {
    first_detail(error, |detail| {
        detail.starts_with("Library") && detail.ends_with("already exists")
    })
}

/// Whether Redis answered that it has no such function: the call did not run (it lost
/// its functions, or never had ours: a restart without persistence, `FUNCTION FLUSH`, a
/// cluster node added since).
pub(super) fn is_function_missing(error: &redis::RedisError) -> bool {
    first_detail(error, |detail| detail == "Function not found")
}

/// Whether the text of `error`'s (first, in a pipeline's) server error passes `test`.
fn first_detail(error: &redis::RedisError, test: impl Fn(&str) -> bool) -> bool {
    match error.detail() {
        Some(detail) => test(detail),
        None => error.clone().into_server_errors().is_some_and(|errors| {
            errors
                .first()
                .and_then(|(_, error)| error.details())
                .is_some_and(test)
        }),
    }
}

/// `FUNCTION LOAD` of the plain take as a connection of `variant` (with functions) calls
/// it first: at connect, to learn whether the server has functions and the user may load
/// them.
pub(super) fn load_functions(variant: Variant) -> Cmd {
    let first = Variant {
        functions: true,
        ..variant
    };
    match variant.cluster {
        true => ACQUIRE_AGAIN.load(first),
        false => ACQUIRE.load(first),
    }
}

/// The text of every file of every lock script, for tests.
#[cfg(test)]
pub(super) fn sources() -> impl Iterator<Item = &'static str> {
    every().flat_map(|lua| lua.parts.iter().map(|&(_, text)| text))
}

/// The script `file` (the last of its files), for tests.
#[cfg(test)]
pub(super) fn named(file: &str) -> &'static Lua {
    every()
        .find(|lua| lua.name() == file)
        .unwrap_or_else(|| panic!("no script {file}"))
}

/// Every script, each variant of its own (the scripts of one file share its name).
static EVERY: &[&LazyLock<Lua>] = &[
    &ACQUIRE,
    &ACQUIRE_UNFENCED,
    &ACQUIRE_AGAIN,
    &ACQUIRE_AGAIN_UNFENCED,
    &ACQUIRE_GIVEN,
    &ACQUIRE_GIVEN_UNFENCED,
    &ACQUIRE_WAITING,
    &ACQUIRE_WAITING_UNFENCED,
    &ACQUIRE_AGAIN_WAITING,
    &ACQUIRE_AGAIN_WAITING_UNFENCED,
    &ACQUIRE_GIVEN_WAITING,
    &ACQUIRE_GIVEN_WAITING_UNFENCED,
    &RENEW,
    &RELEASE,
    &FORCE_RELEASE,
    &MULTI_ACQUIRE,
    &MULTI_ACQUIRE_WAITING,
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
    &PERMITS_ACQUIRE_AGAIN,
    &PERMITS_ACQUIRE_MANY,
    &PERMITS_ACQUIRE_MANY_AGAIN,
    &PERMITS_RELEASE,
    &PERMITS_RELEASE_MANY,
    &PERMITS_RENEW,
    &PERMITS_RENEW_MANY,
    &PERMITS_CAPACITY,
    &PERMITS_STATE,
    &FENCED_WRITE,
    &RATE_LIMIT,
];

fn every() -> impl Iterator<Item = &'static Lua> {
    EVERY.iter().map(|lua| -> &'static Lua { lua })
}

/// The five keys of every read-write script, in the prelude's order.
fn rw_keys(key: &Key) -> [&str; 5] {
    let names = key.names();
    [
        key.redis_key(),
        names.leases(),
        key.fence_key(),
        names.writers(),
        names.waiting_readers(),
    ]
}

/// The two keys of every semaphore script, in the prelude's order: the semaphore (one
/// sorted set) and its fencing key.
fn permits_keys(key: &Key) -> [&str; 2] {
    [key.redis_key(), key.fence_key()]
}

/// The first member of a hold of `permits` permits of a semaphore, and its place in line
/// while it waits (see `lua/permits_prelude.lua`): `<permits>:<lease ms>:<holder id>`.
fn permit_member(permits: u32, lease: Duration, holder: &Holder) -> String {
    // Written piece by piece: `format!` cost each semaphore call ~700 instructions.
    let (mut count, mut ms) = (itoa::Buffer::new(), itoa::Buffer::new());
    [
        count.format(permits),
        ":",
        ms.format(millis(lease)),
        ":",
        holder.id(),
    ]
    .concat()
}

/// The four keys of every fair script, in the prelude's order.
fn fair_keys(key: &Key) -> [&str; 4] {
    [
        key.redis_key(),
        key.fence_key(),
        key.names().queue(),
        key.names().deadlines(),
    ]
}

/// One acquire attempt (its reply is a [`Reply`], see [`attempted`]): each kind's keys
/// and arguments in one place, in the order its script's header gives them.
pub(super) fn acquire(ask: &Acquire<'_>, variant: Variant) -> Call {
    let (key, holder) = (ask.key, ask.holder.id());
    let lease = millis(ask.lease);
    let call = match ask.how {
        How::Plain | How::Claim => {
            // A cluster client sends a call again by itself: there every send looks.
            let first = ask.fresh && !variant.cluster;
            // The first send's script knows the one a send again runs (`Call::again`).
            let waiting = ask.waiting && key.has_marks();
            let (plain, again) = match (ask.fresh, ask.fenced, waiting) {
                (true, true, false) => (&ACQUIRE, &ACQUIRE_AGAIN),
                (true, false, false) => (&ACQUIRE_UNFENCED, &ACQUIRE_AGAIN_UNFENCED),
                (false, true, false) => (&ACQUIRE_GIVEN, &ACQUIRE_GIVEN),
                (false, false, false) => (&ACQUIRE_GIVEN_UNFENCED, &ACQUIRE_GIVEN_UNFENCED),
                (true, true, true) => (&ACQUIRE_WAITING, &ACQUIRE_AGAIN_WAITING),
                (true, false, true) => (&ACQUIRE_WAITING_UNFENCED, &ACQUIRE_AGAIN_WAITING_UNFENCED),
                (false, true, true) => (&ACQUIRE_GIVEN_WAITING, &ACQUIRE_GIVEN_WAITING),
                (false, false, true) => (
                    &ACQUIRE_GIVEN_WAITING_UNFENCED,
                    &ACQUIRE_GIVEN_WAITING_UNFENCED,
                ),
            };
            let plain = if first { plain } else { again };
            let (lock, fence) = (key.redis_key(), key.fence_key());
            let call = match ask.how {
                How::Claim => Call::script(plain, variant, &[lock, fence, key.names().outcome()]),
                _ => Call::script(plain, variant, &[lock, fence]),
            };
            call.arg(holder).arg(lease)
        }
        How::Fair {
            queue_timeout,
            join,
            queued,
        } => Call::script(&FAIR_ACQUIRE, variant, &fair_keys(key))
            .arg(holder)
            .arg(lease)
            .arg(millis(queue_timeout))
            .arg(key.names().wake_prefix())
            .arg(flag(join))
            .arg(flag(queued))
            .arg(flag(ask.fresh)),
        How::Read {
            register,
            registered,
        } => Call::script(&READ_ACQUIRE, variant, &rw_keys(key))
            .arg(holder)
            .arg(lease)
            .arg(flag(ask.fresh))
            .arg(registration(register))
            .arg(flag(registered)),
        How::Write { register } => Call::script(&WRITE_ACQUIRE, variant, &rw_keys(key))
            .arg(holder)
            .arg(lease)
            .arg(registration(register))
            .arg(flag(ask.fresh)),
        How::Permits(asked) => return acquire_permits(ask, asked, variant),
    };
    call.counted(ask.fresh, ask.holder).resendable(ask.fresh)
}

/// Permits of a semaphore. Its holder is always made for the acquisition, which the
/// script relies on (holding already: this call ran before, or a release granted it), so
/// the call needs no id on a cluster. The first attempt on one server runs the variant that
/// does not look for its place or hold (`Call::again` swaps it for a send again).
fn acquire_permits(ask: &Acquire<'_>, asked: PermitsAsked, variant: Variant) -> Call {
    let key = ask.key;
    let first = !asked.queued && !variant.cluster;
    let lua = match (first, asked.permits > 1) {
        (true, false) => &PERMITS_ACQUIRE,
        (false, false) => &PERMITS_ACQUIRE_AGAIN,
        (true, true) => &PERMITS_ACQUIRE_MANY,
        (false, true) => &PERMITS_ACQUIRE_MANY_AGAIN,
    };
    let capacity = match asked.fifo {
        true => format!("-{}.5", asked.capacity),
        false => format!("-{}", asked.capacity),
    };
    Call::script(lua, variant, &permits_keys(key))
        .arg(permit_member(asked.permits, ask.lease, ask.holder))
        .arg(millis(ask.lease))
        .arg(capacity)
        .arg(registration(asked.register))
        .arg(key.names().granted())
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

/// What an acquire script answered (every acquire script's header says the same), read
/// here once: bare, the token taken (>= 0) or a refusal (`-2 - pttl`); in a table,
/// `{1, token}` taken by this very call before, `{2, token}` re-entered, `{0, ms}`
/// refused (a read-write, fair or semaphore script's wait), `{3, value}` what only some
/// kinds answer (a claim's outcome, an upgrade refused, more permits than the capacity).
/// Bare numbers are the common answers: Redis writes a table reply with ~5,000 more
/// instructions.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Reply {
    Taken(u64),
    Reentered(u64),
    /// Held by another: its remaining lease, if it has one (see [`pttl`]).
    Busy(Option<Duration>),
    /// `{3, value}`: read by [`attempted`] for the kind that asked.
    Other(Value),
    /// The lock was taken, but fewer replicas than asked acknowledged it, so it was
    /// released again: how many did (`replicated.rs`; no script answers it).
    NotReplicated(u32),
}

impl Reply {
    /// Whether the attempt left a hold of its holder in the store (taken or re-entered).
    pub(super) fn holds(&self) -> bool {
        matches!(self, Reply::Taken(_) | Reply::Reentered(_))
    }
}

impl FromRedisValue for Reply {
    fn from_redis_value(reply: Value) -> Result<Self, ParsingError> {
        let int = |value: &Value| match value {
            Value::Int(n) => Some(*n),
            _ => None,
        };
        match reply {
            Value::Int(token) if token >= 0 => Ok(Reply::Taken(token as u64)),
            Value::Int(refused) => Ok(Reply::Busy(pttl(-2 - refused))),
            Value::Array(items) => match <[Value; 2]>::try_from(items) {
                Ok([state, value]) => match (int(&state), int(&value)) {
                    (Some(1), Some(token)) => Ok(Reply::Taken(token as u64)),
                    (Some(2), Some(token)) => Ok(Reply::Reentered(token as u64)),
                    (Some(0), Some(ms)) => Ok(Reply::Busy(pttl(ms))),
                    (Some(3), _) => Ok(Reply::Other(value)),
                    _ => Err(format!("an acquire script answered {{{state:?}, {value:?}}}").into()),
                },
                Err(items) => Err(format!("an acquire script answered {items:?}").into()),
            },
            other => Err(format!("an acquire script answered {other:?}").into()),
        }
    }
}

/// Reads an acquire script's [`Reply`] as the answer to `how`: `{3, value}` is a claim's
/// outcome, a write's refused upgrade or a semaphore's capacity, and nothing else.
pub(super) fn attempted(how: How, reply: Reply) -> Result<Attempt, BackendError> {
    match (reply, how) {
        (Reply::Taken(token), _) => Ok(Attempt::Taken { token }),
        (Reply::Reentered(token), _) => Ok(Attempt::Reentered { token }),
        (Reply::Busy(ttl), _) => Ok(Attempt::Busy { ttl }),
        (Reply::Other(Value::BulkString(outcome)), How::Claim) => {
            Ok(Attempt::Refused(Refusal::Completed { outcome }))
        }
        (Reply::Other(Value::Int(_)), How::Write { .. }) => Ok(Attempt::Refused(Refusal::Upgrade)),
        (Reply::Other(Value::Int(capacity)), How::Permits(_)) => {
            let capacity = u32::try_from(capacity).unwrap_or(u32::MAX);
            Ok(Attempt::Refused(Refusal::OverCapacity { capacity }))
        }
        (Reply::NotReplicated(acknowledged), _) => Err(BackendError::NotReplicated {
            acknowledged,
            wanted: 0,
        }),
        (other, how) => Err(BackendError::Protocol(format!(
            "the {} acquire script answered {other:?}",
            how.name()
        ))),
    }
}

/// What `multi_acquire.lua` answered, read here once: `{1, token..}` every lock is now
/// held (each token as `acquire.lua` gives it), `{0, i, pttl}` lock `i` (1-based) is held
/// by another and nothing was changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum MultiReply {
    Taken(Vec<u64>),
    /// The busy lock's position (0-based) and its remaining lease (see [`pttl`]).
    Busy {
        index: usize,
        ttl: Option<Duration>,
    },
    /// Taken, but fewer replicas than asked acknowledged it, so released again: how
    /// many did (`multi.rs`; no script answers it).
    NotReplicated(u32),
}

impl FromRedisValue for MultiReply {
    fn from_redis_value(reply: Value) -> Result<Self, ParsingError> {
        let ints: Vec<i64> = FromRedisValue::from_redis_value(reply)?;
        match ints.as_slice() {
            [1, tokens @ ..] => Ok(MultiReply::Taken(
                tokens.iter().map(|&t| t as u64).collect(),
            )),
            &[0, index, ms] if index >= 1 => Ok(MultiReply::Busy {
                index: (index - 1) as usize,
                ttl: pttl(ms),
            }),
            other => Err(format!("the multi-acquire script answered {other:?}").into()),
        }
    }
}

/// Takes every lock of `keys` or none (`{1, tokens..}` or `{0, i, pttl}`, see
/// `multi_acquire.lua`), for a holder made for the acquisition or not (`fresh`), whose
/// refusal marks the busy lock if `waiting` and the layout has marks.
pub(super) fn acquire_all<'k>(
    keys: impl Iterator<Item = &'k Key> + Clone,
    holder: &Holder,
    lease: Duration,
    (fresh, waiting): (bool, bool),
    variant: Variant,
) -> Call {
    let lua = match waiting && keys.clone().all(Key::has_marks) {
        true => &MULTI_ACQUIRE_WAITING,
        false => &MULTI_ACQUIRE,
    };
    let names: Vec<&str> = keys
        .flat_map(|key| [key.redis_key(), key.fence_key()])
        .collect();
    Call::script(lua, variant, &names)
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
                .arg(key.names().wake_prefix())
        }
        HoldKind::ReadWrite(mode) => Call::script(&RW_RELEASE, variant, &rw_keys(key))
            .arg(holder.id())
            .arg(mode.field_suffix())
            .arg(key.channel())
            .arg(key.names().readers()),
        // Never re-entered, so never counted twice: no call id. Read with
        // `permits_released`.
        HoldKind::Permits { permits, lease } => {
            let member = permit_member(*permits, *lease, holder);
            return release_permits(key, &member, *permits, variant);
        }
    }
    .arg(token_arg(token))
    .counted(false, holder)
}

/// `permits_release.lua` for the hold of `permits` whose first member is `member` (its
/// place in line, for a waiter that leaves), or, with `''`, to grant alone: it grants what
/// it frees. Read its answer with [`permits_released`] and [`permits_left_waiting`].
fn release_permits(key: &Key, member: &str, permits: u32, variant: Variant) -> Call {
    let lua = match permits > 1 {
        true => &PERMITS_RELEASE_MANY,
        false => &PERMITS_RELEASE,
    };
    Call::script(lua, variant, &permits_keys(key))
        .arg(member)
        .arg(key.names().granted())
}

/// The grant to a semaphore's waiters of what a release sent as plain commands freed
/// ([`release_permits_alone`] found them in line).
pub(super) fn grant_permits(key: &Key, variant: Variant) -> Call {
    release_permits(key, "", 1, variant)
}

/// The release of a semaphore's hold of `permits` (`lease`, `holder`: see
/// [`permit_member`]) as plain commands in one pipeline, without a script: `ZREM` of its
/// members, `ZREMRANGEBYRANK <key> -1 0` (the capacity, when it is the last member left:
/// the semaphore is idle), `ZCOUNT <key> 1e15 +inf` (waiters in line, to whom
/// [`grant_permits`] then grants what it freed). Not atomic, and need not be: nobody else
/// can have touched the hold, and whoever comes between the commands sees a consistent
/// semaphore (a permit freed before the waiters are granted is theirs first: an acquire
/// grants waiters before it takes). Its replies: the members removed, the capacity's, the
/// waiters.
pub(super) fn release_permits_alone(
    key: &Key,
    permits: u32,
    lease: Duration,
    holder: &Holder,
) -> redis::Pipeline {
    let first = permit_member(permits, lease, holder);
    let mut remove = plain("ZREM", key, permits as usize);
    for i in 2..=permits {
        remove.arg(format!("{first}#{i}"));
    }
    remove.arg(first);
    let mut pipe = redis::Pipeline::with_capacity(3);
    pipe.add_command(remove)
        .add_command(plain("ZREMRANGEBYRANK", key, 2).arg(-1).arg(0).to_owned())
        .add_command(plain("ZCOUNT", key, 2).arg("1e15").arg("+inf").to_owned());
    pipe
}

/// The command `name` on `key`'s semaphore, with room for `args` more arguments.
fn plain(name: &'static str, key: &Key, args: usize) -> Cmd {
    let mut cmd = with_room(name, 1 + args, key.redis_key().len() + 64 * args);
    cmd.arg(key.redis_key());
    cmd
}

/// Whether `permits_release.lua`'s answer says waiters may be left in line (`1`).
pub(super) fn permits_left_waiting(reply: i64) -> bool {
    reply > 0
}

/// A semaphore release's answer (`permits_release.lua`, or the members
/// [`release_permits_alone`] removed as `0` or more) given the hold's fencing token, if
/// known: freed; or not held, and "ran before" (ended) only if the semaphore's last token
/// is still the hold's (the script answers `-1 - last token`).
pub(super) fn permits_released(reply: i64, token: Option<u64>) -> Released {
    match reply {
        n if n >= 0 => Released::Freed,
        n => match (token, u64::try_from(-1 - n)) {
            (Some(token), Ok(last)) if token > 0 && token == last => Released::Ended,
            _ => Released::NotHeld,
        },
    }
}

/// The release of a plain hold nobody can have re-entered (see [`Reentries::None`]) as
/// plain commands: `HDEL` of the holder's field, which deletes the hash with its last
/// field, and of a waiter's mark where the layout has marks (`~w1`, `~w2`, see
/// `lua/acquire.lua`); then, if `notify`, the notice `release.lua` sends, in the same
/// pipeline. Without it the caller sends the notice only if the `HDEL` deleted a mark
/// ([`released_alone`] says), a second round trip only when someone waits. In Redisson's
/// layout, on a cluster, for a holder that was handed out ([`Reentries::NoneLeft`]), the
/// `HDEL` takes the field's `:op` too (see `lua/once.lua`): a re-entry, counted down since,
/// may have left one there (with marks that hold goes by `release.lua`: its count would
/// not tell an `:op` from a mark). Not atomic, and need not be: the notice follows the
/// delete either way, and one sent for a hold already gone only makes a waiter try once
/// more.
pub(super) fn release_alone(
    hold: &Hold,
    reentries: Reentries,
    notify: bool,
    variant: Variant,
) -> Call {
    let mut delete = Call::command("HDEL", hold.key.redis_key()).arg(hold.holder.id());
    if hold.key.has_marks() {
        delete = delete.arg(MARKS[0]).arg(MARKS[1]);
    } else if variant.cluster && reentries == Reentries::NoneLeft {
        delete = delete.arg([hold.holder.id(), ":op"].concat());
    }
    Call {
        then: notify.then(|| notice(&hold.key, variant)),
        ..delete
    }
}

/// The fields of a waiter's mark (see `lua/acquire.lua`).
const MARKS: [&str; 2] = ["~w1", "~w2"];

/// The release notice on `key`'s channel, as `release.lua` sends it.
pub(super) fn notice(key: &Key, variant: Variant) -> Cmd {
    let publish = match variant.notices {
        Notices::Classic => "PUBLISH",
        Notices::Sharded => "SPUBLISH",
    };
    let channel = key.channel();
    let mut notice = with_room(publish, 2, channel.len() + RELEASED.len());
    notice.arg(channel).arg(RELEASED);
    notice
}

/// [`release_alone`]'s answer from the fields `HDEL` deleted, for a `key` whose layout may
/// have marks: whether the hold ended, and whether a waiter's mark went with it. With
/// marks, their two fields make the count say which (1 held, 2 marked, 3 both); without,
/// any field is the hold's (its `:op` goes only with its count). Not held: whether it
/// ended before takes the lock's last token (see `RedisStore`).
pub(super) fn released_alone(deleted: i64, key: &Key) -> (Released, bool) {
    let (held, marked) = match key.has_marks() {
        true => (deleted % 2 == 1, deleted >= 2),
        false => (deleted > 0, false),
    };
    let released = match held {
        true => Released::Freed,
        false => Released::NotHeld,
    };
    (released, marked)
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
    let outcome_key = key.names().outcome();
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
            .arg(key.names().wake_prefix())
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
        HoldKind::Permits { permits, lease } => {
            let lua = match *permits > 1 {
                true => &PERMITS_RENEW_MANY,
                false => &PERMITS_RENEW,
            };
            Call::script(lua, variant, &permits_keys(key))
                .arg(permit_member(*permits, *lease, holder))
                .arg(millis(renewal.lease))
        }
    }
}

/// A waiter gives up what it left in the store.
pub(super) fn withdraw(waiter: Waiter, key: &Key, holder: &Holder, variant: Variant) -> Call {
    match waiter {
        Waiter::Queued => Call::script(&FAIR_LEAVE, variant, &fair_keys(key))
            .arg(holder.id())
            .arg(key.names().wake_prefix()),
        Waiter::Writer | Waiter::Reader => Call::script(&RW_WITHDRAW, variant, &rw_keys(key))
            .arg(holder.id())
            .arg(if waiter == Waiter::Reader { "r" } else { "w" })
            .arg(key.channel())
            .arg(key.names().readers()),
        // Its place in line, or permits granted to it meanwhile (the same first member).
        Waiter::Permits { permits, lease } => release_permits(
            key,
            &permit_member(permits, lease, holder),
            permits,
            variant,
        ),
    }
}

/// Deletes the lock whoever holds it, whatever its kind, and wakes its waiters (`1`
/// deleted, `0` none).
pub(super) fn force_unlock(key: &Key, variant: Variant) -> Call {
    let names = key.names();
    let keys = [
        key.redis_key(),
        names.leases(),
        names.queue(),
        names.deadlines(),
        key.fence_key(),
        names.waiting_readers(),
    ];
    Call::script(&FORCE_RELEASE, variant, &keys)
        .arg(key.channel())
        .arg(names.readers())
        .arg(names.wake_prefix())
        .arg(names.granted())
}

/// How many times the holder holds the hold (an integer, or nil for none; for permits,
/// the score of its first member, read with [`permits_held`]).
pub(super) fn hold_count(hold: &Hold, variant: Variant) -> Call {
    match hold.kind {
        HoldKind::Exclusive(_) => Call::command("HGET", hold.key.redis_key()).arg(hold.holder.id()),
        HoldKind::Permits { permits, lease } => Call::command("ZSCORE", hold.key.redis_key())
            .arg(permit_member(permits, lease, &hold.holder)),
        HoldKind::ReadWrite(mode) => Call::script(&RW_COUNT, variant, &rw_keys(&hold.key))
            .arg(hold.holder.id())
            .arg(mode.field_suffix()),
    }
}

/// How many permits a hold of `permits` holds, from its first member's score: all of them
/// while it is a lease's deadline (below 1e13; from 1e15 it is a place in line), none if it
/// is gone.
pub(super) fn permits_held(score: Option<f64>, permits: u32) -> u64 {
    match score {
        Some(score) if score < 1e13 => u64::from(permits),
        _ => 0,
    }
}

/// A semaphore's state: `{capacity, used, waiting}`, capacity `-1` idle (read with
/// [`permits_state`]).
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
        [-1, ..] => Ok(None),
        _ => Err(BackendError::Protocol(format!(
            "the semaphore state script returned {reply:?}"
        ))),
    }
}

/// Changes a semaphore's capacity (`1` changed, `0` idle).
pub(super) fn set_capacity(key: &Key, capacity: u32, variant: Variant) -> Call {
    Call::script(&PERMITS_CAPACITY, variant, &permits_keys(key))
        .arg(capacity)
        .arg(key.names().granted())
}

/// The lock's `PTTL` (see [`remaining_ttl`]).
pub(super) fn pttl_of(key: &Key) -> Call {
    Call::command("PTTL", key.redis_key())
}

/// The length of a fair lock's queue.
pub(super) fn queue_length(key: &Key) -> Call {
    Call::command("LLEN", key.names().queue())
}

/// How many writers a read-write lock's waiting writers' set holds.
pub(super) fn waiting_writers(key: &Key) -> Call {
    Call::command("ZCARD", key.names().writers())
}

/// Writes a fenced value with `token` (`{1}` written, `{0, newest}` refused).
pub(super) fn fenced_write(key: &Key, token: u64, value: &[u8], variant: Variant) -> Call {
    Call::script(&FENCED_WRITE, variant, &[key.names().fenced()])
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
    Call::command("HMGET", key.names().fenced())
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
    use crate::store::contract::{Charge, RateAsk};

    fn reply(value: Value) -> Result<Reply, ParsingError> {
        Reply::from_redis_value(value)
    }

    #[test]
    fn a_bare_number_is_a_take_or_a_refusal_and_a_table_says_its_state() {
        let token = 1_795_561_285_892_852;
        let table = |state, value| Value::Array(vec![Value::Int(state), value]);
        assert_eq!(
            reply(Value::Int(token)).unwrap(),
            Reply::Taken(token as u64)
        );
        assert_eq!(
            reply(Value::Int(0)).unwrap(),
            Reply::Taken(0),
            "no fencing tokens"
        );
        // -2 - pttl: held for 250 ms, or by a hash without expiry (not one of ours).
        let busy = |ms| Reply::Busy(pttl(ms));
        assert_eq!(reply(Value::Int(-252)).unwrap(), busy(250));
        assert_eq!(reply(Value::Int(-2)).unwrap(), busy(0));
        assert_eq!(reply(Value::Int(-1)).unwrap(), Reply::Busy(None));
        assert_eq!(reply(table(0, Value::Int(250))).unwrap(), busy(250));
        assert_eq!(
            reply(table(1, Value::Int(token))).unwrap(),
            Reply::Taken(token as u64)
        );
        assert_eq!(
            reply(table(2, Value::Int(token))).unwrap(),
            Reply::Reentered(token as u64)
        );
        assert!(reply(Value::Nil).is_err());
        assert!(reply(Value::BulkString(b"1".to_vec())).is_err());
        assert!(reply(table(7, Value::Int(1))).is_err());
        // `{3, value}` is a claim's outcome, a write's upgrade, a semaphore's capacity only.
        let done = || reply(table(3, Value::BulkString(b"done".to_vec()))).unwrap();
        assert!(matches!(
            attempted(How::Claim, done()),
            Ok(Attempt::Refused(Refusal::Completed { outcome })) if outcome == b"done"
        ));
        assert!(matches!(
            attempted(How::Plain, done()),
            Err(BackendError::Protocol(_))
        ));
        let upgrade = reply(table(3, Value::Int(0))).unwrap();
        let write = How::Write {
            register: Duration::ZERO,
        };
        assert_eq!(
            attempted(write, upgrade).unwrap(),
            Attempt::Refused(Refusal::Upgrade)
        );
    }

    #[test]
    fn a_multi_acquire_answers_every_token_or_the_busy_lock() {
        let ints = |ns: &[i64]| Value::Array(ns.iter().map(|&n| Value::Int(n)).collect());
        let read = |ns: &[i64]| MultiReply::from_redis_value(ints(ns));
        assert_eq!(read(&[1, 7, 9]).unwrap(), MultiReply::Taken(vec![7, 9]));
        assert_eq!(
            read(&[0, 2, 120]).unwrap(),
            MultiReply::Busy {
                index: 1,
                ttl: Some(Duration::from_millis(120))
            }
        );
        assert!(read(&[0, 0, 120]).is_err(), "lock positions start at 1");
        assert!(read(&[4, 1]).is_err());
    }

    /// `acquire.lua` writes out token.lua's `issue_token` (a function made on every call
    /// costs a lock cycle ~1,000 instructions): the same lines, for its own key and expiry.
    #[test]
    fn acquire_issues_tokens_as_token_lua_does() {
        let token = include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/lua/token.lua"));
        let acquire = include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/lua/acquire.lua"));
        let code = |text: &str| -> Vec<String> {
            text.lines()
                .map(str::trim)
                .filter(|line| !line.is_empty() && !line.starts_with("--"))
                .map(str::to_owned)
                .collect()
        };
        let body = code(token);
        let start = body
            .iter()
            .position(|l| l.starts_with("local token"))
            .unwrap();
        let end = body.iter().rposition(|l| l == "return token").unwrap();
        // For its own key, with its lease's expiry.
        let written: Vec<String> = body[start..=end]
            .join("\n")
            .replace(
                "if ms then\nredis.call('PEXPIRE', fence, ms)\nend",
                "redis.call('PEXPIRE', fence, ARGV[2])",
            )
            .replace("', fence", "', KEYS[2]")
            .lines()
            .map(str::to_owned)
            .collect();
        let acquire = code(acquire);
        assert!(
            acquire.windows(written.len()).any(|lines| lines == written),
            "acquire.lua no longer issues tokens as token.lua does: {written:#?}"
        );
    }

    /// One call of every operation that runs a script, as the store builds them.
    fn every_call() -> Vec<Call> {
        use crate::hold::RwMode;
        use crate::store::contract::{Outcome, Renewal};
        let key = crate::key::KeySpace::default().key("header").unwrap();
        let holder = Holder::new("client", 1);
        let variant = Variant {
            notices: Notices::Classic,
            cluster: false,
            functions: false,
        };
        let lease = Duration::from_secs(30);
        fn hold<K>(kind: K, key: &Key, holder: &Holder) -> Hold<K> {
            Hold {
                kind,
                key: key.clone(),
                holder: holder.clone(),
            }
        }
        let kinds = [
            HoldKind::PLAIN,
            HoldKind::FAIR,
            HoldKind::ReadWrite(RwMode::Read),
            HoldKind::ReadWrite(RwMode::Write),
            HoldKind::Permits { permits: 1, lease },
            HoldKind::Permits { permits: 2, lease },
        ];
        let asked = PermitsAsked {
            permits: 2,
            capacity: 5,
            fifo: true,
            register: lease,
            queued: false,
        };
        let hows = [
            How::Plain,
            How::Claim,
            How::Fair {
                queue_timeout: lease,
                join: true,
                queued: false,
            },
            How::Read {
                register: lease,
                registered: false,
            },
            How::Write { register: lease },
            How::Permits(asked),
            How::Permits(PermitsAsked {
                permits: 1,
                queued: true,
                ..asked
            }),
        ];
        let mut calls = Vec::new();
        for how in hows {
            for (fresh, fenced) in [(true, true), (true, false), (false, true), (false, false)] {
                for waiting in [false, true] {
                    let ask = Acquire {
                        key: &key,
                        holder: &holder,
                        lease,
                        how,
                        fresh,
                        fenced,
                        waiting,
                    };
                    calls.push(acquire(&ask, variant));
                }
            }
        }
        let keys = [key.clone(), key.clone()];
        calls.push(acquire_all(
            keys.iter(),
            &holder,
            lease,
            (true, true),
            variant,
        ));
        let outcome = Outcome {
            bytes: b"done",
            keep: lease,
        };
        for exclusive in [Exclusive::Plain, Exclusive::Fair] {
            calls.push(complete(
                &hold(exclusive, &key, &holder),
                Some(7),
                outcome,
                variant,
            ));
        }
        for kind in kinds {
            calls.push(release(&hold(kind, &key, &holder), Some(7), variant));
            let renewal = Renewal {
                hold: hold(kind, &key, &holder),
                lease,
            };
            calls.push(renew(&renewal, variant));
        }
        let waiters = [
            Waiter::Queued,
            Waiter::Writer,
            Waiter::Reader,
            Waiter::Permits { permits: 2, lease },
        ];
        for waiter in waiters {
            calls.push(withdraw(waiter, &key, &holder, variant));
        }
        calls.push(force_unlock(&key, variant));
        let read = HoldKind::ReadWrite(RwMode::Read);
        calls.push(hold_count(&hold(read, &key, &holder), variant));
        calls.push(permits(&key, variant));
        calls.push(set_capacity(&key, 3, variant));
        calls.push(fenced_write(&key, 7, b"value", variant));
        calls.push(permissions("k", "c", &["get K"], variant));
        // A rate decision under one policy and under two, for each charge.
        let prefix = crate::rate_key::RatePrefix::new(&crate::key::KeySpace::default(), "api");
        let policies = [
            crate::RatePolicy::new("burst", 10, Duration::from_secs(1)),
            crate::RatePolicy::new("daily", 1_000, Duration::from_secs(86_400)),
        ];
        let gcra: Vec<_> = policies.iter().map(|p| p.checked().unwrap()).collect();
        for n in [1, 2] {
            let names = policies[..n].iter().map(crate::RatePolicy::name);
            let buckets = prefix.buckets("tenant", names).unwrap();
            for charge in [
                Charge::Take(1),
                Charge::Peek,
                Charge::Refund(1),
                Charge::Reset,
            ] {
                let ask = RateAsk {
                    buckets: &buckets,
                    policies: &gcra[..n],
                    charge,
                };
                calls.push(super::super::rate::decide(&ask, variant));
            }
        }
        calls
    }

    /// The highest `KEYS[n]` and `ARGV[n]` the leading comment of `text` names: of every
    /// line, and of the lines before the optional ones (a claim's extra keys and
    /// arguments: a line that says `optional`, and every line from `To complete a claim`).
    fn declared(text: &str) -> ((usize, usize), (usize, usize)) {
        let highest = |line: &str, what: &str| {
            line.match_indices(what)
                .filter_map(|(at, _)| {
                    let rest = &line[at + what.len()..];
                    rest.split(']').next()?.parse::<usize>().ok()
                })
                .max()
                .unwrap_or(0)
        };
        let (mut base, mut all, mut claim) = ((0, 0), (0, 0), false);
        for line in text.lines().take_while(|line| line.starts_with("--")) {
            claim |= line.contains("To complete a claim");
            let here = (highest(line, "KEYS["), highest(line, "ARGV["));
            all = (all.0.max(here.0), all.1.max(here.1));
            if !claim && !line.contains("optional") {
                base = (base.0.max(here.0), base.1.max(here.1));
            }
        }
        (base, all)
    }

    /// Every script call has the keys and arguments its script's header names, in number:
    /// all of them, or all but the optional ones (a claim's).
    #[test]
    fn every_call_has_the_keys_and_arguments_its_header_names() {
        let mut reached = std::collections::BTreeSet::new();
        for call in every_call() {
            let lua = call.script.expect("a script call");
            reached.insert(lua.name());
            let words = words(&call);
            let keys: usize = words[1].parse().unwrap();
            let args = words.len() - 2 - keys;
            // Keys are named by the script's own file or its kind's prelude.
            let (mut base, mut all) = ((0, 0), (0, 0));
            for &(file, text) in lua.parts {
                let own = file == lua.name();
                if !(own || file.ends_with("_prelude.lua")) {
                    continue;
                }
                let (b, a) = declared(text);
                base = (base.0.max(b.0), if own { b.1 } else { base.1 });
                all = (all.0.max(a.0), if own { a.1 } else { all.1 });
            }
            match lua.name() {
                // Pairs of keys per lock; commands to check, one argument each.
                "multi_acquire.lua" => assert_eq!((keys % 2, args), (0, all.1)),
                "permissions.lua" => assert!(keys == 1 && args >= 2),
                // A bucket per policy, three arguments per policy.
                "rate_limit.lua" => assert!(
                    keys >= 1 && args == 3 * keys,
                    "rate_limit.lua: {keys} keys and {args} arguments"
                ),
                name => assert!(
                    (keys, args) == base || (keys, args) == all,
                    "{name}: {keys} keys and {args} arguments; its header names {base:?} \
                     (without the optional ones) or {all:?}"
                ),
            }
        }
        // The connect-time check is no lock script (`every` lists those).
        reached.remove("permissions.lua");
        let every: std::collections::BTreeSet<_> = every().map(Lua::name).collect();
        assert_eq!(reached, every, "a script no call reaches");
    }

    /// Every variant a call may pick exists, differs from the script as written only on
    /// the lines that pick it, and keeps its line count (errors name lines).
    #[test]
    fn every_variant_exists() {
        let text = |lua: &Lua, variant: Option<&Compiled>| match variant {
            Some(compiled) => compiled.source.to_string(),
            None => lua.script.source.to_string(),
        };
        // The scripts that change a hold's count, so that a call sent twice counts once.
        const COUNTING: &[&str] = &[
            "acquire.lua",
            "release.lua",
            "multi_acquire.lua",
            "fair_acquire.lua",
            "fair_release.lua",
            "fair_leave.lua",
            "rw_read_acquire.lua",
            "rw_write_acquire.lua",
            "rw_release.lua",
            "rw_renew.lua",
            "rw_withdraw.lua",
            "rw_count.lua",
        ];
        for lua in every() {
            let written = text(lua, None);
            let counts = COUNTING.contains(&lua.name());
            assert_eq!(lua.clustered.is_some(), counts, "{}", lua.name());
            assert_eq!(
                lua.sharded.is_some(),
                written.contains(CLASSIC),
                "{}",
                lua.name()
            );
            for variant in [lua.clustered.as_ref(), lua.sharded.as_ref()]
                .into_iter()
                .flatten()
            {
                let variant = text(lua, Some(variant));
                assert_ne!(variant, written, "{}", lua.name());
                assert_eq!(variant.lines().count(), written.lines().count());
            }
        }
        let source = |lua: &Lua| lua.script.source.to_string();
        let acquire = source(&ACQUIRE);
        for (lua, fenced, fresh, first, waiting) in [
            (&*ACQUIRE_UNFENCED, UNFENCED, FRESH, FIRST, ALONE),
            (&*ACQUIRE_AGAIN, FENCED, FRESH, AGAIN, ALONE),
            (&*ACQUIRE_AGAIN_UNFENCED, UNFENCED, FRESH, AGAIN, ALONE),
            (&*ACQUIRE_GIVEN, FENCED, GIVEN, AGAIN, ALONE),
            (&*ACQUIRE_GIVEN_UNFENCED, UNFENCED, GIVEN, AGAIN, ALONE),
            (&*ACQUIRE_WAITING, FENCED, FRESH, FIRST, WAITING),
            (&*ACQUIRE_WAITING_UNFENCED, UNFENCED, FRESH, FIRST, WAITING),
            (&*ACQUIRE_AGAIN_WAITING, FENCED, FRESH, AGAIN, WAITING),
            (
                &*ACQUIRE_AGAIN_WAITING_UNFENCED,
                UNFENCED,
                FRESH,
                AGAIN,
                WAITING,
            ),
            (&*ACQUIRE_GIVEN_WAITING, FENCED, GIVEN, AGAIN, WAITING),
            (
                &*ACQUIRE_GIVEN_WAITING_UNFENCED,
                UNFENCED,
                GIVEN,
                AGAIN,
                WAITING,
            ),
        ] {
            let picked = acquire
                .replace(FENCED, fenced)
                .replace(FRESH, fresh)
                .replace(FIRST, first)
                .replace(ALONE, waiting);
            assert_eq!(source(lua), picked);
            assert_ne!(source(lua), acquire);
        }
        // A semaphore's: every acquire takes an idle semaphore first; first or again, one
        // permit or more.
        let written = source(&PERMITS_ACQUIRE_WRITTEN);
        for (lua, first, many) in [
            (&*PERMITS_ACQUIRE, FIRST, ONE),
            (&*PERMITS_ACQUIRE_AGAIN, AGAIN, ONE),
            (&*PERMITS_ACQUIRE_MANY, FIRST, MANY),
            (&*PERMITS_ACQUIRE_MANY_AGAIN, AGAIN, MANY),
        ] {
            let picked = written
                .replace(NOT_TAKING, TAKING)
                .replace(FIRST, first)
                .replace(ONE, many);
            assert_eq!(source(lua), picked);
            assert_ne!(source(lua), written);
        }
        for (lua, many) in [
            (&*PERMITS_RELEASE_MANY, &*PERMITS_RELEASE),
            (&*PERMITS_RENEW_MANY, &*PERMITS_RENEW),
        ] {
            assert_eq!(source(lua), source(many).replace(ONE, MANY));
        }
    }

    /// A fresh holder's acquire looks for its own hold only when sent again: its first
    /// send on one server cannot find it; a cluster client sends again by itself.
    #[test]
    fn only_a_fresh_holders_first_send_skips_looking_for_its_hold() {
        let key = crate::key::KeySpace::default().key("first").unwrap();
        let holder = Holder::new("client", 1);
        let ask = |fresh| Acquire {
            key: &key,
            holder: &holder,
            lease: Duration::from_secs(30),
            how: How::Plain,
            fresh,
            fenced: true,
            waiting: false,
        };
        let variant = |cluster| Variant {
            notices: Notices::Classic,
            cluster,
            functions: false,
        };
        let mut first = acquire(&ask(true), variant(false));
        assert_eq!(words(&first)[0], ACQUIRE.get_hash());
        let before = words(&first);
        first.again(variant(false));
        let again = words(&first);
        assert_eq!(again[0], ACQUIRE_AGAIN.get_hash());
        assert_eq!(again[1..], before[1..], "the same keys and arguments");
        let cluster = acquire(&ask(true), variant(true)).sent(true);
        let clustered = ACQUIRE_AGAIN.clustered.as_ref().unwrap();
        assert_eq!(words(&cluster)[0], clustered.script.get_hash());
        let given = acquire(&ask(false), variant(false));
        assert_eq!(words(&given)[0], ACQUIRE_GIVEN.get_hash());
    }

    /// An attempt after a refusal runs the variant whose refusal marks the lock, and keeps
    /// to it when sent again; in Redisson's layout, whose waiters leave no mark, it runs
    /// the plain one. A release sent as plain commands deletes the mark with the holder,
    /// and its count tells which it found.
    #[test]
    fn a_waiting_attempt_marks_the_lock_and_a_release_deletes_the_mark() {
        let space = |layout| crate::key::KeySpace {
            layout,
            ..Default::default()
        };
        let key = space(crate::KeyLayout::Tagged).key("marked").unwrap();
        let redisson = space(crate::KeyLayout::Redisson).key("marked").unwrap();
        let holder = Holder::new("client", 1);
        let ask = |key, fresh| Acquire {
            key,
            holder: &holder,
            lease: Duration::from_secs(30),
            how: How::Plain,
            fresh,
            fenced: true,
            waiting: true,
        };
        let variant = Variant {
            notices: Notices::Classic,
            cluster: false,
            functions: false,
        };
        let mut waiting = acquire(&ask(&key, true), variant);
        assert_eq!(words(&waiting)[0], ACQUIRE_WAITING.get_hash());
        waiting.again(variant);
        assert_eq!(words(&waiting)[0], ACQUIRE_AGAIN_WAITING.get_hash());
        let given = acquire(&ask(&key, false), variant);
        assert_eq!(words(&given)[0], ACQUIRE_GIVEN_WAITING.get_hash());
        let unmarked = acquire(&ask(&redisson, true), variant);
        assert_eq!(words(&unmarked)[0], ACQUIRE.get_hash());
        let lease = Duration::from_secs(30);
        let all = |key: &Key, waiting| {
            let keys = [key.clone()];
            acquire_all(keys.iter(), &holder, lease, (true, waiting), variant)
        };
        assert_eq!(words(&all(&key, true))[0], MULTI_ACQUIRE_WAITING.get_hash());
        assert_eq!(words(&all(&key, false))[0], MULTI_ACQUIRE.get_hash());
        assert_eq!(words(&all(&redisson, true))[0], MULTI_ACQUIRE.get_hash());

        let hold = |key: &Key| Hold {
            kind: HoldKind::PLAIN,
            key: key.clone(),
            holder: holder.clone(),
        };
        let release = release_alone(&hold(&key), Reentries::None, false, variant);
        assert_eq!(words(&release)[1..], [holder.id(), MARKS[0], MARKS[1]]);
        assert!(release.then.is_none(), "the notice follows only a mark");
        let release = release_alone(&hold(&redisson), Reentries::None, false, variant);
        assert_eq!(words(&release)[1..], [holder.id()]);
        for (deleted, answer) in [
            (0, (Released::NotHeld, false)),
            (1, (Released::Freed, false)),
            (2, (Released::NotHeld, true)),
            (3, (Released::Freed, true)),
        ] {
            assert_eq!(released_alone(deleted, &key), answer, "{deleted}");
        }
        assert_eq!(released_alone(2, &redisson), (Released::Freed, false));
    }

    /// Where the server has functions the plain take (and a semaphore's acquire) goes as
    /// `FCALL` of the function named by its variant's digest, with the keys and arguments
    /// of its `EVALSHA`; a send again keeps to functions; every other script stays a
    /// script. Its library's third line is the script's first, as errors are read.
    #[test]
    fn the_plain_take_is_a_function_where_the_server_has_them() {
        let key = crate::key::KeySpace::default().key("function").unwrap();
        let holder = Holder::new("client", 1);
        let ask = Acquire {
            key: &key,
            holder: &holder,
            lease: Duration::from_secs(30),
            how: How::Plain,
            fresh: true,
            fenced: true,
            waiting: false,
        };
        let variant = |functions| Variant {
            notices: Notices::Classic,
            cluster: false,
            functions,
        };
        let script = acquire(&ask, variant(false));
        let mut function = acquire(&ask, variant(true));
        assert_eq!(command(&script), "EVALSHA");
        assert_eq!(command(&function), "FCALL");
        assert_eq!(
            words(&function)[0],
            format!("lockwarden_{}", ACQUIRE.get_hash())
        );
        assert_eq!(words(&function)[1..], words(&script)[1..]);
        assert_eq!(function.what.to_string(), "FCALL (of acquire.lua)");
        function.again(variant(true));
        assert_eq!(command(&function), "FCALL");
        assert_eq!(
            words(&function)[0],
            format!("lockwarden_{}", ACQUIRE_AGAIN.get_hash())
        );
        let hold = Hold {
            kind: HoldKind::PLAIN,
            key: key.clone(),
            holder: holder.clone(),
        };
        assert_eq!(command(&release(&hold, Some(7), variant(true))), "EVALSHA");
        // A semaphore's acquire goes as a function too, and its send again keeps to one.
        let asked = PermitsAsked {
            permits: 1,
            capacity: 5,
            fifo: false,
            register: Duration::from_secs(30),
            queued: false,
        };
        let permits = Acquire {
            how: How::Permits(asked),
            ..ask
        };
        assert_eq!(command(&acquire(&permits, variant(false))), "EVALSHA");
        let mut function = acquire(&permits, variant(true));
        assert_eq!(command(&function), "FCALL");
        assert_eq!(
            words(&function)[0],
            format!("lockwarden_{}", PERMITS_ACQUIRE.get_hash())
        );
        function.again(variant(true));
        assert_eq!(
            words(&function)[0],
            format!("lockwarden_{}", PERMITS_ACQUIRE_AGAIN.get_hash())
        );

        let load = ACQUIRE.load(variant(true));
        let texts: Vec<String> = load
            .args_iter()
            .filter_map(|arg| match arg {
                redis::Arg::Simple(bytes) => Some(String::from_utf8_lossy(bytes).into_owned()),
                _ => None,
            })
            .collect();
        assert_eq!(texts[..2], ["FUNCTION", "LOAD"]);
        let library = &texts[2];
        let name = format!("lockwarden_{}", ACQUIRE.get_hash());
        assert!(
            library.starts_with(&format!("#!lua name={name}\n")),
            "{library}"
        );
        let first = library.lines().nth(FUNCTION_FIRST_LINE - 1).unwrap();
        assert_eq!(Some(first), ACQUIRE.script.source.lines().next());
        let (lua, before) = by_function(&name).unwrap();
        assert!(std::ptr::eq(lua, &*ACQUIRE));
        assert_eq!(before, FUNCTION_FIRST_LINE - 1);
        assert!(by_function(&format!("lockwarden_{}", RELEASE.get_hash())).is_none());
        assert!(matches!(
            load_functions(variant(false)).args_iter().next(),
            Some(redis::Arg::Simple(b"FUNCTION"))
        ));
    }

    /// The command a call sends.
    fn command(call: &Call) -> String {
        match call.cmd.args_iter().next() {
            Some(redis::Arg::Simple(bytes)) => String::from_utf8_lossy(bytes).into_owned(),
            _ => String::new(),
        }
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
        let variant = |notices, cluster| Variant {
            notices,
            cluster,
            functions: false,
        };
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
