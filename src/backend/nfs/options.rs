//! NFS options and node policy: everything a `mount` call may ask for, checked before anything
//! runs.
//!
//! The only things that reach `mount.nfs` are `SERVER:SHARE`, the target directory and one `-o`
//! string that is built here from parts that each passed a check:
//! - `server` is a hostname, an IPv4 address or a bracketed IPv6 address; `share` an absolute
//!   path without `..`. Neither may hold a comma, white space, a control character, a colon
//!   (outside the IPv6 brackets), a backslash or a leading `-`, so neither can smuggle in a mount
//!   option or an argument;
//! - `mountOptions` is split on commas and every item must be on the allow-list below (or in
//!   the node's `nfs.extraMountOptions`) with a value of the expected shape;
//! - `nosuid,nodev` are always added unless the node config allows `suid`/`dev`.

use crate::protocol::options::{Options, OptionsError};
use serde::Deserialize;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::PathBuf;

/// Node policy for NFS (`"nfs"` in the config file). Every key is optional.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields, rename_all = "camelCase")]
pub struct NfsConfig {
    /// Options every mount gets unless the volume's `mountOptions` overrides them (a volume's
    /// `soft` replaces the default `hard`, its `timeo=` the default `timeo=`, ...).
    pub(crate) default_mount_options: String,
    /// Mount option names allowed on top of the built-in list. `"fsc"` allows the flag `fsc`;
    /// `"clientaddr="` allows `clientaddr=<value>` (value: letters, digits and `.:_-` only).
    pub(crate) extra_mount_options: Vec<String>,
    /// Allow set-uid programs on NFS volumes (otherwise `nosuid` is forced and `suid` refused).
    pub(crate) allow_suid: bool,
    /// Allow device files on NFS volumes (otherwise `nodev` is forced and `dev` refused).
    pub(crate) allow_dev: bool,
    /// How long the reachability probe (name lookup plus TCP connect) may take.
    pub probe_timeout_seconds: u64,
    /// How long `mount.nfs` may run.
    pub(crate) mount_timeout_seconds: u64,
    /// How long each unmount step (normal, forced, lazy) may run.
    pub(crate) unmount_timeout_seconds: u64,
    /// The exports (`"server:/share"`) the NFS provisioner may make volumes in. The driver serves
    /// a share of their servers only to a PV carrying its capability (see [`crate::backend::nfs`]).
    /// Every node lists the same exports.
    #[serde(deserialize_with = "exports")]
    pub(crate) provisioned_exports: Vec<Export>,
    /// The shared capability key: a root-only file with the same bytes on every node (a Secret the
    /// DaemonSet mounts). flexvol never creates it.
    #[serde(deserialize_with = "key_file")]
    pub capability_key_file: Option<PathBuf>,
}

/// One export of `nfs.provisionedExports`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Export {
    /// The server, as written (checked like a volume's `server`).
    pub(crate) server: String,
    /// The exported path, without trailing slashes.
    pub(crate) share: String,
}

fn exports<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<Export>, D::Error> {
    let mut out = Vec::new();
    for e in Vec::<String>::deserialize(d)? {
        let bad = |why: String| {
            serde::de::Error::custom(format!(
                "nfs.provisionedExports entry {e:?}: {why} (expected \"server:/share\", e.g. \"nfs.example.com:/exports/k8s\")"
            ))
        };
        let (server, share) = split_source(&e).ok_or_else(|| bad("no \":\"".into()))?;
        check_server(server).map_err(|x| bad(x.to_string()))?;
        let share = check_share(share).map_err(|x| bad(x.to_string()))?;
        out.push(Export {
            server: server.to_owned(),
            share,
        });
    }
    Ok(out)
}

fn key_file<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<PathBuf>, D::Error> {
    match Option::<PathBuf>::deserialize(d)? {
        Some(p) if p.as_os_str().is_empty() => Ok(None),
        Some(p) if !p.is_absolute() || crate::sys::paths::has_dotdot(&p) => {
            Err(serde::de::Error::custom(format!(
                "nfs.capabilityKeyFile must be an absolute path without \"..\", got {:?}",
                p.display().to_string()
            )))
        }
        p => Ok(p),
    }
}

/// The IP address a server string spells, if it is a literal (`[v6]` brackets allowed).
pub(crate) fn literal_ip(server: &str) -> Option<IpAddr> {
    let s = server
        .strip_prefix('[')
        .and_then(|s| s.strip_suffix(']'))
        .unwrap_or(server);
    s.parse::<IpAddr>().ok().map(|ip| ip.to_canonical())
}

