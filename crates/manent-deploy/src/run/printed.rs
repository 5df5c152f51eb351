//! What a command on a target prints, on its way to the deploy's output and to its
//! step's result or error: masked of secrets on the stream, before anything splits it
//! into lines or cuts it (docs/security.md, "Secrets"); of all of it, only its last line
//! and the end of its stderr are kept in memory, for the outcome.

use std::{collections::BTreeMap, sync::Mutex};

use manent_engine::OutputWriter;
use manent_ssh::Stream;

use crate::run::masking::{MaskStream, Masker};

/// The end of a failed command's stderr quoted in its error, in bytes.
pub const STDERR_TAIL: usize = 2_000;
/// The last line of a command's stdout quoted in its outcome, in characters.
const SUMMARY_CHARS: usize = 200;
/// Bytes of a line looked at for the summary (a character is at most 4 bytes).
const SUMMARY_BYTES: usize = SUMMARY_CHARS * 4 + 4;
/// Bytes of stderr's end kept, so that the quoted end is not all trailing white space.
const STDERR_KEPT: usize = 4 * STDERR_TAIL;

/// Takes a command's output as it arrives ([`Printed::take`]), masks it, and hands it to
/// the deploy's output (if any).
pub struct Printed<'m> {
    output: Option<&'m OutputWriter>,
    state: Mutex<State<'m>>,
}

struct State<'m> {
    stdout: MaskStream<'m>,
    stderr: MaskStream<'m>,
    last_line: LastLine,
    stderr_end: Vec<u8>,
}

/// What is quoted of a command once it ended; secrets masked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Quoted {
    /// Its last line of stdout that is not blank, short (all of it is in the output).
    pub summary: String,
    /// The end of its stderr, at most [`STDERR_TAIL`] bytes, `…` in front when cut.
    pub stderr_tail: String,
}

impl<'m> Printed<'m> {
    pub fn new(masker: &'m Masker, output: Option<&'m OutputWriter>) -> Self {
        Printed {
            output,
            state: Mutex::new(State {
                stdout: masker.stream(),
                stderr: masker.stream(),
                last_line: LastLine::default(),
                stderr_end: Vec::new(),
            }),
        }
    }

    /// The next bytes of `stream`, as the transport received them.
    pub fn take(&self, stream: Stream, bytes: &[u8]) {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let masked = match stream {
            Stream::Stdout => state.stdout.push(bytes),
            Stream::Stderr => state.stderr.push(bytes),
        };
        self.record(&mut state, stream, &masked);
    }

    fn record(&self, state: &mut State<'m>, stream: Stream, masked: &[u8]) {
        if let Some(output) = self.output {
            output.write(stream.as_str(), masked);
        }
        match stream {
            Stream::Stdout => state.last_line.take(masked),
            Stream::Stderr => {
                state.stderr_end.extend_from_slice(masked);
                if state.stderr_end.len() > 2 * STDERR_KEPT {
                    let excess = state.stderr_end.len() - STDERR_KEPT;
                    state.stderr_end.drain(..excess);
                }
            }
        }
    }

    /// The end of the output: what the maskers held back is masked and recorded too.
    pub fn finish(self) -> Quoted {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let rest = state.stdout.finish();
        self.record(&mut state, Stream::Stdout, &rest);
        let rest = state.stderr.finish();
        self.record(&mut state, Stream::Stderr, &rest);
        let summary = state.last_line.summary();
        let stderr = String::from_utf8_lossy(&state.stderr_end);
        Quoted {
            summary,
            stderr_tail: tail(stderr.trim_end(), STDERR_TAIL),
        }
    }
}

/// A plugin's progress lines on their way to the deploy's output and the server's log:
/// masked as one stream per target (a line at a time, each line ending in a newline), so
/// a secret the plugin printed over several lines is masked as if printed whole.
pub struct Progress<'m> {
    masker: &'m Masker,
    plugin: &'m str,
    output: &'m OutputWriter,
    streams: Mutex<BTreeMap<Option<String>, ProgressStream<'m>>>,
}

struct ProgressStream<'m> {
    mask: MaskStream<'m>,
    /// Masked, not yet recorded: the start of a line that is still held back.
    pending: Vec<u8>,
}

impl<'m> Progress<'m> {
    pub fn new(masker: &'m Masker, plugin: &'m str, output: &'m OutputWriter) -> Self {
        Progress {
            masker,
            plugin,
            output,
            streams: Mutex::new(BTreeMap::new()),
        }
    }

    /// One progress line of the plugin, about `target` or the whole pass.
    pub fn take(&self, target: Option<&str>, message: &str) {
        let mut streams = self.streams.lock().unwrap_or_else(|e| e.into_inner());
        let stream = streams
            .entry(target.map(str::to_owned))
            .or_insert_with(|| ProgressStream {
                mask: self.masker.stream(),
                pending: Vec::new(),
            });
        let masked = stream.mask.push(format!("{message}\n").as_bytes());
        stream.pending.extend_from_slice(&masked);
        self.record(target, &mut stream.pending, false);
    }

