//! The seam between the reconcile loop and the storage: one [`Provisioner`] per kind of volume the
//! provisioner makes (`hostpath`, `lvm`, `nfs`).
//!
//! The reconciler ([`crate::provision::reconcile`]) reads the API server and decides *which* claim, PV or
//! resize to act on; a backend does the node-side work for one of them and says what came of it.
//! Everything a backend needs later (to delete or grow a volume) must be in what it returns at
//! provisioning time — the PV's flexVolume options and annotations — because the StorageClass may
//! be gone or edited by then.
//!
//! Caller contract (what the reconciler guarantees):
//! - [`Provisioner::provision`] is called only for a claim whose class names `<vendor>/<kind>`, whose
//!   class parameters passed [`Provisioner::check_class`], that requests a size, is `Filesystem`, has no
//!   selector, and — for a node-local backend — whose `selected-node` is this instance's node;
//! - [`Provisioner::delete`] only for a PV annotated as provisioned by `<vendor>/<kind>` (and, when
//!   [`Kind::node_local`], by this node), reclaim policy Delete, Released or deleted with its
//!   claim gone, re-read from the server just before; again after a kill (the PV is held by its
//!   finalizer until its volume is gone);
//! - [`Provisioner::expand`] only for a Bound PV of ours whose claim asks for more than the PV's
//!   [`ANN_SIZE`] and whose class allows expansion.
//!
//! Implementation contract (what a backend guarantees):
//! - every call is idempotent and keyed by the PV name: after a kill -9 anywhere, calling it again
//!   finishes the job (an LV/directory made by a killed pass is found and reused, one already
//!   deleted is success) — never a second volume, never a leak;
//! - validation comes before any change: an `Err` from `provision` leaves nothing behind;
//! - deletion removes only what carries our ownership mark for exactly this PV (a tag, a marker
//!   file), never through a symlink, and any doubt is an error;
//! - every external command and mount is bounded (the `sys::exec` deadlines), so a dead NFS server
//!   or a stuck LVM command gives an error in bounded time.
//!
//! Calls are synchronous and run on their lane's own thread ([`crate::provision::lanes`]): a lane works on
//! one object at a time; a slow call holds up only its lane, and the watches buffer meanwhile.

pub(crate) mod cloning;
pub(crate) mod error;
pub mod hostpath;
pub mod lvm;
pub mod nfs;
pub mod quota;
pub mod volumedir;

use crate::node::config::Config;
pub use crate::provision::storage::error::{ClassError, ProvisionError};
use crate::vocab::ANN_NODE;
use crate::vocab::ANN_SIZE;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use std::collections::BTreeMap;

/// One claim to provision, as the reconciler validated it.
#[derive(Debug, Clone)]
pub struct Request<'a> {
    /// The PV to make: `pvc-<claim uid>` (deterministic, so racing instances make one).
    pub pv_name: &'a str,
    /// The claim.
    pub claim: &'a PersistentVolumeClaim,
    /// The claim's namespace, name and uid.
    pub namespace: &'a str,
    /// The claim's name.
    pub name: &'a str,
    /// The claim's uid.
    pub uid: &'a str,
    /// The class's name.
    pub class_name: &'a str,
    /// The class's parameters (passed [`Provisioner::check_class`]).
    pub params: &'a BTreeMap<String, String>,
    /// The requested size in bytes.
    pub size_bytes: u64,
    /// The claim's access modes (non-empty).
    pub access_modes: &'a [String],
    /// This instance's node.
    pub node: &'a str,
    /// The volume to copy (`dataSource: {kind: PersistentVolumeClaim}`), as [`check_clone_source`]
    /// accepted it: a PV of this provisioner and class, bound to a claim of the same namespace,
    /// no larger than the request and (node-local kinds) made on this node. `None`: an empty volume.
    pub source: Option<&'a PersistentVolume>,
}

