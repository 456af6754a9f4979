//! Unit tests: the LVM provisioner's command lines against the driver's scripted `lvm` (the same
//! fake node as the driver's tests), and its refusals.

use super::*;
use crate::backend::testing::{DEV, DEVNUM, FakeDevices, FakeLvs, World};
use crate::vocab::ANN_LV;
use crate::vocab::ANN_VG;
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

const LVS: &str = "lvm lvs --reportformat json --units b --nosuffix -o vg_name,lv_name,lv_path,lv_size,lv_attr,lv_tags,pool_lv,vg_extent_size,vg_free -- vg0";
const VGS: &str = "lvm vgs --reportformat json --units b --nosuffix -o vg_name,vg_extent_size,vg_free,vg_size -- vg0";
const PV: &str = "pvc-0a1b";
const MI: u64 = 1 << 20;

/// `lvs` of vg0 (4 MiB extents, `free` bytes free): rows of (lv, attr, size, tags, pool).
fn lvs_json(free: u64, rows: &[(&str, &str, u64, &str, &str)]) -> String {
    let rows: Vec<String> = rows
        .iter()
        .map(|(lv, attr, size, tags, pool)| {
            format!(
                r#"{{"vg_name":"vg0", "lv_name":"{lv}", "lv_path":"/dev/vg0/{lv}", "lv_size":"{size}", "lv_attr":"{attr}", "lv_tags":"{tags}", "pool_lv":"{pool}", "vg_extent_size":"4194304", "vg_free":"{free}"}}"#
            )
        })
        .collect();
    format!(r#"{{"report": [{{"lv": [{}]}}]}}"#, rows.join(","))
}

fn vgs_json(free: u64) -> String {
    format!(
        r#"{{"report": [{{"vg": [{{"vg_name":"vg0", "vg_extent_size":"4194304", "vg_free":"{free}"}}]}}]}}"#
    )
}

/// A node whose config grants vg0.
fn world() -> World {
    let mut w = World::new(Backend::Lvm);
    w.config.lvm.allowed_volume_groups = vec!["vg0".into()];
    w
}

fn params(kv: &[(&str, &str)]) -> BTreeMap<String, String> {
    kv.iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

fn provision_with(
    w: &World,
    pv: &str,
    p: &BTreeMap<String, String>,
    size: u64,
) -> Result<Provisioned, Refusal> {
    provision_on(w, None, pv, p, size)
}

/// [`provision_with`] through the real LV service over the scripted `lvm` (`lvm: None`), or
/// through the in-memory LVM `lvm`.
fn provision_on(
    w: &World,
    lvm: Option<&FakeLvs>,
    pv: &str,
    p: &BTreeMap<String, String>,
    size: u64,
) -> Result<Provisioned, Refusal> {
    let claim = PersistentVolumeClaim::default();
    let modes = vec!["ReadWriteOnce".to_owned()];
    let req = Request {
        pv_name: pv,
        claim: &claim,
        namespace: "ns",
        name: "data",
        uid: "0a1b",
        class_name: "lvm",
        params: p,
        size_bytes: size,
        access_modes: &modes,
        node: "node-a",
        source: None,
    };
    match lvm {
        None => w.with_lvm(|ctx, s| provision(ctx, s, &req)),
        Some(lvm) => on_fake(w, lvm, |ctx, s| provision(ctx, s, &req)),
    }
}

/// Runs `f` on `w`'s context with its devices and the in-memory LVM `lvm`.
fn on_fake<T>(w: &World, lvm: &FakeLvs, f: impl FnOnce(&Context, &Seams) -> T) -> T {
    let seams = Seams {
        devices: &w.devices,
        lvs: lvm,
    };
    w.with_ctx(|ctx| f(ctx, &seams))
}

fn pv_of(name: &str, vg: &str, lv: &str) -> PersistentVolume {
    PersistentVolume {
        metadata: ObjectMeta {
            name: Some(name.into()),
            annotations: Some(BTreeMap::from([
                (ANN_VG.to_owned(), vg.to_owned()),
                (ANN_LV.to_owned(), lv.to_owned()),
            ])),
            ..ObjectMeta::default()
        },
        ..PersistentVolume::default()
    }
}

fn tags(pv: &str) -> String {
    format!("{TAG_CREATED},{TAG_PV_PREFIX}{pv}")
}

#[test]
fn class_parameters_use_the_drivers_validation() {
    let ok = ClassParams::parse(&params(&[
        ("volumegroup", "vg0"),
        ("thinpool", "pool"),
        ("fsType", "xfs"),
        ("mkfsOptions", "-m crc=1 -L data"),
    ]))
    .unwrap();
    assert_eq!(ok.volume.vg, "vg0");
    assert_eq!(ok.volume.thin_pool.as_deref(), Some("pool"));
    assert_eq!(ok.volume.mkfs_args, ["-m", "crc=1", "-L", "data"]);
    for (bad, needle) in [
        (vec![], "volumegroup"),
        (vec![("volumegroup", "vg/0")], "volumegroup"),
        (vec![("volumegroup", "-vg")], "volumegroup"),
        (
            vec![("volumegroup", "vg0"), ("thinpool", "../p")],
            "thinpool",
        ),
        (vec![("volumegroup", "vg0"), ("fsType", "NTFS")], "fsType"),
        (
            vec![("volumegroup", "vg0"), ("mkfsOptions", "-F")],
            "mkfsOptions",
        ),
        (
            vec![("volumegroup", "vg0"), ("mkfsOptions", "-m 0 /dev/sda")],
            "mkfsOptions",
        ),
        (
            vec![
                ("volumegroup", "vg0"),
                ("fsType", "xfs"),
                ("mkfsOptions", "-l logdev=/dev/sda"),
            ],
            "mkfsOptions",
        ),
        // Keys the driver knows but a class may not set: the LV and its size come from the claim.
        (vec![("volumegroup", "vg0"), ("size", "1Gi")], "unknown"),
        (
            vec![("volumegroup", "vg0"), ("volumeID", "root")],
            "unknown",
        ),
        (
            vec![("volumegroup", "vg0"), ("mountOptions", "noatime")],
            "unknown",
        ),
        (
            vec![("volumegroup", "vg0"), ("kubernetes.io/fsType", "ext4")],
            "unknown",
        ),
        (vec![("volumeGroup", "vg0")], "unknown"),
    ] {
        let e = ClassParams::parse(&params(&bad)).unwrap_err().to_string();
        assert!(e.contains(needle), "{bad:?}: {e}");
    }
}

#[test]
fn pv_options_make_the_driver_use_exactly_this_lv_and_create_nothing() {
    let p = ClassParams::parse(&params(&[
        ("volumegroup", "vg0"),
        ("thinpool", "pool"),
        ("fsType", "ext4"),
        ("mkfsOptions", "-m 0"),
    ]))
    .unwrap();
    let o = p.for_pv(PV).unwrap();
    let mut opts = p.pv_options(&o);
    assert_eq!(opts.get("volumeID").map(String::as_str), Some(PV));
    assert!(!opts.contains_key("size") && !opts.contains_key("thinpool"));
    // No key of the reserved kubernetes.io/ namespace (the API server refuses the PV).
    assert!(
        opts.keys().all(|k| !k.contains("kubernetes.io/")),
        "{opts:?}"
    );
    // As kubelet sends them to the driver, the PV's fsType among them.
    opts.insert(keys::PV_OR_VOLUME_NAME.into(), PV.into());
    opts.insert(keys::FS_TYPE.into(), p.fs_type.clone().unwrap());
    let json = serde_json::to_string(&opts).unwrap();
    let d = LvmOptions::parse(&Options::parse(&json).unwrap()).unwrap();
    assert_eq!(d.key(), format!("vg0/{PV}"));
    assert_eq!(d.size, None);
    assert_eq!(d.fs.name(), "ext4");
    assert_eq!(d.mkfs_args, ["-m", "0"]);
}

#[test]
fn provision_creates_a_tagged_lv_rounded_to_extents() {
    let w = world();
    let made = lvs_json(8 << 30, &[(PV, "-wi-a-----", 68 * MI, &tags(PV), "")]);
    w.runner.on("lvm", &["lvs"], 0, &made, "");
    w.runner
        .once("lvm", &["lvs"], 0, &lvs_json(8 << 30, &[]), "");
    w.runner.on("lvm", &["vgs"], 0, &vgs_json(8 << 30), "");
    let p = params(&[("volumegroup", "vg0"), ("fsType", "xfs")]);
    let r = provision_with(&w, PV, &p, 65 * MI).unwrap();
    assert_eq!(
        w.lines(),
        [
            LVS,
            VGS,
            &format!(
                "lvm lvcreate -y -Wy --addtag flexvol.created --addtag flexvol.pv.{PV} -n {PV} --setautoactivation n -Zy -L 71303168b -- vg0"
            ),
            LVS,
        ]
    );
    assert_eq!(r.capacity_bytes, 68 * MI);
    assert_eq!(r.location, format!("vg0/{PV}"));
    assert_eq!(r.annotations[ANN_SIZE], (68 * MI).to_string());
    assert_eq!(r.annotations[ANN_SIZE_ENFORCED], "true");
    assert_eq!(r.annotations[ANN_VG], "vg0");
    assert_eq!(r.annotations[ANN_LV], PV);
    // The capability: the node key's token for this PV and LV (#20).
    let key = crate::node::capability::Key::load(
        &crate::node::capability::node_key_path(&w.config.state_dir),
        "made by provision",
    )
    .unwrap();
    let token = key.sign_for(PV, "ns", &Location::Lvm { vg: "vg0", lv: PV });
    assert_eq!(
        r.options,
        params(&[
            ("volumegroup", "vg0"),
            ("volumeID", PV),
            ("capabilityToken", &token)
        ])
    );
    // Not an option: the API server refuses kubernetes.io/ keys there; kubelet sends it as one.
    assert_eq!(r.fs_type.as_deref(), Some("xfs"));
}

/// #20: the driver serves a provisioned LV to its PV's options as kubelet sends them (the
/// token in them), and not to a copy without the token (an inline volume).
#[test]
fn the_driver_serves_the_lv_to_the_pvs_options_only() {
    // PV "lv1" so that the fake node's one device (/dev/vg0/lv1) is its LV; found made.
    let w = world();
    let made = lvs_json(8 << 30, &[("lv1", "-wi-a-----", 64 * MI, &tags("lv1"), "")]);
    w.runner.on("lvm", &["lvs"], 0, &made, "");
    let r = provision_with(&w, "lv1", &params(&[("volumegroup", "vg0")]), 64 * MI).unwrap();
    let mut kubelet = r.options.clone();
    kubelet.insert(keys::PV_OR_VOLUME_NAME.into(), "lv1".into());
    let with_token = serde_json::to_string(&kubelet).unwrap();
    kubelet.remove("capabilityToken");
    let inline = serde_json::to_string(&kubelet).unwrap();
    w.call(&["waitforattach", DEV, &with_token]).unwrap();
    let e = w.call(&["waitforattach", DEV, &inline]).unwrap_err();
    assert!(e.to_string().contains("served only to the PV"), "{e}");
}

#[test]
fn provision_after_a_kill_reuses_our_lv_and_never_touches_a_foreign_one() {
    let p = params(&[("volumegroup", "vg0")]);
    // Ours (made by a pass killed before the PV was written): reused, nothing run but lvs.
    let w = world();
    let row = [
        (PV, "-wi-a-----", 64 * MI, tags(PV)),
        (PV, "-wi-a-----", 64 * MI, String::new()),
    ];
    w.runner.on(
        "lvm",
        &["lvs"],
        0,
        &lvs_json(8 << 30, &[(row[0].0, row[0].1, row[0].2, &row[0].3, "")]),
        "",
    );
    let r = provision_with(&w, PV, &p, 64 * MI).unwrap();
    assert_eq!(r.capacity_bytes, 64 * MI);
    assert_eq!(w.lines(), [LVS]);
    // Same name, made for another PV, only flexvol.created, or no tag: Fail, nothing else run.
    for t in [
        "",
        TAG_CREATED,
        "flexvol.created,flexvol.pv.pvc-other",
        "flexvol.pv.pvc-0a1b",
    ] {
        let w = world();
        w.runner.on(
            "lvm",
            &["lvs"],
            0,
            &lvs_json(8 << 30, &[(PV, "-wi-a-----", 64 * MI, t, "")]),
            "",
        );
        let e = provision_with(&w, PV, &p, 64 * MI).unwrap_err();
        match e {
            Refusal::Fail(m) => assert!(m.contains("leaves it alone"), "{m}"),
            other => panic!("{t}: {other:?}"),
        }
        assert_eq!(w.lines(), [LVS], "{t}");
    }
}

#[test]
fn provision_sends_the_claim_elsewhere_when_this_node_cannot_serve_it() {
    let p = params(&[("volumegroup", "vg0")]);
    let resched = |r: Result<Provisioned, Refusal>, needle: &str| match r {
        Err(Refusal::Reschedule(m)) => assert!(m.contains(needle), "{m}"),
        other => panic!("{needle}: {other:?}"),
    };
    // Not granted by this node's config: no LVM command at all.
    let w = World::new(Backend::Lvm);
    resched(
        provision_with(&w, PV, &p, 64 * MI),
        "lvm.allowedVolumeGroups",
    );
    assert!(w.lines().is_empty());
    // No such VG.
    let w = world();
    w.runner
        .on("lvm", &["lvs"], 5, "", "  Volume group \"vg0\" not found\n");
    resched(
        provision_with(&w, PV, &p, 64 * MI),
        "does not exist on node node-a",
    );
    // Room: 100 MiB free, 40 MiB reserved: 60 MiB fits, 61 MiB (64 rounded) does not.
    for (size, fits) in [(60 * MI, true), (61 * MI, false)] {
        let mut w = world();
        w.config.lvm.vg_reserve = 40 * MI;
        w.runner
            .on("lvm", &["lvs"], 0, &lvs_json(100 * MI, &[]), "");
        w.runner.on("lvm", &["vgs"], 0, &vgs_json(100 * MI), "");
        let r = provision_with(&w, PV, &p, size);
        if fits {
            // (the fake lvs never lists the LV afterwards)
            assert!(matches!(r, Err(Refusal::Fail(_))), "{r:?}");
            assert_eq!(
                w.runner
                    .lines()
                    .iter()
                    .filter(|l| l.contains("lvcreate"))
                    .count(),
                1
            );
        } else {
            resched(r, "lvm.vgReserve");
            assert!(!w.lines().iter().any(|l| l.contains("lvcreate")));
        }
    }
    // maxVolumeSize, after rounding: 65 MiB becomes 68 MiB > 66 MiB.
    let mut w = world();
    w.config.lvm.max_volume_size = Some(66 * MI);
    w.runner.on("lvm", &["lvs"], 0, &lvs_json(8 << 30, &[]), "");
    w.runner.on("lvm", &["vgs"], 0, &vgs_json(8 << 30), "");
    resched(provision_with(&w, PV, &p, 65 * MI), "lvm.maxVolumeSize");
    assert!(!w.lines().iter().any(|l| l.contains("lvcreate")));
    // A thin pool that is missing, or is not a pool.
    let thin = params(&[("volumegroup", "vg0"), ("thinpool", "pool")]);
    for rows in [vec![], vec![("pool", "-wi-a-----", 1u64 << 30, "", "")]] {
        let w = world();
        w.runner
            .on("lvm", &["lvs"], 0, &lvs_json(8 << 30, &rows), "");
        w.runner.on("lvm", &["vgs"], 0, &vgs_json(8 << 30), "");
        resched(
            provision_with(&w, PV, &thin, 64 * MI),
            "thin pool vg0/pool does not exist",
        );
        assert!(!w.lines().iter().any(|l| l.contains("lvcreate")));
    }
}

#[test]
fn thin_volumes_respect_the_overprovisioning_ratio() {
    let thin = params(&[("volumegroup", "vg0"), ("thinpool", "pool")]);
    // A 1 GiB pool holding 768 MiB of thin LVs; thin LVs ignore vgReserve and VG free space.
    let rows = [
        ("pool", "twi-aotz--", 1u64 << 30, "", ""),
        ("a", "Vwi-a-tz--", 512 * MI, "", "pool"),
        ("b", "Vwi-a-tz--", 256 * MI, "", "pool"),
        ("thick", "-wi-a-----", 4 << 30, "", ""),
    ];
    for (ratio, size, fits) in [
        (1000, 256 * MI, true),
        (1000, 257 * MI, false),
        (2000, 1280 * MI, true),
        (2000, 1281 * MI, false),
    ] {
        let mut w = world();
        w.config.lvm.thin_overprovision_permille = ratio;
        w.config.lvm.vg_reserve = 1 << 40;
        w.runner.on("lvm", &["lvs"], 0, &lvs_json(0, &rows), "");
        w.runner.on("lvm", &["vgs"], 0, &vgs_json(0), "");
        let r = provision_with(&w, PV, &thin, size);
        let created = w
            .lines()
            .iter()
            .any(|l| l.contains("--thinpool pool -- vg0") && l.contains("lvcreate"));
        assert_eq!(created, fits, "{ratio} {size}: {r:?}");
        if !fits {
            match r {
                Err(Refusal::Reschedule(m)) => {
                    assert!(m.contains("lvm.thinOverprovisionRatio"), "{m}");
                }
                other => panic!("{other:?}"),
            }
        }
    }
}

#[test]
fn expand_of_an_lv_not_here_or_not_tagged_for_the_pv_is_not_found() {
    let pv = pv_of("lv1", "vg0", "lv1");
    for rows in [
        lvs_json(8 << 30, &[]),
        lvs_json(
            8 << 30,
            &[("lv1", "-wi-------", 64 * MI, "flexvol.pv.lv2", "")],
        ),
    ] {
        let w = world();
        w.runner.on("lvm", &["lvs"], 0, &rows, "");
        let e = w.with_lvm(|c, s| expand(c, s, &pv, 128 * MI)).unwrap_err();
        assert!(matches!(e, ProvisionError::NotFound(_)), "{e:?}");
        assert_eq!(
            e.to_string(),
            "vg0/lv1 with the tag flexvol.pv.lv1 does not exist on this node; cannot grow it"
        );
        assert!(!w.lines().iter().any(|l| l.contains("lvextend")));
    }
}

#[test]
fn delete_removes_only_our_unused_lv() {
    // The fake node's one device is /dev/vg0/lv1: a PV named lv1 reaches it.
    let pv = pv_of("lv1", "vg0", "lv1");
    let lvs = |attr: &str, t: &str| lvs_json(8 << 30, &[("lv1", attr, 64 * MI, t, "")]);
    // Already gone.
    let w = world();
    w.runner.on("lvm", &["lvs"], 0, &lvs_json(8 << 30, &[]), "");
    assert!(
        w.with_lvm(|c, s| delete(c, s, &pv))
            .unwrap()
            .contains("already gone")
    );
    // Not ours for this PV: never removed.
    for t in ["", TAG_CREATED, "flexvol.created,flexvol.pv.lv2"] {
        let w = world();
        w.runner.on("lvm", &["lvs"], 0, &lvs("-wi-------", t), "");
        let e = w.with_lvm(|c, s| delete(c, s, &pv)).unwrap_err();
        assert!(matches!(e, ProvisionError::Refused(_)), "{e:?}");
        let e = e.to_string();
        assert!(e.contains("does not carry the tag flexvol.pv.lv1"), "{e}");
        assert_eq!(w.runner.count("lvm"), 1);
    }
    // Inactive: lvremove alone.
    let w = world();
    w.runner
        .on("lvm", &["lvs"], 0, &lvs("-wi-------", &tags("lv1")), "");
    assert_eq!(
        w.with_lvm(|c, s| delete(c, s, &pv)).unwrap(),
        "removed vg0/lv1"
    );
    assert_eq!(w.lines()[1..], ["lvm lvremove -y -- vg0/lv1"]);
    // Active, unused: deactivated, then removed.
    let w = world();
    w.runner
        .on("lvm", &["lvs"], 0, &lvs("-wi-a-----", &tags("lv1")), "");
    w.with_lvm(|c, s| delete(c, s, &pv)).unwrap();
    assert_eq!(
        w.lines()[1..],
        ["lvm lvchange -an -- vg0/lv1", "lvm lvremove -y -- vg0/lv1"]
    );
    // In use: mounted (even by kubelet), open, stacked on, swap; nothing changes.
    for how in ["mount", "open", "holder", "swap"] {
        let w = world();
        let attr = if how == "open" {
            "-wi-ao----"
        } else {
            "-wi-a-----"
        };
        w.runner
            .on("lvm", &["lvs"], 0, &lvs(attr, &tags("lv1")), "");
        match how {
            "mount" => w.mounter.add(
                DEV,
                &w.root
                    .join("kubelet/plugins/kubernetes.io/flexvolume/example.com/lvm/mounts/lv1"),
                "ext4",
                false,
            ),
            "holder" => w.devices.2.lock().unwrap().push("dm-9".into()),
            "swap" => w.devices.1.lock().unwrap().push(DEVNUM),
            _ => {}
        }
        let e = w.with_lvm(|c, s| delete(c, s, &pv)).unwrap_err();
        assert!(matches!(e, ProvisionError::Failed(_)), "{e:?}");
        let e = e.to_string();
        assert!(
            e.contains("mounted at") || e.contains("in use"),
            "{how}: {e}"
        );
        assert_eq!(w.runner.count("lvm"), 1, "{how}");
    }
    // A failed deactivation (opened meanwhile) stops before lvremove.
    let w = world();
    w.runner
        .on("lvm", &["lvs"], 0, &lvs("-wi-a-----", &tags("lv1")), "");
    w.runner.on(
        "lvm",
        &["lvchange"],
        5,
        "",
        "Logical volume vg0/lv1 in use.",
    );
    let e = w.with_lvm(|c, s| delete(c, s, &pv)).unwrap_err();
    assert!(matches!(e, ProvisionError::Failed(_)), "{e:?}");
    let e = e.to_string();
    assert!(e.contains("could not be deactivated"), "{e}");
    assert!(!w.lines().iter().any(|l| l.contains("lvremove")));
}

#[test]
fn delete_and_expand_trust_the_pv_name_not_its_annotations() {
    // A PV whose annotations point at another PV's LV: that LV lacks this PV's tag.
    let w = world();
    w.runner.on(
        "lvm",
        &["lvs"],
        0,
        &lvs_json(
            8 << 30,
            &[("pvc-b", "-wi-------", 64 * MI, &tags("pvc-b"), "")],
        ),
        "",
    );
    let pv = pv_of("pvc-a", "vg0", "pvc-b");
    assert!(w.with_lvm(|c, s| delete(c, s, &pv)).is_err());
    assert!(w.with_lvm(|c, s| expand(c, s, &pv, 128 * MI)).is_err());
    assert!(
        !w.lines()
            .iter()
            .any(|l| l.contains("lvremove") || l.contains("lvextend"))
    );
    // Missing or bad annotations.
    let mut bad = pv_of("pvc-a", "vg0", "../x");
    assert!(
        w.with_lvm(|c, s| delete(c, s, &bad))
            .unwrap_err()
            .to_string()
            .contains("volumeID")
    );
    bad.metadata.annotations = None;
    assert!(
        w.with_lvm(|c, s| delete(c, s, &bad))
            .unwrap_err()
            .to_string()
            .contains(ANN_VG)
    );
}

#[test]
fn expand_grows_to_whole_extents_within_the_node_policy() {
    let pv = pv_of(PV, "vg0", PV);
    let row = |size: u64| lvs_json(100 * MI, &[(PV, "-wi-a-----", size, &tags(PV), "")]);
    // Already big enough (the driver's expandfs may have grown it): nothing to do.
    let w = world();
    w.runner.on("lvm", &["lvs"], 0, &row(128 * MI), "");
    assert_eq!(w.with_lvm(|c, s| expand(c, s, &pv, 100 * MI)), Ok(128 * MI));
    assert_eq!(w.lines(), [LVS]);
    // Grows, rounded up: 127 MiB + 1 byte -> 128 MiB.
    let w = world();
    w.runner.on("lvm", &["lvs"], 0, &row(128 * MI), "");
    w.runner.once("lvm", &["lvs"], 0, &row(64 * MI), "");
    assert_eq!(
        w.with_lvm(|c, s| expand(c, s, &pv, 127 * MI + 1)),
        Ok(128 * MI)
    );
    assert_eq!(
        w.lines(),
        [
            LVS,
            &format!("lvm lvextend -y -L 134217728b -- vg0/{PV}"),
            LVS
        ]
    );
    // No room (100 MiB free, 64 more needed, 40 reserved), or past maxVolumeSize: unchanged.
    for cap in [false, true] {
        let mut w = world();
        if cap {
            w.config.lvm.max_volume_size = Some(100 * MI);
        } else {
            w.config.lvm.vg_reserve = 40 * MI;
        }
        w.runner.on("lvm", &["lvs"], 0, &row(64 * MI), "");
        let e = w.with_lvm(|c, s| expand(c, s, &pv, 128 * MI)).unwrap_err();
        assert!(matches!(e, ProvisionError::Failed(_)), "{e:?}");
        let e = e.to_string();
        assert!(
            e.contains(if cap { "maxVolumeSize" } else { "vgReserve" }),
            "{e}"
        );
        assert_eq!(w.lines(), [LVS]);
    }
    // Thin: the pool's ratio, not the VG's free space.
    let w = world();
    w.runner.on(
        "lvm",
        &["lvs"],
        0,
        &lvs_json(
            0,
            &[
                ("pool", "twi-aotz--", 256 * MI, "", ""),
                (PV, "Vwi-a-tz--", 192 * MI, &tags(PV), "pool"),
            ],
        ),
        "",
    );
    let e = w.with_lvm(|c, s| expand(c, s, &pv, 260 * MI)).unwrap_err();
    assert!(matches!(e, ProvisionError::Failed(_)), "{e:?}");
    let e = e.to_string();
    assert!(e.contains("lvm.thinOverprovisionRatio"), "{e}");
    assert_eq!(w.with_lvm(|c, s| expand(c, s, &pv, 256 * MI)), Ok(192 * MI));
    assert!(
        w.lines()
            .iter()
            .any(|l| l.contains("lvextend -y -L 268435456b"))
    );
}

#[test]
fn the_node_config_takes_a_thin_overprovisioning_ratio() {
    let parse = |j: &str| Config::parse(std::path::Path::new("/c.json"), j.as_bytes());
    assert_eq!(parse("{}").unwrap().lvm.thin_overprovision_permille, 1000);
    for (v, permille) in [
        ("2.5", 2500),
        ("1", 1000),
        ("0.1", 100),
        ("100", 100_000),
        ("1.125", 1125),
    ] {
        let c = parse(&format!(r#"{{"lvm":{{"thinOverprovisionRatio":{v}}}}}"#)).unwrap();
        assert_eq!(c.lvm.thin_overprovision_permille, permille, "{v}");
        assert_eq!(policy::show_ratio(permille), v);
    }
    for bad in ["0", "0.05", "101", "-1", "1.0625", "1e3", "\"2\"", "null"] {
        let j = format!(r#"{{"lvm":{{"thinOverprovisionRatio":{bad}}}}}"#);
        let e = parse(&j).unwrap_err().to_string();
        assert!(
            e.contains("thinOverprovisionRatio") || e.contains("invalid type"),
            "{bad}: {e}"
        );
    }
}

#[test]
fn the_backend_declares_what_the_reconciler_needs() {
    let b = LvmProvisioner::new("flexvol");
    assert_eq!(b.kind().name, "lvm");
    assert!(b.kind().node_local && b.kind().node_finishes_resize);
    assert_eq!(b.kind().access_modes, ["ReadWriteOnce"]);
    let mut cfg = Config::default();
    assert!(!b.serves(&cfg, "n"));
    cfg.lvm.allowed_volume_groups = vec!["vg0".into()];
    assert!(b.serves(&cfg, "n"));
    assert!(b.check_class(&params(&[("volumegroup", "vg0")])).is_ok());
    assert!(
        b.check_class(&params(&[("volumegroup", "vg0"), ("x", "y")]))
            .is_err()
    );
}

// Through the LV service's double (an in-memory LVM): what is done, not how it is spelled.

#[test]
fn through_the_lv_service_provision_creates_once_and_reuses() {
    let w = world();
    let lvm = FakeLvs::with_vg("vg0", 1 << 30);
    let p = params(&[("volumegroup", "vg0")]);
    let made = provision_on(&w, Some(&lvm), PV, &p, 101 * MI).unwrap();
    // 101 MiB rounded up to whole 4 MiB extents, tagged in the same create.
    assert_eq!(made.capacity_bytes, 104 * MI);
    assert_eq!(made.location, format!("vg0/{PV}"));
    assert_eq!(
        lvm.calls(),
        [format!("create vg0/{PV} {} {}", 104 * MI, tags(PV))]
    );
    assert_eq!(lvm.vgs.lock().unwrap()["vg0"].free, (1 << 30) - 104 * MI);
    // A second pass (the PV was not written yet) finds the LV and makes nothing.
    let again = provision_on(&w, Some(&lvm), PV, &p, 101 * MI).unwrap();
    assert_eq!(again.capacity_bytes, 104 * MI);
    assert_eq!(lvm.calls().len(), 1);
    // A thin LV is made in its pool and takes no VG space.
    let thin = params(&[("volumegroup", "vg0"), ("thinpool", "pool")]);
    lvm.add("vg0", "pool", "twi-aotz--", 1 << 30, "", "");
    let free = lvm.vgs.lock().unwrap()["vg0"].free;
    provision_on(&w, Some(&lvm), "pvc-thin", &thin, 64 * MI).unwrap();
    assert_eq!(lvm.lv("vg0/pvc-thin").unwrap().pool_lv, "pool");
    assert_eq!(lvm.vgs.lock().unwrap()["vg0"].free, free);
}

#[test]
fn through_the_lv_service_expand_grows_to_whole_extents_once() {
    let w = world();
    let lvm = FakeLvs::with_vg("vg0", 1 << 30);
    lvm.add("vg0", "lv1", "-wi-a-----", 64 * MI, &tags("lv1"), "");
    let pv = pv_of("lv1", "vg0", "lv1");
    assert_eq!(
        on_fake(&w, &lvm, |c, s| expand(c, s, &pv, 101 * MI)),
        Ok(104 * MI)
    );
    assert_eq!(lvm.calls(), [format!("extend vg0/lv1 {}", 104 * MI)]);
    assert_eq!(lvm.lv("vg0/lv1").unwrap().lv_size, 104 * MI);
    // Big enough already (the driver's expandfs may have grown it): nothing to do.
    assert_eq!(
        on_fake(&w, &lvm, |c, s| expand(c, s, &pv, 50 * MI)),
        Ok(104 * MI)
    );
    assert_eq!(lvm.calls().len(), 1);
    // Past the VG's free space: refused, nothing extended.
    let e = on_fake(&w, &lvm, |c, s| expand(c, s, &pv, 2 << 30)).unwrap_err();
    assert!(matches!(e, ProvisionError::Failed(_)), "{e:?}");
    let e = e.to_string();
    assert!(e.contains("vg0"), "{e}");
    assert_eq!(lvm.calls().len(), 1);
}

#[test]
fn through_the_lv_service_delete_deactivates_and_removes_only_ours() {
    let mut w = world();
    // Active, its device node gone: deactivated, then removed.
    w.devices = FakeDevices::absent();
    let lvm = FakeLvs::with_vg("vg0", 1 << 30);
    lvm.add("vg0", "lv1", "-wi-a-----", 64 * MI, &tags("lv1"), "");
    lvm.add("vg0", "lv2", "-wi-------", 64 * MI, TAG_CREATED, "");
    let pv = pv_of("lv1", "vg0", "lv1");
    assert_eq!(
        on_fake(&w, &lvm, |c, s| delete(c, s, &pv)),
        Ok("removed vg0/lv1".to_owned())
    );
    assert_eq!(lvm.calls(), ["deactivate vg0/lv1", "remove vg0/lv1"]);
    assert!(lvm.lv("vg0/lv1").is_none());
    // Gone: success, nothing done.
    assert!(
        on_fake(&w, &lvm, |c, s| delete(c, s, &pv))
            .unwrap()
            .contains("already gone")
    );
    // Not tagged for this PV: left alone.
    let e = on_fake(&w, &lvm, |c, s| delete(c, s, &pv_of("lv2", "vg0", "lv2"))).unwrap_err();
    assert!(matches!(e, ProvisionError::Refused(_)), "{e:?}");
    let e = e.to_string();
    assert!(e.contains("does not carry the tag flexvol.pv.lv2"), "{e}");
    assert_eq!(lvm.calls().len(), 2);
    assert!(lvm.lv("vg0/lv2").is_some());
}

#[test]
fn through_the_lv_service_a_missing_vg_is_matched_by_type() {
    let w = world();
    let lvm = FakeLvs::default();
    let p = params(&[("volumegroup", "vg0")]);
    // Provision: another node may have it.
    match provision_on(&w, Some(&lvm), PV, &p, 64 * MI) {
        Err(Refusal::Reschedule(m)) => {
            assert_eq!(m, "volume group vg0 does not exist on node node-a");
        }
        other => panic!("{other:?}"),
    }
    // Delete and expand: the service's message, unchanged.
    let pv = pv_of("lv1", "vg0", "lv1");
    let want =
        "volume group vg0 not found on this node; create it (vgcreate) or fix options.volumegroup";
    assert_eq!(
        on_fake(&w, &lvm, |c, s| delete(c, s, &pv)),
        Err(want.into())
    );
    assert_eq!(
        on_fake(&w, &lvm, |c, s| expand(c, s, &pv, 64 * MI)),
        Err(want.into())
    );
    assert!(lvm.calls().is_empty());
}

#[test]
fn the_backend_runs_its_lvm_work_through_the_injected_service() {
    let w = world();
    let lvm = FakeLvs::with_vg("vg0", 1 << 30);
    lvm.add("vg0", "lv1", "-wi-------", 64 * MI, &tags("lv1"), "");
    let mut b =
        LvmProvisioner::with_seams("flexvol", Box::new(FakeDevices::absent()), Box::new(lvm));
    let pv = pv_of("lv1", "vg0", "lv1");
    assert_eq!(b.expand(&w.config, &pv, 101 * MI), Ok(104 * MI));
    assert_eq!(b.delete(&w.config, &pv), Ok("removed vg0/lv1".to_owned()));
    assert!(b.delete(&w.config, &pv).unwrap().contains("already gone"));
    // Nothing ran on the node.
    assert!(w.lines().is_empty());
}

/// A clone request for `pv` of the source PV `src` (thin or thick class `p`) through the
/// in-memory LVM.
fn clone_on(
    w: &World,
    lvm: &FakeLvs,
    pv: &str,
    p: &BTreeMap<String, String>,
    size: u64,
    src: &PersistentVolume,
) -> Result<Provisioned, Refusal> {
    let claim = PersistentVolumeClaim::default();
    let modes = vec!["ReadWriteOnce".to_owned()];
    let req = Request {
        pv_name: pv,
        claim: &claim,
        namespace: "ns",
        name: "copy",
        uid: "0c0c",
        class_name: "lvm",
        params: p,
        size_bytes: size,
        access_modes: &modes,
        node: "node-a",
        source: Some(src),
    };
    on_fake(w, lvm, |ctx, s| provision(ctx, s, &req))
}

/// Thin: a snapshot of the source even while it is open (crash-consistent), tagged for the
/// clone's PV only, the source's `flexvol.formatted` kept (never mkfs'd), extended to the
/// request and tagged `flexvol.grow-fs` for the driver; a retry reuses it. Thick: a mounted (open)
/// source or one the driver's records name makes the claim wait, with nothing created; then a
/// new LV of the requested size and a block copy of exactly the source's bytes, both LVs
/// inactive afterwards. A source in another class kind, or not ours, is refused before anything.
#[test]
fn clones_snapshot_a_thin_source_and_copy_a_thick_one_only_when_unused() {
    let w = world();
    let lvm = FakeLvs::with_vg("vg0", 1 << 30);
    lvm.add("vg0", "pool", "twi-aotz--", 512 * MI, "", "");
    let src_tags = format!("{},{TAG_FORMATTED}", tags("pvc-src"));
    lvm.add("vg0", "pvc-src", "Vwi-aotz--", 64 * MI, &src_tags, "pool");
    let thin = params(&[("volumegroup", "vg0"), ("thinpool", "pool")]);
    let src = pv_of("pvc-src", "vg0", "pvc-src");

    let made = clone_on(&w, &lvm, "pvc-c1", &thin, 96 * MI, &src).unwrap();
    assert_eq!(made.capacity_bytes, 96 * MI);
    assert_eq!(
        made.annotations.get(crate::vocab::ANN_CLONED_FROM),
        Some(&"pvc-src (thin snapshot)".to_owned())
    );
    let c1 = lvm.lv("vg0/pvc-c1").unwrap();
    assert_eq!(c1.pool_lv, "pool");
    assert!(c1.has_tag("flexvol.pv.pvc-c1") && c1.has_tag(TAG_CREATED));
    assert!(c1.has_tag(TAG_FORMATTED) && c1.has_tag(TAG_GROW_FS));
    assert!(!c1.has_tag("flexvol.pv.pvc-src"));
    assert_eq!(
        lvm.calls(),
        [
            "snapshot vg0/pvc-src vg0/pvc-c1 flexvol.created,flexvol.pv.pvc-c1,flexvol.formatted,flexvol.grow-fs",
            "extend vg0/pvc-c1 100663296",
        ]
    );
    // Again (a pass killed before the PV): the same LV, nothing new.
    clone_on(&w, &lvm, "pvc-c1", &thin, 96 * MI, &src).unwrap();
    assert_eq!(lvm.calls().len(), 2);
    // An LVM that copied the origin's tags (or a pass killed before removing them): the clone
    // keeps only its own PV's.
    lvm.add(
        "vg0",
        "pvc-c9",
        "Vwi---tz-k",
        64 * MI,
        &format!("{},flexvol.pv.pvc-src", tags("pvc-c9")),
        "pool",
    );
    clone_on(&w, &lvm, "pvc-c9", &thin, 64 * MI, &src).unwrap();
    assert_eq!(lvm.lv("vg0/pvc-c9").unwrap().lv_tags, tags("pvc-c9"));
    assert_eq!(lvm.calls()[2], "deltag vg0/pvc-c9 flexvol.pv.pvc-src");
    // The same size as the source: no extension, no grow tag.
    clone_on(&w, &lvm, "pvc-c2", &thin, 64 * MI, &src).unwrap();
    assert!(!lvm.lv("vg0/pvc-c2").unwrap().has_tag(TAG_GROW_FS));
    // A thin class cannot clone a thick source (the class is the source's, so this is a forged
    // or edited PV): refused, nothing made.
    let thick_src_tags = tags("pvc-tsrc");
    lvm.add(
        "vg0",
        "pvc-tsrc",
        "-wi-ao----",
        64 * MI,
        &thick_src_tags,
        "",
    );
    let tsrc = pv_of("pvc-tsrc", "vg0", "pvc-tsrc");
    let e = clone_on(&w, &lvm, "pvc-c3", &thin, 64 * MI, &tsrc).unwrap_err();
    assert!(
        matches!(&e, Refusal::Fail(m) if m.contains("is a thick LV but this class makes thin (pool) LVs")),
        "{e:?}"
    );
    assert!(lvm.lv("vg0/pvc-c3").is_none());
    // Not ours for that PV: refused.
    let e = clone_on(
        &w,
        &lvm,
        "pvc-c3",
        &thin,
        64 * MI,
        &pv_of("pvc-other", "vg0", "pvc-src"),
    )
    .unwrap_err();
    assert!(
        matches!(&e, Refusal::Fail(m) if m.contains("does not exist on this node with the tags")),
        "{e:?}"
    );

    // Thick, open (mounted by its pod): waits, nothing made.
    let thick = params(&[("volumegroup", "vg0")]);
    let n = lvm.calls().len();
    let e = clone_on(&w, &lvm, "pvc-k1", &thick, 64 * MI, &tsrc).unwrap_err();
    assert!(
        matches!(&e, Refusal::Wait(m) if m.starts_with("waiting: its source volume pvc-tsrc is mounted on this node (by the open LV vg0/pvc-tsrc)")),
        "{e:?}"
    );
    assert_eq!(lvm.calls().len(), n);
    // Closed and inactive, but the driver's record names it (kubelet staged it): waits.
    lvm.vgs
        .lock()
        .unwrap()
        .get_mut("vg0")
        .unwrap()
        .lvs
        .retain(|r| r.lv_name != "pvc-tsrc");
    lvm.add(
        "vg0",
        "pvc-tsrc",
        "-wi-------",
        64 * MI,
        &thick_src_tags,
        "",
    );
    // As the LVM driver records it: the LV by its volume group and name (what "in use" looks
    // at), the PV's name beside it (which it does not).
    let rec = crate::node::state::VolumeRecord {
        volume: Some("a-name-kubelet-passed".into()),
        extra: std::collections::BTreeMap::from([
            ("vg".to_owned(), "vg0".to_owned()),
            ("lv".to_owned(), "pvc-tsrc".to_owned()),
        ]),
        ..crate::backend::record(
            crate::backend::Backend::Lvm,
            "mountdevice",
            std::path::Path::new("/k/mounts/pvc-tsrc"),
            "/dev/vg0/pvc-tsrc".into(),
            false,
            None,
        )
    };
    let store = crate::node::state::StateStore::new(&w.config.state_dir, "lvm");
    store.save(&rec).unwrap();
    let e = clone_on(&w, &lvm, "pvc-k1", &thick, 64 * MI, &tsrc).unwrap_err();
    assert!(
        matches!(&e, Refusal::Wait(m) if m.starts_with("waiting: its source volume pvc-tsrc is mounted on this node (by kubelet, at /k/mounts/pvc-tsrc)")),
        "{e:?}"
    );
    assert_eq!(lvm.calls().len(), n);
    store
        .remove(std::path::Path::new("/k/mounts/pvc-tsrc"))
        .unwrap();
    // Unused: a new LV of the request, the source activated for the copy, both deactivated.
    w.devices
        .4
        .lock()
        .unwrap()
        .extend(["/dev/vg0/pvc-tsrc".into(), "/dev/vg0/pvc-k1".into()]);
    // Issue #32, 1: while the blocks are copied, the source is held against the drivers' verbs
    // (they take the same lock): a mountdevice of the source asked then could not start.
    let held = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let (dir, seen) = (w.config.lock_dir(), held.clone());
    *w.devices.5.lock().unwrap() = Some(Box::new(move |_| {
        let key = crate::backend::lock_key(crate::backend::Backend::Lvm, "vg0/pvc-tsrc");
        let got = crate::sys::lock::VolumeLock::acquire(&dir, &key, std::time::Duration::ZERO);
        seen.lock().unwrap().push(got.is_err());
    }));
    let made = clone_on(&w, &lvm, "pvc-k1", &thick, 100 * MI, &tsrc).unwrap();
    assert_eq!(
        *held.lock().unwrap(),
        [true],
        "the source's lock was free during the copy"
    );
    assert_eq!(made.capacity_bytes, 100 * MI);
    assert_eq!(
        lvm.calls()[n..],
        [
            "create vg0/pvc-k1 104857600 flexvol.created,flexvol.pv.pvc-k1,flexvol.grow-fs",
            "activate vg0/pvc-tsrc",
            "deactivate vg0/pvc-tsrc",
            "deactivate vg0/pvc-k1",
        ]
    );
    assert_eq!(
        *w.devices.3.lock().unwrap(),
        ["/dev/vg0/pvc-tsrc /dev/vg0/pvc-k1 67108864"]
    );
    assert_eq!(
        made.annotations.get(crate::vocab::ANN_CLONED_FROM),
        Some(&"pvc-tsrc (block copy)".to_owned())
    );
    // Again (killed before the PV): the copy is made again into the same LV, no second LV.
    clone_on(&w, &lvm, "pvc-k1", &thick, 100 * MI, &tsrc).unwrap();
    assert_eq!(w.devices.3.lock().unwrap().len(), 2);
    assert!(
        !lvm.calls()
            .iter()
            .skip(n + 4)
            .any(|c| c.starts_with("create"))
    );
}

/// A thin pool without room says which kind (a missing pool, one past its ratio), with the
/// messages as before; to the reconciler's expand both are a failed step to retry.
#[test]
fn thin_room_types_a_missing_pool_apart_from_a_full_one() {
    let json = lvs_json(
        0,
        &[
            ("pool", "twi-aotz--", 100 * MI, "", ""),
            ("a", "Vwi-a-tz--", 80 * MI, "", "pool"),
            ("notpool", "-wi-a-----", 100 * MI, "", ""),
        ],
    );
    let (lvs, _) = crate::backend::lvm::report::parse(json.as_bytes()).unwrap();
    let cfg = LvmConfig::default();
    assert_eq!(thin_room(&cfg, &lvs, "vg0", "pool", 20 * MI), Ok(()));
    for missing in ["nopool", "notpool"] {
        let e = thin_room(&cfg, &lvs, "vg0", missing, MI).unwrap_err();
        assert_eq!(e, ThinRoomError::NoPool(format!("vg0/{missing}")));
        assert_eq!(
            e.to_string(),
            format!("thin pool vg0/{missing} does not exist")
        );
    }
    let e = thin_room(&cfg, &lvs, "vg0", "pool", 20 * MI + 1).unwrap_err();
    assert!(matches!(e, ThinRoomError::Full(_)), "{e:?}");
    assert!(
        e.to_string().starts_with(&format!(
            "thin pool vg0/pool ({} bytes) already holds {} bytes",
            100 * MI,
            80 * MI
        )),
        "{e}"
    );
    assert!(matches!(ProvisionError::from(e), ProvisionError::Failed(_)));
}

/// A PV name that cannot be a tag is a malformed PV: its delete or resize is refused, never
/// retried as a failed step.
#[test]
fn a_pv_name_that_cannot_be_a_tag_is_refused() {
    assert_eq!(pv_tag("pvc-1.a"), Ok(format!("{TAG_PV_PREFIX}pvc-1.a")));
    for bad in ["", "pvc_1", "pvc 1", "pvc/1"] {
        let e = pv_tag(bad).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!("PV name {bad:?} cannot be an LVM tag (expected a Kubernetes object name)")
        );
        assert!(
            matches!(ProvisionError::from(e), ProvisionError::Refused(_)),
            "{bad:?}"
        );
    }
    assert!(pv_tag(&"a".repeat(254)).is_err());
}
