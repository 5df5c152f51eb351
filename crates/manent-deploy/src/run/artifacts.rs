//! Artifacts on the worker: fetched from `file://` or `http(s)://` (through the HTTP port,
//! `crate::http`, each redirect checked here against the sources) into the working
//! directory with a streaming sha256 check, and fetched again when a deploy resumes on a
//! machine that lacks them (docs/scaling-and-recovery.md, Recovery).

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

use crate::http::{HttpAuth, HttpError, HttpErrorKind, HttpFetch, HttpRequest, HttpResponse};

/// Why an artifact could not be made present and verified on this worker.
#[derive(Debug, thiserror::Error)]
pub enum ArtifactError {
    #[error("artifact url `{url}` {reason}")]
    Refused {
        url: String,
        reason: manent_config::SourceError,
    },
    #[error(
        "artifact url `{url}` resolves to {}, which is under none of artifacts.sources; \
         nothing was fetched",
        resolved.display()
    )]
    ResolvesOutside { url: String, resolved: PathBuf },
    #[error("artifact url `{url}` is not a local path")]
    NotALocalPath { url: String },
    #[error("cannot read {url}: {error}")]
    Read { url: String, error: std::io::Error },
    #[error("cannot {action} {}: {error}", path.display())]
    WorkDir {
        action: &'static str,
        path: PathBuf,
        error: std::io::Error,
    },
    /// The port's error names no URL (`crate::http::HttpError`): this one names the
    /// artifact's, as every error of an artifact does.
    #[error("cannot fetch {url}: {error}")]
    Fetch { url: String, error: HttpError },
    /// A redirect to a URL outside the sources that serve the deploy's application.
    #[error(
        "cannot fetch {url}: redirected to {to}, which is under none of artifacts.sources \
         for this application; nothing was fetched from there"
    )]
    RedirectRefused { url: String, to: String },
    #[error("cannot fetch {url}: {reason}")]
    Redirect { url: String, reason: String },
    /// The worker cannot read the credentials configured for the source.
    #[error(
        "cannot fetch {url}: the credentials of artifacts source {source_prefix} cannot be \
         read from {secret} on this worker: {reason}; fix the worker's manent.yml or the file"
    )]
    Credentials {
        url: String,
        source_prefix: String,
        secret: String,
        reason: String,
    },
    /// Larger than `artifacts.max_bytes`: the download stopped at the limit.
    #[error(
        "artifact `{name}` from {url} is larger than artifacts.max_bytes ({limit} bytes): the \
         download stopped there and nothing was deployed; an operator raises \
         artifacts.max_bytes in the worker's manent.yml if such a size is expected"
    )]
    TooLarge {
        name: String,
        url: String,
        limit: u64,
    },
    #[error("cannot fetch {url}: HTTP {}", crate::http::status_text(*status, reason.as_deref()))]
    Status {
        url: String,
        status: u16,
        reason: Option<String>,
    },
    /// The digest of what was fetched is not the descriptor's. What it is instead is never
    /// said (nor logged): it would tell a deployer the digest of any file a source serves,
    /// another tenant's included.
    #[error(
        "artifact `{name}` from {url}: sha256 mismatch: the file fetched does not have the \
         descriptor's sha256 {expected}; nothing was deployed"
    )]
    Mismatch {
        name: String,
        url: String,
        expected: String,
    },
}

impl ArtifactError {
    /// Whether trying again may succeed: a read, a network failure or a server error may
    /// pass; a refused source, a redirect out of the sources, a missing file or a wrong
    /// sha256 will not, and retrying them only delays the deploy's failure.
    pub fn is_transient(&self) -> bool {
        match self {
            ArtifactError::Refused { .. }
            | ArtifactError::ResolvesOutside { .. }
            | ArtifactError::NotALocalPath { .. }
            | ArtifactError::Mismatch { .. }
            | ArtifactError::RedirectRefused { .. }
            | ArtifactError::Redirect { .. }
            | ArtifactError::Credentials { .. }
            | ArtifactError::TooLarge { .. } => false,
            ArtifactError::Read { error, .. } => error.kind() != std::io::ErrorKind::NotFound,
            ArtifactError::Fetch { error, .. } => error.kind != HttpErrorKind::Request,
            ArtifactError::Status { status, .. } => *status >= 500 || *status == 429,
            ArtifactError::WorkDir { .. } => true,
        }
    }
}

/// An artifact present and verified in the working directory.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LocalArtifact {
    pub name: String,
    pub path: PathBuf,
    pub sha256: String,
    pub size: u64,
}

/// Where a deploy (or a region's pass) keeps its files on this worker: its artifacts
/// ([`artifacts_dir`], [`previous_dir`]) and its plugin's working directory, each in a
/// directory of its own (docs/scaling-and-recovery.md, "Work directories").
pub fn deploy_dir(workdir: &Path, deploy_id: &str) -> PathBuf {
    workdir.join(deploy_id.replace(['/', '\\'], "_"))
}

