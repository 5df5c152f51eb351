//! The plugin side of the protocol: [`serve`] reads requests from stdin and writes replies
//! to stdout, so a plugin executable implements [`Handler`] and never writes JSON by hand.
//! Synchronous on purpose: a plugin does one thing at a time and may run child processes.

use std::io::{BufRead, Write};

use serde::Serialize;

use crate::protocol::{
    ErrorBody, LogLevel, Operation, PROTOCOL_VERSION, Pass, PassResult, PluginInfo, Reply, Request,
    RequestBody,
};

/// What a plugin does. `info` answers the handshake (its `protocol` is filled in by
/// [`serve`]); `run` does one operation on one pass.
pub trait Handler {
    fn info(&self) -> PluginInfo;
    fn run(
        &mut self,
        operation: Operation,
        pass: &Pass,
        reporter: &mut Reporter<'_>,
    ) -> Result<PassResult, Failure>;
}

/// A failed request, sent as the protocol's error shape.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    pub code: String,
    pub message: String,
    pub retryable: bool,
}

impl Failure {
    /// A failure that trying again will not fix.
    pub fn new(code: &str, message: impl Into<String>) -> Self {
        Failure {
            code: code.to_string(),
            message: message.into(),
            retryable: false,
        }
    }

    /// A failure that may pass if tried again (a network error, a busy host).
    pub fn retryable(mut self) -> Self {
        self.retryable = true;
        self
    }
}

/// Sends `progress` and `log` lines for the request being run.
pub struct Reporter<'a> {
    id: u64,
    out: &'a mut dyn Write,
}

impl Reporter<'_> {
    /// A progress line, about one target or the whole pass.
    pub fn progress(&mut self, target: Option<&str>, message: impl Into<String>) {
        let reply = Reply::Progress {
            id: self.id,
            target: target.map(str::to_string),
            message: message.into(),
        };
        let _ = write_line(self.out, &reply);
    }

    /// A log line, shown in the worker's log.
    pub fn log(&mut self, level: LogLevel, message: impl Into<String>) {
        let reply = Reply::Log {
            id: self.id,
            level,
            message: message.into(),
        };
        let _ = write_line(self.out, &reply);
    }
}

/// Serves requests from stdin until it closes (the host's way of saying stop).
pub fn serve<H: Handler>(handler: H) -> std::io::Result<()> {
    serve_on(handler, std::io::stdin().lock(), std::io::stdout().lock())
}

/// [`serve`] on any input and output.
pub fn serve_on<H: Handler, R: BufRead, W: Write>(
    mut handler: H,
    input: R,
    mut output: W,
) -> std::io::Result<()> {
    for line in input.lines() {
        let line = line?;
        if line.trim().is_empty() {
            continue;
        }
        let request: Request = match crate::protocol::decode_request(&line) {
            Ok(r) => r,
            Err(e) => {
                // Answer with the id if one can be found, so the host can tell whose error.
                let id = serde_json::from_str::<serde_json::Value>(&line)
                    .ok()
                    .and_then(|v| v.get("id").and_then(serde_json::Value::as_u64))
                    .unwrap_or(0);
                let failure = Failure::new("bad_request", format!("cannot read the request: {e}"));
                write_line(&mut output, &error_reply(id, failure))?;
                continue;
            }
        };
        let id = request.id;
        let reply = match request.body {
            RequestBody::Handshake { protocol } if protocol != PROTOCOL_VERSION => error_reply(
                id,
                Failure::new(
                    "unsupported_protocol",
                    format!(
                        "this plugin speaks protocol {PROTOCOL_VERSION}, the host asked for {protocol}"
                    ),
                ),
            ),
            RequestBody::Handshake { .. } => {
                let info = PluginInfo {
                    protocol: PROTOCOL_VERSION,
                    ..handler.info()
                };
                result_reply(id, &info)
            }
            RequestBody::Plan(pass) => run(&mut handler, Operation::Plan, &pass, id, &mut output),
            RequestBody::Deploy(pass) => {
                run(&mut handler, Operation::Deploy, &pass, id, &mut output)
            }
            RequestBody::Rollback(pass) => {
                run(&mut handler, Operation::Rollback, &pass, id, &mut output)
            }
            RequestBody::Check(pass) => run(&mut handler, Operation::Check, &pass, id, &mut output),
        };
        write_line(&mut output, &reply)?;
    }
    Ok(())
}

fn run<H: Handler>(
    handler: &mut H,
    operation: Operation,
    pass: &Pass,
    id: u64,
    output: &mut dyn Write,
) -> Reply {
    let mut reporter = Reporter { id, out: output };
    match handler.run(operation, pass, &mut reporter) {
        Ok(result) => result_reply(id, &result),
        Err(failure) => error_reply(id, failure),
    }
}

fn result_reply(id: u64, result: &impl Serialize) -> Reply {
    Reply::Result {
        id,
        result: serde_json::to_value(result).expect("results serialize"),
    }
}

fn error_reply(id: u64, failure: Failure) -> Reply {
    Reply::Error {
        id,
        error: ErrorBody {
            code: failure.code,
            message: failure.message,
            retryable: failure.retryable,
        },
    }
}

fn write_line(out: &mut dyn Write, reply: &Reply) -> std::io::Result<()> {
    let mut line = serde_json::to_string(reply).expect("replies serialize");
    line.push('\n');
    out.write_all(line.as_bytes())?;
    out.flush()
}
