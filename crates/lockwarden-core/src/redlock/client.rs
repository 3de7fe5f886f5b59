//! [`Redlock`]: one lock service over N independent Redis masters. How one is made is in
//! `builder.rs`.

use std::sync::Arc;
use std::time::Duration;

use super::lock::RedlockLock;
use super::nodes::Nodes;
use crate::client::LockClient;
use crate::error::LockError;
use crate::key::Key;

/// A lock over N independent Redis masters that holds only with a majority. Cheap to
/// clone; clones share the node clients. Read what it does **not** promise below before
/// using it.
///
/// # The algorithm as implemented
///
/// * **Nodes.** N independent Redis masters (no replication between them), N odd: 1 for
///   development, 3 or 5 in production. Each node is driven by its own [`LockClient`] and
///   the same scripts as a single-node lock, so a node's key is an ordinary lockwarden lock.
/// * **A round.** A fresh holder id (the same on every node) asks every node at once, each
///   answer bounded by the node timeout (default 100 ms, far below the lease). The round
///   started at `t0`; the lock is valid until `t0 + lease - drift`, with
///   `drift = lease * clock_drift_factor + 2 ms` (default factor 0.01). It is held iff a
///   majority (`N / 2 + 1`) took it and that instant is still ahead once every node has
///   answered or timed out.
/// * **A failed round** is undone on every node that did not answer "busy", including the
///   ones that timed out (their script may still run): the releases are sent before the
///   next round, and a fresh holder id per round keeps a late release from touching a
///   later hold.
/// * **Waiting.** While another holder has a majority, the waiter subscribes to the
///   release notices of every node (through each node client's pub/sub) and retries on the
///   first one, when the holder's lease should end, or after ten retry delays at the latest
///   (so a lost notice costs no more). When nobody has a majority (a split vote between
///   contenders, or nodes down) it retries after a random delay up to the retry delay
///   (default 200 ms), so contenders that failed together do not retry together. At the
///   wait budget it gives up with [`LockError::Timeout`] (someone holds it) or
///   [`RedlockError::NoQuorum`](crate::RedlockError::NoQuorum) (too few nodes answered to make a majority).
/// * **Extension** renews the lease on every node; it succeeds only if a majority still
///   held it and the fresh validity (from the start of the extension) is still ahead; at
///   most [`max_extensions`](crate::RedlockBuilder::max_extensions) times per guard, so a stuck
///   holder cannot keep the lock forever. A failed extension leaves the old validity; when
///   that runs out the guard is lost ([`RedlockGuard::lost`](crate::RedlockGuard::lost)).
/// * **Release** is sent to every node; dropping a guard releases in the background.
///
/// # What it promises, and what it does not
///
/// Redlock gives mutual exclusion *while the validity lasts*, under assumptions about time:
/// the clocks of the client and the nodes advance at about the same rate (within the drift
/// factor), nothing (GC, a stopped process, a swapped-out VM, network delay) pauses the
/// holder for longer than its remaining validity between checking it and using the
/// resource, and a node that crashes does not come back without the keys it had granted
/// (run it with `appendfsync always`, or keep it down for longer than the lease before it
/// rejoins: a "delayed restart").
///
/// It does **not** protect against any of these:
/// * a holder paused past its validity keeps acting while a second holder has the lock;
/// * a clock jump on a node (an NTP step, an operator) expires keys early and lets a second
///   holder take a majority;
/// * a node restarted without its data (the throw-away servers in our tests are like that)
///   forgets holds, so two holders can each count it in their majority;
/// * the nodes must not be replicas or failover pairs of each other: a master that fails
///   over before its replica received the key hands the lock out twice. The Redis
///   documentation's ["Distributed Locks with Redis"](https://redis.io/docs/latest/develop/use/patterns/distributed-locks/)
///   page describes this race for a single
///   replicated master, which is why Redlock asks for independent masters.
///
/// Martin Kleppmann, ["How to do distributed locking"](https://martin.kleppmann.com/2016/02/08/how-to-do-distributed-locking.html)
/// (2016), shows that a lock built on
/// timing cannot be safe in an asynchronous system and that a lock service must hand out
/// *fencing tokens* that the protected resource checks; Salvatore Sanfilippo (antirez)
/// answers in ["Is Redlock safe?"](http://antirez.com/news/101) (2016) that Redlock is safe under its timing assumptions.
/// Whatever one concludes, **the fencing token, checked by the resource, is the real
/// safety net.** Pass [`RedlockGuard::fencing_token`](crate::RedlockGuard::fencing_token) with every write and have the
/// resource refuse tokens lower than the highest it has seen. Redlock has no counter that
/// all nodes agree on, so its token is best effort: see that method for what it does and
/// does not order.
///
/// For most web services a single Redis (see [`LockClient`]) is the better choice:
/// replicated, with [`wait_for_replicas`](crate::LockClientBuilder::wait_for_replicas)
/// (Redis `WAIT`) where a failover must not lose a hold, and with fencing tokens.
/// Redlock's extra nodes buy availability through the loss of a node, not a guarantee the
/// fencing token does not already give; choose it for that, knowing its timing
/// assumptions.
///
/// ```no_run
/// use lockwarden_core::{LockError, Redlock};
/// use std::time::Duration;
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), LockError> {
/// let redlock = Redlock::builder()
///     .lease(Duration::from_secs(10))
///     .connect(&["redis://10.0.0.1/", "redis://10.0.0.2/", "redis://10.0.0.3/"])
///     .await?;
/// let guard = redlock.lock("nightly-report").try_acquire(Duration::from_secs(2)).await?;
/// // Give guard.fencing_token() to the resource; stop before guard.valid_until().
/// guard.release().await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Redlock {
    nodes: Arc<Nodes>,
}

impl Redlock {
    pub(super) fn from_nodes(nodes: Nodes) -> Self {
        Self {
            nodes: Arc::new(nodes),
        }
    }

    /// A handle on the lock named `name`. An invalid name is reported when it is acquired.
    pub fn lock(&self, name: impl AsRef<str>) -> RedlockLock {
        RedlockLock::new(
            self.nodes.clone(),
            self.nodes.clients[0].make_key(name.as_ref()),
        )
    }

    /// Validates `name` and lays it out as every node stores it.
    ///
    /// # Errors
    /// [`LockError::InvalidKey`] if the name is rejected.
    pub fn key(&self, name: &str) -> Result<Key, LockError> {
        self.nodes.clients[0].key(name)
    }

    /// The node clients, in the order given.
    pub fn nodes(&self) -> &[LockClient] {
        &self.nodes.clients
    }

    /// How many nodes must grant a lock: a strict majority.
    pub fn quorum(&self) -> usize {
        self.nodes.quorum()
    }

    /// The lease each node grants (and each extension renews).
    pub fn lease(&self) -> Duration {
        self.nodes.config.lease
    }
}
