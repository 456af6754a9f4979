//! `flexvol doctor`: checks that this node can run the installed drivers, and says how to fix
//! what it cannot. Each check is `ok`, `warn` (works, but worth knowing) or `fail` (a verb or
//! kubelet's probe will fail); any `fail` makes the exit status 1.
//!
//! Checked: the config file; the state, lock and log locations (writable, real directories, not
//! writable by others); the tools and kernel features each installed backend needs (and
//! `xfs_quota`, without which provisioned hostPath sizes are not enforced); the provisioner's
//! side of the config ([`provisioner`]: its roots, allowed volume groups and NFS key); and every
//! flexvol driver in the plugin directory the way kubelet's prober sees it (a regular executable
//! file named after its directory, whose `init` answers one Success object with the right
//! capabilities and nothing on stderr, and no other files beside it, because every write there
//! re-runs `init`). It says where the plugin directory came from (`--plugin-dir`, a running
//! kubelet, or the default).
//!
//! A tool or kernel feature of a backend that is not installed is only a warning. A missing
//! tool's fix is the install command of this node's distribution ([`distro`]).
//!
//! Policy: a config that is untrusted (writable by others, owned by another user: see
//! [`crate::node::config`]) fails like an invalid one; the hostPath roots in effect are listed,
//! and a root that hands out system locations (`/`, `/etc`, `/usr`, `/root`, `/var`, `/run`,
//! `/home`, ...) is a warning: pod authors can reach it through inline volumes.

#![allow(clippy::print_stdout)]

mod distro;
mod provisioner;

use crate::backend::Backend;
use crate::node::config::Config;
use crate::ops::install::{DEFAULT_PLUGIN_DIR, detect_plugin_dir};
use crate::protocol::init::judge_init;
use crate::sys::exec::{Cmd, SystemRunner};
use clap::Args;
use serde::Serialize;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Arguments of `flexvol doctor`.
#[derive(Args, Debug, Clone)]
pub(crate) struct DoctorArgs {
    /// Plugin directory; default: a running kubelet's --volume-plugin-dir, else the standard one.
    #[arg(long, value_name = "DIR")]
    pub(crate) plugin_dir: Option<PathBuf>,
    /// Print JSON (`{"checks":[{"check","status","detail","fix"}...],"problems":N}`).
    #[arg(long)]
    pub(crate) json: bool,
    /// Read /proc, /dev and /lib/modules below this directory (for tests of the kernel checks).
    #[arg(long, value_name = "DIR", hide = true, default_value = "/")]
    pub(crate) sysroot: PathBuf,
}

/// How a check came out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Level {
    /// Fine.
    Ok,
    /// Works, but worth knowing.
    Warn,
    /// Something will fail.
    Fail,
}

/// One check.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Check {
    /// What was checked, e.g. `tool mount.nfs` or `driver flexvol/nfs`.
    pub(crate) check: String,
    /// The outcome.
    pub(crate) status: Level,
    /// What was found.
    pub(crate) detail: String,
    /// What to do about it (for warn and fail).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) fix: Option<String>,
}

#[derive(Default)]
struct Report(Vec<Check>);

impl Report {
    fn add(
        &mut self,
        check: impl Into<String>,
        status: Level,
        detail: impl Into<String>,
        fix: Option<String>,
    ) {
        self.0.push(Check {
            check: check.into(),
            status,
            detail: detail.into(),
            fix,
        });
    }
    fn ok(&mut self, check: impl Into<String>, detail: impl Into<String>) {
        self.add(check, Level::Ok, detail, None);
    }
}

/// The tools a backend runs (their package per distribution: [`distro::Family::package`]).
/// `required` tools are needed by every volume; the others only by some (xfs filesystems,
/// enforced hostPath sizes).
struct Tool {
    name: &'static str,
    required: bool,
    backend: Backend,
}

