//! `flexvol gc`: finds what kubelet forgot and, only with `--apply`, cleans it up.
//!
//! What it finds (see [`super::inventory`] for when a pod counts as gone):
//! - **orphaned mounts**: a flexvol mount in a pod volume directory whose pod is gone. Cleaned up
//!   by running the backend's own `unmount` verb in-process (same lock, same checks, same record
//!   handling as when kubelet calls it), then `rmdir` of the volume directory if it is empty.
//! - **stale records**: a record of a mount that is not mounted. Forgotten under the volume's lock,
//!   after re-checking, and only when older than `verbTimeoutSeconds` (no call that could still
//!   be mounting it is running).
//! - mounts without a record whose pod is alive are shown and **left alone**: a live pod may use them.
//!
//! - **orphaned provisioned directories** (only with `--live-pvs FILE`): a directory made by
//!   `flexvol provisioner` whose PV is not in FILE (see [`super::provisioned`]) and that was made
//!   before FILE was written and at least `--min-age` (default 1h) ago: the provisioner makes a
//!   directory before its PV, so a younger one may be live and is left alone. `--apply` reads
//!   FILE again and re-checks the age right before each deletion, then deletes it as the
//!   provisioner would (ownership marker checked, never through a symlink).
//!
//! Apart from those, it never deletes data: it never removes anything recursively, never touches
//! a volume's source, and removes at most an empty directory it has just unmounted.
//!
//! LVM: an LV is deactivated by the LVM backend's own verbs, which gc runs for orphaned LVM pod
//! mounts; logical volumes that are active with no mount and no record (e.g. after the state
//! directory was lost) are not searched for, because only the backend knows which LVs are its own.

#![allow(clippy::print_stdout)]

use crate::backend::{self, Backend};
use crate::node::calllog;
use crate::node::config::Config;
use crate::node::state::{StateStore, now_secs};
use crate::ops::inventory::{Entry, PodState};
use crate::protocol::reply::{Reply, Status};
use crate::protocol::verb::Call;
use crate::sys::lock::VolumeLock;
use crate::sys::mountinfo::MountTable;
use crate::sys::process::Deadline;
use clap::Args;
use serde::Serialize;
use std::path::PathBuf;
use std::time::Duration;

/// Arguments of `flexvol gc`.
#[derive(Args, Debug, Clone)]
pub(crate) struct GcArgs {
    /// Clean up what was found; without it, only show what would be done.
    #[arg(long)]
    pub(crate) apply: bool,
    /// Print JSON (`{"apply":bool,"findings":[...]}`).
    #[arg(long)]
    pub(crate) json: bool,
    /// Vendor part of the driver names (as given to `flexvol install`).
    #[arg(long, default_value = "flexvol", value_name = "NAME")]
    pub(crate) vendor: String,
    /// File of the pod uids the API server knows on this node (whitespace-separated); mounts of
    /// pods not in it count as orphaned.
    #[arg(long, value_name = "FILE")]
    pub(crate) live_pods: Option<PathBuf>,
    /// File of the PV names the API server knows (`kubectl get pv -o name`); hostPath directories made
    /// by `flexvol provisioner` whose PV is not in it count as orphaned.
    #[arg(long, value_name = "FILE")]
    pub(crate) live_pvs: Option<PathBuf>,
    /// With --live-pvs: a provisioned directory whose PV is not listed is an orphan only when it
    /// was made at least this long ago (and before FILE was written); the provisioner makes the
    /// directory before the PV. `<n>s`, `<n>m`, `<n>h` or `<n>d`.
    #[arg(long, value_name = "AGE", default_value = "1h", value_parser = parse_age)]
    pub(crate) min_age: Duration,
    /// Only look at mounts below this kubelet root (default: every kubelet-shaped mount).
    #[arg(long, value_name = "DIR")]
    pub(crate) kubelet_root: Option<PathBuf>,
}

