//! Local waiters per release channel: who is waiting, and waking them.
//!
//! The acquire loop registers its waiters here and sleeps on them; the store wakes them
//! with [`Waiters::deliver`], the one function that turns a [`Notice`] into wake-ups: the
//! Redis store's pub/sub connection (`store/redis/pubsub.rs`, which subscribes to a channel
//! while it has waiters here) for each notice it reads, the in-process store for each it
//! makes. A release wakes one waiter; a completed claim (whose outcome every waiter can
//! use) or a lock a force unlock opened, every waiter; a lock or permits a release handed
//! to named waiters (a fair lock's head, a read-write lock's waiting readers, a
//! semaphore's line), each of them alone, with its grant.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use futures_util::FutureExt;
use tokio::sync::{mpsc, watch, Notify};
use tokio::time::Instant;

use crate::error::BackendError;
use crate::metrics;
use crate::notice::Notice;

pub(crate) struct Waiters {
    channels: Mutex<HashMap<Arc<str>, Entry>>,
    /// Set when the client shuts down: the acquire loop then takes no lock (see
    /// [`Waiters::close`]).
    closed: AtomicBool,
    /// Told the name of each channel that gained its first or lost its last waiter.
    changes: Option<mpsc::UnboundedSender<Arc<str>>>,
    /// The client's id, random: the first half of every holder id it makes. A notice
    /// naming holders names every client's (readers' admissions do), and only this
    /// client's are kept for a waiter not registered yet.
    client: Box<str>,
}

struct Entry {
    name: Arc<str>,
    shared: Arc<Channel>,
    waiters: usize,
}

struct Channel {
    notify: Notify,
    /// Bumped for a notice meant for every waiter. A watch, not `Notify::notify_waiters`,
    /// so a waiter between two attempts sees it too.
    everyone: watch::Sender<()>,
    /// Whether release notices for this channel are being received.
    ready: watch::Sender<Readiness>,
    /// The waiters that wait as a named holder (fair, read), by holder id: a release may
    /// hand one the lock, or wake it alone.
    named: Mutex<HashMap<Box<str>, Named>>,
}

/// The waiters of one channel that wait as one holder.
#[derive(Default)]
struct Named {
    /// How many are registered (several tasks may wait as one given holder).
    waiters: usize,
    /// Wakes them (all that sleep, and a permit is kept for one between two sleeps).
    wake: Arc<Notify>,
    /// The fencing token of a lock a release handed to this holder, until taken.
    grant: Option<u64>,
}

/// Whether release notices for a channel are being received.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Readiness {
    /// Not yet (or no longer: the connection is being re-made).
    Pending,
    Ready,
    /// Redis refused the subscription (an ACL user without the command or the channel).
    Refused(Arc<Refusal>),
}

/// Why Redis refused to deliver a channel's notices: the refused command and Redis's text.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Refusal {
    pub(crate) command: String,
    pub(crate) message: String,
}

impl Waiters {
    /// A registry whose channels are always ready (notices are delivered in-process).
    pub(crate) fn local() -> Self {
        Self::new(None)
    }

    /// A registry whose channels are ready once a listener says so; the receiver is told
    /// the name of each channel that gained its first or lost its last waiter, for the
    /// listener to (un)subscribe.
    pub(crate) fn remote() -> (Self, mpsc::UnboundedReceiver<Arc<str>>) {
        let (changes, listener) = mpsc::unbounded_channel();
        (Self::new(Some(changes)), listener)
    }

    fn new(changes: Option<mpsc::UnboundedSender<Arc<str>>>) -> Self {
        Self {
            channels: Mutex::default(),
            closed: AtomicBool::new(false),
            changes,
            client: uuid::Uuid::new_v4().to_string().into(),
        }
    }

    /// The client's id (see [`Holder`](crate::Holder)).
    pub(crate) fn client(&self) -> &str {
        &self.client
    }

