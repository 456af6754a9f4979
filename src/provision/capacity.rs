//! The capacity record a node publishes for the scheduler extender (docs/scheduler-extender.md):
//! what this node can still hold, per hostPath root and per LVM volume group and thin pool, with
//! the node's own limits already applied (quotas promised but unused, `vgReserve`,
//! `thinOverprovisionRatio`, `maxVolumeSize`), in the terms the provisioner decides with.
//!
//! **Where it lives.** One ConfigMap per node, named after the node, in the namespace
//! [`NAMESPACE`], under the key [`DATA_KEY`], as JSON ([`CapacityRecord`]). The node's token may
//! only `update` ConfigMaps in that namespace (no get, create, delete, list or watch; the
//! controller creates and removes the objects), so a stolen node token can falsify placement data
//! and nothing else (docs/scheduler-extender.md, "Where capacity is published").
//!
//! **Contract.** The record is data from a node, i.e. from a party that may be compromised: its
//! reader ([`parse`]) bounds its size, rejects unknown versions and checks it ([`validate`])
//! before any number in it is used; a record that fails is *ignored* (the node is treated as one
//! that published nothing), never an error that blocks scheduling and never a panic. Every number
//! is bytes, `u64`; arithmetic on them saturates.
//!
//! Status: the type, its validation, its reader, the measuring ([`measure_roots`],
//! [`measure_vgs`]), the builder ([`build`]) and [`publish`] (called by the node-local lane,
//! [`crate::provision::lanes`], with `flexvol provisioner --publish-capacity`, which drivers/deploy's
//! DaemonSet sets) are unit-tested; publishing hostPath roots is proven against a real API server
//! and kube-scheduler (tests/cluster/provisioner-e2e.d/extender.sh); not yet run against an XFS
//! quota root or real lvm2 (the LVM figures are tested with a fake `lvm`).

use crate::backend::lvm::policy::LvmConfig;
use crate::backend::lvm::report::LvRow;
use crate::node::config::Config;
use crate::node::localpath::LocalPathConfig;
use crate::provision::cluster::Cluster;
use crate::provision::storage::quota::{self, SizeStatus};
use crate::provision::storage::volumedir;
use crate::sys::exec::Runner;
use crate::vocab::capacity::CapacityRecord;
use crate::vocab::capacity::NAMESPACE;
use crate::vocab::capacity::RootCapacity;
use crate::vocab::capacity::ThinPoolCapacity;
use crate::vocab::capacity::VERSION;
use crate::vocab::capacity::VgCapacity;
use crate::vocab::capacity::validate;
use std::path::PathBuf;
use std::time::SystemTime;

/// One hostPath root as measured on the node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RootMeasure {
    /// The root.
    pub(crate) path: PathBuf,
    /// Its filesystem's size.
    pub(crate) size: u64,
    /// Bytes available (`f_bavail`).
    pub(crate) available: u64,
    /// Quota limits of its volumes minus their usage (0 where quotas are not enforced).
    pub(crate) promised: u64,
    /// Whether project quotas are enforced there.
    pub(crate) quota_enforced: bool,
    /// Why it could not be measured (the numbers are then 0).
    pub(crate) error: Option<String>,
}

/// One thin pool as measured (`lvs`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ThinMeasure {
    /// The pool LV's name.
    pub name: String,
    /// Its data size.
    pub(crate) size: u64,
    /// The virtual sizes of its thin LVs, summed.
    pub(crate) committed: u64,
}

/// One volume group as measured (`vgs`, `lvs`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct VgMeasure {
    /// The VG's name.
    pub name: String,
    /// `vg_size`.
    pub(crate) size: u64,
    /// `vg_free`.
    pub(crate) free: u64,
    /// `vg_extent_size`.
    pub(crate) extent_size: u64,
    /// Its thin pools.
    pub(crate) thin_pools: Vec<ThinMeasure>,
    /// Why it could not be measured (the numbers are then 0).
    pub(crate) error: Option<String>,
}

