//! [`ResponseFuture`]: one request through a keyed layer, for every policy — extract the
//! key, have the policy admit the request, call the inner service as the policy runs it,
//! and move what was taken into the response body. Each phase's data lives in its state.

use std::any::Any;
use std::fmt;
use std::future::Future;
use std::panic::{self, AssertUnwindSafe};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Instant;

use bytes::Bytes;
use http::{Request, Response};
use http_body::Body;
use pin_project_lite::pin_project;
use sync_wrapper::SyncWrapper;
use tower_service::Service;
use tracing::Span;

use super::admission::{Admission, BoxFuture, Refusal, Verdict};
use super::body::HeldBody;
use super::config::{MissingKey, Shared};
use super::held::Release;
use super::key::Extracted;
use super::metrics::{self, Answered, Route};
use super::rejection::Rejection;
use super::trace;
use crate::{BackendError, LockError};

pin_project! {
    /// The response future of [`KeyedService`](super::KeyedService).
    ///
    /// Dropping it (the client went away) at any point gives back what the request took
    /// (a lock, a permit) or cancels its acquisition. A panic of the inner service is held
    /// back until that is given back, then goes on unwinding: whatever answers for the
    /// panic (a `CatchPanicLayer`'s `500`) comes after the release.
    pub struct ResponseFuture<F, S, RB, P>
    where
        S: Service<Request<RB>>,
        S::Response: Answer,
        P: Admission,
    {
        #[pin]
        state: State<
            F,
            S::Future,
            P::Run<S::Future>,
            RB,
            P::Grant,
            P::Taken,
            <S::Response as Answer>::Held,
        >,
        service: S,
        shared: Arc<Shared<P>>,
        missing: Arc<Rejection>,
        span: Span,
        // For the metrics and the `Retry-After` estimates: the route, where the router
        // names it.
        route: Route,
    }
}

