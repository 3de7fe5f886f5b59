//! Promises that only the Redis store can break: connection sharing, wake-one
//! notification, and behaviour under real server faults (pause, restart, killed pub/sub).

mod common;

use std::time::{Duration, Instant};

use common::kinds::{Kind, Opts};
use common::{connect_with, finishes};
use lockwarden_core::{LockClient, LockError};
use lockwarden_testkit::{eventually, RedisServer};

/// How long the waits for subscriptions to appear or go may take.
const SUBSCRIBED: Duration = Duration::from_secs(5);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_waiters_share_one_pubsub_connection() {
    let server = RedisServer::start().unwrap();
    let before = server.clients().len();
    let holder = LockClient::connect(&server.url()).await.unwrap();
    let waiter = LockClient::connect(&server.url()).await.unwrap();
    let mut guards = Vec::new();
    for k in 0..20 {
        guards.push(holder.acquire(format!("shared:{k}")).await.unwrap());
    }
    let mut tasks = Vec::new();
    for i in 0..500 {
        let w = waiter.clone();
        tasks.push(tokio::spawn(async move {
            w.try_acquire(format!("shared:{}", i % 20), Duration::from_secs(20))
                .await
                .map(drop)
        }));
    }
    eventually(SUBSCRIBED, "every waiter subscribed", || async {
        (0..20).all(|k| server.subscribers(&format!("lockwarden:{{shared:{k}}}:released")) == 1)
    })
    .await;
    // Two clients: one command and one pub/sub connection each, however many waiters.
    let clients = server.clients();
    assert_eq!(clients.len(), before + 4, "{clients:?}");
    assert_eq!(clients.iter().filter(|c| c.is_pubsub()).count(), 1);
    assert_eq!(waiter.stats().waited_channels, 20);

    drop(guards);
    for task in tasks {
        task.await.unwrap().expect("every waiter gets its lock");
    }
    eventually(SUBSCRIBED, "subscriptions dropped", || async {
        server.channels().is_empty()
    })
    .await;
    assert_eq!(waiter.stats().waited_channels, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_wakes_one_local_waiter_not_all() {
    let server = RedisServer::start().unwrap();
    let holder = LockClient::connect(&server.url()).await.unwrap();
    let waiter = LockClient::connect(&server.url()).await.unwrap();
    let guard = holder.acquire("herd").await.unwrap();
    let mut tasks = Vec::new();
    for _ in 0..50 {
        let w = waiter.clone();
        tasks.push(tokio::spawn(async move {
            let g = w.try_acquire("herd", Duration::from_secs(30)).await?;
            // Hold until the test has counted, so the next handoff does not blur the count.
            tokio::time::sleep(Duration::from_millis(300)).await;
            g.release().await
        }));
    }
    eventually(SUBSCRIBED, "waiters subscribed", || async {
        server.subscribers("lockwarden:{herd}:released") == 1
    })
    .await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let before = server.script_calls();
    guard.release().await.unwrap();
    tokio::time::sleep(Duration::from_millis(150)).await;
    let calls = server.script_calls() - before;
    // One release plus the woken waiter's acquire; a thundering herd would be ~51.
    assert!(calls <= 4, "{calls} scripts ran for one handoff");
    for task in tasks {
        finishes(Duration::from_secs(40), "the task finishes", task)
            .await
            .unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_recover_when_the_pubsub_connection_is_killed() {
    let server = RedisServer::start().unwrap();
    let holder = LockClient::connect(&server.url()).await.unwrap();
    let waiter = LockClient::connect(&server.url()).await.unwrap();
    let guard = holder.acquire("killed-pubsub").await.unwrap();
    let w = waiter.clone();
    let task = tokio::spawn(async move {
        w.try_acquire("killed-pubsub", Duration::from_secs(10))
            .await
    });
    eventually(SUBSCRIBED, "waiter subscribed", || async {
        server.subscribers("lockwarden:{killed-pubsub}:released") == 1
    })
    .await;
    let killed: i64 = server.query(&["CLIENT", "KILL", "TYPE", "pubsub"]).unwrap();
    assert!(killed >= 1);
    eventually(SUBSCRIBED, "resubscribed", || async {
        server.subscribers("lockwarden:{killed-pubsub}:released") == 1
    })
    .await;
    let released = Instant::now();
    guard.release().await.unwrap();
    let g = task
        .await
        .unwrap()
        .expect("waiter acquires after reconnect");
    assert!(
        released.elapsed() < Duration::from_secs(2),
        "woken by notice, not by the 30 s lease"
    );
    g.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewal_failures_are_retried_then_reported_lost() {
    let server = RedisServer::start().unwrap();
    let lease = Duration::from_millis(600);
    let client = connect_with(&server.url(), |b| {
        b.watchdog_timeout(lease)
            .command_timeout(Duration::from_millis(100))
    })
    .await;
    let guard = client.acquire("paused").await.unwrap();
    server.pause();
    let paused_at = Instant::now();
    tokio::time::timeout(Duration::from_secs(3), guard.lost())
        .await
        .expect("lost once renewals failed for a whole lease");
    let after = paused_at.elapsed();
    server.resume();
    // Not given up before the lease could have run out; not long after it.
    assert!(after >= lease / 2, "gave up after {after:?}");
    assert!(
        after <= lease + Duration::from_millis(700),
        "noticed after {after:?}"
    );
    assert!(matches!(
        guard.release().await,
        Err(LockError::Lost { .. } | LockError::Backend(_))
    ));
    // The client recovers without being rebuilt.
    let g = client
        .try_acquire("after-pause", Duration::from_secs(5))
        .await
        .expect("works again after SIGCONT");
    g.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn try_acquire_on_a_paused_server_ends_within_budget_plus_command_timeout() {
    let server = RedisServer::start().unwrap();
    let timeout = Duration::from_millis(200);
    let client = connect_with(&server.url(), |b| b.command_timeout(timeout)).await;
    let held = client.acquire("held").await.unwrap();
    server.pause();
    let budget = Duration::from_millis(300);
    let started = Instant::now();
    // A fresh acquire and a waiter behind a held lock: both end within the bound.
    let (result, waited) = tokio::join!(
        client.try_acquire("stuck", budget),
        client.try_acquire("held", budget)
    );
    let took = started.elapsed();
    server.resume();
    assert!(matches!(result, Err(LockError::Backend(_))), "{result:?}");
    assert!(
        matches!(
            waited,
            Err(LockError::Backend(_) | LockError::Timeout { .. })
        ),
        "{waited:?}"
    );
    assert!(
        took <= budget + timeout + Duration::from_millis(200),
        "took {took:?}"
    );
    // After SIGCONT the same client works again, and the held lock survived the pause.
    // (A fresh key: the acquire of "stuck" may have run once Redis resumed, after its
    // reply had timed out; the client gives that hold back in the background, which need
    // not have happened by now.)
    let again = client
        .try_acquire("fresh", Duration::from_secs(5))
        .await
        .expect("the client recovers without a restart");
    again.release().await.unwrap();
    assert!(!held.is_lost());
    held.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_reports_loss_and_keeps_tokens_increasing() {
    let mut server = RedisServer::start().unwrap();
    let lease = Duration::from_millis(600);
    let client = connect_with(&server.url(), |b| b.watchdog_timeout(lease)).await;
    let guard = client.acquire("restart").await.unwrap();
    let token_before = guard.fencing_token();

    let other = LockClient::connect(&server.url()).await.unwrap();
    let waiter = {
        let other = other.clone();
        tokio::spawn(async move { other.try_acquire("restart", Duration::from_secs(10)).await })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    server.restart().unwrap(); // all data gone

    tokio::time::timeout(lease * 2, guard.lost())
        .await
        .expect("holder told within a renewal period or two");
    // The watchdog must not have recreated the lock it lost.
    let got = waiter
        .await
        .unwrap()
        .expect("waiter reconnects and acquires");
    assert!(
        got.fencing_token() > token_before,
        "tokens went backwards after restart"
    );
    assert_eq!(client.stats().watched_locks, 0);
    got.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watchdog_never_recreates_a_deleted_lock() {
    let server = RedisServer::start().unwrap();
    let lease = Duration::from_millis(300);
    let client = connect_with(&server.url(), |b| b.watchdog_timeout(lease)).await;
    let guard = client.acquire("deleted").await.unwrap();
    let _: i64 = server.query(&["DEL", "lockwarden:{deleted}"]).unwrap();
    tokio::time::timeout(lease, guard.lost())
        .await
        .expect("lost");
    tokio::time::sleep(lease).await;
    assert!(!server.exists("lockwarden:{deleted}"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn data_layout_is_a_hash_of_holder_to_count() {
    let server = RedisServer::start().unwrap();
    let client = LockClient::connect(&server.url()).await.unwrap();
    let me = client.holder();
    let a = client.lock("layout").holder(&me).acquire().await.unwrap();
    let b = client.lock("layout").holder(&me).acquire().await.unwrap();
    let fields: Vec<(String, String)> = server.query(&["HGETALL", "lockwarden:{layout}"]).unwrap();
    assert_eq!(fields, vec![(me.id().to_owned(), "2".to_owned())]);
    let (uuid, number) = me.id().rsplit_once(':').unwrap();
    assert_eq!(uuid.len(), 36, "random v4 uuid");
    assert!(number.parse::<u64>().is_ok());
    let ttl = server.pttl("lockwarden:{layout}");
    assert!(ttl > 25_000 && ttl <= 30_000, "watchdog lease: {ttl}");
    let token: u64 = server.query(&["GET", "lockwarden:{layout}:fence"]).unwrap();
    assert_eq!(token, a.fencing_token());
    b.release().await.unwrap();
    a.release().await.unwrap();
    assert!(!server.exists("lockwarden:{layout}"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_never_go_back_even_if_the_server_clock_does() {
    // A last token far ahead of the server clock stands for a clock that stepped back
    // since it was issued: the next token must still be above it.
    let server = RedisServer::start().unwrap();
    let client = LockClient::connect(&server.url()).await.unwrap();
    let ahead: u64 = 9_000_000_000_000_000;
    let _: () = server
        .query(&[
            "SET",
            "lockwarden:{clock}:fence",
            &ahead.to_string(),
            "PX",
            "60000",
        ])
        .unwrap();
    let first = client.acquire("clock").await.unwrap();
    assert_eq!(first.fencing_token(), ahead + 1);
    first.release().await.unwrap();
    let second = client.acquire("clock").await.unwrap();
    assert_eq!(second.fencing_token(), ahead + 2);
    let stored: String = server.query(&["GET", "lockwarden:{clock}:fence"]).unwrap();
    assert_eq!(stored, (ahead + 2).to_string());
    second.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_kind_issues_its_tokens_above_a_last_token_ahead_of_the_clock() {
    // One token maker serves every kind (lua/token.lua); each kind hands it its own
    // fencing key and expiry, so each is checked: the first hold after a last token far
    // ahead of the clock gets the next one, and the fencing key then says so.
    let server = RedisServer::start().unwrap();
    let client = LockClient::connect(&server.url()).await.unwrap();
    for (i, kind) in [
        Kind::Plain,
        Kind::Fair,
        Kind::Read,
        Kind::Write,
        Kind::Multi,
    ]
    .into_iter()
    .enumerate()
    {
        let name = format!("ahead:{kind:?}");
        let ahead = 8_000_000_000_000_000 + 1_000 * i as u64;
        let fences: Vec<String> = kind
            .redis_keys(&client, &name)
            .into_iter()
            .map(|key| format!("{key}:fence"))
            .collect();
        for fence in &fences {
            let _: () = server
                .query(&["SET", fence, &ahead.to_string(), "PX", "60000"])
                .unwrap();
        }
        let held = kind
            .acquire(&client, &name, &Opts::default())
            .await
            .unwrap();
        assert_eq!(held.tokens(), vec![ahead + 1; fences.len()], "{kind:?}");
        for fence in &fences {
            let stored: String = server.query(&["GET", fence]).unwrap();
            assert_eq!(stored, (ahead + 1).to_string(), "{kind:?}: {fence}");
            assert!(server.pttl(fence) > 0, "{kind:?}: {fence} never expires");
        }
        held.release().await.unwrap();
    }
}

/// Promise: a lock's first token (its fencing key missing) is above the server's clock
/// when the acquisition began, for every kind that issues tokens (a semaphore's hold, of
/// one permit or several, takes one), and the fencing key it leaves runs out: idempotency
/// keys used once leave nothing for good.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_kinds_first_token_is_above_the_clock_and_its_fencing_key_runs_out() {
    let server = RedisServer::start().unwrap();
    let client = LockClient::connect(&server.url()).await.unwrap();
    let check = |what: &str, before: u64, tokens: &[u64], fences: &[String]| {
        let after = server_micros(&server);
        for &token in tokens {
            assert!(
                token > before && token <= after + 1,
                "{what}: token {token} not above the clock's {before} (read {after} after)"
            );
        }
        for fence in fences {
            let ttl = server.pttl(fence);
            assert!(ttl > 0, "{what}: {fence} never runs out (PTTL {ttl})");
        }
    };
    for kind in [
        Kind::Plain,
        Kind::Fair,
        Kind::Read,
        Kind::Write,
        Kind::Multi,
    ] {
        let name = format!("first:{kind:?}");
        let fences: Vec<String> = kind
            .redis_keys(&client, &name)
            .into_iter()
            .map(|key| format!("{key}:fence"))
            .collect();
        let before = server_micros(&server);
        let held = kind
            .acquire(&client, &name, &Opts::default())
            .await
            .unwrap();
        check(&format!("{kind:?}"), before, &held.tokens(), &fences);
        held.release().await.unwrap();
    }
    for permits in [1, 3] {
        let name = format!("first:permits:{permits}");
        let fence = format!("{}:fence", client.key(&name).unwrap().redis_key());
        let before = server_micros(&server);
        let guard = client
            .semaphore(&name, 5)
            .acquire_many(permits)
            .await
            .unwrap();
        let token = guard.fencing_token();
        check(&name, before, &[token], std::slice::from_ref(&fence));
        // The next hold's token follows the last one the first hold took.
        let next = client.semaphore(&name, 5).acquire().await.unwrap();
        assert_eq!(next.fencing_token(), token + 1, "{name}");
        next.release().await.unwrap();
        guard.release().await.unwrap();
    }
}

/// Promise: a release that grants several waiters of a semaphore at once gives each its
/// own token, all above the clock and every earlier one, even when the fencing key went
/// missing meanwhile (the grant then seeds it from the clock, and it runs out again).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_of_several_waiters_seeds_a_missing_fencing_key() {
    let server = RedisServer::start().unwrap();
    let client = LockClient::connect(&server.url()).await.unwrap();
    let semaphore = client.semaphore("granted", 3);
    let fence = format!("{}:fence", client.key("granted").unwrap().redis_key());
    let all = semaphore.acquire_many(3).await.unwrap();
    let mut waiters = tokio::task::JoinSet::new();
    for _ in 0..3 {
        let semaphore = semaphore.clone();
        waiters.spawn(async move {
            let guard = semaphore.try_acquire(Duration::from_secs(10)).await?;
            let token = guard.fencing_token();
            guard.release().await?;
            Ok::<_, LockError>(token)
        });
    }
    eventually(Duration::from_secs(10), "three waiters in line", || async {
        semaphore
            .state()
            .await
            .unwrap()
            .is_some_and(|s| s.waiting == 3)
    })
    .await;
    let _: i64 = server.query(&["DEL", &fence]).unwrap();
    let before = server_micros(&server);
    all.release().await.unwrap();
    let mut tokens = Vec::new();
    while let Some(token) = waiters.join_next().await {
        tokens.push(token.unwrap().unwrap());
    }
    tokens.sort_unstable();
    assert!(
        tokens[0] > before,
        "{tokens:?} not above the clock's {before}"
    );
    assert_eq!(
        tokens,
        [tokens[0], tokens[0] + 1, tokens[0] + 2],
        "one token each, in a row"
    );
    let last: String = server.query(&["GET", &fence]).unwrap();
    assert_eq!(
        last,
        tokens[2].to_string(),
        "the fencing key keeps the last token"
    );
    assert!(server.pttl(&fence) > 0, "{fence} never runs out");
}

/// The server's clock in µs, as `TIME` tells it.
fn server_micros(server: &RedisServer) -> u64 {
    let time: Vec<String> = server.query(&["TIME"]).unwrap();
    time[0].parse::<u64>().unwrap() * 1_000_000 + time[1].parse::<u64>().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_locks_token_is_the_server_clock_in_microseconds() {
    // Many locks, so their µs cover the small values too (the script writes the token as
    // the seconds and the zero-padded µs).
    let server = RedisServer::start().unwrap();
    let client = LockClient::connect(&server.url()).await.unwrap();
    for i in 0..200 {
        let before = server_micros(&server);
        let guard = client.acquire(format!("clock:{i}")).await.unwrap();
        let after = server_micros(&server);
        let token = guard.fencing_token();
        assert!(
            (before..=after).contains(&token),
            "token {token} outside the server clock's {before}..={after}"
        );
        guard.release().await.unwrap();
    }
}

/// Scripts run (by digest or as functions), `HDEL`s and `PUBLISH`es so far.
fn calls(server: &RedisServer) -> [u64; 3] {
    let [hdel, publish] = ["hdel", "publish"].map(|c| server.command_calls(c));
    [server.script_calls(), hdel, publish]
}

/// Promise: the hold of a holder made for it and never handed out is released without a
/// script (`HDEL` of its field deletes the hash), released or dropped; released, with no
/// notice when nobody waits (a dropped guard's release always sends it), and a waiter of
/// another client, which marks the lock, is woken by the notice at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fresh_holders_release_is_two_commands_and_wakes_a_waiter() {
    let server = RedisServer::start().unwrap();
    let client = LockClient::connect(&server.url()).await.unwrap();
    let other = LockClient::connect(&server.url()).await.unwrap();
    for drop_it in [false, true] {
        let guard = client.acquire("solo").await.unwrap();
        let before = calls(&server);
        match drop_it {
            true => drop(guard),
            false => guard.release().await.unwrap(),
        }
        eventually(SUBSCRIBED, "the lock freed", || async {
            !server.exists("lockwarden:{solo}")
        })
        .await;
        let after = calls(&server);
        assert_eq!(
            [
                after[0] - before[0],
                after[1] - before[1],
                after[2] - before[2]
            ],
            [0, 1, u64::from(drop_it)],
            "scripts, HDEL, PUBLISH per release (dropped: {drop_it})"
        );
    }

    // A waiter (the watchdog's lease is 30 s) is served by the notice.
    let guard = client.acquire("solo").await.unwrap();
    let waiter = tokio::spawn(async move {
        let next = other.try_acquire("solo", Duration::from_secs(20)).await;
        (Instant::now(), next.map(|g| g.fencing_token()))
    });
    eventually(SUBSCRIBED, "the waiter subscribed", || async {
        server.subscribers("lockwarden:{solo}:released") == 1
    })
    .await;
    let token = guard.fencing_token();
    let released = Instant::now();
    guard.release().await.unwrap();
    let (served, next) = waiter.await.unwrap();
    assert!(next.unwrap() > token, "the next holder's token is larger");
    assert!(
        served - released < Duration::from_secs(5),
        "waiter served {:?} after the release",
        served - released
    );
}

/// The fields of a plain lock's hash, read from the server.
fn fields(server: &RedisServer, key: &str) -> Vec<String> {
    let mut fields: Vec<String> = server.query(&["HKEYS", key]).unwrap();
    fields.sort();
    fields
}

/// Promise: only a waiter marks a lock (a single try leaves no mark), the mark goes with
/// the release that finds it, and that release sends the notice: the lock's next hold
/// starts unmarked, and once nobody waits its releases send none again. The client that
/// found a mark sends the notice with its next release of that lock, then stops.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_sends_its_notice_when_a_waiter_marked_the_lock() {
    let server = RedisServer::start().unwrap();
    let client = LockClient::connect(&server.url()).await.unwrap();
    let other = LockClient::connect(&server.url()).await.unwrap();
    let key = "lockwarden:{marked}";
    let publishes = || server.command_calls("publish");

    let guard = client.acquire("marked").await.unwrap();
    let refused = other.try_acquire("marked", Duration::ZERO).await;
    assert!(
        matches!(refused, Err(LockError::Timeout { .. })),
        "{refused:?}"
    );
    assert_eq!(
        fields(&server, key),
        [guard.holder().id()],
        "a single try's mark"
    );

    let waiter = tokio::spawn(async move {
        let next = other.try_acquire("marked", Duration::from_secs(20)).await;
        next.map(|guard| (guard, Instant::now()))
    });
    eventually(SUBSCRIBED, "the waiter's mark", || async {
        fields(&server, key).len() == 3
    })
    .await;
    let mut marked = vec![guard.holder().id().to_owned(), "~w1".into(), "~w2".into()];
    marked.sort();
    assert_eq!(fields(&server, key), marked);
    let before = publishes();
    let released = Instant::now();
    guard.release().await.unwrap();
    let (next, served) = waiter.await.unwrap().unwrap();
    assert!(
        served - released < Duration::from_secs(5),
        "the waiter was served {:?} after the release (the lease is 30 s)",
        served - released
    );
    assert_eq!(publishes() - before, 1, "the marked release's notice");
    assert_eq!(
        fields(&server, key),
        [next.holder().id()],
        "the next hold's mark"
    );
    let before = publishes();
    next.release().await.unwrap();
    assert_eq!(publishes() - before, 0, "nobody waited for the next hold");
    assert!(!server.exists(key));

    // The client that found the mark sends its next release's notice with the delete,
    // and none after that one found no mark.
    for expected in [1, 0] {
        let guard = client.acquire("marked").await.unwrap();
        let before = publishes();
        guard.release().await.unwrap();
        assert_eq!(publishes() - before, expected);
    }
}

/// Promise: a notice wakes one waiter of a client, and the lock's next hold starts
/// unmarked; so a waiter of the same client that slept on is woken by the next release
/// too (its client knows it waits), and one of a third client by the mark it renews when
/// its retry is refused: every waiter is served by a notice, none by its timer (the
/// lease, 30 s, is beyond each one's wait).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_waiter_of_a_marked_lock_is_woken_by_a_notice() {
    let server = RedisServer::start().unwrap();
    let holder = LockClient::connect(&server.url()).await.unwrap();
    let two = LockClient::connect(&server.url()).await.unwrap();
    let three = LockClient::connect(&server.url()).await.unwrap();
    // Two waiters of one client (the second is woken by its own client's release), then
    // waiters of two clients.
    for (name, clients) in [
        ("chain:one", vec![two.clone(), two.clone()]),
        ("chain:two", vec![two.clone(), two.clone(), three.clone()]),
    ] {
        let guard = holder.acquire(name).await.unwrap();
        let waiting = clients.len();
        let subscribed = if waiting == 2 { 1 } else { 2 };
        let mut waiters = Vec::new();
        for client in clients {
            waiters.push(tokio::spawn(async move {
                let guard = client.try_acquire(name, Duration::from_secs(10)).await?;
                tokio::time::sleep(Duration::from_millis(50)).await;
                guard.release().await
            }));
        }
        let key = format!("lockwarden:{{{name}}}");
        let channel = format!("{key}:released");
        eventually(SUBSCRIBED, "every waiter subscribed and marked", || async {
            server.subscribers(&channel) == subscribed && fields(&server, &key).len() == 3
        })
        .await;
        let released = Instant::now();
        guard.release().await.unwrap();
        for waiter in waiters {
            waiter.await.unwrap().unwrap();
        }
        assert!(
            released.elapsed() < Duration::from_secs(5),
            "{waiting} handoffs took {:?}",
            released.elapsed()
        );
        assert!(!server.exists(&key));
    }
}

/// Promise: a multi-lock waiting for a plain lock another client holds marks it too, so
/// that lock's release (no script, nobody of its client waiting) sends the notice that
/// wakes it, long before the holder's 30 s lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_multi_lock_marks_the_lock_it_waits_for() {
    let server = RedisServer::start().unwrap();
    let holder = LockClient::connect(&server.url()).await.unwrap();
    let waiter = LockClient::connect(&server.url()).await.unwrap();
    let guard = holder.acquire("pair:b").await.unwrap();
    let both = tokio::spawn(async move {
        let both = waiter.multi_lock(["pair:a", "pair:b"]);
        both.try_acquire(Duration::from_secs(10)).await
    });
    eventually(SUBSCRIBED, "the multi-lock's mark", || async {
        fields(&server, "lockwarden:{pair:b}").len() == 3
    })
    .await;
    let released = Instant::now();
    guard.release().await.unwrap();
    let both = finishes(Duration::from_secs(5), "the multi-lock", both)
        .await
        .unwrap();
    assert!(released.elapsed() < Duration::from_secs(5));
    both.release().await.unwrap();
}

/// Promise: a holder handed out by its guard may be re-entered anywhere, so its guard's
/// release counts down instead of deleting the hash: another client's re-entry keeps the
/// lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handed_out_holders_release_keeps_a_reentry_of_another_client() {
    let server = RedisServer::start().unwrap();
    let client = LockClient::connect(&server.url()).await.unwrap();
    let other = LockClient::connect(&server.url()).await.unwrap();
    for (hand_out, drop_it) in [("holder", false), ("info", false), ("holder", true)] {
        let guard = client.acquire("shared").await.unwrap();
        let holder = match hand_out {
            "holder" => guard.holder().clone(),
            _ => guard.info().holder,
        };
        let inner = other
            .lock("shared")
            .holder(&holder)
            .acquire()
            .await
            .unwrap();
        assert_eq!(other.lock("shared").hold_count(&holder).await.unwrap(), 2);
        match drop_it {
            true => drop(guard),
            false => guard.release().await.unwrap(),
        }
        eventually(SUBSCRIBED, "the outer hold released", || async {
            other.lock("shared").hold_count(&holder).await.unwrap() < 2
        })
        .await;
        assert_eq!(
            other.lock("shared").hold_count(&holder).await.unwrap(),
            1,
            "a holder handed out by `{hand_out}()` (dropped: {drop_it}): the re-entry still holds"
        );
        inner.release().await.unwrap();
        assert!(!server.exists("lockwarden:{shared}"));
    }
}

/// Promise: a holder handed out by its guard whose every clone is gone by the release
/// (nobody can acquire as it any more) is released without a script, as a fresh one is;
/// while a re-entry's guard keeps a clone, the release counts down instead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handed_out_holder_whose_clones_are_gone_is_released_without_a_script() {
    let server = RedisServer::start().unwrap();
    let client = LockClient::connect(&server.url()).await.unwrap();
    let other = LockClient::connect(&server.url()).await.unwrap();
    let calls = || [server.script_calls(), server.command_calls("hdel")];
    let released = |before: [u64; 2]| {
        let after = calls();
        [after[0] - before[0], after[1] - before[1]]
    };

    // Shown both ways, clones dropped.
    let guard = client.acquire("gone").await.unwrap();
    drop((guard.holder().clone(), guard.info()));
    let before = calls();
    guard.release().await.unwrap();
    assert_eq!(released(before), [0, 1], "scripts, HDEL: clones dropped");

    // Scoped as the current holder, re-entered inside the scope and released there.
    let guard = client.acquire("gone").await.unwrap();
    guard
        .holder()
        .clone()
        .scope(async {
            let inner = client.acquire("gone").await.unwrap();
            assert_eq!(inner.holder(), guard.holder());
            inner.release().await.unwrap();
        })
        .await;
    let before = calls();
    guard.release().await.unwrap();
    assert_eq!(released(before), [0, 1], "scripts, HDEL: after the scope");
    assert!(!server.exists("lockwarden:{gone}"));

    // Re-entered by another client whose guard outlives the clone it was given: that
    // guard keeps one, so the outer release counts down and the re-entry still holds.
    let guard = client.acquire("gone").await.unwrap();
    let holder = guard.holder().clone();
    let inner = other.lock("gone").holder(&holder).acquire().await.unwrap();
    drop(holder);
    let before = calls();
    guard.release().await.unwrap();
    assert_eq!(released(before), [1, 0], "scripts, HDEL: a re-entry alive");
    let holder = inner.holder().clone();
    assert_eq!(other.lock("gone").hold_count(&holder).await.unwrap(), 1);
    inner.release().await.unwrap();
    assert!(!server.exists("lockwarden:{gone}"));
}

/// Promise: a multi-lock's guards share one holder, so the holder handed out by one of
/// them may re-enter another's key; that key's release then counts down too, and the
/// re-entry keeps it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_multi_locks_holder_shown_by_one_guard_keeps_a_reentry_of_another_key() {
    let server = RedisServer::start().unwrap();
    let client = LockClient::connect(&server.url()).await.unwrap();
    let other = LockClient::connect(&server.url()).await.unwrap();
    let set = client
        .multi_lock(["pair:a", "pair:b"])
        .acquire()
        .await
        .unwrap();
    let holder = set.guards()[0].holder().clone();
    let inner = other
        .lock("pair:b")
        .holder(&holder)
        .acquire()
        .await
        .unwrap();
    assert_eq!(other.lock("pair:b").hold_count(&holder).await.unwrap(), 2);
    set.release().await.unwrap();
    assert_eq!(
        other.lock("pair:b").hold_count(&holder).await.unwrap(),
        1,
        "the re-entry of the other key still holds"
    );
    assert!(!server.exists("lockwarden:{pair:a}"));
    inner.release().await.unwrap();
    assert!(!server.exists("lockwarden:{pair:b}"));
}

/// Promise: a release without a script tells, as the script does, a hold whose lock
/// nobody took since (its release ran already: `Ok`) from one another took over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_without_a_script_tells_a_hold_that_ended_from_one_taken_over() {
    let server = RedisServer::start().unwrap();
    let client = LockClient::connect(&server.url()).await.unwrap();
    // Gone with the lock's last token still its own: as if this release had run.
    let guard = client.acquire("ended").await.unwrap();
    let _: i64 = server.query(&["DEL", "lockwarden:{ended}"]).unwrap();
    guard.release().await.unwrap();
    // Freed by an operator, which moves the token on: not this hold's release.
    let guard = client.acquire("ended").await.unwrap();
    assert!(client.lock("ended").force_unlock().await.unwrap());
    assert!(matches!(
        guard.release().await,
        Err(LockError::NotHeld { .. })
    ));
}

/// Promise: a client built without fencing tokens takes a plain lock without reading the
/// server clock or writing the fencing key (Redis counts the calls its scripts make), and
/// a client with tokens that takes the lock after it still gets a token above every token
/// issued for it before; the default client does both per take.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_without_fencing_tokens_reads_no_clock_and_writes_no_fence() {
    const FENCE: &str = "lockwarden:{mixed}:fence";
    let server = RedisServer::start().unwrap();
    let fenced = LockClient::connect(&server.url()).await.unwrap();
    let unfenced = connect_with(&server.url(), |b| b.without_fencing_tokens()).await;
    let calls = || {
        let [time, incrby] = ["time", "incrby"].map(|c| server.command_calls(c));
        [server.script_calls(), time, incrby]
    };
    // Loads the variants of acquire.lua each client sends (a holder made for the take, and
    // the given holder of a re-entry), so the counted calls are single EVALSHAs.
    for client in [&fenced, &unfenced] {
        let guard = client.acquire("warm-up").await.unwrap();
        let handle = client.lock("warm-up");
        let again = handle.holder(guard.holder()).acquire().await.unwrap();
        again.release().await.unwrap();
        guard.release().await.unwrap();
    }

    let before = calls();
    let first = fenced.acquire("mixed").await.unwrap();
    let (after, token) = (calls(), first.fencing_token());
    assert_eq!(
        [0, 1, 2].map(|i| after[i] - before[i]),
        [1, 1, 1],
        "a script (FCALL or EVALSHA), TIME, INCRBY of a take with a token"
    );
    first.release().await.unwrap();
    let stored: String = server.query(&["GET", FENCE]).unwrap();
    assert_eq!(stored, token.to_string());

    let before = calls();
    let guard = unfenced.acquire("mixed").await.unwrap();
    let again = unfenced
        .lock("mixed")
        .holder(guard.holder())
        .acquire()
        .await
        .unwrap();
    let after = calls();
    assert_eq!((guard.fencing_token(), again.fencing_token()), (0, 0));
    assert_eq!(
        [0, 1, 2].map(|i| after[i] - before[i]),
        [2, 0, 0],
        "scripts, TIME, INCRBY of a take and a re-entry without tokens"
    );
    assert!(matches!(
        fenced.try_acquire("mixed", Duration::ZERO).await,
        Err(LockError::Timeout { .. })
    ));
    again.release().await.unwrap();
    guard.release().await.unwrap();
    let stored: String = server.query(&["GET", FENCE]).unwrap();
    assert_eq!(stored, token.to_string(), "the fencing key was left alone");

    let next = fenced.acquire("mixed").await.unwrap();
    assert!(next.fencing_token() > token, "tokens still grow after it");
    next.release().await.unwrap();
}

/// The libraries of lockwarden's functions the server holds (`FUNCTION LIST`).
fn our_libraries(server: &RedisServer) -> Vec<String> {
    let listed: redis::Value = server
        .query(&["FUNCTION", "LIST", "LIBRARYNAME", "lockwarden_*"])
        .unwrap();
    let redis::Value::Array(libraries) = listed else {
        panic!("FUNCTION LIST answered {listed:?}")
    };
    libraries
        .into_iter()
        .filter_map(|library| {
            let redis::Value::Array(fields) = library else {
                return None;
            };
            let at = fields
                .iter()
                .position(|f| matches!(f, redis::Value::BulkString(b) if b == b"library_name"))?;
            match &fields[at + 1] {
                redis::Value::BulkString(name) => Some(String::from_utf8_lossy(name).into_owned()),
                _ => None,
            }
        })
        .collect()
}

/// Promise: where the server has functions (Redis 7, Valkey), the plain take goes as one
/// (`FCALL`, one library per script variant named by its digest) and no `EVALSHA` of it is
/// sent; other scripts go as before. A second client loads nothing new.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_plain_take_goes_as_a_function() {
    let server = RedisServer::start().unwrap();
    let client = LockClient::connect(&server.url()).await.unwrap();
    let loaded = our_libraries(&server);
    assert_eq!(
        loaded.len(),
        1,
        "the take a first attempt sends: {loaded:?}"
    );
    assert!(loaded[0].len() == "lockwarden_".len() + 40, "{loaded:?}");

    let calls = || ["fcall", "evalsha"].map(|c| server.command_calls(c));
    let before = calls();
    let guard = client.acquire("function").await.unwrap();
    let took = calls();
    assert_eq!([took[0] - before[0], took[1] - before[1]], [1, 0]);
    // A re-entry by the given holder is another variant, loaded at its first call.
    let again = client
        .lock("function")
        .holder(guard.holder())
        .acquire()
        .await
        .unwrap();
    assert_eq!(our_libraries(&server).len(), 2);
    again.release().await.unwrap();
    guard.release().await.unwrap();
    // A busy attempt is the same function.
    let holder = client.acquire("function").await.unwrap();
    let before = calls();
    assert!(matches!(
        client.try_acquire("function", Duration::ZERO).await,
        Err(LockError::Timeout { .. })
    ));
    let after = calls();
    assert_eq!([after[0] - before[0], after[1] - before[1]], [1, 0]);
    holder.release().await.unwrap();

    let other = LockClient::connect(&server.url()).await.unwrap();
    other
        .acquire("function")
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    assert_eq!(our_libraries(&server).len(), 2, "nothing loaded twice");
}

/// Promise: a server that lost its functions (`FUNCTION FLUSH`, a restart without
/// persistence) is given them again by the next call that finds one missing, which then
/// runs once: the caller sees nothing of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_lost_its_functions_is_given_them_again() {
    let mut server = RedisServer::start().unwrap();
    let client = LockClient::connect(&server.url()).await.unwrap();
    client
        .acquire("lost")
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    let _: String = server.query(&["FUNCTION", "FLUSH"]).unwrap();
    assert!(our_libraries(&server).is_empty());
    let guard = client.acquire("lost").await.unwrap();
    assert_eq!(our_libraries(&server).len(), 1);
    assert_eq!(guard.fencing_token(), {
        let last: u64 = server.query(&["GET", "lockwarden:{lost}:fence"]).unwrap();
        last
    });
    guard.release().await.unwrap();

    server.restart().unwrap();
    eventually(
        Duration::from_secs(10),
        "the client took the lock again",
        || {
            let client = client.clone();
            async move {
                match client.try_acquire("lost", Duration::ZERO).await {
                    Ok(guard) => guard.release().await.is_ok(),
                    Err(_) => false,
                }
            }
        },
    )
    .await;
    assert_eq!(our_libraries(&server).len(), 1);
}

/// Promise: a server whose functions are switched off (`FUNCTION` and `FCALL` renamed
/// away, as some hosted Redis do) connects as before, and the plain take goes by digest:
/// the permission check counts a command the server does not know as refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_without_function_commands_gets_the_take_by_digest() {
    let server = RedisServer::start_with(&[
        "--rename-command",
        "FUNCTION",
        "",
        "--rename-command",
        "FCALL",
        "",
    ])
    .unwrap();
    let client = LockClient::connect(&server.url()).await.unwrap();
    // The first take loads its script (`NOSCRIPT`, then the call again).
    let guard = client.acquire("no-functions").await.unwrap();
    guard.release().await.unwrap();
    let before = server.command_calls("evalsha");
    let guard = client.acquire("no-functions").await.unwrap();
    assert_eq!(
        server.command_calls("evalsha"),
        before + 1,
        "the take by digest"
    );
    guard.release().await.unwrap();
    assert!(!server.exists("lockwarden:{no-functions}"));
}
