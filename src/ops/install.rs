//! `flexvol install`: put one copy of this binary under each driver name in kubelet's plugin
//! directory, the way the FlexVolume deployment design asks (docs/protocol.md §6.4):
//! copy to a dot-file in the driver directory (kubelet's watcher ignores dot-files), fsync,
//! chmod 0755, rename over the old binary (atomic; a running old process keeps its inode), fsync
//! the directory. A driver directory that does not exist yet is made whole as a dot-directory
//! beside it and renamed into place ([`install_one`]). Nothing but dot-names and the driver
//! directories with their executables is ever written into the plugin directory: every other
//! write there makes kubelet re-run `init` for that driver. With `--config` and
//! `--nfs-key` it also installs the node config and the shared NFS capability key (root-only
//! 0400) into `/etc/flexvol`, each atomically.

#![allow(clippy::print_stdout)]

use crate::backend::Backend;
use crate::protocol::init::judge_init;
use crate::sys::exec::{Cmd, SystemRunner};
use clap::Args;
use std::fs::{self, File};
use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Where `--nfs-key` is installed unless `--nfs-key-dest` says otherwise.
pub const DEFAULT_NFS_KEY: &str = "/etc/flexvol/nfs-capability.key";

/// kubelet's default `--volume-plugin-dir`.
pub const DEFAULT_PLUGIN_DIR: &str = "/usr/libexec/kubernetes/kubelet-plugins/volume/exec";

/// Arguments of `flexvol install`.
#[derive(Args, Debug, Clone)]
pub struct InstallArgs {
    /// Plugin directory; default: a running kubelet's --volume-plugin-dir, else the standard one.
    #[arg(long, value_name = "DIR")]
    pub plugin_dir: Option<PathBuf>,
    /// Vendor part of the driver names (`<vendor>/hostpath` in PV specs).
    #[arg(long, default_value = "flexvol", value_name = "NAME")]
    pub(crate) vendor: String,
    /// Comma-separated drivers to install.
    #[arg(long, default_value = "hostpath,nfs,lvm", value_name = "LIST")]
    pub(crate) drivers: String,
    /// Binary to install; default: this executable.
    #[arg(long, value_name = "FILE")]
    pub(crate) binary: Option<PathBuf>,
    /// Remove the drivers instead (only what install made: docs/uninstall.md); a repeat says
    /// "nothing to remove".
    #[arg(long)]
    pub(crate) uninstall: bool,
    /// With --uninstall: also remove flexvol's node state: --config-dest and --nfs-key-dest (then
    /// their directory if empty), the config's stateDir and runDir with their contents, and its
    /// logFile. Refused while stateDir holds records of mounted volumes. Volume data is only listed.
    #[arg(long, requires = "uninstall")]
    pub(crate) purge: bool,
    /// With --uninstall: print what would be removed (and the volume data that stays), remove nothing.
    #[arg(long, requires = "uninstall")]
    pub(crate) dry_run: bool,
    /// With --purge: the host's / as this process sees it; the node config's stateDir, runDir,
    /// logFile and roots (or their defaults, without a config) are taken below it (a container
    /// mounting the host at /host: /host).
    #[arg(long, value_name = "DIR", default_value = "/", requires = "purge")]
    pub(crate) host_root: PathBuf,
    /// Node config to check and install atomically (e.g. a mounted ConfigMap); an invalid file is
    /// refused, because a broken config makes every verb but init fail.
    #[arg(long, value_name = "FILE")]
    pub(crate) config: Option<PathBuf>,
    /// Where --config goes: the host's /etc/flexvol/config.json as this process sees it.
    #[arg(long, value_name = "FILE", default_value = crate::node::config::DEFAULT_PATH)]
    pub(crate) config_dest: PathBuf,
    /// The shared NFS capability key to install (the DaemonSet mounts the optional Secret
    /// `flexvol-nfs-key` here); when the file does not exist, no key is installed.
    #[arg(long, value_name = "FILE")]
    pub(crate) nfs_key: Option<PathBuf>,
    /// Where --nfs-key goes (root-only, 0400): the file the node config's nfs.capabilityKeyFile
    /// names, as this process sees it.
    #[arg(long, value_name = "FILE", default_value = DEFAULT_NFS_KEY)]
    pub(crate) nfs_key_dest: PathBuf,
    /// After installing, keep running until SIGTERM: a DaemonSet's container must not exit.
    #[arg(long)]
    pub(crate) sleep: bool,
}

