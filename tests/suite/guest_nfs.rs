//! Guest tier, NFS: the real binary against a real kernel NFS server and client, inside the test
//! VM (`tests/vm/run --nfs-server SUITE --ignored --test-threads=1 guest_nfs`), which exports a
//! tmpfs at `127.0.0.1:/srv/nfs`. Calls follow kubelet's sequence for a non-attachable NFS volume
//! (docs/protocol.md §12.3): `mount <podDir> <json with pod info and secrets>`, later
//! `unmount <podDir>`.
//!
//! Each test works in its own subdirectory of the export. The dead-server test stops nfsd
//! (`rpc.nfsd 0`) and always restarts it, even when it fails.

use crate::util::{Env, Reply, run};
use serde_json::json;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

const IGNORE: &str = "guest tier: needs a kernel NFS server; run inside the test VM";
const EXPORT: &str = "/srv/nfs";

/// Fails loudly when not in the guest: these tests are only run on request.
fn require_server() {
    assert!(
        Path::new("/proc/fs/nfsd/threads").exists()
            && std::net::TcpStream::connect("127.0.0.1:2049").is_ok(),
        "{IGNORE}: no NFS server on 127.0.0.1:2049 (use tests/vm/run --nfs-server)"
    );
}

/// A fresh directory in the export for one test; `share` is its path on the server.
fn export_dir(name: &str) -> PathBuf {
    let p = Path::new(EXPORT).join(name);
    let _ = std::fs::remove_dir_all(&p);
    std::fs::create_dir_all(&p).unwrap();
    p
}

/// kubelet's mount payload (docs/protocol.md §12.3) for `share`, with `extra` merged in.
fn payload(uid: &str, share: &Path, extra: serde_json::Value) -> String {
    crate::util::mount_options(
        json!({
            "kubernetes.io/fsType": "nfs",
            "kubernetes.io/pod.name": format!("pod-{uid}"),
            "kubernetes.io/pod.namespace": "default",
            "kubernetes.io/pod.uid": uid,
            "kubernetes.io/pvOrVolumeName": "data",
            "kubernetes.io/secret/password": "czNjcjN0",
            "kubernetes.io/secret/username": "YWRtaW4=",
            "server": "127.0.0.1",
            "share": share,
        }),
        extra,
    )
}

/// A pod volume directory as kubelet creates it (0750) before calling mount.
fn pod_dir(env: &Env, uid: &str) -> PathBuf {
    let d = env.mkdir(&format!("kubelet/pods/{uid}/volumes/flexvol~nfs/data"));
    std::fs::set_permissions(&d, std::os::unix::fs::PermissionsExt::from_mode(0o750)).unwrap();
    d
}

/// One driver call; calls slower than a second are reported (the VM is slow, the driver is not).
#[track_caller]
fn timed(env: &Env, args: &[&str]) -> Reply {
    let t = Instant::now();
    let r = env.call("nfs", args);
    if t.elapsed() > Duration::from_secs(1) {
        eprintln!(
            "slow call: nfs {} {} took {:?}: {}",
            args[0],
            args[1],
            t.elapsed(),
            r.json
        );
    }
    r
}

#[track_caller]
fn mount(env: &Env, dir: &Path, json: &str) -> Reply {
    timed(env, &["mount", dir.to_str().unwrap(), json])
}

#[track_caller]
fn unmount(env: &Env, dir: &Path) -> Reply {
    timed(env, &["unmount", dir.to_str().unwrap()])
}

/// The NFS mounts exactly at `dir`: (fs type, source, mount options, superblock options).
fn nfs_mounts_at(dir: &Path) -> Vec<(String, String, String, String)> {
    flexvol::sys::mountinfo::MountTable::read()
        .unwrap()
        .all_at(dir)
        .filter(|m| m.fs_type.starts_with("nfs"))
        .map(|m| {
            (
                m.fs_type.clone(),
                m.source.clone(),
                m.mount_options.clone(),
                m.super_options.clone(),
            )
        })
        .collect()
}

/// Stops nfsd for the life of the guard, then starts it again (also when the test panics).
pub(crate) struct ServerDown;

impl ServerDown {
    pub(crate) fn new() -> Self {
        run("rpc.nfsd", &["0"]);
        let t = Instant::now();
        while std::net::TcpStream::connect("127.0.0.1:2049").is_ok() {
            assert!(t.elapsed() < Duration::from_secs(10), "nfsd did not stop");
            std::thread::sleep(Duration::from_millis(100));
        }
        ServerDown
    }
}

impl Drop for ServerDown {
    fn drop(&mut self) {
        run(
            "rpc.nfsd",
            &["--lease-time", "10", "--grace-time", "10", "4"],
        );
    }
}

