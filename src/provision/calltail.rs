//! The driver's call outcomes as metrics: the driver is exec'd by kubelet per call and serves
//! nothing, so the provisioner (one per node) follows the call log the driver appends to
//! ([`crate::node::calllog`], the config's `logFile`) and counts each record in
//! [`crate::provision::telemetry::DriverCalls`].
//!
//! Contract ([`Tail::poll`], every [`EVERY`] on a thread of its own):
//! - incremental: it remembers the file's `(dev, ino)` and the offset read up to; the first poll
//!   starts at the end (calls before this process started are not counted: a restarted
//!   provisioner's counters restart at zero, as Prometheus expects of a counter);
//! - rotation ([`crate::node::calllog`] renames the file to `<file>.1`): when the name holds
//!   another inode, the rest of the old one is read from `<file>.1` (only if that is the very
//!   inode followed), then the new file from its start; a file shorter than the offset (truncated
//!   by hand) is read from its start;
//! - safe and bounded: the file is opened through [`crate::sys::dirfd`] (no symlink anywhere, a
//!   regular file only, never a FIFO or a device), read with `pread` at most [`MAX_READ`] bytes a
//!   poll; only whole lines are consumed (a line being appended is read next time), and a line
//!   longer than [`MAX_LINE`] is skipped and counted as unreadable. The file is root's, but a
//!   bound costs nothing.

use crate::provision::telemetry::DriverCalls;
use crate::sys::dirfd;
use serde::Deserialize;
use std::ffi::OsString;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// How often the log is read.
pub(crate) const EVERY: Duration = Duration::from_secs(10);
/// The most read in one poll (the rest is read at the next).
pub(crate) const MAX_READ: usize = 4 << 20;
/// The longest line counted (a record is well under 64 KiB: its arguments are redacted options).
pub(crate) const MAX_LINE: usize = 256 << 10;

/// The fields of a call record that are counted.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Record {
    backend: String,
    verb: String,
    reply: Status,
    duration_ms: f64,
}

#[derive(Deserialize)]
struct Status {
    status: String,
}

/// Why the call log cannot be read this poll (the next poll tries again).
#[derive(Debug, thiserror::Error)]
pub(crate) enum TailError {
    /// The configured log path has no directory or no file name.
    #[error("{}: not a file path", .0.display())]
    NotAFilePath(PathBuf),
    /// The log (or its directory) cannot be opened or examined.
    #[error("{}: {source}", path.display())]
    Unreadable {
        /// The path that failed.
        path: PathBuf,
        /// Why.
        source: dirfd::SafeError,
    },
    /// The log was there a moment ago and is not now.
    #[error("the log vanished")]
    Vanished,
}

/// A follower of one call log.
#[derive(Debug)]
pub(crate) struct Tail {
    path: PathBuf,
    /// The inode followed and the offset read up to (`None` before the first poll).
    at: Option<((u64, u64), u64)>,
}

impl Tail {
    /// Follows the log at `path` (absolute, as the config's `logFile`).
    pub(crate) fn new(path: PathBuf) -> Self {
        Self { path, at: None }
    }

