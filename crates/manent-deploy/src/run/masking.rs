//! Masking secret values in text and in byte streams, before anything cuts or splits it:
//! which texts stand for a secret (the whole value, and each line of a multi-line one),
//! one pass over the text for all of them, and a stream masker that holds back only what
//! could still become a secret (docs/security.md, "Secrets").

use aho_corasick::{AhoCorasick, MatchKind};

/// What stands for a secret's value in output, errors and events.
pub const MASK: &str = "***";

/// A line of a multi-line secret is masked on its own when it is at least this long
/// (without the white space around it): shorter lines (`{`, `}`, `---`) are everywhere.
pub const MIN_LINE_MASKED: usize = 4;

/// The texts to mask, and an automaton that finds all of them, overlapping, in one pass.
#[derive(Clone)]
pub struct Masker {
    /// `None` when there is nothing to mask.
    automaton: Option<AhoCorasick>,
    /// The same texts, sorted: the ones that start with a given text are neighbours.
    sorted: Vec<Vec<u8>>,
    /// Whether some text starts with this byte: a cheap first test for a held-back tail.
    first_bytes: [bool; 256],
    longest: usize,
}

impl Default for Masker {
    /// Masks nothing.
    fn default() -> Self {
        Masker {
            automaton: None,
            sorted: Vec::new(),
            first_bytes: [false; 256],
            longest: 0,
        }
    }
}

impl std::fmt::Debug for Masker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Masker")
            .field("texts", &self.sorted.len())
            .finish_non_exhaustive()
    }
}

impl Masker {
    /// A masker for `values`: each non-empty value, and each line of a multi-line value
    /// that is at least [`MIN_LINE_MASKED`] bytes long without its surrounding white space.
    /// A key printed whole is then one mask, and a key printed line by line (indented,
    /// with other line endings, interleaved with other output) shows none of its lines.
    pub fn new<'v>(values: impl IntoIterator<Item = &'v str>) -> Masker {
        let mut texts: Vec<Vec<u8>> = Vec::new();
        for value in values {
            if value.is_empty() {
                continue;
            }
            texts.push(value.as_bytes().to_vec());
            if value.contains(['\n', '\r']) {
                texts.extend(
                    value
                        .split(['\n', '\r'])
                        .map(str::trim)
                        .filter(|line| line.len() >= MIN_LINE_MASKED)
                        .map(|line| line.as_bytes().to_vec()),
                );
            }
        }
        texts.sort();
        texts.dedup();
        if texts.is_empty() {
            return Masker::default();
        }
        let mut first_bytes = [false; 256];
        for text in &texts {
            first_bytes[usize::from(text[0])] = true;
        }
        let automaton = AhoCorasick::builder()
            .match_kind(MatchKind::Standard)
            .build(&texts)
            .expect("secret values of a deploy are few and short enough for an automaton");
        Masker {
            automaton: Some(automaton),
            longest: texts.iter().map(Vec::len).max().unwrap_or(0),
            sorted: texts,
            first_bytes,
        }
    }

    /// `text` with every occurrence of a secret replaced by [`MASK`]; occurrences that
    /// overlap are one mask.
    pub fn redact(&self, text: &str) -> String {
        let mut stream = self.stream();
        let mut out = stream.push(text.as_bytes());
        out.extend(stream.finish());
        // Masks are ASCII and replace whole occurrences of UTF-8 texts, so what is left
        // is cut at character boundaries only.
        String::from_utf8(out).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into())
    }

    /// A masker for one stream of bytes, fed as it arrives.
    pub fn stream(&self) -> MaskStream<'_> {
        MaskStream {
            masker: self,
            held: Vec::new(),
            masked: 0,
        }
    }

    /// The byte ranges of `buf` covered by a secret, merged where they overlap, in order.
    fn covered(&self, buf: &[u8]) -> Vec<(usize, usize)> {
        let Some(automaton) = &self.automaton else {
            return Vec::new();
        };
        let mut spans: Vec<(usize, usize)> = automaton
            .find_overlapping_iter(buf)
            .map(|m| (m.start(), m.end()))
            .collect();
        spans.sort_unstable();
        let mut merged: Vec<(usize, usize)> = Vec::with_capacity(spans.len());
        for (start, end) in spans {
            match merged.last_mut() {
                Some(last) if start < last.1 => last.1 = last.1.max(end),
                _ => merged.push((start, end)),
            }
        }
        merged
    }

    /// Where the longest end of `buf` that some secret starts with (and is longer than)
    /// begins: from there on, bytes still to come may complete a secret. `buf.len()` when
    /// no end of it is the start of a secret.
    fn undecided_from(&self, buf: &[u8]) -> usize {
        let earliest = buf.len().saturating_sub(self.longest.saturating_sub(1));
        (earliest..buf.len())
            .find(|&at| {
                self.first_bytes[usize::from(buf[at])] && self.starts_a_longer_secret(&buf[at..])
            })
            .unwrap_or(buf.len())
    }

    fn starts_a_longer_secret(&self, end: &[u8]) -> bool {
        // The texts that start with `end` follow the place `end` would be sorted at.
        let from = self.sorted.partition_point(|text| text.as_slice() < end);
        self.sorted[from..]
            .iter()
            .take_while(|text| text.starts_with(end))
            .any(|text| text.len() > end.len())
    }
}

