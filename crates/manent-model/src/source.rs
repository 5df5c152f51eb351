//! Owns reading a YAML or JSON document into a typed value: syntax errors, structural errors
//! with their field path, and finding the line where a field path is written (by walking the
//! document with serde, so flow style and JSON are located as precisely as block style).

use std::fmt;

use serde::de::{self, DeserializeOwned, DeserializeSeed, IgnoredAny, MapAccess, SeqAccess};

use manent_config::yaml::{self, Segment as Seg, child, segments};

use crate::error::{Issue, humanize};

/// A document being read: its text and file name, and the problems found so far.
pub(crate) struct Document<'a> {
    pub(crate) text: &'a str,
    pub(crate) file: &'a str,
    pub(crate) issues: Vec<Issue>,
}

impl<'a> Document<'a> {
    pub(crate) fn new(text: &'a str, file: &'a str) -> Self {
        Document {
            text,
            file,
            issues: Vec::new(),
        }
    }

    /// Records a problem about `field`, located in the text.
    pub(crate) fn issue(&mut self, field: impl Into<String>, message: impl Into<String>) {
        let field = field.into();
        let line = line_of(self.text, &field);
        self.issue_at(field, line, message);
    }

    /// Records a problem about `field` at a known line.
    pub(crate) fn issue_at(
        &mut self,
        field: impl Into<String>,
        line: Option<usize>,
        message: impl Into<String>,
    ) {
        self.issues.push(Issue {
            file: self.file.to_owned(),
            line,
            field: field.into(),
            message: message.into(),
        });
    }

    /// The document as a generic value, or `None` after recording its syntax error.
    pub(crate) fn syntax(&mut self) -> Option<yaml_serde::Value> {
        // Depth before anything parses it: 100 KB of `[` would cost the parser seconds.
        if let Err(too_deep) = yaml::check_depth(self.text, yaml::MAX_DEPTH) {
            self.issue_at(".", Some(too_deep.line), too_deep.to_string());
            return None;
        }
        match yaml_serde::from_str::<yaml_serde::Value>(self.text) {
            Ok(value) => Some(value),
            Err(err) => {
                let (line, field, message) = self.syntax_message(&err);
                self.issue_at(field, line, message);
                None
            }
        }
    }

    /// The line, field and message of a syntax error.
    fn syntax_message(&self, err: &yaml_serde::Error) -> (Option<usize>, String, String) {
        // JSON is YAML, but serde_json says more precisely what is wrong with JSON.
        if self.text.trim_start().starts_with('{')
            && let Err(json) = serde_json::from_str::<serde_json::Value>(self.text)
            && json.is_syntax() | json.is_eof()
        {
            let message = json.to_string();
            let suffix = format!(" at line {} column {}", json.line(), json.column());
            let message = message.strip_suffix(&suffix).unwrap_or(&message).to_owned();
            return (
                Some(json.line()).filter(|line| *line > 0),
                ".".to_owned(),
                format!("JSON syntax error: {message}; fix the brackets, commas or quotes there"),
            );
        }
        let line = err.location().map(|l| l.line());
        let message = yaml::strip_location(&err.to_string(), err);
        if let Some((parent, key)) = yaml::duplicate_key(&message) {
            let field = child(parent, key);
            return (
                line_of_duplicate(self.text, &field).or(line),
                field,
                format!("`{key}` is written twice; keep only one"),
            );
        }
        (
            line,
            ".".to_owned(),
            format!("YAML syntax error: {message}; fix the indentation, colons or quotes there"),
        )
    }

    /// Deserializes the document into `T`, or returns its first structural problem.
    pub(crate) fn typed<T: DeserializeOwned>(&self) -> Result<T, Issue> {
        let deserializer = yaml_serde::Deserializer::from_str(self.text);
        serde_path_to_error::deserialize::<_, T>(deserializer)
            .map_err(|err| self.structural(err, &|path| path.to_owned()).issue)
    }

    /// The problem `err` is, located in the text: `written` maps a path of the value that
    /// was read to where it is written (they differ once parts were taken out of it).
    pub(crate) fn structural(
        &self,
        err: serde_path_to_error::Error<yaml_serde::Error>,
        written: &dyn Fn(&str) -> String,
    ) -> Structural {
        let path = err.path().to_string();
        let inner = err.into_inner();
        let message = yaml::strip_path(
            &yaml::strip_location(&inner.to_string(), &inner),
            |prefix| path.starts_with(prefix) || prefix.contains(['.', '[']),
        );
        // The path names an unknown field already, but not a missing one.
        let missing = quoted_name(&message, "missing field ");
        let read_at = match missing {
            Some(name) => child(&path, name),
            None => path,
        };
        let field = written(&read_at);
        let line = if missing.is_some() {
            line_of(self.text, &field)
        } else {
            inner
                .location()
                .map(|l| l.line())
                .or_else(|| line_of(self.text, &field))
        };
        Structural {
            issue: Issue {
                file: self.file.to_owned(),
                line,
                field,
                message: humanize(&message),
            },
            read_at,
            missing: missing.is_some(),
        }
    }
}

