//! Finishing work its caller stopped waiting for.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

/// Runs `F` inline, like awaiting it, but if dropped before `F` completes (an aborted
/// task, a lost `select!`), finishes `F` on a task of its own. For commands that must
/// reach Redis once started, such as a release: redis-rs drops a queued command whose
/// caller has gone. Costs one allocation, where a spawn per call would cost a task and,
/// on a multi-threaded runtime, a hop to another worker and back.
pub(crate) struct Detached<F: Future + Send + 'static>(Option<Pin<Box<F>>>)
where
    F::Output: Send;

impl<F: Future + Send + 'static> Detached<F>
where
    F::Output: Send,
{
    pub(crate) fn new(fut: F) -> Self {
        Self(Some(Box::pin(fut)))
    }
}

impl<F: Future + Send + 'static> Future for Detached<F>
where
    F::Output: Send,
{
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let Some(fut) = self.0.as_mut() else {
            panic!("Detached polled after completion");
        };
        let out = std::task::ready!(fut.as_mut().poll(cx));
        self.0 = None;
        Poll::Ready(out)
    }
}

impl<F: Future + Send + 'static> Drop for Detached<F>
where
    F::Output: Send,
{
    fn drop(&mut self) {
        if let (Some(fut), Ok(runtime)) = (self.0.take(), tokio::runtime::Handle::try_current()) {
            runtime.spawn(fut);
        }
    }
}

/// Work to do with the output of a future nobody awaited to the end.
pub(crate) type Undo<T> = Box<dyn FnOnce(T) -> Pin<Box<dyn Future<Output = ()> + Send>> + Send>;

/// Like awaiting `F`, but if dropped before `F` completes, `F` is finished on a task of
/// its own and its output handed to `undo`: for an acquisition whose caller went away
/// (cancelled, or a local timeout) while the command was in flight, whose locks must then
/// be released by someone.
pub(crate) struct Undone<F: Future + Send + 'static>
where
    F::Output: Send,
{
    fut: Option<Pin<Box<F>>>,
    undo: Option<Undo<F::Output>>,
}

impl<F: Future + Send + 'static> Undone<F>
where
    F::Output: Send,
{
    pub(crate) fn new(fut: F, undo: Undo<F::Output>) -> Self {
        Self {
            fut: Some(Box::pin(fut)),
            undo: Some(undo),
        }
    }
}

impl<F: Future + Send + 'static> Future for Undone<F>
where
    F::Output: Send,
{
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let Some(fut) = self.fut.as_mut() else {
            panic!("Undone polled after completion");
        };
        let out = std::task::ready!(fut.as_mut().poll(cx));
        self.fut = None;
        Poll::Ready(out)
    }
}

impl<F: Future + Send + 'static> Drop for Undone<F>
where
    F::Output: Send,
{
    fn drop(&mut self) {
        let (Some(fut), Some(undo)) = (self.fut.take(), self.undo.take()) else {
            return;
        };
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move { undo(fut.await).await });
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
        let work = Detached::new(async move {
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
        let work = Undone::new(
            async {
                tokio::time::sleep(Duration::from_millis(20)).await;
                41
            },
            Box::new(
                move |out: i32| -> Pin<Box<dyn Future<Output = ()> + Send>> {
                    Box::pin(async move {
                        let _ = tx.send(out + 1);
                    })
                },
            ),
        );
        assert!(tokio::time::timeout(Duration::from_millis(1), work)
            .await
            .is_err());
        let undone = tokio::time::timeout(Duration::from_secs(1), rx).await;
        assert_eq!(undone.ok().and_then(Result::ok), Some(42));
    }

    #[tokio::test]
    async fn awaited_work_runs_inline() {
        assert_eq!(Detached::new(async { 7 }).await, 7);
    }
}
