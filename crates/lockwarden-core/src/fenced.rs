//! [`FencedValue`]: the resource side of fencing, for a value kept in the lock store
//! itself. Every write carries the writer's fencing token and is applied only if no
//! larger token wrote the value before, so a holder paused past its lease (whose lock a
//! newer holder has taken and used since) cannot overwrite the newer holder's work.

use std::sync::Arc;

use crate::engine::Engine;
use crate::error::{KeyError, LockError};
use crate::key::Key;
use crate::lock::checked;
use crate::store::contract::LockStore;

/// A value in the lock store that only the newest fencing token may write, made by
/// [`LockClient::fenced`](crate::LockClient::fenced).
///
/// A lock alone cannot stop a holder that was paused (a GC pause, a stopped process, a
/// slow network) past its lease from acting on its stale belief that it still holds the
/// lock. The resource must check: every hold carries a [fencing token](crate::LockGuard::fencing_token)
/// larger than every earlier one, and a write that carries a token smaller than one the
/// resource has already seen is refused ([`LockError::StaleToken`]). This is that check
/// for data kept in Redis (or in-process); for data elsewhere, store the token with the
/// data and compare on write, e.g. in SQL:
///
/// ```sql
/// UPDATE orders SET status = $2, fence = $3
///  WHERE id = $1 AND (fence IS NULL OR fence <= $3);
/// -- 0 rows updated: a newer holder wrote first; stop, the lock is lost.
/// ```
///
/// Writes with the same token (one hold and its re-entries) are applied.
///
/// ```
/// # use lockwarden_core::{LockClient, LockError};
/// # use std::time::Duration;
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), LockError> {
/// let client = LockClient::in_memory();
/// let stock = client.fenced("stock:42");
/// let old = client.lock("stock:42").lease(Duration::from_millis(10)).acquire().await?;
/// tokio::time::sleep(Duration::from_millis(20)).await; // the holder stalls past its lease
/// let new = client.lock("stock:42").acquire().await?;
/// stock.write(new.fencing_token(), b"7").await?;
/// // The stalled holder wakes up and writes: refused, the newer write stands.
/// assert!(matches!(stock.write(old.fencing_token(), b"9").await, Err(LockError::StaleToken { .. })));
/// assert_eq!(stock.read().await?.unwrap().1, b"7");
/// # new.release().await }
/// ```
#[derive(Debug, Clone)]
#[must_use = "a FencedValue does nothing until it is written or read"]
pub struct FencedValue {
    engine: Arc<Engine>,
    key: Result<Key, KeyError>,
}

impl FencedValue {
    pub(crate) fn new(engine: Arc<Engine>, key: Result<Key, KeyError>) -> Self {
        Self { engine, key }
    }

    /// The validated key (the value is stored under its `:fenced` companion, in the
    /// lock's cluster slot).
    ///
    /// # Errors
    /// [`LockError::InvalidKey`] if the name was rejected.
    pub fn key(&self) -> Result<&Key, LockError> {
        checked(&self.key)
    }

    /// Writes `value` with the writer's fencing `token`, unless a larger token wrote the
    /// value before. One round trip; atomic.
    ///
    /// ```
    /// # use lockwarden_core::LockClient;
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lockwarden_core::LockError> {
    /// let client = LockClient::in_memory();
    /// let guard = client.acquire("report").await?;
    /// client.fenced("report").write(guard.fencing_token(), b"done").await?;
    /// # guard.release().await }
    /// ```
    ///
    /// # Errors
    /// [`LockError::StaleToken`] if a larger token wrote the value before (nothing is
    /// written: the writer has lost the lock), [`LockError::NoFencingToken`] for token 0
    /// (see [`without_fencing_tokens`](crate::LockClientBuilder::without_fencing_tokens)),
    /// [`LockError::InvalidKey`] or [`LockError::Backend`].
    pub async fn write(&self, token: u64, value: impl AsRef<[u8]>) -> Result<(), LockError> {
        let key = self.key()?;
        if token == 0 {
            return Err(LockError::NoFencingToken {
                key: key.name().to_owned(),
            });
        }
        let refused = self
            .engine
            .store()
            .fenced_write(key, token, value.as_ref())
            .await?;
        match refused {
            None => Ok(()),
            Some(newest) => {
                tracing::warn!(%key, token, newest, "a fenced write with a stale token was refused");
                Err(LockError::StaleToken {
                    key: key.name().to_owned(),
                    token,
                    newest,
                })
            }
        }
    }

    /// The value and the token that last wrote it, `None` if it was never written.
    ///
    /// ```
    /// # use lockwarden_core::LockClient;
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lockwarden_core::LockError> {
    /// let client = LockClient::in_memory();
    /// assert_eq!(client.fenced("untouched").read().await?, None);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`LockError::InvalidKey`] or [`LockError::Backend`].
    pub async fn read(&self) -> Result<Option<(u64, Vec<u8>)>, LockError> {
        Ok(self.engine.store().fenced_read(self.key()?).await?)
    }
}
