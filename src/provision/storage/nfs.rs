//! The NFS-subdirectory provisioner (`<vendor>/nfs` StorageClasses): every claim gets its own
//! directory in an NFS export, and its PV mounts exactly that directory through the NFS driver.
//!
//! Class parameters ([`NfsClass::parse`]; unknown keys are errors):
//! - `server`, `share`: the export the directories are made in; `version` and `mountOptions` as
//!   the NFS driver takes them. All four are checked by the driver's own validation
//!   ([`NfsOptions::parse`]): server syntax, share path, the mount-option allow-list. A class is
//!   checked against the built-in policy (it may be used on any node), and each provisioning
//!   again against the policy of the node doing it (`nfs` in its config);
//! - `pathPattern`: the directory below the export, in hostPath's template language
//!   ([`volumedir::expand_pattern`]); default `<pv>_<namespace>_<claim>`
//!   ([`volumedir::default_rel_path`]);
//! - `uid`, `gid`, `mode` of the directory. **Default: root:root 0755**, the node operator's
//!   usual default for a new directory: pods running as root can write (if the export does not
//!   squash root), others can read. Pods
//!   that run as another user need `uid`/`gid` (or `gid` and `mode: "0770"`). There is no forced
//!   0777 (nfs-subdir-external-provisioner's choice, which lets every user of every client write).
//!   Directories the pattern creates above the volume's are root:root 0755 (never the class's
//!   owner, who could then rename its siblings' directories). `uid`/`gid` and `mode` are checked
//!   by the NFS driver's own rules ([`Ownership::parse_id`], [`Ownership::parse_mode`]: no
//!   4294967295, no set-uid/set-gid/sticky bits). The export must let root on this node own
//!   files (`no_root_squash`): flexvol's ownership records live on the export, in
//!   `<export>/.flexvol/volumes` (root, 0700), and are not trusted otherwise;
//! - `onDelete`: `delete` | `retain` | `archive`, what happens to the directory when its PV (reclaim
//!   policy Delete) is released. **Default: `archive`**: nfs-subdir's effective default
//!   (`archiveOnDelete` unset archives), and the one that never loses data by surprise; a class
//!   that really wants the data gone says `delete`.
//!
//! Not node-local: any instance may provision a claim and any may delete its PV; several do at
//! once. The PV name is deterministic (`pvc-<claim uid>`), so the API server keeps one PV; here,
//! racing instances converge:
//! - provisioning: the marked-directory protocol ([`volumedir::create_volume_dir_as`], its
//!   module doc): each instance makes the directory under its own private name
//!   (`.flexvol-new-<pv>@<node>.<pid>`), sets it up, and publishes the record by a hard link
//!   (the first link wins; the others remove theirs), then any instance renames the recorded
//!   directory into place without replacing anything (NFS has no `RENAME_NOREPLACE`: the
//!   fallback there is explained in that doc). Everybody accepts the record when it names the
//!   same PV and claim (the `node` field says which instance made it and is not compared). A
//!   directory at the target that is not the recorded one — a squatter's, empty or not — is
//!   never adopted;
//! - deleting: the directory is committed by one `rename` (to a tombstone, or to its archive
//!   name); an instance whose rename finds nothing looks again and finishes the tombstone or
//!   finds the job done. The PV's empty private directories of any instance (a killed racer's)
//!   go with the delete or archive ([`volumedir::remove_leftovers`]).
//!
//! Capabilities ([`crate::node::capability`]): the class's export must be listed in the node
//! config's `nfs.provisionedExports` (every node lists the same exports, and the NFS driver then
//! serves any share of that server only to a PV carrying a valid `capabilityToken`), and
//! `nfs.capabilityKeyFile` must name the shared key (the same bytes on every node, from one
//! Secret; never created here). Otherwise provisioning fails (ProvisioningFailed, saying what to
//! do) before anything is mounted. The PV's options carry `capabilityToken`, the shared key's
//! HMAC over the PV's name and exactly its `server` and `share` option values.
//!
//! The export is mounted through the NFS driver's own `mount` verb ([`crate::backend::nfs`]):
//! its validation, node policy, reachability probe (`nfs.probeTimeoutSeconds`: a dead server is
//! an error within seconds, `mount.nfs` never starts) and `mount.nfs` under a deadline
//! (`nfs.mountTimeoutSeconds`), but without its capability check (the export root is what that
//! check keeps from pods). The mount is private to the provisioner
//! (`<runDir>/provisioner-nfs/<node>/<pv>`, mode 0700), `soft` with a short `timeo` (a server that dies
//! mid-work makes the next file operation fail, not hang), and always unmounted afterwards, also
//! on error, through the driver's `unmount` (which escalates to forced and lazy); if that still
//! fails, a lazy detach. A mount left by a kill is removed by [`NfsProvisioner::recover`].
//!
//! Safety rules (rule 4 of the house):
//! - below the mounted export everything goes through `openat2(RESOLVE_NO_SYMLINKS)`
//!   ([`volumedir::inspect`], [`paths::create_dirs`]); the relative path has normal components only;
//! - the PV records what delete acts on: [`ANN_EXPORT`] (the export root mounted), [`ANN_PATH`]
//!   (the directory below it, exactly as created, also for nested patterns) and
//!   [`ANN_ON_DELETE`]; the PV's `share` must equal export + path, or delete refuses;
//! - delete acts only on a directory recorded as this PV's for its claim uid (an old one without
//!   a record: whose marker names them); it renames within the export root and never leaves it,
//!   and refuses a tree with a mount point or another volume inside ([`volumedir::check_tree`]);
//!   after a delete or an archive the record goes;
//! - `archive` renames the directory to `<export>/archived-<pv>-<UTC time>` (in the export
//!   root, whatever the nesting, so an operator finds every archive in one place). It never
//!   overwrites: an existing name is skipped, and a directory rename can never replace a
//!   non-empty directory (every archive holds at least its marker). NFS has no
//!   `RENAME_NOREPLACE`, so this is how "never overwrite" is kept;
//! - `delete` renames to the tombstone `<export>/.flexvol-deleting-<pv>` then removes it
//!   without following symlinks nor crossing mounts ([`volumedir::delete_volume_dir`]); a kill in
//!   between leaves the tombstone, which the next delete of the same PV (still there: the PV is
//!   removed only after) finishes;
//! - `retain` does not even mount the export: only the PV goes.
//!
//! Sizes are not enforced (an NFS directory has no size): the PV says so in
//! [`ANN_SIZE_ENFORCED`]/[`ANN_SIZE_NOTE`]. A resize is accepted as is ([`Provisioner::expand`]
//! returns the new size): refusing would only keep the claim's recorded size from following
//! the request, and nothing limits the volume either way.
//!
//! `recover` only removes provisioner mounts left by a kill (reading mountinfo, no network):
//! tombstones are finished by the delete of their own PV, which the reconciler retries.

