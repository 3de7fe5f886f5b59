//! [`Locked<T>`]: an axum extractor that locks on a value taken from the request (e.g. an
//! order id from the path) and holds the lock for as long as the handler keeps it; and
//! [`Limited<T>`], which holds a permit of the value's concurrency limit instead.

use std::any::Any;
use std::fmt;
use std::ops::{Deref, DerefMut};
use std::time::Duration;

use axum::extract::{FromRef, FromRequestParts};
use axum::response::{IntoResponse, Response};
use http::request::Parts;
use http::StatusCode;

use super::client::default_client;
use super::rejection::LockRejection;
use crate::{Holder, LockClient, LockError, LockGuard, LockInfo};

/// A value that names a lock: implement it for the type you extract with [`Locked`].
///
/// The constants tune the acquisition; override them in the impl.
///
/// ```
/// use lockwarden::LockKey;
/// use std::time::Duration;
///
/// struct OrderId(u64);
///
/// impl LockKey for OrderId {
///     const WAIT: Duration = Duration::from_secs(2); // queue behind a running request
///     fn lock_key(&self) -> String {
///         format!("order:{}", self.0)
///     }
/// }
/// assert_eq!(OrderId(7).lock_key(), "order:7");
/// ```
#[cfg_attr(docsrs, doc(cfg(feature = "axum")))]
pub trait LockKey {
    /// How long to wait for a busy lock before answering with
    /// [`CONFLICT_STATUS`](Self::CONFLICT_STATUS) (default: zero, one attempt).
    const WAIT: Duration = Duration::ZERO;
    /// A fixed lease; `None` (the default) keeps the lock alive with the watchdog.
    const LEASE: Option<Duration> = None;
    /// The status of the answer when the lock is busy: 409 (default) or 423.
    const CONFLICT_STATUS: StatusCode = StatusCode::CONFLICT;

    /// The lock's name (validated like every key: non-empty, at most 255 bytes, no control
    /// characters). Include a prefix, e.g. `order:42`, so keys of different types differ.
    fn lock_key(&self) -> String;
}

/// A value whose lock is held for as long as this lives; derefs to the value.
///
/// ```
/// use lockwarden::{LockClient, Guarded};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), lockwarden::LockError> {
/// let client = LockClient::in_memory();
/// let guard = client.acquire("order:1").await?;
/// let order = Guarded::new(1u64, guard);
/// assert_eq!(*order, 1);
/// assert!(client.lock("order:1").is_locked().await?);
/// let id = order.release().await?; // or drop it
/// assert_eq!(id, 1);
/// assert!(!client.lock("order:1").is_locked().await?);
/// # Ok(()) }
/// ```
#[cfg_attr(docsrs, doc(cfg(feature = "axum")))]
pub struct Guarded<T> {
    value: T,
    guard: LockGuard,
}

impl<T> Guarded<T> {
    /// Pairs `value` with the guard of its lock.
    pub fn new(value: T, guard: LockGuard) -> Self {
        Self { value, guard }
    }

    /// Key, holder, fencing token and lost signal of the held lock.
    pub fn info(&self) -> LockInfo {
        self.guard.info()
    }

    /// The fencing token of the held lock.
    pub fn fencing_token(&self) -> u64 {
        self.guard.fencing_token()
    }

    /// The guard of the held lock.
    pub fn guard(&self) -> &LockGuard {
        &self.guard
    }

    /// Releases the lock and returns the value.
    ///
    /// # Errors
    /// As [`LockGuard::release`].
    pub async fn release(self) -> Result<T, LockError> {
        self.guard.release().await?;
        Ok(self.value)
    }

    /// The value and the guard, to keep the lock beyond the value's use.
    pub fn into_parts(self) -> (T, LockGuard) {
        (self.value, self.guard)
    }
}

impl<T> Deref for Guarded<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.value
    }
}

impl<T> DerefMut for Guarded<T> {
    fn deref_mut(&mut self) -> &mut T {
        &mut self.value
    }
}

impl<T: fmt::Debug> fmt::Debug for Guarded<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Guarded")
            .field("value", &self.value)
            .field("guard", &self.guard)
            .finish()
    }
}

impl<T: fmt::Display> fmt::Display for Guarded<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.value.fmt(f)
    }
}

/// Deref to the guarded value, and debug-print, for an extractor that wraps a
/// [`Guarded`] value.
macro_rules! wraps_guarded {
    ($extractor:ident) => {
        impl<T> Deref for $extractor<T> {
            type Target = T;
            fn deref(&self) -> &T {
                &self.0
            }
        }

        impl<T> DerefMut for $extractor<T> {
            fn deref_mut(&mut self) -> &mut T {
                &mut self.0
            }
        }

        impl<T: fmt::Debug> fmt::Debug for $extractor<T> {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.debug_tuple(stringify!($extractor))
                    .field(&self.0)
                    .finish()
            }
        }
    };
}

