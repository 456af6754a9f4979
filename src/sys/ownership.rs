//! A pod's fsGroup applied to a volume's tree, the way kubelet applies it to an emptyDir
//! (`SetVolumeOwnership` in `pkg/volume/volume_linux.go`, Kubernetes 1.20): every file and
//! directory gets the group `gid` and group read-write (`| 0660`); directories also get the
//! search bits and set-gid (`| 0770 | S_ISGID`), so that what the pod creates later inherits the
//! group. Owners are never changed. Symlinks are skipped (neither followed nor changed). The root
//! is changed *last*, after everything below it, as kubelet's `walkDeep` does: a walk that was
//! interrupted leaves the root unchanged, so the next mount walks again.
//!
//! `fsGroupChangePolicy: OnRootMismatch` is what [`apply`] always does: kubelet 1.20 does not pass
//! the pod's policy to a FlexVolume driver (it sends `kubernetes.io/mounterArgs.FsGroup` only and
//! keeps the policy for its own walk, `flexvolume/mounter.go`), so nothing is walked when the root
//! already has the group, `rwx` for owner and group, and set-gid (kubelet's
//! `requiresPermissionChange`). The second mount of a volume costs one `statx`.
//!
//! Safety rules. The walk runs as root inside a directory that a pod writes, concurrently with
//! that pod, so every step is relative to a descriptor and nothing a pod renames or swaps can
//! redirect it:
//! - directories are opened with `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS |
//!   RESOLVE_NO_XDEV)` below the directory already open: a symlink or a mount point in their place
//!   fails the open and the entry is skipped;
//! - a file is changed only through a descriptor opened `O_PATH | O_NOFOLLOW` the same way (no
//!   open of a device or FIFO ever happens), after `statx` of that descriptor shows it is not a
//!   symlink and is on the root's device: `fchownat(fd, "", AT_EMPTY_PATH)` and `chmod` of
//!   `/proc/self/fd/N`, which names exactly the inode opened;
//! - nothing is followed, nothing on another device and no mount root below the root is entered
//!   or changed (a mount inside the volume, an NFS submount);
//! - set-uid and set-gid of a file are never added: the mode written is the mode the kernel left
//!   after the `chown` (which clears them) plus `0660`;
//! - bounded by the call's [`Deadline`] (checked every few entries, stopping with a margin to
//!   answer) and by [`MAX_DEPTH`] directories of nesting (one descriptor per level).
//!
//! Caller contract: `root` is a directory opened for reading (`O_RDONLY | O_DIRECTORY`) that the
//! caller has decided may be given to the pod's group: a volume flexvol provisioner made (the
//! backends decide that from the PV's capability token or the provisioner's legacy grant, never
//! from an option a PV author writes). Entries that vanish or change kind during the walk (the pod
//! is running) are skipped. Files the kernel refuses to change (`EPERM`: immutable or
//! append-only) are counted in [`Outcome::refused`] and left as they are.

use crate::sys::process::Deadline;
use nix::fcntl::{OFlag, OpenHow, ResolveFlag, openat2};
use rustix::fs::{AtFlags, Gid, Mode, StatxAttributes, StatxFlags};
use std::ffi::CString;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::time::Duration;

/// How many directories deep the walk goes (one open descriptor per level); a deeper tree fails
/// with [`OwnershipError::TooDeep`].
pub(crate) const MAX_DEPTH: usize = 256;

/// Group read and write, added to everything (kubelet's `rwMask`).
const RW: u32 = 0o660;
/// What a directory gets: `RW`, the search bits (kubelet's `execMask`) and set-gid.
const DIR_BITS: u32 = 0o770 | nix::libc::S_ISGID;

/// What a walk did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Outcome {
    /// False when the root already matched and nothing below it was looked at.
    pub(crate) walked: bool,
    /// Files and directories looked at (the root included).
    pub(crate) visited: u64,
    /// Files and directories whose group or mode was changed.
    pub(crate) changed: u64,
    /// Files the kernel refused to change (`EPERM`), left as they were.
    pub refused: u64,
}

