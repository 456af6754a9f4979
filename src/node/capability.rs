//! Capabilities: the proof, carried in a PV's options, that `flexvol provisioner` made a volume
//! for exactly that PV.
//!
//! Anything the provisioner makes — a directory under a provisioning root, an LV tagged
//! `flexvol.pv.<pv>`, a subdirectory of an NFS export it provisions into — is served by the
//! drivers only to a call whose options carry [`OPTION`] with a valid token for that volume. A
//! pod author writing an inline `flexVolume` can name the same path, LV or share, but cannot
//! produce the token: it is an HMAC-SHA256 under a key only root on the nodes can read, over the
//! kind, the PV's name, its claim's namespace and the volume's location ([`message_v2`]; the
//! token is `v2.<namespace>.<tag>`). A pod's call is served only when kubelet's
//! `kubernetes.io/pod.namespace` (which options cannot override: the API server refuses
//! `kubernetes.io/` option keys) is the token's namespace, so a token that leaks — PVs are
//! readable by whoever RBAC lets read them, and options are in a driver's argv while it runs —
//! opens nothing a member of that namespace could not already mount through the claim. Tokens
//! made before namespaces were covered (`v1.`, [`message`]) keep working without re-creating the
//! PV: the provisioner records each such PV's claim namespace in a root-only grant on every node
//! that may mount it (the same file as a legacy grant, below), and a pod's call is served only in
//! that namespace — none before the grant is written. Calls without a pod (kubelet staging an
//! LV, kube-controller-manager attaching) name no namespace and check the token alone; the pod's
//! own `mount` that follows is checked in full.
//!
//! Keys ([`Key`]):
//! - the **node key**, `<stateDir>/capability.key` ([`node_key_path`]), signs and checks node-local
//!   volumes (hostPath, LVM). The provisioner of a node creates it on first use
//!   ([`Key::load_or_create`]); it never leaves the node, so root on one node cannot mint tokens
//!   for another node's volumes;
//! - the **shared key** (`nfs.capabilityKeyFile` in the node config) signs and checks NFS
//!   subdirectories, which any node may provision and any node mounts: every node needs the same
//!   bytes (the deployment mounts one Secret). It is never created here: a missing shared key is
//!   an error that says how to make one.
//!
//! Safety rules:
//! - a key file is trusted only when it is a regular file owned by root (or the user we run as)
//!   that nobody else can read or write (mode `0?00`), opened without following a symlink and
//!   judged by `fstat` of the opened file; anything else is [`KeyError::Untrusted`];
//! - the token's option name contains `token`, so the broad redaction rule of
//!   [`crate::protocol::options`] hides its value in every message, log and record;
//! - verification is constant-time ([`ring::hmac::verify`]) and a malformed token is simply
//!   invalid (never an error that echoes it).
//!
//! PVs made before capabilities existed carry no token, and a PV's source is immutable. The
//! provisioner writes a **legacy grant** for each of them ([`write_legacy_grant`]): a root-only
//! file in the state directory, keyed by the volume's location, naming the PV and its claim's
//! namespace. A driver serves such a volume without a token only to that PV name
//! (`kubernetes.io/pvOrVolumeName`) in that namespace (`kubernetes.io/pod.namespace`, which
//! kubelet sets and options cannot override) — so an inline volume of another namespace is
//! refused, and one in the claim's own namespace reaches nothing its authors could not mount
//! through the claim anyway.
//!
//! Caller contract: the location strings are the exact option values the PV carries (the
//! hostPath `path`, `<volumegroup>/<volumeID>` for LVM, `<server>:<share>` for NFS); the signer
//! and the checker must build them the same way, which [`Location`] does.

