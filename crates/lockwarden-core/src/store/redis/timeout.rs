//! Every Redis command of the store waits a bounded time.

use std::future::Future;
use std::time::Duration;

use futures_util::FutureExt;
use redis::{RedisError, RedisResult};

use super::explain::explain;
use crate::error::BackendError;

/// `fut`, failing with [`BackendError::TimedOut`] after `timeout` (its own errors as
/// [`given_up`] reads them).
///
/// A plain function returning the timer's future, not an `async fn`: an `async fn`'s
/// future keeps its argument beside the future it awaits, so each layer of them around a
/// call doubled what every call carried (a release's future was 2 KB, allocated and
/// copied on each release).
pub(crate) fn bounded<T>(
    timeout: Duration,
    fut: impl Future<Output = RedisResult<T>>,
) -> impl Future<Output = Result<T, BackendError>> {
    tokio::time::timeout(timeout, fut).map(move |reply| match reply {
        Ok(reply) => reply.map_err(|error| given_up(error, timeout)),
        Err(_) => Err(BackendError::TimedOut(timeout)),
    })
}

/// `error` as [`explain`] reads it, but [`BackendError::TimedOut`] when redis-rs gave up
/// waiting itself: a cluster's calls carry redis-rs's bound of the same `timeout` (alone,
/// see `Commands::within`), and it fires before ours where both are set.
pub(crate) fn given_up(error: RedisError, timeout: Duration) -> BackendError {
    if error.is_timeout() {
        BackendError::TimedOut(timeout)
    } else {
        explain(error)
    }
}
