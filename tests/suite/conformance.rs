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

    // Drivers that answer Failure the wrong way, or create what they were not asked to; caught
    // by the error-path checks, which need no --options.
    let failure = |how: &str| {
        GOOD.replace(
            "*) echo '{\"status\":\"Not supported\"}' ;;",
            &format!("mount) {how} ;;\n  *) echo '{{\"status\":\"Not supported\"}}' ;;"),
        )
    };
    let failure_exit0 = failure(r#"echo '{"status":"Failure","message":"bad options"}'; exit 0"#);
    let mkdirp =
        failure(r#"mkdir -p "$2"; echo '{"status":"Failure","message":"bad options"}'; exit 1"#);
    let lowercase = failure(r#"echo '{"status":"failure","message":"bad options"}'; exit 1"#);
    let silent_failure = failure(r#"echo '{"status":"Failure"}'; exit 1"#);

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
        ("mkdirp", mkdirp, "mount on a pod directory that does not exist"),
        ("lowercase", lowercase, "malformed options JSON"),
        ("nomessage", silent_failure, "malformed options JSON"),
    ];
    // A Failure that exits 0 is what kubelet wants (no argv in its log, docs/protocol.md §1.2).
    let (_, text) = judge(p, "failure0", &failure_exit0, &[]);
    assert!(
        text.lines()
            .any(|l| l.starts_with("PASS") && l.contains("malformed options JSON: Failure")),
        "a Failure with exit 0 must pass:\n{text}"
    );
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
fn contract_conformance_reports_what_it_did_not_run_as_skip() {
    let t = tempfile::tempdir().unwrap();
    let (ok, text) = judge(t.path(), "good", GOOD, &[]);
    assert!(ok, "{text}");
    let lifecycle = |mark: &str| {
        text.lines()
            .any(|l| l.starts_with(mark) && l.contains("volume lifecycle"))
    };
    assert!(lifecycle("SKIP") && !lifecycle("PASS"), "{text}");
    assert!(
        text.lines()
            .any(|l| l.starts_with("SKIP") && l.contains("--bad-options")),
        "{text}"
    );
    assert!(
        text.contains("The volume lifecycle was NOT run for test/good")
            && text.contains("flexvol conformance --driver test/good --options 'OPTIONS'"),
        "{text}"
    );
    assert!(
        text.contains("Driver-specific error paths were NOT run for test/good: add --bad-options"),
        "{text}"
    );
    let summary = text.lines().last().unwrap();
    assert!(summary.contains(" 0 failed, 4 skipped"), "{summary}");
    // The driver's mount is never called: nothing that was not checked may count as passed.
    assert!(
        !text
            .lines()
            .any(|l| l.starts_with("PASS") && l.contains("mount") && !l.contains("(all)")),
        "{text}"
    );
}

/// Checks the driver's replies as the user asked: a malformed --options is an error, not a SKIP.
#[test]
fn contract_conformance_refuses_malformed_option_arguments() {
    let t = tempfile::tempdir().unwrap();
    for args in [["--options", "{"], ["--bad-options", r#"{"a":1}"#]] {
        let dir = t.path().join("test~good");
        std::fs::create_dir_all(&dir).unwrap();
        let out = Command::new(crate::util::binary())
            .args(["conformance", "--plugin-dir", t.path().to_str().unwrap()])
            .args(["--driver", "test/good"])
            .args(args)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {text}");
        assert!(text.contains("not a JSON object of strings"), "{text}");
    }
}

/// A driver that accepts options it must refuse: it creates a host path that does not exist
/// whatever the type, and mounts a default when the required `path` is missing. Only
/// --bad-options can show it; everything else about it is correct.
#[test]
fn root_conformance_catches_a_driver_that_accepts_bad_options() {
    crate::require_root!();
    let t = tempfile::tempdir().unwrap();
    let data = t.path().join("data");
    let fallback = t.path().join("fallback");
    std::fs::create_dir(&data).unwrap();
    std::fs::create_dir(&fallback).unwrap();
    let lenient = GOOD.replace(
        "*) echo '{\"status\":\"Not supported\"}' ;;",
        &format!(
            r#"mount)
    [ -d "$2" ] || {{ echo '{{"status":"Failure","message":"no mount directory"}}'; exit 1; }}
    case "$3" in '{{"'*) ;; *) echo '{{"status":"Failure","message":"bad JSON"}}'; exit 1 ;; esac
    mountpoint -q "$2" && {{ echo '{{"status":"Success"}}'; exit 0; }}
    path=$(printf '%s' "$3" | sed -n 's/.*"path":"\([^"]*\)".*/\1/p')
    [ -n "$path" ] || path={fallback}
    mkdir -p "$path"
    mount --bind "$path" "$2" && echo '{{"status":"Success"}}' ;;
  unmount) umount "$2" 2>/dev/null; echo '{{"status":"Success"}}' ;;
  *) echo '{{"status":"Not supported"}}' ;;"#,
            fallback = fallback.display()
        ),
    );
    let missing = t.path().join("missing/dir");
    let bad_path = format!(r#"{{"path":"{}","type":"Directory"}}"#, missing.display());
    let (ok, text) = judge(
        t.path(),
        "lenient",
        &lenient,
        &[
            "--options",
            &format!(r#"{{"path":"{}"}}"#, data.display()),
            "--bad-options",
            &bad_path,
            "--bad-options",
            r#"{"type":"Directory"}"#,
        ],
    );
    assert!(!ok, "{text}");
    let line = |mark: &str, what: &str| {
        text.lines()
            .any(|l| l.starts_with(mark) && l.contains(what))
    };
    // The correct parts pass: the lifecycle, the generic error paths.
    assert!(
        line("PASS", "mount: Success and the pod directory is mounted"),
        "{text}"
    );
    assert!(
        line("PASS", "mount on a pod directory that does not exist"),
        "{text}"
    );
    // The bad options are caught, each for what it did.
    assert!(
        text.lines().any(|l| l.starts_with("FAIL")
            && l.contains("--bad-options #1 {path,type}")
            && l.contains("accepted: mount answered Success")
            && l.contains(&format!("{} did not exist and now does", missing.display()))),
        "{text}"
    );
    assert!(
        text.lines().any(|l| l.starts_with("FAIL")
            && l.contains("--bad-options #2 {type}")
            && l.contains("accepted: mount answered Success")),
        "{text}"
    );
    assert!(line("PASS", "nothing left mounted"), "{text}");
    assert!(crate::util::mounts_under(t.path()).is_empty());
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
        // Options the hostPath driver must refuse: a path that does not exist with type
        // Directory (it must not be created), and no path at all.
        .args([
            "--bad-options",
            &format!(
                r#"{{"path":"{}","type":"Directory"}}"#,
                env.root().join("absent").display()
            ),
            "--bad-options",
            r#"{"type":"DirectoryOrCreate"}"#,
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
    for check in [
        "mount: Success and the pod directory is mounted",
        "malformed options JSON: Failure",
        "mount on a pod directory that does not exist: Failure",
        "--bad-options #1 {path,type}: Failure",
        "--bad-options #2 {type}: Failure",
    ] {
        assert!(
            text.contains(&format!("PASS  flexvol/hostpath {check}")),
            "{check}:\n{text}"
        );
    }
    assert!(!text.contains("SKIP  flexvol/hostpath"), "{text}");
    assert!(!env.root().join("absent").exists());
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
