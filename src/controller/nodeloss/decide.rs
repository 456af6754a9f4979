//! Node loss (issue #24, item 2): what to do with a node-local PV flexvol made whose node is gone
//! for good. The decisions only, from what was read; the calls are made by `flexvol controller`
//! ([`crate::controller`]), which runs once per cluster, never on a node.
//!
//! **Opt-in per class.** A class of a node-local kind (`hostpath`, `lvm`) may set the parameter
//! [`PARAM`] (`nodeLossGracePeriod: "10m"`); without it nothing is ever done for its PVs. The
//! class is read at decision time (a class edited or deleted later changes what happens: a class
//! that is gone or no longer names the PV's provisioner means "not opted in"). NFS classes refuse
//! the parameter ([`split_shared`]): an NFS volume lives on its server, not on a node.
//!
//! **What counts as gone.** A PV is ours for this purpose when it carries the provisioner's marks
//! ([`target`]): `pv.kubernetes.io/provisioned-by: <vendor>/<kind>` of a node-local kind, the label
//! `flexvol/kind` of that kind, the annotation `flexvol/node` (the node that made it), its
//! flexVolume driver `<vendor>/<kind>`, and a required `nodeAffinity` on `kubernetes.io/hostname`.
//! Its node is gone only when the list of Nodes just read holds **no** Node named like
//! `flexvol/node` or like any of the affinity's hostnames, and **no** Node whose
//! `kubernetes.io/hostname` label is one of them ([`Nodes::holds`]). A Node that exists is never
//! acted on, whatever its state: NotReady, unreachable, cordoned, tainted — a node that is only
//! down may come back with its disk, and its volume with it. (The controller also reads the Node
//! by name just before acting, so a Node that came back meanwhile stops it.)
//!
//! **A missing Node is not enough: its kubelet must be silent too** (issue #32, item 6). A Node
//! object can be deleted while its machine runs (`kubectl delete node`, a cloud controller or an
//! autoscaler by mistake), and that kubelet does not register again until it restarts. Its
//! `kube-node-lease` Lease does not help afterwards: it carries an owner reference to the Node, so
//! the garbage collector deletes it with the Node, and the kubelet cannot create it again while the
//! Node is missing (its lease controller only creates a Lease it can point at its Node: 1.20's
//! `component-helpers/apimachinery/lease/controller.go`, `ensureLease`/`newLease`, and
//! `pkg/kubelet/util/nodelease.go`, `SetNodeOwnerFunc`; unchanged since). So the evidence is taken
//! while it exists: [`Heartbeats`] remembers, pass by pass, whether each Node's Lease was being
//! renewed while the Node existed (renewed within its `leaseDurationSeconds`, or its `renewTime`
//! changed since the pass before). A PV whose node is gone is **held** ([`Decision::Hold`],
//! [`ANN_DELETED_ALIVE`], never acted on automatically) when its kubelet was renewing its Lease the
//! last time the controller saw its Node, when a Lease of that name is fresh now, or when the Lease
//! was renewed after the mark ([`ANN_LEASE_AT_MARK`] differs). Only a Node gone with a Lease
//! absent or unchanged and stale, for the whole grace, is taken as lost.
//!
//! **The grace is recorded on the PV.** The first pass that sees the node gone writes
//! [`ANN_MISSING_SINCE`] (RFC 3339, the controller's clock) on the PV, and the node's Lease as it
//! was then ([`ANN_LEASE_AT_MARK`]: its `renewTime`, absent when there was no Lease, compared
//! with the kubelet's own later values only, never with the controller's clock); every later pass measures
//! from it, so a restarted or replaced controller neither resets nor skips the grace. A Node that
//! comes back (same name, or a Node carrying the hostname) clears it and a hold
//! ([`Decision::Clear`]); so does a class that no longer opts in. A value that does not parse, or lies in the future by
//! more than a minute (another clock), is written again with now.
//!
//! **What is done after the grace** ([`Decision::Act`]; the controller's order): an event on the
//! claim and on the PV saying that the node is gone and the claim is deleted so that its owner can
//! recreate it; the claim is deleted only while it is the one the PV's `claimRef` names (uid
//! precondition; a claim recreated under the same name is left alone, [`claim_step`]); then the
//! PV (uid precondition) when its reclaim policy is Delete (a Retain PV is kept for its admin, its
//! claim is still deleted); then the provisioner's finalizer
//! (`external-provisioner.volume.kubernetes.io/finalizer`), and only it, is removed from a PV
//! being deleted, since the instance that would remove it ran on the lost node. A Retain PV whose
//! claim is gone (Released) and that nobody deletes needs nothing more ([`Decision::Nothing`]).

use crate::vocab::ANN_DELETED_ALIVE;
use crate::vocab::ANN_LEASE_AT_MARK;
use crate::vocab::ANN_MISSING_SINCE;
use crate::vocab::ANN_NODE;
use crate::vocab::LABEL_KIND;
use crate::vocab::class::MAX_GRACE;
use crate::vocab::class::PARAM;
use crate::vocab::class::parse_grace;
use crate::vocab::{ANN_PROVISIONED_BY, FINALIZER, HOSTNAME_LABEL};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::jiff::Timestamp;
use std::collections::{HashMap, HashSet};
use std::time::Duration;

/// The namespace of the kubelets' Leases (one per Node, named like it).
pub(crate) const LEASE_NAMESPACE: &str = "kube-node-lease";
/// kubelet's default `nodeLeaseDurationSeconds`, for a Lease that does not say (it renews every
/// quarter of it).
pub(crate) const DEFAULT_LEASE_DURATION: Duration = Duration::from_secs(40);
/// How far in the future a recorded time may be (clocks of two controllers) before it is
/// treated as garbage and written again.
const FUTURE_SLACK: Duration = Duration::from_secs(60);

/// The Nodes that exist, as one list just read: their names and `kubernetes.io/hostname` labels.
#[derive(Debug, Clone, Default)]
pub(crate) struct Nodes {
    names: HashSet<String>,
    hostnames: HashSet<String>,
}

impl Nodes {
    /// From a complete list of the cluster's Nodes (never a partial or failed one: a Node missing
    /// from the list is taken as deleted).
    pub(crate) fn from_list<'a>(nodes: impl IntoIterator<Item = &'a Node>) -> Self {
        let mut n = Self::default();
        for node in nodes {
            if let Some(name) = &node.metadata.name {
                n.names.insert(name.clone());
            }
            if let Some(h) = node
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(HOSTNAME_LABEL))
            {
                n.hostnames.insert(h.clone());
            }
        }
        n
    }

    /// Whether a Node exists for `t`: named like its node or a hostname, or labelled with one.
    pub(crate) fn holds(&self, t: &Target) -> bool {
        std::iter::once(&t.node)
            .chain(t.hostnames.iter())
            .any(|x| self.names.contains(x) || self.hostnames.contains(x))
    }
}