use crate::sys::paths::{Place, write_private};
use ring::hmac;
use std::io::Read;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// The PV option that carries the token. Its name contains `token`: redacted everywhere.
pub(crate) const OPTION: &str = "capabilityToken";
/// The node key's file name inside the state directory.
pub(crate) const NODE_KEY_FILE: &str = "capability.key";
/// Key length made by [`Key::load_or_create`].
pub(crate) const KEY_BYTES: usize = 32;
/// Shortest key accepted from a file (a shared key an operator made).
pub(crate) const MIN_KEY_BYTES: usize = 16;
/// Longest key file read.
pub(crate) const MAX_KEY_BYTES: usize = 4096;
/// The version prefix of a token made before tokens named their namespace (kind, PV, location).
const TOKEN_PREFIX: &str = "v1.";
/// The version prefix of a token that also covers its claim's namespace:
/// `v2.<namespace>.<hex tag>` (a namespace is a DNS label: no `.` in it).
const TOKEN_V2_PREFIX: &str = "v2.";

/// The node key's path for a state directory.
pub fn node_key_path(state_dir: &Path) -> PathBuf {
    state_dir.join(NODE_KEY_FILE)
}

/// What a token is about: the kind of volume and where it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Location<'a> {
    /// A hostPath directory: the PV's `path` option (absolute, canonical as provisioned).
    HostPath(&'a str),
    /// An LV: volume group and LV name (the PV's `volumegroup` and `volumeID`).
    Lvm { vg: &'a str, lv: &'a str },
    /// An NFS directory: the PV's `server` and `share` options.
    Nfs { server: &'a str, share: &'a str },
}

impl Location<'_> {
    /// The kind's name, as in the driver name (`hostpath`, `lvm`, `nfs`).
    pub fn kind(&self) -> &'static str {
        match self {
            Location::HostPath(_) => "hostpath",
            Location::Lvm { .. } => "lvm",
            Location::Nfs { .. } => "nfs",
        }
    }
}

/// The location of a volume as its PV's flexVolume `options` name it, for a driver of kind `kind`
/// (`hostpath`: `path`; `lvm`: `volumegroup` and `volumeID`; `nfs`: `server` and `share`): what
/// the provisioner signs, what the reconciler writes a legacy grant for, and what a driver checks
/// (with [`crate::protocol::options::Options::plain`]). `None` for another kind or a missing
/// option.
pub(crate) fn pv_location<'a>(
    kind: &str,
    options: &'a std::collections::BTreeMap<String, String>,
) -> Option<Location<'a>> {
    let get = |k: &str| options.get(k).map(String::as_str);
    match kind {
        "hostpath" => Some(Location::HostPath(get("path")?)),
        "lvm" => Some(Location::Lvm {
            vg: get("volumegroup")?,
            lv: get("volumeID")?,
        }),
        "nfs" => Some(Location::Nfs {
            server: get("server")?,
            share: get("share")?,
        }),
        _ => None,
    }
}

/// The bytes a token is the HMAC of. Fields are separated by NUL, which none of them may hold
/// (option values with NUL are refused by every parser), so two different volumes never share a
/// message.
pub(crate) fn message(pv: &str, loc: &Location<'_>) -> Vec<u8> {
    build_message(b"flexvol capability v1\0", pv, None, loc)
}

/// The bytes a namespace-bound (v2) token is the HMAC of: as [`message`], with the claim's
/// namespace after the PV. A v1 message never equals a v2 one (their first field differs).
pub(crate) fn message_v2(pv: &str, namespace: &str, loc: &Location<'_>) -> Vec<u8> {
    build_message(b"flexvol capability v2\0", pv, Some(namespace), loc)
}

fn build_message(head: &[u8], pv: &str, namespace: Option<&str>, loc: &Location<'_>) -> Vec<u8> {
    let mut m = Vec::with_capacity(96);
    m.extend_from_slice(head);
    m.extend_from_slice(loc.kind().as_bytes());
    m.push(0);
    m.extend_from_slice(pv.as_bytes());
    m.push(0);
    if let Some(ns) = namespace {
        m.extend_from_slice(ns.as_bytes());
        m.push(0);
    }
    match loc {
        Location::HostPath(p) => m.extend_from_slice(p.as_bytes()),
        Location::Lvm { vg, lv } => {
            m.extend_from_slice(vg.as_bytes());
            m.push(0);
            m.extend_from_slice(lv.as_bytes());
        }
        Location::Nfs { server, share } => {
            m.extend_from_slice(server.as_bytes());
            m.push(0);
            m.extend_from_slice(share.as_bytes());
        }
    }
    m
}

