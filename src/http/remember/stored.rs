//! [`Stored`]: a completed response as kept in the store (its encoding), and the replayed
//! response built from it.
//!
//! Stored form (version 1), all integers big-endian:
//! `"LW1"`, fingerprint (32 bytes), status (u16), header count (u16), per header its name
//! length (u16), name, value length (u32), value; the rest is the body.

use bytes::{BufMut, Bytes};
use http::{HeaderName, HeaderValue, Response, StatusCode};

use super::fingerprint::RequestFingerprint;
use crate::http::rejection::Rejection;

const MAGIC: &[u8; 3] = b"LW1";

/// The header a replayed response carries.
pub const IDEMPOTENCY_REPLAYED: HeaderName = HeaderName::from_static("idempotency-replayed");

/// A completed response as kept in the store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stored {
    pub(super) fingerprint: RequestFingerprint,
    pub(super) status: StatusCode,
    pub(super) headers: Vec<(HeaderName, HeaderValue)>,
    pub(super) body: Bytes,
}

impl Stored {
    /// What a claim that found `bytes` stored for its key answers a request with
    /// `fingerprint`: the stored response if it is the same request, `422` if it is
    /// another one that reuses the key, `503` if the bytes cannot be read.
    pub(crate) fn for_request(
        bytes: Vec<u8>,
        fingerprint: Option<RequestFingerprint>,
    ) -> Result<Self, Rejection> {
        match Self::decode(bytes) {
            Some(stored) if Some(stored.fingerprint) == fingerprint => Ok(stored),
            Some(_) => Err(Rejection::KeyReused),
            None => {
                tracing::error!(
                    "a remembered response could not be read (written by another version?)"
                );
                Err(Rejection::Unavailable {
                    detail: "The stored response for this key could not be read.".to_owned(),
                    // Another version of the server may read it.
                    retry_after: None,
                })
            }
        }
    }

    pub(super) fn encode(&self) -> Vec<u8> {
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
    fn decode(bytes: Vec<u8>) -> Option<Self> {
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

    /// The replayed response: stored status, headers and body, marked as a replay. Any
    /// body type made from [`Bytes`] will do (the layer's is `HeldBody`).
    pub(crate) fn into_response<B: From<Bytes>>(self) -> Response<B> {
        let mut response = Response::new(B::from(self.body));
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

#[cfg(test)]
mod tests {
    use super::*;
    use http::header::CONTENT_TYPE;

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
