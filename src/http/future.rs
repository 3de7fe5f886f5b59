//! [`ResponseFuture`]: the state machine of one request through the lock layer —
//! extract the key, get the client, acquire, call the inner service as the lock's holder,
//! and move the lock into the response body.

use std::any::Any;
use std::fmt;
use std::future::Future;
use std::panic::{self, AssertUnwindSafe};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, Response};
use http_body::Body;
use pin_project_lite::pin_project;
use sync_wrapper::SyncWrapper;
use tower_service::Service;
use tracing::Span;

use super::body::LockedBody;
use super::client::{default_client, ready_default_client};
use super::config::{Config, MissingKey};
use super::held::{Held, Release};
use super::key::Extracted;
use super::limit::PermitInfo;
use super::metrics::{self, Answered, Route};
use super::rejection::LockRejection;
use super::remember::fingerprint::RequestFingerprint;
use super::remember::recording::Recording;
use super::remember::stored::Stored;
use super::trace;
use crate::{BackendError, Claim, LockClient, LockError, Scoped};

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// How long a request waits for the default client to connect before it is answered 503.
const CONNECT_BUDGET: Duration = Duration::from_secs(3);

pin_project! {
    /// The response future of [`LockService`](super::LockService).
    ///
    /// Dropping it (the client went away) at any point releases the lock or cancels its
    /// acquisition. A panic of the inner service is held back until the lock is given
    /// back, then goes on unwinding: whatever answers for the panic (a `CatchPanicLayer`'s
    /// `500`) comes after the release.
    pub struct ResponseFuture<F, S, RB>
    where
        S: Service<Request<RB>>,
        S::Response: Answer,
    {
        #[pin]
        state: State<F, S::Future, RB>,
        service: Option<S>,
        config: Arc<Config>,
        missing: Arc<LockRejection>,
        span: Span,
        // When the acquisition started, if the span records it.
        started: Option<Instant>,
        held: Option<Held>,
        lost: Option<BoxFuture<()>>,
        // Remembering layers: the request's fingerprint (from its extracted key).
        fingerprint: Option<RequestFingerprint>,
        // A response whose body has ended, waiting for its lock's release (and storage).
        finished: Option<<S::Response as Answer>::Locked>,
        // For the metrics: the route, where the router names it.
        route: Route,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<F, Fut, RB> {
        Extract { #[pin] fut: F },
        Connect {
            fut: BoxFuture<Result<LockClient, LockError>>,
            request: Option<Request<RB>>,
            name: String,
            take: Take,
        },
        Acquire {
            fut: BoxFuture<Result<Claim, LockError>>,
            request: Option<Request<RB>>,
            client: LockClient,
        },
        Locked { #[pin] fut: Inner<Fut> },
        Unlocked { #[pin] fut: Fut },
        Finishing { release: Release },
        // The inner service panicked: its lock is given back, then the panic goes on.
        Unwinding { release: Release, panic: Option<Panic> },
        Done,
    }
}

mod sealed {
    /// A response of the inner service (an `http::Response`), naming the response the
    /// layer answers with in its place.
    pub trait Answer {
        /// The same response, its body holding the lock.
        type Locked;
    }
}

use sealed::Answer;

impl<B: Body> Answer for Response<B> {
    type Locked = Response<LockedBody<B>>;
}

impl<F, S, RB> ResponseFuture<F, S, RB>
where
    S: Service<Request<RB>>,
    S::Response: Answer,
{
    pub(crate) fn new(
        extract: F,
        missing: Arc<LockRejection>,
        service: S,
        config: Arc<Config>,
        route: Route,
    ) -> Self {
        Self {
            state: State::Extract { fut: extract },
            service: Some(service),
            config,
            missing,
            span: trace::request_span(),
            started: None,
            held: None,
            lost: None,
            fingerprint: None,
            finished: None,
            route,
        }
    }
}

impl<F, S, RB> fmt::Debug for ResponseFuture<F, S, RB>
where
    S: Service<Request<RB>>,
    S::Response: Answer,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture")
            .field("holds_lock", &self.held.is_some())
            .finish_non_exhaustive()
    }
}

pin_project! {
    /// The inner service's future while the request holds its lock or permit: run as
    /// the lock's holder, so that locking inside re-enters; a permit's holder is its own
    /// (the request keeps the holder it had, and a lock taken inside is its own too).
    #[project = InnerProj]
    enum Inner<Fut> {
        AsHolder { #[pin] fut: Scoped<Fut> },
        AsItself { #[pin] fut: Fut },
    }
}

impl<Fut: Future> Future for Inner<Fut> {
    type Output = Fut::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project() {
            InnerProj::AsHolder { fut } => fut.poll(cx),
            InnerProj::AsItself { fut } => fut.poll(cx),
        }
    }
}

/// A caught panic, to resume once the lock is given back (`Sync` as the future may be).
type Panic = SyncWrapper<Box<dyn Any + Send>>;

/// What a request takes: the layer's lock, or a permit of its limit's semaphore of this
/// capacity.
#[derive(Debug, Clone, Copy)]
enum Take {
    Lock,
    Permit(u32),
}

/// What a request needs next, once its key is known or an acquisition has finished.
enum Next<RB> {
    /// Answer with the rejection; the engine's error behind it, if any, is logged with it.
    Reject(LockRejection, Option<LockError>),
    Replay(Stored),
    Pass(Request<RB>),
    Connect(Request<RB>, String, Take),
    Acquire(Request<RB>, LockClient, String, Take),
}

impl<F, S, RB, ResBody> Future for ResponseFuture<F, S, RB>
where
    F: Future<Output = Result<Extracted<RB>, LockRejection>>,
    S: Service<Request<RB>, Response = Response<ResBody>>,
    ResBody: Body,
    ResBody::Data: From<Bytes>,
{
    type Output = Result<Response<LockedBody<ResBody>>, S::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        let span: &Span = this.span;
        let _entered = span.enter();
        loop {
            let next = match this.state.as_mut().project() {
                StateProj::Extract { fut } => match ready!(fut.poll(cx)) {
                    Err(rejection) => Next::Reject(rejection, None),
                    Ok(extracted) => {
                        *this.fingerprint = extracted.fingerprint;
                        route(extracted, this.config, this.missing, span, this.route)
                    }
                },
                StateProj::Connect {
                    fut,
                    request,
                    name,
                    take,
                } => {
                    let connected = ready!(fut.as_mut().poll(cx));
                    let request = take_request(request);
                    match connected {
                        Ok(client) => Next::Acquire(request, client, std::mem::take(name), *take),
                        Err(error) => backend_failed(error, request, this.config, span, this.route),
                    }
                }
                StateProj::Acquire {
                    fut,
                    request,
                    client,
                } => {
                    let acquired = ready!(fut.as_mut().poll(cx));
                    let mut request = take_request(request);
                    if let Some(started) = this.started {
                        span.record("wait_ms", trace::millis(started.elapsed()));
                    }
                    match acquired {
                        Ok(Claim::Completed(stored)) => {
                            match Stored::for_request(stored, *this.fingerprint) {
                                Ok(stored) => {
                                    span.record("outcome", "replayed");
                                    Next::Replay(stored)
                                }
                                Err(rejection) => Next::Reject(rejection, None),
                            }
                        }
                        Ok(Claim::Acquired(guard)) => {
                            let permit = this.config.permits.is_some();
                            span.record("outcome", "acquired");
                            let answered = match permit {
                                true => Answered::Admitted,
                                false => Answered::Locked,
                            };
                            metrics::answered(this.route, answered);
                            let extensions = request.extensions_mut();
                            match permit {
                                true => extensions.insert(PermitInfo::of(&guard)).map(drop),
                                false => extensions.insert(guard.info()).map(drop),
                            };
                            extensions.insert(client.clone());
                            if this.config.abort_on_loss {
                                let lost = guard.lost_signal();
                                *this.lost = Some(Box::pin(async move { lost.wait().await }));
                            }
                            let holder = guard.holder().clone();
                            let times = &this.config.hold_times.0;
                            let ticket = times.begin(guard.key(), this.route.as_str());
                            *this.held = Some(Held::new(guard, span.clone(), ticket));
                            let fut = call(this.service, request);
                            let fut = match permit {
                                true => Inner::AsItself { fut },
                                false => Inner::AsHolder {
                                    fut: holder.scope(fut),
                                },
                            };
                            this.state.set(State::Locked { fut });
                            continue;
                        }
                        // Only an outage may be ridden out unlocked (`fail_open`).
                        Err(error @ LockError::Backend(_)) => {
                            backend_failed(error, request, this.config, span, this.route)
                        }
                        Err(error) => {
                            let config: &Config = this.config;
                            let rejection = LockRejection::from_refusal(
                                &error,
                                config.refused_status,
                                config.permits.is_some(),
                                (client, &config.hold_times.0, this.route.as_str()),
                            );
                            Next::Reject(rejection, Some(error))
                        }
                    }
                }
                StateProj::Locked { fut } => {
                    let polled = panic::catch_unwind(AssertUnwindSafe(|| fut.poll(cx)));
                    let polled = match polled {
                        Ok(polled) => polled,
                        Err(panic) => {
                            // Give the lock back before the panic leaves the layer, so that
                            // no answer to it comes before the release (the handler's
                            // future, broken, is dropped first).
                            this.state.set(State::Done);
                            this.lost.take();
                            let Some(release) = this.held.take().and_then(|h| h.finish(false))
                            else {
                                panic::resume_unwind(panic)
                            };
                            span.record("outcome", "handler panicked");
                            let panic = Some(SyncWrapper::new(panic));
                            this.state.set(State::Unwinding { release, panic });
                            continue;
                        }
                    };
                    if let Poll::Ready(result) = polled {
                        this.state.set(State::Done);
                        this.lost.take();
                        let held = this.held.take();
                        // An error from the inner service: the lock goes with `held`.
                        let response = result?;
                        let Some(mut held) = held else {
                            return Poll::Ready(Ok(response.map(LockedBody::new)));
                        };
                        let (head, body) = response.into_parts();
                        if let (Some(remembering), Some(fingerprint)) =
                            (&this.config.remember, *this.fingerprint)
                        {
                            held.record(Recording::start(&head, fingerprint, remembering));
                        }
                        let (body, release) = LockedBody::read_ahead(body, held, cx);
                        let response = Response::from_parts(head, body);
                        // A body that has ended already: finish (store, release) first.
                        let Some(release) = release else {
                            return Poll::Ready(Ok(response));
                        };
                        *this.finished = Some(response);
                        this.state.set(State::Finishing { release });
                        continue;
                    }
                    let lost = this.lost.as_mut().map(|lost| lost.as_mut().poll(cx));
                    if !matches!(lost, Some(Poll::Ready(()))) {
                        return Poll::Pending;
                    }
                    tracing::warn!("lock lost while the handler ran; stopping the request");
                    // Dropping the inner future stops the handler.
                    this.state.set(State::Done);
                    this.lost.take();
                    this.held.take();
                    span.record("outcome", "lost");
                    metrics::answered(this.route, Answered::Rejected(&LockRejection::Lost));
                    return Poll::Ready(Ok(LockRejection::Lost.to_response()));
                }
                StateProj::Unlocked { fut } => {
                    let result = ready!(fut.poll(cx));
                    this.state.set(State::Done);
                    return Poll::Ready(result.map(|response| response.map(LockedBody::new)));
                }
                StateProj::Finishing { release } => {
                    // A failed release was logged by itself; the answer stands.
                    ready!(Pin::new(release).poll(cx));
                    this.state.set(State::Done);
                    return match this.finished.take() {
                        Some(response) => Poll::Ready(Ok(response)),
                        None => panic!("ResponseFuture polled after completion"),
                    };
                }
                StateProj::Unwinding { release, panic } => {
                    // A failed release was logged by itself; the panic goes on regardless.
                    ready!(Pin::new(release).poll(cx));
                    let panic = panic.take();
                    this.state.set(State::Done);
                    match panic {
                        Some(panic) => panic::resume_unwind(panic.into_inner()),
                        None => panic!("ResponseFuture polled after completion"),
                    }
                }
                StateProj::Done => panic!("ResponseFuture polled after completion"),
            };
            match next {
                Next::Reject(rejection, cause) => {
                    span.record("outcome", rejection.outcome());
                    metrics::answered(this.route, Answered::Rejected(&rejection));
                    rejection.log(cause.as_ref(), "the lock layer");
                    this.state.set(State::Done);
                    return Poll::Ready(Ok(rejection.to_response()));
                }
                Next::Replay(stored) => {
                    metrics::answered(this.route, Answered::Replayed);
                    this.state.set(State::Done);
                    return Poll::Ready(Ok(stored.into_response()));
                }
                Next::Pass(request) => {
                    let fut = call(this.service, request);
                    this.state.set(State::Unlocked { fut });
                }
                Next::Connect(request, name, take) => {
                    let fut: BoxFuture<_> = Box::pin(async {
                        match tokio::time::timeout(CONNECT_BUDGET, default_client()).await {
                            Ok(connected) => connected,
                            Err(_) => {
                                Err(LockError::Backend(BackendError::TimedOut(CONNECT_BUDGET)))
                            }
                        }
                    });
                    this.state.set(State::Connect {
                        fut,
                        request: Some(request),
                        name,
                        take,
                    });
                }
                Next::Acquire(request, client, name, take) => {
                    *this.started = trace::clock(span);
                    let (wait, lease) = (this.config.wait, this.config.lease);
                    // The core's acquire is an `async fn`: its future has no name to store.
                    let fut: BoxFuture<_> = match take {
                        Take::Lock => {
                            // No holder given: the core makes one for this request (or
                            // takes an enclosing request's), and can then settle an acquire
                            // whose reply was lost without holding the key for a whole lease.
                            let mut lock = client.lock(&name);
                            if let Some(lease) = lease {
                                lock = lock.lease(lease);
                            }
                            let remember = this.config.remember.is_some();
                            Box::pin(async move {
                                if remember {
                                    lock.try_claim(wait).await
                                } else {
                                    lock.try_acquire(wait).await.map(Claim::Acquired)
                                }
                            })
                        }
                        Take::Permit(capacity) => {
                            let mut permits = client.semaphore(&name, capacity);
                            if let Some(lease) = lease {
                                permits = permits.lease(lease);
                            }
                            Box::pin(
                                async move { permits.try_acquire(wait).await.map(Claim::Acquired) },
                            )
                        }
                    };
                    this.state.set(State::Acquire {
                        fut,
                        request: Some(request),
                        client,
                    });
                }
            }
        }
    }
}

fn take_request<RB>(request: &mut Option<Request<RB>>) -> Request<RB> {
    match request.take() {
        Some(request) => request,
        None => panic!("ResponseFuture polled after completion"),
    }
}

fn call<S: Service<Request<RB>>, RB>(service: &mut Option<S>, request: Request<RB>) -> S::Future {
    match service.take() {
        Some(mut service) => service.call(request),
        None => panic!("ResponseFuture polled after completion"),
    }
}

/// Decides what a request with this key (or none) needs next.
fn route<RB>(
    extracted: Extracted<RB>,
    config: &Config,
    missing: &LockRejection,
    span: &Span,
    route: &Route,
) -> Next<RB> {
    let Extracted { request, key, .. } = extracted;
    let on_missing = |request, missing: LockRejection| match config.missing_key {
        MissingKey::PassUnlocked => {
            span.record("outcome", "missing key, passed unlocked");
            metrics::answered(route, Answered::PassedUnlocked);
            Next::Pass(request)
        }
        MissingKey::Reject => Next::Reject(missing, None),
    };
    let Some(key) = key else {
        return on_missing(request, missing.clone());
    };
    // The namespace would make an empty key a valid name: one lock for every such request.
    if key.is_empty() {
        let empty = LockRejection::InvalidKey {
            detail: "The lock key is empty.".to_owned(),
        };
        return Next::Reject(empty, None);
    }
    let (parts, body) = request.into_parts();
    let scope = match &config.scope {
        None => None,
        Some(scope) => match scope(&parts) {
            Some(scope) => Some(scope),
            // The key is there: say what is missing is the scope.
            None => return on_missing(Request::from_parts(parts, body), no_scope()),
        },
    };
    let take = match &config.permits {
        Some(capacity) => Take::Permit(capacity.of(&parts)),
        None => Take::Lock,
    };
    let request = Request::from_parts(parts, body);
    let name = config.lock_name(scope.as_deref(), &key);
    trace::record_key(span, &name, config.redact_keys);
    match config.client.clone().or_else(ready_default_client) {
        Some(client) => Next::Acquire(request, client, name, take),
        None => Next::Connect(request, name, take),
    }
}

/// The answer to a request whose key is there but whose scope is not.
fn no_scope() -> LockRejection {
    LockRejection::MissingKey {
        status: http::StatusCode::BAD_REQUEST,
        detail: "The request has no scope for its lock key: the layer places each key under \
                 a scope taken from the request (such as the authenticated caller), and \
                 found none."
            .to_owned(),
    }
}

/// The store failed: pass unlocked when failing open, otherwise 503. Only an outage is
/// ridden out unlocked: a store that is not configured at all is none (failing open
/// would run every request unlocked), nor is any other error (a client shut down, an
/// error no acquisition should get).
fn backend_failed<RB>(
    error: LockError,
    request: Request<RB>,
    config: &Config,
    span: &Span,
    route: &Route,
) -> Next<RB> {
    let outage =
        matches!(&error, LockError::Backend(e) if !matches!(e, BackendError::NotConfigured(_)));
    if config.fail_open && outage {
        tracing::warn!(%error, "lock store unavailable; failing open: the request runs without its lock");
        span.record("outcome", "backend error, failed open");
        metrics::answered(route, Answered::FailedOpen);
        return Next::Pass(request);
    }
    let rejection =
        LockRejection::from_lock_error(&error, config.refused_status, config.permits.is_some());
    Next::Reject(rejection, Some(error))
}
