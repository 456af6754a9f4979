//! Resolving and creating host paths without being fooled by symlinks.
//!
//! A host path is checked against policy after resolving every symlink in it, then opened with
//! `openat2(RESOLVE_NO_SYMLINKS)` on that canonical form: if anything in the path was swapped for a
//! symlink after the check (say by a pod that can write into an allowed root), the open fails
//! instead of following it. The returned `O_PATH` descriptor is what gets mounted (via
//! `/proc/self/fd/N`), so the inode that passed the checks is the inode that is mounted.
//! Missing directories are created one component at a time relative to a descriptor of their
//! parent, again never following symlinks.

use nix::fcntl::{AT_FDCWD, OFlag, OpenHow, ResolveFlag, openat2};
#[cfg(test)]
use nix::sys::stat::fstat;
use nix::sys::stat::{Mode, SFlag, fchmod, mkdirat};
use nix::unistd::{Gid, Uid, fchown};
use std::ffi::OsString;
#[cfg(test)]
use std::os::fd::AsFd;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Component, Path, PathBuf};

/// What kind of file a path is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FileKind {
    /// A directory.
    Directory,
    /// A regular file.
    File,
    /// A unix socket.
    Socket,
    /// A character device.
    CharDevice,
    /// A block device.
    BlockDevice,
    /// A fifo or anything else.
    Other,
}

impl FileKind {
    /// Human name for messages.
    pub(crate) fn describe(self) -> &'static str {
        match self {
            FileKind::Directory => "a directory",
            FileKind::File => "a regular file",
            FileKind::Socket => "a socket",
            FileKind::CharDevice => "a character device",
            FileKind::BlockDevice => "a block device",
            FileKind::Other => "a special file",
        }
    }
}

/// Ownership and permissions for things the driver creates.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Ownership {
    /// Owner uid.
    pub uid: Option<u32>,
    /// Owner gid.
    pub(crate) gid: Option<u32>,
    /// Permission bits; `None` keeps the default (0755 dirs, 0644 files, applied without umask).
    pub(crate) mode: Option<u32>,
}

impl Ownership {
    /// Checks a `uid`/`gid` value: digits only, at most 10 of them, below 4294967295. The one
    /// rule for the driver's options and the provisioners' class parameters; the error says why.
    pub(crate) fn parse_id(v: &str) -> Result<u32, &'static str> {
        let bad = "expected a numeric id (digits only)";
        if v.is_empty() || v.len() > 10 || !v.bytes().all(|b| b.is_ascii_digit()) {
            return Err(bad);
        }
        let id: u32 = v.parse().map_err(|_| bad)?;
        // chown(2) reads (uid_t)-1 as "leave unchanged": accepting it would silently ignore
        // what the user asked for.
        if id == u32::MAX {
            return Err(
                "4294967295 is (uid_t)-1, which chown reads as \"no change\"; use an id below it",
            );
        }
        Ok(id)
    }

    /// Checks a `mode` value: octal permission bits only (at most `0777`, optional `0` or `0o`
    /// prefix). Set-uid, set-gid and sticky bits are refused: nobody outside the node's root
    /// may make flexvol create a set-gid directory (inherited group) or a sticky one on the node.
    pub(crate) fn parse_mode(v: &str) -> Result<u32, &'static str> {
        let digits = v.strip_prefix("0o").unwrap_or(v);
        let m = Some(digits)
            .filter(|d| {
                !d.is_empty() && d.len() <= 6 && d.bytes().all(|b| (b'0'..=b'7').contains(&b))
            })
            .and_then(|d| u32::from_str_radix(d, 8).ok())
            .filter(|m| *m <= 0o7777)
            .ok_or("expected octal permission bits such as 0755")?;
        if m > 0o777 {
            return Err(
                "set-uid, set-gid and sticky bits are not allowed on what the driver creates; use permission bits only (at most 0777)",
            );
        }
        Ok(m)
    }
}

/// Splits a path into its longest existing ancestor, resolved (canonical), and the components
/// below it that do not exist yet. The input must be absolute and free of `..`.
///
/// A dangling symlink on the way is an error of kind `NotFound` whose text says so (naming the
/// link and its target): it is not a missing component that could be created, and reporting it
/// as one, or as "a symlink appeared", would send the reader looking for a race.
pub(crate) fn resolve_existing(path: &Path) -> std::io::Result<(PathBuf, Vec<OsString>)> {
    resolve_existing_opened(path, false)
}

