//! Root tier: the hostPath backend against real bind mounts on this machine.

use crate::require_root;
use crate::util::{Env, hostpath_options as opts};
use serde_json::json;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

fn mount(env: &Env, pod: &Path, j: &str) -> crate::util::Reply {
    env.call("hostpath", &["mount", pod.to_str().unwrap(), j])
}

fn unmount(env: &Env, pod: &Path) -> crate::util::Reply {
    env.call("hostpath", &["unmount", pod.to_str().unwrap()])
}

fn bind(src: &Path, at: &Path) {
    nix::mount::mount(
        Some(src),
        at,
        None::<&str>,
        nix::mount::MsFlags::MS_BIND,
        None::<&str>,
    )
    .unwrap();
}

fn tmpfs(at: &Path) {
    nix::mount::mount(
        Some("flexvol-test"),
        at,
        Some("tmpfs"),
        nix::mount::MsFlags::empty(),
        Some("size=1m"),
    )
    .unwrap();
}

fn record_of(env: &Env, pod: &Path) -> Option<serde_json::Value> {
    let f = env.state.join("hostpath").join(format!(
        "{}.json",
        flexvol::node::state::file_key(&pod.to_string_lossy())
    ));
    std::fs::read(f)
        .ok()
        .map(|d| serde_json::from_slice(&d).unwrap())
}

fn write_record(env: &Env, pod: &Path, rec: serde_json::Value) {
    let dir = env.state.join("hostpath");
    std::fs::create_dir_all(&dir).unwrap();
    let f = dir.join(format!(
        "{}.json",
        flexvol::node::state::file_key(&pod.to_string_lossy())
    ));
    std::fs::write(f, rec.to_string()).unwrap();
}

fn mount_count(at: &Path) -> usize {
    flexvol::sys::mountinfo::MountTable::read()
        .unwrap()
        .all_at(at)
        .count()
}

#[test]
fn root_rw_and_ro_binds_of_one_source() {
    require_root!();
    let env = Env::new();
    let src = env.mkdir("data");
    std::fs::write(src.join("hello"), "hi").unwrap();
    let rw = env.pod_dir("pod-rw", "v");
    let ro = env.pod_dir("pod-ro", "v");
    mount(&env, &rw, &opts(&src, json!({"type": "Directory"}))).ok();
    mount(
        &env,
        &ro,
        &opts(
            &src,
            json!({"type": "Directory", "kubernetes.io/readwrite": "ro"}),
        ),
    )
    .ok();

    // A write through the rw pod mount lands in the source.
    std::fs::write(rw.join("from-pod"), "x").unwrap();
    assert_eq!(std::fs::read_to_string(src.join("from-pod")).unwrap(), "x");
    // The ro pod mount refuses writes with EROFS...
    let e = std::fs::write(ro.join("nope"), "x").unwrap_err();
    assert_eq!(e.raw_os_error(), Some(nix::libc::EROFS));
    assert_eq!(std::fs::read_to_string(ro.join("hello")).unwrap(), "hi");
    // ...without making the source or the other pod's bind read-only.
    std::fs::write(src.join("still-writable"), "y").unwrap();
    std::fs::write(rw.join("still-writable-2"), "y").unwrap();

    unmount(&env, &ro).ok();
    unmount(&env, &rw).ok();
    assert!(env.mounts().is_empty(), "left mounted: {:?}", env.mounts());
    assert_eq!(
        std::fs::read_to_string(src.join("from-pod")).unwrap(),
        "x",
        "unmount must not touch data"
    );
    assert!(
        !env.state.join("hostpath").read_dir().unwrap().any(|e| e
            .unwrap()
            .file_name()
            .to_string_lossy()
            .ends_with(".json"))
    );
}

#[test]
fn root_mount_twice_is_one_mount_and_unmount_is_idempotent() {
    require_root!();
    let env = Env::new();
    let src = env.mkdir("data");
    let pod = env.pod_dir("u1", "v");
    let j = opts(&src, json!({}));
    mount(&env, &pod, &j).ok();
    mount(&env, &pod, &j).ok();
    assert_eq!(mount_count(&pod), 1);
    unmount(&env, &pod).ok();
    unmount(&env, &pod).ok();
    assert_eq!(mount_count(&pod), 0);
    // Never mounted, and gone entirely.
    let never = env.pod_dir("u2", "v");
    unmount(&env, &never).ok();
    std::fs::remove_dir(&never).unwrap();
    unmount(&env, &never).ok();
}

#[test]
fn root_crash_between_bind_and_readonly_remount_converges() {
    require_root!();
    let env = Env::new();
    let src = env.mkdir("data");
    let pod = env.pod_dir("u1", "v");
    let j = opts(&src, json!({"kubernetes.io/readwrite": "ro"}));
    // A kill -9 after the bind but before the remount leaves a writable bind and a record that
    // says read-only.
    env.killed_at(
        "hostpath",
        &["mount", pod.to_str().unwrap(), &j],
        "mount-bind-before-readonly",
    );
    assert_eq!(mount_count(&pod), 1);
    std::fs::write(pod.join("x"), "x").unwrap();
    mount(&env, &pod, &j).ok();
    assert_eq!(mount_count(&pod), 1);
    let e = std::fs::write(pod.join("y"), "y").unwrap_err();
    assert_eq!(e.raw_os_error(), Some(nix::libc::EROFS));
    // Something else mounted there is not silently accepted.
    let other = env.mkdir("other");
    mount(
        &env,
        &pod,
        &opts(&other, json!({"kubernetes.io/readwrite": "ro"})),
    )
    .failed("another volume");
    unmount(&env, &pod).ok();
    assert!(env.mounts().is_empty());
}

