//! `/proc/self/mountinfo`: the whole mount table, for questions about many mounts (what is
//! mounted where, for `status`, `gc`, NFS and LVM).
//!
//! Never decide mount state by comparing `st_dev` of a directory and its parent: a bind mount from
//! the same filesystem has the same device and looks unmounted (this is how kubelet's
//! `IsLikelyNotMountPoint` gets hostPath binds wrong). mountinfo carries the truth, and the bind
//! root, which tells which directory of a filesystem a bind shows. For one path the kernel answers
//! the same question directly: `mount::path_state` (`statx` with `STATX_ATTR_MOUNT_ROOT`).
//!
//! The hostPath verbs do not read it on their normal path: its cost grows with the node's mount
//! table (16x the raw syscalls at 4,000 mounts, when every call read it). Where a question needs
//! it, [`has_children`] reads it once, parses only the fields it needs, and stops at the first
//! answer; the rare hostPath `unmount` without a record reads the table once, to check that what
//! it would detach is a bind of a path under an allowed root.
//!
//! The kernel escapes space, tab, newline and backslash in paths as `\040`, `\011`, `\012` and
//! `\134`; every path field is unescaped here, so paths with spaces and non-ASCII bytes compare
//! correctly.

use std::ffi::OsString;
#[cfg(test)]
use std::os::unix::ffi::OsStrExt;
use std::os::unix::ffi::OsStringExt;
use std::path::{Path, PathBuf};

/// One line of mountinfo.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountInfo {
    /// Unique mount id.
    pub(crate) id: u32,
    /// Parent mount id.
    pub(crate) parent: u32,
    /// Device major:minor of the filesystem.
    pub(crate) major: u32,
    /// Device minor.
    pub(crate) minor: u32,
    /// Directory of the filesystem shown at the mount point (`/` unless a bind of a subdir).
    pub root: PathBuf,
    /// Where it is mounted.
    pub mount_point: PathBuf,
    /// Per-mount options (`rw`, `ro`, `nosuid`, ...).
    pub mount_options: String,
    /// Filesystem type (`ext4`, `nfs4`, `tmpfs`, ...).
    pub fs_type: String,
    /// Mount source (`/dev/mapper/vg-lv`, `server:/export`, ...).
    pub source: String,
    /// Superblock options.
    pub super_options: String,
}

impl MountInfo {
    /// Whether this mount is read-only at the mount level.
    pub fn read_only(&self) -> bool {
        self.mount_options.split(',').any(|o| o == "ro")
    }
}

/// Why mountinfo could not be read.
#[derive(Debug, thiserror::Error)]
pub enum MountInfoError {
    /// The file could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    /// A line did not have mountinfo's shape.
    #[error("cannot parse line {line} of {path}: {text:?}")]
    Parse {
        path: PathBuf,
        line: usize,
        text: String,
    },
}

/// The mount table, read once. Queries are by exact (already canonical) path.
#[derive(Debug, Clone, Default)]
pub struct MountTable {
    /// Entries in kernel order: a later entry on the same mount point is stacked on top.
    pub entries: Vec<MountInfo>,
}

impl MountTable {
    /// Reads `/proc/self/mountinfo`.
    pub fn read() -> Result<Self, MountInfoError> {
        Self::read_from(Path::new("/proc/self/mountinfo"))
    }

    /// Reads a mountinfo-formatted file (tests pass fixtures).
    pub(crate) fn read_from(path: &Path) -> Result<Self, MountInfoError> {
        // procfs reports size 0, so std would read it 32 bytes at a time; start with room for a
        // typical node's table.
        let mut data = Vec::with_capacity(64 * 1024);
        std::fs::File::open(path)
            .and_then(|mut f| std::io::Read::read_to_end(&mut f, &mut data))
            .map_err(|source| MountInfoError::Read {
                path: path.to_owned(),
                source,
            })?;
        Self::parse(&data).map_err(|(line, text)| MountInfoError::Parse {
            path: path.to_owned(),
            line,
            text,
        })
    }

    /// Parses mountinfo text; on error returns the 1-based line number and the line.
    pub fn parse(data: &[u8]) -> Result<Self, (usize, String)> {
        let mut entries = Vec::new();
        for (i, line) in data.split(|&b| b == b'\n').enumerate() {
            if line.is_empty() {
                continue;
            }
            let e = parse_line(line)
                .ok_or_else(|| (i + 1, String::from_utf8_lossy(line).into_owned()))?;
            entries.push(e);
        }
        Ok(Self { entries })
    }

    /// The topmost mount exactly at `path`, if any.
    pub(crate) fn at(&self, path: &Path) -> Option<&MountInfo> {
        self.entries.iter().rev().find(|e| e.mount_point == path)
    }

