//! Unit tests of the marked-directory library (tempdirs; the kill tests re-run this binary).

use super::*;
use std::os::unix::fs::{MetadataExt, PermissionsExt};

fn marker(pv: &str, uid: &str) -> Marker {
    Marker {
        provisioner: "flexvol/hostpath".into(),
        volume: pv.into(),
        namespace: "ns".into(),
        claim: "c".into(),
        claim_uid: uid.into(),
        node: "n".into(),
        project_id: None,
    }
}

fn root() -> (tempfile::TempDir, Root) {
    let d = tempfile::tempdir().unwrap();
    let r = prepare_root(&d.path().join("root")).unwrap();
    (d, r)
}

#[test]
fn patterns_cannot_leave_the_root() {
    assert_eq!(
        expand_pattern(
            "{{ .PVC.Namespace }}/{{.PVC.Name}}-{{ .PVName }}",
            "pv",
            "a",
            "b"
        )
        .unwrap(),
        PathBuf::from("a/b-pv")
    );
    for bad in [
        "/abs/{{ .PVName }}",
        "../{{ .PVName }}",
        "a/../../b",
        "a//b",
        "./a",
        "{{ .PVC.Labels.x }}",
        "{{ .PVName ",
        "x}}",
        "",
        ".flexvol-deleting-x",
        ".flexvol/volumes",
        "ns/.flexvol-new-pvc-x",
    ] {
        let e = expand_pattern(bad, "pv", "ns", "c").unwrap_err();
        assert!(matches!(e, VolumeDirError::Invalid(_)), "{bad}: {e:?}");
        assert!(e.to_string().contains("pathPattern"), "{bad}: {e}");
    }
    // Values cannot smuggle traversal in either (names come from the API, but still).
    assert!(expand_pattern("{{ .PVC.Name }}", "pv", "ns", "..").is_err());
    assert!(expand_pattern("{{ .PVC.Name }}/x", "pv", "ns", "").is_err());
}

#[test]
fn class_params_are_checked() {
    let m = |kv: &[(&str, &str)]| {
        kv.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect::<std::collections::BTreeMap<_, _>>()
    };
    let p = DirParams::parse(&m(&[("uid", "1000"), ("gid", "2000"), ("mode", "0770")])).unwrap();
    assert_eq!(
        p.ownership,
        Ownership {
            uid: Some(1000),
            gid: Some(2000),
            mode: Some(0o770)
        }
    );
    for (bad, want) in [
        (m(&[("uid", "bob")]), "numeric id"),
        (m(&[("mode", "999")]), "octal"),
        (m(&[("mode", "77777")]), "octal"),
        (m(&[("uid", "4294967295")]), "(uid_t)-1"),
        (m(&[("gid", "4294967295")]), "(uid_t)-1"),
        (m(&[("mode", "2770")]), "set-gid"),
        (m(&[("mode", "4755")]), "set-uid"),
        (m(&[("mode", "1777")]), "sticky"),
        (m(&[("nodePath", "/x")]), "unknown class parameter"),
        (m(&[("pathPattern", "../x")]), "pathPattern"),
    ] {
        let e = DirParams::parse(&bad).unwrap_err();
        // An unknown key is its own kind (the caller adds the keys it knows); a bad value is
        // invalid, never a step to retry.
        if want == "unknown class parameter" {
            assert!(
                matches!(e, VolumeDirError::UnknownParam(_)),
                "{bad:?}: {e:?}"
            );
        } else {
            assert!(matches!(e, VolumeDirError::Invalid(_)), "{bad:?}: {e:?}");
        }
        assert!(
            matches!(
                ProvisionError::from(e.clone()),
                ProvisionError::InvalidClass(_)
            ),
            "{e:?}"
        );
        assert!(e.to_string().contains(want), "{bad:?}: {e}");
    }
}

fn owned(r: &Root, rel: &str) -> Option<Record> {
    match inspect(r, Path::new(rel)) {
        DirState::Owned(rec) => Some(rec),
        _ => None,
    }
}

/// An NFS export gets a new device number each time it is mounted: a record written through
/// one mount must still name its directory through the next (CI found deletes refused with
/// "it was replaced"). Another inode on the same filesystem is still not the volume.
#[test]
fn a_record_names_its_directory_after_a_remount_changes_the_device() {
    let (_d, r) = root();
    let rel = PathBuf::from("v");
    let p = create_volume_dir(&r, &rel, Ownership::default(), &marker("pvc-1", "u1")).unwrap();
    let rec_path = r.real.join(STATE_DIR).join(RECORDS_DIR).join("pvc-1.json");
    let rewrite = |f: &dyn Fn(&mut serde_json::Value)| {
        let mut v: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&rec_path).unwrap()).unwrap();
        f(&mut v);
        std::fs::write(&rec_path, serde_json::to_vec(&v).unwrap()).unwrap();
    };
    // As if written through another mount of the same export: another device number.
    rewrite(&|v| {
        let dev = v["dev"].as_u64().unwrap();
        v["dev"] = serde_json::json!(dev ^ 0x5a5a);
    });
    assert!(
        matches!(inspect(&r, &rel), DirState::Owned(_)),
        "{:?}",
        inspect(&r, &rel)
    );
    // Another directory put in its place (another inode): refused, whatever the device.
    let ino = std::fs::metadata(&p).unwrap().ino();
    rewrite(&|v| v["ino"] = serde_json::json!(ino + 1));
    assert!(matches!(inspect(&r, &rel), DirState::Foreign(why) if why.contains("replaced")));
    rewrite(&|v| v["ino"] = serde_json::json!(ino));
    assert_eq!(
        delete_volume_dir(&r, &rel, "pvc-1", "u1").unwrap(),
        Deleted::Removed
    );
    assert!(!p.exists());
}

