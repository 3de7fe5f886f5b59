//! Properties of lock keys for arbitrary input: how names (from headers, JSON fields,
//! scopes, namespaces) become Redis keys. Key layout and escaping through the public
//! `LockClient::key`, and HTTP extraction through `LockLayer` over an in-process store
//! with `tower::ServiceExt::oneshot`. One test checks the layout of the keys a real
//! redis-server ends up holding.

use std::convert::Infallible;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use lockwarden::http::KeySource;
use lockwarden::{KeyLayout, LockClient, LockInfo, LockLayer, LockedBody};
use lockwarden_testkit::RedisServer;
use proptest::prelude::*;
use tower::{Layer, ServiceExt};

// ---------------------------------------------------------------------------------------
// Redis Cluster key slots (https://redis.io/docs/reference/cluster-spec/#key-distribution-model)
// ---------------------------------------------------------------------------------------

/// CRC16-CCITT (XMODEM): polynomial 0x1021, initial value 0, no reflection.
fn crc16(data: &[u8]) -> u16 {
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
fn hash_tag(key: &[u8]) -> &[u8] {
    if let Some(open) = key.iter().position(|&b| b == b'{') {
        if let Some(len) = key[open + 1..].iter().position(|&b| b == b'}') {
            if len > 0 {
                return &key[open + 1..open + 1 + len];
            }
        }
    }
    key
}

fn key_slot(key: &str) -> u16 {
    crc16(hash_tag(key.as_bytes())) % 16384
}

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

// ---------------------------------------------------------------------------------------
// The documented layout, as an oracle
// ---------------------------------------------------------------------------------------

/// `{`, `}` and `%` percent-encoded, everything else as is (the README's escaping).
fn escape(raw: &str) -> String {
    raw.replace('%', "%25")
        .replace('{', "%7B")
        .replace('}', "%7D")
}

fn unescape(escaped: &str) -> Option<String> {
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
fn valid(name: &str) -> bool {
    !name.is_empty() && name.len() <= 255 && !name.chars().any(char::is_control)
}

/// Checks a key's Redis names against the layout for `namespace` and `name`: the lock key
/// is `<escaped namespace>{<escaped name>}`, its hash tag is exactly the escaped name (which
/// unescapes to the name), the fencing key and the release channel extend the lock key
/// after the tag, and all three hash to one cluster slot.
fn check_layout(
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
fn tricky() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => "[%{}7BDd25a:/*\\\\]{0,12}",
        2 => any::<String>(),
        1 => "[a-z{}%]{240,270}",
    ]
}

fn config() -> ProptestConfig {
    ProptestConfig::with_cases(256)
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

// ---------------------------------------------------------------------------------------
// Extraction through the HTTP layer
// ---------------------------------------------------------------------------------------

type Svc = tower::util::BoxCloneService<Request<Full<Bytes>>, Response<Bytes>, Infallible>;

/// A layer over a handler that returns the request's `LockInfo` in the response
/// extensions; the response body is collected.
fn service<K>(layer: LockLayer<K>) -> Svc
where
    K: KeySource<Full<Bytes>, RequestBody = Full<Bytes>> + Send + Sync + 'static,
    K::Future: Send + 'static,
{
    async fn handler(request: Request<Full<Bytes>>) -> Result<Response<Full<Bytes>>, Infallible> {
        let mut response = Response::new(Full::new(Bytes::from_static(b"handled")));
        if let Some(info) = request.extensions().get::<LockInfo>() {
            response.extensions_mut().insert(info.clone());
        }
        Ok(response)
    }
    let inner = layer.layer(tower::service_fn(handler));
    tower::util::BoxCloneService::new(inner.and_then(
        |response: Response<LockedBody<Full<Bytes>>>| async move {
            let (parts, body) = response.into_parts();
            let bytes = body
                .collect()
                .await
                .map(|c| c.to_bytes())
                .unwrap_or_else(|e| match e {});
            Ok(Response::from_parts(parts, bytes))
        },
    ))
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

/// What one request through the layer produced.
enum Outcome {
    /// The handler ran under this lock.
    Locked(LockInfo),
    /// The layer answered with a problem document of this status and `type` slug.
    Problem(u16, String),
}

fn outcome(response: Response<Bytes>) -> Result<Outcome, TestCaseError> {
    if let Some(info) = response.extensions().get::<LockInfo>() {
        prop_assert_eq!(response.status(), StatusCode::OK);
        return Ok(Outcome::Locked(info.clone()));
    }
    prop_assert_eq!(
        &response.headers()["content-type"],
        "application/problem+json"
    );
    let doc: serde_json::Value = serde_json::from_slice(response.body()).expect("problem JSON");
    prop_assert_eq!(&doc["status"], response.status().as_u16());
    let slug = doc["type"]
        .as_str()
        .and_then(|t| t.strip_prefix("urn:lockwarden:problem:"))
        .expect("problem type")
        .to_owned();
    Ok(Outcome::Problem(response.status().as_u16(), slug))
}

/// The expected outcome for a raw key: locked under `<ns><key>` if that is a valid name
/// and the key is non-empty, else 400 invalid-lock-key.
fn check_key(outcome: Outcome, layer_ns: &str, key: &str) -> Result<(), TestCaseError> {
    let name = format!("{layer_ns}{key}");
    match outcome {
        Outcome::Locked(info) => {
            prop_assert!(!key.is_empty() && valid(&name), "locked {name:?}");
            prop_assert_eq!(info.key.name(), name.as_str());
            check_layout(
                "lockwarden:",
                &name,
                info.key.redis_key(),
                info.key.channel(),
            )?;
        }
        Outcome::Problem(status, slug) => {
            prop_assert!(
                key.is_empty() || !valid(&name),
                "refused {name:?}: {status} {slug}"
            );
            prop_assert_eq!((status, slug.as_str()), (400, "invalid-lock-key"));
        }
    }
    Ok(())
}

/// Header value bytes as HTTP allows them (no control bytes but tab, no DEL), with a bias
/// to UTF-8 text, braces and percent signs, and lengths around the limit.
fn header_bytes() -> impl Strategy<Value = Vec<u8>> {
    let byte = prop_oneof![Just(b'\t'), 0x20u8..0x7f, 0x80u8..=0xff];
    prop_oneof![
        2 => "[ -~{}%é✓\u{85}\u{a0}]{0,20}".prop_map(String::into_bytes),
        2 => prop::collection::vec(byte.clone(), 0..40),
        1 => prop::collection::vec(byte, 240..260),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    /// For any header value: the layer never panics; it locks exactly when the value is
    /// non-empty UTF-8 that makes a valid name with the namespace `http:`, under the name
    /// `http:<value>` laid out as documented; otherwise it answers 400 invalid-lock-key.
    #[test]
    fn header_values_become_keys_or_400(value in header_bytes()) {
        let header = HeaderValue::from_bytes(&value).expect("valid header bytes");
        let request = Request::post("/").header("idempotency-key", header).body(Full::default()).expect("request");
        let response = runtime().block_on(
            service(LockLayer::by_header("Idempotency-Key").client(LockClient::in_memory())).oneshot(request),
        ).unwrap_or_else(|e| match e {});
        match std::str::from_utf8(&value) {
            Ok(key) => check_key(outcome(response)?, "http:", key)?,
            Err(_) => match outcome(response)? {
                Outcome::Problem(400, slug) => prop_assert_eq!(slug, "invalid-lock-key"),
                _ => prop_assert!(false, "non-UTF-8 value accepted"),
            },
        }
    }

    /// For any string in a JSON field (control characters, braces, any Unicode): the
    /// layer never panics and locks `http:<string>` exactly when it is a valid non-empty
    /// key, otherwise 400 invalid-lock-key.
    #[test]
    fn json_string_fields_become_keys_or_400(value in tricky()) {
        let body = serde_json::to_vec(&serde_json::json!({ "id": value })).expect("json");
        let request = Request::post("/").body(Full::new(Bytes::from(body))).expect("request");
        let response = runtime().block_on(
            service(LockLayer::by_json_field("/id").client(LockClient::in_memory())).oneshot(request),
        ).unwrap_or_else(|e| match e {});
        check_key(outcome(response)?, "http:", &value)?;
    }

    /// For any body bytes: the JSON layer never panics and answers only 200 (the key it
    /// locked is the field's text), 400, 413 or 422.
    #[test]
    fn any_body_is_answered(body in prop_oneof![
        prop::collection::vec(any::<u8>(), 0..64),
        "\\{\"id\":[\"0-9a-z{}\\[\\]:,. ]{0,16}\\}".prop_map(String::into_bytes),
    ]) {
        let request = Request::post("/").body(Full::new(Bytes::from(body.clone()))).expect("request");
        let response = runtime().block_on(
            service(LockLayer::by_json_field("/id").body_limit(48).client(LockClient::in_memory())).oneshot(request),
        ).unwrap_or_else(|e| match e {});
        match outcome(response)? {
            Outcome::Locked(info) => {
                let doc: serde_json::Value = serde_json::from_slice(&body).expect("was JSON");
                let text = match &doc["id"] {
                    serde_json::Value::String(s) => s.clone(),
                    serde_json::Value::Number(n) => n.to_string(),
                    other => return Err(TestCaseError::fail(format!("locked on {other}"))),
                };
                prop_assert_eq!(info.key.name(), format!("http:{text}"));
            }
            Outcome::Problem(status, _) => prop_assert!([400, 413, 422].contains(&status), "{status}"),
        }
    }

    /// For any layer namespace and key: the lock name is `<namespace><key>` and its Redis
    /// key stays under the client's namespace with the tag wrapping the escaped name.
    #[test]
    fn layer_namespace_prefixes_every_name(namespace in tricky(), key in "[ -~]{0,16}") {
        let request = Request::post("/").header("idempotency-key", key.as_str()).body(Full::default()).expect("request");
        let response = runtime().block_on(
            service(LockLayer::by_header("Idempotency-Key").namespace(namespace.clone()).client(LockClient::in_memory())).oneshot(request),
        ).unwrap_or_else(|e| match e {});
        check_key(outcome(response)?, &namespace, &key)?;
    }

    /// Scoped names are injective: for any two (scope, key) pairs, the lock names are
    /// equal only if the pairs are, and each is laid out as documented.
    #[test]
    fn scoped_names_are_injective(
        a in ("[a/%2F{}]{0,5}", "[a/%2F{}]{1,5}"),
        b in ("[a/%2F{}]{0,5}", "[a/%2F{}]{1,5}"),
    ) {
        let rt = runtime();
        let name = |(scope, key): &(String, String)| -> Result<String, TestCaseError> {
            let request = Request::post("/")
                .header("idempotency-key", key.as_str())
                .header("x-user", scope.as_str())
                .body(Full::default())
                .expect("request");
            let layer = LockLayer::by_header("Idempotency-Key")
                .scope(|parts| Some(parts.headers.get("x-user")?.to_str().ok()?.to_owned()))
                .client(LockClient::in_memory());
            let response = rt.block_on(service(layer).oneshot(request)).unwrap_or_else(|e| match e {});
            match outcome(response)? {
                Outcome::Locked(info) => {
                    let name = info.key.name().to_owned();
                    check_layout("lockwarden:", &name, info.key.redis_key(), info.key.channel())?;
                    Ok(name)
                }
                Outcome::Problem(status, slug) => Err(TestCaseError::fail(format!("{status} {slug}"))),
            }
        };
        let (na, nb) = (name(&a)?, name(&b)?);
        prop_assert_eq!(a == b, na == nb, "{:?} -> {:?}, {:?} -> {:?}", a, na, b, nb);
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
    let mut redis = redis::Client::open(server.url())
        .expect("url")
        .get_multiplexed_async_connection()
        .await
        .expect("redis");
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
        // The waiter subscribes to the release channel before sleeping.
        let deadline = std::time::Instant::now() + Duration::from_secs(3);
        let channels: Vec<String> = loop {
            let channels: Vec<String> = redis::cmd("PUBSUB")
                .arg("CHANNELS")
                .query_async(&mut redis)
                .await
                .expect("PUBSUB CHANNELS");
            // (The previous name's subscription may still be on its way out.)
            if channels == [key.channel()] || std::time::Instant::now() > deadline {
                break channels;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        };
        assert_eq!(channels, vec![key.channel().to_owned()], "{name:?}");
        let mut keys: Vec<String> = redis::cmd("KEYS")
            .arg("*")
            .query_async(&mut redis)
            .await
            .expect("KEYS");
        keys.sort();
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
        let () = redis::cmd("FLUSHALL")
            .query_async(&mut redis)
            .await
            .expect("FLUSHALL");
    }
}
