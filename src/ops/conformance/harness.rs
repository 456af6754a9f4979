//! The exec harness: one call of the judged driver as kubelet makes it, kubelet's "Not supported"
//! cache, the record of every check, and kubelet's own filesystem steps around calls.
//!
//! Every call goes through `SystemRunner::run_combined` (the `sys::exec` seam): the driver's full
//! path as argv[0], stdin `/dev/null`, kubelet's environment (ours), stdout and stderr merged into
//! one pipe read to end of file, and the per-call timeout (kubelet has none for most verbs; a run
//! that would hang kubelet is reported instead). Every mount and unmount the runner makes itself
//! (kubelet's default bind when a verb is "Not supported", the final cleanup) goes through
//! `SysMounter` (the `sys::mount` seam).

use super::{Check, Verdict};
use crate::protocol::gojson::{GoStatus, decode_like_go};
use crate::protocol::verb::Call;
use crate::sys::exec::{Cmd, ExecError, SystemRunner};
use crate::sys::mountinfo::MountTable;
use std::collections::{BTreeMap, HashSet};
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// One exec's result.
pub(super) struct Exec {
    /// stdout and stderr as kubelet reads them.
    pub(crate) output: Vec<u8>,
    /// Exit code (`None`: did not run, timed out or was killed by a signal).
    pub(crate) code: Option<i32>,
    /// Wall time of the call.
    pub(crate) elapsed: Duration,
    /// The reply decoded by Go's rules, or the error kubelet would report.
    pub(crate) decoded: Result<GoStatus, String>,
}

/// What a call came to, from kubelet's point of view.
pub(super) enum Outcome {
    /// Success, with the decoded reply.
    Success(GoStatus),
    /// "Not supported" (now cached): kubelet uses its default.
    NotSupported,
    /// Anything else: the error kubelet would report.
    Error(String),
}

/// The driver under judgement and what has been found about it so far.
pub(super) struct Driver {
    /// `vendor/name`.
    pub name: String,
    /// `<plugin-dir>/<vendor>~<name>/<name>`.
    pub(crate) path: PathBuf,
    /// Verbs answered "Not supported" (kubelet's cache).
    pub(crate) unsupported: HashSet<String>,
    /// Per-call timeout.
    pub(crate) timeout: Duration,
    /// Checks recorded so far.
    pub(crate) checks: Vec<Check>,
    /// Calls made.
    pub(crate) calls: usize,
    /// Calls whose exit code disagreed with their status: Success or Not supported with a non-zero
    /// exit (kubelet takes it as an error). A Failure may exit with any status: kubelet returns the
    /// same error, and logs the argv only after a non-zero one (docs/protocol.md §1.2).
    pub(crate) disagreements: Vec<String>,
}

impl Driver {
    /// A driver with nothing recorded yet.
    pub fn new(name: &str, path: PathBuf, timeout: Duration) -> Self {
        Self {
            name: name.into(),
            path,
            unsupported: HashSet::new(),
            timeout,
            checks: Vec::new(),
            calls: 0,
            disagreements: Vec::new(),
        }
    }

    /// A copy for another thread: same cache, empty record.
    pub(crate) fn fork(&self) -> Self {
        let mut d = Self::new(&self.name, self.path.clone(), self.timeout);
        d.unsupported = self.unsupported.clone();
        d
    }

    /// Records a check that was run; returns `ok`.
    pub(crate) fn check(&mut self, name: &str, ok: bool, detail: impl Into<String>) -> bool {
        self.record(name, if ok { Verdict::Pass } else { Verdict::Fail }, detail);
        ok
    }

    /// Records a check that was not run, and why.
    pub(crate) fn skip(&mut self, name: &str, why: impl Into<String>) {
        self.record(name, Verdict::Skip, why);
    }

    fn record(&mut self, name: &str, verdict: Verdict, detail: impl Into<String>) {
        self.checks.push(Check {
            driver: self.name.clone(),
            name: name.into(),
            verdict,
            detail: detail.into(),
        });
    }

    /// Runs the driver once, as kubelet would, and notes whether exit code and status agree.
    pub(crate) fn exec(&mut self, args: &[String]) -> Exec {
        self.calls += 1;
        let start = Instant::now();
        let cmd = Cmd::new(&self.path.to_string_lossy())
            .args(args)
            .timeout(self.timeout);
        let run = SystemRunner::default().run_combined(&cmd);
        let elapsed = start.elapsed();
        let out = match run {
            Ok(o) => o,
            Err(ExecError::TimedOut { secs, .. }) => {
                return Exec {
                    output: Vec::new(),
                    code: None,
                    elapsed,
                    decoded: Err(format!(
                        "no end of output within {secs}s (the driver, or a helper it left holding stdout/stderr, kept the pipe open; kubelet would wait forever)"
                    )),
                };
            }
            Err(e) => {
                return Exec {
                    output: Vec::new(),
                    code: None,
                    elapsed,
                    decoded: Err(format!(
                        "exec failed ({e}); kubelet reports: unexpected end of JSON input"
                    )),
                };
            }
        };
        let decoded = decode_like_go(&out.output);
        if let Ok(st) = &decoded {
            let agrees = match st.status.as_str() {
                "Success" | "Not supported" => out.code == Some(0),
                _ => out.code.is_some(),
            };
            if !agrees {
                self.disagreements.push(format!(
                    "{} -> status {:?} with exit {:?}",
                    args.join(" "),
                    st.status,
                    out.code
                ));
            }
        }
        Exec {
            output: out.output,
            code: out.code,
            elapsed,
            decoded,
        }
    }

