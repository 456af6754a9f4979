//! Fault injection: crashes at every step of every mutating hostPath verb, races between verbs,
//! many volumes at once, and arbitrary argv and options.

use crate::require_root;
use crate::util::{Env, check_protocol};
use serde_json::json;
use std::path::{Path, PathBuf};

fn mounts_at(p: &Path) -> Vec<flexvol::sys::mountinfo::MountInfo> {
    let t = flexvol::sys::mountinfo::MountTable::read().unwrap();
    t.all_at(p).cloned().collect()
}

#[test]
fn root_kill_9_at_every_step_then_retry_converges() {
    require_root!();
    let mount_steps = [
        "hostpath-mount-after-create",
        "hostpath-mount-after-placeholder",
        "hostpath-mount-before-bind",
        "mount-bind-before-slave",
        "mount-bind-before-readonly",
        "hostpath-mount-after-bind",
    ];
    let unmount_steps = [
        "hostpath-unmount-after-unmount",
        "hostpath-unmount-before-forget",
    ];
    for file_like in [false, true] {
        for read_only in [false, true] {
            for step in mount_steps {
                if (step == "hostpath-mount-after-placeholder" && !file_like)
                    || (step == "mount-bind-before-readonly" && !read_only)
                {
                    continue;
                }
                let env = Env::new();
                let pod = env.pod_dir("u", "v");
                let src = if file_like {
                    env.root().join("data/file")
                } else {
                    env.root().join("data/dir")
                };
                let ty = if file_like {
                    "FileOrCreate"
                } else {
                    "DirectoryOrCreate"
                };
                std::fs::create_dir_all(env.root().join("data")).unwrap();
                let rw = if read_only { "ro" } else { "rw" };
                let j = json!({"path": src, "type": ty, "kubernetes.io/readwrite": rw}).to_string();
                let case = format!("{step} file_like={file_like} ro={read_only}");
                env.killed_at("hostpath", &["mount", pod.to_str().unwrap(), &j], step);
                // The retry converges to exactly one mount with the requested access.
                env.call("hostpath", &["mount", pod.to_str().unwrap(), &j])
                    .ok();
                let at = if file_like {
                    pod.join("file")
                } else {
                    pod.clone()
                };
                let m = mounts_at(&at);
                assert_eq!(m.len(), 1, "{case}: {m:?}");
                assert_eq!(m[0].read_only(), read_only, "{case}");
                // And the unmount converges after a crash at each of its steps, too.
                for ustep in unmount_steps {
                    env.killed_at("hostpath", &["unmount", pod.to_str().unwrap()], ustep);
                    env.call("hostpath", &["unmount", pod.to_str().unwrap()])
                        .ok();
                    assert!(
                        env.mounts().is_empty(),
                        "{case} / {ustep}: {:?}",
                        env.mounts()
                    );
                    assert_eq!(
                        std::fs::read_dir(&pod).unwrap().count(),
                        0,
                        "{case} / {ustep}: placeholder left in the pod dir"
                    );
                    env.call("hostpath", &["mount", pod.to_str().unwrap(), &j])
                        .ok();
                }
                env.call("hostpath", &["unmount", pod.to_str().unwrap()])
                    .ok();
                assert!(env.mounts().is_empty(), "{case}");
                let records = std::fs::read_dir(env.state.join("hostpath"))
                    .map(|d| d.count())
                    .unwrap_or(0);
                assert_eq!(records, 0, "{case}: state records left");
                assert!(src.exists(), "{case}: the source must survive");
            }
        }
    }
}

#[test]
fn root_crash_after_placeholder_then_pod_deleted_leaves_a_removable_dir() {
    require_root!();
    let env = Env::new();
    let pod = env.pod_dir("u", "v");
    let j = json!({"path": env.root().join("f"), "type": "FileOrCreate"}).to_string();
    env.killed_at(
        "hostpath",
        &["mount", pod.to_str().unwrap(), &j],
        "hostpath-mount-after-placeholder",
    );
    // kubelet gives up on the pod and tears it down without a successful mount.
    env.call("hostpath", &["unmount", pod.to_str().unwrap()])
        .ok();
    std::fs::remove_dir(&pod).expect("kubelet's rmdir must succeed");
}

