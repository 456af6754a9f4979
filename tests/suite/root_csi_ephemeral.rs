//! Root tier: inline ephemeral volumes of `flexvol csi --kind hostpath` (presets of the node
//! config's `hostpath.ephemeral`), called over the plugin's socket as kubelet calls it, with real
//! bind mounts. Each test is a row of docs/security.md's threat table ("Inline ephemeral CSI
//! volumes") and fails if that defence is removed.

use crate::require_root;
use crate::root_csi::{Plugin, call, mount_cap, publish, target};
use crate::util::{Env, hostpath_options, mounts_under, run};
use flexvol::csi::proto::*;
use serde_json::json;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use tonic::Code;

/// The volume id kubelet gives inline volume `name` of pod `uid`: `csi-` and the hex sha256 of
/// the uid followed by the name (kubelet's `makeVolumeHandle`).
pub(crate) fn kid(uid: &str, name: &str) -> String {
    let d = ring::digest::digest(&ring::digest::SHA256, format!("{uid}{name}").as_bytes());
    let hex: String = d.as_ref().iter().map(|b| format!("{b:02x}")).collect();
    format!("csi-{hex}")
}

/// An env whose config has the hostPath allowed root `<root>/data` and the presets `scratch`
/// (64 MiB at `<root>/scratch`, served where the size cannot be enforced) and `strict` (the same
/// size at `<root>/strict`, refused where it cannot be).
fn env() -> Env {
    let env = Env::new();
    let r = env.root();
    env.reconfigure(json!({
        "hostpath": {
            "allowedRoots": [r.join("data")],
            "ephemeral": {
                "scratch": {"root": r.join("scratch"), "size": "64Mi", "allowUnenforced": true},
                "strict": {"root": r.join("strict"), "size": "64Mi"},
            }
        }
    }));
    std::fs::create_dir_all(r.join("data")).unwrap();
    env
}

/// A fresh [`env`], its plugin, and pod `uid`'s inline volume `v` of preset `scratch`, published
/// for namespace `ns`.
fn published(uid: &str, ns: &str) -> (Env, Plugin, String, PathBuf) {
    let env = env();
    let p = Plugin::start_with(&env, &[]);
    let id = kid(uid, "v");
    let t = target(&env, uid, "v");
    publish(&p, eph_req(&t, &id, uid, ns, "scratch", &[])).unwrap();
    (env, p, id, t)
}

fn scratch(env: &Env) -> PathBuf {
    env.root().join("scratch")
}

/// An [`env`] whose `scratch` preset allows `max` volumes per namespace, and for each `(name,
/// size)` of `more` a preset of that size at `<root>/<name>` (served unenforced).
fn capped(max: u32, more: &[(&str, &str)]) -> Env {
    let env = env();
    let r = env.root();
    let mut presets = json!({"scratch": {"root": r.join("scratch"), "size": "64Mi",
        "allowUnenforced": true, "maxPerNamespace": max}});
    for (name, size) in more {
        presets[*name] = json!({"root": r.join(name), "size": size, "allowUnenforced": true});
    }
    env.reconfigure(json!({"hostpath": {"allowedRoots": [r.join("data")], "ephemeral": presets}}));
    env
}

