//! [`Limited<T>`]: an axum extractor that holds a permit of the concurrency limit of a
//! value taken from the request for as long as the handler keeps it.

use std::fmt;
use std::ops::{Deref, DerefMut};
use std::time::Duration;

use axum::extract::{FromRequestParts, Path};
use http::request::Parts;
use http::StatusCode;

use super::guarded::{client_of, guard, wraps_guarded, Guarded, LockedRejection};
use super::limiting::Limiting;
use crate::LockClient;

/// A value that names a concurrency limit: implement it for the type you extract with
/// [`Limited`]. The constants tune the acquisition; override them in the impl.
///
/// ```
/// use lockwarden::LimitKey;
///
/// struct Tenant { id: String, paid: bool }
///
/// impl LimitKey for Tenant {
///     fn limit_key(&self) -> String {
///         format!("exports:{}", self.id)
///     }
///     fn permits(&self) -> u32 {
///         if self.paid { 20 } else { 2 }
///     }
/// }
/// assert_eq!(Tenant { id: "t1".into(), paid: false }.permits(), 2);
/// ```
pub trait LimitKey {
    /// How long to wait for a permit before answering with
    /// [`FULL_STATUS`](Self::FULL_STATUS) (default: zero, one attempt).
    const WAIT: Duration = Duration::ZERO;
    /// A fixed lease; `None` (the default) keeps the permit alive with the watchdog.
    const LEASE: Option<Duration> = None;
    /// The status of the answer when every permit is held: 429 (default) or 503.
    const FULL_STATUS: StatusCode = StatusCode::TOO_MANY_REQUESTS;

    /// The name of the limit's semaphore (validated like every key). Include a prefix,
    /// e.g. `exports:<tenant>`, so keys of different types differ.
    fn limit_key(&self) -> String;

    /// Its capacity: how many handlers with this key may run at once, across every
    /// replica (the stored capacity counts while the key is in use, see
    /// [`Semaphore`](crate::Semaphore)).
    fn permits(&self) -> u32;
}

/// `Limited<Path<T>>` limits by the path parameters `T` deserializes into, as `T` says.
impl<T: LimitKey> LimitKey for Path<T> {
    const WAIT: Duration = T::WAIT;
    const LEASE: Option<Duration> = T::LEASE;
    const FULL_STATUS: StatusCode = T::FULL_STATUS;

    fn limit_key(&self) -> String {
        self.0.limit_key()
    }

    fn permits(&self) -> u32 {
        self.0.permits()
    }
}

/// Extracts `T` (any [`FromRequestParts`] that implements [`LimitKey`]) and holds a
/// permit of its limit while the handler keeps the extracted value: at most
/// [`LimitKey::permits`] handlers with the same key run at once, on every replica. A
/// handler that finds the limit full is answered 429 (or [`LimitKey::FULL_STATUS`]) with
/// `Retry-After` and a problem body.
///
/// ```
/// use axum::{extract::Path, routing::post, Router};
/// use lockwarden::{LimitKey, Limited, LockClient};
/// use serde::Deserialize;
///
/// #[derive(Deserialize)]
/// struct Account(String);
///
/// impl LimitKey for Account {
///     fn limit_key(&self) -> String {
///         format!("exports:{}", self.0)
///     }
///     fn permits(&self) -> u32 {
///         3 // three exports at once per account
///     }
/// }
///
/// async fn export(Limited(account): Limited<Path<Account>>) -> String {
///     format!("exporting for {} (token {})", account.0 .0, account.fencing_token())
/// }
///
/// let app: Router = Router::new()
///     .route("/accounts/{id}/export", post(export))
///     .with_state(LockClient::in_memory());
/// ```
///
/// The client is found as [`Locked`](super::Locked)'s is: the request's extensions, the router's state
/// if it is a [`LockClient`], or [`default_client`](super::default_client).
pub struct Limited<T>(pub Guarded<T>);

wraps_guarded!(Limited);

impl<S, T> FromRequestParts<S> for Limited<T>
where
    T: LimitKey + FromRequestParts<S> + Send,
    S: Send + Sync + 'static,
{
    type Rejection = LockedRejection<T::Rejection>;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        let value = T::from_request_parts(parts, state)
            .await
            .map_err(LockedRejection::Key)?;
        let client = client_of(parts, state);
        permit(value, parts, client).await.map(Limited)
    }
}

/// Takes a permit of `value`'s limit with `client` (or the default client).
async fn permit<T: LimitKey, R>(
    value: T,
    parts: &Parts,
    client: Option<LockClient>,
) -> Result<Guarded<T>, LockedRejection<R>> {
    let busy = |retry_after| Limiting::full(T::FULL_STATUS, retry_after);
    guard(
        value,
        parts,
        client,
        "the Limited extractor",
        busy,
        |client, value| {
            let mut permits = client.semaphore(value.limit_key(), value.permits());
            if let Some(lease) = T::LEASE {
                permits = permits.lease(lease);
            }
            async move { permits.try_acquire(T::WAIT).await }
        },
    )
    .await
}