#[test]
fn root_mount_and_unmount_racing_on_one_volume_never_double_mount() {
    require_root!();
    let env = Env::new();
    let src = env.mkdir("data");
    let pod = env.pod_dir("u", "v");
    let j = json!({"path": src}).to_string();
    for _ in 0..15 {
        std::thread::scope(|s| {
            for verb in ["mount", "unmount", "mount", "unmount"] {
                let (env, pod, j) = (&env, &pod, &j);
                s.spawn(move || {
                    let args: Vec<&str> = if verb == "mount" {
                        vec!["mount", pod.to_str().unwrap(), j]
                    } else {
                        vec!["unmount", pod.to_str().unwrap()]
                    };
                    env.call("hostpath", &args).ok().clone()
                });
            }
        });
        let n = mounts_at(&pod).len();
        let record = env
            .state
            .join("hostpath")
            .read_dir()
            .map(|d| d.count())
            .unwrap_or(0);
        assert!(n <= 1, "double mount: {n}");
        assert_eq!(
            n, record,
            "the record and the mount table disagree ({n} mounts, {record} records)"
        );
    }
    env.call("hostpath", &["unmount", pod.to_str().unwrap()])
        .ok();
    assert!(env.mounts().is_empty());
    // No lock is left held.
    for e in std::fs::read_dir(env.run.join("locks")).unwrap() {
        let f = std::fs::File::open(e.unwrap().path()).unwrap();
        f.try_lock()
            .expect("a lock is still held after every call finished");
    }
}

#[test]
fn root_sixty_four_volumes_at_once() {
    require_root!();
    let env = Env::new();
    let pods: Vec<(PathBuf, String)> = (0..64)
        .map(|i| {
            (
                env.pod_dir(&format!("p{i}"), "v"),
                json!({"path": env.root().join(format!("vols/{i}")), "type": "DirectoryOrCreate"})
                    .to_string(),
            )
        })
        .collect();
    std::thread::scope(|s| {
        for (pod, j) in &pods {
            let env = &env;
            s.spawn(move || {
                env.call("hostpath", &["mount", pod.to_str().unwrap(), j])
                    .ok()
                    .clone()
            });
        }
    });
    for (i, (pod, _)) in pods.iter().enumerate() {
        let m = mounts_at(pod);
        assert_eq!(m.len(), 1, "{i}");
        assert!(
            m[0].root.ends_with(format!("vols/{i}")),
            "pod {i} got {:?}",
            m[0].root
        );
    }
    std::thread::scope(|s| {
        for (pod, _) in &pods {
            let env = &env;
            s.spawn(move || {
                env.call("hostpath", &["unmount", pod.to_str().unwrap()])
                    .ok()
                    .clone()
            });
        }
    });
    assert!(env.mounts().is_empty());
}

mod arbitrary {
    use super::*;
    use proptest::prelude::*;

    const VERBS: &[&str] = &[
        "init",
        "getvolumename",
        "attach",
        "isattached",
        "detach",
        "waitforattach",
        "mountdevice",
        "unmountdevice",
        "mount",
        "unmount",
        "expandvolume",
        "expandfs",
        "",
        "waitfordetach",
        "--help",
        "-h",
        "help",
    ];
    const KEYS: &[&str] = &[
        "path",
        "type",
        "uid",
        "gid",
        "mode",
        "pathPattern",
        "kubernetes.io/readwrite",
        "kubernetes.io/fsType",
        "kubernetes.io/pvOrVolumeName",
        "kubernetes.io/secret/p",
        "kubernetes.io/mounterArgs.FsGroup",
        "share",
        "volumegroup",
        "volumeID",
        "size",
        "thinpool",
        "version",
        "mountOptions",
        "mkfsOptions",
    ];

    fn arg() -> impl Strategy<Value = String> {
        prop_oneof![
            any::<String>(),
            "[ -~]{0,40}",
            Just(String::new()),
            Just("{".to_string()),
            Just("null".to_string()),
            proptest::collection::btree_map(proptest::sample::select(KEYS), "[ -~]{0,24}", 0..6)
                .prop_map(|m| serde_json::to_string(&m).unwrap()),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]
        /// Any argv gives exactly one JSON object, the exit code of its status, nothing on stderr.
        /// (`server` is never generated: an NFS probe must only ever reach loopback.)
        #[test]
        fn contract_any_argv_gives_one_json_object(
            driver in proptest::sample::select(&["hostpath", "nfs", "lvm"][..]),
            verb in proptest::sample::select(VERBS),
            args in proptest::collection::vec(arg(), 0..6),
        ) {
            let env = Env::with_config(json!({"hostpath": {"allowedRoots": ["/nonexistent-flexvol-allowed-root"]}, "verbTimeoutSeconds": 20}));
            let args: Vec<String> = args.into_iter().map(|a| a.replace('\0', "")).collect();
            let mut argv = vec![verb.to_string()];
            argv.extend(args);
            if matches!(verb, "--help" | "-h" | "help") {
                // Help is for people; kubelet never sends it. It must still not write to stderr.
                let out = env.command(driver, &argv.iter().map(String::as_str).collect::<Vec<_>>()).output().unwrap();
                prop_assert!(out.stderr.is_empty());
                return Ok(());
            }
            let out = env.command(driver, &argv.iter().map(String::as_str).collect::<Vec<_>>()).output().unwrap();
            check_protocol(&out.stdout, &out.stderr, out.status.code());
            prop_assert!(env.mounts().is_empty(), "something got mounted: {:?}", env.mounts());
        }
    }
}
