//! Owns reading environment files from disk: where the file of an application's
//! environment is, reading and validating it (telling "cannot be read now" from "invalid"),
//! and listing the applications and environments of the environments source.

use std::fs::DirEntry;
use std::path::{Path, PathBuf};

use super::{EnvironmentFile, parse_environment_in};
use crate::error::{EnvironmentsSourceUnreadable, ModelError};
use crate::rules;

/// The path of an environment file: `<source>/<tenant>/<app>/<environment>.yml`.
/// `application` and `environment` must be valid names (see [`load_environment`]).
pub fn environment_path(source: &Path, application: &str, environment: &str) -> PathBuf {
    let (tenant, app) = application.split_once('/').unwrap_or(("", application));
    source
        .join(tenant)
        .join(app)
        .join(format!("{environment}.yml"))
}

/// The applications (`tenant/app`) of the environments source, each with its
/// environments, sorted: the names of `<source>/<tenant>/<app>/<environment>.yml`
/// that are valid names. Entries that are not directories (or, at the last level, not
/// `.yml`) and names that are not valid are not applications and are left out; a
/// directory that cannot be read is an error naming it, never an empty list: an operator
/// who reads "no applications" believes there are none.
pub fn list_applications(
    source: &Path,
) -> Result<Vec<(String, Vec<String>)>, EnvironmentsSourceUnreadable> {
    let mut apps = Vec::new();
    for (tenant, tenant_dir) in subdirectories(source)? {
        for (app, app_dir) in subdirectories(&tenant_dir)? {
            let application = format!("{tenant}/{app}");
            if rules::application(&application).is_err() {
                continue;
            }
            let mut environments = Vec::new();
            for (name, _) in entries(&app_dir)? {
                if let Some(env) = name.strip_suffix(".yml")
                    && rules::name(env).is_ok()
                {
                    environments.push(env.to_owned());
                }
            }
            environments.sort();
            if !environments.is_empty() {
                apps.push((application, environments));
            }
        }
    }
    Ok(apps)
}

/// Why `application`/`environment` is known to have no environment file: the source can
/// be read and the file is not there. The answer names the field that is wrong
/// (`application` when the application has no environment at all, else `environment`), what
/// there is instead and the nearest name. `None` when it is not known to be missing: the
/// file is there (but could not be read), or the source cannot be read now; then the
/// deploy goes on under the rule for an environment that cannot be read.
pub fn missing_environment(
    source: &Path,
    application: &str,
    environment: &str,
) -> Option<MissingEnvironment> {
    let path = environment_path(source, application, environment);
    if std::fs::symlink_metadata(&path).is_ok() {
        return None;
    }
    let apps = list_applications(source).ok()?;
    let missing = match apps.iter().find(|(name, _)| name == application) {
        Some((_, environments)) => MissingEnvironment {
            field: "environment",
            message: format!(
                "environment: {application} has no environment `{environment}` (no file {}); its environments: {}{}",
                path.display(),
                environments.join(", "),
                did_you_mean(environment, environments.iter().map(String::as_str)),
            ),
        },
        None => MissingEnvironment {
            field: "application",
            message: format!(
                "application: no application `{application}` in the environments source {} (no file {}){}",
                source.display(),
                path.display(),
                did_you_mean(application, apps.iter().map(|(name, _)| name.as_str())),
            ),
        },
    };
    Some(missing)
}

/// An application or environment without an environment file ([`missing_environment`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MissingEnvironment {
    /// `application` or `environment`: the descriptor field to fix.
    pub field: &'static str,
    /// What is missing, what there is, and the nearest name.
    pub message: String,
}

/// `; did you mean `x`?` for the candidate nearest to `name` (an edit or a swap of two
/// letters counts one), if it is near enough to be a typo: at most a third of the name's
/// length apart, and at least one edit allowed.
fn did_you_mean<'a>(name: &str, candidates: impl Iterator<Item = &'a str>) -> String {
    let allowed = (name.chars().count() / 3).max(1);
    candidates
        .map(|c| (strsim::damerau_levenshtein(name, c), c))
        .filter(|(distance, _)| *distance <= allowed)
        .min()
        .map(|(_, c)| format!("; did you mean `{c}`?"))
        .unwrap_or_default()
}