/// What a backend made for a claim: the PV is built from it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Provisioned {
    /// The PV's flexVolume options (the driver is `<vendor>/<kind>`).
    pub options: BTreeMap<String, String>,
    /// The PV's capacity in bytes (the request, or more when the backend rounds up).
    pub capacity_bytes: u64,
    /// Extra PV annotations: what delete/expand need later, and [`ANN_SIZE_ENFORCED`].
    pub annotations: BTreeMap<String, String>,
    /// Where it lives, for events and logs (`/srv/flexvol/pvc-…`, `vg0/pvc-…`, `10.0.0.5:/export/…`).
    pub location: String,
    /// The PV's `flexVolume.fsType` (kubelet passes it to the driver as `kubernetes.io/fsType`;
    /// the API server refuses `kubernetes.io/` keys in `options`), for backends that format.
    pub fs_type: Option<String>,
}

/// Why a claim was not provisioned here.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// This node cannot serve it (no such VG, no room, no root): the reconciler removes
    /// `selected-node` so the scheduler picks another node, with an event saying why.
    Reschedule(String),
    /// It cannot be provisioned as asked, or a step failed: a ProvisioningFailed event; the
    /// reconciler tries again on the next pass.
    Fail(String),
    /// The backend's server did not answer or failed (a mount that timed out, a directory that
    /// could not be made in the export): as [`Refusal::Fail`], and it opens the breaker of the
    /// claim's [`Provisioner::fault_domain`], so other claims on that server wait instead of
    /// each paying the same deadline.
    Unavailable(String),
    /// Not yet: what the volume is made from is in use (a clone's source mounted by a pod, or
    /// written while it was copied). Nothing is left behind; the claim keeps its node and is
    /// tried again, as after [`Refusal::Fail`]. The message (it starts with `waiting: `) says
    /// what to do.
    Wait(String),
}

impl Refusal {
    /// The message for the claim's event.
    pub(crate) fn message(&self) -> &str {
        match self {
            Self::Reschedule(m) | Self::Fail(m) | Self::Unavailable(m) | Self::Wait(m) => m,
        }
    }

    /// The message of a refusal that is the server's ([`Refusal::Unavailable`]): what opens its
    /// breaker. `None` for every other kind, whatever its message says.
    pub(crate) fn server_failure(&self) -> Option<&str> {
        match self {
            Self::Unavailable(m) => Some(m),
            _ => None,
        }
    }
}

/// What a kind of volume is: fixed per provisioner, one constant each (`hostpath::KIND`, …).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Kind {
    /// `hostpath`, `lvm` or `nfs`: the provisioner name is `<vendor>/<kind>`, which is also the
    /// PV's flexVolume driver and the key of the Node label the operator sets for it.
    pub name: &'static str,
    /// Node-local volumes (hostPath, LVM) are made by the instance on the claim's selected node
    /// and pinned to it by `nodeAffinity`; shared ones (NFS) by any instance, and deleted by any.
    pub node_local: bool,
    /// Access modes this kind supports (e.g. `ReadWriteOnce` only for node-local volumes).
    pub access_modes: &'static [&'static str],
    /// Whether kubelet finishes a resize on the node (`expandfs`: LVM grows the filesystem and
    /// kubelet records the claim's new size). When `false` the reconciler records it on the claim.
    pub(crate) node_finishes_resize: bool,
}

/// One kind of volume (sig-storage-lib-external-provisioner's word).
pub trait Provisioner {
    /// What this kind is (its constant).
    fn kind(&self) -> &'static Kind;

    /// Whether this node can serve this kind now, per its config (the provisioner advises the
    /// operator when the node's label says otherwise).
    fn serves(&self, cfg: &Config, node: &str) -> bool;

    /// Validates a class's `parameters` (unknown keys are errors). Called before anything exists.
    fn check_class(&self, params: &BTreeMap<String, String>) -> Result<(), ClassError>;

    /// The fault domain of a class's parameters or a PV's flexVolume options (both name it the
    /// same way): the server whose failure would fail every claim on it. Work for a domain whose
    /// breaker is open fails fast ([`crate::k8s::queue::Breakers`]). `None` (the default): node-local
    /// work, which shares nothing that can fail for some claims and not others.
    fn fault_domain(&self, _params: &BTreeMap<String, String>) -> Option<String> {
        None
    }

