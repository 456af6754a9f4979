//! Root tier: `flexvol csi` (the CSI node plugin) started on a temporary socket, called over its
//! Unix socket by a tonic client the way kubelet calls it, with real bind mounts.

use crate::require_root;
use crate::util::{Env, binary, mounts_under};
use flexvol::csi::proto::*;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use tonic::Code;

const DRIVER: &str = "hostpath.csi.test.flexvol.io";

/// A running `flexvol csi`, killed (SIGKILL) when dropped.
pub(crate) struct Plugin {
    child: Child,
    pub(crate) socket: PathBuf,
    reg_socket: PathBuf,
}

impl Plugin {
    fn start(env: &Env) -> Self {
        Self::start_with(env, &[])
    }

    /// Started with `args` added to its command line (e.g. `--kind nfs`).
    pub(crate) fn start_with(env: &Env, args: &[&str]) -> Self {
        Self::start_with_env(env, args, &[])
    }

    /// As [`Plugin::start_with`], with `vars` in its environment (e.g. `FLEXVOL_TEST_KILL_AT`).
    pub(crate) fn start_with_env(env: &Env, args: &[&str], vars: &[(&str, &str)]) -> Self {
        let root = env.root();
        // The socket's directory is the plugin's to make (kubelet makes only `plugins/`).
        let sockdir = root.join("csi");
        std::fs::create_dir_all(root.join("kubelet/plugins_registry")).unwrap();
        let socket = sockdir.join("csi.sock");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(root.join("csi.log"))
            .unwrap();
        let child = Command::new(binary())
            .args(["csi", "--endpoint"])
            .arg(format!("unix://{}", socket.display()))
            .args(["--driver-name", DRIVER, "--node-name", "node-t"])
            .arg("--kubelet-root")
            .arg(root.join("kubelet"))
            .args(args)
            .envs(vars.iter().copied())
            .env("FLEXVOL_CONFIG", &env.config)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        let reg_socket = root
            .join("kubelet/plugins_registry")
            .join(format!("{DRIVER}-reg.sock"));
        let p = Plugin {
            child,
            socket,
            reg_socket,
        };
        let until = Instant::now() + Duration::from_secs(20);
        while std::os::unix::net::UnixStream::connect(&p.socket).is_err()
            || std::os::unix::net::UnixStream::connect(&p.reg_socket).is_err()
        {
            assert!(
                Instant::now() < until,
                "flexvol csi did not listen in 20 s: {}",
                std::fs::read_to_string(root.join("csi.log")).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        p
    }

    /// Whether the process has exited (e.g. killed by a checkpoint).
    pub(crate) fn exited(&mut self) -> bool {
        self.child.try_wait().ok().flatten().is_some()
    }

    pub(crate) fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Plugin {
    fn drop(&mut self) {
        self.kill9();
    }
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// A unary call of `route` on the socket at `path`, as kubelet's gRPC client makes it.
pub(crate) fn call<Req, Resp>(
    path: &Path,
    route: &'static str,
    req: Req,
) -> Result<Resp, tonic::Status>
where
    Req: prost::Message + Send + Sync + 'static,
    Resp: prost::Message + Default + Send + Sync + 'static,
{
    crate::csi_client::call_on(&rt(), path, route, req)
}

pub(crate) fn mount_cap() -> Option<VolumeCapability> {
    Some(VolumeCapability {
        block: None,
        mount: Some(MountVolume::default()),
        access_mode: Some(AccessMode { mode: 1 }),
    })
}

fn publish_req(target: &Path, path: &Path, readonly: bool) -> NodePublishVolumeRequest {
    NodePublishVolumeRequest {
        volume_id: "vol-1".into(),
        target_path: target.to_string_lossy().into_owned(),
        volume_capability: mount_cap(),
        readonly,
        volume_context: [
            ("path".to_owned(), path.to_string_lossy().into_owned()),
            ("type".to_owned(), "Directory".to_owned()),
            (
                "csi.storage.k8s.io/pod.namespace".to_owned(),
                "ns".to_owned(),
            ),
            ("csi.storage.k8s.io/pod.name".to_owned(), "p".to_owned()),
        ]
        .into(),
        ..Default::default()
    }
}

pub(crate) fn publish(p: &Plugin, req: NodePublishVolumeRequest) -> Result<(), tonic::Status> {
    call::<_, NodePublishVolumeResponse>(&p.socket, "/csi.v1.Node/NodePublishVolume", req)
        .map(|_| ())
}

pub(crate) fn unpublish(p: &Plugin, target: &Path) -> Result<(), tonic::Status> {
    call::<_, NodeUnpublishVolumeResponse>(
        &p.socket,
        "/csi.v1.Node/NodeUnpublishVolume",
        NodeUnpublishVolumeRequest {
            volume_id: "vol-1".into(),
            target_path: target.to_string_lossy().into_owned(),
        },
    )
    .map(|_| ())
}

/// A CSI target path under the test's kubelet root; kubelet makes its parent, not the target.
pub(crate) fn target(env: &Env, uid: &str, pv: &str) -> PathBuf {
    let parent = env.mkdir(&format!(
        "kubelet/pods/{uid}/volumes/kubernetes.io~csi/{pv}"
    ));
    parent.join("mount")
}

#[test]
fn root_csi_identity_node_info_and_registration() {
    require_root!();
    let env = Env::new();
    let p = Plugin::start(&env);
    for s in [&p.socket, &p.reg_socket] {
        let mode = std::fs::metadata(s).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600, "{} is mode {mode:o}", s.display());
    }
    let info: GetPluginInfoResponse = call(
        &p.socket,
        "/csi.v1.Identity/GetPluginInfo",
        GetPluginInfoRequest {},
    )
    .unwrap();
    assert_eq!(info.name, DRIVER);
    assert!(!info.vendor_version.is_empty());
    let probe: ProbeResponse = call(&p.socket, "/csi.v1.Identity/Probe", ProbeRequest {}).unwrap();
    assert_eq!(probe.ready, Some(BoolValue { value: true }));
    let node: NodeGetInfoResponse =
        call(&p.socket, "/csi.v1.Node/NodeGetInfo", NodeGetInfoRequest {}).unwrap();
    assert_eq!(node.node_id, "node-t");
    // No topology by default: kubelet would label every node the plugin runs on with it, and a
    // placement label the operator owns (flexvol/lvm, ...) must not be set by a DaemonSet.
    assert_eq!(node.accessible_topology, None);
    let caps: GetPluginCapabilitiesResponse = call(
        &p.socket,
        "/csi.v1.Identity/GetPluginCapabilities",
        GetPluginCapabilitiesRequest {},
    )
    .unwrap();
    assert!(caps.capabilities.is_empty(), "{caps:?}");
    let caps: NodeGetCapabilitiesResponse = call(
        &p.socket,
        "/csi.v1.Node/NodeGetCapabilities",
        NodeGetCapabilitiesRequest {},
    )
    .unwrap();
    assert_eq!(
        caps.capabilities,
        [GET_VOLUME_STATS, VOLUME_MOUNT_GROUP]
            .into_iter()
            .map(|r#type| NodeServiceCapability {
                rpc: Some(NodeServiceCapabilityRpc { r#type })
            })
            .collect::<Vec<_>>()
    );
    // Not served: NodeStage (no STAGE_UNSTAGE capability) and the Controller service.
    let e = call::<_, NodeGetInfoResponse>(
        &p.socket,
        "/csi.v1.Node/NodeStageVolume",
        NodeGetInfoRequest {},
    )
    .unwrap_err();
    assert_eq!(e.code(), Code::Unimplemented);
    let e = call::<_, NodeGetInfoResponse>(
        &p.socket,
        "/csi.v1.Controller/CreateVolume",
        NodeGetInfoRequest {},
    )
    .unwrap_err();
    assert_eq!(e.code(), Code::Unimplemented);

    // kubelet's side of registration.
    let reg: PluginInfo = call(
        &p.reg_socket,
        "/pluginregistration.Registration/GetInfo",
        InfoRequest {},
    )
    .unwrap();
    assert_eq!(reg.r#type, "CSIPlugin");
    assert_eq!(reg.name, DRIVER);
    assert_eq!(PathBuf::from(&reg.endpoint), p.socket);
    assert_eq!(reg.supported_versions, vec!["1.0.0".to_owned()]);
    let _: RegistrationStatusResponse = call(
        &p.reg_socket,
        "/pluginregistration.Registration/NotifyRegistrationStatus",
        RegistrationStatus {
            plugin_registered: false,
            error: "test refusal".into(),
        },
    )
    .unwrap();
    // Refused by kubelet: still serving.
    let again: PluginInfo = call(
        &p.reg_socket,
        "/pluginregistration.Registration/GetInfo",
        InfoRequest {},
    )
    .unwrap();
    assert_eq!(again.name, DRIVER);
    let log = std::fs::read_to_string(env.root().join("csi.log")).unwrap();
    assert!(log.contains("test refusal"), "{log}");
}

#[test]
fn root_csi_publish_is_a_bind_idempotent_and_unpublish_is_ok_twice() {
    require_root!();
    let env = Env::new();
    let p = Plugin::start(&env);
    let src = env.mkdir("data");
    std::fs::write(src.join("hello"), "hi").unwrap();
    let t = target(&env, "u1", "pv1");
    let kubelet = env.root().join("kubelet");

    publish(&p, publish_req(&t, &src, false)).unwrap();
    assert_eq!(mounts_under(&kubelet), vec![t.clone()]);
    assert_eq!(std::fs::read_to_string(t.join("hello")).unwrap(), "hi");
    std::fs::write(t.join("from-pod"), "x").unwrap();
    assert_eq!(std::fs::read_to_string(src.join("from-pod")).unwrap(), "x");

    // Again with the same arguments: OK, still one mount.
    publish(&p, publish_req(&t, &src, false)).unwrap();
    assert_eq!(mounts_under(&kubelet), vec![t.clone()]);
    // Again with other arguments: ALREADY_EXISTS, nothing changed.
    let e = publish(&p, publish_req(&t, &src, true)).unwrap_err();
    assert_eq!(e.code(), Code::AlreadyExists, "{e:?}");
    let other = env.mkdir("other");
    let e = publish(&p, publish_req(&t, &other, false)).unwrap_err();
    assert_eq!(e.code(), Code::AlreadyExists, "{e:?}");
    assert_eq!(mounts_under(&kubelet), vec![t.clone()]);

    let stats: NodeGetVolumeStatsResponse = call(
        &p.socket,
        "/csi.v1.Node/NodeGetVolumeStats",
        NodeGetVolumeStatsRequest {
            volume_id: "vol-1".into(),
            volume_path: t.to_string_lossy().into_owned(),
            staging_target_path: String::new(),
        },
    )
    .unwrap();
    assert!(
        stats
            .usage
            .iter()
            .any(|u| u.unit == UNIT_BYTES && u.total > 0),
        "{stats:?}"
    );

    unpublish(&p, &t).unwrap();
    assert!(mounts_under(&kubelet).is_empty());
    // The target directory goes (CSI: the plugin removes what it was given); its parent stays.
    assert!(!t.exists() && t.parent().unwrap().is_dir());
    unpublish(&p, &t).unwrap();
    // Never published at all: OK too (CSI), and nothing created.
    let never = env
        .root()
        .join("kubelet/pods/u9/volumes/kubernetes.io~csi/pv9/mount");
    unpublish(&p, &never).unwrap();
    assert!(!never.exists());
    assert_eq!(std::fs::read_to_string(src.join("from-pod")).unwrap(), "x");

    // Stats of what is not there: NOT_FOUND.
    let e = call::<_, NodeGetVolumeStatsResponse>(
        &p.socket,
        "/csi.v1.Node/NodeGetVolumeStats",
        NodeGetVolumeStatsRequest {
            volume_id: "vol-1".into(),
            volume_path: never.to_string_lossy().into_owned(),
            staging_target_path: String::new(),
        },
    )
    .unwrap_err();
    assert_eq!(e.code(), Code::NotFound);
    // Stats of a path that is no target at all (csi-sanity's "some/path", /etc): NOT_FOUND,
    // nothing opened; no path at all: INVALID_ARGUMENT.
    for (path, code) in [
        ("some/path", Code::NotFound),
        ("/etc", Code::NotFound),
        ("", Code::InvalidArgument),
    ] {
        let e = call::<_, NodeGetVolumeStatsResponse>(
            &p.socket,
            "/csi.v1.Node/NodeGetVolumeStats",
            NodeGetVolumeStatsRequest {
                volume_id: "vol-1".into(),
                volume_path: path.into(),
                staging_target_path: String::new(),
            },
        )
        .unwrap_err();
        assert_eq!(e.code(), code, "{path:?}: {e:?}");
    }
}

#[test]
fn root_csi_refuses_a_path_outside_the_allowed_roots() {
    require_root!();
    let env = Env::new();
    let p = Plugin::start(&env);
    let outside = tempfile::tempdir().unwrap();
    let t = target(&env, "u1", "pv1");
    let e = publish(&p, publish_req(&t, outside.path(), false)).unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    assert!(e.message().contains("allowed"), "{}", e.message());
    assert!(env.mounts().is_empty(), "{:?}", env.mounts());
    assert!(mounts_under(outside.path()).is_empty());
    // The target directory it made for the call is gone again.
    assert!(!t.exists());
    // A key of kubelet's own namespace in the volume context: refused, its value not echoed.
    let mut forged = publish_req(&t, &env.mkdir("data"), false);
    forged.volume_context.insert(
        "kubernetes.io/pod.namespace".into(),
        "forged-ns-value".into(),
    );
    let e = publish(&p, forged).unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(!e.message().contains("forged-ns-value"));
    assert!(env.mounts().is_empty());
}

#[test]
fn root_csi_refuses_a_target_outside_the_kubelet_directory() {
    require_root!();
    let env = Env::new();
    let p = Plugin::start(&env);
    let src = env.mkdir("data");
    // The right shape, under another root than the plugin's --kubelet-root.
    let parent = env.mkdir("elsewhere/pods/u1/volumes/kubernetes.io~csi/pv1");
    let t = parent.join("mount");
    let e = publish(&p, publish_req(&t, &src, false)).unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    assert!(!t.exists());
    // Not a CSI target path, under the right root.
    let flex = env.mkdir("kubelet/pods/u1/volumes/flexvol~hostpath/v");
    let e = publish(&p, publish_req(&flex, &src, false)).unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    let e = unpublish(&p, &t).unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    assert!(env.mounts().is_empty(), "{:?}", env.mounts());
}

#[test]
fn root_csi_unpublish_after_kill9_and_restart() {
    require_root!();
    let env = Env::new();
    let mut p = Plugin::start(&env);
    let src = env.mkdir("data");
    let t = target(&env, "u1", "pv1");
    publish(&p, publish_req(&t, &src, false)).unwrap();
    p.kill9();
    // The sockets are left behind by SIGKILL; the new instance replaces them (nothing listens).
    assert!(p.socket.exists());
    drop(p);
    let p = Plugin::start(&env);
    // kubelet retries the publish after a restart: still OK, still one mount.
    publish(&p, publish_req(&t, &src, false)).unwrap();
    let kubelet = env.root().join("kubelet");
    assert_eq!(mounts_under(&kubelet), vec![t.clone()]);
    unpublish(&p, &t).unwrap();
    assert!(mounts_under(&kubelet).is_empty());
    // Files the pod wrote through the bind are in the source, and a target directory that is
    // not empty (something kubelet or a person put there) is never removed.
    std::fs::create_dir(&t).unwrap();
    std::fs::write(t.join("keep"), "k").unwrap();
    unpublish(&p, &t).unwrap();
    assert_eq!(std::fs::read_to_string(t.join("keep")).unwrap(), "k");
}

#[test]
fn root_csi_second_instance_does_not_take_a_live_socket() {
    require_root!();
    let env = Env::new();
    let p = Plugin::start(&env);
    let out = Command::new(binary())
        .args(["csi", "--endpoint"])
        .arg(format!("unix://{}", p.socket.display()))
        .args([
            "--driver-name",
            DRIVER,
            "--node-name",
            "node-t",
            "--no-registration",
        ])
        .env("FLEXVOL_CONFIG", &env.config)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("in use"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The first one still answers.
    let info: GetPluginInfoResponse = call(
        &p.socket,
        "/csi.v1.Identity/GetPluginInfo",
        GetPluginInfoRequest {},
    )
    .unwrap();
    assert_eq!(info.name, DRIVER);
}

/// SIGTERM: both sockets go (kubelet's plugin watcher sees the registration socket go and
/// deregisters the driver), and the socket's directory too when the plugin made it and it is
/// empty (an uninstall leaves no `plugins/<driver>`); a directory it found is left.
#[test]
fn root_csi_sigterm_removes_its_sockets_and_exits_143() {
    require_root!();
    let env = Env::new();
    let sockdir = env.root().join("csi");
    for found in [true, false] {
        if found {
            std::fs::create_dir_all(&sockdir).unwrap();
        }
        let mut p = Plugin::start(&env);
        let pid = nix::unistd::Pid::from_raw(i32::try_from(p.child.id()).unwrap());
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
        let until = Instant::now() + Duration::from_secs(10);
        let status = loop {
            if let Some(s) = p.child.try_wait().unwrap() {
                break s;
            }
            assert!(
                Instant::now() < until,
                "flexvol csi did not stop on SIGTERM"
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        assert_eq!(status.code(), Some(143));
        assert!(!p.socket.exists() && !p.reg_socket.exists());
        assert_eq!(sockdir.exists(), found, "found the directory: {found}");
        assert!(env.root().join("kubelet/plugins_registry").is_dir());
        if found {
            std::fs::remove_dir(&sockdir).unwrap();
        }
    }
}

/// The capability token flexvol provisioner gives PV `pvc-v` of namespace `team-b` for `vol`
/// (`security_policy::provisioning_env`'s volume), signed with the node key under `env`.
fn pvc_v_token(env: &Env, vol: &Path) -> String {
    use flexvol::node::capability::{Key, Location, node_key_path};
    let key = Key::load_or_create(&node_key_path(&env.state)).unwrap();
    key.sign_for(
        "pvc-v",
        "team-b",
        &Location::HostPath(vol.to_str().unwrap()),
    )
}

/// [`publish_req`] of `vol` onto `t` with the PV's `token` and, as kubelet adds them, the pod's
/// namespace `ns` and (when given) its `csi.storage.k8s.io/ephemeral` pod info.
fn provisioned_req(
    t: &Path,
    vol: &Path,
    readonly: bool,
    token: &str,
    ns: &str,
    ephemeral: Option<&str>,
) -> NodePublishVolumeRequest {
    let mut r = publish_req(t, vol, readonly);
    r.volume_context
        .insert("capabilityToken".into(), token.into());
    r.volume_context
        .insert("csi.storage.k8s.io/pod.namespace".into(), ns.into());
    if let Some(e) = ephemeral {
        r.volume_context
            .insert("csi.storage.k8s.io/ephemeral".into(), e.into());
    }
    r
}

/// A directory flexvol provisioner made, through CSI: served only with its PV's token, to the PV
/// kubelet names in the target path (`.../kubernetes.io~csi/<pv>/mount`) when kubelet's pod info
/// marks the volume persistent, and to a pod of the claim's namespace; anything else is refused
/// with nothing mounted and the target it made removed.
#[test]
fn root_csi_a_provisioned_directory_is_served_only_to_its_pv_and_namespace() {
    require_root!();
    let (env, _root, vol) = crate::security_policy::provisioning_env();
    let token = pvc_v_token(&env, &vol);
    let p = Plugin::start(&env);
    let req = |t: &Path, ns: &str, ephemeral: Option<&str>| {
        provisioned_req(t, &vol, false, &token, ns, ephemeral)
    };
    for (pv, ns, ephemeral) in [
        ("pvc-v", "team-b", None), // no pod info: the name is not known to be the PV's
        ("pvc-copy", "team-b", Some("false")), // a copy of the PV under another name
        ("pvc-v", "team-a", Some("false")), // a pod of another namespace
    ] {
        let t = target(&env, "u1", pv);
        let e = publish(&p, req(&t, ns, ephemeral)).unwrap_err();
        assert_eq!(e.code(), Code::FailedPrecondition, "{pv} {ns}: {e:?}");
        assert!(!e.message().contains(&token[4..]), "{}", e.message());
        assert!(env.mounts().is_empty(), "{:?}", env.mounts());
        assert!(!t.exists(), "the target made is removed again");
    }
    let t = target(&env, "u2", "pvc-v");
    publish(&p, req(&t, "team-b", Some("false"))).unwrap();
    assert_eq!(std::fs::read(t.join("secret")).unwrap(), b"team-b's data");
    unpublish(&p, &t).unwrap();
    assert!(env.mounts().is_empty());
}

/// The pod's fsGroup through CSI (VOLUME_MOUNT_GROUP, what kubelet 1.22+ passes in
/// `volume_mount_group` instead of applying it): a provisioned directory published read-write to
/// its PV gets the group as through the FlexVolume `mount` (group, group-write, set-gid
/// directories); a static hostPath directory, a read-only publish and a refused one keep their
/// ownership; a group that is not a decimal number is refused without being echoed, nothing
/// mounted. Fails if the plugin dropped the group (the provisioned root stays group 0) or applied
/// it to a static directory (its group would become 2345).
#[test]
fn root_csi_volume_mount_group_applies_to_a_provisioned_directory_only() {
    use std::os::unix::fs::MetadataExt;
    require_root!();
    let (env, _root, vol) = crate::security_policy::provisioning_env();
    let token = pvc_v_token(&env, &vol);
    let stat = |p: &Path| {
        let m = std::fs::symlink_metadata(p).unwrap();
        (m.uid(), m.gid(), m.mode() & 0o7777)
    };
    let p = Plugin::start(&env);
    let with_group = |mut r: NodePublishVolumeRequest, group: &str| {
        if let Some(m) = r.volume_capability.as_mut().and_then(|c| c.mount.as_mut()) {
            m.volume_mount_group = group.into();
        }
        r
    };
    let provisioned = |t: &Path, readonly: bool, ns: &str| {
        provisioned_req(t, &vol, readonly, &token, ns, Some("false"))
    };
    let before = stat(&vol);
    assert_eq!(before.1, 0, "the test's volume starts as group 0");

    // Not a number: refused, not echoed, nothing mounted, the target made removed again.
    for bad in [
        "-1",
        "+2345",
        " 2345",
        "2345 ",
        "staff",
        "4294967296",
        "0x10",
        "2345;id",
    ] {
        let t = target(&env, "bad", "pvc-v");
        let e = publish(&p, with_group(provisioned(&t, false, "team-b"), bad)).unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument, "{bad:?}: {e:?}");
        assert!(!e.message().contains(bad.trim()), "{}", e.message());
        assert!(env.mounts().is_empty(), "{:?}", env.mounts());
        assert!(!t.exists());
    }
    // Another namespace's pod: refused before anything is walked.
    let t = target(&env, "other", "pvc-v");
    let e = publish(&p, with_group(provisioned(&t, false, "team-a"), "2345")).unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    // Read-only: published, ownership untouched (as kubelet leaves a read-only volume).
    let t = target(&env, "ro", "pvc-v");
    publish(&p, with_group(provisioned(&t, true, "team-b"), "2345")).unwrap();
    unpublish(&p, &t).unwrap();
    assert_eq!(stat(&vol), before);

    // A static hostPath directory of the node: never regrouped.
    let host = env.mkdir("data/static");
    std::fs::write(host.join("f"), b"x").unwrap();
    let host_before = (stat(&host), stat(&host.join("f")));
    let t = target(&env, "static", "pv-static");
    publish(&p, with_group(publish_req(&t, &host, false), "2345")).unwrap();
    unpublish(&p, &t).unwrap();
    assert_eq!((stat(&host), stat(&host.join("f"))), host_before);

    // The provisioned directory, read-write, to its PV: the group, through the pod's view too.
    let t = target(&env, "rw", "pvc-v");
    publish(&p, with_group(provisioned(&t, false, "team-b"), "2345")).unwrap();
    let (_, gid, mode) = stat(&vol);
    assert_eq!(gid, 2345);
    assert_eq!(mode & 0o2070, 0o2070, "set-gid and group rwx: {mode:o}");
    assert_eq!(stat(&vol.join("secret")).1, 2345);
    assert_eq!(stat(&t).1, 2345, "the pod's view of its volume");
    unpublish(&p, &t).unwrap();
    assert!(env.mounts().is_empty());
}

/// `--topology-key`: NodeGetInfo reports it with "true" and the plugin advertises
/// VOLUME_ACCESSIBILITY_CONSTRAINTS; without it, neither (root_csi_identity_node_info_and_registration).
#[test]
fn root_csi_topology_only_with_a_topology_key() {
    require_root!();
    let env = Env::new();
    let p = Plugin::start_with(&env, &["--topology-key", "csi.example.com/zone-a"]);
    let node: NodeGetInfoResponse =
        call(&p.socket, "/csi.v1.Node/NodeGetInfo", NodeGetInfoRequest {}).unwrap();
    assert_eq!(
        node.accessible_topology.unwrap().segments,
        [("csi.example.com/zone-a".to_owned(), "true".to_owned())].into()
    );
    let caps: GetPluginCapabilitiesResponse = call(
        &p.socket,
        "/csi.v1.Identity/GetPluginCapabilities",
        GetPluginCapabilitiesRequest {},
    )
    .unwrap();
    assert_eq!(caps.capabilities.len(), 1, "{caps:?}");
}

/// csi-sanity (`--kind lvm`): NodeExpandVolume of a path that is neither a target nor a staging
/// path holds no volume of this plugin: NOT_FOUND, as CSI asks, with nothing run and nothing
/// opened; a missing path or volume id is INVALID_ARGUMENT; other kinds do not serve it.
#[test]
fn root_csi_expand_of_a_path_holding_no_volume_is_not_found() {
    require_root!();
    let env = Env::new();
    let p = Plugin::start_with(&env, &["--kind", "lvm"]);
    let expand = |p: &Plugin, id: &str, path: &str| {
        call::<_, NodeExpandVolumeResponse>(
            &p.socket,
            "/csi.v1.Node/NodeExpandVolume",
            NodeExpandVolumeRequest {
                volume_id: id.into(),
                volume_path: path.into(),
                ..Default::default()
            },
        )
        .unwrap_err()
        .code()
    };
    for path in ["some/path", "/etc", "/dev/sda"] {
        assert_eq!(expand(&p, "vg0/lv1", path), Code::NotFound, "{path}");
    }
    assert_eq!(expand(&p, "vg0/lv1", ""), Code::InvalidArgument);
    assert_eq!(expand(&p, "", "some/path"), Code::InvalidArgument);
    drop(p);
    let p = Plugin::start(&env);
    assert_eq!(expand(&p, "v", "some/path"), Code::Unimplemented);
}