#[test]
fn a_squatted_empty_directory_is_never_adopted() {
    let (_d, r) = root();
    // An inline DirectoryOrCreate (0777) made team-b/db before the claim existed.
    let squat = r.real.join("team-b/db");
    std::fs::create_dir_all(&squat).unwrap();
    std::fs::set_permissions(&squat, PermissionsExt::from_mode(0o777)).unwrap();
    let own = Ownership {
        uid: Some(1234),
        gid: Some(5678),
        mode: Some(0o770),
    };
    let e = create_volume_dir(&r, Path::new("team-b/db"), own, &marker("pvc-b", "ub")).unwrap_err();
    assert!(matches!(e, VolumeDirError::NotOurs(_)), "{e:?}");
    assert!(e.to_string().contains("never adopts"), "{e}");
    assert!(e.to_string().contains("team-b/db"), "{e}");
    assert!(!squat.join(MARKER).exists(), "not marked");
    let md = std::fs::metadata(&squat).unwrap();
    assert_eq!((md.uid(), md.mode() & 0o7777), (0, 0o777), "not touched");
    assert_eq!(read_record(&r, "pvc-b").unwrap(), None);
    // Nothing under a private name is left behind either.
    assert_eq!(std::fs::read_dir(r.real.join("team-b")).unwrap().count(), 1);
}

#[test]
fn a_kill_at_any_step_of_create_converges() {
    let (_d, r) = root();
    let own = Ownership {
        uid: Some(1234),
        gid: Some(5678),
        mode: Some(0o750),
    };
    let m = marker("pvc-1", "u1");
    let private = r.real.join("ns").join(format!("{NEW_PREFIX}pvc-1"));
    // Killed after the private mkdir, before the record: the leftover goes, made again.
    std::fs::create_dir_all(&private).unwrap();
    std::fs::write(private.join(MARKER), b"{}").unwrap();
    let p = create_volume_dir(&r, Path::new("ns/v"), own, &m).unwrap();
    assert!(!private.exists());
    let md = std::fs::metadata(&p).unwrap();
    assert_eq!(
        (md.uid(), md.gid(), md.mode() & 0o7777),
        (1234, 5678, 0o750)
    );
    assert_eq!(owned(&r, "ns/v").unwrap().marker, m);

    // Killed after the record, before the rename: the recorded private directory is reused.
    let m2 = marker("pvc-2", "u2");
    create_volume_dir(&r, Path::new("ns/w"), own, &m2).unwrap();
    let w = r.real.join("ns/w");
    let private2 = r.real.join("ns").join(format!("{NEW_PREFIX}pvc-2"));
    std::fs::rename(&w, &private2).unwrap();
    let ino = std::fs::metadata(&private2).unwrap().ino();
    assert_eq!(inspect(&r, Path::new("ns/w")), DirState::Missing);
    create_volume_dir(&r, Path::new("ns/w"), own, &m2).unwrap();
    assert_eq!(
        std::fs::metadata(&w).unwrap().ino(),
        ino,
        "the same directory"
    );
    assert!(!private2.exists());

    // A record whose directory is nowhere (lost by hand): dropped, made again.
    std::fs::remove_dir_all(&w).unwrap();
    create_volume_dir(&r, Path::new("ns/w"), own, &m2).unwrap();
    assert!(owned(&r, "ns/w").is_some());
    // Another instance's leftover (NFS) goes with the volume's deletion.
    let theirs = r.real.join("ns").join(format!("{NEW_PREFIX}pvc-2@other.1"));
    std::fs::create_dir(&theirs).unwrap();
    delete_volume_dir(&r, Path::new("ns/w"), "pvc-2", "u2").unwrap();
    assert!(!theirs.exists());

    // A private name holding somebody's data: not ours to remove, not used.
    let m3 = marker("pvc-3", "u3");
    let private3 = r.real.join(format!("{NEW_PREFIX}pvc-3"));
    std::fs::create_dir(&private3).unwrap();
    std::fs::write(private3.join("data"), b"x").unwrap();
    let e = create_volume_dir(&r, Path::new("x"), own, &m3).unwrap_err();
    assert!(matches!(e, VolumeDirError::NotOurs(_)), "{e:?}");
    assert!(e.to_string().contains("did not write"), "{e}");
    assert!(private3.join("data").exists());
}

#[test]
fn parents_a_pattern_makes_are_roots_0755() {
    let (_d, r) = root();
    let own = Ownership {
        uid: Some(1234),
        gid: Some(5678),
        mode: Some(0o770),
    };
    create_volume_dir(&r, Path::new("ns/sub/v"), own, &marker("pvc-1", "u1")).unwrap();
    for p in ["ns", "ns/sub"] {
        let md = std::fs::metadata(r.real.join(p)).unwrap();
        assert_eq!(
            (md.uid(), md.gid(), md.mode() & 0o7777),
            (0, 0, 0o755),
            "{p}"
        );
    }
    let md = std::fs::metadata(r.real.join("ns/sub/v")).unwrap();
    assert_eq!(
        (md.uid(), md.gid(), md.mode() & 0o7777),
        (1234, 5678, 0o770)
    );
}

/// The child of [`a_kill_9_at_each_step_of_create_and_delete_converges`]: does one create
/// (or delete) in the root named by the environment and is killed at the checkpoint there.
/// Without that environment it does nothing.
#[test]
fn kill_child() {
    let Some(dir) = std::env::var_os("FLEXVOL_DIRLIB_CHILD_ROOT") else {
        return;
    };
    let r = prepare_root(Path::new(&dir)).unwrap();
    let own = Ownership {
        uid: Some(1234),
        gid: Some(5678),
        mode: Some(0o750),
    };
    if std::env::var_os("FLEXVOL_DIRLIB_CHILD_DELETE").is_some() {
        let _ = delete_volume_dir(&r, Path::new("ns/v"), "pvc-k", "uk");
    } else {
        let _ = create_volume_dir(&r, Path::new("ns/v"), own, &marker("pvc-k", "uk"));
    }
}

