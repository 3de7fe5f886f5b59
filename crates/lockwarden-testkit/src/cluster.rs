//! The [`RedisCluster`] handle: a Redis Cluster of master-only
//! [`RedisServer`]s on loopback (each behind a [`FaultProxy`] if asked), its
//! formation (slot assignment, `MEET`, convergence) and live resharding of
//! single slots.

use std::io;
use std::net::{Ipv4Addr, TcpListener};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use crate::eventually::poll_until;
use crate::proxy::FaultProxy;
use crate::server::{free_port, RedisServer};
use crate::tls::TlsCerts;

/// Number of hash slots in a Redis Cluster.
const SLOTS: usize = 16384;

/// Node timeout (`--cluster-node-timeout`, ms): small, so failures are
/// noticed quickly in tests.
const NODE_TIMEOUT_MS: &str = "1000";

/// Name of each node's cluster state file, relative to its own `--dir`.
const NODES_CONF: &str = "nodes.conf";

/// How long [`RedisCluster::start`] waits for the slot map to converge.
const FORM_TIMEOUT: Duration = Duration::from_secs(20);

/// How long [`RedisCluster::move_slot`] waits for every node to agree.
const MOVE_TIMEOUT: Duration = Duration::from_secs(10);

/// Delay between two convergence probes.
const POLL_INTERVAL: Duration = Duration::from_millis(50);

/// Connect timeout of the helper connections (short, so that a paused node
/// is skipped quickly when any node will do).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

/// Read/write timeout of the helper connections.
const IO_TIMEOUT: Duration = Duration::from_secs(5);

/// How many fresh cluster-bus ports are tried per node.
const BUS_PORT_ATTEMPTS: u32 = 3;

/// Keys moved per `MIGRATE` in [`RedisCluster::move_slot`].
const MIGRATE_BATCH: &str = "100";

/// `MIGRATE` timeout in milliseconds.
const MIGRATE_TIMEOUT_MS: &str = "5000";

/// A throw-away Redis Cluster: `masters` master-only nodes, each a
/// [`RedisServer`] on its own free loopback port (and its own free
/// cluster-bus port), with the 16384 slots split into contiguous ranges.
///
/// Each node keeps its `nodes.conf` in its own temp dir, so
/// [`RedisServer::restart`] on one of [`RedisCluster::nodes_mut`] brings it
/// back with the same node id, bus port and slots (but no data). Dropping the
/// cluster kills every node.
///
/// ```no_run
/// let cluster = lockwarden_testkit::RedisCluster::start(3)?;
/// let owner = cluster.owner("some-key")?;
/// let _: () = cluster.nodes()[owner]
///     .query(&["SET", "some-key", "v"])
///     .map_err(std::io::Error::other)?;
/// # Ok::<(), std::io::Error>(())
/// ```
#[derive(Debug)]
pub struct RedisCluster {
    /// The nodes: the masters first (index `i` was given the `i`-th slot
    /// range), then the replicas [added](RedisCluster::add_replica).
    nodes: Vec<RedisServer>,
    /// Cluster node id (`CLUSTER MYID`) of each node, by index.
    ids: Vec<String>,
    /// The proxy in front of each node, by index, in a cluster started with
    /// [`RedisCluster::start_proxied`]; empty otherwise.
    proxies: Vec<FaultProxy>,
}

/// One entry of `CLUSTER SLOTS`: a slot range and its master's port.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct SlotRange {
    /// First slot of the range.
    start: u16,
    /// Last slot of the range (inclusive).
    end: u16,
    /// Port of the master serving the range.
    port: u16,
}

impl RedisCluster {
    /// Starts a cluster of `masters` nodes (no replicas) and waits until it
    /// has formed.
    ///
    /// Each node runs with `--cluster-enabled yes --cluster-config-file
    /// nodes.conf --cluster-node-timeout 1000` and an explicit, freshly picked
    /// `--cluster-port` (the default bus port, port + 10000, may be out of
    /// range or taken). Node `i` gets the `i`-th of `masters` contiguous,
    /// near-equal slot ranges (node 0 starts at slot 0), the nodes are
    /// introduced with `CLUSTER MEET`, and this returns only once every node
    /// reports `cluster_state:ok` and the full expected slot map in
    /// `CLUSTER SLOTS` (waiting up to 20 s).
    ///
    /// # Errors
    ///
    /// `InvalidInput` unless `1 <= masters <= 16384`; any error starting a
    /// node (see [`RedisServer::start`]); a failing cluster command; or
    /// `TimedOut` if the cluster does not converge, quoting the last state
    /// seen and the node logs.
    pub fn start(masters: usize) -> io::Result<RedisCluster> {
        Self::start_inner(masters, None, false)
    }

