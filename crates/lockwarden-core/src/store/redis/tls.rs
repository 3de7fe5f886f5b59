//! TLS for `rediss://` URLs (the `tls` feature): which certificate authorities a client
//! trusts and which identity it presents, applied to every connection the client makes
//! (commands, pub/sub, `WAIT`, cluster nodes, sentinels and the primary they name).
//!
//! A URL says whether a connection uses TLS (`rediss://`) and this says how: by default
//! the system's root certificates are trusted and no client certificate is presented.
//! Certificates given for a deployment whose URLs are all `redis://` are refused rather
//! than ignored: the caller meant TLS and must not silently get plain text.

use redis::sentinel::SentinelClient;

use super::credentials::Credentials;
use crate::error::BackendError;

/// The TLS settings of a client; empty by default (system roots, no client certificate).
#[derive(Clone, Default)]
pub(crate) struct Tls {
    /// PEM certificates of the CAs to trust instead of the system's roots.
    #[cfg(feature = "tls")]
    roots: Option<Vec<u8>>,
    /// PEM certificate chain and private key presented to servers that ask (mutual TLS).
    #[cfg(feature = "tls")]
    identity: Option<(Vec<u8>, Vec<u8>)>,
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut out = f.debug_struct("Tls");
        // Never the key itself.
        #[cfg(feature = "tls")]
        out.field("custom_roots", &self.roots.is_some())
            .field("client_identity", &self.identity.is_some());
        out.finish()
    }
}

/// Whether `url` asks for TLS, read from its scheme (for builds that cannot parse it).
fn has_tls_scheme(url: &str) -> bool {
    let url = url.trim_start().to_ascii_lowercase();
    url.starts_with("rediss://") || url.starts_with("valkeys://")
}

impl Tls {
    /// Adds the CA certificates in `pem` to the ones trusted instead of the system's.
    #[cfg(feature = "tls")]
    pub(crate) fn add_roots(&mut self, pem: &[u8]) {
        let roots = self.roots.get_or_insert_with(Vec::new);
        if !roots.is_empty() && !roots.ends_with(b"\n") {
            roots.push(b'\n');
        }
        roots.extend_from_slice(pem);
    }

    /// Presents this certificate chain and key to servers that ask for one.
    #[cfg(feature = "tls")]
    pub(crate) fn set_identity(&mut self, cert_pem: Vec<u8>, key_pem: Vec<u8>) {
        self.identity = Some((cert_pem, key_pem));
    }

    /// redis-rs's form of these settings; `None` when there are none (system roots).
    #[cfg(feature = "tls")]
    fn certificates(&self) -> Option<redis::TlsCertificates> {
        if self.roots.is_none() && self.identity.is_none() {
            return None;
        }
        Some(redis::TlsCertificates {
            client_tls: self
                .identity
                .as_ref()
                .map(|(cert, key)| redis::ClientTlsConfig {
                    client_cert: cert.clone(),
                    client_key: key.clone(),
                }),
            root_cert: self.roots.clone(),
        })
    }

    /// Whether certificates were configured (which only `rediss://` URLs can use).
    fn is_configured(&self) -> bool {
        #[cfg(feature = "tls")]
        return self.roots.is_some() || self.identity.is_some();
        #[cfg(not(feature = "tls"))]
        false
    }