#[test]
fn root_sixteen_concurrent_mounts_of_one_source() {
    require_root!();
    let env = Env::new();
    let src = env.root().join("shared");
    let pods: Vec<_> = (0..16)
        .map(|i| env.pod_dir(&format!("pod-{i}"), "v"))
        .collect();
    let j = opts(&src, json!({"type": "DirectoryOrCreate"}));
    std::thread::scope(|s| {
        for p in &pods {
            let (env, j) = (&env, &j);
            s.spawn(move || mount(env, p, j).ok().clone());
        }
    });
    for p in &pods {
        assert_eq!(mount_count(p), 1, "{}", p.display());
    }
    std::fs::write(pods[3].join("f"), "3").unwrap();
    assert_eq!(std::fs::read_to_string(pods[11].join("f")).unwrap(), "3");
    std::thread::scope(|s| {
        for p in &pods {
            let env = &env;
            s.spawn(move || unmount(env, p).ok().clone());
        }
    });
    assert!(env.mounts().is_empty(), "left mounted: {:?}", env.mounts());
}

#[test]
fn root_paths_with_spaces_and_non_ascii() {
    require_root!();
    let env = Env::new();
    let src = env.mkdir("dätä with spaces/ünïcode ✓");
    let pod = env.pod_dir("pod with space", "vol ü");
    std::fs::write(src.join("f"), "1").unwrap();
    mount(&env, &pod, &opts(&src, json!({"type": "Directory"}))).ok();
    assert_eq!(std::fs::read_to_string(pod.join("f")).unwrap(), "1");
    mount(&env, &pod, &opts(&src, json!({"type": "Directory"}))).ok();
    assert_eq!(mount_count(&pod), 1);
    unmount(&env, &pod).ok();
    assert!(env.mounts().is_empty());
}

#[test]
fn root_symlink_escape_from_allowed_root_is_refused() {
    require_root!();
    let env = Env::new();
    env.reconfigure(json!({"hostpath": {"allowedRoots": [env.root().join("allowed")]}}));
    let allowed = env.mkdir("allowed");
    let outside = env.mkdir("outside");
    std::fs::write(outside.join("secret"), "s").unwrap();
    std::os::unix::fs::symlink(&outside, allowed.join("escape")).unwrap();
    let pod = env.pod_dir("u", "v");
    mount(&env, &pod, &opts(&allowed.join("escape"), json!({})))
        .failed("outside the allowed roots");
    mount(
        &env,
        &pod,
        &opts(
            &allowed.join("escape/sub"),
            json!({"type": "DirectoryOrCreate"}),
        ),
    )
    .failed("outside the allowed roots");
    assert!(
        !outside.join("sub").exists(),
        "nothing may be created outside the roots"
    );
    mount(&env, &pod, &opts(&outside, json!({}))).failed("outside the allowed roots");
    // Inside the root is fine, including through a symlink that stays inside.
    let inner = env.mkdir("allowed/inner");
    std::os::unix::fs::symlink(&inner, allowed.join("link-in")).unwrap();
    mount(&env, &pod, &opts(&allowed.join("link-in"), json!({}))).ok();
    unmount(&env, &pod).ok();
    assert!(env.mounts().is_empty());
}

