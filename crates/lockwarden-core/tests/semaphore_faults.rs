//! Semaphores against real faults, on a real `redis-server`:
//! - processes × tasks on one semaphore of 3 permits for 20 s: a witness in Redis sees at
//!   most 3 holders at once;
//! - a holder process SIGKILLed: its permit comes back within one lease (+1 s), and a
//!   waiting process gets it without polling;
//! - under lost replies, resets, blackholes and two Redis restarts (the testkit's fault
//!   proxy): every over-admission is reported through `lost()` (or a failed release)
//!   before its holder lets go, and nothing is left once the faults end;
//! - a release wakes only the waiters it grants permits to (commands counted).
//!
//! The child processes are this test binary itself, re-executed to run only
//! [`holder_child`] or [`worker_child`] (see the `*_ENV` variables); run normally they
//! return at once.

mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{connect_with, finishes, hold_until_killed, spawn_timed};
use lockwarden_core::{LockClient, LockError};
use lockwarden_testkit::{eventually, run_child, ChaosRun, FaultProxy, RedisServer, TestProcess};

const CAPACITY: u32 = 3;
const HOLDER_ENV: &str = "LOCKWARDEN_PERMIT_HOLDER_URL";
const WORKER_ENV: &str = "LOCKWARDEN_PERMIT_WORKER_URL";
const RUN_MS_ENV: &str = "LOCKWARDEN_PERMIT_RUN_MS";
const PROCESSES: usize = 4;
const TASKS: usize = 8;
/// Bounds each worker's loop by count as well as by time.
const MAX_PER_TASK: u64 = 20_000;

/// The witness: counts holders inside (KEYS[1]), the most seen (KEYS[2]) and the times
/// more than ARGV[1] were inside (KEYS[3]). ARGV[2] is `1` to enter, `-1` to leave.
const WITNESS: &str = r"
local inside = redis.call('INCRBY', KEYS[1], ARGV[2])
if tonumber(ARGV[2]) > 0 then
  local most = tonumber(redis.call('GET', KEYS[2]) or '0')
  if inside > most then
    redis.call('SET', KEYS[2], inside)
  end
  if inside > tonumber(ARGV[1]) then
    redis.call('INCR', KEYS[3])
  end
end
return inside
";

/// Not a test on its own: a worker process. Without [`WORKER_ENV`] it returns at once.
/// With it, [`TASKS`] tasks take a permit, enter the witness, hold a moment, leave,
/// release, until `LOCKWARDEN_PERMIT_RUN_MS`; then it prints `DONE <cycles> <lost>
/// <errors>`.
#[test]
fn worker_child() {
    run_child(WORKER_ENV, |url| async move {
        let run = Duration::from_millis(std::env::var(RUN_MS_ENV).unwrap().parse().unwrap());
        let client = LockClient::connect(&url).await.unwrap();
        let redis = redis::Client::open(url.as_str()).unwrap();
        let deadline = tokio::time::Instant::now() + run;
        let mut tasks = Vec::new();
        for t in 0..TASKS {
            let sem = client.semaphore("witnessed", CAPACITY);
            let mut conn = redis.get_multiplexed_async_connection().await.unwrap();
            tasks.push(tokio::spawn(async move {
                let witness = redis::Script::new(WITNESS);
                let (mut cycles, mut lost, mut errors) = (0u64, 0u64, 0u64);
                for _ in 0..MAX_PER_TASK {
                    let now = tokio::time::Instant::now();
                    if now >= deadline {
                        break;
                    }
                    let permit = match sem.try_acquire(deadline - now).await {
                        Ok(permit) => permit,
                        Err(LockError::Timeout { .. }) => continue,
                        Err(e) => {
                            eprintln!("acquire failed: {e}");
                            errors += 1;
                            continue;
                        }
                    };
                    let step = |n: i64| {
                        let mut call = witness.key("w:inside");
                        call.key("w:most").key("w:over").arg(CAPACITY).arg(n);
                        call
                    };
                    let _: i64 = step(1).invoke_async(&mut conn).await.unwrap();
                    if (t as u64 + cycles).is_multiple_of(4) {
                        tokio::time::sleep(Duration::from_millis(1)).await;
                    } else {
                        tokio::task::yield_now().await;
                    }
                    let _: i64 = step(-1).invoke_async(&mut conn).await.unwrap();
                    cycles += 1;
                    lost += u64::from(permit.is_lost());
                    if let Err(e) = permit.release().await {
                        eprintln!("release failed: {e}");
                        errors += 1;
                    }
                }
                (cycles, lost, errors)
            }));
        }
        let mut total = (0, 0, 0);
        for task in tasks {
            let (c, l, e) = tokio::time::timeout(run + Duration::from_secs(30), task)
                .await
                .expect("a worker ends after its deadline")
                .unwrap();
            total = (total.0 + c, total.1 + l, total.2 + e);
        }
        println!("DONE {} {} {}", total.0, total.1, total.2);
    });
}

