//! The hostPath provisioner's filesystem side: volume directories under a node's roots.
//!
//! Safety rules (rule 4 of the house: delete only what we provably created):
//! - Roots come from the node config only, and are used canonical (symlinks in the configured
//!   path itself are resolved once, by the administrator's intent). Everything below a root is
//!   reached with `openat2(RESOLVE_NO_SYMLINKS)`: a symlink anywhere below a root (say one a pod
//!   planted in a directory it can write) makes the operation fail instead of being followed.
//! - A volume directory is `<root>/<relative path>`, the relative path made of normal components
//!   only ([`volume_rel_path`]); nothing else is ever created or removed.
//! - Every volume directory holds an ownership marker, [`MARKER`], naming the PV and the claim it
//!   was made for. It is written before the PV is created. A directory is deleted only when its
//!   marker names the PV being deleted and that PV's claim.
//! - Deletion first renames the directory to `<root>/.flexvol-deleting-<pv>` (one atomic step that
//!   commits it), then removes that recursively (std's `remove_dir_all` never follows symlinks, it
//!   unlinks them). A kill -9 in between leaves only the tombstone, which [`finish_deletes`]
//!   removes on the next pass.
//!
//! - Sizes: where the root's filesystem enforces project quotas, [`HostPathBackend`] gives each new
//!   directory a project quota of the claim's size and raises it on a resize ([`super::quota`]);
//!   the project ID is recorded in the marker before the quota is set up. Elsewhere the PV says
//!   `flexvol/size-enforced: "false"` and why.
//!
//! Caller contract: one provisioner per node works on a root at a time (the DaemonSet runs one);
//! nothing here takes a lock.

use super::backend::{Backend, Provisioned, Refusal, Request};
use crate::node::config::Config;
use crate::sys::paths::{self, Ownership};
use crate::sys::process::checkpoint;
use k8s_openapi::api::core::v1::PersistentVolume;
use nix::fcntl::{OFlag, OpenHow, ResolveFlag, openat2, renameat};
use nix::sys::stat::Mode;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::ffi::OsString;
use std::io::Write;
use std::os::fd::OwnedFd;
use std::path::{Component, Path, PathBuf};

