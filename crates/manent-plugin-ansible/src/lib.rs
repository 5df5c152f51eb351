//! The `ansible` plugin: for each pass, an inventory of the pass's targets, the deploy's
//! variables as extra vars, and one `ansible-playbook` run of the artifact (a playbook, or
//! a `.tar.gz` holding `site.yml` or `playbook.yml`), read back per target from the
//! `PLAY RECAP`. `plan` and `check` run in check mode and change nothing. ansible-playbook
//! is `MANENT_ANSIBLE_PLAYBOOK`, else the one on `PATH`. Its `ssh` is this plugin's
//! `ssh-guard` (`guard`): what a run starts on a target ends with it.

pub mod guard;
pub mod inventory;
pub mod recap;

use std::{
    io::{BufRead, BufReader, Read},
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use manent_plugin::{
    Failure, Handler, Operation, Pass, PassResult, PluginInfo, Reporter, TargetResult, TargetStatus,
};
use serde_json::{Value, json};

/// The plugin's name: the key under `plugins` in manent.yml.
pub const NAME: &str = "ansible";
/// The variable naming the ansible-playbook executable.
pub const PLAYBOOK_VAR: &str = "MANENT_ANSIBLE_PLAYBOOK";

pub struct AnsiblePlugin {
    ansible_playbook: PathBuf,
}

impl AnsiblePlugin {
    /// ansible-playbook from `MANENT_ANSIBLE_PLAYBOOK`, else `PATH`.
    pub fn from_env() -> Self {
        AnsiblePlugin {
            ansible_playbook: std::env::var_os(PLAYBOOK_VAR)
                .map(PathBuf::from)
                .unwrap_or_else(|| PathBuf::from("ansible-playbook")),
        }
    }
}

impl Handler for AnsiblePlugin {
    fn info(&self) -> PluginInfo {
        PluginInfo {
            name: NAME.into(),
            version: env!("CARGO_PKG_VERSION").into(),
            protocol: 0,
            artifact_types: vec!["ansible".into()],
        }
    }

    fn run(
        &mut self,
        operation: Operation,
        pass: &Pass,
        reporter: &mut Reporter<'_>,
    ) -> Result<PassResult, Failure> {
        if operation == Operation::Rollback
            && (pass.previous_version.is_none() || pass.artifacts.is_empty())
        {
            return Ok(all(
                pass,
                TargetStatus::Ok,
                "no rollback: the pass names no previous version",
            ));
        }
        let work = tempfile::Builder::new()
            .prefix("manent-ansible-")
            .tempdir()
            .map_err(|e| {
                Failure::new(
                    "failed",
                    format!("cannot create a temporary directory: {e}"),
                )
            })?;
        let playbook = locate_playbook(pass, work.path())?;
        let inventory = work.path().join("inventory.json");
        write_json(&inventory, &inventory::render(pass))?;
        let vars = work.path().join("vars.yml");
        std::fs::write(&vars, unsafe_vars_yaml(&extra_vars(operation, pass)))
            .map_err(|e| Failure::new("failed", format!("cannot write {}: {e}", vars.display())))?;
        let run = self.run_playbook(
            operation,
            pass,
            work.path(),
            &playbook,
            &inventory,
            &vars,
            reporter,
        )?;
        interpret(operation, pass, &run)
    }
}

/// What one ansible-playbook run printed and how it ended.
struct Run {
    status: String,
    stdout: String,
    stderr: String,
}

impl AnsiblePlugin {
    #[allow(clippy::too_many_arguments)]
    fn run_playbook(
        &self,
        operation: Operation,
        pass: &Pass,
        work: &Path,
        playbook: &Path,
        inventory: &Path,
        vars: &Path,
        reporter: &mut Reporter<'_>,
    ) -> Result<Run, Failure> {
        let mut command = Command::new(&self.ansible_playbook);
        command
            .arg("-i")
            .arg(inventory)
            .arg("-e")
            .arg(format!("@{}", vars.display()));
        match operation {
            Operation::Plan => {
                command.args(["--check", "--diff"]);
            }
            Operation::Check => {
                command.arg("--check");
            }
            Operation::Deploy | Operation::Rollback => {}
        }
        command.arg(playbook);
        let strict = if pass.ssh.strict_host_key_checking {
            "True"
        } else {
            "False"
        };
        for dir in ["home", "local", "cp"] {
            std::fs::create_dir_all(work.join(dir))
                .map_err(|e| Failure::new("failed", format!("{}: {e}", work.display())))?;
        }
        // An operator's ANSIBLE_SSH_EXECUTABLE is the ssh the guard runs (docs/plugin-protocol.md).
        let real_ssh = std::env::var_os("ANSIBLE_SSH_EXECUTABLE")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from("ssh"));
        let ssh = guard::write_wrapper(work, &real_ssh, &run_key(pass, work)).map_err(|e| {
            Failure::new(
                "failed",
                format!(
                    "cannot write ansible's ssh wrapper in {}: {e}",
                    work.display()
                ),
            )
        })?;
        command
            .current_dir(playbook.parent().unwrap_or(work))
            .env("ANSIBLE_HOST_KEY_CHECKING", strict)
            .env("ANSIBLE_NOCOLOR", "1")
            .env("ANSIBLE_FORCE_COLOR", "0")
            .env("ANSIBLE_PIPELINING", "1")
            .env("ANSIBLE_RETRY_FILES_ENABLED", "0")
            .env("ANSIBLE_HOME", work.join("home"))
            .env("ANSIBLE_LOCAL_TEMP", work.join("local"))
            .env("ANSIBLE_SSH_CONTROL_PATH_DIR", work.join("cp"))
            // No SSH master left behind once the run is over.
            .env("ANSIBLE_SSH_ARGS", "-o ControlMaster=no")
            .env("ANSIBLE_SSH_EXECUTABLE", &ssh)
            // ansible-core refuses to run under a non-UTF-8 locale.
            .env("LC_ALL", "C.UTF-8")
            .env("LANG", "C.UTF-8")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        // An operator's choice (the plugin's `env`) wins: a target whose login PATH offers
        // pyenv shims needs a fixed interpreter (docs/plugin-protocol.md).
        if std::env::var_os("ANSIBLE_PYTHON_INTERPRETER").is_none() {
            command.env("ANSIBLE_PYTHON_INTERPRETER", "auto_silent");
        }
        reporter.progress(
            None,
            format!(
                "{} {} on {} target(s)",
                self.ansible_playbook.display(),
                operation,
                pass.targets.len()
            ),
        );
        let mut child = command.spawn().map_err(|e| {
            Failure::new(
                "no_ansible",
                format!(
                    "cannot run {}: {e}; install ansible-core on this worker (the server-ansible \
                     image has it) or set {PLAYBOOK_VAR}",
                    self.ansible_playbook.display()
                ),
            )
        })?;
        // stderr: echoed to ours (the plugin's log) and kept for the error message.
        let mut child_stderr = child.stderr.take().expect("piped");
        let stderr_thread = std::thread::spawn(move || {
            let mut text = String::new();
            let _ = child_stderr.read_to_string(&mut text);
            eprint!("{text}");
            text
        });
        let mut stdout = String::new();
        for line in BufReader::new(child.stdout.take().expect("piped")).lines() {
            let Ok(line) = line else { break };
            // ansible's output is the plugin's log; its plays and tasks are the progress.
            eprintln!("{line}");
            if line.starts_with("PLAY [") || line.starts_with("TASK [") {
                reporter.progress(None, line.trim_end_matches([' ', '*']).to_string());
            }
            stdout.push_str(&line);
            stdout.push('\n');
        }
        let status = child
            .wait()
            .map(|s| s.to_string())
            .unwrap_or_else(|e| format!("an unknown status ({e})"));
        let stderr = stderr_thread.join().unwrap_or_default();
        Ok(Run {
            status,
            stdout,
            stderr,
        })
    }
}