const TOOLS: &[Tool] = &[
    Tool {
        name: "mount.nfs",
        required: true,
        backend: Backend::Nfs,
    },
    Tool {
        name: "lvm",
        required: true,
        backend: Backend::Lvm,
    },
    Tool {
        name: "blkid",
        required: true,
        backend: Backend::Lvm,
    },
    Tool {
        name: "mkfs.ext4",
        required: true,
        backend: Backend::Lvm,
    },
    Tool {
        name: "resize2fs",
        required: true,
        backend: Backend::Lvm,
    },
    Tool {
        name: "mkfs.xfs",
        required: false,
        backend: Backend::Lvm,
    },
    Tool {
        name: "xfs_growfs",
        required: false,
        backend: Backend::Lvm,
    },
    Tool {
        name: "xfs_quota",
        required: false,
        backend: Backend::HostPath,
    },
];

/// Runs `flexvol doctor`; returns the exit code.
pub(crate) fn run(a: &DoctorArgs) -> i32 {
    let checks = diagnose(a);
    let problems = checks.iter().filter(|c| c.status == Level::Fail).count();
    if a.json {
        let v = serde_json::json!({"checks": checks, "problems": problems});
        println!("{}", serde_json::to_string_pretty(&v).unwrap_or_default());
    } else {
        for c in &checks {
            let tag = match c.status {
                Level::Ok => "ok  ",
                Level::Warn => "WARN",
                Level::Fail => "FAIL",
            };
            println!("{tag}  {}: {}", c.check, c.detail);
            if let Some(f) = &c.fix {
                println!("      fix: {f}");
            }
        }
        let warns = checks.iter().filter(|c| c.status == Level::Warn).count();
        println!(
            "{} check(s): {problems} problem(s), {warns} warning(s)",
            checks.len()
        );
    }
    i32::from(problems > 0)
}

/// Runs every check.
pub(crate) fn diagnose(a: &DoctorArgs) -> Vec<Check> {
    let mut r = Report::default();
    let family = distro::family(&distro::read_os_release(&a.sysroot));
    let config = check_config(&mut r);
    check_hostpath_policy(&mut r, &config);
    check_dirs(&mut r, &config);
    let (plugin_dir, source) = match &a.plugin_dir {
        Some(d) => (d.clone(), "from --plugin-dir"),
        None => match detect_plugin_dir() {
            Some(d) => (
                d,
                "kubelet's --volume-plugin-dir (its command line or its --config file)",
            ),
            None => (
                PathBuf::from(DEFAULT_PLUGIN_DIR),
                "the default: no running kubelet names another (--plugin-dir to choose)",
            ),
        },
    };
    let installed = check_plugin_dir(&mut r, &plugin_dir, source, &config);
    let runner = SystemRunner::new(config.tool_dirs.clone());
    provisioner::check_roots(&mut r, &config, &runner);
    provisioner::check_presets(&mut r, &config, &runner);
    provisioner::check_vgs(&mut r, &config, &runner);
    provisioner::check_nfs_key(&mut r, &config);
    for t in TOOLS {
        let needed = installed.contains(&t.backend);
        let name = format!("tool {}", t.name);
        match runner.resolve(t.name) {
            Ok(p) => r.ok(
                name,
                format!("{} ({} backend)", p.display(), t.backend.name()),
            ),
            Err(_) => {
                let level = if needed && t.required {
                    Level::Fail
                } else {
                    Level::Warn
                };
                let why = match (needed, t.required, t.backend) {
                    (_, false, Backend::HostPath) => {
                        "missing; sizes of provisioned hostPath volumes are not enforced (project quotas need it)".to_owned()
                    }
                    (true, true, _) => {
                        format!("missing; the {} driver needs it", t.backend.name())
                    }
                    (true, false, _) => format!(
                        "missing; {} volumes of that filesystem will fail",
                        t.backend.name()
                    ),
                    (false, _, _) => {
                        format!("missing (the {} driver is not installed)", t.backend.name())
                    }
                };
                r.add(
                    name,
                    level,
                    format!("{why}; looked in {}", dirs(&config.tool_dirs)),
                    Some(family.install_fix(t.name)),
                );
            }
        }
    }
    check_kernel(&mut r, &a.sysroot, &installed, family);
    r.0
}

