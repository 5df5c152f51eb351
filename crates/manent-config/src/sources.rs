//! Owns `artifacts.sources`: the URL prefixes artifacts may be fetched from, and the check
//! of an artifact URL against them (docs/security.md, "Artifact sources").
//!
//! Both sides are parsed with the WHATWG URL rules (the `url` crate) before they are
//! compared, so `..`, `%2e%2e`, default ports and letter case cannot smuggle a URL out of
//! its prefix. A `file://` URL is compared on its decoded path, component by component; an
//! `http(s)://` URL on scheme, host, port and path, and may not hide `/`, `\` or `.` behind
//! percent-encoding (a server would decode them after our check). Symlinks and redirects
//! are the fetcher's part: it resolves the first and follows the second only within the
//! sources, with [`ArtifactSources::contains_path`] and [`ArtifactSources::contains_url`].

use std::path::{Component, Path, PathBuf};

use serde::{Deserialize, Serialize};
use url::Url;

use crate::{pattern::glob_match, yaml};

/// `artifacts.max_bytes` when the file does not set it: 10 GiB.
pub const DEFAULT_MAX_ARTIFACT_BYTES: u64 = 10 * 1024 * 1024 * 1024;

/// `artifacts`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ArtifactsConfig {
    /// The URL prefixes deploys may fetch from (`file:///srv/releases/`,
    /// `https://artifacts.example.com/builds/`); an entry without `scheme://` is a local
    /// directory, relative to `manent.yml`. Without any, nothing can be fetched. An entry
    /// is a prefix (every application) or a mapping scoping it to applications and giving
    /// the worker's credentials for it.
    #[serde(deserialize_with = "yaml::nullable")]
    pub sources: Vec<SourceEntry>,
    /// The largest artifact a worker fetches, in bytes; a download stops there.
    pub max_bytes: u64,
}

impl Default for ArtifactsConfig {
    fn default() -> Self {
        ArtifactsConfig {
            sources: Vec::new(),
            max_bytes: DEFAULT_MAX_ARTIFACT_BYTES,
        }
    }
}

/// One entry of `artifacts.sources`: a prefix for every application (`"releases"`), or a
/// mapping (`{url, applications, bearer_token_file, …}`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(untagged)]
pub enum SourceEntry {
    Prefix(String),
    Scoped(ScopedSource),
}

impl SourceEntry {
    /// The prefix as written.
    pub fn url(&self) -> &str {
        match self {
            SourceEntry::Prefix(url) => url,
            SourceEntry::Scoped(scoped) => &scoped.url,
        }
    }
}

impl<'de> Deserialize<'de> for SourceEntry {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Entry;
        impl<'de> serde::de::Visitor<'de> for Entry {
            type Value = SourceEntry;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a URL prefix or a mapping with `url`")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<SourceEntry, E> {
                Ok(SourceEntry::Prefix(v.to_owned()))
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                map: A,
            ) -> Result<SourceEntry, A::Error> {
                // Through the struct's own deserializer, so an unknown key is named.
                ScopedSource::deserialize(serde::de::value::MapAccessDeserializer::new(map))
                    .map(SourceEntry::Scoped)
            }
        }
        deserializer.deserialize_any(Entry)
    }
}

/// A source written as a mapping.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScopedSource {
    /// The prefix, as a plain entry.
    pub url: String,
    /// The applications (patterns qualified with the tenant, `ml/*`) whose artifacts may
    /// come from here; empty or absent: every application.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub applications: Vec<String>,
    /// A file on the worker holding a bearer token sent to this source only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bearer_token_file: Option<PathBuf>,
    /// An environment variable of the worker process holding that token.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bearer_token_env: Option<String>,
    /// HTTP basic authentication sent to this source only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub basic_auth: Option<BasicAuth>,
}

/// `basic_auth` of a source: the user name, and where the worker reads the password.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BasicAuth {
    pub username: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub password_file: Option<PathBuf>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub password_env: Option<String>,
}

/// Where a worker reads a secret of a source, when it fetches (never at load, never
/// recorded).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SecretRef {
    /// A file (its content without the final newline), resolved against `manent.yml`.
    File(PathBuf),
    /// An environment variable of the worker process.
    Env(String),
}

