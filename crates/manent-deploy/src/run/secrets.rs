//! Secrets on the worker: the values an environment file's `secrets:` names, read by their
//! providers (`vars`), given to commands as variables, and replaced by `***` in everything
//! recorded or shown (docs/security.md, "Secrets").

use manent_model::EffectiveDescriptor;

pub use crate::run::masking::MASK;
use crate::run::masking::Masker;

pub use crate::vars::providers::SecretError;

/// The secrets of one deploy, read on this worker.
#[derive(Default)]
pub struct Secrets {
    /// `(variable, value)`.
    values: Vec<(String, String)>,
    /// Finds the values (and the lines of multi-line ones) in what is shown.
    masker: Masker,
}

impl std::fmt::Debug for Secrets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<&str> = self.values.iter().map(|(n, _)| n.as_str()).collect();
        f.debug_struct("Secrets").field("names", &names).finish()
    }
}

impl Secrets {
    /// Reads every secret of `eff`: within a deploy's run, from the run's values (each
    /// secret read once per run, docs/environments.md "Secret providers"); elsewhere from
    /// its provider. A secret that cannot be read is an error naming the secret and where
    /// it was looked for, never its value.
    pub async fn read(eff: &EffectiveDescriptor) -> Result<Secrets, SecretError> {
        let run = crate::vars::run_values::current();
        let mut values = Vec::with_capacity(eff.secrets.len());
        for (name, source) in &eff.secrets {
            let value = match &run {
                Some(run) => run.secret(name, source, &eff.inherit_env).await?,
                None => {
                    let context = crate::vars::providers::ProviderContext {
                        environment_dir: None,
                        inherit_env: eff.inherit_env.clone(),
                    };
                    crate::vars::providers::read(name, source, &context).await?
                }
            };
            values.push((name.clone(), value));
        }
        Ok(Secrets::from_values(values))
    }

    /// The secrets `values` (`(variable, value)`), masked as read ones are.
    pub fn from_values(values: Vec<(String, String)>) -> Secrets {
        let masker = Masker::new(values.iter().map(|(_, value)| value.as_str()));
        Secrets { values, masker }
    }

    /// The variables commands get: `(name, value)`.
    pub fn env(&self) -> impl Iterator<Item = (String, String)> + '_ {
        self.values.iter().cloned()
    }

    /// `text` with every secret value replaced by [`MASK`], each line of a multi-line
    /// value too (see [`Masker::new`]). For text that arrives in pieces, use
    /// [`Secrets::masker`]'s stream, never this on each piece.
    pub fn redact(&self, text: &str) -> String {
        self.masker.redact(text)
    }

    /// What masks these secrets in a stream.
    pub fn masker(&self) -> &Masker {
        &self.masker
    }
}

/// The value behind `secret`: a file's content without its final newline, or an
/// environment variable of the worker. Read when it is used, never at load, never recorded.
pub async fn read_secret_ref(secret: &manent_config::SecretRef) -> Result<String, String> {
    use manent_config::SecretRef;
    let value = match secret {
        SecretRef::File(path) => tokio::fs::read_to_string(path)
            .await
            .map_err(|e| e.to_string()),
        SecretRef::Env(name) => std::env::var(name).map_err(|e| e.to_string()),
    };
    value.map(|v| v.strip_suffix('\n').unwrap_or(&v).to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_occurrence_of_a_value_is_masked_longest_first() {
        let secrets = Secrets::from_values(vec![
            ("TOKEN".into(), "hunter2".into()),
            ("TOKEN_LONG".into(), "hunter2-extended".into()),
        ]);
        assert_eq!(
            secrets.redact("a=hunter2 b=hunter2-extended c=hunter2"),
            "a=*** b=*** c=***",
            "each value is masked, the longer one whole"
        );
        assert!(
            !format!("{secrets:?}").contains("hunter2"),
            "Debug shows names only"
        );
    }
}
