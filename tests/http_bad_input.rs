//! Bad input to `LockLayer`, table-driven, over real HTTP/1.1 on 127.0.0.1 (hyper via
//! `axum::serve`) and a real throw-away `redis-server`.
//!
//! Every request is written as raw bytes on a tokio `TcpStream`, so a row can send what
//! hyper's client would refuse to (obs-text header bytes, duplicate headers, control
//! characters, a chunked body that never ends, a client that leaves mid-body). Each row
//! states its promise; after each row the test checks in Redis that no lock is left
//! behind, then empties Redis for the next row.

use std::panic::AssertUnwindSafe;
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::extract::{Extension, Request};
use axum::http::StatusCode;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use futures_util::FutureExt;
use lockwarden::{LockClient, LockInfo, LockLayer, Rejection};
use lockwarden_testkit::RedisServer;
use proptest::prelude::*;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// The lock layer's body limit for `/j/*` routes (the default, 64 KiB).
const JSON_LIMIT: usize = lockwarden::http::DEFAULT_BODY_LIMIT;
/// The body limit of the `/j2/*` route: 2 MiB, so a 1 MB key reaches key validation.
const BIG_JSON_LIMIT: usize = 2 << 20;
/// How long any one answer may take to arrive.
const ANSWER_BOUND: Duration = Duration::from_secs(5);

// ---------------------------------------------------------------------------------------
// The server under test
// ---------------------------------------------------------------------------------------

/// Answers with the Redis key of the lock the request holds (proof the layer locked it).
async fn echo_key(Extension(info): Extension<LockInfo>, _body: Bytes) -> String {
    info.key.redis_key().to_owned()
}

async fn panics(Extension(_info): Extension<LockInfo>) -> &'static str {
    panic!("handler panic (expected by the test)");
}

/// A response body that yields one chunk, then fails.
async fn stream_error(Extension(_info): Extension<LockInfo>) -> Body {
    let chunks = futures_util::stream::iter([
        Ok(Bytes::from_static(b"partial")),
        Err(std::io::Error::other(
            "the body failed mid-way (expected by the test)",
        )),
    ]);
    Body::from_stream(chunks)
}

/// The application's own panic guard, outside the lock layer: the layer does not turn
/// panics into responses, it only releases the lock while the panic unwinds through it.
async fn catch_panic(request: Request, next: Next) -> Response {
    match AssertUnwindSafe(next.run(request)).catch_unwind().await {
        Ok(response) => response,
        Err(_) => (StatusCode::INTERNAL_SERVER_ERROR, "handler panicked").into_response(),
    }
}

struct Harness {
    addr: std::net::SocketAddr,
    redis: redis::aio::MultiplexedConnection,
    _server: RedisServer,
    _client: LockClient,
}

async fn start() -> Harness {
    let server = RedisServer::start().expect("start redis-server");
    let client = LockClient::connect(&server.url())
        .await
        .expect("connect to redis-server");
    let by_header = Router::new()
        .route("/h/echo", post(echo_key))
        .route("/h/panic", post(panics))
        .route("/h/stream-error", post(stream_error))
        .layer(LockLayer::by_header("Idempotency-Key").client(client.clone()));
    let by_json = Router::new()
        .route("/j/echo", post(echo_key))
        .layer(LockLayer::by_json_field("/id").client(client.clone()));
    let by_big_json = Router::new().route("/j2/echo", post(echo_key)).layer(
        LockLayer::by_json_field("/id")
            .body_limit(BIG_JSON_LIMIT)
            .client(client.clone()),
    );
    let app = by_header
        .merge(by_json)
        .merge(by_big_json)
        .layer(middleware::from_fn(catch_panic));
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move { axum::serve(listener, app).await });
    let redis = redis::Client::open(server.url())
        .expect("redis url")
        .get_multiplexed_async_connection()
        .await
        .expect("redis connection");
    Harness {
        addr,
        redis,
        _server: server,
        _client: client,
    }
}

// ---------------------------------------------------------------------------------------
// Raw HTTP/1.1 on the wire
// ---------------------------------------------------------------------------------------

/// A request as bytes: `POST path`, `Host`, `Connection: close`, the given headers (raw
/// bytes, so anything can be sent), and `Content-Length` unless a `Transfer-Encoding` or
/// `Content-Length` header is given.
fn raw(path: &str, headers: &[(&str, &[u8])], body: &[u8]) -> Vec<u8> {
    let mut out =
        format!("POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n").into_bytes();
    let mut framed = false;
    for (name, value) in headers {
        framed |= name.eq_ignore_ascii_case("transfer-encoding")
            || name.eq_ignore_ascii_case("content-length");
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value);
        out.extend_from_slice(b"\r\n");
    }
    if !framed {
        out.extend_from_slice(format!("Content-Length: {}\r\n", body.len()).as_bytes());
    }
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(body);
    out
}

