//! The API's listener against hostile clients (docs/security.md, "The listener"): hundreds
//! of sockets that send nothing, and one that sends half a request head, are all closed by
//! the server (shed beyond `api.max_connections`, timed out within it), while a deploy in
//! the same `serve` process runs to its end and the API answers again afterwards.

mod common;

use std::{
    io::{Read, Write},
    net::TcpStream,
};

use common::{Site, WAIT};
use manent_testkit::{Db, eventually};

/// More sockets than the cap, so that some are shed and some time out.
const IDLE_SOCKETS: usize = 300;

/// Reads until the server closes the connection; `false` if it is still open after WAIT.
fn closed_by_the_server(mut socket: TcpStream) -> bool {
    socket
        .set_read_timeout(Some(WAIT))
        .expect("set a safety-net read timeout");
    let mut buf = [0u8; 512];
    loop {
        match socket.read(&mut buf) {
            Ok(0) => return true,
            // An answer (a 408 on a half-sent head) then the close.
            Ok(_) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return true,
            Err(_) => return false,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_and_half_sent_connections_are_closed_and_a_running_deploy_is_untouched() {
    let mut site = Site::new(Db::Sqlite, &[]).await;
    // The deploy's command waits for a gate file in the site's directory.
    let gate_path = site.dir.join("gate");
    site.write_environment(
        "acme/web",
        "prod",
        &format!(
            "targets:\n  - {{name: t1, host: local}}\ndeploy:\n  plugin: command\n  commands:\n    - {}\n",
            serde_json::to_string(&format!(
                "echo started >> {ledger}; while [ ! -f {gate} ]; do sleep 0.05; done",
                ledger = site.dir.join("ledger").display(),
                gate = gate_path.display()
            ))
            .unwrap()
        ),
    );
    let token = site.token();
    site.start_with(
        "serve",
        "node-1",
        &[
            ("MANENT__API__MAX_CONNECTIONS", "20"),
            ("MANENT__API__HEADER_READ_TIMEOUT", "1s"),
        ],
    );
    site.wait_api().await;
    let descriptor = site.descriptor("1.0");
    let (code, submitted) = site.cli(&token, &["deploy", "-f", descriptor.to_str().unwrap()]);
    assert_eq!(code, 0, "submission accepted: {submitted}");
    let id = submitted["id"].as_str().unwrap().to_string();
    eventually("the deploy's command runs", WAIT, || async {
        site.ledger().contains("started").then_some(())
    })
    .await;

    let port = site.port;
    let mut half_sent = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    half_sent
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: manent\r\n")
        .expect("send half a head");
    let idle: Vec<TcpStream> = (0..IDLE_SOCKETS)
        .map(|_| TcpStream::connect(("127.0.0.1", port)).expect("connect an idle socket"))
        .collect();
    let still_open = tokio::task::spawn_blocking(move || {
        let mut still_open = 0;
        for socket in idle {
            if !closed_by_the_server(socket) {
                still_open += 1;
            }
        }
        (still_open, closed_by_the_server(half_sent))
    })
    .await
    .expect("watch the sockets");
    assert_eq!(
        still_open,
        (0, true),
        "every idle socket (beyond the cap: at once; within it: after the header timeout) \
         and the half-sent head are closed by the server"
    );

    std::fs::write(&gate_path, "").expect("open the gate");
    let done = eventually("the deploy finishes", WAIT, || async {
        let (_, status) = site.cli(&token, &["status", &id]);
        matches!(status["status"].as_str(), Some("SUCCESS" | "ERROR")).then_some(status)
    })
    .await;
    assert_eq!(
        done["status"], "SUCCESS",
        "the deploy that ran through the flood succeeds, and the API answers again: {done}"
    );
}

/// The status of `GET path` sent over a fresh connection, with `token` when given.
fn status_of(port: u16, path: &str, token: Option<&str>) -> u16 {
    let mut socket = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    let authorization = token.map_or(String::new(), |t| format!("Authorization: Bearer {t}\r\n"));
    write!(
        socket,
        "GET {path} HTTP/1.1\r\nHost: manent\r\n{authorization}Connection: close\r\n\r\n"
    )
    .expect("send the request");
    let mut answer = String::new();
    socket.read_to_string(&mut answer).expect("read the answer");
    answer
        .split_whitespace()
        .nth(1)
        .and_then(|status| status.parse().ok())
        .unwrap_or_else(|| panic!("an HTTP answer: {answer:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_failing_to_authenticate_over_the_listener_is_throttled_and_audited_in_summary_while_the_cli_is_served()
 {
    let mut site = Site::new(Db::Sqlite, &[]).await;
    let token = site.token();
    site.start_with(
        "api",
        "api-1",
        &[
            ("MANENT__API__AUTH_THROTTLE__FAILURES", "3"),
            ("MANENT__API__AUTH_THROTTLE__WINDOW", "1h"),
        ],
    );
    site.wait_api().await;
    let port = site.port;
    let statuses: Vec<u16> = (0..20)
        .map(|_| status_of(port, "/api/v1/deploys", None))
        .collect();
    assert_eq!(
        statuses,
        [[401u16; 3].as_slice(), [429u16; 17].as_slice()].concat(),
        "the listener gives each request its peer address, which the throttle counts"
    );
    assert_eq!(
        status_of(port, "/api/v1/deploys", Some(&token)),
        200,
        "a valid token from the same address is served"
    );
    let (code, trail) = site.cli(&token, &["audit", "--actor", "-", "--limit", "100"]);
    assert_eq!(code, 0, "manent audit --actor - answers: {trail}");
    let rows = trail.as_array().expect("the audit trail as JSON");
    let actions: Vec<&str> = rows.iter().filter_map(|e| e["action"].as_str()).collect();
    assert_eq!(
        actions,
        ["auth.failures", "GET /api/v1/deploys"],
        "20 anonymous requests are two entries (the first, then the trip), not 20: {trail}"
    );
    assert_eq!(
        rows[0]["target"], "127.0.0.1",
        "the summary names the source address: {trail}"
    );
}

/// A connection to the API from the loopback address `from` (any of 127.0.0.0/8: each is a
/// source of its own for the listener's cap per source).
async fn connect_from(from: &str, port: u16) -> tokio::net::TcpStream {
    let socket = tokio::net::TcpSocket::new_v4().expect("a socket");
    socket
        .bind(format!("{from}:0").parse().expect("a loopback address"))
        .unwrap_or_else(|e| panic!("bind the source address {from}: {e}"));
    socket
        .connect(([127, 0, 0, 1], port).into())
        .await
        .unwrap_or_else(|e| panic!("connect from {from}: {e}"))
}

/// One answer: its status, its head (lower case) and its body.
#[derive(Debug)]
struct Answer {
    status: u16,
    head: String,
    body: String,
}

/// Sends `GET path` on `socket` (keep-alive: the connection stays open once answered) and
/// reads the answer (by its `Content-Length`, or to the end); `None` when the server closed
/// the connection without an answer.
async fn get(
    socket: &mut tokio::net::TcpStream,
    path: &str,
    token: Option<&str>,
) -> Option<Answer> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let authorization = token.map_or(String::new(), |t| format!("Authorization: Bearer {t}\r\n"));
    let request = format!("GET {path} HTTP/1.1\r\nHost: manent\r\n{authorization}\r\n");
    socket.write_all(request.as_bytes()).await.ok()?;
    let mut bytes = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let text = String::from_utf8_lossy(&bytes).to_string();
        if let Some((head, body)) = text.split_once("\r\n\r\n") {
            let head = head.to_ascii_lowercase();
            let length = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|n| n.trim().parse::<usize>().ok());
            if length.is_some_and(|n| body.len() >= n) {
                let status = head.split_whitespace().nth(1)?.parse().ok()?;
                return Some(Answer {
                    status,
                    head,
                    body: body.to_string(),
                });
            }
        }
        let n = socket.read(&mut chunk).await.unwrap_or(0);
        if n == 0 {
            return None;
        }
        bytes.extend_from_slice(&chunk[..n]);
    }
}

/// `GET path` over a fresh connection from `from`.
async fn get_from(from: &str, port: u16, path: &str, token: Option<&str>) -> Option<Answer> {
    let mut socket = connect_from(from, port).await;
    get(&mut socket, path, token).await
}

/// `count` connections from `from`, each served once and kept open: each holds its slot.
async fn hold(from: &str, port: u16, count: usize) -> Vec<tokio::net::TcpStream> {
    let mut held = Vec::new();
    for i in 0..count {
        let mut socket = connect_from(from, port).await;
        let answer = get(&mut socket, "/healthz", None).await;
        assert!(
            answer
                .as_ref()
                .is_some_and(|a| a.status == 200 && !a.head.contains("connection: close")),
            "connection {i} from {from} is served and kept open: {answer:?}"
        );
        held.push(socket);
    }
    held
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_source_is_capped_while_others_connect_and_health_probes_are_answered_beyond_every_cap()
{
    let mut site = Site::new(Db::Sqlite, &[]).await;
    let token = site.token();
    site.start_with(
        "api",
        "api-1",
        &[
            ("MANENT__API__MAX_CONNECTIONS", "6"),
            ("MANENT__API__MAX_CONNECTIONS_PER_SOURCE", "3"),
            // Held connections must not be closed for idleness while the test runs.
            ("MANENT__API__HEADER_READ_TIMEOUT", "1h"),
        ],
    );
    site.wait_api().await;
    let port = site.port;

    // 127.0.0.2 takes its whole share.
    let flood = hold("127.0.0.2", port, 3).await;
    let refused = get_from("127.0.0.2", port, "/api/v1/whoami", Some(&token)).await;
    assert!(
        refused.as_ref().is_some_and(|a| a.status == 503
            && a.body.contains("api.max_connections_per_source")
            && a.head.contains("connection: close")),
        "a fourth connection from the same source is not served, and the answer names the cap: {refused:?}"
    );
    let probe = eventually("a health probe from the capped source", WAIT, || async {
        get_from("127.0.0.2", port, "/healthz", None)
            .await
            .filter(|a| a.status == 200)
    })
    .await;
    assert!(
        probe.head.contains("connection: close"),
        "the probe's reserved connection is given back after one answer: {probe:?}"
    );
    let other = get_from("127.0.0.3", port, "/api/v1/whoami", Some(&token)).await;
    assert_eq!(
        other.as_ref().map(|a| a.status),
        Some(200),
        "another source is served while the first is capped: {other:?}"
    );

    // 127.0.0.3 takes the rest of the global cap.
    let rest = eventually("127.0.0.3's connections all held", WAIT, || async {
        // The whoami connection above may still be closing: retried until it is gone.
        let mut held = Vec::new();
        for _ in 0..3 {
            let mut socket = connect_from("127.0.0.3", port).await;
            match get(&mut socket, "/healthz", None).await {
                Some(a) if !a.head.contains("connection: close") => held.push(socket),
                _ => return None,
            }
        }
        Some(held)
    })
    .await;
    let refused = get_from("127.0.0.4", port, "/api/v1/whoami", Some(&token)).await;
    assert!(
        refused.as_ref().is_some_and(|a| a.status == 503
            && a.body.contains("api.max_connections)")
            && a.head.contains("connection: close")),
        "with the global cap reached a new source is not served either: {refused:?}"
    );
    for path in ["/healthz", "/readyz"] {
        eventually(
            &format!("{path} answered with every cap reached"),
            WAIT,
            || async {
                get_from("127.0.0.4", port, path, None)
                    .await
                    .filter(|a| a.status == 200)
            },
        )
        .await;
    }

    drop((flood, rest));
    eventually(
        "the API serves again once the flood closes",
        WAIT,
        || async {
            get_from("127.0.0.2", port, "/api/v1/whoami", Some(&token))
                .await
                .filter(|a| a.status == 200)
        },
    )
    .await;
}
