//! `flexvol install --uninstall`: removes what `flexvol install` put on the node; with `--purge`,
//! also flexvol's own node state; with `--dry-run`, says what it would remove and removes nothing.
//! docs/uninstall.md is the operator's page; drivers/deploy/uninstall runs this on every node.
//!
//! What is removed, and nothing else:
//! - always: each driver's executable `<plugin-dir>/<vendor>~<driver>/<driver>` and install's own
//!   leftovers `.<driver>.tmp-*` beside it, then that directory if it is then empty (a directory
//!   holding other files is kept and said so);
//! - with `--purge`: the files install writes, `--config-dest` (the node config) and
//!   `--nfs-key-dest` (the NFS capability key), then their directory (`/etc/flexvol`) if nothing
//!   else is in it; the node config's `stateDir` (mount records and the node's capability key,
//!   `/var/lib/flexvol`) and `runDir` (locks, `/run/flexvol`) with everything in them; its
//!   `logFile` (the call log, `/var/log/flexvol.log`). Paths from the node config are taken below
//!   `--host-root` (the host's `/` as this process sees it).
//!
//! Never removed, only listed (with `--purge`): data of volumes. The records and volume
//! directories under each provisioning root of the config (`<root>/.flexvol/`), the LVs of its
//! volume groups (tagged `flexvol.*`: the `lvs` command that lists them is printed, lvm is not run
//! here) and the NFS exports it provisions in (on the server).
//!
//! Rules (docs/security.md, "Uninstall"): a parent directory is opened with no symlink anywhere in
//! its path and every entry is removed through that descriptor; a symlink, or any other kind of
//! file, where a file or directory of ours should be is an error, never followed nor removed; a
//! directory to be emptied is walked first, and a mount point anywhere in it (or the directory
//! itself being one) fails the purge before anything is removed. While `stateDir` holds records of
//! mounts (volumes kubelet has not unmounted), `--purge` refuses: the drivers need them to unmount.
//! A directory emptied whole (`stateDir`, `runDir`) must be named for flexvol (its name contains
//! `flexvol`, as the defaults do): a config naming `/var/lib` is refused, never emptied.
//! Nothing is removed unless the whole plan was made without an error. A repeated run says
//! "nothing to remove".

#![allow(clippy::print_stdout)]

use crate::backend::Backend;
use crate::node::config::Config;
use crate::sys::dirfd;
use crate::sys::paths::open_dir_nofollow;
use nix::sys::stat::{FileStat, SFlag};
use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};

/// What `--uninstall` was asked to do.
#[derive(Debug, Clone)]
pub(crate) struct Request<'a> {
    pub(crate) plugin_dir: &'a Path,
    pub(crate) vendor: &'a str,
    pub(crate) drivers: &'a [Backend],
    pub(crate) purge: bool,
    pub(crate) dry_run: bool,
    pub(crate) config_dest: &'a Path,
    pub(crate) nfs_key_dest: &'a Path,
    pub(crate) host_root: &'a Path,
    /// The plugin directory to suggest when `plugin_dir` is refused.
    pub(crate) kubelets: &'a Path,
}

