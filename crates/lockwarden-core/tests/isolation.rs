//! Isolation between holders and clients: holder ids cannot be guessed or forged, and no
//! public operation releases or renews another holder's lock (but the documented admin
//! action). The HTTP side of isolation (scoped keys of different principals never
//! contend, user input never addresses a key outside the layer's namespace) is in the
//! root package's `tests/isolation.rs`.

mod common;

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use common::Env;
use lockwarden_core::{Holder, LockClient, LockError};

conformance!(
    a_guard_cannot_release_or_renew_a_lock_taken_over_by_another,
    holders_of_one_client_exclude_each_other,
);

// ---------------------------------------------------------------------------------------
// Holder ids
// ---------------------------------------------------------------------------------------

/// Splits a holder id `<client uuid>:<n>` and checks the uuid is lower-case, hyphenated,
/// version 4, RFC 4122 variant; returns its 128 bits.
fn client_uuid_bits(holder: &Holder) -> u128 {
    let id = holder.id();
    let (uuid, number) = id
        .rsplit_once(':')
        .unwrap_or_else(|| panic!("holder id {id:?} is not <uuid>:<n>"));
    assert!(number.parse::<u64>().is_ok(), "holder number in {id:?}");
    let groups: Vec<&str> = uuid.split('-').collect();
    assert_eq!(
        groups.iter().map(|g| g.len()).collect::<Vec<_>>(),
        [8, 4, 4, 4, 12],
        "uuid shape of {id:?}"
    );
    assert!(
        uuid.chars()
            .all(|c| c == '-' || c.is_ascii_digit() || ('a'..='f').contains(&c)),
        "lower-case hex in {id:?}"
    );
    let bits = u128::from_str_radix(&uuid.replace('-', ""), 16).expect("hex");
    assert_eq!((bits >> 76) & 0xf, 4, "version 4 in {id:?}");
    assert_eq!((bits >> 62) & 0b11, 0b10, "RFC 4122 variant in {id:?}");
    bits
}

/// Holder ids carry a random 128-bit (v4, 122 random bits) client id: across 2000
/// clients all are distinct, well-formed, and every random bit is set in 35–65 % of them
/// (a counter, clock or fixed seed would fail this).
#[test]
fn holder_ids_carry_a_random_v4_uuid() {
    const CLIENTS: usize = 2000;
    let mut seen = HashSet::new();
    let mut ones = [0usize; 128];
    for _ in 0..CLIENTS {
        let client = LockClient::in_memory();
        let bits = client_uuid_bits(&client.holder());
        assert!(seen.insert(bits), "two clients share a uuid");
        for (bit, count) in ones.iter_mut().enumerate() {
            *count += usize::from(bits >> bit & 1 == 1);
        }
    }
    let fixed = |bit: usize| (76..80).contains(&bit) || (62..64).contains(&bit);
    for (bit, &count) in ones.iter().enumerate().filter(|(bit, _)| !fixed(*bit)) {
        assert!(
            (CLIENTS * 35 / 100..=CLIENTS * 65 / 100).contains(&count),
            "bit {bit} set in {count} of {CLIENTS} uuids"
        );
    }
    // Holders of one client share its uuid and differ by number: distinct identities.
    let client = LockClient::in_memory();
    let holders: Vec<Holder> = (0..100).map(|_| client.holder()).collect();
    let uuids: HashSet<u128> = holders.iter().map(client_uuid_bits).collect();
    assert_eq!(uuids.len(), 1);
    assert_eq!(
        holders.iter().map(Holder::id).collect::<HashSet<_>>().len(),
        100
    );
}

/// Fails to compile if `$ty` implements `$bound` (a static check that an API does not
/// exist): with the impl, `check` would come from two impls and be ambiguous.
macro_rules! assert_not_impl {
    ($ty:ty: $($bound:tt)+) => {{
        trait AmbiguousIfImpl<M> {
            fn check() {}
        }
        impl<T: ?Sized> AmbiguousIfImpl<()> for T {}
        struct Marker;
        impl<T: ?Sized + $($bound)+> AmbiguousIfImpl<Marker> for T {}
        let _ = <$ty as AmbiguousIfImpl<_>>::check;
    }};
}

/// A `Holder` cannot be made from its id: no `FromStr`, `From<String>`, `From<&str>`,
/// `From<Arc<str>>` or `Default` (checked at compile time). Knowing another holder's id
/// (e.g. from Redis or a log) gives no way to act as it; only `LockClient::holder`,
/// `Holder::current`, a guard or a `LockInfo` hand out `Holder` values.
#[test]
fn a_holder_cannot_be_forged_from_its_id() {
    assert_not_impl!(Holder: std::str::FromStr);
    assert_not_impl!(Holder: From<String>);
    assert_not_impl!(Holder: for<'a> From<&'a str>);
    assert_not_impl!(Holder: From<Arc<str>>);
    assert_not_impl!(Holder: Default);
}

