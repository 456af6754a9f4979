//! The only place flexvol calls mount(2) and umount2(2).
//!
//! # Safety rules
//! - Callers pass paths they have already validated and resolved; this module does not second-guess
//!   them but never follows a symlink at the target of an unmount (`UMOUNT_NOFOLLOW`).
//! - A bind mount source may be `/proc/self/fd/N` of an `O_PATH` descriptor opened on the verified
//!   path: that pins the exact inode that passed the checks, so a symlink swapped in afterwards
//!   cannot redirect the mount (the class of bug behind CVE-2021-30465).
//! - Read-only binds are made in two steps (bind, then remount the new mount `MS_BIND|MS_RDONLY`);
//!   the remount changes only the new mount, never the source or other binds of it. Flags the new
//!   mount already carries (nosuid, nodev, noexec, atime) are kept.
//! - Binds are not recursive: mounts below the source are not carried along, and one `umount2`
//!   undoes one bind.
//! - Every bind is made a *slave* right after it is created (`MS_SLAVE`): a bind of a shared
//!   source would otherwise join the source's peer group, so a mount made inside the pod's bind
//!   (by a privileged container) would appear on the host, and unmounting a mount that propagated
//!   into the bind would unmount the host's original. As a slave it still receives mounts made
//!   later inside the source (what kubelet's `HostToContainer` propagation gives a hostPath
//!   volume), but never sends anything back. [`Mounter::make_slave`] does the same for a bind that
//!   an older version or a crash left shared.
//! - "Is this a mount, and which one" is answered by one `statx` ([`path_state`]:
//!   `STATX_ATTR_MOUNT_ROOT`, `STATX_MNT_ID`, device and inode), never by comparing the device of
//!   a directory with its parent's (a bind from the same filesystem has the same device). It costs
//!   the same whatever the size of the node's mount table; it falls back to `mountinfo` only on
//!   kernels older than 5.8, which lack those statx fields.
//! - Unmounting something not mounted (EINVAL) counts as done.

use crate::sys::mountinfo::{MountInfoError, MountTable};
use crate::sys::paths::FileKind;
use nix::mount::{MntFlags, MsFlags};
use nix::sys::statvfs::{FsFlags, statvfs};
use rustix::fs::{AtFlags, CWD, StatxAttributes, StatxFlags};
use std::os::fd::{AsFd, BorrowedFd};
use std::path::{Path, PathBuf};

/// Why a mount operation failed; carries what and where.
#[derive(Debug, thiserror::Error)]
pub enum MountError {
    /// mount(2) failed.
    #[error("cannot mount {source_desc} on {target}: {errno}")]
    Mount {
        source_desc: String,
        target: PathBuf,
        errno: nix::Error,
    },
    /// The read-only remount after a bind failed.
    #[error("cannot make {target} read-only: {errno}")]
    Remount { target: PathBuf, errno: nix::Error },
    /// umount2(2) failed.
    #[error("cannot unmount {target}: {errno}")]
    Unmount { target: PathBuf, errno: nix::Error },
    /// Changing the propagation of a mount failed.
    #[error("cannot make {target} a slave mount: {errno}")]
    Propagation { target: PathBuf, errno: nix::Error },
    /// statx(2) failed.
    #[error("cannot inspect {target}: {errno}")]
    Inspect { target: PathBuf, errno: nix::Error },
    /// Reading mountinfo failed.
    #[error(transparent)]
    Table(#[from] MountInfoError),
}

/// How hard to unmount.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UnmountMode {
    /// A plain unmount; fails with EBUSY when in use.
    Normal,
    /// `MNT_FORCE`: aborts pending requests (NFS with a dead server).
    Force,
    /// `MNT_DETACH`: lazy; detaches now, cleans up when no longer busy.
    Detach,
}

