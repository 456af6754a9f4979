//! The extender's decision, pure: given what each node published ([`Model`]), what the pod's
//! unbound flexvol claims need ([`Need`], from [`super::claims`]) and the candidate nodes,
//! [`filter`] says which nodes pass and why the others fail, and [`prioritize`] scores them
//! 0..=10. No I/O, no clock (the caller passes `now`), no panics on any input.
//!
//! Rules (docs/scheduler-extender.md, "Decision"):
//! - A node is **filtered out** only on fresh, valid data that shows the pod's claims, all of
//!   them together plus the claims already headed there ([`Model::reserved`]), cannot fit.
//! - A pool the node lists as not measured (`error`) never makes it full: if no measured pool of
//!   the claim's class fits, the node is unknown for the pod (passes, score 0).
//! - A node without a record, with a record that fails validation, or with a record older than
//!   [`Model::stale_after`] **passes** (the extender is `ignorable`; such data must never make
//!   things worse than having no extender) and scores 0, so that a node with known room is
//!   preferred.
//! - Placement mirrors the provisioner: a hostPath claim goes to the root (of those serving its
//!   class on that node) with the most room left; an LVM claim to its class's VG (thick: free
//!   minus `vgReserve`) or thin pool (limit minus committed), rounded up to the VG's extent and
//!   within `maxVolumeSize`. Claims are placed largest first, which is the order most likely to
//!   fit; the provisioner's real order may differ, so on a node where only some orders fit a
//!   claim can still come back (the same round trip as without an extender, never worse).
//! - A fitting node's score is 1 + 9 × the smallest fraction left (after placement) of the pools
//!   the pod uses: pods spread to where the most stays free, and a node filling up scores low.
//!   A pod with no flexvol claims gets 0 everywhere (no opinion).

use crate::vocab::capacity::{CapacityRecord, RecordError, RootCapacity};
use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use super::wire::{HostPriority, MAX_EXTENDER_PRIORITY};

/// Where a claim's class makes its volume.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Target {
    /// A hostPath directory under a root serving the class.
    HostPath,
    /// An LV in `vg` (thin in `thin_pool` when set).
    Lvm {
        /// The class's `volumegroup`.
        vg: String,
        /// The class's `thinpool`.
        thin_pool: Option<String>,
    },
}

/// What one unbound claim needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Need {
    /// `namespace/name`, for messages.
    pub claim: String,
    /// Its StorageClass.
    pub(crate) class: String,
    /// Where the class puts it.
    pub(crate) target: Target,
    /// The request, in bytes.
    pub(crate) bytes: u64,
}

/// One node's published capacity as the extender holds it.
#[derive(Debug, Clone)]
pub(crate) struct Published {
    /// The record, or why it is ignored.
    pub(crate) record: Result<CapacityRecord, RecordError>,
    /// When the extender received this version of it (its own clock).
    pub(crate) received_at: SystemTime,
}

impl Published {
    /// How old the data is at `now`: from the older of its reception and its `publishedAt` (a node
    /// clock ahead cannot make a record look newer than its reception; one behind makes it look
    /// older, which only costs preference, never a filtered node).
    pub(crate) fn age(&self, now: SystemTime) -> Duration {
        let mut from = self.received_at;
        if let Ok(r) = &self.record {
            let published = SystemTime::UNIX_EPOCH + Duration::from_secs(r.published_at);
            from = from.min(published);
        }
        now.duration_since(from).unwrap_or_default()
    }
}

/// Everything the decision reads besides the pod.
#[derive(Debug, Clone)]
pub(crate) struct Model {
    /// Per node name, what it published.
    pub(crate) nodes: BTreeMap<String, Published>,
    /// Per node name, claims already headed there (unbound, `selected-node` set, not this pod's):
    /// placed before the pod's, since the published record does not count them yet.
    pub(crate) reserved: BTreeMap<String, Vec<Need>>,
    /// Data older than this is not trusted to filter.
    pub(crate) stale_after: Duration,
}

/// A node's verdict.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// The claims fit; the score.
    Fits(i64),
    /// Fresh data says they do not; why.
    NoRoom(String),
    /// No usable data; why (the node passes with score 0).
    Unknown(String),
}

