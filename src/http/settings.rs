//! What [`LockLayer`](super::LockLayer) and [`LimitLayer`](super::LimitLayer) share,
//! written once: the constructors that pick where a key comes from, and the settings of
//! how it is held. Each layer type is `{ source, config, missing }` and adds its own
//! settings in its own file.

/// The constructors and common settings of a layer type `$layer`, whose requests hold a
/// `$held` ("lock" or "permit") and whose `new` starts from `$config` (a `Config`).
/// `$example` makes one in the examples of the settings.
macro_rules! layer_settings {
    ($layer:ident, $held:literal, $config:expr, $example:literal) => {
        impl<K: std::fmt::Debug> std::fmt::Debug for $layer<K> {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.debug_struct(stringify!($layer))
                    .field("source", &self.source)
                    .field("config", &self.config)
                    .finish()
            }
        }

        impl $layer<super::key::FromHeader> {
            /// Keys requests by the value of header `name` (e.g. `Idempotency-Key`, or
            /// `X-Tenant`).
            ///
            /// ```
            #[doc = concat!("use lockwarden::", stringify!($layer), ";")]
            #[doc = concat!("let layer = ", stringify!($layer), "::by_header(\"X-Tenant\");")]
            /// # let _ = layer;
            /// ```
            ///
            /// # Panics
            /// If `name` is not a valid header name.
            pub fn by_header<N>(name: N) -> Self
            where
                N: TryInto<http::HeaderName>,
                N::Error: std::fmt::Debug,
            {
                Self::new(super::key::FromHeader::new(name))
            }
        }

        impl $layer<super::key::FromPath> {
            /// Keys requests by their path (without the query string).
            ///
            /// ```
            #[doc = concat!("use lockwarden::", stringify!($layer), ";")]
            #[doc = concat!("let layer = ", stringify!($layer), "::by_path();")]
            /// # let _ = layer;
            /// ```
            pub fn by_path() -> Self {
                Self::new(super::key::FromPath)
            }
        }

        #[cfg(feature = "axum")]
        #[cfg_attr(docsrs, doc(cfg(feature = "axum")))]
        impl $layer<super::key::FromPathParam> {
            /// Keys requests by the axum path parameter `name`. Add it with
            /// `Router::route_layer` (the parameters are known only once a route has
            /// matched).
            ///
            /// ```
            /// use axum::{routing::post, Router};
            #[doc = concat!("use lockwarden::", stringify!($layer), ";")]
            ///
            /// let app: Router = Router::new()
            ///     .route("/orders/{id}/ship", post(|| async { "shipped" }))
            #[doc = concat!("    .route_layer(", stringify!($layer), "::by_path_param(\"id\"));")]
            /// ```
            pub fn by_path_param(name: &str) -> Self {
                Self::new(super::key::FromPathParam::new(name))
            }
        }

        impl $layer<super::key::FromJsonField> {
            /// Keys requests by a field of their JSON body, named by a JSON Pointer such
            /// as `/data/object/id`. The body is read up to
            /// [`DEFAULT_BODY_LIMIT`](super::DEFAULT_BODY_LIMIT) (see
            /// [`body_limit`](Self::body_limit)) and handed on unchanged as a
            /// `http_body_util::Full<Bytes>`. See
            /// [`FromJsonField`](super::FromJsonField) for the answers to bad bodies.
            ///
            /// ```
            /// use axum::{routing::post, Router};
            #[doc = concat!("use lockwarden::", stringify!($layer), ";")]
            ///
            /// let app: Router = Router::new()
            ///     .route("/webhooks/stripe", post(|body: String| async move { body }))
            #[doc = concat!("    .layer(", stringify!($layer), "::by_json_field(\"/data/object/id\"));")]
            /// ```
            ///
            /// # Panics
            /// If `pointer` is not empty and does not start with `/`.
            pub fn by_json_field(pointer: &str) -> Self {
                Self::new(super::key::FromJsonField::new(
                    pointer,
                    super::DEFAULT_BODY_LIMIT,
                ))
            }

            /// Reads at most `bytes` of request body (default
            /// [`DEFAULT_BODY_LIMIT`](super::DEFAULT_BODY_LIMIT), 64 KiB); longer bodies
            /// are answered `413`. A remembering lock layer's fingerprint reads the body
            /// within this one limit too.
            ///
            /// ```
            #[doc = concat!("use lockwarden::", stringify!($layer), ";")]
            #[doc = concat!("let layer = ", stringify!($layer), "::by_json_field(\"/id\").body_limit(1024 * 1024);")]
            /// # let _ = layer;
            /// ```
            pub fn body_limit(mut self, bytes: usize) -> Self {
                super::key::KeySource::<http_body_util::Full<bytes::Bytes>>::set_body_limit(
                    self.source_mut(),
                    bytes,
                );
                self
            }
        }

        impl<F> $layer<super::key::FromFn<F>>
        where
            F: Fn(&http::request::Parts) -> Option<String> + Clone,
        {
            /// Keys requests by a closure over the request head; `None` means "no key".
            ///
            /// ```
            #[doc = concat!("use lockwarden::", stringify!($layer), ";")]
            #[doc = concat!("let layer = ", stringify!($layer), "::by(|parts| {")]
            ///     let tenant = parts.headers.get("x-tenant")?.to_str().ok()?;
            ///     Some(format!("{tenant}:{}", parts.uri.path()))
            /// });
            /// # let _ = layer;
            /// ```
            pub fn by(f: F) -> Self {
                Self::new(super::key::FromFn::new(f))
            }
        }

        impl<K> $layer<K> {
            /// A layer with any key source (see [`KeySource`](super::KeySource) and
            /// [`PartsKey`](super::PartsKey)).
            ///
            /// ```
            #[doc = concat!("use lockwarden::{", stringify!($layer), ", http::FromPath};")]
            #[doc = concat!("let layer = ", stringify!($layer), "::new(FromPath);")]
            /// # let _ = layer;
            /// ```
            pub fn new(source: K) -> Self {
                Self {
                    source,
                    config: std::sync::Arc::new($config),
                    missing: super::service::Missing::default(),
                }
            }

            fn config(&mut self) -> &mut super::config::Config {
                std::sync::Arc::make_mut(&mut self.config)
            }

            /// The source, to change it: the answer made from the old one no longer
            /// applies.
            fn source_mut(&mut self) -> &mut K {
                self.missing = super::service::Missing::default();
                &mut self.source
            }

            #[doc = concat!("Takes the ", $held, "s with `client` (default: [`default_client`](super::default_client), Redis at `REDIS_URL`).")]
            ///
            /// ```
            #[doc = concat!("use lockwarden::{LockClient, ", stringify!($layer), "};")]
            #[doc = concat!("let layer = ", $example, ".client(LockClient::in_memory());")]
            /// # let _ = layer;
            /// ```
            pub fn client(mut self, client: crate::LockClient) -> Self {
                self.config().client = Some(client);
                self
            }

            #[doc = concat!("Starts every name this layer makes with `prefix`; give layers that must not share ", $held, "s different prefixes. The name then goes under the client's Redis key namespace ([`LockClientBuilder::namespace`](crate::LockClientBuilder::namespace)).")]
            ///
            /// ```
            #[doc = concat!("use lockwarden::", stringify!($layer), ";")]
            #[doc = concat!("let layer = ", $example, ".name_prefix(\"billing:\");")]
            /// # let _ = layer;
            /// ```
            pub fn name_prefix(mut self, prefix: impl Into<std::sync::Arc<str>>) -> Self {
                self.config().name_prefix = prefix.into();
                self
            }

            /// Places each key under a scope taken from the request, typically the
            /// authenticated principal, so one client's keys can never block or collide
            /// with another's. A request whose scope is `None` is treated as one without
            /// a key.
            ///
            /// ```
            #[doc = concat!("use lockwarden::", stringify!($layer), ";")]
            ///
            /// #[derive(Clone)]
            /// struct User(String); // put into the extensions by your auth layer
            ///
            #[doc = concat!("let layer = ", $example)]
            ///     .scope(|parts| parts.extensions.get::<User>().map(|u| u.0.clone()));
            /// # let _ = layer;
            /// ```
            pub fn scope<F>(mut self, scope: F) -> Self
            where
                F: Fn(&http::request::Parts) -> Option<String> + Send + Sync + 'static,
            {
                self.config().scope = Some(std::sync::Arc::new(scope));
                self
            }

            #[doc = concat!("Waits up to `wait` for a ", $held, " before refusing the request (default: zero, one attempt).")]
            ///
            /// ```
            #[doc = concat!("use lockwarden::", stringify!($layer), ";")]
            /// use std::time::Duration;
            #[doc = concat!("let layer = ", $example, ".wait(Duration::from_secs(2));")]
            /// # let _ = layer;
            /// ```
            pub fn wait(mut self, wait: std::time::Duration) -> Self {
                self.config().wait = wait;
                self
            }

            #[doc = concat!("Holds each ", $held, " for a fixed `lease` instead of renewing it with the watchdog: a request still running after `lease` loses it (see [`abort_on_loss`](Self::abort_on_loss)).")]
            ///
            /// ```
            #[doc = concat!("use lockwarden::", stringify!($layer), ";")]
            /// use std::time::Duration;
            #[doc = concat!("let layer = ", $example, ".lease(Duration::from_secs(60));")]
            /// # let _ = layer;
            /// ```
            pub fn lease(mut self, lease: std::time::Duration) -> Self {
                self.config().lease = Some(lease);
                self
            }

            #[doc = concat!("What to do with a request without a key (default [`MissingKey::Reject`](super::MissingKey::Reject); [`MissingKey::PassUnlocked`](super::MissingKey::PassUnlocked) runs it without a ", $held, ").")]
            ///
            /// ```
            #[doc = concat!("use lockwarden::{", stringify!($layer), ", MissingKey};")]
            #[doc = concat!("let layer = ", $example, ".on_missing_key(MissingKey::PassUnlocked);")]
            /// # let _ = layer;
            /// ```
            pub fn on_missing_key(mut self, policy: super::MissingKey) -> Self {
                self.config().missing_key = policy;
                self
            }

            #[doc = concat!("Lets requests through without a ", $held, " (logging a warning) when the store cannot be reached, instead of answering `503`. A layer without a client while `REDIS_URL` is not set (see [`default_client`](super::default_client)) still answers `503`: that is a missing setting, not an outage.")]
            ///
            /// ```
            #[doc = concat!("use lockwarden::", stringify!($layer), ";")]
            #[doc = concat!("let layer = ", $example, ".fail_open();")]
            /// # let _ = layer;
            /// ```
            pub fn fail_open(mut self) -> Self {
                self.config().fail_open = true;
                self
            }

            #[doc = concat!("Stops the inner service and answers `503` when the ", $held, " is lost while it runs (by default the loss is logged and visible through the request's extension only).")]
            ///
            /// ```
            #[doc = concat!("use lockwarden::", stringify!($layer), ";")]
            #[doc = concat!("let layer = ", $example, ".abort_on_loss();")]
            /// # let _ = layer;
            /// ```
            pub fn abort_on_loss(mut self) -> Self {
                self.config().abort_on_loss = true;
                self
            }

            /// Logs a hash of each key instead of the key (for keys that are secrets or
            /// personal data): a SipHash under a random key drawn once per process, so
            /// log lines of one key correlate within a process, and a key cannot be
            /// recovered by hashing guesses.
            ///
            /// ```
            #[doc = concat!("use lockwarden::", stringify!($layer), ";")]
            #[doc = concat!("let layer = ", $example, ".redact_keys();")]
            /// # let _ = layer;
            /// ```
            pub fn redact_keys(mut self) -> Self {
                self.config().redact_keys = true;
                self
            }
        }
    };
}

pub(crate) use layer_settings;