fn dirs(d: &[PathBuf]) -> String {
    d.iter()
        .map(|p| p.display().to_string())
        .collect::<Vec<_>>()
        .join(":")
}

fn check_config(r: &mut Report) -> Config {
    let (path, explicit) = Config::path();
    let name = format!("config {}", path.display());
    match Config::load() {
        Ok(c) => {
            let how = if path.exists() {
                "parses, values in range; trusted (no one but root or us can write it or its directories)"
            } else if explicit {
                "missing" // unreachable: load fails for a missing explicit file
            } else {
                "absent; the defaults apply"
            };
            r.ok(name, how);
            c
        }
        Err(e) => {
            r.add(
                name,
                Level::Fail,
                e.to_string(),
                Some("fix the file (README \"Configuration\" lists every key) or remove it to use the defaults; every verb but init fails until then".into()),
            );
            Config::default()
        }
    }
}

/// System trees: a hostPath root equal to one, inside one or containing one hands out the node's
/// programs, configuration or kernel interfaces.
const SYSTEM_TREES: &[&str] = &[
    "/etc", "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/boot", "/proc",
    "/sys", "/root",
];

/// Shared system directories: a root equal to one or containing one hands out everything in it
/// (a root inside one, such as `/var/lib/app` or `/run/app`, is fine).
const SYSTEM_DIRS: &[&str] = &[
    "/var",
    "/var/lib",
    "/var/log",
    "/var/cache",
    "/var/spool",
    "/run",
    "/home",
    "/dev",
    "/opt",
    "/tmp",
    "/var/tmp",
];

/// Which system location a hostPath root hands out, if any (`root` already resolved).
pub(crate) fn system_location(root: &Path) -> Option<&'static str> {
    if root == Path::new("/") {
        return Some("/");
    }
    SYSTEM_TREES
        .iter()
        .find(|t| root.starts_with(t) || Path::new(t).starts_with(root))
        .or_else(|| SYSTEM_DIRS.iter().find(|d| Path::new(d).starts_with(root)))
        .copied()
}

fn check_hostpath_policy(r: &mut Report, c: &Config) {
    let roots = c.hostpath.roots();
    let configured = !c.hostpath.allowed_roots.is_empty();
    let mut flagged = false;
    for root in &roots {
        let real = std::fs::canonicalize(root).unwrap_or_else(|_| root.clone());
        if let Some(sys) = system_location(&real) {
            flagged = true;
            let shown = if real == *root {
                root.display().to_string()
            } else {
                format!("{} (= {})", root.display(), real.display())
            };
            r.add(
                format!("hostpath root {}", root.display()),
                Level::Warn,
                format!(
                    "hostpath.allowedRoots hands out {sys}: {shown} lets anyone who can create a pod (inline flexVolume) or a PV bind it read-write"
                ),
                Some("list only data directories made for volumes, e.g. /srv/flexvol or /data/volumes (README \"Security\")".into()),
            );
        }
    }
    if !flagged {
        let list = dirs(&roots);
        r.ok(
            "hostpath roots",
            if configured {
                format!("served: {list}")
            } else {
                format!("served: {list} (the default; set hostpath.allowedRoots to change it)")
            },
        );
    }
}

/// Whether `dir` is (or, created with its missing parents, would be) writable by us.
fn writable_dir(dir: &Path) -> Result<&'static str, String> {
    let mut cur = dir.to_path_buf();
    let mut exists = true;
    loop {
        match std::fs::metadata(&cur) {
            Ok(m) if m.is_dir() => break,
            Ok(_) => return Err(format!("{} is not a directory", cur.display())),
            Err(_) => {
                exists = false;
                if !cur.pop() {
                    return Err("no existing parent".into());
                }
            }
        }
    }
    match nix::unistd::access(
        &cur,
        nix::unistd::AccessFlags::W_OK | nix::unistd::AccessFlags::X_OK,
    ) {
        Ok(()) if exists => Ok("exists and is writable"),
        Ok(()) => Ok("does not exist yet; will be created"),
        Err(e) => Err(format!("{} is not writable: {e}", cur.display())),
    }
}

