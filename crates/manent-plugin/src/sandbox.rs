//! What an external plugin process may see (docs/security.md, "Plugins"): its own
//! environment (nothing of the worker's but what the operator lists) and, when confined,
//! a bubblewrap (`bwrap`) sandbox holding the system read-only, its pass's working
//! directory read-write, and its pass's artifacts, SSH key, `known_hosts` and secret files
//! read-only.

use std::path::{Path, PathBuf};

/// The `PATH` a plugin gets unless the operator passes or sets another.
pub const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
/// The `LANG` a plugin gets unless the operator passes or sets another.
pub const DEFAULT_LANG: &str = "C.UTF-8";
/// The uid and gid a confined plugin runs as inside its sandbox (`nobody`).
pub const SANDBOX_ID: u32 = 65534;

/// The system directories a confined plugin sees read-only (a symlink, as on merged-/usr
/// systems, stays a symlink).
const SYSTEM_DIRS: &[&str] = &[
    "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc",
];

/// What of `/etc` a confined plugin never sees: the system's password hashes, sudo's rules,
/// TLS private keys, the SSH server's host keys (added by [`etc_secrets`]) and manent's own
/// directory of the packaged installs.
const ETC_HIDDEN: &[&str] = &[
    "/etc/shadow",
    "/etc/shadow-",
    "/etc/gshadow",
    "/etc/gshadow-",
    "/etc/sudoers",
    "/etc/sudoers.d",
    "/etc/ssl/private",
    "/etc/manent",
];

/// How a plugin process is confined (`plugins.<name>.external.confinement`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Confinement {
    /// No sandbox: the process sees what the worker's user sees (its environment is still
    /// its own).
    None,
    /// A bubblewrap sandbox, one process per pass.
    Bwrap(Bwrap),
}

/// The worker-wide part of a bubblewrap sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Bwrap {
    /// The `bwrap` executable: a path, or a bare name looked up on the worker's `PATH`.
    pub bwrap: PathBuf,
    /// More paths the plugin sees read-only (its runtime: a virtualenv, a toolchain).
    pub read_only: Vec<PathBuf>,
    /// Paths hidden even where they lie under what the plugin sees: the worker's
    /// configuration, state, database and work directories.
    pub hidden: Vec<PathBuf>,
}

/// What one pass adds to its process's view: its working directory (read-write; the
/// private `HOME` and `TMPDIR` are inside it) and the files it reads: its artifacts and its
/// environment's files. Nothing the worker creates, verifies or reuses lies in `work_dir`
/// (docs/security.md, "What the worker never trusts").
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PassScope {
    pub work_dir: PathBuf,
    /// The directories of the pass's verified artifacts (kept where only the worker
    /// writes), the environment's SSH key, `known_hosts` and secret files.
    pub read_only: Vec<PathBuf>,
}

impl PassScope {
    /// The private `HOME` of the pass's process.
    pub fn home(&self) -> PathBuf {
        self.work_dir.join(".plugin/home")
    }

    /// The private `TMPDIR` of the pass's process.
    pub fn tmp(&self) -> PathBuf {
        self.work_dir.join(".plugin/tmp")
    }
}

