//! `drivers/deploy/admission-policy.yaml` (issue #32, 13), evaluated: every matchCondition,
//! variable and validation of each ValidatingAdmissionPolicy is run by a CEL interpreter (the
//! `cel` crate) on admission requests, as the API server runs them: the policy's resource rules
//! pick the request, its matchConditions pick the user, its variables are bound in order under
//! `variables`, and the request is denied when a validation is false or fails (failurePolicy
//! Fail, binding `validationActions: [Deny]`).
//!
//! The requests: recorded AdmissionReviews in `fixtures/admission/` (the PVs flexvol creates,
//! as `build_pv` makes them, and the attacks), and updates made by applying flexvol's own patch
//! builders (`flexvol::provision::cluster::live`, `labeller`) to recorded objects, so a change to what the
//! provisioner writes is judged by the policy here before a cluster refuses it.
//!
//! What the interpreter does not model: type checking against the OpenAPI schema (the API server
//! does it when the policy is created, and reports problems in the policy's status), and the lazy
//! evaluation of variables (every variable here is written never to fail, and the tests check
//! that it does not).

use crate::manifests::deploy_docs;
use flexvol::provision::cluster::live as kube;
use flexvol::provision::labeller;
use k8s_openapi::api::core::v1::PersistentVolume;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use serde_json::{Value, json};
use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;

const SA: &str = "system:serviceaccount:kube-system:flexvol-provisioner";
const NODE_NAME: &str = "authentication.kubernetes.io/node-name";