/// [`resolve_existing`], told whether the caller has just opened `path` itself with
/// `RESOLVE_NO_SYMLINKS` ([`cached_device_nofollow`] answered a descriptor): then the path is
/// known canonical as named, which [`canonical_as_named`] would open it again to learn.
pub(crate) fn resolve_existing_opened(
    path: &Path,
    opened_nofollow: bool,
) -> std::io::Result<(PathBuf, Vec<OsString>)> {
    if opened_nofollow && path.is_absolute() && !has_dotdot(path) {
        return Ok((path.components().collect(), Vec::new()));
    }
    if let Some(p) = canonical_as_named(path) {
        return Ok((p, Vec::new()));
    }
    let mut missing = Vec::new();
    let mut cur = path.to_path_buf();
    loop {
        match std::fs::canonicalize(&cur) {
            Ok(real) => {
                missing.reverse();
                return Ok((real, missing));
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                if let Ok(target) = std::fs::read_link(&cur) {
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::NotFound,
                        format!(
                            "{} is a dangling symlink (it points to {}, which does not exist); remove it or make its target exist",
                            cur.display(),
                            target.display()
                        ),
                    ));
                }
                let Some(name) = cur.file_name() else {
                    return Err(e);
                };
                missing.push(name.to_owned());
                if !cur.pop() {
                    return Err(e);
                }
            }
            Err(e) => return Err(e),
        }
    }
}

/// `path` itself, normalized, when it is already canonical: absolute, without `..`, and reached
/// without any symlink (an `openat2(RESOLVE_NO_SYMLINKS)` of it succeeds), so that
/// `canonicalize` would return exactly its components. `None` when that cannot be shown cheaply
/// (a symlink on the way, a missing component, any error): callers then resolve it the slow way.
/// Two syscalls (open `O_PATH`, close) whatever the depth, against one readlink per component.
pub(crate) fn canonical_as_named(path: &Path) -> Option<PathBuf> {
    if !path.is_absolute() || has_dotdot(path) {
        return None;
    }
    open_nofollow(path).ok()?;
    // components() drops `.`, repeated and trailing slashes: the form canonicalize returns.
    Some(path.components().collect())
}

/// What an existing path really is: its canonical form and its metadata (symlinks followed).
/// A path reached without symlinks (the common case: fixed system locations) costs three
/// syscalls: `openat2(RESOLVE_NO_SYMLINKS)` proves it canonical already (see
/// [`canonical_as_named`]), then fstat and close. Otherwise a constant four whatever its depth
/// (open `O_PATH` following symlinks, fstat, readlink of `/proc/self/fd/N`, close), where
/// `canonicalize` costs one per component. Fails exactly when the path does not resolve: a
/// missing component met before any symlink fails the symlink-following open as well.
pub(crate) fn real_path(path: &Path) -> std::io::Result<(PathBuf, std::fs::Metadata)> {
    use std::os::unix::fs::OpenOptionsExt;
    if path.is_absolute() && !has_dotdot(path) {
        match open_nofollow(path) {
            Ok(fd) => {
                let meta = std::fs::File::from(fd).metadata()?;
                return Ok((path.components().collect(), meta));
            }
            Err(nix::Error::ENOENT) => return Err(std::io::Error::from(nix::Error::ENOENT)),
            // A symlink on the way (ELOOP) or anything else: the general way below.
            Err(_) => {}
        }
    }
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_PATH)
        .open(path)?;
    let meta = f.metadata()?;
    let real = std::fs::read_link(format!("/proc/self/fd/{}", f.as_raw_fd()))
        .ok()
        .filter(|p| p.is_absolute())
        .map_or_else(|| std::fs::canonicalize(path), Ok)?;
    Ok((real, meta))
}

/// Resolves many absolute paths that share ancestors (the protected locations the hostPath
/// policy compares against: `/var/lib/...`, `/run/...`, flexvol's own directories) more cheaply
/// than [`real_path`] on each: one `lstat` per path, then one per ancestor not seen before. A
/// path none of whose components is a symlink is canonical as named, and its `lstat` is its
/// metadata; a missing path costs that one `lstat` alone (where an open of it costs a file
/// allocation as well). Anything else (a symlink on the way, `..`, a relative path, an error other
/// than a missing component) goes to [`real_path`], so the answers are [`real_path`]'s.
///
/// Caller contract: one resolver per decision. It remembers which ancestors are symlinks, so a
/// resolver kept across a change of the file system would answer from the past.
pub(crate) struct SharedResolver {
    /// Paths looked at so far, normalized, with what `lstat` answered: the part of it a decision
    /// uses (a whole `stat` is 144 bytes, and the hostPath policy keeps some forty).
    seen: Vec<(PathBuf, nix::Result<Lstat>)>,
}