/// One removal of the plan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Removal {
    /// A driver directory: these regular files in it, then the directory if it is then empty.
    Driver { dir: PathBuf, files: Vec<OsString> },
    /// A regular file.
    File { path: PathBuf, what: &'static str },
    /// A directory and everything in it (checked for mounts first).
    Tree { path: PathBuf, what: &'static str },
    /// A directory that holds nothing but files removed before it.
    DirIfEmpty { path: PathBuf, what: &'static str },
}

impl Removal {
    fn describe(&self) -> String {
        match self {
            Removal::Driver { dir, files } if files.is_empty() => {
                format!("{} (an empty driver directory)", dir.display())
            }
            Removal::Driver { dir, files } => format!(
                "{} ({}, then the driver directory if empty)",
                dir.display(),
                files
                    .iter()
                    .map(|f| f.to_string_lossy().into_owned())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            Removal::File { path, what }
            | Removal::Tree { path, what }
            | Removal::DirIfEmpty { path, what } => format!("{} ({what})", path.display()),
        }
    }
}

/// The plan: what would be removed, and the volume data that stays (listed only).
#[derive(Debug, Clone, Default)]
pub(crate) struct Plan {
    pub(crate) remove: Vec<Removal>,
    pub(crate) kept: Vec<String>,
}

/// Why uninstalling refused or failed (`flexvol install` prints it and exits 1).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub(crate) struct UninstallError(pub String);

fn err(msg: String) -> UninstallError {
    UninstallError(msg)
}

fn is_kind(st: &FileStat, kind: SFlag) -> bool {
    SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT == kind
}

/// `(parent, name)` of an absolute path with a last component.
fn split(path: &Path) -> Result<(&Path, &OsStr), UninstallError> {
    match (path.parent(), path.file_name()) {
        (Some(p), Some(n)) if path.is_absolute() => Ok((p, n)),
        _ => Err(err(format!(
            "{} is not an absolute path to a file or directory",
            path.display()
        ))),
    }
}

/// `lstat` of `path` through its parent opened with no symlink in its path; `None` when either
/// is absent.
fn probe(path: &Path) -> Result<Option<FileStat>, UninstallError> {
    let (parent, name) = split(path)?;
    let dir = match open_dir_nofollow(parent) {
        Ok(d) => d,
        Err(nix::Error::ENOENT) => return Ok(None),
        Err(e) => {
            return Err(err(format!(
                "cannot open {} (no symlink may be in its path): {e}",
                parent.display()
            )));
        }
    };
    match dirfd::stat_at(&dir, name) {
        Ok(st) => Ok(Some(st)),
        Err(nix::Error::ENOENT) => Ok(None),
        Err(e) => Err(err(format!("cannot look at {}: {e}", path.display()))),
    }
}

/// Refuses a plugin directory that cannot be kubelet's: relative (it would depend on where the
/// command runs), with `..`, or a driver directory itself (`.../flexvol~hostpath`); and, to
/// uninstall, one that does not exist (a typo would otherwise say "nothing to remove").
/// `kubelets` is the plugin directory to suggest (the running kubelet's, else the default).
pub(crate) fn check_plugin_dir(
    dir: &Path,
    must_exist: bool,
    kubelets: &Path,
) -> Result<(), UninstallError> {
    if !dir.is_absolute() || crate::sys::paths::has_dotdot(dir) {
        return Err(err(format!(
            "--plugin-dir must be an absolute path without \"..\" (kubelet's --volume-plugin-dir, e.g. {}), got {:?}",
            kubelets.display(),
            dir.display().to_string()
        )));
    }
    if dir
        .file_name()
        .is_some_and(|n| n.to_string_lossy().contains('~'))
    {
        return Err(err(format!(
            "--plugin-dir {} is a driver directory (<vendor>~<driver>); give the plugin directory that holds it",
            dir.display()
        )));
    }
    if must_exist {
        match probe(dir)? {
            Some(st) if is_kind(&st, SFlag::S_IFDIR) => {}
            Some(_) => {
                return Err(err(format!(
                    "--plugin-dir {} is not a directory (a symlink is not followed)",
                    dir.display()
                )));
            }
            None => {
                return Err(err(format!(
                    "--plugin-dir {} does not exist: mistyped? kubelet's is {} (`flexvol doctor` says which one it uses)",
                    dir.display(),
                    kubelets.display()
                )));
            }
        }
    }
    Ok(())
}

/// The driver `exec` in `dir`: what of it install made and is still there.
fn plan_driver(dir: &Path, exec: &str) -> Result<Option<Removal>, UninstallError> {
    match probe(dir)? {
        None => return Ok(None),
        Some(st) if is_kind(&st, SFlag::S_IFDIR) => {}
        Some(_) => {
            return Err(err(format!(
                "{} is not a directory (a symlink?): flexvol install did not make it; remove it by hand if it is yours to remove",
                dir.display()
            )));
        }
    }
    let fd =
        open_dir_nofollow(dir).map_err(|e| err(format!("cannot open {}: {e}", dir.display())))?;
    let names = dirfd::list(&fd).map_err(|e| err(format!("cannot list {}: {e}", dir.display())))?;
    let tmp = format!(".{exec}.tmp-");
    let mut files = Vec::new();
    for n in &names {
        if n.as_os_str() != OsStr::new(exec) && !n.to_string_lossy().starts_with(&tmp) {
            continue;
        }
        let st = dirfd::stat_at(&fd, n.as_os_str())
            .map_err(|e| err(format!("cannot look at {}: {e}", dir.join(n).display())))?;
        if !is_kind(&st, SFlag::S_IFREG) {
            return Err(err(format!(
                "{} is not a regular file (a symlink?): flexvol install did not make it; remove it by hand if it is yours to remove",
                dir.join(n).display()
            )));
        }
        files.push(n.clone());
    }
    Ok(
        (!files.is_empty() || names.is_empty()).then(|| Removal::Driver {
            dir: dir.to_owned(),
            files,
        }),
    )
}

fn plan_file(path: &Path, what: &'static str) -> Result<Option<Removal>, UninstallError> {
    match probe(path)? {
        None => Ok(None),
        Some(st) if is_kind(&st, SFlag::S_IFREG) => Ok(Some(Removal::File {
            path: path.to_owned(),
            what,
        })),
        Some(_) => Err(err(format!(
            "{} ({what}) is not a regular file (a symlink is never followed): remove it by hand if it is yours to remove",
            path.display()
        ))),
    }
}

/// Opens the directory `path` for a purge: through its parent, no symlink, not a mount point.
fn open_tree(path: &Path) -> Result<std::os::fd::OwnedFd, UninstallError> {
    let (parent, name) = split(path)?;
    let p = open_dir_nofollow(parent)
        .map_err(|e| err(format!("cannot open {}: {e}", parent.display())))?;
    dirfd::open_child_dir(&p, name).map_err(|e| {
        if e == nix::Error::EXDEV {
            err(format!(
                "{} is a mount point; flexvol never removes across a mount: unmount it, or remove it by hand",
                path.display()
            ))
        } else {
            err(format!("cannot open {}: {e}", path.display()))
        }
    })
}

fn plan_tree(path: &Path, what: &'static str) -> Result<Option<Removal>, UninstallError> {
    // Emptied whole, so it must be provably flexvol's: named for it (the defaults are
    // /var/lib/flexvol and /run/flexvol). A node config that names /var/lib or / as its stateDir
    // would otherwise take the host's files with it.
    let named_ours = path
        .file_name()
        .and_then(OsStr::to_str)
        .is_some_and(|n| n.contains("flexvol"));
    if !named_ours {
        return Err(err(format!(
            "{} ({what}) is not named for flexvol, so --purge does not empty it (it empties only a directory whose name contains \"flexvol\", as the defaults /var/lib/flexvol and /run/flexvol do): remove flexvol's files in it by hand, or rename it in the node config first",
            path.display()
        )));
    }
    match probe(path)? {
        None => return Ok(None),
        Some(st) if is_kind(&st, SFlag::S_IFDIR) => {}
        Some(_) => {
            return Err(err(format!(
                "{} ({what}) is not a directory (a symlink is never followed): remove it by hand if it is yours to remove",
                path.display()
            )));
        }
    }
    let fd = open_tree(path)?;
    crate::provision::storage::volumedir::check_no_mounts(&fd, path).map_err(|e| err(e.into()))?;
    Ok(Some(Removal::Tree {
        path: path.to_owned(),
        what,
    }))
}

/// Records of mounts in `stateDir` (`<stateDir>/<backend>/*.json`): volumes kubelet has not
/// unmounted through the drivers yet.
fn mount_records(state: &Path) -> Result<Vec<PathBuf>, UninstallError> {
    let mut out = Vec::new();
    for b in Backend::ALL {
        let d = state.join(b.name());
        let fd = match open_dir_nofollow(&d) {
            Ok(fd) => fd,
            Err(nix::Error::ENOENT) => continue,
            Err(e) => return Err(err(format!("cannot open {}: {e}", d.display()))),
        };
        let names =
            dirfd::list(&fd).map_err(|e| err(format!("cannot list {}: {e}", d.display())))?;
        out.extend(
            names
                .into_iter()
                .filter(|n| n.to_string_lossy().ends_with(".json"))
                .map(|n| d.join(n)),
        );
    }
    Ok(out)
}

/// A path of the node config, as this process sees the host: below `host_root`.
fn on_host(host_root: &Path, p: &Path) -> PathBuf {
    host_root.join(p.strip_prefix("/").unwrap_or(p))
}

/// Every provisioning root the config names, on any node (a node's own name is not known here).
fn roots(c: &Config) -> Vec<PathBuf> {
    let lp = &c.local_path;
    let mut v: Vec<PathBuf> = Vec::new();
    let mut add = |m: &[crate::node::localpath::NodePath], shared: &Option<PathBuf>| {
        v.extend(m.iter().flat_map(|n| n.paths.iter().cloned()));
        v.extend(shared.iter().cloned());
    };
    add(&lp.node_path_map, &lp.shared_file_system_path);
    for m in lp.storage_class_configs.values() {
        add(&m.node_path_map, &m.shared_file_system_path);
    }
    v.sort();
    v.dedup();
    v
}

/// Volume data the purge leaves: listed, never touched.
fn list_kept(c: &Config, host_root: &Path) -> Vec<String> {
    let mut kept = Vec::new();
    for r in roots(c) {
        let p = on_host(host_root, &r);
        let Ok(real) = std::fs::canonicalize(&p) else {
            continue;
        };
        let root = crate::provision::storage::volumedir::Root {
            configured: p.clone(),
            real,
        };
        match crate::provision::storage::volumedir::read_records(&root) {
            Ok(recs) => {
                for rec in recs {
                    kept.push(format!(
                        "volume directory {} of PV {} (its record is in {}/.flexvol)",
                        p.join(&rec.path).display(),
                        rec.marker.volume,
                        p.display()
                    ));
                }
            }
            Err(e) => kept.push(format!(
                "provisioning root {}: its records could not be read ({e}); look at {}/.flexvol by hand",
                p.display(),
                p.display()
            )),
        }
        if p.join(crate::provision::storage::volumedir::STATE_DIR)
            .exists()
        {
            kept.push(format!(
                "{}/{} (the provisioner's records of that root)",
                p.display(),
                crate::provision::storage::volumedir::STATE_DIR
            ));
        }
    }
    for vg in &c.lvm.allowed_volume_groups {
        kept.push(format!(
            "LVs of volume group {vg} that flexvol made or used (tags flexvol.*): list them with `lvs -o vg_name,lv_name,lv_tags {vg}` (lvm is not run here)"
        ));
    }
    for e in &c.nfs.provisioned_exports {
        kept.push(format!(
            "NFS export {}:{}: the claims' subdirectories and its .flexvol records, on the server",
            e.server, e.share
        ));
    }
    kept
}

/// Makes the plan; nothing is changed.
pub(crate) fn plan(r: &Request<'_>) -> Result<Plan, UninstallError> {
    check_plugin_dir(r.plugin_dir, true, r.kubelets)?;
    let mut p = Plan::default();
    for b in r.drivers {
        let dir = r.plugin_dir.join(format!("{}~{}", r.vendor, b.name()));
        p.remove.extend(plan_driver(&dir, b.name())?);
    }
    if !r.purge {
        return Ok(p);
    }
    let config = match probe(r.config_dest)? {
        None => Config::default(),
        Some(_) => {
            let data = std::fs::read(r.config_dest)
                .map_err(|e| err(format!("cannot read {}: {e}", r.config_dest.display())))?;
            Config::parse(r.config_dest, &data).map_err(|e| {
                err(format!(
                    "{e}; --purge needs it to know where flexvol's state is"
                ))
            })?
        }
    };
    let state = on_host(r.host_root, &config.state_dir);
    let records = mount_records(&state)?;
    if !records.is_empty() {
        return Err(err(format!(
            "{} record(s) of mounted volumes in {} (e.g. {}): kubelet has not unmounted them yet, and the drivers need these to; delete the pods and claims first (docs/uninstall.md), then purge again",
            records.len(),
            state.display(),
            records[0].display()
        )));
    }
    p.remove.extend(plan_tree(
        &state,
        "stateDir: mount records, the node's capability key",
    )?);
    p.remove.extend(plan_tree(
        &on_host(r.host_root, &config.run_dir),
        "runDir: locks",
    )?);
    if let Some(log) = config.log_path() {
        p.remove.extend(plan_file(
            &on_host(r.host_root, log),
            "logFile: the call log",
        )?);
    }
    // The config goes after what it names: a purge that fails halfway can be run again and still
    // finds the state the config moved elsewhere.
    let mut ours: Vec<OsString> = Vec::new();
    for (path, what) in [
        (r.nfs_key_dest, "the NFS capability key"),
        (r.config_dest, "the node config"),
    ] {
        if let Some(x) = plan_file(path, what)? {
            p.remove.push(x);
            if path.parent() == r.config_dest.parent()
                && let Some(n) = path.file_name()
            {
                ours.push(n.to_owned());
            }
        }
    }
    // /etc/flexvol itself, when it holds nothing but what was removed above.
    if let Some(etc) = r.config_dest.parent()
        && let Ok(fd) = open_dir_nofollow(etc)
        && let Ok(names) = dirfd::list(&fd)
        && names.iter().all(|n| ours.contains(n))
        && etc.file_name().is_some()
    {
        p.remove.push(Removal::DirIfEmpty {
            path: etc.to_owned(),
            what: "the node config's directory",
        });
    }
    p.kept = list_kept(&config, r.host_root);
    Ok(p)
}

fn ignore_gone(r: nix::Result<()>) -> nix::Result<()> {
    match r {
        Err(nix::Error::ENOENT) => Ok(()),
        other => other,
    }
}

/// Carries out one removal (re-checking what the plan checked: the kind of each entry, mounts).
/// Returns a note when a directory was kept.
fn remove(x: &Removal) -> Result<Option<String>, UninstallError> {
    let fail =
        |p: &Path, e: &dyn std::fmt::Display| err(format!("cannot remove {}: {e}", p.display()));
    match x {
        Removal::Driver { dir, files } => {
            let fd = open_dir_nofollow(dir).map_err(|e| fail(dir, &e))?;
            for f in files {
                let st = dirfd::stat_at(&fd, f.as_os_str()).map_err(|e| fail(&dir.join(f), &e))?;
                if !is_kind(&st, SFlag::S_IFREG) {
                    return Err(err(format!(
                        "{} is no longer a regular file; not removed",
                        dir.join(f).display()
                    )));
                }
                ignore_gone(dirfd::unlink(&fd, f.as_os_str()))
                    .map_err(|e| fail(&dir.join(f), &e))?;
            }
            let (parent, name) = split(dir)?;
            let pfd = open_dir_nofollow(parent).map_err(|e| fail(dir, &e))?;
            match dirfd::rmdir(&pfd, name) {
                Ok(()) | Err(nix::Error::ENOENT) => Ok(None),
                Err(nix::Error::ENOTEMPTY | nix::Error::EEXIST) => Ok(Some(format!(
                    "kept {}: it holds files flexvol install did not make",
                    dir.display()
                ))),
                Err(e) => Err(fail(dir, &e)),
            }
        }
        Removal::File { path, .. } => {
            let (parent, name) = split(path)?;
            let pfd = open_dir_nofollow(parent).map_err(|e| fail(path, &e))?;
            let st = dirfd::stat_at(&pfd, name).map_err(|e| fail(path, &e))?;
            if !is_kind(&st, SFlag::S_IFREG) {
                return Err(err(format!(
                    "{} is no longer a regular file; not removed",
                    path.display()
                )));
            }
            ignore_gone(dirfd::unlink(&pfd, name)).map_err(|e| fail(path, &e))?;
            Ok(None)
        }
        Removal::Tree { path, .. } => {
            let fd = open_tree(path)?;
            crate::provision::storage::volumedir::check_no_mounts(&fd, path)
                .map_err(|e| err(e.into()))?;
            crate::provision::storage::volumedir::empty_dir(&fd, path)
                .map_err(|e| err(e.into()))?;
            let (parent, name) = split(path)?;
            let pfd = open_dir_nofollow(parent).map_err(|e| fail(path, &e))?;
            ignore_gone(dirfd::rmdir(&pfd, name)).map_err(|e| fail(path, &e))?;
            Ok(None)
        }
        Removal::DirIfEmpty { path, .. } => {
            let (parent, name) = split(path)?;
            let pfd = open_dir_nofollow(parent).map_err(|e| fail(path, &e))?;
            match dirfd::rmdir(&pfd, name) {
                Ok(()) | Err(nix::Error::ENOENT) => Ok(None),
                Err(e) => Ok(Some(format!("kept {}: {e}", path.display()))),
            }
        }
    }
}

/// Runs `--uninstall`: prints the plan (dry run) or carries it out, then the volume data kept.
pub(crate) fn run(r: &Request<'_>) -> Result<(), UninstallError> {
    let p = plan(r)?;
    if p.remove.is_empty() {
        println!("nothing to remove");
    }
    for x in &p.remove {
        if r.dry_run {
            println!("would remove: {}", x.describe());
        } else {
            let note = remove(x)?;
            println!("removed: {}", x.describe());
            if let Some(n) = note {
                println!("{n}");
            }
        }
    }
    for k in &p.kept {
        println!("kept (volume data: flexvol install never removes it): {k}");
    }
    if r.dry_run {
        println!("dry run: nothing was removed");
    }
    Ok(())
}