/// Whether `token` has the form of a token that names its claim's namespace (v2); says nothing of
/// its validity.
pub(crate) fn names_namespace(token: &str) -> bool {
    token.starts_with(TOKEN_V2_PREFIX)
}

/// What a valid token says of whom it serves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Scope {
    /// A token made before tokens named a namespace: its PV and location only. The namespace
    /// comes from the provisioner's root-only grant on the node ([`authorize`]).
    AnyNamespace,
    /// The claim's namespace the token was made for.
    Namespace(String),
}

/// Why a key cannot be used. Messages never contain key material.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    /// No key file.
    #[error("the capability key {path} does not exist; {fix}")]
    Missing { path: PathBuf, fix: &'static str },
    /// The file could be read or replaced by someone other than root.
    #[error(
        "the capability key {path} is not trusted: {reason}; make it a regular file owned by root with mode 0400 (chown root:root, chmod 0400)"
    )]
    Untrusted { path: PathBuf, reason: String },
    /// Reading or creating failed.
    #[error("cannot {what} the capability key {path}: {source}")]
    Io {
        what: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
}

impl KeyError {
    /// Whether the key file does not exist (callers decide whether that is a refusal or a
    /// reason to create one).
    pub(crate) fn is_missing(&self) -> bool {
        matches!(self, KeyError::Missing { .. })
    }
}

/// An HMAC key. Its `Debug` never prints the bytes.
pub struct Key(hmac::Key);

impl std::fmt::Debug for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Key(<redacted>)")
    }
}

impl Key {
    /// A key from raw bytes (tests, and keys read from trusted files).
    pub(crate) fn from_bytes(bytes: &[u8]) -> Self {
        Key(hmac::Key::new(hmac::HMAC_SHA256, bytes))
    }

