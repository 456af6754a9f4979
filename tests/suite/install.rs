//! install.sh into temporary plugin directories, including an upgrade under a running driver.

use crate::util::{binary, check_protocol};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

fn install_sh() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("install.sh")
}

fn run(args: &[&str]) -> (bool, String) {
    let out = Command::new(install_sh())
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr),
    )
}

fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

#[test]
fn install_fresh_idempotent_upgrade_under_load_and_uninstall() {
    let t = tempfile::tempdir().unwrap();
    let plugins = t.path().join("plugins");
    let p = plugins.to_str().unwrap();
    let bin = binary();
    let b = bin.to_str().unwrap();

    let (ok, out) = run(&["--plugin-dir", p, "--binary", b]);
    assert!(ok, "{out}");
    assert_eq!(
        names(&plugins),
        ["flexvol~hostpath", "flexvol~lvm", "flexvol~nfs"]
    );
    for d in ["hostpath", "nfs", "lvm"] {
        let exe = plugins.join(format!("flexvol~{d}/{d}"));
        assert_eq!(std::fs::read(&exe).unwrap(), std::fs::read(&bin).unwrap());
        assert_eq!(
            names(exe.parent().unwrap()),
            [d],
            "only the executable in the driver dir"
        );
        assert!(out.contains(&format!("flexvol/{d}: installed")), "{out}");
    }
    let (ok, out) = run(&["--plugin-dir", p, "--binary", b]);
    assert!(ok && out.matches("unchanged").count() == 3, "{out}");

    // A driver process is running from the installed file while we upgrade it.
    let hp = plugins.join("flexvol~hostpath/hostpath");
    let pod = t.path().join("pod");
    std::fs::create_dir(&pod).unwrap();
    let cfg = t.path().join("cfg.json");
    std::fs::write(
        &cfg,
        format!(
            r#"{{"stateDir":"{0}/s","runDir":"{0}/r","logFile":""}}"#,
            t.path().display()
        ),
    )
    .unwrap();
    let running = Command::new(&hp)
        .args(["mount", pod.to_str().unwrap(), "{}"])
        .env("FLEXVOL_CONFIG", &cfg)
        .env("FLEXVOL_TEST_FAULT", "hang")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(200));
    let newer = t.path().join("flexvol-newer");
    let mut bytes = std::fs::read(&bin).unwrap();
    bytes.extend_from_slice(b"\0upgrade marker");
    std::fs::write(&newer, &bytes).unwrap();
    std::fs::set_permissions(&newer, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let (ok, out) = run(&[
        "--plugin-dir",
        p,
        "--binary",
        newer.to_str().unwrap(),
        "--drivers",
        "hostpath",
    ]);
    assert!(ok && out.contains("flexvol/hostpath: upgraded"), "{out}");
    assert_eq!(std::fs::read(&hp).unwrap(), bytes);
    assert_eq!(
        names(hp.parent().unwrap()),
        ["hostpath"],
        "no temp file left behind"
    );
    // The old process was untouched and still answers (here: SIGTERM -> Failure JSON).
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(running.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let o = running.wait_with_output().unwrap();
    check_protocol(&o.stdout, &o.stderr, o.status.code()).failed("SIGTERM");

    let (ok, out) = run(&["--plugin-dir", p, "--uninstall"]);
    assert!(ok, "{out}");
    assert!(names(&plugins).is_empty(), "{:?}", names(&plugins));
}

#[test]
fn install_refuses_bad_arguments() {
    let t = tempfile::tempdir().unwrap();
    let p = t.path().to_str().unwrap();
    let b = binary();
    for args in [
        vec![
            "--plugin-dir",
            p,
            "--binary",
            b.to_str().unwrap(),
            "--vendor",
            "Bad_Vendor",
        ],
        vec![
            "--plugin-dir",
            p,
            "--binary",
            b.to_str().unwrap(),
            "--drivers",
            "ceph",
        ],
        vec!["--plugin-dir", p, "--binary", "/nonexistent/flexvol"],
        vec!["--bogus"],
    ] {
        let (ok, out) = run(&args);
        assert!(!ok, "{args:?} should fail: {out}");
    }
    assert!(
        names(t.path()).is_empty(),
        "a refused install writes nothing"
    );
}

/// `install` proves the installed copy answers `init` by the rules kubelet's prober applies (the
/// judge `doctor` and `conformance` share), not by a prefix match of stdout.
#[test]
fn install_refuses_a_binary_whose_init_kubelet_would_not_load() {
    let t = tempfile::tempdir().unwrap();
    let caps = r#""capabilities":{"attach":false,"selinuxRelabel":false,"supportsMetrics":true,"fsGroup":false,"requiresFSResize":false}"#;
    for (what, init) in [
        (
            "a log line after the reply",
            format!(r#"echo '{{"status":"Success",{caps}}}'; echo 'I1121 done'"#),
        ),
        (
            "a log line on stderr",
            format!(r#"echo 'W1121 careful' >&2; echo '{{"status":"Success",{caps}}}'"#),
        ),
        (
            "the wrong capabilities",
            r#"echo '{"status":"Success","capabilities":{"attach":true}}'"#.to_string(),
        ),
        (
            "Success with a non-zero exit",
            format!(r#"echo '{{"status":"Success",{caps}}}'; exit 1"#),
        ),
    ] {
        let bin = t.path().join("fake");
        std::fs::write(&bin, format!("#!/bin/sh\n{init}\n")).unwrap();
        std::fs::set_permissions(&bin, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .unwrap();
        let plugins = t.path().join("plugins");
        let out = Command::new(binary())
            .args(["install", "--plugin-dir", plugins.to_str().unwrap()])
            .args(["--binary", bin.to_str().unwrap(), "--drivers", "hostpath"])
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(!out.status.success(), "{what}: accepted\n{text}");
        assert!(text.contains("the install is broken"), "{what}: {text}");
    }
    // The real binary passes the same judge.
    let out = Command::new(binary())
        .args([
            "install",
            "--plugin-dir",
            t.path().join("ok").to_str().unwrap(),
        ])
        .args(["--drivers", "hostpath,nfs,lvm"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}
