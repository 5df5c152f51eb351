//! Validation of a parsed environment file: every problem found is an issue of the document
//! (its line and key), all reported at once (`Document::issue`); the descriptor's checks of
//! the same fields (`deploy:` overrides, `depends_on`) share `validate_deploy_fields` and
//! `validate_dependencies`.

use super::*;

pub(super) fn validate(doc: &mut Document<'_>, env: &EnvironmentFile, own: (&str, &str)) {
    validate_targets(doc, env);
    validate_deploy(doc, &env.deploy);
    validate_rollout(doc, env);
    validate_checks(doc, &env.checks);
    if let Some(approval) = &env.approval {
        validate_approval(doc, approval);
    }
    validate_dependencies(doc, "depends_on", &env.depends_on, Some(own));
    for (i, pattern) in env.dependents.iter().enumerate() {
        if let Err(message) = manent_config::check_application_pattern(pattern) {
            doc.issue(format!("dependents[{i}]"), message);
        }
    }
    variables::validate(doc, env);
    tasks::validate(doc, env);
    analysis::validate(doc, env);
    scoped::validate(doc, env);
    templates::validate(doc, env);
    super::drift::validate(doc, env);
    for (i, key) in env.overrides.iter().flatten().enumerate() {
        if !OVERRIDABLE_KEYS.contains(&key.as_str()) {
            doc.issue(
                format!("overrides[{i}]"),
                format!(
                    "`{key}` is not a deploy: key; a descriptor may be allowed to set {}",
                    OVERRIDABLE_KEYS.join(", ")
                ),
            );
        }
    }
}

fn validate_targets(doc: &mut Document<'_>, env: &EnvironmentFile) {
    if env.targets.is_empty() {
        doc.issue(
            "targets",
            "no targets; list the hosts of this environment under targets (name, host; \
             host: local for the worker's own machine)",
        );
    }
    let mut names = BTreeSet::new();
    for (i, target) in env.targets.iter().enumerate() {
        let at = |field: &str| format!("targets[{i}].{field}");
        if let Err(e) = rules::name(&target.name) {
            doc.issue(at("name"), format!("`{}` {e}", target.name));
        } else if !names.insert(target.name.as_str()) {
            doc.issue(
                at("name"),
                format!(
                    "`{}` is the name of an earlier target; target names must be unique",
                    target.name
                ),
            );
        }
        if target.host.trim().is_empty() || target.host.contains(char::is_whitespace) {
            doc.issue(
                at("host"),
                format!(
                    "`{}` is not a host; write a host name or address, or local for the \
                     worker's own machine",
                    target.host
                ),
            );
        }
        if target.port == 0 {
            doc.issue(at("port"), "is 0; write the SSH port (default 22)");
        }
        if let Some(user) = &target.user
            && user.trim().is_empty()
        {
            doc.issue(at("user"), "is empty; write a user name or remove it");
        }
        for (field, value) in [("region", &target.region), ("az", &target.az)] {
            if let Some(value) = value
                && let Err(e) = rules::name(value)
            {
                doc.issue(at(field), format!("`{value}` {e}"));
            }
        }
    }
    if let Some(user) = &env.ssh.user
        && user.trim().is_empty()
    {
        doc.issue("ssh.user", "is empty; write a user name or remove it");
    }
}

fn validate_deploy(doc: &mut Document<'_>, deploy: &DeploySettings) {
    validate_deploy_fields(
        doc,
        Some(&deploy.plugin),
        deploy.dest.as_deref(),
        deploy.activate.as_deref(),
        &deploy.commands,
    );
    super::container::validate(doc, deploy);
    if let Some(shared) = &deploy.shared {
        validate_shared(doc, deploy, shared);
    }
    if let Some(keep) = deploy.keep_releases {
        if keep == 0 {
            doc.issue(
                "deploy.keep_releases",
                "is 0; write how many release directories stay on each target (2 or more \
                 keeps the one a rollback returns to), or remove it",
            );
        } else if deploy.plugin != DEFAULT_PLUGIN {
            doc.issue(
                "deploy.keep_releases",
                format!(
                    "applies to the {DEFAULT_PLUGIN} plugin only (this environment's is `{}`); \
                     remove it",
                    deploy.plugin
                ),
            );
        } else if let Some(dest) = &deploy.dest
            && crate::effective::releases_root(dest).is_none()
        {
            doc.issue("deploy.keep_releases", KEEP_RELEASES_NEEDS_VERSION_DIR);
        }
    }
}

