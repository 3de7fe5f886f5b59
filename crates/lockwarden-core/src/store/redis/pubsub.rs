//! The client's one pub/sub connection: subscribes to the release channels that have
//! local waiters and turns release notices into wake-ups.
//!
//! Each notice is read as a [`Notice`] and handed to `Waiters::deliver`; a message that is
//! no notice of ours is logged and wakes nobody.
//!
//! One task owns the connection and is the only one that sends SUBSCRIBE/UNSUBSCRIBE, so
//! the order on the wire always follows the registry's latest state. When the connection
//! drops it reconnects, resubscribes and wakes every waiter, since notices may have been
//! missed in between. A channel Redis refuses to subscribe (an ACL user without
//! `SUBSCRIBE` or the channel) is refused to its waiters, which fail with the refusal
//! instead of sleeping until each holder's lease ends; the connection stays up.
//!
//! On one server (and on the primary Sentinel names, followed across failovers) it is one
//! RESP2 pub/sub connection. On a cluster it is a RESP3 cluster connection: each
//! subscription goes to the node that owns the channel's slot (every channel of a lock is
//! in the lock's slot), and redis-rs resubscribes when nodes reconnect or slots move.
//! With sharded notices (`notices.rs`) it subscribes with `SSUBSCRIBE`, one slot's
//! channels per call, and hears `SPUBLISH` from the owner only; with classic ones a
//! `PUBLISH` from any node's script reaches every node's subscribers anyway.

use std::collections::HashSet;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures_util::{Stream, StreamExt};
use redis::{PushInfo, PushKind, RedisResult, Value};
use tokio::sync::{mpsc, watch};

use redis::cluster::ClusterClientBuilder;
use redis::cluster_routing::Slot;

use super::explain::{explain, naming};
use super::notices::Notices;
use super::scripts::What;
use super::sentinel::Followed;
use crate::error::BackendError;
use crate::metrics;
use crate::notice::Notice;
use crate::waiters::{Refusal, Waiters};

const MAX_BACKOFF: Duration = Duration::from_secs(2);
/// The longest a pub/sub connection may take to open, or a (un)subscription to answer.
const CONNECT: Duration = Duration::from_secs(2);

/// Where the pub/sub connection goes.
pub(super) enum Source {
    Server(Box<redis::Client>),
    /// The primary of this command connection, reconnected when it switches.
    Sentinel(Followed),
    /// A cluster, reached with a fresh client from this builder on each (re)connection.
    Cluster(Arc<dyn Fn() -> ClusterClientBuilder + Send + Sync>),
}

/// What the connection delivered.
enum Event {
    Notice {
        channel: String,
        payload: Vec<u8>,
    },
    /// A node connection dropped: notices may be missed until it is made again.
    Gap,
    /// Redis unsubscribed the connection from a shard channel: asked to, or because the
    /// node no longer serves the channel's slot (a failover, a slot moved away).
    Dropped(String),
    /// The connection is gone.
    End,
}

/// Why serving stopped.
enum Ended {
    /// The connection broke (or could not be made): reconnect.
    Lost,
    /// The client is gone.
    Closed,
}

pub(super) async fn run(
    source: Source,
    notices: Notices,
    waiters: Arc<Waiters>,
    mut changes: mpsc::UnboundedReceiver<Arc<str>>,
) {
    let mut backoff = Duration::from_millis(20);
    let mut reconnecting = false;
    loop {
        let mut session = Session {
            waiters: &waiters,
            changes: &mut changes,
            subscribed: HashSet::new(),
            reconnecting,
            served: false,
        };
        let ended = match &source {
            Source::Server(client) => match connect(client).await {
                Ok(pubsub) => session.serve_pubsub(pubsub, None).await,
                Err(error) => session.failed(error),
            },
            Source::Sentinel(followed) => {
                let switches = followed.switches();
                match connect(&followed.client()).await {
                    Ok(pubsub) => session.serve_pubsub(pubsub, Some(switches)).await,
                    Err(error) => {
                        followed.recheck();
                        session.failed(error)
                    }
                }
            }
            Source::Cluster(builder) => session.serve_cluster(builder(), notices).await,
        };
        let served = session.served;
        // The connection's subscriptions ended with it.
        metrics::subscriptions(-(session.subscribed.len() as f64));
        match ended {
            Ended::Closed => return,
            Ended::Lost if !served => {
                // Never got as far as subscribing: wait, draining changes meanwhile so
                // the channel does not grow while Redis is down.
                let sleep = tokio::time::sleep(backoff);
                tokio::pin!(sleep);
                loop {
                    tokio::select! {
                        _ = &mut sleep => break,
                        change = changes.recv() => if change.is_none() { return },
                    }
                }
                backoff = (backoff * 2).min(MAX_BACKOFF);
            }
            Ended::Lost => {
                backoff = Duration::from_millis(20);
                tracing::warn!(
                    "pub/sub connection lost; waiters fall back to lease timeouts until it is back"
                );
            }
        }
        waiters.set_all_unready();
        reconnecting = true;
    }
}

