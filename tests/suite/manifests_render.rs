//! Issue #33, 8: every kustomization flexvol ships, rendered by kubectl 1.20.2's own kustomize
//! (v2.0.3: what the tests' clusters run; no `components:`), as a user applies it: the node agent
//! (drivers/deploy), the examples, each overlay (drivers/deploy-overlays) and the node cleanup
//! (drivers/deploy/uninstall). Needs the kubectl that `tests/kubelet/setup` builds and caches; a
//! missing one fails (it never skips).

use crate::manifests::to_json;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use yaml_rust2::{Yaml, YamlLoader};

const PLACEHOLDER: &str = "registry.example.com/flexvol:0.1.0";

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// kubectl 1.20.2: `$FLEXVOL_KUBECTL`, else the newest `kubelet-*/bin/kubectl` of the cache
/// tests/kubelet/setup fills (`$FLEXVOL_CACHE`, default /var/tmp/flexvol-cache).
fn kubectl() -> PathBuf {
    if let Some(k) = std::env::var_os("FLEXVOL_KUBECTL") {
        return PathBuf::from(k);
    }
    let cache = std::env::var_os("FLEXVOL_CACHE")
        .map_or_else(|| PathBuf::from("/var/tmp/flexvol-cache"), PathBuf::from);
    let mut found: Vec<(std::time::SystemTime, PathBuf)> = std::fs::read_dir(&cache)
        .into_iter()
        .flatten()
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().starts_with("kubelet-"))
        .map(|e| e.path().join("bin/kubectl"))
        .filter(|k| k.is_file())
        .filter_map(|k| Some((std::fs::metadata(&k).ok()?.modified().ok()?, k)))
        .collect();
    found.sort();
    match found.pop() {
        Some((_, k)) => k,
        None => panic!(
            "no cached kubectl 1.20.2 under {}/kubelet-*/bin/kubectl: run `sudo tests/kubelet/setup` \
             (it builds kubectl 1.20.2 into that cache once), or set FLEXVOL_KUBECTL to a kubectl 1.20.2",
            cache.display()
        ),
    }
}

/// Runs kubectl with ARGS, at most 60 s; its stdout, or a panic with its stderr.
fn run_kubectl(args: &[&str]) -> String {
    let k = kubectl();
    let mut child = Command::new(&k)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{}: {e} (tests/kubelet/setup builds it)", k.display()));
    let deadline = Instant::now() + Duration::from_secs(60);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{} {args:?} took more than 60 s", k.display());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{} {args:?}: {}",
        k.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// The objects `kubectl kustomize DIR` gives.
fn render(dir: &Path) -> Vec<Value> {
    let text = run_kubectl(&["kustomize", dir.to_str().unwrap()]);
    YamlLoader::load_from_str(&text)
        .unwrap()
        .iter()
        .filter(|y| !matches!(y, Yaml::Null))
        .map(to_json)
        .collect()
}

/// Every `image` of every container and init container.
fn images(docs: &[Value]) -> Vec<String> {
    let mut out = Vec::new();
    for d in docs {
        let spec = &d["spec"]["template"]["spec"];
        for k in ["containers", "initContainers"] {
            for c in spec[k].as_array().into_iter().flatten() {
                out.push(c["image"].as_str().unwrap_or("<none>").to_owned());
            }
        }
    }
    out
}

fn kinds<'a>(docs: &'a [Value], kind: &str) -> Vec<&'a Value> {
    docs.iter().filter(|d| d["kind"] == kind).collect()
}

fn node_agent(docs: &[Value]) -> &Value {
    let ds: Vec<&Value> = kinds(docs, "DaemonSet")
        .into_iter()
        .filter(|d| d["metadata"]["name"] == "flexvol-node")
        .collect();
    assert_eq!(ds.len(), 1, "one DaemonSet flexvol-node");
    ds[0]
}

