//! What this node's drivers manage, from the two sources that can disagree: the state records
//! (what flexvol believes it mounted) and the live mount table (what is mounted). `status` shows
//! it, `gc` acts on it.
//!
//! A mount "looks like flexvol" when its mount point has one of the shapes kubelet gives our
//! drivers (docs/protocol.md §7), whatever the kubelet root is:
//! - `<root>/pods/<uid>/volumes/<vendor>~<driver>/<volume>` (a `mount`; a file-like hostPath
//!   volume is mounted on a file one level below it),
//! - `<root>/plugins/kubernetes.io/flexvolume/<vendor>/<driver>/mounts/<volume>` (a `mountdevice`).
//!
//! A pod is **gone** only when one of these holds, never by guessing from activity:
//! 1. its directory `<root>/pods/<uid>` does not exist (kubelet removes it last, after every
//!    volume is unmounted, so a record or mount that still points into it was forgotten);
//! 2. the mount table shows the mount point as deleted (`... (deleted)`): the directory was
//!    removed while mounted, which kubelet never does to a live pod;
//! 3. the operator passed the list of pods the API server knows on this node (`--live-pods`) and
//!    the uid is not in it.
//!
//! A kubelet that forgot a pod usually leaves `<root>/pods/<uid>` behind with the mount in it
//! ("orphaned pod ... volume paths are still present on disk"), so case 3 is the one that finds
//! real orphans; cases 1 and 2 need no input and cannot be wrong.

use crate::backend::Backend;
use crate::node::config::Config;
use crate::node::state::{StateStore, VolumeRecord};
use crate::sys::mountinfo::{MountInfo, MountTable};
use serde::Serialize;
use std::collections::BTreeSet;
use std::path::{Component, Path, PathBuf};

/// Where a kubelet path says a volume belongs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct KubeletPath {
    /// The kubelet root directory (`/var/lib/kubelet`).
    pub root: PathBuf,
    /// Pod uid, for a pod volume directory.
    pub(crate) pod_uid: Option<String>,
    /// `<vendor>~<driver>` for pods, `<vendor>/<driver>` for device mounts.
    pub(crate) plugin: String,
    /// The driver part of the plugin name.
    pub(crate) driver: String,
    /// `pvOrVolumeName`.
    pub volume: String,
    /// The directory kubelet named: the pod volume dir or the device mount dir.
    pub(crate) target: PathBuf,
}

fn names(p: &Path) -> Option<Vec<String>> {
    p.components()
        .map(|c| match c {
            Component::RootDir => Some(String::new()),
            Component::Normal(s) => Some(s.to_string_lossy().into_owned()),
            _ => None,
        })
        .collect()
}

/// Parses a directory kubelet hands to a driver (exact depth, no file below it).
pub(crate) fn parse_kubelet_dir(p: &Path) -> Option<KubeletPath> {
    let c = names(p)?;
    let n = c.len();
    let root_of = |k: usize| -> PathBuf { p.components().take(k).collect() };
    if n >= 6 && c[n - 5] == "pods" && c[n - 3] == "volumes" {
        let (vendor, driver) = c[n - 2].split_once('~')?;
        if vendor.is_empty() || driver.is_empty() {
            return None;
        }
        return Some(KubeletPath {
            root: root_of(n - 5),
            pod_uid: Some(c[n - 4].clone()),
            plugin: c[n - 2].clone(),
            driver: driver.to_owned(),
            volume: c[n - 1].clone(),
            target: p.to_path_buf(),
        });
    }
    if n >= 8
        && c[n - 7] == "plugins"
        && c[n - 6] == "kubernetes.io"
        && c[n - 5] == "flexvolume"
        && c[n - 2] == "mounts"
    {
        return Some(KubeletPath {
            root: root_of(n - 7),
            pod_uid: None,
            plugin: format!("{}/{}", c[n - 4], c[n - 3]),
            driver: c[n - 3].clone(),
            volume: c[n - 1].clone(),
            target: p.to_path_buf(),
        });
    }
    None
}

