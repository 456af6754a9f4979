//! Marked directories: the library the hostPath and NFS provisioners (and `flexvol status`/`gc`,
//! and the project quotas of [`crate::provision::storage::quota`]) share to make, find and delete volume directories
//! below a root — a hostPath root of the node config, or an NFS export the provisioner mounted.
//!
//! What it offers: [`Root`]s ([`prepare_root`], [`usable_roots`]), ownership [`Record`]s and
//! [`Marker`]s, the state of a directory and whether it is a PV's ([`inspect`] → [`DirState`],
//! [`check_owner`], [`check_ours`]), creating ([`create_volume_dir_as`]) and deleting
//! ([`delete_volume_dir`], tombstones finished by [`finish_deletes`], leftovers by
//! [`remove_leftovers`]) volume directories, and listing them ([`scan`], [`SCAN_DEPTH`]). The
//! directory part of a class (`pathPattern`, `uid`, `gid`, `mode`) is parsed here too
//! ([`DirParams`]), since both provisioners take it. It knows no provisioner and no Kubernetes
//! object (callers pass names and paths); its errors are typed ([`VolumeDirError`], [`ProvisionError`]). The
//! system calls are [`crate::sys::dirfd`]'s.
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
//! it decides nothing. **Old volumes**, made before records existed (a marker and no record,
//! [`DirState::Legacy`]), get their record once: hostPath volumes on the provisioner's first
//! pass after the upgrade, an NFS volume (whose export is mounted only for work on it) the first
//! time its PV is checked ([`check_ours`]) ([`adopt_legacy`]: the PV read from the API server, whose path is that directory, is
//! the evidence; the marker must agree on the PV and claim, and its `projectId` is kept only when
//! the directory carries that project). Until then such a directory is deleted and resized only
//! as its own PV's, its `projectId` used only after [`crate::provision::storage::quota`] checked it. Nesting and the
//! delete's tree check read records only: a marker file elsewhere — below a volume, above a new
//! path — is the tenant's and is never read. Every read of a marker or record goes through the
//! one file layer ([`crate::sys::dirfd::read_small`]: a regular file only, never blocking,
//! bounded).
//!
//! Creating ([`create_volume_dir_as`]) never adopts anything: an existing directory at the target
//! that is not the recorded one for this PV — empty or not, made by a pod's inline
//! `DirectoryOrCreate` that may still have it mounted — is an error. The steps:
//! 1. refuse a path inside or above another volume (by the records): volumes never nest;
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
//! minute old, and all of this PV's (empty or holding only our marker, of any instance) when the
//! volume is deleted or archived — also by the call that finishes a deletion a kill interrupted
//! ([`remove_leftovers`]).
//!
//! Deleting ([`delete_volume_dir`]): only a directory that is the PV's (record, or an old volume's
//! marker) for that PV's claim. First the whole tree is walked ([`check_tree`], descriptors only,
//! no symlink followed): a mount point anywhere inside (statx's mount-root attribute, another
//! device, or `openat2(RESOLVE_NO_XDEV)` refusing to cross) or another volume's directory (its
//! inode in another PV's record) fails the delete
//! before anything is removed. Then the directory is renamed to `<root>/.flexvol-deleting-<pv>`
//! (one atomic step that commits it) and removed by a descriptor-based walk that unlinks symlinks
//! without following them and stops at any mount point or device change — so a mount that appears
//! meanwhile still stops it. Then the record goes. A kill -9 in between leaves the tombstone, which
//! [`finish_deletes`] (or the next delete of the PV) removes, and its record with it.
//!
//! Sizes are not this module's: a record holds the project ID of a volume's quota (written by
//! [`crate::provision::storage::quota`] before the quota is set up), nothing more.
//!
//! What this relies on: nothing but root can write below `<root>/.flexvol`. The drivers must not
//! serve it (or a root itself) to an inline volume, which the capability check of
//! [`crate::node::capability`] is for. Not covered here: a *parent* directory somebody else made
//! before flexvol did (an inline volume's `<root>/team-b`, kept mounted) is used as it is, so its
//! maker sees the volumes made below it; parents made by older flexvol versions are
//! indistinguishable from such a squat (same owners), so refusing them would break upgrades.
//!
//! Caller contract: on a node-local root one provisioner works at a time (the DaemonSet runs one
//! per node) and passes no instance name ([`create_volume_dir`]); on a shared root (an NFS export)
//! several instances may work at once, each passing its own instance name
//! ([`create_volume_dir_as`]) — the record published by a hard link and renames that never replace
//! make them converge on one directory. Nothing here takes a lock.

use crate::provision::storage::error::ProvisionError;
use crate::sys::dirfd::{self, dev_ino, open_child_dir, open_dir};
use crate::sys::paths::{self, Ownership};
use crate::sys::process::checkpoint;
use serde::{Deserialize, Serialize};
use std::ffi::{OsStr, OsString};
use std::io::Write;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Component, Path, PathBuf};

/// What the marked-directory library's work can fail with, by the kind a caller branches on. The
/// message (`Display`) is the text people read in events and logs, unchanged from when these were
/// plain strings. A plain `String` converts to [`VolumeDirError::Failed`] (a step to retry), as
/// [`ProvisionError`] does.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VolumeDirError {
    /// A class parameter (`pathPattern`, `uid`, `gid`, `mode`) or a name is not usable: only a
    /// fixed class (or name) helps.
    #[error("{0}")]
    Invalid(String),
    /// A class parameter flexvol does not know (a typo must not fall back to a default): as
    /// [`VolumeDirError::Invalid`]; the caller adds the parameters it knows besides.
    #[error("{0}")]
    UnknownParam(String),
    /// Not provably ours: a directory or file flexvol did not make for this PV and claim (a
    /// squatted name, a private directory holding others' files, another claim's volume), or
    /// flexvol's own state that cannot be trusted (records not root's, a record or marker that is
    /// not flexvol's JSON). Left alone for a person.
    #[error("{0}")]
    NotOurs(String),
    /// A mount point or another volume's directory inside (or around) the one at work: volumes
    /// never nest, and a delete never crosses a mount. Left alone for a person.
    #[error("{0}")]
    Occupied(String),
    /// A step failed (the filesystem, a racing instance): the next pass tries again.
    #[error("{0}")]
    Failed(String),
}

impl From<String> for VolumeDirError {
    fn from(why: String) -> Self {
        Self::Failed(why)
    }
}

/// For callers whose errors are still plain messages: the text, unchanged.
impl From<VolumeDirError> for String {
    fn from(e: VolumeDirError) -> Self {
        e.to_string()
    }
}

/// Each kind to the provisioners' kind: what is not ours, or holds a mount or another volume, is
/// [`ProvisionError::Refused`]; an invalid class stays one; a failed step stays one.
impl From<VolumeDirError> for ProvisionError {
    fn from(e: VolumeDirError) -> Self {
        match e {
            VolumeDirError::Invalid(m) | VolumeDirError::UnknownParam(m) => Self::InvalidClass(m),
            VolumeDirError::NotOurs(m) | VolumeDirError::Occupied(m) => Self::Refused(m),
            VolumeDirError::Failed(m) => Self::Failed(m),
        }
    }
}

