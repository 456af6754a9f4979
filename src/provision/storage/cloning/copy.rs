//! Copying one volume directory into another, for clones (`dataSource` of a claim), by
//! descriptors only.
//!
//! Safety rules (the copy runs as root over a tree a tenant wrote):
//! - nothing is ever followed: every child is opened with `RESOLVE_NO_SYMLINKS | RESOLVE_BENEATH`
//!   ([`crate::sys::dirfd`]), directories also with `RESOLVE_NO_XDEV`; a symlink is copied as a
//!   symlink (its target text, never resolved), so a link pointing out of the source copies no
//!   byte of what it points at;
//! - a mount point inside the source (`EXDEV`) fails the whole copy: a clone copies the volume's
//!   own filesystem only, and what is mounted there is not the volume;
//! - modes (with set-id and sticky bits, applied after the owner), owners and groups are
//!   preserved; directories get their mode after their contents are copied;
//! - regular files are reflinked (`FICLONE`) where the filesystem can share extents (XFS with
//!   reflink, btrfs), else copied with `copy_file_range`, else read and written;
//! - a copy carries regular files, directories and symlinks only: FIFOs, device nodes and sockets
//!   are skipped (a clone never mints device access, a FIFO is a rendezvous with a process that is
//!   not there, a socket is meaningless without its server), counted and named
//!   ([`Copied::skipped_names`], for the claim's event);
//! - a file is read only as the regular file `lstat` saw, through [`crate::sys::dirfd::open_regular`]
//!   (`O_PATH`, type and `(dev, ino)` checked, then a non-blocking reopen), and at most the size
//!   `lstat` gave; a directory is entered only as the inode `lstat` saw. So a name swapped between
//!   our `lstat` and our open (say a pod's `renameat2(RENAME_EXCHANGE)` of a file with a device
//!   node or a FIFO it made) fails the copy with [`CHANGED`] — the caller discards it — and never
//!   has us open, block on or read what was swapped in;
//! - hard links become separate files.
//!
//! Caller contract: `dst` is a fresh, empty directory of ours (only our marker in it) on the
//! filesystem whose quota is to hold the copy; the caller decides what happens to a half-done
//! copy (the hostPath and NFS provisioners remove the whole directory and start over).
//!
//! [`fingerprint`] walks a tree the same way (nothing followed, no mount crossed) and sums what
//! every entry's `lstat` says, change times included: equal fingerprints before and after a copy
//! mean nothing in the source changed meanwhile (the NFS provisioner's check, for writers on
//! other nodes).

use crate::sys::dirfd::{
    SafeError, create_new_file, kind_name, list, open_child_dir, open_child_dir_as, open_regular,
    rx,
};
use nix::fcntl::AtFlags;
use nix::sys::stat::{FileStat, Mode, SFlag, fchmod, fstatat};
use nix::unistd::{Gid, Uid, fchown, fchownat};
use std::ffi::{OsStr, OsString};
use std::os::fd::{AsFd, OwnedFd};

/// What a copy did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct Copied {
    /// Regular files copied.
    pub(crate) files: u64,
    /// Of those, reflinked (shared extents, no data written).
    pub(crate) reflinked: u64,
    /// Directories made.
    pub(crate) dirs: u64,
    /// Symlinks copied as symlinks.
    pub(crate) symlinks: u64,
    /// FIFOs, device nodes and sockets not copied.
    pub(crate) skipped: u64,
    /// The first [`NAMED_SKIPS`] of those, as `path (kind)`.
    pub(crate) skipped_names: Vec<String>,
    /// Bytes of regular files.
    pub(crate) bytes: u64,
}

/// How many skipped entries [`Copied::skipped_names`] names.
pub(crate) const NAMED_SKIPS: usize = 10;

/// What a copy's error starts with when the source changed under it (an entry replaced between
/// its `lstat` and its open): the copy is discarded and made again later.
pub(crate) const CHANGED: &str = "the source changed during the copy";

