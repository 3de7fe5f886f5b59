//! The fair lock's promises (`LockClient::fair_lock`): first come, first served, no
//! barging, a waiter that gives up or dies leaves the queue in bounded time, only the
//! head is woken. Against both stores where it makes sense; the cross-process ones
//! against a real `redis-server`, with a waiter that is a real process (this test binary
//! re-executed, see [`WAITER_ENV`]) killed with SIGKILL.

mod common;

use std::pin::pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{drive_until, finishes, take_and_release, Env};
use lockwarden_core::{Claim, FairLock, LockClient, LockError, LockGuard};
use lockwarden_testkit::{eventually, run_child, RedisServer, TestProcess};
use tokio::task::JoinHandle;
use tokio::time::Instant;

conformance!(
    acquisition_order_is_arrival_order,
    no_barging_past_a_queued_head,
    waiters_that_give_up_leave_the_queue,
    cancelled_acquires_leave_no_queue_and_no_lock,
    reentry_fencing_and_watchdog,
    dropped_guard_hands_over_to_the_head,
    completing_a_fair_hold_stores_the_outcome_and_hands_over,
    a_grant_taken_up_by_asking_counts_once,
    a_grant_given_up_goes_to_the_next,
    a_granted_hold_outlives_its_queue_timeout,
);

/// Long enough that no waiter's own retry (every third of it) falls inside a test.
const PATIENT: Duration = Duration::from_secs(30);

/// Waits (bounded) until `lock` has `n` waiters queued.
async fn queued(lock: &FairLock, n: usize) {
    eventually(
        Duration::from_secs(10),
        format_args!("{n} waiters queued"),
        || async { lock.queued().await.unwrap() == n },
    )
    .await;
}

/// Spawns a waiter for `lock` (20 s budget) and waits until it is the `n`th in line.
async fn wait_in_line(lock: &FairLock, n: usize) -> JoinHandle<Result<LockGuard, LockError>> {
    let waiter = tokio::spawn({
        let lock = lock.clone();
        async move { lock.try_acquire(Duration::from_secs(20)).await }
    });
    queued(lock, n).await;
    waiter
}

/// Promise: under contention the lock goes to the waiters in the order they arrived,
/// whichever client (process, on Redis: connection) they came from.
async fn acquisition_order_is_arrival_order(env: Env) {
    const WAITERS: usize = 8;
    let clients = [env.client().await, env.client().await, env.client().await];
    let lock = clients[0].fair_lock("fifo");
    let held = lock.acquire().await.unwrap();
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for i in 0..WAITERS {
        let lock = clients[i % clients.len()]
            .fair_lock("fifo")
            .queue_timeout(PATIENT);
        let order = order.clone();
        tasks.push(tokio::spawn({
            let lock = lock.clone();
            async move {
                let guard = lock.try_acquire(Duration::from_secs(20)).await.unwrap();
                order.lock().unwrap().push((i, guard.fencing_token()));
                guard.release().await.unwrap();
            }
        }));
        // Arrival order made certain: the next one starts once this one is queued.
        queued(&lock, i + 1).await;
    }
    assert!(order.lock().unwrap().is_empty(), "a waiter got a held lock");
    held.release().await.unwrap();
    for task in tasks {
        finishes(Duration::from_secs(20), "every waiter gets its turn", task).await;
    }
    let order = order.lock().unwrap().clone();
    let arrivals: Vec<usize> = order.iter().map(|(i, _)| *i).collect();
    assert_eq!(arrivals, (0..WAITERS).collect::<Vec<_>>());
    assert!(
        order.windows(2).all(|w| w[0].1 < w[1].1),
        "fencing tokens must increase with each turn: {order:?}"
    );
    assert_eq!(lock.queued().await.unwrap(), 0);
    assert!(!lock.is_locked().await.unwrap());
}

