//! The manual: what the API pages of each type do not say on their own.
//!
//! | page | what it covers |
//! |---|---|
//! | [`connecting`] | one server, TLS, Redis Cluster, Sentinel, a client or pool you already have; ACL users and the least privileges lockwarden needs |
//! | [`how_it_works`] | how each lock kind and the rate limiter are kept in Redis (keys, channels, scripts), the watchdog, waiting, lost replies, fencing tokens, and the design decisions behind them |
//! | [`operating`] | running it in production: memory policy, persistence and clocks, failover, force-unlock, shutdown, metrics, the inspector |
//!
//! Where a page and a type's documentation say the same thing, the type's is the
//! reference: the HTTP layer is documented on `LockLayer` (and idempotent replay on
//! `LockLayer::remember`) in the `lockwarden` crate, Redlock on [`Redlock`](crate::Redlock),
//! each lock kind on its handle ([`Lock`](crate::Lock), [`FairLock`](crate::FairLock),
//! [`RwLock`](crate::RwLock), [`MultiLock`](crate::MultiLock)), the rate limiter on
//! [`RateLimiter`](crate::RateLimiter).
//!
//! This module holds no code; the `lockwarden` crate re-exports it as `lockwarden::guide`.

#[doc = include_str!("connecting.md")]
pub mod connecting {}

#[doc = include_str!("how_it_works.md")]
pub mod how_it_works {}

#[doc = include_str!("operating.md")]
pub mod operating {}