/// What [`SharedResolver::lstat`] keeps of an `lstat` answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Lstat {
    /// Device of the filesystem holding the entry.
    pub(crate) dev: u64,
    /// Inode number.
    pub(crate) ino: u64,
    /// Type and permission bits (`st_mode`).
    pub(crate) mode: u32,
}

impl Lstat {
    /// What kind of file the entry is (a symlink is [`FileKind::Other`]).
    pub fn kind(&self) -> FileKind {
        kind_of_mode(self.mode)
    }

    /// Whether the entry is a symlink.
    pub(crate) fn is_link(&self) -> bool {
        SFlag::from_bits_truncate(self.mode & SFlag::S_IFMT.bits()) == SFlag::S_IFLNK
    }
}

impl Default for SharedResolver {
    fn default() -> Self {
        Self::new()
    }
}

impl SharedResolver {
    /// A resolver that has seen nothing yet, with room for what one policy decision looks at.
    pub(crate) fn new() -> Self {
        Self {
            seen: Vec::with_capacity(64),
        }
    }

    /// `lstat` of a normalized absolute path (every component but the last followed), asked of
    /// the kernel once per resolver.
    pub(crate) fn lstat(&mut self, p: &Path) -> nix::Result<Lstat> {
        // Byte comparison: every path asked is normalized (Path's == parses components).
        if let Some((_, st)) = self
            .seen
            .iter()
            .find(|(q, _)| q.as_os_str() == p.as_os_str())
        {
            return *st;
        }
        let st = nix::sys::stat::lstat(p).map(|st| Lstat {
            dev: st.st_dev,
            ino: st.st_ino,
            mode: st.st_mode,
        });
        self.seen.push((p.to_owned(), st));
        st
    }

    /// Device and inode of what `p` leads to (symlinks followed), `None` if it leads nowhere.
    pub(crate) fn id(&mut self, p: &Path) -> Option<(u64, u64)> {
        use std::os::unix::fs::MetadataExt;
        match self.lstat(p) {
            Ok(st) if !st.is_link() => Some((st.dev, st.ino)),
            _ => std::fs::metadata(p).ok().map(|m| (m.dev(), m.ino())),
        }
    }

    /// What [`real_path`] answers, as the canonical path and the device and inode (symlinks
    /// followed): `Err` exactly when the path does not resolve.
    pub(crate) fn real_path_id(&mut self, path: &Path) -> std::io::Result<(PathBuf, (u64, u64))> {
        use std::os::unix::fs::MetadataExt;
        let slow = |p: &Path| real_path(p).map(|(real, m)| (real, (m.dev(), m.ino())));
        if !path.is_absolute() || has_dotdot(path) {
            return slow(path);
        }
        // Without `.`, repeated and trailing slashes: the form canonicalize returns.
        let named = normalized(path).into_owned();
        let st = match self.lstat(&named) {
            Ok(st) => st,
            // lstat follows every component but the last: a path it cannot find does not resolve
            // (the last component missing, or missing behind a symlink), as real_path finds.
            Err(e @ (nix::Error::ENOENT | nix::Error::ENOTDIR)) => {
                return Err(std::io::Error::from(e));
            }
            Err(_) => return slow(path),
        };
        if st.is_link() {
            return slow(path);
        }
        for a in named.ancestors().skip(1) {
            if a.parent().is_none() {
                break; // "/"
            }
            if !matches!(self.lstat(a), Ok(st) if !st.is_link()) {
                return slow(path);
            }
        }
        Ok((named, (st.dev, st.ino)))
    }
}

/// `path` in the form `components().collect()` gives (no `.`, no repeated or trailing slash),
/// borrowed as it is when it has that form already (a byte scan, where collecting parses every
/// component and allocates).
pub(crate) fn normalized(path: &Path) -> std::borrow::Cow<'_, Path> {
    use std::os::unix::ffi::OsStrExt;
    let b = path.as_os_str().as_bytes();
    let plain = !b.is_empty()
        && !b.windows(2).any(|w| w == b"//")
        && !b.windows(3).any(|w| w == b"/./")
        && !b.starts_with(b"./")
        && b != b"."
        && !b.ends_with(b"/.")
        && (b == b"/" || !b.ends_with(b"/"));
    if plain {
        std::borrow::Cow::Borrowed(path)
    } else {
        std::borrow::Cow::Owned(path.components().collect())
    }
}

