//! The decisions: from what the API and the node say, what to do for one claim or one PV, done
//! idempotently.
//!
//! The lanes ([`crate::provision::lanes`]) call [`Reconciler::refresh`] (steps 1 and 2) before each batch of
//! work, then [`Reconciler::sync`] for each [`Key`] due (steps 4 to 6 for that object); the sweep
//! does step 3. [`Reconciler::pass`] is all of it at once over everything the cluster seam lists
//! (what the tests drive). The work is the same for every kind of volume; what differs is behind
//! the [`Provisioner`](crate::provision::storage::Provisioner) seam (`hostpath`, `lvm`, `nfs`). The steps:
//! 1. lets each backend finish what a kill left half done (tombstones);
//! 2. reads this node's Node (never writes it: the token has no Node write): its hostname label,
//!    which node-local PVs pin to, and whether it may make node-local volumes at all (not when
//!    cordoned or a control-plane node, see [`unfit_for_local_volumes`]); where the node's labels
//!    `<vendor>/<kind>=true`, which the operator sets for classes with `allowedTopologies`,
//!    disagree with what it can serve, it advises the operator once;
//! 3. for every PV of ours whose token does not name its claim's namespace (none, or an older
//!    `v1.` one) — hostPath and LVM PVs of this node, NFS PVs of any node — writes a grant so the
//!    drivers serve it to that PV in its claim's namespace only
//!    ([`crate::node::capability::write_legacy_grant`]); grants of PVs that are gone are removed;
//!    and gives old volume directories their root-only ownership records
//!    ([`Reconciler::adopt_old_volumes`]);
//! 4. every pending claim of one of our classes without a PV — for a node-local backend only those
//!    whose `selected-node` is this node, for a shared one (NFS) any — : validate class and claim,
//!    let the backend make the volume, create `pvc-<claim uid>`; when this node may not or cannot
//!    serve it, remove `selected-node` so the scheduler picks again, with an event that says why.
//!    What to do is decided first, with no call ([`decide_claim`]: from the claim, its class as
//!    the StorageClass watch cache holds it, whether its PV is cached, and this node as the batch
//!    read it), then done (the clone source read from the server, the volume, the PV, the events);
//! 5. every Bound PV of ours whose claim asks for more than the PV's
//!    [`ANN_SIZE`](crate::vocab::ANN_SIZE): grow it through the backend, then raise the PV's
//!    capacity and, where kubelet does not finish the resize, record it on the claim;
//! 6. every PV we provisioned (on this node, for a node-local backend), by what `fate` says:
//!    with reclaim policy Delete, once Released or — when it was deleted first — once its claim is
//!    gone (asked of the server): re-read it from the server, let the backend remove the volume
//!    (it checks the ownership marks), delete the PV (with a uid precondition), then remove our
//!    finalizer ([`FINALIZER`], on every PV we make); a deleted PV of another policy: remove the
//!    finalizer only, the volume stays; a PV of an older version without the finalizer: add it;
//!    a PV that is kept and whose size is enforced: the backend checks that it still is and puts
//!    back what a pod changed ([`Provisioner::check_size`]: a hostPath directory moved out of its
//!    project), with a `QuotaDrift` event on the PV and [`Report::quota_drift`].
//!
//! Work on a backend's fault domain (an NFS server, [`Provisioner::fault_domain`]) goes through
//! its breaker ([`Breakers`]): after a failure that is the server's ([`Refusal::Unavailable`],
//! [`ProvisionError::Unavailable`]: typed where the server is asked, never judged by a message),
//! the next claims and PVs on that server fail fast, with an event that says so, until one
//! attempt after the breaker's delay; other servers are not affected.
//!
//! Restart safety: every step is keyed by names derived from the claim (PV `pvc-<uid>`, the
//! directory or LV named after it), so a pass after a kill at any point finds what the killed one
//! did and continues: the backend reuses a volume it made for this PV, `AlreadyExists` for a PV that
//! is ours and bound to this claim is success, a volume already gone is success, a PV whose volume
//! was removed stays (held by its finalizer) until the finalizer is removed, a resize is
//! re-driven by the claim's request until the PV's annotation records it.

use crate::k8s::error::{ApiError, ApiErrorKind, ApiResult};
use crate::k8s::events::EventSpec;
use crate::k8s::queue::{Backoff, Breakers};
use crate::node::capability;
use crate::node::config::Config;
use crate::protocol::quantity::{self, parse_size};
use crate::provision::cluster::Cluster;
use crate::provision::storage::{
    ClaimPlan, ClassError, Kind, ProvisionError, Provisioned, Provisioner, Refusal, Request,
    SizeCheck, SourceRefusal, awaits_volume, check_clone_source, plan_claim,
};
use crate::sys::process::checkpoint;
use crate::vocab::LABEL_KIND;
use crate::vocab::LABEL_NODE;
use crate::vocab::{ANN_NODE, ANN_SIZE};
use crate::vocab::{
    ANN_PROVISIONED_BY, ANN_PROVISIONER, ANN_PROVISIONER_BETA, ANN_SELECTED_NODE, FINALIZER,
    HOSTNAME_LABEL,
};
use k8s_openapi::api::core::v1::{
    CSIPersistentVolumeSource, FlexPersistentVolumeSource, Node, NodeSelector,
    NodeSelectorRequirement, NodeSelectorTerm, ObjectReference, PersistentVolume,
    PersistentVolumeClaim, PersistentVolumeSpec, VolumeNodeAffinity,
};
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::Instant;

/// `node` as a label value: itself when it is one (at most 63 characters of `[A-Za-z0-9._-]`,
/// alphanumeric at both ends), else `h-` and a 64-bit FNV-1a hash of it in hex (a node name may be
/// 253 characters). A collision only makes two nodes watch each other's PVs.
pub(crate) fn node_label_value(node: &str) -> String {
    let ok = !node.is_empty()
        && node.len() <= 63
        && node
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        && node.as_bytes()[0].is_ascii_alphanumeric()
        && node.as_bytes()[node.len() - 1].is_ascii_alphanumeric();
    if ok {
        return node.to_owned();
    }
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in node.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("h-{h:016x}")
}

/// What a lane works on: a claim (`namespace/name`) or a PV (`name`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum Key {
    /// A claim, `namespace/name`.
    Claim(String),
    /// A PV, by name.
    Volume(String),
}

/// Who this provisioner is.
#[derive(Debug, Clone)]
pub(crate) struct Identity {
    /// This node's name.
    pub node: String,
    /// Vendor part of the names: a backend of kind `k` serves classes whose provisioner is
    /// `<vendor>/<k>`, which is also its PVs' flexVolume driver and the key of the Node label
    /// the operator sets for it.
    pub(crate) vendor: String,
}

impl Identity {
    /// `<vendor>/<kind>`.
    pub(crate) fn provisioner(&self, kind: &str) -> String {
        format!("{}/{kind}", self.vendor)
    }
}

/// What a pass did, for the log and the tests.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Report {
    /// PVs created (or found created) with where their volume lives.
    pub provisioned: Vec<(String, String)>,
    /// PVs deleted, with what was done to their volume.
    pub deleted: Vec<(String, String)>,
    /// PVs grown, with their new size in bytes.
    pub resized: Vec<(String, u64)>,
    /// Claims sent back to the scheduler.
    pub rescheduled: Vec<String>,
    /// Claims that can never be provisioned as written whose `selected-node` was removed (also
    /// in `failed`).
    pub refused: Vec<String>,
    /// Failures (also sent as events where there is an object to attach them to).
    pub failed: Vec<String>,
    /// Work held back for another controller, not failed: claims whose resize is recorded only
    /// once kube-controller-manager's expand controller has done its part
    /// ([`Reconciler::kcm_done_with`]). Their keys come back after the backoff like a failure's,
    /// or at once when the claim changes.
    pub deferred: Vec<String>,
    /// Advice to the operator about this node's labels (said once per change).
    pub advice: Vec<String>,
    /// PVs of ours made before the finalizer that were given it now.
    pub protected: Vec<String>,
    /// PVs deleted with reclaim policy other than Delete whose finalizer was removed (the volume
    /// kept).
    pub released: Vec<String>,
    /// Every provision, delete and resize attempted, with its outcome and duration (the metrics).
    pub ops: Vec<Op>,
    /// Claims and PVs in the watch caches when the pass read them.
    pub seen: (usize, usize),
    /// PVs of ours made before the labels that were given them (the sweep).
    pub labelled: Vec<String>,
    /// PVs whose enforced size had drifted (a hostPath directory moved out of its project or
    /// without its inherit flag), with what was found and whether it was put back.
    pub quota_drift: Vec<(String, String)>,
}

/// The reason of the event on a PV whose enforced size drifted ([`Provisioner::check_size`]).
pub(crate) const QUOTA_DRIFT: &str = "QuotaDrift";

/// What step 6 does with a PV of ours.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fate {
    /// Nothing (yet).
    Keep,
    /// Made before the finalizer: add it.
    Protect,
    /// Deleted, reclaim policy other than Delete: remove the finalizer, keep the volume.
    Release,
    /// Reclaim policy Delete and Released, or deleted with its claim gone: remove the volume,
    /// delete the PV, remove the finalizer.
    Reclaim,
}

fn has_finalizer(v: &PersistentVolume) -> bool {
    v.metadata
        .finalizers
        .as_deref()
        .unwrap_or_default()
        .iter()
        .any(|f| f == FINALIZER)
}

/// What step 6 does with `v` (whatever its owner); `claim_gone`: its claim (`spec.claimRef`, by
/// uid) does not exist.
///
/// A PV made before the finalizer that is deleted and Released is left alone as before: the
/// object may linger under another controller's finalizer, and its volume was handled while it
/// was Released and not yet deleted.
fn fate(v: &PersistentVolume, claim_gone: bool) -> Fate {
    let spec = v.spec.as_ref();
    let deleting = v.metadata.deletion_timestamp.is_some();
    let guarded = has_finalizer(v);
    let delete = spec.and_then(|s| s.persistent_volume_reclaim_policy.as_deref()) == Some("Delete");
    let released = v.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Released");
    if delete && (released || (deleting && claim_gone)) && (guarded || !deleting) {
        Fate::Reclaim
    } else if deleting && guarded && !delete {
        Fate::Release
    } else if !deleting && !guarded {
        Fate::Protect
    } else {
        Fate::Keep
    }
}

/// What an attempt was.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Action {
    /// Make a volume and its PV for a claim.
    Provision,
    /// Remove a Released PV's volume and the PV.
    Delete,
    /// Grow a bound PV's volume.
    Resize,
}

