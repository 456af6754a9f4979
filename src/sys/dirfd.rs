//! The one file layer for anything a tenant can name: every open, read, listing, walk step and
//! delete below a volume directory or a root (a hostPath root, an NFS export) that root makes
//! goes through these descriptor-relative functions, over `nix`/`rustix`. The marked-directory
//! library ([`crate::provision::storage::volumedir`]), clones ([`crate::provision::storage::cloning::copy`]), the
//! NFS provisioner and the project quotas are its callers; `tests/suite/lints.rs` fails if a
//! module of the provisioner opens, reads or lists a file by other means.
//!
//! Safety rules (a pod owns everything inside its volume: it can plant symlinks, hard links,
//! FIFOs and device nodes there and swap them with `renameat2(RENAME_EXCHANGE)` between any two
//! of our calls):
//! - every open below a directory descriptor resolves with `RESOLVE_NO_SYMLINKS |
//!   RESOLVE_BENEATH` (a symlink anywhere in `name`, or `..` out of the directory, fails instead
//!   of being followed); a child directory and a file to read are opened also with
//!   `RESOLVE_NO_XDEV` (a mount point there answers `EXDEV`);
//! - a file is read only through [`open_regular`]: opened `O_PATH` first (which runs no driver's
//!   `open`: a planted device node such as a watchdog is never opened), its type checked with
//!   `fstat` (a regular file, nothing else) and, where the caller saw it before, its `(dev, ino)`;
//!   only then reopened for reading, `O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC`, and checked
//!   again to be the same inode. So a FIFO never blocks us and a device is never read;
//! - reads are bounded: [`read_small`] reads at most the size its caller allows (a marker or a
//!   record is a few KiB); a copy reads at most the size `lstat` gave ([`crate::provision::storage::cloning::copy`]);
//!   nothing here reads "to EOF" from anything but a regular file it has verified;
//! - stats never follow a symlink, and [`rename_noreplace`] never replaces anything but (where the
//!   kernel cannot do it atomically) an empty directory — see its doc.
//!
//! Caller contract: errors are returned as the kernel gave them (`nix::Error`, or rustix's
//! `Errno` for `statx` and the flags ioctl), or as a [`SafeError`] that says what was found
//! instead of what was expected, for the caller to turn into a message; nothing here logs or
//! retries.

use nix::NixPath;
use nix::fcntl::{AtFlags, OFlag, OpenHow, RenameFlags, ResolveFlag, openat2, renameat, renameat2};
use nix::sys::stat::{FileStat, Mode};
use nix::unistd::{UnlinkatFlags, linkat, unlinkat};
use std::ffi::{OsStr, OsString};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// Opens the directory `path` (canonical) with no symlink anywhere in it.
pub(crate) fn open_dir(path: &Path) -> nix::Result<OwnedFd> {
    super::paths::open_dir_nofollow(path)
}

/// Opens the directory `name` inside `dir`: no symlink, not outside `dir`, and not across a mount
/// point (`EXDEV` when `name` is one).
pub(crate) fn open_child_dir<P: ?Sized + NixPath>(
    dir: &impl AsFd,
    name: &P,
) -> nix::Result<OwnedFd> {
    let how = OpenHow::new()
        .flags(OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC | OFlag::O_NOFOLLOW)
        .resolve(
            ResolveFlag::RESOLVE_NO_SYMLINKS
                | ResolveFlag::RESOLVE_BENEATH
                | ResolveFlag::RESOLVE_NO_XDEV,
        );
    openat2(dir.as_fd(), name, how)
}

/// Why a name a tenant controls was not opened or read as asked.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum SafeError {
    /// The kernel's answer (`ENOENT`, `ELOOP` for a symlink, `EXDEV` for a mount point, ...).
    #[error("{0}")]
    Sys(#[from] nix::Error),
    /// Something other than the kind asked for is there (a FIFO, a device node, a socket...).
    #[error("it is a {found}, not a {wanted}")]
    WrongType {
        /// What is there.
        found: &'static str,
        /// What was asked for.
        wanted: &'static str,
    },
    /// It is not the inode the caller saw before: it was replaced meanwhile.
    #[error("it was replaced while flexvol worked on it")]
    Replaced,
    /// It holds more than the caller allows.
    #[error("it is larger than {max} bytes")]
    TooLarge {
        /// The bound.
        max: u64,
    },
}