#[test]
fn root_system_locations_and_kubelet_root_are_refused_by_default() {
    require_root!();
    // The node's default policy: no allowedRoots.
    let env = Env::with_config(json!({"hostpath": {}}));
    let pod = env.pod_dir("u", "v");
    for p in [
        "/",
        "/etc",
        "/etc/ssl",
        "/proc",
        "/sys/kernel",
        "/dev",
        "/boot",
    ] {
        mount(&env, &pod, &opts(Path::new(p), json!({}))).failed("refused");
    }
    // The fake kubelet root of this pod dir, its pods, and an ancestor of it.
    for p in [
        env.root().join("kubelet"),
        env.root().join("kubelet/pods/other"),
        env.root(),
    ] {
        mount(&env, &pod, &opts(&p, json!({}))).failed("kubelet directory");
    }
    for bad in [r#""relative/path""#, r#""/srv/../etc""#, r#""""#] {
        let j = format!(r#"{{"path":{bad}}}"#);
        mount(&env, &pod, &j).failed("path");
    }
    assert!(env.mounts().is_empty());
}

#[test]
fn root_types_create_and_check() {
    require_root!();
    let env = Env::new();
    let pod = env.pod_dir("u", "v");
    // DirectoryOrCreate creates with the requested owner and mode (no umask).
    let d = env.root().join("made/deep");
    mount(
        &env,
        &pod,
        &opts(
            &d,
            json!({"type": "DirectoryOrCreate", "uid": "1234", "gid": "2345", "mode": "0770"}),
        ),
    )
    .ok();
    let m = std::fs::metadata(&d).unwrap();
    assert_eq!(
        (m.uid(), m.gid(), m.permissions().mode() & 0o7777),
        (1234, 2345, 0o770)
    );
    unmount(&env, &pod).ok();
    // Directory that does not exist: Failure, nothing created.
    let missing = env.root().join("missing");
    mount(&env, &pod, &opts(&missing, json!({"type": "Directory"}))).failed("does not exist");
    assert!(!missing.exists());
    mount(&env, &pod, &opts(&missing, json!({}))).failed("does not exist");
    // Type mismatches.
    let file = env.root().join("a-file");
    std::fs::write(&file, "f").unwrap();
    mount(&env, &pod, &opts(&file, json!({"type": "Directory"}))).failed("needs a directory");
    mount(&env, &pod, &opts(&d, json!({"type": "File"}))).failed("needs a regular file");
    let ctl = env.root().join("ctl\tname");
    mount(
        &env,
        &pod,
        &opts(&ctl, json!({"type": "DirectoryOrCreate"})),
    )
    .failed("control characters");
    assert!(!ctl.exists());
    mount(&env, &pod, &opts(&file, json!({"type": "Socket"}))).failed("needs a socket");
    mount(&env, &pod, &opts(&file, json!({"type": "CharDevice"})))
        .failed("needs a character device");
    mount(&env, &pod, &opts(&file, json!({"type": "BlockDevice"}))).failed("needs a block device");
    // FileOrCreate does not create parents, as in Kubernetes.
    mount(
        &env,
        &pod,
        &opts(&env.root().join("nodir/f"), json!({"type": "FileOrCreate"})),
    )
    .failed("parent directory");
    assert!(env.mounts().is_empty());
}

#[test]
fn root_file_like_sources_appear_inside_the_pod_dir() {
    require_root!();
    let env = Env::new();
    let pod = env.pod_dir("u", "v");
    let f = env.root().join("config.yaml");
    mount(
        &env,
        &pod,
        &opts(&f, json!({"type": "FileOrCreate", "mode": "0600"})),
    )
    .ok();
    assert_eq!(
        std::fs::metadata(&f).unwrap().permissions().mode() & 0o777,
        0o600
    );
    std::fs::write(pod.join("config.yaml"), "written via pod").unwrap();
    assert_eq!(std::fs::read_to_string(&f).unwrap(), "written via pod");
    mount(&env, &pod, &opts(&f, json!({"type": "File"}))).ok();
    assert_eq!(mount_count(&pod.join("config.yaml")), 1);
    unmount(&env, &pod).ok();
    assert!(env.mounts().is_empty());
    // The placeholder is gone so kubelet can rmdir; the source keeps its content.
    assert_eq!(std::fs::read_dir(&pod).unwrap().count(), 0);
    std::fs::remove_dir(&pod).unwrap();
    assert_eq!(std::fs::read_to_string(&f).unwrap(), "written via pod");

    // A socket, read-only, also by name inside the pod dir.
    let pod2 = env.pod_dir("u2", "v");
    let sock = env.root().join("app.sock");
    let _listener = std::os::unix::net::UnixListener::bind(&sock).unwrap();
    mount(
        &env,
        &pod2,
        &opts(
            &sock,
            json!({"type": "Socket", "kubernetes.io/readwrite": "ro"}),
        ),
    )
    .ok();
    assert_eq!(mount_count(&pod2.join("app.sock")), 1);
    // Unmount works from the mount table alone when the state record is lost.
    std::fs::remove_dir_all(env.state.join("hostpath")).unwrap();
    unmount(&env, &pod2).ok();
    assert!(env.mounts().is_empty());
    assert!(sock.exists());
}

#[test]
fn root_char_and_block_devices_with_allowed_roots() {
    require_root!();
    let env = Env::with_config(json!({"hostpath": {"allowedRoots": ["/dev/null", "/dev/loop0"]}}));
    let pod = env.pod_dir("u", "v");
    mount(
        &env,
        &pod,
        &opts(Path::new("/dev/null"), json!({"type": "CharDevice"})),
    )
    .ok();
    std::fs::write(pod.join("null"), "discarded").unwrap();
    unmount(&env, &pod).ok();
    if Path::new("/dev/loop0").exists() {
        mount(
            &env,
            &pod,
            &opts(Path::new("/dev/loop0"), json!({"type": "BlockDevice"})),
        )
        .ok();
        unmount(&env, &pod).ok();
    }
    mount(
        &env,
        &pod,
        &opts(Path::new("/dev/zero"), json!({"type": "CharDevice"})),
    )
    .failed("outside the allowed roots");
    assert!(env.mounts().is_empty());
}

#[test]
fn root_path_pattern_places_each_volume_in_its_own_directory() {
    require_root!();
    let env = Env::new();
    let base = env.mkdir("volumes");
    let pod = env.pod_dir("u", "v");
    mount(&env, &pod, &opts(&base, json!({"type": "Directory", "pathPattern": "{namespace}/{volume}", "uid": "1000", "mode": "0700"}))).ok();
    let made = base.join("team-a/pv-1");
    let m = std::fs::metadata(&made).unwrap();
    assert_eq!((m.uid(), m.permissions().mode() & 0o777), (1000, 0o700));
    std::fs::write(pod.join("f"), "x").unwrap();
    assert!(made.join("f").exists());
    unmount(&env, &pod).ok();
    assert!(env.mounts().is_empty());
}

#[test]
fn root_kill_9_before_bind_then_retry_converges() {
    require_root!();
    let env = Env::new();
    let src = env.mkdir("data");
    let pod = env.pod_dir("u", "v");
    let j = opts(&src, json!({"kubernetes.io/readwrite": "ro"}));
    env.killed_at(
        "hostpath",
        &["mount", pod.to_str().unwrap(), &j],
        "hostpath-mount-before-bind",
    );
    assert_eq!(mount_count(&pod), 0);
    // The record of the intended mount survives the crash; the retry converges.
    mount(&env, &pod, &j).ok();
    assert_eq!(mount_count(&pod), 1);
    unmount(&env, &pod).ok();
    assert!(env.mounts().is_empty());
}

/// `FLEXVOL_TEST_KILL_ONCE` (what deploy-e2e sets on the CSI containers of a DaemonSet, which come
/// back with the same environment): the checkpoint kills only while its marker exists, and
/// removes it first, so one planted marker is one kill and the retry with the same environment
/// converges.
#[test]
fn root_kill_once_kills_only_while_its_marker_exists_and_only_once() {
    require_root!();
    let env = Env::new();
    let src = env.mkdir("data");
    let pod = env.pod_dir("u", "v");
    let j = opts(&src, json!({}));
    let marker = env.root().join("kill-once");
    let at = "hostpath-mount-before-bind";
    let vars = [
        ("FLEXVOL_TEST_KILL_AT", at),
        ("FLEXVOL_TEST_KILL_ONCE", marker.to_str().unwrap()),
    ];
    let args = ["mount", pod.to_str().unwrap(), &j];
    // No marker: no kill.
    env.call_env("hostpath", &args, &vars).ok();
    assert_eq!(mount_count(&pod), 1);
    unmount(&env, &pod).ok();
    // A marker: killed at the checkpoint, the marker gone, nothing mounted.
    std::fs::write(&marker, b"").unwrap();
    env.killed_at_env("hostpath", &args, at, &vars[1..]);
    assert!(!marker.exists(), "the kill did not consume its marker");
    assert_eq!(mount_count(&pod), 0);
    // The same environment again: the retry converges.
    env.call_env("hostpath", &args, &vars).ok();
    assert_eq!(mount_count(&pod), 1);
    unmount(&env, &pod).ok();
    assert!(env.mounts().is_empty());
}

/// Issue #10 item 2: with a shared source (systemd's default for /), a bind used to join the
/// source's peer group. A mount made inside the pod's bind then appeared on the host, a mount
/// that appeared later inside the source made `unmount` answer "busy" forever, and without a
/// record `unmount` unmounted the host's own submount through propagation.
#[test]
fn root_shared_source_nothing_propagates_back_and_unmount_leaves_host_submounts() {
    require_root!();
    let env = Env::new();
    let src = env.mkdir("data");
    // Make the source a shared mount of its own, as every mount is on a systemd host.
    bind(&src, &src);
    nix::mount::mount(
        None::<&str>,
        &src,
        None::<&str>,
        nix::mount::MsFlags::MS_SHARED,
        None::<&str>,
    )
    .unwrap();
    std::fs::create_dir(src.join("from-pod")).unwrap();
    std::fs::create_dir(src.join("host-sub")).unwrap();
    let pod = env.pod_dir("u", "v");
    mount(&env, &pod, &opts(&src, json!({"type": "Directory"}))).ok();

    // Pod -> host: a mount inside the pod's bind must not appear in the source.
    tmpfs(&pod.join("from-pod"));
    assert_eq!(mount_count(&pod.join("from-pod")), 1);
    assert_eq!(
        mount_count(&src.join("from-pod")),
        0,
        "a mount made in the pod's bind propagated to the host"
    );
    nix::mount::umount2(&pod.join("from-pod"), nix::mount::MntFlags::empty()).unwrap();

    // Host -> pod still propagates (like kubelet's HostToContainer)...
    tmpfs(&src.join("host-sub"));
    std::fs::write(src.join("host-sub/marker"), "host").unwrap();
    // ...and unmount still succeeds, detaching only the pod's bind.
    unmount(&env, &pod).ok();
    assert_eq!(mount_count(&pod), 0);
    assert_eq!(mount_count(&pod.join("host-sub")), 0);
    assert_eq!(
        mount_count(&src.join("host-sub")),
        1,
        "the host's own submount was unmounted"
    );
    assert_eq!(
        std::fs::read_to_string(src.join("host-sub/marker")).unwrap(),
        "host"
    );

    // Without a record (state lost), the same: only the bind goes.
    mount(&env, &pod, &opts(&src, json!({"type": "Directory"}))).ok();
    std::fs::create_dir(src.join("later")).unwrap();
    tmpfs(&src.join("later"));
    std::fs::remove_dir_all(env.state.join("hostpath")).unwrap();
    unmount(&env, &pod).ok();
    assert_eq!(mount_count(&pod), 0);
    assert_eq!(mount_count(&src.join("host-sub")), 1);
    assert_eq!(mount_count(&src.join("later")), 1);
    assert_eq!(
        std::fs::read_to_string(src.join("host-sub/marker")).unwrap(),
        "host"
    );
}

/// Issue #10 item 5: `unmount` followed a symlinked pod directory, unmounted a foreign bind and
/// deleted the empty file it was mounted on; `unmount /` walked into /proc. Only kubelet-shaped
/// volume directories of this driver are acted on, never through a symlink.
#[test]
fn root_unmount_acts_only_on_this_drivers_pod_dirs_and_never_through_a_symlink() {
    require_root!();
    let env = Env::new();
    // A foreign bind of a file onto an empty file, somewhere on the node.
    let foreign = env.mkdir("foreign");
    std::fs::write(foreign.join("target"), "").unwrap();
    std::fs::write(env.root().join("precious"), "data").unwrap();
    bind(&env.root().join("precious"), &foreign.join("target"));
    let check_foreign = |what: &str| {
        assert_eq!(mount_count(&foreign.join("target")), 1, "{what}");
        assert_eq!(
            std::fs::read_to_string(foreign.join("target")).unwrap(),
            "data",
            "{what}"
        );
    };

    // The volume directory itself is a symlink to it.
    let plugin = env.mkdir("kubelet/pods/u1/volumes/flexvol~hostpath");
    std::os::unix::fs::symlink(&foreign, plugin.join("v")).unwrap();
    unmount(&env, &plugin.join("v")).failed("symlink");
    check_foreign("symlinked volume dir");
    // A directory above it is.
    let elsewhere = env.mkdir("elsewhere");
    std::fs::create_dir_all(elsewhere.join("volumes/flexvol~hostpath")).unwrap();
    std::os::unix::fs::symlink(&foreign, elsewhere.join("volumes/flexvol~hostpath/v")).unwrap();
    std::os::unix::fs::symlink(&elsewhere, env.root().join("kubelet/pods/u2")).unwrap();
    let via = env
        .root()
        .join("kubelet/pods/u2/volumes/flexvol~hostpath/v");
    unmount(&env, &via).failed("symlink");
    check_foreign("symlinked pod dir");
    // Directories of another shape, or of another plugin, are never acted on.
    unmount(&env, &foreign).failed("not a pod volume directory");
    check_foreign("plain directory");
    let secret = env.mkdir("kubelet/pods/u3/volumes/kubernetes.io~secret/token");
    tmpfs(&secret);
    unmount(&env, &secret).failed("not a volume directory of this driver");
    assert_eq!(
        mount_count(&secret),
        1,
        "kubelet's secret volume was unmounted"
    );
    mount(&env, &secret, &opts(&env.mkdir("data"), json!({})))
        .failed("not a volume directory of this driver");
    // `..` and /proc/self/root are refused, by mount and unmount alike.
    let pod = env.pod_dir("u4", "v");
    let dotdot = env
        .root()
        .join("kubelet/pods/u4/volumes/flexvol~hostpath/../flexvol~hostpath/v");
    unmount(&env, &dotdot).failed("..");
    mount(&env, &dotdot, &opts(&env.mkdir("data"), json!({}))).failed("..");
    let proc_root = Path::new("/proc/self/root").join(pod.strip_prefix("/").unwrap());
    unmount(&env, &proc_root).failed("/proc");
    mount(&env, &proc_root, &opts(&env.mkdir("data"), json!({}))).failed("/proc");

    // `unmount /`, in a mount namespace of its own in case it ever acts.
    let out = std::process::Command::new("/usr/bin/unshare")
        .args(["--mount", "--propagation", "private", "--"])
        .arg(env.driver("hostpath"))
        .args(["unmount", "/"])
        .env("FLEXVOL_CONFIG", &env.config)
        .output()
        .unwrap();
    crate::util::check_protocol(&out.stdout, &out.stderr, out.status.code())
        .failed("not a pod volume directory");
    nix::mount::umount2(&secret, nix::mount::MntFlags::empty()).unwrap();
    nix::mount::umount2(&foreign.join("target"), nix::mount::MntFlags::empty()).unwrap();
    assert!(env.mounts().is_empty());
}

/// Issue #10 item 6: a record whose mount point lies outside its target made `unmount` delete a
/// file in a volume's source and unmount an unrelated tmpfs; a record whose mount point holds a
/// mount of something else made it unmount that.
#[test]
fn root_records_are_checked_against_their_target_and_the_mount() {
    require_root!();
    let env = Env::new();
    let src = env.mkdir("data");
    std::fs::write(src.join("victim"), "").unwrap();
    let unrelated = env.mkdir("unrelated");
    tmpfs(&unrelated);
    let pod = env.pod_dir("u", "v");
    let rec = |mount_point: &Path| {
        json!({"backend": "hostpath", "verb": "mount", "target": pod, "mountPoint": mount_point,
               "source": src, "readOnly": false, "since": 1})
    };
    for outside in [src.join("victim"), unrelated.clone(), pod.join("a/../../x")] {
        write_record(&env, &pod, rec(&outside));
        unmount(&env, &pod).failed("corrupt");
        assert!(
            src.join("victim").exists(),
            "a file in a source was deleted"
        );
        assert_eq!(
            mount_count(&unrelated),
            1,
            "an unrelated mount was unmounted"
        );
    }
    // Inside the target, but the mount there is not of the recorded source: left alone.
    let other = env.root().join("other-file");
    std::fs::write(&other, "other").unwrap();
    std::fs::write(pod.join("sock"), "").unwrap();
    bind(&other, &pod.join("sock"));
    let mut r = rec(&pod.join("sock"));
    r["source"] = json!(src.join("victim"));
    write_record(&env, &pod, r);
    unmount(&env, &pod).failed("did not make");
    assert_eq!(mount_count(&pod.join("sock")), 1);
    nix::mount::umount2(&pod.join("sock"), nix::mount::MntFlags::empty()).unwrap();
    nix::mount::umount2(&unrelated, nix::mount::MntFlags::empty()).unwrap();
    assert!(env.mounts().is_empty());
}

/// Issue #10 item 12: a read-only request on an existing read-write mount silently turned it
/// read-only while the record kept saying read-write.
#[test]
fn root_access_mode_mismatch_is_refused_and_the_record_agrees_with_the_mount() {
    require_root!();
    let env = Env::new();
    let src = env.mkdir("data");
    let pod = env.pod_dir("u", "v");
    mount(&env, &pod, &opts(&src, json!({}))).ok();
    mount(
        &env,
        &pod,
        &opts(&src, json!({"kubernetes.io/readwrite": "ro"})),
    )
    .failed("already mounted read-write");
    std::fs::write(pod.join("still-writable"), "x").expect("the mount must stay read-write");
    assert_eq!(record_of(&env, &pod).unwrap()["readOnly"], false);
    unmount(&env, &pod).ok();
    mount(
        &env,
        &pod,
        &opts(&src, json!({"kubernetes.io/readwrite": "ro"})),
    )
    .ok();
    mount(&env, &pod, &opts(&src, json!({}))).failed("already mounted read-only");
    assert_eq!(record_of(&env, &pod).unwrap()["readOnly"], true);
    assert!(std::fs::write(pod.join("nope"), "x").is_err());
    // A lost record is written again from the mount, and agrees with it.
    std::fs::remove_dir_all(env.state.join("hostpath")).unwrap();
    mount(
        &env,
        &pod,
        &opts(&src, json!({"kubernetes.io/readwrite": "ro"})),
    )
    .ok();
    assert_eq!(record_of(&env, &pod).unwrap()["readOnly"], true);
    unmount(&env, &pod).ok();
    assert!(env.mounts().is_empty());
}

/// Issue #10 item 12: a directory source then a file source on one pod directory overwrote each
/// other's record and left a placeholder inside the other volume's source.
#[test]
fn root_directory_and_file_sources_on_one_pod_dir_are_kept_apart() {
    require_root!();
    let env = Env::new();
    let dir_src = env.mkdir("dir-src");
    let file_src = env.root().join("file-src");
    std::fs::write(&file_src, "f").unwrap();
    let pod = env.pod_dir("u", "v");
    mount(&env, &pod, &opts(&dir_src, json!({}))).ok();
    mount(&env, &pod, &opts(&file_src, json!({}))).failed("another volume");
    assert!(
        !dir_src.join("file-src").exists(),
        "a placeholder was left in the other volume's source"
    );
    assert_eq!(record_of(&env, &pod).unwrap()["source"], json!(dir_src));
    // Without the record, the mount itself still keeps them apart.
    std::fs::remove_dir_all(env.state.join("hostpath")).unwrap();
    mount(&env, &pod, &opts(&file_src, json!({}))).failed("mount point");
    assert!(!dir_src.join("file-src").exists());
    unmount(&env, &pod).ok();
    assert!(env.mounts().is_empty());

    // The other way round.
    mount(&env, &pod, &opts(&file_src, json!({}))).ok();
    mount(&env, &pod, &opts(&dir_src, json!({}))).failed("another volume");
    assert_eq!(mount_count(&pod), 0);
    assert_eq!(mount_count(&pod.join("file-src")), 1);
    std::fs::remove_dir_all(env.state.join("hostpath")).unwrap();
    mount(&env, &pod, &opts(&dir_src, json!({}))).failed("not empty");
    assert_eq!(mount_count(&pod), 0);
    unmount(&env, &pod).ok();
    assert!(env.mounts().is_empty());
    assert_eq!(std::fs::read_dir(&pod).unwrap().count(), 0);
    assert_eq!(std::fs::read_to_string(&file_src).unwrap(), "f");
}

/// Issue #10 item 12: a Failure created things: `DirectoryOrCreate` onto a target that is already
/// a mount created the directories first.
#[test]
fn root_a_failure_creates_nothing_when_the_target_is_taken() {
    require_root!();
    let env = Env::new();
    let pod = env.pod_dir("u", "v");
    tmpfs(&pod);
    let made = env.root().join("made/deep");
    mount(
        &env,
        &pod,
        &opts(&made, json!({"type": "DirectoryOrCreate"})),
    )
    .failed("mount point of something else");
    assert!(
        !env.root().join("made").exists(),
        "a Failure created directories"
    );
    let f = env.root().join("new-file");
    mount(&env, &pod, &opts(&f, json!({"type": "FileOrCreate"}))).failed("mount point");
    assert!(!f.exists(), "a Failure created a file");
    nix::mount::umount2(&pod, nix::mount::MntFlags::empty()).unwrap();
    // A record of another volume keeps a new source from being created, too.
    let src = env.mkdir("data");
    mount(&env, &pod, &opts(&src, json!({}))).ok();
    mount(
        &env,
        &pod,
        &opts(&made, json!({"type": "DirectoryOrCreate"})),
    )
    .failed("another volume");
    assert!(!env.root().join("made").exists());
    unmount(&env, &pod).ok();
    assert!(env.mounts().is_empty());
}

/// A source path whose components are swapped between a directory and a symlink to outside the
/// allowed root while mounts run: every mount either fails or binds the directory inside.
#[test]
fn root_symlink_swap_race_never_mounts_outside_the_root() {
    require_root!();
    let env = Env::new();
    env.reconfigure(json!({"hostpath": {"allowedRoots": [env.root().join("allowed")]}}));
    let allowed = env.mkdir("allowed");
    let outside = env.mkdir("outside");
    std::fs::write(outside.join("secret"), "s").unwrap();
    let real = env.mkdir("allowed/real");
    std::fs::write(real.join("inside"), "i").unwrap();
    let flip = allowed.join("flip");
    let stop = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        s.spawn(|| {
            let tmp_link = allowed.join(".flip-link");
            let tmp_dir = allowed.join(".flip-dir");
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let _ = std::os::unix::fs::symlink(&real, &tmp_dir);
                let _ = std::fs::rename(&tmp_dir, &flip);
                let _ = std::os::unix::fs::symlink(&outside, &tmp_link);
                let _ = std::fs::rename(&tmp_link, &flip);
            }
        });
        for i in 0..40 {
            let pod = env.pod_dir(&format!("u{i}"), "v");
            let r = mount(&env, &pod, &opts(&flip, json!({})));
            if r.status() == "Success" {
                assert!(
                    pod.join("inside").exists() && !pod.join("secret").exists(),
                    "mounted something other than the allowed directory"
                );
                unmount(&env, &pod).ok();
            }
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
    });
    assert!(env.mounts().is_empty());
}