/// Why installing failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum InstallError {
    /// Bad argument.
    #[error("{0}")]
    Invalid(String),
    /// A filesystem step failed.
    #[error("cannot {what} {path}: {source}")]
    Io {
        what: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
}

fn io<'a>(what: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> InstallError + 'a {
    move |source| InstallError::Io {
        what,
        path: path.to_owned(),
        source,
    }
}

/// The vendor must make `<vendor>/<driver>` a Kubernetes qualified name: a DNS subdomain prefix.
fn check_vendor(v: &str) -> Result<(), InstallError> {
    let ok = !v.is_empty()
        && v.len() <= 253
        && v.split('.').all(|l| {
            !l.is_empty()
                && l.len() <= 63
                && l.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !l.starts_with('-')
                && !l.ends_with('-')
        });
    if ok {
        Ok(())
    } else {
        Err(InstallError::Invalid(format!(
            "vendor {v:?} is not a DNS subdomain (lowercase letters, digits, '-' and '.'), which kubelet requires of driver names"
        )))
    }
}

/// The plugin directory of a running kubelet, from its command line or its config file.
pub(crate) fn detect_plugin_dir() -> Option<PathBuf> {
    let rd = fs::read_dir("/proc").ok()?;
    for e in rd.filter_map(Result::ok) {
        let Ok(cmdline) = fs::read(e.path().join("cmdline")) else {
            continue;
        };
        let args: Vec<String> = cmdline
            .split(|&b| b == 0)
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        if args
            .first()
            .is_none_or(|a| a.rsplit('/').next() != Some("kubelet"))
        {
            continue;
        }
        let flag = |name: &str| -> Option<String> {
            args.iter().enumerate().find_map(|(i, a)| {
                a.strip_prefix(&format!("--{name}="))
                    .map(str::to_owned)
                    .or_else(|| {
                        (a == &format!("--{name}"))
                            .then(|| args.get(i + 1).cloned())
                            .flatten()
                    })
            })
        };
        if let Some(d) = flag("volume-plugin-dir") {
            return Some(PathBuf::from(d));
        }
        if let Some(cfg) = flag("config")
            && let Ok(text) = fs::read_to_string(&cfg)
        {
            for line in text.lines() {
                if let Some(v) = line.trim().strip_prefix("volumePluginDir:") {
                    return Some(PathBuf::from(v.trim().trim_matches('"').trim_matches('\'')));
                }
            }
        }
    }
    None
}

fn same_content(a: &Path, b: &Path) -> bool {
    let (Ok(mut fa), Ok(mut fb)) = (File::open(a), File::open(b)) else {
        return false;
    };
    let (Ok(ma), Ok(mb)) = (fa.metadata(), fb.metadata()) else {
        return false;
    };
    if ma.len() != mb.len() {
        return false;
    }
    let (mut ba, mut bb) = (Vec::new(), Vec::new());
    fa.read_to_end(&mut ba).is_ok() && fb.read_to_end(&mut bb).is_ok() && ba == bb
}