impl VolumeDirError {
    /// The same kind of error with `f` applied to its message (context added).
    pub(crate) fn map(self, f: impl FnOnce(String) -> String) -> Self {
        match self {
            Self::Invalid(m) => Self::Invalid(f(m)),
            Self::UnknownParam(m) => Self::UnknownParam(f(m)),
            Self::NotOurs(m) => Self::NotOurs(f(m)),
            Self::Occupied(m) => Self::Occupied(f(m)),
            Self::Failed(m) => Self::Failed(f(m)),
        }
    }
}

/// How many directory levels below a root [`scan`] looks for volumes (patterns may nest them).
pub(crate) const SCAN_DEPTH: usize = 4;

/// The ownership marker's file name inside a volume directory.
pub const MARKER: &str = ".flexvol-provisioned";
/// The temporary the marker is written to before it is renamed into place.
pub const MARKER_TMP: &str = ".flexvol-provisioned.tmp";
/// Prefix of a committed deletion in a root.
pub const TOMBSTONE_PREFIX: &str = ".flexvol-deleting-";
/// Prefix of a volume directory being made, in its parent: `.flexvol-new-<pv>[@<instance>]`.
pub const NEW_PREFIX: &str = ".flexvol-new-";
/// flexvol's own directory in a root (root-only, 0700).
pub const STATE_DIR: &str = ".flexvol";
/// The ownership records' directory in [`STATE_DIR`]: `<root>/.flexvol/volumes/<pv>.json`.
pub(crate) const RECORDS_DIR: &str = "volumes";
/// A record's file name is the PV's name with this suffix.
pub(crate) const RECORD_SUFFIX: &str = ".json";
/// Every name flexvol reserves in a root starts with this.
pub(crate) const RESERVED_PREFIX: &str = ".flexvol";

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
    /// The project ID of its enforced size ([`crate::provision::storage::quota`]), recorded before the quota is set
    /// up so that a pass after a kill reuses it. Absent where the size is not enforced.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub project_id: Option<u32>,
}

impl Marker {
    /// Whether `self` and `other` name the same volume: everything but the project ID (which the
    /// quota step adds later) and the node (on NFS, any instance may be the one that made it).
    pub(crate) fn same_volume(&self, other: &Marker) -> bool {
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
pub(crate) struct Record {
    /// The PV, its claim, the node that made it and its project ID.
    #[serde(flatten)]
    pub(crate) marker: Marker,
    /// The directory relative to the root.
    pub(crate) path: String,
    /// The private name it was made under (in the same parent) before it was renamed into place.
    pub(crate) new_name: String,
    /// Its device (`st_dev`).
    pub(crate) dev: u64,
    /// Its inode.
    pub(crate) ino: u64,
}

impl Record {
    /// Whether the directory with `(dev, ino)` is the one this record names. The inode must be
    /// the recorded one; the device the recorded one, or `fs_dev`, the device of the filesystem
    /// being looked at (the root, the parent, the tree being deleted) now. An NFS export gets a
    /// new device number each time it is mounted (the provisioner mounts it for every piece of
    /// work, and kubelet's mounts with other options make other superblocks), so on NFS only the
    /// inode (the server's file id) is stable; a directory of another filesystem mounted there
    /// still differs in device from both.
    pub(crate) fn names(&self, (dev, ino): (u64, u64), fs_dev: Option<u64>) -> bool {
        self.ino == ino && (self.dev == dev || fs_dev == Some(dev))
    }
}

/// The directory part of a hostPath or NFS class's parameters, validated.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct DirParams {
    /// `pathPattern`: the directory below the root, from a template.
    pub(crate) path_pattern: Option<String>,
    /// `uid`, `gid`, `mode` of the volume directory.
    pub(crate) ownership: Ownership,
}

/// The directory parameter names a class may use.
pub(crate) const DIR_PARAMS: [&str; 4] = ["pathPattern", "uid", "gid", "mode"];

impl DirParams {
    /// Validates a StorageClass's `parameters`. Unknown keys are errors: a typo must not fall back
    /// to a default silently.
    pub fn parse<'a>(
        params: impl IntoIterator<Item = (&'a String, &'a String)>,
    ) -> Result<Self, VolumeDirError> {
        let mut p = DirParams::default();
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
                        VolumeDirError::Invalid(format!(
                            "class parameter {k}={v:?}: {why}; use e.g. {k}: \"1000\""
                        ))
                    })?;
                    if k == "uid" {
                        p.ownership.uid = Some(id);
                    } else {
                        p.ownership.gid = Some(id);
                    }
                }
                "mode" => {
                    let m = Ownership::parse_mode(v).map_err(|why| {
                        VolumeDirError::Invalid(format!(
                            "class parameter mode={v:?}: {why}; use e.g. mode: \"0770\""
                        ))
                    })?;
                    p.ownership.mode = Some(m);
                }
                _ => {
                    return Err(VolumeDirError::UnknownParam(format!(
                        "unknown class parameter {k:?}; the hostpath provisioner knows {}",
                        DIR_PARAMS.join(", ")
                    )));
                }
            }
        }
        Ok(p)
    }
}

