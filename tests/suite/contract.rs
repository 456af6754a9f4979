//! Contract tier: every verb of every driver name through the real binary, as kubelet calls it.
//! Needs no privileges: nothing here reaches a mount syscall.

use crate::util::{Env, check_protocol};
use serde_json::json;
use std::time::{Duration, Instant};

const DRIVERS: [&str; 3] = ["hostpath", "nfs", "lvm"];
const J: &str = r#"{"kubernetes.io/fsType":"","kubernetes.io/pvOrVolumeName":"v","kubernetes.io/readwrite":"rw"}"#;

/// Every verb with exactly the arguments kubelet sends (sizes as digits).
fn kubelet_calls(dir: &str) -> Vec<Vec<String>> {
    let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    vec![
        s(&["init"]),
        s(&["getvolumename", J]),
        s(&["attach", J, "node-1"]),
        s(&["isattached", J, "node-1"]),
        s(&["detach", "v", "node-1"]),
        s(&["waitforattach", "/dev/vg0/v", J]),
        s(&["mountdevice", dir, "/dev/vg0/v", J]),
        s(&["unmountdevice", dir]),
        s(&["mount", dir, J]),
        s(&["unmount", dir]),
        s(&["expandvolume", J, dir, "2147483648", "1073741824"]),
        s(&["expandfs", J, "/dev/vg0/v", dir, "2147483648", "1073741824"]),
    ]
}

#[test]
fn contract_init_reports_all_capabilities_per_driver() {
    let env = Env::new();
    let caps = |a: bool, s: bool, f: bool, r: bool| json!({"status":"Success","capabilities":{"attach":a,"selinuxRelabel":s,"supportsMetrics":true,"fsGroup":f,"requiresFSResize":r}});
    assert_eq!(
        env.call("hostpath", &["init"]).json,
        caps(false, false, false, false)
    );
    assert_eq!(
        env.call("nfs", &["init"]).json,
        caps(false, false, false, false)
    );
    assert_eq!(
        env.call("lvm", &["init"]).json,
        caps(true, true, true, true)
    );
}

#[test]
fn contract_every_verb_every_arity_answers_one_json_object() {
    let env = Env::new();
    // A directory that does not exist: hostpath mount fails cleanly, unmount succeeds.
    let dir = env.root().join("no-such-pod-dir");
    let dir = dir.to_str().unwrap();
    for driver in DRIVERS {
        for call in kubelet_calls(dir) {
            let args: Vec<&str> = call.iter().map(String::as_str).collect();
            // Exact arity, one extra trailing argument, and every shorter prefix.
            env.call(driver, &args);
            let mut extra = args.clone();
            extra.push("unexpected-extra");
            let a = env.call(driver, &args);
            let b = env.call(driver, &extra);
            assert_eq!(
                a.status(),
                b.status(),
                "{driver} {args:?}: extra trailing args must be tolerated"
            );
            for n in 1..args.len() {
                let r = env.call(driver, &args[..n]);
                r.failed("needs");
            }
        }
    }
}

#[test]
fn contract_unknown_verbs_and_getvolumename_are_not_supported() {
    let env = Env::new();
    for driver in DRIVERS {
        env.call(driver, &["getvolumename", J]).not_supported();
        env.call(driver, &["waitfordetach", "/dev/x"])
            .not_supported();
        env.call(driver, &["no-such-verb"]).not_supported();
        env.call(driver, &[""]).not_supported();
        env.call(driver, &[]).failed("no verb given");
    }
}

#[test]
fn contract_hostpath_attach_side_verbs_are_consistently_not_supported() {
    let env = Env::new();
    let dir = env.root().join("d");
    for call in kubelet_calls(dir.to_str().unwrap()) {
        let v = call[0].as_str();
        if matches!(v, "init" | "mount" | "unmount") {
            continue;
        }
        let args: Vec<&str> = call.iter().map(String::as_str).collect();
        env.call("hostpath", &args).not_supported();
    }
}

/// An NFS mount payload as kubelet sends it (docs/protocol.md §12.3), with `extra` merged in.
fn nfs_json(extra: serde_json::Value) -> String {
    crate::util::mount_options(
        json!({
            "kubernetes.io/fsType": "nfs",
            "kubernetes.io/pod.name": "nginx-nfs",
            "kubernetes.io/pod.namespace": "default",
            "kubernetes.io/pod.uid": "0b6a9c52-8a7e-4f3e-b4a1-5d2f6c7e8f90",
            "kubernetes.io/pvOrVolumeName": "data",
            "kubernetes.io/secret/password": "czNjcjN0",
            "server": "127.0.0.1",
            "share": "/srv/nfs",
        }),
        extra,
    )
}