/// How an attempt ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Outcome {
    /// Done.
    Success,
    /// Failed; the next pass tries again.
    Failure,
    /// Provision only: this node cannot serve the claim, sent back to the scheduler.
    Rescheduled,
}

/// One attempt of a pass: what, for which kind (`hostpath`, `lvm`, `nfs`), how it ended, how long
/// it took (API calls included).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Op {
    /// What was attempted.
    pub action: Action,
    /// The backend's kind name.
    pub kind: &'static str,
    /// How it ended.
    pub(crate) outcome: Outcome,
    /// Wall time of the attempt.
    pub(crate) took: std::time::Duration,
}

/// The lengths of a report's lists before a step, to tell what the step did (see [`Report::op`]).
#[derive(Clone, Copy)]
struct Mark {
    done: usize,
    rescheduled: usize,
    failed: usize,
    at: std::time::Instant,
}

impl Report {
    /// Adds what `other` did to this report (`seen` is left as it is).
    pub(crate) fn merge(&mut self, other: Report) {
        self.provisioned.extend(other.provisioned);
        self.deleted.extend(other.deleted);
        self.resized.extend(other.resized);
        self.rescheduled.extend(other.rescheduled);
        self.refused.extend(other.refused);
        self.failed.extend(other.failed);
        self.deferred.extend(other.deferred);
        self.advice.extend(other.advice);
        self.protected.extend(other.protected);
        self.released.extend(other.released);
        self.ops.extend(other.ops);
        self.labelled.extend(other.labelled);
        self.quota_drift.extend(other.quota_drift);
    }

    fn mark(&self, action: Action) -> Mark {
        Mark {
            done: match action {
                Action::Provision => self.provisioned.len(),
                Action::Delete => self.deleted.len(),
                Action::Resize => self.resized.len(),
            },
            rescheduled: self.rescheduled.len(),
            failed: self.failed.len(),
            at: std::time::Instant::now(),
        }
    }

    /// Records what the step since `m` did for `kind` as an [`Op`] (nothing when it did nothing:
    /// a claim not ours, a resize not asked for, a PV no longer to delete).
    fn op(&mut self, action: Action, kind: &'static str, m: Mark) {
        let now = self.mark(action);
        let outcome = if now.done > m.done {
            Outcome::Success
        } else if now.rescheduled > m.rescheduled {
            Outcome::Rescheduled
        } else if now.failed > m.failed {
            Outcome::Failure
        } else {
            return;
        };
        self.ops.push(Op {
            action,
            kind,
            outcome,
            took: m.at.elapsed(),
        });
    }
}

/// What a pass knows about this node.
#[derive(Debug, Default, Clone)]
struct Here {
    /// Its `kubernetes.io/hostname` label, what node-local PVs pin to (`None`: the Node could not
    /// be read, and node-local claims wait for a pass that can read it).
    hostname: Option<String>,
    /// Why it must not make node-local volumes (`None`: it may).
    unfit: Option<String>,
}

/// Label and taint keys that mark a control-plane node (1.20 sets the first, later releases the
/// second).
pub(crate) const CONTROL_PLANE_KEYS: [&str; 2] = [
    "node-role.kubernetes.io/master",
    "node-role.kubernetes.io/control-plane",
];

/// Why a node must not make a node-local volume for a claim that names it in `selected-node`
/// (`None`: it may). The scheduler never places an ordinary pod on a cordoned node or on a
/// control-plane node, but a claim's author can write `selected-node` themselves: without this
/// check, any claim could make any node create directories or LVs with no pod there.
pub(crate) fn unfit_for_local_volumes(n: &Node) -> Option<String> {
    let spec = n.spec.as_ref();
    if spec.and_then(|s| s.unschedulable) == Some(true) {
        return Some(
            "it is cordoned (spec.unschedulable); no node-local volume is made on it".into(),
        );
    }
    let taints = spec.and_then(|s| s.taints.as_deref()).unwrap_or_default();
    if let Some(t) = taints.iter().find(|t| {
        CONTROL_PLANE_KEYS.contains(&t.key.as_str())
            && (t.effect == "NoSchedule" || t.effect == "NoExecute")
    }) {
        return Some(format!(
            "it is a control-plane node (taint {}:{}); no node-local volume is made on it",
            t.key, t.effect
        ));
    }
    let labels = n.metadata.labels.as_ref();
    if let Some(k) = CONTROL_PLANE_KEYS
        .iter()
        .find(|k| labels.is_some_and(|l| l.contains_key(**k)))
    {
        return Some(format!(
            "it is a control-plane node (label {k}); no node-local volume is made on it"
        ));
    }
    None
}

/// The reconciler: the cluster seam, who we are, the backends, and which events were said.
pub(crate) struct Reconciler<C> {
    /// The API seam.
    pub(crate) cluster: C,
    /// Who we are.
    pub(crate) id: Identity,
    backends: Vec<Box<dyn Provisioner>>,
    /// Per backend: whether this node serves it, as of this pass.
    serving: Vec<bool>,
    said: HashMap<(String, &'static str), String>,
    /// Claims told that their node-local class must use WaitForFirstConsumer (by uid).
    told_wffc: HashSet<String>,
    /// Per label key: the advice last given about it.
    advised: HashMap<String, String>,
    /// What the last [`Reconciler::refresh`] read of this node.
    here: Here,
    /// One breaker per fault domain (an NFS server).
    breakers: Breakers,
    /// Claims (by uid) whose resize is ready to be recorded, held for kube-controller-manager
    /// ([`Reconciler::kcm_done_with`]), since when; an entry leaves when the claim is written.
    pub(crate) resize_held: HashMap<String, std::time::Instant>,
    /// How long a claim is held at most ([`RESIZE_HOLD`]; tests shorten it).
    pub(crate) resize_hold: std::time::Duration,
}

/// How long the status write of a flexVolume claim's finished resize waits at most for
/// kube-controller-manager's expand controller to do its part ([`Reconciler::kcm_done_with`]).
/// It normally takes milliseconds; a controller manager whose expand controller is off never
/// does it, and the claim is then finished after this.
pub(crate) const RESIZE_HOLD: std::time::Duration = std::time::Duration::from_secs(15);

enum Step {
    /// Nothing to do for this claim (not ours, not this node, already provisioned).
    Skip,
    /// Done.
    Done(String, String),
    /// This node cannot serve it: send it back to the scheduler.
    Reschedule(String),
    /// It cannot be provisioned now (a step failed, its source is not ready); say so and leave
    /// nothing behind; the claim keeps its node and is tried again.
    Fail(String),
    /// It can never be provisioned as asked ([`crate::provision::storage::Never`]): say why and what to
    /// change, and remove its `selected-node`, so that it holds no node (the scheduler
    /// extender would not count it anyway: the same [`plan_claim`] decides).
    Never(String),
}

fn ann<'a>(meta: &'a ObjectMeta, key: &str) -> Option<&'a str> {
    meta.annotations
        .as_ref()
        .and_then(|a| a.get(key))
        .map(String::as_str)
}

fn claim_ref(c: &PersistentVolumeClaim) -> String {
    format!(
        "{}/{}",
        c.metadata.namespace.as_deref().unwrap_or(""),
        c.metadata.name.as_deref().unwrap_or("")
    )
}

/// The bytes of a `storage` quantity, `None` when absent or not a size.
fn storage_bytes(map: Option<&BTreeMap<String, Quantity>>) -> Option<u64> {
    map.and_then(|m| m.get("storage"))
        .and_then(|q| parse_size(&q.0).ok())
}

/// `bytes` as a quantity ([`quantity::format_size`]).
fn quantity(bytes: u64) -> Quantity {
    Quantity(quantity::format_size(bytes))
}

/// A claim's requested size in bytes.
fn requested(c: &PersistentVolumeClaim) -> Option<u64> {
    storage_bytes(
        c.spec
            .as_ref()
            .and_then(|s| s.resources.as_ref())
            .and_then(|r| r.requests.as_ref()),
    )
}

/// The class a claim names (`None`: none, or empty).
fn claim_class(c: &PersistentVolumeClaim) -> Option<&str> {
    c.spec
        .as_ref()
        .and_then(|s| s.storage_class_name.as_deref())
        .filter(|s| !s.is_empty())
}

/// What the decision for one claim ([`decide_claim`]) is made from, all read before it.
pub(crate) struct ClaimFacts<'a> {
    /// Who we are.
    pub(crate) id: &'a Identity,
    /// The backends (their kinds, and their class checks, which are pure).
    pub(crate) backends: &'a [Box<dyn Provisioner>],
    /// Per backend: whether this node serves it.
    pub(crate) serving: &'a [bool],
    /// What the last [`Reconciler::refresh`] read of this node.
    here: &'a Here,
    /// Whether the PV cache holds `pvc-<claim uid>` (made already).
    pub(crate) pv_made: bool,
    /// The claim's class as the class cache holds it (`Ok(None)`: no class of that name, or the
    /// claim names none; `Err`: the cache could not be read).
    pub(crate) class: &'a ApiResult<Option<Arc<StorageClass>>>,
}

/// What to do for one claim, decided without a call ([`decide_claim`]).
#[derive(Debug)]
pub(crate) enum Decision {
    /// Nothing: not ours, not this node's, not waiting for a volume, made already, its class
    /// missing or another provisioner's, or this node's Node not read yet.
    Skip,
    /// This node cannot serve it: send it back to the scheduler, saying why.
    Reschedule(String),
    /// Not now (its class could not be read); tried again.
    Fail(String),
    /// Never as written (the class's parameters, the claim's mode, size or access modes).
    Never(String),
    /// Make its volume and PV as planned.
    Make(Box<Make>),
}

/// A volume to make for a claim: everything the act step needs, validated.
#[derive(Debug)]
pub(crate) struct Make {
    /// The backend's index.
    pub(crate) bi: usize,
    /// Whether that backend is node-local.
    pub(crate) node_local: bool,
    /// Its provisioner name, `<vendor>/<kind>`.
    pub(crate) provisioner: String,
    /// The PV's name, `pvc-<claim uid>`.
    pub(crate) pv_name: String,
    /// The claim's uid, namespace and name.
    pub(crate) uid: String,
    pub(crate) namespace: String,
    pub(crate) name: String,
    /// The class's name and the class.
    pub(crate) class_name: String,
    pub(crate) class: Arc<StorageClass>,
    /// The class's parameters.
    pub(crate) params: BTreeMap<String, String>,
    /// The node hostname label a node-local PV pins to (`None` for a shared kind).
    pub(crate) pin: Option<String>,
    /// Size, access modes and clone source ([`plan_claim`]).
    pub(crate) plan: ClaimPlan,
}

