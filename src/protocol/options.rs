//! The JSON options kubelet passes as one argv element, in two stages: first a flat string map
//! (kubelet's `map[string]string`; any other JSON shape is refused), then typed accessors for the
//! keys kubelet itself sets. Backends build their own typed options from [`Options`].
//!
//! Secrets arrive base64-encoded as `kubernetes.io/secret/<key>` (mount only). They are decoded
//! into [`Secret`], which cannot be printed, and are removed from the map so nothing that logs or
//! stores the options can carry them.
//!
//! Plain options can carry secrets too (a PV author writing `password: ...` into options). One
//! rule decides which keys are credential-like, [`is_sensitive_key`], and [`shown_value`] applies
//! it to anything that would print a value: [`OptionsError`]'s messages (every backend's validation
//! messages), the call log and syslog ([`crate::node::calllog`]). A value of such a key is never
//! printed, and neither is the value of a `name=value` item with such a name inside a list option
//! (`mountOptions: "password=x"`). Callers that format a value themselves must go through
//! [`shown_value`].

use std::collections::BTreeMap;
use std::fmt;

/// Keys kubelet sets (docs/protocol.md §4.1).
pub(crate) mod keys {
    /// `spec.flexVolume.fsType`, `""` when unset.
    pub(crate) const FS_TYPE: &str = "kubernetes.io/fsType";
    /// `"ro"` or `"rw"`.
    pub(crate) const READWRITE: &str = "kubernetes.io/readwrite";
    /// PV name, or the pod's volume name for inline volumes.
    pub(crate) const PV_OR_VOLUME_NAME: &str = "kubernetes.io/pvOrVolumeName";
    /// Pod name (mount only).
    pub(crate) const POD_NAME: &str = "kubernetes.io/pod.name";
    /// Pod namespace (mount only).
    pub(crate) const POD_NAMESPACE: &str = "kubernetes.io/pod.namespace";
    /// Pod UID (mount only).
    pub(crate) const POD_UID: &str = "kubernetes.io/pod.uid";
    /// Service account name (mount only).
    pub(crate) const SERVICE_ACCOUNT: &str = "kubernetes.io/serviceAccount.name";
    /// fsGroup, kubelet 1.15 and later.
    pub(crate) const FS_GROUP: &str = "kubernetes.io/mounterArgs.FsGroup";
    /// fsGroup before 1.15.
    pub(crate) const FS_GROUP_LEGACY: &str = "kubernetes.io/fsGroup";
    /// Prefix of secret entries.
    pub(crate) const SECRET_PREFIX: &str = "kubernetes.io/secret/";
    /// Every plain key kubelet itself sets (a pod author may add others with this prefix, which
    /// are then unknown options like any other).
    pub(crate) const KUBELET: &[&str] = &[
        FS_TYPE,
        READWRITE,
        PV_OR_VOLUME_NAME,
        POD_NAME,
        POD_NAMESPACE,
        POD_UID,
        SERVICE_ACCOUNT,
        FS_GROUP,
        FS_GROUP_LEGACY,
    ];
}

/// A secret value. Its `Debug` and `Display` print `<redacted>`; only [`Secret::expose`] reads it.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct Secret(Vec<u8>);

impl Secret {
    /// The raw bytes, for the single place that hands them to a tool (never argv, never logs).
    #[cfg(test)]
    pub(crate) fn expose(&self) -> &[u8] {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

/// Why the options argument was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OptionsError {
    /// Not JSON, or JSON that is not an object of strings.
    #[error(
        "the options argument is not a JSON object of strings ({0}); kubelet always sends one, so check how the driver was called"
    )]
    NotAnObject(String),
    /// A value that is not a string.
    #[error("option {key:?} must be a JSON string, got {got}")]
    NotAString { key: String, got: &'static str },
    /// A key with a bad value. The value is shown through [`shown_value`], so a credential-like
    /// key's value never reaches a message.
    #[error(
        "option {key:?} has an invalid value {}: {reason}",
        shown_value(key, value)
    )]
    Invalid {
        key: String,
        value: String,
        reason: String,
    },
    /// A key the backend does not know. Its value is never shown: an unknown key may be a
    /// credential under a name the redaction rule does not recognise.
    #[error("option {key:?} is not known (its value is not shown): {reason}")]
    Unknown { key: String, reason: String },
    /// A required key is absent or empty.
    #[error("option {key:?} is required: {hint}")]
    Missing { key: String, hint: String },
}

