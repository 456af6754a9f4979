//! The node configuration: `/etc/flexvol/config.json`, or the file named by `FLEXVOL_CONFIG`.
//!
//! It holds node policy (which host paths hostPath volumes may use, ...) and where flexvol keeps its
//! state, locks and log. All keys are optional; an unknown key is an error, because a typo in a
//! policy key must not silently fall back to a permissive default.
//!
//! Each backend owns the type of its policy section (`hostpath`: [`HostPathConfig`], `nfs`:
//! [`NfsConfig`], `lvm`: [`LvmConfig`]), next to the code that enforces it; this file composes
//! them, decides whether the file is trusted, and checks the values every section shares the
//! rules of (paths, `...Seconds` ranges).
//!
//! [`HostPathConfig`]: crate::backend::hostpath::policy::HostPathConfig
//! [`NfsConfig`]: crate::backend::nfs::options::NfsConfig
//! [`LvmConfig`]: crate::backend::lvm::policy::LvmConfig
//!
//! Safety rules:
//! - The file is trusted only if nobody but root (or the user flexvol runs as) could have written
//!   it, like sshd's `StrictModes`: it must be a regular file owned by root or us, not writable by
//!   group or others, and every directory above it (as named and after resolving symlinks) must be
//!   owned by root or us and not writable by group or others unless sticky (`/tmp`). Anything else
//!   is [`ConfigError::Untrusted`]: whoever can write the config decides what pods may mount.
//! - Every value is checked here, before any verb uses it: paths absolute and without `..`,
//!   numbers within [`SECONDS_RANGE`] ranges, so no later arithmetic can overflow. `init` never
//!   depends on the config (the driver answers it from defaults when the config is bad).

use serde::Deserialize;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Where the config is read from unless `FLEXVOL_CONFIG` says otherwise.
pub(crate) const DEFAULT_PATH: &str = "/etc/flexvol/config.json";
/// Environment variable naming another config file (tests, unusual nodes).
pub(crate) const ENV_VAR: &str = "FLEXVOL_CONFIG";

/// Allowed range of every `...Seconds` key (0 only where [`Config::parse`] says so): one day is
/// more than any kubelet waits for a verb, and keeps every deadline computation far from overflow.
pub(crate) const SECONDS_RANGE: (u64, u64) = (1, 86_400);

/// `callLogMaxBytes` unless the config says otherwise: 8 MiB (tens of thousands of calls).
pub(crate) const DEFAULT_CALL_LOG_MAX_BYTES: u64 = 8 << 20;
/// The least `callLogMaxBytes` other than 0 (a few records).
pub(crate) const MIN_CALL_LOG_MAX_BYTES: u64 = 64 << 10;

/// The whole node configuration.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct Config {
    /// Durable state (what is mounted where); must survive reboots of kubelet, not of the node.
    pub state_dir: PathBuf,
    /// Locks; a tmpfs is right (locks die with the node).
    pub run_dir: PathBuf,
    /// One JSON line per call is appended here; `null` or `""` turns file logging off.
    pub log_file: Option<PathBuf>,
    /// When the log file has grown past this many bytes, the call that sees it renames it to
    /// `<logFile>.1` (replacing the one before) and the next call starts a new file; 0: never.
    pub(crate) call_log_max_bytes: u64,
    /// Also send each call record to the system log (`/dev/log`: journald or syslog).
    pub(crate) log_syslog: bool,
    /// The datagram socket `logSyslog` sends to; another path only for tests or a chrooted syslog.
    pub(crate) syslog_socket: PathBuf,
    /// How long a call waits for another call holding the same volume's lock.
    pub(crate) lock_timeout_seconds: u64,
    /// How long any verb may run before it answers Failure (waitforattach included).
    pub(crate) verb_timeout_seconds: u64,
    /// Upper bound for any single external command.
    pub(crate) command_timeout_seconds: u64,
    /// Directories searched for tools (mount.nfs, lvm, blkid, mkfs.*), in order.
    pub(crate) tool_dirs: Vec<PathBuf>,
    /// hostPath backend policy.
    pub(crate) hostpath: crate::backend::hostpath::policy::HostPathConfig,
    /// NFS backend policy.
    pub nfs: crate::backend::nfs::options::NfsConfig,
    /// LVM backend policy.
    pub lvm: crate::backend::lvm::policy::LvmConfig,
    /// Provisioning roots, in rancher local-path-provisioner's `config.json` keys at the top level
    /// (`nodePathMap`, `storageClassConfigs`, ...): parsed apart, see [`Config::parse`].
    #[serde(skip)]
    pub(crate) local_path: crate::node::localpath::LocalPathConfig,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            state_dir: PathBuf::from("/var/lib/flexvol"),
            run_dir: PathBuf::from("/run/flexvol"),
            log_file: Some(PathBuf::from("/var/log/flexvol.log")),
            call_log_max_bytes: DEFAULT_CALL_LOG_MAX_BYTES,
            log_syslog: false,
            syslog_socket: PathBuf::from("/dev/log"),
            lock_timeout_seconds: 60,
            verb_timeout_seconds: 300,
            command_timeout_seconds: 120,
            tool_dirs: crate::sys::exec::DEFAULT_TOOL_DIRS
                .iter()
                .map(PathBuf::from)
                .collect(),
            hostpath: Default::default(),
            nfs: Default::default(),
            lvm: Default::default(),
            local_path: Default::default(),
        }
    }
}

