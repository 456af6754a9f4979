//! Regression tests for the policy, config and protocol holes of issue #10 (items 3, 4, 7, 10, 11
//! and 12), through the real binary. Each test fails on the code before the fix; the comment on
//! each says what the old code did.

use crate::require_root;
use crate::util::{Env, binary, check_protocol, hostpath_options as opts};
use serde_json::{Value, json};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

fn mount(env: &Env, pod: &Path, j: &str) -> crate::util::Reply {
    env.call("hostpath", &["mount", pod.to_str().unwrap(), j])
}

/// `flexvol ARGS...` with the env's config; (exit code, stdout).
fn flexvol(env: &Env, args: &[&str]) -> (i32, String) {
    let out = Command::new(binary())
        .args(args)
        .env("FLEXVOL_CONFIG", &env.config)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(out.stderr.is_empty());
    (
        out.status.code().unwrap(),
        String::from_utf8(out.stdout).unwrap(),
    )
}

fn doctor_checks(env: &Env) -> Vec<Value> {
    let plugins = env.plugins.to_str().unwrap().to_owned();
    let (_, text) = flexvol(env, &["doctor", "--json", "--plugin-dir", &plugins]);
    let v: Value = serde_json::from_str(&text).unwrap();
    v["checks"].as_array().unwrap().clone()
}

/// Item 3. Old code: without allowedRoots everything but /proc, /sys, /dev, /etc and /boot was
/// served, so `/usr/bin`, `/root`, `/run` and `/var/log` were bound read-write into the pod.
#[test]
fn root_default_policy_serves_only_the_default_root() {
    require_root!();
    let env = Env::with_config(json!({"hostpath": {}}));
    let pod = env.pod_dir("u", "v");
    for p in ["/usr/bin", "/root", "/home", "/srv", "/mnt"] {
        let r = mount(&env, &pod, &opts(Path::new(p), json!({})));
        r.failed("refused")
            .failed("/srv/flexvol")
            .failed("\"allowedRoots\"");
        assert!(
            r.message().contains(env.config.to_str().unwrap()),
            "the message names the config file to edit: {}",
            r.message()
        );
    }
    // These contain always-refused locations too (runtimes, pod logs, CNI, this test's config).
    for p in ["/run", "/var/log", "/opt", "/tmp", "/usr"] {
        mount(&env, &pod, &opts(Path::new(p), json!({}))).failed("refused");
    }
    assert!(env.mounts().is_empty(), "{:?}", env.mounts());

    // The default root itself is served. Leave the node as found: remove only what we made.
    let root = Path::new("/srv/flexvol");
    let made_root = !root.exists();
    let dir = root.join(format!("security-policy-test-{}", std::process::id()));
    mount(
        &env,
        &pod,
        &opts(&dir, json!({"type": "DirectoryOrCreate"})),
    )
    .ok();
    env.call("hostpath", &["unmount", pod.to_str().unwrap()])
        .ok();
    std::fs::remove_dir(&dir).unwrap();
    if made_root {
        std::fs::remove_dir(root).unwrap();
    }
    assert!(env.mounts().is_empty());
}

/// Item 3. Old code: with a broad allowedRoots, flexvol's own plugin directory and executable,
/// its log, config, the runtimes' directories and the CNI binaries were all served.
#[test]
fn root_always_refused_locations_whatever_the_config_says() {
    require_root!();
    let exe = std::fs::canonicalize(binary()).unwrap();
    let exe_dir = exe.parent().unwrap().to_owned();
    let env = Env::new();
    env.reconfigure(json!({"hostpath": {"allowedRoots": [
        env.root(), "/var", "/run", "/opt", "/etc", "/usr", exe_dir.parent().unwrap()
    ]}}));
    let pod = env.pod_dir("u", "v");
    let mut refused: Vec<PathBuf> = vec![
        env.plugins.clone(),
        env.plugins.join("flexvol~hostpath"),
        env.driver("hostpath"),
        env.log.clone(),
        env.config.clone(),
        env.state.clone(),
        env.run.clone(),
        exe.clone(),
        exe_dir.clone(),
    ];
    for p in [
        "/var/lib/containerd",
        "/run/containerd",
        "/var/lib/docker",
        "/run/docker.sock",
        "/var/lib/containers",
        "/var/lib/cri-o",
        "/opt/cni/bin",
        "/etc/cni",
        "/etc/kubernetes",
        "/var/lib/etcd",
        "/var/lib/kubelet",
        "/var/log/pods",
        "/usr/libexec/kubernetes/kubelet-plugins/volume/exec",
    ] {
        refused.push(PathBuf::from(p));
    }
    // The log and state must exist for some checks to matter: make one call first.
    env.call("hostpath", &["init"]).ok();
    std::fs::create_dir_all(&env.state).unwrap();
    std::fs::create_dir_all(&env.run).unwrap();
    for p in &refused {
        mount(&env, &pod, &opts(p, json!({})))
            .failed("refused")
            .failed("whatever the node config says");
    }
    // A directory that contains one of them is refused too (it would expose it).
    mount(&env, &pod, &opts(Path::new("/var/lib"), json!({})))
        .failed("whatever the node config says");
    assert!(env.mounts().is_empty(), "{:?}", env.mounts());
}

