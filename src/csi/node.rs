//! The CSI Node service: NodeGetInfo, NodeGetCapabilities, NodePublishVolume and
//! NodeUnpublishVolume of hostPath or NFS volumes (`--kind`), NodeGetVolumeStats (hostPath only:
//! a statfs of a dead server's NFS mount would block). Any other Node call (NodeStage, NodeExpand,
//! ...) answers UNIMPLEMENTED (the generated router does), and none is advertised.
//!
//! Publish and unpublish are the FlexVolume `mount` and `unmount` verbs of the kind's backend
//! ([`hostpath::publish`], [`nfs::publish`] and their unpublish): the request is turned into that
//! backend's options and its code does the work, under the same node config, locks and state
//! records. What is CSI's own is checked here first, on hostile input:
//! - the target path must be `<kubelet-root>/pods/<uid>/volumes/kubernetes.io~csi/<name>/mount`
//!   under the kubelet root this plugin was started with ([`target_path`]);
//! - the volume context becomes the options: a key of kubelet's own namespace (`kubernetes.io/…`)
//!   is refused (only kubelet may say who the pod is), the pod identity kubelet adds with
//!   `podInfoOnMount` (`csi.storage.k8s.io/pod.*`) is renamed to the FlexVolume keys, every other
//!   `csi.storage.k8s.io/…` key is dropped (the service account tokens among them are secrets),
//!   and an inline ephemeral volume (`csi.storage.k8s.io/ephemeral: "true"`, whose attributes the
//!   pod's author writes) is refused ([`options_for`]);
//! - `secrets` are never read, logged or passed on.
//!
//! The backend's blocking work runs on a blocking thread under the node config's verb timeout
//! (DEADLINE_EXCEEDED when it expires; the volume's lock keeps a late finish from racing a retry).

use super::proto::*;
use super::settings::{Kind, LOG_TARGET, Settings, status_of};
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
    ("csi.storage.k8s.io/pod.name", keys::POD_NAME),
    ("csi.storage.k8s.io/pod.namespace", keys::POD_NAMESPACE),
    ("csi.storage.k8s.io/pod.uid", keys::POD_UID),
    (
        "csi.storage.k8s.io/serviceAccount.name",
        keys::SERVICE_ACCOUNT,
    ),
];
/// kubelet's prefix for what it adds to a CSI volume context.
const CSI_PREFIX: &str = "csi.storage.k8s.io/";
/// Set by kubelet to `"true"` for an inline ephemeral volume.
const EPHEMERAL: &str = "csi.storage.k8s.io/ephemeral";
/// How long a call may take beyond the node config's verb timeout before it is answered
/// DEADLINE_EXCEEDED (the backend checks the deadline itself where it waits).
const GRACE: std::time::Duration = std::time::Duration::from_secs(2);

/// Checks a target (or volume) path from a request against the CSI shape under `kubelet_root`:
/// absolute, no `.` or `..`, exactly `<kubelet_root>/pods/<uid>/volumes/kubernetes.io~csi/<name>/mount`
/// (component by component, no symlink resolved: the backend opens it without following any).
pub(crate) fn target_path(kubelet_root: &Path, given: &str, what: &str) -> Result<PathBuf, Status> {
    let bad = |why: &str| {
        Status::invalid_argument(format!(
            "{what} {given:?} {why}; flexvol csi only acts on {}/pods/<pod-uid>/volumes/kubernetes.io~csi/<volume>/mount",
            kubelet_root.display()
        ))
    };
    if given.is_empty() {
        return Err(Status::invalid_argument(format!("{what} is required")));
    }
    // By bytes: `Path::components` would drop a `.` in the middle and a trailing `/`.
    let mut parts = given.split('/');
    let absolute = parts.next() == Some("");
    if !absolute || parts.any(|c| c.is_empty() || c == "." || c == "..") {
        return Err(bad(
            "must be an absolute path without \".\", \"..\" or empty components",
        ));
    }
    let p = Path::new(given);
    let Ok(below) = p.strip_prefix(kubelet_root) else {
        return Err(bad("is outside the kubelet directory"));
    };
    let c: Vec<&std::ffi::OsStr> = below.iter().collect();
    let shape = c.len() == 6
        && c[0] == "pods"
        && c[2] == "volumes"
        && c[3] == "kubernetes.io~csi"
        && c[5] == "mount";
    if !shape {
        return Err(bad("is not a CSI target path"));
    }
    Ok(p.to_owned())
}

