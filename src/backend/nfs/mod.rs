//! NFS: mount an export into the pod directory, and get it out again even when the server is dead.
//!
//! `mount <podDir> <json>`:
//! 1. validate every option against the allow-lists and the node policy ([`options`]); bad input
//!    changes nothing and runs nothing;
//!    Then the capability check (below): a refusal has run nothing but name lookups;
//! 2. resolve the pod directory's *parent* (the last component is never looked at before we know
//!    it is not a mount: a stat inside a dead NFS mount hangs) and take the pod directory's lock
//!    (per target, not per export: many pods may mount one export at once);
//! 3. if mountinfo shows this export at the pod directory, answer Success (idempotent retry); if
//!    it shows anything else there, fail;
//! 4. probe the server within `probeTimeoutSeconds` ([`probe`]): a dead or wrong server fails in
//!    seconds with "NFS server X is unreachable", and `mount.nfs` never starts;
//! 5. record the mount (state, before mounting), then run `mount.nfs SERVER:SHARE DIR -o OPTS`
//!    with its output captured and a timeout (`mountTimeoutSeconds`, within the verb deadline);
//! 6. check mountinfo: the export must now be mounted there;
//! 7. a provisioned volume (the capability check passed) mounted read-write gets the pod's fsGroup
//!    (`backend::apply_fs_group`; docs/fsgroup.md); a walk that fails unmounts again. An export
//!    that squashes root is left as it is, and the Success message says so.
//!
//! `unmount <podDir>` (no options):
//! 1. resolve the parent as above; never stat, open or canonicalize the pod directory itself;
//! 2. under the lock, read mountinfo: nothing NFS at the pod directory means Success (and the
//!    record is forgotten); a non-NFS mount there is refused (not ours);
//! 3. probe the server (the address from mountinfo's `addr=`, so no DNS is needed);
//! 4. escalate, each step a child `umount -i -c` (no NFS helper, no canonicalization, so no stat
//!    of the mount) with a timeout (`unmountTimeoutSeconds`), re-reading mountinfo after each:
//!    - server reachable: normal unmount; "busy" fails (a process still uses the volume, kubelet
//!      retries); a hang escalates to forced, then lazy;
//!    - server unreachable: forced (`MNT_FORCE`, aborts pending requests), then lazy
//!      (`MNT_DETACH`, always detaches at once);
//! 5. forget the record. The export's data is never touched.
//!
//! Capabilities (issue #20): the NFS provisioner makes claims' directories inside the exports
//! listed in `nfs.provisionedExports`. A mount whose server is the server of a listed export —
//! the same spelling (names without case, IP literals by value), or, for names, an address in
//! common with it (`getent ahosts` of both, as the probe resolves: an attacker can spell the
//! server as an IP or another name) — is served only through
//! [`crate::node::capability::authorize`] with the shared key (`nfs.capabilityKeyFile`):
//! `capabilityToken` must be the token for kubelet's `pvOrVolumeName` and exactly this
//! `server`/`share`, or a legacy grant must name that PV and the pod's namespace. A call that
//! carries a token is checked the same way whatever its server. This covers every share of such a
//! server, not only those at, below or above a listed export's path: with NFSv4 the client
//! walks the server's pseudo-filesystem, whose paths need not be the server's (`fsid=0`/`fsid=root`
//! exports, nfs-ganesha `Pseudo` paths, bind mounts on the server), so `server:/k8s` may be the
//! directory listed as `server:/srv/nfs/k8s`; the driver cannot see that mapping, so it does not
//! trust any path on that server. The price: static volumes and inline volumes of a server that
//! hosts a provisioned export are refused; serve them from another NFS server. What remains the
//! operator's: list the export under every name and address pods could reach its server by that
//! do not resolve to a listed one (a second interface, a load balancer address), since the driver
//! cannot know them. The provisioner's own mount of an export root skips the check
//! ([`mount_for_provisioner`], not reachable through a verb).

pub mod options;
pub(crate) mod probe;

pub use options::NfsConfig;

