//! The replaying lock policy, [`Replaying`]: the lock policy decorated with idempotent
//! replay ([`LockLayer::remember`](super::LockLayer::remember)). A request claims its
//! key's lock: a completed request's stored response is replayed (or `422` for another
//! request with its key); otherwise the request holds the lock as [`Locking`] has it, and
//! its response is recorded while its body streams and stored before the release.

use std::future::Future;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::request::Parts;
use http::{Extensions, StatusCode};
use http_body_util::Full;
use tracing::Span;

use super::admission::sealed::Policy;
use super::admission::{BoxFuture, Verdict};
use super::config::DEFAULT_BODY_LIMIT;
use super::held::Held;
use super::hold::{Hold, Holds};
use super::key::KeySource;
use super::layer::KeyedLayer;
use super::locking::{Exclusive, HeldLock, LockLayer, Locking};
use super::metrics::{Answered, Route};
use super::remember::config::Remembering;
use super::remember::fingerprint::RequestFingerprint;
use super::remember::recording::Recording;
use super::remember::stored::Stored;
use super::remember::{Fingerprint, Remember};
use crate::{Claim, LockClient, LockGuard, Scoped};

/// The admission policy of a remembering [`LockLayer`](super::LockLayer) (made by
/// [`remember`](super::LockLayer::remember)): the [`Locking`] policy, decorated so that
/// a retry of a completed request is answered from the store.
#[derive(Clone, Debug)]
pub struct Replaying {
    lock: Locking,
    remembering: Remembering,
}

impl Replaying {
    pub(crate) fn new(lock: Locking, keep: Duration) -> Self {
        Self {
            lock,
            remembering: Remembering::new(keep),
        }
    }
}

/// What a request of a remembering layer keeps while its handler runs: its lock, and its
/// fingerprint, stored with the response.
pub struct Remembered {
    lock: HeldLock,
    fingerprint: Option<RequestFingerprint>,
}

impl Holds for Replaying {
    fn hold_mut(&mut self) -> &mut Hold {
        self.lock.hold_mut()
    }
}

impl Exclusive for Replaying {}

impl Policy for Replaying {
    type Grant = (LockGuard, LockClient, Option<RequestFingerprint>);
    type Taken = Remembered;
    type Run<F: Future> = Scoped<F>;

    // A decorated lock: counted, traced and logged as one.
    const ADMITTED: Answered<'static> = Locking::ADMITTED;
    const OUTCOME: &'static str = Locking::OUTCOME;
    const BY: &'static str = Locking::BY;
    const TAKES: &'static str = Locking::TAKES;

    fn layered(&self) {
        self.lock.layered();
    }

    fn name(&self, scope: Option<&str>, key: &str) -> String {
        self.lock.name(scope, key)
    }

    fn admit(
        &self,
        _parts: &Parts,
        name: String,
        fingerprint: Option<RequestFingerprint>,
        route: &Route,
    ) -> BoxFuture<Verdict<Self::Grant>> {
        let (wait, lease) = (self.lock.hold.wait, self.lock.hold.lease);
        self.lock.acquire(
            route,
            move |client| {
                let lock = Locking::lock(client, &name, lease);
                async move { lock.try_claim(wait).await }
            },
            move |claim, client| match claim {
                Claim::Acquired(guard) => Verdict::Admit((guard, client, fingerprint)),
                Claim::Completed(stored) => match Stored::for_request(stored, fingerprint) {
                    Ok(stored) => Verdict::Replay(stored),
                    Err(rejection) => Verdict::Refuse(rejection.into()),
                },
            },
        )
    }

    fn take(
        &self,
        (guard, client, fingerprint): Self::Grant,
        extensions: &mut Extensions,
        span: &Span,
        route: &Route,
    ) -> Remembered {
        Remembered {
            lock: self.lock.keep((guard, client), extensions, span, route),
            fingerprint,
        }
    }

    fn run<F: Future>(taken: &Remembered, fut: F) -> Scoped<F> {
        Locking::run(&taken.lock, fut)
    }

