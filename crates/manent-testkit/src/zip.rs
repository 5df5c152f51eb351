//! Zip archives written for tests (what `plan::archive` reads), with the `zip` crate: regular
//! files stored or deflated, directories and symbolic links as a Unix `zip` writes them.

use std::io::Write;

use zip::CompressionMethod;
use zip::write::SimpleFileOptions;

/// One entry of a test archive.
pub enum ZipEntry<'a> {
    /// A regular file, stored as it is or deflated.
    File {
        name: &'a str,
        bytes: &'a [u8],
        deflated: bool,
    },
    /// A directory (its name ends in `/` in the archive).
    Dir(&'a str),
    /// A symbolic link to `target`.
    Link { name: &'a str, target: &'a str },
}

impl<'a> ZipEntry<'a> {
    /// A regular file stored as it is.
    pub fn stored(name: &'a str, bytes: &'a [u8]) -> Self {
        ZipEntry::File {
            name,
            bytes,
            deflated: false,
        }
    }

    /// A regular file deflated.
    pub fn deflated(name: &'a str, bytes: &'a [u8]) -> Self {
        ZipEntry::File {
            name,
            bytes,
            deflated: true,
        }
    }
}

/// The bytes of a zip archive holding `entries`, in order.
pub fn zip(entries: &[ZipEntry<'_>]) -> Vec<u8> {
    let mut writer = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
    let stored = SimpleFileOptions::default().compression_method(CompressionMethod::Stored);
    for entry in entries {
        match entry {
            ZipEntry::File {
                name,
                bytes,
                deflated,
            } => {
                let method = if *deflated {
                    CompressionMethod::Deflated
                } else {
                    CompressionMethod::Stored
                };
                let options = stored.compression_method(method).unix_permissions(0o644);
                writer
                    .start_file(*name, options)
                    .expect("start a zip entry");
                writer.write_all(bytes).expect("write a zip entry");
            }
            ZipEntry::Dir(name) => writer
                .add_directory(*name, stored)
                .expect("add a zip directory"),
            ZipEntry::Link { name, target } => writer
                .add_symlink(*name, *target, stored)
                .expect("add a zip symbolic link"),
        }
    }
    writer
        .finish()
        .expect("finish the zip archive")
        .into_inner()
}
