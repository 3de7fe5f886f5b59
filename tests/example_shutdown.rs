//! A deploy leaves no lock behind: the webhook example, serving on Redis, gets SIGTERM
//! while a request holds its lock. It stops taking requests, finishes the one in flight,
//! shuts its lock client down and exits: no lock is left in Redis for the next replica
//! to wait out (the watchdog lease, 30 s).
//!
//! The example's binary is the one `cargo test` builds beside the tests
//! (`target/<profile>/examples/webhook`).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use lockwarden_testkit::RedisServer;

/// The example's binary: `examples/webhook` beside the directory of this test's binary.
fn webhook_binary() -> PathBuf {
    let exe = std::env::current_exe().expect("this test's binary");
    let profile = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("target/<profile>/deps");
    let binary = profile.join("examples").join("webhook");
    assert!(
        binary.is_file(),
        "{} is missing: `cargo test` builds the examples (or run `cargo build --example webhook`)",
        binary.display()
    );
    binary
}

/// The example's process, killed (SIGKILL) if the test ends before it exits.
struct Example(Child);

impl Drop for Example {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The keys of locks in `server` (not the fencing counters, which outlive a release).
fn locks_left(server: &RedisServer) -> Vec<String> {
    let keys = server.keys_matching("lockwarden:*");
    keys.into_iter()
        .filter(|k| !k.ends_with(":fence"))
        .collect()
}

#[test]
fn sigterm_in_the_middle_of_a_request_leaves_no_lock() {
    let server = RedisServer::start().expect("start redis-server");
    let mut example = Example(
        Command::new(webhook_binary())
            .args(["--listen", "127.0.0.1:0"])
            .env("REDIS_URL", server.url())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start the webhook example"),
    );
    let stdout = example.0.stdout.take().expect("piped stdout");
    let (lines, printed) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if lines.send(line).is_err() {
                break;
            }
        }
    });
    let addr = loop {
        let line = printed
            .recv_timeout(Duration::from_secs(30))
            .expect("the example says where it listens within 30 s");
        if let Some(addr) = line.strip_prefix("listening on http://") {
            break addr.trim().to_owned();
        }
    };

    // A delivery whose handler takes 200 ms, holding the event's lock meanwhile.
    let mut request = TcpStream::connect(&addr).expect("connect to the example");
    request
        .set_read_timeout(Some(Duration::from_secs(10)))
        .expect("read timeout");
    let body = r#"{"id":"evt_sigterm"}"#;
    write!(
        request,
        "POST /webhooks/events HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\n\
         content-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
    .expect("send the request");
    let deadline = Instant::now() + Duration::from_secs(5);
    while locks_left(&server).is_empty() {
        assert!(Instant::now() < deadline, "the request never took its lock");
        std::thread::sleep(Duration::from_millis(5));
    }

    let pid = libc::pid_t::try_from(example.0.id()).expect("a pid");
    // SAFETY: kill(2) on our own child, not yet reaped, so its pid is not reused.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0, "SIGTERM");

    // The answer ends with the connection (the process exits at the latest).
    let mut answer = String::new();
    let _ = request.read_to_string(&mut answer);
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(status) = example.0.try_wait().expect("wait for the example") {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "the example still ran 10 s after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(10));
    };
    let left = locks_left(&server);
    assert!(left.is_empty(), "left behind: {left:?}");
    // The request in flight was finished, not cut off, and the process exited by itself.
    assert!(answer.starts_with("HTTP/1.1 200"), "answered: {answer:?}");
    assert!(status.success(), "the example exited with {status}");
}