/// A PV this module may act on, as read ([`target`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Target {
    /// The PV's name.
    pub(crate) pv: String,
    /// Its uid (the precondition of its delete).
    pub uid: String,
    /// `<vendor>/<kind>`.
    pub(crate) provisioner: String,
    /// The node that made it (`flexvol/node`).
    pub node: String,
    /// The hostnames its `nodeAffinity` pins it to.
    pub(crate) hostnames: Vec<String>,
    /// Its class (`spec.storageClassName`).
    pub(crate) class: String,
    /// The claim it is bound to (`spec.claimRef`): namespace, name, uid.
    pub claim: Option<(String, String, String)>,
    /// [`ANN_MISSING_SINCE`] as written, if any.
    pub(crate) missing_since: Option<String>,
    /// [`ANN_LEASE_AT_MARK`] as written, if any.
    pub(crate) lease_at_mark: Option<String>,
    /// [`ANN_DELETED_ALIVE`] as written, if any.
    pub(crate) deleted_alive: Option<String>,
    /// Reclaim policy Delete.
    pub(crate) reclaim_delete: bool,
    /// Being deleted (`deletionTimestamp`).
    pub(crate) deleting: bool,
    /// Carries the provisioner's finalizer.
    pub(crate) finalizer: bool,
    /// Released (its claim is gone).
    pub released: bool,
}

fn ann<'a>(pv: &'a PersistentVolume, key: &str) -> Option<&'a str> {
    pv.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(key))
        .map(String::as_str)
        .filter(|s| !s.is_empty())
}

/// `pv` as a [`Target`] when it carries every mark of a node-local PV flexvol made (module docs);
/// `local_kinds`: the node-local kinds (`hostpath`, `lvm`) of provisioner `vendor`.
pub(crate) fn target(pv: &PersistentVolume, vendor: &str, local_kinds: &[&str]) -> Option<Target> {
    let provisioner = ann(pv, ANN_PROVISIONED_BY)?;
    let kind = provisioner.strip_prefix(vendor)?.strip_prefix('/')?;
    if !local_kinds.contains(&kind) {
        return None;
    }
    let label = pv.metadata.labels.as_ref().and_then(|l| l.get(LABEL_KIND));
    if label.map(String::as_str) != Some(kind) {
        return None;
    }
    let node = ann(pv, ANN_NODE)?;
    let spec = pv.spec.as_ref()?;
    if !crate::vocab::pv_source_is(pv, provisioner) {
        return None;
    }
    let mut hostnames = Vec::new();
    let terms = &spec
        .node_affinity
        .as_ref()?
        .required
        .as_ref()?
        .node_selector_terms;
    for t in terms {
        for e in t.match_expressions.as_deref().unwrap_or_default() {
            if e.key == HOSTNAME_LABEL && e.operator == "In" {
                hostnames.extend(e.values.iter().flatten().cloned());
            }
        }
    }
    if hostnames.is_empty() {
        return None;
    }
    let claim = spec.claim_ref.as_ref().and_then(|r| {
        Some((
            r.namespace.clone()?,
            r.name.clone()?,
            r.uid.clone().filter(|u| !u.is_empty())?,
        ))
    });
    Some(Target {
        pv: pv.metadata.name.clone()?,
        uid: pv.metadata.uid.clone()?,
        provisioner: provisioner.to_owned(),
        node: node.to_owned(),
        hostnames,
        class: spec.storage_class_name.clone().unwrap_or_default(),
        claim,
        missing_since: ann(pv, ANN_MISSING_SINCE).map(str::to_owned),
        lease_at_mark: ann(pv, ANN_LEASE_AT_MARK).map(str::to_owned),
        deleted_alive: ann(pv, ANN_DELETED_ALIVE).map(str::to_owned),
        reclaim_delete: spec.persistent_volume_reclaim_policy.as_deref() == Some("Delete"),
        deleting: pv.metadata.deletion_timestamp.is_some(),
        finalizer: pv
            .metadata
            .finalizers
            .as_deref()
            .unwrap_or_default()
            .iter()
            .any(|f| f == FINALIZER),
        released: pv.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Released"),
    })
}

impl Target {
    /// The names its node's Lease may have: its node, then its hostnames (deduplicated).
    pub(crate) fn node_names(&self) -> Vec<&str> {
        let mut out: Vec<&str> = Vec::new();
        for n in std::iter::once(&self.node).chain(self.hostnames.iter()) {
            if !out.contains(&n.as_str()) {
                out.push(n);
            }
        }
        out
    }
}

/// A kubelet's Lease (`kube-node-lease/<node>`) as read: only what the decisions use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LeaseSeen {
    /// `spec.renewTime` (the kubelet's clock).
    pub(crate) renew: Option<Timestamp>,
    /// `spec.leaseDurationSeconds`, [`DEFAULT_LEASE_DURATION`] when absent or not positive.
    pub(crate) duration: Duration,
}

impl LeaseSeen {
    /// From a Lease as read.
    pub(crate) fn from_lease(l: &Lease) -> Self {
        let spec = l.spec.as_ref();
        Self {
            renew: spec.and_then(|s| s.renew_time.as_ref()).map(|t| t.0),
            duration: spec
                .and_then(|s| s.lease_duration_seconds)
                .and_then(|d| u64::try_from(d).ok())
                .filter(|d| *d > 0)
                .map_or(DEFAULT_LEASE_DURATION, |d| {
                    Duration::from_secs(d).min(MAX_GRACE)
                }),
        }
    }

    /// Renewed within its own duration of `now`, by the controller's clock. A `renewTime` ahead of
    /// `now` counts as fresh: a kubelet's clock ahead of ours holds its volumes, never the reverse.
    pub(crate) fn fresh(&self, now: Timestamp) -> bool {
        let Some(r) = self.renew else {
            return false;
        };
        match Duration::try_from(now.duration_since(r)) {
            Ok(age) => age <= self.duration,
            Err(_) => true, // in the future
        }
    }

    /// What [`ANN_LEASE_AT_MARK`] holds: `renewTime` to the microsecond, or `never`.
    pub(crate) fn token(&self) -> String {
        self.renew.map_or_else(
            || "never".to_owned(),
            |r| r.strftime("%Y-%m-%dT%H:%M:%S%.6fZ").to_string(),
        )
    }
}

