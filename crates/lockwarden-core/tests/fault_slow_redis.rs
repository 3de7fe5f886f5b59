//! A slow (not dead) Redis under held watchdog locks: `DEBUG SLEEP` blocks the server
//! for a while, then it answers every queued command late. Renewals time out locally
//! (the command timeout is shorter than the sleep) and are retried.
//!
//! The promise checked throughout: every held lock is, at every observation, either
//! still held in Redis by its holder or reported lost by its guard; never "gone from
//! Redis but the guard still says held". Because the watchdog only notices at its next
//! renewal attempt, "reported lost" is allowed to trail "gone from Redis" by the command
//! timeout plus 250 ms of scheduling slack ([`grace`]), and no more.

mod common;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::connect_with;
use lockwarden_core::{LockClient, LockError, LockGuard};
use lockwarden_testkit::RedisServer;

const LOCKS: usize = 16;

/// A server that accepts `DEBUG` (Redis 7 refuses it unless enabled; older servers do
/// not know the option and allow it anyway).
fn debug_server() -> RedisServer {
    RedisServer::start_with(&["--enable-debug-command", "yes"])
        .or_else(|_| RedisServer::start())
        .expect("start redis-server")
}

/// A client with this watchdog lease and command timeout.
async fn client(server: &RedisServer, lease: Duration, command_timeout: Duration) -> LockClient {
    connect_with(&server.url(), |b| {
        b.watchdog_timeout(lease).command_timeout(command_timeout)
    })
    .await
}

/// Blocks the whole server for `delay` with `DEBUG SLEEP` from a plain thread (the reply
/// only comes once the server runs again). Returns when the sleep was sent and when the
/// server answered, i.e. was responsive again.
fn slow_server(
    server: &RedisServer,
    delay: Duration,
) -> std::thread::JoinHandle<(Instant, Instant)> {
    let mut con = server.connection().unwrap();
    con.set_read_timeout(Some(delay + Duration::from_secs(10)))
        .unwrap();
    std::thread::spawn(move || {
        let sent = Instant::now();
        let _: () = redis::cmd("DEBUG")
            .arg("SLEEP")
            .arg(format!("{:.3}", delay.as_secs_f64()))
            .query(&mut con)
            .expect("DEBUG SLEEP (is the DEBUG command enabled?)");
        (sent, Instant::now())
    })
}

/// How late "lost" may be reported after the lock is gone from Redis: a renewal in flight
/// when the lease ends only fails after the command timeout.
fn grace(command_timeout: Duration) -> Duration {
    command_timeout + Duration::from_millis(250)
}

/// One held lock and when (if ever) its guard reported it lost.
struct Held {
    key: String,
    holder: String,
    guard: LockGuard,
    lost_at: Arc<Mutex<Option<Instant>>>,
}

async fn hold(client: &LockClient, prefix: &str) -> Vec<Held> {
    let mut held = Vec::new();
    for i in 0..LOCKS {
        let name = format!("{prefix}:{i}");
        let guard = client
            .try_acquire(&name, Duration::from_secs(5))
            .await
            .unwrap();
        let lost_at = Arc::new(Mutex::new(None));
        let signal = guard.lost_signal();
        let record = lost_at.clone();
        tokio::spawn(async move {
            signal.wait().await;
            *record.lock().unwrap() = Some(Instant::now());
        });
        held.push(Held {
            key: guard.key().redis_key().to_owned(),
            holder: guard.holder().id().to_owned(),
            guard,
            lost_at,
        });
    }
    held
}

/// A connection for observations that waits out a stall (the default response timeout
/// of redis-rs is 500 ms).
async fn observer(server: &RedisServer) -> redis::aio::MultiplexedConnection {
    let config = redis::AsyncConnectionConfig::new()
        .set_response_timeout(Some(Duration::from_secs(15)))
        .set_connection_timeout(Some(Duration::from_secs(5)));
    redis::Client::open(server.url())
        .unwrap()
        .get_multiplexed_async_connection_with_config(&config)
        .await
        .unwrap()
}

