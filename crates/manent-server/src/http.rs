//! manent-deploy's HTTP port (`manent_deploy::http::HttpFetch`) implemented with reqwest:
//! the worker's one HTTP client, which follows no redirect by itself (a caller that follows
//! them checks each hop) and never puts a URL in an error (its path may be a secret).

use async_trait::async_trait;
use manent_deploy::http::{
    HttpBody, HttpError, HttpErrorKind, HttpFetch, HttpRequest, HttpResponse, Method,
};

/// The worker's HTTP client.
pub struct Reqwest {
    client: reqwest::Client,
}

impl Reqwest {
    pub fn new() -> anyhow::Result<Self> {
        let client = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| anyhow::anyhow!("cannot build the worker's HTTP client: {}", chain(&e)))?;
        Ok(Reqwest { client })
    }
}

/// `error` without its URL, and each of its causes, `: `-separated.
fn chain(error: &reqwest::Error) -> String {
    let mut text = error.to_string();
    let mut cause = std::error::Error::source(error);
    while let Some(c) = cause {
        let c_text = c.to_string();
        if !text.contains(&c_text) {
            text.push_str(": ");
            text.push_str(&c_text);
        }
        cause = c.source();
    }
    text
}

fn http_error(error: reqwest::Error) -> HttpError {
    let error = error.without_url();
    let kind = if error.is_builder() {
        HttpErrorKind::Request
    } else if error.is_timeout() {
        HttpErrorKind::Timeout
    } else {
        HttpErrorKind::Transport
    };
    HttpError {
        kind,
        message: chain(&error),
    }
}

struct Body(reqwest::Response);

#[async_trait]
impl HttpBody for Body {
    async fn chunk(&mut self) -> Result<Option<Vec<u8>>, HttpError> {
        Ok(self
            .0
            .chunk()
            .await
            .map_err(http_error)?
            .map(|b| b.to_vec()))
    }
}

#[async_trait]
impl HttpFetch for Reqwest {
    async fn send(&self, request: HttpRequest) -> Result<HttpResponse, HttpError> {
        let mut builder = match request.method {
            Method::Get => self.client.get(&request.url),
            Method::Post => self.client.post(&request.url),
        };
        for (name, value) in &request.headers {
            builder = builder.header(name.as_str(), value.as_str());
        }
        if let Some(timeout) = request.timeout {
            builder = builder.timeout(timeout);
        }
        if let Some(body) = request.body {
            builder = builder.body(body);
        }
        let response = builder.send().await.map_err(http_error)?;
        let headers = response
            .headers()
            .iter()
            .filter_map(|(n, v)| Some((n.as_str().to_string(), v.to_str().ok()?.to_string())))
            .collect();
        Ok(HttpResponse {
            status: response.status().as_u16(),
            headers,
            body: Box::new(Body(response)),
        })
    }
}