/// What a `st_mode` says an entry is, for messages.
pub(crate) fn kind_name(mode: u32) -> &'static str {
    match mode & nix::libc::S_IFMT {
        nix::libc::S_IFREG => "regular file",
        nix::libc::S_IFDIR => "directory",
        nix::libc::S_IFLNK => "symlink",
        nix::libc::S_IFIFO => "FIFO",
        nix::libc::S_IFSOCK => "socket",
        nix::libc::S_IFBLK => "block device",
        nix::libc::S_IFCHR => "character device",
        _ => "file of unknown type",
    }
}

/// Opens the regular file `name` inside `dir` for reading: no symlink anywhere, not outside
/// `dir`, not across a mount; never opening anything but a regular file (see the module's safety
/// rules: `O_PATH`, `fstat`, then a checked reopen with `O_NONBLOCK | O_NOCTTY`); and, with
/// `expect`, only the very inode `(dev, ino)` the caller saw ([`SafeError::Replaced`] otherwise).
pub(crate) fn open_regular<P: ?Sized + NixPath>(
    dir: &impl AsFd,
    name: &P,
    expect: Option<(u64, u64)>,
) -> Result<OwnedFd, SafeError> {
    let how = OpenHow::new()
        .flags(OFlag::O_PATH | OFlag::O_CLOEXEC | OFlag::O_NOFOLLOW)
        .resolve(
            ResolveFlag::RESOLVE_NO_SYMLINKS
                | ResolveFlag::RESOLVE_BENEATH
                | ResolveFlag::RESOLVE_NO_XDEV,
        );
    let path = openat2(dir.as_fd(), name, how)?;
    let st = stat(&path)?;
    if st.st_mode & nix::libc::S_IFMT != nix::libc::S_IFREG {
        return Err(SafeError::WrongType {
            found: kind_name(st.st_mode),
            wanted: "regular file",
        });
    }
    let id = (st.st_dev, st.st_ino);
    if expect.is_some_and(|want| want != id) {
        return Err(SafeError::Replaced);
    }
    // The O_PATH descriptor pins the inode checked above: reopening it through its /proc entry
    // opens that inode, whatever the name points at now.
    let fd = nix::fcntl::open(
        super::paths::fd_path(&path).as_path(),
        OFlag::O_RDONLY | OFlag::O_NONBLOCK | OFlag::O_NOCTTY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )?;
    let again = stat(&fd)?;
    if (again.st_dev, again.st_ino) != id || again.st_mode & nix::libc::S_IFMT != nix::libc::S_IFREG
    {
        return Err(SafeError::Replaced);
    }
    Ok(fd)
}

/// Reads the small regular file `name` inside `dir` ([`open_regular`]'s rules), at most `max`
/// bytes ([`SafeError::TooLarge`] past that); `Ok(None)` when it is absent.
pub(crate) fn read_small<P: ?Sized + NixPath>(
    dir: &impl AsFd,
    name: &P,
    max: u64,
) -> Result<Option<Vec<u8>>, SafeError> {
    let fd = match open_regular(dir, name, None) {
        Ok(fd) => fd,
        Err(SafeError::Sys(nix::Error::ENOENT)) => return Ok(None),
        Err(e) => return Err(e),
    };
    let mut data = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let n = nix::unistd::read(&fd, &mut buf)?;
        if n == 0 {
            return Ok(Some(data));
        }
        data.extend_from_slice(buf.get(..n).unwrap_or_default());
        if u64::try_from(data.len()).unwrap_or(u64::MAX) > max {
            return Err(SafeError::TooLarge { max });
        }
    }
}

/// Opens the directory `name` inside `dir` ([`open_child_dir`]'s rules), only when it is the
/// very inode `(dev, ino)` the caller saw ([`SafeError::Replaced`] otherwise).
pub(crate) fn open_child_dir_as<P: ?Sized + NixPath>(
    dir: &impl AsFd,
    name: &P,
    expect: (u64, u64),
) -> Result<OwnedFd, SafeError> {
    let fd = open_child_dir(dir, name)?;
    if dev_ino(&fd)? != expect {
        return Err(SafeError::Replaced);
    }
    Ok(fd)
}

