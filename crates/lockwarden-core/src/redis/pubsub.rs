//! The client's one pub/sub connection: subscribes to the release channels that have
//! local waiters and turns release notices into wake-ups.
//!
//! One task owns the connection and is the only one that sends SUBSCRIBE/UNSUBSCRIBE, so
//! the order on the wire always follows the registry's latest state. When the connection
//! drops it reconnects, resubscribes and wakes every waiter, since notices may have been
//! missed in between.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use tokio::sync::mpsc;

use crate::waiters::Waiters;

const MAX_BACKOFF: Duration = Duration::from_secs(2);

pub(crate) async fn run(
    client: redis::Client,
    waiters: Arc<Waiters>,
    mut changes: mpsc::UnboundedReceiver<Arc<str>>,
) {
    let mut backoff = Duration::from_millis(20);
    let mut reconnecting = false;
    loop {
        let pubsub = match client.get_async_pubsub().await {
            Ok(pubsub) => pubsub,
            Err(error) => {
                tracing::debug!(%error, "pub/sub connection failed; retrying");
                // Drain changes meanwhile so the channel does not grow while Redis is down.
                let sleep = tokio::time::sleep(backoff);
                tokio::pin!(sleep);
                loop {
                    tokio::select! {
                        _ = &mut sleep => break,
                        change = changes.recv() => if change.is_none() { return },
                    }
                }
                backoff = (backoff * 2).min(MAX_BACKOFF);
                reconnecting = true;
                continue;
            }
        };
        backoff = Duration::from_millis(20);
        let (mut sink, mut stream) = pubsub.split();
        let mut subscribed: HashSet<Arc<str>> = HashSet::new();

        let wanted = waiters.wanted();
        if !wanted.is_empty() {
            let names: Vec<&str> = wanted.iter().map(|n| &**n).collect();
            if sink.subscribe(&names).await.is_err() {
                continue;
            }
            for name in wanted {
                waiters.set_ready(&name, true);
                subscribed.insert(name);
            }
        }
        if reconnecting {
            tracing::info!("pub/sub connection re-established; waiters retry");
            waiters.wake_all();
        }

        // Serve until the connection breaks.
        loop {
            tokio::select! {
                biased;
                msg = stream.next() => match msg {
                    // A completed claim's outcome serves every waiter, and so does a
                    // read-write lock open to readers; a lock serves one.
                    Some(msg) if matches!(msg.get_payload_bytes(), b"completed" | b"read") => {
                        waiters.notify_all(msg.get_channel_name());
                    }
                    Some(msg) => waiters.notify_one(msg.get_channel_name()),
                    None => break,
                },
                change = changes.recv() => {
                    let Some(first) = change else { return };
                    let mut batch = vec![first];
                    while let Ok(more) = changes.try_recv() {
                        batch.push(more);
                    }
                    if sync(&mut sink, &waiters, &mut subscribed, batch).await.is_err() {
                        break;
                    }
                }
            }
        }
        tracing::warn!(
            "pub/sub connection lost; waiters fall back to lease timeouts until it is back"
        );
        waiters.set_all_unready();
        reconnecting = true;
    }
}

/// Brings the connection's subscriptions in line with the registry for `names`.
async fn sync(
    sink: &mut redis::aio::PubSubSink,
    waiters: &Waiters,
    subscribed: &mut HashSet<Arc<str>>,
    mut names: Vec<Arc<str>>,
) -> redis::RedisResult<()> {
    names.sort_unstable();
    names.dedup();
    let (want, drop): (Vec<_>, Vec<_>) = names.into_iter().partition(|n| waiters.is_wanted(n));
    let to_subscribe: Vec<&str> = want
        .iter()
        .filter(|n| !subscribed.contains(*n))
        .map(|n| &**n)
        .collect();
    if !to_subscribe.is_empty() {
        sink.subscribe(&to_subscribe).await?;
    }
    for name in want {
        waiters.set_ready(&name, true);
        subscribed.insert(name);
    }
    let to_unsubscribe: Vec<_> = drop.into_iter().filter(|n| subscribed.remove(n)).collect();
    if !to_unsubscribe.is_empty() {
        let names: Vec<&str> = to_unsubscribe.iter().map(|n| &**n).collect();
        sink.unsubscribe(&names).await?;
    }
    Ok(())
}
