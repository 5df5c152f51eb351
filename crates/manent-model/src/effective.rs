//! Owns the effective descriptor: the environment configuration with the descriptor's
//! overrides applied, i.e. what a deploy actually does, recorded with the deploy; and the
//! expansion of `dest` templates.

use serde::{Deserialize, Serialize};

use crate::descriptor::{Artifact, Descriptor, Schedule};
use crate::environment::{
    Approval, Check, Dependency, EnvironmentFile, RollbackPolicy, Rollout, SshSettings, Target,
};
use crate::error::ModelError;
use crate::{COMMAND_PLUGIN, DEFAULT_PLUGIN, rules};

/// What a deploy does: environment configuration + descriptor overrides.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EffectiveDescriptor {
    /// `tenant/app`.
    pub application: String,
    /// The tenant part of `application`.
    pub tenant: String,
    /// The app part of `application`.
    pub app: String,
    /// The environment.
    pub environment: String,
    /// The deploy's version: the first artifact's (`{version}`, `MANENT_VERSION`).
    pub version: String,
    /// The artifacts, as submitted.
    pub artifacts: Vec<Artifact>,
    /// The plugin that deploys.
    pub plugin: String,
    /// Where artifacts go on each target (a template; see [`EffectiveDescriptor::dest_for`]).
    pub dest: Option<String>,
    /// Command run on each target after the artifacts are in place.
    pub activate: Option<String>,
    /// Commands of the `command` plugin, in order.
    pub commands: Vec<String>,
    /// Free plugin parameters.
    pub params: Option<serde_json::Value>,
    /// `deploy.keep_releases` (see [`EffectiveDescriptor::releases_for`]). Absent from the
    /// records of deploys without it, as from those of releases before it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keep_releases: Option<u32>,
    /// Set by the deploy workflow for a fast rollback, never by a file: a target whose
    /// release directory still holds the verified artifacts is reactivated without an
    /// upload. Left out when false.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub reuse_releases: bool,
    /// Set by the deploy workflow for a reconcile, never by a file (docs/plan-and-drift.md,
    /// "Reconcile"): per target, the files the drift check found added to its release,
    /// removed once the release is live and checked again. Left out when empty.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub remove_added: std::collections::BTreeMap<String, Vec<String>>,
    /// `deploy.shared` (see [`EffectiveDescriptor::shared_for`]). Absent when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shared: Option<crate::SharedPaths>,
    /// `deploy.tasks` (docs/environments.md, "Tasks and roles"). Absent from the records of
    /// deploys without them, as from those of releases before them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tasks: Vec<crate::Task>,
    /// `deploy.mode`: the mode of the release directories. Absent when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<crate::ReleaseMode>,
    /// The targets.
    pub targets: Vec<Target>,
    /// How to reach the targets.
    pub ssh: SshSettings,
    /// Waves, parallelism, pause.
    pub rollout: Rollout,
    /// Checks run on each target after it is deployed.
    pub checks: Vec<Check>,
    /// The approval policy, if any.
    pub approval: Option<Approval>,
    /// The environment file's dependencies, then the descriptor's, one entry per
    /// application and environment.
    pub depends_on: Vec<Dependency>,
    /// What to do when the deploy fails.
    pub rollback: RollbackPolicy,
    /// Secrets the commands get as variables: where to read them, never their values.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub secrets: std::collections::BTreeMap<String, crate::SecretSource>,
    /// The environment file's `inherit_env`: the worker's variables a `host: local` command
    /// gets. Absent from the records of deploys without it, as from those of releases
    /// before it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub inherit_env: crate::InheritEnv,
    /// Plan instead of act.
    pub dry_run: bool,
    /// When to deploy, if scheduled.
    pub schedule: Option<Schedule>,
    /// The descriptor's `irreversible` reason. Absent from the records of deploys without
    /// it, as from those of releases before it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub irreversible: Option<String>,
    /// The environment file's `variables` (see [`EffectiveDescriptor::variables_for`]).
    /// This and the next three are absent from the records of deploys without them, as from
    /// those of releases before them.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub variables: crate::VariableValues,
    /// The environment file's `scoped_variables`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub scoped_variables: Vec<crate::ScopedVariables>,
    /// The descriptor's `deploy.variables`, over all the others.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub descriptor_variables: crate::VariableValues,
    /// The environment file's `templates`, with their sources' text (not secret).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub templates: Vec<crate::Template>,
    /// `deploy.container` (docs/containers.md). Absent when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container: Option<crate::ContainerSettings>,
    /// `deploy.proxy` (docs/containers.md). Absent when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proxy: Option<crate::ProxySettings>,
}