use crate::backend::nfs::options::{NfsConfig, NfsOptions};
use crate::node::config::Config;
use crate::protocol::options::Options;
use crate::provision::storage::cloning::{self, copy};
use crate::provision::storage::error::MalformedPv;
use crate::provision::storage::volumedir::{self, DirState, Marker, Root};
use crate::provision::storage::{
    ClassError, Kind, ProvisionError, Provisioned, Provisioner, Refusal, Request,
};
use crate::sys::dirfd;
use crate::sys::paths::{self, Ownership};
use crate::vocab::ANN_EXPORT;
use crate::vocab::ANN_ON_DELETE;
use crate::vocab::ANN_PATH;
use crate::vocab::{ANN_SIZE, ANN_SIZE_ENFORCED, ANN_SIZE_NOTE};
use k8s_openapi::api::core::v1::PersistentVolume;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Archives are `<export>/archived-<pv>-<UTC time>`.
pub(crate) const ARCHIVE_PREFIX: &str = "archived-";
/// The provisioner's private mounts live in `<runDir>/<this>/<node>/<pv>`.
pub const MOUNT_DIR: &str = "provisioner-nfs";
/// The provisioner's own mount: soft, so a server that dies mid-work fails the next operation
/// (after about timeo × (retrans + 1) = 3 + 6 + 9 s) instead of blocking it forever.
pub const WORK_MOUNT_OPTIONS: &str = "soft,timeo=30,retrans=2";
/// What [`ANN_SIZE_NOTE`] says.
pub const SIZE_NOTE: &str = "an NFS subdirectory has no size of its own: the volume can use all the free space of the export; flexvol records the request but does not limit it";

/// Class parameters a class may use.
pub(crate) const PARAMS: [&str; 9] = [
    "server",
    "share",
    "version",
    "mountOptions",
    "pathPattern",
    "uid",
    "gid",
    "mode",
    "onDelete",
];

/// What delete does with the directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OnDelete {
    /// Tombstone rename, then recursive removal.
    Delete,
    /// Left as it is; only the PV goes.
    Retain,
    /// Renamed to `<export>/archived-<pv>-<time>`.
    Archive,
}

impl OnDelete {
    /// Parses `delete`, `retain` or `archive`.
    pub fn parse(s: &str) -> Result<Self, ClassError> {
        match s {
            "delete" => Ok(Self::Delete),
            "retain" => Ok(Self::Retain),
            "archive" => Ok(Self::Archive),
            _ => Err(ClassError(format!(
                "class parameter onDelete={s:?} is not one of delete, retain, archive (default archive)"
            ))),
        }
    }

    /// The parameter's spelling.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Delete => "delete",
            Self::Retain => "retain",
            Self::Archive => "archive",
        }
    }
}

/// A validated `<vendor>/nfs` class.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NfsClass {
    /// `server`, as given.
    pub(crate) server: String,
    /// `share`, without trailing slashes (the export root).
    pub(crate) share: String,
    /// `version`, if set.
    pub(crate) version: Option<String>,
    /// `mountOptions`, if set: what the PV (so every pod mount) gets.
    pub mount_options: Option<String>,
    /// `pathPattern`, `uid`, `gid`, `mode` (the marked-directory library's parser, as hostPath's).
    pub(crate) dir: volumedir::DirParams,
    /// `onDelete`.
    pub(crate) on_delete: OnDelete,
}

impl NfsClass {
    /// Validates a class's `parameters` against the node policy `nfs`. Nothing has run when this
    /// fails.
    pub fn parse(params: &BTreeMap<String, String>, nfs: &NfsConfig) -> Result<Self, ClassError> {
        let params = &crate::vocab::class::split_shared(params, "nfs")?;
        if let Some(k) = params.keys().find(|k| !PARAMS.contains(&k.as_str())) {
            return Err(ClassError(format!(
                "unknown class parameter {k:?}; the nfs provisioner knows {}, {}",
                PARAMS.join(", "),
                crate::vocab::class::CSI_DRIVER
            )));
        }
        let dir = volumedir::DirParams::parse(
            params
                .iter()
                .filter(|(k, _)| volumedir::DIR_PARAMS.contains(&k.as_str())),
        )
        .map_err(|e| ClassError(e.to_string()))?;
        let on_delete = params
            .get("onDelete")
            .map_or(Ok(OnDelete::Archive), |v| OnDelete::parse(v))?;
        for key in ["server", "share"] {
            if !params.contains_key(key) {
                return Err(ClassError(format!(
                    "class parameter {key} is missing; an nfs class needs server and share (the export the volumes' directories are made in)"
                )));
            }
        }
        let class = Self {
            server: params["server"].clone(),
            share: params["share"].clone(),
            version: params.get("version").cloned(),
            mount_options: params.get("mountOptions").cloned(),
            dir,
            on_delete,
        };
        // The driver's own validation, once as the PV will be mounted by pods, once as the
        // provisioner mounts the export.
        let pod = class.check(&class.share, class.mount_options.as_deref(), nfs)?;
        class.check(&class.share, Some(&class.work_options()), nfs)?;
        Ok(Self {
            share: pod.share,
            ..class
        })
    }