/// Promise: a release hands the lock straight to the queued head, so a newcomer never
/// finds it free (neither with a zero budget nor by waiting), and the head holds it
/// without asking again, with the token the release gave it.
///
/// The head is made slow on purpose (its acquire is queued, then not polled): a lock that
/// were merely free for the head to take would let the newcomers barge here, not only
/// lose a race.
async fn no_barging_past_a_queued_head(env: Env) {
    let owner = env.client().await;
    let head_client = env.client().await;
    let newcomer = env.client().await;
    let held = owner.fair_lock("barge").acquire().await.unwrap();
    let released_token = held.fencing_token();
    let head_lock = head_client.fair_lock("barge").queue_timeout(PATIENT);
    let mut head = pin!(head_lock.try_acquire(Duration::from_secs(20)));
    drive_until(&mut head, queued(&head_lock, 1)).await;

    held.release().await.unwrap();
    assert!(
        owner.fair_lock("barge").is_locked().await.unwrap(),
        "the release handed the lock to the head"
    );
    assert_eq!(
        head_lock.queued().await.unwrap(),
        0,
        "the head left the queue"
    );
    match newcomer
        .fair_lock("barge")
        .try_acquire(Duration::ZERO)
        .await
    {
        Err(LockError::Timeout { .. }) => {}
        other => panic!("a newcomer barged past the queue: {other:?}"),
    }
    match newcomer
        .fair_lock("barge")
        .try_acquire(Duration::from_millis(300))
        .await
    {
        Err(LockError::Timeout { .. }) => {}
        other => panic!("a waiting newcomer barged past the queue: {other:?}"),
    }
    assert_eq!(
        head_lock.queued().await.unwrap(),
        0,
        "the newcomer left the queue as it gave up"
    );

    let guard = tokio::time::timeout(Duration::from_secs(5), head)
        .await
        .expect("the head takes its turn")
        .unwrap();
    assert!(head_lock.is_held_by(guard.holder()).await.unwrap());
    assert!(guard.fencing_token() > released_token);
    assert_eq!(head_lock.hold_count(guard.holder()).await.unwrap(), 1);
    guard.release().await.unwrap();
    assert!(!head_lock.is_locked().await.unwrap());
}

/// Promise: a waiter that takes its grant up by asking (a holder the caller gave may wait
/// in several tasks, so it does not take it from the notice) holds it once: its count is 1
/// and one release frees the lock.
async fn a_grant_taken_up_by_asking_counts_once(env: Env) {
    let owner = env.client().await;
    let waiter = env.client().await;
    let held = owner.fair_lock("grant-once").acquire().await.unwrap();
    let me = waiter.holder();
    let lock = waiter
        .fair_lock("grant-once")
        .queue_timeout(PATIENT)
        .holder(&me);
    let task = wait_in_line(&lock, 1).await;
    held.release().await.unwrap();
    let guard = finishes(Duration::from_secs(5), "the head gets its turn", task)
        .await
        .unwrap();
    assert_eq!(lock.hold_count(&me).await.unwrap(), 1);
    guard.release().await.unwrap();
    assert!(!lock.is_locked().await.unwrap(), "one release frees it");
}

/// Promise: a waiter handed the lock that gives up before it takes it (its acquire is
/// dropped) gives it on to the next waiter at once, not after its queue timeout.
async fn a_grant_given_up_goes_to_the_next(env: Env) {
    let owner = env.client().await;
    let waiters = env.client().await;
    let lock = waiters.fair_lock("given-up").queue_timeout(PATIENT);
    let held = owner.fair_lock("given-up").acquire().await.unwrap();
    let mut head = Box::pin(lock.try_acquire(Duration::from_secs(20)));
    drive_until(&mut head, queued(&lock, 1)).await;
    let next = wait_in_line(&lock, 2).await;
    held.release().await.unwrap();
    assert!(lock.is_locked().await.unwrap(), "handed to the head");
    drop(head);
    let guard = finishes(Duration::from_secs(5), "the next waiter gets it", next)
        .await
        .unwrap();
    assert_eq!(lock.hold_count(guard.holder()).await.unwrap(), 1);
    guard.release().await.unwrap();
    eventually(
        Duration::from_secs(5),
        "no waiter queued and no lock held",
        || async { lock.queued().await.unwrap() == 0 && !lock.is_locked().await.unwrap() },
    )
    .await;
}

