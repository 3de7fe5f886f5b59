//! Every start-up error names what to fix, in its text (`Display`) and in what `main`
//! prints when it returns the error (`Debug`): the address of a server that cannot be
//! reached, what is wrong with a URL that is not one (never its password), and the
//! variable the default client reads. One binary of its own: it changes `REDIS_URL`.

use std::time::Duration;

use lockwarden::{BackendError, LockClient, LockError};

/// A loopback port nothing listens on (bound, then let go).
fn closed_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    listener.local_addr().expect("address").port()
}

fn quick() -> lockwarden::LockClientBuilder {
    LockClient::builder().command_timeout(Duration::from_millis(500))
}

#[tokio::test]
async fn a_refused_connection_names_the_address() {
    let port = closed_port();
    let error = quick()
        .connect(&format!("redis://127.0.0.1:{port}/"))
        .await
        .expect_err("nothing listens there");
    let address = format!("127.0.0.1:{port}");
    let (text, printed) = (error.to_string(), format!("{error:?}"));
    assert!(text.contains(&address), "{text}");
    assert!(text.contains("cannot reach Redis"), "{text}");
    assert!(printed.contains(&address), "{printed}");
    assert!(
        matches!(&error, LockError::Backend(e @ BackendError::Connect { .. }) if e.is_transient()),
        "{printed}"
    );
}

#[tokio::test]
async fn an_unreachable_cluster_names_its_nodes() {
    let (a, b) = (closed_port(), closed_port());
    let error = quick()
        .connect_cluster([
            format!("redis://127.0.0.1:{a}/"),
            format!("redis://user:secret@127.0.0.1:{b}/"),
        ])
        .await
        .expect_err("nothing listens there");
    let text = error.to_string();
    assert!(text.contains(&format!("127.0.0.1:{a}")), "{text}");
    assert!(text.contains(&format!("127.0.0.1:{b}")), "{text}");
    assert!(!format!("{error:?}").contains("secret"), "{error:?}");
}

#[tokio::test]
async fn a_bad_url_says_what_is_wrong_with_it() {
    let cases = [
        ("redis//127.0.0.1:6379", "no scheme"),
        ("http://127.0.0.1:6379/", "`http://` is not a scheme"),
        ("redis://user:secret@local host:6379/", "does not parse"),
        ("redis://127.0.0.1:6379/not-a-db", "database"),
    ];
    for (url, problem) in cases {
        let error = quick().connect(url).await.expect_err(url);
        let (text, printed) = (error.to_string(), format!("{error:?}"));
        assert!(
            matches!(&error, LockError::Backend(BackendError::InvalidUrl { .. })),
            "{url}: {printed}"
        );
        assert!(text.contains(problem), "{url}: {text}");
        assert!(text.contains("redis://"), "says how one looks: {text}");
        assert!(
            !text.contains("secret") && !printed.contains("secret"),
            "{printed}"
        );
    }
}

#[tokio::test]
async fn the_default_client_names_the_variable_it_reads() {
    std::env::remove_var("REDIS_URL");
    let error = lockwarden::default_client()
        .await
        .expect_err("REDIS_URL is not set");
    // What `main` prints when it returns the error with `?`.
    let printed = format!("{error:?}");
    assert!(printed.contains("REDIS_URL is not set"), "{printed}");
    assert!(
        printed.contains("redis://"),
        "says what to set it to: {printed}"
    );
}
