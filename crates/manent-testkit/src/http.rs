//! A canned HTTP/1.1 server on loopback for tests of what manent fetches: each connection
//! gets `answer(path)`, and every request's head is kept so a test can see what was sent
//! (paths, credentials).

use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The request heads a [`serve`] server received, in order.
pub type Heads = Arc<Mutex<Vec<String>>>;

/// Serves on a free loopback port until the test's runtime ends: each connection's request
/// is answered `answer(path)` (the status line and headers without the final blank line,
/// then the body) and closed. Returns the base URL (`http://127.0.0.1:<port>`) and the heads.
pub async fn serve(
    answer: impl Fn(&str) -> (String, Vec<u8>) + Send + Sync + 'static,
) -> (String, Heads) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind a loopback port");
    let base = format!("http://{}", listener.local_addr().expect("its address"));
    let heads: Heads = Arc::default();
    let (answer, record) = (Arc::new(answer), heads.clone());
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            let (answer, record) = (answer.clone(), record.clone());
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut buf = [0u8; 1024];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match socket.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                let head = String::from_utf8_lossy(&head).to_string();
                let path = head.split_whitespace().nth(1).unwrap_or("/").to_string();
                record.lock().unwrap_or_else(|e| e.into_inner()).push(head);
                let (status, body) = answer(&path);
                let _ = socket
                    .write_all(format!("{status}\r\n\r\n").as_bytes())
                    .await;
                let _ = socket.write_all(&body).await;
            });
        }
    });
    (base, heads)
}

/// The path a request `head` asked for.
pub fn path(head: &str) -> &str {
    head.split_whitespace().nth(1).unwrap_or("/")
}

/// The value of header `name` (any case) in a request `head`.
pub fn header(head: &str, name: &str) -> Option<String> {
    head.lines().find_map(|line| {
        let (n, v) = line.split_once(':')?;
        n.eq_ignore_ascii_case(name).then(|| v.trim().to_string())
    })
}
