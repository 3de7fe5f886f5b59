//! The Redis lock store: the store contract kept by the Lua scripts of `lua/` (and, for
//! the release of a hold nobody can have re-entered, two plain commands).
//!
//! | file | owns |
//! |---|---|
//! | `mod.rs` | [`RedisStore`]: the contract, its connections and background tasks |
//! | `scripts.rs` | every script, the keys and arguments of each call, the replies |
//! | `commands.rs` | sending calls, one at a time or pipelined, reloading lost scripts |
//! | `orphan.rs` | giving back what an abandoned acquire took |
//! | `replicated.rs` | `WAIT` after an acquire, on a connection of its own |
//! | `multi.rs` | several locks at once, slot by slot on a cluster |
//! | `permissions.rs` | the check at connect that the user may run every command needed |
//! | `rate.rs` | a rate decision: its call and its reply |
//! | `explain.rs` | what a Redis error means: a TLS failure, an ACL refusal naming its command |
//! | `functions.rs` | whether the plain take and a semaphore's acquire and release go as Redis functions, found at connect |
//! | `conn.rs` | where commands go: one server, a cluster, or the primary Sentinel names |
//! | `sentinel.rs` | following the primary across failovers |
//! | `pubsub.rs` | the client's one pub/sub connection, which wakes waiters |
//! | `timeout.rs` | the bound on every command |
//! | `tls.rs` | TLS settings for `rediss://` URLs, applied to every connection |
//! | `turns.rs` | a given holder's counting calls, one at a time on a cluster |
//! | `contended.rs` | the semaphores and locks whose last release left waiters: a semaphore released by script, a lock with its notice |

mod commands;
mod conn;
mod contended;
mod credentials;
mod explain;
mod functions;
mod multi;
mod notices;
mod orphan;
mod permissions;
mod pubsub;
mod rate;
mod replicated;
mod scripts;
mod sentinel;
mod timeout;
mod tls;
mod turns;

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use tokio_util::task::AbortOnDropHandle;

use crate::error::BackendError;
use crate::finish::Finish;
use crate::hold::{Exclusive, Hold, HoldKind};
use crate::holder::Holder;
use crate::key::Key;
use crate::store::contract::{
    Acquire, AcquireAll, Attempt, Debts, LockStore, MultiAttempt, Outcome, PermitsState, RateAsk,
    Reentries, Released, Renewal, Renewed, Result, Waiter,
};
use crate::waiters::Waiters;
use commands::Commands;
pub(crate) use conn::Deployment;
pub(crate) use credentials::Credentials;
use notices::Notices;
pub use notices::ReleaseNotices;
pub(crate) use permissions::PROBE;
use replicated::Replicated;
use scripts::{Reply, Variant};
pub(crate) use timeout::bounded;
pub(crate) use tls::{redact, Tls};

/// How the store talks to Redis.
#[derive(Debug, Clone)]
pub(crate) struct ConnectOptions {
    /// How long one command may take.
    pub(crate) command_timeout: Duration,
    /// `Some((n, wait))`: every acquisition waits up to `wait` for `n` replicas.
    pub(crate) replicas: Option<(u32, Duration)>,
    /// How `rediss://` connections are secured.
    pub(crate) tls: Tls,
    /// Whether connecting checks that the user may run every command needed.
    pub(crate) check_permissions: bool,
    /// Which release notices a cluster client uses: sharded (`SPUBLISH`), classic, or
    /// sharded when every master has them.
    pub(crate) notices: ReleaseNotices,
}