    /// Makes (or finds, made by an earlier pass for `req.pv_name`) the volume.
    fn provision(&mut self, cfg: &Config, req: &Request<'_>) -> Result<Provisioned, Refusal>;

    /// Removes the volume of a Released PV with reclaim policy Delete; `Ok` when already gone.
    /// Returns what was done, for the log (`removed vg0/pvc-…`, `archived to …`).
    fn delete(&mut self, cfg: &Config, pv: &PersistentVolume) -> Result<String, ProvisionError>;

    /// Grows the volume to at least `bytes`; returns the size it has now. Shrinking never
    /// happens (the caller never asks for less than [`ANN_SIZE`]). `Err` leaves the volume as it
    /// was or grown, never half-applied in a way a retry cannot finish.
    fn expand(
        &mut self,
        cfg: &Config,
        pv: &PersistentVolume,
        bytes: u64,
    ) -> Result<u64, ProvisionError>;

    /// Finishes work a kill left half done (tombstones); returns failures for the log.
    fn recover(&mut self, cfg: &Config, node: &str) -> Vec<String>;

    /// Gives the volume of `pv` (a PV of this kind, of this node for a node-local kind) the
    /// root-only ownership record it lacks when it was made before records existed
    /// ([`crate::provision::storage::volumedir::adopt_legacy`]); `Some` says what failed, for the log. The default:
    /// nothing to adopt (a kind whose ownership is not kept in directory records).
    fn adopt(&self, _cfg: &Config, _pv: &PersistentVolume) -> Option<String> {
        None
    }

    /// Checks that the size its PV says is enforced (`flexvol/size-enforced: "true"`) still is,
    /// and puts back what a pod changed (a hostPath directory moved out of its project, see
    /// [`crate::provision::storage::quota::check_drift`]). Called for each PV of this kind (of this node for a
    /// node-local kind) that is kept, on every resync. `None`: nothing to say (no enforced size,
    /// or it is as it should be). The default: nothing to check.
    fn check_size(&self, _cfg: &Config, _pv: &PersistentVolume) -> Option<SizeCheck> {
        None
    }
}

/// What [`Provisioner::check_size`] found wrong with an enforced size.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SizeCheck {
    /// It had drifted (what was found) and was put back.
    Restored(String),
    /// It has drifted (what was found) and could not be put back (why); retried next pass.
    NotRestored(String, String),
    /// It could not be checked (why).
    Failed(String),
}

/// Why a claim can never be provisioned by its class: not on this node, not on any other, not
/// later. Only a new claim (or, for [`Never::Class`], a new class) changes it. Code branches on
/// it: the provisioner removes such a claim's `selected-node` (it holds no node), the scheduler
/// extender never counts it against a node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Never {
    /// The class's parameters are invalid (they cannot be edited).
    Class,
    /// `volumeMode: Block`.
    BlockMode,
    /// `spec.selector` (a provisioned claim binds only its own PV).
    Selector,
    /// No access mode, or one the kind does not support (`ReadWriteMany` on a node-local kind).
    AccessModes,
    /// No storage request, or one that is not a size.
    Size,
    /// `dataSource` is not a claim named by a plain name.
    DataSource,
}

/// A claim its class can never provision: why, to branch on, and the message for its event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Unprovisionable {
    /// Why.
    pub(crate) why: Never,
    /// What is wrong and what to change, for the claim's event.
    pub(crate) message: String,
}

/// What the provisioner makes for a claim [`plan_claim`] accepts.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ClaimPlan {
    /// The request as written (`1Gi`).
    pub(crate) size: Quantity,
    /// The request in bytes.
    pub size_bytes: u64,
    /// The claim's access modes (non-empty, all supported by the kind).
    pub access_modes: Vec<String>,
    /// The claim to copy (its `dataSource`, same namespace), not yet checked against the server.
    pub source: Option<String>,
}

/// Whether `c` still waits for a volume to be made: not being deleted, not bound or pre-bound
/// to a PV (`spec.volumeName`), phase `Pending` (or none yet). The provisioner acts only on such
/// a claim, and the scheduler extender counts only such a claim.
pub(crate) fn awaits_volume(c: &PersistentVolumeClaim) -> bool {
    c.metadata.deletion_timestamp.is_none()
        && c.spec
            .as_ref()
            .and_then(|s| s.volume_name.as_deref())
            .is_none_or(str::is_empty)
        && c.status
            .as_ref()
            .and_then(|s| s.phase.as_deref())
            .is_none_or(|p| p == "Pending")
}