/// Promise: a lock handed over on release lasts only what was left of the waiter's place
/// (so a granted waiter that died frees it within its queue timeout), and the watchdog
/// then keeps it for as long as the guard lives: held past that, not lost, excluding.
async fn a_granted_hold_outlives_its_queue_timeout(env: Env) {
    // The grant lives what was left of the place, so the place's refresh, the release,
    // the notice and the first renewal must all fit in one queue timeout: a waiter that
    // stalls longer counts as dead and loses it, as promised. A second leaves room for a
    // loaded machine's stalls (300 ms did not, with load average 9 on two cores).
    let queue_timeout = Duration::from_secs(1);
    let owner = env.client().await;
    let waiter = env.client().await;
    let other = env.client().await;
    let held = owner.fair_lock("granted").acquire().await.unwrap();
    // The waiter's watchdog already keeps a hold, so it sleeps until that one's renewal,
    // long after the grant's: the grant must wake it.
    let kept = waiter.acquire("granted:kept").await.unwrap();
    let lock = waiter.fair_lock("granted").queue_timeout(queue_timeout);
    let task = wait_in_line(&lock, 1).await;
    held.release().await.unwrap();
    let guard = finishes(Duration::from_secs(5), "the head gets its turn", task)
        .await
        .unwrap();
    // Past the grant's own life: only the watchdog keeps it now.
    tokio::time::sleep(queue_timeout * 2).await;
    assert!(!guard.is_lost());
    assert!(lock.is_held_by(guard.holder()).await.unwrap());
    match other.fair_lock("granted").try_acquire(Duration::ZERO).await {
        Err(LockError::Timeout { .. }) => {}
        other => panic!("the granted hold ran out under its guard: {other:?}"),
    }
    guard.release().await.unwrap();
    assert!(!lock.is_locked().await.unwrap());
    kept.release().await.unwrap();
}

/// Promise: a waiter whose budget is spent has left the queue when `try_acquire`
/// returns, one whose acquire is dropped leaves it in the background, and neither stalls
/// the waiter behind it (all keep their place for 30 s otherwise).
async fn waiters_that_give_up_leave_the_queue(env: Env) {
    let client = env.client().await;
    let other = env.client().await;
    let held = client.fair_lock("leave").acquire().await.unwrap();
    let lock = |c: &LockClient| c.fair_lock("leave").queue_timeout(PATIENT);

    let timing_out = tokio::spawn({
        let lock = lock(&other);
        async move { lock.try_acquire(Duration::from_secs(3)).await }
    });
    queued(&lock(&client), 1).await;
    let dropped = tokio::spawn({
        let lock = lock(&client);
        async move { lock.acquire().await }
    });
    queued(&lock(&client), 2).await;
    let behind = tokio::spawn({
        let lock = lock(&other);
        async move { lock.acquire().await }
    });
    queued(&lock(&client), 3).await;

    dropped.abort();
    assert!(dropped.await.unwrap_err().is_cancelled());
    queued(&lock(&client), 2).await;
    match timing_out.await.unwrap() {
        Err(LockError::Timeout { .. }) => {}
        other => panic!("expected a timeout, got {other:?}"),
    }
    assert_eq!(
        lock(&client).queued().await.unwrap(),
        1,
        "a waiter that timed out is still queued"
    );

    let released = Instant::now();
    held.release().await.unwrap();
    let guard = finishes(
        Duration::from_secs(5),
        "the waiter behind the ones that gave up is not stalled",
        behind,
    )
    .await
    .unwrap();
    assert!(
        released.elapsed() < Duration::from_secs(2),
        "took {:?}",
        released.elapsed()
    );
    assert_eq!(lock(&client).queued().await.unwrap(), 0);
    guard.release().await.unwrap();
}

