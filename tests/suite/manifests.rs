//! The example manifests in `drivers/` must work as written: valid YAML, the fields the API server
//! requires, names that refer to each other, and driver names, directories and paths that agree
//! with what `flexvol install` creates.

use flexvol::backend::Backend;
use serde_json::Value;
use std::path::{Path, PathBuf};
use yaml_rust2::{Yaml, YamlLoader};

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

pub(crate) fn to_json(y: &Yaml) -> Value {
    match y {
        Yaml::Real(s) => s.parse::<f64>().map(Value::from).unwrap_or(Value::Null),
        Yaml::Integer(i) => Value::from(*i),
        Yaml::String(s) => Value::from(s.as_str()),
        Yaml::Boolean(b) => Value::from(*b),
        Yaml::Array(a) => Value::Array(a.iter().map(to_json).collect()),
        Yaml::Hash(h) => Value::Object(
            h.iter()
                .map(|(k, v)| {
                    let k = match k {
                        Yaml::String(s) => s.clone(),
                        other => panic!("non-string key {other:?}"),
                    };
                    (k, to_json(v))
                })
                .collect(),
        ),
        Yaml::Null => Value::Null,
        other => panic!("unsupported YAML node {other:?}"),
    }
}

/// `flexvol controller`'s manifest, in the node-loss overlay (relative to drivers/deploy, for
/// [`deploy_docs`]): kustomize v2.0.3 loads no resource from outside a kustomization's directory.
pub(crate) const CONTROLLER: &str = "../deploy-overlays/node-loss/controller.yaml";
/// The scheduler extender's manifest, in the capacity overlay (as [`CONTROLLER`]).
pub(crate) const EXTENDER: &str = "../deploy-overlays/capacity/scheduler-extender.yaml";
/// The controller's Role for `--capacity-objects`, in the capacity overlay (as [`CONTROLLER`]).
pub(crate) const CONTROLLER_CAPACITY: &str = "../deploy-overlays/capacity/controller-capacity.yaml";

/// The text of `drivers/deploy/NAME`.
pub(crate) fn deploy_file(name: &str) -> String {
    let p = repo().join("drivers/deploy").join(name);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// The documents of `drivers/deploy/NAME`, as JSON.
pub(crate) fn deploy_docs(name: &str) -> Vec<Value> {
    YamlLoader::load_from_str(&deploy_file(name))
        .unwrap_or_else(|e| panic!("{name}: {e}"))
        .iter()
        .filter(|y| !matches!(y, Yaml::Null))
        .map(to_json)
        .collect()
}

/// The one document of KIND named NAME (fails unless there is exactly one).
pub(crate) fn one<'a>(docs: &'a [Value], kind: &str, name: &str) -> &'a Value {
    let found: Vec<&Value> = docs
        .iter()
        .filter(|d| d["kind"] == kind && d["metadata"]["name"] == name)
        .collect();
    assert_eq!(found.len(), 1, "{kind} {name}");
    found[0]
}

fn yaml_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let p = e.unwrap().path();
        if p.is_dir() {
            yaml_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "yaml" || x == "yml")
            // kustomize's file, not an API object (contract_manifests_kustomization_lists_every_manifest);
            // kube-scheduler's configuration (--config), not an API object either
            && p.file_name().is_some_and(|n| n != "kustomization.yaml" && n != "kube-scheduler-config.yaml")
        {
            out.push(p);
        }
    }
}

/// Every document of every `.yaml` file under `dir` (recursively), with its file.
fn docs(dir: &Path) -> Vec<(PathBuf, Value)> {
    let mut out = Vec::new();
    let mut files = Vec::new();
    yaml_files(dir, &mut files);
    files.sort();
    for f in files {
        let text = std::fs::read_to_string(&f).unwrap();
        let ys = YamlLoader::load_from_str(&text)
            .unwrap_or_else(|e| panic!("{} is not valid YAML: {e}", f.display()));
        for y in ys.iter().filter(|y| !matches!(y, Yaml::Null)) {
            let d = to_json(y);
            for k in ["apiVersion", "kind"] {
                assert!(d[k].is_string(), "{}: no {k}", f.display());
            }
            assert!(
                d["metadata"]["name"].is_string(),
                "{}: no metadata.name",
                f.display()
            );
            out.push((f.clone(), d));
        }
    }
    out
}

