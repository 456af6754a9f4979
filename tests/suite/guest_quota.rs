//! Guest tier for enforced hostPath sizes (`flexvol::provision::storage::quota`): real XFS and ext4 on loop
//! devices, mounted with and without project quotas, the real `xfs_quota`. Runs only inside the
//! test VM (`tests/vm/run <suite> --ignored --test-threads=1 guest_quota`): this host has no
//! xfsprogs.
//!
//! Each test makes its own loop files and mount points and removes them at the end, even when it
//! fails (RAII [`Disk`]).

use crate::util::run;
use flexvol::provision::storage::quota::{self, FsKind, Outcome, Support};
use flexvol::sys::exec::SystemRunner;
use std::collections::BTreeSet;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

static SEQ: AtomicU32 = AtomicU32::new(0);

/// A loop file with a filesystem, mounted; unmounted (with every bind below it) and removed on drop.
struct Disk {
    file: PathBuf,
    dev: String,
    mnt: PathBuf,
    binds: Vec<PathBuf>,
}

impl Disk {
    /// `mkfs` is the mkfs argv without the device; `opts` the mount options ("" for none).
    fn new(mib: u64, mkfs: &[&str], opts: &str) -> Self {
        let n = format!(
            "fvq{}x{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::SeqCst)
        );
        let file = std::env::temp_dir().join(format!("{n}.img"));
        std::fs::File::create(&file)
            .unwrap()
            .set_len(mib << 20)
            .unwrap();
        let dev = run("losetup", &["-f", "--show", file.to_str().unwrap()])
            .trim()
            .to_owned();
        let mut argv: Vec<&str> = mkfs[1..].to_vec();
        argv.push(&dev);
        run(mkfs[0], &argv);
        let mnt = std::env::temp_dir().join(format!("{n}.mnt"));
        std::fs::create_dir_all(&mnt).unwrap();
        let m = mnt.to_str().unwrap();
        if opts.is_empty() {
            run("mount", &[&dev, m]);
        } else {
            run("mount", &["-o", opts, &dev, m]);
        }
        Self {
            file,
            dev,
            mnt,
            binds: Vec::new(),
        }
    }

    fn xfs(opts: &str) -> Self {
        Self::new(320, &["mkfs.xfs", "-q"], opts)
    }

    /// Bind-mounts `src` at a fresh directory (as the hostPath driver does for a pod).
    fn bind(&mut self, src: &Path) -> PathBuf {
        let t = PathBuf::from(format!("{}.bind{}", self.mnt.display(), self.binds.len()));
        std::fs::create_dir_all(&t).unwrap();
        run(
            "mount",
            &["--bind", src.to_str().unwrap(), t.to_str().unwrap()],
        );
        self.binds.push(t.clone());
        t
    }
}

impl Drop for Disk {
    fn drop(&mut self) {
        for b in self.binds.iter().rev() {
            let _ = Command::new("umount").arg(b).status();
            let _ = std::fs::remove_dir(b);
        }
        let _ = Command::new("umount").arg(&self.mnt).status();
        let _ = std::fs::remove_dir(&self.mnt);
        let _ = Command::new("losetup").args(["-d", &self.dev]).status();
        let _ = std::fs::remove_file(&self.file);
    }
}

/// Total bytes `statfs` reports for `p` (what `df` and kubelet's volume stats show).
fn statfs_total(p: &Path) -> u64 {
    let s = nix::sys::statvfs::statvfs(p).unwrap();
    s.blocks() * s.fragment_size()
}

/// Writes `mib` MiB into `file` (appending, synced); the OS error when it fails.
fn write_mib(file: &Path, mib: usize) -> Result<(), std::io::Error> {
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(file)?;
    let chunk = vec![0xa5u8; 1 << 20];
    for _ in 0..mib {
        f.write_all(&chunk)?;
    }
    f.sync_all()
}

fn enforced(root: &Path) -> quota::QuotaFs {
    match quota::detect(root) {
        Support::Enforced(fs) => fs,
        Support::NotEnforced(why) => panic!("{}: expected quotas, got: {why}", root.display()),
    }
}

