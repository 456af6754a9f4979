//! Guest tier for the LVM provisioner backend (`flexvol::provision::storage::lvm`): its calls as the
//! reconcile loop makes them, in this process, as root, against real LVM in the test VM; the
//! volumes it makes are then used through the real driver binary with kubelet's call sequence.
//! The API-server side (claims, PVs, events) is proven by the cluster tier's `lvm-*` scenarios of
//! `tests/cluster/provisioner-e2e`.

use crate::guest_lvm::{Vg, Vol, allowed_env, fs_size, s};
use crate::util::Env;
use crate::util::run;
use flexvol::node::config::Config;
use flexvol::provision::storage::lvm::LvmProvisioner;
use flexvol::provision::storage::{Provisioned, Provisioner, Refusal, Request};
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde_json::json;
use std::collections::BTreeMap;

const MI: u64 = 1 << 20;

fn config(env: &Env) -> Config {
    Config::parse(&env.config, &std::fs::read(&env.config).unwrap()).unwrap()
}

fn params(kv: &[(&str, &str)]) -> BTreeMap<String, String> {
    kv.iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

fn provision(
    b: &mut LvmProvisioner,
    cfg: &Config,
    pv: &str,
    p: &BTreeMap<String, String>,
    size: u64,
) -> Result<Provisioned, Refusal> {
    let claim = PersistentVolumeClaim::default();
    let modes = vec!["ReadWriteOnce".to_owned()];
    b.provision(
        cfg,
        &Request {
            pv_name: pv,
            claim: &claim,
            namespace: "ns",
            name: "data",
            uid: pv.trim_start_matches("pvc-"),
            class_name: "lvm",
            params: p,
            size_bytes: size,
            access_modes: &modes,
            node: "node-a",
            source: None,
        },
    )
}

/// The PV the reconciler writes: the backend's annotations on it.
fn pv_object(name: &str, p: &Provisioned) -> PersistentVolume {
    PersistentVolume {
        metadata: ObjectMeta {
            name: Some(name.into()),
            annotations: Some(p.annotations.clone()),
            ..ObjectMeta::default()
        },
        ..PersistentVolume::default()
    }
}

fn lv_field(vg: &Vg, lv: &str, field: &str) -> String {
    run(
        "lvm",
        &[
            "lvs",
            "--noheadings",
            "--units",
            "b",
            "--nosuffix",
            "-o",
            field,
            &format!("{}/{lv}", vg.name),
        ],
    )
    .trim()
    .to_owned()
}

#[test]
#[ignore = "guest tier: needs real device-mapper; run inside the test VM"]
fn guest_lvmprov_provision_use_grow_delete() {
    let vg = Vg::new(512);
    let env = allowed_env(&vg);
    let cfg = config(&env);
    let mut b = LvmProvisioner::new("flexvol");
    let pv = "pvc-5f0c2a9e-1d2b-4c3d-8e4f-000000000001";
    let p = params(&[
        ("volumegroup", &vg.name),
        ("fsType", "ext4"),
        ("mkfsOptions", "-m 0"),
    ]);

    // 65 MiB asked: an LV of 68 MiB (4 MiB extents), tagged for the driver and for this PV.
    let made = provision(&mut b, &cfg, pv, &p, 65 * MI).unwrap();
    assert_eq!(made.capacity_bytes, 68 * MI);
    assert_eq!(made.location, format!("{}/{pv}", vg.name));
    assert_eq!(vg.lvs(), [pv]);
    assert_eq!(lv_field(&vg, pv, "lv_size"), (68 * MI).to_string());
    let tags = lv_field(&vg, pv, "lv_tags");
    assert_eq!(tags, format!("flexvol.created,flexvol.pv.{pv}"));
    // Again (a pass after a kill before the PV was written): the same LV, nothing new.
    assert_eq!(provision(&mut b, &cfg, pv, &p, 65 * MI), Ok(made.clone()));
    assert_eq!(vg.lvs(), [pv]);

    // The driver uses exactly this LV from the PV's options, formats it (blank: -Zy -Wy).
    let mut v = Vol::new(&env, &vg, pv, json!({}));
    let mut opts = made.options.clone();
    opts.insert("kubernetes.io/pvOrVolumeName".into(), pv.into());
    opts.insert("kubernetes.io/readwrite".into(), "rw".into());
    // kubelet sends the PV's flexVolume.fsType as this key.
    opts.insert(
        "kubernetes.io/fsType".into(),
        made.fs_type.clone().unwrap_or_default(),
    );
    v.j = serde_json::to_string(&opts).unwrap();
    let pod = v.setup("uid-a");
    std::fs::write(pod.join("hello"), b"world").unwrap();
    assert_eq!(
        run("blkid", &["-p", "-o", "value", "-s", "TYPE", &v.dev]).trim(),
        "ext4"
    );
    assert_eq!(vg.lvs(), [pv]);
    assert!(lv_field(&vg, pv, "lv_tags").contains("flexvol.formatted"));
    assert!(made.options["capabilityToken"].starts_with("v2."));

    // #20: an inline volume naming this LV, even named like its PV, carries no token: the real
    // driver refuses every node verb that would expose it, and nothing reaches the pod.
    let mut inline = opts.clone();
    inline.remove("capabilityToken");
    let mut evil = inline.clone();
    evil.insert("kubernetes.io/pod.namespace".into(), "team-evil".into());
    let (inline, evil) = (
        serde_json::to_string(&inline).unwrap(),
        serde_json::to_string(&evil).unwrap(),
    );
    v.call(&["waitforattach", &v.dev, &inline])
        .failed("served only to the PV");
    let evil_pod = v.pod("uid-evil");
    std::fs::create_dir_all(&evil_pod).unwrap();
    v.call(&["mount", s(&evil_pod), &evil])
        .failed("served only to the PV");
    assert!(!crate::guest_lvm::is_mount_point(&evil_pod));
    v.call(&[
        "expandfs",
        &inline,
        &v.dev,
        s(&pod),
        "134217728",
        "71303168",
    ])
    .failed("served only to the PV");
    assert_eq!(lv_field(&vg, pv, "lv_size"), (68 * MI).to_string());
    // A token for another PV, presented under that PV's name: refused too.
    let mut other = opts.clone();
    other.insert("kubernetes.io/pvOrVolumeName".into(), "pvc-other".into());
    v.call(&[
        "waitforattach",
        &v.dev,
        &serde_json::to_string(&other).unwrap(),
    ])
    .failed("served only to the PV");
    std::fs::remove_dir(&evil_pod).unwrap();

    // Delete while kubelet has it mounted: refused, the LV stays.
    let obj = pv_object(pv, &made);
    let e = b.delete(&cfg, &obj).unwrap_err().to_string();
    assert!(e.contains("still mounted"), "{e}");
    assert_eq!(vg.lvs(), [pv]);

    // Resize to 128 MiB: the LV grows (repeating is Ok); kubelet's expandfs then finds the LV
    // big enough and grows the mounted filesystem.
    let before = fs_size(&pod);
    assert_eq!(b.expand(&cfg, &obj, 127 * MI + 1), Ok(128 * MI));
    assert_eq!(b.expand(&cfg, &obj, 128 * MI), Ok(128 * MI));
    assert_eq!(lv_field(&vg, pv, "lv_size"), (128 * MI).to_string());
    v.call(&["expandfs", &v.j, &v.dev, s(&pod), "134217728", "71303168"])
        .ok();
    let after = fs_size(&pod);
    assert!(after > before + 50 * MI, "{before} -> {after}");
    assert_eq!(std::fs::read(pod.join("hello")).unwrap(), b"world");
    // Past the VG's room: an error, nothing changes.
    let e = b.expand(&cfg, &obj, 4 << 30).unwrap_err().to_string();
    assert!(e.contains("needs"), "{e}");
    assert_eq!(lv_field(&vg, pv, "lv_size"), (128 * MI).to_string());

    // Unused again (kubelet's teardown deactivates it): removed; then "already gone".
    v.teardown("uid-a");
    assert_eq!(
        b.delete(&cfg, &obj).unwrap(),
        format!("removed {}/{pv}", vg.name)
    );
    assert!(vg.lvs().is_empty());
    assert!(b.delete(&cfg, &obj).unwrap().contains("already gone"));
}

#[test]
#[ignore = "guest tier: needs real device-mapper; run inside the test VM"]
fn guest_lvmprov_refusals_and_lvs_that_are_not_ours() {
    let vg = Vg::new(256);
    let env = Env::with_config(json!({"lvm": {
        "allowedVolumeGroups": [vg.name, "fvtnosuchvg"],
        "vgReserve": "64Mi",
    }}));
    let mut cfg = config(&env);
    let mut b = LvmProvisioner::new("flexvol");
    let p = params(&[("volumegroup", &vg.name)]);

    // An LV with the PV's name that flexvol did not make for it: never used, never removed.
    run(
        "lvm",
        &["lvcreate", "-y", "-L", "8m", "-n", "pvc-foreign", &vg.name],
    );
    run(
        "lvm",
        &[
            "lvcreate",
            "-y",
            "-L",
            "8m",
            "--addtag",
            "flexvol.created",
            "--addtag",
            "flexvol.pv.pvc-other",
            "-n",
            "pvc-mine",
            &vg.name,
        ],
    );
    for lv in ["pvc-foreign", "pvc-mine"] {
        match provision(&mut b, &cfg, lv, &p, 8 * MI) {
            Err(Refusal::Fail(m)) => assert!(m.contains("leaves it alone"), "{m}"),
            other => panic!("{lv}: {other:?}"),
        }
        let fake = Provisioned {
            annotations: BTreeMap::from([
                ("flexvol/lvm-volumegroup".to_owned(), vg.name.clone()),
                ("flexvol/lvm-lv".to_owned(), lv.to_owned()),
            ]),
            ..Provisioned::default()
        };
        let e = b
            .delete(&cfg, &pv_object(lv, &fake))
            .unwrap_err()
            .to_string();
        assert!(e.contains("does not carry the tag"), "{e}");
        assert!(b.expand(&cfg, &pv_object(lv, &fake), 16 * MI).is_err());
        assert_eq!(lv_field(&vg, lv, "lv_size"), (8 * MI).to_string());
    }
    let before = vg.lvs();

    let resched = |r: Result<Provisioned, Refusal>, needle: &str| match r {
        Err(Refusal::Reschedule(m)) => assert!(m.contains(needle), "{needle}: {m}"),
        other => panic!("{needle}: {other:?}"),
    };
    // No room: ~252 MiB VG, 16 MiB used, 64 MiB reserved -> 200 MiB does not fit.
    resched(
        provision(&mut b, &cfg, "pvc-big", &p, 200 * MI),
        "lvm.vgReserve",
    );
    // No such VG on this node (granted by the config, absent from LVM).
    resched(
        provision(
            &mut b,
            &cfg,
            "pvc-novg",
            &params(&[("volumegroup", "fvtnosuchvg")]),
            8 * MI,
        ),
        "does not exist on node",
    );
    // Thin: a 32 MiB pool; at ratio 1, 24 MiB fits and 12 MiB more does not; at 2, it does.
    run(
        "lvm",
        &[
            "lvcreate",
            "-y",
            "--type",
            "thin-pool",
            "-L",
            "32m",
            "-n",
            "pool",
            &vg.name,
        ],
    );
    let thin = params(&[("volumegroup", &vg.name), ("thinpool", "pool")]);
    let t1 = provision(&mut b, &cfg, "pvc-thin1", &thin, 24 * MI).unwrap();
    assert_eq!(t1.capacity_bytes, 24 * MI);
    assert!(lv_field(&vg, "pvc-thin1", "lv_attr").starts_with('V'));
    resched(
        provision(&mut b, &cfg, "pvc-thin2", &thin, 12 * MI),
        "lvm.thinOverprovisionRatio",
    );
    cfg.lvm.thin_overprovision_permille = 2000;
    provision(&mut b, &cfg, "pvc-thin2", &thin, 12 * MI).unwrap();
    // Growing a thin LV counts against the same limit: 64 MiB of 2 x 32 MiB.
    let obj = pv_object("pvc-thin1", &t1);
    assert!(
        b.expand(&cfg, &obj, 60 * MI)
            .unwrap_err()
            .to_string()
            .contains("thinOverprovisionRatio")
    );
    assert_eq!(b.expand(&cfg, &obj, 52 * MI), Ok(52 * MI));
    // Not granted by this node's config at all.
    cfg.lvm.allowed_volume_groups.clear();
    resched(
        provision(&mut b, &cfg, "pvc-denied", &p, 8 * MI),
        "lvm.allowedVolumeGroups",
    );
    assert!(!b.serves(&cfg, "node-a"));

    let mut now = vg.lvs();
    now.retain(|l| !["pool", "pvc-thin1", "pvc-thin2"].contains(&l.as_str()));
    assert_eq!(now, before, "nothing else was created or removed");
    assert_eq!(lv_field(&vg, "pvc-foreign", "lv_tags"), "");
}
