//! Every Redis command of the store waits a bounded time.

use std::future::Future;
use std::time::Duration;

use redis::RedisResult;

use super::explain::explain;
use crate::error::BackendError;

/// `fut`, failing with [`BackendError::TimedOut`] after `timeout` (its own errors as
/// [`explain`] reads them).
pub(crate) async fn bounded<T>(
    timeout: Duration,
    fut: impl Future<Output = RedisResult<T>>,
) -> Result<T, BackendError> {
    match tokio::time::timeout(timeout, fut).await {
        Ok(reply) => reply.map_err(explain),
        Err(_) => Err(BackendError::TimedOut(timeout)),
    }
}