/// Space promised to existing volumes: over those whose quota is enforced, limit minus usage.
pub(crate) fn promised(sizes: &[SizeStatus]) -> u64 {
    sizes
        .iter()
        .filter(|s| s.enforced)
        .map(|s| {
            s.limit_bytes
                .unwrap_or(0)
                .saturating_sub(s.used_bytes.unwrap_or(0))
        })
        .fold(0u64, u64::saturating_add)
}

/// Measures `node`'s hostPath roots: `statvfs`, whether project quotas are enforced, and the
/// space promised to the volumes in each (a scan of the root, one `xfs_quota report` per
/// filesystem through `runner`, each under its deadline); with what could not be measured.
pub(crate) fn measure_roots(
    cfg: &Config,
    node: &str,
    runner: &dyn Runner,
    detail: Detail,
) -> (Vec<RootMeasure>, Vec<String>) {
    let (mut out, mut failed) = (Vec::new(), Vec::new());
    for path in cfg.local_path.node_roots(node) {
        let st = match nix::sys::statvfs::statvfs(&path) {
            Ok(st) => st,
            Err(e) => {
                let why = format!("capacity of hostPath root {}: {e}", path.display());
                failed.push(why.clone());
                out.push(RootMeasure {
                    path,
                    size: 0,
                    available: 0,
                    promised: 0,
                    quota_enforced: false,
                    error: Some(why),
                });
                continue;
            }
        };
        let frag = st.fragment_size();
        let (promised_bytes, quota_enforced) = match detail {
            Detail::Metrics => (0, false),
            Detail::Record => {
                let (roots, bad) = volumedir::usable_roots(std::slice::from_ref(&path), false);
                failed.extend(bad);
                let found = volumedir::scan(&roots, volumedir::SCAN_DEPTH);
                let sizes = quota::size_status(runner, &found);
                (
                    promised(&sizes),
                    matches!(quota::detect(&path), quota::Support::Enforced(_)),
                )
            }
        };
        out.push(RootMeasure {
            size: st.blocks().saturating_mul(frag),
            available: st.blocks_available().saturating_mul(frag),
            promised: promised_bytes,
            quota_enforced,
            path,
            error: None,
        });
    }
    (out, failed)
}

/// What the extender makes of a record, for people: one line per root and VG (and thin pool)
/// with the bytes a new volume may take there and the classes it serves.
pub(crate) fn describe(r: &CapacityRecord) -> Vec<String> {
    use crate::protocol::quantity::format_human as q;
    let mut out = vec![format!(
        "capacity of node {} (record version {})",
        r.node, r.version
    )];
    for x in &r.hostpath {
        let classes = match (x.default, x.classes.is_empty()) {
            (true, true) => "classes without roots of their own".to_owned(),
            (true, false) => format!(
                "{} and classes without roots of their own",
                x.classes.join(", ")
            ),
            (false, _) => x.classes.join(", "),
        };
        out.push(match &x.error {
            Some(e) => format!("hostpath {}: NOT MEASURED ({e}); serves {classes}", x.path),
            None => format!(
                "hostpath {}: {} for new volumes ({} available - {} promised to existing volumes, of {}; quotas {}); serves {classes}",
                x.path,
                q(x.allocatable()),
                q(x.available),
                q(x.promised),
                q(x.size),
                if x.quota_enforced { "enforced" } else { "not enforced" }
            ),
        });
    }
    for v in &r.lvm {
        match &v.error {
            Some(e) => out.push(format!("lvm {}: NOT MEASURED ({e})", v.name)),
            None => {
                out.push(format!(
                    "lvm {}: {} for new thick volumes ({} free - {} vgReserve, of {}){}",
                    v.name,
                    q(v.allocatable()),
                    q(v.free),
                    q(v.reserve),
                    q(v.size),
                    v.max_volume_size
                        .map(|m| format!("; at most {} each", q(m)))
                        .unwrap_or_default()
                ));
                for p in &v.thin_pools {
                    out.push(format!(
                        "lvm {}/{}: {} for new thin volumes ({} limit - {} committed; pool {})",
                        v.name,
                        p.name,
                        q(p.allocatable()),
                        q(p.limit),
                        q(p.committed),
                        q(p.size)
                    ));
                }
            }
        }
    }
    out
}

