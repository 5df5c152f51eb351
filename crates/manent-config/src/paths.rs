//! Owns how paths of manent.yml become files: the SQLite file of `database.url` relative to
//! the configuration's directory, the default state directory of a worker, and ids as file
//! names.

use std::path::{Path, PathBuf};

/// The state directory of a process without `worker.workdir`: systemd's `STATE_DIRECTORY`
/// (its first entry), else the XDG state directory of the user, else the temp directory.
pub(crate) fn default_state_dir(var: impl Fn(&str) -> Option<std::ffi::OsString>) -> PathBuf {
    if let Some(dirs) = var("STATE_DIRECTORY") {
        // systemd joins several StateDirectory= entries with ':'.
        let dirs = dirs.to_string_lossy().into_owned();
        if let Some(first) = dirs.split(':').find(|d| !d.is_empty()) {
            return PathBuf::from(first);
        }
    }
    if let Some(dir) = var("XDG_STATE_HOME")
        .map(PathBuf::from)
        .filter(|d| d.is_absolute())
    {
        return dir.join("manent");
    }
    if let Some(home) = var("HOME").map(PathBuf::from).filter(|d| d.is_absolute()) {
        return home.join(".local/state/manent");
    }
    std::env::temp_dir().join("manent")
}

/// `id` as one path component: characters other than ASCII letters, digits, `-`, `_` and
/// `.` become `_` (an executor id may hold a `/`), and `.`/`..` are never produced alone.
pub(crate) fn file_name_of(id: &str) -> String {
    let name: String = id
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') {
                c
            } else {
                '_'
            }
        })
        .collect();
    match name.as_str() {
        "" | "." | ".." => format!("_{name}"),
        _ => name,
    }
}

/// Resolves the file of a `sqlite:` URL with `resolve` when it is relative. `sqlite://FILE`,
/// `sqlite:FILE` and a `?query` are understood as sqlx reads them; `:memory:`, `file:` URIs
/// and absolute files are left as they are, and so is every other scheme.
pub(crate) fn resolve_sqlite_url(url: &str, resolve: impl Fn(&Path) -> PathBuf) -> String {
    let Some(rest) = url.strip_prefix("sqlite:") else {
        return url.to_owned();
    };
    let rest = rest.strip_prefix("//").unwrap_or(rest);
    let (file, query) = match rest.split_once('?') {
        Some((file, query)) => (file, Some(query)),
        None => (rest, None),
    };
    if file.is_empty() || file == ":memory:" || file.starts_with("file:") {
        return url.to_owned();
    }
    let path = Path::new(file);
    if path.is_absolute() {
        return url.to_owned();
    }
    let resolved = resolve(path);
    let mut out = format!("sqlite://{}", resolved.display());
    if let Some(query) = query {
        out.push('?');
        out.push_str(query);
    }
    out
}

#[cfg(test)]
mod tests {
    use std::ffi::OsString;
    use std::path::{Path, PathBuf};

    use super::*;

    fn in_config_dir(url: &str) -> String {
        resolve_sqlite_url(url, |p| Path::new("/etc/manent").join(p))
    }

    #[test]
    fn a_relative_sqlite_file_is_resolved_and_everything_else_kept() {
        assert_eq!(
            in_config_dir("sqlite://manent.db"),
            "sqlite:///etc/manent/manent.db",
            "a relative SQLite path is relative to the config's directory"
        );
        assert_eq!(
            in_config_dir("sqlite:manent.db"),
            "sqlite:///etc/manent/manent.db",
            "without the slashes too"
        );
        assert_eq!(
            in_config_dir("sqlite://data/m.db?mode=rwc"),
            "sqlite:///etc/manent/data/m.db?mode=rwc",
            "the query is kept after the resolved file"
        );
        for kept in [
            "sqlite:///var/lib/manent/manent.db",
            "sqlite::memory:",
            "sqlite://:memory:",
            "sqlite://file:m?mode=memory",
            "postgres://manent@db/manent",
        ] {
            assert_eq!(in_config_dir(kept), kept, "{kept} is not a relative file");
        }
    }