/// The directories in `dir` (symbolic links not followed), by name, sorted.
fn subdirectories(dir: &Path) -> Result<Vec<(String, PathBuf)>, EnvironmentsSourceUnreadable> {
    let mut out = Vec::new();
    for (name, entry) in entries(dir)? {
        let kind = entry
            .file_type()
            .map_err(|source| EnvironmentsSourceUnreadable {
                path: entry.path(),
                source,
            })?;
        if kind.is_dir() {
            out.push((name, entry.path()));
        }
    }
    out.sort();
    Ok(out)
}

/// The entries of `dir` whose names are UTF-8 (no valid name is anything else).
fn entries(dir: &Path) -> Result<Vec<(String, DirEntry)>, EnvironmentsSourceUnreadable> {
    let unreadable = |source| EnvironmentsSourceUnreadable {
        path: dir.to_path_buf(),
        source,
    };
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(unreadable)? {
        let entry = entry.map_err(unreadable)?;
        if let Ok(name) = entry.file_name().into_string() {
            out.push((name, entry));
        }
    }
    Ok(out)
}

/// Reads and validates `<source>/<tenant>/<app>/<environment>.yml`. A missing or unreadable
/// file is [`ModelError::EnvironmentUnavailable`]; bad content is
/// [`ModelError::EnvironmentInvalid`].
pub fn load_environment(
    source: &Path,
    application: &str,
    environment: &str,
) -> Result<EnvironmentFile, ModelError> {
    rules::application(application).map_err(|message| ModelError::InvalidName {
        field: "application".to_owned(),
        value: application.to_owned(),
        message,
    })?;
    rules::name(environment).map_err(|message| ModelError::InvalidName {
        field: "environment".to_owned(),
        value: environment.to_owned(),
        message,
    })?;
    let path = environment_path(source, application, environment);
    let file = path.display().to_string();
    let text = match std::fs::read_to_string(&path) {
        Ok(text) => text,
        Err(err) if err.kind() == std::io::ErrorKind::InvalidData => {
            return Err(ModelError::environment_invalid(
                &file,
                vec![crate::Issue {
                    file: file.clone(),
                    line: None,
                    field: ".".to_owned(),
                    message: "is not UTF-8 text; save it as UTF-8".to_owned(),
                }],
            ));
        }
        Err(err) => {
            return Err(ModelError::EnvironmentUnavailable {
                path,
                reason: err.to_string(),
            });
        }
    };
    let dir = path.parent().unwrap_or(source);
    parse_environment_in(&text, &file, application, environment, dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loading_tells_unavailable_from_invalid() {
        let dir = tempfile::tempdir().unwrap();
        let source = dir.path();
        std::fs::create_dir_all(source.join("ml/trainer")).unwrap();
        std::fs::write(
            source.join("ml/trainer/prod.yml"),
            "targets: [{name: a, host: local}]\n",
        )
        .unwrap();
        std::fs::write(source.join("ml/trainer/bad.yml"), "targets: 3\n").unwrap();
        std::fs::create_dir_all(source.join("ml/trainer/dir.yml")).unwrap();

        let env = load_environment(source, "ml/trainer", "prod").unwrap();
        assert!(env.targets[0].is_local(), "host: local is local");

        let missing = load_environment(source, "ml/trainer", "staging").unwrap_err();
        assert!(missing.is_environment_unavailable(), "{missing}");
        let ModelError::EnvironmentUnavailable { path, .. } = &missing else {
            unreachable!()
        };
        assert_eq!(
            path,
            &source.join("ml/trainer/staging.yml"),
            "the environment file's path"
        );

        let dir_err = load_environment(source, "ml/trainer", "dir").unwrap_err();
        assert!(dir_err.is_environment_unavailable(), "{dir_err}");

        let bad = load_environment(source, "ml/trainer", "bad").unwrap_err();
        let ModelError::EnvironmentInvalid {
            file, line, field, ..
        } = &bad
        else {
            panic!("{bad:?}")
        };
        assert!(
            file.ends_with("bad.yml"),
            "the error names the file: {file:?}"
        );
        assert_eq!(
            (*line, field.as_str()),
            (Some(1), "targets"),
            "the error names the line and the field"
        );

        for (app, env) in [
            ("trainer", "prod"),
            ("ml/../x", "prod"),
            ("ml/trainer", "../x"),
        ] {
            let err = load_environment(source, app, env).unwrap_err();
            assert!(matches!(err, ModelError::InvalidName { .. }), "{err}");
        }
    }

    #[test]
    fn applications_are_listed_sorted_with_their_environments_and_nothing_else() {
        let dir = tempfile::tempdir().unwrap();
        let source = dir.path();
        for file in [
            "ml/trainer/prod.yml",
            "ml/trainer/dev.yml",
            "ml/trainer/notes.txt",
            "ml/trainer/Bad Name.yml",
            "acme/web/prod.yml",
            "acme/empty/README",
        ] {
            let path = source.join(file);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(&path, "").unwrap();
        }
        std::fs::write(source.join("README"), "not a tenant").unwrap();
        let listed = list_applications(source).expect("a readable source is listed");
        assert_eq!(
            listed,
            vec![
                ("acme/web".to_owned(), vec!["prod".to_owned()]),
                (
                    "ml/trainer".to_owned(),
                    vec!["dev".to_owned(), "prod".to_owned()]
                ),
            ],
            "applications sorted, with their valid .yml names; files, other names and \
             applications without environments left out"
        );
    }

    #[test]
    fn an_environments_source_that_cannot_be_listed_is_an_error_naming_it_not_an_empty_list() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("a-file");
        std::fs::write(&file, "not a directory").unwrap();
        let dangling = dir.path().join("dangling");
        std::os::unix::fs::symlink(dir.path().join("gone"), &dangling).unwrap();
        let missing = dir.path().join("missing");
        // Running as root, a chmod'ed directory stays readable: these cannot be listed by anyone.
        for source in [file, dangling, missing] {
            let err = list_applications(&source).expect_err("an unreadable source is no list");
            assert_eq!(err.path, source, "the error names the directory: {err}");
            assert!(
                err.to_string().contains(&source.display().to_string())
                    && err.to_string().contains("environments.source"),
                "the message names the path and the key to check: {err}"
            );
        }
    }

    #[test]
    fn a_missing_environment_names_the_field_what_there_is_and_the_nearest_name() {
        let dir = tempfile::tempdir().unwrap();
        let source = dir.path();
        for file in [
            "demo/hello/dev.yml",
            "demo/hello/prod.yml",
            "ml/trainer/prod.yml",
        ] {
            let path = source.join(file);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, "targets: [{name: a, host: local}]\n").unwrap();
        }
        let check = |application: &str, environment: &str| {
            missing_environment(source, application, environment).map(|m| {
                format!(
                    "[{}] {}",
                    m.field,
                    m.message.replace(&source.display().to_string(), "<source>")
                )
            })
        };
        expect_test::expect!["[environment] environment: demo/hello has no environment `prdo` (no file <source>/demo/hello/prdo.yml); its environments: dev, prod; did you mean `prod`?"].assert_eq(&check("demo/hello", "prdo").unwrap());
        expect_test::expect!["[environment] environment: demo/hello has no environment `staging` (no file <source>/demo/hello/staging.yml); its environments: dev, prod"].assert_eq(&check("demo/hello", "staging").unwrap());
        expect_test::expect!["[application] application: no application `demo/helo` in the environments source <source> (no file <source>/demo/helo/prod.yml); did you mean `demo/hello`?"].assert_eq(&check("demo/helo", "prod").unwrap());
        assert_eq!(
            check("demo/hello", "prod"),
            None,
            "an environment that exists is not missing"
        );
        std::fs::create_dir_all(source.join("demo/hello/locked.yml")).unwrap();
        assert_eq!(
            check("demo/hello", "locked"),
            None,
            "a file that is there but cannot be read is not known to be missing"
        );
        assert_eq!(
            missing_environment(&source.join("nowhere"), "demo/hello", "prdo"),
            None,
            "a source that cannot be read says nothing about what is missing"
        );
    }
}
