//! Per-volume locks: `flock` on a file under the run directory (a tmpfs, outside the plugin
//! directory so kubelet's watcher never sees it).
//!
//! kubelet may run two verbs on one volume at once (mounts of different pods, `isattached` at any
//! time, kubelet and kube-controller-manager side by side), so every mutating section holds the
//! volume's lock. flock is released by the kernel when the process dies, so a crashed call never
//! leaves a volume wedged. Waiting is bounded: past the deadline the call fails clearly instead of
//! queueing forever behind a hung holder.
//!
//! The lock files are root's alone: the directory is made 0700 and each file 0600 (an older
//! version's 0644 file is closed to others on its next use), opened without following a symlink.
//! A local user who could open a lock file could hold it with `flock -s` and make every call on
//! that volume (or, through the `vg:` lock, every LVM call) fail.

use std::fs::{File, OpenOptions, TryLockError};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// A held lock; released on drop.
#[derive(Debug)]
pub(crate) struct VolumeLock {
    _file: File,
    #[cfg_attr(not(test), allow(dead_code))]
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
    /// The lock file.
    #[cfg(test)]
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Takes the lock named `key` under `dir`, waiting up to `wait`.
    pub(crate) fn acquire(dir: &Path, key: &str, wait: Duration) -> Result<Self, LockError> {
        let path = dir.join(format!("{}.lock", super::names::file_key(key)));
        let open_err = |source| LockError::Open {
            path: path.clone(),
            source,
        };
        let open = || {
            use std::os::unix::fs::OpenOptionsExt;
            OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .mode(0o600)
                .custom_flags(nix::libc::O_NOFOLLOW)
                .open(&path)
        };
        // The directory exists after the first call on a node: create it only when missing.
        let file = match open() {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                use std::os::unix::fs::DirBuilderExt;
                std::fs::DirBuilder::new()
                    .recursive(true)
                    .mode(0o700)
                    .create(dir)
                    .map_err(open_err)?;
                open()
            }
            other => other,
        }
        .map_err(open_err)?;
        // An older version made lock files 0644: close this one to everybody else (one fstat on
        // the common path).
        let meta = file.metadata().map_err(open_err)?;
        if std::os::unix::fs::PermissionsExt::mode(&meta.permissions()) & 0o077 != 0 {
            file.set_permissions(std::os::unix::fs::PermissionsExt::from_mode(0o600))
                .map_err(open_err)?;
        }
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

    /// Issue #32, 9: lock files are root's alone. A lock file (made now, or left 0644 by an older
    /// version) is 0600 in a 0700 directory, and a local user cannot open it to hold it with
    /// `flock -s` (checked with the real `flock` run as `nobody`, when root runs the tests).
    #[test]
    #[allow(clippy::print_stderr)] // says why part of it is skipped
    fn lock_files_are_roots_alone() {
        use std::os::unix::fs::PermissionsExt;
        let d = tempfile::tempdir().unwrap();
        let dir = d.path().join("locks");
        let l = VolumeLock::acquire(&dir, "vg:vg0", Duration::ZERO).unwrap();
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o7777;
        assert_eq!(mode(&dir), 0o700);
        assert_eq!(mode(l.path()), 0o600);
        let old = dir.join(format!("{}.lock", crate::sys::names::file_key("old")));
        std::fs::write(&old, b"").unwrap();
        std::fs::set_permissions(&old, PermissionsExt::from_mode(0o644)).unwrap();
        drop(VolumeLock::acquire(&dir, "old", Duration::ZERO).unwrap());
        assert_eq!(mode(&old), 0o600, "an old 0644 lock file is closed");
        // A symlink planted as a lock file is not followed.
        let evil = dir.join(format!("{}.lock", crate::sys::names::file_key("evil")));
        std::os::unix::fs::symlink(d.path().join("elsewhere"), &evil).unwrap();
        assert!(VolumeLock::acquire(&dir, "evil", Duration::ZERO).is_err());
        assert!(!d.path().join("elsewhere").exists());
        if !nix::unistd::geteuid().is_root() {
            eprintln!("skipped: the flock-as-nobody half needs root");
            return;
        }
        // The directory 0755 as an older version left it: the file mode alone keeps them out.
        std::fs::set_permissions(&dir, PermissionsExt::from_mode(0o755)).unwrap();
        let st = std::process::Command::new("runuser")
            .args(["-u", "nobody", "--", "flock", "-s", "-n"])
            .arg(l.path())
            .arg("true")
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap();
        assert!(
            !st.status.success(),
            "nobody took a shared lock on {}: {st:?}",
            l.path().display()
        );
        assert!(
            String::from_utf8_lossy(&st.stderr).contains("Permission denied"),
            "{st:?}"
        );
    }
}