/// Linux only, amd64/arm64 only (issue #33, 1).
fn assert_linux_amd64_arm64(ds: &Value, what: &str) {
    let spec = &ds["spec"]["template"]["spec"];
    assert_eq!(
        spec["nodeSelector"]["kubernetes.io/os"], "linux",
        "{what}: no kubernetes.io/os: linux node selector"
    );
    let terms = &spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        ["nodeSelectorTerms"];
    let arch = terms[0]["matchExpressions"]
        .as_array()
        .unwrap_or_else(|| panic!("{what}: no required node affinity"))
        .iter()
        .find(|e| e["key"] == "kubernetes.io/arch")
        .unwrap_or_else(|| panic!("{what}: no kubernetes.io/arch affinity"));
    assert_eq!(arch["operator"], "In", "{what}");
    assert_eq!(
        arch["values"],
        serde_json::json!(["amd64", "arm64"]),
        "{what}"
    );
}

/// Whether the node agent's provisioner publishes capacity.
fn publishes(docs: &[Value]) -> bool {
    let spec = &node_agent(docs)["spec"]["template"]["spec"];
    let c = spec["containers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "provisioner")
        .expect("provisioner container");
    c["command"]
        .as_array()
        .unwrap()
        .iter()
        .any(|a| a == "--publish-capacity")
}

/// Every directory under drivers/ with a kustomization.yaml, relative to the repository.
fn kustomizations() -> Vec<String> {
    fn walk(d: &Path, out: &mut Vec<PathBuf>) {
        for e in std::fs::read_dir(d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                walk(&p, out);
            } else if p.file_name().is_some_and(|n| n == "kustomization.yaml") {
                out.push(p.parent().unwrap().to_owned());
            }
        }
    }
    let mut v = Vec::new();
    walk(&repo().join("drivers"), &mut v);
    let mut v: Vec<String> = v
        .iter()
        .map(|p| p.strip_prefix(repo()).unwrap().display().to_string())
        .collect();
    v.sort();
    v
}

