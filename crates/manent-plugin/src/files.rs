//! Files and directories the worker makes where a plugin writes, or once wrote: never through
//! a link (docs/security.md, "What the worker never trusts"). A confined plugin writes its
//! pass's working directory as the worker's own user; whatever it leaves there (a link to
//! another environment's file, a file where a directory should be) is removed, never
//! followed, before the worker makes anything of its own in its place.

use std::{
    fs::{File, OpenOptions},
    io,
    os::unix::fs::{DirBuilderExt, OpenOptionsExt},
    path::{Component, Path},
};

use rustix::{
    fd::OwnedFd,
    fs::{AtFlags, Mode, OFlags},
    io::Errno,
};

/// `O_NOFOLLOW`, for [`OpenOptionsExt::custom_flags`]: a link at the last component is
/// refused (`ELOOP`), not followed.
pub fn no_follow() -> i32 {
    OFlags::NOFOLLOW.bits() as i32
}

/// Makes `base/relative` a directory of this user only (0700), with every missing directory
/// between, and opens none of `relative`'s components through a link: a link, a file or
/// anything else but a directory found where one of them should be is removed (the link
/// itself, never what it points to) and a directory made in its place. `base` is the
/// worker's own (its parent is no plugin's to write) and is created as an ordinary path.
pub fn private_dir(base: &Path, relative: &Path) -> io::Result<()> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(base)?;
    let mut dir: OwnedFd = rustix::fs::open(
        base,
        OFlags::DIRECTORY | OFlags::RDONLY | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    for component in relative.components() {
        let Component::Normal(name) = component else {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "{} is not a plain relative path under {}",
                    relative.display(),
                    base.display()
                ),
            ));
        };
        dir = child_dir(&dir, name)?;
    }
    Ok(())
}