/// Whether the pod a volume belongs to still exists.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase", tag = "state", content = "reason")]
pub(crate) enum PodState {
    /// Its directory exists (and, with `--live-pods`, the API server knows it).
    Alive,
    /// Gone, and why we are sure.
    Gone(String),
    /// Not a pod volume (a device mount, or a path of another shape).
    NotAPod,
}

/// One volume as seen by the records and the mount table.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Entry {
    /// Backend name.
    pub(crate) backend: String,
    /// `mount` or `mountdevice` (or another verb a backend records).
    pub(crate) verb: String,
    /// The directory kubelet named.
    pub(crate) target: PathBuf,
    /// Where the mount is (the target, or a file inside it).
    pub mount_point: PathBuf,
    /// What is mounted: the record's source, else the mount table's.
    pub source: String,
    /// PV or volume name.
    pub volume: Option<String>,
    /// `namespace/name`, from the record.
    pub(crate) pod: Option<String>,
    /// Pod uid, from the path (or the record).
    pub(crate) pod_uid: Option<String>,
    /// When the record was written (seconds since the epoch).
    pub(crate) since: Option<u64>,
    /// The record file, if there is a record.
    pub(crate) record_file: Option<PathBuf>,
    /// Whether something is mounted at the mount point.
    pub(crate) mounted: bool,
    /// Filesystem type and options of the live mount.
    pub fs_type: Option<String>,
    /// Whether the live mount is read-only.
    pub(crate) read_only: Option<bool>,
    /// Whether the pod still exists.
    pub(crate) pod_state: PodState,
    /// What disagrees, if anything.
    pub(crate) problem: Option<String>,
}

impl Entry {
    /// The record exists but nothing is mounted (only meaningful for verbs that mount).
    pub(crate) fn stale_record(&self) -> bool {
        self.record_file.is_some() && !self.mounted && mounting_verb(&self.verb)
    }

    /// Mounted, but flexvol has no record of it.
    pub(crate) fn untracked_mount(&self) -> bool {
        self.record_file.is_none() && self.mounted
    }
}

/// Verbs whose record describes a mount (other verbs, e.g. an LVM attach, record no mount).
pub(crate) fn mounting_verb(verb: &str) -> bool {
    matches!(verb, "mount" | "mountdevice")
}

/// Everything found, plus state files that could not be read.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Inventory {
    /// Volumes, records first (by backend and file), then untracked mounts.
    pub(crate) volumes: Vec<Entry>,
    /// State files that do not parse: `(file, error)`.
    pub(crate) corrupt_records: Vec<(PathBuf, String)>,
}

/// Pod uids the API server knows on this node, read from a file of whitespace-separated uids
/// (`kubectl get pods -A --field-selector spec.nodeName=NODE -o jsonpath='{.items[*].metadata.uid}'`).
/// An empty list is refused: it would make every pod look gone.
pub(crate) fn read_live_pods(path: &Path) -> Result<BTreeSet<String>, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read --live-pods file {}: {e}", path.display()))?;
    let set: BTreeSet<String> = text.split_whitespace().map(str::to_owned).collect();
    if set.is_empty() {
        return Err(format!(
            "--live-pods file {} lists no pod; refusing to treat every pod on the node as gone",
            path.display()
        ));
    }
    Ok(set)
}

/// The mount table shows a mount point whose directory was deleted with this suffix.
const DELETED: &str = " (deleted)";