    fn state_dir(vars: &[(&str, &str)]) -> PathBuf {
        let vars: Vec<(String, OsString)> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), OsString::from(v)))
            .collect();
        default_state_dir(|name| vars.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone()))
    }

    #[test]
    fn the_state_directory_prefers_systemd_then_xdg_then_home() {
        let all = [
            ("STATE_DIRECTORY", "/var/lib/manent:/var/lib/other"),
            ("XDG_STATE_HOME", "/home/u/.state"),
            ("HOME", "/home/u"),
        ];
        assert_eq!(
            state_dir(&all),
            Path::new("/var/lib/manent"),
            "the first state directory that exists"
        );
        assert_eq!(
            state_dir(&all[1..]),
            Path::new("/home/u/.state/manent"),
            "then $XDG_STATE_HOME"
        );
        assert_eq!(
            state_dir(&all[2..]),
            Path::new("/home/u/.local/state/manent"),
            "then ~/.local/state"
        );
        assert_eq!(
            state_dir(&[("XDG_STATE_HOME", "relative"), ("HOME", "/home/u")]),
            Path::new("/home/u/.local/state/manent"),
            "a relative XDG_STATE_HOME is ignored, as the XDG specification says"
        );
        assert_eq!(
            state_dir(&[]),
            std::env::temp_dir().join("manent"),
            "else the temporary directory"
        );
    }

    #[test]
    fn paths_of_a_loaded_file_are_relative_to_its_directory() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("manent.yml");
        std::fs::write(
            &path,
            "database: {url: sqlite://data/manent.db}\nworker: {workdir: work}\n\
             dbos: {executor_id: eu/w1}\n",
        )
        .unwrap();
        let config = crate::Config::load(&path, Vec::new()).unwrap();
        assert_eq!(
            config.database_url(),
            format!("sqlite://{}", dir.path().join("data/manent.db").display()),
            "the SQLite file is next to manent.yml, not in the working directory"
        );
        assert_eq!(
            config.worker_workdir(),
            dir.path().join("work/eu_w1"),
            "the work directory is next to manent.yml, with a directory per executor"
        );

        let overridden = crate::Config::load(
            &path,
            vec![(
                "MANENT__DATABASE__URL".to_owned(),
                "sqlite:other.db".to_owned(),
            )],
        )
        .unwrap();
        assert_eq!(
            overridden.database_url(),
            format!("sqlite://{}", dir.path().join("other.db").display()),
            "a relative file from a variable is a value of the file's keys, relative to it too"
        );
    }

    #[test]
    fn manent_workdir_given_at_load_is_the_work_directory_as_is() {
        let yaml = "worker: {workdir: /srv/work}\ndbos: {executor_id: w1}\n";
        let with = |value: &str| {
            crate::Config::from_yaml_str(
                yaml,
                "manent.yml",
                vec![("MANENT_WORKDIR".to_owned(), value.to_owned())],
            )
            .unwrap()
            .worker_workdir()
        };
        assert_eq!(
            with("/tmp/bench-work"),
            Path::new("/tmp/bench-work"),
            "MANENT_WORKDIR wins over worker.workdir, with no executor id directory added"
        );
        assert_eq!(
            with(""),
            Path::new("/srv/work/w1"),
            "an empty MANENT_WORKDIR is not set"
        );
    }

    #[test]
    fn an_empty_workdir_is_refused_naming_the_key() {
        let err =
            crate::Config::from_yaml_str("worker:\n  workdir: \"\"\n", "manent.yml", Vec::new())
                .unwrap_err()
                .to_string();
        assert!(
            err.contains("manent.yml:2: worker.workdir: empty path"),
            "the error names the file, line and key: {err}"
        );
    }

    #[test]
    fn an_executor_id_becomes_one_safe_path_component() {
        assert_eq!(
            file_name_of("manent-0"),
            "manent-0",
            "a plain id is its own file name"
        );
        assert_eq!(
            file_name_of("eu/w1"),
            "eu_w1",
            "a slash becomes an underscore"
        );
        assert_eq!(file_name_of(".."), "_..", "dots alone are prefixed");
        assert_eq!(file_name_of(""), "_", "an empty id is an underscore");
    }
}