/// What a copy (or a walk of its source) can fail with, by the kind a caller branches on. The
/// message (`Display`) is the text of the claim's event, unchanged from when these were plain
/// strings. A plain `String` converts to [`CopyError::Failed`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum CopyError {
    /// A mount point inside the source: a clone copies its source's own filesystem only.
    #[error("{0}")]
    MountInside(String),
    /// The source changed under the copy: an entry swapped between its `lstat` and its open
    /// (another type, another inode, grown past a bound), or (made by the caller of
    /// [`copy_unchanged`]) the tree changed while it was copied; the message starts with
    /// [`CHANGED`]. The copy is discarded.
    #[error("{0}")]
    Changed(String),
    /// The source directory is not the inode its record names (replaced by another): nothing of
    /// it is copied.
    #[error("{0}")]
    Replaced(String),
    /// A step failed (the filesystem, a tree too deep).
    #[error("{0}")]
    Failed(String),
}

impl From<String> for CopyError {
    fn from(why: String) -> Self {
        Self::Failed(why)
    }
}

impl Copied {
    /// What the copy did, for the clone's PV annotation and event: counts, and the special files
    /// it left out by name.
    pub(crate) fn summary(&self) -> String {
        let mut s = format!(
            "{} files, {} reflinked, {} bytes, {} dirs, {} symlinks",
            self.files, self.reflinked, self.bytes, self.dirs, self.symlinks
        );
        if self.skipped > 0 {
            s.push_str(&format!(
                "; {} FIFOs, device nodes or sockets not copied: {}",
                self.skipped,
                self.skipped_names.join(", ")
            ));
            if self.skipped > u64::try_from(self.skipped_names.len()).unwrap_or(u64::MAX) {
                s.push_str(", ...");
            }
        }
        s
    }
}

/// How deep a tree may be (a walk deeper than this fails instead of running out of descriptors).
pub(crate) const MAX_DEPTH: usize = 256;

/// Copies the contents of the directory `src` into the directory `dst`, leaving out the names in
/// `skip` at the top level (our marker). Errors name the path (relative to `src`) that failed.
pub(crate) fn copy_tree(src: &OwnedFd, dst: &OwnedFd, skip: &[&str]) -> Result<Copied, CopyError> {
    copy_tree_with(src, dst, skip, &mut |_| {})
}

/// [`copy_tree`], calling `between` with each entry's relative path after its `lstat` and before
/// it is opened (the tests' pause point, where a pod would swap the entry).
fn copy_tree_with(
    src: &OwnedFd,
    dst: &OwnedFd,
    skip: &[&str],
    between: &mut dyn FnMut(&str),
) -> Result<Copied, CopyError> {
    let mut out = Copied::default();
    copy_dir(src, dst, skip, &mut OsString::new(), 0, &mut out, between)?;
    Ok(out)
}

/// Why [`copy_unchanged`] kept no copy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Unchanged {
    /// The source's tree could not be read for its [`fingerprint`].
    Read(CopyError),
    /// The copy itself failed ([`copy_tree`]'s error).
    Copy(CopyError),
    /// The source changed while it was copied: the copy is not one moment of it.
    Changed,
}

/// [`copy_tree`] of a source that must not change meanwhile: its [`fingerprint`] (every entry's
/// change time) after the copy, and after `meanwhile` (a pause point for the tests and the crash
/// tests), must equal the one before. The one check the hostPath and NFS clones share.
pub(crate) fn copy_unchanged(
    src: &OwnedFd,
    dst: &OwnedFd,
    skip: &[&str],
    meanwhile: &mut dyn FnMut(),
) -> Result<Copied, Unchanged> {
    let before = fingerprint(src).map_err(Unchanged::Read)?;
    let copied = copy_tree(src, dst, skip).map_err(Unchanged::Copy)?;
    meanwhile();
    if fingerprint(src).map_err(Unchanged::Read)? != before {
        return Err(Unchanged::Changed);
    }
    Ok(copied)
}

/// Whether the directory holds nothing but the names in `skip`.
pub(crate) fn is_empty_but(dir: &OwnedFd, skip: &[&str]) -> Result<bool, CopyError> {
    Ok(names(dir)?
        .iter()
        .all(|n| skip.iter().any(|s| OsStr::new(s) == n.as_os_str())))
}