fn pod_state(
    k: Option<&KubeletPath>,
    mount: Option<&MountInfo>,
    live: Option<&BTreeSet<String>>,
) -> PodState {
    let Some((k, uid)) = k.and_then(|k| k.pod_uid.as_ref().map(|u| (k, u))) else {
        return PodState::NotAPod;
    };
    let pod_dir = k.root.join("pods").join(uid);
    if let Err(e) = std::fs::symlink_metadata(&pod_dir)
        && e.kind() == std::io::ErrorKind::NotFound
    {
        return PodState::Gone(format!(
            "its directory {} no longer exists",
            pod_dir.display()
        ));
    }
    if mount.is_some_and(|m| m.mount_point.to_string_lossy().ends_with(DELETED)) {
        return PodState::Gone("its mount point was deleted while mounted".into());
    }
    if let Some(live) = live
        && !live.contains(uid)
    {
        return PodState::Gone(format!("pod uid {uid} is not in the --live-pods list"));
    }
    PodState::Alive
}

/// Collects the records of every backend and the flexvol-looking mounts of `vendor` (only those
/// below `kubelet_root`, when given).
pub(crate) fn collect(
    config: &Config,
    table: &MountTable,
    vendor: &str,
    live: Option<&BTreeSet<String>>,
    kubelet_root: Option<&Path>,
) -> Inventory {
    let mut volumes = Vec::new();
    let mut corrupt_records = Vec::new();
    for b in Backend::ALL {
        for (file, rec) in StateStore::new(&config.state_dir, b.name()).list() {
            match rec {
                Ok(r) => volumes.push(from_record(r, file, table, live)),
                Err(e) => corrupt_records.push((file, e.to_string())),
            }
        }
    }
    let known: BTreeSet<PathBuf> = volumes.iter().map(|e| e.mount_point.clone()).collect();
    let targets: BTreeSet<PathBuf> = volumes.iter().map(|e| e.target.clone()).collect();
    for m in &table.entries {
        let mp = &m.mount_point;
        if known.contains(mp) || volumes.iter().any(|e| e.mounted && &e.mount_point == mp) {
            continue;
        }
        let clean = PathBuf::from(
            mp.to_string_lossy()
                .strip_suffix(DELETED)
                .map(str::to_owned)
                .unwrap_or_else(|| mp.to_string_lossy().into_owned()),
        );
        // The mount point itself, or (file-like hostPath) its directory.
        let k = parse_kubelet_dir(&clean)
            .or_else(|| parse_kubelet_dir(clean.parent()?).filter(|k| k.pod_uid.is_some()));
        let Some(k) = k else { continue };
        if kubelet_root.is_some_and(|r| r != k.root) {
            continue;
        }
        let backend = match Backend::from_name(&k.driver) {
            Some(b) => b,
            None => continue,
        };
        let ours = match k.pod_uid {
            Some(_) => k.plugin == format!("{vendor}~{}", backend.name()),
            None => k.plugin == format!("{vendor}/{}", backend.name()),
        };
        // Stacked mounts at one point are one volume; a record elsewhere for this target covers it.
        if !ours || targets.contains(&k.target) || volumes.iter().any(|e| e.mount_point == *mp) {
            continue;
        }
        let state = pod_state(Some(&k), Some(m), live);
        volumes.push(Entry {
            backend: backend.name().into(),
            verb: if k.pod_uid.is_some() { "mount" } else { "mountdevice" }.into(),
            target: k.target.clone(),
            mount_point: mp.clone(),
            source: describe_source(m),
            volume: Some(k.volume.clone()),
            pod: None,
            pod_uid: k.pod_uid.clone(),
            since: None,
            record_file: None,
            mounted: true,
            fs_type: Some(m.fs_type.clone()),
            read_only: Some(m.read_only()),
            pod_state: state,
            problem: Some(
                "mounted, but flexvol has no record of it (state lost, or mounted by something else)"
                    .into(),
            ),
        });
    }
    Inventory {
        volumes,
        corrupt_records,
    }
}

fn describe_source(m: &MountInfo) -> String {
    if m.root == Path::new("/") {
        m.source.clone()
    } else {
        format!("{}:{}", m.source, m.root.display())
    }
}