    /// A call with kubelet's "Not supported" cache in front of it; its argv is the grammar's
    /// ([`Call::to_argv`]).
    pub(crate) fn call(&mut self, call: &Call) -> Outcome {
        self.call_full(call).0
    }

    /// [`Self::call`], with the exit code and the decoded reply (both `None` when the cache
    /// answered; the reply `None` also when it could not be decoded).
    pub(crate) fn call_full(&mut self, call: &Call) -> (Outcome, Option<i32>, Option<GoStatus>) {
        let verb = call.verb().to_owned();
        if self.unsupported.contains(&verb) {
            return (Outcome::NotSupported, None, None);
        }
        let e = self.exec(&call.to_argv());
        let reply = e.decoded.as_ref().ok().cloned();
        let outcome = match e.decoded {
            Err(msg) => Outcome::Error(msg),
            Ok(st) if st.status == "Success" => Outcome::Success(st),
            Ok(st) if st.status == "Not supported" => {
                self.unsupported.insert(verb);
                Outcome::NotSupported
            }
            Ok(st) => Outcome::Error(format!(
                "{verb} command failed, status: {}, reason: {}",
                st.status, st.message
            )),
        };
        (outcome, e.code, reply)
    }
}

/// A path as the text of an argv word (kubelet's paths are UTF-8).
pub(super) fn text(p: &Path) -> String {
    p.to_string_lossy().into_owned()
}

/// kubelet's `IsLikelyNotMountPoint`: a directory whose device differs from its parent's.
pub(super) fn likely_mount_point(p: &Path) -> bool {
    match (std::fs::metadata(p), p.parent().map(std::fs::metadata)) {
        (Ok(a), Some(Ok(b))) => a.dev() != b.dev(),
        _ => false,
    }
}

/// How many mounts are at `p` or directly inside it (file-like volumes), by mountinfo.
pub(super) fn mounted_at_or_in(p: &Path) -> usize {
    MountTable::read()
        .map(|t| {
            t.entries
                .iter()
                .filter(|e| e.mount_point == p || e.mount_point.parent() == Some(p))
                .count()
        })
        .unwrap_or(0)
}

/// How many mounts are at or below `root`, by mountinfo (`usize::MAX` when unreadable).
pub(super) fn mounts_under(root: &Path) -> usize {
    MountTable::read()
        .map(|t| {
            t.entries
                .iter()
                .filter(|e| e.mount_point.starts_with(root))
                .count()
        })
        .unwrap_or(usize::MAX)
}

/// kubelet's `MkdirAll(dir, 0750)` before a mount call.
pub(super) fn mkdir_0750(p: &Path) -> std::io::Result<()> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o750)
        .create(p)
}

/// The options every call gets, as kubelet's `NewOptionsForDriver` builds them: its own keys
/// first, the user's options last (they override).
pub(super) fn base_options(
    fs_type: &str,
    volume_name: &str,
    user: &BTreeMap<String, String>,
) -> BTreeMap<String, String> {
    let mut m = BTreeMap::new();
    m.insert("kubernetes.io/fsType".to_string(), fs_type.to_string());
    m.insert(
        "kubernetes.io/pvOrVolumeName".to_string(),
        volume_name.to_string(),
    );
    m.insert("kubernetes.io/readwrite".to_string(), "rw".to_string());
    m.extend(user.clone());
    m
}

/// The options of a `mount` call: the base ones plus the pod's keys.
pub(super) fn pod_options(base: &BTreeMap<String, String>, uid: &str) -> BTreeMap<String, String> {
    let mut m = base.clone();
    for (k, v) in [
        ("kubernetes.io/pod.name", format!("conformance-{uid}")),
        ("kubernetes.io/pod.namespace", "default".to_string()),
        ("kubernetes.io/pod.uid", uid.to_string()),
        ("kubernetes.io/serviceAccount.name", "default".to_string()),
    ] {
        m.entry(k.to_string()).or_insert(v);
    }
    m
}

/// The pod volume directory kubelet would use for pod `uid`.
pub(super) fn pod_dir(
    kubelet_root: &Path,
    uid: &str,
    vendor: &str,
    name: &str,
    volume: &str,
) -> PathBuf {
    kubelet_root
        .join("pods")
        .join(uid)
        .join("volumes")
        .join(format!("{vendor}~{name}"))
        .join(volume)
}

/// The global (device) mount directory kubelet would use for `volume`.
pub(super) fn global_dir(kubelet_root: &Path, vendor: &str, name: &str, volume: &str) -> PathBuf {
    kubelet_root
        .join("plugins/kubernetes.io/flexvolume")
        .join(vendor)
        .join(name)
        .join("mounts")
        .join(volume)
}