/// What is wrong with flexvol's own state or run directory, if anything: a symlink (records and
/// locks would land where it points) or a directory others can write (anyone could plant or
/// remove records and locks). A missing directory is fine: it is created on the first call.
fn unsafe_dir(dir: &Path) -> Option<(String, String)> {
    let m = std::fs::symlink_metadata(dir).ok()?;
    if m.file_type().is_symlink() {
        return Some((
            "is a symlink: flexvol's records and locks would live wherever it points".into(),
            format!(
                "replace it with a real directory (rm {0}; mkdir -m 0755 {0}) or point the config key at one",
                dir.display()
            ),
        ));
    }
    let mode = m.permissions().mode();
    if m.is_dir() && mode & 0o022 != 0 {
        return Some((
            format!(
                "mode {:04o}: users other than root can plant or remove flexvol's records and locks",
                mode & 0o7777
            ),
            format!("chmod go-w {}", dir.display()),
        ));
    }
    None
}

fn check_dirs(r: &mut Report, c: &Config) {
    for (what, dir) in [
        ("stateDir", c.state_dir.clone()),
        ("runDir (locks)", c.lock_dir()),
    ] {
        let name = format!("{what} {}", dir.display());
        if let Some((problem, fix)) = unsafe_dir(&dir) {
            r.add(name, Level::Fail, problem, Some(fix));
            continue;
        }
        match writable_dir(&dir) {
            Ok(d) => r.ok(name, d),
            Err(e) => r.add(
                name,
                Level::Fail,
                e,
                Some(format!(
                    "run as root, or point the config key at a writable directory: mkdir -p {}",
                    dir.display()
                )),
            ),
        }
    }
    match c.log_path() {
        None => r.add(
            "logFile",
            Level::Warn,
            "off: calls are not logged to a file",
            Some(
                "set \"logFile\" (or \"logSyslog\": true) to see what kubelet asked and got".into(),
            ),
        ),
        Some(f) => {
            let name = format!("logFile {}", f.display());
            let res = if f.exists() {
                nix::unistd::access(f, nix::unistd::AccessFlags::W_OK)
                    .map(|_| "exists and is writable")
                    .map_err(|e| format!("not writable: {e}"))
            } else {
                writable_dir(f.parent().unwrap_or(Path::new("/")))
                    .map(|_| "will be created on the first call")
            };
            match res {
                Ok(d) => r.ok(name, d),
                Err(e) => r.add(
                    name,
                    Level::Fail,
                    format!("{e}; calls are not logged"),
                    Some("fix the permissions or change \"logFile\"".into()),
                ),
            }
        }
    }
    if c.log_syslog {
        let s = &c.syslog_socket;
        let name = format!("syslog {}", s.display());
        use std::os::unix::fs::FileTypeExt;
        match std::fs::metadata(s) {
            Ok(m) if m.file_type().is_socket() => r.ok(name, "socket exists"),
            _ => r.add(
                name,
                Level::Warn,
                "logSyslog is on but there is no socket; records are dropped",
                Some("start systemd-journald or rsyslog, or set \"syslogSocket\"".into()),
            ),
        }
    }
}

/// Checks each flexvol driver directory; returns the backends installed.
fn check_plugin_dir(r: &mut Report, dir: &Path, source: &str, config: &Config) -> Vec<Backend> {
    let name = format!("plugin dir {} ({source})", dir.display());
    let rd = match std::fs::read_dir(dir) {
        Ok(rd) => rd,
        Err(e) => {
            r.add(
                name,
                Level::Fail,
                format!("cannot be read: {e}"),
                Some(format!(
                    "install the drivers: flexvol install --plugin-dir {} (use the directory of kubelet's --volume-plugin-dir)",
                    dir.display()
                )),
            );
            return Vec::new();
        }
    };
    let mut names: Vec<String> = rd
        .filter_map(Result::ok)
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| !n.starts_with('.'))
        .collect();
    names.sort();
    let mut installed = Vec::new();
    for n in &names {
        let Some((vendor, drv)) = n.split_once('~') else {
            continue;
        };
        let Some(b) = Backend::from_name(drv) else {
            continue; // another vendor's driver: not ours to judge
        };
        if check_driver(r, &dir.join(n), vendor, b, config) {
            installed.push(b);
        }
    }
    if installed.is_empty() {
        r.add(
            name,
            Level::Fail,
            "no flexvol driver is installed here",
            Some(format!("flexvol install --plugin-dir {}", dir.display())),
        );
    } else {
        r.ok(name, format!("{} flexvol driver(s)", installed.len()));
    }
    installed
}

