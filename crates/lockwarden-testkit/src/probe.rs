//! Probes: what a test asserts about a live server, asked of the server itself
//! (`PTTL`, `INFO commandstats`, `PUBSUB NUMSUB`/`CHANNELS`, `CLIENT LIST`, `SCAN`).
//!
//! Each probe opens a fresh connection with the timeouts of
//! [`RedisServer::query`], so it fails (panics) rather than hangs on a paused
//! server. Probes panic on any error: they are assertions' inputs, and a
//! server that cannot answer them has already failed the test.

use std::collections::BTreeMap;

use crate::cluster::RedisCluster;
use crate::server::RedisServer;

/// How many `SCAN` rounds [`RedisServer::keys_matching`] runs at most (each
/// asks for 1000 keys, so this bounds a probe to ten million keys).
const SCAN_ROUNDS: usize = 10_000;

/// One connection of `CLIENT LIST`: its `name=value` fields, e.g. `id`,
/// `addr`, `flags`, `sub` (channel subscriptions), `cmd` (last command).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientInfo {
    fields: BTreeMap<String, String>,
}

impl ClientInfo {
    /// The value of one field (`None` if the server did not report it).
    pub fn field(&self, name: &str) -> Option<&str> {
        self.fields.get(name).map(String::as_str)
    }

    /// The connection's id (`id=`), 0 if missing.
    pub fn id(&self) -> u64 {
        self.number("id")
    }

    /// How many channels the connection is subscribed to (`sub=`), 0 if
    /// missing.
    pub fn subscriptions(&self) -> u64 {
        self.number("sub")
    }

    /// Whether the connection is in pub/sub mode: it has subscriptions (to
    /// channels or patterns) or its flags include `P`.
    pub fn is_pubsub(&self) -> bool {
        self.subscriptions() > 0
            || self.number("psub") > 0
            || self.field("flags").is_some_and(|f| f.contains('P'))
    }

    fn number(&self, name: &str) -> u64 {
        self.field(name).and_then(|v| v.parse().ok()).unwrap_or(0)
    }
}

/// Parses the reply of `CLIENT LIST`: one connection per line, fields
/// separated by spaces, each `name=value` (a value may be empty).
pub(crate) fn parse_client_list(reply: &str) -> Vec<ClientInfo> {
    reply
        .lines()
        .filter(|line| !line.trim().is_empty())
        .map(|line| ClientInfo {
            fields: line
                .split_whitespace()
                .filter_map(|field| field.split_once('='))
                .map(|(name, value)| (name.to_owned(), value.to_owned()))
                .collect(),
        })
        .collect()
}

/// The publishes a cluster node received from its peers, classic and sharded, from a
/// `CLUSTER INFO` reply.
fn parse_publishes_received(info: &str) -> u64 {
    info.lines()
        .filter_map(|line| line.trim().split_once(':'))
        .filter(|(name, _)| {
            *name == "cluster_stats_messages_publish_received"
                || *name == "cluster_stats_messages_publishshard_received"
        })
        .filter_map(|(_, n)| n.parse::<u64>().ok())
        .sum()
}

/// The `calls=` count of `command` in an `INFO commandstats` reply (lines
/// like `cmdstat_evalsha:calls=3,usec=...`); 0 if the command never ran.
/// The name is matched case-insensitively; a subcommand is written with `|`
/// as Redis does (`client|list`).
pub(crate) fn parse_command_calls(info: &str, command: &str) -> u64 {
    let wanted = format!("cmdstat_{}:", command.to_ascii_lowercase());
    info.lines()
        .find_map(|line| line.trim().strip_prefix(wanted.as_str()))
        .and_then(|stats| {
            stats
                .split(',')
                .find_map(|stat| stat.strip_prefix("calls="))
                .and_then(|n| n.parse().ok())
        })
        .unwrap_or(0)
}