/// Where a deploy keeps its verified artifacts, in its [`deploy_dir`]: a directory no plugin
/// writes (a confined plugin sees it read-only).
pub fn artifacts_dir(deploy_dir: &Path) -> PathBuf {
    deploy_dir.join("artifacts")
}

/// Where a rollback keeps the artifacts of the version it restores, beside
/// [`artifacts_dir`] and as private.
pub fn previous_dir(deploy_dir: &Path) -> PathBuf {
    deploy_dir.join("previous")
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
    /// Set by the kernel at every change, content or metadata: unlike mtime, no user can
    /// set it back.
    ctime: i64,
    ctime_nsec: i64,
}

impl FileIdentity {
    fn of(meta: &std::fs::Metadata) -> Self {
        FileIdentity {
            dev: meta.dev(),
            ino: meta.ino(),
            size: meta.size(),
            mtime: meta.mtime(),
            mtime_nsec: meta.mtime_nsec(),
            ctime: meta.ctime(),
            ctime_nsec: meta.ctime_nsec(),
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

/// The most files [`verified`] remembers: a worker that runs for months forgets the
/// artifacts of ended deploys ([`forget_dir`]); this bounds it whatever happens.
const MAX_VERIFIED: usize = 4096;

fn remember(path: &Path, meta: &std::fs::Metadata, sha256: &str) {
    if let Ok(mut map) = verified().lock() {
        if map.len() >= MAX_VERIFIED {
            // Files that are gone first; then, still full, everything: it is only a cache.
            map.retain(|path, _| path.exists());
            if map.len() >= MAX_VERIFIED {
                map.clear();
            }
        }
        map.insert(
            path.to_path_buf(),
            (FileIdentity::of(meta), sha256.to_string()),
        );
    }
}

/// Forgets what this process verified under `dir`: a deploy's work directory, removed
/// when the deploy ended.
pub fn forget_dir(dir: &Path) {
    if let Ok(mut map) = verified().lock() {
        map.retain(|path, _| !path.starts_with(dir));
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
/// verified and that has not changed since (same inode, size, mtime and ctime) is not
/// hashed again; on another machine, or after any change, it is.
///
/// `dir` is a directory no plugin writes ([`artifacts_dir`], bound read-only into a
/// sandbox); still, nothing found there is trusted (docs/security.md, "What the worker never
/// trusts"): `dir` is made without following a link, a copy is reused only if it is a
/// regular file (not a link) whose sha256 is the descriptor's, anything else under the
/// artifact's name is removed (never followed) and fetched again, and the download is
/// written to a new file of its own (`create_new`, `O_NOFOLLOW`) moved into place.
///
/// The URL is checked against the sources serving `application` again here, on the
/// worker: a `file://` path after its symlinks are resolved, an `http(s)://` URL at every
/// redirect. A download stops at `artifacts.max_bytes`; a failed one leaves no `.part`.
/// `http` sends the requests of an `http(s)://` URL.
pub async fn ensure_local(
    artifact: &Artifact,
    application: &str,
    dir: &Path,
    sources: &ArtifactSources,
    http: &dyn HttpFetch,
) -> Result<LocalArtifact, ArtifactError> {
    let path = dir.join(&artifact.name);
    let expected = artifact.sha256.to_ascii_lowercase();
    create_private_dir(dir)
        .await
        .map_err(|error| ArtifactError::WorkDir {
            action: "create",
            path: dir.to_path_buf(),
            error,
        })?;
    if let Some(local) = reuse(artifact, &path, &expected).await? {
        return Ok(local);
    }
    let part = dir.join(format!(
        "{}.{}-{}.part",
        artifact.name,
        std::process::id(),
        NEXT_PART.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    ));
    let (actual, size, meta) = match download(artifact, application, &part, sources, http).await {
        Ok(done) => done,
        Err(e) => {
            // Nothing half-fetched stays behind: a retry starts afresh, and a refused or
            // oversized download leaves no bytes of it on the worker's disk.
            let _ = tokio::fs::remove_file(&part).await;
            return Err(e);
        }
    };
    if actual != expected {
        let _ = tokio::fs::remove_file(&part).await;
        return Err(ArtifactError::Mismatch {
            name: artifact.name.clone(),
            url: artifact.url.clone(),
            expected,
        });
    }
    // A rename replaces whatever is at `path` (a link included) and follows nothing.
    tokio::fs::rename(&part, &path)
        .await
        .map_err(|error| ArtifactError::WorkDir {
            action: "move into place",
            path: part.clone(),
            error,
        })?;
    remember(&path, &meta, &actual);
    Ok(LocalArtifact {
        name: artifact.name.clone(),
        path,
        sha256: actual,
        size,
    })
}

/// Numbers each download of this process: two branches fetching the same artifact at once
/// (the upload steps of a resumed deploy) never write the same `.part`.
static NEXT_PART: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// The copy at `path` if it is a regular file with the `expected` sha256, opened without
/// following a link and hashed from what was opened. Anything else there (a link, a
/// directory, a file with other bytes) is removed without following links, and `None` says
/// to fetch it again.
async fn reuse(
    artifact: &Artifact,
    path: &Path,
    expected: &str,
) -> Result<Option<LocalArtifact>, ArtifactError> {
    let opened = blocking({
        let path = path.to_path_buf();
        move || -> std::io::Result<Option<(std::fs::Metadata, String)>> {
            let Some(mut file) = manent_plugin::files::open_regular(&path)? else {
                return Ok(None);
            };
            let meta = file.metadata()?;
            let sha256 = match known_sha256(&path, &meta) {
                Some(known) => known,
                None => {
                    let mut hasher = Sha256::new();
                    std::io::copy(&mut file, &mut hasher)?;
                    hex::encode(hasher.finalize())
                }
            };
            Ok(Some((meta, sha256)))
        }
    })
    .await;
    match opened {
        Ok(Some((meta, actual))) if actual == expected => {
            remember(path, &meta, &actual);
            return Ok(Some(LocalArtifact {
                name: artifact.name.clone(),
                path: path.to_path_buf(),
                sha256: actual,
                size: meta.len(),
            }));
        }
        Ok(_) => {}
        // Unreadable: removed and fetched again, as a wrong copy is.
        Err(e) => {
            tracing::warn!(path = %path.display(), error = %e, "cannot read a kept artifact; fetching it again")
        }
    }
    let removed = blocking({
        let path = path.to_path_buf();
        move || manent_plugin::files::remove(&path)
    })
    .await;
    removed.map_err(|error| ArtifactError::WorkDir {
        action: "remove what is not the artifact at",
        path: path.to_path_buf(),
        error,
    })?;
    Ok(None)
}

/// Makes `dir` readable by this user only (0700): artifacts may carry configuration and
/// credentials of the application. Its parent (the deploy's directory) is created as an
/// ordinary path; `dir` itself without following a link: a deploy that began under an older
/// worker kept its artifacts where its plugin could write, and the plugin may have left a
/// link at this name.
async fn create_private_dir(dir: &Path) -> std::io::Result<()> {
    match (dir.parent(), dir.file_name()) {
        (Some(parent), Some(name)) => private_dir(parent, Path::new(name)).await,
        _ => private_dir(dir, Path::new("")).await,
    }
}

/// [`manent_plugin::files::private_dir`], off the async threads.
pub(crate) async fn private_dir(base: &Path, relative: &Path) -> std::io::Result<()> {
    let (base, relative) = (base.to_path_buf(), relative.to_path_buf());
    blocking(move || manent_plugin::files::private_dir(&base, &relative)).await
}

/// `f`, a file system call, on a blocking thread.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> std::io::Result<T> + Send + 'static,
) -> std::io::Result<T> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(std::io::Error::other)?
}

/// Streams `artifact`'s URL to `dest`, a file it creates (never through a link), hashing as
/// it goes, reading only from the sources serving `application`, and at most
/// `sources.max_bytes()` bytes. Returns the sha256, the size and what `dest` is once written.
async fn download(
    artifact: &Artifact,
    application: &str,
    dest: &Path,
    sources: &ArtifactSources,
    http: &dyn HttpFetch,
) -> Result<(String, u64, std::fs::Metadata), ArtifactError> {
    let url = artifact.url.as_str();
    let parsed = sources
        .check(application, url)
        .map_err(|reason| ArtifactError::Refused {
            url: url.to_string(),
            reason,
        })?;
    let write_error = |error| ArtifactError::WorkDir {
        action: "write",
        path: dest.to_path_buf(),
        error,
    };
    let read_error = |error| ArtifactError::Read {
        url: url.to_string(),
        error,
    };
    let fetch_error = |error| ArtifactError::Fetch {
        url: url.to_string(),
        error,
    };
    let limit = sources.max_bytes();
    let too_large = || ArtifactError::TooLarge {
        name: artifact.name.clone(),
        url: url.to_string(),
        limit,
    };
    let mut out =
        tokio::fs::File::from_std(manent_plugin::files::create_new(dest).map_err(|error| {
            ArtifactError::WorkDir {
                action: "create",
                path: dest.to_path_buf(),
                error,
            }
        })?);
    let mut hasher = Sha256::new();
    let mut size = 0u64;
    if parsed.scheme() == "file" {
        use tokio::io::AsyncReadExt;
        let path = parsed
            .to_file_path()
            .map_err(|()| ArtifactError::NotALocalPath {
                url: url.to_string(),
            })?;
        // A symlink under a source may point anywhere: the resolved path must stay under one.
        let resolved = tokio::fs::canonicalize(&path).await.map_err(read_error)?;
        if !sources.contains_path(application, &resolved) {
            return Err(ArtifactError::ResolvesOutside {
                url: url.to_string(),
                resolved,
            });
        }
        let mut input = tokio::fs::File::open(&resolved).await.map_err(read_error)?;
        let mut buf = vec![0u8; 256 * 1024];
        loop {
            let n = input.read(&mut buf).await.map_err(read_error)?;
            if n == 0 {
                break;
            }
            size += n as u64;
            if size > limit {
                return Err(too_large());
            }
            hasher.update(&buf[..n]);
            out.write_all(&buf[..n]).await.map_err(write_error)?;
        }
    } else {
        let mut response =
            fetch_following_redirects(http, parsed, url, application, sources).await?;
        if response
            .content_length()
            .is_some_and(|length| length > limit)
        {
            return Err(too_large());
        }
        while let Some(chunk) = response.body.chunk().await.map_err(fetch_error)? {
            size += chunk.len() as u64;
            if size > limit {
                return Err(too_large());
            }
            hasher.update(&chunk);
            out.write_all(&chunk).await.map_err(write_error)?;
        }
    }
    out.sync_all()
        .await
        .map_err(|error| ArtifactError::WorkDir {
            action: "sync",
            path: dest.to_path_buf(),
            error,
        })?;
    let meta = out
        .metadata()
        .await
        .map_err(|error| ArtifactError::WorkDir {
            action: "stat",
            path: dest.to_path_buf(),
            error,
        })?;
    Ok((hex::encode(hasher.finalize()), size, meta))
}

/// GETs `start` and follows redirects (at most 10) itself, each only to a URL under a
/// source serving `application`. Each request carries the credentials of the source it
/// goes to and no other's: a redirect from one source to another never takes the first
/// one's token along (docs/security.md, "Artifact sources").
async fn fetch_following_redirects(
    http: &dyn HttpFetch,
    start: url::Url,
    url: &str,
    application: &str,
    sources: &ArtifactSources,
) -> Result<HttpResponse, ArtifactError> {
    let fetch_error = |error| ArtifactError::Fetch {
        url: url.to_string(),
        error,
    };
    let mut next = start;
    for _ in 0..=crate::http::MAX_REDIRECTS {
        let Some(source) = sources.source_for(application, &next) else {
            return Err(ArtifactError::RedirectRefused {
                url: url.to_string(),
                to: next.to_string(),
            });
        };
        let request = HttpRequest::get(next.as_str()).auth(credentials(source, url).await?);
        let response = http.send(request).await.map_err(fetch_error)?;
        if !(300..400).contains(&response.status) {
            if !response.is_success() {
                return Err(ArtifactError::Status {
                    url: url.to_string(),
                    status: response.status,
                    reason: response.reason,
                });
            }
            return Ok(response);
        }
        let location = response
            .header("location")
            .ok_or_else(|| ArtifactError::Redirect {
                url: url.to_string(),
                reason: format!("HTTP {} without a Location", response.status_text()),
            })?;
        next = next.join(location).map_err(|e| ArtifactError::Redirect {
            url: url.to_string(),
            reason: format!("a redirect to `{location}`, which is not a URL: {e}"),
        })?;
    }
    Err(ArtifactError::Redirect {
        url: url.to_string(),
        reason: format!("more than {} redirects", crate::http::MAX_REDIRECTS),
    })
}

/// The credentials of `source`, read now from the worker's file or environment (never
/// recorded, never in a descriptor).
async fn credentials(
    source: &manent_config::ArtifactSource,
    url: &str,
) -> Result<Option<HttpAuth>, ArtifactError> {
    use manent_config::Credentials;
    Ok(match source.credentials() {
        None => None,
        Some(Credentials::Bearer(token)) => {
            Some(HttpAuth::Bearer(read_secret(token, source, url).await?))
        }
        Some(Credentials::Basic { username, password }) => Some(HttpAuth::Basic {
            username: username.clone(),
            password: read_secret(password, source, url).await?,
        }),
    })
}

/// The value of a source's secret: a file's content without its final newline, or an
/// environment variable of the worker.
async fn read_secret(
    secret: &manent_config::SecretRef,
    source: &manent_config::ArtifactSource,
    url: &str,
) -> Result<String, ArtifactError> {
    crate::run::secrets::read_secret_ref(secret)
        .await
        .map_err(|reason| ArtifactError::Credentials {
            url: url.to_string(),
            source_prefix: source.as_str().to_string(),
            secret: secret.to_string(),
            reason,
        })
}

#[cfg(test)]
mod tests;
