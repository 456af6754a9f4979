//! Durable per-volume records, kept outside the plugin directory (kubelet watches that directory
//! and re-runs `init` on every write in it).
//!
//! `unmount` and `unmountdevice` get no options, and after a kubelet restart the volume spec is
//! rebuilt without any. So a record of what was mounted where is written *before* the mount
//! (intent) and removed only after a successful unmount: a crash at any point leaves either a record
//! of a mount that may exist, or nothing mounted. Records are written atomically (temp file, then
//! rename), so a reader never sees half a record.
//!
//! Records are deliberately not fsynced. They describe mounts, and mounts do not survive a node
//! crash either; a killed process loses nothing the page cache holds. An fsync would cost every
//! mount and unmount a disk flush and protect nothing.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};

/// Record files are named by [`file_key`] of their target (shared with the lock files).
pub use crate::sys::names::file_key;

/// What flexvol mounted for one target directory.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VolumeRecord {
    /// Backend name.
    pub backend: String,
    /// The verb that made the mount (`mount` or `mountdevice`).
    pub(crate) verb: String,
    /// The directory kubelet named.
    pub(crate) target: PathBuf,
    /// Where the mount actually is, when not the target itself (a file inside it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mount_point: Option<PathBuf>,
    /// What is mounted: a host path, `server:/share` or a device.
    pub source: String,
    /// Mounted read-only.
    pub(crate) read_only: bool,
    /// `kubernetes.io/pvOrVolumeName`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume: Option<String>,
    /// `namespace/name` of the pod, for `mount`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) pod: Option<String>,
    /// Pod UID, for `mount`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) pod_uid: Option<String>,
    /// Seconds since the epoch when the record was written.
    pub(crate) since: u64,
    /// Backend specifics (fs type, VG/LV, mount options...). Never secrets.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub(crate) extra: BTreeMap<String, String>,
}

impl VolumeRecord {
    /// Where to look in mountinfo for this record's mount.
    pub fn mount_point(&self) -> &Path {
        self.mount_point.as_deref().unwrap_or(&self.target)
    }

    /// Checks the record against its own target before anyone acts on it: a mount point other
    /// than the target must be a single plain name directly inside it (`<target>/<name>`, no
    /// `.`, `..` or separators). A record that says otherwise was not written by flexvol, and
    /// unmounting or deleting what it names could hit anything on the node.
    pub(crate) fn check(&self) -> Result<(), String> {
        let Some(mp) = &self.mount_point else {
            return Ok(());
        };
        let name = mp
            .file_name()
            .filter(|n| !n.is_empty() && *n != "." && *n != "..");
        match name {
            Some(n) if self.target.join(n).as_os_str() == mp.as_os_str() => Ok(()),
            _ => Err(format!(
                "its mount point {} is not a file directly inside its target {}",
                mp.display(),
                self.target.display()
            )),
        }
    }
}

/// Why state could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    /// Filesystem error on a state file.
    #[error("cannot {what} state file {path}: {source}")]
    Io {
        what: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    /// A state file that does not parse (or belongs to another path).
    #[error(
        "state file {path} is corrupt ({reason}); inspect it, then remove it if the volume is not mounted"
    )]
    Corrupt { path: PathBuf, reason: String },
}

/// The records of one backend: `<stateDir>/<backend>/<key>.json`.
#[derive(Debug, Clone)]
pub(crate) struct StateStore {
    dir: PathBuf,
}

impl StateStore {
    /// The store for `backend` under `state_dir`.
    pub fn new(state_dir: &Path, backend: &str) -> Self {
        Self {
            dir: state_dir.join(backend),
        }
    }

    fn file(&self, target: &Path) -> PathBuf {
        self.dir
            .join(format!("{}.json", file_key(&target.to_string_lossy())))
    }

