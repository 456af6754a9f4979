//! Which host paths a hostPath volume may be: the node policy (`"hostpath"` in the config file,
//! [`HostPathConfig`]), the locations refused whatever it says ([`ALWAYS_REFUSED`] and flexvol's
//! own, [`protected_paths`]), and the rules for provisioning roots and device nodes
//! ([`check_policy`], [`check_device_source`]).
//!
//! Options are hostile: a PV author, or a pod author with an inline `flexVolume`, names any path.
//! A pod that can write to the node's cluster machinery owns the node, so what is refused here is
//! refused before anything is created, compared by path (symlinks resolved) and by device and
//! inode. Whose volume a path inside a provisioning root is (its `capabilityToken`) is `mount`'s
//! check, in the backend (`authorize_provisioned`), which holds the call's options.
//!
//! This module is a leaf of the node config, which composes [`HostPathConfig`]: it does not name
//! the config or the verbs' `Context`. What it needs of them the caller lends as [`Node`].

use crate::error::{Error, Result};
use crate::node::localpath::LocalPathConfig;
use crate::sys::paths::{self, FileKind};
use serde::Deserialize;
use std::path::{Path, PathBuf};

/// What the path policy needs of the node config, borrowed from it by the caller.
pub(crate) struct Node<'a> {
    /// `hostpath` in the config: the allowed roots.
    pub(crate) hostpath: &'a HostPathConfig,
    /// local-path's keys in the config: the provisioning roots.
    pub(crate) local_path: &'a LocalPathConfig,
    /// flexvol's state directory (`stateDir`).
    pub(crate) state_dir: &'a Path,
    /// flexvol's lock directory (`runDir`).
    pub(crate) run_dir: &'a Path,
    /// flexvol's log file, when it logs to one.
    pub(crate) log_file: Option<&'a Path>,
    /// The config file in effect (`FLEXVOL_CONFIG` or the default path), asked when needed.
    pub(crate) config_file: fn() -> PathBuf,
}

/// The one directory the hostPath driver serves when `hostpath.allowedRoots` is not set. Under
/// `/srv` ("data for services provided by this system", FHS 3.0), apart from flexvol's own state
/// in `/var/lib/flexvol`, and empty on a fresh node: a default that hands out nothing that
/// already exists.
pub(crate) const DEFAULT_HOSTPATH_ROOT: &str = "/srv/flexvol";

/// Node policy for hostPath (`"hostpath"` in the config file).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct HostPathConfig {
    /// Volumes may only use paths under these directories (after resolving symlinks). When empty,
    /// only [`DEFAULT_HOSTPATH_ROOT`] is served. Some locations are refused whatever this says
    /// (see the hostPath backend's policy).
    pub(crate) allowed_roots: Vec<PathBuf>,
    /// CSI inline ephemeral volumes (`hostpath.ephemeral`): preset name → where each pod's
    /// scratch directory is made and its size. A pod names a preset, never a path
    /// (docs/csi.md, "Inline ephemeral volumes"). Every preset's root is a provisioning root for
    /// [`check_policy`]: no other volume may be, contain or be inside it.
    pub(crate) ephemeral: std::collections::BTreeMap<String, EphemeralPreset>,
}

/// One preset of `hostpath.ephemeral`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct EphemeralPreset {
    /// The directory each volume of this preset is made in, as `<root>/<volume id>` (the
    /// volume id is kubelet's, derived from the pod's uid and the volume's name).
    pub(crate) root: PathBuf,
    /// Each volume's size, a Kubernetes quantity (`1Gi`): a project quota where the root's
    /// filesystem enforces one.
    #[serde(deserialize_with = "size_bytes")]
    pub(crate) size: u64,
    /// Serve a volume even where its size cannot be enforced (the root's filesystem has no
    /// project quotas); by default such a volume is refused, since the size is the preset's
    /// promise.
    #[serde(default)]
    pub(crate) allow_unenforced: bool,
    /// The most volumes of this preset one namespace may have on this node at once; unset, no
    /// count is kept (the root's free space still bounds new volumes). Inline volumes are not
    /// counted by a ResourceQuota: this is what stops one namespace from taking a shared root.
    #[serde(default)]
    pub(crate) max_per_namespace: Option<u32>,
}

fn size_bytes<'de, D: serde::Deserializer<'de>>(d: D) -> std::result::Result<u64, D::Error> {
    let s = String::deserialize(d)?;
    crate::protocol::quantity::parse_size(&s).map_err(serde::de::Error::custom)
}