    /// Like [`RedisCluster::start`], with every node behind a
    /// [`FaultProxy`] of its own that the node announces as its address
    /// (`--cluster-announce-ip 127.0.0.1 --cluster-announce-port <proxy>`;
    /// `--cluster-announce-bus-port` keeps the cluster bus direct). So
    /// `CLUSTER SLOTS`, `CLUSTER SHARDS` and `MOVED` name the proxies, and a
    /// cluster client, whichever node it is given first, sends every command
    /// through them: [`proxy`](RedisCluster::proxy) breaks one node's
    /// network. [`urls`](RedisCluster::urls) are the proxies'; the testkit's
    /// probes, the nodes' own [`url`](RedisServer::url)s and the cluster bus
    /// bypass them. A [restarted](RedisServer::restart) node announces its
    /// proxy again.
    ///
    /// Returns once, besides what [`RedisCluster::start`] waits for, every
    /// node's `CLUSTER NODES` names every node at its proxy's port and real
    /// bus port.
    ///
    /// # Errors
    ///
    /// As for [`RedisCluster::start`], or if a proxy cannot start.
    pub fn start_proxied(masters: usize) -> io::Result<RedisCluster> {
        Self::start_inner(masters, None, true)
    }

    /// Like [`RedisCluster::start`], over TLS with `certs`: every node is a
    /// [TLS server](RedisServer::start_tls) and the cluster bus (and
    /// `MIGRATE`) use TLS too (`--tls-cluster yes`), so
    /// [`urls`](RedisCluster::urls) are `rediss://` and `CLUSTER SLOTS` asked
    /// over TLS names the nodes' TLS ports. The plain-text ports stay open on
    /// loopback for the testkit's probes only (asked there, `CLUSTER SLOTS`
    /// names the plain-text ports).
    ///
    /// # Errors
    ///
    /// As for [`RedisCluster::start`].
    pub fn start_tls(masters: usize, certs: &Arc<TlsCerts>) -> io::Result<RedisCluster> {
        Self::start_inner(masters, Some(certs), false)
    }

