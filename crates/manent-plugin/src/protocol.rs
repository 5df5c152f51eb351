//! The wire format of the plugin protocol (version [`PROTOCOL_VERSION`]): newline-delimited
//! JSON, one object per line, requests on the plugin's stdin and replies on its stdout. The
//! plugin's stderr is its log. `docs/plugin-protocol.md` describes the same shapes for
//! plugin authors; keep both in step.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// The protocol version this crate speaks. A host and a plugin talk only if both speak it.
pub const PROTOCOL_VERSION: u32 = 1;

/// Decodes one line a plugin wrote (a reply). The host reads every line through this, so
/// the fuzz target `plugin_protocol` exercises exactly what a misbehaving plugin reaches.
pub fn decode_reply(line: &str) -> Result<Reply, serde_json::Error> {
    serde_json::from_str(line)
}

/// Decodes one line the host wrote (a request), as a plugin's `serve` loop does.
pub fn decode_request(line: &str) -> Result<Request, serde_json::Error> {
    serde_json::from_str(line)
}

/// One request, host → plugin: `{"id": 1, "method": "deploy", "params": {…}}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Request {
    /// Chosen by the host, echoed by every reply to this request.
    pub id: u64,
    #[serde(flatten)]
    pub body: RequestBody,
}

/// What a request asks.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "method", content = "params", rename_all = "snake_case")]
pub enum RequestBody {
    /// The first request on every process: the host's protocol version.
    Handshake { protocol: u32 },
    /// Dry-run: say what would change, change nothing.
    Plan(Pass),
    /// Deploy the pass's version on its targets.
    Deploy(Pass),
    /// Restore `previous_version` on the pass's targets.
    Rollback(Pass),
    /// Check the pass's targets after a deploy.
    Check(Pass),
}

/// The four operations on a pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Operation {
    Plan,
    Deploy,
    Rollback,
    Check,
}

impl Operation {
    pub fn as_str(self) -> &'static str {
        match self {
            Operation::Plan => "plan",
            Operation::Deploy => "deploy",
            Operation::Rollback => "rollback",
            Operation::Check => "check",
        }
    }

    /// The request body for this operation on `pass`.
    pub fn request(self, pass: Pass) -> RequestBody {
        match self {
            Operation::Plan => RequestBody::Plan(pass),
            Operation::Deploy => RequestBody::Deploy(pass),
            Operation::Rollback => RequestBody::Rollback(pass),
            Operation::Check => RequestBody::Check(pass),
        }
    }
}

impl std::fmt::Display for Operation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The unit of work of a plugin: one deploy's version on a set of targets.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Pass {
    pub deploy_id: String,
    /// `tenant/app`.
    pub application: String,
    pub environment: String,
    /// The version this deploy installs.
    pub version: String,
    /// For `rollback`: the version to restore (absent: there is none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub previous_version: Option<String>,
    pub targets: Vec<TargetRef>,
    pub ssh: SshRef,
    /// The artifacts, already fetched and verified on the worker. For `rollback`, those of
    /// `previous_version`.
    pub artifacts: Vec<ArtifactRef>,
    /// The deploy's variables (`deploy.params`).
    #[serde(default)]
    pub vars: BTreeMap<String, String>,
}

/// A target of the pass.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TargetRef {
    pub name: String,
    pub host: String,
    pub port: u16,
    pub user: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub region: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub az: Option<String>,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
}

/// How to reach the targets over SSH (absolute paths on the worker).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SshRef {
    pub key: String,
    pub known_hosts: String,
    pub strict_host_key_checking: bool,
}

/// An artifact of the pass, present on the worker.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ArtifactRef {
    pub name: String,
    #[serde(rename = "type")]
    pub kind: String,
    pub version: String,
    /// Local path on the worker, verified against `sha256`.
    pub path: String,
    pub sha256: String,
    pub size: u64,
}

/// The answer to `handshake`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PluginInfo {
    pub name: String,
    pub version: String,
    pub protocol: u32,
    pub artifact_types: Vec<String>,
}

/// The answer to `plan`, `deploy`, `rollback` and `check`: one entry per target.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PassResult {
    pub targets: Vec<TargetResult>,
}

/// One target's result.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TargetResult {
    pub name: String,
    pub status: TargetStatus,
    #[serde(default)]
    pub detail: String,
}

/// `ok` (nothing to change), `changed` (or, for `plan`, would change), `failed`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TargetStatus {
    Ok,
    Changed,
    Failed,
}

/// One reply line, plugin → host. Any number of `progress` and `log` lines, then exactly
/// one `result` or `error`, all with the request's id.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Reply {
    Progress {
        id: u64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        target: Option<String>,
        message: String,
    },
    Log {
        id: u64,
        #[serde(default)]
        level: LogLevel,
        message: String,
    },
    Result {
        id: u64,
        result: serde_json::Value,
    },
    Error {
        id: u64,
        error: ErrorBody,
    },
}

impl Reply {
    pub fn id(&self) -> u64 {
        match self {
            Reply::Progress { id, .. }
            | Reply::Log { id, .. }
            | Reply::Result { id, .. }
            | Reply::Error { id, .. } => *id,
        }
    }
}

/// The level of a `log` line.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LogLevel {
    Debug,
    #[default]
    Info,
    Warn,
    Error,
}

/// The error shape: a stable code, a message for people, and whether trying again may help.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    /// `unsupported_protocol`, `bad_request`, `bad_artifact`, `failed`, … (free, snake_case).
    pub code: String,
    pub message: String,
    #[serde(default)]
    pub retryable: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_and_replies_have_the_documented_shape() {
        let request = Request {
            id: 7,
            body: RequestBody::Handshake { protocol: 1 },
        };
        assert_eq!(
            serde_json::to_string(&request).unwrap(),
            r#"{"id":7,"method":"handshake","params":{"protocol":1}}"#,
            "the handshake line of docs/plugin-protocol.md"
        );
        let back: Request = serde_json::from_str(&serde_json::to_string(&request).unwrap())
            .expect("a request reads back");
        assert_eq!(back, request, "a request round-trips");

        let deploy = Request {
            id: 8,
            body: RequestBody::Deploy(Pass::default()),
        };
        let text = serde_json::to_string(&deploy).unwrap();
        assert!(
            text.starts_with(r#"{"id":8,"method":"deploy","params":{"deploy_id":"#),
            "a pass request carries the pass as params: {text}"
        );
        assert_eq!(
            serde_json::from_str::<Request>(&text).unwrap(),
            deploy,
            "a pass request round-trips"
        );

        let reply: Reply =
            serde_json::from_str(r#"{"type":"progress","id":8,"target":"t1","message":"hi"}"#)
                .expect("a progress line parses");
        assert_eq!(reply.id(), 8, "replies carry the request's id");
        let error: Reply = serde_json::from_str(
            r#"{"type":"error","id":8,"error":{"code":"failed","message":"no"}}"#,
        )
        .expect("an error line without retryable parses");
        assert!(
            matches!(
                error,
                Reply::Error {
                    error: ErrorBody {
                        retryable: false,
                        ..
                    },
                    ..
                }
            ),
            "retryable defaults to false"
        );
    }
}