#[test]
fn a_kill_9_at_each_step_of_create_and_delete_converges() {
    use std::os::unix::process::ExitStatusExt;
    let exe = std::env::current_exe().unwrap();
    let kill_at = |root: &Path, at: &str, delete: bool| {
        let mut c = std::process::Command::new(&exe);
        c.args([
            "--exact",
            "provision::storage::volumedir::tests::kill_child",
            "--nocapture",
        ])
        .env("FLEXVOL_DIRLIB_CHILD_ROOT", root)
        .env("FLEXVOL_TEST_KILL_AT", at);
        if delete {
            c.env("FLEXVOL_DIRLIB_CHILD_DELETE", "1");
        }
        let st = c.output().unwrap().status;
        assert_eq!(st.signal(), Some(9), "{at}: not killed there ({st:?})");
    };
    let own = Ownership {
        uid: Some(1234),
        gid: Some(5678),
        mode: Some(0o750),
    };
    let m = marker("pvc-k", "uk");
    for at in [
        "provisioner-after-private-mkdir",
        "provisioner-after-record",
    ] {
        let (_d, r) = root();
        kill_at(&r.real, at, false);
        let target = r.real.join("ns/v");
        assert!(!target.exists(), "{at}: made at its name before the rename");
        let left: Vec<_> = std::fs::read_dir(r.real.join("ns"))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(left, [OsString::from(format!("{NEW_PREFIX}pvc-k"))], "{at}");
        // The next pass converges: one directory, set up, recorded, nothing left beside it.
        let p = create_volume_dir(&r, Path::new("ns/v"), own, &m).unwrap();
        let md = std::fs::metadata(&p).unwrap();
        assert_eq!(
            (md.uid(), md.gid(), md.mode() & 0o7777),
            (1234, 5678, 0o750)
        );
        assert!(owned(&r, "ns/v").is_some(), "{at}");
        assert_eq!(
            std::fs::read_dir(r.real.join("ns")).unwrap().count(),
            1,
            "{at}"
        );
    }
    // A delete killed after its rename: the next one finishes it, record included.
    let (_d, r) = root();
    let p = create_volume_dir(&r, Path::new("ns/v"), own, &m).unwrap();
    std::fs::write(p.join("data"), b"x").unwrap();
    kill_at(&r.real, "provisioner-delete-after-rename", true);
    assert!(!p.exists());
    assert!(r.real.join(format!("{TOMBSTONE_PREFIX}pvc-k")).exists());
    assert_eq!(
        delete_volume_dir(&r, Path::new("ns/v"), "pvc-k", "uk").unwrap(),
        Deleted::Removed
    );
    assert_eq!(read_record(&r, "pvc-k").unwrap(), None);
    assert_eq!(
        std::fs::read_dir(&r.real).unwrap().count(),
        2,
        "ns and .flexvol"
    );
}

#[test]
fn an_old_volume_without_a_record_still_deletes() {
    let (_d, r) = root();
    // Made by an older flexvol: a marker, no record.
    let p = r.real.join("ns/old");
    std::fs::create_dir_all(&p).unwrap();
    write_marker(&p, &marker("pvc-old", "uo")).unwrap();
    std::fs::write(p.join("data"), b"x").unwrap();
    assert!(matches!(
        inspect(&r, Path::new("ns/old")),
        DirState::Legacy(_)
    ));
    // Not for another PV or claim.
    assert!(delete_volume_dir(&r, Path::new("ns/old"), "pvc-x", "uo").is_err());
    assert!(delete_volume_dir(&r, Path::new("ns/old"), "pvc-old", "ux").is_err());
    assert_eq!(
        delete_volume_dir(&r, Path::new("ns/old"), "pvc-old", "uo").unwrap(),
        Deleted::Removed
    );
    assert!(!p.exists());
}

#[test]
fn volumes_never_nest() {
    let (_d, r) = root();
    let own = Ownership::default();
    create_volume_dir(&r, Path::new("team-a"), own, &marker("pvc-a", "ua")).unwrap();
    // Inside another volume.
    let e = create_volume_dir(&r, Path::new("team-a/db"), own, &marker("pvc-b", "ub")).unwrap_err();
    assert!(matches!(e, VolumeDirError::Occupied(_)), "{e:?}");
    assert!(
        matches!(ProvisionError::from(e.clone()), ProvisionError::Refused(_)),
        "{e:?}"
    );
    assert!(
        e.to_string().contains("inside the directory of PV pvc-a"),
        "{e}"
    );
    assert!(!r.real.join("team-a/db").exists());
    // Above another volume.
    create_volume_dir(&r, Path::new("team-c/db"), own, &marker("pvc-d", "ud")).unwrap();
    let e = create_volume_dir(&r, Path::new("team-c"), own, &marker("pvc-c", "uc")).unwrap_err();
    assert!(matches!(e, VolumeDirError::Occupied(_)), "{e:?}");
    assert!(
        e.to_string().contains("contain the directory of PV pvc-d"),
        "{e}"
    );
    // An old volume (marker, no record) above counts once the provisioner's pass adopted it,
    // on its PV's evidence: by its record, like any other.
    std::fs::create_dir(r.real.join("old")).unwrap();
    write_marker(&r.real.join("old"), &marker("pvc-old", "uo")).unwrap();
    assert!(adopt_legacy(&r, Path::new("old"), "pvc-old", "uo", &|_| true).unwrap());
    let e = create_volume_dir(&r, Path::new("old/x"), own, &marker("pvc-e", "ue")).unwrap_err();
    assert!(matches!(e, VolumeDirError::Occupied(_)), "{e:?}");
    assert!(
        e.to_string().contains("inside the directory of PV pvc-old"),
        "{e}"
    );
}

/// Issue #32, 3: markers are files the pod owns. A plain marker naming another PV, planted in a
/// subdirectory of a volume, no longer makes that volume undeletable (the old tree check
/// refused the delete for ever); nor does one above a new volume's path decide its nesting.
#[test]
fn a_planted_marker_decides_nothing() {
    let (_d, r) = root();
    let own = Ownership::default();
    create_volume_dir(&r, Path::new("a"), own, &marker("pvc-a", "ua")).unwrap();
    create_volume_dir(&r, Path::new("victim"), own, &marker("pvc-v", "uv")).unwrap();
    std::fs::create_dir(r.real.join("a/sub")).unwrap();
    write_marker(&r.real.join("a/sub"), &marker("pvc-v", "uv")).unwrap();
    std::fs::write(r.real.join("a/sub/data"), b"a's").unwrap();
    assert_eq!(
        delete_volume_dir(&r, Path::new("a"), "pvc-a", "ua").unwrap(),
        Deleted::Removed
    );
    assert!(!r.real.join("a").exists());
    assert!(r.real.join("victim").exists(), "the named PV is untouched");
    // A marker in a directory a tenant made (say an inline volume's) above a new path.
    std::fs::create_dir(r.real.join("squat")).unwrap();
    write_marker(&r.real.join("squat"), &marker("pvc-v", "uv")).unwrap();
    create_volume_dir(&r, Path::new("squat/new"), own, &marker("pvc-n", "un")).unwrap();
}