impl OptionsError {
    /// Shorthand for an unknown key (its value is never shown).
    pub(crate) fn unknown(key: &str, reason: impl Into<String>) -> Self {
        OptionsError::Unknown {
            key: key.into(),
            reason: reason.into(),
        }
    }

    /// Shorthand for an invalid value.
    pub(crate) fn invalid(key: &str, value: &str, reason: impl Into<String>) -> Self {
        OptionsError::Invalid {
            key: key.into(),
            value: value.into(),
            reason: reason.into(),
        }
    }
}

/// Parts of option names that mark them as credentials, matched case-insensitively anywhere in
/// the name: deliberately broad, since printing `<redacted>` for a harmless key costs nothing.
pub(crate) const SENSITIVE_KEY_PARTS: &[&str] = &[
    "pass", "pwd", "secret", "token", "key", "cred", "auth", "priv", "session", "cookie", "cert",
    "sign", "salt", "bearer", "sasl", "krb", "kerberos", "otp",
];

/// What is printed instead of a value that may be a secret.
pub(crate) const REDACTED: &str = "<redacted>";

/// Whether an option (or a `name=value` item inside one) may hold a credential: kubelet's secret
/// entries, and any name containing one of [`SENSITIVE_KEY_PARTS`], case-insensitively. The one
/// rule every message, log line and syslog record uses.
pub(crate) fn is_sensitive_key(key: &str) -> bool {
    if key.starts_with(keys::SECRET_PREFIX) {
        return true;
    }
    let k = key.to_ascii_lowercase();
    SENSITIVE_KEY_PARTS.iter().any(|w| k.contains(w))
}

/// How the value of option `key` may be shown in a message or log, quoted: `"<redacted>"` for a
/// credential-like key, otherwise the value with the value of every credential-like
/// `name=value` item of a comma or space separated list replaced (`"vers=4,password=<redacted>"`).
pub(crate) fn shown_value(key: &str, value: &str) -> String {
    format!("{:?}", redact_value(key, value))
}

/// [`shown_value`] without the quotes: the value of `key` as it may be stored in a log.
pub(crate) fn redact_value(key: &str, value: &str) -> String {
    if is_sensitive_key(key) {
        return REDACTED.to_owned();
    }
    if !value.contains('=') {
        return value.to_owned();
    }
    let mut out = String::with_capacity(value.len());
    let mut item = String::new();
    let flush = |item: &mut String, out: &mut String| {
        match item.split_once('=') {
            Some((name, _)) if is_sensitive_key(name) => {
                out.push_str(name);
                out.push('=');
                out.push_str(REDACTED);
            }
            _ => out.push_str(item),
        }
        item.clear();
    };
    for c in value.chars() {
        if c == ',' || c.is_whitespace() {
            flush(&mut item, &mut out);
            out.push(c);
        } else {
            item.push(c);
        }
    }
    flush(&mut item, &mut out);
    out
}

/// Parsed options: plain keys in a sorted map, secrets decoded and kept apart.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Options {
    plain: BTreeMap<String, String>,
    secrets: BTreeMap<String, Secret>,
}

impl Options {
    /// Parses kubelet's options argument.
    pub fn parse(json: &str) -> Result<Self, OptionsError> {
        let value: serde_json::Value =
            serde_json::from_str(json).map_err(|e| OptionsError::NotAnObject(e.to_string()))?;
        let serde_json::Value::Object(map) = value else {
            return Err(OptionsError::NotAnObject(format!("got {}", kind(&value))));
        };
        let mut out = Options::default();
        for (key, value) in map {
            let serde_json::Value::String(s) = value else {
                return Err(OptionsError::NotAString {
                    got: kind(&value),
                    key,
                });
            };
            if let Some(name) = key.strip_prefix(keys::SECRET_PREFIX) {
                let bytes = base64_decode(&s).ok_or_else(|| OptionsError::Invalid {
                    key: key.clone(),
                    value: REDACTED.into(),
                    reason: "secret values must be standard base64, as kubelet sends them".into(),
                })?;
                out.secrets.insert(name.to_owned(), Secret(bytes));
            } else {
                out.plain.insert(key, s);
            }
        }
        Ok(out)
    }