/// Step 4's decision for claim `c`, from `f` alone: no API call, nothing awaited, nothing
/// written. The order of the checks is the order of the messages a claim gets.
pub(crate) fn decide_claim(c: &PersistentVolumeClaim, f: &ClaimFacts<'_>) -> Decision {
    let meta = &c.metadata;
    let Some(bi) = claim_provisioner(meta).and_then(|p| {
        f.backends
            .iter()
            .position(|b| f.id.provisioner(b.kind().name) == p)
    }) else {
        return Decision::Skip;
    };
    let kind = f.backends[bi].kind();
    let node_local = kind.node_local;
    let provisioner = f.id.provisioner(kind.name);
    // A shared kind is left to the instances that can serve it (one without mount.nfs would
    // only add failure events beside another's success).
    if (node_local && ann(meta, ANN_SELECTED_NODE) != Some(f.id.node.as_str()))
        || (!node_local && !f.serving.get(bi).copied().unwrap_or(false))
        || !awaits_volume(c)
    {
        return Decision::Skip;
    }
    let (Some(uid), Some(ns), Some(name)) = (&meta.uid, &meta.namespace, &meta.name) else {
        return Decision::Skip;
    };
    if f.pv_made {
        return Decision::Skip; // made already; the PV controller binds it
    }
    let Some(class_name) = claim_class(c) else {
        return Decision::Skip;
    };
    let class = match f.class {
        Ok(Some(sc)) if sc.provisioner == provisioner => sc.clone(),
        Ok(_) => return Decision::Skip,
        Err(e) => {
            return Decision::Fail(format!(
                "cannot read StorageClass {class_name}: {e}; retrying"
            ));
        }
    };
    // A node-local volume only on a node the scheduler could have put the claim's pod on.
    let pin = match (&f.here.hostname, &f.here.unfit) {
        (_, Some(why)) if node_local => return Decision::Reschedule(why.clone()),
        (None, _) if node_local => return Decision::Skip, // the Node could not be read: next pass
        (h, _) => node_local.then(|| h.clone()).flatten(),
    };

    // Validate everything before anything exists: the decision the scheduler extender
    // shares (a claim refused here is never counted against a node there).
    let params = class.parameters.clone().unwrap_or_default();
    let mut class_check = f.backends[bi].check_class(&params);
    // A CSI PV's mountOptions reach `flexvol csi` as mount flags, which it refuses for every kind
    // (NFS and LVM take theirs from the class parameter mountOptions, checked by the node's
    // policy): refused here, before anything exists, rather than at every pod's mount.
    if class_check.is_ok()
        && matches!(crate::vocab::class::csi_driver(&params), Ok(Some(_)))
        && class.mount_options.as_ref().is_some_and(|m| !m.is_empty())
    {
        class_check = Err(ClassError(format!(
            "StorageClass {class_name} has mountOptions and {}: flexvol csi takes no mount flags; move them to the class parameter mountOptions (nfs, lvm) or remove them",
            crate::vocab::class::CSI_DRIVER
        )));
    }
    let plan = match plan_claim(kind, class_name, class_check, c) {
        Ok(p) => p,
        Err(never) => return Decision::Never(never.message),
    };
    Decision::Make(Box::new(Make {
        bi,
        node_local,
        provisioner,
        pv_name: format!("pvc-{uid}"),
        uid: uid.clone(),
        namespace: ns.clone(),
        name: name.clone(),
        class_name: class_name.to_owned(),
        class,
        params,
        pin,
        plan,
    }))
}

/// Whether a pending claim of a node-local class with `Immediate` binding is to be told so
/// ([`Reconciler`]'s `immediate_binding`), decided without a call.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Immediate {
    /// Nothing to say (not such a claim, told already, its class missing or fine).
    Nothing,
    /// Its class could not be read (the error).
    Unread(String),
    /// Tell claim `uid` `message`.
    Tell {
        /// The claim's uid.
        uid: String,
        /// The event's message.
        message: String,
    },
}

/// The decision of [`Immediate`] for claim `c`: `told` are the claims told already (by uid),
/// `class` the claim's class as read.
pub(crate) fn decide_immediate(
    c: &PersistentVolumeClaim,
    id: &Identity,
    backends: &[Box<dyn Provisioner>],
    told: &HashSet<String>,
    class: &ApiResult<Option<Arc<StorageClass>>>,
) -> Immediate {
    let meta = &c.metadata;
    let Some(kind) = claim_provisioner(meta).and_then(|p| {
        backends
            .iter()
            .map(|b| b.kind())
            .find(|k| id.provisioner(k.name) == p)
    }) else {
        return Immediate::Nothing;
    };
    let Some(uid) = meta.uid.clone() else {
        return Immediate::Nothing;
    };
    let spec = c.spec.as_ref();
    if !kind.node_local
        || ann(meta, ANN_SELECTED_NODE).is_some()
        || meta.deletion_timestamp.is_some()
        || spec
            .and_then(|s| s.volume_name.as_deref())
            .is_some_and(|v| !v.is_empty())
        || c.status.as_ref().and_then(|s| s.phase.as_deref()) != Some("Pending")
        || told.contains(&uid)
    {
        return Immediate::Nothing;
    }
    let Some(class_name) = claim_class(c) else {
        return Immediate::Nothing;
    };
    let class = match class {
        Ok(Some(class)) => class,
        Ok(None) => return Immediate::Nothing,
        Err(e) => return Immediate::Unread(e.to_string()),
    };
    let provisioner = id.provisioner(kind.name);
    let mode = class.volume_binding_mode.as_deref().unwrap_or("Immediate");
    if class.provisioner != provisioner || mode == "WaitForFirstConsumer" {
        return Immediate::Nothing;
    }
    Immediate::Tell {
        uid,
        message: format!(
            "flexvol: StorageClass {class_name:?} has volumeBindingMode {mode}, but {provisioner} makes node-local volumes: the volume must be made on the node the claim's pod is scheduled to, which the scheduler says (volume.kubernetes.io/selected-node) only for volumeBindingMode: WaitForFirstConsumer; this claim is never provisioned. Use a class with volumeBindingMode: WaitForFirstConsumer (the field cannot be edited: create a new class) and recreate the claim"
        ),
    }
}

impl<C: Cluster> Reconciler<C> {
    /// A reconciler for `id` over `cluster`, serving `backends`.
    pub(crate) fn new(cluster: C, id: Identity, backends: Vec<Box<dyn Provisioner>>) -> Self {
        Self {
            cluster,
            id,
            serving: vec![false; backends.len()],
            backends,
            said: HashMap::new(),
            told_wffc: HashSet::new(),
            advised: HashMap::new(),
            here: Here::default(),
            breakers: Breakers::new(Backoff {
                base: std::time::Duration::from_secs(5),
                max: std::time::Duration::from_secs(300),
            }),
            resize_held: HashMap::new(),
            resize_hold: RESIZE_HOLD,
        }
    }

    /// Fault domains whose breaker is open (a metric).
    pub(crate) fn breakers_open(&self) -> usize {
        self.breakers.open_count()
    }

    /// Whether this instance serves any shared kind (it may then lead them).
    pub(crate) fn serves_shared(&self) -> bool {
        self.backends
            .iter()
            .zip(&self.serving)
            .any(|(b, s)| *s && !b.kind().node_local)
    }

    /// The backend whose provisioner name is `name`.
    fn backend_for(&self, name: &str) -> Option<usize> {
        self.backends
            .iter()
            .position(|b| self.id.provisioner(b.kind().name) == name)
    }