/// The Redis store; clones share its connections. Its background tasks (the pub/sub
/// listener, the release of dropped guards) end with the last clone.
#[derive(Clone)]
pub(crate) struct RedisStore {
    commands: Commands,
    /// Set when acquisitions wait for replicas (`WAIT`).
    replicated: Option<Replicated>,
    /// Holds of dropped guards, released in batches by a task of their own.
    dropped: mpsc::UnboundedSender<Queued>,
    /// This client's waiters: a semaphore whose line has some of them is released by the
    /// script that grants in the same step (see [`RedisStore::release_permits`]), a plain
    /// lock with its notice (see [`RedisStore::release_alone`]).
    waiters: Arc<Waiters>,
    /// The semaphores and locks whose last release left waiters (of any client): released
    /// so too.
    contended: Arc<contended::Contended>,
    _listener: Arc<AbortOnDropHandle<()>>,
}

impl RedisStore {
    /// Connects to `deployment`, checking the user's permissions on `probe`'s key and
    /// channel if given; its pub/sub connection subscribes to the channels of `waiters`
    /// (told of changes through `changes`) and wakes them.
    pub(crate) async fn connect(
        deployment: &Deployment,
        options: &ConnectOptions,
        probe: Option<&Key>,
        waiters: Arc<Waiters>,
        changes: mpsc::UnboundedReceiver<Arc<str>>,
    ) -> Result<Self> {
        let timeout = options.command_timeout;
        // Every call on it goes through `Commands`, which bounds it.
        let (conn, source) = deployment.connect(timeout, None, &options.tls).await?;
        let notices = match (conn.is_cluster(), options.notices) {
            (false, _) | (true, ReleaseNotices::Classic) => Notices::Classic,
            (true, asked) => {
                let hello = bounded(timeout, conn.on_every_master(redis::cmd("HELLO"))).await?;
                Notices::on_cluster(asked, &hello)?
            }
        };
        let mut commands = Commands {
            conn,
            timeout,
            notices,
            functions: false,
        };
        // Without the check (a user meant for some operations only) the take stays a
        // script: nothing is loaded, nothing refused.
        if let Some(probe) = probe {
            let permitted =
                permissions::check(&commands, probe, options.replicas.is_some()).await?;
            commands.functions = permitted.functions && functions::load(&commands).await?;
        }
        let replicated = match options.replicas {
            None => None,
            Some((n, wait)) => {
                let (conn, _) = deployment
                    .connect(timeout, Some(timeout + wait), &options.tls)
                    .await?;
                Some(Replicated::new(conn, n, wait))
            }
        };
        let listener = tokio::spawn(pubsub::run(source, notices, waiters.clone(), changes));
        let (dropped, queue) = mpsc::unbounded_channel();
        tokio::spawn(release_dropped(commands.clone(), queue));
        Ok(Self {
            commands,
            replicated,
            dropped,
            waiters,
            contended: Arc::default(),
            _listener: Arc::new(AbortOnDropHandle::new(listener)),
        })
    }

