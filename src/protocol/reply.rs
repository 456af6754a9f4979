//! The one JSON object kubelet reads back, and the only code that writes to stdout when flexvol
//! runs a driver verb.
//!
//! kubelet runs the driver with Go's `CombinedOutput()` and decodes stdout+stderr together as one
//! JSON value, so a single stray byte on either stream breaks the call. On a verb's path (run
//! under a driver name, or by hand as `flexvol <driver> VERB ...`) [`emit`] is therefore the only
//! writer of stdout, it writes at most once per process (the first reply wins: the normal path,
//! the deadline watchdog, the signal thread and the panic hook race for it), and nothing writes to
//! stderr; the programs a verb runs write into memory files, never to ours (`sys::exec`).
//!
//! The commands for people are not run by kubelet and print their own text: `cli` (`--help`,
//! `--version`; clap's usage errors go to stderr), the `ops` commands (reports on stdout) and
//! `flexvol provisioner` (its log on stderr). Printing is denied by lint everywhere else
//! (Cargo.toml `print_stdout`/`print_stderr`); those modules allow it at their top.

use serde::Serialize;
use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};

/// The status strings kubelet compares byte for byte (`driver-call.go`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub(crate) enum Status {
    /// The call did what was asked.
    Success,
    /// The call failed; `message` says why and what to do.
    Failure,
    /// kubelet caches this per driver name and never calls the verb again: answer it only for
    /// verbs this backend will never support.
    #[serde(rename = "Not supported")]
    NotSupported,
}

/// Capabilities reported by `init`. All five are always sent: kubelet's defaults for omitted
/// keys (attach, selinuxRelabel, fsGroup and requiresFSResize true) are wrong for most backends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Capabilities {
    /// Whether attach/waitforattach/mountdevice are used (LVM only).
    pub attach: bool,
    /// Whether kubelet may relabel the volume for SELinux.
    #[serde(rename = "selinuxRelabel")]
    pub selinux_relabel: bool,
    /// Whether kubelet reports volume stats by statfs of the pod directory.
    pub(crate) supports_metrics: bool,
    /// Whether kubelet recursively chowns the volume to the pod's fsGroup.
    pub(crate) fs_group: bool,
    /// Whether kubelet calls `expandfs` after a resize.
    #[serde(rename = "requiresFSResize")]
    pub(crate) requires_fs_resize: bool,
}

/// One reply. Optional fields are omitted when empty, never sent as `null`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Reply {
    /// The status kubelet switches on.
    pub(crate) status: Status,
    /// Human-readable reason; shown in pod and PVC events.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) message: Option<String>,
    /// Device path, for `attach` and `waitforattach`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) device: Option<String>,
    /// For `isattached`: kubelet reads a missing value as false (= detached).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) attached: Option<bool>,
    /// For `init` only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) capabilities: Option<Capabilities>,
    /// For `expandvolume`: the new size in bytes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) volume_new_size: Option<u64>,
}

impl Reply {
    /// A bare Success.
    pub(crate) fn success() -> Self {
        Self::with_status(Status::Success)
    }

    /// "Not supported": kubelet falls back to its own default for this verb and caches the answer.
    pub(crate) fn not_supported() -> Self {
        Self::with_status(Status::NotSupported)
    }

    /// A Failure with a message for the operator.
    pub(crate) fn failure(message: impl Into<String>) -> Self {
        Self {
            message: Some(message.into()),
            ..Self::with_status(Status::Failure)
        }
    }

    fn with_status(status: Status) -> Self {
        Self {
            status,
            message: None,
            device: None,
            attached: None,
            capabilities: None,
            volume_new_size: None,
        }
    }

    /// Adds an informational message (kept short: it ends up in events).
    pub(crate) fn with_message(mut self, message: impl Into<String>) -> Self {
        self.message = Some(message.into());
        self
    }

    /// Success carrying a device path.
    pub(crate) fn device(device: impl Into<String>) -> Self {
        Self {
            device: Some(device.into()),
            ..Self::success()
        }
    }

