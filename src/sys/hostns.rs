//! Running in the host's mount namespace: `flexvol provisioner --host-mount-namespace` and
//! `flexvol csi --host-mount-namespace` (which keeps nothing of the container's view: it reads
//! no token, and its sockets and binds must be where kubelet looks).
//!
//! The DaemonSet's image is the static binary alone (`FROM scratch`): it has no lvm tools, no
//! `mount.nfs`, no `mkfs`, no `xfs_quota`, and a container's mounts stay in the container. Node
//! agents that manage the node's storage commonly run in the node's own mount namespace instead
//! (TopoLVM's lvmd reaches the host's lvm through `nsenter`); [`enter`] does that for the whole
//! process, once, at start: after it, every path the process opens is the host's — the tools
//! ([`crate::sys::exec`] finds them in the config's `toolDirs`, now the host's), `/dev`, `/run/lvm`,
//! the hostPath roots, `/etc/flexvol/config.json`, `/run/flexvol` (the drivers' locks, so the
//! provisioner and kubelet's driver calls now share them) — and every mount it makes (the NFS
//! provisioner's private mount of an export) is made in the host's namespace, where kubelet and the
//! drivers see it. Only the network, PID, IPC, UTS and cgroup namespaces stay the container's.
//!
//! **What stays in the container's view.** The projected ServiceAccount volume, which kubelet
//! rewrites as the token rotates (a new `..<timestamp>` directory, then the `..data` symlink
//! swapped; `token` is a relative symlink through `..data`). [`enter`] opens each directory it is
//! asked to keep *before* it changes namespace and returns a path `/proc/self/fd/N` for it: that
//! is a magic link, which the kernel resolves to the directory the descriptor holds, in the mount
//! it was opened in, whatever namespace the process is in now; the relative symlinks below it
//! resolve inside that mount. So `/proc/self/fd/N/token` reads the token kubelet wrote last, at
//! every read. [`enter`] also keeps a descriptor of the container's mount namespace itself, so that
//! namespace (and the volume mounted in it) lives as long as the process, as it would have. Proven
//! by the `in-cluster-token` and `token-rotation` scenarios of tests/cluster/provisioner-e2e with
//! `PROVISIONER_HOSTNS=1` (the token rewritten the way kubelet's atomic writer does it).
//!
//! **Caller contract.** Call [`enter`] once, while the process has one thread (before the async
//! runtime, the metrics thread or any `std::thread::spawn`): `setns(2)` with `CLONE_NEWNS` fails
//! with `EINVAL` in a process whose threads share its filesystem context, and [`enter`] checks
//! `/proc/self/task` first and says so. Paths given on the command line and in the environment
//! (`--kubeconfig`, `FLEXVOL_CONFIG`) are read after it, so they are host paths.
//!
//! **What it needs.** The namespace entered is that of PID 1 as this process sees it: with
//! `hostPID: true`, the node's init, whose mount namespace is kubelet's. Without `hostPID`, PID 1
//! is this container's own process (the same namespace: refused, saying to set `hostPID: true`)
//! or the pod's sandbox (`shareProcessNamespace`: not the host; the log line names PID 1's
//! command so that a wrong target shows). `setns` needs `CAP_SYS_ADMIN` and `CAP_SYS_CHROOT`, and
//! the work after it needs what the tools need: block devices (the device cgroup of an
//! unprivileged container refuses `/dev/mapper/control` and the LVs), `mount(2)`, no seccomp or
//! AppArmor profile that forbids them. drivers/deploy/daemonset.yaml runs the container
//! `privileged: true` for that reason (drivers/deploy/README.md says why not fewer capabilities).
//!
//! **A flag, not a node-config key**: which config file is read (the container's or the host's)
//! depends on it, and so does whether the tools can be found at all.
//!
//! **What it trusts and allows.** The process is then root in the node's filesystem with every
//! capability, like the systemd unit it replaces: whoever controls this container's image,
//! arguments or process controls the node. docs/security.md compares it with the systemd unit.

use nix::sched::{CloneFlags, setns};
use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// The mount namespace entered: PID 1's (the node's init with `hostPID: true`).
pub(crate) const HOST_MOUNT_NAMESPACE: &str = "/proc/1/ns/mnt";

/// What [`enter`] keeps open for the life of the process.
struct Kept {
    /// The container's mount namespace (keeps it, and the volumes mounted in it, alive).
    _container_ns: File,
    /// Directories of the container's view, each reachable as `/proc/self/fd/N`.
    _dirs: Vec<File>,
}

static KEPT: OnceLock<Kept> = OnceLock::new();

/// The result of [`enter`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Entered {
    /// For each directory asked to be kept, in order: `/proc/self/fd/N` (it resolves in the
    /// container's view), or `None` when the directory did not exist before the switch.
    pub(crate) kept: Vec<Option<PathBuf>>,
    /// PID 1's command line, its first line and at most 120 characters (for the log: which
    /// namespace this is).
    pub(crate) pid1: String,
}

fn ns_id(f: &File, what: &str) -> Result<(u64, u64), String> {
    let m = f
        .metadata()
        .map_err(|e| format!("cannot stat {what}: {e}"))?;
    Ok((m.dev(), m.ino()))
}