#[test]
#[ignore = "guest tier: needs a kernel NFS server; run inside the test VM"]
fn guest_nfs_v3_and_v4_mounts_write_through_to_the_export_each_verb_twice() {
    require_server();
    let env = Env::new();
    for (i, (version, fs, vers)) in [
        ("3", "nfs", "vers=3"),
        ("4", "nfs4", "vers=4"),
        ("4.1", "nfs4", "vers=4.1"),
        ("4.2", "nfs4", "vers=4.2"),
        ("", "nfs4", "vers=4"),
    ]
    .into_iter()
    .enumerate()
    {
        let share = export_dir(&format!("versions-{i}"));
        let dir = pod_dir(&env, &format!("uid-v{i}"));
        let extra = if version.is_empty() {
            json!({})
        } else {
            json!({"version": version})
        };
        let j = payload(&format!("uid-v{i}"), &share, extra);
        mount(&env, &dir, &j).ok();
        mount(&env, &dir, &j).ok();
        let m = nfs_mounts_at(&dir);
        assert_eq!(m.len(), 1, "version {version:?}: {m:?}");
        let (fs_type, source, opts, sopts) = &m[0];
        assert_eq!(fs_type, fs, "version {version:?}");
        assert_eq!(source, &format!("127.0.0.1:{}", share.display()));
        assert!(sopts.contains(vers), "version {version:?}: {sopts}");
        assert!(
            sopts.contains("hard") && sopts.contains("timeo=600") && sopts.contains("retrans=2"),
            "{sopts}"
        );
        assert!(
            opts.contains("nosuid") && opts.contains("nodev"),
            "version {version:?}: {opts}"
        );

        std::fs::write(dir.join("from-pod"), format!("v{version}")).unwrap();
        assert_eq!(
            std::fs::read_to_string(share.join("from-pod")).unwrap(),
            format!("v{version}"),
            "a file written through the pod mount appears in the export"
        );
        unmount(&env, &dir).ok();
        unmount(&env, &dir).ok();
        assert!(nfs_mounts_at(&dir).is_empty());
        assert!(
            share.join("from-pod").exists(),
            "unmount must not touch the export's data"
        );
    }
    assert!(env.mounts().is_empty(), "{:?}", env.mounts());
    let log = std::fs::read_to_string(&env.log).unwrap();
    assert!(!log.contains("czNjcjN0") && !log.contains("s3cr3t"));
}

#[test]
#[ignore = "guest tier: needs a kernel NFS server; run inside the test VM"]
fn guest_nfs_read_only_gives_erofs() {
    require_server();
    let env = Env::new();
    let share = export_dir("ro");
    std::fs::write(share.join("hello"), "hi").unwrap();
    for (uid, extra) in [
        ("uid-ro1", json!({"kubernetes.io/readwrite": "ro"})),
        ("uid-ro2", json!({"mountOptions": "ro"})),
    ] {
        let dir = pod_dir(&env, uid);
        mount(&env, &dir, &payload(uid, &share, extra)).ok();
        assert!(nfs_mounts_at(&dir)[0].2.split(',').any(|o| o == "ro"));
        assert_eq!(std::fs::read_to_string(dir.join("hello")).unwrap(), "hi");
        let e = std::fs::write(dir.join("nope"), "x").unwrap_err();
        assert_eq!(e.raw_os_error(), Some(nix::libc::EROFS), "{e}");
        unmount(&env, &dir).ok();
    }
    assert!(!share.join("nope").exists());
    assert!(env.mounts().is_empty());
}

#[test]
#[ignore = "guest tier: needs a kernel NFS server; run inside the test VM"]
fn guest_nfs_sixteen_pods_mount_one_export_in_parallel() {
    require_server();
    let env = Env::new();
    let share = export_dir("parallel");
    std::fs::write(share.join("shared"), "one export").unwrap();
    let dirs: Vec<PathBuf> = (0..16)
        .map(|i| pod_dir(&env, &format!("uid-p{i:02}")))
        .collect();
    let t = Instant::now();
    std::thread::scope(|s| {
        for (i, d) in dirs.iter().enumerate() {
            let (env, share) = (&env, &share);
            s.spawn(move || {
                mount(env, d, &payload(&format!("uid-p{i:02}"), share, json!({}))).ok();
            });
        }
    });
    let took = t.elapsed();
    for d in &dirs {
        assert_eq!(nfs_mounts_at(d).len(), 1, "{}", d.display());
        assert_eq!(
            std::fs::read_to_string(d.join("shared")).unwrap(),
            "one export"
        );
    }
    eprintln!("16 parallel NFS mounts took {took:?}");
    std::thread::scope(|s| {
        for d in &dirs {
            let env = &env;
            s.spawn(move || {
                unmount(env, d).ok();
            });
        }
    });
    assert!(env.mounts().is_empty(), "{:?}", env.mounts());
    assert!(share.join("shared").exists());
}

