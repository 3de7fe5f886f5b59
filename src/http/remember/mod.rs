//! Idempotency: a layer made with [`LockLayer::remember`](crate::LockLayer::remember)
//! stores each completed response and answers a retry with the same key from the store.
//!
//! The request side reads and fingerprints the request ([`Remember`], the key source that
//! wraps the layer's own); the response side records the response while its body streams
//! and stores it when the body completes, just before the lock is released; a claim that
//! finds a stored response replays it if the fingerprints match.
//!
//! | file | owns |
//! |---|---|
//! | `source.rs` | [`Remember`], [`RememberFuture`]: read the body, fingerprint, find the key |
//! | `fingerprint.rs` | [`Fingerprint`] (what makes a retry the same request) and the digest of one request |
//! | `config.rs` | the remembering settings the response side needs; [`DEFAULT_MAX_STORED_BODY`] |
//! | `recording.rs` | recording a response while its body streams |
//! | `stored.rs` | the stored form of a response, and the replay built from it ([`IDEMPOTENCY_REPLAYED`]) |
//!
//! This file only declares and re-exports; the files import each other by path, never
//! through here, and the rest of `http` names the crate-internal items by their file.

pub(super) mod config;
pub(super) mod fingerprint;
pub(super) mod recording;
pub(super) mod source;
pub(super) mod stored;

pub use config::DEFAULT_MAX_STORED_BODY;
pub use fingerprint::Fingerprint;
pub use source::{Remember, RememberFuture};
pub use stored::IDEMPOTENCY_REPLAYED;