/// What one measuring of this node found ([`measure`]): the figures of its hostPath roots and
/// volume groups, and what could not be measured (for the log).
#[derive(Debug, Clone, Default)]
pub(crate) struct Measured {
    /// Its hostPath roots.
    pub(crate) roots: Vec<RootMeasure>,
    /// The volume groups its config grants that exist.
    pub(crate) vgs: Vec<VgMeasure>,
    /// What could not be measured.
    pub(crate) failed: Vec<String>,
}

/// How much a measuring reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Detail {
    /// What the metrics show: `statvfs` of each root, one `vgs` per volume group.
    Metrics,
    /// Also what the published record needs: the space promised to each root's volumes (a scan
    /// and `xfs_quota report`), whether quotas are enforced, each VG's thin pools (`lvs`).
    Record,
}

/// Measures this node once, for everything that shows its capacity: the metrics
/// ([`Measured::pools`]), the record it publishes ([`publish`]) and `flexvol status --capacity`.
/// It blocks (`statvfs`, `xfs_quota`, `vgs`/`lvs`, each under its deadline), as the lane's other
/// volume work does.
pub(crate) fn measure(cfg: &Config, node: &str, lvm_driver: &str, detail: Detail) -> Measured {
    let runner = crate::sys::exec::SystemRunner::new(cfg.tool_dirs.clone());
    let (roots, mut failed) = measure_roots(cfg, node, &runner, detail);
    let (vgs, vg_failed) = measure_vgs(cfg, lvm_driver, detail);
    failed.extend(vg_failed);
    Measured { roots, vgs, failed }
}

impl Measured {
    /// The pools the metrics show (`flexvol_provisioner_capacity_*`): each root measured (size
    /// and bytes available) and each volume group measured (bytes free; `vgs` is not asked for a
    /// size the metric would show).
    pub(crate) fn pools(&self) -> Vec<crate::provision::telemetry::Pool> {
        use crate::provision::telemetry::Pool;
        let roots = self
            .roots
            .iter()
            .filter(|r| r.error.is_none())
            .map(|r| Pool {
                kind: "hostpath",
                pool: r.path.display().to_string(),
                size: Some(r.size),
                free: r.available,
            });
        let vgs = self.vgs.iter().filter(|v| v.error.is_none()).map(|v| Pool {
            kind: "lvm",
            pool: v.name.clone(),
            size: None,
            free: v.free,
        });
        roots.chain(vgs).collect()
    }
}

/// Builds this node's record from `m` (stamped `now`) and publishes it through `cluster`; what
/// could not be written, for the log.
pub(crate) async fn publish<C: Cluster>(
    cluster: &C,
    cfg: &Config,
    node: &str,
    m: &Measured,
    now: SystemTime,
) -> Vec<String> {
    let mut failed = Vec::new();
    let (roots, vgs) = (&m.roots, &m.vgs);
    let at = now
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let record = build(node, at, &cfg.local_path, &cfg.lvm, roots, vgs);
    if let Err(e) = validate(&record, node) {
        failed.push(format!("capacity record of this node not published: {e}"));
        return failed;
    }
    match serde_json::to_string(&record) {
        Ok(text) => match cluster.publish_capacity(node, &text).await {
            Ok(()) => {}
            Err(e) if e.kind == crate::k8s::error::ApiErrorKind::NotFound => failed.push(format!(
                "capacity record of this node not published: ConfigMap {NAMESPACE}/{node} \
                     does not exist yet (`flexvol controller --capacity-objects`, \
                     drivers/deploy-overlays/node-loss/controller.yaml, makes one per Node; without it the scheduler \
                     extender sees no capacity for this node, which passes unpreferred)"
            )),
            Err(e) => failed.push(format!("capacity record of this node not published: {e}")),
        },
        Err(e) => failed.push(format!("capacity record of this node not encoded: {e}")),
    }
    failed
}

