//! Local waiters per release channel: who is waiting, and waking one of them.
//!
//! The acquire loop registers its waiters here and sleeps on them; the store wakes them.
//! The Redis store has one pub/sub connection per client (`store/redis/pubsub.rs`) that
//! subscribes to a channel while it has waiters here and calls [`Waiters::notify_one`] for
//! each release notice ([`Waiters::notify_all`] for a completed claim, whose outcome every
//! waiter can use, and for a read-write lock opened by a force unlock, which all may try;
//! [`Waiters::grant`] for a lock a release handed to named waiters: a fair lock's head, a
//! read-write lock's waiting readers); the in-process store calls them directly.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tokio::sync::{mpsc, watch, Notify};
use tokio::time::Instant;

use crate::error::BackendError;
use crate::metrics;

#[derive(Default)]
pub(crate) struct Waiters {
    channels: Mutex<HashMap<Arc<str>, Entry>>,
    /// Told the name of each channel that gained its first or lost its last waiter.
    changes: Option<mpsc::UnboundedSender<Arc<str>>>,
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
    /// Locks handed to this channel's waiters on release: holder id to fencing token.
    grants: Mutex<HashMap<Box<str>, u64>>,
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
        Self::default()
    }

    /// A registry whose channels are ready once a listener says so; the receiver is told
    /// the name of each channel that gained its first or lost its last waiter, for the
    /// listener to (un)subscribe.
    pub(crate) fn remote() -> (Self, mpsc::UnboundedReceiver<Arc<str>>) {
        let (changes, listener) = mpsc::unbounded_channel();
        let waiters = Self {
            channels: Mutex::default(),
            changes: Some(changes),
        };
        (waiters, listener)
    }

    fn channels(&self) -> MutexGuard<'_, HashMap<Arc<str>, Entry>> {
        // The map is left consistent at every await-free step, so a poisoned lock is usable.
        self.channels.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Registers one waiter on `channel` until the returned handle is dropped.
    pub(crate) fn register(self: &Arc<Self>, channel: &str) -> Waiting {
        let mut channels = self.channels();
        let (name, shared) = match channels.get_mut(channel) {
            Some(entry) => {
                entry.waiters += 1;
                (entry.name.clone(), entry.shared.clone())
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
                    grants: Mutex::default(),
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
                (name, shared)
            }
        };
        metrics::waiters(1.0);
        Waiting {
            registry: self.clone(),
            name,
            everyone: Mutex::new(shared.everyone.subscribe()),
            shared,
        }
    }

    /// Wakes one local waiter of `channel`, if any (others wait for their own notice).
    pub(crate) fn notify_one(&self, channel: &str) {
        if let Some(entry) = self.channels().get(channel) {
            entry.shared.notify.notify_one();
        }
    }

    /// Hands a lock a release granted to `holders` (a fair lock's head, on a channel of
    /// its own; a read-write lock's admitted readers, on the readers' channel) with its
    /// fencing `token`, and wakes the channel's waiters (each takes its own grant).
    pub(crate) fn grant<'h>(
        &self,
        channel: &str,
        token: u64,
        holders: impl Iterator<Item = &'h str>,
    ) {
        if let Some(entry) = self.channels().get(channel) {
            entry
                .shared
                .grants
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .extend(holders.map(|holder| (holder.into(), token)));
            entry.shared.everyone.send_replace(());
        }
    }

    /// The token of a lock granted to `holder` on `channel`, once.
    pub(crate) fn take_grant(&self, channel: &str, holder: &str) -> Option<u64> {
        let channels = self.channels();
        let mut grants = channels
            .get(channel)?
            .shared
            .grants
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        grants.remove(holder)
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

    /// Number of channels with waiters (for tests and metrics).
    pub(crate) fn len(&self) -> usize {
        self.channels().len()
    }
}

/// One registered waiter; deregisters on drop.
pub(crate) struct Waiting {
    registry: Arc<Waiters>,
    name: Arc<str>,
    shared: Arc<Channel>,
    /// Remembers which notices for everyone this waiter has seen.
    everyone: Mutex<watch::Receiver<()>>,
}

impl Waiting {
    /// The channel this waiter is registered on.
    pub(crate) fn channel(&self) -> &str {
        &self.name
    }

    /// Resolves on a release notice for this channel: one meant for one waiter, or one for
    /// everyone sent since the last call returned.
    pub(crate) async fn notified(&self) {
        let mut everyone = self.everyone().clone();
        tokio::select! {
            _ = self.shared.notify.notified() => {}
            _ = everyone.changed() => {}
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