/// Promise: acquires cut at any point (before, during or after their attempt reaches
/// the store) leave neither a held lock nor a queued waiter behind.
async fn cancelled_acquires_leave_no_queue_and_no_lock(env: Env) {
    let client = env.client().await;
    let held = client.fair_lock("cut").acquire().await.unwrap();
    for i in 0..60u64 {
        let cut = Duration::from_micros(i * 97 % 3000);
        let lock = client.fair_lock("cut").queue_timeout(PATIENT);
        let _ = tokio::time::timeout(cut, lock.acquire()).await;
    }
    held.release().await.unwrap();
    for i in 0..60u64 {
        let cut = Duration::from_micros(i * 97 % 3000);
        let lock = client.fair_lock("cut").queue_timeout(PATIENT);
        let _ = tokio::time::timeout(cut, lock.acquire()).await;
    }
    // Background leaves and releases finish soon; a queued leftover would stay 30 s.
    let lock = client.fair_lock("cut");
    eventually(
        Duration::from_secs(5),
        "no waiter queued and no lock held",
        || async { lock.queued().await.unwrap() == 0 && !lock.is_locked().await.unwrap() },
    )
    .await;
    take_and_release("free and nobody queued", lock.try_acquire(Duration::ZERO)).await;
}

/// Promise: held, a fair lock is an ordinary lock: re-entrant per holder with one
/// fencing token per hold, tokens increasing from hold to hold, kept alive by the
/// watchdog past its lease, and free after the last release.
async fn reentry_fencing_and_watchdog(env: Env) {
    let lease = Duration::from_millis(300);
    let client = env.client_with(|b| b.watchdog_timeout(lease)).await;
    let me = client.holder();
    let lock = client.fair_lock("held").holder(&me);
    let outer = lock.acquire().await.unwrap();
    let inner = lock.try_acquire(Duration::ZERO).await.unwrap();
    assert_eq!(lock.hold_count(&me).await.unwrap(), 2);
    assert_eq!(outer.fencing_token(), inner.fencing_token());
    inner.release().await.unwrap();
    assert_eq!(lock.hold_count(&me).await.unwrap(), 1);

    tokio::time::sleep(lease * 4).await;
    assert!(!outer.is_lost());
    assert!(
        lock.is_held_by(&me).await.unwrap(),
        "the watchdog let it go"
    );
    assert!(client
        .fair_lock("held")
        .try_acquire(Duration::ZERO)
        .await
        .is_err());
    let first = outer.fencing_token();
    outer.release().await.unwrap();
    assert!(!lock.is_locked().await.unwrap());
    assert_eq!(client.stats().watched_locks, 0);

    let next = client.fair_lock("held").acquire().await.unwrap();
    assert!(next.fencing_token() > first);
    next.release().await.unwrap();
}

/// `name` held by `client`, and a waiter of another client queued for it (keeping its
/// place for 30 s), whose acquire the returned task runs.
async fn held_with_a_queued_head(
    env: &Env,
    client: &LockClient,
    name: &str,
) -> (LockGuard, JoinHandle<Result<LockGuard, LockError>>) {
    let held = client.fair_lock(name).acquire().await.unwrap();
    let lock = env.client().await.fair_lock(name).queue_timeout(PATIENT);
    let waiter = tokio::spawn({
        let lock = lock.clone();
        async move { lock.acquire().await }
    });
    queued(&lock, 1).await;
    (held, waiter)
}

/// Promise: a guard dropped without `release().await` frees the lock and wakes the head
/// (on Redis through the batched release of dropped guards).
async fn dropped_guard_hands_over_to_the_head(env: Env) {
    let client = env.client().await;
    let (held, waiter) = held_with_a_queued_head(&env, &client, "drop").await;
    let dropped = Instant::now();
    drop(held);
    let guard = finishes(Duration::from_secs(5), "the head is woken", waiter)
        .await
        .unwrap();
    assert!(
        dropped.elapsed() < Duration::from_secs(2),
        "{:?}",
        dropped.elapsed()
    );
    guard.release().await.unwrap();
}

/// Promise: `complete` works on a fair guard as on a plain one (claims of the name get
/// the outcome), and still hands the lock to the head of the queue.
async fn completing_a_fair_hold_stores_the_outcome_and_hands_over(env: Env) {
    let client = env.client().await;
    let (held, waiter) = held_with_a_queued_head(&env, &client, "done").await;
    held.complete(b"42 rows".to_vec(), Duration::from_secs(60))
        .await
        .unwrap();
    let guard = finishes(Duration::from_secs(5), "the head is woken", waiter)
        .await
        .unwrap();
    guard.release().await.unwrap();
    match client.lock("done").try_claim(Duration::ZERO).await.unwrap() {
        Claim::Completed(outcome) => assert_eq!(outcome, b"42 rows"),
        Claim::Acquired(_) => panic!("the outcome was not stored"),
    }
}