impl std::fmt::Display for SecretRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SecretRef::File(path) => write!(f, "file {}", path.display()),
            SecretRef::Env(name) => write!(f, "environment variable {name}"),
        }
    }
}

/// The credentials a worker sends to one source, and to no other.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Credentials {
    Bearer(SecretRef),
    Basic {
        username: String,
        password: SecretRef,
    },
}

/// Why an artifact URL is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SourceError {
    #[error("is not a URL ({0}); write file:///path or https://host/path")]
    NotUrl(String),
    #[error("uses scheme `{0}`; artifacts are fetched over file://, http:// or https:// only")]
    Scheme(String),
    #[error(
        "names host `{0}` in a file:// URL; a file URL reads the worker's own disk: write file:///path"
    )]
    FileHost(String),
    #[error("has a `..` segment; write the path without it")]
    DotDot,
    #[error("hides `/`, `\\` or `.` behind percent-encoding ({0}); write them plainly")]
    EncodedSeparator(String),
    #[error(
        "is under none of artifacts.sources in manent.yml for this application ({0}); an \
         operator adds its prefix there"
    )]
    NotInSources(String),
    #[error("{0}")]
    Invalid(String),
}

/// One `artifacts.sources` entry, parsed: its path always ends with `/`, so
/// `https://h/builds` never admits `https://h/builds-evil/`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArtifactSource {
    url: Url,
    /// Application patterns (`ml/*`); empty: every application.
    applications: Vec<String>,
    credentials: Option<Credentials>,
}

impl ArtifactSource {
    /// Parses a source prefix, for every application, without credentials. A missing
    /// trailing `/` is added: a prefix is a directory.
    pub fn parse(text: &str) -> Result<Self, SourceError> {
        let mut url = parse_url(text)?;
        if url.query().is_some() || url.fragment().is_some() {
            return Err(SourceError::NotUrl(
                "a source is a prefix: remove its `?` query or `#` fragment".into(),
            ));
        }
        if !url.path().ends_with('/') {
            let path = format!("{}/", url.path());
            url.set_path(&path);
        }
        Ok(ArtifactSource {
            url,
            applications: Vec::new(),
            credentials: None,
        })
    }

    /// This source for the applications `patterns` only (`ml/*`); each is checked.
    pub fn for_applications(mut self, patterns: &[String]) -> Result<Self, SourceError> {
        for pattern in patterns {
            crate::check_application_pattern(pattern)
                .map_err(|m| SourceError::Invalid(format!("applications: {m}")))?;
        }
        self.applications = patterns.to_vec();
        Ok(self)
    }

    /// This source with `credentials`, which only an `https://` source, or an `http://` one
    /// on a loopback address, may carry: elsewhere they would cross the network in clear.
    pub fn with_credentials(mut self, credentials: Credentials) -> Result<Self, SourceError> {
        let loopback = match self.url.host() {
            Some(url::Host::Domain(name)) => name == "localhost",
            Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
            Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
            None => false,
        };
        match self.url.scheme() {
            "https" => {}
            "http" if loopback => {}
            _ => {
                return Err(SourceError::Invalid(format!(
                    "credentials are sent over https:// only, or http:// to a loopback \
                     address (this source is {}); use an https:// URL or remove them",
                    self.url
                )));
            }
        }
        self.credentials = Some(credentials);
        Ok(self)
    }

    /// The normalised prefix, as shown in messages.
    pub fn as_str(&self) -> &str {
        self.url.as_str()
    }

    /// The credentials sent to this source, if any.
    pub fn credentials(&self) -> Option<&Credentials> {
        self.credentials.as_ref()
    }

    /// Whether deploys of `application` may fetch from here.
    pub fn serves(&self, application: &str) -> bool {
        self.applications.is_empty()
            || self
                .applications
                .iter()
                .any(|pattern| glob_match(pattern, application))
    }

    /// The local directory of a `file://` source.
    pub fn file_dir(&self) -> Option<PathBuf> {
        (self.url.scheme() == "file")
            .then(|| self.url.to_file_path().ok())
            .flatten()
    }

