//! One target's steps under the `container` plugin: a deploy (upload, load, start, health,
//! switch, checks, retire the old beside the prune) and a rollback (start the kept
//! container again, health, switch back, retire the new). Every step is named after its
//! target and what it acts on, and safe to run again (docs/containers.md, "What a deploy
//! does").

use std::time::Duration;

use manent_engine::{StepPolicy, WorkflowContext, WorkflowError};
use manent_model::{ContainerSettings, EffectiveDescriptor, ProxyState, RunningContainer, Target};
use serde::{Deserialize, Serialize};

use super::{commands, proxy};
use crate::{
    plugins::{self, PassContext},
    request::{EventKey, publish},
    run::artifacts,
    run::targets::{self, RollbackResult, TargetError, TargetOutcome, TargetState},
};

/// What one target's containers of one deploy are: their settings, names and proxy.
pub(super) struct OnTarget<'a> {
    eff: &'a EffectiveDescriptor,
    target: &'a Target,
    settings: &'a ContainerSettings,
    names: commands::Names,
    /// `deploy.proxy.listen` expanded for the target.
    listen: String,
    deploy_id: &'a str,
}

impl<'a> OnTarget<'a> {
    pub(super) fn new(
        eff: &'a EffectiveDescriptor,
        target: &'a Target,
        deploy_id: &'a str,
    ) -> Result<Self, WorkflowError> {
        let (Some(settings), Some(proxy)) = (&eff.container, &eff.proxy) else {
            return Err(WorkflowError::failed(format!(
                "{}/{} version {} has no deploy.container and deploy.proxy; the container \
                 plugin needs both (docs/containers.md)",
                eff.application, eff.environment, eff.version
            )));
        };
        let base = manent_model::container_base(
            settings,
            &target.name,
            &eff.application,
            &eff.environment,
        );
        let listen = proxy
            .listen
            .replace("{host}", &target.host)
            .replace("{target}", &target.name);
        Ok(OnTarget {
            eff,
            target,
            settings,
            names: commands::Names::new(&base, &eff.version),
            listen,
            deploy_id,
        })
    }

    /// The `MANENT_*` variables and `deploy.container.env`: the command's environment (the
    /// variables and secrets are added by `targets::run`).
    fn env(&self) -> Vec<(String, String)> {
        let mut env = targets::command_env(self.eff, self.deploy_id, self.target, &[]);
        env.extend(
            self.settings
                .env
                .iter()
                .map(|(k, v)| (k.clone(), v.clone())),
        );
        env
    }

    /// The names of every variable the container gets.
    fn env_names(&self) -> Vec<String> {
        let mut names: Vec<String> = self.env().into_iter().map(|(k, _)| k).collect();
        names.extend(
            self.eff
                .variables_for(self.target)
                .into_iter()
                .map(|v| v.name),
        );
        names.extend(self.eff.secrets.keys().cloned());
        names.sort();
        names.dedup();
        names
    }

    /// Runs `script` after the runtime's lines, printing under `step`.
    async fn run(
        &self,
        ctx: &WorkflowContext,
        pool: &manent_ssh::ConnectionPool,
        step: &str,
        script: &str,
    ) -> Result<String, TargetError> {
        let script = format!("{}{script}", commands::runtime(self.settings.runtime));
        let output = ctx.output(step);
        let result = targets::run(pool, self.eff, self.target, &script, &self.env(), &output).await;
        output.finish().await;
        result.map_err(TargetError::of_own_script)
    }

    /// Starts the container (again), awaits its health and switches the proxy to it:
    /// the lines to show and what the target runs now. `new`: a deploy's new container,
    /// removed when unhealthy.
    async fn bring_up(
        &self,
        ctx: &WorkflowContext,
        pool: &manent_ssh::ConnectionPool,
        archive: &str,
        image_id: Option<&str>,
        new: bool,
        switched: &mut bool,
    ) -> Result<(Vec<String>, RunningContainer), WorkflowError> {
        let t = &self.target.name;
        let name = &self.names.container;
        let step = format!("{t}: start {name}");
        let start = commands::start(&commands::Start {
            names: &self.names,
            port: self.settings.port,
            env: self.env_names(),
            args: &self.settings.args,
            volumes: &self.settings.volumes,
            archive,
            remove_on_failure: new,
            image_id,
        });
        let started: String = ctx
            .step_with(&step, shown_running(), || async {
                self.run(ctx, pool, &step, &start).await
            })
            .await?;
        let commands::Started {
            address,
            image: image_digest,
            log,
        } = commands::started(&started);
        let step = format!("{t}: health {name}");
        let health = commands::health(&commands::Health {
            names: &self.names,
            address: &address,
            log: &log,
            path: &self.settings.health.path,
            interval: self.settings.health.interval,
            timeout: self.settings.health.timeout,
            remove_on_failure: new,
        });
        let healthy: String = ctx
            .step_with(&step, shown_running(), || async {
                self.run(ctx, pool, &step, &health).await
            })
            .await?;
        let step = format!("{t}: switch proxy to {name}");
        let switch = proxy::switch(&self.names, &self.listen, &address);
        // From here the proxy may send requests to this container: a rollback includes it.
        *switched = true;
        let proxied: String = ctx
            .step_with(&step, shown_running(), || async {
                self.run(ctx, pool, &step, &switch).await
            })
            .await?;
        let running = RunningContainer {
            name: name.clone(),
            image: self.names.tag.clone(),
            image_digest,
            address: address.clone(),
            proxy: ProxyState {
                listen: self.listen.clone(),
                server: name.clone(),
                upstream: address.clone(),
            },
        };
        Ok((
            vec![format!("container {name} on {address}: {healthy}"), proxied],
            running,
        ))
    }