/// THE decision of whether a claim of class `class_name` (provisioner `<vendor>/<kind>`) could
/// ever be provisioned, from the claim and the class alone, pure: the provisioner
/// ([`crate::provision::reconcile`]) makes nothing for a claim this refuses, and the scheduler extender
/// (`controller::extender::claims`) counts no capacity for it, so the two cannot drift apart.
/// `class_check` is the class's parameters checked by the kind (the backend's `check_class`,
/// which for hostPath and LVM is [`crate::provision::storage::hostpath::check_params`] and
/// [`crate::provision::storage::lvm::check_params`]). A clone's source is checked further, against the server, by
/// [`source_claim_ready`] and [`check_clone_source`].
pub(crate) fn plan_claim(
    kind: &Kind,
    class_name: &str,
    class_check: Result<(), ClassError>,
    claim: &PersistentVolumeClaim,
) -> Result<ClaimPlan, Unprovisionable> {
    let never = |why: Never, message: String| -> Result<ClaimPlan, Unprovisionable> {
        Err(Unprovisionable { why, message })
    };
    let k = kind.name;
    if let Err(why) = class_check {
        return never(
            Never::Class,
            format!(
                "StorageClass {class_name}: {why}; fix the class (a new class, since parameters cannot be edited) and recreate the claim; nothing was created"
            ),
        );
    }
    let spec = claim.spec.clone().unwrap_or_default();
    if spec.volume_mode.as_deref() == Some("Block") {
        return never(
            Never::BlockMode,
            format!(
                "volumeMode Block is not supported by the {k} provisioner; use volumeMode Filesystem"
            ),
        );
    }
    if spec.selector.is_some() {
        return never(
            Never::Selector,
            format!(
                "claims with a selector are not supported by the {k} provisioner; remove spec.selector"
            ),
        );
    }
    let modes = spec.access_modes.clone().unwrap_or_default();
    let allowed = kind.access_modes;
    if modes.is_empty() || modes.iter().any(|m| !allowed.contains(&m.as_str())) {
        return never(
            Never::AccessModes,
            format!(
                "access modes {modes:?} are not supported by the {k} provisioner; use {}",
                allowed.join(" or ")
            ),
        );
    }
    let Some(size) = spec
        .resources
        .as_ref()
        .and_then(|r| r.requests.as_ref())
        .and_then(|r| r.get("storage"))
        .cloned()
    else {
        return never(
            Never::Size,
            "the claim requests no storage size; set spec.resources.requests.storage".into(),
        );
    };
    let size_bytes = match crate::protocol::quantity::parse_size(&size.0) {
        Ok(b) => b,
        Err(why) => {
            return never(
                Never::Size,
                format!("the claim's storage request {:?} {why}", size.0),
            );
        }
    };
    let source = match data_source_name(claim) {
        Ok(s) => s,
        Err(e) => return never(Never::DataSource, e.to_string()),
    };
    Ok(ClaimPlan {
        size,
        size_bytes,
        access_modes: modes,
        source,
    })
}

/// Why a clone's source does not allow the copy (yet).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum SourceRefusal {
    /// Not yet: the source is not Bound, or its PV could not be read. The claim keeps its node
    /// and is tried again.
    Wait(String),
    /// Never (a new claim is needed): the message says why.
    Never(String),
}

impl SourceRefusal {
    /// The message for the claim's event.
    pub(crate) fn message(&self) -> &str {
        match self {
            Self::Wait(m) | Self::Never(m) => m,
        }
    }
}

