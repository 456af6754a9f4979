//! The CSI Node service: NodeGetInfo, NodeGetCapabilities, NodePublishVolume and
//! NodeUnpublishVolume of hostPath, NFS or LVM volumes (`--kind`); for LVM also NodeStageVolume,
//! NodeUnstageVolume and NodeExpandVolume; NodeGetVolumeStats for hostPath and LVM (a statfs of
//! a dead server's NFS mount would block). A call a kind does not serve answers UNIMPLEMENTED and
//! is not advertised; any other Node method too (the generated router answers it).
//!
//! Publish and unpublish are the FlexVolume `mount` and `unmount` verbs of the kind's backend
//! ([`hostpath::publish`], [`nfs::publish`], [`lvm::csi`] and their unpublish); LVM's stage,
//! unstage and expand are its `waitforattach` + `mountdevice`, `unmountdevice` and `expandfs`
//! ([`lvm::csi`]). The request is turned into that backend's options and its code does the work,
//! under the same node config, locks and state records. What is CSI's own is checked here first,
//! on hostile input:
//! - the target path must be `<kubelet-root>/pods/<uid>/volumes/kubernetes.io~csi/<name>/mount`
//!   under the kubelet root this plugin was started with ([`target_path`]), a staging path
//!   `<kubelet-root>/plugins/kubernetes.io/csi/{pv/<pv>,<driver>/<hash>}/globalmount`
//!   ([`staging_path`]);
//! - the volume context becomes the options: a key of kubelet's own namespace (`kubernetes.io/…`)
//!   is refused (only kubelet may say who the pod is), the pod identity kubelet adds with
//!   `podInfoOnMount` (`csi.storage.k8s.io/pod.*`) is renamed to the FlexVolume keys, every other
//!   `csi.storage.k8s.io/…` key is dropped (the service account tokens among them are secrets),
//!   and an inline ephemeral volume (`csi.storage.k8s.io/ephemeral: "true"`, whose attributes the
//!   pod's author writes) is refused ([`options_for`]);
//! - the PV's name (FlexVolume's `pvOrVolumeName`, which the capability checks of provisioned
//!   volumes need) is never taken from the request's attributes: it is the target path's
//!   `<name>` when kubelet's pod info says the volume is persistent ([`pv_of_target`]), or the
//!   staging path's `<pv>` on kubelets before 1.25 ([`pv_of_staging`]), else none;
//! - an LVM volume id is `<vg>/<lv>` and names the LV; a context that names another is refused,
//!   and the filesystem type is the capability's ([`lvm_options`]); NodeExpandVolume acts on the
//!   LV the staging path's root-only record names, never on one the request names;
//! - `secrets` are never read, logged or passed on;
//! - the pod's fsGroup (`volume_mount_group`, which kubelet 1.22+ sends because the hostPath and
//!   NFS plugins advertise VOLUME_MOUNT_GROUP) is taken only as a decimal group id and becomes the
//!   FlexVolume fsGroup option, which the backend applies to a provisioned volume only
//!   ([`mount_group`], [`node_capabilities`]); LVM neither advertises nor reads it.
//!
//! The backend's blocking work runs on a blocking thread under the node config's verb timeout
//! (DEADLINE_EXCEEDED when it expires; the volume's lock keeps a late finish from racing a retry,
//! and an inline ephemeral volume's publish binds nothing past its deadline).

use super::proto::*;
use super::settings::{Kind, LOG_TARGET, Settings, status_of};
use crate::backend::lvm::{self, LvmOptions, options::key as lvm_key};
use crate::backend::{self, hostpath, nfs};
use crate::node::config::Config;
use crate::protocol::options::{Options, keys};
use crate::sys::process::Deadline;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tonic::{Request, Response, Status};

/// The server code build.rs writes (tonic-build); its one `as` is tonic's `Code as i32`.
#[allow(clippy::as_conversions)]
mod generated {
    include!(concat!(env!("OUT_DIR"), "/csi.v1.Node.rs"));
}
pub(crate) use generated::node_server;

/// The Node service over the plugin's [`Settings`].
pub(crate) struct NodeService {
    pub(crate) settings: Arc<Settings>,
}

/// The volume context keys kubelet adds with `podInfoOnMount`, and the FlexVolume keys the
/// hostPath backend reads them as.
const POD_INFO: &[(&str, &str)] = &[
    (POD_NAME, keys::POD_NAME),
    (POD_NAMESPACE, keys::POD_NAMESPACE),
    (POD_UID, keys::POD_UID),
    (
        "csi.storage.k8s.io/serviceAccount.name",
        keys::SERVICE_ACCOUNT,
    ),
];
use super::ephemeral::{self, CSI_PREFIX, EPHEMERAL, POD_NAME, POD_NAMESPACE, POD_UID};
/// How long a call may take beyond the node config's verb timeout before it is answered
/// DEADLINE_EXCEEDED (the backend checks the deadline itself where it waits).
const GRACE: std::time::Duration = std::time::Duration::from_secs(2);

/// Checks a target (or volume) path from a request against the CSI shape under `kubelet_root`:
/// absolute, no `.` or `..`, exactly `<kubelet_root>/pods/<uid>/volumes/kubernetes.io~csi/<name>/mount`
/// (component by component, no symlink resolved: the backend opens it without following any).
pub(crate) fn target_path(kubelet_root: &Path, given: &str, what: &str) -> Result<PathBuf, Status> {
    let bad = |why: &str| {
        Status::invalid_argument(format!(
            "{what} {:?} {why}; flexvol csi only acts on {}/pods/<pod-uid>/volumes/kubernetes.io~csi/<volume>/mount",
            bounded(given),
            kubelet_root.display()
        ))
    };
    if given.is_empty() {
        return Err(Status::invalid_argument(format!("{what} is required")));
    }
    let below = below_root(kubelet_root, given).map_err(&bad)?;
    let c: Vec<&std::ffi::OsStr> = below.iter().collect();
    let shape = c.len() == 6
        && c[0] == "pods"
        && c[2] == "volumes"
        && c[3] == "kubernetes.io~csi"
        && c[5] == "mount";
    if !shape {
        return Err(bad("is not a CSI target path"));
    }
    Ok(PathBuf::from(given))
}