pin_project! {
    #[project = StateProj]
    #[project_replace = StateReplace]
    enum State<F, Fut, Run, RB, G, T, Done> {
        // Finding the key (and, remembering, the fingerprint).
        Extract { #[pin] fut: F },
        // The policy admitting the request; when it began, if the span records it.
        Admit { fut: BoxFuture<Verdict<G>>, request: Request<RB>, started: Option<Instant> },
        // The inner service running with what the request took.
        Admitted { #[pin] fut: Run, taken: T },
        // The inner service running with nothing taken (no key, or failed open).
        Passed { #[pin] fut: Fut },
        // A response whose body has ended, waiting for the release (and storage).
        Finishing { release: Release, response: Done },
        // The inner service panicked: what it took is given back, then the panic goes on.
        Unwinding { release: Release, panic: Panic },
        Done,
    }
}

mod sealed {
    /// A response of the inner service (an `http::Response`), naming the response the
    /// layer answers with in its place.
    pub trait Answer {
        /// The same response, its body holding what the request took.
        type Held;
    }
}

use sealed::Answer;

impl<B: Body> Answer for Response<B> {
    type Held = Response<HeldBody<B>>;
}

/// A caught panic, to resume once what the request took is given back (`Sync` as the
/// future may be).
type Panic = SyncWrapper<Box<dyn Any + Send>>;

impl<F, S, RB, P> ResponseFuture<F, S, RB, P>
where
    S: Service<Request<RB>>,
    S::Response: Answer,
    P: Admission,
{
    pub(crate) fn new(
        extract: F,
        missing: Arc<Rejection>,
        service: S,
        shared: Arc<Shared<P>>,
        route: Route,
    ) -> Self {
        Self {
            state: State::Extract { fut: extract },
            service,
            shared,
            missing,
            span: trace::request_span(),
            route,
        }
    }
}

impl<F, S, RB, P> fmt::Debug for ResponseFuture<F, S, RB, P>
where
    S: Service<Request<RB>>,
    S::Response: Answer,
    P: Admission,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.state {
            State::Extract { .. } => "extract",
            State::Admit { .. } => "admit",
            State::Admitted { .. } => "admitted",
            State::Passed { .. } => "passed",
            State::Finishing { .. } => "finishing",
            State::Unwinding { .. } => "unwinding",
            State::Done => "done",
        };
        f.debug_struct("ResponseFuture")
            .field("state", &state)
            .finish_non_exhaustive()
    }
}

/// What a request whose key is known needs next.
enum Next<RB, G> {
    Admit(BoxFuture<Verdict<G>>, Request<RB>),
    Pass(Request<RB>),
    Refuse(Refusal),
}

impl<F, S, RB, P, ResBody> Future for ResponseFuture<F, S, RB, P>
where
    F: Future<Output = Result<Extracted<RB>, Rejection>>,
    S: Service<Request<RB>, Response = Response<ResBody>>,
    P: Admission,
    ResBody: Body,
    ResBody::Data: From<Bytes>,
{
    type Output = Result<Response<HeldBody<ResBody>>, S::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        let span: &Span = this.span;
        let _entered = span.enter();
        let shared: &Shared<P> = this.shared;
        loop {
            let next = match this.state.as_mut().project() {
                StateProj::Extract { fut } => match ready!(fut.poll(cx)) {
                    Err(rejection) => Next::Refuse(rejection.into()),
                    Ok(extracted) => route(extracted, shared, this.missing, span, this.route),
                },
                StateProj::Admit { fut, started, .. } => {
                    let verdict = ready!(fut.as_mut().poll(cx));
                    if let Some(started) = started {
                        span.record("wait_ms", trace::millis(started.elapsed()));
                    }
                    let StateReplace::Admit { mut request, .. } =
                        this.state.as_mut().project_replace(State::Done)
                    else {
                        unreachable!("the state is the one matched above")
                    };
                    match verdict {
                        Verdict::Admit(grant) => {
                            span.record("outcome", P::OUTCOME);
                            metrics::answered(this.route, P::ADMITTED);
                            let extensions = request.extensions_mut();
                            let taken = shared.policy.take(grant, extensions, span, this.route);
                            let fut = P::run(&taken, this.service.call(request));
                            this.state.set(State::Admitted { fut, taken });
                            continue;
                        }
                        Verdict::Replay(stored) => {
                            span.record("outcome", "replayed");
                            metrics::answered(this.route, Answered::Replayed);
                            return Poll::Ready(Ok(stored.into_response()));
                        }
                        Verdict::Refuse(refusal) => Next::Refuse(refusal),
                        Verdict::Fail(error) => failed(error, request, shared, span, this.route),
                    }
                }
                StateProj::Admitted { fut, taken } => {
                    let polled = match panic::catch_unwind(AssertUnwindSafe(|| fut.poll(cx))) {
                        Ok(polled) => polled,
                        Err(panic) => {
                            // Give back what the request took before the panic leaves the
                            // layer, so that no answer to it comes before the release (the
                            // handler's future, broken, is dropped first).
                            let StateReplace::Admitted { taken, .. } =
                                this.state.as_mut().project_replace(State::Done)
                            else {
                                unreachable!("the state is the one matched above")
                            };
                            let Some(release) = P::give_back(taken).and_then(|h| h.finish(false))
                            else {
                                panic::resume_unwind(panic)
                            };
                            span.record("outcome", "handler panicked");
                            let panic = SyncWrapper::new(panic);
                            this.state.set(State::Unwinding { release, panic });
                            continue;
                        }
                    };
                    let Poll::Ready(result) = polled else {
                        if P::poll_lost(taken, cx).is_pending() {
                            return Poll::Pending;
                        }
                        tracing::warn!("lock lost while the handler ran; stopping the request");
                        // Dropping the inner future stops the handler; the hold is given
                        // back in the background.
                        this.state.set(State::Done);
                        span.record("outcome", "lost");
                        metrics::answered(this.route, Answered::Rejected(&Rejection::Lost));
                        return Poll::Ready(Ok(Rejection::Lost.to_response()));
                    };
                    let StateReplace::Admitted { taken, .. } =
                        this.state.as_mut().project_replace(State::Done)
                    else {
                        unreachable!("the state is the one matched above")
                    };
                    // An error from the inner service: what was taken goes with `taken`.
                    let (mut head, body) = result?.into_parts();
                    let Some(held) = shared.policy.respond(taken, &mut head) else {
                        return Poll::Ready(Ok(Response::from_parts(head, HeldBody::new(body))));
                    };
                    let (body, release) = HeldBody::read_ahead(body, held, cx);
                    let response = Response::from_parts(head, body);
                    // A body that has ended already: finish (store, release) first.
                    let Some(release) = release else {
                        return Poll::Ready(Ok(response));
                    };
                    this.state.set(State::Finishing { release, response });
                    continue;
                }
                StateProj::Passed { fut } => {
                    let result = ready!(fut.poll(cx));
                    this.state.set(State::Done);
                    return Poll::Ready(result.map(|response| response.map(HeldBody::new)));
                }
                StateProj::Finishing { release, .. } => {
                    // A failed release was logged by itself; the answer stands.
                    ready!(Pin::new(release).poll(cx));
                    let StateReplace::Finishing { response, .. } =
                        this.state.as_mut().project_replace(State::Done)
                    else {
                        unreachable!("the state is the one matched above")
                    };
                    return Poll::Ready(Ok(response));
                }
                StateProj::Unwinding { release, .. } => {
                    // A failed release was logged by itself; the panic goes on regardless.
                    ready!(Pin::new(release).poll(cx));
                    let StateReplace::Unwinding { panic, .. } =
                        this.state.as_mut().project_replace(State::Done)
                    else {
                        unreachable!("the state is the one matched above")
                    };
                    panic::resume_unwind(panic.into_inner())
                }
                StateProj::Done => panic!("ResponseFuture polled after completion"),
            };
            match next {
                Next::Admit(fut, request) => {
                    let started = trace::clock(span);
                    this.state.set(State::Admit {
                        fut,
                        request,
                        started,
                    });
                }
                Next::Pass(request) => {
                    let fut = this.service.call(request);
                    this.state.set(State::Passed { fut });
                }
                Next::Refuse(refusal) => {
                    this.state.set(State::Done);
                    return Poll::Ready(Ok(refuse(refusal, P::BY, span, this.route)));
                }
            }
        }
    }
}