/// What the controller has seen of each node's Lease while its Node existed, one entry per Node
/// name and `kubernetes.io/hostname` label, kept in memory across passes (module docs). Only the
/// last observation of a Node that exists is kept: once the Node is gone, its entry says whether
/// its kubelet was alive when it was last seen.
#[derive(Debug, Default)]
pub(crate) struct Heartbeats {
    last: HashMap<String, Beat>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Beat {
    renew: Option<Timestamp>,
    alive: bool,
}

impl Heartbeats {
    /// Records one pass: `nodes`, the complete list of the Nodes that exist, read **after**
    /// `leases` (the kubelets' Leases by name, all of them, read first: a Lease that the garbage
    /// collector removed with its Node between the two reads can then only belong to a Node that is
    /// absent from the list, which leaves that Node's last observation as it was).
    pub(crate) fn observe<'a>(
        &mut self,
        nodes: impl IntoIterator<Item = &'a Node>,
        leases: &HashMap<String, LeaseSeen>,
        now: Timestamp,
    ) {
        for node in nodes {
            let Some(name) = node.metadata.name.as_deref() else {
                continue;
            };
            let lease = leases.get(name);
            let renew = lease.and_then(|l| l.renew);
            let changed = renew.is_some()
                && self
                    .last
                    .get(name)
                    .is_some_and(|b| b.renew.is_some() && b.renew != renew);
            let beat = Beat {
                renew,
                alive: changed || lease.is_some_and(|l| l.fresh(now)),
            };
            if let Some(h) = node
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(HOSTNAME_LABEL))
                .filter(|h| h.as_str() != name)
            {
                self.last.insert(h.clone(), beat.clone());
            }
            self.last.insert(name.to_owned(), beat);
        }
    }

    /// Whether the kubelet of `t`'s node (any of its names) was renewing its Lease the last time
    /// its Node was seen by this process.
    pub(crate) fn was_alive(&self, t: &Target) -> bool {
        t.node_names()
            .iter()
            .any(|n| self.last.get(*n).is_some_and(|b| b.alive))
    }
}

/// The evidence about a target's kubelet, as read for one decision.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Life {
    /// Its Lease now (the first of [`Target::node_names`] that has one); `None`: no Lease.
    pub(crate) lease: Option<LeaseSeen>,
    /// [`Heartbeats::was_alive`].
    pub(crate) was_alive: bool,
}

impl Life {
    /// From the Leases read (by name) and the heartbeats remembered.
    pub(crate) fn of(t: &Target, leases: &HashMap<String, LeaseSeen>, beats: &Heartbeats) -> Self {
        Self {
            lease: t.node_names().iter().find_map(|n| leases.get(*n)).cloned(),
            was_alive: beats.was_alive(t),
        }
    }
}

/// The class as read at decision time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ClassGrace {
    /// Opted in with this grace.
    Grace(Duration),
    /// Not opted in: no [`PARAM`], the class is gone, or it names another provisioner.
    Off,
    /// [`PARAM`] does not parse (the class was edited after validation): nothing is done.
    Invalid(String),
}

/// What `class` (`None`: not found) says for a PV of `provisioner`.
pub(crate) fn class_grace(class: Option<&StorageClass>, provisioner: &str) -> ClassGrace {
    let Some(c) = class else {
        return ClassGrace::Off;
    };
    if c.provisioner != provisioner {
        return ClassGrace::Off;
    }
    match c.parameters.as_ref().and_then(|p| p.get(PARAM)) {
        None => ClassGrace::Off,
        Some(v) => match parse_grace(v) {
            Ok(d) => ClassGrace::Grace(d),
            Err(e) => ClassGrace::Invalid(e.to_string()),
        },
    }
}

/// What to do with one [`Target`] now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Decision {
    /// Nothing: the node exists (with no mark to clear), the class does not opt in (no mark), or
    /// the PV is held already ([`ANN_DELETED_ALIVE`]).
    Nothing,
    /// Remove [`ANN_MISSING_SINCE`], [`ANN_LEASE_AT_MARK`] and [`ANN_DELETED_ALIVE`]: the node is
    /// back, or the class no longer opts in.
    Clear,
    /// Write [`ANN_MISSING_SINCE`] (now) and [`ANN_LEASE_AT_MARK`] (`None`: remove it): the node
    /// was just seen gone with its kubelet silent, or the value written is garbage.
    Mark {
        /// [`ANN_MISSING_SINCE`].
        since: String,
        /// [`ANN_LEASE_AT_MARK`].
        lease: Option<String>,
    },
    /// The Node is gone but its kubelet was seen alive: write [`ANN_DELETED_ALIVE`] (now), remove
    /// any mark, and never act; say why.
    Hold {
        /// [`ANN_DELETED_ALIVE`].
        at: String,
        /// What was seen, for the event and the log.
        why: String,
    },
    /// The node is gone, the grace not over: look again after this long.
    Wait(Duration),
    /// The node has been gone longer than the grace: events, claim, PV, finalizer.
    Act {
        /// Since when the node has been missing (as recorded).
        since: String,
        /// The class's grace.
        grace: Duration,
    },
    /// The class's parameter is invalid: nothing is done; say so.
    Invalid(String),
}