impl EffectiveDescriptor {
    /// Applies `descriptor`'s overrides to `env` (both already validated). Each `deploy:` field
    /// the descriptor sets wins; `params` mappings are merged key by key (the descriptor's
    /// keys win) when the plugin stays the environment's, and the environment's `params` are
    /// dropped when the descriptor picks another plugin (they were meant for that plugin).
    /// Refused: `remote-copy` without `dest`, `command` without commands.
    pub fn build(descriptor: &Descriptor, env: &EnvironmentFile) -> Result<Self, ModelError> {
        let overrides = descriptor.deploy.clone().unwrap_or_default();
        refuse_unallowed_overrides(descriptor, &overrides, env)?;
        refuse_secret_variables(descriptor, &overrides, env)?;
        let plugin = overrides
            .plugin
            .clone()
            .unwrap_or_else(|| env.deploy.plugin.clone());
        let env_params = if plugin == env.deploy.plugin {
            env.deploy.params.clone()
        } else {
            None
        };
        let params = match (env_params, overrides.params) {
            (Some(serde_json::Value::Object(mut base)), Some(serde_json::Value::Object(over))) => {
                base.extend(over);
                Some(serde_json::Value::Object(base))
            }
            (base, over) => over.or(base),
        };
        let (tenant, app) = descriptor
            .application
            .split_once('/')
            .unwrap_or(("", descriptor.application.as_str()));
        let mut effective = EffectiveDescriptor {
            application: descriptor.application.clone(),
            tenant: tenant.to_owned(),
            app: app.to_owned(),
            environment: descriptor.environment.clone(),
            version: descriptor
                .artifacts
                .first()
                .map(|a| a.version.clone())
                .unwrap_or_default(),
            artifacts: descriptor.artifacts.clone(),
            plugin,
            dest: overrides.dest.or_else(|| env.deploy.dest.clone()),
            activate: overrides.activate.or_else(|| env.deploy.activate.clone()),
            commands: overrides
                .commands
                .unwrap_or_else(|| env.deploy.commands.clone()),
            params,
            keep_releases: env.deploy.keep_releases,
            reuse_releases: false,
            remove_added: Default::default(),
            shared: env.deploy.shared.clone(),
            tasks: env.deploy.tasks.clone(),
            mode: env.deploy.mode,
            targets: env.targets.clone(),
            ssh: env.ssh.clone(),
            rollout: env.rollout.clone(),
            checks: env.checks.clone(),
            approval: env.approval.clone(),
            depends_on: merge_dependencies(&env.depends_on, &descriptor.depends_on),
            rollback: env.rollback.clone(),
            secrets: env.secrets.clone(),
            inherit_env: env.inherit_env.clone(),
            dry_run: descriptor.dry_run,
            schedule: descriptor.schedule.clone(),
            irreversible: descriptor.irreversible.clone(),
            variables: env.variables.clone(),
            scoped_variables: env.scoped_variables.clone(),
            descriptor_variables: overrides.variables.clone().unwrap_or_default(),
            templates: loaded_templates(descriptor, env)?,
            container: env.deploy.container.clone(),
            proxy: env.deploy.proxy.clone(),
        };
        effective.depends_on = promotion_safe(
            std::mem::take(&mut effective.depends_on),
            &effective.application,
            &effective.environment,
            &effective.version,
        );
        effective.check()?;
        Ok(effective)
    }