/// A digest of the tree below `dir`: every entry's relative name, inode, mode, owner, size and
/// modification and change times (nanoseconds), in name order, nothing followed and no mount
/// crossed (`EXDEV` fails it, as in [`copy_tree`]). Any write, create, remove, rename or chmod
/// in the tree changes it (the entry's or its directory's ctime).
pub(crate) fn fingerprint(dir: &OwnedFd) -> Result<u64, CopyError> {
    use std::hash::{Hash, Hasher};
    fn walk(
        dir: &OwnedFd,
        rel: &mut OsString,
        depth: usize,
        h: &mut std::collections::hash_map::DefaultHasher,
    ) -> Result<(), CopyError> {
        if depth > MAX_DEPTH {
            return Err(CopyError::Failed(format!(
                "{}: deeper than {MAX_DEPTH} directories",
                rel.to_string_lossy()
            )));
        }
        let st =
            nix::sys::stat::fstat(dir).map_err(|e| format!("{}: {e}", rel.to_string_lossy()))?;
        (st.st_ino, st.st_mode, st.st_uid, st.st_gid).hash(h);
        (st.st_mtime, st.st_mtime_nsec, st.st_ctime, st.st_ctime_nsec).hash(h);
        for name in names(dir)? {
            let path = at(rel, &name);
            let st = fstatat(dir, name.as_os_str(), AtFlags::AT_SYMLINK_NOFOLLOW)
                .map_err(|e| format!("{path}: {e}"))?;
            path.hash(h);
            (st.st_ino, st.st_mode, st.st_uid, st.st_gid, st.st_size).hash(h);
            (st.st_mtime, st.st_mtime_nsec, st.st_ctime, st.st_ctime_nsec).hash(h);
            if SFlag::from_bits_truncate(st.st_mode & SFlag::S_IFMT.bits()) == SFlag::S_IFDIR {
                let child =
                    open_child_dir(dir, name.as_os_str()).map_err(|e| format!("{path}: {e}"))?;
                let mut sub = OsString::from(path);
                walk(&child, &mut sub, depth + 1, h)?;
            }
        }
        Ok(())
    }
    let mut h = std::collections::hash_map::DefaultHasher::new();
    walk(dir, &mut OsString::new(), 0, &mut h)?;
    Ok(h.finish())
}

fn names(dir: &OwnedFd) -> Result<Vec<OsString>, CopyError> {
    list(dir).map_err(|e| CopyError::Failed(e.to_string()))
}

fn at(rel: &OsString, name: &OsStr) -> String {
    let mut p = rel.clone();
    if !p.is_empty() {
        p.push("/");
    }
    p.push(name);
    p.to_string_lossy().into_owned()
}

fn own(fd: &impl AsFd, st: &FileStat) -> nix::Result<()> {
    fchown(
        fd.as_fd(),
        Some(Uid::from_raw(st.st_uid)),
        Some(Gid::from_raw(st.st_gid)),
    )?;
    // After the owner: chown clears the set-id bits.
    fchmod(fd.as_fd(), Mode::from_bits_truncate(st.st_mode & 0o7777))
}

/// [`own`]'s owner half for an entry of `dir` that is not opened (a symlink): never through a
/// link.
fn own_at(dir: &OwnedFd, name: &OsStr, st: &FileStat) -> nix::Result<()> {
    fchownat(
        dir,
        name,
        Some(Uid::from_raw(st.st_uid)),
        Some(Gid::from_raw(st.st_gid)),
        AtFlags::AT_SYMLINK_NOFOLLOW,
    )
}