    /// Records what was held back.
    pub fn finish(self) {
        let mut streams = self.streams.lock().unwrap_or_else(|e| e.into_inner());
        for (target, stream) in streams.iter_mut() {
            let rest = stream.mask.finish();
            stream.pending.extend_from_slice(&rest);
            self.record(target.as_deref(), &mut stream.pending, true);
        }
    }

    /// Records the whole lines of `pending` (all of it when `all`).
    fn record(&self, target: Option<&str>, pending: &mut Vec<u8>, all: bool) {
        let whole = match all {
            true => pending.len(),
            false => pending
                .iter()
                .rposition(|b| *b == b'\n')
                .map_or(0, |at| at + 1),
        };
        let text = String::from_utf8_lossy(&pending[..whole]).into_owned();
        pending.drain(..whole);
        for line in text.lines() {
            match target {
                Some(target) => self.output.line("progress", &format!("{target}: {line}")),
                None => self.output.line("progress", line),
            }
            // Escaped: a plugin's text cannot forge a line of the server's log.
            tracing::info!(
                plugin = %self.plugin,
                target = target.unwrap_or(""),
                "{}",
                line.escape_debug()
            );
        }
    }
}

/// The last line that is not blank, its start only, found in one pass.
#[derive(Default)]
struct LastLine {
    current: Vec<u8>,
    last: Vec<u8>,
}

impl LastLine {
    fn take(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() {
            let end = bytes.iter().position(|b| *b == b'\n');
            let piece = &bytes[..end.unwrap_or(bytes.len())];
            let room = SUMMARY_BYTES.saturating_sub(self.current.len());
            self.current
                .extend_from_slice(&piece[..room.min(piece.len())]);
            match end {
                Some(end) => {
                    self.end_line();
                    bytes = &bytes[end + 1..];
                }
                None => bytes = &[],
            }
        }
    }

    fn end_line(&mut self) {
        if self.current.iter().any(|b| !b.is_ascii_whitespace()) {
            std::mem::swap(&mut self.last, &mut self.current);
        }
        self.current.clear();
    }

    fn summary(&mut self) -> String {
        self.end_line();
        let text = String::from_utf8_lossy(&self.last);
        let line = text.trim();
        match line.char_indices().nth(SUMMARY_CHARS) {
            Some((at, _)) => format!("{}…", &line[..at]),
            None => line.to_string(),
        }
    }
}

/// The end of `text`, at most `max` bytes (on a character boundary), marked when cut.
/// `text` is masked already: a cut never shows the end of a secret.
fn tail(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_string();
    }
    let mut start = text.len() - max;
    while !text.is_char_boundary(start) {
        start += 1;
    }
    format!("…{}", &text[start..])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn quoted(masker: &Masker, pieces: &[(Stream, &[u8])]) -> Quoted {
        let printed = Printed::new(masker, None);
        for (stream, bytes) in pieces {
            printed.take(*stream, bytes);
        }
        printed.finish()
    }

    #[test]
    fn a_secret_straddling_the_cut_of_stderr_shows_none_of_its_bytes() {
        let secret = "s3cr3t-straddling-value";
        let masker = Masker::new([secret]);
        // The last `in_tail` bytes of the secret are within the last 2,000 bytes printed.
        for in_tail in 1..secret.len() {
            let after = "e".repeat(STDERR_TAIL - in_tail);
            let stderr = format!("{}{secret}{after}", "b".repeat(3000));
            let got = quoted(&masker, &[(Stream::Stderr, stderr.as_bytes())]);
            for n in 2..=secret.len() {
                let end = &secret[secret.len() - n..];
                assert!(
                    !got.stderr_tail.contains(end),
                    "the tail shows {end:?} of the secret: {}",
                    got.stderr_tail
                );
            }
            assert!(
                got.stderr_tail.len() <= STDERR_TAIL + "…".len(),
                "the stderr tail is bounded: {} bytes",
                got.stderr_tail.len()
            );
        }
    }

    #[test]
    fn the_summary_is_the_last_line_that_is_not_blank_masked() {
        let masker = Masker::new(["hunter2"]);
        let got = quoted(
            &masker,
            &[
                (Stream::Stdout, b"first\nthe password is hun"),
                (Stream::Stderr, b"warning\n"),
                (Stream::Stdout, b"ter2\n\n   \n"),
            ],
        );
        assert_eq!(
            got,
            Quoted {
                summary: "the password is ***".into(),
                stderr_tail: "warning".into()
            },
            "a secret in the quoted output is masked"
        );
        let long = quoted(&masker, &[(Stream::Stdout, "é".repeat(100_000).as_bytes())]);
        assert_eq!(
            long.summary,
            format!("{}…", "é".repeat(SUMMARY_CHARS)),
            "a long last line is cut at {SUMMARY_CHARS} characters"
        );
    }
}