/// The room one pool has, as placement goes on.
struct Pool {
    name: String,
    capacity: u64,
    left: u64,
    used: bool,
}

impl Pool {
    fn new(name: String, capacity: u64, left: u64) -> Self {
        Self {
            name,
            capacity,
            left: left.min(capacity),
            used: false,
        }
    }
}

fn gib(b: u64) -> String {
    crate::protocol::quantity::format_size(b)
}

fn round_up(bytes: u64, unit: u64) -> u64 {
    if unit == 0 {
        return bytes;
    }
    bytes.div_ceil(unit).saturating_mul(unit)
}

/// Why placement did not succeed.
enum Miss {
    /// Fresh data shows a claim cannot fit.
    NoRoom(String),
    /// A pool the claims need could not be measured by the node.
    Unknown(String),
}

/// Places `needs` (after `reserved`) on a node's record; the smallest fraction left of the pools
/// used, in permille, or why they do not fit.
fn place(r: &CapacityRecord, reserved: &[Need], needs: &[Need]) -> Result<u64, Miss> {
    let mut roots: Vec<Pool> = r
        .hostpath
        .iter()
        .map(|x| Pool::new(x.path.clone(), x.size, x.allocatable()))
        .collect();
    let mut vgs: Vec<Pool> = r
        .lvm
        .iter()
        .map(|v| {
            Pool::new(
                v.name.clone(),
                v.size.saturating_sub(v.reserve),
                v.allocatable(),
            )
        })
        .collect();
    let mut thins: Vec<(usize, Pool)> = r
        .lvm
        .iter()
        .enumerate()
        .flat_map(|(i, v)| {
            v.thin_pools.iter().map(move |p| {
                (
                    i,
                    Pool::new(format!("{}/{}", v.name, p.name), p.limit, p.allocatable()),
                )
            })
        })
        .collect();
    let mut ordered: Vec<&Need> = needs.iter().collect();
    ordered.sort_by(|a, b| b.bytes.cmp(&a.bytes).then_with(|| a.claim.cmp(&b.claim)));
    let all = reserved
        .iter()
        .map(|n| (n, true))
        .chain(ordered.into_iter().map(|n| (n, false)));
    for (n, is_reserved) in all {
        let pool: &mut Pool = match &n.target {
            Target::HostPath => {
                let own = r.hostpath_classes.contains(&n.class);
                let serves = |x: &&RootCapacity| {
                    if own {
                        x.classes.contains(&n.class)
                    } else {
                        x.default
                    }
                };
                // A root the node could not measure might hold the claim: if no measured root
                // does, the node is unknown for it, not full.
                let unmeasured = r
                    .hostpath
                    .iter()
                    .filter(serves)
                    .find_map(|x| x.error.as_ref().map(|e| (x.path.as_str(), e.as_str())));
                let serving = r
                    .hostpath
                    .iter()
                    .zip(roots.iter_mut())
                    .filter(|(x, _)| serves(x) && x.error.is_none())
                    .map(|(_, p)| p)
                    .max_by_key(|p| p.left);
                match (serving, unmeasured) {
                    (Some(p), None) => p,
                    (Some(p), Some(_)) if p.left >= n.bytes || is_reserved => p,
                    (_, Some(_)) if is_reserved => continue,
                    (_, Some((path, e))) => {
                        return Err(Miss::Unknown(format!(
                            "root {path} (class {}) was not measured: {e}",
                            n.class
                        )));
                    }
                    (None, None) if is_reserved => continue,
                    (None, None) => {
                        return Err(Miss::NoRoom(format!(
                            "no hostPath root for class {} on this node (claim {})",
                            n.class, n.claim
                        )));
                    }
                }
            }
            Target::Lvm { vg, thin_pool } => {
                let Some(vi) = r.lvm.iter().position(|v| &v.name == vg) else {
                    if is_reserved {
                        continue;
                    }
                    return Err(Miss::NoRoom(format!(
                        "volume group {vg} (class {}) is not on this node or not granted to flexvol",
                        n.class
                    )));
                };
                let v = &r.lvm[vi];
                if let Some(e) = &v.error {
                    if is_reserved {
                        continue;
                    }
                    return Err(Miss::Unknown(format!(
                        "volume group {vg} (class {}) was not measured: {e}",
                        n.class
                    )));
                }
                let bytes = round_up(n.bytes, v.extent_size);
                if let Some(max) = v.max_volume_size.filter(|m| bytes > *m)
                    && !is_reserved
                {
                    return Err(Miss::NoRoom(format!(
                        "claim {} asks for {}, more than this node's lvm.maxVolumeSize {}",
                        n.claim,
                        gib(bytes),
                        gib(max)
                    )));
                }
                match thin_pool {
                    None => &mut vgs[vi],
                    Some(tp) => {
                        let name = format!("{vg}/{tp}");
                        match thins.iter_mut().find(|(i, p)| *i == vi && p.name == name) {
                            Some((_, p)) => p,
                            None if is_reserved => continue,
                            None => {
                                return Err(Miss::NoRoom(format!(
                                    "thin pool {name} (class {}) is not on this node",
                                    n.class
                                )));
                            }
                        }
                    }
                }
            }
        };
        let bytes = match &n.target {
            Target::HostPath => n.bytes,
            Target::Lvm { vg, .. } => round_up(
                n.bytes,
                r.lvm
                    .iter()
                    .find(|v| &v.name == vg)
                    .map_or(1, |v| v.extent_size),
            ),
        };
        if is_reserved {
            pool.left = pool.left.saturating_sub(bytes);
            continue;
        }
        if bytes > pool.left {
            let held = reserved.iter().filter(|x| x.target == n.target).count();
            let others = needs.len().saturating_sub(1);
            return Err(Miss::NoRoom(format!(
                "claim {} needs {} of class {}; {} has {} left{}{}",
                n.claim,
                gib(bytes),
                n.class,
                pool.name,
                gib(pool.left),
                if others > 0 {
                    format!(" with this pod's other {others} claim(s) placed too")
                } else {
                    String::new()
                },
                if held > 0 {
                    format!(" and {held} claim(s) already headed to this node")
                } else {
                    String::new()
                },
            )));
        }
        pool.left -= bytes;
        pool.used = true;
    }
    let fraction = roots
        .iter()
        .chain(vgs.iter())
        .chain(thins.iter().map(|(_, p)| p))
        .filter(|p| p.used)
        .map(|p| {
            if p.capacity == 0 {
                0
            } else {
                // left <= capacity, so this is at most 1000.
                u64::try_from(u128::from(p.left) * 1000 / u128::from(p.capacity)).unwrap_or(1000)
            }
        })
        .min()
        .unwrap_or(1000);
    Ok(fraction)
}