fn nfs_records(env: &Env) -> usize {
    std::fs::read_dir(env.state.join("nfs")).map_or(0, |d| d.count())
}

#[test]
fn contract_nfs_injection_attempts_fail_with_nothing_run_or_mounted() {
    // An empty tool dir: if validation let anything through, the reply would name a missing tool.
    let env = Env::new();
    env.reconfigure(json!({"toolDirs": [env.mkdir("no-tools")]}));
    let dir = env.mkdir("kubelet/pods/u/volumes/flexvol~nfs/data");
    let dir = dir.to_str().unwrap();
    for (extra, needle) in [
        (json!({"share": "/x,suid"}), "\"share\""),
        (json!({"server": "-oremount"}), "\"server\""),
        (json!({"server": "127.0.0.1 -o suid"}), "\"server\""),
        (json!({"server": "fd00::1"}), "in brackets"),
        (json!({"server": "[fd00::1]x"}), "\"server\""),
        (json!({"share": "srv/nfs"}), "absolute"),
        (json!({"share": "/srv/../etc"}), "\"..\""),
        (json!({"mountOptions": "rw,suid"}), "nfs.allowSuid"),
        (json!({"mountOptions": "sec=sys\nx"}), "control characters"),
        (json!({"mountOptions": "remount"}), "not allowed"),
        (json!({"mountOptions": "vers=3"}), "\"version\" option"),
        (json!({"mountOptions": "hard,,soft"}), "empty item"),
        (json!({"version": "4,suid"}), "\"version\""),
        (json!({"kubernetes.io/readwrite": "RO"}), "readwrite"),
        (json!({"readonly": "true"}), "unknown NFS option"),
        (json!({"server": ""}), "\"server\" is required"),
    ] {
        env.call("nfs", &["mount", dir, &nfs_json(extra.clone())])
            .failed(needle);
    }
    assert!(env.mounts().is_empty());
    assert_eq!(nfs_records(&env), 0);
    let log = std::fs::read_to_string(&env.log).unwrap();
    assert!(!log.contains("czNjcjN0") && !log.contains("s3cr3t"));
}

#[test]
fn contract_nfs_unreachable_server_fails_within_the_probe_deadline() {
    // Nothing listens on 127.0.0.1:2049 on the test host (no NFS here): refused at once. A port
    // of our own, bound then closed, gives the same without relying on the host.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = closed.local_addr().unwrap().port().to_string();
    drop(closed);
    let env = Env::with_config(json!({"nfs": {"probeTimeoutSeconds": 2}}));
    let dir = env.mkdir("kubelet/pods/u/volumes/flexvol~nfs/data");
    let dir = dir.to_str().unwrap();
    let mut cases = vec![
        json!({"mountOptions": format!("port={port}")}),
        json!({"server": "localhost", "mountOptions": format!("port={port}")}),
    ];
    if std::net::TcpStream::connect("127.0.0.1:2049").is_err() {
        cases.push(json!({}));
    }
    for extra in cases {
        let t = Instant::now();
        let r = env.call("nfs", &["mount", dir, &nfs_json(extra.clone())]);
        let took = t.elapsed();
        r.failed("is unreachable").failed("Nothing was mounted");
        assert!(
            r.message().contains("nothing accepted a TCP connection"),
            "{extra}: {}",
            r.message()
        );
        assert!(took < Duration::from_secs(3), "{extra}: took {took:?}");
    }
    assert!(env.mounts().is_empty());
    assert_eq!(nfs_records(&env), 0);
}