/// The ownership marker's file name inside a volume directory.
pub const MARKER: &str = ".flexvol-provisioned";
/// The temporary the marker is written to before it is renamed into place.
pub const MARKER_TMP_HOSTPATH: &str = ".flexvol-provisioned.tmp";
/// Prefix of a committed deletion in a root.
pub const TOMBSTONE_PREFIX: &str = ".flexvol-deleting-";

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
    /// Whether `self` and `other` name the same volume (everything but the project ID, which
    /// the quota step adds later).
    pub fn same_volume(&self, other: &Marker) -> bool {
        Marker {
            project_id: None,
            ..self.clone()
        } == Marker {
            project_id: None,
            ..other.clone()
        }
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
                    let id: u32 = v.parse().map_err(|_| {
                        format!(
                            "class parameter {k}={v:?} is not a numeric id; use e.g. {k}: \"1000\""
                        )
                    })?;
                    if k == "uid" {
                        p.ownership.uid = Some(id);
                    } else {
                        p.ownership.gid = Some(id);
                    }
                }
                "mode" => {
                    let m = u32::from_str_radix(v.trim_start_matches("0o"), 8)
                        .ok()
                        .filter(|m| *m <= 0o7777)
                        .ok_or_else(|| {
                            format!("class parameter mode={v:?} is not an octal mode; use e.g. mode: \"0770\"")
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
        if part.starts_with(TOMBSTONE_PREFIX) || part == MARKER {
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
    /// A directory with this marker.
    Marked(Marker),
    /// An empty directory (a kill between `mkdir` and the marker leaves this).
    Empty,
    /// Anything else: not ours, never touched.
    Foreign(String),
}

fn open_dir(path: &Path) -> nix::Result<OwnedFd> {
    let how = OpenHow::new()
        .flags(OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC | OFlag::O_NOFOLLOW)
        .resolve(ResolveFlag::RESOLVE_NO_SYMLINKS);
    openat2(nix::fcntl::AT_FDCWD, path, how)
}

fn read_marker(dir: &OwnedFd) -> Result<Option<Marker>, String> {
    let how = OpenHow::new()
        .flags(OFlag::O_RDONLY | OFlag::O_CLOEXEC | OFlag::O_NOFOLLOW)
        .resolve(ResolveFlag::RESOLVE_NO_SYMLINKS | ResolveFlag::RESOLVE_BENEATH);
    let fd = match openat2(dir, MARKER, how) {
        Ok(fd) => fd,
        Err(nix::Error::ENOENT) => return Ok(None),
        Err(e) => return Err(format!("its marker {MARKER} cannot be opened: {e}")),
    };
    let mut data = Vec::new();
    use std::io::Read;
    std::fs::File::from(fd)
        .take(64 * 1024)
        .read_to_end(&mut data)
        .map_err(|e| format!("its marker {MARKER} cannot be read: {e}"))?;
    serde_json::from_slice(&data)
        .map(Some)
        .map_err(|e| format!("its marker {MARKER} is not flexvol's: {e}"))
}

/// Looks at `<root>/<rel>` without following symlinks.
pub fn inspect(root: &Root, rel: &Path) -> DirState {
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
    match read_marker(&dir) {
        Ok(Some(m)) => DirState::Marked(m),
        // Empty, or holding only the marker's temporary (a kill between writing it and the
        // rename that publishes it): ours to finish, since the next write truncates it.
        Ok(None) => match std::fs::read_dir(&path).map(|d| {
            d.flatten()
                .all(|e| e.file_name().to_str() == Some(MARKER_TMP_HOSTPATH))
        }) {
            Ok(true) => DirState::Empty,
            Ok(false) => DirState::Foreign(format!(
                "{} exists, is not empty and has no flexvol marker",
                path.display()
            )),
            Err(e) => DirState::Foreign(format!("{} cannot be listed: {e}", path.display())),
        },
        Err(why) => DirState::Foreign(format!("{}: {why}", path.display())),
    }
}

/// Creates `<root>/<rel>` (and missing parents), applies `own` to what it creates, and writes the
/// marker (atomically: a temporary file renamed over). Idempotent: an existing directory with the
/// same marker, or empty, is taken; anything else is an error and is left alone.
pub fn create_volume_dir(
    root: &Root,
    rel: &Path,
    own: Ownership,
    marker: &Marker,
) -> Result<PathBuf, String> {
    let path = root.real.join(rel);
    match inspect(root, rel) {
        DirState::Marked(m) if m.same_volume(marker) => return Ok(path),
        DirState::Marked(m) => {
            return Err(format!(
                "{} already exists and belongs to PV {} (claim {}/{}); delete that PV or the directory, or use a pathPattern with {{{{ .PVName }}}}",
                path.display(),
                m.volume,
                m.namespace,
                m.claim
            ));
        }
        DirState::Foreign(why) => {
            return Err(format!(
                "{why}; flexvol will not use it: move it away or pick another pathPattern"
            ));
        }
        DirState::Missing => {
            let missing: Vec<OsString> = rel.iter().map(OsString::from).collect();
            paths::create_dirs(&root.real, &missing, own)
                .map_err(|e| format!("cannot create {}: {e}", path.display()))?;
        }
        DirState::Empty => {}
    }
    write_marker(&path, marker)?;
    Ok(path)
}

/// Writes (or rewrites) the marker of `dir` atomically: a temporary file renamed over, then
/// synced. Used for the first marker and to record a project ID in it.
pub fn write_marker(dir: &Path, marker: &Marker) -> Result<(), String> {
    let fail =
        |e: &dyn std::fmt::Display| format!("cannot write the marker in {}: {e}", dir.display());
    let d = open_dir(dir).map_err(|e| fail(&e))?;
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
    let fd = openat2(&d, tmp, how).map_err(|e| fail(&e))?;
    let mut f = std::fs::File::from(fd);
    let mut data = serde_json::to_vec(marker).map_err(|e| fail(&e))?;
    data.push(b'\n');
    f.write_all(&data).map_err(|e| fail(&e))?;
    f.sync_all().map_err(|e| fail(&e))?;
    renameat(&d, tmp, &d, MARKER).map_err(|e| fail(&e))?;
    nix::unistd::fsync(&d).map_err(|e| fail(&e))?;
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

/// Deletes the volume directory `<root>/<rel>` of PV `volume` (claim uid `claim_uid`), only if
/// its marker says so. Never follows a symlink; a directory already gone is not an error.
pub fn delete_volume_dir(
    root: &Root,
    rel: &Path,
    volume: &str,
    claim_uid: &str,
) -> Result<Deleted, String> {
    let path = root.real.join(rel);
    let tomb = format!("{TOMBSTONE_PREFIX}{volume}");
    match inspect(root, rel) {
        DirState::Missing => {
            // A deletion killed after its rename left the tombstone: finish it.
            return if root.real.join(&tomb).exists() {
                remove_tombstone(root, &tomb).map(|()| Deleted::Removed)
            } else {
                Ok(Deleted::AlreadyGone)
            };
        }
        DirState::Marked(m) if m.volume == volume && m.claim_uid == claim_uid => {}
        DirState::Marked(m) => {
            return Err(format!(
                "{} belongs to PV {} (claim uid {}), not to {volume}; it was left alone: delete it by hand if it is not needed, then remove the PV",
                path.display(),
                m.volume,
                m.claim_uid
            ));
        }
        DirState::Empty => {
            return Err(format!(
                "{} has no flexvol marker, so it may not be ours; it was left alone: delete it by hand if it is not needed, then remove the PV",
                path.display()
            ));
        }
        DirState::Foreign(why) => {
            return Err(format!(
                "{why}; it was left alone: delete it by hand if it is not needed, then remove the PV"
            ));
        }
    }
    let parent_rel = rel.parent().unwrap_or(Path::new(""));
    let leaf = rel
        .file_name()
        .ok_or_else(|| format!("{} has no name", path.display()))?;
    let fail = |e: &dyn std::fmt::Display| format!("cannot delete {}: {e}", path.display());
    let parent = open_dir(&root.real.join(parent_rel)).map_err(|e| fail(&e))?;
    let root_fd = open_dir(&root.real).map_err(|e| fail(&e))?;
    renameat(&parent, leaf, &root_fd, tomb.as_str()).map_err(|e| fail(&e))?;
    checkpoint("provisioner-delete-after-rename");
    remove_tombstone(root, &tomb)?;
    Ok(Deleted::Removed)
}

fn remove_tombstone(root: &Root, tomb: &str) -> Result<(), String> {
    let p = root.real.join(tomb);
    match std::fs::remove_dir_all(&p) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
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
                    Ok(()) => done.push(r.real.join(n)),
                    Err(why) => errors.push(why),
                }
            }
        }
    }
    (done, errors)
}