    /// The kind of the backend a claim's provisioner annotation names (`""`: none of ours).
    fn claim_kind(&self, c: &PersistentVolumeClaim) -> &'static str {
        [ANN_PROVISIONER_BETA, ANN_PROVISIONER]
            .iter()
            .find_map(|k| ann(&c.metadata, k).and_then(|p| self.backend_for(p)))
            .map_or("", |bi| self.backends[bi].kind().name)
    }

    /// The kind of the backend that made a PV (`""`: none of ours).
    fn pv_kind(&self, v: &PersistentVolume) -> &'static str {
        ann(&v.metadata, ANN_PROVISIONED_BY)
            .and_then(|p| self.backend_for(p))
            .map_or("", |bi| self.backends[bi].kind().name)
    }

    /// Records an event unless the same was said last time for this object and reason.
    async fn say(&mut self, ev: EventSpec, report: &mut Report) {
        let key = (ev.uid.clone(), ev.reason);
        if self.said.get(&key) == Some(&ev.message) {
            return;
        }
        if let Err(e) = self.cluster.event(&ev).await {
            report.failed.push(format!("cannot record event: {e}"));
        }
        self.said.insert(key, ev.message);
    }

    fn claim_event(
        c: &PersistentVolumeClaim,
        warning: bool,
        reason: &'static str,
        message: String,
    ) -> EventSpec {
        EventSpec {
            kind: "PersistentVolumeClaim",
            namespace: c.metadata.namespace.clone().unwrap_or_default(),
            name: c.metadata.name.clone().unwrap_or_default(),
            uid: c.metadata.uid.clone().unwrap_or_default(),
            warning,
            reason,
            message,
        }
    }

    /// Before a batch of work: lets each backend finish what a kill left half done (steps 1), and
    /// reads what this node serves and its Node (step 2), kept for the batch's [`Reconciler::sync`].
    pub(crate) async fn refresh(&mut self, cfg: &Config) -> Report {
        let mut report = Report::default();
        let node = self.id.node.clone();
        for b in &mut self.backends {
            report.failed.extend(b.recover(cfg, &node));
        }
        let serves: Vec<(String, bool)> = self
            .backends
            .iter()
            .map(|b| (self.id.provisioner(b.kind().name), b.serves(cfg, &node)))
            .collect();
        self.serving = serves.iter().map(|(_, s)| *s).collect();
        self.here = self.read_node(&serves, &mut report).await;
        report
    }

    /// One pass over everything the cluster seam lists, with the node config `cfg`: a
    /// [`Reconciler::refresh`], the legacy grants (step 3), then [`Reconciler::sync`] of every
    /// claim and every PV. The lanes ([`crate::provision::lanes`]) instead sync only the keys that changed
    /// or are due; this is the same work, through the same [`Reconciler::sync`], for a cluster seam
    /// that lists everything (the tests).
    #[cfg(test)]
    pub(crate) async fn pass(&mut self, cfg: &Config) -> Report {
        let mut report = self.refresh(cfg).await;
        let volumes = match self.cluster.volumes().await {
            Ok(v) => v,
            Err(e) => {
                report.failed.push(e.to_string());
                return report;
            }
        };
        let names: HashSet<String> = volumes
            .iter()
            .filter_map(|v| v.metadata.name.clone())
            .collect();
        self.legacy_grants(&volumes, cfg, &mut report);
        self.adopt_old_volumes(&volumes, cfg, &mut report);
        report
            .failed
            .extend(sweep_legacy_grants(&cfg.state_dir, &names));
        let claims = match self.cluster.claims().await {
            Ok(c) => c,
            Err(e) => {
                report.failed.push(e.to_string());
                return report;
            }
        };
        self.forget_gone(&claims, &volumes);
        report.seen = (claims.len(), volumes.len());
        // Each object through `sync(key)`, the path the lanes run: the object is read again
        // from the cluster seam as production reads it from the watch caches.
        let keys = claims
            .iter()
            .filter_map(|c| {
                let m = &c.metadata;
                Some(Key::Claim(format!(
                    "{}/{}",
                    m.namespace.as_deref()?,
                    m.name.as_deref()?
                )))
            })
            .chain(
                volumes
                    .iter()
                    .filter_map(|v| Some(Key::Volume(v.metadata.name.clone()?))),
            )
            .collect::<Vec<_>>();
        for k in &keys {
            let r = self.sync(k, cfg).await;
            report.merge(r);
        }
        report
    }

    /// Forgets what was said about objects that are gone (bounded memory): `claims` and `volumes`
    /// are every object this instance looks after.
    pub(crate) fn forget_gone(
        &mut self,
        claims: &[PersistentVolumeClaim],
        volumes: &[PersistentVolume],
    ) {
        let live: HashSet<&str> = claims
            .iter()
            .map(|c| &c.metadata)
            .chain(volumes.iter().map(|v| &v.metadata))
            .filter_map(|m| m.uid.as_deref())
            .collect();
        self.said.retain(|(uid, _), _| live.contains(uid.as_str()));
        self.told_wffc.retain(|uid| live.contains(uid.as_str()));
    }

    /// The work for one key, on the objects as the watch caches hold them (after a
    /// [`Reconciler::refresh`]): a claim is provisioned and, once bound, grown (steps 4, 5); a PV
    /// is protected, released or reclaimed (step 6). A key whose object is gone is nothing to do.
    pub(crate) async fn sync(&mut self, key: &Key, cfg: &Config) -> Report {
        let mut report = Report::default();
        match key {
            Key::Claim(k) => {
                let (ns, name) = k.split_once('/').unwrap_or(("", k));
                if let Some(c) = self.cluster.cached_claim(ns, name).await {
                    self.sync_claim(&c, cfg, &mut report).await;
                }
            }
            Key::Volume(name) => {
                if let Some(v) = self.cluster.cached_volume(name).await {
                    self.sync_volume(&v, cfg, &mut report).await;
                }
            }
        }
        report
    }

    /// Steps 4 and 5 for one claim.
    async fn sync_claim(&mut self, c: &PersistentVolumeClaim, cfg: &Config, report: &mut Report) {
        let (m, kind) = (report.mark(Action::Provision), self.claim_kind(c));
        self.claim(c, cfg, report).await;
        report.op(Action::Provision, kind, m);
        let volume = c.spec.as_ref().and_then(|s| s.volume_name.as_deref());
        if let Some(name) = volume.filter(|n| !n.is_empty())
            && let Some(pv) = self.cluster.cached_volume(name).await
        {
            let (m, kind) = (report.mark(Action::Resize), self.pv_kind(&pv));
            self.resize(c, &pv, cfg, report).await;
            report.op(Action::Resize, kind, m);
        }
    }

    /// Step 6 for one PV: its claim counts as gone when the cache does not hold it (a
    /// [`Fate::Reclaim`] that depends on that asks the server again before acting).
    async fn sync_volume(&mut self, v: &PersistentVolume, cfg: &Config, report: &mut Report) {
        let Some(bi) = self.ours(v) else { return };
        let gone = match v.spec.as_ref().and_then(|s| s.claim_ref.as_ref()) {
            Some(r) => {
                let (ns, name) = (
                    r.namespace.as_deref().unwrap_or(""),
                    r.name.as_deref().unwrap_or(""),
                );
                self.cluster
                    .cached_claim(ns, name)
                    .await
                    .is_none_or(|c| c.metadata.uid.as_deref() != r.uid.as_deref())
            }
            None => true,
        };
        match fate(v, gone) {
            Fate::Keep => self.check_size(v, bi, cfg, report).await,
            Fate::Protect => self.protect(v, report).await,
            Fate::Release => self.release(v, report).await,
            Fate::Reclaim => {
                let (m, kind) = (report.mark(Action::Delete), self.pv_kind(v));
                self.delete(v, bi, cfg, report).await;
                report.op(Action::Delete, kind, m);
            }
        }
    }

    /// Step 6 for a PV that is kept: its backend checks that its enforced size still is
    /// ([`Provisioner::check_size`]). A drift is counted in [`Report::quota_drift`] (the metric)
    /// and said in a `QuotaDrift` event on the PV (once per finding: said again after a check that
    /// found it clean); what could not be checked or put back is a failure, retried next pass.
    async fn check_size(
        &mut self,
        v: &PersistentVolume,
        bi: usize,
        cfg: &Config,
        report: &mut Report,
    ) {
        let uid = v.metadata.uid.clone().unwrap_or_default();
        let Some(found) = self.backends[bi].check_size(cfg, v) else {
            self.said.remove(&(uid, QUOTA_DRIFT));
            return;
        };
        let name = v.metadata.name.clone().unwrap_or_default();
        let message = match found {
            SizeCheck::Restored(what) => {
                report
                    .quota_drift
                    .push((name.clone(), format!("{what}; put back")));
                format!("{what}; flexvol put it back")
            }
            SizeCheck::NotRestored(what, why) => {
                report
                    .quota_drift
                    .push((name.clone(), format!("{what}; not put back: {why}")));
                report.failed.push(format!(
                    "PV {name}: {what}; putting it back failed: {why}; retrying"
                ));
                format!("{what}; putting it back failed: {why}; retrying")
            }
            SizeCheck::Failed(why) => {
                report.failed.push(format!(
                    "PV {name}: cannot check its enforced size: {why}; retrying"
                ));
                format!("cannot check its enforced size: {why}; retrying")
            }
        };
        let ev = EventSpec {
            kind: "PersistentVolume",
            namespace: String::new(),
            name,
            uid,
            warning: true,
            reason: QUOTA_DRIFT,
            message: format!("flexvol on node {}: {message}", self.id.node),
        };
        self.say(ev, report).await;
    }

    /// Step 6 for a PV made before the finalizer (and not being deleted): adds it, so that from
    /// now on it is protected as the PVs made since are (sig-storage's external-provisioner does
    /// the same to its existing PVs under `HonorPVReclaimPolicy`). Conditional on the PV's
    /// resourceVersion as cached: a stale cache only delays it to the next pass.
    async fn protect(&mut self, v: &PersistentVolume, report: &mut Report) {
        let name = v.metadata.name.clone().unwrap_or_default();
        match self.cluster.add_volume_finalizer(v).await {
            Ok(()) => report.protected.push(name),
            Err(e) if e.kind == ApiErrorKind::Conflict => {}
            Err(e) => report.failed.push(format!("PV {name}: {e}; retrying")),
        }
    }

    /// Step 6 for a deleted PV whose reclaim policy is not Delete: removes the finalizer only (the
    /// volume is kept), on the PV as the server has it now.
    async fn release(&mut self, cached: &PersistentVolume, report: &mut Report) {
        let name = cached.metadata.name.clone().unwrap_or_default();
        let v = match self.cluster.get_volume(&name).await {
            Ok(Some(v))
                if fate(&v, false) == Fate::Release && v.metadata.uid == cached.metadata.uid =>
            {
                v
            }
            Ok(_) => return,
            Err(e) => {
                report.failed.push(e.to_string());
                return;
            }
        };
        match self.cluster.remove_volume_finalizer(&v).await {
            Ok(()) => report.released.push(name),
            Err(e) if matches!(e.kind, ApiErrorKind::Conflict | ApiErrorKind::NotFound) => {}
            Err(e) => report.failed.push(format!("PV {name}: {e}; retrying")),
        }
    }

    /// Whether the claim `v` is bound or pre-bound to (by uid) is gone, asked of the server.
    async fn claim_gone(&self, v: &PersistentVolume) -> ApiResult<bool> {
        let Some(r) = v.spec.as_ref().and_then(|s| s.claim_ref.as_ref()) else {
            return Ok(true);
        };
        let (Some(ns), Some(name)) = (r.namespace.as_deref(), r.name.as_deref()) else {
            return Ok(true);
        };
        let c = self.cluster.get_claim(ns, name).await?;
        Ok(c.is_none_or(|c| c.metadata.uid.as_deref() != r.uid.as_deref()))
    }

    /// Reads this node's Node: its hostname label (what PVs pin to) and whether it may make
    /// node-local volumes; advises the operator (once per change) where the node's labels
    /// `<vendor>/<kind>` disagree with what it serves. It writes nothing: the labels are the
    /// operator's (the token may not patch Nodes).
    async fn read_node(&mut self, serves: &[(String, bool)], report: &mut Report) -> Here {
        let node = match self.cluster.get_node(&self.id.node).await {
            Ok(Some(n)) => n,
            Ok(None) => {
                report.failed.push(format!(
                    "Node {} does not exist; check --node-name (the DaemonSet passes spec.nodeName); no node-local volume is made until it does",
                    self.id.node
                ));
                return Here::default();
            }
            Err(e) => {
                report.failed.push(format!(
                    "{e}; no node-local volume is made until the Node can be read"
                ));
                return Here::default();
            }
        };
        let unfit = unfit_for_local_volumes(&node);
        let labels = node.metadata.labels.unwrap_or_default();
        for (key, serving) in serves {
            let labelled = labels.get(key).map(String::as_str) == Some("true");
            let advice = match (labelled, *serving) {
                (false, true) => Some(format!(
                    "node {n} serves {key} but is not labelled {key}=true: a class that pins claims to that label with allowedTopologies (as the example classes do) never gets a claim here; if this node should serve it: kubectl label node {n} {key}=true",
                    n = self.id.node
                )),
                (true, false) => Some(format!(
                    "node {n} is labelled {key}=true but cannot serve {key} (see the node config): claims the scheduler puts here are sent back; remove the label: kubectl label node {n} {key}-",
                    n = self.id.node
                )),
                _ => None,
            };
            match advice {
                Some(a) if self.advised.get(key) != Some(&a) => {
                    report.advice.push(a.clone());
                    self.advised.insert(key.clone(), a);
                }
                Some(_) => {}
                None => {
                    self.advised.remove(key);
                }
            }
        }
        Here {
            hostname: Some(
                labels
                    .get(HOSTNAME_LABEL)
                    .cloned()
                    .unwrap_or_else(|| self.id.node.clone()),
            ),
            unfit,
        }
    }

    async fn claim(&mut self, c: &PersistentVolumeClaim, cfg: &Config, report: &mut Report) {
        self.immediate_binding(c, report).await;
        let step = self.provision_claim(c, cfg).await;
        let who = claim_ref(c);
        match step {
            Step::Skip => {}
            Step::Done(pv, location) => {
                let msg = format!(
                    "flexvol provisioned volume {pv} at {location} (by node {})",
                    self.id.node
                );
                self.say(
                    Self::claim_event(c, false, "ProvisioningSucceeded", msg),
                    report,
                )
                .await;
                report.provisioned.push((pv, location));
            }
            Step::Fail(why) => {
                let msg = format!("flexvol on node {}: {why}", self.id.node);
                report.failed.push(format!("{who}: {msg}"));
                self.say(
                    Self::claim_event(c, true, "ProvisioningFailed", msg),
                    report,
                )
                .await;
            }
            Step::Never(why) => {
                // As external-provisioner on a final error under delayed binding: the claim is
                // sent back (it holds no node), and says what to change. The event is said once
                // per message, however often its author writes selected-node again.
                let ns = c.metadata.namespace.as_deref().unwrap_or("");
                let name = c.metadata.name.as_deref().unwrap_or("");
                let mut msg = format!("flexvol on node {}: {why}", self.id.node);
                if ann(&c.metadata, ANN_SELECTED_NODE) == Some(self.id.node.as_str()) {
                    match self.cluster.unselect_node(ns, name, &self.id.node).await {
                        Ok(()) => {
                            msg.push_str(&format!(
                                "; this claim can never be provisioned as written, so its {ANN_SELECTED_NODE} annotation was removed (it holds no room on any node); create a new claim that fixes this"
                            ));
                            report.refused.push(who.clone());
                        }
                        Err(e) => report.failed.push(format!("{who}: {e}; retrying")),
                    }
                }
                report.failed.push(format!("{who}: {msg}"));
                self.say(
                    Self::claim_event(c, true, "ProvisioningFailed", msg),
                    report,
                )
                .await;
            }
            Step::Reschedule(why) => {
                let ns = c.metadata.namespace.as_deref().unwrap_or("");
                let name = c.metadata.name.as_deref().unwrap_or("");
                match self.cluster.unselect_node(ns, name, &self.id.node).await {
                    Ok(()) => {
                        let msg = format!(
                            "node {} cannot serve this claim: {why}; the scheduler will pick another node",
                            self.id.node
                        );
                        report.rescheduled.push(who);
                        // Every reschedule is news: never deduplicated.
                        let ev = Self::claim_event(c, true, "ProvisioningFailed", msg);
                        if let Err(e) = self.cluster.event(&ev).await {
                            report.failed.push(format!("cannot record event: {e}"));
                        }
                    }
                    Err(e) => report.failed.push(e.to_string()),
                }
            }
        }
    }

    /// A pending claim of a node-local class whose `volumeBindingMode` is `Immediate` (or unset,
    /// which is `Immediate`): the scheduler never gives it a node (`selected-node`), so no
    /// instance would ever make its volume. Tells the claim's author, with a ProvisioningFailed
    /// event, once per claim: only the instance that holds the `flexvol-claims` Lease keeps such
    /// claims in its cache ([`crate::provision::cache::Scope::keep_claim`]), so one instance says it (once
    /// more after a restart or a change of holder). Decided by [`decide_immediate`] on the class
    /// as the class cache holds it; costs nothing once said.
    async fn immediate_binding(&mut self, c: &PersistentVolumeClaim, report: &mut Report) {
        let class = match claim_class(c) {
            Some(n) => self.cluster.cached_class(n).await,
            None => Ok(None),
        };
        let (uid, msg) =
            match decide_immediate(c, &self.id, &self.backends, &self.told_wffc, &class) {
                Immediate::Nothing => return,
                Immediate::Unread(e) => {
                    report.failed.push(e);
                    return;
                }
                Immediate::Tell { uid, message } => (uid, message),
            };
        report.failed.push(format!("{}: {msg}", claim_ref(c)));
        let ev = Self::claim_event(c, true, "ProvisioningFailed", msg);
        if let Err(e) = self.cluster.event(&ev).await {
            report.failed.push(format!("cannot record event: {e}"));
            return;
        }
        self.told_wffc.insert(uid);
    }

    /// Step 4 for one claim: reads what the decision needs (the claim's class and whether its PV
    /// exists, both from the watch caches), decides ([`decide_claim`], no API call), then acts on
    /// a [`Decision::Make`]: the clone source checked on the server, the backend's volume, the PV.
    async fn provision_claim(&mut self, c: &PersistentVolumeClaim, cfg: &Config) -> Step {
        let class = match claim_class(c) {
            Some(n) => self.cluster.cached_class(n).await,
            None => Ok(None),
        };
        let pv_made = match c.metadata.uid.as_deref() {
            Some(uid) => self
                .cluster
                .cached_volume(&format!("pvc-{uid}"))
                .await
                .is_some(),
            None => false,
        };
        let facts = ClaimFacts {
            id: &self.id,
            backends: &self.backends,
            serving: &self.serving,
            here: &self.here,
            pv_made,
            class: &class,
        };
        let make = match decide_claim(c, &facts) {
            Decision::Skip => return Step::Skip,
            Decision::Reschedule(why) => return Step::Reschedule(why),
            Decision::Fail(why) => return Step::Fail(why),
            Decision::Never(why) => return Step::Never(why),
            Decision::Make(m) => m,
        };
        let Make {
            bi,
            node_local,
            provisioner,
            pv_name,
            uid,
            namespace: ns,
            name,
            class_name,
            class,
            params,
            pin,
            plan,
        } = *make;
        let (ns, name, uid) = (&ns, &name, &uid);
        let (size, size_bytes, modes) = (plan.size, plan.size_bytes, plan.access_modes);
        // A clone: its source is checked (same namespace, ours, same class, this node, not
        // larger) before anything exists; the backend checks its own marks again.
        let source = match plan.source {
            None => None,
            Some(src) => {
                let sc = match self.cluster.get_claim(ns, &src).await {
                    Ok(sc) => sc,
                    Err(e) => {
                        return Step::Fail(format!("cannot read claim {ns}/{src}: {e}; retrying"));
                    }
                };
                let bound = sc
                    .as_ref()
                    .and_then(|x| x.spec.as_ref())
                    .and_then(|x| x.volume_name.clone())
                    .filter(|v| !v.is_empty());
                let pv = match bound {
                    Some(v) => match self.cluster.get_volume(&v).await {
                        Ok(pv) => pv,
                        Err(e) => return Step::Fail(format!("cannot read PV {v}: {e}; retrying")),
                    },
                    None => None,
                };
                // A clone's backend may remove and redo a copy an earlier pass left (it cannot
                // tell a finished copy from a half one): only while its PV does not exist, which
                // is read from the server, not the cache, which may lag behind our own create.
                match self.cluster.get_volume(&pv_name).await {
                    Ok(None) => {}
                    Ok(Some(_)) => return Step::Skip,
                    Err(e) => {
                        return Step::Fail(format!("cannot read PV {pv_name}: {e}; retrying"));
                    }
                }
                if let Err(why) = check_clone_source(
                    ns,
                    &class_name,
                    &provisioner,
                    node_local.then_some(self.id.node.as_str()),
                    size_bytes,
                    &src,
                    sc.as_ref(),
                    pv.as_ref(),
                ) {
                    return match why {
                        SourceRefusal::Wait(why) => Step::Fail(why),
                        SourceRefusal::Never(why) => Step::Never(why),
                    };
                }
                pv
            }
        };
        let req = Request {
            pv_name: &pv_name,
            claim: c,
            namespace: ns,
            name,
            uid,
            class_name: &class_name,
            params: &params,
            size_bytes,
            access_modes: &modes,
            node: &self.id.node,
            source: source.as_ref(),
        };
        let domain = self.backends[bi].fault_domain(&params);
        if let Some(d) = &domain
            && let Err(open) = self.breakers.admit(d, Instant::now())
        {
            return Step::Fail(paused(d, &open));
        }
        let made = self.backends[bi].provision(cfg, &req);
        if let Some(d) = &domain {
            let failure = made.as_ref().err().and_then(Refusal::server_failure);
            self.breakers.record(d, failure, Instant::now());
        }
        let made = match made {
            Ok(m) => m,
            Err(Refusal::Reschedule(why)) if node_local => return Step::Reschedule(why),
            // Waiting for its source is no node's fault either: the claim keeps its node.
            Err(
                Refusal::Reschedule(why)
                | Refusal::Fail(why)
                | Refusal::Unavailable(why)
                | Refusal::Wait(why),
            ) => {
                return Step::Fail(why);
            }
        };
        let location = made.location.clone();
        // The claim's own spelling when the backend made exactly what was asked.
        let capacity = if made.capacity_bytes == size_bytes {
            size
        } else {
            quantity(made.capacity_bytes)
        };
        let pv = self.build_pv(
            c,
            &class,
            &provisioner,
            &pv_name,
            made,
            capacity,
            pin.as_deref(),
            modes,
        );
        match self.cluster.create_volume(&pv).await {
            Ok(()) => {
                checkpoint("provisioner-after-pv");
                Step::Done(pv_name, location)
            }
            Err(e) if e.kind == ApiErrorKind::AlreadyExists => {
                match self.cluster.get_volume(&pv_name).await {
                    Ok(Some(v)) if is_ours_for(&v, &provisioner, uid) => {
                        Step::Done(pv_name, location)
                    }
                    Ok(_) => Step::Fail(format!(
                        "a PV named {pv_name} exists and was not provisioned by {provisioner} for this claim; delete it"
                    )),
                    Err(e) => Step::Fail(format!("{e}; retrying")),
                }
            }
            Err(e) => Step::Fail(format!("{e}; retrying")),
        }
    }

    /// The PV for a claim, as the external-provisioner protocol wants it; pinned to `pin` (the
    /// node's hostname label) for node-local volumes.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn build_pv(
        &self,
        c: &PersistentVolumeClaim,
        class: &StorageClass,
        provisioner: &str,
        pv_name: &str,
        made: Provisioned,
        size: Quantity,
        pin: Option<&str>,
        modes: Vec<String>,
    ) -> PersistentVolume {
        let mut annotations = made.annotations;
        annotations.insert(ANN_PROVISIONED_BY.to_owned(), provisioner.to_owned());
        annotations.insert(ANN_NODE.to_owned(), self.id.node.clone());
        let kind = provisioner.rsplit('/').next().unwrap_or_default();
        // Validated with the class ([`decide_claim`]); a class edited since then to a bad name
        // cannot get here with it (the plan is made again on every pass).
        let csi_driver = class
            .parameters
            .as_ref()
            .and_then(|p| crate::vocab::class::csi_driver(p).ok().flatten());
        let mut labels = BTreeMap::from([(LABEL_KIND.to_owned(), kind.to_owned())]);
        if pin.is_some() {
            labels.insert(LABEL_NODE.to_owned(), node_label_value(&self.id.node));
        }
        PersistentVolume {
            metadata: ObjectMeta {
                name: Some(pv_name.to_owned()),
                annotations: Some(annotations),
                labels: Some(labels),
                finalizers: Some(vec![FINALIZER.to_owned()]),
                ..Default::default()
            },
            spec: Some(PersistentVolumeSpec {
                access_modes: Some(modes),
                capacity: Some(BTreeMap::from([("storage".to_owned(), size)])),
                // Built by hand: selfLink is gone in 1.20.
                claim_ref: Some(ObjectReference {
                    api_version: Some("v1".into()),
                    kind: Some("PersistentVolumeClaim".into()),
                    namespace: c.metadata.namespace.clone(),
                    name: c.metadata.name.clone(),
                    uid: c.metadata.uid.clone(),
                    resource_version: c.metadata.resource_version.clone(),
                    ..Default::default()
                }),
                csi: csi_driver.map(|driver| CSIPersistentVolumeSource {
                    driver: driver.to_owned(),
                    volume_handle: crate::vocab::csi_handle(kind, pv_name, &made.options)
                        .unwrap_or_else(|| pv_name.to_owned()),
                    fs_type: made.fs_type.clone(),
                    volume_attributes: Some(made.options.clone()),
                    ..Default::default()
                }),
                flex_volume: csi_driver.is_none().then(|| FlexPersistentVolumeSource {
                    driver: provisioner.to_owned(),
                    options: Some(made.options),
                    fs_type: made.fs_type,
                    ..Default::default()
                }),
                mount_options: class.mount_options.clone(),
                node_affinity: pin.map(|hostname| VolumeNodeAffinity {
                    required: Some(NodeSelector {
                        node_selector_terms: vec![NodeSelectorTerm {
                            match_expressions: Some(vec![NodeSelectorRequirement {
                                key: HOSTNAME_LABEL.into(),
                                operator: "In".into(),
                                values: Some(vec![hostname.to_owned()]),
                            }]),
                            ..Default::default()
                        }],
                    }),
                }),
                persistent_volume_reclaim_policy: Some(
                    class
                        .reclaim_policy
                        .clone()
                        .unwrap_or_else(|| "Delete".into()),
                ),
                storage_class_name: Some(class.metadata.name.clone().unwrap_or_default()),
                volume_mode: Some("Filesystem".into()),
                ..Default::default()
            }),
            status: None,
        }
    }

    /// The backend of a PV we provisioned and this instance looks after (its node's, for a
    /// node-local backend; any serving instance, for a shared one).
    fn ours(&self, v: &PersistentVolume) -> Option<usize> {
        let bi = ann(&v.metadata, ANN_PROVISIONED_BY).and_then(|p| self.backend_for(p))?;
        let mine = if self.backends[bi].kind().node_local {
            ann(&v.metadata, ANN_NODE) == Some(self.id.node.as_str())
        } else {
            self.serving.get(bi).copied().unwrap_or(false)
        };
        mine.then_some(bi)
    }

    /// Step 3 (every pass, no API call): a grant for each PV of ours whose options carry no
    /// [`capability::OPTION`] or an older one that does not name its claim's namespace (a PV's
    /// source is immutable): hostPath and LVM PVs of this node, NFS PVs of any node (any node
    /// mounts them). The drivers serve such a volume (without a token, or with its old token) to
    /// that PV name in its claim's namespace only. Grants of PVs that no longer exist are
    /// removed. Costs an open and a read per such PV and a directory listing; nothing for PVs
    /// whose token names their namespace.
    #[cfg(test)]
    pub(crate) fn legacy_grants(
        &self,
        volumes: &[PersistentVolume],
        cfg: &Config,
        report: &mut Report,
    ) {
        let kinds: Vec<&'static Kind> = self.backends.iter().map(|b| b.kind()).collect();
        legacy_grants(volumes, &self.id, &kinds, cfg, report);
    }

    /// Also every pass and sweep, no API call: each PV of ours (of this node for a node-local
    /// kind) made before root-only ownership records gets its record
    /// ([`Provisioner::adopt`]), on the evidence of the PV itself. Costs one small read per PV
    /// of a kind that keeps records; nothing for the others.
    pub(crate) fn adopt_old_volumes(
        &self,
        volumes: &[PersistentVolume],
        cfg: &Config,
        report: &mut Report,
    ) {
        for v in volumes {
            let Some(by) = ann(&v.metadata, ANN_PROVISIONED_BY) else {
                continue;
            };
            let Some(b) = self
                .backends
                .iter()
                .find(|b| self.id.provisioner(b.kind().name) == by)
            else {
                continue;
            };
            if b.kind().node_local && ann(&v.metadata, ANN_NODE) != Some(self.id.node.as_str()) {
                continue;
            }
            report.failed.extend(b.adopt(cfg, v));
        }
    }

    /// Step 5: grows a Bound PV of ours whose claim asks for more than it has.
    async fn resize(
        &mut self,
        c: &PersistentVolumeClaim,
        pv: &PersistentVolume,
        cfg: &Config,
        report: &mut Report,
    ) {
        let Some(bi) = self.ours(pv) else { return };
        if c.status.as_ref().and_then(|s| s.phase.as_deref()) != Some("Bound")
            || c.metadata.deletion_timestamp.is_some()
            || pv
                .spec
                .as_ref()
                .and_then(|s| s.claim_ref.as_ref())
                .and_then(|r| r.uid.as_deref())
                != c.metadata.uid.as_deref()
        {
            return;
        }
        let Some(want) = requested(c) else { return };
        let pv_capacity = storage_bytes(pv.spec.as_ref().and_then(|s| s.capacity.as_ref()));
        let claim_capacity = storage_bytes(c.status.as_ref().and_then(|s| s.capacity.as_ref()));
        // What the backend has: its annotation; PVs made before it existed count as the size
        // their claim was granted.
        let have = ann(&pv.metadata, ANN_SIZE)
            .and_then(|s| s.parse::<u64>().ok())
            .or(claim_capacity)
            .or(pv_capacity)
            .unwrap_or(0);
        let name = pv.metadata.name.clone().unwrap_or_default();
        let finishes_on_node = self.backends[bi].kind().node_finishes_resize;
        if want > have {
            let class_name = pv
                .spec
                .as_ref()
                .and_then(|s| s.storage_class_name.clone())
                .unwrap_or_default();
            // The API server refuses the resize of a claim whose class does not allow it; a class
            // edited since, or gone, is checked here again.
            match self.cluster.cached_class(&class_name).await {
                Ok(Some(sc)) if sc.allow_volume_expansion == Some(true) => {}
                Ok(_) => {
                    let msg = format!(
                        "flexvol: StorageClass {class_name:?} does not allow volume expansion (allowVolumeExpansion: true); the volume keeps its size"
                    );
                    self.say(
                        Self::claim_event(c, true, "VolumeResizeFailed", msg),
                        report,
                    )
                    .await;
                    return;
                }
                Err(e) => {
                    report.failed.push(e.to_string());
                    return;
                }
            }
            let domain = self.pv_domain(bi, pv);
            let grown = match self.guarded(domain.as_deref(), |b| b.expand(cfg, pv, want), bi) {
                Ok(b) => b,
                Err(why) => {
                    let msg = format!(
                        "flexvol on node {}: cannot grow {name} to {want} bytes: {why}; retrying",
                        self.id.node
                    );
                    report.failed.push(format!("{}: {msg}", claim_ref(c)));
                    self.say(
                        Self::claim_event(c, true, "VolumeResizeFailed", msg),
                        report,
                    )
                    .await;
                    return;
                }
            };
            checkpoint("provisioner-resize-after-expand");
            let capacity = quantity(grown.max(pv_capacity.unwrap_or(0)));
            let anns = BTreeMap::from([(ANN_SIZE.to_owned(), grown.to_string())]);
            if let Err(e) = self.cluster.grow_volume(&name, &capacity, &anns).await {
                report.failed.push(format!("PV {name}: {e}; retrying"));
                return;
            }
            report.resized.push((name.clone(), grown));
            let msg = if finishes_on_node {
                format!(
                    "flexvol on node {} grew {name} to {grown} bytes; kubelet grows the filesystem",
                    self.id.node
                )
            } else {
                format!(
                    "flexvol on node {} grew {name} to {grown} bytes",
                    self.id.node
                )
            };
            self.say(
                Self::claim_event(c, false, "VolumeResizeSuccessful", msg),
                report,
            )
            .await;
            if !finishes_on_node {
                self.finish_claim(c, pv, grown, report).await;
            }
        } else if !finishes_on_node && claim_capacity.is_some_and(|cc| cc < have) {
            // A kill between the PV and the claim, or a claim held for kcm: finish the claim.
            self.finish_claim(c, pv, have, report).await;
        }
    }

    /// Whether kube-controller-manager's expand controller is done with claim `c` of the
    /// flexVolume PV `pv`, so that the claim may be written.
    ///
    /// For a flexVolume PV kcm's expand controller (every release, its no-op expander) answers a
    /// bigger request with three writes of its own: the claim's `Resizing` condition, the PV's
    /// capacity, then the claim's `FileSystemResizePending` (with `NodeResizePending` in
    /// `allocatedResourceStatuses` on 1.34+). Its first write is conditional on the claim as its
    /// cache had it; on 1.20–1.22 a failed first write crashes kube-controller-manager
    /// (kubernetes#111891, fixed in 1.23 by #111894). A claim recorded by flexvol before that
    /// write makes it fail, so flexvol records it only once kcm's last write shows (a claim
    /// update, which brings the claim back at once) or after [`Reconciler::resize_hold`] (an
    /// expand controller that is off). A CSI PV gets none of this: kcm leaves it to an external
    /// resizer, which flexvol is.
    fn kcm_done_with(&mut self, c: &PersistentVolumeClaim, pv: &PersistentVolume) -> bool {
        if pv.spec.as_ref().is_none_or(|s| s.flex_volume.is_none()) {
            return true;
        }
        let status = c.status.as_ref();
        let pending = status
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|cs| {
                cs.iter()
                    .any(|cond| cond.type_ == "FileSystemResizePending" && cond.status == "True")
            })
            || status
                .and_then(|s| s.allocated_resource_statuses.as_ref())
                .and_then(|m| m.get("storage"))
                .is_some_and(|s| s == "NodeResizePending");
        let Some(uid) = c.metadata.uid.clone() else {
            return true;
        };
        let now = std::time::Instant::now();
        let hold = self.resize_hold;
        // Entries of claims that went away meanwhile do not pile up.
        self.resize_held
            .retain(|_, since| now.duration_since(*since) < hold.saturating_mul(20));
        let since = *self.resize_held.entry(uid).or_insert(now);
        pending || now.duration_since(since) >= hold
    }

    async fn finish_claim(
        &mut self,
        c: &PersistentVolumeClaim,
        pv: &PersistentVolume,
        bytes: u64,
        report: &mut Report,
    ) {
        if !self.kcm_done_with(c, pv) {
            report.deferred.push(format!(
                "{}: grown; its size is recorded once kube-controller-manager's expand controller has marked it (at most {} s)",
                claim_ref(c),
                self.resize_hold.as_secs()
            ));
            return;
        }
        let ns = c.metadata.namespace.as_deref().unwrap_or("");
        let name = c.metadata.name.as_deref().unwrap_or("");
        let q = quantity(bytes);
        match self.cluster.finish_claim_resize(ns, name, &q).await {
            Ok(()) => {
                if let Some(uid) = c.metadata.uid.as_deref() {
                    self.resize_held.remove(uid);
                }
            }
            Err(e) => report
                .failed
                .push(format!("{}: {e}; retrying", claim_ref(c))),
        }
    }

    /// Step 6 for a PV to reclaim ([`Fate::Reclaim`]): decided again on the PV as the server has
    /// it now; the backend removes the volume, then the PV is deleted (uid precondition) and its
    /// finalizer removed. A kill anywhere converges: the next pass finds the PV (held by the
    /// finalizer) and goes through again, the backend's delete of a volume already gone is
    /// success.
    async fn delete(
        &mut self,
        cached: &PersistentVolume,
        bi: usize,
        cfg: &Config,
        report: &mut Report,
    ) {
        let Some(name) = cached.metadata.name.clone() else {
            return;
        };
        // The cache may be stale: decide on the object as the server has it now.
        let v = match self.cluster.get_volume(&name).await {
            Ok(Some(v)) if v.metadata.uid == cached.metadata.uid && self.ours(&v) == Some(bi) => v,
            Ok(_) => return,
            Err(e) => {
                report.failed.push(e.to_string());
                return;
            }
        };
        let released = v.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Released");
        let gone = if released || v.metadata.deletion_timestamp.is_none() {
            false
        } else {
            match self.claim_gone(&v).await {
                Ok(g) => g,
                Err(e) => {
                    report.failed.push(e.to_string());
                    return;
                }
            }
        };
        if fate(&v, gone) != Fate::Reclaim {
            return;
        }
        let uid = v.metadata.uid.clone().unwrap_or_default();
        let domain = self.pv_domain(bi, &v);
        let failure = match self.guarded(domain.as_deref(), |b| b.delete(cfg, &v), bi) {
            Err(why) => Err(why.to_string()),
            Ok(done) => {
                // Best effort: a grant left behind is swept once the PV is gone.
                let kind = self.backends[bi].kind().name;
                if let Some(loc) =
                    crate::vocab::pv_options(&v).and_then(|o| capability::pv_location(kind, o))
                {
                    let _ = capability::remove_legacy_grant(&cfg.state_dir, &loc);
                }
                checkpoint("provisioner-delete-before-pv");
                let deleted = if v.metadata.deletion_timestamp.is_some() {
                    Ok(())
                } else {
                    match self.cluster.delete_volume(&name, &uid).await {
                        Err(e) if e.kind == ApiErrorKind::NotFound => Ok(()),
                        r => r,
                    }
                };
                match deleted {
                    Err(e) => Err(format!(
                        "the volume was removed ({done}) but the PV was not deleted: {e}; retrying"
                    )),
                    Ok(()) => {
                        checkpoint("provisioner-delete-before-finalizer");
                        self.unguard(&name, &uid)
                            .await
                            .map(|()| done.clone())
                            .map_err(|e| format!(
                                "the volume was removed ({done}) and the PV deleted, but its finalizer {FINALIZER} was not removed: {e}; retrying"
                            ))
                    }
                }
            }
        };
        match failure {
            Ok(done) => report.deleted.push((name, done)),
            Err(why) => {
                report.failed.push(format!("PV {name}: {why}"));
                let ev = EventSpec {
                    kind: "PersistentVolume",
                    namespace: String::new(),
                    name: name.clone(),
                    uid,
                    warning: true,
                    reason: "VolumeFailedDelete",
                    message: format!("flexvol on node {}: {why}", self.id.node),
                };
                self.say(ev, report).await;
            }
        }
    }
}