/// The part of `given` below `kubelet_root`, checked by bytes (`Path::components` would drop a
/// `.` in the middle and a trailing `/`): absolute, no `.`, `..` or empty component, under the
/// root. The error says which rule it broke.
fn below_root<'a>(kubelet_root: &Path, given: &'a str) -> Result<&'a Path, &'static str> {
    let mut parts = given.split('/');
    let absolute = parts.next() == Some("");
    if !absolute || parts.any(|c| c.is_empty() || c == "." || c == "..") {
        return Err("must be an absolute path without \".\", \"..\" or empty components");
    }
    Path::new(given)
        .strip_prefix(kubelet_root)
        .map_err(|_| "is outside the kubelet directory")
}

/// The options of a hostPath or NFS publish request: the volume context (module doc: what is
/// refused, renamed and dropped), the access (`readonly`, or a reader-only access mode) and the
/// PV's name when [`pv_of_target`] knows it. Errors never echo a value.
pub(crate) fn options_for(
    r: &NodePublishVolumeRequest,
    pv: Option<&str>,
) -> Result<Options, Status> {
    let mut map = context_options(&r.volume_context)?;
    if let Some(pv) = pv {
        map.insert(keys::PV_OR_VOLUME_NAME.to_owned(), pv.into());
    }
    if let Some(gid) = mount_group(r.volume_capability.as_ref())? {
        map.insert(keys::FS_GROUP.to_owned(), gid.to_string().into());
    }
    let rw = if r.readonly || reader_only(r.volume_capability.as_ref()) {
        "ro"
    } else {
        "rw"
    };
    map.insert(keys::READWRITE.to_owned(), rw.into());
    let json = serde_json::Value::Object(map).to_string();
    Options::parse(&json).map_err(|e| Status::invalid_argument(e.to_string()))
}

/// The pod's fsGroup as kubelet passes it to a plugin with VOLUME_MOUNT_GROUP
/// (`MountVolume.volume_mount_group`, the decimal group id), for the FlexVolume fsGroup option
/// the backends read: they apply it only to a provisioned volume its PV's token proves, mounted
/// read-write (hostPath's and NFS's `mount`), exactly as for a FlexVolume PV. Anything but
/// decimal digits of a `u32` (a sign, spaces, a name, an overflow) is INVALID_ARGUMENT, and the
/// error does not echo it. Empty: none.
fn mount_group(cap: Option<&VolumeCapability>) -> Result<Option<u32>, Status> {
    let Some(group) = cap
        .and_then(|c| c.mount.as_ref())
        .map(|m| m.volume_mount_group.as_str())
        .filter(|g| !g.is_empty())
    else {
        return Ok(None);
    };
    let digits = group.len() <= 10 && group.bytes().all(|b| b.is_ascii_digit());
    match group.parse::<u32>() {
        Ok(gid) if digits => Ok(Some(gid)),
        _ => Err(Status::invalid_argument(format!(
            "volume_capability.mount.volume_mount_group ({} bytes) is not a numeric group id; kubelet passes the pod's fsGroup there as a decimal number",
            group.len()
        ))),
    }
}

/// A volume context as FlexVolume options (module doc: what is refused, renamed and dropped).
/// Errors never echo a value.
fn context_options(
    context: &HashMap<String, String>,
) -> Result<serde_json::Map<String, serde_json::Value>, Status> {
    if ephemeral::is_ephemeral(context) {
        return Err(Status::invalid_argument(
            "inline ephemeral CSI volumes are served only by the hostPath plugin, from the node's presets (volume attribute \"preset\"): the attributes of other volumes (a host path, an export, an LV) would be written by the pod's author; use a PersistentVolume",
        ));
    }
    let mut map = serde_json::Map::new();
    for (k, v) in context {
        if k.starts_with("kubernetes.io/") {
            return Err(Status::invalid_argument(format!(
                "volume context key {k:?} is refused: keys under kubernetes.io/ are kubelet's own"
            )));
        }
        if let Some((_, flex)) = POD_INFO.iter().find(|(csi, _)| csi == k) {
            map.insert((*flex).to_owned(), v.clone().into());
        } else if !k.starts_with(CSI_PREFIX) {
            map.insert(k.clone(), v.clone().into());
        }
    }
    Ok(map)
}

/// Checks a staging path from a request against the shapes kubelet uses under `kubelet_root`:
/// `<kubelet_root>/plugins/kubernetes.io/csi/pv/<pv>/globalmount` (kubelet before 1.25) or
/// `<kubelet_root>/plugins/kubernetes.io/csi/<driver_name>/<hash>/globalmount` (later ones),
/// component by component as [`target_path`] does, no symlink resolved.
pub(crate) fn staging_path(
    kubelet_root: &Path,
    driver_name: &str,
    given: &str,
) -> Result<PathBuf, Status> {
    let bad = |why: &str| {
        Status::invalid_argument(format!(
            "staging_target_path {:?} {why}; flexvol csi only stages at {}/plugins/kubernetes.io/csi/{{pv/<pv>,{driver_name}/<hash>}}/globalmount",
            bounded(given),
            kubelet_root.display()
        ))
    };
    if given.is_empty() {
        return Err(Status::invalid_argument(
            "staging_target_path is required (this plugin stages volumes: STAGE_UNSTAGE_VOLUME)",
        ));
    }
    let below = below_root(kubelet_root, given).map_err(&bad)?;
    let c: Vec<&std::ffi::OsStr> = below.iter().collect();
    let shape = c.len() == 6
        && c[0] == "plugins"
        && c[1] == "kubernetes.io"
        && c[2] == "csi"
        && (c[3] == "pv" || c[3] == driver_name)
        && c[5] == "globalmount";
    if !shape {
        return Err(bad("is not a CSI staging path"));
    }
    Ok(PathBuf::from(given))
}

