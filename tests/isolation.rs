//! Isolation between principals through the HTTP layer: scoped keys of different
//! principals never contend, and no key derived from user input addresses a key outside
//! the layer's namespace. (Isolation between holders and clients, in the engine, is in
//! `crates/lockwarden-core/tests/isolation.rs`.)

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::{Extension, State};
use axum::http::{Request, StatusCode};
use axum::routing::post;
use axum::Router;
use common::keys::escape;
use common::web::{req, send};
use common::Env;
use lockwarden::{LockInfo, LockLayer};
use tokio::sync::Barrier;
use tower::ServiceExt;

conformance!(
    scoped_principals_never_contend,
    user_keys_never_reach_outside_the_namespace,
);

/// Principals whose names look like each other's escapes and separators.
const PRINCIPALS: [&str; 12] = [
    "alice", "bob", "a", "a/b", "a%2Fb", "a%b", "{alice}", "}", "a/", "/", "%", "ALICE",
];

/// Every principal sends the same `Idempotency-Key` at once, and every request holds its
/// lock at the same time (a barrier of all of them inside the handlers): none waits for
/// or is refused because of another principal's key; also (scope `a`, key `b/c`) and
/// (scope `a/b`, key `c`) are held at once. A second request of one principal with the
/// same key is still refused 409 (scoping does not disable locking).
async fn scoped_principals_never_contend(env: Env) {
    let client = env.client().await;
    let pairs: Vec<(&str, &str)> = PRINCIPALS
        .iter()
        .map(|p| (*p, "same-key"))
        .chain([("a", "b/c"), ("a/b", "c"), ("a%2F", "b"), ("a", "%2Fb")])
        .collect();
    let barrier = Arc::new(Barrier::new(pairs.len()));
    async fn all_inside(State(barrier): State<Arc<Barrier>>) -> StatusCode {
        match tokio::time::timeout(Duration::from_secs(5), barrier.wait()).await {
            Ok(_) => StatusCode::OK,
            Err(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }
    let app = Router::new()
        .route("/pay", post(all_inside))
        .layer(
            LockLayer::by_header("Idempotency-Key")
                .client(client.clone())
                .scope(|parts| Some(parts.headers.get("x-user")?.to_str().ok()?.to_owned())),
        )
        .with_state(barrier);
    let request = |user: &str, key: &str| {
        Request::post("/pay")
            .header("x-user", user)
            .header("idempotency-key", key)
            .body(Body::empty())
            .expect("request")
    };
    let started = Instant::now();
    let answers = futures_util::future::join_all(
        pairs
            .iter()
            .map(|(user, key)| send(&app, request(user, key))),
    )
    .await;
    for ((user, key), answer) in pairs.iter().zip(answers) {
        assert_eq!(
            answer.status,
            StatusCode::OK,
            "{user:?}/{key:?}: {}",
            answer.text()
        );
    }
    assert!(started.elapsed() < Duration::from_secs(5));

    // The same principal twice: the second is refused while the first holds the key.
    let holder_barrier = Arc::new(Barrier::new(2));
    let slow = Router::new()
        .route(
            "/pay",
            post(|State(b): State<Arc<Barrier>>| async move {
                b.wait().await;
                tokio::time::sleep(Duration::from_millis(200)).await;
                "done"
            }),
        )
        .layer(
            LockLayer::by_header("Idempotency-Key")
                .client(client.clone())
                .scope(|parts| Some(parts.headers.get("x-user")?.to_str().ok()?.to_owned())),
        )
        .with_state(holder_barrier.clone());
    let first = tokio::spawn(slow.clone().oneshot(request("alice", "dup")));
    holder_barrier.wait().await;
    let second = slow
        .clone()
        .oneshot(request("alice", "dup"))
        .await
        .expect("infallible");
    assert_eq!(second.status(), StatusCode::CONFLICT);
    let first = first.await.expect("task").expect("infallible");
    assert_eq!(first.status(), StatusCode::OK);
}

/// Keys built to break out (brace injection, namespace look-alikes, another layer's
/// namespace spelled into the key, glob characters) never contend with locks outside the
/// layer's namespace: with `victim` (core API), `lockwarden:{http:victim}` spelled as a
/// name, and `admin:root` (a layer with namespace `admin:`) all held, every such request
/// gets 200, its lock name is `http:<key>`, and the victims keep their holders.
async fn user_keys_never_reach_outside_the_namespace(env: Env) {
    let client = env.client().await;
    let victims = ["victim", "admin:root", "lockwarden:{http:victim}", "http"];
    let mut guards = Vec::new();
    for victim in victims {
        guards.push(client.acquire(victim).await.expect("victim lock"));
    }
    async fn name(Extension(info): Extension<LockInfo>) -> String {
        format!("{}\n{}", info.key.name(), info.key.redis_key())
    }
    let app = Router::new()
        .route("/k", post(name))
        .layer(LockLayer::by_header("Idempotency-Key").client(client.clone()));
    let attacks = [
        "victim",
        "}victim",
        "{victim}",
        "}:{victim",
        "}lockwarden:{victim",
        "lockwarden:{victim}",
        "%7Dvictim",
        "admin:root",
        ":admin:root",
        "../admin:root",
        "*",
        "victim*",
        "{http:victim}",
    ];
    for attack in attacks {
        let answer = send(&app, req("/k", Some(attack))).await;
        assert_eq!(answer.status, StatusCode::OK, "{attack:?}");
        let text = answer.text();
        let (name, redis_key) = text.split_once('\n').expect("two lines");
        assert_eq!(name, format!("http:{attack}"));
        let escaped = escape(attack);
        assert_eq!(redis_key, format!("lockwarden:{{http:{escaped}}}"));
    }
    for (victim, guard) in victims.iter().zip(&guards) {
        let lock = client.lock(victim);
        assert!(
            lock.is_held_by(guard.holder()).await.expect("held"),
            "{victim:?}"
        );
        assert_eq!(lock.hold_count(guard.holder()).await.expect("count"), 1);
    }
    for guard in guards {
        guard.release().await.expect("release");
    }
}