/// `a.starts_with(b)` for paths in [`normalized`] form, by comparing bytes: `Path::starts_with`
/// parses both into components, which the hostPath policy did some sixty times per mount.
pub(crate) fn is_under(a: &Path, b: &Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let (a, b) = (a.as_os_str().as_bytes(), b.as_os_str().as_bytes());
    a.starts_with(b) && (a.len() == b.len() || b.ends_with(b"/") || a.get(b.len()) == Some(&b'/'))
}

/// The name of some entry of directory `dir` other than `.` and `..`, or `None` when it is empty.
/// Four syscalls (open, getdents until the end, close): `std::fs::read_dir` adds an fstat.
pub(crate) fn first_entry(dir: &Path) -> std::io::Result<Option<OsString>> {
    use rustix::fs::{CWD, Mode, OFlags};
    use std::os::unix::ffi::OsStrExt;
    let fd = rustix::fs::openat(
        CWD,
        dir,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    for entry in rustix::fs::Dir::new(fd)? {
        let name = entry?.file_name().to_bytes().to_owned();
        if name != b"." && name != b".." {
            return Ok(Some(std::ffi::OsStr::from_bytes(&name).to_owned()));
        }
    }
    Ok(None)
}

/// The kind of file a `stat`/`lstat`/`fstat` answer describes.
#[cfg(test)]
pub(crate) fn kind_of_stat(st: &nix::sys::stat::FileStat) -> FileKind {
    kind_of_mode(st.st_mode)
}

/// What kind of file an `st_mode` describes.
fn kind_of_mode(mode: u32) -> FileKind {
    match SFlag::from_bits_truncate(mode & SFlag::S_IFMT.bits()) {
        SFlag::S_IFDIR => FileKind::Directory,
        SFlag::S_IFREG => FileKind::File,
        SFlag::S_IFSOCK => FileKind::Socket,
        SFlag::S_IFCHR => FileKind::CharDevice,
        SFlag::S_IFBLK => FileKind::BlockDevice,
        _ => FileKind::Other,
    }
}

/// The device number of the filesystem `path` is on, found without I/O and without blocking:
/// the lookup uses only the kernel's dentry cache (`openat2(RESOLVE_CACHED)`, Linux 5.12) and the
/// device comes from `statx(AT_STATX_DONT_SYNC)`, which asks no server. A path that does not exist
/// (its negative entry cached) reports the device of its nearest existing ancestor. `None`
/// whenever that cannot be known this way (a lookup that would need I/O or a server, an older
/// kernel, any error): callers must then assume that touching the path may block. Symlinks are
/// followed (from the cache too): the answer is where the path leads now, for a decision about
/// waiting, never for policy.
pub(crate) fn cached_device(path: &Path) -> Option<u64> {
    use rustix::fs::{CWD, Mode, OFlags, ResolveFlags};
    let mut cur = path;
    loop {
        match rustix::fs::openat2(
            CWD,
            cur,
            OFlags::PATH | OFlags::CLOEXEC,
            Mode::empty(),
            ResolveFlags::CACHED,
        ) {
            Ok(fd) => return device_without_sync(&fd),
            Err(rustix::io::Errno::NOENT) => cur = cur.parent()?,
            Err(_) => return None,
        }
    }
}

/// The device of what `fd` refers to, asking no server (`statx(AT_STATX_DONT_SYNC)`): the one
/// stat both probes above and below make of what their cached lookup opened.
fn device_without_sync(fd: &OwnedFd) -> Option<u64> {
    use rustix::fs::{AtFlags, StatxFlags};
    let st = rustix::fs::statx(
        fd,
        "",
        AtFlags::EMPTY_PATH | AtFlags::STATX_DONT_SYNC,
        StatxFlags::TYPE,
    )
    .ok()?;
    Some(rustix::fs::makedev(st.stx_dev_major, st.stx_dev_minor))
}

/// [`cached_device`] of `path`, and, when the dentry cache reached it without any symlink, the
/// `O_PATH` descriptor that lookup opened: what [`open_nofollow`] of `path` would open now, with
/// no lookup of its own (the caller that probes a path before blocking lookups, then opens it
/// without following symlinks, asks the kernel once). The device answers exactly what
/// [`cached_device`] answers: a lookup that meets a symlink (`ELOOP`) is asked again following
/// it; one that meets a missing component before any symlink would meet it following symlinks
/// too, and reports the nearest existing ancestor's device as [`cached_device`] does; one that
/// meets an uncached component before any symlink would meet it too (`None`).
pub(crate) fn cached_device_nofollow(path: &Path) -> (Option<u64>, Option<OwnedFd>) {
    use rustix::fs::{CWD, Mode, OFlags, ResolveFlags};
    match rustix::fs::openat2(
        CWD,
        path,
        OFlags::PATH | OFlags::CLOEXEC,
        Mode::empty(),
        ResolveFlags::CACHED | ResolveFlags::NO_SYMLINKS,
    ) {
        Ok(fd) => (device_without_sync(&fd), Some(fd)),
        Err(rustix::io::Errno::NOENT) => (path.parent().and_then(cached_device), None),
        Err(rustix::io::Errno::AGAIN) => (None, None),
        Err(_) => (cached_device(path), None),
    }
}

/// The path with the missing components appended: what the path will resolve to once created.
pub(crate) fn joined(base: &Path, rest: &[OsString]) -> PathBuf {
    let mut p = base.to_path_buf();
    for c in rest {
        p.push(c);
    }
    p
}

/// Opens a canonical path as `O_PATH`, refusing to follow any symlink on the way, the last
/// component included. (No `O_NOFOLLOW`: with `O_PATH` it would open a final symlink itself.)
pub(crate) fn open_nofollow(path: &Path) -> nix::Result<OwnedFd> {
    let how = OpenHow::new()
        .flags(OFlag::O_PATH | OFlag::O_CLOEXEC)
        .resolve(ResolveFlag::RESOLVE_NO_SYMLINKS);
    openat2(AT_FDCWD, path, how)
}

/// The kind of file a descriptor refers to.
#[cfg(test)]
pub(crate) fn kind_of(fd: impl AsFd) -> nix::Result<FileKind> {
    Ok(kind_of_stat(&fstat(fd)?))
}

/// `/proc/self/fd/N` for a descriptor: a mount source that pins the opened inode.
pub(crate) fn fd_path(fd: &OwnedFd) -> PathBuf {
    PathBuf::from(format!("/proc/self/fd/{}", fd.as_raw_fd()))
}

/// Applies `own` to an open file or directory: owner and group when set, then the mode
/// (`default_mode` when none is set), without umask.
pub(crate) fn apply_ownership(fd: &OwnedFd, own: Ownership, default_mode: u32) -> nix::Result<()> {
    if own.uid.is_some() || own.gid.is_some() {
        fchown(fd, own.uid.map(Uid::from_raw), own.gid.map(Gid::from_raw))?;
    }
    fchmod(
        fd,
        Mode::from_bits_truncate(own.mode.unwrap_or(default_mode)),
    )
}

/// Opens a directory for reading (`O_DIRECTORY`), refusing to follow any symlink on the way,
/// the last component included.
pub(crate) fn open_dir_nofollow(path: &Path) -> nix::Result<OwnedFd> {
    let how = OpenHow::new()
        .flags(OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC | OFlag::O_NOFOLLOW)
        .resolve(ResolveFlag::RESOLVE_NO_SYMLINKS);
    openat2(AT_FDCWD, path, how)
}

/// Creates the `missing` directories below the canonical `base`, each with `own` (ownership and
/// mode are applied only to directories created here). Directories created concurrently by another
/// call are accepted if they are real directories. Returns how many were created.
pub(crate) fn create_dirs(base: &Path, missing: &[OsString], own: Ownership) -> nix::Result<usize> {
    let mut created = 0;
    let mut cur = base.to_path_buf();
    for name in missing {
        let parent = open_dir_nofollow(&cur)?;
        match mkdirat(&parent, name.as_os_str(), Mode::from_bits_truncate(0o700)) {
            Ok(()) => {
                cur.push(name);
                let fd = open_dir_nofollow(&cur)?;
                apply_ownership(&fd, own, 0o755)?;
                created += 1;
            }
            Err(nix::Error::EEXIST) => cur.push(name),
            Err(e) => return Err(e),
        }
    }
    // Whatever exists now must be a real directory reached without symlinks.
    open_dir_nofollow(&cur)?;
    Ok(created)
}

/// Creates an empty regular file `name` in the canonical directory `dir` unless something exists
/// there. Returns whether it was created.
pub(crate) fn create_file(dir: &Path, name: &std::ffi::OsStr, own: Ownership) -> nix::Result<bool> {
    let parent = open_dir_nofollow(dir)?;
    let how = OpenHow::new()
        .flags(
            OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_WRONLY | OFlag::O_CLOEXEC | OFlag::O_NOFOLLOW,
        )
        .mode(Mode::from_bits_truncate(0o600))
        .resolve(ResolveFlag::RESOLVE_NO_SYMLINKS | ResolveFlag::RESOLVE_BENEATH);
    match openat2(&parent, name, how) {
        Ok(fd) => {
            apply_ownership(&fd, own, 0o644)?;
            Ok(true)
        }
        Err(nix::Error::EEXIST) => Ok(false),
        Err(e) => Err(e),
    }
}

/// How [`write_private`] puts a file in place.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Place {
    /// Over whatever file has the name (a `rename`).
    Replace,
    /// Only where nothing has the name (a hard link: the first writer wins).
    IfAbsent,
}

