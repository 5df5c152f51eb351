//! What a workflow's steps print, kept line by line as it is printed: outside the
//! checkpoints (a step run again prints again; nothing is replayed from it), bounded per
//! source, written in small batches by a task of its own so a chatty command never
//! waits on the database.

use std::sync::{Arc, Mutex};

use tokio::{sync::mpsc, task::JoinHandle};

use crate::{now_ms, store::OutputLine, store::Store};

/// Lines kept per source (one command, one check): a command that prints more has its
/// first lines kept and the rest counted in a last line saying so.
pub const MAX_LINES: usize = 2_000;
/// Bytes kept per source, for the same reason.
pub const MAX_BYTES: usize = 256 * 1024;
/// A longer line is cut (and says so).
pub const MAX_LINE_CHARS: usize = 4_096;
/// At most this many lines per insert.
const BATCH: usize = 500;
/// How long the writer lets lines gather before an insert: a command printing
/// continuously costs a few inserts a second, not one per line.
const GATHER: std::time::Duration = std::time::Duration::from_millis(100);

/// Writes one source's lines (e.g. `web-1: command 1`) of one run of a workflow.
/// Cheap to create; [`OutputWriter::finish`] waits until every line is stored.
pub struct OutputWriter {
    tx: Option<mpsc::UnboundedSender<OutputLine>>,
    task: Option<JoinHandle<()>>,
    generation: i64,
    source: String,
    kept: Mutex<Kept>,
}

#[derive(Default)]
struct Kept {
    lines: usize,
    bytes: usize,
    dropped: usize,
}

impl OutputWriter {
    pub(crate) fn new(
        store: Arc<dyn Store>,
        workflow_id: String,
        generation: i64,
        source: String,
    ) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        let task = tokio::spawn(write_batches(store, workflow_id, rx));
        OutputWriter {
            tx: Some(tx),
            task: Some(task),
            generation,
            source,
            kept: Mutex::new(Kept::default()),
        }
    }

    /// Keeps one line of `stream` (`stdout`, `stderr`, `progress`), unless this source
    /// is over its bounds.
    pub fn line(&self, stream: &str, line: &str) {
        let line = cut(line);
        {
            let mut kept = self.kept.lock().unwrap_or_else(|e| e.into_inner());
            if kept.lines >= MAX_LINES || kept.bytes + line.len() > MAX_BYTES {
                kept.dropped += 1;
                return;
            }
            kept.lines += 1;
            kept.bytes += line.len();
        }
        self.send(stream, line);
    }

    fn send(&self, stream: &str, line: String) {
        if let Some(tx) = &self.tx {
            // A closed channel means the writer task ended: nothing more can be kept.
            let _ = tx.send(OutputLine {
                seq: 0,
                at_ms: now_ms(),
                generation: self.generation,
                source: self.source.clone(),
                stream: stream.to_string(),
                line,
            });
        }
    }

    /// Says how many lines were left out, if any, and waits until every kept line is
    /// stored.
    pub async fn finish(mut self) {
        let dropped = self.kept.lock().map(|k| k.dropped).unwrap_or_default();
        if dropped > 0 {
            self.send(
                "stderr",
                format!(
                    "[manent: {dropped} more lines not kept: at most {MAX_LINES} lines or {} KiB per command]",
                    MAX_BYTES / 1024
                ),
            );
        }
        self.tx = None;
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }
}

fn cut(line: &str) -> String {
    match line.char_indices().nth(MAX_LINE_CHARS) {
        None => line.to_string(),
        Some((at, _)) => format!(
            "{} [manent: line cut at {MAX_LINE_CHARS} characters]",
            &line[..at]
        ),
    }
}

async fn write_batches(
    store: Arc<dyn Store>,
    workflow_id: String,
    mut rx: mpsc::UnboundedReceiver<OutputLine>,
) {
    // Said once per source (one command's output), not once per batch.
    let mut warned = false;
    while let Some(first) = rx.recv().await {
        let mut batch = vec![first];
        tokio::time::sleep(GATHER).await;
        while batch.len() < BATCH {
            match rx.try_recv() {
                Ok(line) => batch.push(line),
                Err(_) => break,
            }
        }
        if let Err(e) = store.append_output(&workflow_id, &batch).await {
            // Output is what a command printed, not the deploy's state: losing some is
            // logged, once per command (an outage would otherwise repeat it per batch).
            if !warned {
                warned = true;
                tracing::warn!(workflow_id, error = %e, lines = batch.len(), "cannot store command output; this command's lines are lost until the database answers");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::cut;

    #[test]
    fn a_long_line_is_cut_and_says_so() {
        assert_eq!(cut("short"), "short");
        let long = "é".repeat(super::MAX_LINE_CHARS + 10);
        let kept = cut(&long);
        assert!(kept.starts_with(&"é".repeat(super::MAX_LINE_CHARS)));
        assert!(
            kept.ends_with("[manent: line cut at 4096 characters]"),
            "{kept}"
        );
    }
}
