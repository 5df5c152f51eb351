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
///
/// A plugin that leads a process group of its own (the host starts an unconfined plugin
/// so) dies with the worker, and takes its group with it (docs/plugin-protocol.md,
/// "What the process may rely on"); see [`die_with_the_worker`].
pub fn serve<H: Handler>(handler: H) -> std::io::Result<()> {
    let subreaper = die_with_the_worker();
    serve_loop(
        handler,
        std::io::stdin().lock(),
        std::io::stdout().lock(),
        || {
            if subreaper {
                reap_orphans();
            }
        },
    )
}

/// Reaps the orphans this process, their subreaper, inherited during the last request (a
/// handler has no child of its own left between requests).
fn reap_orphans() {
    use rustix::process::{WaitOptions, waitpid};
    while let Ok(Some(_)) = waitpid(None, WaitOptions::NOHANG) {}
}

/// Makes the worker's death, even by SIGKILL, end this process and every process it
/// started (what a pass started: ansible-playbook, its forks in sessions of their own, ssh),
/// when this process leads its group (an unconfined plugin). The kernel sends SIGTERM at
/// the death of the thread that started us (`PR_SET_PDEATHSIG`, a safe call here: it is
/// made in this process, not between fork and exec); a thread of ours waits for it, kills
/// every descendant (this process is their subreaper, so none escapes by being orphaned),
/// then the group. A confined plugin needs none of this (its sandbox's PID namespace dies
/// with the worker), and it is harmless there.
/// Returns whether this process became its descendants' subreaper.
fn die_with_the_worker() -> bool {
    use rustix::process::{Signal, getpgrp, getpid, getppid, kill_process_group};
    let group = getpgrp();
    if getpid() != group {
        return false; // a group that is not ours: never kill it
    }
    let parent = getppid();
    let subreaper = rustix::process::set_child_subreaper(Some(getpid())).is_ok();
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        else {
            return;
        };
        runtime.block_on(async move {
            let Ok(mut term) =
                tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            else {
                return;
            };
            let _ = ready_tx.send(());
            term.recv().await;
            kill_descendants(getpid());
            let _ = kill_process_group(group, Signal::KILL);
        });
    });
    // The handler first, then the request for the signal: a SIGTERM never finds us with
    // the default action once a pass has started children.
    if ready_rx.recv().is_err() {
        return subreaper;
    }
    if rustix::process::set_parent_process_death_signal(Some(Signal::TERM)).is_ok()
        && getppid() != parent
    {
        // The worker died before the request was in place (had it died earlier still, our
        // stdin is closed and serve ends at once).
        std::process::exit(1);
    }
    subreaper
}

/// Kills every live process descending from `root`, until none is left (an orphan comes
/// back to `root`, its subreaper, and is found on the next round).
fn kill_descendants(root: rustix::process::Pid) {
    for _ in 0..100 {
        let live = descendants(root.as_raw_nonzero().get());
        if live.is_empty() {
            return;
        }
        for pid in live {
            if let Some(pid) = rustix::process::Pid::from_raw(pid) {
                let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
            }
        }
    }
}

/// The live (not zombie) descendants of `root`, read from `/proc`.
fn descendants(root: i32) -> Vec<i32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let parents: Vec<(i32, i32)> = entries
        .filter_map(Result::ok)
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter_map(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            // `pid (comm) state ppid …`: the command may hold spaces and parentheses.
            let mut rest = stat.rsplit_once(')')?.1.split_whitespace();
            let state = rest.next()?;
            let ppid = rest.next()?.parse().ok()?;
            (state != "Z").then_some((pid, ppid))
        })
        .collect();
    let mut found = vec![root];
    let mut i = 0;
    while i < found.len() {
        let parent = found[i];
        found.extend(
            parents
                .iter()
                .filter(|(_, p)| *p == parent)
                .map(|(c, _)| *c),
        );
        i += 1;
    }
    found.remove(0);
    found
}

/// [`serve`] on any input and output.
pub fn serve_on<H: Handler, R: BufRead, W: Write>(
    handler: H,
    input: R,
    output: W,
) -> std::io::Result<()> {
    serve_loop(handler, input, output, || {})
}

/// [`serve_on`], calling `after_each` after each answered request.
fn serve_loop<H: Handler, R: BufRead, W: Write>(
    mut handler: H,
    input: R,
    mut output: W,
    mut after_each: impl FnMut(),
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
        after_each();
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