    fn options_json(&self, share: &str, mount_options: Option<&str>) -> String {
        let mut m = serde_json::Map::new();
        m.insert("server".into(), self.server.clone().into());
        m.insert("share".into(), share.into());
        if let Some(v) = &self.version {
            m.insert("version".into(), v.clone().into());
        }
        if let Some(o) = mount_options {
            m.insert("mountOptions".into(), o.into());
        }
        serde_json::Value::Object(m).to_string()
    }

    fn check(
        &self,
        share: &str,
        mount_options: Option<&str>,
        nfs: &NfsConfig,
    ) -> Result<NfsOptions, ClassError> {
        let o = Options::parse(&self.options_json(share, mount_options))
            .map_err(|e| ClassError(format!("class parameters: {e}")))?;
        NfsOptions::parse(&o, nfs).map_err(|e| ClassError(format!("class parameters: {e}")))
    }

    /// The `mountOptions` of the provisioner's own mount of the export: the class's, without
    /// what makes a mount hard, slow to give up, or read-only, plus [`WORK_MOUNT_OPTIONS`].
    pub(crate) fn work_options(&self) -> String {
        work_options(self.mount_options.as_deref())
    }

    /// The driver options (JSON) of the provisioner's mount of the export root.
    pub(crate) fn export_json(&self) -> String {
        self.options_json(&self.share, Some(&self.work_options()))
    }
}

/// See [`NfsClass::work_options`].
pub(crate) fn work_options(class: Option<&str>) -> String {
    let drop = [
        "hard", "soft", "softerr", "timeo", "retrans", "ro", "rw", "intr", "nointr",
    ];
    let mut parts: Vec<&str> = class
        .unwrap_or("")
        .split(',')
        .filter(|i| !i.is_empty() && !drop.contains(&i.split('=').next().unwrap_or(i)))
        .collect();
    parts.push(WORK_MOUNT_OPTIONS);
    parts.join(",")
}

/// The export path of the directory `rel` of the export `share`.
pub(crate) fn full_share(share: &str, rel: &Path) -> String {
    format!("{}/{}", share.trim_end_matches('/'), rel.display())
}

/// A failure of an export's server: mounting or unmounting it failed or timed out (the NFS
/// driver's server probe, `mount.nfs`, an unmount that is stuck). The one kind of NFS failure that
/// opens the server's breaker ([`Refusal::Unavailable`], [`ProvisionError::Unavailable`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ServerFailure(pub String);

impl From<ServerFailure> for ProvisionError {
    fn from(e: ServerFailure) -> Self {
        Self::Unavailable(e.0)
    }
}

/// Mounting and unmounting export roots: the real [`DriverExports`], or a test double.
pub trait Exports: Send + Sync {
    /// Mounts the export described by `options` (the NFS driver's JSON) on the existing empty
    /// directory `dir`, within bounded time; returns the directory to work in (the export's root).
    fn mount(&self, cfg: &Config, options: &str, dir: &Path) -> Result<PathBuf, ServerFailure>;
    /// Unmounts what [`Exports::mount`] mounted on `dir`; nothing mounted is `Ok`.
    fn unmount(&self, cfg: &Config, dir: &Path) -> Result<(), ServerFailure>;
}

/// The NFS driver's own `mount` and `unmount` verbs, with the real system seams.
pub struct DriverExports;

impl DriverExports {
    /// Runs `verb` with the node's real seams and the NFS backend's real server probe, as a
    /// driver verb runs (deadline: the verb timeout).
    fn call(
        cfg: &Config,
        verb: impl FnOnce(
            &crate::backend::Context,
            &dyn crate::backend::nfs::probe::Prober,
        ) -> crate::error::Result<crate::protocol::reply::Reply>,
    ) -> Result<(), ServerFailure> {
        let deadline = crate::sys::process::Deadline::after(cfg.verb_timeout());
        crate::backend::on_node(cfg, deadline, "flexvol/provisioner", |ctx| {
            verb(ctx, &crate::backend::nfs::probe::TcpProber)
        })
        .map(|_| ())
        .map_err(|e| ServerFailure(e.to_string()))
    }
}

impl Exports for DriverExports {
    fn mount(&self, cfg: &Config, options: &str, dir: &Path) -> Result<PathBuf, ServerFailure> {
        // The driver's mount without its capability check: the export root is exactly what
        // that check keeps from pods, and the provisioner is the one that needs it.
        Self::call(cfg, |ctx, prober| {
            crate::backend::nfs::mount_for_provisioner(ctx, prober, dir, options)
        })?;
        Ok(dir.to_owned())
    }

    fn unmount(&self, cfg: &Config, dir: &Path) -> Result<(), ServerFailure> {
        use crate::sys::mount::{Mounter, SysMounter, UnmountMode};
        let call = crate::protocol::verb::Call::Unmount {
            mount_dir: dir.to_string_lossy().into_owned(),
        };
        let Err(why) = Self::call(cfg, |ctx, prober| {
            crate::backend::nfs::handle(&call, ctx, prober)
        }) else {
            return Ok(());
        };
        // Busy (our own descriptors are closed, so someone looked in) or stuck: detach it now,
        // the kernel finishes when it is no longer used.
        match SysMounter.unmount(dir, UnmountMode::Detach) {
            Ok(_) => Ok(()),
            Err(e) => Err(ServerFailure(format!(
                "cannot unmount the provisioner's mount {}: {why}; a lazy unmount failed too: {e}",
                dir.display()
            ))),
        }
    }
}