/// The node agent's DaemonSet, `flexvol-node` (installer + provisioner; scheduler-extender.yaml and
/// uninstall/ have DaemonSets of their own).
fn installer(docs: &[(PathBuf, Value)]) -> Vec<&Value> {
    of_kind(docs, "DaemonSet")
        .into_iter()
        .filter(|d| d["metadata"]["name"] == "flexvol-node")
        .collect()
}

fn of_kind<'a>(docs: &'a [(PathBuf, Value)], kind: &str) -> Vec<&'a Value> {
    docs.iter()
        .filter(|(_, d)| d["kind"] == kind)
        .map(|(_, d)| d)
        .collect()
}

/// Every (apiGroup, resource, verb) a Role or ClusterRole grants; panics on a wildcard, a
/// `resourceNames` or a `nonResourceURLs` rule (none of our roles may have one). Also used by
/// controller_manifests.rs.
pub(crate) fn granted(role: &Value) -> std::collections::BTreeSet<(String, String, String)> {
    let mut granted = std::collections::BTreeSet::new();
    for rule in role["rules"].as_array().unwrap() {
        assert!(
            rule.get("resourceNames").is_none() && rule.get("nonResourceURLs").is_none(),
            "{rule}"
        );
        for g in rule["apiGroups"].as_array().unwrap() {
            for r in rule["resources"].as_array().unwrap() {
                for v in rule["verbs"].as_array().unwrap() {
                    let t = (
                        g.as_str().unwrap().to_owned(),
                        r.as_str().unwrap().to_owned(),
                        v.as_str().unwrap().to_owned(),
                    );
                    assert!(
                        !t.0.contains('*') && !t.1.contains('*') && !t.2.contains('*'),
                        "a wildcard in {rule}"
                    );
                    granted.insert(t);
                }
            }
        }
    }
    granted
}

/// Every `flexVolume` object anywhere in a document.
fn flex_volumes(v: &Value, out: &mut Vec<Value>) {
    match v {
        Value::Object(m) => {
            for (k, x) in m {
                if k == "flexVolume" {
                    out.push(x.clone());
                } else {
                    flex_volumes(x, out);
                }
            }
        }
        Value::Array(a) => a.iter().for_each(|x| flex_volumes(x, out)),
        _ => {}
    }
}

/// hostpath's examples must exist (this branch owns them); nfs and lvm are checked wherever their
/// own branches have put them.
#[test]
fn contract_manifests_each_backend_has_working_examples() {
    for b in Backend::ALL {
        let dir = repo().join("drivers").join(b.name());
        if b != Backend::HostPath && !dir.exists() {
            continue;
        }
        assert!(
            dir.join("README.md").is_file(),
            "drivers/{}/README.md is missing",
            b.name()
        );
        let docs = docs(&dir);
        let driver = format!("flexvol/{}", b.name());
        let ns = |d: &Value| {
            d["metadata"]["namespace"]
                .as_str()
                .unwrap_or("default")
                .to_owned()
        };

        // Every flexVolume names this directory's driver, with string options only.
        let mut flex = Vec::new();
        for (f, d) in &docs {
            let before = flex.len();
            flex_volumes(d, &mut flex);
            for fv in &flex[before..] {
                assert_eq!(fv["driver"], driver.as_str(), "{}", f.display());
                for (k, v) in fv["options"].as_object().into_iter().flatten() {
                    assert!(
                        v.is_string(),
                        "{}: option {k} must be a quoted string (FlexVolume options are map[string]string), got {v}",
                        f.display()
                    );
                }
                if let Some(s) = fv["secretRef"]["name"].as_str() {
                    let secret = of_kind(&docs, "Secret")
                        .into_iter()
                        .find(|x| x["metadata"]["name"] == s)
                        .unwrap_or_else(|| {
                            panic!("{}: secret {s} is not defined beside it", f.display())
                        });
                    assert_eq!(
                        secret["type"],
                        driver.as_str(),
                        "kubelet only passes secrets whose type is the driver name"
                    );
                    assert_eq!(
                        ns(secret),
                        ns(d),
                        "the secret must be in the pod's namespace"
                    );
                }
            }
        }

        let pvs = of_kind(&docs, "PersistentVolume");
        let pvcs = of_kind(&docs, "PersistentVolumeClaim");
        let pods = of_kind(&docs, "Pod");
        assert!(
            !pvs.is_empty() && !pvcs.is_empty(),
            "drivers/{}: needs a PV and a PVC",
            b.name()
        );
        for pv in &pvs {
            let s = &pv["spec"];
            assert!(s["capacity"]["storage"].is_string(), "{pv}");
            assert!(
                s["accessModes"].as_array().is_some_and(|a| !a.is_empty()),
                "{pv}"
            );
            assert_eq!(s["flexVolume"]["driver"], driver.as_str());
        }
        for pvc in &pvcs {
            let s = &pvc["spec"];
            assert!(s["resources"]["requests"]["storage"].is_string(), "{pvc}");
            assert!(s["accessModes"].as_array().is_some_and(|a| !a.is_empty()));
            // It binds one of the PVs beside it.
            assert!(
                pvs.iter().any(|pv| {
                    pv["spec"]["storageClassName"] == s["storageClassName"]
                        && s["volumeName"]
                            .as_str()
                            .is_none_or(|n| pv["metadata"]["name"] == n)
                }),
                "{pvc} binds no PV in drivers/{}",
                b.name()
            );
        }
        let mut uses_claim = false;
        let mut inline = false;
        for pod in &pods {
            let s = &pod["spec"];
            let containers = s["containers"].as_array().expect("containers");
            assert!(!containers.is_empty());
            let vols = s["volumes"].as_array().expect("volumes");
            for c in containers {
                assert!(c["image"].is_string() && c["name"].is_string(), "{c}");
                for m in c["volumeMounts"].as_array().into_iter().flatten() {
                    assert!(
                        vols.iter().any(|v| v["name"] == m["name"]),
                        "{m} mounts an undefined volume"
                    );
                    assert!(m["mountPath"].as_str().is_some_and(|p| p.starts_with('/')));
                }
            }
            for v in vols {
                if let Some(claim) = v["persistentVolumeClaim"]["claimName"].as_str() {
                    uses_claim = true;
                    assert!(
                        pvcs.iter()
                            .any(|c| c["metadata"]["name"] == claim && ns(c) == ns(pod)),
                        "pod {} uses claim {claim}, which is not defined beside it",
                        pod["metadata"]["name"]
                    );
                }
                inline |= v["flexVolume"].is_object();
            }
        }
        assert!(
            uses_claim,
            "drivers/{}: needs a pod using the claim",
            b.name()
        );
        // Inline attachable volumes share one device path per volume name across pods
        // (docs/protocol.md §7), so the attachable LVM driver may show PVs only.
        if !b.capabilities().attach {
            assert!(
                inline,
                "drivers/{}: needs a pod with an inline flexVolume",
                b.name()
            );
        }
    }
}