/// A preset name of `hostpath.ephemeral`: a DNS label (what a pod's `volumeAttributes.preset`
/// names).
fn preset_name_ok(name: &str) -> bool {
    let b = name.as_bytes();
    let inner = |c: &u8| c.is_ascii_lowercase() || c.is_ascii_digit();
    (1..=63).contains(&b.len())
        && b.iter().all(|c| inner(c) || *c == b'-')
        && b.first().is_some_and(inner)
        && b.last().is_some_and(inner)
}

/// Why the config could not be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// Unreadable file (a missing default file is not an error: defaults apply).
    #[error("cannot read the flexvol config {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    /// Bad JSON or an unknown key.
    #[error(
        "the flexvol config {path} is invalid: {reason}; fix it (see README \"Configuration\") or remove it to use the defaults"
    )]
    Invalid { path: PathBuf, reason: String },
    /// Someone other than root could have written the file (see the module doc).
    #[error(
        "the flexvol config {path} is not trusted: {reason}, so someone other than root could have written the node's policy; {fix} (flexvol refuses such a config, as sshd's StrictModes does)"
    )]
    Untrusted {
        path: PathBuf,
        reason: String,
        fix: String,
    },
}

impl Config {
    /// The config file in effect: `$FLEXVOL_CONFIG` or the default path.
    pub(crate) fn path() -> (PathBuf, bool) {
        match std::env::var_os(ENV_VAR) {
            Some(p) if !p.is_empty() => (PathBuf::from(p), true),
            _ => (PathBuf::from(DEFAULT_PATH), false),
        }
    }

    /// Loads the config in effect. A missing file is fine only at the default path: a file named
    /// explicitly by `FLEXVOL_CONFIG` must exist. The file must be trusted (module doc).
    pub(crate) fn load() -> Result<Self, ConfigError> {
        let (path, explicit) = Self::path();
        let mut file = match std::fs::File::open(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && !explicit => {
                return Ok(Self::default());
            }
            Err(source) => return Err(ConfigError::Read { path, source }),
        };
        // Judge the opened file itself (fstat), so a swap after the check cannot slip through.
        let meta = file.metadata().map_err(|source| ConfigError::Read {
            path: path.clone(),
            source,
        })?;
        check_trusted(&path, &file, &meta)?;
        // Sized from the fstat above, read through `take` so std does not fstat and lseek again
        // for a size hint: two reads (the data, then end of file).
        let mut data =
            Vec::with_capacity(usize::try_from(meta.len()).unwrap_or(0).saturating_add(1));
        std::io::Read::read_to_end(&mut std::io::Read::take(&mut file, u64::MAX), &mut data)
            .map_err(|source| ConfigError::Read {
                path: path.clone(),
                source,
            })?;
        Self::parse(&path, &data)
    }