#[test]
fn contract_nfs_missing_client_and_hung_mount_helper_fail_cleanly() {
    // A reachable "server" (a loopback listener we own) gets past the probe.
    let server = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = server.local_addr().unwrap().port();
    let j = nfs_json(json!({"mountOptions": format!("port={port}")}));
    let env = Env::new();
    let dir = env.mkdir("kubelet/pods/u/volumes/flexvol~nfs/data");
    let dir = dir.to_str().unwrap();

    env.reconfigure(json!({"toolDirs": [env.mkdir("no-tools")]}));
    env.call("nfs", &["mount", dir, &j])
        .failed("mount.nfs is not installed")
        .failed("nfs-common");
    assert_eq!(nfs_records(&env), 0);

    // A mount.nfs that never returns (a server that accepts TCP but not the mount): killed at
    // nfs.mountTimeoutSeconds, with a message that says where to look.
    let tools = env.mkdir("hang-tools");
    let shim = tools.join("mount.nfs");
    let pid_file = tools.join("pid");
    std::fs::write(
        &shim,
        format!(
            "#!/bin/sh\necho $$ > {}\nexec sleep 3600\n",
            pid_file.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&shim, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    env.reconfigure(json!({"toolDirs": [tools], "nfs": {"mountTimeoutSeconds": 1}}));
    let t = Instant::now();
    env.call("nfs", &["mount", dir, &j])
        .failed("did not finish within 1s")
        .failed("nothing is mounted");
    assert!(
        t.elapsed() < Duration::from_secs(5),
        "took {:?}",
        t.elapsed()
    );
    // The helper (this exact process) must not outlive the call: gone, or a zombie awaiting reaping.
    let pid = std::fs::read_to_string(&pid_file)
        .unwrap()
        .trim()
        .to_owned();
    let alive = || {
        std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
            s.rsplit_once(") ")
                .is_some_and(|(_, rest)| !rest.starts_with('Z'))
        })
    };
    let t = Instant::now();
    while alive() && t.elapsed() < Duration::from_secs(3) {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        !alive(),
        "the hung mount.nfs helper (pid {pid}) outlived the call"
    );
    assert_eq!(nfs_records(&env), 0);
    assert!(env.mounts().is_empty());
}

#[test]
fn contract_nfs_unmount_of_nothing_succeeds_twice() {
    let env = Env::new();
    let dir = env.mkdir("kubelet/pods/u/volumes/flexvol~nfs/data");
    let gone = env
        .root()
        .join("kubelet/pods/gone/volumes/flexvol~nfs/data");
    for d in [&dir, &gone] {
        env.call("nfs", &["unmount", d.to_str().unwrap()]).ok();
        env.call("nfs", &["unmount", d.to_str().unwrap()]).ok();
    }
    env.call("nfs", &["unmount", "relative/dir"])
        .failed("absolute path");
}

#[test]
fn contract_nfs_other_verbs_are_consistently_not_supported() {
    // kubelet caches "Not supported" per driver name: only verbs NFS never supports say so.
    let env = Env::new();
    let dir = env.root().join("d");
    for call in kubelet_calls(dir.to_str().unwrap()) {
        if matches!(call[0].as_str(), "init" | "mount" | "unmount") {
            continue;
        }
        let args: Vec<&str> = call.iter().map(String::as_str).collect();
        env.call("nfs", &args).not_supported();
    }
}

#[test]
fn contract_lvm_attach_is_pure_and_node_verbs_validate_first() {
    // This host has no device-mapper (often no lvm at all): attach must still answer, because it
    // runs in kube-controller-manager, which never sees the node's volume groups.
    let env = Env::with_config(json!({"toolDirs": ["/nonexistent-flexvol-tools"]}));
    let j = r#"{"kubernetes.io/fsType":"ext4","kubernetes.io/pvOrVolumeName":"pv-lvm-1","kubernetes.io/readwrite":"rw","size":"1Gi","volumeID":"lv1","volumegroup":"vg0"}"#;
    assert_eq!(
        env.call("lvm", &["attach", j, "node-1"]).json,
        json!({"status":"Success","device":"/dev/vg0/lv1"})
    );
    let derived = r#"{"kubernetes.io/pvOrVolumeName":"pv-lvm-2","volumegroup":"vg0"}"#;
    assert_eq!(
        env.call("lvm", &["attach", derived, "node-1"]).json["device"],
        "/dev/vg0/pv-lvm-2"
    );
    // isattached is consistently "Not supported" (cached by KCM); detach and expandvolume succeed.
    env.call("lvm", &["isattached", j, "node-1"])
        .not_supported();
    env.call("lvm", &["detach", "pv-lvm-1", "node-1"]).ok();
    let dir = env.root().join("d");
    let dir = dir.to_str().unwrap();
    env.call("lvm", &["expandvolume", j, dir, "2147483648", "1073741824"])
        .ok();
    // With the tools missing, a node verb reaches lvm and says what is missing.
    env.call("lvm", &["waitforattach", "/dev/vg0/lv1", j])
        .failed("lvm is not installed");
    // Unmounting what is not there is Success, with no tool needed.
    env.call("lvm", &["unmountdevice", dir]).ok();
    env.call("lvm", &["unmount", dir]).ok();
}