    /// Reads a key file; see the module doc for when it is trusted. `fix` is what a missing file's
    /// message tells the operator to do.
    pub fn load(path: &Path, fix: &'static str) -> Result<Self, KeyError> {
        let io = |what, source| KeyError::Io {
            what,
            path: path.to_owned(),
            source,
        };
        let mut f = match std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(
                nix::fcntl::OFlag::O_NOFOLLOW.bits() | nix::fcntl::OFlag::O_CLOEXEC.bits(),
            )
            .open(path)
        {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(KeyError::Missing {
                    path: path.to_owned(),
                    fix,
                });
            }
            Err(e) if e.raw_os_error() == Some(nix::libc::ELOOP) => {
                return Err(KeyError::Untrusted {
                    path: path.to_owned(),
                    reason: "it is a symlink".into(),
                });
            }
            Err(e) => return Err(io("open", e)),
        };
        let md = f.metadata().map_err(|e| io("stat", e))?;
        let untrusted = |reason: String| KeyError::Untrusted {
            path: path.to_owned(),
            reason,
        };
        if !md.file_type().is_file() {
            return Err(untrusted("it is not a regular file".into()));
        }
        let me = nix::unistd::geteuid().as_raw();
        if md.uid() != 0 && md.uid() != me {
            return Err(untrusted(format!("it is owned by uid {}", md.uid())));
        }
        if md.mode() & 0o077 != 0 {
            return Err(untrusted(format!(
                "its mode {:04o} lets group or others read or write it",
                md.mode() & 0o7777
            )));
        }
        let mut data = Vec::with_capacity(KEY_BYTES);
        let limit = u64::try_from(MAX_KEY_BYTES).unwrap_or(u64::MAX);
        (&mut f)
            .take(limit.saturating_add(1))
            .read_to_end(&mut data)
            .map_err(|e| io("read", e))?;
        if data.len() < MIN_KEY_BYTES || data.len() > MAX_KEY_BYTES {
            return Err(untrusted(format!(
                "it holds {} bytes (a key has {MIN_KEY_BYTES} to {MAX_KEY_BYTES}; make one with `head -c 32 /dev/urandom`)",
                data.len()
            )));
        }
        Ok(Key::from_bytes(&data))
    }

    /// Reads the key file, creating it with [`KEY_BYTES`] random bytes (mode 0400, owned by us)
    /// when it does not exist. Two racing creators end with one key: the file is written under a
    /// private name and hard-linked into place, which never replaces an existing file.
    pub fn load_or_create(path: &Path) -> Result<Self, KeyError> {
        const FIX: &str = "it is created by flexvol provisioner";
        match Self::load(path, FIX) {
            Err(e) if e.is_missing() => {}
            other => return other,
        }
        let io = |what, source| KeyError::Io {
            what,
            path: path.to_owned(),
            source,
        };
        let mut bytes = [0u8; KEY_BYTES];
        ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut bytes).map_err(
            |_| {
                io(
                    "make random bytes for",
                    std::io::Error::other("no randomness"),
                )
            },
        )?;
        let dir = path.parent().unwrap_or(Path::new("/"));
        std::fs::create_dir_all(dir).map_err(|e| io("create the directory of", e))?;
        // The first writer wins (kubelet may run two verbs at once); both then load the same key.
        write_private(path, &bytes, 0o400, Place::IfAbsent).map_err(|e| io("create", e))?;
        Self::load(path, FIX)
    }

    /// The token for PV `pv` at `loc`.
    pub fn sign(&self, pv: &str, loc: &Location<'_>) -> String {
        let tag = hmac::sign(&self.0, &message(pv, loc));
        let mut s = String::with_capacity(TOKEN_PREFIX.len() + 64);
        s.push_str(TOKEN_PREFIX);
        for b in tag.as_ref() {
            s.push(hex_digit(b >> 4));
            s.push(hex_digit(b & 0xf));
        }
        s
    }

    /// The token for PV `pv` of a claim in `namespace` at `loc`: valid only for calls of pods of
    /// that namespace ([`authorize`]). What the provisioner writes into new PVs.
    pub fn sign_for(&self, pv: &str, namespace: &str, loc: &Location<'_>) -> String {
        let tag = hmac::sign(&self.0, &message_v2(pv, namespace, loc));
        let mut s = String::with_capacity(TOKEN_V2_PREFIX.len() + namespace.len() + 65);
        s.push_str(TOKEN_V2_PREFIX);
        s.push_str(namespace);
        s.push('.');
        for b in tag.as_ref() {
            s.push(hex_digit(b >> 4));
            s.push(hex_digit(b & 0xf));
        }
        s
    }

    /// Whether `token` is this key's token for PV `pv` at `loc` (constant time in the tag), of
    /// either version, whatever namespace a v2 token names.
    #[cfg(test)]
    pub(crate) fn verify(&self, pv: &str, loc: &Location<'_>, token: &str) -> bool {
        self.scope(pv, loc, token).is_some()
    }

    /// What `token` serves when it is this key's token for PV `pv` at `loc`; `None` when it is
    /// not valid (malformed, another PV or location, another key, a namespace changed).
    pub(crate) fn scope(&self, pv: &str, loc: &Location<'_>, token: &str) -> Option<Scope> {
        if let Some(rest) = token.strip_prefix(TOKEN_V2_PREFIX) {
            let (ns, hex) = rest.split_once('.')?;
            if ns.is_empty() || ns.contains('\0') {
                return None;
            }
            let tag = decode_hex(hex)?;
            return hmac::verify(&self.0, &message_v2(pv, ns, loc), &tag)
                .ok()
                .map(|()| Scope::Namespace(ns.to_owned()));
        }
        let tag = decode_hex(token.strip_prefix(TOKEN_PREFIX)?)?;
        hmac::verify(&self.0, &message(pv, loc), &tag)
            .ok()
            .map(|()| Scope::AnyNamespace)
    }
}

/// The directory of legacy grants inside the state directory.
pub(crate) const LEGACY_DIR: &str = "legacy-grants";

/// A legacy grant: a volume made before capabilities, served without a token to this PV name in
/// this namespace only.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LegacyGrant {
    /// The PV the volume was made for.
    pub pv: String,
    /// Its claim's namespace.
    pub namespace: String,
}

