//! hostPath: bind-mount a directory (or file, socket, device) of the node into the pod.
//!
//! Both verbs act only on a pod volume directory of this driver in kubelet's shape,
//! `<kubelet-root>/pods/<uid>/volumes/<vendor>~hostpath/<name>`, with no symlink below the kubelet
//! root; anything else (`/`, a symlinked pod directory, another plugin's directory) is refused.
//!
//! `mount <podDir> <json>`:
//! 1. validate every option and the node policy; bad input changes nothing. A path inside a
//!    provisioning root (`nodePathMap`) is served only to the PV the provisioner made it for
//!    (its `capabilityToken`, or a legacy grant; see [`policy::check_policy`]);
//! 2. under the pod directory's lock, check what the pod directory holds (its record, and one
//!    `statx` of the mount point) *before* creating anything: another volume's record, a mount
//!    of something else, a directory volume where a file is to go, or files a directory bind
//!    would hide, fail here;
//! 3. create the source if its type says so (`DirectoryOrCreate`, `FileOrCreate`, or a
//!    per-volume `pathPattern` directory), never following symlinks;
//! 4. open the source `O_PATH` without following symlinks and check its type against kubelet's
//!    HostPathType rules;
//!    Then, for a provisioned volume (the token or legacy grant of step 1) mounted read-write,
//!    the pod's fsGroup, applied to the pinned directory as kubelet does for an emptyDir, before
//!    the bind (`backend::apply_fs_group`, `sys::ownership`; docs/fsgroup.md); never for any
//!    other source;
//! 5. if the pod directory already shows this source (same device and inode at a mount root),
//!    answer Success when the access matches the record (finishing a read-only or slave remount
//!    a crash interrupted); a different access mode is refused, so the record never disagrees
//!    with the mount;
//! 6. record the mount (state, with the source's device and inode), bind-mount the opened inode,
//!    make the bind a slave (nothing propagates from the pod back to the host), make it
//!    read-only if asked.
//!
//! A directory source is bound onto the pod directory itself. A file-like source (file, socket,
//! device) cannot be: the pod directory is a directory. It is bound onto an empty file of the same
//! name *inside* the pod directory, so a container that mounts the volume at `/data` sees
//! `/data/<name>`.
//!
//! `unmount <podDir>` (no options): unmount the bind the record names, and only while it shows the
//! recorded source (a mount of anything else is left alone: Failure); without a record (kubelet
//! or the node lost it), the bind at the pod directory or the file-like binds directly inside it,
//! and only those that can be ours: a bind whose source lies under an allowed hostPath root or a
//! provisioner root (mountinfo's device and root of the mount, against where those roots and the
//! mounts below them live). Anything else there (a tmpfs, another filesystem, a bind of a path
//! outside every root) is left alone with a Failure that says what is mounted and why. Mounts
//! that propagated into the bind are detached with it, never unmounted on their own (that would
//! unmount the host's originals). Then remove the placeholder file of a file-like source and
//! forget the record. Never writes to the source. Neither verb reads the mount table on its
//! normal path (only an unmount that finds the bind busy does, once, and the rare unmount without
//! a record, once): mount facts come from `statx` (see `sys::mount`), so a call costs the same on
//! a node with 20 mounts or 4,000.
//!
//! Which paths may be served at all (the node policy, the locations refused whatever it says) is
//! [`policy`]; whose volume a path inside a provisioning root is, `mount` checks here
//! (`authorize_provisioned`).

pub(crate) mod policy;

use crate::backend::{Backend, Context};
use crate::error::{Error, Result};
use crate::node::config::Config;
use crate::node::state::VolumeRecord;
use crate::protocol::options::{Options, OptionsError, keys};
use crate::protocol::reply::Reply;
use crate::protocol::verb::Call;
use crate::sys::mount::{
    FileId, MountError, PathState, UnmountMode, fd_id, fd_kind_id, fd_state, path_state,
    reads_read_only,
};
use crate::sys::paths::{self, FileKind, Ownership};
use policy::{Served, check_device_source, check_policy};
use std::collections::BTreeMap;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

const BACKEND: Backend = Backend::HostPath;

/// What [`policy`] needs of the node config.
fn node(config: &Config) -> policy::Node<'_> {
    policy::Node {
        hostpath: &config.hostpath,
        local_path: &config.local_path,
        state_dir: &config.state_dir,
        run_dir: &config.run_dir,
        log_file: config.log_path(),
        config_file: || Config::path().0,
    }
}

/// Answers the hostPath verbs. Only `mount` and `unmount` do work: the driver is not attachable
/// and not resizable, so the other verbs are consistently "Not supported".
pub(crate) fn handle(call: &Call, ctx: &Context) -> Result<Reply> {
    match call {
        Call::Mount { mount_dir, options } => mount(
            ctx,
            Front::FlexVolume,
            Path::new(mount_dir),
            &Options::parse(options)?,
        ),
        Call::Unmount { mount_dir } => unmount(ctx, Front::FlexVolume, Path::new(mount_dir)),
        _ => Ok(Reply::not_supported()),
    }
}

/// Which front end names the directory a volume is mounted on. Both run the same `mount` and
/// `unmount` below (one storage path, two front ends); only the directory's shape differs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Front {
    /// A FlexVolume verb: `<kubelet-root>/pods/<uid>/volumes/<vendor>~hostpath/<name>`, which
    /// kubelet creates before `mount`.
    FlexVolume,
    /// A CSI NodePublish/NodeUnpublish target path:
    /// `<kubelet-root>/pods/<uid>/volumes/kubernetes.io~csi/<name>/mount`, whose parent kubelet
    /// creates; the plugin creates the `mount` directory itself (CSI spec, NodePublishVolume).
    Csi,
}

/// The last component of a CSI target path.
const CSI_MOUNT: &str = "mount";
/// The plugin directory kubelet gives every CSI volume of a pod.
const CSI_PLUGIN_DIR: &str = "kubernetes.io~csi";

impl Front {
    /// The kubelet root `dir` lives under, when `dir` has this front end's shape.
    fn kubelet_root(self, dir: &Path) -> Option<PathBuf> {
        match self {
            Front::FlexVolume => super::kubelet_root(dir),
            Front::Csi => {
                if dir.file_name()? != CSI_MOUNT {
                    return None;
                }
                let parent = dir.parent()?;
                let root = super::kubelet_root(parent)?;
                let plugin = parent.parent()?.file_name()?;
                (plugin == CSI_PLUGIN_DIR).then_some(root)
            }
        }
    }

    fn shape(self) -> String {
        match self {
            Front::FlexVolume => format!(
                "kubelet's pod volume directories <kubelet-root>/pods/<pod-uid>/volumes/<vendor>~{}/<volume>",
                BACKEND.name()
            ),
            Front::Csi => format!(
                "kubelet's CSI target paths <kubelet-root>/pods/<pod-uid>/volumes/{CSI_PLUGIN_DIR}/<volume>/{CSI_MOUNT}"
            ),
        }
    }
}