/// Why a walk stopped.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub(crate) enum OwnershipError {
    /// The root's group cannot be changed by us (`EPERM` on a `chown` to its own group): an NFS
    /// export with `root_squash`/`all_squash`. Nothing was changed.
    #[error(
        "root may not change the group of the volume's root directory (EPERM): the NFS export squashes root"
    )]
    Squashed,
    /// The call's deadline came before the walk ended; the root was not changed.
    #[error(
        "the call's deadline came after {visited} files; the root was left unchanged so the next mount continues"
    )]
    Deadline {
        /// Files looked at so far.
        visited: u64,
    },
    /// The tree is deeper than [`MAX_DEPTH`]; the root was not changed.
    #[error(
        "the volume has directories nested more than {MAX_DEPTH} deep; the root was left unchanged"
    )]
    TooDeep,
    /// A system call failed.
    #[error("{what}: {errno}")]
    Io {
        /// The operation.
        what: &'static str,
        /// The error.
        errno: nix::Error,
    },
}

/// What `statx` says of one file.
#[derive(Debug, Clone, Copy)]
struct Meta {
    mode: u32,
    gid: u32,
    dev: (u32, u32),
    mount_root: bool,
}

impl Meta {
    fn kind(&self) -> u32 {
        self.mode & nix::libc::S_IFMT
    }
    fn is_dir(&self) -> bool {
        self.kind() == nix::libc::S_IFDIR
    }
    fn is_link(&self) -> bool {
        self.kind() == nix::libc::S_IFLNK
    }
    /// The mode bits this file must have.
    fn wanted_bits(&self) -> u32 {
        if self.is_dir() { DIR_BITS } else { RW }
    }
    /// Whether it already has `gid` and its bits.
    fn matches(&self, gid: u32) -> bool {
        let want = self.wanted_bits();
        self.gid == gid && self.mode & want == want
    }
}

fn statx_at(dir: impl AsFd, name: &CString, flags: AtFlags) -> rustix::io::Result<Meta> {
    let st = rustix::fs::statx(
        dir,
        name.as_c_str(),
        flags | AtFlags::SYMLINK_NOFOLLOW | AtFlags::NO_AUTOMOUNT,
        StatxFlags::TYPE | StatxFlags::MODE | StatxFlags::GID,
    )?;
    Ok(Meta {
        mode: u32::from(st.stx_mode),
        gid: st.stx_gid,
        dev: (st.stx_dev_major, st.stx_dev_minor),
        mount_root: st.stx_attributes_mask.contains(StatxAttributes::MOUNT_ROOT)
            && st.stx_attributes.contains(StatxAttributes::MOUNT_ROOT),
    })
}

fn statx_fd(fd: impl AsFd) -> rustix::io::Result<Meta> {
    statx_at(fd, &CString::default(), AtFlags::EMPTY_PATH)
}

fn io(what: &'static str) -> impl Fn(rustix::io::Errno) -> OwnershipError {
    move |e| OwnershipError::Io {
        what,
        errno: nix::Error::from_raw(e.raw_os_error()),
    }
}

/// Whether a volume whose root is `root` (an open directory) already has `gid` as kubelet's
/// `OnRootMismatch` checks it.
#[cfg(test)]
pub(crate) fn root_matches(root: impl AsFd, gid: u32) -> Result<bool, OwnershipError> {
    let m = statx_fd(root).map_err(io("statx of the volume root"))?;
    Ok(m.is_dir() && m.matches(gid) && m.mode & nix::libc::S_ISGID != 0)
}

/// Applies `gid` to the tree below and at `root` (module doc), unless the root already matches.
/// Stops before `deadline` with a margin to answer (a tenth of its total, at most 5 s).
pub(crate) fn apply(
    root: &OwnedFd,
    gid: u32,
    deadline: &Deadline,
) -> Result<Outcome, OwnershipError> {
    let meta = statx_fd(root).map_err(io("statx of the volume root"))?;
    if !meta.is_dir() {
        return Err(OwnershipError::Io {
            what: "the volume root",
            errno: nix::Error::ENOTDIR,
        });
    }
    let mut out = Outcome {
        visited: 1,
        ..Outcome::default()
    };
    if meta.matches(gid) && meta.mode & nix::libc::S_ISGID != 0 {
        return Ok(out);
    }
    // A chown to the group it already has changes nothing, and fails only where root may not
    // chown at all: an NFS export that squashes root.
    match rustix::fs::chownat(
        root,
        "",
        None,
        Some(Gid::from_raw(meta.gid)),
        AtFlags::EMPTY_PATH,
    ) {
        Ok(()) => {}
        Err(rustix::io::Errno::PERM) => return Err(OwnershipError::Squashed),
        Err(e) => return Err(io("chown of the volume root")(e)),
    }
    out.walked = true;
    let margin = (deadline.total() / 10).min(Duration::from_secs(5));
    let mut walk = Walk {
        gid,
        dev: meta.dev,
        deadline,
        margin,
        out,
    };
    walk.dir(root, 1)?;
    walk.fix(root, meta, true)?;
    Ok(walk.out)
}