/// Writes `data` to `dest` whole or not at all, with `mode` from its first byte (never readable
/// by others, not even for a moment, when `mode` says so): a temporary `.<name>.tmp-<pid>` in
/// `dest`'s directory, created `O_CREAT | O_EXCL | O_NOFOLLOW` (never through a name somebody
/// planted: a leftover of ours is removed first, anything else there fails the create), written
/// and synced, then renamed over `dest` or linked to it ([`Place`]); the directory synced. The
/// temporary never outlives the call. `Ok(false)`: [`Place::IfAbsent`] and something had the
/// name (left as it is). The caller makes and checks the directory.
pub(crate) fn write_private(
    dest: &Path,
    data: &[u8],
    mode: u32,
    place: Place,
) -> std::io::Result<bool> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let (Some(dir), Some(name)) = (dest.parent(), dest.file_name()) else {
        return Err(std::io::Error::other(format!(
            "{} names no file",
            dest.display()
        )));
    };
    let tmp = dir.join(format!(
        ".{}.tmp-{}",
        name.to_string_lossy(),
        std::process::id()
    ));
    // Ours by name and pid only when a kill left it; removing a symlink removes the link.
    let _ = std::fs::remove_file(&tmp);
    let result = (|| {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .custom_flags((OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC).bits())
            .open(&tmp)?;
        f.write_all(data)?;
        f.sync_all()?;
        drop(f);
        let placed = match place {
            Place::Replace => std::fs::rename(&tmp, dest).map(|()| true),
            Place::IfAbsent => match std::fs::hard_link(&tmp, dest) {
                Ok(()) => Ok(true),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(false),
                Err(e) => Err(e),
            },
        }?;
        std::fs::File::open(dir)?.sync_all()?;
        Ok(placed)
    })();
    let _ = std::fs::remove_file(&tmp);
    result
}

