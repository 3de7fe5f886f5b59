//! The one way lockwarden finishes work its caller stopped waiting for: a release that
//! must reach the store, an acquire whose lock must be given back, a waiter's place in a
//! queue that must be left.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

/// What to do with the output of work nobody awaited to the end.
pub(crate) type Undo<T> = Box<dyn FnOnce(T) -> BoxFuture + Send>;

/// A boxed future run in the background.
pub(crate) type BoxFuture = Pin<Box<dyn Future<Output = ()> + Send>>;

/// Awaited, `Finish` runs its future inline. Dropped before the future completes (an
/// aborted task, a lost `select!`, a local timeout), it finishes the future on a task of
/// its own and hands the output to [`or_undo`](Self::or_undo)'s closure, if any: redis-rs
/// drops a queued command whose caller has gone, and a lock taken for nobody must be
/// released by someone. Costs one allocation, where a spawn per call would cost a task
/// and, on a multi-threaded runtime, a hop to another worker and back.
///
/// On drop the future is polled once first, so work that completes without waiting (the
/// in-process store's) is done at once, not on a task.
pub(crate) struct Finish<F>
where
    F: Future + Send + 'static,
    F::Output: Send,
{
    fut: Option<Pin<Box<F>>>,
    undo: Option<Undo<F::Output>>,
}

impl<F> Finish<F>
where
    F: Future + Send + 'static,
    F::Output: Send,
{
    pub(crate) fn new(fut: F) -> Self {
        Self {
            fut: Some(Box::pin(fut)),
            undo: None,
        }
    }

    /// If the future is abandoned, `undo` gets its output once it is there.
    pub(crate) fn or_undo(mut self, undo: Undo<F::Output>) -> Self {
        self.undo = Some(undo);
        self
    }

    /// Drops the work without running it: what it would have undone is settled otherwise.
    pub(crate) fn cancel(mut self) {
        self.fut = None;
    }
}

impl<F> Future for Finish<F>
where
    F: Future + Send + 'static,
    F::Output: Send,
{
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let Some(fut) = self.fut.as_mut() else {
            // Only `.await` polls a `Finish`, and it stops at the first `Ready`.
            return Poll::Pending;
        };
        let out = std::task::ready!(fut.as_mut().poll(cx));
        self.fut = None;
        Poll::Ready(out)
    }
}

impl<F> Drop for Finish<F>
where
    F: Future + Send + 'static,
    F::Output: Send,
{
    fn drop(&mut self) {
        let Some(mut fut) = self.fut.take() else {
            return;
        };
        // Outside a runtime nothing could finish it (and a store future may need one).
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let undo = self.undo.take();
        let mut cx = Context::from_waker(std::task::Waker::noop());
        match fut.as_mut().poll(&mut cx) {
            Poll::Ready(out) => {
                if let Some(undo) = undo {
                    runtime.spawn(undo(out));
                }
            }
            Poll::Pending => {
                runtime.spawn(async move {
                    let out = fut.await;
                    if let Some(undo) = undo {
                        undo(out).await;
                    }
                });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    #[tokio::test]
    async fn dropped_work_still_finishes() {
        let done = Arc::new(AtomicBool::new(false));
        let flag = done.clone();
        let work = Finish::new(async move {
            tokio::time::sleep(Duration::from_millis(20)).await;
            flag.store(true, Ordering::SeqCst);
        });
        // Poll once, then give up on it.
        assert!(tokio::time::timeout(Duration::from_millis(1), work)
            .await
            .is_err());
        assert!(!done.load(Ordering::SeqCst));
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(done.load(Ordering::SeqCst), "finished in the background");
    }

    #[tokio::test]
    async fn abandoned_work_is_undone_with_its_output() {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let work = Finish::new(async {
            tokio::time::sleep(Duration::from_millis(20)).await;
            41
        })
        .or_undo(Box::new(move |out: i32| -> BoxFuture {
            Box::pin(async move {
                let _ = tx.send(out + 1);
            })
        }));
        assert!(tokio::time::timeout(Duration::from_millis(1), work)
            .await
            .is_err());
        let undone = tokio::time::timeout(Duration::from_secs(1), rx).await;
        assert_eq!(undone.ok().and_then(Result::ok), Some(42));
    }

    #[tokio::test]
    async fn work_that_needs_no_wait_is_done_at_the_drop() {
        let done = Arc::new(AtomicBool::new(false));
        let flag = done.clone();
        drop(Finish::new(
            async move { flag.store(true, Ordering::SeqCst) },
        ));
        assert!(done.load(Ordering::SeqCst), "done inline, not on a task");
    }

    #[tokio::test]
    async fn cancelled_work_never_runs() {
        let done = Arc::new(AtomicBool::new(false));
        let flag = done.clone();
        Finish::new(async move { flag.store(true, Ordering::SeqCst) }).cancel();
        tokio::task::yield_now().await;
        assert!(!done.load(Ordering::SeqCst));
    }

    #[tokio::test]
    async fn awaited_work_runs_inline_and_is_not_undone() {
        let undone = Arc::new(AtomicBool::new(false));
        let flag = undone.clone();
        let out = Finish::new(async { 7 })
            .or_undo(Box::new(move |_| -> BoxFuture {
                Box::pin(async move { flag.store(true, Ordering::SeqCst) })
            }))
            .await;
        assert_eq!(out, 7);
        tokio::task::yield_now().await;
        assert!(!undone.load(Ordering::SeqCst));
    }
}