#[test]
#[ignore = "guest tier: needs a kernel NFS server; run inside the test VM"]
fn guest_nfs_injection_attempts_are_rejected_with_nothing_mounted() {
    require_server();
    let env = Env::new();
    let share = export_dir("inject");
    let dir = pod_dir(&env, "uid-inj");
    for extra in [
        json!({"share": format!("{},suid", share.display())}),
        json!({"server": "-oremount"}),
        json!({"server": "127.0.0.1,suid"}),
        json!({"server": "::1"}),
        json!({"mountOptions": "rw,suid"}),
        json!({"mountOptions": "dev"}),
        json!({"mountOptions": "sec=sys\nx"}),
        json!({"mountOptions": "remount,rw"}),
        json!({"mountOptions": "vers=3"}),
        json!({"share": format!("{}/../nfs", share.display())}),
        json!({"share": "srv/nfs"}),
        json!({"version": "4 suid"}),
    ] {
        let r = mount(&env, &dir, &payload("uid-inj", &share, extra.clone()));
        r.failed("option");
        assert!(nfs_mounts_at(&dir).is_empty(), "{extra} mounted something");
    }
    assert!(env.mounts().is_empty());
    assert!(
        std::fs::read_dir(env.state.join("nfs")).map_or(0, |d| d.count()) == 0,
        "no state recorded for refused mounts"
    );
    // The same pod directory then mounts fine, with nosuid,nodev.
    mount(&env, &dir, &payload("uid-inj", &share, json!({}))).ok();
    let opts = &nfs_mounts_at(&dir)[0].2;
    assert!(opts.contains("nosuid") && opts.contains("nodev"), "{opts}");
    unmount(&env, &dir).ok();
}

#[test]
#[ignore = "guest tier: needs a kernel NFS server; run inside the test VM"]
fn guest_nfs_unmount_after_kubelet_restart_without_state() {
    require_server();
    let env = Env::new();
    let share = export_dir("nostate");
    let dir = pod_dir(&env, "uid-ns");
    mount(
        &env,
        &dir,
        &payload("uid-ns", &share, json!({"version": "4.2"})),
    )
    .ok();
    std::fs::remove_dir_all(env.state.join("nfs")).unwrap();
    unmount(&env, &dir).ok();
    assert!(nfs_mounts_at(&dir).is_empty());
}

#[test]
#[ignore = "guest tier: needs a kernel NFS server; run inside the test VM"]
fn guest_nfs_dead_server_mount_fails_fast_and_existing_mounts_unmount_in_bounded_time() {
    require_server();
    let env = Env::new();
    let share = export_dir("dead");
    std::fs::write(share.join("file"), "x").unwrap();
    // Three existing mounts: idle (v4.2), idle (v3), and one with a process stuck in it.
    let idle4 = pod_dir(&env, "uid-d1");
    let idle3 = pod_dir(&env, "uid-d2");
    let busy = pod_dir(&env, "uid-d3");
    mount(
        &env,
        &idle4,
        &payload("uid-d1", &share, json!({"version": "4.2"})),
    )
    .ok();
    mount(
        &env,
        &idle3,
        &payload("uid-d2", &share, json!({"version": "3"})),
    )
    .ok();
    mount(&env, &busy, &payload("uid-d3", &share, json!({}))).ok();
    // A container process whose working directory is in the volume.
    let mut holder = Command::new("sleep")
        .arg("3600")
        .current_dir(&busy)
        .spawn()
        .unwrap();

    let down = ServerDown::new();
    // A process touching the dead mount blocks (hard mount): the classic kubelet wedge.
    let mut stuck = Command::new("stat").arg(busy.join("file")).spawn().unwrap();

    // A new mount fails within the probe deadline, with a clear message.
    let fresh = pod_dir(&env, "uid-d4");
    let t = Instant::now();
    let r = mount(&env, &fresh, &payload("uid-d4", &share, json!({})));
    let mount_took = t.elapsed();
    r.failed("NFS server 127.0.0.1 is unreachable")
        .failed("nothing accepted a TCP connection")
        .failed("Nothing was mounted");
    assert!(mount_took < Duration::from_secs(5), "{mount_took:?}");
    assert!(nfs_mounts_at(&fresh).is_empty());

    // Existing mounts come off within the unmount deadline: probe + forced + lazy steps.
    let bound = Duration::from_secs(5 + 10 + 10 + 5);
    let mut times = Vec::new();
    for d in [&idle4, &idle3, &busy] {
        let t = Instant::now();
        let r = unmount(&env, d);
        let took = t.elapsed();
        r.ok();
        assert!(
            r.message().contains("is unreachable"),
            "{}: {}",
            d.display(),
            r.message()
        );
        assert!(took < bound, "{}: {took:?}", d.display());
        assert!(nfs_mounts_at(d).is_empty(), "{}", d.display());
        times.push((d.display().to_string(), took, r.message().to_owned()));
        // Twice: the second finds nothing to do.
        unmount(&env, d).ok();
    }
    eprintln!("dead server: new mount failed in {mount_took:?}");
    for (d, took, msg) in &times {
        eprintln!("dead server: unmount of {d} took {took:?} ({msg})");
    }

    // The server comes back before the container processes die: a process that still holds a
    // lazily detached mount of a *dead* server blocks in exit (its last reference tears the
    // NFS client down against the server) — that is the container's exit, not the driver's.
    let t = Instant::now();
    drop(down);
    assert!(
        std::net::TcpStream::connect("127.0.0.1:2049").is_ok(),
        "nfsd restarted"
    );
    let _ = stuck.kill();
    let _ = stuck.wait();
    let _ = holder.kill();
    let _ = holder.wait();
    eprintln!(
        "dead server: restart + the holders' exit took {:?}",
        t.elapsed()
    );
    assert_eq!(
        std::fs::read_to_string(share.join("file")).unwrap(),
        "x",
        "the export's data is untouched"
    );
    // The server is back: the same pod directory mounts again.
    mount(&env, &fresh, &payload("uid-d4", &share, json!({}))).ok();
    unmount(&env, &fresh).ok();
    assert!(env.mounts().is_empty(), "{:?}", env.mounts());
}