/// Who a run is to the guards on its targets (`guard`): the deploy, whichever worker
/// runs it, so that a run resumed or recovered elsewhere stops what an earlier one left
/// running; a pass that names no deploy gets its own work directory's name.
fn run_key(pass: &Pass, work: &Path) -> String {
    if pass.deploy_id.is_empty() {
        work.file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default()
    } else {
        pass.deploy_id.clone()
    }
}

/// Every target with the same status.
fn all(pass: &Pass, status: TargetStatus, detail: &str) -> PassResult {
    PassResult {
        targets: pass
            .targets
            .iter()
            .map(|t| TargetResult {
                name: t.name.clone(),
                status,
                detail: detail.to_string(),
            })
            .collect(),
    }
}

/// Per-target results from the run's `PLAY RECAP`.
fn interpret(operation: Operation, pass: &Pass, run: &Run) -> Result<PassResult, Failure> {
    let recap = recap::parse(&run.stdout);
    if recap.is_empty() {
        let tail: Vec<&str> = run
            .stderr
            .lines()
            .chain(run.stdout.lines())
            .filter(|l| !l.trim().is_empty())
            .collect();
        let tail = tail[tail.len().saturating_sub(10)..].join(" | ");
        return Err(Failure::new(
            "failed",
            format!(
                "ansible-playbook exited with {} before running any task: {tail}",
                run.status
            ),
        ));
    }
    let targets = pass
        .targets
        .iter()
        .map(|t| {
            let (status, detail) = match recap.get(&t.name) {
                None => (
                    TargetStatus::Failed,
                    format!(
                        "not in ansible's PLAY RECAP (ansible-playbook exited with {})",
                        run.status
                    ),
                ),
                Some(c) if c.failed() => {
                    let lines = recap::failure_lines(&run.stdout, &t.name);
                    (
                        TargetStatus::Failed,
                        format!(
                            "unreachable={} failed={}: {}",
                            c.unreachable,
                            c.failed,
                            lines.join(" | ")
                        ),
                    )
                }
                Some(c) => {
                    let counts = format!("ok={} changed={}", c.ok, c.changed);
                    match (operation, c.changed > 0) {
                        (Operation::Check, true) => (
                            TargetStatus::Ok,
                            format!("{counts} ({} task(s) would still change)", c.changed),
                        ),
                        (Operation::Plan, true) => {
                            (TargetStatus::Changed, format!("would change: {counts}"))
                        }
                        (_, true) => (TargetStatus::Changed, counts),
                        (_, false) => (TargetStatus::Ok, counts),
                    }
                }
            };
            TargetResult {
                name: t.name.clone(),
                status,
                detail,
            }
        })
        .collect();
    Ok(PassResult { targets })
}