    /// Releases a semaphore's hold of `permits` (its holder made for it: nobody else can
    /// have touched it). Where this client has waiters of the semaphore, or its last
    /// release left waiters in line (it is contended), by `permits_release.lua`, which
    /// grants what it frees in the same step. Otherwise as plain commands
    /// (`scripts::release_permits_alone`), and only if that finds waiters in line (of other
    /// clients) the grant after it; the next release then goes by the script.
    async fn release_permits(
        &self,
        hold: &Hold,
        (permits, lease): (u32, Duration),
        token: Option<u64>,
    ) -> Result<Released> {
        let key = &hold.key;
        // Sent again if its connection broke: the token tells a second run's "not held"
        // from a hold that was lost.
        let resend = token.is_some();
        if self.waiters.is_wanted(key.names().granted()) || self.contended.seen(key.redis_key()) {
            let call = scripts::release(hold, token, self.commands.variant()).resendable(resend);
            return match self.commands.run(call).await {
                Ok(reply) => {
                    self.contended
                        .note(key.redis_key(), scripts::permits_left_waiting(reply));
                    Ok(scripts::permits_released(reply, token))
                }
                // The name holds a lock of another kind: this hold is gone.
                Err(BackendError::Redis(error)) if explain::wrong_type(&error) => {
                    Ok(Released::NotHeld)
                }
                Err(error) => Err(error),
            };
        }
        let pipe = scripts::release_permits_alone(key, permits, lease, &hold.holder);
        let (removed, waiting) = match self
            .commands
            .run_pipe::<(i64, i64, i64)>(pipe, resend)
            .await
        {
            Ok((removed, _, waiting)) => (removed, waiting),
            // The name holds a lock of another kind: this hold is gone.
            Err(BackendError::Redis(e)) if explain::wrong_type(&e) => (0, 0),
            Err(e) => return Err(e),
        };
        if waiting > 0 {
            // Waiters of other clients: what the release freed is theirs, granted now. A
            // grant that fails fails the release, which, sent again, finds its hold gone
            // (and ended, by its token) and grants again; left alone, the waiters get the
            // permits at their next attempt (when a lease could have run out, and every
            // half registration).
            let grant = scripts::grant_permits(key, self.commands.variant());
            let left: i64 = self.commands.run(grant).await?;
            self.contended
                .note(key.redis_key(), scripts::permits_left_waiting(left));
        }
        if removed > 0 {
            return Ok(Released::Freed);
        }
        // Not held: ended if nobody took permits since the hold's token (this release ran
        // before, or the hold ran out with nobody after it). One more round trip, only
        // when the hold was gone.
        let Some(token) = token else {
            return Ok(Released::NotHeld);
        };
        let last: Option<u64> = self.commands.run(scripts::last_token(key)).await?;
        Ok(scripts::permits_released(
            -1 - last.unwrap_or(0) as i64,
            Some(token),
        ))
    }

    /// Releases a plain hold nobody can have re-entered (see [`Reentries::None`]) without
    /// a script.
    async fn release_alone(
        &self,
        hold: &Hold,
        token: Option<u64>,
        reentries: Reentries,
    ) -> Result<Released> {
        let key = &hold.key;
        // The notice goes with the delete (one round trip) where someone is known to wait:
        // a waiter of this client, one whose mark the last release here found, or any in a
        // layout without marks. Otherwise it follows only if the delete finds a mark.
        let seen = key.has_marks() && self.contended.seen(key.redis_key());
        let notify = !key.has_marks() || seen || self.waiters.is_wanted(key.channel());
        // Sent again if its connection broke: the count was 1, and the token tells a
        // second run's "not held" from a hold that was lost.
        let call = scripts::release_alone(hold, reentries, notify, self.commands.variant())
            .resendable(token.is_some());
        let (released, marked) = scripts::released_alone(self.commands.run(call).await?, key);
        if marked != seen && key.has_marks() {
            self.contended.note(key.redis_key(), marked);
        }
        if marked && !notify {
            self.notify(key).await?;
        }
        if released == Released::Freed {
            return Ok(released);
        }
        // Not held: as `release.lua` tells it, ended if nobody took the lock since the
        // hold's token (this release ran before, or the hold ran out with nobody after
        // it). One more round trip, only when the hold was gone.
        let Some(token) = token else {
            return Ok(Released::NotHeld);
        };
        let last: Option<String> = self.commands.run(scripts::last_token(key)).await?;
        if last != Some(token.to_string()) {
            return Ok(Released::NotHeld);
        }
        // Ran before, its answer lost: that run may have deleted a mark unseen.
        if !notify {
            self.notify(key).await?;
        }
        Ok(Released::Ended)
    }

    /// Sends `key`'s release notice after a release that found a waiter's mark (sent
    /// again if its connection broke: a second notice only makes a waiter try once more).
    /// Its error is the release's, as when the notice went with the delete: the lock is
    /// free, and a release settled again after a failure sends the notice once more.
    async fn notify(&self, key: &Key) -> Result<()> {
        let mut pipe = redis::Pipeline::with_capacity(1);
        pipe.add_command(scripts::notice(key, self.commands.variant()));
        self.commands.run_pipe::<(i64,)>(pipe, true).await?;
        Ok(())
    }
}

