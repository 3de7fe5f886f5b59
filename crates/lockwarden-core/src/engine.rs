//! The engine: what one client owns and every lock handle and guard shares — the store,
//! the registry of waiters the store wakes, the watchdog, and the holder ids.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::error::KeyError;
use crate::holder::Holder;
use crate::key::{Key, KeySpace};
use crate::live::LiveHolds;
use crate::store::contract::LockStore;
use crate::store::Store;
use crate::waiters::Waiters;
use crate::watchdog::Watchdog;

pub(crate) struct Engine {
    /// Random per client (its waiters registry's): the first half of every holder id it
    /// makes.
    id: Box<str>,
    keys: KeySpace,
    store: Store,
    waiters: Arc<Waiters>,
    watchdog: Watchdog,
    holders: AtomicU64,
    live: LiveHolds,
    /// Whether plain holds get fencing tokens (see `LockClientBuilder::without_fencing_tokens`).
    fenced: bool,
}

impl Engine {
    /// An engine on `store`, which wakes `waiters`; holds without a lease of their own are
    /// kept for `watchdog_lease` by the watchdog; plain holds get fencing tokens if
    /// `fenced`.
    pub(crate) fn new(
        keys: KeySpace,
        watchdog_lease: Duration,
        fenced: bool,
        store: Store,
        waiters: Arc<Waiters>,
    ) -> Self {
        Self {
            id: waiters.client().into(),
            keys,
            watchdog: Watchdog::new(watchdog_lease, store.clone()),
            store,
            waiters,
            holders: AtomicU64::new(0),
            live: LiveHolds::default(),
            fenced,
        }
    }

    /// Validates `name` and lays it out in this client's key space.
    pub(crate) fn key(&self, name: &str) -> Result<Key, KeyError> {
        self.keys.key(name)
    }

    /// How this client lays out names (rate limiters lay out their buckets with it).
    pub(crate) fn key_space(&self) -> &KeySpace {
        &self.keys
    }

    /// A new holder identity.
    pub(crate) fn holder(&self) -> Holder {
        Holder::new(&self.id, self.holders.fetch_add(1, Ordering::Relaxed))
    }

    /// How many guards of each hold this client has.
    pub(crate) fn live(&self) -> &LiveHolds {
        &self.live
    }

    /// Whether plain holds get fencing tokens.
    pub(crate) fn fenced(&self) -> bool {
        self.fenced
    }

    pub(crate) fn store(&self) -> &Store {
        &self.store
    }

    pub(crate) fn waiters(&self) -> &Arc<Waiters> {
        &self.waiters
    }

    pub(crate) fn watchdog(&self) -> &Watchdog {
        &self.watchdog
    }
}

impl fmt::Debug for Engine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockClient")
            .field("id", &self.id)
            .field("backend", &self.store.name())
            .field("namespace", &self.keys.namespace)
            .finish()
    }
}