    /// Every mount exactly at `path`, bottom first.
    pub fn all_at<'a>(&'a self, path: &'a Path) -> impl Iterator<Item = &'a MountInfo> + 'a {
        self.entries.iter().filter(move |e| e.mount_point == path)
    }

    /// Whether anything is mounted exactly at `path`.
    pub fn is_mount_point(&self, path: &Path) -> bool {
        self.at(path).is_some()
    }

    /// The mount that contains `path` (longest mount-point prefix; topmost when stacked).
    pub fn containing(&self, path: &Path) -> Option<&MountInfo> {
        self.entries
            .iter()
            .enumerate()
            .filter(|(_, e)| path.starts_with(&e.mount_point))
            .max_by_key(|(i, e)| (e.mount_point.as_os_str().len(), *i))
            .map(|(_, e)| e)
    }

    /// Mounts strictly below `dir` (not `dir` itself).
    pub(crate) fn below<'a>(&'a self, dir: &'a Path) -> impl Iterator<Item = &'a MountInfo> + 'a {
        self.entries
            .iter()
            .filter(move |e| e.mount_point != dir && e.mount_point.starts_with(dir))
    }

    /// Where a path lives: its filesystem's device and the directory inside that filesystem. Two
    /// paths show the same data exactly when these agree, whatever bind mounts lie in between.
    pub(crate) fn locate(&self, path: &Path) -> Option<(u32, u32, PathBuf)> {
        let m = self.containing(path)?;
        let rest = path.strip_prefix(&m.mount_point).ok()?;
        let inner = if rest.as_os_str().is_empty() {
            m.root.clone()
        } else {
            m.root.join(rest)
        };
        Some((m.major, m.minor, inner))
    }
}

/// Whether any mount has the mount `id` as its parent (mounts on top of a mount's directories,
/// e.g. ones that propagated into a bind). Reads `/proc/self/mountinfo` once, looks only at the
/// parent field of each line, and stops at the first hit.
pub(crate) fn has_children(id: u64) -> Result<bool, MountInfoError> {
    has_children_in(Path::new("/proc/self/mountinfo"), id)
}

/// [`has_children`] on a mountinfo-formatted file.
pub(crate) fn has_children_in(path: &Path, id: u64) -> Result<bool, MountInfoError> {
    use std::io::BufRead;
    let read_err = |source| MountInfoError::Read {
        path: path.to_owned(),
        source,
    };
    let f = std::fs::File::open(path).map_err(read_err)?;
    let mut r = std::io::BufReader::with_capacity(64 * 1024, f);
    let mut line = Vec::with_capacity(256);
    let mut n = 0;
    loop {
        line.clear();
        if r.read_until(b'\n', &mut line).map_err(read_err)? == 0 {
            return Ok(false);
        }
        n += 1;
        let mut fields = line.split(|&b| b == b' ');
        let parent = fields
            .nth(1)
            .and_then(|f| std::str::from_utf8(f).ok()?.parse::<u64>().ok())
            .ok_or_else(|| MountInfoError::Parse {
                path: path.to_owned(),
                line: n,
                text: String::from_utf8_lossy(&line).trim_end().to_owned(),
            })?;
        if parent == id {
            return Ok(true);
        }
    }
}

fn parse_line(line: &[u8]) -> Option<MountInfo> {
    let fields: Vec<&[u8]> = line.split(|&b| b == b' ').collect();
    let sep = fields.iter().position(|f| *f == b"-")?;
    if sep < 6 || fields.len() < sep + 4 {
        return None;
    }
    let num = |f: &[u8]| std::str::from_utf8(f).ok()?.parse::<u32>().ok();
    let dev = std::str::from_utf8(fields[2]).ok()?;
    let (major, minor) = dev.split_once(':')?;
    Some(MountInfo {
        id: num(fields[0])?,
        parent: num(fields[1])?,
        major: major.parse().ok()?,
        minor: minor.parse().ok()?,
        root: PathBuf::from(OsString::from_vec(unescape(fields[3]))),
        mount_point: PathBuf::from(OsString::from_vec(unescape(fields[4]))),
        mount_options: String::from_utf8_lossy(fields[5]).into_owned(),
        fs_type: String::from_utf8_lossy(&unescape(fields[sep + 1])).into_owned(),
        source: String::from_utf8_lossy(&unescape(fields[sep + 2])).into_owned(),
        super_options: String::from_utf8_lossy(fields[sep + 3]).into_owned(),
    })
}

/// Undoes the kernel's `\ooo` octal escapes.
pub(crate) fn unescape(field: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(field.len());
    let mut i = 0;
    while i < field.len() {
        if field[i] == b'\\' && i + 3 < field.len() {
            let oct = &field[i + 1..i + 4];
            if oct.iter().all(|b| (b'0'..=b'7').contains(b)) {
                let v = u32::from(oct[0] - b'0') * 64
                    + u32::from(oct[1] - b'0') * 8
                    + u32::from(oct[2] - b'0');
                if let Ok(v) = u8::try_from(v) {
                    out.push(v);
                    i += 4;
                    continue;
                }
            }
        }
        out.push(field[i]);
        i += 1;
    }
    out
}