/// `deploy.shared`: the remote-copy plugin's, a `dir` with known placeholders (never
/// `{version}`: it outlives releases) outside the releases `keep_releases` prunes, and
/// relative paths that stay inside a release.
fn validate_shared(doc: &mut Document<'_>, deploy: &DeploySettings, shared: &SharedPaths) {
    if deploy.plugin != DEFAULT_PLUGIN {
        doc.issue(
            "deploy.shared",
            format!(
                "applies to the {DEFAULT_PLUGIN} plugin only (this environment's is `{}`); \
                 remove it",
                deploy.plugin
            ),
        );
    }
    if shared.dir.trim().is_empty() {
        doc.issue(
            "deploy.shared.dir",
            "is empty; write the directory on the targets that keeps the shared paths",
        );
    } else if let Err(e) =
        rules::placeholders(&shared.dir, &["target", "application", "environment"])
    {
        doc.issue(
            "deploy.shared.dir",
            format!("{e} (not {{version}}: it is shared by every version)"),
        );
    } else if let Some(root) = deploy
        .dest
        .as_deref()
        .and_then(crate::effective::releases_root)
        && deploy.keep_releases.is_some()
        && pruned_with_releases(&shared.dir, &root)
    {
        doc.issue(
            "deploy.shared.dir",
            format!(
                "is among the release directories of {root}, which keep_releases removes; \
                 keep it beside them (e.g. {root}/../shared) or hidden ({root}/.shared)"
            ),
        );
    }
    if shared.paths.is_empty() {
        doc.issue(
            "deploy.shared.paths",
            "is empty; list the paths each release shares, or remove deploy.shared",
        );
    }
    for (i, path) in shared.paths.iter().enumerate() {
        let parts: Vec<&str> = path.trim_end_matches('/').split('/').collect();
        if path.starts_with('/')
            || parts
                .iter()
                .any(|p| p.is_empty() || *p == "." || *p == "..")
            || path.contains(['\n', '\0'])
        {
            doc.issue(
                format!("deploy.shared.paths[{i}]"),
                format!(
                    "`{path}` must be a path inside a release: relative, without `.`, `..` or \
                     empty parts (`log/`, `config/database.yml`)"
                ),
            );
        }
    }
}

/// Whether `keep_releases`' pruning of `root` could remove `dir`: `root` itself, or a
/// directory under it whose first part is not hidden (pruning leaves hidden entries alone).
fn pruned_with_releases(dir: &str, root: &str) -> bool {
    let dir = dir.trim_end_matches('/');
    match dir.strip_prefix(root) {
        Some("") => true,
        Some(rest) => rest
            .strip_prefix('/')
            .is_some_and(|inside| !inside.starts_with('.')),
        None => false,
    }
}

/// Why `keep_releases` cannot apply to a `dest`.
pub(crate) const KEEP_RELEASES_NEEDS_VERSION_DIR: &str = "needs a directory per release: a `deploy.dest` with `{version}` as one whole path \
     component, e.g. /srv/web/releases/{version}";