/// `force_unlock` (the one operation that frees a lock for any holder) is documented as
/// an operator's action that breaks mutual exclusion for the current holder, on every
/// handle that has it (rustdoc) and in the operating guide.
#[test]
fn force_unlock_is_documented_as_an_operators_action() {
    let sources = [
        (
            "inspect.rs (Lock, FairLock)",
            include_str!("../src/inspect.rs"),
        ),
        ("rw.rs (RwLock)", include_str!("../src/rw.rs")),
        ("multi.rs (MultiLock)", include_str!("../src/multi.rs")),
    ];
    for (file, source) in sources {
        let at = source
            .find("pub async fn force_unlock")
            .unwrap_or_else(|| panic!("{file}: force_unlock exists"));
        let doc: String = source[..at]
            .lines()
            .rev()
            .skip(1) // the indentation before `pub async fn`
            .take_while(|line| {
                let line = line.trim_start();
                line.starts_with("///") || line.starts_with("#[doc")
            })
            .collect::<Vec<_>>()
            .join("\n");
        let whole = match file {
            // The multi-lock's doc points to the plain one's.
            "multi.rs (MultiLock)" => format!("{doc}\n{}", sources[0].1),
            _ => doc.clone(),
        };
        assert!(
            whole.contains("operator's action") && whole.contains("whoever hold"),
            "{file}: force_unlock's rustdoc does not call it an operator's action that \
             ignores the holder:\n{doc}"
        );
    }
    let guide = include_str!("../src/guide/operating.md");
    assert!(
        guide.contains("**breaks\nmutual exclusion for the current holder**"),
        "the operating guide does not warn that force-unlock breaks mutual exclusion"
    );
}

// ---------------------------------------------------------------------------------------
// Release and renewal only by the holder
// ---------------------------------------------------------------------------------------

/// A guard acts for its own holder only. Client A's lock is taken over by client B (after
/// the admin `force_unlock`): A's watchdog does not renew B's lock (B's fixed lease keeps
/// running down, not reset to A's short watchdog lease), A's guard reports the loss,
/// `release()` answers `Lost` and leaves B's hold intact, and dropping another such guard
/// does not free B's lock either.
async fn a_guard_cannot_release_or_renew_a_lock_taken_over_by_another(env: Env) {
    let a = env
        .client_with(|b| b.watchdog_timeout(Duration::from_millis(600)))
        .await;
    let b = if env.is_redis() {
        env.client().await
    } else {
        a.clone()
    };
    for name in ["taken-over-release", "taken-over-drop"] {
        let guard_a = a.acquire(name).await.expect("A acquires");
        assert!(a.lock(name).force_unlock().await.expect("force_unlock"));
        let hb = b.holder();
        let _guard_b = b
            .lock(name)
            .holder(&hb)
            .lease(Duration::from_secs(10))
            .try_acquire(Duration::from_secs(1))
            .await
            .expect("B acquires after the admin action");
        // Several of A's renewal rounds (every 200 ms).
        tokio::time::timeout(Duration::from_secs(3), guard_a.lost())
            .await
            .expect("A's guard notices it lost the lock");
        tokio::time::sleep(Duration::from_millis(300)).await;
        let ttl = b
            .lock(name)
            .remaining_ttl()
            .await
            .expect("ttl")
            .expect("B still holds it");
        // A renewal by A would have set A's 600 ms lease on it.
        assert!(
            ttl > Duration::from_secs(2),
            "B's lease was changed by A's watchdog: {ttl:?}"
        );
        if name == "taken-over-release" {
            match guard_a.release().await {
                Err(LockError::Lost { .. }) => {}
                other => panic!("A's release of B's lock: {other:?}"),
            }
        } else {
            drop(guard_a);
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        assert_eq!(b.lock(name).hold_count(&hb).await.expect("count"), 1);
        assert!(b.lock(name).is_locked().await.expect("is_locked"));
    }
}

/// Two holders of the same client are different identities: a second holder neither
/// re-enters nor releases the first one's lock; only the first holder's release frees it.
async fn holders_of_one_client_exclude_each_other(env: Env) {
    let client = env.client().await;
    let (first, second) = (client.holder(), client.holder());
    let guard = client
        .lock("two-holders")
        .holder(&first)
        .acquire()
        .await
        .expect("first acquires");
    match client
        .lock("two-holders")
        .holder(&second)
        .try_acquire(Duration::ZERO)
        .await
    {
        Err(LockError::Timeout { .. }) => {}
        other => panic!("second holder: {other:?}"),
    }
    let lock = client.lock("two-holders");
    assert_eq!(lock.hold_count(&second).await.expect("count"), 0);
    assert!(lock.is_held_by(&first).await.expect("held"));
    guard.release().await.expect("release");
    assert!(!lock.is_locked().await.expect("is_locked"));
}