/// The directory `name` in `parent`, made if missing, opened without following a link; what
/// stands there instead of a directory is removed first (once: a second one means someone is
/// racing the worker, and that is an error).
fn child_dir(parent: &OwnedFd, name: &std::ffi::OsStr) -> io::Result<OwnedFd> {
    let flags = OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::RDONLY | OFlags::CLOEXEC;
    let mut replaced = false;
    loop {
        match rustix::fs::mkdirat(parent, name, Mode::from_raw_mode(0o700)) {
            Ok(()) | Err(Errno::EXIST) => {}
            Err(e) => return Err(e.into()),
        }
        match rustix::fs::openat(parent, name, flags, Mode::empty()) {
            Ok(fd) => return Ok(fd),
            // A link (ELOOP under O_NOFOLLOW; some kernels say ENOTDIR under O_DIRECTORY)
            // or a file: removed as it is, never followed.
            Err(Errno::LOOP | Errno::NOTDIR) if !replaced => {
                rustix::fs::unlinkat(parent, name, AtFlags::empty())?;
                replaced = true;
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// Creates `path` as a new file of this user only (0600), open for writing: a file, a link
/// or anything else already there is refused (`create_new` with `O_NOFOLLOW`), so nothing
/// planted at that name is ever written through.
pub fn create_new(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(no_follow())
        .open(path)
}

/// Opens `path` for reading if it is a regular file, never through a link: a link, a
/// directory or anything else there is `Ok(None)`, as is nothing at all.
pub fn open_regular(path: &Path) -> io::Result<Option<File>> {
    match OpenOptions::new()
        .read(true)
        .custom_flags(no_follow() | OFlags::NONBLOCK.bits() as i32)
        .open(path)
    {
        Ok(file) if file.metadata()?.is_file() => Ok(Some(file)),
        Ok(_) => Ok(None),
        Err(e)
            if e.kind() == io::ErrorKind::NotFound
                || e.raw_os_error() == Some(Errno::LOOP.raw_os_error()) =>
        {
            Ok(None)
        }
        Err(e) => Err(e),
    }
}

/// Removes whatever is at `path` without following a link: a link or a file is unlinked, a
/// directory removed with what it holds (links inside it are removed, not followed: std's
/// `remove_dir_all` opens each level with `O_NOFOLLOW`). Nothing there is not an error.
pub fn remove(path: &Path) -> io::Result<()> {
    let result = match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.is_dir() => std::fs::remove_dir_all(path),
        Ok(_) => std::fs::remove_file(path),
        Err(e) => Err(e),
    };
    match result {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A directory with `outside/secret.yml` (another environment's file) and an empty
    /// `outside/dir`, and a `work` directory a plugin wrote.
    fn site() -> (tempfile::TempDir, std::path::PathBuf, std::path::PathBuf) {
        let root = tempfile::tempdir().unwrap();
        let outside = root.path().join("outside");
        std::fs::create_dir_all(outside.join("dir")).unwrap();
        std::fs::write(outside.join("secret.yml"), "acme's secret").unwrap();
        let work = root.path().join("work");
        std::fs::create_dir(&work).unwrap();
        (root, outside, work)
    }

    fn untouched(outside: &Path) {
        assert_eq!(
            std::fs::read_to_string(outside.join("secret.yml")).unwrap(),
            "acme's secret",
            "the file outside is untouched"
        );
        let entries: Vec<_> = std::fs::read_dir(outside.join("dir"))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert!(
            entries.is_empty(),
            "nothing was made in the directory outside: {entries:?}"
        );
    }

    #[test]
    fn a_private_dir_replaces_links_and_files_on_its_way_and_follows_none() {
        let (_root, outside, work) = site();
        std::os::unix::fs::symlink(outside.join("dir"), work.join(".plugin")).unwrap();
        private_dir(&work, Path::new(".plugin/home")).expect("made in place of the link");
        assert!(
            std::fs::symlink_metadata(work.join(".plugin"))
                .unwrap()
                .is_dir()
                && work.join(".plugin/home").is_dir(),
            "a real directory stands where the link was"
        );
        untouched(&outside);

        std::fs::remove_dir(work.join(".plugin/home")).unwrap();
        std::os::unix::fs::symlink(outside.join("secret.yml"), work.join(".plugin/home")).unwrap();
        std::fs::write(work.join("tmp"), "a file").unwrap();
        private_dir(&work, Path::new(".plugin/home")).expect("a link to a file is replaced");
        private_dir(&work, Path::new("tmp")).expect("a file is replaced");
        assert!(
            work.join(".plugin/home").is_dir() && work.join("tmp").is_dir(),
            "directories stand where the link and the file were"
        );
        untouched(&outside);
        assert!(
            private_dir(&work, Path::new("../outside/dir/x")).is_err(),
            "a path leaving its base is refused"
        );
        untouched(&outside);
    }

    #[test]
    fn a_new_file_is_never_written_through_a_link_and_a_link_is_never_opened_as_a_file() {
        let (_root, outside, work) = site();
        let part = work.join("app.tar.part");
        std::os::unix::fs::symlink(outside.join("secret.yml"), &part).unwrap();
        let error = create_new(&part).expect_err("a link is refused");
        assert_eq!(
            error.kind(),
            io::ErrorKind::AlreadyExists,
            "the link is refused as an existing entry: {error}"
        );
        assert!(
            open_regular(&part).unwrap().is_none(),
            "a link is not opened as a file"
        );
        std::os::unix::fs::symlink(outside.join("dir"), work.join("linked-dir")).unwrap();
        remove(&part).unwrap();
        remove(&work.join("linked-dir")).unwrap();
        assert!(
            std::fs::symlink_metadata(&part).is_err(),
            "the link itself is removed"
        );
        untouched(&outside);
        use std::io::Write;
        create_new(&part)
            .expect("a file is made once the link is gone")
            .write_all(b"evil's artifact")
            .unwrap();
        assert!(
            open_regular(&part).unwrap().is_some(),
            "a regular file opens"
        );
        untouched(&outside);
    }

    #[test]
    fn removing_a_directory_removes_the_links_inside_it_and_not_what_they_point_to() {
        let (_root, outside, work) = site();
        std::os::unix::fs::symlink(outside.join("secret.yml"), work.join("prod.yml")).unwrap();
        std::os::unix::fs::symlink(outside.join("dir"), work.join("dir")).unwrap();
        std::fs::write(outside.join("dir/kept"), "kept").unwrap();
        remove(&work).expect("the directory goes");
        assert!(!work.exists(), "the directory is gone");
        assert_eq!(
            std::fs::read_to_string(outside.join("dir/kept")).unwrap(),
            "kept",
            "the directory linked from inside keeps its files"
        );
        std::fs::remove_file(outside.join("dir/kept")).unwrap();
        untouched(&outside);
    }
}
