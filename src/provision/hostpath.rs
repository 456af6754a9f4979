//! The hostPath provisioner's filesystem side: volume directories under a node's roots.
//!
//! Safety rules (rule 4 of the house: delete only what we provably created):
//! - Roots come from the node config only, and are used canonical (symlinks in the configured
//!   path itself are resolved once, by the administrator's intent). Everything below a root is
//!   reached with `openat2(RESOLVE_NO_SYMLINKS)`: a symlink anywhere below a root (say one a pod
//!   planted in a directory it can write) makes the operation fail instead of being followed.
//! - A volume directory is `<root>/<relative path>`, the relative path made of normal components
//!   only, none starting with `.flexvol` ([`volume_rel_path`]); nothing else is ever created or
//!   removed, besides flexvol's own names below.
//!
//! Ownership ([`Record`]): what a directory is, and for which PV, is kept where only root writes:
//! `<root>/.flexvol/volumes/<pv>.json`, in directories of mode 0700 owned by root (checked on every
//! use; anything else is an error, never trusted). A record holds the PV, its claim (namespace,
//! name, uid), the node that made it, the project ID of its enforced size, the directory's path
//! relative to the root, and its device and inode: a directory is the PV's only when it is that
//! very inode ([`DirState::Owned`]). The marker file [`MARKER`] in the directory still says the
//! same (for people, and for older flexvol versions), but it lives in a directory the pod owns, so
//! it decides nothing — except for **old volumes**, made before records existed: a marker and no
//! record is [`DirState::Legacy`], still deleted and resized when the marker names the PV and its
//! claim, while its `projectId` is used only after [`super::quota`] has checked that the directory
//! really carries that project.
//!
//! Creating ([`create_volume_dir_as`]) never adopts anything: an existing directory at the target
//! that is not the recorded one for this PV — empty or not, made by a pod's inline
//! `DirectoryOrCreate` that may still have it mounted — is an error. The steps:
//! 1. refuse a path inside or above another volume (by the records, and by old volumes' markers
//!    above it): volumes never nest;
//! 2. missing parents are made root:root 0755 (never the class's owner: a tenant uid owning a
//!    parent could rename its siblings' directories);
//! 3. the directory is made under a private name in its parent, `.flexvol-new-<pv>` (on NFS, where
//!    several instances work at once, `.flexvol-new-<pv>@<node>.<pid>`), gets the class's uid, gid
//!    and mode and the marker;
//! 4. the record is published: written to a temporary file and hard-linked into place, so the
//!    first instance wins and the others remove their own private directory;
//! 5. the private directory is renamed to its name with `renameat2(RENAME_NOREPLACE)`, which never
//!    replaces anything. Where that flag is not supported (NFS answers `EINVAL`), a plain `rename`
//!    after checking the name is free: in the window between the check and the rename, `rename(2)`
//!    can only replace an *empty* directory (a non-empty one, a file or a mount point make it
//!    fail). That loses no data, and whoever made that empty directory keeps only its old, now
//!    nameless inode (and its mount of it): they never see the volume. So the fallback is
//!    acceptable.
//!
//! A kill at any step converges: before the record, the next call removes this instance's leftover
//! private directory (only when it holds nothing but our marker: a name planted by somebody else
//! with data in it is an error, never removed) and starts over; after it, the next call (of any
//! instance) renames the private directory the record names, or finds it in place; a record whose
//! directory is nowhere is dropped. Private directories of killed NFS instances are removed once a
//! minute old, and with the volume.
//!
//! Deleting ([`delete_volume_dir`]): only a directory that is the PV's (record, or an old volume's
//! marker) for that PV's claim. First the whole tree is walked ([`check_tree`], descriptors only,
//! no symlink followed): a mount point anywhere inside (statx's mount-root attribute, another
//! device, or `openat2(RESOLVE_NO_XDEV)` refusing to cross) or another volume's directory (its
//! inode in another PV's record, or an old volume's marker naming another PV) fails the delete
//! before anything is removed. Then the directory is renamed to `<root>/.flexvol-deleting-<pv>`
//! (one atomic step that commits it) and removed by a descriptor-based walk that unlinks symlinks
//! without following them and stops at any mount point or device change — so a mount that appears
//! meanwhile still stops it. Then the record goes. A kill -9 in between leaves the tombstone, which
//! [`finish_deletes`] (or the next delete of the PV) removes, and its record with it.
//!
//! - Sizes: where the root's filesystem enforces project quotas, [`HostPathBackend`] gives each new
//!   directory a project quota of the claim's size and raises it on a resize ([`super::quota`]);
//!   the project ID is recorded in the record before the quota is set up. Elsewhere the PV says
//!   `flexvol/size-enforced: "false"` and why.
//!
//! What this relies on: nothing but root can write below `<root>/.flexvol`. The drivers must not
//! serve it (or a root itself) to an inline volume, which the capability check of
//! [`crate::node::capability`] is for. Not covered here: a *parent* directory somebody else made
//! before flexvol did (an inline volume's `<root>/team-b`, kept mounted) is used as it is, so its
//! maker sees the volumes made below it; parents made by older flexvol versions are
//! indistinguishable from such a squat (same owners), so refusing them would break upgrades.
//!
//! Caller contract: one provisioner per node works on a root at a time (the DaemonSet runs one);
//! nothing here takes a lock.

use super::backend::{Backend, Provisioned, Refusal, Request};
use crate::node::capability::{self, Key, Location, node_key_path};
use crate::node::config::Config;
use crate::sys::paths::{self, Ownership};
use crate::sys::process::checkpoint;
use k8s_openapi::api::core::v1::PersistentVolume;
use nix::fcntl::{AtFlags, OFlag, OpenHow, RenameFlags, ResolveFlag, openat2, renameat, renameat2};
use nix::sys::stat::Mode;
use nix::unistd::{UnlinkatFlags, linkat, unlinkat};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::ffi::{OsStr, OsString};
use std::io::Write;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Component, Path, PathBuf};

/// The ownership marker's file name inside a volume directory.
pub const MARKER: &str = ".flexvol-provisioned";
/// The temporary the marker is written to before it is renamed into place.
pub const MARKER_TMP_HOSTPATH: &str = ".flexvol-provisioned.tmp";
/// Prefix of a committed deletion in a root.
pub const TOMBSTONE_PREFIX: &str = ".flexvol-deleting-";
/// Prefix of a volume directory being made, in its parent: `.flexvol-new-<pv>[@<instance>]`.
pub const NEW_PREFIX: &str = ".flexvol-new-";
/// flexvol's own directory in a root (root-only, 0700).
pub const STATE_DIR: &str = ".flexvol";
/// The ownership records' directory in [`STATE_DIR`]: `<root>/.flexvol/volumes/<pv>.json`.
pub const RECORDS_DIR: &str = "volumes";
/// A record's file name is the PV's name with this suffix.
pub const RECORD_SUFFIX: &str = ".json";
/// Every name flexvol reserves in a root starts with this.
pub const RESERVED_PREFIX: &str = ".flexvol";

/// What the marker says: the identity of the PV a directory was made for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Marker {
    /// The provisioner that made it (`flexvol/hostpath`).
    pub provisioner: String,
    /// PV name (`pvc-<claim uid>`).
    pub volume: String,
    /// The claim's namespace.
    pub namespace: String,
    /// The claim's name.
    pub claim: String,
    /// The claim's uid.
    pub claim_uid: String,
    /// The node it lives on.
    pub node: String,
    /// The project ID of its enforced size ([`super::quota`]), recorded before the quota is set
    /// up so that a pass after a kill reuses it. Absent where the size is not enforced.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub project_id: Option<u32>,
}

impl Marker {
    /// Whether `self` and `other` name the same volume: everything but the project ID (which the
    /// quota step adds later) and the node (on NFS, any instance may be the one that made it).
    pub fn same_volume(&self, other: &Marker) -> bool {
        let key = |m: &Marker| Marker {
            project_id: None,
            node: String::new(),
            ..m.clone()
        };
        key(self) == key(other)
    }
}

/// The ownership record of a volume directory: `<root>/.flexvol/volumes/<pv>.json`, in a
/// directory only root can enter (mode 0700), so nothing a tenant writes can change it. It holds
/// what the marker holds (the project ID included) plus where the directory is and which inode it
/// is: a directory is the PV's only when it is that very inode.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Record {
    /// The PV, its claim, the node that made it and its project ID.
    #[serde(flatten)]
    pub marker: Marker,
    /// The directory relative to the root.
    pub path: String,
    /// The private name it was made under (in the same parent) before it was renamed into place.
    pub new_name: String,
    /// Its device (`st_dev`).
    pub dev: u64,
    /// Its inode.
    pub ino: u64,
}

impl Record {
    /// Whether the directory with `(dev, ino)` is the one this record names. The inode must be
    /// the recorded one; the device the recorded one, or `fs_dev`, the device of the filesystem
    /// being looked at (the root, the parent, the tree being deleted) now. An NFS export gets a
    /// new device number each time it is mounted (the provisioner mounts it for every piece of
    /// work, and kubelet's mounts with other options make other superblocks), so on NFS only the
    /// inode (the server's file id) is stable; a directory of another filesystem mounted there
    /// still differs in device from both.
    pub fn names(&self, (dev, ino): (u64, u64), fs_dev: Option<u64>) -> bool {
        self.ino == ino && (self.dev == dev || fs_dev == Some(dev))
    }
}

/// Class parameters of the hostPath provisioner, validated.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClassParams {
    /// `pathPattern`: the directory below the root, from a template.
    pub path_pattern: Option<String>,
    /// `uid`, `gid`, `mode` of the volume directory.
    pub ownership: Ownership,
}

/// Parameter names a class may use.
pub const PARAMS: [&str; 4] = ["pathPattern", "uid", "gid", "mode"];

impl ClassParams {
    /// Validates a StorageClass's `parameters`. Unknown keys are errors: a typo must not fall back
    /// to a default silently.
    pub fn parse<'a>(
        params: impl IntoIterator<Item = (&'a String, &'a String)>,
    ) -> Result<Self, String> {
        let mut p = ClassParams::default();
        for (k, v) in params {
            match k.as_str() {
                "pathPattern" => {
                    // Validate now with dummy values: an error must come before anything exists.
                    expand_pattern(v, "pvc-x", "ns", "claim")?;
                    p.path_pattern = Some(v.clone());
                }
                "uid" | "gid" => {
                    // The driver's own rule (one validation for both).
                    let id = Ownership::parse_id(v).map_err(|why| {
                        format!("class parameter {k}={v:?}: {why}; use e.g. {k}: \"1000\"")
                    })?;
                    if k == "uid" {
                        p.ownership.uid = Some(id);
                    } else {
                        p.ownership.gid = Some(id);
                    }
                }
                "mode" => {
                    let m = Ownership::parse_mode(v).map_err(|why| {
                        format!("class parameter mode={v:?}: {why}; use e.g. mode: \"0770\"")
                    })?;
                    p.ownership.mode = Some(m);
                }
                _ => {
                    return Err(format!(
                        "unknown class parameter {k:?}; the hostpath provisioner knows {}",
                        PARAMS.join(", ")
                    ));
                }
            }
        }
        Ok(p)
    }
}

