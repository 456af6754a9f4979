//! The shared vocabulary: the names flexvol writes on and reads from Kubernetes objects (the
//! annotations, labels and finalizer below), the StorageClass parameters that are not a kind's
//! own ([`class`]), and the capacity record's wire format ([`capacity`]). The provisioner, the
//! controller, the scheduler extender and the operator tools (`status`, `gc`) all speak it, so it
//! lives in a room of its own that imports none of them.
//!
//! **Contract.** A name here is on objects in users' clusters: changing one is a migration, not a
//! refactor. Values only; what to do with them is decided by the rooms that import this one.

pub mod capacity;
pub(crate) mod class;

/// The kinds whose volumes live on one node (`<vendor>/<kind>` provisioners): the PVs
/// `flexvol controller`'s node-loss rules may act on.
pub(crate) const NODE_LOCAL_KINDS: [&str; 2] = ["hostpath", "lvm"];

// Kubernetes' well-known names flexvol reads and writes (sig-storage's, the scheduler's).

/// Claim annotation naming the provisioner (1.20 sets only this one).
pub(crate) const ANN_PROVISIONER_BETA: &str = "volume.beta.kubernetes.io/storage-provisioner";
/// Claim annotation naming the provisioner (1.23+ also set this one).
pub(crate) const ANN_PROVISIONER: &str = "volume.kubernetes.io/storage-provisioner";
/// Claim annotation the scheduler sets for WaitForFirstConsumer.
pub(crate) const ANN_SELECTED_NODE: &str = "volume.kubernetes.io/selected-node";
/// PV annotation: who provisioned it.
pub(crate) const ANN_PROVISIONED_BY: &str = "pv.kubernetes.io/provisioned-by";
/// The node label PVs are pinned by.
pub(crate) const HOSTNAME_LABEL: &str = "kubernetes.io/hostname";
/// The PV finalizer of external provisioners (sig-storage-lib-external-provisioner's, what
/// Kubernetes 1.33's `HonorPVReclaimPolicy` relies on): every PV the provisioner makes carries it,
/// and it is removed only once the volume is (reclaim policy Delete) or when the PV is deleted
/// (any other policy), so a PV deleted before its claim still gets its volume removed.
pub const FINALIZER: &str = "external-provisioner.volume.kubernetes.io/finalizer";
/// The claim conditions a finished resize clears: `Resizing` (set while the volume is being
/// grown) and `FileSystemResizePending` (set when only the node's part is left). Kubernetes 1.20
/// uses only these two; later releases add others (`ControllerResizeError`, `NodeResizeError`,
/// `ModifyVolumeError`, `ModifyingVolume`, ...) that belong to other controllers and are kept.
pub const RESIZE_CONDITIONS: [&str; 2] = ["Resizing", "FileSystemResizePending"];

// flexvol's own annotations on the PVs it makes.

