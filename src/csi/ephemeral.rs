//! CSI inline ephemeral volumes of the hostPath plugin: one scratch directory per pod volume,
//! made from a preset of the node config (`hostpath.ephemeral`: a root and a size), its size
//! enforced by a project quota, removed when kubelet unpublishes it (docs/csi.md, "Inline
//! ephemeral volumes").
//!
//! Who reaches it: anyone who may create a pod on a node whose hostPath CSIDriver lists
//! `Ephemeral` — Pod Security `restricted` allows inline CSI volumes. What they control: the
//! volume's attributes and its name in the pod. What holds:
//! - the attributes name a preset (`preset`) and nothing else: no path, size, owner or mode; any
//!   other key is INVALID_ARGUMENT ([`request`]), and no value is echoed;
//! - the directory is `<preset root>/<volume id>`. The volume id must be the one kubelet gives
//!   this very volume (`csi-` and the sha256 of the pod's uid and the volume's name, both read
//!   from the target path `<kubelet-root>/pods/<uid>/volumes/kubernetes.io~csi/<name>/mount`,
//!   checked by `node::target_path`), so a PV author's volume handle names no pod's volume; and
//!   kubelet's pod info (`podInfoOnMount`, which kubelet writes over anything the pod author
//!   set) must name the same uid and a namespace;
//! - the directory is made, recorded and deleted by the marked-directory library
//!   (`provision::storage::volumedir`): a root-only record names the pod (namespace, name, uid)
//!   and the directory's inode; only that inode is ever deleted, after a walk that refuses any
//!   mount point inside, never following a symlink;
//! - the bind is the hostPath backend's own publish, with a capability token this plugin signs
//!   for the volume id, the pod's namespace and the directory: every preset root is a
//!   provisioning root of the node policy, so no other volume (an inline flexVolume, a static PV,
//!   another pod) can name anything in it, and the token never leaves this process;
//! - the size is a project quota chosen under the node-wide lock of the project IDs, set up only
//!   while no pod has the directory (no mount record uses it): `xfs_quota` walks a tree by path,
//!   never one a pod holds; where the root's filesystem cannot enforce it the volume is refused
//!   (and the directory this call made removed) unless the preset says `allowUnenforced`. What
//!   the quota cannot stop — a pod's process changing the project of files it owns — is in
//!   docs/security.md;
//! - unpublish removes the directory only when its record names the target path's pod and no
//!   other mount record of this node uses it ([`unpublish`]); a directory that cannot be removed
//!   then never fails the unpublish (the pod would stay Terminating): [`sweep`] tries again, and
//!   removes those whose pod's directory kubelet has removed (a publish that failed after the
//!   directory was made, a plugin that was down while kubelet cleaned up) — the pod directory's
//!   absence is the evidence; deletions a kill interrupted are finished, their project limits
//!   cleared from the root-only record.
//!
//! Callers' contract: `node` calls [`request`] before anything else for a publish whose context
//! says `csi.storage.k8s.io/ephemeral: "true"`, then [`publish`] on a blocking thread under the
//! verb deadline; [`unpublish`] for every hostPath unpublish; `csi::start` runs
//! [`sweep`] on its own thread.

use crate::backend::hostpath::policy::EphemeralPreset;
use crate::backend::{Backend, Context, hostpath};
use crate::error::{Error, Result};
use crate::node::capability::{Key, Location, OPTION, node_key_path};
use crate::node::config::Config;
use crate::node::state::StateStore;
use crate::protocol::options::{Options, keys};
use crate::protocol::reply::Reply;
use crate::provision::storage::quota::{self, IdScope, Outcome};
use crate::provision::storage::volumedir::{self, DirState, Marker, Root};
use crate::sys::lock::VolumeLock;
use crate::sys::paths::Ownership;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use tonic::Status;

/// The one attribute an inline ephemeral volume may carry: the preset's name.
pub(crate) const PRESET: &str = "preset";
/// Set by kubelet to `"true"` for an inline ephemeral volume.
pub(crate) const EPHEMERAL: &str = "csi.storage.k8s.io/ephemeral";
/// kubelet's prefix for what it adds to a CSI volume context.
pub(crate) const CSI_PREFIX: &str = "csi.storage.k8s.io/";
/// The pod info kubelet adds with `podInfoOnMount`.
pub(crate) const POD_UID: &str = "csi.storage.k8s.io/pod.uid";
pub(crate) const POD_NAMESPACE: &str = "csi.storage.k8s.io/pod.namespace";
pub(crate) const POD_NAME: &str = "csi.storage.k8s.io/pod.name";
/// A scratch directory's mode, as kubelet makes an emptyDir: the pod's user, whoever it is, may
/// write (the directory is the pod's alone).
const MODE: u32 = 0o777;