/// Expands local-path's `pathPattern` template. Known fields: `{{ .PVName }}`,
/// `{{ .PVC.Namespace }}`, `{{ .PVC.Name }}`. The result must be a relative path of normal
/// components: no `..`, no `.`, no empty component, not absolute, so it cannot leave the root.
pub fn expand_pattern(pattern: &str, pv: &str, ns: &str, claim: &str) -> Result<PathBuf, String> {
    let bad = |why: &str| {
        format!(
            "class parameter pathPattern={pattern:?} {why}; use fields {{{{ .PVName }}}}, {{{{ .PVC.Namespace }}}}, {{{{ .PVC.Name }}}} joined by /, e.g. \"{{{{ .PVC.Namespace }}}}/{{{{ .PVC.Name }}}}\""
        )
    };
    let mut out = String::new();
    let mut rest = pattern;
    while let Some(i) = rest.find("{{") {
        out.push_str(&rest[..i]);
        let after = &rest[i + 2..];
        let j = after.find("}}").ok_or_else(|| bad("has an unclosed {{"))?;
        let value = match after[..j].trim() {
            ".PVName" => pv,
            ".PVC.Namespace" => ns,
            ".PVC.Name" => claim,
            _ => return Err(bad("uses a field flexvol does not know")),
        };
        out.push_str(value);
        rest = &after[j + 2..];
    }
    if rest.contains("}}") {
        return Err(bad("has a stray }}"));
    }
    out.push_str(rest);
    volume_rel_path(&out).map_err(|why| bad(&why))
}

/// Checks a directory path relative to a root: non-empty, relative, normal components only, and
/// not one of our reserved names.
pub fn volume_rel_path(s: &str) -> Result<PathBuf, String> {
    if s.is_empty() || s.starts_with('/') || s.contains('\0') {
        return Err("must expand to a non-empty relative path".into());
    }
    for part in s.split('/') {
        if part.is_empty() || part == "." || part == ".." {
            return Err(format!(
                "expands to {s:?}, which has an empty, \".\" or \"..\" component"
            ));
        }
        if part.starts_with(RESERVED_PREFIX) {
            return Err(format!(
                "expands to {s:?}, which uses a name flexvol reserves"
            ));
        }
    }
    let p = PathBuf::from(s);
    debug_assert!(p.components().all(|c| matches!(c, Component::Normal(_))));
    Ok(p)
}

/// The default directory name, as local-path names it: `<pv>_<namespace>_<claim>`.
pub fn default_rel_path(pv: &str, ns: &str, claim: &str) -> PathBuf {
    PathBuf::from(format!("{pv}_{ns}_{claim}"))
}

/// Free bytes for unprivileged users under a root, `None` when it cannot be read.
pub fn free_bytes(root: &Path) -> Option<u64> {
    nix::sys::statvfs::statvfs(root)
        .ok()
        .map(|s| s.blocks_available().saturating_mul(s.fragment_size()))
}

/// A root usable now: configured path, canonical form.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Root {
    /// As written in the config.
    pub configured: PathBuf,
    /// Canonical (what every path below is built on).
    pub real: PathBuf,
}

/// Makes a configured root usable: creates it (0755, root-owned) when missing, as local-path
/// does, then resolves it. Errors say why the root cannot be used.
pub fn prepare_root(configured: &Path) -> Result<Root, String> {
    let (base, missing) = paths::resolve_existing(configured)
        .map_err(|e| format!("root {} cannot be resolved: {e}", configured.display()))?;
    if !missing.is_empty() {
        paths::create_dirs(&base, &missing, Ownership::default())
            .map_err(|e| format!("root {} cannot be created: {e}", configured.display()))?;
    }
    let real = std::fs::canonicalize(configured)
        .map_err(|e| format!("root {} cannot be resolved: {e}", configured.display()))?;
    if !real.is_dir() {
        return Err(format!("root {} is not a directory", configured.display()));
    }
    Ok(Root {
        configured: configured.to_owned(),
        real,
    })
}

/// What a volume directory holds, seen without following symlinks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DirState {
    /// Nothing there.
    Missing,
    /// Ours: a root-only [`Record`] names this directory, and the directory is the very one it
    /// names (same device and inode).
    Owned(Record),
    /// A volume made before records existed: a [`MARKER`] in the directory and no record. The
    /// marker is tenant-writable: its `projectId` is never used without a cross-check.
    Legacy(Marker),
    /// Anything else — empty or not — is not ours and is never touched, adopted or deleted.
    Foreign(String),
}

fn open_dir(path: &Path) -> nix::Result<OwnedFd> {
    paths::open_dir_nofollow(path)
}

/// Opens the directory `name` inside `dir`: no symlink, not outside `dir`, and not across a mount
/// point (`EXDEV` when `name` is one).
fn open_child_dir(dir: &impl AsFd, name: &OsStr) -> nix::Result<OwnedFd> {
    let how = OpenHow::new()
        .flags(OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC | OFlag::O_NOFOLLOW)
        .resolve(
            ResolveFlag::RESOLVE_NO_SYMLINKS
                | ResolveFlag::RESOLVE_BENEATH
                | ResolveFlag::RESOLVE_NO_XDEV,
        );
    openat2(dir.as_fd(), name, how)
}

/// Reads a small JSON file `name` in `dir` (no symlink followed), `None` when absent.
fn read_json<T: serde::de::DeserializeOwned>(
    dir: &impl AsFd,
    name: &str,
    what: &str,
) -> Result<Option<T>, String> {
    let how = OpenHow::new()
        .flags(OFlag::O_RDONLY | OFlag::O_CLOEXEC | OFlag::O_NOFOLLOW)
        .resolve(ResolveFlag::RESOLVE_NO_SYMLINKS | ResolveFlag::RESOLVE_BENEATH);
    let fd = match openat2(dir.as_fd(), name, how) {
        Ok(fd) => fd,
        Err(nix::Error::ENOENT) => return Ok(None),
        Err(e) => return Err(format!("its {what} {name} cannot be opened: {e}")),
    };
    let mut data = Vec::new();
    use std::io::Read;
    std::fs::File::from(fd)
        .take(64 * 1024)
        .read_to_end(&mut data)
        .map_err(|e| format!("its {what} {name} cannot be read: {e}"))?;
    serde_json::from_slice(&data)
        .map(Some)
        .map_err(|e| format!("its {what} {name} is not flexvol's: {e}"))
}

fn read_marker(dir: &OwnedFd) -> Result<Option<Marker>, String> {
    read_json(dir, MARKER, "marker")
}

/// The names in an open directory (read through its descriptor, so whatever its path names now
/// does not matter), without `.` and `..`.
fn names_in(dir: &OwnedFd) -> std::io::Result<Vec<OsString>> {
    let fd_dir = paths::fd_path(dir);
    std::fs::read_dir(fd_dir)?
        .map(|e| e.map(|e| e.file_name()))
        .collect()
}

fn dev_ino(fd: &impl AsFd) -> nix::Result<(u64, u64)> {
    let st = nix::sys::stat::fstat(fd.as_fd())?;
    Ok((st.st_dev, st.st_ino))
}

/// `<root>/.flexvol/volumes`, opened; created (mode 0700) when `create`. It is trusted only when
/// both directories are real directories (no symlink), owned by the user we run as (root) and
/// closed to everybody else; anything else is an error that says what to do. `Ok(None)`: absent
/// and not created.
fn records_dir(root: &Root, create: bool) -> Result<Option<OwnedFd>, String> {
    let mut cur = open_dir(&root.real)
        .map_err(|e| format!("root {} cannot be opened: {e}", root.real.display()))?;
    let mut path = root.real.clone();
    for name in [STATE_DIR, RECORDS_DIR] {
        path.push(name);
        let fail = |e: &dyn std::fmt::Display| {
            format!("flexvol's record directory {}: {e}", path.display())
        };
        let fd = match open_child_dir(&cur, OsStr::new(name)) {
            Ok(fd) => fd,
            Err(nix::Error::ENOENT) if create => {
                match nix::sys::stat::mkdirat(&cur, name, Mode::from_bits_truncate(0o700)) {
                    Ok(()) | Err(nix::Error::EEXIST) => {}
                    Err(e) => return Err(fail(&e)),
                }
                let fd = open_child_dir(&cur, OsStr::new(name)).map_err(|e| fail(&e))?;
                // Made now, by us: close it to everybody else whatever the umask was.
                let st = nix::sys::stat::fstat(&fd).map_err(|e| fail(&e))?;
                if st.st_uid == nix::unistd::geteuid().as_raw() {
                    nix::sys::stat::fchmod(&fd, Mode::from_bits_truncate(0o700))
                        .map_err(|e| fail(&e))?;
                }
                fd
            }
            Err(nix::Error::ENOENT) => return Ok(None),
            Err(e) => return Err(fail(&e)),
        };
        let st = nix::sys::stat::fstat(&fd).map_err(|e| fail(&e))?;
        if st.st_uid != nix::unistd::geteuid().as_raw() || st.st_mode & 0o077 != 0 {
            return Err(fail(&format!(
                "is owned by uid {} with mode {:o}, not by root with mode 0700, so flexvol cannot trust what is in it (on NFS: export with no_root_squash); move it away",
                st.st_uid,
                st.st_mode & 0o7777
            )));
        }
        cur = fd;
    }
    Ok(Some(cur))
}

fn record_name(pv: &str) -> Result<String, String> {
    if pv.contains('/') || volume_rel_path(pv).is_err() || pv.starts_with('.') {
        return Err(format!("{pv:?} is not usable as a PV name"));
    }
    Ok(format!("{pv}{RECORD_SUFFIX}"))
}

/// The record of PV `pv` under `root`, if any.
pub fn read_record(root: &Root, pv: &str) -> Result<Option<Record>, String> {
    let Some(dir) = records_dir(root, false)? else {
        return Ok(None);
    };
    read_json(&dir, &record_name(pv)?, "record")
}

/// Every record under `root` (none when the record directory does not exist). A record that
/// cannot be read is an error: it may be a volume, and nothing may be decided without it.
pub fn read_records(root: &Root) -> Result<Vec<Record>, String> {
    let Some(dir) = records_dir(root, false)? else {
        return Ok(Vec::new());
    };
    let mut out = Vec::new();
    let names = names_in(&dir).map_err(|e| format!("cannot list flexvol's records: {e}"))?;
    for n in names {
        let Some(s) = n.to_str() else { continue };
        if s.starts_with('.') || !s.ends_with(RECORD_SUFFIX) {
            continue; // temporaries
        }
        if let Some(r) = read_json::<Record>(&dir, s, "record")? {
            out.push(r);
        }
    }
    out.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(out)
}

fn temp_name(what: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .subsec_nanos();
    format!(".tmp-{what}-{}-{nanos}", std::process::id())
}

/// Writes `rec` to a temporary file of this process in the record directory, synced. Returns the
/// temporary's name.
fn write_temp_record(dir: &OwnedFd, rec: &Record) -> Result<String, String> {
    let fail = |e: &dyn std::fmt::Display| {
        format!("cannot write the record of {}: {e}", rec.marker.volume)
    };
    let tmp = temp_name(&rec.marker.volume);
    let how = OpenHow::new()
        .flags(OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_WRONLY | OFlag::O_CLOEXEC)
        .mode(Mode::from_bits_truncate(0o600))
        .resolve(ResolveFlag::RESOLVE_NO_SYMLINKS | ResolveFlag::RESOLVE_BENEATH);
    let fd = openat2(dir, tmp.as_str(), how).map_err(|e| fail(&e))?;
    let mut f = std::fs::File::from(fd);
    let mut data = serde_json::to_vec(rec).map_err(|e| fail(&e))?;
    data.push(b'\n');
    let written = f
        .write_all(&data)
        .and_then(|()| f.sync_all())
        .map_err(|e| fail(&e));
    if written.is_err() {
        let _ = unlinkat(dir, tmp.as_str(), UnlinkatFlags::NoRemoveDir);
    }
    written.map(|()| tmp)
}