/// One look at Redis: which of the locks are held by their holders there, and when the
/// answer came back.
#[derive(Debug)]
struct Observation {
    at: Instant,
    held: Vec<bool>,
}

async fn observe(redis: &mut redis::aio::MultiplexedConnection, held: &[Held]) -> Observation {
    let mut pipe = redis::pipe();
    for h in held {
        pipe.cmd("HEXISTS").arg(&h.key).arg(&h.holder);
    }
    let replies: Vec<bool> = pipe.query_async(redis).await.unwrap();
    Observation {
        at: Instant::now(),
        held: replies,
    }
}

/// Observes every ~25 ms until `until` (each observation waits while the server sleeps).
async fn observe_until(
    redis: &mut redis::aio::MultiplexedConnection,
    held: &[Held],
    until: Instant,
) -> Vec<Observation> {
    let mut seen = Vec::new();
    // Bounded by time and by count (a 10 s window at 25 ms per look is ~400).
    for _ in 0..2_000 {
        if Instant::now() >= until {
            break;
        }
        seen.push(observe(redis, held).await);
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    seen
}

/// Every observation that found a lock gone from Redis must be matched by its guard
/// reporting it lost no later than `grace` after that observation's reply.
fn assert_gone_implies_lost(held: &[Held], seen: &[Observation], grace: Duration) {
    for obs in seen {
        for (h, &in_redis) in held.iter().zip(&obs.held) {
            if in_redis {
                continue;
            }
            let lost_at = *h.lost_at.lock().unwrap();
            match lost_at {
                Some(at) if at <= obs.at + grace => {}
                Some(at) => panic!(
                    "{} was gone from Redis but reported lost only {:?} later",
                    h.key,
                    at - obs.at
                ),
                None => panic!("{} is gone from Redis but its guard says held", h.key),
            }
        }
    }
}

/// Promise: a server that stalls for less than the lease (but longer than the command
/// timeout and the renewal interval, so renewals time out and must be retried) loses no
/// lock. Three 1.2 s stalls, 400 ms apart, under 16 locks with a 3 s watchdog lease
/// (renewal every 1 s) and a 250 ms command timeout: every observation finds every lock
/// held, no guard reports lost, and 1.2 s after the last stall the renewals have caught
/// up (every PTTL > 1.5 s, which an unrenewed lock cannot have by then).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stall_shorter_than_the_lease_loses_no_lock() {
    let server = debug_server();
    let lease = Duration::from_secs(3);
    let command_timeout = Duration::from_millis(250);
    let client = client(&server, lease, command_timeout).await;
    let held = hold(&client, "short-stall").await;
    let mut redis = observer(&server).await;

    let delay = Duration::from_millis(1200);
    let mut seen = Vec::new();
    let mut stalls = Vec::new();
    for _ in 0..3 {
        let stall = slow_server(&server, delay);
        seen.extend(
            observe_until(
                &mut redis,
                &held,
                Instant::now() + delay + Duration::from_millis(400),
            )
            .await,
        );
        let (sent, answered) = tokio::task::spawn_blocking(move || stall.join().unwrap())
            .await
            .unwrap();
        stalls.push(answered - sent);
    }
    // Give the watchdog one renewal interval to catch up, then look again.
    tokio::time::sleep(lease / 3 + Duration::from_millis(200)).await;
    seen.push(observe(&mut redis, &held).await);
    println!(
        "stalls as seen by the client: {stalls:?}; {} observations",
        seen.len()
    );
    for s in &stalls {
        assert!(*s >= delay, "the server did not stall ({s:?})");
    }

    assert_gone_implies_lost(&held, &seen, grace(command_timeout));
    for h in &held {
        assert!(
            !h.guard.is_lost(),
            "{} reported lost after a short stall",
            h.key
        );
    }
    for obs in &seen {
        assert!(obs.held.iter().all(|&x| x), "a lock was gone: {obs:?}");
    }
    let min_ttl = held.iter().map(|h| server.pttl(&h.key)).min().unwrap();
    println!("smallest PTTL after the stalls: {min_ttl} ms (lease {lease:?})");
    assert!(
        min_ttl > 1500,
        "renewals did not catch up: PTTL {min_ttl} ms"
    );
    assert_eq!(client.stats().watched_locks, LOCKS);

    for h in held {
        h.guard.release().await.unwrap();
    }
    let left = server.keys_matching("lockwarden:{short-stall:*}");
    assert!(left.is_empty(), "{left:?}");
}