    /// Refuses TLS URLs in a build without TLS, with a message that says how to get it
    /// (redis-rs would only say that its feature is not enabled).
    pub(super) fn supported<'a>(
        urls: impl IntoIterator<Item = &'a str>,
    ) -> Result<(), BackendError> {
        match urls.into_iter().find(|url| has_tls_scheme(url)) {
            Some(url) if !cfg!(feature = "tls") => Err(BackendError::config(
                "TLS is not compiled in",
                format!(
                    "`{}` asks for TLS; enable lockwarden's `tls` cargo feature (on by default)",
                    redact(url)
                ),
            )),
            _ => Ok(()),
        }
    }

    /// Checks that `urls` (a deployment's addresses) fit these settings: all of them TLS
    /// or none, and no certificates for plain-text addresses. Returns whether they use TLS.
    pub(super) fn check<'a>(
        &self,
        urls: impl IntoIterator<Item = &'a str>,
    ) -> Result<bool, BackendError> {
        let mut tls = None;
        for url in urls {
            Self::supported([url])?;
            let this = has_tls_scheme(url);
            if tls.is_some_and(|before| before != this) {
                return Err(BackendError::config(
                    "mixed TLS and plain-text addresses",
                    "use rediss:// for every address of the deployment, or redis:// for all"
                        .to_owned(),
                ));
            }
            tls = Some(this);
        }
        let tls = tls.unwrap_or(false);
        if !tls && self.is_configured() {
            return Err(BackendError::config(
                "TLS certificates were configured for a plain-text address",
                "connect with rediss:// URLs to use TLS".to_owned(),
            ));
        }
        if tls {
            install_crypto_provider();
        }
        Ok(tls)
    }

    /// A client for the one server at `url`, over TLS with these settings if the URL is
    /// `rediss://`.
    pub(crate) fn open(&self, url: &str) -> Result<redis::Client, BackendError> {
        let _tls = self.check([url])?;
        #[cfg(feature = "tls")]
        if let (true, Some(certificates)) = (_tls, self.certificates()) {
            return Ok(redis::Client::build_with_tls(url, certificates)?);
        }
        Ok(redis::Client::open(url)?)
    }

    /// `builder` (for the cluster at `nodes`, checked by [`check`](Self::check)) with
    /// these settings.
    pub(super) fn cluster(
        &self,
        builder: redis::cluster::ClusterClientBuilder,
    ) -> redis::cluster::ClusterClientBuilder {
        #[cfg(feature = "tls")]
        if let Some(certificates) = self.certificates() {
            return builder.certs(certificates);
        }
        builder
    }

    /// A sentinel client for TLS sentinels (`rediss://`), which reaches the primary they
    /// name over TLS too (logged in as `primary` if given), both with these settings;
    /// `None` for plain-text sentinels.
    ///
    /// Credentials in the first sentinel URL are used for every sentinel (redis-rs's
    /// builder takes one set).
    pub(super) fn sentinel_client(
        &self,
        sentinels: &[String],
        service: &str,
        primary: Option<&Credentials>,
    ) -> Result<Option<SentinelClient>, BackendError> {
        if !self.check(sentinels.iter().map(String::as_str))? {
            return Ok(None);
        }
        #[cfg(feature = "tls")]
        {
            use redis::sentinel::{SentinelClientBuilder, SentinelServerType};
            use redis::IntoConnectionInfo;
            let infos = sentinels
                .iter()
                .map(|url| url.as_str().into_connection_info())
                .collect::<redis::RedisResult<Vec<_>>>()?;
            let addrs = infos.iter().map(|info| info.addr().clone());
            let mut builder =
                SentinelClientBuilder::new(addrs, service, SentinelServerType::Master)?
                    .set_client_to_redis_tls_mode(redis::TlsMode::Secure);
            if let Some(first) = infos.first().map(redis::ConnectionInfo::redis_settings) {
                if let Some(username) = first.username() {
                    builder = builder.set_client_to_sentinel_username(username);
                }
                if let Some(password) = first.password() {
                    builder = builder.set_client_to_sentinel_password(password);
                }
            }
            if let Some(login) = primary {
                builder = builder
                    .set_client_to_redis_username(&login.username)
                    .set_client_to_redis_password(&login.password);
            }
            if let Some(certificates) = self.certificates() {
                builder = builder
                    .set_client_to_sentinel_certificates(certificates.clone())
                    .set_client_to_redis_certificates(certificates);
            }
            Ok(Some(builder.build()?))
        }
        // `check` refuses TLS URLs in a build without TLS.
        #[cfg(not(feature = "tls"))]
        {
            let _ = (service, primary);
            Ok(None)
        }
    }
}

/// What went wrong, if `error` is a TLS failure that retrying will not mend: the server's
/// certificate not trusted, or this client's refused.
pub(super) fn failure(error: &redis::RedisError) -> Option<&'static str> {
    #[cfg(feature = "tls")]
    {
        use std::error::Error as _;
        // redis-rs keeps the I/O error tokio-rustls made of rustls's error.
        let mut cause: Option<&(dyn std::error::Error + 'static)> = error.source();
        while let Some(error) = cause {
            let found = error
                .downcast_ref::<rustls::Error>()
                .or_else(|| {
                    let io = error.downcast_ref::<std::io::Error>()?;
                    io.get_ref()?.downcast_ref::<rustls::Error>()
                })
                .and_then(problem);
            if found.is_some() {
                return found;
            }
            cause = error.source();
        }
        // Some paths (a cluster client's nodes, an alert read after the handshake) keep
        // only the text of rustls's error.
        let text = error.to_string();
        if text.contains("invalid peer certificate") {
            return Some(UNTRUSTED);
        }
        let refused = [
            "CertificateRequired",
            "BadCertificate",
            "UnknownCA",
            "CertificateUnknown",
            "CertificateRevoked",
            "CertificateExpired",
            "UnsupportedCertificate",
        ];
        if let Some((_, alert)) = text.split_once("received fatal alert: ") {
            if refused.iter().any(|name| alert.starts_with(name)) {
                return Some(CLIENT_REFUSED);
            }
        }
    }
    let _ = error;
    None
}

