//! The client's one watchdog: keeps every hold taken without an explicit lease alive.
//!
//! Guards register here; one task (started with the first registration, stopped with the
//! watchdog) renews all that are due in one pipelined batch every third of the lease, and
//! marks a guard lost when a renewal finds its hold gone or taken, or when renewals keep
//! failing until the lease must have run out.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::AbortOnDropHandle;

use crate::hold::{Hold, HoldMap};
use crate::metrics::{self, LostBecause, Operation, RenewalOutcome};
use crate::store::contract::{LockStore, Renewal, Renewed};
use crate::store::Store;

pub(crate) struct Watchdog {
    holds: Arc<Holds>,
    store: Store,
    task: OnceLock<AbortOnDropHandle<()>>,
}

/// The watched holds, shared with the renewal task.
struct Holds {
    entries: Mutex<HoldMap<Entry>>,
    /// Wakes the task for a hold due before it would wake by itself.
    wake: Notify,
    /// When the task wakes next by itself (`None`: parked until woken, or not started).
    /// Written and read with `entries` locked, so a hold due sooner never misses its wake.
    asleep_until: Mutex<Option<Instant>>,
    lease: Duration,
    generations: AtomicU64,
}

struct Entry {
    /// Guards sharing this hold (re-entries of one holder).
    guards: usize,
    generation: u64,
    lost: CancellationToken,
    due: Instant,
    /// When the lease runs out if no renewal succeeds (counted from when it was sent).
    expires: Instant,
    /// `max_hold`: no renewal beyond this point.
    hold_until: Option<Instant>,
}

/// What a guard keeps to unregister itself.
#[derive(Debug, Clone)]
pub(crate) struct Watched {
    pub generation: u64,
    pub lost: CancellationToken,
}

impl Watchdog {
    /// A watchdog that renews holds for `lease` in `store`.
    pub(crate) fn new(lease: Duration, store: Store) -> Self {
        Self {
            holds: Arc::new(Holds {
                entries: Mutex::default(),
                wake: Notify::new(),
                asleep_until: Mutex::new(None),
                lease,
                generations: AtomicU64::new(0),
            }),
            store,
            task: OnceLock::new(),
        }
    }

    /// The lease every watched hold is renewed for.
    pub(crate) fn lease(&self) -> Duration {
        self.holds.lease
    }

    /// The lease a watched hold is first taken for: the watchdog lease, cut to
    /// `max_hold` when that is shorter (a renewal only ever extends a hold, so the first
    /// lease must not outlast `max_hold` by itself).
    pub(crate) fn first_lease(&self, max_hold: Option<Duration>) -> Duration {
        max_hold.map_or(self.lease(), |d| self.lease().min(d))
    }

    /// Watches a hold acquired with its [`first_lease`](Self::first_lease), the request
    /// sent at `sent`.
    pub(crate) fn register(
        &self,
        hold: &Hold,
        sent: Instant,
        max_hold: Option<Duration>,
    ) -> Watched {
        let expires = sent + self.first_lease(max_hold);
        let due = (sent + self.holds.interval()).min(expires);
        self.watch(hold, due, expires, max_hold.map(|d| sent + d))
    }

    /// Watches a hold granted to this client on release (a fair lock's direct handoff),
    /// which lasts until `expires` without a renewal: renewed after a third of that, as
    /// a hold of the watchdog's own lease is (a short hold is released before).
    pub(crate) fn register_granted(
        &self,
        hold: &Hold,
        expires: Instant,
        max_hold: Option<Duration>,
    ) -> Watched {
        let now = Instant::now();
        let due = now + expires.saturating_duration_since(now) / 3;
        self.watch(hold, due, expires, max_hold.map(|d| now + d))
    }

