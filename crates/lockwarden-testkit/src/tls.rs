//! [`TlsCerts`]: throw-away certificates for TLS servers, made with the
//! `openssl` command line tool for each test run and never checked in.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;

use tempfile::TempDir;

/// How long the certificates are valid, in days (a test run needs minutes).
const DAYS: &str = "2";

/// The extensions of the server certificate: valid for the loopback address
/// and `localhost`, and for client authentication too, since Redis presents
/// the same certificate on its own outgoing TLS connections (a replica to its
/// primary, a cluster node to its peers, a sentinel to the servers).
const SERVER_EXTENSIONS: &str = "basicConstraints=critical,CA:FALSE\n\
    keyUsage=critical,digitalSignature,keyEncipherment\n\
    extendedKeyUsage=serverAuth,clientAuth\n\
    subjectAltName=IP:127.0.0.1,DNS:localhost\n";

/// The extensions of the client certificate (mutual TLS).
const CLIENT_EXTENSIONS: &str = "basicConstraints=critical,CA:FALSE\n\
    keyUsage=critical,digitalSignature,keyEncipherment\n\
    extendedKeyUsage=clientAuth\n";

/// A certificate authority, a server certificate it signed for `127.0.0.1`
/// and `localhost`, a client certificate it signed (for mutual TLS), and a
/// second, unrelated CA (to play a client that trusts someone else), all
/// ECDSA P-256, generated with `openssl` into a temporary directory that is
/// removed when the last handle is dropped.
///
/// Give it to [`RedisServer::start_tls`](crate::RedisServer::start_tls),
/// [`RedisCluster::start_tls`](crate::RedisCluster::start_tls) or
/// [`RedisSentinel::start_tls`](crate::RedisSentinel::start_tls); the
/// servers read the files at start and restart, so the handle is shared with
/// them.
///
/// ```no_run
/// use lockwarden_testkit::{RedisServer, TlsCerts};
///
/// let certs = TlsCerts::generate()?;
/// let server = RedisServer::start_tls(&certs, &[])?;
/// assert!(server.url().starts_with("rediss://127.0.0.1:"));
/// let trusted = certs.ca_pem(); // give it to the client under test
/// # let _ = trusted;
/// # Ok::<(), std::io::Error>(())
/// ```
#[derive(Debug)]
pub struct TlsCerts {
    dir: TempDir,
}

impl TlsCerts {
    /// Generates a fresh set of certificates (a few `openssl` runs).
    ///
    /// # Errors
    ///
    /// If `openssl` is missing or fails (its stderr is quoted).
    pub fn generate() -> io::Result<Arc<TlsCerts>> {
        let dir = tempfile::Builder::new()
            .prefix("lockwarden-tls-")
            .tempdir()?;
        let certs = TlsCerts { dir };
        certs.make_ca("ca", "lockwarden test CA")?;
        certs.make_ca("other-ca", "an unrelated CA")?;
        certs.make_leaf("server", "localhost", SERVER_EXTENSIONS)?;
        certs.make_leaf("client", "lockwarden test client", CLIENT_EXTENSIONS)?;
        Ok(Arc::new(certs))
    }

    /// The CA that signed the server's (and the client's) certificate, PEM.
    pub fn ca_pem(&self) -> Vec<u8> {
        self.read("ca.crt")
    }

    /// A CA that signed nothing here, PEM: a client that trusts only this one
    /// must refuse the server.
    pub fn other_ca_pem(&self) -> Vec<u8> {
        self.read("other-ca.crt")
    }

    /// The client certificate for mutual TLS, PEM.
    pub fn client_cert_pem(&self) -> Vec<u8> {
        self.read("client.crt")
    }

    /// The client certificate's private key (PKCS#8), PEM.
    pub fn client_key_pem(&self) -> Vec<u8> {
        self.read("client.key")
    }

    /// Path of the CA certificate (`--tls-ca-cert-file`).
    pub fn ca_file(&self) -> PathBuf {
        self.path("ca.crt")
    }

    /// Path of the server certificate (`--tls-cert-file`).
    pub fn server_cert_file(&self) -> PathBuf {
        self.path("server.crt")
    }

    /// Path of the server's private key (`--tls-key-file`).
    pub fn server_key_file(&self) -> PathBuf {
        self.path("server.key")
    }

