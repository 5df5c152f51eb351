//! What one run of a deploy (or of a region's pass) holds in memory on its worker: each
//! secret read once, and each template rendered for each of its targets before the first
//! target changes (docs/environments.md, "Fail before touching anything"). Nothing of it is
//! recorded: a run after a crash reads and renders again. The run's workflow puts it in
//! scope, as `manent_guard` does the run's dead-man's switch; what runs commands or writes
//! templates within the run finds it there ([`current`]).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use manent_model::{EffectiveDescriptor, RenderedTemplate, SecretSource, Target, TemplateError};

use crate::vars::providers::{self, ProviderContext, SecretError};

tokio::task_local! {
    static RUN: Arc<RunValues>;
}

/// Runs `future` (a workflow's run) with `values` in scope.
pub async fn scoped<F: std::future::Future>(values: Arc<RunValues>, future: F) -> F::Output {
    RUN.scope(values, future).await
}

/// The values of the run being polled, if it put them in scope.
pub fn current() -> Option<Arc<RunValues>> {
    RUN.try_with(Arc::clone).ok()
}

/// One run's secrets and rendered templates.
pub struct RunValues {
    /// The environment file's directory on this worker.
    environment_dir: Option<PathBuf>,
    /// Each secret read so far, by name and source (a rollback's previous version may
    /// read one from elsewhere). Held across a read, so that each is read once.
    secrets: tokio::sync::Mutex<BTreeMap<(String, SecretSource), String>>,
    /// Each target's templates, rendered by [`RunValues::prepare`].
    rendered: std::sync::Mutex<BTreeMap<String, Arc<Vec<RenderedTemplate>>>>,
}

impl std::fmt::Debug for RunValues {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunValues")
            .field("environment_dir", &self.environment_dir)
            .finish_non_exhaustive()
    }
}

/// Why the values of a run could not be prepared: a secret that cannot be read, or a
/// template that cannot be rendered for a target. Its text may quote what minijinja says of
/// a value: the caller masks it with [`RunValues::secret_values`] before it is shown.
#[derive(Debug, thiserror::Error)]
pub enum PrepareError {
    #[error(transparent)]
    Secret(#[from] SecretError),
    #[error("target {target}: {error}")]
    Template {
        target: String,
        error: TemplateError,
    },
}

/// What [`RunValues::prepare`] did, for the step that records it (no value).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Prepared {
    pub secrets: usize,
    pub templates: usize,
    pub targets: usize,
}

impl std::fmt::Display for Prepared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "resolved: {} secret(s) read, {} template(s) rendered for {} target(s)",
            self.secrets, self.templates, self.targets
        )
    }
}

impl RunValues {
    /// The values of a run whose environment file lies in `environment_dir` on this worker.
    pub fn new(environment_dir: Option<PathBuf>) -> Self {
        RunValues {
            environment_dir,
            secrets: tokio::sync::Mutex::new(BTreeMap::new()),
            rendered: std::sync::Mutex::new(BTreeMap::new()),
        }
    }

    /// The value of the secret `name` read from `source`: read at its first use in the run,
    /// then kept in memory for the rest of it.
    pub async fn secret(
        &self,
        name: &str,
        source: &SecretSource,
        inherit_env: &[String],
    ) -> Result<String, SecretError> {
        let mut held = self.secrets.lock().await;
        let key = (name.to_owned(), source.clone());
        if let Some(value) = held.get(&key) {
            return Ok(value.clone());
        }
        let context = ProviderContext {
            environment_dir: self.environment_dir.clone(),
            inherit_env: inherit_env.to_vec(),
        };
        let value = providers::read(name, source, &context).await?;
        held.insert(key, value.clone());
        Ok(value)
    }

    /// Every secret value read in this run: what masks them.
    pub async fn secret_values(&self) -> Vec<String> {
        self.secrets.lock().await.values().cloned().collect()
    }

    /// Reads every secret of `eff` and renders every template for each of `targets` with
    /// its variables, the secrets and `manent_values(target)` (its `MANENT_*` values), so
    /// that a secret that cannot be read or a template that cannot be rendered fails the
    /// run before any target changes.
    pub async fn prepare(
        &self,
        eff: &EffectiveDescriptor,
        targets: &[Target],
        manent_values: impl Fn(&Target) -> Vec<(String, String)>,
    ) -> Result<Prepared, PrepareError> {
        let mut secrets = Vec::with_capacity(eff.secrets.len());
        for (name, source) in &eff.secrets {
            secrets.push((
                name.clone(),
                self.secret(name, source, &eff.inherit_env).await?,
            ));
        }
        let mut rendered = BTreeMap::new();
        for target in targets {
            let mut values: BTreeMap<String, String> = manent_values(target).into_iter().collect();
            values.extend(
                eff.variables_for(target)
                    .into_iter()
                    .map(|v| (v.name, v.value)),
            );
            values.extend(secrets.iter().cloned());
            let templates =
                eff.templates_for(target, &values)
                    .map_err(|error| PrepareError::Template {
                        target: target.name.clone(),
                        error,
                    })?;
            rendered.insert(target.name.clone(), Arc::new(templates));
        }
        self.rendered
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend(rendered);
        Ok(Prepared {
            secrets: secrets.len(),
            templates: eff.templates.len(),
            targets: targets.len(),
        })
    }

    /// The templates rendered for `target` by [`RunValues::prepare`], if it ran for it.
    pub fn rendered(&self, target: &str) -> Option<Arc<Vec<RenderedTemplate>>> {
        self.rendered
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(target)
            .cloned()
    }
}
