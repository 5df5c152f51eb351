//! The HTTP side of the CLI: requests with the token, answers read into the contract's
//! types (`manent-contract`), and errors mapped to the exit codes users script against.

use std::path::Path;

use manent_contract::{BatchEntry, ErrorBody, SubmitBatch, Submitted};
use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};
use serde::{Serialize, de::DeserializeOwned};
use serde_json::Value;

/// Everything but RFC 3986's unreserved characters is encoded in a path segment.
const SEGMENT: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// `id` as one path segment: `../tokens` or `a?b` typed as an id stays an id.
pub fn segment(id: &str) -> String {
    match id {
        // A dot segment would be resolved away by URL normalisation.
        "." => "%2E".to_string(),
        ".." => "%2E%2E".to_string(),
        _ => utf8_percent_encode(id, SEGMENT).to_string(),
    }
}

#[derive(Debug)]
pub enum CliError {
    /// Bad arguments or input (exit 2).
    Usage(String),
    /// The server said no to the input (exit 2).
    Rejected(String),
    /// Unreachable, or the token was refused: unknown, expired or revoked (exit 3).
    Unreachable(String),
    /// A valid token without the right to do this: its role or scope (exit 4), so that a
    /// script tells "not allowed" from "cannot reach the server".
    Forbidden(String),
    /// The server could not be reached or answered that it is unavailable (502, 503,
    /// 504): worth retrying while following a deploy (exit 3).
    Transient(String),
    /// No such deploy, schedule, … (exit 2).
    NotFound(String),
    /// Anything else the server reported (exit 1).
    Failed(String),
}

impl CliError {
    pub fn exit_code(&self) -> u8 {
        match self {
            CliError::Usage(_) | CliError::Rejected(_) | CliError::NotFound(_) => 2,
            CliError::Unreachable(_) | CliError::Transient(_) => 3,
            CliError::Forbidden(_) => 4,
            CliError::Failed(_) => 1,
        }
    }
}

impl std::fmt::Display for CliError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CliError::Usage(m)
            | CliError::Rejected(m)
            | CliError::Unreachable(m)
            | CliError::Forbidden(m)
            | CliError::Transient(m)
            | CliError::NotFound(m)
            | CliError::Failed(m) => f.write_str(m),
        }
    }
}