    /// A plain option, `None` when absent.
    pub(crate) fn get(&self, key: &str) -> Option<&str> {
        self.plain.get(key).map(String::as_str)
    }

    /// A plain option treated as absent when empty.
    pub(crate) fn non_empty(&self, key: &str) -> Option<&str> {
        self.get(key).filter(|v| !v.is_empty())
    }

    /// A required, non-empty option.
    pub(crate) fn require(&self, key: &str, hint: &str) -> Result<&str, OptionsError> {
        self.non_empty(key).ok_or_else(|| OptionsError::Missing {
            key: key.into(),
            hint: hint.into(),
        })
    }

    /// All plain options (secrets never appear here), e.g. for logs and state files.
    pub(crate) fn plain(&self) -> &BTreeMap<String, String> {
        &self.plain
    }

    /// Secrets by key (without the `kubernetes.io/secret/` prefix).
    #[cfg(test)]
    pub(crate) fn secrets(&self) -> &BTreeMap<String, Secret> {
        &self.secrets
    }

    /// `kubernetes.io/readwrite`: true for `ro`. Anything but `ro`, `rw` or absent is refused,
    /// since guessing would risk writing to a volume meant to be read-only.
    pub(crate) fn read_only(&self) -> Result<bool, OptionsError> {
        match self.get(keys::READWRITE) {
            None | Some("") | Some("rw") => Ok(false),
            Some("ro") => Ok(true),
            Some(v) => Err(OptionsError::invalid(
                keys::READWRITE,
                v,
                "expected \"ro\" or \"rw\"",
            )),
        }
    }

    /// `kubernetes.io/pvOrVolumeName`.
    pub(crate) fn volume_name(&self) -> Option<&str> {
        self.non_empty(keys::PV_OR_VOLUME_NAME)
    }

    /// `namespace/name` of the pod, when kubelet sent both (mount only).
    pub(crate) fn pod_ref(&self) -> Option<String> {
        Some(format!(
            "{}/{}",
            self.non_empty(keys::POD_NAMESPACE)?,
            self.non_empty(keys::POD_NAME)?
        ))
    }

    /// The pod's fsGroup from either the 1.15+ or the older key.
    pub(crate) fn fs_group(&self) -> Result<Option<u32>, OptionsError> {
        for key in [keys::FS_GROUP, keys::FS_GROUP_LEGACY] {
            if let Some(v) = self.non_empty(key) {
                return v
                    .parse::<u32>()
                    .map(Some)
                    .map_err(|_| OptionsError::invalid(key, v, "expected a numeric group id"));
            }
        }
        Ok(None)
    }
}

fn kind(v: &serde_json::Value) -> &'static str {
    match v {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "an array",
        serde_json::Value::Object(_) => "an object",
    }
}

/// Decodes standard, padded base64 (what Go's `base64.StdEncoding` produces). Whitespace and any
/// other alphabet are refused rather than skipped.
pub(crate) fn base64_decode(s: &str) -> Option<Vec<u8>> {
    fn val(c: u8) -> Option<u32> {
        Some(u32::from(match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => return None,
        }))
    }
    let bytes = s.as_bytes();
    if !bytes.len().is_multiple_of(4) {
        return None;
    }
    let mut out = Vec::with_capacity(bytes.len() / 4 * 3);
    for (i, chunk) in bytes.chunks(4).enumerate() {
        let last = i == bytes.len() / 4 - 1;
        let pad = chunk.iter().rev().take_while(|&&c| c == b'=').count();
        if pad > 2 || (pad > 0 && !last) {
            return None;
        }
        let mut n = 0u32;
        for &c in &chunk[..4 - pad] {
            n = (n << 6) | val(c)?;
        }
        n <<= 6 * pad;
        let [_, b0, b1, b2] = n.to_be_bytes(); // n holds 24 bits
        let decoded = [b0, b1, b2];
        out.extend_from_slice(&decoded[..3 - pad]);
    }
    Some(out)
}

