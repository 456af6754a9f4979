//! Unit tests: every verb's command lines against a scripted `lvm`/`blkid` (reports in lvm2
//! 2.03.16's JSON format, captured on Debian 12) and a recording mounter.

use super::*;
use crate::backend::testing::{DEV, DEVNUM, FakeDevices, World};
use crate::node::config::Config;
use crate::sys::testing::MountCall;

const J: &str = r#"{"kubernetes.io/fsType":"ext4","kubernetes.io/pvOrVolumeName":"pv-lvm-1","kubernetes.io/readwrite":"rw","size":"1Gi","volumeID":"lv1","volumegroup":"vg0"}"#;

fn lvs_json(rows: &[(&str, &str, u64, &str, &str)]) -> String {
    let rows: Vec<String> = rows
        .iter()
        .map(|(lv, attr, size, tags, pool)| {
            format!(
                r#"{{"vg_name":"vg0", "lv_name":"{lv}", "lv_path":"/dev/vg0/{lv}", "lv_size":"{size}", "lv_attr":"{attr}", "lv_tags":"{tags}", "pool_lv":"{pool}", "vg_extent_size":"4194304", "vg_free":"8589934592"}}"#
            )
        })
        .collect();
    format!(
        "  {{\n      \"report\": [\n          {{\n              \"lv\": [\n                  {}\n              ]\n          }}\n      ]\n  }}\n",
        rows.join(",\n                  ")
    )
}

fn vgs_json(free: u64) -> String {
    format!(
        "  {{\n      \"report\": [\n          {{\n              \"vg\": [\n                  {{\"vg_name\":\"vg0\", \"vg_extent_size\":\"4194304\", \"vg_free\":\"{free}\"}}\n              ]\n          }}\n      ]\n  }}\n"
    )
}

/// vg0 allowed: any of its LVs may be used and created.
fn world() -> World {
    with_lvm(LvmConfig {
        device_wait_seconds: 1,
        allowed_volume_groups: vec!["vg0".into()],
        ..LvmConfig::default()
    })
}

/// The default policy: no VG allowed, only tagged LVs.
fn default_policy() -> World {
    with_lvm(LvmConfig {
        device_wait_seconds: 1,
        ..LvmConfig::default()
    })
}

fn with_lvm(lvm: LvmConfig) -> World {
    let mut w = World::new(Backend::Lvm);
    w.config.lvm = lvm;
    w
}

impl World {
    fn global(&self) -> PathBuf {
        let p = self
            .root
            .join("kubelet/plugins/kubernetes.io/flexvolume/example.com/lvm/mounts/pv-lvm-1");
        std::fs::create_dir_all(&p).unwrap();
        p
    }

    fn pod(&self) -> PathBuf {
        let p = self
            .root
            .join("kubelet/pods/6f3c1b8e/volumes/example.com~lvm/pv-lvm-1");
        std::fs::create_dir_all(&p).unwrap();
        p
    }

