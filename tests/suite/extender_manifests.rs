//! Issue #24, 1: the scheduler extender's manifests. The capacity records live in the Namespace
//! flexvol-capacity (rbac.yaml); each of the three ServiceAccounts gets there exactly the calls its
//! code makes — the node provisioner `update` only (src/provision/cluster/live.rs publish_capacity), the
//! controller `list`/`create`/`delete` (src/controller/capacity.rs), the extender `list`/`watch`
//! (src/controller/extender/watch.rs) — and the node role is refused everything else; the
//! extender's token writes nothing anywhere. kube-scheduler-config.yaml (what users give
//! kube-scheduler) points at the DaemonSet's address, with the verbs the server routes, and is
//! `ignorable`.

use super::manifests::{
    CONTROLLER, CONTROLLER_CAPACITY, EXTENDER, deploy_docs as docs, deploy_file as file, granted,
    one, to_json,
};
use serde_json::Value;
use std::collections::BTreeSet;
use yaml_rust2::YamlLoader;

type Rules = BTreeSet<(String, String, String)>;

fn rules(list: &[(&str, &str, &str)]) -> Rules {
    list.iter()
        .map(|(g, r, v)| ((*g).to_owned(), (*r).to_owned(), (*v).to_owned()))
        .collect()
}

/// The binding `name` in `ns` (a RoleBinding; a ClusterRoleBinding when `ns` is None) ties `role`
/// to exactly the ServiceAccount kube-system/`sa`.
fn bound(docs: &[Value], name: &str, ns: Option<&str>, role: &str, sa: &str) {
    let kind = if ns.is_some() {
        "RoleBinding"
    } else {
        "ClusterRoleBinding"
    };
    let b = one(docs, kind, name);
    if let Some(ns) = ns {
        assert_eq!(b["metadata"]["namespace"], ns, "{kind} {name}");
        assert_eq!(b["roleRef"]["kind"], "Role", "{kind} {name}");
    }
    assert_eq!(b["roleRef"]["name"], role, "{kind} {name}");
    assert_eq!(
        b["subjects"],
        serde_json::json!([{"kind": "ServiceAccount", "name": sa, "namespace": "kube-system"}]),
        "{kind} {name}"
    );
}

/// The capacity overlay's JSON patch `name` first tests that container `index` is `container`,
/// then appends `flag` to its command, and does nothing else.
fn appends_flag(name: &str, index: usize, container: &str, flag: &str) {
    let patch: Value =
        serde_json::from_str(&file(&format!("../deploy-overlays/capacity/{name}"))).unwrap();
    let at = format!("/spec/template/spec/containers/{index}");
    assert_eq!(
        patch,
        serde_json::json!([
            {"op": "test", "path": format!("{at}/name"), "value": container},
            {"op": "add", "path": format!("{at}/command/-"), "value": flag},
        ]),
        "the capacity overlay turns {flag} on in the {container} container"
    );
}

const NS: &str = flexvol::vocab::capacity::NAMESPACE;
const WRITES: [&str; 6] = [
    "create",
    "update",
    "patch",
    "delete",
    "deletecollection",
    "escalate",
];

