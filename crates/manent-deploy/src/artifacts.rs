//! Artifacts on the worker: fetched from `file://` or `http(s)://` into the
//! working directory with a streaming sha256 check, and fetched again when a
//! deploy resumes on a machine that lacks them (the seed's recovery point 3).

use std::path::{Path, PathBuf};

use manent_model::Artifact;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use tokio::io::AsyncWriteExt;

/// An artifact present and verified in the working directory.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LocalArtifact {
    pub name: String,
    pub path: PathBuf,
    pub sha256: String,
    pub size: u64,
}

/// Where a deploy keeps its artifacts on this worker.
pub fn deploy_dir(workdir: &Path, deploy_id: &str) -> PathBuf {
    workdir.join(deploy_id.replace(['/', '\\'], "_"))
}

/// Makes sure `artifact` is in `dir` with the right sha256: does nothing when
/// it already is, downloads (again) otherwise. A mismatch is an error and
/// leaves no file behind under the artifact's name.
pub async fn ensure_local(artifact: &Artifact, dir: &Path) -> Result<LocalArtifact, String> {
    let path = dir.join(&artifact.name);
    let expected = artifact.sha256.to_ascii_lowercase();
    if let Ok(meta) = tokio::fs::metadata(&path).await
        && meta.is_file()
        && let Ok(Ok(Some(actual))) = tokio::task::spawn_blocking({
            let path = path.clone();
            move || manent_ssh::sha256_file(&path)
        })
        .await
        && actual == expected
    {
        return Ok(LocalArtifact {
            name: artifact.name.clone(),
            path,
            sha256: actual,
            size: meta.len(),
        });
    }
    tokio::fs::create_dir_all(dir)
        .await
        .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let part = dir.join(format!("{}.part", artifact.name));
    let (actual, size) = download(&artifact.url, &part).await?;
    if actual != expected {
        let _ = tokio::fs::remove_file(&part).await;
        return Err(format!(
            "artifact `{}` from {}: sha256 mismatch: expected {expected}, got {actual}; nothing was deployed",
            artifact.name, artifact.url
        ));
    }
    tokio::fs::rename(&part, &path)
        .await
        .map_err(|e| format!("cannot move {} into place: {e}", part.display()))?;
    Ok(LocalArtifact {
        name: artifact.name.clone(),
        path,
        sha256: actual,
        size,
    })
}

/// Streams `url` to `dest`, hashing as it goes.
async fn download(url: &str, dest: &Path) -> Result<(String, u64), String> {
    let mut out = tokio::fs::File::create(dest)
        .await
        .map_err(|e| format!("cannot write {}: {e}", dest.display()))?;
    let mut hasher = Sha256::new();
    let mut size = 0u64;
    if let Some(path) = url.strip_prefix("file://") {
        use tokio::io::AsyncReadExt;
        let mut input = tokio::fs::File::open(path)
            .await
            .map_err(|e| format!("cannot read {url}: {e}"))?;
        let mut buf = vec![0u8; 256 * 1024];
        loop {
            let n = input
                .read(&mut buf)
                .await
                .map_err(|e| format!("cannot read {url}: {e}"))?;
            if n == 0 {
                break;
            }
            hasher.update(&buf[..n]);
            out.write_all(&buf[..n])
                .await
                .map_err(|e| format!("cannot write {}: {e}", dest.display()))?;
            size += n as u64;
        }
    } else if url.starts_with("http://") || url.starts_with("https://") {
        let mut response = reqwest::get(url)
            .await
            .map_err(|e| format!("cannot fetch {url}: {e}"))?;
        if !response.status().is_success() {
            return Err(format!("cannot fetch {url}: HTTP {}", response.status()));
        }
        while let Some(chunk) = response
            .chunk()
            .await
            .map_err(|e| format!("cannot fetch {url}: {e}"))?
        {
            hasher.update(&chunk);
            out.write_all(&chunk)
                .await
                .map_err(|e| format!("cannot write {}: {e}", dest.display()))?;
            size += chunk.len() as u64;
        }
    } else {
        return Err(format!(
            "unsupported artifact url {url}: use file://, http:// or https://"
        ));
    }
    out.sync_all()
        .await
        .map_err(|e| format!("cannot sync {}: {e}", dest.display()))?;
    Ok((hex::encode(hasher.finalize()), size))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn artifact(url: String, sha256: &str) -> Artifact {
        Artifact {
            name: "app.tar".into(),
            artifact_type: "tarball".into(),
            version: "1".into(),
            url,
            sha256: sha256.into(),
        }
    }

    #[tokio::test]
    async fn a_verified_artifact_is_fetched_once_and_a_mismatch_leaves_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().join("src.tar");
        std::fs::write(&src, b"hello").unwrap();
        let good = hex::encode(Sha256::digest(b"hello"));
        let work = dir.path().join("work");
        let a = artifact(format!("file://{}", src.display()), &good);
        let local = ensure_local(&a, &work).await.expect("fetch");
        assert_eq!(std::fs::read(&local.path).unwrap(), b"hello");
        std::fs::remove_file(&src).unwrap();
        let again = ensure_local(&a, &work)
            .await
            .expect("present and verified: no fetch needed");
        assert_eq!(again, local);

        let bad = artifact(
            format!("file://{}", dir.path().join("src.tar").display()),
            &"0".repeat(64),
        );
        std::fs::write(&src, b"tampered").unwrap();
        let other = dir.path().join("other");
        let err = ensure_local(&bad, &other).await.unwrap_err();
        assert!(err.contains("sha256 mismatch"), "{err}");
        assert!(
            !other.join("app.tar").exists(),
            "nothing under the artifact's name after a mismatch"
        );
        assert!(!other.join("app.tar.part").exists(), "no partial file left");
    }
}