    fn contains(&self, url: &Url) -> bool {
        if self.url.scheme() != url.scheme() {
            return false;
        }
        if url.scheme() == "file" {
            return match (self.file_dir(), url.to_file_path()) {
                (Some(dir), Ok(path)) => path.starts_with(dir),
                _ => false,
            };
        }
        self.url.host_str() == url.host_str()
            && self.url.port_or_known_default() == url.port_or_known_default()
            && url.path().starts_with(self.url.path())
    }
}

/// All of `artifacts.sources`, parsed, and `artifacts.max_bytes`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArtifactSources {
    sources: Vec<ArtifactSource>,
    max_bytes: u64,
}

impl Default for ArtifactSources {
    fn default() -> Self {
        ArtifactSources {
            sources: Vec::new(),
            max_bytes: DEFAULT_MAX_ARTIFACT_BYTES,
        }
    }
}

impl ArtifactSources {
    /// Parses prefixes, each for every application; the first bad one is an error naming
    /// its index.
    pub fn parse<S: AsRef<str>>(entries: &[S]) -> Result<Self, (usize, SourceError)> {
        let sources = entries
            .iter()
            .enumerate()
            .map(|(i, s)| ArtifactSource::parse(s.as_ref()).map_err(|e| (i, e)))
            .collect::<Result<_, _>>()?;
        Ok(ArtifactSources::new(sources))
    }

    /// Sources already parsed, with the default size limit.
    pub fn new(sources: Vec<ArtifactSource>) -> Self {
        ArtifactSources {
            sources,
            max_bytes: DEFAULT_MAX_ARTIFACT_BYTES,
        }
    }

    /// These sources with a size limit of `max_bytes` per artifact.
    pub fn with_max_bytes(mut self, max_bytes: u64) -> Self {
        self.max_bytes = max_bytes;
        self
    }

    /// The largest artifact a worker fetches, in bytes (`artifacts.max_bytes`).
    pub fn max_bytes(&self) -> u64 {
        self.max_bytes
    }

    pub fn is_empty(&self) -> bool {
        self.sources.is_empty()
    }

    pub fn iter(&self) -> impl Iterator<Item = &ArtifactSource> {
        self.sources.iter()
    }

    /// Checks an artifact URL of a deploy of `application`, as written in its descriptor,
    /// and returns it parsed. Sources that do not serve the application are not named in
    /// the refusal: they are none of its business.
    pub fn check(&self, application: &str, text: &str) -> Result<Url, SourceError> {
        let url = parse_url(text)?;
        if self.contains_url(application, &url) {
            Ok(url)
        } else {
            Err(SourceError::NotInSources(self.describe(application)))
        }
    }

    /// Whether a parsed URL (a redirect's target, say) is under a source serving
    /// `application`.
    pub fn contains_url(&self, application: &str, url: &Url) -> bool {
        self.source_for(application, url).is_some()
    }

    /// The source `url` is fetched from for a deploy of `application`: of those serving
    /// it and containing the URL, the longest prefix (the most specific one, whose
    /// credentials apply).
    pub fn source_for(&self, application: &str, url: &Url) -> Option<&ArtifactSource> {
        self.sources
            .iter()
            .filter(|s| s.serves(application) && s.contains(url))
            .max_by_key(|s| s.url.as_str().len())
    }

    /// Whether a local path, symlinks already resolved, is under a `file://` source
    /// serving `application`. Each source directory is resolved too, so a source that is
    /// itself a symlink still works.
    pub fn contains_path(&self, application: &str, resolved: &Path) -> bool {
        self.sources
            .iter()
            .filter(|s| s.serves(application))
            .filter_map(|s| s.file_dir())
            .any(|dir| {
                let dir = std::fs::canonicalize(&dir).unwrap_or(dir);
                resolved.starts_with(dir)
            })
    }

    fn describe(&self, application: &str) -> String {
        let list: Vec<&str> = self
            .sources
            .iter()
            .filter(|s| s.serves(application))
            .map(ArtifactSource::as_str)
            .collect();
        if list.is_empty() {
            "none is configured for it, so nothing can be fetched".to_owned()
        } else {
            format!("they are {}", list.join(", "))
        }
    }
}

