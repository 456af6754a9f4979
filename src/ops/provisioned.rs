//! Volume directories `flexvol provisioner` made on this node, for `flexvol status` and
//! `flexvol gc`: found by their root-only ownership records (and, for volumes made before records
//! existed, their marker) under every root the node config names, without the API server (both
//! hold the PV and the claim).
//!
//! gc's part: a directory whose PV is not in the `--live-pvs` list (names, as
//! `kubectl get pv -o name` prints them) is an orphan, e.g. a claim deleted between the directory
//! and its PV. With `--apply` it is deleted the provisioner's own way (record or old marker
//! checked, never through a symlink, never across a mount, never over another volume, never
//! outside a root). Without a list nothing counts as an orphan: absence from the node proves
//! nothing.
//!
//! The provisioner makes the directory *before* the PV exists, so a list taken a moment earlier
//! misses a claim being provisioned. A directory therefore counts as an orphan only when it was
//! made before the list file was last written *and* at least `--min-age` ago ([`AgeRule`]);
//! younger ones are shown and left alone. When it was made is [`created_at`]: the latest of the
//! directory's birth time and its marker's modification and change times, none of which a tenant
//! can move into the past. Right before each deletion gc reads the list file again and checks the
//! age again ([`recheck`]).

use crate::node::config::Config;
use crate::provision::storage::quota;
use crate::provision::storage::volumedir::{self, Found, SCAN_DEPTH, usable_roots};
use serde::Serialize;
use std::collections::BTreeSet;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

/// The marked directories under every root of the config, on this host.
pub(crate) fn collect(config: &Config) -> Vec<Found> {
    let (roots, _) = usable_roots(&config.local_path.all_roots(), false);
    volumedir::scan(&roots, SCAN_DEPTH)
}

/// The `--live-pvs` file: the PV names it lists, and when it was last written.
#[derive(Debug, Clone)]
pub(crate) struct LiveList {
    /// PV names (a `persistentvolume/` prefix dropped).
    pub(crate) names: BTreeSet<String>,
    /// The file's modification time: a directory made after it cannot be an orphan of it.
    pub(crate) written: SystemTime,
}

/// Reads PV names from a file (whitespace-separated; a `persistentvolume/` prefix is dropped),
/// with the file's modification time.
pub(crate) fn read_live_pvs(path: &Path) -> Result<LiveList, String> {
    let fail =
        |e: std::io::Error| format!("cannot read the --live-pvs file {}: {e}", path.display());
    let written = std::fs::metadata(path)
        .and_then(|m| m.modified())
        .map_err(fail)?;
    let text = std::fs::read_to_string(path).map_err(fail)?;
    let names: BTreeSet<String> = text
        .split_whitespace()
        .map(|n| n.trim_start_matches("persistentvolume/").to_owned())
        .collect();
    if names.is_empty() {
        return Err(format!(
            "the --live-pvs file {} lists no PV; refusing to treat every provisioned directory as orphaned (make it with: kubectl get pv -o name > FILE)",
            path.display()
        ));
    }
    Ok(LiveList { names, written })
}

/// When gc may call a directory whose PV is not listed an orphan.
#[derive(Debug, Clone, Copy)]
pub(crate) struct AgeRule {
    /// `--min-age`: how long ago, at least, the directory must have been made.
    pub(crate) min_age: Duration,
    /// When the `--live-pvs` file was written: the directory must be older than the list.
    pub(crate) list_written: SystemTime,
}

impl AgeRule {
    /// `None` when a directory made at `created` is old enough to be an orphan at `now`; else
    /// why it is left alone. An unknown creation time is never old enough.
    pub(crate) fn too_young(&self, created: Option<SystemTime>, now: SystemTime) -> Option<String> {
        let Some(created) = created else {
            return Some("when it was made cannot be read; left alone".into());
        };
        if created > self.list_written {
            return Some(
                "it was made after the --live-pvs file was written (its PV may be newer than the list); left alone".into(),
            );
        }
        match now.duration_since(created) {
            Ok(age) if age >= self.min_age => None,
            Ok(age) => Some(format!(
                "it was made {}s ago, less than --min-age {}s (its PV may still be being created); left alone",
                age.as_secs(),
                self.min_age.as_secs()
            )),
            Err(_) => Some("it was made in the future (clock change?); left alone".into()),
        }
    }
}

/// When the volume directory `found` was made, as far as the files can tell: the latest of the
/// directory's birth time (`statx` btime; its change time where the filesystem records none) and
/// its ownership marker's modification and change times. A change time cannot be set back, and a
/// tenant who rewrites or replaces the marker only makes the volume look younger, so this is
/// never earlier than the truth. `None` when the directory or its marker cannot be examined.
/// (The one place that knows where the ownership record lives: retarget it when that moves.)
pub(crate) fn created_at(found: &Found) -> Option<SystemTime> {
    let dir = std::fs::symlink_metadata(&found.path).ok()?;
    if !dir.is_dir() {
        return None;
    }
    let ctime = |m: &std::fs::Metadata| {
        let secs = u64::try_from(m.ctime()).ok()?;
        let nanos = u32::try_from(m.ctime_nsec()).ok()?;
        SystemTime::UNIX_EPOCH.checked_add(Duration::new(secs, nanos))
    };
    let born = dir.created().ok().or_else(|| ctime(&dir))?;
    let marker = std::fs::symlink_metadata(found.path.join(volumedir::MARKER)).ok()?;
    [Some(born), marker.modified().ok(), ctime(&marker)]
        .into_iter()
        .try_fold(SystemTime::UNIX_EPOCH, |latest, t| Some(latest.max(t?)))
}

