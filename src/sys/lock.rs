//! Per-volume locks: `flock` on a file under the run directory (a tmpfs, outside the plugin
//! directory so kubelet's watcher never sees it).
//!
//! kubelet may run two verbs on one volume at once (mounts of different pods, `isattached` at any
//! time, kubelet and kube-controller-manager side by side), so every mutating section holds the
//! volume's lock. flock is released by the kernel when the process dies, so a crashed call never
//! leaves a volume wedged. Waiting is bounded: past the deadline the call fails clearly instead of
//! queueing forever behind a hung holder.

use std::fs::{File, OpenOptions, TryLockError};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// A held lock; released on drop.
#[derive(Debug)]
pub struct VolumeLock {
    _file: File,
    path: PathBuf,
}

/// Why a lock could not be taken.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    /// The lock file could not be created or opened.
    #[error("cannot open lock file {path}: {source}")]
    Open {
        path: PathBuf,
        source: std::io::Error,
    },
    /// Another call held the lock for the whole wait.
    #[error(
        "another flexvol call has held the lock on {key} for more than {secs}s (lock file {path}); it may be hung: check `flexvol status` and the log, or wait and retry"
    )]
    Timeout {
        key: String,
        path: PathBuf,
        secs: u64,
    },
}

impl VolumeLock {
    /// Takes the lock named `key` under `dir`, waiting up to `wait`.
    pub fn acquire(dir: &Path, key: &str, wait: Duration) -> Result<Self, LockError> {
        let path = dir.join(format!("{}.lock", super::names::file_key(key)));
        let open_err = |source| LockError::Open {
            path: path.clone(),
            source,
        };
        let open = || {
            OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .open(&path)
        };
        // The directory exists after the first call on a node: create it only when missing.
        let file = match open() {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                std::fs::create_dir_all(dir).map_err(open_err)?;
                open()
            }
            other => other,
        }
        .map_err(open_err)?;
        let start = Instant::now();
        let mut pause = Duration::from_millis(1);
        loop {
            match file.try_lock() {
                Ok(()) => return Ok(Self { _file: file, path }),
                Err(TryLockError::WouldBlock) => {}
                Err(TryLockError::Error(e)) => return Err(open_err(e)),
            }
            if start.elapsed() >= wait {
                return Err(LockError::Timeout {
                    key: key.into(),
                    path,
                    secs: wait.as_secs(),
                });
            }
            std::thread::sleep(pause.min(wait.saturating_sub(start.elapsed())));
            pause = (pause * 2).min(Duration::from_millis(50));
        }
    }

    /// The lock file, for logs.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn second_holder_waits_then_times_out_and_succeeds_after_release() {
        let dir = tempfile::tempdir().unwrap();
        let first =
            VolumeLock::acquire(dir.path(), "/pods/a b/vol", Duration::from_secs(1)).unwrap();
        let t = Instant::now();
        let err = VolumeLock::acquire(dir.path(), "/pods/a b/vol", Duration::from_millis(200))
            .unwrap_err();
        assert!(matches!(err, LockError::Timeout { .. }));
        assert!(t.elapsed() >= Duration::from_millis(200));
        // A different key is independent.
        VolumeLock::acquire(dir.path(), "/pods/other", Duration::ZERO).unwrap();
        drop(first);
        VolumeLock::acquire(dir.path(), "/pods/a b/vol", Duration::ZERO).unwrap();
    }
}