/// The names in the open directory `dir`, without `.` and `..`, sorted. Read through a duplicate
/// of the descriptor rewound to its start (so a directory can be listed twice), never through a
/// path: whatever its name points at now does not matter.
pub(crate) fn list(dir: &impl AsFd) -> nix::Result<Vec<OsString>> {
    let dup = rustix::io::fcntl_dupfd_cloexec(dir, 0).map_err(rx)?;
    rustix::fs::seek(&dup, rustix::fs::SeekFrom::Start(0)).map_err(rx)?;
    let d = rustix::fs::Dir::new(dup).map_err(rx)?;
    let mut out = Vec::new();
    for e in d {
        let e = e.map_err(rx)?;
        let n = e.file_name().to_bytes();
        if n != b"." && n != b".." {
            out.push(OsStr::from_bytes(n).to_owned());
        }
    }
    out.sort();
    Ok(out)
}

/// A rustix error as nix's (the same errno).
pub(crate) fn rx(e: rustix::io::Errno) -> nix::Error {
    nix::Error::from_raw(e.raw_os_error())
}

/// Creates the file `name` inside `dir` for writing with `mode`; `EEXIST` when anything is there.
pub(crate) fn create_new_file<P: ?Sized + NixPath>(
    dir: &impl AsFd,
    name: &P,
    mode: u32,
) -> nix::Result<OwnedFd> {
    let how = OpenHow::new()
        .flags(OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_WRONLY | OFlag::O_CLOEXEC)
        .mode(Mode::from_bits_truncate(mode))
        .resolve(ResolveFlag::RESOLVE_NO_SYMLINKS | ResolveFlag::RESOLVE_BENEATH);
    openat2(dir.as_fd(), name, how)
}

/// Makes the directory `name` inside `dir` with `mode` (less the umask).
pub(crate) fn mkdir<P: ?Sized + NixPath>(dir: &impl AsFd, name: &P, mode: u32) -> nix::Result<()> {
    nix::sys::stat::mkdirat(dir, name, Mode::from_bits_truncate(mode))
}

/// Makes the directory `path` with `mode` (less the umask).
pub(crate) fn mkdir_path(path: &Path, mode: u32) -> nix::Result<()> {
    nix::unistd::mkdir(path, Mode::from_bits_truncate(mode))
}

/// Renames `from` in `from_dir` to `to` in `to_dir` (`renameat`: replaces an empty directory or a
/// file at `to`; a non-empty directory there fails).
pub(crate) fn rename<P1: ?Sized + NixPath, P2: ?Sized + NixPath>(
    from_dir: &impl AsFd,
    from: &P1,
    to_dir: &impl AsFd,
    to: &P2,
) -> nix::Result<()> {
    renameat(from_dir, from, to_dir, to)
}

/// Renames `from` to `to` in `dir` without ever replacing anything: `renameat2(RENAME_NOREPLACE)`.
/// Where the filesystem does not support it (NFS answers `EINVAL`), a plain `rename` after
/// checking the target is absent: in the window between the check and the rename, rename(2) can
/// replace only an *empty* directory (a non-empty one fails, a file fails with `ENOTDIR`, a mount
/// point with `EBUSY`). Replacing an empty directory loses no data, and detaches it from the
/// name: whoever made it (and has it mounted) keeps the old, empty inode and never sees the
/// volume. `EEXIST`/`ENOTEMPTY`/`ENOTDIR`: something is there.
pub(crate) fn rename_noreplace(dir: &OwnedFd, from: &str, to: &OsStr) -> nix::Result<()> {
    match renameat2(dir, from, dir, to, RenameFlags::RENAME_NOREPLACE) {
        Err(nix::Error::EINVAL | nix::Error::ENOSYS) => {
            match nix::sys::stat::fstatat(dir, to, AtFlags::AT_SYMLINK_NOFOLLOW) {
                Ok(_) => Err(nix::Error::EEXIST),
                Err(nix::Error::ENOENT) => renameat(dir, from, dir, to),
                Err(e) => Err(e),
            }
        }
        r => r,
    }
}

/// Hard-links `from` to `to` in `dir` (no symlink followed); `EEXIST` when `to` exists — the first
/// link wins, on NFS too.
pub(crate) fn link(dir: &impl AsFd, from: &str, to: &str) -> nix::Result<()> {
    linkat(dir, from, dir, to, AtFlags::empty())
}

/// Removes the file (or symlink) `name` in `dir`.
pub(crate) fn unlink<P: ?Sized + NixPath>(dir: &impl AsFd, name: &P) -> nix::Result<()> {
    unlinkat(dir, name, UnlinkatFlags::NoRemoveDir)
}

/// Removes the empty directory `name` in `dir`.
pub(crate) fn rmdir<P: ?Sized + NixPath>(dir: &impl AsFd, name: &P) -> nix::Result<()> {
    unlinkat(dir, name, UnlinkatFlags::RemoveDir)
}

