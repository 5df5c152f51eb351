//! Owns manent's deploy model as data: descriptors (what users submit), environment files
//! (`<source>/<tenant>/<app>/<env>.yml`), the effective descriptor (what a deploy does),
//! waves, and the routing decision made at submission. No SQL, HTTP, SSH or engine here.
//!
//! ```
//! use manent_model::{parse_descriptor, parse_environment, plan_waves, route, EffectiveDescriptor};
//! let sha = "0".repeat(64);
//! let descriptor = parse_descriptor(
//!     &format!("application: ml/trainer\nenvironment: prod\nartifacts:\n  - {{name: model, \
//!               type: tarball, version: \"1.2\", url: \"file:///srv/model.tgz\", sha256: \"{sha}\"}}\n"),
//!     "deploy.yml",
//! )?;
//! let env = parse_environment(
//!     "targets: [{name: web-1, host: local}]\ndeploy: {dest: \"/opt/{application}/{version}\"}\n",
//!     "prod.yml", "ml/trainer", "prod",
//! )?;
//! let config = manent_config::Config::from_yaml_str("{}", "manent.yml", std::iter::empty()).unwrap();
//! assert_eq!(route(&config, &descriptor, Ok(&env)).queue, "default", "the default queue");
//! let eff = EffectiveDescriptor::build(&descriptor, &env)?;
//! assert_eq!(eff.dest_for(&eff.targets[0]).unwrap(), "/opt/ml/trainer/1.2", "the destination with its placeholders filled");
//! assert_eq!(plan_waves(&eff).len(), 1, "one wave");
//! # Ok::<(), manent_model::ModelError>(())
//! ```

mod descriptor;
mod effective;
mod environment;
mod error;
mod routing;
mod rules;
mod salvage;
mod serde_util;
mod source;
mod waves;

pub use descriptor::{Artifact, DeployOverrides, Descriptor, Missed, Schedule, parse_descriptor};
pub use effective::{EffectiveDescriptor, Releases, RenderedTemplate, expand_dest, releases_root};
pub use environment::load::{
    MissingEnvironment, environment_path, list_applications, load_environment, missing_environment,
};
pub use environment::scoped::{
    EffectiveVariable, ScopedVariables, VariableMatch, VariableSource, VariableValues,
};
pub use environment::templates::{
    FileMode, MANENT_VALUES, MAX_RENDERED_BYTES, MAX_TEMPLATE_BYTES, MAX_TEMPLATES_BYTES, Template,
    TemplateError, TemplateFile, artifact_variable,
};
pub use environment::{
    ANALYSIS_PLACEHOLDERS, Analysis, DEFAULT_INCONCLUSIVE_LIMIT, HttpValue, Metric, MetricCommand,
    PrometheusQuery, Provider, RunOn, condition_problem, evaluate,
};
pub use environment::{
    Approval, Check, CheckKind, DEFAULT_OVERRIDES, DEFAULT_TASK_TIMEOUT, Dependency,
    DeploySettings, DriftSettings, EnvironmentFile, InheritEnv, MIN_DRIFT_EVERY, OVERRIDABLE_KEYS,
    OnFailure, ReleaseMode, RollbackPolicy, Rollout, SecretSource, SharedPaths, SshSettings,
    Target, Task, TaskWhen, VerifyBy, Waves, has_role, parse_environment, parse_environment_in,
};
pub use environment::{
    CONTAINER_NAME_PLACEHOLDERS, CONTAINER_PLUGIN, ContainerHealth, ContainerRuntime,
    ContainerSettings, IMAGE_ARTIFACT, PROXY_LISTEN_PLACEHOLDERS, ProxySettings, ProxyState,
    RunningContainer, container_base, container_name, image_reference,
};
pub use error::{EnvironmentsSourceUnreadable, Issue, ModelError};
pub use routing::{
    DEFAULT_QUEUE, QueueKind, Route, partition_key, queue_kinds, region_queue, route,
};
pub use waves::{Wave, plan_waves};

/// The host name of a target that is the worker's own machine.
pub const LOCAL_HOST: &str = "local";
/// The plugin used when neither the environment file nor the descriptor names one.
pub const DEFAULT_PLUGIN: &str = "remote-copy";
/// The built-in plugin that runs `deploy.commands` on the targets.
pub const COMMAND_PLUGIN: &str = "command";
/// The placeholders allowed in `deploy.dest`.
pub const DEST_PLACEHOLDERS: &[&str] = &["version", "target", "application", "environment"];
/// The placeholders allowed in a check's `url` and `host` (and expanded in `command`).
pub const CHECK_PLACEHOLDERS: &[&str] = &["target", "host"];

/// The tenant of a `tenant/app` application name (the whole name when it has no `/`).
pub fn tenant_of(application: &str) -> &str {
    application
        .split_once('/')
        .map_or(application, |(tenant, _)| tenant)
}
