//! Unit tests of the NFS-subdirectory backend. The export is a local directory behind a fake
//! [`Exports`] (the real mount is proven in the guest: tests/suite/guest_nfs_provision.rs); the
//! filesystem work, the marker, the races and the delete modes are real.

use super::*;
use crate::provision::storage::volumedir::VolumeDirError;
use crate::vocab::ANN_EXPORT;
use crate::vocab::ANN_ON_DELETE;
use crate::vocab::ANN_PATH;
use k8s_openapi::api::core::v1::{
    FlexPersistentVolumeSource, ObjectReference, PersistentVolumeClaim, PersistentVolumeSpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::sync::{Arc, Mutex};

/// "Mounts" `server:share` by answering `<server dir>/<share>`; records every call.
#[derive(Clone)]
struct FakeExports {
    server_dir: PathBuf,
    dead: bool,
    log: Arc<Mutex<Vec<String>>>,
}

impl Exports for FakeExports {
    fn mount(&self, _cfg: &Config, options: &str, dir: &Path) -> Result<PathBuf, ServerFailure> {
        assert!(
            dir.is_dir(),
            "mount on a missing directory {}",
            dir.display()
        );
        let o: serde_json::Value = serde_json::from_str(options).unwrap();
        self.log.lock().unwrap().push(format!(
            "mount {}:{} {}",
            o["server"].as_str().unwrap(),
            o["share"].as_str().unwrap(),
            o["mountOptions"].as_str().unwrap_or("")
        ));
        if self.dead {
            return Err(ServerFailure("NFS server 192.0.2.1 is unreachable: nothing accepted a TCP connection. Nothing was mounted.".into()));
        }
        let root = self
            .server_dir
            .join(o["share"].as_str().unwrap().trim_start_matches('/'));
        assert!(
            root.is_dir(),
            "the server does not export {}",
            root.display()
        );
        Ok(root)
    }

    fn unmount(&self, _cfg: &Config, dir: &Path) -> Result<(), ServerFailure> {
        self.log.lock().unwrap().push(format!(
            "unmount {}",
            dir.file_name().unwrap().to_string_lossy()
        ));
        Ok(())
    }
}

/// The shared key of the fake nodes.
const KEY: &[u8] = b"a shared key of 32 bytes, really";

/// The token [`KEY`] signs for `pv` at `10.0.0.5:share`.
fn token(pv: &str, share: &str) -> String {
    crate::node::capability::Key::from_bytes(KEY).sign_for(
        pv,
        "ns",
        &crate::node::capability::Location::Nfs {
            server: "10.0.0.5",
            share,
        },
    )
}

struct World {
    _tmp: tempfile::TempDir,
    cfg: Config,
    export: PathBuf,
    exports: FakeExports,
}

impl World {
    fn new() -> Self {
        let tmp = tempfile::tempdir().unwrap();
        let server_dir = std::fs::canonicalize(tmp.path()).unwrap().join("server");
        let export = server_dir.join("srv/nfs");
        std::fs::create_dir_all(&export).unwrap();
        let key_file = tmp.path().join("nfs.key");
        std::fs::write(&key_file, KEY).unwrap();
        std::fs::set_permissions(&key_file, std::fs::Permissions::from_mode(0o400)).unwrap();
        let mut cfg = Config {
            run_dir: tmp.path().join("run"),
            state_dir: tmp.path().join("state"),
            ..Config::default()
        };
        cfg.nfs.capability_key_file = Some(key_file);
        cfg.nfs.provisioned_exports = ["10.0.0.5", "192.0.2.1"]
            .iter()
            .map(|s| crate::backend::nfs::options::Export {
                server: s.to_string(),
                share: "/srv/nfs".into(),
            })
            .collect();
        let exports = FakeExports {
            server_dir,
            dead: false,
            log: Arc::default(),
        };
        Self {
            _tmp: tmp,
            cfg,
            export,
            exports,
        }
    }

    fn backend(&self) -> NfsProvisioner {
        NfsProvisioner::with_exports("flexvol/nfs".into(), Box::new(self.exports.clone()))
    }

    fn log(&self) -> Vec<String> {
        self.exports.log.lock().unwrap().clone()
    }

    fn root(&self) -> Root {
        Root {
            configured: self.export.clone(),
            real: self.export.clone(),
        }
    }
}

fn params(kv: &[(&str, &str)]) -> BTreeMap<String, String> {
    let mut m: BTreeMap<String, String> = [("server", "10.0.0.5"), ("share", "/srv/nfs/")]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    for (k, v) in kv {
        if v.is_empty() {
            m.remove(*k);
        } else {
            m.insert(k.to_string(), v.to_string());
        }
    }
    m
}

/// Provisions claim `ns/name` (uid `uid`) as node `node`.
fn provision(
    b: &mut NfsProvisioner,
    cfg: &Config,
    p: &BTreeMap<String, String>,
    uid: &str,
    node: &str,
) -> Result<Provisioned, Refusal> {
    let claim = PersistentVolumeClaim::default();
    let pv = format!("pvc-{uid}");
    let modes = ["ReadWriteMany".to_owned()];
    let req = Request {
        pv_name: &pv,
        claim: &claim,
        namespace: "ns",
        name: &format!("claim-{uid}"),
        uid,
        class_name: "nfs",
        params: p,
        size_bytes: 1 << 30,
        access_modes: &modes,
        node,
        source: None,
    };
    b.provision(cfg, &req)
}

/// The PV the reconciler would build from `p`.
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

fn marker(pv: &str, uid: &str, node: &str) -> Marker {
    Marker {
        provisioner: "flexvol/nfs".into(),
        volume: pv.into(),
        namespace: "ns".into(),
        claim: "c".into(),
        claim_uid: uid.into(),
        node: node.into(),
        project_id: None,
    }
}

#[test]
fn class_parameters_use_the_nfs_drivers_validation() {
    let nfs = NfsConfig::default();
    let c = NfsClass::parse(&params(&[]), &nfs).unwrap();
    assert_eq!(
        c.share, "/srv/nfs",
        "trailing slash trimmed by the driver's check"
    );
    assert_eq!(c.on_delete, OnDelete::Archive, "documented default");
    assert_eq!(
        c.dir.ownership,
        Ownership::default(),
        "root:root 0755 default"
    );
    let c = NfsClass::parse(
        &params(&[
            ("version", "4.2"),
            ("mountOptions", "noatime,nconnect=4"),
            ("pathPattern", "{{ .PVC.Namespace }}/{{ .PVC.Name }}"),
            ("uid", "1000"),
            ("gid", "2000"),
            ("mode", "0770"),
            ("onDelete", "delete"),
        ]),
        &nfs,
    )
    .unwrap();
    assert_eq!(c.on_delete, OnDelete::Delete);
    assert_eq!(c.dir.ownership.mode, Some(0o770));
    for (bad, want) in [
        (
            params(&[("archiveOnDelete", "false")]),
            "unknown class parameter",
        ),
        (params(&[("server", "")]), "server is missing"),
        (params(&[("share", "")]), "share is missing"),
        (params(&[("server", "-oexec")]), "server"),
        (params(&[("server", "10.0.0.5:/x")]), "server"),
        (params(&[("share", "srv/nfs")]), "share"),
        (params(&[("share", "/srv/../etc")]), "share"),
        (params(&[("mountOptions", "vers=3")]), "version"),
        (params(&[("mountOptions", "suid")]), "suid"),
        (params(&[("mountOptions", "fsc")]), "not an allowed"),
        (params(&[("mountOptions", "noatime,,x")]), "empty item"),
        (params(&[("version", "5")]), "version"),
        (params(&[("onDelete", "Delete")]), "onDelete"),
        (
            params(&[("pathPattern", "../{{ .PVName }}")]),
            "pathPattern",
        ),
        (params(&[("uid", "bob")]), "numeric id"),
    ] {
        let e = NfsClass::parse(&bad, &nfs).unwrap_err().to_string();
        assert!(e.contains(want), "{bad:?}: {e}");
    }
    // The node's policy applies: an extra option the node allows passes there.
    let lenient = NfsConfig {
        extra_mount_options: vec!["fsc".into()],
        ..NfsConfig::default()
    };
    NfsClass::parse(&params(&[("mountOptions", "fsc")]), &lenient).unwrap();
}

#[test]
fn the_provisioners_own_mount_is_soft_and_read_write() {
    assert_eq!(
        work_options(Some("hard,timeo=600,noatime,ro,retrans=9,nconnect=4")),
        "noatime,nconnect=4,soft,timeo=30,retrans=2"
    );
    assert_eq!(work_options(None), WORK_MOUNT_OPTIONS);
    // And the driver accepts what comes out, with the node's default (hard) replaced.
    let c = NfsClass::parse(
        &params(&[("mountOptions", "hard,ro")]),
        &NfsConfig::default(),
    )
    .unwrap();
    let o = NfsOptions::parse(
        &Options::parse(&c.export_json()).unwrap(),
        &NfsConfig::default(),
    )
    .unwrap();
    assert!(!o.read_only);
    assert_eq!(o.mount_options, "rw,soft,timeo=30,retrans=2,nosuid,nodev");
}

#[test]
fn provision_makes_a_marked_directory_and_the_pv_source() {
    let w = World::new();
    let mut b = w.backend();
    assert!(!b.kind().node_local);
    assert!(b.kind().access_modes.contains(&"ReadWriteMany"));
    let p = params(&[
        ("pathPattern", "{{ .PVC.Namespace }}/{{ .PVC.Name }}"),
        ("uid", "1234"),
        ("gid", "5678"),
        ("mode", "0770"),
        ("mountOptions", "hard,noatime"),
        ("version", "4.2"),
    ]);
    let got = provision(&mut b, &w.cfg, &p, "u1", "node-a").unwrap();
    let dir = w.export.join("ns/claim-u1");
    assert_eq!(
        got.options,
        BTreeMap::from([
            ("server".into(), "10.0.0.5".into()),
            ("share".into(), "/srv/nfs/ns/claim-u1".into()),
            ("version".into(), "4.2".into()),
            ("mountOptions".into(), "hard,noatime".into()),
            (
                "capabilityToken".into(),
                token("pvc-u1", "/srv/nfs/ns/claim-u1")
            ),
        ])
    );
    // Signed for exactly this PV and share: the driver's check of another is a refusal.
    let key = crate::node::capability::Key::from_bytes(KEY);
    let t = &got.options["capabilityToken"];
    let at = |share| crate::node::capability::Location::Nfs {
        server: "10.0.0.5",
        share,
    };
    assert!(key.verify("pvc-u1", &at("/srv/nfs/ns/claim-u1"), t));
    assert!(!key.verify("pvc-u1", &at("/srv/nfs"), t));
    assert!(!key.verify("pvc-u2", &at("/srv/nfs/ns/claim-u1"), t));
    assert_eq!(got.capacity_bytes, 1 << 30);
    assert_eq!(got.location, "10.0.0.5:/srv/nfs/ns/claim-u1");
    assert_eq!(got.annotations[ANN_EXPORT], "/srv/nfs");
    assert_eq!(got.annotations[ANN_PATH], "ns/claim-u1");
    assert_eq!(got.annotations[ANN_ON_DELETE], "archive");
    assert_eq!(got.annotations[ANN_SIZE_ENFORCED], "false");
    assert_eq!(
        got.annotations[crate::vocab::ANN_SIZE],
        (1u64 << 30).to_string()
    );
    assert!(got.annotations[ANN_SIZE_NOTE].contains("does not limit"));
    let md = std::fs::metadata(&dir).unwrap();
    assert_eq!((md.uid(), md.gid()), (1234, 5678));
    assert_eq!(md.permissions().mode() & 0o7777, 0o770);
    let m: Marker =
        serde_json::from_slice(&std::fs::read(dir.join(volumedir::MARKER)).unwrap()).unwrap();
    assert_eq!((m.volume.as_str(), m.node.as_str()), ("pvc-u1", "node-a"));
    assert_eq!(m.provisioner, "flexvol/nfs");
    // Mounted soft with the class's other options, and unmounted; the private dir is gone.
    assert_eq!(
        w.log(),
        [
            "mount 10.0.0.5:/srv/nfs noatime,soft,timeo=30,retrans=2",
            "unmount pvc-u1"
        ]
    );
    assert!(
        !w.cfg
            .run_dir
            .join(MOUNT_DIR)
            .join("node-a")
            .join("pvc-u1")
            .exists()
    );

    // Again, and from another instance (node-b) racing for the same claim: the same answer.
    std::fs::write(dir.join("data"), b"x").unwrap();
    assert_eq!(provision(&mut b, &w.cfg, &p, "u1", "node-a").unwrap(), got);
    let mut b2 = w.backend();
    assert_eq!(provision(&mut b2, &w.cfg, &p, "u1", "node-b").unwrap(), got);
    assert!(dir.join("data").exists());

    // Another claim whose pattern lands on the same directory: refused, left alone.
    let mut p2 = p.clone();
    p2.insert("pathPattern".into(), "ns/claim-u1".into());
    match provision(&mut b, &w.cfg, &p2, "u2", "node-a") {
        Err(Refusal::Fail(e)) => assert!(e.contains("is the directory of PV pvc-u1"), "{e}"),
        other => panic!("{other:?}"),
    }
    // Every mount was unmounted, also after the failure.
    let log = w.log();
    assert_eq!(
        log.iter().filter(|l| l.starts_with("mount")).count(),
        log.iter().filter(|l| l.starts_with("unmount")).count()
    );
}

/// #20: an export the node config does not list as provisioned, or no shared key: nothing is
/// mounted or made, and the message says what to do.
#[test]
fn provision_refuses_an_unlisted_export_and_one_without_the_shared_key() {
    let w = World::new();
    let mut b = w.backend();
    for p in [
        params(&[("server", "10.0.0.6")]),
        params(&[("share", "/srv")]),
        params(&[("share", "/srv/nfs/sub")]),
    ] {
        std::fs::create_dir_all(w.export.join("sub")).unwrap();
        match provision(&mut b, &w.cfg, &p, "u1", "node-a") {
            Err(Refusal::Fail(e)) => {
                assert!(
                    e.contains("not in nfs.provisionedExports") && e.contains("node-a"),
                    "{e}"
                );
            }
            other => panic!("{p:?}: {other:?}"),
        }
    }
    // A listed export, but no shared key (not configured, or configured and missing).
    let listed = params(&[("server", "10.0.0.5")]);
    let mut cfg = w.cfg.clone();
    cfg.nfs.capability_key_file = None;
    let mut missing = w.cfg.clone();
    missing.nfs.capability_key_file = Some(w.export.join("../no.key"));
    for cfg in [&cfg, &missing] {
        match provision(&mut b, cfg, &listed, "u1", "node-a") {
            Err(Refusal::Fail(e)) => {
                assert!(
                    e.contains("create secret generic flexvol-nfs-key")
                        && e.contains("nfs.capabilityKeyFile"),
                    "{e}"
                );
            }
            other => panic!("{other:?}"),
        }
    }
    assert!(w.log().is_empty(), "mounted: {:?}", w.log());
    assert_eq!(
        std::fs::read_dir(&w.export).unwrap().count(),
        1,
        "only the test's own sub"
    );
}

#[test]
fn a_dead_server_fails_and_creates_nothing() {
    let mut w = World::new();
    w.exports.dead = true;
    let mut b = w.backend();
    let p = params(&[("server", "192.0.2.1")]);
    match provision(&mut b, &w.cfg, &p, "u1", "node-a") {
        Err(Refusal::Unavailable(e)) => {
            assert!(e.contains("192.0.2.1:/srv/nfs"), "{e}");
            assert!(e.contains("unreachable"), "{e}");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(std::fs::read_dir(&w.export).unwrap().count(), 0);
    assert_eq!(
        std::fs::read_dir(w.cfg.run_dir.join(MOUNT_DIR).join("node-a"))
            .unwrap()
            .count(),
        0,
        "the private mount directory is removed"
    );
}

#[test]
fn racing_instances_converge_on_one_directory_and_one_marker() {
    let w = World::new();
    let root = w.root();
    for round in 0..20 {
        let rel = PathBuf::from(format!("ns/c{round}"));
        let results: Vec<_> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..6)
                .map(|i| {
                    let (root, rel) = (&root, &rel);
                    s.spawn(move || {
                        make_subdir(
                            root,
                            rel,
                            Ownership {
                                uid: Some(1000),
                                gid: Some(1000),
                                mode: Some(0o770),
                            },
                            &marker(&format!("pvc-{round}"), "u1", &format!("node-{i}")),
                        )
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for r in results {
            assert_eq!(r.unwrap(), w.export.join(&rel));
        }
        let names: Vec<_> = std::fs::read_dir(w.export.join(&rel))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, [volumedir::MARKER], "one marker, no temporaries");
        let left: Vec<_> = std::fs::read_dir(w.export.join("ns"))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .filter(|n| n.to_string_lossy().starts_with(volumedir::NEW_PREFIX))
            .collect();
        assert!(left.is_empty(), "private directories left: {left:?}");
        let md = std::fs::metadata(w.export.join(&rel)).unwrap();
        assert_eq!(md.permissions().mode() & 0o7777, 0o770);
    }
}

#[test]
fn a_squatted_directory_is_never_adopted_and_a_kill_converges() {
    let w = World::new();
    let root = w.root();
    let own = Ownership {
        uid: Some(1000),
        gid: Some(1000),
        mode: Some(0o750),
    };
    // Made by somebody else before the claim (empty, 0777, maybe mounted by its maker): refused.
    std::fs::create_dir(w.export.join("a")).unwrap();
    std::fs::set_permissions(w.export.join("a"), PermissionsExt::from_mode(0o777)).unwrap();
    let e = make_subdir(&root, Path::new("a"), own, &marker("pvc-1", "u1", "n")).unwrap_err();
    assert!(matches!(e, VolumeDirError::NotOurs(_)), "{e:?}");
    assert!(e.to_string().contains("never adopts"), "{e}");
    assert!(!w.export.join("a").join(volumedir::MARKER).exists());
    assert_eq!(
        std::fs::metadata(w.export.join("a")).unwrap().uid(),
        0,
        "left alone"
    );
    // A kill right after the private mkdir (no record yet): the leftover of this instance is
    // removed and the directory made again, with the class's ownership.
    let leftover = w.export.join(format!(
        "{}pvc-2@n.{}",
        volumedir::NEW_PREFIX,
        std::process::id()
    ));
    std::fs::create_dir(&leftover).unwrap();
    make_subdir(&root, Path::new("b"), own, &marker("pvc-2", "u2", "n")).unwrap();
    assert!(!leftover.exists());
    let md = std::fs::metadata(w.export.join("b")).unwrap();
    assert_eq!((md.uid(), md.permissions().mode() & 0o7777), (1000, 0o750));
    assert!(matches!(
        volumedir::inspect(&root, Path::new("b")),
        DirState::Owned(r) if r.marker.volume == "pvc-2"
    ));
    // Another instance's private name with data in it is not ours to clear.
    let theirs = w.export.join(format!("{}pvc-3@m.1", volumedir::NEW_PREFIX));
    std::fs::create_dir(&theirs).unwrap();
    std::fs::write(theirs.join("data"), b"x").unwrap();
    let old = std::time::SystemTime::now() - std::time::Duration::from_secs(120);
    std::fs::File::open(&theirs)
        .unwrap()
        .set_modified(old)
        .unwrap();
    let e = make_subdir(&root, Path::new("c"), own, &marker("pvc-3", "u3", "n")).unwrap_err();
    assert!(matches!(e, VolumeDirError::NotOurs(_)), "{e:?}");
    assert!(e.to_string().contains("did not write"), "{e}");
    assert!(theirs.join("data").exists());
}

#[test]
fn provision_never_follows_a_symlink_out_of_the_export() {
    let w = World::new();
    let outside = w.export.parent().unwrap().join("outside");
    std::fs::create_dir(&outside).unwrap();
    std::os::unix::fs::symlink(&outside, w.export.join("ns")).unwrap();
    let mut b = w.backend();
    let p = params(&[("pathPattern", "{{ .PVC.Namespace }}/{{ .PVC.Name }}")]);
    assert!(provision(&mut b, &w.cfg, &p, "u1", "n").is_err());
    assert_eq!(std::fs::read_dir(&outside).unwrap().count(), 0);
}

/// A provisioned volume with some data, for the delete tests.
fn volume(w: &World, on_delete: &str, uid: &str) -> (PersistentVolume, PathBuf) {
    let mut b = w.backend();
    let p = params(&[
        ("pathPattern", "{{ .PVC.Namespace }}/{{ .PVC.Name }}"),
        ("onDelete", on_delete),
    ]);
    let got = provision(&mut b, &w.cfg, &p, uid, "node-a").unwrap();
    let dir = w.export.join(&got.annotations[ANN_PATH]);
    std::fs::create_dir(dir.join("sub")).unwrap();
    std::fs::write(dir.join("sub/f"), b"data").unwrap();
    (pv_of(uid, &got), dir)
}

#[test]
fn delete_removes_exactly_the_recorded_nested_directory() {
    let w = World::new();
    let (pv, dir) = volume(&w, "delete", "u1");
    let (_, sibling) = volume(&w, "delete", "u2");
    let outside = w.export.parent().unwrap().join("outside");
    std::fs::create_dir(&outside).unwrap();
    std::fs::write(outside.join("precious"), b"x").unwrap();
    std::os::unix::fs::symlink(&outside, dir.join("escape")).unwrap();
    let mut b = w.backend();
    let said = b.delete(&w.cfg, &pv).unwrap();
    assert!(said.contains("removed"), "{said}");
    assert!(!dir.exists());
    assert!(w.export.join("ns").is_dir(), "the pattern's parent stays");
    assert!(sibling.join("sub/f").exists(), "the sibling volume stays");
    assert!(outside.join("precious").exists(), "followed a symlink");
    let names: Vec<_> = std::fs::read_dir(&w.export)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .filter(|n| n != volumedir::STATE_DIR)
        .collect();
    assert_eq!(names, ["ns"], "no tombstone, no archive");
    // Again: already gone is success.
    assert!(b.delete(&w.cfg, &pv).unwrap().contains("already gone"));
}

#[test]
fn a_delete_killed_after_its_rename_is_finished_by_the_next() {
    let w = World::new();
    let (pv, dir) = volume(&w, "delete", "u1");
    let tomb = w
        .export
        .join(format!("{}pvc-u1", volumedir::TOMBSTONE_PREFIX));
    std::fs::rename(&dir, &tomb).unwrap();
    w.backend().delete(&w.cfg, &pv).unwrap();
    assert!(!tomb.exists());
}

#[test]
fn archive_moves_the_directory_to_the_export_root_and_never_overwrites() {
    let w = World::new();
    let (pv, dir) = volume(&w, "archive", "u1");
    // An archive of that name exists already (same second, say): the next name is used.
    let first = w.export.join("archived-pvc-u1-20261122T150000Z");
    std::fs::create_dir(&first).unwrap();
    std::fs::write(first.join("old"), b"old").unwrap();
    let root = w.root();
    let said = remove_subdir(
        &root,
        Path::new("ns/claim-u1"),
        "pvc-u1",
        "u1",
        OnDelete::Archive,
        "20261122T150000Z",
    )
    .unwrap();
    let second = w.export.join("archived-pvc-u1-20261122T150000Z-1");
    assert!(said.contains(&second.display().to_string()), "{said}");
    assert_eq!(std::fs::read(second.join("sub/f")).unwrap(), b"data");
    assert_eq!(std::fs::read(first.join("old")).unwrap(), b"old");
    assert!(!dir.exists());
    assert!(w.export.join("ns").is_dir());
    // The archive keeps its marker, so a new claim cannot take it over; deleting again is done.
    assert!(second.join(volumedir::MARKER).exists());
    assert!(
        w.backend()
            .delete(&w.cfg, &pv)
            .unwrap()
            .contains("not there any more")
    );
    // Through the backend: the archive is named with the time.
    let (pv3, dir3) = volume(&w, "archive", "u3");
    let said = w.backend().delete(&w.cfg, &pv3).unwrap();
    assert!(said.contains("archived-pvc-u3-20"), "{said}");
    assert!(!dir3.exists());
}

#[test]
fn retain_keeps_the_directory_and_mounts_nothing() {
    let w = World::new();
    let (pv, dir) = volume(&w, "retain", "u1");
    let before = w.log().len();
    let said = w.backend().delete(&w.cfg, &pv).unwrap();
    assert!(
        said.starts_with("kept 10.0.0.5:/srv/nfs/ns/claim-u1"),
        "{said}"
    );
    assert!(dir.join("sub/f").exists());
    assert_eq!(w.log().len(), before, "nothing mounted for retain");
}

#[test]
fn delete_refuses_what_it_cannot_prove_is_this_pvs() {
    let w = World::new();
    let (pv, dir) = volume(&w, "delete", "u1");
    let mut b = w.backend();
    let edit = |f: &dyn Fn(&mut PersistentVolume)| {
        let mut p = pv.clone();
        f(&mut p);
        p
    };
    let cases: Vec<(PersistentVolume, &str)> = vec![
        // The share is not export + path (someone edited one of them).
        (
            edit(&|p| {
                p.spec
                    .as_mut()
                    .unwrap()
                    .flex_volume
                    .as_mut()
                    .unwrap()
                    .options
                    .as_mut()
                    .unwrap()
                    .insert("share".into(), "/srv/nfs/ns".into());
            }),
            "as recorded at creation",
        ),
        // A path that climbs out.
        (
            edit(&|p| {
                p.metadata
                    .annotations
                    .as_mut()
                    .unwrap()
                    .insert(ANN_PATH.into(), "ns/../..".into());
            }),
            ANN_PATH,
        ),
        // The annotations are gone.
        (
            edit(&|p| {
                p.metadata.annotations.as_mut().unwrap().remove(ANN_EXPORT);
            }),
            ANN_EXPORT,
        ),
        // Another claim's uid: the marker does not match.
        (
            edit(&|p| {
                p.spec.as_mut().unwrap().claim_ref.as_mut().unwrap().uid = Some("u9".into());
            }),
            "belongs to PV pvc-u1",
        ),
        (
            edit(&|p| {
                p.spec.as_mut().unwrap().claim_ref = None;
            }),
            "claimRef",
        ),
    ];
    for (p, want) in cases {
        let e = b.delete(&w.cfg, &p).unwrap_err();
        assert!(matches!(e, ProvisionError::Refused(_)), "{want}: {e:?}");
        let e = e.to_string();
        assert!(e.contains(want), "{want}: {e}");
        assert!(dir.join("sub/f").exists());
    }
    // The directory swapped for a symlink to a marked directory elsewhere: refused.
    let elsewhere = w.export.parent().unwrap().join("elsewhere");
    std::fs::rename(&dir, &elsewhere).unwrap();
    std::os::unix::fs::symlink(&elsewhere, &dir).unwrap();
    for mode in ["delete", "archive"] {
        let p = edit(&|p| {
            p.metadata
                .annotations
                .as_mut()
                .unwrap()
                .insert(ANN_ON_DELETE.into(), mode.into());
        });
        let e = b.delete(&w.cfg, &p).unwrap_err();
        assert!(matches!(e, ProvisionError::Refused(_)), "{mode}: {e:?}");
        let e = e.to_string();
        assert!(e.contains("symlink"), "{mode}: {e}");
        assert!(elsewhere.join("sub/f").exists());
    }
}

#[test]
fn racing_deletes_converge() {
    let w = World::new();
    let root = w.root();
    for (i, mode) in [OnDelete::Delete, OnDelete::Archive]
        .into_iter()
        .cycle()
        .take(16)
        .enumerate()
    {
        let rel = PathBuf::from(format!("ns/c{i}"));
        let pv = format!("pvc-{i}");
        make_subdir(&root, &rel, Ownership::default(), &marker(&pv, "u", "n")).unwrap();
        for j in 0..50 {
            std::fs::write(w.export.join(&rel).join(format!("f{j}")), b"x").unwrap();
        }
        let results: Vec<_> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..4)
                .map(|_| {
                    let (root, rel, pv) = (&root, &rel, &pv);
                    s.spawn(move || remove_subdir(root, rel, pv, "u", mode, "T"))
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for r in &results {
            assert!(r.is_ok(), "{mode:?}: {results:?}");
        }
        assert!(!w.export.join(&rel).exists());
        let archives = std::fs::read_dir(&w.export)
            .unwrap()
            .filter(|e| {
                e.as_ref()
                    .unwrap()
                    .file_name()
                    .to_string_lossy()
                    .starts_with(&format!("archived-{pv}-"))
            })
            .count();
        assert_eq!(archives, usize::from(mode == OnDelete::Archive), "{mode:?}");
        assert!(
            !w.export
                .join(format!("{}{pv}", volumedir::TOMBSTONE_PREFIX))
                .exists()
        );
    }
}

#[test]
fn resize_is_accepted_and_not_enforced() {
    let w = World::new();
    let (pv, _) = volume(&w, "delete", "u1");
    let mut b = w.backend();
    assert_eq!(b.expand(&w.cfg, &pv, 5 << 30).unwrap(), 5 << 30);
    assert!(!b.kind().node_finishes_resize);
}

#[test]
fn archive_stamps_are_compact_utc() {
    let s = stamp_now();
    assert_eq!(s.len(), "20261122T153001Z".len(), "{s}");
    assert!(s.ends_with('Z') && s.as_bytes()[8] == b'T', "{s}");
}

/// Provisions a clone of `src` for claim uid `uid` as node `node`.
fn provision_clone(
    b: &mut NfsProvisioner,
    cfg: &Config,
    p: &BTreeMap<String, String>,
    uid: &str,
    src: &PersistentVolume,
) -> Result<Provisioned, Refusal> {
    let claim = PersistentVolumeClaim::default();
    let pv = format!("pvc-{uid}");
    let modes = ["ReadWriteMany".to_owned()];
    let req = Request {
        pv_name: &pv,
        claim: &claim,
        namespace: "ns",
        name: &format!("claim-{uid}"),
        uid,
        class_name: "nfs",
        params: p,
        size_bytes: 1 << 30,
        access_modes: &modes,
        node: "node-a",
        source: Some(src),
    };
    b.provision(cfg, &req)
}

/// A clone copies the source's directory on the export (through a mount that caches no
/// attributes), its symlink as a symlink, into its own marked directory; an earlier pass's half
/// copy is made over; a source this node's driver has mounted waits; a source on another export
/// is refused before anything is mounted; a source whose directory is not recorded as its PV's
/// is refused, nothing left.
#[test]
fn a_clone_copies_the_source_directory_on_the_export() {
    let w = World::new();
    let mut b = w.backend();
    let p = params(&[("onDelete", "delete")]);
    let made = provision(&mut b, &w.cfg, &p, "u1", "node-a").unwrap();
    let src = pv_of("u1", &made);
    let sdir = w.export.join(made.annotations[ANN_PATH].as_str());
    std::fs::create_dir(sdir.join("d")).unwrap();
    std::fs::write(sdir.join("d/f"), b"hello").unwrap();
    std::os::unix::fs::symlink("/etc/passwd", sdir.join("d/out")).unwrap();

    let c = provision_clone(&mut b, &w.cfg, &p, "u2", &src).unwrap();
    let cdir = w.export.join(c.annotations[ANN_PATH].as_str());
    assert_ne!(cdir, sdir);
    assert_eq!(std::fs::read(cdir.join("d/f")).unwrap(), b"hello");
    assert_eq!(
        std::fs::read_link(cdir.join("d/out")).unwrap(),
        Path::new("/etc/passwd")
    );
    assert!(
        c.annotations[crate::vocab::ANN_CLONED_FROM].starts_with("pvc-u1 (1 files, ")
            && c.annotations[crate::vocab::ANN_CLONED_FROM]
                .contains(" reflinked, 5 bytes, 1 dirs, 1 symlinks"),
        "{:?}",
        c.annotations
    );
    assert!(
        w.log()
            .iter()
            .any(|l| l.starts_with("mount 10.0.0.5:/srv/nfs ") && l.ends_with(",noac")),
        "{:?}",
        w.log()
    );
    // Killed before the PV: the next pass finds more than the marker and copies again.
    std::fs::write(cdir.join("stray"), b"half").unwrap();
    provision_clone(&mut b, &w.cfg, &p, "u2", &src).unwrap();
    assert!(!cdir.join("stray").exists());
    assert_eq!(std::fs::read(cdir.join("d/f")).unwrap(), b"hello");

    // Mounted by a pod on this node (the NFS driver's record): waits, nothing made.
    let store = crate::node::state::StateStore::new(&w.cfg.state_dir, "nfs");
    let rec = crate::node::state::VolumeRecord {
        volume: Some("pvc-u1".into()),
        pod: Some("ns/writer".into()),
        ..crate::backend::record(
            crate::backend::Backend::Nfs,
            "mount",
            Path::new("/k/pods/x/volumes/pvc-u1"),
            // What the driver records: the source's own server and share.
            format!(
                "10.0.0.5:{}",
                src.spec
                    .as_ref()
                    .unwrap()
                    .flex_volume
                    .as_ref()
                    .unwrap()
                    .options
                    .as_ref()
                    .unwrap()["share"]
            ),
            false,
            None,
        )
    };
    store.save(&rec).unwrap();
    let n = w.log().len();
    let e = provision_clone(&mut b, &w.cfg, &p, "u3", &src).unwrap_err();
    assert!(
        matches!(&e, Refusal::Wait(m) if m.starts_with("waiting: its source volume pvc-u1 is mounted on this node (by pod ns/writer)")),
        "{e:?}"
    );
    assert_eq!(w.log().len(), n, "nothing mounted");
    store.remove(Path::new("/k/pods/x/volumes/pvc-u1")).unwrap();

    // On another export: refused before anything is mounted.
    let other = params(&[("onDelete", "delete"), ("share", "/srv/nfs/other")]);
    std::fs::create_dir_all(w.export.join("other")).unwrap();
    let e = provision_clone(&mut b, &w.cfg, &other, "u4", &src).unwrap_err();
    assert!(
        matches!(&e, Refusal::Fail(m) if m.contains("not on this class's export 10.0.0.5:/srv/nfs/other")),
        "{e:?}"
    );
    assert_eq!(w.log().len(), n);

    // A PV whose directory is not recorded as its own (another claim uid): refused, the new
    // directory removed again.
    let mut forged = src.clone();
    forged
        .spec
        .as_mut()
        .unwrap()
        .claim_ref
        .as_mut()
        .unwrap()
        .uid = Some("someone-else".into());
    let e = provision_clone(&mut b, &w.cfg, &p, "u5", &forged).unwrap_err();
    assert!(
        matches!(&e, Refusal::Fail(m) if m.contains("its source:")),
        "{e:?}"
    );
    let left: Vec<_> = std::fs::read_dir(&w.export)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains("u5"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
}

/// What a PV lacks is a malformed PV, said as before; its delete is refused (not retried).
#[test]
fn a_pv_without_its_fields_is_malformed() {
    let mut p = PersistentVolume {
        metadata: ObjectMeta {
            name: Some("pvc-1".into()),
            ..Default::default()
        },
        ..Default::default()
    };
    let want = |p: &PersistentVolume, m: &str| {
        let e = pv_fields(p).unwrap_err();
        assert_eq!(e, MalformedPv(m.into()));
        assert_eq!(ProvisionError::from(e), ProvisionError::Refused(m.into()));
    };
    want(&p, "it has no spec");
    p.spec = Some(PersistentVolumeSpec::default());
    want(&p, "it has no flexVolume options or CSI volume attributes");
    let spec = p.spec.as_mut().unwrap();
    spec.flex_volume = Some(FlexPersistentVolumeSource {
        options: Some(BTreeMap::from([("server".into(), "s".into())])),
        ..Default::default()
    });
    spec.claim_ref = Some(ObjectReference {
        uid: Some(String::new()),
        ..Default::default()
    });
    want(
        &p,
        "it has no claimRef uid, so its directory's marker cannot be checked",
    );
    p.spec.as_mut().unwrap().claim_ref.as_mut().unwrap().uid = Some("u1".into());
    let (name, opts, uid) = pv_fields(&p).unwrap();
    assert_eq!((name.as_str(), uid.as_str()), ("pvc-1", "u1"));
    assert_eq!(opts["server"], "s");
    // A CSI PV (a class with csiDriver): the same fields from its volume attributes.
    let spec = p.spec.as_mut().unwrap();
    spec.flex_volume = None;
    spec.csi = Some(k8s_openapi::api::core::v1::CSIPersistentVolumeSource {
        driver: "nfs.csi.flexvol.io".into(),
        volume_handle: "pvc-1".into(),
        volume_attributes: Some(BTreeMap::from([("server".into(), "t".into())])),
        ..Default::default()
    });
    let (_, opts, _) = pv_fields(&p).unwrap();
    assert_eq!(opts["server"], "t");
}
