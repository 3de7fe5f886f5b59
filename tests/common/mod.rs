//! Shared set-up for the root package's (HTTP) integration tests.
//!
//! The lock stores (`Env`), the `conformance!` macro and the key layout oracle are the
//! engine's, shared from `crates/lockwarden-core/tests/common` rather than copied; they
//! name `lockwarden_core`, which is `lockwarden`'s re-exported core.
#![allow(dead_code)]

#[path = "../../crates/lockwarden-core/tests/common/mod.rs"]
mod engine;

// Not every test binary uses the engine's helpers.
#[allow(unused_imports)]
pub use engine::*;

pub mod web;