    /// Writes the record for `rec.target`, atomically.
    pub(crate) fn save(&self, rec: &VolumeRecord) -> Result<(), StateError> {
        let path = self.file(&rec.target);
        let io = |what, source| StateError::Io {
            what,
            path: path.clone(),
            source,
        };
        let tmp = self.dir.join(format!(
            ".{}.tmp.{}",
            path.file_name()
                .map(|n| n.to_string_lossy())
                .unwrap_or_default(),
            std::process::id()
        ));
        let data = serde_json::to_vec(rec).map_err(|e| StateError::Corrupt {
            path: path.clone(),
            reason: e.to_string(),
        })?;
        // The directory exists after the first record on a node: create it only when missing.
        let mut f = match File::create(&tmp) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                fs::create_dir_all(&self.dir).map_err(|e| io("create the directory of", e))?;
                File::create(&tmp)
            }
            other => other,
        }
        .map_err(|e| io("create", e))?;
        f.write_all(&data).map_err(|e| io("write", e))?;
        fs::rename(&tmp, &path).map_err(|e| io("rename into place", e))
    }

    /// The record for `target`, if any.
    pub(crate) fn load(&self, target: &Path) -> Result<Option<VolumeRecord>, StateError> {
        let path = self.file(target);
        // Read through `take`, so std does not fstat for a size hint: open, two reads, close.
        let read = |p: &Path| {
            let mut d = Vec::with_capacity(1024);
            std::io::Read::read_to_end(
                &mut std::io::Read::take(fs::File::open(p)?, u64::MAX),
                &mut d,
            )
            .map(|_| d)
        };
        let data = match read(&path) {
            Ok(d) => d,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(source) => {
                return Err(StateError::Io {
                    what: "read",
                    path,
                    source,
                });
            }
        };
        let rec: VolumeRecord = serde_json::from_slice(&data).map_err(|e| StateError::Corrupt {
            path: path.clone(),
            reason: e.to_string(),
        })?;
        if rec.target != target {
            return Err(StateError::Corrupt {
                path,
                reason: format!("it is for {}", rec.target.display()),
            });
        }
        rec.check()
            .map_err(|reason| StateError::Corrupt { path, reason })?;
        Ok(Some(rec))
    }

    /// Removes the record for `target`; absent is fine.
    pub(crate) fn remove(&self, target: &Path) -> Result<(), StateError> {
        let path = self.file(target);
        match fs::remove_file(&path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(source) => Err(StateError::Io {
                what: "remove",
                path,
                source,
            }),
        }
    }

    /// Every record, with the file it came from; unreadable files are returned as errors.
    pub(crate) fn list(&self) -> Vec<(PathBuf, Result<VolumeRecord, StateError>)> {
        let Ok(rd) = fs::read_dir(&self.dir) else {
            return Vec::new();
        };
        let mut out: Vec<_> = rd
            .filter_map(Result::ok)
            .map(|e| e.path())
            .filter(|p| {
                p.extension().is_some_and(|x| x == "json")
                    && !p
                        .file_name()
                        .is_some_and(|n| n.to_string_lossy().starts_with('.'))
            })
            .map(|p| {
                let r = fs::read(&p)
                    .map_err(|source| StateError::Io {
                        what: "read",
                        path: p.clone(),
                        source,
                    })
                    .and_then(|d| {
                        serde_json::from_slice(&d).map_err(|e| StateError::Corrupt {
                            path: p.clone(),
                            reason: e.to_string(),
                        })
                    });
                (p, r)
            })
            .collect();
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }
}

/// Seconds since the epoch.
pub(crate) fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(target: &str) -> VolumeRecord {
        VolumeRecord {
            backend: "hostpath".into(),
            verb: "mount".into(),
            target: PathBuf::from(target),
            mount_point: None,
            source: "/srv/a".into(),
            read_only: false,
            volume: Some("v".into()),
            pod: None,
            pod_uid: None,
            since: 1,
            extra: BTreeMap::new(),
        }
    }

    #[test]
    fn save_load_list_remove() {
        let d = tempfile::tempdir().unwrap();
        let s = StateStore::new(d.path(), "hostpath");
        let t = "/var/lib/kubelet/pods/u/volumes/flexvol~hostpath/my vol";
        assert_eq!(s.load(Path::new(t)).unwrap(), None);
        s.save(&rec(t)).unwrap();
        assert_eq!(s.load(Path::new(t)).unwrap(), Some(rec(t)));
        assert_eq!(s.list().len(), 1);
        s.remove(Path::new(t)).unwrap();
        s.remove(Path::new(t)).unwrap();
        assert!(s.list().is_empty());
    }

    #[test]
    fn records_whose_mount_point_leaves_their_target_are_corrupt() {
        let d = tempfile::tempdir().unwrap();
        let s = StateStore::new(d.path(), "hostpath");
        let t = "/k/pods/u/volumes/flexvol~hostpath/v";
        let mut r = rec(t);
        r.mount_point = Some(PathBuf::from(format!("{t}/app.sock")));
        s.save(&r).unwrap();
        assert_eq!(s.load(Path::new(t)).unwrap(), Some(r.clone()));
        for bad in [
            "/srv/data/file".to_owned(),
            format!("{t}/../other"),
            format!("{t}/a/b"),
            format!("{t}/."),
            format!("{t}/"),
            t.to_owned(),
            "/k/pods/u/volumes/flexvol~hostpath".to_owned(),
        ] {
            r.mount_point = Some(PathBuf::from(&bad));
            s.save(&r).unwrap();
            assert!(
                matches!(s.load(Path::new(t)), Err(StateError::Corrupt { .. })),
                "{bad} must be refused"
            );
        }
    }
}