/// `fstat` of an open file.
pub(crate) fn stat(fd: &impl AsFd) -> nix::Result<FileStat> {
    nix::sys::stat::fstat(fd.as_fd())
}

/// `fstatat` of `name` in `dir`, not following a symlink.
pub(crate) fn stat_at<P: ?Sized + NixPath>(dir: &impl AsFd, name: &P) -> nix::Result<FileStat> {
    nix::sys::stat::fstatat(dir, name, AtFlags::AT_SYMLINK_NOFOLLOW)
}

/// The device and inode of an open file.
pub(crate) fn dev_ino(fd: &impl AsFd) -> nix::Result<(u64, u64)> {
    let st = stat(fd)?;
    Ok((st.st_dev, st.st_ino))
}

/// Sets the mode of an open file (no umask).
pub(crate) fn chmod(fd: &impl AsFd, mode: u32) -> nix::Result<()> {
    nix::sys::stat::fchmod(fd, Mode::from_bits_truncate(mode))
}

/// Flushes an open file or directory to its device.
pub(crate) fn sync(fd: &impl AsFd) -> nix::Result<()> {
    nix::unistd::fsync(fd)
}

/// What `statx` says of an entry, not following a symlink nor triggering an automount.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Entry {
    /// It is a directory.
    pub(crate) is_dir: bool,
    /// Its device (major, minor).
    pub(crate) dev: (u32, u32),
    /// It is the root of a mount (statx's mount-root attribute, where the kernel reports it).
    pub(crate) mount_root: bool,
}

/// `statx` of `name` in `dir`; `None` when it is gone.
pub(crate) fn entry(dir: &impl AsFd, name: &OsStr) -> rustix::io::Result<Option<Entry>> {
    use rustix::fs::{AtFlags as RAt, StatxAttributes, StatxFlags};
    let st = match rustix::fs::statx(
        dir,
        name,
        RAt::SYMLINK_NOFOLLOW | RAt::NO_AUTOMOUNT,
        StatxFlags::TYPE | StatxFlags::INO,
    ) {
        Ok(st) => st,
        Err(rustix::io::Errno::NOENT) => return Ok(None),
        Err(e) => return Err(e),
    };
    Ok(Some(Entry {
        is_dir: u32::from(st.stx_mode) & nix::libc::S_IFMT == nix::libc::S_IFDIR,
        dev: (st.stx_dev_major, st.stx_dev_minor),
        mount_root: st.stx_attributes_mask.contains(StatxAttributes::MOUNT_ROOT)
            && st.stx_attributes.contains(StatxAttributes::MOUNT_ROOT),
    }))
}

/// The device (major, minor) of an open directory, as [`entry`] reports devices.
pub(crate) fn fs_dev(fd: &impl AsFd) -> rustix::io::Result<(u32, u32)> {
    rustix::fs::statx(
        fd,
        "",
        rustix::fs::AtFlags::EMPTY_PATH,
        rustix::fs::StatxFlags::INO,
    )
    .map(|st| (st.stx_dev_major, st.stx_dev_minor))
}

/// Free bytes for unprivileged users on the filesystem of `path` (`statvfs`), `None` when it
/// cannot be read.
pub(crate) fn free_bytes(path: &Path) -> Option<u64> {
    nix::sys::statvfs::statvfs(path)
        .ok()
        .map(|s| s.blocks_available().saturating_mul(s.fragment_size()))
}

/// The filesystems `statfs` tells apart for project quotas.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FsMagic {
    /// XFS.
    Xfs,
    /// ext4.
    Ext4,
    /// Anything else.
    Other,
}

/// What `statfs` says of the filesystem holding `path`: its kind and block size (`None` when the
/// kernel's value does not fit).
pub(crate) fn statfs(path: &Path) -> nix::Result<(FsMagic, Option<u64>)> {
    let st = nix::sys::statfs::statfs(path)?;
    let magic = if st.filesystem_type() == nix::sys::statfs::XFS_SUPER_MAGIC {
        FsMagic::Xfs
    } else if st.filesystem_type() == nix::sys::statfs::EXT4_SUPER_MAGIC {
        FsMagic::Ext4
    } else {
        FsMagic::Other
    };
    Ok((magic, u64::try_from(st.block_size()).ok()))
}

