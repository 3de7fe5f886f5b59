//! Acquisitions nobody waits for any more: an acquire whose caller went away (cancelled,
//! or timed out locally) while its script was in flight is finished in the background,
//! and what it took is given back, so a dropped acquire never leaves a lock held.

use redis::RedisResult;

use super::commands::Commands;
use super::scripts::{self, Reply};
use crate::finish::{BoxFuture, Undo};
use crate::hold::Hold;
use crate::store::contract::Waiter;

/// Undoes what an abandoned acquire of `hold` did, once its reply is in; `waiter`: what
/// a refused attempt of its kind leaves in the store, if anything.
pub(super) fn give_back(
    commands: Commands,
    hold: Hold,
    waiter: Option<Waiter>,
) -> Undo<RedisResult<Reply>> {
    Box::new(move |reply| -> BoxFuture {
        Box::pin(async move {
            let Ok(reply) = reply else {
                return;
            };
            let variant = commands.variant();
            let call = match (reply, waiter) {
                // Taken or re-entered: one count is ours and nobody will release it.
                (reply, _) if reply.holds() => scripts::release(&hold, None, variant),
                // Waiting in the store: nobody will wait for the turn, so leave now
                // rather than make the others wait for the place to run out.
                (Reply::Busy(_), Some(waiter)) => {
                    scripts::withdraw(waiter, &hold.key, &hold.holder, variant)
                }
                _ => return,
            };
            match commands.run::<redis::Value>(call).await {
                Ok(_) => {
                    tracing::debug!(key = %hold.key, "gave back what an abandoned acquire took")
                }
                Err(error) => tracing::warn!(key = %hold.key, %error,
                    "could not give back what an abandoned acquire took; it expires with its lease"),
            }
        })
    })
}
