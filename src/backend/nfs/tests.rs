//! Unit tests of the NFS verbs against the test doubles: exact argv, nothing run on bad input or
//! an unreachable server, and the unmount escalation order.

use super::*;
use crate::backend::testing::World;
use crate::sys::mount::Mounter;
use crate::sys::testing::MountCall;

fn world() -> World {
    World::new(Backend::Nfs)
}

impl World {
    /// A created pod volume directory.
    fn pod_dir(&self, uid: &str) -> PathBuf {
        let p = self
            .root
            .join(format!("pods/{uid}/volumes/flexvol~nfs/data"));
        std::fs::create_dir_all(&p).unwrap();
        p
    }

    fn mount(&self, dir: &Path, json: &str) -> Result<Reply> {
        self.with_ctx(|ctx| mount(ctx, &self.prober, dir, &Options::parse(json).unwrap()))
    }

    fn unmount(&self, dir: &Path) -> Result<Reply> {
        self.with_ctx(|ctx| unmount(ctx, &self.prober, dir))
    }

    fn record(&self, dir: &Path) -> Option<VolumeRecord> {
        crate::node::state::StateStore::new(&self.config.state_dir, "nfs")
            .load(dir)
            .unwrap()
    }

    fn nfs_at(&self, dir: &Path) -> usize {
        self.mounter.table().unwrap().all_at(dir).count()
    }

    fn probes(&self) -> std::cell::Ref<'_, Vec<(String, u16)>> {
        self.prober.probes.borrow()
    }
}

fn j(extra: &str) -> String {
    crate::protocol::options::testing::options_json(
        &[
            ("kubernetes.io/fsType", "nfs"),
            ("kubernetes.io/pod.name", "nginx-nfs"),
            ("kubernetes.io/pod.namespace", "default"),
            ("kubernetes.io/pod.uid", "0b6a9c52"),
            ("kubernetes.io/pvOrVolumeName", "data"),
            ("kubernetes.io/secret/password", "czNjcjN0"),
            ("kubernetes.io/serviceAccount.name", "default"),
            ("server", "127.0.0.1"),
            ("share", "/srv/nfs"),
        ],
        extra,
    )
}

#[test]
fn mount_runs_mount_nfs_with_exact_argv_and_records_it_first() {
    for (extra, opts) in [
        ("", "rw,hard,timeo=600,retrans=2,nosuid,nodev"),
        (
            r#","version":"3""#,
            "rw,vers=3,hard,timeo=600,retrans=2,nosuid,nodev",
        ),
        (
            r#","version":"4.1","kubernetes.io/readwrite":"ro""#,
            "ro,vers=4.1,hard,timeo=600,retrans=2,nosuid,nodev",
        ),
        (
            r#","version":"4.2","mountOptions":"soft,timeo=100,noresvport""#,
            "rw,vers=4.2,retrans=2,soft,timeo=100,noresvport,nosuid,nodev",
        ),
    ] {
        let w = world();
        let dir = w.pod_dir("u1");
        w.mount(&dir, &j(extra)).unwrap();
        assert_eq!(
            w.runner.lines(),
            [format!(
                "mount.nfs 127.0.0.1:/srv/nfs {} -o {opts}",
                dir.display()
            )],
            "{extra}"
        );
        assert_eq!(w.runner.calls()[0].timeout, Duration::from_secs(60));
        assert!(w.runner.calls()[0].stdin.is_none(), "no secret on stdin");
        assert_eq!(w.probes().as_slice(), [("127.0.0.1".into(), 2049)]);
        let rec = w.record(&dir).expect("state recorded");
        assert_eq!(rec.source, "127.0.0.1:/srv/nfs");
        assert_eq!(rec.extra["mountOptions"], opts);
        assert_eq!(rec.pod.as_deref(), Some("default/nginx-nfs"));
        let text = serde_json::to_string(&rec).unwrap();
        assert!(!text.contains("czNjcjN0") && !text.contains("s3cr3t"));
        // Each verb twice: the second mount sees the mount and runs nothing.
        w.mount(&dir, &j(extra)).unwrap();
        assert_eq!(w.runner.count("mount.nfs"), 1);
        assert_eq!(w.nfs_at(&dir), 1);
    }
}

