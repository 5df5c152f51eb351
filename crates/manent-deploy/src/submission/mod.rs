//! Submission: a descriptor parsed (off the async threads), checked against its
//! environment file and `manent.yml` (sources, overrides, plugins, dependency cycles),
//! routed and enqueued; and resubmission of a recorded request (`manent rollback`,
//! `manent redeploy`). Nothing is stored before every check passed.
//!
//! The room also holds `approvals`: an approver's decision on a waiting deploy; and
//! `resubmit`: a recorded request submitted again (rollback, redeploy, reconcile).

pub mod approvals;
mod resubmit;

pub use resubmit::{
    Resubmission, Resubmit, ResubmitError, recorded_request, resubmit, resubmit_to, rollback_source,
};

use manent_config::Config;
use manent_engine::{Client, EngineError, WorkflowStatus, now_ms};
use std::sync::Arc;

use manent_model::{
    Descriptor, EffectiveDescriptor, ModelError, Route, load_environment, missing_environment,
    parse_descriptor, route,
};

/// A deploy just submitted, or a schedule just created.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Submitted {
    /// The deploy's id (the schedule's when [`SubmittedStatus::Scheduled`]).
    pub id: String,
    pub status: SubmittedStatus,
    /// The queue it was routed to.
    pub queue: String,
}

/// What a submission made: a deploy, with its status, or a recurring schedule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SubmittedStatus {
    Deploy(WorkflowStatus),
    Scheduled,
}

use crate::history::Origin;
use crate::{
    background::schedules,
    history::ORIGIN_KEY,
    request::{DeployRequest, Submitter},
};