/// The kernel seam. Backends hold a `&dyn Mounter`; tests may substitute a recording double.
pub trait Mounter: Send + Sync {
    /// Bind-mounts `source` (a path or `/proc/self/fd/N`) on `target`, read-only if asked. The new
    /// mount is a slave (see the module doc): nothing propagates from it to the source.
    fn bind(&self, source: &Path, target: &Path, read_only: bool) -> Result<(), MountError>;
    /// Makes the mount at `target` a slave (a private mount stays private): mounts and unmounts
    /// under it no longer propagate to its former peers. Only that mount changes.
    fn make_slave(&self, target: &Path) -> Result<(), MountError>;
    /// Makes the existing bind mount at `target` read-only (only that mount).
    fn remount_readonly(&self, target: &Path) -> Result<(), MountError>;
    /// Mounts a filesystem (`device` of type `fs_type`) on `target`.
    fn mount_fs(
        &self,
        device: &Path,
        target: &Path,
        fs_type: &str,
        read_only: bool,
        data: &str,
    ) -> Result<(), MountError>;
    /// Unmounts `target`. Not mounted is `Ok(false)`; unmounted is `Ok(true)`.
    fn unmount(&self, target: &Path, mode: UnmountMode) -> Result<bool, MountError>;
    /// The current mount table.
    fn table(&self) -> Result<MountTable, MountError>;
}

/// Whether the mount at `target` reads as read-only (the mount's own flag or its filesystem's).
pub(crate) fn reads_read_only(target: &Path) -> bool {
    statvfs(target).is_ok_and(|st| st.flags().contains(FsFlags::ST_RDONLY))
}

/// The real kernel.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct SysMounter;

fn preserved_flags(target: &Path) -> MsFlags {
    let mut flags = MsFlags::empty();
    if let Ok(st) = statvfs(target) {
        let f = st.flags();
        for (from, to) in [
            (FsFlags::ST_NOSUID, MsFlags::MS_NOSUID),
            (FsFlags::ST_NODEV, MsFlags::MS_NODEV),
            (FsFlags::ST_NOEXEC, MsFlags::MS_NOEXEC),
            (FsFlags::ST_NOATIME, MsFlags::MS_NOATIME),
            (FsFlags::ST_NODIRATIME, MsFlags::MS_NODIRATIME),
            (FsFlags::ST_RELATIME, MsFlags::MS_RELATIME),
        ] {
            if f.contains(from) {
                flags |= to;
            }
        }
    }
    flags
}

impl Mounter for SysMounter {
    fn bind(&self, source: &Path, target: &Path, read_only: bool) -> Result<(), MountError> {
        nix::mount::mount(
            Some(source),
            target,
            None::<&str>,
            MsFlags::MS_BIND,
            None::<&str>,
        )
        .map_err(|errno| MountError::Mount {
            source_desc: source.display().to_string(),
            target: target.to_owned(),
            errno,
        })?;
        crate::sys::process::checkpoint("mount-bind-before-slave");
        if let Err(e) = self.make_slave(target) {
            // Never leave a bind that propagates back to the source.
            let _ = nix::mount::umount2(target, MntFlags::MNT_DETACH | MntFlags::UMOUNT_NOFOLLOW);
            return Err(e);
        }
        crate::sys::process::checkpoint("mount-bind-before-readonly");
        if read_only && let Err(e) = self.remount_readonly(target) {
            // Never leave a writable bind where a read-only one was asked for.
            let _ = nix::mount::umount2(target, MntFlags::MNT_DETACH | MntFlags::UMOUNT_NOFOLLOW);
            return Err(e);
        }
        Ok(())
    }

    fn make_slave(&self, target: &Path) -> Result<(), MountError> {
        nix::mount::mount(
            None::<&str>,
            target,
            None::<&str>,
            MsFlags::MS_SLAVE,
            None::<&str>,
        )
        .map_err(|errno| MountError::Propagation {
            target: target.to_owned(),
            errno,
        })
    }