/// A structural problem ([`Document::structural`]).
pub(crate) struct Structural {
    /// As shown: the field where it is written.
    pub(crate) issue: Issue,
    /// The field's path in the value that was read.
    pub(crate) read_at: String,
    /// The field is missing (its mapping lacks it), rather than wrong.
    pub(crate) missing: bool,
}

/// `unknown field `x`, expected …` → `x`.
fn quoted_name<'m>(message: &'m str, prefix: &str) -> Option<&'m str> {
    let rest = message.strip_prefix(prefix)?.strip_prefix('`')?;
    rest.split_once('`').map(|(name, _)| name)
}

/// The 1-based line where `path` (or, failing that, its nearest written parent) is written.
pub(crate) fn line_of(text: &str, path: &str) -> Option<usize> {
    let segs = segments(path);
    (1..=segs.len()).rev().find_map(|n| seek(text, &segs[..n]))
}

/// The marker of the error raised where the sought node is.
const FOUND: &str = "\u{1}manent-model-found\u{1}";

fn seek(text: &str, path: &[Seg]) -> Option<usize> {
    seek_nth(text, path, 0)
}

/// The line of the `nth` (0-based) occurrence of the key that ends `path` in its mapping:
/// where a key written twice is written the second time.
pub(crate) fn line_of_duplicate(text: &str, path: &str) -> Option<usize> {
    seek_nth(text, &segments(path), 1)
}

fn seek_nth(text: &str, path: &[Seg], nth: usize) -> Option<usize> {
    let deserializer = yaml_serde::Deserializer::from_str(text);
    let skip = std::cell::Cell::new(nth);
    match (Seek { path, skip: &skip }).deserialize(deserializer) {
        Err(err) if err.to_string().contains(FOUND) => err.location().map(|l| l.line()),
        _ => None,
    }
}

/// Walks the document along a path and fails, with [`FOUND`], on the node it names: the
/// YAML deserializer then attaches the position of that node (of its key, for a key) to the
/// error.
struct Seek<'p> {
    path: &'p [Seg],
    /// Occurrences of the path's last key still to pass over.
    skip: &'p std::cell::Cell<usize>,
}

impl<'de> DeserializeSeed<'de> for Seek<'_> {
    type Value = ();

    fn deserialize<D: de::Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> de::Visitor<'de> for Seek<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any value")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let Some((Seg::Key(want), rest)) = self.path.split_first() else {
            return Err(de::Error::custom("not found"));
        };
        while let Some(hit) = map.next_key_seed(SeekKey {
            want,
            last: rest.is_empty(),
            skip: self.skip,
        })? {
            if hit {
                return map.next_value_seed(Seek {
                    path: rest,
                    skip: self.skip,
                });
            }
            map.next_value::<IgnoredAny>()?;
        }
        Err(de::Error::custom("not found"))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let Some((Seg::Index(want), rest)) = self.path.split_first() else {
            return Err(de::Error::custom("not found"));
        };
        for _ in 0..*want {
            if seq.next_element::<IgnoredAny>()?.is_none() {
                return Err(de::Error::custom("not found"));
            }
        }
        if rest.is_empty() {
            seq.next_element_seed(Here)?;
        } else {
            seq.next_element_seed(Seek {
                path: rest,
                skip: self.skip,
            })?;
        }
        Err(de::Error::custom("not found"))
    }
}

/// A map key: `Ok(true)` when it is the one sought, or [`FOUND`] when it ends the path.
struct SeekKey<'p> {
    want: &'p str,
    last: bool,
    skip: &'p std::cell::Cell<usize>,
}

impl<'de> DeserializeSeed<'de> for SeekKey<'_> {
    type Value = bool;

    fn deserialize<D: de::Deserializer<'de>>(self, deserializer: D) -> Result<bool, D::Error> {
        deserializer.deserialize_str(self)
    }
}

impl<'de> de::Visitor<'de> for SeekKey<'_> {
    type Value = bool;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a key")
    }

    fn visit_str<E: de::Error>(self, key: &str) -> Result<bool, E> {
        match (key == self.want, self.last) {
            (true, true) if self.skip.get() > 0 => {
                self.skip.set(self.skip.get() - 1);
                Ok(false)
            }
            (true, true) => Err(E::custom(FOUND)),
            (hit, _) => Ok(hit),
        }
    }
}

/// The node that ends the path: fails with [`FOUND`] whatever it is.
struct Here;

impl<'de> DeserializeSeed<'de> for Here {
    type Value = ();

