//! The seam between the reconcile loop and the storage: one [`Provisioner`] per kind of volume the
//! provisioner makes (`hostpath`, `lvm`, `nfs`).
//!
//! The reconciler ([`super::reconcile`]) reads the API server and decides *which* claim, PV or
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
//! Calls are synchronous and run on their lane's own thread ([`super::lanes`]): a lane works on
//! one object at a time; a slow call holds up only its lane, and the watches buffer meanwhile.

pub use super::error::ProvisionError;
use crate::node::config::Config;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use std::collections::BTreeMap;

/// PV annotation: the node whose provisioner made it (and, for node-local volumes, owns it).
pub const ANN_NODE: &str = "flexvol/node";
/// PV annotation: the size in bytes the backend really provisioned (or grew to), which may exceed
/// the request (LVM rounds up to extents). The resize logic compares claims against it, not
/// against the PV's capacity, which kube-controller-manager raises by itself on a resize.
pub const ANN_SIZE: &str = "flexvol/size-bytes";
/// PV annotation: `"true"` when the backend enforces the size (an LV, a project quota), `"false"`
/// with the reason in [`ANN_SIZE_NOTE`] otherwise.
pub const ANN_SIZE_ENFORCED: &str = "flexvol/size-enforced";
/// PV annotation: why the size is not enforced, for people and `flexvol status`.
pub const ANN_SIZE_NOTE: &str = "flexvol/size-note";

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
    pub node_finishes_resize: bool,
}

/// One kind of volume (sig-storage-lib-external-provisioner's word).
pub trait Provisioner {
    /// What this kind is (its constant).
    fn kind(&self) -> &'static Kind;

    /// Whether this node can serve this kind now, per its config (the provisioner advises the
    /// operator when the node's label says otherwise).
    fn serves(&self, cfg: &Config, node: &str) -> bool;

    /// Validates a class's `parameters` (unknown keys are errors). Called before anything exists.
    fn check_class(&self, params: &BTreeMap<String, String>) -> Result<(), ProvisionError>;

    /// The fault domain of a class's parameters or a PV's flexVolume options (both name it the
    /// same way): the server whose failure would fail every claim on it. Work for a domain whose
    /// breaker is open fails fast ([`super::queue::Breakers`]). `None` (the default): node-local
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
}