/// A pub/sub connection, given up after [`CONNECT`].
async fn connect(client: &redis::Client) -> RedisResult<redis::aio::PubSub> {
    within(client.get_async_pubsub()).await
}

/// `op`, given up after [`CONNECT`]: a paused server accepts connections and commands and
/// then says nothing, and the loop must stay free to follow a new primary or reconnect.
async fn within<T>(op: impl Future<Output = RedisResult<T>>) -> RedisResult<T> {
    match tokio::time::timeout(CONNECT, op).await {
        Ok(done) => done,
        Err(_) => Err(redis::RedisError::from(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            "pub/sub command timed out",
        ))),
    }
}

/// One connection's life: subscribe to what is wanted, then follow the registry.
struct Session<'a> {
    waiters: &'a Waiters,
    changes: &'a mut mpsc::UnboundedReceiver<Arc<str>>,
    subscribed: HashSet<Arc<str>>,
    /// Whether this is a reconnection: waiters are woken once subscribed.
    reconnecting: bool,
    /// Whether the connection got as far as subscribing (if not, back off before retrying).
    served: bool,
}

impl Session<'_> {
    fn failed(&mut self, error: redis::RedisError) -> Ended {
        tracing::debug!(%error, "pub/sub connection failed; retrying");
        Ended::Lost
    }

    async fn serve_pubsub(
        &mut self,
        pubsub: redis::aio::PubSub,
        mut switches: Option<watch::Receiver<u64>>,
    ) -> Ended {
        let (mut sink, stream) = pubsub.split();
        let events = stream
            .map(|msg| Event::Notice {
                channel: msg.get_channel_name().to_owned(),
                payload: msg.get_payload_bytes().to_vec(),
            })
            .chain(futures_util::stream::once(async { Event::End }));
        // A new primary: this connection is on the old one.
        let switched = async move {
            match switches.as_mut() {
                Some(switches) => {
                    let _ = switches.changed().await;
                }
                None => std::future::pending().await,
            }
        };
        self.serve(&mut sink, events, switched).await
    }

    async fn serve_cluster(&mut self, builder: ClusterClientBuilder, notices: Notices) -> Ended {
        let (tx, rx) = mpsc::unbounded_channel::<PushInfo>();
        let client = match builder
            .use_protocol(redis::ProtocolVersion::RESP3)
            .push_sender(tx)
            .build()
        {
            Ok(client) => client,
            Err(error) => return self.failed(error),
        };
        let conn = match client.get_async_connection().await {
            Ok(conn) => conn,
            Err(error) => return self.failed(error),
        };
        let mut sub = ClusterSubscriber { conn, notices };
        let events = tokio_stream(rx).filter_map(|push| async move { cluster_event(push) });
        self.serve(&mut sub, events, std::future::pending()).await
    }

    async fn serve<S: Subscriber>(
        &mut self,
        sub: &mut S,
        events: impl Stream<Item = Event>,
        switched: impl Future<Output = ()>,
    ) -> Ended {
        let wanted = self.waiters.wanted();
        if !wanted.is_empty() {
            let names: Vec<&str> = wanted.iter().map(|n| &**n).collect();
            let Ok(taken) = self.subscribe(sub, &names).await else {
                return Ended::Lost;
            };
            for (name, taken) in wanted.into_iter().zip(taken) {
                if taken {
                    self.waiters.set_ready(&name, true);
                    self.subscribed.insert(name);
                }
            }
            metrics::subscriptions(self.subscribed.len() as f64);
        }
        if self.reconnecting {
            tracing::info!("pub/sub connection re-established; waiters retry");
            self.waiters.wake_all();
        }
        self.served = true;

        tokio::pin!(events, switched);
        loop {
            tokio::select! {
                biased;
                event = events.next() => match event {
                    Some(Event::Notice { channel, payload }) => match Notice::read(&payload) {
                        Ok(notice) => self.waiters.deliver(&channel, notice),
                        // Not ours (another program publishing on the channel): no
                        // wake-up, its waiters sleep until the holder's lease ends.
                        Err(malformed) => {
                            tracing::warn!(channel, %malformed, "ignored a message on a lock's channel");
                        }
                    },
                    // A cluster node's connection dropped. redis-rs subscribes again only
                    // on a node that comes back, and this connection sends nothing that
                    // would make it learn the slots' new masters (a failover): start
                    // afresh from the cluster's current slot map, then waiters retry.
                    Some(Event::Gap) => {
                        tracing::info!("a pub/sub node connection dropped; reconnecting");
                        return Ended::Lost;
                    }
                    // Not asked for (still subscribed here, still wanted): the slot has a
                    // new master, where the channel is subscribed again (redis-rs forgets
                    // a shard channel Redis unsubscribed), and its waiters retry, as
                    // notices may have been missed meanwhile.
                    Some(Event::Dropped(channel)) => {
                        let Some(name) = self.subscribed.take(channel.as_str()) else {
                            continue;
                        };
                        tracing::info!(channel, "Redis dropped a shard channel; subscribing again");
                        self.waiters.set_ready(&name, false);
                        if self.sync(sub, vec![name]).await.is_err() {
                            return Ended::Lost;
                        }
                        self.waiters.notify_all(&channel);
                    }
                    Some(Event::End) | None => return Ended::Lost,
                },
                () = &mut switched => {
                    tracing::info!("following the new primary's release notices");
                    return Ended::Lost;
                }
                change = self.changes.recv() => {
                    let Some(first) = change else { return Ended::Closed };
                    let mut batch = vec![first];
                    while let Ok(more) = self.changes.try_recv() {
                        batch.push(more);
                    }
                    if self.sync(sub, batch).await.is_err() {
                        return Ended::Lost;
                    }
                }
            }
        }
    }

    /// Subscribes to `names`; says for each whether it is subscribed. A channel Redis
    /// refuses (an ACL user without `SUBSCRIBE` or without the channel) is refused to its
    /// waiters, which then fail with Redis's reason, and the connection stays up.
    async fn subscribe<S: Subscriber>(
        &mut self,
        sub: &mut S,
        names: &[&str],
    ) -> RedisResult<Vec<bool>> {
        let error = match within(sub.subscribe(names)).await {
            Ok(()) => return Ok(vec![true; names.len()]),
            Err(error) => error,
        };
        if refusal(error.clone()).is_none() {
            return Err(error);
        }
        // Redis refuses the whole command for one channel it refuses: find which.
        let mut taken = Vec::with_capacity(names.len());
        for &name in names {
            let one = match names.len() {
                1 => Err(error.clone()),
                _ => within(sub.subscribe(&[name])).await,
            };
            taken.push(match one {
                Ok(()) => true,
                Err(error) => match refusal(error.clone()) {
                    Some(refusal) => {
                        tracing::warn!(channel = name, command = %refusal.command,
                            reason = %refusal.message,
                            "Redis refused a subscription: its waiters fail instead of waiting without notices");
                        self.waiters.refuse(name, refusal);
                        false
                    }
                    None => return Err(error),
                },
            });
        }
        Ok(taken)
    }

    /// Brings the connection's subscriptions in line with the registry for `names`.
    async fn sync<S: Subscriber>(
        &mut self,
        sub: &mut S,
        mut names: Vec<Arc<str>>,
    ) -> RedisResult<()> {
        names.sort_unstable();
        names.dedup();
        let before = self.subscribed.len() as f64;
        let (want, drop): (Vec<_>, Vec<_>) =
            names.into_iter().partition(|n| self.waiters.is_wanted(n));
        let (already, new): (Vec<_>, Vec<_>) =
            want.into_iter().partition(|n| self.subscribed.contains(n));
        let to_subscribe: Vec<&str> = new.iter().map(|n| &**n).collect();
        let taken = if to_subscribe.is_empty() {
            Vec::new()
        } else {
            self.subscribe(sub, &to_subscribe).await?
        };
        for name in already {
            self.waiters.set_ready(&name, true);
        }
        for (name, taken) in new.into_iter().zip(taken) {
            if taken {
                self.waiters.set_ready(&name, true);
                self.subscribed.insert(name);
            }
        }
        let to_unsubscribe: Vec<_> = drop
            .into_iter()
            .filter(|n| self.subscribed.remove(n))
            .collect();
        if !to_unsubscribe.is_empty() {
            let names: Vec<&str> = to_unsubscribe.iter().map(|n| &**n).collect();
            match within(sub.unsubscribe(&names)).await {
                Ok(()) => {}
                // An ACL user without UNSUBSCRIBE: stay subscribed (notices nobody waits
                // for are dropped here) rather than drop the connection to get rid of it.
                Err(error) if refusal(error.clone()).is_some() => {
                    tracing::warn!(%error, channels = names.len(),
                        "Redis refused UNSUBSCRIBE; the channels stay subscribed");
                    self.subscribed.extend(to_unsubscribe);
                }
                Err(error) => return Err(error),
            }
        }
        metrics::subscriptions(self.subscribed.len() as f64 - before);
        Ok(())
    }
}

