//! Every kind of lock behind one interface, so that one test body can check a promise
//! for each of them (see `conformance!(kinds: ...)` and `tests/kind_conformance.rs`).

use std::time::Duration;

use lockwarden_core::{Holder, LockClient, LockError, LockGuard, MultiGuard};

/// A kind of lock, as the tests take it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `LockClient::lock`.
    Plain,
    /// `LockClient::fair_lock`.
    Fair,
    /// The read side of `LockClient::rw_lock`.
    Read,
    /// The write side of `LockClient::rw_lock`.
    Write,
    /// `LockClient::multi_lock` over two locks, `<name>:a` and `<name>:b`.
    Multi,
}

/// How long an "unbounded" acquire of a multi-lock (which has no `acquire`) may wait.
const UNBOUNDED: Duration = Duration::from_secs(3600);

/// The options of one acquisition.
#[derive(Debug, Clone, Default)]
pub struct Opts {
    /// Acquire as this holder (else a fresh one).
    pub holder: Option<Holder>,
    /// A fixed lease instead of the watchdog.
    pub lease: Option<Duration>,
    /// How long the watchdog keeps the hold at most.
    pub max_hold: Option<Duration>,
}

impl Opts {
    /// Acquire as `holder`.
    pub fn holder(holder: &Holder) -> Self {
        Self {
            holder: Some(holder.clone()),
            ..Self::default()
        }
    }

    /// Hold for the fixed `lease`.
    pub fn lease(lease: Duration) -> Self {
        Self {
            lease: Some(lease),
            ..Self::default()
        }
    }

    /// Kept by the watchdog for at most `max_hold`.
    pub fn max_hold(max_hold: Duration) -> Self {
        Self {
            max_hold: Some(max_hold),
            ..Self::default()
        }
    }
}

/// Sets a builder's holder, lease and `max_hold` from [`Opts`] (every kind's builder has
/// them all).
macro_rules! configure {
    ($builder:expr, $opts:expr) => {{
        let mut builder = $builder;
        if let Some(holder) = &$opts.holder {
            builder = builder.holder(holder);
        }
        if let Some(lease) = $opts.lease {
            builder = builder.lease(lease);
        }
        if let Some(max_hold) = $opts.max_hold {
            builder = builder.max_hold(max_hold);
        }
        builder
    }};
}

impl Kind {
    /// The names of the locks a lock of this kind called `name` consists of.
    pub fn parts(self, name: &str) -> Vec<String> {
        match self {
            Kind::Multi => vec![format!("{name}:a"), format!("{name}:b")],
            _ => vec![name.to_owned()],
        }
    }

    /// The kind another holder is refused while this kind is held: readers share with
    /// readers and exclude writers; every other kind excludes its own kind.
    pub fn rival(self) -> Kind {
        match self {
            Kind::Read => Kind::Write,
            kind => kind,
        }
    }

    /// A kind whose hold makes an acquisition of this kind wait: the write side for a
    /// reader, the read side for a writer (so the writer waits registered), else the
    /// same kind.
    pub fn blocker(self) -> Kind {
        match self {
            Kind::Read => Kind::Write,
            Kind::Write => Kind::Read,
            kind => kind,
        }
    }

    /// Acquires, waiting at most `wait` (zero: one attempt).
    pub async fn try_acquire(
        self,
        client: &LockClient,
        name: &str,
        opts: &Opts,
        wait: Duration,
    ) -> Result<Held, LockError> {
        let one = match self {
            Kind::Plain => configure!(client.lock(name), opts).try_acquire(wait).await,
            Kind::Fair => {
                configure!(client.fair_lock(name), opts)
                    .try_acquire(wait)
                    .await
            }
            Kind::Read => {
                configure!(client.rw_lock(name).read(), opts)
                    .try_acquire(wait)
                    .await
            }
            Kind::Write => {
                configure!(client.rw_lock(name).write(), opts)
                    .try_acquire(wait)
                    .await
            }
            Kind::Multi => {
                return configure!(client.multi_lock(self.parts(name)), opts)
                    .try_acquire(wait)
                    .await
                    .map(Held::Many)
            }
        };
        one.map(Held::One)
    }

