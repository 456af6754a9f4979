//! Operator commands through the real binary: `flexvol doctor`, `status`, `gc`, and the syslog
//! record. `root_ops_*` tests make real bind mounts with the real driver, then make kubelet
//! "forget" them the ways it does in the field.

use crate::require_root;
use crate::util::{Env, binary};
use serde_json::{Value, json};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// Output of a human command.
struct Out {
    code: i32,
    text: String,
}

impl Out {
    fn json(&self) -> Value {
        serde_json::from_str(&self.text).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.text))
    }
}

fn flexvol(env: &Env, args: &[&str]) -> Out {
    // status and gc look only below this env's kubelet root: other tests mount concurrently.
    let mut args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    if matches!(args.first().map(String::as_str), Some("status" | "gc")) {
        args.push("--kubelet-root".into());
        args.push(env.root().join("kubelet").to_string_lossy().into_owned());
    }
    let out = Command::new(binary())
        .args(&args)
        .env("FLEXVOL_CONFIG", &env.config)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(
        out.stderr.is_empty(),
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Out {
        code: out.status.code().unwrap(),
        text: String::from_utf8(out.stdout).unwrap(),
    }
}

/// A directory of stand-ins for every tool doctor looks for.
fn fake_tools(env: &Env) -> PathBuf {
    let d = env.mkdir("tools");
    for t in [
        "mount.nfs",
        "lvm",
        "blkid",
        "mkfs.ext4",
        "resize2fs",
        "mkfs.xfs",
        "xfs_growfs",
        "xfs_quota",
    ] {
        std::fs::write(d.join(t), "#!/bin/sh\nexit 0\n").unwrap();
        std::fs::set_permissions(d.join(t), std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    d
}

/// A /proc and /dev of a kernel with device-mapper, NFS and loop loaded.
fn healthy_sysroot(env: &Env) -> PathBuf {
    let s = env.mkdir("sysroot");
    std::fs::create_dir_all(s.join("proc")).unwrap();
    std::fs::create_dir_all(s.join("etc")).unwrap();
    std::fs::write(
        s.join("etc/os-release"),
        "NAME=\"Ubuntu\"\nID=ubuntu\nID_LIKE=debian\n",
    )
    .unwrap();
    std::fs::write(
        s.join("proc/devices"),
        "Character devices:\n  1 mem\n\nBlock devices:\n  7 loop\n254 device-mapper\n",
    )
    .unwrap();
    std::fs::write(
        s.join("proc/filesystems"),
        "nodev\tnfs\nnodev\tnfs4\n\text4\n",
    )
    .unwrap();
    s
}

/// Real copies (not the symlinks `Env` uses) in a fresh plugin dir, as `flexvol install` makes them.
fn real_install(env: &Env) -> PathBuf {
    let dir = env.root().join("real-plugins");
    let out = flexvol(env, &["install", "--plugin-dir", dir.to_str().unwrap()]);
    assert_eq!(out.code, 0, "{}", out.text);
    dir
}

fn doctor(env: &Env, plugins: &Path, sysroot: &Path) -> (i32, Vec<Value>) {
    let out = flexvol(
        env,
        &[
            "doctor",
            "--json",
            "--plugin-dir",
            plugins.to_str().unwrap(),
            "--sysroot",
            sysroot.to_str().unwrap(),
        ],
    );
    let j = out.json();
    let checks = j["checks"].as_array().unwrap().clone();
    let fails = checks.iter().filter(|c| c["status"] == "fail").count();
    assert_eq!(j["problems"], fails, "problems counts the failed checks");
    assert_eq!(
        out.code,
        i32::from(fails > 0),
        "exit status follows failures"
    );
    (out.code, checks)
}

fn find<'a>(checks: &'a [Value], name: &str) -> &'a Value {
    checks
        .iter()
        .find(|c| c["check"] == name)
        .unwrap_or_else(|| panic!("no check {name:?} in {checks:#?}"))
}

#[test]
fn contract_ops_doctor_passes_a_healthy_install() {
    let env = Env::new();
    env.reconfigure(json!({"toolDirs": [fake_tools(&env)]}));
    let plugins = real_install(&env);
    let (code, checks) = doctor(&env, &plugins, &healthy_sysroot(&env));
    let bad: Vec<_> = checks.iter().filter(|c| c["status"] != "ok").collect();
    assert_eq!(code, 0, "not healthy: {bad:#?}");
    assert!(bad.is_empty(), "{bad:#?}");
    for d in ["hostpath", "nfs", "lvm"] {
        assert_eq!(
            find(&checks, &format!("driver flexvol/{d}"))["status"],
            "ok"
        );
    }
    assert_eq!(find(&checks, "kernel device-mapper")["status"], "ok");
    // The human form says the same.
    let out = flexvol(
        &env,
        &[
            "doctor",
            "--plugin-dir",
            plugins.to_str().unwrap(),
            "--sysroot",
            healthy_sysroot(&env).to_str().unwrap(),
        ],
    );
    assert_eq!(out.code, 0);
    assert!(out.text.contains("0 problem(s)"), "{}", out.text);
}

#[test]
fn contract_ops_doctor_names_each_broken_driver_and_its_fix() {
    let env = Env::new();
    let tools = env.mkdir("no-tools");
    env.reconfigure(json!({"toolDirs": [tools]}));
    let plugins = real_install(&env);
    // A directory without its executable.
    std::fs::remove_file(plugins.join("flexvol~nfs/nfs")).unwrap();
    // An executable without the x bit.
    std::fs::set_permissions(
        plugins.join("flexvol~lvm/lvm"),
        std::fs::Permissions::from_mode(0o644),
    )
    .unwrap();
    // A stray file kubelet's watcher sees.
    std::fs::write(plugins.join("flexvol~hostpath/hostpath.bak"), "x").unwrap();
    // A driver whose init prints garbage (another install under another vendor).
    std::fs::create_dir_all(plugins.join("acme~hostpath")).unwrap();
    let g = plugins.join("acme~hostpath/hostpath");
    std::fs::write(&g, "#!/bin/sh\necho 'Usage: hostpath VERB'\n").unwrap();
    std::fs::set_permissions(&g, std::fs::Permissions::from_mode(0o755)).unwrap();
    // A dangling symlink.
    std::fs::create_dir_all(plugins.join("old~lvm")).unwrap();
    std::os::unix::fs::symlink("/nonexistent/flexvol", plugins.join("old~lvm/lvm")).unwrap();
    // Another vendor's driver that is not ours is left alone.
    std::fs::create_dir_all(plugins.join("other~cifs")).unwrap();

    let (code, checks) = doctor(&env, &plugins, &healthy_sysroot(&env));
    assert_eq!(code, 1);
    let fail = |name: &str, detail: &str, fix: &str| {
        let c = find(&checks, name);
        assert_eq!(c["status"], "fail", "{c}");
        assert!(c["detail"].as_str().unwrap().contains(detail), "{c}");
        assert!(c["fix"].as_str().unwrap().contains(fix), "{c}");
    };
    fail(
        "driver flexvol/nfs",
        "has no executable nfs",
        "flexvol install --plugin-dir",
    );
    fail("driver flexvol/lvm", "is not executable", "chmod 0755");
    fail("driver flexvol/hostpath stray file", "hostpath.bak", "mv ");
    fail(
        "driver acme/hostpath",
        "looking for beginning of value",
        "is not a working flexvol",
    );
    fail("driver old/lvm", "dangling symlink", "flexvol install");
    assert_eq!(find(&checks, "driver flexvol/hostpath")["status"], "ok");
    // No working nfs/lvm driver: their tools are only warnings; hostpath needs none.
    let t = find(&checks, "tool mount.nfs");
    assert_eq!(t["status"], "warn", "{t}");
    assert!(
        t["fix"]
            .as_str()
            .unwrap()
            .contains("apt-get install -y nfs-common")
    );
    assert!(
        !checks
            .iter()
            .any(|c| c["check"].as_str().unwrap().contains("cifs"))
    );
}

#[test]
fn contract_ops_doctor_fails_on_missing_tools_kernel_and_bad_config() {
    let env = Env::new();
    env.reconfigure(json!({"toolDirs": [env.mkdir("no-tools")]}));
    let plugins = real_install(&env);
    let empty = env.mkdir("bare-sysroot");
    let (code, checks) = doctor(&env, &plugins, &empty);
    assert_eq!(code, 1);
    let lvm = find(&checks, "tool lvm");
    assert_eq!(lvm["status"], "fail");
    // No os-release in this sysroot: the tool and its package on each family, no guessed command.
    let fix = lvm["fix"].as_str().unwrap();
    assert!(
        fix.contains("install lvm") && fix.contains("lvm2 on Debian/Ubuntu"),
        "{fix}"
    );
    assert!(!fix.contains("apt-get") && !fix.contains("dnf"), "{fix}");
    assert_eq!(
        find(&checks, "tool mkfs.xfs")["status"],
        "warn",
        "xfs is optional"
    );
    assert_eq!(find(&checks, "kernel device-mapper")["status"], "fail");
    assert!(
        find(&checks, "kernel nfs filesystem")["detail"]
            .as_str()
            .unwrap()
            .starts_with("missing")
    );

    std::fs::write(&env.config, br#"{"statedir":"/x"}"#).unwrap();
    let (code, checks) = doctor(&env, &plugins, &healthy_sysroot(&env));
    assert_eq!(code, 1);
    let c = find(&checks, &format!("config {}", env.config.display()));
    assert_eq!(c["status"], "fail");
    assert!(
        c["detail"].as_str().unwrap().contains("unknown field"),
        "{c}"
    );
}

#[test]
fn contract_ops_every_command_has_help_with_an_example() {
    let env = Env::new();
    for cmd in ["doctor", "status", "gc", "install"] {
        let out = flexvol(&env, &[cmd, "--help"]);
        assert_eq!(out.code, 0);
        assert!(out.text.contains("Example:"), "{cmd}: {}", out.text);
    }
}

/// A record as the hostpath driver writes it, for a pod directory that may not exist.
fn write_record(env: &Env, target: &Path, since: u64) -> PathBuf {
    let dir = env.state.join("hostpath");
    std::fs::create_dir_all(&dir).unwrap();
    let f = dir.join(format!(
        "{}.json",
        flexvol::node::state::file_key(&target.to_string_lossy())
    ));
    let rec = json!({"backend":"hostpath","verb":"mount","target":target,"source":"/srv/x",
        "readOnly":false,"volume":"v","podUid":"gone-uid","since":since});
    std::fs::write(&f, rec.to_string()).unwrap();
    f
}

#[test]
fn contract_ops_gc_forgets_stale_records_only_with_apply_and_after_grace() {
    let env = Env::new();
    let old = env
        .root()
        .join("kubelet/pods/gone-uid/volumes/flexvol~hostpath/v");
    let old_rec = write_record(&env, &old, 1);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let fresh = env
        .root()
        .join("kubelet/pods/new-uid/volumes/flexvol~hostpath/v");
    let fresh_rec = write_record(&env, &fresh, now);

    let st = flexvol(&env, &["status", "--json"]);
    assert_eq!(st.code, 1, "disagreements make status fail: {}", st.text);
    let j = st.json();
    let vols = j["volumes"].as_array().unwrap();
    assert_eq!(vols.len(), 2);
    for v in vols {
        assert_eq!(v["mounted"], false);
        assert!(
            v["problem"]
                .as_str()
                .unwrap()
                .contains("nothing is mounted")
        );
        assert_eq!(v["podState"]["state"], "gone", "{v}");
    }

    let dry = flexvol(&env, &["gc"]);
    assert_eq!(dry.code, 0);
    assert!(
        dry.text.contains("would forget the record of"),
        "{}",
        dry.text
    );
    assert!(dry.text.contains(old.to_str().unwrap()));
    assert!(
        !dry.text.contains(fresh.to_str().unwrap()),
        "a fresh record may be a mount in progress"
    );
    assert!(
        old_rec.exists() && fresh_rec.exists(),
        "a dry run changes nothing"
    );

    let applied = flexvol(&env, &["gc", "--apply", "--json"]);
    assert_eq!(applied.code, 0, "{}", applied.text);
    let f = &applied.json()["findings"][0];
    assert_eq!(
        (f["action"].as_str(), f["done"].as_bool()),
        (Some("forget-record"), Some(true))
    );
    assert!(!old_rec.exists());
    assert!(fresh_rec.exists());
    // gc's action is in the call log.
    assert!(env.log_lines().iter().any(|l| l["verb"] == "gc:forget"));
}

#[test]
fn contract_ops_status_and_gc_refuse_an_empty_live_pod_list() {
    let env = Env::new();
    let live = env.root().join("live");
    std::fs::write(&live, "\n").unwrap();
    for cmd in ["status", "gc"] {
        let out = flexvol(&env, &[cmd, "--live-pods", live.to_str().unwrap()]);
        assert_eq!(out.code, 2);
        assert!(out.text.contains("lists no pod"), "{}", out.text);
    }
}

#[test]
fn contract_ops_syslog_record_arrives_with_secrets_redacted() {
    let env = Env::new();
    let sock_path = env.root().join("log.sock");
    let sock = std::os::unix::net::UnixDatagram::bind(&sock_path).unwrap();
    sock.set_read_timeout(Some(std::time::Duration::from_secs(10)))
        .unwrap();
    env.reconfigure(json!({"logSyslog": true, "syslogSocket": sock_path}));
    let pod = env.pod_dir("u", "v");
    let opts = r#"{"path":"relative/bad","kubernetes.io/secret/password":"czNjcjN0","mountPassword":"hunter2"}"#;
    env.call("hostpath", &["mount", pod.to_str().unwrap(), opts])
        .failed("unknown hostPath option");
    let mut buf = vec![0u8; 65536];
    let n = sock.recv(&mut buf).expect("a syslog datagram arrives");
    let msg = String::from_utf8_lossy(&buf[..n]).into_owned();
    // daemon.err for a Failure, then the same JSON record as the log file.
    assert!(msg.starts_with("<27>flexvol["), "{msg}");
    let rec: Value = serde_json::from_str(msg.split_once("]: ").unwrap().1).unwrap();
    assert_eq!(rec["verb"], "mount");
    assert_eq!(rec["reply"]["status"], "Failure");
    assert!(
        !msg.contains("czNjcjN0") && !msg.contains("hunter2"),
        "{msg}"
    );
    assert!(msg.contains("<redacted>"));
    // A Success is daemon.info.
    env.call("hostpath", &["init"]).ok();
    let n = sock.recv(&mut buf).unwrap();
    assert!(buf[..n].starts_with(b"<30>flexvol["));
}

// ---- root tier: real mounts ----

fn mount_opts(src: &Path, uid: &str) -> String {
    json!({"path": src, "type": "Directory", "kubernetes.io/pod.name": "web", "kubernetes.io/pod.namespace": "team-a",
        "kubernetes.io/pod.uid": uid, "kubernetes.io/pvOrVolumeName": "v", "kubernetes.io/readwrite": "rw"})
    .to_string()
}

fn is_mounted(p: &Path) -> bool {
    flexvol::sys::mountinfo::MountTable::read()
        .unwrap()
        .is_mount_point(p)
}

fn live_file(env: &Env, uids: &[&str]) -> PathBuf {
    let f = env.root().join("live-pods");
    std::fs::write(&f, uids.join(" ")).unwrap();
    f
}

#[test]
fn root_ops_status_shows_real_mounts_and_flags_a_lost_record() {
    require_root!();
    let env = Env::new();
    let src = env.mkdir("data");
    let pod = env.pod_dir("uid-1", "v");
    env.call(
        "hostpath",
        &["mount", pod.to_str().unwrap(), &mount_opts(&src, "uid-1")],
    )
    .ok();

    let st = flexvol(&env, &["status", "--json"]);
    assert_eq!(st.code, 0, "{}", st.text);
    let j = st.json();
    let v = &j["volumes"][0];
    assert_eq!(j["volumes"].as_array().unwrap().len(), 1, "{j}");
    assert_eq!(v["mounted"], true);
    assert_eq!(v["pod"], "team-a/web");
    assert_eq!(v["podUid"], "uid-1");
    assert_eq!(v["source"], src.to_str().unwrap());
    assert_eq!(v["mountPoint"], pod.to_str().unwrap());
    assert_eq!(v["podState"]["state"], "alive");
    assert!(v["problem"].is_null());
    let human = flexvol(&env, &["status"]);
    assert!(human.text.contains("hostpath v mounted"), "{}", human.text);
    assert!(human.text.contains("team-a/web"));

    // The record is lost: the mount is flagged, and gc leaves it alone while the pod may be alive.
    for e in std::fs::read_dir(env.state.join("hostpath")).unwrap() {
        std::fs::remove_file(e.unwrap().path()).unwrap();
    }
    let st = flexvol(&env, &["status", "--json"]);
    assert_eq!(st.code, 1);
    let v = &st.json()["volumes"][0];
    assert_eq!(v["recordFile"], Value::Null);
    assert!(v["problem"].as_str().unwrap().contains("no record"), "{v}");
    let gc = flexvol(&env, &["gc", "--apply"]);
    assert_eq!(gc.code, 0);
    assert!(gc.text.contains("left alone"), "{}", gc.text);
    assert!(
        is_mounted(&pod),
        "an untracked mount of a live pod is never touched"
    );

    // Once the API server says the pod is gone, gc --apply unmounts it.
    let live = live_file(&env, &["some-other-pod"]);
    let gc = flexvol(
        &env,
        &["gc", "--apply", "--live-pods", live.to_str().unwrap()],
    );
    assert_eq!(gc.code, 0, "{}", gc.text);
    assert!(gc.text.contains("unmounted"), "{}", gc.text);
    assert!(!is_mounted(&pod));
    assert!(!pod.exists(), "the empty volume directory is removed");
    assert!(src.exists(), "the source is untouched");
}

#[test]
fn root_ops_gc_unmounts_only_the_pods_that_are_gone() {
    require_root!();
    let env = Env::new();
    let src = env.mkdir("data");
    std::fs::write(src.join("keep"), "data").unwrap();
    let file_src = env.root().join("data/keep");
    let alive = env.pod_dir("alive", "v");
    let gone = env.pod_dir("gone", "v");
    let gone_file = env.pod_dir("gone-file", "f");
    env.call(
        "hostpath",
        &["mount", alive.to_str().unwrap(), &mount_opts(&src, "alive")],
    )
    .ok();
    env.call(
        "hostpath",
        &["mount", gone.to_str().unwrap(), &mount_opts(&src, "gone")],
    )
    .ok();
    let fo =
        json!({"path": file_src, "type": "File", "kubernetes.io/pod.uid": "gone-file"}).to_string();
    env.call("hostpath", &["mount", gone_file.to_str().unwrap(), &fo])
        .ok();
    assert!(is_mounted(&gone_file.join("keep")));

    let live = live_file(&env, &["alive"]);
    let lp = live.to_str().unwrap();
    let dry = flexvol(&env, &["gc", "--live-pods", lp, "--json"]);
    assert_eq!(dry.code, 0);
    let findings = dry.json()["findings"].as_array().unwrap().clone();
    let targets: Vec<&str> = findings
        .iter()
        .map(|f| f["target"].as_str().unwrap())
        .collect();
    assert_eq!(findings.len(), 2, "{findings:#?}");
    assert!(
        targets.contains(&gone.to_str().unwrap()) && targets.contains(&gone_file.to_str().unwrap())
    );
    assert!(
        findings
            .iter()
            .all(|f| f["action"] == "unmount" && f["done"].is_null())
    );
    assert!(
        is_mounted(&gone) && is_mounted(&gone_file.join("keep")),
        "dry run"
    );

    let applied = flexvol(&env, &["gc", "--live-pods", lp, "--apply"]);
    assert_eq!(applied.code, 0, "{}", applied.text);
    assert!(!is_mounted(&gone) && !gone.exists());
    assert!(
        !is_mounted(&gone_file.join("keep")) && !gone_file.exists(),
        "placeholder and dir removed"
    );
    assert!(is_mounted(&alive), "the live pod keeps its volume");
    assert_eq!(
        std::fs::read_to_string(src.join("keep")).unwrap(),
        "data",
        "data untouched"
    );
    let st = flexvol(&env, &["status", "--json", "--live-pods", lp]);
    assert_eq!(st.code, 0, "{}", st.text);
    assert_eq!(st.json()["volumes"].as_array().unwrap().len(), 1);
    assert!(
        env.log_lines()
            .iter()
            .filter(|l| l["verb"] == "gc:unmount")
            .count()
            == 2
    );
    env.call("hostpath", &["unmount", alive.to_str().unwrap()])
        .ok();
}

#[test]
fn root_ops_gc_forgets_the_record_of_a_mount_removed_behind_its_back() {
    require_root!();
    let env = Env::with_config(json!({"verbTimeoutSeconds": 1}));
    let src = env.mkdir("data");
    let pod = env.pod_dir("vanished", "v");
    env.call(
        "hostpath",
        &[
            "mount",
            pod.to_str().unwrap(),
            &mount_opts(&src, "vanished"),
        ],
    )
    .ok();
    // Someone unmounted it by hand and kubelet removed the pod directory.
    nix::mount::umount2(&pod, nix::mount::MntFlags::empty()).unwrap();
    std::fs::remove_dir_all(env.root().join("kubelet/pods/vanished")).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(1100));

    let st = flexvol(&env, &["status"]);
    assert_eq!(st.code, 1);
    assert!(
        st.text.contains("NOT MOUNTED") && st.text.contains("POD GONE"),
        "{}",
        st.text
    );
    let gc = flexvol(&env, &["gc", "--apply"]);
    assert_eq!(gc.code, 0, "{}", gc.text);
    assert!(gc.text.contains("forgot the record of"), "{}", gc.text);
    let st = flexvol(&env, &["status"]);
    assert_eq!(st.code, 0, "{}", st.text);
    assert!(st.text.contains("no flexvol volumes"));
    assert!(src.exists());
}

#[test]
fn contract_ops_install_checks_and_installs_the_config_then_sleeps_until_sigterm() {
    let env = Env::new();
    let plugins = env.root().join("ds-plugins");
    let dest = env.root().join("host-etc/flexvol/config.json");
    let good = env.root().join("cm.json");
    std::fs::write(&good, br#"{"hostpath":{"allowedRoots":["/srv"]}}"#).unwrap();
    let bad = env.root().join("bad.json");
    std::fs::write(&bad, br#"{"hostpath":{"allowedroots":["/srv"]}}"#).unwrap();
    let args = |cfg: &Path| {
        vec![
            "install".to_owned(),
            "--plugin-dir".into(),
            plugins.to_string_lossy().into_owned(),
            "--binary".into(),
            binary().to_string_lossy().into_owned(),
            "--config".into(),
            cfg.to_string_lossy().into_owned(),
            "--config-dest".into(),
            dest.to_string_lossy().into_owned(),
        ]
    };
    let refs = |v: &[String]| {
        v.iter()
            .map(String::as_str)
            .collect::<Vec<_>>()
            .join("\u{0}")
    };
    let run = |v: Vec<String>| {
        let joined = refs(&v);
        flexvol(&env, &joined.split('\u{0}').collect::<Vec<_>>())
    };
    let out = run(args(&bad));
    assert_eq!(out.code, 1);
    assert!(
        out.text.contains("unknown field") && out.text.contains("nothing was installed"),
        "{}",
        out.text
    );
    assert!(!dest.exists());
    let out = run(args(&good));
    assert_eq!(out.code, 0, "{}", out.text);
    assert_eq!(std::fs::read(&dest).unwrap(), std::fs::read(&good).unwrap());
    assert_eq!(
        std::fs::metadata(&dest).unwrap().permissions().mode() & 0o777,
        0o644
    );
    assert!(plugins.join("flexvol~lvm/lvm").is_file());

    // --sleep: keeps running (a DaemonSet container), exits 0 on SIGTERM.
    let mut a = args(&good);
    a.push("--sleep".into());
    let mut child = Command::new(binary())
        .args(&a)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(500));
    assert!(child.try_wait().unwrap().is_none(), "it must keep running");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(child.id()).unwrap()),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let start = std::time::Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(start.elapsed().as_secs() < 10, "SIGTERM must stop it");
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    assert_eq!(status.code(), Some(0));
}

#[test]
fn root_ops_status_and_gc_look_only_below_the_kubelet_root_they_are_given() {
    require_root!();
    let ours = Env::new();
    let other = Env::new();
    let src = other.mkdir("data");
    let pod = other.pod_dir("uid-other", "v");
    other
        .call(
            "hostpath",
            &[
                "mount",
                pod.to_str().unwrap(),
                &mount_opts(&src, "uid-other"),
            ],
        )
        .ok();
    // Without a root, `ours` sees the other kubelet's mount as one it has no record of...
    let all = Command::new(binary())
        .args(["status", "--json"])
        .env("FLEXVOL_CONFIG", &ours.config)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let all: Value = serde_json::from_slice(&all.stdout).unwrap();
    assert!(
        all["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|v| v["mountPoint"] == pod.to_str().unwrap()),
        "{all}"
    );
    // ...and with its own root (what the helper passes), neither status nor gc touch it.
    let st = flexvol(&ours, &["status", "--json"]);
    assert_eq!(st.code, 0, "{}", st.text);
    assert_eq!(st.json()["volumes"].as_array().unwrap().len(), 0);
    let gc = flexvol(&ours, &["gc", "--apply"]);
    assert_eq!(gc.code, 0, "{}", gc.text);
    assert!(is_mounted(&pod));
    other
        .call("hostpath", &["unmount", pod.to_str().unwrap()])
        .ok();
}

/// A volume directory as `flexvol provisioner` makes it (directory, then ownership marker).
fn provisioned_dir(root: &Path, pv: &str) -> PathBuf {
    use flexvol::provision::storage::volumedir::{Marker, create_volume_dir, prepare_root};
    let root = prepare_root(root).unwrap();
    let m = Marker {
        provisioner: "flexvol/hostpath".into(),
        volume: pv.into(),
        namespace: "team-b".into(),
        claim: format!("claim-{pv}"),
        claim_uid: format!("uid-{pv}"),
        node: "n".into(),
        project_id: None,
    };
    let dir = create_volume_dir(
        &root,
        Path::new(pv),
        flexvol::sys::paths::Ownership::default(),
        &m,
    )
    .unwrap();
    std::fs::write(dir.join("data"), pv).unwrap();
    dir
}

/// Issue #20 hole 6: the provisioner writes a volume's marker before its PV exists, so a PV list
/// taken a moment earlier misses it, and `gc --live-pvs LIST --apply` deleted the new volume as
/// "no longer exists". A directory made after the list, or younger than --min-age (default 1h),
/// is left alone; one older than both is still an orphan.
#[test]
fn contract_ops_gc_live_pvs_never_deletes_a_directory_younger_than_the_list_or_min_age() {
    let env = Env::new();
    let prov = env.root().join("prov");
    env.reconfigure(json!({"nodePathMap": [{"node": "n", "paths": [prov]}]}));
    let old = provisioned_dir(&prov, "pvc-old");
    std::thread::sleep(std::time::Duration::from_millis(50));
    // The list is taken: neither PV is in it (pvc-old's claim is gone; pvc-new's PV does not
    // exist yet).
    let list = env.root().join("pvs");
    std::fs::write(&list, "persistentvolume/pvc-other\n").unwrap();
    std::thread::sleep(std::time::Duration::from_millis(50));
    let new = provisioned_dir(&prov, "pvc-new");
    let list_s = list.to_str().unwrap();

    // With the default --min-age, both are minutes old: nothing is deleted.
    let out = flexvol(&env, &["gc", "--live-pvs", list_s, "--apply"]);
    assert_eq!(out.code, 0, "{}", out.text);
    assert!(
        new.join("data").exists(),
        "a live volume was deleted: {}",
        out.text
    );
    assert!(old.join("data").exists(), "{}", out.text);
    assert!(out.text.contains("--min-age"), "{}", out.text);

    // With --min-age 0 the one made after the list is still left alone; the old one goes.
    let out = flexvol(
        &env,
        &[
            "gc",
            "--live-pvs",
            list_s,
            "--min-age",
            "0s",
            "--apply",
            "--json",
        ],
    );
    assert_eq!(out.code, 0, "{}", out.text);
    assert!(
        new.join("data").exists(),
        "a live volume was deleted: {}",
        out.text
    );
    assert!(!old.exists(), "{}", out.text);
    let dirs = out.json()["orphanedDirectories"].clone();
    let by_pv = |pv: &str| {
        dirs.as_array()
            .unwrap()
            .iter()
            .find(|d| d["volume"] == pv)
            .unwrap()
            .clone()
    };
    assert_eq!(by_pv("pvc-old")["done"], true, "{dirs}");
    assert!(
        by_pv("pvc-new")["leftAlone"]
            .as_str()
            .unwrap()
            .contains("after the --live-pvs file"),
        "{dirs}"
    );
}