/// Measures the volume groups `cfg` grants (`lvm.allowedVolumeGroups`): one `vgs` and one `lvs`
/// each, through the driver `lvm_driver`'s context (`toolDirs`, the verb timeout as deadline).
/// A granted VG that does not exist on this node is left out (no class can use it here); one
/// that cannot be read is listed with its error; with what failed, for the log.
pub(crate) fn measure_vgs(
    cfg: &Config,
    lvm_driver: &str,
    detail: Detail,
) -> (Vec<VgMeasure>, Vec<String>) {
    use crate::backend::lvm::lvs::{LvService, LvmCommands, LvmError};
    let (mut out, mut failed) = (Vec::new(), Vec::new());
    for vg in &cfg.lvm.allowed_volume_groups {
        let deadline = crate::sys::process::Deadline::after(cfg.verb_timeout());
        let got = crate::backend::on_node(cfg, deadline, lvm_driver, |ctx| {
            let row = LvmCommands.vg(ctx, vg)?;
            let lvs = match detail {
                Detail::Metrics => Vec::new(),
                Detail::Record => LvmCommands.list(ctx, vg)?,
            };
            Ok::<_, LvmError>((row, lvs))
        });
        match got {
            Ok((row, lvs)) if row.vg_size >= row.vg_free => out.push(VgMeasure {
                name: vg.clone(),
                size: row.vg_size,
                free: row.vg_free,
                extent_size: row.vg_extent_size,
                thin_pools: thin_pools(&lvs),
                error: None,
            }),
            Ok((row, _)) => {
                let why = format!(
                    "capacity of volume group {vg}: vgs reports {} bytes free of {} (no vg_size column?)",
                    row.vg_free, row.vg_size
                );
                failed.push(why.clone());
                out.push(unmeasured_vg(vg, why));
            }
            // Not on this node: no figures for it (the record lists the VGs that exist), and a
            // line in the log, as an operator would want for a VG the config grants.
            Err(e @ LvmError::VgNotFound { .. }) => {
                failed.push(format!("capacity of volume group {vg}: {e}"));
            }
            Err(e) => {
                let why = format!("capacity of volume group {vg}: {e}");
                failed.push(why.clone());
                out.push(unmeasured_vg(vg, why));
            }
        }
    }
    (out, failed)
}

fn unmeasured_vg(vg: &str, why: String) -> VgMeasure {
    VgMeasure {
        name: vg.to_owned(),
        size: 0,
        free: 0,
        extent_size: 0,
        thin_pools: Vec::new(),
        error: Some(why),
    }
}

/// The thin pools of one VG from its `lvs` rows: each pool's data size and the virtual sizes of
/// the thin LVs in it, summed (what `provision::storage::lvm`'s room check counts).
pub(crate) fn thin_pools(rows: &[LvRow]) -> Vec<ThinMeasure> {
    rows.iter()
        .filter(|r| r.is_thin_pool())
        .map(|p| ThinMeasure {
            name: p.lv_name.clone(),
            size: p.lv_size,
            committed: rows
                .iter()
                .filter(|r| r.pool_lv == p.lv_name)
                .fold(0u64, |a, r| a.saturating_add(r.lv_size)),
        })
        .collect()
}