#[test]
fn contract_manifests_render_every_kustomization_with_kubectl_1_20() {
    let version = run_kubectl(&["version", "--client", "--short"]);
    assert!(
        version.contains("v1.20.2"),
        "{}: {version}",
        kubectl().display()
    );
    assert_eq!(
        kustomizations(),
        [
            "drivers/deploy",
            "drivers/deploy-overlays/capacity",
            "drivers/deploy-overlays/csi",
            "drivers/deploy-overlays/node-loss",
            "drivers/deploy/examples",
            "drivers/deploy/uninstall",
        ],
        "a kustomization this test does not render"
    );
    let r = |d: &str| render(&repo().join(d));
    let top = r("drivers/deploy");
    let node_loss = r("drivers/deploy-overlays/node-loss");
    let capacity = r("drivers/deploy-overlays/capacity");
    let csi = r("drivers/deploy-overlays/csi");
    let examples = r("drivers/deploy/examples");
    let uninstall = r("drivers/deploy/uninstall");

    for (name, docs) in [
        ("drivers/deploy", &top),
        ("node-loss", &node_loss),
        ("capacity", &capacity),
        ("csi", &csi),
        ("uninstall", &uninstall),
    ] {
        let imgs = images(docs);
        assert!(!imgs.is_empty(), "{name}: no container");
        assert!(
            imgs.iter().all(|i| i == PLACEHOLDER),
            "{name}: an image other than the one placeholder {PLACEHOLDER}: {imgs:?}"
        );
        assert!(
            kinds(docs, "StorageClass").is_empty(),
            "{name} makes a StorageClass: examples belong in drivers/deploy/examples"
        );
    }
    for (name, docs) in [
        ("drivers/deploy", &top),
        ("node-loss", &node_loss),
        ("capacity", &capacity),
        ("csi", &csi),
    ] {
        let ds = node_agent(docs);
        assert_linux_amd64_arm64(ds, name);
        assert_eq!(
            ds["spec"]["template"]["metadata"]["annotations"]["kubectl.kubernetes.io/default-container"],
            "provisioner",
            "{name}"
        );
        assert_eq!(
            ds["metadata"]["labels"]["app.kubernetes.io/component"],
            "node"
        );
        assert_eq!(
            publishes(docs),
            name == "capacity",
            "{name}: --publish-capacity"
        );
    }
    // The controller makes capacity records (and may) only where the extender that reads them
    // is applied too.
    for (name, docs) in [("node-loss", &node_loss), ("capacity", &capacity)] {
        let c = &kinds(docs, "Deployment")[0]["spec"]["template"]["spec"]["containers"][0];
        assert_eq!(
            c["command"]
                .as_array()
                .unwrap()
                .iter()
                .any(|a| a == "--capacity-objects"),
            name == "capacity",
            "{name}: --capacity-objects"
        );
        assert_eq!(
            docs.iter()
                .any(|d| d["kind"] == "Role"
                    && d["metadata"]["name"] == "flexvol-controller-capacity"),
            name == "capacity",
            "{name}: Role flexvol-controller-capacity"
        );
    }
    // Every workload of every overlay stays off Windows nodes.
    for d in capacity
        .iter()
        .filter(|d| ["DaemonSet", "Deployment"].contains(&d["kind"].as_str().unwrap()))
    {
        let spec = &d["spec"]["template"]["spec"];
        let sel_os = &spec["nodeSelector"]["kubernetes.io/os"];
        let aff_os =
            spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
                .to_string()
                .contains("kubernetes.io/os");
        assert!(
            sel_os == "linux" || aff_os,
            "{} {}: no kubernetes.io/os selector",
            d["kind"],
            d["metadata"]["name"]
        );
    }
    // The overlays add exactly their part.
    let names = |docs: &[Value]| -> std::collections::BTreeSet<String> {
        docs.iter()
            .map(|d| {
                format!(
                    "{}/{}",
                    d["kind"].as_str().unwrap(),
                    d["metadata"]["name"].as_str().unwrap()
                )
            })
            .collect()
    };
    assert!(names(&node_loss).is_superset(&names(&top)));
    assert!(names(&node_loss).contains("Deployment/flexvol-controller"));
    assert!(!names(&top).contains("Deployment/flexvol-controller"));
    assert!(names(&capacity).is_superset(&names(&node_loss)));
    assert!(names(&capacity).contains("DaemonSet/flexvol-scheduler-extender"));
    assert!(!names(&node_loss).contains("DaemonSet/flexvol-scheduler-extender"));
    // The CSI overlay: drivers/deploy, its three CSIDrivers and one container per kind in the node
    // agent, which enters the host's mount namespace (hostPID and privileged come from
    // drivers/deploy) and serves the socket kubelet's plugin directory holds.
    assert!(names(&csi).is_superset(&names(&top)));
    assert_eq!(
        names(&csi).difference(&names(&top)).collect::<Vec<_>>(),
        [
            "CSIDriver/hostpath.csi.flexvol.io",
            "CSIDriver/lvm.csi.flexvol.io",
            "CSIDriver/nfs.csi.flexvol.io"
        ]
    );
    for d in kinds(&csi, "CSIDriver") {
        let driver = &d["spec"];
        assert_eq!(driver["attachRequired"], Value::Bool(false));
        assert_eq!(
            driver["podInfoOnMount"],
            Value::Bool(true),
            "the pod's identity comes from kubelet"
        );
        // Inline volumes only where their attributes name a node preset and nothing else: the
        // hostPath plugin's scratch directories.
        let modes = if d["metadata"]["name"] == "hostpath.csi.flexvol.io" {
            serde_json::json!(["Persistent", "Ephemeral"])
        } else {
            serde_json::json!(["Persistent"])
        };
        assert_eq!(
            driver["volumeLifecycleModes"], modes,
            "{}",
            d["metadata"]["name"]
        );
        // Host directories and exports keep their owner; an LV's filesystem is the volume's,
        // and kubelet applies the pod's fsGroup to it (as for the FlexVolume LVM driver).
        let want = if d["metadata"]["name"] == "lvm.csi.flexvol.io" {
            "File"
        } else {
            "None"
        };
        assert_eq!(driver["fsGroupPolicy"], want, "{}", d["metadata"]["name"]);
    }
    let spec = &node_agent(&csi)["spec"]["template"]["spec"];
    assert_eq!(spec["hostPID"], Value::Bool(true));
    for (container, kind, driver) in [
        ("csi-hostpath", "hostpath", "hostpath.csi.flexvol.io"),
        ("csi-nfs", "nfs", "nfs.csi.flexvol.io"),
        ("csi-lvm", "lvm", "lvm.csi.flexvol.io"),
    ] {
        let c = spec["containers"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["name"] == container)
            .unwrap_or_else(|| panic!("container {container}"));
        assert_eq!(c["securityContext"]["privileged"], Value::Bool(true));
        let cmd: Vec<&str> = c["command"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a.as_str().unwrap())
            .collect();
        assert_eq!(cmd[..3], ["/flexvol", "csi", "--host-mount-namespace"]);
        let endpoint = format!("unix:///var/lib/kubelet/plugins/{driver}/csi.sock");
        for pair in [
            ["--endpoint", endpoint.as_str()],
            ["--kubelet-root", "/var/lib/kubelet"],
            ["--driver-name", driver],
            ["--node-name", "$(NODE_NAME)"],
        ] {
            assert!(cmd.windows(2).any(|w| w == pair), "{pair:?} in {cmd:?}");
        }
        // --kind defaults to hostpath.
        let given = cmd
            .windows(2)
            .find(|w| w[0] == "--kind")
            .map_or("hostpath", |w| w[1]);
        assert_eq!(given, kind, "{container}");
    }
    // The examples: three classes and nothing else.
    assert_eq!(examples.len(), 3, "{examples:?}");
    assert_eq!(kinds(&examples, "StorageClass").len(), 3);
    // The node cleanup: dry run first, then the removal, on every Linux node, without a token.
    let ds = kinds(&uninstall, "DaemonSet");
    assert_eq!(ds.len(), 1);
    assert_linux_amd64_arm64(ds[0], "uninstall");
    let spec = &ds[0]["spec"]["template"]["spec"];
    assert_eq!(spec["automountServiceAccountToken"], Value::Bool(false));
    let init = spec["initContainers"].as_array().unwrap();
    let args = |c: &Value| -> Vec<String> {
        c["args"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a.as_str().unwrap().to_owned())
            .collect()
    };
    let first = args(&init[0]);
    let second = args(&init[1]);
    assert!(
        first.contains(&"--uninstall".into()) && first.contains(&"--dry-run".into()),
        "{first:?}"
    );
    assert!(
        second.contains(&"--uninstall".into()) && !second.contains(&"--dry-run".into()),
        "{second:?}"
    );
}

