//! Root tier: the hostPath backend against real bind mounts on this machine.

use crate::require_root;
use crate::util::Env;
use serde_json::json;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

fn opts(path: &Path, extra: serde_json::Value) -> String {
    let mut j = json!({
        "kubernetes.io/fsType": "",
        "kubernetes.io/pod.name": "web-0",
        "kubernetes.io/pod.namespace": "team-a",
        "kubernetes.io/pod.uid": "6f3c1b8e",
        "kubernetes.io/pvOrVolumeName": "pv-1",
        "kubernetes.io/readwrite": "rw",
        "kubernetes.io/serviceAccount.name": "default",
        "path": path,
    });
    for (k, v) in extra.as_object().unwrap() {
        j[k] = v.clone();
    }
    j.to_string()
}

fn mount(env: &Env, pod: &Path, j: &str) -> crate::util::Reply {
    env.call("hostpath", &["mount", pod.to_str().unwrap(), j])
}

fn unmount(env: &Env, pod: &Path) -> crate::util::Reply {
    env.call("hostpath", &["unmount", pod.to_str().unwrap()])
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
    // What a kill -9 after the bind but before the remount leaves behind: a writable bind.
    nix::mount::mount(
        Some(&src),
        &pod,
        None::<&str>,
        nix::mount::MsFlags::MS_BIND,
        None::<&str>,
    )
    .unwrap();
    mount(
        &env,
        &pod,
        &opts(&src, json!({"kubernetes.io/readwrite": "ro"})),
    )
    .ok();
    assert_eq!(mount_count(&pod), 1);
    let e = std::fs::write(pod.join("x"), "x").unwrap_err();
    assert_eq!(e.raw_os_error(), Some(nix::libc::EROFS));
    // Something else mounted there is not silently accepted.
    let other = env.mkdir("other");
    mount(
        &env,
        &pod,
        &opts(&other, json!({"kubernetes.io/readwrite": "ro"})),
    )
    .failed("already a mount point of something else");
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