/// 50 calls at once: mounts and unmounts of 10 volumes, each call racing others on its volume.
/// Every volume ends with exactly its mount, record and access, then nothing.
#[test]
fn root_fifty_concurrent_calls_converge() {
    require_root!();
    let env = Env::new();
    let pods: Vec<_> = (0..10)
        .map(|i| {
            (
                env.pod_dir(&format!("p{i}"), "v"),
                opts(
                    &env.root().join(format!("vols/{i}")),
                    json!({"type": "DirectoryOrCreate",
                           "kubernetes.io/readwrite": if i % 2 == 0 { "ro" } else { "rw" }}),
                ),
            )
        })
        .collect();
    std::thread::scope(|s| {
        for k in 0..50 {
            let (pod, j) = &pods[k % 10];
            let env = &env;
            s.spawn(move || {
                if k % 5 == 3 {
                    unmount(env, pod).ok().clone()
                } else {
                    mount(env, pod, j).ok().clone()
                }
            });
        }
    });
    for (i, (pod, j)) in pods.iter().enumerate() {
        mount(&env, pod, j).ok();
        let t = flexvol::sys::mountinfo::MountTable::read().unwrap();
        let m: Vec<_> = t.all_at(pod).collect();
        assert_eq!(m.len(), 1, "{i}");
        assert_eq!(m[0].read_only(), i % 2 == 0, "{i}");
        assert_eq!(record_of(&env, pod).unwrap()["readOnly"], i % 2 == 0);
    }
    std::thread::scope(|s| {
        for (pod, _) in &pods {
            let env = &env;
            s.spawn(move || unmount(env, pod).ok().clone());
        }
    });
    assert!(env.mounts().is_empty());
    assert_eq!(
        std::fs::read_dir(env.state.join("hostpath"))
            .unwrap()
            .count(),
        0
    );
}