/// Test support: options JSON as kubelet sends it, built one way for every unit test.
#[cfg(test)]
pub(crate) mod testing {
    /// kubelet's options object: `members` as string members, in order, then `extra`, raw JSON
    /// members each with its leading comma (`r#","version":"3""#`), as the tests write them.
    /// Keys and values are written as given, not escaped: a test may end a value early to add a
    /// member (a forged `capabilityToken`), and the text is then exactly what it wrote.
    pub(crate) fn options_json(members: &[(&str, &str)], extra: &str) -> String {
        let members: Vec<String> = members
            .iter()
            .map(|(k, v)| format!(r#""{k}":"{v}""#))
            .collect();
        format!("{{{}{extra}}}", members.join(","))
    }

    #[test]
    fn options_json_is_what_the_tests_wrote() {
        assert_eq!(
            options_json(&[("server", "a"), ("share", "/s")], r#","version":"3""#),
            r#"{"server":"a","share":"/s","version":"3"}"#
        );
        assert_eq!(
            options_json(&[("share", r#"/s","x":"y"#)], ""),
            r#"{"share":"/s","x":"y"}"#
        );
        assert_eq!(options_json(&[], ""), "{}");
    }
}

/// At most [`SHOWN`] bytes of a caller's string (a volume id, path or driver name of any length
/// is the PV author's or the caller's to choose), cut at a character boundary and marked, for a
/// log line or a message.
pub(crate) fn bounded(s: &str) -> std::borrow::Cow<'_, str> {
    if s.len() <= SHOWN {
        return s.into();
    }
    let mut end = SHOWN;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...({} bytes)", &s[..end], s.len()).into()
}

/// How much of a caller's string a log line or message shows ([`bounded`]).
const SHOWN: usize = 256;

#[cfg(test)]
mod tests {
    use super::*;

    const MOUNT_J: &str = r#"{"kubernetes.io/fsType":"nfs","kubernetes.io/pod.name":"nginx-nfs","kubernetes.io/pod.namespace":"default","kubernetes.io/pod.uid":"0b6a9c52","kubernetes.io/pvOrVolumeName":"data","kubernetes.io/readwrite":"rw","kubernetes.io/secret/password":"czNjcjN0","kubernetes.io/secret/username":"YWRtaW4=","kubernetes.io/serviceAccount.name":"default","server":"10.0.0.5","share":"/exports/data"}"#;

    #[test]
    fn parses_kubelet_mount_payload_and_decodes_secrets() {
        let o = Options::parse(MOUNT_J).unwrap();
        assert_eq!(o.get("server"), Some("10.0.0.5"));
        assert_eq!(o.volume_name(), Some("data"));
        assert!(!o.read_only().unwrap());
        assert_eq!(o.secrets()["password"].expose(), b"s3cr3t");
        assert_eq!(o.secrets()["username"].expose(), b"admin");
        assert!(!o.plain().keys().any(|k| k.contains("secret")));
        assert_eq!(
            format!("{:?}", o.secrets()),
            r#"{"password": <redacted>, "username": <redacted>}"#
        );
        assert!(!format!("{o:?}").contains("s3cr3t"));
    }

    #[test]
    fn refuses_non_objects_and_non_strings() {
        for bad in ["{bad", "", "[]", "42", "null", "\"x\""] {
            assert!(
                matches!(Options::parse(bad), Err(OptionsError::NotAnObject(_))),
                "{bad}"
            );
        }
        assert!(matches!(
            Options::parse(r#"{"size":1}"#),
            Err(OptionsError::NotAString { .. })
        ));
        assert!(Options::parse(r#"{"kubernetes.io/secret/p":"not base64!"}"#).is_err());
    }

    #[test]
    fn fs_group_from_both_keys_and_readwrite() {
        let new = Options::parse(r#"{"kubernetes.io/mounterArgs.FsGroup":"2000"}"#).unwrap();
        let old = Options::parse(r#"{"kubernetes.io/fsGroup":"3000"}"#).unwrap();
        assert_eq!(new.fs_group().unwrap(), Some(2000));
        assert_eq!(old.fs_group().unwrap(), Some(3000));
        assert!(
            Options::parse(r#"{"kubernetes.io/fsGroup":"x"}"#)
                .unwrap()
                .fs_group()
                .is_err()
        );
        assert!(
            Options::parse(r#"{"kubernetes.io/readwrite":"ro"}"#)
                .unwrap()
                .read_only()
                .unwrap()
        );
        assert!(
            Options::parse(r#"{"kubernetes.io/readwrite":"RO"}"#)
                .unwrap()
                .read_only()
                .is_err()
        );
    }

    #[test]
    fn credential_like_values_never_reach_messages() {
        for key in [
            "password",
            "PassWord",
            "mountPass",
            "apiToken",
            "sshKey",
            "credentials",
            "AUTH",
            "privateData",
            "kubernetes.io/secret/x",
        ] {
            let e = OptionsError::invalid(key, "S3CRETpwL", "expected something else");
            let m = e.to_string();
            assert!(!m.contains("S3CRETpwL"), "{key}: {m}");
            assert!(m.contains("<redacted>") && m.contains(key), "{m}");
        }
        // Harmless keys keep their value, which is what the user needs to fix it...
        let m = OptionsError::invalid("server", "nfs..example", "bad").to_string();
        assert!(m.contains("\"nfs..example\""), "{m}");
        // ...except credential-like items inside a list.
        let m = OptionsError::invalid("mountOptions", "vers=4,password=S3CRETpwL,ro", "bad")
            .to_string();
        assert!(m.contains("vers=4,password=<redacted>,ro"), "{m}");
        assert!(!m.contains("S3CRET"), "{m}");
        for harmless in [
            "path",
            "server",
            "share",
            "volumegroup",
            "size",
            "mode",
            "uid",
        ] {
            assert!(!is_sensitive_key(harmless), "{harmless}");
        }
        for k in [
            keys::POD_NAME,
            keys::POD_UID,
            keys::PV_OR_VOLUME_NAME,
            keys::SERVICE_ACCOUNT,
        ] {
            assert!(!is_sensitive_key(k), "{k}");
        }
    }

    #[test]
    fn base64_vectors() {
        assert_eq!(base64_decode("").unwrap(), b"");
        assert_eq!(base64_decode("Zg==").unwrap(), b"f");
        assert_eq!(base64_decode("Zm8=").unwrap(), b"fo");
        assert_eq!(base64_decode("Zm9v").unwrap(), b"foo");
        assert_eq!(base64_decode("Zm9vYg==").unwrap(), b"foob");
        assert_eq!(base64_decode("/+8=").unwrap(), [0xff, 0xef]);
        for bad in ["Zg=", "Z===", "Zg==Zg==", "Zm 9v", "Zm9v\n"] {
            assert!(base64_decode(bad).is_none(), "{bad}");
        }
    }

    proptest::proptest! {
        #[test]
        fn base64_round_trips(data: Vec<u8>) {
            // Reference encoder, written out here so the test does not trust the decoder.
            const A: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
            let mut enc = String::new();
            for c in data.chunks(3) {
                let n = u32::from(c[0]) << 16 | u32::from(*c.get(1).unwrap_or(&0)) << 8 | u32::from(*c.get(2).unwrap_or(&0));
                for i in 0..4 {
                    if i <= c.len() { enc.push(char::from(A[usize::try_from(n >> (18 - 6 * i) & 63).unwrap()])) } else { enc.push('=') }
                }
            }
            proptest::prop_assert_eq!(base64_decode(&enc), Some(data));
        }
    }
}