    /// Parses config JSON and checks its values.
    pub fn parse(path: &Path, data: &[u8]) -> Result<Self, ConfigError> {
        let invalid = |reason: String| ConfigError::Invalid {
            path: path.to_owned(),
            reason,
        };
        // local-path-provisioner's keys are split off first, so its config.json is a valid config
        // as it is. The roots it names are not hostPath allowed roots: they hold every claim's
        // volume, which the hostPath driver serves only to the claim's PV (its policy check).
        let mut obj: serde_json::Map<String, serde_json::Value> =
            serde_json::from_slice(data).map_err(|e| invalid(e.to_string()))?;
        let local_path = crate::node::localpath::LocalPathConfig::split_off(&mut obj)
            .map_err(invalid)?
            .unwrap_or_default();
        let mut c: Config = serde_json::from_value(serde_json::Value::Object(obj))
            .map_err(|e| invalid(e.to_string()))?;
        c.local_path = local_path;
        let path_ok = |p: &Path| p.is_absolute() && !crate::sys::paths::has_dotdot(p);
        for (name, p) in [
            ("stateDir", &c.state_dir),
            ("runDir", &c.run_dir),
            ("syslogSocket", &c.syslog_socket),
        ] {
            if !path_ok(p) {
                return Err(invalid(format!(
                    "{name} must be an absolute path without \"..\", got {:?}",
                    p.display().to_string()
                )));
            }
        }
        if let Some(f) = &c.log_file
            && !f.as_os_str().is_empty()
            && !path_ok(f)
        {
            return Err(invalid(format!(
                "logFile must be an absolute path without \"..\", got {:?}",
                f.display().to_string()
            )));
        }
        for d in &c.tool_dirs {
            if !path_ok(d) {
                return Err(invalid(format!(
                    "toolDirs entries must be absolute paths without \"..\" (a relative one would find tools wherever flexvol happens to run), got {:?}",
                    d.display().to_string()
                )));
            }
        }
        for r in &c.hostpath.allowed_roots {
            if !path_ok(r) || r == Path::new("/") {
                return Err(invalid(format!(
                    "hostpath.allowedRoots entries must be absolute paths without \"..\", other than /, got {:?}",
                    r.display().to_string()
                )));
            }
        }
        for (name, preset) in &c.hostpath.ephemeral {
            let r = &preset.root;
            if !preset_name_ok(name) {
                return Err(invalid(format!(
                    "hostpath.ephemeral preset names are 1 to 63 lowercase letters, digits and '-', starting and ending with a letter or digit, got {:?}",
                    crate::protocol::options::bounded(name)
                )));
            }
            if !path_ok(r) || r == Path::new("/") {
                return Err(invalid(format!(
                    "hostpath.ephemeral.{name}.root must be an absolute path without \"..\", other than /, got {:?}",
                    r.display().to_string()
                )));
            }
            if preset.max_per_namespace == Some(0) {
                return Err(invalid(format!(
                    "hostpath.ephemeral.{name}.maxPerNamespace must be at least 1 (leave it out for no count)"
                )));
            }
            let overlaps = |a: &PathBuf| {
                crate::sys::paths::is_under(r, a) || crate::sys::paths::is_under(a, r)
            };
            let taken = [
                ("hostpath.allowedRoots", c.hostpath.allowed_roots.clone()),
                ("a provisioning root", c.local_path.all_roots()),
            ];
            for (what, roots) in taken {
                if let Some(a) = roots.iter().find(|a| overlaps(a)) {
                    return Err(invalid(format!(
                        "hostpath.ephemeral.{name}.root {} overlaps {what} {}: pods' scratch directories must be reachable by no other volume and no provisioner; give the preset a root of its own",
                        r.display(),
                        a.display()
                    )));
                }
            }
        }
        if c.call_log_max_bytes != 0 && c.call_log_max_bytes < MIN_CALL_LOG_MAX_BYTES {
            return Err(invalid(format!(
                "callLogMaxBytes must be 0 (never rotate) or at least {MIN_CALL_LOG_MAX_BYTES}, got {}",
                c.call_log_max_bytes
            )));
        }
        let (lo, hi) = SECONDS_RANGE;
        for (name, value, min) in [
            ("lockTimeoutSeconds", c.lock_timeout_seconds, 0),
            ("verbTimeoutSeconds", c.verb_timeout_seconds, lo),
            ("commandTimeoutSeconds", c.command_timeout_seconds, lo),
            ("nfs.probeTimeoutSeconds", c.nfs.probe_timeout_seconds, lo),
            ("nfs.mountTimeoutSeconds", c.nfs.mount_timeout_seconds, lo),
            (
                "nfs.unmountTimeoutSeconds",
                c.nfs.unmount_timeout_seconds,
                lo,
            ),
            ("lvm.deviceWaitSeconds", c.lvm.device_wait_seconds, lo),
        ] {
            if !(min..=hi).contains(&value) {
                return Err(invalid(format!(
                    "{name} must be between {min} and {hi} seconds, got {value}"
                )));
            }
        }
        Ok(c)
    }