/// The verdict for one node.
pub(crate) fn evaluate(model: &Model, node: &str, needs: &[Need], now: SystemTime) -> Verdict {
    let Some(p) = model.nodes.get(node) else {
        return Verdict::Unknown(format!("node {node} has published no capacity"));
    };
    let r = match &p.record {
        Ok(r) => r,
        Err(e) => return Verdict::Unknown(format!("capacity of node {node} ignored: {e}")),
    };
    let age = p.age(now);
    if age > model.stale_after {
        return Verdict::Unknown(format!(
            "capacity of node {node} is {}s old (trusted up to {}s)",
            age.as_secs(),
            model.stale_after.as_secs()
        ));
    }
    let reserved = model.reserved.get(node).map_or(&[][..], Vec::as_slice);
    match place(r, reserved, needs) {
        Ok(permille) => {
            let permille = i64::try_from(permille.min(1000)).unwrap_or(1000);
            Verdict::Fits(1 + (MAX_EXTENDER_PRIORITY - 1) * permille / 1000)
        }
        Err(Miss::NoRoom(why)) => Verdict::NoRoom(format!("flexvol: {why}")),
        Err(Miss::Unknown(why)) => Verdict::Unknown(format!("node {node}: {why}")),
    }
}

/// The filter verb's decision.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Filtered {
    /// Nodes that pass, in the order given.
    pub(crate) passed: Vec<String>,
    /// Nodes filtered out, with why.
    pub failed: BTreeMap<String, String>,
    /// Nodes that passed for want of data, with why (for the log, not the scheduler).
    pub(crate) unknown: BTreeMap<String, String>,
}

