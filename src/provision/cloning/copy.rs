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
//! - FIFOs are recreated; device nodes and sockets are not (a clone never mints device access,
//!   and a socket is meaningless without its server): they are counted and reported;
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

use crate::sys::dirfd::{create_new_file, open_child_dir, open_file};
use nix::fcntl::AtFlags;
use nix::sys::stat::{FileStat, Mode, SFlag, fchmod, fchmodat, fstatat, mknodat};
use nix::unistd::{Gid, Uid, fchown, fchownat};
use std::ffi::{OsStr, OsString};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;

/// What a copy did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Copied {
    /// Regular files copied.
    pub files: u64,
    /// Of those, reflinked (shared extents, no data written).
    pub reflinked: u64,
    /// Directories made.
    pub dirs: u64,
    /// Symlinks copied as symlinks.
    pub symlinks: u64,
    /// FIFOs recreated.
    pub fifos: u64,
    /// Device nodes and sockets not copied.
    pub skipped: u64,
    /// Bytes of regular files.
    pub bytes: u64,
}

/// How deep a tree may be (a walk deeper than this fails instead of running out of descriptors).
pub const MAX_DEPTH: usize = 256;

/// Copies the contents of the directory `src` into the directory `dst`, leaving out the names in
/// `skip` at the top level (our marker). Errors name the path (relative to `src`) that failed.
pub fn copy_tree(src: &OwnedFd, dst: &OwnedFd, skip: &[&str]) -> Result<Copied, String> {
    let mut out = Copied::default();
    copy_dir(src, dst, skip, &mut OsString::new(), 0, &mut out)?;
    Ok(out)
}

/// Whether the directory holds nothing but the names in `skip`.
pub fn is_empty_but(dir: &OwnedFd, skip: &[&str]) -> Result<bool, String> {
    Ok(names(dir)?
        .iter()
        .all(|n| skip.iter().any(|s| OsStr::new(s) == n.as_os_str())))
}

