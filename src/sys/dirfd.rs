//! Working beneath an open directory: the descriptor-relative file system calls the
//! marked-directory library ([`crate::provision::volumedir`]), the NFS provisioner and the project
//! quotas make, as small functions over `nix`/`rustix`.
//!
//! Safety rules: every open below a directory descriptor resolves with `RESOLVE_NO_SYMLINKS |
//! RESOLVE_BENEATH` (a symlink anywhere in `name`, or `..` out of the directory, fails instead of
//! being followed), a child directory is opened also with `RESOLVE_NO_XDEV` (a mount point there
//! answers `EXDEV`), stats never follow a symlink, and [`rename_noreplace`] never replaces
//! anything but (where the kernel cannot do it atomically) an empty directory — see its doc.
//!
//! Caller contract: errors are returned as the kernel gave them (`nix::Error`, or rustix's
//! `Errno` for `statx` and the flags ioctl), for the caller to turn into a message; nothing here
//! logs or retries.

use nix::NixPath;
use nix::fcntl::{AtFlags, OFlag, OpenHow, RenameFlags, ResolveFlag, openat2, renameat, renameat2};
use nix::sys::stat::{FileStat, Mode};
use nix::unistd::{UnlinkatFlags, linkat, unlinkat};
use std::ffi::OsStr;
use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;

/// Opens the directory `path` (canonical) with no symlink anywhere in it.
pub fn open_dir(path: &Path) -> nix::Result<OwnedFd> {
    super::paths::open_dir_nofollow(path)
}

/// Opens the directory `name` inside `dir`: no symlink, not outside `dir`, and not across a mount
/// point (`EXDEV` when `name` is one).
pub fn open_child_dir<P: ?Sized + NixPath>(dir: &impl AsFd, name: &P) -> nix::Result<OwnedFd> {
    let how = OpenHow::new()
        .flags(OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC | OFlag::O_NOFOLLOW)
        .resolve(
            ResolveFlag::RESOLVE_NO_SYMLINKS
                | ResolveFlag::RESOLVE_BENEATH
                | ResolveFlag::RESOLVE_NO_XDEV,
        );
    openat2(dir.as_fd(), name, how)
}

/// Opens the file `name` inside `dir` for reading (no symlink, not outside `dir`).
pub fn open_file<P: ?Sized + NixPath>(dir: &impl AsFd, name: &P) -> nix::Result<OwnedFd> {
    let how = OpenHow::new()
        .flags(OFlag::O_RDONLY | OFlag::O_CLOEXEC | OFlag::O_NOFOLLOW)
        .resolve(ResolveFlag::RESOLVE_NO_SYMLINKS | ResolveFlag::RESOLVE_BENEATH);
    openat2(dir.as_fd(), name, how)
}