/// CSI NodePublishVolume of a hostPath volume onto `target` (hostile, like everything the request
/// carries): the FlexVolume `mount` verb's checks and steps, for a target path of CSI's shape
/// ([`Front::Csi`]), whose last directory it creates (0750, root's) when kubelet has not.
pub(crate) fn publish(ctx: &Context, target: &Path, o: &Options) -> Result<Reply> {
    mount(ctx, Front::Csi, target, o)
}

/// CSI NodeUnpublishVolume: the FlexVolume `unmount` verb on a target path of CSI's shape. A
/// target that does not exist, or holds nothing of ours and no record, answers Success (CSI: an
/// unpublish of what was never published is OK). Then the target directory is removed, as CSI
/// asks of the plugin, only while it is an empty directory that is not a mount point (`rmdir`
/// through its parent opened without following a symlink: never a file, a symlink or a mount);
/// anything else there stays, and kubelet, which owns the pod's directories, deals with it.
pub(crate) fn unpublish(ctx: &Context, target: &Path) -> Result<Reply> {
    let reply = unmount(ctx, Front::Csi, target)?;
    super::remove_target(&pod_dir_path(Front::Csi, target)?);
    Ok(reply)
}

/// kubelet's HostPathType values (`type` option).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PathType {
    /// `""`: no check beyond existence.
    Unchecked,
    /// Create a directory (0755) if nothing exists.
    DirectoryOrCreate,
    /// Must be a directory.
    Directory,
    /// Create an empty file (0644) if nothing exists; the parent must exist.
    FileOrCreate,
    /// Must be a regular file.
    File,
    /// Must be a unix socket.
    Socket,
    /// Must be a character device.
    CharDevice,
    /// Must be a block device.
    BlockDevice,
}

impl PathType {
    fn parse(s: &str) -> std::result::Result<Self, OptionsError> {
        Ok(match s {
            "" => PathType::Unchecked,
            "DirectoryOrCreate" => PathType::DirectoryOrCreate,
            "Directory" => PathType::Directory,
            "FileOrCreate" => PathType::FileOrCreate,
            "File" => PathType::File,
            "Socket" => PathType::Socket,
            "CharDevice" => PathType::CharDevice,
            "BlockDevice" => PathType::BlockDevice,
            _ => {
                return Err(OptionsError::invalid(
                    "type",
                    s,
                    "expected one of \"\", DirectoryOrCreate, Directory, FileOrCreate, File, Socket, CharDevice, BlockDevice",
                ));
            }
        })
    }

    fn expected(self) -> Option<FileKind> {
        match self {
            PathType::Unchecked => None,
            PathType::DirectoryOrCreate | PathType::Directory => Some(FileKind::Directory),
            PathType::FileOrCreate | PathType::File => Some(FileKind::File),
            PathType::Socket => Some(FileKind::Socket),
            PathType::CharDevice => Some(FileKind::CharDevice),
            PathType::BlockDevice => Some(FileKind::BlockDevice),
        }
    }
}

/// Typed, validated hostPath options.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct HostPathOptions {
    /// The host path (with the expanded `pathPattern` appended, if any).
    pub(crate) path: PathBuf,
    /// The type check for `path` (for a pattern: of the base path).
    pub(crate) path_type: PathType,
    /// Whether `path` ends in a per-volume directory made from `pathPattern`.
    pub(crate) patterned: bool,
    /// The base path a pattern was appended to.
    pub(crate) base: PathBuf,
    /// Ownership and mode for what the driver creates.
    pub(crate) ownership: Ownership,
    /// Read-only bind.
    pub(crate) read_only: bool,
}

/// The options the hostPath backend reads (besides kubelet's own keys).
pub(crate) const OPTION_KEYS: &[&str] = &[
    "path",
    "type",
    "uid",
    "gid",
    "mode",
    "pathPattern",
    crate::node::capability::OPTION,
];

fn parse_id(o: &Options, key: &str) -> std::result::Result<Option<u32>, OptionsError> {
    o.non_empty(key)
        .map(|v| Ownership::parse_id(v).map_err(|why| OptionsError::invalid(key, v, why)))
        .transpose()
}

/// The `mode` option: octal permission bits only ([`Ownership::parse_mode`]). Set-uid, set-gid
/// and sticky bits are refused: a pod author must not be able to make the driver create a
/// set-gid directory (inherited group) or a sticky one on the node.
fn parse_mode(o: &Options) -> std::result::Result<Option<u32>, OptionsError> {
    o.non_empty("mode")
        .map(|v| Ownership::parse_mode(v).map_err(|why| OptionsError::invalid("mode", v, why)))
        .transpose()
}

/// Linux limits: a path of at most `PATH_MAX` (4096, with its NUL) bytes and components of at
/// most `NAME_MAX` (255) bytes. Checked before anything is created, so an over-long path cannot
/// leave a trail of directories behind.
pub(crate) const PATH_MAX: usize = 4096;
/// See [`PATH_MAX`].
pub(crate) const NAME_MAX: usize = 255;

/// A value short enough for a message (long paths are cut, never echoed whole).
fn abbreviated(v: &str) -> String {
    match v.char_indices().nth(80) {
        Some((i, _)) => format!("{}... ({} bytes)", &v[..i], v.len()),
        None => v.to_owned(),
    }
}

fn check_lengths(key: &str, p: &str) -> std::result::Result<(), OptionsError> {
    if p.len() >= PATH_MAX {
        return Err(OptionsError::invalid(
            key,
            &abbreviated(p),
            format!(
                "is {} bytes long; Linux paths are limited to {} bytes",
                p.len(),
                PATH_MAX - 1
            ),
        ));
    }
    if let Some(c) = p.split('/').find(|c| c.len() > NAME_MAX) {
        return Err(OptionsError::invalid(
            key,
            &abbreviated(p),
            format!(
                "has a {}-byte component ({}); Linux names are limited to {NAME_MAX} bytes",
                c.len(),
                abbreviated(c)
            ),
        ));
    }
    Ok(())
}

fn check_host_path(key: &str, p: &str) -> std::result::Result<(), OptionsError> {
    check_lengths(key, p)?;
    if !p.starts_with('/') {
        return Err(OptionsError::invalid(key, p, "must be an absolute path"));
    }
    if p.chars().any(|c| c.is_control()) {
        return Err(OptionsError::invalid(
            key,
            p,
            "must not contain control characters",
        ));
    }
    if paths::has_dotdot(Path::new(p)) {
        return Err(OptionsError::invalid(key, p, "must not contain \"..\""));
    }
    Ok(())
}

