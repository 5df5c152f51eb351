//! The HTTP port (ARCHITECTURE.md, invariant 9): what manent-deploy asks of an HTTP client,
//! as its own types. The worker binary implements it (manent-server, `http.rs`, with
//! reqwest) and hands it in; this crate holds no HTTP client. Its users: webhook
//! deliveries, artifact downloads, HTTP checks, the analysis' Prometheus and HTTP providers.
//! A request follows no redirect by itself: artifacts check each hop against their sources;
//! checks and metrics, which carry no credentials, follow them with
//! [`get_following_redirects`].

use std::{fmt, time::Duration};

use async_trait::async_trait;

/// A request's method.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    Get,
    Post,
}

/// One request.
#[derive(Debug, Clone)]
pub struct HttpRequest {
    pub method: Method,
    pub url: String,
    /// Sent as given, in order.
    pub headers: Vec<(String, String)>,
    pub body: Option<Vec<u8>>,
    /// The credentials it carries (`Authorization`), only to the URL it is sent to.
    pub auth: Option<HttpAuth>,
    /// The longest the whole exchange may take; none: no limit of its own.
    pub timeout: Option<Duration>,
}

/// A request's credentials. `Debug` never shows them.
#[derive(Clone, PartialEq, Eq)]
pub enum HttpAuth {
    Bearer(String),
    Basic { username: String, password: String },
}

impl fmt::Debug for HttpAuth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HttpAuth::Bearer(_) => f.write_str("Bearer(…)"),
            HttpAuth::Basic { username, .. } => write!(f, "Basic({username}:…)"),
        }
    }
}

impl HttpRequest {
    /// A POST of `body` to `url`.
    pub fn post(url: impl Into<String>, body: Vec<u8>) -> Self {
        HttpRequest {
            method: Method::Post,
            url: url.into(),
            headers: Vec::new(),
            body: Some(body),
            auth: None,
            timeout: None,
        }
    }

    /// A GET of `url`.
    pub fn get(url: impl Into<String>) -> Self {
        HttpRequest {
            method: Method::Get,
            url: url.into(),
            headers: Vec::new(),
            body: None,
            auth: None,
            timeout: None,
        }
    }

    pub fn header(mut self, name: &str, value: impl Into<String>) -> Self {
        self.headers.push((name.to_string(), value.into()));
        self
    }

    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    pub fn auth(mut self, auth: Option<HttpAuth>) -> Self {
        self.auth = auth;
        self
    }
}

/// What a request could not do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HttpErrorKind {
    /// The request could not be built (a URL or a header the client refuses).
    Request,
    /// It timed out.
    Timeout,
    /// Anything else on the way: connection, TLS, the body cut short.
    Transport,
}

/// Why a request failed: the client's message with each cause, `: `-separated, and never
/// the URL (whose path or query may be a secret: the caller names what it may show).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct HttpError {
    pub kind: HttpErrorKind,
    pub message: String,
}

/// A response: its status and headers, its body read in chunks.
pub struct HttpResponse {
    pub status: u16,
    /// The status's canonical reason (`Not Found`), when it has one.
    pub reason: Option<String>,
    /// Lower-case names.
    pub headers: Vec<(String, String)>,
    pub body: Box<dyn HttpBody>,
}

impl HttpResponse {
    /// The first value of header `name` (lower-case).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    pub fn is_success(&self) -> bool {
        (200..300).contains(&self.status)
    }

    /// The status as messages show it: `404 Not Found`.
    pub fn status_text(&self) -> String {
        status_text(self.status, self.reason.as_deref())
    }

    /// The length its `content-length` announces, if any.
    pub fn content_length(&self) -> Option<u64> {
        self.header("content-length")?.trim().parse().ok()
    }
}

/// A status as messages show it: `404 Not Found`, `599 <unknown status code>`.
pub fn status_text(status: u16, reason: Option<&str>) -> String {
    format!("{status} {}", reason.unwrap_or("<unknown status code>"))
}

/// A response's body.
#[async_trait]
pub trait HttpBody: Send {
    /// The next chunk; none at the end.
    async fn chunk(&mut self) -> Result<Option<Vec<u8>>, HttpError>;
}

/// Sends requests: the port the worker binary implements.
#[async_trait]
pub trait HttpFetch: Send + Sync {
    async fn send(&self, request: HttpRequest) -> Result<HttpResponse, HttpError>;
}

/// The HTTP of a process that has no client (tests that start a worker in-process, without
/// manent-server, and reach nothing over HTTP): every request is refused, saying why.
pub struct NoClient;

#[async_trait]
impl HttpFetch for NoClient {
    async fn send(&self, _request: HttpRequest) -> Result<HttpResponse, HttpError> {
        Err(HttpError {
            kind: HttpErrorKind::Request,
            message: "this worker has no HTTP client".into(),
        })
    }
}