/// Issue #32, 2: a FIFO named like the marker in a subdirectory of a volume hung the delete's
/// tree check in open(2) for ever (and every later pass of the node's provisioner). Now the
/// delete ends, in a bounded time, with the tree removed; `scan` and `inspect` of a directory
/// whose top marker is a FIFO end too, saying what it is.
#[test]
fn a_fifo_named_like_the_marker_blocks_nothing() {
    let (_d, r) = root();
    let own = Ownership::default();
    create_volume_dir(&r, Path::new("a"), own, &marker("pvc-a", "ua")).unwrap();
    std::fs::create_dir(r.real.join("a/sub")).unwrap();
    nix::unistd::mkfifo(
        &r.real.join("a/sub").join(MARKER),
        nix::sys::stat::Mode::from_bits_truncate(0o600),
    )
    .unwrap();
    std::fs::create_dir(r.real.join("old")).unwrap();
    nix::unistd::mkfifo(
        &r.real.join("old").join(MARKER),
        nix::sys::stat::Mode::from_bits_truncate(0o600),
    )
    .unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let r2 = r.clone();
    std::thread::spawn(move || {
        let state = inspect(&r2, Path::new("old"));
        let found = scan(std::slice::from_ref(&r2), SCAN_DEPTH).len();
        let deleted = delete_volume_dir(&r2, Path::new("a"), "pvc-a", "ua");
        let _ = tx.send((state, found, deleted));
    });
    let (state, found, deleted) = rx
        .recv_timeout(std::time::Duration::from_secs(10))
        .expect("inspect, scan and delete return: nothing blocks on a FIFO");
    assert!(
        matches!(&state, DirState::Foreign(w) if w.contains("FIFO, not a regular file")),
        "{state:?}"
    );
    assert_eq!(found, 1, "the one volume");
    assert_eq!(deleted.unwrap(), Deleted::Removed);
    assert!(!r.real.join("a").exists());
}

/// An old volume gets its record once, on the evidence of its PV (its own path, its marker
/// agreeing on the PV and the claim): never for another PV or claim, never twice, and a project
/// ID its marker claims is kept only when the directory carries it.
#[test]
fn an_old_volume_is_adopted_once_on_its_pvs_evidence() {
    let (_d, r) = root();
    let p = r.real.join("ns/old");
    std::fs::create_dir_all(&p).unwrap();
    let mut m = marker("pvc-old", "uo");
    m.project_id = Some(0x4000_0010);
    write_marker(&p, &m).unwrap();
    assert!(!adopt_legacy(&r, Path::new("ns/old"), "pvc-x", "uo", &|_| true).unwrap());
    assert!(!adopt_legacy(&r, Path::new("ns/old"), "pvc-old", "ux", &|_| true).unwrap());
    assert!(matches!(
        inspect(&r, Path::new("ns/old")),
        DirState::Legacy(_)
    ));
    assert!(adopt_legacy(&r, Path::new("ns/old"), "pvc-old", "uo", &|_| false).unwrap());
    let DirState::Owned(rec) = inspect(&r, Path::new("ns/old")) else {
        panic!("adopted")
    };
    assert_eq!(
        rec.marker.project_id, None,
        "a project not proven is not kept"
    );
    assert!(!adopt_legacy(&r, Path::new("ns/old"), "pvc-old", "uo", &|_| true).unwrap());
    assert_eq!(
        delete_volume_dir(&r, Path::new("ns/old"), "pvc-old", "uo").unwrap(),
        Deleted::Removed
    );
}

#[test]
fn delete_refuses_a_tree_holding_another_volume() {
    let (_d, r) = root();
    let own = Ownership::default();
    create_volume_dir(&r, Path::new("a"), own, &marker("pvc-a", "ua")).unwrap();
    create_volume_dir(&r, Path::new("b"), own, &marker("pvc-b", "ub")).unwrap();
    std::fs::write(r.real.join("b/data"), b"b's").unwrap();
    // B's directory ends up inside A's (as nested patterns made it before).
    std::fs::rename(r.real.join("b"), r.real.join("a/b")).unwrap();
    let e = delete_volume_dir(&r, Path::new("a"), "pvc-a", "ua").unwrap_err();
    assert!(matches!(e, ProvisionError::Refused(_)), "{e:?}");
    let e = e.to_string();
    assert!(e.contains("PV pvc-b"), "{e}");
    assert!(r.real.join("a/b/data").exists());
    assert!(r.real.join("a").join(MARKER).exists());
    // An old volume inside, once adopted: refused too (by its record).
    std::fs::rename(r.real.join("a/b"), r.real.join("b")).unwrap();
    std::fs::create_dir(r.real.join("a/old")).unwrap();
    write_marker(&r.real.join("a/old"), &marker("pvc-old", "uo")).unwrap();
    assert!(adopt_legacy(&r, Path::new("a/old"), "pvc-old", "uo", &|_| true).unwrap());
    let e = delete_volume_dir(&r, Path::new("a"), "pvc-a", "ua").unwrap_err();
    assert!(matches!(e, ProvisionError::Refused(_)), "{e:?}");
    let e = e.to_string();
    assert!(e.contains("PV pvc-old"), "{e}");
    assert!(r.real.join("a/old").join(MARKER).exists());
}

