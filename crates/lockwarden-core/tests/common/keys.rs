//! The documented key layout as an oracle: Redis Cluster key slots, the documented
//! escaping, which names the engine must accept, and the layout check the key property
//! tests (engine and HTTP) hold every generated key to.

use proptest::prelude::*;

// ---------------------------------------------------------------------------------------
// Redis Cluster key slots (https://redis.io/docs/reference/cluster-spec/#key-distribution-model)
// ---------------------------------------------------------------------------------------

/// CRC16-CCITT (XMODEM): polynomial 0x1021, initial value 0, no reflection.
pub fn crc16(data: &[u8]) -> u16 {
    let mut crc = 0u16;
    for &byte in data {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

/// The part of a key Redis Cluster hashes: between the first `{` and the first `}` after
/// it, if that is non-empty; otherwise the whole key.
pub fn hash_tag(key: &[u8]) -> &[u8] {
    if let Some(open) = key.iter().position(|&b| b == b'{') {
        if let Some(len) = key[open + 1..].iter().position(|&b| b == b'}') {
            if len > 0 {
                return &key[open + 1..open + 1 + len];
            }
        }
    }
    key
}

/// The Redis Cluster slot of `key` (0..16384).
pub fn key_slot(key: &str) -> u16 {
    crc16(hash_tag(key.as_bytes())) % 16384
}

// ---------------------------------------------------------------------------------------
// The documented layout
// ---------------------------------------------------------------------------------------

/// `{`, `}` and `%` percent-encoded, everything else as is (the escaping documented on `Key`).
pub fn escape(raw: &str) -> String {
    raw.replace('%', "%25")
        .replace('{', "%7B")
        .replace('}', "%7D")
}

/// Undoes [`escape`]; `None` for a `%` that is not one of its three escapes.
pub fn unescape(escaped: &str) -> Option<String> {
    let mut out = String::new();
    let mut rest = escaped;
    while let Some(at) = rest.find('%') {
        out.push_str(&rest[..at]);
        let code = rest.get(at..at + 3)?;
        out.push(match code {
            "%25" => '%',
            "%7B" => '{',
            "%7D" => '}',
            _ => return None,
        });
        rest = &rest[at + 3..];
    }
    out.push_str(rest);
    Some(out)
}

/// Whether the engine must accept `name` (default limit 255 bytes).
pub fn valid(name: &str) -> bool {
    !name.is_empty() && name.len() <= 255 && !name.chars().any(char::is_control)
}

/// Checks a key's Redis names against the layout for `namespace` and `name`: the lock key
/// is `<escaped namespace>{<escaped name>}`, its hash tag is exactly the escaped name (which
/// unescapes to the name), the fencing key and the release channel extend the lock key
/// after the tag, and all three hash to one cluster slot.
pub fn check_layout(
    namespace: &str,
    name: &str,
    redis_key: &str,
    channel: &str,
) -> Result<(), TestCaseError> {
    let prefix = format!("{}{{", escape(namespace));
    prop_assert!(
        redis_key.starts_with(&prefix),
        "{redis_key:?} outside {prefix:?}"
    );
    prop_assert!(
        redis_key.ends_with('}'),
        "{:?} does not end the tag",
        redis_key
    );
    let tag = std::str::from_utf8(hash_tag(redis_key.as_bytes())).expect("utf-8");
    prop_assert_eq!(
        tag,
        &redis_key[prefix.len()..redis_key.len() - 1],
        "the tag is the whole name"
    );
    prop_assert_eq!(tag, escape(name));
    prop_assert_eq!(unescape(tag), Some(name.to_owned()));
    prop_assert!(!tag.contains(['{', '}']), "braces in the tag {:?}", tag);
    // The fencing key is not public: it is `<lock key>:fence` (checked against a real
    // server in `redis_holds_only_keys_of_the_layout`).
    let fence = format!("{redis_key}:fence");
    prop_assert_eq!(channel, format!("{redis_key}:released"));
    let slot = key_slot(redis_key);
    prop_assert_eq!(key_slot(&fence), slot);
    prop_assert_eq!(key_slot(channel), slot);
    prop_assert_eq!(slot, crc16(escape(name).as_bytes()) % 16384);
    Ok(())
}

/// Strings rich in the characters escaping is about, plus anything at all.
pub fn tricky() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => "[%{}7BDd25a:/*\\\\]{0,12}",
        2 => any::<String>(),
        1 => "[a-z{}%]{240,270}",
    ]
}

/// The property tests' settings: 256 cases.
pub fn config() -> ProptestConfig {
    ProptestConfig::with_cases(256)
}
