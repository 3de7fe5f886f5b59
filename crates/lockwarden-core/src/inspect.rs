//! What the handle of a plain or fair lock can tell about it, written once for both.

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
        }
    };
}

pub(crate) use exclusive_inspection;