    fn start_inner(
        masters: usize,
        tls: Option<&Arc<TlsCerts>>,
        proxied: bool,
    ) -> io::Result<RedisCluster> {
        if masters == 0 || masters > SLOTS {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("a cluster needs between 1 and {SLOTS} masters, not {masters}"),
            ));
        }
        let mut nodes = Vec::with_capacity(masters);
        let mut bus_ports = Vec::with_capacity(masters);
        let mut proxies = Vec::new();
        for _ in 0..masters {
            // The proxy's port is bound first: the node announces it from its start (and
            // again after a restart), before the node's own port is known.
            let listener = match proxied {
                true => Some(TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?),
                false => None,
            };
            let announce = match &listener {
                Some(listener) => Some(listener.local_addr()?.port()),
                None => None,
            };
            let (node, bus_port) = start_node(tls, announce)?;
            if let Some(listener) = listener {
                proxies.push(FaultProxy::start_on(listener, node.port())?);
            }
            nodes.push(node);
            bus_ports.push(bus_port);
        }

        let mut ids = Vec::with_capacity(masters);
        for (i, node) in nodes.iter().enumerate() {
            ids.push(run::<String>(node, &["CLUSTER", "MYID"])?);
            // Distinct config epochs up front (as redis-cli does) spare the
            // nodes the epoch-collision dance once they meet.
            let epoch = (i + 1).to_string();
            run::<()>(node, &["CLUSTER", "SET-CONFIG-EPOCH", &epoch])?;
            let (first, last) = slot_range(i, masters);
            run::<()>(
                node,
                &[
                    "CLUSTER",
                    "ADDSLOTSRANGE",
                    &first.to_string(),
                    &last.to_string(),
                ],
            )?;
        }
        for (node, &bus_port) in nodes.iter().zip(&bus_ports).skip(1) {
            meet(&nodes[0], node, bus_port)?;
        }

        let cluster = RedisCluster {
            nodes,
            ids,
            proxies,
        };
        let expected: Vec<SlotRange> = (0..masters)
            .map(|i| {
                let (start, end) = slot_range(i, masters);
                SlotRange {
                    start,
                    end,
                    port: cluster.announced_port(i),
                }
            })
            .collect();
        let mut addresses: Vec<NodeAddress> = (0..masters)
            .map(|i| NodeAddress {
                id: cluster.ids[i].clone(),
                port: cluster.announced_port(i),
                bus_port: bus_ports[i],
            })
            .collect();
        addresses.sort();
        cluster.wait_until("form", FORM_TIMEOUT, |node| {
            let info: String = run(node, &["CLUSTER", "INFO"])?;
            if !info.lines().any(|l| l.trim() == "cluster_state:ok") {
                return Ok(Some(format!(
                    "127.0.0.1:{} is not ok:\n{}",
                    node.port(),
                    info.trim()
                )));
            }
            let mut slots = cluster_slots(node)?;
            slots.sort_by_key(|r| r.start);
            if slots != expected {
                return Ok(Some(format!(
                    "127.0.0.1:{} sees slots {slots:?}, expected {expected:?}",
                    node.port()
                )));
            }
            // Only announced addresses are checked: a node that announces none learns its
            // own IP from a peer, some time after the slots agree.
            if !proxied {
                return Ok(None);
            }
            let mut seen = cluster_nodes(node)?;
            seen.sort();
            Ok((seen != addresses).then(|| {
                format!(
                    "127.0.0.1:{} sees nodes {seen:?}, expected {addresses:?}",
                    node.port()
                )
            }))
        })?;
        Ok(cluster)
    }

    /// The nodes' connection URLs, `redis://127.0.0.1:PORT/` (`rediss://` and
    /// their TLS ports in a [TLS cluster](RedisCluster::start_tls); their
    /// proxies' in a [proxied cluster](RedisCluster::start_proxied)), by
    /// index.
    pub fn urls(&self) -> Vec<String> {
        match self.proxies.is_empty() {
            true => self.nodes.iter().map(RedisServer::url).collect(),
            false => self.proxies.iter().map(FaultProxy::url).collect(),
        }
    }

    /// The [`FaultProxy`] in front of node `i` of a
    /// [proxied cluster](RedisCluster::start_proxied); `None` in another
    /// cluster, or for an index out of range.
    pub fn proxy(&self, i: usize) -> Option<&FaultProxy> {
        self.proxies.get(i)
    }

    /// The port node `i` announces: its proxy's, or its own.
    fn announced_port(&self, i: usize) -> u16 {
        self.proxies
            .get(i)
            .map_or_else(|| self.nodes[i].port(), FaultProxy::port)
    }

    /// Creates (or resets) the ACL user `user` with `password` and exactly
    /// `rules` on every node (see [`RedisServer::acl_user`]; a cluster does
    /// not share users) and returns each node's URL for it, by index.
    ///
    /// # Errors
    ///
    /// If a node rejects a rule or does not answer.
    pub fn acl_user(&self, user: &str, password: &str, rules: &[&str]) -> io::Result<Vec<String>> {
        self.nodes
            .iter()
            .map(|node| node.acl_user(user, password, rules))
            .collect()
    }

    /// The nodes, by index: master `i` started with the `i`-th slot range;
    /// [replicas](RedisCluster::add_replica) come after the masters.
    pub fn nodes(&self) -> &[RedisServer] {
        &self.nodes
    }

    /// The nodes, mutably, e.g. to [kill](RedisServer::kill) or
    /// [restart](RedisServer::restart) one.
    pub fn nodes_mut(&mut self) -> &mut [RedisServer] {
        &mut self.nodes
    }

    /// The hash slot of `key`, as computed by a live node
    /// (`CLUSTER KEYSLOT`).
    ///
    /// # Errors
    ///
    /// Fails if no node answers.
    pub fn slot(&self, key: &str) -> io::Result<u16> {
        self.any_node(|node| run(node, &["CLUSTER", "KEYSLOT", key]))
    }

    /// Index (into [`RedisCluster::nodes`]) of the node that currently owns
    /// `key`'s slot, according to a live node's `CLUSTER SLOTS` (so it
    /// reflects [`RedisCluster::move_slot`]).
    ///
    /// # Errors
    ///
    /// Fails if no node answers, or if the slot is unassigned or owned by a
    /// node outside this cluster.
    pub fn owner(&self, key: &str) -> io::Result<usize> {
        let slot = self.slot(key)?;
        self.any_node(|node| self.owner_seen_by(node, slot))
    }

    /// Moves `slot` (and every key in it) to node `to`, live: the target is
    /// set `IMPORTING`, the source `MIGRATING`, the keys are `MIGRATE`d in
    /// batches until none are left, and then every node is told
    /// `CLUSTER SETSLOT <slot> NODE <target>` (target first, then source, as
    /// the Redis docs recommend). Returns once every node's `CLUSTER SLOTS`
    /// shows `to` as the owner (waiting up to 10 s).
    ///
    /// Does nothing if `to` already owns the slot.
    ///
    /// # Errors
    ///
    /// `InvalidInput` for a slot above 16383 or an unknown node index; any
    /// failing command (every node must be up and answering); `TimedOut`
    /// if the nodes do not agree in time.
    pub fn move_slot(&self, slot: u16, to: usize) -> io::Result<()> {
        if usize::from(slot) >= SLOTS || to >= self.nodes.len() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "cannot move slot {slot} to node {to}: slots are 0..{SLOTS}, nodes 0..{}",
                    self.nodes.len()
                ),
            ));
        }
        let from = self.any_node(|node| self.owner_seen_by(node, slot))?;
        if from == to {
            return Ok(());
        }
        let (source, target) = (&self.nodes[from], &self.nodes[to]);
        let slot_arg = slot.to_string();
        // MIGRATE connects the way the cluster bus does: over TLS in a TLS cluster.
        let target_port = target.client_port().to_string();

        run::<()>(
            target,
            &[
                "CLUSTER",
                "SETSLOT",
                &slot_arg,
                "IMPORTING",
                &self.ids[from],
            ],
        )?;
        run::<()>(
            source,
            &["CLUSTER", "SETSLOT", &slot_arg, "MIGRATING", &self.ids[to]],
        )?;
        loop {
            let keys: Vec<String> = run(
                source,
                &["CLUSTER", "GETKEYSINSLOT", &slot_arg, MIGRATE_BATCH],
            )?;
            if keys.is_empty() {
                break;
            }
            let mut args = vec![
                "MIGRATE",
                "127.0.0.1",
                &target_port,
                "",
                "0",
                MIGRATE_TIMEOUT_MS,
                "KEYS",
            ];
            args.extend(keys.iter().map(String::as_str));
            run::<redis::Value>(source, &args)?;
        }

        let order = std::iter::once(to)
            .chain(std::iter::once(from))
            .chain((0..self.nodes.len()).filter(|&i| i != to && i != from));
        for i in order {
            run::<()>(
                &self.nodes[i],
                &["CLUSTER", "SETSLOT", &slot_arg, "NODE", &self.ids[to]],
            )?;
        }

        self.wait_until("move a slot", MOVE_TIMEOUT, |node| {
            let seen = self.owner_seen_by(node, slot);
            Ok(match seen {
                Ok(owner) if owner == to => None,
                Ok(owner) => Some(format!(
                    "127.0.0.1:{} still sees slot {slot} on node {owner}",
                    node.port()
                )),
                Err(e) => Some(format!("127.0.0.1:{}: {e}", node.port())),
            })
        })
    }

    /// Adds a replica of master `of`: a new node that meets the cluster and
    /// `CLUSTER REPLICATE`s it, returned as its index in
    /// [`nodes`](RedisCluster::nodes) once its link to the master is up
    /// (`INFO replication`: `master_link_status:up`, waiting up to 20 s). The
    /// slot ranges stay the masters'; [`fail_over`](RedisCluster::fail_over)
    /// promotes it.
    ///
    /// # Errors
    ///
    /// `InvalidInput` in a proxied or TLS cluster (a replica there would need
    /// a proxy or certificates of its own) or for an unknown master; any
    /// error starting the node or from a cluster command; `TimedOut` if it
    /// does not learn the master or sync in time.
    pub fn add_replica(&mut self, of: usize) -> io::Result<usize> {
        if !self.proxies.is_empty() || self.nodes.iter().any(|n| n.client_port() != n.port()) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "replicas are for plain clusters only (no proxies, no TLS)",
            ));
        }
        let Some(master_id) = self.ids.get(of).cloned() else {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("no node {of} to replicate: nodes 0..{}", self.nodes.len()),
            ));
        };
        let (node, bus_port) = start_node(None, None)?;
        let id: String = run(&node, &["CLUSTER", "MYID"])?;
        meet(&self.nodes[of], &node, bus_port)?;
        let index = self.nodes.len();
        self.nodes.push(node);
        self.ids.push(id);
        let replica = &self.nodes[index];
        wait_for(FORM_TIMEOUT, "learn its master", || {
            let nodes: String = run(replica, &["CLUSTER", "NODES"])?;
            Ok((!nodes.contains(&master_id)).then(|| format!("no {master_id} in:\n{nodes}")))
        })?;
        run::<()>(replica, &["CLUSTER", "REPLICATE", &master_id])?;
        wait_for(FORM_TIMEOUT, "sync with its master", || {
            let info: String = run(replica, &["INFO", "replication"])?;
            let up = info.lines().any(|l| l.trim() == "master_link_status:up");
            Ok((!up).then(|| info.trim().to_owned()))
        })?;
        Ok(index)
    }

    /// Promotes replica `replica` (see [`add_replica`](RedisCluster::add_replica))
    /// with a manual `CLUSTER FAILOVER`: its master stops taking writes, the
    /// replica catches up and takes the master's slots, so no write is lost.
    /// Returns once every node's `CLUSTER SLOTS` names it as the owner of
    /// every slot its master had, and the old master replicates it and every
    /// node's `CLUSTER NODES` says so (waiting up to 20 s).
    ///
    /// # Errors
    ///
    /// `InvalidInput` if `replica` is not a replica of a node of this
    /// cluster; a failing command; `TimedOut` if the nodes do not agree in
    /// time.
    pub fn fail_over(&self, replica: usize) -> io::Result<()> {
        let node = self.nodes.get(replica).ok_or_else(|| {
            io::Error::new(io::ErrorKind::InvalidInput, format!("no node {replica}"))
        })?;
        let info: String = run(node, &["INFO", "replication"])?;
        let master_port = info
            .lines()
            .find_map(|l| l.trim().strip_prefix("master_port:"))
            .and_then(|port| port.parse::<u16>().ok())
            .ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("node {replica} is not a replica: {}", info.trim()),
                )
            })?;
        let theirs: Vec<(u16, u16)> = self
            .any_node(cluster_slots)?
            .iter()
            .filter(|r| r.port == master_port)
            .map(|r| (r.start, r.end))
            .collect();
        let old_master = self
            .nodes
            .iter()
            .position(|n| n.port() == master_port)
            .ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("node {replica}'s master :{master_port} is not of this cluster"),
                )
            })?;
        run::<()>(node, &["CLUSTER", "FAILOVER"])?;
        let port = node.port();
        let (old_id, new_id) = (&self.ids[old_master], &self.ids[replica]);
        self.wait_until("fail over", FORM_TIMEOUT, |seen_by| {
            let slots = cluster_slots(seen_by)?;
            let moved = theirs.iter().all(|&(start, end)| {
                slots
                    .iter()
                    .any(|r| r.start == start && r.end == end && r.port == port)
            });
            if !moved {
                return Ok(Some(format!(
                    "127.0.0.1:{} sees {slots:?}, not {theirs:?} on {port}",
                    seen_by.port()
                )));
            }
            // `<id> <addr> <flags> <master id> ...`: the old master is the new one's replica.
            let nodes: String = run(seen_by, &["CLUSTER", "NODES"])?;
            let demoted = nodes.lines().any(|line| {
                let fields: Vec<&str> = line.split(' ').collect();
                fields.first() == Some(&old_id.as_str())
                    && fields.get(2).is_some_and(|flags| flags.contains("slave"))
                    && fields.get(3) == Some(&new_id.as_str())
            });
            if !demoted {
                return Ok(Some(format!(
                    "127.0.0.1:{} does not see {old_id} replicating {new_id}:\n{nodes}",
                    seen_by.port()
                )));
            }
            Ok(None)
        })?;
        wait_for(FORM_TIMEOUT, "replicate its new master", || {
            let info: String = run(&self.nodes[old_master], &["INFO", "replication"])?;
            let up = info.lines().any(|l| l.trim() == "master_link_status:up");
            Ok((!up).then(|| info.trim().to_owned()))
        })
    }

    /// The index of the node that `node`'s `CLUSTER SLOTS` names as owner
    /// of `slot`.
    fn owner_seen_by(&self, node: &RedisServer, slot: u16) -> io::Result<usize> {
        let slots = cluster_slots(node)?;
        let range = slots
            .iter()
            .find(|r| r.start <= slot && slot <= r.end)
            .ok_or_else(|| {
                io::Error::other(format!(
                    "slot {slot} is not assigned according to 127.0.0.1:{}",
                    node.port()
                ))
            })?;
        self.index_of_port(range.port).ok_or_else(|| {
            io::Error::other(format!(
                "slot {slot} is owned by 127.0.0.1:{}, which is not a node of this cluster",
                range.port
            ))
        })
    }

    /// Index of the node announced at `port` (listening on it, or behind a
    /// proxy there).
    fn index_of_port(&self, port: u16) -> Option<usize> {
        (0..self.nodes.len()).find(|&i| self.announced_port(i) == port)
    }

    /// Runs `f` on the nodes that have a process, in order, and returns the
    /// first success (so a killed or paused node is skipped).
    fn any_node<T>(&self, f: impl Fn(&RedisServer) -> io::Result<T>) -> io::Result<T> {
        let mut errors = Vec::new();
        for node in self.nodes.iter().filter(|n| n.pid().is_some()) {
            match f(node) {
                Ok(value) => return Ok(value),
                Err(e) => errors.push(format!("127.0.0.1:{}: {e}", node.port())),
            }
        }
        if errors.is_empty() {
            errors.push("no node is running".to_owned());
        }
        Err(io::Error::other(format!(
            "no cluster node could answer: {}",
            errors.join("; ")
        )))
    }

    /// Polls every node with `check` (which returns `Some(reason)` while that
    /// node is not there yet) until all pass, or fails with `TimedOut`
    /// quoting the last reason and the node logs.
    fn wait_until(
        &self,
        what: &str,
        timeout: Duration,
        check: impl Fn(&RedisServer) -> io::Result<Option<String>>,
    ) -> io::Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            let mut pending = None;
            for node in &self.nodes {
                pending = match check(node) {
                    Ok(None) => continue,
                    Ok(Some(reason)) => Some(reason),
                    Err(e) => Some(format!("127.0.0.1:{}: {e}", node.port())),
                };
                break;
            }
            let Some(reason) = pending else {
                return Ok(());
            };
            if Instant::now() >= deadline {
                let logs: Vec<String> = self
                    .nodes
                    .iter()
                    .map(|n| format!("--- log of 127.0.0.1:{} ---\n{}", n.port(), n.log_tail()))
                    .collect();
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!(
                        "cluster did not {what} within {timeout:?}: {reason}\n{}",
                        logs.join("\n")
                    ),
                ));
            }
            thread::sleep(POLL_INTERVAL);
        }
    }
}