/// A bind a process still uses is not detached behind its back: "busy", and kubelet retries.
#[test]
fn root_unmount_of_a_bind_in_use_is_busy_until_released() {
    require_root!();
    let env = Env::new();
    let src = env.mkdir("data");
    let pod = env.pod_dir("u", "v");
    mount(&env, &pod, &opts(&src, json!({}))).ok();
    let mut user = std::process::Command::new("sleep")
        .arg("30")
        .current_dir(&pod)
        .spawn()
        .unwrap();
    unmount(&env, &pod).failed("busy");
    assert_eq!(mount_count(&pod), 1);
    assert!(record_of(&env, &pod).is_some());
    user.kill().unwrap();
    user.wait().unwrap();
    unmount(&env, &pod).ok();
    assert!(env.mounts().is_empty());
}

/// A bind an older version left in the source's peer group (shared), with a mount that
/// propagated into it: a lazy unmount of it as it is would propagate and unmount the host's
/// original. `unmount` makes it a slave first, so only the pod's side goes.
#[test]
fn root_unmount_of_an_old_shared_bind_leaves_the_hosts_submount() {
    require_root!();
    let env = Env::new();
    let src = env.mkdir("data");
    bind(&src, &src);
    nix::mount::mount(
        None::<&str>,
        &src,
        None::<&str>,
        nix::mount::MsFlags::MS_SHARED,
        None::<&str>,
    )
    .unwrap();
    std::fs::create_dir(src.join("host-sub")).unwrap();
    let pod = env.pod_dir("u", "v");
    // What the old driver made, and its record (no source identity in it).
    bind(&src, &pod);
    write_record(
        &env,
        &pod,
        json!({"backend": "hostpath", "verb": "mount", "target": pod, "source": src,
               "readOnly": false, "since": 1}),
    );
    tmpfs(&src.join("host-sub"));
    std::fs::write(src.join("host-sub/marker"), "host").unwrap();
    assert_eq!(
        mount_count(&pod.join("host-sub")),
        1,
        "propagated into the bind"
    );
    unmount(&env, &pod).ok();
    assert_eq!(mount_count(&pod), 0);
    assert_eq!(
        mount_count(&src.join("host-sub")),
        1,
        "the host's own submount was unmounted"
    );
    assert_eq!(
        std::fs::read_to_string(src.join("host-sub/marker")).unwrap(),
        "host"
    );
    assert!(record_of(&env, &pod).is_none());
}