/// An error with its causes (`error sending request: … invalid peer certificate: …`):
/// a TLS refusal is explained only in the innermost one.
fn causes(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// An answer of the server: read into `T`, and its JSON as the server sent it (what
/// `--output json` prints, unknown fields included).
#[derive(Debug)]
pub struct Answer<T> {
    pub body: T,
    pub json: Value,
}

impl<T: DeserializeOwned> Answer<T> {
    /// Reads `json`, the answer to `what`; an answer this CLI cannot read is an error that
    /// says so, never a table of `-`.
    pub fn read(what: &str, json: Value) -> Result<Self, CliError> {
        let body = serde_json::from_value(json.clone()).map_err(|e| {
            CliError::Failed(format!(
                "cannot read the server's answer to {what}: {e}; is the server a \
                 different version of manent?"
            ))
        })?;
        Ok(Answer { body, json })
    }
}

pub struct ApiClient {
    base: String,
    token: Option<String>,
    http: reqwest::Client,
}

impl ApiClient {
    /// A client of the API at `base`; `ca` is a PEM file of a private CA to trust for
    /// an `https://` server (its certificate is always verified).
    pub fn new(base: &str, token: Option<String>, ca: Option<&Path>) -> Result<Self, CliError> {
        let mut builder = reqwest::Client::builder().https_only(base.starts_with("https://"));
        if let Some(ca) = ca {
            let pem = std::fs::read(ca).map_err(|e| {
                CliError::Usage(format!("--ca {}: cannot read it: {e}", ca.display()))
            })?;
            let certificates = reqwest::Certificate::from_pem_bundle(&pem).map_err(|e| {
                CliError::Usage(format!("--ca {}: not a PEM certificate: {e}", ca.display()))
            })?;
            if certificates.is_empty() {
                return Err(CliError::Usage(format!(
                    "--ca {}: no certificate in it (expected PEM `BEGIN CERTIFICATE`)",
                    ca.display()
                )));
            }
            for certificate in certificates {
                builder = builder.add_root_certificate(certificate);
            }
        }
        let http = builder
            .build()
            .map_err(|e| CliError::Usage(format!("cannot build the HTTP client: {e}")))?;
        Ok(ApiClient {
            base: base.trim_end_matches('/').to_string(),
            token,
            http,
        })
    }

    fn request(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        let mut r = self.http.request(method, format!("{}{path}", self.base));
        if let Some(t) = &self.token {
            r = r.bearer_auth(t);
        }
        r
    }

    async fn send<T: DeserializeOwned>(
        &self,
        what: &str,
        request: reqwest::RequestBuilder,
    ) -> Result<Answer<T>, CliError> {
        let response = request.send().await.map_err(|e| {
            CliError::Transient(format!(
                "cannot reach the server at {}: {}",
                self.base,
                causes(&e)
            ))
        })?;
        let status = response.status();
        let body: Value = response.json().await.unwrap_or(Value::Null);
        if status.is_success() {
            return Answer::read(what, body);
        }
        // An error answer that is not the error body (a proxy's page) is told by its status.
        let message = match serde_json::from_value::<ErrorBody>(body) {
            Ok(ErrorBody { error }) => with_field(error.field.as_deref(), error.message),
            Err(_) => format!("HTTP {status}"),
        };
        Err(match status.as_u16() {
            401 => CliError::Unreachable(format!("refused: {message}")),
            403 => CliError::Forbidden(format!("not allowed: {message}")),
            404 => CliError::NotFound(message),
            400 | 409 | 422 => CliError::Rejected(message),
            502..=504 => CliError::Transient(message),
            _ => CliError::Failed(message),
        })
    }

    pub async fn get<T: DeserializeOwned>(&self, path: &str) -> Result<Answer<T>, CliError> {
        self.send(
            &format!("GET {path}"),
            self.request(reqwest::Method::GET, path),
        )
        .await
    }

    pub async fn get_query<T: DeserializeOwned, Q: serde::Serialize + ?Sized>(
        &self,
        path: &str,
        query: &Q,
    ) -> Result<Answer<T>, CliError> {
        self.send(
            &format!("GET {path}"),
            self.request(reqwest::Method::GET, path).query(query),
        )
        .await
    }

    pub async fn delete<T: DeserializeOwned>(&self, path: &str) -> Result<Answer<T>, CliError> {
        self.send(
            &format!("DELETE {path}"),
            self.request(reqwest::Method::DELETE, path),
        )
        .await
    }

    pub async fn post<T: DeserializeOwned>(
        &self,
        path: &str,
        body: &impl Serialize,
    ) -> Result<Answer<T>, CliError> {
        self.send(
            &format!("POST {path}"),
            self.request(reqwest::Method::POST, path).json(body),
        )
        .await
    }

    /// Sends the descriptor as written (YAML or JSON): the server names the
    /// file's fields and lines in its errors.
    pub async fn submit(
        &self,
        text: &str,
        file: &Path,
        dry_run: bool,
    ) -> Result<Answer<Submitted>, CliError> {
        let content_type = if file.extension().is_some_and(|e| e == "json") {
            "application/json"
        } else {
            "application/yaml"
        };
        let name = file
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let request = self
            .request(reqwest::Method::POST, "/api/v1/deploys")
            .query(&[("dry_run", dry_run.to_string()), ("file", name)])
            .header(reqwest::header::CONTENT_TYPE, content_type)
            .body(text.to_string());
        self.send("POST /api/v1/deploys", request).await
    }

    /// A bulk submission: every entry enqueued, or none (the error names the one refused).
    pub async fn submit_batch(
        &self,
        deploys: Vec<BatchEntry>,
        dry_run: bool,
    ) -> Result<Answer<Vec<Submitted>>, CliError> {
        let request = self
            .request(reqwest::Method::POST, "/api/v1/deploys/batch")
            .query(&[("dry_run", dry_run.to_string())])
            .json(&SubmitBatch { deploys });
        self.send("POST /api/v1/deploys/batch", request).await
    }
}

/// An error's message led by the field it names, once: a server message that already
/// names it (`schedule.cron: …`, a file's `d.yml:3: schedule.cron: …`) is not prefixed again.
fn with_field(field: Option<&str>, message: String) -> String {
    match field {
        Some(field)
            if !message.starts_with(&format!("{field}:"))
                && !message.contains(&format!(": {field}:")) =>
        {
            format!("{field}: {message}")
        }
        _ => message,
    }
}

#[cfg(test)]
mod tests {
    use super::{segment, with_field};

    #[test]
    fn an_error_names_its_field_once() {
        let check = |field: Option<&str>, message: &str, want: &str| {
            assert_eq!(
                with_field(field, message.to_owned()),
                want,
                "{field:?} {message:?}"
            )
        };
        check(
            Some("schedule.cron"),
            "`x` is not a cron expression",
            "schedule.cron: `x` is not a cron expression",
        );
        check(
            Some("schedule.cron"),
            "schedule.cron: too frequent",
            "schedule.cron: too frequent",
        );
        check(
            Some("schedule.cron"),
            "d.yml:3: schedule.cron: bad",
            "d.yml:3: schedule.cron: bad",
        );
        check(None, "no field", "no field");
    }

    #[test]
    fn an_id_is_encoded_as_one_path_segment() {
        let check = |id: &str, want: &str| assert_eq!(segment(id), want, "segment({id:?})");
        check("3f2a-9b_c.d~e", "3f2a-9b_c.d~e");
        check("nightly@1700000000", "nightly%401700000000");
        check("../tokens", "..%2Ftokens");
        check("..", "%2E%2E");
        check(".", "%2E");
        check("a?b#c d", "a%3Fb%23c%20d");
    }
}