/// Extracts `T` (any [`FromRequestParts`] that implements [`LockKey`]), locks on it, and
/// holds the lock while the handler keeps the extracted value.
///
/// ```
/// use axum::{extract::Path, routing::post, Router};
/// use lockwarden::{LockKey, Locked};
/// use serde::Deserialize;
///
/// #[derive(Deserialize)]
/// struct OrderId(u64);
///
/// impl LockKey for OrderId {
///     fn lock_key(&self) -> String {
///         format!("order:{}", self.0)
///     }
/// }
///
/// // `Path<OrderId>` would do as well; a newtype reads better.
/// impl<S: Send + Sync> axum::extract::FromRequestParts<S> for OrderId {
///     type Rejection = axum::extract::rejection::PathRejection;
///     async fn from_request_parts(parts: &mut http::request::Parts, state: &S) -> Result<Self, Self::Rejection> {
///         let Path(id) = Path::<u64>::from_request_parts(parts, state).await?;
///         Ok(OrderId(id))
///     }
/// }
///
/// async fn ship(Locked(order): Locked<OrderId>) -> String {
///     // `order` derefs to `OrderId` and holds `order:<id>` until it is dropped.
///     format!("shipping {} (fencing token {})", order.0, order.fencing_token())
/// }
///
/// let app: Router = Router::new().route("/orders/{id}/ship", post(ship));
/// ```
///
/// The lock client is, in order: the [`LockClient`] in the request's extensions (put there
/// by a [`LockLayer`](super::LockLayer), or by `axum::Extension(client)`), the router's
/// state if the state is a `LockClient`, or [`default_client`]. When the client is a field
/// of a larger state, use [`StateLocked<T>`], which takes it with `FromRef`. Inside a `LockLayer`
/// request it acquires as that request's holder, so locking a key the layer (or an earlier
/// extractor) holds re-enters instead of deadlocking.
///
/// Destructuring `Locked(order)` moves the lock into `order` (a [`Guarded<T>`]): the lock
/// is held until `order` is dropped, normally when the handler returns.
#[cfg_attr(docsrs, doc(cfg(feature = "axum")))]
pub struct Locked<T>(pub Guarded<T>);

wraps_guarded!(Locked);

/// Why [`Locked<T>`] could not be extracted: `T`'s own rejection, or the lock's.
///
/// ```
/// use axum::response::IntoResponse;
/// use lockwarden::{LockRejection, LockedRejection};
///
/// let rejection: LockedRejection<axum::http::StatusCode> = LockedRejection::Lock(LockRejection::Lost);
/// assert_eq!(rejection.into_response().status(), 503);
/// let rejection: LockedRejection<axum::http::StatusCode> = LockedRejection::Key(axum::http::StatusCode::NOT_FOUND);
/// assert_eq!(rejection.into_response().status(), 404);
/// ```
#[derive(Debug)]
#[cfg_attr(docsrs, doc(cfg(feature = "axum")))]
pub enum LockedRejection<R> {
    /// `T` could not be extracted; answered as `T`'s rejection answers.
    Key(R),
    /// The lock could not be taken: busy (409/423 + `Retry-After`), invalid key (400),
    /// store down (503).
    Lock(LockRejection),
}

impl<R: IntoResponse> IntoResponse for LockedRejection<R> {
    fn into_response(self) -> Response {
        match self {
            Self::Key(rejection) => rejection.into_response(),
            Self::Lock(rejection) => rejection.into_response(),
        }
    }
}

impl<R: fmt::Display> fmt::Display for LockedRejection<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Key(rejection) => rejection.fmt(f),
            Self::Lock(rejection) => rejection.fmt(f),
        }
    }
}

impl<R: fmt::Debug + fmt::Display> std::error::Error for LockedRejection<R> {}

impl<S, T> FromRequestParts<S> for Locked<T>
where
    T: LockKey + FromRequestParts<S> + Send,
    S: Send + Sync + 'static,
{
    type Rejection = LockedRejection<T::Rejection>;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        let value = T::from_request_parts(parts, state)
            .await
            .map_err(LockedRejection::Key)?;
        let client = client_of(parts, state);
        lock(value, parts, client).await.map(Locked)
    }
}

/// [`Locked<T>`] for apps whose state holds the lock client: takes it from the state
/// with axum's [`FromRef`] (as `State<LockClient>` would), then locks like `Locked<T>`.
///
/// ```
/// use axum::{extract::{FromRef, Path}, routing::post, Router};
/// use lockwarden::{LockClient, LockKey, StateLocked};
///
/// #[derive(Clone)]
/// struct AppState {
///     locks: LockClient,
///     // db: Pool, ...
/// }
///
/// impl FromRef<AppState> for LockClient { // or #[derive(FromRef)] with axum's `macros`
///     fn from_ref(state: &AppState) -> Self {
///         state.locks.clone()
///     }
/// }
///
/// struct Invoice(u64);
/// impl LockKey for Invoice {
///     fn lock_key(&self) -> String { format!("invoice:{}", self.0) }
/// }
/// impl<S: Send + Sync> axum::extract::FromRequestParts<S> for Invoice {
///     type Rejection = axum::extract::rejection::PathRejection;
///     async fn from_request_parts(parts: &mut http::request::Parts, state: &S) -> Result<Self, Self::Rejection> {
///         Ok(Invoice(Path::<u64>::from_request_parts(parts, state).await?.0))
///     }
/// }
///
/// async fn pay(StateLocked(invoice): StateLocked<Invoice>) -> String {
///     format!("paying invoice {}", invoice.0)
/// }
///
/// let app: Router = Router::new()
///     .route("/invoices/{id}/pay", post(pay))
///     .with_state(AppState { locks: LockClient::in_memory() });
/// ```
#[cfg_attr(docsrs, doc(cfg(feature = "axum")))]
pub struct StateLocked<T>(pub Guarded<T>);

