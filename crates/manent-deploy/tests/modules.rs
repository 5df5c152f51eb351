//! manent-deploy's modules form a DAG (issue: persisted data sat beside the workflow, and
//! the workflow called into its own read model): this reads every module's `crate::`
//! references and fails on a cycle, naming it.

use std::collections::{BTreeMap, BTreeSet};

/// Appends the text of every `.rs` file under `dir`, at any depth.
fn read_all(dir: &std::path::Path, texts: &mut Vec<String>) {
    for entry in std::fs::read_dir(dir).expect("read a room of src/") {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            read_all(&path, texts);
        } else if path.extension().is_some_and(|e| e == "rs") {
            texts.push(std::fs::read_to_string(&path).expect("read a source file"));
        }
    }
}

/// Each top-level module (a file or a room) of `src/` with the modules it refers to.
fn references() -> BTreeMap<String, BTreeSet<String>> {
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut modules = BTreeMap::new();
    for entry in std::fs::read_dir(&src).expect("read src/") {
        let path = entry.unwrap().path();
        let name = path.file_stem().unwrap().to_string_lossy().to_string();
        let text = if path.is_dir() {
            // A room (module directory): all its files, at any depth, are that module.
            let mut texts = Vec::new();
            read_all(&path, &mut texts);
            texts.join("\n")
        } else {
            std::fs::read_to_string(&path).unwrap()
        };
        if name == "lib" {
            continue;
        }
        modules.insert(name, text);
    }
    let names: BTreeSet<String> = modules.keys().cloned().collect();
    modules
        .into_iter()
        .map(|(name, text)| {
            // `crate::x` anywhere, and the first segment of each item of `use crate::{…}`.
            let mut refs = BTreeSet::new();
            for (i, _) in text.match_indices("crate::") {
                let rest = &text[i + "crate::".len()..];
                if let Some(group) = rest.strip_prefix('{') {
                    let body = &group[..group.find("};").unwrap_or(group.len())];
                    for item in body.split(',') {
                        let head = item.trim().split("::").next().unwrap_or("").trim();
                        refs.insert(head.to_string());
                    }
                } else {
                    let head: String = rest
                        .chars()
                        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                        .collect();
                    refs.insert(head);
                }
            }
            refs.retain(|r| names.contains(r) && *r != name);
            (name, refs)
        })
        .collect()
}

#[test]
fn the_modules_of_manent_deploy_form_a_dag() {
    let graph = references();
    assert!(
        graph.contains_key("request") && graph["request"].is_empty(),
        "request.rs (the persisted data) depends on no other module: {:?}",
        graph.get("request")
    );
    // Depth-first search; a module met again on the current path is a cycle.
    fn visit(
        node: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) {
        if done.contains(node) {
            return;
        }
        if let Some(at) = path.iter().position(|p| p == node) {
            let mut cycle = path[at..].to_vec();
            cycle.push(node.to_string());
            panic!("import cycle in manent-deploy: {}", cycle.join(" -> "));
        }
        path.push(node.to_string());
        for next in graph.get(node).into_iter().flatten() {
            visit(next, graph, path, done);
        }
        path.pop();
        done.insert(node.to_string());
    }
    let mut done = BTreeSet::new();
    for node in graph.keys() {
        visit(node, &graph, &mut Vec::new(), &mut done);
    }
}