    /// The log followed.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    fn dir_and_name(&self) -> Option<(PathBuf, OsString)> {
        Some((
            self.path.parent()?.to_path_buf(),
            self.path.file_name()?.to_os_string(),
        ))
    }

    /// Reads what was appended since the last poll and counts it in `m`. `Err` says why the log
    /// could not be read (a missing log is no error: nothing was called yet, or logging is off).
    pub(crate) fn poll(&mut self, m: &DriverCalls) -> Result<(), TailError> {
        let Some((dir, name)) = self.dir_and_name() else {
            return Err(TailError::NotAFilePath(self.path.clone()));
        };
        let unreadable = |path: &Path, e: dirfd::SafeError| TailError::Unreadable {
            path: path.to_path_buf(),
            source: e,
        };
        let dirfd = match dirfd::open_dir(&dir) {
            Ok(d) => d,
            Err(nix::Error::ENOENT) => return Ok(()),
            Err(e) => return Err(unreadable(&dir, e.into())),
        };
        let current = match dirfd::open_regular(&dirfd, name.as_os_str(), None) {
            Ok(fd) => Some(fd),
            Err(dirfd::SafeError::Sys(nix::Error::ENOENT)) => None,
            Err(e) => return Err(unreadable(&self.path, e)),
        };
        let id_size = |fd: &OwnedFd| {
            dirfd::stat(fd).map(|s| {
                (
                    (s.st_dev, s.st_ino),
                    u64::try_from(s.st_size).unwrap_or_default(),
                )
            })
        };
        let cur = match &current {
            Some(fd) => Some(id_size(fd).map_err(|e| unreadable(&self.path, e.into()))?),
            None => None,
        };
        let mut budget = MAX_READ;
        match (self.at, cur) {
            // The first poll: from the end; or, with no log yet, the log to come from its start
            // (an inode no file has: the next poll takes it as rotated, and `.1` is not read).
            (None, c) => self.at = Some(c.unwrap_or(((0, 0), 0))),
            (Some(_), None) => {}
            (Some((id, off)), Some((cid, size))) if id == cid => {
                let off = if size < off { 0 } else { off };
                let fd = current.as_ref().ok_or(TailError::Vanished)?;
                let off = read_lines(fd, off, size, &mut budget, m);
                self.at = Some((id, off));
            }
            (Some((id, off)), Some((cid, size))) => {
                // Rotated: the rest of the old file first, if it is still there as `<file>.1`.
                let mut old = name.clone();
                old.push(".1");
                if let Ok(fd) = dirfd::open_regular(&dirfd, old.as_os_str(), Some(id))
                    && let Ok((_, old_size)) = id_size(&fd)
                    && old_size > off
                {
                    // Whatever the budget leaves of the old file is not read (counted as lost).
                    let end = read_lines(&fd, off, old_size, &mut budget, m);
                    if end < old_size {
                        m.unreadable();
                    }
                }
                let fd = current.as_ref().ok_or(TailError::Vanished)?;
                let off = read_lines(fd, 0, size, &mut budget, m);
                self.at = Some((cid, off));
            }
        }
        Ok(())
    }
}

/// Reads whole lines of `fd` from `off` to at most `end` within `budget`, counting each; returns
/// the offset after the last whole line consumed.
fn read_lines(fd: &OwnedFd, mut off: u64, end: u64, budget: &mut usize, m: &DriverCalls) -> u64 {
    let mut buf = vec![0u8; (*budget).clamp(1, 1 << 20)];
    let mut pending: Vec<u8> = Vec::new();
    loop {
        let pos = off + u64::try_from(pending.len()).unwrap_or_default();
        if pos >= end || *budget == 0 {
            break;
        }
        let want = usize::try_from(end - pos)
            .unwrap_or(usize::MAX)
            .min(buf.len())
            .min(*budget);
        let Some(chunk) = buf.get_mut(..want) else {
            break;
        };
        let Ok(at) = i64::try_from(pos) else {
            break;
        };
        let n = match nix::sys::uio::pread(fd, chunk, at) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        *budget -= n;
        pending.extend_from_slice(chunk.get(..n).unwrap_or_default());
        // Consume the whole lines read so far.
        while let Some(nl) = pending.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = pending.drain(..=nl).collect();
            off += u64::try_from(line.len()).unwrap_or_default();
            count(line.get(..line.len() - 1).unwrap_or_default(), m);
        }
        if pending.len() > MAX_LINE {
            // A line longer than any record: skipped up to what was read, counted once.
            off += u64::try_from(pending.len()).unwrap_or_default();
            pending.clear();
            m.unreadable();
        }
    }
    off
}

/// Counts one line (without its newline).
fn count(line: &[u8], m: &DriverCalls) {
    if line.iter().all(u8::is_ascii_whitespace) {
        return;
    }
    match serde_json::from_slice::<Record>(line) {
        Ok(r) => m.observe(&r.backend, &r.verb, &r.reply.status, r.duration_ms / 1000.0),
        Err(_) => m.unreadable(),
    }
}