/// Parses and normalises an artifact or source URL, refusing what could mean two things.
fn parse_url(text: &str) -> Result<Url, SourceError> {
    let text = text.trim();
    // The raw text, not the parsed URL: parsing already removed the dot segments.
    let raw_path_has_dots = text
        .split(['?', '#'])
        .next()
        .unwrap_or("")
        .split('/')
        .any(|segment| {
            let lower = segment.to_ascii_lowercase().replace("%2e", ".");
            lower == ".." || lower == "."
        });
    let url = Url::parse(text).map_err(|e| SourceError::NotUrl(e.to_string()))?;
    match url.scheme() {
        "file" | "http" | "https" => {}
        other => return Err(SourceError::Scheme(other.to_owned())),
    }
    if raw_path_has_dots {
        return Err(SourceError::DotDot);
    }
    let lower = url.path().to_ascii_lowercase();
    if let Some(code) = ["%2f", "%5c", "%2e"].iter().find(|c| lower.contains(**c)) {
        return Err(SourceError::EncodedSeparator(code.to_uppercase()));
    }
    if url.scheme() == "file" {
        if let Some(host) = url
            .host_str()
            .filter(|h| !h.is_empty() && *h != "localhost")
        {
            return Err(SourceError::FileHost(host.to_owned()));
        }
        let path = url
            .to_file_path()
            .map_err(|()| SourceError::NotUrl("not an absolute local path".into()))?;
        if path
            .components()
            .any(|c| matches!(c, Component::ParentDir | Component::CurDir))
        {
            return Err(SourceError::DotDot);
        }
    }
    Ok(url)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `check(sources, url, expected)`: `Ok` when the URL is admitted, else a fragment of the
    /// refusal.
    fn check(sources: &[&str], url: &str, expected: Result<(), &str>) {
        let sources = ArtifactSources::parse(sources).expect("valid sources");
        let got = sources.check("acme/web", url);
        match (expected, got) {
            (Ok(()), Ok(_)) => {}
            (Err(fragment), Err(e)) => assert!(
                e.to_string().contains(fragment),
                "{url}: refused with `{e}`, expected it to mention `{fragment}`"
            ),
            (expected, got) => panic!("{url}: expected {expected:?}, got {got:?}"),
        }
    }

    #[test]
    fn urls_under_a_source_are_admitted() {
        let sources = [
            "file:///srv/releases",
            "https://artifacts.example.com/builds/",
        ];
        check(&sources, "file:///srv/releases/app-1.tar", Ok(()));
        check(&sources, "file:///srv/releases/a/b/app%20x.tar", Ok(()));
        check(
            &sources,
            "https://ARTIFACTS.example.com:443/builds/x.tar?sig=1",
            Ok(()),
        );
    }

    #[test]
    fn urls_escaping_their_source_are_refused_after_normalising() {
        let sources = [
            "file:///srv/releases/",
            "https://artifacts.example.com/builds",
        ];
        let cases = [
            ("file:///etc/passwd", "none of artifacts.sources"),
            ("file:///srv/releases/../../etc/shadow", "`..`"),
            ("file:///srv/releases/%2e%2e/etc/shadow", "`..`"),
            ("file:///srv/releases/..%2Fetc/shadow", "percent-encoding"),
            ("file:///srv/releases-evil/x", "none of artifacts.sources"),
            ("file://otherhost/srv/releases/x", "names host"),
            ("https://artifacts.example.com/builds-evil/x", "none of"),
            ("https://artifacts.example.com.evil.net/builds/x", "none of"),
            ("https://artifacts.example.com:8443/builds/x", "none of"),
            ("http://artifacts.example.com/builds/x", "none of"),
            ("https://artifacts.example.com/builds/%2E%2E/admin", "`..`"),
            (
                "https://artifacts.example.com/builds/a%2f..%2fadmin",
                "percent-encoding",
            ),
            ("ftp://artifacts.example.com/builds/x", "scheme `ftp`"),
            ("not a url", "is not a URL"),
        ];
        for (url, fragment) in cases {
            check(&sources, url, Err(fragment));
        }
    }

    #[test]
    fn without_sources_nothing_can_be_fetched() {
        check(
            &[],
            "file:///srv/releases/x",
            Err("none is configured for it"),
        );
    }

    #[test]
    fn a_source_written_as_a_path_is_a_directory_beside_manent_yml() {
        let dir = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(dir.path()).unwrap();
        std::fs::create_dir(root.join("releases")).unwrap();
        let file = root.join("manent.yml");
        std::fs::write(
            &file,
            "artifacts: {sources: [releases, \"https://h/b/\"]}\n",
        )
        .unwrap();
        let config = crate::Config::load(&file, std::iter::empty()).expect("valid");
        let sources = config.artifact_sources();
        let check = |url: &str| sources.check("acme/web", url);
        let inside = format!("file://{}/releases/app.tar", root.display());
        assert!(check(&inside).is_ok(), "{inside} is under ./releases");
        let beside = format!("file://{}/manent.yml", root.display());
        assert!(check(&beside).is_err(), "the directory's parent is not");
        assert!(check("https://h/b/x").is_ok(), "URL entries stay URLs");
    }

    #[test]
    fn a_resolved_path_must_stay_under_a_file_source() {
        let dir = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(dir.path()).unwrap();
        let source = format!("file://{}/", root.display());
        let sources = ArtifactSources::parse(&[source]).unwrap();
        assert!(
            sources.contains_path("acme/web", &root.join("a/b")),
            "a path under the source's root belongs to it"
        );
        assert!(
            !sources.contains_path("acme/web", Path::new("/etc/passwd")),
            "a symlink resolved outside the source is refused"
        );
    }

    #[test]
    fn a_source_scoped_to_applications_serves_only_them_and_names_no_other() {
        let dir = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(dir.path()).unwrap();
        std::fs::create_dir_all(root.join("ml")).unwrap();
        let file = root.join("manent.yml");
        std::fs::write(
            &file,
            "artifacts:\n  sources:\n    - https://shared.example.com/\n    - url: \
             https://ml.example.com/builds/\n      applications: [\"ml/*\"]\n      \
             bearer_token_file: ml-token\n    - {url: ml, applications: [\"ml/*\"]}\n",
        )
        .unwrap();
        let config = crate::Config::load(&file, std::iter::empty()).expect("valid");
        let sources = config.artifact_sources();
        let ml = "https://ml.example.com/builds/model.tar";
        assert!(
            sources.check("ml/trainer", ml).is_ok(),
            "ml/* may fetch from its source"
        );
        let refused = sources
            .check("web/api", ml)
            .expect_err("web/api may not fetch from ml's source");
        assert!(
            refused.to_string().contains("https://shared.example.com/")
                && !refused.to_string().contains("ml.example.com"),
            "the refusal lists web's sources only: {refused}"
        );
        let local = format!("file://{}/ml/model.tar", root.display());
        assert!(
            sources.check("ml/trainer", &local).is_ok(),
            "{local} serves ml/*"
        );
        assert!(
            sources.check("web/api", &local).is_err(),
            "{local} does not serve web"
        );
        assert!(
            !sources.contains_path("web/api", &root.join("ml/model.tar")),
            "nor on the worker, after symlinks"
        );
        let url = Url::parse(ml).unwrap();
        assert_eq!(
            sources
                .source_for("ml/trainer", &url)
                .and_then(|s| s.credentials()),
            Some(&Credentials::Bearer(SecretRef::File(root.join("ml-token")))),
            "the token file is resolved beside manent.yml, and belongs to this source"
        );
        let shared = Url::parse("https://shared.example.com/x").unwrap();
        assert_eq!(
            sources
                .source_for("ml/trainer", &shared)
                .and_then(|s| s.credentials()),
            None,
            "another source gets none"
        );
    }

    #[test]
    fn credentials_cross_the_network_only_over_https() {
        let token = Credentials::Bearer(SecretRef::Env("TOKEN".into()));
        for (url, admitted) in [
            ("https://h.example.com/a/", true),
            ("http://127.0.0.1:8000/a/", true),
            ("http://localhost/a/", true),
            ("http://h.example.com/a/", false),
            ("file:///srv/releases/", false),
        ] {
            let got = ArtifactSource::parse(url)
                .unwrap()
                .with_credentials(token.clone());
            assert_eq!(got.is_ok(), admitted, "{url}: {got:?}");
        }
    }
}
