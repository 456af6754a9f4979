//! kubelet's side of the protocol, as Go code reads and writes it: how a reply is decoded
//! (`json.Unmarshal` into kubelet's `DriverStatus`, `driver-call.go`) and how the options JSON is
//! encoded (`json.Marshal` of a `map[string]string`).
//!
//! Used by the commands that judge a driver the way kubelet would (`conformance`, and the shared
//! `init` judge in [`super::init`]); the driver itself never decodes a reply. The rules:
//! - exactly one JSON value, whitespace around it allowed; anything else is the error Go reports;
//! - keys matched case-insensitively, the last duplicate wins; status strings compared exactly;
//! - strict types (`"attached":"true"` is an error), and `capabilities: null` is kept apart from
//!   an absent key, because kubelet panics on the first and uses its defaults for the second.

use crate::protocol::reply::Capabilities;
use serde_json::Value;
use std::collections::BTreeMap;

/// Capabilities as kubelet decodes them, defaults included.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Caps {
    /// attach (default true)
    pub attach: bool,
    /// selinuxRelabel (default true)
    pub(crate) selinux_relabel: bool,
    /// supportsMetrics (default false)
    pub(crate) supports_metrics: bool,
    /// fsGroup (default true)
    pub(crate) fs_group: bool,
    /// requiresFSResize (default true)
    pub(crate) requires_fs_resize: bool,
}

impl From<Capabilities> for Caps {
    fn from(c: Capabilities) -> Self {
        Self {
            attach: c.attach,
            selinux_relabel: c.selinux_relabel,
            supports_metrics: c.supports_metrics,
            fs_group: c.fs_group,
            requires_fs_resize: c.requires_fs_resize,
        }
    }
}

impl Default for Caps {
    fn default() -> Self {
        Self {
            attach: true,
            selinux_relabel: true,
            supports_metrics: false,
            fs_group: true,
            requires_fs_resize: true,
        }
    }
}

/// A reply decoded the way kubelet's `handleCmdResponse` does.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct GoStatus {
    /// `status`, empty when absent.
    pub(crate) status: String,
    /// `message`.
    pub(crate) message: String,
    /// `device`.
    pub(crate) device: String,
    /// `attached` (false when absent: kubelet reads that as detached).
    pub(crate) attached: bool,
    /// `capabilities`: `None` absent, `Some(None)` JSON null (kubelet panics on that in init).
    pub(crate) capabilities: Option<Option<Caps>>,
}

/// Decodes driver output as Go's `json.Unmarshal` into kubelet's `DriverStatus` would.
pub(crate) fn decode_like_go(output: &[u8]) -> Result<GoStatus, String> {
    let text = std::str::from_utf8(output).map_err(|_| "output is not UTF-8".to_string())?;
    if text.trim().is_empty() {
        return Err("unexpected end of JSON input (the driver printed nothing)".into());
    }
    let value: Value = serde_json::from_str(text).map_err(|e| go_syntax_error(text, &e))?;
    let mut st = GoStatus::default();
    let obj = match value {
        Value::Object(o) => o,
        Value::Null => return Ok(st),
        other => {
            return Err(format!(
                "json: cannot unmarshal {} into Go value of type DriverStatus",
                go_kind(&other)
            ));
        }
    };
    // Go matches keys case-insensitively; with duplicates the last one wins.
    for (k, v) in obj {
        let field = |name: &str| k.eq_ignore_ascii_case(name);
        let string = |v: &Value, name: &str| match v {
            Value::String(s) => Ok(Some(s.clone())),
            Value::Null => Ok(None),
            other => Err(format!(
                "json: cannot unmarshal {} into field {name} of type string",
                go_kind(other)
            )),
        };
        if field("status") {
            if let Some(s) = string(&v, "status")? {
                st.status = s;
            }
        } else if field("message") {
            if let Some(s) = string(&v, "message")? {
                st.message = s;
            }
        } else if field("device") {
            if let Some(s) = string(&v, "device")? {
                st.device = s;
            }
        } else if field("volumeName") {
            string(&v, "volumeName")?;
        } else if field("attached") {
            match v {
                Value::Bool(b) => st.attached = b,
                Value::Null => {}
                other => {
                    return Err(format!(
                        "json: cannot unmarshal {} into field attached of type bool",
                        go_kind(&other)
                    ));
                }
            }
        } else if field("volumeNewSize") {
            match v {
                Value::Number(n) if n.is_i64() => {}
                Value::Null => {}
                other => {
                    return Err(format!(
                        "json: cannot unmarshal {} into field volumeNewSize of type int64",
                        go_kind(&other)
                    ));
                }
            }
        } else if field("capabilities") {
            st.capabilities = Some(match v {
                Value::Null => None,
                Value::Object(c) => {
                    let mut caps = Caps::default();
                    for (ck, cv) in c {
                        let Value::Bool(b) = cv else {
                            if cv.is_null() {
                                continue;
                            }
                            return Err(format!(
                                "json: cannot unmarshal {} into capability {ck} of type bool",
                                go_kind(&cv)
                            ));
                        };
                        match ck.to_ascii_lowercase().as_str() {
                            "attach" => caps.attach = b,
                            "selinuxrelabel" => caps.selinux_relabel = b,
                            "supportsmetrics" => caps.supports_metrics = b,
                            "fsgroup" => caps.fs_group = b,
                            "requiresfsresize" => caps.requires_fs_resize = b,
                            _ => {}
                        }
                    }
                    Some(caps)
                }
                other => {
                    return Err(format!(
                        "json: cannot unmarshal {} into field capabilities",
                        go_kind(&other)
                    ));
                }
            });
        }
    }
    Ok(st)
}