/// Expands `pathPattern` placeholders from the pod info kubelet sends with `mount`.
fn expand_pattern(pattern: &str, o: &Options) -> std::result::Result<PathBuf, OptionsError> {
    let bad = |reason: String| OptionsError::invalid("pathPattern", pattern, reason);
    let mut out = String::new();
    let mut rest = pattern;
    while let Some(start) = rest.find('{') {
        out.push_str(&rest[..start]);
        let end = rest[start..]
            .find('}')
            .ok_or_else(|| bad("unclosed \"{\"".into()))?
            + start;
        let name = &rest[start + 1..end];
        let key = match name {
            "namespace" => keys::POD_NAMESPACE,
            "pod" => keys::POD_NAME,
            "podUID" => keys::POD_UID,
            "volume" => keys::PV_OR_VOLUME_NAME,
            "serviceAccount" => keys::SERVICE_ACCOUNT,
            _ => {
                return Err(bad(format!(
                    "unknown placeholder {{{name}}}; use {{namespace}}, {{pod}}, {{podUID}}, {{volume}} or {{serviceAccount}}"
                )));
            }
        };
        let value = o.non_empty(key).ok_or_else(|| {
            bad(format!(
                "{{{name}}} needs {key}, which kubelet did not send"
            ))
        })?;
        if value.contains('/')
            || value == "."
            || value == ".."
            || value.chars().any(|c| c.is_control())
        {
            return Err(bad(format!(
                "{{{name}}} expands to {value:?}, which is not a single path component"
            )));
        }
        out.push_str(value);
        rest = &rest[end + 1..];
    }
    out.push_str(rest);
    if out.starts_with('/') || out.is_empty() {
        return Err(bad("must be a relative path below \"path\"".into()));
    }
    if out
        .split('/')
        .any(|c| c.is_empty() || c == "." || c == "..")
    {
        return Err(bad(format!(
            "expands to {out:?}, which has an empty, \".\" or \"..\" component"
        )));
    }
    Ok(PathBuf::from(out))
}

impl HostPathOptions {
    /// Validates the options of a `mount` call. An option the driver does not know (a typo such
    /// as `mdoe`, or `readOnly`, which kubelet sets as `kubernetes.io/readwrite`) is refused by
    /// name, as the NFS and LVM drivers do: a PV with a misspelt key stops mounting, loudly,
    /// instead of mounting something other than what its author meant.
    pub fn parse(o: &Options) -> std::result::Result<Self, OptionsError> {
        if let Some(k) = o
            .plain()
            .keys()
            .find(|k| !k.starts_with("kubernetes.io/") && !OPTION_KEYS.contains(&k.as_str()))
        {
            return Err(OptionsError::unknown(
                k,
                format!(
                    "unknown hostPath option; the options are {} (see drivers/hostpath/README.md); a read-only mount is the volume's readOnly: true, not an option",
                    OPTION_KEYS.join(", ")
                ),
            ));
        }
        let base = o.require("path", "set options.path to an absolute host path")?;
        check_host_path("path", base)?;
        let path_type = PathType::parse(o.get("type").unwrap_or(""))?;
        let mode = parse_mode(o)?;
        let ownership = Ownership {
            uid: parse_id(o, "uid")?,
            gid: parse_id(o, "gid")?,
            mode,
        };
        let (path, patterned) = match o.non_empty("pathPattern") {
            Some(p) => {
                if !matches!(
                    path_type,
                    PathType::Unchecked | PathType::Directory | PathType::DirectoryOrCreate
                ) {
                    return Err(OptionsError::invalid(
                        "type",
                        o.get("type").unwrap_or(""),
                        "pathPattern needs a directory type (\"\", Directory or DirectoryOrCreate)",
                    ));
                }
                (Path::new(base).join(expand_pattern(p, o)?), true)
            }
            None => (PathBuf::from(base), false),
        };
        if patterned {
            // The expanded pattern adds to the length: check the whole path before creating.
            check_lengths("pathPattern", &path.to_string_lossy())?;
        }
        Ok(Self {
            path,
            path_type,
            patterned,
            base: PathBuf::from(base),
            ownership,
            read_only: o.read_only()?,
        })
    }
}

/// What a source inside a provisioning root `root` must be to be served: the volume directory of
/// a PV, named exactly as the PV does (`type: Directory`, no `pathPattern`, an existing directory
/// reached without a symlink, so nothing is ever created inside a root), for the PV the
/// provisioner made it for: a valid [`capability::OPTION`] for this PV and path, or a legacy
/// grant for this path, PV name and namespace ([`capability::authorize`]). Only here is the node
/// key read. `existing`/`missing`: the source as [`paths::resolve_existing`] split it.
///
/// [`capability::OPTION`]: crate::node::capability::OPTION
/// [`capability::authorize`]: crate::node::capability::authorize
fn authorize_provisioned(
    ctx: &Context,
    opts: &HostPathOptions,
    o: &Options,
    root: &Path,
    existing: &Path,
    missing: &[std::ffi::OsString],
) -> Result<()> {
    use crate::node::capability::{self, Key, Location};
    let given = o.get("path").unwrap_or_default();
    let refuse = |why: &str| {
        Error::refused(format!(
            "host path {} is refused: it is inside {}, a root where flexvol provisioner makes each claim's volume, and {why}; to use a provisioned volume, use its PersistentVolumeClaim",
            opts.path.display(),
            root.display()
        ))
    };
    if opts.patterned {
        return Err(refuse("pathPattern is not served there"));
    }
    if opts.path_type != PathType::Directory {
        return Err(refuse(
            "only a volume directory with type Directory is served there (nothing is created or mounted as a file inside a root)",
        ));
    }
    if !missing.is_empty() {
        return Err(refuse("it does not exist"));
    }
    if paths::normalized(existing) != paths::normalized(Path::new(given)) {
        return Err(refuse("it is named through a symlink"));
    }
    let key = Key::load(
        &capability::node_key_path(&ctx.config.state_dir),
        "flexvol provisioner creates it when it provisions a volume on this node",
    );
    capability::authorize(
        key.as_ref(),
        &ctx.config.state_dir,
        &Location::HostPath(given),
        Some(o.get(keys::PV_OR_VOLUME_NAME).unwrap_or_default()),
        Some(o.get(keys::POD_NAMESPACE).unwrap_or_default()),
        o.non_empty(capability::OPTION),
    )
    .map(|_| ())
    .map_err(Error::refused)
}

fn nix_io(what: &'static str, path: &Path, e: nix::Error) -> Error {
    Error::io(what, path, std::io::Error::from(e))
}

/// A pod volume directory of kubelet's shape, `<kubelet-root>/pods/<uid>/volumes/<vendor>~hostpath/<name>`,
/// reached without a symlink below the kubelet root.
struct PodDir {
    /// Canonical path (the kubelet root resolved, the five components below it as given).
    path: PathBuf,
    /// What is there now: whether it is a mount point, and of what.
    state: PathState,
}