impl HostPathConfig {
    /// The roots in effect: the configured ones, or the default root.
    pub(crate) fn roots(&self) -> Vec<PathBuf> {
        if self.allowed_roots.is_empty() {
            vec![PathBuf::from(DEFAULT_HOSTPATH_ROOT)]
        } else {
            self.allowed_roots.clone()
        }
    }

    /// The roots of the ephemeral presets, each once.
    pub(crate) fn ephemeral_roots(&self) -> Vec<PathBuf> {
        let mut out: Vec<PathBuf> = Vec::new();
        for p in self.ephemeral.values() {
            if !out.contains(&p.root) {
                out.push(p.root.clone());
            }
        }
        out
    }
}

/// Locations no hostPath volume may be, contain or be inside, whatever `hostpath.allowedRoots`
/// says: the node's cluster machinery. A pod that can write to one of them owns the node (a CNI
/// binary, a runtime's socket, kubelet's pods with their secrets, etcd's data, flexvol's own
/// config, records and executable). flexvol's own locations are added by [`protected_paths`].
pub(crate) const ALWAYS_REFUSED: &[(&str, &str)] = &[
    (
        "/var/lib/kubelet",
        "the kubelet directory, which holds every pod's volumes and secrets",
    ),
    (
        "/usr/libexec/kubernetes",
        "kubelet's default volume plugin directory",
    ),
    (
        "/etc/kubernetes",
        "the Kubernetes node configuration and credentials",
    ),
    ("/var/lib/etcd", "etcd's data"),
    ("/var/lib/containerd", "a container runtime's data"),
    ("/run/containerd", "a container runtime's sockets and state"),
    ("/var/lib/docker", "a container runtime's data"),
    ("/run/docker", "a container runtime's state"),
    ("/run/docker.sock", "the Docker API socket"),
    ("/var/lib/dockershim", "a container runtime's data"),
    ("/var/lib/containers", "a container runtime's data"),
    ("/run/containers", "a container runtime's state"),
    ("/var/lib/cri-o", "a container runtime's data"),
    ("/run/crio", "a container runtime's sockets and state"),
    ("/var/lib/rancher", "k3s/RKE2 data (runtime, kubelet, etcd)"),
    ("/run/k3s", "k3s's runtime state"),
    ("/var/log/pods", "every pod's logs"),
    ("/var/log/containers", "every container's logs"),
    ("/var/lib/cni", "the CNI plugins' state"),
    ("/etc/cni", "the CNI configuration"),
    ("/opt/cni", "the CNI plugin binaries, which run as root"),
];

/// One protected location. `configured` paths come from the node config (or `FLEXVOL_CONFIG`,
/// or kubelet's argv[0]) and may run through symlinks (`/var/run/flexvol`), so they are resolved
/// before comparing, missing components included; the others are fixed system locations or
/// canonical already (from the kernel or a canonical pod directory), resolved when they exist.
/// All are compared by device and inode as well.
struct Protected {
    path: PathBuf,
    why: &'static str,
    configured: bool,
}

fn protected(node: &Node, kubelet_root: Option<PathBuf>) -> Vec<Protected> {
    let fixed = |path: PathBuf, why| Protected {
        path,
        why,
        configured: false,
    };
    let configured = |path: PathBuf, why| Protected {
        path,
        why,
        configured: true,
    };
    let mut out: Vec<Protected> = ALWAYS_REFUSED
        .iter()
        .map(|(p, why)| fixed(PathBuf::from(p), *why))
        .collect();
    if let Some(k) = kubelet_root {
        out.push(fixed(
            k,
            "the kubelet directory, which holds every pod's volumes and secrets",
        ));
    }
    // Our executable, as the kernel knows it (canonical) and as kubelet named it, and the
    // directories it is installed in: `<plugin-dir>/<vendor>~<driver>/<driver>` makes the
    // grandparent kubelet's plugin directory.
    let argv0 = std::env::args_os()
        .next()
        .map(PathBuf::from)
        .filter(|p| p.is_absolute());
    for (exe, named) in std::env::current_exe()
        .ok()
        .map(|e| (e, false))
        .into_iter()
        .chain(argv0.map(|a| (a, true)))
    {
        let entry = |p: PathBuf, why| Protected {
            path: p,
            why,
            configured: named,
        };
        if let Some(dir) = exe.parent() {
            let installed = dir
                .file_name()
                .is_some_and(|n| n.to_string_lossy().contains('~'));
            if installed && let Some(plugins) = dir.parent() {
                out.push(entry(
                    plugins.to_owned(),
                    "kubelet's volume plugin directory",
                ));
            }
            out.push(entry(
                dir.to_owned(),
                "the directory of flexvol's own executable",
            ));
        }
        out.push(entry(exe, "flexvol's own executable"));
    }
    out.push(configured(
        (node.config_file)(),
        "flexvol's node config, which sets this policy",
    ));
    out.push(configured(
        node.state_dir.to_owned(),
        "flexvol's state directory",
    ));
    out.push(configured(
        node.run_dir.to_owned(),
        "flexvol's lock directory",
    ));
    if let Some(log) = node.log_file {
        out.push(configured(log.to_owned(), "flexvol's log file"));
    }
    // "/" is refused on its own in check_policy; as a protected location (a kubelet root of "/"
    // from an odd pod directory) it would refuse everything.
    // Normalized, then compared as bytes: some thirty short paths, not worth hashing.
    let mut kept: Vec<Protected> = Vec::with_capacity(out.len());
    for mut p in out {
        if let std::borrow::Cow::Owned(n) = paths::normalized(&p.path) {
            p.path = n;
        }
        if p.path.as_os_str() != "/"
            && !kept
                .iter()
                .any(|k| k.path.as_os_str() == p.path.as_os_str())
        {
            kept.push(p);
        }
    }
    kept
}