impl RedisServer {
    /// Runs one probe command, panicking with the command, port and error if
    /// it fails.
    fn probe<T: redis::FromRedisValue>(&self, args: &[&str]) -> T {
        self.query(args).unwrap_or_else(|e| {
            panic!(
                "probe {args:?} on redis-server 127.0.0.1:{} failed: {e}",
                self.port()
            )
        })
    }

    /// `PTTL key`: the key's remaining time to live in milliseconds, `-1` if
    /// it has no expiry, `-2` if it does not exist.
    ///
    /// # Panics
    ///
    /// If the server does not answer (as every probe).
    pub fn pttl(&self, key: &str) -> i64 {
        self.probe(&["PTTL", key])
    }

    /// Whether `key` exists (`EXISTS key`).
    ///
    /// # Panics
    ///
    /// If the server does not answer.
    pub fn exists(&self, key: &str) -> bool {
        self.probe::<i64>(&["EXISTS", key]) == 1
    }

    /// How many times the server has run `command` since it started (or
    /// since `CONFIG RESETSTAT`), from `INFO commandstats`: e.g.
    /// `server.command_calls("evalsha")` counts script calls by digest. The
    /// name is case-insensitive; 0 if the command never ran. The `INFO` call
    /// of this probe itself is counted under `info`.
    ///
    /// # Panics
    ///
    /// If the server does not answer.
    pub fn command_calls(&self, command: &str) -> u64 {
        let info: String = self.probe(&["INFO", "commandstats"]);
        parse_command_calls(&info, command)
    }

    /// How many scripts the server has run, called by digest (`EVALSHA`) or as functions
    /// (`FCALL`: lockwarden's plain take, where the server has functions), from one
    /// `INFO commandstats`.
    ///
    /// # Panics
    ///
    /// If the server does not answer.
    pub fn script_calls(&self) -> u64 {
        let info: String = self.probe(&["INFO", "commandstats"]);
        parse_command_calls(&info, "evalsha") + parse_command_calls(&info, "fcall")
    }

    /// How many published messages this cluster node received from other nodes over the
    /// cluster bus, classic and sharded (`CLUSTER INFO`:
    /// `cluster_stats_messages_publish_received` plus `…_publishshard_received`): what
    /// the releases of locks this node does not own cost it.
    ///
    /// # Panics
    ///
    /// If the server does not answer, or is not a cluster node.
    pub fn publishes_received(&self) -> u64 {
        let info: String = self.probe(&["CLUSTER", "INFO"]);
        parse_publishes_received(&info)
    }

    /// How many connections are subscribed to `channel` (`PUBSUB NUMSUB`).
    ///
    /// # Panics
    ///
    /// If the server does not answer.
    pub fn subscribers(&self, channel: &str) -> u64 {
        let reply: Vec<(String, u64)> = self.probe(&["PUBSUB", "NUMSUB", channel]);
        reply.first().map_or(0, |(_, n)| *n)
    }

    /// How many connections are subscribed to the shard channel `channel`
    /// (`PUBSUB SHARDNUMSUB`: `SSUBSCRIBE`d on this node).
    ///
    /// # Panics
    ///
    /// If the server does not answer.
    pub fn shard_subscribers(&self, channel: &str) -> u64 {
        let reply: Vec<(String, u64)> = self.probe(&["PUBSUB", "SHARDNUMSUB", channel]);
        reply.first().map_or(0, |(_, n)| *n)
    }

    /// The channels at least one connection is subscribed to
    /// (`PUBSUB CHANNELS`), sorted.
    ///
    /// # Panics
    ///
    /// If the server does not answer.
    pub fn channels(&self) -> Vec<String> {
        let mut channels: Vec<String> = self.probe(&["PUBSUB", "CHANNELS"]);
        channels.sort();
        channels
    }

