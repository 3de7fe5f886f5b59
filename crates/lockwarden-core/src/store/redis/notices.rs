//! How release notices travel. On one server (or a Sentinel's primary) `PUBLISH` reaches
//! the subscribers of that server. On a cluster a classic `PUBLISH` is relayed to every
//! node, so each release costs every node some work; a sharded `SPUBLISH` (Redis ≥ 7)
//! stays on the shard that owns the channel's slot, and every channel of a lock carries
//! the lock's hash tag. A cluster client sends sharded notices when asked to
//! (`sharded_notices()`); every client of one lock must send and listen the same way.

/// How release notices travel: `PUBLISH`/`SUBSCRIBE`, or `SPUBLISH`/`SSUBSCRIBE`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Notices {
    Classic,
    Sharded,
}

impl Notices {
    /// The notices a connection uses: sharded only on a cluster, and only when asked for.
    pub(super) fn on(cluster: bool, sharded: bool) -> Self {
        match sharded && cluster {
            true => Notices::Sharded,
            false => Notices::Classic,
        }
    }
}
