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

use crate::node::config::Config;
use crate::provision::hostpath::{self, Found};
use crate::provision::reconcile::{SCAN_DEPTH, usable_roots};
use serde::Serialize;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// The marked directories under every root of the config, on this host.
pub fn collect(config: &Config) -> Vec<Found> {
    let (roots, _) = usable_roots(&config.local_path.all_roots(), false);
    hostpath::scan(&roots, SCAN_DEPTH)
}

/// Reads PV names from a file (whitespace-separated; a `persistentvolume/` prefix is dropped).
pub fn read_live_pvs(path: &Path) -> Result<BTreeSet<String>, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read the --live-pvs file {}: {e}", path.display()))?;
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
    Ok(names)
}

/// A provisioned directory whose PV is gone.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Orphan {
    /// The directory.
    pub path: PathBuf,
    /// The PV its marker names.
    pub volume: String,
    /// The claim its marker names (`namespace/name`).
    pub claim: String,
    /// With `--apply`: whether it was deleted.
    pub done: Option<bool>,
    /// Why deleting it failed.
    pub error: Option<String>,
}

/// Directories whose PV is not in `live`.
pub fn orphans(found: &[Found], live: &BTreeSet<String>) -> Vec<Orphan> {
    found
        .iter()
        .filter(|f| !live.contains(&f.marker.volume))
        .map(|f| Orphan {
            path: f.path.clone(),
            volume: f.marker.volume.clone(),
            claim: format!("{}/{}", f.marker.namespace, f.marker.claim),
            done: None,
            error: None,
        })
        .collect()
}

/// Deletes an orphan the provisioner's way (record or old marker re-checked).
pub fn delete(config: &Config, o: &Orphan, claim_uid: &str) -> Result<(), String> {
    let (roots, _) = usable_roots(&config.local_path.all_roots(), false);
    let (root, rel) = hostpath::locate(&roots, &o.path)
        .ok_or_else(|| format!("{} is not below a configured root", o.path.display()))?;
    hostpath::delete_volume_dir(root, &rel, &o.volume, claim_uid).map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provision::hostpath::{Marker, create_volume_dir, prepare_root};
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
        let o = orphans(&found, &live);
        assert_eq!(o.len(), 1);
        assert_eq!(
            (o[0].volume.as_str(), o[0].claim.as_str()),
            ("pvc-2", "ns/cu2")
        );
        let uid = &found[1].marker.claim_uid;
        delete(&config, &o[0], uid).unwrap();
        assert!(!root.real.join("pvc-2").exists());
        assert!(root.real.join("pvc-1").exists());
        std::fs::write(&list, "\n").unwrap();
        assert!(read_live_pvs(&list).unwrap_err().contains("lists no PV"));
    }
}
