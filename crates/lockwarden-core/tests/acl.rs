//! ACL users: the least privileges lockwarden needs, proved with real restricted users on a
//! real `redis-server` (made by the testkit with `ACL SETUSER <user> reset on >pw
//! <rules>`), and what a user missing one of them gets.
//!
//! The rules tested here are the guide's (`src/guide/connecting.md`), word for word
//! (`the_guide_gives_these_rules`):
//! every lock kind works with exactly them, in the default layout and in Redisson's.
//! Without one command, connecting fails with a `LockError` naming it, before anything is
//! written (`a_missing_command_fails_the_connect_naming_it`). With that check skipped, or
//! outside its key or channel patterns (which the check cannot know), an operation fails
//! naming the refused command, and the server (asked as the default user) shows what is
//! left. A refusal before a script runs (`EVALSHA`, its keys, `SUBSCRIBE`) leaves
//! nothing; a refusal in the middle of a script cannot roll back what the script already
//! wrote, and `a_refusal_inside_a_script_keeps_what_the_script_wrote` pins down what: the
//! reason for the check.

mod common;

use std::time::{Duration, Instant};

use common::kinds::{Kind, Opts};
use common::{finishes, spawn_timed};
use lockwarden_core::{
    BackendError, Claim, KeyLayout, LockClient, LockClientBuilder, LockError, ReleaseNotices,
};
use lockwarden_testkit::{eventually, RedisServer};

/// Every lock kind, in the order the tests try them.
const KINDS: [Kind; 5] = [
    Kind::Plain,
    Kind::Fair,
    Kind::Read,
    Kind::Write,
    Kind::Multi,
];

/// The commands lockwarden sends or its scripts call, every lock kind included; see the
/// guide's "ACL users" section (`src/guide/connecting.md`) for what each one is for.
const COMMANDS: &str = "+evalsha +script|load +subscribe +unsubscribe +publish +time \
+exists +get +incr +incrby +set +del +pexpire +pexpireat +pttl +hget +hmget +hset +hexists +hincrby \
+hdel +llen +lindex +lpop +lpos +lrem +rpush +zadd +zrem +zcard +zcount +zscore +zrange \
+zrangebyscore +zremrangebyscore +zremrangebyrank +copy +type";

/// Keys and channels of the default layout and namespace (`lockwarden:`).
const TAGGED: &str = "~lockwarden:* &lockwarden:*";

/// Keys and channels of the Redisson layout for lock names that start with `invoice:`
/// (the names are the lock hashes; every companion key and channel starts with
/// `redisson_lock__`).
const REDISSON: &str = "~invoice:* ~redisson_lock__* &redisson_lock__*";

/// Added for `wait_for_replicas`.
const WAIT: &str = "+wait";

/// Added on Redis 7 and Valkey for the plain take as a Redis function (`FCALL`), which
/// costs the server less than the same script by digest.
const FUNCTIONS: &str = "+function|load +fcall";

const PASSWORD: &str = "s3cret-pw";

/// A fixed lease long enough that a waiter served well before it was woken by a notice.
const LEASE: Duration = Duration::from_secs(30);
/// How soon a notified waiter must have the lock.
const SERVED: Duration = Duration::from_secs(3);

fn rules(parts: &[&str]) -> Vec<String> {
    parts
        .iter()
        .flat_map(|part| part.split_whitespace())
        .map(str::to_owned)
        .collect()
}

/// Creates `user` with exactly `rules` and returns its URL.
fn user(server: &RedisServer, user: &str, rules: &[String]) -> String {
    let rules: Vec<&str> = rules.iter().map(String::as_str).collect();
    server.acl_user(user, PASSWORD, &rules).unwrap()
}

async fn connect(
    url: &str,
    configure: impl FnOnce(LockClientBuilder) -> LockClientBuilder,
) -> LockClient {
    configure(LockClient::builder())
        .command_timeout(Duration::from_secs(2))
        .connect(url)
        .await
        .unwrap_or_else(|e| panic!("connect as a restricted user: {e}"))
}

/// [`connect`] without the check of the user's commands: to see what an operation does
/// when Redis refuses one of them.
async fn connect_unchecked(
    url: &str,
    configure: impl FnOnce(LockClientBuilder) -> LockClientBuilder,
) -> LockClient {
    connect(url, |b| configure(b.skip_permission_check())).await
}

#[test]
fn the_guide_gives_these_rules() {
    let guide = include_str!("../src/guide/connecting.md");
    for line in [
        format!("ACL SETUSER locks reset on >CHANGE-ME {TAGGED} {COMMANDS}"),
        format!("ACL SETUSER locks reset on >CHANGE-ME {REDISSON} {COMMANDS}"),
        format!("ACL SETUSER locks {WAIT}"),
        format!("ACL SETUSER locks {FUNCTIONS}"),
        format!("ACL SETUSER locks {CLUSTER}"),
        format!("ACL SETUSER locks {SHARDED}"),
    ] {
        assert!(guide.contains(&line), "the guide does not say:\n{line}");
    }
}

