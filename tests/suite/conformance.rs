//! The conformance runner judges drivers by the protocol: it must pass a correct driver and catch
//! each classic mistake. The drivers here are small shell scripts, not flexvol.

use std::path::Path;
use std::process::Command;

const GOOD: &str = r#"#!/bin/sh
case "$1" in
  init) echo '{"status":"Success","capabilities":{"attach":false,"selinuxRelabel":false,"supportsMetrics":false,"fsGroup":false,"requiresFSResize":false}}' ;;
  *) echo '{"status":"Not supported"}' ;;
esac
"#;

/// Installs `script` as `<plugins>/test~<name>/<name>` and runs the conformance runner on it.
fn judge(plugins: &Path, name: &str, script: &str, extra: &[&str]) -> (bool, String) {
    let dir = plugins.join(format!("test~{name}"));
    std::fs::create_dir_all(&dir).unwrap();
    let exe = dir.join(name);
    std::fs::write(&exe, script).unwrap();
    std::fs::set_permissions(&exe, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let out = Command::new(crate::util::binary())
        .args([
            "conformance",
            "--plugin-dir",
            plugins.to_str().unwrap(),
            "--driver",
            &format!("test/{name}"),
            "--timeout",
            "3",
        ])
        .args(extra)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        text.lines()
            .last()
            .unwrap_or("")
            .starts_with("conformance: "),
        "{text}"
    );
    (out.status.success(), text)
}

#[test]
fn contract_conformance_passes_a_correct_driver_and_catches_classic_bugs() {
    let t = tempfile::tempdir().unwrap();
    let p = t.path();
    let (ok, text) = judge(p, "good", GOOD, &[]);
    assert!(ok && text.contains(" 0 failed"), "{text}");

    let cases: &[(&str, String, &str)] = &[
        ("logline", GOOD.replace("case \"$1\" in", "echo 'I1121 starting'\ncase \"$1\" in"), "init: Success with a capabilities object"),
        ("stderr", GOOD.replace("case \"$1\" in", "echo 'warning: x' >&2\ncase \"$1\" in"), "init: Success"),
        ("nullcaps", GOOD.replace(r#""capabilities":{"attach":false,"selinuxRelabel":false,"supportsMetrics":false,"fsGroup":false,"requiresFSResize":false}"#, r#""capabilities":null"#), "kubelet panic"),
        ("capsstring", GOOD.replace(r#""attach":false"#, r#""attach":"false""#), "cannot unmarshal string"),
        ("capitalS", GOOD.replace("Not supported", "Not Supported"), "unknown verb"),
        ("usage", GOOD.replace("*) echo '{\"status\":\"Not supported\"}' ;;", "*) echo 'usage: driver init|mount'; exit 1 ;;"), "unknown verb"),
        ("exitcode", GOOD.replace("*) echo '{\"status\":\"Not supported\"}' ;;", "*) echo '{\"status\":\"Not supported\"}'; exit 3 ;;"), "exit code agrees"),
        ("lingering", GOOD.replace("case \"$1\" in", "sleep 30 &\ncase \"$1\" in"), "no end of output"),
        ("silent", "#!/bin/sh\nexit 0\n".to_string(), "unexpected end of JSON input"),
    ];
    for (name, script, expect) in cases {
        let (ok, text) = judge(p, name, script, &[]);
        assert!(!ok, "{name}: the runner passed a broken driver:\n{text}");
        assert!(
            text.lines()
                .any(|l| l.starts_with("FAIL") && l.contains(expect)),
            "{name}: expected a FAIL mentioning {expect:?}:\n{text}"
        );
    }
}

#[test]
fn root_conformance_catches_a_driver_that_does_not_mount() {
    crate::require_root!();
    let t = tempfile::tempdir().unwrap();
    // Answers Success to mount without mounting anything: the pod would run on an empty dir.
    let liar = GOOD.replace("*) echo '{\"status\":\"Not supported\"}' ;;", "mount|unmount) echo '{\"status\":\"Success\"}' ;;\n  *) echo '{\"status\":\"Not supported\"}' ;;");
    let (ok, text) = judge(
        t.path(),
        "liar",
        &liar,
        &["--options", r#"{"path":"/srv"}"#],
    );
    let caught = text.lines().any(|l| {
        l.starts_with("FAIL")
            && l.contains("test/liar")
            && l.contains("mount: Success and the pod directory is mounted")
    });
    assert!(!ok && caught, "{text}");
}

#[test]
fn root_conformance_passes_flexvol_hostpath() {
    crate::require_root!();
    let env = crate::util::Env::new();
    let data = env.root().join("data");
    let out = Command::new(crate::util::binary())
        .args([
            "conformance",
            "--plugin-dir",
            env.plugins.to_str().unwrap(),
            "--driver",
            "flexvol/hostpath",
            "--driver",
            "flexvol/nfs",
            "--driver",
            "flexvol/lvm",
        ])
        .args([
            "--kubelet-root",
            env.root().join("kubelet").to_str().unwrap(),
        ])
        .args([
            "--options",
            &format!(
                r#"{{"path":"{}","type":"DirectoryOrCreate"}}"#,
                data.display()
            ),
        ])
        .env("FLEXVOL_CONFIG", &env.config)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    // The hostPath lifecycle must pass entirely; NFS and LVM are judged on their probe only here
    // (their volumes need the guest), so only their init-level checks are required.
    let hostpath_fails: Vec<_> = text
        .lines()
        .filter(|l| l.starts_with("FAIL") && l.contains("flexvol/hostpath"))
        .collect();
    assert!(hostpath_fails.is_empty(), "{text}");
    assert!(
        text.contains("PASS  flexvol/hostpath mount: Success and the pod directory is mounted"),
        "{text}"
    );
    for d in ["nfs", "lvm"] {
        let passed = text.lines().any(|l| {
            l.starts_with("PASS")
                && l.contains(&format!("flexvol/{d} "))
                && l.contains("init: Success with a capabilities object")
        });
        assert!(passed, "{text}");
    }
    assert!(env.mounts().is_empty(), "{:?}", env.mounts());
}

#[test]
fn root_conformance_never_deletes_data_behind_a_mount_a_driver_left() {
    crate::require_root!();
    let t = tempfile::tempdir().unwrap();
    let data = t.path().join("data");
    std::fs::create_dir(&data).unwrap();
    std::fs::write(data.join("precious"), "keep me").unwrap();
    // Mounts for real, but its unmount does nothing: the pod dirs stay bound to `data`.
    let sticky = GOOD.replace(
        "*) echo '{\"status\":\"Not supported\"}' ;;",
        &format!("mount) mount --bind {} \"$2\" && echo '{{\"status\":\"Success\"}}' ;;\n  unmount) echo '{{\"status\":\"Success\"}}' ;;\n  *) echo '{{\"status\":\"Not supported\"}}' ;;", data.display()),
    );
    let (ok, text) = judge(
        t.path(),
        "sticky",
        &sticky,
        &["--options", r#"{"path":"/unused"}"#, "--parallel", "2"],
    );
    assert!(!ok, "{text}");
    assert!(
        text.lines()
            .any(|l| l.starts_with("FAIL") && l.contains("nothing left mounted")),
        "{text}"
    );
    assert_eq!(
        std::fs::read_to_string(data.join("precious")).unwrap(),
        "keep me",
        "the runner deleted data:\n{text}"
    );
    let left = crate::util::mounts_under(t.path());
    assert!(left.is_empty(), "{left:?}");
}