    /// Takes every other container out of the proxy once its requests are done, and stops
    /// it.
    async fn retire_others(
        &self,
        ctx: &WorkflowContext,
        pool: &manent_ssh::ConnectionPool,
    ) -> Result<String, WorkflowError> {
        let step = format!(
            "{}: stop all but {}",
            self.target.name, self.names.container
        );
        let stop = self.settings.stop_timeout;
        let script = format!(
            "{}{}",
            proxy::retire_others(&self.names, &self.listen, stop),
            commands::stop_others(&self.names, stop)
        );
        let out: String = ctx
            .step_with(&step, shown_running(), || async {
                self.run(ctx, pool, &step, &script).await
            })
            .await?;
        Ok(if out.is_empty() {
            "nothing else was running".to_string()
        } else {
            out
        })
    }

    /// Removes the stopped containers past `keep` with their images and archives (step
    /// `<target>: prune containers`). The new version is live and checked: a failed prune
    /// is shown (`not pruned: …`), never a failure.
    pub(super) async fn prune(
        &self,
        ctx: &WorkflowContext,
        pool: &manent_ssh::ConnectionPool,
    ) -> Result<String, WorkflowError> {
        let step = format!("{}: prune containers", self.target.name);
        let script = commands::prune(&self.names, self.settings.keep);
        let pruned: Result<String, WorkflowError> = ctx
            .step_with(&step, shown_running(), || async {
                self.run(ctx, pool, &step, &script).await
            })
            .await;
        match pruned {
            Ok(out) => Ok(out),
            Err(WorkflowError::Step { message, .. }) => Ok(format!("not pruned: {message}")),
            Err(other) => Err(other),
        }
    }
}

/// What the upload step recorded: where the archive is on the target.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Uploaded {
    archive: String,
    note: String,
    /// Whether the version's tag was found missing, as builds before workflow version 7
    /// recorded it (their upload asked the runtime and skipped the archive of an image
    /// already tagged). This build records false: its load asks by the archive's image id,
    /// or by the tag.
    #[serde(default)]
    absent: bool,
}

/// Deploys one target in its own branch and publishes its outcome.
pub(super) async fn deploy(
    ctx: &WorkflowContext,
    pass: &PassContext<'_>,
    target: &Target,
) -> Result<TargetOutcome, WorkflowError> {
    let key = EventKey::target(&target.name);
    publish(
        ctx,
        &key,
        &TargetOutcome::new(&target.name, TargetState::Deploying, None),
    )
    .await?;
    let mut switched = false;
    let mut running = None;
    let result: Result<Vec<String>, WorkflowError> = async {
        let on = OnTarget::new(pass.eff, target, pass.deploy_id)?;
        if pass.eff.dry_run {
            return Ok(vec![format!(
                "would load {}, start {} and switch the proxy on {} to it",
                on.names.tag, on.names.container, on.listen
            )]);
        }
        deploy_steps(ctx, pass, &on, &mut switched, &mut running).await
    }
    .await;
    let outcome = match result {
        Ok(lines) => TargetOutcome {
            switched,
            container: running,
            ..TargetOutcome::new(
                &target.name,
                if pass.eff.dry_run {
                    TargetState::Planned
                } else {
                    TargetState::Deployed
                },
                Some(lines.join("; ")),
            )
        },
        Err(WorkflowError::Step { name, message }) => TargetOutcome {
            switched,
            container: running,
            ..TargetOutcome::new(
                &target.name,
                TargetState::Failed,
                Some(format!("{name}: {message}")),
            )
        },
        Err(other) => return Err(other),
    };
    publish(ctx, &key, &outcome).await?;
    Ok(outcome)
}