    /// The log file, `None` when logging to a file is off.
    pub(crate) fn log_path(&self) -> Option<&Path> {
        self.log_file
            .as_deref()
            .filter(|p| !p.as_os_str().is_empty())
    }

    /// Lock wait as a duration (clamped to [`SECONDS_RANGE`], also for a config built in code).
    pub(crate) fn lock_timeout(&self) -> Duration {
        Duration::from_secs(self.lock_timeout_seconds.min(SECONDS_RANGE.1))
    }

    /// Verb deadline as a duration (clamped to [`SECONDS_RANGE`]).
    pub(crate) fn verb_timeout(&self) -> Duration {
        Duration::from_secs(
            self.verb_timeout_seconds
                .clamp(SECONDS_RANGE.0, SECONDS_RANGE.1),
        )
    }

    /// Per-command cap as a duration (clamped to [`SECONDS_RANGE`]).
    pub(crate) fn command_timeout(&self) -> Duration {
        Duration::from_secs(
            self.command_timeout_seconds
                .clamp(SECONDS_RANGE.0, SECONDS_RANGE.1),
        )
    }

    /// Where this backend's locks live.
    pub(crate) fn lock_dir(&self) -> PathBuf {
        self.run_dir.join("locks")
    }
}

/// Refuses a config file that someone other than root (or us) could have written: the file
/// itself (`meta`, from the opened `file`) and every directory above it, both as named and as
/// the kernel resolved it.
///
/// When no component of the named path is a symlink (each directory above it `lstat`s as a
/// directory and the name `lstat`s as the opened file), the named path is the real one and the
/// `lstat`s are what `stat` would say: one syscall per directory. Otherwise the real path comes
/// from the opened descriptor (`/proc/self/fd/N`), and every directory on either path is judged
/// by `stat`, so a symlinked directory is judged by what it points to.
fn check_trusted(
    path: &Path,
    file: &std::fs::File,
    meta: &std::fs::Metadata,
) -> Result<(), ConfigError> {
    use std::os::unix::fs::MetadataExt;
    let me = nix::unistd::geteuid().as_raw();
    let untrusted = |reason: String, fix: String| ConfigError::Untrusted {
        path: path.to_owned(),
        reason,
        fix,
    };
    let shown = path.display();
    if !meta.is_file() {
        return Err(untrusted(
            "it is not a regular file".into(),
            "replace it with a regular file owned by root, mode 0644".into(),
        ));
    }
    if meta.uid() != 0 && meta.uid() != me {
        return Err(untrusted(
            format!("it is owned by uid {}, not root", meta.uid()),
            format!("chown root:root {shown}"),
        ));
    }
    if meta.mode() & 0o022 != 0 {
        return Err(untrusted(
            format!(
                "it is writable by group or others (mode {:04o})",
                meta.mode() & 0o7777
            ),
            format!("chmod go-w {shown}"),
        ));
    }
    let absolute = if path.is_absolute() {
        path.to_owned()
    } else {
        std::env::current_dir().unwrap_or_default().join(path)
    };
    let dirs = match plain_ancestors(&absolute, meta) {
        Some(dirs) => dirs,
        None => resolved_ancestors(&absolute, file),
    };
    for (d, m) in dirs {
        if m.uid() != 0 && m.uid() != me {
            return Err(untrusted(
                format!(
                    "its directory {} is owned by uid {}, not root",
                    d.display(),
                    m.uid()
                ),
                format!("chown root:root {}", d.display()),
            ));
        }
        if m.mode() & 0o022 != 0 && m.mode() & 0o1000 == 0 {
            return Err(untrusted(
                format!(
                    "its directory {} is writable by group or others without the sticky bit (mode {:04o})",
                    d.display(),
                    m.mode() & 0o7777
                ),
                format!("chmod go-w {}", d.display()),
            ));
        }
    }
    Ok(())
}