// --- Redis only ---------------------------------------------------------------------

/// Promise: a release wakes the head of the queue only: the waiters behind it make no
/// attempt (counted by Redis itself: EVALSHA calls), where a broadcast would make each
/// of them try once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_head_is_woken() {
    const WAITERS: usize = 5;
    let env = Env::redis();
    let server = env.server();
    let owner = env.client().await;
    // Loads the fair scripts, so the counted calls are single EVALSHAs.
    take_and_release("warm-up", owner.fair_lock("warm-up").acquire()).await;
    // Fixed leases: no watchdog renewals in the count.
    let lease = Duration::from_secs(60);
    let held = owner
        .fair_lock("head")
        .lease(lease)
        .acquire()
        .await
        .unwrap();
    let clients = [env.client().await, env.client().await];
    let mut tasks = Vec::new();
    let mut channels = Vec::new();
    for i in 0..WAITERS {
        let client = &clients[i % 2];
        let me = client.holder();
        // Its client's channel: the holder id up to its last ':'.
        let (client_id, _) = me.id().rsplit_once(':').unwrap();
        channels.push(format!("lockwarden:{{head}}:released:{client_id}"));
        let lock = client
            .fair_lock("head")
            .lease(lease)
            .queue_timeout(PATIENT)
            .holder(&me);
        tasks.push(tokio::spawn({
            let lock = lock.clone();
            async move { (i, lock.acquire().await.unwrap()) }
        }));
        queued(&lock, i + 1).await;
    }
    // Every waiter's client subscribed to its channel, and no attempt in flight any more.
    eventually(
        Duration::from_secs(10),
        "every waiter subscribed, no attempt in flight",
        || async {
            let before = server.command_calls("evalsha");
            tokio::time::sleep(Duration::from_millis(200)).await;
            channels.iter().all(|c| server.subscribers(c) == 1)
                && server.command_calls("evalsha") == before
        },
    )
    .await;

    let before = server.command_calls("evalsha");
    held.release().await.unwrap();
    let (first, guard) =
        finishes(Duration::from_secs(5), "the head is woken", tasks.remove(0)).await;
    assert_eq!(first, 0);
    // Give woken non-heads time to show up: each would add one EVALSHA.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let calls = server.command_calls("evalsha") - before;
    assert_eq!(
        calls,
        2,
        "expected the release and the head's attempt only; {} waiters behind it",
        WAITERS - 1
    );
    assert!(tasks.iter().all(|t| !t.is_finished()));
    assert_eq!(owner.fair_lock("head").queued().await.unwrap(), WAITERS - 1);
    guard.release().await.unwrap();
    for task in tasks {
        let (_, guard) = finishes(Duration::from_secs(5), "each waiter gets its turn", task).await;
        guard.release().await.unwrap();
    }
}

/// Promise: a release hands the lock to the head of the queue with its token, so the head
/// holds it without another round trip: Redis is paused (SIGSTOP) right after the release
/// and the head still gets its guard.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_head_holds_a_handed_over_lock_without_asking() {
    let env = Env::redis();
    let server = env.server();
    let owner = env.client().await;
    let waiter = env.client().await;
    let held = owner.fair_lock("handoff").acquire().await.unwrap();
    let lock = waiter.fair_lock("handoff").queue_timeout(PATIENT);
    let mut head = pin!(lock.try_acquire(Duration::from_secs(30)));
    let listening = eventually(
        Duration::from_secs(10),
        "the head queued and listening for its turn",
        || async {
            lock.queued().await.unwrap() == 1
                && server
                    .channels()
                    .iter()
                    .any(|c| c.starts_with("lockwarden:{handoff}:released:"))
        },
    );
    drive_until(&mut head, async {
        listening.await;
    })
    .await;
    let released_token = held.fencing_token();
    held.release().await.unwrap();
    // The notice is on its way before the release's reply; give it time to arrive.
    tokio::time::sleep(Duration::from_millis(100)).await;
    server.pause();
    let guard = tokio::time::timeout(Duration::from_secs(3), head).await;
    server.resume();
    let guard = guard
        .expect("the head holds the lock while Redis is paused")
        .unwrap();
    assert!(guard.fencing_token() > released_token);
    assert!(lock.is_held_by(guard.holder()).await.unwrap());
    assert_eq!(lock.hold_count(guard.holder()).await.unwrap(), 1);
    assert!(!guard.is_lost());
    guard.release().await.unwrap();
    assert!(!lock.is_locked().await.unwrap());
}