#[test]
#[ignore = "guest tier: needs a kernel NFS server; run inside the test VM"]
fn guest_nfs_kill_9_mid_verb_converges_on_retry() {
    require_server();
    let env = Env::new();
    let share = export_dir("kill9");
    let dir = pod_dir(&env, "uid-k9");
    let d = dir.to_str().unwrap();
    let j = payload("uid-k9", &share, json!({}));
    let records = || std::fs::read_dir(env.state.join("nfs")).map_or(0, |d| d.count());

    // Killed after recording, before mount.nfs: nothing mounted, a record; the retry mounts.
    env.killed_at("nfs", &["mount", d, &j], "nfs-mount-before-mount");
    assert!(nfs_mounts_at(&dir).is_empty());
    assert_eq!(records(), 1);
    // kubelet may instead give up on the pod: unmount of the never-made mount succeeds too.
    unmount(&env, &dir).ok();
    assert_eq!(records(), 0);
    env.killed_at("nfs", &["mount", d, &j], "nfs-mount-before-mount");
    mount(&env, &dir, &j).ok();
    assert_eq!(nfs_mounts_at(&dir).len(), 1);

    // Killed after unmounting, before forgetting the record: the retry just forgets it.
    env.killed_at("nfs", &["unmount", d], "nfs-unmount-before-forget");
    assert!(nfs_mounts_at(&dir).is_empty());
    assert_eq!(records(), 1);
    unmount(&env, &dir).ok();
    assert_eq!(records(), 0);
    assert!(env.mounts().is_empty());
}

#[test]
#[ignore = "guest tier: needs a kernel NFS server; run inside the test VM"]
fn guest_nfs_server_by_hostname() {
    require_server();
    let resolves = Command::new("getent")
        .args(["ahosts", "localhost"])
        .output()
        .is_ok_and(|o| {
            o.status.success() && String::from_utf8_lossy(&o.stdout).contains("127.0.0.1")
        });
    // The guest is ours (tests/vm/setup writes its /etc/hosts): a missing entry is a broken
    // guest, not a reason to skip.
    assert!(
        resolves,
        "localhost does not resolve to 127.0.0.1 in this guest: check the /etc/hosts that tests/vm/setup writes"
    );
    let env = Env::new();
    let share = export_dir("byname");
    let dir = pod_dir(&env, "uid-name");
    let j = payload(
        "uid-name",
        &share,
        json!({"server": "localhost", "version": "4.2"}),
    );
    mount(&env, &dir, &j).ok();
    let m = nfs_mounts_at(&dir);
    assert_eq!(m.len(), 1);
    assert_eq!(m[0].1, format!("localhost:{}", share.display()));
    // The retry recognises the export by name.
    mount(&env, &dir, &j).ok();
    unmount(&env, &dir).ok();
    assert!(nfs_mounts_at(&dir).is_empty());
    env.call(
        "nfs",
        &[
            "mount",
            dir.to_str().unwrap(),
            &payload(
                "uid-name",
                &share,
                json!({"server": "no-such-host.invalid"}),
            ),
        ],
    )
    .failed("does not resolve");
}

/// Drops every packet on `lo` while alive (a server that does not answer at all, rather than one
/// that refuses connections). `None` when this kernel has no netem.
pub(crate) struct Blackhole;

impl Blackhole {
    pub(crate) fn new() -> Option<Self> {
        let ok = Command::new("tc")
            .args(["qdisc", "add", "dev", "lo", "root", "netem", "loss", "100%"])
            .status()
            .is_ok_and(|s| s.success());
        ok.then_some(Blackhole)
    }
}