/// The PV a publish is for: the `<name>` of its target path
/// (`.../volumes/kubernetes.io~csi/<name>/mount`, checked by [`target_path`]), which kubelet
/// names after the PV for a persistent volume and after the pod's volume for an inline one. So
/// it is the PV's name only when kubelet's pod info says the volume is persistent
/// (`csi.storage.k8s.io/ephemeral: "false"`, which kubelet writes over any value from the volume
/// attributes when the CSIDriver has `podInfoOnMount: true`); otherwise `None`, and a volume
/// flexvol provisioner made is refused (fail closed).
pub(crate) fn pv_of_target(target: &Path, context: &HashMap<String, String>) -> Option<String> {
    if context.get(EPHEMERAL).map(String::as_str) != Some("false") {
        return None;
    }
    let name = target.parent()?.file_name()?.to_str()?;
    Some(name.to_owned())
}

/// The PV a stage is for: the `<pv>` of a staging path of kubelets before 1.25
/// (`.../plugins/kubernetes.io/csi/pv/<pv>/globalmount`, checked by [`staging_path`]; only a
/// persistent volume is staged); `None` for the later shape, which holds a hash of the volume
/// handle instead.
pub(crate) fn pv_of_staging(staging: &Path) -> Option<String> {
    let pv_dir = staging.parent()?;
    if pv_dir.parent()?.file_name()? != "pv" {
        return None;
    }
    Some(pv_dir.file_name()?.to_str()?.to_owned())
}

/// The LVM options of a stage or publish request: the volume context as [`context_options`]
/// takes it, the LV from the volume id (`<vg>/<lv>`; a context's `volumegroup`/`volumeID` must
/// agree with it), the filesystem type from the capability's `fs_type` (the PV's `csi.fsType`).
/// `read_only` is the access the call asks for, `pv` the PV's name when known
/// ([`pv_of_target`], [`pv_of_staging`]).
pub(crate) fn lvm_options(
    volume_id: &str,
    context: &HashMap<String, String>,
    cap: &VolumeCapability,
    read_only: bool,
    pv: Option<&str>,
) -> Result<LvmOptions, Status> {
    let Some((vg, lv)) = volume_id.split_once('/') else {
        return Err(Status::invalid_argument(
            "an LVM volume id is <volume group>/<logical volume> (the PV's volumeHandle, e.g. vg0/data)",
        ));
    };
    for (key, want) in [(lvm_key::VOLUME_GROUP, vg), (lvm_key::VOLUME_ID, lv)] {
        if context.get(key).is_some_and(|v| v != want) {
            return Err(Status::invalid_argument(format!(
                "volume attribute {key} does not match the volume id; leave it out (the volume id <vg>/<lv> names the LV)"
            )));
        }
    }
    let mut map = context_options(context)?;
    if let Some(pv) = pv {
        map.insert(keys::PV_OR_VOLUME_NAME.to_owned(), pv.into());
    }
    map.insert(lvm_key::VOLUME_GROUP.to_owned(), vg.into());
    map.insert(lvm_key::VOLUME_ID.to_owned(), lv.into());
    if let Some(m) = &cap.mount {
        map.insert(keys::FS_TYPE.to_owned(), m.fs_type.clone().into());
    }
    map.insert(
        keys::READWRITE.to_owned(),
        if read_only { "ro" } else { "rw" }.into(),
    );
    let json = serde_json::Value::Object(map).to_string();
    let o = Options::parse(&json).map_err(|e| Status::invalid_argument(e.to_string()))?;
    LvmOptions::parse(&o).map_err(|e| Status::invalid_argument(e.to_string()))
}

/// Whether a capability's access mode only reads (SINGLE_NODE_READER_ONLY, MULTI_NODE_READER_ONLY).
fn reader_only(cap: Option<&VolumeCapability>) -> bool {
    cap.and_then(|c| c.access_mode.as_ref())
        .is_some_and(|m| matches!(m.mode, 2 | 3))
}

/// A mount capability without mount flags, or INVALID_ARGUMENT saying why.
fn check_mount_capability(kind: Kind, cap: Option<&VolumeCapability>) -> Result<(), Status> {
    let Some(cap) = cap else {
        return Err(Status::invalid_argument("volume_capability is required"));
    };
    if cap.block.is_some() || cap.mount.is_none() {
        return Err(Status::invalid_argument(format!(
            "{} volumes are served as mounts only: volume_capability must be a mount, not a block device",
            kind.name()
        )));
    }
    if cap
        .mount
        .as_ref()
        .is_some_and(|m| !m.mount_flags.is_empty())
    {
        return Err(Status::invalid_argument(match kind {
            Kind::Hostpath => {
                "mount_flags are not supported for hostPath volumes (a bind mount takes none; readOnly is the volume's readOnly)"
            }
            Kind::Nfs => {
                "mount_flags (the PV's mountOptions) are not used for NFS volumes: give them as the volume attribute mountOptions, which the node's nfs policy checks"
            }
            Kind::Lvm => {
                "mount_flags (the PV's mountOptions) are not used for LVM volumes: give them as the volume attribute mountOptions, which is checked against an allow-list"
            }
        }));
    }
    Ok(())
}

/// UNIMPLEMENTED for a stage call to a kind that is not staged (not advertised: kubelet never
/// calls it).
fn not_staged(kind: Kind, method: &str) -> Status {
    Status::unimplemented(format!(
        "{method} is not served for {} volumes: they are published directly (no STAGE_UNSTAGE_VOLUME)",
        kind.name()
    ))
}

