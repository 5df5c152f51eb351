//! A plugin for tests. Normally it "deploys" a version to a target by writing the version in
//! `<vars.dir>/<target>` (idempotent: `changed` the first time, `ok` after). Misbehaviour is
//! chosen per pass by `vars.mode`: `crash` exits mid-pass, `garbage` answers a line that is
//! not JSON, `hang` never answers, `fail`/`retryable` answer the protocol's error, `probe`
//! reports what the process sees (its variables' names, which of the `:`-separated paths
//! of `vars.probe` exist) in each target's detail, `plant` plants links where the worker
//! writes and dies, then reports what it reads ([`plant`]). With `vars.say` (a file), it first says
//! that file's text: each line as a progress line, all of it in a log line and on its
//! stderr, and with `mode: fail_saying` in its error. The
//! environment chooses the handshake: `MANENT_TEST_PLUGIN_NAME` (default `test`),
//! `MANENT_TEST_PLUGIN_PROTOCOL` (answer another protocol version).

use std::{io::BufRead, io::Write, path::PathBuf};

use manent_plugin::{
    Failure, Handler, Operation, Pass, PassResult, PluginInfo, Reporter, TargetResult,
    TargetStatus, protocol::LogLevel,
};

struct TestPlugin {
    name: String,
}

impl Handler for TestPlugin {
    fn info(&self) -> PluginInfo {
        PluginInfo {
            name: self.name.clone(),
            version: "0.0.1".into(),
            protocol: 0,
            artifact_types: vec!["test".into()],
        }
    }

    fn run(
        &mut self,
        operation: Operation,
        pass: &Pass,
        reporter: &mut Reporter<'_>,
    ) -> Result<PassResult, Failure> {
        reporter.log(
            LogLevel::Info,
            format!("{operation} of {} targets", pass.targets.len()),
        );
        if let Some(file) = pass.vars.get("say") {
            let text = std::fs::read_to_string(file)
                .map_err(|e| Failure::new("failed", format!("vars.say {file}: {e}")))?;
            for line in text.lines() {
                reporter.progress(None, line.to_string());
            }
            reporter.log(LogLevel::Warn, text.clone());
            eprintln!("{text}");
            if pass.vars.get("mode").map(String::as_str) == Some("fail_saying") {
                return Err(Failure::new("failed", text));
            }
        }
        match pass.vars.get("mode").map(String::as_str) {
            Some("crash") => {
                reporter.progress(None, "about to crash");
                eprintln!("test plugin: crashing on purpose during {operation}");
                std::process::exit(3);
            }
            Some("garbage") => {
                println!("this is not json");
                let _ = std::io::stdout().flush();
                return Ok(PassResult::default());
            }
            Some("hang") => loop {
                std::thread::park();
            },
            Some("fail") => return Err(Failure::new("failed", "asked to fail")),
            Some("probe") => {
                let mut names: Vec<String> = std::env::vars().map(|(k, _)| k).collect();
                names.sort();
                let seen: Vec<&str> = pass
                    .vars
                    .get("probe")
                    .map(|p| {
                        p.split(':')
                            .filter(|p| std::path::Path::new(p).exists())
                            .collect()
                    })
                    .unwrap_or_default();
                let detail = format!("env={} seen={}", names.join(","), seen.join(":"));
                return Ok(PassResult {
                    targets: pass
                        .targets
                        .iter()
                        .map(|t| TargetResult {
                            name: t.name.clone(),
                            status: TargetStatus::Ok,
                            detail: detail.clone(),
                        })
                        .collect(),
                });
            }
            Some("retryable") => {
                return Err(Failure::new("busy", "asked to fail, try again").retryable());
            }
            Some("plant") => return plant(pass),
            _ => {}
        }
        let dir = pass.vars.get("dir").map(PathBuf::from);
        let mut targets = Vec::new();
        for target in &pass.targets {
            reporter.progress(Some(&target.name), format!("{operation}"));
            let state = dir.as_ref().map(|d| d.join(&target.name));
            let current = state.as_ref().and_then(|p| std::fs::read_to_string(p).ok());
            let want = match operation {
                Operation::Rollback => pass.previous_version.clone(),
                _ => Some(pass.version.clone()),
            };
            let (status, detail) = if target.labels.get("fail").map(String::as_str) == Some("true")
            {
                (TargetStatus::Failed, "labelled to fail".to_string())
            } else {
                match (operation, want) {
                    (_, None) => (TargetStatus::Ok, "no rollback".to_string()),
                    (_, Some(want)) if current.as_deref() == Some(want.as_str()) => {
                        (TargetStatus::Ok, format!("at {want}"))
                    }
                    (Operation::Plan, Some(want)) => {
                        (TargetStatus::Changed, format!("would install {want}"))
                    }
                    (Operation::Check, Some(want)) => {
                        (TargetStatus::Failed, format!("not at {want}"))
                    }
                    (_, Some(want)) => {
                        if let Some(p) = &state {
                            std::fs::write(p, &want).map_err(|e| {
                                Failure::new("failed", format!("{}: {e}", p.display()))
                            })?;
                        }
                        (TargetStatus::Changed, format!("installed {want}"))
                    }
                }
            };
            targets.push(TargetResult {
                name: target.name.clone(),
                status,
                detail,
            });
        }
        Ok(PassResult { targets })
    }
}