/// A volume directory found on disk, with its marker (for `status` and `gc`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Found {
    /// Where it is.
    pub path: PathBuf,
    /// What its marker says.
    pub marker: Marker,
}

/// Lists the marked volume directories under `roots`, up to `depth` levels below each (patterns
/// may nest directories). Never follows symlinks.
pub fn scan(roots: &[Root], depth: usize) -> Vec<Found> {
    fn walk(root: &Root, rel: &Path, depth: usize, out: &mut Vec<Found>) {
        let Ok(entries) = std::fs::read_dir(root.real.join(rel)) else {
            return;
        };
        for e in entries.flatten() {
            if !e.file_type().is_ok_and(|t| t.is_dir()) {
                continue; // symlinks report as symlinks here, not directories
            }
            let r = rel.join(e.file_name());
            match inspect(root, &r) {
                DirState::Marked(marker) => out.push(Found {
                    path: root.real.join(&r),
                    marker,
                }),
                _ if depth > 1 => walk(root, &r, depth - 1, out),
                _ => {}
            }
        }
    }
    let mut out = Vec::new();
    for r in roots {
        walk(r, Path::new(""), depth, &mut out);
    }
    out.sort_by(|a, b| a.path.cmp(&b.path));
    out
}

/// The hostPath kind of volume: a marked directory under one of the node's roots
/// ([`super::localpath`]), served by the hostpath driver.
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
            .find(|r| matches!(inspect(r, &rel), DirState::Marked(m) if m.volume == req.pv_name))
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
        Ok(Provisioned {
            options: BTreeMap::from([
                ("path".to_owned(), location.clone()),
                ("type".to_owned(), "Directory".to_owned()),
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
        let project = match inspect(&root, &rel) {
            DirState::Marked(m) if m.volume == name => m.project_id,
            _ => None,
        };
        match delete_volume_dir(&root, &rel, &name, &claim_uid_of(pv))? {
            Deleted::Removed => {
                let runner = crate::sys::exec::SystemRunner::new(cfg.tool_dirs.clone());
                Ok(format!(
                    "removed {}{}",
                    path.display(),
                    super::quota::release(&runner, &root, project)
                ))
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
            (m(&[("nodePath", "/x")]), "unknown class parameter"),
            (m(&[("pathPattern", "../x")]), "pathPattern"),
        ] {
            let e = ClassParams::parse(&bad).unwrap_err();
            assert!(e.contains(want), "{bad:?}: {e}");
        }
    }

    #[test]
    fn a_marker_temporary_left_by_a_kill_does_not_make_the_directory_foreign() {
        let (_d, r) = root();
        let dir = r.real.join("v");
        std::fs::create_dir(&dir).unwrap();
        std::fs::write(dir.join(MARKER_TMP_HOSTPATH), b"{\"half").unwrap();
        assert_eq!(inspect(&r, Path::new("v")), DirState::Empty);
        let m = marker("pv", "u");
        create_volume_dir(&r, Path::new("v"), Ownership::default(), &m).unwrap();
        assert!(matches!(inspect(&r, Path::new("v")), DirState::Marked(x) if x.volume == "pv"));
        assert!(!dir.join(MARKER_TMP_HOSTPATH).exists());
    }

    #[test]
    fn create_is_idempotent_and_marks_the_directory() {
        let (_d, r) = root();
        let rel = default_rel_path("pvc-1", "ns", "c");
        let own = Ownership {
            uid: Some(1234),
            gid: Some(5678),
            mode: Some(0o2770),
        };
        let p = create_volume_dir(&r, &rel, own, &marker("pvc-1", "u1")).unwrap();
        assert_eq!(p, r.real.join("pvc-1_ns_c"));
        let md = std::fs::metadata(&p).unwrap();
        assert_eq!((md.uid(), md.gid()), (1234, 5678));
        assert_eq!(md.permissions().mode() & 0o7777, 0o2770);
        assert_eq!(inspect(&r, &rel), DirState::Marked(marker("pvc-1", "u1")));
        // Again: same answer, nothing changes.
        std::fs::write(p.join("data"), b"x").unwrap();
        assert_eq!(
            create_volume_dir(&r, &rel, own, &marker("pvc-1", "u1")).unwrap(),
            p
        );
        assert!(p.join("data").exists());
        // Another PV's marker, or foreign data: refused, left alone.
        let e = create_volume_dir(&r, &rel, own, &marker("pvc-2", "u2")).unwrap_err();
        assert!(e.contains("belongs to PV pvc-1"), "{e}");
        std::fs::create_dir(r.real.join("foreign")).unwrap();
        std::fs::write(r.real.join("foreign/f"), b"x").unwrap();
        let e =
            create_volume_dir(&r, Path::new("foreign"), own, &marker("pvc-3", "u3")).unwrap_err();
        assert!(e.contains("no flexvol marker"), "{e}");
        assert!(!r.real.join("foreign").join(MARKER).exists());
        // Empty (a kill between mkdir and marker): adopted.
        std::fs::create_dir(r.real.join("empty")).unwrap();
        create_volume_dir(&r, Path::new("empty"), own, &marker("pvc-4", "u4")).unwrap();
        assert!(r.real.join("empty").join(MARKER).exists());
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
            1,
            "no tombstone left"
        );
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
        assert_eq!(std::fs::read_dir(&r.real).unwrap().count(), 0);
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
        let f = scan(std::slice::from_ref(&r), 3);
        assert_eq!(
            f.iter()
                .map(|f| f.marker.volume.as_str())
                .collect::<Vec<_>>(),
            vec!["pvc-1", "pvc-2"]
        );
    }

    #[test]
    fn free_space_is_read() {
        let (_d, r) = root();
        assert!(free_bytes(&r.real).is_some());
        assert!(free_bytes(Path::new("/nonexistent/x")).is_none());
    }
}