#[test]
#[ignore = "guest tier: needs xfsprogs and loop devices; run inside the test VM"]
fn guest_quota_xfs_prjquota_limits_writes_and_statfs_through_a_bind_and_grows() {
    let mut disk = Disk::xfs("prjquota");
    let root = disk.mnt.join("flexvol");
    std::fs::create_dir(&root).unwrap();
    let fs = enforced(&root);
    assert_eq!(fs.kind, FsKind::Xfs);
    assert_eq!(fs.mount_point, disk.mnt);
    let runner = SystemRunner::default();
    let sup = Support::Enforced(fs.clone());

    let dir = root.join("pvc-a_ns_c");
    std::fs::create_dir(&dir).unwrap();
    std::fs::write(dir.join(".flexvol-provisioned"), b"{}\n").unwrap();
    let mut persisted = None;
    let out = quota::enforce(
        &runner,
        &sup,
        &dir,
        "pvc-a",
        None,
        &BTreeSet::new(),
        20 << 20,
        |id| {
            persisted = Some(id);
            Ok(())
        },
    )
    .unwrap();
    let id = persisted.expect("a new id is persisted before it is applied");
    assert_eq!(
        out,
        Outcome::Enforced {
            id,
            limit_bytes: 20 << 20
        }
    );
    assert_eq!(id, quota::preferred_id("pvc-a"));
    assert!(quota::has_inherit_flag(&dir).unwrap());
    // Idempotent: the same again (as a pass after a kill -9 does, with the id from the marker).
    let again = quota::enforce(
        &runner,
        &sup,
        &dir,
        "pvc-a",
        Some(id),
        &BTreeSet::new(),
        20 << 20,
        |_| panic!("a known id is not persisted again"),
    )
    .unwrap();
    assert_eq!(again, out);

    // What a pod sees through the driver's bind mount: the volume's size, not the filesystem's.
    let pod = disk.bind(&dir);
    assert_eq!(statfs_total(&pod), 20 << 20);
    assert_eq!(statfs_total(&dir), 20 << 20);
    assert!(
        statfs_total(&disk.mnt) > 200 << 20,
        "the root is unaffected"
    );
    std::fs::create_dir(pod.join("sub")).unwrap();
    // A write past the size fails with ENOSPC, also through the bind.
    let e = write_mib(&pod.join("big"), 30).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(nix::libc::ENOSPC), "{e}");
    let usage = quota::report(&runner, &fs).unwrap()[&id];
    assert!(
        usage.used_bytes > 19 << 20 && usage.used_bytes <= 20 << 20,
        "{usage:?}"
    );
    // Files in subdirectories are charged too (the inherit flag).
    assert!(write_mib(&pod.join("sub/more"), 2).is_err());

    // Raise: the limit and statfs grow, and the write that failed now has room.
    let limit = quota::raise(&runner, &fs, &dir, id, 40 << 20).unwrap();
    assert_eq!(limit, 40 << 20);
    assert_eq!(statfs_total(&pod), 40 << 20);
    let before = quota::report(&runner, &fs).unwrap()[&id];
    if let Err(e) = write_mib(&pod.join("sub/more"), 10) {
        panic!(
            "10 MiB more after the raise: {e}; usage before {before:?}, after {:?}",
            quota::report(&runner, &fs).unwrap()[&id]
        );
    }
    // Never lowered: asking for less keeps 40 MiB.
    assert_eq!(
        quota::raise(&runner, &fs, &dir, id, 10 << 20).unwrap(),
        40 << 20
    );
    assert_eq!(statfs_total(&pod), 40 << 20);

    // A second volume gets another id (the first is in the report) and its own accounting.
    let used: BTreeSet<u32> = quota::report(&runner, &fs).unwrap().into_keys().collect();
    assert!(used.contains(&id));
    let dir2 = root.join("pvc-b_ns_c");
    std::fs::create_dir(&dir2).unwrap();
    let out2 = quota::enforce(
        &runner,
        &sup,
        &dir2,
        "pvc-b",
        None,
        &[quota::preferred_id("pvc-b")].into(),
        8 << 20,
        |_| Ok(()),
    )
    .unwrap();
    let Outcome::Enforced { id: id2, .. } = out2 else {
        panic!("{out2:?}")
    };
    assert_ne!(id2, id);
    assert_ne!(id2, quota::preferred_id("pvc-b"), "a taken id is skipped");
    assert_eq!(statfs_total(&dir2), 8 << 20);
    assert_eq!(statfs_total(&pod), 40 << 20);
}