/// Threads of this process (entries of `/proc/self/task`).
pub(crate) fn thread_count() -> Result<usize, String> {
    Ok(std::fs::read_dir("/proc/self/task")
        .map_err(|e| format!("cannot read /proc/self/task: {e}"))?
        .count())
}

/// Opens each directory of `keep` (those that exist), then makes this process a member of the
/// mount namespace of `target` (a `/proc/PID/ns/mnt` path; [`HOST_MOUNT_NAMESPACE`] in
/// production). Refuses, changing nothing, when the process has more than one thread, when the
/// target is already its namespace, or when the kernel refuses; every error says what to do.
/// Once per process (a second call is refused).
pub(crate) fn enter(target: &Path, keep: &[&Path]) -> Result<Entered, String> {
    if KEPT.get().is_some() {
        return Err("already in the host's mount namespace (entered once per process)".into());
    }
    let threads = thread_count()?;
    if threads != 1 {
        return Err(format!(
            "cannot enter the host's mount namespace: the process has {threads} threads, and \
             setns(CLONE_NEWNS) works only in a single-threaded process (a bug: it must be the \
             first thing the provisioner does)"
        ));
    }
    let own = File::open("/proc/self/ns/mnt")
        .map_err(|e| format!("cannot open /proc/self/ns/mnt: {e}"))?;
    let host = File::open(target).map_err(|e| {
        format!(
            "--host-mount-namespace: cannot open {} ({e}): the container needs hostPID: true \
             (PID 1 must be the node's init) and privileges to read another process's \
             namespaces (privileged: true; drivers/deploy/daemonset.yaml)",
            target.display()
        )
    })?;
    if ns_id(&own, "/proc/self/ns/mnt")? == ns_id(&host, &target.display().to_string())? {
        return Err(format!(
            "--host-mount-namespace: {} is this process's own mount namespace, so there is no \
             host namespace to enter: PID 1 is this container's own process because the pod \
             lacks hostPID: true (set it in the pod spec, as drivers/deploy/daemonset.yaml \
             does), or the provisioner already runs on the host (then drop the flag)",
            target.display()
        ));
    }
    let pid1 = target
        .parent()
        .and_then(Path::parent)
        .map(|p| p.join("cmdline"))
        .and_then(|p| std::fs::read(p).ok())
        .map(|b| {
            String::from_utf8_lossy(&b)
                .split('\0')
                .filter(|s| !s.is_empty())
                .collect::<Vec<_>>()
                .join(" ")
                .chars()
                .take_while(|c| *c != '\n')
                .take(120)
                .collect()
        })
        .unwrap_or_default();
    let mut dirs = Vec::new();
    let mut kept = Vec::new();
    for d in keep {
        match File::open(d) {
            Ok(f) if f.metadata().is_ok_and(|m| m.is_dir()) => {
                kept.push(Some(PathBuf::from(format!(
                    "/proc/self/fd/{}",
                    f.as_raw_fd()
                ))));
                dirs.push(f);
            }
            Ok(_) => {
                return Err(format!(
                    "{} is not a directory; it is kept in the container's view for \
                     --host-mount-namespace",
                    d.display()
                ));
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => kept.push(None),
            Err(e) => return Err(format!("cannot open {}: {e}", d.display())),
        }
    }
    setns(&host, CloneFlags::CLONE_NEWNS).map_err(|e| {
        let why = match e {
            nix::errno::Errno::EPERM => {
                "the container lacks CAP_SYS_ADMIN and CAP_SYS_CHROOT (run it privileged: true, \
                 as drivers/deploy/daemonset.yaml does)"
            }
            nix::errno::Errno::EINVAL => {
                "the process shares its filesystem context with a thread (a bug: enter first)"
            }
            _ => "see setns(2)",
        };
        format!(
            "--host-mount-namespace: setns({}, CLONE_NEWNS) failed: {e}: {why}",
            target.display()
        )
    })?;
    // setns(2) moved our root and working directory to the new namespace's root; check we are in
    // it (the kernel could only have refused above, but a wrong target must never go unseen).
    let now = File::open("/proc/self/ns/mnt")
        .map_err(|e| format!("cannot open /proc/self/ns/mnt after setns: {e}"))?;
    if ns_id(&now, "/proc/self/ns/mnt")? != ns_id(&host, &target.display().to_string())? {
        return Err(format!(
            "after setns({}) this process is not in that mount namespace",
            target.display()
        ));
    }
    let _ = KEPT.set(Kept {
        _container_ns: own,
        _dirs: dirs,
    });
    Ok(Entered { kept, pid1 })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The test harness runs many threads: refused before anything is opened or entered, with
    /// the reason (the single-threaded path is proven by the binary: tests/suite/hostns.rs).
    #[test]
    fn refused_in_a_threaded_process() {
        let t = std::thread::spawn(|| std::thread::sleep(std::time::Duration::from_millis(300)));
        let e = enter(Path::new(HOST_MOUNT_NAMESPACE), &[]).unwrap_err();
        assert!(
            e.contains("threads") && e.contains("single-threaded"),
            "{e}"
        );
        t.join().unwrap();
        assert!(KEPT.get().is_none());
    }
}
