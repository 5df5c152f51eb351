//! Artifacts on the worker: fetched from `file://` or `http(s)://` into the
//! working directory with a streaming sha256 check, and fetched again when a
//! deploy resumes on a machine that lacks them (docs/scaling-and-recovery.md, Recovery).

use std::{
    collections::HashMap,
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
    sync::{Mutex, OnceLock},
};

use manent_config::ArtifactSources;
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

/// What identifies a file's content without reading it: a file whose identity is
/// unchanged since this process hashed it is not hashed again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct FileIdentity {
    dev: u64,
    ino: u64,
    size: u64,
    mtime: i64,
    mtime_nsec: i64,
}

impl FileIdentity {
    fn of(meta: &std::fs::Metadata) -> Self {
        FileIdentity {
            dev: meta.dev(),
            ino: meta.ino(),
            size: meta.size(),
            mtime: meta.mtime(),
            mtime_nsec: meta.mtime_nsec(),
        }
    }
}

/// The artifacts this process verified: path → (identity when hashed, sha256).
/// Every target's upload step makes sure its artifact is present; without this
/// each of them would hash the whole file again (20 targets × 50 MB = 1 GB).
fn verified() -> &'static Mutex<HashMap<PathBuf, (FileIdentity, String)>> {
    static VERIFIED: OnceLock<Mutex<HashMap<PathBuf, (FileIdentity, String)>>> = OnceLock::new();
    VERIFIED.get_or_init(Default::default)
}

fn remember(path: &Path, meta: &std::fs::Metadata, sha256: &str) {
    if let Ok(mut map) = verified().lock() {
        map.insert(
            path.to_path_buf(),
            (FileIdentity::of(meta), sha256.to_string()),
        );
    }
}

/// The sha256 of the file at `path` if this process hashed it and it has not changed since.
fn known_sha256(path: &Path, meta: &std::fs::Metadata) -> Option<String> {
    let map = verified().lock().ok()?;
    let (identity, sha256) = map.get(path)?;
    (*identity == FileIdentity::of(meta)).then(|| sha256.clone())
}

/// Makes sure `artifact` is in `dir` with the right sha256: does nothing when
/// it already is, downloads (again) otherwise. A mismatch is an error and
/// leaves no file behind under the artifact's name. A file this process already
/// verified and that has not changed since (same inode, size and mtime) is not
/// hashed again; on another machine, or after any change, it is.
///
/// The URL is checked against `sources` again here, on the worker: a `file://` path after
/// its symlinks are resolved, an `http(s)://` URL at every redirect.
pub async fn ensure_local(
    artifact: &Artifact,
    dir: &Path,
    sources: &ArtifactSources,
) -> Result<LocalArtifact, String> {
    let path = dir.join(&artifact.name);
    let expected = artifact.sha256.to_ascii_lowercase();
    if let Ok(meta) = tokio::fs::metadata(&path).await
        && meta.is_file()
    {
        let actual = match known_sha256(&path, &meta) {
            Some(known) => Some(known),
            None => tokio::task::spawn_blocking({
                let path = path.clone();
                move || manent_ssh::sha256_file(&path)
            })
            .await
            .ok()
            .and_then(Result::ok)
            .flatten(),
        };
        if let Some(actual) = actual
            && actual == expected
        {
            remember(&path, &meta, &actual);
            return Ok(LocalArtifact {
                name: artifact.name.clone(),
                path,
                sha256: actual,
                size: meta.len(),
            });
        }
    }
    create_private_dir(dir)
        .await
        .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let part = dir.join(format!("{}.part", artifact.name));
    let (actual, size) = download(&artifact.url, &part, sources).await?;
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
    if let Ok(meta) = tokio::fs::metadata(&path).await {
        remember(&path, &meta, &actual);
    }
    Ok(LocalArtifact {
        name: artifact.name.clone(),
        path,
        sha256: actual,
        size,
    })
}

/// Creates `dir` and its missing parents readable by this user only (0700): artifacts may
/// carry configuration and credentials of the application.
async fn create_private_dir(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    let dir = dir.to_path_buf();
    tokio::task::spawn_blocking(move || {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
    })
    .await
    .map_err(std::io::Error::other)?
}

/// Streams `url` to `dest`, hashing as it goes, reading only from `sources`.
async fn download(
    url: &str,
    dest: &Path,
    sources: &ArtifactSources,
) -> Result<(String, u64), String> {
    let parsed = sources
        .check(url)
        .map_err(|e| format!("artifact url `{url}` {e}"))?;
    let mut out = tokio::fs::File::create(dest)
        .await
        .map_err(|e| format!("cannot write {}: {e}", dest.display()))?;
    let mut hasher = Sha256::new();
    let mut size = 0u64;
    if parsed.scheme() == "file" {
        use tokio::io::AsyncReadExt;
        let path = parsed
            .to_file_path()
            .map_err(|()| format!("artifact url `{url}` is not a local path"))?;
        // A symlink under a source may point anywhere: the resolved path must stay under one.
        let resolved = tokio::fs::canonicalize(&path)
            .await
            .map_err(|e| format!("cannot read {url}: {e}"))?;
        if !sources.contains_path(&resolved) {
            return Err(format!(
                "artifact url `{url}` resolves to {}, which is under none of artifacts.sources; \
                 nothing was fetched",
                resolved.display()
            ));
        }
        let mut input = tokio::fs::File::open(&resolved)
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
    } else {
        let mut response = http_client(sources)?
            .get(parsed)
            .send()
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
    }
    out.sync_all()
        .await
        .map_err(|e| format!("cannot sync {}: {e}", dest.display()))?;
    Ok((hex::encode(hasher.finalize()), size))
}