/// Whether two server strings are spelled the same: IP literals by value, names without case
/// and without a trailing dot. (Different spellings of one server are the driver's business: it
/// also compares resolved addresses.)
pub(crate) fn same_server(a: &str, b: &str) -> bool {
    match (literal_ip(a), literal_ip(b)) {
        (Some(x), Some(y)) => x == y,
        (None, None) => a
            .trim_end_matches('.')
            .eq_ignore_ascii_case(b.trim_end_matches('.')),
        _ => false,
    }
}

impl NfsConfig {
    /// The listed export `server:share` (exactly that share), if listed.
    pub(crate) fn provisioned_export(&self, server: &str, share: &str) -> Option<&Export> {
        self.provisioned_exports
            .iter()
            .find(|e| same_server(&e.server, server) && e.share == share)
    }
}

/// The default `defaultMountOptions`: the kernel's own TCP defaults, made explicit.
pub(crate) const DEFAULT_MOUNT_OPTIONS: &str = "hard,timeo=600,retrans=2";

impl Default for NfsConfig {
    fn default() -> Self {
        Self {
            default_mount_options: DEFAULT_MOUNT_OPTIONS.into(),
            extra_mount_options: Vec::new(),
            allow_suid: false,
            allow_dev: false,
            probe_timeout_seconds: 5,
            mount_timeout_seconds: 60,
            unmount_timeout_seconds: 10,
            provisioned_exports: Vec::new(),
            capability_key_file: None,
        }
    }
}

/// The NFS protocol version asked for (`version` option).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Version {
    /// Let the client negotiate (the highest both sides speak).
    Negotiate,
    /// NFSv3.
    V3,
    /// NFSv4, any minor version (negotiated).
    V4,
    /// NFSv4.0.
    V4_0,
    /// NFSv4.1.
    V4_1,
    /// NFSv4.2.
    V4_2,
}

impl Version {
    fn parse(s: &str) -> Result<Self, OptionsError> {
        Ok(match s {
            "" => Version::Negotiate,
            "3" => Version::V3,
            "4" => Version::V4,
            "4.0" => Version::V4_0,
            "4.1" => Version::V4_1,
            "4.2" => Version::V4_2,
            _ => {
                return Err(OptionsError::invalid(
                    "version",
                    s,
                    "expected 3, 4, 4.0, 4.1 or 4.2 (or leave it out to let the client negotiate)",
                ));
            }
        })
    }

    /// The `vers=` mount option, if any.
    pub(crate) fn mount_option(self) -> Option<&'static str> {
        match self {
            Version::Negotiate => None,
            Version::V3 => Some("vers=3"),
            Version::V4 => Some("vers=4"),
            Version::V4_0 => Some("vers=4.0"),
            Version::V4_1 => Some("vers=4.1"),
            Version::V4_2 => Some("vers=4.2"),
        }
    }
}

/// Typed, validated NFS options of one `mount` call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct NfsOptions {
    /// `server` as given: hostname, IPv4 or `[IPv6]`.
    pub(crate) server: String,
    /// `share`, without trailing slashes.
    pub(crate) share: String,
    /// `version`.
    pub(crate) version: Version,
    /// Read-only (`kubernetes.io/readwrite: ro`, or `ro` in `mountOptions`).
    pub(crate) read_only: bool,
    /// The complete `-o` string handed to `mount.nfs`.
    pub mount_options: String,
    /// The TCP port the probe connects to (`port=` or 2049).
    pub(crate) port: u16,
}

impl NfsOptions {
    /// `server:share`, as `mount.nfs` takes it and mountinfo shows it.
    pub fn source(&self) -> String {
        format!("{}:{}", self.server, self.share)
    }
}

/// The keys a volume may set (besides kubelet's own `kubernetes.io/*`).
pub(crate) const KNOWN_KEYS: &[&str] = &[
    "server",
    "share",
    "version",
    "mountOptions",
    crate::node::capability::OPTION,
];

/// How a mount option's value is checked.
#[derive(Debug, Clone, Copy)]
enum Value {
    /// A flag: no `=`.
    Flag,
    /// A decimal number in this inclusive range.
    Number(u64, u64),
    /// One of these words.
    OneOf(&'static [&'static str]),
    /// Letters, digits and `.:_-` (operator-allowed extras only).
    Word,
}