use crate::backend::{Backend, Context};
use crate::error::{Error, Result};
use crate::node::capability::{self, Key, KeyError, Location, authorize};
use crate::node::state::VolumeRecord;
use crate::protocol::options::Options;
use crate::protocol::options::keys;
use crate::protocol::reply::Reply;
use crate::protocol::verb::Call;
use crate::sys::exec::{Cmd, ExecError};
use crate::sys::mount::UnmountMode;
use crate::sys::mountinfo::{MountInfo, MountTable};
use crate::sys::paths;
use options::{Export, NfsOptions, same_server, split_source};
use probe::Prober;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

const BACKEND: Backend = Backend::Nfs;

/// The probe (`prober`: the NFS backend's own seam), bounded by `probeTimeoutSeconds` and the verb
/// deadline.
fn probe_server(
    ctx: &Context,
    prober: &dyn Prober,
    server: &str,
    port: u16,
) -> std::result::Result<SocketAddr, String> {
    let budget = ctx
        .deadline
        .cap(Duration::from_secs(ctx.config.nfs.probe_timeout_seconds));
    prober.reachable(ctx.runner, server, port, budget)
}

/// Answers the NFS verbs. Only `mount` and `unmount` do work: the driver is not attachable and
/// not resizable, so the other verbs are consistently "Not supported". `prober`: is a server
/// there (the real one is [`probe::TcpProber`]).
pub(crate) fn handle(call: &Call, ctx: &Context, prober: &dyn Prober) -> Result<Reply> {
    match call {
        Call::Mount { mount_dir, options } => {
            mount(ctx, prober, Path::new(mount_dir), &Options::parse(options)?)
        }
        Call::Unmount { mount_dir } => unmount(ctx, prober, Path::new(mount_dir)),
        _ => Ok(Reply::not_supported()),
    }
}

/// The pod directory as mountinfo would show it, found without touching the directory itself:
/// its parent is resolved (kubelet's own directory, local), its name appended. `None` when the
/// parent does not exist (then nothing can be mounted there).
fn target_path(pod_dir: &Path) -> Result<Option<PathBuf>> {
    let refuse = || {
        Error::refused(format!(
            "mount directory {:?} must be an absolute path without \"..\"",
            pod_dir.display().to_string()
        ))
    };
    if !pod_dir.is_absolute() || paths::has_dotdot(pod_dir) {
        return Err(refuse());
    }
    let (Some(parent), Some(name)) = (pod_dir.parent(), pod_dir.file_name()) else {
        return Err(refuse());
    };
    match std::fs::canonicalize(parent) {
        Ok(p) => Ok(Some(p.join(name))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(Error::io("resolve", parent, e)),
    }
}

fn is_nfs(m: &MountInfo) -> bool {
    m.fs_type == "nfs" || m.fs_type == "nfs4"
}

/// Whether a mountinfo source shows the export `server:share` (trailing slashes aside).
fn same_source(mounted: &str, server: &str, share: &str) -> bool {
    split_source(mounted).is_some_and(|(s, p)| {
        let p = match p.trim_end_matches('/') {
            "" => "/",
            p => p,
        };
        s.eq_ignore_ascii_case(server) && p == share
    })
}

/// What a missing shared key's message says.
pub(crate) const SHARED_KEY_FIX: &str = "every node needs the same key: create it once with `kubectl -n <namespace> create secret generic flexvol-nfs-key --from-file=key=<(head -c 32 /dev/urandom)`, which the DaemonSet mounts (drivers/deploy), and point nfs.capabilityKeyFile at the file (drivers/nfs/README.md)";

/// The shared key as the node config names it.
pub(crate) fn shared_key(cfg: &NfsConfig) -> std::result::Result<Key, KeyError> {
    match &cfg.capability_key_file {
        Some(p) => Key::load(p, SHARED_KEY_FIX),
        None => Err(KeyError::Missing {
            path: PathBuf::from("named by nfs.capabilityKeyFile (not set in the node config)"),
            fix: SHARED_KEY_FIX,
        }),
    }
}

/// The provisioned export whose server `server` is, if any: the same spelling, or (for names) an
/// address in common. A name that cannot be resolved while exports are listed is refused: it
/// might be one of them.
fn provisioned_server<'c>(ctx: &'c Context, server: &str) -> Result<Option<&'c Export>> {
    let exports = &ctx.config.nfs.provisioned_exports;
    if let Some(e) = exports.iter().find(|e| same_server(&e.server, server)) {
        return Ok(Some(e));
    }
    if exports.is_empty() {
        return Ok(None);
    }
    let budget = || {
        ctx.deadline
            .cap(Duration::from_secs(ctx.config.nfs.probe_timeout_seconds))
    };
    let addrs = |name: &str| -> Result<Vec<std::net::IpAddr>> {
        let ips = probe::resolve(ctx.runner, name, budget()).map_err(|why| {
            Error::refused(format!(
                "cannot tell whether NFS server {server} is the server of an export listed in nfs.provisionedExports ({why}); nothing was mounted"
            ))
        })?;
        Ok(ips.into_iter().map(|ip| ip.to_canonical()).collect())
    };
    let mine = addrs(server)?;
    for e in exports {
        if addrs(&e.server)?.iter().any(|ip| mine.contains(ip)) {
            return Ok(Some(e));
        }
    }
    Ok(None)
}