    fn channels(&self) -> MutexGuard<'_, HashMap<Arc<str>, Entry>> {
        // The map is left consistent at every await-free step, so a poisoned lock is usable.
        self.channels.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Registers one waiter on `channel`, as `holder` if a release may hand it the lock
    /// by name, until the returned handle is dropped. Also says whether the channel's
    /// notices were being received already, for other waiters: then a notice sent before
    /// this registration reached them (or, a grant to `holder`, waits here), so the
    /// caller need not try again before it sleeps.
    pub(crate) fn register(
        self: &Arc<Self>,
        channel: &str,
        holder: Option<&str>,
    ) -> (Waiting, bool) {
        let mut channels = self.channels();
        let (name, shared, listened) = match channels.get_mut(channel) {
            Some(entry) => {
                entry.waiters += 1;
                let listened = *entry.shared.ready.borrow() == Readiness::Ready;
                (entry.name.clone(), entry.shared.clone(), listened)
            }
            None => {
                let name: Arc<str> = channel.into();
                let shared = Arc::new(Channel {
                    notify: Notify::new(),
                    everyone: watch::Sender::new(()),
                    ready: watch::Sender::new(if self.changes.is_none() {
                        Readiness::Ready
                    } else {
                        Readiness::Pending
                    }),
                    named: Mutex::default(),
                });
                channels.insert(
                    name.clone(),
                    Entry {
                        name: name.clone(),
                        shared: shared.clone(),
                        waiters: 1,
                    },
                );
                if let Some(changes) = &self.changes {
                    let _ = changes.send(name.clone());
                }
                (name, shared, false)
            }
        };
        let holder = holder.map(|holder| {
            let mut named = shared.named();
            let entry = named.entry(holder.into()).or_default();
            entry.waiters += 1;
            (Box::<str>::from(holder), entry.wake.clone())
        });
        drop(channels);
        metrics::waiters(1.0);
        let waiting = Waiting {
            registry: self.clone(),
            name,
            everyone: Mutex::new(shared.everyone.subscribe()),
            shared,
            holder,
        };
        (waiting, listened)
    }

    /// Wakes the waiters of `channel` that `notice` is for.
    pub(crate) fn deliver(&self, channel: &str, notice: Notice<'_>) {
        match notice {
            Notice::Released => self.notify_one(channel),
            Notice::Completed | Notice::Open => self.notify_all(channel),
            Notice::Granted { token, holders } => {
                self.wake_named(channel, holders.ids().map(|holder| (holder, Some(token))));
            }
            Notice::Permits { first, holders } => {
                let tokens = (first..).zip(holders.ids());
                self.wake_named(channel, tokens.map(|(token, holder)| (holder, Some(token))));
            }
            Notice::Turn { holders } => {
                self.wake_named(channel, holders.ids().map(|holder| (holder, None)));
            }
        }
    }

    /// Wakes one local waiter of `channel`, if any (others wait for their own notice).
    pub(crate) fn notify_one(&self, channel: &str) {
        if let Some(entry) = self.channels().get(channel) {
            entry.shared.notify.notify_one();
        }
    }