    fn watch(
        &self,
        hold: &Hold,
        due: Instant,
        expires: Instant,
        hold_until: Option<Instant>,
    ) -> Watched {
        // Started on first use: an in-process client may be made outside a runtime.
        self.task.get_or_init(|| {
            let (holds, store) = (self.holds.clone(), self.store.clone());
            AbortOnDropHandle::new(tokio::spawn(async move { holds.run(store).await }))
        });
        self.holds.register(hold, due, expires, hold_until)
    }

    /// Stops watching for one guard; the hold is no longer renewed once its last guard goes.
    pub(crate) fn unregister(&self, hold: &Hold, generation: u64) {
        self.holds.unregister(hold, generation);
    }

    /// Stops for good (the client shuts down): no hold is renewed any more, and every
    /// watched guard is told its lock is lost (the shutdown releases it).
    pub(crate) fn stop(&self) {
        if let Some(task) = self.task.get() {
            task.abort();
        }
        let stopped = std::mem::take(&mut *self.holds.entries());
        for entry in stopped.into_values() {
            entry.lost.cancel();
        }
    }

    /// Number of holds being kept alive.
    pub(crate) fn len(&self) -> usize {
        self.holds.entries().len()
    }
}

impl Holds {
    fn entries(&self) -> MutexGuard<'_, HoldMap<Entry>> {
        // Every critical section leaves the map consistent, so a poisoned lock is usable.
        self.entries.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn interval(&self) -> Duration {
        self.lease / 3
    }

    fn asleep_until(&self) -> MutexGuard<'_, Option<Instant>> {
        self.asleep_until
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn register(
        &self,
        hold: &Hold,
        due: Instant,
        expires: Instant,
        hold_until: Option<Instant>,
    ) -> Watched {
        let mut entries = self.entries();
        // Due before the task wakes by itself (it is parked, or a granted hold's grant
        // ends before the next renewal): wake it.
        let sooner = self.asleep_until().is_none_or(|at| due < at);
        let entry = entries
            .entry(hold.clone())
            .and_modify(|e| {
                e.guards += 1;
                e.due = e.due.min(due);
                e.expires = e.expires.max(expires);
                e.hold_until = match (e.hold_until, hold_until) {
                    (Some(a), Some(b)) => Some(a.max(b)),
                    _ => None,
                };
            })
            .or_insert_with(|| Entry {
                guards: 1,
                generation: self.generations.fetch_add(1, Ordering::Relaxed),
                lost: CancellationToken::new(),
                due,
                expires,
                hold_until,
            });
        let registration = Watched {
            generation: entry.generation,
            lost: entry.lost.clone(),
        };
        drop(entries);
        if sooner {
            self.wake.notify_one();
        }
        registration
    }

    fn unregister(&self, hold: &Hold, generation: u64) {
        let mut entries = self.entries();
        // Taken out and put back when other guards share it (or it is a newer hold's):
        // the common last guard then hashes the hold once, not twice.
        let Some((hold, mut entry)) = entries.remove_entry(hold) else {
            return;
        };
        if entry.generation == generation {
            entry.guards -= 1;
        }
        if entry.guards > 0 {
            entries.insert(hold, entry);
        }
    }