/// Runs `f` with a context over the node's real seams on a blocking thread, under the node
/// config's verb timeout.
async fn on_node<T: Send + 'static>(
    settings: &Settings,
    method: &str,
    f: impl FnOnce(&backend::Context) -> crate::error::Result<T> + Send + 'static,
) -> Result<T, Status> {
    let config = Config::load().map_err(|e| Status::failed_precondition(e.to_string()))?;
    let limit = config.verb_timeout();
    let name = settings.driver_name.clone();
    // Registered until the thread ends, not until the call answers: a thread that outlives its
    // deadline by far is stuck, and Probe says so (`health`).
    let running = super::health::WORK.start(format!("a {method} call"), limit);
    let work = tokio::task::spawn_blocking(move || {
        let _beats = running.attach();
        backend::on_node(&config, Deadline::after(limit), &name, |ctx| f(ctx))
    });
    match tokio::time::timeout(limit + GRACE, work).await {
        Ok(Ok(Ok(v))) => Ok(v),
        Ok(Ok(Err(e))) => Err(status_of(&e)),
        Ok(Err(e)) => Err(Status::internal(format!("the call's thread failed: {e}"))),
        Err(_) => Err(Status::deadline_exceeded(format!(
            "not done within the node config's verb timeout ({} s); retry",
            limit.as_secs()
        ))),
    }
}

pub(crate) use crate::protocol::options::bounded;

/// Logs the outcome of a call that changed or looked at a volume: the method, the volume id and
/// path (never a context value or a secret), and the code and message on failure.
fn logged<T>(method: &str, volume_id: &str, path: &str, r: Result<T, Status>) -> Result<T, Status> {
    let (volume_id, path) = (bounded(volume_id), bounded(path));
    match &r {
        Ok(_) => {
            tracing::info!(target: LOG_TARGET, "{method} volume {volume_id:?} at {path:?}: OK")
        }
        Err(s) => tracing::warn!(target: LOG_TARGET,
            "{method} volume {volume_id:?} at {path:?}: {:?}: {}", s.code(), s.message()),
    }
    r
}

#[tonic::async_trait]
impl node_server::Node for NodeService {
    async fn node_publish_volume(
        &self,
        request: Request<NodePublishVolumeRequest>,
    ) -> Result<Response<NodePublishVolumeResponse>, Status> {
        let r = request.into_inner();
        let out = async {
            if r.volume_id.is_empty() {
                return Err(Status::invalid_argument("volume_id is required"));
            }
            let target = target_path(&self.settings.kubelet_root, &r.target_path, "target_path")?;
            let kind = self.settings.kind;
            check_mount_capability(kind, r.volume_capability.as_ref())?;
            match kind {
                Kind::Lvm => {
                    let staging = staging_path(
                        &self.settings.kubelet_root,
                        &self.settings.driver_name,
                        &r.staging_target_path,
                    )?;
                    let cap = r.volume_capability.clone().unwrap_or_default();
                    let read_only = r.readonly || reader_only(Some(&cap));
                    let pv = pv_of_target(&target, &r.volume_context);
                    let o = lvm_options(
                        &r.volume_id,
                        &r.volume_context,
                        &cap,
                        read_only,
                        pv.as_deref(),
                    )?;
                    on_node(&self.settings, "NodePublishVolume", move |ctx| {
                        lvm::csi::publish(ctx, &lvm::Seams::SYSTEM, &staging, &target, &o)
                    })
                    .await?;
                }
                Kind::Hostpath if ephemeral::is_ephemeral(&r.volume_context) => {
                    let e = ephemeral::request(&target, &r.volume_id, &r.volume_context)?;
                    let gid = mount_group(r.volume_capability.as_ref())?;
                    let ro = r.readonly || reader_only(r.volume_capability.as_ref());
                    let node = self.settings.node_name.clone();
                    on_node(&self.settings, "NodePublishVolume", move |ctx| {
                        ephemeral::publish(ctx, &node, &e, &target, gid, ro)
                    })
                    .await?;
                }
                Kind::Hostpath => {
                    let pv = pv_of_target(&target, &r.volume_context);
                    let options = options_for(&r, pv.as_deref())?;
                    on_node(&self.settings, "NodePublishVolume", move |ctx| {
                        hostpath::publish(ctx, &target, &options)
                    })
                    .await?;
                }
                Kind::Nfs => {
                    let pv = pv_of_target(&target, &r.volume_context);
                    let options = options_for(&r, pv.as_deref())?;
                    on_node(&self.settings, "NodePublishVolume", move |ctx| {
                        nfs::publish(ctx, &nfs::probe::TcpProber, &target, &options)
                    })
                    .await?;
                }
            }
            Ok(Response::new(NodePublishVolumeResponse {}))
        }
        .await;
        logged("NodePublishVolume", &r.volume_id, &r.target_path, out)
    }

    async fn node_unpublish_volume(
        &self,
        request: Request<NodeUnpublishVolumeRequest>,
    ) -> Result<Response<NodeUnpublishVolumeResponse>, Status> {
        let r = request.into_inner();
        let out = async {
            if r.volume_id.is_empty() {
                return Err(Status::invalid_argument("volume_id is required"));
            }
            let target = target_path(&self.settings.kubelet_root, &r.target_path, "target_path")?;
            let kind = self.settings.kind;
            let volume_id = r.volume_id.clone();
            on_node(&self.settings, "NodeUnpublishVolume", move |ctx| match kind {
                Kind::Hostpath => {
                    let (reply, done) = ephemeral::unpublish(ctx, &volume_id, &target)?;
                    if let Some(done) = done {
                        tracing::info!(target: LOG_TARGET, "inline ephemeral volume {volume_id:?}: {done}");
                    }
                    Ok(reply)
                }
                Kind::Nfs => nfs::unpublish(ctx, &nfs::probe::TcpProber, &target),
                Kind::Lvm => lvm::csi::unpublish(ctx, &target),
            })
            .await?;
            Ok(Response::new(NodeUnpublishVolumeResponse {}))
        }
        .await;
        logged("NodeUnpublishVolume", &r.volume_id, &r.target_path, out)
    }