/// Promise: a handed-over hold that was lost (its hash deleted under it) and is then
/// released leaves nothing of the fair lock behind, not even the entry that told the
/// handover from a re-entry (it would keep the deadlines key for a whole queue timeout).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_handed_over_hold_leaves_no_key_at_release() {
    let env = Env::redis();
    let server = env.server();
    let owner = env.client().await;
    let waiter = env.client().await;
    let held = owner.fair_lock("handed-lost").acquire().await.unwrap();
    let lock = waiter.fair_lock("handed-lost").queue_timeout(PATIENT);
    let head = wait_in_line(&lock, 1).await;
    held.release().await.unwrap();
    let guard = finishes(Duration::from_secs(5), "the head gets its turn", head)
        .await
        .unwrap();
    // Taken from under it by an operator (a force unlock moves the fencing token on, so
    // the release is told the hold is gone).
    assert!(owner.fair_lock("handed-lost").force_unlock().await.unwrap());
    assert!(guard.release().await.is_err(), "the hold was lost");
    let left: Vec<String> = server
        .keys_matching("lockwarden:{handed-lost}*")
        .into_iter()
        .filter(|key| !key.ends_with(":fence"))
        .collect();
    assert!(left.is_empty(), "left behind: {left:?}");
}

/// Set (to a Redis URL) only in the re-executed child: it makes [`waiter_child`] act as a
/// waiter process.
const WAITER_ENV: &str = "LOCKWARDEN_FAIR_WAITER_URL";
const CHILD_TEST: &str = "waiter_child";
const DEAD_LOCK: &str = "dead-waiter";
const DEAD_QUEUE: &str = "lockwarden:{dead-waiter}:queue";
const DEAD_DEADLINES: &str = "lockwarden:{dead-waiter}:deadlines";
/// The child's queue timeout: how long its place outlives it.
const CHILD_QUEUE_TIMEOUT: Duration = Duration::from_millis(1500);

/// Not a test on its own: the body of the waiter process. Without [`WAITER_ENV`] it
/// returns at once. With it, it prints `WAITING <holder id>` and queues for
/// [`DEAD_LOCK`] with a 1.5 s queue timeout (so it renews its place every 500 ms) until
/// the parent SIGKILLs it (at most 120 s, in case the parent died).
#[test]
fn waiter_child() {
    run_child(WAITER_ENV, |url| async move {
        let client = LockClient::connect(&url).await.unwrap();
        let me = client.holder();
        println!("WAITING {}", me.id());
        let lock = client
            .fair_lock(DEAD_LOCK)
            .queue_timeout(CHILD_QUEUE_TIMEOUT)
            .holder(&me);
        let got = lock.try_acquire(Duration::from_secs(120)).await;
        println!("UNEXPECTED {got:?}");
    });
}

/// Server clock in ms, the clock of the queue deadlines.
fn server_ms(server: &RedisServer) -> u64 {
    let (secs, micros): (u64, u64) = server.query(&["TIME"]).unwrap();
    secs * 1000 + micros / 1000
}