    /// The renewal loop; runs until the watchdog is dropped.
    async fn run(&self, store: Store) {
        let interval = self.interval();
        let retry = (interval / 10).clamp(Duration::from_millis(10), Duration::from_secs(1));
        loop {
            let next = {
                let entries = self.entries();
                let next = entries.values().map(|e| e.due).min();
                *self.asleep_until() = Some(next.unwrap_or_else(|| Instant::now() + interval));
                next
            };
            match next {
                None => {
                    // Linger an interval before parking: a lock taken right after the last
                    // one was released (the common ping-pong) then needs no wake-up, and
                    // it cannot be due before the lingering ends.
                    tokio::select! {
                        () = tokio::time::sleep(interval) => {}
                        () = self.wake.notified() => continue,
                    }
                    let parked = {
                        let entries = self.entries();
                        if entries.is_empty() {
                            *self.asleep_until() = None;
                        }
                        entries.is_empty()
                    };
                    if parked {
                        self.wake.notified().await;
                    }
                    continue;
                }
                Some(at) => {
                    tokio::select! {
                        () = tokio::time::sleep_until(at) => {}
                        // A hold due sooner arrived (a granted one): look again.
                        () = self.wake.notified() => continue,
                    }
                }
            }

            // Renew everything due within a third of the interval in one batch: renewing a
            // little early costs nothing and keeps the batches few.
            let now = Instant::now();
            let horizon = now + interval / 3;
            let mut due = Vec::new();
            {
                let mut entries = self.entries();
                let mut lost = Vec::new();
                for (hold, e) in entries.iter_mut() {
                    if e.due > horizon {
                        continue;
                    }
                    let lease = match e.hold_until {
                        Some(until) if until <= now => {
                            if now >= e.expires {
                                lost.push(hold.clone());
                            } else {
                                e.due = e.expires;
                            }
                            continue;
                        }
                        Some(until) => self.lease.min(until - now),
                        None => self.lease,
                    };
                    e.due = now + retry.max(interval);
                    let renewal = Renewal {
                        hold: hold.clone(),
                        lease,
                    };
                    due.push((e.expires, renewal, e.generation));
                }
                for hold in lost {
                    mark_lost(&mut entries, &hold, LostBecause::MaxHold);
                }
            }
            if due.is_empty() {
                continue;
            }
            // Most urgent first: if Redis falls behind, the locks closest to expiry go out first.
            due.sort_unstable_by_key(|(expires, ..)| *expires);
            let (batch, generations): (Vec<_>, Vec<_>) =
                due.into_iter().map(|(_, r, g)| (r, g)).unzip();

            let sent = Instant::now();
            let Renewed { held, error } = store.renew_all(&batch).await;
            let after = Instant::now();
            metrics::renewal_batch(after - sent, after - sent > interval);
            if after - sent > interval {
                tracing::warn!(
                    locks = batch.len(),
                    took_ms = (after - sent).as_millis() as u64,
                    "renewing took longer than the renewal interval; the store is overloaded \
                     or the watchdog lease is too short for this many locks"
                );
            }
            let count = |outcome: Option<bool>| held.iter().filter(|h| **h == outcome).count();
            metrics::renewals(RenewalOutcome::Extended, count(Some(true)));
            metrics::renewals(RenewalOutcome::Lost, count(Some(false)));
            if let Some(error) = &error {
                let failed = count(None);
                metrics::backend_error(Operation::Renew, error);
                metrics::renewals(RenewalOutcome::Failed, failed);
                tracing::warn!(%error, locks = failed, "lock renewal failed; retrying until the lease runs out");
            }
            // Each hold by its own answer: on a cluster, one node that does not answer
            // leaves the others' renewals standing.
            let mut entries = self.entries();
            for ((r, generation), held) in batch.iter().zip(generations).zip(held) {
                let Some(e) = entries
                    .get_mut(&r.hold)
                    .filter(|e| e.generation == generation)
                else {
                    continue; // released meanwhile
                };
                match held {
                    Some(true) => {
                        e.expires = sent + r.lease;
                        e.due = (sent + interval).min(e.expires);
                        tracing::trace!(key = %r.hold.key, "renewed");
                    }
                    Some(false) => mark_lost(&mut entries, &r.hold, LostBecause::Gone),
                    None if after >= e.expires => {
                        mark_lost(&mut entries, &r.hold, LostBecause::RenewalsFailed)
                    }
                    None => e.due = (after + retry).min(e.expires),
                }
            }
        }
    }
}

fn mark_lost(entries: &mut HoldMap<Entry>, hold: &Hold, why: LostBecause) {
    if let Some(entry) = entries.remove(hold) {
        tracing::warn!(key = %hold.key, holder = %hold.holder, kind = hold.kind.name(),
            reason = ?why, "lock lost while held");
        metrics::lost(hold.kind.name(), why);
        entry.lost.cancel();
    }
}