/// The NFS kind: shared, made and deleted by any instance.
pub(crate) const KIND: Kind = Kind {
    name: "nfs",
    node_local: false,
    access_modes: &["ReadWriteOnce", "ReadOnlyMany", "ReadWriteMany"],
    node_finishes_resize: false,
};

/// The NFS-subdirectory backend.
pub struct NfsProvisioner {
    provisioner: String,
    exports: Box<dyn Exports>,
    /// This instance's node (from the last `recover`/`provision`): names its mount directory.
    node: String,
}

impl NfsProvisioner {
    /// The backend for provisioner name `provisioner` (`<vendor>/nfs`), mounting through the
    /// NFS driver.
    pub fn new(provisioner: String) -> Self {
        Self::with_exports(provisioner, Box::new(DriverExports))
    }

    /// The backend with another [`Exports`] (tests).
    pub fn with_exports(provisioner: String, exports: Box<dyn Exports>) -> Self {
        Self {
            provisioner,
            exports,
            node: "node".into(),
        }
    }

    /// Mounts the export described by `options` on this PV's private directory, runs `work` on
    /// its root, and unmounts — also when `work` fails. An unmount failure is an error (the work
    /// is idempotent: the next pass does it again and retries the unmount). A failure to mount or
    /// unmount is the server's ([`ServerFailure`]); one to prepare the mount directory is this
    /// node's ([`ProvisionError::Failed`]).
    fn with_export<T, E: From<ServerFailure> + From<ProvisionError>>(
        &self,
        cfg: &Config,
        pv: &str,
        options: &str,
        work: impl FnOnce(&Root) -> Result<T, E>,
    ) -> Result<T, E> {
        let dir = private_dir(cfg, &self.node, pv)?;
        let root_path = self.exports.mount(cfg, options, &dir).inspect_err(|_| {
            // Nothing is mounted there (the driver's mount leaves nothing behind on failure).
            let _ = std::fs::remove_dir(&dir);
        })?;
        let root = Root {
            configured: root_path.clone(),
            real: root_path,
        };
        let result = work(&root);
        let unmounted = self.exports.unmount(cfg, &dir);
        if unmounted.is_ok() {
            let _ = std::fs::remove_dir(&dir);
        }
        match (result, unmounted) {
            (Ok(t), Ok(())) => Ok(t),
            (Err(why), _) => Err(why),
            (Ok(_), Err(why)) => {
                Err(ServerFailure(format!("the work was done but {why}; retrying")).into())
            }
        }
    }
}

/// What failed in [`NfsProvisioner::with_export`] for a provision: mounting or unmounting the
/// export (the server's part), this node's mount directory or the work on the export, or the
/// clone's source (refused, or to wait for: said as it is).
enum ExportStep {
    Server(String),
    Work(String),
    Source(Refusal),
}

impl From<ServerFailure> for ExportStep {
    fn from(why: ServerFailure) -> Self {
        Self::Server(why.0)
    }
}

impl From<ProvisionError> for ExportStep {
    fn from(why: ProvisionError) -> Self {
        Self::Work(why.to_string())
    }
}

/// `<runDir>/provisioner-nfs/<node>/<pv>`, created (0700) unless a leftover mount is there
/// (never looked into: its server may be dead). The caller mounts on it. The node's name keeps
/// instances that share a run directory (test clusters on one kernel) out of each other's way.
fn private_dir(cfg: &Config, node: &str, pv: &str) -> Result<PathBuf, ProvisionError> {
    for name in [node, pv] {
        if name.contains('/') || volumedir::volume_rel_path(name).is_err() {
            return Err(ProvisionError::Failed(format!(
                "{name:?} is not usable as a directory name"
            )));
        }
    }
    let base = cfg.run_dir.join(MOUNT_DIR).join(node);
    let fail = |e: &dyn std::fmt::Display| {
        ProvisionError::Failed(format!(
            "cannot prepare the provisioner's mount directory under {}: {e}",
            base.display()
        ))
    };
    std::fs::create_dir_all(&base).map_err(|e| fail(&e))?;
    std::fs::set_permissions(&base, std::os::unix::fs::PermissionsExt::from_mode(0o700))
        .map_err(|e| fail(&e))?;
    let dir = std::fs::canonicalize(&base).map_err(|e| fail(&e))?.join(pv);
    let table = crate::sys::mountinfo::MountTable::read().map_err(|e| fail(&e))?;
    if !table.is_mount_point(&dir) {
        match dirfd::mkdir_path(&dir, 0o700) {
            Ok(()) | Err(nix::Error::EEXIST) => {}
            Err(e) => return Err(fail(&e)),
        }
    }
    Ok(dir)
}

/// A message about paths below the private mount `root`, with `server:export` instead (the
/// mount directory means nothing to the reader of an event).
fn relabel(s: &str, root: &Root, label: &str) -> String {
    s.replace(&*root.real.to_string_lossy(), label)
}

/// Creates `<root>/<rel>` (missing parents root:root 0755) with `own`, its record and its
/// marker: [`volumedir::create_volume_dir_as`], with this instance's private name, so racing
/// instances converge on one directory (module doc). Anything at the target that was not made
/// for this PV is an error and left alone.
pub(crate) fn make_subdir(
    root: &Root,
    rel: &Path,
    own: Ownership,
    marker: &Marker,
) -> Result<PathBuf, volumedir::VolumeDirError> {
    volumedir::create_volume_dir_as(root, rel, own, marker, Some(&marker.node))
}