    async fn node_stage_volume(
        &self,
        request: Request<NodeStageVolumeRequest>,
    ) -> Result<Response<NodeStageVolumeResponse>, Status> {
        let r = request.into_inner();
        let s = &self.settings;
        let out = async {
            let kind = s.kind;
            if kind != Kind::Lvm {
                return Err(not_staged(kind, "NodeStageVolume"));
            }
            if r.volume_id.is_empty() {
                return Err(Status::invalid_argument("volume_id is required"));
            }
            let staging = staging_path(&s.kubelet_root, &s.driver_name, &r.staging_target_path)?;
            check_mount_capability(kind, r.volume_capability.as_ref())?;
            let cap = r.volume_capability.clone().unwrap_or_default();
            let read_only = reader_only(Some(&cap));
            let pv = pv_of_staging(&staging);
            let o = lvm_options(
                &r.volume_id,
                &r.volume_context,
                &cap,
                read_only,
                pv.as_deref(),
            )?;
            on_node(s, "NodeStageVolume", move |ctx| {
                lvm::csi::stage(ctx, &lvm::Seams::SYSTEM, &staging, &o)
            })
            .await?;
            Ok(Response::new(NodeStageVolumeResponse {}))
        }
        .await;
        logged("NodeStageVolume", &r.volume_id, &r.staging_target_path, out)
    }

    async fn node_unstage_volume(
        &self,
        request: Request<NodeUnstageVolumeRequest>,
    ) -> Result<Response<NodeUnstageVolumeResponse>, Status> {
        let r = request.into_inner();
        let s = &self.settings;
        let out = async {
            if s.kind != Kind::Lvm {
                return Err(not_staged(s.kind, "NodeUnstageVolume"));
            }
            if r.volume_id.is_empty() {
                return Err(Status::invalid_argument("volume_id is required"));
            }
            let staging = staging_path(&s.kubelet_root, &s.driver_name, &r.staging_target_path)?;
            on_node(s, "NodeUnstageVolume", move |ctx| {
                lvm::csi::unstage(ctx, &lvm::Seams::SYSTEM, &staging)
            })
            .await?;
            Ok(Response::new(NodeUnstageVolumeResponse {}))
        }
        .await;
        logged(
            "NodeUnstageVolume",
            &r.volume_id,
            &r.staging_target_path,
            out,
        )
    }

    async fn node_expand_volume(
        &self,
        request: Request<NodeExpandVolumeRequest>,
    ) -> Result<Response<NodeExpandVolumeResponse>, Status> {
        let r = request.into_inner();
        let s = &self.settings;
        let out = async {
            if s.kind != Kind::Lvm {
                return Err(Status::unimplemented(format!(
                    "NodeExpandVolume is not served for {} volumes: nothing on the node grows with them",
                    s.kind.name()
                )));
            }
            if r.volume_id.is_empty() {
                return Err(Status::invalid_argument("volume_id is required"));
            }
            if r.volume_path.is_empty() {
                return Err(Status::invalid_argument("volume_path is required"));
            }
            // kubelet sends the pod's target path (or the staging path); either shape, nothing
            // opened through it: the LV comes from the staging path's record. A path of neither
            // shape holds no volume this plugin serves: NOT_FOUND, as CSI asks of a volume not
            // found (csi-sanity checks it), and as NodeGetVolumeStats answers.
            let is_target = target_path(&s.kubelet_root, &r.volume_path, "volume_path").is_ok();
            if !is_target {
                staging_path(&s.kubelet_root, &s.driver_name, &r.volume_path)
                    .map_err(|_| Status::not_found("volume_path is neither a CSI target path nor a staging path under the kubelet directory: no volume of this plugin is there"))?;
            }
            // kubelet 1.20 expands a staged volume with the staging path as volume_path and no
            // staging_target_path (its NodeExpand leaves DeviceStagePath empty): that path is the
            // staging path, checked as one above.
            let staging_given = if r.staging_target_path.is_empty() && !is_target {
                &r.volume_path
            } else {
                &r.staging_target_path
            };
            let staging = staging_path(&s.kubelet_root, &s.driver_name, staging_given)?;
            let want = r
                .capacity_range
                .as_ref()
                .map_or(0, |c| c.required_bytes);
            let Ok(bytes) = u64::try_from(want) else {
                return Err(Status::invalid_argument("capacity_range.required_bytes must not be negative"));
            };
            if bytes == 0 {
                return Err(Status::invalid_argument(
                    "capacity_range.required_bytes is required: the size to grow the LV to",
                ));
            }
            let id = r.volume_id.clone();
            let size = on_node(s, "NodeExpandVolume", move |ctx| {
                lvm::csi::expand(ctx, &lvm::Seams::SYSTEM, &staging, &id, bytes)
            })
            .await?;
            Ok(Response::new(NodeExpandVolumeResponse {
                capacity_bytes: i64::try_from(size).unwrap_or(i64::MAX),
            }))
        }
        .await;
        logged(
            "NodeExpandVolume",
            &r.volume_id,
            &r.staging_target_path,
            out,
        )
    }

    async fn node_get_volume_stats(
        &self,
        request: Request<NodeGetVolumeStatsRequest>,
    ) -> Result<Response<NodeGetVolumeStatsResponse>, Status> {
        let r = request.into_inner();
        if self.settings.kind == Kind::Nfs {
            // A statvfs of an NFS mount whose server is gone blocks in the kernel, and a blocked
            // thread cannot be freed: not offered (not in NodeGetCapabilities), never done.
            return Err(Status::unimplemented(
                "NodeGetVolumeStats is not served for NFS volumes: a statfs of a mount whose server is down would block",
            ));
        }
        if r.volume_id.is_empty() {
            return Err(Status::invalid_argument("volume_id is required"));
        }
        if r.volume_path.is_empty() {
            return Err(Status::invalid_argument("volume_path is required"));
        }
        // A path not of a target's shape holds no volume this plugin published: NOT_FOUND, as
        // CSI asks of a volume not at the given path (csi-sanity checks it). Nothing is opened.
        let path = target_path(&self.settings.kubelet_root, &r.volume_path, "volume_path")
            .map_err(|e| Status::not_found(e.message().to_owned()))?;
        let usage = on_node(&self.settings, "NodeGetVolumeStats", move |_| {
            Ok(stats(&path))
        })
        .await??;
        Ok(Response::new(NodeGetVolumeStatsResponse { usage }))
    }

