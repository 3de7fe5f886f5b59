//! Mutual exclusion across processes: 8 processes × 16 tasks hammer one lock and, inside
//! it, do a deliberately non-atomic read-modify-write of a Redis counter (GET, a yield or a
//! short sleep, SET) and hand the hold's fencing token to a "protected resource" that
//! records any token not greater than the last one it accepted.
//!
//! The processes are this test binary itself, re-executed so that it runs only
//! [`mx_child`] (see [`CHILD_ENV`]); run normally, `mx_child` returns at once.
//!
//! Duration: 20 s (`LOCKWARDEN_MX_SECS=<n>` for another bound). Each task also stops after
//! [`MAX_PER_TASK`] increments.

use std::time::{Duration, Instant};

use lockwarden_core::{LockClient, LockError};
use lockwarden_testkit::{run_child, RedisServer, TestProcess};

/// Set (to a Redis URL) only in re-executed children.
const CHILD_ENV: &str = "LOCKWARDEN_MX_URL";
/// How long a child runs, in ms (set by the parent).
const RUN_MS_ENV: &str = "LOCKWARDEN_MX_RUN_MS";
const CHILD_TEST: &str = "mx_child";
const PROCESSES: usize = 8;
const TASKS: usize = 16;
/// Bounds each task's loop by count as well as by time.
const MAX_PER_TASK: u64 = 20_000;
const LOCK: &str = "mx";
const COUNTER: &str = "mx:counter";
const MAX_TOKEN: &str = "mx:max-token";
const VIOLATIONS: &str = "mx:violations";
const WRITES: &str = "mx:writes";

/// The protected resource's fencing check: accepts a write only with a token greater than
/// every one it accepted before; counts violations otherwise (and still counts the write).
/// KEYS: max token, violations, writes; ARGV: token. Returns 1 accepted, 0 violation.
const FENCE: &str = r"
redis.call('INCR', KEYS[3])
local last = redis.call('GET', KEYS[1])
-- Tokens are µs timestamps (< 2^53), exact as Lua numbers.
if last and tonumber(last) >= tonumber(ARGV[1]) then
  redis.call('INCR', KEYS[2])
  return 0
end
redis.call('SET', KEYS[1], ARGV[1])
return 1
";

/// What one child did, as printed on its `DONE` line.
#[derive(Debug, Default, Clone, Copy)]
struct Report {
    increments: u64,
    timeouts: u64,
    errors: u64,
    lost: u64,
    rejected: u64,
}

impl Report {
    fn line(&self) -> String {
        format!(
            "DONE increments={} timeouts={} errors={} lost={} rejected={}",
            self.increments, self.timeouts, self.errors, self.lost, self.rejected
        )
    }

    /// Parses what follows `DONE ` on a [`Report::line`].
    fn parse(rest: &str) -> Option<Report> {
        let mut r = Report::default();
        for field in rest.split_whitespace() {
            let (name, value) = field.split_once('=')?;
            let value = value.parse().ok()?;
            match name {
                "increments" => r.increments = value,
                "timeouts" => r.timeouts = value,
                "errors" => r.errors = value,
                "lost" => r.lost = value,
                "rejected" => r.rejected = value,
                _ => return None,
            }
        }
        Some(r)
    }

    fn add(&mut self, o: &Report) {
        self.increments += o.increments;
        self.timeouts += o.timeouts;
        self.errors += o.errors;
        self.lost += o.lost;
        self.rejected += o.rejected;
    }
}

/// One task of a child: lock, read-modify-write, fence, release, until the deadline.
async fn worker(
    client: LockClient,
    mut redis: redis::aio::MultiplexedConnection,
    deadline: tokio::time::Instant,
    seed: u64,
) -> Report {
    let fence = redis::Script::new(FENCE);
    let mut report = Report::default();
    let mut rng = seed | 1;
    for _ in 0..MAX_PER_TASK {
        let now = tokio::time::Instant::now();
        if now >= deadline {
            break;
        }
        let guard = match client.try_acquire(LOCK, deadline - now).await {
            Ok(guard) => guard,
            Err(LockError::Timeout { .. }) => {
                report.timeouts += 1;
                continue;
            }
            Err(e) => {
                eprintln!("acquire failed: {e}");
                report.errors += 1;
                continue;
            }
        };
        let value: Option<u64> = redis::cmd("GET")
            .arg(COUNTER)
            .query_async(&mut redis)
            .await
            .unwrap();
        // Widen the race window: a yield, sometimes a real sleep.
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        if rng.is_multiple_of(8) {
            tokio::time::sleep(Duration::from_millis(1)).await;
        } else {
            tokio::task::yield_now().await;
        }
        let () = redis::cmd("SET")
            .arg(COUNTER)
            .arg(value.unwrap_or(0) + 1)
            .query_async(&mut redis)
            .await
            .unwrap();
        let accepted: i64 = fence
            .key(MAX_TOKEN)
            .key(VIOLATIONS)
            .key(WRITES)
            .arg(guard.fencing_token())
            .invoke_async(&mut redis)
            .await
            .unwrap();
        report.increments += 1;
        if accepted != 1 {
            report.rejected += 1;
        }
        if guard.is_lost() {
            report.lost += 1;
        }
        if let Err(e) = guard.release().await {
            eprintln!("release failed: {e}");
            report.errors += 1;
        }
    }
    report
}