    /// Wakes the waiters of `channel` that wait as each named holder, handing it its
    /// fencing token if a lock was granted to it.
    fn wake_named<'h>(&self, channel: &str, named: impl Iterator<Item = (&'h str, Option<u64>)>) {
        let Some(shared) = self.channels().get(channel).map(|e| e.shared.clone()) else {
            return;
        };
        let mut waiting = shared.named();
        for (holder, token) in named {
            let ours = holder
                .rsplit_once(':')
                .is_some_and(|(client, _)| client == &*self.client);
            let named = match waiting.get_mut(holder) {
                Some(named) => named,
                // Kept for a waiter of this client that registers next (it was between
                // its attempt and its sleep); another client's is none of ours.
                None if ours => waiting.entry(holder.into()).or_default(),
                None => continue,
            };
            if token.is_some() {
                named.grant = token;
            }
            // Every task waiting as this holder (a given holder may wait in several, and
            // each may go on: the others re-enter), and a permit for one between sleeps.
            named.wake.notify_waiters();
            named.wake.notify_one();
        }
    }

    /// The token of a lock granted to `holder` on `channel`, once.
    pub(crate) fn take_grant(&self, channel: &str, holder: &str) -> Option<u64> {
        let shared = self.channels().get(channel)?.shared.clone();
        let mut named = shared.named();
        let entry = named.get_mut(holder)?;
        let token = entry.grant.take()?;
        // Its wake-up is used up too: the next sleep waits for the next notice.
        let _ = entry.wake.notified().now_or_never();
        Some(token)
    }

    /// Wakes every local waiter of `channel`, including one that is between attempts.
    pub(crate) fn notify_all(&self, channel: &str) {
        if let Some(entry) = self.channels().get(channel) {
            entry.shared.everyone.send_replace(());
        }
    }

    /// Whether `channel` currently has waiters.
    pub(crate) fn is_wanted(&self, channel: &str) -> bool {
        self.channels().contains_key(channel)
    }

    /// Every channel that has waiters.
    pub(crate) fn wanted(&self) -> Vec<Arc<str>> {
        self.channels().keys().cloned().collect()
    }

    pub(crate) fn set_ready(&self, channel: &str, ready: bool) {
        if let Some(entry) = self.channels().get(channel) {
            let ready = if ready {
                Readiness::Ready
            } else {
                Readiness::Pending
            };
            entry.shared.ready.send_replace(ready);
        }
    }

    /// Tells `channel`'s waiters that its notices will not come: Redis refused the
    /// subscription. They fail with the refusal rather than wait without notices.
    pub(crate) fn refuse(&self, channel: &str, refusal: Refusal) {
        if let Some(entry) = self.channels().get(channel) {
            entry
                .shared
                .ready
                .send_replace(Readiness::Refused(Arc::new(refusal)));
        }
    }

    /// Marks every channel not ready (the connection is gone).
    pub(crate) fn set_all_unready(&self) {
        for entry in self.channels().values() {
            entry.shared.ready.send_replace(Readiness::Pending);
        }
    }

    /// Wakes every waiter so each retries (notices may have been missed).
    pub(crate) fn wake_all(&self) {
        for entry in self.channels().values() {
            entry.shared.notify.notify_waiters();
        }
    }

    /// Closes the registry for good (the client shuts down): every waiter is woken, and
    /// the acquire loop, which asks [`is_closed`](Self::is_closed) before each attempt,
    /// ends instead of trying again.
    pub(crate) fn close(&self) {
        self.closed.store(true, Ordering::Relaxed);
        for entry in self.channels().values() {
            entry.shared.everyone.send_replace(());
        }
    }

    /// Whether the client shut down.
    pub(crate) fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Relaxed)
    }

    /// Number of channels with waiters (for tests and metrics).
    pub(crate) fn len(&self) -> usize {
        self.channels().len()
    }
}

impl Channel {
    fn named(&self) -> MutexGuard<'_, HashMap<Box<str>, Named>> {
        self.named.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// One registered waiter; deregisters on drop.
pub(crate) struct Waiting {
    registry: Arc<Waiters>,
    name: Arc<str>,
    shared: Arc<Channel>,
    /// Remembers which notices for everyone this waiter has seen.
    everyone: Mutex<watch::Receiver<()>>,
    /// The holder it waits as, and what wakes that holder alone.
    holder: Option<(Box<str>, Arc<Notify>)>,
}

impl Waiting {
    /// The channel this waiter is registered on.
    pub(crate) fn channel(&self) -> &str {
        &self.name
    }

    /// The holder it waits as, if a release may hand it the lock by name.
    pub(crate) fn holder(&self) -> Option<&str> {
        self.holder.as_ref().map(|(holder, _)| &**holder)
    }

