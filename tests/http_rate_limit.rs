//! `RateLimitLayer`, against both stores: the limit holds across two servers over real
//! HTTP; a refusal is 429 with `Retry-After`, the draft's `quota-exceeded` problem and the
//! `RateLimit` fields, and charges no policy; the fields parse by the Structured Fields
//! grammar (`sfv`); plans, scopes and a global limit; bad input is 400 with nothing
//! charged; a limit layer describes itself the same way. The store going down is in
//! `tests/http_rate_limit_down.rs`.

mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, Request, StatusCode};
use axum::routing::post;
use axum::{Extension, Router};
use common::web::{post_over_http, send, serve};
use common::Env;
use lockwarden::{LimitLayer, LockClient, RateDecision, RateLimitLayer, RateLimiter, RatePolicy};
use sfv::{List, ListEntry, Parser};

conformance!(
    the_limit_holds_across_two_servers,
    a_refusal_is_429_with_retry_after_and_the_quota_problem,
    a_refusal_charges_no_policy,
    the_fields_parse_by_the_drafts_grammar,
    plans_choose_the_limiter_per_request,
    scoped_keys_are_limited_apart,
    a_global_limit_counts_every_request,
    missing_and_bad_keys_are_400_and_charge_nothing,
    a_limit_layer_describes_itself,
);

const QUOTA_EXCEEDED: &str = "https://iana.org/assignments/http-problem-types#quota-exceeded";

/// How many requests each tenant's handler served.
#[derive(Clone, Default)]
struct Served(Arc<std::sync::Mutex<HashMap<String, usize>>>);

impl Served {
    fn of(&self, tenant: &str) -> usize {
        self.0.lock().unwrap().get(tenant).copied().unwrap_or(0)
    }
}

/// The handler: counts the request for its `x-tenant`, says what its decision left.
async fn work(
    State(served): State<Served>,
    decision: Option<Extension<RateDecision>>,
    request: Request<Body>,
) -> String {
    let tenant = tenant(request.headers());
    *served.0.lock().unwrap().entry(tenant).or_default() += 1;
    let left = decision.map(|Extension(d)| d.policies()[0].remaining());
    format!("served; left {left:?}")
}

fn tenant(headers: &HeaderMap) -> String {
    headers
        .get("x-tenant")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned()
}

/// The app behind `$layer`, counting into `$served`.
macro_rules! app {
    ($layer:expr, $served:expr) => {
        Router::new()
            .route("/work", post(work))
            .layer($layer)
            .with_state($served.clone())
    };
}

/// A limiter of `client` with one policy, `quota` per `window`, `burst` at once.
fn limiter(
    client: &LockClient,
    name: &str,
    quota: u32,
    window: Duration,
    burst: u32,
) -> RateLimiter {
    client
        .rate_limiter(name, [RatePolicy::new("burst", quota, window).burst(burst)])
        .expect("a valid policy")
}

fn tenant_req(tenant: &str) -> Request<Body> {
    Request::post("/work")
        .header("x-tenant", tenant)
        .body(Body::empty())
        .expect("request")
}

/// A Structured Fields list, parsed: per member, its string and its integer parameters.
fn list(field: &str) -> Vec<(String, HashMap<String, i64>)> {
    let parsed = Parser::new(field)
        .parse::<List>()
        .unwrap_or_else(|e| panic!("`{field}` is no Structured Fields list: {e}"));
    parsed
        .into_iter()
        .map(|entry| {
            let ListEntry::Item(item) = entry else {
                panic!("`{field}`: an inner list")
            };
            let Some(name) = item.bare_item.as_string() else {
                panic!("`{field}`: a member that is no string")
            };
            let params = item
                .params
                .iter()
                .filter_map(|(key, value)| {
                    let n = value.as_integer()?;
                    Some((key.as_str().to_owned(), i64::from(n)))
                })
                .collect();
            (name.as_str().to_owned(), params)
        })
        .collect()
}

/// The members of field `name` of `headers`, parsed.
fn field(headers: &HeaderMap, name: &str) -> Vec<(String, HashMap<String, i64>)> {
    let value = headers
        .get(name)
        .unwrap_or_else(|| panic!("no `{name}` field"))
        .to_str()
        .expect("ascii");
    list(value)
}

