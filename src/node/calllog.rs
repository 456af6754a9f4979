//! One record per call: time, pid, backend, verb, arguments, reply and duration, as one JSON line
//! appended to the log file (and optionally sent to the system log). Never stdout or stderr.
//!
//! Arguments are redacted before they are stored, by the same rule as every message
//! ([`crate::protocol::options::is_sensitive_key`]): kubelet's secret entries, any option whose
//! name suggests a credential, and credential-like `name=value` items inside list options are
//! replaced by `<redacted>`, the value of an option the backend does not read is not logged, and an argument that looks like JSON
//! but does not parse is not logged at all (it could be a secret-bearing payload we cannot read).
//! A log that cannot be written is dropped silently: the reply matters more than the log.

use crate::protocol::options::{REDACTED, is_sensitive_key, redact_value};
use crate::protocol::reply::Reply;
use serde::Serialize;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

struct Pending {
    file: Option<PathBuf>,
    syslog: Option<PathBuf>,
    started: Instant,
    time: SystemTime,
    backend: String,
    verb: String,
    args: Vec<String>,
}

static PENDING: Mutex<Option<Pending>> = Mutex::new(None);

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Record<'a> {
    time: String,
    pid: u32,
    backend: &'a str,
    verb: &'a str,
    args: &'a [String],
    reply: &'a Reply,
    duration_ms: f64,
}

/// Starts the record for this call. Nothing is written until [`record_final`]. `syslog` is the
/// socket to also send the record to (normally `/dev/log`), `None` when syslog is off.
pub fn begin(
    file: Option<PathBuf>,
    syslog: Option<PathBuf>,
    backend: &str,
    verb: &str,
    args: &[String],
) {
    let p = Pending {
        file,
        syslog,
        started: Instant::now(),
        time: SystemTime::now(),
        backend: backend.into(),
        verb: verb.into(),
        args: args.iter().map(|a| redact_arg(backend, a)).collect(),
    };
    if let Ok(mut g) = PENDING.lock() {
        *g = Some(p);
    }
}

/// Writes the record with the reply. Only the first call writes; later ones do nothing.
pub fn record_final(reply: &Reply) {
    let Some(p) = PENDING.lock().ok().and_then(|mut g| g.take()) else {
        return;
    };
    let rec = Record {
        time: rfc3339(p.time),
        pid: std::process::id(),
        backend: &p.backend,
        verb: &p.verb,
        args: &p.args,
        reply,
        duration_ms: (p.started.elapsed().as_secs_f64() * 1e6).round() / 1e3,
    };
    let Ok(mut line) = serde_json::to_string(&rec) else {
        return;
    };
    if let Some(socket) = &p.syslog {
        send_syslog(socket, &line, reply.is_failure());
    }
    if let Some(path) = p.file {
        line.push('\n');
        // One write(2) with O_APPEND: concurrent calls never interleave within a line.
        if let Ok(mut f) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .mode(0o640)
            .open(&path)
        {
            let _ = f.write_all(line.as_bytes());
        }
    }
}

fn send_syslog(socket: &std::path::Path, line: &str, failure: bool) {
    // RFC 3164 to /dev/log: facility daemon (3), severity info (6) or err (3).
    let pri = 3 * 8 + if failure { 3 } else { 6 };
    let msg = format!("<{pri}>flexvol[{}]: {line}", std::process::id());
    if let Ok(s) = std::os::unix::net::UnixDatagram::unbound() {
        let _ = s.send_to(msg.as_bytes(), socket);
    }
}

/// Whether `backend` reads option `key` (kubelet's own keys included). The value of an option it
/// does not read is not logged: its name may be a credential the redaction rule does not know.
fn known_option(backend: &str, key: &str) -> bool {
    crate::protocol::options::keys::KUBELET.contains(&key)
        || match backend {
            "hostpath" => crate::backend::hostpath::OPTION_KEYS.contains(&key),
            "nfs" => crate::backend::nfs::options::KNOWN_KEYS.contains(&key),
            "lvm" => crate::backend::lvm::options::key::ALL.contains(&key),
            _ => false,
        }
}

/// Redacts one argument of a call to `backend` for the log: in an options object, every value
/// goes through the one redaction rule ([`crate::protocol::options::redact_value`]), and the
/// value of an option the backend does not read is not logged at all.
pub fn redact_arg(backend: &str, arg: &str) -> String {
    if !arg.trim_start().starts_with('{') {
        return arg.to_owned();
    }
    // A BTreeMap, not serde_json::Map: keys stay sorted even when another crate in the build
    // (kube's jsonpath_lib) turns on serde_json's preserve_order.
    match serde_json::from_str::<std::collections::BTreeMap<String, serde_json::Value>>(arg) {
        Ok(mut map) => {
            for (k, v) in map.iter_mut() {
                let shown = match v {
                    _ if is_sensitive_key(k) => REDACTED.to_owned(),
                    _ if !known_option(backend, k) => "<not logged: unknown option>".to_owned(),
                    serde_json::Value::String(s) => redact_value(k, s),
                    _ => continue,
                };
                *v = serde_json::Value::String(shown);
            }
            serde_json::to_string(&map).unwrap_or_else(|_| "<unprintable>".into())
        }
        Err(_) => format!("<unparsable JSON, {} bytes, not logged>", arg.len()),
    }
}

/// Formats a time as RFC 3339 UTC with milliseconds.
pub fn rfc3339(t: SystemTime) -> String {
    let d = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    // SystemTime is a timespec (i64 seconds), so a time after the epoch always fits; the
    // fallback is as unreachable as the pre-epoch one above.
    let secs = i64::try_from(d.as_secs()).unwrap_or_default();
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        d.subsec_millis()
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn redaction() {
        let a = redact_arg(
            "nfs",
            r#"{"kubernetes.io/secret/password":"czNjcjN0","share":"/x","mountPassword":"p","note":"n1","kubernetes.io/pod.name":"web"}"#,
        );
        assert_eq!(
            a,
            r#"{"kubernetes.io/pod.name":"web","kubernetes.io/secret/password":"<redacted>","mountPassword":"<redacted>","note":"<not logged: unknown option>","share":"/x"}"#
        );
        assert_eq!(
            redact_arg("hostpath", "/var/lib/kubelet/pods/x"),
            "/var/lib/kubelet/pods/x"
        );
        assert!(!redact_arg("nfs", r#"{"kubernetes.io/secret/p":"czNjcjN0""#).contains("czNj"));
        // The broad, case-insensitive rule, and list items.
        let a = redact_arg(
            "nfs",
            r#"{"PASS":"a1","apiKey":"a2","authToken":"a3","privateData":"a4","cred":"a5","mountOptions":"ro,password=a6"}"#,
        );
        for v in ["a1", "a2", "a3", "a4", "a5", "a6"] {
            assert!(!a.contains(v), "{v} leaked: {a}");
        }
        assert!(
            a.contains(r#""mountOptions":"ro,password=<redacted>""#),
            "{a}"
        );
    }

    #[test]
    fn dates() {
        assert_eq!(rfc3339(UNIX_EPOCH), "1970-01-01T00:00:00.000Z");
        assert_eq!(
            rfc3339(UNIX_EPOCH + Duration::from_millis(1_795_244_645_123)),
            "2026-11-21T07:04:05.123Z"
        );
        assert_eq!(
            rfc3339(UNIX_EPOCH + Duration::from_secs(951_782_400)),
            "2000-02-29T00:00:00.000Z"
        );
    }
}