fn with_key(path: &str, key: &[u8]) -> Vec<u8> {
    raw(path, &[("Idempotency-Key", key)], b"")
}

fn json(path: &str, body: &[u8]) -> Vec<u8> {
    raw(path, &[("Content-Type", b"application/json")], body)
}

/// `body` as one chunk of a chunked body, with the terminating chunk.
fn chunked_json(path: &str, body: &[u8]) -> Vec<u8> {
    let mut out = raw(
        path,
        &[
            ("Content-Type", b"application/json"),
            ("Transfer-Encoding", b"chunked"),
        ],
        b"",
    );
    out.extend_from_slice(format!("{:x}\r\n", body.len()).as_bytes());
    out.extend_from_slice(body);
    out.extend_from_slice(b"\r\n0\r\n\r\n");
    out
}

/// An HTTP response as read from the socket.
#[derive(Debug)]
struct Reply {
    status: u16,
    headers: Vec<(String, Vec<u8>)>,
    body: Vec<u8>,
    /// The body arrived in full (length reached, or the terminating chunk).
    complete: bool,
}

impl Reply {
    fn header(&self, name: &str) -> Option<&[u8]> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_slice())
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// Decodes a chunked body: `(body, saw the terminating chunk)`, `None` if more is needed.
fn dechunk(mut rest: &[u8], eof: bool) -> Option<(Vec<u8>, bool)> {
    let mut body = Vec::new();
    loop {
        let Some(line_end) = find(rest, b"\r\n") else {
            return eof.then_some((body, false));
        };
        let size = std::str::from_utf8(&rest[..line_end])
            .ok()
            .and_then(|s| usize::from_str_radix(s.split(';').next()?.trim(), 16).ok());
        let Some(size) = size else {
            return Some((body, false));
        };
        let data = &rest[line_end + 2..];
        if size == 0 {
            return Some((body, true));
        }
        if data.len() < size + 2 {
            if eof {
                body.extend_from_slice(&data[..data.len().min(size)]);
                return Some((body, false));
            }
            return None;
        }
        body.extend_from_slice(&data[..size]);
        rest = &data[size + 2..];
    }
}

/// Parses `buf` as one response; `None` if more bytes are needed (and may come).
fn parse(buf: &[u8], eof: bool) -> Option<Reply> {
    let head_end = find(buf, b"\r\n\r\n")?;
    let head = &buf[..head_end];
    let mut lines = head.split(|&b| b == b'\n').map(|l| l.trim_ascii_end());
    let status_line = String::from_utf8_lossy(lines.next()?).into_owned();
    let status = status_line.split(' ').nth(1)?.parse().ok()?;
    let headers: Vec<(String, Vec<u8>)> = lines
        .filter_map(|line| {
            let colon = line.iter().position(|&b| b == b':')?;
            let name = String::from_utf8_lossy(&line[..colon]).to_ascii_lowercase();
            Some((name, line[colon + 1..].trim_ascii().to_vec()))
        })
        .collect();
    let rest = &buf[head_end + 4..];
    let get = |name: &str| headers.iter().find(|(n, _)| n == name).map(|(_, v)| v);
    let (body, complete) = if let Some(len) = get("content-length") {
        let len: usize = std::str::from_utf8(len).ok()?.parse().ok()?;
        if rest.len() >= len {
            (rest[..len].to_vec(), true)
        } else if eof {
            (rest.to_vec(), false)
        } else {
            return None;
        }
    } else if get("transfer-encoding").is_some_and(|te| te.eq_ignore_ascii_case(b"chunked")) {
        dechunk(rest, eof)?
    } else if eof {
        (rest.to_vec(), true)
    } else {
        return None;
    };
    Some(Reply {
        status,
        headers,
        body,
        complete,
    })
}

