//! drivers/deploy-overlays/node-loss/controller.yaml (`flexvol controller`, issue #24): its ClusterRole and its Role in
//! kube-node-lease grant exactly the calls of src/controller/nodeloss/mod.rs, the claim delete it needs is granted to it and never to
//! the node provisioner's ServiceAccount (rbac.yaml), and the Deployment runs one replica as
//! `flexvol controller` with the token in its one container.

use super::manifests::{CONTROLLER, deploy_docs as docs, granted, one};
use std::collections::BTreeSet;

#[test]
fn contract_controller_token_is_exactly_its_calls_and_claim_delete_is_not_the_nodes() {
    let d = docs(CONTROLLER);
    // Every call of src/controller/nodeloss/mod.rs, nothing else.
    let needed: BTreeSet<(String, String, String)> = [
        ("", "nodes", "list"),                       // list_nodes
        ("", "nodes", "get"),                        // act: the node read again
        ("", "persistentvolumes", "list"),           // list_volumes
        ("", "persistentvolumes", "get"),            // act: the PV read again
        ("", "persistentvolumes", "patch"),          // annotate, finalizer removal
        ("", "persistentvolumes", "delete"),         // act
        ("", "persistentvolumeclaims", "get"),       // act: claim_step
        ("", "persistentvolumeclaims", "delete"),    // act
        ("storage.k8s.io", "storageclasses", "get"), // class
        ("", "events", "create"),                    // event (src/k8s/events.rs)
    ]
    .iter()
    .map(|(g, r, v)| ((*g).to_owned(), (*r).to_owned(), (*v).to_owned()))
    .collect();
    let role = one(&d, "ClusterRole", "flexvol-controller");
    assert_eq!(
        granted(role),
        needed,
        "controller.yaml's ClusterRole vs the calls"
    );
    // The kubelets' Leases (issue #32, item 6): list each pass, get before acting; read only, and
    // only in kube-node-lease (a Role, not a ClusterRole over every Lease).
    let leases = one(&d, "Role", "flexvol-controller-leases");
    assert_eq!(leases["metadata"]["namespace"], "kube-node-lease");
    let want: BTreeSet<(String, String, String)> = ["list", "get"]
        .iter()
        .map(|v| {
            (
                "coordination.k8s.io".to_owned(),
                "leases".to_owned(),
                (*v).to_owned(),
            )
        })
        .collect();
    assert_eq!(
        granted(leases),
        want,
        "controller.yaml's Lease Role vs the calls"
    );
    let lb = one(&d, "RoleBinding", "flexvol-controller-leases");
    assert_eq!(lb["metadata"]["namespace"], "kube-node-lease");
    assert_eq!(lb["roleRef"]["kind"], "Role");
    assert_eq!(lb["roleRef"]["name"], "flexvol-controller-leases");
    assert_eq!(
        lb["subjects"],
        serde_json::json!([{"kind": "ServiceAccount", "name": "flexvol-controller", "namespace": "kube-system"}])
    );
    assert!(
        !granted(role).iter().any(|(_, r, _)| r == "leases"),
        "the ClusterRole must not grant Leases"
    );
    let b = one(&d, "ClusterRoleBinding", "flexvol-controller");
    assert_eq!(b["roleRef"]["name"], "flexvol-controller");
    assert_eq!(
        b["subjects"],
        serde_json::json!([{"kind": "ServiceAccount", "name": "flexvol-controller", "namespace": "kube-system"}])
    );
    one(&d, "ServiceAccount", "flexvol-controller");

    // The node credential may not delete claims (the reason this component exists).
    let rbac = docs("rbac.yaml");
    let node = granted(one(&rbac, "ClusterRole", "flexvol-provisioner"));
    assert!(!node.contains(&("".into(), "persistentvolumeclaims".into(), "delete".into())));

    // One replica, never two at once, as `flexvol controller`, the token in its one container,
    // not root.
    let dep = one(&d, "Deployment", "flexvol-controller");
    assert_eq!(dep["metadata"]["namespace"], "kube-system");
    assert_eq!(dep["spec"]["replicas"], 1);
    assert_eq!(dep["spec"]["strategy"]["type"], "Recreate");
    assert_eq!(
        dep["spec"]["selector"]["matchLabels"],
        dep["spec"]["template"]["metadata"]["labels"]
    );
    let spec = &dep["spec"]["template"]["spec"];
    assert_eq!(spec["serviceAccountName"], "flexvol-controller");
    assert_eq!(spec["automountServiceAccountToken"], false);
    assert_eq!(spec["securityContext"]["runAsNonRoot"], true);
    let cs = spec["containers"].as_array().unwrap();
    assert_eq!(cs.len(), 1);
    let cmd: Vec<String> = cs[0]["command"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap().to_owned())
        .collect();
    assert_eq!(cmd[..2], ["/flexvol".to_owned(), "controller".to_owned()]);
    #[derive(clap::Parser)]
    struct Cmd {
        #[command(flatten)]
        _a: flexvol::controller::ControllerArgs,
    }
    <Cmd as clap::Parser>::try_parse_from(&cmd[1..]).unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    let m = &cs[0]["volumeMounts"][0];
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
    let sources = v["projected"]["sources"].as_array().unwrap();
    assert!(
        sources
            .iter()
            .any(|s| s.get("serviceAccountToken").is_some())
    );
    assert!(
        sources
            .iter()
            .any(|s| s["configMap"]["name"] == "kube-root-ca.crt")
    );
}