/// Publishes `rec` unless a record of its PV exists: hard-links a temporary into place (the
/// first link wins, on NFS too). Returns whether this call's record is the one in place.
fn link_record(root: &Root, rec: &Record) -> Result<bool, String> {
    let dir = records_dir(root, true)?.ok_or("no record directory")?;
    let name = record_name(&rec.marker.volume)?;
    let tmp = write_temp_record(&dir, rec)?;
    let linked = linkat(&dir, tmp.as_str(), &dir, name.as_str(), AtFlags::empty());
    let _ = unlinkat(&dir, tmp.as_str(), UnlinkatFlags::NoRemoveDir);
    let won = match linked {
        Ok(()) => true,
        Err(nix::Error::EEXIST) => false,
        Err(e) => {
            return Err(format!(
                "cannot write the record of {}: {e}",
                rec.marker.volume
            ));
        }
    };
    nix::unistd::fsync(&dir).map_err(|e| format!("cannot sync flexvol's records: {e}"))?;
    Ok(won)
}

/// Replaces the record of `rec`'s PV (a temporary renamed over, then synced): how a project ID is
/// added to it.
pub fn write_record(root: &Root, rec: &Record) -> Result<(), String> {
    let dir = records_dir(root, true)?.ok_or("no record directory")?;
    let name = record_name(&rec.marker.volume)?;
    let tmp = write_temp_record(&dir, rec)?;
    renameat(&dir, tmp.as_str(), &dir, name.as_str())
        .and_then(|()| nix::unistd::fsync(&dir))
        .map_err(|e| format!("cannot write the record of {}: {e}", rec.marker.volume))
}

/// Removes the record of PV `pv` when it names `rel` and nothing is at `rel` any more (the
/// directory was deleted or archived).
pub fn forget_record(root: &Root, rel: &Path, pv: &str) -> Result<(), String> {
    match read_record(root, pv)? {
        Some(r) if Path::new(&r.path) == rel && inspect(root, rel) == DirState::Missing => {
            remove_record(root, pv)
        }
        _ => Ok(()),
    }
}

/// Removes the record of PV `pv` (absent is fine).
fn remove_record(root: &Root, pv: &str) -> Result<(), String> {
    let Some(dir) = records_dir(root, false)? else {
        return Ok(());
    };
    match unlinkat(&dir, record_name(pv)?.as_str(), UnlinkatFlags::NoRemoveDir) {
        Ok(()) | Err(nix::Error::ENOENT) => {
            let _ = nix::unistd::fsync(&dir);
            Ok(())
        }
        Err(e) => Err(format!("cannot remove the record of {pv}: {e}")),
    }
}

/// Looks at `<root>/<rel>` without following symlinks. Ownership comes from the root-only
/// records; an in-directory marker counts only for a volume that has no record (an old one).
pub fn inspect(root: &Root, rel: &Path) -> DirState {
    match read_records(root) {
        Ok(records) => inspect_with(root, rel, &records),
        Err(why) => DirState::Foreign(why),
    }
}

fn inspect_with(root: &Root, rel: &Path, records: &[Record]) -> DirState {
    let path = root.real.join(rel);
    let dir = match open_dir(&path) {
        Ok(fd) => fd,
        Err(nix::Error::ENOENT) => return DirState::Missing,
        Err(nix::Error::ELOOP | nix::Error::EXDEV | nix::Error::ENOTDIR) => {
            let link = std::fs::symlink_metadata(&path).is_ok_and(|m| m.file_type().is_symlink());
            return DirState::Foreign(if link {
                format!("{} is a symlink", path.display())
            } else {
                format!(
                    "{} is not a directory or passes through a symlink",
                    path.display()
                )
            });
        }
        Err(e) => return DirState::Foreign(format!("{} cannot be opened: {e}", path.display())),
    };
    let id = match dev_ino(&dir) {
        Ok(id) => id,
        Err(e) => return DirState::Foreign(format!("{} cannot be read: {e}", path.display())),
    };
    if let Some(rec) = records.iter().find(|r| Path::new(&r.path) == rel) {
        let root_dev = std::fs::symlink_metadata(&root.real)
            .ok()
            .map(|m| std::os::unix::fs::MetadataExt::dev(&m));
        return if rec.names(id, root_dev) {
            DirState::Owned(rec.clone())
        } else {
            DirState::Foreign(format!(
                "{} is not the directory flexvol made for PV {} (it was replaced)",
                path.display(),
                rec.marker.volume
            ))
        };
    }
    match read_marker(&dir) {
        Ok(Some(m)) if records.iter().any(|r| r.marker.volume == m.volume) => {
            DirState::Foreign(format!(
                "{}: its marker names PV {}, whose record names another directory",
                path.display(),
                m.volume
            ))
        }
        Ok(Some(m)) => DirState::Legacy(m),
        Ok(None) => DirState::Foreign(format!(
            "{} exists and flexvol did not make it (no ownership record)",
            path.display()
        )),
        Err(why) => DirState::Foreign(format!("{}: {why}", path.display())),
    }
}

/// Refuses a volume at `rel` inside or above another volume's directory (by the records, and
/// by the markers of old volumes above it).
fn check_nesting(root: &Root, rel: &Path, pv: &str, records: &[Record]) -> Result<(), String> {
    for r in records.iter().filter(|r| r.marker.volume != pv) {
        let other = Path::new(&r.path);
        let what = if rel == other {
            "is"
        } else if rel.starts_with(other) {
            "would be inside"
        } else if other.starts_with(rel) {
            "would contain"
        } else {
            continue;
        };
        return Err(format!(
            "{} {what} the directory of PV {} (claim {}/{}); volumes never nest: give the classes on this root patterns that cannot overlap (e.g. end each in {{{{ .PVName }}}})",
            root.real.join(rel).display(),
            r.marker.volume,
            r.marker.namespace,
            r.marker.claim
        ));
    }
    for a in rel.ancestors().skip(1) {
        if a.as_os_str().is_empty() {
            break;
        }
        let Ok(fd) = open_dir(&root.real.join(a)) else {
            continue;
        };
        if let Ok(Some(m)) = read_marker(&fd)
            && m.volume != pv
        {
            return Err(format!(
                "{} would be inside the directory of PV {} (claim {}/{}); volumes never nest: give the classes on this root patterns that cannot overlap",
                root.real.join(rel).display(),
                m.volume,
                m.namespace,
                m.claim
            ));
        }
    }
    Ok(())
}

/// Whether a leftover private directory holds nothing but what we write into it (the marker and
/// its temporary), so removing it loses nothing.
fn only_ours_inside(dir: &OwnedFd) -> bool {
    names_in(dir).is_ok_and(|names| {
        names
            .iter()
            .all(|n| n == MARKER || n == MARKER_TMP_HOSTPATH)
    })
}

/// Removes the private directory `name` in `parent` if it holds nothing but our marker; `Err`
/// when it holds anything else (never ours to delete).
fn remove_private(parent: &OwnedFd, name: &str, where_: &Path) -> Result<(), String> {
    let fd = match open_child_dir(parent, OsStr::new(name)) {
        Ok(fd) => fd,
        Err(nix::Error::ENOENT) => return Ok(()),
        Err(e) => return Err(format!("{}/{name} cannot be opened: {e}", where_.display())),
    };
    if !only_ours_inside(&fd) {
        return Err(format!(
            "{}/{name} holds files flexvol did not write; move it away",
            where_.display()
        ));
    }
    for n in [MARKER, MARKER_TMP_HOSTPATH] {
        let _ = unlinkat(&fd, n, UnlinkatFlags::NoRemoveDir);
    }
    match unlinkat(parent, name, UnlinkatFlags::RemoveDir) {
        Ok(()) | Err(nix::Error::ENOENT) => Ok(()),
        Err(e) => Err(format!("cannot remove {}/{name}: {e}", where_.display())),
    }
}