/// The capability check (module doc): a share of a provisioned export's server, or any call with
/// a token, goes through [`authorize`] with the shared key. Runs nothing but name lookups.
/// `Ok(true)`: the volume is one flexvol provisioner made (a valid token or a legacy grant), the
/// only kind whose tree gets the pod's fsGroup; `Ok(false)`: a static or inline volume of a
/// server no export is provisioned on.
fn check_capability(ctx: &Context, opts: &NfsOptions, o: &Options) -> Result<bool> {
    let token = o.non_empty(capability::OPTION);
    if provisioned_server(ctx, &opts.server)?.is_none() && token.is_none() {
        return Ok(false);
    }
    let key = shared_key(&ctx.config.nfs);
    authorize(
        key.as_ref(),
        &ctx.config.state_dir,
        &Location::Nfs {
            server: &opts.server,
            share: &opts.share,
        },
        o.volume_name(),
        o.non_empty(keys::POD_NAMESPACE),
        token,
    )
    .map(|_| true)
    .map_err(|why| Error::refused(format!("{why}. Nothing was mounted")))
}

/// `mount <podDir> <json>`.
fn mount(ctx: &Context, prober: &dyn Prober, pod_dir: &Path, o: &Options) -> Result<Reply> {
    let opts = NfsOptions::parse(o, &ctx.config.nfs)?;
    let provisioned = check_capability(ctx, &opts, o)?;
    // fsGroup only for a provisioned volume (a static export's tree is the server owner's).
    let fs_group = if provisioned && !opts.read_only {
        o.fs_group()?
    } else {
        None
    };
    mount_parsed(ctx, prober, pod_dir, o, &opts, fs_group)
}

/// CSI NodePublishVolume of an NFS volume onto `target` (a CSI target path `flexvol csi` checked:
/// `<kubelet-root>/pods/<uid>/volumes/kubernetes.io~csi/<name>/mount`): the `mount` verb's checks
/// and steps, the capability check included, with the PV name `flexvol csi` took from kubelet's
/// target path (`pvOrVolumeName`, only for a volume kubelet's pod info marks persistent); without
/// one, an export of a server that hosts a provisioned export is refused, as it is for an inline
/// FlexVolume. Static exports are served under the node's `nfs` policy. The target's last
/// directory is made (0750, root's) when kubelet has not, and removed again when the publish fails.
pub(crate) fn publish(
    ctx: &Context,
    prober: &dyn Prober,
    target: &Path,
    o: &Options,
) -> Result<Reply> {
    crate::backend::CreatedTarget::around(target, || mount(ctx, prober, target, o))
}

/// CSI NodeUnpublishVolume: the `unmount` verb (a dead server's mount still goes: forced, then
/// lazy), then the target directory is removed while it is an empty directory that is not a
/// mount point ([`crate::backend::remove_target`]).
pub(crate) fn unpublish(ctx: &Context, prober: &dyn Prober, target: &Path) -> Result<Reply> {
    let reply = unmount(ctx, prober, target)?;
    crate::backend::remove_target(target);
    Ok(reply)
}

/// The provisioner's own mount of an export root (`provision::storage::nfs`), which no capability
/// covers: reached only from inside the provisioner, never through a verb.
pub(crate) fn mount_for_provisioner(
    ctx: &Context,
    prober: &dyn Prober,
    dir: &Path,
    options: &str,
) -> Result<Reply> {
    let o = Options::parse(options)?;
    let opts = NfsOptions::parse(&o, &ctx.config.nfs)?;
    mount_parsed(ctx, prober, dir, &o, &opts, None)
}