#[test]
fn contract_lvm_bad_names_and_sizes_fail_before_any_tool_runs() {
    // toolDirs points nowhere: a message about a missing tool would mean validation came too late.
    let env = Env::with_config(json!({"toolDirs": ["/nonexistent-flexvol-tools"]}));
    let dir = env.mkdir("kubelet/pods/u/volumes/flexvol~lvm/pv");
    let dir = dir.to_str().unwrap();
    let with = |k: &str, v: &str| {
        let mut m = json!({"kubernetes.io/fsType":"ext4","kubernetes.io/pvOrVolumeName":"pv","kubernetes.io/readwrite":"rw","size":"1Gi","volumeID":"lv1","volumegroup":"vg0"});
        m[k] = json!(v);
        m.to_string()
    };
    let mut bad = Vec::new();
    for v in ["", "-vg", "vg/0", "v g", "vg\n", ".", ".."] {
        bad.push((with("volumegroup", v), "volumegroup"));
    }
    for v in ["", "-lv", "a/b", "a b", ".", "..", "snapshot1"] {
        bad.push((with("volumeID", v), "volumeID"));
    }
    for v in [
        "0",
        "-1Gi",
        "lots",
        "1e9",
        "18446744073709551616",
        "99999999999Ei",
    ] {
        bad.push((with("size", v), "size"));
    }
    bad.push((with("mkfsOptions", "-F -m 0"), "mkfsOptions"));
    bad.push((with("mountOptions", "ro,noatime"), "mountOptions"));
    bad.push((with("kubernetes.io/fsType", "ext4 -F"), "fsType"));
    for (j, key) in &bad {
        for args in [
            vec!["attach", j.as_str(), "node-1"],
            vec!["waitforattach", "/dev/vg0/lv1", j.as_str()],
            vec!["mountdevice", dir, "/dev/vg0/lv1", j.as_str()],
            vec!["mount", dir, j.as_str()],
            vec![
                "expandfs",
                j.as_str(),
                "/dev/vg0/lv1",
                dir,
                "2147483648",
                "1073741824",
            ],
        ] {
            let r = env.call("lvm", &args);
            r.failed(key);
            assert!(
                !r.message().contains("not installed"),
                "{args:?}: {}",
                r.message()
            );
        }
    }
    assert!(env.mounts().is_empty());
}

#[test]
fn contract_malformed_options_fail_cleanly() {
    let env = Env::new();
    let dir = env.mkdir("pod");
    let dir = dir.to_str().unwrap();
    for bad in [
        "{bad",
        "",
        "[]",
        "42",
        "null",
        "\"str\"",
        r#"{"path":1}"#,
        r#"{"kubernetes.io/secret/x":"%%%"}"#,
    ] {
        let r = env.call("hostpath", &["mount", dir, bad]);
        r.failed("option");
    }
    assert!(env.mounts().is_empty());
}

#[test]
fn contract_empty_string_arguments_are_handled() {
    let env = Env::new();
    env.call("hostpath", &["mountdevice", "", "", J])
        .not_supported();
    env.call("hostpath", &["mount", "", r#"{"path":"/srv"}"#])
        .failed("mount directory");
    env.call("hostpath", &["unmount", ""])
        .failed("mount directory");
    env.call("hostpath", &["expandfs", J, "", "", "1", "0"])
        .not_supported();
    env.call("hostpath", &["expandfs", J, "", "", "", "0"])
        .failed("NEW_SIZE");
}

#[test]
fn contract_panic_still_prints_failure_json() {
    let env = Env::new();
    let dir = env.mkdir("pod");
    let r = env.call_env(
        "hostpath",
        &["mount", dir.to_str().unwrap(), J],
        &[("FLEXVOL_TEST_FAULT", "panic")],
    );
    r.failed("internal error");
    assert!(r.message().contains("injected test fault"));
}

#[test]
fn contract_verb_deadline_answers_failure_in_bounded_time() {
    let env = Env::with_config(json!({"verbTimeoutSeconds": 1}));
    let dir = env.mkdir("pod");
    let t = Instant::now();
    let r = env.call_env(
        "hostpath",
        &["mount", dir.to_str().unwrap(), J],
        &[("FLEXVOL_TEST_FAULT", "hang")],
    );
    r.failed("deadline of 1s");
    assert!(
        t.elapsed() < Duration::from_secs(5),
        "took {:?}",
        t.elapsed()
    );
    // The watchdog's reply reaches the call log like any other.
    let lines = env.log_lines();
    let last = lines.last().expect("the deadline reply was not logged");
    assert_eq!(last["verb"], "mount");
    assert_eq!(last["reply"]["status"], "Failure");
    assert!(
        last["reply"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("deadline of 1s")),
        "{last}"
    );
}

/// The pids of processes whose parent is `ppid` (from /proc/*/stat).
fn children_of(ppid: u32) -> Vec<i32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(Result::ok)
        .filter_map(|e| {
            let stat = std::fs::read_to_string(e.path().join("stat")).ok()?;
            // pid (comm) state ppid ...; comm may contain spaces, so split after the last ')'.
            let rest = &stat[stat.rfind(')')? + 2..];
            let parent: u32 = rest.split(' ').nth(1)?.parse().ok()?;
            (parent == ppid)
                .then(|| e.file_name().to_string_lossy().parse().ok())
                .flatten()
        })
        .collect()
}

/// Whether `pid` is gone (or a zombie, i.e. dead and only waiting to be reaped).
fn is_gone(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rfind(')')
            .is_some_and(|i| stat[i + 2..].starts_with('Z')),
    }
}

