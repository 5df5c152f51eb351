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

use crate::yaml;

/// `artifacts`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ArtifactsConfig {
    /// The URL prefixes deploys may fetch from (`file:///srv/releases/`,
    /// `https://artifacts.example.com/builds/`); an entry without `scheme://` is a local
    /// directory, relative to `manent.yml`. Without any, nothing can be fetched.
    #[serde(deserialize_with = "yaml::nullable")]
    pub sources: Vec<String>,
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
        "is under none of artifacts.sources in manent.yml ({0}); an operator adds its prefix there"
    )]
    NotInSources(String),
}

/// One `artifacts.sources` entry, parsed: its path always ends with `/`, so
/// `https://h/builds` never admits `https://h/builds-evil/`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArtifactSource {
    url: Url,
}

impl ArtifactSource {
    /// Parses a source prefix. A missing trailing `/` is added: a prefix is a directory.
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
        Ok(ArtifactSource { url })
    }

    /// The normalised prefix, as shown in messages.
    pub fn as_str(&self) -> &str {
        self.url.as_str()
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

/// All of `artifacts.sources`, parsed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ArtifactSources {
    sources: Vec<ArtifactSource>,
}

impl ArtifactSources {
    /// Parses every entry; the first bad one is an error naming its index.
    pub fn parse<S: AsRef<str>>(entries: &[S]) -> Result<Self, (usize, SourceError)> {
        let sources = entries
            .iter()
            .enumerate()
            .map(|(i, s)| ArtifactSource::parse(s.as_ref()).map_err(|e| (i, e)))
            .collect::<Result<_, _>>()?;
        Ok(ArtifactSources { sources })
    }

    pub fn is_empty(&self) -> bool {
        self.sources.is_empty()
    }

    pub fn iter(&self) -> impl Iterator<Item = &ArtifactSource> {
        self.sources.iter()
    }

    /// Checks an artifact URL as written in a descriptor and returns it parsed.
    pub fn check(&self, text: &str) -> Result<Url, SourceError> {
        let url = parse_url(text)?;
        if self.contains_url(&url) {
            Ok(url)
        } else {
            Err(SourceError::NotInSources(self.describe()))
        }
    }

    /// Whether a parsed URL (a redirect's target, say) is under a source.
    pub fn contains_url(&self, url: &Url) -> bool {
        self.sources.iter().any(|s| s.contains(url))
    }

    /// Whether a local path, symlinks already resolved, is under a `file://` source. Each
    /// source directory is resolved too, so a source that is itself a symlink still works.
    pub fn contains_path(&self, resolved: &Path) -> bool {
        self.sources.iter().filter_map(|s| s.file_dir()).any(|dir| {
            let dir = std::fs::canonicalize(&dir).unwrap_or(dir);
            resolved.starts_with(dir)
        })
    }

    fn describe(&self) -> String {
        if self.sources.is_empty() {
            "none is configured, so nothing can be fetched".to_owned()
        } else {
            let list: Vec<&str> = self.sources.iter().map(ArtifactSource::as_str).collect();
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
        let got = sources.check(url);
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
        check(&[], "file:///srv/releases/x", Err("none is configured"));
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
        let inside = format!("file://{}/releases/app.tar", root.display());
        assert!(
            sources.check(&inside).is_ok(),
            "{inside} is under ./releases"
        );
        let beside = format!("file://{}/manent.yml", root.display());
        assert!(
            sources.check(&beside).is_err(),
            "the directory's parent is not"
        );
        assert!(
            sources.check("https://h/b/x").is_ok(),
            "URL entries stay URLs"
        );
    }

    #[test]
    fn a_resolved_path_must_stay_under_a_file_source() {
        let dir = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(dir.path()).unwrap();
        let source = format!("file://{}/", root.display());
        let sources = ArtifactSources::parse(&[source]).unwrap();
        assert!(sources.contains_path(&root.join("a/b")));
        assert!(
            !sources.contains_path(Path::new("/etc/passwd")),
            "a symlink resolved outside the source is refused"
        );
    }
}