    fn remount_readonly(&self, target: &Path) -> Result<(), MountError> {
        let flags =
            MsFlags::MS_REMOUNT | MsFlags::MS_BIND | MsFlags::MS_RDONLY | preserved_flags(target);
        nix::mount::mount(None::<&str>, target, None::<&str>, flags, None::<&str>).map_err(
            |errno| MountError::Remount {
                target: target.to_owned(),
                errno,
            },
        )
    }

    fn mount_fs(
        &self,
        device: &Path,
        target: &Path,
        fs_type: &str,
        read_only: bool,
        data: &str,
    ) -> Result<(), MountError> {
        let mut flags = MsFlags::empty();
        if read_only {
            flags |= MsFlags::MS_RDONLY;
        }
        let data = if data.is_empty() { None } else { Some(data) };
        nix::mount::mount(Some(device), target, Some(fs_type), flags, data).map_err(|errno| {
            MountError::Mount {
                source_desc: format!("{} ({fs_type})", device.display()),
                target: target.to_owned(),
                errno,
            }
        })
    }

    fn unmount(&self, target: &Path, mode: UnmountMode) -> Result<bool, MountError> {
        let flags = MntFlags::UMOUNT_NOFOLLOW
            | match mode {
                UnmountMode::Normal => MntFlags::empty(),
                UnmountMode::Force => MntFlags::MNT_FORCE,
                UnmountMode::Detach => MntFlags::MNT_DETACH,
            };
        match nix::mount::umount2(target, flags) {
            Ok(()) => Ok(true),
            Err(nix::Error::EINVAL) | Err(nix::Error::ENOENT) => Ok(false),
            Err(errno) => Err(MountError::Unmount {
                target: target.to_owned(),
                errno,
            }),
        }
    }

    fn table(&self) -> Result<MountTable, MountError> {
        Ok(MountTable::read()?)
    }
}

/// A file's identity: its filesystem's device and its inode. A bind mount shows the identity of
/// its source at its mount point.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FileId {
    /// Device major of the filesystem.
    pub(crate) major: u32,
    /// Device minor of the filesystem.
    pub(crate) minor: u32,
    /// Inode number.
    pub(crate) ino: u64,
}

impl FileId {
    /// `major:minor:ino`, the form kept in state records.
    pub(crate) fn encode(&self) -> String {
        format!("{}:{}:{}", self.major, self.minor, self.ino)
    }

    /// The inverse of [`FileId::encode`].
    pub(crate) fn decode(s: &str) -> Option<Self> {
        let mut it = s.split(':');
        let id = FileId {
            major: it.next()?.parse().ok()?,
            minor: it.next()?.parse().ok()?,
            ino: it.next()?.parse().ok()?,
        };
        it.next().is_none().then_some(id)
    }
}

impl std::fmt::Display for FileId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "device {}:{} inode {}", self.major, self.minor, self.ino)
    }
}

/// What one `statx` says about a path (a final symlink is not followed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PathState {
    /// Device and inode.
    pub(crate) id: FileId,
    /// The id of the mount the path is on (mountinfo's first field).
    pub(crate) mnt_id: u64,
    /// Whether the path is the root of a mount, i.e. a mount point.
    pub(crate) mount_root: bool,
    /// File type.
    pub kind: FileKind,
    /// Size in bytes.
    pub(crate) size: u64,
}

fn kind_of_mode(mode: u32) -> FileKind {
    match mode & nix::libc::S_IFMT {
        nix::libc::S_IFDIR => FileKind::Directory,
        nix::libc::S_IFREG => FileKind::File,
        nix::libc::S_IFSOCK => FileKind::Socket,
        nix::libc::S_IFCHR => FileKind::CharDevice,
        nix::libc::S_IFBLK => FileKind::BlockDevice,
        _ => FileKind::Other,
    }
}