fn fixture(name: &str) -> Value {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/suite/fixtures/admission")
        .join(name);
    let text = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// What the API server would answer, as far as these policies decide.
#[derive(Debug, PartialEq)]
enum Verdict {
    /// No policy matched, or every validation of every matching policy held.
    Allowed,
    /// `policy: message` of each validation that was false or failed.
    Denied(Vec<String>),
}

impl Verdict {
    fn denied_by(&self, policy: &str, words: &str) -> bool {
        match self {
            Verdict::Allowed => false,
            Verdict::Denied(why) => why
                .iter()
                .any(|w| w.starts_with(&format!("{policy}:")) && w.contains(words)),
        }
    }
}

fn cel(v: &Value) -> cel::Value {
    cel::to_value(v).unwrap()
}

fn run(expr: &str, ctx: &cel::Context) -> Result<cel::Value, String> {
    let p = cel::Program::compile(expr).map_err(|e| format!("does not parse: {e}"))?;
    p.execute(ctx).map_err(|e| format!("{e}"))
}

fn strs(v: &Value) -> Vec<&str> {
    v.as_array()
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
}

/// Whether the policy's matchConstraints select `req` (resource rules with group, version,
/// operation and `resource` or `resource/subresource`; nothing else is used by these policies).
fn rules_match(policy: &Value, req: &Value) -> bool {
    let c = &policy["spec"]["matchConstraints"];
    assert!(
        c["namespaceSelector"].is_null() && c["objectSelector"].is_null(),
        "the evaluator models resource rules only"
    );
    let res = &req["resource"];
    let resource = match req["subResource"].as_str() {
        Some(s) if !s.is_empty() => format!("{}/{s}", res["resource"].as_str().unwrap()),
        _ => res["resource"].as_str().unwrap().to_owned(),
    };
    c["resourceRules"].as_array().unwrap().iter().any(|r| {
        let has = |field: &str, want: &str| strs(&r[field]).iter().any(|x| *x == want || *x == "*");
        has("apiGroups", res["group"].as_str().unwrap())
            && has("apiVersions", res["version"].as_str().unwrap())
            && has("operations", req["operation"].as_str().unwrap())
            && has("resources", &resource)
    })
}

/// The verdict of every policy of the file on `review` (an AdmissionReview).
fn decide(review: &Value) -> Verdict {
    let docs = deploy_docs("admission-policy.yaml");
    let req = &review["request"];
    let mut denied = Vec::new();
    for policy in docs
        .iter()
        .filter(|d| d["kind"] == "ValidatingAdmissionPolicy")
    {
        let name = policy["metadata"]["name"].as_str().unwrap();
        assert_eq!(policy["spec"]["failurePolicy"], "Fail", "{name}");
        if !rules_match(policy, req) {
            continue;
        }
        let mut ctx = cel::Context::default();
        ctx.add_variable_from_value("request", cel(req));
        ctx.add_variable_from_value("object", cel(&req["object"]));
        ctx.add_variable_from_value("oldObject", cel(&req["oldObject"]));
        ctx.add_variable_from_value("params", cel::Value::Null);
        let mut matched = true;
        for mc in policy["spec"]["matchConditions"].as_array().unwrap() {
            match run(mc["expression"].as_str().unwrap(), &ctx) {
                Ok(cel::Value::Bool(b)) => matched &= b,
                // failurePolicy Fail: an error in a matchCondition rejects the request.
                other => denied.push(format!("{name}: matchCondition {}: {other:?}", mc["name"])),
            }
        }
        if !matched {
            continue;
        }
        let mut vars: HashMap<String, cel::Value> = HashMap::new();
        for v in policy["spec"]["variables"].as_array().unwrap() {
            let mut c = cel::Context::default();
            c.add_variable_from_value("request", cel(req));
            c.add_variable_from_value("object", cel(&req["object"]));
            c.add_variable_from_value("oldObject", cel(&req["oldObject"]));
            c.add_variable_from_value("variables", vars.clone());
            let vname = v["name"].as_str().unwrap();
            let val = run(v["expression"].as_str().unwrap(), &c).unwrap_or_else(|e| {
                panic!("{name}: variable {vname} must never fail, and failed: {e}")
            });
            vars.insert(vname.to_owned(), val);
        }
        ctx.add_variable_from_value("variables", vars);
        for v in policy["spec"]["validations"].as_array().unwrap() {
            let msg = v["message"].as_str().unwrap();
            match run(v["expression"].as_str().unwrap(), &ctx) {
                Ok(cel::Value::Bool(true)) => {}
                Ok(cel::Value::Bool(false)) => denied.push(format!("{name}: {msg}")),
                other => denied.push(format!("{name}: {msg} (error: {other:?})")),
            }
        }
    }
    if denied.is_empty() {
        Verdict::Allowed
    } else {
        Verdict::Denied(denied)
    }
}

fn allowed(review: &Value) {
    let v = decide(review);
    assert_eq!(
        v,
        Verdict::Allowed,
        "{} {} {}",
        review["request"]["operation"],
        review["request"]["resource"]["resource"],
        review["request"]["name"]
    );
}

/// An AdmissionReview of `op` on `resource` (`sub`: its subresource) by `user`.
fn review(
    op: &str,
    resource: &str,
    sub: Option<&str>,
    object: Value,
    old: Value,
    user: Value,
) -> Value {
    let named = if object.is_null() { &old } else { &object };
    let mut r = json!({
        "uid": "7d1c", "operation": op, "userInfo": user,
        "resource": {"group": "", "version": "v1", "resource": resource},
        "name": named["metadata"]["name"],
        "object": object, "oldObject": old, "dryRun": false,
    });
    if let Some(ns) = named["metadata"]["namespace"].as_str() {
        r["namespace"] = json!(ns);
    }
    if let Some(s) = sub {
        r["subResource"] = json!(s);
    }
    json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": r})
}

/// The provisioner's user as the API server sees its pod-bound token on 1.30+ (`node`: the
/// node-name extra; `None`: a token without it).
fn provisioner(node: Option<&str>) -> Value {
    let mut extra = json!({"authentication.kubernetes.io/credential-id": ["JTI=0c2a"]});
    if let Some(n) = node {
        extra[NODE_NAME] = json!([n]);
        extra["authentication.kubernetes.io/pod-name"] = json!(["flexvol-node-7xk2p"]);
    }
    json!({"username": SA, "groups": ["system:serviceaccounts",
        "system:serviceaccounts:kube-system", "system:authenticated"], "extra": extra})
}

fn merge(old: &Value, patch: &Value) -> Value {
    let mut new = old.clone();
    json_patch::merge(&mut new, patch);
    new
}

fn json_patched(old: &Value, patch: Value) -> Value {
    let mut new = old.clone();
    let p: json_patch::Patch = serde_json::from_value(patch).unwrap();
    json_patch::patch(&mut new, &p).unwrap();
    new
}

/// The bound hostPath PV of node-a as the server holds it.
fn bound_pv() -> Value {
    fixture("pv-hostpath-bound.json")
}

/// The PV object of a recorded create, as the server then holds it (bound).
fn created(name: &str) -> Value {
    let mut pv = fixture(name)["request"]["object"].clone();
    pv["metadata"]["resourceVersion"] = json!("48302");
    pv["status"] = json!({"phase": "Bound"});
    pv
}

fn pv_update(old: &Value, new: Value, node: Option<&str>) -> Value {
    review(
        "UPDATE",
        "persistentvolumes",
        None,
        new,
        old.clone(),
        provisioner(node),
    )
}

// ---- Every write flexvol makes is allowed ----

#[test]
fn contract_admission_policy_allows_the_pvs_flexvol_creates() {
    for f in [
        "create-hostpath-pv.json",
        "create-lvm-pv.json",
        "create-nfs-pv.json",
    ] {
        allowed(&fixture(f));
    }
    // An NFS PV belongs to no node: a token without the node name still makes one.
    let mut nfs = fixture("create-nfs-pv.json");
    nfs["request"]["userInfo"] = provisioner(None);
    allowed(&nfs);
}

#[test]
fn contract_admission_policy_allows_every_pv_update_and_delete_flexvol_makes() {
    let nfs = created("create-nfs-pv.json");
    for (old, node) in [
        (bound_pv(), "node-a"),
        (created("create-lvm-pv.json"), "node-a"),
        (nfs.clone(), "node-b"),
        (nfs, "node-c"), // the NFS leader may be any node
    ] {
        let meta: PersistentVolume = serde_json::from_value(old.clone()).unwrap();
        // The sweep's labels (lanes.rs missing_labels -> label_volume): the kind, and the node
        // of a node-local one.
        let labels: BTreeMap<String, String> = old["metadata"]["labels"]
            .as_object()
            .unwrap()
            .iter()
            .map(|(k, v)| (k.clone(), v.as_str().unwrap().to_owned()))
            .collect();
        let mut unlabelled = old.clone();
        unlabelled["metadata"]
            .as_object_mut()
            .unwrap()
            .remove("labels");
        allowed(&pv_update(
            &unlabelled,
            merge(&unlabelled, &kube::label_volume_patch(&labels)),
            Some(node),
        ));
        // Removing and adding its finalizer (kube.rs, JSON patches with their tests).
        let p =
            flexvol::k8s::patch::remove_finalizer_patch(&meta.metadata, flexvol::vocab::FINALIZER)
                .unwrap();
        let without = json_patched(&old, p);
        allowed(&pv_update(&old, without.clone(), Some(node)));
        let meta2: PersistentVolume = serde_json::from_value(without.clone()).unwrap();
        let p =
            flexvol::k8s::patch::add_finalizer_patch(&meta2.metadata, flexvol::vocab::FINALIZER)
                .unwrap();
        allowed(&pv_update(&without, json_patched(&without, p), Some(node)));
        // A resize (grow_volume).
        let grown = kube::grow_volume_patch(
            &Quantity("20Gi".into()),
            &BTreeMap::from([("flexvol/size-bytes".to_owned(), "21474836480".to_owned())]),
        );
        allowed(&pv_update(&old, merge(&old, &grown), Some(node)));
        // The delete of a released volume's PV.
        allowed(&review(
            "DELETE",
            "persistentvolumes",
            None,
            Value::Null,
            old.clone(),
            provisioner(Some(node)),
        ));
    }
}

fn claim() -> Value {
    fixture("claim-waiting-on-node-a.json")
}

fn claim_update(old: &Value, new: Value, sub: Option<&str>, node: Option<&str>) -> Value {
    review(
        "UPDATE",
        "persistentvolumeclaims",
        sub,
        new,
        old.clone(),
        provisioner(node),
    )
}

#[test]
fn contract_admission_policy_allows_every_claim_write_flexvol_makes() {
    let old = claim();
    // The labeller: the Lease holder (here node-c) labels any node's claim.
    let change = BTreeMap::from([
        ("flexvol/node".to_owned(), Some("node-a".to_owned())),
        ("flexvol/kind".to_owned(), None),
    ]);
    let p = labeller::label_patch(old["metadata"]["uid"].as_str(), &change);
    allowed(&claim_update(&old, merge(&old, &p), None, Some("node-c")));
    // An NFS claim's kind label (the NFS leader), a claim of the beta annotation only.
    let mut nfs = old.clone();
    let ann = nfs["metadata"]["annotations"].as_object_mut().unwrap();
    ann.remove("volume.kubernetes.io/storage-provisioner");
    ann.remove("volume.kubernetes.io/selected-node");
    ann.insert(
        "volume.beta.kubernetes.io/storage-provisioner".into(),
        json!("flexvol/nfs"),
    );
    let change = BTreeMap::from([("flexvol/kind".to_owned(), Some("nfs".to_owned()))]);
    let p = labeller::label_patch(nfs["metadata"]["uid"].as_str(), &change);
    allowed(&claim_update(&nfs, merge(&nfs, &p), None, Some("node-b")));
    // Sent back to the scheduler by the node it names (unselect_node).
    let p = kube::unselect_node_patch(old["metadata"]["resourceVersion"].as_str());
    allowed(&claim_update(&old, merge(&old, &p), None, Some("node-a")));
    // A finished resize, through the status subresource (finish_claim_resize).
    let mut resizing = old.clone();
    resizing["status"] = json!({"phase": "Bound", "accessModes": ["ReadWriteOnce"],
        "capacity": {"storage": "1Gi"},
        "conditions": [{"type": "Resizing", "status": "True"},
                       {"type": "ModifyingVolume", "status": "True"}]});
    let p = kube::finish_resize_patch(&resizing, &Quantity("2Gi".into()));
    allowed(&claim_update(
        &resizing,
        merge(&resizing, &p),
        Some("status"),
        Some("node-a"),
    ));
}

#[test]
fn contract_admission_policy_allows_the_nodes_own_capacity_record() {
    let old = json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "node-a", "namespace": "flexvol-capacity",
                     "labels": {"flexvol/capacity": "true"}},
        "data": {"capacity.json": "{}"}});
    let mut new = old.clone();
    new["data"]["capacity.json"] = json!("{\"node\":\"node-a\"}");
    allowed(&review(
        "UPDATE",
        "configmaps",
        None,
        new,
        old,
        provisioner(Some("node-a")),
    ));
}

