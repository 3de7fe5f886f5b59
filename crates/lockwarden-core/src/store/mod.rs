//! Lock stores: where locks live. `contract.rs` says what every store does; `redis/` and
//! `memory/` do it; [`Store`] is the one value the engine holds, whichever it is. No code
//! outside this module tells the stores apart.

pub(crate) mod contract;
mod memory;
pub(crate) mod redis;

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use self::redis::{ConnectOptions, Deployment, RedisStore};
use crate::hold::{Exclusive, Hold};
use crate::holder::Holder;
use crate::key::Key;
use crate::waiters::Waiters;
use contract::{
    Acquire, AcquireAll, Attempt, Debts, LockStore, MultiAttempt, Outcome, PermitsState, RateAsk,
    Reentries, Released, Renewal, Renewed, Result, Waiter,
};
use memory::MemoryStore;

/// A client's lock store; clones share it.
#[derive(Clone)]
pub(crate) enum Store {
    Redis(RedisStore),
    Memory(Arc<MemoryStore>),
}

impl Store {
    /// A new in-process store, and the registry of waiters it wakes (itself, on release).
    pub(crate) fn in_memory() -> (Self, Arc<Waiters>) {
        let waiters = Arc::new(Waiters::local());
        let store = MemoryStore::new(waiters.clone());
        (Store::Memory(Arc::new(store)), waiters)
    }

    /// A Redis store on `deployment`, and the registry of waiters it wakes (through its
    /// pub/sub connection, subscribed to the channels that have waiters); `probe`: see
    /// [`RedisStore::connect`].
    pub(crate) async fn connect(
        deployment: &Deployment,
        options: &ConnectOptions,
        probe: Option<&Key>,
    ) -> Result<(Self, Arc<Waiters>)> {
        let (waiters, changes) = Waiters::remote();
        let waiters = Arc::new(waiters);
        let store =
            RedisStore::connect(deployment, options, probe, waiters.clone(), changes).await?;
        Ok((Store::Redis(store), waiters))
    }
}

/// Hands an operation to whichever store this is.
macro_rules! dispatch {
    ($self:ident, $store:ident => $op:expr) => {
        match $self {
            Store::Redis($store) => $op,
            Store::Memory($store) => $op,
        }
    };
}

impl LockStore for Store {
    fn name(&self) -> &'static str {
        dispatch!(self, s => s.name())
    }

    async fn acquire(&self, ask: &Acquire<'_>) -> Result<Attempt> {
        dispatch!(self, s => s.acquire(ask).await)
    }

    async fn acquire_all(&self, ask: &AcquireAll<'_>) -> Result<MultiAttempt> {
        dispatch!(self, s => s.acquire_all(ask).await)
    }

    async fn release(
        &self,
        hold: &Hold,
        token: Option<u64>,
        reentries: Reentries,
    ) -> Result<Released> {
        dispatch!(self, s => s.release(hold, token, reentries).await)
    }

    fn release_later(&self, hold: Hold, resend_until: Option<Instant>, reentries: Reentries) {
        dispatch!(self, s => s.release_later(hold, resend_until, reentries))
    }

    async fn flush(&self) {
        dispatch!(self, s => s.flush().await)
    }

    async fn complete(
        &self,
        hold: &Hold<Exclusive>,
        token: Option<u64>,
        outcome: Outcome<'_>,
    ) -> Result<Released> {
        dispatch!(self, s => s.complete(hold, token, outcome).await)
    }

    async fn renew_all(&self, renewals: &[Renewal]) -> Renewed {
        dispatch!(self, s => s.renew_all(renewals).await)
    }

    async fn withdraw(&self, waiter: Waiter, key: &Key, holder: &Holder) -> Result<()> {
        dispatch!(self, s => s.withdraw(waiter, key, holder).await)
    }

    async fn force_unlock(&self, key: &Key) -> Result<bool> {
        dispatch!(self, s => s.force_unlock(key).await)
    }

    async fn hold_count(&self, hold: &Hold) -> Result<u64> {
        dispatch!(self, s => s.hold_count(hold).await)
    }

    async fn remaining_ttl(&self, key: &Key) -> Result<Option<Duration>> {
        dispatch!(self, s => s.remaining_ttl(key).await)
    }

    async fn queued(&self, key: &Key) -> Result<usize> {
        dispatch!(self, s => s.queued(key).await)
    }

    async fn waiting_writers(&self, key: &Key) -> Result<usize> {
        dispatch!(self, s => s.waiting_writers(key).await)
    }

    async fn permits(&self, key: &Key) -> Result<Option<PermitsState>> {
        dispatch!(self, s => s.permits(key).await)
    }

    async fn set_capacity(&self, key: &Key, capacity: u32) -> Result<bool> {
        dispatch!(self, s => s.set_capacity(key, capacity).await)
    }

    async fn fenced_write(&self, key: &Key, token: u64, value: &[u8]) -> Result<Option<u64>> {
        dispatch!(self, s => s.fenced_write(key, token, value).await)
    }

    async fn fenced_read(&self, key: &Key) -> Result<Option<(u64, Vec<u8>)>> {
        dispatch!(self, s => s.fenced_read(key).await)
    }

    async fn rate(&self, ask: &RateAsk<'_>) -> Result<Debts> {
        dispatch!(self, s => s.rate(ask).await)
    }
}