/// Item 4. Old code compared the configured stateDir/runDir as strings, so through a symlink
/// (as `/var/run` -> `/run`) or a bind mount a pod could mount flexvol's records and forge them.
#[test]
fn root_state_and_run_dirs_are_recognised_through_symlinks_and_bind_mounts() {
    require_root!();
    let env = Env::new();
    let real_state = env.mkdir("real-state");
    let real_run = env.mkdir("real-run");
    std::os::unix::fs::symlink(&real_state, env.root().join("state-link")).unwrap();
    std::os::unix::fs::symlink(&real_run, env.root().join("run-link")).unwrap();
    env.reconfigure(json!({
        "stateDir": env.root().join("state-link"),
        "runDir": env.root().join("run-link"),
    }));
    let pod = env.pod_dir("u", "v");
    for p in [&real_state, &real_run] {
        mount(&env, &pod, &opts(p, json!({"type": "Directory"})))
            .failed("refused")
            .failed("flexvol's");
    }
    // The same directory under another name: a bind mount of the state dir.
    let alias = env.mkdir("alias");
    nix::mount::mount(
        Some(&real_state),
        &alias,
        None::<&str>,
        nix::mount::MsFlags::MS_BIND,
        None::<&str>,
    )
    .unwrap();
    let r = mount(&env, &pod, &opts(&alias, json!({"type": "Directory"})));
    nix::mount::umount2(&alias, nix::mount::MntFlags::MNT_DETACH).unwrap();
    r.failed("refused").failed("under another name");
    assert!(env.mounts().is_empty(), "{:?}", env.mounts());
}

/// Item 3. Old code bound a device node made with mknod outside /dev (type CharDevice).
#[test]
fn root_device_nodes_outside_dev_are_refused() {
    require_root!();
    let env = Env::new();
    let node = env.root().join("null-copy");
    nix::sys::stat::mknod(
        &node,
        nix::sys::stat::SFlag::S_IFCHR,
        nix::sys::stat::Mode::from_bits_truncate(0o666),
        nix::sys::stat::makedev(1, 3),
    )
    .unwrap();
    let pod = env.pod_dir("u", "v");
    for t in ["CharDevice", ""] {
        mount(&env, &pod, &opts(&node, json!({"type": t})))
            .failed("refused")
            .failed("device node outside /dev");
    }
    assert!(env.mounts().is_empty(), "{:?}", env.mounts());
}

/// Item 12. Old code: uid 4294967295 ((uid_t)-1, "no change") and modes "+755", "04755", "2775"
/// and "1777" were accepted, so the driver created set-gid, sticky or set-uid directories.
#[test]
fn contract_uid_minus_one_signed_modes_and_special_bits_are_refused() {
    let env = Env::new();
    let pod = env.pod_dir("u", "v");
    let target = env.root().join("made");
    for (extra, needle) in [
        (json!({"uid": "4294967295"}), "option \"uid\""),
        (json!({"gid": "4294967295"}), "option \"gid\""),
        (json!({"mode": "+755"}), "option \"mode\""),
        (json!({"mode": "-755"}), "option \"mode\""),
        (json!({"mode": " 755"}), "option \"mode\""),
        (json!({"mode": "04755"}), "set-uid, set-gid and sticky"),
        (json!({"mode": "2775"}), "set-uid, set-gid and sticky"),
        (json!({"mode": "1777"}), "set-uid, set-gid and sticky"),
    ] {
        let mut e = extra.clone();
        e["type"] = json!("DirectoryOrCreate");
        mount(&env, &pod, &opts(&target, e)).failed(needle);
        assert!(!target.exists(), "{extra}: a refused mount creates nothing");
    }
}

/// Item 12. Old code created 2,041 nested directories for a 6,000-byte path before failing.
#[test]
fn contract_over_long_paths_create_nothing() {
    let env = Env::new();
    let pod = env.pod_dir("u", "v");
    let base = env.root().join("long");
    let deep = base.join("ab/".repeat(3000));
    mount(
        &env,
        &pod,
        &opts(&deep, json!({"type": "DirectoryOrCreate"})),
    )
    .failed("limited to 4095 bytes");
    let wide = base.join("x".repeat(256));
    mount(
        &env,
        &pod,
        &opts(&wide, json!({"type": "DirectoryOrCreate"})),
    )
    .failed("limited to 255 bytes");
    let patterned = json!({"type": "DirectoryOrCreate", "pathPattern": format!("{}{{volume}}", "p/".repeat(2100))});
    mount(&env, &pod, &opts(&base, patterned)).failed("limited to 4095 bytes");
    assert!(!base.exists(), "nothing may be created for a refused path");
    let r = mount(&env, &pod, &opts(&deep, json!({})));
    assert!(
        r.message().len() < 1000,
        "a long path is not echoed whole: {} bytes",
        r.message().len()
    );
}