impl Drop for Blackhole {
    fn drop(&mut self) {
        run("tc", &["qdisc", "del", "dev", "lo", "root"]);
    }
}

#[test]
#[ignore = "guest tier: needs a kernel NFS server; run inside the test VM"]
fn guest_nfs_silent_server_costs_the_probe_budget_not_a_hang() {
    require_server();
    let env = Env::new();
    let share = export_dir("silent");
    let idle = pod_dir(&env, "uid-s1");
    mount(
        &env,
        &idle,
        &payload("uid-s1", &share, json!({"version": "4.2"})),
    )
    .ok();
    // The guest kernel is ours and has netem: failing to set it up is a broken guest, not a skip.
    let Some(hole) = Blackhole::new() else {
        unmount(&env, &idle).ok();
        panic!(
            "cannot blackhole the NFS server: `tc qdisc add dev lo root netem loss 100%` failed in the guest (sch_netem missing?)"
        );
    };
    let fresh = pod_dir(&env, "uid-s2");
    let t = Instant::now();
    let r = mount(&env, &fresh, &payload("uid-s2", &share, json!({})));
    let mount_took = t.elapsed();
    r.failed("is unreachable")
        .failed("nothing accepted a TCP connection on 127.0.0.1:2049");
    assert!(
        mount_took >= Duration::from_secs(4) && mount_took < Duration::from_secs(8),
        "{mount_took:?}"
    );
    let t = Instant::now();
    let r = unmount(&env, &idle);
    let unmount_took = t.elapsed();
    r.ok();
    assert!(unmount_took < Duration::from_secs(30), "{unmount_took:?}");
    assert!(nfs_mounts_at(&idle).is_empty());
    drop(hole);
    eprintln!("silent server: new mount failed in {mount_took:?}");
    eprintln!(
        "silent server: unmount took {unmount_took:?} ({})",
        r.message()
    );
    assert!(env.mounts().is_empty(), "{:?}", env.mounts());
}

/// A hostPath root on an NFS export whose server goes silent: the hostPath driver starts its
/// guard thread for a volume off kubelet's own filesystem (sys::process, "When the guard thread
/// runs"), so a call stuck on the server is answered at the deadline, and the process ends.
#[test]
#[ignore = "guest tier: needs a kernel NFS server; run inside the test VM"]
fn guest_hostpath_root_on_a_silent_nfs_server_is_answered_at_the_deadline() {
    require_server();
    let share = export_dir("hostpath-root");
    let env = Env::with_config(json!({"verbTimeoutSeconds": 3}));
    // Mounted the way a node operator would (hard, the kernel's default); Env's drop detaches it.
    let root = env.mkdir("nfs-root");
    run(
        "mount",
        &[
            "-t",
            "nfs",
            "-o",
            "vers=4.2,hard",
            &format!("127.0.0.1:{}", share.display()),
            root.to_str().unwrap(),
        ],
    );
    let hostpath = |dir: &Path, verb: &str, src: Option<&Path>| {
        let d = dir.to_str().unwrap().to_owned();
        let j = src.map(|s| {
            json!({
                "kubernetes.io/pvOrVolumeName": "v",
                "kubernetes.io/readwrite": "rw",
                "path": s,
                "type": "DirectoryOrCreate",
            })
            .to_string()
        });
        let mut args = vec![verb, d.as_str()];
        args.extend(j.as_deref());
        let t = Instant::now();
        let r = env.call("hostpath", &args);
        (r, t.elapsed())
    };
    let pod = env.mkdir("kubelet/pods/uid-h1/volumes/flexvol~hostpath/v");
    let (r, _) = hostpath(&pod, "mount", Some(&root.join("a")));
    r.ok();

    let Some(hole) = Blackhole::new() else {
        panic!(
            "cannot blackhole the NFS server: `tc qdisc add dev lo root netem loss 100%` failed in the guest (sch_netem missing?)"
        );
    };
    // A new directory needs the server: answered at the deadline, nothing mounted.
    let fresh = env.mkdir("kubelet/pods/uid-h2/volumes/flexvol~hostpath/v");
    let (r, took) = hostpath(&fresh, "mount", Some(&root.join("b")));
    r.failed("did not finish within its deadline of 3s");
    assert!(took < Duration::from_secs(15), "{took:?}");
    assert!(env.mounts().iter().all(|m| m != &fresh));
    // The volume already on the export: its unmount ends too (done, or the deadline).
    let (r, took) = hostpath(&pod, "unmount", None);
    assert!(took < Duration::from_secs(15), "{took:?}: {}", r.json);
    drop(hole);
    eprintln!(
        "hostPath on a silent NFS server: unmount answered in {took:?}: {}",
        r.json
    );
    // With the server back, everything converges.
    hostpath(&pod, "unmount", None).0.ok();
    assert!(env.mounts().iter().all(|m| m != &pod), "{:?}", env.mounts());
}