/// Starts one cluster-enabled node with a fresh bus port, retrying with
/// another bus port if the chosen one was taken meanwhile. With `announce`,
/// the node gives that port as its own to peers and clients.
fn start_node(
    tls: Option<&Arc<TlsCerts>>,
    announce: Option<u16>,
) -> io::Result<(RedisServer, u16)> {
    let announce = announce.map(|port| port.to_string());
    let mut last_err = None;
    for _ in 0..BUS_PORT_ATTEMPTS {
        let bus_port = free_port()?.to_string();
        let mut args = vec![
            "--cluster-enabled",
            "yes",
            "--cluster-config-file",
            NODES_CONF,
            "--cluster-node-timeout",
            NODE_TIMEOUT_MS,
            "--cluster-port",
            &bus_port,
        ];
        if let Some(port) = &announce {
            // The bus port is announced too: peers must still reach the node itself.
            args.extend([
                "--cluster-announce-ip",
                "127.0.0.1",
                "--cluster-announce-port",
                port,
                "--cluster-announce-bus-port",
                &bus_port,
            ]);
        }
        let started = match tls {
            Some(certs) => {
                args.extend(["--tls-cluster", "yes"]);
                RedisServer::start_tls(certs, &args)
            }
            None => RedisServer::start_with(&args),
        };
        match started {
            Ok(node) => {
                let port = bus_port.parse().map_err(io::Error::other)?;
                return Ok((node, port));
            }
            Err(e) if e.kind() == io::ErrorKind::AddrInUse => last_err = Some(e),
            Err(e) => return Err(e),
        }
    }
    Err(last_err.unwrap_or_else(|| io::Error::other("no cluster node start was attempted")))
}

