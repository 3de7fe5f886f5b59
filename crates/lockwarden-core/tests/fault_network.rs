//! A real network between the client and Redis that breaks: the client connects through
//! the testkit's [`FaultProxy`], which adds latency, loses replies, blackholes and resets
//! connections, while rivals and assertions reach the server directly.
//!
//! The promises: a lock survives lost renewal replies and reset connections; a partition
//! longer than the lease is reported lost and never hides the next holder; a waiter still
//! wakes on the release notice after its connections were reset; a short re-entry never
//! cuts the hold even with latency on every command.

mod common;

use std::time::{Duration, Instant};

use common::{connect_with, finishes, listening};
use lockwarden_core::{LockClient, LockError, LockGuard};
use lockwarden_testkit::{eventually, FaultProxy, RedisServer};

/// A short watchdog lease (renewed every 500 ms) so faults outlast it in a test's time.
const LEASE: Duration = Duration::from_millis(1500);
/// Shorter than the lease, so a renewal without a reply times out and is retried.
const COMMAND_TIMEOUT: Duration = Duration::from_millis(300);

fn server_and_proxy() -> (RedisServer, FaultProxy) {
    let server = RedisServer::start().expect("start redis-server");
    let proxy = FaultProxy::start(server.port()).expect("start the proxy");
    (server, proxy)
}

/// A client whose every connection (commands and pub/sub) goes through `proxy`.
/// Returned once its pub/sub connection is up (see `common::listening`).
async fn client_through(server: &RedisServer, proxy: &FaultProxy) -> LockClient {
    client_through_with_lease(server, proxy, LEASE).await
}

/// [`client_through`], renewing its holds for `lease`.
async fn client_through_with_lease(
    server: &RedisServer,
    proxy: &FaultProxy,
    lease: Duration,
) -> LockClient {
    let client = connect_with(&proxy.url(), |b| {
        b.watchdog_timeout(lease).command_timeout(COMMAND_TIMEOUT)
    })
    .await;
    listening(
        &client,
        server,
        &format!("listening-{}", client.holder().id()),
    )
    .await;
    client
}

/// The holders in a plain lock's hash, read directly from the server (without the
/// fields that remember a given holder's last call, see `lua/once.lua`).
fn holders(server: &RedisServer, name: &str) -> Vec<String> {
    let fields: Vec<String> = server
        .query(&["HKEYS", &format!("lockwarden:{{{name}}}")])
        .expect("HKEYS");
    fields.into_iter().filter(|f| !f.ends_with(":op")).collect()
}