/// An HTTP client that follows a redirect only to a URL under `sources` (at most 10).
fn http_client(sources: &ArtifactSources) -> Result<reqwest::Client, String> {
    let sources = sources.clone();
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::custom(move |attempt| {
            if attempt.previous().len() >= 10 {
                attempt.error("more than 10 redirects")
            } else if sources.contains_url(attempt.url()) {
                attempt.follow()
            } else {
                let to = attempt.url().to_string();
                attempt.error(format!(
                    "redirected to {to}, which is under none of artifacts.sources"
                ))
            }
        }))
        .build()
        .map_err(|e| format!("cannot build the HTTP client: {e}"))
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

    /// Sources admitting everything under `dir`.
    fn sources_of(dir: &Path) -> ArtifactSources {
        let root = std::fs::canonicalize(dir).unwrap();
        ArtifactSources::parse(&[format!("file://{}/", root.display())]).unwrap()
    }

    #[tokio::test]
    async fn a_verified_artifact_is_fetched_once_and_a_mismatch_leaves_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let sources = sources_of(dir.path());
        let src = dir.path().join("src.tar");
        std::fs::write(&src, b"hello").unwrap();
        let good = hex::encode(Sha256::digest(b"hello"));
        let work = dir.path().join("work");
        let a = artifact(format!("file://{}", src.display()), &good);
        let local = ensure_local(&a, &work, &sources).await.expect("fetch");
        assert_eq!(std::fs::read(&local.path).unwrap(), b"hello");
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&work).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode, 0o700, "the work directory is its owner's only");
        }
        std::fs::remove_file(&src).unwrap();
        let again = ensure_local(&a, &work, &sources)
            .await
            .expect("present and verified: no fetch needed");
        assert_eq!(again, local);

        let bad = artifact(
            format!("file://{}", dir.path().join("src.tar").display()),
            &"0".repeat(64),
        );
        std::fs::write(&src, b"tampered").unwrap();
        let other = dir.path().join("other");
        let err = ensure_local(&bad, &other, &sources).await.unwrap_err();
        assert!(err.contains("sha256 mismatch"), "{err}");
        assert!(
            !other.join("app.tar").exists(),
            "nothing under the artifact's name after a mismatch"
        );
        assert!(!other.join("app.tar.part").exists(), "no partial file left");
    }

    #[tokio::test]
    async fn a_local_copy_changed_after_its_verification_is_verified_and_fetched_again() {
        let dir = tempfile::tempdir().unwrap();
        let sources = sources_of(dir.path());
        let src = dir.path().join("src.tar");
        std::fs::write(&src, b"hello").unwrap();
        let a = artifact(
            format!("file://{}", src.display()),
            &hex::encode(Sha256::digest(b"hello")),
        );
        let work = dir.path().join("work");
        let local = ensure_local(&a, &work, &sources).await.expect("fetch");
        // Same size, other bytes: only a re-hash can tell.
        std::fs::write(&local.path, b"jello").unwrap();
        let again = ensure_local(&a, &work, &sources)
            .await
            .expect("fetched again");
        assert_eq!(
            std::fs::read(&again.path).unwrap(),
            b"hello",
            "the changed copy is not trusted from memory: it is replaced by a verified fetch"
        );
    }
}

#[cfg(test)]
mod source_tests {
    use super::*;

    #[tokio::test]
    async fn a_symlink_out_of_the_source_is_not_followed() {
        let dir = tempfile::tempdir().unwrap();
        let releases = dir.path().join("releases");
        std::fs::create_dir(&releases).unwrap();
        let secret = dir.path().join("id_ed25519");
        std::fs::write(&secret, b"private key").unwrap();
        std::os::unix::fs::symlink(&secret, releases.join("app.tar")).unwrap();
        let root = std::fs::canonicalize(&releases).unwrap();
        let sources = ArtifactSources::parse(&[format!("file://{}/", root.display())]).unwrap();
        let artifact = Artifact {
            name: "app.tar".into(),
            artifact_type: "tarball".into(),
            version: "1".into(),
            url: format!("file://{}/app.tar", root.display()),
            sha256: hex::encode(Sha256::digest(b"private key")),
        };
        let work = dir.path().join("work");
        let err = ensure_local(&artifact, &work, &sources)
            .await
            .expect_err("a symlink leading out of the source is refused");
        assert!(err.contains("under none of artifacts.sources"), "{err}");
        assert!(
            !work.join("app.tar").exists(),
            "nothing of the linked file reaches the work directory"
        );
    }
}