/// Checks that `dir` is a pod volume directory of this driver, in kubelet's shape, and returns
/// the path to act on: the kubelet root resolved (it may be a symlink, e.g. `/var/lib/kubelet`
/// -> `/data/kubelet`), the five components below it as given. Anything else is refused: the
/// verbs never act on a directory kubelet did not give this driver. Looks at nothing below the
/// root; [`open_pod_dir`] does, under the volume's lock.
fn pod_dir_path(front: Front, dir: &Path) -> Result<PathBuf> {
    let refuse = |why: &str| {
        Error::refused(format!(
            "mount directory {:?} {why}; flexvol only acts on {}",
            dir.display().to_string(),
            front.shape()
        ))
    };
    if !dir.is_absolute() || paths::has_dotdot(dir) {
        return Err(refuse("must be an absolute path without \"..\""));
    }
    if dir.starts_with("/proc") {
        return Err(refuse("is below /proc"));
    }
    let Some(root) = front.kubelet_root(dir) else {
        return Err(refuse("is not a pod volume directory"));
    };
    let below = dir.strip_prefix(&root).unwrap_or(dir);
    let plugin = below.components().nth(3).map(|c| c.as_os_str());
    let suffix = format!("~{}", BACKEND.name());
    if front == Front::FlexVolume
        && !plugin.is_some_and(|p| {
            let p = p.to_string_lossy();
            p.len() > suffix.len() && p.ends_with(&suffix)
        })
    {
        return Err(refuse("is not a volume directory of this driver"));
    }
    let canonical =
        paths::canonical_as_named(&root).map_or_else(|| std::fs::canonicalize(&root), Ok);
    let root = match canonical {
        Ok(r) => r,
        // No kubelet root, no pod directory: callers find it missing.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(dir.to_owned()),
        Err(e) => return Err(Error::io("resolve", &root, e)),
    };
    if root.starts_with("/proc") {
        return Err(refuse("resolves below /proc"));
    }
    Ok(root.join(below))
}

/// Opens the pod directory [`pod_dir_path`] returned, refusing a symlink anywhere below the
/// (resolved) kubelet root; `None` when it does not exist. `opened`: the descriptor of `path`
/// that [`guard_unless_local`] opened under the same lock, the way this would open it (`O_PATH`,
/// `RESOLVE_NO_SYMLINKS`), when it did: used instead of a second lookup.
fn open_pod_dir(path: &Path, opened: Option<OwnedFd>) -> Result<Option<PodDir>> {
    // RESOLVE_NO_SYMLINKS fails on any symlink on the way.
    let fd = match opened.map_or_else(|| paths::open_nofollow(path), Ok) {
        Ok(fd) => fd,
        Err(nix::Error::ENOENT) => return Ok(None),
        Err(nix::Error::ELOOP) => {
            return Err(Error::refused(format!(
                "mount directory {} goes through a symlink; flexvol never acts through one",
                path.display()
            )));
        }
        Err(e) => return Err(nix_io("open", path, e)),
    };
    let state = fd_state(&fd, path)?;
    if state.kind != FileKind::Directory {
        return Err(Error::refused(format!(
            "mount directory {} is not a directory",
            path.display()
        )));
    }
    Ok(Some(PodDir {
        path: path.to_owned(),
        state,
    }))
}

/// The source identity kept in a record (`extra.sourceId`), or for a record without one (written
/// by an older version) the identity of its source path as it is now.
fn recorded_source_id(r: &VolumeRecord) -> Option<FileId> {
    if let Some(id) = r.extra.get(SOURCE_ID).and_then(|v| FileId::decode(v)) {
        return Some(id);
    }
    let fd = paths::open_nofollow(Path::new(&r.source)).ok()?;
    fd_id(&fd).ok()
}

/// `extra` key of a record: the source's `major:minor:inode`, which a bind of it shows at its
/// mount point.
const SOURCE_ID: &str = "sourceId";

/// `mount <podDir> <json>`.
fn mount(ctx: &Context, front: Front, pod_dir: &Path, o: &Options) -> Result<Reply> {
    let opts = HostPathOptions::parse(o)?;
    let pod_dir = pod_dir_path(front, pod_dir)?;
    let kubelet_root = front.kubelet_root(&pod_dir);
    // The source, and the allowed roots the policy check resolves.
    let roots = ctx.config.hostpath.roots();
    let mut touched = vec![opts.path.as_path()];
    if opts.patterned {
        touched.push(&opts.base);
    }
    touched.extend(roots.iter().map(PathBuf::as_path));
    // Under the lock: the probe opens the pod directory, which a concurrent unmount would find
    // busy. The option paths are looked up here, before the policy check: from the dentry cache
    // only, read-only, following symlinks, and the answer decides nothing but whether the guard
    // starts. What that leaves: a pod that can write into an allowed root could swap a symlink
    // between this probe and the real lookup, towards a dead NFS mount already on the node; its
    // own call would then wait unguarded, as kubelet's own calls into that mount would. A hang of
    // the caller's own volume, never access: the policy check below sees the path as it is then.
    let _lock = ctx.lock(BACKEND, &pod_dir.to_string_lossy())?;
    let (_, probed) = guard_unless_local(&pod_dir, &touched);
    match front {
        // A refused publish leaves nothing it created: the empty target directory goes again.
        Front::Csi => super::CreatedTarget::around(&pod_dir, || {
            mount_locked(ctx, &opts, &pod_dir, kubelet_root, o, probed)
        }),
        Front::FlexVolume => mount_locked(ctx, &opts, &pod_dir, kubelet_root, o, probed),
    }
}

