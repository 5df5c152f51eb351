//! Owns reading a document past its structural problems, so that one run reports every
//! one (docs/cli.md, `validate`): serde stops at the first unknown key or wrong type; after
//! each, the node at fault is taken out of a copy of the document and the rest is read
//! again, until it reads or nothing more can be taken out.

use manent_config::yaml::{Segment as Seg, join, segments};
use serde::de::DeserializeOwned;
use yaml_serde::Value;

use crate::source::Document;

/// How many structural problems one document is read past: more than a person fixes in
/// one sitting, and a bound on the work a document can cause.
const MAX_PROBLEMS: usize = 50;

/// What was read past a document's structural problems ([`Document::typed_every`]).
pub(crate) struct Salvaged<T> {
    /// The document read without the nodes at fault, if what remained reads.
    pub(crate) value: Option<T>,
    /// The fields taken out, as written in the document.
    pub(crate) removed: Vec<String>,
}

impl<T> Salvaged<T> {
    /// Whether a check's problem about `field` may only be a consequence of what was taken
    /// out: it is in a top-level section (`deploy`; `targets` for `targets[1]`) a node was
    /// taken out of, whose defaults then stand in for what is written.
    pub(crate) fn hides(&self, field: &str) -> bool {
        let section = |path: &str| segments(path).into_iter().next();
        let of = section(field);
        self.removed.iter().any(|r| section(r) == of)
    }
}

impl Document<'_> {
    /// Deserializes `value` (this document) into `T`, recording every structural problem
    /// found as an issue. An unknown key is taken out, a wrong value too; a mapping that
    /// lacks a field (or lacks one only because it was taken out) goes whole, and an item
    /// of a list is taken out of it, the items after it still named by their place in the
    /// text.
    pub(crate) fn typed_every<T: DeserializeOwned>(&mut self, mut value: Value) -> Salvaged<T> {
        let mut salvaged = Salvaged {
            value: None,
            removed: Vec::new(),
        };
        // Items taken out of lists: the list's path as written, the item's index there.
        let mut dropped: Vec<(String, usize)> = Vec::new();
        // The first read is of the text, for exact lines; the others of what remains.
        let text = yaml_serde::Deserializer::from_str(self.text);
        let mut fault = match serde_path_to_error::deserialize::<_, T>(text) {
            Ok(read) => {
                salvaged.value = Some(read);
                return salvaged;
            }
            Err(err) => self.structural(err, &|p| p.to_owned()),
        };
        for _ in 0..MAX_PROBLEMS {
            let consequence = fault.missing && salvaged.removed.contains(&fault.issue.field);
            if !consequence {
                self.issues.push(fault.issue);
            }
            let mut at = segments(&fault.read_at);
            if fault.missing {
                at.pop();
            }
            let Some(last) = at.last().cloned() else {
                return salvaged;
            };
            let written = written_path(&join(&at), &dropped);
            if !take_out(&mut value, &at) {
                return salvaged;
            }
            if let Seg::Index(_) = last {
                let index = match segments(&written).last() {
                    Some(Seg::Index(index)) => *index,
                    _ => return salvaged,
                };
                dropped.push((written_path(&join(&at[..at.len() - 1]), &dropped), index));
            }
            salvaged.removed.push(written);
            match serde_path_to_error::deserialize::<_, T>(value.clone()) {
                Ok(read) => {
                    salvaged.value = Some(read);
                    return salvaged;
                }
                Err(err) => {
                    fault = self.structural(err, &|p| written_path(p, &dropped));
                }
            }
        }
        salvaged
    }
}

/// Where `path`, a path of the value read after `dropped` items were taken out of its
/// lists, is written in the document: each index counts the items taken out before it.
fn written_path(path: &str, dropped: &[(String, usize)]) -> String {
    let mut out: Vec<Seg> = Vec::new();
    for segment in segments(path) {
        if let Seg::Index(read) = segment {
            let list = join(&out);
            let mut gone: Vec<usize> = dropped
                .iter()
                .filter(|(l, _)| *l == list)
                .map(|(_, i)| *i)
                .collect();
            gone.sort_unstable();
            let mut index = read;
            for g in gone {
                if g <= index {
                    index += 1;
                }
            }
            out.push(Seg::Index(index));
        } else {
            out.push(segment);
        }
    }
    join(&out)
}

/// Takes the node at `at` out of `value`; false when there is none.
fn take_out(value: &mut Value, at: &[Seg]) -> bool {
    let Some((last, parents)) = at.split_last() else {
        return false;
    };
    let mut node = value;
    for segment in parents {
        let next = match segment {
            Seg::Key(key) => node.get_mut(key.as_str()),
            Seg::Index(index) => node.get_mut(*index),
        };
        match next {
            Some(next) => node = next,
            None => return false,
        }
    }
    match (last, node) {
        // Order kept: the next problem is the next one in the document.
        (Seg::Key(key), Value::Mapping(map)) => map.shift_remove(key.as_str()).is_some(),
        (Seg::Index(index), Value::Sequence(items)) if *index < items.len() => {
            items.remove(*index);
            true
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_path_read_after_items_were_taken_out_is_named_as_written() {
        let dropped = vec![("targets".to_owned(), 1), ("targets".to_owned(), 2)];
        for (read, written) in [
            ("targets[0].port", "targets[0].port"),
            ("targets[1].port", "targets[3].port"),
            ("checks[1]", "checks[1]"),
            ("deploy.dest", "deploy.dest"),
        ] {
            assert_eq!(
                written_path(read, &dropped),
                written,
                "{read} after targets[1] and targets[2] were taken out"
            );
        }
    }
}
