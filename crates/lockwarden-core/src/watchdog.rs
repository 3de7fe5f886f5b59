//! The client's one watchdog: keeps every lock held without an explicit lease alive.
//!
//! Guards register here; one task renews all that are due in one pipelined batch every
//! third of the lease, and marks a guard lost when a renewal finds its lock gone or taken,
//! or when renewals keep failing until the lease must have run out.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::backend::{Backend, Kind, Renewal};
use crate::holder::Holder;
use crate::key::Key;

pub(crate) struct Watchdog {
    entries: Mutex<HashMap<(Kind, Key, Holder), Entry>>,
    /// Woken when the first entry arrives while the task is parked.
    wake: Notify,
    parked: AtomicBool,
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
pub(crate) struct Registration {
    pub generation: u64,
    pub lost: CancellationToken,
}

impl Watchdog {
    pub(crate) fn new(lease: Duration) -> Self {
        Self {
            entries: Mutex::default(),
            wake: Notify::new(),
            parked: AtomicBool::new(false),
            lease,
            generations: AtomicU64::new(0),
        }
    }

    fn entries(&self) -> MutexGuard<'_, HashMap<(Kind, Key, Holder), Entry>> {
        // Every critical section leaves the map consistent, so a poisoned lock is usable.
        self.entries.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn interval(&self) -> Duration {
        self.lease / 3
    }

    /// Watches a hold acquired with the watchdog lease, the request sent at `sent`.
    pub(crate) fn register(
        &self,
        kind: Kind,
        key: &Key,
        holder: &Holder,
        sent: Instant,
        max_hold: Option<Duration>,
    ) -> Registration {
        let mut entries = self.entries();
        let was_empty = entries.is_empty();
        let hold_until = max_hold.map(|d| sent + d);
        let entry = entries
            .entry((kind, key.clone(), holder.clone()))
            .and_modify(|e| {
                e.guards += 1;
                e.expires = e.expires.max(sent + self.lease);
                e.hold_until = match (e.hold_until, hold_until) {
                    (Some(a), Some(b)) => Some(a.max(b)),
                    _ => None,
                };
            })
            .or_insert_with(|| Entry {
                guards: 1,
                generation: self.generations.fetch_add(1, Ordering::Relaxed),
                lost: CancellationToken::new(),
                due: sent + self.interval(),
                expires: sent + self.lease,
                hold_until,
            });
        let registration = Registration {
            generation: entry.generation,
            lost: entry.lost.clone(),
        };
        drop(entries);
        if was_empty && self.parked.load(Ordering::SeqCst) {
            self.wake.notify_one();
        }
        registration
    }

    /// Stops watching for one guard; the entry goes when its last guard does.
    pub(crate) fn unregister(&self, kind: Kind, key: &Key, holder: &Holder, generation: u64) {
        let mut entries = self.entries();
        let id = (kind, key.clone(), holder.clone());
        if let Some(entry) = entries.get_mut(&id) {
            if entry.generation == generation {
                entry.guards -= 1;
                if entry.guards == 0 {
                    entries.remove(&id);
                }
            }
        }
    }

    /// Number of holds being kept alive.
    pub(crate) fn len(&self) -> usize {
        self.entries().len()
    }

    /// The renewal loop; runs until the client is dropped.
    pub(crate) async fn run(&self, backend: Backend) {
        let interval = self.interval();
        let retry = (interval / 10).clamp(Duration::from_millis(10), Duration::from_secs(1));
        loop {
            let next = self.entries().values().map(|e| e.due).min();
            match next {
                None => {
                    // Linger an interval before parking: a lock taken right after the last
                    // one was released (the common ping-pong) then needs no wake-up, and
                    // it cannot be due before the lingering ends.
                    tokio::time::sleep(interval).await;
                    self.parked.store(true, Ordering::SeqCst);
                    if self.entries().is_empty() {
                        self.wake.notified().await;
                    }
                    self.parked.store(false, Ordering::SeqCst);
                    continue;
                }
                Some(at) => tokio::time::sleep_until(at).await,
            }

            // Renew everything due within a third of the interval in one batch: renewing a
            // little early costs nothing and keeps the batches few.
            let now = Instant::now();
            let horizon = now + interval / 3;
            let mut due = Vec::new();
            {
                let mut entries = self.entries();
                let mut lost = Vec::new();
                for ((kind, key, holder), e) in entries.iter_mut() {
                    if e.due > horizon {
                        continue;
                    }
                    let lease = match e.hold_until {
                        Some(until) if until <= now => {
                            if now >= e.expires {
                                lost.push((*kind, key.clone(), holder.clone(), "max_hold reached"));
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
                        kind: *kind,
                        key: key.clone(),
                        holder: holder.clone(),
                        lease,
                    };
                    due.push((e.expires, renewal, e.generation));
                }
                for (kind, key, holder, why) in lost {
                    mark_lost(&mut entries, kind, &key, &holder, why);
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
            let outcome = backend.renew_many(&batch).await;
            let after = Instant::now();
            if after - sent > interval {
                tracing::warn!(
                    locks = batch.len(),
                    took_ms = (after - sent).as_millis() as u64,
                    "renewing took longer than the renewal interval; the store is overloaded \
                     or the watchdog lease is too short for this many locks"
                );
            }
            let mut entries = self.entries();
            match outcome {
                Ok(renewed) => {
                    for ((r, generation), ok) in batch.iter().zip(generations).zip(renewed) {
                        let id = (r.kind, r.key.clone(), r.holder.clone());
                        let Some(e) = entries.get_mut(&id).filter(|e| e.generation == generation)
                        else {
                            continue; // released meanwhile
                        };
                        if ok {
                            e.expires = sent + r.lease;
                            e.due = (sent + interval).min(e.expires);
                            tracing::trace!(key = %r.key, "renewed");
                        } else {
                            mark_lost(
                                &mut entries,
                                r.kind,
                                &r.key,
                                &r.holder,
                                "it was gone or held by another holder at renewal",
                            );
                        }
                    }
                }
                Err(error) => {
                    tracing::warn!(%error, locks = batch.len(), "lock renewal failed; retrying until the lease runs out");
                    for (r, generation) in batch.iter().zip(generations) {
                        let id = (r.kind, r.key.clone(), r.holder.clone());
                        let Some(e) = entries.get_mut(&id).filter(|e| e.generation == generation)
                        else {
                            continue;
                        };
                        if after >= e.expires {
                            mark_lost(
                                &mut entries,
                                r.kind,
                                &r.key,
                                &r.holder,
                                "renewals failed until the lease ran out",
                            );
                        } else {
                            e.due = (after + retry).min(e.expires);
                        }
                    }
                }
            }
        }
    }
}

fn mark_lost(
    entries: &mut HashMap<(Kind, Key, Holder), Entry>,
    kind: Kind,
    key: &Key,
    holder: &Holder,
    why: &'static str,
) {
    if let Some(entry) = entries.remove(&(kind, key.clone(), holder.clone())) {
        tracing::warn!(%key, %holder, reason = why, "lock lost while held");
        entry.lost.cancel();
    }
}