/// Promise: when the server stalls for longer than the lease (2.5 s against a 1 s lease,
/// 200 ms command timeout), every lock it held is gone from Redis once the server answers
/// again, and every guard reports lost: no later than [`grace`] after any observation that
/// found its lock gone, and in any case within 1 s after the server is responsive again.
/// Not too early either: not within the first half lease of the stall (the last renewal
/// before it granted up to a whole lease; half leaves room for a late watchdog). The watchdog
/// stops renewing lost locks (none reappears) and the client works again afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stall_longer_than_the_lease_is_reported_lost_not_hidden() {
    let server = debug_server();
    let lease = Duration::from_millis(1000);
    let command_timeout = Duration::from_millis(200);
    let client = client(&server, lease, command_timeout).await;
    let held = hold(&client, "long-stall").await;
    let mut redis = observer(&server).await;
    // Renewals are running before the stall.
    tokio::time::sleep(lease / 2).await;
    let mut seen = vec![observe(&mut redis, &held).await];
    assert!(seen[0].held.iter().all(|&x| x), "{:?}", seen[0]);

    let delay = Duration::from_millis(2500);
    let stall = slow_server(&server, delay);
    seen.extend(
        observe_until(
            &mut redis,
            &held,
            Instant::now() + delay + Duration::from_millis(1500),
        )
        .await,
    );
    let (stalled_at, answered_at) = tokio::task::spawn_blocking(move || stall.join().unwrap())
        .await
        .unwrap();
    println!(
        "stall as seen by the client: {:?}",
        answered_at - stalled_at
    );
    assert!(
        answered_at - stalled_at >= delay,
        "the server did not stall"
    );

    assert_gone_implies_lost(&held, &seen, grace(command_timeout));
    let earliest = stalled_at + lease / 2;
    let latest = answered_at + Duration::from_secs(1);
    let mut lost_after = Vec::new();
    for h in &held {
        let at = h
            .lost_at
            .lock()
            .unwrap()
            .expect("every lock is reported lost");
        assert!(h.guard.is_lost());
        assert!(
            at >= earliest,
            "{} reported lost {:?} into the stall, before its lease could have run out",
            h.key,
            at - stalled_at
        );
        assert!(
            at <= latest,
            "{} reported lost {:?} after the server answered again",
            h.key,
            at - answered_at
        );
        lost_after.push((at - stalled_at).as_millis());
    }
    lost_after.sort_unstable();
    println!(
        "lost reported {}..{} ms into the {delay:?} stall",
        lost_after[0],
        lost_after[LOCKS - 1]
    );
    // After the stall every lock is gone, and stays gone.
    let last = seen.last().expect("observations after the stall");
    assert!(last.at > answered_at);
    assert!(last.held.iter().all(|&x| !x), "{last:?}");
    assert_eq!(client.stats().watched_locks, 0);
    tokio::time::sleep(lease).await;
    let left = server.keys_matching("lockwarden:{long-stall:*}");
    let locks: Vec<&String> = left.iter().filter(|k| !k.ends_with(":fence")).collect();
    assert!(locks.is_empty(), "lost locks reappeared: {locks:?}");

    for h in held {
        assert!(matches!(
            h.guard.release().await,
            Err(LockError::Lost { .. })
        ));
    }
    let g = client
        .try_acquire("long-stall:after", Duration::from_secs(5))
        .await
        .expect("the client works again after the stall");
    g.release().await.unwrap();
}