/// Installs (or replaces) one driver atomically. Returns what happened.
///
/// A new driver directory is made whole first, as a dot-directory beside it (kubelet's watcher
/// ignores dot-names), and renamed into place: kubelet sees one new directory that already holds
/// the executable. Made in place, the directory appears before the executable, and a kubelet that
/// probes it in between (its init fails), then adds its watch on it only after the rename inside
/// it, never loads the driver: pods then fail with "no volume plugin matched" until kubelet
/// restarts (seen twice in CI under load, deploy-e2e --release). An existing directory is
/// watched already: the executable is renamed into it.
pub(crate) fn install_one(
    binary: &Path,
    dir: &Path,
    exec_name: &str,
) -> Result<&'static str, InstallError> {
    if dir.is_dir() {
        return install_file(binary, dir, exec_name, 0o755);
    }
    let (Some(plugins), Some(name)) = (dir.parent(), dir.file_name()) else {
        return Err(InstallError::Invalid(format!(
            "{} names no driver directory",
            dir.display()
        )));
    };
    fs::create_dir_all(plugins).map_err(io("create", plugins))?;
    let staged = plugins.join(format!(
        ".{}.tmp-{}",
        name.to_string_lossy(),
        std::process::id()
    ));
    let _ = fs::remove_dir_all(&staged);
    let result = (|| {
        fs::create_dir(&staged).map_err(io("create", &staged))?;
        install_file(binary, &staged, exec_name, 0o755)?;
        match fs::rename(&staged, dir) {
            Ok(()) => {}
            // Made meanwhile by another installer: put the executable into it instead.
            Err(e)
                if dir.is_dir()
                    && e.raw_os_error()
                        .is_some_and(|c| c == nix::libc::ENOTEMPTY || c == nix::libc::EEXIST) =>
            {
                return install_file(binary, dir, exec_name, 0o755);
            }
            Err(e) => return Err(io("rename into place", dir)(e)),
        }
        File::open(plugins)
            .and_then(|d| d.sync_all())
            .map_err(io("fsync", plugins))?;
        Ok("installed")
    })();
    let _ = fs::remove_dir_all(&staged);
    result
}

/// Checks a config file and installs it atomically at `dest`, so the driver never reads a
/// half-written or invalid config. Returns what happened.
pub(crate) fn install_config(src: &Path, dest: &Path) -> Result<&'static str, InstallError> {
    let data = fs::read(src).map_err(io("read", src))?;
    crate::node::config::Config::parse(src, &data)
        .map_err(|e| InstallError::Invalid(format!("{e}; nothing was installed")))?;
    let (Some(dir), Some(name)) = (dest.parent(), dest.file_name()) else {
        return Err(InstallError::Invalid(format!(
            "--config-dest {} names no file",
            dest.display()
        )));
    };
    install_file(src, dir, &name.to_string_lossy(), 0o644)
}

/// Installs the shared NFS capability key (`nfs.capabilityKeyFile`, drivers/nfs/README.md) at
/// `dest`: length checked, written mode 0400 from its first byte (never readable by others, not
/// even for a moment), fsynced and renamed into place. A missing `src` (the optional Secret is
/// not there) installs nothing. The key's bytes are never printed.
pub(crate) fn install_key(src: &Path, dest: &Path) -> Result<&'static str, InstallError> {
    use crate::node::capability::{MAX_KEY_BYTES, MIN_KEY_BYTES};
    use crate::sys::paths::{Place, write_private};
    let data = match fs::read(src) {
        Ok(d) => d,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Ok("not installed (no key: the Secret flexvol-nfs-key does not exist)");
        }
        Err(e) => return Err(io("read", src)(e)),
    };
    if !(MIN_KEY_BYTES..=MAX_KEY_BYTES).contains(&data.len()) {
        return Err(InstallError::Invalid(format!(
            "the NFS capability key {} has {} bytes, not {MIN_KEY_BYTES} to {MAX_KEY_BYTES}; make the Secret with `kubectl -n <namespace> create secret generic flexvol-nfs-key --from-file=key=<(head -c 32 /dev/urandom)`; nothing was installed",
            src.display(),
            data.len()
        )));
    }
    let (Some(dir), Some(_)) = (dest.parent(), dest.file_name()) else {
        return Err(InstallError::Invalid(format!(
            "--nfs-key-dest {} names no file",
            dest.display()
        )));
    };
    let existed = dest.exists();
    if existed
        && fs::read(dest).is_ok_and(|d| d == data)
        && fs::metadata(dest).is_ok_and(|m| m.permissions().mode() & 0o7777 == 0o400)
    {
        return Ok("unchanged");
    }
    fs::create_dir_all(dir).map_err(io("create", dir))?;
    write_private(dest, &data, 0o400, Place::Replace).map_err(io("write", dest))?;
    Ok(if existed { "replaced" } else { "installed" })
}

