//! [`eventually`]: poll a condition until it holds, within a bound.

use std::fmt::Display;
use std::future::Future;
use std::io;
use std::thread;
use std::time::{Duration, Instant};

/// How long [`eventually`] sleeps between two checks.
pub const POLL_INTERVAL: Duration = Duration::from_millis(10);

/// Runs `check` until it returns `true`, sleeping [`POLL_INTERVAL`] (10 ms)
/// between rounds, and returns the instant it first held.
///
/// The wait is bounded: a check still false (or still running) `within`
/// after the call panics with `what`, so a test that waits for something
/// that never happens fails with a message instead of hanging. The check
/// runs at least once, even with a zero bound.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// use std::time::Duration;
/// let started = std::time::Instant::now();
/// lockwarden_testkit::eventually(Duration::from_secs(5), "50 ms have passed", || async {
///     started.elapsed() >= Duration::from_millis(50)
/// })
/// .await;
/// # }
/// ```
///
/// # Panics
///
/// With `not within <within>: <what>` once `within` has passed.
pub async fn eventually<F, Fut>(within: Duration, what: impl Display, mut check: F) -> Instant
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let started = tokio::time::Instant::now();
    let deadline = started + within;
    loop {
        // A check that hangs is cut off at the deadline (but always gets one full try).
        let bound = deadline.max(tokio::time::Instant::now() + POLL_INTERVAL);
        if let Ok(true) = tokio::time::timeout_at(bound, check()).await {
            return Instant::now();
        }
        if tokio::time::Instant::now() >= deadline {
            panic!("not within {within:?}: {what}");
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    }
}

/// The blocking twin of [`eventually`] for the testkit's own start-up waits: polls
/// `check` (`Some(reason)` while not there yet) every [`POLL_INTERVAL`] until it returns
/// `None`; after `within`, the last reason (or error) is returned for the caller to
/// report with what it knows (a node's log, say).
pub(crate) fn poll_until(
    within: Duration,
    check: impl Fn() -> io::Result<Option<String>>,
) -> Result<(), String> {
    let deadline = Instant::now() + within;
    loop {
        let reason = match check() {
            Ok(None) => return Ok(()),
            Ok(Some(reason)) => reason,
            Err(e) => e.to_string(),
        };
        if Instant::now() >= deadline {
            return Err(reason);
        }
        thread::sleep(POLL_INTERVAL);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[tokio::test]
    async fn returns_once_the_check_holds() {
        let calls = AtomicUsize::new(0);
        let started = Instant::now();
        let held = eventually(Duration::from_secs(5), "the third call", || async {
            calls.fetch_add(1, Ordering::SeqCst) == 2
        })
        .await;
        assert_eq!(calls.load(Ordering::SeqCst), 3);
        assert!(held >= started + 2 * POLL_INTERVAL, "slept between checks");
        assert!(held.elapsed() < Duration::from_secs(1));
    }

    #[tokio::test]
    async fn a_check_that_holds_at_once_is_run_once() {
        let calls = AtomicUsize::new(0);
        eventually(Duration::ZERO, "at once", || async {
            calls.fetch_add(1, Ordering::SeqCst);
            true
        })
        .await;
        assert_eq!(calls.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    #[should_panic(expected = "not within 100ms: the impossible")]
    async fn panics_with_what_after_the_bound() {
        eventually(Duration::from_millis(100), "the impossible", || async {
            false
        })
        .await;
    }

    #[tokio::test]
    async fn gives_up_near_the_bound() {
        let started = Instant::now();
        let outcome = tokio::spawn(eventually(Duration::from_millis(200), "never", || async {
            false
        }))
        .await;
        let took = started.elapsed();
        assert!(outcome.expect_err("it panics").is_panic());
        assert!(took >= Duration::from_millis(200), "{took:?}");
        assert!(took < Duration::from_secs(2), "{took:?}");
    }

    #[tokio::test]
    async fn a_hanging_check_is_cut_off() {
        let started = Instant::now();
        let outcome = tokio::spawn(eventually(
            Duration::from_millis(200),
            "a check that never answers",
            std::future::pending::<bool>,
        ))
        .await;
        assert!(outcome.expect_err("it panics").is_panic());
        assert!(started.elapsed() < Duration::from_secs(2));
    }
}