    fn check(&self) -> Result<(), ModelError> {
        let refuse = |field: &str, message: String| ModelError::EffectiveInvalid {
            application: self.application.clone(),
            environment: self.environment.clone(),
            field: field.to_owned(),
            message,
        };
        if self.artifacts.is_empty() {
            return Err(refuse(
                "artifacts",
                "no artifact to deploy; add one".to_owned(),
            ));
        }
        if self.targets.is_empty() {
            return Err(refuse(
                "targets",
                "the environment has no targets; add them to its environment file".to_owned(),
            ));
        }
        if self.plugin == DEFAULT_PLUGIN && self.dest.is_none() {
            return Err(refuse(
                "deploy.dest",
                format!(
                    "{DEFAULT_PLUGIN} needs a destination directory; set deploy.dest in the \
                     environment file or the descriptor"
                ),
            ));
        }
        if self.shared.is_some() && self.plugin != DEFAULT_PLUGIN {
            return Err(refuse(
                "deploy.plugin",
                format!(
                    "the environment shares paths between releases (deploy.shared), which only \
                     the {DEFAULT_PLUGIN} plugin links; deploy with {DEFAULT_PLUGIN}"
                ),
            ));
        }
        if self.keep_releases.is_some() {
            if self.plugin != DEFAULT_PLUGIN {
                return Err(refuse(
                    "deploy.plugin",
                    format!(
                        "the environment keeps releases (deploy.keep_releases), which only \
                         the {DEFAULT_PLUGIN} plugin makes; deploy with {DEFAULT_PLUGIN}"
                    ),
                ));
            }
            if self.dest.as_deref().and_then(releases_root).is_none() {
                return Err(refuse(
                    "deploy.dest",
                    format!(
                        "the environment keeps releases (deploy.keep_releases), which {}",
                        crate::environment::KEEP_RELEASES_NEEDS_VERSION_DIR
                    ),
                ));
            }
        }
        if !self.tasks.is_empty()
            && ![DEFAULT_PLUGIN, COMMAND_PLUGIN].contains(&self.plugin.as_str())
        {
            return Err(refuse(
                "deploy.plugin",
                format!(
                    "the environment has deploy.tasks, which run under the built-in plugins \
                     ({DEFAULT_PLUGIN}, {COMMAND_PLUGIN}) only; deploy with one of them"
                ),
            ));
        }
        self.check_templates()?;
        self.check_container()?;
        if self.plugin == COMMAND_PLUGIN && self.commands.is_empty() {
            return Err(refuse(
                "deploy.commands",
                format!(
                    "the {COMMAND_PLUGIN} plugin needs commands to run; set deploy.commands in \
                     the environment file or the descriptor"
                ),
            ));
        }
        Ok(())
    }

    /// The `container` plugin deploys one image (an artifact of type `image`) with the
    /// environment's `deploy.container` and `deploy.proxy` (docs/containers.md).
    fn check_container(&self) -> Result<(), ModelError> {
        if self.plugin != crate::CONTAINER_PLUGIN {
            // Only the container plugin has a target pull an image by `ref`.
            return match self.artifacts.iter().find(|a| a.reference.is_some()) {
                Some(a) => Err(ModelError::EffectiveInvalid {
                    application: self.application.clone(),
                    environment: self.environment.clone(),
                    field: "artifacts".to_owned(),
                    message: format!(
                        "`{}` is an image pulled by `ref`, which only the {} plugin deploys \
                         (plugin here: {}); give it a `url` and `sha256` instead",
                        a.name,
                        crate::CONTAINER_PLUGIN,
                        self.plugin
                    ),
                }),
                None => Ok(()),
            };
        }
        let refuse = |field: &str, message: String| ModelError::EffectiveInvalid {
            application: self.application.clone(),
            environment: self.environment.clone(),
            field: field.to_owned(),
            message,
        };
        if self.container.is_none() || self.proxy.is_none() {
            return Err(refuse(
                "deploy.container",
                "the container plugin needs deploy.container and deploy.proxy in the \
                 environment file (docs/containers.md)"
                    .to_owned(),
            ));
        }
        let images = self
            .artifacts
            .iter()
            .filter(|a| a.artifact_type == crate::IMAGE_ARTIFACT)
            .count();
        if images != 1 || self.artifacts.len() != 1 {
            return Err(refuse(
                "artifacts",
                format!(
                    "the container plugin deploys exactly one artifact of type `{}` (an image \
                     archive as `podman save` writes it); this deploy has {} artifact(s), {images} \
                     of them images",
                    crate::IMAGE_ARTIFACT,
                    self.artifacts.len()
                ),
            ));
        }
        Ok(())
    }