/// Parses `--min-age`: a whole number of seconds, minutes, hours or days (`90s`, `30m`, `1h`,
/// `2d`; a bare number is seconds).
fn parse_age(s: &str) -> Result<Duration, String> {
    let (num, unit) = match s.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => (&s[..i], c),
        _ => (s, 's'),
    };
    let per = match unit {
        's' => 1,
        'm' => 60,
        'h' => 3600,
        'd' => 86_400,
        _ => return Err(format!("unknown unit {unit:?}: use s, m, h or d (e.g. 1h)")),
    };
    num.parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(per))
        .map(Duration::from_secs)
        .ok_or_else(|| {
            format!("{s:?} is not a duration: a whole number and s, m, h or d (e.g. 1h)")
        })
}

/// One thing gc found and what it did (or would do) about it.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Finding {
    /// `orphaned-mount`, `stale-record` or `untracked-mount`.
    pub kind: &'static str,
    /// Backend name.
    pub(crate) backend: String,
    /// The directory kubelet named.
    pub(crate) target: PathBuf,
    /// Where the mount is (or was).
    pub mount_point: PathBuf,
    /// Why it was found.
    pub(crate) reason: String,
    /// What gc does about it (`unmount`, `forget-record`, `none`).
    pub(crate) action: &'static str,
    /// With `--apply`: whether the action succeeded; `None` in a dry run or for `none`.
    pub(crate) done: Option<bool>,
    /// Why the action failed or was skipped.
    pub(crate) error: Option<String>,
}

fn finding(e: &Entry, kind: &'static str, reason: String, action: &'static str) -> Finding {
    Finding {
        kind,
        backend: e.backend.clone(),
        target: e.target.clone(),
        mount_point: e.mount_point.clone(),
        reason,
        action,
        done: None,
        error: None,
    }
}

/// Decides what to do with each volume; pure, so the rules are unit-tested.
pub(crate) fn plan(volumes: &[Entry], now: u64, grace: Duration) -> Vec<Finding> {
    let mut out = Vec::new();
    for e in volumes {
        match (&e.pod_state, e.mounted) {
            (PodState::Gone(why), true) if e.verb == "mount" => out.push(finding(
                e,
                "orphaned-mount",
                format!("the pod is gone: {why}"),
                "unmount",
            )),
            (_, false) if e.stale_record() => {
                let age = now.saturating_sub(e.since.unwrap_or(now));
                if age >= grace.as_secs() {
                    out.push(finding(
                        e,
                        "stale-record",
                        "recorded as mounted, but nothing is mounted there".into(),
                        "forget-record",
                    ));
                }
            }
            (PodState::Alive | PodState::NotAPod, true) if e.untracked_mount() => {
                out.push(finding(
                    e,
                    "untracked-mount",
                    "mounted without a record, but its pod is not known to be gone; left alone (see --live-pods)".into(),
                    "none",
                ))
            }
            _ => {}
        }
    }
    out
}

/// Runs the backend's `unmount` on an orphaned pod volume, then removes its empty directory.
fn unmount(config: &Config, f: &Finding) -> Result<(), String> {
    let b = Backend::from_name(&f.backend).ok_or("unknown backend")?;
    let deadline = Deadline::after(config.verb_timeout());
    let call = Call::Unmount {
        mount_dir: f.target.to_string_lossy().into_owned(),
    };
    // The call log's arguments: kubelet's argv after the verb.
    let args = call.to_argv().split_off(1);
    calllog::begin(
        config.log_path().map(Into::into),
        config.call_log_max_bytes,
        config.log_syslog.then(|| config.syslog_socket.clone()),
        b.name(),
        "gc:unmount",
        &args,
    );
    let reply = backend::on_node(config, deadline, "flexvol/gc", |ctx| {
        backend::answer(b, &call, ctx)
    })
    .unwrap_or_else(|e| Reply::failure(e.to_string()));
    calllog::record_final(&reply);
    if reply.status != Status::Success {
        return Err(reply.message.unwrap_or_default());
    }
    // kubelet would rmdir it after a successful unmount; remove_dir refuses anything non-empty.
    match std::fs::remove_dir(&f.target) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(format!("unmounted, but kept {}: {e}", f.target.display())),
    }
}

