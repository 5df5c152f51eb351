//! A target's release as recorded against what it holds now: each file changed, added or
//! removed, each link elsewhere, the live link moved or gone, the release directory gone;
//! paths `drift.ignore` lists left out (docs/plan-and-drift.md, "What is compared").

use std::collections::BTreeMap;

use manent_model::DriftSettings;
use serde::{Deserialize, Serialize};

use crate::manifests::{Manifest, Snapshot};

/// One difference: what the manifest says (`expected`) and what the target holds (`found`);
/// `None` where there is nothing (a file added has no `expected`, one removed no `found`).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Difference {
    pub path: String,
    pub expected: Option<String>,
    pub found: Option<String>,
}

/// The differences between `manifest` and `now`, in path order within each kind: the
/// release directory, files, links, live links.
pub fn differences(
    manifest: &Manifest,
    now: &Snapshot,
    settings: &DriftSettings,
) -> Vec<Difference> {
    let was = &manifest.snapshot;
    if now.release_missing {
        return vec![Difference {
            path: manifest.release.clone(),
            expected: Some("directory".into()),
            found: None,
        }]
        .into_iter()
        .chain(maps(
            &was.live_links,
            &now.live_links,
            |p| settings.ignores(p),
            "",
            "-> ",
        ))
        .collect();
    }
    let mut found = Vec::new();
    if was.too_many_files.is_none() && now.too_many_files.is_none() {
        let prefix = format!("{}/", manifest.release.trim_end_matches('/'));
        found.extend(maps(
            &was.files,
            &now.files,
            |p| settings.ignores(p),
            &prefix,
            "sha256:",
        ));
    } else if was.too_many_files != now.too_many_files {
        found.push(Difference {
            path: manifest.release.clone(),
            expected: was.too_many_files.map(|n| format!("{n} files")),
            found: now.too_many_files.map(|n| format!("{n} files")),
        });
    }
    let prefix = format!("{}/", manifest.release.trim_end_matches('/'));
    found.extend(maps(
        &was.links,
        &now.links,
        |p| settings.ignores(p),
        &prefix,
        "-> ",
    ));
    found.extend(maps(
        &was.live_links,
        &now.live_links,
        |p| settings.ignores(p),
        "",
        "-> ",
    ));
    found
}

/// What differs between two maps of path → value: `prefix` before each path (the release
/// directory, so that a path is shown absolute), `label` before each value.
fn maps(
    was: &BTreeMap<String, String>,
    now: &BTreeMap<String, String>,
    ignored: impl Fn(&str) -> bool,
    prefix: &str,
    label: &str,
) -> Vec<Difference> {
    let shown = |v: &String| format!("{label}{v}");
    let mut found = Vec::new();
    for (path, expected) in was {
        if ignored(path) {
            continue;
        }
        match now.get(path) {
            Some(value) if value == expected => {}
            value => found.push(Difference {
                path: format!("{prefix}{path}"),
                expected: Some(shown(expected)),
                found: value.map(shown),
            }),
        }
    }
    for (path, value) in now {
        if !was.contains_key(path) && !ignored(path) {
            found.push(Difference {
                path: format!("{prefix}{path}"),
                expected: None,
                found: Some(shown(value)),
            });
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snapshot(files: &[(&str, &str)], live: &[(&str, &str)]) -> Snapshot {
        Snapshot {
            files: files
                .iter()
                .map(|(p, s)| (p.to_string(), s.to_string()))
                .collect(),
            live_links: live
                .iter()
                .map(|(p, s)| (p.to_string(), s.to_string()))
                .collect(),
            ..Snapshot::default()
        }
    }

    #[test]
    fn changed_added_removed_files_and_a_moved_link_are_each_a_difference() {
        let manifest = Manifest {
            release: "/srv/web/1.0".into(),
            snapshot: snapshot(
                &[("a", "1"), ("b", "2"), ("log/x", "3")],
                &[("/srv/web/current", "/srv/web/1.0")],
            ),
            ..Manifest::default()
        };
        let now = snapshot(
            &[("a", "9"), ("c", "4"), ("log/y", "5")],
            &[("/srv/web/current", "/srv/web/0.9")],
        );
        let settings = DriftSettings {
            every: None,
            ignore: vec!["log/".into()],
        };
        let shown: Vec<String> = differences(&manifest, &now, &settings)
            .iter()
            .map(|d| format!("{} {:?} {:?}", d.path, d.expected, d.found))
            .collect();
        assert_eq!(
            shown,
            [
                r#"/srv/web/1.0/a Some("sha256:1") Some("sha256:9")"#,
                r#"/srv/web/1.0/b Some("sha256:2") None"#,
                r#"/srv/web/1.0/c None Some("sha256:4")"#,
                r#"/srv/web/current Some("-> /srv/web/1.0") Some("-> /srv/web/0.9")"#,
            ],
            "each difference once, the ignored directory left out"
        );
        assert!(
            differences(&manifest, &manifest.snapshot, &settings).is_empty(),
            "a release as recorded has no difference"
        );
    }
}