/// RFC 3339 of `t`, as [`ANN_MISSING_SINCE`] holds it.
pub(crate) fn stamp(t: Timestamp) -> String {
    t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

/// The decision for `t` (see the module docs), given the Nodes just listed, what is known of its
/// kubelet, its class as read now, and the time.
pub(crate) fn decide(
    t: &Target,
    nodes: &Nodes,
    life: &Life,
    class: &ClassGrace,
    now: Timestamp,
) -> Decision {
    let marked =
        t.missing_since.is_some() || t.lease_at_mark.is_some() || t.deleted_alive.is_some();
    if nodes.holds(t) {
        return if marked {
            Decision::Clear
        } else {
            Decision::Nothing
        };
    }
    let grace = match class {
        ClassGrace::Off if marked => return Decision::Clear,
        ClassGrace::Off => return Decision::Nothing,
        ClassGrace::Invalid(e) => return Decision::Invalid(e.clone()),
        ClassGrace::Grace(g) => *g,
    };
    if t.deleted_alive.is_some() {
        return Decision::Nothing; // held: until the Node is back or an admin lifts it
    }
    let hold = |why: String| Decision::Hold {
        at: stamp(now),
        why,
    };
    if life.was_alive {
        return hold(format!(
            "its kubelet was renewing its Lease {LEASE_NAMESPACE}/{} when its Node was last seen",
            t.node
        ));
    }
    let lease_now = life.lease.as_ref().map(LeaseSeen::token);
    if let Some(l) = life.lease.as_ref().filter(|l| l.fresh(now)) {
        return hold(format!(
            "its kubelet renews its Lease (renewTime {}) although its Node is gone",
            l.token()
        ));
    }
    if t.missing_since.is_some() && lease_now.is_some() && lease_now != t.lease_at_mark {
        return hold(format!(
            "its Lease was renewed during the grace (renewTime {} now, {} when marked)",
            lease_now.as_deref().unwrap_or_default(),
            t.lease_at_mark.as_deref().unwrap_or("no Lease")
        ));
    }
    let mark = || Decision::Mark {
        since: stamp(now),
        lease: lease_now.clone(),
    };
    let since = t
        .missing_since
        .as_deref()
        .and_then(|s| s.parse::<Timestamp>().ok());
    let Some(since) = since else {
        return mark();
    };
    let Ok(elapsed) = Duration::try_from(now.duration_since(since)) else {
        // In the future: another clock by a little (wait), or garbage (write it again).
        return if Duration::try_from(since.duration_since(now)).is_ok_and(|d| d <= FUTURE_SLACK) {
            Decision::Wait(grace)
        } else {
            mark()
        };
    };
    if elapsed >= grace && t.released && !t.reclaim_delete && !t.deleting {
        // Done already: the claim is gone and a Retain PV stays its admin's.
        Decision::Nothing
    } else if elapsed >= grace {
        Decision::Act {
            since: stamp(since),
            grace,
        }
    } else {
        Decision::Wait(grace - elapsed)
    }
}

/// What to do with the claim of an [`Decision::Act`]ed PV, read from the server just before.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ClaimStep {
    /// The PV is bound to no claim, or the claim is gone.
    None,
    /// A claim of that name exists with another uid (recreated by its owner): it is not this
    /// PV's and is left alone.
    Replaced,
    /// Already being deleted (kubelet or the pvc-protection finalizer holds it until its pods
    /// are gone): nothing more to do.
    Deleting,
    /// Delete it, with this uid as the precondition.
    Delete(String),
}

/// The step for the claim `t` is bound to, given that claim as read now (`None`: not found).
pub(crate) fn claim_step(t: &Target, claim: Option<&PersistentVolumeClaim>) -> ClaimStep {
    let (Some((_, _, want)), Some(c)) = (&t.claim, claim) else {
        return ClaimStep::None;
    };
    if c.metadata.uid.as_deref() != Some(want.as_str()) {
        return ClaimStep::Replaced;
    }
    if c.metadata.deletion_timestamp.is_some() {
        return ClaimStep::Deleting;
    }
    ClaimStep::Delete(want.clone())
}

