//! manent-deploy's HTTP port (`manent_deploy::http::HttpFetch`) implemented with reqwest:
//! the worker's one HTTP client (webhooks, artifact downloads, HTTP checks, the analysis'
//! HTTP and Prometheus providers), which follows no redirect by itself (a caller that
//! follows them checks each hop) and never puts a URL in an error (its path may be a secret).

use async_trait::async_trait;
use manent_deploy::http::{
    HttpAuth, HttpBody, HttpError, HttpErrorKind, HttpFetch, HttpRequest, HttpResponse, Method,
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
        // reqwest marks both headers sensitive: never shown by its `Debug`.
        builder = match request.auth {
            None => builder,
            Some(HttpAuth::Bearer(token)) => builder.bearer_auth(token),
            Some(HttpAuth::Basic { username, password }) => {
                builder.basic_auth(username, Some(password))
            }
        };
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
            reason: response.status().canonical_reason().map(str::to_string),
            headers,
            body: Box::new(Body(response)),
        })
    }
}

#[cfg(test)]
mod tests {
    use manent_deploy::http::read_body;
    use manent_testkit::http::{header, serve as server};

    use super::*;

    #[tokio::test]
    async fn a_redirect_is_answered_as_it_came_and_credentials_go_as_given() {
        let (base, seen) = server(|path| match path {
            "/moved" => (
                "HTTP/1.1 302 Found\r\nLocation: /elsewhere\r\nContent-Length: 0\r\nConnection: close".into(),
                Vec::new(),
            ),
            _ => ("HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close".into(), Vec::new()),
        })
        .await;
        let http = Reqwest::new().expect("the worker's client");
        let bearer = Some(HttpAuth::Bearer("s3cret".into()));
        let moved = http
            .send(HttpRequest::get(format!("{base}/moved")).auth(bearer))
            .await
            .expect("an answer");
        assert_eq!(
            (moved.status, moved.header("location")),
            (302, Some("/elsewhere")),
            "the redirect is the answer, its headers by lower-case name: the caller follows it"
        );
        let basic = Some(HttpAuth::Basic {
            username: "ci".into(),
            password: "hunter2".into(),
        });
        let missing = http
            .send(HttpRequest::get(format!("{base}/missing")).auth(basic))
            .await
            .expect("an answer");
        assert_eq!(
            missing.status_text(),
            "404 Not Found",
            "the status with its reason"
        );
        let heads = seen.lock().unwrap().clone();
        let sent: Vec<Option<String>> = heads.iter().map(|h| header(h, "authorization")).collect();
        assert_eq!(
            sent,
            [
                Some("Bearer s3cret".to_string()),
                Some("Basic Y2k6aHVudGVyMg==".to_string())
            ],
            "each request carries its credentials, and only the two requests were sent: {heads:?}"
        );
    }

    #[tokio::test]
    async fn a_body_arrives_in_chunks_whole_announced_or_not() {
        let body: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
        let served = body.clone();
        let (base, _) = server(move |path| {
            let head = if path == "/announced" {
                format!(
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close",
                    served.len()
                )
            } else {
                "HTTP/1.1 200 OK\r\nConnection: close".to_string()
            };
            (head, served.clone())
        })
        .await;
        let http = Reqwest::new().expect("the worker's client");
        for (path, length) in [("/announced", Some(body.len() as u64)), ("/streamed", None)] {
            let mut response = http
                .send(HttpRequest::get(format!("{base}{path}")))
                .await
                .expect("an answer");
            assert_eq!(
                response.content_length(),
                length,
                "{path}: the length announced"
            );
            let read = read_body(&mut response, body.len())
                .await
                .expect("the body");
            assert!(
                read.as_ref() == Some(&body),
                "{path}: the body arrives whole"
            );
        }
    }

    #[tokio::test]
    async fn a_request_nobody_answers_says_why_and_not_where() {
        // A port nobody listens on: bound, then closed.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let http = Reqwest::new().expect("the worker's client");
        let request = HttpRequest::get(format!(
            "http://127.0.0.1:{port}/hooks/s3cret-path?token=t0ken"
        ));
        let Err(error) = http.send(request).await else {
            panic!("nothing listens on port {port}");
        };
        let text = error.to_string();
        assert!(
            error.kind == HttpErrorKind::Transport
                && text.contains("error sending request")
                && text.to_lowercase().contains("refused"),
            "the cause (connection refused) follows reqwest's own words: {error:?}"
        );
        assert!(
            !text.contains("s3cret-path")
                && !text.contains("t0ken")
                && !text.contains(&port.to_string()),
            "the error names no part of the URL: {text}"
        );
    }
}