/// The record of `node` from its measurements and its config: which classes each root serves
/// (as `LocalPathConfig::roots_for` decides), and the LVM limits (`vgReserve`, `maxVolumeSize`,
/// `thinOverprovisionRatio`) the provisioner applies. Roots and VGs that could not be measured
/// are listed with their `error`, so that the extender passes the node for their classes.
pub(crate) fn build(
    node: &str,
    published_at: u64,
    paths: &LocalPathConfig,
    lvm: &LvmConfig,
    roots: &[RootMeasure],
    vgs: &[VgMeasure],
) -> CapacityRecord {
    let defaults = paths.default_roots(node);
    let per_class: Vec<(&String, Vec<PathBuf>)> = paths
        .storage_class_configs
        .iter()
        .map(|(class, m)| (class, m.roots_for(node)))
        .collect();
    let show = |p: &PathBuf| p.display().to_string();
    CapacityRecord {
        version: VERSION,
        node: node.to_owned(),
        published_at,
        hostpath_classes: per_class.iter().map(|(c, _)| (*c).clone()).collect(),
        hostpath: roots
            .iter()
            .map(|r| RootCapacity {
                path: show(&r.path),
                default: defaults.contains(&r.path),
                classes: per_class
                    .iter()
                    .filter(|(_, rs)| rs.contains(&r.path))
                    .map(|(c, _)| (*c).clone())
                    .collect(),
                size: r.size,
                available: r.available.min(r.size),
                promised: r.promised,
                quota_enforced: r.quota_enforced,
                error: r.error.clone(),
            })
            .collect(),
        lvm: vgs
            .iter()
            .map(|v| VgCapacity {
                name: v.name.clone(),
                size: v.size,
                free: v.free.min(v.size),
                reserve: lvm.vg_reserve,
                extent_size: v.extent_size,
                max_volume_size: lvm.max_volume_size,
                thin_pools: v
                    .thin_pools
                    .iter()
                    .map(|p| ThinPoolCapacity {
                        name: p.name.clone(),
                        size: p.size,
                        limit: u64::try_from(
                            u128::from(p.size) * u128::from(lvm.thin_overprovision_permille) / 1000,
                        )
                        .unwrap_or(u64::MAX),
                        committed: p.committed,
                    })
                    .collect(),
                error: v.error.clone(),
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vocab::capacity::{DATA_KEY, MAX_RECORD_BYTES, RecordError, parse};

    /// Promised space: only enforced quotas count, each its limit minus its usage (a volume over
    /// its limit promises nothing more, never a negative).
    #[test]
    fn promised_counts_unused_enforced_limits() {
        let st = |enforced, limit, used| SizeStatus {
            enforced,
            project_id: Some(1),
            limit_bytes: limit,
            used_bytes: used,
            note: None,
            drifted: false,
        };
        let sizes = [
            st(true, Some(100), Some(30)),
            st(true, Some(50), Some(80)),
            st(false, Some(1000), Some(0)),
            st(true, Some(10), None),
        ];
        assert_eq!(promised(&sizes), 80);
        assert_eq!(promised(&[]), 0);
    }

    /// A real root on this machine: measured, nothing promised where quotas are not enforced (a
    /// test directory on an ordinary filesystem); a root that cannot be read is said.
    #[test]
    fn measures_a_real_root() {
        let d = tempfile::tempdir().unwrap();
        let cfg = Config {
            local_path: serde_json::from_value(serde_json::json!({
                "nodePathMap": [
                    {"node": "node-a", "paths": [d.path()]},
                    {"node": "node-b", "paths": ["/nonexistent-flexvol-root"]},
                ]
            }))
            .unwrap(),
            ..Config::default()
        };
        let runner = crate::sys::exec::SystemRunner::new(vec![]);
        let (roots, failed) = measure_roots(&cfg, "node-a", &runner, Detail::Record);
        assert_eq!(failed, Vec::<String>::new());
        assert_eq!(roots.len(), 1);
        let r = &roots[0];
        assert_eq!(r.path, d.path());
        assert!(r.size > 0 && r.available <= r.size, "{r:?}");
        if !r.quota_enforced {
            assert_eq!(r.promised, 0);
        }
        assert!(r.error.is_none());
        // A root that cannot be measured is listed with its error (its classes: unknown).
        let (roots, failed) = measure_roots(&cfg, "node-b", &runner, Detail::Record);
        assert!(
            failed[0].contains("/nonexistent-flexvol-root"),
            "{failed:?}"
        );
        assert_eq!(roots.len(), 1);
        assert!(
            roots[0]
                .error
                .as_deref()
                .is_some_and(|e| e.contains("/nonexistent-flexvol-root")),
            "{roots:?}"
        );
    }

    /// VGs measured through a fake `lvm` (as lvm2 answers): the granted VG with its size, free
    /// space and thin pool; a VG missing on this node left out; one whose `lvs` fails listed
    /// with its error.
    #[test]
    fn measures_the_granted_volume_groups() {
        use std::os::unix::fs::PermissionsExt;
        let d = tempfile::tempdir().unwrap();
        let lvm = d.path().join("lvm");
        std::fs::write(
            &lvm,
            r#"#!/bin/sh
cmd="$1"; for a; do vg="$a"; done
case "$cmd:$vg" in
vgs:vg0) echo '{"report":[{"vg":[{"vg_name":"vg0","vg_extent_size":"4194304","vg_free":"8388608","vg_size":"104857600"}]}]}' ;;
lvs:vg0) echo '{"report":[{"lv":[
  {"vg_name":"vg0","lv_name":"tp","lv_size":"41943040","lv_attr":"twi-aotz--","pool_lv":"","vg_extent_size":"4194304","vg_free":"8388608"},
  {"vg_name":"vg0","lv_name":"a","lv_size":"62914560","lv_attr":"Vwi-a-tz--","pool_lv":"tp","vg_extent_size":"4194304","vg_free":"8388608"}]}]}' ;;