/// `mount`'s work under the target's lock. `probed`: what [`guard_unless_local`] opened of the
/// pod directory and the source (`opts.path`) under this lock.
fn mount_locked(
    ctx: &Context,
    opts: &HostPathOptions,
    pod_dir: &Path,
    kubelet_root: Option<PathBuf>,
    o: &Options,
    probed: Probed,
) -> Result<Reply> {
    let pod_dir = pod_dir.to_path_buf();
    // Under the lock: what is mounted there now, not what was before waiting.
    let pod = open_pod_dir(&pod_dir, probed.pod_dir)?.ok_or_else(|| {
        Error::refused(format!(
            "mount directory {} does not exist (kubelet creates it before calling mount)",
            pod_dir.display()
        ))
    })?;

    // Resolve and check policy before creating anything. The probe's descriptor of the source
    // only says that it was reached without a symlink just now; what is mounted is opened again
    // below, after the policy check and the creation.
    let (existing, missing) = paths::resolve_existing_opened(&opts.path, probed.first.is_some())
        .map_err(|e| Error::io("resolve host path", &opts.path, e))?;
    drop(probed.first);
    let resolved = paths::joined(&existing, &missing);
    let Served { root, provisioning } =
        check_policy(&node(ctx.config), &resolved, kubelet_root.clone())?;
    if provisioning {
        authorize_provisioned(ctx, opts, o, &root, &existing, &missing)?;
    }
    // fsGroup only for a provisioned volume, proved by its token or legacy grant just now; a
    // static or inline hostPath keeps the ownership the node gave it (a recursive chown there
    // would hand host files to the pod's group).
    let fs_group = if provisioning && !opts.read_only {
        o.fs_group()?
    } else {
        None
    };
    if opts.patterned {
        let (base_real, base_missing) = paths::resolve_existing(&opts.base)
            .map_err(|e| Error::io("resolve host path", &opts.base, e))?;
        if !base_missing.is_empty() && opts.path_type != PathType::DirectoryOrCreate {
            return Err(Error::refused(format!(
                "host path {} does not exist; create it, or use type DirectoryOrCreate",
                opts.base.display()
            )));
        }
        check_policy(
            &node(ctx.config),
            &paths::joined(&base_real, &base_missing),
            kubelet_root.clone(),
        )?;
    }

    let state = ctx.state(BACKEND);
    let record = state.load(&pod_dir)?;

    // Create what the type asks for, once the pod directory is known to take it: a Failure must
    // leave nothing created.
    if !missing.is_empty() {
        let creating = match opts.path_type {
            _ if opts.patterned => FileKind::Directory,
            PathType::DirectoryOrCreate => FileKind::Directory,
            PathType::FileOrCreate if missing.len() == 1 => FileKind::File,
            PathType::FileOrCreate => {
                return Err(Error::refused(format!(
                    "host path {}: its parent directory {} does not exist (FileOrCreate does not create parents, as in Kubernetes)",
                    opts.path.display(),
                    resolved.parent().unwrap_or(Path::new("/")).display()
                )));
            }
            _ => {
                return Err(Error::refused(format!(
                    "host path {} does not exist; create it on the node, or use type DirectoryOrCreate/FileOrCreate",
                    opts.path.display()
                )));
            }
        };
        let mount_point = mount_point_for(&pod_dir, &resolved, creating)?;
        // A source that does not exist yet cannot be what is mounted there.
        target_holds(&pod, &mount_point, &resolved, None, record.as_ref())?;
        if creating == FileKind::Directory {
            // The serving root and anything above it belong to the node: created root-owned
            // 0755, so the first pod cannot hand the shared root its own uid or mode 0777.
            let node_owned = (1..=missing.len())
                .take_while(|&k| root.starts_with(paths::joined(&existing, &missing[..k])))
                .count();
            paths::create_dirs(&existing, &missing[..node_owned], Ownership::default())
                .map_err(|e| nix_io("create", &resolved, e))?;
            let below = paths::joined(&existing, &missing[..node_owned]);
            paths::create_dirs(&below, &missing[node_owned..], opts.ownership)
                .map_err(|e| nix_io("create", &resolved, e))?;
        } else {
            paths::create_file(&existing, &missing[0], opts.ownership)
                .map_err(|e| nix_io("create", &resolved, e))?;
        }
    }

    crate::sys::process::checkpoint("hostpath-mount-after-create");

    // Pin the source and check its type.
    let fd = paths::open_nofollow(&resolved).map_err(|e| match e {
        nix::Error::ELOOP | nix::Error::EXDEV | nix::Error::EAGAIN => Error::refused(format!(
            "host path {} changed while it was being checked (a symlink appeared); refusing it",
            resolved.display()
        )),
        e => nix_io("open", &resolved, e),
    })?;
    let (kind, source_id) = fd_kind_id(&fd)?;
    // The policy's device rule again, on the pinned inode (the path may have been swapped).
    check_device_source(&resolved, kind)?;
    if let Some(want) = opts.path_type.expected()
        && want != kind
    {
        return Err(Error::refused(format!(
            "host path {} is {}, but type {:?} needs {}",
            resolved.display(),
            kind.describe(),
            opts.path_type,
            want.describe()
        )));
    }

    // Before the bind: a walk that fails leaves nothing mounted, and the root unchanged.
    let mut note = None;
    if let Some(gid) = fs_group {
        let dir = crate::sys::dirfd::open_child_dir(&fd, ".")
            .map_err(|e| nix_io("open", &resolved, e))?;
        note = super::apply_fs_group(&dir, gid, &ctx.deadline, &resolved)?;
    }

    // Where the bind goes: the pod dir itself, or a same-named file inside it.
    let mount_point = mount_point_for(&pod_dir, &resolved, kind)?;
    let file_like = mount_point != pod_dir;
    if let Some(reply) = already_mounted(
        ctx,
        &pod,
        &mount_point,
        &resolved,
        source_id,
        record.as_ref(),
        opts.read_only,
    )? {
        return Ok(reply);
    }
    let new_record = VolumeRecord {
        mount_point: file_like.then(|| mount_point.clone()),
        extra: BTreeMap::from([
            ("type".to_owned(), format!("{:?}", opts.path_type)),
            (SOURCE_ID.to_owned(), source_id.encode()),
        ]),
        ..crate::backend::record(
            BACKEND,
            "mount",
            &pod_dir,
            resolved.to_string_lossy().into_owned(),
            opts.read_only,
            Some(o),
        )
    };
    state.save(&new_record)?;
    // The placeholder comes after the record, so an unmount after a crash here still finds and
    // removes it (kubelet cannot remove a pod directory that is not empty).
    if file_like {
        let name = mount_point.file_name().unwrap_or_default();
        paths::create_file(&pod_dir, name, Ownership::default())
            .map_err(|e| nix_io("create mount point", &mount_point, e))?;
        crate::sys::process::checkpoint("hostpath-mount-after-placeholder");
    }

    crate::sys::process::checkpoint("hostpath-mount-before-bind");
    if let Err(e) = ctx
        .mounter
        .bind(&paths::fd_path(&fd), &mount_point, opts.read_only)
    {
        // Leave nothing behind that would keep kubelet from removing the pod directory.
        if file_like
            && path_state(&mount_point)
                .ok()
                .flatten()
                .is_some_and(|p| !p.mount_root && p.kind == FileKind::File && p.size == 0)
        {
            let _ = std::fs::remove_file(&mount_point);
        }
        let _ = state.remove(&pod_dir);
        return Err(e.into());
    }
    crate::sys::process::checkpoint("hostpath-mount-after-bind");
    Ok(match note {
        Some(n) => Reply::success().with_message(n),
        None => Reply::success(),
    })
}

/// Starts the guard thread unless the pod directory and `paths` (everything of the volume's that
/// this call may touch) are on the filesystem that holds the pod directory's parent, kubelet's
/// own; see `sys::process`, "When the guard thread runs". Returns that filesystem's device
/// (`None` when unknown or the guard already runs), so that paths met later in the same call are
/// judged with `sys::process::guard_unless_on` without probing these again, and what the probes
/// of the pod directory and of the first of `paths` opened ([`Probed`]). Caller contract: call
/// it before touching any of them.
fn guard_unless_local(pod_dir: &Path, paths: &[&Path]) -> (Option<u64>, Probed) {
    use crate::sys::process;
    if process::guarded() {
        return (None, Probed::default());
    }
    let local = pod_dir.parent().and_then(paths::cached_device);
    let (pod_dev, pod_fd) = paths::cached_device_nofollow(pod_dir);
    let (first_dev, first) = match paths.first() {
        Some(&p) if p != pod_dir => paths::cached_device_nofollow(p),
        _ => (local, None),
    };
    let mut rest: Vec<&Path> = Vec::with_capacity(paths.len());
    for &p in paths.iter().skip(1) {
        if p != pod_dir && Some(&p) != paths.first() && !rest.contains(&p) {
            rest.push(p);
        }
    }
    // Probed here, judged there: a pod directory or first path off `local` makes it unknown.
    let judged = local.filter(|&l| pod_dev == Some(l) && first_dev == Some(l));
    process::guard_unless_on(judged, &rest);
    (
        local,
        Probed {
            pod_dir: pod_fd,
            first,
        },
    )
}