#[test]
#[ignore = "guest tier: needs xfsprogs and loop devices; run inside the test VM"]
fn guest_quota_is_detected_only_where_enforced_and_ext4_prjquota_works() {
    let runner = SystemRunner::default();
    // XFS without prjquota, and with accounting only.
    for (opts, want) in [
        ("", "filesystem xfs without prjquota"),
        ("pqnoenforce", "pqnoenforce"),
        ("usrquota", "filesystem xfs without prjquota"),
    ] {
        let disk = Disk::xfs(opts);
        match quota::detect(&disk.mnt) {
            Support::NotEnforced(why) => {
                assert!(why.contains(want), "{opts}: {why}");
                assert!(why.contains("-o prjquota"), "{why}");
            }
            s => panic!("{opts}: {s:?}"),
        }
    }
    // tmpfs.
    let t = std::env::temp_dir().join(format!("fvq{}tmpfs", std::process::id()));
    std::fs::create_dir_all(&t).unwrap();
    run("mount", &["-t", "tmpfs", "tmpfs", t.to_str().unwrap()]);
    let s = quota::detect(&t);
    run("umount", &[t.to_str().unwrap()]);
    std::fs::remove_dir(&t).unwrap();
    match s {
        Support::NotEnforced(why) => assert!(why.contains("filesystem tmpfs"), "{why}"),
        s => panic!("tmpfs: {s:?}"),
    }

    // ext4 without the project feature: detected, with the fix.
    let plain = Disk::new(64, &["mkfs.ext4", "-q"], "");
    match quota::detect(&plain.mnt) {
        Support::NotEnforced(why) => assert!(why.contains("tune2fs -O project,quota"), "{why}"),
        s => panic!("ext4: {s:?}"),
    }
    drop(plain);

    // ext4 with the project feature and prjquota: enforced (xfs_quota -f). The generic quota code
    // lets CAP_SYS_RESOURCE through, so the write is made by a process without it, as in a pod.
    let disk = Disk::new(128, &["mkfs.ext4", "-q", "-O", "quota,project"], "prjquota");
    let fs = enforced(&disk.mnt);
    assert_eq!(fs.kind, FsKind::Ext4);
    let dir = disk.mnt.join("pvc-e");
    std::fs::create_dir(&dir).unwrap();
    let out = quota::enforce(
        &runner,
        &Support::Enforced(fs),
        &dir,
        "pvc-e",
        None,
        &BTreeSet::new(),
        10 << 20,
        |_| Ok(()),
    )
    .unwrap();
    assert!(matches!(out, Outcome::Enforced { limit_bytes, .. } if limit_bytes == 10 << 20));
    assert_eq!(statfs_total(&dir), 10 << 20);
    let f = dir.join("big");
    let o = Command::new("setpriv")
        .args([
            "--inh-caps=-sys_resource",
            "--bounding-set=-sys_resource",
            "dd",
            "if=/dev/zero",
            &format!("of={}", f.display()),
            "bs=1M",
            "count=20",
            "conv=fsync",
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success(),
        "the write past the size succeeded: {err}"
    );
    assert!(err.contains("Disk quota exceeded"), "{err}");
}

/// A PV as the reconciler builds it from what `provision` returned (what expand and delete read).
fn pv_for(
    name: &str,
    claim_uid: &str,
    node: &str,
    path: &str,
) -> k8s_openapi::api::core::v1::PersistentVolume {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "annotations": {"flexvol/node": node}},
        "spec": {
            "claimRef": {"uid": claim_uid},
            "flexVolume": {"driver": "flexvol/hostpath", "options": {"path": path, "type": "Directory"}}
        }
    }))
    .unwrap()
}