/// The source of an NFS clone: a directory of the same export, as its PV records it.
#[derive(Debug, Clone)]
pub(crate) struct CloneSource {
    /// The source PV's name.
    pub(crate) pv: String,
    /// Its claim's uid (what its record names).
    pub claim_uid: String,
    /// Its directory below the export.
    pub(crate) rel: PathBuf,
}

/// Why a source in use is not copied ([`cloning::check_not_in_use`]).
const IN_USE: &str =
    "a file-by-file copy of a directory in use would be neither point-in-time nor crash-consistent";

/// The source PV of a clone of `class`, checked: on the class's server and export (as its
/// annotations and options say, which delete checks the same way), and not mounted by a pod on
/// this node (the driver's records, [`cloning::check_not_in_use`]). Pods on other nodes are not
/// visible here: [`copy_source`] checks that nothing changed during the copy instead.
pub(crate) fn clone_source(
    cfg: &Config,
    class: &NfsClass,
    pv: &PersistentVolume,
) -> Result<CloneSource, Refusal> {
    let refuse = |why: String| Refusal::Fail(format!("its source: {why}; nothing was created"));
    let (name, opts, claim_uid) = pv_fields(pv).map_err(|e| refuse(e.to_string()))?;
    let ann = |k: &str| {
        pv.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(k))
            .cloned()
    };
    let export = ann(ANN_EXPORT).unwrap_or_default();
    let rel = volumedir::volume_rel_path(&ann(ANN_PATH).unwrap_or_default())
        .map_err(|why| refuse(format!("PV {name}'s {ANN_PATH} annotation {why}")))?;
    let server = opts.get("server").cloned().unwrap_or_default();
    if server != class.server || export != class.share {
        return Err(refuse(format!(
            "PV {name} is on {server}:{export}, not on this class's export {}:{}; flexvol copies only within one export",
            class.server, class.share
        )));
    }
    if opts.get("share").map(String::as_str) != Some(full_share(&export, &rel).as_str()) {
        return Err(refuse(format!(
            "PV {name}'s share is not its recorded directory {}",
            full_share(&export, &rel)
        )));
    }
    let share = full_share(&export, &rel);
    cloning::check_not_in_use(
        cfg,
        crate::backend::Backend::Nfs,
        &name,
        &cloning::Source::Nfs {
            server: &server,
            share: &share,
        },
        IN_USE,
    )?;
    Ok(CloneSource {
        pv: name,
        claim_uid,
        rel,
    })
}

/// The class's work options without attribute caching (`noac`), for a clone's mount.
fn clone_work_options(class: &NfsClass) -> String {
    let kept: Vec<&str> = class
        .mount_options
        .as_deref()
        .unwrap_or("")
        .split(',')
        .filter(|i| {
            let k = i.split('=').next().unwrap_or(i);
            !i.is_empty() && !k.starts_with("ac") && k != "noac"
        })
        .collect();
    format!("{},noac", work_options(Some(&kept.join(","))))
}

/// Why a clone's source directory is not opened ([`open_source`]). Every kind fails the claim
/// (nothing was created); the kinds say what was wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum SourceError {
    /// Not provably the source PV's directory for its claim, or its check failed
    /// ([`volumedir::check_ours`], whose kind it keeps).
    #[error("its source: {0}")]
    NotOurs(ProvisionError),
    /// The directory cannot be opened.
    #[error("its source: cannot open {}: {}", .0.display(), .1)]
    Open(PathBuf, nix::Error),
    /// The opened directory's identity cannot be read.
    #[error("{0}")]
    Stat(nix::Error),
    /// The opened directory is not the one its record names (replaced meanwhile).
    #[error(
        "its source: {} is not the directory its record names (replaced meanwhile); nothing was created",
        .0.display()
    )]
    Replaced(PathBuf),
}

/// Opens the source directory of a clone on the mounted export, only when it is recorded as
/// its PV's for its claim (as delete checks) and is the very directory the record names.
pub(crate) fn open_source(
    root: &Root,
    src: &CloneSource,
) -> Result<std::os::fd::OwnedFd, SourceError> {
    let state = volumedir::check_ours(
        root,
        &src.rel,
        &src.pv,
        &src.claim_uid,
        "nothing was created",
    )
    .map_err(SourceError::NotOurs)?;
    let spath = root.real.join(&src.rel);
    let s = dirfd::open_dir(&spath).map_err(|e| SourceError::Open(spath.clone(), e))?;
    if let DirState::Owned(r) = &state
        && dirfd::dev_ino(&s).map_err(SourceError::Stat)? != (r.dev, r.ino)
    {
        return Err(SourceError::Replaced(spath));
    }
    Ok(s)
}