/// Where the legacy grant of `loc` is: `<stateDir>/legacy-grants/<sha256(kind, location)>`, so a
/// driver finds it from the options alone, with one open.
pub(crate) fn legacy_grant_path(state_dir: &Path, loc: &Location<'_>) -> PathBuf {
    let digest = ring::digest::digest(&ring::digest::SHA256, &message("", loc));
    let mut name = String::with_capacity(64);
    for b in digest.as_ref() {
        name.push(hex_digit(b >> 4));
        name.push(hex_digit(b & 0xf));
    }
    state_dir.join(LEGACY_DIR).join(name)
}

/// Records a legacy grant (root-only directory 0700, file 0600, written atomically). Idempotent.
pub fn write_legacy_grant(
    state_dir: &Path,
    loc: &Location<'_>,
    grant: &LegacyGrant,
) -> std::io::Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    let path = legacy_grant_path(state_dir, loc);
    let dir = state_dir.join(LEGACY_DIR);
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&dir)?;
    if read_legacy_grant(state_dir, loc).as_ref() == Some(grant) {
        return Ok(());
    }
    let data = serde_json::to_vec(grant).map_err(std::io::Error::other)?;
    write_private(&path, &data, 0o600, Place::Replace).map(drop)
}

/// The legacy grant of `loc`, if there is one that only root could have written (a regular file
/// owned by root or us, not writable by group or others, not a symlink).
pub(crate) fn read_legacy_grant(state_dir: &Path, loc: &Location<'_>) -> Option<LegacyGrant> {
    let path = legacy_grant_path(state_dir, loc);
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::fcntl::OFlag::O_NOFOLLOW.bits() | nix::fcntl::OFlag::O_CLOEXEC.bits())
        .open(path)
        .ok()?;
    let md = f.metadata().ok()?;
    let me = nix::unistd::geteuid().as_raw();
    if !md.file_type().is_file() || (md.uid() != 0 && md.uid() != me) || md.mode() & 0o022 != 0 {
        return None;
    }
    let mut data = Vec::new();
    f.take(4096).read_to_end(&mut data).ok()?;
    serde_json::from_slice(&data).ok()
}

/// Removes the legacy grant of `loc` (when its volume is deleted). Missing is fine.
pub(crate) fn remove_legacy_grant(state_dir: &Path, loc: &Location<'_>) -> std::io::Result<()> {
    match std::fs::remove_file(legacy_grant_path(state_dir, loc)) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// How a driver decided that a call may use a provisioner-made volume.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Granted {
    /// A valid token for this PV and location.
    Token,
    /// No token, but a legacy grant for this location, this PV name and this namespace.
    Legacy,
}