    fn poll_lost(taken: &mut Remembered, cx: &mut Context<'_>) -> Poll<()> {
        taken.lock.kept.poll_lost(cx)
    }

    /// Starts recording the response, to store it when its body completes.
    fn respond(&self, taken: Remembered, head: &mut http::response::Parts) -> Option<Held> {
        let mut held = taken.lock.kept.held;
        if let Some(fingerprint) = taken.fingerprint {
            held.record(Recording::start(head, fingerprint, &self.remembering));
        }
        Some(held)
    }

    fn give_back(taken: Remembered) -> Option<Held> {
        Some(taken.lock.kept.held)
    }
}

impl<K> KeyedLayer<Replaying, Remember<K>> {
    /// What identifies a retry of the same request (default: method, path and body).
    ///
    /// ```
    /// use lockwarden::{Fingerprint, LockLayer};
    /// # use std::time::Duration;
    /// let layer = LockLayer::by_header("Idempotency-Key")
    ///     .remember(Duration::from_secs(3600))
    ///     .fingerprint(Fingerprint::json_fields(["/order_id", "/amount"]));
    /// # let _ = layer;
    /// ```
    pub fn fingerprint(mut self, fingerprint: Fingerprint) -> Self {
        self.source_mut().set_fingerprint(fingerprint);
        self
    }

    /// Stores response bodies up to `bytes` (default
    /// [`DEFAULT_MAX_STORED_BODY`](super::DEFAULT_MAX_STORED_BODY), 1 MiB); a longer one
    /// is sent but not remembered, and a retry runs the handler again.
    ///
    /// ```
    /// # use lockwarden::LockLayer;
    /// # use std::time::Duration;
    /// let layer = LockLayer::by_header("Idempotency-Key")
    ///     .remember(Duration::from_secs(3600))
    ///     .max_stored_body(64 * 1024);
    /// # let _ = layer;
    /// ```
    pub fn max_stored_body(mut self, bytes: usize) -> Self {
        self.policy_mut().remembering.max_stored_body = bytes;
        self
    }

    /// Which responses are remembered, by status (default: 2xx and 4xx). A response that
    /// is not remembered frees its key, so a retry runs the handler again.
    ///
    /// ```
    /// # use lockwarden::LockLayer;
    /// # use std::time::Duration;
    /// // Only successes are final here; a 409 from the handler may be retried.
    /// let layer = LockLayer::by_header("Idempotency-Key")
    ///     .remember(Duration::from_secs(3600))
    ///     .store_if(|status| status.is_success());
    /// # let _ = layer;
    /// ```
    pub fn store_if<F>(mut self, store_if: F) -> Self
    where
        F: Fn(StatusCode) -> bool + Send + Sync + 'static,
    {
        self.policy_mut().remembering.store_if = Arc::new(store_if);
        self
    }

    /// Replays header `name` too (`content-type` always is); e.g. `location`.
    ///
    /// ```
    /// # use lockwarden::LockLayer;
    /// # use std::time::Duration;
    /// let layer = LockLayer::by_header("Idempotency-Key")
    ///     .remember(Duration::from_secs(3600))
    ///     .replay_header(axum::http::header::LOCATION);
    /// # let _ = layer;
    /// ```
    pub fn replay_header(mut self, name: http::HeaderName) -> Self {
        self.policy_mut().remembering.replay_headers.push(name);
        self
    }

    /// Reads at most `bytes` of request body (default
    /// [`DEFAULT_BODY_LIMIT`](super::DEFAULT_BODY_LIMIT), 64 KiB) to fingerprint it, and
    /// to find the key in it with [`by_json_field`](super::LockLayer::by_json_field): one
    /// limit for both; longer bodies are answered `413`.
    ///
    /// ```
    /// # use lockwarden::LockLayer;
    /// # use std::time::Duration;
    /// let layer = LockLayer::by_header("Idempotency-Key")
    ///     .remember(Duration::from_secs(3600))
    ///     .body_limit(256 * 1024);
    /// # let _ = layer;
    /// ```
    pub fn body_limit(mut self, bytes: usize) -> Self
    where
        K: KeySource<Full<Bytes>>,
    {
        KeySource::<Full<Bytes>>::set_body_limit(self.source_mut(), bytes);
        self
    }
}