/// Copies the source directory `s` ([`open_source`]) into the new volume directory `path`
/// (`<root>/<rel>`), which [`make_subdir`] just made or found: a directory that holds more than
/// its marker is an earlier pass's unfinished copy (no PV exists for it: the reconciler read so),
/// removed and made again. Nothing in the source may change while it is copied
/// ([`copy::fingerprint`] before and after, every change time as the server has it): otherwise
/// the copy is removed and the claim waits, because a pod (on any node) is writing the source.
/// A failure removes the new directory (a Failure changes nothing). `Err`: [`Refusal::Wait`]
/// when the source changed, else [`Refusal::Fail`] (a step of the copy failed).
pub(crate) fn copy_source(
    root: &Root,
    rel: &Path,
    path: &Path,
    s: &std::os::fd::OwnedFd,
    src: &CloneSource,
    own: Ownership,
    marker: &Marker,
) -> Result<copy::Copied, Refusal> {
    let spath = root.real.join(&src.rel);
    let open =
        |p: &Path| dirfd::open_dir(p).map_err(|e| format!("cannot open {}: {e}", p.display()));
    let mut d = open(path).map_err(Refusal::Fail)?;
    if !copy::is_empty_but(&d, &[volumedir::MARKER]).map_err(|e| Refusal::Fail(e.to_string()))? {
        remove_subdir(
            root,
            rel,
            &marker.volume,
            &marker.claim_uid,
            OnDelete::Delete,
            "",
        )
        .map_err(|e| Refusal::Fail(format!("removing an unfinished copy: {e}")))?;
        let again =
            make_subdir(root, rel, own, marker).map_err(|e| Refusal::Fail(e.to_string()))?;
        d = open(&again).map_err(Refusal::Fail)?;
    }
    let undo = |why: String| {
        let undone = remove_subdir(
            root,
            rel,
            &marker.volume,
            &marker.claim_uid,
            OnDelete::Delete,
            "",
        );
        match undone {
            Ok(_) => why,
            Err(e) => {
                format!("{why} (and removing the half copy failed: {e}; the next pass retries)")
            }
        }
    };
    copy::copy_unchanged(s, &d, &[volumedir::MARKER], &mut || {
        crate::sys::process::checkpoint("provisioner-after-clone-copy");
    })
    .map_err(|e| match e {
        copy::Unchanged::Read(e) => Refusal::Fail(undo(format!("reading its source: {e}"))),
        copy::Unchanged::Copy(e) => Refusal::Fail(undo(format!(
            "copying its source {} failed: {e}",
            spath.display()
        ))),
        copy::Unchanged::Changed => Refusal::Wait(undo(format!(
            "waiting: its source volume {} changed while it was copied (a pod on some node is writing it); a copy of a directory in use would be neither point-in-time nor crash-consistent, so it is made once nothing writes the source (stop the source's pods, e.g. scale to 0)",
            src.pv
        ))),
    })
}

/// Removes, archives or keeps the directory `<root>/<rel>` of PV `pv` (claim uid `claim_uid`),
/// only if it is recorded as theirs (an old one: its marker names them). `stamp` names an archive
/// (UTC time). Returns what was done.
pub(crate) fn remove_subdir(
    root: &Root,
    rel: &Path,
    pv: &str,
    claim_uid: &str,
    mode: OnDelete,
    stamp: &str,
) -> Result<String, ProvisionError> {
    let path = root.real.join(rel);
    match mode {
        OnDelete::Retain => Ok(format!("kept {} (onDelete: retain)", path.display())),
        OnDelete::Delete => {
            let once = || volumedir::delete_volume_dir(root, rel, pv, claim_uid);
            // A racing instance may have renamed it between our look and our rename: look again.
            let done = once().or_else(|first| match volumedir::inspect(root, rel) {
                DirState::Missing => once(),
                _ => Err(first),
            })?;
            Ok(match done {
                volumedir::Deleted::Removed => format!("removed {}", path.display()),
                volumedir::Deleted::AlreadyGone => {
                    format!("{} was already gone", path.display())
                }
            })
        }
        OnDelete::Archive => archive(root, rel, pv, claim_uid, stamp),
    }
}

fn archive(
    root: &Root,
    rel: &Path,
    pv: &str,
    claim_uid: &str,
    stamp: &str,
) -> Result<String, ProvisionError> {
    let path = root.real.join(rel);
    let gone = || {
        Ok(format!(
            "{} is not there any more (archived or removed before)",
            path.display()
        ))
    };
    let left =
        "it was left alone: archive or delete it by hand if it is not needed, then remove the PV";
    match volumedir::check_ours(root, rel, pv, claim_uid, left) {
        Ok(_) => {}
        Err(ProvisionError::NotFound(_)) => {
            volumedir::forget_record(root, rel, pv)?;
            volumedir::remove_leftovers(root, rel, pv);
            return gone();
        }
        Err(e) => return Err(e),
    }
    let fail = |e: &dyn std::fmt::Display| format!("cannot archive {}: {e}", path.display());
    let leaf = rel
        .file_name()
        .ok_or_else(|| format!("{} has no name", path.display()))?;
    let parent = paths::open_dir_nofollow(&root.real.join(rel.parent().unwrap_or(Path::new(""))))
        .map_err(|e| fail(&e))?;
    let root_fd = paths::open_dir_nofollow(&root.real).map_err(|e| fail(&e))?;
    let base = format!("{ARCHIVE_PREFIX}{pv}-{stamp}");
    for n in 0..100 {
        let name = if n == 0 {
            base.clone()
        } else {
            format!("{base}-{n}")
        };
        match dirfd::stat_at(&root_fd, name.as_str()) {
            Ok(_) => continue, // taken: never overwrite
            Err(nix::Error::ENOENT) => {}
            Err(e) => return Err(fail(&e).into()),
        }
        // A directory renamed onto an existing non-empty directory fails (ENOTEMPTY/EEXIST),
        // onto a file ENOTDIR: a racing name cannot be overwritten either.
        match dirfd::rename(&parent, leaf, &root_fd, name.as_str()) {
            Ok(()) => {
                let _ = dirfd::sync(&root_fd);
                // An archive is no volume any more: its record goes (its marker stays, saying
                // whose it was).
                volumedir::forget_record(root, rel, pv)?;
                volumedir::remove_leftovers(root, rel, pv);
                return Ok(format!(
                    "archived {} to {}",
                    path.display(),
                    root.real.join(&name).display()
                ));
            }
            Err(nix::Error::ENOENT) if volumedir::inspect(root, rel) == DirState::Missing => {
                volumedir::forget_record(root, rel, pv)?;
                return gone(); // a racing instance archived it
            }
            Err(nix::Error::EEXIST | nix::Error::ENOTEMPTY | nix::Error::ENOTDIR) => continue,
            Err(e) => return Err(fail(&e).into()),
        }
    }
    Err(fail(&"100 archive names are taken").into())
}