async fn deploy_steps(
    ctx: &WorkflowContext,
    pass: &PassContext<'_>,
    on: &OnTarget<'_>,
    switched: &mut bool,
    running: &mut Option<RunningContainer>,
) -> Result<Vec<String>, WorkflowError> {
    let pool = pass.pool;
    let t = &on.target.name;
    let artifact = pass.eff.artifacts.first().ok_or_else(|| {
        WorkflowError::failed("the container plugin deploys one image artifact; there is none")
    })?;
    if let Some(reference) = &artifact.reference {
        return pulled_steps(ctx, pass, on, reference, switched, running).await;
    }
    let step = format!("{t}: upload {}", artifact.name);
    let uploaded: Uploaded = ctx
        .step_retrying_if(
            &step,
            StepPolicy::retry(3, Duration::from_secs(1)).recording_start(),
            TargetError::is_transient,
            || async { upload(pass, on, artifact).await },
        )
        .await?;
    let step = format!("{t}: load image {}", on.names.tag);
    let load = commands::load(&on.names, &uploaded.archive, uploaded.absent);
    let image: String = ctx
        .step_with(&step, shown_running(), || async {
            on.run(ctx, pool, &step, &load).await
        })
        .await?;
    let lines = vec![uploaded.note, format!("image {} {image}", on.names.tag)];
    let loaded = Loaded {
        archive: &uploaded.archive,
        id: image.trim(),
    };
    after_image(ctx, pass, on, loaded, lines, switched, running).await
}

/// A deploy of an image the target pulls by its pinned `reference` (no archive): pull, then
/// as for an archive.
async fn pulled_steps(
    ctx: &WorkflowContext,
    pass: &PassContext<'_>,
    on: &OnTarget<'_>,
    reference: &str,
    switched: &mut bool,
    running: &mut Option<RunningContainer>,
) -> Result<Vec<String>, WorkflowError> {
    let step = format!("{}: pull {reference}", on.target.name);
    let pull = commands::pull(&on.names, reference);
    let image: String = ctx
        .step_with(&step, shown_running(), || async {
            on.run(ctx, pass.pool, &step, &pull).await
        })
        .await?;
    let lines = vec![format!("image {} {image} from {reference}", on.names.tag)];
    let loaded = Loaded {
        archive: "",
        id: image.trim(),
    };
    after_image(ctx, pass, on, loaded, lines, switched, running).await
}

/// The version's image on the target, as the load or the pull step recorded it.
struct Loaded<'a> {
    /// Where its archive is (none when pulled).
    archive: &'a str,
    /// Its id (`sha256:…`), as the step printed it.
    id: &'a str,
}

/// Once the version's image is on the target: start, health, switch, checks, retire the
/// others, the manifest (and, before workflow version 8, the prune).
async fn after_image(
    ctx: &WorkflowContext,
    pass: &PassContext<'_>,
    on: &OnTarget<'_>,
    loaded: Loaded<'_>,
    mut lines: Vec<String>,
    switched: &mut bool,
    running: &mut Option<RunningContainer>,
) -> Result<Vec<String>, WorkflowError> {
    let pool = pass.pool;
    // The id the load printed, unless it printed something else (a runtime's surprise).
    let id =
        Some(loaded.id).filter(|id| id.starts_with("sha256:") && !id.contains(char::is_whitespace));
    let (up, now) = on
        .bring_up(ctx, pool, loaded.archive, id, true, switched)
        .await?;
    lines.extend(up);
    *running = Some(now.clone());
    let env = on.env();
    lines.extend(plugins::run_checks(ctx, pool, pass.http, pass.eff, on.target, &env, "").await?);
    if ctx.workflow_version() >= crate::request::PRUNE_AFTER_VERSION {
        // The prune runs after the deploy's result, in a workflow of its own (`prune.rs`).
        lines.push(on.retire_others(ctx, pool).await?);
        lines.push(super::manifest::record_step(ctx, pass, pass.eff, on.target, &now).await?);
        return Ok(lines);
    }
    if ctx.workflow_version() < crate::request::PRUNE_BESIDE_RETIRE_VERSION {
        lines.push(on.retire_others(ctx, pool).await?);
        // Issue 41: what the target runs, once live and checked and the others retired.
        lines.push(super::manifest::record_step(ctx, pass, pass.eff, on.target, &now).await?);
        lines.push(on.prune(ctx, pool).await?);
        return Ok(lines);
    }
    // The old containers are drained and stopped while the older ones are pruned: the
    // prune counts a container still being stopped as the newest kept (commands::prune).
    let (retired, pruned) = futures::join!(on.retire_others(ctx, pool), on.prune(ctx, pool));
    let pruned = pruned?;
    lines.push(retired?);
    lines.push(super::manifest::record_step(ctx, pass, pass.eff, on.target, &now).await?);
    lines.push(pruned);
    Ok(lines)
}