/// A lock held by `owner`, queued for by `first` (this process), a waiter process that
/// was SIGKILLed (its place kept by its last renewal), and `behind` (this process); both
/// live waiters keep their place for 30 s and record when they get the lock.
struct DeadInTheMiddle {
    env: Env,
    _child: TestProcess,
    lock: FairLock,
    child_id: String,
    /// When the dead waiter's place runs out (from its deadline by the server clock).
    dead_until: Instant,
    left: Duration,
    order: Arc<Mutex<Vec<(&'static str, Instant)>>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

async fn dead_in_the_middle() -> (DeadInTheMiddle, LockGuard) {
    let env = Env::redis();
    let owner = env.client().await;
    let waiters = env.client().await;
    let held = owner.fair_lock(DEAD_LOCK).acquire().await.unwrap();
    let lock = waiters.fair_lock(DEAD_LOCK).queue_timeout(PATIENT);
    let order = Arc::new(Mutex::new(Vec::new()));
    let wait = |name: &'static str| {
        let lock = lock.clone();
        let order = order.clone();
        tokio::spawn(async move {
            let guard = lock.try_acquire(Duration::from_secs(20)).await.unwrap();
            order.lock().unwrap().push((name, Instant::now()));
            guard.release().await.unwrap();
        })
    };

    let first = wait("first");
    queued(&lock, 1).await;

    let server = env.server();
    let mut child = TestProcess::spawn(CHILD_TEST, &[(WAITER_ENV, &server.url())]).unwrap();
    let child_id = child.wait_for_line("WAITING ", Duration::from_secs(30));
    queued(&lock, 2).await;
    let second: Option<String> = server.query(&["LINDEX", DEAD_QUEUE, "1"]).unwrap();
    assert_eq!(second.as_deref(), Some(child_id.as_str()));

    let behind = wait("behind");
    queued(&lock, 3).await;
    // Outlive the child's queue timeout: it can only still be queued if it renews.
    tokio::time::sleep(CHILD_QUEUE_TIMEOUT + Duration::from_millis(300)).await;
    let queue: Vec<String> = server.query(&["LRANGE", DEAD_QUEUE, "0", "-1"]).unwrap();
    assert_eq!(queue.len(), 3);
    assert_eq!(
        queue[1], child_id,
        "the live child lost its place: {queue:?}"
    );

    child.kill();
    let asked_at = Instant::now();
    let score: f64 = server
        .query(&["ZSCORE", DEAD_DEADLINES, &child_id])
        .unwrap();
    let left = Duration::from_millis((score as u64).saturating_sub(server_ms(server)));
    assert!(left <= CHILD_QUEUE_TIMEOUT, "{left:?}");
    let setup = DeadInTheMiddle {
        env,
        _child: child,
        lock,
        child_id,
        dead_until: asked_at + left,
        left,
        order,
        tasks: vec![first, behind],
    };
    (setup, held)
}

impl DeadInTheMiddle {
    /// Waits for both live waiters; returns when each got the lock, in turn order.
    async fn turns(self) -> Vec<(&'static str, Instant)> {
        for task in self.tasks {
            finishes(Duration::from_secs(10), "the waiters get their turns", task).await;
        }
        assert_eq!(self.lock.queued().await.unwrap(), 0);
        let order = self.order.lock().unwrap().clone();
        let names: Vec<&str> = order.iter().map(|(n, _)| *n).collect();
        assert_eq!(names, ["first", "behind"]);
        order
    }
}

/// Promise: a waiter whose process died is dropped from the middle of the queue once its
/// queue timeout has passed, while the lock is still held (not only when it reaches the
/// head): the queue goes from [first, dead, behind] to [first, behind]
/// - not before the dead one's deadline (100 ms tolerance for clock granularity), and
/// - no later than 500 ms after it (scheduling slack), although the live waiters keep
///   their places for 30 s: the one behind retries by the deadline of the one in front.
///
/// Then the turns go on in order, at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_waiter_in_the_middle_is_dropped_after_its_timeout() {
    let (setup, held) = dead_in_the_middle().await;
    let server = setup.env.server();
    let limit = setup.dead_until + Duration::from_secs(5);
    let dropped_at = loop {
        if setup.lock.queued().await.unwrap() == 2 {
            break Instant::now();
        }
        assert!(Instant::now() < limit, "the dead waiter was never dropped");
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    println!(
        "dead waiter's place had {:?} left; dropped {:?} after its deadline",
        setup.left,
        dropped_at.saturating_duration_since(setup.dead_until)
    );
    assert!(
        dropped_at + Duration::from_millis(100) >= setup.dead_until,
        "dropped {:?} before its deadline",
        setup.dead_until - dropped_at
    );
    assert!(
        dropped_at <= setup.dead_until + Duration::from_millis(500),
        "dropped {:?} after its deadline",
        dropped_at - setup.dead_until
    );
    let queue: Vec<String> = server.query(&["LRANGE", DEAD_QUEUE, "0", "-1"]).unwrap();
    assert!(!queue.contains(&setup.child_id), "{queue:?}");
    assert!(setup.lock.is_locked().await.unwrap());

    let released = Instant::now();
    held.release().await.unwrap();
    let turns = setup.turns().await;
    assert!(turns[1].1 - released < Duration::from_millis(500));
}

/// Promise: released while a dead waiter stands right behind the head, the lock goes to
/// the head at once, then to the waiter behind the dead one
/// - not before the dead one's deadline (it keeps its place until then; 100 ms
///   tolerance), and
/// - no later than 500 ms after it, so within the dead one's queue timeout (1.5 s) +
///   500 ms of the release, although nobody tells the waiter behind (the release wakes the
///   dead head) and its own place lasts 30 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_waiter_stalls_the_next_for_its_timeout_only() {
    let (setup, held) = dead_in_the_middle().await;
    let released = Instant::now();
    held.release().await.unwrap();
    let (dead_until, left) = (setup.dead_until, setup.left);
    let turns = setup.turns().await;
    let (first_at, behind_at) = (turns[0].1, turns[1].1);
    println!(
        "dead waiter's place had {left:?} left; first took it {:?} after the release, \
         the one behind the dead waiter {:?} after",
        first_at - released,
        behind_at - released
    );
    assert!(
        first_at - released < Duration::from_millis(500),
        "the live head was slow: {:?}",
        first_at - released
    );
    assert!(
        behind_at + Duration::from_millis(100) >= dead_until,
        "the waiter behind overtook the dead one {:?} before its deadline",
        dead_until - behind_at
    );
    assert!(
        behind_at <= dead_until + Duration::from_millis(500),
        "the waiter behind got it {:?} after the dead one's deadline",
        behind_at - dead_until
    );
    assert!(behind_at - released <= CHILD_QUEUE_TIMEOUT + Duration::from_millis(500));
}

