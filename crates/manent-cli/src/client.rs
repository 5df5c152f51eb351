//! The HTTP side of the CLI: requests with the token, and errors mapped to
//! the exit codes users script against.

use std::path::Path;

use serde_json::Value;

#[derive(Debug)]
pub enum CliError {
    /// Bad arguments or input (exit 2).
    Usage(String),
    /// The server said no to the input (exit 2).
    Rejected(String),
    /// Unreachable, or the token was refused (exit 3).
    Unreachable(String),
    /// Anything else the server reported (exit 1).
    Failed(String),
}

impl CliError {
    pub fn exit_code(&self) -> u8 {
        match self {
            CliError::Usage(_) | CliError::Rejected(_) => 2,
            CliError::Unreachable(_) => 3,
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
            | CliError::Failed(m) => f.write_str(m),
        }
    }
}

pub struct ApiClient {
    base: String,
    token: Option<String>,
    http: reqwest::Client,
}

impl ApiClient {
    pub fn new(base: &str, token: Option<String>) -> Result<Self, CliError> {
        let http = reqwest::Client::builder()
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

    async fn send(&self, request: reqwest::RequestBuilder) -> Result<Value, CliError> {
        let response = request.send().await.map_err(|e| {
            CliError::Unreachable(format!("cannot reach the server at {}: {e}", self.base))
        })?;
        let status = response.status();
        let body: Value = response.json().await.unwrap_or(Value::Null);
        if status.is_success() {
            return Ok(body);
        }
        let message = body["error"]["message"]
            .as_str()
            .map_or_else(|| format!("HTTP {status}"), str::to_string);
        let message = match body["error"]["field"].as_str() {
            Some(field) => format!("{field}: {message}"),
            None => message,
        };
        Err(match status.as_u16() {
            401 | 403 => CliError::Unreachable(format!("refused: {message}")),
            400 | 404 | 409 | 422 => CliError::Rejected(message),
            _ => CliError::Failed(message),
        })
    }

    pub async fn get(&self, path: &str) -> Result<Value, CliError> {
        self.send(self.request(reqwest::Method::GET, path)).await
    }

    pub async fn get_query(&self, path: &str, query: &[(&str, String)]) -> Result<Value, CliError> {
        self.send(self.request(reqwest::Method::GET, path).query(query))
            .await
    }

    pub async fn post(&self, path: &str, body: &Value) -> Result<Value, CliError> {
        self.send(self.request(reqwest::Method::POST, path).json(body))
            .await
    }

    /// Sends the descriptor as written (YAML or JSON): the server names the
    /// file's fields and lines in its errors.
    pub async fn submit(&self, text: &str, file: &Path, dry_run: bool) -> Result<Value, CliError> {
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
        self.send(request).await
    }
}