/// An archive stamp for now: `20261122T153001Z`.
pub(crate) fn stamp_now() -> String {
    let t = crate::node::calllog::rfc3339(std::time::SystemTime::now());
    // 2026-11-22T15:30:01.123Z -> 20261122T153001Z
    let (date_time, _) = t.split_once('.').unwrap_or((&t, ""));
    format!("{}Z", date_time.replace(['-', ':'], ""))
}

/// The name, flexVolume options and claim uid of an NFS PV; one missing is [`MalformedPv`].
fn pv_fields(
    pv: &PersistentVolume,
) -> Result<(String, BTreeMap<String, String>, String), MalformedPv> {
    let missing = |why: &str| MalformedPv(why.to_owned());
    let name = pv.metadata.name.clone().unwrap_or_default();
    let spec = pv.spec.as_ref().ok_or_else(|| missing("it has no spec"))?;
    let opts = crate::vocab::pv_options(pv)
        .cloned()
        .ok_or_else(|| missing("it has no flexVolume options or CSI volume attributes"))?;
    let claim_uid = spec
        .claim_ref
        .as_ref()
        .and_then(|r| r.uid.clone())
        .filter(|u| !u.is_empty())
        .ok_or_else(|| {
            missing("it has no claimRef uid, so its directory's marker cannot be checked")
        })?;
    Ok((name, opts, claim_uid))
}