/// Checks one `<vendor>~<driver>` directory; returns whether the driver is usable.
fn check_driver(r: &mut Report, dir: &Path, vendor: &str, b: Backend, config: &Config) -> bool {
    let check = format!("driver {vendor}/{}", b.name());
    let exe = dir.join(b.name());
    let reinstall = format!(
        "flexvol install --plugin-dir {} --vendor {vendor} --drivers {}",
        dir.parent().unwrap_or(dir).display(),
        b.name()
    );
    let mut ok = true;
    // Files kubelet's watcher sees: every write to one re-runs init; a name kubelet does not exec is clutter.
    if let Ok(rd) = std::fs::read_dir(dir) {
        let mut extra: Vec<String> = rd
            .filter_map(Result::ok)
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n != b.name())
            .collect();
        extra.sort();
        for n in extra {
            let p = dir.join(&n);
            if n.starts_with(&format!(".{}.tmp-", b.name())) {
                r.add(
                    format!("{check} leftover"),
                    Level::Warn,
                    format!("{} is left over from an interrupted install", p.display()),
                    Some(format!("rm {}", p.display())),
                );
            } else if !n.starts_with('.') {
                ok = false;
                r.add(
                    format!("{check} stray file"),
                    Level::Fail,
                    format!("{} is not the driver: kubelet re-runs init on every change to it, and it confuses people", p.display()),
                    Some(format!("move it out of the plugin directory: mv {} /root/", p.display())),
                );
            }
        }
    }
    let meta = match std::fs::symlink_metadata(&exe) {
        Ok(m) => m,
        Err(_) => {
            r.add(
                check,
                Level::Fail,
                format!(
                    "{} has no executable {}: kubelet logs an init error for it on every probe",
                    dir.display(),
                    b.name()
                ),
                Some(format!(
                    "{reinstall}, or remove the empty directory: rmdir {}",
                    dir.display()
                )),
            );
            return false;
        }
    };
    let target = if meta.file_type().is_symlink() {
        match std::fs::metadata(&exe) {
            Ok(m) => {
                r.add(
                    format!("{check} symlink"),
                    Level::Warn,
                    format!(
                        "{} is a symlink: kubelet does not notice when its target changes",
                        exe.display()
                    ),
                    Some(reinstall.clone()),
                );
                m
            }
            Err(e) => {
                r.add(
                    check,
                    Level::Fail,
                    format!("{} is a dangling symlink ({e})", exe.display()),
                    Some(reinstall),
                );
                return false;
            }
        }
    } else {
        meta
    };
    if !target.is_file() {
        r.add(
            check,
            Level::Fail,
            format!("{} is not a regular file", exe.display()),
            Some(reinstall),
        );
        return false;
    }
    if target.permissions().mode() & 0o111 == 0 {
        r.add(
            check,
            Level::Fail,
            format!(
                "{} is not executable (mode {:o})",
                exe.display(),
                target.permissions().mode() & 0o7777
            ),
            Some(format!("chmod 0755 {}, or {reinstall}", exe.display())),
        );
        return false;
    }
    // Run init the way kubelet does, with our config in the environment.
    let mut cmd = Cmd::new(&exe.to_string_lossy())
        .args(crate::protocol::verb::Call::Init.to_argv())
        .timeout(Duration::from_secs(10));
    if let (cfg, true) = Config::path() {
        cmd = cmd.env(crate::node::config::ENV_VAR, &cfg.to_string_lossy());
    }
    // Judged by the same rules as `install` and `conformance` (protocol::init), on the bytes
    // kubelet would read: stdout and stderr through one pipe.
    let runner = SystemRunner::new(config.tool_dirs.clone());
    let out = match runner.run_combined(&cmd) {
        Ok(o) => o,
        Err(e) => {
            r.add(
                check,
                Level::Fail,
                format!("init could not run: {e}"),
                Some(reinstall),
            );
            return false;
        }
    };
    let problem = judge_init(&out.output, out.code, Some(b.capabilities().into())).err();
    if let Some(p) = problem {
        r.add(
            check,
            Level::Fail,
            p,
            Some(format!(
                "{exe} is not a working flexvol; {reinstall}",
                exe = exe.display()
            )),
        );
        return false;
    }
    r.ok(
        check.clone(),
        format!("{} answers init correctly", exe.display()),
    );
    if ok && b == Backend::Lvm {
        r.ok(
            format!("{check} controller"),
            "attachable: kube-controller-manager must see this driver too (--flex-volume-plugin-dir, see drivers/deploy/README.md)",
        );
    }
    ok
}