/// Creates the file `name` inside `dir` for writing with `mode`; `EEXIST` when anything is there.
pub fn create_new_file<P: ?Sized + NixPath>(
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

/// Creates (or truncates) the file `name` inside `dir` for writing, `mode` when created; a symlink
/// there fails.
pub fn create_file<P: ?Sized + NixPath>(
    dir: &impl AsFd,
    name: &P,
    mode: u32,
) -> nix::Result<OwnedFd> {
    let how = OpenHow::new()
        .flags(
            OFlag::O_CREAT
                | OFlag::O_TRUNC
                | OFlag::O_WRONLY
                | OFlag::O_CLOEXEC
                | OFlag::O_NOFOLLOW,
        )
        .mode(Mode::from_bits_truncate(mode))
        .resolve(ResolveFlag::RESOLVE_NO_SYMLINKS | ResolveFlag::RESOLVE_BENEATH);
    openat2(dir.as_fd(), name, how)
}

/// Makes the directory `name` inside `dir` with `mode` (less the umask).
pub fn mkdir<P: ?Sized + NixPath>(dir: &impl AsFd, name: &P, mode: u32) -> nix::Result<()> {
    nix::sys::stat::mkdirat(dir, name, Mode::from_bits_truncate(mode))
}

/// Makes the directory `path` with `mode` (less the umask).
pub fn mkdir_path(path: &Path, mode: u32) -> nix::Result<()> {
    nix::unistd::mkdir(path, Mode::from_bits_truncate(mode))
}

/// Renames `from` in `from_dir` to `to` in `to_dir` (`renameat`: replaces an empty directory or a
/// file at `to`; a non-empty directory there fails).
pub fn rename<P1: ?Sized + NixPath, P2: ?Sized + NixPath>(
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
pub fn rename_noreplace(dir: &OwnedFd, from: &str, to: &OsStr) -> nix::Result<()> {
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
pub fn link(dir: &impl AsFd, from: &str, to: &str) -> nix::Result<()> {
    linkat(dir, from, dir, to, AtFlags::empty())
}

/// Removes the file (or symlink) `name` in `dir`.
pub fn unlink<P: ?Sized + NixPath>(dir: &impl AsFd, name: &P) -> nix::Result<()> {
    unlinkat(dir, name, UnlinkatFlags::NoRemoveDir)
}

/// Removes the empty directory `name` in `dir`.
pub fn rmdir<P: ?Sized + NixPath>(dir: &impl AsFd, name: &P) -> nix::Result<()> {
    unlinkat(dir, name, UnlinkatFlags::RemoveDir)
}

/// `fstat` of an open file.
pub fn stat(fd: &impl AsFd) -> nix::Result<FileStat> {
    nix::sys::stat::fstat(fd.as_fd())
}

/// `fstatat` of `name` in `dir`, not following a symlink.
pub fn stat_at<P: ?Sized + NixPath>(dir: &impl AsFd, name: &P) -> nix::Result<FileStat> {
    nix::sys::stat::fstatat(dir, name, AtFlags::AT_SYMLINK_NOFOLLOW)
}

/// The device and inode of an open file.
pub fn dev_ino(fd: &impl AsFd) -> nix::Result<(u64, u64)> {
    let st = stat(fd)?;
    Ok((st.st_dev, st.st_ino))
}

/// Sets the mode of an open file (no umask).
pub fn chmod(fd: &impl AsFd, mode: u32) -> nix::Result<()> {
    nix::sys::stat::fchmod(fd, Mode::from_bits_truncate(mode))
}

/// Flushes an open file or directory to its device.
pub fn sync(fd: &impl AsFd) -> nix::Result<()> {
    nix::unistd::fsync(fd)
}

/// What `statx` says of an entry, not following a symlink nor triggering an automount.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry {
    /// It is a directory.
    pub is_dir: bool,
    /// Its device (major, minor).
    pub dev: (u32, u32),
    /// It is the root of a mount (statx's mount-root attribute, where the kernel reports it).
    pub mount_root: bool,
}

/// `statx` of `name` in `dir`; `None` when it is gone.
pub fn entry(dir: &impl AsFd, name: &OsStr) -> rustix::io::Result<Option<Entry>> {
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
pub fn fs_dev(fd: &impl AsFd) -> rustix::io::Result<(u32, u32)> {
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
pub fn free_bytes(path: &Path) -> Option<u64> {
    nix::sys::statvfs::statvfs(path)
        .ok()
        .map(|s| s.blocks_available().saturating_mul(s.fragment_size()))
}

/// The filesystems `statfs` tells apart for project quotas.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FsMagic {
    /// XFS.
    Xfs,
    /// ext4.
    Ext4,
    /// Anything else.
    Other,
}

/// What `statfs` says of the filesystem holding `path`: its kind and block size (`None` when the
/// kernel's value does not fit).
pub fn statfs(path: &Path) -> nix::Result<(FsMagic, Option<u64>)> {
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
pub fn open_dir_for_flags(path: &Path) -> nix::Result<OwnedFd> {
    nix::fcntl::open(
        path,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
}

/// Whether the open directory has the project-inherit flag (`FS_IOC_GETFLAGS`).
pub fn project_inherit(fd: &impl AsFd) -> rustix::io::Result<bool> {
    rustix::fs::ioctl_getflags(fd).map(|f| f.contains(rustix::fs::IFlags::PROJECT_INHERIT))
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
        assert!(open_file(&root, "l/x").is_err(), "nor inside a path");
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