    /// The server's client connections (`CLIENT LIST`), without the one this
    /// probe uses.
    ///
    /// # Panics
    ///
    /// If the server does not answer.
    pub fn clients(&self) -> Vec<ClientInfo> {
        let asked = self.connection().and_then(|mut con| {
            let (own, list): (u64, String) = redis::pipe()
                .cmd("CLIENT")
                .arg("ID")
                .cmd("CLIENT")
                .arg("LIST")
                .query(&mut con)?;
            Ok((own, list))
        });
        let (own, list) = asked.unwrap_or_else(|e| {
            panic!(
                "probe CLIENT LIST on redis-server 127.0.0.1:{} failed: {e}",
                self.port()
            )
        });
        parse_client_list(&list)
            .into_iter()
            .filter(|client| client.id() != own)
            .collect()
    }

    /// The keys matching the glob `pattern`, found with `SCAN` (not `KEYS`,
    /// which blocks the server), sorted and without repeats.
    ///
    /// # Panics
    ///
    /// If the server does not answer.
    pub fn keys_matching(&self, pattern: &str) -> Vec<String> {
        let mut keys = Vec::new();
        let mut cursor = "0".to_owned();
        for _ in 0..SCAN_ROUNDS {
            let (next, batch): (String, Vec<String>) =
                self.probe(&["SCAN", &cursor, "MATCH", pattern, "COUNT", "1000"]);
            keys.extend(batch);
            cursor = next;
            if cursor == "0" {
                break;
            }
        }
        keys.sort();
        keys.dedup();
        keys
    }
}

impl RedisCluster {
    /// `PTTL key` asked of the node that owns `key`'s slot (see
    /// [`RedisCluster::owner`]).
    ///
    /// # Panics
    ///
    /// If the owner cannot be found or does not answer.
    pub fn pttl(&self, key: &str) -> i64 {
        let owner = self
            .owner(key)
            .unwrap_or_else(|e| panic!("owner of {key:?}: {e}"));
        self.nodes()[owner].pttl(key)
    }