    /// Templates are written by `remote-copy` and `command`, a relative `dest` into the
    /// release directory (which must then be set, and not hold an artifact of that name),
    /// and every name a template uses must be a variable, a secret or a `MANENT_*` value of
    /// each target (docs/environments.md, "Templates").
    fn check_templates(&self) -> Result<(), ModelError> {
        let refuse = |field: String, message: String| ModelError::EffectiveInvalid {
            application: self.application.clone(),
            environment: self.environment.clone(),
            field,
            message,
        };
        if self.templates.is_empty() {
            return Ok(());
        }
        if self.plugin != DEFAULT_PLUGIN && self.plugin != COMMAND_PLUGIN {
            return Err(refuse(
                "deploy.plugin".to_owned(),
                format!(
                    "the environment renders templates, which only the {DEFAULT_PLUGIN} and \
                     {COMMAND_PLUGIN} plugins write; deploy with one of them"
                ),
            ));
        }
        for (i, template) in self.templates.iter().enumerate() {
            if template.dest.starts_with('/') {
                continue;
            }
            if self.dest.is_none() {
                return Err(refuse(
                    format!("templates[{i}].dest"),
                    format!(
                        "`{}` is relative to the release directory, and this deploy has none; \
                         set deploy.dest, or write an absolute dest",
                        template.dest
                    ),
                ));
            }
            if self.artifact_names().any(|name| name == template.dest) {
                return Err(refuse(
                    format!("templates[{i}].dest"),
                    format!(
                        "`{}` is also the name of an artifact of this deploy; write the \
                         template elsewhere in the release",
                        template.dest
                    ),
                ));
            }
        }
        let artifacts: Vec<String> = self.artifact_names().map(str::to_owned).collect();
        let known_for = |target: &Target| -> std::collections::BTreeSet<String> {
            self.variables_for(target)
                .into_iter()
                .map(|v| v.name)
                .chain(self.secrets.keys().cloned())
                .collect()
        };
        match crate::environment::templates::first_unknown(
            &self.templates,
            &self.targets,
            known_for,
            Some(&artifacts),
        ) {
            Some((i, error)) => Err(refuse(format!("templates[{i}]"), error.to_string())),
            None => Ok(()),
        }
    }

    /// The effective value of each variable for `target`, with where it came from: the
    /// environment file's `variables`, its `scoped_variables` (the most specific wins), then
    /// the descriptor's `deploy.variables`. Sorted by name.
    pub fn variables_for(&self, target: &Target) -> Vec<crate::EffectiveVariable> {
        crate::environment::scoped::resolve(
            &self.variables,
            &self.scoped_variables,
            &self.descriptor_variables,
            target,
        )
    }

    /// Each template rendered for `target` with `values` (its variables, secrets and
    /// `MANENT_*` values, by name): where it goes on the target (a relative `dest` under the
    /// release directory), its mode and its bytes. What a deploy writes, and what a plan
    /// compares.
    pub fn templates_for(
        &self,
        target: &Target,
        values: &std::collections::BTreeMap<String, String>,
    ) -> Result<Vec<RenderedTemplate>, crate::TemplateError> {
        let release = self.dest_for(target);
        self.templates
            .iter()
            .map(|template| {
                let path = match (&release, template.dest.starts_with('/')) {
                    (_, true) | (None, _) => template.dest.clone(),
                    (Some(release), false) => {
                        format!("{}/{}", release.trim_end_matches('/'), template.dest)
                    }
                };
                Ok(RenderedTemplate {
                    src: template.src.clone(),
                    path,
                    mode: template.mode,
                    bytes: template.render(values)?,
                })
            })
            .collect()
    }

    /// `dest` expanded for `target`, if a `dest` is set.
    pub fn dest_for(&self, target: &Target) -> Option<String> {
        self.dest.as_deref().map(|template| {
            expand_dest(
                template,
                &self.version,
                &target.name,
                &self.application,
                &self.environment,
            )
        })
    }

    /// The directory holding `target`'s releases (the part of `dest` above the version),
    /// expanded; `None` when `dest` does not name `{version}` in a directory of its own.
    pub fn releases_root_for(&self, target: &Target) -> Option<String> {
        let root = self.dest.as_deref().and_then(releases_root)?;
        Some(expand_dest(
            &root,
            &self.version,
            &target.name,
            &self.application,
            &self.environment,
        ))
    }

    /// `deploy.shared` on `target`: its directory expanded, and the paths, if set.
    pub fn shared_for(&self, target: &Target) -> Option<(String, Vec<String>)> {
        let shared = self.shared.as_ref()?;
        let dir = expand_dest(
            &shared.dir,
            &self.version,
            &target.name,
            &self.application,
            &self.environment,
        );
        Some((dir, shared.paths.clone()))
    }

