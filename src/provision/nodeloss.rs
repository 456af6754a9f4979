//! Node loss (issue #24, item 2): what to do with a node-local PV flexvol made whose node is gone
//! for good. The decisions only, from what was read; the calls are made by `flexvol controller`
//! ([`crate::controller`]), which runs once per cluster, never on a node.
//!
//! **Opt-in per class.** A class of a node-local kind (`hostpath`, `lvm`) may set the parameter
//! [`PARAM`] (`nodeLossGracePeriod: "10m"`); without it nothing is ever done for its PVs. The
//! class is read at decision time (a class edited or deleted later changes what happens: a class
//! that is gone or no longer names the PV's provisioner means "not opted in"). NFS classes refuse
//! the parameter ([`refuse_for_shared`]): an NFS volume lives on its server, not on a node.
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
//! **The grace is recorded on the PV.** The first pass that sees the node gone writes
//! [`ANN_MISSING_SINCE`] (RFC 3339, the controller's clock) on the PV; every later pass measures
//! from it, so a restarted or replaced controller neither resets nor skips the grace. A Node that
//! comes back (same name, or a Node carrying the hostname) clears it ([`Decision::Clear`]); so
//! does a class that no longer opts in. A value that does not parse, or lies in the future by
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

use super::api::{ANN_PROVISIONED_BY, FINALIZER, HOSTNAME_LABEL};
use super::provisioner::ANN_NODE;
use super::reconcile::LABEL_KIND;
use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::chrono::{DateTime, SecondsFormat, Utc};
use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

/// The class parameter that opts a node-local class in: how long a PV's node must have had no
/// Node object before its claim and PV are deleted.
pub const PARAM: &str = "nodeLossGracePeriod";
/// PV annotation: when the controller first saw the PV's node gone (RFC 3339, UTC).
pub const ANN_MISSING_SINCE: &str = "flexvol/node-missing-since";
/// The shortest grace accepted. A deleted Node whose kubelet still runs is registered again
/// within seconds; a grace shorter than a few minutes is for tests.
pub const MIN_GRACE: Duration = Duration::from_secs(10);
/// The longest grace accepted (a year).
pub const MAX_GRACE: Duration = Duration::from_secs(366 * 24 * 3600);
/// How far in the future a recorded time may be (clocks of two controllers) before it is
/// treated as garbage and written again.
const FUTURE_SLACK: Duration = Duration::from_secs(60);

/// Parses a grace period as Go's durations are written, with the units `h`, `m` and `s` and
/// whole numbers (`90s`, `10m`, `1h30m`), between [`MIN_GRACE`] and [`MAX_GRACE`].
pub fn parse_grace(v: &str) -> Result<Duration, String> {
    let bad = |why: &str| {
        format!(
            "class parameter {PARAM}={v:?} {why}; write a duration such as \"10m\", \"1h\" or \"1h30m\" (units h, m, s), at least {}s",
            MIN_GRACE.as_secs()
        )
    };
    if v.is_empty() {
        return Err(bad("is empty"));
    }
    let mut total: u64 = 0;
    let mut digits = String::new();
    let mut last_unit = u64::MAX;
    for c in v.chars() {
        if c.is_ascii_digit() {
            digits.push(c);
            continue;
        }
        let unit = match c {
            'h' => 3600,
            'm' => 60,
            's' => 1,
            _ => return Err(bad("has a character that is not a digit or one of h, m, s")),
        };
        if digits.is_empty() {
            return Err(bad("has a unit without a number"));
        }
        if unit >= last_unit {
            return Err(bad("repeats a unit or gives them out of order"));
        }
        last_unit = unit;
        let n: u64 = digits.parse().map_err(|_| bad("is too large"))?;
        digits.clear();
        total = n
            .checked_mul(unit)
            .and_then(|x| total.checked_add(x))
            .ok_or_else(|| bad("is too large"))?;
    }
    if !digits.is_empty() {
        return Err(bad("ends in a number without a unit"));
    }
    let d = Duration::from_secs(total);
    if d < MIN_GRACE {
        return Err(bad("is too short"));
    }
    if d > MAX_GRACE {
        return Err(bad("is longer than a year"));
    }
    Ok(d)
}

/// For the node-local kinds' class validation: checks [`PARAM`] when present and returns the
/// other parameters (what the kind's own parser validates).
pub fn split_param(params: &BTreeMap<String, String>) -> Result<BTreeMap<String, String>, String> {
    if let Some(v) = params.get(PARAM) {
        parse_grace(v)?;
    }
    Ok(params
        .iter()
        .filter(|(k, _)| k.as_str() != PARAM)
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect())
}