/// Everything a lock of `kind` does, by two clients of restricted users: exclusion,
/// re-entry, inspection, a waiter woken by a notice, release; then nothing is held.
async fn exercise(kind: Kind, a: &LockClient, b: &LockClient, name: &str, server: &RedisServer) {
    let me = a.holder();
    let held = kind
        .try_acquire(a, name, &Opts::holder(&me), Duration::ZERO)
        .await
        .unwrap();
    let again = kind
        .try_acquire(a, name, &Opts::holder(&me), Duration::ZERO)
        .await
        .unwrap();
    assert_eq!(
        kind.hold_count(a, name, &me).await,
        2,
        "{kind:?}: re-entered"
    );
    assert!(
        kind.is_locked(b, name).await,
        "{kind:?}: seen by the other user"
    );
    match kind
        .rival()
        .try_acquire(b, name, &Opts::default(), Duration::ZERO)
        .await
    {
        Err(LockError::Timeout { .. }) => {}
        other => panic!("{kind:?}: expected busy, got {other:?}"),
    }
    for key in kind.redis_keys(a, name) {
        assert!(
            server.pttl(&key) > 0,
            "{kind:?}: {key} is on the server with a lease"
        );
    }
    again.release().await.unwrap();

    // A waiter of the other user, woken by the release notice (the locks are kept by the
    // watchdog, whose lease is far longer than the time allowed to serve the waiter).
    let waiting = spawn_timed({
        let (b, name, rival) = (b.clone(), name.to_owned(), kind.rival());
        async move {
            rival
                .try_acquire(&b, &name, &Opts::default(), LEASE - SERVED)
                .await
        }
    });
    let channel = a.key(&kind.parts(name)[0]).unwrap().channel().to_owned();
    eventually(SERVED, "the waiter subscribed", || async {
        match kind {
            Kind::Fair => b.fair_lock(name).queued().await.unwrap() == 1,
            Kind::Read | Kind::Write => !server.channels().is_empty(),
            _ => server.subscribers(&channel) == 1,
        }
    })
    .await;
    let released = Instant::now();
    held.release().await.unwrap();
    let (got, at) = finishes(SERVED * 2, "the woken waiter", waiting).await;
    let took = at.duration_since(released);
    got.unwrap_or_else(|e| panic!("{kind:?}: the waiter failed: {e}"))
        .release()
        .await
        .unwrap();
    assert!(
        took < SERVED,
        "{kind:?}: served {took:?} after the release, not by the notice"
    );
    assert_eq!(kind.queued(a, name).await, 0);
    for key in kind.redis_keys(a, name) {
        assert!(!server.exists(&key), "{kind:?}: {key} is still held");
    }
}