/// Runs `cmd` for at most `limit`. `Ok` with its output when it ended by then; `Err` with its
/// thread count when it was still running (then it is killed), so that a call that should have
/// answered fails the test instead of hanging it.
fn run_for(
    mut cmd: std::process::Command,
    limit: std::time::Duration,
) -> Result<std::process::Output, usize> {
    use std::process::Stdio;
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let t = std::time::Instant::now();
    while t.elapsed() < limit {
        if child.try_wait().unwrap().is_some() {
            return Ok(child.wait_with_output().unwrap());
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let threads =
        std::fs::read_dir(format!("/proc/{}/task", child.id())).map_or(0, Iterator::count);
    child.kill().unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.stdout.is_empty() && out.stderr.is_empty());
    Err(threads)
}

/// A driver started with its standard output closed (a careless caller) must not let the first
/// file it opens take descriptor 1: a reply written then (here the deadline's, while the volume's
/// lock file is open) would land in that file. `sys::process::start` opens `/dev/null` there.
#[test]
fn root_closed_stdout_never_takes_a_reply_into_a_file() {
    use std::time::Duration;
    require_root!();
    let env = Env::with_config(json!({"verbTimeoutSeconds": 1}));
    let foreign = env.mkdir("foreign");
    tmpfs(&foreign);
    let pod = env.pod_dir("uid-fd", "v");
    let j = opts(&foreign.join("data"), json!({"type": "DirectoryOrCreate"}));
    let mut c = std::process::Command::new("/bin/sh");
    c.args(["-c", "exec \"$@\" >&-", "sh"])
        .arg(env.driver("hostpath"))
        .args(["mount", pod.to_str().unwrap(), &j])
        .env("FLEXVOL_CONFIG", &env.config)
        .env("FLEXVOL_TEST_HANG_AT", "hostpath-mount-before-bind")
        .stdin(std::process::Stdio::null());
    let out = run_for(c, Duration::from_secs(4))
        .unwrap_or_else(|threads| panic!("no exit after 4 s ({threads} threads)"));
    assert_eq!(
        out.status.code(),
        Some(0),
        "the deadline's Failure exits 0: {out:?}"
    );
    let locks: Vec<_> = std::fs::read_dir(env.run.join("locks"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert!(!locks.is_empty());
    for l in &locks {
        let text = std::fs::read_to_string(l).unwrap();
        assert!(text.is_empty(), "{} holds {text:?}", l.display());
    }
    let last = env.log_lines().pop().unwrap();
    assert_eq!(last["reply"]["status"], "Failure", "{last}");
}

/// The guard thread answers a call stuck in the kernel, and hostPath starts it only when the
/// volume leaves the filesystem of kubelet's pod directories (sys::process, "When the guard
/// thread runs"). Both halves: a source on another filesystem (a tmpfs here; an NFS export in
/// the guest tier) stuck at the bind, or at the unmount, gets the deadline's Failure; a source on
/// kubelet's own filesystem runs with no thread at all (so it would wait, like kubelet itself).
#[test]
fn root_guard_thread_only_when_the_volume_leaves_kubelets_filesystem() {
    use std::time::Duration;
    require_root!();
    let env = Env::with_config(json!({"verbTimeoutSeconds": 1}));
    let stuck_at = |at: &str, args: &[&str]| {
        let mut c = env.command("hostpath", args);
        c.env("FLEXVOL_TEST_HANG_AT", at);
        run_for(c, Duration::from_secs(4))
    };
    let answered = |r: Result<std::process::Output, usize>| {
        let out = r.unwrap_or_else(|threads| {
            panic!("no answer after 4 s with a deadline of 1 s ({threads} threads)")
        });
        crate::util::check_protocol(&out.stdout, &out.stderr, out.status.code())
    };

    // Another filesystem: the guard runs and answers at the deadline.
    let foreign = env.mkdir("foreign");
    tmpfs(&foreign);
    let src = foreign.join("data");
    let pod = env.pod_dir("uid-g1", "v");
    let p = pod.to_str().unwrap();
    let j = opts(&src, json!({"type": "DirectoryOrCreate"}));
    answered(stuck_at("hostpath-mount-before-bind", &["mount", p, &j]))
        .failed("did not finish within its deadline of 1s");
    assert!(env.mounts().iter().all(|m| m != &pod), "{:?}", env.mounts());
    mount(&env, &pod, &j).ok();
    answered(stuck_at("hostpath-unmount-after-unmount", &["unmount", p]))
        .failed("did not finish within its deadline of 1s");
    unmount(&env, &pod).ok();
    assert!(env.mounts().iter().all(|m| m != &pod), "{:?}", env.mounts());

    // kubelet's own filesystem: no guard thread, so a call stuck there is still waiting, with
    // one thread and no reply, well past its deadline.
    let local = env.mkdir("local");
    let pod = env.pod_dir("uid-g2", "v");
    let p = pod.to_str().unwrap();
    let j = opts(&local, json!({}));
    match stuck_at("hostpath-mount-before-bind", &["mount", p, &j]) {
        Err(threads) => assert_eq!(
            threads, 1,
            "a hostPath call on kubelet's filesystem started a thread"
        ),
        Ok(out) => panic!(
            "the call answered: {}",
            String::from_utf8_lossy(&out.stdout)
        ),
    }
    // The ordinary path on kubelet's filesystem, start to end.
    mount(&env, &pod, &j).ok();
    unmount(&env, &pod).ok();
    assert!(env.mounts().iter().all(|m| m != &pod), "{:?}", env.mounts());
    nix::mount::umount2(&foreign, nix::mount::MntFlags::MNT_DETACH).unwrap();
}

/// Issue #20 item 9: without a record, `unmount` removed whatever was mounted on a kubelet-shaped
/// pod volume directory (a foreign tmpfs was unmounted). Without a record only what can be ours,
/// a bind of a path under an allowed root, is detached; anything else is left with a Failure
/// that says what is mounted there. A lost record still lets kubelet unmount its own binds.
#[test]
fn root_unmount_without_a_record_detaches_only_binds_from_an_allowed_root() {
    require_root!();
    let env = Env::new();
    // A foreign tmpfs on the pod directory itself.
    let pod = env.pod_dir("u", "v");
    tmpfs(&pod);
    std::fs::write(pod.join("theirs"), "foreign").unwrap();
    unmount(&env, &pod).failed("tmpfs");
    unmount(&env, &pod).failed("left alone");
    assert_eq!(mount_count(&pod), 1, "a foreign tmpfs was unmounted");
    assert_eq!(
        std::fs::read_to_string(pod.join("theirs")).unwrap(),
        "foreign"
    );
    nix::mount::umount2(&pod, nix::mount::MntFlags::empty()).unwrap();

    // A foreign file bind inside it, of a file outside every allowed root.
    let outside = tempfile::tempdir().unwrap();
    let secret = outside.path().join("secret");
    std::fs::write(&secret, "outside").unwrap();
    let pod2 = env.pod_dir("u2", "v");
    std::fs::write(pod2.join("sock"), "").unwrap();
    bind(&secret, &pod2.join("sock"));
    unmount(&env, &pod2).failed("not a bind of a path under an allowed hostPath root");
    assert_eq!(mount_count(&pod2.join("sock")), 1);
    assert!(pod2.join("sock").exists());
    nix::mount::umount2(&pod2.join("sock"), nix::mount::MntFlags::empty()).unwrap();

    // kubelet lost the record of its own volume: a bind of a directory and of a file under the
    // allowed root, made by hand or by the driver, are still unmounted.
    let src = env.mkdir("data");
    let pod3 = env.pod_dir("u3", "v");
    bind(&src, &pod3);
    unmount(&env, &pod3).ok();
    assert_eq!(mount_count(&pod3), 0);
    let pod4 = env.pod_dir("u4", "v");
    mount(&env, &pod4, &opts(&src, json!({"type": "Directory"}))).ok();
    std::fs::remove_dir_all(env.state.join("hostpath")).unwrap();
    unmount(&env, &pod4).ok();
    assert_eq!(mount_count(&pod4), 0);
    let f = env.root().join("cfg");
    std::fs::write(&f, "ours").unwrap();
    let pod5 = env.pod_dir("u5", "v");
    mount(&env, &pod5, &opts(&f, json!({"type": "File"}))).ok();
    std::fs::remove_dir_all(env.state.join("hostpath")).unwrap();
    unmount(&env, &pod5).ok();
    assert_eq!(mount_count(&pod5.join("cfg")), 0);
    assert!(!pod5.join("cfg").exists());
    assert_eq!(std::fs::read_to_string(&f).unwrap(), "ours");
    assert!(env.mounts().is_empty());
}