/// Whether a path string has a `..` component (refused everywhere: policy is checked on the
/// resolved path, but `..` in input is never legitimate and makes intent unreadable).
pub(crate) fn has_dotdot(path: &Path) -> bool {
    path.components().any(|c| c == Component::ParentDir)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn write_private_is_whole_private_from_the_start_and_never_follows() {
        use std::os::unix::fs::PermissionsExt;
        let d = tempfile::tempdir().unwrap();
        let dest = d.path().join("key");
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o7777;
        assert!(write_private(&dest, b"one", 0o400, Place::Replace).unwrap());
        assert_eq!(
            (std::fs::read(&dest).unwrap(), mode(&dest)),
            (b"one".to_vec(), 0o400)
        );
        assert!(write_private(&dest, b"two", 0o600, Place::Replace).unwrap());
        assert_eq!(
            (std::fs::read(&dest).unwrap(), mode(&dest)),
            (b"two".to_vec(), 0o600)
        );
        // IfAbsent: the first writer wins, the second leaves it.
        assert!(!write_private(&dest, b"three", 0o600, Place::IfAbsent).unwrap());
        assert_eq!(std::fs::read(&dest).unwrap(), b"two");
        // A symlink planted at the temporary's name is removed, never written through.
        let victim = d.path().join("victim");
        std::fs::write(&victim, b"keep").unwrap();
        let tmp = d.path().join(format!(".other.tmp-{}", std::process::id()));
        std::os::unix::fs::symlink(&victim, &tmp).unwrap();
        assert!(write_private(&d.path().join("other"), b"x", 0o600, Place::IfAbsent).unwrap());
        assert_eq!(std::fs::read(&victim).unwrap(), b"keep");
        // Nothing left beside the files.
        let mut names: Vec<_> = std::fs::read_dir(d.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        assert_eq!(names, ["key", "other", "victim"]);
    }

    #[test]
    fn resolve_existing_splits_missing_tail() {
        let d = tempfile::tempdir().unwrap();
        let base = std::fs::canonicalize(d.path()).unwrap();
        let (real, rest) = resolve_existing(&base.join("a/b c")).unwrap();
        assert_eq!(real, base);
        assert_eq!(rest, vec![OsString::from("a"), OsString::from("b c")]);
        assert_eq!(
            create_dirs(
                &real,
                &rest,
                Ownership {
                    mode: Some(0o750),
                    ..Default::default()
                }
            )
            .unwrap(),
            2
        );
        assert_eq!(create_dirs(&real, &rest, Ownership::default()).unwrap(), 0);
        use std::os::unix::fs::PermissionsExt;
        let m = std::fs::metadata(base.join("a/b c"))
            .unwrap()
            .permissions()
            .mode()
            & 0o7777;
        assert_eq!(m, 0o750);
    }

    #[test]
    fn real_path_resolves_like_canonicalize() {
        let d = tempfile::tempdir().unwrap();
        let base = std::fs::canonicalize(d.path()).unwrap();
        std::fs::create_dir_all(base.join("a/b")).unwrap();
        std::os::unix::fs::symlink(base.join("a"), base.join("l")).unwrap();
        let (real, meta) = real_path(&base.join("l/b")).unwrap();
        assert_eq!(real, base.join("a/b"));
        assert!(meta.is_dir());
        assert!(real_path(&base.join("missing")).is_err());
        assert!(real_path(&base.join("l/missing")).is_err());
        // The fast path (no symlink on the way) gives what canonicalize gives, normalized.
        let (real, meta) = real_path(&base.join("a/./b/")).unwrap();
        assert_eq!(real, base.join("a/b"));
        assert!(meta.is_dir());
        assert_eq!(
            canonical_as_named(&PathBuf::from(format!("{}//a/b/", base.display()))),
            Some(base.join("a/b"))
        );
        assert_eq!(canonical_as_named(&base.join("l/b")), None);
        assert_eq!(canonical_as_named(&base.join("a/../a")), None);
        assert_eq!(canonical_as_named(&base.join("missing")), None);
        // Through a symlink, resolve_existing still resolves it (slow way).
        let (real, rest) = resolve_existing(&base.join("l/b/new")).unwrap();
        assert_eq!(
            (real, rest),
            (base.join("a/b"), vec![OsString::from("new")])
        );
        let (real, rest) = resolve_existing(&base.join("l/b")).unwrap();
        assert_eq!((real, rest), (base.join("a/b"), vec![]));
    }

    #[test]
    fn normalized_and_is_under_agree_with_components() {
        let raw = [
            "/", "//", "/a", "/a/", "/a//b", "/a/./b", "/a/b/.", "/ab", "/a/b", "/a/b/c", "/a/..",
            "/a/../b", "a", "./a", "a/b", ".", "/.", "/./",
        ];
        for r in raw {
            let n = normalized(Path::new(r));
            let want: PathBuf = Path::new(r).components().collect();
            assert_eq!(n.as_os_str(), want.as_os_str(), "{r}");
        }
        assert!(matches!(
            normalized(Path::new("/a/b")),
            std::borrow::Cow::Borrowed(_)
        ));
        for a in raw {
            for b in raw {
                let (na, nb) = (normalized(Path::new(a)), normalized(Path::new(b)));
                assert_eq!(is_under(&na, &nb), na.starts_with(&*nb), "{a} under {b}");
            }
        }
    }

    #[test]
    fn first_entry_skips_dot_and_dotdot() {
        let d = tempfile::tempdir().unwrap();
        assert_eq!(first_entry(d.path()).unwrap(), None);
        std::fs::write(d.path().join("x y"), b"").unwrap();
        assert_eq!(first_entry(d.path()).unwrap(), Some(OsString::from("x y")));
        assert!(
            first_entry(&d.path().join("x y")).is_err(),
            "a file is not a directory"
        );
        assert!(first_entry(&d.path().join("missing")).is_err());
    }

    #[test]
    fn shared_resolver_answers_what_real_path_answers() {
        use std::os::unix::fs::MetadataExt;
        let d = tempfile::tempdir().unwrap();
        let base = std::fs::canonicalize(d.path()).unwrap();
        std::fs::create_dir_all(base.join("a/b/c")).unwrap();
        std::fs::write(base.join("a/b/f"), b"").unwrap();
        std::os::unix::fs::symlink(base.join("a"), base.join("l")).unwrap(); // an ancestor link
        std::os::unix::fs::symlink(base.join("a/b/c"), base.join("a/lc")).unwrap(); // a last link
        std::os::unix::fs::symlink(base.join("nowhere"), base.join("a/dangling")).unwrap();
        let mut r = SharedResolver::new();
        // In an order that puts ancestors in the memo before the paths below a link are asked.
        for rel in [
            "a/b/c",
            "a/b",
            "a/b/f",
            "l/b/c",
            "l/b",
            "a/lc",
            "l/lc",
            "a/./b//c/",
            "a/b/../b/c",
            "missing",
            "a/missing",
            "l/missing",
            "a/b/f/below",
            "a/dangling",
            "a/dangling/x",
        ] {
            let p = base.join(rel);
            let want = real_path(&p).map(|(real, m)| (real, (m.dev(), m.ino())));
            let got = r.real_path_id(&p);
            match (&want, &got) {
                (Ok(w), Ok(g)) => assert_eq!(w, g, "{rel}"),
                (Err(_), Err(_)) => {}
                _ => panic!("{rel}: real_path {want:?}, resolver {got:?}"),
            }
        }
        // The first answers above went the cheap way (no link on the way), the link ones the slow.
        assert_eq!(
            r.real_path_id(&base.join("l/b")).unwrap().0,
            base.join("a/b")
        );
    }

    /// The probe that also opens ([`cached_device_nofollow`]) answers the device
    /// [`cached_device`] answers, for a path reached without a symlink (with the descriptor
    /// [`open_nofollow`] would open), through a symlink and when missing (no descriptor either
    /// way: what is reached through a link is never handed on as reached without one).
    #[test]
    fn cached_device_nofollow_answers_what_cached_device_answers() {
        let d = tempfile::tempdir().unwrap();
        let base = std::fs::canonicalize(d.path()).unwrap();
        std::fs::create_dir_all(base.join("a/b")).unwrap();
        std::os::unix::fs::symlink(base.join("a"), base.join("l")).unwrap();
        // Looked up once so that the dentry cache holds them, as a verb's paths are.
        for p in ["a/b", "l/b", "missing"] {
            let _ = std::fs::metadata(base.join(p));
        }
        let id = |fd: &OwnedFd| {
            let st = fstat(fd).unwrap();
            (st.st_dev, st.st_ino)
        };
        let (dev, fd) = cached_device_nofollow(&base.join("a/b"));
        assert!(dev.is_some());
        assert_eq!(dev, cached_device(&base.join("a/b")));
        assert_eq!(
            id(&fd.unwrap()),
            id(&open_nofollow(&base.join("a/b")).unwrap())
        );
        let (dev, fd) = cached_device_nofollow(&base.join("l/b"));
        assert!(fd.is_none(), "reached through a symlink");
        assert_eq!(dev, cached_device(&base.join("l/b")));
        assert!(dev.is_some());
        let (dev, fd) = cached_device_nofollow(&base.join("missing/x"));
        assert!(fd.is_none());
        assert_eq!(dev, cached_device(&base.join("missing/x")));
        assert!(dev.is_some(), "the nearest existing ancestor's device");
    }

    #[test]
    fn a_dangling_symlink_is_named_as_such() {
        let d = tempfile::tempdir().unwrap();
        let base = std::fs::canonicalize(d.path()).unwrap();
        std::os::unix::fs::symlink(base.join("nowhere"), base.join("dangling")).unwrap();
        for p in [base.join("dangling"), base.join("dangling/below")] {
            let e = resolve_existing(&p).unwrap_err();
            assert_eq!(e.kind(), std::io::ErrorKind::NotFound);
            let m = e.to_string();
            assert!(
                m.contains("dangling symlink") && m.contains("nowhere"),
                "{m}"
            );
        }
    }

    #[test]
    fn symlinks_are_never_followed() {
        let d = tempfile::tempdir().unwrap();
        let base = std::fs::canonicalize(d.path()).unwrap();
        std::fs::create_dir(base.join("real")).unwrap();
        std::os::unix::fs::symlink(base.join("real"), base.join("link")).unwrap();
        assert!(open_nofollow(&base.join("link")).is_err());
        assert!(open_nofollow(&base.join("link/x")).is_err());
        assert!(
            create_dirs(
                &base,
                &[OsString::from("link"), OsString::from("sub")],
                Ownership::default()
            )
            .is_err()
        );
        assert!(!base.join("real/sub").exists());
        let fd = open_nofollow(&base.join("real")).unwrap();
        assert_eq!(kind_of(&fd).unwrap(), FileKind::Directory);
        assert!(create_file(&base, std::ffi::OsStr::new("f"), Ownership::default()).unwrap());
        assert!(!create_file(&base, std::ffi::OsStr::new("f"), Ownership::default()).unwrap());
        assert!(has_dotdot(Path::new("/a/../b")));
        assert!(!has_dotdot(Path::new("/a/..b")));
    }
}