/// Promise: 4 processes × 8 tasks on one semaphore of 3 for 20 s
/// (`LOCKWARDEN_PERMIT_SECS=<n>` for another bound): a witness in Redis, entered while a
/// permit is held, never sees more than 3 inside, and sees 3; no permit is lost, no call
/// fails, every process gets permits.
#[test]
fn processes_never_hold_more_than_the_capacity() {
    let secs = std::env::var("LOCKWARDEN_PERMIT_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20);
    let run = Duration::from_secs(secs);
    let server = RedisServer::start().unwrap();
    let run_ms = run.as_millis().to_string();
    let mut children: Vec<TestProcess> = (0..PROCESSES)
        .map(|_| {
            TestProcess::spawn(
                "worker_child",
                &[(WORKER_ENV, &server.url()), (RUN_MS_ENV, &run_ms)],
            )
            .unwrap()
        })
        .collect();
    let deadline = Instant::now() + run + Duration::from_secs(60);
    let mut reports = Vec::new();
    for child in &mut children {
        let line = child.wait_for_line("DONE ", deadline.saturating_duration_since(Instant::now()));
        let numbers: Vec<u64> = line.split(' ').map(|n| n.parse().unwrap()).collect();
        reports.push((numbers[0], numbers[1], numbers[2]));
        assert!(child.wait_within(Duration::from_secs(30)).success());
    }
    let most: u64 = server.query(&["GET", "w:most"]).unwrap();
    let over: Option<u64> = server.query(&["GET", "w:over"]).unwrap();
    let cycles: u64 = reports.iter().map(|r| r.0).sum();
    println!(
        "{PROCESSES} processes × {TASKS} tasks for {run:?}: {cycles} cycles {reports:?} \
         (cycles, lost, errors); most inside at once {most}; over {over:?}"
    );
    assert_eq!(over.unwrap_or(0), 0, "more than {CAPACITY} inside at once");
    assert_eq!(most, u64::from(CAPACITY), "the permits were not all used");
    assert!(reports.iter().all(|r| r.0 > 0), "a process got no permit");
    assert!(
        reports.iter().all(|r| r.1 == 0 && r.2 == 0),
        "lost or failed"
    );
    assert!(cycles >= 100, "too little to mean anything");
}

/// The holder process's watchdog lease: renewed every 500 ms.
const LEASE: Duration = Duration::from_millis(1500);

/// Not a test on its own: a process that holds the only permit of `killed` with a 1.5 s
/// watchdog lease until it is SIGKILLed (at most 120 s).
#[test]
fn holder_child() {
    run_child(HOLDER_ENV, |url| async move {
        let client = connect_with(&url, |b| b.watchdog_timeout(LEASE)).await;
        let permit = client
            .semaphore("killed", 1)
            .try_acquire(Duration::from_secs(10))
            .await
            .unwrap();
        let line = format!("HELD {}", permit.fencing_token());
        hold_until_killed(line, permit).await;
    });
}

/// Promise: the permit of a holder process killed with SIGKILL comes back when its
/// lease ends, by the server's clock: a waiter in another process, waiting when it dies,
/// gets it within one lease (+1 s) of the kill, not before the lease ends; and while it
/// waits it does not poll: a few attempts in 3 s (it sleeps until the holder's lease could
/// end), not hundreds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_holders_permit_comes_back_within_a_lease_without_polling() {
    let server = RedisServer::start().unwrap();
    let mut child = TestProcess::spawn("holder_child", &[(HOLDER_ENV, &server.url())]).unwrap();
    let token: u64 = child
        .wait_for_line("HELD ", Duration::from_secs(30))
        .parse()
        .unwrap();
    let waiter = LockClient::connect(&server.url()).await.unwrap();
    let before = server.script_calls();
    let task = spawn_timed({
        let waiter = waiter.clone();
        async move {
            waiter
                .semaphore("killed", 1)
                .try_acquire(Duration::from_secs(20))
                .await
        }
    });
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(!task.is_finished(), "the waiter got a held permit");
    // The holder's renewals (6 in 3 s) and the waiter's attempts: each a lease apart.
    let calls = server.script_calls() - before;
    assert!(calls <= 16, "{calls} script calls in 3 s: the waiter polls");

    // The held permits are the semaphore's members scored by their lease's deadline
    // (server ms, below 1e13; see `lua/permits_prelude.lua`).
    let key = waiter.key("killed").unwrap();
    let last: Vec<(String, f64)> = server
        .query(&["ZRANGEBYSCORE", key.redis_key(), "0", "(1e13", "WITHSCORES"])
        .unwrap();
    let asked_at = Instant::now();
    let (secs, micros): (u64, u64) = server.query(&["TIME"]).unwrap();
    child.kill();
    let killed_at = Instant::now();
    let left_ms = last[0].1 - (secs * 1000 + micros / 1000) as f64;
    assert!(
        left_ms > 0.0 && left_ms <= LEASE.as_millis() as f64,
        "lease left at the kill: {left_ms} ms"
    );
    let (got, at) = finishes(Duration::from_secs(15), "the waiter", task).await;
    let got = got.expect("the dead holder's permit");
    let earliest = asked_at + Duration::from_millis(left_ms as u64);
    assert!(
        at + Duration::from_millis(100) >= earliest,
        "taken {:?} before the holder's lease ended",
        earliest.saturating_duration_since(at)
    );
    assert!(
        at <= killed_at + LEASE + Duration::from_secs(1),
        "taken {:?} after the kill",
        at.duration_since(killed_at)
    );
    assert!(got.fencing_token() > token);
    got.release().await.unwrap();
}