/// `bwrap` as a path that exists and is executable, or why not. A bare name is looked up
/// on the worker's `PATH`.
pub fn locate_bwrap(bwrap: &Path) -> Result<PathBuf, String> {
    let candidates: Vec<PathBuf> = if bwrap.components().count() > 1 || bwrap.is_absolute() {
        vec![bwrap.to_path_buf()]
    } else {
        std::env::var_os("PATH")
            .map(|p| std::env::split_paths(&p).map(|d| d.join(bwrap)).collect())
            .unwrap_or_default()
    };
    candidates
        .into_iter()
        .find(|p| is_executable(p))
        .ok_or_else(|| {
            if bwrap.components().count() > 1 || bwrap.is_absolute() {
                format!("{} does not exist or is not executable", bwrap.display())
            } else {
                format!("`{}` is not on the worker's PATH", bwrap.display())
            }
        })
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// The environment of a plugin process: [`DEFAULT_PATH`] and [`DEFAULT_LANG`] (unless
/// `configured` gives others), then `configured`, then its private `HOME` and `TMPDIR`.
pub fn environment(
    configured: &[(String, String)],
    home: &Path,
    tmp: &Path,
) -> Vec<(String, String)> {
    let mut env: Vec<(String, String)> = Vec::new();
    for (name, default) in [("PATH", DEFAULT_PATH), ("LANG", DEFAULT_LANG)] {
        if !configured.iter().any(|(k, _)| k == name) {
            env.push((name.to_string(), default.to_string()));
        }
    }
    env.extend(configured.iter().cloned());
    env.push(("HOME".to_string(), home.display().to_string()));
    env.push(("TMPDIR".to_string(), tmp.display().to_string()));
    env
}

/// The arguments of `bwrap` running `command` for a pass (everything before the command
/// itself, which follows `--`).
pub fn bwrap_args(config: &Bwrap, command: &Path, scope: &PassScope) -> Vec<String> {
    let mut args: Vec<String> = [
        // Killed with the worker (even by SIGKILL); the sandbox's pid 1 is killed with
        // bwrap, and every process of the sandbox with its pid 1.
        "--die-with-parent",
        // No terminal to push input into the worker's.
        "--new-session",
        "--unshare-user",
        "--unshare-pid",
        "--unshare-ipc",
        "--unshare-uts",
        "--unshare-cgroup-try",
        "--cap-drop",
        "ALL",
        "--proc",
        "/proc",
        "--dev",
        "/dev",
        "--tmpfs",
        "/tmp",
    ]
    .iter()
    .map(ToString::to_string)
    .collect();
    args.extend([
        "--uid".into(),
        SANDBOX_ID.to_string(),
        "--gid".into(),
        SANDBOX_ID.to_string(),
    ]);
    let mut visible: Vec<PathBuf> = Vec::new();
    for dir in SYSTEM_DIRS {
        let path = Path::new(dir);
        match std::fs::symlink_metadata(path) {
            Ok(m) if m.file_type().is_symlink() => {
                if let Ok(target) = std::fs::read_link(path) {
                    args.extend(["--symlink".into(), s(&target), s(path)]);
                }
            }
            Ok(m) if m.is_dir() => {
                ro_bind(&mut args, path);
                visible.push(path.to_path_buf());
            }
            _ => {}
        }
    }
    // A resolv.conf pointing into /run (systemd-resolved) would dangle in the sandbox.
    if let Ok(target) = std::fs::canonicalize("/etc/resolv.conf")
        && !target.starts_with("/etc")
        && let Some(dir) = target.parent()
    {
        ro_bind(&mut args, dir);
    }
    // Masks: what must stay out of reach even under what is visible.
    let mut hidden: Vec<PathBuf> = ETC_HIDDEN.iter().map(PathBuf::from).collect();
    hidden.extend(etc_secrets());
    hidden.extend(config.hidden.iter().cloned());
    mask(&mut args, &hidden, &visible);
    // The operator's paths and the verified executable, after the system's masks (a
    // command or a virtualenv beside manent.yml is still there), then masked in turn (a
    // `read_only` holding the database does not show it).
    for path in &config.read_only {
        ro_bind(&mut args, path);
    }
    ro_bind(&mut args, command);
    mask(&mut args, &hidden, &config.read_only);
    // The pass's own files, after the masks so that a key under a hidden directory is
    // still there for its own pass.
    for path in &scope.read_only {
        if path.exists() {
            ro_bind(&mut args, path);
        }
    }
    args.extend(["--bind".into(), s(&scope.work_dir), s(&scope.work_dir)]);
    args.extend(["--chdir".into(), s(&scope.work_dir)]);
    args.push("--".into());
    args
}

/// Hides each of `hidden` that lies under one of `visible`: a directory under an empty
/// tmpfs, a file under `/dev/null`.
fn mask(args: &mut Vec<String>, hidden: &[PathBuf], visible: &[PathBuf]) {
    for path in hidden {
        if !visible.iter().any(|v| path.starts_with(v)) {
            continue; // out of sight already
        }
        match std::fs::metadata(path) {
            Ok(m) if m.is_dir() => args.extend(["--tmpfs".into(), s(path)]),
            Ok(_) => args.extend(["--ro-bind".into(), "/dev/null".into(), s(path)]),
            Err(_) => {}
        }
    }
}

/// The SSH server's private host keys.
fn etc_secrets() -> Vec<PathBuf> {
    std::fs::read_dir("/etc/ssh")
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .map(|e| e.path())
                .filter(|p| {
                    p.file_name()
                        .and_then(|n| n.to_str())
                        .is_some_and(|n| n.starts_with("ssh_host_") && n.ends_with("_key"))
                })
                .collect()
        })
        .unwrap_or_default()
}

fn ro_bind(args: &mut Vec<String>, path: &Path) {
    args.extend(["--ro-bind".into(), s(path), s(path)]);
}

fn s(path: &Path) -> String {
    path.display().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_environment_has_defaults_the_operators_variables_and_a_private_home() {
        let env = environment(
            &[("PATH".into(), "/opt/bin".into()), ("X".into(), "1".into())],
            Path::new("/w/.plugin/home"),
            Path::new("/w/.plugin/tmp"),
        );
        assert_eq!(
            env,
            vec![
                ("LANG".to_string(), DEFAULT_LANG.to_string()),
                ("PATH".to_string(), "/opt/bin".to_string()),
                ("X".to_string(), "1".to_string()),
                ("HOME".to_string(), "/w/.plugin/home".to_string()),
                ("TMPDIR".to_string(), "/w/.plugin/tmp".to_string()),
            ],
            "the operator's PATH replaces the default; HOME and TMPDIR are always the pass's"
        );
    }

    #[test]
    fn a_missing_bwrap_is_named_in_the_reason() {
        let err = locate_bwrap(Path::new("/nonexistent/bwrap")).unwrap_err();
        assert!(
            err.contains("/nonexistent/bwrap"),
            "the reason names the path it looked at: {err}"
        );
    }

    #[test]
    fn the_pass_files_are_bound_after_the_masks_and_the_work_dir_last() {
        let dir = tempfile::tempdir().unwrap();
        let key = dir.path().join("key");
        std::fs::write(&key, "k").unwrap();
        let args = bwrap_args(
            &Bwrap {
                bwrap: "bwrap".into(),
                read_only: vec![dir.path().to_path_buf()],
                hidden: vec![dir.path().to_path_buf()],
            },
            Path::new("/usr/bin/true"),
            &PassScope {
                work_dir: dir.path().join("work"),
                read_only: vec![key.clone()],
            },
        );
        let position = |needle: &[String]| {
            args.windows(needle.len())
                .position(|w| w == needle)
                .unwrap_or_else(|| panic!("{needle:?} is in {args:?}"))
        };
        let mask = position(&["--tmpfs".into(), s(dir.path())]);
        let bound = position(&["--ro-bind".into(), s(&key), s(&key)]);
        assert!(
            mask < bound,
            "the key is bound over the mask of its directory: {args:?}"
        );
        assert_eq!(
            args.last().map(String::as_str),
            Some("--"),
            "the command follows --"
        );
    }
}
