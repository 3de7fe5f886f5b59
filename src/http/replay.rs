//! Idempotent replay, response side: a response recorded while it streams, its stored
//! form, and the replayed response built from it.
//!
//! Stored form (version 1), all integers big-endian:
//! `"LW1"`, fingerprint (32 bytes), status (u16), header count (u16), per header its name
//! length (u16), name, value length (u32), value; the rest is the body.

use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use http::header::CONTENT_TYPE;
use http::response::Parts;
use http::{HeaderName, HeaderValue, Response, StatusCode};

use super::body::LockedBody;
use super::remember::{Remembering, RequestFingerprint};

const MAGIC: &[u8; 3] = b"LW1";

/// The header a replayed response carries.
pub const IDEMPOTENCY_REPLAYED: HeaderName = HeaderName::from_static("idempotency-replayed");

/// A completed response as kept in the store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Stored {
    pub(crate) fingerprint: RequestFingerprint,
    pub(crate) status: StatusCode,
    pub(crate) headers: Vec<(HeaderName, HeaderValue)>,
    pub(crate) body: Bytes,
}

impl Stored {
    pub(crate) fn encode(&self) -> Vec<u8> {
        let headers: usize = self
            .headers
            .iter()
            .map(|(n, v)| 6 + n.as_str().len() + v.len())
            .sum();
        let mut out = Vec::with_capacity(3 + 32 + 4 + headers + self.body.len());
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&self.fingerprint.0);
        out.put_u16(self.status.as_u16());
        out.put_u16(self.headers.len() as u16);
        for (name, value) in &self.headers {
            out.put_u16(name.as_str().len() as u16);
            out.extend_from_slice(name.as_str().as_bytes());
            out.put_u32(value.len() as u32);
            out.extend_from_slice(value.as_bytes());
        }
        out.extend_from_slice(&self.body);
        out
    }

    /// `None` for bytes this version did not write (another version, or not ours).
    pub(crate) fn decode(bytes: Vec<u8>) -> Option<Self> {
        let bytes = Bytes::from(bytes);
        let mut at = Reader(&bytes, 0);
        if at.take(3)? != MAGIC {
            return None;
        }
        let fingerprint = RequestFingerprint(at.take(32)?.try_into().ok()?);
        let status = StatusCode::from_u16(at.u16()?).ok()?;
        let count = at.u16()?;
        let mut headers = Vec::with_capacity(usize::from(count));
        for _ in 0..count {
            let len = usize::from(at.u16()?);
            let name = HeaderName::from_bytes(at.take(len)?).ok()?;
            let len = at.u32()? as usize;
            let value = HeaderValue::from_bytes(at.take(len)?).ok()?;
            headers.push((name, value));
        }
        let body = bytes.slice(at.1..);
        Some(Self {
            fingerprint,
            status,
            headers,
            body,
        })
    }

    /// The replayed response: stored status, headers and body, marked as a replay.
    pub(crate) fn into_response<B: http_body::Body>(self) -> Response<LockedBody<B>> {
        let mut response = Response::new(LockedBody::from(self.body));
        *response.status_mut() = self.status;
        let headers = response.headers_mut();
        for (name, value) in self.headers {
            headers.append(name, value);
        }
        headers.insert(IDEMPOTENCY_REPLAYED, HeaderValue::from_static("true"));
        response
    }
}

struct Reader<'a>(&'a [u8], usize);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let out = self.0.get(self.1..self.1.checked_add(n)?)?;
        self.1 += n;
        Some(out)
    }

    fn u16(&mut self) -> Option<u16> {
        Some(u16::from_be_bytes(self.take(2)?.try_into().ok()?))
    }

    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_be_bytes(self.take(4)?.try_into().ok()?))
    }
}

/// A response being recorded while its body streams.
pub(crate) struct Recording {
    stored: Stored,
    body: BytesMut,
    limit: usize,
    overflowed: bool,
    keep: Duration,
}

impl Recording {
    /// Starts recording `head` if its status is one to remember.
    pub(crate) fn start(
        head: &Parts,
        fingerprint: RequestFingerprint,
        remembering: &Remembering,
    ) -> Option<Self> {
        if !(remembering.store_if)(head.status) {
            return None;
        }
        let wanted = std::iter::once(&CONTENT_TYPE).chain(&remembering.replay_headers);
        let headers = wanted
            .flat_map(|name| {
                head.headers
                    .get_all(name)
                    .iter()
                    .map(move |value| (name.clone(), value.clone()))
            })
            .collect();
        Some(Self {
            stored: Stored {
                fingerprint,
                status: head.status,
                headers,
                body: Bytes::new(),
            },
            body: BytesMut::new(),
            limit: remembering.max_stored_body,
            overflowed: false,
            keep: remembering.keep,
        })
    }

    pub(crate) fn push(&mut self, chunk: &[u8]) {
        if self.overflowed || self.body.len() + chunk.len() > self.limit {
            self.overflowed = true;
            self.body = BytesMut::new();
            return;
        }
        self.body.extend_from_slice(chunk);
    }

    /// The stored form and how long to keep it; `None` if the body was over the limit.
    pub(crate) fn finish(mut self) -> Option<(Vec<u8>, Duration)> {
        if self.overflowed {
            tracing::warn!(
                limit = self.limit,
                "response body over the limit for remembered responses: not stored; a retry runs the handler again"
            );
            return None;
        }
        self.stored.body = self.body.freeze();
        Some((self.stored.encode(), self.keep))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stored_responses_round_trip() {
        let stored = Stored {
            fingerprint: RequestFingerprint([7; 32]),
            status: StatusCode::CREATED,
            headers: vec![
                (CONTENT_TYPE, HeaderValue::from_static("application/json")),
                (
                    HeaderName::from_static("location"),
                    HeaderValue::from_static("/orders/9"),
                ),
            ],
            body: Bytes::from_static(b"{\"id\":9}\xff"),
        };
        assert_eq!(Stored::decode(stored.encode()), Some(stored));
    }

    #[test]
    fn foreign_or_truncated_bytes_are_refused() {
        let stored = Stored {
            fingerprint: RequestFingerprint([1; 32]),
            status: StatusCode::OK,
            headers: vec![(CONTENT_TYPE, HeaderValue::from_static("text/plain"))],
            body: Bytes::new(),
        };
        let bytes = stored.encode();
        for cut in 0..bytes.len() {
            // Any cut inside the head is refused; a cut body would be refused by length
            // only if we stored one, so the body here is empty.
            assert_eq!(Stored::decode(bytes[..cut].to_vec()), None, "cut at {cut}");
        }
        assert_eq!(Stored::decode(b"{\"json\":1}".to_vec()), None);
    }
}