/// Promise: with 10 waiters in line on a semaphore of 1, a release grants the permit to
/// the head alone: the release is the one script call, the head holds without another,
/// and no other waiter wakes to try.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_wakes_only_the_waiter_it_grants_to() {
    let server = RedisServer::start().unwrap();
    let client = LockClient::connect(&server.url()).await.unwrap();
    // Every script used once first: the first call of a script Redis has not loaded yet
    // is sent twice (NOSCRIPT, then again after loading it). A release with a waiter of
    // this client in line is the script that grants (without one, plain commands).
    let warm = client.semaphore("warm-up", 1);
    let first = warm.acquire().await.unwrap();
    let next = tokio::spawn({
        let warm = warm.clone();
        async move { warm.try_acquire(Duration::from_secs(10)).await.unwrap() }
    });
    eventually(Duration::from_secs(5), "a waiter in line", || async {
        warm.state().await.unwrap().map(|s| s.waiting) == Some(1)
    })
    .await;
    first.release().await.unwrap();
    finishes(Duration::from_secs(5), "the warm-up's waiter", next)
        .await
        .release()
        .await
        .unwrap();
    let sem = client.semaphore("one-at-a-time", 1);
    let held = sem.acquire().await.unwrap();
    let granted = Arc::new(AtomicU64::new(0));
    let mut waiters = Vec::new();
    for _ in 0..10 {
        let (sem, granted) = (sem.clone(), granted.clone());
        waiters.push(tokio::spawn(async move {
            let permit = sem.try_acquire(Duration::from_secs(30)).await.unwrap();
            granted.fetch_add(1, Ordering::SeqCst);
            permit
        }));
    }
    eventually(Duration::from_secs(5), "ten in line", || async {
        sem.state().await.unwrap().map(|s| s.waiting) == Some(10)
    })
    .await;
    // Let every waiter's first retry (after it subscribed) pass.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let before = server.script_calls();
    held.release().await.unwrap();
    eventually(Duration::from_secs(5), "one granted", || async {
        granted.load(Ordering::SeqCst) == 1
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let calls = server.script_calls() - before;
    assert_eq!(granted.load(Ordering::SeqCst), 1);
    assert_eq!(calls, 1, "script calls for one handoff (the release alone)");
    for waiter in waiters {
        waiter.abort();
    }
}

const CHAOS_LEASE: Duration = Duration::from_millis(1500);
const COMMAND_TIMEOUT: Duration = Duration::from_millis(300);
const CHAOS: Duration = Duration::from_secs(20);
const RESTARTS: [Duration; 2] = [Duration::from_secs(7), Duration::from_secs(14)];
const WORKERS: usize = 9;

/// One hold as the witness saw it: from when its permit was granted to when its holder
/// let go, and whether it learned of a loss by then (`lost()`, or a failed release).
#[derive(Debug, Clone, Copy)]
struct Hold {
    from: Instant,
    to: Instant,
    reported: bool,
}

/// Promise: under the fault proxy's latency spikes, lost replies, blackholes longer than
/// the lease and resets, and two Redis restarts, no over-admission goes unreported: of
/// the holders inside at any one time, at most the capacity let go without learning they
/// had lost their permit. Once the faults end nothing is left in Redis.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_faults_no_over_admission_goes_unreported() {
    let server = RedisServer::start().unwrap();
    let proxy = Arc::new(FaultProxy::start(server.port()).unwrap());
    let settings = |b: lockwarden_core::LockClientBuilder| {
        b.watchdog_timeout(CHAOS_LEASE)
            .command_timeout(COMMAND_TIMEOUT)
    };
    let clients = [
        connect_with(&proxy.url(), settings).await,
        connect_with(&proxy.url(), settings).await,
        connect_with(&server.url(), settings).await,
    ];
    let holds: Arc<Mutex<Vec<Hold>>> = Arc::default();
    let stop = Instant::now() + CHAOS;
    let mut workers = tokio::task::JoinSet::new();
    for w in 0..WORKERS {
        let sem = clients[w % clients.len()].semaphore("chaos", CAPACITY);
        let holds = holds.clone();
        workers.spawn(async move {
            for round in 0..5_000u64 {
                if Instant::now() >= stop {
                    break;
                }
                let Ok(permit) = sem.try_acquire(Duration::from_millis(500)).await else {
                    continue;
                };
                let from = Instant::now();
                let hold = Duration::from_millis(5 + (round * 7 + w as u64) % 40);
                tokio::time::sleep(hold).await;
                let lost = permit.is_lost();
                let to = Instant::now();
                let released = permit.release().await;
                let reported = lost || released.is_err();
                holds.lock().unwrap().push(Hold { from, to, reported });
            }
        });
    }
    let faults = ChaosRun {
        stop,
        restarts_at: &RESTARTS,
        command_timeout: COMMAND_TIMEOUT,
        lease: CHAOS_LEASE,
    };
    let (restarts, server) = faults.run(proxy.clone(), server, || true, || {}).await;
    while let Some(done) = workers.join_next().await {
        done.expect("a worker panicked");
    }
    let holds = holds.lock().unwrap().clone();
    // The most silent holders (let go without learning of a loss) inside at once.
    let mut events: Vec<(Instant, i32)> = holds
        .iter()
        .filter(|h| !h.reported)
        .flat_map(|h| [(h.from, 1), (h.to, -1)])
        .collect();
    events.sort_by_key(|&(at, step)| (at, step));
    let (mut inside, mut most) = (0, 0);
    for (_, step) in events {
        inside += step;
        most = most.max(inside);
    }
    let reported = holds.iter().filter(|h| h.reported).count();
    eprintln!(
        "permits under chaos: {restarts} restarts, {} holds, {reported} reported lost, \
         most silent holders at once {most}",
        holds.len()
    );
    assert!(
        most <= CAPACITY as i32,
        "{most} holders inside at once never learned they had lost their permit"
    );
    assert_eq!(restarts, 2);
    assert!(
        holds.len() > 50,
        "the run did little: {} holds",
        holds.len()
    );
    assert!(reported > 0, "the faults cost no permit: they did not bite");
    // Whatever the faults left is settled or runs out with its lease.
    let left = || {
        let keys = server.keys_matching("lockwarden:*");
        keys.into_iter()
            .filter(|k| !k.ends_with(":fence"))
            .collect::<Vec<_>>()
    };
    let until = Instant::now() + CHAOS_LEASE * 2 + Duration::from_secs(2);
    while !left().is_empty() && Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(left(), Vec::<String>::new(), "keys left behind");
}