fn copy_dir(
    src: &OwnedFd,
    dst: &OwnedFd,
    skip: &[&str],
    rel: &mut OsString,
    depth: usize,
    out: &mut Copied,
    between: &mut dyn FnMut(&str),
) -> Result<(), CopyError> {
    if depth > MAX_DEPTH {
        return Err(CopyError::Failed(format!(
            "{}: deeper than {MAX_DEPTH} directories",
            rel.to_string_lossy()
        )));
    }
    for name in names(src).map_err(|e| format!("cannot list {}: {e}", rel.to_string_lossy()))? {
        if depth == 0 && skip.iter().any(|s| OsStr::new(s) == name) {
            continue;
        }
        let path = at(rel, &name);
        let fail =
            |what: &str, e: nix::Error| CopyError::Failed(format!("cannot {what} {path}: {e}"));
        let safe = |e: SafeError| match e {
            SafeError::Sys(nix::Error::EXDEV) => CopyError::MountInside(format!(
                "{path} is a mount point: a clone copies its source's own filesystem only; unmount it"
            )),
            SafeError::Sys(e) => CopyError::Failed(format!("cannot open {path}: {e}")),
            e
            @ (SafeError::WrongType { .. } | SafeError::Replaced | SafeError::TooLarge { .. }) => {
                CopyError::Changed(format!("{CHANGED}: {path}: {e}"))
            }
        };
        let st = fstatat(src, name.as_os_str(), AtFlags::AT_SYMLINK_NOFOLLOW)
            .map_err(|e| fail("stat", e))?;
        let seen = (st.st_dev, st.st_ino);
        let kind = SFlag::from_bits_truncate(st.st_mode & SFlag::S_IFMT.bits());
        if kind == SFlag::S_IFDIR {
            between(&path);
            let sub = open_child_dir_as(src, name.as_os_str(), seen).map_err(safe)?;
            // The directory is made 0700 and gets its mode once its contents are in (a 0500
            // directory could not be filled).
            crate::sys::dirfd::mkdir(dst, name.as_os_str(), 0o700).map_err(|e| fail("make", e))?;
            let new = open_child_dir(dst, name.as_os_str()).map_err(|e| fail("open new", e))?;
            out.dirs += 1;
            let mut sub_rel = OsString::from(&path);
            copy_dir(&sub, &new, skip, &mut sub_rel, depth + 1, out, between)?;
            own(&new, &st).map_err(|e| fail("set the owner and mode of", e))?;
        } else if kind == SFlag::S_IFREG {
            between(&path);
            let from = open_regular(src, name.as_os_str(), Some(seen)).map_err(safe)?;
            let to =
                create_new_file(dst, name.as_os_str(), 0o600).map_err(|e| fail("create", e))?;
            let size = u64::try_from(st.st_size).unwrap_or(0);
            let (copied, reflinked) = copy_file(&from, &to, size).map_err(|e| fail("copy", e))?;
            if reflinked {
                out.reflinked += 1;
            }
            own(&to, &st).map_err(|e| fail("set the owner and mode of", e))?;
            out.files += 1;
            out.bytes += copied;
        } else if kind == SFlag::S_IFLNK {
            let target = rustix::fs::readlinkat(src, name.as_os_str(), Vec::new())
                .map_err(|e| fail("read the link", rx(e)))?;
            rustix::fs::symlinkat(target.as_c_str(), dst, name.as_os_str())
                .map_err(|e| fail("make the link", rx(e)))?;
            own_at(dst, name.as_os_str(), &st).map_err(|e| fail("set the owner of the link", e))?;
            out.symlinks += 1;
        } else {
            // A FIFO, a device node or a socket: never opened, never recreated.
            out.skipped += 1;
            if out.skipped_names.len() < NAMED_SKIPS {
                out.skipped_names
                    .push(format!("{path:?} ({})", kind_name(st.st_mode)));
            }
        }
    }
    Ok(())
}