/// Forgets a stale record under the volume's lock, after checking again that it is stale.
fn forget(config: &Config, f: &Finding) -> Result<(), String> {
    let b = Backend::from_name(&f.backend).ok_or("unknown backend")?;
    let key = backend::lock_key(b, &f.target.to_string_lossy());
    let _lock = VolumeLock::acquire(&config.lock_dir(), &key, Duration::from_secs(5))
        .map_err(|e| e.to_string())?;
    let store = StateStore::new(&config.state_dir, b.name());
    let Some(rec) = store.load(&f.target).map_err(|e| e.to_string())? else {
        return Ok(()); // forgotten meanwhile
    };
    let table = MountTable::read().map_err(|e| e.to_string())?;
    if table.is_mount_point(rec.mount_point()) {
        return Err("it is mounted now; left alone".into());
    }
    if now_secs().saturating_sub(rec.since) < config.verb_timeout_seconds {
        return Err("the record was just rewritten by a running call; left alone".into());
    }
    let args = vec![f.target.to_string_lossy().into_owned()];
    calllog::begin(
        config.log_path().map(Into::into),
        config.call_log_max_bytes,
        config.log_syslog.then(|| config.syslog_socket.clone()),
        b.name(),
        "gc:forget",
        &args,
    );
    let r = store.remove(&f.target).map_err(|e| e.to_string());
    calllog::record_final(&match &r {
        Ok(()) => Reply::success(),
        Err(e) => Reply::failure(e.clone()),
    });
    r
}