#[test]
fn a_tampered_marker_decides_nothing() {
    let (_d, r) = root();
    let own = Ownership::default();
    let p = create_volume_dir(&r, Path::new("v"), own, &marker("pvc-1", "u1")).unwrap();
    // The tenant rewrites the marker in its own directory.
    let mut forged = marker("pvc-9", "u9");
    forged.project_id = Some(0x4000_0001);
    std::fs::remove_file(p.join(MARKER)).unwrap();
    std::fs::write(p.join(MARKER), serde_json::to_vec(&forged).unwrap()).unwrap();
    let rec = owned(&r, "v").unwrap();
    assert_eq!(rec.marker, marker("pvc-1", "u1"), "the record decides");
    assert!(delete_volume_dir(&r, Path::new("v"), "pvc-9", "u9").is_err());
    assert_eq!(
        delete_volume_dir(&r, Path::new("v"), "pvc-1", "u1").unwrap(),
        Deleted::Removed
    );
    assert_eq!(read_record(&r, "pvc-1").unwrap(), None);
    // The record directory is root's alone.
    let md = std::fs::metadata(r.real.join(STATE_DIR).join(RECORDS_DIR)).unwrap();
    assert_eq!((md.uid(), md.mode() & 0o777), (0, 0o700));
}

#[test]
#[allow(clippy::print_stderr)] // says why it is skipped
fn delete_fails_before_removing_anything_when_a_mount_is_inside() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("skipped: needs root (mount)");
        return;
    }
    let (d, r) = root();
    let p =
        create_volume_dir(&r, Path::new("v"), Ownership::default(), &marker("pv", "u")).unwrap();
    std::fs::write(p.join("a-file"), b"x").unwrap();
    std::fs::create_dir_all(p.join("sub/mnt")).unwrap();
    std::fs::write(p.join("sub/beside"), b"x").unwrap();
    let src = d.path().join("elsewhere");
    std::fs::create_dir(&src).unwrap();
    std::fs::write(src.join("precious"), b"x").unwrap();
    let bind = |at: &Path| {
        nix::mount::mount(
            Some(&src),
            at,
            None::<&str>,
            nix::mount::MsFlags::MS_BIND,
            None::<&str>,
        )
        .unwrap();
    };
    let unbind = |at: &Path| {
        let _ = nix::mount::umount2(at, nix::mount::MntFlags::MNT_DETACH);
    };
    bind(&p.join("sub/mnt"));
    let e = delete_volume_dir(&r, Path::new("v"), "pv", "u");
    unbind(&p.join("sub/mnt"));
    let e = e.unwrap_err();
    assert!(matches!(e, ProvisionError::Refused(_)), "{e:?}");
    let e = e.to_string();
    assert!(e.contains("mount point"), "{e}");
    assert!(src.join("precious").exists(), "crossed the mount");
    assert!(p.join("a-file").exists(), "removed something first");
    assert!(p.join("sub/beside").exists(), "removed something first");
    assert!(owned(&r, "v").is_some());
    // A mount that appears in a tombstone (after the check) stops the removal there too.
    let tomb_name = format!("{TOMBSTONE_PREFIX}pv");
    let tomb = r.real.join(&tomb_name);
    std::fs::rename(&p, &tomb).unwrap();
    bind(&tomb.join("sub/mnt"));
    let e = remove_tombstone(&r, &tomb_name);
    unbind(&tomb.join("sub/mnt"));
    let e = e.unwrap_err();
    assert!(matches!(e, VolumeDirError::Occupied(_)), "{e:?}");
    assert!(e.to_string().contains("mount point"));
    assert!(src.join("precious").exists(), "crossed the mount");
}

#[test]
fn create_is_idempotent_and_marks_the_directory() {
    let (_d, r) = root();
    let rel = default_rel_path("pvc-1", "ns", "c");
    let own = Ownership {
        uid: Some(1234),
        gid: Some(5678),
        mode: Some(0o770),
    };
    let p = create_volume_dir(&r, &rel, own, &marker("pvc-1", "u1")).unwrap();
    assert_eq!(p, r.real.join("pvc-1_ns_c"));
    let md = std::fs::metadata(&p).unwrap();
    assert_eq!((md.uid(), md.gid()), (1234, 5678));
    assert_eq!(md.permissions().mode() & 0o7777, 0o770);
    let rec = owned(&r, "pvc-1_ns_c").unwrap();
    assert_eq!(rec.marker, marker("pvc-1", "u1"));
    assert_eq!((rec.dev, rec.ino), (md.dev(), md.ino()));
    // Again: same answer, nothing changes.
    std::fs::write(p.join("data"), b"x").unwrap();
    assert_eq!(
        create_volume_dir(&r, &rel, own, &marker("pvc-1", "u1")).unwrap(),
        p
    );
    assert!(p.join("data").exists());
    // Another PV's marker, or foreign data: refused, left alone.
    let e = create_volume_dir(&r, &rel, own, &marker("pvc-2", "u2")).unwrap_err();
    assert!(matches!(e, VolumeDirError::Occupied(_)), "{e:?}");
    assert!(
        e.to_string().contains("is the directory of PV pvc-1"),
        "{e}"
    );
    std::fs::create_dir(r.real.join("foreign")).unwrap();
    std::fs::write(r.real.join("foreign/f"), b"x").unwrap();
    let e = create_volume_dir(&r, Path::new("foreign"), own, &marker("pvc-3", "u3")).unwrap_err();
    assert!(matches!(e, VolumeDirError::NotOurs(_)), "{e:?}");
    assert!(e.to_string().contains("never adopts"), "{e}");
    assert!(!r.real.join("foreign").join(MARKER).exists());
}

#[test]
fn create_never_follows_symlinks() {
    let (d, r) = root();
    let outside = d.path().join("outside");
    std::fs::create_dir(&outside).unwrap();
    std::os::unix::fs::symlink(&outside, r.real.join("ns")).unwrap();
    let e = create_volume_dir(
        &r,
        Path::new("ns/c"),
        Ownership::default(),
        &marker("p", "u"),
    )
    .unwrap_err();
    let e = e.to_string();
    assert!(e.contains("symlink") || e.contains("cannot create"), "{e}");
    assert!(!outside.join("c").exists());
    std::os::unix::fs::symlink(&outside, r.real.join("direct")).unwrap();
    assert!(
        create_volume_dir(
            &r,
            Path::new("direct"),
            Ownership::default(),
            &marker("p", "u")
        )
        .is_err()
    );
    assert!(!outside.join(MARKER).exists());
}

