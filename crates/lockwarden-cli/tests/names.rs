//! Names decoded back from keys round-trip with the core's own keys, for awkward names
//! in both layouts (rate limiters' buckets too); and the server-side scan patterns never
//! miss a name a glob matches.

use std::time::Duration;

use lockwarden_cli::names::{glob_match, BucketName, Part, Space};
use lockwarden_core::{KeyLayout, LockClient, RatePolicy};
use proptest::prelude::*;

/// Names the core accepts: no control characters, 1 to 40 characters, rich in the
/// characters that matter (braces, `%`, escapes, `:`, glob metacharacters, unicode).
fn name() -> impl Strategy<Value = String> {
    prop::collection::vec(
        prop_oneof![
            Just('{'),
            Just('}'),
            Just('%'),
            Just(':'),
            Just('*'),
            Just('?'),
            Just('['),
            Just('\\'),
            Just(' '),
            Just('7'),
            Just('B'),
            Just('D'),
            Just('ü'),
            Just('✓'),
            Just('😀'),
            prop::char::range('a', 'e'),
            any::<char>().prop_filter("no control characters", |c| !c.is_control()),
        ],
        1..40,
    )
    .prop_map(|cs| cs.into_iter().collect())
}

fn namespace() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("lockwarden:".to_owned()),
        Just(String::new()),
        Just("app{1}:".to_owned()),
        name(),
    ]
}

fn core_key(namespace: &str, layout: KeyLayout, name: &str) -> Option<String> {
    let client = LockClient::builder()
        .layout(layout)
        .namespace(namespace)
        .in_memory();
    client.key(name).ok().map(|k| k.redis_key().to_owned())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn tagged_names_round_trip(ns in namespace(), name in name()) {
        let space = Space::new(Some(&ns), KeyLayout::Tagged);
        let key = core_key(&ns, KeyLayout::Tagged, &name).expect("the core accepts it");
        prop_assert_eq!(space.keys(&name).unwrap().lock, key.clone());
        prop_assert_eq!(space.decode(&key), Some((name.clone(), Part::Lock)));
        let keys = space.keys(&name).unwrap();
        for (part, _) in Part::COMPANIONS {
            prop_assert_eq!(space.decode(keys.of(part)), Some((name.clone(), part)));
        }
        // Channels are not keys.
        prop_assert_eq!(space.decode(&keys.channel), None);
        prop_assert_eq!(space.decode(&keys.readers_channel), None);
        prop_assert_eq!(space.decode(&keys.granted_channel), None);
    }

    #[test]
    fn a_key_belongs_to_one_tagged_namespace(a in namespace(), b in namespace(), name in name()) {
        let key = core_key(&b, KeyLayout::Tagged, &name).unwrap();
        let decoded = Space::new(Some(&a), KeyLayout::Tagged).decode(&key);
        if a == b {
            prop_assert_eq!(decoded, Some((name, Part::Lock)));
        } else {
            prop_assert_eq!(decoded, None);
        }
    }

    #[test]
    fn redisson_names_round_trip(name in name()) {
        match core_key("", KeyLayout::Redisson, &name) {
            None => prop_assert!(name.contains(['{', '}']), "only braces are refused"),
            Some(key) => {
                let space = Space::new(None, KeyLayout::Redisson);
                prop_assert_eq!(&key, &name);
                prop_assert_eq!(space.decode(&key), Some((name.clone(), Part::Lock)));
                let keys = space.keys(&name).unwrap();
                let core = LockClient::builder().layout(KeyLayout::Redisson).in_memory();
                let core_key = core.key(&name).unwrap();
                prop_assert_eq!(core_key.channel(), keys.channel.as_str());
                for (part, _) in Part::COMPANIONS {
                    prop_assert_eq!(space.decode(keys.of(part)), Some((name.clone(), part)));
                }
            }
        }
    }

    #[test]
    fn scan_patterns_match_every_key_of_every_matching_name(
        pattern in "[a-d*?{}%\\[\\]^\\\\ü-]{0,8}",
        name in name(),
        ns in namespace(),
    ) {
        if !glob_match(&pattern, &name) {
            return Ok(());
        }
        for layout in [KeyLayout::Tagged, KeyLayout::Redisson] {
            let space = Space::new(Some(&ns), layout);
            let Ok(keys) = space.keys(&name) else { continue };
            let patterns = space.scan_patterns(&pattern);
            for part in [Part::Lock, Part::Fence, Part::Queue, Part::Done] {
                let key = keys.of(part);
                prop_assert!(
                    patterns.iter().any(|p| glob_match(&p.pattern, key)),
                    "{key:?} escapes {patterns:?} (name {name:?} matches {pattern:?})"
                );
            }
        }
    }

    #[test]
    fn buckets_round_trip_and_never_pass_for_locks(
        ns in namespace(),
        key in name(),
        pattern in "[a-d*?{}%\\[\\]:ü-]{0,8}",
        redisson in any::<bool>(),
    ) {
        let layout = if redisson { KeyLayout::Redisson } else { KeyLayout::Tagged };
        let client = LockClient::builder().layout(layout).namespace(&ns).in_memory();
        let policies = [
            RatePolicy::new("burst", 10, Duration::from_secs(1)),
            RatePolicy::new("per-day.1", 1, Duration::from_secs(86_400)),
        ];
        let limiter = client.rate_limiter("api_v1", policies).unwrap();
        let space = Space::new(Some(&ns), layout);
        for (bucket, policy) in limiter.bucket_keys(&key).unwrap().iter().zip(["burst", "per-day.1"]) {
            let name = BucketName {
                limiter: "api_v1".to_owned(),
                key: key.clone(),
                policy: policy.to_owned(),
            };
            prop_assert_eq!(space.decode_bucket(bucket), Some(name));
            prop_assert!(bucket.starts_with(&space.bucket_prefix("api_v1", &key)));
            prop_assert!(glob_match(&space.buckets_pattern("api_v1", &key).pattern, bucket));
            if glob_match(&pattern, &format!("api_v1:{key}")) {
                prop_assert!(glob_match(&space.rate_pattern(&pattern).pattern, bucket));
            }
            // A bucket is not a lock's key, in either layout.
            prop_assert_eq!(space.decode(bucket), None);
        }
    }
}
