//! The one judge of a driver's `init` reply, used by `flexvol doctor`, `flexvol install` (to
//! prove the installed copy answers) and `flexvol conformance`, so the three never disagree.
//!
//! kubelet's prober runs `<driver> init` and loads the driver only if the call succeeds by the
//! rules of `driver-call.go`; this judge applies exactly those rules, and nothing weaker:
//! - the bytes judged are stdout and stderr together, as Go's `CombinedOutput` reads them (run
//!   the driver with `SystemRunner::run_combined`): a log line on either stream breaks the call;
//! - they must decode as one JSON value by Go's rules ([`super::gojson`]);
//! - `status` must be exactly `"Success"` (kubelet skips the driver otherwise);
//! - `"capabilities": null` makes kubelet panic (kubernetes#52242); an absent object means
//!   kubelet's defaults (attach, selinuxRelabel, fsGroup and requiresFSResize true);
//! - a non-zero exit is an error even with a Success reply (kubelet logs "driver bug: exec error
//!   but no error in response" and does not load the driver).
//!
//! A caller that knows which capabilities the driver must announce (flexvol's own drivers) passes
//! them; any difference is then a failure too. Timing and repeatability are the caller's business.

use crate::protocol::gojson::{Caps, decode_like_go};

/// An `init` reply kubelet accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct InitReply {
    /// The capabilities as kubelet reads them, defaults included.
    pub(crate) caps: Caps,
    /// Whether the driver sent a capabilities object (false: kubelet's defaults apply).
    pub(crate) announced: bool,
}

/// Judges one `init` call: `output` is what kubelet would read (stdout and stderr on one pipe),
/// `code` the exit code (`None`: killed by a signal). The error says what kubelet would do and why.
pub(crate) fn judge_init(
    output: &[u8],
    code: Option<i32>,
    expected: Option<Caps>,
) -> Result<InitReply, String> {
    let st = decode_like_go(output).map_err(|e| {
        format!(
            "init printed {}, which kubelet cannot decode: {e}; kubelet does not load the driver",
            shown(output)
        )
    })?;
    if st.status != "Success" {
        let why = if st.message.is_empty() {
            String::new()
        } else {
            format!(" ({})", st.message)
        };
        return Err(format!(
            "init answered status {:?}{why}; kubelet loads a driver only when init answers \"Success\"",
            st.status
        ));
    }
    let (caps, announced) = match st.capabilities {
        Some(Some(c)) => (c, true),
        Some(None) => {
            return Err(
                "init answered \"capabilities\": null, which makes kubelet panic (kubernetes#52242); send an object or leave the key out"
                    .into(),
            );
        }
        None => (Caps::default(), false),
    };
    match code {
        Some(0) => {}
        Some(c) => {
            return Err(format!(
                "init answered Success but exited with status {c}; kubelet treats that as an error (\"driver bug: exec error but no error in response\") and does not load the driver"
            ));
        }
        None => {
            return Err("init was killed by a signal; kubelet does not load the driver".into());
        }
    }
    if let Some(want) = expected
        && want != caps
    {
        return Err(format!(
            "init announced capabilities {caps:?}{}, expected {want:?}",
            if announced {
                ""
            } else {
                " (kubelet's defaults: the driver sent none)"
            }
        ));
    }
    Ok(InitReply { caps, announced })
}

/// The output for a message: trimmed, quoted, at most 200 characters.
fn shown(output: &[u8]) -> String {
    let text = String::from_utf8_lossy(output);
    let t = text.trim();
    if t.chars().count() > 200 {
        format!("{:?}...", t.chars().take(200).collect::<String>())
    } else {
        format!("{t:?}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOSTPATH: &str = r#"{"status":"Success","capabilities":{"attach":false,"selinuxRelabel":false,"supportsMetrics":true,"fsGroup":false,"requiresFSResize":false}}"#;

    fn hostpath_caps() -> Caps {
        Caps {
            attach: false,
            selinux_relabel: false,
            supports_metrics: true,
            fs_group: false,
            requires_fs_resize: false,
        }
    }

    #[test]
    fn accepts_what_kubelet_loads() {
        let r = judge_init(format!("{HOSTPATH}\n").as_bytes(), Some(0), None).unwrap();
        assert_eq!(r.caps, hostpath_caps());
        assert!(r.announced);
        judge_init(HOSTPATH.as_bytes(), Some(0), Some(hostpath_caps())).unwrap();
        let r = judge_init(br#"{"Status":"Success"}"#, Some(0), None).unwrap();
        assert_eq!((r.caps, r.announced), (Caps::default(), false));
    }

    #[test]
    fn refuses_what_kubelet_refuses() {
        for (out, code, expected, says) in [
            (
                format!("warning: x\n{HOSTPATH}"),
                Some(0),
                None,
                "looking for beginning of value",
            ),
            (
                format!("{HOSTPATH}\nI1121 log"),
                Some(0),
                None,
                "after top-level value",
            ),
            (String::new(), Some(0), None, "unexpected end of JSON input"),
            (
                r#"{"status":"Not supported"}"#.into(),
                Some(0),
                None,
                "status \"Not supported\"",
            ),
            (
                r#"{"status":"Failure","message":"no config"}"#.into(),
                Some(1),
                None,
                "(no config)",
            ),
            (
                r#"{"status":"Success","capabilities":null}"#.into(),
                Some(0),
                None,
                "kubernetes#52242",
            ),
            (HOSTPATH.into(), Some(3), None, "exited with status 3"),
            (HOSTPATH.into(), None, None, "killed by a signal"),
            (
                r#"{"status":"Success"}"#.into(),
                Some(0),
                Some(hostpath_caps()),
                "the driver sent none",
            ),
            (
                HOSTPATH.replace(r#""attach":false"#, r#""attach":true"#),
                Some(0),
                Some(hostpath_caps()),
                "expected Caps",
            ),
        ] {
            let e = judge_init(out.as_bytes(), code, expected).unwrap_err();
            assert!(e.contains(says), "{out:?}: {e}");
        }
    }
}
