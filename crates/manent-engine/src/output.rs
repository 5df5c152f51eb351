//! What a workflow's steps print, kept line by line as it is printed: outside the
//! checkpoints (a step run again prints again; nothing is replayed from it), bounded per
//! line, per source and per run, cut into lines in one pass however long a line is, and
//! written in small batches by a task of its own so a chatty command never waits on the
//! database.

use std::{
    collections::HashMap,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
};

use tokio::{sync::mpsc, task::JoinHandle};

use crate::{now_ms, store::OutputLine, store::Store};

/// Lines kept per source (one command, one check): a command that prints more has its
/// first lines kept and the rest counted in a last line saying so.
pub const MAX_LINES: usize = 2_000;
/// Bytes kept per source, for the same reason.
pub const MAX_BYTES: usize = 256 * 1024;
/// A longer line is cut (and says how much of it was left out).
pub const MAX_LINE_BYTES: usize = 16 * 1024;
/// Bytes kept per run of a workflow, all sources together, unless the engine is
/// configured otherwise (`EngineConfig::output_per_run`).
pub const DEFAULT_OUTPUT_PER_RUN: u64 = 64 * 1024 * 1024;
/// At most this many lines per insert.
const BATCH: usize = 500;
/// How long the writer lets lines gather before an insert: a command printing
/// continuously costs a few inserts a second, not one per line.
const GATHER: std::time::Duration = std::time::Duration::from_millis(100);

/// What one run of a workflow may still keep, shared by all its writers: once spent,
/// one line says so and the rest of the run's output is not kept.
#[derive(Debug)]
pub(crate) struct OutputBudget {
    limit: u64,
    used: AtomicU64,
    spent: AtomicBool,
}

impl OutputBudget {
    pub(crate) fn new(limit: u64) -> Self {
        OutputBudget {
            limit,
            used: AtomicU64::new(0),
            spent: AtomicBool::new(false),
        }
    }

    /// Takes `bytes` from the budget; `false` when they do not fit (and never again after).
    fn take(&self, bytes: usize) -> bool {
        if self.spent.load(Ordering::SeqCst) {
            return false;
        }
        let bytes = u64::try_from(bytes).unwrap_or(u64::MAX);
        self.used
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |used| {
                used.checked_add(bytes).filter(|total| *total <= self.limit)
            })
            .is_ok()
    }

    /// `true` only for the first caller after the budget ran out.
    fn first_to_find_it_spent(&self) -> bool {
        !self.spent.swap(true, Ordering::SeqCst)
    }
}

/// Writes one source's lines (e.g. `web-1: command 1`) of one run of a workflow.
/// Cheap to create; [`OutputWriter::finish`] waits until every line is stored.
pub struct OutputWriter {
    tx: Option<mpsc::UnboundedSender<OutputLine>>,
    task: Option<JoinHandle<()>>,
    generation: i64,
    source: String,
    budget: Arc<OutputBudget>,
    kept: Mutex<Kept>,
}

#[derive(Default)]
struct Kept {
    lines: usize,
    bytes: usize,
    dropped: usize,
    /// Per stream, the line [`OutputWriter::write`] has begun and not ended yet.
    partial: HashMap<String, Partial>,
}

/// The start of a line still being printed: at most [`MAX_LINE_BYTES`], the rest counted.
#[derive(Default)]
struct Partial {
    bytes: Vec<u8>,
    cut: usize,
}

impl Partial {
    fn take(&mut self, piece: &[u8]) {
        let room = MAX_LINE_BYTES.saturating_sub(self.bytes.len());
        let fits = room.min(piece.len());
        self.bytes.extend_from_slice(&piece[..fits]);
        self.cut += piece.len() - fits;
    }

    /// The line as text (lossy UTF-8: a target's bytes are shown, never refused), its
    /// line ending left out, and how many of its bytes were cut off.
    fn end(&mut self) -> (String, usize) {
        let mut bytes = std::mem::take(&mut self.bytes);
        let mut cut = std::mem::take(&mut self.cut);
        if cut == 0 && bytes.last() == Some(&b'\r') {
            bytes.pop();
        }
        if cut > 0 {
            // A character cut in two is left out whole, not shown as a replacement.
            if let Err(e) = std::str::from_utf8(&bytes)
                && e.error_len().is_none()
            {
                cut += bytes.len() - e.valid_up_to();
                bytes.truncate(e.valid_up_to());
            }
        }
        (String::from_utf8_lossy(&bytes).into_owned(), cut)
    }
}