/// The hostPath options of a publish request: the volume context (module doc: what is refused,
/// renamed and dropped) and the access (`readonly`, or a reader-only access mode). Errors never
/// echo a value.
pub(crate) fn options_for(r: &NodePublishVolumeRequest) -> Result<Options, Status> {
    if r.volume_context.get(EPHEMERAL).is_some_and(|v| v == "true") {
        return Err(Status::invalid_argument(
            "inline ephemeral CSI volumes are not served: their attributes (the host path) are written by the pod's author; use a PersistentVolume",
        ));
    }
    let mut map = serde_json::Map::new();
    for (k, v) in &r.volume_context {
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
    let reader_only = r
        .volume_capability
        .as_ref()
        .and_then(|c| c.access_mode.as_ref())
        .is_some_and(|m| matches!(m.mode, 2 | 3));
    let rw = if r.readonly || reader_only {
        "ro"
    } else {
        "rw"
    };
    map.insert(keys::READWRITE.to_owned(), rw.into());
    let json = serde_json::Value::Object(map).to_string();
    Options::parse(&json).map_err(|e| Status::invalid_argument(e.to_string()))
}

/// Runs `f` with a context over the node's real seams on a blocking thread, under the node
/// config's verb timeout.
async fn on_node<T: Send + 'static>(
    settings: &Settings,
    f: impl FnOnce(&backend::Context) -> crate::error::Result<T> + Send + 'static,
) -> Result<T, Status> {
    let config = Config::load().map_err(|e| Status::failed_precondition(e.to_string()))?;
    let limit = config.verb_timeout();
    let name = settings.driver_name.clone();
    let work = tokio::task::spawn_blocking(move || {
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

/// Logs the outcome of a call that changed or looked at a volume: the method, the volume id and
/// path (never a context value or a secret), and the code and message on failure.
fn logged<T>(method: &str, volume_id: &str, path: &str, r: Result<T, Status>) -> Result<T, Status> {
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
            let Some(cap) = &r.volume_capability else {
                return Err(Status::invalid_argument("volume_capability is required"));
            };
            let kind = self.settings.kind;
            if cap.block.is_some() || cap.mount.is_none() {
                return Err(Status::invalid_argument(format!(
                    "{} volumes are served as mounts only: volume_capability must be a mount, not a block device",
                    kind.name()
                )));
            }
            if cap.mount.as_ref().is_some_and(|m| !m.mount_flags.is_empty()) {
                return Err(Status::invalid_argument(match kind {
                    Kind::Hostpath => "mount_flags are not supported for hostPath volumes (a bind mount takes none; readOnly is the volume's readOnly)",
                    Kind::Nfs => "mount_flags (the PV's mountOptions) are not used for NFS volumes: give them as the volume attribute mountOptions, which the node's nfs policy checks",
                }));
            }
            let options = options_for(&r)?;
            on_node(&self.settings, move |ctx| match kind {
                Kind::Hostpath => hostpath::publish(ctx, &target, &options),
                Kind::Nfs => nfs::publish(ctx, &nfs::probe::TcpProber, &target, &options),
            })
            .await?;
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
            on_node(&self.settings, move |ctx| match kind {
                Kind::Hostpath => hostpath::unpublish(ctx, &target),
                Kind::Nfs => nfs::unpublish(ctx, &nfs::probe::TcpProber, &target),
            })
            .await?;
            Ok(Response::new(NodeUnpublishVolumeResponse {}))
        }
        .await;
        logged("NodeUnpublishVolume", &r.volume_id, &r.target_path, out)
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
        let usage = on_node(&self.settings, move |_| Ok(stats(&path))).await??;
        Ok(Response::new(NodeGetVolumeStatsResponse { usage }))
    }

    async fn node_get_capabilities(
        &self,
        _request: Request<NodeGetCapabilitiesRequest>,
    ) -> Result<Response<NodeGetCapabilitiesResponse>, Status> {
        // NFS: no GET_VOLUME_STATS (node_get_volume_stats says why).
        let capabilities = match self.settings.kind {
            Kind::Hostpath => vec![NodeServiceCapability {
                rpc: Some(NodeServiceCapabilityRpc {
                    r#type: GET_VOLUME_STATS,
                }),
            }],
            Kind::Nfs => Vec::new(),
        };
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
            accessible_topology: Some(Topology {
                segments: HashMap::from([(s.topology_key.clone(), "true".to_owned())]),
            }),
        }))
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
        let o = options_for(&publish(
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
        ))
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
            let e = options_for(&publish(
                &[("path", "/srv/x"), (key, "forged-value")],
                true,
                1,
            ))
            .unwrap_err();
            assert_eq!(e.code(), tonic::Code::InvalidArgument);
            assert!(!e.message().contains("forged-value"), "{}", e.message());
        }
    }

    #[test]
    fn read_only_from_the_flag_or_a_reader_only_mode() {
        let ro = |readonly, mode| {
            options_for(&publish(&[("path", "/srv/x")], readonly, mode))
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
    fn inline_ephemeral_volumes_are_refused() {
        let e = options_for(&publish(
            &[("path", "/srv/x"), ("csi.storage.k8s.io/ephemeral", "true")],
            false,
            1,
        ))
        .unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument);
    }
}