    /// The `redis-server` arguments of a TLS listener on `port` with these
    /// certificates: clients may present a certificate (which is then
    /// checked) but need not (`--tls-auth-clients optional`); replication,
    /// the cluster bus and a sentinel's connections use TLS too.
    pub(crate) fn server_args(&self, port: u16) -> Vec<String> {
        let path = |p: PathBuf| p.display().to_string();
        vec![
            "--tls-port".into(),
            port.to_string(),
            "--tls-cert-file".into(),
            path(self.server_cert_file()),
            "--tls-key-file".into(),
            path(self.server_key_file()),
            "--tls-ca-cert-file".into(),
            path(self.ca_file()),
            "--tls-auth-clients".into(),
            "optional".into(),
            "--tls-replication".into(),
            "yes".into(),
        ]
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn read(&self, name: &str) -> Vec<u8> {
        let path = self.path(name);
        fs::read(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
    }

    /// A self-signed CA `<name>.crt` with its key `<name>.key`.
    fn make_ca(&self, name: &str, subject: &str) -> io::Result<()> {
        let crt = format!("{name}.crt");
        self.new_key(
            name,
            subject,
            &crt,
            &[
                "-x509",
                "-days",
                DAYS,
                "-addext",
                "basicConstraints=critical,CA:TRUE",
                "-addext",
                "keyUsage=critical,keyCertSign,cRLSign",
            ],
        )
    }

    /// A new P-256 key `<name>.key` and, in `out`, a request for `/CN=<subject>` (or with
    /// `-x509` among `more`, a self-signed certificate).
    fn new_key(&self, name: &str, subject: &str, out: &str, more: &[&str]) -> io::Result<()> {
        let (key, subject) = (format!("{name}.key"), format!("/CN={subject}"));
        let mut args = vec![
            "req",
            "-new",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-keyout",
            &key,
            "-out",
            out,
            "-subj",
            &subject,
        ];
        args.extend_from_slice(more);
        openssl(self.dir.path(), &args)
    }

    /// `<name>.crt` and `<name>.key`, signed by `ca`, with `extensions`.
    fn make_leaf(&self, name: &str, subject: &str, extensions: &str) -> io::Result<()> {
        let dir = self.dir.path();
        let ext_file = format!("{name}.ext");
        fs::write(dir.join(&ext_file), extensions)?;
        self.new_key(name, subject, &format!("{name}.csr"), &[])?;
        openssl(
            dir,
            &[
                "x509",
                "-req",
                "-in",
                &format!("{name}.csr"),
                "-CA",
                "ca.crt",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-out",
                &format!("{name}.crt"),
                "-days",
                DAYS,
                "-extfile",
                &ext_file,
            ],
        )
    }
}

/// Runs `openssl args` in `dir`, failing with its stderr.
fn openssl(dir: &Path, args: &[&str]) -> io::Result<()> {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("could not run openssl (install it to test TLS): {e}"),
            )
        })?;
    if out.status.success() {
        return Ok(());
    }
    Err(io::Error::other(format!(
        "openssl {} failed ({}): {}",
        args.join(" "),
        out.status,
        String::from_utf8_lossy(&out.stderr).trim()
    )))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{RedisCluster, RedisSentinel, RedisServer};

    /// A synchronous client of `url` that trusts `ca` (as lockwarden's clients would).
    fn tls_client(url: &str, ca: Vec<u8>) -> redis::Client {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let certs = redis::TlsCertificates {
            client_tls: None,
            root_cert: Some(ca),
        };
        redis::Client::build_with_tls(url, certs).expect("a TLS client")
    }

    fn ping(client: &redis::Client) -> redis::RedisResult<String> {
        let mut con = client.get_connection_with_timeout(std::time::Duration::from_secs(5))?;
        redis::cmd("PING").query(&mut con)
    }

    #[test]
    fn a_tls_server_speaks_tls_on_its_url_and_plain_text_to_the_probes() {
        let certs = TlsCerts::generate().expect("generate");
        let mut server = RedisServer::start_tls(&certs, &[]).expect("start a TLS server");
        let tls_port = server.tls_port().expect("a TLS port");
        assert_ne!(tls_port, server.port());
        assert_eq!(server.client_port(), tls_port);
        assert_eq!(server.url(), format!("rediss://127.0.0.1:{tls_port}/"));
        let reply: Vec<String> = server.query(&["CONFIG", "GET", "tls-port"]).expect("probe");
        assert_eq!(reply, ["tls-port".to_owned(), tls_port.to_string()]);

        // Over TLS with the CA: yes; with another CA: no; plain text to the TLS port: no.
        assert_eq!(
            ping(&tls_client(&server.url(), certs.ca_pem())).expect("PING"),
            "PONG"
        );
        let untrusted = ping(&tls_client(&server.url(), certs.other_ca_pem()));
        assert!(untrusted.is_err(), "{untrusted:?}");
        let plain = redis::Client::open(format!("redis://127.0.0.1:{tls_port}/")).unwrap();
        assert!(ping(&plain).is_err());

        // The probes see the TLS client and the port it came in on.
        let client = tls_client(&server.url(), certs.ca_pem());
        let _con = client.get_connection().expect("connect over TLS");
        let clients = server.clients();
        assert_eq!(clients.len(), 1, "{clients:?}");
        let laddr = clients[0].field("laddr").expect("laddr");
        assert_eq!(laddr, format!("127.0.0.1:{tls_port}"));

        server.restart().expect("restart");
        assert_eq!(server.tls_port(), Some(tls_port));
        assert_eq!(
            ping(&tls_client(&server.url(), certs.ca_pem())).expect("PING"),
            "PONG"
        );
    }

    #[test]
    fn a_tls_cluster_names_its_tls_ports_over_tls_and_moves_slots() {
        let certs = TlsCerts::generate().expect("generate");
        let cluster = RedisCluster::start_tls(2, &certs).expect("start a TLS cluster");
        let urls = cluster.urls();
        assert!(urls.iter().all(|u| u.starts_with("rediss://")), "{urls:?}");
        let mut con = tls_client(&urls[0], certs.ca_pem())
            .get_connection()
            .unwrap();
        let slots: redis::Value = redis::cmd("CLUSTER").arg("SLOTS").query(&mut con).unwrap();
        let text = format!("{slots:?}");
        for node in cluster.nodes() {
            let port = node.tls_port().expect("a TLS node").to_string();
            assert!(text.contains(&port), "CLUSTER SLOTS over TLS: {text}");
        }
        // MIGRATE goes over TLS between the nodes.
        let key = "moved:{k}";
        let owner = cluster.owner(key).unwrap();
        let _: () = cluster.nodes()[owner].query(&["SET", key, "v"]).unwrap();
        let slot = cluster.slot(key).unwrap();
        cluster.move_slot(slot, 1 - owner).unwrap();
        assert!(cluster.exists_on(1 - owner, key));
    }

    #[test]
    fn a_tls_sentinel_names_the_primary_tls_port() {
        let certs = TlsCerts::generate().expect("generate");
        let pair = RedisSentinel::start_tls(&certs).expect("start a TLS sentinel");
        let primary = &pair.servers()[0];
        assert_eq!(pair.master_port().unwrap(), primary.tls_port().unwrap());
        let mut con = tls_client(&pair.sentinel_url(), certs.ca_pem())
            .get_connection()
            .unwrap();
        let (_, port): (String, u16) = redis::cmd("SENTINEL")
            .arg("GET-MASTER-ADDR-BY-NAME")
            .arg(pair.service())
            .query(&mut con)
            .unwrap();
        assert_eq!(port, primary.tls_port().unwrap());
    }

    #[test]
    fn certificates_are_pem_and_go_away_with_the_handle() {
        let certs = TlsCerts::generate().expect("generate");
        for pem in [
            certs.ca_pem(),
            certs.other_ca_pem(),
            certs.client_cert_pem(),
        ] {
            assert!(pem.starts_with(b"-----BEGIN CERTIFICATE-----"));
        }
        assert!(certs
            .client_key_pem()
            .starts_with(b"-----BEGIN PRIVATE KEY-----"));
        assert_ne!(certs.ca_pem(), certs.other_ca_pem());
        let dir = certs.dir.path().to_path_buf();
        assert!(certs.server_key_file().is_file());
        drop(certs);
        assert!(!dir.exists(), "{dir:?} survived drop");
    }

    #[test]
    fn the_server_certificate_is_for_loopback_and_signed_by_the_ca() {
        let certs = TlsCerts::generate().expect("generate");
        let out = Command::new("openssl")
            .args(["verify", "-CAfile"])
            .arg(certs.ca_file())
            .arg(certs.server_cert_file())
            .output()
            .expect("openssl verify");
        assert!(out.status.success(), "{out:?}");
        let text = Command::new("openssl")
            .args(["x509", "-noout", "-ext", "subjectAltName", "-in"])
            .arg(certs.server_cert_file())
            .output()
            .expect("openssl x509");
        let text = String::from_utf8_lossy(&text.stdout);
        assert!(text.contains("IP Address:127.0.0.1"), "{text}");
        assert!(text.contains("DNS:localhost"), "{text}");
    }
}