/// A provisioned directory whose PV is gone.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Orphan {
    /// The directory.
    pub(crate) path: PathBuf,
    /// The PV its marker names.
    pub volume: String,
    /// The claim its marker names (`namespace/name`).
    pub claim: String,
    /// Why it is not deleted although its PV is not listed (too young, see [`AgeRule`]);
    /// `None` for an orphan.
    pub(crate) left_alone: Option<String>,
    /// With `--apply`: whether it was deleted.
    pub(crate) done: Option<bool>,
    /// Why deleting it failed.
    pub(crate) error: Option<String>,
}

/// Directories whose PV is not in `live`; those too young by `rule` have `left_alone` set.
/// `created` is [`created_at`] (a parameter, so the rule is unit-tested with any clock).
pub(crate) fn orphans(
    found: &[Found],
    live: &LiveList,
    rule: &AgeRule,
    now: SystemTime,
    created: impl Fn(&Found) -> Option<SystemTime>,
) -> Vec<Orphan> {
    found
        .iter()
        .filter(|f| !live.names.contains(&f.marker.volume))
        .map(|f| Orphan {
            path: f.path.clone(),
            volume: f.marker.volume.clone(),
            claim: format!("{}/{}", f.marker.namespace, f.marker.claim),
            left_alone: rule.too_young(created(f), now),
            done: None,
            error: None,
        })
        .collect()
}

/// Right before deleting `found`: reads the list file at `list` again and checks that its PV is
/// still not listed and that the directory is still old enough (by the list's new time).
pub(crate) fn recheck(found: &Found, list: &Path, min_age: Duration) -> Result<(), String> {
    let live = read_live_pvs(list)?;
    if live.names.contains(&found.marker.volume) {
        return Err(format!(
            "its PV {} is in the --live-pvs file now; left alone",
            found.marker.volume
        ));
    }
    let rule = AgeRule {
        min_age,
        list_written: live.written,
    };
    match rule.too_young(created_at(found), SystemTime::now()) {
        None => Ok(()),
        Some(why) => Err(why),
    }
}