/// Options a volume may set. `group` names options that replace each other (the volume's `soft`
/// replaces the node default `hard`); `None` for options that stand alone.
const ALLOWED: &[(&str, Value, Option<&str>)] = &[
    ("hard", Value::Flag, Some("hardness")),
    ("soft", Value::Flag, Some("hardness")),
    ("softerr", Value::Flag, Some("hardness")),
    ("timeo", Value::Number(1, 6000), None),
    ("retrans", Value::Number(0, 100), None),
    ("retry", Value::Number(0, 10000), None),
    ("rsize", Value::Number(1024, 1 << 20), None),
    ("wsize", Value::Number(1024, 1 << 20), None),
    ("nconnect", Value::Number(1, 16), None),
    ("port", Value::Number(1, 65535), None),
    ("mountport", Value::Number(1, 65535), None),
    (
        "proto",
        Value::OneOf(&["tcp", "tcp6", "rdma", "rdma6"]),
        None,
    ),
    (
        "mountproto",
        Value::OneOf(&["tcp", "tcp6", "udp", "udp6"]),
        None,
    ),
    (
        "sec",
        Value::OneOf(&["sys", "krb5", "krb5i", "krb5p"]),
        None,
    ),
    (
        "lookupcache",
        Value::OneOf(&["all", "none", "pos", "positive"]),
        None,
    ),
    (
        "local_lock",
        Value::OneOf(&["none", "all", "flock", "posix"]),
        None,
    ),
    ("actimeo", Value::Number(0, 86400), None),
    ("acregmin", Value::Number(0, 86400), None),
    ("acregmax", Value::Number(0, 86400), None),
    ("acdirmin", Value::Number(0, 86400), None),
    ("acdirmax", Value::Number(0, 86400), None),
    ("ac", Value::Flag, Some("ac")),
    ("noac", Value::Flag, Some("ac")),
    ("cto", Value::Flag, Some("cto")),
    ("nocto", Value::Flag, Some("cto")),
    ("lock", Value::Flag, Some("lock")),
    ("nolock", Value::Flag, Some("lock")),
    ("resvport", Value::Flag, Some("resvport")),
    ("noresvport", Value::Flag, Some("resvport")),
    ("sharecache", Value::Flag, Some("sharecache")),
    ("nosharecache", Value::Flag, Some("sharecache")),
    ("intr", Value::Flag, Some("intr")),
    ("nointr", Value::Flag, Some("intr")),
    ("atime", Value::Flag, Some("atime")),
    ("noatime", Value::Flag, Some("atime")),
    ("relatime", Value::Flag, Some("atime")),
    ("strictatime", Value::Flag, Some("atime")),
    ("nodiratime", Value::Flag, None),
    ("exec", Value::Flag, Some("exec")),
    ("noexec", Value::Flag, Some("exec")),
    ("nosuid", Value::Flag, Some("suid")),
    ("nodev", Value::Flag, Some("dev")),
    ("ro", Value::Flag, Some("rw")),
    ("rw", Value::Flag, Some("rw")),
];

/// Options refused with a specific explanation.
fn refused_reason(name: &str, cfg: &NfsConfig) -> Option<String> {
    Some(match name {
        "vers" | "nfsvers" | "v3" | "v4" | "minorversion" => {
            "set the NFS version with the \"version\" option (3, 4, 4.1 or 4.2) instead".into()
        }
        "suid" if !cfg.allow_suid => {
            "set-uid programs are not allowed on NFS volumes of this node (node config nfs.allowSuid)"
                .into()
        }
        "dev" if !cfg.allow_dev => {
            "device files are not allowed on NFS volumes of this node (node config nfs.allowDev)"
                .into()
        }
        "suid" | "dev" => return None,
        "remount" | "bind" | "rbind" | "move" | "loop" => {
            "flexvol decides how the volume is mounted; this option would change what is mounted".into()
        }
        "addr" | "mountaddr" | "clientaddr" => {
            "addresses come from the \"server\" option only".into()
        }
        _ => return None,
    })
}

/// One parsed mount option: its name, the whole item, and its replacement group.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Item {
    name: String,
    text: String,
    group: String,
}

