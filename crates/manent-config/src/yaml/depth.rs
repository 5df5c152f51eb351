//! Owns the nesting-depth check run before any YAML or JSON text reaches a parser: a small
//! body of 50,000 `[` costs a parser seconds, so such a document is refused in one linear
//! pass, in milliseconds, naming its line (docs/security.md, "Parsing limits").
//!
//! The count errs on the side of seeing more nesting than there is, never less: brackets
//! inside quoted scalars and block scalars (`|`, `>`) are skipped only where YAML would
//! treat them as text too, so a quote cannot hide real brackets from the count.

/// The deepest nesting manent reads. Descriptors, environment files and `manent.yml` nest a
/// handful of levels; 64 leaves room for free plugin parameters.
pub const MAX_DEPTH: usize = 64;

/// A document nested deeper than allowed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TooDeep {
    /// The 1-based line where the limit was passed.
    pub line: usize,
    pub limit: usize,
}

impl std::fmt::Display for TooDeep {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "nested deeper than {} levels at line {}; flatten the document",
            self.limit, self.line
        )
    }
}

/// Checks that `text` nests at most `limit` levels, counting flow collections (`[`, `{`)
/// and block indentation levels together.
pub fn check_depth(text: &str, limit: usize) -> Result<(), TooDeep> {
    let mut flow = 0usize;
    let mut indents: Vec<usize> = Vec::new();
    let mut quote: Option<char> = None;
    // Lines indented more than this belong to a block scalar: text, not structure.
    let mut block_scalar_of: Option<usize> = None;
    for (index, line) in text.lines().enumerate() {
        let line_no = index + 1;
        let too_deep = || TooDeep {
            line: line_no,
            limit,
        };
        let indent = line.len() - line.trim_start_matches([' ', '\t']).len();
        let content = &line[indent..];
        if quote.is_none() {
            if let Some(parent) = block_scalar_of {
                if content.is_empty() || indent > parent {
                    continue;
                }
                block_scalar_of = None;
            }
            if content.is_empty() || content.starts_with('#') {
                continue;
            }
            if flow == 0 {
                while indents.last().is_some_and(|&last| last >= indent) {
                    indents.pop();
                }
                indents.push(indent);
                // `- - - x` nests one sequence per dash on a single line.
                let dashes = content
                    .split_inclusive(' ')
                    .take_while(|word| *word == "- ")
                    .count();
                if indents.len() + dashes > limit {
                    return Err(too_deep());
                }
            }
        }
        let mut previous = if quote.is_some() { 'x' } else { ' ' };
        let mut chars = content.chars().peekable();
        while let Some(c) = chars.next() {
            match quote {
                Some('"') => match c {
                    '\\' => {
                        chars.next();
                    }
                    '"' => quote = None,
                    _ => {}
                },
                Some(_) => {
                    if c == '\'' {
                        if chars.peek() == Some(&'\'') {
                            chars.next();
                        } else {
                            quote = None;
                        }
                    }
                }
                None => match c {
                    '"' | '\'' if starts_scalar(previous) => quote = Some(c),
                    '#' if previous == ' ' || previous == '\t' => break,
                    '[' | '{' => {
                        flow += 1;
                        if flow + indents.len() > limit {
                            return Err(too_deep());
                        }
                    }
                    ']' | '}' => flow = flow.saturating_sub(1),
                    '|' | '>' if flow == 0 && matches!(previous, ' ' | ':' | '-') => {
                        let rest: String = chars.clone().collect();
                        let rest = rest.split(" #").next().unwrap_or("").trim();
                        if rest
                            .chars()
                            .all(|c| c.is_ascii_digit() || c == '+' || c == '-')
                        {
                            block_scalar_of = Some(indent);
                        }
                    }
                    _ => {}
                },
            }
            if !c.is_whitespace() || quote.is_none() {
                previous = c;
            }
        }
    }
    Ok(())
}

/// Whether a quote after `previous` (the last character before it on its line, `' '` at the
/// start) opens a quoted scalar rather than being a character of a plain one (`don't`).
fn starts_scalar(previous: char) -> bool {
    matches!(previous, ' ' | '\t' | '[' | '{' | ',' | ':' | '-' | '?')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(text: &str, limit: usize, expected: Option<usize>) {
        let got = check_depth(text, limit).err().map(|e| e.line);
        assert_eq!(got, expected, "depth check of {text:?} with limit {limit}");
    }

    #[test]
    fn ordinary_documents_pass() {
        check(
            "application: a/b\nartifacts:\n  - {name: x, url: 'a[b'}\n",
            4,
            None,
        );
        check("{\"a\": [1, [2, {\"b\": \"]]]]\"}]]}", 5, None);
        check(
            "cmd: |\n  if [ -f \"x ]; then\n    [[ y ]]\n  fi\nnext: 1\n",
            2,
            None,
        );
        check("text: don't [ stop\n", 2, None);
    }

    #[test]
    fn deep_flow_collections_are_refused_at_their_line() {
        let deep = format!("params:\n  x: {}", "[".repeat(50_000));
        check(&deep, 64, Some(2));
        check("a: [[[1]]]", 3, Some(1));
        check("a: [[1]]", 3, None);
    }

    #[test]
    fn quotes_and_block_scalars_cannot_hide_real_brackets() {
        // A closing bracket inside a quoted string does not lower the count.
        check("a: [[[\"]]]\", [[[1]]]]]]", 5, Some(1));
        // A quote inside a block scalar does not swallow the lines after it.
        check("x: |\n  \"\nparams: [[[[[[1]]]]]]\n", 4, Some(3));
        // An apostrophe inside a plain scalar is not a quote.
        check("a: don't\nb: [[[[[[1]]]]]]\n", 4, Some(2));
    }

    #[test]
    fn deep_block_nesting_counts_too() {
        let mut deep = String::new();
        for level in 0..10 {
            deep.push_str(&" ".repeat(level));
            deep.push_str("k:\n");
        }
        check(&deep, 5, Some(6));
        check("- - - - - - x\n", 4, Some(1));
    }
}