/// The `i`-th of `n` contiguous, near-equal slot ranges (inclusive bounds).
fn slot_range(i: usize, n: usize) -> (u16, u16) {
    let first = i * SLOTS / n;
    let end = (i + 1) * SLOTS / n;
    // Both bounds are below SLOTS (16384), so they fit in u16.
    (first as u16, (end - 1) as u16)
}

/// Runs one command on `node` with the short helper timeouts, turning redis
/// errors into `io::Error`s that name the node and the command.
fn run<T: redis::FromRedisValue>(node: &RedisServer, args: &[&str]) -> io::Result<T> {
    node.query_within(CONNECT_TIMEOUT, IO_TIMEOUT, args)
        .map_err(|e| {
            io::Error::other(format!(
                "{} on 127.0.0.1:{} failed: {e}",
                args.iter().take(2).copied().collect::<Vec<_>>().join(" "),
                node.port()
            ))
        })
}

/// `node`'s `CLUSTER SLOTS`, reduced to ranges and master ports.
fn cluster_slots(node: &RedisServer) -> io::Result<Vec<SlotRange>> {
    let reply: redis::Value = run(node, &["CLUSTER", "SLOTS"])?;
    parse_cluster_slots(&reply).ok_or_else(|| {
        io::Error::other(format!(
            "unexpected CLUSTER SLOTS reply from 127.0.0.1:{}: {reply:?}",
            node.port()
        ))
    })
}

