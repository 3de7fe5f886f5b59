//! [`ReadBody`]: reads a request body into memory up to a limit, for the key sources and
//! the fingerprint that need the bytes before the inner service gets them.

use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use bytes::Bytes;
use http::header::CONTENT_LENGTH;
use http::request::Parts;
use http::{Request, StatusCode};
use http_body::Body;
use http_body_util::combinators::Collect;
use http_body_util::{BodyExt, LengthLimitError, Limited};
use pin_project_lite::pin_project;

use super::rejection::Rejection;

pub(crate) type BoxError = Box<dyn std::error::Error + Send + Sync>;

pin_project! {
    /// Reads the body of a request, answering `413` past `limit` bytes (at once when the
    /// declared `Content-Length` says so) and `400` when the body fails to arrive.
    pub(crate) struct ReadBody<B>
    where
        B: Body,
        B::Error: Into<BoxError>,
    {
        #[pin]
        collect: Option<Collect<Limited<B>>>,
        parts: Option<Parts>,
        limit: usize,
    }
}

impl<B> ReadBody<B>
where
    B: Body,
    B::Error: Into<BoxError>,
{
    pub(crate) fn new(request: Request<B>, limit: usize) -> Self {
        let (parts, body) = request.into_parts();
        let declared = parts
            .headers
            .get(CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        let too_large = declared.is_some_and(|len| len > limit as u64);
        Self {
            collect: (!too_large).then(|| Limited::new(body, limit).collect()),
            parts: Some(parts),
            limit,
        }
    }
}

impl<B> Future for ReadBody<B>
where
    B: Body,
    B::Error: Into<BoxError>,
{
    type Output = Result<(Parts, Bytes), Rejection>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let limit = *this.limit;
        let Some(collect) = this.collect.as_pin_mut() else {
            return Poll::Ready(Err(Rejection::BodyTooLarge { limit }));
        };
        let bytes = match ready!(collect.poll(cx)) {
            Ok(collected) => collected.to_bytes(),
            Err(e) if e.is::<LengthLimitError>() => {
                return Poll::Ready(Err(Rejection::BodyTooLarge { limit }))
            }
            Err(e) => {
                return Poll::Ready(Err(Rejection::InvalidBody {
                    status: StatusCode::BAD_REQUEST,
                    detail: format!("The request body could not be read: {e}."),
                }))
            }
        };
        match this.parts.take() {
            Some(parts) => Poll::Ready(Ok((parts, bytes))),
            // Polled again after completion: a caller bug; answer as an unreadable body.
            None => Poll::Ready(Err(Rejection::InvalidBody {
                status: StatusCode::BAD_REQUEST,
                detail: "The request body was already consumed.".to_owned(),
            })),
        }
    }
}