/// The shipped conformance runner judges the installed NFS driver with a real export: probe,
/// repeated and parallel mounts of one volume by several pods, unmount, kubelet's rmdir.
#[test]
#[ignore = "guest tier: needs a kernel NFS server; run inside the test VM"]
fn guest_nfs_conformance_runner_passes_the_nfs_driver() {
    require_server();
    let share = export_dir("conformance");
    let env = Env::new();
    let out = std::process::Command::new(crate::util::binary())
        .args([
            "conformance",
            "--plugin-dir",
            env.plugins.to_str().unwrap(),
            "--driver",
            "flexvol/nfs",
        ])
        .args([
            "--kubelet-root",
            env.root().join("kubelet").to_str().unwrap(),
            "--parallel",
            "8",
        ])
        .args([
            "--options",
            &serde_json::json!({"server": "127.0.0.1", "share": share}).to_string(),
        ])
        // Options the NFS driver must refuse: no share, and a share the server does not export.
        .args([
            "--bad-options",
            r#"{"server":"127.0.0.1"}"#,
            "--bad-options",
            r#"{"server":"127.0.0.1","share":"/srv/not-exported"}"#,
        ])
        .env("FLEXVOL_CONFIG", &env.config)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains("8 more pods mount the same volume at once"),
        "{text}"
    );
    for check in [
        "malformed options JSON: Failure",
        "mount on a pod directory that does not exist: Failure",
        "--bad-options #1 {server}: Failure",
        "--bad-options #2 {server,share}: Failure",
    ] {
        assert!(
            text.lines()
                .any(|l| l.starts_with("PASS") && l.contains(check)),
            "{check}:\n{text}"
        );
    }
    assert!(!text.lines().any(|l| l.starts_with("SKIP")), "{text}");
    assert!(env.mounts().is_empty());
}

/// `flexvol csi --kind nfs` over its socket, as kubelet calls it: a static export published onto a
/// CSI target path (the NFS backend's `mount`: the target made, the export mounted there, a write
/// lands on the server; the pod's fsGroup in `volume_mount_group` leaves its ownership as it
/// was), published again (OK), unpublished twice (OK, the target removed), no
/// NodeGetVolumeStats offered; an export outside the node's policy and an inline ephemeral volume
/// refused with nothing mounted and no target left.
#[test]
#[ignore = "guest tier: needs a kernel NFS server; run inside the test VM"]
fn guest_nfs_csi_publish_unpublish() {
    use crate::root_csi::{Plugin, call, mount_cap, publish, target, unpublish};
    use flexvol::csi::proto::*;
    require_server();
    let env = Env::new();
    let share = export_dir("csi");
    let p = Plugin::start_with(&env, &["--kind", "nfs"]);
    let info: NodeGetInfoResponse =
        call(&p.socket, "/csi.v1.Node/NodeGetInfo", NodeGetInfoRequest {}).unwrap();
    assert_eq!(info.accessible_topology, None, "no topology by default");
    let caps: NodeGetCapabilitiesResponse = call(
        &p.socket,
        "/csi.v1.Node/NodeGetCapabilities",
        NodeGetCapabilitiesRequest {},
    )
    .unwrap();
    assert_eq!(
        caps.capabilities,
        vec![NodeServiceCapability {
            rpc: Some(NodeServiceCapabilityRpc {
                r#type: VOLUME_MOUNT_GROUP
            })
        }],
        "the pod's fsGroup, and no volume stats"
    );
    // With the pod's fsGroup as kubelet 1.22+ passes it: a static export keeps its ownership.
    let with_group = || {
        let mut c = mount_cap();
        if let Some(m) = c.as_mut().and_then(|c| c.mount.as_mut()) {
            m.volume_mount_group = "2345".into();
        }
        c
    };
    let owner = |p: &Path| {
        use std::os::unix::fs::MetadataExt;
        let m = std::fs::symlink_metadata(p).unwrap();
        (m.uid(), m.gid(), m.mode() & 0o7777)
    };
    let share_owner = owner(&share);
    let req = |t: &Path, ctx: &[(&str, &str)]| NodePublishVolumeRequest {
        volume_id: "nfs-1".into(),
        target_path: t.to_string_lossy().into_owned(),
        volume_capability: with_group(),
        volume_context: ctx
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect(),
        ..Default::default()
    };
    let ctx = [
        ("server", "127.0.0.1"),
        ("share", share.to_str().unwrap()),
        ("csi.storage.k8s.io/pod.namespace", "ns"),
        ("csi.storage.k8s.io/pod.name", "p"),
    ];
    let t = target(&env, "u1", "pv-nfs");
    publish(&p, req(&t, &ctx)).unwrap();
    let m = crate::util::mounts_under(t.parent().unwrap());
    assert_eq!(m.len(), 1, "{m:?}");
    std::fs::write(t.join("written-through-csi"), "x").unwrap();
    assert!(share.join("written-through-csi").exists());
    assert_eq!(
        owner(&share),
        share_owner,
        "a static export is never regrouped"
    );
    publish(&p, req(&t, &ctx)).expect("a repeated publish is OK");
    assert_eq!(crate::util::mounts_under(t.parent().unwrap()).len(), 1);
    let stats = call::<_, NodeGetVolumeStatsResponse>(
        &p.socket,
        "/csi.v1.Node/NodeGetVolumeStats",
        NodeGetVolumeStatsRequest {
            volume_id: "nfs-1".into(),
            volume_path: t.to_string_lossy().into_owned(),
            ..Default::default()
        },
    )
    .unwrap_err();
    assert_eq!(stats.code(), tonic::Code::Unimplemented, "{stats:?}");
    unpublish(&p, &t).unwrap();
    unpublish(&p, &t).expect("a repeated unpublish is OK");
    assert!(crate::util::mounts_under(t.parent().unwrap()).is_empty());
    assert!(
        !t.exists(),
        "the target directory is removed after unpublish"
    );
    assert!(share.join("written-through-csi").exists(), "the data stays");

    // Refused: a mount option the node's policy does not allow, an option injection, an inline
    // ephemeral volume.
    let t2 = target(&env, "u2", "pv-bad");
    for bad in [
        [
            ("server", "127.0.0.1"),
            ("share", share.to_str().unwrap()),
            ("mountOptions", "suid"),
        ],
        [
            ("server", "127.0.0.1,nosuid"),
            ("share", share.to_str().unwrap()),
            ("x", "y"),
        ],
    ] {
        let e = publish(&p, req(&t2, &bad)).unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument, "{bad:?}: {e:?}");
        assert!(crate::util::mounts_under(t2.parent().unwrap()).is_empty());
    }
    let inline = [
        ("server", "127.0.0.1"),
        ("share", share.to_str().unwrap()),
        ("csi.storage.k8s.io/ephemeral", "true"),
    ];
    let e = publish(&p, req(&t2, &inline)).unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
    assert!(crate::util::mounts_under(t2.parent().unwrap()).is_empty());
    assert!(!t2.exists(), "a refused publish leaves no target directory");
}

