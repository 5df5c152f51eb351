//! The shell scripts the remote-copy plugin runs on a target for its release directories:
//! pruning them (`keep_releases`), linking `shared` paths into one, and checking a release
//! a fast rollback reuses (docs/environments.md, "Release directories").

use manent_model::{EffectiveDescriptor, Target};

/// How the scripts below mark a line of their stderr as the sentence that says why they
/// failed: the worker shows that sentence ([`failure`]), never the script, which is
/// manent's own and says nothing to the person reading the failure.
pub(crate) const SAID: &str = "manent: ";

/// Why one of the scripts below failed, from its stderr and exit status: the sentences it
/// marked ([`SAID`]), else what a command it ran printed (`mkdir: … Permission denied`),
/// else its exit status.
pub(crate) fn failure(stderr: &str, status: i32) -> String {
    let lines = || stderr.lines().map(str::trim).filter(|l| !l.is_empty());
    let said: Vec<&str> = lines().filter_map(|l| l.strip_prefix(SAID)).collect();
    if !said.is_empty() {
        return said.join("; ");
    }
    let printed: Vec<&str> = lines().collect();
    if printed.is_empty() {
        format!("manent's script on the target exited with {status} without saying why")
    } else {
        printed.join("; ")
    }
}

/// What the remote scripts below say when a directory they work in is a symbolic link:
/// they stop before anything is changed or removed through it. `$1` is the path.
const REFUSE_LINKED_DIRECTORY: &str = "refuse_link() {\n\
     \x20 printf 'manent: %s is a symbolic link where a directory is expected; nothing was \
     changed through it: make it a directory on the target\\n' \"$1\" >&2\n\
     \x20 exit 1\n\
     }\n";

/// The shell script that prunes a target's release directories (`deploy.keep_releases`):
/// in `root`, the current release is touched (so that it counts as the newest), then every
/// directory past the newest `keep` (the current one always among them) is removed; one
/// line says how many releases are there after it, never the setting, and which went
/// (`2 releases kept, removed: 1.1 1.2`, `1 release kept, removed: none`). Symbolic links,
/// files and hidden entries are never touched: a `current` link or a `.shared` directory
/// beside the releases stays. `root` or the current release being a symbolic link fails
/// the step, naming it, before anything is removed.
///
/// Names are never read from a listing: they come from the shell's own `*`, one word each
/// whatever they hold (a newline included), and the newest are found with `test -nt`/`-ot`
/// (POSIX.1-2024; dash, busybox ash and bash have them). Among releases of the same
/// modification time, the one first in `*`'s order counts as the newer.
pub fn prune_releases(releases: &manent_model::Releases) -> String {
    let root = manent_ssh::shell_quote(&releases.root);
    let current = manent_ssh::shell_quote(&releases.current);
    let keep = releases.keep;
    format!(
        "{REFUSE_LINKED_DIRECTORY}\
         root={root}\n\
         current={current}\n\
         nl='\n'\n\
         if [ -L \"$root\" ]; then refuse_link \"$root\"; fi\n\
         cd -- \"$root\" || exit 1\n\
         if [ -L \"./$current\" ]; then refuse_link \"$root/$current\"; fi\n\
         if [ -d \"./$current\" ]; then touch -c -- \"./$current\"; fi\n\
         release() {{ [ -d \"./$1\" ] && [ ! -L \"./$1\" ] && [ \"$1\" != \"$current\" ]; }}\n\
         set --\n\
         for r in *; do\n\
         \x20 release \"$r\" || continue\n\
         \x20 newer=0; seen=0\n\
         \x20 for o in *; do\n\
         \x20   if [ \"$o\" = \"$r\" ]; then seen=1; continue; fi\n\
         \x20   release \"$o\" || continue\n\
         \x20   if [ \"./$o\" -nt \"./$r\" ]; then newer=$((newer + 1))\n\
         \x20   elif [ \"$seen\" = 0 ] && ! [ \"./$o\" -ot \"./$r\" ]; then newer=$((newer + 1)); fi\n\
         \x20 done\n\
         \x20 if [ \"$newer\" -ge {before} ]; then set -- \"$@\" \"$r\"; fi\n\
         done\n\
         shown() {{ case $1 in *\"$nl\"*) printf '%s' \"$1\" | tr '\\n' '?' ;; *) printf '%s' \"$1\" ;; esac; }}\n\
         removed=; failed=\n\
         for r in \"$@\"; do\n\
         \x20 if rm -rf -- \"./$r\"; then removed=\"$removed $(shown \"$r\")\"; else failed=\"$failed $(shown \"$r\")\"; fi\n\
         done\n\
         kept=0\n\
         for r in *; do if [ -d \"./$r\" ] && [ ! -L \"./$r\" ]; then kept=$((kept + 1)); fi; done\n\
         if [ \"$kept\" = 1 ]; then word=release; else word=releases; fi\n\
         echo \"$kept $word kept, removed:${{removed:- none}}\"\n\
         if [ -n \"$failed\" ]; then echo \"manent: could not remove the old release(s)$failed in $root\" >&2; exit 1; fi\n",
        // The newest `keep - 1` releases other than the current one stay.
        before = keep.saturating_sub(1),
    )
}