/// Parses a comma list of mount options against the allow-list. `key` names where it came from,
/// for messages (`mountOptions`, or the node config key).
fn parse_mount_options(key: &str, list: &str, cfg: &NfsConfig) -> Result<Vec<Item>, OptionsError> {
    let bad = |reason: String| OptionsError::invalid(key, list, reason);
    if list.chars().any(|c| c.is_control() || c.is_whitespace()) {
        return Err(bad(
            "must be one comma-separated list without spaces or control characters".into(),
        ));
    }
    if list.is_empty() {
        return Ok(Vec::new());
    }
    let mut items = Vec::new();
    for text in list.split(',') {
        if text.is_empty() {
            return Err(bad(
                "has an empty item (two commas in a row, or a leading or trailing comma)".into(),
            ));
        }
        let (name, value) = match text.split_once('=') {
            Some((n, v)) => (n, Some(v)),
            None => (text, None),
        };
        if let Some(reason) = refused_reason(name, cfg) {
            return Err(bad(format!("{name:?} is not allowed: {reason}")));
        }
        let builtin = match name {
            "suid" => Some((Value::Flag, Some("suid"))),
            "dev" => Some((Value::Flag, Some("dev"))),
            _ => ALLOWED
                .iter()
                .find(|(n, _, _)| *n == name)
                .map(|(_, v, g)| (*v, *g)),
        };
        let extra = cfg
            .extra_mount_options
            .iter()
            .find_map(|e| match e.strip_suffix('=') {
                Some(n) if n == name => Some(Value::Word),
                None if e == name => Some(Value::Flag),
                _ => None,
            });
        let (shape, group) = match (builtin, extra) {
            (Some(b), _) => b,
            (None, Some(v)) => (v, None),
            (None, None) => {
                return Err(bad(format!(
                    "{name:?} is not an allowed NFS mount option; ask the node operator to add it to nfs.extraMountOptions in the node config if it is needed (see drivers/nfs/README.md)"
                )));
            }
        };
        let ok = match (shape, value) {
            (Value::Flag, None) => true,
            (Value::Number(lo, hi), Some(v)) => {
                !v.is_empty()
                    && v.len() <= 10
                    && v.bytes().all(|b| b.is_ascii_digit())
                    && v.parse::<u64>().is_ok_and(|n| (lo..=hi).contains(&n))
            }
            (Value::OneOf(words), Some(v)) => words.contains(&v),
            (Value::Word, Some(v)) => {
                !v.is_empty()
                    && v.len() <= 255
                    && v.bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b".:_-".contains(&b))
            }
            _ => false,
        };
        if !ok {
            let expected = match shape {
                Value::Flag => "takes no value".to_string(),
                Value::Number(lo, hi) => format!("needs a whole number from {lo} to {hi}"),
                Value::OneOf(words) => format!("needs one of {}", words.join(", ")),
                Value::Word => "needs a value of letters, digits and .:_- only".to_string(),
            };
            return Err(bad(format!("{text:?}: {name} {expected}")));
        }
        items.push(Item {
            name: name.to_owned(),
            text: text.to_owned(),
            group: group.unwrap_or(name).to_owned(),
        });
    }
    Ok(items)
}

/// Checks `server`: a hostname, IPv4 address or bracketed IPv6 address.
fn check_server(s: &str) -> Result<(), OptionsError> {
    let bad = |reason: &str| OptionsError::invalid("server", s, reason.to_string());
    if s.starts_with('-') {
        return Err(bad("must not start with \"-\""));
    }
    if s.chars()
        .any(|c| c.is_control() || c.is_whitespace() || c == ',')
    {
        return Err(bad(
            "must be a hostname or IP address without spaces, commas or control characters",
        ));
    }
    if let Some(inner) = s.strip_prefix('[') {
        let inner = inner
            .strip_suffix(']')
            .ok_or_else(|| bad("an IPv6 address must be written in brackets, e.g. [fd00::5]"))?;
        if inner.contains('%') {
            return Err(bad(
                "IPv6 zone ids (link-local %interface) are not supported; use a global or unique-local address",
            ));
        }
        inner
            .parse::<Ipv6Addr>()
            .map_err(|_| bad("is not a valid IPv6 address in brackets, e.g. [fd00::5]"))?;
        return Ok(());
    }
    if s.contains(':') {
        return Err(bad(if s.parse::<Ipv6Addr>().is_ok() {
            "an IPv6 address must be written in brackets, e.g. [fd00::5]"
        } else {
            "must be a hostname, an IPv4 address or a bracketed IPv6 address; the export path goes in \"share\""
        }));
    }
    if s.bytes().all(|b| b.is_ascii_digit() || b == b'.') {
        s.parse::<Ipv4Addr>()
            .map_err(|_| bad("is not a valid IPv4 address"))?;
        return Ok(());
    }
    let label_ok = |l: &str| {
        !l.is_empty()
            && l.len() <= 63
            && !l.starts_with('-')
            && !l.ends_with('-')
            && l.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    };
    if s.len() > 253 || !s.trim_end_matches('.').split('.').all(label_ok) {
        return Err(bad(
            "is not a valid hostname (letters, digits, \"-\" and \"_\" in dot-separated labels)",
        ));
    }
    Ok(())
}

