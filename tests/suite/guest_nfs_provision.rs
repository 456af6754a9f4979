//! Guest tier, NFS provisioning: `flexvol::provision::storage::nfs::NfsProvisioner` against the guest's real
//! kernel NFS server and client (`tests/vm/run --nfs-server SUITE --ignored --test-threads=1
//! guest_nfs_provision`), as root. The export is `127.0.0.1:/srv/nfs`; each test makes its own
//! class export below it (`/srv/nfs/<test>`, mountable since Linux exports subdirectories) and
//! checks the server side directly (the guest is the server).
//!
//! What only the real thing proves: the export really is mounted through the NFS driver and
//! unmounted again (no mount left under the run dir, also after failures), the PV's share is a
//! mountable export path that pods write into, racing instances (two "nodes": two run dirs) meet on
//! the same NFS directory, and a dead server fails within the probe's deadline.

use flexvol::node::config::Config;
use flexvol::provision::storage::nfs::{
    self, DriverExports, Exports, NfsProvisioner, ServerFailure,
};
use flexvol::provision::storage::{Provisioned, Provisioner, Refusal, Request};
use k8s_openapi::api::core::v1::{
    FlexPersistentVolumeSource, ObjectReference, PersistentVolume, PersistentVolumeClaim,
    PersistentVolumeSpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use std::collections::BTreeMap;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

const IGNORE: &str = "guest tier: needs a kernel NFS server; run inside the test VM";

fn require_server() {
    assert!(
        Path::new("/proc/fs/nfsd/threads").exists()
            && std::net::TcpStream::connect("127.0.0.1:2049").is_ok(),
        "{IGNORE}: no NFS server on 127.0.0.1:2049 (use tests/vm/run --nfs-server)"
    );
}

/// One provisioner instance ("node"): its own config (run and state dirs in `tmp`).
struct Node {
    cfg: Config,
    backend: NfsProvisioner,
    name: String,
}

/// The class exports of these tests (and the dead server's), all listed as provisioned.
const EXPORTS: &[&str] = &[
    "127.0.0.1:/srv/nfs/prov-basic",
    "127.0.0.1:/srv/nfs/prov-archive",
    "127.0.0.1:/srv/nfs/prov-race",
    "127.0.0.1:/srv/nfs/prov-dead",
    "127.0.0.1:/srv/nfs/prov-recover",
    "127.0.0.1:/srv/nfs/prov-dies",
    "127.0.0.1:/srv/nfs/prov-steal",
    "127.0.0.1:/srv/nfs/prov-squat",
    "192.0.2.1:/srv/nfs",
];

/// The `nfs` node config of every "node" in `tmp`: [`EXPORTS`] and one shared key
/// (`tmp/nfs.key`, root-only, made once).
fn nfs_config(tmp: &Path) -> serde_json::Value {
    let key = tmp.join("nfs.key");
    if !key.exists() {
        std::fs::write(&key, b"the guest's shared NFS key......").unwrap();
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o400)).unwrap();
    }
    serde_json::json!({"provisionedExports": EXPORTS, "capabilityKeyFile": key})
}

fn node(tmp: &Path, name: &str) -> Node {
    let json = serde_json::json!({
        "runDir": tmp.join(name).join("run"),
        "stateDir": tmp.join(name).join("state"),
        "nfs": nfs_config(tmp),
    });
    Node {
        cfg: Config::parse(Path::new("/test"), json.to_string().as_bytes()).unwrap(),
        backend: NfsProvisioner::new("flexvol/nfs".into()),
        name: name.into(),
    }
}

/// A fresh class export `/srv/nfs/<name>` on the server.
fn export(name: &str) -> PathBuf {
    let p = Path::new("/srv/nfs").join(name);
    let _ = std::fs::remove_dir_all(&p);
    std::fs::create_dir_all(&p).unwrap();
    p
}

fn class(share: &Path, extra: &[(&str, &str)]) -> BTreeMap<String, String> {
    let mut m = BTreeMap::from([
        ("server".to_owned(), "127.0.0.1".to_owned()),
        ("share".to_owned(), share.to_str().unwrap().to_owned()),
    ]);
    for (k, v) in extra {
        m.insert(k.to_string(), v.to_string());
    }
    m
}