/// A path as it resolves now, missing components appended (they cannot be symlinks yet).
fn resolved(p: &Path) -> PathBuf {
    match paths::resolve_existing(p) {
        Ok((real, missing)) => paths::joined(&real, &missing),
        Err(_) => p.to_owned(),
    }
}

/// Checks the resolved source path against node policy, before anything is created:
/// 1. never a protected location ([`protected_paths`]) nor anything inside or containing one,
///    compared as paths (configured ones resolved first, so a `stateDir` configured through a
///    symlink such as `/var/run` is still recognised) and, for what is inside, by device and
///    inode of every ancestor of the source (a protected directory reached through a symlink or
///    bind-mounted elsewhere is still recognised);
/// 2. device nodes only from `/dev` (one made with mknod elsewhere is a way around the device
///    cgroup);
/// 3. only paths under the allowed roots: `hostpath.allowedRoots`, or [`DEFAULT_HOSTPATH_ROOT`]
///    when unset, resolved the same way.
///
/// Provisioning roots (`nodePathMap`, [`crate::node::localpath`]) are not allowed roots:
/// they hold every claim's volume. A source that is such a root or contains one is refused; one
/// inside a root (by path, or by device and inode of an ancestor) is served only to the PV the
/// provisioner made it for, which `mount` checks (`authorize_provisioned`). Without
/// provisioning roots in the config this costs nothing.
///
/// Checks `resolved_source` against the node policy; on success returns the (resolved) root that
/// serves it, so that `mount` creates that root and its ancestors as the node's own (root, 0755)
/// and never with a pod's `uid`/`gid`/`mode`, and whether that root is a provisioning root.
/// `kubelet_root`: the kubelet root the call's pod directory lives under.
pub(crate) fn check_policy(
    node: &Node,
    resolved_source: &Path,
    kubelet_root: Option<PathBuf>,
) -> Result<Served> {
    // Normalized once, so that every comparison below can be one of bytes (paths::is_under).
    let src_n = paths::normalized(resolved_source);
    let src: &Path = &src_n;
    let shown = src.display();
    if src == Path::new("/") {
        return Err(Error::refused(
            "host path / is refused: it would expose the whole node",
        ));
    }
    let protected = protected(node, kubelet_root);
    let mut ids = Vec::with_capacity(protected.len());
    // The locations share most of their ancestors (`/var/lib`, `/run`, flexvol's directories):
    // one resolver looks at each ancestor once.
    let mut resolver = paths::SharedResolver::new();
    for Protected {
        path: p,
        why,
        configured,
    } in &protected
    {
        // What the location really is (a fixed one may be relocated by a symlink, as
        // `/var/lib/docker` -> `/data/docker`), with its device and inode.
        let (real, id) = match resolver.real_path_id(p) {
            Ok((real, id)) => (real, Some(id)),
            Err(_) if *configured => (resolved(p), None),
            Err(_) => (paths::normalized(p).into_owned(), None),
        };
        let real = paths::normalized(&real);
        if paths::is_under(src, &real) || paths::is_under(&real, src) {
            return Err(Error::refused(format!(
                "host path {shown} is refused: it is or contains {} ({why}), which no volume may expose whatever the node config says",
                real.display()
            )));
        }
        if let Some(id) = id {
            ids.push((id, p, *why));
        }
    }
    // Provisioning roots: resolved like the protected locations (as configured paths).
    let mut provisioning = node.local_path.all_roots();
    provisioning.extend(node.hostpath.ephemeral_roots());
    let mut inside: Option<PathBuf> = None;
    let mut root_ids: Vec<((u64, u64), PathBuf)> = Vec::with_capacity(provisioning.len());
    for r in &provisioning {
        let (real, id) = match resolver.real_path_id(r) {
            Ok((real, id)) => (real, Some(id)),
            Err(_) => (resolved(r), None),
        };
        let real = paths::normalized(&real).into_owned();
        if paths::is_under(&real, src) {
            return Err(refuse_root(src, &real));
        }
        if inside.is_none() && paths::is_under(src, &real) {
            inside = Some(real.clone());
        }
        if let Some(id) = id {
            root_ids.push((id, real));
        }
    }
    for a in src.ancestors() {
        let Some(id) = resolver.id(a) else { continue };
        if let Some((_, p, why)) = ids.iter().find(|(i, _, _)| *i == id) {
            return Err(Error::refused(format!(
                "host path {shown} is refused: {} is {} ({why}) under another name, which no volume may expose whatever the node config says",
                a.display(),
                p.display()
            )));
        }
        if let Some((_, real)) = root_ids.iter().find(|(i, _)| *i == id) {
            if a == src {
                return Err(refuse_root(src, real));
            }
            if inside.is_none() {
                inside = Some(real.clone());
            }
        }
    }
    if let Ok(st) = resolver.lstat(src) {
        check_device_source(src, st.kind())?;
    }
    if let Some(root) = inside {
        return Ok(Served {
            root,
            provisioning: true,
        });
    }

    let configured = !node.hostpath.allowed_roots.is_empty();
    let roots = node.hostpath.roots();
    let serving = roots
        .iter()
        .map(|r| {
            resolver
                .real_path_id(r)
                .map_or_else(|_| resolved(r), |(real, _)| real)
        })
        .filter(|r| r != Path::new("/") && src.starts_with(r))
        .max_by_key(|r| r.components().count());
    if let Some(root) = serving {
        return Ok(Served {
            root,
            provisioning: false,
        });
    }
    let config_file = (node.config_file)();
    if !configured {
        return Err(Error::refused(format!(
            "host path {shown} is refused: it is outside {DEFAULT_HOSTPATH_ROOT}, the only directory the hostPath driver serves on a node without hostpath.allowedRoots; use a path under {DEFAULT_HOSTPATH_ROOT}, or ask the node operator to allow it in {}: \"hostpath\": {{\"allowedRoots\": [\"{shown}\"]}} (README \"Security\")",
            config_file.display()
        )));
    }
    let list = roots
        .iter()
        .map(|r| r.display().to_string())
        .collect::<Vec<_>>()
        .join(", ");
    Err(Error::refused(format!(
        "host path {shown} is refused: it is outside the allowed roots ({list}) once symlinks are resolved; use a path under them, or ask the node operator to add it to \"hostpath\": {{\"allowedRoots\": [...]}} in {}",
        config_file.display()
    )))
}