/// Masks one stream (a command's stdout, a plugin's progress) as it arrives: what
/// [`MaskStream::push`] returns is final and may be shown at once; only the end that may
/// still become a secret is held back, at most the longest secret's length less one byte.
/// A secret split over any number of pieces is masked as if it had come in one.
pub struct MaskStream<'m> {
    masker: &'m Masker,
    /// Bytes received and not yet given back.
    held: Vec<u8>,
    /// How many of the first bytes of `held` belong to a mask already given back: a
    /// secret that overlaps them continues that mask, and they are never shown.
    masked: usize,
}

impl MaskStream<'_> {
    /// Takes the next bytes of the stream and gives back what is decided, masked.
    pub fn push(&mut self, data: &[u8]) -> Vec<u8> {
        if self.masker.automaton.is_none() {
            return data.to_vec();
        }
        self.held.extend_from_slice(data);
        let until = self.masker.undecided_from(&self.held);
        self.give_back(until)
    }

    /// The end of the stream: gives back all that was held, masked.
    pub fn finish(&mut self) -> Vec<u8> {
        self.give_back(self.held.len())
    }

    /// Gives back the bytes of `held` before `until`, masked, and keeps the rest. A
    /// secret that starts before `until` is given back whole (as a mask); its bytes past
    /// `until` stay held, marked as masked, in case a later secret overlaps them.
    fn give_back(&mut self, until: usize) -> Vec<u8> {
        let mut spans = self.masker.covered(&self.held);
        if self.masked > 0 {
            // The mask already given back, as a span that later ones may extend.
            match spans.first_mut() {
                Some(first) if first.0 < self.masked => first.1 = first.1.max(self.masked),
                _ => spans.insert(0, (0, self.masked)),
            }
        }
        let mut out = Vec::with_capacity(until);
        let mut at = 0;
        for (start, end) in spans {
            if start >= until {
                break;
            }
            out.extend_from_slice(&self.held[at..start]);
            // A span from the start that began in an earlier piece continues its mask.
            let continues = self.masked > 0 && start == 0;
            if !continues {
                out.extend_from_slice(MASK.as_bytes());
            }
            at = end;
        }
        if at < until {
            out.extend_from_slice(&self.held[at..until]);
        }
        let kept_from = until.min(self.held.len());
        // `at` is short of the mask given back when nothing was decided (`until` 0).
        self.masked = at.max(self.masked).saturating_sub(kept_from);
        self.held.drain(..kept_from);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use expect_test::{Expect, expect};

    /// What `values` make of `text`, masked in one piece.
    fn check(values: &[&str], text: &str, expected: Expect) {
        expected.assert_eq(&Masker::new(values.iter().copied()).redact(text));
    }

    /// `text` masked when it arrives in the pieces cut at `cuts`.
    fn in_pieces(masker: &Masker, text: &[u8], cuts: &[usize]) -> String {
        let mut stream = masker.stream();
        let mut out = Vec::new();
        let mut from = 0;
        for &cut in cuts.iter().chain([&text.len()]) {
            out.extend(stream.push(&text[from..cut]));
            from = cut;
        }
        out.extend(stream.finish());
        String::from_utf8(out).expect("masked UTF-8 stays UTF-8")
    }

    const PEM: &str = "-----BEGIN OPENSSH PRIVATE KEY-----\n\
        b3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQAAAAAAAAABAAAAMwAAAAtzc2gtZW\n\
        QyNTUxOQAAACCf0qSZ2xH1Zx3VsCx4kq4Yb5u2cTQpXcq8hJ0bLqgIYwAAAJg2i9ZpNovW\n\
        AAAEC2pZ\n\
        -----END OPENSSH PRIVATE KEY-----";

    #[test]
    fn values_are_masked_wherever_they_are_and_overlapping_ones_are_one_mask() {
        check(
            &["hunter2", "hunter2-extended"],
            "a=hunter2 b=hunter2-extended c=hunter2",
            expect!["a=*** b=*** c=***"],
        );
        check(
            &["hunter2"],
            "hunter2hunter2 xhunter2x",
            expect!["****** x***x"],
        );
        // Overlapping values: no byte of either is shown.
        check(&["abc", "bcdef"], "xabcdefx", expect!["x***x"]);
        check(&[""], "nothing to mask", expect!["nothing to mask"]);
        check(&["pässwörd"], "é pässwörd é", expect!["é *** é"]);
    }

    #[test]
    fn a_pem_key_printed_whole_is_one_mask_and_printed_line_by_line_shows_no_line() {
        check(
            &[PEM],
            &format!("key:\n{PEM}\ndone"),
            expect![[r#"
            key:
            ***
            done"#]],
        );
        let crlf: String = PEM.lines().map(|l| format!("{l}\r\n")).collect();
        let masked = Masker::new([PEM]).redact(&crlf);
        assert_eq!(
            masked,
            "***\r\n".repeat(5),
            "with CRLF line endings: {masked:?}"
        );
        // Compared as text: an expectation whose every line is indented reads dedented.
        let indented: String = PEM.lines().map(|l| format!("  > {l}\n")).collect();
        let masked = Masker::new([PEM]).redact(&indented);
        assert_eq!(
            masked,
            "  > ***\n".repeat(5),
            "an indented key shows none of its lines: {masked:?}"
        );
        // A line of the key alone, as a tool might print it in an error.
        let line = PEM.lines().nth(2).expect("the key has a third line");
        check(
            &[PEM],
            &format!("bad base64: {line}"),
            expect!["bad base64: ***"],
        );
    }

    #[test]
    fn short_lines_of_a_multi_line_value_are_not_masked_on_their_own() {
        check(
            &["{\n  \"k\": \"s3cr3t-value\"\n}"],
            "{\n}\n  \"k\": \"s3cr3t-value\"\n",
            expect![[r#"
                {
                }
                  ***
            "#]],
        );
    }

    #[test]
    fn a_secret_split_at_every_possible_place_is_masked_as_if_whole() {
        let masker = Masker::new(["hunter2", PEM]);
        for text in [
            "before hunter2 after".to_string(),
            format!("x{PEM}y"),
            format!("{PEM}\nhunter2"),
            "hun hunte hunter2".to_string(),
        ] {
            let whole = masker.redact(&text);
            assert!(
                !whole.contains("hunter2") && !whole.contains("b3BlbnNz"),
                "masked in one piece: {whole}"
            );
            let bytes = text.as_bytes();
            for cut in 0..=bytes.len() {
                assert_eq!(
                    in_pieces(&masker, bytes, &[cut]),
                    whole,
                    "cut at byte {cut} of {text:?}"
                );
            }
            let every_byte: Vec<usize> = (1..bytes.len()).collect();
            assert_eq!(
                in_pieces(&masker, bytes, &every_byte),
                whole,
                "one byte at a time: {text:?}"
            );
        }
    }

    #[test]
    fn a_stream_gives_back_at_once_what_cannot_become_a_secret() {
        let masker = Masker::new(["hunter2"]);
        let mut stream = masker.stream();
        assert_eq!(
            String::from_utf8(stream.push(b"waiting for the database\n")).unwrap(),
            "waiting for the database\n",
            "a line that is no start of a secret is shown while the command still runs"
        );
        assert_eq!(
            String::from_utf8(stream.push(b"password: hun")).unwrap(),
            "password: ",
            "the start of a secret is held back"
        );
        assert_eq!(
            String::from_utf8(stream.push(b"ter2!")).unwrap(),
            "***!",
            "a secret split across chunks is masked once whole"
        );
        assert_eq!(stream.finish(), b"", "nothing is left");
    }

    #[test]
    fn a_secret_overlapping_a_mask_already_given_back_extends_it_without_showing_a_byte() {
        let masker = Masker::new(["abcd", "cdefgh"]);
        let text = b"xabcdefghy";
        let whole = masker.redact("xabcdefghy");
        assert_eq!(whole, "x***y", "a secret inside a line is masked in place");
        for cut in 0..=text.len() {
            for second in cut..=text.len() {
                assert_eq!(
                    in_pieces(&masker, text, &[cut, second]),
                    whole,
                    "cut at {cut} and {second}"
                );
            }
        }
    }
}