impl<C: Cluster> Reconciler<C> {
    /// The fault domain of a PV of backend `bi` (from its flexVolume options).
    fn pv_domain(&self, bi: usize, v: &PersistentVolume) -> Option<String> {
        self.backends[bi].fault_domain(crate::vocab::pv_options(v)?)
    }

    /// Runs a delete or an expand of backend `bi` under the breaker of `domain`: not at all while
    /// it is open; a [`ProvisionError::Unavailable`] (the server did not answer) opens it,
    /// anything else closes it (a refusal is about the one volume, a failed step about this
    /// node or the volume, not the server).
    fn guarded<T>(
        &mut self,
        domain: Option<&str>,
        work: impl FnOnce(&mut dyn Provisioner) -> Result<T, ProvisionError>,
        bi: usize,
    ) -> Result<T, ProvisionError> {
        if let Some(d) = domain
            && let Err(open) = self.breakers.admit(d, Instant::now())
        {
            return Err(ProvisionError::Failed(paused(d, &open)));
        }
        let r = work(self.backends[bi].as_mut());
        if let Some(d) = domain {
            let failure = r.as_ref().err().and_then(ProvisionError::server_failure);
            self.breakers.record(d, failure, Instant::now());
        }
        r
    }

    /// Removes [`FINALIZER`] from the PV `name` if it is still the one with `uid` (read again:
    /// deleting it changed it). `Ok` when it is gone or does not carry it.
    async fn unguard(&self, name: &str, uid: &str) -> Result<(), ApiError> {
        match self.cluster.get_volume(name).await? {
            Some(v) if v.metadata.uid.as_deref() == Some(uid) => {
                match self.cluster.remove_volume_finalizer(&v).await {
                    Err(e) if e.kind == ApiErrorKind::NotFound => Ok(()),
                    r => r,
                }
            }
            _ => Ok(()),
        }
    }
}