/// Checks the `deploy` fields an environment file sets and a descriptor may override: the
/// plugin's name, `dest` (not empty, known placeholders), `activate` (not empty) and each of
/// `commands` (not empty).
pub(crate) fn validate_deploy_fields(
    doc: &mut Document<'_>,
    plugin: Option<&str>,
    dest: Option<&str>,
    activate: Option<&str>,
    commands: &[String],
) {
    if let Some(plugin) = plugin
        && let Err(e) = rules::name(plugin)
    {
        doc.issue("deploy.plugin", format!("`{plugin}` {e}"));
    }
    if let Some(dest) = dest {
        if dest.trim().is_empty() {
            doc.issue(
                "deploy.dest",
                "is empty; write the directory on the targets, or remove it",
            );
        } else if let Err(e) = rules::placeholders(dest, DEST_PLACEHOLDERS) {
            doc.issue("deploy.dest", e);
        }
    }
    if let Some(activate) = activate
        && activate.trim().is_empty()
    {
        doc.issue(
            "deploy.activate",
            "is empty; write the command to run, or remove it",
        );
    }
    for (i, command) in commands.iter().enumerate() {
        if command.trim().is_empty() {
            doc.issue(
                format!("deploy.commands[{i}]"),
                "is empty; write a command or remove the entry",
            );
        }
    }
}