#[test]
fn delete_checks_the_marker_and_never_follows_symlinks() {
    let (d, r) = root();
    let outside = d.path().join("outside");
    std::fs::create_dir(&outside).unwrap();
    std::fs::write(outside.join("precious"), b"x").unwrap();
    let rel = PathBuf::from("ns/c");
    let p = create_volume_dir(&r, &rel, Ownership::default(), &marker("pvc-1", "u1")).unwrap();
    std::fs::create_dir(p.join("sub")).unwrap();
    std::fs::write(p.join("sub/f"), b"x").unwrap();
    std::os::unix::fs::symlink(&outside, p.join("escape")).unwrap();
    std::os::unix::fs::symlink(outside.join("precious"), p.join("file-link")).unwrap();

    // Wrong PV or wrong claim: refused.
    assert!(delete_volume_dir(&r, &rel, "pvc-2", "u1").is_err());
    assert!(delete_volume_dir(&r, &rel, "pvc-1", "u2").is_err());
    assert!(p.join("sub/f").exists());

    assert_eq!(
        delete_volume_dir(&r, &rel, "pvc-1", "u1").unwrap(),
        Deleted::Removed
    );
    assert!(!p.exists());
    assert!(outside.join("precious").exists(), "followed a symlink");
    assert!(r.real.join("ns").exists(), "only the volume directory goes");
    assert_eq!(
        std::fs::read_dir(&r.real).unwrap().count(),
        2,
        "no tombstone left (ns and .flexvol)"
    );
    assert_eq!(read_record(&r, "pvc-1").unwrap(), None);
    // Gone already: fine.
    assert_eq!(
        delete_volume_dir(&r, &rel, "pvc-1", "u1").unwrap(),
        Deleted::AlreadyGone
    );

    // The volume directory itself swapped for a symlink to a marked directory elsewhere.
    let elsewhere = d.path().join("elsewhere");
    std::fs::create_dir(&elsewhere).unwrap();
    let r2 = prepare_root(&elsewhere).unwrap();
    create_volume_dir(
        &r2,
        Path::new("v"),
        Ownership::default(),
        &marker("pvc-9", "u9"),
    )
    .unwrap();
    std::os::unix::fs::symlink(elsewhere.join("v"), r.real.join("v")).unwrap();
    let e = delete_volume_dir(&r, Path::new("v"), "pvc-9", "u9").unwrap_err();
    assert!(matches!(e, ProvisionError::Refused(_)), "{e:?}");
    let e = e.to_string();
    assert!(e.contains("symlink"), "{e}");
    assert!(elsewhere.join("v").join(MARKER).exists());
    // A marker that is a symlink to a good marker: not trusted.
    std::fs::create_dir(r.real.join("w")).unwrap();
    std::os::unix::fs::symlink(
        elsewhere.join("v").join(MARKER),
        r.real.join("w").join(MARKER),
    )
    .unwrap();
    assert!(delete_volume_dir(&r, Path::new("w"), "pvc-9", "u9").is_err());
    assert!(r.real.join("w").exists());
    // No marker: refused.
    std::fs::create_dir(r.real.join("bare")).unwrap();
    assert!(delete_volume_dir(&r, Path::new("bare"), "pvc-1", "u1").is_err());
    assert!(r.real.join("bare").exists());
}

#[test]
fn a_half_done_delete_is_finished() {
    let (_d, r) = root();
    let rel = PathBuf::from("v");
    create_volume_dir(&r, &rel, Ownership::default(), &marker("pvc-1", "u1")).unwrap();
    // Simulate a kill right after the rename.
    std::fs::rename(
        r.real.join("v"),
        r.real.join(format!("{TOMBSTONE_PREFIX}pvc-1")),
    )
    .unwrap();
    assert_eq!(
        delete_volume_dir(&r, &rel, "pvc-1", "u1").unwrap(),
        Deleted::Removed
    );
    assert_eq!(
        std::fs::read_dir(&r.real).unwrap().count(),
        1,
        "only .flexvol"
    );
    assert_eq!(read_record(&r, "pvc-1").unwrap(), None);
    std::fs::create_dir(r.real.join(format!("{TOMBSTONE_PREFIX}pvc-2"))).unwrap();
    let (done, errors) =
        finish_deletes(std::slice::from_ref(&r), &|_| false, &mut |_, _, _| Ok(()));
    assert_eq!((done.len(), errors.len()), (1, 0));
}

/// A delete killed after its rename, of a volume whose record names a project: finishing it hands
/// the caller that ID (to clear its limit) before the record, the last place that names it, goes.
/// Fails if the limit's ID were lost with the record (a project limit leaked for ever).
#[test]
fn a_half_done_delete_hands_over_its_project_before_the_record_goes() {
    let (_d, r) = root();
    let m = Marker {
        project_id: Some(0x4000_0042),
        ..marker("pvc-q", "uq")
    };
    create_volume_dir(&r, Path::new("q"), Ownership::default(), &m).unwrap();
    std::fs::rename(
        r.real.join("q"),
        r.real.join(format!("{TOMBSTONE_PREFIX}pvc-q")),
    )
    .unwrap();
    let mut seen = Vec::new();
    let (done, errors) = finish_deletes(std::slice::from_ref(&r), &|_| false, &mut |_, v, id| {
        seen.push((
            v.to_owned(),
            id,
            read_record(&r, "pvc-q").unwrap().is_some(),
        ));
        Ok(())
    });
    assert_eq!((done.len(), errors.len()), (1, 0), "{errors:?}");
    assert_eq!(seen, vec![("pvc-q".to_owned(), 0x4000_0042, true)]);
    assert_eq!(read_record(&r, "pvc-q").unwrap(), None);
}