fn provision(
    n: &mut Node,
    p: &BTreeMap<String, String>,
    uid: &str,
) -> Result<Provisioned, Refusal> {
    let claim = PersistentVolumeClaim::default();
    let pv = format!("pvc-{uid}");
    let modes = ["ReadWriteMany".to_owned()];
    let name = format!("claim-{uid}");
    let req = Request {
        pv_name: &pv,
        claim: &claim,
        namespace: "ns",
        name: &name,
        uid,
        class_name: "nfs",
        params: p,
        size_bytes: 64 << 20,
        access_modes: &modes,
        node: &n.name,
        source: None,
    };
    n.backend.provision(&n.cfg, &req)
}

fn pv_of(uid: &str, p: &Provisioned) -> PersistentVolume {
    PersistentVolume {
        metadata: ObjectMeta {
            name: Some(format!("pvc-{uid}")),
            annotations: Some(p.annotations.clone()),
            ..Default::default()
        },
        spec: Some(PersistentVolumeSpec {
            flex_volume: Some(FlexPersistentVolumeSource {
                driver: "flexvol/nfs".into(),
                options: Some(p.options.clone()),
                ..Default::default()
            }),
            claim_ref: Some(ObjectReference {
                uid: Some(uid.into()),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// NFS mounts anywhere below `dir`.
fn nfs_mounts_below(dir: &Path) -> Vec<PathBuf> {
    flexvol::sys::mountinfo::MountTable::read()
        .unwrap()
        .entries
        .iter()
        .filter(|m| m.fs_type.starts_with("nfs") && m.mount_point.starts_with(dir))
        .map(|m| m.mount_point.clone())
        .collect()
}

/// The names in `dir`, without flexvol's root-only record directory (`.flexvol`).
fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n != flexvol::provision::storage::volumedir::STATE_DIR)
        .collect();
    v.sort();
    v
}

#[test]
#[ignore = "guest tier: needs a kernel NFS server; run inside the test VM"]
fn guest_nfs_provision_creates_a_mountable_subdirectory_and_deletes_exactly_it() {
    require_server();
    let tmp = tempfile::tempdir().unwrap();
    let mut a = node(tmp.path(), "node-a");
    let share = export("prov-basic");
    let p = class(
        &share,
        &[
            ("pathPattern", "{{ .PVC.Namespace }}/{{ .PVC.Name }}"),
            ("uid", "1000"),
            ("gid", "1000"),
            ("mode", "0770"),
            ("onDelete", "delete"),
            ("mountOptions", "hard,noatime"),
        ],
    );
    let t = Instant::now();
    let got = provision(&mut a, &p, "u1").unwrap();
    eprintln!(
        "provision (mount, mkdir, marker, unmount) took {:?}",
        t.elapsed()
    );
    let dir = share.join("ns/claim-u1");
    assert_eq!(got.options["share"], dir.to_str().unwrap());
    assert_eq!(got.options["server"], "127.0.0.1");
    assert_eq!(got.options["mountOptions"], "hard,noatime");
    let md = std::fs::metadata(&dir).unwrap();
    assert_eq!(
        (md.uid(), md.gid(), md.permissions().mode() & 0o7777),
        (1000, 1000, 0o770)
    );
    assert_eq!(names(&dir), [".flexvol-provisioned"]);
    assert!(
        nfs_mounts_below(tmp.path()).is_empty(),
        "the provisioner's mount was left"
    );
    assert_eq!(
        names(&a.cfg.run_dir.join(nfs::MOUNT_DIR).join("node-a")),
        Vec::<String>::new()
    );
    // The second volume of the class, beside it.
    provision(&mut a, &p, "u2").unwrap();

    // A pod mounts the PV's source through the driver and writes: it lands in the directory.
    let pod_dir = tmp.path().join("pod");
    std::fs::create_dir(&pod_dir).unwrap();
    let mut opts = got.options.clone();
    opts.insert("kubernetes.io/pvOrVolumeName".into(), "pvc-u1".into());
    let json = serde_json::to_string(&opts).unwrap();
    DriverExports.mount(&a.cfg, &json, &pod_dir).unwrap();
    std::fs::write(pod_dir.join("hello"), b"from the pod").unwrap();
    DriverExports.unmount(&a.cfg, &pod_dir).unwrap();
    assert_eq!(std::fs::read(dir.join("hello")).unwrap(), b"from the pod");

    // Delete: exactly that directory goes; the pattern's parent and the sibling stay.
    let t = Instant::now();
    let said = a.backend.delete(&a.cfg, &pv_of("u1", &got)).unwrap();
    eprintln!("delete took {:?}: {said}", t.elapsed());
    assert!(!dir.exists());
    assert_eq!(names(&share), ["ns"]);
    assert_eq!(names(&share.join("ns")), ["claim-u2"]);
    assert!(nfs_mounts_below(tmp.path()).is_empty());
    // Again (a retry, or another instance after us): done already.
    assert!(
        a.backend
            .delete(&a.cfg, &pv_of("u1", &got))
            .unwrap()
            .contains("already gone")
    );
}

#[test]
#[ignore = "guest tier: needs a kernel NFS server; run inside the test VM"]
fn guest_nfs_provision_never_adopts_a_squatted_directory() {
    require_server();
    let tmp = tempfile::tempdir().unwrap();
    let mut a = node(tmp.path(), "node-a");
    let share = export("prov-squat");
    let p = class(
        &share,
        &[
            ("pathPattern", "{{ .PVC.Namespace }}/{{ .PVC.Name }}"),
            ("uid", "1000"),
            ("gid", "1000"),
            ("mode", "0770"),
            ("onDelete", "delete"),
        ],
    );
    // Somebody made the claim's directory first (empty, open to all) and may have it mounted.
    let squat = share.join("ns/claim-u1");
    std::fs::create_dir_all(&squat).unwrap();
    std::fs::set_permissions(&squat, PermissionsExt::from_mode(0o777)).unwrap();
    match provision(&mut a, &p, "u1") {
        Err(Refusal::Fail(e)) => assert!(e.contains("never adopts"), "{e}"),
        other => panic!("{other:?}"),
    }
    assert_eq!(names(&squat), Vec::<String>::new(), "no marker written");
    let md = std::fs::metadata(&squat).unwrap();
    assert_eq!((md.uid(), md.permissions().mode() & 0o7777), (0, 0o777));
    assert_eq!(
        names(&share.join("ns")),
        ["claim-u1"],
        "nothing left beside it"
    );
    assert!(nfs_mounts_below(tmp.path()).is_empty());
    // Once it is moved away, the claim gets a directory of its own, set up and recorded; the
    // record directory on the export is root's alone.
    std::fs::rename(&squat, share.join("moved")).unwrap();
    provision(&mut a, &p, "u1").unwrap();
    let md = std::fs::metadata(&squat).unwrap();
    assert_eq!(
        (md.uid(), md.gid(), md.permissions().mode() & 0o7777),
        (1000, 1000, 0o770)
    );
    let rec = share.join(".flexvol/volumes/pvc-u1.json");
    let text = std::fs::read_to_string(&rec).unwrap();
    assert!(text.contains(&format!("\"ino\":{}", md.ino())), "{text}");
    let rd = std::fs::metadata(share.join(".flexvol/volumes")).unwrap();
    assert_eq!((rd.uid(), rd.permissions().mode() & 0o777), (0, 0o700));
    // Parents a pattern makes are root's, 0755.
    let pd = std::fs::metadata(share.join("ns")).unwrap();
    assert_eq!((pd.uid(), pd.permissions().mode() & 0o7777), (0, 0o755));
}

#[test]
#[ignore = "guest tier: needs a kernel NFS server; run inside the test VM"]
fn guest_nfs_provision_archive_and_retain_keep_the_data() {
    require_server();
    let tmp = tempfile::tempdir().unwrap();
    let mut a = node(tmp.path(), "node-a");
    let share = export("prov-archive");
    let pattern = ("pathPattern", "{{ .PVC.Namespace }}/{{ .PVC.Name }}");
    let arch = provision(&mut a, &class(&share, &[pattern]), "u1").unwrap();
    assert_eq!(
        arch.annotations[flexvol::vocab::ANN_ON_DELETE],
        "archive",
        "the default"
    );
    std::fs::write(share.join("ns/claim-u1/data"), b"keep me").unwrap();
    let said = a.backend.delete(&a.cfg, &pv_of("u1", &arch)).unwrap();
    let archives: Vec<String> = names(&share)
        .into_iter()
        .filter(|n| n.starts_with("archived-pvc-u1-"))
        .collect();
    assert_eq!(archives.len(), 1, "{said}");
    assert_eq!(
        std::fs::read(share.join(&archives[0]).join("data")).unwrap(),
        b"keep me"
    );
    assert!(!share.join("ns/claim-u1").exists());
    assert!(share.join("ns").is_dir());

    let kept = provision(
        &mut a,
        &class(&share, &[pattern, ("onDelete", "retain")]),
        "u2",
    )
    .unwrap();
    std::fs::write(share.join("ns/claim-u2/data"), b"keep me too").unwrap();
    let said = a.backend.delete(&a.cfg, &pv_of("u2", &kept)).unwrap();
    assert!(said.starts_with("kept "), "{said}");
    assert_eq!(
        std::fs::read(share.join("ns/claim-u2/data")).unwrap(),
        b"keep me too"
    );
    assert!(nfs_mounts_below(tmp.path()).is_empty());
}

#[test]
#[ignore = "guest tier: needs a kernel NFS server; run inside the test VM"]
fn guest_nfs_provision_racing_instances_make_one_directory_and_both_delete() {
    require_server();
    let tmp = tempfile::tempdir().unwrap();
    let share = export("prov-race");
    let p = class(&share, &[("onDelete", "delete"), ("uid", "1000")]);
    for round in 0..3 {
        let uid = format!("u{round}");
        let mut nodes = [node(tmp.path(), "node-a"), node(tmp.path(), "node-b")];
        let got: Vec<_> = std::thread::scope(|s| {
            let hs: Vec<_> = nodes
                .iter_mut()
                .map(|n| {
                    let (p, uid) = (&p, &uid);
                    s.spawn(move || provision(n, p, uid))
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let first = got[0].clone().unwrap();
        assert_eq!(got[1].clone().unwrap(), first);
        let dir = share.join(&first.annotations[flexvol::vocab::ANN_PATH]);
        assert_eq!(names(&dir), [".flexvol-provisioned"]);
        let pv = pv_of(&uid, &first);
        let said: Vec<_> = std::thread::scope(|s| {
            let hs: Vec<_> = nodes
                .iter_mut()
                .map(|n| {
                    let pv = &pv;
                    s.spawn(move || n.backend.delete(&n.cfg, pv))
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for r in &said {
            assert!(r.is_ok(), "{said:?}");
        }
        assert!(!dir.exists());
        assert_eq!(names(&share), Vec::<String>::new(), "no tombstone left");
        assert!(nfs_mounts_below(tmp.path()).is_empty());
    }
}

#[test]
#[ignore = "guest tier: needs a kernel NFS server; run inside the test VM"]
fn guest_nfs_provision_dead_server_fails_within_the_probe_deadline() {
    require_server();
    let tmp = tempfile::tempdir().unwrap();
    let mut a = node(tmp.path(), "node-a");
    let budget = Duration::from_secs(a.cfg.nfs.probe_timeout_seconds + 3);
    // No route (TEST-NET-1), then a live host whose nfsd is down.
    for (server, share) in [
        ("192.0.2.1", "/srv/nfs"),
        ("127.0.0.1", "/srv/nfs/prov-dead"),
    ] {
        if server == "127.0.0.1" {
            export("prov-dead");
        }
        let _down = (server == "127.0.0.1").then(crate::guest_nfs::ServerDown::new);
        let mut p = class(Path::new(share), &[]);
        p.insert("server".into(), server.into());
        let t = Instant::now();
        let e = provision(&mut a, &p, "u1").unwrap_err();
        let took = t.elapsed();
        eprintln!("dead server {server}: failed after {took:?}: {e:?}");
        // The server's failure: it opens the server's breaker in the reconciler.
        let Refusal::Unavailable(why) = e else {
            panic!("{e:?}")
        };
        assert!(why.contains("unreachable"), "{why}");
        assert!(took < budget, "took {took:?}, more than {budget:?}");
        assert!(nfs_mounts_below(tmp.path()).is_empty());
    }
    assert_eq!(names(Path::new("/srv/nfs/prov-dead")), Vec::<String>::new());
    assert_eq!(
        names(&a.cfg.run_dir.join(nfs::MOUNT_DIR).join("node-a")),
        Vec::<String>::new()
    );
}

#[test]
#[ignore = "guest tier: needs a kernel NFS server; run inside the test VM"]
fn guest_nfs_provision_recover_unmounts_what_a_kill_left() {
    require_server();
    let tmp = tempfile::tempdir().unwrap();
    let mut a = node(tmp.path(), "node-a");
    let share = export("prov-recover");
    // What a kill -9 between mount and unmount leaves: the export mounted on the private dir.
    let left = a
        .cfg
        .run_dir
        .join(nfs::MOUNT_DIR)
        .join("node-a")
        .join("pvc-u1");
    std::fs::create_dir_all(&left).unwrap();
    let json = serde_json::json!({"server": "127.0.0.1", "share": share}).to_string();
    DriverExports.mount(&a.cfg, &json, &left).unwrap();
    assert_eq!(nfs_mounts_below(tmp.path()).len(), 1);
    // The next provision of that PV reuses it (the driver's mount is idempotent) and cleans up.
    let got = provision(&mut a, &class(&share, &[]), "u1").unwrap();
    assert!(
        share
            .join(&got.annotations[flexvol::vocab::ANN_PATH])
            .is_dir()
    );
    assert!(nfs_mounts_below(tmp.path()).is_empty());
    // And recover() removes one of any other PV.
    let left2 = a
        .cfg
        .run_dir
        .join(nfs::MOUNT_DIR)
        .join("node-a")
        .join("pvc-u2");
    std::fs::create_dir_all(&left2).unwrap();
    DriverExports.mount(&a.cfg, &json, &left2).unwrap();
    let errors = a.backend.recover(&a.cfg, "node-a");
    assert!(errors.is_empty(), "{errors:?}");
    assert!(nfs_mounts_below(tmp.path()).is_empty());
    assert!(!left2.exists());
}

/// Mounts through the driver, then the server falls silent (every packet on `lo` dropped) until
/// the test ends: a server that dies while the provisioner works in its export.
struct DiesAfterMount(std::sync::Mutex<Option<crate::guest_nfs::Blackhole>>);

impl Exports for DiesAfterMount {
    fn mount(&self, cfg: &Config, options: &str, dir: &Path) -> Result<PathBuf, ServerFailure> {
        let root = DriverExports.mount(cfg, options, dir)?;
        let hole = crate::guest_nfs::Blackhole::new().expect(
            "cannot blackhole lo: `tc qdisc add dev lo root netem loss 100%` failed in the guest",
        );
        *self.0.lock().unwrap() = Some(hole);
        Ok(root)
    }

    fn unmount(&self, cfg: &Config, dir: &Path) -> Result<(), ServerFailure> {
        DriverExports.unmount(cfg, dir)
    }
}

#[test]
#[ignore = "guest tier: needs a kernel NFS server; run inside the test VM"]
fn guest_nfs_provision_server_dying_mid_work_fails_in_bounded_time_and_unmounts() {
    require_server();
    let tmp = tempfile::tempdir().unwrap();
    let share = export("prov-dies");
    let hole = std::sync::Arc::new(DiesAfterMount(std::sync::Mutex::default()));
    struct Shared(std::sync::Arc<DiesAfterMount>);
    impl Exports for Shared {
        fn mount(&self, cfg: &Config, options: &str, dir: &Path) -> Result<PathBuf, ServerFailure> {
            self.0.mount(cfg, options, dir)
        }
        fn unmount(&self, cfg: &Config, dir: &Path) -> Result<(), ServerFailure> {
            self.0.unmount(cfg, dir)
        }
    }
    let mut a = node(tmp.path(), "node-a");
    a.backend = NfsProvisioner::with_exports("flexvol/nfs".into(), Box::new(Shared(hole.clone())));
    let t = Instant::now();
    let e = provision(&mut a, &class(&share, &[]), "u1").unwrap_err();
    let took = t.elapsed();
    let left = nfs_mounts_below(tmp.path());
    drop(hole.0.lock().unwrap().take()); // the server answers again
    eprintln!("server died after the mount: provision failed after {took:?}: {e:?}");
    assert!(matches!(e, Refusal::Fail(_)), "{e:?}");
    // soft,timeo=30,retrans=2: about 18 s per operation, then the driver's forced/lazy unmount.
    assert!(took < Duration::from_secs(60), "took {took:?}");
    assert!(
        left.is_empty(),
        "the provisioner's mount was left: {left:?}"
    );
}

/// #20 hole 2, against the real server and the real driver binary: inline volumes of the export
/// root, a path above it, a claim's directory (named like its PV), or the same directory through
/// another name of the server get a Failure and no mount; the PV's own options mount and write.
#[test]
#[ignore = "guest tier: needs a kernel NFS server; run inside the test VM"]
fn guest_nfs_provision_inline_volumes_cannot_reach_provisioned_directories() {
    require_server();
    let env = crate::util::Env::with_config(serde_json::json!({}));
    let tmp = env.root();
    env.reconfigure(serde_json::json!({ "nfs": nfs_config(&tmp) }));
    let mut a = node(&tmp, "node-a");
    let share = export("prov-steal");
    let got = provision(&mut a, &class(&share, &[]), "u1").unwrap();
    let dir = share.join(&got.annotations[flexvol::vocab::ANN_PATH]);
    std::fs::write(dir.join("secret"), b"team-b's data").unwrap();
    let payload_in = |ns: &str, name: &str, server: &str, share: &str, token: Option<&str>| {
        let mut j = serde_json::json!({
            "kubernetes.io/fsType": "nfs",
            "kubernetes.io/pod.name": "evil",
            "kubernetes.io/pod.namespace": ns,
            "kubernetes.io/pod.uid": "uid-evil",
            "kubernetes.io/pvOrVolumeName": name,
            "kubernetes.io/readwrite": "rw",
            "server": server,
            "share": share,
        });
        if let Some(t) = token {
            j["capabilityToken"] = t.into();
        }
        j.to_string()
    };
    let payload = |name: &str, server: &str, share: &str, token: Option<&str>| {
        payload_in("team-evil", name, server, share, token)
    };
    let pod = env.mkdir("kubelet/pods/uid-evil/volumes/flexvol~nfs/data");
    let claim = dir.to_str().unwrap();
    let token = got.options["capabilityToken"].as_str();
    for (name, server, share, token) in [
        ("data", "127.0.0.1", share.to_str().unwrap(), None),
        ("data", "127.0.0.1", "/srv/nfs", None),
        ("data", "127.0.0.1", "/", None),
        ("pvc-u1", "127.0.0.1", claim, None),
        ("pvc-u1", "localhost", claim, None),
        ("pvc-u2", "127.0.0.1", claim, Some(token)),
        ("pvc-u1", "127.0.0.1", share.to_str().unwrap(), Some(token)),
    ] {
        env.call(
            "nfs",
            &[
                "mount",
                pod.to_str().unwrap(),
                &payload(name, server, share, token),
            ],
        )
        .failed("served only to the PV");
        assert!(
            nfs_mounts_below(&tmp).is_empty(),
            "{server}:{share} was mounted"
        );
    }
    // Issue #32, 4: the PV's own options, token included, from a pod of another namespace (an
    // inline volume named after the PV): refused, nothing mounted.
    env.call(
        "nfs",
        &[
            "mount",
            pod.to_str().unwrap(),
            &payload("pvc-u1", "127.0.0.1", claim, Some(token)),
        ],
    )
    .failed("served only to pods of that namespace, not to namespace team-evil");
    assert!(nfs_mounts_below(&tmp).is_empty());
    // The PV's own options (as kubelet sends them for a pod of the claim's namespace): mounted,
    // and the claim's data is there.
    env.call(
        "nfs",
        &[
            "mount",
            pod.to_str().unwrap(),
            &payload_in("ns", "pvc-u1", "127.0.0.1", claim, Some(token)),
        ],
    )
    .ok();
    assert_eq!(std::fs::read(pod.join("secret")).unwrap(), b"team-b's data");
    env.call("nfs", &["unmount", pod.to_str().unwrap()]).ok();
    assert!(nfs_mounts_below(&tmp).is_empty());
    a.backend.delete(&a.cfg, &pv_of("u1", &got)).unwrap();
}

/// fsGroup (issue #24) on the guest's real NFS server: a provisioned volume (its PV's token under
/// the shared key) of a `no_root_squash` export gets the pod's group, group-write and set-gid on
/// the server, once (the next mount walks nothing); on a `root_squash` export root on the node
/// cannot chown: the volume is mounted with its ownership unchanged and the Success message says
/// why.
#[test]
#[ignore = "guest tier: needs a kernel NFS server; run inside the test VM"]
fn guest_nfs_fs_group_applies_on_provisioned_volumes_and_not_through_root_squash() {
    use flexvol::node::capability::{Key, Location};
    require_server();
    let env = crate::util::Env::with_config(serde_json::json!({}));
    let tmp = env.root();
    let key_file = tmp.join("nfs.key");
    std::fs::write(&key_file, b"the guest's shared NFS key......").unwrap();
    std::fs::set_permissions(&key_file, std::fs::Permissions::from_mode(0o400)).unwrap();
    env.reconfigure(serde_json::json!({ "nfs": {
        "provisionedExports": ["127.0.0.1:/srv/nfs/fsg-plain", "127.0.0.1:/srv/nfs/fsg-squash"],
        "capabilityKeyFile": key_file,
    }}));
    let key = Key::load(&key_file, "test").unwrap();
    let plain = export("fsg-plain").join("pvc-p_ns_c");
    // The squashing export is a filesystem of its own (a tmpfs), so that NFSv4 uses its export
    // options, not those of the guest's /srv/nfs above it.
    let squash_fs = export("fsg-squash");
    nix::mount::mount(
        Some("tmpfs"),
        &squash_fs,
        Some("tmpfs"),
        nix::mount::MsFlags::empty(),
        Some("size=64m"),
    )
    .unwrap();
    let squash = squash_fs.join("pvc-s_ns_c");
    for d in [&plain, &squash] {
        std::fs::create_dir_all(d.join("sub")).unwrap();
        std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o777)).unwrap();
        for i in 0..1000 {
            std::fs::write(d.join("sub").join(format!("f{i}")), b"x").unwrap();
        }
    }
    // A second export, below the guest's /srv/nfs one, that squashes root.
    let exportfs = |args: &[&str]| {
        let out = std::process::Command::new("/usr/sbin/exportfs")
            .args(args)
            .output()
            .unwrap();
        assert!(out.status.success(), "exportfs {args:?}: {out:?}");
    };
    exportfs(&[
        "-o",
        "rw,root_squash,no_subtree_check,insecure,fsid=77",
        "127.0.0.1:/srv/nfs/fsg-squash",
    ]);
    let payload = |pv: &str, share: &Path, uid: &str| {
        let share = share.to_str().unwrap();
        serde_json::json!({
            "kubernetes.io/fsType": "nfs",
            "kubernetes.io/pod.name": "p",
            "kubernetes.io/pod.namespace": "ns",
            "kubernetes.io/pod.uid": uid,
            "kubernetes.io/pvOrVolumeName": pv,
            "kubernetes.io/readwrite": "rw",
            "kubernetes.io/mounterArgs.FsGroup": "2345",
            "server": "127.0.0.1",
            "share": share,
            "capabilityToken": key.sign_for(pv, "ns", &Location::Nfs { server: "127.0.0.1", share }),
        })
        .to_string()
    };
    let gid_mode = |p: &Path| {
        let m = std::fs::symlink_metadata(p).unwrap();
        (m.gid(), m.mode() & 0o7777)
    };
    let mount = |pv: &str, share: &Path, uid: &str| {
        let pod = env.mkdir(&format!("kubelet/pods/{uid}/volumes/flexvol~nfs/{pv}"));
        let t = Instant::now();
        let r = env.call(
            "nfs",
            &["mount", pod.to_str().unwrap(), &payload(pv, share, uid)],
        );
        let took = t.elapsed();
        r.ok();
        (pod, r.message().to_owned(), took)
    };

    // no_root_squash: applied, on the server.
    let (pod1, said, first) = mount("pvc-p", &plain, "u1");
    assert!(said.contains("fsGroup 2345 applied"), "{said}");
    assert_eq!(gid_mode(&plain), (2345, 0o2777));
    assert_eq!(gid_mode(&plain.join("sub")).0, 2345);
    assert_eq!(gid_mode(&plain.join("sub/f999")), (2345, 0o664));
    let (pod2, said, second) = mount("pvc-p", &plain, "u2");
    assert_eq!(said, "", "the second mount walked again");
    eprintln!("NFS mount with fsGroup, 1,002 files: walked {first:?}, root matching {second:?}");

    // root_squash: mounted, nothing changed, the message says why.
    let (pod3, said, _) = mount("pvc-s", &squash, "u3");
    assert!(said.contains("squashes root"), "{said}");
    assert_eq!(gid_mode(&squash), (0, 0o777));
    assert_eq!(gid_mode(&squash.join("sub/f0")).0, 0);
    assert_eq!(nfs_mounts_below(&tmp).len(), 3);

    for p in [&pod1, &pod2, &pod3] {
        env.call("nfs", &["unmount", p.to_str().unwrap()]).ok();
    }
    exportfs(&["-u", "127.0.0.1:/srv/nfs/fsg-squash"]);
    nix::mount::umount2(&squash_fs, nix::mount::MntFlags::MNT_DETACH).unwrap();
    assert!(nfs_mounts_below(&tmp).is_empty());
}
