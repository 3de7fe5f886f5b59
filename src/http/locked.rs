//! [`Locked<T>`]: an axum extractor that locks on a value taken from the request (e.g. an
//! order id from the path) and holds the lock for as long as the handler keeps it; and
//! [`StateLocked<T>`], which takes the client from the state with `FromRef`.

use std::fmt;
use std::ops::{Deref, DerefMut};
use std::time::Duration;

use axum::extract::{FromRef, FromRequestParts, Path};
use http::request::Parts;
use http::StatusCode;

use super::guarded::{client_of, guard, wraps_guarded, Guarded, LockedRejection};
use super::locking::Locking;
use crate::{Holder, LockClient, LockInfo};

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
/// state if the state is a `LockClient`, or [`default_client`](super::default_client). When the client is a field
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

/// Locks on `value` with `client` (or the default client), as the request's holder: the
/// one a layer's request runs as, the task's, or a new one.
async fn lock<T: LockKey, R>(
    value: T,
    parts: &Parts,
    client: Option<LockClient>,
    by: &'static str,
) -> Result<Guarded<T>, LockedRejection<R>> {
    let holder = parts
        .extensions
        .get::<LockInfo>()
        .map(|info| info.holder.clone())
        .or_else(Holder::current);
    let busy = |retry_after| Locking::busy(T::CONFLICT_STATUS, retry_after);
    guard(value, parts, client, by, busy, |client, value| {
        let holder = holder.unwrap_or_else(|| client.holder());
        let mut lock = client.lock(value.lock_key()).holder(&holder);
        if let Some(lease) = T::LEASE {
            lock = lock.lease(lease);
        }
        async move { lock.try_acquire(T::WAIT).await }
    })
    .await
}