/// Renames `from` to `to` in `dir` without ever replacing anything: `renameat2(RENAME_NOREPLACE)`.
/// Where the filesystem does not support it (NFS answers `EINVAL`), a plain `rename` after
/// checking the target is absent: in the window between the check and the rename, rename(2) can
/// replace only an *empty* directory (a non-empty one fails, a file fails with `ENOTDIR`, a mount
/// point with `EBUSY`). Replacing an empty directory loses no data, and detaches it from the
/// name: whoever made it (and has it mounted) keeps the old, empty inode and never sees the
/// volume. `EEXIST`/`ENOTEMPTY`/`ENOTDIR`: something is there.
fn rename_noreplace(dir: &OwnedFd, from: &str, to: &OsStr) -> nix::Result<()> {
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

/// Creates the volume directory `<root>/<rel>` for `marker`'s PV; see
/// [`create_volume_dir_as`] (one instance per root: the private name is `.flexvol-new-<pv>`).
pub fn create_volume_dir(
    root: &Root,
    rel: &Path,
    own: Ownership,
    marker: &Marker,
) -> Result<PathBuf, String> {
    create_volume_dir_as(root, rel, own, marker, None)
}

/// Creates the volume directory `<root>/<rel>` for `marker`'s PV, never adopting anything
/// (module doc, "Creating"): missing parents root:root 0755; the directory under the private
/// name `.flexvol-new-<pv>` (`…@<instance>` when several instances share the root, as on NFS)
/// with `own`, the informational marker in it, the record published (first wins), then renamed
/// into place without replacing anything. Idempotent and kill-safe: a later call finds the
/// record and finishes (renames the private directory it names, or sees it in place). An
/// existing directory at the target that is not the one recorded for this PV is an error.
pub fn create_volume_dir_as(
    root: &Root,
    rel: &Path,
    own: Ownership,
    marker: &Marker,
    instance: Option<&str>,
) -> Result<PathBuf, String> {
    let path = root.real.join(rel);
    let pv = marker.volume.as_str();
    record_name(pv)?;
    let leaf = rel
        .file_name()
        .ok_or_else(|| format!("{} has no name", path.display()))?;
    let parent_rel = rel.parent().unwrap_or(Path::new(""));
    let parent_path = root.real.join(parent_rel);
    let base = format!("{NEW_PREFIX}{pv}");
    let private = match instance {
        Some(i) => format!("{base}@{i}.{}", std::process::id()),
        None => base.clone(),
    };
    records_dir(root, true)?;
    for _ in 0..4 {
        let records = read_records(root)?;
        check_nesting(root, rel, pv, &records)?;
        let fail = |e: &dyn std::fmt::Display| format!("cannot create {}: {e}", path.display());
        if let Some(rec) = records.iter().find(|r| r.marker.volume == pv) {
            if !rec.marker.same_volume(marker) || Path::new(&rec.path) != rel {
                return Err(format!(
                    "PV {pv} already has a directory, {}, made for claim {}/{} (uid {}); not made again at {}",
                    root.real.join(&rec.path).display(),
                    rec.marker.namespace,
                    rec.marker.claim,
                    rec.marker.claim_uid,
                    path.display()
                ));
            }
            match inspect_with(root, rel, &records) {
                DirState::Owned(_) => {
                    // Private directories of killed instances (a minute old, holding nothing
                    // but our marker) go; best effort.
                    if let Ok(parent) = open_dir(&parent_path) {
                        for n in names_in(&parent).unwrap_or_default() {
                            if let Some(s) = n.to_str()
                                && s.starts_with(&format!("{base}@"))
                                && old_entry(&parent, s)
                            {
                                let _ = remove_private(&parent, s, &parent_path);
                            }
                        }
                    }
                    return Ok(path);
                }
                DirState::Missing => {}
                DirState::Foreign(why) => return Err(squatted(&why)),
                DirState::Legacy(_) => {
                    return Err(squatted(&format!("{} exists", path.display())));
                }
            }
            // Recorded but not in place: a kill (or a racing instance) between the record and the
            // rename. Finish with the private directory the record names, if it is still there.
            let parent = open_dir(&parent_path).map_err(|e| fail(&e))?;
            let pending = open_child_dir(&parent, OsStr::new(&rec.new_name))
                .ok()
                .and_then(|fd| dev_ino(&fd).ok())
                .is_some_and(|id| rec.names(id, dev_ino(&parent).ok().map(|(d, _)| d)));
            if pending {
                match rename_noreplace(&parent, &rec.new_name, leaf) {
                    Ok(()) => {
                        let _ = nix::unistd::fsync(&parent);
                    }
                    // A racing instance renamed it first, or something took the name.
                    Err(nix::Error::ENOENT | nix::Error::EEXIST | nix::Error::ENOTEMPTY) => {}
                    Err(e) => return Err(fail(&e)),
                }
                continue;
            }
            // Nothing the record names exists (looked again, in case a racer just renamed it):
            // the record is stale; drop it and start over.
            if inspect(root, rel) == DirState::Missing {
                remove_record(root, pv)?;
            }
            continue;
        }
        // No record: nothing at the target may exist (never adopted, empty or not) — unless a
        // racing instance published its record and renamed meanwhile: look again.
        match inspect_with(root, rel, &records) {
            DirState::Missing => {}
            _ if matches!(read_record(root, pv), Ok(Some(_))) => continue,
            DirState::Foreign(why) => return Err(squatted(&why)),
            _ => return Err(squatted(&format!("{} exists", path.display()))),
        }
        let missing: Vec<OsString> = parent_rel.iter().map(OsString::from).collect();
        paths::create_dirs(&root.real, &missing, Ownership::default()).map_err(|e| fail(&e))?;
        let parent = open_dir(&parent_path).map_err(|e| fail(&e))?;
        // Leftovers of killed passes for this PV: ours by name and holding nothing but our
        // marker (a tenant can plant a name in a parent it can write: never adopted).
        for n in names_in(&parent).map_err(|e| fail(&e))? {
            let Some(s) = n.to_str() else { continue };
            let mine = s == private;
            let others = s.starts_with(&format!("{base}@")) && old_entry(&parent, s);
            if mine || others {
                remove_private(&parent, s, &parent_path)?;
            }
        }
        match nix::sys::stat::mkdirat(&parent, private.as_str(), Mode::from_bits_truncate(0o700)) {
            Ok(()) => {}
            Err(nix::Error::EEXIST) => continue,
            Err(e) => return Err(fail(&e)),
        }
        checkpoint(if instance.is_some() {
            "provisioner-nfs-after-mkdir"
        } else {
            "provisioner-after-private-mkdir"
        });
        let fd = open_child_dir(&parent, OsStr::new(&private)).map_err(|e| fail(&e))?;
        paths::apply_ownership(&fd, own, 0o755).map_err(|e| {
            let hint = if matches!(e, nix::Error::EPERM | nix::Error::EACCES) {
                " (root on this node may not change ownership there: on NFS, export with no_root_squash, or leave uid/gid out of the class)"
            } else {
                ""
            };
            format!("cannot set up {}/{private}: {e}{hint}", parent_path.display())
        })?;
        write_marker_fd(&fd, marker).map_err(|e| fail(&e))?;
        let (dev, ino) = dev_ino(&fd).map_err(|e| fail(&e))?;
        let rec = Record {
            marker: marker.clone(),
            path: rel.to_string_lossy().into_owned(),
            new_name: private.clone(),
            dev,
            ino,
        };
        if !link_record(root, &rec)? {
            // A racing instance published its own first: ours goes, theirs is finished above.
            remove_private(&parent, &private, &parent_path)?;
        }
        checkpoint("provisioner-after-record");
    }
    Err(format!(
        "{} did not settle (other instances kept changing it); retrying",
        path.display()
    ))
}

fn squatted(why: &str) -> String {
    format!(
        "{why}; flexvol never adopts a directory it did not make for this claim (whoever made it may still have it mounted): move it away, or use a pathPattern with {{{{ .PVName }}}}"
    )
}

/// Whether the entry `name` in `dir` was last changed more than a minute ago (a leftover of a
/// killed instance, never one still at work).
fn old_entry(dir: &OwnedFd, name: &str) -> bool {
    nix::sys::stat::fstatat(dir, name, AtFlags::AT_SYMLINK_NOFOLLOW).is_ok_and(|st| {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs();
        u64::try_from(st.st_mtime).is_ok_and(|m| m + 60 < now)
    })
}

/// Writes (or rewrites) the informational marker of `dir` atomically: a temporary file renamed
/// over, then synced. Ownership is decided by the record, never by this file.
pub fn write_marker(dir: &Path, marker: &Marker) -> Result<(), String> {
    let d =
        open_dir(dir).map_err(|e| format!("cannot write the marker in {}: {e}", dir.display()))?;
    write_marker_fd(&d, marker)
        .map_err(|e| format!("cannot write the marker in {}: {e}", dir.display()))
}

fn write_marker_fd(d: &OwnedFd, marker: &Marker) -> Result<(), String> {
    let fail = |e: &dyn std::fmt::Display| e.to_string();
    let tmp = MARKER_TMP_HOSTPATH;
    let how = OpenHow::new()
        .flags(
            OFlag::O_CREAT
                | OFlag::O_TRUNC
                | OFlag::O_WRONLY
                | OFlag::O_CLOEXEC
                | OFlag::O_NOFOLLOW,
        )
        .mode(Mode::from_bits_truncate(0o444))
        .resolve(ResolveFlag::RESOLVE_NO_SYMLINKS | ResolveFlag::RESOLVE_BENEATH);
    let fd = openat2(d, tmp, how).map_err(|e| fail(&e))?;
    let mut f = std::fs::File::from(fd);
    let mut data = serde_json::to_vec(marker).map_err(|e| fail(&e))?;
    data.push(b'\n');
    f.write_all(&data).map_err(|e| fail(&e))?;
    f.sync_all().map_err(|e| fail(&e))?;
    renameat(d, tmp, d, MARKER).map_err(|e| fail(&e))?;
    nix::unistd::fsync(d).map_err(|e| fail(&e))?;
    Ok(())
}

/// Outcome of [`delete_volume_dir`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Deleted {
    /// Removed now.
    Removed,
    /// Nothing was there (deleted before, by us or by hand).
    AlreadyGone,
}

/// Which root a volume path lies in, and its path relative to that root. `None` when the path is
/// not strictly below one of `roots` through normal components.
pub fn locate<'a>(roots: &'a [Root], path: &Path) -> Option<(&'a Root, PathBuf)> {
    if !path.is_absolute() {
        return None;
    }
    roots.iter().find_map(|r| {
        let rel = path
            .strip_prefix(&r.real)
            .or_else(|_| path.strip_prefix(&r.configured))
            .ok()?;
        let rel_s = rel.to_str()?;
        volume_rel_path(rel_s).ok().map(|p| (r, p))
    })
}

/// Whether `state` is the directory of PV `volume` of claim uid `claim_uid`; `Err` says why not,
/// ending with `left`.
pub fn check_owner(
    state: &DirState,
    path: &Path,
    volume: &str,
    claim_uid: &str,
    left: &str,
) -> Result<(), String> {
    let m = match state {
        DirState::Owned(r) => &r.marker,
        DirState::Legacy(m) => m,
        DirState::Missing => return Err(format!("{} does not exist", path.display())),
        DirState::Foreign(why) => return Err(format!("{why}; {left}")),
    };
    if m.volume == volume && m.claim_uid == claim_uid {
        Ok(())
    } else {
        Err(format!(
            "{} belongs to PV {} (claim uid {}), not to {volume}; {left}",
            path.display(),
            m.volume,
            m.claim_uid
        ))
    }
}

/// Deletes the volume directory `<root>/<rel>` of PV `volume` (claim uid `claim_uid`), only if
/// it is recorded as that PV's (or, for an old volume, its marker says so); then its record.
/// Before anything is removed the whole tree is checked ([`check_tree`]: no mount point, no other
/// volume); the removal itself never follows a symlink nor crosses a mount. A directory already
/// gone is not an error.
pub fn delete_volume_dir(
    root: &Root,
    rel: &Path,
    volume: &str,
    claim_uid: &str,
) -> Result<Deleted, String> {
    let path = root.real.join(rel);
    let tomb = format!("{TOMBSTONE_PREFIX}{volume}");
    let left = "it was left alone: delete it by hand if it is not needed, then remove the PV";
    let records = read_records(root)?;
    let state = inspect_with(root, rel, &records);
    if state == DirState::Missing {
        // A deletion killed after its rename left the tombstone: finish it.
        let done = if root.real.join(&tomb).exists() {
            remove_tombstone(root, &tomb)?;
            Deleted::Removed
        } else {
            Deleted::AlreadyGone
        };
        if records
            .iter()
            .any(|r| r.marker.volume == volume && Path::new(&r.path) == rel)
        {
            remove_record(root, volume)?;
        }
        return Ok(done);
    }
    check_owner(&state, &path, volume, claim_uid, left)?;
    let fail = |e: &dyn std::fmt::Display| format!("cannot delete {}: {e}", path.display());
    let dir = open_dir(&path).map_err(|e| fail(&e))?;
    check_tree(&dir, &path, volume, &records).map_err(|why| format!("{why}; {left}"))?;
    let parent_rel = rel.parent().unwrap_or(Path::new(""));
    let leaf = rel
        .file_name()
        .ok_or_else(|| format!("{} has no name", path.display()))?;
    let parent = open_dir(&root.real.join(parent_rel)).map_err(|e| fail(&e))?;
    let root_fd = open_dir(&root.real).map_err(|e| fail(&e))?;
    renameat(&parent, leaf, &root_fd, tomb.as_str()).map_err(|e| fail(&e))?;
    checkpoint("provisioner-delete-after-rename");
    remove_tombstone(root, &tomb)?;
    remove_record(root, volume)?;
    remove_leftovers(&parent, volume, &root.real.join(parent_rel));
    Ok(Deleted::Removed)
}

/// Removes the private directories killed creates of PV `volume` left in `parent` (those that
/// hold nothing but our marker). Best effort: run when the volume is deleted, when no create of
/// it can be under way any more.
fn remove_leftovers(parent: &OwnedFd, volume: &str, parent_path: &Path) {
    let base = format!("{NEW_PREFIX}{volume}");
    for n in names_in(parent).unwrap_or_default() {
        if let Some(s) = n.to_str()
            && (s == base || s.starts_with(&format!("{base}@")))
        {
            let _ = remove_private(parent, s, parent_path);
        }
    }
}

/// Deepest tree [`check_tree`] and the removal walk go into (one descriptor per level).
pub const MAX_DEPTH: usize = 256;

/// `statx` of `name` in `dir` (no symlink followed): whether it is a directory, its device, and
/// whether it is the root of a mount.
/// `None`: it is gone.
type Facts = Option<(bool, (u32, u32), bool)>;

fn entry_facts(dir: &OwnedFd, name: &OsStr) -> Result<Facts, String> {
    use rustix::fs::{AtFlags as RAt, StatxAttributes, StatxFlags};
    let st = match rustix::fs::statx(
        dir,
        name,
        RAt::SYMLINK_NOFOLLOW | RAt::NO_AUTOMOUNT,
        StatxFlags::TYPE | StatxFlags::INO,
    ) {
        Ok(st) => st,
        Err(rustix::io::Errno::NOENT) => return Ok(None),
        Err(e) => return Err(format!("cannot look at {}: {e}", name.to_string_lossy())),
    };
    let is_dir = u32::from(st.stx_mode) & nix::libc::S_IFMT == nix::libc::S_IFDIR;
    let mount = st.stx_attributes_mask.contains(StatxAttributes::MOUNT_ROOT)
        && st.stx_attributes.contains(StatxAttributes::MOUNT_ROOT);
    Ok(Some((is_dir, (st.stx_dev_major, st.stx_dev_minor), mount)))
}

