//! Properties of lock keys extracted from HTTP requests, for arbitrary input: names from
//! headers, JSON fields, scopes and layer name prefixes, through `LockLayer` over an
//! in-process store with `tower::ServiceExt::oneshot`, held to the documented layout (the
//! oracle in the engine's `tests/common/keys.rs`). (The engine's own key properties:
//! `crates/lockwarden-core/tests/key_props.rs`.)

mod common;

use std::convert::Infallible;

use bytes::Bytes;
use common::keys::{check_layout, tricky, valid};
use http::{HeaderValue, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use lockwarden::http::KeySource;
use lockwarden::{HeldBody, LockClient, LockInfo, LockLayer};
use proptest::prelude::*;
use tower::{Layer, ServiceExt};

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
        |response: Response<HeldBody<Full<Bytes>>>| async move {
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
/// and the key is non-empty, else 400 invalid-key.
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
            prop_assert_eq!((status, slug.as_str()), (400, "invalid-key"));
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
    /// non-empty UTF-8 that makes a valid name with the name prefix `http:`, under the name
    /// `http:<value>` laid out as documented; otherwise it answers 400 invalid-key.
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
                Outcome::Problem(400, slug) => prop_assert_eq!(slug, "invalid-key"),
                _ => prop_assert!(false, "non-UTF-8 value accepted"),
            },
        }
    }

    /// For any string in a JSON field (control characters, braces, any Unicode): the
    /// layer never panics and locks `http:<string>` exactly when it is a valid non-empty
    /// key, otherwise 400 invalid-key.
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

    /// For any layer name prefix and key: the lock name is `<prefix><key>` and its Redis
    /// key stays under the client's namespace with the tag wrapping the escaped name.
    #[test]
    fn layer_name_prefix_starts_every_name(prefix in tricky(), key in "[ -~]{0,16}") {
        let request = Request::post("/").header("idempotency-key", key.as_str()).body(Full::default()).expect("request");
        let response = runtime().block_on(
            service(LockLayer::by_header("Idempotency-Key").name_prefix(prefix.clone()).client(LockClient::in_memory())).oneshot(request),
        ).unwrap_or_else(|e| match e {});
        check_key(outcome(response)?, &prefix, &key)?;
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