    fn state_files(&self) -> usize {
        self.config
            .state_dir
            .join("lvm")
            .read_dir()
            .map_or(0, |d| d.count())
    }
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

const LVS: &str = "lvm lvs --reportformat json --units b --nosuffix -o vg_name,lv_name,lv_path,lv_size,lv_attr,lv_tags,pool_lv,vg_extent_size,vg_free -- vg0";

#[test]
fn attach_is_pure_and_controller_verbs_do_nothing() {
    let w = world();
    w.devices.0.lock().unwrap().take();
    let r = w.call(&["attach", J, "node-1"]).unwrap();
    assert_eq!(r.device.as_deref(), Some(DEV));
    assert_eq!(
        r.to_json(),
        r#"{"status":"Success","device":"/dev/vg0/lv1"}"#
    );
    let r = w.call(&["isattached", J, "node-1"]).unwrap();
    assert_eq!(r.to_json(), r#"{"status":"Not supported"}"#);
    w.call(&["detach", "pv-lvm-1", "node-1"]).unwrap();
    let r = w
        .call(&["expandvolume", J, "/x", "2147483648", "1073741824"])
        .unwrap();
    assert_eq!(r.to_json(), r#"{"status":"Success"}"#);
    assert!(w.lines().is_empty(), "{:?}", w.lines());
    assert!(w.mounter.calls().is_empty());
    // A derived name: no volumeID, the PV name is used.
    let r = w
        .call(&[
            "attach",
            r#"{"volumegroup":"vg0","kubernetes.io/pvOrVolumeName":"pv-9"}"#,
            "n",
        ])
        .unwrap();
    assert_eq!(r.device.as_deref(), Some("/dev/vg0/pv-9"));
}

#[test]
fn waitforattach_already_active_is_one_lvm_command() {
    let w = world();
    w.runner.on(
        "lvm",
        &["lvs"],
        0,
        &lvs_json(&[("lv1", "-wi-a-----", 1 << 30, "flexvol.created", "")]),
        "",
    );
    let r = w.call(&["waitforattach", DEV, J]).unwrap();
    assert_eq!(
        r.to_json(),
        r#"{"status":"Success","device":"/dev/vg0/lv1"}"#
    );
    assert_eq!(w.lines(), [LVS]);
}

#[test]
fn waitforattach_inactive_activates() {
    let w = world();
    w.runner.on(
        "lvm",
        &["lvs"],
        0,
        &lvs_json(&[("lv1", "-wi-------", 1 << 30, "", "")]),
        "",
    );
    w.call(&["waitforattach", DEV, J]).unwrap();
    assert_eq!(w.lines(), [LVS, "lvm lvchange -ay -K -- vg0/lv1"]);
}

#[test]
fn waitforattach_creates_a_missing_lv_rounded_to_extents() {
    let w = world();
    w.runner.on("lvm", &["lvs"], 0, &lvs_json(&[]), "");
    w.runner.on("lvm", &["vgs"], 0, &vgs_json(8 << 30), "");
    let j = J.replace("\"1Gi\"", "\"1.001Gi\"");
    w.call(&["waitforattach", "", &j]).unwrap();
    // 1.001 GiB = 1074815796 bytes -> 257 extents of 4 MiB.
    assert_eq!(
        w.lines(),
        [
            LVS,
            "lvm vgs --reportformat json --units b --nosuffix -o vg_name,vg_extent_size,vg_free,vg_size -- vg0",
            "lvm lvcreate -y -Wy --addtag flexvol.created -n lv1 --setautoactivation n -Zy -L 1077936128b -- vg0",
            "lvm lvchange -ay -K -- vg0/lv1",
        ]
    );
}

#[test]
fn waitforattach_creates_thin_lvs_in_an_existing_pool() {
    let w = world();
    w.runner.on(
        "lvm",
        &["lvs"],
        0,
        &lvs_json(&[("pool", "twi-aotz--", 1 << 30, "", "")]),
        "",
    );
    let j = J.replace("\"size\"", "\"thinpool\":\"pool\",\"size\"");
    w.call(&["waitforattach", DEV, &j]).unwrap();
    assert_eq!(
        w.lines()[1],
        "lvm lvcreate -y -Wy --addtag flexvol.created -n lv1 -V 1073741824b --thinpool pool -- vg0"
    );
    // A pool that is not a thin pool, or no pool: refused before lvcreate.
    for rows in [vec![("pool", "-wi-a-----", 1u64 << 30, "", "")], vec![]] {
        let w = world();
        w.runner.on("lvm", &["lvs"], 0, &lvs_json(&rows), "");
        let e = w.call(&["waitforattach", DEV, &j]).unwrap_err();
        assert!(e.to_string().contains("thin"), "{e}");
        assert_eq!(w.runner.count("lvm"), 1);
    }
}

#[test]
fn waitforattach_refuses_without_size_too_big_missing_vg_or_a_pool_lv() {
    let w = world();
    w.runner.on("lvm", &["lvs"], 0, &lvs_json(&[]), "");
    let e = w
        .call(&["waitforattach", DEV, &J.replace(r#""size":"1Gi","#, "")])
        .unwrap_err();
    assert!(e.to_string().contains("no size was given"), "{e}");

    let w = world();
    w.runner.on("lvm", &["lvs"], 0, &lvs_json(&[]), "");
    w.runner.on("lvm", &["vgs"], 0, &vgs_json(1 << 29), "");
    let e = w.call(&["waitforattach", DEV, J]).unwrap_err();
    assert!(e.to_string().contains("has 536870912 bytes free"), "{e}");
    assert!(!w.lines().iter().any(|l| l.contains("lvcreate")));

    let w = world();
    w.runner.on(
        "lvm",
        &["lvs"],
        5,
        &lvs_json(&[]),
        "  Volume group \"vg0\" not found\n  Cannot process volume group vg0\n",
    );
    let e = w.call(&["waitforattach", DEV, J]).unwrap_err();
    assert!(
        e.to_string()
            .starts_with("volume group vg0 not found on this node"),
        "{e}"
    );
    assert!(
        e.to_string().contains("Cannot process volume group vg0"),
        "{e}"
    );

    let w = world();
    w.runner.on(
        "lvm",
        &["lvs"],
        0,
        &lvs_json(&[("lv1", "twi-aotz--", 1 << 30, "", "")]),
        "",
    );
    let e = w.call(&["waitforattach", DEV, J]).unwrap_err();
    assert!(e.to_string().contains("thin pool"), "{e}");
    assert_eq!(w.lines(), [LVS]);

    // A device argument that is not this volume's.
    let w = world();
    let e = w.call(&["waitforattach", "/dev/vg0/other", J]).unwrap_err();
    assert!(e.to_string().contains("does not match"), "{e}");
    assert!(w.lines().is_empty());
}

#[test]
fn waitforattach_times_out_when_the_device_never_appears() {
    let mut w = world();
    w.devices = FakeDevices::absent();
    w.runner.on(
        "lvm",
        &["lvs"],
        0,
        &lvs_json(&[("lv1", "-wi-------", 1 << 30, "", "")]),
        "",
    );
    let e = w.call(&["waitforattach", DEV, J]).unwrap_err();
    assert!(e.to_string().contains("did not appear within 1s"), "{e}");
}

#[test]
fn bad_names_and_sizes_create_and_mount_nothing() {
    let base = |k: &str, v: &str| {
        let mut m: serde_json::Map<String, serde_json::Value> = serde_json::from_str(J).unwrap();
        m.insert(k.into(), v.into());
        serde_json::Value::Object(m).to_string()
    };
    let mut cases = Vec::new();
    for v in [
        "", "-vg", "vg/0", "v g", "vg\n", "vg\u{1}", ".", "..", "vg;rm",
    ] {
        cases.push(base("volumegroup", v));
    }
    for v in [
        "",
        "-lv",
        "a/b",
        "a b",
        "lv\t",
        "lv\u{7f}",
        ".",
        "..",
        "snapshot0",
        "x_tmeta",
    ] {
        cases.push(base("volumeID", v));
    }
    for v in [
        "0",
        "0Gi",
        "-1",
        "-1Gi",
        "abc",
        "1.5.5Gi",
        "1e3",
        "100m",
        "99999999999999999999Ei",
        "18446744073709551616",
    ] {
        cases.push(base("size", v));
    }
    cases.push(base("thinpool", "../pool"));
    cases.push(base("mkfsOptions", "-F"));
    cases.push(base("mountOptions", "noatime"));
    cases.push(base("kubernetes.io/fsType", "ext4 -F"));
    for j in &cases {
        let w = world();
        let g = w.global();
        let p = w.pod();
        for args in [
            vec!["attach", j.as_str(), "n"],
            vec!["waitforattach", DEV, j.as_str()],
            vec!["mountdevice", s(&g), DEV, j.as_str()],
            vec!["mount", s(&p), j.as_str()],
            vec![
                "expandfs",
                j.as_str(),
                DEV,
                s(&p),
                "2147483648",
                "1073741824",
            ],
        ] {
            let e = w.call(&args).unwrap_err();
            assert!(e.to_string().contains("option"), "{args:?}: {e}");
        }
        assert!(w.lines().is_empty(), "{j}: {:?}", w.lines());
        assert!(w.mounter.calls().is_empty(), "{j}");
        assert_eq!(w.state_files(), 0, "{j}");
    }
}

fn blkid(w: &World, code: i32, out: &str) {
    w.runner.on(
        "blkid",
        &[],
        code,
        out,
        if code == 4 {
            "blkid: error: /dev/vg0/lv1: Input/output error\n"
        } else {
            ""
        },
    );
}

const EXT4: &str = "DEVNAME=/dev/vg0/lv1\nUUID=0b4a3c1e-7f3e-4c8e-a8c4-1f1e2d3c4b5a\nVERSION=1.0\nBLOCK_SIZE=4096\nTYPE=ext4\nUSAGE=filesystem\n";

#[test]
fn mountdevice_formats_only_a_blank_device() {
    let w = world();
    let g = w.global();
    w.runner.on(
        "lvm",
        &["lvs"],
        0,
        &lvs_json(&[("lv1", "-wi-a-----", 1 << 30, "flexvol.created", "")]),
        "",
    );
    blkid(&w, 2, "");
    w.call(&["mountdevice", s(&g), DEV, J]).unwrap();
    assert_eq!(
        w.lines(),
        [
            "blkid -p -o export -- /dev/vg0/lv1",
            LVS,
            "mkfs.ext4 -q /dev/vg0/lv1",
            "lvm lvchange -y --addtag flexvol.formatted -- vg0/lv1",
        ]
    );
    assert_eq!(
        w.mounter.calls(),
        [MountCall::MountFs(
            DEV.into(),
            g.clone(),
            "ext4".into(),
            false,
            "".into()
        )]
    );
    assert_eq!(w.state_files(), 1);
    // Again: mounted there from this device, nothing else happens.
    w.call(&["mountdevice", s(&g), DEV, J]).unwrap();
    assert_eq!(w.lines().len(), 4);
    assert_eq!(w.mounter.calls().len(), 1);
}

/// mkfs done, its `flexvol.formatted` tag not (here the lvchange fails; a kill -9 in between is
/// the same, proven in the guest): the retry finds a filesystem, and because this target's record
/// says the failed call was formatting, tags it; a plain existing filesystem is never tagged.
#[test]
fn mountdevice_tags_a_filesystem_whose_format_was_cut_short() {
    let w = world();
    let g = w.global();
    w.runner.on(
        "lvm",
        &["lvs"],
        0,
        &lvs_json(&[("lv1", "-wi-a-----", 1 << 30, "flexvol.created", "")]),
        "",
    );
    w.runner.once(
        "lvm",
        &["lvchange"],
        5,
        "",
        "  Cannot process volume group vg0\n",
    );
    blkid(&w, 2, "");
    w.call(&["mountdevice", s(&g), DEV, J]).unwrap_err();
    assert!(w.lines().contains(&"mkfs.ext4 -q /dev/vg0/lv1".to_owned()));
    assert!(w.mounter.calls().is_empty());
    blkid(&w, 0, EXT4);
    let before = w.lines().len();
    w.call(&["mountdevice", s(&g), DEV, J]).unwrap();
    assert_eq!(
        w.lines()[before..],
        [
            "blkid -p -o export -- /dev/vg0/lv1",
            LVS,
            "lvm lvchange -y --addtag flexvol.formatted -- vg0/lv1",
        ]
    );
    assert_eq!(w.mounter.calls().len(), 1);
    // Unmounted and mounted again: the record no longer says formatting; nothing is tagged.
    w.call(&["unmountdevice", s(&g)]).unwrap();
    let before = w.lines().len();
    w.call(&["mountdevice", s(&g), DEV, J]).unwrap();
    assert!(
        !w.lines()[before..].iter().any(|l| l.contains("--addtag")),
        "{:?}",
        &w.lines()[before..]
    );
}

#[test]
fn mountdevice_mounts_an_existing_filesystem_without_mkfs() {
    let w = world();
    let g = w.global();
    blkid(&w, 0, EXT4);
    let j = J
        .replace(r#""rw""#, r#""ro""#)
        .replace(r#""size""#, r#""mountOptions":"noacl,commit=30","size""#);
    w.call(&["mountdevice", s(&g), DEV, &j]).unwrap();
    assert_eq!(w.lines(), ["blkid -p -o export -- /dev/vg0/lv1"]);
    assert_eq!(
        w.mounter.calls(),
        [MountCall::MountFs(
            DEV.into(),
            g,
            "ext4".into(),
            true,
            "noacl,commit=30".into()
        )]
    );
}

#[test]
fn mountdevice_never_formats_anything_but_a_blank_probe() {
    let cases: &[(i32, &str, &str)] = &[
        (
            0,
            "DEVNAME=/dev/vg0/lv1\nUUID=x\nTYPE=xfs\nUSAGE=filesystem\n",
            "already holds a xfs filesystem",
        ),
        (
            0,
            "DEVNAME=/dev/vg0/lv1\nPTTYPE=gpt\nPTUUID=x\n",
            "gpt partition table",
        ),
        (
            0,
            "DEVNAME=/dev/vg0/lv1\nUUID=x\nVERSION=LVM2 001\nTYPE=LVM2_member\nUSAGE=raid\n",
            "LVM2_member signature (raid)",
        ),
        (
            0,
            "DEVNAME=/dev/vg0/lv1\nTYPE=crypto_LUKS\nUSAGE=crypto\n",
            "crypto_LUKS",
        ),
        (0, "DEVNAME=/dev/vg0/lv1\n", "signature blkid cannot name"),
        (4, "", "Input/output error"),
        (8, "", "ambivalent"),
        (1, "", "exit status 1"),
    ];
    for (code, out, want) in cases {
        let w = world();
        let g = w.global();
        blkid(&w, *code, out);
        let e = w.call(&["mountdevice", s(&g), DEV, J]).unwrap_err();
        assert!(e.to_string().contains(want), "exit {code}: {e}");
        assert!(
            !w.lines().iter().any(|l| l.contains("mkfs")),
            "{:?}",
            w.lines()
        );
        assert!(w.mounter.calls().is_empty());
        assert_eq!(w.state_files(), 0);
    }
    // blkid killed by its timeout: an error, not "blank".
    let w = world();
    let g = w.global();
    w.runner.time_out("blkid");
    assert!(w.call(&["mountdevice", s(&g), DEV, J]).is_err());
    assert_eq!(w.runner.count("mkfs.ext4"), 0);
}

#[test]
fn mountdevice_refuses_blank_when_read_only_or_formatted_before() {
    let w = world();
    let g = w.global();
    blkid(&w, 2, "");
    let e = w
        .call(&["mountdevice", s(&g), DEV, &J.replace(r#""rw""#, r#""ro""#)])
        .unwrap_err();
    assert!(
        e.to_string()
            .contains("read-only volume is never formatted"),
        "{e}"
    );

    let w = world();
    let g = w.global();
    blkid(&w, 2, "");
    w.runner.on(
        "lvm",
        &["lvs"],
        0,
        &lvs_json(&[(
            "lv1",
            "-wi-a-----",
            1 << 30,
            "flexvol.created,flexvol.formatted",
            "",
        )]),
        "",
    );
    let e = w.call(&["mountdevice", s(&g), DEV, J]).unwrap_err();
    assert!(e.to_string().contains("formatted by flexvol before"), "{e}");
    assert_eq!(w.runner.count("mkfs.ext4"), 0);
    assert!(w.mounter.calls().is_empty());
}

#[test]
fn mountdevice_xfs_with_options_and_unknown_types() {
    let w = world();
    let g = w.global();
    blkid(&w, 2, "");
    w.runner.on(
        "lvm",
        &["lvs"],
        0,
        &lvs_json(&[("lv1", "-wi-a-----", 1 << 30, "", "")]),
        "",
    );
    let j = J.replace(r#""ext4""#, r#""xfs""#).replace(
        r#""size""#,
        r#""mkfsOptions":"-L data -m reflink=1","size""#,
    );
    w.call(&["mountdevice", s(&g), DEV, &j]).unwrap();
    assert!(
        w.lines()
            .contains(&"mkfs.xfs -q -L data -m reflink=1 /dev/vg0/lv1".to_owned()),
        "{:?}",
        w.lines()
    );

    let w = world();
    let g = w.global();
    w.runner.without("mkfs.btrfs");
    let e = w
        .call(&[
            "mountdevice",
            s(&g),
            DEV,
            &J.replace(r#""ext4""#, r#""btrfs""#),
        ])
        .unwrap_err();
    assert!(e.to_string().contains("mkfs.btrfs is not installed"), "{e}");
    assert!(w.lines().is_empty());
}

#[test]
fn mountdevice_refuses_a_global_dir_holding_something_else_and_an_inactive_lv() {
    let w = world();
    let g = w.global();
    w.mounter
        .add("/dev/other", Path::new("/elsewhere"), "ext4", false); // takes (0, 100)
    w.mounter.add("tmpfs", &g, "tmpfs", false);
    let e = w.call(&["mountdevice", s(&g), DEV, J]).unwrap_err();
    assert!(
        e.to_string().contains("mount point of something else"),
        "{e}"
    );

    let mut w = world();
    w.devices = FakeDevices::absent();
    let g = w.global();
    let e = w.call(&["mountdevice", s(&g), DEV, J]).unwrap_err();
    assert!(e.to_string().contains("not active"), "{e}");
    assert!(w.lines().is_empty());
}

#[test]
fn unmount_of_a_bind_in_use_is_busy_and_keeps_the_record() {
    let w = world();
    let g = w.global();
    let p = w.pod();
    w.mounter.add(DEV, &g, "ext4", false);
    lvs_with(&w, "-wi-ao----", "");
    w.call(&["mount", s(&p), J]).unwrap();
    w.mounter
        .fail_unmount(UnmountMode::Normal, nix::Error::EBUSY);
    let e = w.call(&["unmount", s(&p)]).unwrap_err().to_string();
    assert!(
        e.contains(&format!(
            "{} is busy (a process still uses it); kubelet will retry",
            p.display()
        )),
        "{e}"
    );
    assert_eq!(w.state_files(), 1);
}

#[test]
fn mount_binds_the_global_mount_and_unmount_undoes_it() {
    let w = world();
    let g = w.global();
    let p = w.pod();
    lvs_with(&w, "-wi-a-----", "");
    let e = w.call(&["mount", s(&p), J]).unwrap_err();
    assert!(e.to_string().contains("is not mounted at"), "{e}");
    w.mounter.add(DEV, &g, "ext4", false);
    w.call(&["mount", s(&p), J]).unwrap();
    assert_eq!(
        w.mounter.calls(),
        [MountCall::Bind(g.clone(), p.clone(), false)]
    );
    assert_eq!(w.state_files(), 1);
    w.call(&["unmount", s(&p)]).unwrap();
    w.call(&["unmount", s(&p)]).unwrap();
    assert_eq!(
        w.mounter.calls()[1..],
        [MountCall::Unmount(p.clone(), UnmountMode::Normal)]
    );
    assert_eq!(w.state_files(), 0);
    // Read-only.
    w.call(&["mount", s(&p), &J.replace(r#""rw""#, r#""ro""#)])
        .unwrap();
    assert_eq!(w.mounter.calls()[2], MountCall::Bind(g, p, true));
    // Without a capabilityToken, mount reads the LV's tags (one lvs); unmount runs nothing.
    assert_eq!(w.lines(), [LVS, LVS, LVS]);
}

#[test]
fn mount_outside_a_kubelet_tree_fails() {
    let w = world();
    let d = w.root.join("somewhere");
    std::fs::create_dir_all(&d).unwrap();
    let e = w.call(&["mount", s(&d), J]).unwrap_err();
    assert!(
        e.to_string().contains("not a kubelet pod volume directory"),
        "{e}"
    );
}

#[test]
fn unmountdevice_unmounts_and_deactivates_once() {
    let w = world();
    let g = w.global();
    blkid(&w, 0, EXT4);
    w.call(&["mountdevice", s(&g), DEV, J]).unwrap();
    w.call(&["unmountdevice", s(&g)]).unwrap();
    assert_eq!(w.lines()[1..], ["lvm lvchange -an -- vg0/lv1"]);
    assert_eq!(
        w.mounter.calls()[1],
        MountCall::Unmount(g.clone(), UnmountMode::Normal)
    );
    assert_eq!(w.state_files(), 0);
    // The dm node is gone after deactivation: a repeat runs nothing.
    w.devices.0.lock().unwrap().take();
    w.call(&["unmountdevice", s(&g)]).unwrap();
    assert_eq!(w.lines().len(), 2);
    std::fs::remove_dir(&g).unwrap();
    w.call(&["unmountdevice", s(&g)]).unwrap();
}

#[test]
fn unmountdevice_without_a_record_uses_the_mapper_name() {
    assert_eq!(
        split_dm_name("/dev/mapper/my--vg-lv--1"),
        Some(("my-vg".into(), "lv-1".into()))
    );
    assert_eq!(split_dm_name("/dev/sda1"), None);
    assert_eq!(
        split_dm_name("/dev/vg0/lv1"),
        Some(("vg0".into(), "lv1".into()))
    );
    assert_eq!(split_dm_name("/dev/mapper/x/y"), None);
    assert_eq!(split_dm_name("/dev/a/b/c"), None);
    let w = world();
    let g = w.global();
    w.mounter.add("/dev/mapper/vg0-lv1", &g, "ext4", false);
    w.call(&["unmountdevice", s(&g)]).unwrap();
    assert_eq!(w.lines(), ["lvm lvchange -an -- vg0/lv1"]);
}

#[test]
fn unmountdevice_without_a_record_uses_the_device_path_we_mount_by() {
    // mountdevice (and kubelet's own fallback) mount /dev/<vg>/<lv>, which mountinfo keeps.
    let w = world();
    let g = w.global();
    w.mounter.add(DEV, &g, "ext4", false);
    w.call(&["unmountdevice", s(&g)]).unwrap();
    assert_eq!(w.lines(), ["lvm lvchange -an -- vg0/lv1"]);
}

#[test]
fn unmountdevice_leaves_an_lv_mounted_elsewhere_active() {
    let w = world();
    let g = w.global();
    w.mounter.add(DEV, Path::new("/mnt/by-hand"), "ext4", false); // (0, 100) = the LV
    w.mounter.add("/dev/mapper/vg0-lv1", &g, "ext4", false);
    w.call(&["unmountdevice", s(&g)]).unwrap();
    assert!(w.lines().is_empty(), "{:?}", w.lines());
}

#[test]
fn expandfs_extends_then_grows_and_repeats_cleanly() {
    let w = world();
    let g = w.global();
    let p = w.pod();
    w.mounter.add(DEV, &g, "ext4", false);
    // Later scripts take precedence: the first lvs sees 1 GiB, later ones 2 GiB.
    w.runner.on(
        "lvm",
        &["lvs"],
        0,
        &lvs_json(&[("lv1", "-wi-a-----", 2 << 30, "", "")]),
        "",
    );
    w.runner.once(
        "lvm",
        &["lvs"],
        0,
        &lvs_json(&[("lv1", "-wi-a-----", 1 << 30, "", "")]),
        "",
    );
    let args = ["expandfs", J, DEV, s(&p), "2147483648", "1073741824"];
    w.call(&args).unwrap();
    w.call(&args).unwrap();
    assert_eq!(
        w.lines(),
        [
            LVS,
            "lvm lvextend -y -L 2147483648b -- vg0/lv1",
            "resize2fs /dev/vg0/lv1",
            LVS,
            "resize2fs /dev/vg0/lv1",
        ]
    );
}

#[test]
fn expandfs_xfs_grows_by_mount_point_and_checks_free_space() {
    let w = world();
    let g = w.global();
    let p = w.pod();
    w.mounter.add(DEV, &g, "xfs", false);
    w.runner.on(
        "lvm",
        &["lvs"],
        0,
        &lvs_json(&[("lv1", "-wi-a-----", 2 << 30, "", "")]),
        "",
    );
    w.call(&["expandfs", J, DEV, s(&p), "2147483648", "1073741824"])
        .unwrap();
    assert_eq!(w.lines()[1], format!("xfs_growfs -d {}", g.display()));
    // 10 GiB more than the 8 GiB free: refused before lvextend.
    let e = w
        .call(&["expandfs", J, DEV, s(&p), &(12u64 << 30).to_string(), "0"])
        .unwrap_err();
    assert!(e.to_string().contains("free space in the VG"), "{e}");
    assert!(!w.lines().iter().any(|l| l.contains("lvextend")));
}

#[test]
fn expandfs_needs_a_mounted_filesystem() {
    let w = world();
    let p = w.pod();
    w.runner.on(
        "lvm",
        &["lvs"],
        0,
        &lvs_json(&[("lv1", "-wi-a-----", 2 << 30, "", "")]),
        "",
    );
    let e = w
        .call(&["expandfs", J, DEV, s(&p), "2147483648", "0"])
        .unwrap_err();
    assert!(e.to_string().contains("is not mounted"), "{e}");
}

// ---- issue #10: regression tests for the LVM holes ----

/// #1: a path-valued mkfs.xfs sub-option truncated a file in the node's `/`
/// (`-l file=1,logdev=vmlinuz,size=4m`, mkfs running in `/`). Refused before any tool runs.
#[test]
fn mkfs_options_with_paths_are_refused_before_anything_runs() {
    let xfs = |mkfs: &str| {
        J.replace(r#""ext4""#, r#""xfs""#).replace(
            r#""size""#,
            &format!(r#""mkfsOptions":{},"size""#, serde_json::json!(mkfs)),
        )
    };
    let ext4 = |mkfs: &str| {
        J.replace(
            r#""size""#,
            &format!(r#""mkfsOptions":{},"size""#, serde_json::json!(mkfs)),
        )
    };
    let cases = [
        xfs("-l file=1,logdev=vmlinuz,size=4m"),
        xfs("-l logdev=sda"),
        xfs("-l name=log,file=1"),
        xfs("-l internal=0"),
        xfs("-d file=1,name=img,size=1g"),
        xfs("-d name=x"),
        xfs("-r rtdev=sda"),
        xfs("-p proto"),
        xfs("-c options=cfg"),
        ext4("-E root_owner"),
        ext4("-E root_owner=1000:1000"),
        ext4("-E offset=4096"),
        ext4("-E android_sparse"),
        ext4("-O journal_dev"),
        ext4("-d etc"),
        ext4("-J device=sda"),
        ext4("-e panic"),
    ];
    for j in &cases {
        let w = world();
        let g = w.global();
        blkid(&w, 2, "");
        for args in [
            vec!["waitforattach", DEV, j.as_str()],
            vec!["mountdevice", s(&g), DEV, j.as_str()],
        ] {
            let e = w.call(&args).unwrap_err();
            assert!(e.to_string().contains("mkfsOptions"), "{j}: {e}");
        }
        assert!(w.lines().is_empty(), "{j}: {:?}", w.lines());
        assert!(w.mounter.calls().is_empty());
        assert_eq!(w.state_files(), 0);
    }
}

/// #1 (defence in depth): mkfs runs in an empty private directory, not in `/`.
#[test]
fn mkfs_runs_in_an_empty_private_directory() {
    let w = world();
    let g = w.global();
    blkid(&w, 2, "");
    lvs_with(&w, "-wi-a-----", "");
    let j = J.replace(
        r#""size""#,
        r#""mkfsOptions":"-E lazy_itable_init=0 -O ^has_journal","size""#,
    );
    w.call(&["mountdevice", s(&g), DEV, &j]).unwrap();
    let mkfs = w
        .runner
        .calls()
        .into_iter()
        .find(|c| c.tool == "mkfs.ext4")
        .unwrap();
    let cwd = mkfs.cwd.expect("mkfs must get a working directory");
    assert_eq!(cwd, w.root.join("run/lvm-empty"));
    assert_eq!(std::fs::read_dir(&cwd).unwrap().count(), 0);
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(&cwd).unwrap().permissions().mode() & 0o777,
        0o500
    );
    assert_eq!(
        mkfs.args,
        ["-q", "-E", "lazy_itable_init=0", "-O", "^has_journal", DEV]
    );
    // A symlink in its place is refused, never followed.
    let w = world();
    let g = w.global();
    blkid(&w, 2, "");
    lvs_with(&w, "-wi-a-----", "");
    std::fs::create_dir_all(w.root.join("run")).unwrap();
    std::os::unix::fs::symlink("/", w.root.join("run/lvm-empty")).unwrap();
    let e = w.call(&["mountdevice", s(&g), DEV, J]).unwrap_err();
    assert!(e.to_string().contains("not a directory of ours"), "{e}");
    assert_eq!(w.runner.count("mkfs.ext4"), 0);
}

/// #9: unknown keys (a typo of volumeID, of size) are errors; the message names the key, never
/// its value.
#[test]
fn unknown_option_keys_are_refused_without_echoing_their_value() {
    for (k, v) in [
        ("volumeid", "root"),
        ("sizee", "5Gi"),
        ("VolumeGroup", "vg1"),
        ("password", "s3cr3t-value"),
    ] {
        let mut m: serde_json::Map<String, serde_json::Value> = serde_json::from_str(J).unwrap();
        m.insert(k.into(), v.into());
        let j = serde_json::Value::Object(m).to_string();
        let w = world();
        let g = w.global();
        let p = w.pod();
        for args in [
            vec!["attach", j.as_str(), "n"],
            vec!["waitforattach", DEV, j.as_str()],
            vec!["mountdevice", s(&g), DEV, j.as_str()],
            vec!["mount", s(&p), j.as_str()],
            vec!["expandfs", j.as_str(), DEV, s(&p), "2147483648", "0"],
        ] {
            let e = w.call(&args).unwrap_err().to_string();
            assert!(e.contains(&format!("{k:?}")), "{args:?}: {e}");
            assert!(e.contains("unknown LVM option"), "{e}");
            assert!(!e.contains(v), "the value of {k} leaked: {e}");
        }
        assert!(w.lines().is_empty(), "{:?}", w.lines());
        assert!(w.mounter.calls().is_empty());
    }
    // kubelet's own keys are not "unknown".
    let j = J.replace(
        r#""size""#,
        r#""kubernetes.io/pod.name":"p","kubernetes.io/mounterArgs.FsGroup":"2000","kubernetes.io/serviceAccount.name":"default","size""#,
    );
    world().call(&["attach", &j, "n"]).unwrap();
}

/// #12: mount options that panic the node or skip journal replay are refused.
#[test]
fn dangerous_mount_options_are_refused() {
    for (fs, opt) in [
        ("ext4", "errors=panic"),
        ("ext4", "noacl,errors=panic"),
        ("ext4", "noload"),
        ("ext4", "norecovery"),
        ("ext4", "resuid=0"),
        ("ext4", "grpid"),
        ("ext4", "dax"),
        ("xfs", "norecovery"),
        ("xfs", "grpid"),
        ("xfs", "dax=always"),
    ] {
        let w = world();
        let g = w.global();
        blkid(&w, 0, EXT4);
        let j = J
            .replace(r#""ext4""#, &format!("{fs:?}"))
            .replace(r#""size""#, &format!(r#""mountOptions":"{opt}","size""#));
        let e = w.call(&["mountdevice", s(&g), DEV, &j]).unwrap_err();
        assert!(e.to_string().contains("mountOptions"), "{fs} {opt}: {e}");
        assert!(w.mounter.calls().is_empty());
        assert!(w.lines().is_empty());
    }
}

fn lvs_with(w: &World, attr: &str, tags: &str) {
    w.runner.on(
        "lvm",
        &["lvs"],
        0,
        &lvs_json(&[("lv1", attr, 1 << 30, tags, "")]),
        "",
    );
}

/// #8: by default (no allowed VG) an LV the node did not hand to flexvol cannot be activated, and
/// nothing can be created; the refusal does not tell whether the LV exists.
#[test]
fn default_policy_refuses_untagged_lvs_and_creation() {
    // The node's root LV, inactive or active: refused after the one lvs report.
    for attr in ["-wi-------", "-wi-ao----"] {
        let w = default_policy();
        lvs_with(&w, attr, "");
        let e = w.call(&["waitforattach", DEV, J]).unwrap_err();
        assert!(
            e.to_string().contains("not available to flexvol volumes"),
            "{e}"
        );
        assert_eq!(w.lines(), [LVS], "{attr}");
    }
    // Missing LV with a size: the same message, no vgs, no lvcreate.
    let w = default_policy();
    w.runner.on("lvm", &["lvs"], 0, &lvs_json(&[]), "");
    let missing = w.call(&["waitforattach", DEV, J]).unwrap_err().to_string();
    assert_eq!(w.lines(), [LVS]);
    let w = default_policy();
    lvs_with(&w, "-wi-------", "other.tag");
    let existing = w.call(&["waitforattach", DEV, J]).unwrap_err().to_string();
    assert_eq!(missing, existing);
    // mountdevice never formats such an LV either.
    let w = default_policy();
    let g = w.global();
    blkid(&w, 2, "");
    lvs_with(&w, "-wi-a-----", "");
    let e = w.call(&["mountdevice", s(&g), DEV, J]).unwrap_err();
    assert!(
        e.to_string().contains("not available to flexvol volumes"),
        "{e}"
    );
    assert_eq!(w.runner.count("mkfs.ext4"), 0);
    assert!(w.mounter.calls().is_empty());
    assert_eq!(w.state_files(), 0);
    // expandfs of it: refused before lvextend.
    let w = default_policy();
    let g = w.global();
    let p = w.pod();
    w.mounter.add(DEV, &g, "ext4", false);
    lvs_with(&w, "-wi-ao----", "");
    let e = w
        .call(&["expandfs", J, DEV, s(&p), "2147483648", "0"])
        .unwrap_err();
    assert!(
        e.to_string().contains("not available to flexvol volumes"),
        "{e}"
    );
    assert_eq!(w.lines(), [LVS]);
}

#[test]
fn default_policy_accepts_lvs_tagged_for_flexvol() {
    for tags in ["flexvol.allowed", "x,flexvol.created,flexvol.formatted"] {
        let w = default_policy();
        lvs_with(&w, "-wi-------", tags);
        w.call(&["waitforattach", DEV, J]).unwrap();
        assert_eq!(w.lines(), [LVS, "lvm lvchange -ay -K -- vg0/lv1"]);
    }
}

/// #8: even an allowed LV is refused while the host uses it.
#[test]
fn an_lv_the_host_uses_is_refused() {
    // Mounted at / (the node's root LV in an allowed VG): waitforattach and mountdevice refuse.
    let w = world();
    let g = w.global();
    w.mounter.add(DEV, Path::new("/"), "ext4", false); // DEVNUM
    lvs_with(&w, "-wi-ao----", "");
    let e = w.call(&["waitforattach", DEV, J]).unwrap_err();
    assert!(
        e.to_string().contains("in use by the node (mounted at /)"),
        "{e}"
    );
    blkid(&w, 0, EXT4);
    let e = w.call(&["mountdevice", s(&g), DEV, J]).unwrap_err();
    assert!(e.to_string().contains("mounted at /"), "{e}");
    assert!(w.mounter.calls().is_empty());
    assert_eq!(w.runner.count("blkid"), 0);
    assert_eq!(w.state_files(), 0);

    // Swap, a device stacked on it, open without a mount.
    let w = world();
    w.devices.1.lock().unwrap().push(DEVNUM);
    lvs_with(&w, "-wi-ao----", "");
    let e = w.call(&["waitforattach", DEV, J]).unwrap_err();
    assert!(e.to_string().contains("active swap"), "{e}");
    let w = world();
    w.devices.2.lock().unwrap().push("dm-7".into());
    lvs_with(&w, "-wi-ao----", "");
    let e = w.call(&["waitforattach", DEV, J]).unwrap_err();
    assert!(e.to_string().contains("dm-7 is stacked on it"), "{e}");
    let w = world();
    lvs_with(&w, "-wi-ao----", "");
    let e = w.call(&["waitforattach", DEV, J]).unwrap_err();
    assert!(e.to_string().contains("its device is open"), "{e}");

    // Open because kubelet mounted it at its global dir: fine, one lvm command.
    let w = world();
    let g = w.global();
    w.mounter.add(DEV, &g, "ext4", false);
    lvs_with(&w, "-wi-ao----", "");
    w.call(&["waitforattach", DEV, J]).unwrap();
    assert_eq!(w.lines(), [LVS]);
    // ... but not another driver's directories.
    let w = world();
    w.mounter.add(
        DEV,
        &w.root
            .join("kubelet/plugins/kubernetes.io/flexvolume/other/lvm/mounts/x"),
        "ext4",
        false,
    );
    lvs_with(&w, "-wi-ao----", "");
    assert!(w.call(&["waitforattach", DEV, J]).is_err());

    // expandfs of an LV the host mounted: refused before lvextend.
    let w = world();
    let p = w.pod();
    w.mounter.add(DEV, Path::new("/srv"), "ext4", false);
    lvs_with(&w, "-wi-ao----", "");
    let e = w
        .call(&["expandfs", J, DEV, s(&p), "2147483648", "0"])
        .unwrap_err();
    assert!(e.to_string().contains("mounted at /srv"), "{e}");
    assert_eq!(w.lines(), [LVS]);
}

/// #8: a blank LV held open raw (a VM's disk, say) is not formatted by mountdevice.
#[test]
fn mountdevice_never_formats_an_open_lv_kubelet_has_not_mounted() {
    let w = world();
    let g = w.global();
    blkid(&w, 2, "");
    lvs_with(&w, "-wi-ao----", "");
    let e = w.call(&["mountdevice", s(&g), DEV, J]).unwrap_err();
    assert!(e.to_string().contains("its device is open"), "{e}");
    assert_eq!(w.runner.count("mkfs.ext4"), 0);
    assert!(w.mounter.calls().is_empty());
}

/// udev's blkid opens a device for a moment after activation or a writer's close: an open flag
/// that goes away on re-reading is not host use.
#[test]
fn a_transient_open_flag_is_not_host_use() {
    let w = world();
    lvs_with(&w, "-wi-a-----", "");
    w.runner.once(
        "lvm",
        &["lvs"],
        0,
        &lvs_json(&[("lv1", "-wi-ao----", 1 << 30, "", "")]),
        "",
    );
    w.call(&["waitforattach", DEV, J]).unwrap();
    assert_eq!(w.lines(), [LVS, LVS]);
}

#[test]
fn kubelet_owned_paths() {
    for p in [
        "/var/lib/kubelet/plugins/kubernetes.io/flexvolume/example.com/lvm/mounts/pv-1",
        "/var/lib/kubelet/pods/uid/volumes/example.com~lvm/pv-1",
        "/var/lib/kubelet/pods/uid/volume-subpaths/pv-1/c/0",
    ] {
        assert!(kubelet_owned("example.com/lvm", Path::new(p)), "{p}");
    }
    for p in [
        "/",
        "/srv",
        "/var/lib/kubelet/plugins/kubernetes.io/flexvolume/example.com/lvm/mounts",
        "/var/lib/kubelet/plugins/kubernetes.io/flexvolume/example.com/lvm/mounts/pv-1/sub",
        "/var/lib/kubelet/plugins/kubernetes.io/flexvolume/example.com/nfs/mounts/pv-1",
        "/var/lib/kubelet/pods/uid/volumes/kubernetes.io~empty-dir/x",
        "/var/lib/kubelet/pods/uid/volumes/example.com~lvm",
    ] {
        assert!(!kubelet_owned("example.com/lvm", Path::new(p)), "{p}");
    }
}

/// #8: `size` is capped by lvm.maxVolumeSize and leaves lvm.vgReserve free.
#[test]
fn sizes_are_capped_by_node_config() {
    let capped = || {
        with_lvm(LvmConfig {
            device_wait_seconds: 1,
            allowed_volume_groups: vec!["vg0".into()],
            max_volume_size: Some(512 << 20),
            vg_reserve: 7 << 30,
            ..LvmConfig::default()
        })
    };
    // Thick and thin creation above the cap: refused before lvcreate.
    for extra in ["", r#""thinpool":"pool","#] {
        let w = capped();
        w.runner.on(
            "lvm",
            &["lvs"],
            0,
            &lvs_json(&[("pool", "twi-aotz--", 1 << 30, "", "")]),
            "",
        );
        w.runner.on("lvm", &["vgs"], 0, &vgs_json(8 << 30), "");
        let j = J.replace(r#""size""#, &format!("{extra}\"size\""));
        let e = w.call(&["waitforattach", DEV, &j]).unwrap_err();
        assert!(e.to_string().contains("lvm.maxVolumeSize"), "{e}");
        assert!(!w.lines().iter().any(|l| l.contains("lvcreate")));
    }
    // Under the cap, but it would eat into the reserve: 8 GiB free - 7 GiB reserved < 1.5 GiB.
    let w = with_lvm(LvmConfig {
        device_wait_seconds: 1,
        allowed_volume_groups: vec!["vg0".into()],
        max_volume_size: None,
        vg_reserve: 7 << 30,
        ..LvmConfig::default()
    });
    w.runner.on("lvm", &["lvs"], 0, &lvs_json(&[]), "");
    w.runner.on("lvm", &["vgs"], 0, &vgs_json(8 << 30), "");
    let e = w
        .call(&["waitforattach", DEV, &J.replace("1Gi", "1.5Gi")])
        .unwrap_err();
    assert!(e.to_string().contains("lvm.vgReserve"), "{e}");
    assert!(!w.lines().iter().any(|l| l.contains("lvcreate")));
    // 1 GiB fits exactly.
    w.call(&["waitforattach", DEV, J]).unwrap();
    assert!(w.lines().iter().any(|l| l.contains("lvcreate")));
    // Growth beyond the cap: refused before lvextend.
    let w = capped();
    let g = w.global();
    let p = w.pod();
    w.mounter.add(DEV, &g, "ext4", false);
    lvs_with(&w, "-wi-ao----", "");
    let e = w
        .call(&["expandfs", J, DEV, s(&p), "2147483648", "0"])
        .unwrap_err();
    assert!(e.to_string().contains("lvm.maxVolumeSize"), "{e}");
    assert_eq!(w.lines(), [LVS]);
}

#[test]
fn lvm_node_config_keys() {
    let c = Config::parse(
        Path::new("/c.json"),
        br#"{"lvm":{"allowedVolumeGroups":["vg0","data"],"maxVolumeSize":"100Gi","vgReserve":"10Gi"}}"#,
    )
    .unwrap();
    assert_eq!(c.lvm.allowed_volume_groups, ["vg0", "data"]);
    assert_eq!(c.lvm.max_volume_size, Some(100 << 30));
    assert_eq!(c.lvm.vg_reserve, 10 << 30);
    let d = Config::default();
    assert!(d.lvm.allowed_volume_groups.is_empty());
    assert_eq!((d.lvm.max_volume_size, d.lvm.vg_reserve), (None, 0));
    for bad in [
        r#"{"lvm":{"allowedVolumeGroups":["vg/0"]}}"#,
        r#"{"lvm":{"allowedVolumeGroups":"vg0"}}"#,
        r#"{"lvm":{"maxVolumeSize":"lots"}}"#,
        r#"{"lvm":{"vgReserve":10}}"#,
        r#"{"lvm":{"allowedVolumeGroup":["vg0"]}}"#,
    ] {
        assert!(
            Config::parse(Path::new("/c.json"), bad.as_bytes()).is_err(),
            "{bad}"
        );
    }
}

/// The host-use check over a real mountinfo text: one device mounted several times.
#[test]
fn host_use_check_over_several_mounts_of_one_device() {
    let table = |points: &[&str]| {
        let text: String = points
            .iter()
            .enumerate()
            .map(|(i, p)| {
                format!(
                    "{} 1 253:4 / {p} rw,relatime - ext4 /dev/mapper/vg0-lv1 rw\n",
                    30 + i
                )
            })
            .collect();
        crate::sys::mountinfo::MountTable::parse(text.as_bytes()).unwrap()
    };
    let o = LvmOptions::parse(&Options::parse(J).unwrap()).unwrap();
    let devs = FakeDevices::present();
    let check = |t: &crate::sys::mountinfo::MountTable, open| {
        policy::check_not_in_use("example.com/lvm", &devs, t, &o, (253, 4), open)
    };
    let kubelet = [
        "/var/lib/kubelet/plugins/kubernetes.io/flexvolume/example.com/lvm/mounts/pv-lvm-1",
        "/var/lib/kubelet/pods/u1/volumes/example.com~lvm/pv-lvm-1",
        "/var/lib/kubelet/pods/u2/volumes/example.com~lvm/pv-lvm-1",
        "/var/lib/kubelet/pods/u2/volume-subpaths/pv-lvm-1/web/0",
    ];
    check(&table(&kubelet), Some(true)).unwrap();
    check(&table(&[]), Some(false)).unwrap();
    check(&table(&[]), None).unwrap();
    let e = check(&table(&[]), Some(true)).unwrap_err();
    assert!(e.to_string().contains("open"), "{e}");
    let mut with_host = kubelet.to_vec();
    with_host.insert(2, "/home");
    let e = check(&table(&with_host), Some(true)).unwrap_err();
    assert!(e.to_string().contains("mounted at /home"), "{e}");
    // Another device's mounts do not matter.
    let e = policy::check_not_in_use("example.com/lvm", &devs, &table(&["/"]), &o, (253, 5), None);
    assert!(e.is_ok());
}

/// The tags of an LV the provisioner made for PV `pv-lvm-1`.
const PROVISIONED: &str = "flexvol.created,flexvol.pv.pv-lvm-1";

/// The node key's token for `pv` at `vg0/lv`, and the key made for it.
fn token(w: &World, pv: &str, lv: &str) -> String {
    use crate::node::capability::{Key, Location, node_key_path};
    Key::load_or_create(&node_key_path(&w.config.state_dir))
        .unwrap()
        .sign(pv, &Location::Lvm { vg: "vg0", lv })
}

/// `J` for volume `name` (kubelet's pvOrVolumeName) with `extra` members (no size).
fn jv(name: &str, extra: &str) -> String {
    J.replace(r#""pv-lvm-1""#, &format!("\"{name}\""))
        .replace(r#""size":"1Gi","#, extra)
}

/// #20 hole 2: an inline volume that names an LV the provisioner made (tagged
/// `flexvol.pv.<pv>`) gets nothing from any node verb, whatever it calls itself; the refusal
/// comes after the one `lvs` and before anything changes.
#[test]
fn an_inline_volume_naming_a_provisioned_lv_is_refused() {
    for name in ["pv-lvm-1", "data"] {
        let j = jv(name, "");
        // waitforattach: no activation.
        let w = world();
        lvs_with(&w, "-wi-------", PROVISIONED);
        let e = w.call(&["waitforattach", DEV, &j]).unwrap_err();
        assert!(
            e.to_string()
                .contains("served only to the PV it was made for"),
            "{name}: {e}"
        );
        assert_eq!(w.lines(), [LVS]);
        // Already active: the same.
        let w = world();
        lvs_with(&w, "-wi-a-----", PROVISIONED);
        assert!(w.call(&["waitforattach", DEV, &j]).is_err());
        assert_eq!(w.lines(), [LVS]);
        // mountdevice of a blank LV: no mkfs, no mount.
        let w = world();
        let g = w.global();
        blkid(&w, 2, "");
        lvs_with(&w, "-wi-a-----", PROVISIONED);
        assert!(w.call(&["mountdevice", s(&g), DEV, &j]).is_err());
        assert_eq!(w.runner.count("mkfs.ext4"), 0);
        assert!(w.mounter.calls().is_empty());
        // mount: the LV is mounted for its PV at the global directory; nothing is bound.
        let w = world();
        let g = w.global();
        let p = w.pod();
        w.mounter.add(DEV, &g, "ext4", false);
        lvs_with(&w, "-wi-ao----", PROVISIONED);
        let e = w.call(&["mount", s(&p), &j]).unwrap_err();
        assert!(e.to_string().contains("served only to the PV"), "{e}");
        assert!(w.mounter.calls().is_empty());
        assert_eq!(w.state_files(), 0);
        // expandfs: no lvextend, no resize.
        let w = world();
        w.mounter.add(DEV, &w.global(), "ext4", false);
        lvs_with(&w, "-wi-ao----", PROVISIONED);
        assert!(
            w.call(&["expandfs", &j, DEV, s(&w.pod()), "2147483648", "0"])
                .is_err()
        );
        assert_eq!(w.lines(), [LVS]);
    }
}

/// A provisioned clone larger than its source (tag `flexvol.grow-fs`): mountdevice never formats
/// it, mounts it, grows the filesystem to the LV and removes the tag; a mountdevice of it already
/// mounted (kubelet's retry after a failed grow) grows it too; read-only, nothing is grown.
#[test]
fn mountdevice_grows_a_larger_clones_filesystem_once() {
    let w = world();
    let good = jv(
        "pv-lvm-1",
        &format!(r#""capabilityToken":"{}","#, token(&w, "pv-lvm-1", "lv1")),
    );
    let g = w.global();
    blkid(&w, 0, EXT4);
    let grow = format!("{PROVISIONED},flexvol.formatted,flexvol.grow-fs");
    lvs_with(&w, "-wi-a-----", &grow);
    w.call(&["mountdevice", s(&g), DEV, &good]).unwrap();
    assert_eq!(
        w.lines(),
        [
            "blkid -p -o export -- /dev/vg0/lv1",
            LVS,
            "resize2fs /dev/vg0/lv1",
            "lvm lvchange -y --deltag flexvol.grow-fs -- vg0/lv1",
        ]
    );
    assert_eq!(w.runner.count("mkfs.ext4"), 0);
    // Already mounted (the tag still there, as after a failed grow): grown again.
    w.call(&["mountdevice", s(&g), DEV, &good]).unwrap();
    assert_eq!(
        w.lines()[4..],
        [
            LVS,
            "resize2fs /dev/vg0/lv1",
            "lvm lvchange -y --deltag flexvol.grow-fs -- vg0/lv1"
        ]
    );
    // Read-only: no lvs, no grow.
    let w = world();
    let ro = jv(
        "pv-lvm-1",
        &format!(r#""capabilityToken":"{}","#, token(&w, "pv-lvm-1", "lv1")),
    )
    .replace(r#""rw""#, r#""ro""#);
    blkid(&w, 0, EXT4);
    lvs_with(&w, "-wi-a-----", &grow);
    w.call(&["mountdevice", s(&w.global()), DEV, &ro]).unwrap();
    assert_eq!(w.lines(), ["blkid -p -o export -- /dev/vg0/lv1"]);
}

/// The PV's own options (its `capabilityToken`) are served; a token for another PV or LV, or a
/// token of the right LV under another name, is refused.
#[test]
fn a_provisioned_lv_is_served_with_its_token_only() {
    // waitforattach and expandfs with the PV's token.
    let w = world();
    let good = jv(
        "pv-lvm-1",
        &format!(r#""capabilityToken":"{}","#, token(&w, "pv-lvm-1", "lv1")),
    );
    lvs_with(&w, "-wi-------", PROVISIONED);
    w.call(&["waitforattach", DEV, &good]).unwrap();
    assert_eq!(w.lines(), [LVS, "lvm lvchange -ay -K -- vg0/lv1"]);
    // mountdevice of an existing filesystem and mount: the token, and one lvs (a clone's
    // flexvol.grow-fs tag, not here), no other LVM command.
    let w = world();
    let good = jv(
        "pv-lvm-1",
        &format!(r#""capabilityToken":"{}","#, token(&w, "pv-lvm-1", "lv1")),
    );
    let g = w.global();
    let p = w.pod();
    blkid(&w, 0, EXT4);
    lvs_with(&w, "-wi-a-----", PROVISIONED);
    w.call(&["mountdevice", s(&g), DEV, &good]).unwrap();
    w.call(&["mount", s(&p), &good]).unwrap();
    assert_eq!(w.lines(), ["blkid -p -o export -- /dev/vg0/lv1", LVS]);
    assert_eq!(w.mounter.calls().len(), 2);
    let rec = std::fs::read_dir(w.config.state_dir.join("lvm"))
        .unwrap()
        .map(|e| std::fs::read_to_string(e.unwrap().path()).unwrap())
        .collect::<String>();
    assert!(!rec.contains(&token(&w, "pv-lvm-1", "lv1")[3..]), "{rec}");

    // Wrong tokens: another PV's (named as that PV), another LV's, one under another name.
    let w = world();
    let bad = [
        jv(
            "pv-lvm-2",
            &format!(r#""capabilityToken":"{}","#, token(&w, "pv-lvm-2", "lv1")),
        ),
        jv(
            "pv-lvm-1",
            &format!(r#""capabilityToken":"{}","#, token(&w, "pv-lvm-1", "lv2")),
        ),
        jv(
            "data",
            &format!(r#""capabilityToken":"{}","#, token(&w, "pv-lvm-1", "lv1")),
        ),
        jv("pv-lvm-1", r#""capabilityToken":"v1.00","#),
    ];
    for j in &bad {
        let w = world();
        token(&w, "x", "x");
        lvs_with(&w, "-wi-------", PROVISIONED);
        let e = w.call(&["waitforattach", DEV, j]).unwrap_err();
        assert!(e.to_string().contains("served only to the PV"), "{j}: {e}");
        assert!(!e.to_string().contains("v1."), "{e}");
        assert_eq!(w.lines(), [LVS]);
        // mountdevice/mount judge the token without a row: refused before anything.
        let w = world();
        token(&w, "x", "x");
        let g = w.global();
        blkid(&w, 0, EXT4);
        if !j.contains("\"data\"") {
            assert!(w.call(&["mountdevice", s(&g), DEV, j]).is_err(), "{j}");
        }
        w.mounter.add(DEV, &g, "ext4", false);
        lvs_with(&w, "-wi-ao----", PROVISIONED);
        assert!(w.call(&["mount", s(&w.pod()), j]).is_err(), "{j}");
        assert_eq!(w.mounter.calls().len(), 0, "{j}");
    }
}

/// An LV made before tokens is served through its legacy grant: to its PV, in its claim's
/// namespace (which only `mount` knows).
#[test]
fn a_legacy_lv_is_served_to_its_pv_in_its_namespace() {
    use crate::node::capability::{LegacyGrant, Location, write_legacy_grant};
    let w = world();
    write_legacy_grant(
        &w.config.state_dir,
        &Location::Lvm {
            vg: "vg0",
            lv: "lv1",
        },
        &LegacyGrant {
            pv: "pv-lvm-1".into(),
            namespace: "team-b".into(),
        },
    )
    .unwrap();
    lvs_with(&w, "-wi-ao----", PROVISIONED);
    w.mounter.add(DEV, &w.global(), "ext4", false);
    let in_ns = |ns: &str| {
        J.replace(
            r#""kubernetes.io/readwrite""#,
            &format!(r#""kubernetes.io/pod.namespace":"{ns}","kubernetes.io/readwrite""#),
        )
    };
    let e = w
        .call(&["mount", s(&w.pod()), &in_ns("team-a")])
        .unwrap_err();
    assert!(e.to_string().contains("served only to the PV"), "{e}");
    w.call(&["mount", s(&w.pod()), &in_ns("team-b")]).unwrap();
    assert_eq!(w.lines(), [LVS, LVS]);
}

// ---- the CSI front (csi.rs) ----

/// The LVM options a CSI call is turned into (`crate::csi::node::lvm_options`): no PV name.
fn csi_options(extra: &str) -> LvmOptions {
    let json = format!(
        r#"{{"volumegroup":"vg0","volumeID":"lv1","kubernetes.io/fsType":"ext4","kubernetes.io/readwrite":"rw"{extra}}}"#
    );
    LvmOptions::parse(&Options::parse(&json).unwrap()).unwrap()
}

impl World {
    /// A staging path of kubelet before 1.25 (not made: NodeStageVolume makes its last part).
    fn staging(&self) -> PathBuf {
        let p = self
            .root
            .join("kubelet/plugins/kubernetes.io/csi/pv/pv-lvm-1/globalmount");
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        p
    }

    /// A CSI target path (not made: NodePublishVolume makes its last part).
    fn csi_target(&self) -> PathBuf {
        let p = self
            .root
            .join("kubelet/pods/6f3c1b8e/volumes/kubernetes.io~csi/pv-lvm-1/mount");
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        p
    }
}

#[test]
fn csi_stage_publish_unpublish_unstage_is_the_verbs_steps_and_repeats_cleanly() {
    let w = world();
    let (st, t) = (w.staging(), w.csi_target());
    lvs_with(&w, "-wi-a-----", "");
    blkid(&w, 2, "");
    let o = csi_options("");
    w.with_csi_lvm(|ctx, seams| csi::stage(ctx, seams, &st, &o))
        .unwrap();
    assert!(st.is_dir(), "the staging directory is made");
    assert_eq!(
        w.lines(),
        [
            LVS,
            "blkid -p -o export -- /dev/vg0/lv1",
            LVS,
            "mkfs.ext4 -q /dev/vg0/lv1",
            "lvm lvchange -y --addtag flexvol.formatted -- vg0/lv1",
        ]
    );
    // Staged again (kubelet retries): the LV is open by this plugin's own staging mount, which
    // is kubelet's for this CSI driver, so nothing is refused and nothing is formatted.
    lvs_with(&w, "-wi-ao----", "flexvol.formatted");
    w.with_csi_lvm(|ctx, seams| csi::stage(ctx, seams, &st, &o))
        .unwrap();
    assert_eq!(w.lines().len(), 6, "{:?}", w.lines());
    assert_eq!(w.lines()[5], LVS);

    // (A repeated publish is proven with real mounts: guest_lvm_csi; this fake's binds get
    // device numbers of their own.)
    w.with_csi_lvm(|ctx, seams| csi::publish(ctx, seams, &st, &t, &o))
        .unwrap();
    let binds: Vec<_> = w
        .mounter
        .calls()
        .into_iter()
        .filter(|c| matches!(c, MountCall::Bind(..)))
        .collect();
    assert_eq!(binds, [MountCall::Bind(st.clone(), t.clone(), false)]);

    w.with_csi_lvm(|ctx, _| csi::unpublish(ctx, &t)).unwrap();
    w.with_csi_lvm(|ctx, _| csi::unpublish(ctx, &t)).unwrap();
    assert!(!t.exists(), "the target directory is removed");
    w.with_csi_lvm(|ctx, seams| csi::unstage(ctx, seams, &st))
        .unwrap();
    w.with_csi_lvm(|ctx, seams| csi::unstage(ctx, seams, &st))
        .unwrap();
    let calls = w.mounter.calls();
    assert_eq!(
        calls[calls.len() - 2..],
        [
            MountCall::Unmount(t.clone(), UnmountMode::Normal),
            MountCall::Unmount(st.clone(), UnmountMode::Normal),
        ]
    );
    assert_eq!(
        w.lines().last().map(String::as_str),
        Some("lvm lvchange -an -- vg0/lv1")
    );
    assert_eq!(w.state_files(), 0);
}

/// The node key's namespaced token for `pv` of namespace `ns` at `vg0/lv1`.
fn ns_token(w: &World, pv: &str, ns: &str) -> String {
    use crate::node::capability::{Key, Location, node_key_path};
    Key::load_or_create(&node_key_path(&w.config.state_dir))
        .unwrap()
        .sign_for(
            pv,
            ns,
            &Location::Lvm {
                vg: "vg0",
                lv: "lv1",
            },
        )
}

/// CSI options as `crate::csi::node` makes them, for PV `pv` (kubelet's, from the target or
/// staging path) and the pod's namespace `ns`, with a token.
fn csi_provisioned(pv: Option<&str>, ns: Option<&str>, token: &str) -> LvmOptions {
    let mut extra = format!(r#","capabilityToken":"{token}""#);
    if let Some(pv) = pv {
        extra.push_str(&format!(r#","kubernetes.io/pvOrVolumeName":"{pv}""#));
    }
    if let Some(ns) = ns {
        extra.push_str(&format!(r#","kubernetes.io/pod.namespace":"{ns}""#));
    }
    csi_options(&extra)
}

#[test]
fn csi_serves_a_provisioned_lv_only_to_its_own_pv_and_namespace_with_its_token() {
    let w = world();
    let (st, t) = (w.staging(), w.csi_target());
    let tok = ns_token(&w, "pv-lvm-1", "team-a");
    lvs_with(&w, "-wi-a-----", PROVISIONED);
    blkid(&w, 0, EXT4);
    // Stage: with the token, with or without the PV's name (a later kubelet's staging path
    // names none: the token is checked against the PV the LV is tagged for).
    for pv in [None, Some("pv-lvm-1")] {
        let o = csi_provisioned(pv, None, &tok);
        w.with_csi_lvm(|ctx, seams| csi::stage(ctx, seams, &st, &o))
            .unwrap();
    }
    let mounts = w.mounter.calls().len();
    // Publish: only to its own PV, named by kubelet, and its claim's namespace.
    for (pv, ns, token, why) in [
        (None, Some("team-a"), tok.as_str(), "does not say which PV"),
        (
            Some("pv-copy"),
            Some("team-a"),
            tok.as_str(),
            "served only to the PV",
        ),
        (
            Some("pv-lvm-1"),
            Some("team-b"),
            tok.as_str(),
            "namespace team-a",
        ),
        (
            Some("pv-lvm-1"),
            Some("team-a"),
            "v1.00",
            "served only to the PV",
        ),
    ] {
        let o = csi_provisioned(pv, ns, token);
        let e = w
            .with_csi_lvm(|ctx, seams| csi::publish(ctx, seams, &st, &t, &o))
            .unwrap_err();
        assert!(e.to_string().contains(why), "{pv:?} {ns:?}: {e}");
        assert!(!e.to_string().contains(&tok[4..]), "{e}");
        assert_eq!(w.mounter.calls().len(), mounts, "nothing bound");
        assert!(!t.exists(), "the target made is removed again");
    }
    // Without a token: a provisioned LV is refused even with the right PV and namespace.
    let o = csi_options(
        r#","kubernetes.io/pvOrVolumeName":"pv-lvm-1","kubernetes.io/pod.namespace":"team-a""#,
    );
    let e = w
        .with_csi_lvm(|ctx, seams| csi::publish(ctx, seams, &st, &t, &o))
        .unwrap_err();
    assert!(e.to_string().contains("served only to the PV"), "{e}");
    let o = csi_provisioned(Some("pv-lvm-1"), Some("team-a"), &tok);
    w.with_csi_lvm(|ctx, seams| csi::publish(ctx, seams, &st, &t, &o))
        .unwrap();
    assert_eq!(
        w.mounter.calls().last(),
        Some(&MountCall::Bind(st.clone(), t.clone(), false))
    );
    // Expand of a provisioned LV beyond its size: refused, never an lvextend (the provisioner
    // owns its size); to its size: the filesystem grows, from the staging record alone.
    let before = w.lines().len();
    let e = w
        .with_csi_lvm(|ctx, seams| csi::expand(ctx, seams, &st, "vg0/lv1", 2 << 30))
        .unwrap_err();
    assert!(
        e.to_string().contains("grown by flexvol provisioner"),
        "{e}"
    );
    assert_eq!(w.lines()[before..], [LVS, LVS]);
    let before = w.lines().len();
    let size = w
        .with_csi_lvm(|ctx, seams| csi::expand(ctx, seams, &st, "vg0/lv1", 1 << 30))
        .unwrap();
    assert_eq!(size, 1 << 30);
    assert_eq!(
        w.lines()[before..],
        [LVS, LVS, "resize2fs /dev/vg0/lv1", LVS]
    );
}

#[test]
fn csi_stage_of_a_provisioned_lv_without_its_token_touches_nothing() {
    let w = world();
    let st = w.staging();
    lvs_with(&w, "-wi-------", PROVISIONED);
    for o in [
        csi_options(""),
        csi_options(r#","kubernetes.io/pvOrVolumeName":"pv-lvm-1""#),
        csi_provisioned(None, None, &ns_token(&w, "pv-other", "team-a")),
        csi_provisioned(Some("pv-copy"), None, &ns_token(&w, "pv-lvm-1", "team-a")),
    ] {
        let e = w
            .with_csi_lvm(|ctx, seams| csi::stage(ctx, seams, &st, &o))
            .unwrap_err();
        assert!(e.to_string().contains("served only to the PV"), "{e}");
        assert!(
            w.lines().iter().all(|l| l == LVS),
            "nothing activated or probed: {:?}",
            w.lines()
        );
        assert!(w.mounter.calls().is_empty());
        assert!(!st.exists(), "no staging directory left");
    }
}

#[test]
fn csi_stage_never_formats_an_lv_holding_anything_but_a_blank_probe() {
    let w = world();
    let st = w.staging();
    lvs_with(&w, "-wi-a-----", "");
    blkid(&w, 0, "DEVNAME=/dev/vg0/lv1\nPTTYPE=gpt\n");
    let e = w
        .with_csi_lvm(|ctx, seams| csi::stage(ctx, seams, &st, &csi_options("")))
        .unwrap_err();
    assert!(e.to_string().contains("refusing to format"), "{e}");
    assert!(!w.lines().iter().any(|l| l.starts_with("mkfs")));
    assert!(w.mounter.calls().is_empty());
    assert!(!st.exists(), "the staging directory made is removed again");
}

#[test]
fn csi_publish_binds_only_a_staging_mount_of_this_lv() {
    let w = world();
    let (st, t) = (w.staging(), w.csi_target());
    std::fs::create_dir_all(&st).unwrap();
    lvs_with(&w, "-wi-a-----", "");
    let o = csi_options("");
    // Not staged: nothing mounted there.
    let e = w
        .with_csi_lvm(|ctx, seams| csi::publish(ctx, seams, &st, &t, &o))
        .unwrap_err();
    assert!(e.to_string().contains("is not mounted at"), "{e}");
    // Something else mounted at the staging path (a tmpfs, another LV). The fake numbers its
    // mounts from DEVNUM's minor: the first one is taken by an unrelated mount.
    w.mounter
        .add("/dev/sda1", Path::new("/boot"), "ext4", false);
    w.mounter.add("tmpfs", &st, "tmpfs", false);
    let e = w
        .with_csi_lvm(|ctx, seams| csi::publish(ctx, seams, &st, &t, &o))
        .unwrap_err();
    assert!(e.to_string().contains("refusing to bind"), "{e}");
    assert!(
        !w.mounter
            .calls()
            .iter()
            .any(|c| matches!(c, MountCall::Bind(..)))
    );
}

#[test]
fn csi_expand_takes_the_lv_from_the_staging_record_never_the_request() {
    let w = world();
    let st = w.staging();
    lvs_with(&w, "-wi-a-----", "");
    blkid(&w, 0, EXT4);
    w.with_csi_lvm(|ctx, seams| csi::stage(ctx, seams, &st, &csi_options("")))
        .unwrap();
    let before = w.lines().len();
    // A volume id naming another LV than the one staged there.
    let e = w
        .with_csi_lvm(|ctx, seams| csi::expand(ctx, seams, &st, "vg0/other", 2 << 30))
        .unwrap_err();
    assert!(e.to_string().contains("is not the volume staged"), "{e}");
    assert_eq!(w.lines().len(), before, "nothing run");
    // Nothing staged at a path: refused, nothing run.
    let other = st
        .parent()
        .unwrap()
        .parent()
        .unwrap()
        .join("pv-2/globalmount");
    std::fs::create_dir_all(&other).unwrap();
    let e = w
        .with_csi_lvm(|ctx, seams| csi::expand(ctx, seams, &other, "vg0/lv1", 2 << 30))
        .unwrap_err();
    assert!(e.to_string().contains("no record"), "{e}");
    assert_eq!(w.lines().len(), before, "nothing run");
    let size = w
        .with_csi_lvm(|ctx, seams| csi::expand(ctx, seams, &st, "vg0/lv1", 2 << 30))
        .unwrap();
    assert_eq!(size, 1 << 30, "the scripted lvs still reports 1 GiB");
    assert_eq!(
        w.lines()[before..],
        [
            LVS,
            LVS,
            "lvm lvextend -y -L 2147483648b -- vg0/lv1",
            "resize2fs /dev/vg0/lv1",
            LVS,
        ]
    );
}

#[test]
fn kubelet_owned_knows_each_fronts_paths_and_only_its_own() {
    let flex = "example.com/lvm";
    let csi = "lvm.csi.example.com";
    let cases = [
        (
            "/var/lib/kubelet/plugins/kubernetes.io/flexvolume/example.com/lvm/mounts/pv1",
            true,
            false,
        ),
        (
            "/var/lib/kubelet/pods/u/volumes/example.com~lvm/pv1",
            true,
            false,
        ),
        (
            "/var/lib/kubelet/plugins/kubernetes.io/csi/pv/pv1/globalmount",
            false,
            true,
        ),
        (
            "/var/lib/kubelet/plugins/kubernetes.io/csi/lvm.csi.example.com/0a1b/globalmount",
            false,
            true,
        ),
        (
            "/var/lib/kubelet/plugins/kubernetes.io/csi/other.csi.io/0a1b/globalmount",
            false,
            false,
        ),
        (
            "/var/lib/kubelet/pods/u/volumes/kubernetes.io~csi/pv1/mount",
            false,
            true,
        ),
        (
            "/var/lib/kubelet/pods/u/volume-subpaths/pv1/c/0",
            true,
            true,
        ),
        ("/mnt/data", false, false),
        (
            "/var/lib/kubelet/pods/u/volumes/kubernetes.io~csi/pv1",
            false,
            false,
        ),
    ];
    for (p, by_flex, by_csi) in cases {
        assert_eq!(kubelet_owned(flex, Path::new(p)), by_flex, "{flex}: {p}");
        assert_eq!(kubelet_owned(csi, Path::new(p)), by_csi, "{csi}: {p}");
    }
    assert!(!kubelet_owned(
        "",
        Path::new("/var/lib/kubelet/pods/u/volumes/kubernetes.io~csi/pv1/mount")
    ));
}