/// Expands local-path's `pathPattern` template. Known fields: `{{ .PVName }}`,
/// `{{ .PVC.Namespace }}`, `{{ .PVC.Name }}`. The result must be a relative path of normal
/// components: no `..`, no `.`, no empty component, not absolute, so it cannot leave the root.
pub(crate) fn expand_pattern(
    pattern: &str,
    pv: &str,
    ns: &str,
    claim: &str,
) -> Result<PathBuf, VolumeDirError> {
    let bad = |why: &str| {
        VolumeDirError::Invalid(format!(
            "class parameter pathPattern={pattern:?} {why}; use fields {{{{ .PVName }}}}, {{{{ .PVC.Namespace }}}}, {{{{ .PVC.Name }}}} joined by /, e.g. \"{{{{ .PVC.Namespace }}}}/{{{{ .PVC.Name }}}}\""
        ))
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
    volume_rel_path(&out).map_err(|why| bad(&why.to_string()))
}

/// Checks a directory path relative to a root: non-empty, relative, normal components only, and
/// not one of our reserved names.
pub(crate) fn volume_rel_path(s: &str) -> Result<PathBuf, VolumeDirError> {
    if s.is_empty() || s.starts_with('/') || s.contains('\0') {
        return Err(VolumeDirError::Invalid(
            "must expand to a non-empty relative path".into(),
        ));
    }
    for part in s.split('/') {
        if part.is_empty() || part == "." || part == ".." {
            return Err(VolumeDirError::Invalid(format!(
                "expands to {s:?}, which has an empty, \".\" or \"..\" component"
            )));
        }
        if part.starts_with(RESERVED_PREFIX) {
            return Err(VolumeDirError::Invalid(format!(
                "expands to {s:?}, which uses a name flexvol reserves"
            )));
        }
    }
    let p = PathBuf::from(s);
    debug_assert!(p.components().all(|c| matches!(c, Component::Normal(_))));
    Ok(p)
}

/// The default directory name, as local-path names it: `<pv>_<namespace>_<claim>`.
pub(crate) fn default_rel_path(pv: &str, ns: &str, claim: &str) -> PathBuf {
    PathBuf::from(format!("{pv}_{ns}_{claim}"))
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
pub fn prepare_root(configured: &Path) -> Result<Root, VolumeDirError> {
    let (base, missing) = paths::resolve_existing(configured)
        .map_err(|e| format!("root {} cannot be resolved: {e}", configured.display()))?;
    if !missing.is_empty() {
        paths::create_dirs(&base, &missing, Ownership::default())
            .map_err(|e| format!("root {} cannot be created: {e}", configured.display()))?;
    }
    let real = std::fs::canonicalize(configured)
        .map_err(|e| format!("root {} cannot be resolved: {e}", configured.display()))?;
    if !real.is_dir() {
        return Err(VolumeDirError::Failed(format!(
            "root {} is not a directory",
            configured.display()
        )));
    }
    Ok(Root {
        configured: configured.to_owned(),
        real,
    })
}

/// The roots among `paths` usable now, creating missing ones when `create` ([`prepare_root`]);
/// errors for the others.
pub(crate) fn usable_roots(paths: &[PathBuf], create: bool) -> (Vec<Root>, Vec<String>) {
    let (mut ok, mut bad) = (Vec::new(), Vec::new());
    for p in paths {
        let r = if create {
            prepare_root(p).map_err(String::from)
        } else {
            std::fs::canonicalize(p)
                .map(|real| Root {
                    configured: p.clone(),
                    real,
                })
                .map_err(|e| format!("root {} cannot be resolved: {e}", p.display()))
        };
        match r {
            Ok(r) => ok.push(r),
            Err(e) => bad.push(e),
        }
    }
    (ok, bad)
}

/// What a volume directory holds, seen without following symlinks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum DirState {
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

/// The most a marker or a record may hold (they are a few hundred bytes).
const MAX_JSON: u64 = 64 * 1024;

/// Reads a small JSON file `name` in `dir` through the one file layer
/// ([`dirfd::read_small`]: no symlink followed, a regular file only, never blocking, at most
/// [`MAX_JSON`] bytes), `None` when absent.
fn read_json<T: serde::de::DeserializeOwned>(
    dir: &impl AsFd,
    name: &str,
    what: &str,
) -> Result<Option<T>, VolumeDirError> {
    let data = match dirfd::read_small(dir, name, MAX_JSON) {
        Ok(Some(data)) => data,
        Ok(None) => return Ok(None),
        Err(e) => {
            return Err(VolumeDirError::Failed(format!(
                "its {what} {name} cannot be read: {e}"
            )));
        }
    };
    serde_json::from_slice(&data)
        .map(Some)
        .map_err(|e| VolumeDirError::NotOurs(format!("its {what} {name} is not flexvol's: {e}")))
}

fn read_marker(dir: &OwnedFd) -> Result<Option<Marker>, VolumeDirError> {
    read_json(dir, MARKER, "marker")
}

/// The names in an open directory ([`dirfd::list`]: through its descriptor, so whatever its path
/// names now does not matter), without `.` and `..`.
fn names_in(dir: &OwnedFd) -> std::io::Result<Vec<OsString>> {
    // A directory of millions of entries is slow to list, not stuck (`sys::progress`).
    crate::sys::progress::beat();
    let names = dirfd::list(dir).map_err(std::io::Error::from);
    crate::sys::progress::beat();
    names
}

/// `<root>/.flexvol/volumes`, opened; created (mode 0700) when `create`. It is trusted only when
/// both directories are real directories (no symlink), owned by the user we run as (root) and
/// closed to everybody else; anything else is an error that says what to do. `Ok(None)`: absent
/// and not created.
fn records_dir(root: &Root, create: bool) -> Result<Option<OwnedFd>, VolumeDirError> {
    let mut cur = open_dir(&root.real)
        .map_err(|e| format!("root {} cannot be opened: {e}", root.real.display()))?;
    let mut path = root.real.clone();
    for name in [STATE_DIR, RECORDS_DIR] {
        path.push(name);
        let fail = |e: &dyn std::fmt::Display| {
            VolumeDirError::Failed(format!(
                "flexvol's record directory {}: {e}",
                path.display()
            ))
        };
        let fd = match open_child_dir(&cur, OsStr::new(name)) {
            Ok(fd) => fd,
            Err(nix::Error::ENOENT) if create => {
                match dirfd::mkdir(&cur, name, 0o700) {
                    Ok(()) | Err(nix::Error::EEXIST) => {}
                    Err(e) => return Err(fail(&e)),
                }
                let fd = open_child_dir(&cur, OsStr::new(name)).map_err(|e| fail(&e))?;
                // Made now, by us: close it to everybody else whatever the umask was.
                let st = dirfd::stat(&fd).map_err(|e| fail(&e))?;
                if st.st_uid == nix::unistd::geteuid().as_raw() {
                    dirfd::chmod(&fd, 0o700).map_err(|e| fail(&e))?;
                }
                fd
            }
            Err(nix::Error::ENOENT) => return Ok(None),
            Err(e) => return Err(fail(&e)),
        };
        let st = dirfd::stat(&fd).map_err(|e| fail(&e))?;
        if st.st_uid != nix::unistd::geteuid().as_raw() || st.st_mode & 0o077 != 0 {
            let why = format!(
                "is owned by uid {} with mode {:o}, not by root with mode 0700, so flexvol cannot trust what is in it (on NFS: export with no_root_squash); move it away",
                st.st_uid,
                st.st_mode & 0o7777
            );
            return Err(VolumeDirError::NotOurs(fail(&why).to_string()));
        }
        cur = fd;
    }
    Ok(Some(cur))
}

fn record_name(pv: &str) -> Result<String, VolumeDirError> {
    if pv.contains('/') || volume_rel_path(pv).is_err() || pv.starts_with('.') {
        return Err(VolumeDirError::Invalid(format!(
            "{pv:?} is not usable as a PV name"
        )));
    }
    Ok(format!("{pv}{RECORD_SUFFIX}"))
}

/// The record of PV `pv` under `root`, if any.
pub(crate) fn read_record(root: &Root, pv: &str) -> Result<Option<Record>, VolumeDirError> {
    let Some(dir) = records_dir(root, false)? else {
        return Ok(None);
    };
    read_json(&dir, &record_name(pv)?, "record")
}

/// Every record under `root` (none when the record directory does not exist). A record that
/// cannot be read is an error: it may be a volume, and nothing may be decided without it.
pub(crate) fn read_records(root: &Root) -> Result<Vec<Record>, VolumeDirError> {
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
fn write_temp_record(dir: &OwnedFd, rec: &Record) -> Result<String, VolumeDirError> {
    let fail = |e: &dyn std::fmt::Display| {
        VolumeDirError::Failed(format!(
            "cannot write the record of {}: {e}",
            rec.marker.volume
        ))
    };
    let tmp = temp_name(&rec.marker.volume);
    let fd = dirfd::create_new_file(dir, tmp.as_str(), 0o600).map_err(|e| fail(&e))?;
    let mut f = std::fs::File::from(fd);
    let mut data = serde_json::to_vec(rec).map_err(|e| fail(&e))?;
    data.push(b'\n');
    let written = f
        .write_all(&data)
        .and_then(|()| f.sync_all())
        .map_err(|e| fail(&e));
    if written.is_err() {
        let _ = dirfd::unlink(dir, tmp.as_str());
    }
    written.map(|()| tmp)
}

/// Publishes `rec` unless a record of its PV exists: hard-links a temporary into place (the
/// first link wins, on NFS too). Returns whether this call's record is the one in place.
fn link_record(root: &Root, rec: &Record) -> Result<bool, VolumeDirError> {
    let dir = records_dir(root, true)?
        .ok_or_else(|| VolumeDirError::Failed("no record directory".into()))?;
    let name = record_name(&rec.marker.volume)?;
    let tmp = write_temp_record(&dir, rec)?;
    let linked = dirfd::link(&dir, &tmp, &name);
    let _ = dirfd::unlink(&dir, tmp.as_str());
    let won = match linked {
        Ok(()) => true,
        Err(nix::Error::EEXIST) => false,
        Err(e) => {
            return Err(VolumeDirError::Failed(format!(
                "cannot write the record of {}: {e}",
                rec.marker.volume
            )));
        }
    };
    dirfd::sync(&dir).map_err(|e| format!("cannot sync flexvol's records: {e}"))?;
    Ok(won)
}

/// Replaces the record of `rec`'s PV (a temporary renamed over, then synced): how a project ID is
/// added to it.
pub(crate) fn write_record(root: &Root, rec: &Record) -> Result<(), VolumeDirError> {
    let dir = records_dir(root, true)?
        .ok_or_else(|| VolumeDirError::Failed("no record directory".into()))?;
    let name = record_name(&rec.marker.volume)?;
    let tmp = write_temp_record(&dir, rec)?;
    dirfd::rename(&dir, tmp.as_str(), &dir, name.as_str())
        .and_then(|()| dirfd::sync(&dir))
        .map_err(|e| {
            VolumeDirError::Failed(format!(
                "cannot write the record of {}: {e}",
                rec.marker.volume
            ))
        })
}

/// Removes the record of PV `pv` when it names `rel` and nothing is at `rel` any more (the
/// directory was deleted or archived).
pub(crate) fn forget_record(root: &Root, rel: &Path, pv: &str) -> Result<(), VolumeDirError> {
    match read_record(root, pv)? {
        Some(r) if Path::new(&r.path) == rel && inspect(root, rel) == DirState::Missing => {
            remove_record(root, pv)
        }
        _ => Ok(()),
    }
}

/// Removes the record of PV `pv` (absent is fine).
fn remove_record(root: &Root, pv: &str) -> Result<(), VolumeDirError> {
    let Some(dir) = records_dir(root, false)? else {
        return Ok(());
    };
    match dirfd::unlink(&dir, record_name(pv)?.as_str()) {
        Ok(()) | Err(nix::Error::ENOENT) => {
            let _ = dirfd::sync(&dir);
            Ok(())
        }
        Err(e) => Err(VolumeDirError::Failed(format!(
            "cannot remove the record of {pv}: {e}"
        ))),
    }
}

/// Looks at `<root>/<rel>` without following symlinks. Ownership comes from the root-only
/// records; an in-directory marker counts only for a volume that has no record (an old one).
pub(crate) fn inspect(root: &Root, rel: &Path) -> DirState {
    match read_records(root) {
        Ok(records) => inspect_with(root, rel, &records),
        Err(why) => DirState::Foreign(why.to_string()),
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

/// Refuses a volume at `rel` inside or above another volume's directory, by the root-only
/// records.
fn check_nesting(
    root: &Root,
    rel: &Path,
    pv: &str,
    records: &[Record],
) -> Result<(), VolumeDirError> {
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
        return Err(VolumeDirError::Occupied(format!(
            "{} {what} the directory of PV {} (claim {}/{}); volumes never nest: give the classes on this root patterns that cannot overlap (e.g. end each in {{{{ .PVName }}}})",
            root.real.join(rel).display(),
            r.marker.volume,
            r.marker.namespace,
            r.marker.claim
        )));
    }
    // Only the root-only records decide: a marker in a directory above `rel` is a file its
    // directory's owner wrote. Old volumes have their records since the provisioner's first pass
    // ([`adopt_legacy`]).
    Ok(())
}

/// Whether a leftover private directory holds nothing but what we write into it (the marker and
/// its temporary) and NFS silly-renamed files (never removed by us: the client removes them), so
/// removing it loses nothing.
fn only_ours_inside(dir: &OwnedFd) -> bool {
    names_in(dir).is_ok_and(|names| {
        names
            .iter()
            .all(|n| n == MARKER || n == MARKER_TMP || is_silly_renamed(n))
    })
}

/// Whether `n` is the name an NFS client gives a file unlinked while open: `.nfs` and hex digits.
fn is_silly_renamed(n: &OsStr) -> bool {
    n.to_str()
        .and_then(|s| s.strip_prefix(".nfs"))
        .is_some_and(|h| !h.is_empty() && h.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// Removes the private directory `name` in `parent` if it holds nothing but our marker; `Err`
/// when it holds anything else (never ours to delete).
fn remove_private(parent: &OwnedFd, name: &str, where_: &Path) -> Result<(), VolumeDirError> {
    let fd = match open_child_dir(parent, OsStr::new(name)) {
        Ok(fd) => fd,
        Err(nix::Error::ENOENT) => return Ok(()),
        Err(e) => {
            return Err(VolumeDirError::Failed(format!(
                "{}/{name} cannot be opened: {e}",
                where_.display()
            )));
        }
    };
    if !only_ours_inside(&fd) {
        return Err(VolumeDirError::NotOurs(format!(
            "{}/{name} holds files flexvol did not write; move it away",
            where_.display()
        )));
    }
    for n in [MARKER, MARKER_TMP] {
        let _ = dirfd::unlink(&fd, n);
    }
    // On NFS a file unlinked while some descriptor of this client still has it open (a child
    // between fork and exec holds copies of every descriptor for a moment) is renamed to
    // `.nfs<id>` by the client and removed when the last descriptor closes: the directory is
    // not empty until then. Wait a bounded while for that, and only for that.
    let mut waits = 0;
    loop {
        match dirfd::rmdir(parent, name) {
            Ok(()) | Err(nix::Error::ENOENT) => return Ok(()),
            Err(nix::Error::ENOTEMPTY)
                if waits < SILLY_RENAME_WAITS && only_silly_renamed_inside(&fd) =>
            {
                waits += 1;
                std::thread::sleep(std::time::Duration::from_millis(100));
            }
            Err(e) => {
                return Err(VolumeDirError::Failed(format!(
                    "cannot remove {}/{name}: {e}",
                    where_.display()
                )));
            }
        }
    }
}

/// How many times (100 ms apart) [`remove_private`] waits for an NFS client's silly-renamed
/// files to go.
const SILLY_RENAME_WAITS: u32 = 30;

/// Whether everything left in `dir` is an NFS client's silly-renamed file (`.nfs` followed by
/// hex digits), and something is.
fn only_silly_renamed_inside(dir: &OwnedFd) -> bool {
    names_in(dir).is_ok_and(|names| !names.is_empty() && names.iter().all(|n| is_silly_renamed(n)))
}

/// Creates the volume directory `<root>/<rel>` for `marker`'s PV; see
/// [`create_volume_dir_as`] (one instance per root: the private name is `.flexvol-new-<pv>`).
pub fn create_volume_dir(
    root: &Root,
    rel: &Path,
    own: Ownership,
    marker: &Marker,
) -> Result<PathBuf, VolumeDirError> {
    create_volume_dir_as(root, rel, own, marker, None)
}

/// Creates the volume directory `<root>/<rel>` for `marker`'s PV, never adopting anything
/// (module doc, "Creating"): missing parents root:root 0755; the directory under the private
/// name `.flexvol-new-<pv>` (`…@<instance>` when several instances share the root, as on NFS)
/// with `own`, the informational marker in it, the record published (first wins), then renamed
/// into place without replacing anything. Idempotent and kill-safe: a later call finds the
/// record and finishes (renames the private directory it names, or sees it in place). An
/// existing directory at the target that is not the one recorded for this PV is an error.
pub(crate) fn create_volume_dir_as(
    root: &Root,
    rel: &Path,
    own: Ownership,
    marker: &Marker,
    instance: Option<&str>,
) -> Result<PathBuf, VolumeDirError> {
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
        let fail = |e: &dyn std::fmt::Display| {
            VolumeDirError::Failed(format!("cannot create {}: {e}", path.display()))
        };
        if let Some(rec) = records.iter().find(|r| r.marker.volume == pv) {
            if !rec.marker.same_volume(marker) || Path::new(&rec.path) != rel {
                return Err(VolumeDirError::NotOurs(format!(
                    "PV {pv} already has a directory, {}, made for claim {}/{} (uid {}); not made again at {}",
                    root.real.join(&rec.path).display(),
                    rec.marker.namespace,
                    rec.marker.claim,
                    rec.marker.claim_uid,
                    path.display()
                )));
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
                match dirfd::rename_noreplace(&parent, &rec.new_name, leaf) {
                    Ok(()) => {
                        let _ = dirfd::sync(&parent);
                    }
                    // A racing instance renamed it first, or something took the name.
                    Err(nix::Error::ENOENT | nix::Error::EEXIST | nix::Error::ENOTEMPTY) => {}
                    Err(e) => return Err(fail(&e)),
                }
                continue;
            }
            // Nothing the record names exists (looked again, in case a racer just renamed it):
            // the record is stale; drop it and start over — unless it names a project, which
            // only a volume that was made and is being deleted has: its delete keeps the record
            // until the project's limit is cleared (a file still open somewhere), and dropping
            // it here would lose that limit. The delete must finish first.
            if let Some(id) = rec.marker.project_id {
                return Err(VolumeDirError::Failed(format!(
                    "{} was made and deleted, and its delete has not finished: project {id}'s limit is still to be cleared (a file of it still open somewhere); the delete's retry, the provisioner's next start or the CSI plugin's sweep finishes it; nothing was made",
                    path.display()
                )));
            }
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
        match dirfd::mkdir(&parent, private.as_str(), 0o700) {
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
            // Ours failing to go is no reason to fail the claim: it holds nothing but our marker
            // or it would be `NotOurs`, and it goes with the next pass or the PV's deletion
            // ([`remove_leftovers`]).
            match remove_private(&parent, &private, &parent_path) {
                Ok(()) | Err(VolumeDirError::Failed(_)) => {}
                Err(e) => return Err(e),
            }
        }
        checkpoint("provisioner-after-record");
    }
    Err(VolumeDirError::Failed(format!(
        "{} did not settle (other instances kept changing it); retrying",
        path.display()
    )))
}

fn squatted(why: &str) -> VolumeDirError {
    VolumeDirError::NotOurs(format!(
        "{why}; flexvol never adopts a directory it did not make for this claim (whoever made it may still have it mounted): move it away, or use a pathPattern with {{{{ .PVName }}}}"
    ))
}

/// Whether the entry `name` in `dir` was last changed more than a minute ago (a leftover of a
/// killed instance, never one still at work).
fn old_entry(dir: &OwnedFd, name: &str) -> bool {
    dirfd::stat_at(dir, name).is_ok_and(|st| {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs();
        u64::try_from(st.st_mtime).is_ok_and(|m| m + 60 < now)
    })
}

/// Writes (or rewrites) the informational marker of `dir` atomically: a temporary file renamed
/// over, then synced. Ownership is decided by the record, never by this file.
pub fn write_marker(dir: &Path, marker: &Marker) -> Result<(), VolumeDirError> {
    let d =
        open_dir(dir).map_err(|e| format!("cannot write the marker in {}: {e}", dir.display()))?;
    write_marker_fd(&d, marker)
        .map_err(|e| e.map(|e| format!("cannot write the marker in {}: {e}", dir.display())))
}

fn write_marker_fd(d: &OwnedFd, marker: &Marker) -> Result<(), VolumeDirError> {
    let fail = |e: &dyn std::fmt::Display| e.to_string();
    let tmp = MARKER_TMP;
    // Whatever is at the temporary name (in a directory the pod writes: a FIFO, a device node, a
    // symlink, a hard link to another file) is unlinked, never opened; a new file is made with
    // O_EXCL, so one planted again meanwhile fails the write instead of being opened.
    match dirfd::unlink(d, tmp) {
        Ok(()) | Err(nix::errno::Errno::ENOENT) => {}
        Err(e) => return Err(fail(&e).into()),
    }
    let fd = dirfd::create_new_file(d, tmp, 0o444).map_err(|e| fail(&e))?;
    let mut f = std::fs::File::from(fd);
    let mut data = serde_json::to_vec(marker).map_err(|e| fail(&e))?;
    data.push(b'\n');
    f.write_all(&data).map_err(|e| fail(&e))?;
    f.sync_all().map_err(|e| fail(&e))?;
    dirfd::rename(d, tmp, d, MARKER).map_err(|e| fail(&e))?;
    dirfd::sync(d).map_err(|e| fail(&e))?;
    Ok(())
}

/// Outcome of [`delete_volume_dir`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Deleted {
    /// Removed now.
    Removed,
    /// Nothing was there (deleted before, by us or by hand).
    AlreadyGone,
}

/// Which root a volume path lies in, and its path relative to that root. `None` when the path is
/// not strictly below one of `roots` through normal components.
pub(crate) fn locate<'a>(roots: &'a [Root], path: &Path) -> Option<(&'a Root, PathBuf)> {
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

/// Gives the old volume at `<root>/<rel>` — a [`MARKER`] and no record, made before records
/// existed — its root-only record, once: only when its marker names PV `volume` and claim uid
/// `claim_uid`, the PV the caller read from the API server and whose own path is this directory
/// (that PV, which only the provisioner and cluster administrators write, is the evidence; the
/// marker only has to agree with it). The marker's project ID is kept only when `project_ok`
/// says the directory really carries it. `Ok(true)`: the record was written now; `Ok(false)`:
/// nothing to adopt (recorded already, missing, or not this PV's). From then on nesting and
/// deletion ([`check_nesting`], [`check_tree`]) see the volume by its record alone.
pub(crate) fn adopt_legacy(
    root: &Root,
    rel: &Path,
    volume: &str,
    claim_uid: &str,
    project_ok: &dyn Fn(u32) -> bool,
) -> Result<bool, VolumeDirError> {
    // The common case, every pass for every volume: recorded already (one small read).
    if read_record(root, volume)?.is_some() {
        return Ok(false);
    }
    let records = read_records(root)?;
    let DirState::Legacy(m) = inspect_with(root, rel, &records) else {
        return Ok(false);
    };
    if m.volume != volume || m.claim_uid != claim_uid {
        return Ok(false);
    }
    let path = root.real.join(rel);
    let dir = open_dir(&path).map_err(|e| format!("{} cannot be opened: {e}", path.display()))?;
    let (dev, ino) =
        dev_ino(&dir).map_err(|e| format!("{} cannot be read: {e}", path.display()))?;
    let rel_s = rel
        .to_str()
        .ok_or_else(|| format!("{} is not UTF-8", path.display()))?;
    let rec = Record {
        marker: Marker {
            project_id: m.project_id.filter(|id| project_ok(*id)),
            ..m
        },
        path: rel_s.to_owned(),
        new_name: format!("{NEW_PREFIX}{volume}"),
        dev,
        ino,
    };
    link_record(root, &rec)
}

/// Whether `state` is the directory of PV `volume` of claim uid `claim_uid` — the one "is this
/// directory ours" check of every delete, archive and resize; `Err` says why not, ending with
/// `left`: [`ProvisionError::NotFound`] when nothing is there, [`ProvisionError::Refused`] when
/// what is there is not this PV's.
pub(crate) fn check_owner(
    state: &DirState,
    path: &Path,
    volume: &str,
    claim_uid: &str,
    left: &str,
) -> Result<(), ProvisionError> {
    let m = match state {
        DirState::Owned(r) => &r.marker,
        DirState::Legacy(m) => m,
        DirState::Missing => {
            return Err(ProvisionError::NotFound(format!(
                "{} does not exist",
                path.display()
            )));
        }
        DirState::Foreign(why) => return Err(ProvisionError::Refused(format!("{why}; {left}"))),
    };
    if m.volume == volume && m.claim_uid == claim_uid {
        Ok(())
    } else {
        Err(ProvisionError::Refused(format!(
            "{} belongs to PV {} (claim uid {}), not to {volume}; {left}",
            path.display(),
            m.volume,
            m.claim_uid
        )))
    }
}

/// Looks at `<root>/<rel>` ([`inspect`]) and checks it is the directory of PV `volume` of claim
/// uid `claim_uid` ([`check_owner`]); returns what it is (`Owned` or `Legacy`). The one
/// "is this directory ours" step before an archive or a resize.
pub(crate) fn check_ours(
    root: &Root,
    rel: &Path,
    volume: &str,
    claim_uid: &str,
    left: &str,
) -> Result<DirState, ProvisionError> {
    let state = inspect(root, rel);
    check_owner(&state, &root.real.join(rel), volume, claim_uid, left)?;
    // An old volume, now shown to be this PV's by the PV the caller read: recorded once, so from
    // now on nesting and deletion see it by its record ([`adopt_legacy`]; the hostPath
    // provisioner's pass does this for every volume, with the project checked; here only a
    // volume without a project is adopted, as NFS volumes are).
    if let DirState::Legacy(m) = &state
        && m.project_id.is_none()
    {
        let _ = adopt_legacy(root, rel, volume, claim_uid, &|_| false);
    }
    Ok(state)
}

/// Deletes the volume directory `<root>/<rel>` of PV `volume` (claim uid `claim_uid`), only if
/// it is recorded as that PV's (or, for an old volume, its marker says so); then its record.
/// Before anything is removed the whole tree is checked ([`check_tree`]: no mount point, no other
/// volume); the removal itself never follows a symlink nor crosses a mount. A directory already
/// gone is not an error.
pub(crate) fn delete_volume_dir(
    root: &Root,
    rel: &Path,
    volume: &str,
    claim_uid: &str,
) -> Result<Deleted, ProvisionError> {
    delete_volume_dir_then(root, rel, volume, claim_uid, &mut || Ok(()))
}

/// [`delete_volume_dir`], calling `before_record` once the directory is gone and before its
/// record goes: what must be undone while the record still names it (its project's limit), so
/// that a kill between the two leaves the record, and the next delete (or the sweep) finishes
/// both. For a directory already gone it is called only when its record is still there. When it
/// fails (the project still holds a file a process has open, a tool failed) the record stays and
/// the delete is an error to retry: the directory is gone, and only the record still says what
/// is left to undo.
pub(crate) fn delete_volume_dir_then(
    root: &Root,
    rel: &Path,
    volume: &str,
    claim_uid: &str,
    before_record: &mut dyn FnMut() -> Result<(), VolumeDirError>,
) -> Result<Deleted, ProvisionError> {
    let pending = |why: VolumeDirError| {
        ProvisionError::Failed(format!(
            "{} is removed, but its record stays until the next try: {why}",
            root.real.join(rel).display()
        ))
    };
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
        // Killed creates' leftovers first: they are charged to the project too.
        remove_leftovers(root, rel, volume);
        if records
            .iter()
            .any(|r| r.marker.volume == volume && Path::new(&r.path) == rel)
        {
            before_record().map_err(pending)?;
            remove_record(root, volume)?;
        }
        return Ok(done);
    }
    check_owner(&state, &path, volume, claim_uid, left)?;
    let fail = |e: &dyn std::fmt::Display| format!("cannot delete {}: {e}", path.display());
    let dir = open_dir(&path).map_err(|e| fail(&e))?;
    check_tree(&dir, &path, volume, &records)
        .map_err(|why| ProvisionError::Refused(format!("{why}; {left}")))?;
    let parent_rel = rel.parent().unwrap_or(Path::new(""));
    let leaf = rel
        .file_name()
        .ok_or_else(|| format!("{} has no name", path.display()))?;
    let parent = open_dir(&root.real.join(parent_rel)).map_err(|e| fail(&e))?;
    let root_fd = open_dir(&root.real).map_err(|e| fail(&e))?;
    dirfd::rename(&parent, leaf, &root_fd, tomb.as_str()).map_err(|e| fail(&e))?;
    // Its inode stays charged to its project while we hold it open.
    drop(dir);
    checkpoint("provisioner-delete-after-rename");
    remove_tombstone(root, &tomb)?;
    remove_leftovers_in(&parent, volume, &root.real.join(parent_rel));
    checkpoint("provisioner-delete-before-record");
    before_record().map_err(pending)?;
    remove_record(root, volume)?;
    Ok(Deleted::Removed)
}

/// Removes the private directories killed creates of PV `volume` (of any instance) left beside
/// its directory `<root>/<rel>`: empty ones, or holding nothing but our marker — never one with
/// anything else in it. Best effort: for when the volume is deleted (or archived), when no create
/// of it can be under way any more.
pub(crate) fn remove_leftovers(root: &Root, rel: &Path, volume: &str) {
    let parent_path = root.real.join(rel.parent().unwrap_or(Path::new("")));
    if let Ok(parent) = open_dir(&parent_path) {
        remove_leftovers_in(&parent, volume, &parent_path);
    }
}

fn remove_leftovers_in(parent: &OwnedFd, volume: &str, parent_path: &Path) {
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
pub(crate) const MAX_DEPTH: usize = 256;

/// `statx` of `name` in `dir` (no symlink followed): whether it is a directory, its device, and
/// whether it is the root of a mount.
/// `None`: it is gone.
type Facts = Option<(bool, (u32, u32), bool)>;

fn entry_facts(dir: &OwnedFd, name: &OsStr) -> Result<Facts, VolumeDirError> {
    dirfd::entry(dir, name)
        .map(|e| e.map(|e| (e.is_dir, e.dev, e.mount_root)))
        .map_err(|e| {
            VolumeDirError::Failed(format!("cannot look at {}: {e}", name.to_string_lossy()))
        })
}

fn top_dev(dir: &OwnedFd) -> Result<(u32, u32), VolumeDirError> {
    dirfd::fs_dev(dir)
        .map_err(|e| VolumeDirError::Failed(format!("cannot look at the directory: {e}")))
}

/// Walks the volume directory `dir` (at `path`) before it is deleted: fails if anything inside
/// is a mount point (statx's mount-root attribute, or another device), or is another volume's
/// directory (its device and inode in another PV's root-only record; a marker file inside the
/// tree is the tenant's and is never read). Never follows a symlink; nothing is changed.
pub(crate) fn check_tree(
    dir: &OwnedFd,
    path: &Path,
    volume: &str,
    records: &[Record],
) -> Result<(), VolumeDirError> {
    let dev = top_dev(dir)?;
    // The device of the tree being deleted, as `Record::names` compares it: the walk never leaves
    // it, so on it the inode decides (an NFS export's device changes with every mount).
    let tree_dev = dev_ino(dir)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?
        .0;
    let others: Vec<&Record> = records
        .iter()
        .filter(|r| r.marker.volume != volume)
        .collect();
    walk_tree(dir, path, dev, 0, &mut |d, p, _top| {
        let id = dev_ino(d).map_err(|e| format!("cannot read {}: {e}", p.display()))?;
        if let Some(r) = others.iter().find(|r| r.names(id, Some(tree_dev))) {
            return Err(VolumeDirError::Occupied(format!(
                "{} holds the directory of PV {} ({}), another volume",
                path.display(),
                r.marker.volume,
                p.display()
            )));
        }
        // A marker file below the top decides nothing: the pod owns it (and could plant one
        // naming any PV to make its own volume undeletable, or a FIFO under that name).
        Ok(())
    })
}

/// The error for a tree deeper than [`MAX_DEPTH`].
fn too_deep(path: &Path) -> VolumeDirError {
    VolumeDirError::Failed(format!(
        "{} is more than {MAX_DEPTH} directories deep; delete it by hand",
        path.display()
    ))
}

/// One entry `name` of the directory `dir` (at `path`, on device `dev`) in a walk: `None` when it
/// is gone meanwhile (a racing instance removes the same tombstone); else its path and, for a
/// directory, its descriptor. A mount point or another device is an error ending with `then`
/// (what to do); a symlink is never followed (it is an entry without a descriptor).
fn walk_entry(
    dir: &OwnedFd,
    path: &Path,
    name: &OsStr,
    dev: (u32, u32),
    then: &str,
) -> Result<Option<(PathBuf, Option<OwnedFd>)>, VolumeDirError> {
    // A walk of a large tree is slow, not stuck: each entry is progress (`sys::progress`).
    crate::sys::progress::beat();
    let p = path.join(name);
    let Some((is_dir, d, mount)) = entry_facts(dir, name)? else {
        return Ok(None);
    };
    let crossing = |p: &Path| {
        VolumeDirError::Occupied(format!(
            "{} is a mount point; flexvol never deletes across a mount: {then}",
            p.display()
        ))
    };
    if mount || d != dev {
        return Err(crossing(&p));
    }
    if !is_dir {
        return Ok(Some((p, None)));
    }
    match open_child_dir(dir, name) {
        Ok(fd) => Ok(Some((p, Some(fd)))),
        Err(nix::Error::ENOENT) => Ok(None),
        Err(nix::Error::EXDEV) => Err(crossing(&p)),
        Err(e) => Err(VolumeDirError::Failed(format!(
            "cannot open {}: {e}",
            p.display()
        ))),
    }
}

/// Calls `visit` on `dir` and every directory below it (depth first), with its path and whether
/// it is the top. Fails on a mount point or another device below, a symlink is never followed.
fn walk_tree(
    dir: &OwnedFd,
    path: &Path,
    dev: (u32, u32),
    depth: usize,
    visit: &mut dyn FnMut(&OwnedFd, &Path, bool) -> Result<(), VolumeDirError>,
) -> Result<(), VolumeDirError> {
    if depth > MAX_DEPTH {
        return Err(too_deep(path));
    }
    visit(dir, path, depth == 0)?;
    let names = names_in(dir).map_err(|e| format!("cannot list {}: {e}", path.display()))?;
    for n in names {
        if let Some((p, Some(child))) = walk_entry(dir, path, &n, dev, "unmount it first")? {
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
) -> Result<(), VolumeDirError> {
    if depth > MAX_DEPTH {
        return Err(too_deep(path));
    }
    let names = names_in(dir).map_err(|e| format!("cannot list {}: {e}", path.display()))?;
    for n in names {
        let then = "unmount it, then delete again";
        let Some((p, child)) = walk_entry(dir, path, &n, dev, then)? else {
            continue;
        };
        match child {
            Some(child) => {
                remove_contents(&child, &p, dev, depth + 1)?;
                dirfd::rmdir(dir, n.as_os_str())
            }
            None => dirfd::unlink(dir, n.as_os_str()),
        }
        .or_else(|e| {
            if e == nix::Error::ENOENT {
                Ok(())
            } else {
                Err(e)
            }
        })
        .map_err(|e| format!("cannot remove {}: {e}", p.display()))?;
    }
    Ok(())
}

/// Fails if anything below the directory `dir` (at `path`) is a mount point or on another device;
/// never follows a symlink, changes nothing. With [`empty_dir`], for `flexvol install --uninstall
/// --purge` (src/ops/uninstall.rs), which checks a whole tree before it removes anything in it.
pub(crate) fn check_no_mounts(dir: &OwnedFd, path: &Path) -> Result<(), VolumeDirError> {
    let dev = top_dev(dir)?;
    walk_tree(dir, path, dev, 0, &mut |_, _, _| Ok(()))
}

/// Empties the directory `dir` (at `path`) as a volume delete does ([`remove_contents`]): every
/// entry unlinked through its directory's descriptor, a symlink unlinked and never followed, a
/// mount point or a device change an error that stops it.
pub(crate) fn empty_dir(dir: &OwnedFd, path: &Path) -> Result<(), VolumeDirError> {
    let dev = top_dev(dir)?;
    remove_contents(dir, path, dev, 0)
}

fn remove_tombstone(root: &Root, tomb: &str) -> Result<(), VolumeDirError> {
    let p = root.real.join(tomb);
    let root_fd =
        open_dir(&root.real).map_err(|e| format!("cannot open {}: {e}", root.real.display()))?;
    let dir = match open_child_dir(&root_fd, OsStr::new(tomb)) {
        Ok(fd) => fd,
        Err(nix::Error::ENOENT) => return Ok(()),
        Err(nix::Error::EXDEV) => {
            return Err(VolumeDirError::Occupied(format!(
                "{} is a mount point; flexvol never deletes across a mount: unmount it first",
                p.display()
            )));
        }
        Err(e) => {
            return Err(VolumeDirError::Failed(format!(
                "cannot open {}: {e}",
                p.display()
            )));
        }
    };
    let dev = top_dev(&dir)?;
    remove_contents(&dir, &p, dev, 0)?;
    drop(dir);
    match dirfd::rmdir(&root_fd, tomb) {
        Ok(()) | Err(nix::Error::ENOENT) => Ok(()),
        Err(e) => Err(VolumeDirError::Failed(format!(
            "cannot remove {}: {e}",
            p.display()
        ))),
    }
}

/// Finishes deletions a kill left half done (tombstones in the roots). `release` is given the
/// volume and project ID of each one's record (root-only: the directory is gone) before the
/// record goes, so the caller clears its limit (a kill between the two calls it again: the
/// caller's release must be safe to repeat). `skip` names volumes not to touch now (one whose
/// delete another thread holds the lock of). Returns what it removed and what it could not.
pub(crate) fn finish_deletes(
    roots: &[Root],
    skip: &dyn Fn(&str) -> bool,
    release: &mut dyn FnMut(&Root, &str, u32) -> Result<(), VolumeDirError>,
) -> (Vec<PathBuf>, Vec<String>) {
    let (mut done, mut errors) = (Vec::new(), Vec::new());
    for r in roots {
        let Ok(dir) = open_dir(&r.real) else {
            continue;
        };
        let Ok(names) = dirfd::list(&dir) else {
            continue;
        };
        // Records whose directory is gone with no tombstone left, that still name a project:
        // a delete whose limit could not be cleared yet (a file still open somewhere), or that
        // was killed before it could. Their limit is released now, then the record goes.
        // One read of the records and one set of names per root: the cost follows the node's
        // own volumes, once. `skip` (which may take the volume's lock) comes last, for the few
        // records that are such leftovers.
        let records = read_records(r).unwrap_or_default();
        let tombstones: std::collections::BTreeSet<&OsStr> = names
            .iter()
            .map(OsString::as_os_str)
            .filter(|n| n.to_str().is_some_and(|n| n.starts_with(TOMBSTONE_PREFIX)))
            .collect();
        for rec in &records {
            let pv = rec.marker.volume.as_str();
            let Some(id) = rec.marker.project_id else {
                continue;
            };
            if tombstones.contains(OsStr::new(&format!("{TOMBSTONE_PREFIX}{pv}")))
                || inspect_with(r, Path::new(&rec.path), &records) != DirState::Missing
                || skip(pv)
            {
                continue;
            }
            match release(r, pv, id) {
                Ok(()) => {
                    let _ = remove_record(r, pv);
                    done.push(r.real.join(&rec.path));
                }
                Err(why) => errors.push(why.to_string()),
            }
        }
        for name in names {
            let Some(n) = name.to_str() else { continue };
            if n.starts_with(TOMBSTONE_PREFIX)
                && !skip(&n[TOMBSTONE_PREFIX.len()..])
                && matches!(dirfd::entry(&dir, &name), Ok(Some(e)) if e.is_dir)
            {
                match remove_tombstone(r, n) {
                    Ok(()) => {
                        // Its record, if the kill came before the record went.
                        let pv = &n[TOMBSTONE_PREFIX.len()..];
                        if let Ok(Some(rec)) = read_record(r, pv)
                            && inspect(r, Path::new(&rec.path)) == DirState::Missing
                        {
                            // The record goes only once its limit did: else it stays for
                            // the next try (the volume's delete, or the next pass).
                            match rec
                                .marker
                                .project_id
                                .map_or(Ok(()), |id| release(r, pv, id))
                            {
                                Ok(()) => {
                                    let _ = remove_record(r, pv);
                                }
                                Err(why) => errors.push(why.to_string()),
                            }
                        }
                        done.push(r.real.join(n));
                    }
                    Err(why) => errors.push(why.to_string()),
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
    fn walk(
        root: &Root,
        records: &[Record],
        dir: &OwnedFd,
        rel: &Path,
        depth: usize,
        out: &mut Vec<Found>,
    ) {
        // By descriptors: a directory swapped for a symlink meanwhile is never followed.
        let Ok(names) = dirfd::list(dir) else {
            return;
        };
        for name in names {
            if !matches!(dirfd::entry(dir, &name), Ok(Some(e)) if e.is_dir) {
                continue; // symlinks and files are not volumes
            }
            if rel.as_os_str().is_empty() && name == STATE_DIR {
                continue;
            }
            let r = rel.join(&name);
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
                _ if depth > 1 => {
                    if let Ok(child) = open_child_dir(dir, name.as_os_str()) {
                        walk(root, records, &child, &r, depth - 1, out);
                    }
                }
                _ => {}
            }
        }
    }
    let mut out = Vec::new();
    for r in roots {
        let records = read_records(r).unwrap_or_default();
        if let Ok(top) = open_dir(&r.real) {
            walk(r, &records, &top, Path::new(""), depth, &mut out);
        }
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

#[cfg(test)]
mod tests;