/// The message of the events of an [`Decision::Act`].
pub(crate) fn event_message(
    t: &Target,
    since: &str,
    grace: Duration,
    claim_deleted: bool,
) -> String {
    let what = match (&t.claim, claim_deleted) {
        (Some((ns, name, _)), true) => format!(
            "the claim {ns}/{name} is deleted so that its owner can recreate it (a StatefulSet does) and its pod can run on another node"
        ),
        _ => "it has no claim left to delete".to_owned(),
    };
    let pv = if t.reclaim_delete {
        format!("the PV {} is deleted", t.pv)
    } else {
        format!(
            "the PV {} is kept (reclaim policy is not Delete): delete it when done",
            t.pv
        )
    };
    format!(
        "node {} has had no Node object since {since}, and no renewed Lease, longer than the class {}'s {PARAM} of {}s: its {} volume is taken as lost with it; {what}; {pv}",
        t.node,
        t.class,
        grace.as_secs(),
        t.provisioner
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vocab::class::{
        MIN_GRACE, PARAM, ParamError, parse_grace, split_param, split_shared,
    };
    use crate::vocab::{HOSTNAME_LABEL, LABEL_KIND};
    use k8s_openapi::api::core::v1::{
        FlexPersistentVolumeSource, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm,
        ObjectReference, PersistentVolumeSpec, VolumeNodeAffinity,
    };
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
    use std::collections::BTreeMap;

    fn pv(kind: &str, node: &str) -> PersistentVolume {
        PersistentVolume {
            metadata: ObjectMeta {
                name: Some("pvc-1".into()),
                uid: Some("pv-uid".into()),
                annotations: Some(BTreeMap::from([
                    (ANN_PROVISIONED_BY.into(), format!("flexvol/{kind}")),
                    (ANN_NODE.into(), node.into()),
                ])),
                labels: Some(BTreeMap::from([(LABEL_KIND.into(), kind.into())])),
                finalizers: Some(vec!["kubernetes.io/pv-protection".into(), FINALIZER.into()]),
                ..Default::default()
            },
            spec: Some(PersistentVolumeSpec {
                flex_volume: Some(FlexPersistentVolumeSource {
                    driver: format!("flexvol/{kind}"),
                    ..Default::default()
                }),
                node_affinity: Some(VolumeNodeAffinity {
                    required: Some(NodeSelector {
                        node_selector_terms: vec![NodeSelectorTerm {
                            match_expressions: Some(vec![NodeSelectorRequirement {
                                key: HOSTNAME_LABEL.into(),
                                operator: "In".into(),
                                values: Some(vec![node.into()]),
                            }]),
                            ..Default::default()
                        }],
                    }),
                }),
                claim_ref: Some(ObjectReference {
                    namespace: Some("ns".into()),
                    name: Some("data".into()),
                    uid: Some("claim-uid".into()),
                    ..Default::default()
                }),
                storage_class_name: Some("local".into()),
                persistent_volume_reclaim_policy: Some("Delete".into()),
                ..Default::default()
            }),
            status: None,
        }
    }

    fn node(name: &str, ready: bool, cordoned: bool) -> Node {
        use k8s_openapi::api::core::v1::{NodeCondition, NodeSpec, NodeStatus};
        Node {
            metadata: ObjectMeta {
                name: Some(name.into()),
                labels: Some(BTreeMap::from([(HOSTNAME_LABEL.into(), name.into())])),
                ..Default::default()
            },
            spec: Some(NodeSpec {
                unschedulable: Some(cordoned),
                ..Default::default()
            }),
            status: Some(NodeStatus {
                conditions: Some(vec![NodeCondition {
                    type_: "Ready".into(),
                    status: if ready { "True" } else { "Unknown" }.into(),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
        }
    }

    fn class(params: &[(&str, &str)]) -> StorageClass {
        StorageClass {
            metadata: ObjectMeta {
                name: Some("local".into()),
                ..Default::default()
            },
            provisioner: "flexvol/hostpath".into(),
            parameters: Some(
                params
                    .iter()
                    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                    .collect(),
            ),
            ..Default::default()
        }
    }

    const LOCAL: [&str; 2] = ["hostpath", "lvm"];

    fn t0() -> Timestamp {
        "2026-11-26T09:00:00Z".parse().unwrap()
    }

    fn at(secs: i64) -> Timestamp {
        t0() + k8s_openapi::jiff::SignedDuration::from_secs(secs)
    }

    fn marked(mut v: PersistentVolume, when: &str) -> PersistentVolume {
        v.metadata
            .annotations
            .as_mut()
            .unwrap()
            .insert(ANN_MISSING_SINCE.into(), when.into());
        v
    }

    const TEN_MIN: Duration = Duration::from_secs(600);

    #[test]
    fn grace_periods_parse_like_go_durations_within_bounds() {
        assert_eq!(parse_grace("10m"), Ok(TEN_MIN));
        assert_eq!(parse_grace("1h30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_grace("90s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_grace("10s"), Ok(MIN_GRACE));
        for bad in [
            "",
            "10",
            "m",
            "5s",
            "0s",
            "10 m",
            "1.5h",
            "-10m",
            "10m1h",
            "1m1m",
            "9999999h",
            "99999999999999999999s",
            "10d",
        ] {
            let e = parse_grace(bad).unwrap_err();
            assert!(
                matches!(&e, ParamError::BadDuration { value, .. } if value == bad),
                "{bad}: {e:?}"
            );
            let e = e.to_string();
            assert!(e.contains(PARAM) && e.contains("\"10m\""), "{bad}: {e}");
        }
    }

    #[test]
    fn the_param_is_split_off_for_local_kinds_and_refused_for_nfs() {
        let p: BTreeMap<String, String> = [(PARAM, "10m"), ("mode", "0770")]
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        let rest = split_param(&p).unwrap();
        assert_eq!(rest.keys().collect::<Vec<_>>(), ["mode"]);
        let mut badp = p.clone();
        badp.insert(PARAM.into(), "soon".into());
        let e = split_param(&badp).unwrap_err();
        assert!(matches!(e, ParamError::BadDuration { .. }), "{e:?}");
        assert!(e.to_string().contains("soon"), "{e}");
        let e = split_shared(&p, "nfs").unwrap_err();
        assert_eq!(e, ParamError::SharedKind { kind: "nfs".into() });
        let e = e.to_string();
        assert!(e.contains("node-local kinds") && e.contains("nfs"), "{e}");
        assert!(split_shared(&rest, "nfs").is_ok());
    }

    #[test]
    fn only_node_local_pvs_flexvol_made_are_targets() {
        let t = target(&pv("hostpath", "node-b"), "flexvol", &LOCAL).unwrap();
        assert_eq!(t.node, "node-b");
        assert_eq!(t.hostnames, ["node-b"]);
        assert_eq!(
            t.claim,
            Some(("ns".into(), "data".into(), "claim-uid".into()))
        );
        assert!(t.reclaim_delete && t.finalizer && !t.deleting);
        assert!(target(&pv("lvm", "node-b"), "flexvol", &LOCAL).is_some());
        // NFS (shared), another vendor, no provisioned-by, a label that disagrees, another
        // driver, no node annotation, no affinity: not ours to judge.
        assert_eq!(target(&pv("nfs", "node-b"), "flexvol", &LOCAL), None);
        assert_eq!(target(&pv("hostpath", "node-b"), "other", &LOCAL), None);
        let mut v = pv("hostpath", "node-b");
        v.metadata
            .annotations
            .as_mut()
            .unwrap()
            .remove(ANN_PROVISIONED_BY);
        assert_eq!(target(&v, "flexvol", &LOCAL), None);
        let mut v = pv("hostpath", "node-b");
        v.metadata.labels = Some(BTreeMap::from([(LABEL_KIND.into(), "lvm".into())]));
        assert_eq!(target(&v, "flexvol", &LOCAL), None);
        let mut v = pv("hostpath", "node-b");
        v.spec
            .as_mut()
            .unwrap()
            .flex_volume
            .as_mut()
            .unwrap()
            .driver = "x/hostpath".into();
        assert_eq!(target(&v, "flexvol", &LOCAL), None);
        let mut v = pv("hostpath", "node-b");
        v.metadata.annotations.as_mut().unwrap().remove(ANN_NODE);
        assert_eq!(target(&v, "flexvol", &LOCAL), None);
        let mut v = pv("hostpath", "node-b");
        v.spec.as_mut().unwrap().node_affinity = None;
        assert_eq!(target(&v, "flexvol", &LOCAL), None);
        let mut v = pv("hostpath", "node-b");
        v.spec.as_mut().unwrap().flex_volume = None;
        assert_eq!(target(&v, "flexvol", &LOCAL), None);
        // A CSI PV of a class with csiDriver carries the same marks: a target as well.
        let spec = v.spec.as_mut().unwrap();
        spec.csi = Some(k8s_openapi::api::core::v1::CSIPersistentVolumeSource {
            driver: "hostpath.csi.flexvol.io".into(),
            volume_handle: "pvc-x".into(),
            ..Default::default()
        });
        assert_eq!(
            target(&v, "flexvol", &LOCAL),
            target(&pv("hostpath", "node-b"), "flexvol", &LOCAL)
        );
        assert!(target(&v, "flexvol", &LOCAL).is_some());
    }

    #[test]
    fn a_node_that_exists_is_never_acted_on_whatever_its_state() {
        let t = target(&pv("hostpath", "node-b"), "flexvol", &LOCAL).unwrap();
        let grace = ClassGrace::Grace(MIN_GRACE);
        for n in [
            node("node-b", true, false),
            node("node-b", false, false), // NotReady (status Unknown: unreachable)
            node("node-b", false, true),  // and cordoned
        ] {
            let nodes = Nodes::from_list([&node("node-a", true, false), &n]);
            assert_eq!(
                decide(&t, &nodes, &Life::default(), &grace, at(1_000_000)),
                Decision::Nothing
            );
        }
        // Marked long ago, node present: the mark is cleared, nothing deleted.
        let tm = target(
            &marked(pv("hostpath", "node-b"), "2020-01-01T00:00:00Z"),
            "flexvol",
            &LOCAL,
        )
        .unwrap();
        let nodes = Nodes::from_list([&node("node-b", false, true)]);
        assert_eq!(
            decide(&tm, &nodes, &Life::default(), &grace, at(0)),
            Decision::Clear
        );
        // A Node of another name carrying the PV's hostname label counts as present.
        let mut other = node("node-b-renamed", false, false);
        other
            .metadata
            .labels
            .as_mut()
            .unwrap()
            .insert(HOSTNAME_LABEL.into(), "node-b".into());
        let nodes = Nodes::from_list([&other]);
        assert_eq!(
            decide(&tm, &nodes, &Life::default(), &grace, at(0)),
            Decision::Clear
        );
    }

    #[test]
    fn an_absent_node_is_marked_then_waited_for_then_acted_on() {
        let nodes = Nodes::from_list([&node("node-a", true, false)]);
        let grace = ClassGrace::Grace(TEN_MIN);
        let t = target(&pv("hostpath", "node-b"), "flexvol", &LOCAL).unwrap();
        assert_eq!(
            decide(&t, &nodes, &Life::default(), &grace, at(0)),
            Decision::Mark {
                since: "2026-11-26T09:00:00Z".into(),
                lease: None
            }
        );
        let v = marked(pv("hostpath", "node-b"), "2026-11-26T09:00:00Z");
        let t = target(&v, "flexvol", &LOCAL).unwrap();
        assert_eq!(
            decide(&t, &nodes, &Life::default(), &grace, at(599)),
            Decision::Wait(Duration::from_secs(1))
        );
        assert_eq!(
            decide(&t, &nodes, &Life::default(), &grace, at(600)),
            Decision::Act {
                since: "2026-11-26T09:00:00Z".into(),
                grace: TEN_MIN
            }
        );
        // A restarted controller reads the same mark: neither reset nor skipped.
        assert!(matches!(
            decide(&t, &nodes, &Life::default(), &grace, at(300)),
            Decision::Wait(d) if d == Duration::from_secs(300)
        ));
        // An LVM PV is judged the same way.
        let t = target(
            &marked(pv("lvm", "node-b"), "2026-11-26T09:00:00Z"),
            "flexvol",
            &LOCAL,
        )
        .unwrap();
        assert!(matches!(
            decide(&t, &nodes, &Life::default(), &grace, at(601)),
            Decision::Act { .. }
        ));
    }

    #[test]
    fn a_retained_pv_whose_claim_is_gone_is_left_to_its_admin() {
        let nodes = Nodes::default();
        let grace = ClassGrace::Grace(TEN_MIN);
        let mut v = marked(pv("hostpath", "node-b"), "2026-11-26T09:00:00Z");
        v.spec.as_mut().unwrap().persistent_volume_reclaim_policy = Some("Retain".into());
        let t = target(&v, "flexvol", &LOCAL).unwrap();
        assert!(matches!(
            decide(&t, &nodes, &Life::default(), &grace, at(600)),
            Decision::Act { .. }
        ));
        v.status = Some(k8s_openapi::api::core::v1::PersistentVolumeStatus {
            phase: Some("Released".into()),
            ..Default::default()
        });
        let t = target(&v, "flexvol", &LOCAL).unwrap();
        assert_eq!(
            decide(&t, &nodes, &Life::default(), &grace, at(600)),
            Decision::Nothing
        );
        // Deleted by its admin: the provisioner's finalizer still has to go.
        v.metadata.deletion_timestamp = Some(Time(at(599)));
        let t = target(&v, "flexvol", &LOCAL).unwrap();
        assert!(matches!(
            decide(&t, &nodes, &Life::default(), &grace, at(600)),
            Decision::Act { .. }
        ));
    }

    #[test]
    fn garbage_or_far_future_marks_are_written_again() {
        let nodes = Nodes::default();
        let grace = ClassGrace::Grace(TEN_MIN);
        for bad in ["yesterday", "2099-01-01T00:00:00Z"] {
            let t = target(&marked(pv("hostpath", "n"), bad), "flexvol", &LOCAL).unwrap();
            assert_eq!(
                decide(&t, &nodes, &Life::default(), &grace, at(0)),
                Decision::Mark {
                    since: stamp(at(0)),
                    lease: None
                },
                "{bad}"
            );
        }
        // A few seconds ahead (another controller's clock): wait the whole grace.
        let t = target(
            &marked(pv("hostpath", "n"), "2026-11-26T09:00:30Z"),
            "flexvol",
            &LOCAL,
        )
        .unwrap();
        assert_eq!(
            decide(&t, &nodes, &Life::default(), &grace, at(0)),
            Decision::Wait(TEN_MIN)
        );
    }

    #[test]
    fn a_class_that_does_not_opt_in_does_nothing() {
        let nodes = Nodes::default();
        let t = target(&pv("hostpath", "node-b"), "flexvol", &LOCAL).unwrap();
        let off = class_grace(Some(&class(&[("mode", "0770")])), "flexvol/hostpath");
        assert_eq!(off, ClassGrace::Off);
        assert_eq!(
            decide(&t, &nodes, &Life::default(), &off, at(1_000_000)),
            Decision::Nothing
        );
        // Gone, or now naming another provisioner: off too.
        assert_eq!(class_grace(None, "flexvol/hostpath"), ClassGrace::Off);
        assert_eq!(
            class_grace(Some(&class(&[(PARAM, "10m")])), "flexvol/lvm"),
            ClassGrace::Off
        );
        assert_eq!(
            class_grace(Some(&class(&[(PARAM, "10m")])), "flexvol/hostpath"),
            ClassGrace::Grace(TEN_MIN)
        );
        // Opted out after the mark: the mark goes.
        let tm = target(
            &marked(pv("hostpath", "node-b"), "2020-01-01T00:00:00Z"),
            "flexvol",
            &LOCAL,
        )
        .unwrap();
        assert_eq!(
            decide(&tm, &nodes, &Life::default(), &off, at(0)),
            Decision::Clear
        );
        // Edited into something invalid: nothing, and said.
        let bad = class_grace(Some(&class(&[(PARAM, "often")])), "flexvol/hostpath");
        assert!(
            matches!(decide(&tm, &nodes, &Life::default(), &bad, at(0)), Decision::Invalid(e) if e.contains("often"))
        );
    }

    #[test]
    fn only_the_claim_the_pv_names_is_deleted() {
        let t = target(&pv("hostpath", "node-b"), "flexvol", &LOCAL).unwrap();
        let claim = |uid: &str, deleting: bool| PersistentVolumeClaim {
            metadata: ObjectMeta {
                namespace: Some("ns".into()),
                name: Some("data".into()),
                uid: Some(uid.into()),
                deletion_timestamp: deleting.then(|| Time(at(0))),
                ..Default::default()
            },
            ..Default::default()
        };
        assert_eq!(
            claim_step(&t, Some(&claim("claim-uid", false))),
            ClaimStep::Delete("claim-uid".into())
        );
        assert_eq!(
            claim_step(&t, Some(&claim("new-uid", false))),
            ClaimStep::Replaced
        );
        assert_eq!(
            claim_step(&t, Some(&claim("claim-uid", true))),
            ClaimStep::Deleting
        );
        assert_eq!(claim_step(&t, None), ClaimStep::None);
        let mut v = pv("hostpath", "node-b");
        v.spec.as_mut().unwrap().claim_ref = None;
        let unbound = target(&v, "flexvol", &LOCAL).unwrap();
        assert_eq!(
            claim_step(&unbound, Some(&claim("claim-uid", false))),
            ClaimStep::None
        );
    }

    #[test]
    fn the_event_says_what_happened_and_why() {
        let t = target(&pv("hostpath", "node-b"), "flexvol", &LOCAL).unwrap();
        let m = event_message(&t, "2026-11-26T09:00:00Z", TEN_MIN, true);
        for part in [
            "node node-b has had no Node object since 2026-11-26T09:00:00Z",
            "nodeLossGracePeriod of 600s",
            "claim ns/data is deleted so that its owner can recreate it",
            "PV pvc-1 is deleted",
        ] {
            assert!(m.contains(part), "{m} lacks {part}");
        }
        let mut v = pv("hostpath", "node-b");
        v.spec.as_mut().unwrap().persistent_volume_reclaim_policy = Some("Retain".into());
        let t = target(&v, "flexvol", &LOCAL).unwrap();
        assert!(event_message(&t, "x", TEN_MIN, true).contains("is kept"));
    }

    fn lease(renew: Option<Timestamp>) -> Lease {
        use k8s_openapi::api::coordination::v1::LeaseSpec;
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
        Lease {
            metadata: ObjectMeta {
                name: Some("node-b".into()),
                namespace: Some(LEASE_NAMESPACE.into()),
                ..Default::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some("node-b".into()),
                lease_duration_seconds: Some(40),
                renew_time: renew.map(MicroTime),
                ..Default::default()
            }),
        }
    }

    fn leases(renew: Option<Timestamp>) -> HashMap<String, LeaseSeen> {
        HashMap::from([("node-b".to_owned(), LeaseSeen::from_lease(&lease(renew)))])
    }

    /// Issue #32, item 6: `kubectl delete node` on a machine whose kubelet runs. The garbage
    /// collector removes its Lease with the Node and the kubelet cannot create it again, so what
    /// stops the deletion is what the controller saw while the Node existed.
    #[test]
    fn a_node_deleted_while_its_kubelet_renews_its_lease_loses_nothing_however_long() {
        let grace = ClassGrace::Grace(TEN_MIN);
        let t = target(&pv("hostpath", "node-b"), "flexvol", &LOCAL).unwrap();
        let mut beats = Heartbeats::default();
        // Passes while the Node exists: its kubelet renews every 10 s.
        let both = [node("node-a", true, false), node("node-b", true, false)];
        for s in [0, 10, 20] {
            beats.observe(&both, &leases(Some(at(s))), at(s + 2));
        }
        // The Node is deleted; its Lease goes with it (garbage collector) and is never recreated.
        let left = [node("node-a", true, false)];
        beats.observe(&left, &HashMap::new(), at(32));
        let nodes = Nodes::from_list(&left);
        let life = Life::of(&t, &HashMap::new(), &beats);
        assert!(life.was_alive && life.lease.is_none());
        let Decision::Hold { at: held, why } = decide(&t, &nodes, &life, &grace, at(32)) else {
            panic!("not held")
        };
        assert_eq!(held, stamp(at(32)));
        assert!(why.contains("kube-node-lease/node-b"), "{why}");
        // Held: nothing, a day or a year later, with the Lease absent, stale or present.
        let v = marked(pv("hostpath", "node-b"), "2026-11-26T09:00:00Z");
        let mut v = v;
        v.metadata
            .annotations
            .as_mut()
            .unwrap()
            .insert(ANN_DELETED_ALIVE.into(), held.clone());
        let th = target(&v, "flexvol", &LOCAL).unwrap();
        for (secs, l) in [(86_400, None), (31_000_000, Some(at(0)))] {
            let life = Life {
                lease: l.map(|r| LeaseSeen::from_lease(&lease(Some(r)))),
                was_alive: false, // a restarted controller remembers nothing
            };
            assert_eq!(
                decide(&th, &nodes, &life, &grace, at(secs)),
                Decision::Nothing
            );
        }
        // The Node back: the hold goes.
        let nodes = Nodes::from_list(&both);
        assert_eq!(
            decide(&th, &nodes, &Life::default(), &grace, at(0)),
            Decision::Clear
        );
        // A kubelet whose clock is behind ours (its renewTime always looks old): the change
        // between two passes is the evidence.
        let mut beats = Heartbeats::default();
        beats.observe(&both, &leases(Some(at(-3600))), at(0));
        assert!(!beats.was_alive(&t));
        beats.observe(&both, &leases(Some(at(-3590))), at(10));
        assert!(beats.was_alive(&t));
        // The Lease read before the Nodes: a Lease already removed with its Node while the Node
        // list still held it cannot happen; one removed after is not seen as absent.
        beats.observe(&left, &HashMap::new(), at(20));
        assert!(beats.was_alive(&t));
    }

    #[test]
    fn a_lease_fresh_now_or_renewed_mid_grace_cancels_the_grace() {
        let grace = ClassGrace::Grace(TEN_MIN);
        let nodes = Nodes::from_list([&node("node-a", true, false)]);
        let t = target(&pv("hostpath", "node-b"), "flexvol", &LOCAL).unwrap();
        // A Lease renewed 5 s ago although the Node is gone (deleted with --cascade=orphan, or
        // read before the garbage collector): held, never marked.
        let life = Life::of(&t, &leases(Some(at(-5))), &Heartbeats::default());
        assert!(matches!(
            decide(&t, &nodes, &life, &grace, at(0)),
            Decision::Hold { why, .. } if why.contains("renews its Lease")
        ));
        // Marked with the Lease stale (renewed long ago, by its own clock), then renewed
        // mid-grace: held, whatever the clocks say (the kubelet's clock is an hour behind here).
        let stale = Life::of(&t, &leases(Some(at(-3600))), &Heartbeats::default());
        let Decision::Mark { since, lease } = decide(&t, &nodes, &stale, &grace, at(0)) else {
            panic!("not marked")
        };
        assert_eq!(lease.as_deref(), Some("2026-11-26T08:00:00.000000Z"));
        let mut v = marked(pv("hostpath", "node-b"), &since);
        v.metadata
            .annotations
            .as_mut()
            .unwrap()
            .insert(ANN_LEASE_AT_MARK.into(), lease.unwrap());
        let tm = target(&v, "flexvol", &LOCAL).unwrap();
        assert_eq!(
            decide(&tm, &nodes, &stale, &grace, at(300)),
            Decision::Wait(Duration::from_secs(300))
        );
        let renewed = Life::of(&tm, &leases(Some(at(-3300))), &Heartbeats::default());
        assert!(matches!(
            decide(&tm, &nodes, &renewed, &grace, at(300)),
            Decision::Hold { why, .. } if why.contains("renewed during the grace")
        ));
        assert!(matches!(
            decide(&tm, &nodes, &renewed, &grace, at(601)),
            Decision::Hold { .. }
        ));
        // Marked with no Lease, a Lease appears (stale by our clock): renewed, held.
        let tn = target(&marked(pv("hostpath", "node-b"), &since), "flexvol", &LOCAL).unwrap();
        assert!(matches!(
            decide(&tn, &nodes, &stale, &grace, at(601)),
            Decision::Hold { .. }
        ));
        // A kubelet's clock ahead of ours: fresh, held (never the reverse).
        let ahead = Life::of(&t, &leases(Some(at(7200))), &Heartbeats::default());
        assert!(matches!(
            decide(&t, &nodes, &ahead, &grace, at(0)),
            Decision::Hold { .. }
        ));
    }

    #[test]
    fn a_node_gone_with_its_lease_stale_or_absent_for_the_grace_is_still_recovered() {
        let grace = ClassGrace::Grace(TEN_MIN);
        let t = target(&pv("hostpath", "node-b"), "flexvol", &LOCAL).unwrap();
        // Seen while it existed: its kubelet stopped at 0 (NotReady), the Node deleted at 100.
        let mut beats = Heartbeats::default();
        let both = [node("node-a", true, false), node("node-b", false, false)];
        for s in [50, 60, 98] {
            beats.observe(&both, &leases(Some(at(0))), at(s));
        }
        assert!(!beats.was_alive(&t));
        let left = [node("node-a", true, false)];
        let nodes = Nodes::from_list(&left);
        // Its Lease still there (the garbage collector not yet through), stale.
        let life = Life::of(&t, &leases(Some(at(0))), &beats);
        let Decision::Mark { since, lease } = decide(&t, &nodes, &life, &grace, at(100)) else {
            panic!("not marked")
        };
        let mut v = marked(pv("hostpath", "node-b"), &since);
        v.metadata
            .annotations
            .as_mut()
            .unwrap()
            .insert(ANN_LEASE_AT_MARK.into(), lease.unwrap());
        let tm = target(&v, "flexvol", &LOCAL).unwrap();
        // Then removed with its Node: absent for the rest of the grace.
        let gone = Life::of(&tm, &HashMap::new(), &beats);
        assert_eq!(
            decide(&tm, &nodes, &gone, &grace, at(699)),
            Decision::Wait(Duration::from_secs(1))
        );
        assert_eq!(
            decide(&tm, &nodes, &gone, &grace, at(700)),
            Decision::Act {
                since: stamp(at(100)),
                grace: TEN_MIN
            }
        );
        // Still there and unchanged, stale: the same.
        assert!(matches!(
            decide(&tm, &nodes, &life, &grace, at(700)),
            Decision::Act { .. }
        ));
        // A controller that never saw the Node (started after it went): no evidence of life.
        let fresh_start = Life::of(&tm, &HashMap::new(), &Heartbeats::default());
        assert!(matches!(
            decide(&tm, &nodes, &fresh_start, &grace, at(700)),
            Decision::Act { .. }
        ));
    }

    #[test]
    fn lease_fields_are_read_defensively() {
        let mut l = lease(None);
        assert_eq!(LeaseSeen::from_lease(&l).token(), "never");
        assert!(!LeaseSeen::from_lease(&l).fresh(at(0)));
        for bad in [Some(-5), Some(0), None] {
            l.spec.as_mut().unwrap().lease_duration_seconds = bad;
            assert_eq!(LeaseSeen::from_lease(&l).duration, DEFAULT_LEASE_DURATION);
        }
        l.spec.as_mut().unwrap().lease_duration_seconds = Some(i32::MAX);
        assert_eq!(LeaseSeen::from_lease(&l).duration, MAX_GRACE);
        l.spec = None;
        assert_eq!(LeaseSeen::from_lease(&l).renew, None);
    }

    /// The annotations' text is what PVs marked before the move from chrono to jiff hold: whole
    /// seconds for the marks (fractions cut, not rounded), six fraction digits for the Lease
    /// token, and a mark written with another offset still reads as the same instant.
    #[test]
    fn stamps_and_tokens_keep_their_exact_text() {
        let t: Timestamp = "2026-11-26T09:00:00.999999999Z".parse().unwrap();
        assert_eq!(stamp(t), "2026-11-26T09:00:00Z");
        let seen = LeaseSeen {
            renew: Some(t),
            duration: DEFAULT_LEASE_DURATION,
        };
        assert_eq!(seen.token(), "2026-11-26T09:00:00.999999Z");
        let grace = ClassGrace::Grace(Duration::from_secs(600));
        let nodes = Nodes::from_list([&node("node-a", true, false)]);
        let none = Life::of(
            &target(&pv("hostpath", "node-b"), "flexvol", &LOCAL).unwrap(),
            &HashMap::new(),
            &Heartbeats::default(),
        );
        let v = marked(pv("hostpath", "node-b"), "2026-11-26T10:00:00+01:00");
        let t = target(&v, "flexvol", &LOCAL).unwrap();
        assert!(matches!(
            decide(&t, &nodes, &none, &grace, at(600)),
            Decision::Act { since, .. } if since == "2026-11-26T09:00:00Z"
        ));
    }
}
