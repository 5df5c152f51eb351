//! Zip archives written for tests (what `plan::archive` reads): each entry stored as given
//! (method 0, stored; or 8, raw deflate already compressed by the caller), with its CRC-32,
//! a local header, a central directory and its end record. No zip64, no encryption.

/// One entry: its name, compression method, the bytes as stored and as unpacked.
pub struct ZipEntry<'a> {
    pub name: &'a str,
    /// 0 (stored) or 8 (deflate).
    pub method: u16,
    pub stored: &'a [u8],
    pub unpacked: &'a [u8],
    /// A symbolic link (its target in `unpacked`), marked so in its Unix mode.
    pub link: bool,
}

impl<'a> ZipEntry<'a> {
    /// A regular file stored as it is.
    pub fn stored(name: &'a str, bytes: &'a [u8]) -> Self {
        ZipEntry {
            name,
            method: 0,
            stored: bytes,
            unpacked: bytes,
            link: false,
        }
    }
}

fn crc32(bytes: &[u8]) -> u32 {
    let mut crc = 0xFFFF_FFFFu32;
    for b in bytes {
        crc ^= u32::from(*b);
        for _ in 0..8 {
            crc = if crc & 1 == 1 {
                (crc >> 1) ^ 0xEDB8_8320
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

/// The bytes of a zip archive holding `entries`, in order.
pub fn zip(entries: &[ZipEntry<'_>]) -> Vec<u8> {
    let mut out = Vec::new();
    let mut central = Vec::new();
    let u16le = |v: &mut Vec<u8>, x: u16| v.extend_from_slice(&x.to_le_bytes());
    let u32le = |v: &mut Vec<u8>, x: u32| v.extend_from_slice(&x.to_le_bytes());
    for e in entries {
        let offset = out.len() as u32;
        let (crc, name) = (crc32(e.unpacked), e.name.as_bytes());
        let fixed = |v: &mut Vec<u8>| {
            u16le(v, 20); // version needed
            u16le(v, 0); // flags
            u16le(v, e.method);
            u32le(v, 0); // time and date
            u32le(v, crc);
            u32le(v, e.stored.len() as u32);
            u32le(v, e.unpacked.len() as u32);
            u16le(v, name.len() as u16);
            u16le(v, 0); // extra
        };
        u32le(&mut out, 0x0403_4b50);
        fixed(&mut out);
        out.extend_from_slice(name);
        out.extend_from_slice(e.stored);
        u32le(&mut central, 0x0201_4b50);
        u16le(&mut central, 0x031e); // made by: Unix
        fixed(&mut central);
        u16le(&mut central, 0); // comment
        u16le(&mut central, 0); // disk
        u16le(&mut central, 0); // internal attributes
        let mode: u32 = if e.link { 0o120777 } else { 0o100644 };
        u32le(&mut central, mode << 16);
        u32le(&mut central, offset);
        central.extend_from_slice(name);
    }
    let at = out.len() as u32;
    out.extend_from_slice(&central);
    u32le(&mut out, 0x0605_4b50);
    u16le(&mut out, 0);
    u16le(&mut out, 0);
    u16le(&mut out, entries.len() as u16);
    u16le(&mut out, entries.len() as u16);
    u32le(&mut out, central.len() as u32);
    u32le(&mut out, at);
    u16le(&mut out, 0);
    out
}