/// Runs `flexvol gc`; returns the exit code.
pub(crate) fn run(a: &GcArgs) -> i32 {
    let (config, inv) =
        match super::status::load(&a.vendor, a.live_pods.as_ref(), a.kubelet_root.as_deref()) {
            Ok(x) => x,
            Err(e) => {
                println!("flexvol gc: error: {e}");
                return 2;
            }
        };
    let mut findings = plan(&inv.volumes, now_secs(), config.verb_timeout());
    if a.apply {
        for f in &mut findings {
            let r = match f.action {
                "unmount" => unmount(&config, f),
                "forget-record" => forget(&config, f),
                _ => continue,
            };
            f.done = Some(r.is_ok());
            f.error = r.err();
        }
    }
    // Provisioned directories whose PV is gone (only with a list of live PVs: absence from the
    // node proves nothing).
    let found = super::provisioned::collect(&config);
    let now = std::time::SystemTime::now();
    let mut orphans = match a.live_pvs.as_deref().map(super::provisioned::read_live_pvs) {
        None => Vec::new(),
        Some(Ok(live)) => {
            let rule = super::provisioned::AgeRule {
                min_age: a.min_age,
                list_written: live.written,
            };
            super::provisioned::orphans(&found, &live, &rule, now, super::provisioned::created_at)
        }
        Some(Err(e)) => {
            println!("flexvol gc: error: {e}");
            return 2;
        }
    };
    if a.apply
        && let Some(list) = a.live_pvs.as_deref()
    {
        for o in orphans.iter_mut().filter(|o| o.left_alone.is_none()) {
            let Some(f) = found.iter().find(|f| f.path == o.path) else {
                continue;
            };
            // The list may have been rewritten and the provisioner may have made the directory
            // again since the scan: read and check both once more, right before deleting.
            if let Err(why) = super::provisioned::recheck(f, list, a.min_age) {
                o.left_alone = Some(why);
                continue;
            }
            let r = super::provisioned::delete(&config, o, &f.marker.claim_uid);
            o.done = Some(r.is_ok());
            o.error = r.err();
        }
    }
    let failed = findings.iter().filter(|f| f.done == Some(false)).count()
        + orphans.iter().filter(|o| o.done == Some(false)).count();
    if a.json {
        let v = serde_json::json!({"apply": a.apply, "findings": findings, "orphanedDirectories": orphans, "corruptRecords": inv.corrupt_records.iter().map(|(f, e)| serde_json::json!({"file": f, "error": e})).collect::<Vec<_>>()});
        println!("{}", serde_json::to_string_pretty(&v).unwrap_or_default());
        return i32::from(failed > 0);
    }
    for f in &findings {
        let what = match (f.action, f.done) {
            ("unmount", None) => "would unmount",
            ("unmount", Some(true)) => "unmounted",
            ("unmount", Some(false)) => "FAILED to unmount",
            ("forget-record", None) => "would forget the record of",
            ("forget-record", Some(true)) => "forgot the record of",
            ("forget-record", Some(false)) => "FAILED to forget the record of",
            _ => "left alone",
        };
        println!(
            "{what} {} ({}, {}: {})",
            f.mount_point.display(),
            f.backend,
            f.kind,
            f.reason
        );
        if let Some(e) = &f.error {
            println!("    {e}");
        }
    }
    for (file, e) in &inv.corrupt_records {
        println!("left alone: corrupt record {} ({e})", file.display());
    }
    for o in &orphans {
        if let Some(why) = &o.left_alone {
            println!(
                "left alone: {} (provisioned for PV {} of claim {}, which is not in the list, but {why})",
                o.path.display(),
                o.volume,
                o.claim
            );
            continue;
        }
        let what = match o.done {
            None => "would delete",
            Some(true) => "deleted",
            Some(false) => "FAILED to delete",
        };
        println!(
            "{what} {} (provisioned for PV {} of claim {}, which no longer exists)",
            o.path.display(),
            o.volume,
            o.claim
        );
        if let Some(e) = &o.error {
            println!("    {e}");
        }
    }
    if a.live_pvs.is_none() && !found.is_empty() {
        println!(
            "{} provisioned volume directory(ies) not checked: pass --live-pvs FILE (kubectl get pv -o name > FILE) to find those whose PV is gone",
            found.len()
        );
    }
    let actionable = findings.iter().filter(|f| f.action != "none").count()
        + orphans.iter().filter(|o| o.left_alone.is_none()).count();
    if findings.is_empty() && orphans.is_empty() {
        println!("nothing to clean up");
    } else if !a.apply && actionable > 0 {
        println!("{actionable} thing(s) to clean up; run `flexvol gc --apply` to do it");
    }
    i32::from(failed > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(mounted: bool, recorded: bool, pod: PodState, since: u64) -> Entry {
        Entry {
            backend: "hostpath".into(),
            verb: "mount".into(),
            target: "/k/pods/u/volumes/flexvol~hostpath/v".into(),
            mount_point: "/k/pods/u/volumes/flexvol~hostpath/v".into(),
            source: "/srv".into(),
            volume: None,
            pod: None,
            pod_uid: Some("u".into()),
            since: recorded.then_some(since),
            record_file: recorded.then(|| "/s/x.json".into()),
            mounted,
            fs_type: None,
            read_only: None,
            pod_state: pod,
            problem: None,
        }
    }

    #[test]
    fn plan_is_conservative() {
        let g = Duration::from_secs(300);
        let gone = PodState::Gone("x".into());
        let kinds = |e: Entry| -> Vec<&'static str> {
            plan(&[e], 1000, g).iter().map(|f| f.action).collect()
        };
        assert_eq!(kinds(entry(true, true, gone.clone(), 1)), ["unmount"]);
        assert_eq!(kinds(entry(true, false, gone.clone(), 1)), ["unmount"]);
        assert_eq!(
            kinds(entry(true, true, PodState::Alive, 1)),
            Vec::<&str>::new()
        );
        assert_eq!(kinds(entry(true, false, PodState::Alive, 1)), ["none"]);
        assert_eq!(
            kinds(entry(false, true, PodState::Alive, 1)),
            ["forget-record"]
        );
        assert_eq!(kinds(entry(false, true, gone, 1)), ["forget-record"]);
        // A record younger than the verb deadline may belong to a mount in progress.
        assert_eq!(
            kinds(entry(false, true, PodState::Alive, 900)),
            Vec::<&str>::new()
        );
        // Device mounts have no pod: never unmounted by gc.
        let mut d = entry(true, true, PodState::NotAPod, 1);
        d.verb = "mountdevice".into();
        assert_eq!(kinds(d), Vec::<&str>::new());
    }

    #[test]
    fn min_age_parses_whole_units_only() {
        assert_eq!(parse_age("1h"), Ok(Duration::from_secs(3600)));
        assert_eq!(parse_age("90"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_age("0s"), Ok(Duration::ZERO));
        assert_eq!(parse_age("2d"), Ok(Duration::from_secs(172_800)));
        for bad in ["", "h", "1.5h", "-1h", "1w", "1hh", "99999999999999999999d"] {
            assert!(parse_age(bad).is_err(), "{bad}");
        }
    }
}