/// Decides what a request with this key (or none) needs next.
fn route<RB, P: Admission>(
    extracted: Extracted<RB>,
    shared: &Shared<P>,
    missing: &Rejection,
    span: &Span,
    route: &Route,
) -> Next<RB, P::Grant> {
    let settings = &shared.settings;
    let Extracted {
        request,
        key,
        fingerprint,
    } = extracted;
    let on_missing = |request, missing: Rejection| match settings.missing_key {
        MissingKey::PassUnlocked => {
            span.record("outcome", "missing key, passed unlocked");
            metrics::answered(route, Answered::PassedUnlocked);
            Next::Pass(request)
        }
        MissingKey::Reject => Next::Refuse(missing.into()),
    };
    let Some(key) = key else {
        return on_missing(request, missing.clone());
    };
    // A namespace would make an empty key a valid name: one key for every such request.
    if key.is_empty() {
        let empty = Rejection::InvalidKey {
            detail: "The key is empty.".to_owned(),
        };
        return Next::Refuse(empty.into());
    }
    let (parts, body) = request.into_parts();
    let scope = match &settings.scope {
        None => None,
        Some(scope) => match scope(&parts) {
            Some(scope) => Some(scope),
            // The key is there: say what is missing is the scope.
            None => return on_missing(Request::from_parts(parts, body), no_scope()),
        },
    };
    let name = shared.policy.name(scope.as_deref(), &key);
    trace::record_key(span, &name, settings.redact_keys);
    let admit = shared.policy.admit(&parts, name, fingerprint, route);
    Next::Admit(admit, Request::from_parts(parts, body))
}

/// The answer to a request whose key is there but whose scope is not.
fn no_scope() -> Rejection {
    Rejection::MissingKey {
        status: http::StatusCode::BAD_REQUEST,
        detail: "The request has no scope for its key: the layer places each key under a \
                 scope taken from the request (such as the authenticated caller), and found \
                 none."
            .to_owned(),
    }
}

/// The store failed: pass without holding anything when failing open, otherwise 503. Only
/// an outage is ridden out so: a store that is not configured at all is none (failing
/// open would run every request unguarded).
fn failed<RB, P>(
    error: LockError,
    request: Request<RB>,
    shared: &Shared<P>,
    span: &Span,
    route: &Route,
) -> Next<RB, P::Grant>
where
    P: Admission,
{
    let outage =
        matches!(&error, LockError::Backend(e) if !matches!(e, BackendError::NotConfigured(_)));
    if shared.settings.fail_open && outage {
        tracing::warn!(%error, "store unavailable; failing open: the request runs without {}", P::TAKES);
        span.record("outcome", "backend error, failed open");
        metrics::answered(route, Answered::FailedOpen);
        return Next::Pass(request);
    }
    let rejection = Rejection::from_lock_error(&error);
    Next::Refuse(Refusal {
        rejection,
        cause: Some(error),
        headers: http::HeaderMap::new(),
    })
}

/// The answer to a refused request, counted and logged as loud as it is.
fn refuse<B: From<Bytes>>(
    refusal: Refusal,
    by: &'static str,
    span: &Span,
    route: &Route,
) -> Response<B> {
    let Refusal {
        rejection,
        cause,
        headers,
    } = refusal;
    span.record("outcome", rejection.outcome());
    metrics::answered(route, Answered::Rejected(&rejection));
    rejection.log(cause.as_ref(), by);
    let mut response = rejection.to_response();
    response.headers_mut().extend(headers);
    response
}
