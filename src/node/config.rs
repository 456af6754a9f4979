//! The node configuration: `/etc/flexvol/config.json`, or the file named by `FLEXVOL_CONFIG`.
//!
//! It holds node policy (which host paths hostPath volumes may use, ...) and where flexvol keeps its
//! state, locks and log. All keys are optional; an unknown key is an error, because a typo in a
//! policy key must not silently fall back to a permissive default.

use serde::Deserialize;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Where the config is read from unless `FLEXVOL_CONFIG` says otherwise.
pub const DEFAULT_PATH: &str = "/etc/flexvol/config.json";
/// Environment variable naming another config file (tests, unusual nodes).
pub const ENV_VAR: &str = "FLEXVOL_CONFIG";

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
    /// Also send each call record to the system log (`/dev/log`: journald or syslog).
    pub log_syslog: bool,
    /// The datagram socket `logSyslog` sends to; another path only for tests or a chrooted syslog.
    pub syslog_socket: PathBuf,
    /// How long a call waits for another call holding the same volume's lock.
    pub lock_timeout_seconds: u64,
    /// How long any verb may run before it answers Failure (waitforattach included).
    pub verb_timeout_seconds: u64,
    /// Upper bound for any single external command.
    pub command_timeout_seconds: u64,
    /// Directories searched for tools (mount.nfs, lvm, blkid, mkfs.*), in order.
    pub tool_dirs: Vec<PathBuf>,
    /// hostPath backend policy.
    pub hostpath: HostPathConfig,
    /// NFS backend policy.
    pub nfs: crate::backend::nfs::NfsConfig,
    /// LVM backend policy.
    pub lvm: crate::backend::lvm::LvmConfig,
    /// Provisioning roots, in rancher local-path-provisioner's `config.json` keys at the top level
    /// (`nodePathMap`, `storageClassConfigs`, ...): parsed apart, see [`Config::parse`].
    #[serde(skip)]
    pub local_path: crate::provision::localpath::LocalPathConfig,
}

/// Policy for the hostPath backend.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct HostPathConfig {
    /// When non-empty, volumes may only use paths under these directories (after resolving
    /// symlinks). When empty, a built-in list of system locations is refused instead.
    pub allowed_roots: Vec<PathBuf>,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            state_dir: PathBuf::from("/var/lib/flexvol"),
            run_dir: PathBuf::from("/run/flexvol"),
            log_file: Some(PathBuf::from("/var/log/flexvol.log")),
            log_syslog: false,
            syslog_socket: PathBuf::from("/dev/log"),
            lock_timeout_seconds: 60,
            verb_timeout_seconds: 300,
            command_timeout_seconds: 120,
            tool_dirs: crate::sys::exec::DEFAULT_TOOL_DIRS
                .iter()
                .map(PathBuf::from)
                .collect(),
            hostpath: HostPathConfig::default(),
            nfs: Default::default(),
            lvm: Default::default(),
            local_path: Default::default(),
        }
    }
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
}

impl Config {
    /// The config file in effect: `$FLEXVOL_CONFIG` or the default path.
    pub fn path() -> (PathBuf, bool) {
        match std::env::var_os(ENV_VAR) {
            Some(p) if !p.is_empty() => (PathBuf::from(p), true),
            _ => (PathBuf::from(DEFAULT_PATH), false),
        }
    }

    /// Loads the config in effect. A missing file is fine only at the default path: a file named
    /// explicitly by `FLEXVOL_CONFIG` must exist.
    pub fn load() -> Result<Self, ConfigError> {
        let (path, explicit) = Self::path();
        match std::fs::read(&path) {
            Ok(data) => Self::parse(&path, &data),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && !explicit => Ok(Self::default()),
            Err(source) => Err(ConfigError::Read { path, source }),
        }
    }

    /// Parses config JSON and checks its values.
    pub fn parse(path: &Path, data: &[u8]) -> Result<Self, ConfigError> {
        let invalid = |reason: String| ConfigError::Invalid {
            path: path.to_owned(),
            reason,
        };
        // local-path-provisioner's keys are split off first, so its config.json is a valid config
        // as it is; every root it names is also an allowed hostPath root (added to the list).
        let mut obj: serde_json::Map<String, serde_json::Value> =
            serde_json::from_slice(data).map_err(|e| invalid(e.to_string()))?;
        let local_path = crate::provision::localpath::LocalPathConfig::split_off(&mut obj)
            .map_err(invalid)?
            .unwrap_or_default();
        let mut c: Config = serde_json::from_value(serde_json::Value::Object(obj))
            .map_err(|e| invalid(e.to_string()))?;
        c.hostpath.allowed_roots.extend(local_path.all_roots());
        c.local_path = local_path;
        for (name, p) in [
            ("stateDir", &c.state_dir),
            ("runDir", &c.run_dir),
            ("syslogSocket", &c.syslog_socket),
        ] {
            if !p.is_absolute() {
                return Err(invalid(format!(
                    "{name} must be an absolute path, got {:?}",
                    p.display().to_string()
                )));
            }
        }
        if let Some(f) = &c.log_file
            && !f.as_os_str().is_empty()
            && !f.is_absolute()
        {
            return Err(invalid(format!(
                "logFile must be an absolute path, got {:?}",
                f.display().to_string()
            )));
        }
        for r in &c.hostpath.allowed_roots {
            if !r.is_absolute() || r == Path::new("/") {
                return Err(invalid(format!(
                    "hostpath.allowedRoots entries must be absolute directories other than /, got {:?}",
                    r.display().to_string()
                )));
            }
        }
        if c.verb_timeout_seconds == 0 || c.command_timeout_seconds == 0 {
            return Err(invalid(
                "verbTimeoutSeconds and commandTimeoutSeconds must be at least 1".into(),
            ));
        }
        Ok(c)
    }

    /// The log file, `None` when logging to a file is off.
    pub fn log_path(&self) -> Option<&Path> {
        self.log_file
            .as_deref()
            .filter(|p| !p.as_os_str().is_empty())
    }

    /// Lock wait as a duration.
    pub fn lock_timeout(&self) -> Duration {
        Duration::from_secs(self.lock_timeout_seconds)
    }

    /// Verb deadline as a duration.
    pub fn verb_timeout(&self) -> Duration {
        Duration::from_secs(self.verb_timeout_seconds)
    }

    /// Per-command cap as a duration.
    pub fn command_timeout(&self) -> Duration {
        Duration::from_secs(self.command_timeout_seconds)
    }

    /// Where this backend's locks live.
    pub fn lock_dir(&self) -> PathBuf {
        self.run_dir.join("locks")
    }
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
    fn typos_and_bad_values_are_errors() {
        for bad in [
            &br#"{"statedir":"/s"}"#[..],
            br#"{"hostpath":{"allowedroots":["/srv"]}}"#,
            br#"{"stateDir":"rel"}"#,
            br#"{"hostpath":{"allowedRoots":["/"]}}"#,
            br#"{"verbTimeoutSeconds":0}"#,
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