struct Walk<'d> {
    gid: u32,
    dev: (u32, u32),
    deadline: &'d Deadline,
    margin: Duration,
    out: Outcome,
}

impl Walk<'_> {
    fn dir(&mut self, dir: &OwnedFd, depth: usize) -> Result<(), OwnershipError> {
        if depth > MAX_DEPTH {
            return Err(OwnershipError::TooDeep);
        }
        // All names first: the directory's own descriptor stays the only one open at this level.
        let mut names = Vec::new();
        {
            let entries = rustix::fs::Dir::read_from(dir).map_err(io("read directory"))?;
            for e in entries {
                let e = e.map_err(io("read directory"))?;
                let name = e.file_name().to_bytes();
                if name != b"." && name != b".." {
                    names.push(e.file_name().to_owned());
                }
            }
        }
        for name in names {
            self.out.visited += 1;
            if self.out.visited.is_multiple_of(64) && self.deadline.remaining() <= self.margin {
                return Err(OwnershipError::Deadline {
                    visited: self.out.visited,
                });
            }
            let meta = match statx_at(dir, &name, AtFlags::empty()) {
                Ok(m) => m,
                Err(rustix::io::Errno::NOENT) => continue,
                Err(e) => return Err(io("statx")(e)),
            };
            if meta.is_link() || meta.dev != self.dev || meta.mount_root {
                continue;
            }
            if meta.is_dir() {
                let Some(child) = self.open(dir, &name, true)? else {
                    continue;
                };
                let Some(meta) = self.same_kind(&child, true)? else {
                    continue;
                };
                self.dir(&child, depth + 1)?;
                self.fix(&child, meta, true)?;
            } else if !meta.matches(self.gid) {
                let Some(file) = self.open(dir, &name, false)? else {
                    continue;
                };
                let Some(meta) = self.same_kind(&file, false)? else {
                    continue;
                };
                self.fix(&file, meta, false)?;
            }
        }
        Ok(())
    }

    /// Opens `name` below `dir`: a directory for reading, anything else `O_PATH`; `None` when it
    /// vanished, became a symlink, or is a mount point (a pod racing us).
    fn open(
        &self,
        dir: &OwnedFd,
        name: &CString,
        is_dir: bool,
    ) -> Result<Option<OwnedFd>, OwnershipError> {
        let flags = if is_dir {
            OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW
        } else {
            OFlag::O_PATH | OFlag::O_NOFOLLOW
        };
        let how = OpenHow::new().flags(flags | OFlag::O_CLOEXEC).resolve(
            ResolveFlag::RESOLVE_BENEATH
                | ResolveFlag::RESOLVE_NO_SYMLINKS
                | ResolveFlag::RESOLVE_NO_XDEV,
        );
        match openat2(dir.as_fd(), name.as_c_str(), how) {
            Ok(fd) => Ok(Some(fd)),
            Err(
                nix::Error::ENOENT
                | nix::Error::ELOOP
                | nix::Error::ENOTDIR
                | nix::Error::EXDEV
                | nix::Error::EAGAIN,
            ) => Ok(None),
            Err(errno) => Err(OwnershipError::Io {
                what: "open",
                errno,
            }),
        }
    }

    /// What the opened file is now, when it is still of the kind expected, not a symlink, and on
    /// the root's device.
    fn same_kind(&self, fd: &OwnedFd, is_dir: bool) -> Result<Option<Meta>, OwnershipError> {
        let m = statx_fd(fd).map_err(io("statx"))?;
        let ok = !m.is_link() && m.is_dir() == is_dir && m.dev == self.dev && !m.mount_root;
        Ok(ok.then_some(m))
    }

    /// Gives the opened file (`meta`: what it is now) the group and its mode bits.
    fn fix(&mut self, fd: &OwnedFd, mut meta: Meta, is_dir: bool) -> Result<(), OwnershipError> {
        if meta.matches(self.gid) {
            return Ok(());
        }
        if meta.gid != self.gid {
            match rustix::fs::chownat(
                fd,
                "",
                None,
                Some(Gid::from_raw(self.gid)),
                AtFlags::EMPTY_PATH,
            ) {
                Ok(()) => {}
                Err(rustix::io::Errno::PERM) => {
                    self.out.refused += 1;
                    return Ok(());
                }
                Err(e) => return Err(io("chown")(e)),
            }
            // The kernel may have cleared set-uid/set-gid: start from what it left.
            meta = statx_fd(fd).map_err(io("statx"))?;
        }
        let mode = (meta.mode & 0o7777) | meta.wanted_bits();
        if mode != meta.mode & 0o7777 {
            let set = if is_dir {
                rustix::fs::fchmod(fd, Mode::from_raw_mode(mode))
            } else {
                // An O_PATH descriptor cannot be fchmod'ed; its /proc link names exactly that inode.
                rustix::fs::chmod(
                    format!("/proc/self/fd/{}", fd.as_raw_fd()),
                    Mode::from_raw_mode(mode),
                )
            };
            match set {
                Ok(()) => {}
                Err(rustix::io::Errno::PERM) => {
                    self.out.refused += 1;
                    return Ok(());
                }
                Err(e) => return Err(io("chmod")(e)),
            }
        }
        self.out.changed += 1;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{MetadataExt, PermissionsExt, symlink};
    use std::path::Path;

    fn open(p: &Path) -> OwnedFd {
        crate::sys::paths::open_dir_nofollow(p).unwrap()
    }
    fn later() -> Deadline {
        Deadline::after(Duration::from_secs(60))
    }
    fn gid_mode(p: &Path) -> (u32, u32) {
        let m = std::fs::symlink_metadata(p).unwrap();
        (m.gid(), m.mode() & 0o7777)
    }

    /// A tree as a pod leaves it: nested directories, files of several modes, a set-uid file, a
    /// symlink out of the volume, a FIFO.
    fn tree(root: &Path, outside: &Path) {
        std::fs::create_dir_all(root.join("a/b/c")).unwrap();
        for (f, mode) in [("f", 0o600), ("a/g", 0o644), ("a/b/c/h", 0o4755)] {
            std::fs::write(root.join(f), b"x").unwrap();
            std::fs::set_permissions(root.join(f), std::fs::Permissions::from_mode(mode)).unwrap();
        }
        std::fs::set_permissions(root.join("a/b"), std::fs::Permissions::from_mode(0o700)).unwrap();
        symlink(outside, root.join("a/out")).unwrap();
        nix::unistd::mkfifo(
            &root.join("a/fifo"),
            nix::sys::stat::Mode::from_bits_truncate(0o600),
        )
        .unwrap();
    }

    #[test]
    #[allow(clippy::print_stderr)] // says why it is skipped
    fn applies_group_and_modes_like_kubelet_and_skips_symlinks() {
        if !nix::unistd::geteuid().is_root() {
            eprintln!("needs root (chown to another group); covered by the root tests");
            return;
        }
        let d = tempfile::tempdir().unwrap();
        let root = d.path().join("vol");
        let outside = d.path().join("host-file");
        std::fs::write(&outside, b"secret").unwrap();
        std::fs::set_permissions(&outside, std::fs::Permissions::from_mode(0o600)).unwrap();
        std::fs::create_dir(&root).unwrap();
        tree(&root, &outside);
        let out = apply(&open(&root), 2345, &later()).unwrap();
        assert!(out.walked);
        assert_eq!(out.refused, 0);
        // root, a, a/b, a/b/c, f, a/g, a/b/c/h, a/fifo (the symlink is looked at, not changed).
        assert_eq!(out.changed, 8, "{out:?}");
        for dir in ["", "a", "a/b", "a/b/c"] {
            let (g, m) = gid_mode(&root.join(dir));
            assert_eq!(g, 2345, "{dir}");
            assert_eq!(m & DIR_BITS, DIR_BITS, "{dir}: {m:o}");
        }
        assert_eq!(gid_mode(&root.join("f")), (2345, 0o660));
        assert_eq!(gid_mode(&root.join("a/g")), (2345, 0o664));
        // set-uid was cleared by the chown and is not put back.
        assert_eq!(gid_mode(&root.join("a/b/c/h")), (2345, 0o775));
        assert_eq!(gid_mode(&root.join("a/fifo")), (2345, 0o660));
        // The symlink's target outside the volume, and the symlink itself, are untouched.
        assert_eq!(gid_mode(&outside), (0, 0o600));
        assert_eq!(gid_mode(&root.join("a/out")).0, 0);
        // OnRootMismatch: the second time, nothing below the root is looked at.
        // (A new file inherits the group from the set-gid root; one the pod gave another group
        // stays as it is.)
        std::fs::write(root.join("new"), b"x").unwrap();
        assert_eq!(gid_mode(&root.join("new")).0, 2345, "set-gid root");
        nix::unistd::chown(&root.join("new"), None, Some(nix::unistd::Gid::from_raw(0))).unwrap();
        let again = apply(&open(&root), 2345, &later()).unwrap();
        assert_eq!(
            again,
            Outcome {
                walked: false,
                visited: 1,
                changed: 0,
                refused: 0
            }
        );
        assert_eq!(gid_mode(&root.join("new")).0, 0, "not walked");
        assert!(root_matches(open(&root), 2345).unwrap());
        assert!(!root_matches(open(&root), 2346).unwrap());
    }

    #[test]
    #[allow(clippy::print_stderr)] // says why it is skipped
    fn mounts_inside_the_volume_are_not_entered_nor_changed() {
        use nix::mount::{MntFlags, MsFlags, mount, umount2};
        if !nix::unistd::geteuid().is_root() {
            eprintln!("needs root (mount)");
            return;
        }
        let d = tempfile::tempdir().unwrap();
        let root = d.path().join("vol");
        let other = d.path().join("other");
        std::fs::create_dir_all(root.join("tmp")).unwrap();
        std::fs::create_dir_all(root.join("bind")).unwrap();
        std::fs::create_dir_all(&other).unwrap();
        std::fs::write(other.join("host"), b"x").unwrap();
        mount(
            Some("tmpfs"),
            &root.join("tmp"),
            Some("tmpfs"),
            MsFlags::empty(),
            Some("mode=0700"),
        )
        .unwrap();
        std::fs::write(root.join("tmp/inside"), b"x").unwrap();
        // A bind of a directory of the same filesystem: same device, but a mount root.
        mount(
            Some(&other),
            &root.join("bind"),
            None::<&str>,
            MsFlags::MS_BIND,
            None::<&str>,
        )
        .unwrap();
        let out = apply(&open(&root), 2345, &later());
        let seen = (
            gid_mode(&root.join("tmp")),
            gid_mode(&root.join("tmp/inside")).0,
            gid_mode(&root.join("bind")).0,
            gid_mode(&other.join("host")).0,
        );
        umount2(&root.join("tmp"), MntFlags::MNT_DETACH).unwrap();
        umount2(&root.join("bind"), MntFlags::MNT_DETACH).unwrap();
        assert!(out.unwrap().walked);
        assert_eq!(
            seen,
            ((0, 0o700), 0, 0, 0),
            "nothing across a mount changed"
        );
        assert_eq!(gid_mode(&root).0, 2345);
    }

    #[test]
    #[allow(clippy::print_stderr)] // says why it is skipped
    fn a_deadline_leaves_the_root_for_the_next_mount() {
        if !nix::unistd::geteuid().is_root() {
            eprintln!("needs root (chown to another group); covered by the root tests");
            return;
        }
        let d = tempfile::tempdir().unwrap();
        for i in 0..200 {
            std::fs::write(d.path().join(format!("f{i}")), b"").unwrap();
        }
        let before = gid_mode(d.path());
        let e = apply(&open(d.path()), 2345, &Deadline::after(Duration::ZERO)).unwrap_err();
        assert!(
            matches!(e, OwnershipError::Deadline { visited: 64 }),
            "{e:?}"
        );
        assert_eq!(gid_mode(d.path()), before, "root unchanged");
        assert!(!root_matches(open(d.path()), 2345).unwrap());
        // The next mount finishes the job.
        let out = apply(&open(d.path()), 2345, &later()).unwrap();
        assert!(out.walked);
        assert!(root_matches(open(d.path()), 2345).unwrap());
        assert_eq!(gid_mode(&d.path().join("f199")).0, 2345);
    }

    #[test]
    #[allow(clippy::print_stderr)] // says why it is skipped
    fn too_deep_a_tree_is_refused_with_the_root_unchanged() {
        if !nix::unistd::geteuid().is_root() {
            eprintln!("needs root (chown to another group); covered by the root tests");
            return;
        }
        let d = tempfile::tempdir().unwrap();
        // Built one level at a time through descriptors: the path would exceed PATH_MAX.
        let mut fd = open(d.path());
        for _ in 0..=MAX_DEPTH {
            crate::sys::dirfd::mkdir(&fd, "d", 0o755).unwrap();
            fd = crate::sys::dirfd::open_child_dir(&fd, "d").unwrap();
        }
        assert_eq!(
            apply(&open(d.path()), 2345, &later()).unwrap_err(),
            OwnershipError::TooDeep
        );
        assert!(!root_matches(open(d.path()), 2345).unwrap());
    }
}