/// The pod's fsGroup through `flexvol csi --kind nfs` (`volume_mount_group`, which kubelet 1.22+
/// sends to a plugin with VOLUME_MOUNT_GROUP) on the guest's real NFS server: a provisioned
/// subdirectory (its PV's token under the shared key, published to its PV by kubelet's pod info)
/// gets the group, group-write and set-gid on the server; published read-only it keeps its
/// ownership (a static export with a group: `guest_nfs_csi_publish_unpublish`; on a server that
/// hosts a provisioned export every share needs a token). Fails if the plugin drops the group (the
/// subdirectory stays group 0).
#[test]
#[ignore = "guest tier: needs a kernel NFS server; run inside the test VM"]
fn guest_nfs_csi_volume_mount_group_applies_to_a_provisioned_subdirectory_only() {
    use crate::root_csi::{Plugin, publish, target, unpublish};
    use flexvol::csi::proto::*;
    use flexvol::node::capability::{Key, Location};
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    require_server();
    let env = Env::new();
    let key_file = env.root().join("nfs.key");
    std::fs::write(&key_file, b"the guest's shared NFS key......").unwrap();
    std::fs::set_permissions(&key_file, std::fs::Permissions::from_mode(0o400)).unwrap();
    let provisioned_export = export_dir("csi-fsg");
    let sub = provisioned_export.join("pvc-c_ns_c");
    std::fs::create_dir_all(sub.join("d")).unwrap();
    std::fs::write(sub.join("d/f"), b"x").unwrap();
    env.reconfigure(json!({ "nfs": {
        "provisionedExports": [format!("127.0.0.1:{}", provisioned_export.display())],
        "capabilityKeyFile": key_file,
    }}));
    let key = Key::load(&key_file, "test").unwrap();
    let sub_s = sub.to_str().unwrap().to_owned();
    let token = key.sign_for(
        "pvc-c",
        "ns",
        &Location::Nfs {
            server: "127.0.0.1",
            share: &sub_s,
        },
    );
    let stat = |p: &Path| {
        let m = std::fs::symlink_metadata(p).unwrap();
        (m.uid(), m.gid(), m.mode() & 0o7777)
    };
    let p = Plugin::start_with(&env, &["--kind", "nfs"]);
    let req = |t: &Path, share: &str, readonly: bool, token: &str| {
        let mut ctx: std::collections::HashMap<String, String> = [
            ("server", "127.0.0.1"),
            ("share", share),
            ("csi.storage.k8s.io/pod.namespace", "ns"),
            ("csi.storage.k8s.io/pod.name", "p"),
            ("csi.storage.k8s.io/ephemeral", "false"),
        ]
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
        ctx.insert("capabilityToken".into(), token.into());
        NodePublishVolumeRequest {
            volume_id: "nfs-fsg".into(),
            target_path: t.to_string_lossy().into_owned(),
            volume_capability: Some(VolumeCapability {
                block: None,
                mount: Some(MountVolume {
                    volume_mount_group: "2345".into(),
                    ..Default::default()
                }),
                access_mode: Some(AccessMode { mode: 1 }),
            }),
            readonly,
            volume_context: ctx,
            ..Default::default()
        }
    };
    let sub_before = stat(&sub);
    assert_eq!(sub_before.1, 0);
    let t = target(&env, "u2", "pvc-c");
    publish(&p, req(&t, &sub_s, true, &token)).unwrap();
    unpublish(&p, &t).unwrap();
    assert_eq!(stat(&sub), sub_before, "read-only: untouched");
    let t = target(&env, "u3", "pvc-c");
    publish(&p, req(&t, &sub_s, false, &token)).unwrap();
    let (_, gid, mode) = stat(&sub);
    assert_eq!(gid, 2345, "applied on the server");
    assert_eq!(mode & 0o2070, 0o2070, "{mode:o}");
    assert_eq!(stat(&sub.join("d/f")).1, 2345);
    assert_eq!(stat(&t).1, 2345, "the pod's view");
    unpublish(&p, &t).unwrap();
    assert!(crate::util::mounts_under(&env.root()).is_empty());
}