impl LockStore for RedisStore {
    fn name(&self) -> &'static str {
        "redis"
    }

    async fn acquire(&self, ask: &Acquire<'_>) -> Result<Attempt> {
        let call = scripts::acquire(ask, self.commands.variant());
        let what = call.what;
        let hold = Hold {
            kind: ask.how.kind(ask.lease),
            key: ask.key.clone(),
            holder: ask.holder.clone(),
        };
        // If the caller goes away (or a bound of ours runs out) while the script is in
        // flight, what it took is given back once its reply is in. A call redis-rs gave
        // up on (a cluster's) has no reply to come: the acquire loop settles it.
        let answer = match &self.replicated {
            None => {
                let reply = self.commands.send::<Reply>(call);
                let undo = orphan::give_back(self.commands.clone(), hold, ask.waiter());
                self.commands.within(Finish::new(reply).or_undo(undo)).await
            }
            Some(replicated) => {
                let limit = self.commands.timeout + replicated.timeout();
                let reply = replicated.acquire(call, self.commands.clone(), hold.clone());
                let undo = orphan::give_back(self.commands.clone(), hold, ask.waiter());
                bounded(limit, Finish::new(reply).or_undo(undo)).await
            }
        };
        let answer = match answer {
            // A key of another type holds the name: a semaphore's set (a lock's hash is
            // what every other kind reads). Refused until it could run out, as a lock of
            // another kind is.
            Err(BackendError::Redis(error)) if explain::wrong_type(&error) => {
                let ms: i64 = self.commands.run(scripts::pttl_of(ask.key)).await?;
                return Ok(Attempt::Busy {
                    ttl: scripts::pttl(ms),
                });
            }
            answer => answer.map_err(|error| explain::naming(error, what))?,
        };
        if let Reply::NotReplicated(acknowledged) = answer {
            return Err(BackendError::NotReplicated {
                acknowledged,
                wanted: self.replicated.as_ref().map_or(0, Replicated::replicas),
            });
        }
        scripts::attempted(ask.how, answer)
    }

    async fn acquire_all(&self, ask: &AcquireAll<'_>) -> Result<MultiAttempt> {
        multi::acquire_all(&self.commands, self.replicated.as_ref(), ask).await
    }

    async fn release(
        &self,
        hold: &Hold,
        token: Option<u64>,
        reentries: Reentries,
    ) -> Result<Released> {
        if alone(hold, reentries, self.commands.variant()) {
            return self.release_alone(hold, token, reentries).await;
        }
        if let HoldKind::Permits { permits, lease } = hold.kind {
            return self.release_permits(hold, (permits, lease), token).await;
        }
        // A hold nobody can have re-entered (its count was 1) is released once however
        // often its release runs; any other release would count down twice.
        let once = reentries != Reentries::Possible && token.is_some();
        let call = scripts::release(hold, token, self.commands.variant()).resendable(once);
        let left = self.commands.run(call).await?;
        Ok(scripts::released(left))
    }

    fn release_later(&self, hold: Hold, resend_until: Option<Instant>, reentries: Reentries) {
        // Refused only once the release task has ended, which it does only after the
        // last clone of the store (this one included) is gone.
        let _ = self.dropped.send(Queued::Release(Dropped {
            hold,
            resend_until,
            reentries,
        }));
    }

    async fn flush(&self) {
        let (flushed, answered) = oneshot::channel();
        if self.dropped.send(Queued::Flush(flushed)).is_ok() {
            // An error: the task ended, with nothing left to send.
            let _ = answered.await;
        }
    }

    async fn complete(
        &self,
        hold: &Hold<Exclusive>,
        token: Option<u64>,
        outcome: Outcome<'_>,
    ) -> Result<Released> {
        let call = scripts::complete(hold, token, outcome, self.commands.variant());
        Ok(scripts::released(self.commands.run(call).await?))
    }

    async fn renew_all(&self, renewals: &[Renewal]) -> Renewed {
        let variant = self.commands.variant();
        let piped = self
            .commands
            .pipelined(
                renewals,
                |r| r.hold.key.redis_key(),
                |r| scripts::renew(r, variant),
            )
            .await;
        let held = piped.replies.into_iter();
        Renewed {
            held: held.map(|renewed| renewed.map(|n| n == 1)).collect(),
            error: piped.error,
        }
    }

    async fn withdraw(&self, waiter: Waiter, key: &Key, holder: &Holder) -> Result<()> {
        let call = scripts::withdraw(waiter, key, holder, self.commands.variant());
        self.commands.run::<i64>(call).await?;
        Ok(())
    }

    async fn force_unlock(&self, key: &Key) -> Result<bool> {
        let deleted: i64 = self
            .commands
            .run(scripts::force_unlock(key, self.commands.variant()))
            .await?;
        Ok(deleted == 1)
    }

    async fn hold_count(&self, hold: &Hold) -> Result<u64> {
        let call = scripts::hold_count(hold, self.commands.variant());
        if let HoldKind::Permits { permits, .. } = hold.kind {
            return Ok(scripts::permits_held(
                self.commands.run(call).await?,
                permits,
            ));
        }
        let count: Option<i64> = self.commands.run(call).await?;
        Ok(count.unwrap_or(0).max(0) as u64)
    }

    async fn remaining_ttl(&self, key: &Key) -> Result<Option<Duration>> {
        let ms: i64 = self.commands.run(scripts::pttl_of(key)).await?;
        Ok(scripts::remaining_ttl(ms))
    }

    async fn queued(&self, key: &Key) -> Result<usize> {
        self.commands.run(scripts::queue_length(key)).await
    }

    async fn waiting_writers(&self, key: &Key) -> Result<usize> {
        self.commands.run(scripts::waiting_writers(key)).await
    }

    async fn permits(&self, key: &Key) -> Result<Option<PermitsState>> {
        let call = scripts::permits(key, self.commands.variant());
        match self.commands.run::<Vec<i64>>(call).await {
            Ok(reply) => scripts::permits_state(&reply),
            // A lock of another kind holds the name: no semaphore is in use.
            Err(BackendError::Redis(error)) if explain::wrong_type(&error) => Ok(None),
            Err(error) => Err(error),
        }
    }

    async fn set_capacity(&self, key: &Key, capacity: u32) -> Result<bool> {
        let call = scripts::set_capacity(key, capacity, self.commands.variant());
        match self.commands.run::<i64>(call).await {
            Ok(changed) => Ok(changed == 1),
            Err(BackendError::Redis(error)) if explain::wrong_type(&error) => Ok(false),
            Err(error) => Err(error),
        }
    }

    async fn fenced_write(&self, key: &Key, token: u64, value: &[u8]) -> Result<Option<u64>> {
        let reply: Vec<i64> = self
            .commands
            .run(scripts::fenced_write(
                key,
                token,
                value,
                self.commands.variant(),
            ))
            .await?;
        scripts::fenced_written(&reply)
    }

    async fn fenced_read(&self, key: &Key) -> Result<Option<(u64, Vec<u8>)>> {
        let (token, value): (Option<u64>, Option<Vec<u8>>) =
            self.commands.run(scripts::fenced_read(key)).await?;
        Ok(token.zip(value))
    }

    async fn rate(&self, ask: &RateAsk<'_>) -> Result<Debts> {
        let reply = self
            .commands
            .run(rate::decide(ask, self.commands.variant()));
        rate::decided(reply.await?, ask.policies.len())
    }
}