/// What [`guard_unless_local`]'s probes opened, each only when the dentry cache reached it
/// without any symlink (`O_PATH`, as [`paths::open_nofollow`] opens): the pod directory, and the
/// first path it was given (`mount`'s source, as named in the options).
#[derive(Default)]
struct Probed {
    pod_dir: Option<OwnedFd>,
    first: Option<OwnedFd>,
}

/// Where a source of `kind` is bound: the pod directory itself for a directory, else a file of
/// the source's name inside it.
fn mount_point_for(pod_dir: &Path, source: &Path, kind: FileKind) -> Result<PathBuf> {
    if kind == FileKind::Directory {
        return Ok(pod_dir.to_owned());
    }
    let name = source
        .file_name()
        .ok_or_else(|| Error::refused("host path has no file name"))?;
    Ok(pod_dir.join(name))
}

/// Whether what is at the pod directory lets `source` be mounted at `mount_point`: `Ok(None)`
/// when nothing of it is there yet, `Ok(Some(state))` when that source is already mounted there
/// (`id` known), a Failure when the pod directory holds something else: another volume's record,
/// a mount of something else, a directory volume when a file is to go inside it (the placeholder
/// would land in that volume's source), or files a directory bind would hide.
fn target_holds(
    pod: &PodDir,
    mount_point: &Path,
    source: &Path,
    id: Option<FileId>,
    record: Option<&VolumeRecord>,
) -> Result<Option<PathState>> {
    let pod_dir = &pod.path;
    if let Some(r) = record
        && (Path::new(&r.source) != source || r.mount_point() != mount_point)
    {
        return Err(Error::occupied(format!(
            "{} already holds another volume ({} at {}); unmount it first",
            pod_dir.display(),
            r.source,
            r.mount_point().display()
        )));
    }
    let foreign = |at: &Path, st: &PathState| crate::backend::foreign_mount(at, &st.id);
    if mount_point == pod_dir.as_path() {
        if pod.state.mount_root {
            return match id {
                Some(id) if id == pod.state.id => Ok(Some(pod.state)),
                _ => Err(foreign(pod_dir, &pod.state)),
            };
        }
        if let Some(name) =
            paths::first_entry(pod_dir).map_err(|e| Error::io("read", pod_dir.as_path(), e))?
        {
            return Err(Error::occupied(format!(
                "{} is not empty (it holds {:?}), so a directory volume would hide what is in it; unmount the volume that is there first",
                pod_dir.display(),
                name
            )));
        }
        return Ok(None);
    }
    if pod.state.mount_root {
        return Err(Error::occupied(format!(
            "{} is a mount point ({}), so {} cannot be placed in it; unmount what is there first",
            pod_dir.display(),
            pod.state.id,
            mount_point.display()
        )));
    }
    match path_state(mount_point)? {
        None => Ok(None),
        Some(st) if st.mount_root => match id {
            Some(id) if id == st.id => Ok(Some(st)),
            _ => Err(foreign(mount_point, &st)),
        },
        // Our own placeholder, left by a crash: the record says so.
        Some(st) if record.is_some() && st.kind == FileKind::File && st.size == 0 => Ok(None),
        Some(_) => Err(Error::occupied(format!(
            "{} already exists and was not made by flexvol; remove it or unmount what is in {} first",
            mount_point.display(),
            pod_dir.display()
        ))),
    }
}

/// Decides what the pod directory means for a new mount of `source`: `None` to go ahead, Success
/// when exactly this is already mounted with the requested access, a Failure otherwise. The
/// record and the mount never disagree: a read-only request on a read-write mount (or the
/// reverse) is refused, except for finishing a read-only mount that a crash left writable,
/// which its record proves.
fn already_mounted(
    ctx: &Context,
    pod: &PodDir,
    mount_point: &Path,
    source: &Path,
    id: FileId,
    record: Option<&VolumeRecord>,
    read_only: bool,
) -> Result<Option<Reply>> {
    let Some(_) = target_holds(pod, mount_point, source, Some(id), record)? else {
        return Ok(None);
    };
    let access = |ro: bool| if ro { "read-only" } else { "read-write" };
    let have = match record {
        Some(r) => r.read_only,
        None => reads_read_only(mount_point),
    };
    if have != read_only {
        return Err(Error::occupied(format!(
            "{} is already mounted {} from {} but {} was asked; unmount it first",
            mount_point.display(),
            access(have),
            source.display(),
            access(read_only)
        )));
    }
    // Finish what a crash may have interrupted: the bind made a slave, then read-only.
    ctx.mounter.make_slave(mount_point)?;
    if read_only {
        ctx.mounter.remount_readonly(mount_point)?;
    }
    if record.is_none() {
        // The record was lost (state directory wiped): write it again from the mount.
        let file_like = mount_point != pod.path;
        ctx.state(BACKEND).save(&VolumeRecord {
            mount_point: file_like.then(|| mount_point.to_owned()),
            extra: BTreeMap::from([(SOURCE_ID.to_owned(), id.encode())]),
            ..crate::backend::record(
                BACKEND,
                "mount",
                &pod.path,
                source.to_string_lossy().into_owned(),
                read_only,
                None,
            )
        })?;
    }
    Ok(Some(Reply::success()))
}

/// At most this many mounts are peeled off one mount point (stacked binds of an older,
/// non-idempotent driver).
const MAX_LAYERS: usize = 16;