impl<K> LockLayer<K> {
    /// Makes the layer an idempotency layer (after the IETF draft *The Idempotency-Key
    /// HTTP Header Field*): a request whose response completed is remembered for `keep`
    /// (e.g. 24 h), and a retry with the same key is answered with the stored status,
    /// `content-type` (plus [`replay_header`](LockLayer::replay_header)s) and body, byte for
    /// byte, with `Idempotency-Replayed: true`, without reaching the handler.
    ///
    /// A key is then in one of three states, moved atomically by the store's scripts (or
    /// the in-process store): *in flight* (the lock: a duplicate gets `409`, or waits
    /// within [`wait`](Self::wait) and then gets the replay; one completion wakes every
    /// waiter), *completed* (the stored response), or *absent*.
    ///
    /// - The body is read (up to [`body_limit`](LockLayer::body_limit), default 64 KiB)
    ///   to fingerprint the request: by default its method, its path with the query, and
    ///   its body ([`fingerprint`](LockLayer::fingerprint) and [`Fingerprint::json_fields`]
    ///   compare chosen JSON fields instead). A retry whose [`Fingerprint`] differs from
    ///   the stored one is answered `422` (`urn:lockwarden:problem:idempotency-key-reused`).
    ///   A duplicate in flight is answered `409` whatever its fingerprint: the first one's
    ///   is stored only with its response.
    /// - 2xx and 4xx responses are stored, 5xx are not and free the key, so the client can
    ///   retry ([`store_if`](LockLayer::store_if) changes that). A response whose body is
    ///   longer than [`max_stored_body`](LockLayer::max_stored_body) (1 MiB) is sent but
    ///   not stored: the key is freed and a retry runs the handler again.
    /// - A handler that panics, a body that fails mid-way and a client that goes away store
    ///   nothing; the key is freed at once (at the latest when the lease runs out).
    /// - The response is stored before its last byte is sent, so a client that has it can
    ///   retry at once and be answered from the store.
    /// - Stored responses live in Redis, as completed claims do: they outlive a Redis
    ///   restart only as far as Redis persists them (with `appendonly yes` and
    ///   `appendfsync always`, every one it answered; without persistence, none: a retry
    ///   after the restart runs the handler again). See
    ///   [`Lock::try_claim`](lockwarden_core::Lock::try_claim).
    ///
    /// **With replay, unscoped keys leak responses.** A client that sends another client's
    /// `Idempotency-Key` (and the same request) is answered with *the other client's stored
    /// response*. Always [`scope`](Self::scope) a remembering layer by the authenticated
    /// principal.
    ///
    /// The stored responses live in the lock store beside the lock (a claim's outcome, see
    /// [`Lock::try_claim`](crate::Lock::try_claim)), so every replica that shares the
    /// store replays them; a store that loses its data on a restart forgets them (see
    /// [operating](crate::guide::operating#persistence-and-restarts)).
    ///
    /// ```
    /// use axum::{routing::post, Router};
    /// use lockwarden::{LockClient, LockLayer};
    /// use std::time::Duration;
    ///
    /// let app: Router = Router::new()
    ///     .route("/payments", post(|| async { "charged" }))
    ///     .layer(
    ///         LockLayer::by_header("Idempotency-Key")
    ///             .client(LockClient::in_memory())
    ///             .scope(|parts| parts.headers.get("x-api-key")?.to_str().ok().map(str::to_owned))
    ///             .remember(Duration::from_secs(24 * 3600)),
    ///     );
    /// ```
    pub fn remember(self, keep: Duration) -> KeyedLayer<Replaying, Remember<K>>
    where
        K: KeySource<Full<Bytes>> + Clone,
    {
        let limit = self.source().body_limit().unwrap_or(DEFAULT_BODY_LIMIT);
        let source = Remember::new(self.source().clone(), limit);
        self.keyed_by(source)
            .map_policy(|lock| Replaying::new(lock, keep))
    }
}
