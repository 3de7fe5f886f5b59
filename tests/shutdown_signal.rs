//! SIGTERM during a held request: a server that stops as the README shows
//! (`with_graceful_shutdown(lockwarden::shutdown_signal())`, then
//! `LockClient::shutdown`) answers the request in flight and frees its lock, so another
//! replica (this test's process) gets the key within a second, not after the 30 s
//! watchdog lease. The server is a second process: a copy of this test binary running
//! the `server` test.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use axum::routing::post;
use axum::Router;
use lockwarden::{LockClient, LockLayer};
use lockwarden_testkit::{run_child, RedisServer, TestProcess};

/// The Redis URL, set only in the server's process.
const SERVER_ENV: &str = "LOCKWARDEN_SIGNAL_TEST_REDIS";

/// How long the server's handler holds its request's lock.
const HANDLER: Duration = Duration::from_millis(500);

/// Not a test on its own: the server, when started by the test below.
#[test]
fn server() {
    run_child(SERVER_ENV, |url| async move {
        let locks = LockClient::connect(&url).await.expect("connect");
        let app = Router::new()
            .route(
                "/charge",
                post(|| async {
                    tokio::time::sleep(HANDLER).await;
                    "charged"
                }),
            )
            .layer(LockLayer::by_header("Idempotency-Key").client(locks.clone()));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        println!("LISTENING {}", listener.local_addr().expect("address"));
        axum::serve(listener, app)
            .with_graceful_shutdown(lockwarden::shutdown_signal())
            .await
            .expect("serve");
        locks
            .shutdown(Duration::from_secs(5))
            .await
            .expect("every lock released");
        println!("STOPPED");
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_during_a_held_request_frees_the_key_for_the_other_replica_within_a_second() {
    let redis = RedisServer::start().expect("redis-server");
    let mut server =
        TestProcess::spawn("server", &[(SERVER_ENV, &redis.url())]).expect("start the server");
    let addr = server.wait_for_line("LISTENING ", Duration::from_secs(30));

    // A request that holds `http:order-7` for half a second.
    let request = std::thread::spawn(move || {
        let mut stream = TcpStream::connect(&addr).expect("connect to the server");
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .expect("read timeout");
        write!(
            stream,
            "POST /charge HTTP/1.1\r\nhost: {addr}\r\nidempotency-key: order-7\r\n\
             content-length: 0\r\nconnection: close\r\n\r\n"
        )
        .expect("send the request");
        let mut answer = String::new();
        let _ = stream.read_to_string(&mut answer);
        answer
    });
    let deadline = Instant::now() + Duration::from_secs(5);
    while !redis.exists("lockwarden:{http:order-7}") {
        assert!(Instant::now() < deadline, "the request never took its lock");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }

    // The other replica.
    let replica = LockClient::connect(&redis.url()).await.expect("connect");
    let pid = libc::pid_t::try_from(server.pid().expect("running")).expect("a pid");
    // SAFETY: kill(2) on our own child, not yet reaped, so its pid is not reused.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0, "SIGTERM");
    let sent = Instant::now();
    let got = replica
        .try_acquire("http:order-7", Duration::from_secs(1))
        .await;
    let waited = sent.elapsed();
    assert!(
        got.is_ok(),
        "the other replica did not get the key within 1 s of SIGTERM: {got:?}"
    );
    assert!(waited <= Duration::from_secs(1), "took {waited:?}");
    if let Ok(guard) = got {
        guard.release().await.expect("release");
    }

    // The request in flight was answered, not cut off, and the server stopped by itself.
    let answer = request.join().expect("the request's thread");
    assert!(answer.starts_with("HTTP/1.1 200"), "answered: {answer:?}");
    server.wait_for_line("STOPPED", Duration::from_secs(10));
    assert!(server.wait_within(Duration::from_secs(10)).success());
}