/// Puts the image archive on the target, unless it is there with its sha256 (a warm target:
/// the archive stays as long as its image, see [`commands::prune`]). The runtime is not
/// asked here: the load asks it by the image's id.
async fn upload(
    pass: &PassContext<'_>,
    on: &OnTarget<'_>,
    artifact: &manent_model::Artifact,
) -> Result<Uploaded, TargetError> {
    let conn = targets::connection(pass.pool, pass.eff, on.target).await?;
    let transport = |e: manent_ssh::TransportError| TargetError::Transport(e.to_string());
    // Over SSH the home directory and a missing archive are learnt over SFTP, with no
    // process on the target.
    let home = conn.home_dir().await.map_err(transport)?;
    // One copy per container name: targets, applications or environments that share a
    // host never write the same file at once.
    let archive = format!(
        "{home}/.manent/images/{}-{}.tar",
        on.names.base, artifact.sha256
    );
    if conn
        .sha256(&archive)
        .await
        .map_err(transport)?
        .is_some_and(|sum| sum.eq_ignore_ascii_case(&artifact.sha256))
    {
        return Ok(Uploaded {
            note: format!("{archive} already on the target"),
            archive,
            absent: false,
        });
    }
    let dir = artifacts::artifacts_dir(pass.dir);
    let present = plugins::ensure_all(pass.eff, &dir, pass.sources, pass.http).await?;
    let local = present
        .iter()
        .find(|p| p.name == artifact.name)
        .ok_or_else(|| TargetError::ArtifactMissing(artifact.name.clone()))?;
    conn.put_file_verified(&local.path, &archive, &artifact.sha256)
        .await
        .map_err(|error| TargetError::Upload {
            remote: archive.clone(),
            error,
        })?;
    Ok(Uploaded {
        note: format!("uploaded {archive}"),
        archive,
        absent: false,
    })
}

/// Switches one target back to the previous version's container (started again if it is
/// stopped, from its image if it is gone), checks it, retires this deploy's, and publishes
/// the outcome.
pub(super) async fn roll_back(
    ctx: &WorkflowContext,
    pass: &PassContext<'_>,
    previous: Option<&EffectiveDescriptor>,
    outcome: &TargetOutcome,
    target: &Target,
) -> Result<TargetOutcome, WorkflowError> {
    let mut back = None;
    let result = match previous {
        None => RollbackResult::NothingToRestore(format!(
            "no earlier successful deploy of {}/{} to return to",
            pass.eff.application, pass.eff.environment
        )),
        Some(prev) if prev.plugin != manent_model::CONTAINER_PLUGIN => {
            RollbackResult::NothingToRestore(format!(
                "version {} was not deployed as a container",
                prev.version
            ))
        }
        Some(prev) => {
            let on = OnTarget::new(prev, target, pass.deploy_id)?;
            let mut switched = false;
            let restored = async {
                let (mut lines, now) = on
                    .bring_up(ctx, pass.pool, "", None, false, &mut switched)
                    .await?;
                let env = on.env();
                let after = format!(" after reactivating {}", prev.version);
                lines.extend(
                    plugins::run_checks(ctx, pass.pool, pass.http, prev, target, &env, &after)
                        .await?,
                );
                lines.push(on.retire_others(ctx, pass.pool).await?);
                // The manifest follows the container the proxy points at again.
                super::manifest::record_step(ctx, pass, prev, target, &now).await?;
                Ok::<_, WorkflowError>(now)
            }
            .await;
            match restored {
                Ok(now) => {
                    back = Some(now);
                    RollbackResult::Restored {
                        version: prev.version.clone(),
                    }
                }
                Err(WorkflowError::Step { name, message }) => {
                    RollbackResult::Failed(format!("{name}: {message}"))
                }
                Err(other) => return Err(other),
            }
        }
    };
    let mut rolled = outcome.after_rollback(&result);
    if back.is_some() {
        // The previous version's container runs behind the proxy again.
        rolled.container = back;
    }
    publish(ctx, &EventKey::target(&outcome.name), &rolled).await?;
    Ok(rolled)
}

/// A step that works on a target: run once, its start recorded (status, `logs`).
fn shown_running() -> StepPolicy {
    StepPolicy::default().recording_start()
}