/// Whether a publish's context is an inline ephemeral volume's (kubelet's own key).
pub(crate) fn is_ephemeral(context: &HashMap<String, String>) -> bool {
    context.get(EPHEMERAL).is_some_and(|v| v == "true")
}

/// An inline ephemeral volume's publish, checked ([`request`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Ephemeral {
    /// kubelet's volume id, `csi-<64 hex>`: the directory's name and the record's.
    pub(crate) volume_id: String,
    /// The preset the pod named (not yet checked against the node config: [`publish`] does).
    pub(crate) preset: String,
    /// The pod: its uid (the target path's, which kubelet's pod info agrees with), namespace
    /// and name.
    pub(crate) pod_uid: String,
    pub(crate) namespace: String,
    pub(crate) pod_name: String,
}

/// Whether `id` has the shape of kubelet's volume id for an inline volume: `csi-` and the 64
/// lowercase hex digits of a sha256.
pub(crate) fn is_kubelet_volume_id(id: &str) -> bool {
    id.strip_prefix("csi-")
        .is_some_and(|h| h.len() == 64 && h.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')))
}

/// The volume id kubelet gives the inline volume `name` of pod `uid` (kubelet's
/// `makeVolumeHandle`: `csi-` and the hex sha256 of the uid followed by the name).
pub(crate) fn kubelet_volume_id(uid: &str, name: &str) -> String {
    let d = ring::digest::digest(&ring::digest::SHA256, format!("{uid}{name}").as_bytes());
    let mut s = String::with_capacity(68);
    s.push_str("csi-");
    for b in d.as_ref() {
        s.push_str(&format!("{b:02x}"));
    }
    s
}

/// Whether `volume_id` is the one kubelet gives the inline volume whose target path is `target`
/// (`.../pods/<uid>/volumes/kubernetes.io~csi/<name>/mount`): a PV author, who chooses a PV's
/// volume handle, cannot name another pod's inline volume with it.
pub(crate) fn is_volume_id_of(volume_id: &str, target: &Path) -> bool {
    let name = target
        .parent()
        .and_then(Path::file_name)
        .and_then(|n| n.to_str());
    match (pod_uid_of_target(target), name) {
        (Some(uid), Some(name)) => volume_id == kubelet_volume_id(uid, name),
        _ => false,
    }
}

/// The pod uid component of a target path of CSI's shape
/// (`<kubelet-root>/pods/<uid>/volumes/kubernetes.io~csi/<name>/mount`, already checked).
pub(crate) fn pod_uid_of_target(target: &Path) -> Option<&str> {
    target.ancestors().nth(4)?.file_name()?.to_str()
}

/// Checks an inline ephemeral publish (module doc): only `preset` besides kubelet's keys,
/// kubelet's volume id, kubelet's pod info naming the target path's pod. Errors never echo a
/// value.
pub(crate) fn request(
    target: &Path,
    volume_id: &str,
    context: &HashMap<String, String>,
) -> std::result::Result<Ephemeral, Status> {
    // The first such key by name, so the message is the same on every retry.
    if let Some(k) = context
        .keys()
        .filter(|k| k.as_str() != PRESET && !k.starts_with(CSI_PREFIX))
        .min()
    {
        return Err(Status::invalid_argument(format!(
            "volume attribute {:?} is not accepted for an inline ephemeral volume: only \"{PRESET}\" is (the name of a preset in the node's hostpath.ephemeral config), which fixes the directory, its size and its mode",
            crate::protocol::options::bounded(k)
        )));
    }
    let preset = context.get(PRESET).filter(|p| !p.is_empty()).ok_or_else(|| {
        Status::invalid_argument(format!(
            "an inline ephemeral volume needs the volume attribute \"{PRESET}\": the name of a preset in the node's hostpath.ephemeral config"
        ))
    })?;
    let uid = pod_uid_of_target(target)
        .ok_or_else(|| Status::invalid_argument("the target path names no pod"))?;
    if !is_volume_id_of(volume_id, target) {
        return Err(Status::invalid_argument(
            "the volume id is not the one kubelet gives this pod's inline volume (csi- and the sha256 of the pod's uid and the volume's name); refused",
        ));
    }
    let info = |k: &str| context.get(k).filter(|v| !v.is_empty());
    let (Some(ctx_uid), Some(namespace), Some(name)) =
        (info(POD_UID), info(POD_NAMESPACE), info(POD_NAME))
    else {
        return Err(Status::failed_precondition(
            "kubelet passed no pod info: the CSIDriver of this plugin must have podInfoOnMount: true (the shipped one does)",
        ));
    };
    if ctx_uid != uid {
        return Err(Status::invalid_argument(
            "kubelet's pod info names another pod than the target path; refused",
        ));
    }
    Ok(Ephemeral {
        volume_id: volume_id.to_owned(),
        preset: preset.clone(),
        pod_uid: uid.to_owned(),
        namespace: namespace.clone(),
        pod_name: name.clone(),
    })
}

/// The lock of one ephemeral volume (its directory's make and delete), waiting up to `wait`.
fn lock_for(config: &Config, volume_id: &str, wait: std::time::Duration) -> Result<VolumeLock> {
    Ok(VolumeLock::acquire(
        &config.lock_dir(),
        &format!("ephemeral:{volume_id}"),
        wait,
    )?)
}

/// [`lock_for`] with the node config's lock wait, never past the call's deadline.
fn lock(ctx: &Context, volume_id: &str) -> Result<VolumeLock> {
    lock_for(
        ctx.config,
        volume_id,
        ctx.deadline.cap(ctx.config.lock_timeout()),
    )
}

/// The usable roots of every preset (missing ones made when `create`).
fn roots(config: &Config, create: bool) -> Vec<Root> {
    volumedir::usable_roots(&config.hostpath.ephemeral_roots(), create).0
}

/// Makes (or finds) the volume's directory under its preset, enforces the preset's size, and
/// binds it onto `target` through the hostPath backend with a token for this pod's namespace.
/// `fs_group`: the pod's fsGroup when kubelet passed one (VOLUME_MOUNT_GROUP); `read_only`: the
/// access asked for. Idempotent: a retry finds the recorded directory and the bind.
pub(crate) fn publish(
    ctx: &Context,
    node: &str,
    e: &Ephemeral,
    target: &Path,
    fs_group: Option<u32>,
    read_only: bool,
) -> Result<Reply> {
    let config = ctx.config;
    let Some(preset) = config.hostpath.ephemeral.get(&e.preset) else {
        let names: Vec<&str> = config
            .hostpath
            .ephemeral
            .keys()
            .map(String::as_str)
            .collect();
        return Err(Error::refused(format!(
            "the preset the volume names ({} bytes) is not in this node's hostpath.ephemeral config, which has: {}; name one of those, or ask the node operator to add it",
            e.preset.len(),
            if names.is_empty() {
                "no presets".to_owned()
            } else {
                names.join(", ")
            }
        )));
    };
    let _held = lock(ctx, &e.volume_id)?;
    let root = volumedir::prepare_root(&preset.root)
        .map_err(|why| Error::refused(format!("preset {}: {why}", e.preset)))?;
    let rel = PathBuf::from(&e.volume_id);
    let made_now = match volumedir::inspect(&root, &rel) {
        DirState::Missing => true,
        DirState::Owned(rec) if rec.marker.claim_uid == e.pod_uid => false,
        DirState::Owned(_) | DirState::Legacy(_) => {
            return Err(Error::occupied(format!(
                "{} belongs to another pod; refused",
                root.real.join(&rel).display()
            )));
        }
        DirState::Foreign(why) => return Err(Error::occupied(why)),
    };
    let marker = Marker {
        provisioner: made_by(ctx, &e.preset),
        volume: e.volume_id.clone(),
        namespace: e.namespace.clone(),
        claim: e.pod_name.clone(),
        claim_uid: e.pod_uid.clone(),
        node: node.to_owned(),
        project_id: None,
    };
    let own = Ownership {
        uid: Some(0),
        gid: Some(0),
        mode: Some(MODE),
    };
    // A new volume is admitted (its namespace's count, the root's room) and made under the
    // preset's lock, so that two publishes cannot both take the last place.
    let admitted = if made_now {
        Some(admit(ctx, e, preset, &root, &marker)?)
    } else {
        None
    };
    let dir = volumedir::create_volume_dir(&root, &rel, own, &marker)
        .map_err(|why| Error::refused(why.to_string()))?;
    drop(admitted);
    crate::sys::process::checkpoint("ephemeral-after-directory");
    // The size is set up only on a directory no pod has had yet: one this call made, or one no
    // mount record uses (the mount is recorded before the bind). `xfs_quota project -s` walks
    // the tree by path, which must never be a tree a pod holds and can rearrange. A retry of a
    // published volume (kubelet's restart) keeps what its first publish set.
    if made_now || users(config, &dir)?.is_empty() {
        let size =
            quota::enforce_volume(ctx.runner, &root, &rel, preset.size, &IdScope::of(config))
                .map_err(|why| Error::refused(format!("{why}; kubelet retries")))?;
        if let Outcome::NotEnforced(why) = &size
            && !preset.allow_unenforced
        {
            // Only what this call made is undone (empty: no pod has had it).
            let undo = if made_now {
                match volumedir::delete_volume_dir(&root, &rel, &e.volume_id, &e.pod_uid) {
                    Ok(_) => String::new(),
                    Err(d) => format!(" (and removing its new directory failed: {d})"),
                }
            } else {
                String::new()
            };
            return Err(Error::refused(format!(
                "preset {} promises a size of {} bytes, which cannot be enforced under {}: {why}; the node operator can give the preset a root on a filesystem with project quotas, or set allowUnenforced{undo}",
                e.preset,
                preset.size,
                root.real.display()
            )));
        }
    }
    let location = dir.display().to_string();
    let key = Key::load_or_create(&node_key_path(&config.state_dir))
        .map_err(|k| Error::refused(k.to_string()))?;
    let token = key.sign_for(&e.volume_id, &e.namespace, &Location::HostPath(&location));
    let mut map = serde_json::Map::new();
    for (k, v) in [
        ("path", location.as_str()),
        ("type", "Directory"),
        (keys::PV_OR_VOLUME_NAME, e.volume_id.as_str()),
        (OPTION, token.as_str()),
        (keys::POD_UID, e.pod_uid.as_str()),
        (keys::POD_NAMESPACE, e.namespace.as_str()),
        (keys::POD_NAME, e.pod_name.as_str()),
        (keys::READWRITE, if read_only { "ro" } else { "rw" }),
    ] {
        map.insert(k.to_owned(), v.into());
    }
    if let Some(gid) = fs_group {
        map.insert(keys::FS_GROUP.to_owned(), gid.to_string().into());
    }
    let options = Options::parse(&serde_json::Value::Object(map).to_string())?;
    // A publish whose caller has given up (DEADLINE_EXCEEDED) binds nothing: kubelet may be
    // unpublishing this target by now, and a bind made after that would be left behind.
    if ctx.deadline.expired() {
        return Err(Error::refused(format!(
            "the publish of {} ran past its deadline before the bind; kubelet retries",
            e.volume_id
        )));
    }
    hostpath::publish(ctx, target, &options)
}

/// The hostPath plugin's NodeUnpublishVolume: the backend's unmount of `target`, then
/// [`release`] of the inline ephemeral volume `volume_id` it may be — both under that volume's
/// lock when the id is kubelet's for this target, so that a publish of it still running (its
/// caller gone past the deadline) finishes before, or binds nothing after: never a bind the
/// unpublish missed. Returns the backend's reply, and what became of the directory.
pub(crate) fn unpublish(
    ctx: &Context,
    volume_id: &str,
    target: &Path,
) -> Result<(Reply, Option<String>)> {
    if !is_kubelet_volume_id(volume_id) || !is_volume_id_of(volume_id, target) {
        return Ok((hostpath::unpublish(ctx, target)?, None));
    }
    let held = lock(ctx, volume_id)?;
    let reply = hostpath::unpublish(ctx, target)?;
    Ok((reply, release_locked(ctx, volume_id, target, &held)))
}

/// What the records of a preset's volumes name as their maker: the plugin and the preset.
fn made_by(ctx: &Context, preset: &str) -> String {
    format!("{} (ephemeral preset {preset})", ctx.driver_name)
}

/// Admits a new volume of preset `e.preset` (`marker`: its record to be): the root must have room
/// for the preset's size now, and the pod's namespace fewer of the preset's volumes on this node
/// than `maxPerNamespace`. Inline volumes are counted by no ResourceQuota; without this, one
/// namespace could take a root that every namespace shares. Returns the preset's lock, held by
/// the caller until the volume's record exists. What is counted are the root-only records of
/// this node (a volume being removed still counts until its record goes).
fn admit(
    ctx: &Context,
    e: &Ephemeral,
    preset: &EphemeralPreset,
    root: &Root,
    marker: &Marker,
) -> Result<VolumeLock> {
    let config = ctx.config;
    let held = VolumeLock::acquire(
        &config.lock_dir(),
        &format!("ephemeral-preset:{}", e.preset),
        ctx.deadline.cap(config.lock_timeout()),
    )?;
    let st = nix::sys::statvfs::statvfs(&root.real)
        .map_err(|errno| Error::io("read the free space of", &root.real, errno.into()))?;
    let free = st.blocks_available().saturating_mul(st.fragment_size());
    if free < preset.size {
        return Err(Error::exhausted(format!(
            "preset {}: {} has {free} bytes free, less than the preset's size of {} bytes; kubelet retries, and the node operator can free space there or give the preset a larger filesystem",
            e.preset,
            root.real.display(),
            preset.size
        )));
    }
    if let Some(max) = preset.max_per_namespace {
        let records =
            volumedir::read_records(root).map_err(|why| Error::refused(why.to_string()))?;
        let held_now = records
            .iter()
            // Its own record is not counted: a retry after a kill left it (made, not yet in
            // place; or deleted, its limit still to clear).
            .filter(|r| {
                r.marker.provisioner == marker.provisioner
                    && r.marker.namespace == marker.namespace
                    && r.marker.node == marker.node
                    && r.marker.volume != marker.volume
            })
            .count();
        if u32::try_from(held_now).unwrap_or(u32::MAX) >= max {
            return Err(Error::exhausted(format!(
                "namespace {} has {held_now} volumes of preset {} on this node, its most (maxPerNamespace {max}); kubelet retries, and a place is freed when a pod of the namespace that has one ends",
                e.namespace, e.preset
            )));
        }
    }
    Ok(held)
}

/// After the backend unpublished `target`: removes the inline ephemeral volume `volume_id`'s
/// directory, when the id is kubelet's for that target's volume, a preset root records it for
/// the target path's pod, and no mount record of this node uses it. Anything else (a persistent
/// volume, one removed already, another pod's record) is left alone. Returns what was done, or
/// why the directory stays: the volume is unmounted by then, so a directory that cannot be
/// removed (a mount inside it, a tree too deep for the removal walk) never fails the unpublish —
/// that would keep the pod Terminating for ever — it stays for [`sweep`] to try again once
/// kubelet has removed the pod's directory, and the log says why.
fn release_locked(
    ctx: &Context,
    volume_id: &str,
    target: &Path,
    _held: &VolumeLock,
) -> Option<String> {
    if !is_kubelet_volume_id(volume_id) || !is_volume_id_of(volume_id, target) {
        return None;
    }
    let uid = pod_uid_of_target(target)?;
    let stays = |why: &dyn std::fmt::Display| {
        Some(format!(
            "its directory stays, for the sweep to remove once the pod is gone: {why}"
        ))
    };
    for root in roots(ctx.config, false) {
        let rec = match volumedir::read_record(&root, volume_id) {
            Ok(Some(rec)) => rec,
            Ok(None) => continue,
            Err(why) => return stays(&why),
        };
        if rec.marker.claim_uid != uid {
            return None;
        }
        return match remove(ctx, &root, volume_id, uid, None) {
            Ok(done) => Some(done),
            Err(why) => stays(&why),
        };
    }
    None
}

/// The targets of this node's mount records whose source is `dir`, inside it or above it.
fn users(config: &Config, dir: &Path) -> Result<Vec<PathBuf>> {
    let store = StateStore::new(&config.state_dir, Backend::HostPath.name());
    let mut out = Vec::new();
    for (_, rec) in store.list() {
        let rec = rec?;
        let source = Path::new(&rec.source);
        if source.starts_with(dir) || dir.starts_with(source) {
            out.push(rec.target);
        }
    }
    Ok(out)
}

/// Removes ephemeral volume `volume_id` of pod `uid` from `root` (its record says so), unless a
/// mount record of this node still uses its directory; then clears its project limit.
/// `gone_pod`: the pod's directory, when the caller saw it gone — a mount record whose target
/// was below it and no longer exists is a mount that ended with the pod (a node reboot, a plugin
/// killed before kubelet's cleanup): it is forgotten instead of counted.
fn remove(
    ctx: &Context,
    root: &Root,
    volume_id: &str,
    uid: &str,
    gone_pod: Option<&Path>,
) -> Result<String> {
    let rel = PathBuf::from(volume_id);
    let dir = root.real.join(&rel);
    let store = StateStore::new(&ctx.config.state_dir, Backend::HostPath.name());
    for target in users(ctx.config, &dir)? {
        let ended = gone_pod.is_some_and(|pod| {
            target.starts_with(pod)
                && matches!(
                    nix::sys::stat::lstat(&target),
                    Err(nix::errno::Errno::ENOENT)
                )
        });
        if !ended {
            return Err(Error::refused(format!(
                "{} is still mounted at {}; it is removed once that is unmounted",
                dir.display(),
                target.display()
            )));
        }
        store.remove(&target)?;
    }
    let project = quota::project_of_volume(ctx.runner, root, &rel, volume_id);
    // The limit is released once the directory is gone and before its record goes (also when
    // the directory was gone already: a delete killed after it went, whose record still names
    // the limit), so that a kill between them leaves the record for the next try.
    // A limit that cannot be cleared yet (a file of the volume still open in some process)
    // keeps the record, and the unpublish's or the sweep's next try finishes.
    let mut released = String::new();
    let deleted = volumedir::delete_volume_dir_then(root, &rel, volume_id, uid, &mut || {
        released = match &project {
            Ok(id) => quota::release(ctx.runner, root, *id, volume_id, &IdScope::of(ctx.config))?,
            Err(why) => format!("; no project limit cleared: {why}"),
        };
        Ok(())
    })
    .map_err(|why| Error::refused(why.to_string()))?;
    Ok(match deleted {
        volumedir::Deleted::Removed => format!("removed {}{released}", dir.display()),
        volumedir::Deleted::AlreadyGone => {
            format!("{} was gone already{released}", dir.display())
        }
    })
}

/// Removes the ephemeral volumes whose pod is gone: a record of this node (`node`) in a preset
/// root whose pod directory `<kubelet_root>/pods/<uid>` does not exist (kubelet removes it only after every
/// volume of the pod was unmounted), and finishes deletions a kill interrupted. Returns one line
/// per volume removed or left with an error.
pub(crate) fn sweep(ctx: &Context, node: &str, kubelet_root: &Path) -> Vec<String> {
    // The pod directories are the evidence, so without kubelet's `pods` directory (a DaemonSet
    // that does not mount the kubelet root where it says) nothing is judged. Mount records name
    // targets under the canonical kubelet root.
    let kubelet_root = match std::fs::canonicalize(kubelet_root) {
        Ok(k) if k.join("pods").is_dir() => k,
        _ => {
            return vec![format!(
                "not swept: {} has no pods directory here (is the kubelet root mounted into the plugin's container at that path?)",
                kubelet_root.display()
            )];
        }
    };
    let roots = roots(ctx.config, false);
    let ids = IdScope::of(ctx.config);
    // Deletions a kill interrupted, each under its volume's lock: one another thread holds (an
    // unpublish deleting it now) is left to that thread.
    let held = std::cell::RefCell::new(Vec::new());
    let busy = |volume: &str| match lock_for(ctx.config, volume, std::time::Duration::ZERO) {
        Ok(l) => {
            held.borrow_mut().push(l);
            false
        }
        Err(_) => true,
    };
    let mut out = volumedir::finish_deletes(&roots, &busy, &mut |root, volume, id| {
        quota::release_later(ctx.runner, root, Some(id), volume, &ids)
            .map(drop)
            .map_err(Into::into)
    })
    .1;
    drop(held);
    for root in &roots {
        let records = match volumedir::read_records(root) {
            Ok(r) => r,
            Err(why) => {
                out.push(format!("{}: {why}", root.real.display()));
                continue;
            }
        };
        for rec in records {
            let (id, uid) = (&rec.marker.volume, &rec.marker.claim_uid);
            let one_name = !uid.is_empty() && !uid.contains('/') && uid != "." && uid != "..";
            // Another node's record (a preset root on shared storage): its pods are not in
            // this kubelet's directory, and their absence here proves nothing.
            if !is_kubelet_volume_id(id) || !one_name || rec.marker.node != node {
                continue;
            }
            let pod_dir = kubelet_root.join("pods").join(uid);
            let gone = || {
                matches!(
                    nix::sys::stat::lstat(&pod_dir),
                    Err(nix::errno::Errno::ENOENT)
                )
            };
            if !gone() {
                continue;
            }
            // Looked at again under the volume's lock: a publish of a new pod holds it.
            if ctx.deadline.expired() {
                out.push("the pass ran out of time; the next one goes on".to_owned());
                return out;
            }
            let done = lock(ctx, id).and_then(|_held| {
                if gone() {
                    remove(ctx, root, id, uid, Some(&pod_dir)).map(Some)
                } else {
                    Ok(None)
                }
            });
            match done {
                Ok(Some(what)) => out.push(format!("pod {uid} is gone: {what}")),
                Ok(None) => {}
                Err(why) => out.push(format!("pod {uid} is gone, its volume {id} stays: {why}")),
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: &str = "/var/lib/kubelet/pods/u1/volumes/kubernetes.io~csi/scratch/mount";

    fn id() -> String {
        kubelet_volume_id("u1", "scratch")
    }

    fn ctx(extra: &[(&str, &str)]) -> HashMap<String, String> {
        let mut m: HashMap<String, String> = [
            (PRESET, "scratch"),
            (EPHEMERAL, "true"),
            (POD_UID, "u1"),
            (POD_NAMESPACE, "team-a"),
            (POD_NAME, "p"),
        ]
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
        for (k, v) in extra {
            m.insert((*k).to_owned(), (*v).to_owned());
        }
        m
    }

    /// kubelet 1.20's `makeVolumeHandle("pod-uid-1", "scratch")`, computed apart with
    /// `printf pod-uid-1scratch | sha256sum`.
    const KUBELET_ID: &str = "csi-c5699e390261e9e6987cb40a451a4e699b550c7b5f2b6574fc12407e6f10fb2f";

    #[test]
    fn the_volume_id_is_kubelets_hash() {
        assert_eq!(kubelet_volume_id("pod-uid-1", "scratch"), KUBELET_ID);
    }

    #[test]
    fn kubelet_volume_ids_only() {
        assert!(is_kubelet_volume_id(&id()));
        for bad in [
            String::new(),
            "csi-".into(),
            format!("csi-{}", "ab".repeat(31)),
            format!("csi-{}", "AB".repeat(32)),
            format!("csi-{}g", "ab".repeat(31)),
            format!("csx-{}", "ab".repeat(32)),
            format!("csi-{}/..", "ab".repeat(32)),
            "pvc-1".into(),
        ] {
            assert!(!is_kubelet_volume_id(&bad), "{bad}");
        }
    }

    #[test]
    fn the_pod_is_the_target_paths_and_the_attributes_name_a_preset_only() {
        let t = Path::new(T);
        assert_eq!(pod_uid_of_target(t), Some("u1"));
        let e = request(
            t,
            &id(),
            &ctx(&[("csi.storage.k8s.io/serviceAccount.tokens", "tok")]),
        )
        .unwrap();
        assert_eq!(
            (e.preset.as_str(), e.pod_uid.as_str(), e.namespace.as_str()),
            ("scratch", "u1", "team-a")
        );
        for (c, code) in [
            (
                ctx(&[("path", "/etc-s3cr3t")]),
                tonic::Code::InvalidArgument,
            ),
            (ctx(&[("type", "Directory")]), tonic::Code::InvalidArgument),
            (ctx(&[(PRESET, "")]), tonic::Code::InvalidArgument),
            (ctx(&[(POD_UID, "u2")]), tonic::Code::InvalidArgument),
            (ctx(&[(POD_NAMESPACE, "")]), tonic::Code::FailedPrecondition),
        ] {
            let s = request(t, &id(), &c).unwrap_err();
            assert_eq!(s.code(), code, "{c:?}: {s:?}");
            assert!(!s.message().contains("s3cr3t"), "{}", s.message());
        }
        let mut no_preset = ctx(&[]);
        no_preset.remove(PRESET);
        assert_eq!(
            request(t, &id(), &no_preset).unwrap_err().code(),
            tonic::Code::InvalidArgument
        );
        for other in [
            "vol-1".to_owned(),
            format!("csi-{}", "ab".repeat(32)),
            kubelet_volume_id("u1", "other"),
            kubelet_volume_id("u2", "scratch"),
        ] {
            assert_eq!(
                request(t, &other, &ctx(&[])).unwrap_err().code(),
                tonic::Code::InvalidArgument,
                "{other}"
            );
        }
    }
}
