//! Backends: one per driver name. The binary is installed as `<vendor>~hostpath/hostpath`,
//! `<vendor>~nfs/nfs` and `<vendor>~lvm/lvm`, and the name it runs as picks the backend. That is
//! forced by the protocol: `unmount` and `unmountdevice` carry no options, and kubelet caches
//! capabilities and "Not supported" answers per driver name, so each backend needs its own name.
//!
//! Each backend module has a `handle` function that matches on the verb and calls one function per
//! verb; verbs common to all (init, getvolumename, unknown verbs) are answered in [`answer`].
//!
//! Seams: a call's [`Context`] carries what every backend uses (the node config, the command
//! runner, the mount seam, the deadline, the driver name), which every caller builds with
//! [`Context::new`] (over the node's real seams: [`on_node`]). A backend's own seams go with that backend's `handle`: NFS
//! takes its server probe ([`nfs::probe::Prober`]), LVM its block devices and LV service
//! ([`lvm::Seams`]); hostPath has none. [`answer`] passes the real ones; unit tests call a
//! backend's `handle` with doubles (`testing.rs`).

pub(crate) mod hostpath;
pub mod lvm;
pub mod nfs;
#[cfg(test)]
pub(crate) mod testing;

use crate::error::{Error, Result};
use crate::node::config::Config;
use crate::node::state::{StateStore, VolumeRecord, now_secs};
use crate::protocol::options::{Options, keys};
use crate::protocol::reply::{Capabilities, Reply};
use crate::protocol::verb::Call;
use crate::sys::exec::{Runner, SystemRunner};
use crate::sys::lock::VolumeLock;
use crate::sys::mount::{MountError, Mounter, SysMounter};
use crate::sys::process::Deadline;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The three backends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// Bind mounts of host directories and files.
    HostPath,
    /// NFS mounts.
    Nfs,
    /// LVM logical volumes (attachable).
    Lvm,
}

impl Backend {
    /// All backends, in install order.
    pub const ALL: [Backend; 3] = [Backend::HostPath, Backend::Nfs, Backend::Lvm];

    /// The backend a driver name selects.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|b| b.name() == name)
    }

    /// The driver name (and executable name).
    pub fn name(self) -> &'static str {
        match self {
            Backend::HostPath => "hostpath",
            Backend::Nfs => "nfs",
            Backend::Lvm => "lvm",
        }
    }

    /// What `init` reports (docs/protocol.md §5): all five, always explicit.
    pub fn capabilities(self) -> Capabilities {
        match self {
            Backend::HostPath | Backend::Nfs => Capabilities {
                attach: false,
                selinux_relabel: false,
                supports_metrics: true,
                fs_group: false,
                requires_fs_resize: false,
            },
            Backend::Lvm => Capabilities {
                attach: true,
                selinux_relabel: true,
                supports_metrics: true,
                fs_group: true,
                requires_fs_resize: true,
            },
        }
    }
}

/// What every verb of every backend may use: the node config, the seams to the system that all
/// backends share (unit tests replace each one), the call's deadline and the driver name. Built
/// with [`Context::new`]; a backend's own seams are passed beside it (module doc).
pub struct Context<'a> {
    /// Node configuration.
    pub config: &'a Config,
    /// The command runner.
    pub runner: &'a dyn Runner,
    /// The mount seam.
    pub mounter: &'a dyn Mounter,
    /// When this call must have answered.
    pub(crate) deadline: Deadline,
    /// `<vendor>/<driver>` as kubelet knows this install (e.g. `flexvol/lvm`); kubelet derives
    /// the global device mount path from it (`.../flexvolume/<vendor>/<driver>/mounts/<name>`).
    pub(crate) driver_name: &'a str,
}

impl<'a> Context<'a> {
    /// A call's context: `runner` and `mounter` are the node's ([`on_node`]) or a test's doubles.
    pub(crate) fn new(
        config: &'a Config,
        runner: &'a dyn Runner,
        mounter: &'a dyn Mounter,
        deadline: Deadline,
        driver_name: &'a str,
    ) -> Self {
        Self {
            config,
            runner,
            mounter,
            deadline,
            driver_name,
        }
    }

    /// Takes the lock for `key` of `backend`, waiting at most the configured time (and never past
    /// the deadline).
    pub(crate) fn lock(&self, backend: Backend, key: &str) -> Result<VolumeLock> {
        let wait = self.deadline.cap(self.config.lock_timeout());
        Ok(VolumeLock::acquire(
            &self.config.lock_dir(),
            &lock_key(backend, key),
            wait,
        )?)
    }

    /// The state records of `backend`.
    pub(crate) fn state(&self, backend: Backend) -> StateStore {
        StateStore::new(&self.config.state_dir, backend.name())
    }
}