impl OutputWriter {
    pub(crate) fn new(
        store: Arc<dyn Store>,
        workflow_id: String,
        generation: i64,
        source: String,
        budget: Arc<OutputBudget>,
    ) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        let task = tokio::spawn(write_batches(store, workflow_id, rx));
        OutputWriter {
            tx: Some(tx),
            task: Some(task),
            generation,
            source,
            budget,
            kept: Mutex::new(Kept::default()),
        }
    }

    /// Keeps one line of `stream` (`stdout`, `stderr`, `progress`), cut at
    /// [`MAX_LINE_BYTES`], unless this source or this run is over its bounds.
    pub fn line(&self, stream: &str, line: &str) {
        let (text, cut) = cut(line);
        let mut kept = self.kept.lock().unwrap_or_else(|e| e.into_inner());
        self.keep(&mut kept, stream, text.to_owned(), cut);
    }

    /// Takes the next bytes `stream` printed, as they come: each line they end is kept
    /// as [`OutputWriter::line`] would; a line not ended yet waits for its next bytes (or
    /// [`OutputWriter::finish`]). One pass over the bytes, and at most [`MAX_LINE_BYTES`]
    /// of a line held, however long the line.
    pub fn write(&self, stream: &str, mut bytes: &[u8]) {
        let mut kept = self.kept.lock().unwrap_or_else(|e| e.into_inner());
        while !bytes.is_empty() {
            let (piece, ended) = match bytes.iter().position(|b| *b == b'\n') {
                Some(end) => (&bytes[..end], true),
                None => (bytes, false),
            };
            let partial = kept.partial.entry(stream.to_owned()).or_default();
            partial.take(piece);
            bytes = &bytes[piece.len() + usize::from(ended)..];
            if ended {
                let (text, cut) = partial.end();
                self.keep(&mut kept, stream, text, cut);
            }
        }
    }

    fn keep(&self, kept: &mut Kept, stream: &str, text: String, cut: usize) {
        let line = if cut > 0 {
            format!("{text} … [manent: line cut, {cut} more bytes not kept]")
        } else {
            text
        };
        if kept.lines >= MAX_LINES || kept.bytes + line.len() > MAX_BYTES {
            kept.dropped += 1;
            return;
        }
        if !self.budget.take(line.len()) {
            if self.budget.first_to_find_it_spent() {
                self.send(
                    "stderr",
                    format!(
                        "[manent: output capped at {} MiB for this run; the rest was not recorded]",
                        self.budget.limit / (1024 * 1024)
                    ),
                );
            }
            return;
        }
        kept.lines += 1;
        kept.bytes += line.len();
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

    /// Keeps the lines [`OutputWriter::write`] began and did not end, says how many lines
    /// were left out, if any, and waits until every kept line is stored.
    pub async fn finish(mut self) {
        let dropped = {
            let mut kept = self.kept.lock().unwrap_or_else(|e| e.into_inner());
            let mut partial = std::mem::take(&mut kept.partial)
                .into_iter()
                .filter(|(_, p)| !p.bytes.is_empty() || p.cut > 0)
                .collect::<Vec<_>>();
            partial.sort_by(|a, b| a.0.cmp(&b.0));
            for (stream, mut line) in partial {
                let (text, cut) = line.end();
                self.keep(&mut kept, &stream, text, cut);
            }
            kept.dropped
        };
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

/// `line` cut at [`MAX_LINE_BYTES`] on a character boundary, and how many bytes were cut.
fn cut(line: &str) -> (&str, usize) {
    if line.len() <= MAX_LINE_BYTES {
        return (line, 0);
    }
    let mut at = MAX_LINE_BYTES;
    while !line.is_char_boundary(at) {
        at -= 1;
    }
    (&line[..at], line.len() - at)
}

async fn write_batches(
    store: Arc<dyn Store>,
    workflow_id: String,
    mut rx: mpsc::UnboundedReceiver<OutputLine>,
) {
    // Said once per source (one command's output), not once per batch.
    let mut warned = false;
    while let Some(batch) = gather(&mut rx, GATHER, BATCH).await {
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

/// The next batch: the first line, then those that come within `window` of it, at most
/// `max`; the batch is cut short when the writer finishes (its sender dropped), so
/// [`OutputWriter::finish`] waits for one insert, not for the rest of a window (each
/// command's step ended 100 ms late before). `None` once finished and every line taken.
async fn gather<T>(
    rx: &mut mpsc::UnboundedReceiver<T>,
    window: std::time::Duration,
    max: usize,
) -> Option<Vec<T>> {
    let first = rx.recv().await?;
    let until = tokio::time::Instant::now() + window;
    let mut batch = vec![first];
    while batch.len() < max {
        match tokio::time::timeout_at(until, rx.recv()).await {
            Ok(Some(line)) => batch.push(line),
            // Finished, or the window is over.
            Ok(None) | Err(_) => break,
        }
    }
    Some(batch)
}

#[cfg(test)]
mod tests {
    use super::{MAX_LINE_BYTES, Partial, cut, gather};
    use std::time::Duration;
    use tokio::{sync::mpsc, time::Instant};

    #[tokio::test(start_paused = true)]
    async fn a_finished_writers_last_lines_are_taken_at_once_not_after_the_window() {
        let (tx, mut rx) = mpsc::unbounded_channel();
        tx.send(1).expect("open");
        tx.send(2).expect("open");
        drop(tx);
        let before = Instant::now();
        let batch = gather(&mut rx, Duration::from_millis(100), 500).await;
        assert_eq!(batch, Some(vec![1, 2]), "both lines in one batch");
        assert_eq!(
            Instant::now(),
            before,
            "the (paused) clock did not move: finishing does not wait out the window"
        );
        assert_eq!(
            gather(&mut rx, Duration::from_millis(100), 500).await,
            None,
            "then nothing is left"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn lines_of_a_running_command_gather_for_the_window_and_up_to_the_batch_size() {
        let (tx, mut rx) = mpsc::unbounded_channel();
        for line in 0..3 {
            tx.send(line).expect("open");
        }
        let before = Instant::now();
        let batch = gather(&mut rx, Duration::from_millis(100), 500).await;
        assert_eq!(batch, Some(vec![0, 1, 2]), "what came within the window");
        assert_eq!(
            Instant::now() - before,
            Duration::from_millis(100),
            "a writer still open is given the whole window: one insert, not one per line"
        );
        for line in 0..5 {
            tx.send(line).expect("open");
        }
        let before = Instant::now();
        let batch = gather(&mut rx, Duration::from_millis(100), 2).await;
        assert_eq!(batch, Some(vec![0, 1]), "a batch stops at its size");
        assert_eq!(Instant::now(), before, "a full batch is not held back");
    }

    #[test]
    fn a_long_line_is_cut_on_a_character_boundary_and_says_how_much() {
        assert_eq!(
            cut("short"),
            ("short", 0),
            "a short line is kept whole, nothing cut"
        );
        let long = "é".repeat(MAX_LINE_BYTES);
        let (kept, rest) = cut(&long);
        assert_eq!(
            kept.len(),
            MAX_LINE_BYTES,
            "é is two bytes: the cut is on a boundary"
        );
        assert_eq!(kept.len() + rest, long.len(), "what is cut is counted");
        let odd = format!("x{long}");
        let (kept, rest) = cut(&odd);
        assert_eq!(
            (kept.len(), rest),
            (MAX_LINE_BYTES - 1, odd.len() - MAX_LINE_BYTES + 1),
            "a character is never cut in two"
        );
    }

    #[test]
    fn a_line_printed_in_pieces_keeps_its_start_and_counts_the_rest() {
        let mut line = Partial::default();
        for _ in 0..10 {
            line.take(&b"\xc3\xa9".repeat(MAX_LINE_BYTES / 3));
        }
        let (text, cut) = line.end();
        assert!(
            text.len() <= MAX_LINE_BYTES && !text.contains('\u{fffd}'),
            "kept {} bytes, a character cut in two is left out",
            text.len()
        );
        assert_eq!(
            text.len() + cut,
            10 * 2 * (MAX_LINE_BYTES / 3),
            "every byte is kept or counted"
        );
        line.take(b"next\r");
        assert_eq!(line.end(), ("next".to_owned(), 0), "a line starts afresh");
    }
}