fn mount_parsed(
    ctx: &Context,
    prober: &dyn Prober,
    pod_dir: &Path,
    o: &Options,
    opts: &NfsOptions,
    fs_group: Option<u32>,
) -> Result<Reply> {
    let source = opts.source();
    let target = target_path(pod_dir)?.ok_or_else(|| {
        Error::refused(format!(
            "mount directory {} does not exist (kubelet creates it before calling mount)",
            pod_dir.display()
        ))
    })?;
    let _lock = ctx.lock(BACKEND, &target.to_string_lossy())?;

    let table = ctx.mounter.table()?;
    if let Some(m) = table.at(&target) {
        return already_mounted(m, opts, &target);
    }
    // Not a mount point: the directory is on the node's own filesystem, so looking is safe.
    match std::fs::symlink_metadata(&target) {
        Ok(meta) if meta.is_dir() => {}
        Ok(_) => {
            return Err(Error::refused(format!(
                "mount directory {} is not a directory",
                target.display()
            )));
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(Error::refused(format!(
                "mount directory {} does not exist (kubelet creates it before calling mount)",
                target.display()
            )));
        }
        Err(e) => return Err(Error::io("inspect", &target, e)),
    }

    probe_server(ctx, prober, &opts.server, opts.port).map_err(|why| {
        Error::refused(format!(
            "NFS server {} is unreachable: {why}. Nothing was mounted. Check that the server is up and exports {}, that this node can reach it on TCP port {}, and the server name in the volume",
            opts.server, opts.share, opts.port
        ))
    })?;

    let state = ctx.state(BACKEND);
    state.save(&VolumeRecord {
        extra: BTreeMap::from([
            ("mountOptions".to_owned(), opts.mount_options.clone()),
            ("port".to_owned(), opts.port.to_string()),
        ]),
        ..crate::backend::record(
            BACKEND,
            "mount",
            &target,
            source.clone(),
            opts.read_only,
            Some(o),
        )
    })?;
    crate::sys::process::checkpoint("nfs-mount-before-mount");

    let timeout = ctx
        .deadline
        .cap(Duration::from_secs(ctx.config.nfs.mount_timeout_seconds));
    let cmd = Cmd::new("mount.nfs")
        .arg(&source)
        .arg(&target)
        .arg("-o")
        .arg(&opts.mount_options)
        .timeout(timeout);
    let result = ctx.runner.check(&cmd);
    let mounted = ctx
        .mounter
        .table()?
        .at(&target)
        .is_some_and(|m| is_nfs(m) && same_source(&m.source, &opts.server, &opts.share));
    if mounted {
        crate::sys::process::checkpoint("nfs-mount-after-mount");
    }
    match result {
        // Killed by the timeout right after the kernel mounted it: it is mounted all the same.
        _ if mounted => match fs_group {
            None => Ok(Reply::success()),
            Some(gid) => apply_fs_group(ctx, &target, &source, gid),
        },
        Ok(_) => {
            state.remove(&target)?;
            Err(Error::refused(format!(
                "mount.nfs reported success but {source} is not mounted on {}; check the node's kernel log (dmesg)",
                target.display()
            )))
        }
        Err(e) => {
            state.remove(&target)?;
            Err(mount_failed(opts, &target, e))
        }
    }
}

/// The pod's fsGroup on the tree just mounted at `target` (`backend::apply_fs_group`). A walk
/// that fails unmounts it again, so the Failure leaves nothing mounted: kubelet skips `mount` for
/// a directory that is already a mount point, and would start the pod on a half-walked tree.
fn apply_fs_group(ctx: &Context, target: &Path, source: &str, gid: u32) -> Result<Reply> {
    let walked = paths::open_dir_nofollow(target)
        .map_err(|e| Error::io("open", target, std::io::Error::from(e)))
        .and_then(|root| super::apply_fs_group(&root, gid, &ctx.deadline, target));
    match walked {
        Ok(None) => Ok(Reply::success()),
        Ok(Some(note)) => Ok(Reply::success().with_message(note)),
        Err(e) => {
            unmount_one(ctx, target, source, true)?;
            ctx.state(BACKEND).remove(target)?;
            Err(e)
        }
    }
}

