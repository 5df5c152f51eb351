//! The HTTP port (ARCHITECTURE.md, invariant 9): what manent-deploy asks of an HTTP client,
//! as its own types. The worker binary implements it (manent-server, `http.rs`, with
//! reqwest) and hands it in; this crate holds no HTTP client. A request follows no
//! redirect by itself: a caller that follows them checks each hop (artifacts' sources).

use std::time::Duration;

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
    /// The longest the whole exchange may take; none: no limit of its own.
    pub timeout: Option<Duration>,
}

impl HttpRequest {
    /// A POST of `body` to `url`.
    pub fn post(url: impl Into<String>, body: Vec<u8>) -> Self {
        HttpRequest {
            method: Method::Post,
            url: url.into(),
            headers: Vec::new(),
            body: Some(body),
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