/// The provisioner a claim is for: its `volume.kubernetes.io/storage-provisioner` when it has one
/// (1.23+ set it, alone or beside the beta one, and it wins when they differ, as in
/// sig-storage-lib-external-provisioner), else `volume.beta.kubernetes.io/storage-provisioner`
/// (all 1.20 sets).
pub(crate) fn claim_provisioner(meta: &ObjectMeta) -> Option<&str> {
    ann(meta, ANN_PROVISIONER).or_else(|| ann(meta, ANN_PROVISIONER_BETA))
}

/// Step 3 for `volumes`, of the `kinds` given (see [`Reconciler::legacy_grants`]): writes the
/// legacy grant of each PV of ours made before capabilities (node-local ones of `id`'s node).
pub(crate) fn legacy_grants(
    volumes: &[PersistentVolume],
    id: &Identity,
    kinds: &[&'static Kind],
    cfg: &Config,
    report: &mut Report,
) {
    for v in volumes {
        let Some(kind) = ann(&v.metadata, ANN_PROVISIONED_BY)
            .and_then(|p| kinds.iter().find(|k| id.provisioner(k.name) == p))
        else {
            continue;
        };
        if kind.node_local && ann(&v.metadata, ANN_NODE) != Some(id.node.as_str()) {
            continue;
        }
        let spec = v.spec.as_ref();
        let Some(options) = crate::vocab::pv_options(v) else {
            continue;
        };
        let namespace = spec
            .and_then(|s| s.claim_ref.as_ref())
            .and_then(|r| r.namespace.clone());
        let (Some(pv), Some(namespace)) = (v.metadata.name.clone(), namespace) else {
            continue;
        };
        // A token that names its namespace needs nothing here; an older one (v1) is served to
        // its claim's namespace only, which this grant records.
        if options
            .get(capability::OPTION)
            .is_some_and(|t| capability::names_namespace(t))
        {
            continue;
        }
        let Some(loc) = capability::pv_location(kind.name, options) else {
            continue;
        };
        if let Err(e) = capability::write_legacy_grant(
            &cfg.state_dir,
            &loc,
            &capability::LegacyGrant {
                pv: pv.clone(),
                namespace,
            },
        ) {
            report.failed.push(format!(
                "PV {pv}: cannot write its legacy grant in {}: {e}; pods of its claim cannot mount it on this node until it is written",
                cfg.state_dir.join(capability::LEGACY_DIR).display()
            ));
        }
    }
}

/// Why work was not tried on a fault domain whose breaker is open. Without times in it, so the
/// event saying it is recorded once, not once per retry.
fn paused(domain: &str, open: &crate::k8s::queue::Open) -> String {
    format!(
        "not tried: the last attempt on {domain} failed ({}), so work on it waits and is retried with a growing delay (at most 5 minutes) while other volumes go on; fix the server or the class",
        open.last
    )
}

/// Removes the legacy grants (in `<stateDir>/legacy-grants`) of PVs not in `names`, the PVs that
/// exist; returns failures. Only files this provisioner wrote are there (root-only directory).
pub(crate) fn sweep_legacy_grants(
    state_dir: &std::path::Path,
    names: &HashSet<String>,
) -> Vec<String> {
    let dir = state_dir.join(capability::LEGACY_DIR);
    let entries = match std::fs::read_dir(&dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Vec::new(),
        Err(e) => return vec![format!("cannot list {}: {e}", dir.display())],
    };
    let mut failed = Vec::new();
    for e in entries.flatten() {
        let name = e.file_name();
        // Temporaries of a killed writer start with a dot: theirs to replace.
        if name.to_string_lossy().starts_with('.') {
            continue;
        }
        let path = e.path();
        let Ok(data) = std::fs::read(&path) else {
            continue;
        };
        let Ok(g) = serde_json::from_slice::<capability::LegacyGrant>(&data) else {
            continue;
        };
        if !names.contains(&g.pv)
            && let Err(e) = std::fs::remove_file(&path)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            failed.push(format!(
                "cannot remove the legacy grant {} of PV {}, which no longer exists: {e}",
                path.display(),
                g.pv
            ));
        }
    }
    failed
}