#[test]
fn port_option_is_probed() {
    let w = world();
    let dir = w.pod_dir("u1");
    w.mount(&dir, &j(r#","mountOptions":"port=20490""#))
        .unwrap();
    assert_eq!(w.probes().as_slice(), [("127.0.0.1".into(), 20490)]);
    assert_eq!(w.record(&dir).unwrap().extra["port"], "20490");
    // unmount probes the recorded port.
    w.unmount(&dir).unwrap();
    assert_eq!(w.probes()[1], ("127.0.0.1".into(), 20490));
}

#[test]
fn injection_attempts_run_nothing_and_record_nothing() {
    for bad in [
        r#"{"server":"-oremount","share":"/x"}"#,
        r#"{"server":"127.0.0.1","share":"/x,suid"}"#,
        r#"{"server":"127.0.0.1","share":"/srv/nfs","mountOptions":"rw,suid"}"#,
        r#"{"server":"127.0.0.1","share":"/srv/nfs","mountOptions":"sec=sys\nx"}"#,
        r#"{"server":"fd00::1","share":"/srv/nfs"}"#,
        r#"{"server":"127.0.0.1","share":"/srv/../etc"}"#,
        r#"{"server":"127.0.0.1","share":"srv"}"#,
        r#"{"server":"127.0.0.1","share":"/srv/nfs","version":"4,suid"}"#,
        r#"{"server":"127.0.0.1","share":"/srv/nfs","mountOptions":"vers=3"}"#,
        r#"{"server":"127.0.0.1 -o suid","share":"/srv/nfs"}"#,
        r#"{"server":"127.0.0.1","share":"/srv/nfs","kubernetes.io/readwrite":"yes"}"#,
    ] {
        let w = world();
        let dir = w.pod_dir("u1");
        let e = w.mount(&dir, bad).unwrap_err();
        assert!(e.to_string().starts_with("option "), "{bad}: {e}");
        assert!(
            w.runner.calls().is_empty(),
            "{bad}: ran {:?}",
            w.runner.lines()
        );
        assert!(w.probes().is_empty(), "{bad}: probed");
        assert!(w.mounter.calls().is_empty());
        assert!(w.record(&dir).is_none());
    }
}

#[test]
fn unreachable_server_fails_before_anything_runs() {
    let w = world();
    w.prober.up.set(false);
    let dir = w.pod_dir("u1");
    let e = w.mount(&dir, &j("")).unwrap_err().to_string();
    assert!(
        e.starts_with("NFS server 127.0.0.1 is unreachable: nothing accepted a TCP connection on 127.0.0.1:2049"),
        "{e}"
    );
    assert!(e.contains("Nothing was mounted"), "{e}");
    assert!(w.runner.calls().is_empty());
    assert!(w.record(&dir).is_none());
    assert_eq!(w.nfs_at(&dir), 0);
}

#[test]
fn existing_mounts_at_the_target() {
    let w = world();
    let dir = w.pod_dir("u1");
    // Same export (trailing slash aside): Success without probing or running anything.
    w.mounter.add("127.0.0.1:/srv/nfs/", &dir, "nfs4", false);
    w.mount(&dir, &j("")).unwrap();
    assert!(w.runner.calls().is_empty() && w.probes().is_empty());
    let e = w
        .mount(&dir, &j(r#","kubernetes.io/readwrite":"ro""#))
        .unwrap_err();
    assert!(e.to_string().contains("already mounted read-write"), "{e}");

    let w = world();
    let dir = w.pod_dir("u1");
    w.mounter.add("10.9.9.9:/other", &dir, "nfs4", false);
    let e = w.mount(&dir, &j("")).unwrap_err();
    assert!(
        e.to_string().contains("mount point of something else"),
        "{e}"
    );
    assert!(w.runner.calls().is_empty());
}

#[test]
fn missing_or_odd_pod_dirs() {
    let w = world();
    let e = w
        .mount(&w.root.join("pods/none/volumes/x/data"), &j(""))
        .unwrap_err();
    assert!(e.to_string().contains("does not exist"), "{e}");
    let e = w.mount(Path::new("relative/dir"), &j("")).unwrap_err();
    assert!(e.to_string().contains("absolute path"), "{e}");
    let file = w.root.join("file");
    std::fs::write(&file, "").unwrap();
    let e = w.mount(&file, &j("")).unwrap_err();
    assert!(e.to_string().contains("not a directory"), "{e}");
    assert!(w.runner.calls().is_empty());
}

#[test]
fn failed_mount_nfs_says_why_and_forgets_the_record() {
    let w = world();
    let dir = w.pod_dir("u1");
    w.runner.on(
        "mount.nfs",
        &[],
        32,
        "",
        "mount.nfs: access denied by server while mounting 127.0.0.1:/srv/nfs",
    );
    let e = w.mount(&dir, &j("")).unwrap_err().to_string();
    assert!(
        e.contains("access denied by server") && e.contains("exportfs -v"),
        "{e}"
    );
    assert!(w.record(&dir).is_none());

    let w = world();
    let dir = w.pod_dir("u1");
    w.runner.time_out("mount.nfs");
    let e = w.mount(&dir, &j("")).unwrap_err().to_string();
    assert!(
        e.contains("did not finish within") && e.contains("nothing is mounted"),
        "{e}"
    );
    assert!(w.record(&dir).is_none());

    let w = world();
    let dir = w.pod_dir("u1");
    w.runner.without("mount.nfs");
    let e = w.mount(&dir, &j("")).unwrap_err().to_string();
    assert!(e.contains("install the NFS client"), "{e}");
}

fn umount_lines(w: &World) -> Vec<String> {
    w.runner
        .lines()
        .into_iter()
        .filter(|l| l.starts_with("umount"))
        .collect()
}

#[test]
fn unmount_of_nothing_succeeds_and_runs_nothing() {
    let w = world();
    let dir = w.pod_dir("u1");
    w.unmount(&dir).unwrap();
    w.unmount(&dir).unwrap();
    // The parent is gone too.
    w.unmount(&w.root.join("pods/gone/volumes/flexvol~nfs/data"))
        .unwrap();
    assert!(w.runner.calls().is_empty() && w.probes().is_empty());
}

#[test]
fn unmount_with_a_live_server_is_one_plain_umount() {
    let w = world();
    let dir = w.pod_dir("u1");
    w.mount(&dir, &j("")).unwrap();
    let r = w.unmount(&dir).unwrap();
    assert_eq!(r, Reply::success());
    let d = dir.display();
    assert_eq!(umount_lines(&w), [format!("umount -i -c {d}")]);
    assert_eq!(w.runner.calls()[1].timeout, Duration::from_secs(10));
    assert_eq!(w.nfs_at(&dir), 0);
    assert!(w.record(&dir).is_none());
    w.unmount(&dir).unwrap();
    assert_eq!(umount_lines(&w).len(), 1, "second unmount runs nothing");
}

#[test]
fn unmount_does_not_need_to_look_at_the_mount_point() {
    // The pod dir does not exist as far as the filesystem goes (as if looking at it would hang):
    // mountinfo alone drives the unmount.
    let w = world();
    let parent = w.root.join("pods/u1/volumes/flexvol~nfs");
    std::fs::create_dir_all(&parent).unwrap();
    let dir = parent.join("data");
    w.mounter.add("127.0.0.1:/srv/nfs", &dir, "nfs4", false);
    w.unmount(&dir).unwrap();
    assert_eq!(w.nfs_at(&dir), 0);
}

#[test]
fn busy_with_a_live_server_fails_without_forcing() {
    let w = world();
    let dir = w.pod_dir("u1");
    w.mount(&dir, &j("")).unwrap();
    let busy = format!("umount: {}: target is busy.", dir.display());
    w.runner.on("umount", &[], 32, "", &busy);
    let e = w.unmount(&dir).unwrap_err().to_string();
    assert!(e.contains("is busy"), "{e}");
    assert_eq!(umount_lines(&w).len(), 1, "{:?}", umount_lines(&w));
    assert_eq!(w.nfs_at(&dir), 1);
    assert!(w.record(&dir).is_some(), "record kept for the retry");
}

#[test]
fn a_hanging_plain_umount_escalates_to_force_then_lazy() {
    let w = world();
    let dir = w.pod_dir("u1");
    w.mount(&dir, &j("")).unwrap();
    w.runner.time_out("umount");
    w.runner.on("umount", &["-l"], 0, "", "");
    let r = w.unmount(&dir).unwrap();
    let d = dir.display();
    assert_eq!(
        umount_lines(&w),
        [
            format!("umount -i -c {d}"),
            format!("umount -i -c -f {d}"),
            format!("umount -i -c -l {d}"),
        ]
    );
    assert!(r.message.unwrap().contains("lazy unmount"));
    assert_eq!(w.nfs_at(&dir), 0);
    assert!(w.record(&dir).is_none());
    // Force is enough when it works.
    let w = world();
    let dir = w.pod_dir("u1");
    w.mount(&dir, &j("")).unwrap();
    w.runner.time_out("umount");
    w.runner.on("umount", &["-f"], 0, "", "");
    w.unmount(&dir).unwrap();
    assert_eq!(umount_lines(&w).len(), 2);
}

#[test]
fn a_dead_server_goes_straight_to_force_then_lazy() {
    let w = world();
    let dir = w.pod_dir("u1");
    w.mount(&dir, &j("")).unwrap();
    w.prober.up.set(false);
    w.runner
        .on("umount", &["-f"], 32, "", "umount: target is busy.");
    let r = w.unmount(&dir).unwrap();
    let d = dir.display();
    assert_eq!(
        umount_lines(&w),
        [
            format!("umount -i -c -f {d}"),
            format!("umount -i -c -l {d}")
        ]
    );
    let msg = r.message.unwrap();
    assert!(
        msg.contains("NFS server 127.0.0.1 is unreachable") && msg.contains("lazy unmount"),
        "{msg}"
    );
    assert_eq!(w.nfs_at(&dir), 0);
    assert!(w.record(&dir).is_none());
}

#[test]
fn unmount_fails_clearly_when_even_lazy_fails() {
    let w = world();
    let dir = w.pod_dir("u1");
    w.mount(&dir, &j("")).unwrap();
    w.prober.up.set(false);
    w.runner.time_out("umount");
    let e = w.unmount(&dir).unwrap_err().to_string();
    assert!(
        e.contains("forced unmount: no answer") && e.contains("lazy unmount: no answer"),
        "{e}"
    );
    assert!(e.contains("data on the server was not touched"), "{e}");
    assert!(w.record(&dir).is_some());
}

#[test]
fn unmount_leaves_foreign_mounts_alone() {
    let w = world();
    let dir = w.pod_dir("u1");
    w.mounter.add("tmpfs", &dir, "tmpfs", false);
    let e = w.unmount(&dir).unwrap_err().to_string();
    assert!(e.contains("did not make"), "{e}");
    assert!(w.runner.calls().is_empty());
    assert!(
        !w.mounter
            .calls()
            .iter()
            .any(|c| matches!(c, MountCall::Unmount(..)))
    );
}

#[test]
fn stacked_nfs_mounts_are_all_removed() {
    let w = world();
    let dir = w.pod_dir("u1");
    w.mounter.add("127.0.0.1:/srv/nfs", &dir, "nfs4", false);
    w.mounter.add("127.0.0.1:/srv/nfs", &dir, "nfs4", false);
    w.unmount(&dir).unwrap();
    assert_eq!(w.nfs_at(&dir), 0);
    assert_eq!(umount_lines(&w).len(), 2);
}

#[test]
fn the_probe_target_of_a_mount() {
    let m = |source: &str, sopts: &str| MountInfo {
        id: 1,
        parent: 0,
        major: 0,
        minor: 50,
        root: "/".into(),
        mount_point: "/p".into(),
        mount_options: "rw".into(),
        fs_type: "nfs4".into(),
        source: source.into(),
        super_options: sopts.into(),
    };
    assert_eq!(
        server_of(&m("nfs.example:/x", "rw,vers=4.2,addr=10.0.0.5"), None),
        Some(("10.0.0.5".into(), 2049))
    );
    assert_eq!(
        server_of(&m("[fd00::5]:/x", "rw,addr=fd00::5,port=20490"), None),
        Some(("[fd00::5]".into(), 20490))
    );
    assert_eq!(
        server_of(&m("nfs.example:/x", "rw"), None),
        Some(("nfs.example".into(), 2049))
    );
    assert_eq!(server_of(&m("weird", "rw"), None), None);
}

#[test]
fn other_verbs_are_not_supported() {
    let w = world();
    w.with_ctx(|ctx| {
        let call = Call::parse(&["attach".into(), "{}".into(), "node".into()]).unwrap();
        assert_eq!(
            handle(&call, ctx, &w.prober).unwrap(),
            Reply::not_supported()
        );
    });
}

/// The shared key of the fake nodes.
const KEY: &[u8] = b"a shared key of 32 bytes, really";

/// A node whose config lists `10.0.0.5:/srv/nfs` (and `nfs.example:/exports/k8s`) as provisioned
/// exports, with the shared key.
fn provisioned() -> World {
    use std::os::unix::fs::PermissionsExt;
    let mut w = world();
    let key = w.root.join("nfs.key");
    std::fs::write(&key, KEY).unwrap();
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o400)).unwrap();
    w.config.nfs.capability_key_file = Some(key);
    w.config.nfs.provisioned_exports = vec![
        options::Export {
            server: "10.0.0.5".into(),
            share: "/srv/nfs".into(),
        },
        options::Export {
            server: "nfs.example".into(),
            share: "/exports/k8s".into(),
        },
    ];
    w.runner.on(
        "getent",
        &["nfs.example"],
        0,
        "10.0.0.9       STREAM nfs.example\n10.0.0.9       DGRAM  \n",
        "",
    );
    w.runner.on(
        "getent",
        &["alias.example"],
        0,
        "10.0.0.5       STREAM alias.example\n",
        "",
    );
    w.runner
        .on("getent", &["other.example"], 0, "10.9.9.9 STREAM x\n", "");
    w
}

fn sign(pv: &str, server: &str, share: &str) -> String {
    crate::node::capability::Key::from_bytes(KEY).sign_for(
        pv,
        "team-a",
        &crate::node::capability::Location::Nfs { server, share },
    )
}

/// Options of pod volume `name` in namespace `ns` for `server:share`, with `extra` JSON members.
fn vol(name: &str, server: &str, share: &str, extra: &str) -> String {
    crate::protocol::options::testing::options_json(
        &[
            ("kubernetes.io/pod.namespace", "team-a"),
            ("kubernetes.io/pod.uid", "u"),
            ("kubernetes.io/pod.name", "p"),
            ("kubernetes.io/pvOrVolumeName", name),
            ("server", server),
            ("share", share),
        ],
        extra,
    )
}

/// #20 hole 2: an inline volume cannot mount a provisioned export (its root, a claim's directory,
/// a path above it, any other path on that server, the server under another name or address);
/// the claim's PV with its token mounts its own directory and nothing else.
#[test]
fn provisioned_exports_are_served_only_with_their_capability() {
    let claim = "/srv/nfs/pvc-1_team-b_db";
    let refused: &[(&str, &str, String)] = &[
        ("data", "10.0.0.5", "/srv/nfs".into()),
        ("pvc-1", "10.0.0.5", claim.into()),
        ("data", "10.0.0.5", "/srv".into()),
        ("data", "10.0.0.5", "/".into()),
        ("data", "10.0.0.5", "/k8s".into()),
        ("data", "[::ffff:10.0.0.5]", claim.into()),
        ("data", "alias.example", claim.into()),
        ("data", "NFS.Example.", "/exports/k8s".into()),
        ("data", "10.0.0.9", "/exports/k8s/pvc-2".into()),
        // Tokens for something else: another PV, another share, the export root.
        (
            "pvc-2",
            "10.0.0.5",
            format!(
                r#"{claim}","capabilityToken":"{}"#,
                sign("pvc-1", "10.0.0.5", claim)
            ),
        ),
        (
            "pvc-1",
            "10.0.0.5",
            format!(
                r#"/srv/nfs","capabilityToken":"{}"#,
                sign("pvc-1", "10.0.0.5", claim)
            ),
        ),
        (
            "pvc-1",
            "10.0.0.5",
            format!(r#"{claim}","capabilityToken":"v1.{}"#, "0".repeat(64)),
        ),
    ];
    for (name, server, share) in refused {
        let w = provisioned();
        let dir = w.pod_dir("u1");
        let e = w.mount(&dir, &vol(name, server, share, "")).unwrap_err();
        let msg = e.to_string();
        assert!(
            msg.contains("served only to the PV") && msg.contains("Nothing was mounted"),
            "{server}:{share}: {msg}"
        );
        assert!(!msg.contains(&sign("pvc-1", "10.0.0.5", claim)[3..]));
        assert_eq!(w.runner.count("mount.nfs"), 0, "{server}:{share}");
        assert!(w.probes().is_empty(), "{server}:{share}: probed");
        assert!(w.mounter.calls().is_empty());
        assert!(w.record(&dir).is_none());
    }
    // The PV's own options: mounted.
    let w = provisioned();
    let dir = w.pod_dir("u1");
    let token = format!(
        r#","capabilityToken":"{}""#,
        sign("pvc-1", "10.0.0.5", claim)
    );
    w.mount(&dir, &vol("pvc-1", "10.0.0.5", claim, &token))
        .unwrap();
    assert_eq!(w.runner.count("mount.nfs"), 1);
    let rec = serde_json::to_string(&w.record(&dir).unwrap()).unwrap();
    assert!(
        !rec.contains(&sign("pvc-1", "10.0.0.5", claim)[3..]),
        "{rec}"
    );
    // Another server is not affected (one lookup: the listed name's).
    let w = provisioned();
    let dir = w.pod_dir("u1");
    w.mount(&dir, &vol("data", "10.0.0.6", "/srv/nfs", ""))
        .unwrap();
    let lines = w.runner.lines();
    assert_eq!(lines.len(), 2, "{lines:?}");
    assert!(
        lines[0].starts_with("getent ahosts nfs.example"),
        "{lines:?}"
    );
    let w = provisioned();
    let dir = w.pod_dir("u1");
    w.mount(&dir, &vol("data", "other.example", "/srv/nfs", ""))
        .unwrap();
    assert_eq!(w.runner.count("mount.nfs"), 1);
    // A token on a node without the shared key: refused, saying how to make one.
    let mut w = provisioned();
    w.config.nfs.capability_key_file = None;
    let dir = w.pod_dir("u1");
    let e = w
        .mount(&dir, &vol("pvc-1", "10.0.0.5", claim, &token))
        .unwrap_err();
    assert!(
        e.to_string()
            .contains("create secret generic flexvol-nfs-key"),
        "{e}"
    );
    assert_eq!(w.runner.count("mount.nfs"), 0);
}

/// A name that does not resolve, while exports are listed, could be one of them: refused before
/// anything runs but the lookup.
#[test]
fn an_unresolvable_server_is_refused_when_exports_are_provisioned() {
    let w = provisioned();
    w.runner.on("getent", &["gone.example"], 2, "", "");
    let dir = w.pod_dir("u1");
    let e = w
        .mount(&dir, &vol("data", "gone.example", "/x", ""))
        .unwrap_err();
    assert!(e.to_string().contains("nfs.provisionedExports"), "{e}");
    assert_eq!(w.runner.count("mount.nfs"), 0);
}

#[test]
fn provisioned_exports_config() {
    let c = crate::node::config::Config::parse(
        Path::new("/c"),
        br#"{"nfs":{"provisionedExports":["nfs.example:/exports/k8s/","[fd00::5]:/x"],"capabilityKeyFile":"/etc/flexvol/nfs/key"}}"#,
    )
    .unwrap();
    assert_eq!(
        c.nfs.provisioned_exports,
        [
            options::Export {
                server: "nfs.example".into(),
                share: "/exports/k8s".into()
            },
            options::Export {
                server: "[fd00::5]".into(),
                share: "/x".into()
            }
        ]
    );
    assert!(
        c.nfs
            .provisioned_export("NFS.example", "/exports/k8s")
            .is_some()
    );
    assert!(
        c.nfs
            .provisioned_export("nfs.example", "/exports")
            .is_none()
    );
    for bad in [
        r#"{"nfs":{"provisionedExports":["nfs.example"]}}"#,
        r#"{"nfs":{"provisionedExports":["nfs.example:exports"]}}"#,
        r#"{"nfs":{"provisionedExports":["-o:/x"]}}"#,
        r#"{"nfs":{"capabilityKeyFile":"key"}}"#,
    ] {
        let e = crate::node::config::Config::parse(Path::new("/c"), bad.as_bytes()).unwrap_err();
        assert!(e.to_string().contains("nfs."), "{bad}: {e}");
    }
}

/// CSI (`flexvol csi --kind nfs`): a publish that names no PV (kubelet's pod info did not mark
/// the volume persistent, `crate::csi::node::pv_of_target`) is refused for a provisioned export
/// even with its PV's own token, and the target directory the publish made is removed again; a
/// static export of another server is published, and unpublished (the target removed). With the
/// PV's name from kubelet, the provisioned export is served to its own PV and namespace only.
#[test]
fn csi_publish_of_a_provisioned_export_needs_its_pv_name_from_kubelet_and_leaves_no_target() {
    let claim = "/srv/nfs/pvc-1_team-b_db";
    let w = provisioned();
    let parent = w.root.join("pods/u1/volumes/kubernetes.io~csi/pvc-1");
    std::fs::create_dir_all(&parent).unwrap();
    let target = parent.join("mount");
    let json = crate::protocol::options::testing::options_json(
        &[
            ("kubernetes.io/pod.namespace", "team-a"),
            ("server", "10.0.0.5"),
            ("share", claim),
        ],
        &format!(
            r#","capabilityToken":"{}""#,
            sign("pvc-1", "10.0.0.5", claim)
        ),
    );
    let e = w
        .with_ctx(|ctx| publish(ctx, &w.prober, &target, &Options::parse(&json).unwrap()))
        .unwrap_err();
    assert!(e.to_string().contains("Nothing was mounted"), "{e}");
    assert_eq!(w.runner.count("mount.nfs"), 0);
    assert!(
        !target.exists(),
        "the target made by the refused publish is left"
    );
    // A static export of another server: published into the target it makes, then unpublished.
    let json = crate::protocol::options::testing::options_json(
        &[("server", "10.0.0.6"), ("share", "/srv/nfs")],
        "",
    );
    w.with_ctx(|ctx| publish(ctx, &w.prober, &target, &Options::parse(&json).unwrap()))
        .unwrap();
    assert!(target.is_dir());
    assert_eq!(w.runner.count("mount.nfs"), 1);
    w.with_ctx(|ctx| unpublish(ctx, &w.prober, &target))
        .unwrap();
    assert!(!target.exists(), "unpublish removes the empty target");
    // The PV's name, as flexvol csi takes it from the target path: its own PV and namespace only.
    let named = |pv: &str, ns: &str| {
        crate::protocol::options::testing::options_json(
            &[
                ("kubernetes.io/pod.namespace", ns),
                ("kubernetes.io/pvOrVolumeName", pv),
                ("server", "10.0.0.5"),
                ("share", claim),
            ],
            &format!(
                r#","capabilityToken":"{}""#,
                sign("pvc-1", "10.0.0.5", claim)
            ),
        )
    };
    for (pv, ns) in [("pvc-copy", "team-a"), ("pvc-1", "team-b")] {
        let json = named(pv, ns);
        let e = w
            .with_ctx(|ctx| publish(ctx, &w.prober, &target, &Options::parse(&json).unwrap()))
            .unwrap_err();
        assert!(
            e.to_string().contains("Nothing was mounted"),
            "{pv} {ns}: {e}"
        );
        assert!(!target.exists());
    }
    assert_eq!(w.runner.count("mount.nfs"), 1);
    let json = named("pvc-1", "team-a");
    w.with_ctx(|ctx| publish(ctx, &w.prober, &target, &Options::parse(&json).unwrap()))
        .unwrap();
    assert_eq!(w.runner.count("mount.nfs"), 2);
}