/// Opens the directory `path` for reading its flags (`O_NOFOLLOW`: a symlink as the last
/// component fails).
pub(crate) fn open_dir_for_flags(path: &Path) -> nix::Result<OwnedFd> {
    nix::fcntl::open(
        path,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
}

/// Whether the open directory has the project-inherit flag (`FS_IOC_GETFLAGS`).
pub(crate) fn project_inherit(fd: &impl AsFd) -> rustix::io::Result<bool> {
    rustix::fs::ioctl_getflags(fd).map(|f| f.contains(rustix::fs::IFlags::PROJECT_INHERIT))
}

/// Gives the open directory the project-inherit flag (`FS_IOC_GETFLAGS`, then `FS_IOC_SETFLAGS`
/// with the other flags as they were); nothing is written when it has it already.
pub(crate) fn set_project_inherit(fd: &impl AsFd) -> rustix::io::Result<()> {
    let flags = rustix::fs::ioctl_getflags(fd)?;
    if flags.contains(rustix::fs::IFlags::PROJECT_INHERIT) {
        return Ok(());
    }
    rustix::fs::ioctl_setflags(fd, flags | rustix::fs::IFlags::PROJECT_INHERIT)
}

/// The name by which a child process opens the very inode `fd` holds
/// (`/proc/<this process>/fd/<n>`: a magic link, resolved to that inode whatever its path
/// points at now), checked here to resolve to it (`ENXIO` otherwise: a `/proc` of another PID
/// namespace). For a tool that must act on a directory checked here (the project ID, which only
/// `FS_IOC_FSSETXATTR` sets: the tool does that ioctl, on this inode). The descriptor must stay
/// open until the tool is done.
pub(crate) fn fd_path_for_child(fd: &impl AsFd) -> nix::Result<std::path::PathBuf> {
    use std::os::fd::AsRawFd;
    // Our PID as this /proc numbers it: after entering the host's mount namespace from a PID
    // namespace of our own, `/proc` is the host's, where `getpid()`'s number is another process.
    let me = std::fs::read_link("/proc/self").map_err(|_| nix::Error::ENXIO)?;
    let p = std::path::Path::new("/proc")
        .join(me)
        .join("fd")
        .join(fd.as_fd().as_raw_fd().to_string());
    let there = nix::sys::stat::stat(p.as_path())?;
    if (there.st_dev, there.st_ino) != dev_ino(fd)? {
        return Err(nix::Error::ENXIO);
    }
    Ok(p)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nothing_is_followed_replaced_or_crossed() {
        let d = tempfile::tempdir().unwrap();
        let root = open_dir(d.path()).unwrap();
        mkdir(&root, "a", 0o755).unwrap();
        std::fs::create_dir(d.path().join("b")).unwrap();
        std::os::unix::fs::symlink(d.path().join("a"), d.path().join("l")).unwrap();
        assert!(open_child_dir(&root, "a").is_ok());
        assert!(
            open_child_dir(&root, "l").is_err(),
            "a symlink is not followed"
        );
        assert!(
            open_regular(&root, "l/x", None).is_err(),
            "nor inside a path"
        );
        assert!(
            open_child_dir(&root, "../x").is_err(),
            "not outside the root"
        );
        // Never replaces: an existing directory stays.
        assert!(matches!(
            rename_noreplace(&root, "a", OsStr::new("b")),
            Err(nix::Error::EEXIST | nix::Error::ENOTEMPTY)
        ));
        assert!(d.path().join("a").is_dir());
        let f = create_new_file(&root, "f", 0o600).unwrap();
        drop(f);
        assert_eq!(
            create_new_file(&root, "f", 0o600).unwrap_err(),
            nix::Error::EEXIST
        );
        link(&root, "f", "g").unwrap();
        assert_eq!(link(&root, "f", "g").unwrap_err(), nix::Error::EEXIST);
        let e = entry(&root, OsStr::new("a")).unwrap().unwrap();
        assert!(e.is_dir && !e.mount_root);
        assert_eq!(e.dev, fs_dev(&root).unwrap());
        assert!(
            !entry(&root, OsStr::new("l")).unwrap().unwrap().is_dir,
            "not followed"
        );
        assert_eq!(entry(&root, OsStr::new("gone")).unwrap(), None);
        unlink(&root, "g").unwrap();
        rmdir(&root, "b").unwrap();
        assert!(free_bytes(d.path()).is_some());
        assert!(free_bytes(Path::new("/nonexistent/x")).is_none());
        assert!(statfs(d.path()).is_ok());
    }
}