/// The NFS race with a kill (tests/cluster nfs-kill): the losing instance, killed right after its
/// private mkdir, leaves an EMPTY `.flexvol-new-<pv>@<node>.<pid>` beside the winner's volume;
/// the winner's delete, killed after its rename, is finished by a later call that finds the
/// directory gone. That call removes the loser's empty leftover too — never one holding data.
#[test]
fn a_finished_delete_removes_empty_private_directories_of_any_instance() {
    let (_d, r) = root();
    let rel = PathBuf::from("ns/v");
    create_volume_dir_as(
        &r,
        &rel,
        Ownership::default(),
        &marker("pvc-1", "u1"),
        Some("b"),
    )
    .unwrap();
    let ns = r.real.join("ns");
    let loser = ns.join(format!("{NEW_PREFIX}pvc-1@a.77"));
    std::fs::create_dir(&loser).unwrap();
    let data = ns.join(format!("{NEW_PREFIX}pvc-1@c.78"));
    std::fs::create_dir(&data).unwrap();
    std::fs::write(data.join("x"), b"not ours").unwrap();
    let other_pv = ns.join(format!("{NEW_PREFIX}pvc-2@a.79"));
    std::fs::create_dir(&other_pv).unwrap();
    // The winner's delete, killed right after its rename: the tombstone is left.
    std::fs::rename(
        r.real.join(&rel),
        r.real.join(format!("{TOMBSTONE_PREFIX}pvc-1")),
    )
    .unwrap();
    assert_eq!(
        delete_volume_dir(&r, &rel, "pvc-1", "u1").unwrap(),
        Deleted::Removed
    );
    assert!(
        !loser.exists(),
        "the loser's empty private directory is left"
    );
    assert!(
        data.join("x").exists(),
        "a private name holding data is never removed"
    );
    assert!(other_pv.exists(), "another PV's is not this delete's");
    // Deleted before (already gone): the same.
    std::fs::create_dir(&loser).unwrap();
    assert_eq!(
        delete_volume_dir(&r, &rel, "pvc-1", "u1").unwrap(),
        Deleted::AlreadyGone
    );
    assert!(
        !loser.exists(),
        "the loser's empty private directory is left"
    );
}

#[test]
fn locate_refuses_paths_outside_roots() {
    let (_d, r) = root();
    let roots = vec![r.clone()];
    assert_eq!(
        locate(&roots, &r.real.join("a/b")).map(|(_, p)| p),
        Some(PathBuf::from("a/b"))
    );
    for bad in [
        r.real.clone(),
        r.real.join("../x"),
        r.real.join("a/../../x"),
        PathBuf::from("/etc"),
        PathBuf::from("rel"),
        r.real.join(format!("{TOMBSTONE_PREFIX}x")),
    ] {
        assert!(locate(&roots, &bad).is_none(), "{}", bad.display());
    }
}

#[test]
fn scan_finds_marked_directories() {
    let (_d, r) = root();
    create_volume_dir(
        &r,
        Path::new("a"),
        Ownership::default(),
        &marker("pvc-1", "u1"),
    )
    .unwrap();
    create_volume_dir(
        &r,
        Path::new("ns/b"),
        Ownership::default(),
        &marker("pvc-2", "u2"),
    )
    .unwrap();
    std::fs::create_dir(r.real.join("other")).unwrap();
    // An old volume: a marker, no record.
    std::fs::create_dir(r.real.join("old")).unwrap();
    write_marker(&r.real.join("old"), &marker("pvc-0", "u0")).unwrap();
    let f = scan(std::slice::from_ref(&r), 3);
    assert_eq!(
        f.iter()
            .map(|f| (f.marker.volume.as_str(), f.recorded))
            .collect::<Vec<_>>(),
        vec![("pvc-1", true), ("pvc-2", true), ("pvc-0", false)]
    );
}

/// An old volume (NFS volumes have no project) is recorded the first time its own PV is checked
/// (`check_ours`, before an archive or a resize), on that PV's evidence; one with a project is
/// left to the pass that can check the project.
#[test]
fn an_old_volume_without_a_project_is_recorded_when_its_pv_checks_it() {
    let (_d, r) = root();
    std::fs::create_dir_all(r.real.join("ns/a")).unwrap();
    write_marker(&r.real.join("ns/a"), &marker("pvc-a", "ua")).unwrap();
    assert!(check_ours(&r, Path::new("ns/a"), "pvc-b", "ub", "x").is_err());
    assert!(matches!(
        inspect(&r, Path::new("ns/a")),
        DirState::Legacy(_)
    ));
    assert!(matches!(
        check_ours(&r, Path::new("ns/a"), "pvc-a", "ua", "x").unwrap(),
        DirState::Legacy(_)
    ));
    assert!(matches!(inspect(&r, Path::new("ns/a")), DirState::Owned(_)));
    std::fs::create_dir_all(r.real.join("ns/q")).unwrap();
    let mut m = marker("pvc-q", "uq");
    m.project_id = Some(7);
    write_marker(&r.real.join("ns/q"), &m).unwrap();
    check_ours(&r, Path::new("ns/q"), "pvc-q", "uq", "x").unwrap();
    assert!(matches!(
        inspect(&r, Path::new("ns/q")),
        DirState::Legacy(_)
    ));
}

/// CI (guest, two NFS instances racing): the loser's private directory could not be removed,
/// ENOTEMPTY, because the NFS client had silly-renamed its unlinked marker (`.nfs<hex>`, gone
/// when the last descriptor closes) — and that failed the claim. The removal waits a bounded
/// while for such names and never removes them itself; anything else inside is never ours.
#[test]
fn a_private_directory_waits_for_silly_renamed_files_and_only_for_them() {
    let tmp = tempfile::tempdir().unwrap();
    let parent = open_dir(tmp.path()).unwrap();
    let p = tmp.path().join(".flexvol-new-pvc-x@node-b.7");
    std::fs::create_dir(&p).unwrap();
    std::fs::write(p.join(MARKER), b"{}").unwrap();
    std::fs::write(p.join(".nfs000000000123abcd00000001"), b"").unwrap();
    let silly = p.join(".nfs000000000123abcd00000001");
    let closer = std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_millis(400));
        std::fs::remove_file(silly).unwrap();
    });
    remove_private(&parent, ".flexvol-new-pvc-x@node-b.7", tmp.path()).unwrap();
    closer.join().unwrap();
    assert!(!p.exists());

    // A name that is not a silly-rename: not ours, left alone.
    std::fs::create_dir(&p).unwrap();
    std::fs::write(p.join(".nfsnothex"), b"data").unwrap();
    let e = remove_private(&parent, ".flexvol-new-pvc-x@node-b.7", tmp.path()).unwrap_err();
    assert!(matches!(e, VolumeDirError::NotOurs(_)), "{e}");
    assert_eq!(std::fs::read(p.join(".nfsnothex")).unwrap(), b"data");

    // A silly-renamed file that never goes: a bounded wait, then an error; it stays.
    std::fs::remove_file(p.join(".nfsnothex")).unwrap();
    std::fs::write(p.join(".nfs00ff"), b"").unwrap();
    let t = std::time::Instant::now();
    let e = remove_private(&parent, ".flexvol-new-pvc-x@node-b.7", tmp.path()).unwrap_err();
    assert!(matches!(e, VolumeDirError::Failed(_)), "{e}");
    assert!(t.elapsed() < std::time::Duration::from_secs(10));
    assert!(p.join(".nfs00ff").exists());
}