// ---- The attacks are refused ----

#[test]
fn contract_admission_policy_refuses_a_hostpath_root_pv() {
    let v = decide(&fixture("attack-hostpath-root-pv.json"));
    assert!(
        v.denied_by("flexvol-provisioner-volumes", "whose source is flexVolume"),
        "{v:?}"
    );
    // Any other driver, too: a flexVolume of another vendor.
    let mut r = fixture("create-hostpath-pv.json");
    r["request"]["object"]["spec"]["flexVolume"]["driver"] = json!("acme/hostpath");
    assert!(decide(&r).denied_by("flexvol-provisioner-volumes", "whose source is flexVolume"));
}

#[test]
fn contract_admission_policy_refuses_a_pv_pinned_to_another_node() {
    let v = decide(&fixture("attack-pv-pinned-to-another-node.json"));
    assert!(
        v.denied_by(
            "flexvol-provisioner-volumes",
            "pinned to the node of its token"
        ),
        "{v:?}"
    );
    let v = decide(&fixture("attack-pv-two-terms.json"));
    assert!(
        v.denied_by(
            "flexvol-provisioner-volumes",
            "pinned to the node of its token"
        ),
        "{v:?}"
    );
    // A term that also names another node, no affinity at all, NotIn, another key: refused.
    let base = fixture("create-hostpath-pv.json");
    let terms = "/request/object/spec/nodeAffinity/required/nodeSelectorTerms";
    for change in [
        json!([{"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": ["node-a", "node-b"]}]}]),
        json!([{"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "NotIn", "values": ["node-a"]}]}]),
        json!([{"matchExpressions": [{"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["node-a"]}]}]),
        json!([{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["node-a"]}]}]),
        json!([]),
    ] {
        let mut r = base.clone();
        *r.pointer_mut(terms).unwrap() = change.clone();
        assert!(
            decide(&r).denied_by("flexvol-provisioner-volumes", "pinned"),
            "{change}"
        );
    }
    let mut r = base.clone();
    r["request"]["object"]["spec"]
        .as_object_mut()
        .unwrap()
        .remove("nodeAffinity");
    assert!(decide(&r).denied_by("flexvol-provisioner-volumes", "pinned"));
    // A node-local PV whose flexvol/node names another node (another node's instance would
    // take it for its own).
    let mut r = base;
    r["request"]["object"]["metadata"]["annotations"]["flexvol/node"] = json!("node-b");
    assert!(decide(&r).denied_by("flexvol-provisioner-volumes", "flexvol/node"));
}

#[test]
fn contract_admission_policy_fails_closed_without_the_node_name() {
    let v = decide(&fixture("attack-no-node-name-extra.json"));
    assert!(
        v.denied_by(
            "flexvol-provisioner-volumes",
            "pinned to the node of its token"
        ),
        "{v:?}"
    );
    // An empty value, or two values, name no node either.
    for extra in [json!([]), json!(["node-a", "node-b"]), json!([""])] {
        let mut r = fixture("create-hostpath-pv.json");
        r["request"]["userInfo"]["extra"][NODE_NAME] = extra.clone();
        assert!(
            decide(&r).denied_by("flexvol-provisioner-volumes", "pinned"),
            "{extra}"
        );
    }
    // No extra at all (a legacy Secret token on an upgraded cluster).
    let mut r = fixture("create-lvm-pv.json");
    r["request"]["userInfo"]
        .as_object_mut()
        .unwrap()
        .remove("extra");
    assert!(decide(&r).denied_by("flexvol-provisioner-volumes", "pinned"));
}

#[test]
fn contract_admission_policy_binds_only_the_provisioner() {
    // The same hostPath: / PV by a cluster admin: not this policy's business.
    assert_eq!(
        decide(&fixture("other-user-hostpath-root-pv.json")),
        Verdict::Allowed
    );
    // Nor another ServiceAccount of the same name elsewhere, or a prefix of it.
    for user in [
        "system:serviceaccount:tenant:flexvol-provisioner",
        "system:serviceaccount:kube-system:flexvol-provisioner-x",
    ] {
        let mut r = fixture("attack-hostpath-root-pv.json");
        r["request"]["userInfo"]["username"] = json!(user);
        assert_eq!(decide(&r), Verdict::Allowed, "{user}");
    }
    // Every policy is enforced by a binding that denies.
    let docs = deploy_docs("admission-policy.yaml");
    for p in docs
        .iter()
        .filter(|d| d["kind"] == "ValidatingAdmissionPolicy")
    {
        let name = &p["metadata"]["name"];
        let b = docs
            .iter()
            .find(|d| {
                d["kind"] == "ValidatingAdmissionPolicyBinding" && d["spec"]["policyName"] == *name
            })
            .unwrap_or_else(|| panic!("no binding for {name}"));
        assert_eq!(
            strs(&b["spec"]["validationActions"]),
            vec!["Deny"],
            "{name}"
        );
        assert_eq!(p["apiVersion"], "admissionregistration.k8s.io/v1");
        let mc = p["spec"]["matchConditions"][0]["expression"]
            .as_str()
            .unwrap();
        assert!(mc.contains(&format!("'{SA}'")), "{name}: {mc}");
    }
}

#[test]
fn contract_admission_policy_refuses_pv_updates_beyond_flexvols() {
    let old = bound_pv();
    let n = Some("node-a");
    let no = |new: Value, words: &str| {
        let v = decide(&pv_update(&old, new, n));
        assert!(v.denied_by("flexvol-provisioner-volumes", words), "{v:?}");
    };
    // Hand the volume to another claim; make Retain into Delete; widen or move its node
    // affinity (mutable from 1.35 with MutablePVNodeAffinity); change its class or modes.
    no(
        merge(
            &old,
            &json!({"spec": {"claimRef": {"namespace": "payments", "name": "ledger", "uid": "x"}}}),
        ),
        "only the capacity",
    );
    no(
        merge(
            &old,
            &json!({"spec": {"persistentVolumeReclaimPolicy": "Retain"}}),
        ),
        "only the capacity",
    );
    no(
        merge(
            &old,
            &json!({"spec": {"nodeAffinity": {"required": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": ["node-a"]}]},
            {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": ["node-b"]}]}]}}}}),
        ),
        "pinned",
    );
    no(
        merge(
            &old,
            &json!({"spec": {"mountOptions": ["noatime", "exec"]}}),
        ),
        "only the capacity",
    );
    no(
        merge(&old, &json!({"spec": {"accessModes": ["ReadWriteMany"]}})),
        "only the capacity",
    );
    // Metadata beyond the finalizer, size annotation and routing labels.
    no(
        merge(
            &old,
            &json!({"metadata": {"annotations": {"pv.kubernetes.io/bound-by-controller": null}}}),
        ),
        "metadata",
    );
    no(
        merge(
            &old,
            &json!({"metadata": {"annotations": {"flexvol/size-note": "forged"}}}),
        ),
        "metadata",
    );
    no(
        merge(&old, &json!({"metadata": {"labels": {"team": "x"}}})),
        "metadata",
    );
    no(
        merge(
            &old,
            &json!({"metadata": {"finalizers": ["external-provisioner.volume.kubernetes.io/finalizer"]}}),
        ),
        "metadata",
    );
    no(
        merge(
            &old,
            &json!({"metadata": {"ownerReferences": [{"apiVersion": "v1", "kind": "ConfigMap", "name": "gone", "uid": "0"}]}}),
        ),
        "metadata",
    );
    // Another node's PV, even flexvol's own kind of change; a PV that is not flexvol's.
    let v = decide(&pv_update(
        &old,
        merge(&old, &json!({"spec": {"capacity": {"storage": "2Gi"}}})),
        Some("node-b"),
    ));
    assert!(
        v.denied_by("flexvol-provisioner-volumes", "pinned"),
        "{v:?}"
    );
    let mut csi = old.clone();
    let spec = csi["spec"].as_object_mut().unwrap();
    spec.remove("flexVolume");
    spec.insert(
        "csi".into(),
        json!({"driver": "ebs.csi.aws.com", "volumeHandle": "vol-1"}),
    );
    let v = decide(&pv_update(
        &csi,
        merge(
            &csi,
            &json!({"metadata": {"labels": {"flexvol/kind": "hostpath"}}}),
        ),
        n,
    ));
    assert!(
        v.denied_by("flexvol-provisioner-volumes", "whose source is flexVolume"),
        "{v:?}"
    );
    // Delete: another node's node-local PV, or a PV that is not flexvol's.
    for (pv, node) in [(old.clone(), "node-b"), (csi, "node-a")] {
        let v = decide(&review(
            "DELETE",
            "persistentvolumes",
            None,
            Value::Null,
            pv,
            provisioner(Some(node)),
        ));
        assert_ne!(v, Verdict::Allowed);
    }
    // An NFS PV given node affinity (pulling its pods to a node).
    let nfs = created("create-nfs-pv.json");
    let v = decide(&pv_update(
        &nfs,
        merge(
            &nfs,
            &json!({"spec": {"nodeAffinity": {"required": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": ["node-b"]}]}]}}}}),
        ),
        Some("node-b"),
    ));
    assert!(
        v.denied_by("flexvol-provisioner-volumes", "no node affinity"),
        "{v:?}"
    );
}

#[test]
fn contract_admission_policy_refuses_claim_writes_beyond_flexvols() {
    let old = claim();
    let no = |new: Value, sub: Option<&str>, node: Option<&str>, words: &str| {
        let v = decide(&claim_update(&old, new, sub, node));
        assert!(v.denied_by("flexvol-provisioner-claims", words), "{v:?}");
    };
    let a = Some("node-a");
    // Steer a claim: write, change or remove another node's selected-node.
    no(
        merge(
            &old,
            &json!({"metadata": {"annotations": {"volume.kubernetes.io/selected-node": "node-b"}}}),
        ),
        None,
        a,
        "annotation",
    );
    no(
        merge(&old, &kube::unselect_node_patch(Some("48211"))),
        None,
        Some("node-b"),
        "annotation",
    );
    no(
        merge(&old, &kube::unselect_node_patch(Some("48211"))),
        None,
        None,
        "annotation",
    );
    // Drop pvc-protection, raise the request, add an owner, change other labels or annotations.
    no(
        merge(&old, &json!({"metadata": {"finalizers": null}})),
        None,
        a,
        "finalizers",
    );
    no(
        merge(
            &old,
            &json!({"spec": {"resources": {"requests": {"storage": "1Ti"}}}}),
        ),
        None,
        a,
        "spec",
    );
    no(
        merge(
            &old,
            &json!({"metadata": {"ownerReferences": [{"apiVersion": "v1", "kind": "ConfigMap", "name": "gone", "uid": "0"}]}}),
        ),
        None,
        a,
        "owners",
    );
    no(
        merge(&old, &json!({"metadata": {"labels": {"app": null}}})),
        None,
        a,
        "labels",
    );
    no(
        merge(
            &old,
            &json!({"metadata": {"annotations": {"volume.kubernetes.io/storage-provisioner": "ebs.csi.aws.com"}}}),
        ),
        None,
        a,
        "annotation",
    );
    // Status: anything but capacity and conditions.
    no(
        merge(&old, &json!({"status": {"phase": "Lost"}})),
        Some("status"),
        a,
        "status",
    );
    // A claim that is not flexvol's, even its labels.
    let mut theirs = old.clone();
    theirs["metadata"]["annotations"] =
        json!({"volume.kubernetes.io/storage-provisioner": "ebs.csi.aws.com"});
    let v = decide(&claim_update(
        &theirs,
        merge(
            &theirs,
            &json!({"metadata": {"labels": {"flexvol/node": "node-a"}}}),
        ),
        None,
        a,
    ));
    assert!(
        v.denied_by("flexvol-provisioner-claims", "claims of flexvol's drivers"),
        "{v:?}"
    );
    // Creating or deleting a claim (RBAC refuses both already).
    let v = decide(&review(
        "DELETE",
        "persistentvolumeclaims",
        None,
        Value::Null,
        old.clone(),
        provisioner(a),
    ));
    assert!(
        v.denied_by("flexvol-provisioner-claims", "never creates or deletes"),
        "{v:?}"
    );
}

#[test]
fn contract_admission_policy_refuses_another_nodes_capacity_record() {
    let old = json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "node-b", "namespace": "flexvol-capacity"}, "data": {}});
    let mut new = old.clone();
    new["data"]["capacity.json"] = json!("{}");
    for node in [Some("node-a"), None] {
        let v = decide(&review(
            "UPDATE",
            "configmaps",
            None,
            new.clone(),
            old.clone(),
            provisioner(node),
        ));
        assert!(
            v.denied_by("flexvol-provisioner-capacity", "named after the node"),
            "{v:?}"
        );
    }
    // ConfigMaps elsewhere are not this policy's (RBAC gives the token none).
    let mut elsewhere = review("UPDATE", "configmaps", None, new, old, provisioner(None));
    elsewhere["request"]["namespace"] = json!("kube-system");
    assert_eq!(decide(&elsewhere), Verdict::Allowed);
}

/// The policy's one assumption (admission-policy.yaml's header, docs/security.md): flexvol pins a
/// node-local PV to its node's `kubernetes.io/hostname` label, and the policy can compare that
/// only with the token's node name. Where the two differ, flexvol's own PV is refused, loudly
/// (the message names the pin); this test keeps that behaviour known rather than accidental.
#[test]
fn contract_admission_policy_assumes_the_hostname_label_is_the_node_name() {
    let mut r = fixture("create-hostpath-pv.json");
    let values =
        "/request/object/spec/nodeAffinity/required/nodeSelectorTerms/0/matchExpressions/0/values";
    *r.pointer_mut(values).unwrap() = json!(["node-a.internal"]);
    let v = decide(&r);
    assert!(
        v.denied_by(
            "flexvol-provisioner-volumes",
            "pinned to the node of its token"
        ),
        "{v:?}"
    );
}