    async fn node_get_capabilities(
        &self,
        _request: Request<NodeGetCapabilitiesRequest>,
    ) -> Result<Response<NodeGetCapabilitiesResponse>, Status> {
        let capabilities = node_capabilities(self.settings.kind)
            .iter()
            .map(|&r#type| NodeServiceCapability {
                rpc: Some(NodeServiceCapabilityRpc { r#type }),
            })
            .collect();
        Ok(Response::new(NodeGetCapabilitiesResponse { capabilities }))
    }

    async fn node_get_info(
        &self,
        _request: Request<NodeGetInfoRequest>,
    ) -> Result<Response<NodeGetInfoResponse>, Status> {
        let s = &self.settings;
        Ok(Response::new(NodeGetInfoResponse {
            node_id: s.node_name.clone(),
            max_volumes_per_node: 0,
            accessible_topology: s.topology_key.as_ref().map(|k| Topology {
                segments: HashMap::from([(k.clone(), "true".to_owned())]),
            }),
        }))
    }
}

/// The Node capabilities of a kind. NFS: no GET_VOLUME_STATS (`node_get_volume_stats` says why).
/// VOLUME_MOUNT_GROUP for hostPath and NFS only: with it, kubelet 1.22+ passes the pod's fsGroup
/// to NodePublishVolume and applies none itself, and the backend applies it to a provisioned
/// volume only, as the FlexVolume `mount` does ([`mount_group`]); kubelet never touches a static
/// one either way (`fsGroupPolicy: None`). Not for LVM: its CSIDriver says `fsGroupPolicy: File`
/// and kubelet applies the group to the filesystem itself, which advertising it would stop.
pub(crate) fn node_capabilities(kind: Kind) -> &'static [i32] {
    match kind {
        Kind::Hostpath => &[GET_VOLUME_STATS, VOLUME_MOUNT_GROUP],
        Kind::Nfs => &[VOLUME_MOUNT_GROUP],
        Kind::Lvm => &[STAGE_UNSTAGE_VOLUME, GET_VOLUME_STATS, EXPAND_VOLUME],
    }
}