/// The pass's variables, plus what manent knows of the deploy (`manent_version` is the
/// version being installed: for a rollback, the previous one).
fn extra_vars(operation: Operation, pass: &Pass) -> Value {
    let mut vars = serde_json::Map::new();
    for (k, v) in &pass.vars {
        vars.insert(k.clone(), json!(v));
    }
    let version = match operation {
        Operation::Rollback => pass.previous_version.clone().unwrap_or_default(),
        _ => pass.version.clone(),
    };
    vars.insert("manent_application".into(), json!(pass.application));
    vars.insert("manent_environment".into(), json!(pass.environment));
    vars.insert("manent_version".into(), json!(version));
    vars.insert("manent_deploy_id".into(), json!(pass.deploy_id));
    vars.insert("manent_operation".into(), json!(operation.as_str()));
    Value::Object(vars)
}

/// `vars` as a YAML mapping whose every value is tagged `!unsafe`: ansible never templates
/// them, so a `{{ lookup('pipe', …) }}` in a deploy's params (or in a version) stays text
/// instead of running on the worker. Keys and values are written as JSON strings, which
/// are YAML double-quoted scalars (every character escaped as JSON escapes it).
fn unsafe_vars_yaml(vars: &Value) -> String {
    let mut out = String::new();
    if let Value::Object(map) = vars {
        for (key, value) in map {
            let text = match value {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            out.push_str(&format!(
                "{}: !unsafe {}\n",
                Value::String(key.clone()),
                Value::String(text)
            ));
        }
    }
    if out.is_empty() {
        out.push_str("{}\n");
    }
    out
}

fn write_json(path: &Path, value: &Value) -> Result<(), Failure> {
    std::fs::write(
        path,
        serde_json::to_vec_pretty(value).expect("JSON values serialize"),
    )
    .map_err(|e| Failure::new("failed", format!("cannot write {}: {e}", path.display())))
}

/// The playbook of the pass: its `ansible` artifact (else its first) as a playbook file, or
/// unpacked from a gzip tarball into `work`, holding `site.yml` or `playbook.yml` at its top
/// or in its single top directory.
fn locate_playbook(pass: &Pass, work: &Path) -> Result<PathBuf, Failure> {
    let artifact = pass
        .artifacts
        .iter()
        .find(|a| a.kind == "ansible")
        .or_else(|| pass.artifacts.first())
        .ok_or_else(|| {
            Failure::new(
                "bad_artifact",
                "the pass has no artifact: give an artifact of type `ansible` (a playbook or a .tar.gz with site.yml)",
            )
        })?;
    let path = Path::new(&artifact.path);
    let bad = |why: String| {
        Failure::new(
            "bad_artifact",
            format!("artifact `{}` ({}): {why}", artifact.name, path.display()),
        )
    };
    let mut magic = [0u8; 2];
    let is_gzip = std::fs::File::open(path)
        .and_then(|mut f| f.read_exact(&mut magic))
        .map(|()| magic == [0x1f, 0x8b])
        .map_err(|e| bad(e.to_string()))?;
    if !is_gzip {
        return Ok(path.to_path_buf());
    }
    let dir = work.join("playbook");
    let file = std::fs::File::open(path).map_err(|e| bad(e.to_string()))?;
    tar::Archive::new(flate2::read::GzDecoder::new(file))
        .unpack(&dir)
        .map_err(|e| bad(format!("cannot unpack: {e}")))?;
    let mut candidates = vec![dir.clone()];
    if let Ok(entries) = std::fs::read_dir(&dir) {
        let subdirs: Vec<PathBuf> = entries
            .filter_map(Result::ok)
            .map(|e| e.path())
            .filter(|p| p.is_dir())
            .collect();
        if subdirs.len() == 1 {
            candidates.extend(subdirs);
        }
    }
    candidates
        .iter()
        .flat_map(|d| [d.join("site.yml"), d.join("playbook.yml")])
        .find(|p| p.is_file())
        .ok_or_else(|| bad("the tarball holds no site.yml or playbook.yml at its top".into()))
}

#[cfg(test)]
mod tests {
    use manent_plugin::ArtifactRef;

    use super::*;

    fn pass_with(path: &Path) -> Pass {
        Pass {
            artifacts: vec![ArtifactRef {
                name: "site".into(),
                kind: "ansible".into(),
                path: path.display().to_string(),
                ..ArtifactRef::default()
            }],
            ..Pass::default()
        }
    }

    fn tarball(path: &Path, files: &[(&str, &str)]) {
        let gz = flate2::write::GzEncoder::new(
            std::fs::File::create(path).unwrap(),
            flate2::Compression::fast(),
        );
        let mut tar = tar::Builder::new(gz);
        for (name, text) in files {
            let mut header = tar::Header::new_gnu();
            header.set_size(text.len() as u64);
            header.set_mode(0o644);
            header.set_cksum();
            tar.append_data(&mut header, name, text.as_bytes()).unwrap();
        }
        tar.into_inner().unwrap().finish().unwrap();
    }

    #[test]
    fn every_extra_var_is_written_unsafe_so_ansible_never_templates_it() {
        let pass = Pass {
            vars: [(
                "note".to_string(),
                "{{ lookup('pipe', 'id') }}\nline \"two\"".to_string(),
            )]
            .into(),
            version: "{{ 7 * 7 }}".into(),
            ..Pass::default()
        };
        let yaml = unsafe_vars_yaml(&extra_vars(Operation::Deploy, &pass));
        expect_test::expect![[r#"
            "manent_application": !unsafe ""
            "manent_deploy_id": !unsafe ""
            "manent_environment": !unsafe ""
            "manent_operation": !unsafe "deploy"
            "manent_version": !unsafe "{{ 7 * 7 }}"
            "note": !unsafe "{{ lookup('pipe', 'id') }}\nline \"two\""
        "#]]
        .assert_eq(&yaml);
    }

    #[test]
    fn a_playbook_file_is_used_as_it_is_and_a_tarball_is_unpacked() {
        let dir = tempfile::tempdir().unwrap();
        let plain = dir.path().join("site");
        std::fs::write(&plain, "- hosts: all\n").unwrap();
        assert_eq!(
            locate_playbook(&pass_with(&plain), dir.path()).unwrap(),
            plain,
            "a playbook artifact is run in place"
        );

        let tgz = dir.path().join("site.tgz");
        tarball(
            &tgz,
            &[("app/site.yml", "- hosts: all\n"), ("app/roles/x", "")],
        );
        let work = dir.path().join("work");
        let found = locate_playbook(&pass_with(&tgz), &work).unwrap();
        assert_eq!(
            found,
            work.join("playbook/app/site.yml"),
            "site.yml is found in the tarball's single top directory"
        );

        let empty = dir.path().join("empty.tgz");
        tarball(&empty, &[("README", "no playbook")]);
        let err = locate_playbook(&pass_with(&empty), &dir.path().join("w2")).unwrap_err();
        assert!(
            err.code == "bad_artifact" && err.message.contains("no site.yml"),
            "a tarball without a playbook is a clear error: {err:?}"
        );
    }

    #[test]
    fn without_a_previous_version_a_rollback_reports_that_it_did_nothing() {
        let plugin = AnsiblePlugin {
            ansible_playbook: PathBuf::from("/nonexistent/ansible-playbook"),
        };
        let pass = Pass {
            targets: vec![manent_plugin::TargetRef {
                name: "t1".into(),
                ..Default::default()
            }],
            ..Pass::default()
        };
        let mut out = Vec::new();
        let result = manent_plugin::serve::serve_on(
            plugin,
            std::io::Cursor::new(format!(
                "{}\n",
                serde_json::to_string(&manent_plugin::protocol::Request {
                    id: 1,
                    body: manent_plugin::protocol::RequestBody::Rollback(pass),
                })
                .unwrap()
            )),
            &mut out,
        );
        assert!(result.is_ok(), "serve reads the request");
        let text = String::from_utf8(out).unwrap();
        assert!(
            text.contains(r#""status":"ok""#) && text.contains("no rollback"),
            "ansible is not run, and the result says why: {text}"
        );
    }
}
