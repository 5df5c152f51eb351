//! A rendered template written onto a target as an artifact is: staged on the worker (in
//! the deploy's work directory, 0700) with the template's mode, uploaded as `<path>.part`,
//! verified against the sha256 of what was rendered, then renamed; the staged copy is
//! removed at once (docs/environments.md, "Templates").

use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use manent_model::RenderedTemplate;
use manent_ssh::{Connection, TransportError};
use sha2::{Digest, Sha256};

/// Why a template could not be written. It names the file, never its content nor a digest
/// of it (the content may hold secrets).
#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    #[error("cannot stage {path} on the worker: {error}")]
    Stage { path: String, error: std::io::Error },
    #[error(
        "{path}: the file written did not match what was rendered; nothing was put in its place"
    )]
    Mismatch { path: String },
    #[error("{path}: {error}")]
    Upload { path: String, error: TransportError },
}

impl WriteError {
    /// Whether another attempt may succeed: an upload or a verification may; staging on the
    /// worker's own disk will not.
    pub fn is_transient(&self) -> bool {
        !matches!(self, WriteError::Stage { .. })
    }
}

/// Writes `template` to its path on the target `conn` reaches, staging it in `staging`.
/// Returns what to show: the path, the mode and the size.
pub async fn write(
    conn: &dyn Connection,
    template: &RenderedTemplate,
    staging: &Path,
) -> Result<String, WriteError> {
    let staged = Staged::new(staging, template).map_err(|error| WriteError::Stage {
        path: template.path.clone(),
        error,
    })?;
    let sha256 = hex::encode(Sha256::digest(&template.bytes));
    conn.put_file_verified(&staged.0, &template.path, &sha256)
        .await
        .map_err(|error| match error {
            TransportError::Mismatch { .. } => WriteError::Mismatch {
                path: template.path.clone(),
            },
            error => WriteError::Upload {
                path: template.path.clone(),
                error,
            },
        })?;
    Ok(format!(
        "wrote {} ({}, {} bytes)",
        template.path,
        template.mode,
        template.bytes.len()
    ))
}

/// A template's bytes in a file of its own on the worker, with its mode; removed when
/// dropped, written or not.
struct Staged(PathBuf);

impl Staged {
    fn new(dir: &Path, template: &RenderedTemplate) -> std::io::Result<Staged> {
        std::fs::create_dir_all(dir)?;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
        let path = dir.join(uuid::Uuid::new_v4().to_string());
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)?;
        let staged = Staged(path);
        file.write_all(&template.bytes)?;
        // The mode exactly, whatever the worker's umask: the upload copies it.
        file.set_permissions(std::fs::Permissions::from_mode(template.mode.0))?;
        Ok(staged)
    }
}

impl Drop for Staged {
    fn drop(&mut self) {
        if let Err(e) = std::fs::remove_file(&self.0)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            tracing::warn!(file = %self.0.display(), error = %e, "cannot remove a staged template");
        }
    }
}