/// Reads one response within `bound`; `None` if the connection closed (or the bound
/// passed) before a status line and headers arrived.
async fn read_reply(stream: &mut (impl AsyncRead + Unpin), bound: Duration) -> Option<Reply> {
    let deadline = tokio::time::Instant::now() + bound;
    let mut buf = Vec::new();
    let mut chunk = vec![0; 64 * 1024];
    loop {
        match tokio::time::timeout_at(deadline, stream.read(&mut chunk)).await {
            Ok(Ok(n)) if n > 0 => {
                buf.extend_from_slice(&chunk[..n]);
                if let Some(reply) = parse(&buf, false) {
                    return Some(reply);
                }
            }
            // Closed, reset, or out of time: what arrived is all there is.
            _ => return parse(&buf, true),
        }
    }
}

/// Writes `request` (in a task of its own, so a server that answers before reading the
/// whole body cannot deadlock the test; write errors after an early answer are expected)
/// and reads the answer.
async fn exchange(addr: std::net::SocketAddr, request: Vec<u8>) -> Option<Reply> {
    let stream = TcpStream::connect(addr).await.expect("connect");
    let (mut rd, mut wr) = stream.into_split();
    let writer = tokio::spawn(async move {
        let _ = wr.write_all(&request).await;
        // Keep the write half open until the answer is read.
        wr
    });
    let reply = read_reply(&mut rd, ANSWER_BOUND).await;
    writer.abort();
    reply
}

// ---------------------------------------------------------------------------------------
// Redis inspection
// ---------------------------------------------------------------------------------------

async fn keys(redis: &mut redis::aio::MultiplexedConnection) -> Vec<String> {
    redis::cmd("KEYS")
        .arg("*")
        .query_async(redis)
        .await
        .expect("KEYS *")
}

/// Lock hashes in Redis (every key that is not a fencing key).
async fn lock_hashes(redis: &mut redis::aio::MultiplexedConnection) -> Vec<String> {
    keys(redis)
        .await
        .into_iter()
        .filter(|k| !k.ends_with(":fence"))
        .collect()
}