/// `unmount <podDir>`.
///
/// What is undone: with a record, the bind at its mount point, and only while that mount shows
/// the recorded source (device and inode, one `statx`); a mount of anything else there is left
/// alone and reported. Without a record (state lost), the bind at the pod directory, or, when
/// that is not a mount point, the file-like binds directly inside it, each only when it can be a
/// bind this driver made ([`check_unrecorded`]; otherwise Failure and nothing is unmounted).
/// Mounts that propagated into a bind (a shared source, or a
/// bind made by an older version) are detached with it, never unmounted on their own, so the
/// host's originals stay; the bind is made a slave first so nothing propagates back.
fn unmount(ctx: &Context, front: Front, pod_dir: &Path) -> Result<Reply> {
    let state = ctx.state(BACKEND);
    let pod_dir = pod_dir_path(front, pod_dir)?;
    // Under the lock: the probe opens the pod directory, which a concurrent unmount would find
    // busy. What is mounted there shows its own filesystem at the pod directory.
    let _lock = ctx.lock(BACKEND, &pod_dir.to_string_lossy())?;
    let (local, probed) = guard_unless_local(&pod_dir, &[]);
    let Some(pod) = open_pod_dir(&pod_dir, probed.pod_dir)? else {
        // Already gone: nothing can be mounted there. Forget any record of it.
        state.remove(&pod_dir)?;
        return Ok(Reply::success());
    };
    let record = state.load(&pod_dir)?;

    let points: Vec<(PathBuf, Option<FileId>)> = match &record {
        Some(r) => {
            // A file-like volume's bind inside the pod directory, and a source an older
            // version's record makes us open (the pod directory was judged above).
            let mut touched = Vec::new();
            if r.mount_point() != pod_dir {
                touched.push(r.mount_point());
            }
            if !r.extra.contains_key(SOURCE_ID) {
                touched.push(Path::new(&r.source));
            }
            crate::sys::process::guard_unless_on(local, &touched);
            vec![(r.mount_point().to_owned(), recorded_source_id(r))]
        }
        None if pod.state.mount_root => vec![(pod_dir.clone(), None)],
        None => {
            // No record: whatever is bound inside is unknown until it is looked at.
            crate::sys::process::start_guards();
            file_binds_in(&pod_dir)?
                .into_iter()
                .map(|p| (p, None))
                .collect()
        }
    };
    if record.is_none() {
        check_unrecorded(ctx, front, &pod_dir, &points)?;
    }
    for (p, id) in &points {
        unmount_ours(ctx, p, *id)?;
    }

    crate::sys::process::checkpoint("hostpath-unmount-after-unmount");

    // Remove the empty placeholder file a file-like volume was bound onto, so kubelet can rmdir
    // the pod directory. Only an empty regular file on the pod directory's own filesystem, which
    // is not a mount point any more, can be it: never the source.
    for (p, _) in points.iter().filter(|(p, _)| *p != pod_dir) {
        match path_state(p)? {
            Some(st) if st.mount_root => {
                return Err(Error::refused(format!(
                    "{} is still mounted after unmount; retry",
                    p.display()
                )));
            }
            Some(st)
                if st.kind == FileKind::File
                    && st.size == 0
                    && (st.id.major, st.id.minor) == (pod.state.id.major, pod.state.id.minor) =>
            {
                match std::fs::remove_file(p) {
                    Ok(()) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => return Err(Error::io("remove mount point", p, e)),
                }
            }
            _ => {}
        }
    }
    crate::sys::process::checkpoint("hostpath-unmount-before-forget");
    state.remove(&pod_dir)?;
    Ok(Reply::success())
}

/// The file-like binds directly inside a pod directory that is not itself a mount point: entries
/// that are mount points and not directories (a symlink or plain file is never one).
fn file_binds_in(pod_dir: &Path) -> Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    let rd = match std::fs::read_dir(pod_dir) {
        Ok(rd) => rd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
        Err(e) => return Err(Error::io("read", pod_dir, e)),
    };
    for e in rd {
        let p = pod_dir.join(e.map_err(|e| Error::io("read", pod_dir, e))?.file_name());
        if path_state(&p)?.is_some_and(|st| st.mount_root && st.kind != FileKind::Directory) {
            out.push(p);
        }
    }
    Ok(out)
}