/// The rest of the API: a claim and its stored outcome, the remaining lease, a forced
/// unlock, and the watchdog renewing past three leases.
async fn exercise_the_rest(
    a: &LockClient,
    b: &LockClient,
    renewing: &LockClient,
    server: &RedisServer,
) {
    let Claim::Acquired(guard) = a
        .lock("invoice:claim")
        .try_claim(Duration::ZERO)
        .await
        .unwrap()
    else {
        panic!("a fresh claim is acquired");
    };
    guard
        .complete(b"done".to_vec(), Duration::from_secs(60))
        .await
        .unwrap();
    match b
        .lock("invoice:claim")
        .try_claim(Duration::ZERO)
        .await
        .unwrap()
    {
        Claim::Completed(outcome) => assert_eq!(outcome, b"done"),
        Claim::Acquired(_) => panic!("the outcome was not stored"),
    }

    let guard = a
        .lock("invoice:ttl")
        .lease(LEASE)
        .try_acquire(Duration::ZERO)
        .await
        .unwrap();
    let ttl = b
        .lock("invoice:ttl")
        .remaining_ttl()
        .await
        .unwrap()
        .unwrap();
    assert!(ttl > LEASE - SERVED && ttl <= LEASE, "{ttl:?}");
    assert!(b.lock("invoice:ttl").force_unlock().await.unwrap());
    assert!(!server.exists(guard.key().redis_key()));
    drop(guard);

    let guard = a
        .try_acquire("invoice:fenced", Duration::ZERO)
        .await
        .unwrap();
    let token = guard.fencing_token();
    a.fenced("invoice:fenced")
        .write(token, b"v1")
        .await
        .unwrap();
    assert_eq!(
        b.fenced("invoice:fenced").read().await.unwrap(),
        Some((token, b"v1".to_vec()))
    );
    guard.release().await.unwrap();

    let guard = renewing
        .try_acquire("invoice:renewed", Duration::ZERO)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(600) * 4).await;
    assert!(!guard.is_lost(), "renewed past three leases");
    assert!(server.pttl(guard.key().redis_key()) > 0);
    guard.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_lock_kind_works_with_exactly_the_documented_rules() {
    let server = RedisServer::start().unwrap();
    let url = user(&server, "locks", &rules(&[TAGGED, COMMANDS]));
    let a = connect(&url, |b| b).await;
    let b = connect(&url, |b| b).await;
    for kind in KINDS {
        exercise(kind, &a, &b, &format!("invoice:{kind:?}"), &server).await;
    }
    let renewing = connect(&url, |b| b.watchdog_timeout(Duration::from_millis(600))).await;
    exercise_the_rest(&a, &b, &renewing, &server).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_lock_kind_works_with_the_redisson_rules() {
    let server = RedisServer::start().unwrap();
    let url = user(&server, "locks", &rules(&[REDISSON, COMMANDS]));
    let redisson = |b: LockClientBuilder| b.layout(KeyLayout::Redisson);
    let a = connect(&url, redisson).await;
    let b = connect(&url, redisson).await;
    for kind in KINDS {
        exercise(kind, &a, &b, &format!("invoice:{kind:?}"), &server).await;
    }
    let renewing = connect(&url, |b| {
        b.layout(KeyLayout::Redisson)
            .watchdog_timeout(Duration::from_millis(600))
    })
    .await;
    exercise_the_rest(&a, &b, &renewing, &server).await;
    // A name outside the user's pattern is refused before anything is written.
    let refused = a.try_acquire("order:1", Duration::ZERO).await;
    let text = expect_refused(refused.map(drop), "EVALSHA (of acquire.lua)");
    assert!(refuses_a_key(&text), "{text}");
    assert!(!server.exists("order:1"));
}

/// Promise: with the functions' rules a client loads the plain take as a function and
/// sends it as `FCALL`, and every lock kind works; without them, or with only one of
/// them, it sends the same script by digest, and Redis logged no refusal (the client
/// asked `ACL`, it did not try).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn functions_need_function_load_and_fcall() {
    let server = RedisServer::start().unwrap();
    let url = user(&server, "functions", &rules(&[TAGGED, COMMANDS, FUNCTIONS]));
    let a = connect(&url, |b| b).await;
    let b = connect(&url, |b| b).await;
    let before = server.command_calls("fcall");
    for kind in KINDS {
        exercise(kind, &a, &b, &format!("invoice:fn:{kind:?}"), &server).await;
    }
    assert!(
        server.command_calls("fcall") > before,
        "the take went as FCALL"
    );

    let url = user(&server, "scripts", &rules(&[TAGGED, COMMANDS]));
    let client = connect(&url, |b| b).await;
    let before = server.command_calls("fcall");
    let guard = client.acquire("invoice:scripts").await.unwrap();
    guard.release().await.unwrap();
    assert_eq!(server.command_calls("fcall"), before, "sent by digest");

    for (user_name, half) in [("nofcall", "+function|load"), ("noload", "+fcall")] {
        let url = user(&server, user_name, &rules(&[TAGGED, COMMANDS, half]));
        let client = connect(&url, |b| b).await;
        let before = server.command_calls("fcall");
        let guard = client.acquire("invoice:half").await.unwrap();
        guard.release().await.unwrap();
        assert_eq!(
            server.command_calls("fcall"),
            before,
            "{half}: sent by digest"
        );
    }
    for user_name in ["scripts", "nofcall", "noload"] {
        let logged = refusals_logged(&server, user_name);
        assert!(logged.is_empty(), "{user_name}: {logged:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_for_replicas_needs_wait() {
    let primary = RedisServer::start().unwrap();
    let port = primary.port().to_string();
    let replica = RedisServer::start_with(&["--replicaof", "127.0.0.1", &port]).unwrap();
    eventually(Duration::from_secs(10), "the replica synced", || async {
        let info: String = replica.query(&["INFO", "replication"]).unwrap();
        info.contains("master_link_status:up")
    })
    .await;
    let replicated = |b: LockClientBuilder| b.wait_for_replicas(1, Duration::from_secs(1));

    let with = user(&primary, "locks", &rules(&[TAGGED, COMMANDS, WAIT]));
    let client = connect(&with, replicated).await;
    let guard = client
        .try_acquire("invoice:replicated", Duration::ZERO)
        .await
        .unwrap();
    let key = guard.key().redis_key().to_owned();
    let on_replica: Option<u64> = replica.query(&["HGET", &key, guard.holder().id()]).unwrap();
    assert_eq!(on_replica, Some(1));
    guard.release().await.unwrap();

    // Without +wait connecting fails, naming it. Unchecked, the acquire script runs and
    // then WAIT is refused: the lock it took is released again before the error returns.
    let without = user(&primary, "nowait", &rules(&[TAGGED, COMMANDS]));
    let refused = replicated(LockClient::builder()).connect(&without).await;
    expect_refused(refused.map(drop), "WAIT");
    let client = connect_unchecked(&without, replicated).await;
    let refused = client
        .try_acquire("invoice:unwaited", Duration::from_secs(1))
        .await;
    expect_refused(refused.map(drop), "WAIT");
    let key = client
        .key("invoice:unwaited")
        .unwrap()
        .redis_key()
        .to_owned();
    assert!(
        !primary.exists(&key),
        "the lock taken before the refused WAIT is held"
    );
}

/// Tries each lock kind once on `invoice:1`: each must be refused naming `command`.
/// Returns the refusals' texts.
async fn every_kind_refused(client: &LockClient, command: &str) -> Vec<String> {
    let mut texts = Vec::new();
    for kind in KINDS {
        let wait = Duration::from_millis(500);
        let refused = kind
            .try_acquire(client, "invoice:1", &Opts::default(), wait)
            .await;
        texts.push(expect_refused(refused.map(|held| held.tokens()), command));
    }
    texts
}

/// Whether a refusal's text says a key was outside the user's patterns, in Redis 7.0's
/// words (`... access one of the keys used as arguments`) or in those of Redis 7.2 and
/// later and Valkey (`No permissions to access a key`).
fn refuses_a_key(text: &str) -> bool {
    text.contains("access one of the keys") || text.contains("access a key")
}

/// Asserts that `outcome` is an ACL refusal naming `command`; returns its text.
#[track_caller]
fn expect_refused<T: std::fmt::Debug>(outcome: Result<T, LockError>, command: &str) -> String {
    match outcome {
        Err(LockError::Backend(BackendError::NotPermitted {
            command: refused,
            message,
        })) => {
            let text = LockError::Backend(BackendError::NotPermitted {
                command: refused.clone(),
                message,
            })
            .to_string();
            assert!(
                refused.starts_with(command),
                "refused {refused:?}, expected {command}: {text}"
            );
            assert!(text.contains(command), "{text}");
            text
        }
        other => panic!("expected an ACL refusal of {command}, got {other:?}"),
    }
}

/// Every key under `pattern`, with its PTTL (-1: it never expires), as the default user
/// sees it.
fn left_on(server: &RedisServer, pattern: &str) -> Vec<(String, i64)> {
    server
        .keys_matching(pattern)
        .into_iter()
        .map(|key| {
            let ttl = server.pttl(&key);
            (key, ttl)
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_evalsha_nothing_runs_and_nothing_is_held() {
    let server = RedisServer::start().unwrap();
    let commands = COMMANDS.replace("+evalsha ", "");
    let url = user(&server, "noeval", &rules(&[TAGGED, &commands]));
    let client = connect_unchecked(&url, |b| b).await;
    every_kind_refused(&client, "EVALSHA").await;
    assert!(
        left_on(&server, "*").is_empty(),
        "{:?}",
        left_on(&server, "*")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_outside_the_pattern_are_refused_before_the_script_runs() {
    let server = RedisServer::start().unwrap();
    let url = user(&server, "elsewhere", &rules(&["~app:* &app:*", COMMANDS]));
    // The check at connect cannot use a key of the namespace: it is skipped, not failed.
    let client = connect(&url, |b| b).await;
    for text in every_kind_refused(&client, "EVALSHA").await {
        assert!(refuses_a_key(&text), "{text}");
    }
    // Inspection is refused the same way.
    let refused = client.lock("invoice:1").remaining_ttl().await;
    expect_refused(refused, "PTTL");
    assert!(
        left_on(&server, "*").is_empty(),
        "{:?}",
        left_on(&server, "*")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_publish_a_release_is_refused_and_the_lock_is_gone() {
    let server = RedisServer::start().unwrap();
    let commands = COMMANDS.replace("+publish ", "");
    let url = user(&server, "nopublish", &rules(&[TAGGED, &commands]));
    let client = connect_unchecked(&url, |b| b).await;
    let waiting = connect_unchecked(&url, |b| b).await;
    // A holder made for the hold is released by HDEL, outside a script, and nobody waits:
    // no notice, nothing refused...
    let guard = client
        .try_acquire("invoice:1", Duration::ZERO)
        .await
        .unwrap();
    let key = guard.key().redis_key().to_owned();
    guard.release().await.unwrap();
    assert!(!server.exists(&key), "{key} is held");
    // ...but a waiter of another client marked it: then PUBLISH follows, and is refused.
    let guard = client
        .try_acquire("invoice:1", Duration::ZERO)
        .await
        .unwrap();
    let waiter = tokio::spawn(async move {
        waiting
            .try_acquire("invoice:1", Duration::from_secs(2))
            .await
            .map(drop)
    });
    eventually(Duration::from_secs(5), "the waiter's mark", || async {
        server.query::<i64>(&["HLEN", &key]).unwrap() == 3
    })
    .await;
    let refused = guard.release().await;
    let text = expect_refused(refused, "PUBLISH");
    assert!(!text.contains("release.lua"), "{text}");
    assert!(
        !server.exists(&key) || waiter.is_finished(),
        "{key} is held"
    );
    waiter.abort();
    // ...any other by release.lua.
    let me = client.holder();
    let guard = client
        .lock("invoice:2")
        .holder(&me)
        .acquire()
        .await
        .unwrap();
    let key = guard.key().redis_key().to_owned();
    let refused = guard.release().await;
    let text = expect_refused(refused, "PUBLISH (line");
    assert!(text.contains("release.lua"), "{text}");
    // Either deleted the hash before PUBLISH was refused: the lock is free (but no waiter
    // was told).
    assert!(!server.exists(&key), "{key} is held");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_subscribe_a_waiter_fails_instead_of_waiting_for_the_lease() {
    let server = RedisServer::start().unwrap();
    let commands = COMMANDS.replace("+subscribe ", "");
    let url = user(&server, "nosubscribe", &rules(&[TAGGED, &commands]));
    let holder = connect_unchecked(&url, |b| b).await;
    let waiter = connect_unchecked(&url, |b| b).await;
    let guard = holder
        .lock("invoice:1")
        .lease(LEASE)
        .try_acquire(Duration::ZERO)
        .await
        .unwrap();
    let started = Instant::now();
    let refused = waiter.try_acquire("invoice:1", LEASE - SERVED).await;
    expect_refused(refused.map(drop), "SUBSCRIBE");
    assert!(
        started.elapsed() < SERVED,
        "failed only after {:?}",
        started.elapsed()
    );
    assert_eq!(waiter.stats().waited_channels, 0);
    guard.release().await.unwrap();
    // The fair lock's waiter leaves the queue it joined.
    let guard = holder
        .fair_lock("invoice:2")
        .lease(LEASE)
        .try_acquire(Duration::ZERO)
        .await
        .unwrap();
    let refused = waiter
        .fair_lock("invoice:2")
        .try_acquire(LEASE - SERVED)
        .await;
    expect_refused(refused.map(drop), "SUBSCRIBE");
    assert_eq!(holder.fair_lock("invoice:2").queued().await.unwrap(), 0);
    guard.release().await.unwrap();
    assert!(left_on(&server, "lockwarden:{invoice:*}").is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_password_fails_at_connect() {
    let server = RedisServer::start().unwrap();
    let url = user(&server, "locks", &rules(&[TAGGED, COMMANDS]));
    let wrong = url.replace(PASSWORD, "not-the-password");
    let started = Instant::now();
    let error = LockClient::builder()
        .command_timeout(Duration::from_secs(2))
        .connect(&wrong)
        .await
        .expect_err("a wrong password must not connect");
    let text = error.to_string();
    println!("a wrong password: {text}");
    assert!(matches!(error, LockError::Backend(_)), "{error:?}");
    assert!(
        text.contains("WRONGPASS") || text.to_lowercase().contains("authentication"),
        "{text}"
    );
    assert!(
        !text.contains("not-the-password"),
        "the password is in the error: {text}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
}

/// The `ACL LOG` entries of `user` (as the default user): each refusal's `object` (the
/// command, lower case, `script|load` for a subcommand) and `reason` (`command`, `key`,
/// `channel`). Leaves out `client|setinfo`: redis-rs sends `CLIENT SETINFO` on every new
/// connection and ignores its reply, which Redis 7.2 and later, and Valkey, log as a
/// refusal for a user without `+client|setinfo` (Redis 7.0 has no such subcommand, and
/// no rule may name it there).
fn refusals_logged(server: &RedisServer, user: &str) -> Vec<(String, String)> {
    let entries: Vec<std::collections::HashMap<String, redis::Value>> =
        server.query(&["ACL", "LOG", "1024"]).unwrap();
    let text = |entry: &std::collections::HashMap<String, redis::Value>, field: &str| match entry
        .get(field)
    {
        Some(redis::Value::BulkString(bytes)) => String::from_utf8_lossy(bytes).into_owned(),
        Some(redis::Value::SimpleString(text)) => text.clone(),
        other => panic!("ACL LOG field {field}: {other:?}"),
    };
    entries
        .iter()
        .filter(|entry| text(entry, "username") == user)
        .map(|entry| (text(entry, "object"), text(entry, "reason")))
        .filter(|(object, _)| object != "client|setinfo")
        .collect()
}

/// Every operation of every kind, by `weak` (a user without one command) against locks
/// that `admin` (the default user, at `url`) holds or not; returns every error `weak` got.
async fn every_operation(
    weak: &LockClient,
    renewing: &LockClient,
    admin: &LockClient,
    url: &str,
    tag: &str,
) -> Vec<LockError> {
    let kinds = [
        Kind::Plain,
        Kind::Fair,
        Kind::Read,
        Kind::Write,
        Kind::Multi,
    ];
    let mut tasks = Vec::new();
    for kind in kinds {
        let (weak, admin, renewing) = (weak.clone(), admin.clone(), renewing.clone());
        let name = format!("{tag}:{kind:?}");
        let url = url.to_owned();
        tasks.push(tokio::spawn(async move {
            let mut errors = Vec::new();
            if kind == Kind::Write {
                admitting(&weak, &admin, &url, &format!("{name}:admits"), &mut errors).await;
            }
            let me = weak.holder();
            // Taken free, re-entered, inspected, released. (A name of its own: a refusal
            // may leave this one held.)
            let free = format!("{name}:free");
            match kind
                .try_acquire(&weak, &free, &Opts::holder(&me), Duration::ZERO)
                .await
            {
                Ok(held) => {
                    match kind
                        .try_acquire(&weak, &free, &Opts::holder(&me), Duration::ZERO)
                        .await
                    {
                        Ok(again) => {
                            if let Err(e) = hold_count(kind, &weak, &free, &me).await {
                                errors.push(e);
                            }
                            if let Err(e) = again.release().await {
                                errors.push(e);
                            }
                        }
                        Err(e) => errors.push(e),
                    }
                    if let Err(e) = held.release().await {
                        errors.push(e);
                    }
                }
                Err(e) => errors.push(e),
            }
            // Waited for, and handed over by notice (a fair waiter becomes the head and
            // leaves the queue as it takes the lock).
            let blocker = kind
                .blocker()
                .try_acquire(&admin, &name, &Opts::lease(LEASE), Duration::from_secs(5))
                .await
                .unwrap();
            let waiting = tokio::spawn({
                let (weak, name) = (weak.clone(), name.clone());
                async move {
                    kind.try_acquire(&weak, &name, &Opts::default(), Duration::from_secs(2))
                        .await
                }
            });
            // A second waiter behind it, which gives up (leaves the queue, withdraws a
            // writer's registration).
            tokio::time::sleep(Duration::from_millis(100)).await;
            if let Err(e) = kind
                .try_acquire(&weak, &name, &Opts::default(), Duration::from_millis(100))
                .await
            {
                errors.push(e);
            }
            if kind == Kind::Fair {
                if let Err(e) = weak.fair_lock(&name).queued().await {
                    errors.push(e);
                }
            }
            blocker.release().await.unwrap();
            match waiting.await.unwrap() {
                Ok(held) => {
                    if let Err(e) = held.release().await {
                        errors.push(e);
                    }
                }
                Err(e) => errors.push(e),
            }
            // Renewed by the watchdog (every 100 ms).
            match kind
                .try_acquire(
                    &renewing,
                    &format!("{name}:renewed"),
                    &Opts::default(),
                    Duration::ZERO,
                )
                .await
            {
                Ok(held) => {
                    tokio::time::sleep(Duration::from_millis(250)).await;
                    let _ = held.release().await;
                }
                Err(e) => errors.push(e),
            }
            errors
        }));
    }
    tasks.push(tokio::spawn({
        let (weak, admin, renewing) = (weak.clone(), admin.clone(), renewing.clone());
        let name = format!("{tag}:Permits");
        async move { permits(&weak, &admin, &renewing, &name).await }
    }));
    let mut errors = Vec::new();
    for task in tasks {
        errors.extend(task.await.unwrap());
    }
    // Claims, the remaining lease, a forced unlock.
    let lock = weak.lock(format!("{tag}:claim"));
    match lock.try_claim(Duration::ZERO).await {
        Ok(Claim::Acquired(guard)) => {
            if let Err(e) = guard
                .complete(b"done".to_vec(), Duration::from_secs(60))
                .await
            {
                errors.push(e);
            }
        }
        Ok(Claim::Completed(_)) => {}
        Err(e) => errors.push(e),
    }
    let held = admin
        .lock(format!("{tag}:forced"))
        .lease(LEASE)
        .try_acquire(Duration::from_secs(5))
        .await
        .unwrap();
    if let Err(e) = weak.lock(format!("{tag}:forced")).remaining_ttl().await {
        errors.push(e);
    }
    if let Err(e) = weak.lock(format!("{tag}:forced")).force_unlock().await {
        errors.push(e);
    }
    drop(held);
    // A fenced value, written and read.
    let fenced = weak.fenced(format!("{tag}:fenced"));
    if let Err(e) = fenced.write(1, b"v").await {
        errors.push(e);
    }
    if let Err(e) = fenced.read().await {
        errors.push(e);
    }
    errors
}

/// Everything a semaphore does, by `weak`: permits taken, inspected and released; a
/// waiter in line granted its permit by a release, one that gives up; two waiters granted
/// by one release; a new capacity; a renewal; a forced unlock.
async fn permits(
    weak: &LockClient,
    admin: &LockClient,
    renewing: &LockClient,
    name: &str,
) -> Vec<LockError> {
    let mut errors = Vec::new();
    let mut keep = |result: Result<(), LockError>| {
        if let Err(e) = result {
            errors.push(e);
        }
    };
    let free = weak.semaphore(format!("{name}:free"), 2);
    match free.acquire_many(2).await {
        Ok(held) => {
            keep(free.state().await.map(drop));
            keep(held.release().await);
        }
        Err(e) => keep(Err(e)),
    }
    let blocker = admin
        .semaphore(name, 1)
        .lease(LEASE)
        .try_acquire(Duration::from_secs(5))
        .await
        .unwrap();
    let waiting = tokio::spawn({
        let sem = weak.semaphore(name, 1);
        async move { sem.try_acquire(Duration::from_secs(2)).await }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    keep(
        weak.semaphore(name, 1)
            .try_acquire(Duration::from_millis(100))
            .await
            .map(drop),
    );
    blocker.release().await.unwrap();
    match waiting.await.unwrap() {
        Ok(held) => keep(held.release().await),
        Err(e) => keep(Err(e)),
    }
    // A release that frees two permits grants two waiters at once (their tokens from one
    // INCRBY).
    let pair = weak.semaphore(format!("{name}:pair"), 2);
    match pair.acquire_many(2).await {
        Ok(held) => {
            let waiters: Vec<_> = (0..2)
                .map(|_| {
                    let sem = admin.semaphore(format!("{name}:pair"), 2);
                    tokio::spawn(async move { sem.try_acquire(Duration::from_secs(2)).await })
                })
                .collect();
            tokio::time::sleep(Duration::from_millis(100)).await;
            keep(held.release().await);
            for waiter in waiters {
                if let Ok(granted) = waiter.await.unwrap() {
                    granted.release().await.unwrap();
                }
            }
        }
        Err(e) => keep(Err(e)),
    }
    match renewing
        .semaphore(format!("{name}:renewed"), 1)
        .try_acquire(Duration::ZERO)
        .await
    {
        Ok(held) => {
            tokio::time::sleep(Duration::from_millis(250)).await;
            let _ = held.release().await;
        }
        Err(e) => keep(Err(e)),
    }
    let stuck = admin
        .semaphore(format!("{name}:forced"), 1)
        .acquire()
        .await
        .unwrap();
    keep(
        weak.semaphore(format!("{name}:forced"), 1)
            .set_capacity(2)
            .await
            .map(drop),
    );
    keep(
        weak.semaphore(format!("{name}:forced"), 1)
            .force_unlock()
            .await
            .map(drop),
    );
    drop(stuck);
    errors
}

/// `weak`'s write release that frees the lock admits a reader of `admin` waiting for it.
async fn admitting(
    weak: &LockClient,
    admin: &LockClient,
    url: &str,
    name: &str,
    errors: &mut Vec<LockError>,
) {
    let held = match weak.rw_lock(name).write().try_acquire(Duration::ZERO).await {
        Ok(held) => held,
        Err(e) => return errors.push(e),
    };
    let reader = tokio::spawn({
        let (admin, name) = (admin.clone(), name.to_owned());
        async move {
            admin
                .rw_lock(&name)
                .read()
                .try_acquire(Duration::from_secs(2))
                .await
        }
    });
    // Released only once the reader waits registered.
    let registrations = format!("{}:readers", weak.key(name).unwrap().redis_key());
    let mut conn = redis::Client::open(url).unwrap().get_connection().unwrap();
    let mut registered = false;
    for _ in 0..200 {
        let n: u64 = redis::cmd("ZCARD")
            .arg(&registrations)
            .query(&mut conn)
            .unwrap();
        if n > 0 {
            registered = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(registered, "{registrations}: the reader never registered");
    if let Err(e) = held.release().await {
        errors.push(e);
    }
    // Admitted, taken once the lock is free, or (a release refused before it freed the
    // lock, which then runs out) none: the reader is the default user's.
    if let Ok(read) = reader.await.unwrap() {
        read.release().await.unwrap();
    }
}

/// The number (from 1) of the first line of the script `source` that contains `call`.
fn line_of(source: &str, call: &str) -> usize {
    let at = source.lines().position(|line| line.contains(call));
    at.unwrap_or_else(|| panic!("no line calls {call}")) + 1
}

async fn hold_count(
    kind: Kind,
    client: &LockClient,
    name: &str,
    holder: &lockwarden_core::Holder,
) -> Result<u64, LockError> {
    match kind {
        Kind::Plain => client.lock(name).hold_count(holder).await,
        Kind::Fair => client.fair_lock(name).hold_count(holder).await,
        Kind::Read => client.rw_lock(name).read().hold_count(holder).await,
        Kind::Write => client.rw_lock(name).write().hold_count(holder).await,
        Kind::Multi => client.lock(format!("{name}:a")).hold_count(holder).await,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_command_is_needed_and_its_refusal_names_it() {
    let server = RedisServer::start_with(&["--acllog-max-len", "4096"]).unwrap();
    let admin = LockClient::connect(&server.url()).await.unwrap();
    for command in COMMANDS.split_whitespace() {
        let name = command.trim_start_matches('+');
        let user_name = format!("no-{}", name.replace('|', "-"));
        let others: Vec<&str> = COMMANDS
            .split_whitespace()
            .filter(|c| *c != command)
            .collect();
        let url = user(&server, &user_name, &rules(&[TAGGED, &others.join(" ")]));
        let weak = connect_unchecked(&url, |b| b).await;
        let renewing =
            connect_unchecked(&url, |b| b.watchdog_timeout(Duration::from_millis(300))).await;
        // Scripts loaded by one user are there for all: start from an empty cache, as
        // after a restart, so SCRIPT LOAD is needed.
        let _: () = server.query(&["SCRIPT", "FLUSH"]).unwrap();
        let errors = every_operation(
            &weak,
            &renewing,
            &admin,
            &server.url(),
            &format!("x:{name}"),
        )
        .await;

        // The user needs it: Redis refused it at least once...
        let logged = refusals_logged(&server, &user_name);
        assert!(
            logged
                .iter()
                .any(|(object, reason)| object == name && reason == "command"),
            "without {command}, Redis refused nothing of that name: {logged:?}"
        );
        assert!(
            logged.iter().all(|(object, _)| object == name),
            "without {command}, Redis refused other commands too: {logged:?}"
        );
        // ...and every refusal the caller saw names it.
        let wanted = name.to_ascii_uppercase();
        for error in &errors {
            match error {
                // `EXISTS or HEXISTS (line 10 of multi_acquire.lua)`: a line that calls
                // two commands names both (Redis 7.0 does not say which it refused).
                LockError::Backend(BackendError::NotPermitted {
                    command: refused,
                    message,
                }) => assert!(
                    refused
                        .split(" (")
                        .next()
                        .is_some_and(|named| named.split(" or ").any(|one| one == wanted)),
                    "without {command}: refused {refused} ({message})"
                ),
                LockError::Timeout { .. } | LockError::Lost { .. } | LockError::NotHeld { .. } => {}
                other => panic!("without {command}: {other:?}"),
            }
        }
        // Two refusals reach no caller: without UNSUBSCRIBE a channel stays subscribed
        // after its last waiter left (its notices are dropped; a warning is logged);
        // LREM is used only by a fair waiter leaving the queue when it gives up, which
        // logs the failure and leaves its place to run out at its deadline (5 s).
        if !["+unsubscribe", "+lrem"].contains(&command) {
            assert!(
                errors
                    .iter()
                    .any(|e| matches!(e, LockError::Backend(BackendError::NotPermitted { .. }))),
                "without {command} no operation failed: {errors:?}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_command_fails_the_connect_naming_it() {
    let server = RedisServer::start().unwrap();
    let without = |user_name: &str, missing: &[&str]| {
        let others: Vec<&str> = COMMANDS
            .split_whitespace()
            .filter(|c| !missing.contains(c))
            .collect();
        user(&server, user_name, &rules(&[TAGGED, &others.join(" ")]))
    };
    let refused = |url: String| async move {
        let outcome = LockClient::builder()
            .command_timeout(Duration::from_secs(2))
            .connect(&url)
            .await;
        match outcome {
            Err(LockError::Backend(BackendError::NotPermitted { command, message })) => {
                (command, message)
            }
            other => panic!(
                "expected an ACL refusal at connect, got {:?}",
                other.map(drop)
            ),
        }
    };
    for command in COMMANDS.split_whitespace() {
        let name = command.trim_start_matches('+');
        let url = without(&format!("no-{}", name.replace('|', "-")), &[command]);
        // As after a restart: the check's own script must be loaded too.
        let _: () = server.query(&["SCRIPT", "FLUSH"]).unwrap();
        let (named, message) = refused(url).await;
        assert_eq!(
            named,
            name.to_ascii_uppercase(),
            "without {command}: {message}"
        );
    }
    // With the scripts loaded, a user without SCRIPT LOAD is still told.
    let url = without("no-load-cached", &["+script|load"]);
    assert_eq!(refused(url).await.0, "SCRIPT|LOAD");
    // Every missing command at once.
    let no_expiry = without("no-expiry", &["+pexpire", "+pexpireat"]);
    let (named, message) = refused(no_expiry.clone()).await;
    assert_eq!(named, "PEXPIRE, PEXPIREAT");
    assert!(message.contains("at connect"), "{message}");
    // In Redisson's layout, on its key and channel patterns.
    let commands = COMMANDS.replace("+pexpire ", "");
    let url = user(
        &server,
        "redisson-no-pexpire",
        &rules(&[REDISSON, &commands]),
    );
    let outcome = LockClient::builder()
        .layout(KeyLayout::Redisson)
        .connect(&url)
        .await;
    expect_refused(outcome.map(drop), "PEXPIRE");
    // Nothing was written; unchecked, the same user connects (and would leave locks
    // without expiry, see below).
    assert!(
        left_on(&server, "*").is_empty(),
        "{:?}",
        left_on(&server, "*")
    );
    let unchecked = connect_unchecked(&no_expiry, |b| b).await;
    assert!(unchecked
        .lock("invoice:1")
        .remaining_ttl()
        .await
        .unwrap()
        .is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_inside_a_script_keeps_what_the_script_wrote() {
    // FINDING. A script that fails in the middle does not roll back what it already
    // wrote. These are the refusals that leave a lock held although the caller was told
    // it failed (each one found by `every_command_is_needed_and_its_refusal_names_it`'s
    // operations with one command missing; this test pins the worst ones down).
    let server = RedisServer::start().unwrap();
    let forever = |key: &str| server.pttl(key) == -1;

    // Without PEXPIRE, acquire.lua has written the lock hash (HSET) when PEXPIRE is
    // refused: the lock is held, by nobody who knows it, and never expires.
    let url = user(
        &server,
        "no-pexpire",
        &rules(&[TAGGED, &COMMANDS.replace("+pexpire ", "")]),
    );
    let client = connect_unchecked(&url, |b| b).await;
    let refused = client.try_acquire("invoice:1", Duration::ZERO).await;
    let line = line_of(
        include_str!("../lua/acquire.lua"),
        "redis.call('PEXPIRE', KEYS[1]",
    );
    expect_refused(
        refused.map(drop),
        &format!("PEXPIRE (line {line} of acquire.lua)"),
    );
    let key = client.key("invoice:1").unwrap().redis_key().to_owned();
    assert!(forever(&key), "{key}: {}", server.pttl(&key));
    let fields: Vec<String> = server.query(&["HKEYS", &key]).unwrap();
    assert_eq!(
        fields.len(),
        1,
        "held by the refused caller's holder id: {fields:?}"
    );

    // Without PEXPIREAT (or ZRANGE, ZADD, GET, SET), the read-write scripts have written
    // the hash (and its leases) when the refusal comes: the same, for a read lock.
    let url = user(
        &server,
        "no-pexpireat",
        &rules(&[TAGGED, &COMMANDS.replace("+pexpireat ", "")]),
    );
    let client = connect_unchecked(&url, |b| b).await;
    let refused = client
        .rw_lock("invoice:2")
        .read()
        .try_acquire(Duration::ZERO)
        .await;
    let line = line_of(
        include_str!("../lua/rw_prelude.lua"),
        "redis.call('PEXPIREAT', KEYS[1]",
    );
    expect_refused(
        refused.map(drop),
        &format!("PEXPIREAT (line {line} of rw_prelude.lua)"),
    );
    let key = client.key("invoice:2").unwrap().redis_key().to_owned();
    assert!(forever(&key), "{key}: {}", server.pttl(&key));
    assert!(forever(&format!("{key}:leases")));
    // A writer is refused until someone deletes it.
    let admin = LockClient::connect(&server.url()).await.unwrap();
    match admin
        .rw_lock("invoice:2")
        .write()
        .try_acquire(Duration::ZERO)
        .await
    {
        Err(LockError::Timeout { .. }) => {}
        other => panic!("expected the orphaned read hold to block a writer, got {other:?}"),
    }

    // Without DEL, a release by the script (its holder given) is refused after nothing
    // was written: the lock stays held until its lease runs out (the watchdog stopped
    // renewing it). So without HDEL is one by a holder made for the hold.
    for (command, refusal) in [("del", "DEL (line 28 of release.lua)"), ("hdel", "HDEL")] {
        let url = user(
            &server,
            &format!("no-{command}"),
            &rules(&[TAGGED, &COMMANDS.replace(&format!("+{command} "), "")]),
        );
        let client = connect_unchecked(&url, |b| b).await;
        let lock = match command {
            "del" => client.lock("invoice:3").holder(&client.holder()),
            _ => client.lock("invoice:4"),
        };
        let guard = lock.try_acquire(Duration::ZERO).await.unwrap();
        let key = guard.key().redis_key().to_owned();
        expect_refused(guard.release().await, refusal);
        let ttl = server.pttl(&key);
        assert!(ttl > 0 && ttl <= 30_000, "{key}: {ttl}");
    }
}

/// What a Redis Cluster client needs besides: redis-rs asks a node for the slot map
/// (`CLUSTER SLOTS`) and checks each new node connection with `PING`.
const CLUSTER: &str = "+cluster|slots +ping";

/// With sharded notices (a cluster whose masters all run Redis 7): the sharded notice
/// commands instead of the classic ones.
const SHARDED: &str = "-publish -subscribe -unsubscribe +spublish +ssubscribe +sunsubscribe";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_needs_cluster_slots_and_ping_too() {
    let cluster = lockwarden_testkit::RedisCluster::start(3).unwrap();
    let set = |user: &str, parts: &[&str]| {
        let rules = rules(parts);
        let rules: Vec<&str> = rules.iter().map(String::as_str).collect();
        cluster.acl_user(user, PASSWORD, &rules).unwrap()
    };
    let urls = set("locks", &[TAGGED, COMMANDS, CLUSTER]);
    let connect = || async {
        LockClient::builder()
            .command_timeout(Duration::from_secs(2))
            .notices(ReleaseNotices::Classic)
            .connect_cluster(&urls)
            .await
            .expect("connect to the cluster as a restricted user")
    };
    let (a, b) = (connect().await, connect().await);
    for node in 0..3 {
        let name = (0..10_000)
            .map(|i| format!("invoice:{node}:{i}"))
            .find(|name| cluster.owner(a.key(name).unwrap().redis_key()).unwrap() == node)
            .expect("a name on every master");
        let guard = a
            .lock(&name)
            .lease(LEASE)
            .try_acquire(Duration::ZERO)
            .await
            .unwrap();
        let waiting = spawn_timed({
            let (b, name) = (b.clone(), name.clone());
            async move { b.try_acquire(&name, LEASE - SERVED).await }
        });
        let channel = guard.key().channel().to_owned();
        eventually(SERVED, "the waiter subscribed", || async {
            cluster.nodes()[node].subscribers(&channel) == 1
        })
        .await;
        let released = Instant::now();
        guard.release().await.unwrap();
        let (got, at) = finishes(SERVED * 2, "the woken waiter", waiting).await;
        got.unwrap().release().await.unwrap();
        assert!(
            at.duration_since(released) < SERVED,
            "master {node}: not by the notice"
        );
    }

    // By default, on these Redis 7 masters, the sharded commands replace the classic ones
    // (each master's version is asked with HELLO, which this user may send without a
    // rule), and a waiter is still woken by the release's notice.
    let urls = set("sharded", &[TAGGED, COMMANDS, CLUSTER, SHARDED]);
    let sharded = || async {
        LockClient::builder()
            .command_timeout(Duration::from_secs(2))
            .connect_cluster(&urls)
            .await
            .expect("connect with sharded notices as a restricted user")
    };
    let (a, b) = (sharded().await, sharded().await);
    let guard = a
        .lock("invoice:sharded")
        .lease(LEASE)
        .try_acquire(Duration::ZERO)
        .await
        .unwrap();
    let node = cluster.owner(guard.key().redis_key()).unwrap();
    let waiting = spawn_timed({
        let b = b.clone();
        async move { b.try_acquire("invoice:sharded", LEASE - SERVED).await }
    });
    let channel = guard.key().channel().to_owned();
    eventually(SERVED, "the waiter subscribed (sharded)", || async {
        cluster.nodes()[node].shard_subscribers(&channel) == 1
    })
    .await;
    let released = Instant::now();
    guard.release().await.unwrap();
    let (got, at) = finishes(SERVED * 2, "the woken waiter (sharded)", waiting).await;
    got.unwrap().release().await.unwrap();
    assert!(at.duration_since(released) < SERVED, "not by the notice");
    // Without the sharded commands, connecting by default or with `notices(ReleaseNotices::Sharded)`
    // fails, naming them and the way back to classic notices.
    let urls = set("classic-only", &[TAGGED, COMMANDS, CLUSTER]);
    for builder in [
        LockClient::builder(),
        LockClient::builder().notices(ReleaseNotices::Sharded),
    ] {
        let refused = builder
            .command_timeout(Duration::from_secs(2))
            .connect_cluster(&urls)
            .await
            .expect_err("connected with sharded notices without SPUBLISH");
        let text = refused.to_string();
        assert!(
            text.contains("SPUBLISH") && text.contains("notices(ReleaseNotices::Classic)"),
            "{text}"
        );
    }

    // Without CLUSTER SLOTS the client cannot learn the slot map: connect fails, naming it.
    let urls = set("no-slots", &[TAGGED, COMMANDS, "+ping"]);
    let outcome = LockClient::builder()
        .command_timeout(Duration::from_secs(2))
        .connect_cluster(&urls)
        .await;
    let error = outcome.expect_err("connected without CLUSTER SLOTS");
    assert!(error.to_string().contains("CLUSTER|SLOTS"), "{error}");

    // redis-rs sends PING on every node connection it makes, and checks a kept connection
    // with PING when it refreshes the slot map (making a new one when that fails). The
    // refused PING at connect is not reported, so nothing fails at once without it; the
    // server's ACL LOG shows it was needed.
    let urls = set("no-ping", &[TAGGED, COMMANDS, "+cluster|slots"]);
    let client = LockClient::builder()
        .command_timeout(Duration::from_secs(2))
        .notices(ReleaseNotices::Classic)
        .connect_cluster(&urls)
        .await
        .unwrap();
    let guard = client
        .try_acquire("invoice:ping", Duration::ZERO)
        .await
        .unwrap();
    guard.release().await.unwrap();
    let pinged = cluster.nodes().iter().any(|node| {
        refusals_logged(node, "no-ping")
            .iter()
            .any(|(object, _)| object == "ping")
    });
    assert!(pinged, "no node refused the user's PING");
}