/// The directories above `absolute` with their `lstat`, when no component is a symlink and the
/// name is the opened file (`meta`); `None` otherwise.
fn plain_ancestors(
    absolute: &Path,
    meta: &std::fs::Metadata,
) -> Option<Vec<(PathBuf, std::fs::Metadata)>> {
    use std::os::unix::fs::MetadataExt;
    let named = std::fs::symlink_metadata(absolute).ok()?;
    if named.dev() != meta.dev() || named.ino() != meta.ino() || !named.is_file() {
        return None;
    }
    absolute
        .ancestors()
        .skip(1)
        .map(|d| {
            let m = std::fs::symlink_metadata(d).ok().filter(|m| m.is_dir())?;
            Some((d.to_owned(), m))
        })
        .collect()
}

/// The directories above `absolute` as named and above the opened `file`'s real path, each with
/// its `stat` (following symlinks); ones that cannot be stat'ed are left out.
fn resolved_ancestors(absolute: &Path, file: &std::fs::File) -> Vec<(PathBuf, std::fs::Metadata)> {
    use std::os::fd::AsRawFd;
    // The file's real path, as the kernel opened it (one readlink, whatever the depth).
    let real = std::fs::read_link(format!("/proc/self/fd/{}", file.as_raw_fd()))
        .ok()
        .filter(|p| p.is_absolute())
        .or_else(|| std::fs::canonicalize(absolute).ok());
    let mut dirs: Vec<PathBuf> = absolute.ancestors().skip(1).map(Path::to_owned).collect();
    if let Some(real) = real {
        for d in real.ancestors().skip(1) {
            if !dirs.iter().any(|x| x == d) {
                dirs.push(d.to_owned());
            }
        }
    }
    dirs.into_iter()
        .filter_map(|d| std::fs::metadata(&d).ok().map(|m| (d, m)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_overrides() {
        let c = Config::parse(
            Path::new("c"),
            br#"{"stateDir":"/s","logFile":"","hostpath":{"allowedRoots":["/srv"]}}"#,
        )
        .unwrap();
        assert_eq!(c.state_dir, Path::new("/s"));
        assert_eq!(c.run_dir, Path::new("/run/flexvol"));
        assert_eq!(c.log_path(), None);
        assert_eq!(c.hostpath.allowed_roots, vec![PathBuf::from("/srv")]);
        assert_eq!(
            Config::default().log_path(),
            Some(Path::new("/var/log/flexvol.log"))
        );
        assert_eq!(
            Config::parse(Path::new("c"), br#"{"logFile":null}"#)
                .unwrap()
                .log_path(),
            None
        );
    }

    #[test]
    fn ephemeral_presets_are_parsed_and_their_roots_are_their_own() {
        let c = Config::parse(
            Path::new("c"),
            br#"{"hostpath":{"allowedRoots":["/srv"],"ephemeral":{"scratch":{"root":"/var/lib/scratch","size":"1Gi"},"big":{"root":"/data/big","size":"10G","allowUnenforced":true,"maxPerNamespace":3}}}}"#,
        )
        .unwrap();
        let s = &c.hostpath.ephemeral["scratch"];
        assert_eq!((s.size, s.allow_unenforced), (1 << 30, false));
        assert_eq!(s.max_per_namespace, None);
        assert_eq!(c.hostpath.ephemeral["big"].max_per_namespace, Some(3));
        assert_eq!(c.hostpath.ephemeral["big"].size, 10_000_000_000);
        assert_eq!(c.hostpath.ephemeral_roots().len(), 2);
        for (json, says) in [
            // A root a pod could otherwise name (an allowed root, inside or around one) or that a
            // provisioner scans.
            (
                r#"{"hostpath":{"allowedRoots":["/srv"],"ephemeral":{"s":{"root":"/srv/scratch","size":"1Gi"}}}}"#,
                "overlaps hostpath.allowedRoots",
            ),
            (
                r#"{"hostpath":{"allowedRoots":["/srv/a"],"ephemeral":{"s":{"root":"/srv","size":"1Gi"}}}}"#,
                "overlaps hostpath.allowedRoots",
            ),
            (
                r#"{"nodePathMap":[{"node":"DEFAULT_PATH_FOR_NON_LISTED_NODES","paths":["/data"]}],"hostpath":{"allowedRoots":["/srv"],"ephemeral":{"s":{"root":"/data/s","size":"1Gi"}}}}"#,
                "overlaps a provisioning root",
            ),
            (
                r#"{"hostpath":{"ephemeral":{"s":{"root":"/","size":"1Gi"}}}}"#,
                "absolute path",
            ),
            (
                r#"{"hostpath":{"ephemeral":{"s":{"root":"/a/../etc","size":"1Gi"}}}}"#,
                "absolute path",
            ),
            (
                r#"{"hostpath":{"ephemeral":{"s":{"root":"rel","size":"1Gi"}}}}"#,
                "absolute path",
            ),
            (
                r#"{"hostpath":{"ephemeral":{"Bad_Name":{"root":"/x","size":"1Gi"}}}}"#,
                "preset names",
            ),
            (
                r#"{"hostpath":{"ephemeral":{"s":{"root":"/x","size":"1Gi","maxPerNamespace":0}}}}"#,
                "at least 1",
            ),
            (
                r#"{"hostpath":{"ephemeral":{"s":{"root":"/x","size":"0"}}}}"#,
                "more than zero",
            ),
            (
                r#"{"hostpath":{"ephemeral":{"s":{"root":"/x","size":"lots"}}}}"#,
                "expected a size",
            ),
            (r#"{"hostpath":{"ephemeral":{"s":{"root":"/x"}}}}"#, "size"),
            (
                r#"{"hostpath":{"ephemeral":{"s":{"root":"/x","size":"1Gi","path":"/y"}}}}"#,
                "unknown field",
            ),
        ] {
            let e = Config::parse(Path::new("c"), json.as_bytes())
                .unwrap_err()
                .to_string();
            assert!(e.contains(says), "{json}: {e}");
        }
    }

    #[test]
    fn numbers_out_of_range_name_the_key_and_the_range() {
        for (json, key) in [
            (
                r#"{"verbTimeoutSeconds":9300000000000000000}"#,
                "verbTimeoutSeconds",
            ),
            (
                r#"{"nfs":{"unmountTimeoutSeconds":0}}"#,
                "nfs.unmountTimeoutSeconds",
            ),
            (
                r#"{"lvm":{"deviceWaitSeconds":86401}}"#,
                "lvm.deviceWaitSeconds",
            ),
        ] {
            let e = Config::parse(Path::new("c"), json.as_bytes())
                .unwrap_err()
                .to_string();
            assert!(e.contains(key) && e.contains("between"), "{e}");
        }
        let c = Config::parse(
            Path::new("c"),
            br#"{"lockTimeoutSeconds":0,"verbTimeoutSeconds":86400}"#,
        )
        .unwrap();
        assert_eq!(c.verb_timeout(), Duration::from_secs(86_400));
        // Accessors stay bounded even for a config built in code.
        let wild = Config {
            verb_timeout_seconds: u64::MAX,
            ..Config::default()
        };
        assert_eq!(wild.verb_timeout(), Duration::from_secs(86_400));
    }

    #[test]
    fn typos_and_bad_values_are_errors() {
        for bad in [
            &br#"{"statedir":"/s"}"#[..],
            br#"{"hostpath":{"allowedroots":["/srv"]}}"#,
            br#"{"stateDir":"rel"}"#,
            br#"{"hostpath":{"allowedRoots":["/"]}}"#,
            br#"{"verbTimeoutSeconds":0}"#,
            br#"{"verbTimeoutSeconds":9300000000000000000}"#,
            br#"{"verbTimeoutSeconds":86401}"#,
            br#"{"commandTimeoutSeconds":18446744073709551615}"#,
            br#"{"lockTimeoutSeconds":100000}"#,
            br#"{"nfs":{"probeTimeoutSeconds":0}}"#,
            br#"{"nfs":{"mountTimeoutSeconds":99999999999}}"#,
            br#"{"lvm":{"deviceWaitSeconds":99999999999}}"#,
            br#"{"toolDirs":["sbin"]}"#,
            br#"{"toolDirs":["/usr/sbin", "./bin"]}"#,
            br#"{"toolDirs":["/usr/../tmp"]}"#,
            br#"{"hostpath":{"allowedRoots":["/srv/../etc"]}}"#,
            br#"{"hostpath":{"allowedRoots":["srv"]}}"#,
            b"{",
        ] {
            let e = Config::parse(Path::new("/etc/flexvol/config.json"), bad).unwrap_err();
            assert!(
                e.to_string()
                    .contains("/etc/flexvol/config.json is invalid"),
                "{e}"
            );
        }
    }
}
