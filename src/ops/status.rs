//! `flexvol status`: the volumes this node's drivers manage, from the state records and the live
//! mount table side by side, with every disagreement flagged (see [`super::inventory`]).
//! Exit status 1 when something disagrees, so a monitoring script can alert on it.

#![allow(clippy::print_stdout)]

use crate::node::calllog::rfc3339;
use crate::node::config::Config;
use crate::ops::inventory::{self, Inventory, PodState};
use crate::sys::mountinfo::MountTable;
use clap::Args;
use std::path::{Path, PathBuf};
use std::time::{Duration, UNIX_EPOCH};

/// Arguments of `flexvol status`.
#[derive(Args, Debug, Clone)]
pub(crate) struct StatusArgs {
    /// Print JSON (`{"volumes":[...],"corruptRecords":[...],"problems":N}`).
    #[arg(long)]
    pub(crate) json: bool,
    /// Vendor part of the driver names whose mounts are listed (as given to `flexvol install`).
    #[arg(long, default_value = "flexvol", value_name = "NAME")]
    pub(crate) vendor: String,
    /// File of pod uids the API server knows on this node; other pods are shown as gone.
    #[arg(long, value_name = "FILE")]
    pub(crate) live_pods: Option<PathBuf>,
    /// Only look at mounts below this kubelet root (default: every kubelet-shaped mount).
    #[arg(long, value_name = "DIR")]
    pub(crate) kubelet_root: Option<PathBuf>,
    /// Instead of the volumes: this node's capacity record as `flexvol provisioner
    /// --publish-capacity` would publish it for the scheduler extender, and what the extender
    /// makes of it per root and volume group (docs/scheduler-extender.md). NODE is this node's
    /// name as the cluster knows it.
    #[arg(long, value_name = "NODE")]
    pub(crate) capacity: Option<String>,
}

/// Loads what both `status` and `gc` start from.
pub(crate) fn load(
    vendor: &str,
    live_pods: Option<&PathBuf>,
    kubelet_root: Option<&Path>,
) -> Result<(Config, Inventory), String> {
    let config = Config::load().map_err(|e| e.to_string())?;
    let live = live_pods
        .map(|p| inventory::read_live_pods(p))
        .transpose()?;
    let table = MountTable::read().map_err(|e| e.to_string())?;
    let inv = inventory::collect(&config, &table, vendor, live.as_ref(), kubelet_root);
    Ok((config, inv))
}

/// `flexvol status --capacity NODE`: measure, build, show (JSON with `--json`).
fn capacity(a: &StatusArgs, node: &str) -> i32 {
    use crate::provision::capacity as cap;
    let config = match Config::load() {
        Ok(c) => c,
        Err(e) => {
            println!("flexvol status: error: {e}");
            return 2;
        }
    };
    let cap::Measured { roots, vgs, failed } = cap::measure(
        &config,
        node,
        &format!("{}/lvm", a.vendor),
        cap::Detail::Record,
    );
    let now = std::time::SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let record = cap::build(node, now, &config.local_path, &config.lvm, &roots, &vgs);
    let invalid = crate::vocab::capacity::validate(&record, node)
        .err()
        .map(|e| e.to_string());
    if a.json {
        let v = serde_json::json!({"record": record, "failed": failed, "invalid": invalid});
        println!("{}", serde_json::to_string_pretty(&v).unwrap_or_default());
    } else {
        for line in cap::describe(&record) {
            println!("{line}");
        }
        for f in &failed {
            println!("NOT MEASURED: {f}");
        }
        if let Some(e) = &invalid {
            println!("INVALID (the extender would ignore it): {e}");
        }
    }
    i32::from(!failed.is_empty() || invalid.is_some())
}

/// A record time for people.
pub(crate) fn since(secs: Option<u64>) -> String {
    secs.map(|s| rfc3339(UNIX_EPOCH + Duration::from_secs(s)))
        .unwrap_or_else(|| "-".into())
}