/// Filters `nodes` for a pod whose unbound flexvol claims are `needs`.
pub(crate) fn filter(model: &Model, needs: &[Need], nodes: &[String], now: SystemTime) -> Filtered {
    let mut out = Filtered::default();
    for n in nodes {
        if needs.is_empty() {
            out.passed.push(n.clone());
            continue;
        }
        match evaluate(model, n, needs, now) {
            Verdict::Fits(_) => out.passed.push(n.clone()),
            Verdict::Unknown(why) => {
                out.passed.push(n.clone());
                out.unknown.insert(n.clone(), why);
            }
            Verdict::NoRoom(why) => {
                out.failed.insert(n.clone(), why);
            }
        }
    }
    out
}

/// Scores `nodes` 0..=10 for a pod whose unbound flexvol claims are `needs`.
pub(crate) fn prioritize(
    model: &Model,
    needs: &[Need],
    nodes: &[String],
    now: SystemTime,
) -> Vec<HostPriority> {
    nodes
        .iter()
        .map(|n| HostPriority {
            host: n.clone(),
            score: if needs.is_empty() {
                0
            } else {
                match evaluate(model, n, needs, now) {
                    Verdict::Fits(s) => s.clamp(0, MAX_EXTENDER_PRIORITY),
                    Verdict::NoRoom(_) | Verdict::Unknown(_) => 0,
                }
            },
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vocab::capacity::{ThinPoolCapacity, VgCapacity};

    const GI: u64 = 1 << 30;
    const NOW: u64 = 1_795_000_000;

    fn now() -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(NOW)
    }

    fn root(path: &str, size: u64, available: u64) -> RootCapacity {
        RootCapacity {
            path: path.into(),
            default: true,
            classes: vec![],
            size,
            available,
            promised: 0,
            quota_enforced: true,
            error: None,
        }
    }

    fn record(node: &str, roots: Vec<RootCapacity>) -> CapacityRecord {
        CapacityRecord {
            version: 1,
            node: node.into(),
            published_at: NOW - 10,
            hostpath_classes: vec![],
            hostpath: roots,
            lvm: vec![],
        }
    }

    fn model(records: Vec<CapacityRecord>) -> Model {
        Model {
            nodes: records
                .into_iter()
                .map(|r| {
                    (
                        r.node.clone(),
                        Published {
                            record: Ok(r),
                            received_at: now() - Duration::from_secs(5),
                        },
                    )
                })
                .collect(),
            reserved: BTreeMap::new(),
            stale_after: Duration::from_secs(180),
        }
    }

    fn hp(claim: &str, bytes: u64) -> Need {
        Need {
            claim: format!("ns/{claim}"),
            class: "local".into(),
            target: Target::HostPath,
            bytes,
        }
    }

    fn names(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| (*s).to_owned()).collect()
    }

    /// The issue's scenario: one node nearly full is filtered out, with the numbers, and the
    /// other passes and scores higher.
    #[test]
    fn a_nearly_full_node_is_filtered_out() {
        let m = model(vec![
            record("full", vec![root("/srv", 100 * GI, GI / 2)]),
            record("roomy", vec![root("/srv", 100 * GI, 80 * GI)]),
        ]);
        let needs = [hp("data", GI)];
        let f = filter(&m, &needs, &names(&["full", "roomy"]), now());
        assert_eq!(f.passed, ["roomy"]);
        let why = &f.failed["full"];
        assert!(
            why.contains("ns/data needs 1Gi") && why.contains("/srv has 512Mi left"),
            "{why}"
        );
        let s = prioritize(&m, &needs, &names(&["full", "roomy"]), now());
        assert_eq!(s[0].score, 0);
        // 79 of 100 GiB left: 1 + 9 * 0.79 = 8.
        assert_eq!(
            s[1],
            HostPriority {
                host: "roomy".into(),
                score: 8
            }
        );
    }

    /// Each claim fits a root alone; the two together do not: the node is filtered out. With a
    /// second root they spread over both and fit.
    #[test]
    fn claims_are_counted_together() {
        let one = model(vec![record("n", vec![root("/a", 10 * GI, 6 * GI)])]);
        let needs = [hp("x", 4 * GI), hp("y", 4 * GI)];
        assert!(matches!(
            evaluate(&one, "n", &needs[..1], now()),
            Verdict::Fits(_)
        ));
        let v = evaluate(&one, "n", &needs, now());
        let Verdict::NoRoom(why) = v else {
            panic!("{v:?}")
        };
        assert!(why.contains("other 1 claim(s)"), "{why}");
        let two = model(vec![record(
            "n",
            vec![root("/a", 10 * GI, 6 * GI), root("/b", 10 * GI, 5 * GI)],
        )]);
        assert!(matches!(
            evaluate(&two, "n", &needs, now()),
            Verdict::Fits(_)
        ));
        // Three of 4 GiB do not fit 6 + 5.
        let three = [hp("x", 4 * GI), hp("y", 4 * GI), hp("z", 4 * GI)];
        assert!(matches!(
            evaluate(&two, "n", &three, now()),
            Verdict::NoRoom(_)
        ));
    }

    /// Quota promises count: a root whose free space is promised to existing volumes is full.
    #[test]
    fn promised_quota_space_is_not_free() {
        let mut r = root("/a", 100 * GI, 50 * GI);
        r.promised = 49 * GI;
        let m = model(vec![record("n", vec![r])]);
        assert!(matches!(
            evaluate(&m, "n", &[hp("x", 2 * GI)], now()),
            Verdict::NoRoom(_)
        ));
    }

    /// Stale data never filters: the node passes and is not preferred; the same data fresh
    /// filters. A node clock ahead does not make old data fresh.
    #[test]
    fn stale_data_passes_unpreferred() {
        let mut m = model(vec![record("n", vec![root("/srv", 100 * GI, 0)])]);
        let needs = [hp("x", GI)];
        assert!(matches!(
            evaluate(&m, "n", &needs, now()),
            Verdict::NoRoom(_)
        ));
        m.nodes.get_mut("n").unwrap().received_at = now() - Duration::from_secs(600);
        let f = filter(&m, &needs, &names(&["n"]), now());
        assert_eq!(f.passed, ["n"]);
        assert!(f.unknown["n"].contains("600s old"), "{:?}", f.unknown);
        assert_eq!(prioritize(&m, &needs, &names(&["n"]), now())[0].score, 0);
        // Received long ago, publishedAt in the future: still stale.
        if let Ok(r) = &mut m.nodes.get_mut("n").unwrap().record {
            r.published_at = NOW + 3600;
        }
        assert!(matches!(
            evaluate(&m, "n", &needs, now()),
            Verdict::Unknown(_)
        ));
        // Received just now, publishedAt an hour ago (the node's clock is behind or it is
        // re-sent old data): stale too, which costs only preference.
        let p = m.nodes.get_mut("n").unwrap();
        p.received_at = now();
        if let Ok(r) = &mut p.record {
            r.published_at = NOW - 3600;
        }
        assert!(matches!(
            evaluate(&m, "n", &needs, now()),
            Verdict::Unknown(_)
        ));
    }

    /// A node with no record, or one whose record was ignored, passes with score 0 while a
    /// known node that fits scores above it.
    #[test]
    fn unknown_and_malformed_nodes_pass() {
        let mut m = model(vec![record("known", vec![root("/srv", 10 * GI, 9 * GI)])]);
        let junk = crate::vocab::capacity::parse("bad", Some("{\"version\":1,\"node\":\"other\"}"));
        assert!(
            matches!(
                junk,
                Err(crate::vocab::capacity::RecordError::NotARecord(_))
            ),
            "{junk:?}"
        );
        m.nodes.insert(
            "bad".into(),
            Published {
                record: junk,
                received_at: now(),
            },
        );
        let needs = [hp("x", GI)];
        let all = names(&["known", "bad", "ghost"]);
        let f = filter(&m, &needs, &all, now());
        assert_eq!(f.passed, all);
        assert!(f.failed.is_empty());
        assert!(f.unknown["bad"].contains("ignored"), "{:?}", f.unknown);
        assert!(f.unknown["ghost"].contains("published no capacity"));
        let s: Vec<i64> = prioritize(&m, &needs, &all, now())
            .into_iter()
            .map(|h| h.score)
            .collect();
        // 8 of 10 GiB left after the claim: 1 + 9 * 0.8 = 8.
        assert_eq!(s, [8, 0, 0]);
    }

    /// A pod without flexvol claims: every node passes, nobody is scored, even on a node
    /// that is full.
    #[test]
    fn no_claims_no_opinion() {
        let m = model(vec![record("n", vec![root("/srv", 10 * GI, 0)])]);
        let f = filter(&m, &[], &names(&["n", "x"]), now());
        assert_eq!(f.passed, ["n", "x"]);
        assert!(f.failed.is_empty() && f.unknown.is_empty());
        assert!(
            prioritize(&m, &[], &names(&["n"]), now())
                .iter()
                .all(|h| h.score == 0)
        );
    }

    /// Roots are chosen by class as the provisioner chooses them: a class with roots of its own
    /// uses only those; others use the default roots; a class with a list but no root here fails.
    #[test]
    fn hostpath_roots_follow_the_class() {
        let mut fast = root("/nvme", 10 * GI, 10 * GI);
        fast.default = false;
        fast.classes = vec!["fast".into()];
        let mut r = record("n", vec![root("/hdd", 100 * GI, GI), fast]);
        r.hostpath_classes = vec!["fast".into(), "nowhere".into()];
        let m = model(vec![r]);
        let need = |class: &str| Need {
            claim: "ns/c".into(),
            class: class.into(),
            target: Target::HostPath,
            bytes: 5 * GI,
        };
        assert!(matches!(
            evaluate(&m, "n", &[need("fast")], now()),
            Verdict::Fits(_)
        ));
        assert!(matches!(
            evaluate(&m, "n", &[need("local")], now()),
            Verdict::NoRoom(_)
        ));
        let v = evaluate(&m, "n", &[need("nowhere")], now());
        assert!(
            matches!(&v, Verdict::NoRoom(w) if w.contains("no hostPath root for class nowhere")),
            "{v:?}"
        );
    }

    fn lvm_node() -> CapacityRecord {
        let mut r = record("n", vec![]);
        r.lvm = vec![VgCapacity {
            name: "vg0".into(),
            size: 100 * GI,
            free: 20 * GI,
            reserve: 10 * GI,
            extent_size: 4 << 20,
            max_volume_size: Some(50 * GI),
            thin_pools: vec![ThinPoolCapacity {
                name: "tp".into(),
                size: 40 * GI,
                limit: 80 * GI,
                committed: 70 * GI,
            }],
            error: None,
        }];
        r
    }

    fn lv(claim: &str, thin: Option<&str>, bytes: u64) -> Need {
        Need {
            claim: format!("ns/{claim}"),
            class: "lvm".into(),
            target: Target::Lvm {
                vg: "vg0".into(),
                thin_pool: thin.map(str::to_owned),
            },
            bytes,
        }
    }

    /// LVM: the reserve is kept, sizes round up to extents, thin pools count virtual bytes under
    /// the overprovisioning limit, maxVolumeSize fails on every node, unknown VGs and pools fail.
    #[test]
    fn lvm_applies_the_node_policy() {
        let m = model(vec![lvm_node()]);
        let ok = |n: &[Need]| matches!(evaluate(&m, "n", n, now()), Verdict::Fits(_));
        assert!(ok(&[lv("a", None, 10 * GI)]), "free 20 - reserve 10");
        assert!(
            !ok(&[lv("a", None, 10 * GI + 1)]),
            "one byte rounds up to an extent"
        );
        assert!(!ok(&[lv("a", None, 6 * GI), lv("b", None, 6 * GI)]));
        assert!(ok(&[lv("a", Some("tp"), 10 * GI)]));
        assert!(!ok(&[lv("a", Some("tp"), 10 * GI), lv("b", Some("tp"), 1)]));
        assert!(
            ok(&[lv("a", Some("tp"), 10 * GI), lv("b", None, 10 * GI)]),
            "separate pools"
        );
        let v = evaluate(&m, "n", &[lv("big", None, 60 * GI)], now());
        assert!(
            matches!(&v, Verdict::NoRoom(w) if w.contains("maxVolumeSize")),
            "{v:?}"
        );
        let mut other = lv("a", None, GI);
        other.target = Target::Lvm {
            vg: "vg9".into(),
            thin_pool: None,
        };
        let v = evaluate(&m, "n", &[other], now());
        assert!(
            matches!(&v, Verdict::NoRoom(w) if w.contains("vg9")),
            "{v:?}"
        );
        let v = evaluate(&m, "n", &[lv("a", Some("tp2"), GI)], now());
        assert!(
            matches!(&v, Verdict::NoRoom(w) if w.contains("vg0/tp2")),
            "{v:?}"
        );
    }

    /// Claims already headed to a node (selected-node set, not yet provisioned) take their room
    /// first: two pods arriving together do not both get the last space.
    #[test]
    fn claims_headed_to_a_node_are_held() {
        let mut m = model(vec![record("n", vec![root("/srv", 10 * GI, 6 * GI)])]);
        let needs = [hp("mine", 4 * GI)];
        assert!(matches!(evaluate(&m, "n", &needs, now()), Verdict::Fits(_)));
        m.reserved.insert("n".into(), vec![hp("theirs", 4 * GI)]);
        let v = evaluate(&m, "n", &needs, now());
        assert!(
            matches!(&v, Verdict::NoRoom(w) if w.contains("1 claim(s) already headed")),
            "{v:?}"
        );
        // A held claim whose pool this node lacks is skipped, not an error for this pod.
        m.reserved
            .insert("n".into(), vec![lv("gone", None, 4 * GI)]);
        assert!(matches!(evaluate(&m, "n", &needs, now()), Verdict::Fits(_)));
    }

    /// Pools the node could not measure never make it full: the node passes unpreferred unless
    /// a measured pool of the class holds the claims.
    #[test]
    fn unmeasured_pools_are_unknown_not_full() {
        let mut broken = root("/broken", 0, 0);
        broken.error = Some("statvfs: EIO".into());
        let m = model(vec![record(
            "n",
            vec![root("/ok", 10 * GI, 2 * GI), broken],
        )]);
        assert!(matches!(
            evaluate(&m, "n", &[hp("x", GI)], now()),
            Verdict::Fits(_)
        ));
        let v = evaluate(&m, "n", &[hp("x", 5 * GI)], now());
        assert!(
            matches!(&v, Verdict::Unknown(w) if w.contains("/broken") && w.contains("EIO")),
            "{v:?}"
        );
        let f = filter(&m, &[hp("x", 5 * GI)], &names(&["n"]), now());
        assert_eq!(f.passed, ["n"]);
        let mut r = lvm_node();
        r.lvm[0].error = Some("vgs timed out".into());
        let m = model(vec![r]);
        let v = evaluate(&m, "n", &[lv("a", None, GI)], now());
        assert!(
            matches!(&v, Verdict::Unknown(w) if w.contains("vgs timed out")),
            "{v:?}"
        );
        // A record with errors is valid (an errored VG may carry no extent size).
        let mut r = lvm_node();
        r.lvm[0].error = Some("x".into());
        r.lvm[0].extent_size = 0;
        crate::vocab::capacity::validate(&r, "n").unwrap();
    }

    /// Scores stay in 0..=10 for any numbers, including sizes of zero and u64::MAX.
    #[test]
    fn scores_are_bounded() {
        for (size, avail, want) in [(0, 0, u64::MAX), (u64::MAX, u64::MAX, 1), (10, 10, 0)] {
            let m = model(vec![record("n", vec![root("/r", size, avail)])]);
            let s = prioritize(&m, &[hp("x", want)], &names(&["n"]), now());
            assert!((0..=MAX_EXTENDER_PRIORITY).contains(&s[0].score), "{s:?}");
        }
        let m = model(vec![record("n", vec![root("/r", 10 * GI, 10 * GI)])]);
        assert_eq!(
            prioritize(&m, &[hp("x", 0)], &names(&["n"]), now())[0].score,
            10
        );
    }
}