/// Item 12. Old code replaced bad bytes by U+FFFD (`to_string_lossy`), which named another
/// directory: `made\xff` became `made\u{FFFD}` and that directory was created.
#[test]
fn contract_non_utf8_argv_is_refused_with_one_failure() {
    let env = Env::new();
    let pod = env.pod_dir("u", "v");
    let mut json_bytes = br#"{"type":"DirectoryOrCreate","path":""#.to_vec();
    json_bytes.extend_from_slice(env.root().join("made").as_os_str().as_bytes());
    json_bytes.extend_from_slice(b"\xff\"}");
    let bad_json = std::ffi::OsStr::from_bytes(&json_bytes).to_owned();
    let mut bad_dir = pod.as_os_str().as_bytes().to_vec();
    bad_dir.push(0xfe);
    let bad_dir = std::ffi::OsStr::from_bytes(&bad_dir).to_owned();
    for args in [
        vec!["mount".into(), pod.as_os_str().to_owned(), bad_json.clone()],
        vec!["unmount".into(), bad_dir.clone()],
    ] {
        let out = env.command("hostpath", &[]).args(&args).output().unwrap();
        let r = check_protocol(&out.stdout, &out.stderr, out.status.code());
        r.failed("is not valid UTF-8");
    }
    // By hand too.
    let out = Command::new(binary())
        .arg("hostpath")
        .arg("mount")
        .arg(&pod)
        .arg(&bad_json)
        .env("FLEXVOL_CONFIG", &env.config)
        .output()
        .unwrap();
    check_protocol(&out.stdout, &out.stderr, out.status.code()).failed("argument 4");
    let names: Vec<String> = std::fs::read_dir(env.root())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        !names.iter().any(|n| n.starts_with("made")),
        "nothing named like the bad path may be created: {names:?}"
    );
}

/// Item 12. Old code said "changed while it was being checked (a symlink appeared)" for a
/// symlink that had been dangling all along.
#[test]
fn contract_a_dangling_symlink_is_reported_as_one() {
    let env = Env::new();
    let pod = env.pod_dir("u", "v");
    let link = env.root().join("dangling");
    std::os::unix::fs::symlink(env.root().join("nowhere"), &link).unwrap();
    for t in ["FileOrCreate", "DirectoryOrCreate", "", "File"] {
        let r = mount(&env, &pod, &opts(&link, json!({"type": t})));
        r.failed("is a dangling symlink");
        assert!(!r.message().contains("appeared"), "{}", r.message());
    }
    assert!(!env.root().join("nowhere").exists());
}

/// Item 7. Old code echoed the value of a credential-like key in the reply, and so in pod
/// events, the log and syslog: `option "password" has an invalid value "S3CRETpwL"`.
#[test]
fn contract_credential_values_never_reach_replies_logs_or_syslog() {
    let env = Env::new();
    let sock_path = env.root().join("log.sock");
    let sock = std::os::unix::net::UnixDatagram::bind(&sock_path).unwrap();
    sock.set_read_timeout(Some(std::time::Duration::from_secs(10)))
        .unwrap();
    env.reconfigure(json!({"logSyslog": true, "syslogSocket": sock_path}));
    let dir = env.mkdir("kubelet/pods/u/volumes/flexvol~nfs/data");
    let base = json!({"server": "10.0.0.5", "share": "/exports/data"});
    let with = |k: &str, v: &str| {
        let mut j = base.clone();
        j[k] = json!(v);
        j.to_string()
    };
    // Credential-like keys (by the broad, case-insensitive rule) and list items: never shown.
    let credentials = [
        with("password", "Cred1pwL"),
        with("PassWord", "Cred2pwL"),
        with("apiToken", "Cred3pwL"),
        with("sshPrivateKey", "Cred4pwL"),
        with("credentials", "Cred5pwL"),
        with("mountOptions", "ro,password=Cred6pwL"),
    ];
    // An unknown key: its value is shown nowhere (its name may be a credential we do not know).
    let unknown = with("note", "Unknown7");
    // A known, harmless key: shown, so the user can fix it.
    let harmless = with("server", "Harmless8;");
    let mut replies = String::new();
    for j in credentials.iter().chain([&unknown, &harmless]) {
        let r = env.call("nfs", &["mount", dir.to_str().unwrap(), j]);
        assert_eq!(r.status(), "Failure", "{j}");
        replies.push_str(r.message());
        replies.push('\n');
    }
    let mut syslog = String::new();
    let mut buf = vec![0u8; 65536];
    for _ in 0..credentials.len() + 2 {
        let n = sock.recv(&mut buf).expect("a syslog datagram per call");
        syslog.push_str(&String::from_utf8_lossy(&buf[..n]));
    }
    let log = std::fs::read_to_string(&env.log).unwrap();
    for i in 1..=6 {
        let v = format!("Cred{i}pwL");
        assert!(!replies.contains(&v), "{v} in a reply: {replies}");
        assert!(!log.contains(&v), "{v} in the log: {log}");
        assert!(!syslog.contains(&v), "{v} in syslog: {syslog}");
    }
    assert!(!replies.contains("Unknown7"), "{replies}");
    assert!(
        !log.contains("Unknown7") && !syslog.contains("Unknown7"),
        "{log}"
    );
    assert!(replies.contains("Harmless8;"), "{replies}");
    assert!(replies.contains("password=<redacted>"), "{replies}");
    assert!(log.contains("<redacted>") && syslog.contains("<redacted>"));
}