/// The most redirects [`get_following_redirects`] follows.
pub const MAX_REDIRECTS: usize = 10;

/// GETs `url` and follows its redirects (at most [`MAX_REDIRECTS`]), as a browser would:
/// for a check's or a metric's URL, whose requests carry no credentials a redirect could
/// take elsewhere. Artifacts do not use it: each of their hops is checked against the
/// sources. A redirect without a usable `Location` is the answer.
pub async fn get_following_redirects(
    http: &dyn HttpFetch,
    url: &str,
) -> Result<HttpResponse, HttpError> {
    let mut next = url.to_string();
    for _ in 0..=MAX_REDIRECTS {
        let response = http.send(HttpRequest::get(next.as_str())).await?;
        if !matches!(response.status, 301 | 302 | 303 | 307 | 308) {
            return Ok(response);
        }
        let Some(to) = response.header("location").and_then(|location| {
            let base = url::Url::parse(&next).ok()?;
            base.join(location).ok()
        }) else {
            return Ok(response);
        };
        next = to.into();
    }
    Err(HttpError {
        kind: HttpErrorKind::Transport,
        message: format!("error following redirect: more than {MAX_REDIRECTS} redirects"),
    })
}

/// The whole body of `response`, at most `limit` bytes; `None` past the limit.
pub async fn read_body(
    response: &mut HttpResponse,
    limit: usize,
) -> Result<Option<Vec<u8>>, HttpError> {
    let mut body = Vec::new();
    while let Some(chunk) = response.body.chunk().await? {
        body.extend_from_slice(&chunk);
        if body.len() > limit {
            return Ok(None);
        }
    }
    Ok(Some(body))
}

/// An in-process [`HttpFetch`] for this crate's unit tests, which hold no HTTP client: the
/// real one is manent-server's, tested there and, over the network, by its integration
/// tests. It answers each request with what `answer` says of its URL, the body in small
/// chunks (as a network would), and keeps every request it was sent.
#[cfg(test)]
pub(crate) mod canned {
    use std::sync::Mutex;

    use super::*;

    /// One answer: a status, headers, a body.
    pub struct Answer {
        pub status: u16,
        pub headers: Vec<(String, String)>,
        pub body: Vec<u8>,
    }

    impl Answer {
        /// `200 OK` with `body`, its length announced.
        pub fn ok(body: impl Into<Vec<u8>>) -> Self {
            let body = body.into();
            Answer::status(200)
                .header("content-length", body.len().to_string())
                .body(body)
        }

        /// `302 Found` to `location`.
        pub fn redirect(location: impl Into<String>) -> Self {
            Answer::status(302).header("location", location)
        }

        /// `status` with no header and no body.
        pub fn status(status: u16) -> Self {
            Answer {
                status,
                headers: Vec::new(),
                body: Vec::new(),
            }
        }

        pub fn header(mut self, name: &str, value: impl Into<String>) -> Self {
            self.headers.push((name.to_string(), value.into()));
            self
        }

        pub fn body(mut self, body: impl Into<Vec<u8>>) -> Self {
            self.body = body.into();
            self
        }
    }

    /// Answers requests by URL and keeps them.
    pub struct Canned {
        answer: Box<dyn Fn(&str) -> Answer + Send + Sync>,
        pub seen: Mutex<Vec<HttpRequest>>,
    }

    impl Canned {
        pub fn new(answer: impl Fn(&str) -> Answer + Send + Sync + 'static) -> Self {
            Canned {
                answer: Box::new(answer),
                seen: Mutex::new(Vec::new()),
            }
        }

        /// The URLs requested, in order.
        pub fn urls(&self) -> Vec<String> {
            self.seen
                .lock()
                .unwrap()
                .iter()
                .map(|r| r.url.clone())
                .collect()
        }
    }

    struct Chunks(std::collections::VecDeque<Vec<u8>>);

    #[async_trait]
    impl HttpBody for Chunks {
        async fn chunk(&mut self) -> Result<Option<Vec<u8>>, HttpError> {
            Ok(self.0.pop_front())
        }
    }

    #[async_trait]
    impl HttpFetch for Canned {
        async fn send(&self, request: HttpRequest) -> Result<HttpResponse, HttpError> {
            let answer = (self.answer)(&request.url);
            self.seen.lock().unwrap().push(request);
            Ok(HttpResponse {
                status: answer.status,
                reason: match answer.status {
                    200 => Some("OK".into()),
                    302 => Some("Found".into()),
                    404 => Some("Not Found".into()),
                    503 => Some("Service Unavailable".into()),
                    _ => None,
                },
                headers: answer.headers,
                body: Box::new(Chunks(
                    answer.body.chunks(1000).map(<[u8]>::to_vec).collect(),
                )),
            })
        }
    }
}