/// PV annotation: the node whose provisioner made it (and, for node-local volumes, owns it).
pub(crate) const ANN_NODE: &str = "flexvol/node";
/// PV annotation: the size in bytes the backend really provisioned (or grew to), which may exceed
/// the request (LVM rounds up to extents). The resize logic compares claims against it, not
/// against the PV's capacity, which kube-controller-manager raises by itself on a resize.
pub(crate) const ANN_SIZE: &str = "flexvol/size-bytes";
/// PV annotation: `"true"` when the backend enforces the size (an LV, a project quota), `"false"`
/// with the reason in [`ANN_SIZE_NOTE`] otherwise.
pub(crate) const ANN_SIZE_ENFORCED: &str = "flexvol/size-enforced";
/// PV annotation: why the size is not enforced, for people and `flexvol status`.
pub(crate) const ANN_SIZE_NOTE: &str = "flexvol/size-note";
/// PV annotation: the project ID of an enforced size (for people; the record is what counts).
pub(crate) const ANN_PROJECT: &str = "flexvol/quota-project";
/// PV annotation of a clone: the PV it was copied from, and what the copy did.
pub(crate) const ANN_CLONED_FROM: &str = "flexvol/cloned-from";
/// PV annotation: the volume group of the LV (what delete and expand act on).
pub(crate) const ANN_VG: &str = "flexvol/lvm-volumegroup";
/// PV annotation: the LV's name (the PV's name).
pub(crate) const ANN_LV: &str = "flexvol/lvm-lv";
/// PV annotation: the export root mounted to create and remove the directory (the class's
/// `share`).
pub(crate) const ANN_EXPORT: &str = "flexvol/nfs-export";
/// PV annotation: the volume's directory relative to [`ANN_EXPORT`], exactly as created.
pub const ANN_PATH: &str = "flexvol/nfs-path";
/// PV annotation: what delete does (`delete`, `retain`, `archive`).
pub const ANN_ON_DELETE: &str = "flexvol/nfs-on-delete";
/// PV annotation: when the controller first saw the PV's node gone (RFC 3339, UTC).
pub const ANN_MISSING_SINCE: &str = "flexvol/node-missing-since";
/// PV annotation written with [`ANN_MISSING_SINCE`]: the `renewTime` of the node's Lease as it was
/// then ([`LeaseSeen::token`]); absent when the node had no Lease. A Lease that differs later was
/// renewed during the grace.
pub(crate) const ANN_LEASE_AT_MARK: &str = "flexvol/node-lease-at-mark";
/// PV annotation: the PV's Node is gone but its kubelet was seen alive (RFC 3339, UTC, when the
/// hold was written). Nothing is ever deleted for a PV that carries it; it goes when the Node comes
/// back, or when an admin removes it (then the grace runs from the next pass).
pub(crate) const ANN_DELETED_ALIVE: &str = "flexvol/node-deleted-alive";

// flexvol's labels (the claim routing of `provision::labeller`, the PVs' kind).

/// Label on every PV we make: the kind that made it (`hostpath`, `lvm`, `nfs`), so an instance can
/// watch only the shared kinds' PVs (a label selector: the API server filters).
pub(crate) const LABEL_KIND: &str = "flexvol/kind";
/// Label on every node-local PV we make: its node ([`node_label_value`]), so an instance watches
/// only its own node's PVs. Only a filter: who made a PV is still decided by its annotations.
pub(crate) const LABEL_NODE: &str = "flexvol/node";

/// The options a PV of flexvol's carries for its driver: `spec.flexVolume.options`, or, for a
/// CSI PV (a class with [`class::CSI_DRIVER`]), `spec.csi.volumeAttributes`: the same map, which
/// `flexvol csi` reads as its volume context. Read-only: who made the PV is still decided by its
/// annotations.
pub(crate) fn pv_options(
    pv: &k8s_openapi::api::core::v1::PersistentVolume,
) -> Option<&std::collections::BTreeMap<String, String>> {
    let spec = pv.spec.as_ref()?;
    match (&spec.flex_volume, &spec.csi) {
        (Some(f), _) => f.options.as_ref(),
        (None, Some(c)) => c.volume_attributes.as_ref(),
        (None, None) => None,
    }
}

/// Whether `pv`'s source is one flexvol's provisioner `provisioner` (`<vendor>/<kind>`) writes:
/// a flexVolume source of that driver, or a CSI source (whose driver the class names).
pub(crate) fn pv_source_is(
    pv: &k8s_openapi::api::core::v1::PersistentVolume,
    provisioner: &str,
) -> bool {
    let Some(spec) = pv.spec.as_ref() else {
        return false;
    };
    match (&spec.flex_volume, &spec.csi) {
        (Some(f), _) => f.driver == provisioner,
        (None, Some(c)) => !c.driver.is_empty(),
        (None, None) => false,
    }
}

/// The volume handle of a CSI PV of `kind` (`hostpath`, `nfs`, `lvm`): `<vg>/<lv>` for an LV, from
/// its options `volumegroup` and `volumeID` (what `flexvol csi --kind lvm` takes, and checks
/// against the attributes), `None` when they are missing; the PV's name otherwise (a directory or
/// an NFS subdirectory is named by its attributes; the handle is only kubelet's key).
pub(crate) fn csi_handle(
    kind: &str,
    pv_name: &str,
    options: &std::collections::BTreeMap<String, String>,
) -> Option<String> {
    match (kind, options.get("volumegroup"), options.get("volumeID")) {
        ("lvm", Some(vg), Some(lv)) => Some(format!("{vg}/{lv}")),
        ("lvm", _, _) => None,
        _ => Some(pv_name.to_owned()),
    }
}
