//! The regular files of a zip archive with their sha256 (`archive::files` reads a zip
//! through it): the central directory found from its end record, each entry's data from
//! its local header, stored (method 0) or deflated (method 8, with flate2, which manent
//! already uses for gzip). Directories and symbolic links (by their Unix mode) are not
//! files; an archive that is zip64, encrypted, uses another method or cannot be read to
//! its end lists nothing (`None`): a plan then shows the artifact, not its files.

use std::collections::BTreeMap;
use std::io::{Read, Seek, SeekFrom};

use sha2::{Digest, Sha256};

const END: u32 = 0x0605_4b50;
const CENTRAL: u32 = 0x0201_4b50;
const LOCAL: u32 = 0x0403_4b50;
/// The end record (22 bytes) and the longest comment after it.
const END_SEARCH: u64 = 22 + 0xFFFF;

fn u16_at(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_le_bytes(b.get(at..at + 2)?.try_into().ok()?))
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

/// One entry of the central directory that is a regular file.
struct Entry {
    name: String,
    method: u16,
    stored: u64,
    unpacked: u64,
    local: u64,
}

/// The files of the zip archive `file`, at most `limit` of them.
pub fn files(mut file: std::fs::File, limit: u64) -> Option<BTreeMap<String, String>> {
    let mut all = BTreeMap::new();
    for entry in entries(&mut file)? {
        if all.len() as u64 >= limit {
            break;
        }
        file.seek(SeekFrom::Start(entry.local)).ok()?;
        let mut header = [0u8; 30];
        file.read_exact(&mut header).ok()?;
        if u32_at(&header, 0)? != LOCAL {
            return None;
        }
        let skip = u64::from(u16_at(&header, 26)?) + u64::from(u16_at(&header, 28)?);
        file.seek(SeekFrom::Current(i64::try_from(skip).ok()?))
            .ok()?;
        let data = (&mut file).take(entry.stored);
        let mut hasher = Sha256::new();
        let copied = match entry.method {
            0 => std::io::copy(&mut data.take(entry.unpacked), &mut hasher).ok()?,
            8 => {
                let mut inflated = flate2::read::DeflateDecoder::new(data).take(entry.unpacked);
                std::io::copy(&mut inflated, &mut hasher).ok()?
            }
            _ => return None,
        };
        if copied != entry.unpacked {
            return None;
        }
        let name = entry.name.trim_start_matches("./").to_string();
        all.insert(name, hex::encode(hasher.finalize()));
    }
    Some(all)
}

/// The regular files of the central directory, in its order.
fn entries(file: &mut std::fs::File) -> Option<Vec<Entry>> {
    let size = file.seek(SeekFrom::End(0)).ok()?;
    let from = size.saturating_sub(END_SEARCH);
    file.seek(SeekFrom::Start(from)).ok()?;
    let mut tail = Vec::new();
    file.read_to_end(&mut tail).ok()?;
    let end = (0..tail.len().saturating_sub(21))
        .rev()
        .find(|&at| u32_at(&tail, at) == Some(END))?;
    let count = u16_at(&tail, end + 10)?;
    let length = u32_at(&tail, end + 12)?;
    let offset = u32_at(&tail, end + 16)?;
    if count == 0xFFFF || length == 0xFFFF_FFFF || offset == 0xFFFF_FFFF {
        return None; // zip64
    }
    file.seek(SeekFrom::Start(u64::from(offset))).ok()?;
    let mut central = vec![0u8; usize::try_from(length).ok()?];
    file.read_exact(&mut central).ok()?;
    let mut at = 0;
    let mut entries = Vec::new();
    for _ in 0..count {
        if u32_at(&central, at)? != CENTRAL {
            return None;
        }
        let flags = u16_at(&central, at + 8)?;
        let method = u16_at(&central, at + 10)?;
        let stored = u32_at(&central, at + 20)?;
        let unpacked = u32_at(&central, at + 24)?;
        let name_len = usize::from(u16_at(&central, at + 28)?);
        let extra = usize::from(u16_at(&central, at + 30)?);
        let comment = usize::from(u16_at(&central, at + 32)?);
        let made_on_unix = u16_at(&central, at + 4)? >> 8 == 3;
        let mode = u32_at(&central, at + 38)? >> 16;
        let local = u32_at(&central, at + 42)?;
        let name = central.get(at + 46..at + 46 + name_len)?;
        let name = String::from_utf8_lossy(name).to_string();
        at += 46 + name_len + extra + comment;
        if flags & 1 == 1 || stored == 0xFFFF_FFFF || unpacked == 0xFFFF_FFFF {
            return None; // encrypted, or zip64
        }
        let link = made_on_unix && mode & 0o170000 == 0o120000;
        if name.ends_with('/') || link {
            continue;
        }
        entries.push(Entry {
            name,
            method,
            stored: u64::from(stored),
            unpacked: u64::from(unpacked),
            local: u64::from(local),
        });
    }
    Some(entries)
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use manent_testkit::zip::{ZipEntry, zip};

    fn listed(bytes: &[u8]) -> Option<Vec<(String, String)>> {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let path = dir.path().join("app.zip");
        std::fs::write(&path, bytes).unwrap();
        super::super::archive::files(&path, 100).map(|f| f.into_iter().collect())
    }

    fn sha(bytes: &[u8]) -> String {
        use sha2::Digest;
        hex::encode(sha2::Sha256::digest(bytes))
    }

    #[test]
    fn a_zip_lists_its_stored_and_deflated_files_but_not_its_directories_nor_links() {
        let text = b"hello hello hello hello".repeat(20);
        let mut deflate =
            flate2::write::DeflateEncoder::new(Vec::new(), flate2::Compression::best());
        deflate.write_all(&text).unwrap();
        let deflated = deflate.finish().unwrap();
        let bytes = zip(&[
            ZipEntry::stored("./bin/", b""),
            ZipEntry::stored("./bin/app", b"a"),
            ZipEntry {
                name: "share/readme.txt",
                method: 8,
                stored: &deflated,
                unpacked: &text,
                link: false,
            },
            ZipEntry {
                link: true,
                ..ZipEntry::stored("bin/latest", b"app")
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
        let bzip2 = zip(&[ZipEntry {
            method: 12,
            ..ZipEntry::stored("a", b"abc")
        }]);
        assert_eq!(
            listed(&bzip2),
            None,
            "a method it cannot unpack: nothing listed"
        );
    }
}
