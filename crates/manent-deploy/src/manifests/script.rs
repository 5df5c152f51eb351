//! The one command that lists a release on a target (docs/plan-and-drift.md, "What it
//! costs a target"): `find` for regular files and links (never following a symbolic link),
//! `sha256sum` over the files in as few processes as `xargs` needs, `readlink` for each
//! link and for the live link; everything NUL-separated, so that no name (a newline, a
//! space, a backslash) is misread. Reading what it printed into a [`Snapshot`].

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// The most regular files a manifest lists. A release holding more is recorded as too
/// large (its links still are), and drift says `unknown` for its files: hashing it would
/// cost the target more than a check should (docs/plan-and-drift.md).
pub const MAX_FILES: u64 = 20_000;

/// What a release directory held, as the listing command found it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Snapshot {
    /// The release directory is missing (or is a symbolic link, which is not followed).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub release_missing: bool,
    /// More regular files than [`MAX_FILES`]: how many; `files` is then empty.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub too_many_files: Option<u64>,
    /// Each regular file's sha256, by its path relative to the release directory.
    #[serde(default)]
    pub files: BTreeMap<String, String>,
    /// Each symbolic link under the release directory, by relative path: where it points.
    #[serde(default)]
    pub links: BTreeMap<String, String>,
    /// Each live link found ([`super::live_link_paths`]), by absolute path: where it points.
    #[serde(default)]
    pub live_links: BTreeMap<String, String>,
}

/// The shell script that lists `release` and the `live_links` candidates on a target.
pub fn listing(release: &str, live_links: &[String]) -> String {
    let release = manent_ssh::shell_quote(release);
    let candidates: Vec<String> = live_links
        .iter()
        .map(|l| manent_ssh::shell_quote(l))
        .collect();
    format!(
        "release={release}\n\
         if [ -L \"$release\" ] || [ ! -d \"$release\" ]; then\n\
         \x20 printf 'R\\0'\n\
         elif cd -- \"$release\"; then\n\
         \x20 n=$(find . -type f -print0 | tr -cd '\\000' | wc -c)\n\
         \x20 if [ \"$n\" -gt {MAX_FILES} ]; then printf 'T %s\\0' \"$n\"\n\
         \x20 else find . -type f -print0 | xargs -0r sha256sum --zero --\n\
         \x20 fi\n\
         \x20 find . -type l -print0 | xargs -0r sh -c 'for l; do printf \"L %s\\0%s\\0\" \"$l\" \"$(readlink -- \"$l\")\"; done' sh\n\
         else exit 1\n\
         fi\n\
         for w in {candidates}; do\n\
         \x20 if [ -L \"$w\" ]; then printf 'W %s\\0%s\\0' \"$w\" \"$(readlink -- \"$w\")\"; fi\n\
         done\n\
         exit 0\n",
        candidates = if candidates.is_empty() {
            "''".to_string()
        } else {
            candidates.join(" ")
        },
    )
}

/// Why a listing could not be read.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ListingError {
    #[error("the release listing printed an entry manent cannot read: {0:?}")]
    Unreadable(String),
}

/// Reads what [`listing`] printed.
pub fn parse(stdout: &str) -> Result<Snapshot, ListingError> {
    let mut snapshot = Snapshot::default();
    let mut fields = stdout.split('\0');
    let relative = |path: &str| path.strip_prefix("./").unwrap_or(path).to_string();
    while let Some(field) = fields.next() {
        if field.is_empty() {
            continue;
        }
        if field == "R" {
            snapshot.release_missing = true;
        } else if let Some(n) = field.strip_prefix("T ") {
            let n = n
                .trim()
                .parse()
                .map_err(|_| ListingError::Unreadable(field.into()))?;
            snapshot.too_many_files = Some(n);
        } else if let Some(path) = field.strip_prefix("L ") {
            let to = fields.next().unwrap_or_default();
            snapshot.links.insert(relative(path), to.to_string());
        } else if let Some(path) = field.strip_prefix("W ") {
            let to = fields.next().unwrap_or_default();
            snapshot.live_links.insert(path.to_string(), to.to_string());
        } else {
            // `sha256sum --zero`: `<64 hex>  ./path` (a space and ` ` or `*`), never escaped.
            let (sum, rest) = field
                .split_at_checked(64)
                .filter(|(sum, rest)| sum.bytes().all(|b| b.is_ascii_hexdigit()) && rest.len() > 2)
                .ok_or_else(|| ListingError::Unreadable(field.into()))?;
            snapshot.files.insert(relative(&rest[2..]), sum.to_string());
        }
    }
    Ok(snapshot)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The script on this machine's shell over a directory with odd names, a link inside,
    /// and a live link beside it: every name read back as it is.
    #[test]
    fn a_listing_reads_back_every_name_and_link_as_it_is() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let release = dir.path().join("1.0");
        std::fs::create_dir_all(release.join("sub dir")).unwrap();
        std::fs::write(release.join("a.txt"), "a").unwrap();
        std::fs::write(release.join("sub dir/new\nline"), "b").unwrap();
        std::os::unix::fs::symlink("a.txt", release.join("link")).unwrap();
        let current = dir.path().join("current");
        std::os::unix::fs::symlink(&release, &current).unwrap();
        let script = listing(
            &release.display().to_string(),
            &[current.display().to_string(), "/nonexistent/current".into()],
        );
        let out = std::process::Command::new("sh")
            .arg("-c")
            .arg(&script)
            .output()
            .expect("sh runs");
        assert!(out.status.success(), "the script succeeds: {out:?}");
        let snapshot = parse(&String::from_utf8_lossy(&out.stdout)).expect("it reads back");
        let files: Vec<&String> = snapshot.files.keys().collect();
        assert_eq!(
            files,
            ["a.txt", "sub dir/new\nline"],
            "both files: {snapshot:?}"
        );
        assert_eq!(
            snapshot.files["a.txt"],
            "ca978112ca1bbdcafac231b39a23dc4da786eff8147c4e72b9807785afee48bb",
            "the sha256 of `a`"
        );
        assert_eq!(
            snapshot.links.get("link").map(String::as_str),
            Some("a.txt")
        );
        assert_eq!(
            snapshot.live_links.get(&current.display().to_string()),
            Some(&release.display().to_string()),
            "the live link and where it points: {snapshot:?}"
        );
        let gone = std::process::Command::new("sh")
            .arg("-c")
            .arg(listing(&dir.path().join("2.0").display().to_string(), &[]))
            .output()
            .expect("sh runs");
        let gone = parse(&String::from_utf8_lossy(&gone.stdout)).expect("it reads back");
        assert!(gone.release_missing, "a missing release says so: {gone:?}");
    }
}