/// The directories a release lives in on `target`, each expected to be a directory and
/// never a symbolic link: the directory holding the releases (when `dest` has a
/// `{version}` component), each directory from there down to `dest`, or `dest` alone.
pub fn release_directories(eff: &EffectiveDescriptor, target: &Target) -> Vec<String> {
    let Some(dest) = eff.dest_for(target) else {
        return Vec::new();
    };
    let dest = dest.trim_end_matches('/').to_string();
    let root = eff.releases_root_for(target);
    let Some(below) = root
        .as_deref()
        .and_then(|root| Some((root, dest.strip_prefix(root)?)))
    else {
        return vec![dest];
    };
    let (root, below) = below;
    let mut directories = vec![root.to_string()];
    let mut at = root.to_string();
    for part in below.split('/').filter(|p| !p.is_empty()) {
        at = format!("{at}/{part}");
        directories.push(at.clone());
    }
    directories
}

/// The directories strictly above `path` (`config/app/database.yml` → `config`,
/// `config/app`), relative.
fn parents(path: &str) -> Vec<String> {
    let parts: Vec<&str> = path.split('/').filter(|p| !p.is_empty()).collect();
    (1..parts.len()).map(|n| parts[..n].join("/")).collect()
}

/// The shell script that links `deploy.shared` into a release: for each path, the release's
/// own copy (if any) is replaced by a symbolic link to the same path under `shared`. A
/// directory (`log/`) is made in `shared` if missing; a file must exist there (it is the
/// target's own, written once), else the script fails naming every missing one before
/// anything is changed. Idempotent.
///
/// First, before anything is changed: each of `directories` (the release's, from
/// [`release_directories`]), `shared`, every directory above a shared path in the release
/// and in `shared`, and a shared directory itself must not be a symbolic link; one that is
/// fails the script naming it, so nothing is removed or made through it (a release's
/// `config` linked to `/etc` would otherwise have `config/database.yml` removed there).
pub fn link_shared(
    directories: &[String],
    release: &str,
    shared: &str,
    paths: &[String],
) -> String {
    let q = manent_ssh::shell_quote;
    let mut script = format!(
        "set -e\n{REFUSE_LINKED_DIRECTORY}release={}\nshared={}\n",
        q(release),
        q(shared)
    );
    for directory in directories {
        let d = q(directory);
        script.push_str(&format!("if [ -L {d} ]; then refuse_link {d}; fi\n"));
    }
    script.push_str("if [ -L \"$shared\" ]; then refuse_link \"$shared\"; fi\n");
    let refuse_if_linked = |dir: &str, path: &str| {
        let p = q(path);
        format!("if [ -L \"${dir}\"/{p} ]; then refuse_link \"${dir}/\"{p}; fi\n")
    };
    for path in paths {
        for parent in parents(path) {
            script.push_str(&refuse_if_linked("release", &parent));
            script.push_str(&refuse_if_linked("shared", &parent));
        }
        // The release's own `log` is replaced by a link; the shared one is linked to.
        if path.ends_with('/') {
            script.push_str(&refuse_if_linked("shared", path.trim_end_matches('/')));
        }
    }
    script.push_str(&missing_shared_files(paths));
    for path in paths {
        let is_dir = path.ends_with('/');
        let path = path.trim_end_matches('/');
        let p = q(path);
        if is_dir {
            script.push_str(&format!("mkdir -p -- \"$shared\"/{p}\n"));
        }
        script.push_str(&format!(
            "mkdir -p -- \"$(dirname -- \"$release\"/{p})\"\n\
             rm -rf -- \"$release\"/{p}\n\
             ln -s -- \"$shared\"/{p} \"$release\"/{p}\n"
        ));
    }
    script.push_str(&format!("echo \"linked {} shared path(s)\"\n", paths.len()));
    script
}