/// kubelet's NodePublishVolume to `flexvol csi --kind nfs` when the plugin is killed (SIGKILL)
/// mid-publish — before `mount.nfs`, and after the kernel mounted the export but before the
/// reply — and kubelet retries it against the restarted plugin: one mount of the export at the
/// target, never two, the bytes on the server readable through it; unpublish leaves nothing.
#[test]
#[ignore = "guest tier: needs a kernel NFS server; run inside the test VM"]
fn guest_nfs_csi_publish_killed_mid_call_converges_on_the_retry() {
    use crate::root_csi::{Plugin, mount_cap, publish, target, unpublish};
    use flexvol::csi::proto::*;
    require_server();
    let env = Env::new();
    let share = export_dir("csi-kill");
    std::fs::write(share.join("before"), "written before").unwrap();
    let req = |t: &Path| NodePublishVolumeRequest {
        volume_id: "nfs-k".into(),
        target_path: t.to_string_lossy().into_owned(),
        volume_capability: mount_cap(),
        volume_context: [
            ("server", "127.0.0.1"),
            ("share", share.to_str().unwrap()),
            ("csi.storage.k8s.io/pod.namespace", "ns"),
            ("csi.storage.k8s.io/pod.name", "p"),
        ]
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect(),
        ..Default::default()
    };
    for (i, at) in ["nfs-mount-before-mount", "nfs-mount-after-mount"]
        .into_iter()
        .enumerate()
    {
        let t = target(&env, &format!("u{i}"), "pv-nfs-k");
        let mut dying =
            Plugin::start_with_env(&env, &["--kind", "nfs"], &[("FLEXVOL_TEST_KILL_AT", at)]);
        let e = publish(&dying, req(&t)).expect_err("the plugin dies mid-call");
        assert_ne!(e.code(), tonic::Code::Ok, "{at}");
        let until = std::time::Instant::now() + Duration::from_secs(10);
        while !dying.exited() {
            assert!(
                std::time::Instant::now() < until,
                "{at}: the plugin did not die"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        drop(dying);
        let before = crate::util::mounts_under(t.parent().unwrap()).len();
        assert_eq!(
            before,
            usize::from(at == "nfs-mount-after-mount"),
            "{at}: what the kill left mounted"
        );
        let p = Plugin::start_with(&env, &["--kind", "nfs"]);
        publish(&p, req(&t)).unwrap_or_else(|e| panic!("{at}: the retry: {e:?}"));
        publish(&p, req(&t)).unwrap_or_else(|e| panic!("{at}: a second retry: {e:?}"));
        let m = crate::util::mounts_under(t.parent().unwrap());
        assert_eq!(m, vec![t.clone()], "{at}: one mount at the target");
        assert_eq!(
            std::fs::read_to_string(t.join("before")).unwrap(),
            "written before",
            "{at}"
        );
        std::fs::write(t.join(format!("after-{i}")), "x").unwrap();
        assert!(share.join(format!("after-{i}")).exists(), "{at}");
        unpublish(&p, &t).unwrap();
        assert!(
            crate::util::mounts_under(t.parent().unwrap()).is_empty(),
            "{at}"
        );
        assert!(!t.exists(), "{at}: the target is removed");
    }
    assert!(env.mounts().is_empty());
}