/// The one decision every driver makes for a provisioner-made volume at `loc`: `token` (the
/// [`OPTION`] value), `pv` (the PV name the call is for: the token's PV, or for legacy volumes
/// kubelet's `kubernetes.io/pvOrVolumeName`) and `namespace` (kubelet's
/// `kubernetes.io/pod.namespace`; `None` for calls without a pod, such as `waitforattach`, where
/// a legacy grant for the location suffices). `key` is the kind's key as loaded (an error is kept
/// for the message). The `Err` is a complete refusal message that echoes no token.
pub(crate) fn authorize(
    key: Result<&Key, &KeyError>,
    state_dir: &Path,
    loc: &Location<'_>,
    pv: Option<&str>,
    namespace: Option<&str>,
    token: Option<&str>,
) -> Result<Granted, String> {
    let what = match loc {
        Location::HostPath(p) => format!("{p} is a volume made by flexvol provisioner"),
        Location::Lvm { vg, lv } => format!("LV {vg}/{lv} is a volume made by flexvol provisioner"),
        Location::Nfs { server, share } => {
            format!("{server}:{share} is in an export flexvol provisioner makes volumes in")
        }
    };
    if let Some(t) = token {
        let Some(pv) = pv else {
            return Err(format!(
                "{what}; the call names no PV, so its {OPTION} cannot be checked"
            ));
        };
        let not_yours = |ns: &str| {
            format!(
                "{what} for a claim of namespace {ns}, and is served only to pods of that namespace, not to namespace {}. Use the PersistentVolumeClaim from its own namespace",
                namespace.unwrap_or_default()
            )
        };
        return match key.map(|k| k.scope(pv, loc, t)) {
            // A call without a pod (kubelet staging a device, kube-controller-manager attaching)
            // names no namespace; the pod's own `mount` that follows is checked.
            Ok(Some(_)) if namespace.is_none() => Ok(Granted::Token),
            Ok(Some(Scope::Namespace(ns))) if namespace == Some(ns.as_str()) => Ok(Granted::Token),
            Ok(Some(Scope::Namespace(ns))) => Err(not_yours(&ns)),
            // An older token names no namespace: the provisioner's root-only grant on this node
            // says its claim's (written every pass for every PV of ours).
            Ok(Some(Scope::AnyNamespace)) => match read_legacy_grant(state_dir, loc) {
                Some(g) if g.pv == pv && namespace == Some(g.namespace.as_str()) => {
                    Ok(Granted::Token)
                }
                Some(g) if g.pv == pv => Err(not_yours(&g.namespace)),
                _ => Err(format!(
                    "{what}; its claim's namespace is not yet recorded on this node (flexvol provisioner records it on its next pass), so it is not served yet: retried"
                )),
            },
            Ok(None) => Err(format!(
                "{what} and is served only to the PV it was made for: this call's {OPTION} is not valid for PV {pv} at this location. Use the PersistentVolumeClaim, not an inline volume or a copy of the PV"
            )),
            Err(e) => Err(format!("{what}; its {OPTION} cannot be checked: {e}")),
        };
    }
    match read_legacy_grant(state_dir, loc) {
        Some(g) if pv.is_none_or(|p| p == g.pv) && namespace.is_none_or(|n| n == g.namespace) => {
            Ok(Granted::Legacy)
        }
        _ => Err(format!(
            "{what} and is served only to the PV it was made for, whose options carry its {OPTION}; use the PersistentVolumeClaim, not an inline volume"
        )),
    }
}

fn hex_digit(n: u8) -> char {
    char::from(b"0123456789abcdef"[usize::from(n & 0xf)])
}