/// Promise: two servers (each its own client on Redis) share one limit per key: a burst of
/// 90 requests for three tenants over both is admitted exactly the burst of each (the
/// rate refills a unit per 10 s, so none comes back within the test), the rest refused
/// with 429.
async fn the_limit_holds_across_two_servers(env: Env) {
    let served = Served::default();
    let mut addrs = Vec::new();
    for _ in 0..2 {
        let client = env.client().await;
        let api = limiter(&client, "api", 6, Duration::from_secs(60), 5);
        addrs.push(
            serve(app!(
                RateLimitLayer::limiter(api).by_header("X-Tenant"),
                served
            ))
            .await,
        );
    }
    let started = Instant::now();
    let mut burst = Vec::new();
    for i in 0..90 {
        let addr = addrs[i % 2];
        let tenant = ["a", "b", "c"][i % 3];
        burst.push(tokio::spawn(async move {
            (tenant, post_over_http(addr, "/work", tenant).await)
        }));
    }
    let mut answers: HashMap<(&str, StatusCode), usize> = HashMap::new();
    for request in burst {
        let answer = tokio::time::timeout(Duration::from_secs(20), request)
            .await
            .expect("answered in time")
            .expect("task");
        *answers.entry(answer).or_default() += 1;
    }
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "the refill would count"
    );
    for tenant in ["a", "b", "c"] {
        assert_eq!(served.of(tenant), 5, "{tenant}: {answers:?}");
        assert_eq!(answers.get(&(tenant, StatusCode::OK)), Some(&5));
        assert_eq!(
            answers.get(&(tenant, StatusCode::TOO_MANY_REQUESTS)),
            Some(&25),
            "{answers:?}"
        );
    }
}

/// Promise: a refused request is answered 429 with the draft's `quota-exceeded` problem
/// naming the policy that refused it, without reaching the handler, and a `Retry-After`
/// in whole seconds, rounded up, that is the engine's wait and never earlier than the
/// refusing policy's `t`; a retry after it is admitted.
async fn a_refusal_is_429_with_retry_after_and_the_quota_problem(env: Env) {
    let client = env.client().await;
    let served = Served::default();
    // One request per 1.5 s, 2 at once.
    let api = limiter(&client, "api", 2, Duration::from_secs(3), 2);
    let app = app!(
        RateLimitLayer::limiter(api.clone()).by_header("X-Tenant"),
        served
    );
    for _ in 0..2 {
        assert_eq!(send(&app, tenant_req("acme")).await.status, StatusCode::OK);
    }
    let refused = send(&app, tenant_req("acme")).await;
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(refused.problem_type(), QUOTA_EXCEEDED);
    let json = refused.json();
    assert_eq!(json["violated-policies"], serde_json::json!(["burst"]));
    assert!(json["title"].as_str().is_some_and(|t| !t.is_empty()));
    assert!(json["detail"].as_str().is_some_and(|d| d.contains("burst")));
    assert_eq!(served.of("acme"), 2, "the refused one ran");
    // The wait is at most 1.5 s: whole seconds, rounded up; the refusing policy's `t`
    // stands for the same wait.
    assert!(
        (1..=2).contains(&refused.retry_after()),
        "{:?}",
        refused.headers
    );
    let limits = field(&refused.headers, "ratelimit");
    assert_eq!(limits[0].0, "burst");
    assert_eq!(limits[0].1["r"], 0);
    assert_eq!(limits[0].1["t"] as u64, refused.retry_after());
    // Waiting as told admits the retry.
    tokio::time::sleep(Duration::from_secs(refused.retry_after())).await;
    assert_eq!(send(&app, tenant_req("acme")).await.status, StatusCode::OK);
}

/// Promise: a request refused by one policy is charged to none: the daily policy's count
/// is the admitted requests' only, in its field and in the store.
async fn a_refusal_charges_no_policy(env: Env) {
    let client = env.client().await;
    let served = Served::default();
    let api = client
        .rate_limiter(
            "api",
            [
                RatePolicy::new("burst", 3, Duration::from_secs(60)),
                RatePolicy::new("daily", 100, Duration::from_secs(86_400)),
            ],
        )
        .expect("valid policies");
    let app = app!(
        RateLimitLayer::limiter(api.clone()).by_header("X-Tenant"),
        served
    );
    let mut statuses = Vec::new();
    for _ in 0..8 {
        statuses.push(send(&app, tenant_req("acme")).await);
    }
    let admitted = statuses
        .iter()
        .filter(|a| a.status == StatusCode::OK)
        .count();
    assert_eq!(admitted, 3);
    let last = statuses.last().expect("answers");
    assert_eq!(last.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        last.json()["violated-policies"],
        serde_json::json!(["burst"])
    );
    let limits = field(&last.headers, "ratelimit");
    assert_eq!(limits[1].0, "daily");
    assert_eq!(
        limits[1].1["r"], 97,
        "the refusals were charged: {limits:?}"
    );
    let now = api.peek("acme").await.expect("peek");
    assert_eq!(now.policies()[1].remaining(), 97);
    assert_eq!(served.of("acme"), 3);
}