/// Copies at most `size` bytes of the regular file `from` into the empty file `to` (a file that
/// grew after its `lstat` is copied as it was then, never read to its end); returns the bytes
/// copied and whether it was reflinked.
fn copy_file(from: &OwnedFd, to: &OwnedFd, size: u64) -> nix::Result<(u64, bool)> {
    if size > 0 && rustix::fs::ioctl_ficlone(to, from).is_ok() {
        // A reflink shares the whole file as it is now: cut it back to the size seen.
        rustix::fs::ftruncate(to, size).map_err(rx)?;
        return Ok((size, true));
    }
    let mut left = size;
    let mut fallback = false;
    while left > 0 {
        match rustix::fs::copy_file_range(
            from,
            None,
            to,
            None,
            usize::try_from(left.min(1 << 30)).unwrap_or(1 << 20),
        ) {
            Ok(0) => break, // the file shrank meanwhile
            Ok(n) => left = left.saturating_sub(u64::try_from(n).unwrap_or(u64::MAX)),
            Err(rustix::io::Errno::XDEV | rustix::io::Errno::INVAL | rustix::io::Errno::NOSYS)
                if left == size =>
            {
                fallback = true;
                break;
            }
            Err(e) => return Err(rx(e)),
        }
    }
    if fallback {
        let mut buf = vec![0u8; 1 << 20];
        while left > 0 {
            let want = usize::try_from(left.min(1 << 20)).unwrap_or(1 << 20);
            let n = nix::unistd::read(from, buf.get_mut(..want).unwrap_or_default())?;
            if n == 0 {
                break;
            }
            let chunk = buf.get(..n).unwrap_or_default();
            let mut w = 0;
            while w < n {
                w += nix::unistd::write(to, chunk.get(w..).unwrap_or_default())?;
            }
            left = left.saturating_sub(u64::try_from(n).unwrap_or(u64::MAX));
        }
    }
    Ok((size.saturating_sub(left), false))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sys::dirfd::open_dir;
    use nix::sys::stat::mknodat;
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    use std::path::Path;

    fn copy(src: &Path, dst: &Path) -> Result<Copied, CopyError> {
        std::fs::create_dir_all(dst).unwrap();
        copy_tree(
            &open_dir(src).unwrap(),
            &open_dir(dst).unwrap(),
            &[".marker"],
        )
    }

    /// The same fd listed and walked again gives the same digest (a copy in between changes
    /// nothing in the source); a write, a new file deep down, a chmod or a rename changes it;
    /// emptiness ignores the names skipped.
    #[test]
    fn a_fingerprint_changes_with_any_change_in_the_tree_and_not_with_a_copy() {
        let d = tempfile::tempdir().unwrap();
        let d = d.path().canonicalize().unwrap();
        let (src, dst) = (d.join("src"), d.join("dst"));
        std::fs::create_dir_all(src.join("x/y")).unwrap();
        std::fs::create_dir_all(&dst).unwrap();
        std::fs::write(src.join("x/y/f"), b"hello").unwrap();
        let s = open_dir(&src).unwrap();
        let dfd = open_dir(&dst).unwrap();
        assert!(is_empty_but(&dfd, &[]).unwrap());
        let a = fingerprint(&s).unwrap();
        assert_eq!(fingerprint(&s).unwrap(), a);
        let c = copy_tree(&s, &dfd, &[]).unwrap();
        assert_eq!(
            c.files, 1,
            "the fd listed twice before is listed again from its start"
        );
        assert_eq!(fingerprint(&s).unwrap(), a);
        assert!(!is_empty_but(&dfd, &[]).unwrap());
        assert!(is_empty_but(&dfd, &["x"]).unwrap());
        let changes: [&dyn Fn(); 4] = [
            &|| std::fs::write(src.join("x/y/f"), b"hellO").unwrap(),
            &|| std::fs::write(src.join("x/y/g"), b"").unwrap(),
            &|| {
                std::fs::set_permissions(src.join("x/y/f"), PermissionsExt::from_mode(0o600))
                    .unwrap()
            },
            &|| std::fs::rename(src.join("x/y/g"), src.join("x/g")).unwrap(),
        ];
        let mut last = a;
        for change in changes {
            change();
            let now = fingerprint(&s).unwrap();
            assert_ne!(now, last);
            last = now;
        }
    }

    #[test]
    fn an_unprivileged_tree_is_copied_with_modes_and_links_as_links() {
        let d = tempfile::tempdir().unwrap();
        let d = d.path().canonicalize().unwrap();
        let (src, dst) = (d.join("src"), d.join("dst"));
        std::fs::create_dir_all(src.join("a/b")).unwrap();
        std::fs::write(src.join(".marker"), b"ours").unwrap();
        std::fs::write(src.join("a/b/data"), vec![7u8; 300_000]).unwrap();
        std::fs::write(src.join("empty"), b"").unwrap();
        std::fs::set_permissions(src.join("a/b/data"), PermissionsExt::from_mode(0o640)).unwrap();
        std::fs::set_permissions(src.join("a"), PermissionsExt::from_mode(0o2750)).unwrap();
        std::fs::write(d.join("secret"), b"not the volume's").unwrap();
        std::os::unix::fs::symlink(d.join("secret"), src.join("out-abs")).unwrap();
        std::os::unix::fs::symlink("../../../secret", src.join("a/b/out-rel")).unwrap();
        // A directory that cannot be written once made still gets its contents.
        std::fs::create_dir(src.join("ro")).unwrap();
        std::fs::write(src.join("ro/f"), b"x").unwrap();
        std::fs::set_permissions(src.join("ro"), PermissionsExt::from_mode(0o500)).unwrap();
        nix::unistd::mkfifo(&src.join("fifo"), Mode::from_bits_truncate(0o620)).unwrap();
        let _sock = std::os::unix::net::UnixListener::bind(src.join("sock")).unwrap();

        let c = copy(&src, &dst).unwrap();
        assert_eq!(
            (c.files, c.dirs, c.symlinks, c.skipped, c.bytes),
            (3, 3, 2, 2, 300_001),
            "{c:?}"
        );
        assert_eq!(
            c.skipped_names,
            ["\"fifo\" (FIFO)", "\"sock\" (socket)"],
            "special files are named, never copied"
        );
        assert!(c.summary().ends_with(
            "; 2 FIFOs, device nodes or sockets not copied: \"fifo\" (FIFO), \"sock\" (socket)"
        ));
        assert!(
            !dst.join(".marker").exists(),
            "the source's marker is not copied"
        );
        assert_eq!(
            std::fs::read(dst.join("a/b/data")).unwrap(),
            vec![7u8; 300_000]
        );
        assert_eq!(std::fs::read(dst.join("ro/f")).unwrap(), b"x");
        let mode = |p: &Path| std::fs::symlink_metadata(p).unwrap().mode() & 0o7777;
        assert_eq!(mode(&dst.join("a/b/data")), 0o640);
        assert_eq!(mode(&dst.join("a")), 0o2750);
        assert_eq!(mode(&dst.join("ro")), 0o500);
        assert!(!dst.join("fifo").exists(), "a FIFO is not copied");
        assert!(!dst.join("sock").exists(), "a socket is not copied");
        // Links stay links with the same text; no byte of what they point at is copied.
        for (l, t) in [
            ("out-abs", d.join("secret")),
            ("a/b/out-rel", "../../../secret".into()),
        ] {
            assert!(
                std::fs::symlink_metadata(dst.join(l))
                    .unwrap()
                    .file_type()
                    .is_symlink()
            );
            assert_eq!(std::fs::read_link(dst.join(l)).unwrap(), t);
        }
        let total: u64 = walk(&dst);
        assert_eq!(total, 300_001, "only the volume's own bytes");
        // The copy is a copy: writing it leaves the source alone (reflinked or not).
        std::fs::write(dst.join("a/b/data"), b"changed").unwrap();
        assert_eq!(std::fs::read(src.join("a/b/data")).unwrap().len(), 300_000);
        std::fs::set_permissions(src.join("ro"), PermissionsExt::from_mode(0o700)).unwrap();
        std::fs::set_permissions(dst.join("ro"), PermissionsExt::from_mode(0o700)).unwrap();
    }

    /// Bytes of the regular files below `p`, no link followed.
    fn walk(p: &Path) -> u64 {
        let mut n = 0;
        for e in std::fs::read_dir(p).unwrap() {
            let e = e.unwrap();
            let t = e.file_type().unwrap();
            if t.is_dir() {
                n += walk(&e.path());
            } else if t.is_file() {
                n += e.metadata().unwrap().len();
            }
        }
        n
    }

    #[test]
    #[allow(clippy::print_stderr)] // says why it is skipped
    fn root_owners_are_kept_devices_are_not_minted_and_a_mount_inside_fails_the_copy() {
        if !nix::unistd::geteuid().is_root() {
            eprintln!("skipped: needs root (chown, mknod, mount)");
            return;
        }
        let d = tempfile::tempdir().unwrap();
        let d = d.path().canonicalize().unwrap();
        let (src, dst) = (d.join("src"), d.join("dst"));
        std::fs::create_dir_all(src.join("sub/mnt")).unwrap();
        std::fs::write(src.join("sub/f"), b"owned").unwrap();
        std::fs::set_permissions(src.join("sub/f"), PermissionsExt::from_mode(0o4755)).unwrap();
        nix::unistd::chown(
            &src.join("sub/f"),
            Some(Uid::from_raw(1234)),
            Some(Gid::from_raw(5678)),
        )
        .unwrap();
        std::fs::set_permissions(src.join("sub/f"), PermissionsExt::from_mode(0o4755)).unwrap();
        nix::unistd::chown(
            &src.join("sub"),
            Some(Uid::from_raw(1234)),
            Some(Gid::from_raw(5678)),
        )
        .unwrap();
        std::os::unix::fs::symlink("/etc/shadow", src.join("sub/shadow")).unwrap();
        nix::unistd::fchownat(
            nix::fcntl::AT_FDCWD,
            &src.join("sub/shadow"),
            Some(Uid::from_raw(1234)),
            None,
            AtFlags::AT_SYMLINK_NOFOLLOW,
        )
        .unwrap();
        // A device node (as /dev/null): never recreated in a tenant's copy.
        mknodat(
            nix::fcntl::AT_FDCWD,
            &src.join("null"),
            SFlag::S_IFCHR,
            Mode::from_bits_truncate(0o666),
            nix::sys::stat::makedev(1, 3),
        )
        .unwrap();
        let c = copy(&src, &dst).unwrap();
        assert_eq!((c.files, c.skipped, c.symlinks), (1, 1, 1), "{c:?}");
        assert!(std::fs::symlink_metadata(dst.join("null")).is_err());
        let m = std::fs::metadata(dst.join("sub/f")).unwrap();
        assert_eq!((m.uid(), m.gid(), m.mode() & 0o7777), (1234, 5678, 0o4755));
        let m = std::fs::metadata(dst.join("sub")).unwrap();
        assert_eq!((m.uid(), m.gid()), (1234, 5678));
        let m = std::fs::symlink_metadata(dst.join("sub/shadow")).unwrap();
        assert!(m.file_type().is_symlink());
        assert_eq!(m.uid(), 1234);

        // A mount inside the source: the copy fails and says where.
        nix::mount::mount(
            Some("tmpfs"),
            &src.join("sub/mnt"),
            Some("tmpfs"),
            nix::mount::MsFlags::empty(),
            None::<&str>,
        )
        .unwrap();
        std::fs::write(src.join("sub/mnt/other-fs"), b"not the volume").unwrap();
        let e = copy(&src, &d.join("dst2"));
        nix::mount::umount2(&src.join("sub/mnt"), nix::mount::MntFlags::MNT_DETACH).unwrap();
        let e = e.unwrap_err();
        assert!(matches!(e, CopyError::MountInside(_)), "{e:?}");
        assert!(e.to_string().contains("sub/mnt is a mount point"), "{e}");
        assert!(!d.join("dst2/sub/mnt/other-fs").exists());
    }

    /// The copy of `src` into a fresh `dst` with `swap` run between the `lstat` and the open of
    /// the entry `at`, in a thread: `None` when it has not returned within 10 s (a copy blocked
    /// in `open` on a FIFO).
    fn copy_racing(
        src: &Path,
        dst: &Path,
        at: &'static str,
        swap: impl FnOnce() + Send + 'static,
    ) -> Option<Result<Copied, CopyError>> {
        std::fs::create_dir_all(dst).unwrap();
        let (s, d) = (open_dir(src).unwrap(), open_dir(dst).unwrap());
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut swap = Some(swap);
            let r = copy_tree_with(&s, &d, &[], &mut |p| {
                if p == at
                    && let Some(f) = swap.take()
                {
                    f();
                }
            });
            let _ = tx.send(r);
        });
        rx.recv_timeout(std::time::Duration::from_secs(10)).ok()
    }

    /// `renameat2(RENAME_EXCHANGE)` of two names, as a pod swaps them.
    fn exchange(a: &Path, b: &Path) {
        nix::fcntl::renameat2(
            nix::fcntl::AT_FDCWD,
            a,
            nix::fcntl::AT_FDCWD,
            b,
            nix::fcntl::RenameFlags::RENAME_EXCHANGE,
        )
        .unwrap();
    }

    /// Issue #32, 1: a pod swaps a regular file for a FIFO it made between our `lstat` and our
    /// open. The copy neither blocks on the FIFO (the old open did, for ever) nor copies it: it
    /// fails as changed, promptly. The same for a regular file swapped for another one (another
    /// inode), and for a directory swapped for another directory.
    #[test]
    fn an_entry_swapped_between_lstat_and_open_fails_the_copy_and_nothing_blocks() {
        let d = tempfile::tempdir().unwrap();
        let d = d.path().canonicalize().unwrap();
        let src = d.join("src");
        std::fs::create_dir_all(src.join("dir")).unwrap();
        std::fs::write(src.join("data"), b"hello").unwrap();
        std::fs::create_dir_all(d.join("stash/dir")).unwrap();
        nix::unistd::mkfifo(&d.join("stash/fifo"), Mode::from_bits_truncate(0o600)).unwrap();
        std::fs::write(d.join("stash/other"), b"another file").unwrap();
        for (n, (at, from)) in [("data", "fifo"), ("data", "other"), ("dir", "dir")]
            .into_iter()
            .enumerate()
        {
            let (a, b) = (d.join("stash").join(from), src.join(at));
            let r = copy_racing(&src, &d.join(format!("dst{n}")), at, move || {
                exchange(&a, &b)
            })
            .unwrap_or_else(|| panic!("the copy blocked on the {from} swapped in at {at}"));
            let e = r.unwrap_err();
            assert!(matches!(e, CopyError::Changed(_)), "{e:?}");
            let e = e.to_string();
            assert!(e.starts_with(CHANGED) && e.contains(at), "{e}");
            // Swap back for the next round.
            exchange(&d.join("stash").join(from), &src.join(at));
        }
        // Unraced, the same tree copies.
        let c = copy(&src, &d.join("dst-ok")).unwrap();
        assert_eq!((c.files, c.dirs, c.bytes), (1, 1, 5));
    }

    /// Issue #32, 1: a pod with `CAP_MKNOD` swaps a regular file of its volume for a device node
    /// (here /dev/null's numbers; a real attack names the node's disk or another tenant's LV):
    /// the copy never opens nor reads it, and fails as changed. The old copy read the device "to
    /// EOF" into the tenant's clone.
    #[test]
    #[allow(clippy::print_stderr)] // says why it is skipped
    fn a_device_node_swapped_in_is_never_read_into_the_clone() {
        if !nix::unistd::geteuid().is_root() {
            eprintln!("skipped: needs root (mknod)");
            return;
        }
        let d = tempfile::tempdir().unwrap();
        let d = d.path().canonicalize().unwrap();
        let src = d.join("src");
        std::fs::create_dir_all(&src).unwrap();
        std::fs::create_dir_all(d.join("stash")).unwrap();
        std::fs::write(src.join("disk.img"), vec![1u8; 4096]).unwrap();
        mknodat(
            nix::fcntl::AT_FDCWD,
            &d.join("stash/dev"),
            SFlag::S_IFCHR,
            Mode::from_bits_truncate(0o600),
            nix::sys::stat::makedev(1, 3),
        )
        .unwrap();
        let (a, b) = (d.join("stash/dev"), src.join("disk.img"));
        let e = copy_racing(&src, &d.join("dst"), "disk.img", move || exchange(&a, &b))
            .expect("the copy returns")
            .unwrap_err();
        assert!(matches!(e, CopyError::Changed(_)), "{e:?}");
        let e = e.to_string();
        assert!(
            e.starts_with(CHANGED) && e.contains("character device"),
            "{e}"
        );
        assert!(
            std::fs::symlink_metadata(d.join("dst/disk.img")).is_err(),
            "nothing was written for it"
        );
    }

    /// A file that grows after its `lstat` is copied as it was then: never read to its end.
    #[test]
    fn a_file_is_read_at_most_to_the_size_seen() {
        let d = tempfile::tempdir().unwrap();
        let d = d.path().canonicalize().unwrap();
        let src = d.join("src");
        std::fs::create_dir_all(&src).unwrap();
        std::fs::write(src.join("log"), vec![b'a'; 1000]).unwrap();
        let p = src.join("log");
        let c = copy_racing(&src, &d.join("dst"), "log", move || {
            use std::io::Write;
            let mut f = std::fs::OpenOptions::new().append(true).open(&p).unwrap();
            f.write_all(&[b'b'; 5000]).unwrap();
        })
        .unwrap()
        .unwrap();
        assert_eq!(c.bytes, 1000);
        assert_eq!(std::fs::read(d.join("dst/log")).unwrap(), vec![b'a'; 1000]);
    }
}