/// Runs `f` with a context over the node's real seams: commands found in the config's `toolDirs`,
/// the kernel's mounts. What the driver, `flexvol gc` and the provisioner's node work run with.
pub(crate) fn on_node<T>(
    config: &Config,
    deadline: Deadline,
    driver_name: &str,
    f: impl FnOnce(&Context) -> T,
) -> T {
    let runner = SystemRunner::new(config.tool_dirs.clone());
    f(&Context::new(
        config,
        &runner,
        &SysMounter,
        deadline,
        driver_name,
    ))
}

/// The name of a volume's lock; `flexvol gc` takes the same lock as the verbs.
pub(crate) fn lock_key(backend: Backend, key: &str) -> String {
    format!("{}:{key}", backend.name())
}

/// Answers one call for `backend`, with that backend's real seams.
pub(crate) fn answer(backend: Backend, call: &Call, ctx: &Context) -> Result<Reply> {
    match call {
        Call::Init => Ok(Reply {
            capabilities: Some(backend.capabilities()),
            ..Reply::success()
        }),
        // kubelet ignores the answer and uses the PV name; answering anything else once caused
        // unmounts (kubernetes#44737). "Not supported" is cached, so it is asked only once.
        Call::GetVolumeName { .. } => Ok(Reply::not_supported()),
        Call::Unknown { .. } => Ok(Reply::not_supported()),
        _ => match backend {
            Backend::HostPath => hostpath::handle(call, ctx),
            Backend::Nfs => nfs::handle(call, ctx, &nfs::probe::TcpProber),
            Backend::Lvm => lvm::handle(call, ctx, &lvm::Seams::SYSTEM),
        },
    }
}

/// What `mount` does with the pod's fsGroup on a volume flexvol provisioner made (hostPath, NFS;
/// LVM leaves it to kubelet, capability `fsGroup`): applies it to the tree at `root` (an open
/// directory) as kubelet does for an emptyDir, with `OnRootMismatch` ([`crate::sys::ownership`]).
/// Caller contract: only for a volume the backend proved provisioned (capability token or legacy
/// grant), only when the pod asked for a group (`gid`) and mounts it read-write. `Ok(Some(note))`
/// for the Success message when something was walked; an NFS export that squashes root is
/// `Ok(Some(note))` too, with nothing changed (the mount still works; the note says why the group
/// was not applied). `Err` (deadline, a tree too deep, a system error) is the call's Failure: the
/// root was left unchanged, so kubelet's retry walks again.
pub(crate) fn apply_fs_group(
    root: &std::os::fd::OwnedFd,
    gid: u32,
    deadline: &Deadline,
    what: &Path,
) -> Result<Option<String>> {
    use crate::sys::ownership::{self, OwnershipError};
    match ownership::apply(root, gid, deadline) {
        Ok(o) if !o.walked => Ok(None),
        Ok(o) => Ok(Some(format!(
            "fsGroup {gid} applied: group and group-write set on {} of {} files and directories{}",
            o.changed,
            o.visited,
            if o.refused > 0 {
                format!(
                    ", {} refused by the kernel (immutable or append-only) and left as they were",
                    o.refused
                )
            } else {
                String::new()
            }
        ))),
        Err(OwnershipError::Squashed) => Ok(Some(format!(
            "fsGroup {gid} not applied: the server squashes root (root_squash), so root on this node cannot change group ownership; ownership left as it is. Give the class a gid/mode the pods can use, or export with no_root_squash"
        ))),
        Err(e) => Err(Error::refused(format!(
            "cannot apply the pod's fsGroup {gid} to {}: {e}; nothing was mounted and kubelet will retry",
            what.display()
        ))),
    }
}

/// A state record of `backend`'s `verb` on `target`, stamped now, with what every backend fills
/// the same way; `pod` (the call's options) adds the volume and the pod kubelet named. Callers
/// add the rest (mount point, `extra`) with struct update syntax.
pub(crate) fn record(
    backend: Backend,
    verb: &str,
    target: &Path,
    source: String,
    read_only: bool,
    pod: Option<&Options>,
) -> VolumeRecord {
    VolumeRecord {
        backend: backend.name().into(),
        verb: verb.into(),
        target: target.to_path_buf(),
        mount_point: None,
        source,
        read_only,
        volume: pod.and_then(|o| o.volume_name().map(str::to_owned)),
        pod: pod.and_then(Options::pod_ref),
        pod_uid: pod.and_then(|o| o.non_empty(keys::POD_UID).map(str::to_owned)),
        since: now_secs(),
        extra: BTreeMap::new(),
    }
}

/// Refuses to mount on `at`: it is already a mount point of something other than this volume
/// (`what`: its filesystem and source, or its identity). Every backend says it the same way.
pub(crate) fn foreign_mount(at: &Path, what: &dyn std::fmt::Display) -> Error {
    Error::occupied(format!(
        "{} is already a mount point of something else ({what}); unmount it first",
        at.display()
    ))
}