/// Promise: with `rate_limit_headers()`, every admitted response carries
/// `RateLimit-Policy` and `RateLimit` as the draft writes them: Structured Fields lists of
/// strings with integer parameters, one member per policy, `q` and `w` the policy's
/// quota and window in seconds, `r` what is left after this request.
async fn the_fields_parse_by_the_drafts_grammar(env: Env) {
    let client = env.client().await;
    let served = Served::default();
    let api = client
        .rate_limiter(
            "api",
            [
                RatePolicy::new("burst", 100, Duration::from_secs(60)).burst(20),
                RatePolicy::new("daily", 1_000, Duration::from_secs(86_400)),
            ],
        )
        .expect("valid policies");
    let app = app!(
        RateLimitLayer::limiter(api)
            .by_header("X-Tenant")
            .rate_limit_headers(),
        served
    );
    let first = send(&app, tenant_req("acme")).await;
    assert_eq!(first.status, StatusCode::OK);
    assert_eq!(first.text(), "served; left Some(19)");
    let policy = field(&first.headers, "ratelimit-policy");
    assert_eq!(policy.len(), 2);
    assert_eq!(policy[0].0, "burst");
    assert_eq!((policy[0].1["q"], policy[0].1["w"]), (100, 60));
    assert_eq!(policy[1].0, "daily");
    assert_eq!((policy[1].1["q"], policy[1].1["w"]), (1_000, 86_400));
    let limits = field(&first.headers, "ratelimit");
    assert_eq!((limits[0].0.as_str(), limits[0].1["r"]), ("burst", 19));
    assert_eq!((limits[1].0.as_str(), limits[1].1["r"]), ("daily", 999));
    // One unit comes back per 0.6 s (burst) and per 86.4 s (daily): t rounds up.
    assert_eq!(limits[0].1["t"], 1);
    assert_eq!(limits[1].1["t"], 87);
    // A refused response carries them too, without the option.
    let strict = limiter(&client, "strict", 1, Duration::from_secs(60), 1);
    let app = app!(
        RateLimitLayer::limiter(strict).by_header("X-Tenant"),
        served
    );
    let admitted = send(&app, tenant_req("acme")).await;
    assert!(admitted.headers.get("ratelimit").is_none());
    let refused = send(&app, tenant_req("acme")).await;
    assert_eq!(refused.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(field(&refused.headers, "ratelimit-policy")[0].1["q"], 1);
    let limits = field(&refused.headers, "ratelimit");
    assert_eq!(limits[0].1["r"], 0);
    assert_eq!(limits[0].1["t"] as u64, refused.retry_after());
}

/// Promise: `plans` charges each request to the limiter its head chooses: a paid tenant
/// gets the paid burst, a free one the free burst, each counted apart.
async fn plans_choose_the_limiter_per_request(env: Env) {
    let client = env.client().await;
    let served = Served::default();
    let free = limiter(&client, "free", 1, Duration::from_secs(60), 1);
    let paid = limiter(&client, "paid", 3, Duration::from_secs(60), 3);
    let layer = RateLimitLayer::plans(move |parts| match parts.headers.get("x-plan") {
        Some(plan) if plan == "paid" => paid.clone(),
        _ => free.clone(),
    })
    .by_header("X-Tenant");
    let app = app!(layer, served);
    let paid_req = || {
        Request::post("/work")
            .header("x-tenant", "big")
            .header("x-plan", "paid")
            .body(Body::empty())
            .expect("request")
    };
    let mut paid_ok = 0;
    let mut free_ok = 0;
    for _ in 0..5 {
        paid_ok += usize::from(send(&app, paid_req()).await.status == StatusCode::OK);
        free_ok += usize::from(send(&app, tenant_req("small")).await.status == StatusCode::OK);
    }
    assert_eq!((paid_ok, free_ok), (3, 1));
}

/// Promise: keys under different scopes are different buckets.
async fn scoped_keys_are_limited_apart(env: Env) {
    let client = env.client().await;
    let served = Served::default();
    let api = limiter(&client, "api", 1, Duration::from_secs(60), 1);
    let layer = RateLimitLayer::limiter(api)
        .by_header("X-Tenant")
        .scope(|parts| {
            parts
                .headers
                .get("x-user")?
                .to_str()
                .ok()
                .map(str::to_owned)
        });
    let app = app!(layer, served);
    let as_user = |user: &str| {
        Request::post("/work")
            .header("x-tenant", "shared")
            .header("x-user", user)
            .body(Body::empty())
            .expect("request")
    };
    assert_eq!(send(&app, as_user("alice")).await.status, StatusCode::OK);
    assert_eq!(send(&app, as_user("bob")).await.status, StatusCode::OK);
    assert_eq!(
        send(&app, as_user("alice")).await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    // No scope: no key, 400, nothing charged.
    send(&app, tenant_req("shared"))
        .await
        .assert_problem(400, "missing-key");
}

/// Promise: a global limit counts every request, whatever it carries.
async fn a_global_limit_counts_every_request(env: Env) {
    let client = env.client().await;
    let served = Served::default();
    let api = limiter(&client, "reports", 2, Duration::from_secs(60), 2);
    let app = app!(RateLimitLayer::limiter(api).global("all"), served);
    let statuses: Vec<StatusCode> = futures_util::future::join_all(["a", "b", "c", "d"].map(|t| {
        let app = app.clone();
        async move { send(&app, tenant_req(t)).await.status }
    }))
    .await;
    let ok = statuses.iter().filter(|s| **s == StatusCode::OK).count();
    assert_eq!(ok, 2, "{statuses:?}");
}

/// Promise: a request without the key, or with one the store refuses (too long, control
/// characters), is answered 400 with a problem document and charges nothing.
async fn missing_and_bad_keys_are_400_and_charge_nothing(env: Env) {
    let client = env.client().await;
    let served = Served::default();
    let api = limiter(&client, "api", 2, Duration::from_secs(60), 2);
    let app = app!(
        RateLimitLayer::limiter(api.clone()).by_header("X-Tenant"),
        served
    );
    let none = Request::post("/work").body(Body::empty()).expect("request");
    send(&app, none).await.assert_problem(400, "missing-key");
    let long = "k".repeat(lockwarden::DEFAULT_MAX_KEY_LEN + 1);
    send(&app, tenant_req(&long))
        .await
        .assert_problem(400, "invalid-key");
    let empty = Request::post("/work")
        .header("x-tenant", "")
        .body(Body::empty())
        .expect("request");
    send(&app, empty).await.assert_problem(400, "invalid-key");
    assert_eq!(served.0.lock().unwrap().len(), 0, "a handler ran");
    // Nothing was charged: a fresh key has its whole burst, and on Redis no bucket exists.
    assert_eq!(
        api.peek("k").await.expect("peek").policies()[0].remaining(),
        2
    );
    if env.is_redis() {
        let buckets: Vec<String> = env.server().query(&["KEYS", "*rate:*"]).expect("keys");
        assert!(buckets.is_empty(), "{buckets:?}");
    }
}

/// Promise: a limit layer with `rate_limit_headers()` describes itself by the draft's
/// fields: `"concurrency";q=<capacity>;qu="concurrent-requests"`, and `r=0` when full.
async fn a_limit_layer_describes_itself(env: Env) {
    let client = env.client().await;
    let held = Arc::new(tokio::sync::Notify::new());
    let entered = Arc::new(AtomicUsize::new(0));
    let app = Router::new()
        .route(
            "/work",
            post({
                let (held, entered) = (held.clone(), entered.clone());
                move |request: Request<Body>| async move {
                    if request.headers().contains_key("x-hold") {
                        entered.fetch_add(1, Ordering::SeqCst);
                        held.notified().await;
                    }
                    "done"
                }
            }),
        )
        .layer(
            LimitLayer::permits(1)
                .by_header("X-Tenant")
                .client(client)
                .rate_limit_headers(),
        );
    let admitted = send(&app, tenant_req("acme")).await;
    assert_eq!(admitted.status, StatusCode::OK);
    let policy = admitted.headers["ratelimit-policy"]
        .to_str()
        .expect("ascii");
    let parsed = Parser::new(policy).parse::<List>().expect("a list");
    let ListEntry::Item(item) = &parsed[0] else {
        panic!("an inner list")
    };
    assert_eq!(
        item.bare_item.as_string().map(|s| s.as_str()),
        Some("concurrency")
    );
    assert_eq!(field(&admitted.headers, "ratelimit-policy")[0].1["q"], 1);
    let unit = item.params.get("qu").and_then(|unit| unit.as_string());
    assert_eq!(unit.map(|s| s.as_str()), Some("concurrent-requests"));
    // While one holds the permit, the next is refused and told nothing is left.
    let first = tokio::spawn({
        let app = app.clone();
        async move {
            let request = Request::post("/work")
                .header("x-tenant", "acme")
                .header("x-hold", "1")
                .body(Body::empty())
                .expect("request");
            send(&app, request).await
        }
    });
    let deadline = Instant::now() + Duration::from_secs(5);
    while entered.load(Ordering::SeqCst) == 0 {
        assert!(Instant::now() < deadline, "the first never entered");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let refused = send(&app, tenant_req("acme")).await;
    refused.assert_problem(429, "limit-reached");
    assert_eq!(field(&refused.headers, "ratelimit")[0].1["r"], 0);
    assert_eq!(field(&refused.headers, "ratelimit-policy")[0].1["q"], 1);
    held.notify_waiters();
    assert_eq!(first.await.expect("task").status, StatusCode::OK);
}