    /// Resolves on a release notice for this channel: one meant for one waiter, or one for
    /// everyone sent since the last call returned.
    pub(crate) async fn notified(&self) {
        let mut everyone = self.everyone().clone();
        let named = async {
            match &self.holder {
                Some((_, wake)) => wake.notified().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = self.shared.notify.notified() => {}
            _ = everyone.changed() => {}
            _ = named => {}
        }
        self.everyone().mark_unchanged();
    }

    fn everyone(&self) -> MutexGuard<'_, watch::Receiver<()>> {
        self.everyone.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Waits until release notices for this channel are being received, or `until`.
    /// Returns whether they are; fails if Redis refused the subscription.
    pub(crate) async fn ready_by(&self, until: Instant) -> Result<bool, BackendError> {
        let mut rx = self.shared.ready.subscribe();
        tokio::select! {
            ready = rx.wait_for(|ready| *ready != Readiness::Pending) => match ready.as_deref() {
                Ok(Readiness::Refused(refusal)) => Err(BackendError::NotPermitted {
                    command: refusal.command.clone(),
                    message: refusal.message.clone(),
                }),
                Ok(_) => Ok(true),
                Err(_) => Ok(false),
            },
            _ = tokio::time::sleep_until(until) => Ok(false),
        }
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        metrics::waiters(-1.0);
        if let Some((holder, _)) = &self.holder {
            let mut named = self.shared.named();
            if let Some(entry) = named.get_mut(holder) {
                entry.waiters -= 1;
                // A grant nobody waits for any more goes too: the store takes it back
                // (the waiter withdraws) or lets it run out.
                if entry.waiters == 0 {
                    named.remove(holder);
                }
            }
        }
        let mut channels = self.registry.channels();
        let Some(entry) = channels.get_mut(&self.name) else {
            return;
        };
        entry.waiters -= 1;
        if entry.waiters == 0 {
            channels.remove(&self.name);
            drop(channels);
            if let Some(changes) = &self.registry.changes {
                let _ = changes.send(self.name.clone());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::notice::Holders;

    #[tokio::test]
    async fn a_grant_waits_for_a_waiter_of_this_client_only() {
        let waiters = Arc::new(Waiters::local());
        let ours = format!("{}:7", waiters.client());
        let theirs = "another-client:7";
        // Someone here listens on the channel, so its notices are handled.
        let (_listener, _) = waiters.register("ch", None);
        let named = [ours.as_str(), theirs];
        let holders = Holders::Ids(&named);
        waiters.deliver("ch", Notice::Granted { token: 42, holders });
        assert_eq!(
            waiters.take_grant("ch", theirs),
            None,
            "kept another client's"
        );
        // Ours registers after its grant came: woken at once, and takes it once.
        let (mine, listened) = waiters.register("ch", Some(&ours));
        assert!(listened);
        tokio::time::timeout(Duration::from_secs(1), mine.notified())
            .await
            .expect("woken by its grant");
        assert_eq!(waiters.take_grant("ch", &ours), Some(42));
        assert_eq!(waiters.take_grant("ch", &ours), None);
    }

    #[tokio::test]
    async fn a_grant_wakes_its_holder_alone() {
        let waiters = Arc::new(Waiters::local());
        let (a, b) = (
            format!("{}:1", waiters.client()),
            format!("{}:2", waiters.client()),
        );
        let (wa, _) = waiters.register("ch", Some(&a));
        let (wb, _) = waiters.register("ch", Some(&b));
        fn granted(token: u64, holder: &str) -> Notice<'_> {
            let holders = Holders::Listed(holder);
            Notice::Granted { token, holders }
        }
        waiters.deliver("ch", granted(7, &a));
        tokio::time::timeout(Duration::from_secs(1), wa.notified())
            .await
            .expect("the granted holder is woken");
        let other = tokio::time::timeout(Duration::from_millis(50), wb.notified()).await;
        assert!(other.is_err(), "another holder was woken");
        // Its wake-up is used up with the grant taken: the next sleep waits.
        waiters.deliver("ch", granted(8, &b));
        assert_eq!(waiters.take_grant("ch", &b), Some(8));
        let again = tokio::time::timeout(Duration::from_millis(50), wb.notified()).await;
        assert!(again.is_err(), "woken again by a grant already taken");
    }
}