/// Whether `hold` is released without a script (see [`Reentries::None`]).
fn alone(hold: &Hold, reentries: Reentries, variant: Variant) -> bool {
    // On a cluster a hold handed out may have an `:op` field, whose `HDEL` count a mark's
    // would confuse (`scripts::release_alone`).
    let counted = variant.cluster && reentries == Reentries::NoneLeft && hold.key.has_marks();
    reentries != Reentries::Possible && hold.kind == HoldKind::PLAIN && !counted
}

/// What the release task of dropped guards is given.
enum Queued {
    Release(Dropped),
    /// Answered once every release queued before it was answered or given up on.
    Flush(oneshot::Sender<()>),
}

/// The hold of a dropped guard, queued for release.
struct Dropped {
    hold: Hold,
    /// Until when its release may be sent again (see `LockStore::release_later`).
    resend_until: Option<Instant>,
    reentries: Reentries,
}

/// Releases dropped guards' holds, all that queued up meanwhile in one pipeline. A batch
/// that gets no answer is sent again, after a backoff and with what queued up meanwhile,
/// for the holds whose release may be resent (see `settle.rs`); the others expire with
/// their leases.
async fn release_dropped(commands: Commands, mut queue: mpsc::UnboundedReceiver<Queued>) {
    const MIN_BACKOFF: Duration = Duration::from_millis(20);
    const MAX_BACKOFF: Duration = Duration::from_millis(500);
    let (mut batch, mut queued, mut flushes) = (Vec::new(), Vec::new(), Vec::new());
    let mut backoff = MIN_BACKOFF;
    loop {
        if batch.is_empty() {
            // Everything queued before these flushes was answered or given up on.
            for flushed in flushes.drain(..) {
                let _: Result<(), ()> = oneshot::Sender::send(flushed, ());
            }
            if queue.recv_many(&mut queued, 1024).await == 0 {
                return;
            }
        } else {
            tokio::time::sleep(backoff).await;
            while let Ok(next) = queue.try_recv() {
                queued.push(next);
            }
        }
        for next in queued.drain(..) {
            match next {
                Queued::Release(dropped) => batch.push(dropped),
                Queued::Flush(flushed) => flushes.push(flushed),
            }
        }
        if batch.is_empty() {
            continue;
        }
        let piped = commands
            .pipelined(
                &batch,
                |dropped| dropped.hold.key.redis_key(),
                |Dropped {
                     hold, reentries, ..
                 }| match alone(hold, *reentries, commands.variant()) {
                    // The notice always goes with the delete: a batch has no second round
                    // trip to send it after a mark.
                    true => scripts::release_alone(hold, *reentries, true, commands.variant()),
                    false => scripts::release(hold, None, commands.variant()),
                },
            )
            .await;
        for (
            Dropped {
                hold, reentries, ..
            },
            reply,
        ) in batch.iter().zip(&piped.replies)
        {
            let alone = alone(hold, *reentries, commands.variant());
            let released = reply.map(|reply| match (alone, hold.kind) {
                (true, _) => scripts::released_alone(reply, &hold.key).0,
                (false, HoldKind::Permits { .. }) => scripts::permits_released(reply, None),
                (false, _) => scripts::released(reply),
            });
            if released == Some(Released::NotHeld) {
                tracing::debug!(key = %hold.key, "dropped guard's lock was no longer held");
            }
        }
        let Some(error) = piped.error else {
            batch.clear();
            backoff = MIN_BACKOFF;
            continue;
        };
        // Only the releases that got no answer are left to settle.
        let mut answered = piped.replies.iter().map(Option::is_some);
        batch.retain(|_| !answered.next().unwrap_or(false));
        let (failed, retry_by) = (batch.len(), Instant::now() + backoff);
        batch.retain(|dropped| {
            error.is_transient() && dropped.resend_until.is_some_and(|until| retry_by < until)
        });
        tracing::warn!(%error, locks = failed, resent = batch.len(),
            "could not release dropped guards; those that may be are sent again, \
             the others expire with their leases");
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}