fn main() {
    let name = std::env::var("MANENT_TEST_PLUGIN_NAME").unwrap_or_else(|_| "test".into());
    if let Ok(protocol) = std::env::var("MANENT_TEST_PLUGIN_PROTOCOL") {
        // A plugin of another protocol version: answers the handshake with it, and stops.
        let mut line = String::new();
        let _ = std::io::stdin().lock().read_line(&mut line);
        println!(
            r#"{{"type":"result","id":1,"result":{{"name":"{name}","version":"9","protocol":{protocol},"artifact_types":[]}}}}"#
        );
        return;
    }
    if let Err(e) = manent_plugin::serve(TestPlugin { name }) {
        eprintln!("test plugin: {e}");
        std::process::exit(1);
    }
}

/// `mode: plant`, the attack of issue 43: the first process of a pass plants links to
/// `vars.outside_file` and `vars.outside_dir` wherever the worker writes, or once wrote, in
/// a deploy's directory (the artifacts and their `.part` files, beside the artifacts it was
/// given and in its working directory; `HOME`'s `.plugin`; `artifacts`, `previous`, `work`),
/// then dies as if killed (137), which the worker retries. The process of the retry
/// reports in each target's detail the sha256 of each artifact it reads, how many links it
/// planted in all and how many beside the artifacts.
fn plant(pass: &Pass) -> Result<PassResult, Failure> {
    let failed = |what: String| Failure::new("failed", what);
    let cwd = std::env::current_dir().map_err(|e| failed(format!("no working directory: {e}")))?;
    let marker = cwd.join("planted");
    if !marker.exists() {
        let var = |name: &str| {
            pass.vars
                .get(name)
                .map(PathBuf::from)
                .ok_or_else(|| failed(format!("mode plant needs vars.{name}")))
        };
        let (file, dir) = (var("outside_file")?, var("outside_dir")?);
        let mut places: Vec<(PathBuf, &PathBuf)> = Vec::new();
        for artifact in &pass.artifacts {
            let path = PathBuf::from(&artifact.path);
            let beside = path.parent().map(PathBuf::from).unwrap_or_default();
            for base in [&beside, &cwd] {
                places.push((base.join(&artifact.name), &file));
                places.push((base.join(format!("{}.part", artifact.name)), &file));
            }
        }
        for name in [".plugin", "artifacts", "previous", "work"] {
            places.push((cwd.join(name), &dir));
        }
        let mut planted = Vec::new();
        for (place, target) in places {
            let _ = std::fs::remove_dir_all(&place);
            let _ = std::fs::remove_file(&place);
            if std::os::unix::fs::symlink(target, &place).is_ok() {
                planted.push(place.display().to_string());
            }
        }
        std::fs::write(&marker, planted.join("\n"))
            .map_err(|e| failed(format!("{}: {e}", marker.display())))?;
        eprintln!(
            "test plugin: planted {} links, dying as if killed",
            planted.len()
        );
        std::process::exit(137);
    }
    let planted = std::fs::read_to_string(&marker).unwrap_or_default();
    let beside = pass
        .artifacts
        .iter()
        .filter_map(|a| std::path::Path::new(&a.path).parent())
        .map(|dir| {
            planted
                .lines()
                .filter(|l| l.starts_with(&*dir.to_string_lossy()))
                .count()
        })
        .sum::<usize>();
    let mut detail: Vec<String> = pass
        .artifacts
        .iter()
        .map(|a| {
            let sum = manent_plugin::host::file_sha256(std::path::Path::new(&a.path))
                .unwrap_or_else(|e| format!("unreadable ({e})"));
            format!("{}={sum}", a.name)
        })
        .collect();
    detail.push(format!("planted={}", planted.lines().count()));
    detail.push(format!("beside-artifacts={beside}"));
    let detail = detail.join(" ");
    Ok(PassResult {
        targets: pass
            .targets
            .iter()
            .map(|t| TargetResult {
                name: t.name.clone(),
                status: TargetStatus::Changed,
                detail: detail.clone(),
            })
            .collect(),
    })
}