    /// Whether `key` exists on node `node` itself (asked directly, not
    /// routed): a node that does not own the key's slot answers `MOVED`,
    /// which counts as "not there".
    ///
    /// # Panics
    ///
    /// If `node` is out of range or answers with any other error.
    pub fn exists_on(&self, node: usize, key: &str) -> bool {
        match self.nodes()[node].query::<i64>(&["EXISTS", key]) {
            Ok(n) => n == 1,
            Err(e) if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::Moved) => false,
            Err(e) => panic!("EXISTS {key} on cluster node {node}: {e}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn publishes_received_add_classic_and_sharded() {
        let info = "cluster_state:ok\r\n\
            cluster_stats_messages_publish_sent:4\r\n\
            cluster_stats_messages_publish_received:7\r\n\
            cluster_stats_messages_publishshard_received:2\r\n";
        assert_eq!(parse_publishes_received(info), 9);
        assert_eq!(parse_publishes_received("cluster_state:ok\r\n"), 0);
    }

    #[test]
    fn command_calls_are_read_from_commandstats() {
        let info = "# Commandstats\r\n\
            cmdstat_evalsha:calls=12,usec=340,usec_per_call=28.33,rejected_calls=0,failed_calls=1\r\n\
            cmdstat_eval:calls=3,usec=90,usec_per_call=30.00,rejected_calls=0,failed_calls=0\r\n\
            cmdstat_client|list:calls=2,usec=5,usec_per_call=2.50,rejected_calls=0,failed_calls=0\r\n";
        assert_eq!(parse_command_calls(info, "evalsha"), 12);
        assert_eq!(parse_command_calls(info, "EVALSHA"), 12);
        // `eval` is not a prefix match of `evalsha`, nor the other way round.
        assert_eq!(parse_command_calls(info, "eval"), 3);
        assert_eq!(parse_command_calls(info, "client|list"), 2);
        assert_eq!(parse_command_calls(info, "set"), 0);
        assert_eq!(parse_command_calls("", "evalsha"), 0);
    }

    #[test]
    fn client_list_lines_become_fields() {
        let reply = "id=3 addr=127.0.0.1:5000 laddr=127.0.0.1:6379 fd=8 name= flags=N sub=0 psub=0 cmd=evalsha\n\
            id=7 addr=127.0.0.1:5001 laddr=127.0.0.1:6379 fd=9 name=w flags=P sub=4 psub=0 cmd=subscribe\n\n";
        let clients = parse_client_list(reply);
        assert_eq!(clients.len(), 2);
        assert_eq!(clients[0].id(), 3);
        assert_eq!(clients[0].field("name"), Some(""));
        assert_eq!(clients[0].field("cmd"), Some("evalsha"));
        assert!(!clients[0].is_pubsub());
        assert_eq!(clients[1].id(), 7);
        assert_eq!(clients[1].subscriptions(), 4);
        assert!(clients[1].is_pubsub());
        assert_eq!(clients[1].field("nope"), None);
        assert!(parse_client_list("").is_empty());
    }

    fn start() -> RedisServer {
        RedisServer::start().expect("start redis-server")
    }

    #[test]
    fn pttl_and_exists_follow_the_key() {
        let server = start();
        assert_eq!(server.pttl("k"), -2);
        assert!(!server.exists("k"));
        let _: () = server.query(&["SET", "k", "v"]).expect("SET");
        assert_eq!(server.pttl("k"), -1);
        assert!(server.exists("k"));
        let _: i64 = server.query(&["PEXPIRE", "k", "60000"]).expect("PEXPIRE");
        let ttl = server.pttl("k");
        assert!(ttl > 50_000 && ttl <= 60_000, "{ttl}");
    }

    #[test]
    fn command_calls_count_what_ran() {
        let server = start();
        assert_eq!(server.command_calls("incr"), 0);
        for _ in 0..3 {
            let _: i64 = server.query(&["INCR", "n"]).expect("INCR");
        }
        assert_eq!(server.command_calls("incr"), 3);
        assert_eq!(server.command_calls("INCR"), 3);
    }

    #[test]
    fn subscribers_channels_and_clients_see_a_subscription() {
        let server = start();
        assert_eq!(server.subscribers("news"), 0);
        assert!(server.channels().is_empty());
        assert!(server.clients().is_empty(), "{:?}", server.clients());

        let mut con = server.connection().expect("connection");
        let mut pubsub = con.as_pubsub();
        pubsub.subscribe("news").expect("SUBSCRIBE");
        pubsub.subscribe("weather").expect("SUBSCRIBE");
        assert_eq!(server.subscribers("weather"), 1);
        assert_eq!(server.subscribers("sports"), 0);
        assert_eq!(server.channels(), ["news", "weather"]);
        let clients = server.clients();
        assert_eq!(clients.len(), 1, "{clients:?}");
        assert!(clients[0].is_pubsub());
        assert_eq!(clients[0].subscriptions(), 2);
    }

    #[test]
    fn cluster_probes_ask_the_owner() {
        let cluster = RedisCluster::start(2).expect("start a cluster");
        let key = "probe:{k}";
        let owner = cluster.owner(key).expect("owner");
        let _: () = cluster.nodes()[owner]
            .query(&["SET", key, "v", "PX", "60000"])
            .expect("SET on the owner");
        let ttl = cluster.pttl(key);
        assert!(ttl > 50_000 && ttl <= 60_000, "{ttl}");
        assert!(cluster.exists_on(owner, key));
        assert!(!cluster.exists_on(1 - owner, key), "MOVED counts as absent");
        assert_eq!(cluster.pttl("probe:{missing}"), -2);
    }

    #[test]
    fn keys_matching_scans_everything_that_matches() {
        let server = start();
        assert!(server.keys_matching("*").is_empty());
        let mut args = vec!["MSET".to_owned()];
        for i in 0..2500 {
            args.push(format!("a:{i}"));
            args.push("1".to_owned());
        }
        args.extend(["b:1".to_owned(), "1".to_owned()]);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let _: () = server.query(&args).expect("MSET");
        let a = server.keys_matching("a:*");
        assert_eq!(a.len(), 2500);
        assert!(a.windows(2).all(|w| w[0] < w[1]), "sorted, no repeats");
        assert_eq!(server.keys_matching("b:*"), ["b:1"]);
        assert_eq!(server.keys_matching("*").len(), 2501);
    }
}