/// The image is set once, in the directory the user applies: changing that directory's `images:`
/// entry changes every container it applies (a copy of drivers/ in a temporary directory).
#[test]
fn contract_manifests_render_image_is_set_once_per_applied_directory() {
    let t = tempfile::tempdir().unwrap();
    copy_tree(&repo().join("drivers"), &t.path().join("drivers"));
    for d in [
        "drivers/deploy",
        "drivers/deploy-overlays/node-loss",
        "drivers/deploy-overlays/capacity",
        "drivers/deploy/uninstall",
    ] {
        let k = t.path().join(d).join("kustomization.yaml");
        let orig = std::fs::read_to_string(&k).unwrap();
        let edited = orig
            .replace(
                "newName: registry.example.com/flexvol",
                "newName: example.org/me/flexvol",
            )
            .replace("newTag: \"0.1.0\"", "newTag: \"9.9.9\"");
        assert_ne!(edited, orig, "{d}: no images: entry to set");
        std::fs::write(&k, edited).unwrap();
        let imgs = images(&render(&t.path().join(d)));
        assert!(
            !imgs.is_empty() && imgs.iter().all(|i| i == "example.org/me/flexvol:9.9.9"),
            "{d}: setting its images: entry left {imgs:?}"
        );
        std::fs::write(&k, orig).unwrap();
    }
}

fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let p = e.path();
        if e.file_type().unwrap().is_dir() {
            copy_tree(&p, &to.join(e.file_name()));
        } else if e.file_type().unwrap().is_file() {
            std::fs::copy(&p, to.join(e.file_name())).unwrap();
        }
    }
}