#[cfg(feature = "tls")]
const UNTRUSTED: &str = "the server's certificate is not trusted (trust the CA that signed it \
    with LockClientBuilder::tls_root_certificate, or add it to the system's roots; the \
    certificate must also name the host the URL connects to)";

#[cfg(feature = "tls")]
const CLIENT_REFUSED: &str = "the server refused this client's certificate, or its lack of \
    one (a server with tls-auth-clients yes needs LockClientBuilder::tls_client_identity \
    with a certificate signed by a CA it trusts)";

/// What a rustls error means for the caller, if it is about certificates.
#[cfg(feature = "tls")]
fn problem(error: &rustls::Error) -> Option<&'static str> {
    use rustls::AlertDescription as Alert;
    match error {
        rustls::Error::InvalidCertificate(_) | rustls::Error::NoCertificatesPresented => {
            Some(UNTRUSTED)
        }
        rustls::Error::AlertReceived(
            Alert::CertificateRequired
            | Alert::BadCertificate
            | Alert::UnknownCA
            | Alert::CertificateUnknown
            | Alert::CertificateRevoked
            | Alert::CertificateExpired
            | Alert::UnsupportedCertificate
            | Alert::AccessDenied
            | Alert::HandshakeFailure,
        ) => Some(CLIENT_REFUSED),
        _ => None,
    }
}

/// `url` without its password, for error messages.
pub(crate) fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            format!("{}://…@{}", &url[..scheme], &url[at + 1..])
        }
        _ => url.to_owned(),
    }
}

/// rustls needs a process-wide crypto provider; redis-rs builds its TLS configuration
/// with the default one. Installs ring's unless the application installed one first (an
/// application that wants another must install it before its first `rediss://` connect).
fn install_crypto_provider() {
    #[cfg(feature = "tls")]
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        // Losing a race with another installer is fine: there is a provider either way.
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schemes_say_whether_a_url_is_tls() {
        assert!(has_tls_scheme("rediss://127.0.0.1:6380/"));
        assert!(has_tls_scheme("  REDISS://host/"));
        assert!(has_tls_scheme("valkeys://host/"));
        assert!(!has_tls_scheme("redis://127.0.0.1:6379/"));
        assert!(!has_tls_scheme("redis+unix:///tmp/redis.sock"));
    }

    #[test]
    fn passwords_are_not_quoted() {
        assert_eq!(
            redact("rediss://u:secret@host:6380/0"),
            "rediss://…@host:6380/0"
        );
        assert_eq!(redact("rediss://host:6380/"), "rediss://host:6380/");
    }

    #[cfg(feature = "tls")]
    #[test]
    fn mixed_addresses_are_refused() {
        let err = Tls::default()
            .check(["rediss://a:1/", "redis://b:2/"])
            .unwrap_err();
        assert!(err.to_string().contains("mixed TLS"), "{err}");
    }

    #[cfg(feature = "tls")]
    #[test]
    fn certificates_for_plain_text_are_refused() {
        let mut tls = Tls::default();
        tls.add_roots(b"-----BEGIN CERTIFICATE-----\n");
        let err = tls.check(["redis://127.0.0.1:6379/"]).unwrap_err();
        assert!(err.to_string().contains("plain-text"), "{err}");
        assert!(tls.check(["rediss://127.0.0.1:6380/"]).unwrap());
        assert!(!format!("{tls:?}").contains("BEGIN"));
    }

    #[cfg(not(feature = "tls"))]
    #[test]
    fn tls_urls_name_the_feature_without_it() {
        let err = Tls::default()
            .open("rediss://u:pw@127.0.0.1:6380/")
            .unwrap_err();
        let text = err.to_string();
        assert!(text.contains("`tls` cargo feature"), "{text}");
        assert!(!text.contains("pw"), "{text}");
    }
}