#[test]
fn contract_manifests_deploy_matches_flexvol_install() {
    let dir = repo().join("drivers/deploy");
    let docs = docs(&dir);
    let ds = installer(&docs);
    assert_eq!(ds.len(), 1);
    let spec = &ds[0]["spec"]["template"]["spec"];
    assert_eq!(
        ds[0]["spec"]["selector"]["matchLabels"], ds[0]["spec"]["template"]["metadata"]["labels"],
        "the selector must match the pod labels"
    );
    assert!(
        spec["tolerations"]
            .as_array()
            .unwrap()
            .iter()
            .any(|t| t["operator"] == "Exists"),
        "control-plane nodes need the driver too (LVM is attachable)"
    );
    let c = &spec["containers"][0];
    let args: Vec<String> = c["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap().to_owned())
        .collect();
    let arg = |flag: &str| -> String {
        let i = args
            .iter()
            .position(|a| a == flag)
            .unwrap_or_else(|| panic!("no {flag} in {args:?}"));
        args[i + 1].clone()
    };
    assert!(args.contains(&"--sleep".to_owned()));
    // The args parse as `flexvol install` arguments (the image's entrypoint adds `install --binary`).
    let containerfile = std::fs::read_to_string(dir.join("Containerfile")).unwrap();
    let entry = containerfile
        .lines()
        .find_map(|l| l.strip_prefix("ENTRYPOINT "))
        .expect("ENTRYPOINT");
    let entry: Vec<String> = serde_json::from_str(entry).expect("exec-form ENTRYPOINT");
    assert_eq!(entry[1..3], ["install".to_owned(), "--binary".to_owned()]);
    assert!(containerfile.contains(&format!(
        "COPY --from=build /src/target/x86_64-unknown-linux-gnu/release/flexvol {}",
        entry[0]
    )));
    let drivers = arg("--drivers");
    for d in drivers.split(',') {
        assert!(Backend::from_name(d).is_some(), "unknown driver {d}");
    }

    // Mounts: the host plugin dir at --plugin-dir, /etc/flexvol holding --config-dest, the
    // ConfigMap holding --config.
    let mount_of = |container_path: &str| -> &Value {
        let m = c["volumeMounts"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| {
                let mp = m["mountPath"].as_str().unwrap();
                Path::new(container_path).starts_with(mp)
            })
            .unwrap_or_else(|| panic!("nothing mounted at {container_path}"));
        spec["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["name"] == m["name"])
            .unwrap()
    };
    assert_eq!(
        mount_of(&arg("--plugin-dir"))["hostPath"]["path"],
        flexvol::ops::install::DEFAULT_PLUGIN_DIR
    );
    let dest = arg("--config-dest");
    assert!(dest.ends_with("/config.json"));
    assert_eq!(mount_of(&dest)["hostPath"]["path"], "/etc/flexvol");
    let cm_name = mount_of(&arg("--config"))["configMap"]["name"]
        .as_str()
        .unwrap()
        .to_owned();
    let cm = of_kind(&docs, "ConfigMap")
        .into_iter()
        .find(|m| m["metadata"]["name"] == cm_name.as_str())
        .expect("the ConfigMap the DaemonSet mounts");
    assert_eq!(cm["metadata"]["namespace"], ds[0]["metadata"]["namespace"]);
    let file = Path::new(&arg("--config"))
        .file_name()
        .unwrap()
        .to_string_lossy()
        .into_owned();
    let json = cm["data"][file.as_str()]
        .as_str()
        .expect("the config file in the ConfigMap");
    flexvol::node::config::Config::parse(Path::new("configmap.yaml"), json.as_bytes())
        .expect("the example config is valid");

    // kube-controller-manager sees the same plugin directory.
    let kcm = of_kind(&docs, "Pod");
    let kcm = kcm
        .iter()
        .find(|p| p["metadata"]["name"] == "kube-controller-manager")
        .unwrap();
    let flag = format!(
        "--flex-volume-plugin-dir={}",
        flexvol::ops::install::DEFAULT_PLUGIN_DIR
    );
    assert!(
        kcm["spec"]["containers"][0]["command"]
            .as_array()
            .unwrap()
            .iter()
            .any(|a| a == flag.as_str())
    );
    assert_eq!(
        kcm["spec"]["volumes"][0]["hostPath"]["path"],
        flexvol::ops::install::DEFAULT_PLUGIN_DIR
    );
    assert_eq!(
        kcm["spec"]["containers"][0]["volumeMounts"][0]["mountPath"],
        flexvol::ops::install::DEFAULT_PLUGIN_DIR
    );
}

#[test]
fn contract_manifests_validation_catches_a_broken_manifest() {
    // The checks above must be able to fail: an unquoted option and bad YAML are caught.
    let d = tempfile::tempdir().unwrap();
    std::fs::write(
        d.path().join("x.yaml"),
        "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec:\n  volumes:\n  - flexVolume: {driver: flexvol/hostpath, options: {uid: 1000}}\n",
    )
    .unwrap();
    let docs = docs(d.path());
    let mut flex = Vec::new();
    flex_volumes(&docs[0].1, &mut flex);
    assert!(
        flex[0]["options"]["uid"].is_number(),
        "an unquoted number stays a number"
    );
    std::fs::write(d.path().join("y.yaml"), "a: [\n").unwrap();
    assert!(std::panic::catch_unwind(|| docs_of(d.path())).is_err());
}

fn docs_of(p: &Path) -> usize {
    docs(p).len()
}

/// Issue #20, 8: the provisioner's token grants exactly what src/provision/cluster/live.rs calls (no
/// Node write, no claim create/delete, nothing on pods or secrets) and what its leader election
/// needs (two Leases in its namespace), and only the provisioner container holds it.
#[test]
fn contract_manifests_provisioner_token_is_least_privilege() {
    let dir = repo().join("drivers/deploy");
    let docs = docs(&dir);
    // (apiGroup, resource, verb): every call of src/provision/cluster/live.rs, nothing else.
    let needed: std::collections::BTreeSet<(&str, &str, &str)> = [
        ("", "persistentvolumeclaims", "list"), // watch cache
        ("", "persistentvolumeclaims", "watch"),
        ("", "persistentvolumeclaims", "get"), // unselect_node
        ("", "persistentvolumeclaims", "patch"), // unselect_node
        ("", "persistentvolumeclaims/status", "patch"), // finish_claim_resize
        ("", "persistentvolumes", "list"),     // watch cache
        ("", "persistentvolumes", "watch"),
        ("", "persistentvolumes", "get"),             // get_volume
        ("", "persistentvolumes", "create"),          // create_volume
        ("", "persistentvolumes", "delete"),          // delete_volume
        ("", "persistentvolumes", "patch"),           // grow_volume
        ("storage.k8s.io", "storageclasses", "list"), // class watch cache
        ("storage.k8s.io", "storageclasses", "watch"),
        ("", "nodes", "get"),     // get_node
        ("", "events", "create"), // event (src/k8s/events.rs)
    ]
    .into_iter()
    .collect();
    let role = of_kind(&docs, "ClusterRole")
        .into_iter()
        .find(|r| r["metadata"]["name"] == "flexvol-provisioner")
        .expect("ClusterRole flexvol-provisioner");
    let granted = granted(role);
    let needed: std::collections::BTreeSet<(String, String, String)> = needed
        .into_iter()
        .map(|(g, r, v)| (g.to_owned(), r.to_owned(), v.to_owned()))
        .collect();
    assert_eq!(
        granted.difference(&needed).collect::<Vec<_>>(),
        Vec::<&(String, String, String)>::new(),
        "rbac.yaml grants what the code never calls"
    );
    assert_eq!(
        needed.difference(&granted).collect::<Vec<_>>(),
        Vec::<&(String, String, String)>::new(),
        "rbac.yaml lacks what the code calls"
    );
    let binding = of_kind(&docs, "ClusterRoleBinding")
        .into_iter()
        .find(|b| b["roleRef"]["name"] == "flexvol-provisioner")
        .expect("its ClusterRoleBinding");
    let subject = &binding["subjects"][0];
    assert_eq!(binding["subjects"].as_array().unwrap().len(), 1);

    // Leader election (src/k8s/lease.rs): a Role in the DaemonSet's namespace, get/update of
    // exactly the two Leases, create (which RBAC cannot limit by name), nothing else.
    let ns = subject["namespace"].as_str().unwrap();
    let leases = of_kind(&docs, "Role")
        .into_iter()
        .find(|r| r["metadata"]["name"] == "flexvol-provisioner-leases")
        .expect("Role flexvol-provisioner-leases");
    assert_eq!(leases["metadata"]["namespace"], ns);
    let names = [
        flexvol::provision::leadership::CLAIMS_LEASE,
        flexvol::provision::leadership::NFS_LEASE,
    ];
    let expected: Value = serde_json::json!([
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
         "resourceNames": names, "verbs": ["get", "update"]},
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
    ]);
    assert_eq!(leases["rules"], expected);
    let lb = of_kind(&docs, "RoleBinding")
        .into_iter()
        .find(|b| b["roleRef"]["name"] == "flexvol-provisioner-leases")
        .expect("its RoleBinding");
    assert_eq!(lb["metadata"]["namespace"], ns);
    assert_eq!(lb["roleRef"]["kind"], "Role");
    assert_eq!(lb["subjects"], binding["subjects"]);
    // Its only other Role is the capacity record's (below); the provisioner's ServiceAccount is
    // bound to nothing else.
    let bound_to_node: Vec<&Value> = of_kind(&docs, "RoleBinding")
        .into_iter()
        .chain(of_kind(&docs, "ClusterRoleBinding"))
        .filter(|b| {
            b["subjects"]
                .as_array()
                .unwrap()
                .iter()
                .any(|s| s["name"] == subject["name"] && s["namespace"] == subject["namespace"])
        })
        .collect();
    let names: std::collections::BTreeSet<&str> = bound_to_node
        .iter()
        .map(|b| b["roleRef"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "flexvol-provisioner",
            "flexvol-provisioner-leases",
            "flexvol-provisioner-capacity"
        ]
        .into_iter()
        .collect(),
        "the provisioner's ServiceAccount is bound to exactly these roles"
    );

    // The pod gets no token; the provisioner container alone mounts a projected one where
    // kube-rs's in-cluster config reads it.
    let ds = installer(&docs);
    let spec = &ds[0]["spec"]["template"]["spec"];
    assert_eq!(spec["serviceAccountName"], subject["name"]);
    assert_eq!(ds[0]["metadata"]["namespace"], subject["namespace"]);
    assert_eq!(
        spec["automountServiceAccountToken"],
        Value::Bool(false),
        "the installer must get no token"
    );
    let sa_dir = "/var/run/secrets/kubernetes.io/serviceaccount";
    let volume = |name: &Value| -> &Value {
        spec["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["name"] == *name)
            .unwrap()
    };
    let mut holders = Vec::new();
    for c in spec["containers"].as_array().unwrap() {
        for m in c["volumeMounts"].as_array().unwrap() {
            let v = volume(&m["name"]);
            let projected_token = v["projected"]["sources"]
                .as_array()
                .is_some_and(|s| s.iter().any(|x| x.get("serviceAccountToken").is_some()));
            let under_secrets = m["mountPath"]
                .as_str()
                .unwrap()
                .starts_with("/var/run/secrets");
            if projected_token || under_secrets {
                holders.push((c["name"].clone(), m.clone(), v.clone()));
            }
        }
    }
    assert_eq!(holders.len(), 1, "token mounts: {holders:?}");
    let (who, m, v) = &holders[0];
    assert_eq!(who, "provisioner");
    assert_eq!(m["mountPath"], sa_dir);
    assert_eq!(m["readOnly"], Value::Bool(true));
    let sources = v["projected"]["sources"].as_array().unwrap();
    let token = sources
        .iter()
        .find_map(|s| s.get("serviceAccountToken"))
        .expect("a serviceAccountToken source");
    assert_eq!(token["path"], "token");
    assert!(
        token["expirationSeconds"]
            .as_i64()
            .is_some_and(|s| (600..=3600).contains(&s))
    );
    let ca = sources
        .iter()
        .find_map(|s| s.get("configMap"))
        .expect("ca.crt from a ConfigMap");
    assert_eq!(ca["name"], "kube-root-ca.crt");
    assert_eq!(ca["items"][0]["key"], "ca.crt");
    assert_eq!(ca["items"][0]["path"], "ca.crt");
    let ns = sources
        .iter()
        .find_map(|s| s.get("downwardAPI"))
        .expect("the namespace from the downward API");
    assert_eq!(ns["items"][0]["path"], "namespace");
    assert_eq!(
        ns["items"][0]["fieldRef"]["fieldPath"],
        "metadata.namespace"
    );
}

/// The provisioner container's probes reach what it serves: `/healthz` and `/readyz` on the port
/// its `--metrics-address` binds, declared as the container's `metrics` port.
#[test]
fn contract_manifests_provisioner_probes_use_its_metrics_port() {
    #[derive(clap::Parser)]
    struct Cmd {
        #[command(flatten)]
        a: flexvol::provision::ProvisionerArgs,
    }
    let docs = docs(&repo().join("drivers/deploy"));
    let ds = installer(&docs);
    let c = ds[0]["spec"]["template"]["spec"]["containers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "provisioner")
        .expect("the provisioner container");
    let cmd: Vec<String> = c["command"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap().replace("$(NODE_NAME)", "node-a"))
        .collect();
    assert_eq!(cmd[..2], ["/flexvol".to_owned(), "provisioner".to_owned()]);
    let args = <Cmd as clap::Parser>::try_parse_from(&cmd[1..])
        .unwrap_or_else(|e| panic!("{cmd:?}: {e}"))
        .a;
    let port = args.metrics_address.port();
    let ports = c["ports"].as_array().expect("ports");
    let declared = ports
        .iter()
        .find(|p| p["name"] == "metrics")
        .expect("a port named metrics");
    assert_eq!(declared["containerPort"].as_u64(), Some(u64::from(port)));
    assert!(
        args.metrics_address.ip().is_unspecified(),
        "kubelet probes the pod's IP: {}",
        args.metrics_address
    );
    for (probe, path) in [("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")] {
        let get = &c[probe]["httpGet"];
        assert_eq!(get["path"], path, "{probe}");
        assert_eq!(get["port"], "metrics", "{probe}");
        assert!(c[probe]["timeoutSeconds"].as_u64().is_some(), "{probe}");
    }
    let ann = &ds[0]["spec"]["template"]["metadata"]["annotations"];
    assert_eq!(ann["prometheus.io/port"], port.to_string());
}

/// Issue #23, 2: the provisioner container serves LVM, NFS and enforced sizes without a host
/// service: it runs `--host-mount-namespace` (src/sys/hostns.rs), so the pod shares the host's
/// PID namespace (PID 1 is the node's init, whose mount namespace it enters) and the container is
/// privileged (setns, block devices, mount(2): drivers/deploy/README.md section 6); it mounts no
/// host path (it works in the host's namespace) and reads the host's config at its host path.
#[test]
fn contract_manifests_provisioner_runs_in_the_hosts_mount_namespace() {
    #[derive(clap::Parser)]
    struct Cmd {
        #[command(flatten)]
        a: flexvol::provision::ProvisionerArgs,
    }
    let docs = docs(&repo().join("drivers/deploy"));
    let ds = installer(&docs);
    let spec = &ds[0]["spec"]["template"]["spec"];
    assert_eq!(
        spec["hostPID"],
        Value::Bool(true),
        "PID 1 must be the node's init"
    );
    let c = spec["containers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "provisioner")
        .expect("the provisioner container");
    let cmd: Vec<String> = c["command"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap().replace("$(NODE_NAME)", "node-a"))
        .collect();
    let args = <Cmd as clap::Parser>::try_parse_from(&cmd[1..])
        .unwrap_or_else(|e| panic!("{cmd:?}: {e}"))
        .a;
    assert!(args.host_mount_namespace, "{cmd:?}");
    assert!(
        args.kubeconfig.is_none(),
        "the projected token, not a kubeconfig"
    );
    assert_eq!(c["securityContext"]["privileged"], Value::Bool(true));
    assert!(
        c["securityContext"]["allowPrivilegeEscalation"].is_null(),
        "the API server refuses allowPrivilegeEscalation: false with privileged: true"
    );
    let vols = spec["volumes"].as_array().unwrap();
    for m in c["volumeMounts"].as_array().unwrap() {
        let v = vols.iter().find(|v| v["name"] == m["name"]).unwrap();
        assert!(
            v["hostPath"].is_null(),
            "the provisioner mounts host path {v}: it sees the host's paths after the switch"
        );
    }
    let config = c["env"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == "FLEXVOL_CONFIG")
        .map(|e| e["value"].as_str().unwrap().to_owned());
    assert!(
        config
            .as_deref()
            .is_none_or(|p| p == "/etc/flexvol/config.json"),
        "the config the installer writes is the host's /etc/flexvol/config.json: {config:?}"
    );
    // Every hostPath volume of the pod is still used (by the installer).
    for v in vols.iter().filter(|v| v["hostPath"].is_object()) {
        assert!(
            spec["containers"]
                .as_array()
                .unwrap()
                .iter()
                .any(|c| c["volumeMounts"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|m| m["name"] == v["name"])),
            "volume {} is mounted by no container",
            v["name"]
        );
    }
}

/// Issue #23: `kubectl apply -k drivers/deploy` is the documented install. Its kustomization lists
/// every object manifest of the directory (not the kube-controller-manager static-pod snippet, nor
/// the opt-in admission-policy.yaml; issue #33: no StorageClass) and
/// names the DaemonSet's image, the one place a user sets it. (tests/cluster/e2e `manifests`
/// checks with kubectl's own kustomize that `apply -k` gives exactly these objects.)
#[test]
fn contract_manifests_kustomization_lists_every_manifest() {
    let dir = repo().join("drivers/deploy");
    let text = std::fs::read_to_string(dir.join("kustomization.yaml")).unwrap();
    let k = to_json(&YamlLoader::load_from_str(&text).unwrap()[0]);
    assert_eq!(k["kind"], "Kustomization");
    let listed: std::collections::BTreeSet<String> = k["resources"]
        .as_array()
        .expect("resources")
        .iter()
        .map(|r| r.as_str().unwrap().to_owned())
        .collect();
    let mut files = Vec::new();
    yaml_files(&dir, &mut files);
    let want: std::collections::BTreeSet<String> = files
        .iter()
        // This directory's own files: examples/, uninstall/ are kustomizations of their own;
        // monitoring/ (PodMonitors, PrometheusRule) needs the Prometheus Operator's CRDs: opt-in,
        // applied on its own (drivers/deploy/monitoring/README.md).
        .filter(|f| f.parent() == Some(dir.as_path()))
        .map(|f| f.file_name().unwrap().to_str().unwrap().to_owned())
        // The static-pod snippet is not an object; admission-policy.yaml is opt-in (it needs 1.30
        // and the node-name extra: docs/security.md). controller.yaml and scheduler-extender.yaml
        // are in the overlays (drivers/deploy-overlays).
        .filter(|n| n != "kube-controller-manager.yaml" && n != "admission-policy.yaml")
        .collect();
    assert_eq!(
        listed, want,
        "kustomization.yaml resources vs the manifests in drivers/deploy"
    );
    let docs = docs(&dir);
    let ds = installer(&docs);
    let images: std::collections::BTreeSet<String> =
        ds[0]["spec"]["template"]["spec"]["containers"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["image"].as_str().unwrap().to_owned())
            .collect();
    assert_eq!(images.len(), 1, "one image for every container: {images:?}");
    let image = images.into_iter().next().unwrap();
    let name = image.rsplit_once(':').map_or(image.as_str(), |(n, _)| n);
    let set = k["images"].as_array().expect("images");
    assert!(
        set.iter().any(|i| i["name"] == name),
        "kustomization.yaml images: does not name {name}"
    );
}

/// Issue #33, 3: every StorageClass flexvol ships (the deployment's and the drivers' examples)
/// has parameters its provisioner accepts, as shipped: the NFS class once said `mode: "2770"`,
/// which the mode rule refuses (set-gid), so every claim of it failed.
#[test]
fn contract_manifests_shipped_classes_are_accepted_by_their_provisioner() {
    use std::collections::BTreeMap;
    let mut checked = 0;
    for (path, doc) in docs(&repo().join("drivers")) {
        if doc["kind"] != "StorageClass" {
            continue;
        }
        let provisioner = doc["provisioner"].as_str().unwrap_or_default();
        let params: BTreeMap<String, String> = doc["parameters"]
            .as_object()
            .map(|o| {
                o.iter()
                    .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_owned()))
                    .collect()
            })
            .unwrap_or_default();
        let r = match provisioner {
            "flexvol/hostpath" => flexvol::provision::storage::hostpath::check_params(&params),
            "flexvol/lvm" => flexvol::provision::storage::lvm::check_params(&params),
            "flexvol/nfs" => flexvol::provision::storage::nfs::NfsClass::parse(
                &params,
                &flexvol::backend::nfs::options::NfsConfig::default(),
            )
            .map(|_| ()),
            _ => continue,
        };
        assert!(
            r.is_ok(),
            "{}: StorageClass {} is refused by its provisioner: {}",
            path.display(),
            doc["metadata"]["name"],
            r.unwrap_err()
        );
        checked += 1;
    }
    assert!(checked >= 3, "only {checked} shipped classes found");
}

/// Issue #33, 6: the shipped node config is exactly as strict as the binary's defaults, but for
/// the keys named here, each of which grants nothing by itself. Loosening configmap.yaml (an
/// allowed root, a VG, a provisioning root, an export) fails this test.
#[test]
fn contract_manifests_shipped_config_is_the_binarys_defaults() {
    use flexvol::node::config::Config;
    type Reset = fn(&mut Config, &Config);
    // key, why it may differ, how the default is put back for the comparison.
    let allowed: &[(&str, &str, Reset)] = &[(
        "nfs.capabilityKeyFile",
        "where the DaemonSet installs the Secret flexvol-nfs-key; serves nothing until nfs.provisionedExports lists an export",
        |c, d| c.nfs.capability_key_file = d.nfs.capability_key_file.clone(),
    )];
    let strip = |c: &Config| -> String {
        let mut c = c.clone();
        let d = Config::default();
        for (_, _, reset) in allowed {
            reset(&mut c, &d);
        }
        format!("{c:#?}")
    };
    let cm = one(
        &deploy_docs("configmap.yaml"),
        "ConfigMap",
        "flexvol-config",
    )
    .clone();
    let json = cm["data"]["config.json"].as_str().expect("config.json");
    let shipped = Config::parse(Path::new("configmap.yaml"), json.as_bytes())
        .expect("the shipped config is valid");
    let defaults = format!("{:#?}", Config::default());
    assert_eq!(
        strip(&shipped),
        defaults,
        "drivers/deploy/configmap.yaml differs from the binary's defaults in a key not in the allow-list {:?}",
        allowed.iter().map(|a| (a.0, a.1)).collect::<Vec<_>>()
    );
    assert_eq!(
        shipped.nfs.capability_key_file.as_deref(),
        Some(Path::new(flexvol::ops::install::DEFAULT_NFS_KEY)),
        "nfs.capabilityKeyFile names where the DaemonSet's --nfs-key-dest installs the key"
    );
    // The comparison sees each kind of loosening the ConfigMap once had or documents.
    for loose in [
        r#"{"hostpath": {"allowedRoots": ["/srv"]}}"#,
        r#"{"lvm": {"allowedVolumeGroups": ["vg0"], "maxVolumeSize": "100Gi"}}"#,
        r#"{"nfs": {"provisionedExports": ["nfs.example.com:/exports/k8s"]}}"#,
        r#"{"nodePathMap": [{"node": "DEFAULT_PATH_FOR_NON_LISTED_NODES", "paths": ["/opt/local-path-provisioner"]}]}"#,
    ] {
        let c = Config::parse(Path::new("loose.json"), loose.as_bytes()).unwrap();
        assert_ne!(
            strip(&c),
            defaults,
            "{loose} is not told apart from the defaults"
        );
    }
}