#[test]
#[ignore = "guest tier: needs xfsprogs and loop devices; run inside the test VM"]
fn guest_quota_hostpath_backend_provisions_grows_reports_and_deletes() {
    use flexvol::provision::storage::hostpath::HostPathProvisioner;
    use flexvol::provision::storage::volumedir::scan;
    use flexvol::provision::storage::{Provisioner, Request};
    use std::collections::BTreeMap;

    let quota_disk = Disk::xfs("prjquota");
    let plain_disk = Disk::xfs("");
    let (qroot, proot) = (quota_disk.mnt.join("q"), plain_disk.mnt.join("p"));
    // The provisioner keeps its node key (capabilityToken) in the state directory.
    let state = tempfile::tempdir().unwrap();
    let cfg = flexvol::node::config::Config::parse(
        Path::new("c"),
        serde_json::json!({
            "stateDir": state.path(),
            "nodePathMap": [{"node": "n1", "paths": [qroot]}],
            "storageClassConfigs": {"plain": {"nodePathMap": [{"node": "n1", "paths": [proot]}]}}
        })
        .to_string()
        .as_bytes(),
    )
    .unwrap();
    let mut b = HostPathProvisioner::new("flexvol/hostpath".into());
    let claim = Default::default();
    let params = BTreeMap::new();
    let modes = vec!["ReadWriteOnce".to_owned()];
    let req = |pv: &'static str, uid: &'static str, class: &'static str, bytes| Request {
        pv_name: pv,
        claim: &claim,
        namespace: "ns",
        name: "c",
        uid,
        class_name: class,
        params: &params,
        size_bytes: bytes,
        access_modes: &modes,
        node: "n1",
        source: None,
    };

    // On the prjquota root: enforced, and the same answer again (a retried pass).
    let p = b
        .provision(&cfg, &req("pvc-q", "uq", "local", 16 << 20))
        .unwrap();
    assert_eq!(p.annotations["flexvol/size-enforced"], "true", "{p:?}");
    assert_eq!(
        p.annotations["flexvol/size-bytes"],
        (16u64 << 20).to_string()
    );
    let id: u32 = p.annotations["flexvol/quota-project"].parse().unwrap();
    assert_eq!(
        b.provision(&cfg, &req("pvc-q", "uq", "local", 16 << 20))
            .unwrap(),
        p
    );
    let dir = PathBuf::from(&p.location);
    assert_eq!(statfs_total(&dir), 16 << 20);
    let marker = std::fs::read_to_string(dir.join(".flexvol-provisioned")).unwrap();
    assert!(marker.contains(&format!("\"projectId\":{id}")), "{marker}");

    // Grow: the limit and statfs follow.
    let pv = pv_for("pvc-q", "uq", "n1", &p.location);
    assert_eq!(b.expand(&cfg, &pv, 48 << 20).unwrap(), 48 << 20);
    assert_eq!(statfs_total(&dir), 48 << 20);
    // Not for another claim's PV of the same path.
    let other = pv_for("pvc-q", "someone-else", "n1", &p.location);
    assert!(b.expand(&cfg, &other, 64 << 20).is_err());
    assert_eq!(statfs_total(&dir), 48 << 20);

    // What `flexvol status` reports.
    let runner = SystemRunner::default();
    let roots = [flexvol::provision::storage::volumedir::prepare_root(&qroot).unwrap()];
    let found = scan(&roots, 4);
    let st = quota::size_status(&runner, &found);
    assert_eq!(st.len(), 1);
    assert!(st[0].enforced, "{st:?}");
    assert_eq!(
        (st[0].project_id, st[0].limit_bytes),
        (Some(id), Some(48 << 20))
    );

    // Delete: directory gone, the project's limit cleared.
    let said = b.delete(&cfg, &pv).unwrap();
    assert!(
        said.contains(&format!("cleared the limit of project {id}")),
        "{said}"
    );
    assert!(!dir.exists());
    let fs = enforced(&qroot);
    let left = quota::report(&runner, &fs)
        .unwrap()
        .get(&id)
        .copied()
        .unwrap_or_default();
    assert_eq!(left.limit_bytes, 0, "{left:?}");

    // On the plain XFS root: not enforced, said why; growing records the size, nothing else.
    let p = b
        .provision(&cfg, &req("pvc-p", "up", "plain", 16 << 20))
        .unwrap();
    assert_eq!(p.annotations["flexvol/size-enforced"], "false", "{p:?}");
    assert!(
        p.annotations["flexvol/size-note"].contains("filesystem xfs without prjquota"),
        "{p:?}"
    );
    assert!(!p.annotations.contains_key("flexvol/quota-project"));
    let pdir = PathBuf::from(&p.location);
    let whole = statfs_total(&pdir);
    assert!(whole > 200 << 20);
    let pv = pv_for("pvc-p", "up", "n1", &p.location);
    assert_eq!(b.expand(&cfg, &pv, 32 << 20).unwrap(), 32 << 20);
    assert_eq!(statfs_total(&pdir), whole);
    let roots = [flexvol::provision::storage::volumedir::prepare_root(&proot).unwrap()];
    let st = quota::size_status(&runner, &scan(&roots, 4));
    assert!(!st[0].enforced);
    assert!(
        st[0].note.as_deref().unwrap().contains("without prjquota"),
        "{st:?}"
    );
    b.delete(&cfg, &pv).unwrap();
}

