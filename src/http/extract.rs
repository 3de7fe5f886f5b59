//! [`Locked<T>`]: an axum extractor that locks on a value taken from the request (e.g. an
//! order id from the path) and holds the lock for as long as the handler keeps it; and
//! [`Limited<T>`], which holds a permit of the value's concurrency limit instead.

use std::any::Any;
use std::collections::HashMap;
use std::fmt;
use std::ops::{Deref, DerefMut};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::Duration;

use axum::extract::{FromRef, FromRequestParts, Path};
use axum::response::{IntoResponse, Response};
use http::request::Parts;
use http::StatusCode;

use super::client::default_client;
use super::metrics::Route;
use super::rejection::LockRejection;
use super::retry_after::{HoldTicket, HoldTimes};
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

/// `Locked<Path<T>>` locks on the path parameters `T` deserializes into, as `T` says
/// (its name, wait, lease and status).
impl<T: LockKey> LockKey for Path<T> {
    const WAIT: Duration = T::WAIT;
    const LEASE: Option<Duration> = T::LEASE;
    const CONFLICT_STATUS: StatusCode = T::CONFLICT_STATUS;

    fn lock_key(&self) -> String {
        self.0.lock_key()
    }
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
    /// An extractor's hold in its type's record of hold times, ended with the hold.
    ticket: Option<HoldTicket>,
}

impl<T> Guarded<T> {
    /// Pairs `value` with the guard of its lock.
    pub fn new(value: T, guard: LockGuard) -> Self {
        Self {
            value,
            guard,
            ticket: None,
        }
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
        let Self {
            value,
            guard,
            ticket,
        } = self;
        drop(ticket);
        guard.release().await?;
        Ok(value)
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
/// `Locked<Path<T>>` locks on the path parameters, for any `T` that implements
/// [`LockKey`] and deserializes from them:
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
/// async fn ship(Locked(order): Locked<Path<OrderId>>) -> String {
///     // `order` derefs to the `Path` and holds `order:<id>` until it is dropped.
///     let Path(OrderId(id)) = &*order;
///     format!("shipping {id} (fencing token {})", order.fencing_token())
/// }
///
/// let app: Router = Router::new().route("/orders/{id}/ship", post(ship));
/// ```
///
/// Any other extractor works the same way once its type implements [`LockKey`], such as
/// a newtype of your own that reads a header or the authenticated user:
///
/// ```
/// use axum::extract::FromRequestParts;
/// use axum::http::{request::Parts, StatusCode};
/// use axum::{routing::post, Router};
/// use lockwarden::{LockKey, Locked};
///
/// /// The account a request acts for, from the `x-account` header.
/// struct Account(String);
///
/// impl<S: Send + Sync> FromRequestParts<S> for Account {
///     type Rejection = StatusCode;
///
///     async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
///         let account = parts.headers.get("x-account").ok_or(StatusCode::BAD_REQUEST)?;
///         let account = account.to_str().map_err(|_| StatusCode::BAD_REQUEST)?;
///         Ok(Account(account.to_owned()))
///     }
/// }
///
/// impl LockKey for Account {
///     fn lock_key(&self) -> String {
///         format!("account:{}", self.0)
///     }
/// }
///
/// async fn close(Locked(account): Locked<Account>) -> String {
///     format!("closing {}", account.0)
/// }
///
/// let app: Router = Router::new().route("/account/close", post(close));
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
///
/// A request that finds the lock busy is answered `409` (or [`LockKey::CONFLICT_STATUS`])
/// with a `Retry-After` estimated, as the layers do (see [`LockLayer`](super::LockLayer)),
/// from how long this extractor type's holds have lasted on the route.
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
        lock(value, parts, client, "the Locked extractor")
            .await
            .map(Locked)
    }
}

/// [`Locked<T>`] for apps whose state holds the lock client: takes it from the state
/// with axum's [`FromRef`] (as `State<LockClient>` would), then locks like `Locked<T>`.
///
/// ```
/// use axum::{extract::{FromRef, Path}, routing::post, Router};
/// use lockwarden::{LockClient, LockKey, StateLocked};
/// use serde::Deserialize;
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
/// #[derive(Deserialize)]
/// struct Invoice(u64);
///
/// impl LockKey for Invoice {
///     fn lock_key(&self) -> String {
///         format!("invoice:{}", self.0)
///     }
/// }
///
/// async fn pay(StateLocked(invoice): StateLocked<Path<Invoice>>) -> String {
///     format!("paying invoice {}", invoice.0 .0)
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
        lock(value, parts, Some(client), "the StateLocked extractor")
            .await
            .map(StateLocked)
    }
}