impl Provisioner for NfsProvisioner {
    fn kind(&self) -> &'static Kind {
        &KIND
    }

    fn serves(&self, cfg: &Config, _node: &str) -> bool {
        crate::sys::exec::SystemRunner::new(cfg.tool_dirs.clone())
            .resolve("mount.nfs")
            .is_ok()
    }

    fn fault_domain(&self, params: &BTreeMap<String, String>) -> Option<String> {
        params.get("server").map(|s| format!("NFS server {s}"))
    }

    fn check_class(&self, params: &BTreeMap<String, String>) -> Result<(), ClassError> {
        NfsClass::parse(params, &NfsConfig::default()).map(|_| ())
    }

    fn provision(&mut self, cfg: &Config, req: &Request<'_>) -> Result<Provisioned, Refusal> {
        req.node.clone_into(&mut self.node);
        let class =
            NfsClass::parse(req.params, &cfg.nfs).map_err(|e| Refusal::Fail(e.to_string()))?;
        let source = match req.source {
            Some(pv) => Some(clone_source(cfg, &class, pv)?),
            None => None,
        };
        if cfg
            .nfs
            .provisioned_export(&class.server, &class.share)
            .is_none()
        {
            return Err(Refusal::Fail(format!(
                "the export {}:{} is not in nfs.provisionedExports of node {}'s config, so the NFS driver would serve its directories to any inline volume; add \"{}:{}\" to nfs.provisionedExports in the node config of every node (then only PVs carrying their capabilityToken mount anything on that server), or use a class whose export is listed",
                class.server, class.share, req.node, class.server, class.share
            )));
        }
        let key = crate::backend::nfs::shared_key(&cfg.nfs).map_err(|e| {
            Refusal::Fail(format!(
                "the shared capability key that signs NFS volumes cannot be used: {e}"
            ))
        })?;
        let rel = match &class.dir.path_pattern {
            Some(p) => volumedir::expand_pattern(p, req.pv_name, req.namespace, req.name)
                .map_err(|e| Refusal::Fail(e.into()))?,
            None => {
                let d = volumedir::default_rel_path(req.pv_name, req.namespace, req.name);
                volumedir::volume_rel_path(&d.to_string_lossy())
                    .map_err(|why| Refusal::Fail(format!("the volume's directory name {why}")))?
            }
        };
        let marker = Marker {
            provisioner: self.provisioner.clone(),
            volume: req.pv_name.to_owned(),
            namespace: req.namespace.to_owned(),
            claim: req.name.to_owned(),
            claim_uid: req.uid.to_owned(),
            node: req.node.to_owned(),
            project_id: None,
        };
        let own = class.dir.ownership;
        let label = format!("{}:{}", class.server, class.share);
        // A clone's mount caches no attributes: the source's change times are read as the
        // server has them (the check that nothing changed during the copy).
        let export = match &source {
            Some(_) => class.options_json(&class.share, Some(&clone_work_options(&class))),
            None => class.export_json(),
        };
        let mut copied = None;
        self.with_export(cfg, req.pv_name, &export, |root| {
            let relabelled = |e: &str| relabel(e, root, &label);
            let work = |e: String| ExportStep::Work(relabelled(&e));
            // The source first: a refused one leaves nothing behind.
            let sfd =
                match &source {
                    Some(src) => Some(open_source(root, src).map_err(|e| {
                        ExportStep::Source(Refusal::Fail(relabelled(&e.to_string())))
                    })?),
                    None => None,
                };
            let path = make_subdir(root, &rel, own, &marker).map_err(|e| work(e.to_string()))?;
            if let (Some(src), Some(sfd)) = (&source, &sfd) {
                let done = copy_source(root, &rel, &path, sfd, src, own, &marker);
                copied = Some(done.map_err(|e| match e {
                    Refusal::Wait(why) => ExportStep::Source(Refusal::Wait(relabelled(&why))),
                    other => work(other.message().to_owned()),
                })?);
            }
            Ok::<_, ExportStep>(path)
        })
        .map_err(|step| {
            let here = |why: String| {
                format!(
                    "cannot create the volume's directory in {}:{}: {why}",
                    class.server, class.share
                )
            };
            match step {
                // Only a failure to mount or unmount is the server's: it opens its breaker.
                ExportStep::Server(why) => Refusal::Unavailable(here(why)),
                ExportStep::Work(why) => Refusal::Fail(here(why)),
                // About the source, which the message names.
                ExportStep::Source(r) => r,
            }
        })?;
        let share = full_share(&class.share, &rel);
        let mut options = BTreeMap::from([
            ("server".to_owned(), class.server.clone()),
            ("share".to_owned(), share.clone()),
        ]);
        if let Some(v) = &class.version {
            options.insert("version".into(), v.clone());
        }
        if let Some(o) = &class.mount_options {
            options.insert("mountOptions".into(), o.clone());
        }
        // Signed over exactly the option values the driver will see.
        options.insert(
            crate::node::capability::OPTION.to_owned(),
            key.sign_for(
                req.pv_name,
                req.namespace,
                &crate::node::capability::Location::Nfs {
                    server: &class.server,
                    share: &share,
                },
            ),
        );
        let mut annotations = BTreeMap::from([
            (ANN_EXPORT.to_owned(), class.share.clone()),
            (ANN_PATH.to_owned(), rel.to_string_lossy().into_owned()),
            (
                ANN_ON_DELETE.to_owned(),
                class.on_delete.as_str().to_owned(),
            ),
            (ANN_SIZE.to_owned(), req.size_bytes.to_string()),
            (ANN_SIZE_ENFORCED.to_owned(), "false".to_owned()),
            (ANN_SIZE_NOTE.to_owned(), SIZE_NOTE.to_owned()),
        ]);
        if let (Some(src), Some(c)) = (&source, copied) {
            annotations.insert(
                crate::vocab::ANN_CLONED_FROM.to_owned(),
                format!("{} ({})", src.pv, c.summary()),
            );
        }
        Ok(Provisioned {
            options,
            capacity_bytes: req.size_bytes,
            annotations,
            location: format!("{}:{share}", class.server),
            // The NFS driver needs no fsType (it mounts nfs/nfs4 by itself).
            fs_type: None,
        })
    }

    fn delete(&mut self, cfg: &Config, pv: &PersistentVolume) -> Result<String, ProvisionError> {
        // What the PV says is checked first: anything missing or not as recorded is refused.
        let refused = ProvisionError::Refused;
        let (name, opts, claim_uid) = pv_fields(pv)?;
        let ann = |k: &str| {
            pv.metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(k))
                .cloned()
                .ok_or_else(|| {
                    format!(
                        "it has no {k} annotation, so flexvol does not know which directory is its own; delete the directory by hand, then the PV"
                    )
                })
        };
        let export = ann(ANN_EXPORT).map_err(refused)?;
        let rel = volumedir::volume_rel_path(&ann(ANN_PATH).map_err(refused)?)
            .map_err(|why| refused(format!("its {ANN_PATH} annotation {why}; left alone")))?;
        let mode = OnDelete::parse(&ann(ANN_ON_DELETE).map_err(refused)?)
            .map_err(|e| refused(e.to_string()))?;
        let opt = |k: &str| opts.get(k).cloned();
        let class = NfsClass {
            server: opt("server").ok_or_else(|| refused("it has no server option".into()))?,
            share: export,
            version: opt("version"),
            mount_options: opt("mountOptions"),
            dir: volumedir::DirParams::default(),
            on_delete: mode,
        };
        // Checked as a class would be (server, export, options), with this node's policy.
        let checked = class
            .check(&class.share, class.mount_options.as_deref(), &cfg.nfs)
            .map_err(|e| refused(e.to_string()))?;
        let recorded = full_share(&checked.share, &rel);
        if opt("share").as_deref() != Some(recorded.as_str()) {
            return Err(refused(format!(
                "its share {:?} is not {recorded:?} (export {} + path {}) as recorded at creation; left alone: delete the directory by hand, then the PV",
                opt("share").unwrap_or_default(),
                checked.share,
                rel.display()
            )));
        }
        if mode == OnDelete::Retain {
            return Ok(format!(
                "kept {}:{recorded} (onDelete: retain)",
                class.server
            ));
        }
        let json = class.options_json(&checked.share, Some(&class.work_options()));
        let stamp = stamp_now();
        let label = format!("{}:{}", class.server, checked.share);
        self.with_export(cfg, &name, &json, |root| {
            remove_subdir(root, &rel, &name, &claim_uid, mode, &stamp)
                .map(|s| relabel(&s, root, &label))
                .map_err(|e| e.map(|m| relabel(&m, root, &label)))
        })
        .map_err(|why| why.map(|m| format!("{}:{recorded}: {m}", class.server)))
    }

    fn expand(
        &mut self,
        _cfg: &Config,
        _pv: &PersistentVolume,
        bytes: u64,
    ) -> Result<u64, ProvisionError> {
        // Nothing to grow (module doc): the size is recorded, not enforced.
        Ok(bytes)
    }

    fn recover(&mut self, cfg: &Config, node: &str) -> Vec<String> {
        node.clone_into(&mut self.node);
        let Ok(base) = std::fs::canonicalize(cfg.run_dir.join(MOUNT_DIR).join(node)) else {
            return Vec::new();
        };
        let table = match crate::sys::mountinfo::MountTable::read() {
            Ok(t) => t,
            Err(e) => return vec![format!("cannot read the mount table: {e}")],
        };
        let mut left: Vec<PathBuf> = table
            .entries
            .iter()
            .filter(|m| m.mount_point.starts_with(&base) && m.mount_point != base)
            .map(|m| m.mount_point.clone())
            .collect();
        left.sort();
        left.dedup();
        let mut errors = Vec::new();
        for dir in left.iter().rev() {
            match self.exports.unmount(cfg, dir) {
                Ok(()) => {
                    let _ = std::fs::remove_dir(dir);
                }
                Err(why) => errors.push(why.0),
            }
        }
        errors
    }
}

#[cfg(test)]
mod tests;