/// Deletes an orphan the provisioner's way (record or old marker re-checked).
pub(crate) fn delete(config: &Config, o: &Orphan, claim_uid: &str) -> Result<(), String> {
    let (roots, _) = usable_roots(&config.local_path.all_roots(), false);
    let (root, rel) = volumedir::locate(&roots, &o.path)
        .ok_or_else(|| format!("{} is not below a configured root", o.path.display()))?;
    // With its project's limit, as the provisioner's delete does: released once the directory
    // is gone and before its record goes (kept while the project still holds something).
    let runner = crate::sys::exec::SystemRunner::new(config.tool_dirs.clone());
    let project = quota::project_of_volume(&runner, root, &rel, &o.volume);
    volumedir::delete_volume_dir_then(root, &rel, &o.volume, claim_uid, &mut || match &project {
        Ok(id) => quota::release(&runner, root, *id, &o.volume, &quota::IdScope::of(config))
            .map(drop)
            .map_err(Into::into),
        Err(_) => Ok(()),
    })
    .map(|_| ())
    .map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provision::storage::volumedir::{Marker, create_volume_dir, prepare_root};
    use crate::sys::paths::Ownership;

    #[test]
    fn orphans_are_the_dirs_whose_pv_is_not_listed_and_are_deleted_by_marker() {
        let d = tempfile::tempdir().unwrap();
        let root = prepare_root(d.path()).unwrap();
        let json = format!(
            r#"{{"nodePathMap":[{{"node":"n","paths":["{}"]}}]}}"#,
            root.real.display()
        );
        let config = Config::parse(Path::new("c"), json.as_bytes()).unwrap();
        for (pv, uid) in [("pvc-1", "u1"), ("pvc-2", "u2")] {
            let m = Marker {
                provisioner: "flexvol/hostpath".into(),
                volume: pv.into(),
                namespace: "ns".into(),
                claim: format!("c{uid}"),
                claim_uid: uid.into(),
                node: "n".into(),
                project_id: None,
            };
            create_volume_dir(&root, Path::new(pv), Ownership::default(), &m).unwrap();
        }
        let found = collect(&config);
        assert_eq!(found.len(), 2);
        let list = d.path().join("live");
        std::fs::write(&list, "persistentvolume/pvc-1\npersistentvolume/other\n").unwrap();
        let live = read_live_pvs(&list).unwrap();
        let rule = AgeRule {
            min_age: Duration::ZERO,
            list_written: live.written,
        };
        let o = orphans(&found, &live, &rule, SystemTime::now(), created_at);
        assert_eq!(o.len(), 1);
        assert_eq!(
            (o[0].volume.as_str(), o[0].claim.as_str()),
            ("pvc-2", "ns/cu2")
        );
        assert_eq!(o[0].left_alone, None, "older than the list and min-age 0");
        recheck(&found[1], &list, Duration::ZERO).unwrap();
        let uid = &found[1].marker.claim_uid;
        delete(&config, &o[0], uid).unwrap();
        assert!(!root.real.join("pvc-2").exists());
        assert!(root.real.join("pvc-1").exists());
        std::fs::write(&list, "\n").unwrap();
        assert!(read_live_pvs(&list).unwrap_err().contains("lists no PV"));
    }

    const HOUR: Duration = Duration::from_secs(3600);

    /// Issue #20 hole 6: the marker is written before the PV exists, so a directory younger than
    /// the list, or younger than --min-age, may be live: never an orphan.
    #[test]
    fn a_directory_younger_than_the_list_or_min_age_is_not_an_orphan() {
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let rule = AgeRule {
            min_age: HOUR,
            list_written: t0,
        };
        let now = t0 + 3 * HOUR;
        // Made two hours before the list: old enough.
        assert_eq!(rule.too_young(Some(t0 - 2 * HOUR), now), None);
        // Made a second after the list was written: its PV may be newer than the list.
        let after = rule.too_young(Some(t0 + Duration::from_secs(1)), now);
        assert!(after.unwrap().contains("after the --live-pvs file"));
        // Older than the list, but younger than --min-age.
        let young = AgeRule {
            min_age: HOUR,
            list_written: now,
        };
        let y = young.too_young(Some(now - Duration::from_secs(59 * 60)), now);
        assert!(y.unwrap().contains("less than --min-age 3600s"));
        assert_eq!(young.too_young(Some(now - HOUR), now), None);
        // Unknown, or in the future: never old enough.
        assert!(rule.too_young(None, now).is_some());
        assert!(young.too_young(Some(now + HOUR), now).is_some());
    }

    #[test]
    fn fresh_real_directories_are_left_alone_and_created_at_cannot_be_backdated() {
        let d = tempfile::tempdir().unwrap();
        let root = prepare_root(d.path()).unwrap();
        let list = d.path().join("live");
        std::fs::write(&list, "persistentvolume/other\n").unwrap();
        // The list was written an hour ago; the directory is made now.
        let before = SystemTime::now() - HOUR;
        std::fs::File::options()
            .write(true)
            .open(&list)
            .unwrap()
            .set_modified(before)
            .unwrap();
        let m = Marker {
            provisioner: "flexvol/hostpath".into(),
            volume: "pvc-new".into(),
            namespace: "ns".into(),
            claim: "c".into(),
            claim_uid: "u".into(),
            node: "n".into(),
            project_id: None,
        };
        let path =
            create_volume_dir(&root, Path::new("pvc-new"), Ownership::default(), &m).unwrap();
        let found = vec![Found {
            path: path.clone(),
            marker: m,
            recorded: true,
        }];
        let created = created_at(&found[0]).unwrap();
        assert!(created > before);
        let live = read_live_pvs(&list).unwrap();
        assert_eq!(live.written, before);
        let now = SystemTime::now();
        for min_age in [Duration::ZERO, HOUR] {
            let rule = AgeRule {
                min_age,
                list_written: live.written,
            };
            let o = orphans(&found, &live, &rule, now, created_at);
            assert!(
                o[0].left_alone
                    .as_deref()
                    .unwrap()
                    .contains("after the --live-pvs")
            );
            assert!(recheck(&found[0], &list, min_age).is_err());
        }
        // A list written now: still younger than the default --min-age.
        std::fs::write(&list, "persistentvolume/other\n").unwrap();
        let err = recheck(&found[0], &list, HOUR).unwrap_err();
        assert!(err.contains("less than --min-age"), "{err}");
        recheck(&found[0], &list, Duration::ZERO).unwrap();
        // Listed by the time of the deletion: left alone.
        std::fs::write(&list, "persistentvolume/pvc-new\n").unwrap();
        assert!(
            recheck(&found[0], &list, Duration::ZERO)
                .unwrap_err()
                .contains("is in the --live-pvs file now")
        );
        // A marker replaced by one with an old modification time does not make it look old.
        let marker = path.join(volumedir::MARKER);
        let text = std::fs::read(&marker).unwrap();
        std::fs::remove_file(&marker).unwrap();
        std::fs::write(&marker, text).unwrap();
        std::fs::File::options()
            .write(true)
            .open(&marker)
            .unwrap()
            .set_modified(SystemTime::UNIX_EPOCH + HOUR)
            .unwrap();
        assert!(created_at(&found[0]).unwrap() > before);
    }
}
