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
//! - "Mounted" is decided from mountinfo (see `mountinfo`), never from device numbers.
//! - Unmounting something not mounted (EINVAL) counts as done.

use crate::sys::mountinfo::{MountInfoError, MountTable};
use nix::mount::{MntFlags, MsFlags};
use nix::sys::statvfs::{FsFlags, statvfs};
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
    /// Bind-mounts `source` (a path or `/proc/self/fd/N`) on `target`, read-only if asked.
    fn bind(&self, source: &Path, target: &Path, read_only: bool) -> Result<(), MountError>;
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

/// The real kernel.
#[derive(Debug, Default, Clone, Copy)]
pub struct SysMounter;

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
        crate::sys::process::checkpoint("mount-bind-before-readonly");
        if read_only && let Err(e) = self.remount_readonly(target) {
            // Never leave a writable bind where a read-only one was asked for.
            let _ = nix::mount::umount2(target, MntFlags::MNT_DETACH | MntFlags::UMOUNT_NOFOLLOW);
            return Err(e);
        }
        Ok(())
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