/// For a shared kind's class validation (NFS): [`PARAM`] is an error that says why.
pub fn refuse_for_shared(params: &BTreeMap<String, String>, kind: &str) -> Result<(), String> {
    if params.contains_key(PARAM) {
        return Err(format!(
            "class parameter {PARAM} is for node-local kinds (hostpath, lvm) only: a {kind} volume lives on its server, not on a node, and does not go when a node does; remove it from the class"
        ));
    }
    Ok(())
}

/// The Nodes that exist, as one list just read: their names and `kubernetes.io/hostname` labels.
#[derive(Debug, Clone, Default)]
pub struct Nodes {
    names: HashSet<String>,
    hostnames: HashSet<String>,
}

impl Nodes {
    /// From a complete list of the cluster's Nodes (never a partial or failed one: a Node missing
    /// from the list is taken as deleted).
    pub fn from_list<'a>(nodes: impl IntoIterator<Item = &'a Node>) -> Self {
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
    pub fn holds(&self, t: &Target) -> bool {
        std::iter::once(&t.node)
            .chain(t.hostnames.iter())
            .any(|x| self.names.contains(x) || self.hostnames.contains(x))
    }
}

/// A PV this module may act on, as read ([`target`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// The PV's name.
    pub pv: String,
    /// Its uid (the precondition of its delete).
    pub uid: String,
    /// `<vendor>/<kind>`.
    pub provisioner: String,
    /// The node that made it (`flexvol/node`).
    pub node: String,
    /// The hostnames its `nodeAffinity` pins it to.
    pub hostnames: Vec<String>,
    /// Its class (`spec.storageClassName`).
    pub class: String,
    /// The claim it is bound to (`spec.claimRef`): namespace, name, uid.
    pub claim: Option<(String, String, String)>,
    /// [`ANN_MISSING_SINCE`] as written, if any.
    pub missing_since: Option<String>,
    /// Reclaim policy Delete.
    pub reclaim_delete: bool,
    /// Being deleted (`deletionTimestamp`).
    pub deleting: bool,
    /// Carries the provisioner's finalizer.
    pub finalizer: bool,
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
pub fn target(pv: &PersistentVolume, vendor: &str, local_kinds: &[&str]) -> Option<Target> {
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
    if spec.flex_volume.as_ref().map(|f| f.driver.as_str()) != Some(provisioner) {
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

/// The class as read at decision time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClassGrace {
    /// Opted in with this grace.
    Grace(Duration),
    /// Not opted in: no [`PARAM`], the class is gone, or it names another provisioner.
    Off,
    /// [`PARAM`] does not parse (the class was edited after validation): nothing is done.
    Invalid(String),
}

/// What `class` (`None`: not found) says for a PV of `provisioner`.
pub fn class_grace(class: Option<&StorageClass>, provisioner: &str) -> ClassGrace {
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
            Err(e) => ClassGrace::Invalid(e),
        },
    }
}

/// What to do with one [`Target`] now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Nothing: the node exists (with no mark to clear), or the class does not opt in (no mark).
    Nothing,
    /// Remove [`ANN_MISSING_SINCE`]: the node is back, or the class no longer opts in.
    Clear,
    /// Write [`ANN_MISSING_SINCE`] with this value (now): the node was just seen gone, or the
    /// value written is garbage.
    Mark(String),
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
pub fn stamp(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Secs, true)
}

