//! [`Guarded<T>`]: a value an extractor ([`Locked`](super::Locked),
//! [`Limited`](super::Limited)) took with the lock or permit it holds; and what the
//! extractors share: [`LockedRejection`], the one path from a value to its guard (the
//! client, the attempt, the refusal answered and logged as the layers' are), and each
//! extractor type's hold times.

use std::any::Any;
use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::ops::{Deref, DerefMut};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::Duration;

use axum::response::{IntoResponse, Response};
use http::request::Parts;

use super::admission::Refusal;
use super::hold::{connected, refusal};
use super::metrics::Route;
use super::rejection::Rejection;
use super::retry_after::{HoldTicket, HoldTimes};
use crate::{LockClient, LockError, LockGuard, LockInfo};

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

pub(crate) use wraps_guarded;

/// Why [`Locked<T>`](super::Locked) (or [`Limited<T>`](super::Limited)) could not be
/// extracted: `T`'s own rejection, or the lock's (or permit's).
///
/// ```
/// use axum::response::IntoResponse;
/// use lockwarden::{Rejection, LockedRejection};
///
/// let rejection: LockedRejection<axum::http::StatusCode> = LockedRejection::Lock(Rejection::Lost);
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
    Lock(Rejection),
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

/// The one path of every extractor from `value` to its guard: the client (`client`, or
/// the default one), `attempt` with it, and a refusal answered as `busy` says (with the
/// `Retry-After` estimated from the holds of `T`'s type on the request's route) and
/// logged as the layers log theirs, `by` the extractor.
pub(crate) async fn guard<T, R, A, Fut>(
    value: T,
    parts: &Parts,
    client: Option<LockClient>,
    by: &'static str,
    busy: impl FnOnce(Duration) -> Rejection,
    attempt: A,
) -> Result<Guarded<T>, LockedRejection<R>>
where
    A: FnOnce(&LockClient, &T) -> Fut,
    Fut: Future<Output = Result<LockGuard, LockError>>,
{
    let refused = |refusal: Refusal| {
        refusal.rejection.log(refusal.cause.as_ref(), by);
        LockedRejection::Lock(refusal.rejection)
    };
    let client = match connected(client).await {
        Ok(client) => client,
        Err(error) => {
            let rejection = Rejection::from_lock_error(&error);
            return Err(refused(Refusal {
                rejection,
                cause: Some(error),
                headers: http::HeaderMap::new(),
            }));
        }
    };
    let route = Route::in_extensions(&parts.extensions);
    let times = hold_times::<T>();
    match attempt(&client, &value).await {
        Ok(guard) => {
            let ticket = times.begin(guard.key(), route.as_str());
            Ok(Guarded {
                value,
                guard,
                ticket: Some(ticket),
            })
        }
        Err(error) => Err(refused(refusal(
            error,
            &client,
            &times,
            route.as_str(),
            busy,
        ))),
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

/// The client in the extensions, or the state if the state is one.
pub(crate) fn client_of<S: 'static>(parts: &Parts, state: &S) -> Option<LockClient> {
    parts
        .extensions
        .get::<LockClient>()
        .cloned()
        .or_else(|| (state as &dyn Any).downcast_ref::<LockClient>().cloned())
}