fn validate_rollout(doc: &mut Document<'_>, env: &EnvironmentFile) {
    let rollout = &env.rollout;
    if rollout.max_parallel == 0 {
        doc.issue(
            "rollout.max_parallel",
            "is 0; write how many targets are deployed at once (1 or more)",
        );
    }
    match &rollout.waves {
        Waves::All => {}
        Waves::ByRegion | Waves::ByAz => {
            let (field, kind) = if rollout.waves == Waves::ByRegion {
                ("region", "by_region")
            } else {
                ("az", "by_az")
            };
            for (i, target) in env.targets.iter().enumerate() {
                let value = if field == "region" {
                    &target.region
                } else {
                    &target.az
                };
                if value.is_none() {
                    doc.issue(
                        format!("targets[{i}]"),
                        format!(
                            "target `{}` has no {field}, but rollout.waves is {kind}; add its \
                             {field}",
                            target.name
                        ),
                    );
                }
            }
        }
        Waves::Explicit(waves) => {
            if waves.is_empty() {
                doc.issue("rollout.waves", format!("is an empty list; {WAVES_HINT}"));
            }
            let known: BTreeSet<&str> = env.targets.iter().map(|t| t.name.as_str()).collect();
            let mut seen = BTreeSet::new();
            for (w, wave) in waves.iter().enumerate() {
                if wave.is_empty() {
                    doc.issue(
                        format!("rollout.waves[{w}]"),
                        "is an empty wave; list its target names or remove it",
                    );
                }
                for (n, name) in wave.iter().enumerate() {
                    let field = format!("rollout.waves[{w}][{n}]");
                    if !known.contains(name.as_str()) {
                        doc.issue(
                            field,
                            format!(
                                "`{name}` is not a target of this environment; use a name from \
                                 targets"
                            ),
                        );
                    } else if !seen.insert(name.as_str()) {
                        doc.issue(
                            field,
                            format!("target `{name}` is already in a wave; list it only once"),
                        );
                    }
                }
            }
            let missing: Vec<&str> = env
                .targets
                .iter()
                .map(|t| t.name.as_str())
                .filter(|name| !seen.contains(name))
                .collect();
            if !waves.is_empty() && !missing.is_empty() {
                doc.issue(
                    "rollout.waves",
                    format!(
                        "target(s) {} are in no wave; add each to a wave (every target must be \
                         listed)",
                        missing
                            .iter()
                            .map(|n| format!("`{n}`"))
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                );
            }
        }
    }
}

fn validate_checks(doc: &mut Document<'_>, checks: &[Check]) {
    let mut names = BTreeSet::new();
    for (i, check) in checks.iter().enumerate() {
        let at = |field: &str| format!("checks[{i}].{field}");
        if let Some(name) = &check.name {
            if name.trim().is_empty() {
                doc.issue(at("name"), "is empty; name the check or remove the field");
            } else if !names.insert(name.as_str()) {
                doc.issue(
                    at("name"),
                    format!("`{name}` is the name of an earlier check; check names must be unique"),
                );
            }
        }
        match &check.kind {
            CheckKind::Http { url, expect_status } => {
                if !(url.starts_with("http://") || url.starts_with("https://")) {
                    doc.issue(
                        at("url"),
                        format!("`{url}` must start with http:// or https://"),
                    );
                } else if let Err(e) = rules::placeholders(url, CHECK_PLACEHOLDERS) {
                    doc.issue(at("url"), e);
                }
                if !(100..=599).contains(expect_status) {
                    doc.issue(
                        at("expect_status"),
                        format!("{expect_status} is not an HTTP status; write one from 100 to 599"),
                    );
                }
            }
            CheckKind::Tcp { host, port } => {
                if host.trim().is_empty() {
                    doc.issue(at("host"), "is empty; write a host, {host} or {target}");
                } else if let Err(e) = rules::placeholders(host, CHECK_PLACEHOLDERS) {
                    doc.issue(at("host"), e);
                }
                if *port == 0 {
                    doc.issue(at("port"), "is 0; write the port to connect to");
                }
            }
            CheckKind::Command {
                command,
                expect_exit,
            } => {
                if command.trim().is_empty() {
                    doc.issue(at("command"), "is empty; write the command to run");
                }
                if !(0..=255).contains(expect_exit) {
                    doc.issue(
                        at("expect_exit"),
                        format!("{expect_exit} is not an exit code; write one from 0 to 255"),
                    );
                }
            }
        }
        if check.timeout.is_zero() {
            doc.issue(at("timeout"), "is 0; write a limit such as 10s");
        }
    }
}

fn validate_approval(doc: &mut Document<'_>, approval: &Approval) {
    if approval.count == 0 {
        doc.issue(
            "approval.count",
            "is 0; write how many approvals are needed (1 or more), or required: false",
        );
    }
    let mut seen = BTreeSet::new();
    for (i, approver) in approval.approvers.iter().enumerate() {
        if approver.trim().is_empty() {
            doc.issue(
                format!("approval.approvers[{i}]"),
                "is empty; write a name or remove the entry",
            );
        } else if !seen.insert(approver.as_str()) {
            doc.issue(
                format!("approval.approvers[{i}]"),
                format!("`{approver}` is listed twice; keep one entry"),
            );
        }
    }
    if !approval.approvers.is_empty() && approval.count as usize > approval.approvers.len() {
        doc.issue(
            "approval.count",
            format!(
                "needs {} approvals but only {} approver(s) are listed; lower count or add \
                 approvers",
                approval.count,
                approval.approvers.len()
            ),
        );
    }
    if approval.timeout.is_some_and(|t| t.is_zero()) {
        doc.issue(
            "approval.timeout",
            "is 0; write how long to wait, e.g. 24h, or remove it to wait forever",
        );
    }
}

/// Checks a `depends_on` list at `field`: valid names, no entry twice, and (when `own` is
/// given) no dependency of the deploy on its own application and environment.
pub(crate) fn validate_dependencies(
    doc: &mut Document<'_>,
    field: &str,
    dependencies: &[Dependency],
    own: Option<(&str, &str)>,
) {
    let mut seen = BTreeSet::new();
    for (i, dep) in dependencies.iter().enumerate() {
        let at = format!("{field}[{i}]");
        let mut ok = true;
        if let Err(e) = rules::application(&dep.application) {
            doc.issue(
                format!("{at}.application"),
                format!("`{}` {e}", dep.application),
            );
            ok = false;
        }
        if let Err(e) = rules::name(&dep.environment) {
            doc.issue(
                format!("{at}.environment"),
                format!("`{}` {e}", dep.environment),
            );
            ok = false;
        }
        if let Some(version) = &dep.version
            && version.trim().is_empty()
        {
            doc.issue(
                format!("{at}.version"),
                "is empty; write the version required, or remove it",
            );
        }
        if !ok {
            continue;
        }
        if own == Some(dep.key()) {
            doc.issue(
                at,
                format!(
                    "{}/{} depends on itself; remove this entry",
                    dep.application, dep.environment
                ),
            );
        } else if !seen.insert(dep.key()) {
            doc.issue(
                at,
                format!(
                    "{}/{} is listed twice; keep one entry",
                    dep.application, dep.environment
                ),
            );
        }
    }
}