fn statx_raw(
    fd: BorrowedFd,
    path: &Path,
    flags: AtFlags,
) -> Result<rustix::fs::Statx, rustix::io::Errno> {
    rustix::fs::statx(
        fd,
        path,
        flags | AtFlags::SYMLINK_NOFOLLOW | AtFlags::NO_AUTOMOUNT,
        StatxFlags::TYPE | StatxFlags::INO | StatxFlags::SIZE | StatxFlags::MNT_ID,
    )
}

fn to_state(st: &rustix::fs::Statx) -> (PathState, bool) {
    let known = st.stx_attributes_mask.contains(StatxAttributes::MOUNT_ROOT)
        && StatxFlags::from_bits_retain(st.stx_mask).contains(StatxFlags::MNT_ID);
    (
        PathState {
            id: FileId {
                major: st.stx_dev_major,
                minor: st.stx_dev_minor,
                ino: st.stx_ino,
            },
            mnt_id: st.stx_mnt_id,
            mount_root: st.stx_attributes.contains(StatxAttributes::MOUNT_ROOT),
            kind: kind_of_mode(u32::from(st.stx_mode)),
            size: st.stx_size,
        },
        known,
    )
}

/// The state of the absolute, canonical `path`; `None` when nothing is there. One `statx`; on
/// kernels before 5.8 (no `STATX_ATTR_MOUNT_ROOT`) the mount facts come from mountinfo.
pub(crate) fn path_state(path: &Path) -> Result<Option<PathState>, MountError> {
    let inspect = |errno: rustix::io::Errno| MountError::Inspect {
        target: path.to_owned(),
        errno: nix::Error::from_raw(errno.raw_os_error()),
    };
    let st = match statx_raw(CWD, path, AtFlags::empty()) {
        Ok(st) => st,
        Err(rustix::io::Errno::NOENT) => return Ok(None),
        Err(e) => return Err(inspect(e)),
    };
    Ok(Some(with_mount_facts(&st, path)?))
}

/// The [`PathState`] of a `statx` answer; on kernels that give no mount facts (before 5.8), those
/// two come from the mount table at `path`.
fn with_mount_facts(st: &rustix::fs::Statx, path: &Path) -> Result<PathState, MountError> {
    let (mut state, known) = to_state(st);
    if !known {
        let table = MountTable::read()?;
        let m = table.at(path);
        state.mount_root = m.is_some();
        state.mnt_id = m
            .or_else(|| table.containing(path))
            .map_or(0, |m| u64::from(m.id));
    }
    Ok(state)
}

/// [`path_state`] of an open file (an `O_PATH` descriptor will do), without walking its path
/// again; `path` is where it was opened, for the mountinfo fallback on old kernels.
pub(crate) fn fd_state(fd: impl AsFd, path: &Path) -> Result<PathState, MountError> {
    let st = statx_raw(fd.as_fd(), Path::new(""), AtFlags::EMPTY_PATH).map_err(|errno| {
        MountError::Inspect {
            target: path.to_owned(),
            errno: nix::Error::from_raw(errno.raw_os_error()),
        }
    })?;
    with_mount_facts(&st, path)
}

/// The identity of an open file (an `O_PATH` descriptor will do).
pub(crate) fn fd_id(fd: impl AsFd) -> Result<FileId, MountError> {
    Ok(fd_kind_id(fd)?.1)
}

/// The kind and identity of an open file (an `O_PATH` descriptor will do), in one `statx`.
pub(crate) fn fd_kind_id(fd: impl AsFd) -> Result<(FileKind, FileId), MountError> {
    let st = statx_raw(fd.as_fd(), Path::new(""), AtFlags::EMPTY_PATH).map_err(|errno| {
        MountError::Inspect {
            target: PathBuf::from("(descriptor)"),
            errno: nix::Error::from_raw(errno.raw_os_error()),
        }
    })?;
    let state = to_state(&st).0;
    Ok((state.kind, state.id))
}
