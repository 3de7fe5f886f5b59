//! SCAN's bounds: a scan cut short says so (in the table, on stderr and in the JSON),
//! and one that is not finds every lock among many unrelated keys.

mod common;

use common::lockwarden;
use lockwarden_testkit::RedisServer;

/// 3000 unrelated keys and 300 locks (hashes with a holder and a lease, and fences).
fn crowded() -> RedisServer {
    let server = RedisServer::start().unwrap();
    let mut mset = vec!["MSET".to_owned()];
    for i in 0..3000 {
        mset.push(format!("app:cache:{i}"));
        mset.push("x".to_owned());
    }
    let args: Vec<&str> = mset.iter().map(String::as_str).collect();
    let _: () = server.query(&args).unwrap();
    let mut con = server.connection().unwrap();
    let mut pipe = lockwarden_core::redis::pipe();
    for i in 0..300 {
        let key = format!("lockwarden:{{job:{i}}}");
        pipe.cmd("HSET")
            .arg(&key)
            .arg("0f0e-uuid:1")
            .arg(1)
            .ignore();
        pipe.cmd("PEXPIRE").arg(&key).arg(60_000).ignore();
        pipe.cmd("SET")
            .arg(format!("{key}:fence"))
            .arg(1_700_000_000_000_000u64 + i)
            .arg("PX")
            .arg(60_000)
            .ignore();
    }
    let _: () = pipe.query(&mut con).unwrap();
    server
}

#[test]
fn a_complete_scan_finds_every_lock() {
    let server = crowded();
    let run = lockwarden(&[
        "--url",
        &server.url(),
        "list",
        "--json",
        "--scan-count",
        "100",
    ]);
    let json = run.json();
    assert_eq!(json["locks"].as_array().unwrap().len(), 300);
    assert_eq!(json["scan"]["complete"], true);
    assert!(
        json["scan"]["rounds"].as_u64().unwrap() > 1,
        "{}",
        json["scan"]
    );
    assert!(run.stderr.is_empty(), "{run:#?}");
}

#[test]
fn a_bounded_scan_says_it_was_cut_short() {
    let server = crowded();
    let url = server.url();
    let run = lockwarden(&[
        "--url",
        &url,
        "list",
        "--max-keys",
        "50",
        "--scan-count",
        "10",
    ]);
    let out = run.ok();
    let last = out.lines().last().unwrap();
    assert!(
        last.contains("scan INCOMPLETE: stopped at --max-keys 50"),
        "{out}"
    );
    assert!(
        run.stderr
            .contains("warning: scan INCOMPLETE: stopped at --max-keys 50"),
        "{run:#?}"
    );
    let json = lockwarden(&["--url", &url, "list", "--json", "--max-keys", "50"]).json();
    assert_eq!(json["scan"]["complete"], false);
    assert_eq!(json["scan"]["stopped_by"], "max-keys");
    assert!(json["locks"].as_array().unwrap().len() < 300);

    let json = lockwarden(&["--url", &url, "list", "--json", "--scan-time", "0ms"]).json();
    assert_eq!(json["scan"]["complete"], false);
    assert_eq!(json["scan"]["stopped_by"], "time");
}
