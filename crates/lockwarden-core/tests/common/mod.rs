//! Shared set-up for integration tests: a lock store that is either in-process or a
//! real throw-away `redis-server`.
#![allow(dead_code)]

pub mod keys;
pub mod kinds;

use std::sync::OnceLock;

use lockwarden_core::{LockClient, LockClientBuilder};
use lockwarden_testkit::RedisServer;

/// Where the locks live for one test.
pub struct Env {
    pub server: Option<RedisServer>,
    /// The in-process store is per client; every `client()` of a memory env shares it.
    memory: OnceLock<LockClient>,
}

impl Env {
    pub fn memory() -> Self {
        Self {
            server: None,
            memory: OnceLock::new(),
        }
    }

    pub fn redis() -> Self {
        Self {
            server: Some(RedisServer::start().expect("start redis-server")),
            memory: OnceLock::new(),
        }
    }

    pub fn is_redis(&self) -> bool {
        self.server.is_some()
    }

    pub fn server(&self) -> &RedisServer {
        self.server.as_ref().expect("a redis env")
    }

    /// A client with default settings: a new connection on Redis, the shared store in-process.
    pub async fn client(&self) -> LockClient {
        self.client_with(|b| b).await
    }

    /// A client with settings; in-process, the first call's settings apply to all.
    pub async fn client_with(
        &self,
        configure: impl FnOnce(LockClientBuilder) -> LockClientBuilder,
    ) -> LockClient {
        match &self.server {
            Some(server) => configure(LockClient::builder())
                .connect(&server.url())
                .await
                .expect("connect to redis-server"),
            None => self
                .memory
                .get_or_init(|| configure(LockClient::builder()).in_memory())
                .clone(),
        }
    }
}

/// Runs async test bodies against both stores.
///
/// `conformance!(name, ...)` makes `memory::name` and `redis::name`, each calling
/// `name(env)` with its store's [`Env`].
///
/// `conformance!(kinds: name, ...)` runs each body for every [`Kind`] of lock on both
/// stores: it makes `<store>::<kind>::name` (stores `memory`, `redis`; kinds `plain`,
/// `fair`, `read`, `write`, `multi`), each calling `name(env, kind)` with a
/// [`kinds::Kind`].
#[macro_export]
macro_rules! conformance {
    (kinds: $($name:ident),* $(,)?) => {
        mod memory {
            $crate::conformance!(@kinds memory; $($name),*);
        }
        mod redis {
            $crate::conformance!(@kinds redis; $($name),*);
        }
    };
    (@kinds $store:ident; $($name:ident),*) => {
        $crate::conformance!(@kind $store, plain, Plain; $($name),*);
        $crate::conformance!(@kind $store, fair, Fair; $($name),*);
        $crate::conformance!(@kind $store, read, Read; $($name),*);
        $crate::conformance!(@kind $store, write, Write; $($name),*);
        $crate::conformance!(@kind $store, multi, Multi; $($name),*);
    };
    (@kind $store:ident, $kind:ident, $variant:ident; $($name:ident),*) => {
        mod $kind {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::super::$name(
                        $crate::common::Env::$store(),
                        $crate::common::kinds::Kind::$variant,
                    )
                    .await;
                }
            )*
        }
    };
    ($($name:ident),* $(,)?) => {
        mod memory {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name($crate::common::Env::memory()).await;
                }
            )*
        }
        mod redis {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name($crate::common::Env::redis()).await;
                }
            )*
        }
    };
}