/// The shell that fails, naming each one, when a shared file of `paths` (one without a
/// trailing `/`) is missing under `$shared`: the target's own, written once, which manent
/// never makes. It changes nothing: [`link_shared`] runs it before anything else, and a dry
/// run on its own ([`shared_files_check`]).
fn missing_shared_files(paths: &[String]) -> String {
    let files: Vec<String> = paths
        .iter()
        .filter(|p| !p.ends_with('/'))
        .map(|p| manent_ssh::shell_quote(p))
        .collect();
    if files.is_empty() {
        return String::new();
    }
    let mut script = String::from("missing=0\n");
    for p in files {
        script.push_str(&format!(
            "if [ ! -e \"$shared\"/{p} ]; then printf '{SAID}shared file %s is missing: \
             create it on the target (deploy.shared.paths)\\n' \"$shared\"/{p} >&2; \
             missing=1; fi\n"
        ));
    }
    script.push_str("if [ \"$missing\" = 1 ]; then exit 1; fi\n");
    script
}

/// The shell script a dry run runs on a target with `deploy.shared`: it fails naming every
/// shared file of `paths` missing from `shared`, as the deploy's `link shared` step would.
pub fn shared_files_check(shared: &str, paths: &[String]) -> String {
    format!(
        "shared={}\n{}",
        manent_ssh::shell_quote(shared),
        missing_shared_files(paths)
    )
}

/// The exit status of [`release_check`] when the release holds something manent did
/// not write; its stdout then names it.
pub(crate) const RELEASE_ALTERED: i32 = 3;

/// The exit status of [`release_check`] when a directory of the release is a
/// symbolic link; its stdout then names it.
pub(crate) const RELEASE_LINKED: i32 = 4;

/// The shell script that exits [`RELEASE_LINKED`], printing its path, when one of
/// `directories` (from [`release_directories`]) is a symbolic link; an upload runs it
/// first, and [`release_check`] starts with it.
pub fn refuse_linked(directories: &[String]) -> String {
    let mut script = String::new();
    for directory in directories {
        let d = manent_ssh::shell_quote(directory);
        script.push_str(&format!(
            "if [ -L {d} ]; then printf '%s\\n' {d}; exit {RELEASE_LINKED}; fi\n"
        ));
    }
    script
}

/// What [`prepare_release`] prints last: `umask ` and the target user's umask in octal.
pub const UMASK_PREFIX: &str = "umask ";

/// The shell script an upload runs first (docs/environments.md, "Release directories"):
/// [`refuse_linked`] on `directories` (from [`release_directories`]), then `dest` made by
/// `mkdir -p`, so with the umask the target user's commands get (0755 under the usual
/// 022), then, with `deploy.mode`, that mode set on the release's own directories (those
/// below the directory holding the releases, or `dest` alone), and last the umask printed
/// (`umask 0022`): the upload gives the artifact its mode from it once renamed.
pub fn prepare_release(
    directories: &[String],
    dest: &str,
    mode: Option<manent_model::ReleaseMode>,
) -> String {
    let q = manent_ssh::shell_quote;
    let mut script = refuse_linked(directories);
    script.push_str(&format!("mkdir -p -- {} || exit 1\n", q(dest)));
    if let Some(mode) = mode {
        let own = if directories.len() > 1 {
            &directories[1..]
        } else {
            directories
        };
        let own: Vec<String> = own.iter().map(|d| q(d)).collect();
        script.push_str(&format!(
            "chmod {} -- {} || exit 1\n",
            mode.octal(),
            own.join(" ")
        ));
    }
    script.push_str(&format!("printf '{UMASK_PREFIX}%s\\n' \"$(umask)\"\n"));
    script
}

/// The mode of an artifact once renamed into its release: read and write as `deploy.mode`
/// gives them, else as the target user's `umask` (what [`prepare_release`] printed) leaves
/// them of 0666 (0644 under 022). None when the printed text holds no umask.
pub fn artifact_mode(printed: &str, mode: Option<manent_model::ReleaseMode>) -> Option<u32> {
    if let Some(mode) = mode {
        return Some(mode.0 & 0o666);
    }
    let umask = printed
        .lines()
        .rev()
        .find_map(|line| line.trim().strip_prefix(UMASK_PREFIX))?;
    let umask = u32::from_str_radix(umask.trim(), 8).ok()?;
    Some(0o666 & !umask & 0o777)
}