vgs:bad) echo '{"report":[{"vg":[{"vg_name":"bad","vg_extent_size":"4194304","vg_free":"1","vg_size":"2"}]}]}' ;;
lvs:bad) echo "  read failed" >&2; exit 5 ;;
*) echo "  Volume group "$vg" not found" >&2; exit 5 ;;
esac
"#,
        )
        .unwrap();
        std::fs::set_permissions(&lvm, std::fs::Permissions::from_mode(0o755)).unwrap();
        let mut cfg = Config {
            tool_dirs: vec![d.path().to_owned()],
            ..Config::default()
        };
        cfg.lvm.allowed_volume_groups = vec!["vg0".into(), "gone".into(), "bad".into()];
        let (vgs, failed) = measure_vgs(&cfg, "flexvol/lvm", Detail::Record);
        assert_eq!(vgs.len(), 2, "{vgs:?}");
        assert_eq!(
            vgs[0],
            VgMeasure {
                name: "vg0".into(),
                size: 100 << 20,
                free: 8 << 20,
                extent_size: 4 << 20,
                thin_pools: vec![ThinMeasure {
                    name: "tp".into(),
                    size: 40 << 20,
                    committed: 60 << 20
                }],
                error: None,
            }
        );
        assert_eq!(vgs[1].name, "bad");
        assert!(vgs[1].error.is_some(), "{vgs:?}");
        // The VG not on this node is said in the log, with no figures in the record.
        assert_eq!(failed.len(), 2, "{failed:?}");
        assert!(
            failed.iter().any(|f| f.contains("volume group gone")),
            "{failed:?}"
        );
        // What the node would publish validates.
        let r = build("n1", 1, &cfg.local_path, &cfg.lvm, &[], &vgs);
        validate(&r, "n1").unwrap();
    }

    /// The people's view names every pool with what a new volume may take there.
    #[test]
    fn describe_says_what_the_extender_sees() {
        let mut r = sample();
        r.hostpath.push(RootCapacity {
            path: "/broken".into(),
            default: true,
            classes: vec![],
            size: 0,
            available: 0,
            promised: 0,
            quota_enforced: false,
            error: Some("EIO".into()),
        });
        let text = describe(&r).join("\n");
        for want in [
            "hostpath /srv/a: 30.0 GiB for new volumes (40.0 GiB available - 10.0 GiB promised",
            "serves classes without roots of their own",
            "hostpath /srv/nvme: 50.0 GiB for new volumes",
            "serves fast",
            "hostpath /broken: NOT MEASURED (EIO)",
            "lvm vg0: 20.0 GiB for new thick volumes (30.0 GiB free - 10.0 GiB vgReserve, of 200.0 GiB); at most 100.0 GiB each",
            "lvm vg0/tp: 30.0 GiB for new thin volumes (150.0 GiB limit - 120.0 GiB committed; pool 100.0 GiB)",
        ] {
            assert!(text.contains(want), "{want:?} not in\n{text}");
        }
    }

    /// Thin pools from `lvs` rows: the pool's size, its thin LVs' virtual sizes summed; thick LVs
    /// and other pools' LVs are not counted.
    #[test]
    fn thin_pools_from_lvs_rows() {
        let row = |lv: &str, size: u64, attr: &str, pool: &str| {
            format!(
                r#"{{"vg_name":"vg0","lv_name":"{lv}","lv_size":"{size}","lv_attr":"{attr}","pool_lv":"{pool}","vg_extent_size":"4194304","vg_free":"0"}}"#
            )
        };
        let text = format!(
            r#"{{"report":[{{"lv":[{},{},{},{},{}]}}]}}"#,
            row("tp", 100, "twi-aotz--", ""),
            row("tp2", 50, "twi-aotz--", ""),
            row("a", 70, "Vwi-a-tz--", "tp"),
            row("b", 60, "Vwi-a-tz--", "tp"),
            row("thick", 500, "-wi-a-----", ""),
        );
        let (rows, _) = crate::backend::lvm::report::parse(text.as_bytes()).unwrap();
        assert_eq!(
            thin_pools(&rows),
            [
                ThinMeasure {
                    name: "tp".into(),
                    size: 100,
                    committed: 130
                },
                ThinMeasure {
                    name: "tp2".into(),
                    size: 50,
                    committed: 0
                },
            ]
        );
    }

    /// The builder maps roots to classes as the provisioner does and applies the LVM limits; its
    /// output passes the extender's validation.
    #[test]
    fn build_follows_the_node_config() {
        let cfg = crate::node::config::Config::parse(
            std::path::Path::new("/etc/flexvol/config.json"),
            br#"{"nodePathMap":[{"node":"DEFAULT_PATH_FOR_NON_LISTED_NODES","paths":["/srv/a"]},
                                {"node":"n1","paths":["/srv/a","/srv/b"]}],
                 "storageClassConfigs":{"fast":{"nodePathMap":[{"node":"n1","paths":["/mnt/nvme","/srv/b"]}]},
                                        "elsewhere":{"nodePathMap":[{"node":"n2","paths":["/x"]}]}},
                 "lvm":{"allowedVolumeGroups":["vg0"],"vgReserve":"1Gi","maxVolumeSize":"10Gi",
                        "thinOverprovisionRatio":1.5}}"#,
        )
        .unwrap();
        let m = |p: &str| RootMeasure {
            path: p.into(),
            size: 100,
            available: 60,
            promised: 10,
            quota_enforced: true,
            error: None,
        };
        let vg = VgMeasure {
            name: "vg0".into(),
            size: 1000,
            free: 400,
            extent_size: 4,
            thin_pools: vec![ThinMeasure {
                name: "tp".into(),
                size: 200,
                committed: 250,
            }],
            error: None,
        };
        let r = build(
            "n1",
            7,
            &cfg.local_path,
            &cfg.lvm,
            &[m("/srv/a"), m("/srv/b"), m("/mnt/nvme")],
            &[vg],
        );
        validate(&r, "n1").unwrap();
        assert_eq!(r.hostpath_classes, ["elsewhere", "fast"]);
        let roots: Vec<(&str, bool, Vec<&str>)> = r
            .hostpath
            .iter()
            .map(|x| {
                (
                    x.path.as_str(),
                    x.default,
                    x.classes.iter().map(String::as_str).collect(),
                )
            })
            .collect();
        assert_eq!(
            roots,
            [
                ("/srv/a", true, vec![]),
                ("/srv/b", true, vec!["fast"]),
                ("/mnt/nvme", false, vec!["fast"]),
            ]
        );
        let v = &r.lvm[0];
        assert_eq!((v.reserve, v.max_volume_size), (1 << 30, Some(10 << 30)));
        assert_eq!(v.thin_pools[0].limit, 300, "200 x 1.5");
        assert_eq!(v.thin_pools[0].allocatable(), 50);
    }

    fn sample() -> CapacityRecord {
        CapacityRecord {
            version: 1,
            node: "n1".into(),
            published_at: 1_795_000_000,
            hostpath_classes: vec!["fast".into()],
            hostpath: vec![
                RootCapacity {
                    path: "/srv/a".into(),
                    default: true,
                    classes: vec![],
                    size: 100 << 30,
                    available: 40 << 30,
                    promised: 10 << 30,
                    quota_enforced: true,
                    error: None,
                },
                RootCapacity {
                    path: "/srv/nvme".into(),
                    default: false,
                    classes: vec!["fast".into()],
                    size: 50 << 30,
                    available: 50 << 30,
                    promised: 0,
                    quota_enforced: false,
                    error: None,
                },
            ],
            lvm: vec![VgCapacity {
                name: "vg0".into(),
                size: 200 << 30,
                free: 30 << 30,
                reserve: 10 << 30,
                extent_size: 4 << 20,
                max_volume_size: Some(100 << 30),
                thin_pools: vec![ThinPoolCapacity {
                    name: "tp".into(),
                    size: 100 << 30,
                    limit: 150 << 30,
                    committed: 120 << 30,
                }],
                error: None,
            }],
        }
    }

    /// The JSON form is the documented one (camelCase, bytes as numbers) and reads back equal.
    #[test]
    fn round_trips_in_the_documented_form() {
        let r = sample();
        let text = serde_json::to_string(&r).unwrap();
        for key in [
            "\"publishedAt\":1795000000",
            "\"hostpathClasses\":[\"fast\"]",
            "\"quotaEnforced\":true",
            "\"extentSize\":4194304",
            "\"maxVolumeSize\":107374182400",
            "\"thinPools\":[",
        ] {
            assert!(text.contains(key), "{key} missing in {text}");
        }
        assert_eq!(parse("n1", Some(&text)).unwrap(), r);
        assert_eq!(r.hostpath[0].allocatable(), 30 << 30);
        assert_eq!(r.lvm[0].allocatable(), 20 << 30);
        assert_eq!(r.lvm[0].thin_pools[0].allocatable(), 30 << 30);
    }

    /// Every kind of bad record is refused with a reason, never a panic.
    #[test]
    fn refuses_records_that_cannot_be_true() {
        let bad = |f: &dyn Fn(&mut CapacityRecord), want: &str| {
            let mut r = sample();
            f(&mut r);
            let text = serde_json::to_string(&r).unwrap();
            let e = parse("n1", Some(&text)).unwrap_err();
            assert!(matches!(e, RecordError::Invalid(_)), "{e:?}");
            assert!(e.to_string().contains(want), "{want:?} not in {e:?}");
        };
        bad(&|r| r.version = 2, "version 2");
        bad(&|r| r.node = "n2".into(), "describes node \"n2\"");
        bad(
            &|r| r.hostpath[0].available = r.hostpath[0].size + 1,
            "available of",
        );
        bad(
            &|r| r.hostpath[1].path = "srv".into(),
            "not an absolute path",
        );
        bad(&|r| r.hostpath[1].path = "/srv/a".into(), "listed twice");
        bad(
            &|r| r.hostpath[1].classes = vec!["slow".into()],
            "not in hostpathClasses",
        );
        bad(&|r| r.lvm[0].free = r.lvm[0].size + 1, "free of");
        bad(&|r| r.lvm[0].extent_size = 0, "extent size 0");
        bad(
            &|r| r.lvm[0].thin_pools[0].size = 1 << 50,
            "larger than its volume group",
        );
        bad(
            &|r| {
                r.hostpath_classes = (0..300).map(|i| format!("c{i}")).collect();
            },
            "more than 256",
        );
        let e = parse("n1", None).unwrap_err();
        assert_eq!(e, RecordError::Missing);
        assert!(e.to_string().contains(DATA_KEY), "{e}");
        let e = parse("n1", Some(&" ".repeat(MAX_RECORD_BYTES + 1))).unwrap_err();
        assert_eq!(
            e,
            RecordError::TooLarge {
                len: MAX_RECORD_BYTES + 1
            }
        );
        assert!(e.to_string().contains("more than"), "{e}");
        for junk in [
            "",
            "{",
            "[]",
            "null",
            "{\"version\":1}",
            "{\"version\":-1,\"node\":\"n1\",\"publishedAt\":0}",
            "{\"version\":1,\"node\":\"n1\",\"publishedAt\":0,\"hostpath\":[{\"path\":\"/a\",\"size\":1e30,\"available\":0}]}",
        ] {
            assert!(parse("n1", Some(junk)).is_err(), "{junk:?} accepted");
        }
        // The minimal valid record: a node with nothing to offer.
        let r = parse(
            "n1",
            Some("{\"version\":1,\"node\":\"n1\",\"publishedAt\":0}"),
        )
        .unwrap();
        assert!(r.hostpath.is_empty() && r.lvm.is_empty());
    }
}
