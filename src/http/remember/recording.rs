//! [`Recording`]: a response recorded while its body streams, up to the stored-body limit,
//! and turned into its stored form once the body has completed.

use std::time::Duration;

use bytes::{Buf, Bytes, BytesMut};
use http::header::CONTENT_TYPE;
use http::response::Parts;

use super::config::Remembering;
use super::fingerprint::RequestFingerprint;
use super::stored::Stored;

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

    /// Records a chunk of the body on its way to the client, and hands it on.
    pub(crate) fn record<D: Buf + From<Bytes>>(&mut self, mut data: D) -> D {
        let bytes = data.copy_to_bytes(data.remaining());
        self.push(&bytes);
        D::from(bytes)
    }

    fn push(&mut self, chunk: &[u8]) {
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