/// Holds `count` watchdog locks through `proxy`'s client.
async fn hold_through(client: &LockClient, count: usize) -> Vec<(String, LockGuard)> {
    let mut held = Vec::new();
    for i in 0..count {
        let name = format!("kept-{i}");
        let guard = client.acquire(&name).await.expect("acquire");
        held.push((name, guard));
    }
    held
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replies_lost_for_less_than_a_lease_lose_no_lock() {
    let (server, proxy) = server_and_proxy();
    let client = client_through(&server, &proxy).await;
    let held = hold_through(&client, 8).await;

    // Renewals reach Redis and extend the leases, but their replies are lost for half a
    // lease; then every connection that lost one is reset and the client reconnects.
    let before = server.command_calls("evalsha");
    proxy.drop_replies();
    tokio::time::sleep(LEASE / 2).await;
    assert!(
        server.command_calls("evalsha") > before,
        "renewals reached Redis"
    );
    proxy.heal();

    // For two leases after the heal: still held by their guards, never reported lost.
    let until = Instant::now() + 2 * LEASE;
    while Instant::now() < until {
        for (name, guard) in &held {
            assert!(!guard.is_lost(), "{name} reported lost");
            assert_eq!(holders(&server, name), [guard.holder().id()], "{name}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(proxy.accepted_connections() > 2, "the client reconnected");
    for (name, guard) in held {
        guard.release().await.expect("release");
        assert!(holders(&server, &name).is_empty(), "{name} released");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replies_lost_for_longer_than_a_lease_are_reported_and_leave_nothing_held() {
    let (server, proxy) = server_and_proxy();
    let client = client_through(&server, &proxy).await;
    let held = hold_through(&client, 8).await;

    // The client cannot know its renewals ran: after a lease without a reply it must
    // report every hold lost, although Redis still has them.
    proxy.drop_replies();
    for (name, guard) in &held {
        let lost = guard.lost_signal();
        finishes(2 * LEASE, &format!("{name} reported lost"), {
            tokio::spawn(async move { lost.wait().await })
        })
        .await;
    }
    proxy.heal();
    let healed = Instant::now();

    // Nothing stays behind: no lost guard's release claims success (the first commands
    // after the reset may fail before the connection is made again), and what Redis still
    // held (the last renewals that reached it) runs out within one lease.
    for (name, guard) in held {
        match guard.release().await {
            Err(LockError::Lost { key } | LockError::NotHeld { key }) => assert_eq!(key, name),
            Err(LockError::Backend(_)) => {}
            Ok(()) => panic!("{name}: a lost hold was released as if held"),
            Err(other) => panic!("{name}: unexpected {other:?}"),
        }
    }
    eventually(
        LEASE + Duration::from_millis(500),
        "nothing held",
        || async { server.keys_matching("lockwarden:{kept-*}").is_empty() },
    )
    .await;
    assert!(healed.elapsed() <= LEASE + Duration::from_millis(500));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partition_longer_than_the_lease_is_reported_and_never_hides_the_next_holder() {
    let (server, proxy) = server_and_proxy();
    let cut_off = client_through(&server, &proxy).await;
    let direct = connect_with(&server.url(), |b| b.watchdog_timeout(LEASE)).await;
    let guard = cut_off.acquire("split").await.expect("acquire");

    proxy.blackhole();
    let partitioned = Instant::now();
    // The rival gets the lock once the cut-off holder's lease has run out.
    let taken = direct
        .try_acquire("split", 4 * LEASE)
        .await
        .expect("the rival takes the lock after the lease");
    let taken_at = partitioned.elapsed();
    assert!(
        taken_at >= LEASE - COMMAND_TIMEOUT,
        "taken {taken_at:?} into the partition, before the lease could have run out"
    );
    // The cut-off holder knows it lost the lock without hearing from Redis: its renewals
    // failed for a whole lease.
    finishes(LEASE, "the cut-off guard reports the loss", {
        let lost = guard.lost_signal();
        tokio::spawn(async move { lost.wait().await })
    })
    .await;
    assert!(guard.is_lost());

    proxy.heal();
    // Releasing the lost guard after the partition leaves the new holder's lock alone.
    match guard.release().await {
        Err(LockError::Lost { key } | LockError::NotHeld { key }) => assert_eq!(key, "split"),
        other => panic!("expected the release to report the loss, got {other:?}"),
    }
    assert_eq!(holders(&server, "split"), [taken.holder().id()]);
    assert!(!taken.is_lost());
    taken.release().await.expect("release");
    assert!(holders(&server, "split").is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_whose_connections_were_reset_still_wakes_on_the_release() {
    let (server, proxy) = server_and_proxy();
    let waiter_client = client_through(&server, &proxy).await;
    // The holder's lease is long: a waiter that missed the notice would wait for it.
    let holder_client = connect_with(&server.url(), |b| b).await;
    let held = holder_client.acquire("wake").await.expect("acquire");

    let waiter = tokio::spawn(async move {
        let guard = waiter_client
            .try_acquire("wake", Duration::from_secs(20))
            .await;
        (guard, Instant::now(), waiter_client)
    });
    let channel = "lockwarden:{wake}:released";
    eventually(Duration::from_secs(5), "the waiter subscribed", || async {
        server.subscribers(channel) == 1
    })
    .await;
    let before = proxy.accepted_connections();
    proxy.reset();
    eventually(
        Duration::from_secs(5),
        "the waiter subscribed again",
        || async { proxy.accepted_connections() > before && server.subscribers(channel) == 1 },
    )
    .await;

    let released = Instant::now();
    held.release().await.expect("release");
    let (guard, woken, _client) = finishes(Duration::from_secs(10), "the waiter", waiter).await;
    let guard = guard.expect("the waiter takes the released lock");
    let after = woken - released;
    // Far below the holder's 30 s lease: woken by the notice, not by the lease running out.
    assert!(
        after < Duration::from_secs(3),
        "took the lock {after:?} after the release"
    );
    assert_eq!(holders(&server, "wake"), [guard.holder().id()]);
    guard.release().await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_reentry_with_latency_on_every_command_keeps_the_outer_hold() {
    let (server, proxy) = server_and_proxy();
    let client = client_through(&server, &proxy).await;
    let rival = connect_with(&server.url(), |b| b).await;
    proxy.set_latency(Duration::from_millis(40));

    let me = client.holder();
    let outer = client
        .lock("kept")
        .holder(&me)
        .acquire()
        .await
        .expect("outer");
    let inner = client
        .lock("kept")
        .holder(&me)
        .lease(Duration::from_millis(300))
        .acquire()
        .await
        .expect("re-enter");
    inner.release().await.expect("inner release");

    // Well past the inner lease: the outer watchdog hold is still the lock's holder.
    tokio::time::sleep(LEASE).await;
    assert!(!outer.is_lost());
    assert_eq!(holders(&server, "kept"), [me.id()]);
    assert!(
        matches!(
            rival.try_acquire("kept", Duration::ZERO).await,
            Err(LockError::Timeout { .. })
        ),
        "a rival is refused while the outer hold lasts"
    );
    outer.release().await.expect("outer release");
    assert!(holders(&server, "kept").is_empty());
}

/// A client through `proxy` with a long lease: a lock left by a lost reply would stay
/// that long, so freeing it sooner is the repair at work.
async fn client_with_long_lease(server: &RedisServer, proxy: &FaultProxy) -> LockClient {
    let client = client_through_with_lease(server, proxy, Duration::from_secs(30)).await;
    // Load every kind's scripts first, so the lost reply is the acquire's own. A given
    // holder's release is `release.lua` (a fresh one's needs no script).
    let warm = "warm-up";
    client
        .lock(warm)
        .holder(&client.holder())
        .acquire()
        .await
        .expect("plain")
        .release()
        .await
        .expect("release");
    let fair = client.fair_lock(warm).acquire().await.expect("fair");
    fair.release().await.expect("release");
    let read = client.rw_lock(warm).read().acquire().await.expect("read");
    read.release().await.expect("release");
    let write = client.rw_lock(warm).write().acquire().await.expect("write");
    write.release().await.expect("release");
    let multi = client.multi_lock([warm]).acquire().await.expect("multi");
    multi.release().await.expect("release");
    client
}

/// `name` taken as a lock of `kind`: plain, fair, read or write.
async fn acquire_kind(client: &LockClient, kind: &str, name: &str) -> LockGuard {
    match kind {
        "plain" => client.acquire(name).await,
        "fair" => client.fair_lock(name).acquire().await,
        "read" => client.rw_lock(name).read().acquire().await,
        _ => client.rw_lock(name).write().acquire().await,
    }
    .expect("acquire")
}

/// The hash and queue of every lock kind's key `name`, read directly.
fn left_on_server(server: &RedisServer, name: &str) -> Vec<String> {
    server
        .keys_matching(&format!("lockwarden:{{{name}}}*"))
        .into_iter()
        .filter(|key| !key.ends_with(":fence"))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquire_whose_reply_is_lost_is_given_back_once_redis_is_reachable() {
    let (server, proxy) = server_and_proxy();
    let client = client_with_long_lease(&server, &proxy).await;
    let rival = connect_with(&server.url(), |b| b).await;
    for kind in ["plain", "fair", "read", "write", "multi"] {
        let name = format!("lost-{kind}");
        let (open, accepted) = (proxy.open_connections(), proxy.accepted_connections());
        proxy.drop_replies();
        // The script runs (the lock is taken in Redis); its reply never comes back.
        let attempt = match kind {
            "plain" => client.try_acquire(&name, Duration::ZERO).await.map(drop),
            "fair" => client
                .fair_lock(&name)
                .try_acquire(Duration::ZERO)
                .await
                .map(drop),
            "read" => client
                .rw_lock(&name)
                .read()
                .try_acquire(Duration::ZERO)
                .await
                .map(drop),
            "write" => client
                .rw_lock(&name)
                .write()
                .try_acquire(Duration::ZERO)
                .await
                .map(drop),
            _ => client
                .multi_lock([name.as_str(), "lost-multi-2"])
                .try_acquire(Duration::ZERO)
                .await
                .map(drop),
        };
        assert!(
            matches!(attempt, Err(LockError::Backend(_))),
            "{kind}: the caller is told the acquire failed: {attempt:?}"
        );
        // The script ran: it took the lock and issued a fencing token (what it took may
        // be given back already, the settling release passes the proxy too).
        let fence = format!("lockwarden:{{{name}}}:fence");
        let token: String = server
            .query(&["GET", &fence])
            .expect("the acquire ran in Redis");
        proxy.heal();
        let healed = Instant::now();
        // Nothing is left within a second of the heal (not after the 30 s lease).
        eventually(
            Duration::from_secs(1),
            format!("{kind}: nothing left"),
            || async { left_on_server(&server, &name).is_empty() },
        )
        .await;
        let free = healed.elapsed();
        // The proxy resets the connection that lost the reply on its own time after the
        // heal. Wait for that and reconnect: were the next kind's replies dropped first,
        // the new connection's set-up would never finish and that kind's acquire would
        // never reach Redis (seen once under load).
        eventually(
            Duration::from_secs(5),
            format!("{kind}: the connection that lost the reply is reset"),
            || async { proxy.open_connections() < open || proxy.accepted_connections() > accepted },
        )
        .await;
        client
            .lock(format!("ready-{kind}"))
            .try_acquire(Duration::from_secs(10))
            .await
            .expect("the client reconnects once healed")
            .release()
            .await
            .expect("release");
        // The caller was told the acquire failed: it is not sent again on the new
        // connection (that would take the lock once more, for nobody, and make the rival
        // wait until it was given back). Its token is still the last one issued.
        let last: String = server.query(&["GET", &fence]).expect("GET the fence");
        assert_eq!(last, token, "{kind}: the abandoned acquire was sent again");
        let taken = rival.try_acquire(&name, Duration::ZERO).await;
        assert!(
            taken.is_ok(),
            "{kind}: a rival takes it {free:?} after the heal: {taken:?}"
        );
        taken.unwrap().release().await.expect("release");
        assert!(left_on_server(&server, "lost-multi-2").is_empty(), "{kind}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_after_a_lost_reply_holds_the_lock_once() {
    let (server, proxy) = server_and_proxy();
    let client = client_with_long_lease(&server, &proxy).await;
    proxy.drop_replies();
    let waiting = tokio::spawn(async move {
        let guard = client.try_acquire("retried", Duration::from_secs(10)).await;
        (guard, client)
    });
    // Let the first attempt run in Redis and time out, then let the retries through.
    tokio::time::sleep(2 * COMMAND_TIMEOUT).await;
    proxy.heal();
    let (guard, _client) = finishes(Duration::from_secs(10), "the retried acquire", waiting).await;
    let guard = guard.expect("the retry takes the lock");
    // One holder with one count: the guard's; the lost attempt's holder was given back.
    eventually(Duration::from_secs(1), "only the guard's hold", || async {
        let hash: Vec<String> = server
            .query(&["HGETALL", "lockwarden:{retried}"])
            .expect("HGETALL");
        hash == [guard.holder().id().to_owned(), "1".to_owned()]
    })
    .await;
    guard.release().await.expect("release");
    assert!(
        holders(&server, "retried").is_empty(),
        "released in one release"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_given_holder_is_not_settled_because_it_may_hold_the_lock_already() {
    let (server, proxy) = server_and_proxy();
    let client = client_with_long_lease(&server, &proxy).await;
    let me = client.holder();
    let outer = client
        .lock("given")
        .holder(&me)
        .acquire()
        .await
        .expect("outer");
    proxy.drop_replies();
    let inner = client
        .lock("given")
        .holder(&me)
        .try_acquire(Duration::ZERO)
        .await;
    assert!(matches!(inner, Err(LockError::Backend(_))), "{inner:?}");
    proxy.heal();
    // Releasing `me` to undo the lost re-entry could as well end the outer hold: nothing
    // is undone, the outer hold stays (the lost count runs out with the lease).
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(holders(&server, "given"), [me.id()]);
    assert!(!outer.is_lost());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_that_got_no_answer_is_sent_again_once_redis_is_reachable() {
    let (server, proxy) = server_and_proxy();
    let client = client_with_long_lease(&server, &proxy).await;
    let rival = connect_with(&server.url(), |b| b).await;
    for kind in ["plain", "fair", "read", "write"] {
        let name = format!("unreleased-{kind}");
        let guard = acquire_kind(&client, kind, &name).await;
        // Held back, then thrown away with its connection: the release never ran, so
        // only sending it again can free the lock.
        proxy.blackhole();
        let released = guard.release().await;
        assert!(
            matches!(released, Err(LockError::Backend(_))),
            "{kind}: the caller is told the release failed: {released:?}"
        );
        proxy.reset();
        assert!(
            !left_on_server(&server, &name).is_empty(),
            "{kind}: still held"
        );
        proxy.heal();
        let healed = Instant::now();
        eventually(
            Duration::from_secs(1),
            format!("{kind}: released"),
            || async { left_on_server(&server, &name).is_empty() },
        )
        .await;
        let taken = rival.try_acquire(&name, Duration::ZERO).await;
        let free = healed.elapsed();
        assert!(
            taken.is_ok(),
            "{kind}: a rival takes it {free:?} after the heal"
        );
        taken.unwrap().release().await.expect("release");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_guards_release_that_got_no_answer_is_sent_again() {
    let (server, proxy) = server_and_proxy();
    let client = client_with_long_lease(&server, &proxy).await;
    for kind in ["plain", "fair", "read", "write"] {
        let name = format!("dropped-{kind}");
        let guard = acquire_kind(&client, kind, &name).await;
        // Its background release is held back until it times out, then thrown away with
        // its connection: only sending it again can free the lock.
        proxy.blackhole();
        drop(guard);
        tokio::time::sleep(COMMAND_TIMEOUT * 2).await;
        proxy.reset();
        assert!(
            !left_on_server(&server, &name).is_empty(),
            "{kind}: still held"
        );
        proxy.heal();
        eventually(
            Duration::from_secs(1),
            format!("{kind}: released within a second of the heal"),
            || async { left_on_server(&server, &name).is_empty() },
        )
        .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_release_of_a_reentry_is_not_sent_again() {
    let (server, proxy) = server_and_proxy();
    let client = client_with_long_lease(&server, &proxy).await;
    let outer = client.acquire("twice").await.expect("outer");
    let me = outer.holder().clone();
    let inner = client
        .lock("twice")
        .holder(&me)
        .acquire()
        .await
        .expect("inner");
    // The inner release runs in Redis (count 2 -> 1); only its reply is lost.
    proxy.drop_replies();
    assert!(matches!(inner.release().await, Err(LockError::Backend(_))));
    proxy.heal();
    // Sent again, it would end the outer hold too.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let count: Option<String> = server
        .query(&["HGET", "lockwarden:{twice}", me.id()])
        .expect("HGET");
    assert_eq!(count.as_deref(), Some("1"), "the outer hold is kept");
    assert!(!outer.is_lost());
    // The first command after the reset may fail; the outer release, the last guard of
    // a holder made for it, is then sent again: freed either way.
    let released = outer.release().await;
    assert!(
        matches!(released, Ok(()) | Err(LockError::Backend(_))),
        "{released:?}"
    );
    eventually(Duration::from_secs(1), "released", || async {
        holders(&server, "twice").is_empty()
    })
    .await;
}