/// The decision for `t` (see the module docs), given the Nodes just listed, its class as read
/// now, and the time.
pub fn decide(t: &Target, nodes: &Nodes, class: &ClassGrace, now: DateTime<Utc>) -> Decision {
    let marked = t.missing_since.is_some();
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
    let since = t
        .missing_since
        .as_deref()
        .and_then(|s| DateTime::parse_from_rfc3339(s).ok())
        .map(|d| d.with_timezone(&Utc));
    let Some(since) = since else {
        return Decision::Mark(stamp(now));
    };
    let Ok(elapsed) = (now - since).to_std() else {
        // In the future: another clock by a little (wait), or garbage (write it again).
        return if (since - now).to_std().is_ok_and(|d| d <= FUTURE_SLACK) {
            Decision::Wait(grace)
        } else {
            Decision::Mark(stamp(now))
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
pub enum ClaimStep {
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
pub fn claim_step(t: &Target, claim: Option<&PersistentVolumeClaim>) -> ClaimStep {
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
pub fn event_message(t: &Target, since: &str, grace: Duration, claim_deleted: bool) -> String {
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
        "node {} has had no Node object since {since}, longer than the class {}'s {PARAM} of {}s: its {} volume is taken as lost with it; {what}; {pv}",
        t.node,
        t.class,
        grace.as_secs(),
        t.provisioner
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{
        FlexPersistentVolumeSource, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm,
        ObjectReference, PersistentVolumeSpec, VolumeNodeAffinity,
    };
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};

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

    fn t0() -> DateTime<Utc> {
        DateTime::parse_from_rfc3339("2026-11-26T09:00:00Z")
            .unwrap()
            .with_timezone(&Utc)
    }

    fn at(secs: i64) -> DateTime<Utc> {
        t0() + k8s_openapi::chrono::Duration::seconds(secs)
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
        assert!(split_param(&badp).unwrap_err().contains("soon"));
        let e = refuse_for_shared(&p, "nfs").unwrap_err();
        assert!(e.contains("node-local kinds") && e.contains("nfs"), "{e}");
        assert!(refuse_for_shared(&rest, "nfs").is_ok());
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
            assert_eq!(decide(&t, &nodes, &grace, at(1_000_000)), Decision::Nothing);
        }
        // Marked long ago, node present: the mark is cleared, nothing deleted.
        let tm = target(
            &marked(pv("hostpath", "node-b"), "2020-01-01T00:00:00Z"),
            "flexvol",
            &LOCAL,
        )
        .unwrap();
        let nodes = Nodes::from_list([&node("node-b", false, true)]);
        assert_eq!(decide(&tm, &nodes, &grace, at(0)), Decision::Clear);
        // A Node of another name carrying the PV's hostname label counts as present.
        let mut other = node("node-b-renamed", false, false);
        other
            .metadata
            .labels
            .as_mut()
            .unwrap()
            .insert(HOSTNAME_LABEL.into(), "node-b".into());
        let nodes = Nodes::from_list([&other]);
        assert_eq!(decide(&tm, &nodes, &grace, at(0)), Decision::Clear);
    }

    #[test]
    fn an_absent_node_is_marked_then_waited_for_then_acted_on() {
        let nodes = Nodes::from_list([&node("node-a", true, false)]);
        let grace = ClassGrace::Grace(TEN_MIN);
        let t = target(&pv("hostpath", "node-b"), "flexvol", &LOCAL).unwrap();
        assert_eq!(
            decide(&t, &nodes, &grace, at(0)),
            Decision::Mark("2026-11-26T09:00:00Z".into())
        );
        let v = marked(pv("hostpath", "node-b"), "2026-11-26T09:00:00Z");
        let t = target(&v, "flexvol", &LOCAL).unwrap();
        assert_eq!(
            decide(&t, &nodes, &grace, at(599)),
            Decision::Wait(Duration::from_secs(1))
        );
        assert_eq!(
            decide(&t, &nodes, &grace, at(600)),
            Decision::Act {
                since: "2026-11-26T09:00:00Z".into(),
                grace: TEN_MIN
            }
        );
        // A restarted controller reads the same mark: neither reset nor skipped.
        assert!(matches!(
            decide(&t, &nodes, &grace, at(300)),
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
            decide(&t, &nodes, &grace, at(601)),
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
            decide(&t, &nodes, &grace, at(600)),
            Decision::Act { .. }
        ));
        v.status = Some(k8s_openapi::api::core::v1::PersistentVolumeStatus {
            phase: Some("Released".into()),
            ..Default::default()
        });
        let t = target(&v, "flexvol", &LOCAL).unwrap();
        assert_eq!(decide(&t, &nodes, &grace, at(600)), Decision::Nothing);
        // Deleted by its admin: the provisioner's finalizer still has to go.
        v.metadata.deletion_timestamp = Some(Time(at(599)));
        let t = target(&v, "flexvol", &LOCAL).unwrap();
        assert!(matches!(
            decide(&t, &nodes, &grace, at(600)),
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
                decide(&t, &nodes, &grace, at(0)),
                Decision::Mark(stamp(at(0))),
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
        assert_eq!(decide(&t, &nodes, &grace, at(0)), Decision::Wait(TEN_MIN));
    }

    #[test]
    fn a_class_that_does_not_opt_in_does_nothing() {
        let nodes = Nodes::default();
        let t = target(&pv("hostpath", "node-b"), "flexvol", &LOCAL).unwrap();
        let off = class_grace(Some(&class(&[("mode", "0770")])), "flexvol/hostpath");
        assert_eq!(off, ClassGrace::Off);
        assert_eq!(decide(&t, &nodes, &off, at(1_000_000)), Decision::Nothing);
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
        assert_eq!(decide(&tm, &nodes, &off, at(0)), Decision::Clear);
        // Edited into something invalid: nothing, and said.
        let bad = class_grace(Some(&class(&[(PARAM, "often")])), "flexvol/hostpath");
        assert!(
            matches!(decide(&tm, &nodes, &bad, at(0)), Decision::Invalid(e) if e.contains("often"))
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
}