/// The first part of [`check_clone_source`], which needs no PV: the source claim
/// `namespace/source_name` (as read in the new claim's own namespace) exists, is that claim, and
/// is Bound; `Ok` is the name of its PV. Shared with the scheduler extender, which counts a clone
/// against a node only once its source passes this.
pub(crate) fn source_claim_ready<'a>(
    namespace: &str,
    source_name: &str,
    source_claim: Option<&'a PersistentVolumeClaim>,
) -> Result<&'a str, SourceRefusal> {
    let what = format!("its source claim {namespace}/{source_name}");
    let Some(sc) = source_claim else {
        return Err(SourceRefusal::Never(format!(
            "{what} does not exist (a source must be a claim of the same namespace); nothing was created"
        )));
    };
    if sc.metadata.namespace.as_deref() != Some(namespace)
        || sc.metadata.name.as_deref() != Some(source_name)
    {
        return Err(SourceRefusal::Never(format!(
            "{what} is not the claim read; nothing was created"
        )));
    }
    let bound_to = sc
        .spec
        .as_ref()
        .and_then(|s| s.volume_name.as_deref())
        .filter(|v| !v.is_empty());
    let phase = sc.status.as_ref().and_then(|s| s.phase.as_deref());
    let (Some(pv_name), Some("Bound")) = (bound_to, phase) else {
        return Err(SourceRefusal::Wait(format!(
            "{what} is not Bound yet; waiting (a clone copies a provisioned volume)"
        )));
    };
    Ok(pv_name)
}

/// Why a claim's `dataSource` is not one flexvol copies ([`data_source_name`]): either way the
/// claim is never provisioned ([`Never::DataSource`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum DataSourceError {
    /// Another kind, or another group's, than the core `PersistentVolumeClaim` (`group/kind` as
    /// written).
    #[error(
        "its dataSource is a {0:?}; flexvol copies only a PersistentVolumeClaim of the same namespace and class; nothing was created"
    )]
    NotAClaim(String),
    /// A name that is not a claim name (a path, another namespace's, not DNS-1123).
    #[error(
        "its dataSource names {0:?}, which is not a claim name (a source must be a claim of the claim's own namespace, named by its name alone); nothing was created"
    )]
    NotAName(String),
}

/// The claim name a claim's `dataSource` asks to copy (`None`: no data source). Only
/// `{kind: PersistentVolumeClaim}` of the core group is taken (a clone of a claim of the same
/// namespace: a `dataSource` has no namespace field), and its name must be a DNS-1123 subdomain,
/// as a claim's name is, before it is used in any API path (the API server checks only that it
/// is not empty: `other-ns/x` or `../x` would otherwise reach the URL).
pub(crate) fn data_source_name(
    claim: &PersistentVolumeClaim,
) -> Result<Option<String>, DataSourceError> {
    let Some(ds) = claim.spec.as_ref().and_then(|s| s.data_source.as_ref()) else {
        return Ok(None);
    };
    let group = ds.api_group.as_deref().unwrap_or("");
    if ds.kind != "PersistentVolumeClaim" || !group.is_empty() {
        let kind = if group.is_empty() {
            ds.kind.clone()
        } else {
            format!("{}/{}", group, ds.kind)
        };
        return Err(DataSourceError::NotAClaim(kind));
    }
    let n = ds.name.as_str();
    let valid = !n.is_empty()
        && n.len() <= 253
        && n.split('.').all(|l| {
            !l.is_empty()
                && l.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !l.starts_with('-')
                && !l.ends_with('-')
        });
    if !valid {
        return Err(DataSourceError::NotAName(n.to_owned()));
    }
    Ok(Some(n.to_owned()))
}