/// Provisioned by `provisioner` and bound to the claim with uid `claim_uid`.
fn is_ours_for(v: &PersistentVolume, provisioner: &str, claim_uid: &str) -> bool {
    ann(&v.metadata, ANN_PROVISIONED_BY) == Some(provisioner)
        && v.spec
            .as_ref()
            .and_then(|s| s.claim_ref.as_ref())
            .and_then(|r| r.uid.as_deref())
            == Some(claim_uid)
}

#[cfg(test)]
mod decide_tests {
    //! The claim decisions on their own: no cluster seam, nothing awaited.
    use super::*;
    use k8s_openapi::api::core::v1::{PersistentVolumeClaimSpec, VolumeResourceRequirements};

    const PROV: &str = "flexvol/hostpath";

    fn id() -> Identity {
        Identity {
            node: "node-a".into(),
            vendor: "flexvol".into(),
        }
    }

    fn class(provisioner: &str, params: &[(&str, &str)], mode: &str) -> Arc<StorageClass> {
        Arc::new(StorageClass {
            metadata: ObjectMeta {
                name: Some("fast".into()),
                ..Default::default()
            },
            provisioner: provisioner.into(),
            parameters: Some(
                params
                    .iter()
                    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                    .collect(),
            ),
            volume_binding_mode: Some(mode.into()),
            ..Default::default()
        })
    }