/// The root a source passed [`check_policy`] under.
pub(crate) struct Served {
    /// The resolved root.
    pub root: PathBuf,
    /// Whether it is a provisioning root: the source is then served only to its PV.
    pub(crate) provisioning: bool,
}

/// A source that is a provisioning root `root`, or contains one.
fn refuse_root(src: &Path, root: &Path) -> Error {
    let is = if src == root { "is" } else { "contains" };
    Error::refused(format!(
        "host path {} is refused: it {is} {}, a root where flexvol provisioner makes every claim's volume, which no volume may expose; to use a provisioned volume, use its PersistentVolumeClaim",
        src.display(),
        root.display()
    ))
}

/// Device nodes are served only from `/dev`: one made with mknod elsewhere (say by a pod with
/// `CAP_MKNOD` inside its volume) would bypass the device rules of the container that gets it.
/// [`check_policy`] applies this to what the path is before anything is created, and `mount`
/// again to the opened descriptor, so a device swapped in after the check is refused too.
pub(crate) fn check_device_source(resolved: &Path, kind: FileKind) -> Result<()> {
    if matches!(kind, FileKind::CharDevice | FileKind::BlockDevice) && !resolved.starts_with("/dev")
    {
        return Err(Error::refused(format!(
            "host path {} is refused: it is a device node outside /dev (made with mknod, it would bypass the container's device rules); device volumes must name the node's own /dev entry",
            resolved.display()
        )));
    }
    Ok(())
}