/// Runs `call` on a plugin that kills itself (SIGKILL) at the checkpoint `at`, and waits (at
/// most 10 s) until it has.
pub(crate) fn killed_at(env: &Env, at: &str, call: impl FnOnce(&Plugin)) {
    let mut p = Plugin::start_with_env(env, &[], &[("FLEXVOL_TEST_KILL_AT", at)]);
    call(&p);
    let until = Instant::now() + Duration::from_secs(10);
    while !p.exited() {
        assert!(Instant::now() < until, "{at} was not reached");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// An inline ephemeral publish of `preset` for pod `uid` (namespace `ns`) onto `t`, with the pod
/// info kubelet adds (`podInfoOnMount`) and `extra` attributes as the pod's author wrote them.
pub(crate) fn eph_req(
    t: &Path,
    id: &str,
    uid: &str,
    ns: &str,
    preset: &str,
    extra: &[(&str, &str)],
) -> NodePublishVolumeRequest {
    let mut ctx: std::collections::HashMap<String, String> = [
        ("preset", preset),
        ("csi.storage.k8s.io/ephemeral", "true"),
        ("csi.storage.k8s.io/pod.uid", uid),
        ("csi.storage.k8s.io/pod.namespace", ns),
        ("csi.storage.k8s.io/pod.name", "p"),
        ("csi.storage.k8s.io/serviceAccount.name", "default"),
    ]
    .iter()
    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
    .collect();
    for (k, v) in extra {
        ctx.insert((*k).to_owned(), (*v).to_owned());
    }
    NodePublishVolumeRequest {
        volume_id: id.into(),
        target_path: t.to_string_lossy().into_owned(),
        volume_capability: mount_cap(),
        volume_context: ctx,
        ..Default::default()
    }
}

pub(crate) fn unpublish_id(p: &Plugin, id: &str, t: &Path) -> Result<(), tonic::Status> {
    call::<_, NodeUnpublishVolumeResponse>(
        &p.socket,
        "/csi.v1.Node/NodeUnpublishVolume",
        NodeUnpublishVolumeRequest {
            volume_id: id.into(),
            target_path: t.to_string_lossy().into_owned(),
        },
    )
    .map(|_| ())
}

fn record(env: &Env, id: &str) -> PathBuf {
    scratch(env).join(format!(".flexvol/volumes/{id}.json"))
}

/// A preset's volume is a fresh directory of its own (mode 0777, as an emptyDir), recorded where
/// only root writes, bound onto the target; a retry changes nothing; unpublish unmounts it and
/// removes the directory and its record; a second unpublish is OK. Fails if the directory were
/// kept (a leak per pod) or not recorded.
#[test]
fn root_csi_ephemeral_volume_is_made_bound_and_removed() {
    require_root!();
    let (env, p, id, t) = published("u1", "team-a");
    let kubelet = env.root().join("kubelet");
    let dir = scratch(&env).join(&id);
    let meta = std::fs::metadata(&dir).unwrap();
    assert_eq!(meta.permissions().mode() & 0o7777, 0o777);
    assert_eq!((meta.uid(), meta.gid()), (0, 0));
    let rec: serde_json::Value =
        serde_json::from_slice(&std::fs::read(record(&env, &id)).unwrap()).unwrap();
    assert_eq!(rec["claimUid"], "u1", "{rec}");
    assert_eq!(rec["namespace"], "team-a", "{rec}");
    assert_eq!(mounts_under(&kubelet), vec![t.clone()]);
    std::fs::write(t.join("from-pod"), "x").unwrap();
    assert_eq!(std::fs::read_to_string(dir.join("from-pod")).unwrap(), "x");
    // kubelet's retry: OK, one mount, one directory.
    publish(&p, eph_req(&t, &id, "u1", "team-a", "scratch", &[])).unwrap();
    assert_eq!(mounts_under(&kubelet), vec![t.clone()]);
    // The operator makes the preset strict, then kubelet restarts and publishes again: the
    // volume in use keeps what its first publish set (nothing is walked, nothing undone). Fails
    // if a re-publish set the size up again (it would refuse, and remove the pod's directory).
    let strict = json!({"root": scratch(&env), "size": "64Mi"});
    env.reconfigure(
        json!({"hostpath": {"allowedRoots": [env.root().join("data")],
        "ephemeral": {"scratch": strict}}}),
    );
    publish(&p, eph_req(&t, &id, "u1", "team-a", "scratch", &[])).unwrap();
    assert_eq!(std::fs::read_to_string(dir.join("from-pod")).unwrap(), "x");
    assert_eq!(mounts_under(&kubelet), vec![t.clone()]);
    unpublish_id(&p, &id, &t).unwrap();
    assert!(mounts_under(&kubelet).is_empty());
    assert!(!dir.exists(), "the scratch directory stays after unpublish");
    assert!(!record(&env, &id).exists());
    unpublish_id(&p, &id, &t).unwrap();
}

/// The pod's author writes the attributes: they name a preset and nothing else. A path, a size
/// or any other key, an unknown preset, a volume id that is not kubelet's, pod info that names
/// another pod than the target path, or none at all: refused, no value echoed, nothing made or
/// mounted.
#[test]
fn root_csi_ephemeral_attributes_name_a_preset_only() {
    require_root!();
    let env = env();
    let p = Plugin::start_with(&env, &[]);
    let secretish = "/etc/shadow-s3cr3t";
    let id = kid("u2", "v");
    let t = target(&env, "u2", "v");
    let cases: Vec<(NodePublishVolumeRequest, Code)> = vec![
        (
            eph_req(&t, &id, "u2", "ns", "scratch", &[("path", secretish)]),
            Code::InvalidArgument,
        ),
        (
            eph_req(&t, &id, "u2", "ns", "scratch", &[("size", "1Ti")]),
            Code::InvalidArgument,
        ),
        (
            eph_req(&t, &id, "u2", "ns", secretish, &[]),
            Code::FailedPrecondition,
        ),
        (eph_req(&t, &id, "u2", "ns", "", &[]), Code::InvalidArgument),
        (
            eph_req(&t, "../../etc", "u2", "ns", "scratch", &[]),
            Code::InvalidArgument,
        ),
        (
            eph_req(&t, &id.to_uppercase(), "u2", "ns", "scratch", &[]),
            Code::InvalidArgument,
        ),
        // kubelet's id of another volume of the pod, or of another pod's.
        (
            eph_req(&t, &kid("u2", "w"), "u2", "ns", "scratch", &[]),
            Code::InvalidArgument,
        ),
        (
            eph_req(&t, &kid("u3", "v"), "u2", "ns", "scratch", &[]),
            Code::InvalidArgument,
        ),
        (
            eph_req(&t, &id, "u-other", "ns", "scratch", &[]),
            Code::InvalidArgument,
        ),
        (
            eph_req(&t, &id, "u2", "", "scratch", &[]),
            Code::FailedPrecondition,
        ),
    ];
    for (req, code) in cases {
        let e = publish(&p, req.clone()).unwrap_err();
        assert_eq!(e.code(), code, "{:?}: {e:?}", req.volume_context);
        assert!(!e.message().contains("s3cr3t"), "{}", e.message());
        assert!(env.mounts().is_empty(), "{:?}", env.mounts());
        let made: Vec<_> = std::fs::read_dir(scratch(&env))
            .map(|d| d.filter_map(|e| e.ok()).map(|e| e.file_name()).collect())
            .unwrap_or_default();
        assert!(
            made.iter()
                .all(|n| n.to_string_lossy().starts_with(".flexvol")),
            "{made:?}"
        );
    }
}

/// Every preset root is a provisioning root of the node policy: a static CSI volume, an inline
/// flexVolume (anyone who can create a pod names the path) or a PV naming a pod's scratch
/// directory, or the root itself, is refused and nothing is mounted; the pod's own volume is
/// unaffected. Fails if the preset roots were left out of the policy (the directory would be
/// served to whoever names it).
#[test]
fn root_csi_ephemeral_directories_are_reachable_by_no_other_volume() {
    require_root!();
    let (env, p, id, t) = published("u3", "team-a");
    std::fs::write(t.join("private"), "team-a's").unwrap();
    let dir = scratch(&env).join(&id);
    for path in [dir.clone(), scratch(&env)] {
        // Through CSI, a static volume of that path (a PV author, any namespace).
        let t2 = target(&env, "u4", "static");
        let mut req = eph_req(&t2, "vol-x", "u4", "team-b", "scratch", &[]);
        req.volume_context = [
            ("path".to_owned(), path.to_string_lossy().into_owned()),
            ("type".to_owned(), "Directory".to_owned()),
            (
                "csi.storage.k8s.io/pod.namespace".to_owned(),
                "team-b".to_owned(),
            ),
            (
                "csi.storage.k8s.io/ephemeral".to_owned(),
                "false".to_owned(),
            ),
        ]
        .into();
        let e = publish(&p, req).unwrap_err();
        assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
        // Through the FlexVolume driver, an inline flexVolume of that path.
        let pod = env.pod_dir("u5", "inline");
        env.call(
            "hostpath",
            &[
                "mount",
                pod.to_str().unwrap(),
                &hostpath_options(&path, json!({"kubernetes.io/pod.namespace": "team-b"})),
            ],
        )
        .failed("refused");
    }
    assert_eq!(mounts_under(&env.root().join("kubelet")), vec![t.clone()]);
    // Another inline volume of another pod whose attributes say the same preset gets a
    // directory of its own (its volume id), never this one.
    let id6 = kid("u6", "v");
    let t6 = target(&env, "u6", "v");
    publish(&p, eph_req(&t6, &id6, "u6", "team-b", "scratch", &[])).unwrap();
    assert!(!t6.join("private").exists());
    for (i, tt) in [(&id, &t), (&id6, &t6)] {
        unpublish_id(&p, i, tt).unwrap();
    }
    assert!(env.mounts().is_empty());
}

/// An unpublish names a volume id and a target: the directory goes only when the id is kubelet's
/// for that target's volume and its record names the target path's pod. Pod B's unpublish naming
/// pod A's volume id removes nothing of A's; nor does one whose id matches its own target only
/// because uid and name run together (`ua`+`v` = `u`+`av`: real uids are fixed-length UUIDs, so
/// only the record's pod tells them apart here). Fails with the record's pod not compared.
#[test]
fn root_csi_ephemeral_unpublish_removes_only_the_target_pods_directory() {
    require_root!();
    let (env, p, id, ta) = published("ua", "team-a");
    std::fs::write(ta.join("data"), "a").unwrap();
    let tb = target(&env, "ub", "v");
    unpublish_id(&p, &id, &tb).unwrap();
    let tu = target(&env, "u", "av");
    assert_eq!(kid("u", "av"), id);
    unpublish_id(&p, &id, &tu).unwrap();
    let dir = scratch(&env).join(&id);
    assert_eq!(std::fs::read_to_string(dir.join("data")).unwrap(), "a");
    assert!(record(&env, &id).exists());
    assert_eq!(mounts_under(&env.root().join("kubelet")), vec![ta.clone()]);
    unpublish_id(&p, &id, &ta).unwrap();
    assert!(!dir.exists());
}

/// A pod owns everything in its scratch directory: a symlink it planted to a file outside is
/// removed without being followed (the file stays), and a mount inside stops the removal before
/// anything is deleted. The unpublish still succeeds (the volume is unmounted: failing it would
/// keep the pod Terminating for ever); the directory stays, and once the mount is gone and
/// kubelet has removed the pod's directory, the sweep removes it. Fails if the removal followed
/// the symlink or crossed the mount (the file or the mounted data would be gone), or if the
/// unpublish failed.
#[test]
fn root_csi_ephemeral_removal_follows_no_symlink_and_crosses_no_mount() {
    require_root!();
    let (env, p, id, t) = published("u8", "ns");
    let outside = env.mkdir("data/outside");
    std::fs::write(outside.join("keep"), "host's").unwrap();
    std::os::unix::fs::symlink(&outside, t.join("link-dir")).unwrap();
    std::os::unix::fs::symlink(outside.join("keep"), t.join("link-file")).unwrap();
    std::fs::create_dir(t.join("m")).unwrap();
    let dir = scratch(&env).join(&id);
    run(
        "mount",
        &[
            "--bind",
            outside.to_str().unwrap(),
            dir.join("m").to_str().unwrap(),
        ],
    );
    unpublish_id(&p, &id, &t).unwrap();
    assert!(
        dir.join("link-file").symlink_metadata().is_ok(),
        "nothing was removed"
    );
    assert_eq!(
        std::fs::read_to_string(dir.join("m/keep")).unwrap(),
        "host's"
    );
    run("umount", &[dir.join("m").to_str().unwrap()]);
    std::fs::remove_dir_all(env.root().join("kubelet/pods/u8")).unwrap();
    drop(p);
    let _p = Plugin::start_with(&env, &[]);
    let until = Instant::now() + Duration::from_secs(20);
    while dir.exists() {
        assert!(
            Instant::now() < until,
            "{} not swept in 20 s",
            dir.display()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(
        std::fs::read_to_string(outside.join("keep")).unwrap(),
        "host's"
    );
    assert!(env.mounts().is_empty(), "{:?}", env.mounts());
}

/// A preset's size is its promise: where the root's filesystem cannot enforce it (this test
/// directory has no project quotas), a preset without `allowUnenforced` refuses the volume, and
/// the directory it made is removed; nothing is mounted. Fails if an unenforced size were served
/// silently.
#[test]
fn root_csi_ephemeral_unenforceable_size_is_refused_unless_the_preset_allows_it() {
    require_root!();
    let env = env();
    let p = Plugin::start_with(&env, &[]);
    let id = kid("u9", "v");
    let t = target(&env, "u9", "v");
    let e = publish(&p, eph_req(&t, &id, "u9", "ns", "strict", &[])).unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    assert!(e.message().contains("allowUnenforced"), "{}", e.message());
    assert!(!env.root().join("strict").join(&id).exists());
    assert!(
        !env.root()
            .join("strict/.flexvol/volumes")
            .join(format!("{id}.json"))
            .exists()
    );
    assert!(env.mounts().is_empty());
}

/// Inline volumes are counted by no ResourceQuota. A preset's `maxPerNamespace` bounds how many
/// one namespace holds on the node, and no new volume is made where the root has no room for
/// the preset's size: RESOURCE_EXHAUSTED (kubelet retries), nothing made or mounted. Another
/// namespace is unaffected, kubelet's retry of a volume that has its place is not counted
/// against itself, a place an unpublish frees is taken again, and publishes racing for the last
/// place get it once. Fails if either bound were not kept.
#[test]
fn root_csi_ephemeral_a_namespace_gets_its_count_and_a_root_its_room() {
    require_root!();
    let env = capped(2, &[("huge", "1Ei")]);
    let r = env.root();
    let p = Plugin::start_with(&env, &[]);
    let kubelet = r.join("kubelet");
    let vol = |uid: &str, ns: &str, preset: &str| {
        let (id, t) = (kid(uid, "v"), target(&env, uid, "v"));
        (publish(&p, eph_req(&t, &id, uid, ns, preset, &[])), id, t)
    };
    let (a, ida, ta) = vol("a1", "team-a", "scratch");
    a.unwrap();
    vol("a2", "team-a", "scratch").0.unwrap();
    let (c, idc, tc) = vol("a3", "team-a", "scratch");
    let e = c.unwrap_err();
    assert_eq!(e.code(), Code::ResourceExhausted, "{e:?}");
    assert!(e.message().contains("maxPerNamespace 2"), "{}", e.message());
    assert!(!scratch(&env).join(&idc).exists());
    assert!(!record(&env, &idc).exists());
    assert_eq!(mounts_under(&kubelet).len(), 2);
    // kubelet's retry of a volume that has its place.
    publish(&p, eph_req(&ta, &ida, "a1", "team-a", "scratch", &[])).unwrap();
    // Another namespace has places of its own.
    vol("b1", "team-b", "scratch").0.unwrap();
    // A place freed is taken again.
    unpublish_id(&p, &ida, &ta).unwrap();
    publish(&p, eph_req(&tc, &idc, "a3", "team-a", "scratch", &[])).unwrap();
    assert_eq!(mounts_under(&kubelet).len(), 3);
    // Four pods of a namespace with one place left race for it: one gets it.
    let racers: Vec<_> = (0..4).map(|i| format!("b-race{i}")).collect();
    let won = std::thread::scope(|s| {
        let handles: Vec<_> = racers
            .iter()
            .map(|uid| s.spawn(|| vol(uid, "team-b", "scratch").0))
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap())
            .filter(|res| match res {
                Ok(_) => true,
                Err(e) => {
                    assert!(
                        matches!(e.code(), Code::ResourceExhausted | Code::Aborted),
                        "{e:?}"
                    );
                    false
                }
            })
            .count()
    });
    assert_eq!(won, 1, "the last place was taken {won} times");
    assert_eq!(mounts_under(&kubelet).len(), 4);
    // A root without room for the preset's size makes nothing.
    let (h, idh, th) = vol("h1", "team-b", "huge");
    let e = h.unwrap_err();
    assert_eq!(e.code(), Code::ResourceExhausted, "{e:?}");
    assert!(e.message().contains("bytes free"), "{}", e.message());
    assert!(!r.join("huge").join(&idh).exists());
    assert!(!mounts_under(&kubelet).contains(&th));
}

/// kubelet's retry of a publish killed after the volume's record was written (its directory not
/// yet in place) is not counted against its own place: with `maxPerNamespace: 1` it finishes the
/// volume. Fails if the count took the volume's own record (the pod would be refused until
/// deleted).
#[test]
fn root_csi_ephemeral_a_retry_after_a_kill_is_not_counted_against_itself() {
    require_root!();
    let env = capped(1, &[]);
    let r = env.root();
    let (id, t) = (kid("k1", "v"), target(&env, "k1", "v"));
    killed_at(&env, "provisioner-after-record", |k| {
        let _ = publish(k, eph_req(&t, &id, "k1", "team-a", "scratch", &[]));
    });
    assert!(record(&env, &id).exists());
    assert!(!scratch(&env).join(&id).exists());
    let p = Plugin::start_with(&env, &[]);
    publish(&p, eph_req(&t, &id, "k1", "team-a", "scratch", &[])).unwrap();
    assert!(scratch(&env).join(&id).is_dir());
    assert_eq!(mounts_under(&r.join("kubelet")), vec![t.clone()]);
    unpublish_id(&p, &id, &t).unwrap();
}

/// A publish whose caller gave up (DEADLINE_EXCEEDED; here it waits on the volume's lock past
/// the verb timeout) makes and binds nothing afterwards: kubelet may have unpublished the target
/// meanwhile, and a late bind would be left behind with its directory. Then the unpublish takes
/// the same lock, so it is never run beside a publish of the volume. Fails if the lock wait
/// outlived the deadline (the publish would go on once the lock is free).
#[test]
fn root_csi_ephemeral_a_publish_past_its_deadline_binds_nothing_later() {
    require_root!();
    let env = env();
    env.reconfigure(json!({"verbTimeoutSeconds": 1, "lockTimeoutSeconds": 10}));
    let p = Plugin::start_with(&env, &[]);
    let (id, t) = (kid("late", "v"), target(&env, "late", "v"));
    let locks = env.root().join("run/locks");
    std::fs::create_dir_all(&locks).unwrap();
    let f = std::fs::File::create(locks.join(format!("ephemeral%3A{id}.lock"))).unwrap();
    let held = nix::fcntl::Flock::lock(f, nix::fcntl::FlockArg::LockExclusive).unwrap();
    let e = publish(&p, eph_req(&t, &id, "late", "ns", "scratch", &[])).unwrap_err();
    assert!(
        matches!(e.code(), Code::DeadlineExceeded | Code::Aborted),
        "{e:?}"
    );
    // The unpublish waits for the volume's lock too (and gives up at its deadline).
    let e = unpublish_id(&p, &id, &t).unwrap_err();
    assert!(
        matches!(e.code(), Code::DeadlineExceeded | Code::Aborted),
        "{e:?}"
    );
    drop(held);
    std::thread::sleep(Duration::from_secs(2));
    assert!(mounts_under(&env.root().join("kubelet")).is_empty());
    assert!(!scratch(&env).join(&id).exists());
    unpublish_id(&p, &id, &t).unwrap();
}

/// GET `path` on 127.0.0.1:`port`: the status code and the body.
fn http_get(port: u16, path: &str) -> (u16, String) {
    use std::io::{Read, Write};
    let mut c = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    write!(
        c,
        "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut text = String::new();
    c.read_to_string(&mut text).unwrap();
    let code = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = text.split("\r\n\r\n").nth(1).unwrap_or("").to_owned();
    (code, body)
}

/// A worker that never returns (a syscall stuck on a dead disk or NFS server; here a publish
/// made to hang inside the backend) turns the plugin's health red: Probe answers
/// FAILED_PRECONDITION and `/healthz` 503, both naming the stuck call, once it has run for twice
/// its deadline — so kubelet's liveness probe restarts the plugin. Before that, and for calls
/// that end, both say live. Fails if the stuck work were not tracked (Probe and /healthz would
/// stay green for ever).
#[test]
fn root_csi_a_stuck_call_turns_the_plugins_health_red() {
    require_root!();
    let env = env();
    env.reconfigure(json!({"verbTimeoutSeconds": 1}));
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr = format!("127.0.0.1:{port}");
    let p = Plugin::start_with_env(
        &env,
        &["--metrics-address", &addr],
        &[("FLEXVOL_TEST_HANG_AT", "ephemeral-after-directory")],
    );
    let probe = || call::<_, ProbeResponse>(&p.socket, "/csi.v1.Identity/Probe", ProbeRequest {});
    let t0 = Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(t0.elapsed() < Duration::from_secs(10), "no /healthz");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(probe().is_ok());
    assert_eq!(http_get(port, "/healthz").0, 200);
    let (id, t) = (kid("stuck", "v"), target(&env, "stuck", "v"));
    let e = publish(&p, eph_req(&t, &id, "stuck", "ns", "scratch", &[])).unwrap_err();
    assert_eq!(e.code(), Code::DeadlineExceeded, "{e:?}");
    let t0 = Instant::now();
    let e = loop {
        match probe() {
            Err(e) => break e,
            Ok(_) => {
                assert!(t0.elapsed() < Duration::from_secs(10), "Probe stays green");
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    };
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    assert!(e.message().contains("NodePublishVolume"), "{}", e.message());
    let (code, body) = http_get(port, "/healthz");
    assert_eq!(code, 503, "{body}");
    assert!(body.contains("stuck: a NodePublishVolume call"), "{body}");
    let (code, body) = http_get(port, "/metrics");
    assert_eq!(code, 200, "{body}");
    assert!(body.contains("flexvol_csi_stuck_work 1"), "{body}");
}

/// Killed (SIGKILL) after the directory is made and again after the bind: kubelet's retry
/// converges on one directory, one record, one mount. Then the plugin is killed, kubelet (here:
/// the test) unmounts the target and removes the pod's directory as it does on a reboot; the
/// restarted plugin's sweep removes the orphaned scratch directory, and leaves the one whose pod
/// is still there. Fails if the sweep were missing (the directory would leak) or ignored a live
/// pod (its data would go).
#[test]
fn root_csi_ephemeral_kill9_converges_and_orphans_are_swept() {
    require_root!();
    let env = env();
    let id = kid("u10", "v");
    let t = target(&env, "u10", "v");
    let kubelet = env.root().join("kubelet");
    for at in ["ephemeral-after-directory", "hostpath-mount-after-bind"] {
        killed_at(&env, at, |p| {
            let _ = publish(p, eph_req(&t, &id, "u10", "ns", "scratch", &[]));
        });
    }
    let mut p = Plugin::start_with(&env, &[]);
    publish(&p, eph_req(&t, &id, "u10", "ns", "scratch", &[])).unwrap();
    assert_eq!(mounts_under(&kubelet), vec![t.clone()]);
    let dirs: Vec<_> = std::fs::read_dir(scratch(&env))
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| !n.starts_with(".flexvol"))
        .collect();
    assert_eq!(dirs, vec![id.clone()]);
    p.kill9();
    drop(p);
    // A live pod's volume beside it, not mounted yet (its publish killed after the directory
    // was made; kubelet will retry): only its pod's directory says it is live.
    let live = kid("u11", "v");
    let tl = target(&env, "u11", "v");
    let mut k = Plugin::start_with_env(
        &env,
        &[],
        &[("FLEXVOL_TEST_KILL_AT", "ephemeral-after-directory")],
    );
    let _ = publish(&k, eph_req(&tl, &live, "u11", "ns", "scratch", &[]));
    while !k.exited() {
        std::thread::sleep(Duration::from_millis(20));
    }
    drop(k);
    assert!(record(&env, &live).exists());
    run("umount", &[t.to_str().unwrap()]);
    std::fs::remove_dir_all(kubelet.join("pods/u10")).unwrap();
    // Another node's volume in the same root (a root on shared storage), its pod not in this
    // kubelet's directory: not this node's to judge.
    let other = kid("u12", "v");
    let to = target(&env, "u12", "v");
    publish(
        &p0_for(&env),
        eph_req(&to, &other, "u12", "ns", "scratch", &[]),
    )
    .unwrap();
    run("umount", &[to.to_str().unwrap()]);
    std::fs::remove_dir_all(kubelet.join("pods/u12")).unwrap();
    let rec_path = record(&env, &other);
    let mut rec: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&rec_path).unwrap()).unwrap();
    rec["node"] = "node-other".into();
    std::fs::write(&rec_path, serde_json::to_vec(&rec).unwrap()).unwrap();
    let p = Plugin::start_with(&env, &[]);
    let until = Instant::now() + Duration::from_secs(20);
    while scratch(&env).join(&id).exists() {
        assert!(
            Instant::now() < until,
            "the orphaned scratch directory was not swept in 20 s"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(!record(&env, &id).exists());
    assert!(
        scratch(&env).join(&live).is_dir() && record(&env, &live).exists(),
        "a live pod's volume was swept"
    );
    assert!(
        scratch(&env).join(&other).is_dir(),
        "another node's volume was swept"
    );
    // kubelet's retry of the live pod's publish finds its directory.
    publish(&p, eph_req(&tl, &live, "u11", "ns", "scratch", &[])).unwrap();
    assert_eq!(mounts_under(&kubelet), vec![tl.clone()]);
    unpublish_id(&p, &live, &tl).unwrap();
    assert!(!scratch(&env).join(&live).exists());
}

/// A plugin started only for one call, killed when dropped.
fn p0_for(env: &Env) -> Plugin {
    Plugin::start_with(env, &[])
}

/// The sweep's evidence is kubelet's pod directories: where the plugin cannot see them (a
/// DaemonSet that does not mount the kubelet root at the path it passes), it judges nothing — it
/// would otherwise take every pod for gone, drop live mount records and empty live volumes.
/// Fails without that guard (the live pod's data would be removed).
#[test]
fn root_csi_ephemeral_sweep_judges_nothing_without_the_pods_directory() {
    require_root!();
    let (env, mut p, id, t) = published("u20", "ns");
    std::fs::write(t.join("data"), "live").unwrap();
    p.kill9();
    drop(p);
    let kubelet = env.root().join("kubelet");
    std::fs::rename(kubelet.join("pods"), kubelet.join("pods.away")).unwrap();
    let _p = Plugin::start_with(&env, &[]);
    let log = env.root().join("csi.log");
    let until = Instant::now() + Duration::from_secs(20);
    while !std::fs::read_to_string(&log)
        .unwrap_or_default()
        .contains("not swept")
    {
        assert!(Instant::now() < until, "the sweep said nothing in 20 s");
        std::thread::sleep(Duration::from_millis(50));
    }
    let dir = scratch(&env).join(&id);
    assert_eq!(std::fs::read_to_string(dir.join("data")).unwrap(), "live");
    assert!(record(&env, &id).exists());
    std::fs::rename(kubelet.join("pods.away"), kubelet.join("pods")).unwrap();
    run("umount", &[t.to_str().unwrap()]);
}

/// A directory this call made gets its size set up whatever the mount records say: a record
/// left from before (the scratch filesystem came back empty after a reboot, the state directory
/// did not) must not make a new directory skip it. Here the preset is strict and this test
/// directory has no quotas, so the publish is refused; fails if the stale record made it skip
/// the size (the volume would be served unenforced).
#[test]
fn root_csi_ephemeral_a_new_directory_always_gets_its_size() {
    require_root!();
    let (env, mut p, id, t) = published("u21", "ns");
    p.kill9();
    drop(p);
    // The scratch filesystem comes back empty; the mount record (stateDir) stays.
    run("umount", &[t.to_str().unwrap()]);
    std::fs::remove_dir_all(scratch(&env).join(&id)).unwrap();
    std::fs::remove_file(record(&env, &id)).unwrap();
    let strict = json!({"root": scratch(&env), "size": "64Mi"});
    env.reconfigure(
        json!({"hostpath": {"allowedRoots": [env.root().join("data")],
        "ephemeral": {"scratch": strict}}}),
    );
    let p = Plugin::start_with(&env, &[]);
    let e = publish(&p, eph_req(&t, &id, "u21", "ns", "scratch", &[])).unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    assert!(e.message().contains("allowUnenforced"), "{}", e.message());
    assert!(mounts_under(&env.root().join("kubelet")).is_empty());
    assert!(!scratch(&env).join(&id).exists());
}