    fn deserialize<D: de::Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> de::Visitor<'de> for Here {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any value")
    }

    fn visit_bool<E: de::Error>(self, _: bool) -> Result<(), E> {
        Err(E::custom(FOUND))
    }

    fn visit_i64<E: de::Error>(self, _: i64) -> Result<(), E> {
        Err(E::custom(FOUND))
    }

    fn visit_u64<E: de::Error>(self, _: u64) -> Result<(), E> {
        Err(E::custom(FOUND))
    }

    fn visit_f64<E: de::Error>(self, _: f64) -> Result<(), E> {
        Err(E::custom(FOUND))
    }

    fn visit_str<E: de::Error>(self, _: &str) -> Result<(), E> {
        Err(E::custom(FOUND))
    }

    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        Err(E::custom(FOUND))
    }

    fn visit_none<E: de::Error>(self) -> Result<(), E> {
        Err(E::custom(FOUND))
    }

    fn visit_map<A: MapAccess<'de>>(self, _: A) -> Result<(), A::Error> {
        Err(de::Error::custom(FOUND))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, _: A) -> Result<(), A::Error> {
        Err(de::Error::custom(FOUND))
    }
}

/// Every path where a mapping has the key `key`, anywhere in `value` (document order).
pub(crate) fn key_paths(value: &yaml_serde::Value, key: &str) -> Vec<String> {
    fn walk(value: &yaml_serde::Value, key: &str, path: &str, out: &mut Vec<String>) {
        match value {
            yaml_serde::Value::Mapping(map) => {
                for (k, v) in map {
                    let name = match k {
                        yaml_serde::Value::String(s) => s.clone(),
                        other => yaml_serde::to_string(other)
                            .unwrap_or_default()
                            .trim()
                            .to_owned(),
                    };
                    let here = child(path, &name);
                    if name == key {
                        out.push(here.clone());
                    }
                    walk(v, key, &here, out);
                }
            }
            yaml_serde::Value::Sequence(items) => {
                for (i, item) in items.iter().enumerate() {
                    walk(item, key, &format!("{path}[{i}]"), out);
                }
            }
            yaml_serde::Value::Tagged(tagged) => walk(&tagged.value, key, path, out),
            _ => {}
        }
    }
    let mut out = Vec::new();
    walk(value, key, ".", &mut out);
    // `child` keeps a leading `.` only for the root itself; indexes at the root read `.[0]`.
    out.into_iter()
        .map(|p| p.trim_start_matches('.').to_owned())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const YAML: &str = "\
# a descriptor
application: ml/trainer
artifacts:
  - name: model
    sha256: abc
  -
    name: data
    url: {scheme: file, path: \"/x\"}
deploy:
  params:
    nested: [1, [2, 3]]
";

    const JSON: &str = "{\n  \"application\": \"ml/trainer\",\n  \"artifacts\": [\n    {\"name\": \"model\"},\n    {\n      \"name\": \"data\"\n    }\n  ]\n}\n";

    fn check(text: &str, path: &str, expected: Option<usize>) {
        assert_eq!(line_of(text, path), expected, "{path}");
    }

    #[test]
    fn locates_fields_in_yaml() {
        check(YAML, "application", Some(2));
        check(YAML, "artifacts", Some(3));
        check(YAML, "artifacts[0]", Some(4));
        check(YAML, "artifacts[0].sha256", Some(5));
        check(YAML, "artifacts[1]", Some(7));
        check(YAML, "artifacts[1].name", Some(7));
        check(YAML, "artifacts[1].url.path", Some(8));
        check(YAML, "artifacts[1].missing", Some(7));
        check(YAML, "artifacts[5]", Some(3));
        check(YAML, "deploy.params.nested[1][0]", Some(11));
        check(YAML, "environment", None);
        check(YAML, ".", None);
    }

    #[test]
    fn locates_fields_in_json() {
        check(JSON, "application", Some(2));
        check(JSON, "artifacts[0].name", Some(4));
        check(JSON, "artifacts[1].name", Some(6));
        check(JSON, "artifacts[1]", Some(5));
    }

    #[test]
    fn locates_duplicates() {
        let text = "a: 1\nb:\n  c: 1\n  d: 2\n  c: 3\na: 2\n";
        assert_eq!(
            line_of_duplicate(text, "b.c"),
            Some(5),
            "the duplicate key b.c is on line 5"
        );
        assert_eq!(
            line_of_duplicate(text, "a"),
            Some(6),
            "the duplicate key a is on line 6"
        );
        assert_eq!(
            line_of_duplicate(text, "b.d"),
            None,
            "b.d is not duplicated"
        );
    }

    #[test]
    fn paths() {
        assert_eq!(
            segments("rollout.waves[1][0]"),
            vec![
                Seg::Key("rollout".into()),
                Seg::Key("waves".into()),
                Seg::Index(1),
                Seg::Index(0)
            ],
            "a path's segments"
        );
        assert_eq!(segments("."), vec![], "the root has no segments");
        assert_eq!(child(".", "a"), "a", "a child of the root");
        assert_eq!(child("a[0]", "b"), "a[0].b", "a child of an index");
    }

    #[test]
    fn finds_keys_anywhere() {
        let value: yaml_serde::Value =
            yaml_serde::from_str("queue: a\nx: [{queue: b}, {y: {queue: c}}]\n").unwrap();
        assert_eq!(
            key_paths(&value, "queue"),
            vec!["queue", "x[0].queue", "x[1].y.queue"],
            "every path to a key named queue"
        );
    }
}
