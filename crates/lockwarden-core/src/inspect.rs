//! What a lock handle can tell about its lock, and the operator's force-unlock: written
//! once for the handles that share them.

use crate::engine::Engine;
use crate::error::LockError;
use crate::key::Key;
use crate::store::contract::LockStore;

/// Deletes the lock at `key` whoever holds it, whatever its kind, and wakes its waiters;
/// whether there was a lock.
pub(crate) async fn force_unlock(engine: &Engine, key: &Key) -> Result<bool, LockError> {
    let deleted = engine.store().force_unlock(key).await?;
    tracing::warn!(%key, deleted, "lock force-unlocked");
    Ok(deleted)
}

/// The inspection of a lock whose hash one holder has to itself (plain or fair), on a
/// handle with `engine` and `key` fields; `$make` makes the handle of a lock named `door`
/// in the examples, from a `client`.
macro_rules! exclusive_inspection {
    ($handle:ty, $make:literal) => {
        impl $handle {
            /// Whether anyone holds the lock.
            ///
            /// ```
            /// # use lockwarden_core::LockClient;
            /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lockwarden_core::LockError> {
            /// let client = LockClient::in_memory();
            #[doc = concat!("let guard = ", $make, ".acquire().await?;")]
            #[doc = concat!("assert!(", $make, ".is_locked().await?);")]
            /// # guard.release().await }
            /// ```
            ///
            /// # Errors
            /// [`LockError::InvalidKey`](crate::LockError::InvalidKey) or
            /// [`LockError::Backend`](crate::LockError::Backend).
            pub async fn is_locked(&self) -> Result<bool, crate::LockError> {
                Ok(self.remaining_ttl().await?.is_some())
            }

            /// Whether `holder` holds the lock.
            ///
            /// ```
            /// # use lockwarden_core::LockClient;
            /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lockwarden_core::LockError> {
            /// let client = LockClient::in_memory();
            #[doc = concat!("let guard = ", $make, ".acquire().await?;")]
            #[doc = concat!("assert!(", $make, ".is_held_by(guard.holder()).await?);")]
            /// # guard.release().await }
            /// ```
            ///
            /// # Errors
            /// As [`is_locked`](Self::is_locked).
            pub async fn is_held_by(
                &self,
                holder: &crate::Holder,
            ) -> Result<bool, crate::LockError> {
                Ok(self.hold_count(holder).await? > 0)
            }

            /// How many times `holder` holds the lock (0 if not at all).
            ///
            /// ```
            /// # use lockwarden_core::LockClient;
            /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lockwarden_core::LockError> {
            /// let client = LockClient::in_memory();
            #[doc = concat!("assert_eq!(", $make, ".hold_count(&client.holder()).await?, 0);")]
            /// # Ok(()) }
            /// ```
            ///
            /// # Errors
            /// As [`is_locked`](Self::is_locked).
            pub async fn hold_count(
                &self,
                holder: &crate::Holder,
            ) -> Result<u64, crate::LockError> {
                use crate::store::contract::LockStore as _;
                let hold = crate::hold::Hold {
                    kind: crate::hold::HoldKind::PLAIN,
                    key: self.key()?.clone(),
                    holder: holder.clone(),
                };
                Ok(self.engine.store().hold_count(&hold).await?)
            }

            /// The lease the current holder has left, `None` if the lock is free.
            ///
            /// ```
            /// # use lockwarden_core::LockClient;
            /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lockwarden_core::LockError> {
            /// let client = LockClient::in_memory();
            #[doc = concat!("assert_eq!(", $make, ".remaining_ttl().await?, None);")]
            /// # Ok(()) }
            /// ```
            ///
            /// # Errors
            /// As [`is_locked`](Self::is_locked).
            pub async fn remaining_ttl(
                &self,
            ) -> Result<Option<std::time::Duration>, crate::LockError> {
                use crate::store::contract::LockStore as _;
                Ok(self.engine.store().remaining_ttl(self.key()?).await?)
            }

            /// Deletes the lock whoever holds it and wakes its waiters at once. An
            /// operator's action, which breaks mutual exclusion for the current holder: it
            /// learns of it at its next renewal (its guard reports the lock lost), so a
            /// resource that checks fencing tokens is what stops its late writes. Returns
            /// whether there was a lock to delete.
            ///
            /// ```
            /// # use lockwarden_core::LockClient;
            /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lockwarden_core::LockError> {
            /// let client = LockClient::in_memory();
            #[doc = concat!("let stuck = ", $make, ".acquire().await?;")]
            #[doc = concat!("assert!(", $make, ".force_unlock().await?);")]
            #[doc = concat!("assert!(!", $make, ".is_locked().await?);")]
            /// # drop(stuck); Ok(()) }
            /// ```
            ///
            /// # Errors
            /// As [`is_locked`](Self::is_locked).
            pub async fn force_unlock(&self) -> Result<bool, crate::LockError> {
                crate::inspect::force_unlock(&self.engine, self.key()?).await
            }
        }
    };
}

pub(crate) use exclusive_inspection;
