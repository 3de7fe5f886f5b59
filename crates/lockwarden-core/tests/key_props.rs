//! Properties of lock keys for arbitrary input: how names (and namespaces) become Redis
//! keys, through the public `LockClient::key`, held to the documented layout (the oracle
//! in `common::keys`). One test checks the layout of the keys a real redis-server ends
//! up holding. (Names extracted from HTTP requests: the root package's
//! `tests/key_props.rs`.)

mod common;

use std::time::Duration;

use common::keys::{check_layout, config, crc16, hash_tag, key_slot, tricky, unescape, valid};
use lockwarden_core::{KeyLayout, LockClient};
use lockwarden_testkit::{eventually, RedisServer};
use proptest::prelude::*;

/// The slot function agrees with the Redis Cluster specification's test vectors.
#[test]
fn key_slot_matches_the_cluster_spec() {
    assert_eq!(crc16(b"123456789"), 0x31C3);
    assert_eq!(key_slot("foo"), 12182);
    assert_eq!(key_slot("bar"), 5061);
    assert_eq!(key_slot("hello"), 866);
    assert_eq!(
        key_slot("{user1000}.following"),
        key_slot("{user1000}.followers")
    );
    assert_eq!(hash_tag(b"foo{}{bar}"), b"foo{}{bar}");
    assert_eq!(hash_tag(b"foo{{bar}}zap"), b"{bar");
    assert_eq!(hash_tag(b"foo{bar}{zap}"), b"bar");
}

proptest! {
    #![proptest_config(config())]

    /// For any namespace and name: `LockClient::key` never panics, accepts exactly the
    /// valid names (non-empty, ≤ 255 bytes, no control characters), and lays an accepted
    /// one out inside its namespace, with the hash tag wrapping exactly the escaped name
    /// and one slot for lock key, fencing key and channel.
    #[test]
    fn any_name_stays_in_its_namespace_and_slot(namespace in tricky(), name in tricky()) {
        let client = LockClient::builder().namespace(namespace.clone()).in_memory();
        match client.key(&name) {
            Ok(key) => {
                prop_assert!(valid(&name), "accepted {name:?}");
                prop_assert_eq!(key.name(), name.as_str());
                check_layout(&namespace, &name, key.redis_key(), key.channel())?;
            }
            Err(_) => prop_assert!(!valid(&name), "rejected {name:?}"),
        }
    }

    /// Escaping is injective: distinct (namespace, name) pairs never share a lock key or
    /// a channel (so no name can spell another's key, not even across namespaces).
    #[test]
    fn distinct_names_get_distinct_keys(
        a in ("[%{}7B:a]{0,4}", "[%{}7BD25a:]{1,8}"),
        b in ("[%{}7B:a]{0,4}", "[%{}7BD25a:]{1,8}"),
    ) {
        let key = |(ns, name): &(String, String)| {
            LockClient::builder().namespace(ns.clone()).in_memory().key(name).expect("valid")
        };
        let (ka, kb) = (key(&a), key(&b));
        prop_assert_eq!(a == b, ka.redis_key() == kb.redis_key(), "{:?} vs {:?}", ka.redis_key(), kb.redis_key());
        prop_assert_eq!(a == b, ka.channel() == kb.channel());
    }
}

proptest! {
    #![proptest_config(config())]

    /// Under `KeyLayout::Redisson` (names used as they are, for interop with Redisson's
    /// `RLock`): `LockClient::key` never panics, accepts exactly the valid names whose
    /// namespace and name have no braces, lays the lock out as `<namespace><name>` with
    /// the fencing key and channel tagged `{<namespace><name>}` (so all three share the
    /// lock key's slot), and distinct names get distinct keys.
    #[test]
    fn redisson_layout_keeps_one_slot_and_refuses_braces(
        namespace in "[a-z:{}]{0,6}",
        name in tricky(),
        other in tricky(),
    ) {
        let client = LockClient::builder()
            .layout(KeyLayout::Redisson)
            .namespace(namespace.clone())
            .in_memory();
        let full = format!("{namespace}{name}");
        match client.key(&name) {
            Ok(key) => {
                prop_assert!(valid(&name) && !full.contains(['{', '}']), "accepted {:?}", full);
                prop_assert_eq!(key.redis_key(), full.as_str());
                prop_assert_eq!(key.channel(), format!("redisson_lock__channel:{{{full}}}"));
                let fence = format!("redisson_lock__fence:{{{full}}}");
                let slot = key_slot(key.redis_key());
                prop_assert_eq!(key_slot(&fence), slot);
                prop_assert_eq!(key_slot(key.channel()), slot);
                if let Ok(other_key) = client.key(&other) {
                    prop_assert_eq!(name == other, key.redis_key() == other_key.redis_key());
                }
            }
            Err(_) => prop_assert!(!valid(&name) || full.contains(['{', '}']), "refused {:?}", full),
        }
    }
}

/// Against a real redis-server, for names built to break out (braces, `%`, namespace
/// look-alikes): while one holder holds a lock and another waits on it, Redis holds
/// exactly the lock hash and its fencing key, and a subscription to exactly the release
/// channel; all are inside the namespace and in the lock key's cluster slot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_holds_only_keys_of_the_layout() {
    let server = RedisServer::start().expect("start redis-server");
    let holder = LockClient::connect(&server.url()).await.expect("connect");
    let waiter = LockClient::connect(&server.url()).await.expect("connect");
    let names = [
        "plain",
        "}",
        "{",
        "{}",
        "}{",
        "%7B",
        "a}b{c",
        "}lockwarden:{victim",
        "lockwarden:{x}",
        "*",
        "é{✓}",
    ];
    for name in names {
        let key = holder.key(name).expect("valid");
        let guard = holder.acquire(name).await.expect("acquire");
        let wait = tokio::spawn({
            let waiter = waiter.clone();
            async move { waiter.try_acquire(name, Duration::from_secs(5)).await }
        });
        // The waiter subscribes to the release channel before sleeping. (The previous
        // name's subscription may still be on its way out.)
        let channels = vec![key.channel().to_owned()];
        eventually(
            Duration::from_secs(3),
            format_args!("exactly {name:?}'s release channel subscribed"),
            || async { server.channels() == channels },
        )
        .await;
        let keys = server.keys_matching("*");
        let mut expected = vec![
            key.redis_key().to_owned(),
            format!("{}:fence", key.redis_key()),
        ];
        expected.sort();
        assert_eq!(keys, expected, "{name:?}");
        let slot = key_slot(key.redis_key());
        for k in keys.iter().chain(&channels) {
            assert!(k.starts_with("lockwarden:{"), "{k:?}");
            assert_eq!(key_slot(k), slot, "{k:?}");
        }
        assert_eq!(
            std::str::from_utf8(hash_tag(key.redis_key().as_bytes()))
                .ok()
                .and_then(unescape)
                .as_deref(),
            Some(name)
        );
        guard.release().await.expect("release");
        let taken = wait.await.expect("task").expect("the waiter gets it");
        taken.release().await.expect("release");
        let () = server.query(&["FLUSHALL"]).expect("FLUSHALL");
    }
}
