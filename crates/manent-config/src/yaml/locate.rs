//! Owns key paths (`dbos.plugins`, `queues[1].match`: their segments, joining, nesting) and
//! finding where one is written in the YAML text, so that messages can name a line. Best
//! effort over block-style YAML: when a key is written in flow style (`{…}`, `[…]`) the line
//! of its nearest written parent is returned.

/// A segment of a key path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Segment {
    /// A mapping key: `match` in `queues[1].match`.
    Key(String),
    /// A sequence index: `1` in `queues[1].match`.
    Index(usize),
}

/// Splits `queues[1].match.applications` into its segments. `.` (the root) has none.
pub fn segments(path: &str) -> Vec<Segment> {
    let mut out = Vec::new();
    for part in path.split('.').filter(|p| !p.is_empty()) {
        let (key, mut rest) = match part.find('[') {
            Some(i) => (&part[..i], &part[i..]),
            None => (part, ""),
        };
        if !key.is_empty() {
            out.push(Segment::Key(key.to_owned()));
        }
        while let Some(stripped) = rest.strip_prefix('[') {
            let Some(end) = stripped.find(']') else { break };
            match stripped[..end].parse() {
                Ok(index) => out.push(Segment::Index(index)),
                Err(_) => out.push(Segment::Key(stripped[..end].to_owned())),
            }
            rest = &stripped[end + 1..];
        }
    }
    out
}

/// Formats segments back into a key path (`.` for the root).
pub fn join(segments: &[Segment]) -> String {
    let mut out = String::new();
    for segment in segments {
        match segment {
            Segment::Key(key) => {
                if !out.is_empty() {
                    out.push('.');
                }
                out.push_str(key);
            }
            Segment::Index(index) => out.push_str(&format!("[{index}]")),
        }
    }
    if out.is_empty() {
        out.push('.');
    }
    out
}

/// Joins a parent path and a key (`.` is the root): `child("a[0]", "b")` is `a[0].b`.
pub fn child(parent: &str, key: &str) -> String {
    if parent == "." || parent.is_empty() {
        key.to_owned()
    } else {
        format!("{parent}.{key}")
    }
}

/// True when `ancestor` is `path` itself or one of its parents.
pub fn path_contains(ancestor: &str, path: &str) -> bool {
    let ancestor = segments(ancestor);
    let path = segments(path);
    path.len() >= ancestor.len() && path[..ancestor.len()] == ancestor[..]
}

/// One significant line of YAML text.
#[derive(Debug)]
struct Line<'a> {
    /// 1-based line number.
    number: usize,
    /// Column of the first character.
    indent: usize,
    /// Starts with `- `: a sequence item.
    item: bool,
    /// Column of the content after `- ` (equal to `indent` for other lines).
    content_indent: usize,
    /// The content after the indentation and `- `.
    content: &'a str,
}

fn significant_lines(text: &str) -> Vec<Line<'_>> {
    let mut lines = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let trimmed = raw.trim_start_matches(' ');
        let indent = raw.len() - trimmed.len();
        if trimmed.trim().is_empty() || trimmed.starts_with('#') {
            continue;
        }
        if indent == 0
            && (trimmed.starts_with("---")
                || trimmed.starts_with("...")
                || trimmed.starts_with('%'))
        {
            continue;
        }
        let (item, content_indent, content) = if trimmed == "-" || trimmed.starts_with("- ") {
            let rest = &trimmed[1..];
            let content = rest.trim_start_matches(' ');
            (true, indent + 1 + rest.len() - content.len(), content)
        } else {
            (false, indent, trimmed)
        };
        lines.push(Line {
            number: i + 1,
            indent,
            item,
            content_indent,
            content,
        });
    }
    lines
}

/// The key of a `key: value` or `key:` line, quotes removed.
fn entry_key(content: &str) -> Option<&str> {
    if let Some(quote) = content.chars().next().filter(|c| *c == '"' || *c == '\'') {
        let inner = &content[1..];
        let end = inner.find(quote)?;
        return inner[end + 1..]
            .trim_start()
            .starts_with(':')
            .then(|| &inner[..end]);
    }
    let end = match content.find(": ") {
        Some(i) => i,
        None => content.strip_suffix(':').map(str::len)?,
    };
    Some(content[..end].trim_end())
}

/// The 1-based line where `path` (or, failing that, its nearest parent) is written.
pub fn locate(text: &str, path: &str) -> Option<usize> {
    let lines = significant_lines(text);
    let mut range = 0..lines.len();
    let mut found = None;
    for segment in segments(path) {
        let step = match &segment {
            Segment::Key(key) => find_key(&lines, range.clone(), key, 0),
            Segment::Index(index) => find_item(&lines, range.clone(), *index),
        };
        match step {
            Some((number, child)) => {
                found = Some(number);
                range = child;
            }
            None => break,
        }
    }
    found
}

type Found = (usize, std::ops::Range<usize>);