/// The message for a failed `mount.nfs`, with what the operator can do about it.
fn mount_failed(opts: &NfsOptions, target: &Path, e: ExecError) -> Error {
    let source = opts.source();
    match e {
        ExecError::NotFound { .. } => Error::refused(format!(
            "mount.nfs is not installed on this node, so {source} cannot be mounted; install the NFS client (Debian/Ubuntu: nfs-common, RHEL/Fedora: nfs-utils)"
        )),
        ExecError::TimedOut { secs, .. } => Error::refused(format!(
            "mounting {source} did not finish within {secs}s and was stopped; nothing is mounted on {}. The server accepts connections on port {} but does not complete the mount: check the export on the server (exportfs -v), for NFSv3 that rpcbind (port 111) and mountd are reachable, and raise nfs.mountTimeoutSeconds if the server is just slow",
            target.display(),
            opts.port
        )),
        ExecError::Failed { output, .. } => {
            let said = output.tail();
            let hint = if said.contains("access denied") || said.contains("Permission denied") {
                "the server refuses this node: check that the export allows this node's address (exportfs -v on the server)"
            } else if said.contains("No such file or directory") {
                "the server does not export that path: check share against exportfs -v on the server"
            } else if said.contains("Protocol not supported")
                || said.contains("requested NFS version")
            {
                "the server does not speak the requested NFS version: change or remove the version option"
            } else {
                "check the export on the server and the volume's mountOptions"
            };
            Error::refused(format!(
                "mounting {source} on {} failed: {said}; {hint}",
                target.display()
            ))
        }
        e => Error::Exec(e),
    }
}

/// What an existing mount at the target means for a new mount.
fn already_mounted(m: &MountInfo, opts: &NfsOptions, target: &Path) -> Result<Reply> {
    if !is_nfs(m) || !same_source(&m.source, &opts.server, &opts.share) {
        return Err(crate::backend::foreign_mount(
            target,
            &format_args!("{} {}", m.fs_type, m.source),
        ));
    }
    if m.read_only() != opts.read_only {
        let (have, want) = if m.read_only() {
            ("read-only", "read-write")
        } else {
            ("read-write", "read-only")
        };
        return Err(Error::refused(format!(
            "{} is already mounted {have} from {} but {want} was asked; unmount it first",
            target.display(),
            m.source
        )));
    }
    Ok(Reply::success())
}

/// An unmount step in words. The steps are the kernel's modes, run through `umount` (plain, `-f`,
/// `-l`) because a plain unmount may block on a dead server and `umount` runs under a deadline.
fn describe(step: UnmountMode) -> &'static str {
    match step {
        UnmountMode::Normal => "unmount",
        UnmountMode::Force => "forced unmount",
        UnmountMode::Detach => "lazy unmount",
    }
}

/// The NFS mount at `target`, if the topmost mount there is NFS; an error if it is something else.
fn nfs_mount_at<'t>(table: &'t MountTable, target: &Path) -> Result<Option<&'t MountInfo>> {
    match table.at(target) {
        None => Ok(None),
        Some(m) if is_nfs(m) => Ok(Some(m)),
        Some(m) => Err(Error::refused(format!(
            "{} has a {} mount of {} on it, which the NFS driver did not make; it is left alone. Unmount it by hand if it is stale",
            target.display(),
            m.fs_type,
            m.source
        ))),
    }
}

/// Where to probe the server of a mount: the address the kernel uses (`addr=` in the superblock
/// options, no DNS needed), else the server part of the source; the port from the record.
fn server_of(m: &MountInfo, record: Option<&VolumeRecord>) -> Option<(String, u16)> {
    let port = record
        .and_then(|r| r.extra.get("port"))
        .and_then(|p| p.parse().ok())
        .or_else(|| {
            m.super_options
                .split(',')
                .find_map(|o| o.strip_prefix("port=")?.parse().ok())
                .filter(|p| *p != 0)
        })
        .unwrap_or(2049);
    let addr = m
        .super_options
        .split(',')
        .find_map(|o| o.strip_prefix("addr="))
        .map(|a| {
            if a.contains(':') {
                format!("[{a}]")
            } else {
                a.to_owned()
            }
        });
    let server = addr.or_else(|| split_source(&m.source).map(|(s, _)| s.to_owned()))?;
    Some((server, port))
}