fn from_record(
    r: VolumeRecord,
    file: PathBuf,
    table: &MountTable,
    live: Option<&BTreeSet<String>>,
) -> Entry {
    let mp = r.mount_point().to_path_buf();
    let m = table.at(&mp);
    let k = parse_kubelet_dir(&r.target);
    let mounting = mounting_verb(&r.verb);
    let problem = match (m.is_some(), mounting) {
        (false, true) => Some(
            "recorded as mounted, but nothing is mounted there (unmounted behind flexvol's back, or a mount that failed half-way)"
                .into(),
        ),
        _ => None,
    };
    Entry {
        backend: r.backend.clone(),
        verb: r.verb.clone(),
        target: r.target.clone(),
        mount_point: mp,
        source: r.source.clone(),
        volume: r.volume.clone(),
        pod: r.pod.clone(),
        pod_uid: k
            .as_ref()
            .and_then(|k| k.pod_uid.clone())
            .or(r.pod_uid.clone()),
        since: Some(r.since),
        record_file: Some(file),
        mounted: m.is_some(),
        fs_type: m.map(|m| m.fs_type.clone()),
        read_only: m.map(MountInfo::read_only),
        pod_state: pod_state(k.as_ref(), m, live),
        problem,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kubelet_paths() {
        let k = parse_kubelet_dir(Path::new(
            "/var/lib/kubelet/pods/6f3c/volumes/flexvol~hostpath/pv-1",
        ))
        .unwrap();
        assert_eq!(k.root, Path::new("/var/lib/kubelet"));
        assert_eq!(k.pod_uid.as_deref(), Some("6f3c"));
        assert_eq!(
            (k.plugin.as_str(), k.driver.as_str()),
            ("flexvol~hostpath", "hostpath")
        );
        assert_eq!(k.volume, "pv-1");
        let d = parse_kubelet_dir(Path::new(
            "/opt/rke/var/lib/kubelet/plugins/kubernetes.io/flexvolume/flexvol/lvm/mounts/pv-2",
        ))
        .unwrap();
        assert_eq!(d.root, Path::new("/opt/rke/var/lib/kubelet"));
        assert_eq!((d.plugin.as_str(), d.pod_uid), ("flexvol/lvm", None));
        for no in [
            "/var/lib/kubelet/pods/u/volumes/kubernetes.io~empty-dir/x/y",
            "/var/lib/kubelet/pods/u/volumes/nodriver/x",
            "/var/lib/kubelet/pods/u/volumes/~hostpath/x",
            "/srv/data",
            "/",
        ] {
            assert_eq!(parse_kubelet_dir(Path::new(no)), None, "{no}");
        }
    }

    #[test]
    fn an_empty_live_pod_list_is_refused() {
        let d = tempfile::tempdir().unwrap();
        let f = d.path().join("live");
        std::fs::write(&f, " \n").unwrap();
        assert!(read_live_pods(&f).unwrap_err().contains("lists no pod"));
        std::fs::write(&f, "a b\nc\n").unwrap();
        assert_eq!(read_live_pods(&f).unwrap().len(), 3);
    }

    #[test]
    fn pod_gone_only_on_evidence() {
        let d = tempfile::tempdir().unwrap();
        let root = d.path().join("kubelet");
        std::fs::create_dir_all(root.join("pods/alive")).unwrap();
        let k = |uid: &str| {
            parse_kubelet_dir(&root.join(format!("pods/{uid}/volumes/flexvol~hostpath/v"))).unwrap()
        };
        assert_eq!(pod_state(Some(&k("alive")), None, None), PodState::Alive);
        assert!(matches!(
            pod_state(Some(&k("gone")), None, None),
            PodState::Gone(_)
        ));
        let live = BTreeSet::from(["other".to_owned()]);
        assert!(matches!(
            pod_state(Some(&k("alive")), None, Some(&live)),
            PodState::Gone(r) if r.contains("--live-pods")
        ));
        assert_eq!(pod_state(None, None, Some(&live)), PodState::NotAPod);
    }
}