/// Follows the config's call log on a thread of its own until the process ends: every
/// [`EVERY`], the config is read again (its `logFile` may change), and the log polled. A failure
/// is logged once until it changes.
pub(crate) fn spawn(m: DriverCalls) -> std::io::Result<()> {
    std::thread::Builder::new()
        .name("flexvol-calllog".into())
        .spawn(move || {
            let mut tail: Option<Tail> = None;
            let mut said = String::new();
            loop {
                let path = crate::node::config::Config::load()
                    .ok()
                    .and_then(|c| c.log_path().map(Path::to_path_buf));
                if tail.as_ref().map(Tail::path) != path.as_deref() {
                    tail = path.map(Tail::new);
                }
                if let Some(t) = tail.as_mut() {
                    match t.poll(&m) {
                        Ok(()) => said.clear(),
                        Err(e) if e.to_string() != said => {
                            tracing::warn!(target: crate::provision::telemetry::LOG_TARGET, "call log: {e}; flexvol_driver_calls_total is not counted until it can be read");
                            said = e.to_string();
                        }
                        Err(_) => {}
                    }
                }
                std::thread::sleep(EVERY);
            }
        })
        .map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    /// A path with no file name, or under a file, is an error of its kind (a missing directory
    /// is none: nothing was logged yet).
    #[test]
    fn unreadable_paths_are_errors_of_their_kind() {
        let m = DriverCalls::default();
        let e = Tail::new(PathBuf::from("/")).poll(&m).unwrap_err();
        assert!(matches!(e, TailError::NotAFilePath(_)), "{e:?}");
        let d = tempfile::tempdir().unwrap();
        let file = d.path().join("file");
        std::fs::write(&file, "").unwrap();
        let e = Tail::new(file.join("calls.log")).poll(&m).unwrap_err();
        assert!(
            matches!(&e, TailError::Unreadable { path, .. } if *path == file),
            "{e:?}"
        );
        assert!(
            e.to_string().starts_with(&format!("{}: ", file.display())),
            "{e}"
        );
        Tail::new(d.path().join("none/calls.log")).poll(&m).unwrap();
    }

    fn line(backend: &str, verb: &str, status: &str, ms: f64) -> String {
        format!(
            "{{\"time\":\"t\",\"pid\":1,\"backend\":\"{backend}\",\"verb\":\"{verb}\",\"args\":[],\"reply\":{{\"status\":\"{status}\"}},\"durationMs\":{ms}}}\n"
        )
    }

    fn append(p: &Path, s: &str) {
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(p)
            .unwrap();
        f.write_all(s.as_bytes()).unwrap();
    }

    fn value(m: &DriverCalls, series: &str) -> f64 {
        let mut r = prometheus_client::registry::Registry::default();
        m.clone().register_into(&mut r);
        let mut t = String::new();
        prometheus_client::encoding::text::encode(&mut t, &r).unwrap();
        t.lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
            .unwrap_or_else(|| panic!("no {series} in\n{t}"))
            .parse()
            .unwrap()
    }

    const MOUNT_OK: &str =
        r#"flexvol_driver_calls_total{driver="hostpath",verb="mount",outcome="success"}"#;
    const MOUNT_FAIL: &str =
        r#"flexvol_driver_calls_total{driver="nfs",verb="mount",outcome="failure"}"#;

    /// From the end at the first poll; then every appended whole line once; a half-written line
    /// waits for its newline; junk and unknown drivers are unreadable, an unknown verb `other`.
    #[test]
    fn counts_appended_lines_once() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("flexvol.log");
        append(&p, &line("hostpath", "mount", "Success", 3.0));
        let m = DriverCalls::default();
        let mut t = Tail::new(p.clone());
        t.poll(&m).unwrap();
        assert_eq!(value(&m, MOUNT_OK), 0.0, "history is not counted");
        append(&p, &line("hostpath", "mount", "Success", 3.0));
        append(&p, &line("nfs", "mount", "Failure", 1500.0));
        let half = line("hostpath", "mount", "Success", 1.0);
        append(&p, &half[..20]);
        t.poll(&m).unwrap();
        t.poll(&m).unwrap();
        assert_eq!(value(&m, MOUNT_OK), 1.0);
        assert_eq!(value(&m, MOUNT_FAIL), 1.0);
        append(&p, &half[20..]);
        append(&p, "not json\n");
        append(&p, &line("ceph", "mount", "Success", 1.0));
        append(&p, &line("lvm", "frobnicate", "Not supported", 1.0));
        t.poll(&m).unwrap();
        assert_eq!(value(&m, MOUNT_OK), 2.0);
        assert_eq!(
            value(
                &m,
                r#"flexvol_driver_calls_total{driver="lvm",verb="other",outcome="not_supported"}"#
            ),
            1.0
        );
        assert_eq!(
            value(&m, "flexvol_driver_call_log_unreadable_lines_total"),
            2.0
        );
        assert_eq!(
            value(
                &m,
                r#"flexvol_driver_call_duration_seconds_count{driver="nfs",verb="mount"}"#
            ),
            1.0
        );
        assert_eq!(
            value(
                &m,
                r#"flexvol_driver_call_duration_seconds_sum{driver="nfs",verb="mount"}"#
            ),
            1.5
        );
    }

    /// Across a rotation (rename to `<file>.1`, a new file), the old file's rest and the new
    /// file's lines are each counted once; a truncated file is read from its start.
    #[test]
    fn follows_across_rotation_and_truncation() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("flexvol.log");
        append(&p, "");
        let m = DriverCalls::default();
        let mut t = Tail::new(p.clone());
        t.poll(&m).unwrap();
        append(&p, &line("hostpath", "mount", "Success", 1.0));
        t.poll(&m).unwrap();
        append(&p, &line("hostpath", "mount", "Success", 1.0));
        std::fs::rename(&p, d.path().join("flexvol.log.1")).unwrap();
        append(&p, &line("hostpath", "mount", "Success", 1.0));
        append(&p, &line("hostpath", "mount", "Success", 1.0));
        t.poll(&m).unwrap();
        assert_eq!(value(&m, MOUNT_OK), 4.0);
        t.poll(&m).unwrap();
        assert_eq!(value(&m, MOUNT_OK), 4.0, "nothing twice");
        std::fs::write(&p, line("hostpath", "mount", "Success", 1.0)).unwrap();
        t.poll(&m).unwrap();
        assert_eq!(value(&m, MOUNT_OK), 5.0, "a truncated file from its start");
    }

    /// With the driver's own writer rotating at a small bound, and a poll after every few calls
    /// (fewer than one file's worth), every call is counted exactly once.
    #[test]
    fn counts_every_call_across_the_writers_rotations() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("flexvol.log");
        let m = DriverCalls::default();
        let mut t = Tail::new(p.clone());
        t.poll(&m).unwrap();
        let l = line("hostpath", "mount", "Success", 1.0);
        let max = u64::try_from(l.len() * 10).unwrap();
        for i in 0..100 {
            crate::node::calllog::append(&p, l.as_bytes(), max);
            if i % 7 == 0 {
                t.poll(&m).unwrap();
            }
        }
        t.poll(&m).unwrap();
        assert!(
            crate::node::calllog::rotated_path(&p).exists(),
            "it rotated"
        );
        assert_eq!(value(&m, MOUNT_OK), 100.0);
    }

    /// A symlink at the log's name is not followed (the dirfd layer's rule), and a FIFO is never
    /// opened: each is an error, never a hang or a read of another file.
    #[test]
    fn never_follows_a_symlink_or_opens_a_fifo() {
        let d = tempfile::tempdir().unwrap();
        let other = d.path().join("other");
        std::fs::write(&other, line("hostpath", "mount", "Success", 1.0)).unwrap();
        let p = d.path().join("flexvol.log");
        std::os::unix::fs::symlink(&other, &p).unwrap();
        let m = DriverCalls::default();
        let mut t = Tail::new(p.clone());
        assert!(t.poll(&m).is_err());
        std::fs::remove_file(&p).unwrap();
        nix::unistd::mkfifo(&p, nix::sys::stat::Mode::S_IRWXU).unwrap();
        let e = t.poll(&m).unwrap_err();
        assert!(
            matches!(&e, TailError::Unreadable { path, .. } if *path == p),
            "{e:?}"
        );
        assert!(e.to_string().contains("FIFO"), "{e}");
    }

    /// A line longer than MAX_LINE is skipped (counted unreadable), and the lines after it count.
    #[test]
    fn an_overlong_line_is_skipped() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("flexvol.log");
        append(&p, "");
        let m = DriverCalls::default();
        let mut t = Tail::new(p.clone());
        t.poll(&m).unwrap();
        append(&p, &"x".repeat(MAX_LINE + 10));
        append(&p, "\n");
        append(&p, &line("hostpath", "mount", "Success", 1.0));
        t.poll(&m).unwrap();
        t.poll(&m).unwrap();
        assert_eq!(value(&m, MOUNT_OK), 1.0);
        assert!(value(&m, "flexvol_driver_call_log_unreadable_lines_total") >= 1.0);
    }
}