/// One node as a node's `CLUSTER NODES` names it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct NodeAddress {
    id: String,
    port: u16,
    bus_port: u16,
}

/// `node`'s `CLUSTER NODES`, reduced to ids and ports (every address must be
/// `127.0.0.1`).
fn cluster_nodes(node: &RedisServer) -> io::Result<Vec<NodeAddress>> {
    let reply: String = run(node, &["CLUSTER", "NODES"])?;
    reply
        .lines()
        .filter(|line| !line.trim().is_empty())
        .map(|line| {
            parse_node_line(line).ok_or_else(|| {
                io::Error::other(format!(
                    "unexpected CLUSTER NODES line from 127.0.0.1:{}: {line:?}",
                    node.port()
                ))
            })
        })
        .collect()
}

/// Parses `<id> 127.0.0.1:<port>@<bus port>[,<hostname>] <flags> ...`.
fn parse_node_line(line: &str) -> Option<NodeAddress> {
    let mut fields = line.split_whitespace();
    let id = fields.next()?.to_owned();
    let address = fields.next()?;
    let (port, bus) = address.strip_prefix("127.0.0.1:")?.split_once('@')?;
    let bus = bus.split(',').next()?;
    Some(NodeAddress {
        id,
        port: port.parse().ok()?,
        bus_port: bus.parse().ok()?,
    })
}

/// Parses `[[start, end, [ip, port, id, ...], replicas...], ...]`.
fn parse_cluster_slots(reply: &redis::Value) -> Option<Vec<SlotRange>> {
    let redis::Value::Array(entries) = reply else {
        return None;
    };
    entries
        .iter()
        .map(|entry| {
            let redis::Value::Array(fields) = entry else {
                return None;
            };
            let int = |v: &redis::Value| match v {
                redis::Value::Int(n) => u16::try_from(*n).ok(),
                _ => None,
            };
            let redis::Value::Array(master) = fields.get(2)? else {
                return None;
            };
            Some(SlotRange {
                start: int(fields.first()?)?,
                end: int(fields.get(1)?)?,
                port: int(master.get(1)?)?,
            })
        })
        .collect()
}

/// Has `introducer` `CLUSTER MEET` `node`, whose cluster bus listens on `bus_port`.
fn meet(introducer: &RedisServer, node: &RedisServer, bus_port: u16) -> io::Result<()> {
    let (port, bus_port) = (node.client_port().to_string(), bus_port.to_string());
    run(
        introducer,
        &["CLUSTER", "MEET", "127.0.0.1", &port, &bus_port],
    )
}

