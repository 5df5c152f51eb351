//! The regular files of a zip archive with their sha256 (`archive::files` reads a zip
//! through it), read with the `zip` crate: entries stored or deflated, each checked against
//! its CRC-32 as it is read. Directories and symbolic links are not files; an archive that
//! cannot be read, or holds an entry it cannot unpack (another method, encryption), lists
//! nothing (`None`): a plan then shows the artifact, not its files.

use std::collections::BTreeMap;

use sha2::{Digest, Sha256};

/// The files of the zip archive `file`, at most `limit` of them.
pub fn files(file: std::fs::File, limit: u64) -> Option<BTreeMap<String, String>> {
    let mut archive = zip::ZipArchive::new(std::io::BufReader::new(file)).ok()?;
    let mut all = BTreeMap::new();
    for index in 0..archive.len() {
        if all.len() as u64 >= limit {
            break;
        }
        let mut entry = archive.by_index(index).ok()?;
        if entry.is_dir() || entry.is_symlink() {
            continue;
        }
        let name = String::from_utf8_lossy(entry.name_raw());
        let name = name.trim_start_matches("./").to_string();
        let mut hasher = Sha256::new();
        std::io::copy(&mut entry, &mut hasher).ok()?;
        all.insert(name, hex::encode(hasher.finalize()));
    }
    Some(all)
}

#[cfg(test)]
mod tests {
    use manent_testkit::zip::{ZipEntry, zip};

    fn listed(bytes: &[u8]) -> Option<Vec<(String, String)>> {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let path = dir.path().join("app.zip");
        std::fs::write(&path, bytes).expect("write the archive");
        super::super::archive::files(&path, 100).map(|f| f.into_iter().collect())
    }

    fn sha(bytes: &[u8]) -> String {
        use sha2::Digest;
        hex::encode(sha2::Sha256::digest(bytes))
    }

    #[test]
    fn a_zip_lists_its_stored_and_deflated_files_but_not_its_directories_nor_links() {
        let text = b"hello hello hello hello".repeat(20);
        let bytes = zip(&[
            ZipEntry::Dir("./bin/"),
            ZipEntry::stored("./bin/app", b"a"),
            ZipEntry::deflated("share/readme.txt", &text),
            ZipEntry::Link {
                name: "bin/latest",
                target: "app",
            },
        ]);
        assert_eq!(
            listed(&bytes),
            Some(vec![
                ("bin/app".to_string(), sha(b"a")),
                ("share/readme.txt".to_string(), sha(&text)),
            ]),
            "the two regular files with the sha256 of their unpacked bytes"
        );
    }

    #[test]
    fn a_zip_cut_short_or_with_another_method_lists_nothing() {
        let whole = zip(&[ZipEntry::stored("a", b"abc")]);
        assert_eq!(
            listed(&whole[..whole.len() - 30]),
            None,
            "no end record: nothing listed, never a guess"
        );
        // The entry marked as bzip2 (method 12) in its local header and the central
        // directory: a method this build does not unpack.
        let mut bzip2 = whole.clone();
        for (signature, at) in [(b"PK\x03\x04", 8), (b"PK\x01\x02", 10)] {
            let header = bzip2
                .windows(4)
                .position(|w| w == signature)
                .expect("the header is in the archive");
            bzip2[header + at..header + at + 2].copy_from_slice(&12u16.to_le_bytes());
        }
        assert_eq!(
            listed(&bzip2),
            None,
            "a method it cannot unpack: nothing listed"
        );
    }
}