    /// Where `deploy.keep_releases` prunes on `target`, if the environment keeps releases.
    pub fn releases_for(&self, target: &Target) -> Option<Releases> {
        let keep = self.keep_releases?;
        let root = releases_root(self.dest.as_deref()?)?;
        Some(Releases {
            root: expand_dest(
                &root,
                &self.version,
                &target.name,
                &self.application,
                &self.environment,
            ),
            current: self.version.clone(),
            keep,
        })
    }

    /// `command` (an `activate` or a `commands` entry) as it runs on `target`: `{version}`,
    /// `{target}`, `{application}` and `{environment}` replaced by their values, each
    /// passed through `quote` (one shell word) first. A version is a deployer's text: it
    /// must reach the target's shell as data, never as code (docs/environments.md,
    /// "Placeholders in commands"). Other braces (`${HOME}`, `{a,b}`) are kept as written.
    pub fn command_for(
        &self,
        command: &str,
        target: &Target,
        quote: impl Fn(&str) -> String,
    ) -> String {
        rules::expand(
            command,
            &[
                ("version", &quote(&self.version)),
                ("target", &quote(&target.name)),
                ("application", &quote(&self.application)),
                ("environment", &quote(&self.environment)),
            ],
        )
    }

    /// The SSH user for `target`: its own `user`, else `ssh.user`.
    pub fn ssh_user_for<'a>(&'a self, target: &'a Target) -> Option<&'a str> {
        target.user.as_deref().or(self.ssh.user.as_deref())
    }

    /// The artifact names, in order.
    pub fn artifact_names(&self) -> impl Iterator<Item = &str> + Clone {
        self.artifacts.iter().map(|a| a.name.as_str())
    }

    /// The `<application>/<environment>` partition of the queue.
    pub fn partition_key(&self) -> String {
        crate::partition_key(&self.application, &self.environment)
    }
}

/// A template rendered for one target.
#[derive(Clone, PartialEq, Eq)]
pub struct RenderedTemplate {
    /// The template's `src`, for messages.
    pub src: String,
    /// Where it goes on the target: absolute, or under the release directory.
    pub path: String,
    /// Its permission bits.
    pub mode: crate::FileMode,
    /// Its content, which may hold secrets: never shown, never recorded.
    pub bytes: Vec<u8>,
}

impl std::fmt::Debug for RenderedTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RenderedTemplate")
            .field("src", &self.src)
            .field("path", &self.path)
            .field("mode", &self.mode)
            .field("bytes", &self.bytes.len())
            .finish()
    }
}

/// The templates of `env` with their sources' text; one whose source was not read (the
/// file was parsed without its directory) is refused.
fn loaded_templates(
    descriptor: &Descriptor,
    env: &EnvironmentFile,
) -> Result<Vec<crate::Template>, ModelError> {
    env.templates
        .iter()
        .enumerate()
        .map(|(i, template)| {
            template
                .loaded()
                .ok_or_else(|| ModelError::EffectiveInvalid {
                    application: descriptor.application.clone(),
                    environment: descriptor.environment.clone(),
                    field: format!("templates[{i}].src"),
                    message: format!(
                        "the source of `{}` was not read with the environment file; read the file \
                     with its directory",
                        template.src
                    ),
                })
        })
        .collect()
}

/// Refuses a descriptor variable that is also a secret of the environment: the secret
/// would be replaced by a deployer's value.
fn refuse_secret_variables(
    descriptor: &Descriptor,
    overrides: &crate::descriptor::DeployOverrides,
    env: &EnvironmentFile,
) -> Result<(), ModelError> {
    let Some(name) = overrides
        .variables
        .iter()
        .flat_map(|v| v.keys())
        .find(|name| env.secrets.contains_key(*name) || env.inherit_env.contains(*name))
    else {
        return Ok(());
    };
    Err(ModelError::EffectiveInvalid {
        application: descriptor.application.clone(),
        environment: descriptor.environment.clone(),
        field: format!("deploy.variables.{name}"),
        message: format!(
            "`{name}` is a secret (or an inherited variable) of the environment file, which a \
             descriptor cannot set; rename the variable"
        ),
    })
}

/// `version: any` in a dependency: met by a success at any version.
pub const ANY_VERSION: &str = "any";