fn decode_hex(s: &str) -> Option<Vec<u8>> {
    if s.len() != 64 {
        return None;
    }
    let val = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    };
    s.as_bytes()
        .chunks(2)
        .map(|p| Some(val(p[0])? << 4 | val(p[1])?))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn a_token_binds_kind_pv_and_location() {
        let k = Key::from_bytes(b"0123456789abcdef0123456789abcdef");
        let loc = Location::HostPath("/srv/p/pvc-1_ns_c");
        let t = k.sign("pvc-1", &loc);
        assert!(t.starts_with("v1.") && t.len() == 67, "{t}");
        assert!(k.verify("pvc-1", &loc, &t));
        // Any other PV, path, kind or key: invalid.
        assert!(!k.verify("pvc-2", &loc, &t));
        assert!(!k.verify("pvc-1", &Location::HostPath("/srv/p/pvc-1_ns_c/x"), &t));
        assert!(!k.verify("pvc-1", &Location::HostPath("/srv/p"), &t));
        assert!(!k.verify(
            "pvc-1",
            &Location::Nfs {
                server: "/srv/p/pvc-1_ns_c",
                share: ""
            },
            &t
        ));
        let other = Key::from_bytes(b"another key, 32 bytes long......");
        assert!(!other.verify("pvc-1", &loc, &t));
        // Field boundaries cannot be shifted.
        let a = Location::Lvm { vg: "vg0", lv: "a" };
        let b = Location::Lvm { vg: "vg", lv: "0a" };
        assert_ne!(message("p", &a), message("p", &b));
        // Malformed tokens are just invalid.
        for bad in ["", "v1.", "v2.00", &t[..66], &t.to_uppercase(), "v1.zz"] {
            assert!(!k.verify("pvc-1", &loc, bad), "{bad}");
        }
        assert_eq!(format!("{k:?}"), "Key(<redacted>)");
    }

    #[test]
    fn legacy_grants_serve_one_pv_in_one_namespace() {
        let d = tempfile::tempdir().unwrap();
        let st = d.path();
        let loc = Location::HostPath("/srv/p/pvc-1_ns_c");
        let key = Key::from_bytes(b"0123456789abcdef0123456789abcdef");
        let token = key.sign_for("pvc-1", "ns", &loc);
        let ok = |pv, ns, t| authorize(Ok(&key), st, &loc, pv, ns, t);
        // A token works for its PV in its namespace; a wrong one is refused without echoing it.
        assert_eq!(
            ok(Some("pvc-1"), Some("ns"), Some(&token)),
            Ok(Granted::Token)
        );
        let e = ok(Some("pvc-2"), Some("ns"), Some(&token)).unwrap_err();
        assert!(e.contains("not valid") && !e.contains(&token[3..]), "{e}");
        // No token, no grant: refused.
        assert!(ok(Some("pvc-1"), Some("ns"), None).is_err());
        write_legacy_grant(
            st,
            &loc,
            &LegacyGrant {
                pv: "pvc-1".into(),
                namespace: "ns".into(),
            },
        )
        .unwrap();
        assert_eq!(ok(Some("pvc-1"), Some("ns"), None), Ok(Granted::Legacy));
        assert_eq!(ok(None, None, None), Ok(Granted::Legacy));
        assert!(ok(Some("pvc-1"), Some("other"), None).is_err());
        assert!(ok(Some("data"), Some("ns"), None).is_err());
        assert!(
            authorize(
                Ok(&key),
                st,
                &Location::HostPath("/srv/p"),
                Some("pvc-1"),
                Some("ns"),
                None
            )
            .is_err()
        );
        // A grant others could write is not honoured.
        let p = legacy_grant_path(st, &loc);
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o666)).unwrap();
        assert!(ok(Some("pvc-1"), Some("ns"), None).is_err());
        remove_legacy_grant(st, &loc).unwrap();
        remove_legacy_grant(st, &loc).unwrap();
        // A missing key is named when a token has to be checked.
        let missing = Key::load(&st.join("nokey"), "create it").unwrap_err();
        let e = authorize(Err(&missing), st, &loc, Some("pvc-1"), None, Some(&token)).unwrap_err();
        assert!(e.contains("does not exist"), "{e}");
    }

    #[test]
    fn a_pv_location_comes_from_its_options() {
        let o = |kv: &[(&str, &str)]| -> std::collections::BTreeMap<String, String> {
            kv.iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect()
        };
        let h = o(&[("path", "/srv/p/x"), ("type", "Directory")]);
        assert_eq!(
            pv_location("hostpath", &h),
            Some(Location::HostPath("/srv/p/x"))
        );
        let l = o(&[("volumegroup", "vg0"), ("volumeID", "pvc-1")]);
        assert_eq!(
            pv_location("lvm", &l),
            Some(Location::Lvm {
                vg: "vg0",
                lv: "pvc-1"
            })
        );
        let n = o(&[("server", "10.0.0.5"), ("share", "/export/a")]);
        assert_eq!(
            pv_location("nfs", &n),
            Some(Location::Nfs {
                server: "10.0.0.5",
                share: "/export/a"
            })
        );
        assert_eq!(pv_location("lvm", &h), None);
        assert_eq!(pv_location("nfs", &o(&[("server", "s")])), None);
        assert_eq!(pv_location("other", &h), None);
    }

    #[test]
    fn the_option_name_is_redacted() {
        assert_eq!(
            crate::protocol::options::redact_value(OPTION, "v1.abc"),
            crate::protocol::options::REDACTED
        );
    }

    #[test]
    fn keys_are_created_once_and_only_trusted_files_are_read() {
        let d = tempfile::tempdir().unwrap();
        let p = node_key_path(&d.path().join("state"));
        let e = Key::load(&p, "make one").unwrap_err();
        assert!(e.is_missing() && e.to_string().contains("make one"), "{e}");
        let k1 = Key::load_or_create(&p).unwrap();
        let md = std::fs::metadata(&p).unwrap();
        assert_eq!(md.permissions().mode() & 0o777, 0o400);
        assert_eq!(md.len(), 32);
        let k2 = Key::load_or_create(&p).unwrap();
        let loc = Location::Lvm { vg: "vg", lv: "lv" };
        assert!(
            k2.verify("pv", &loc, &k1.sign("pv", &loc)),
            "a second call made another key"
        );
        // Readable by others: refused, and not replaced.
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o444)).unwrap();
        let e = Key::load_or_create(&p).unwrap_err();
        assert!(e.to_string().contains("not trusted"), "{e}");
        // A symlink to a good key: refused.
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o400)).unwrap();
        let link = d.path().join("link.key");
        std::os::unix::fs::symlink(&p, &link).unwrap();
        let e = Key::load(&link, "x").unwrap_err();
        assert!(e.to_string().contains("symlink"), "{e}");
        // Too short.
        let short = d.path().join("short.key");
        std::fs::write(&short, b"abc").unwrap();
        std::fs::set_permissions(&short, std::fs::Permissions::from_mode(0o400)).unwrap();
        let e = Key::load(&short, "x").unwrap_err();
        assert!(e.to_string().contains("3 bytes"), "{e}");
        assert!(!e.to_string().contains("abc"));
    }

    /// Issue #32, 4: a PV's token, copied into an inline volume of another namespace (named
    /// after the PV, with its path), opens nothing: a new (v2) token names its claim's namespace
    /// and kubelet's pod namespace must be that one; an older (v1) token is served only to the
    /// namespace the provisioner's root-only grant records for it (nothing before the grant
    /// exists). Calls without a pod (staging, attach) are not namespace calls and still pass.
    #[test]
    fn a_token_opens_nothing_outside_its_claims_namespace() {
        let d = tempfile::tempdir().unwrap();
        let st = d.path();
        let key = Key::from_bytes(b"0123456789abcdef0123456789abcdef");
        for loc in [
            Location::HostPath("/srv/p/pvc-1"),
            Location::Lvm {
                vg: "vg0",
                lv: "pvc-1",
            },
            Location::Nfs {
                server: "10.0.0.5",
                share: "/export/pvc-1",
            },
        ] {
            let ok = |ns, t: &str| authorize(Ok(&key), st, &loc, Some("pvc-1"), ns, Some(t));
            let v2 = key.sign_for("pvc-1", "team-a", &loc);
            assert!(v2.starts_with("v2.team-a."), "{v2}");
            assert!(names_namespace(&v2));
            assert_eq!(ok(Some("team-a"), &v2), Ok(Granted::Token));
            let e = ok(Some("evil"), &v2).unwrap_err();
            assert!(
                e.contains("served only to pods of that namespace") && !e.contains(&v2[12..]),
                "{e}"
            );
            assert_eq!(ok(None, &v2), Ok(Granted::Token), "no pod: staging");
            // The namespace in the token cannot be edited.
            let forged = v2.replacen("team-a", "evil", 1);
            assert!(ok(Some("evil"), &forged).is_err());
            assert_eq!(key.scope("pvc-1", &loc, &forged), None);
            // An older token: refused in any namespace until the grant names its claim's.
            let v1 = key.sign("pvc-1", &loc);
            assert!(!names_namespace(&v1));
            let e = ok(Some("team-a"), &v1).unwrap_err();
            assert!(e.contains("not yet recorded on this node"), "{e}");
            assert_eq!(ok(None, &v1), Ok(Granted::Token));
            write_legacy_grant(
                st,
                &loc,
                &LegacyGrant {
                    pv: "pvc-1".into(),
                    namespace: "team-a".into(),
                },
            )
            .unwrap();
            assert_eq!(ok(Some("team-a"), &v1), Ok(Granted::Token));
            assert!(ok(Some("evil"), &v1).is_err());
            // A v1 message is never a v2 one.
            assert_ne!(message("pvc-1", &loc), message_v2("pvc-1", "", &loc));
        }
    }
}