/// A digest of the tree below `dir`: every entry's relative name, inode, mode, owner, size and
/// modification and change times (nanoseconds), in name order, nothing followed and no mount
/// crossed (`EXDEV` fails it, as in [`copy_tree`]). Any write, create, remove, rename or chmod
/// in the tree changes it (the entry's or its directory's ctime).
pub fn fingerprint(dir: &OwnedFd) -> Result<u64, String> {
    use std::hash::{Hash, Hasher};
    fn walk(
        dir: &OwnedFd,
        rel: &mut OsString,
        depth: usize,
        h: &mut std::collections::hash_map::DefaultHasher,
    ) -> Result<(), String> {
        if depth > MAX_DEPTH {
            return Err(format!(
                "{}: deeper than {MAX_DEPTH} directories",
                rel.to_string_lossy()
            ));
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

fn names(dir: &OwnedFd) -> Result<Vec<OsString>, String> {
    let dup = dir.try_clone().map_err(|e| e.to_string())?;
    // A dup shares the directory's offset: from the start, so a directory can be listed twice
    // (fingerprint, copy, fingerprint).
    rustix::fs::seek(&dup, rustix::fs::SeekFrom::Start(0)).map_err(|e| e.to_string())?;
    let d = rustix::fs::Dir::new(dup).map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    for e in d {
        let e = e.map_err(|e| e.to_string())?;
        let n = e.file_name().to_bytes();
        if n != b"." && n != b".." {
            out.push(OsStr::from_bytes(n).to_owned());
        }
    }
    out.sort();
    Ok(out)
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

/// [`own`]'s owner half for an entry of `dir` that is not opened (a symlink, a FIFO): never
/// through a link.
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
) -> Result<(), String> {
    if depth > MAX_DEPTH {
        return Err(format!(
            "{}: deeper than {MAX_DEPTH} directories",
            rel.to_string_lossy()
        ));
    }
    for name in names(src).map_err(|e| format!("cannot list {}: {e}", rel.to_string_lossy()))? {
        if depth == 0 && skip.iter().any(|s| OsStr::new(s) == name) {
            continue;
        }
        let path = at(rel, &name);
        let fail = |what: &str, e: nix::Error| format!("cannot {what} {path}: {e}");
        let st = fstatat(src, name.as_os_str(), AtFlags::AT_SYMLINK_NOFOLLOW)
            .map_err(|e| fail("stat", e))?;
        let kind = SFlag::from_bits_truncate(st.st_mode & SFlag::S_IFMT.bits());
        if kind == SFlag::S_IFDIR {
            let sub = open_child_dir(src, name.as_os_str()).map_err(|e| match e {
                nix::Error::EXDEV => format!(
                    "{path} is a mount point: a clone copies its source's own filesystem only; unmount it"
                ),
                e => fail("open", e),
            })?;
            // The directory is made 0700 and gets its mode once its contents are in (a 0500
            // directory could not be filled).
            crate::sys::dirfd::mkdir(dst, name.as_os_str(), 0o700).map_err(|e| fail("make", e))?;
            let new = open_child_dir(dst, name.as_os_str()).map_err(|e| fail("open new", e))?;
            out.dirs += 1;
            let mut sub_rel = OsString::from(&path);
            copy_dir(&sub, &new, skip, &mut sub_rel, depth + 1, out)?;
            own(&new, &st).map_err(|e| fail("set the owner and mode of", e))?;
        } else if kind == SFlag::S_IFREG {
            let from = open_file(src, name.as_os_str()).map_err(|e| fail("open", e))?;
            let to =
                create_new_file(dst, name.as_os_str(), 0o600).map_err(|e| fail("create", e))?;
            let size = u64::try_from(st.st_size).unwrap_or(0);
            if copy_file(&from, &to, size).map_err(|e| fail("copy", e))? {
                out.reflinked += 1;
            }
            own(&to, &st).map_err(|e| fail("set the owner and mode of", e))?;
            out.files += 1;
            out.bytes += size;
        } else if kind == SFlag::S_IFLNK {
            let target = rustix::fs::readlinkat(src, name.as_os_str(), Vec::new())
                .map_err(|e| fail("read the link", rx(e)))?;
            rustix::fs::symlinkat(target.as_c_str(), dst, name.as_os_str())
                .map_err(|e| fail("make the link", rx(e)))?;
            own_at(dst, name.as_os_str(), &st).map_err(|e| fail("set the owner of the link", e))?;
            out.symlinks += 1;
        } else if kind == SFlag::S_IFIFO {
            mknodat(
                dst,
                name.as_os_str(),
                SFlag::S_IFIFO,
                Mode::from_bits_truncate(0o600),
                0,
            )
            .map_err(|e| fail("make the fifo", e))?;
            own_at(dst, name.as_os_str(), &st).map_err(|e| fail("set the owner of the fifo", e))?;
            fchmodat(
                dst,
                name.as_os_str(),
                Mode::from_bits_truncate(st.st_mode & 0o7777),
                nix::sys::stat::FchmodatFlags::FollowSymlink,
            )
            .map_err(|e| fail("set the mode of the fifo", e))?;
            out.fifos += 1;
        } else {
            out.skipped += 1;
        }
    }
    Ok(())
}

/// A rustix error as nix's (the same errno).
fn rx(e: rustix::io::Errno) -> nix::Error {
    nix::Error::from_raw(e.raw_os_error())
}

/// Copies the regular file `from` into the empty file `to`; `true` when reflinked.
fn copy_file(from: &OwnedFd, to: &OwnedFd, size: u64) -> nix::Result<bool> {
    if size > 0 && rustix::fs::ioctl_ficlone(to, from).is_ok() {
        return Ok(true);
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
        loop {
            let n = nix::unistd::read(from, &mut buf)?;
            if n == 0 {
                break;
            }
            let mut w = 0;
            while w < n {
                w += nix::unistd::write(to, &buf[w..n])?;
            }
        }
    }
    Ok(false)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sys::dirfd::open_dir;
    use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
    use std::path::Path;

    fn copy(src: &Path, dst: &Path) -> Result<Copied, String> {
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
        std::fs::set_permissions(src.join("fifo"), PermissionsExt::from_mode(0o620)).unwrap();
        let _sock = std::os::unix::net::UnixListener::bind(src.join("sock")).unwrap();

        let c = copy(&src, &dst).unwrap();
        assert_eq!(
            (c.files, c.dirs, c.symlinks, c.fifos, c.skipped, c.bytes),
            (3, 3, 2, 1, 1, 300_001),
            "{c:?}"
        );
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
        assert_eq!(mode(&dst.join("fifo")), 0o620);
        assert!(
            std::fs::symlink_metadata(dst.join("fifo"))
                .unwrap()
                .file_type()
                .is_fifo()
        );
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
        assert!(e.contains("sub/mnt is a mount point"), "{e}");
        assert!(!d.join("dst2/sub/mnt/other-fs").exists());
    }
}
