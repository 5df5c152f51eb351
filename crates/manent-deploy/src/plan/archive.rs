//! The regular files of an artifact that is a tar archive (plain or gzip-compressed) or a
//! zip archive (entries stored or deflated; not zip64, not encrypted), recognised by its
//! bytes, not its name, each with its sha256, by its path inside the archive (`./`
//! dropped): what `activate` would unpack into the release, compared by a plan with the
//! live release's manifest. Any other artifact has no files here.

use std::collections::BTreeMap;
use std::io::{Read, Seek};
use std::path::Path;

use sha2::{Digest, Sha256};

/// The files of the archive at `path`, at most `limit` of them; `None` when it is not a
/// tar archive (or one that cannot be read to its end).
pub fn files(path: &Path, limit: u64) -> Option<BTreeMap<String, String>> {
    let mut file = std::fs::File::open(path).ok()?;
    let mut head = [0u8; 512];
    let read = file.read(&mut head).ok()?;
    file.rewind().ok()?;
    if read >= 2 && head[..2] == [0x1f, 0x8b] {
        list(tar::Archive::new(flate2::read::GzDecoder::new(file)), limit)
    } else if read >= 262 && &head[257..262] == b"ustar" {
        list(tar::Archive::new(file), limit)
    } else if read >= 4 && head[..4] == *b"PK\x03\x04" {
        super::zip::files(file, limit)
    } else {
        None
    }
}

fn list<R: Read>(mut archive: tar::Archive<R>, limit: u64) -> Option<BTreeMap<String, String>> {
    let mut files = BTreeMap::new();
    for entry in archive.entries().ok()? {
        let mut entry = entry.ok()?;
        if entry.header().entry_type() != tar::EntryType::Regular {
            continue;
        }
        if files.len() as u64 >= limit {
            break;
        }
        let path = entry.path().ok()?.to_string_lossy().to_string();
        let path = path.trim_start_matches("./").to_string();
        let mut hasher = Sha256::new();
        std::io::copy(&mut entry, &mut hasher).ok()?;
        files.insert(path, hex::encode(hasher.finalize()));
    }
    Some(files)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gzipped_tar_lists_its_files_and_anything_else_lists_none() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let path = dir.path().join("app.tar.gz");
        let gz = flate2::write::GzEncoder::new(
            std::fs::File::create(&path).unwrap(),
            flate2::Compression::fast(),
        );
        let mut builder = tar::Builder::new(gz);
        let mut header = tar::Header::new_gnu();
        header.set_size(1);
        header.set_mode(0o644);
        header.set_cksum();
        builder
            .append_data(&mut header, "./bin/app", &b"a"[..])
            .unwrap();
        builder.into_inner().unwrap().finish().unwrap();
        let listed = files(&path, 100).expect("a tar.gz is listed");
        assert_eq!(
            listed.get("bin/app").map(String::as_str),
            Some("ca978112ca1bbdcafac231b39a23dc4da786eff8147c4e72b9807785afee48bb"),
            "its one file with the sha256 of `a`: {listed:?}"
        );
        let plain = dir.path().join("app.bin");
        std::fs::write(&plain, "not an archive").unwrap();
        assert_eq!(files(&plain, 100), None, "a plain file has no files");
    }
}