#[test]
#[ignore = "guest tier: needs xfsprogs and loop devices; run inside the test VM"]
fn guest_quota_a_tampered_marker_cannot_steer_xfs_quota() {
    use flexvol::provision::storage::hostpath::HostPathProvisioner;
    use flexvol::provision::storage::volumedir::{self, Marker};
    use flexvol::provision::storage::{Provisioner, Request};
    use std::collections::BTreeMap;

    let disk = Disk::xfs("prjquota");
    let qroot = disk.mnt.join("q");
    let cfg = flexvol::node::config::Config::parse(
        Path::new("c"),
        serde_json::json!({"nodePathMap": [{"node": "n1", "paths": [qroot]}]})
            .to_string()
            .as_bytes(),
    )
    .unwrap();
    let mut b = HostPathProvisioner::new("flexvol/hostpath".into());
    let claim = Default::default();
    let params = BTreeMap::new();
    let modes = vec!["ReadWriteOnce".to_owned()];
    let req = |pv: &'static str, uid: &'static str| Request {
        pv_name: pv,
        claim: &claim,
        namespace: "ns",
        name: "c",
        uid,
        class_name: "local",
        params: &params,
        size_bytes: 16 << 20,
        access_modes: &modes,
        node: "n1",
        source: None,
    };
    let runner = SystemRunner::default();
    let fs = enforced(&disk.mnt);
    let limit = |id: u32| {
        quota::report(&runner, &fs)
            .unwrap()
            .get(&id)
            .copied()
            .unwrap_or_default()
            .limit_bytes
    };

    // The victim: a new volume (record), project V with 16 MiB.
    let p = b.provision(&cfg, &req("pvc-victim", "uv")).unwrap();
    let victim: u32 = p.annotations["flexvol/quota-project"].parse().unwrap();
    assert_eq!(limit(victim), 16 << 20);

    // An old volume (made before records: a marker, no record) with its own project O.
    let root = volumedir::prepare_root(&qroot).unwrap();
    let old_dir = root.real.join("old");
    std::fs::create_dir(&old_dir).unwrap();
    let own = quota::ID_FIRST + 7;
    let mut m = Marker {
        provisioner: "flexvol/hostpath".into(),
        volume: "pvc-old".into(),
        namespace: "ns".into(),
        claim: "old".into(),
        claim_uid: "uo".into(),
        node: "n1".into(),
        project_id: Some(own),
    };
    volumedir::write_marker(&old_dir, &m).unwrap();
    quota::apply(&runner, &fs, &old_dir, own, 16 << 20).unwrap();
    // Its tenant rewrites the marker to name the victim's project.
    m.project_id = Some(victim);
    std::fs::remove_file(old_dir.join(volumedir::MARKER)).unwrap();
    std::fs::write(
        old_dir.join(volumedir::MARKER),
        serde_json::to_vec(&m).unwrap(),
    )
    .unwrap();
    let old_pv = pv_for("pvc-old", "uo", "n1", old_dir.to_str().unwrap());
    // Resize: refused, no limit changes.
    let e = b.expand(&cfg, &old_pv, 64 << 20).unwrap_err().to_string();
    assert!(e.contains("does not carry"), "{e}");
    assert_eq!((limit(victim), limit(own)), (16 << 20, 16 << 20));
    // Delete: the directory goes, the victim's limit stays.
    let said = b.delete(&cfg, &old_pv).unwrap();
    assert!(said.contains("no project limit cleared"), "{said}");
    assert!(!old_dir.exists());
    assert_eq!(limit(victim), 16 << 20, "{said}");
    // The victim's own marker, rewritten by its tenant, changes nothing either: the record
    // decides, and the volume still grows.
    let vdir = PathBuf::from(&p.location);
    let mut vm: Marker =
        serde_json::from_slice(&std::fs::read(vdir.join(volumedir::MARKER)).unwrap()).unwrap();
    vm.project_id = Some(own);
    std::fs::remove_file(vdir.join(volumedir::MARKER)).unwrap();
    std::fs::write(
        vdir.join(volumedir::MARKER),
        serde_json::to_vec(&vm).unwrap(),
    )
    .unwrap();
    let vpv = pv_for("pvc-victim", "uv", "n1", &p.location);
    assert_eq!(b.expand(&cfg, &vpv, 32 << 20).unwrap(), 32 << 20);
    assert_eq!(limit(victim), 32 << 20);
    let said = b.delete(&cfg, &vpv).unwrap();
    assert!(
        said.contains(&format!("cleared the limit of project {victim}")),
        "{said}"
    );
}

/// The directory's project ID as `xfs_io lsproj` reads it.
fn project_of(dir: &Path) -> u32 {
    let out = run("xfs_io", &["-r", "-c", "lsproj", dir.to_str().unwrap()]);
    quota::parse_lsproj(&out).unwrap_or_else(|| panic!("lsproj: {out}"))
}

