//! Bad input and bad servers: a clear message on stderr and a non-zero exit, every time.

mod common;

use std::net::TcpListener;
use std::process::{Command, Stdio};

use common::{lockwarden, Run};
use lockwarden_testkit::RedisServer;

/// A loopback port nothing listens on (bound, then closed).
fn closed_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    drop(listener);
    port
}

fn fails(run: &Run, code: i32, message: &str) {
    assert_eq!(run.code, Some(code), "{run:#?}");
    assert!(run.stdout.is_empty(), "nothing on stdout: {run:#?}");
    assert!(
        run.stderr.starts_with("lockwarden: error: ") && run.stderr.contains(message),
        "{message:?} expected: {run:#?}"
    );
}

#[test]
fn a_bad_url_is_a_usage_error() {
    for url in [
        "notaurl",
        "http://127.0.0.1:6379/",
        "redis://127.0.0.1:notaport/",
    ] {
        for cmd in [
            &["list"][..],
            &["show", "x"],
            &["unlock", "x", "--yes"],
            &["watch"],
        ] {
            let mut args = vec!["--url", url];
            args.extend_from_slice(cmd);
            fails(&lockwarden(&args), 2, "invalid Redis URL");
        }
    }
    // TLS as far as the core has it: without, a clear refusal (2); with, nothing listens
    // on that port (1).
    let tls = lockwarden(&["--url", "rediss://127.0.0.1:1/", "list"]);
    match tls.code {
        Some(2) => assert!(tls.stderr.contains("no TLS support"), "{tls:#?}"),
        _ => fails(&tls, 1, "cannot reach Redis at rediss://127.0.0.1:1/"),
    }
    let two = lockwarden(&["--url", "redis://127.0.0.1:1/,redis://127.0.0.1:2/", "list"]);
    fails(&two, 2, "add --cluster");
}

#[test]
fn an_unreachable_server_fails_fast_with_exit_1() {
    let url = format!("redis://127.0.0.1:{}/", closed_port());
    for cmd in [
        &["list"][..],
        &["show", "x"],
        &["unlock", "x", "--yes"],
        &["watch"],
    ] {
        let mut args = vec!["--url", url.as_str()];
        args.extend_from_slice(cmd);
        let started = std::time::Instant::now();
        let run = lockwarden(&args);
        fails(&run, 1, &format!("cannot reach Redis at {url}"));
        assert!(run.stderr.contains("refused"), "{run:#?}");
        assert!(started.elapsed() < std::time::Duration::from_secs(10));
    }
    let cluster = lockwarden(&["--cluster", "--url", &url, "list"]);
    fails(&cluster, 1, "cannot reach Redis");
}

#[test]
fn passwords_never_reach_the_output() {
    let url = format!("redis://admin:hunter2@127.0.0.1:{}/", closed_port());
    let run = lockwarden(&["--url", &url, "list"]);
    fails(&run, 1, "redis://admin:***@127.0.0.1:");
    assert!(!run.stderr.contains("hunter2"), "{run:#?}");
}

#[test]
fn unknown_locks_and_bad_names() {
    let server = RedisServer::start().unwrap();
    let url = server.url();
    let run = |args: &[&str]| {
        let mut all = vec!["--url", url.as_str()];
        all.extend_from_slice(args);
        lockwarden(&all)
    };
    fails(
        &run(&["show", "nope"]),
        3,
        "no lock named \"nope\" (key \"lockwarden:{nope}\"",
    );
    fails(
        &run(&["unlock", "nope", "--yes"]),
        3,
        "no lock named \"nope\"",
    );
    fails(
        &run(&["--namespace", "app:", "show", "nope"]),
        3,
        "key \"app:{nope}\"",
    );
    fails(&run(&["show", ""]), 2, "bad lock name");
    fails(&run(&["show", "a\u{7}b"]), 2, "bad lock name");
    fails(
        &run(&["--layout", "redisson", "unlock", "a{b}", "--yes"]),
        2,
        "bad lock name",
    );
    // An empty server lists nothing, successfully.
    let empty = run(&["list"]);
    assert!(empty
        .ok()
        .starts_with("no locks under namespace \"lockwarden:\""));
    let json = run(&["list", "--json"]).json();
    assert_eq!(json["locks"], serde_json::json!([]));
}

#[test]
fn redis_url_comes_from_the_environment() {
    let server = RedisServer::start().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_lockwarden"))
        .args(["list", "--json"])
        .env("REDIS_URL", server.url())
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["scan"]["complete"], true);
}

#[test]
fn bad_flags_are_usage_errors() {
    let run = lockwarden(&["list", "--scan-time", "soon"]);
    assert_eq!(run.code, Some(2), "{run:#?}");
    assert!(run.stderr.contains("not a duration"), "{run:#?}");
    let run = lockwarden(&["frobnicate"]);
    assert_eq!(run.code, Some(2), "{run:#?}");
    let help = lockwarden(&["--help"]);
    assert!(help.ok().contains("Exit codes: 0 done"), "{help:#?}");
}
