//! Holder identities: who holds a lock, and which task acts as whom.

use std::fmt::{self, Write as _};
use std::future::Future;
use std::sync::Arc;

tokio::task_local! {
    static CURRENT: Holder;
}

/// A future running with a current [`Holder`] (see [`Holder::scope`]).
pub type Scoped<F> = tokio::task::futures::TaskLocalFuture<Holder, F>;

/// The identity a lock is held by: `<client uuid>:<holder number>`.
///
/// Acquiring a lock again with the same holder re-enters it instead of deadlocking; each
/// release undoes one acquisition and the lock is free when the count reaches zero. A task
/// (or an HTTP request) carries one holder through [`Holder::scope`]; inside the scope every
/// acquisition that names no holder uses it. Outside any scope each acquisition gets a fresh
/// holder, so two acquisitions of one key exclude each other like a `Mutex`.
///
/// The client uuid is random (v4), so holder ids cannot be guessed from another process.
///
/// ```
/// # use lockwarden_core::LockClient;
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lockwarden_core::LockError> {
/// let client = LockClient::in_memory();
/// let me = client.holder();
/// me.clone().scope(async {
///     let outer = client.acquire("cart:7").await?;
///     let inner = client.acquire("cart:7").await?; // re-enters: same holder
///     assert_eq!(client.lock("cart:7").hold_count(&me).await?, 2);
///     inner.release().await?;
///     outer.release().await
/// }).await?;
/// assert!(!client.lock("cart:7").is_locked().await?);
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Holder(Arc<str>);

impl Holder {
    pub(crate) fn new(client_id: &str, number: u64) -> Self {
        // Sized up front: `format!` guesses, and grew the string on every new holder.
        let mut id = String::with_capacity(client_id.len() + 1 + 20);
        id.push_str(client_id);
        id.push(':');
        // Writing to a `String` cannot fail.
        let _ = write!(id, "{number}");
        Holder(id.into())
    }

    /// The holder id as stored in Redis.
    pub fn id(&self) -> &str {
        &self.0
    }

    /// Runs `fut` with this holder as the current one: acquisitions inside it that name
    /// no holder use this one (and so re-enter locks it already holds).
    pub fn scope<F: Future>(self, fut: F) -> Scoped<F> {
        CURRENT.scope(self, fut)
    }

    /// The holder set by the enclosing [`Holder::scope`], if any.
    pub fn current() -> Option<Holder> {
        CURRENT.try_with(Holder::clone).ok()
    }

    /// The same holder in an allocation of its own, whose clones [`is_unique`] counts
    /// apart from this one's (a guard hands out such a copy, see `LockGuard::holder`).
    ///
    /// [`is_unique`]: Self::is_unique
    pub(crate) fn copy(&self) -> Holder {
        Holder(Arc::from(&*self.0))
    }

    /// Whether no clone of this value exists: then nobody can acquire as this holder
    /// (a holder is never made from its id) except through this value.
    pub(crate) fn is_unique(&mut self) -> bool {
        Arc::get_mut(&mut self.0).is_some()
    }
}

impl fmt::Display for Holder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.id())
    }
}