/// Why a submission was refused.
#[derive(Debug, thiserror::Error)]
pub enum SubmitError {
    /// The descriptor is malformed; names the field and line.
    #[error("{message}")]
    Invalid {
        field: Option<String>,
        message: String,
    },
    /// The application or environment has no environment file in a source that can be
    /// read; the message names the field (`application` or `environment`) and the nearest
    /// names. (A source that cannot be read now routes by artifact type instead.)
    #[error("{0}")]
    UnknownEnvironment(String),
    #[error(transparent)]
    Engine(#[from] EngineError),
    /// A task of the submission stopped (a panic): a bug, reported as a server error.
    #[error("{0}")]
    Internal(String),
}

/// Parses a descriptor off the async threads (a hostile body must not stall the process:
/// the text is depth-checked first, then parsed). Nothing is stored; the caller authorises
/// on the parsed `application` before it calls [`submit`].
pub async fn parse(text: String, file_name: String) -> Result<Descriptor, SubmitError> {
    tokio::task::spawn_blocking(move || parse_descriptor(&text, &file_name).map_err(invalid))
        .await
        .map_err(|e| SubmitError::Internal(format!("descriptor parser stopped: {e}")))?
}

/// A descriptor once its environment was read: what [`submit`] enqueues.
#[derive(Debug)]
struct Prepared {
    descriptor: Descriptor,
    route: Route,
    effective: Option<EffectiveDescriptor>,
}

/// Reads the environment file, checks the descriptor against it and against `manent.yml`
/// (artifact sources, allowed overrides, known plugins, dependency cycles) and decides the
/// route. Reads files: run it off the async threads.
fn prepare(
    config: &Config,
    mut descriptor: Descriptor,
    force_dry_run: bool,
) -> Result<Prepared, SubmitError> {
    if force_dry_run {
        descriptor.dry_run = true;
    }
    refuse_unlisted_sources(config, &descriptor)?;
    let source = config.environments_source();
    let env = load_environment(&source, &descriptor.application, &descriptor.environment);
    match &env {
        Ok(_) => {}
        // An application or environment with no file in a source that can be read is a
        // typo or a deploy to nowhere: refused now, naming the nearest names, rather than
        // failing when it runs.
        Err(e) if e.is_environment_unavailable() => {
            if let Some(missing) =
                missing_environment(&source, &descriptor.application, &descriptor.environment)
            {
                return Err(SubmitError::UnknownEnvironment(missing.message));
            }
            // The environment cannot be read at submission (docs/configuration.md,
            // `plugins[].artifact_types`): the deploy is routed by its artifact types and
            // resolves its environment when it runs.
        }
        // An invalid file is refused.
        Err(e) => return Err(invalid(e.clone())),
    }
    let route: Route = route(config, &descriptor, env.as_ref());
    let effective = match &env {
        Ok(env) => Some(EffectiveDescriptor::build(&descriptor, env).map_err(invalid)?),
        Err(_) => None,
    };
    let plugin = match &effective {
        Some(eff) => Some(eff.plugin.as_str()),
        None => descriptor.plugin_override(),
    };
    if let Some(plugin) = plugin {
        refuse_unknown_plugin(config, plugin, effective.is_none())?;
    }
    let dependencies = match &effective {
        Some(eff) => &eff.depends_on,
        None => &descriptor.depends_on,
    };
    refuse_cross_tenant_dependencies(config, &descriptor, dependencies)?;
    if let Some(eff) = &effective {
        refuse_dependency_cycle(config, eff)?;
    }
    Ok(Prepared {
        descriptor,
        route,
        effective,
    })
}

/// Refuses an artifact URL under none of the `artifacts.sources` serving the descriptor's
/// application, naming `artifacts[N].url`.
fn refuse_unlisted_sources(config: &Config, descriptor: &Descriptor) -> Result<(), SubmitError> {
    let sources = config.artifact_sources();
    for (i, artifact) in descriptor.artifacts.iter().enumerate() {
        if let Err(e) = sources.check(&descriptor.application, &artifact.url) {
            let field = format!("artifacts[{i}].url");
            return Err(SubmitError::Invalid {
                message: format!("{field}: `{}` {e}", artifact.url),
                field: Some(field),
            });
        }
    }
    Ok(())
}

/// Refuses a plugin that is neither built in nor declared under `plugins:` in manent.yml:
/// such a deploy could only fail once a worker took it.
fn refuse_unknown_plugin(
    config: &Config,
    plugin: &str,
    from_descriptor: bool,
) -> Result<(), SubmitError> {
    let builtin = [
        manent_model::DEFAULT_PLUGIN,
        manent_model::COMMAND_PLUGIN,
        manent_model::CONTAINER_PLUGIN,
    ];
    if builtin.contains(&plugin) || config.plugins.contains_key(plugin) {
        return Ok(());
    }
    let mut known: Vec<&str> = builtin.to_vec();
    known.extend(config.plugins.keys().map(String::as_str));
    let whose = if from_descriptor {
        "the descriptor"
    } else {
        "the effective descriptor (environment file or descriptor)"
    };
    Err(SubmitError::Invalid {
        field: Some("deploy.plugin".into()),
        message: format!(
            "deploy.plugin: {whose} names plugin `{plugin}`, which this installation does not \
             know; use one of {} or declare it under plugins: in manent.yml",
            known.join(", ")
        ),
    })
}

/// Resolves, routes and enqueues a parsed descriptor ([`parse`]). The route is decided
/// here, once, and recorded in the request.
pub async fn submit(
    client: &Client,
    config: &Arc<Config>,
    descriptor: Descriptor,
    force_dry_run: bool,
    submitted_by: &Submitter,
) -> Result<Submitted, SubmitError> {
    submit_recording(
        client,
        config,
        descriptor,
        force_dry_run,
        submitted_by,
        None,
    )
    .await
}

/// [`submit`], recording `origin` (a rollback's or redeploy's source) with the request.
async fn submit_recording(
    client: &Client,
    config: &Arc<Config>,
    descriptor: Descriptor,
    force_dry_run: bool,
    submitted_by: &Submitter,
    origin: Option<&Origin>,
) -> Result<Submitted, SubmitError> {
    let Prepared {
        descriptor,
        route,
        effective,
    } = {
        let config = Arc::clone(config);
        tokio::task::spawn_blocking(move || prepare(&config, descriptor, force_dry_run))
            .await
            .map_err(|e| SubmitError::Internal(format!("submission check stopped: {e}")))??
    };
    let schedule = descriptor.schedule.clone().unwrap_or_default();
    if let Some(cron) = &schedule.cron {
        let timezone = schedule.timezone.as_deref().unwrap_or("UTC");
        let parsed = schedules::parse_cron(cron).map_err(|message| SubmitError::Invalid {
            field: Some("schedule.cron".into()),
            message: format!("schedule.cron: {message}"),
        })?;
        let tz = schedules::parse_timezone(timezone).map_err(|message| SubmitError::Invalid {
            field: Some("schedule.timezone".into()),
            message: format!("schedule.timezone: {message}"),
        })?;
        refuse_too_frequent(config, cron, &parsed, tz)?;
        refuse_over_tenant_cap(client, config, &descriptor).await?;
        let record = schedules::create(
            client,
            descriptor,
            effective,
            route,
            cron,
            timezone,
            schedule.missed_policy(),
            submitted_by,
        )
        .await?;
        return Ok(Submitted {
            id: record.id,
            status: SubmittedStatus::Scheduled,
            queue: record.route.queue,
        });
    }
    let not_before = not_before(schedule.at.as_deref())?;
    if origin.is_some_and(|o| o.fast)
        && let Some(effective) = &effective
        && effective.plugin != manent_model::DEFAULT_PLUGIN
        // The container plugin starts the kept container again (docs/containers.md).
        && effective.plugin != manent_model::CONTAINER_PLUGIN
    {
        return Err(SubmitError::Invalid {
            field: Some("fast".into()),
            message: format!(
                "a fast rollback reactivates the release directories {} leaves on the \
                 targets; {}/{} deploys with `{}`: roll back without --fast",
                manent_model::DEFAULT_PLUGIN,
                effective.application,
                effective.environment,
                effective.plugin
            ),
        });
    }
    let mut request = DeployRequest::new(descriptor, effective, route, submitted_by, now_ms());
    request.fast = origin.is_some_and(|o| o.fast);
    request.only_targets = origin.map(|o| o.targets.clone()).unwrap_or_default();
    request.remove_added = origin.map(|o| o.remove_added.clone()).unwrap_or_default();
    if let Some(eff) = request
        .effective
        .as_mut()
        .filter(|_| !request.only_targets.is_empty())
    {
        // What status and the page show: the targets it deploys (the workflow filters too,
        // for a request recorded without an effective descriptor).
        eff.targets
            .retain(|t| request.only_targets.contains(&t.name));
    }
    if not_before.is_some() {
        // Its token and its environment's policy are checked again when its time comes.
        request = request.authorised_at_start();
    }
    let mut enqueue = request.enqueue(crate::request::startable_version(client).await?);
    if let (Some(origin), serde_json::Value::Object(input)) = (origin, &mut enqueue.input) {
        // Beside the request in the same recorded input, so it is written with the enqueue
        // or not at all; the workflow reads the request and passes over this key.
        input.insert(
            ORIGIN_KEY.into(),
            serde_json::to_value(origin).map_err(|e| SubmitError::Internal(e.to_string()))?,
        );
    }
    if let Some(at_ms) = not_before {
        // ENQUEUED (phase `scheduled`) until then, then started through the same queue and limits.
        enqueue = enqueue.not_before(at_ms);
    }
    let record = client.enqueue(enqueue).await?;
    Ok(Submitted {
        id: record.id,
        status: SubmittedStatus::Deploy(record.status),
        queue: request.route.queue,
    })
}

/// Refuses a `schedule.cron` whose ticks come closer together than `schedules.min_interval`
/// allows, naming the field, the interval found and the limit.
fn refuse_too_frequent(
    config: &Config,
    cron: &str,
    parsed: &croner::Cron,
    tz: chrono_tz::Tz,
) -> Result<(), SubmitError> {
    let now_secs = now_ms().div_euclid(1000);
    schedules::check_interval(config, cron, parsed, tz, now_secs).map_err(|message| {
        SubmitError::Invalid {
            field: Some("schedule.cron".into()),
            message: format!("schedule.cron: {message}; write a less frequent expression"),
        }
    })
}

/// Refuses one more schedule to a tenant that has `schedules.max_per_tenant` already.
/// Counted as the schedule is created, not in the same transaction: two created at the
/// same instant may both pass the last free place.
async fn refuse_over_tenant_cap(
    client: &Client,
    config: &Config,
    descriptor: &Descriptor,
) -> Result<(), SubmitError> {
    let max = config.schedules.max_per_tenant;
    let tenant = descriptor.tenant();
    let count = schedules::count_of_tenant(client, tenant).await?;
    if count >= usize::try_from(max).unwrap_or(usize::MAX) {
        return Err(SubmitError::Invalid {
            field: Some("schedule.cron".into()),
            message: format!(
                "schedule.cron: tenant `{tenant}` has {count} schedules, the most this \
                 installation allows (schedules.max_per_tenant in manent.yml: {max}); delete one \
                 (`manent schedule delete ID`) before creating another"
            ),
        });
    }
    Ok(())
}

/// Most deploys one bulk submission may hold ([`submit_many`]).
pub const MAX_BATCH: usize = 1000;

/// Submits many parsed descriptors at once: a bulk submission (a fleet-wide patch, the
/// deploys held back by an outage). Every one is checked and routed as [`submit`] does
/// before anything is stored; if one is refused, nothing is enqueued and the error names
/// it (`deploys[N]`, then its field). Then all are enqueued in one transaction, with one
/// wake-up per queue. A recurring schedule (`schedule.cron`) is refused: it is a
/// resource of its own, created alone.
pub async fn submit_many(
    client: &Client,
    config: &Arc<Config>,
    descriptors: Vec<Descriptor>,
    force_dry_run: bool,
    submitted_by: &Submitter,
) -> Result<Vec<Submitted>, SubmitError> {
    check_batch_size(descriptors.len())?;
    let prepared = {
        let config = Arc::clone(config);
        tokio::task::spawn_blocking(move || {
            descriptors
                .into_iter()
                .enumerate()
                .map(|(i, d)| prepare(&config, d, force_dry_run).map_err(|e| in_batch(i, e)))
                .collect::<Result<Vec<_>, _>>()
        })
        .await
        .map_err(|e| SubmitError::Internal(format!("submission check stopped: {e}")))??
    };
    let now = now_ms();
    let version = crate::request::startable_version(client).await?;
    let mut queues = Vec::with_capacity(prepared.len());
    let mut requests = Vec::with_capacity(prepared.len());
    for (i, p) in prepared.into_iter().enumerate() {
        let schedule = p.descriptor.schedule.clone().unwrap_or_default();
        if schedule.cron.is_some() {
            return Err(in_batch(
                i,
                SubmitError::Invalid {
                    field: Some("schedule.cron".into()),
                    message: "schedule.cron: a recurring schedule is created alone; submit it \
                              with POST /api/v1/deploys (manent deploy -f FILE)"
                        .into(),
                },
            ));
        }
        let not_before = not_before(schedule.at.as_deref()).map_err(|e| in_batch(i, e))?;
        let mut request = DeployRequest::new(p.descriptor, p.effective, p.route, submitted_by, now);
        if not_before.is_some() {
            request = request.authorised_at_start();
        }
        let mut enqueue = request.enqueue(version);
        if let Some(at_ms) = not_before {
            enqueue = enqueue.not_before(at_ms);
        }
        queues.push(request.route.queue);
        requests.push(enqueue);
    }
    client
        .enqueue_many(requests)
        .await?
        .into_iter()
        .zip(queues)
        .map(|(record, queue)| {
            let record = record?;
            Ok(Submitted {
                id: record.id,
                status: SubmittedStatus::Deploy(record.status),
                queue,
            })
        })
        .collect()
}

/// Parses the descriptors of a bulk submission, `(text, file name)` each, off the async
/// threads as [`parse`] does, in one task. A bad one is refused naming `deploys[N]`; so is
/// an empty list or one over [`MAX_BATCH`], before any text is read. Nothing is stored.
pub async fn parse_many(entries: Vec<(String, String)>) -> Result<Vec<Descriptor>, SubmitError> {
    check_batch_size(entries.len())?;
    tokio::task::spawn_blocking(move || {
        entries
            .iter()
            .enumerate()
            .map(|(i, (text, file))| {
                parse_descriptor(text, file).map_err(|e| in_batch(i, invalid(e)))
            })
            .collect()
    })
    .await
    .map_err(|e| SubmitError::Internal(format!("descriptor parser stopped: {e}")))?
}

/// Refuses an empty bulk submission and one over [`MAX_BATCH`], naming `deploys`.
fn check_batch_size(count: usize) -> Result<(), SubmitError> {
    let message = if count == 0 {
        "deploys: the list is empty; give at least one descriptor".to_string()
    } else if count > MAX_BATCH {
        format!(
            "deploys: {count} deploys, more than the {MAX_BATCH} one submission may hold; split them"
        )
    } else {
        return Ok(());
    };
    Err(SubmitError::Invalid {
        field: Some("deploys".into()),
        message,
    })
}

/// `e`, refused for the `i`-th deploy of a bulk submission: its field and message say which.
fn in_batch(i: usize, e: SubmitError) -> SubmitError {
    let at = format!("deploys[{i}]");
    match e {
        SubmitError::Invalid { field, message } => SubmitError::Invalid {
            field: Some(match field {
                Some(field) => format!("{at}.{field}"),
                None => at.clone(),
            }),
            message: format!("{at}: {message}"),
        },
        SubmitError::UnknownEnvironment(message) => {
            SubmitError::UnknownEnvironment(format!("{at}: {message}"))
        }
        other => other,
    }
}

/// The time a deploy held until `schedule.at` may start, in unix milliseconds.
fn not_before(at: Option<&str>) -> Result<Option<i64>, SubmitError> {
    at.map(|at| {
        parse_at(at).map_err(|message| SubmitError::Invalid {
            field: Some("schedule.at".into()),
            message: format!("schedule.at: `{at}` {message}"),
        })
    })
    .transpose()
}

/// `schedule.at` (RFC 3339, already validated by the model) in unix milliseconds.
fn parse_at(at: &str) -> Result<i64, String> {
    let normalised = at.replacen(['t', ' '], "T", 1);
    chrono::DateTime::parse_from_rfc3339(&normalised)
        .map(|t| t.timestamp_millis())
        .map_err(|e| format!("is not a date-time ({e}); write e.g. 2025-03-01T02:00:00Z"))
}

fn invalid(e: ModelError) -> SubmitError {
    let field = match &e {
        ModelError::EffectiveInvalid { field, .. } => Some(field.clone()),
        _ => e.issues().first().map(|i| i.field.clone()),
    }
    .filter(|f| !f.is_empty());
    SubmitError::Invalid {
        field,
        message: e.to_string(),
    }
}

/// `(application, environment)`.
type AppEnv = (String, String);

/// Refuses a dependency on another tenant's environment that does not admit this
/// deploy's application ([`crate::workflow::gate::unadmitted_cross_tenant_dependency`]), naming the key.
fn refuse_cross_tenant_dependencies(
    config: &Config,
    descriptor: &Descriptor,
    dependencies: &[manent_model::Dependency],
) -> Result<(), SubmitError> {
    match crate::workflow::gate::unadmitted_cross_tenant_dependency(
        &config.environments_source(),
        descriptor,
        dependencies,
    ) {
        Some((field, message)) => Err(SubmitError::Invalid {
            message,
            field: Some(field),
        }),
        None => Ok(()),
    }
}

/// Refuses a deploy whose dependencies lead back to its own application and
/// environment, following the environment files of the dependencies. A dependency without
/// an environment file (or whose source cannot be read now) has no known dependencies; one
/// whose file is invalid is refused, naming the file and what is wrong: its dependencies
/// cannot be followed, and a cycle through them would slip through.
fn refuse_dependency_cycle(config: &Config, eff: &EffectiveDescriptor) -> Result<(), SubmitError> {
    let source = config.environments_source();
    let start = (eff.application.clone(), eff.environment.clone());
    // Depth-first over (application, environment), keeping the path for the message.
    let mut stack: Vec<(Vec<AppEnv>, AppEnv)> = eff
        .depends_on
        .iter()
        .map(|d| {
            (
                vec![start.clone()],
                (d.application.clone(), d.environment.clone()),
            )
        })
        .collect();
    let mut seen = std::collections::HashSet::new();
    while let Some((path, node)) = stack.pop() {
        if node == start {
            // Another tenant's environments are not named: the chain through them is
            // theirs (the deployer learns only that the cycle passes there).
            let tenant = manent_model::tenant_of(&start.0);
            let mut names: Vec<String> = path
                .iter()
                .chain(std::iter::once(&node))
                .map(|(a, e)| {
                    if manent_model::tenant_of(a) == tenant {
                        format!("{a}/{e}")
                    } else {
                        "(another tenant's environment)".to_string()
                    }
                })
                .collect();
            names.dedup();
            return Err(SubmitError::Invalid {
                field: Some("depends_on".into()),
                message: format!(
                    "depends_on: dependency cycle {}; a deploy would wait for itself. Remove one of these dependencies",
                    names.join(" -> ")
                ),
            });
        }
        if !seen.insert(node.clone()) {
            continue;
        }
        let env = match load_environment(&source, &node.0, &node.1) {
            Ok(env) => env,
            Err(e) if e.is_environment_unavailable() => continue,
            Err(e) => {
                // Another tenant's file is not shown: its errors quote its content.
                let why = if manent_model::tenant_of(&node.0) == manent_model::tenant_of(&start.0) {
                    format!(": {e}; fix that file, then submit again")
                } else {
                    "; its tenant's operator fixes it".to_string()
                };
                return Err(SubmitError::Invalid {
                    field: Some("depends_on".into()),
                    message: format!(
                        "depends_on: the environment of dependency {}/{} is invalid, so its own \
                         dependencies (a cycle back to this deploy) cannot be checked{why}",
                        node.0, node.1
                    ),
                });
            }
        };
        for d in &env.depends_on {
            let mut next_path = path.clone();
            next_path.push(node.clone());
            stack.push((next_path, (d.application.clone(), d.environment.clone())));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{SubmitError, parse_at, prepare};

    #[test]
    fn a_dependency_whose_environment_file_is_invalid_is_refused_naming_the_file() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let write = |application: &str, text: &str| {
            let path = dir.path().join(application).join("prod.yml");
            std::fs::create_dir_all(path.parent().unwrap()).expect("the environment's directory");
            std::fs::write(&path, text).expect("write the environment file");
        };
        let deploy =
            "targets: [{name: t1, host: local}]\ndeploy: {plugin: command, commands: [\"true\"]}\n";
        write(
            "acme/a",
            &format!("{deploy}depends_on: [{{application: acme/b, environment: prod}}]\n"),
        );
        // acme/b leads back to acme/a, but its file is invalid: the cycle cannot be followed.
        write(
            "acme/b",
            &format!(
                "{deploy}no_such_key: 1\ndepends_on: [{{application: acme/a, environment: prod}}]\n"
            ),
        );
        let config = manent_config::Config::from_yaml_str(
            &format!(
                "database: {{url: \"sqlite://{}\"}}\nenvironments: {{source: \"{}\"}}\n\
                 artifacts: {{sources: [\"file:///srv/\"]}}\n",
                dir.path().join("manent.db").display(),
                dir.path().display()
            ),
            "manent.yml",
            std::iter::empty(),
        )
        .expect("a valid configuration");
        let descriptor = manent_model::parse_descriptor(
            &format!(
                "application: acme/a\nenvironment: prod\nartifacts: [{{name: a.tar, type: tarball, \
                 version: \"1\", url: \"file:///srv/a.tar\", sha256: {}}}]\n",
                "0".repeat(64)
            ),
            "deploy.yml",
        )
        .expect("a valid descriptor");
        let error = prepare(&config, descriptor, false)
            .expect_err("a dependency that cannot be followed is refused, not passed over");
        let SubmitError::Invalid { field, message } = &error else {
            panic!("a refusal of the descriptor, not {error:?}");
        };
        assert_eq!(field.as_deref(), Some("depends_on"), "{message}");
        assert!(
            message.contains("acme/b/prod") && message.contains("prod.yml"),
            "the refusal names the dependency and its environment file: {message}"
        );
        assert!(
            message.contains("no_such_key"),
            "and says what is wrong with it: {message}"
        );
    }

    /// Environment files under a temporary source, and a configuration over it with
    /// `artifacts` as given (a YAML flow mapping).
    struct Site {
        dir: tempfile::TempDir,
        config: manent_config::Config,
    }

    const DEPLOY: &str =
        "targets: [{name: t1, host: local}]\ndeploy: {plugin: command, commands: [\"true\"]}\n";

    impl Site {
        fn new(artifacts: &str) -> Site {
            let dir = tempfile::tempdir().expect("a temporary directory");
            let config = manent_config::Config::from_yaml_str(
                &format!(
                    "database: {{url: \"sqlite://{}\"}}\nenvironments: {{source: \"{}\"}}\n\
                     artifacts: {artifacts}\n",
                    dir.path().join("manent.db").display(),
                    dir.path().display()
                ),
                "manent.yml",
                std::iter::empty(),
            )
            .expect("a valid configuration");
            Site { dir, config }
        }

        /// Writes `application`'s `prod` environment: the usual target and plugin, then `extra`.
        fn environment(&self, application: &str, extra: &str) {
            let path = self.dir.path().join(application).join("prod.yml");
            std::fs::create_dir_all(path.parent().unwrap()).expect("the environment's directory");
            std::fs::write(&path, format!("{DEPLOY}{extra}")).expect("the environment file");
        }

        /// Prepares a deploy of `application` to `prod` with an artifact at `url`, and
        /// `extra` descriptor text; returns the refusal's field and message, if any.
        fn prepare(&self, application: &str, url: &str, extra: &str) -> Option<(String, String)> {
            let descriptor = manent_model::parse_descriptor(
                &format!(
                    "application: {application}\nenvironment: prod\nartifacts: [{{name: a.tar, \
                     type: tarball, version: \"1\", url: \"{url}\", sha256: {}}}]\n{extra}",
                    "0".repeat(64)
                ),
                "deploy.yml",
            )
            .expect("a valid descriptor");
            match prepare(&self.config, descriptor, false) {
                Ok(_) => None,
                Err(SubmitError::Invalid { field, message }) => {
                    Some((field.unwrap_or_default(), message))
                }
                Err(other) => panic!("a refusal of the descriptor, not {other:?}"),
            }
        }
    }

    #[test]
    fn a_source_scoped_to_ml_refuses_a_web_deploys_artifact_at_submission() {
        let site = Site::new(
            "{sources: [{url: \"https://ml.example.com/\", applications: [\"ml/*\"]}, \
             \"https://shared.example.com/\"]}",
        );
        site.environment("ml/trainer", "");
        site.environment("web/shop", "");
        assert_eq!(
            site.prepare("ml/trainer", "https://ml.example.com/model.tar", ""),
            None,
            "ml/* fetches from its own source"
        );
        let (field, message) = site
            .prepare("web/shop", "https://ml.example.com/model.tar", "")
            .expect("web/shop may not fetch from ml's source");
        assert_eq!(field, "artifacts[0].url", "{message}");
        assert!(
            message.contains("https://shared.example.com/")
                && !message.contains("ml.example.com/,"),
            "the refusal lists web's sources, not ml's: {message}"
        );
    }

    #[test]
    fn a_dependency_on_another_tenant_is_refused_unless_its_environment_lists_the_dependent() {
        let site = Site::new("{sources: [\"https://a.example.com/\"]}");
        let url = "https://a.example.com/a.tar";
        site.environment("data/warehouse", "dependents: [\"web/*\"]\n");
        site.environment("data/secret", "");
        site.environment("web/shop", "");
        site.environment("ml/trainer", "");
        site.environment("web/db", "");
        let on = |application: &str| {
            format!("depends_on: [{{application: {application}, environment: prod}}]\n")
        };
        assert_eq!(
            site.prepare("web/shop", url, &on("data/warehouse")),
            None,
            "data/warehouse lists web/* under dependents"
        );
        assert_eq!(
            site.prepare("web/shop", url, &on("web/db")),
            None,
            "a tenant's own environments need no permission"
        );
        let refusals: Vec<(String, String)> = ["data/secret", "data/missing"]
            .iter()
            .map(|other| {
                site.prepare("web/shop", url, &on(other))
                    .unwrap_or_else(|| panic!("{other} is another tenant's and does not allow it"))
            })
            .collect();
        for (field, message) in &refusals {
            assert_eq!(
                field, "depends_on[0]",
                "the refusal names the key: {message}"
            );
            assert!(
                message.contains("does not list web/shop under `dependents:`"),
                "it says why and what to do: {message}"
            );
        }
        assert_eq!(
            refusals[0].1.replace("data/secret", "X"),
            refusals[1].1.replace("data/missing", "X"),
            "an existing and a missing environment are refused alike (no oracle)"
        );
        assert!(
            site.prepare("ml/trainer", url, &on("data/warehouse"))
                .is_some(),
            "ml is not among data/warehouse's dependents"
        );
    }

    #[test]
    fn a_cycle_through_another_tenants_environment_does_not_show_its_chain() {
        let site = Site::new("{sources: [\"https://a.example.com/\"]}");
        site.environment(
            "data/warehouse",
            "dependents: [\"web/*\"]\ndepends_on: [{application: data/etl, environment: prod}]\n",
        );
        site.environment(
            "data/etl",
            "depends_on: [{application: web/shop, environment: prod}]\n",
        );
        site.environment("web/shop", "");
        let (field, message) = site
            .prepare(
                "web/shop",
                "https://a.example.com/a.tar",
                "depends_on: [{application: data/warehouse, environment: prod}]\n",
            )
            .expect("a cycle is refused");
        assert_eq!(field, "depends_on", "{message}");
        assert!(
            message.contains(
                "dependency cycle web/shop/prod -> (another tenant's environment) -> web/shop/prod"
            ),
            "the cycle is named through the deployer's own environments only: {message}"
        );
        assert!(
            !message.contains("data/"),
            "nothing of the other tenant's chain is shown: {message}"
        );
    }

    #[test]
    fn schedule_at_is_read_with_its_offset() {
        assert_eq!(
            parse_at("2030-01-01T00:00:00Z"),
            Ok(1_893_456_000_000),
            "an RFC 3339 time in UTC"
        );
        assert_eq!(
            parse_at("2030-01-01T01:00:00+01:00"),
            Ok(1_893_456_000_000),
            "an RFC 3339 time with an offset"
        );
        assert_eq!(
            parse_at("2030-01-01 01:00:00.250+01:00"),
            Ok(1_893_456_000_250),
            "a space for the T, and milliseconds"
        );
        assert_eq!(
            parse_at("2030-01-01t00:00:00z"),
            Ok(1_893_456_000_000),
            "lower-case t and z"
        );
        assert!(
            parse_at("tomorrow").is_err(),
            "a word that is not a time is refused"
        );
    }
}