/// Issue #32, item 8: a root pod with CAP_FOWNER moves its volume directory to another project
/// and clears its inherit flag (what `chattr -p N -P` / `xfs_io -c chproj -c 'chattr -P'` do,
/// done here as root): its writes escape the size. `flexvol status` shows it, the next pass's
/// size check puts both back on the recorded inode (the size is enforced again), and the drift
/// is counted in `flexvol_provisioner_quota_drift_total`.
#[test]
#[ignore = "guest tier: needs xfsprogs and loop devices; run inside the test VM"]
fn guest_quota_a_directory_moved_out_of_its_project_is_put_back_and_counted() {
    use flexvol::provision::reconcile::Report;
    use flexvol::provision::storage::hostpath::HostPathProvisioner;
    use flexvol::provision::storage::volumedir::{prepare_root, scan};
    use flexvol::provision::storage::{Provisioner, Request, SizeCheck};
    use flexvol::provision::telemetry::Metrics;
    use std::collections::BTreeMap;

    let disk = Disk::xfs("prjquota");
    let qroot = disk.mnt.join("q");
    let state = tempfile::tempdir().unwrap();
    let cfg = flexvol::node::config::Config::parse(
        Path::new("c"),
        serde_json::json!({
            "stateDir": state.path(),
            "nodePathMap": [{"node": "n1", "paths": [qroot]}]
        })
        .to_string()
        .as_bytes(),
    )
    .unwrap();
    let mut b = HostPathProvisioner::new("flexvol/hostpath".into());
    let claim = Default::default();
    let params = BTreeMap::new();
    let modes = vec!["ReadWriteOnce".to_owned()];
    let req = Request {
        pv_name: "pvc-d",
        claim: &claim,
        namespace: "ns",
        name: "c",
        uid: "ud",
        class_name: "local",
        params: &params,
        size_bytes: 16 << 20,
        access_modes: &modes,
        node: "n1",
        source: None,
    };
    let p = b.provision(&cfg, &req).unwrap();
    assert_eq!(p.annotations["flexvol/size-enforced"], "true", "{p:?}");
    let id: u32 = p.annotations["flexvol/quota-project"].parse().unwrap();
    let dir = PathBuf::from(&p.location);
    let mut pv = pv_for("pvc-d", "ud", "n1", &p.location);
    pv.metadata
        .annotations
        .get_or_insert_default()
        .extend(p.annotations.clone());
    let runner = SystemRunner::default();
    let roots = [prepare_root(&qroot).unwrap()];

    // As provisioned: nothing to say, and status agrees.
    assert_eq!(project_of(&dir), id);
    assert_eq!(b.check_size(&cfg, &pv), None);
    let st = quota::size_status_checked(&runner, &scan(&roots, 4));
    assert!(st[0].enforced && !st[0].drifted, "{st:?}");

    // The pod's move: another project, no inherit flag. A file made now is charged to the
    // default project: a write past the size succeeds.
    let other = quota::ID_FIRST + 4242;
    assert_ne!(other, id);
    let d = dir.to_str().unwrap();
    run(
        "xfs_io",
        &["-r", "-c", &format!("chproj {other}"), "-c", "chattr -P", d],
    );
    assert_eq!(project_of(&dir), other);
    assert!(!quota::has_inherit_flag(&dir).unwrap());
    write_mib(&dir.join("escaped"), 20).expect("the size no longer holds after the move");
    std::fs::remove_file(dir.join("escaped")).unwrap();

    // flexvol status shows it.
    let st = quota::size_status_checked(&runner, &scan(&roots, 4));
    assert!(st[0].drifted && !st[0].enforced, "{st:?}");
    let note = st[0].note.clone().unwrap();
    assert!(
        note.contains(&format!(
            "carries project {other} instead of its recorded {id} and lacks the project-inherit flag"
        )),
        "{note}"
    );

    // The next pass: found, put back on the directory, and the size holds again.
    let what = match b.check_size(&cfg, &pv) {
        Some(SizeCheck::Restored(what)) => what,
        other => panic!("{other:?}"),
    };
    assert!(
        what.contains(&format!(
            "carries project {other} instead of its recorded {id}"
        )) && what.contains("lacks the project-inherit flag"),
        "{what}"
    );
    assert_eq!(project_of(&dir), id);
    assert!(quota::has_inherit_flag(&dir).unwrap());
    let e = write_mib(&dir.join("big"), 20).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(nix::libc::ENOSPC), "{e}");
    std::fs::remove_file(dir.join("big")).unwrap();
    let st = quota::size_status_checked(&runner, &scan(&roots, 4));
    assert!(st[0].enforced && !st[0].drifted, "{st:?}");

    // Counted: the reconciler puts each finding in its report, which the metrics count.
    let m = Metrics::new();
    m.record(
        &Report {
            quota_drift: vec![("pvc-d".into(), what)],
            ..Report::default()
        },
        std::time::Duration::from_millis(1),
    );
    let text = m.encode().unwrap();
    assert!(
        text.lines()
            .any(|l| l == "flexvol_provisioner_quota_drift_total 1"),
        "{text}"
    );

    // Clean again: nothing to say. The flag alone cleared: found and put back too.
    assert_eq!(b.check_size(&cfg, &pv), None);
    run("xfs_io", &["-r", "-c", "chattr -P", d]);
    match b.check_size(&cfg, &pv) {
        Some(SizeCheck::Restored(what)) => {
            assert!(
                what.starts_with("its directory lacks the project-inherit flag"),
                "{what}"
            )
        }
        other => panic!("{other:?}"),
    }
    assert!(quota::has_inherit_flag(&dir).unwrap());
    assert_eq!(project_of(&dir), id);

    let said = b.delete(&cfg, &pv).unwrap();
    assert!(
        said.contains(&format!("cleared the limit of project {id}")),
        "{said}"
    );
}

/// A write refused for want of room: ENOSPC (XFS past a project's limit) or EDQUOT.
fn assert_no_space(e: &std::io::Error) {
    assert!(
        matches!(
            e.raw_os_error(),
            Some(nix::libc::ENOSPC) | Some(nix::libc::EDQUOT)
        ),
        "{e:?}"
    );
}