/// The message Go's decoder gives for `text`, from serde's error position.
fn go_syntax_error(text: &str, e: &serde_json::Error) -> String {
    if e.is_eof() {
        return "unexpected end of JSON input".into();
    }
    // serde reports 1-based line and column (in bytes) of the offending character.
    let offset: usize = text
        .split_inclusive('\n')
        .take(e.line().saturating_sub(1))
        .map(str::len)
        .sum::<usize>()
        + e.column().saturating_sub(1);
    let bad = text.get(offset..).and_then(|s| s.chars().next());
    let msg = e.to_string();
    match bad {
        Some(c) if msg.starts_with("trailing characters") => {
            format!("invalid character {c:?} after top-level value")
        }
        Some(c) if msg.starts_with("expected value") => {
            format!("invalid character {c:?} looking for beginning of value")
        }
        _ => format!("invalid JSON ({e})"),
    }
}

fn go_kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "bool",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// Serializes an options map byte for byte as Go's `json.Marshal` of `map[string]string` does:
/// sorted keys, no spaces, `<`, `>`, `&`, U+2028 and U+2029 escaped.
pub(crate) fn go_json(map: &BTreeMap<String, String>) -> String {
    let s = serde_json::to_string(map).unwrap_or_default();
    s.replace('<', "\\u003c")
        .replace('>', "\\u003e")
        .replace('&', "\\u0026")
        .replace('\u{2028}', "\\u2028")
        .replace('\u{2029}', "\\u2029")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_decoding_rules() {
        let st =
            decode_like_go(br#"{"Status":"Success","CAPABILITIES":{"Attach":false}}"#).unwrap();
        assert_eq!(st.status, "Success");
        assert_eq!(
            st.capabilities,
            Some(Some(Caps {
                attach: false,
                ..Caps::default()
            }))
        );
        assert_eq!(
            decode_like_go(b"  {\"status\":\"Not supported\"}\n\n")
                .unwrap()
                .status,
            "Not supported"
        );
        assert_eq!(
            decode_like_go(br#"{"status":"Success","capabilities":null}"#)
                .unwrap()
                .capabilities,
            Some(None)
        );
        for bad in [
            &b""[..],
            b"I0101 log line\n{\"status\":\"Success\"}",
            b"{\"status\":\"Success\"}\nusage: foo",
            b"{\"status\":\"Success\"}{\"status\":\"Success\"}",
            br#"{"status":"Success","attached":"true"}"#,
            br#"{"status":"Success","capabilities":{"attach":"false"}}"#,
            br#"{"status":"Success","volumeNewSize":"1"}"#,
            b"[]",
        ] {
            assert!(
                decode_like_go(bad).is_err(),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
        for (bad, go_says) in [
            (
                &b"Usage: x"[..],
                "invalid character 'U' looking for beginning of value",
            ),
            (
                b"{\"status\":\"Success\"}\nusage",
                "invalid character 'u' after top-level value",
            ),
            (b"{\"status\":", "unexpected end of JSON input"),
            (b"  ", "unexpected end of JSON input"),
        ] {
            let e = decode_like_go(bad).unwrap_err();
            assert!(e.starts_with(go_says), "{e}");
        }
        // null is a valid document that leaves every field empty: a failure by status.
        assert_eq!(decode_like_go(b"null").unwrap().status, "");
    }

    #[test]
    fn options_are_serialized_like_go() {
        let m: BTreeMap<String, String> = [
            ("z".into(), "a<b>&c".into()),
            ("a".into(), "x\u{2028}".into()),
        ]
        .into_iter()
        .collect();
        assert_eq!(
            go_json(&m),
            r#"{"a":"x\u2028","z":"a\u003cb\u003e\u0026c"}"#
        );
    }
}