/// Without a record, refuses (before anything is unmounted) when a mount at one of `points`
/// cannot be a bind this driver made: one whose source lies under an allowed hostPath root or a
/// provisioner root. Reads the mount table once, and only when something is mounted there.
fn check_unrecorded(
    ctx: &Context,
    front: Front,
    pod_dir: &Path,
    points: &[(PathBuf, Option<FileId>)],
) -> Result<()> {
    let mut mounted = Vec::new();
    for (p, _) in points {
        if let Some(st) = path_state(p)?.filter(|st| st.mount_root) {
            mounted.push((p, st));
        }
    }
    if mounted.is_empty() {
        return Ok(());
    }
    let table = crate::sys::mountinfo::MountTable::read().map_err(MountError::from)?;
    let mut roots = ctx.config.hostpath.roots();
    roots.extend(ctx.config.local_path.all_roots());
    roots.extend(ctx.config.hostpath.ephemeral_roots());
    let kubelet = front.kubelet_root(pod_dir);
    let sources = bindable_sources(&table, &roots, kubelet.as_deref());
    for (p, st) in mounted {
        let m = table
            .entries
            .iter()
            .find(|e| u64::from(e.id) == st.mnt_id)
            .or_else(|| table.at(p));
        let Some(m) = m else {
            return Err(Error::refused(format!(
                "{} is a mount point that is not in the mount table and there is no record of a volume there; it is left alone. Unmount it by hand if it is stale",
                p.display()
            )));
        };
        let ours = sources
            .iter()
            .any(|(maj, min, dir)| (m.major, m.minor) == (*maj, *min) && m.root.starts_with(dir));
        if !ours {
            return Err(Error::refused(format!(
                "{} has a mount flexvol did not make ({} {:?}, directory {} of device {}:{}) and there is no record of a volume there: it is not a bind of a path under an allowed hostPath root ({}) or a provisioner root, so it is left alone. Unmount it by hand if it is stale",
                p.display(),
                m.fs_type,
                m.source,
                m.root.display(),
                m.major,
                m.minor,
                ctx.config
                    .hostpath
                    .roots()
                    .iter()
                    .map(|r| r.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            )));
        }
    }
    Ok(())
}

/// Where the data under `roots` lives, as (device, directory within it): each root, and every
/// mount below a root (a volume may name a path on a filesystem mounted inside a root), except
/// mounts below the kubelet root (pod volumes are never a source). A bind shows one of these, or
/// a directory below one, exactly when its source is under a root.
fn bindable_sources(
    table: &crate::sys::mountinfo::MountTable,
    roots: &[PathBuf],
    kubelet: Option<&Path>,
) -> Vec<(u32, u32, PathBuf)> {
    let mut out = Vec::new();
    for r in roots {
        let Ok(real) = std::fs::canonicalize(r) else {
            continue; // a root that does not exist holds no source
        };
        out.extend(table.locate(&real));
        for m in table.below(&real) {
            if kubelet.is_some_and(|k| m.mount_point.starts_with(k)) {
                continue;
            }
            out.push((m.major, m.minor, m.root.clone()));
        }
    }
    out
}

/// Unmounts the bind(s) at `at` while they show `id` (or, without one, what the first shows).
/// A mount that shows anything else is left alone: Failure.
fn unmount_ours(ctx: &Context, at: &Path, id: Option<FileId>) -> Result<()> {
    let mut id = id;
    for _ in 0..MAX_LAYERS {
        let Some(st) = path_state(at)?.filter(|st| st.mount_root) else {
            return Ok(());
        };
        let want = *id.get_or_insert(st.id);
        if st.id != want {
            return Err(Error::refused(format!(
                "{} has a mount flexvol did not make ({}, not the volume's source, {}); it is left alone. Unmount it by hand if it is stale",
                at.display(),
                st.id,
                want
            )));
        }
        match ctx.mounter.unmount(at, UnmountMode::Normal) {
            Ok(_) => {}
            Err(e) if crate::backend::is_busy(&e) => detach_if_propagated(ctx, at, &st)?,
            Err(e) => return Err(e.into()),
        }
    }
    Err(Error::refused(format!(
        "{} still has mounts after {MAX_LAYERS} unmounts; unmount them by hand",
        at.display()
    )))
}

/// A bind that is busy: either a process uses it (Failure, kubelet retries), or mounts have
/// propagated into it from its source. Those are copies inside our bind; detaching the bind
/// removes them with it, in this namespace only, once the bind is a slave (so the unmount of the
/// copies cannot propagate to the source's own mounts).
fn detach_if_propagated(ctx: &Context, at: &Path, st: &PathState) -> Result<()> {
    if !crate::sys::mountinfo::has_children(st.mnt_id).map_err(MountError::from)? {
        return Err(crate::backend::busy(at));
    }
    ctx.mounter.make_slave(at)?;
    ctx.mounter.unmount(at, UnmountMode::Detach)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(json: &str) -> std::result::Result<HostPathOptions, OptionsError> {
        HostPathOptions::parse(&Options::parse(json).unwrap())
    }

    /// Issue #33, 4: an option the driver does not know is refused by name (its value never
    /// shown), where it used to be ignored: `{"readOnly":"true","mdoe":"0700"}` mounted a
    /// read-write 0755 directory. kubelet's own keys (`kubernetes.io/...`) and the documented ones
    /// pass.
    #[test]
    fn unknown_options_are_refused_by_name() {
        for (json, key) in [
            (r#"{"path":"/srv/flexvol/x","mdoe":"0700"}"#, "mdoe"),
            (r#"{"path":"/srv/flexvol/x","readOnly":"true"}"#, "readOnly"),
            (r#"{"path":"/srv/flexvol/x","Path":"/etc"}"#, "Path"),
        ] {
            let e = opts(json).unwrap_err().to_string();
            assert!(
                e.contains(key) && e.contains("unknown hostPath option"),
                "{e}"
            );
            assert!(
                !e.contains("0700") && !e.contains("/etc"),
                "a value is never echoed: {e}"
            );
        }
        opts(
            r#"{"path":"/srv/flexvol/x","type":"DirectoryOrCreate","uid":"1","gid":"2","mode":"0750","kubernetes.io/pod.name":"p","kubernetes.io/readwrite":"ro","kubernetes.io/fsType":"","kubernetes.io/pvOrVolumeName":"v"}"#,
        )
        .unwrap();
    }

    #[test]
    fn option_validation() {
        let o = opts(r#"{"path":"/srv/a","type":"DirectoryOrCreate","uid":"1000","gid":"2000","mode":"0750","kubernetes.io/readwrite":"ro"}"#).unwrap();
        assert_eq!(o.path, Path::new("/srv/a"));
        assert_eq!(
            o.ownership,
            Ownership {
                uid: Some(1000),
                gid: Some(2000),
                mode: Some(0o750)
            }
        );
        assert!(o.read_only);
        for bad in [
            r#"{}"#,
            r#"{"path":""}"#,
            r#"{"path":"srv/a"}"#,
            r#"{"path":"/srv/../etc"}"#,
            r#"{"path":"/srv/a\u0000b"}"#,
            r#"{"path":"/srv/a","type":"Dir"}"#,
            r#"{"path":"/srv/a","mode":"0999"}"#,
            r#"{"path":"/srv/a","mode":"17777"}"#,
            r#"{"path":"/srv/a","uid":"-1"}"#,
            r#"{"path":"/srv/a","uid":"root"}"#,
            r#"{"path":"/srv/a","uid":"4294967295"}"#,
            r#"{"path":"/srv/a","gid":"4294967295"}"#,
            r#"{"path":"/srv/a","uid":"4294967296"}"#,
            r#"{"path":"/srv/a","mode":"+755"}"#,
            r#"{"path":"/srv/a","mode":"-755"}"#,
            r#"{"path":"/srv/a","mode":"04755"}"#,
            r#"{"path":"/srv/a","mode":"2775"}"#,
            r#"{"path":"/srv/a","mode":"1777"}"#,
            r#"{"path":"/srv/a","mode":"0o"}"#,
        ] {
            assert!(opts(bad).is_err(), "{bad} should be refused");
        }
        for (mode, want) in [("0o750", 0o750), ("750", 0o750), ("00750", 0o750), ("0", 0)] {
            let j = format!(r#"{{"path":"/srv/a","mode":"{mode}"}}"#);
            assert_eq!(opts(&j).unwrap().ownership.mode, Some(want), "{mode}");
        }
        assert_eq!(
            opts(r#"{"path":"/srv/a","uid":"4294967294"}"#)
                .unwrap()
                .ownership
                .uid,
            Some(4_294_967_294)
        );
        // Linux's limits, checked before anything is created.
        let long = format!(r#"{{"path":"/srv/{}"}}"#, "a/".repeat(2100));
        assert!(opts(&long).unwrap_err().to_string().contains("4095 bytes"));
        let wide = format!(r#"{{"path":"/srv/{}"}}"#, "n".repeat(256));
        assert!(opts(&wide).unwrap_err().to_string().contains("255 bytes"));
        let ok = format!(r#"{{"path":"/srv/{}"}}"#, "n".repeat(255));
        assert!(opts(&ok).is_ok());
    }

    #[test]
    fn path_patterns() {
        let base = r#""path":"/srv","pathPattern":"{namespace}/{volume}","kubernetes.io/pod.namespace":"team-a","kubernetes.io/pvOrVolumeName":"data""#;
        assert_eq!(
            opts(&format!("{{{base}}}")).unwrap().path,
            Path::new("/srv/team-a/data")
        );
        for bad in [
            r#"{"path":"/srv","pathPattern":"{namespace}/x","kubernetes.io/pod.namespace":".."}"#,
            r#"{"path":"/srv","pathPattern":"{nope}"}"#,
            r#"{"path":"/srv","pathPattern":"{namespace}"}"#,
            r#"{"path":"/srv","pathPattern":"/abs"}"#,
            r#"{"path":"/srv","pathPattern":"a/../b"}"#,
            r#"{"path":"/srv","pathPattern":"a//b"}"#,
            r#"{"path":"/srv","pathPattern":"{namespace","kubernetes.io/pod.namespace":"a"}"#,
            r#"{"path":"/srv","type":"File","pathPattern":"x"}"#,
        ] {
            assert!(opts(bad).is_err(), "{bad} should be refused");
        }
    }

    #[test]
    fn kubelet_root_from_pod_dir() {
        assert_eq!(
            crate::backend::kubelet_root(Path::new(
                "/var/lib/kubelet/pods/u/volumes/flexvol~hostpath/v"
            )),
            Some(PathBuf::from("/var/lib/kubelet"))
        );
        assert_eq!(
            crate::backend::kubelet_root(Path::new(
                "/opt/rke/var/lib/kubelet/pods/u/volumes/a~b/v"
            )),
            Some(PathBuf::from("/opt/rke/var/lib/kubelet"))
        );
        assert_eq!(crate::backend::kubelet_root(Path::new("/tmp/x")), None);
    }
}