/// The refused command and Redis's text, if `error` is an ACL refusal of a subscription.
fn refusal(error: redis::RedisError) -> Option<Refusal> {
    match naming(explain(error), What::Command("SUBSCRIBE")) {
        BackendError::NotPermitted { command, message } => Some(Refusal { command, message }),
        _ => None,
    }
}

/// The two ways of subscribing: a pub/sub connection's sink, a RESP3 cluster connection.
trait Subscriber {
    fn subscribe(&mut self, names: &[&str]) -> impl Future<Output = RedisResult<()>> + Send;
    fn unsubscribe(&mut self, names: &[&str]) -> impl Future<Output = RedisResult<()>> + Send;
}

impl Subscriber for redis::aio::PubSubSink {
    fn subscribe(&mut self, names: &[&str]) -> impl Future<Output = RedisResult<()>> + Send {
        redis::aio::PubSubSink::subscribe(self, names.to_vec())
    }
    fn unsubscribe(&mut self, names: &[&str]) -> impl Future<Output = RedisResult<()>> + Send {
        redis::aio::PubSubSink::unsubscribe(self, names.to_vec())
    }
}

/// A RESP3 cluster connection, subscribing the way its notices travel.
struct ClusterSubscriber {
    conn: redis::cluster_async::ClusterConnection,
    notices: Notices,
}