/// `unmount <podDir>`.
fn unmount(ctx: &Context, prober: &dyn Prober, pod_dir: &Path) -> Result<Reply> {
    let state = ctx.state(BACKEND);
    let Some(target) = target_path(pod_dir)? else {
        state.remove(pod_dir)?;
        return Ok(Reply::success());
    };
    let _lock = ctx.lock(BACKEND, &target.to_string_lossy())?;
    // The record only helps (the probe port); mountinfo decides. A corrupt record must not
    // keep a dead mount in place.
    let record = state.load(&target).ok().flatten();

    let mut notes: Vec<String> = Vec::new();
    let layers = ctx.mounter.table()?.all_at(&target).count();
    for _ in 0..layers {
        let table = ctx.mounter.table()?;
        let Some(m) = nfs_mount_at(&table, &target)? else {
            break;
        };
        let alive = match server_of(m, record.as_ref()) {
            Some((server, port)) => match probe_server(ctx, prober, &server, port) {
                Ok(_) => true,
                Err(why) => {
                    notes.push(format!("NFS server {server} is unreachable ({why})"));
                    false
                }
            },
            None => true,
        };
        let source = m.source.clone();
        let used = unmount_one(ctx, &target, &source, alive)?;
        if used != UnmountMode::Normal {
            notes.push(format!("{source} was removed by a {}", describe(used)));
        }
    }
    if nfs_mount_at(&ctx.mounter.table()?, &target)?.is_some() {
        return Err(Error::refused(format!(
            "{} is still mounted after unmounting every NFS mount on it; retry",
            target.display()
        )));
    }
    crate::sys::process::checkpoint("nfs-unmount-before-forget");
    state.remove(&target)?;
    Ok(if notes.is_empty() {
        Reply::success()
    } else {
        Reply::success().with_message(notes.join("; "))
    })
}

/// Removes the topmost NFS mount of `source` at `target`, escalating as the module doc says.
/// Returns the step that removed it.
fn unmount_one(ctx: &Context, target: &Path, source: &str, alive: bool) -> Result<UnmountMode> {
    let steps: &[UnmountMode] = if alive {
        &[UnmountMode::Normal, UnmountMode::Force, UnmountMode::Detach]
    } else {
        &[UnmountMode::Force, UnmountMode::Detach]
    };
    let before = ctx.mounter.table()?.all_at(target).count();
    let mut tried: Vec<String> = Vec::new();
    for &step in steps {
        let timeout = ctx
            .deadline
            .cap(Duration::from_secs(ctx.config.nfs.unmount_timeout_seconds));
        let mut cmd = Cmd::new("umount").arg("-i").arg("-c");
        match step {
            UnmountMode::Normal => {}
            UnmountMode::Force => cmd = cmd.arg("-f"),
            UnmountMode::Detach => cmd = cmd.arg("-l"),
        }
        let cmd = cmd.arg(target).timeout(timeout);
        let started = Instant::now();
        let result = ctx.runner.check(&cmd);
        if ctx.mounter.table()?.all_at(target).count() < before {
            return Ok(step);
        }
        let why = match &result {
            Ok(_) => "it returned but the mount is still there".to_owned(),
            Err(ExecError::TimedOut { .. }) => format!(
                "no answer within {:.0}s",
                started.elapsed().as_secs_f64().max(timeout.as_secs_f64())
            ),
            Err(ExecError::Failed { output, .. }) => output.tail(),
            Err(e) => e.to_string(),
        };
        let busy = matches!(&result, Err(ExecError::Failed { output, .. }) if output.tail().contains("busy"));
        if step == UnmountMode::Normal && busy {
            return Err(Error::refused(format!(
                "{} (NFS {source}) is busy: a process still uses it; kubelet will retry once the pod's containers are gone",
                target.display()
            )));
        }
        if matches!(result, Err(ExecError::NotFound { .. })) {
            return Err(Error::refused(format!(
                "umount is not installed on this node (util-linux); cannot unmount {}",
                target.display()
            )));
        }
        tried.push(format!("{}: {why}", describe(step)));
        if ctx.deadline.expired() {
            break;
        }
    }
    Err(Error::refused(format!(
        "cannot unmount {} (NFS {source}): {}. Check the node's kernel log; the volume's data on the server was not touched",
        target.display(),
        tried.join("; ")
    )))
}

#[cfg(test)]
mod tests;