/// The marker is written in a directory a pod writes: whatever the pod planted at its temporary
/// name — a FIFO (an open for writing would block until a reader comes: for ever, holding the
/// caller's locks), a symlink, a hard link to another file — is unlinked, never opened, and a
/// fresh file takes its place. Fails if the temporary name were opened (the FIFO case would
/// hang: the test gives it 10 s).
#[test]
fn a_marker_write_never_opens_what_a_pod_planted_at_its_temporary_name() {
    let d = tempfile::tempdir().unwrap();
    let dir = d.path().to_owned();
    let outside = d.path().join("outside");
    std::fs::write(&outside, "host's").unwrap();
    for plant in ["fifo", "symlink", "hardlink"] {
        let tmp = dir.join(MARKER_TMP);
        let _ = std::fs::remove_file(&tmp);
        match plant {
            "fifo" => nix::unistd::mkfifo(&tmp, nix::sys::stat::Mode::S_IRWXU).unwrap(),
            "symlink" => std::os::unix::fs::symlink(&outside, &tmp).unwrap(),
            _ => std::fs::hard_link(&outside, &tmp).unwrap(),
        }
        let (tx, rx) = std::sync::mpsc::channel();
        let d2 = dir.clone();
        std::thread::spawn(move || {
            let _ = tx.send(write_marker(&d2, &marker("pvc-1", "u1")).map_err(|e| e.to_string()));
        });
        let done = rx
            .recv_timeout(std::time::Duration::from_secs(10))
            .unwrap_or_else(|_| panic!("{plant}: the marker write blocked"));
        done.unwrap_or_else(|e| panic!("{plant}: {e}"));
        assert_eq!(
            std::fs::read_to_string(&outside).unwrap(),
            "host's",
            "{plant}"
        );
        let m = std::fs::symlink_metadata(dir.join(MARKER)).unwrap();
        assert!(m.file_type().is_file(), "{plant}");
        assert_eq!(
            m.len(),
            u64::try_from(std::fs::read(dir.join(MARKER)).unwrap().len()).unwrap()
        );
    }
}

/// A removal's walk beats the heartbeat of the work it runs for at each entry
/// (`sys::progress`): the CSI plugin's health judges a walk of a tenant's millions of files
/// slow, never stuck, by those beats. Fails without the beat (the plugin would be restarted in a
/// loop while such a walk goes on).
#[test]
fn a_removal_walk_beats_at_each_entry() {
    use std::sync::atomic::Ordering;
    let d = tempfile::tempdir().unwrap();
    let top = d.path().join("t");
    std::fs::create_dir_all(top.join("a/b")).unwrap();
    std::fs::write(top.join("a/b/f"), "x").unwrap();
    let heart = crate::sys::progress::heart();
    let _on = crate::sys::progress::attach(heart.clone());
    heart.store(u64::MAX, Ordering::Relaxed);
    let fd = open_dir(&top).unwrap();
    empty_dir(&fd, &top).unwrap();
    assert_ne!(
        heart.load(Ordering::Relaxed),
        u64::MAX,
        "the walk never beat"
    );
    assert_eq!(std::fs::read_dir(&top).unwrap().count(), 0);
}

/// A delete whose limit could not be cleared (a file of the volume still open somewhere) leaves
/// its record and no tombstone: the next pass releases the limit and only then removes the
/// record; while the release fails, the record stays. A record without a project (a create
/// killed before its rename) is not taken for one. Fails if such records were only finished
/// through tombstones (the limit and its ID would be kept for ever).
#[test]
fn a_kept_record_of_a_gone_directory_is_finished_by_the_next_pass() {
    let (_d, r) = root();
    let m = Marker {
        project_id: Some(0x4000_0043),
        ..marker("pvc-h", "uh")
    };
    create_volume_dir(&r, Path::new("h"), Ownership::default(), &m).unwrap();
    create_volume_dir(
        &r,
        Path::new("n"),
        Ownership::default(),
        &marker("pvc-n", "un"),
    )
    .unwrap();
    std::fs::remove_dir_all(r.real.join("h")).unwrap();
    std::fs::remove_dir_all(r.real.join("n")).unwrap();
    let held = |_: &Root, _: &str, _: u32| -> Result<(), VolumeDirError> {
        Err(VolumeDirError::Failed("project still holds 1 file".into()))
    };
    let (done, errors) = finish_deletes(std::slice::from_ref(&r), &|_| false, &mut { held });
    assert!(done.is_empty() && errors.len() == 1, "{done:?} {errors:?}");
    assert!(read_record(&r, "pvc-h").unwrap().is_some());
    let mut seen = Vec::new();
    let (done, errors) = finish_deletes(std::slice::from_ref(&r), &|_| false, &mut |_, v, id| {
        seen.push((v.to_owned(), id));
        Ok(())
    });
    assert_eq!((done.len(), errors.len()), (1, 0), "{errors:?}");
    assert_eq!(seen, vec![("pvc-h".to_owned(), 0x4000_0043)]);
    assert_eq!(read_record(&r, "pvc-h").unwrap(), None);
    assert!(read_record(&r, "pvc-n").unwrap().is_some());
}