/// Resolves what each dependency waits for. One on another environment of the same
/// application is a promotion: without a version it waits for that environment's
/// success at this deploy's version (prod gets 1.1 only after staging ran 1.1), not
/// for any earlier success. `version: any` opts out, for any dependency.
fn promotion_safe(
    deps: Vec<Dependency>,
    application: &str,
    environment: &str,
    version: &str,
) -> Vec<Dependency> {
    deps.into_iter()
        .map(|mut dep| {
            match dep.version.as_deref() {
                Some(ANY_VERSION) => dep.version = None,
                None if dep.application == application && dep.environment != environment => {
                    dep.version = Some(version.to_string());
                }
                _ => {}
            }
            dep
        })
        .collect()
}

/// The environment file's dependencies, then the descriptor's not already listed; for one
/// listed by both, the descriptor's `version` and `timeout` win where it sets them.
fn merge_dependencies(env: &[Dependency], descriptor: &[Dependency]) -> Vec<Dependency> {
    let mut merged: Vec<Dependency> = Vec::with_capacity(env.len() + descriptor.len());
    for dep in env.iter().chain(descriptor) {
        match merged.iter_mut().find(|d| d.key() == dep.key()) {
            Some(existing) => {
                if dep.version.is_some() {
                    existing.version.clone_from(&dep.version);
                }
                if dep.timeout.is_some() {
                    existing.timeout = dep.timeout;
                }
            }
            None => merged.push(dep.clone()),
        }
    }
    merged
}

/// Expands `{version}`, `{target}`, `{application}` (`tenant/app`) and `{environment}` in a
/// `dest` template; other text, unknown placeholders included, is kept as written.
/// The release directories of one target under `deploy.keep_releases`: `root` holds one
/// directory per version, `current` the one this deploy made live.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Releases {
    /// The directory holding the releases (`dest` up to its `{version}` component,
    /// expanded).
    pub root: String,
    /// The name of this deploy's release directory in `root`: its version.
    pub current: String,
    /// How many release directories stay, `current` among them.
    pub keep: u32,
}

/// The template of the directory holding a `dest`'s release directories: `dest` up to its
/// component that is exactly `{version}` (`/srv/web/releases/{version}/app` →
/// `/srv/web/releases`); none without such a component, or when it is the first.
pub fn releases_root(dest: &str) -> Option<String> {
    let components: Vec<&str> = dest.split('/').collect();
    let at = components.iter().position(|c| *c == "{version}")?;
    let root = components[..at].join("/");
    let root = root.trim_end_matches('/');
    if root.is_empty() || root.contains("{version}") {
        return None;
    }
    Some(root.to_string())
}

pub fn expand_dest(
    template: &str,
    version: &str,
    target: &str,
    application: &str,
    environment: &str,
) -> String {
    rules::expand(
        template,
        &[
            ("version", version),
            ("target", target),
            ("application", application),
            ("environment", environment),
        ],
    )
}

/// The `deploy:` keys a descriptor sets, in [`crate::OVERRIDABLE_KEYS`] order.
fn set_override_keys(o: &crate::descriptor::DeployOverrides) -> Vec<&'static str> {
    let set = [
        o.plugin.is_some(),
        o.dest.is_some(),
        o.activate.is_some(),
        o.commands.is_some(),
        o.params.is_some(),
        o.variables.is_some(),
    ];
    crate::OVERRIDABLE_KEYS
        .iter()
        .zip(set)
        .filter_map(|(key, set)| set.then_some(*key))
        .collect()
}

/// Refuses a descriptor that sets a `deploy:` key its environment file does not list in
/// `overrides:`, naming the first such key.
fn refuse_unallowed_overrides(
    descriptor: &Descriptor,
    overrides: &crate::descriptor::DeployOverrides,
    env: &EnvironmentFile,
) -> Result<(), ModelError> {
    let Some(key) = set_override_keys(overrides)
        .into_iter()
        .find(|key| !env.allows_override(key))
    else {
        return Ok(());
    };
    let allowed = match &env.overrides {
        Some(keys) if keys.is_empty() => "no deploy: key".to_owned(),
        Some(keys) => keys.join(", "),
        None => crate::DEFAULT_OVERRIDES.join(", "),
    };
    Err(ModelError::EffectiveInvalid {
        application: descriptor.application.clone(),
        environment: descriptor.environment.clone(),
        field: format!("deploy.{key}"),
        message: format!(
            "the environment file lets a descriptor set only {allowed} (its overrides: list); \
             remove deploy.{key} from the descriptor, or ask an operator to add `{key}` to \
             overrides: in the environment file"
        ),
    })
}

#[cfg(test)]
mod tests;
