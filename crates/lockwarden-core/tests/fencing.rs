//! Fencing made usable: `FencedValue`, a value only the newest fencing token writes, on
//! both stores; and Kleppmann's scenario end to end with real processes on Redis — a
//! holder checks that it holds the lock, is paused (SIGSTOP) past its lease, another
//! holder takes the lock and writes, the first one resumes and writes: refused.

mod common;

use std::time::Duration;

use common::{connect_with, Env};
use lockwarden_core::{Claim, LockError};
use lockwarden_testkit::{run_child, TestProcess};

conformance!(
    only_the_newest_token_writes_the_value,
    a_paused_holder_is_refused_after_a_newer_holder_wrote,
    a_client_without_fencing_tokens_gives_its_plain_holds_none,
);

/// Promise: a write with a token at least as large as the last writer's is applied (one
/// hold may write again); a smaller one is refused with `StaleToken`, naming both tokens,
/// and leaves the value as it was. Tokens of any kind of lock work alike.
async fn only_the_newest_token_writes_the_value(env: Env) {
    let client = env.client().await;
    let value = client.fenced("inventory");
    assert_eq!(value.read().await.unwrap(), None);

    let first = client.acquire("inventory").await.unwrap();
    let old = first.fencing_token();
    value.write(old, b"10").await.unwrap();
    value.write(old, b"11").await.unwrap(); // the same hold writes again
    first.release().await.unwrap();

    let write = client
        .rw_lock("inventory:rw")
        .write()
        .acquire()
        .await
        .unwrap();
    let new = write.fencing_token();
    assert!(new > old);
    value.write(new, b"12").await.unwrap();
    match value.write(old, b"99").await {
        Err(LockError::StaleToken { key, token, newest }) => {
            assert_eq!((key.as_str(), token, newest), ("inventory", old, new));
        }
        other => panic!("expected a stale token, got {other:?}"),
    }
    assert_eq!(value.read().await.unwrap(), Some((new, b"12".to_vec())));
    assert!(
        client.fenced("").write(new, b"x").await.is_err(),
        "invalid names are refused"
    );
    write.release().await.unwrap();
}

/// Promise (in one process, on the local clock): a holder whose fixed lease ran out while
/// it was stalled is refused once a newer holder has written.
async fn a_paused_holder_is_refused_after_a_newer_holder_wrote(env: Env) {
    let client = env.client().await;
    let value = client.fenced("stalled");
    let stalled = client
        .lock("stalled")
        .lease(Duration::from_millis(50))
        .acquire()
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    // Its lease ran out: taken at once (a lock that never expired would fail here, in
    // seconds, not hang).
    let newer = client
        .lock("stalled")
        .try_acquire(Duration::from_secs(2))
        .await;
    let newer = newer.unwrap_or_else(|e| panic!("the stalled holder's lease ran out, yet {e}"));
    value.write(newer.fencing_token(), b"newer").await.unwrap();
    assert!(matches!(
        value.write(stalled.fencing_token(), b"stale").await,
        Err(LockError::StaleToken { .. })
    ));
    assert_eq!(value.read().await.unwrap().unwrap().1, b"newer");
    newer.release().await.unwrap();
}

/// Promise: a client built without fencing tokens gives its plain holds, their re-entries
/// and its claims token 0, which a fenced write refuses (naming the value) without
/// writing; its locks exclude as any others do, and its fair and read-write holds still
/// get tokens.
async fn a_client_without_fencing_tokens_gives_its_plain_holds_none(env: Env) {
    let client = env.client_with(|b| b.without_fencing_tokens()).await;
    let value = client.fenced("unfenced");
    let guard = client.acquire("unfenced").await.unwrap();
    let again = client
        .lock("unfenced")
        .holder(guard.holder())
        .acquire()
        .await
        .unwrap();
    assert_eq!((guard.fencing_token(), again.fencing_token()), (0, 0));
    assert!(matches!(
        client.try_acquire("unfenced", Duration::ZERO).await,
        Err(LockError::Timeout { .. })
    ));
    match value.write(guard.fencing_token(), b"x").await {
        Err(LockError::NoFencingToken { key }) => assert_eq!(key, "unfenced"),
        other => panic!("expected no fencing token, got {other:?}"),
    }
    assert_eq!(value.read().await.unwrap(), None, "nothing was written");
    again.release().await.unwrap();
    guard.release().await.unwrap();
    assert!(!client.lock("unfenced").is_locked().await.unwrap());

    let Claim::Acquired(claim) = client
        .lock("unfenced:claim")
        .try_claim(Duration::ZERO)
        .await
        .unwrap()
    else {
        panic!("a fresh claim is acquired");
    };
    assert_eq!(claim.fencing_token(), 0);
    claim.release().await.unwrap();
    let fair = client.fair_lock("unfenced:fair").acquire().await.unwrap();
    let read = client
        .rw_lock("unfenced:rw")
        .read()
        .acquire()
        .await
        .unwrap();
    assert!(fair.fencing_token() > 0 && read.fencing_token() > 0);
    fair.release().await.unwrap();
    read.release().await.unwrap();
}