/// Locks on `value` with `client` (or the default client), as the request's holder.
async fn lock<T: LockKey, R>(
    value: T,
    parts: &Parts,
    client: Option<LockClient>,
    by: &'static str,
) -> Result<Guarded<T>, LockedRejection<R>> {
    let client = match client {
        Some(client) => client,
        None => default_client()
            .await
            .map_err(|e| rejected(e, None, T::CONFLICT_STATUS, false, by))?,
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
    let refused = |e| {
        let times = (&client, &*hold_times::<T>(), parts);
        rejected(e, Some(times), T::CONFLICT_STATUS, false, by)
    };
    let guard = lock.try_acquire(T::WAIT).await.map_err(refused)?;
    Ok(timed(value, guard, parts))
}

/// The answer to an extractor whose lock or permit could not be taken, logged as loud
/// as it is; with `estimate`, the `Retry-After` of a busy lock or full limit comes from
/// the holds of the extractor's type on the request's route.
fn rejected<R>(
    error: LockError,
    estimate: Option<(&LockClient, &HoldTimes, &Parts)>,
    status: StatusCode,
    permit: bool,
    by: &'static str,
) -> LockedRejection<R> {
    let rejection = match estimate {
        Some((client, times, parts)) => {
            let route = Route::in_extensions(&parts.extensions);
            LockRejection::from_refusal(&error, status, permit, (client, times, route.as_str()))
        }
        None => LockRejection::from_lock_error(&error, status, permit),
    };
    rejection.log(Some(&error), by);
    LockedRejection::Lock(rejection)
}

/// `value` held by `guard`, the hold counted in its type's record of hold times.
fn timed<T>(value: T, guard: LockGuard, parts: &Parts) -> Guarded<T> {
    let route = Route::in_extensions(&parts.extensions);
    let ticket = hold_times::<T>().begin(guard.key(), route.as_str());
    Guarded {
        value,
        guard,
        ticket: Some(ticket),
    }
}

/// The hold times of the extractors of type `T`, process-wide: each type keys its own
/// locks or limits, as a layer does.
fn hold_times<T>() -> Arc<HoldTimes> {
    static BY_TYPE: OnceLock<Mutex<HashMap<&'static str, Arc<HoldTimes>>>> = OnceLock::new();
    let by_type = BY_TYPE.get_or_init(Mutex::default);
    let mut by_type = by_type.lock().unwrap_or_else(PoisonError::into_inner);
    by_type
        .entry(std::any::type_name::<T>())
        .or_default()
        .clone()
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
        permit(value, parts, client).await.map(Limited)
    }
}

/// Takes a permit of `value`'s limit with `client` (or the default client).
async fn permit<T: LimitKey, R>(
    value: T,
    parts: &Parts,
    client: Option<LockClient>,
) -> Result<Guarded<T>, LockedRejection<R>> {
    const BY: &str = "the Limited extractor";
    let client = match client {
        Some(client) => client,
        None => default_client()
            .await
            .map_err(|e| rejected(e, None, T::FULL_STATUS, true, BY))?,
    };
    let mut permits = client.semaphore(value.limit_key(), value.permits());
    if let Some(lease) = T::LEASE {
        permits = permits.lease(lease);
    }
    let refused = |e| {
        let times = (&client, &*hold_times::<T>(), parts);
        rejected(e, Some(times), T::FULL_STATUS, true, BY)
    };
    let guard = permits.try_acquire(T::WAIT).await.map_err(refused)?;
    Ok(timed(value, guard, parts))
}

/// The client in the extensions, or the state if the state is one.
fn client_of<S: 'static>(parts: &Parts, state: &S) -> Option<LockClient> {
    parts
        .extensions
        .get::<LockClient>()
        .cloned()
        .or_else(|| (state as &dyn Any).downcast_ref::<LockClient>().cloned())
}