fn top_dev(dir: &OwnedFd) -> Result<(u32, u32), String> {
    rustix::fs::statx(
        dir,
        "",
        rustix::fs::AtFlags::EMPTY_PATH,
        rustix::fs::StatxFlags::INO,
    )
    .map(|st| (st.stx_dev_major, st.stx_dev_minor))
    .map_err(|e| format!("cannot look at the directory: {e}"))
}

/// Walks the volume directory `dir` (at `path`) before it is deleted: fails if anything inside
/// is a mount point (statx's mount-root attribute, or another device), or is another volume's
/// directory (its device and inode in another PV's record, or an old volume's marker naming
/// another PV). Never follows a symlink; nothing is changed.
pub fn check_tree(
    dir: &OwnedFd,
    path: &Path,
    volume: &str,
    records: &[Record],
) -> Result<(), String> {
    let dev = top_dev(dir)?;
    let others: Vec<&Record> = records
        .iter()
        .filter(|r| r.marker.volume != volume)
        .collect();
    walk_tree(dir, path, dev, 0, &mut |d, p, top| {
        let id = dev_ino(d).map_err(|e| format!("cannot read {}: {e}", p.display()))?;
        // The walk never leaves the tree's device, so the inode decides (see Record::names).
        if let Some(r) = others.iter().find(|r| r.names(id, Some(id.0))) {
            return Err(format!(
                "{} holds the directory of PV {} ({}), another volume",
                path.display(),
                r.marker.volume,
                p.display()
            ));
        }
        if !top
            && let Ok(Some(m)) = read_marker(d)
            && m.volume != volume
        {
            return Err(format!(
                "{} holds the directory of PV {} ({}), another volume",
                path.display(),
                m.volume,
                p.display()
            ));
        }
        Ok(())
    })
}

/// Calls `visit` on `dir` and every directory below it (depth first), with its path and whether
/// it is the top. Fails on a mount point or another device below, a symlink is never followed.
fn walk_tree(
    dir: &OwnedFd,
    path: &Path,
    dev: (u32, u32),
    depth: usize,
    visit: &mut dyn FnMut(&OwnedFd, &Path, bool) -> Result<(), String>,
) -> Result<(), String> {
    if depth > MAX_DEPTH {
        return Err(format!(
            "{} is more than {MAX_DEPTH} directories deep; delete it by hand",
            path.display()
        ));
    }
    visit(dir, path, depth == 0)?;
    let names = names_in(dir).map_err(|e| format!("cannot list {}: {e}", path.display()))?;
    for n in names {
        let p = path.join(&n);
        let Some((is_dir, d, mount)) = entry_facts(dir, &n)? else {
            continue;
        };
        if mount || d != dev {
            return Err(format!(
                "{} is a mount point; flexvol never deletes across a mount: unmount it first",
                p.display()
            ));
        }
        if is_dir {
            let child = match open_child_dir(dir, &n) {
                Ok(fd) => fd,
                Err(nix::Error::ENOENT) => continue,
                Err(nix::Error::EXDEV) => {
                    return Err(format!(
                        "{} is a mount point; flexvol never deletes across a mount: unmount it first",
                        p.display()
                    ));
                }
                Err(e) => return Err(format!("cannot open {}: {e}", p.display())),
            };
            walk_tree(&child, &p, dev, depth + 1, visit)?;
        }
    }
    Ok(())
}

/// Empties the directory `dir` (at `path`) and everything below it: entries are unlinked through
/// their directory's descriptor, a symlink is unlinked (never followed), and a mount point or a
/// device change stops it with an error (so a mount that appears meanwhile is never crossed).
fn remove_contents(
    dir: &OwnedFd,
    path: &Path,
    dev: (u32, u32),
    depth: usize,
) -> Result<(), String> {
    if depth > MAX_DEPTH {
        return Err(format!(
            "{} is more than {MAX_DEPTH} directories deep; delete it by hand",
            path.display()
        ));
    }
    let names = names_in(dir).map_err(|e| format!("cannot list {}: {e}", path.display()))?;
    for n in names {
        let p = path.join(&n);
        let Some((is_dir, d, mount)) = entry_facts(dir, &n)? else {
            continue; // gone meanwhile (a racing instance removes the same tombstone)
        };
        if mount || d != dev {
            return Err(format!(
                "{} is a mount point; flexvol never deletes across a mount: unmount it, then delete again",
                p.display()
            ));
        }
        if is_dir {
            let child = match open_child_dir(dir, &n) {
                Ok(fd) => fd,
                Err(nix::Error::ENOENT) => continue,
                Err(nix::Error::EXDEV) => {
                    return Err(format!(
                        "{} is a mount point; flexvol never deletes across a mount: unmount it, then delete again",
                        p.display()
                    ));
                }
                Err(e) => return Err(format!("cannot open {}: {e}", p.display())),
            };
            remove_contents(&child, &p, dev, depth + 1)?;
            unlinkat(dir, n.as_os_str(), UnlinkatFlags::RemoveDir)
        } else {
            unlinkat(dir, n.as_os_str(), UnlinkatFlags::NoRemoveDir)
        }
        .or_else(|e| if e == nix::Error::ENOENT { Ok(()) } else { Err(e) })
        .map_err(|e| format!("cannot remove {}: {e}", p.display()))?;
    }
    Ok(())
}

fn remove_tombstone(root: &Root, tomb: &str) -> Result<(), String> {
    let p = root.real.join(tomb);
    let root_fd =
        open_dir(&root.real).map_err(|e| format!("cannot open {}: {e}", root.real.display()))?;
    let dir = match open_child_dir(&root_fd, OsStr::new(tomb)) {
        Ok(fd) => fd,
        Err(nix::Error::ENOENT) => return Ok(()),
        Err(nix::Error::EXDEV) => {
            return Err(format!(
                "{} is a mount point; flexvol never deletes across a mount: unmount it first",
                p.display()
            ));
        }
        Err(e) => return Err(format!("cannot open {}: {e}", p.display())),
    };
    let dev = top_dev(&dir)?;
    remove_contents(&dir, &p, dev, 0)?;
    drop(dir);
    match unlinkat(&root_fd, tomb, UnlinkatFlags::RemoveDir) {
        Ok(()) | Err(nix::Error::ENOENT) => Ok(()),
        Err(e) => Err(format!("cannot remove {}: {e}", p.display())),
    }
}

/// Finishes deletions a kill left half done (tombstones in the roots). Returns what it removed
/// and what it could not.
pub fn finish_deletes(roots: &[Root]) -> (Vec<PathBuf>, Vec<String>) {
    let (mut done, mut errors) = (Vec::new(), Vec::new());
    for r in roots {
        let Ok(entries) = std::fs::read_dir(&r.real) else {
            continue;
        };
        for e in entries.flatten() {
            let name = e.file_name();
            let Some(n) = name.to_str() else { continue };
            if n.starts_with(TOMBSTONE_PREFIX) && e.file_type().is_ok_and(|t| t.is_dir()) {
                match remove_tombstone(r, n) {
                    Ok(()) => {
                        // Its record, if the kill came before the record went.
                        let pv = &n[TOMBSTONE_PREFIX.len()..];
                        if let Ok(Some(rec)) = read_record(r, pv)
                            && inspect(r, Path::new(&rec.path)) == DirState::Missing
                        {
                            let _ = remove_record(r, pv);
                        }
                        done.push(r.real.join(n));
                    }
                    Err(why) => errors.push(why),
                }
            }
        }
    }
    (done, errors)
}

/// A volume directory found on disk, with what makes it a volume (for `status` and `gc`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Found {
    /// Where it is.
    pub path: PathBuf,
    /// What its record (or, for an old volume, its marker) says.
    pub marker: Marker,
    /// Whether a root-only record vouches for it (`false`: an old volume, known by its marker).
    pub recorded: bool,
}

/// Lists the volume directories under `roots`: those their records name (and that are there),
/// and old ones with a marker and no record, up to `depth` levels below each root (patterns may
/// nest directories). Never follows symlinks.
pub fn scan(roots: &[Root], depth: usize) -> Vec<Found> {
    fn walk(root: &Root, records: &[Record], rel: &Path, depth: usize, out: &mut Vec<Found>) {
        let Ok(entries) = std::fs::read_dir(root.real.join(rel)) else {
            return;
        };
        for e in entries.flatten() {
            if !e.file_type().is_ok_and(|t| t.is_dir()) {
                continue; // symlinks report as symlinks here, not directories
            }
            if rel.as_os_str().is_empty() && e.file_name() == STATE_DIR {
                continue;
            }
            let r = rel.join(e.file_name());
            match inspect_with(root, &r, records) {
                DirState::Owned(rec) => out.push(Found {
                    path: root.real.join(&r),
                    marker: rec.marker,
                    recorded: true,
                }),
                DirState::Legacy(marker) => out.push(Found {
                    path: root.real.join(&r),
                    marker,
                    recorded: false,
                }),
                _ if depth > 1 => walk(root, records, &r, depth - 1, out),
                _ => {}
            }
        }
    }
    let mut out = Vec::new();
    for r in roots {
        let records = read_records(r).unwrap_or_default();
        walk(r, &records, Path::new(""), depth, &mut out);
        // Recorded volumes deeper than `depth`.
        for rec in &records {
            let p = r.real.join(&rec.path);
            if !out.iter().any(|f| f.path == p)
                && matches!(
                    inspect_with(r, Path::new(&rec.path), &records),
                    DirState::Owned(_)
                )
            {
                out.push(Found {
                    path: p,
                    marker: rec.marker.clone(),
                    recorded: true,
                });
            }
        }
    }
    out.sort_by(|a, b| a.path.cmp(&b.path));
    out
}

/// The hostPath kind of volume: a marked directory under one of the node's roots
/// ([`crate::node::localpath`]), served by the hostpath driver.
pub struct HostPathBackend {
    /// `<vendor>/hostpath`, written into markers.
    pub provisioner: String,
}

impl HostPathBackend {
    /// The backend for provisioner name `provisioner`.
    pub fn new(provisioner: String) -> Self {
        Self { provisioner }
    }
}

/// The claim's uid recorded in a PV's `claimRef` (what a marker must name).
fn claim_uid_of(pv: &PersistentVolume) -> String {
    pv.spec
        .as_ref()
        .and_then(|s| s.claim_ref.as_ref())
        .and_then(|r| r.uid.clone())
        .unwrap_or_default()
}

/// The `path` option of a hostPath PV.
fn path_of(pv: &PersistentVolume) -> Option<PathBuf> {
    pv.spec
        .as_ref()
        .and_then(|s| s.flex_volume.as_ref())
        .and_then(|f| f.options.as_ref())
        .and_then(|o| o.get("path"))
        .map(PathBuf::from)
}

/// The root (of the config of the node that made it) a hostPath PV's directory lies in, and the
/// directory relative to it; `Err` says why not, ending with `what_to_do`.
fn locate_pv(
    cfg: &Config,
    pv: &PersistentVolume,
    what_to_do: &str,
) -> Result<(Root, PathBuf, PathBuf), String> {
    let path = path_of(pv).ok_or_else(|| "it has no flexVolume path option".to_string())?;
    let node = pv
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(super::reconcile::ANN_NODE))
        .cloned()
        .unwrap_or_default();
    let (roots, _) = super::reconcile::usable_roots(&cfg.local_path.node_roots(&node), false);
    match locate(&roots, &path) {
        Some((root, rel)) => Ok((root.clone(), rel, path)),
        None => Err(format!(
            "its path {} is not below a root of node {node}'s flexvol config; {what_to_do}",
            path.display()
        )),
    }
}