    /// The process exit code that goes with this reply: 0, Failure included (issue #32, item 12).
    /// kubelet's `DriverCall.Run` returns the same error for a Failure whatever the exit status,
    /// but after a non-zero one it also logs the whole argv, options JSON included (capability
    /// tokens, `kubernetes.io/secret/*` values), at warning level (docs/protocol.md §1.2). The one
    /// Failure that exits 1 is the answer to a signal ([`crate::sys::process::fail_and_exit`]):
    /// kubelet's own timeout needs the exec error to report a timeout.
    pub(crate) fn exit_code(&self) -> i32 {
        match self.status {
            Status::Success | Status::NotSupported | Status::Failure => 0,
        }
    }

    /// Whether this reply is a Failure.
    pub(crate) fn is_failure(&self) -> bool {
        self.status == Status::Failure
    }

    /// The reply as one line of compact JSON (what goes on stdout, without the newline).
    pub(crate) fn to_json(&self) -> String {
        // Serializing this struct cannot fail: it has only strings, bools and integers.
        serde_json::to_string(self).unwrap_or_else(|_| {
            r#"{"status":"Failure","message":"internal error: reply not serializable"}"#.to_owned()
        })
    }
}

static REPLIED: AtomicBool = AtomicBool::new(false);
static PRETTY: AtomicBool = AtomicBool::new(false);

/// Makes [`emit`] indent its JSON (the human `--pretty` flag; never used by kubelet).
pub(crate) fn set_pretty(pretty: bool) {
    PRETTY.store(pretty, Ordering::Relaxed);
}

/// Writes `reply` and a newline to stdout, once per process. Returns false (and writes nothing)
/// when another path already replied.
#[allow(clippy::print_stdout)]
pub(crate) fn emit(reply: &Reply) -> bool {
    if REPLIED.swap(true, Ordering::SeqCst) {
        return false;
    }
    let text = if PRETTY.load(Ordering::Relaxed) {
        serde_json::to_string_pretty(reply).unwrap_or_else(|_| reply.to_json())
    } else {
        reply.to_json()
    };
    let mut out = std::io::stdout().lock();
    // A closed stdout leaves nobody to tell; the exit code still carries the outcome.
    let _ = out.write_all(text.as_bytes());
    let _ = out.write_all(b"\n");
    let _ = out.flush();
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn not_supported_is_spelled_as_kubelet_expects() {
        assert_eq!(
            Reply::not_supported().to_json(),
            r#"{"status":"Not supported"}"#
        );
    }

    #[test]
    fn init_reply_lists_all_capabilities() {
        let r = Reply {
            capabilities: Some(Capabilities {
                attach: false,
                selinux_relabel: false,
                supports_metrics: true,
                fs_group: false,
                requires_fs_resize: false,
            }),
            ..Reply::success()
        };
        assert_eq!(
            r.to_json(),
            r#"{"status":"Success","capabilities":{"attach":false,"selinuxRelabel":false,"supportsMetrics":true,"fsGroup":false,"requiresFSResize":false}}"#
        );
    }

    #[test]
    fn failure_escapes_message_and_exits_0() {
        let r = Reply::failure("bad \"path\"\n/x");
        assert_eq!(
            r.to_json(),
            r#"{"status":"Failure","message":"bad \"path\"\n/x"}"#
        );
        // 0: with any other status kubelet logs the whole argv, options and tokens included.
        assert_eq!(r.exit_code(), 0);
        assert!(r.is_failure() && !Reply::success().is_failure());
        assert_eq!(Reply::not_supported().exit_code(), 0);
        assert_eq!(Reply::success().exit_code(), 0);
    }

    #[test]
    fn device_and_attached_fields() {
        assert_eq!(
            Reply::device("/dev/vg/lv").to_json(),
            r#"{"status":"Success","device":"/dev/vg/lv"}"#
        );
        let a = Reply {
            attached: Some(true),
            ..Reply::success()
        };
        assert_eq!(a.to_json(), r#"{"status":"Success","attached":true}"#);
    }
}