/// Set (to a Redis URL) only in the re-executed child: [`fenced_writer_child`] is then
/// the holder that gets paused.
const WRITER_ENV: &str = "LOCKWARDEN_FENCED_WRITER_URL";
const ROUNDS: usize = 20;
/// The child's fixed lease: it is paused for longer than this.
const LEASE: Duration = Duration::from_millis(200);

/// Not a test on its own: the paused holder of [`a_holder_paused_past_its_lease_never_overwrites`].
/// Each round it takes the lock, checks that it still holds it, says so (and is paused
/// right then by the parent), "works" for 100 ms, then writes with its token without
/// checking again: the moment Kleppmann's article is about.
#[test]
fn fenced_writer_child() {
    run_child(WRITER_ENV, |url| async move {
        let client = connect_with(&url, |b| b).await;
        for round in 0..ROUNDS {
            let name = format!("kleppmann:{round}");
            // A guard whose 200 ms lease ran out on its way back (a stalled machine) is
            // of no use for the round: it is taken again.
            let mut tries = 0;
            let guard = loop {
                let guard = client.lock(&name).lease(LEASE).acquire().await.unwrap();
                if !guard.is_lost() {
                    break guard;
                }
                tries += 1;
                assert!(
                    tries < 50,
                    "round {round}: every lease ran out before its reply"
                );
            };
            println!("CHECKED {round} {}", guard.fencing_token());
            tokio::time::sleep(Duration::from_millis(100)).await;
            let outcome = match client
                .fenced(&name)
                .write(guard.fencing_token(), b"A")
                .await
            {
                Ok(()) => "WROTE",
                Err(LockError::StaleToken { .. }) => "REFUSED",
                Err(e) => panic!("round {round}: {e}"),
            };
            println!("OUTCOME {round} {outcome}");
            drop(guard);
        }
    });
}

/// Promise: over 20 rounds with a real paused process, no stale write lands: every time
/// the paused holder resumes and writes after the newer holder wrote, it is refused, and
/// the value keeps the newer holder's write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_paused_past_its_lease_never_overwrites() {
    let env = Env::redis();
    let client = env.client().await;
    let mut child = TestProcess::spawn(
        "fenced_writer_child",
        &[(WRITER_ENV, env.server().url().as_str())],
    )
    .unwrap();
    let mut refused = 0;
    for round in 0..ROUNDS {
        let checked = child.wait_for_line(&format!("CHECKED {round} "), Duration::from_secs(30));
        child.pause();
        let stale: u64 = checked.parse().unwrap();
        // Past the paused holder's lease, another holder takes the lock and writes.
        tokio::time::sleep(LEASE + Duration::from_millis(50)).await;
        let name = format!("kleppmann:{round}");
        let newer = client
            .lock(&name)
            .try_acquire(Duration::from_secs(2))
            .await
            .unwrap_or_else(|e| panic!("round {round}: the lease ran out, yet {e}"));
        assert!(newer.fencing_token() > stale);
        client
            .fenced(&name)
            .write(newer.fencing_token(), b"B")
            .await
            .unwrap();
        child.resume();
        let outcome = child.wait_for_line(&format!("OUTCOME {round} "), Duration::from_secs(30));
        assert_eq!(
            outcome, "REFUSED",
            "round {round}: the paused holder's write"
        );
        refused += 1;
        let (token, written) = client.fenced(&name).read().await.unwrap().unwrap();
        assert_eq!(
            (token, written.as_slice()),
            (newer.fencing_token(), &b"B"[..])
        );
        newer.release().await.unwrap();
    }
    assert_eq!(refused, ROUNDS, "0 stale writes over {ROUNDS} rounds");
    assert!(child.wait_within(Duration::from_secs(30)).success());
}
