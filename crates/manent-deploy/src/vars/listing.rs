//! `manent vars APP ENV [--target T]` (docs/cli.md): each variable's effective value for
//! each target of an environment as its file says now, and where it came from; each secret
//! as `***` with its provider. Nothing is read from a provider.

use manent_config::Config;
use manent_model::{EnvironmentFile, ModelError, load_environment};

/// One variable of one target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VariableRow {
    pub target: String,
    pub name: String,
    /// The value, or `***` for a secret.
    pub value: String,
    /// `environment`, `region eu`, `az eu-1a`, `label tier=web`, `target web-2`, or
    /// `secret (<provider>)`.
    pub source: String,
}

/// Why the variables could not be listed.
#[derive(Debug, thiserror::Error)]
pub enum ListingError {
    #[error(transparent)]
    Environment(#[from] ModelError),
    #[error("{application}/{environment} has no target `{target}`; its targets: {targets}")]
    UnknownTarget {
        application: String,
        environment: String,
        target: String,
        targets: String,
    },
}

/// The variables of `application`'s `environment` for each target (or only `target`), read
/// from the environments source: by target in the file's order, then by name.
pub fn variables(
    config: &Config,
    application: &str,
    environment: &str,
    target: Option<&str>,
) -> Result<Vec<VariableRow>, ListingError> {
    let env = load_environment(&config.environments_source(), application, environment)?;
    if let Some(name) = target
        && !env.targets.iter().any(|t| t.name == name)
    {
        return Err(ListingError::UnknownTarget {
            application: application.to_owned(),
            environment: environment.to_owned(),
            target: name.to_owned(),
            targets: env
                .targets
                .iter()
                .map(|t| t.name.as_str())
                .collect::<Vec<_>>()
                .join(", "),
        });
    }
    Ok(rows(&env, target))
}

/// The rows of `env`, for every target or only `only`.
pub fn rows(env: &EnvironmentFile, only: Option<&str>) -> Vec<VariableRow> {
    let mut rows = Vec::new();
    for target in env
        .targets
        .iter()
        .filter(|t| only.is_none_or(|name| t.name == name))
    {
        let mut mine: Vec<VariableRow> = env
            .variables_for(target)
            .into_iter()
            .map(|v| VariableRow {
                target: target.name.clone(),
                name: v.name,
                value: v.value,
                source: v.source.to_string(),
            })
            .chain(env.secrets.iter().map(|(name, source)| VariableRow {
                target: target.name.clone(),
                name: name.clone(),
                // What stands for a secret everywhere manent shows one.
                value: "***".to_owned(),
                source: format!("secret ({})", source.provider()),
            }))
            .collect();
        mine.sort_by(|a, b| a.name.cmp(&b.name));
        rows.extend(mine);
    }
    rows
}