/// Polls `check` until it says nothing is pending (`Ok(None)`), for at most
/// `timeout`; `TimedOut` names `what` and the last pending reason.
fn wait_for(
    timeout: Duration,
    what: &str,
    check: impl Fn() -> io::Result<Option<String>>,
) -> io::Result<()> {
    poll_until(timeout, check).map_err(|reason| {
        io::Error::new(
            io::ErrorKind::TimedOut,
            format!("a replica did not {what} within {timeout:?}: {reason}"),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn start(masters: usize) -> RedisCluster {
        let started = Instant::now();
        let cluster = match RedisCluster::start(masters) {
            Ok(cluster) => cluster,
            Err(e) => panic!("could not start a {masters}-node cluster: {e}"),
        };
        eprintln!("{masters}-node cluster formed in {:?}", started.elapsed());
        cluster
    }

    /// A key whose slot node `i` owns (found by trying `prefix-0`, ...).
    fn key_owned_by(cluster: &RedisCluster, i: usize, prefix: &str) -> String {
        (0..1000)
            .map(|n| format!("{prefix}-{n}"))
            .find(|key| cluster.owner(key).expect("owner") == i)
            .unwrap_or_else(|| panic!("no key of node {i} among 1000 candidates"))
    }

    fn sorted_slots(node: &RedisServer) -> Vec<SlotRange> {
        let mut slots = cluster_slots(node).expect("CLUSTER SLOTS");
        slots.sort_by_key(|r| r.start);
        slots
    }

    #[test]
    fn slot_ranges_are_contiguous_and_cover_everything() {
        assert_eq!(slot_range(0, 1), (0, 16383));
        assert_eq!(slot_range(0, 3), (0, 5460));
        assert_eq!(slot_range(1, 3), (5461, 10921));
        assert_eq!(slot_range(2, 3), (10922, 16383));
        for n in [1, 2, 3, 7, 16384] {
            let mut next = 0;
            for i in 0..n {
                let (first, last) = slot_range(i, n);
                assert_eq!(usize::from(first), next, "n={n} i={i}");
                assert!(first <= last, "n={n} i={i}");
                next = usize::from(last) + 1;
            }
            assert_eq!(next, SLOTS, "n={n}");
        }
    }

    #[test]
    fn bad_master_counts_are_rejected() {
        for n in [0, SLOTS + 1] {
            let err = RedisCluster::start(n).expect_err("must be rejected");
            assert_eq!(err.kind(), io::ErrorKind::InvalidInput, "{err}");
        }
    }

    #[test]
    fn cluster_forms_and_serves_every_node_slots() {
        let cluster = start(3);
        assert_eq!(cluster.nodes().len(), 3);
        let urls = cluster.urls();
        assert_eq!(urls.len(), 3);
        for (url, node) in urls.iter().zip(cluster.nodes()) {
            assert_eq!(*url, node.url());
        }

        // Every node has the same view: three ranges, each slot exactly once,
        // node i owning the i-th range.
        for node in cluster.nodes() {
            let info: String = node.query(&["CLUSTER", "INFO"]).expect("INFO");
            assert!(info.contains("cluster_state:ok"), "{info}");
            assert!(info.contains("cluster_slots_assigned:16384"), "{info}");
            assert!(info.contains("cluster_known_nodes:3"), "{info}");
            let slots = sorted_slots(node);
            assert_eq!(slots.len(), 3, "{slots:?}");
            let mut next = 0u32;
            for (i, range) in slots.iter().enumerate() {
                assert_eq!(u32::from(range.start), next, "{slots:?}");
                assert_eq!(range.port, cluster.nodes()[i].port(), "{slots:?}");
                next = u32::from(range.end) + 1;
            }
            assert_eq!(next, 16384, "{slots:?}");
        }

        for (i, node) in cluster.nodes().iter().enumerate() {
            let key = key_owned_by(&cluster, i, "form");
            let slot = cluster.slot(&key).expect("slot");
            let (first, last) = slot_range(i, 3);
            assert!((first..=last).contains(&slot), "{key} in {slot}");

            let value = format!("value-of-node-{i}");
            let _: () = node.query(&["SET", &key, &value]).expect("SET");
            let got: Option<String> = node.query(&["GET", &key]).expect("GET");
            assert_eq!(got.as_deref(), Some(value.as_str()));

            // Any other node redirects instead of serving the key.
            let other = &cluster.nodes()[(i + 1) % 3];
            let err = other
                .query::<Option<String>>(&["GET", &key])
                .expect_err("a non-owner must redirect");
            assert_eq!(
                err.kind(),
                redis::ErrorKind::Server(redis::ServerErrorKind::Moved),
                "{err:?}"
            );
        }
    }

    #[test]
    fn move_slot_moves_ownership_and_keys() {
        let cluster = start(3);
        let key = key_owned_by(&cluster, 0, "move");
        let slot = cluster.slot(&key).expect("slot");
        let _: () = cluster.nodes()[0]
            .query(&["SET", &key, "moved-value"])
            .expect("SET");
        // A second key in the same slot (hash tag) to exercise the batch loop.
        let tagged = format!("{{{key}}}-2");
        assert_eq!(cluster.slot(&tagged).expect("slot"), slot);
        let _: () = cluster.nodes()[0]
            .query(&["SET", &tagged, "second"])
            .expect("SET");

        let started = Instant::now();
        cluster.move_slot(slot, 2).expect("move_slot");
        eprintln!("slot moved in {:?}", started.elapsed());

        assert_eq!(cluster.owner(&key).expect("owner"), 2);
        for node in cluster.nodes() {
            let owner = cluster.owner_seen_by(node, slot).expect("owner");
            assert_eq!(owner, 2, "as seen by {}", node.port());
        }
        let new_owner = &cluster.nodes()[2];
        let got: Option<String> = new_owner.query(&["GET", &key]).expect("GET");
        assert_eq!(got.as_deref(), Some("moved-value"));
        let got: Option<String> = new_owner.query(&["GET", &tagged]).expect("GET");
        assert_eq!(got.as_deref(), Some("second"));
        let left: i64 = cluster.nodes()[0]
            .query(&["CLUSTER", "COUNTKEYSINSLOT", &slot.to_string()])
            .expect("COUNTKEYSINSLOT");
        assert_eq!(left, 0);
        let err = cluster.nodes()[0]
            .query::<Option<String>>(&["GET", &key])
            .expect_err("the old owner must redirect");
        assert_eq!(
            err.kind(),
            redis::ErrorKind::Server(redis::ServerErrorKind::Moved),
            "{err:?}"
        );

        // Moving to the current owner is a no-op; an empty slot moves too.
        cluster.move_slot(slot, 2).expect("no-op move");
        assert_eq!(cluster.owner(&key).expect("owner"), 2);
        let empty_slot = slot_range(1, 3).0;
        cluster.move_slot(empty_slot, 0).expect("empty move");
        for node in cluster.nodes() {
            assert_eq!(cluster.owner_seen_by(node, empty_slot).expect("owner"), 0);
        }

        let err = cluster.move_slot(16384, 0).expect_err("slot out of range");
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
        let err = cluster.move_slot(0, 3).expect_err("node out of range");
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
    }

    #[test]
    fn a_proxied_cluster_is_reached_through_the_proxies_it_announces() {
        let mut cluster = RedisCluster::start_proxied(2).expect("start a proxied cluster");
        let proxies: Vec<u16> = (0..2)
            .map(|i| cluster.proxy(i).expect("a proxy").port())
            .collect();
        assert!(cluster.proxy(2).is_none());
        let urls: Vec<String> = proxies
            .iter()
            .map(|port| format!("redis://127.0.0.1:{port}/"))
            .collect();
        assert_eq!(cluster.urls(), urls);
        for node in cluster.nodes() {
            let ports: Vec<u16> = sorted_slots(node).iter().map(|r| r.port).collect();
            assert_eq!(ports, proxies, "as seen by 127.0.0.1:{}", node.port());
        }
        // A redirect names the proxy too.
        let key = key_owned_by(&cluster, 1, "proxied");
        let err = cluster.nodes()[0]
            .query::<Option<String>>(&["GET", &key])
            .expect_err("node 0 redirects");
        let proxy_address = format!("127.0.0.1:{}", proxies[1]);
        let slot = cluster.slot(&key).expect("slot");
        assert_eq!(
            err.redirect_node(),
            Some((proxy_address.as_str(), slot)),
            "{err}"
        );

        // A cluster client's commands for node 1 go through its proxy.
        // (The testkit itself never connects through a proxy.)
        assert_eq!(cluster.proxy(1).expect("proxy").accepted_connections(), 0);
        let client = redis::cluster::ClusterClient::new(cluster.urls()).expect("client");
        let mut con = client.get_connection().expect("connect");
        let _: () = redis::cmd("SET")
            .arg(&key)
            .arg("v")
            .query(&mut con)
            .expect("SET");
        assert!(cluster.exists_on(1, &key));
        assert!(cluster.proxy(1).expect("proxy").open_connections() > 0);

        // Restarted, node 1 announces its proxy again, to clients and peers.
        cluster.nodes_mut()[1].restart().expect("restart");
        let deadline = Instant::now() + Duration::from_secs(15);
        while cluster.nodes().iter().any(|n| {
            cluster_slots(n).ok().map(|mut s| {
                s.sort_by_key(|r| r.start);
                s.iter().map(|r| r.port).collect::<Vec<_>>()
            }) != Some(proxies.clone())
        }) {
            assert!(
                Instant::now() < deadline,
                "the restarted node lost its proxy"
            );
            thread::sleep(POLL_INTERVAL);
        }
        let mine: Vec<NodeAddress> = cluster_nodes(&cluster.nodes()[1]).expect("NODES");
        assert!(
            mine.iter()
                .any(|a| a.id == cluster.ids[1] && a.port == proxies[1]),
            "{mine:?}"
        );
    }

    #[test]
    fn node_lines_parse_with_and_without_a_hostname() {
        let line = "07c3 127.0.0.1:30004@31004 myself,master - 0 0 1 connected 0-5460";
        let expected = NodeAddress {
            id: "07c3".to_owned(),
            port: 30004,
            bus_port: 31004,
        };
        assert_eq!(parse_node_line(line), Some(expected.clone()));
        let line = "07c3 127.0.0.1:30004@31004,host-a master - 0 0 1 connected";
        assert_eq!(parse_node_line(line), Some(expected));
        assert_eq!(parse_node_line("07c3 :30004@31004 myself,master"), None);
    }

    #[test]
    fn restarted_node_rejoins_with_its_slots() {
        let mut cluster = start(3);
        let id_before: String = cluster.nodes()[1]
            .query(&["CLUSTER", "MYID"])
            .expect("MYID");
        let key = key_owned_by(&cluster, 1, "restart");

        cluster.nodes_mut()[1].kill();
        // The survivors still answer slot/owner questions.
        assert_eq!(cluster.owner(&key).expect("owner"), 1);

        cluster.nodes_mut()[1].restart().expect("restart");
        let node = &cluster.nodes()[1];
        let id_after: String = node.query(&["CLUSTER", "MYID"]).expect("MYID");
        assert_eq!(id_after, id_before, "nodes.conf must survive the restart");

        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let ok = cluster.nodes().iter().all(|n| {
                n.query::<String>(&["CLUSTER", "INFO"])
                    .is_ok_and(|info| info.contains("cluster_state:ok"))
            });
            if ok {
                break;
            }
            assert!(Instant::now() < deadline, "cluster did not recover");
            thread::sleep(POLL_INTERVAL);
        }
        let _: () = node.query(&["SET", &key, "again"]).expect("SET");
        assert_eq!(cluster.owner(&key).expect("owner"), 1);
    }
}