#[test]
fn contract_capacity_records_each_token_gets_exactly_its_calls() {
    assert_eq!(NS, "flexvol-capacity");
    // The namespace is made by rbac.yaml (in `apply -k`), before the Role in it (kubectl apply -f
    // creates in file order).
    let rbac = docs("rbac.yaml");
    let ns_at = rbac
        .iter()
        .position(|d| d["kind"] == "Namespace" && d["metadata"]["name"] == NS)
        .expect("rbac.yaml makes the Namespace flexvol-capacity");
    let node_role = one(&rbac, "Role", "flexvol-provisioner-capacity");
    let role_at = rbac
        .iter()
        .position(|d| std::ptr::eq(d, node_role))
        .unwrap();
    assert!(ns_at < role_at, "the Namespace comes before the Role in it");

    // Node provisioners: update of ConfigMaps in flexvol-capacity, and nothing else there.
    assert_eq!(node_role["metadata"]["namespace"], NS);
    let node = granted(node_role);
    assert_eq!(node, rules(&[("", "configmaps", "update")]));
    bound(
        &rbac,
        "flexvol-provisioner-capacity",
        Some(NS),
        "flexvol-provisioner-capacity",
        "flexvol-provisioner",
    );
    // What a stolen node token must not do with the records (or anything near them): read others'
    // (get/list/watch), add or remove objects, patch, and any ConfigMap elsewhere (its ClusterRole
    // and its Leases Role name no ConfigMap).
    for v in [
        "get",
        "list",
        "watch",
        "create",
        "delete",
        "deletecollection",
        "patch",
    ] {
        assert!(
            !node.contains(&("".into(), "configmaps".into(), v.into())),
            "the node may {v} capacity records"
        );
    }
    for (kind, name) in [
        ("ClusterRole", "flexvol-provisioner"),
        ("Role", "flexvol-provisioner-leases"),
    ] {
        for rule in one(&rbac, kind, name)["rules"].as_array().unwrap() {
            for r in rule["resources"].as_array().unwrap() {
                assert!(
                    r != "configmaps" && r != "namespaces" && r != "*",
                    "{kind} {name} names {r}"
                );
            }
        }
    }

    // Controller: list, create, delete there (src/controller/capacity.rs sync); never update or
    // patch (the records' contents are the nodes'). Granted, and --capacity-objects turned on,
    // only by the capacity overlay (issue #33: the node-loss overlay alone made empty records for
    // an extender that is not there): not in controller.yaml.
    let cap = docs(CONTROLLER_CAPACITY);
    let r = one(&cap, "Role", "flexvol-controller-capacity");
    assert_eq!(r["metadata"]["namespace"], NS);
    assert_eq!(
        granted(r),
        rules(&[
            ("", "configmaps", "list"),
            ("", "configmaps", "create"),
            ("", "configmaps", "delete"),
        ])
    );
    bound(
        &cap,
        "flexvol-controller-capacity",
        Some(NS),
        "flexvol-controller-capacity",
        "flexvol-controller",
    );
    let ctl = docs(CONTROLLER);
    assert!(
        !ctl.iter()
            .any(|d| d["kind"] == "Role" && d["metadata"]["namespace"] == NS),
        "controller.yaml (the node-loss overlay) grants a Role in {NS}"
    );
    let cmd =
        one(&ctl, "Deployment", "flexvol-controller")["spec"]["template"]["spec"]["containers"][0]
            ["command"]
            .clone();
    assert!(
        !cmd.as_array()
            .unwrap()
            .iter()
            .any(|a| a == "--capacity-objects"),
        "controller.yaml runs with --capacity-objects without the capacity overlay: {cmd}"
    );
    appends_flag(
        "controller-capacity.json",
        0,
        "controller",
        "--capacity-objects",
    );
    // The DaemonSet's provisioner publishes only in the capacity overlay (issue #33, 5: without
    // the controller's objects it would warn every minute): not in daemonset.yaml, and the
    // overlay's patch appends it to the provisioner container's command.
    let ds_cmd = docs("daemonset.yaml")
        .iter()
        .find(|d| d["kind"] == "DaemonSet")
        .unwrap()["spec"]["template"]["spec"]["containers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "provisioner")
        .unwrap()["command"]
        .clone();
    assert!(
        !ds_cmd
            .as_array()
            .unwrap()
            .iter()
            .any(|a| a == "--publish-capacity"),
        "drivers/deploy's provisioner publishes capacity without the opt-in: {ds_cmd}"
    );
    appends_flag(
        "publish-capacity.json",
        1,
        "provisioner",
        "--publish-capacity",
    );

    // Extender: reads claims and classes cluster-wide, the records in flexvol-capacity; writes
    // nothing anywhere; no pods, Nodes or secrets (the pod and the nodes come in the request).
    let ext = docs(EXTENDER);
    let cr = granted(one(&ext, "ClusterRole", "flexvol-scheduler-extender"));
    assert_eq!(
        cr,
        rules(&[
            ("", "persistentvolumeclaims", "list"),
            ("", "persistentvolumeclaims", "watch"),
            ("storage.k8s.io", "storageclasses", "list"),
            ("storage.k8s.io", "storageclasses", "watch"),
        ])
    );
    let role = one(&ext, "Role", "flexvol-scheduler-extender");
    assert_eq!(role["metadata"]["namespace"], NS);
    let rr = granted(role);
    assert_eq!(
        rr,
        rules(&[("", "configmaps", "list"), ("", "configmaps", "watch")])
    );
    for (_, _, v) in cr.iter().chain(rr.iter()) {
        assert!(!WRITES.contains(&v.as_str()), "the extender may {v}");
    }
    bound(
        &ext,
        "flexvol-scheduler-extender",
        None,
        "flexvol-scheduler-extender",
        "flexvol-scheduler-extender",
    );
    bound(
        &ext,
        "flexvol-scheduler-extender",
        Some(NS),
        "flexvol-scheduler-extender",
        "flexvol-scheduler-extender",
    );
    one(&ext, "ServiceAccount", "flexvol-scheduler-extender");
}

/// The extender's DaemonSet: on the control-plane nodes, host network, listening on loopback only,
/// probes on that address, the token in its one container, not root; and kube-scheduler's
/// configuration (the file users give it) calls that address with the verbs the server routes,
/// `ignorable`, with a deadline.
#[test]
fn contract_extender_runs_beside_kube_scheduler_and_is_ignorable() {
    let ext = docs(EXTENDER);
    let ds = one(&ext, "DaemonSet", "flexvol-scheduler-extender");
    assert_eq!(ds["metadata"]["namespace"], "kube-system");
    let spec = &ds["spec"]["template"]["spec"];
    assert_eq!(spec["hostNetwork"], true);
    assert_eq!(spec["serviceAccountName"], "flexvol-scheduler-extender");
    assert_eq!(spec["automountServiceAccountToken"], false);
    assert_eq!(spec["securityContext"]["runAsNonRoot"], true);
    assert!(
        spec["nodeSelector"]
            .as_object()
            .unwrap()
            .keys()
            .any(|k| k.starts_with("node-role.kubernetes.io/"))
    );
    let cs = spec["containers"].as_array().unwrap();
    assert_eq!(cs.len(), 1);
    let c = &cs[0];
    let cmd: Vec<String> = c["command"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap().to_owned())
        .collect();
    assert_eq!(
        cmd[..2],
        ["/flexvol".to_owned(), "scheduler-extender".to_owned()]
    );
    #[derive(clap::Parser)]
    struct Cmd {
        #[command(flatten)]
        a: flexvol::controller::extender::SchedulerExtenderArgs,
    }
    let args = <Cmd as clap::Parser>::try_parse_from(&cmd[1..])
        .unwrap_or_else(|e| panic!("{cmd:?}: {e}"))
        .a;
    assert!(args.listen.ip().is_loopback(), "listens on {}", args.listen);
    assert_eq!(c["securityContext"]["readOnlyRootFilesystem"], true);
    assert_eq!(c["securityContext"]["allowPrivilegeEscalation"], false);
    for (probe, path) in [("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")] {
        let g = &c[probe]["httpGet"];
        assert_eq!(g["path"], path, "{probe}");
        assert_eq!(g["host"], args.listen.ip().to_string(), "{probe}");
        assert_eq!(g["port"], args.listen.port(), "{probe}");
        assert!(
            c[probe]["timeoutSeconds"].as_u64().is_some(),
            "{probe}: no deadline"
        );
    }
    let m = &c["volumeMounts"][0];
    assert_eq!(
        m["mountPath"],
        "/var/run/secrets/kubernetes.io/serviceaccount"
    );
    let v = spec["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == m["name"])
        .unwrap();
    assert!(
        v["projected"]["sources"]
            .as_array()
            .unwrap()
            .iter()
            .any(|s| s.get("serviceAccountToken").is_some())
    );

    // kube-scheduler's configuration.
    let cfg = to_json(&YamlLoader::load_from_str(&file("kube-scheduler-config.yaml")).unwrap()[0]);
    assert_eq!(cfg["kind"], "KubeSchedulerConfiguration");
    assert_eq!(cfg["apiVersion"], "kubescheduler.config.k8s.io/v1beta1");
    let exts = cfg["extenders"].as_array().unwrap();
    assert_eq!(exts.len(), 1);
    let e = exts[0].as_object().unwrap();
    assert_eq!(e["urlPrefix"], format!("http://{}", args.listen));
    assert_eq!(
        e["ignorable"], true,
        "a dead extender must not block scheduling"
    );
    assert_eq!(e["nodeCacheCapable"], true);
    assert!(e["httpTimeout"].as_str().is_some_and(|t| t.ends_with('s')));
    for k in ["managedResources", "bindVerb", "preemptVerb", "enableHTTPS"] {
        assert!(!e.contains_key(k), "{k} is set");
    }
    // The verbs are routes of the server: a request to each is answered (here: not ready yet, an
    // error kube-scheduler ignores), not 404.
    let state = flexvol::controller::extender::server::State::new(
        "flexvol".into(),
        std::time::Duration::from_secs(180),
    );
    for verb in ["filterVerb", "prioritizeVerb"] {
        let path = format!("/{}", e[verb].as_str().unwrap());
        let (status, _, body) = flexvol::controller::extender::server::answer(
            &state,
            "POST",
            &path,
            b"{}",
            std::time::SystemTime::now(),
        );
        assert_ne!(status, 404, "{verb} {path}: {body}");
    }
}
