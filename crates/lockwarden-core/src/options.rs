//! The options every lock handle takes — a fixed lease or the watchdog, a cap on the
//! watchdog, the holder — written once, with the setters that set them.

use std::time::Duration;

use crate::engine::Engine;
use crate::holder::Holder;

/// How a hold is to be taken and kept.
#[derive(Debug, Clone, Default)]
pub(crate) struct HoldOptions {
    /// A fixed lease; `None`: the watchdog keeps the hold.
    pub(crate) lease: Option<Duration>,
    /// How long the watchdog keeps the hold at most.
    pub(crate) max_hold: Option<Duration>,
    /// Who holds it; `None`: the enclosing scope's holder, or a fresh one.
    pub(crate) holder: Option<Holder>,
}

impl HoldOptions {
    /// The holder to acquire as: the one set, else the enclosing [`Holder::scope`]'s, else
    /// a fresh one (so two acquisitions exclude each other like a `Mutex`); and whether it
    /// is fresh, made here and holding nothing yet (see `settle.rs`).
    pub(crate) fn holder(&self, engine: &Engine) -> (Holder, bool) {
        match self.holder.clone().or_else(Holder::current) {
            Some(given) => (given, false),
            None => (engine.holder(), true),
        }
    }

    /// The lease to ask the store for: the fixed one, else the watchdog's first lease.
    pub(crate) fn lease(&self, engine: &Engine) -> Duration {
        self.lease
            .unwrap_or_else(|| engine.watchdog().first_lease(self.max_hold))
    }
}

/// The setters of [`HoldOptions`] on a lock handle (a type with an `options` field);
/// `$make` makes one in the examples, from a `client`. With `leases`, only the lease
/// setters: for a handle whose holder is always made for the acquisition.
macro_rules! hold_options {
    ($handle:ty, $make:literal) => {
        hold_options!($handle, $make, leases);

        impl $handle {
            /// Acquires as `holder`, re-entering what it already holds. Without this, the
            /// holder of the enclosing [`Holder::scope`](crate::Holder::scope) is used, or
            /// else a fresh one.
            ///
            /// ```
            /// # use lockwarden_core::LockClient;
            /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lockwarden_core::LockError> {
            /// let client = LockClient::in_memory();
            /// let me = client.holder();
            #[doc = concat!("let outer = ", $make, ".holder(&me).acquire().await?;")]
            #[doc = concat!("let inner = ", $make, ".holder(&me).acquire().await?; // re-enters")]
            /// inner.release().await?;
            /// outer.release().await
            /// # }
            /// ```
            pub fn holder(mut self, holder: &crate::Holder) -> Self {
                self.options.holder = Some(holder.clone());
                self
            }
        }
    };
    ($handle:ty, $make:literal, leases) => {
        impl $handle {
            /// Holds the lock for a fixed lease instead of keeping it alive with the
            /// watchdog: it expires `lease` after acquisition unless released sooner.
            ///
            /// ```
            /// # use lockwarden_core::LockClient;
            /// # use std::time::Duration;
            /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lockwarden_core::LockError> {
            /// let client = LockClient::in_memory();
            #[doc = concat!("let guard = ", $make, ".lease(Duration::from_secs(30)).acquire().await?;")]
            /// assert!(!guard.is_lost()); // until it is released, or 30 s have passed
            /// guard.release().await
            /// # }
            /// ```
            pub fn lease(mut self, lease: std::time::Duration) -> Self {
                self.options.lease = Some(lease);
                self
            }

            /// Caps how long the watchdog keeps the lock alive: after `max_hold` it
            /// expires even if the guard still lives (and the guard reports it lost).
            ///
            /// ```
            /// # use lockwarden_core::LockClient;
            /// # use std::time::Duration;
            /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lockwarden_core::LockError> {
            /// let client = LockClient::in_memory();
            #[doc = concat!("let guard = ", $make, ".max_hold(Duration::from_secs(600)).acquire().await?;")]
            /// guard.release().await
            /// # }
            /// ```
            pub fn max_hold(mut self, max_hold: std::time::Duration) -> Self {
                self.options.max_hold = Some(max_hold);
                self
            }
        }
    };
}

pub(crate) use hold_options;