/// The kernel's escaping, for tests and fixtures.
#[cfg(test)]
pub(crate) fn escape(path: &Path) -> Vec<u8> {
    let mut out = Vec::new();
    for &b in path.as_os_str().as_bytes() {
        match b {
            b' ' | b'\t' | b'\n' | b'\\' => out.extend_from_slice(format!("\\{b:03o}").as_bytes()),
            _ => out.push(b),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const FIXTURE: &str = "\
22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw
30 22 0:25 / /proc rw,nosuid,nodev,noexec,relatime shared:12 - proc proc rw
41 22 8:1 /srv/data\\040with\\040space /var/lib/kubelet/pods/u/volumes/flexvol~hostpath/v rw,relatime shared:1 - ext4 /dev/sda1 rw
42 22 8:1 /srv/d\\303\\251j\\303\\240 /mnt/ro ro,relatime shared:1 - ext4 /dev/sda1 rw
50 22 0:60 / /mnt/nfs rw,relatime - nfs4 10.0.0.5:/exports/data rw,vers=4.2
51 50 0:61 / /mnt/nfs rw - tmpfs tmpfs rw
";

    #[test]
    fn parses_escapes_bind_roots_and_optional_fields() {
        let t = MountTable::parse(FIXTURE.as_bytes()).unwrap();
        assert_eq!(t.entries.len(), 6);
        let bind = &t.entries[2];
        assert_eq!(bind.root, Path::new("/srv/data with space"));
        assert_eq!(
            bind.mount_point,
            Path::new("/var/lib/kubelet/pods/u/volumes/flexvol~hostpath/v")
        );
        assert_eq!(t.entries[3].root, Path::new("/srv/déjà"));
        assert!(t.entries[3].read_only());
        assert!(!bind.read_only());
        assert_eq!(t.entries[4].fs_type, "nfs4");
        assert_eq!(t.entries[4].source, "10.0.0.5:/exports/data");
        assert_eq!(t.entries[0].parent, 1);
        assert_eq!((t.entries[2].major, t.entries[2].minor), (8, 1));
    }

    #[test]
    fn queries() {
        let t = MountTable::parse(FIXTURE.as_bytes()).unwrap();
        assert_eq!(
            t.at(Path::new("/mnt/nfs")).unwrap().fs_type,
            "tmpfs",
            "topmost wins"
        );
        assert_eq!(t.all_at(Path::new("/mnt/nfs")).count(), 2);
        assert!(!t.is_mount_point(Path::new("/srv")));
        assert_eq!(t.containing(Path::new("/srv/x")).unwrap().id, 22);
        assert_eq!(
            t.locate(Path::new("/srv/data with space")).unwrap(),
            (8, 1, PathBuf::from("/srv/data with space"))
        );
        let pod = Path::new("/var/lib/kubelet/pods/u/volumes/flexvol~hostpath/v/f");
        assert_eq!(
            t.locate(pod).unwrap(),
            (8, 1, PathBuf::from("/srv/data with space/f"))
        );
        assert_eq!(t.below(Path::new("/mnt")).count(), 3);
    }

    #[test]
    fn children_are_found_without_parsing_whole_lines() {
        let d = tempfile::tempdir().unwrap();
        let f = d.path().join("mountinfo");
        std::fs::write(&f, FIXTURE).unwrap();
        assert!(has_children_in(&f, 50).unwrap());
        assert!(has_children_in(&f, 22).unwrap());
        assert!(!has_children_in(&f, 41).unwrap());
        std::fs::write(&f, "x y\n").unwrap();
        assert!(has_children_in(&f, 1).is_err());
        let own = MountTable::read().unwrap();
        let root = own.at(Path::new("/")).unwrap();
        assert!(
            has_children(u64::from(root.id)).unwrap(),
            "/ has mounts on it"
        );
    }

    #[test]
    fn malformed_lines_are_errors() {
        assert!(MountTable::parse(b"22 1 8:1 / / rw shared:1 ext4 /dev/sda1 rw\n").is_err());
        assert!(MountTable::parse(b"x 1 8:1 / / rw - ext4 /dev/sda1 rw\n").is_err());
    }

    #[test]
    fn reads_the_real_table() {
        let t = MountTable::read().unwrap();
        assert!(t.at(Path::new("/")).is_some());
    }

    proptest::proptest! {
        #[test]
        fn escape_round_trips(name in proptest::collection::vec(proptest::num::u8::ANY, 0..40)) {
            let name: Vec<u8> = name.into_iter().filter(|&b| b != 0 && b != b'/').collect();
            let path = Path::new("/a").join(std::ffi::OsStr::from_bytes(&name));
            let line = [b"1 0 0:1 / ".as_slice(), &escape(&path), b" rw - tmpfs t rw"].concat();
            let t = MountTable::parse(&line).unwrap();
            proptest::prop_assert_eq!(&t.entries[0].mount_point, &path);
        }
    }
}