impl ClusterSubscriber {
    /// (Un)subscribes `names` the way notices travel: a sharded call per slot, since it
    /// may name one slot only. Through redis-rs's own calls, which it repeats when nodes
    /// reconnect or slots move.
    async fn send(&mut self, subscribe: bool, names: Vec<&str>) -> RedisResult<()> {
        let conn = &mut self.conn;
        match (self.notices, subscribe) {
            (Notices::Classic, true) => conn.subscribe(names).await,
            (Notices::Classic, false) => conn.unsubscribe(names).await,
            (Notices::Sharded, _) => {
                for names in by_slot(&names) {
                    match subscribe {
                        true => conn.ssubscribe(names).await?,
                        false => conn.sunsubscribe(names).await?,
                    }
                }
                Ok(())
            }
        }
    }
}

impl Subscriber for ClusterSubscriber {
    fn subscribe(&mut self, names: &[&str]) -> impl Future<Output = RedisResult<()>> + Send {
        self.send(true, names.to_vec())
    }
    fn unsubscribe(&mut self, names: &[&str]) -> impl Future<Output = RedisResult<()>> + Send {
        self.send(false, names.to_vec())
    }
}

/// `names` in groups of one slot each: a sharded (un)subscription names one slot.
fn by_slot<'a>(names: &[&'a str]) -> Vec<Vec<&'a str>> {
    let mut groups: Vec<(Slot, Vec<&str>)> = Vec::new();
    for &name in names {
        let slot = Slot::for_key(name);
        match groups.iter_mut().find(|(s, _)| *s == slot) {
            Some((_, group)) => group.push(name),
            None => groups.push((slot, vec![name])),
        }
    }
    groups.into_iter().map(|(_, group)| group).collect()
}

/// A release notice or a reconnection among a cluster connection's pushes.
fn cluster_event(push: PushInfo) -> Option<Event> {
    match push.kind {
        PushKind::Message | PushKind::SMessage => match <[Value; 2]>::try_from(push.data) {
            Ok([Value::BulkString(channel), Value::BulkString(payload)]) => Some(Event::Notice {
                channel: String::from_utf8(channel).ok()?,
                payload,
            }),
            _ => None,
        },
        PushKind::Disconnection => Some(Event::Gap),
        PushKind::SUnsubscribe => match push.data.first() {
            Some(Value::BulkString(channel)) => {
                Some(Event::Dropped(String::from_utf8(channel.clone()).ok()?))
            }
            _ => None,
        },
        _ => None,
    }
}

fn tokio_stream<T>(mut rx: mpsc::UnboundedReceiver<T>) -> impl Stream<Item = T> {
    futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx))
}