/// Not a test on its own: the body of one child process. Without [`CHILD_ENV`] it returns
/// at once. With it, it runs [`TASKS`] workers on one client for `LOCKWARDEN_MX_RUN_MS`,
/// then prints its `DONE …` line and exits.
#[test]
fn mx_child() {
    run_child(CHILD_ENV, |url| async move {
        let run = Duration::from_millis(std::env::var(RUN_MS_ENV).unwrap().parse().unwrap());
        let client = LockClient::connect(&url).await.unwrap();
        let redis_client = redis::Client::open(url.as_str()).unwrap();
        let config =
            redis::AsyncConnectionConfig::new().set_response_timeout(Some(Duration::from_secs(10)));
        let deadline = tokio::time::Instant::now() + run;
        let mut tasks = Vec::new();
        for t in 0..TASKS {
            let redis = redis_client
                .get_multiplexed_async_connection_with_config(&config)
                .await
                .unwrap();
            let seed = std::process::id() as u64 * 1_000 + t as u64;
            tasks.push(tokio::spawn(worker(client.clone(), redis, deadline, seed)));
        }
        let mut total = Report::default();
        for task in tasks {
            // Every call inside is bounded (command timeouts, the wait budget); this is
            // the backstop.
            let r = tokio::time::timeout(run + Duration::from_secs(30), task)
                .await
                .expect("worker ends after its deadline")
                .unwrap();
            total.add(&r);
        }
        println!("{}", total.line());
    });
}

/// Promise: across processes, the lock serializes its holders. 8 processes × 16 tasks
/// run a non-atomic read-modify-write of a counter under the lock for 20 s; then
/// - no update is lost: the counter equals the sum of the increments the children report
///   (and the resource saw exactly that many writes);
/// - the fencing tokens the resource sees never go backwards or repeat (0 violations);
/// - no guard was lost or failed to release, and every process made progress.
#[test]
fn processes_never_hold_the_lock_together() {
    let secs = std::env::var("LOCKWARDEN_MX_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20);
    let run = Duration::from_secs(secs);
    let server = RedisServer::start().unwrap();
    let started = Instant::now();
    let run_ms = run.as_millis().to_string();
    let mut children: Vec<TestProcess> = (0..PROCESSES)
        .map(|_| {
            TestProcess::spawn(
                CHILD_TEST,
                &[(CHILD_ENV, &server.url()), (RUN_MS_ENV, &run_ms)],
            )
            .unwrap()
        })
        .collect();

    // Children stop by themselves at their deadline; give them 60 s more (start-up, a
    // loaded machine) before declaring them stuck.
    let deadline = Instant::now() + run + Duration::from_secs(60);
    let mut reports = Vec::new();
    for child in &mut children {
        let left = deadline.saturating_duration_since(Instant::now());
        let line = child.wait_for_line("DONE ", left);
        reports.push(Report::parse(&line).unwrap_or_else(|| panic!("bad report {line:?}")));
        let status = child.wait_within(Duration::from_secs(30));
        assert!(status.success(), "a child failed: {status}");
    }
    let took = started.elapsed();

    let mut total = Report::default();
    for r in &reports {
        total.add(r);
    }
    let counter: u64 = server.query(&["GET", COUNTER]).unwrap();
    let writes: u64 = server.query(&["GET", WRITES]).unwrap();
    let violations: Option<u64> = server.query(&["GET", VIOLATIONS]).unwrap();
    let per_process: Vec<u64> = reports.iter().map(|r| r.increments).collect();
    println!(
        "{PROCESSES} processes × {TASKS} tasks for {run:?} (took {took:?}): counter {counter}, \
         increments reported {} (per process {per_process:?}), resource writes {writes}, \
         fencing violations {}, timeouts {}, errors {}, lost {}",
        total.increments,
        violations.unwrap_or(0),
        total.timeouts,
        total.errors,
        total.lost
    );
    assert_eq!(
        counter, total.increments,
        "lost updates: the counter is not the number of increments made"
    );
    assert_eq!(writes, total.increments);
    assert_eq!(violations.unwrap_or(0), 0, "fencing tokens went backwards");
    assert_eq!(total.rejected, 0);
    assert_eq!(total.errors, 0, "acquire or release errors");
    assert_eq!(total.lost, 0, "guards reported lost");
    assert!(
        reports.iter().all(|r| r.increments > 0),
        "a process never got the lock: {per_process:?}"
    );
    assert!(
        total.increments >= 100,
        "too little contention to mean anything: {} increments",
        total.increments
    );
}