/// Promise: a client's fair waiters of one lock share one subscription (its client's
/// channel, each told its turn by name): three waiters of one client subscribe once and
/// ask once each, but for the first, which asks again once subscribed; each then holds
/// on its grant alone, in turn, without asking again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clients_fair_waiters_share_one_subscription() {
    let env = Env::redis();
    let server = env.server();
    let owner = env.client().await;
    let client = env.client().await;
    // Loads the fair scripts, so the counted calls are single EVALSHAs.
    take_and_release("warm-up", owner.fair_lock("warm-up").acquire()).await;
    take_and_release("warm-up", client.fair_lock("warm-up").acquire()).await;
    // A fixed lease: no watchdog renewal among the counted calls.
    let held = owner
        .fair_lock("shared")
        .lease(PATIENT)
        .acquire()
        .await
        .unwrap();
    let (scripts, subscribes) = (
        server.command_calls("evalsha"),
        server.command_calls("subscribe"),
    );
    let lock = client.fair_lock("shared").queue_timeout(PATIENT);
    let mut waiters = Vec::new();
    for n in 1..=3 {
        waiters.push(wait_in_line(&lock, n).await);
        // Its attempts are done once it sleeps on the channel. The first waiter's second
        // attempt is sent once notices are received: the next waiter then finds the
        // channel listened to (registered alone, it may be still subscribing).
        eventually(Duration::from_secs(5), "the waiter sleeps", || async {
            client.stats().waited_channels == 1
                && server.command_calls("evalsha") - scripts > n as u64
        })
        .await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(server.command_calls("subscribe") - subscribes, 1);
    // Three first attempts, the first waiter's second, and the `queued` probes' none.
    assert_eq!(server.command_calls("evalsha") - scripts, 4);

    let scripts = server.command_calls("evalsha");
    held.release().await.unwrap();
    for waiter in waiters {
        let guard = finishes(Duration::from_secs(5), "each waiter's turn", waiter)
            .await
            .unwrap();
        guard.release().await.unwrap();
    }
    // Four releases, each handing the lock on; no waiter asked again.
    assert_eq!(server.command_calls("evalsha") - scripts, 4);
    assert_eq!(server.command_calls("subscribe") - subscribes, 1);
}