/// Item 10. Old code accepted verbTimeoutSeconds 9.3e18, then every verb panicked computing
/// its deadline, `init` included (which unloads the driver).
#[test]
fn contract_out_of_range_numbers_are_refused_and_init_still_works() {
    for (key, value) in [
        ("verbTimeoutSeconds", json!(9_300_000_000_000_000_000u64)),
        ("commandTimeoutSeconds", json!(u64::MAX)),
        ("lockTimeoutSeconds", json!(10_000_000)),
    ] {
        let env = Env::with_config(json!({ key: value }));
        env.call("hostpath", &["init"]).ok();
        env.call("nfs", &["init"]).ok();
        let pod = env.pod_dir("u", "v");
        let r = mount(&env, &pod, &opts(&env.root().join("x"), json!({})));
        r.failed(key).failed("between");
        assert!(!r.message().contains("internal error"), "{}", r.message());
    }
    let env = Env::with_config(json!({"nfs": {"probeTimeoutSeconds": u64::MAX}}));
    env.call("nfs", &["init"]).ok();
    env.call("nfs", &["unmount", "/nonexistent"])
        .failed("nfs.probeTimeoutSeconds");
}

/// Item 11. Old code trusted a world-writable config, one in a world-writable directory, and
/// relative toolDirs.
#[test]
fn contract_untrusted_config_is_refused_and_doctor_flags_it() {
    let env = Env::new();
    let pod = env.pod_dir("u", "v");
    let j = opts(&env.root().join("x"), json!({}));
    std::fs::set_permissions(&env.config, std::fs::Permissions::from_mode(0o666)).unwrap();
    env.call("hostpath", &["init"]).ok();
    mount(&env, &pod, &j)
        .failed("is not trusted")
        .failed("writable by group or others (mode 0666)")
        .failed("chmod go-w");
    std::fs::set_permissions(&env.config, std::fs::Permissions::from_mode(0o664)).unwrap();
    mount(&env, &pod, &j).failed("is not trusted");
    let doctor = doctor_checks(&env);
    assert!(
        doctor
            .iter()
            .any(|c| c["status"] == "fail"
                && c["detail"].as_str().unwrap().contains("is not trusted")),
        "{doctor:?}"
    );
    std::fs::set_permissions(&env.config, std::fs::Permissions::from_mode(0o644)).unwrap();
    mount(&env, &pod, &j).failed("does not exist");

    // The same file in a directory anyone can write to (no sticky bit): refused.
    let open_dir = env.mkdir("open");
    std::fs::set_permissions(&open_dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    let moved = open_dir.join("config.json");
    std::fs::copy(&env.config, &moved).unwrap();
    std::fs::set_permissions(&moved, std::fs::Permissions::from_mode(0o644)).unwrap();
    let call = |cfg: &Path, args: &[&str]| {
        let out = env
            .command("hostpath", args)
            .env("FLEXVOL_CONFIG", cfg)
            .output()
            .unwrap();
        check_protocol(&out.stdout, &out.stderr, out.status.code())
    };
    call(&moved, &["mount", pod.to_str().unwrap(), &j])
        .failed("writable by group or others without the sticky bit");
    call(&moved, &["init"]).ok();
    // Named through a symlink from a safe directory: judged where it really is.
    let link = env.root().join("config-link.json");
    std::os::unix::fs::symlink(&moved, &link).unwrap();
    call(&link, &["mount", pod.to_str().unwrap(), &j])
        .failed("writable by group or others without the sticky bit");
    // Named through a symlinked directory: the same.
    let dir_link = env.root().join("dir-link");
    std::os::unix::fs::symlink(&open_dir, &dir_link).unwrap();
    call(
        &dir_link.join("config.json"),
        &["mount", pod.to_str().unwrap(), &j],
    )
    .failed("writable by group or others without the sticky bit");
    // A relative name with `..` through the symlink: the same.
    let relative = Path::new("dir-link/../dir-link/config.json");
    let out = env
        .command("hostpath", &["mount", pod.to_str().unwrap(), &j])
        .env("FLEXVOL_CONFIG", relative)
        .current_dir(env.root())
        .output()
        .unwrap();
    check_protocol(&out.stdout, &out.stderr, out.status.code())
        .failed("writable by group or others without the sticky bit");
    // With the sticky bit (like /tmp) it is fine.
    std::fs::set_permissions(&open_dir, std::fs::Permissions::from_mode(0o1777)).unwrap();
    call(&moved, &["mount", pod.to_str().unwrap(), &j]).failed("does not exist");

    // Relative toolDirs.
    env.reconfigure(json!({"toolDirs": ["sbin", "/usr/sbin"]}));
    mount(&env, &pod, &j).failed("toolDirs entries must be absolute");
}

/// Item 11. Old code trusted a config owned by any user.
#[test]
fn root_config_owned_by_another_user_is_refused() {
    require_root!();
    let env = Env::new();
    let pod = env.pod_dir("u", "v");
    let j = opts(&env.root().join("x"), json!({}));
    nix::unistd::chown(&env.config, Some(nix::unistd::Uid::from_raw(4242)), None).unwrap();
    mount(&env, &pod, &j)
        .failed("owned by uid 4242, not root")
        .failed("chown root:root");
    env.call("hostpath", &["init"]).ok();
    nix::unistd::chown(&env.config, Some(nix::unistd::Uid::from_raw(0)), None).unwrap();
    mount(&env, &pod, &j).failed("does not exist");
}

/// `doctor` warns about roots that hand out system locations (old code: no such check).
#[test]
fn contract_doctor_warns_about_roots_that_hand_out_system_paths() {
    let env = Env::new();
    env.reconfigure(json!({"hostpath": {"allowedRoots": ["/etc", "/var", env.root()]}}));
    let checks = doctor_checks(&env);
    for root in ["/etc", "/var"] {
        let c = checks
            .iter()
            .find(|c| c["check"] == format!("hostpath root {root}"))
            .unwrap_or_else(|| panic!("no warning for {root}: {checks:?}"));
        assert_eq!(c["status"], "warn");
        assert!(c["detail"].as_str().unwrap().contains("hands out"));
    }
    assert!(
        !checks
            .iter()
            .any(|c| c["check"] == format!("hostpath root {}", env.root().display())),
        "a data directory is not flagged"
    );
    env.reconfigure(json!({"hostpath": {}}));
    let checks = doctor_checks(&env);
    let c = checks
        .iter()
        .find(|c| c["check"] == "hostpath roots")
        .unwrap();
    assert_eq!(c["status"], "ok");
    assert!(
        c["detail"].as_str().unwrap().contains("/srv/flexvol"),
        "{c}"
    );
}

/// A missing serving root is created as the node's own (root, 0755), never with the pod's
/// `uid`/`gid`/`mode`: otherwise the first pod could make a shared root 0777 or its own.
/// Old code: the root got the pod's uid and mode like every directory it created.
#[test]
fn root_a_missing_root_is_created_as_the_nodes_own_not_the_pods() {
    require_root!();
    use std::os::unix::fs::MetadataExt;
    let scratch = tempfile::tempdir().unwrap();
    let base = std::fs::canonicalize(scratch.path()).unwrap();
    let root = base.join("shared-root");
    let env = Env::with_config(json!({"hostpath": {"allowedRoots": [root]}}));
    let pod = env.pod_dir("u", "v");
    let vol = root.join("team").join("vol");
    mount(
        &env,
        &pod,
        &opts(
            &vol,
            json!({"type": "DirectoryOrCreate", "uid": "4321", "gid": "4321", "mode": "0777"}),
        ),
    )
    .ok();
    let r = std::fs::metadata(&root).unwrap();
    assert_eq!((r.uid(), r.gid(), r.mode() & 0o7777), (0, 0, 0o755));
    for d in [root.join("team"), vol.clone()] {
        let m = std::fs::metadata(&d).unwrap();
        assert_eq!(
            (m.uid(), m.gid(), m.mode() & 0o7777),
            (4321, 4321, 0o777),
            "{}",
            d.display()
        );
    }
    env.call("hostpath", &["unmount", pod.to_str().unwrap()])
        .ok();
    assert!(env.mounts().is_empty());
}

// Issue #20, holes 1 and 2 (hostPath): provisioning roots are not allowed roots, and a volume
// directory inside one is served only to the PV the provisioner made it for.

/// An env whose allowed root `<tmp>/data` holds the provisioning root `<tmp>/data/lpp`, with one
/// provisioned-looking volume directory (and its marker) in it: (env, root, volume directory).
pub(crate) fn provisioning_env() -> (Env, PathBuf, PathBuf) {
    let env = Env::new();
    let data = env.mkdir("data");
    let root = data.join("lpp");
    let vol = root.join("pvc-v_team-b_db");
    std::fs::create_dir_all(&vol).unwrap();
    std::fs::write(vol.join(".flexvol-provisioned"), b"{}").unwrap();
    std::fs::write(vol.join("secret"), b"team-b's data").unwrap();
    env.reconfigure(json!({
        "hostpath": {"allowedRoots": [data]},
        "nodePathMap": [{"node": "DEFAULT_PATH_FOR_NON_LISTED_NODES", "paths": [root]}],
    }));
    (env, root, vol)
}

/// The options kubelet sends for a PV (or an inline volume) named `pv` in `namespace`.
fn pv_opts(path: &Path, pv: &str, namespace: &str, extra: Value) -> String {
    let mut j: Value = serde_json::from_str(&opts(path, extra)).unwrap();
    j["kubernetes.io/pvOrVolumeName"] = pv.into();
    j["kubernetes.io/pod.namespace"] = namespace.into();
    j.to_string()
}

/// Hole 1. Old code: every `nodePathMap` root was an allowed root, so an inline volume could
/// mount the root (every claim's data), its parent, a claim's directory, a marker file, and
/// create tombstones in the root.
#[test]
fn root_inline_volumes_cannot_reach_provisioning_roots() {
    require_root!();
    let (env, root, vol) = provisioning_env();
    let pod = env.pod_dir("u", "v");
    let dir = json!({"type": "Directory"});
    for (path, extra) in [
        (root.clone(), json!({})),
        (root.clone(), dir.clone()),
        // Above the root: its parent, an allowed root.
        (root.parent().unwrap().to_owned(), json!({})),
        // Another claim's directory, with the claim's own PV name (an inline volume may be
        // named `pvc-...`): no token, no grant.
        (vol.clone(), dir.clone()),
        (vol.join(".flexvol-provisioned"), json!({"type": "File"})),
        (vol.join("secret"), json!({})),
    ] {
        mount(&env, &pod, &pv_opts(&path, "pvc-v", "team-b", extra))
            .failed("PersistentVolumeClaim");
        assert!(env.mounts().is_empty(), "{}", path.display());
    }
    // Nothing is created inside a root: no tombstone, no squatted claim directory.
    for name in [".flexvol-deleting-pvc-v", "team-b"] {
        let p = root.join(name);
        mount(
            &env,
            &pod,
            &pv_opts(&p, "pvc-v", "team-b", json!({"type": "DirectoryOrCreate"})),
        )
        .failed("PersistentVolumeClaim");
        assert!(!p.exists(), "{} was created", p.display());
    }
    mount(
        &env,
        &pod,
        &pv_opts(
            &root,
            "pvc-v",
            "team-b",
            json!({"type": "DirectoryOrCreate", "pathPattern": "{namespace}"}),
        ),
    )
    .failed("PersistentVolumeClaim");
    assert!(!root.join("team-b").exists());
    assert!(env.mounts().is_empty());
}

/// Hole 2. Old code: any inline volume naming the directory was served; now only the PV with the
/// token the provisioner signed for exactly that PV and path.
#[test]
fn root_a_provisioned_directory_is_served_only_with_its_pvs_token() {
    use flexvol::node::capability::{Key, Location, node_key_path};
    require_root!();
    let (env, root, vol) = provisioning_env();
    let key = Key::load_or_create(&node_key_path(&env.state)).unwrap();
    let path = vol.to_str().unwrap();
    let token = key.sign_for("pvc-v", "team-b", &Location::HostPath(path));
    let pod = env.pod_dir("u", "v");
    // Its PV: mounted.
    let good = json!({"type": "Directory", "capabilityToken": token});
    mount(&env, &pod, &pv_opts(&vol, "pvc-v", "team-b", good.clone())).ok();
    assert_eq!(std::fs::read(pod.join("secret")).unwrap(), b"team-b's data");
    env.call("hostpath", &["unmount", pod.to_str().unwrap()])
        .ok();
    // The token never reaches the log.
    let log = std::fs::read_to_string(&env.log).unwrap();
    assert!(!log.contains(&token[3..]), "the token was logged");
    // A token of another PV or another path; the right token under another PV name; the right
    // token with another type, or for a path below the volume.
    let other = env.mkdir("data/lpp/pvc-w_team-a_mine");
    let theirs = key.sign("pvc-w", &Location::HostPath(other.to_str().unwrap()));
    let cases = [
        (
            vol.clone(),
            "pvc-w",
            json!({"type": "Directory", "capabilityToken": theirs}),
        ),
        (
            vol.clone(),
            "pvc-v",
            json!({"type": "Directory", "capabilityToken": theirs}),
        ),
        (vol.clone(), "pvc-w", good.clone()),
        (
            vol.clone(),
            "pvc-v",
            json!({"type": "", "capabilityToken": token}),
        ),
        (
            vol.join("sub"),
            "pvc-v",
            json!({"type": "DirectoryOrCreate", "capabilityToken": token}),
        ),
        (root.clone(), "pvc-v", good.clone()),
    ];
    for (p, pv, extra) in cases {
        let r = mount(&env, &pod, &pv_opts(&p, pv, "team-a", extra));
        r.failed("PersistentVolumeClaim");
        assert!(!r.message().contains(&token[3..]) && !r.message().contains(&theirs[3..]));
        assert!(env.mounts().is_empty(), "{}", p.display());
    }
    assert!(!vol.join("sub").exists());
    // Through a symlink, even with a token signed for that name.
    let link = root.parent().unwrap().join("link");
    std::os::unix::fs::symlink(&vol, &link).unwrap();
    for t in [
        token.clone(),
        key.sign_for(
            "pvc-v",
            "team-b",
            &Location::HostPath(link.to_str().unwrap()),
        ),
    ] {
        mount(
            &env,
            &pod,
            &pv_opts(
                &link,
                "pvc-v",
                "team-b",
                json!({"type": "Directory", "capabilityToken": t}),
            ),
        )
        .failed("PersistentVolumeClaim");
    }
    assert!(env.mounts().is_empty());
}

/// Legacy PVs (made before tokens) are served through the grant the provisioner writes: to that
/// PV name in its claim's namespace only.
#[test]
fn root_a_legacy_grant_serves_its_pv_in_its_namespace_only() {
    use flexvol::node::capability::{LegacyGrant, Location, write_legacy_grant};
    require_root!();
    let (env, _root, vol) = provisioning_env();
    let grant = LegacyGrant {
        pv: "pvc-v".into(),
        namespace: "team-b".into(),
    };
    write_legacy_grant(
        &env.state,
        &Location::HostPath(vol.to_str().unwrap()),
        &grant,
    )
    .unwrap();
    let pod = env.pod_dir("u", "v");
    let dir = json!({"type": "Directory"});
    for (pv, ns) in [("pvc-v", "team-a"), ("data", "team-b"), ("pvc-w", "team-b")] {
        mount(&env, &pod, &pv_opts(&vol, pv, ns, dir.clone())).failed("PersistentVolumeClaim");
        assert!(env.mounts().is_empty());
    }
    mount(&env, &pod, &pv_opts(&vol, "pvc-v", "team-b", dir)).ok();
    assert_eq!(std::fs::read(pod.join("secret")).unwrap(), b"team-b's data");
    env.call("hostpath", &["unmount", pod.to_str().unwrap()])
        .ok();
    assert!(env.mounts().is_empty());
}

/// Issue #32, 4: a PV's token copied into an inline volume of another namespace — named after
/// the PV (kubelet passes the pod's own volume name as `kubernetes.io/pvOrVolumeName`), with the
/// PV's path — opens nothing, through the real binary: a token this version signs names its
/// claim's namespace; an older one is served only to the namespace the provisioner's root-only
/// grant records (and to none before the grant exists).
#[test]
fn root_a_copied_token_opens_nothing_in_another_namespace() {
    use flexvol::node::capability::{
        Key, LegacyGrant, Location, node_key_path, write_legacy_grant,
    };
    require_root!();
    let (env, _root, vol) = provisioning_env();
    let key = Key::load_or_create(&node_key_path(&env.state)).unwrap();
    let loc = Location::HostPath(vol.to_str().unwrap());
    let v2 = key.sign_for("pvc-v", "team-b", &loc);
    let v1 = key.sign("pvc-v", &loc);
    let pod = env.pod_dir("u", "v");
    let with = |t: &str| json!({"type": "Directory", "capabilityToken": t});
    // Another namespace, either token; the old token before its grant, in any namespace.
    for (t, ns) in [(&v2, "team-a"), (&v1, "team-a"), (&v1, "team-b")] {
        let r = mount(&env, &pod, &pv_opts(&vol, "pvc-v", ns, with(t)));
        r.failed("");
        assert!(
            !r.message().contains(&t[10..]),
            "the token is never echoed: {}",
            r.message()
        );
        assert!(env.mounts().is_empty(), "{ns}");
    }
    // Its own namespace: mounted.
    mount(&env, &pod, &pv_opts(&vol, "pvc-v", "team-b", with(&v2))).ok();
    assert_eq!(std::fs::read(pod.join("secret")).unwrap(), b"team-b's data");
    env.call("hostpath", &["unmount", pod.to_str().unwrap()])
        .ok();
    // The old token once the provisioner recorded its claim's namespace: that namespace only.
    write_legacy_grant(
        &env.state,
        &loc,
        &LegacyGrant {
            pv: "pvc-v".into(),
            namespace: "team-b".into(),
        },
    )
    .unwrap();
    mount(&env, &pod, &pv_opts(&vol, "pvc-v", "team-a", with(&v1))).failed("PersistentVolumeClaim");
    assert!(env.mounts().is_empty());
    mount(&env, &pod, &pv_opts(&vol, "pvc-v", "team-b", with(&v1))).ok();
    env.call("hostpath", &["unmount", pod.to_str().unwrap()])
        .ok();
    assert!(env.mounts().is_empty());
}

/// fsGroup (issue #24): a provisioned volume (its PV's token) gets the pod's group the way kubelet
/// gives it to an emptyDir — group, group-write, set-gid directories — and only once (the next
/// mount finds the root matching and walks nothing); a static hostPath, a forged token and a
/// read-only mount keep their ownership, and a symlink in the volume never carries the chown out.
#[test]
fn root_fs_group_is_applied_to_provisioned_volumes_only() {
    use flexvol::node::capability::{Key, Location, node_key_path};
    use std::os::unix::fs::MetadataExt;
    require_root!();
    let (env, root, vol) = provisioning_env();
    let gid_mode = |p: &Path| {
        let m = std::fs::symlink_metadata(p).unwrap();
        (m.gid(), m.mode() & 0o7777)
    };
    let with_group = |j: String, gid: &str| {
        let mut v: Value = serde_json::from_str(&j).unwrap();
        v["kubernetes.io/mounterArgs.FsGroup"] = gid.into();
        v.to_string()
    };
    let host = env.mkdir("host-only");
    std::fs::write(host.join("shadow"), b"x").unwrap();
    std::fs::set_permissions(host.join("shadow"), std::fs::Permissions::from_mode(0o600)).unwrap();
    std::fs::create_dir_all(vol.join("sub/deeper")).unwrap();
    std::fs::write(vol.join("sub/deeper/f"), b"x").unwrap();
    std::os::unix::fs::symlink(host.join("shadow"), vol.join("sub/link")).unwrap();
    std::os::unix::fs::symlink(&host, vol.join("dirlink")).unwrap();
    let key = Key::load_or_create(&node_key_path(&env.state)).unwrap();
    let token = key.sign_for(
        "pvc-v",
        "team-b",
        &Location::HostPath(vol.to_str().unwrap()),
    );
    let good = json!({"type": "Directory", "capabilityToken": token});

    // Read-only: untouched, as kubelet does.
    let pod = env.pod_dir("ro", "v");
    let mut ro: Value =
        serde_json::from_str(&pv_opts(&vol, "pvc-v", "team-b", good.clone())).unwrap();
    ro["kubernetes.io/readwrite"] = "ro".into();
    mount(&env, &pod, &with_group(ro.to_string(), "2345")).ok();
    assert_eq!(gid_mode(&vol).0, 0);
    env.call("hostpath", &["unmount", pod.to_str().unwrap()])
        .ok();

    // A forged token with an fsGroup: refused, nothing changed.
    let forged = json!({"type": "Directory", "capabilityToken": key.sign("pvc-x", &Location::HostPath(vol.to_str().unwrap()))});
    let pod = env.pod_dir("forged", "v");
    mount(
        &env,
        &pod,
        &with_group(pv_opts(&vol, "pvc-v", "team-b", forged), "2345"),
    )
    .failed("PersistentVolumeClaim");
    assert_eq!(gid_mode(&vol).0, 0);

    // The PV: applied, through the pod's view too.
    let pod = env.pod_dir("u1", "v");
    let r = mount(
        &env,
        &pod,
        &with_group(pv_opts(&vol, "pvc-v", "team-b", good.clone()), "2345"),
    );
    r.ok();
    assert!(
        r.message().contains("fsGroup 2345 applied"),
        "{}",
        r.message()
    );
    for d in [&vol, &vol.join("sub"), &vol.join("sub/deeper"), &pod] {
        let (g, m) = gid_mode(d);
        assert_eq!(g, 2345, "{}", d.display());
        assert_eq!(m & 0o2770, 0o2770, "{}: {m:o}", d.display());
    }
    assert_eq!(gid_mode(&vol.join("sub/deeper/f")), (2345, 0o664));
    assert_eq!(gid_mode(&vol.join("secret")).0, 2345);
    // Nothing outside through the symlinks; the symlinks themselves untouched.
    assert_eq!(gid_mode(&host.join("shadow")), (0, 0o600));
    assert_eq!(gid_mode(&host).0, 0);
    assert_eq!(gid_mode(&vol.join("sub/link")).0, 0);
    // OnRootMismatch: a second pod's mount walks nothing (a file the pod re-grouped stays so).
    std::fs::write(vol.join("later"), b"x").unwrap();
    nix::unistd::chown(
        &vol.join("later"),
        None,
        Some(nix::unistd::Gid::from_raw(0)),
    )
    .unwrap();
    let pod2 = env.pod_dir("u2", "v");
    let r = mount(
        &env,
        &pod2,
        &with_group(pv_opts(&vol, "pvc-v", "team-b", good.clone()), "2345"),
    );
    r.ok();
    assert_eq!(r.message(), "", "no walk the second time");
    assert_eq!(gid_mode(&vol.join("later")).0, 0);
    // Another fsGroup on the same volume: the root mismatches, so it is walked again.
    let pod3 = env.pod_dir("u3", "v");
    mount(
        &env,
        &pod3,
        &with_group(pv_opts(&vol, "pvc-v", "team-b", good), "3456"),
    )
    .ok();
    assert_eq!(gid_mode(&vol.join("later")).0, 3456);
    for p in [&pod, &pod2, &pod3] {
        env.call("hostpath", &["unmount", p.to_str().unwrap()]).ok();
    }

    // A static hostPath in an allowed root, with an fsGroup: mounted, ownership left alone.
    let stat = env.mkdir("data/static");
    std::fs::write(stat.join("f"), b"x").unwrap();
    let pod = env.pod_dir("s", "v");
    let r = mount(
        &env,
        &pod,
        &with_group(
            pv_opts(&stat, "static-pv", "team-b", json!({"type": "Directory"})),
            "2345",
        ),
    );
    r.ok();
    assert_eq!(r.message(), "");
    assert_eq!(gid_mode(&stat).0, 0);
    assert_eq!(gid_mode(&stat.join("f")).0, 0);
    env.call("hostpath", &["unmount", pod.to_str().unwrap()])
        .ok();
    // An fsGroup that is not a group id, on a provisioned volume: refused, nothing mounted.
    let pod = env.pod_dir("bad", "v");
    let good = json!({"type": "Directory", "capabilityToken": key.sign_for("pvc-v", "team-b", &Location::HostPath(vol.to_str().unwrap()))});
    mount(
        &env,
        &pod,
        &with_group(pv_opts(&vol, "pvc-v", "team-b", good), "-1"),
    )
    .failed("FsGroup");
    assert!(env.mounts().is_empty());
    assert!(root.join("pvc-v_team-b_db").is_dir());
}