impl Backend for HostPathBackend {
    fn kind(&self) -> &'static str {
        "hostpath"
    }

    fn node_local(&self) -> bool {
        true
    }

    fn serves(&self, cfg: &Config, node: &str) -> bool {
        // Serving while a root can be used now (a root that is gone makes the instance advise
        // removing the node's label, and send picked claims back).
        !super::reconcile::usable_roots(&cfg.local_path.node_roots(node), true)
            .0
            .is_empty()
    }

    fn check_class(&self, params: &BTreeMap<String, String>) -> Result<(), String> {
        ClassParams::parse(params).map(|_| ())
    }

    fn access_modes(&self) -> &'static [&'static str] {
        &["ReadWriteOnce", "ReadWriteOncePod"]
    }

    fn provision(&mut self, cfg: &Config, req: &Request<'_>) -> Result<Provisioned, Refusal> {
        let params = ClassParams::parse(req.params).map_err(Refusal::Fail)?;
        let rel = match &params.path_pattern {
            Some(p) => expand_pattern(p, req.pv_name, req.namespace, req.name)
                .map_err(|why| Refusal::Fail(format!("StorageClass {}: {why}", req.class_name)))?,
            None => default_rel_path(req.pv_name, req.namespace, req.name),
        };
        // Can this node serve it at all?
        let configured = cfg.local_path.roots_for(req.node, req.class_name);
        if configured.is_empty() {
            return Err(Refusal::Reschedule(format!(
                "its flexvol config has no root for StorageClass {} (to use this node, give it a root in its flexvol config)",
                req.class_name
            )));
        }
        let (roots, bad) = super::reconcile::usable_roots(&configured, true);
        // A directory made for this PV by an earlier (killed) pass wins; else the most free space.
        let chosen = roots
            .iter()
            .find(|r| matches!(read_record(r, req.pv_name), Ok(Some(_))))
            .or_else(|| {
                roots
                    .iter()
                    .max_by_key(|r| free_bytes(&r.real).unwrap_or(0))
            });
        let Some(root) = chosen else {
            return Err(Refusal::Reschedule(format!(
                "no usable root ({})",
                bad.join("; ")
            )));
        };
        // The node key first: a Failure leaves nothing behind.
        let key = Key::load_or_create(&node_key_path(&cfg.state_dir))
            .map_err(|e| Refusal::Fail(format!("{e}; retrying")))?;
        let marker = Marker {
            provisioner: self.provisioner.clone(),
            volume: req.pv_name.to_owned(),
            namespace: req.namespace.to_owned(),
            claim: req.name.to_owned(),
            claim_uid: req.uid.to_owned(),
            node: req.node.to_owned(),
            project_id: None,
        };
        let path =
            create_volume_dir(root, &rel, params.ownership, &marker).map_err(Refusal::Fail)?;
        checkpoint("provisioner-after-directory");
        let runner = crate::sys::exec::SystemRunner::new(cfg.tool_dirs.clone());
        let size = super::quota::enforce_volume(&runner, root, &rel, req.size_bytes)
            .map_err(|why| Refusal::Fail(format!("{why}; retrying")))?;
        let location = path.display().to_string();
        // The PV alone may use the directory: the driver serves a path inside a provisioning
        // root only with this token for this PV and exactly this path.
        let token = key.sign(req.pv_name, &Location::HostPath(&location));
        Ok(Provisioned {
            options: BTreeMap::from([
                ("path".to_owned(), location.clone()),
                ("type".to_owned(), "Directory".to_owned()),
                (capability::OPTION.to_owned(), token),
            ]),
            capacity_bytes: req.size_bytes,
            annotations: size.annotations(req.size_bytes),
            location,
            fs_type: None,
        })
    }

    fn delete(&mut self, cfg: &Config, pv: &PersistentVolume) -> Result<String, String> {
        let name = pv.metadata.name.clone().unwrap_or_default();
        let (root, rel, path) = locate_pv(
            cfg,
            pv,
            "if a root was removed from the config, add it back; otherwise delete the directory by hand and then the PV",
        )?;
        let runner = crate::sys::exec::SystemRunner::new(cfg.tool_dirs.clone());
        // The project to clear afterwards: the record's (or an old marker's), only when the
        // directory really carries it (checked now, while it is there).
        let project = super::quota::project_of_volume(&runner, &root, &rel, &name);
        match delete_volume_dir(&root, &rel, &name, &claim_uid_of(pv))? {
            Deleted::Removed => {
                let released = match project {
                    Ok(id) => super::quota::release(&runner, &root, id),
                    Err(why) => format!("; no project limit cleared: {why}"),
                };
                Ok(format!("removed {}{released}", path.display()))
            }
            Deleted::AlreadyGone => Ok(format!("{} was gone already", path.display())),
        }
    }

    fn expand(&mut self, cfg: &Config, pv: &PersistentVolume, bytes: u64) -> Result<u64, String> {
        // With a project quota: raise it. Without one, nothing enforces the size of a plain
        // directory: the new size is recorded, no more (and it stays unenforced: a quota is never
        // imposed on a volume in use, whose data may already exceed it).
        let name = pv.metadata.name.clone().unwrap_or_default();
        let (root, rel, _) = locate_pv(cfg, pv, "add the root back to grow it")?;
        let runner = crate::sys::exec::SystemRunner::new(cfg.tool_dirs.clone());
        super::quota::raise_volume(&runner, &root, &rel, &name, &claim_uid_of(pv), bytes)
    }

    fn node_finishes_resize(&self) -> bool {
        false
    }

    fn recover(&mut self, cfg: &Config, node: &str) -> Vec<String> {
        let (existing, _) = super::reconcile::usable_roots(&cfg.local_path.node_roots(node), false);
        finish_deletes(&existing).1
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{MetadataExt, PermissionsExt};

    fn marker(pv: &str, uid: &str) -> Marker {
        Marker {
            provisioner: "flexvol/hostpath".into(),
            volume: pv.into(),
            namespace: "ns".into(),
            claim: "c".into(),
            claim_uid: uid.into(),
            node: "n".into(),
            project_id: None,
        }
    }

    fn root() -> (tempfile::TempDir, Root) {
        let d = tempfile::tempdir().unwrap();
        let r = prepare_root(&d.path().join("root")).unwrap();
        (d, r)
    }

    #[test]
    fn patterns_cannot_leave_the_root() {
        assert_eq!(
            expand_pattern(
                "{{ .PVC.Namespace }}/{{.PVC.Name}}-{{ .PVName }}",
                "pv",
                "a",
                "b"
            )
            .unwrap(),
            PathBuf::from("a/b-pv")
        );
        for bad in [
            "/abs/{{ .PVName }}",
            "../{{ .PVName }}",
            "a/../../b",
            "a//b",
            "./a",
            "{{ .PVC.Labels.x }}",
            "{{ .PVName ",
            "x}}",
            "",
            ".flexvol-deleting-x",
            ".flexvol/volumes",
            "ns/.flexvol-new-pvc-x",
        ] {
            let e = expand_pattern(bad, "pv", "ns", "c").unwrap_err();
            assert!(e.contains("pathPattern"), "{bad}: {e}");
        }
        // Values cannot smuggle traversal in either (names come from the API, but still).
        assert!(expand_pattern("{{ .PVC.Name }}", "pv", "ns", "..").is_err());
        assert!(expand_pattern("{{ .PVC.Name }}/x", "pv", "ns", "").is_err());
    }

    #[test]
    fn class_params_are_checked() {
        let m = |kv: &[(&str, &str)]| {
            kv.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect::<std::collections::BTreeMap<_, _>>()
        };
        let p =
            ClassParams::parse(&m(&[("uid", "1000"), ("gid", "2000"), ("mode", "0770")])).unwrap();
        assert_eq!(
            p.ownership,
            Ownership {
                uid: Some(1000),
                gid: Some(2000),
                mode: Some(0o770)
            }
        );
        for (bad, want) in [
            (m(&[("uid", "bob")]), "numeric id"),
            (m(&[("mode", "999")]), "octal"),
            (m(&[("mode", "77777")]), "octal"),
            (m(&[("uid", "4294967295")]), "(uid_t)-1"),
            (m(&[("gid", "4294967295")]), "(uid_t)-1"),
            (m(&[("mode", "2770")]), "set-gid"),
            (m(&[("mode", "4755")]), "set-uid"),
            (m(&[("mode", "1777")]), "sticky"),
            (m(&[("nodePath", "/x")]), "unknown class parameter"),
            (m(&[("pathPattern", "../x")]), "pathPattern"),
        ] {
            let e = ClassParams::parse(&bad).unwrap_err();
            assert!(e.contains(want), "{bad:?}: {e}");
        }
    }

    fn owned(r: &Root, rel: &str) -> Option<Record> {
        match inspect(r, Path::new(rel)) {
            DirState::Owned(rec) => Some(rec),
            _ => None,
        }
    }

    /// An NFS export gets a new device number each time it is mounted: a record written through
    /// one mount must still name its directory through the next (CI found deletes refused with
    /// "it was replaced"). Another inode on the same filesystem is still not the volume.
    #[test]
    fn a_record_names_its_directory_after_a_remount_changes_the_device() {
        let (_d, r) = root();
        let rel = PathBuf::from("v");
        let p = create_volume_dir(&r, &rel, Ownership::default(), &marker("pvc-1", "u1")).unwrap();
        let rec_path = r.real.join(STATE_DIR).join(RECORDS_DIR).join("pvc-1.json");
        let rewrite = |f: &dyn Fn(&mut serde_json::Value)| {
            let mut v: serde_json::Value =
                serde_json::from_slice(&std::fs::read(&rec_path).unwrap()).unwrap();
            f(&mut v);
            std::fs::write(&rec_path, serde_json::to_vec(&v).unwrap()).unwrap();
        };
        // As if written through another mount of the same export: another device number.
        rewrite(&|v| {
            let dev = v["dev"].as_u64().unwrap();
            v["dev"] = serde_json::json!(dev ^ 0x5a5a);
        });
        assert!(
            matches!(inspect(&r, &rel), DirState::Owned(_)),
            "{:?}",
            inspect(&r, &rel)
        );
        // Another directory put in its place (another inode): refused, whatever the device.
        let ino = std::fs::metadata(&p).unwrap().ino();
        rewrite(&|v| v["ino"] = serde_json::json!(ino + 1));
        assert!(matches!(inspect(&r, &rel), DirState::Foreign(why) if why.contains("replaced")));
        rewrite(&|v| v["ino"] = serde_json::json!(ino));
        assert_eq!(
            delete_volume_dir(&r, &rel, "pvc-1", "u1").unwrap(),
            Deleted::Removed
        );
        assert!(!p.exists());
    }

    #[test]
    fn a_squatted_empty_directory_is_never_adopted() {
        let (_d, r) = root();
        // An inline DirectoryOrCreate (0777) made team-b/db before the claim existed.
        let squat = r.real.join("team-b/db");
        std::fs::create_dir_all(&squat).unwrap();
        std::fs::set_permissions(&squat, PermissionsExt::from_mode(0o777)).unwrap();
        let own = Ownership {
            uid: Some(1234),
            gid: Some(5678),
            mode: Some(0o770),
        };
        let e =
            create_volume_dir(&r, Path::new("team-b/db"), own, &marker("pvc-b", "ub")).unwrap_err();
        assert!(e.contains("never adopts"), "{e}");
        assert!(e.contains("team-b/db"), "{e}");
        assert!(!squat.join(MARKER).exists(), "not marked");
        let md = std::fs::metadata(&squat).unwrap();
        assert_eq!((md.uid(), md.mode() & 0o7777), (0, 0o777), "not touched");
        assert_eq!(read_record(&r, "pvc-b").unwrap(), None);
        // Nothing under a private name is left behind either.
        assert_eq!(std::fs::read_dir(r.real.join("team-b")).unwrap().count(), 1);
    }

    #[test]
    fn a_kill_at_any_step_of_create_converges() {
        let (_d, r) = root();
        let own = Ownership {
            uid: Some(1234),
            gid: Some(5678),
            mode: Some(0o750),
        };
        let m = marker("pvc-1", "u1");
        let private = r.real.join("ns").join(format!("{NEW_PREFIX}pvc-1"));
        // Killed after the private mkdir, before the record: the leftover goes, made again.
        std::fs::create_dir_all(&private).unwrap();
        std::fs::write(private.join(MARKER), b"{}").unwrap();
        let p = create_volume_dir(&r, Path::new("ns/v"), own, &m).unwrap();
        assert!(!private.exists());
        let md = std::fs::metadata(&p).unwrap();
        assert_eq!(
            (md.uid(), md.gid(), md.mode() & 0o7777),
            (1234, 5678, 0o750)
        );
        assert_eq!(owned(&r, "ns/v").unwrap().marker, m);

        // Killed after the record, before the rename: the recorded private directory is reused.
        let m2 = marker("pvc-2", "u2");
        create_volume_dir(&r, Path::new("ns/w"), own, &m2).unwrap();
        let w = r.real.join("ns/w");
        let private2 = r.real.join("ns").join(format!("{NEW_PREFIX}pvc-2"));
        std::fs::rename(&w, &private2).unwrap();
        let ino = std::fs::metadata(&private2).unwrap().ino();
        assert_eq!(inspect(&r, Path::new("ns/w")), DirState::Missing);
        create_volume_dir(&r, Path::new("ns/w"), own, &m2).unwrap();
        assert_eq!(
            std::fs::metadata(&w).unwrap().ino(),
            ino,
            "the same directory"
        );
        assert!(!private2.exists());

        // A record whose directory is nowhere (lost by hand): dropped, made again.
        std::fs::remove_dir_all(&w).unwrap();
        create_volume_dir(&r, Path::new("ns/w"), own, &m2).unwrap();
        assert!(owned(&r, "ns/w").is_some());
        // Another instance's leftover (NFS) goes with the volume's deletion.
        let theirs = r.real.join("ns").join(format!("{NEW_PREFIX}pvc-2@other.1"));
        std::fs::create_dir(&theirs).unwrap();
        delete_volume_dir(&r, Path::new("ns/w"), "pvc-2", "u2").unwrap();
        assert!(!theirs.exists());

        // A private name holding somebody's data: not ours to remove, not used.
        let m3 = marker("pvc-3", "u3");
        let private3 = r.real.join(format!("{NEW_PREFIX}pvc-3"));
        std::fs::create_dir(&private3).unwrap();
        std::fs::write(private3.join("data"), b"x").unwrap();
        let e = create_volume_dir(&r, Path::new("x"), own, &m3).unwrap_err();
        assert!(e.contains("did not write"), "{e}");
        assert!(private3.join("data").exists());
    }

    #[test]
    fn parents_a_pattern_makes_are_roots_0755() {
        let (_d, r) = root();
        let own = Ownership {
            uid: Some(1234),
            gid: Some(5678),
            mode: Some(0o770),
        };
        create_volume_dir(&r, Path::new("ns/sub/v"), own, &marker("pvc-1", "u1")).unwrap();
        for p in ["ns", "ns/sub"] {
            let md = std::fs::metadata(r.real.join(p)).unwrap();
            assert_eq!(
                (md.uid(), md.gid(), md.mode() & 0o7777),
                (0, 0, 0o755),
                "{p}"
            );
        }
        let md = std::fs::metadata(r.real.join("ns/sub/v")).unwrap();
        assert_eq!(
            (md.uid(), md.gid(), md.mode() & 0o7777),
            (1234, 5678, 0o770)
        );
    }

    /// The child of [`a_kill_9_at_each_step_of_create_and_delete_converges`]: does one create
    /// (or delete) in the root named by the environment and is killed at the checkpoint there.
    /// Without that environment it does nothing.
    #[test]
    fn kill_child() {
        let Some(dir) = std::env::var_os("FLEXVOL_DIRLIB_CHILD_ROOT") else {
            return;
        };
        let r = prepare_root(Path::new(&dir)).unwrap();
        let own = Ownership {
            uid: Some(1234),
            gid: Some(5678),
            mode: Some(0o750),
        };
        if std::env::var_os("FLEXVOL_DIRLIB_CHILD_DELETE").is_some() {
            let _ = delete_volume_dir(&r, Path::new("ns/v"), "pvc-k", "uk");
        } else {
            let _ = create_volume_dir(&r, Path::new("ns/v"), own, &marker("pvc-k", "uk"));
        }
    }

    #[test]
    fn a_kill_9_at_each_step_of_create_and_delete_converges() {
        use std::os::unix::process::ExitStatusExt;
        let exe = std::env::current_exe().unwrap();
        let kill_at = |root: &Path, at: &str, delete: bool| {
            let mut c = std::process::Command::new(&exe);
            c.args([
                "--exact",
                "provision::hostpath::tests::kill_child",
                "--nocapture",
            ])
            .env("FLEXVOL_DIRLIB_CHILD_ROOT", root)
            .env("FLEXVOL_TEST_KILL_AT", at);
            if delete {
                c.env("FLEXVOL_DIRLIB_CHILD_DELETE", "1");
            }
            let st = c.output().unwrap().status;
            assert_eq!(st.signal(), Some(9), "{at}: not killed there ({st:?})");
        };
        let own = Ownership {
            uid: Some(1234),
            gid: Some(5678),
            mode: Some(0o750),
        };
        let m = marker("pvc-k", "uk");
        for at in [
            "provisioner-after-private-mkdir",
            "provisioner-after-record",
        ] {
            let (_d, r) = root();
            kill_at(&r.real, at, false);
            let target = r.real.join("ns/v");
            assert!(!target.exists(), "{at}: made at its name before the rename");
            let left: Vec<_> = std::fs::read_dir(r.real.join("ns"))
                .unwrap()
                .map(|e| e.unwrap().file_name())
                .collect();
            assert_eq!(left, [OsString::from(format!("{NEW_PREFIX}pvc-k"))], "{at}");
            // The next pass converges: one directory, set up, recorded, nothing left beside it.
            let p = create_volume_dir(&r, Path::new("ns/v"), own, &m).unwrap();
            let md = std::fs::metadata(&p).unwrap();
            assert_eq!(
                (md.uid(), md.gid(), md.mode() & 0o7777),
                (1234, 5678, 0o750)
            );
            assert!(owned(&r, "ns/v").is_some(), "{at}");
            assert_eq!(
                std::fs::read_dir(r.real.join("ns")).unwrap().count(),
                1,
                "{at}"
            );
        }
        // A delete killed after its rename: the next one finishes it, record included.
        let (_d, r) = root();
        let p = create_volume_dir(&r, Path::new("ns/v"), own, &m).unwrap();
        std::fs::write(p.join("data"), b"x").unwrap();
        kill_at(&r.real, "provisioner-delete-after-rename", true);
        assert!(!p.exists());
        assert!(r.real.join(format!("{TOMBSTONE_PREFIX}pvc-k")).exists());
        assert_eq!(
            delete_volume_dir(&r, Path::new("ns/v"), "pvc-k", "uk").unwrap(),
            Deleted::Removed
        );
        assert_eq!(read_record(&r, "pvc-k").unwrap(), None);
        assert_eq!(
            std::fs::read_dir(&r.real).unwrap().count(),
            2,
            "ns and .flexvol"
        );
    }

    #[test]
    fn an_old_volume_without_a_record_still_deletes() {
        let (_d, r) = root();
        // Made by an older flexvol: a marker, no record.
        let p = r.real.join("ns/old");
        std::fs::create_dir_all(&p).unwrap();
        write_marker(&p, &marker("pvc-old", "uo")).unwrap();
        std::fs::write(p.join("data"), b"x").unwrap();
        assert!(matches!(
            inspect(&r, Path::new("ns/old")),
            DirState::Legacy(_)
        ));
        // Not for another PV or claim.
        assert!(delete_volume_dir(&r, Path::new("ns/old"), "pvc-x", "uo").is_err());
        assert!(delete_volume_dir(&r, Path::new("ns/old"), "pvc-old", "ux").is_err());
        assert_eq!(
            delete_volume_dir(&r, Path::new("ns/old"), "pvc-old", "uo").unwrap(),
            Deleted::Removed
        );
        assert!(!p.exists());
    }

    #[test]
    fn volumes_never_nest() {
        let (_d, r) = root();
        let own = Ownership::default();
        create_volume_dir(&r, Path::new("team-a"), own, &marker("pvc-a", "ua")).unwrap();
        // Inside another volume.
        let e =
            create_volume_dir(&r, Path::new("team-a/db"), own, &marker("pvc-b", "ub")).unwrap_err();
        assert!(e.contains("inside the directory of PV pvc-a"), "{e}");
        assert!(!r.real.join("team-a/db").exists());
        // Above another volume.
        create_volume_dir(&r, Path::new("team-c/db"), own, &marker("pvc-d", "ud")).unwrap();
        let e =
            create_volume_dir(&r, Path::new("team-c"), own, &marker("pvc-c", "uc")).unwrap_err();
        assert!(e.contains("contain the directory of PV pvc-d"), "{e}");
        // An old volume (marker, no record) above counts too.
        std::fs::create_dir(r.real.join("old")).unwrap();
        write_marker(&r.real.join("old"), &marker("pvc-old", "uo")).unwrap();
        let e = create_volume_dir(&r, Path::new("old/x"), own, &marker("pvc-e", "ue")).unwrap_err();
        assert!(e.contains("inside the directory of PV pvc-old"), "{e}");
    }

    #[test]
    fn delete_refuses_a_tree_holding_another_volume() {
        let (_d, r) = root();
        let own = Ownership::default();
        create_volume_dir(&r, Path::new("a"), own, &marker("pvc-a", "ua")).unwrap();
        create_volume_dir(&r, Path::new("b"), own, &marker("pvc-b", "ub")).unwrap();
        std::fs::write(r.real.join("b/data"), b"b's").unwrap();
        // B's directory ends up inside A's (as nested patterns made it before).
        std::fs::rename(r.real.join("b"), r.real.join("a/b")).unwrap();
        let e = delete_volume_dir(&r, Path::new("a"), "pvc-a", "ua").unwrap_err();
        assert!(e.contains("PV pvc-b"), "{e}");
        assert!(r.real.join("a/b/data").exists());
        assert!(r.real.join("a").join(MARKER).exists());
        // An old volume's marker inside: refused too.
        std::fs::rename(r.real.join("a/b"), r.real.join("b")).unwrap();
        std::fs::create_dir(r.real.join("a/old")).unwrap();
        write_marker(&r.real.join("a/old"), &marker("pvc-old", "uo")).unwrap();
        let e = delete_volume_dir(&r, Path::new("a"), "pvc-a", "ua").unwrap_err();
        assert!(e.contains("PV pvc-old"), "{e}");
        assert!(r.real.join("a/old").join(MARKER).exists());
    }

    #[test]
    fn a_tampered_marker_decides_nothing() {
        let (_d, r) = root();
        let own = Ownership::default();
        let p = create_volume_dir(&r, Path::new("v"), own, &marker("pvc-1", "u1")).unwrap();
        // The tenant rewrites the marker in its own directory.
        let mut forged = marker("pvc-9", "u9");
        forged.project_id = Some(0x4000_0001);
        std::fs::remove_file(p.join(MARKER)).unwrap();
        std::fs::write(p.join(MARKER), serde_json::to_vec(&forged).unwrap()).unwrap();
        let rec = owned(&r, "v").unwrap();
        assert_eq!(rec.marker, marker("pvc-1", "u1"), "the record decides");
        assert!(delete_volume_dir(&r, Path::new("v"), "pvc-9", "u9").is_err());
        assert_eq!(
            delete_volume_dir(&r, Path::new("v"), "pvc-1", "u1").unwrap(),
            Deleted::Removed
        );
        assert_eq!(read_record(&r, "pvc-1").unwrap(), None);
        // The record directory is root's alone.
        let md = std::fs::metadata(r.real.join(STATE_DIR).join(RECORDS_DIR)).unwrap();
        assert_eq!((md.uid(), md.mode() & 0o777), (0, 0o700));
    }

    #[test]
    fn delete_fails_before_removing_anything_when_a_mount_is_inside() {
        if !nix::unistd::geteuid().is_root() {
            eprintln!("skipped: needs root (mount)");
            return;
        }
        let (d, r) = root();
        let p = create_volume_dir(&r, Path::new("v"), Ownership::default(), &marker("pv", "u"))
            .unwrap();
        std::fs::write(p.join("a-file"), b"x").unwrap();
        std::fs::create_dir_all(p.join("sub/mnt")).unwrap();
        std::fs::write(p.join("sub/beside"), b"x").unwrap();
        let src = d.path().join("elsewhere");
        std::fs::create_dir(&src).unwrap();
        std::fs::write(src.join("precious"), b"x").unwrap();
        let bind = |at: &Path| {
            nix::mount::mount(
                Some(&src),
                at,
                None::<&str>,
                nix::mount::MsFlags::MS_BIND,
                None::<&str>,
            )
            .unwrap();
        };
        let unbind = |at: &Path| {
            let _ = nix::mount::umount2(at, nix::mount::MntFlags::MNT_DETACH);
        };
        bind(&p.join("sub/mnt"));
        let e = delete_volume_dir(&r, Path::new("v"), "pv", "u");
        unbind(&p.join("sub/mnt"));
        let e = e.unwrap_err();
        assert!(e.contains("mount point"), "{e}");
        assert!(src.join("precious").exists(), "crossed the mount");
        assert!(p.join("a-file").exists(), "removed something first");
        assert!(p.join("sub/beside").exists(), "removed something first");
        assert!(owned(&r, "v").is_some());
        // A mount that appears in a tombstone (after the check) stops the removal there too.
        let tomb_name = format!("{TOMBSTONE_PREFIX}pv");
        let tomb = r.real.join(&tomb_name);
        std::fs::rename(&p, &tomb).unwrap();
        bind(&tomb.join("sub/mnt"));
        let e = remove_tombstone(&r, &tomb_name);
        unbind(&tomb.join("sub/mnt"));
        assert!(e.unwrap_err().contains("mount point"));
        assert!(src.join("precious").exists(), "crossed the mount");
    }

    #[test]
    fn create_is_idempotent_and_marks_the_directory() {
        let (_d, r) = root();
        let rel = default_rel_path("pvc-1", "ns", "c");
        let own = Ownership {
            uid: Some(1234),
            gid: Some(5678),
            mode: Some(0o770),
        };
        let p = create_volume_dir(&r, &rel, own, &marker("pvc-1", "u1")).unwrap();
        assert_eq!(p, r.real.join("pvc-1_ns_c"));
        let md = std::fs::metadata(&p).unwrap();
        assert_eq!((md.uid(), md.gid()), (1234, 5678));
        assert_eq!(md.permissions().mode() & 0o7777, 0o770);
        let rec = owned(&r, "pvc-1_ns_c").unwrap();
        assert_eq!(rec.marker, marker("pvc-1", "u1"));
        assert_eq!((rec.dev, rec.ino), (md.dev(), md.ino()));
        // Again: same answer, nothing changes.
        std::fs::write(p.join("data"), b"x").unwrap();
        assert_eq!(
            create_volume_dir(&r, &rel, own, &marker("pvc-1", "u1")).unwrap(),
            p
        );
        assert!(p.join("data").exists());
        // Another PV's marker, or foreign data: refused, left alone.
        let e = create_volume_dir(&r, &rel, own, &marker("pvc-2", "u2")).unwrap_err();
        assert!(e.contains("is the directory of PV pvc-1"), "{e}");
        std::fs::create_dir(r.real.join("foreign")).unwrap();
        std::fs::write(r.real.join("foreign/f"), b"x").unwrap();
        let e =
            create_volume_dir(&r, Path::new("foreign"), own, &marker("pvc-3", "u3")).unwrap_err();
        assert!(e.contains("never adopts"), "{e}");
        assert!(!r.real.join("foreign").join(MARKER).exists());
    }

    #[test]
    fn create_never_follows_symlinks() {
        let (d, r) = root();
        let outside = d.path().join("outside");
        std::fs::create_dir(&outside).unwrap();
        std::os::unix::fs::symlink(&outside, r.real.join("ns")).unwrap();
        let e = create_volume_dir(
            &r,
            Path::new("ns/c"),
            Ownership::default(),
            &marker("p", "u"),
        )
        .unwrap_err();
        assert!(e.contains("symlink") || e.contains("cannot create"), "{e}");
        assert!(!outside.join("c").exists());
        std::os::unix::fs::symlink(&outside, r.real.join("direct")).unwrap();
        assert!(
            create_volume_dir(
                &r,
                Path::new("direct"),
                Ownership::default(),
                &marker("p", "u")
            )
            .is_err()
        );
        assert!(!outside.join(MARKER).exists());
    }

    #[test]
    fn delete_checks_the_marker_and_never_follows_symlinks() {
        let (d, r) = root();
        let outside = d.path().join("outside");
        std::fs::create_dir(&outside).unwrap();
        std::fs::write(outside.join("precious"), b"x").unwrap();
        let rel = PathBuf::from("ns/c");
        let p = create_volume_dir(&r, &rel, Ownership::default(), &marker("pvc-1", "u1")).unwrap();
        std::fs::create_dir(p.join("sub")).unwrap();
        std::fs::write(p.join("sub/f"), b"x").unwrap();
        std::os::unix::fs::symlink(&outside, p.join("escape")).unwrap();
        std::os::unix::fs::symlink(outside.join("precious"), p.join("file-link")).unwrap();

        // Wrong PV or wrong claim: refused.
        assert!(delete_volume_dir(&r, &rel, "pvc-2", "u1").is_err());
        assert!(delete_volume_dir(&r, &rel, "pvc-1", "u2").is_err());
        assert!(p.join("sub/f").exists());

        assert_eq!(
            delete_volume_dir(&r, &rel, "pvc-1", "u1").unwrap(),
            Deleted::Removed
        );
        assert!(!p.exists());
        assert!(outside.join("precious").exists(), "followed a symlink");
        assert!(r.real.join("ns").exists(), "only the volume directory goes");
        assert_eq!(
            std::fs::read_dir(&r.real).unwrap().count(),
            2,
            "no tombstone left (ns and .flexvol)"
        );
        assert_eq!(read_record(&r, "pvc-1").unwrap(), None);
        // Gone already: fine.
        assert_eq!(
            delete_volume_dir(&r, &rel, "pvc-1", "u1").unwrap(),
            Deleted::AlreadyGone
        );

        // The volume directory itself swapped for a symlink to a marked directory elsewhere.
        let elsewhere = d.path().join("elsewhere");
        std::fs::create_dir(&elsewhere).unwrap();
        let r2 = prepare_root(&elsewhere).unwrap();
        create_volume_dir(
            &r2,
            Path::new("v"),
            Ownership::default(),
            &marker("pvc-9", "u9"),
        )
        .unwrap();
        std::os::unix::fs::symlink(elsewhere.join("v"), r.real.join("v")).unwrap();
        let e = delete_volume_dir(&r, Path::new("v"), "pvc-9", "u9").unwrap_err();
        assert!(e.contains("symlink"), "{e}");
        assert!(elsewhere.join("v").join(MARKER).exists());
        // A marker that is a symlink to a good marker: not trusted.
        std::fs::create_dir(r.real.join("w")).unwrap();
        std::os::unix::fs::symlink(
            elsewhere.join("v").join(MARKER),
            r.real.join("w").join(MARKER),
        )
        .unwrap();
        assert!(delete_volume_dir(&r, Path::new("w"), "pvc-9", "u9").is_err());
        assert!(r.real.join("w").exists());
        // No marker: refused.
        std::fs::create_dir(r.real.join("bare")).unwrap();
        assert!(delete_volume_dir(&r, Path::new("bare"), "pvc-1", "u1").is_err());
        assert!(r.real.join("bare").exists());
    }

    #[test]
    fn a_half_done_delete_is_finished() {
        let (_d, r) = root();
        let rel = PathBuf::from("v");
        create_volume_dir(&r, &rel, Ownership::default(), &marker("pvc-1", "u1")).unwrap();
        // Simulate a kill right after the rename.
        std::fs::rename(
            r.real.join("v"),
            r.real.join(format!("{TOMBSTONE_PREFIX}pvc-1")),
        )
        .unwrap();
        assert_eq!(
            delete_volume_dir(&r, &rel, "pvc-1", "u1").unwrap(),
            Deleted::Removed
        );
        assert_eq!(
            std::fs::read_dir(&r.real).unwrap().count(),
            1,
            "only .flexvol"
        );
        assert_eq!(read_record(&r, "pvc-1").unwrap(), None);
        std::fs::create_dir(r.real.join(format!("{TOMBSTONE_PREFIX}pvc-2"))).unwrap();
        let (done, errors) = finish_deletes(std::slice::from_ref(&r));
        assert_eq!((done.len(), errors.len()), (1, 0));
    }

    #[test]
    fn locate_refuses_paths_outside_roots() {
        let (_d, r) = root();
        let roots = vec![r.clone()];
        assert_eq!(
            locate(&roots, &r.real.join("a/b")).map(|(_, p)| p),
            Some(PathBuf::from("a/b"))
        );
        for bad in [
            r.real.clone(),
            r.real.join("../x"),
            r.real.join("a/../../x"),
            PathBuf::from("/etc"),
            PathBuf::from("rel"),
            r.real.join(format!("{TOMBSTONE_PREFIX}x")),
        ] {
            assert!(locate(&roots, &bad).is_none(), "{}", bad.display());
        }
    }

    #[test]
    fn scan_finds_marked_directories() {
        let (_d, r) = root();
        create_volume_dir(
            &r,
            Path::new("a"),
            Ownership::default(),
            &marker("pvc-1", "u1"),
        )
        .unwrap();
        create_volume_dir(
            &r,
            Path::new("ns/b"),
            Ownership::default(),
            &marker("pvc-2", "u2"),
        )
        .unwrap();
        std::fs::create_dir(r.real.join("other")).unwrap();
        // An old volume: a marker, no record.
        std::fs::create_dir(r.real.join("old")).unwrap();
        write_marker(&r.real.join("old"), &marker("pvc-0", "u0")).unwrap();
        let f = scan(std::slice::from_ref(&r), 3);
        assert_eq!(
            f.iter()
                .map(|f| (f.marker.volume.as_str(), f.recorded))
                .collect::<Vec<_>>(),
            vec![("pvc-1", true), ("pvc-2", true), ("pvc-0", false)]
        );
    }

    #[test]
    fn free_space_is_read() {
        let (_d, r) = root();
        assert!(free_bytes(&r.real).is_some());
        assert!(free_bytes(Path::new("/nonexistent/x")).is_none());
    }
}