/// Waits (bounded) until no lock is held, then checks what is left: nothing if no lock
/// was ever taken, otherwise only fencing keys, inside the namespace and with a TTL
/// (they expire with the lease; see "Fencing tokens" in `lockwarden::guide::how_it_works`).
async fn assert_nothing_locked(
    redis: &mut redis::aio::MultiplexedConnection,
    row: &str,
    lock_taken: bool,
) {
    let deadline = Instant::now() + Duration::from_secs(3);
    loop {
        let held = lock_hashes(redis).await;
        if held.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "[{row}] lock(s) still held: {held:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let left = keys(redis).await;
    if !lock_taken {
        assert!(
            left.is_empty(),
            "[{row}] no lock was due, yet Redis has {left:?}"
        );
    }
    for key in left {
        assert!(
            key.starts_with("lockwarden:{http:") && key.ends_with("}:fence"),
            "[{row}] unexpected key {key:?}"
        );
        let ttl: i64 = redis::cmd("PTTL")
            .arg(&key)
            .query_async(redis)
            .await
            .expect("PTTL");
        assert!(
            ttl == -2 || (1..=30_000).contains(&ttl),
            "[{row}] fencing key {key:?} has PTTL {ttl}: it must expire"
        );
    }
}

async fn flush(redis: &mut redis::aio::MultiplexedConnection) {
    let () = redis::cmd("FLUSHALL")
        .query_async(redis)
        .await
        .expect("FLUSHALL");
}

// ---------------------------------------------------------------------------------------
// The table
// ---------------------------------------------------------------------------------------

/// How the request goes over the wire.
enum Wire {
    /// Write the request, read the answer.
    Send,
    /// Write the request head, then chunks of JSON padding without end (bounded at
    /// 64 MiB / 10 s on the client side) while reading the answer.
    SendForever,
    /// Write the request (an unfinished body), wait, check Redis — a lock must (not) be
    /// held meanwhile and no answer may have come — then close the connection.
    StallThenClose { locked_meanwhile: bool },
}

/// What must come back.
enum Expect {
    /// Answered by the lock layer: this status, `application/problem+json` with `type`
    /// `urn:lockwarden:problem:<slug>`, `title`, `status` (= the HTTP status), `detail`;
    /// no lock was taken.
    Problem(u16, &'static str),
    /// 200 from the handler, which held the lock with this Redis key.
    Locked(&'static str),
    /// Refused by hyper before the lock layer saw it: this status, not a problem document.
    Hyper(u16),
    /// The handler panicked: the application's panic guard answers 500.
    Panicked,
    /// 200, then the body fails mid-way: the chunked body ends without its last chunk.
    Truncated,
    /// No answer (the client left before one could be sent).
    Gone,
}

impl Expect {
    /// Whether the row takes a lock (so a fencing key may be left, expiring).
    fn takes_lock(&self) -> bool {
        matches!(
            self,
            Expect::Locked(_) | Expect::Panicked | Expect::Truncated
        )
    }
}

struct Row {
    name: &'static str,
    /// What this row proves.
    promise: &'static str,
    request: Vec<u8>,
    wire: Wire,
    expect: Expect,
    /// A request that must then get 200 (the key is free again).
    then_ok: Option<Vec<u8>>,
}

fn row(name: &'static str, promise: &'static str, request: Vec<u8>, expect: Expect) -> Row {
    Row {
        name,
        promise,
        request,
        wire: Wire::Send,
        expect,
        then_ok: None,
    }
}

fn table() -> Vec<Row> {
    let ten_kb = vec![b'k'; 10 * 1024];
    let one_mb_json = format!(r#"{{"id":"{}"}}"#, "m".repeat(1 << 20)).into_bytes();
    let mut rows = vec![
        // --- by_header("Idempotency-Key") ---
        row(
            "missing key",
            "a request without the header is 400 missing-key",
            raw("/h/echo", &[], b""),
            Expect::Problem(400, "missing-key"),
        ),
        row(
            "empty key",
            "an empty header value is not a key: 400 invalid-key (not the shared lock `http:`)",
            with_key("/h/echo", b""),
            Expect::Problem(400, "invalid-key"),
        ),
        row(
            "whitespace-only key",
            "a value of spaces is empty once HTTP trims it: 400 invalid-key",
            with_key("/h/echo", b"   "),
            Expect::Problem(400, "invalid-key"),
        ),
        row(
            "10 KB key",
            "a key over the length limit is 400 invalid-key",
            with_key("/h/echo", &ten_kb),
            Expect::Problem(400, "invalid-key"),
        ),
        row(
            "tab in key",
            "the one control character a header may carry is refused by the layer: 400 invalid-key",
            with_key("/h/echo", b"a\tb"),
            Expect::Problem(400, "invalid-key"),
        ),
        row(
            "obs-text (non-UTF-8) key",
            "header bytes 0x80-0xFF that are not UTF-8 are 400 invalid-key",
            with_key("/h/echo", b"evt-\xff\xfe"),
            Expect::Problem(400, "invalid-key"),
        ),
        row(
            "C1 control character in key",
            "U+0085 (NEL, sent as UTF-8) is a control character: 400 invalid-key",
            with_key("/h/echo", "a\u{85}b".as_bytes()),
            Expect::Problem(400, "invalid-key"),
        ),
        row(
            "duplicate Idempotency-Key headers",
            "two values are ambiguous (the handler might use the other one): 400 invalid-key, nothing locked",
            raw(
                "/h/echo",
                &[("Idempotency-Key", b"first"), ("Idempotency-Key", b"second")],
                b"",
            ),
            Expect::Problem(400, "invalid-key"),
        ),
        row(
            "duplicate identical Idempotency-Key headers",
            "also two equal values are 400 invalid-key (one rule, no guessing)",
            raw(
                "/h/echo",
                &[("Idempotency-Key", b"same"), ("Idempotency-Key", b"same")],
                b"",
            ),
            Expect::Problem(400, "invalid-key"),
        ),
        row(
            "control byte in key",
            "a raw 0x01 in a header never reaches the layer: hyper answers 400",
            with_key("/h/echo", b"a\x01b"),
            Expect::Hyper(400),
        ),
        row(
            "DEL byte in key",
            "a raw 0x7F in a header never reaches the layer: hyper answers 400",
            with_key("/h/echo", b"a\x7fb"),
            Expect::Hyper(400),
        ),
        row(
            "newline in key (obs-fold)",
            "a header folded onto a second line never reaches the layer: hyper answers 400",
            with_key("/h/echo", b"a\r\n b"),
            Expect::Hyper(400),
        ),
        row(
            "bare CR in key",
            "a CR inside a header value never reaches the layer: hyper answers 400",
            with_key("/h/echo", b"a\rb"),
            Expect::Hyper(400),
        ),
        row(
            "braces in key",
            "braces are valid: 200, percent-encoded inside the hash tag, so the key stays in the namespace and picks no slot",
            with_key("/h/echo", b"}{evt}{"),
            Expect::Locked("lockwarden:{http:%7D%7Bevt%7D%7B}"),
        ),
        row(
            "glob characters in key",
            "`*`, `?`, `[` are plain characters of a key: 200",
            with_key("/h/echo", b"*?[a-z]"),
            Expect::Locked("lockwarden:{http:*?[a-z]}"),
        ),
        row(
            "percent escapes in key",
            "a literal `%7B` cannot pose as an escaped brace: its `%` is escaped, 200",
            with_key("/h/echo", b"%7B%7D"),
            Expect::Locked("lockwarden:{http:%257B%257D}"),
        ),
        row(
            "namespace-looking key",
            "a key spelling another Redis key stays inside this one's hash tag: 200",
            with_key("/h/echo", b"}lockwarden:{victim"),
            Expect::Locked("lockwarden:{http:%7Dlockwarden:%7Bvictim}"),
        ),
        row(
            "UTF-8 key",
            "raw UTF-8 bytes in a header are a valid key: 200",
            with_key("/h/echo", "zahlung-é-✓".as_bytes()),
            Expect::Locked("lockwarden:{http:zahlung-é-✓}"),
        ),
        // --- by_json_field("/id"), 64 KiB ---
        row(
            "body not JSON",
            "a body that is not JSON is 400 invalid-body",
            json("/j/echo", b"{\"id\": oops"),
            Expect::Problem(400, "invalid-body"),
        ),
        row(
            "empty body",
            "an empty body is not JSON: 400 invalid-body",
            json("/j/echo", b""),
            Expect::Problem(400, "invalid-body"),
        ),
        row(
            "body not UTF-8",
            "a JSON string with invalid UTF-8 bytes is 400 invalid-body",
            json("/j/echo", b"{\"id\":\"\xff\xfe\"}"),
            Expect::Problem(400, "invalid-body"),
        ),
        row(
            "lone surrogate",
            "a JSON string with an unpaired surrogate escape is 400 invalid-body",
            json("/j/echo", br#"{"id":"\ud800"}"#),
            Expect::Problem(400, "invalid-body"),
        ),
        row(
            "number out of range",
            "a number JSON cannot hold (1e400) is 400 invalid-body",
            json("/j/echo", br#"{"id":1e400}"#),
            Expect::Problem(400, "invalid-body"),
        ),
        row(
            "field absent",
            "a well-formed body without the field is 422 missing-key",
            json("/j/echo", br#"{"other":"x"}"#),
            Expect::Problem(422, "missing-key"),
        ),
        row(
            "field null",
            "a null field counts as absent: 422 missing-key",
            json("/j/echo", br#"{"id":null}"#),
            Expect::Problem(422, "missing-key"),
        ),
        row(
            "field an object",
            "an object field is 422 invalid-body",
            json("/j/echo", br#"{"id":{"nested":"x"}}"#),
            Expect::Problem(422, "invalid-body"),
        ),
        row(
            "field an array",
            "an array field is 422 invalid-body",
            json("/j/echo", br#"{"id":["x"]}"#),
            Expect::Problem(422, "invalid-body"),
        ),
        row(
            "field a bool",
            "a bool field is 422 invalid-body",
            json("/j/echo", br#"{"id":true}"#),
            Expect::Problem(422, "invalid-body"),
        ),
        row(
            "field an empty string",
            "an empty string is not a key: 400 invalid-key (not the shared lock `http:`)",
            json("/j/echo", br#"{"id":""}"#),
            Expect::Problem(400, "invalid-key"),
        ),
        row(
            "field with a newline",
            "a JSON-escaped newline in the key is 400 invalid-key",
            json("/j/echo", br#"{"id":"a\nb"}"#),
            Expect::Problem(400, "invalid-key"),
        ),
        row(
            "field with NUL",
            "a JSON-escaped NUL in the key is 400 invalid-key",
            json("/j/echo", br#"{"id":"a\u0000b"}"#),
            Expect::Problem(400, "invalid-key"),
        ),
        row(
            "field with braces",
            "braces in a JSON key are valid: 200, escaped in Redis",
            json("/j/echo", br#"{"id":"{x}"}"#),
            Expect::Locked("lockwarden:{http:%7Bx%7D}"),
        ),
        row(
            "field a number",
            "a number field is its decimal text: 200",
            json("/j/echo", br#"{"id":42}"#),
            Expect::Locked("lockwarden:{http:42}"),
        ),
        row(
            "1 MB string, Content-Length",
            "a declared length over the 64 KiB limit is 413 body-too-large, without reading the body",
            json("/j/echo", &one_mb_json),
            Expect::Problem(413, "body-too-large"),
        ),
        row(
            "1 MB string, chunked",
            "a chunked body over the limit is 413 body-too-large once the limit is crossed",
            chunked_json("/j/echo", &one_mb_json),
            Expect::Problem(413, "body-too-large"),
        ),
        row(
            "body just over the limit",
            "one byte over the limit is 413",
            json("/j/echo", &vec![b' '; JSON_LIMIT + 1]),
            Expect::Problem(413, "body-too-large"),
        ),
        // --- by_json_field("/id"), 2 MiB limit ---
        row(
            "1 MB string within a 2 MiB limit",
            "read in full, a 1 MB key is over the key length limit: 400 invalid-key",
            json("/j2/echo", &one_mb_json),
            Expect::Problem(400, "invalid-key"),
        ),
    ];

    // A chunked JSON body that never ends: the head and the start of the document; the
    // client then streams padding forever.
    let mut forever = raw(
        "/j/echo",
        &[
            ("Content-Type", b"application/json"),
            ("Transfer-Encoding", b"chunked"),
        ],
        b"",
    );
    let opening = br#"{"id":"endless","pad":""#;
    forever.extend_from_slice(format!("{:x}\r\n", opening.len()).as_bytes());
    forever.extend_from_slice(opening);
    forever.extend_from_slice(b"\r\n");
    rows.push(Row {
        wire: Wire::SendForever,
        ..row(
            "chunked body that never ends",
            "the layer stops reading at the body limit: 413 arrives within 5 s while the client is still sending, nothing locked",
            forever,
            Expect::Problem(413, "body-too-large"),
        )
    });

    // A chunked JSON body that stalls: the layer waits for it (it sets no read deadline:
    // that is the server's or a timeout layer's job) but holds no lock while it waits.
    let mut stalled = raw(
        "/j/echo",
        &[
            ("Content-Type", b"application/json"),
            ("Transfer-Encoding", b"chunked"),
        ],
        b"",
    );
    stalled.extend_from_slice(b"7\r\n{\"id\":\"\r\n");
    rows.push(Row {
        wire: Wire::StallThenClose {
            locked_meanwhile: false,
        },
        then_ok: Some(json("/j/echo", br#"{"id":"stalled"}"#)),
        ..row(
            "JSON body stalls, then the client leaves",
            "no lock is taken while the key's body is still arriving; after the client leaves the key is usable",
            stalled,
            Expect::Gone,
        )
    });

    // by_header locks before the handler reads the body: a client that stops mid-body
    // holds the lock until it leaves, and then it is freed.
    rows.push(Row {
        wire: Wire::StallThenClose {
            locked_meanwhile: true,
        },
        then_ok: Some(with_key("/h/echo", b"mid-body")),
        ..row(
            "client disconnects mid-body",
            "the lock is held while the handler awaits the body and freed when the client disconnects; the same key then succeeds",
            raw(
                "/h/echo",
                &[("Idempotency-Key", b"mid-body"), ("Content-Length", b"100")],
                b"only ten b",
            ),
            Expect::Gone,
        )
    });

    rows.push(Row {
        then_ok: Some(with_key("/h/echo", b"boom")),
        ..row(
            "handler panics",
            "the panic unwinds through the layer, which releases the lock; the app's guard answers 500; the same key then succeeds",
            with_key("/h/panic", b"boom"),
            Expect::Panicked,
        )
    });

    rows.push(Row {
        then_ok: Some(with_key("/h/echo", b"broken-stream")),
        ..row(
            "response body errors mid-way",
            "200 and a chunk, then the connection ends without the last chunk; the lock is released; the same key then succeeds",
            with_key("/h/stream-error", b"broken-stream"),
            Expect::Truncated,
        )
    });
    rows
}

fn assert_problem(row: &str, reply: &Reply, status: u16, slug: &str) {
    assert_eq!(
        reply.status,
        status,
        "[{row}] body {:?}",
        String::from_utf8_lossy(&reply.body)
    );
    assert_eq!(
        reply.header("content-type"),
        Some(&b"application/problem+json"[..]),
        "[{row}] content type"
    );
    assert!(reply.complete, "[{row}] problem body cut short");
    let doc: serde_json::Value = serde_json::from_slice(&reply.body)
        .unwrap_or_else(|e| panic!("[{row}] problem body is not JSON: {e}"));
    assert_eq!(doc["status"], status, "[{row}] status member");
    assert_eq!(
        doc["type"],
        format!("urn:lockwarden:problem:{slug}"),
        "[{row}] type member"
    );
    for member in ["title", "detail"] {
        assert!(
            doc[member].as_str().is_some_and(|s| !s.is_empty()),
            "[{row}] {member} member missing in {doc}"
        );
    }
    assert!(
        reply.header("retry-after").is_none(),
        "[{row}] Retry-After only for a busy lock"
    );
}

async fn run_row(h: &mut Harness, row: &Row) {
    let name = row.name;
    let started = Instant::now();
    let reply = match row.wire {
        Wire::Send => exchange(h.addr, row.request.clone()).await,
        Wire::SendForever => {
            let stream = TcpStream::connect(h.addr).await.expect("connect");
            let (mut rd, mut wr) = stream.into_split();
            let head = row.request.clone();
            let writer = tokio::spawn(async move {
                let padding = vec![b'p'; 8192];
                let mut chunk = format!("{:x}\r\n", padding.len()).into_bytes();
                chunk.extend_from_slice(&padding);
                chunk.extend_from_slice(b"\r\n");
                let mut sent = 0usize;
                let started = Instant::now();
                if wr.write_all(&head).await.is_err() {
                    return (sent, true);
                }
                while sent < 64 << 20 && started.elapsed() < Duration::from_secs(10) {
                    if wr.write_all(&chunk).await.is_err() {
                        // The server closed the connection on us.
                        return (sent, true);
                    }
                    sent += padding.len();
                }
                (sent, false)
            });
            let reply = read_reply(&mut rd, ANSWER_BOUND).await;
            if writer.is_finished() {
                let (sent, closed_by_server) = writer.await.expect("writer");
                assert!(
                    closed_by_server,
                    "[{name}] the client ran out of padding ({sent} bytes) before an answer"
                );
            } else {
                writer.abort();
            }
            reply
        }
        Wire::StallThenClose { locked_meanwhile } => {
            let mut stream = TcpStream::connect(h.addr).await.expect("connect");
            stream.write_all(&row.request).await.expect("write");
            if locked_meanwhile {
                let deadline = Instant::now() + Duration::from_secs(2);
                while lock_hashes(&mut h.redis).await.is_empty() {
                    assert!(
                        Instant::now() < deadline,
                        "[{name}] the handler never took the lock"
                    );
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            }
            // No answer while the body is unfinished, and the lock state holds.
            let early = read_reply(&mut stream, Duration::from_millis(300)).await;
            assert!(early.is_none(), "[{name}] answered mid-body: {early:?}");
            let held = lock_hashes(&mut h.redis).await;
            assert_eq!(
                !held.is_empty(),
                locked_meanwhile,
                "[{name}] locks while the body stalls: {held:?}"
            );
            drop(stream);
            None
        }
    };
    let elapsed = started.elapsed();

    match &row.expect {
        Expect::Problem(status, slug) => {
            let reply = reply.unwrap_or_else(|| panic!("[{name}] no answer"));
            assert_problem(name, &reply, *status, slug);
        }
        Expect::Locked(redis_key) => {
            let reply = reply.unwrap_or_else(|| panic!("[{name}] no answer"));
            assert_eq!(
                reply.status,
                200,
                "[{name}] {:?}",
                String::from_utf8_lossy(&reply.body)
            );
            assert_eq!(
                String::from_utf8_lossy(&reply.body),
                *redis_key,
                "[{name}] the handler's lock key"
            );
        }
        Expect::Hyper(status) => {
            let reply = reply.unwrap_or_else(|| panic!("[{name}] no answer"));
            assert_eq!(reply.status, *status, "[{name}]");
            assert_ne!(
                reply.header("content-type"),
                Some(&b"application/problem+json"[..]),
                "[{name}] hyper, not the layer, answers this"
            );
        }
        Expect::Panicked => {
            let reply = reply.unwrap_or_else(|| panic!("[{name}] no answer"));
            assert_eq!(reply.status, 500, "[{name}]");
        }
        Expect::Truncated => {
            let reply = reply.unwrap_or_else(|| panic!("[{name}] no answer"));
            assert_eq!(reply.status, 200, "[{name}]");
            assert!(
                !reply.complete,
                "[{name}] a failed body must not look complete"
            );
            assert!(
                reply.body.starts_with(b"partial") || reply.body.is_empty(),
                "[{name}] body {:?}",
                reply.body
            );
        }
        Expect::Gone => assert!(reply.is_none(), "[{name}] unexpected answer {reply:?}"),
    }
    assert!(elapsed < ANSWER_BOUND, "[{name}] took {elapsed:?}");

    assert_nothing_locked(
        &mut h.redis,
        name,
        row.expect.takes_lock()
            || matches!(
                row.wire,
                Wire::StallThenClose {
                    locked_meanwhile: true
                }
            ),
    )
    .await;
    if let Some(next) = &row.then_ok {
        let reply = exchange(h.addr, next.clone())
            .await
            .unwrap_or_else(|| panic!("[{name}] no answer to the follow-up"));
        assert_eq!(
            reply.status,
            200,
            "[{name}] the follow-up with the same key: {:?}",
            String::from_utf8_lossy(&reply.body)
        );
        assert_nothing_locked(&mut h.redis, name, true).await;
    }
    flush(&mut h.redis).await;
}

/// Every row of the bad-input table, in order, against one server and one redis-server:
/// each gets its stated answer (a problem document with `status` equal to the HTTP status
/// for everything the lock layer refuses), within 5 s, and leaves no lock in Redis.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn bad_input_table() {
    let mut h = start().await;
    let rows = table();
    let started = Instant::now();
    for row in &rows {
        eprintln!("row: {} — {}", row.name, row.promise);
        tokio::time::timeout(Duration::from_secs(15), run_row(&mut h, row))
            .await
            .unwrap_or_else(|_| panic!("[{}] timed out", row.name));
    }
    assert!(started.elapsed() < Duration::from_secs(30));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Every rejection is a well-formed RFC 9457 document whatever its detail text or
    /// retry hint: JSON with the four members, `status` equal to the HTTP status, the
    /// problem content type, and `Retry-After` (whole seconds, at least 1) only for a busy
    /// lock, a store that may come back and a shutdown.
    #[test]
    fn every_rejection_is_a_problem_document(
        detail in any::<String>(),
        secs in prop_oneof![0u64..100_000, any::<u64>(), Just(u64::MAX)],
        nanos in prop_oneof![Just(0u32), 0u32..1_000_000_000],
        status in prop::sample::select(vec![400u16, 409, 413, 422, 423, 503]),
        kind in 0u8..10,
    ) {
        let status = StatusCode::from_u16(status).expect("status");
        let retry_after = Duration::new(secs, nanos);
        let rejection = match kind {
            0 => Rejection::Busy { status, retry_after },
            1 => Rejection::MissingKey { status, detail: detail.clone() },
            2 => Rejection::InvalidKey { detail: detail.clone() },
            3 => Rejection::InvalidBody { status, detail: detail.clone() },
            4 => Rejection::BodyTooLarge { limit: usize::try_from(secs).unwrap_or(usize::MAX) },
            5 => Rejection::Unavailable { detail: detail.clone(), retry_after: None },
            6 => Rejection::Unavailable { detail: detail.clone(), retry_after: Some(retry_after) },
            7 => Rejection::ShuttingDown,
            8 => Rejection::Internal { detail: detail.clone() },
            _ => Rejection::Lost,
        };
        // What the client is told: never the internal detail of a 500.
        if kind == 8 {
            let doc: serde_json::Value = serde_json::from_slice(&rejection.to_json()).expect("JSON");
            prop_assert!(detail.len() < 8 || !doc["detail"].as_str().unwrap_or("").contains(&detail));
        }
        let hinted = matches!(kind, 0 | 6 | 7);
        let retry_after = if kind == 7 { Duration::from_secs(1) } else { retry_after };
        let response: axum::http::Response<Bytes> = rejection.to_response();
        prop_assert_eq!(response.status(), rejection.status());
        prop_assert_eq!(&response.headers()["content-type"], "application/problem+json");
        let doc: serde_json::Value = serde_json::from_slice(response.body()).expect("JSON");
        prop_assert_eq!(&doc["status"], response.status().as_u16());
        prop_assert_eq!(doc["type"].as_str(), Some(rejection.problem_type()));
        prop_assert_eq!(doc["title"].as_str(), Some(rejection.title()));
        prop_assert_eq!(doc["detail"].as_str().map(str::to_owned), Some(rejection.detail()));
        match response.headers().get("retry-after") {
            Some(value) => {
                prop_assert!(hinted, "kind {kind}");
                let sent: u64 = value.to_str().expect("ascii").parse().expect("seconds");
                prop_assert!(sent >= 1);
                // Rounded up (saturating): never shorter than the hint.
                prop_assert!(sent >= retry_after.as_secs());
                prop_assert!(sent == u64::MAX || Duration::from_secs(sent) >= retry_after);
            }
            None => prop_assert!(!hinted, "kind {kind}"),
        }
    }
}