/// The shell script a fast rollback runs before it reuses the release at `dest`: it walks
/// the release (never following a link) and stops at the first entry manent did not write
/// there, printing its path and exiting [`RELEASE_ALTERED`]. What manent writes: each of
/// `files` (the artifacts, the templates), a regular file at `<dest>/<path>`; each shared
/// path, a symbolic link (the `link shared` step makes it again); and the directories above
/// the files and the shared paths. Any
/// other file, link, directory or a link where an artifact belongs is unexpected, and so is
/// one of `directories` that is a symbolic link. A missing release passes: its artifacts
/// are then missing too and it is uploaded again. Names come from the shell's own globs
/// (`*`, `.[!.]*`, `..?*` for hidden ones), never from a listing.
pub fn release_check(
    directories: &[String],
    dest: &str,
    files: &[&str],
    shared: &[String],
) -> String {
    let q = manent_ssh::shell_quote;
    let mut script = refuse_linked(directories);
    script.push_str(&format!(
        "[ -d {} ] || exit 0\ncd -- {} || exit 1\n",
        q(dest),
        q(dest)
    ));
    // Each directory the walk enters, and what may be in it.
    let mut walked: Vec<String> = vec![String::new()];
    for path in shared
        .iter()
        .map(String::as_str)
        .chain(files.iter().copied())
    {
        for parent in parents(path) {
            if !walked.contains(&parent) {
                walked.push(parent);
            }
        }
    }
    for directory in &walked {
        let at = if directory.is_empty() {
            ".".to_string()
        } else {
            format!("./{directory}")
        };
        let prefix = q(&at);
        let child = |name: &str| q(&format!("{at}/{name}"));
        let mut cases = String::new();
        for path in files {
            let (parent, name) = path.rsplit_once('/').unwrap_or(("", path));
            if parent == directory {
                cases.push_str(&format!(
                    "\x20   {}) if [ -f \"$p\" ] && [ ! -L \"$p\" ]; then continue; fi ;;\n",
                    child(name)
                ));
            }
        }
        for path in shared {
            let path = path.trim_end_matches('/');
            let (parent, name) = path.rsplit_once('/').unwrap_or(("", path));
            if parent == directory {
                cases.push_str(&format!(
                    "\x20   {}) if [ -L \"$p\" ]; then continue; fi ;;\n",
                    child(name)
                ));
            }
        }
        for sub in walked.iter().filter(|w| !w.is_empty()) {
            let (parent, name) = sub.rsplit_once('/').unwrap_or(("", sub));
            if parent == directory {
                cases.push_str(&format!(
                    "\x20   {}) if [ -d \"$p\" ] && [ ! -L \"$p\" ]; then continue; fi ;;\n",
                    child(name)
                ));
            }
        }
        script.push_str(&format!(
            "for p in {prefix}/* {prefix}/.[!.]* {prefix}/..?*; do\n\
             \x20 if [ ! -e \"$p\" ] && [ ! -L \"$p\" ]; then continue; fi\n\
             \x20 case $p in\n{cases}\x20 esac\n\
             \x20 printf '%s\\n' \"$p\"; exit {RELEASE_ALTERED}\n\
             done\n"
        ));
    }
    script
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::symlink;
    use std::path::Path;
    use std::process::{Command, Output};

    use super::*;

    /// Runs `script` with `sh`, as a target's shell would (dash on Debian).
    fn sh(script: &str) -> Output {
        Command::new("sh")
            .args(["-c", script])
            .output()
            .expect("run sh")
    }

    fn text(bytes: &[u8]) -> String {
        String::from_utf8_lossy(bytes).into_owned()
    }

    /// Runs the prune script in `root`: its stdout, or its stderr as an error.
    fn try_prune(root: &Path, current: &str, keep: u32) -> Result<String, String> {
        let out = sh(&prune_releases(&manent_model::Releases {
            root: root.display().to_string(),
            current: current.into(),
            keep,
        }));
        if out.status.success() {
            Ok(text(&out.stdout))
        } else {
            Err(text(&out.stderr))
        }
    }

    fn prune(root: &Path, current: &str, keep: u32) -> String {
        try_prune(root, current, keep).unwrap_or_else(|e| panic!("the prune script fails: {e}"))
    }

    fn entries(root: &Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(root)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    /// Makes the directory `root/name`, modified `age_secs` ago.
    fn dir_aged(root: &Path, name: &str, age_secs: u64) {
        let dir = root.join(name);
        std::fs::create_dir_all(&dir).unwrap();
        let then = std::time::SystemTime::now() - std::time::Duration::from_secs(age_secs);
        std::fs::File::open(&dir)
            .unwrap()
            .set_modified(then)
            .unwrap();
    }

    fn link(paths: &[&str], release: &Path, shared: &Path, directories: &[&Path]) -> Output {
        let paths: Vec<String> = paths.iter().map(|p| p.to_string()).collect();
        let directories: Vec<String> = directories
            .iter()
            .map(|d| d.display().to_string())
            .collect();
        sh(&link_shared(
            &directories,
            &release.display().to_string(),
            &shared.display().to_string(),
            &paths,
        ))
    }

    #[test]
    fn shared_paths_are_linked_into_the_release_and_a_missing_shared_file_is_named() {
        let root = tempfile::tempdir().unwrap();
        let (release, shared) = (root.path().join("releases/1.0"), root.path().join("shared"));
        std::fs::create_dir_all(release.join("log")).unwrap();
        std::fs::write(release.join("log/old.log"), "the release's own").unwrap();
        std::fs::create_dir_all(shared.join("config")).unwrap();
        std::fs::write(shared.join("config/database.yml"), "db: shared").unwrap();
        let paths = ["log/", "config/database.yml"];
        let releases = root.path().join("releases");
        for attempt in 1..=2 {
            let out = link(&paths, &release, &shared, &[&releases, &release]);
            assert!(out.status.success(), "attempt {attempt} links: {out:?}");
        }
        assert_eq!(
            std::fs::read_link(release.join("log")).unwrap(),
            shared.join("log"),
            "the release's log/ is the shared one"
        );
        assert!(shared.join("log").is_dir(), "a shared directory is made");
        assert_eq!(
            std::fs::read_to_string(release.join("config/database.yml")).unwrap(),
            "db: shared",
            "the release reads the shared file"
        );
        let out = link(&["secrets/key"], &release, &shared, &[]);
        assert!(
            !out.status.success(),
            "a missing shared file fails the step"
        );
        assert!(
            text(&out.stderr).contains("secrets/key") && text(&out.stderr).contains("missing"),
            "and says which: {out:?}"
        );
    }

    #[test]
    fn every_missing_shared_file_is_named_before_anything_is_linked_and_the_script_is_not_quoted() {
        let root = tempfile::tempdir().unwrap();
        let (release, shared) = (root.path().join("1.0"), root.path().join("shared"));
        std::fs::create_dir_all(release.join("log")).unwrap();
        std::fs::create_dir_all(&shared).unwrap();
        std::fs::write(shared.join("present.yml"), "x").unwrap();
        let paths = ["log/", ".env", "present.yml", "config/db.yml"];
        let out = link(&paths, &release, &shared, &[]);
        let why = failure(&text(&out.stderr), out.status.code().unwrap_or(-1));
        let at = |p: &str| shared.join(p).display().to_string();
        assert_eq!(
            why,
            format!(
                "shared file {} is missing: create it on the target (deploy.shared.paths); \
                 shared file {} is missing: create it on the target (deploy.shared.paths)",
                at(".env"),
                at("config/db.yml")
            ),
            "the failure names each missing file, in one sentence each: {out:?}"
        );
        assert!(
            release.join("log").is_dir() && !release.join("log").is_symlink(),
            "nothing was linked while a shared file is missing"
        );
        let checked = sh(&shared_files_check(
            &shared.display().to_string(),
            &paths.map(String::from),
        ));
        assert_eq!(
            failure(&text(&checked.stderr), checked.status.code().unwrap_or(-1)),
            why,
            "a dry run's check finds the same missing files: {checked:?}"
        );
        std::fs::write(shared.join(".env"), "x").unwrap();
        std::fs::create_dir_all(shared.join("config")).unwrap();
        std::fs::write(shared.join("config/db.yml"), "x").unwrap();
        let checked = sh(&shared_files_check(
            &shared.display().to_string(),
            &paths.map(String::from),
        ));
        assert!(
            checked.status.success(),
            "every shared file present passes the check: {checked:?}"
        );
    }

    #[test]
    fn a_script_failure_is_its_marked_sentence_else_what_a_command_printed_else_its_status() {
        let cases = [
            (
                "rm: cannot remove 'x'\nmanent: could not remove x\n",
                "could not remove x",
            ),
            (
                "mkdir: cannot create directory '/srv/a': Permission denied\n",
                "mkdir: cannot create directory '/srv/a': Permission denied",
            ),
            (
                "",
                "manent's script on the target exited with 2 without saying why",
            ),
        ];
        for (stderr, expected) in cases {
            assert_eq!(
                failure(stderr, 2),
                expected,
                "the failure of stderr {stderr:?}"
            );
        }
    }

    /// Each directory the link step works in, made a symbolic link to a directory holding
    /// a file of the same name as the shared path: the step fails naming the link, and
    /// the file behind it is still there.
    #[test]
    fn linking_shared_paths_refuses_a_symbolic_link_where_a_directory_belongs() {
        let cases: [(&str, &str); 5] = [
            ("releases", "the directory holding the releases"),
            ("releases/1.0", "the release directory"),
            (
                "releases/1.0/config",
                "a directory above a shared path in the release",
            ),
            ("shared", "the shared directory"),
            ("shared/config", "a directory above a shared path in shared"),
        ];
        for (linked, what) in cases {
            let root = tempfile::tempdir().unwrap();
            let elsewhere = root.path().join("elsewhere");
            std::fs::create_dir_all(elsewhere.join("config")).unwrap();
            std::fs::write(elsewhere.join("database.yml"), "precious").unwrap();
            std::fs::write(elsewhere.join("config/database.yml"), "precious").unwrap();
            for dir in ["releases/1.0/config", "shared/config"] {
                let dir = root.path().join(dir);
                if !dir.starts_with(root.path().join(linked)) {
                    std::fs::create_dir_all(&dir).unwrap();
                }
            }
            let at = root.path().join(linked);
            std::fs::create_dir_all(at.parent().unwrap()).unwrap();
            symlink(&elsewhere, &at).unwrap();
            let (releases, release) = (
                root.path().join("releases"),
                root.path().join("releases/1.0"),
            );
            let shared = root.path().join("shared");
            let out = link(
                &["config/database.yml"],
                &release,
                &shared,
                &[&releases, &release],
            );
            assert!(
                !out.status.success()
                    && text(&out.stderr).contains(&at.display().to_string())
                    && text(&out.stderr).contains("symbolic link"),
                "{what} as a link fails the step naming it: {out:?}"
            );
            for file in ["database.yml", "config/database.yml"] {
                assert_eq!(
                    std::fs::read_to_string(elsewhere.join(file))
                        .ok()
                        .as_deref(),
                    Some("precious"),
                    "{what} as a link: nothing behind it is removed ({file})"
                );
            }
        }
        let root = tempfile::tempdir().unwrap();
        let (release, shared) = (root.path().join("1.0"), root.path().join("shared"));
        std::fs::create_dir_all(&release).unwrap();
        std::fs::create_dir_all(root.path().join("elsewhere")).unwrap();
        std::fs::create_dir_all(&shared).unwrap();
        symlink(root.path().join("elsewhere"), shared.join("log")).unwrap();
        let out = link(&["log/"], &release, &shared, &[]);
        assert!(
            !out.status.success() && text(&out.stderr).contains("shared/log"),
            "a shared directory that is a link fails the step naming it: {out:?}"
        );
        assert!(
            !release.join("log").exists(),
            "and the release is not linked to it"
        );
    }

    #[test]
    fn pruning_keeps_the_newest_releases_and_the_live_one() {
        let root = tempfile::tempdir().unwrap();
        // 1.0 is the oldest directory but the one just made live again (a rollback).
        for (name, age) in [
            ("1.0", 500),
            ("1.1", 400),
            ("1.2", 300),
            ("1.3", 200),
            ("two words; rm -rf *", 100),
            (".hidden", 600),
        ] {
            dir_aged(root.path(), name, age);
        }
        symlink(root.path().join("1.1"), root.path().join("current")).unwrap();
        std::fs::write(root.path().join("notes.txt"), "kept").unwrap();
        let removed = prune(root.path(), "1.0", 3);
        assert_eq!(
            entries(root.path()),
            [
                ".hidden",
                "1.0",
                "1.3",
                "current",
                "notes.txt",
                "two words; rm -rf *"
            ],
            "the live release and the two newest others stay; links, files and hidden \
             entries are never touched (removed: {removed})"
        );
        assert_eq!(
            removed, "3 releases kept, removed: 1.1 1.2\n",
            "each removal is named, and the releases there after it counted"
        );
        assert_eq!(
            prune(root.path(), "1.0", 3),
            "3 releases kept, removed: none\n",
            "pruning again removes nothing"
        );
        prune(root.path(), "1.0", 1);
        assert_eq!(
            entries(root.path()),
            [".hidden", "1.0", "current", "notes.txt"],
            "keep_releases: 1 keeps the live release alone"
        );
    }

    #[test]
    fn pruning_says_how_many_releases_there_are_not_how_many_may_stay() {
        let root = tempfile::tempdir().unwrap();
        dir_aged(root.path(), "1.0", 100);
        assert_eq!(
            prune(root.path(), "1.0", 3),
            "1 release kept, removed: none\n",
            "one release with keep_releases 3 is one release kept"
        );
    }

    /// A name read from `ls` would be split at its newline: `"a\n.shared"` would be the
    /// releases `a` and `.shared`, and `.shared` removed.
    #[test]
    fn a_release_named_with_a_newline_is_one_name_and_the_hidden_shared_directory_stays() {
        let root = tempfile::tempdir().unwrap();
        for (name, age) in [
            (".shared", 900),
            ("a\n.shared", 800),
            ("1.0", 300),
            ("1.1", 200),
        ] {
            dir_aged(root.path(), name, age);
        }
        std::fs::write(root.path().join(".shared/upload.png"), "a customer's").unwrap();
        let removed = prune(root.path(), "1.1", 2);
        assert_eq!(
            entries(root.path()),
            [".shared", "1.0", "1.1"],
            "the old release named with a newline is removed as one directory; .shared stays"
        );
        assert_eq!(
            removed, "2 releases kept, removed: a?.shared\n",
            "a newline in a removed name is shown as `?`, on the one line"
        );
        assert!(
            root.path().join(".shared/upload.png").exists(),
            "the shared upload is still there"
        );
    }

    #[test]
    fn pruning_refuses_a_linked_releases_directory_or_live_release_and_removes_nothing() {
        let root = tempfile::tempdir().unwrap();
        let elsewhere = root.path().join("elsewhere");
        for (name, age) in [("1.0", 300), ("1.1", 200), ("1.2", 100)] {
            dir_aged(&elsewhere, name, age);
        }
        let releases = root.path().join("releases");
        symlink(&elsewhere, &releases).unwrap();
        let refused = try_prune(&releases, "1.2", 1).expect_err("a linked releases directory");
        assert!(
            refused.contains(&releases.display().to_string()) && refused.contains("symbolic link"),
            "the step names the link: {refused}"
        );
        assert_eq!(
            entries(&elsewhere),
            ["1.0", "1.1", "1.2"],
            "nothing is removed through it"
        );
        let real = root.path().join("real");
        for (name, age) in [("1.0", 300), ("1.1", 200)] {
            dir_aged(&real, name, age);
        }
        symlink(elsewhere.join("1.2"), real.join("1.2")).unwrap();
        let refused = try_prune(&real, "1.2", 1).expect_err("a linked live release");
        assert!(
            refused.contains(&real.join("1.2").display().to_string()),
            "the step names the linked live release: {refused}"
        );
        assert_eq!(
            entries(&real),
            ["1.0", "1.1", "1.2"],
            "nothing is removed when the live release is a link"
        );
    }

    /// Builds a release as manent writes it (artifacts, shared links and the directories
    /// above them), applies `change`, and runs the fast rollback's check in it.
    fn check_release(change: impl Fn(&Path)) -> (i32, String) {
        let root = tempfile::tempdir().unwrap();
        let (release, shared) = (root.path().join("releases/1.0"), root.path().join("shared"));
        std::fs::create_dir_all(release.join("config")).unwrap();
        std::fs::create_dir_all(shared.join("config")).unwrap();
        std::fs::create_dir_all(shared.join("log")).unwrap();
        std::fs::write(release.join("app.tar"), "artifact").unwrap();
        std::fs::write(release.join(".env"), "artifact").unwrap();
        symlink(shared.join("log"), release.join("log")).unwrap();
        symlink(
            shared.join("config/database.yml"),
            release.join("config/database.yml"),
        )
        .unwrap();
        change(root.path());
        let directories = [
            root.path().join("releases").display().to_string(),
            release.display().to_string(),
        ];
        let out = sh(&release_check(
            &directories,
            &release.display().to_string(),
            &["app.tar", ".env"],
            &["log/".to_string(), "config/database.yml".to_string()],
        ));
        let shown = text(&out.stdout).replace(&root.path().display().to_string(), "ROOT");
        (out.status.code().unwrap_or(-1), shown)
    }

    /// What a case does to a release as manent wrote it, given the test's directory.
    type Change = Box<dyn Fn(&Path)>;

    #[test]
    fn a_fast_rollback_finds_anything_in_the_release_that_manent_did_not_write() {
        let cases: Vec<(&str, Change, (i32, &str))> = vec![
            ("as manent wrote it", Box::new(|_| {}), (0, "")),
            (
                "a planted file",
                Box::new(|r| std::fs::write(r.join("releases/1.0/evil.sh"), "x").unwrap()),
                (RELEASE_ALTERED, "./evil.sh\n"),
            ),
            (
                "a planted hidden file",
                Box::new(|r| std::fs::write(r.join("releases/1.0/.profile"), "x").unwrap()),
                (RELEASE_ALTERED, "./.profile\n"),
            ),
            (
                "a file beside a shared link",
                Box::new(|r| std::fs::write(r.join("releases/1.0/config/x.yml"), "x").unwrap()),
                (RELEASE_ALTERED, "./config/x.yml\n"),
            ),
            (
                "a link where an artifact belongs",
                Box::new(|r| {
                    std::fs::remove_file(r.join("releases/1.0/app.tar")).unwrap();
                    symlink("/etc/passwd", r.join("releases/1.0/app.tar")).unwrap();
                }),
                (RELEASE_ALTERED, "./app.tar\n"),
            ),
            (
                "a file where a shared link belongs",
                Box::new(|r| {
                    std::fs::remove_file(r.join("releases/1.0/log")).unwrap();
                    std::fs::write(r.join("releases/1.0/log"), "x").unwrap();
                }),
                (RELEASE_ALTERED, "./log\n"),
            ),
            (
                "a link where a directory above a shared path belongs",
                Box::new(|r| {
                    std::fs::remove_dir_all(r.join("releases/1.0/config")).unwrap();
                    symlink(r.join("shared"), r.join("releases/1.0/config")).unwrap();
                }),
                (RELEASE_ALTERED, "./config\n"),
            ),
            (
                "a name with a newline",
                Box::new(|r| std::fs::write(r.join("releases/1.0/a\nb"), "x").unwrap()),
                (RELEASE_ALTERED, "./a\nb\n"),
            ),
            (
                "the release directory a link",
                Box::new(|r| {
                    std::fs::rename(r.join("releases/1.0"), r.join("moved")).unwrap();
                    symlink(r.join("moved"), r.join("releases/1.0")).unwrap();
                }),
                (RELEASE_LINKED, "ROOT/releases/1.0\n"),
            ),
            (
                "no release any more",
                Box::new(|r| std::fs::remove_dir_all(r.join("releases/1.0")).unwrap()),
                (0, ""),
            ),
        ];
        for (what, change, (status, found)) in cases {
            assert_eq!(
                check_release(change),
                (status, found.to_string()),
                "{what}: the check's exit status and what it names"
            );
        }
    }

    #[test]
    fn a_release_directory_follows_the_umask_or_deploy_mode_and_its_artifacts_lose_execute() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("releases");
        let dest = root.join("1.2/app");
        let mode_of = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o7777;
        let directories = vec![
            root.display().to_string(),
            root.join("1.2").display().to_string(),
            dest.display().to_string(),
        ];
        let run = |mode, umask: &str| {
            let script = prepare_release(&directories, &directories[2], mode);
            let out = sh(&format!("umask {umask}\n{script}"));
            assert!(out.status.success(), "prepared: {}", text(&out.stderr));
            text(&out.stdout)
        };
        let printed = run(None, "022");
        assert_eq!(
            (mode_of(&root), mode_of(&dest)),
            (0o755, 0o755),
            "made with the user's umask 022"
        );
        assert_eq!(
            artifact_mode(&printed, None),
            Some(0o644),
            "an artifact readable by all under 022: {printed:?}"
        );
        let mode = Some(manent_model::ReleaseMode(0o750));
        let printed = run(mode, "077");
        assert_eq!(
            (mode_of(&root), mode_of(&root.join("1.2")), mode_of(&dest)),
            (0o755, 0o750, 0o750),
            "deploy.mode sets the release's own directories, not the one holding them"
        );
        assert_eq!(
            artifact_mode(&printed, mode),
            Some(0o640),
            "the artifact's mode is read back as written"
        );
        assert_eq!(
            artifact_mode("umask 0027\n", None),
            Some(0o640),
            "the umask as printed"
        );
        assert_eq!(
            artifact_mode("", None),
            None,
            "no umask printed: none made up"
        );
    }
}