fn install_file(
    binary: &Path,
    dir: &Path,
    exec_name: &str,
    mode: u32,
) -> Result<&'static str, InstallError> {
    let target = dir.join(exec_name);
    let existed = target.exists();
    if existed
        && same_content(binary, &target)
        && fs::metadata(&target)
            .map(|m| m.permissions().mode() & 0o777 == mode)
            .unwrap_or(false)
    {
        return Ok("unchanged");
    }
    fs::create_dir_all(dir).map_err(io("create", dir))?;
    let _ = fs::set_permissions(dir, fs::Permissions::from_mode(0o755));
    let tmp = dir.join(format!(".{exec_name}.tmp-{}", std::process::id()));
    let result = (|| {
        let mut src = File::open(binary).map_err(io("read", binary))?;
        let mut dst = File::create(&tmp).map_err(io("create", &tmp))?;
        std::io::copy(&mut src, &mut dst).map_err(io("write", &tmp))?;
        dst.flush()
            .and_then(|_| dst.sync_all())
            .map_err(io("fsync", &tmp))?;
        fs::set_permissions(&tmp, fs::Permissions::from_mode(mode)).map_err(io("chmod", &tmp))?;
        fs::rename(&tmp, &target).map_err(io("rename into place", &target))?;
        File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(io("fsync", dir))
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result.map(|_| if existed { "upgraded" } else { "installed" })
}

/// Runs the installed copy's `init` the way kubelet's prober does (through the `sys::exec` seam,
/// stdout and stderr on one pipe, with a deadline) and judges it by the rules `doctor` and
/// `conformance` use (`protocol::init`): it must start under that name and answer Success with
/// this backend's capabilities.
fn verify(path: &Path, b: Backend) -> Result<String, InstallError> {
    let cmd = Cmd::new(&path.to_string_lossy())
        .args(crate::protocol::verb::Call::Init.to_argv())
        .timeout(Duration::from_secs(10));
    let out = SystemRunner::default()
        .run_combined(&cmd)
        .map_err(|e| InstallError::Invalid(format!("{e}; the install is broken")))?;
    judge_init(&out.output, out.code, Some(b.capabilities().into())).map_err(|e| {
        InstallError::Invalid(format!("{}: {e}; the install is broken", path.display()))
    })?;
    Ok(String::from_utf8_lossy(&out.output).trim().to_owned())
}

/// Runs `flexvol install`; returns the exit code.
pub(crate) fn run(a: &InstallArgs) -> i32 {
    let code = match run_inner(a) {
        Ok(()) => 0,
        Err(e) => {
            println!("flexvol install: error: {e}");
            1
        }
    };
    if a.sleep && code == 0 {
        // A failed install exits instead, so the DaemonSet pod shows CrashLoopBackOff.
        let (done, after) = if a.uninstall {
            ("uninstall done", "nothing more is removed")
        } else {
            ("installed", "the installed drivers stay in place")
        };
        println!("{done}; sleeping until stopped");
        let sig = crate::sys::process::wait_for_termination();
        println!("stopped by {sig:?}; {after}");
    }
    code
}

fn run_inner(a: &InstallArgs) -> Result<(), InstallError> {
    check_vendor(&a.vendor)?;
    let mut drivers = Vec::new();
    for d in a
        .drivers
        .split(',')
        .map(str::trim)
        .filter(|d| !d.is_empty())
    {
        let b = Backend::from_name(d).ok_or_else(|| {
            InstallError::Invalid(format!(
                "unknown driver {d:?}; choose from hostpath, nfs, lvm"
            ))
        })?;
        if !drivers.contains(&b) {
            drivers.push(b);
        }
    }
    if drivers.is_empty() {
        return Err(InstallError::Invalid("--drivers names no driver".into()));
    }
    let (plugin_dir, why) = match &a.plugin_dir {
        Some(d) => (d.clone(), "--plugin-dir"),
        None => match detect_plugin_dir() {
            Some(d) => (d, "the running kubelet's --volume-plugin-dir"),
            None => (PathBuf::from(DEFAULT_PLUGIN_DIR), "kubelet's default"),
        },
    };
    println!("plugin directory: {} ({why})", plugin_dir.display());
    let kubelets = detect_plugin_dir().unwrap_or_else(|| PathBuf::from(DEFAULT_PLUGIN_DIR));
    let refused = |e: super::uninstall::UninstallError| InstallError::Invalid(e.0);
    super::uninstall::check_plugin_dir(&plugin_dir, a.uninstall, &kubelets).map_err(refused)?;
    if a.uninstall {
        return super::uninstall::run(&super::uninstall::Request {
            plugin_dir: &plugin_dir,
            vendor: &a.vendor,
            drivers: &drivers,
            purge: a.purge,
            dry_run: a.dry_run,
            config_dest: &a.config_dest,
            nfs_key_dest: &a.nfs_key_dest,
            host_root: &a.host_root,
            kubelets: &kubelets,
        })
        .map_err(refused);
    }
    if let Some(c) = &a.config {
        let what = install_config(c, &a.config_dest)?;
        println!(
            "config: {what} {} (from {})",
            a.config_dest.display(),
            c.display()
        );
    }
    if let Some(k) = &a.nfs_key {
        let what = install_key(k, &a.nfs_key_dest)?;
        println!(
            "NFS capability key: {what} {} (from {})",
            a.nfs_key_dest.display(),
            k.display()
        );
    }
    let binary = match &a.binary {
        Some(b) => b.clone(),
        None => std::env::current_exe().map_err(io("locate", Path::new("/proc/self/exe")))?,
    };
    for b in drivers {
        let dir = plugin_dir.join(format!("{}~{}", a.vendor, b.name()));
        let what = install_one(&binary, &dir, b.name())?;
        let reply = verify(&dir.join(b.name()), b)?;
        println!(
            "{}/{}: {what} {} -> init: {reply}",
            a.vendor,
            b.name(),
            dir.join(b.name()).display()
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_nfs_key_is_installed_root_only_and_only_when_there() {
        let d = tempfile::tempdir().unwrap();
        let (src, dest) = (d.path().join("secret/key"), d.path().join("etc/nfs.key"));
        assert!(
            install_key(&src, &dest)
                .unwrap()
                .starts_with("not installed")
        );
        assert!(!dest.exists());
        std::fs::create_dir_all(src.parent().unwrap()).unwrap();
        std::fs::write(&src, b"short").unwrap();
        let e = install_key(&src, &dest).unwrap_err().to_string();
        assert!(e.contains("5 bytes") && !e.contains("short"), "{e}");
        std::fs::write(&src, [7u8; 32]).unwrap();
        assert_eq!(install_key(&src, &dest).unwrap(), "installed");
        assert_eq!(std::fs::read(&dest).unwrap(), [7u8; 32]);
        let md = std::fs::metadata(&dest).unwrap();
        assert_eq!(md.permissions().mode() & 0o7777, 0o400);
        assert_eq!(install_key(&src, &dest).unwrap(), "unchanged");
        crate::node::capability::Key::load(&dest, "x").unwrap();
        std::fs::write(&src, [8u8; 32]).unwrap();
        assert_eq!(install_key(&src, &dest).unwrap(), "replaced");
        assert_eq!(std::fs::read(&dest).unwrap(), [8u8; 32]);
    }

    #[test]
    fn vendor_names() {
        for ok in ["flexvol", "example.com", "a-b.c1"] {
            check_vendor(ok).unwrap();
        }
        for bad in ["", "Flexvol", "-x", "a..b", "a/b", "a_b", "x-"] {
            assert!(check_vendor(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn install_upgrade_unchanged_uninstall() {
        let d = tempfile::tempdir().unwrap();
        let bin1 = d.path().join("bin1");
        let bin2 = d.path().join("bin2");
        fs::write(&bin1, b"one").unwrap();
        fs::write(&bin2, b"two").unwrap();
        let dir = d.path().join("plugins/flexvol~hostpath");
        assert_eq!(install_one(&bin1, &dir, "hostpath").unwrap(), "installed");
        // A new driver directory arrives whole: nothing staged is left beside it.
        let left: Vec<_> = fs::read_dir(dir.parent().unwrap())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with('.'))
            .collect();
        assert!(left.is_empty(), "{left:?}");
        assert_eq!(install_one(&bin1, &dir, "hostpath").unwrap(), "unchanged");
        assert_eq!(install_one(&bin2, &dir, "hostpath").unwrap(), "upgraded");
        assert_eq!(fs::read(dir.join("hostpath")).unwrap(), b"two");
        assert_eq!(
            fs::metadata(dir.join("hostpath"))
                .unwrap()
                .permissions()
                .mode()
                & 0o777,
            0o755
        );
        let names: Vec<_> = fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(
            names,
            vec![std::ffi::OsString::from("hostpath")],
            "no temp files left"
        );
    }
}