/// A CSI inline ephemeral volume of a preset whose root is on XFS with `prjquota`: the real
/// `flexvol csi` makes the pod's directory with a project of its own and the preset's size as the
/// limit (two pods: two projects, chosen under the node-wide lock), a write past it fails
/// through the bind, so does the file past the project's file limit, `statfs` of the bind shows
/// the preset's size, and unpublish removes the directory and clears its project's limit — also
/// after kills in the delete, and only once a file of it a process still holds open is closed
/// (the record stays until then; writes through that file stay bounded).
#[test]
#[ignore = "guest tier: needs xfsprogs and loop devices; run inside the test VM"]
fn guest_quota_csi_ephemeral_preset_enforces_its_size() {
    use crate::root_csi::{Plugin, publish, target};
    use crate::root_csi_ephemeral::{eph_req, kid, killed_at, unpublish_id};
    let disk = Disk::xfs("prjquota");
    let scratch = disk.mnt.join("scratch");
    let env = crate::util::Env::new();
    env.reconfigure(serde_json::json!({
        "hostpath": {
            "allowedRoots": [env.root().join("data")],
            "ephemeral": {"scratch": {"root": scratch, "size": "32Mi"}}
        }
    }));
    let p = Plugin::start_with(&env, &[]);
    let (a, b) = (kid("qa", "v"), kid("qb", "v"));
    let (ta, tb) = (target(&env, "qa", "v"), target(&env, "qb", "v"));
    publish(&p, eph_req(&ta, &a, "qa", "ns", "scratch", &[])).unwrap();
    publish(&p, eph_req(&tb, &b, "qb", "ns", "scratch", &[])).unwrap();
    let (pa, pb) = (project_of(&scratch.join(&a)), project_of(&scratch.join(&b)));
    assert!(pa != 0 && pb != 0 && pa != pb, "projects {pa} and {pb}");
    let fs = enforced(&scratch);
    let runner = SystemRunner::default();
    let limits = quota::report(&runner, &fs).unwrap();
    assert_eq!(
        limits.get(&pa).map(|u| u.limit_bytes),
        Some(32 << 20),
        "{limits:?}"
    );
    let total = statfs_total(&ta);
    assert!(
        (31 << 20..=33 << 20).contains(&total),
        "statfs through the bind: {total}"
    );
    let e = write_mib(&ta.join("fill"), 40).unwrap_err();
    assert_no_space(&e);
    // The other pod's volume is not charged for it.
    write_mib(&tb.join("small"), 4).unwrap();
    // Files are bounded too (one per 2 KiB of the size): a tree of empty files, which no block
    // limit bounds, stops at 16,384. Fails without the inode limit.
    let many = tb.join("many");
    std::fs::create_dir(&many).unwrap();
    let e = (0..20_000)
        .try_for_each(|i| std::fs::File::create(many.join(i.to_string())).map(drop))
        .unwrap_err();
    assert_no_space(&e);
    assert!(std::fs::read_dir(&many).unwrap().count() < 16_384);
    std::fs::remove_dir_all(&many).unwrap();
    // A re-publish of a volume in use (kubelet restarted) walks nothing: a subdirectory the pod
    // moved to project 0 stays there (`project -s` walks by path, a tree the pod can rearrange).
    // Fails if a re-publish set the quota up again.
    std::fs::remove_file(ta.join("fill")).unwrap();
    std::fs::create_dir(ta.join("sub")).unwrap();
    run(
        "xfs_io",
        &["-c", "chproj 0", ta.join("sub").to_str().unwrap()],
    );
    publish(&p, eph_req(&ta, &a, "qa", "ns", "scratch", &[])).unwrap();
    assert_eq!(project_of(&scratch.join(&a).join("sub")), 0);
    // Killed after the delete's rename: the retry finishes it and still clears the project's
    // limit (from the root-only record: the directory is gone by then). Fails if the limit
    // were read from the directory only.
    drop(p);
    killed_at(&env, "provisioner-delete-after-rename", |k| {
        let _ = unpublish_id(k, &a, &ta);
    });
    assert!(!scratch.join(&a).exists());
    // Killed after the directory went and before its limit was cleared: the record, which names
    // the limit, is still there, and the retry clears both. Fails if the record went first (the
    // limit would be left with nothing naming it).
    killed_at(&env, "provisioner-delete-before-record", |k| {
        let _ = unpublish_id(k, &b, &tb);
    });
    assert!(!scratch.join(&b).exists());
    assert!(
        scratch
            .join(".flexvol/volumes")
            .join(format!("{b}.json"))
            .exists()
    );
    let p = Plugin::start_with(&env, &[]);
    for (id, t) in [(&a, &ta), (&b, &tb)] {
        unpublish_id(&p, id, t).unwrap();
        assert!(!scratch.join(id).exists());
    }
    let limits = quota::report(&runner, &fs).unwrap();
    for id in [pa, pb] {
        assert!(
            limits.get(&id).is_none_or(|u| u.limit_bytes == 0),
            "project {id} still limited: {limits:?}"
        );
    }
    // A file of the volume that a process elsewhere still has open when its pod goes (one
    // passed to another pod over a socket; here this test's, opened beside the bind): the
    // directory is removed, but the project still holds the file, so its limit stays and writes
    // through it still stop at the size. Fails if the limit were cleared whatever the project
    // still holds.
    let (c, tc) = (kid("qc", "v"), target(&env, "qc", "v"));
    publish(&p, eph_req(&tc, &c, "qc", "ns", "scratch", &[])).unwrap();
    let pc = project_of(&scratch.join(&c));
    let mut held = std::fs::File::create(scratch.join(&c).join("held")).unwrap();
    unpublish_id(&p, &c, &tc).unwrap();
    assert!(!scratch.join(&c).exists());
    let limits = quota::report(&runner, &fs).unwrap();
    assert_eq!(
        limits.get(&pc).map(|u| u.limit_bytes),
        Some(32 << 20),
        "{limits:?}"
    );
    let chunk = vec![0u8; 1 << 20];
    let e = (0..40)
        .try_for_each(|_| std::io::Write::write_all(&mut held, &chunk))
        .unwrap_err();
    assert_no_space(&e);
    // The record stays while the project holds the file, so that its limit is not forgotten;
    // once the file is closed, the sweep (here at the plugin's start, the pod's directory gone
    // as kubelet removes it) clears the limit, then the record. Fails if the record went with
    // the directory (the limit would stay for ever, its ID never chosen again).
    let rec_c = scratch.join(".flexvol/volumes").join(format!("{c}.json"));
    assert!(rec_c.exists());
    drop(held);
    std::fs::remove_dir_all(env.root().join("kubelet/pods/qc")).unwrap();
    drop(p);
    let p = Plugin::start_with(&env, &[]);
    let t0 = std::time::Instant::now();
    while rec_c.exists() {
        assert!(
            t0.elapsed() < std::time::Duration::from_secs(20),
            "not swept"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let limits = quota::report(&runner, &fs).unwrap();
    assert!(
        limits.get(&pc).is_none_or(|u| u.limit_bytes == 0),
        "project {pc} still limited: {limits:?}"
    );

    // IDs are chosen node-wide: a provisioning root on the same filesystem whose record names
    // the ID this volume would prefer (recorded, not applied: a provisioner killed between the
    // two, then its delete killed after the rename) makes it choose another. Fails if only the
    // preset's own root, or only records whose directory is there, were counted.
    let prov = disk.mnt.join("prov");
    env.reconfigure(serde_json::json!({
        "nodePathMap": [{"node": "DEFAULT_PATH_FOR_NON_LISTED_NODES", "paths": [prov]}]
    }));
    let c = kid("qc", "v");
    let want = quota::preferred_id(&c);
    let proot = flexvol::provision::storage::volumedir::prepare_root(&prov).unwrap();
    flexvol::provision::storage::volumedir::create_volume_dir(
        &proot,
        Path::new("pvc-held"),
        Default::default(),
        &flexvol::provision::storage::volumedir::Marker {
            provisioner: "flexvol/hostpath".into(),
            volume: "pvc-held".into(),
            namespace: "ns".into(),
            claim: "c".into(),
            claim_uid: "cu".into(),
            node: "node-t".into(),
            project_id: Some(want),
        },
    )
    .unwrap();
    // Its directory is gone already (a delete killed after its rename): the record alone still
    // holds the ID.
    std::fs::remove_dir_all(prov.join("pvc-held")).unwrap();
    // And one choice at a time: while another holds the node's project-ID lock, the publish
    // waits for it. Fails if the choice took no lock (the publish would not wait).
    let lock = env.run.join("locks/quota-project-ids.lock");
    std::fs::create_dir_all(lock.parent().unwrap()).unwrap();
    let held = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock)
        .unwrap();
    held.lock().unwrap();
    let releaser = std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_secs(2));
        drop(held);
    });
    let tc = target(&env, "qc", "v");
    let t0 = std::time::Instant::now();
    publish(&p, eph_req(&tc, &c, "qc", "ns", "scratch", &[])).unwrap();
    let waited = t0.elapsed();
    releaser.join().unwrap();
    assert!(
        waited >= std::time::Duration::from_millis(1500),
        "the publish did not wait for the project-ID lock ({waited:?})"
    );
    let pc = project_of(&scratch.join(&c));
    assert!(
        pc != 0 && pc != want,
        "project {pc}: the held record's {want} was taken"
    );
    unpublish_id(&p, &c, &tc).unwrap();
}