/// The 1-based line of the second `key` in the mapping at `parent` (`.` for the root).
pub fn locate_duplicate(text: &str, parent: &str, key: &str) -> Option<usize> {
    let lines = significant_lines(text);
    let mut range = 0..lines.len();
    for segment in segments(parent) {
        let step = match &segment {
            Segment::Key(key) => find_key(&lines, range.clone(), key, 0),
            Segment::Index(index) => find_item(&lines, range.clone(), *index),
        };
        range = step?.1;
    }
    find_key(&lines, range, key, 1).map(|(line, _)| line)
}

/// Finds `key` in the block mapping that starts at `range.start`, after `skip` earlier
/// occurrences.
fn find_key(
    lines: &[Line<'_>],
    range: std::ops::Range<usize>,
    key: &str,
    mut skip: usize,
) -> Option<Found> {
    let first = lines.get(range.start).filter(|_| !range.is_empty())?;
    let indent = first.content_indent;
    for i in range.clone() {
        let line = &lines[i];
        let is_entry = if i == range.start {
            true
        } else if line.indent < indent {
            break;
        } else {
            line.indent == indent && !line.item
        };
        if is_entry && entry_key(line.content) == Some(key) {
            if skip > 0 {
                skip -= 1;
                continue;
            }
            let end = (i + 1..range.end)
                .find(|&j| {
                    lines[j].indent < indent || (lines[j].indent == indent && !lines[j].item)
                })
                .unwrap_or(range.end);
            return Some((line.number, i + 1..end));
        }
    }
    None
}

/// Finds item `index` of the block sequence that starts at `range.start`.
fn find_item(lines: &[Line<'_>], range: std::ops::Range<usize>, index: usize) -> Option<Found> {
    let first = lines.get(range.start).filter(|_| !range.is_empty())?;
    if !first.item {
        return None;
    }
    let indent = first.indent;
    let mut items = Vec::new();
    let mut end = range.end;
    for i in range.clone() {
        let line = &lines[i];
        if line.indent < indent || (line.indent == indent && !line.item) {
            end = i;
            break;
        }
        if line.indent == indent {
            items.push(i);
        }
    }
    let start = *items.get(index)?;
    let stop = items.get(index + 1).copied().unwrap_or(end);
    let line = &lines[start];
    // `-` alone: the item's mapping starts on the next line.
    let child = if line.content.is_empty() {
        start + 1..stop
    } else {
        start..stop
    };
    Some((line.number, child))
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "\
# comment
database:
  url: sqlite://x.db   # trailing: comment

dbos:
  plugins: [ansible]
  concurrency: 3
queues:
  - name: gpu
    match:
      applications: [\"ml/*\"]
  - name: cpu
    match: {}
    concurrency: 2
tenants:
- name: ml
  queue: ml
-
  name: web
\"plugins\":
  ansible:
    'queue': ansible
";

    fn check(path: &str, expected: Option<usize>) {
        assert_eq!(locate(TEXT, path), expected, "{path}");
    }

    #[test]
    fn locates_keys() {
        check("database", Some(2));
        check("database.url", Some(3));
        check("dbos.plugins", Some(6));
        check("dbos.plugins[0]", Some(6));
        check("dbos.concurrency", Some(7));
        check("queues", Some(8));
        check("queues[0]", Some(9));
        check("queues[0].name", Some(9));
        check("queues[0].match.applications", Some(11));
        check("queues[1]", Some(12));
        check("queues[1].match", Some(13));
        check("queues[1].match.artifacts", Some(13));
        check("queues[1].concurrency", Some(14));
        check("tenants[0].queue", Some(17));
        check("tenants[1]", Some(18));
        check("tenants[1].name", Some(19));
        check("plugins.ansible.queue", Some(22));
        check("log.level", None);
        check("queues[5]", Some(8));
    }

    #[test]
    fn locates_duplicates() {
        let text = "dbos:\n  region: a\n  concurrency: 1\n  region: b\nlog: {}\nlog: {}\n";
        assert_eq!(
            locate_duplicate(text, "dbos", "region"),
            Some(4),
            "dbos.region's duplicate is on line 4"
        );
        assert_eq!(
            locate_duplicate(text, ".", "log"),
            Some(6),
            "the top-level log's duplicate is on line 6"
        );
        assert_eq!(
            locate_duplicate(text, ".", "dbos"),
            None,
            "dbos is not duplicated"
        );
    }

    #[test]
    fn paths() {
        assert_eq!(
            segments("queues[1].match"),
            vec![
                Segment::Key("queues".into()),
                Segment::Index(1),
                Segment::Key("match".into())
            ],
            "a path's segments"
        );
        assert_eq!(
            join(&segments("queues[1].match")),
            "queues[1].match",
            "segments join back into the path"
        );
        assert_eq!(join(&segments(".")), ".", "the root joins back");
        assert!(
            path_contains("dbos", "dbos.region"),
            "a section contains its keys"
        );
        assert!(
            path_contains("dbos.region", "dbos.region"),
            "a path contains itself"
        );
        assert!(
            !path_contains("dbos.region", "dbos"),
            "a key does not contain its section"
        );
        assert!(
            !path_contains("dbos.reg", "dbos.region"),
            "a prefix of a name is not its section"
        );
        assert!(
            path_contains("queues", "queues[0].name"),
            "a list contains its items' keys"
        );
    }
}