#[test]
fn contract_sigterm_kills_children_and_prints_failure_json() {
    let env = Env::new();
    let dir = env.mkdir("pod");
    let child = env
        .command("hostpath", &["mount", dir.to_str().unwrap(), J])
        .env("FLEXVOL_TEST_FAULT", "hang-child")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Wait until the driver's own helper (`sleep`) exists, then do what kubelet's timeout does.
    let t = Instant::now();
    let mut helpers = Vec::new();
    while helpers.is_empty() && t.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(20));
        helpers = children_of(child.id());
    }
    assert!(!helpers.is_empty(), "the injected helper never started");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(child.id()).unwrap()),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let out = child.wait_with_output().unwrap();
    let r = check_protocol(&out.stdout, &out.stderr, out.status.code());
    r.failed("SIGTERM");
    let t = Instant::now();
    while !helpers.iter().all(|&p| is_gone(p)) && t.elapsed() < Duration::from_secs(3) {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        helpers.iter().all(|&p| is_gone(p)),
        "the helper process outlived the driver"
    );
}

#[test]
fn contract_broken_config_fails_verbs_but_not_init() {
    let env = Env::new();
    std::fs::write(&env.config, br#"{"stateDir":"/x","unknownKey":1}"#).unwrap();
    env.call("hostpath", &["init"]).ok();
    let dir = env.mkdir("pod");
    env.call("hostpath", &["mount", dir.to_str().unwrap(), J])
        .failed("unknown field `unknownKey`");
    let missing = env.root().join("missing.json");
    let r = env
        .command("hostpath", &["unmount", dir.to_str().unwrap()])
        .env("FLEXVOL_CONFIG", &missing)
        .output()
        .unwrap();
    check_protocol(&r.stdout, &r.stderr, r.status.code()).failed("cannot read the flexvol config");
}

#[test]
fn contract_lock_wait_is_bounded() {
    let env = Env::with_config(json!({"lockTimeoutSeconds": 1}));
    let dir = env.pod_dir("u", "v");
    let key = format!("hostpath:{}", dir.display());
    let lock_path = env
        .run
        .join("locks")
        .join(format!("{}.lock", flexvol::node::state::file_key(&key)));
    std::fs::create_dir_all(lock_path.parent().unwrap()).unwrap();
    let f = std::fs::File::create(&lock_path).unwrap();
    f.lock().unwrap();
    let t = Instant::now();
    env.call("hostpath", &["unmount", dir.to_str().unwrap()])
        .failed("held the lock");
    assert!(t.elapsed() >= Duration::from_secs(1) && t.elapsed() < Duration::from_secs(4));
    drop(f);
    env.call("hostpath", &["unmount", dir.to_str().unwrap()])
        .ok();
}

#[test]
fn contract_one_log_record_per_call_with_secrets_redacted() {
    let env = Env::new();
    let dir = env.pod_dir("u", "v");
    let j = serde_json::json!({"path": env.root().join("nonexistent"), "kubernetes.io/secret/password": "czNjcjN0", "mountPassword": "hunter2"}).to_string();
    let j = j.as_str();
    env.call("hostpath", &["init"]).ok();
    // `mountPassword` is no hostPath option: refused by name (its value never shown), and logged
    // redacted like every value of a key that looks secret.
    env.call("hostpath", &["mount", dir.to_str().unwrap(), j])
        .failed("unknown hostPath option");
    let lines = env.log_lines();
    assert_eq!(lines.len(), 2);
    assert_eq!(lines[0]["verb"], "init");
    assert_eq!(lines[1]["verb"], "mount");
    assert_eq!(lines[1]["reply"]["status"], "Failure");
    assert!(lines[1]["pid"].as_u64().is_some() && lines[1]["durationMs"].as_f64().is_some());
    assert!(lines[1]["time"].as_str().unwrap().ends_with('Z'));
    let text = std::fs::read_to_string(&env.log).unwrap();
    for secret in ["czNjcjN0", "s3cr3t", "hunter2"] {
        assert!(
            !text.contains(secret),
            "secret {secret} leaked into the log"
        );
    }
}

#[test]
fn contract_logging_can_be_turned_off() {
    let env = Env::with_config(json!({"logFile": ""}));
    env.call("hostpath", &["init"]).ok();
    assert!(!env.log.exists());
}

#[test]
fn contract_unknown_install_name_answers_json() {
    let env = Env::new();
    let odd = env.plugins.join("flexvol~odd");
    std::fs::create_dir_all(&odd).unwrap();
    std::os::unix::fs::symlink(crate::util::binary(), odd.join("odd")).unwrap();
    let out = std::process::Command::new(odd.join("odd"))
        .arg("init")
        .output()
        .unwrap();
    check_protocol(&out.stdout, &out.stderr, out.status.code()).failed("not a driver name");
}

#[test]
fn contract_human_cli_help_and_version() {
    let bin = crate::util::binary();
    let out = std::process::Command::new(&bin)
        .arg("--help")
        .output()
        .unwrap();
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("flexvol hostpath mount"));
    let out = std::process::Command::new(&bin)
        .arg("--version")
        .output()
        .unwrap();
    // Version, commit and target: the same line the crate builds (src/version.rs), and in a git
    // checkout the commit is HEAD's (12 hex digits, maybe -dirty).
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        format!("{}\n", flexvol::version::line())
    );
    let commit = flexvol::version::COMMIT.trim_end_matches("-dirty");
    if std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join(".git")
        .exists()
    {
        assert!(
            commit.len() == 12 && commit.bytes().all(|b| b.is_ascii_hexdigit()),
            "commit {commit:?}"
        );
    }
    let out = std::process::Command::new(&bin)
        .args(["hostpath", "mount", "--help"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("Usage: flexvol [--pretty] hostpath mount MOUNT_DIR JSON")
            && text.contains("Example:"),
        "{text}"
    );
    let out = std::process::Command::new(&bin)
        .args(["--pretty", "lvm", "init"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("\n  \"status\": \"Success\""), "{text}");
}

#[test]
fn contract_binary_is_static() {
    let bin = crate::util::binary();
    let out = std::process::Command::new("file")
        .arg("-L")
        .arg(&bin)
        .output()
        .expect("`file` is installed");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("statically linked") || text.contains("static-pie linked"),
        "{text}"
    );
    let out = std::process::Command::new("ldd")
        .arg(&bin)
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(
        text.contains("statically linked") || text.contains("not a dynamic executable"),
        "{text}"
    );
}

/// A caller that stops reading (kubelet killed mid-call) must not kill the driver with SIGPIPE
/// before it has logged the call: the reply's write fails with EPIPE and the call ends as it
/// would have, with its exit code and its log record (`sys::process::start` blocks SIGPIPE).
#[test]
fn contract_a_closed_reply_pipe_does_not_kill_the_driver() {
    use std::os::unix::process::ExitStatusExt;
    let env = Env::new();
    for driver in DRIVERS {
        let (reader, writer) = std::io::pipe().unwrap();
        drop(reader);
        let status = env
            .command(driver, &["init"])
            .stdout(writer)
            .stderr(std::process::Stdio::null())
            .status()
            .unwrap();
        assert_eq!(
            (status.code(), status.signal()),
            (Some(0), None),
            "{driver}"
        );
        let last = env.log_lines().pop().unwrap();
        assert_eq!(
            (last["backend"].as_str(), last["verb"].as_str()),
            (Some(driver), Some("init")),
            "{last}"
        );
    }
}