/// Whether the claim `namespace/source_name` may be copied into a new volume of `class_name`
/// made by `provisioner` of at least `size_bytes`, on `node` for a node-local kind (`None` for a
/// shared kind); `Err` says why not (wait, or never), for the claim's event. `source_claim` is the source claim as
/// read from the server in the new claim's own namespace (so another tenant's claim is never
/// even read), `source_pv` the PV it is bound to. The rules (tenant isolation first):
/// - the source is a claim of the same namespace, Bound, and the PV's `claimRef` names that very
///   claim (namespace, name and uid): a claim never copies another tenant's volume;
/// - the PV was provisioned by `provisioner` (the same ownership annotation delete checks; the
///   backend checks its own marks again before reading a byte) and has the same StorageClass;
/// - a node-local source lives on `node` (the copy is made where the data is);
/// - the request is at least the source's size ([`ANN_SIZE`], else its capacity).
#[allow(clippy::too_many_arguments)]
pub(crate) fn check_clone_source(
    namespace: &str,
    class_name: &str,
    provisioner: &str,
    node: Option<&str>,
    size_bytes: u64,
    source_name: &str,
    source_claim: Option<&PersistentVolumeClaim>,
    source_pv: Option<&PersistentVolume>,
) -> Result<(), SourceRefusal> {
    let what = format!("its source claim {namespace}/{source_name}");
    let pv_name = source_claim_ready(namespace, source_name, source_claim)?;
    let Some(pv) = source_pv.filter(|v| v.metadata.name.as_deref() == Some(pv_name)) else {
        return Err(SourceRefusal::Wait(format!(
            "{what} is bound to PV {pv_name}, which cannot be read; retrying"
        )));
    };
    let never = |m: String| -> Result<(), SourceRefusal> { Err(SourceRefusal::Never(m)) };
    let source_uid = source_claim.and_then(|c| c.metadata.uid.as_deref());
    let ann = |k: &str| {
        pv.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(k))
            .map(String::as_str)
    };
    let spec = pv.spec.as_ref();
    let cref = spec.and_then(|s| s.claim_ref.as_ref());
    if cref.and_then(|r| r.namespace.as_deref()) != Some(namespace)
        || cref.and_then(|r| r.name.as_deref()) != Some(source_name)
        || cref.and_then(|r| r.uid.as_deref()).is_none()
        || cref.and_then(|r| r.uid.as_deref()) != source_uid
    {
        return never(format!(
            "{what}: PV {pv_name} is not bound to that claim; nothing was created"
        ));
    }
    if ann(crate::vocab::ANN_PROVISIONED_BY) != Some(provisioner) {
        return never(format!(
            "{what}: PV {pv_name} was not provisioned by {provisioner}; flexvol copies only volumes it made, of the same class; nothing was created"
        ));
    }
    let src_class = spec
        .and_then(|s| s.storage_class_name.as_deref())
        .unwrap_or("");
    if src_class != class_name {
        return never(format!(
            "{what} is of StorageClass {src_class:?}, not {class_name:?}; a clone must be of its source's class; nothing was created"
        ));
    }
    if pv.metadata.deletion_timestamp.is_some() {
        return never(format!(
            "{what}: PV {pv_name} is being deleted; nothing was created"
        ));
    }
    if let Some(node) = node {
        let src_node = ann(ANN_NODE).unwrap_or("");
        if src_node != node {
            return never(format!(
                "{what} lives on node {src_node:?}, and this claim's pod was scheduled to {node:?}: a node-local volume is copied on the node that holds it; schedule the pod to {src_node:?} (nodeAffinity/nodeSelector) and recreate the claim; nothing was created"
            ));
        }
    }
    let src_size = ann(ANN_SIZE)
        .and_then(|s| s.parse::<u64>().ok())
        .or_else(|| {
            spec.and_then(|s| s.capacity.as_ref())
                .and_then(|c| c.get("storage"))
                .and_then(|q| crate::protocol::quantity::parse_size(&q.0).ok())
        });
    let Some(src_size) = src_size else {
        return never(format!(
            "{what}: PV {pv_name} has no size; nothing was created"
        ));
    };
    if size_bytes < src_size {
        return never(format!(
            "it requests {size_bytes} bytes, less than its source {namespace}/{source_name} ({src_size} bytes); a clone is at least as large as its source: request {src_size} or more; nothing was created"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod clone_tests {
    use super::*;

    const P: &str = "flexvol/hostpath";

    fn claim(
        ns: &str,
        name: &str,
        uid: &str,
        volume: Option<&str>,
        phase: &str,
    ) -> PersistentVolumeClaim {
        serde_json::from_value(serde_json::json!({
            "metadata": {"namespace": ns, "name": name, "uid": uid},
            "spec": {"volumeName": volume, "storageClassName": "local"},
            "status": {"phase": phase}
        }))
        .unwrap()
    }

    #[allow(clippy::too_many_arguments)]
    fn pv(
        name: &str,
        ns: &str,
        claim: &str,
        uid: &str,
        by: &str,
        class: &str,
        node: &str,
        size: u64,
    ) -> PersistentVolume {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "annotations": {
                "pv.kubernetes.io/provisioned-by": by, ANN_NODE: node, ANN_SIZE: size.to_string()}},
            "spec": {"storageClassName": class,
                     "claimRef": {"namespace": ns, "name": claim, "uid": uid}}
        }))
        .unwrap()
    }

    /// The source `a/src` (uid u1) bound to `pvc-u1`, ours, class `local`, on node `n`, 1 MiB.
    fn fixture() -> (PersistentVolumeClaim, PersistentVolume) {
        (
            claim("a", "src", "u1", Some("pvc-u1"), "Bound"),
            pv("pvc-u1", "a", "src", "u1", P, "local", "n", 1 << 20),
        )
    }

    fn check(
        ns: &str,
        node: Option<&str>,
        size: u64,
        sc: Option<&PersistentVolumeClaim>,
        v: Option<&PersistentVolume>,
    ) -> Result<(), String> {
        check_clone_source(ns, "local", P, node, size, "src", sc, v)
            .map_err(|e| e.message().to_owned())
    }

    /// Only a source that is not Bound yet, or whose PV cannot be read, is waited for; every
    /// other refusal is for good (the provisioner then sends the claim back).
    #[test]
    fn waiting_is_told_apart_from_never() {
        let (sc, v) = fixture();
        let typed =
            |ns, node, size, sc, v| check_clone_source(ns, "local", P, node, size, "src", sc, v);
        let unbound = claim("a", "src", "u1", None, "Pending");
        assert!(matches!(
            typed("a", Some("n"), 1 << 20, Some(&unbound), None),
            Err(SourceRefusal::Wait(_))
        ));
        assert!(matches!(
            typed("a", Some("n"), 1 << 20, Some(&sc), None),
            Err(SourceRefusal::Wait(_))
        ));
        for (ns, node, size, sc) in [
            ("b", Some("n"), 1 << 20, None),
            ("a", Some("m"), 1 << 20, Some(&sc)),
            ("a", Some("n"), (1 << 20) - 1, Some(&sc)),
        ] {
            assert!(
                matches!(
                    typed(ns, node, size, sc, Some(&v)),
                    Err(SourceRefusal::Never(_))
                ),
                "{ns} {node:?} {size}"
            );
        }
    }

    #[test]
    fn same_namespace_class_node_and_size_is_accepted() {
        let (sc, v) = fixture();
        assert_eq!(check("a", Some("n"), 1 << 20, Some(&sc), Some(&v)), Ok(()));
        assert_eq!(check("a", Some("n"), 2 << 20, Some(&sc), Some(&v)), Ok(()));
        // A shared kind (NFS): any node.
        assert_eq!(check("a", None, 1 << 20, Some(&sc), Some(&v)), Ok(()));
    }

    #[test]
    fn another_namespace_is_refused() {
        let (sc, v) = fixture();
        // The reconciler reads the source in the new claim's namespace: another tenant's claim
        // of that name is not found, and nothing else is read.
        let e = check("b", Some("n"), 1 << 20, None, None).unwrap_err();
        assert!(e.contains("b/src does not exist"), "{e}");
        // Were a claim of another namespace handed in anyway, it is refused.
        let e = check("b", Some("n"), 1 << 20, Some(&sc), Some(&v)).unwrap_err();
        assert!(e.contains("not the claim read"), "{e}");
        // A PV whose claimRef names another namespace's claim (or another uid) is refused.
        let other = pv("pvc-u1", "b", "src", "u1", P, "local", "n", 1 << 20);
        let e = check("a", Some("n"), 1 << 20, Some(&sc), Some(&other)).unwrap_err();
        assert!(e.contains("not bound to that claim"), "{e}");
        let other = pv("pvc-u1", "a", "src", "u9", P, "local", "n", 1 << 20);
        assert!(check("a", Some("n"), 1 << 20, Some(&sc), Some(&other)).is_err());
    }

    #[test]
    fn another_class_or_not_ours_is_refused() {
        let (sc, _) = fixture();
        let v = pv("pvc-u1", "a", "src", "u1", P, "other", "n", 1 << 20);
        let e = check("a", Some("n"), 1 << 20, Some(&sc), Some(&v)).unwrap_err();
        assert!(e.contains("StorageClass \"other\""), "{e}");
        let v = pv(
            "pvc-u1",
            "a",
            "src",
            "u1",
            "someone/else",
            "local",
            "n",
            1 << 20,
        );
        let e = check("a", Some("n"), 1 << 20, Some(&sc), Some(&v)).unwrap_err();
        assert!(e.contains("not provisioned by flexvol/hostpath"), "{e}");
        let v = pv(
            "pvc-u1",
            "a",
            "src",
            "u1",
            "flexvol/lvm",
            "local",
            "n",
            1 << 20,
        );
        assert!(check("a", Some("n"), 1 << 20, Some(&sc), Some(&v)).is_err());
    }

    #[test]
    fn another_node_is_refused() {
        let (sc, v) = fixture();
        let e = check("a", Some("m"), 1 << 20, Some(&sc), Some(&v)).unwrap_err();
        assert!(e.contains("lives on node \"n\""), "{e}");
    }

    #[test]
    fn a_smaller_request_is_refused() {
        let (sc, v) = fixture();
        let e = check("a", Some("n"), (1 << 20) - 1, Some(&sc), Some(&v)).unwrap_err();
        assert!(e.contains("less than its source"), "{e}");
    }

    #[test]
    fn an_unbound_source_waits() {
        let sc = claim("a", "src", "u1", None, "Pending");
        let e = check("a", Some("n"), 1 << 20, Some(&sc), None).unwrap_err();
        assert!(e.contains("not Bound"), "{e}");
        let (sc, _) = fixture();
        let e = check("a", Some("n"), 1 << 20, Some(&sc), None).unwrap_err();
        assert!(e.contains("cannot be read"), "{e}");
    }

    #[test]
    fn only_a_claim_named_by_a_plain_name_is_a_source() {
        let with = |ds: serde_json::Value| -> PersistentVolumeClaim {
            serde_json::from_value(serde_json::json!({"spec": {"dataSource": ds}})).unwrap()
        };
        assert_eq!(
            data_source_name(&PersistentVolumeClaim::default()),
            Ok(None)
        );
        assert_eq!(
            data_source_name(&with(
                serde_json::json!({"kind": "PersistentVolumeClaim", "name": "src"})
            )),
            Ok(Some("src".into()))
        );
        for bad in [
            "other-ns/src",
            "../src",
            "Src",
            "",
            "a..b",
            "-a",
            &"x".repeat(254),
        ] {
            let e = data_source_name(&with(
                serde_json::json!({"kind": "PersistentVolumeClaim", "name": bad}),
            ));
            assert_eq!(e, Err(DataSourceError::NotAName(bad.to_owned())), "{bad:?}");
        }
        let e = data_source_name(&with(serde_json::json!({
            "apiGroup": "snapshot.storage.k8s.io", "kind": "VolumeSnapshot", "name": "s"})))
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            "its dataSource is a \"snapshot.storage.k8s.io/VolumeSnapshot\"; flexvol copies only a PersistentVolumeClaim of the same namespace and class; nothing was created"
        );
        assert_eq!(
            data_source_name(&with(serde_json::json!({
            "apiGroup": "x.io", "kind": "PersistentVolumeClaim", "name": "s"}))),
            Err(DataSourceError::NotAClaim(
                "x.io/PersistentVolumeClaim".into()
            ))
        );
        assert_eq!(
            DataSourceError::NotAName("../x".into()).to_string(),
            "its dataSource names \"../x\", which is not a claim name (a source must be a claim of the claim's own namespace, named by its name alone); nothing was created"
        );
    }
}

#[cfg(test)]
mod refusal_tests {
    use super::*;

    #[test]
    fn only_the_typed_server_refusal_is_the_servers_and_each_keeps_its_message() {
        let words = "NFS server 192.0.2.1 did not answer: unreachable, mount timed out";
        for r in [
            Refusal::Fail(words.into()),
            Refusal::Reschedule(words.into()),
            Refusal::Wait(format!("waiting: {words}")),
        ] {
            assert_eq!(r.server_failure(), None, "{r:?}");
        }
        assert_eq!(
            Refusal::Unavailable(words.into()).server_failure(),
            Some(words)
        );
        let w = Refusal::Wait("waiting: its source volume pv-1 is mounted".into());
        assert_eq!(w.message(), "waiting: its source volume pv-1 is mounted");
    }
}