/// What the kernel offers: loaded, loadable (a module exists), or missing.
fn kernel_feature(sysroot: &Path, loaded: bool, module: &str) -> Result<(), bool> {
    if loaded {
        return Ok(());
    }
    let rel =
        std::fs::read_to_string(sysroot.join("proc/sys/kernel/osrelease")).unwrap_or_default();
    let mods = sysroot.join("lib/modules").join(rel.trim());
    let listed = |f: &str| {
        std::fs::read_to_string(mods.join(f))
            .unwrap_or_default()
            .lines()
            .any(|l| {
                let path = l.split(':').next().unwrap_or("");
                let file = path.rsplit('/').next().unwrap_or("");
                file.split('.').next() == Some(module)
            })
    };
    Err(listed("modules.dep") || listed("modules.builtin"))
}

fn read(sysroot: &Path, p: &str) -> String {
    std::fs::read_to_string(sysroot.join(p)).unwrap_or_default()
}

fn check_kernel(r: &mut Report, sysroot: &Path, installed: &[Backend], family: distro::Family) {
    let devices = read(sysroot, "proc/devices");
    let filesystems = read(sysroot, "proc/filesystems");
    let has_dev = |n: &str| {
        devices
            .lines()
            .any(|l| l.split_whitespace().nth(1) == Some(n))
    };
    let has_fs = |n: &str| {
        filesystems
            .lines()
            .any(|l| l.split_whitespace().last() == Some(n))
    };
    let features = [
        (
            "device-mapper",
            Backend::Lvm,
            has_dev("device-mapper") || sysroot.join("dev/mapper/control").exists(),
            "dm-mod",
            "modprobe dm_mod; echo dm_mod > /etc/modules-load.d/dm_mod.conf",
        ),
        (
            "nfs filesystem",
            Backend::Nfs,
            has_fs("nfs") || has_fs("nfs4"),
            "nfs",
            "modprobe nfs (mount.nfs also loads it on the first mount)",
        ),
        (
            "loop devices",
            Backend::Lvm,
            has_dev("loop") || sysroot.join("dev/loop-control").exists(),
            "loop",
            "modprobe loop",
        ),
    ];
    for (name, b, loaded, module, fix) in features {
        let check = format!("kernel {name}");
        let needed = installed.contains(&b) && name != "loop devices";
        match kernel_feature(sysroot, loaded, module) {
            Ok(()) => r.ok(check, "available"),
            Err(true) => r.add(
                check,
                Level::Warn,
                format!("not loaded (module {module} is available)"),
                Some(fix.into()),
            ),
            Err(false) => r.add(
                check,
                if needed { Level::Fail } else { Level::Warn },
                format!(
                    "missing: not loaded and no {module} module for this kernel{}",
                    if needed {
                        format!("; the {} driver needs it", b.name())
                    } else {
                        String::new()
                    }
                ),
                Some(format!(
                    "install the kernel modules of this kernel ({}), then {fix}",
                    family.kernel_modules_fix()
                )),
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roots_that_hand_out_system_locations() {
        for bad in [
            "/",
            "/etc",
            "/etc/ssl",
            "/usr",
            "/usr/local/bin",
            "/root",
            "/var",
            "/run",
            "/home",
            "/dev",
            "/var/lib",
            "/var/log",
            "/tmp",
        ] {
            assert!(system_location(Path::new(bad)).is_some(), "{bad}");
        }
        for fine in [
            "/srv",
            "/srv/flexvol",
            "/data/volumes",
            "/var/lib/app",
            "/run/app",
            "/home/alice/vols",
        ] {
            assert_eq!(system_location(Path::new(fine)), None, "{fine}");
        }
    }

    #[test]
    fn state_dirs_that_are_symlinks_or_open_to_others_fail() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path();
        assert_eq!(unsafe_dir(&p.join("missing")), None);
        std::fs::create_dir(p.join("fine")).unwrap();
        std::fs::set_permissions(p.join("fine"), std::fs::Permissions::from_mode(0o755)).unwrap();
        assert_eq!(unsafe_dir(&p.join("fine")), None);
        std::fs::create_dir(p.join("open")).unwrap();
        std::fs::set_permissions(p.join("open"), std::fs::Permissions::from_mode(0o1777)).unwrap();
        let (why, fix) = unsafe_dir(&p.join("open")).unwrap();
        assert!(why.contains("1777"), "{why}");
        assert_eq!(fix, format!("chmod go-w {}", p.join("open").display()));
        std::os::unix::fs::symlink(p.join("fine"), p.join("link")).unwrap();
        let (why, _) = unsafe_dir(&p.join("link")).unwrap();
        assert!(why.contains("symlink"), "{why}");
    }

    #[test]
    fn kernel_features_loaded_loadable_missing() {
        let d = tempfile::tempdir().unwrap();
        let s = d.path();
        std::fs::create_dir_all(s.join("proc/sys/kernel")).unwrap();
        std::fs::create_dir_all(s.join("lib/modules/6.1.0")).unwrap();
        std::fs::write(s.join("proc/sys/kernel/osrelease"), "6.1.0\n").unwrap();
        std::fs::write(
            s.join("proc/devices"),
            "Character devices:\n  1 mem\n\nBlock devices:\n254 device-mapper\n",
        )
        .unwrap();
        std::fs::write(s.join("proc/filesystems"), "nodev\tproc\n\text4\n").unwrap();
        std::fs::write(
            s.join("lib/modules/6.1.0/modules.dep"),
            "kernel/fs/nfs/nfs.ko.xz: kernel/net/sunrpc/sunrpc.ko.xz\n",
        )
        .unwrap();
        let mut r = Report::default();
        check_kernel(
            &mut r,
            s,
            &[Backend::Nfs, Backend::Lvm],
            distro::Family::Debian,
        );
        let by = |n: &str| r.0.iter().find(|c| c.check == n).unwrap().clone();
        assert_eq!(by("kernel device-mapper").status, Level::Ok);
        let nfs = by("kernel nfs filesystem");
        assert_eq!(nfs.status, Level::Warn);
        assert!(nfs.detail.contains("not loaded"), "{}", nfs.detail);
        let lp = by("kernel loop devices");
        assert_eq!(lp.status, Level::Warn);
        assert!(lp.detail.starts_with("missing"), "{}", lp.detail);
        std::fs::write(s.join("proc/devices"), "Block devices:\n  7 loop\n").unwrap();
        let mut r = Report::default();
        check_kernel(&mut r, s, &[Backend::Lvm], distro::Family::Rhel);
        let dm =
            r.0.iter()
                .find(|c| c.check == "kernel device-mapper")
                .unwrap();
        assert_eq!(dm.status, Level::Fail);
        assert!(dm.fix.as_deref().unwrap().contains("modprobe dm_mod"));
        assert!(
            dm.fix
                .as_deref()
                .unwrap()
                .contains("dnf install -y kernel-modules")
        );
    }
}