wraps_guarded!(StateLocked);

impl<S, T> FromRequestParts<S> for StateLocked<T>
where
    T: LockKey + FromRequestParts<S> + Send,
    LockClient: FromRef<S>,
    S: Send + Sync,
{
    type Rejection = LockedRejection<T::Rejection>;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        let value = T::from_request_parts(parts, state)
            .await
            .map_err(LockedRejection::Key)?;
        let client = LockClient::from_ref(state);
        lock(value, parts, Some(client)).await.map(StateLocked)
    }
}

/// Locks on `value` with `client` (or the default client), as the request's holder.
async fn lock<T: LockKey, R>(
    value: T,
    parts: &Parts,
    client: Option<LockClient>,
) -> Result<Guarded<T>, LockedRejection<R>> {
    let reject = |e: LockError| {
        let rejection = LockRejection::from_lock_error(&e, T::CONFLICT_STATUS, false);
        tracing::debug!(error = %e, status = rejection.status().as_u16(), "Locked extractor rejected the request");
        LockedRejection::Lock(rejection)
    };
    let client = match client {
        Some(client) => client,
        None => default_client().await.map_err(reject)?,
    };
    let holder = parts
        .extensions
        .get::<LockInfo>()
        .map(|info| info.holder.clone())
        .or_else(Holder::current)
        .unwrap_or_else(|| client.holder());
    let mut lock = client.lock(value.lock_key()).holder(&holder);
    if let Some(lease) = T::LEASE {
        lock = lock.lease(lease);
    }
    let guard = lock.try_acquire(T::WAIT).await.map_err(reject)?;
    Ok(Guarded::new(value, guard))
}

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

/// Extracts `T` (any [`FromRequestParts`] that implements [`LimitKey`]) and holds a
/// permit of its limit while the handler keeps the extracted value: at most
/// [`LimitKey::permits`] handlers with the same key run at once, on every replica. A
/// handler that finds the limit full is answered 429 (or [`LimitKey::FULL_STATUS`]) with
/// `Retry-After` and a problem body.
///
/// ```
/// use axum::{extract::Path, routing::post, Router};
/// use lockwarden::{LimitKey, Limited, LockClient};
///
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
/// impl<S: Send + Sync> axum::extract::FromRequestParts<S> for Account {
///     type Rejection = axum::extract::rejection::PathRejection;
///     async fn from_request_parts(parts: &mut http::request::Parts, state: &S) -> Result<Self, Self::Rejection> {
///         Ok(Account(Path::<String>::from_request_parts(parts, state).await?.0))
///     }
/// }
///
/// async fn export(Limited(account): Limited<Account>) -> String {
///     format!("exporting for {} (token {})", account.0, account.fencing_token())
/// }
///
/// let app: Router = Router::new()
///     .route("/accounts/{id}/export", post(export))
///     .with_state(LockClient::in_memory());
/// ```
///
/// The client is found as [`Locked`]'s is: the request's extensions, the router's state
/// if it is a [`LockClient`], or [`default_client`].
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
        permit(value, client).await.map(Limited)
    }
}

/// Takes a permit of `value`'s limit with `client` (or the default client).
async fn permit<T: LimitKey, R>(
    value: T,
    client: Option<LockClient>,
) -> Result<Guarded<T>, LockedRejection<R>> {
    let reject = |e: LockError| {
        let rejection = LockRejection::from_lock_error(&e, T::FULL_STATUS, true);
        tracing::debug!(error = %e, status = rejection.status().as_u16(), "Limited extractor rejected the request");
        LockedRejection::Lock(rejection)
    };
    let client = match client {
        Some(client) => client,
        None => default_client().await.map_err(reject)?,
    };
    let mut permits = client.semaphore(value.limit_key(), value.permits());
    if let Some(lease) = T::LEASE {
        permits = permits.lease(lease);
    }
    let guard = permits.try_acquire(T::WAIT).await.map_err(reject)?;
    Ok(Guarded::new(value, guard))
}

/// The client in the extensions, or the state if the state is one.
fn client_of<S: 'static>(parts: &Parts, state: &S) -> Option<LockClient> {
    parts
        .extensions
        .get::<LockClient>()
        .cloned()
        .or_else(|| (state as &dyn Any).downcast_ref::<LockClient>().cloned())
}