/// Checks `share` and returns it without trailing slashes.
fn check_share(s: &str) -> Result<String, OptionsError> {
    let bad = |reason: &str| OptionsError::invalid("share", s, reason.to_string());
    if !s.starts_with('/') {
        return Err(bad(
            "must be the absolute path the server exports, e.g. /exports/data",
        ));
    }
    if s.len() > 1024 {
        return Err(bad("is longer than 1024 bytes"));
    }
    if s.chars()
        .any(|c| c.is_control() || c.is_whitespace() || matches!(c, ',' | ':' | '\\'))
    {
        return Err(bad(
            "must not contain spaces, commas, colons, backslashes or control characters",
        ));
    }
    let trimmed = match s.trim_end_matches('/') {
        "" => "/",
        t => t,
    };
    if trimmed != "/"
        && trimmed
            .split('/')
            .skip(1)
            .any(|c| c.is_empty() || c == "." || c == "..")
    {
        return Err(bad(
            "must not contain empty, \".\" or \"..\" components; write the export path exactly",
        ));
    }
    Ok(trimmed.to_owned())
}

impl NfsOptions {
    /// Validates the options of a `mount` call against the node policy `cfg`. Nothing has run
    /// when this fails.
    pub fn parse(o: &Options, cfg: &NfsConfig) -> Result<Self, OptionsError> {
        if let Some(k) = o
            .plain()
            .keys()
            .find(|k| !k.starts_with("kubernetes.io/") && !KNOWN_KEYS.contains(&k.as_str()))
        {
            return Err(OptionsError::unknown(
                k,
                format!(
                    "unknown NFS option; the options are {} (see drivers/nfs/README.md)",
                    KNOWN_KEYS.join(", ")
                ),
            ));
        }
        let server = o.require(
            "server",
            "set options.server to the NFS server's hostname or IP address",
        )?;
        check_server(server)?;
        let share = check_share(o.require(
            "share",
            "set options.share to the exported path, e.g. /exports/data",
        )?)?;
        let version = Version::parse(o.get("version").unwrap_or(""))?;

        let user = parse_mount_options("mountOptions", o.get("mountOptions").unwrap_or(""), cfg)?;
        let defaults = parse_mount_options(
            "nfs.defaultMountOptions (node config)",
            &cfg.default_mount_options,
            cfg,
        )?;
        let read_only = o.read_only()? || user.iter().any(|i| i.name == "ro");

        // Order: rw/ro, version, node defaults the volume does not override, the volume's own
        // options, then the forced nosuid/nodev.
        let mut parts: Vec<String> = vec![if read_only { "ro" } else { "rw" }.into()];
        parts.extend(version.mount_option().map(str::to_owned));
        let overridden = |i: &Item| user.iter().any(|u| u.group == i.group);
        for i in defaults
            .iter()
            .filter(|i| !overridden(i) && i.group != "rw")
        {
            parts.push(i.text.clone());
        }
        for i in user.iter().filter(|i| i.group != "rw") {
            if !parts.contains(&i.text) {
                parts.push(i.text.clone());
            }
        }
        // `suid`/`dev` got this far only if the node allows them; otherwise force the safe flag.
        for (asked, safe) in [("suid", "nosuid"), ("dev", "nodev")] {
            if !parts.iter().any(|p| p == asked || p == safe) {
                parts.push(safe.into());
            }
        }
        let port = user
            .iter()
            .chain(&defaults)
            .find(|i| i.name == "port")
            .and_then(|i| i.text.split_once('=')?.1.parse().ok())
            .unwrap_or(2049);
        Ok(Self {
            server: server.to_owned(),
            share,
            version,
            read_only,
            mount_options: parts.join(","),
            port,
        })
    }
}