/// Whether an unmount failed because the mount is in use (EBUSY).
pub(crate) fn is_busy(e: &MountError) -> bool {
    matches!(
        e,
        MountError::Unmount {
            errno: nix::Error::EBUSY,
            ..
        }
    )
}

/// The Failure for a mount at `at` that a process still uses: nothing to do but wait, and
/// kubelet retries.
pub(crate) fn busy(at: &Path) -> Error {
    Error::refused(format!(
        "{} is busy (a process still uses it); kubelet will retry once the pod's containers are gone",
        at.display()
    ))
}

/// The canonical form of a directory kubelet names (pod or global mount directory); `None` when
/// it does not exist. Relative paths, `..` and non-directories are refused.
pub(crate) fn canonical_mount_dir(dir: &Path) -> Result<Option<PathBuf>> {
    if !dir.is_absolute() || crate::sys::paths::has_dotdot(dir) {
        return Err(Error::refused(format!(
            "mount directory {:?} must be an absolute path without \"..\"",
            dir.display().to_string()
        )));
    }
    match std::fs::canonicalize(dir) {
        Ok(p) if p.is_dir() => Ok(Some(p)),
        Ok(p) => Err(Error::refused(format!(
            "mount directory {} is not a directory",
            p.display()
        ))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(Error::io("resolve", dir, e)),
    }
}

/// The CSI target directory a publish created, removed again when the publish fails.
pub(crate) struct CreatedTarget(Option<(std::os::fd::OwnedFd, std::ffi::OsString)>);

impl CreatedTarget {
    /// Creates the last directory of `target` (a checked CSI target path) when it is missing,
    /// 0750 and root's, through its parent opened without following any symlink.
    fn make(target: &Path) -> Result<Self> {
        let (Some(parent), Some(name)) = (target.parent(), target.file_name()) else {
            return Ok(Self(None));
        };
        let dir = match crate::sys::dirfd::open_dir(parent) {
            Ok(d) => d,
            // No parent (kubelet makes it before the call): `mount` reports the target missing.
            Err(nix::Error::ENOENT) => return Ok(Self(None)),
            Err(nix::Error::ELOOP) => {
                return Err(Error::refused(format!(
                    "mount directory {} goes through a symlink; flexvol never acts through one",
                    parent.display()
                )));
            }
            Err(e) => return Err(Error::io("open", parent, std::io::Error::from(e))),
        };
        match crate::sys::dirfd::mkdir(&dir, name, 0o750) {
            Ok(()) => Ok(Self(Some((dir, name.to_owned())))),
            Err(nix::Error::EEXIST) => Ok(Self(None)),
            Err(e) => Err(Error::io("create", target, std::io::Error::from(e))),
        }
    }

    /// Runs `work` with `target`'s last directory made as [`CreatedTarget::make`] makes it, and
    /// removes that directory again when `work` fails: a refused or failed CSI call leaves nothing
    /// it created.
    pub(crate) fn around<T>(target: &Path, work: impl FnOnce() -> Result<T>) -> Result<T> {
        let created = Self::make(target)?;
        let result = work();
        if result.is_err() {
            created.undo();
        }
        result
    }

    /// Removes the directory [`CreatedTarget::make`] created, if it is still empty (`rmdir`
    /// removes nothing else: not a file, not a symlink, not a mount point).
    fn undo(self) {
        if let Some((dir, name)) = self.0 {
            let _ = crate::sys::dirfd::rmdir(&dir, name.as_os_str());
        }
    }
}

/// After a CSI unpublish: removes the target directory `target` (a checked CSI target path), as
/// CSI asks of the plugin, only while it is an empty directory that is not a mount point (`rmdir`
/// through its parent opened without following a symlink: never a file, a symlink or a mount);
/// anything else there stays, and kubelet, which owns the pod's directories, deals with it.
pub(crate) fn remove_target(target: &Path) {
    if let (Some(parent), Some(name)) = (target.parent(), target.file_name())
        && let Ok(dir) = crate::sys::dirfd::open_dir(parent)
    {
        let _ = crate::sys::dirfd::rmdir(&dir, name);
    }
}

/// The kubelet root a pod directory lives under (`<root>/pods/<uid>/volumes/<plugin>/<name>`);
/// `None` for a directory of another shape.
pub(crate) fn kubelet_root(pod_dir: &Path) -> Option<PathBuf> {
    let comps: Vec<_> = pod_dir.components().collect();
    let n = comps.len();
    if n >= 6 && comps[n - 5].as_os_str() == "pods" && comps[n - 3].as_os_str() == "volumes" {
        return Some(comps[..n - 5].iter().collect());
    }
    None
}