    /// Acquires, waiting as long as it takes (a multi-lock, which has no unbounded
    /// acquire, an hour).
    pub async fn acquire(
        self,
        client: &LockClient,
        name: &str,
        opts: &Opts,
    ) -> Result<Held, LockError> {
        let one = match self {
            Kind::Plain => configure!(client.lock(name), opts).acquire().await,
            Kind::Fair => configure!(client.fair_lock(name), opts).acquire().await,
            Kind::Read => {
                configure!(client.rw_lock(name).read(), opts)
                    .acquire()
                    .await
            }
            Kind::Write => {
                configure!(client.rw_lock(name).write(), opts)
                    .acquire()
                    .await
            }
            Kind::Multi => return self.try_acquire(client, name, opts, UNBOUNDED).await,
        };
        one.map(Held::One)
    }

    /// Whether anyone holds the lock (for a multi-lock: any of its locks; for a
    /// read-write lock: either side).
    pub async fn is_locked(self, client: &LockClient, name: &str) -> bool {
        match self {
            Kind::Plain | Kind::Multi => {
                for part in self.parts(name) {
                    if client.lock(part).is_locked().await.unwrap() {
                        return true;
                    }
                }
                false
            }
            Kind::Fair => client.fair_lock(name).is_locked().await.unwrap(),
            Kind::Read | Kind::Write => client.rw_lock(name).is_locked().await.unwrap(),
        }
    }

    /// How many times `holder` holds this kind of lock (for a multi-lock: the fewest
    /// holds on any of its locks; for a read-write lock: this side's).
    pub async fn hold_count(self, client: &LockClient, name: &str, holder: &Holder) -> u64 {
        match self {
            Kind::Plain | Kind::Multi => {
                let mut fewest = u64::MAX;
                for part in self.parts(name) {
                    fewest = fewest.min(client.lock(part).hold_count(holder).await.unwrap());
                }
                fewest
            }
            Kind::Fair => client.fair_lock(name).hold_count(holder).await.unwrap(),
            Kind::Read => client
                .rw_lock(name)
                .read()
                .hold_count(holder)
                .await
                .unwrap(),
            Kind::Write => client
                .rw_lock(name)
                .write()
                .hold_count(holder)
                .await
                .unwrap(),
        }
    }

    /// Force-unlocks the lock through its kind's own handle; whether there was one.
    pub async fn force_unlock(self, client: &LockClient, name: &str) -> bool {
        match self {
            Kind::Plain => client.lock(name).force_unlock().await,
            Kind::Fair => client.fair_lock(name).force_unlock().await,
            Kind::Read | Kind::Write => client.rw_lock(name).force_unlock().await,
            Kind::Multi => client.multi_lock(self.parts(name)).force_unlock().await,
        }
        .unwrap()
    }

    /// How many waiters are queued (fair locks only; 0 for the other kinds).
    pub async fn queued(self, client: &LockClient, name: &str) -> usize {
        match self {
            Kind::Fair => client.fair_lock(name).queued().await.unwrap(),
            _ => 0,
        }
    }

    /// The Redis keys of the lock hashes (one per part).
    pub fn redis_keys(self, client: &LockClient, name: &str) -> Vec<String> {
        self.parts(name)
            .iter()
            .map(|part| client.key(part).unwrap().redis_key().to_owned())
            .collect()
    }
}

/// What an acquisition of any kind returns.
#[derive(Debug)]
pub enum Held {
    /// A plain, fair, read or write hold.
    One(LockGuard),
    /// A multi-lock's holds.
    Many(MultiGuard),
}

impl Held {
    /// The guards, one per part.
    pub fn guards(&self) -> &[LockGuard] {
        match self {
            Held::One(guard) => std::slice::from_ref(guard),
            Held::Many(guards) => guards.guards(),
        }
    }

    /// The fencing token of each part.
    pub fn tokens(&self) -> Vec<u64> {
        self.guards().iter().map(LockGuard::fencing_token).collect()
    }

    /// Who holds it.
    pub fn holder(&self) -> &Holder {
        self.guards()[0].holder()
    }

    /// Whether (any part of) it was lost.
    pub fn is_lost(&self) -> bool {
        match self {
            Held::One(guard) => guard.is_lost(),
            Held::Many(guards) => guards.is_lost(),
        }
    }

    /// Releases it (every part).
    pub async fn release(self) -> Result<(), LockError> {
        match self {
            Held::One(guard) => guard.release().await,
            Held::Many(guards) => guards.release().await,
        }
    }
}
