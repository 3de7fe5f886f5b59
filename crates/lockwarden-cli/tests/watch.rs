//! `watch`: bounded refreshes (`--iterations`, `--interval`), its table, and its rates
//! from keyspace events (when the server publishes them) or from fencing tokens.

mod common;

use std::time::Duration;

use common::*;
use lockwarden_testkit::{RedisServer, TestProcess};
use serde_json::Value;

/// Not a test on its own: the child process of the tests below.
#[test]
fn child() {
    common::child_body();
}

fn churning(server: &RedisServer) -> TestProcess {
    let env = format!("churn {}", server.url());
    let mut child = TestProcess::spawn("child", &[(CHILD_ENV, &env)]).unwrap();
    child.wait_for_line("CHURNING", Duration::from_secs(60));
    child
}

fn frames(run: &Run) -> Vec<Value> {
    run.ok()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect()
}

fn hot_rate(frame: &Value) -> Option<f64> {
    frame["locks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["name"] == HOT)
        .and_then(|l| l["acquisitions_per_sec"].as_f64())
}

/// The hot lock's best rate after the first refresh (which has no interval behind it).
fn best_hot_rate(frames: &[Value]) -> f64 {
    frames[1..]
        .iter()
        .filter_map(hot_rate)
        .fold(None, |best: Option<f64>, r| {
            Some(best.map_or(r, |b| b.max(r)))
        })
        .unwrap_or_else(|| panic!("the hot lock is listed with a rate: {frames:#?}"))
}

#[test]
fn the_table_ranks_the_busiest_locks_first() {
    let f = Fixture::start("child");
    let run = f.run(&[
        "watch",
        "--iterations",
        "2",
        "--interval",
        "200ms",
        "--top",
        "3",
    ]);
    let out = run.ok();
    let headers: Vec<&str> = out
        .lines()
        .filter(|l| l.starts_with("lockwarden watch  "))
        .collect();
    assert_eq!(headers.len(), 2, "{out}");
    assert!(headers[0].contains("refresh 1 every 200ms"), "{out}");
    assert!(headers[1].contains("refresh 2 every 200ms"), "{out}");
    assert!(
        out.contains("7 locks, 6 held; acq/s ≥ fencing-token changes (notify-keyspace-events is \"\" on 127.0.0.1:"),
        "{out}"
    );
    // The last frame: a header row, then the fair lock (2 queued, 2 subscribed) first,
    // the read-write lock (2 readers waiting, 1 subscribed), then the semaphore (1 in
    // line, 1 subscribed).
    let last = out.rsplit("lockwarden watch  ").next().unwrap();
    let rows: Vec<&str> = last
        .lines()
        .skip_while(|l| !l.starts_with("NAME"))
        .filter(|l| !l.is_empty())
        .collect();
    assert!(
        rows[0].starts_with("NAME") && rows[0].contains("ACQ/S"),
        "{out}"
    );
    assert_eq!(rows.len(), 4, "--top 3: {out}");
    assert!(rows[1].starts_with("tickets "), "{out}");
    assert!(rows[1].contains(" fair "), "{out}");
    assert!(rows[2].starts_with("report "), "{out}");
    let sem: Vec<&str> = rows[3].split_whitespace().collect();
    // NAME KIND (2 words) HOLDERS QUEUED SUBS ...
    assert_eq!(
        sem[..6],
        ["exports", "semaphore", "(3/3)", "2", "1", "1"],
        "{out}"
    );
}

#[test]
fn fencing_tokens_give_a_lower_bound_of_the_rate() {
    let server = RedisServer::start().unwrap();
    let _child = churning(&server);
    let run = lockwarden(&[
        "--url",
        &server.url(),
        "watch",
        "--json",
        "--iterations",
        "3",
        "--interval",
        "300ms",
    ]);
    let frames = frames(&run);
    assert_eq!(frames.len(), 3);
    for (i, frame) in frames.iter().enumerate() {
        assert_eq!(frame["refresh"], i + 1);
        assert_eq!(frame["rate_source"], "fencing-tokens");
        assert_eq!(frame["rate_is_lower_bound"], true);
        assert_eq!(frame["scan"]["complete"], true);
    }
    // Taken every 20 ms: its token changes between two refreshes 300 ms apart, and
    // counts once however often it changed (the best of two intervals, for a busy CI).
    let rate = best_hot_rate(&frames);
    assert!(rate > 0.5 && rate < 10.0, "one change per interval: {rate}");
}

#[test]
fn keyspace_events_count_every_acquisition() {
    let server = RedisServer::start_with(&["--notify-keyspace-events", "E$"]).unwrap();
    let config = || -> Vec<String> {
        server
            .query(&["CONFIG", "GET", "notify-keyspace-events"])
            .unwrap()
    };
    let before = config();
    let _child = churning(&server);
    let run = lockwarden(&[
        "--url",
        &server.url(),
        "watch",
        "--json",
        "--iterations",
        "3",
        "--interval",
        "500ms",
    ]);
    let frames = frames(&run);
    assert_eq!(frames.len(), 3);
    assert!(frames.iter().all(|f| f["rate_source"] == "keyspace-events"));
    assert!(frames.iter().all(|f| f["rate_is_lower_bound"] == false));
    // One acquisition per ~20 ms: far more than one per refresh.
    let rate = best_hot_rate(&frames);
    assert!(rate > 5.0, "{rate}");
    // The server's configuration is left as it was.
    assert_eq!(config(), before);
}