/// Bytes and inodes of the filesystem a published volume shows at `path` (a checked target path),
/// opened without following any symlink: NOT_FOUND when nothing is there.
fn stats(path: &Path) -> Result<Vec<VolumeUsage>, Status> {
    let fd = match crate::sys::dirfd::open_dir(path) {
        Ok(fd) => fd,
        Err(nix::Error::ENOENT) => {
            return Err(Status::not_found(format!(
                "{} does not exist",
                path.display()
            )));
        }
        Err(e) => {
            return Err(Status::failed_precondition(format!(
                "cannot open {} without following a symlink: {e}",
                path.display()
            )));
        }
    };
    let st = nix::sys::statvfs::fstatvfs(&fd)
        .map_err(|e| Status::internal(format!("statvfs {}: {e}", path.display())))?;
    let frag = st.fragment_size();
    let n = |blocks: u64| i64::try_from(blocks.saturating_mul(frag)).unwrap_or(i64::MAX);
    let i = |count: u64| i64::try_from(count).unwrap_or(i64::MAX);
    let (blocks, free, avail) = (st.blocks(), st.blocks_free(), st.blocks_available());
    let (files, ffree) = (st.files(), st.files_free());
    Ok(vec![
        VolumeUsage {
            available: n(avail),
            total: n(blocks),
            used: n(blocks.saturating_sub(free)),
            unit: UNIT_BYTES,
        },
        VolumeUsage {
            available: i(ffree),
            total: i(files),
            used: i(files.saturating_sub(ffree)),
            unit: UNIT_INODES,
        },
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn publish(context: &[(&str, &str)], readonly: bool, mode: i32) -> NodePublishVolumeRequest {
        NodePublishVolumeRequest {
            volume_id: "v".into(),
            target_path: "/var/lib/kubelet/pods/u/volumes/kubernetes.io~csi/pv/mount".into(),
            volume_capability: Some(VolumeCapability {
                block: None,
                mount: Some(MountVolume::default()),
                access_mode: Some(AccessMode { mode }),
            }),
            readonly,
            volume_context: context
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            ..Default::default()
        }
    }

    #[test]
    fn target_paths_of_the_csi_shape_under_the_kubelet_root_only() {
        let root = Path::new("/var/lib/kubelet");
        let ok = "/var/lib/kubelet/pods/u/volumes/kubernetes.io~csi/pv/mount";
        assert_eq!(target_path(root, ok, "t").unwrap(), PathBuf::from(ok));
        for bad in [
            "",
            "relative/pods/u/volumes/kubernetes.io~csi/pv/mount",
            "/other/kubelet/pods/u/volumes/kubernetes.io~csi/pv/mount",
            "/var/lib/kubelet/pods/u/volumes/kubernetes.io~csi/pv/../../../../../etc",
            "/var/lib/kubelet/pods/u/volumes/kubernetes.io~csi/pv/./mount",
            "/var/lib/kubelet/pods/u/volumes/flexvol~hostpath/pv",
            "/var/lib/kubelet/pods/u/volumes/kubernetes.io~csi/pv/mount/deeper",
            "/var/lib/kubelet/pods/u/volumes/kubernetes.io~csi/pv/notmount",
            "/var/lib/kubelet",
            "/var/lib/kubelet/pods/u/volumes/kubernetes.io~csi/pv/mount/",
            "/var/lib/kubelet/pods/u/volumes/kubernetes.io~csi//pv/mount",
        ] {
            let e = target_path(root, bad, "t").unwrap_err();
            assert_eq!(e.code(), tonic::Code::InvalidArgument, "{bad}: {e:?}");
        }
    }

    #[test]
    fn pod_identity_comes_from_kubelet_keys_only() {
        let o = options_for(
            &publish(
                &[
                    ("path", "/srv/flexvol/a"),
                    ("csi.storage.k8s.io/pod.namespace", "ns1"),
                    ("csi.storage.k8s.io/pod.name", "p"),
                    (
                        "csi.storage.k8s.io/serviceAccount.tokens",
                        "secret-token-value",
                    ),
                    ("csi.storage.k8s.io/ephemeral", "false"),
                ],
                false,
                1,
            ),
            None,
        )
        .unwrap();
        assert_eq!(o.get(keys::POD_NAMESPACE), Some("ns1"));
        assert_eq!(o.get(keys::POD_NAME), Some("p"));
        assert_eq!(o.get("path"), Some("/srv/flexvol/a"));
        assert_eq!(o.get(keys::READWRITE), Some("rw"));
        assert!(
            o.plain().keys().all(|k| !k.starts_with(CSI_PREFIX)),
            "{:?}",
            o.plain().keys()
        );
        // A PV author cannot say who the pod is, or make the mount read-write.
        for key in [
            keys::POD_NAMESPACE,
            keys::READWRITE,
            keys::PV_OR_VOLUME_NAME,
        ] {
            let e = options_for(
                &publish(&[("path", "/srv/x"), (key, "forged-value")], true, 1),
                None,
            )
            .unwrap_err();
            assert_eq!(e.code(), tonic::Code::InvalidArgument);
            assert!(!e.message().contains("forged-value"), "{}", e.message());
        }
    }

    #[test]
    fn read_only_from_the_flag_or_a_reader_only_mode() {
        let ro = |readonly, mode| {
            options_for(&publish(&[("path", "/srv/x")], readonly, mode), None)
                .unwrap()
                .get(keys::READWRITE)
                .map(str::to_owned)
        };
        assert_eq!(ro(true, 1).as_deref(), Some("ro"));
        assert_eq!(ro(false, 2).as_deref(), Some("ro"));
        assert_eq!(ro(false, 3).as_deref(), Some("ro"));
        assert_eq!(ro(false, 5).as_deref(), Some("rw"));
    }

    #[test]
    fn the_pv_name_comes_from_kubelets_paths_and_only_for_a_persistent_volume() {
        let t = Path::new("/var/lib/kubelet/pods/u/volumes/kubernetes.io~csi/pv-a/mount");
        let persistent = ctx(&[("csi.storage.k8s.io/ephemeral", "false")]);
        assert_eq!(pv_of_target(t, &persistent).as_deref(), Some("pv-a"));
        // No pod info (podInfoOnMount off), or an inline volume: the name is the pod's volume
        // name, chosen by the pod's author: none.
        for c in [
            ctx(&[]),
            ctx(&[("csi.storage.k8s.io/ephemeral", "true")]),
            ctx(&[("csi.storage.k8s.io/ephemeral", "False")]),
        ] {
            assert_eq!(pv_of_target(t, &c), None, "{c:?}");
        }
        let old = Path::new("/var/lib/kubelet/plugins/kubernetes.io/csi/pv/pv-a/globalmount");
        assert_eq!(pv_of_staging(old).as_deref(), Some("pv-a"));
        let new = Path::new(
            "/var/lib/kubelet/plugins/kubernetes.io/csi/lvm.csi.flexvol.io/9f86d0/globalmount",
        );
        assert_eq!(pv_of_staging(new), None);
        // What the options carry: the name under kubelet's key, which a volume attribute
        // cannot set (kubernetes.io/ keys are refused).
        let o = options_for(&publish(&[("path", "/srv/x")], false, 1), Some("pv-a")).unwrap();
        assert_eq!(o.get(keys::PV_OR_VOLUME_NAME), Some("pv-a"));
        let o = lvm_options("vg0/data", &ctx(&[]), &mount_cap(""), false, Some("pv-a")).unwrap();
        assert_eq!(o.volume_name.as_deref(), Some("pv-a"));
    }

    #[test]
    fn request_strings_are_shown_bounded() {
        let root = Path::new("/var/lib/kubelet");
        let long = format!("/var/lib/kubelet/{}", "é".repeat(100_000));
        let e = target_path(root, &long, "target_path").unwrap_err();
        assert!(e.message().len() < 1_000, "{} bytes", e.message().len());
        assert!(e.message().contains("(200017 bytes)"), "{}", e.message());
        let e = staging_path(root, "d", &long).unwrap_err();
        assert!(e.message().len() < 1_000, "{} bytes", e.message().len());
        assert_eq!(bounded("short"), "short");
    }

    #[test]
    fn volume_mount_group_is_the_fs_group_option_and_only_a_decimal_group_id() {
        let with_group = |group: &str| {
            let mut r = publish(&[("path", "/srv/x")], false, 1);
            if let Some(m) = r.volume_capability.as_mut().and_then(|c| c.mount.as_mut()) {
                m.volume_mount_group = group.into();
            }
            r
        };
        let o = options_for(&with_group("2345"), Some("pv-a")).unwrap();
        assert_eq!(o.fs_group().unwrap(), Some(2345));
        assert_eq!(
            options_for(&with_group("0"), None)
                .unwrap()
                .fs_group()
                .unwrap(),
            Some(0)
        );
        assert_eq!(
            options_for(&with_group(""), None)
                .unwrap()
                .fs_group()
                .unwrap(),
            None
        );
        for bad in [
            "-1",
            "+1",
            " 1",
            "1 ",
            "wheel",
            "4294967296",
            "99999999999",
            "0x1",
            "1e3",
        ] {
            let e = options_for(&with_group(bad), None).unwrap_err();
            assert_eq!(e.code(), tonic::Code::InvalidArgument, "{bad:?}");
            assert!(!e.message().contains(bad.trim()), "{}", e.message());
        }
        // A PV author cannot set the group through the volume attributes either.
        let e = options_for(
            &publish(&[("path", "/srv/x"), (keys::FS_GROUP, "0")], false, 1),
            None,
        )
        .unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument);
    }

    #[test]
    fn volume_mount_group_is_advertised_where_the_backend_applies_it_and_not_for_lvm() {
        assert_eq!(
            node_capabilities(Kind::Hostpath),
            &[GET_VOLUME_STATS, VOLUME_MOUNT_GROUP]
        );
        assert_eq!(node_capabilities(Kind::Nfs), &[VOLUME_MOUNT_GROUP]);
        // LVM: kubelet applies the group (fsGroupPolicy File); advertising it would stop that.
        assert!(!node_capabilities(Kind::Lvm).contains(&VOLUME_MOUNT_GROUP));
    }

    #[test]
    fn inline_ephemeral_volumes_are_refused() {
        let e = options_for(
            &publish(
                &[("path", "/srv/x"), ("csi.storage.k8s.io/ephemeral", "true")],
                false,
                1,
            ),
            None,
        )
        .unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument);
    }

    #[test]
    fn staging_paths_of_kubelets_two_shapes_under_the_kubelet_root_only() {
        let root = Path::new("/var/lib/kubelet");
        let d = "lvm.csi.flexvol.io";
        for ok in [
            "/var/lib/kubelet/plugins/kubernetes.io/csi/pv/pv1/globalmount",
            "/var/lib/kubelet/plugins/kubernetes.io/csi/lvm.csi.flexvol.io/9f86d0/globalmount",
        ] {
            assert_eq!(staging_path(root, d, ok).unwrap(), PathBuf::from(ok));
        }
        for bad in [
            "",
            "/var/lib/kubelet/plugins/kubernetes.io/csi/pv/pv1/globalmount/",
            "/var/lib/kubelet/plugins/kubernetes.io/csi/pv/../../../../../etc/globalmount",
            "/var/lib/kubelet/plugins/kubernetes.io/csi/other.csi.io/9f86d0/globalmount",
            "/var/lib/kubelet/plugins/kubernetes.io/csi/pv/pv1/notglobal",
            "/var/lib/kubelet/plugins/kubernetes.io/flexvolume/flexvol/lvm/mounts/pv1",
            "/var/lib/kubelet/pods/u/volumes/kubernetes.io~csi/pv1/mount",
            "/srv/plugins/kubernetes.io/csi/pv/pv1/globalmount",
            "plugins/kubernetes.io/csi/pv/pv1/globalmount",
        ] {
            let e = staging_path(root, d, bad).unwrap_err();
            assert_eq!(e.code(), tonic::Code::InvalidArgument, "{bad}: {e:?}");
        }
    }

    fn mount_cap(fs_type: &str) -> VolumeCapability {
        VolumeCapability {
            block: None,
            mount: Some(MountVolume {
                fs_type: fs_type.into(),
                ..Default::default()
            }),
            access_mode: Some(AccessMode { mode: 1 }),
        }
    }

    fn ctx(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn lvm_options_name_the_lv_by_the_volume_id_and_take_nothing_kubelet_says_from_the_author() {
        let o = lvm_options(
            "vg0/data",
            &ctx(&[
                ("mountOptions", "commit=30"),
                ("csi.storage.k8s.io/pod.namespace", "ns1"),
            ]),
            &mount_cap("ext4"),
            false,
            None,
        )
        .unwrap();
        assert_eq!((o.vg.as_str(), o.lv.as_str()), ("vg0", "data"));
        assert_eq!((o.fs.name(), o.mount_data.as_str()), ("ext4", "commit=30"));
        let xfs = lvm_options("vg0/data", &ctx(&[]), &mount_cap("xfs"), false, None).unwrap();
        assert_eq!(xfs.fs.name(), "xfs");
        assert_eq!(o.namespace.as_deref(), Some("ns1"));
        assert_eq!(o.volume_name, None, "no PV name unless one is given");
        assert!(!o.read_only);
        assert!(
            lvm_options("vg0/data", &ctx(&[]), &mount_cap(""), true, None)
                .unwrap()
                .read_only
        );
        // The id names the LV; a context that names another is refused, one that agrees is fine.
        assert!(
            lvm_options(
                "vg0/data",
                &ctx(&[("volumeID", "data")]),
                &mount_cap(""),
                false,
                None
            )
            .is_ok()
        );
        for (id, pairs) in [
            ("vg0/data", vec![("volumeID", "other-lv")]),
            ("vg0/data", vec![("volumegroup", "vg-other")]),
            ("no-slash", vec![]),
            ("vg0/../../etc", vec![]),
            ("vg0/da ta", vec![]),
            ("-vg/data", vec![]),
            (
                "vg0/data",
                vec![("kubernetes.io/pvOrVolumeName", "forged-value")],
            ),
            ("vg0/data", vec![("kubernetes.io/fsType", "forged-value")]),
            ("vg0/data", vec![("mkfsOptions", "-f")]),
            ("vg0/data", vec![("csi.storage.k8s.io/ephemeral", "true")]),
            ("vg0/data", vec![("unknownKey", "forged-value")]),
        ] {
            let e = lvm_options(id, &ctx(&pairs), &mount_cap(""), false, None).unwrap_err();
            assert_eq!(e.code(), tonic::Code::InvalidArgument, "{id} {pairs:?}");
            assert!(!e.message().contains("forged-value"), "{}", e.message());
        }
    }
}