/// Splits a mount source `server:/share` (as mountinfo shows it) into server and share.
pub(crate) fn split_source(source: &str) -> Option<(&str, &str)> {
    if source.starts_with('[') {
        let end = source.find("]:")?;
        return Some((&source[..=end], &source[end + 2..]));
    }
    source.split_once(':')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_with(json: &str, cfg: &NfsConfig) -> Result<NfsOptions, OptionsError> {
        NfsOptions::parse(&Options::parse(json).unwrap(), cfg)
    }

    fn parse(json: &str) -> Result<NfsOptions, OptionsError> {
        parse_with(json, &NfsConfig::default())
    }

    fn with(extra: &str) -> String {
        format!(r#"{{"server":"nfs.example.com","share":"/exports/data"{extra}}}"#)
    }

    #[test]
    fn builds_the_option_string_per_version_and_readonly() {
        let o = parse(&with("")).unwrap();
        assert_eq!(o.source(), "nfs.example.com:/exports/data");
        assert_eq!(o.mount_options, "rw,hard,timeo=600,retrans=2,nosuid,nodev");
        assert_eq!(o.port, 2049);
        for (v, want) in [
            ("3", "rw,vers=3,"),
            ("4", "rw,vers=4,"),
            ("4.0", "rw,vers=4.0,"),
            ("4.1", "rw,vers=4.1,"),
            ("4.2", "rw,vers=4.2,"),
        ] {
            let o = parse(&with(&format!(r#","version":"{v}""#))).unwrap();
            assert!(
                o.mount_options.starts_with(want),
                "{v}: {}",
                o.mount_options
            );
        }
        let ro = parse(&with(r#","kubernetes.io/readwrite":"ro""#)).unwrap();
        assert!(ro.read_only);
        assert_eq!(ro.mount_options, "ro,hard,timeo=600,retrans=2,nosuid,nodev");
        // `ro` in mountOptions makes the volume read-only for every pod, whatever the claim says.
        let ro = parse(&with(
            r#","mountOptions":"ro","kubernetes.io/readwrite":"rw""#,
        ))
        .unwrap();
        assert_eq!(ro.mount_options, "ro,hard,timeo=600,retrans=2,nosuid,nodev");
        // `rw` in mountOptions cannot undo a read-only claim.
        let ro = parse(&with(
            r#","mountOptions":"rw","kubernetes.io/readwrite":"ro""#,
        ))
        .unwrap();
        assert!(ro.read_only);
    }

    #[test]
    fn the_readme_example_is_what_mount_nfs_gets() {
        // drivers/nfs/README.md and examples/pv.yaml quote this exact string.
        let o = parse(
            r#"{"server":"10.0.0.5","share":"/exports/data","version":"4.2","mountOptions":"noatime,nconnect=4"}"#,
        )
        .unwrap();
        assert_eq!(
            o.mount_options,
            "rw,vers=4.2,hard,timeo=600,retrans=2,noatime,nconnect=4,nosuid,nodev"
        );
        let o = parse(
            r#"{"server":"nfs.storage.example.com","share":"/exports/web","version":"3","mountOptions":"soft,timeo=100,retrans=3,noresvport","kubernetes.io/readwrite":"ro"}"#,
        )
        .unwrap();
        assert_eq!(
            o.mount_options,
            "ro,vers=3,soft,timeo=100,retrans=3,noresvport,nosuid,nodev"
        );
    }

    #[test]
    fn volume_options_replace_node_defaults_of_the_same_kind() {
        let o = parse(&with(
            r#","mountOptions":"soft,timeo=50,nconnect=4,noresvport,port=20490,noatime","version":"4.2""#,
        ))
        .unwrap();
        assert_eq!(
            o.mount_options,
            "rw,vers=4.2,retrans=2,soft,timeo=50,nconnect=4,noresvport,port=20490,noatime,nosuid,nodev"
        );
        assert_eq!(o.port, 20490);
        let o = parse(&with(r#","mountOptions":"nosuid,nodev,hard""#)).unwrap();
        assert_eq!(o.mount_options, "rw,timeo=600,retrans=2,nosuid,nodev,hard");
    }

    #[test]
    fn suid_and_dev_only_when_the_node_allows_them() {
        assert!(parse(&with(r#","mountOptions":"suid""#)).is_err());
        assert!(parse(&with(r#","mountOptions":"dev""#)).is_err());
        let cfg = NfsConfig {
            allow_suid: true,
            allow_dev: true,
            ..Default::default()
        };
        let o = parse_with(&with(r#","mountOptions":"suid,dev""#), &cfg).unwrap();
        assert_eq!(o.mount_options, "rw,hard,timeo=600,retrans=2,suid,dev");
        // Allowed, not asked: still nosuid,nodev.
        let o = parse_with(&with(""), &cfg).unwrap();
        assert!(o.mount_options.ends_with(",nosuid,nodev"));
    }

    #[test]
    fn node_extra_options() {
        assert!(parse(&with(r#","mountOptions":"fsc""#)).is_err());
        let cfg = NfsConfig {
            extra_mount_options: vec!["fsc".into(), "clientaddr=".into()],
            ..Default::default()
        };
        let o = parse_with(&with(r#","mountOptions":"fsc""#), &cfg).unwrap();
        assert!(o.mount_options.contains(",fsc,"));
        // clientaddr stays refused: addresses come from "server" only.
        assert!(parse_with(&with(r#","mountOptions":"clientaddr=10.0.0.1""#), &cfg).is_err());
        assert!(parse_with(&with(r#","mountOptions":"fsc=x""#), &cfg).is_err());
        let bad = NfsConfig {
            default_mount_options: "hard,bogus".into(),
            ..Default::default()
        };
        let e = parse_with(&with(""), &bad).unwrap_err();
        assert!(e.to_string().contains("nfs.defaultMountOptions"), "{e}");
    }

    #[test]
    fn every_injection_attempt_is_refused() {
        let cases: &[(&str, &str)] = &[
            // server
            (r#"{"server":"-oremount","share":"/x"}"#, "leading dash"),
            (r#"{"server":"","share":"/x"}"#, "empty server"),
            (r#"{"share":"/x"}"#, "missing server"),
            (r#"{"server":"a,b","share":"/x"}"#, "comma"),
            (r#"{"server":"a b","share":"/x"}"#, "space"),
            (r#"{"server":"a\nb","share":"/x"}"#, "newline"),
            (r#"{"server":"a\u0000b","share":"/x"}"#, "nul"),
            (r#"{"server":"fd00::1","share":"/x"}"#, "unbracketed v6"),
            (r#"{"server":"[fd00::1","share":"/x"}"#, "half bracket"),
            (r#"{"server":"[fe80::1%eth0]","share":"/x"}"#, "zone"),
            (r#"{"server":"[nothex]","share":"/x"}"#, "bad v6"),
            (r#"{"server":"host:/y","share":"/x"}"#, "colon"),
            (r#"{"server":"1.2.3.999","share":"/x"}"#, "bad v4"),
            (r#"{"server":"user@host","share":"/x"}"#, "at sign"),
            (r#"{"server":"-host","share":"/x"}"#, "label dash"),
            (r#"{"server":"a..b","share":"/x"}"#, "empty label"),
            // share
            (r#"{"server":"h","share":"/x,suid"}"#, "comma in share"),
            (r#"{"server":"h","share":"x"}"#, "relative"),
            (r#"{"server":"h","share":"-o"}"#, "dash share"),
            (r#"{"server":"h","share":""}"#, "empty share"),
            (r#"{"server":"h","share":"/a/../b"}"#, "dotdot"),
            (r#"{"server":"h","share":"/a/./b"}"#, "dot"),
            (r#"{"server":"h","share":"/a//b"}"#, "double slash"),
            (r#"{"server":"h","share":"/a b"}"#, "space"),
            (r#"{"server":"h","share":"/a\tb"}"#, "tab"),
            (r#"{"server":"h","share":"/a\nb"}"#, "newline"),
            (r#"{"server":"h","share":"/a:b"}"#, "colon"),
            (r#"{"server":"h","share":"/a\\b"}"#, "backslash"),
            // version
            (r#"{"server":"h","share":"/x","version":"5"}"#, "v5"),
            (r#"{"server":"h","share":"/x","version":"4.3"}"#, "v4.3"),
            (r#"{"server":"h","share":"/x","version":"v4"}"#, "v4 word"),
            (r#"{"server":"h","share":"/x","version":"4,suid"}"#, "comma"),
            // mountOptions
            (
                r#"{"server":"h","share":"/x","mountOptions":"rw,suid"}"#,
                "suid",
            ),
            (r#"{"server":"h","share":"/x","mountOptions":"dev"}"#, "dev"),
            (
                r#"{"server":"h","share":"/x","mountOptions":"sec=sys\nx"}"#,
                "newline",
            ),
            (
                r#"{"server":"h","share":"/x","mountOptions":"sec=sys x"}"#,
                "space",
            ),
            (
                r#"{"server":"h","share":"/x","mountOptions":"hard,,soft"}"#,
                "empty item",
            ),
            (
                r#"{"server":"h","share":"/x","mountOptions":",hard"}"#,
                "leading comma",
            ),
            (
                r#"{"server":"h","share":"/x","mountOptions":"vers=3"}"#,
                "vers",
            ),
            (
                r#"{"server":"h","share":"/x","mountOptions":"nfsvers=4"}"#,
                "nfsvers",
            ),
            (
                r#"{"server":"h","share":"/x","mountOptions":"remount"}"#,
                "remount",
            ),
            (
                r#"{"server":"h","share":"/x","mountOptions":"bind"}"#,
                "bind",
            ),
            (
                r#"{"server":"h","share":"/x","mountOptions":"addr=1.2.3.4"}"#,
                "addr",
            ),
            (
                r#"{"server":"h","share":"/x","mountOptions":"context=system_u:object_r:x"}"#,
                "context",
            ),
            (
                r#"{"server":"h","share":"/x","mountOptions":"x-mount.mkdir"}"#,
                "x-mount",
            ),
            (
                r#"{"server":"h","share":"/x","mountOptions":"timeo=abc"}"#,
                "timeo word",
            ),
            (
                r#"{"server":"h","share":"/x","mountOptions":"timeo=-1"}"#,
                "timeo negative",
            ),
            (
                r#"{"server":"h","share":"/x","mountOptions":"timeo=0"}"#,
                "timeo zero",
            ),
            (
                r#"{"server":"h","share":"/x","mountOptions":"timeo"}"#,
                "timeo no value",
            ),
            (
                r#"{"server":"h","share":"/x","mountOptions":"hard=1"}"#,
                "flag with value",
            ),
            (
                r#"{"server":"h","share":"/x","mountOptions":"sec=none"}"#,
                "sec none",
            ),
            (
                r#"{"server":"h","share":"/x","mountOptions":"proto=udp"}"#,
                "udp",
            ),
            (
                r#"{"server":"h","share":"/x","mountOptions":"port=0"}"#,
                "port 0",
            ),
            (
                r#"{"server":"h","share":"/x","mountOptions":"port=70000"}"#,
                "port big",
            ),
            (
                r#"{"server":"h","share":"/x","mountOptions":"suid=1"}"#,
                "suid value",
            ),
            // readwrite and unknown keys
            (
                r#"{"server":"h","share":"/x","kubernetes.io/readwrite":"RO"}"#,
                "RO",
            ),
            (
                r#"{"server":"h","share":"/x","readonly":"true"}"#,
                "unknown key",
            ),
            (
                r#"{"server":"h","share":"/x","mountoptions":"suid"}"#,
                "typo key",
            ),
        ];
        for (json, what) in cases {
            assert!(parse(json).is_err(), "{what}: {json} should be refused");
        }
    }

    #[test]
    fn valid_servers_and_shares() {
        for s in [
            "10.0.0.5",
            "127.0.0.1",
            "[fd00::5]",
            "[::1]",
            "nfs",
            "nfs-1.storage.example.com",
            "nfs.example.com.",
            "my_nfs",
        ] {
            check_server(s).unwrap_or_else(|e| panic!("{s}: {e}"));
        }
        assert_eq!(check_share("/").unwrap(), "/");
        assert_eq!(check_share("/exports/data/").unwrap(), "/exports/data");
        assert_eq!(check_share("/srv/nfs").unwrap(), "/srv/nfs");
        assert_eq!(check_share("/srv/dé-jà_1.x").unwrap(), "/srv/dé-jà_1.x");
    }

    #[test]
    fn sources_split_back() {
        assert_eq!(split_source("10.0.0.5:/x"), Some(("10.0.0.5", "/x")));
        assert_eq!(split_source("[fd00::5]:/x/y"), Some(("[fd00::5]", "/x/y")));
        assert_eq!(split_source("h:/"), Some(("h", "/")));
        assert_eq!(split_source("tmpfs"), None);
    }
}