    fn claim(provisioner: &str, node: Option<&str>) -> PersistentVolumeClaim {
        let mut a = BTreeMap::from([(ANN_PROVISIONER_BETA.to_owned(), provisioner.to_owned())]);
        if let Some(n) = node {
            a.insert(ANN_SELECTED_NODE.into(), n.into());
        }
        PersistentVolumeClaim {
            metadata: ObjectMeta {
                name: Some("data".into()),
                namespace: Some("ns".into()),
                uid: Some("u1".into()),
                annotations: Some(a),
                ..Default::default()
            },
            spec: Some(PersistentVolumeClaimSpec {
                access_modes: Some(vec!["ReadWriteOnce".into()]),
                storage_class_name: Some("fast".into()),
                resources: Some(VolumeResourceRequirements {
                    requests: Some(BTreeMap::from([(
                        "storage".to_owned(),
                        Quantity("3Gi".into()),
                    )])),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            status: Some(k8s_openapi::api::core::v1::PersistentVolumeClaimStatus {
                phase: Some("Pending".into()),
                ..Default::default()
            }),
        }
    }

    fn here() -> Here {
        Here {
            hostname: Some("host-a".into()),
            unfit: None,
        }
    }

    /// The decision for `c` with the claim's class read as `class`, this node as `here`.
    fn decide(
        c: &PersistentVolumeClaim,
        class: ApiResult<Option<Arc<StorageClass>>>,
        here: &Here,
        pv_made: bool,
    ) -> Decision {
        let id = id();
        let backends = crate::provision::provisioners(&id);
        let serving = vec![true; backends.len()];
        decide_claim(
            c,
            &ClaimFacts {
                id: &id,
                backends: &backends,
                serving: &serving,
                here,
                pv_made,
                class: &class,
            },
        )
    }

    fn ok_class() -> ApiResult<Option<Arc<StorageClass>>> {
        Ok(Some(class(PROV, &[], "WaitForFirstConsumer")))
    }

    #[test]
    fn a_claim_of_this_node_and_class_is_made_with_its_size_and_kind() {
        let Decision::Make(m) = decide(&claim(PROV, Some("node-a")), ok_class(), &here(), false)
        else {
            panic!("not a Make");
        };
        let kinds = crate::provision::provisioners(&id());
        assert_eq!(kinds[m.bi].kind().name, "hostpath");
        assert!(m.node_local);
        assert_eq!(m.provisioner, PROV);
        assert_eq!(m.pv_name, "pvc-u1");
        assert_eq!((m.namespace.as_str(), m.name.as_str()), ("ns", "data"));
        assert_eq!(m.class_name, "fast");
        assert_eq!(m.plan.size, Quantity("3Gi".into()));
        assert_eq!(m.plan.size_bytes, 3 << 30);
        assert_eq!(m.plan.access_modes, ["ReadWriteOnce"]);
        assert_eq!(m.plan.source, None);
        // Pinned to the Node's hostname label, not its name.
        assert_eq!(m.pin.as_deref(), Some("host-a"));
    }

    #[test]
    fn claims_not_ours_or_not_this_nodes_or_made_already_are_skipped() {
        let skip = |d: Decision| assert!(matches!(d, Decision::Skip), "{d:?}");
        skip(decide(
            &claim("example.com/x", Some("node-a")),
            ok_class(),
            &here(),
            false,
        ));
        skip(decide(
            &claim(PROV, Some("node-b")),
            ok_class(),
            &here(),
            false,
        ));
        skip(decide(&claim(PROV, None), ok_class(), &here(), false));
        skip(decide(
            &claim(PROV, Some("node-a")),
            ok_class(),
            &here(),
            true,
        ));
        let mut bound = claim(PROV, Some("node-a"));
        bound.spec.as_mut().unwrap().volume_name = Some("pv-1".into());
        skip(decide(&bound, ok_class(), &here(), false));
        // The Node not read yet: nothing now, next pass.
        skip(decide(
            &claim(PROV, Some("node-a")),
            ok_class(),
            &Here::default(),
            false,
        ));
    }

    #[test]
    fn a_missing_class_is_skipped_and_an_unread_one_retried() {
        let c = claim(PROV, Some("node-a"));
        // Missing from the listed cache: as a 404 was, nothing.
        assert!(matches!(
            decide(&c, Ok(None), &here(), false),
            Decision::Skip
        ));
        // Another provisioner's class of that name: nothing either.
        let theirs = Ok(Some(class("example.com/x", &[], "WaitForFirstConsumer")));
        assert!(matches!(decide(&c, theirs, &here(), false), Decision::Skip));
        // The cache not listed yet: a failure that is retried, never "not found".
        let unread = Err(ApiError::new(
            "read StorageClass fast",
            ApiErrorKind::Other,
            "the StorageClass watch has not listed yet",
        ));
        let Decision::Fail(why) = decide(&c, unread, &here(), false) else {
            panic!("not a Fail");
        };
        assert!(
            why.starts_with("cannot read StorageClass fast: ") && why.ends_with("; retrying"),
            "{why}"
        );
    }

    #[test]
    fn a_bad_parameter_or_claim_is_refused_for_good_and_an_unfit_node_sends_it_back() {
        let c = claim(PROV, Some("node-a"));
        let bad = Ok(Some(class(
            PROV,
            &[("nodePath", "/x")],
            "WaitForFirstConsumer",
        )));
        let Decision::Never(why) = decide(&c, bad, &here(), false) else {
            panic!("not a Never");
        };
        assert!(
            why.starts_with("StorageClass fast: unknown class parameter \"nodePath\""),
            "{why}"
        );
        let grace = Ok(Some(class(
            PROV,
            &[("nodeLossGracePeriod", "1s")],
            "WaitForFirstConsumer",
        )));
        assert!(matches!(
            decide(&c, grace, &here(), false),
            Decision::Never(w) if w.contains("nodeLossGracePeriod")
        ));
        let mut block = c.clone();
        block.spec.as_mut().unwrap().volume_mode = Some("Block".into());
        assert!(matches!(
            decide(&block, ok_class(), &here(), false),
            Decision::Never(w) if w.starts_with("volumeMode Block is not supported")
        ));
        let cordoned = Here {
            unfit: Some("node node-a is cordoned".into()),
            ..here()
        };
        assert!(matches!(
            decide(&c, ok_class(), &cordoned, false),
            Decision::Reschedule(w) if w == "node node-a is cordoned"
        ));
    }

    #[test]
    fn a_node_local_claim_of_an_immediate_class_is_told_once() {
        let id = id();
        let backends = crate::provision::provisioners(&id);
        let c = claim(PROV, None);
        let none = HashSet::new();
        let immediate = Ok(Some(class(PROV, &[], "Immediate")));
        let Immediate::Tell { uid, message } =
            decide_immediate(&c, &id, &backends, &none, &immediate)
        else {
            panic!("not told");
        };
        assert_eq!(uid, "u1");
        assert!(
            message.starts_with(
                "flexvol: StorageClass \"fast\" has volumeBindingMode Immediate, but flexvol/hostpath makes node-local volumes"
            ),
            "{message}"
        );
        let told = HashSet::from(["u1".to_owned()]);
        assert_eq!(
            decide_immediate(&c, &id, &backends, &told, &immediate),
            Immediate::Nothing
        );
        let wffc = ok_class();
        assert_eq!(
            decide_immediate(&c, &id, &backends, &none, &wffc),
            Immediate::Nothing
        );
        assert_eq!(
            decide_immediate(&c, &id, &backends, &none, &Ok(None)),
            Immediate::Nothing
        );
        // A claim with a node is not one the scheduler left out.
        let picked = claim(PROV, Some("node-a"));
        assert_eq!(
            decide_immediate(&picked, &id, &backends, &none, &immediate),
            Immediate::Nothing
        );
        let unread = Err(ApiError::new(
            "read StorageClass fast",
            ApiErrorKind::Other,
            "x",
        ));
        assert!(matches!(
            decide_immediate(&c, &id, &backends, &none, &unread),
            Immediate::Unread(_)
        ));
    }
}