/// Runs `flexvol status`; returns the exit code.
pub(crate) fn run(a: &StatusArgs) -> i32 {
    if let Some(node) = &a.capacity {
        return capacity(a, node);
    }
    let (config, inv) = match load(&a.vendor, a.live_pods.as_ref(), a.kubelet_root.as_deref()) {
        Ok(x) => x,
        Err(e) => {
            println!("flexvol status: error: {e}");
            return 2;
        }
    };
    let provisioned = super::provisioned::collect(&config);
    let sizes = crate::provision::storage::quota::size_status_checked(
        &crate::sys::exec::SystemRunner::new(config.tool_dirs.clone()),
        &provisioned,
    );
    // A volume whose directory left its project (quota drift) is a problem too.
    let problems = inv.volumes.iter().filter(|v| v.problem.is_some()).count()
        + inv.corrupt_records.len()
        + inv
            .volumes
            .iter()
            .filter(|v| matches!(v.pod_state, PodState::Gone(_)))
            .count()
        + sizes.iter().filter(|s| s.drifted).count();
    if a.json {
        let provisioned: Vec<serde_json::Value> = provisioned
            .iter()
            .zip(&sizes)
            .map(|(f, s)| {
                serde_json::json!({"path": f.path, "marker": f.marker, "recorded": f.recorded, "size": s})
            })
            .collect();
        let v = serde_json::json!({
            "stateDir": config.state_dir,
            "volumes": inv.volumes,
            "provisioned": provisioned,
            "corruptRecords": inv.corrupt_records.iter().map(|(f, e)| serde_json::json!({"file": f, "error": e})).collect::<Vec<_>>(),
            "problems": problems,
        });
        println!("{}", serde_json::to_string_pretty(&v).unwrap_or_default());
        return i32::from(problems > 0);
    }
    print_provisioned(&provisioned, &sizes);
    if inv.volumes.is_empty() && inv.corrupt_records.is_empty() {
        println!(
            "no flexvol volumes {}on this node (records in {}, mounts from /proc/self/mountinfo)",
            if provisioned.is_empty() {
                ""
            } else {
                "mounted "
            },
            config.state_dir.display()
        );
        return 0;
    }
    for v in &inv.volumes {
        let state = match (v.record_file.is_some(), v.mounted) {
            (true, true) => "mounted",
            (true, false) if !inventory::mounting_verb(&v.verb) => "recorded",
            (true, false) => "NOT MOUNTED",
            (false, _) => "NO RECORD",
        };
        println!(
            "{} {} {}",
            v.backend,
            v.volume.as_deref().unwrap_or("-"),
            state
        );
        println!(
            "    pod:         {} (uid {})",
            v.pod.as_deref().unwrap_or("-"),
            v.pod_uid.as_deref().unwrap_or("-")
        );
        println!("    mount point: {}", v.mount_point.display());
        println!(
            "    source:      {}{}",
            v.source,
            match (&v.fs_type, v.read_only) {
                (Some(t), Some(ro)) => format!(" ({t}, {})", if ro { "ro" } else { "rw" }),
                _ => String::new(),
            }
        );
        println!("    since:       {}", since(v.since));
        if let PodState::Gone(why) = &v.pod_state {
            println!("    POD GONE:    {why}; `flexvol gc` cleans this up");
        }
        if let Some(p) = &v.problem {
            println!("    PROBLEM:     {p}");
        }
    }
    for (f, e) in &inv.corrupt_records {
        println!("corrupt record {}: {e}", f.display());
    }
    println!(
        "{} volume(s), {problems} problem(s){}",
        inv.volumes.len(),
        if problems > 0 {
            "; `flexvol gc` shows what it would clean up"
        } else {
            ""
        }
    );
    i32::from(problems > 0)
}

/// The volume directories `flexvol provisioner` made under this node's roots.
fn print_provisioned(
    found: &[crate::provision::storage::volumedir::Found],
    sizes: &[crate::provision::storage::quota::SizeStatus],
) {
    for (f, s) in found.iter().zip(sizes) {
        println!("provisioned {} (PV {})", f.path.display(), f.marker.volume);
        println!(
            "    claim:       {}/{} (uid {})",
            f.marker.namespace, f.marker.claim, f.marker.claim_uid
        );
        println!("    size:        {}", size_line(s));
        if !f.recorded {
            println!(
                "    ownership:   marker only (made before ownership records; its marker is writable by the pod)"
            );
        }
    }
    if !found.is_empty() {
        println!("{} provisioned volume directory(ies)", found.len());
    }
}

/// One line about a provisioned directory's size: enforced with limit and usage, or why not.
pub(crate) fn size_line(s: &crate::provision::storage::quota::SizeStatus) -> String {
    let mib = crate::protocol::quantity::format_human;
    match (s.enforced, s.limit_bytes, s.used_bytes) {
        (true, Some(limit), Some(used)) => format!(
            "enforced (project quota {}): limit {}, used {} ({}%)",
            s.project_id.map(|i| i.to_string()).unwrap_or_default(),
            mib(limit),
            mib(used),
            used.saturating_mul(100) / limit.max(1)
        ),
        _ => format!(
            "size not enforced: {}",
            s.note.as_deref().unwrap_or("unknown")
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provision::storage::quota::SizeStatus;

    #[test]
    fn size_lines_say_enforced_with_numbers_or_not_enforced_with_why() {
        let on = SizeStatus {
            enforced: true,
            project_id: Some(7),
            limit_bytes: Some(64 << 20),
            used_bytes: Some(16 << 20),
            note: None,
            drifted: false,
        };
        assert_eq!(
            size_line(&on),
            "enforced (project quota 7): limit 64.0 MiB, used 16.0 MiB (25%)"
        );
        let off = SizeStatus {
            enforced: false,
            project_id: None,
            limit_bytes: None,
            used_bytes: None,
            note: Some("filesystem tmpfs on /x has no project quotas".into()),
            drifted: false,
        };
        assert_eq!(
            size_line(&off),
            "size not enforced: filesystem tmpfs on /x has no project quotas"
        );
    }
}
