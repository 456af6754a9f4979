//! The reconcile pass against a recording fake of the API (the [`Cluster`] seam) and real
//! directories on this host.

use crate::k8s::error::ApiError;
use crate::k8s::error::ApiErrorKind;
use crate::k8s::error::ApiResult;
use crate::k8s::events::EventSpec;
use crate::node::config::Config;
use crate::node::localpath::{LocalPathConfig, NodePath, PathMap};
use crate::provision::cluster::*;
use crate::provision::reconcile::*;
use crate::provision::storage::ClassError;
use crate::provision::storage::volumedir::{MARKER, Marker};
use crate::vocab::ANN_NODE;
use crate::vocab::ANN_PROVISIONED_BY;
use crate::vocab::ANN_PROVISIONER;
use crate::vocab::ANN_PROVISIONER_BETA;
use crate::vocab::ANN_SELECTED_NODE;
use crate::vocab::FINALIZER;
use crate::vocab::HOSTNAME_LABEL;
use k8s_openapi::api::core::v1::{
    Node, PersistentVolume, PersistentVolumeClaim, PersistentVolumeClaimSpec,
    PersistentVolumeClaimStatus, PersistentVolumeStatus, VolumeResourceRequirements,
};
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

const PROV: &str = "flexvol/hostpath";

#[derive(Default)]
struct Fake {
    claims: RefCell<Vec<PersistentVolumeClaim>>,
    volumes: RefCell<Vec<PersistentVolume>>,
    classes: RefCell<BTreeMap<String, StorageClass>>,
    nodes: RefCell<BTreeMap<String, Node>>,
    events: RefCell<Vec<EventSpec>>,
    /// The next create_volume fails with this.
    fail_create: Cell<Option<ApiErrorKind>>,
    /// get_volume answers this instead of the list (a server newer than the cache).
    server_volumes: RefCell<Option<Vec<PersistentVolume>>>,
    /// The next remove_volume_finalizer fails with this (a kill, or the API server gone, between
    /// the volume's removal and the finalizer's).
    fail_unguard: Cell<Option<ApiErrorKind>>,
    /// claims() answers this instead of `claims` (a watch cache that misses some).
    cached_claims: RefCell<Option<Vec<PersistentVolumeClaim>>>,
    /// Every finalizer patch sent, as JSON.
    patches: RefCell<Vec<serde_json::Value>>,
    /// Every capacity record published: node, text.
    published: RefCell<Vec<(String, String)>>,
}

/// Applies a JSON patch to `pv` as the API server would (the `test`s included): `Conflict` when
/// a test fails.
fn apply_json_patch(pv: &mut PersistentVolume, patch: serde_json::Value) -> ApiResult<()> {
    let mut doc = serde_json::to_value(&*pv).unwrap();
    let p: json_patch::Patch = serde_json::from_value(patch).unwrap();
    json_patch::patch(&mut doc, &p).map_err(|_| err(ApiErrorKind::Conflict))?;
    let rv: u64 = pv
        .metadata
        .resource_version
        .as_deref()
        .unwrap_or("1")
        .parse()
        .unwrap();
    *pv = serde_json::from_value(doc).unwrap();
    pv.metadata.resource_version = Some((rv + 1).to_string());
    Ok(())
}

fn err(kind: ApiErrorKind) -> ApiError {
    ApiError::new("fake", kind, "injected")
}

impl Cluster for Fake {
    async fn publish_capacity(&self, node: &str, text: &str) -> ApiResult<()> {
        self.published
            .borrow_mut()
            .push((node.to_owned(), text.to_owned()));
        Ok(())
    }
    async fn claims(&self) -> ApiResult<Vec<PersistentVolumeClaim>> {
        if let Some(c) = self.cached_claims.borrow().clone() {
            return Ok(c);
        }
        Ok(self.claims.borrow().clone())
    }
    async fn volumes(&self) -> ApiResult<Vec<PersistentVolume>> {
        Ok(self.volumes.borrow().clone())
    }
    async fn get_volume(&self, name: &str) -> ApiResult<Option<PersistentVolume>> {
        let src = self
            .server_volumes
            .borrow()
            .clone()
            .unwrap_or_else(|| self.volumes.borrow().clone());
        Ok(src
            .into_iter()
            .find(|v| v.metadata.name.as_deref() == Some(name)))
    }
    async fn label_volume(&self, name: &str, labels: &BTreeMap<String, String>) -> ApiResult<()> {
        let mut vs = self.volumes.borrow_mut();
        let Some(v) = vs
            .iter_mut()
            .find(|v| v.metadata.name.as_deref() == Some(name))
        else {
            return Err(err(ApiErrorKind::NotFound));
        };
        v.metadata
            .labels
            .get_or_insert_with(BTreeMap::new)
            .extend(labels.clone());
        Ok(())
    }
    async fn get_claim(
        &self,
        namespace: &str,
        name: &str,
    ) -> ApiResult<Option<PersistentVolumeClaim>> {
        Ok(self
            .claims
            .borrow()
            .iter()
            .find(|c| {
                c.metadata.namespace.as_deref() == Some(namespace)
                    && c.metadata.name.as_deref() == Some(name)
            })
            .cloned())
    }
    async fn add_volume_finalizer(&self, pv: &PersistentVolume) -> ApiResult<()> {
        let Some(p) = crate::k8s::patch::add_finalizer_patch(&pv.metadata, crate::vocab::FINALIZER)
        else {
            return Ok(());
        };
        self.patches.borrow_mut().push(p.clone());
        let mut v = self.volumes.borrow_mut();
        let x = v
            .iter_mut()
            .find(|x| x.metadata.name == pv.metadata.name)
            .ok_or_else(|| err(ApiErrorKind::NotFound))?;
        apply_json_patch(x, p)
    }
    async fn remove_volume_finalizer(&self, pv: &PersistentVolume) -> ApiResult<()> {
        if let Some(k) = self.fail_unguard.take() {
            return Err(err(k));
        }
        let Some(p) =
            crate::k8s::patch::remove_finalizer_patch(&pv.metadata, crate::vocab::FINALIZER)
        else {
            return Ok(());
        };
        self.patches.borrow_mut().push(p.clone());
        let mut v = self.volumes.borrow_mut();
        let i = v
            .iter()
            .position(|x| x.metadata.name == pv.metadata.name)
            .ok_or_else(|| err(ApiErrorKind::NotFound))?;
        apply_json_patch(&mut v[i], p)?;
        // The last finalizer of a deleted object gone: so is the object.
        if v[i].metadata.deletion_timestamp.is_some()
            && v[i].metadata.finalizers.as_ref().is_none_or(Vec::is_empty)
        {
            v.remove(i);
        }
        Ok(())
    }
    async fn cached_class(&self, name: &str) -> ApiResult<Option<Arc<StorageClass>>> {
        Ok(self.classes.borrow().get(name).cloned().map(Arc::new))
    }
    async fn create_volume(&self, pv: &PersistentVolume) -> ApiResult<()> {
        if let Some(k) = self.fail_create.take() {
            return Err(err(k));
        }
        let mut v = self.volumes.borrow_mut();
        if v.iter().any(|x| x.metadata.name == pv.metadata.name) {
            return Err(err(ApiErrorKind::AlreadyExists));
        }
        let mut pv = pv.clone();
        pv.metadata.uid = Some(format!("uid-{}", pv.metadata.name.clone().unwrap()));
        pv.metadata.resource_version = Some("1".into());
        v.push(pv);
        Ok(())
    }
    async fn delete_volume(&self, name: &str, uid: &str) -> ApiResult<()> {
        let mut v = self.volumes.borrow_mut();
        let Some(i) = v
            .iter()
            .position(|x| x.metadata.name.as_deref() == Some(name))
        else {
            return Err(err(ApiErrorKind::NotFound));
        };
        if v[i].metadata.uid.as_deref() != Some(uid) {
            return Err(err(ApiErrorKind::Conflict));
        }
        // Held by finalizers: marked deleted only.
        if v[i]
            .metadata
            .finalizers
            .as_ref()
            .is_some_and(|f| !f.is_empty())
        {
            v[i].metadata
                .deletion_timestamp
                .get_or_insert_with(deleted_now);
        } else {
            v.remove(i);
        }
        Ok(())
    }
    async fn unselect_node(&self, namespace: &str, name: &str, node: &str) -> ApiResult<()> {
        for c in self.claims.borrow_mut().iter_mut() {
            if c.metadata.namespace.as_deref() == Some(namespace)
                && c.metadata.name.as_deref() == Some(name)
            {
                let a = c.metadata.annotations.get_or_insert_default();
                if a.get(ANN_SELECTED_NODE).map(String::as_str) == Some(node) {
                    a.remove(ANN_SELECTED_NODE);
                }
            }
        }
        Ok(())
    }
    async fn get_node(&self, name: &str) -> ApiResult<Option<Node>> {
        Ok(self.nodes.borrow().get(name).cloned())
    }
    async fn grow_volume(
        &self,
        name: &str,
        capacity: &Quantity,
        annotations: &BTreeMap<String, String>,
    ) -> ApiResult<()> {
        let mut v = self.volumes.borrow_mut();
        let pv = v
            .iter_mut()
            .find(|x| x.metadata.name.as_deref() == Some(name))
            .ok_or_else(|| err(ApiErrorKind::NotFound))?;
        let a = pv.metadata.annotations.get_or_insert_default();
        a.extend(annotations.clone());
        pv.spec
            .get_or_insert_default()
            .capacity
            .get_or_insert_default()
            .insert("storage".into(), capacity.clone());
        Ok(())
    }
    async fn finish_claim_resize(
        &self,
        namespace: &str,
        name: &str,
        capacity: &Quantity,
    ) -> ApiResult<()> {
        // The real patch body, applied as a merge patch with its resourceVersion precondition.
        let mut claims = self.claims.borrow_mut();
        let c = claims
            .iter_mut()
            .find(|c| {
                c.metadata.namespace.as_deref() == Some(namespace)
                    && c.metadata.name.as_deref() == Some(name)
            })
            .ok_or_else(|| err(ApiErrorKind::NotFound))?;
        let mut doc = serde_json::to_value(&*c).unwrap();
        let patch = crate::provision::cluster::live::finish_resize_patch(&doc, capacity);
        if patch["metadata"]["resourceVersion"] != doc["metadata"]["resourceVersion"] {
            return Err(err(ApiErrorKind::Conflict));
        }
        json_patch::merge(&mut doc, &patch);
        *c = serde_json::from_value(doc).unwrap();
        Ok(())
    }
    async fn event(&self, ev: &EventSpec) -> ApiResult<()> {
        self.events.borrow_mut().push(ev.clone());
        Ok(())
    }
}

fn deleted_now() -> k8s_openapi::apimachinery::pkg::apis::meta::v1::Time {
    k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(k8s_openapi::jiff::Timestamp::now())
}

fn block_on<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(f)
}

fn node(name: &str) -> Node {
    Node {
        metadata: ObjectMeta {
            name: Some(name.into()),
            labels: Some(BTreeMap::from([(
                HOSTNAME_LABEL.to_owned(),
                format!("host-{name}"),
            )])),
            ..Default::default()
        },
        ..Default::default()
    }
}

fn class(name: &str, params: &[(&str, &str)], reclaim: &str) -> StorageClass {
    StorageClass {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        provisioner: PROV.into(),
        parameters: Some(
            params
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        ),
        reclaim_policy: Some(reclaim.into()),
        mount_options: Some(vec!["noatime".into()]),
        volume_binding_mode: Some("WaitForFirstConsumer".into()),
        ..Default::default()
    }
}

fn claim(name: &str, uid: &str, class: &str, node: Option<&str>) -> PersistentVolumeClaim {
    let mut ann = BTreeMap::from([(ANN_PROVISIONER_BETA.to_owned(), PROV.to_owned())]);
    if let Some(n) = node {
        ann.insert(ANN_SELECTED_NODE.into(), n.into());
    }
    PersistentVolumeClaim {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some("ns".into()),
            uid: Some(uid.into()),
            resource_version: Some("7".into()),
            annotations: Some(ann),
            ..Default::default()
        },
        spec: Some(PersistentVolumeClaimSpec {
            access_modes: Some(vec!["ReadWriteOnce".into()]),
            storage_class_name: Some(class.into()),
            resources: Some(VolumeResourceRequirements {
                requests: Some(BTreeMap::from([(
                    "storage".to_owned(),
                    Quantity("1Gi".into()),
                )])),
                ..Default::default()
            }),
            ..Default::default()
        }),
        status: Some(PersistentVolumeClaimStatus {
            phase: Some("Pending".into()),
            ..Default::default()
        }),
    }
}

/// One state directory per first root (the node key, legacy grants), never the node's own.
fn state_dir(roots: &[&Path]) -> PathBuf {
    static STATE: std::sync::LazyLock<tempfile::TempDir> =
        std::sync::LazyLock::new(|| tempfile::tempdir().unwrap());
    let name = roots
        .first()
        .map(|r| r.to_string_lossy().replace('/', "_"))
        .unwrap_or_default();
    STATE.path().join(name)
}

fn config(node: &str, roots: &[&Path]) -> Config {
    Config {
        state_dir: state_dir(roots),
        local_path: LocalPathConfig {
            node_path_map: vec![NodePath {
                node: node.into(),
                paths: roots.iter().map(|p| p.to_path_buf()).collect(),
            }],
            ..Default::default()
        },
        ..Default::default()
    }
}

/// The advice about the hostPath label (whether this host can serve NFS, and so gets advice
/// about that label too, depends on whether it has mount.nfs).
fn hostpath_advice(r: &Report) -> Vec<&String> {
    r.advice
        .iter()
        .filter(|a| a.contains("flexvol/hostpath"))
        .collect()
}

fn setup(node_name: &str) -> Reconciler<Fake> {
    let f = Fake::default();
    f.nodes.borrow_mut().insert("node-a".into(), node("node-a"));
    f.nodes.borrow_mut().insert("node-b".into(), node("node-b"));
    let id = Identity {
        node: node_name.into(),
        vendor: "flexvol".into(),
    };
    let backends = crate::provision::provisioners(&id);
    Reconciler::new(f, id, backends)
}

fn entries(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n != ".flexvol") // the root-only records
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

fn set_phase(rec: &Reconciler<Fake>, pv: &str, phase: &str) {
    for v in rec.cluster.volumes.borrow_mut().iter_mut() {
        if v.metadata.name.as_deref() == Some(pv) {
            v.status = Some(PersistentVolumeStatus {
                phase: Some(phase.into()),
                ..Default::default()
            });
        }
    }
}

fn reasons(rec: &Reconciler<Fake>) -> Vec<&'static str> {
    rec.cluster
        .events
        .borrow()
        .iter()
        .map(|e| e.reason)
        .collect()
}

#[test]
fn provisions_a_claim_on_its_node_with_a_complete_pv() {
    let d = tempfile::tempdir().unwrap();
    let root = std::fs::canonicalize(d.path()).unwrap().join("root"); // created on demand
    let mut rec = setup("node-a");
    rec.cluster.classes.borrow_mut().insert(
        "fast".into(),
        class("fast", &[("uid", "1000"), ("mode", "0750")], "Delete"),
    );
    rec.cluster
        .claims
        .borrow_mut()
        .push(claim("data", "u1", "fast", Some("node-a")));
    let cfg = config("node-a", &[&root]);

    let r = block_on(rec.pass(&cfg));
    assert_eq!(r.failed, Vec::<String>::new());
    let dir = root.join("pvc-u1_ns_data");
    assert_eq!(
        r.provisioned,
        vec![("pvc-u1".to_owned(), dir.display().to_string())]
    );
    // The Node is only read (the Cluster seam has no Node write); the operator is told how to
    // label it, once.
    assert_eq!(rec.cluster.nodes.borrow()["node-a"], node("node-a"));
    let advice = hostpath_advice(&r);
    assert_eq!(advice.len(), 1, "{:?}", r.advice);
    assert!(
        advice[0].contains("kubectl label node node-a flexvol/hostpath=true"),
        "{}",
        advice[0]
    );
    assert_eq!(block_on(rec.pass(&cfg)).advice, Vec::<String>::new());

    // The directory, its ownership and the marker.
    use std::os::unix::fs::MetadataExt;
    let md = std::fs::metadata(&dir).unwrap();
    assert_eq!((md.uid(), md.mode() & 0o7777), (1000, 0o750));
    let m: Marker = serde_json::from_slice(&std::fs::read(dir.join(MARKER)).unwrap()).unwrap();
    assert_eq!((m.volume.as_str(), m.claim_uid.as_str()), ("pvc-u1", "u1"));

    // The PV. Its token binds it to this directory, under this node's key.
    use crate::node::capability::{Key, Location, node_key_path};
    let key = Key::load(&node_key_path(&cfg.state_dir), "made by the pass").unwrap();
    let location = dir.display().to_string();
    let token = key.sign_for("pvc-u1", "ns", &Location::HostPath(&location));
    assert!(!key.verify("pvc-u2", &Location::HostPath(&location), &token));
    let pvs = rec.cluster.volumes.borrow().clone();
    assert_eq!(pvs.len(), 1);
    let pv = serde_json::to_value(&pvs[0]).unwrap();
    let want = serde_json::json!({
        "apiVersion": "v1", "kind": "PersistentVolume",
        "metadata": {"name": "pvc-u1", "uid": "uid-pvc-u1", "resourceVersion": "1",
            "finalizers": [FINALIZER],
            // What this node's watch selects its PVs by.
            "labels": {"flexvol/kind": "hostpath", "flexvol/node": "node-a"},
            "annotations": {
            "pv.kubernetes.io/provisioned-by": PROV, "flexvol/node": "node-a",
            "flexvol/size-bytes": "1073741824", "flexvol/size-enforced": "false",
            "flexvol/size-note": match crate::provision::storage::quota::detect(&dir) {
                crate::provision::storage::quota::Support::NotEnforced(why) => why,
                s => panic!("the test root should have no project quotas: {s:?}"),
            }}},
        "spec": {
            "accessModes": ["ReadWriteOnce"],
            "capacity": {"storage": "1Gi"},
            "claimRef": {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "namespace": "ns",
                         "name": "data", "uid": "u1", "resourceVersion": "7"},
            "flexVolume": {"driver": PROV, "options": {"path": location, "type": "Directory", "capabilityToken": token}},
            "mountOptions": ["noatime"],
            "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                {"key": "kubernetes.io/hostname", "operator": "In", "values": ["host-node-a"]}]}]}},
            "persistentVolumeReclaimPolicy": "Delete",
            "storageClassName": "fast",
            "volumeMode": "Filesystem"
        }
    });
    assert_eq!(pv, want);
    assert_eq!(reasons(&rec), vec!["ProvisioningSucceeded"]);

    // Again: the PV exists, nothing more happens.
    let r = block_on(rec.pass(&cfg));
    let seen = (1, 1); // one claim, one PV in the caches
    assert_eq!(
        r,
        Report {
            seen,
            ..Report::default()
        }
    );
    assert_eq!(rec.cluster.volumes.borrow().len(), 1);
    assert_eq!(reasons(&rec).len(), 1);
}

#[test]
fn claims_for_others_are_left_alone() {
    let d = tempfile::tempdir().unwrap();
    let mut rec = setup("node-a");
    rec.cluster
        .classes
        .borrow_mut()
        .insert("c".into(), class("c", &[], "Delete"));
    let mut other = class("other", &[], "Delete");
    other.provisioner = "rancher.io/local-path".into();
    rec.cluster
        .classes
        .borrow_mut()
        .insert("other".into(), other);
    let mut cl = rec.cluster.claims.borrow_mut();
    cl.push(claim("b", "u-b", "c", Some("node-b"))); // another node
    cl.push(claim("none", "u-n", "c", None)); // not scheduled yet
    cl.push(claim("o", "u-o", "other", Some("node-a"))); // another provisioner's class
    let mut bound = claim("bound", "u-x", "c", Some("node-a"));
    bound.spec.as_mut().unwrap().volume_name = Some("pv-x".into());
    cl.push(bound);
    let mut foreign = claim("f", "u-f", "c", Some("node-a"));
    foreign
        .metadata
        .annotations
        .as_mut()
        .unwrap()
        .insert(ANN_PROVISIONER_BETA.into(), "example.com/x".into());
    cl.push(foreign);
    drop(cl);
    let r = block_on(rec.pass(&config("node-a", &[d.path()])));
    assert_eq!((r.provisioned.len(), r.failed.len()), (0, 0), "{r:?}");
    assert!(rec.cluster.volumes.borrow().is_empty());
    assert!(entries(d.path()).is_empty());
    assert!(rec.cluster.events.borrow().is_empty());
}

#[test]
fn the_ga_annotation_of_1_23_is_accepted_too() {
    let d = tempfile::tempdir().unwrap();
    let mut rec = setup("node-a");
    rec.cluster
        .classes
        .borrow_mut()
        .insert("c".into(), class("c", &[], "Delete"));
    let mut c = claim("data", "u1", "c", Some("node-a"));
    let a = c.metadata.annotations.as_mut().unwrap();
    a.remove(ANN_PROVISIONER_BETA);
    a.insert(ANN_PROVISIONER.into(), PROV.into());
    rec.cluster.claims.borrow_mut().push(c);
    let r = block_on(rec.pass(&config("node-a", &[d.path()])));
    assert_eq!(r.provisioned.len(), 1, "{r:?}");
}

#[test]
fn bad_class_parameters_fail_clearly_and_create_nothing() {
    let d = tempfile::tempdir().unwrap();
    let root = d.path().join("root");
    let mut rec = setup("node-a");
    for (name, params) in [
        ("typo", vec![("pathpattern", "x")]),
        ("escape", vec![("pathPattern", "../{{ .PVName }}")]),
        ("uid", vec![("uid", "root")]),
    ] {
        rec.cluster
            .classes
            .borrow_mut()
            .insert(name.into(), class(name, &params, "Delete"));
        rec.cluster.claims.borrow_mut().push(claim(
            name,
            &format!("u-{name}"),
            name,
            Some("node-a"),
        ));
    }
    let cfg = config("node-a", &[&root]);
    let r = block_on(rec.pass(&cfg));
    assert_eq!(r.failed.len(), 3, "{r:?}");
    assert!(rec.cluster.volumes.borrow().is_empty());
    assert!(entries(&root).is_empty(), "{:?}", entries(&root));
    let ev = rec.cluster.events.borrow().clone();
    assert_eq!(ev.len(), 3);
    for e in &ev {
        assert!(e.warning && e.reason == "ProvisioningFailed", "{e:?}");
        assert!(e.message.contains("nothing was created"), "{}", e.message);
    }
    assert!(
        ev[0]
            .message
            .contains("unknown class parameter \"pathpattern\"")
    );
    assert!(ev[1].message.contains("pathPattern"));
    assert!(ev[2].message.contains("numeric id"));
    // Never provisioned as written (issue #32, 5): sent back, so they hold no node.
    assert!(rec.cluster.claims.borrow().iter().all(|c| {
        !c.metadata
            .annotations
            .as_ref()
            .unwrap()
            .contains_key(ANN_SELECTED_NODE)
    }));
    assert_eq!(r.refused.len(), 3, "{r:?}");
    // Said once, not every pass.
    block_on(rec.pass(&cfg));
    assert_eq!(rec.cluster.events.borrow().len(), 3);
}

#[test]
fn a_class_with_a_csi_driver_gets_csi_pvs_served_and_deleted_by_the_same_rules() {
    let d = tempfile::tempdir().unwrap();
    let root = std::fs::canonicalize(d.path()).unwrap().join("root");
    let mut rec = setup("node-a");
    let mut c = class(
        "csi",
        &[("csiDriver", "hostpath.csi.flexvol.io"), ("uid", "1000")],
        "Delete",
    );
    c.mount_options = None;
    rec.cluster.classes.borrow_mut().insert("csi".into(), c);
    rec.cluster
        .claims
        .borrow_mut()
        .push(claim("data", "u1", "csi", Some("node-a")));
    let cfg = config("node-a", &[&root]);
    let r = block_on(rec.pass(&cfg));
    assert_eq!(r.failed, Vec::<String>::new());
    assert_eq!(r.provisioned.len(), 1, "{r:?}");
    let dir = root.join("pvc-u1_ns_data");
    let location = dir.display().to_string();

    // spec.csi instead of spec.flexVolume: the driver the class names, the PV's name as the
    // handle, the same options (token included) as the volume attributes.
    let pv = rec.cluster.volumes.borrow()[0].clone();
    let spec = pv.spec.as_ref().unwrap();
    assert!(spec.flex_volume.is_none());
    assert_eq!(spec.mount_options, None);
    let csi = spec.csi.as_ref().unwrap();
    assert_eq!(
        (csi.driver.as_str(), csi.volume_handle.as_str()),
        ("hostpath.csi.flexvol.io", "pvc-u1")
    );
    let attrs = csi.volume_attributes.as_ref().unwrap();
    assert_eq!(attrs.get("path"), Some(&location));
    use crate::node::capability::{Key, Location, node_key_path};
    let key = Key::load(&node_key_path(&cfg.state_dir), "made by the pass").unwrap();
    assert_eq!(
        key.sign_for("pvc-u1", "ns", &Location::HostPath(&location)),
        attrs[crate::node::capability::OPTION]
    );
    // The marks node loss and ownership go by are the flexVolume PVs' own.
    let a = pv.metadata.annotations.as_ref().unwrap();
    assert_eq!(a.get(ANN_PROVISIONED_BY).map(String::as_str), Some(PROV));
    assert!(crate::vocab::pv_source_is(&pv, PROV));

    // Released: the directory the attributes name goes, and the PV.
    rec.cluster.claims.borrow_mut().clear();
    set_phase(&rec, "pvc-u1", "Released");
    let r = block_on(rec.pass(&cfg));
    assert_eq!(r.deleted.len(), 1, "{r:?}");
    assert!(entries(&root).is_empty(), "{:?}", entries(&root));
    assert!(rec.cluster.volumes.borrow().is_empty());
}

#[test]
fn a_csi_class_with_a_bad_driver_name_or_mount_options_is_refused_before_anything_exists() {
    let d = tempfile::tempdir().unwrap();
    let root = d.path().join("root");
    let mut rec = setup("node-a");
    let secret = "Not_A/Driver";
    let mut bad_name = class("badname", &[("csiDriver", secret)], "Delete");
    bad_name.mount_options = None;
    // A CSI PV's mountOptions would reach flexvol csi as mount flags, which it refuses.
    let flags = class(
        "flags",
        &[("csiDriver", "hostpath.csi.flexvol.io")],
        "Delete",
    );
    for (name, c) in [("badname", bad_name), ("flags", flags)] {
        rec.cluster.classes.borrow_mut().insert(name.into(), c);
        rec.cluster.claims.borrow_mut().push(claim(
            name,
            &format!("u-{name}"),
            name,
            Some("node-a"),
        ));
    }
    let cfg = config("node-a", &[&root]);
    let r = block_on(rec.pass(&cfg));
    assert_eq!(r.failed.len(), 2, "{r:?}");
    assert!(rec.cluster.volumes.borrow().is_empty());
    assert!(entries(&root).is_empty(), "{:?}", entries(&root));
    let ev = rec.cluster.events.borrow().clone();
    assert_eq!(ev.len(), 2, "{ev:?}");
    assert!(
        ev[0].message.contains("csiDriver is not a CSI driver name"),
        "{}",
        ev[0].message
    );
    assert!(!ev[0].message.contains(secret), "{}", ev[0].message);
    assert!(
        ev[1].message.contains("has mountOptions and csiDriver"),
        "{}",
        ev[1].message
    );
    assert_eq!(r.refused.len(), 2, "{r:?}");
}

#[test]
fn a_node_without_a_root_sends_claims_back_and_keeps_the_operators_label() {
    let d = tempfile::tempdir().unwrap();
    let mut rec = setup("node-b");
    rec.cluster
        .nodes
        .borrow_mut()
        .get_mut("node-b")
        .unwrap()
        .metadata
        .labels
        .as_mut()
        .unwrap()
        .insert(PROV.into(), "true".into()); // the operator's, from an earlier config
    rec.cluster
        .classes
        .borrow_mut()
        .insert("c".into(), class("c", &[], "Delete"));
    rec.cluster
        .claims
        .borrow_mut()
        .push(claim("data", "u1", "c", Some("node-b")));
    // Roots for node-a only, no default entry: node-b has none.
    let r = block_on(rec.pass(&config("node-a", &[d.path()])));
    let advice = hostpath_advice(&r);
    assert_eq!(advice.len(), 1, "{:?}", r.advice);
    assert!(
        advice[0].contains("kubectl label node node-b flexvol/hostpath-"),
        "{}",
        advice[0]
    );
    assert_eq!(
        rec.cluster.nodes.borrow()["node-b"]
            .metadata
            .labels
            .as_ref()
            .unwrap()[PROV],
        "true",
        "the label is the operator's"
    );
    assert_eq!(r.rescheduled, vec!["ns/data".to_owned()]);
    let c = rec.cluster.claims.borrow()[0].clone();
    assert!(
        !c.metadata
            .annotations
            .unwrap()
            .contains_key(ANN_SELECTED_NODE)
    );
    let ev = rec.cluster.events.borrow()[0].clone();
    assert_eq!(ev.reason, "ProvisioningFailed");
    assert!(
        ev.message.contains("the scheduler will pick another node"),
        "{}",
        ev.message
    );
    assert!(rec.cluster.volumes.borrow().is_empty());
}

#[test]
fn a_class_without_a_root_on_this_node_reschedules() {
    let d = tempfile::tempdir().unwrap();
    let mut rec = setup("node-a");
    rec.cluster
        .classes
        .borrow_mut()
        .insert("ssd".into(), class("ssd", &[], "Delete"));
    rec.cluster
        .claims
        .borrow_mut()
        .push(claim("data", "u1", "ssd", Some("node-a")));
    let mut cfg = config("node-a", &[d.path()]);
    cfg.local_path.storage_class_configs.insert(
        "ssd".into(),
        PathMap {
            node_path_map: vec![NodePath {
                node: "node-b".into(),
                paths: vec![PathBuf::from("/ssd")],
            }],
            shared_file_system_path: None,
        },
    );
    let r = block_on(rec.pass(&cfg));
    let advice = hostpath_advice(&r);
    assert!(
        advice.len() == 1 && advice[0].contains("serves flexvol/hostpath"),
        "node-a has a root for other classes: {:?}",
        r.advice
    );
    assert_eq!(r.rescheduled.len(), 1);
    assert!(
        rec.cluster.events.borrow()[0]
            .message
            .contains("no root for StorageClass ssd")
    );
}

#[test]
fn the_root_with_most_free_space_is_chosen() {
    if !nix::unistd::geteuid().is_root() {
        panic!("needs root (tmpfs mounts); run the unit tests as root");
    }
    use nix::mount::{MntFlags, MsFlags, mount, umount2};
    let d = tempfile::tempdir().unwrap();
    let (small, big) = (d.path().join("small"), d.path().join("big"));
    for (p, size) in [(&small, "size=1m"), (&big, "size=8m")] {
        std::fs::create_dir(p).unwrap();
        mount(
            Some("tmpfs"),
            p.as_path(),
            Some("tmpfs"),
            MsFlags::empty(),
            Some(size),
        )
        .unwrap();
    }
    let result = std::panic::catch_unwind(|| {
        for order in [[&small, &big], [&big, &small]] {
            let mut rec = setup("node-a");
            rec.cluster
                .classes
                .borrow_mut()
                .insert("c".into(), class("c", &[], "Delete"));
            let uid = format!("u-{}", order[0].file_name().unwrap().to_str().unwrap());
            rec.cluster
                .claims
                .borrow_mut()
                .push(claim("data", &uid, "c", Some("node-a")));
            let r = block_on(rec.pass(&config("node-a", &[order[0], order[1]])));
            assert_eq!(r.provisioned.len(), 1, "{r:?}");
            assert!(Path::new(&r.provisioned[0].1).starts_with(&big), "{r:?}");
        }
    });
    for p in [&small, &big] {
        umount2(p.as_path(), MntFlags::MNT_DETACH).unwrap();
    }
    result.unwrap();
}

#[test]
fn a_pass_killed_before_the_pv_was_created_converges_to_one_pv_and_one_directory() {
    let d = tempfile::tempdir().unwrap();
    let root = std::fs::canonicalize(d.path()).unwrap();
    let mut rec = setup("node-a");
    rec.cluster
        .classes
        .borrow_mut()
        .insert("c".into(), class("c", &[], "Delete"));
    rec.cluster
        .claims
        .borrow_mut()
        .push(claim("data", "u1", "c", Some("node-a")));
    let cfg = config("node-a", &[&root]);
    // The API call dies (as if the process was killed right before it): directory and marker
    // exist, the PV does not.
    rec.cluster.fail_create.set(Some(ApiErrorKind::Timeout));
    let r = block_on(rec.pass(&cfg));
    assert_eq!(r.failed.len(), 1);
    assert_eq!(entries(&root), vec!["pvc-u1_ns_data"]);
    // A fresh process (no memory of events) finishes it.
    let f = std::mem::take(&mut rec.cluster);
    let backends = crate::provision::provisioners(&rec.id);
    let mut rec = Reconciler::new(f, rec.id.clone(), backends);
    let r = block_on(rec.pass(&cfg));
    assert_eq!(r.provisioned.len(), 1, "{r:?}");
    assert_eq!(entries(&root), vec!["pvc-u1_ns_data"]);
    assert_eq!(rec.cluster.volumes.borrow().len(), 1);

    // Killed after the PV was created but before the cache saw it: the create answers
    // AlreadyExists, which is success since the PV is ours and for this claim.
    let stale_cache = rec.cluster.volumes.borrow().clone();
    rec.cluster
        .server_volumes
        .replace(Some(stale_cache.clone()));
    rec.cluster.volumes.borrow_mut().clear();
    rec.cluster
        .fail_create
        .set(Some(ApiErrorKind::AlreadyExists));
    let r = block_on(rec.pass(&cfg));
    assert_eq!(r.provisioned.len(), 1, "{r:?}");
    assert!(r.failed.is_empty(), "{r:?}");
    assert_eq!(entries(&root), vec!["pvc-u1_ns_data"]);
}

#[test]
fn an_existing_pv_of_someone_else_is_not_taken() {
    let d = tempfile::tempdir().unwrap();
    let mut rec = setup("node-a");
    rec.cluster
        .classes
        .borrow_mut()
        .insert("c".into(), class("c", &[], "Delete"));
    rec.cluster
        .claims
        .borrow_mut()
        .push(claim("data", "u1", "c", Some("node-a")));
    let foreign = PersistentVolume {
        metadata: ObjectMeta {
            name: Some("pvc-u1".into()),
            ..Default::default()
        },
        ..Default::default()
    };
    rec.cluster.server_volumes.replace(Some(vec![foreign]));
    rec.cluster
        .fail_create
        .set(Some(ApiErrorKind::AlreadyExists));
    let r = block_on(rec.pass(&config("node-a", &[d.path()])));
    assert!(r.provisioned.is_empty());
    assert!(
        r.failed[0].contains("not provisioned by flexvol/hostpath"),
        "{r:?}"
    );
}

fn provisioned(reclaim: &str) -> (tempfile::TempDir, PathBuf, Reconciler<Fake>, Config) {
    let d = tempfile::tempdir().unwrap();
    let root = std::fs::canonicalize(d.path()).unwrap();
    let mut rec = setup("node-a");
    rec.cluster
        .classes
        .borrow_mut()
        .insert("c".into(), class("c", &[], reclaim));
    rec.cluster
        .claims
        .borrow_mut()
        .push(claim("data", "u1", "c", Some("node-a")));
    let cfg = config("node-a", &[&root]);
    let r = block_on(rec.pass(&cfg));
    assert_eq!(r.provisioned.len(), 1);
    std::fs::write(root.join("pvc-u1_ns_data/file"), b"data").unwrap();
    rec.cluster.claims.borrow_mut().clear(); // the claim was deleted
    (d, root, rec, cfg)
}

#[test]
fn a_released_delete_pv_loses_directory_and_pv() {
    let (_d, root, mut rec, cfg) = provisioned("Delete");
    // Bound: nothing happens.
    set_phase(&rec, "pvc-u1", "Bound");
    block_on(rec.pass(&cfg));
    assert_eq!(rec.cluster.volumes.borrow().len(), 1);
    // The cache says Released, the server still Bound: the server wins.
    let server = rec.cluster.volumes.borrow().clone();
    set_phase(&rec, "pvc-u1", "Released");
    rec.cluster.server_volumes.replace(Some(server));
    block_on(rec.pass(&cfg));
    assert_eq!(entries(&root), vec!["pvc-u1_ns_data"]);
    rec.cluster.server_volumes.replace(None);
    // Released on both: gone.
    let r = block_on(rec.pass(&cfg));
    assert_eq!(r.deleted.len(), 1, "{:?}", r.deleted);
    assert_eq!(r.deleted[0].0, "pvc-u1");
    assert!(entries(&root).is_empty(), "{:?}", entries(&root));
    assert!(rec.cluster.volumes.borrow().is_empty());
}

#[test]
fn a_directory_gone_already_is_not_an_error() {
    let (_d, root, mut rec, cfg) = provisioned("Delete");
    std::fs::remove_dir_all(root.join("pvc-u1_ns_data")).unwrap();
    set_phase(&rec, "pvc-u1", "Released");
    let r = block_on(rec.pass(&cfg));
    assert_eq!(r.deleted.len(), 1, "{:?}", r.deleted);
    assert_eq!(r.deleted[0].0, "pvc-u1");
    assert!(r.failed.is_empty());
}

#[test]
fn retain_keeps_both() {
    let (_d, root, mut rec, cfg) = provisioned("Retain");
    set_phase(&rec, "pvc-u1", "Released");
    let r = block_on(rec.pass(&cfg));
    assert!(r.deleted.is_empty());
    assert_eq!(entries(&root), vec!["pvc-u1_ns_data"]);
    assert_eq!(rec.cluster.volumes.borrow().len(), 1);
}

#[test]
fn deletes_of_other_nodes_are_not_ours() {
    let (_d, root, rec, cfg) = provisioned("Delete");
    set_phase(&rec, "pvc-u1", "Released");
    let f = rec.cluster;
    let id = Identity {
        node: "node-b".into(),
        vendor: "flexvol".into(),
    };
    let backends = crate::provision::provisioners(&id);
    let mut other = Reconciler::new(f, id, backends);
    block_on(other.pass(&cfg));
    assert_eq!(other.cluster.volumes.borrow().len(), 1);
    assert_eq!(entries(&root), vec!["pvc-u1_ns_data"]);
}

#[test]
fn a_wrong_marker_or_a_path_outside_the_roots_keeps_everything_and_says_why() {
    let (_d, root, mut rec, cfg) = provisioned("Delete");
    set_phase(&rec, "pvc-u1", "Released");
    // The directory was replaced by another one (same name, marker copied): not the one
    // recorded, so not deleted.
    let dir = root.join("pvc-u1_ns_data");
    std::fs::rename(&dir, root.join("moved")).unwrap();
    std::fs::create_dir(&dir).unwrap();
    std::fs::copy(root.join("moved").join(MARKER), dir.join(MARKER)).unwrap();
    std::fs::write(dir.join("data"), b"x").unwrap();
    let r = block_on(rec.pass(&cfg));
    assert!(r.deleted.is_empty());
    assert_eq!(entries(&root.join("pvc-u1_ns_data")).len(), 2);
    assert_eq!(rec.cluster.volumes.borrow().len(), 1);
    let ev = rec.cluster.events.borrow().last().unwrap().clone();
    assert_eq!(
        (ev.reason, ev.kind),
        ("VolumeFailedDelete", "PersistentVolume")
    );
    assert!(
        ev.message
            .contains("not the directory flexvol made for PV pvc-u1"),
        "{}",
        ev.message
    );

    // The PV's path edited to point outside every root.
    for v in rec.cluster.volumes.borrow_mut().iter_mut() {
        let o = v.spec.as_mut().unwrap().flex_volume.as_mut().unwrap();
        o.options
            .as_mut()
            .unwrap()
            .insert("path".into(), "/etc".into());
    }
    let r = block_on(rec.pass(&cfg));
    assert!(r.failed[0].contains("not below a root"), "{r:?}");
    assert!(Path::new("/etc/passwd").exists());
    assert_eq!(rec.cluster.volumes.borrow().len(), 1);

    // The same PV as a CSI PV (its options as volume attributes): read and refused the same way.
    for v in rec.cluster.volumes.borrow_mut().iter_mut() {
        let spec = v.spec.as_mut().unwrap();
        let fv = spec.flex_volume.take().unwrap();
        spec.csi = Some(k8s_openapi::api::core::v1::CSIPersistentVolumeSource {
            driver: "hostpath.csi.flexvol.io".into(),
            volume_handle: "pvc-u1".into(),
            volume_attributes: fv.options,
            ..Default::default()
        });
    }
    let r = block_on(rec.pass(&cfg));
    assert!(r.failed[0].contains("not below a root"), "{r:?}");
    assert!(Path::new("/etc/passwd").exists());
    assert_eq!(rec.cluster.volumes.borrow().len(), 1);
}

#[test]
fn readme_local_path_config_is_a_valid_node_config() {
    // local-path-provisioner's README example, byte for byte.
    let readme = br#"{
        "nodePathMap":[
        {
                "node":"DEFAULT_PATH_FOR_NON_LISTED_NODES",
                "paths":["/opt/local-path-provisioner"]
        },
        {
                "node":"yasker-lp-dev1",
                "paths":["/opt/local-path-provisioner", "/data1"]
        },
        {
                "node":"yasker-lp-dev3",
                "paths":[]
        }
        ]
}"#;
    let c = crate::node::config::Config::parse(Path::new("config.json"), readme).unwrap();
    assert_eq!(
        c.local_path.roots_for("yasker-lp-dev1", "local-path"),
        vec![
            PathBuf::from("/opt/local-path-provisioner"),
            PathBuf::from("/data1")
        ]
    );
    assert!(c.local_path.node_roots("yasker-lp-dev3").is_empty());
    // The roots it names are not allowed roots of the hostPath driver (they hold every claim's
    // volume): the hostPath policy is left as configured.
    assert!(c.hostpath.allowed_roots.is_empty());
    let with =
        br#"{"hostpath":{"allowedRoots":["/srv"]},"nodePathMap":[{"node":"a","paths":["/data"]}]}"#;
    let c = crate::node::config::Config::parse(Path::new("c"), with).unwrap();
    assert_eq!(c.hostpath.allowed_roots, vec![PathBuf::from("/srv")]);
    assert_eq!(c.local_path.all_roots(), vec![PathBuf::from("/data")]);
    // flexvol keys and local-path keys together; a typo in either is still an error.
    let both = br#"{"stateDir":"/s","nodePathMap":[{"node":"a","paths":["/srv"]}]}"#;
    let c = crate::node::config::Config::parse(Path::new("c"), both).unwrap();
    assert_eq!(c.state_dir, Path::new("/s"));
    for bad in [
        &br#"{"statedir":"/s","nodePathMap":[]}"#[..],
        br#"{"nodePathMap":[{"node":"a","paths":["/"]}]}"#,
    ] {
        assert!(crate::node::config::Config::parse(Path::new("c"), bad).is_err());
    }
}

/// A provisioned, Bound claim of class `c` (with `allowVolumeExpansion: expand`) asking for `want`.
fn bound_and_grown(expand: bool, want: &str) -> (tempfile::TempDir, Reconciler<Fake>, Config) {
    bound_and_grown_with(expand, want, &[])
}

/// [`bound_and_grown`] with class parameters `params`.
fn bound_and_grown_with(
    expand: bool,
    want: &str,
    params: &[(&str, &str)],
) -> (tempfile::TempDir, Reconciler<Fake>, Config) {
    let d = tempfile::tempdir().unwrap();
    let root = std::fs::canonicalize(d.path()).unwrap();
    let mut rec = setup("node-a");
    let mut sc = class("c", params, "Delete");
    if params.iter().any(|(k, _)| *k == "csiDriver") {
        // CSI PVs take no mount options.
        sc.mount_options = None;
    }
    sc.allow_volume_expansion = Some(expand);
    rec.cluster.classes.borrow_mut().insert("c".into(), sc);
    rec.cluster
        .claims
        .borrow_mut()
        .push(claim("data", "u1", "c", Some("node-a")));
    let cfg = config("node-a", &[&root]);
    assert_eq!(block_on(rec.pass(&cfg)).provisioned.len(), 1);
    // Bound by the PV controller, then the user asks for more.
    for c in rec.cluster.claims.borrow_mut().iter_mut() {
        let spec = c.spec.as_mut().unwrap();
        spec.volume_name = Some("pvc-u1".into());
        spec.resources
            .as_mut()
            .unwrap()
            .requests
            .as_mut()
            .unwrap()
            .insert("storage".into(), Quantity(want.into()));
        c.status = Some(PersistentVolumeClaimStatus {
            phase: Some("Bound".into()),
            capacity: Some(BTreeMap::from([("storage".into(), Quantity("1Gi".into()))])),
            // What kube-controller-manager's expand controller leaves on a flexVolume claim
            // once it has done its part (its no-op expander).
            conditions: Some(vec![kcm_mark()]),
            ..Default::default()
        });
    }
    set_phase(&rec, "pvc-u1", "Bound");
    (d, rec, cfg)
}

fn kcm_mark() -> k8s_openapi::api::core::v1::PersistentVolumeClaimCondition {
    k8s_openapi::api::core::v1::PersistentVolumeClaimCondition {
        type_: "FileSystemResizePending".into(),
        status: "True".into(),
        ..Default::default()
    }
}

fn set_claim_conditions(
    rec: &Reconciler<Fake>,
    conds: Vec<k8s_openapi::api::core::v1::PersistentVolumeClaimCondition>,
) {
    for c in rec.cluster.claims.borrow_mut().iter_mut() {
        c.status.as_mut().unwrap().conditions = Some(conds.clone());
    }
}

fn pv_size(rec: &Reconciler<Fake>) -> (String, String) {
    let v = rec.cluster.volumes.borrow();
    let pv = &v[0];
    (
        pv.spec.as_ref().unwrap().capacity.as_ref().unwrap()["storage"]
            .0
            .clone(),
        pv.metadata.annotations.as_ref().unwrap()[crate::vocab::ANN_SIZE].clone(),
    )
}

/// The status of the (one) claim as the fake server has it now.
fn claim_status(rec: &Reconciler<Fake>) -> PersistentVolumeClaimStatus {
    rec.cluster.claims.borrow()[0].status.clone().unwrap()
}

fn claim_capacity(rec: &Reconciler<Fake>) -> String {
    claim_status(rec).capacity.unwrap()["storage"].0.clone()
}

/// kcm's last resize write on 1.34+: `allocatedResourceStatuses.storage` is NodeResizePending.
fn mark_node_resize_pending(st: &mut PersistentVolumeClaimStatus) {
    st.allocated_resource_statuses = Some(BTreeMap::from([(
        "storage".into(),
        "NodeResizePending".into(),
    )]));
}

#[test]
fn a_bigger_claim_grows_the_pv_and_records_the_size_on_the_claim() {
    let (_d, mut rec, cfg) = bound_and_grown(true, "2Gi");
    let r = block_on(rec.pass(&cfg));
    assert_eq!(r.resized, vec![("pvc-u1".to_owned(), 2 << 30)], "{r:?}");
    assert_eq!(
        ops(&r),
        vec![(Action::Resize, "hostpath", Outcome::Success)]
    );
    assert_eq!(pv_size(&rec), ("2Gi".into(), (2u64 << 30).to_string()));
    // hostPath: kubelet does not finish a resize (no requiresFSResize): the provisioner does.
    assert_eq!(claim_capacity(&rec), "2Gi");
    assert_eq!(
        reasons(&rec),
        vec!["ProvisioningSucceeded", "VolumeResizeSuccessful"]
    );
    // Converged: the next pass does nothing.
    let r = block_on(rec.pass(&cfg));
    assert!(r.resized.is_empty() && r.failed.is_empty(), "{r:?}");
}

#[test]
fn a_flexvolume_claim_is_recorded_only_once_kcm_has_marked_it_or_after_the_hold() {
    // kube-controller-manager 1.20-1.22 crashes when its conditional claim write fails
    // (kubernetes#111891): flexvol writes the claim only after kcm's last write.
    let (_d, mut rec, cfg) = bound_and_grown(true, "2Gi");
    set_claim_conditions(&rec, vec![]);
    let rv = |rec: &Reconciler<Fake>| rec.cluster.claims.borrow()[0].metadata.clone();
    let before = rv(&rec);
    let r = block_on(rec.pass(&cfg));
    // The volume and the PV grow at once; the claim is not touched, and that is no failure.
    assert_eq!(r.resized, vec![("pvc-u1".to_owned(), 2 << 30)], "{r:?}");
    assert_eq!(pv_size(&rec), ("2Gi".into(), (2u64 << 30).to_string()));
    assert!(r.failed.is_empty(), "{r:?}");
    assert_eq!(r.deferred.len(), 1, "{r:?}");
    assert!(
        r.deferred[0].contains("kube-controller-manager"),
        "{:?}",
        r.deferred
    );
    assert_eq!(claim_capacity(&rec), "1Gi");
    assert_eq!(rv(&rec), before);
    // kcm's intermediate state (its first write done, not its last): still held.
    set_claim_conditions(
        &rec,
        vec![k8s_openapi::api::core::v1::PersistentVolumeClaimCondition {
            type_: "Resizing".into(),
            status: "True".into(),
            ..Default::default()
        }],
    );
    let r = block_on(rec.pass(&cfg));
    assert_eq!(r.deferred.len(), 1, "{r:?}");
    assert_eq!(claim_capacity(&rec), "1Gi");
    // kcm marked it: recorded, conditions cleared.
    set_claim_conditions(&rec, vec![kcm_mark()]);
    let r = block_on(rec.pass(&cfg));
    assert!(r.deferred.is_empty() && r.failed.is_empty(), "{r:?}");
    assert_eq!(claim_capacity(&rec), "2Gi");
    assert!(claim_status(&rec).conditions.unwrap_or_default().is_empty());

    // 1.34+ says the same in allocatedResourceStatuses.
    let (_d, mut rec, cfg) = bound_and_grown(true, "2Gi");
    for c in rec.cluster.claims.borrow_mut().iter_mut() {
        let st = c.status.as_mut().unwrap();
        st.conditions = None;
        mark_node_resize_pending(st);
    }
    let r = block_on(rec.pass(&cfg));
    assert!(r.deferred.is_empty(), "{r:?}");
    assert_eq!(claim_capacity(&rec), "2Gi");

    // An expand controller that never marks it (switched off): recorded after the hold.
    let (_d, mut rec, cfg) = bound_and_grown(true, "2Gi");
    set_claim_conditions(&rec, vec![]);
    rec.resize_hold = std::time::Duration::from_millis(50);
    let r = block_on(rec.pass(&cfg));
    assert_eq!(r.deferred.len(), 1, "{r:?}");
    assert_eq!(claim_capacity(&rec), "1Gi");
    std::thread::sleep(std::time::Duration::from_millis(60));
    let r = block_on(rec.pass(&cfg));
    assert!(r.deferred.is_empty() && r.failed.is_empty(), "{r:?}");
    assert_eq!(claim_capacity(&rec), "2Gi");
    assert!(rec.resize_held.is_empty());

    // A CSI PV: kcm leaves it to an external resizer (flexvol) and writes nothing; not held.
    let (_d, mut rec, cfg) =
        bound_and_grown_with(true, "2Gi", &[("csiDriver", "hostpath.csi.flexvol.io")]);
    assert!(
        rec.cluster.volumes.borrow()[0]
            .spec
            .as_ref()
            .unwrap()
            .csi
            .is_some()
    );
    set_claim_conditions(&rec, vec![]);
    let r = block_on(rec.pass(&cfg));
    assert!(r.deferred.is_empty() && r.failed.is_empty(), "{r:?}");
    assert_eq!(r.resized.len(), 1, "{r:?}");
    assert_eq!(claim_capacity(&rec), "2Gi");
}

#[test]
fn a_resize_the_class_does_not_allow_changes_nothing_and_says_why() {
    let (_d, mut rec, cfg) = bound_and_grown(false, "2Gi");
    let r = block_on(rec.pass(&cfg));
    assert!(r.resized.is_empty(), "{r:?}");
    assert_eq!(pv_size(&rec), ("1Gi".into(), (1u64 << 30).to_string()));
    assert_eq!(claim_capacity(&rec), "1Gi");
    let ev = rec.cluster.events.borrow().last().cloned().unwrap();
    assert_eq!(ev.reason, "VolumeResizeFailed");
    assert!(
        ev.message.contains("allowVolumeExpansion"),
        "{}",
        ev.message
    );
}

#[test]
fn a_resize_killed_after_the_pv_finishes_the_claim_on_the_next_pass() {
    let (_d, mut rec, cfg) = bound_and_grown(true, "2Gi");
    // The PV was grown (annotation and capacity), then the process died.
    let anns = BTreeMap::from([(crate::vocab::ANN_SIZE.to_owned(), (2u64 << 30).to_string())]);
    block_on(
        rec.cluster
            .grow_volume("pvc-u1", &Quantity("2Gi".into()), &anns),
    )
    .unwrap();
    let r = block_on(rec.pass(&cfg));
    assert!(r.resized.is_empty(), "{r:?}");
    assert_eq!(claim_capacity(&rec), "2Gi");
}

#[test]
fn an_instance_that_cannot_serve_a_shared_kind_leaves_its_claims_to_others() {
    let d = tempfile::tempdir().unwrap();
    let mut rec = setup("node-a");
    let mut sc = class(
        "shared",
        &[("server", "192.0.2.1"), ("share", "/x")],
        "Delete",
    );
    sc.provisioner = "flexvol/nfs".into();
    rec.cluster.classes.borrow_mut().insert("shared".into(), sc);
    let mut c = claim("data", "u1", "shared", None);
    c.metadata.annotations = Some(BTreeMap::from([(
        ANN_PROVISIONER_BETA.to_owned(),
        "flexvol/nfs".to_owned(),
    )]));
    rec.cluster.claims.borrow_mut().push(c);
    // No mount.nfs in toolDirs: this instance cannot mount an export.
    let mut cfg = config("node-a", &[d.path()]);
    cfg.tool_dirs = vec![d.path().to_path_buf()];
    let r = block_on(rec.pass(&cfg));
    assert!(r.provisioned.is_empty() && r.failed.is_empty(), "{r:?}");
    assert!(
        rec.cluster.events.borrow().is_empty(),
        "{:?}",
        rec.cluster.events.borrow()
    );
    assert!(rec.cluster.volumes.borrow().is_empty());
}

/// A PV made by the version before capabilities: no `capabilityToken` in its options.
fn legacy_pv(name: &str, kind: &str, node: &str, options: serde_json::Value) -> PersistentVolume {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "uid": format!("uid-{name}"), "annotations": {
            ANN_PROVISIONED_BY: format!("flexvol/{kind}"), ANN_NODE: node}},
        "spec": {"claimRef": {"namespace": "team-a", "name": "data", "uid": "u"},
                 "flexVolume": {"driver": format!("flexvol/{kind}"), "options": options}},
        "status": {"phase": "Bound"}
    }))
    .unwrap()
}

#[test]
fn legacy_pvs_get_a_grant_for_their_claim_and_lose_it_with_the_pv() {
    use crate::node::capability::{LegacyGrant, Location, read_legacy_grant};
    let d = tempfile::tempdir().unwrap();
    let root = std::fs::canonicalize(d.path()).unwrap();
    let cfg = config("node-a", &[&root]);
    let mut rec = setup("node-a");
    let host = root.join("pvc-h_team-a_data").display().to_string();
    let signed = root.join("pvc-t_team-a_data").display().to_string();
    let dir = serde_json::json!({"type": "Directory"});
    let with = |k: &str, v: &str| {
        let mut o = dir.clone();
        o[k] = v.into();
        o
    };
    let mut token = with("path", &signed);
    token["capabilityToken"] = "v1.00".into();
    let signed2 = root.join("pvc-t2_team-a_data").display().to_string();
    let mut token2 = with("path", &signed2);
    token2["capabilityToken"] = "v2.team-a.00".into();
    rec.cluster.volumes.borrow_mut().extend([
        legacy_pv("pvc-h", "hostpath", "node-a", with("path", &host)),
        // Another node's directory: its own provisioner writes that grant.
        legacy_pv("pvc-hb", "hostpath", "node-b", with("path", "/srv/hb")),
        legacy_pv(
            "pvc-l",
            "lvm",
            "node-a",
            serde_json::json!({"volumegroup": "vg0", "volumeID": "pvc-l"}),
        ),
        legacy_pv(
            "pvc-lb",
            "lvm",
            "node-b",
            serde_json::json!({"volumegroup": "vg0", "volumeID": "pvc-lb"}),
        ),
        // NFS: any node mounts it, so every node grants it.
        legacy_pv(
            "pvc-n",
            "nfs",
            "node-b",
            serde_json::json!({"server": "10.0.0.5", "share": "/export/pvc-n"}),
        ),
        // A token older than namespaces (v1): granted its claim's namespace too.
        legacy_pv("pvc-t", "hostpath", "node-a", token),
        // Made by this version: the token names its namespace, and is the grant.
        legacy_pv("pvc-t2", "hostpath", "node-a", token2),
    ]);
    let r = block_on(rec.pass(&cfg));
    assert!(r.failed.is_empty(), "{r:?}");
    let grant = |pv: &str| {
        Some(LegacyGrant {
            pv: pv.into(),
            namespace: "team-a".into(),
        })
    };
    let st = &cfg.state_dir;
    let lvm = |lv| Location::Lvm { vg: "vg0", lv };
    let nfs = Location::Nfs {
        server: "10.0.0.5",
        share: "/export/pvc-n",
    };
    assert_eq!(
        read_legacy_grant(st, &Location::HostPath(&host)),
        grant("pvc-h")
    );
    assert_eq!(read_legacy_grant(st, &lvm("pvc-l")), grant("pvc-l"));
    assert_eq!(read_legacy_grant(st, &nfs), grant("pvc-n"));
    assert_eq!(read_legacy_grant(st, &Location::HostPath("/srv/hb")), None);
    assert_eq!(read_legacy_grant(st, &lvm("pvc-lb")), None);
    assert_eq!(
        read_legacy_grant(st, &Location::HostPath(&signed)),
        grant("pvc-t")
    );
    assert_eq!(read_legacy_grant(st, &Location::HostPath(&signed2)), None);
    assert_eq!(entries(&st.join("legacy-grants")).len(), 4);
    // The drivers' decision: this PV in its namespace, nobody else.
    let key = crate::node::capability::Key::from_bytes(b"unused, no token in these calls..");
    let auth = |pv, ns| {
        crate::node::capability::authorize(
            Ok(&key),
            st,
            &Location::HostPath(&host),
            Some(pv),
            Some(ns),
            None,
        )
    };
    assert!(auth("pvc-h", "team-a").is_ok());
    assert!(auth("pvc-h", "team-b").is_err());
    assert!(auth("pvc-l", "team-a").is_err());

    // Again: nothing changes. Then PVs go away: so do their grants.
    assert!(block_on(rec.pass(&cfg)).failed.is_empty());
    rec.cluster
        .volumes
        .borrow_mut()
        .retain(|v| v.metadata.name.as_deref() == Some("pvc-l"));
    let r = block_on(rec.pass(&cfg));
    assert!(r.failed.is_empty(), "{r:?}");
    assert_eq!(read_legacy_grant(st, &Location::HostPath(&host)), None);
    assert_eq!(read_legacy_grant(st, &nfs), None);
    assert_eq!(read_legacy_grant(st, &lvm("pvc-l")), grant("pvc-l"));
    assert_eq!(entries(&st.join("legacy-grants")).len(), 1);
}

#[test]
fn deleting_a_legacy_volume_removes_its_grant() {
    use crate::node::capability::{Location, read_legacy_grant};
    let (_d, root, mut rec, cfg) = provisioned("Delete");
    // Make it a PV of the old version: no token.
    for v in rec.cluster.volumes.borrow_mut().iter_mut() {
        let fv = v.spec.as_mut().unwrap().flex_volume.as_mut().unwrap();
        fv.options.as_mut().unwrap().remove("capabilityToken");
    }
    let path = root.join("pvc-u1_ns_data").display().to_string();
    assert!(block_on(rec.pass(&cfg)).failed.is_empty());
    assert!(read_legacy_grant(&cfg.state_dir, &Location::HostPath(&path)).is_some());
    set_phase(&rec, "pvc-u1", "Released");
    let r = block_on(rec.pass(&cfg));
    assert_eq!(r.deleted.len(), 1, "{r:?}");
    assert_eq!(
        read_legacy_grant(&cfg.state_dir, &Location::HostPath(&path)),
        None
    );
}

fn selected(rec: &Reconciler<Fake>, name: &str) -> Option<String> {
    rec.cluster
        .claims
        .borrow()
        .iter()
        .find(|c| c.metadata.name.as_deref() == Some(name))
        .and_then(|c| {
            c.metadata
                .annotations
                .as_ref()?
                .get(ANN_SELECTED_NODE)
                .cloned()
        })
}

/// Issue #32, 5: a claim the provisioner can never make as written (each kind of refusal of
/// `plan_claim`, a clone whose source does not exist) is sent back: its `selected-node` is
/// removed, with an event that says why and what to change, and nothing is made. A claim that
/// fails for now (its clone source is not Bound yet, the PV could not be created) keeps its node.
#[test]
fn a_claim_that_can_never_be_made_is_sent_back_and_one_that_waits_keeps_its_node() {
    use k8s_openapi::api::core::v1::TypedLocalObjectReference;
    let d = tempfile::tempdir().unwrap();
    let root = std::fs::canonicalize(d.path()).unwrap();
    let mut rec = setup("node-a");
    rec.cluster
        .classes
        .borrow_mut()
        .insert("c".into(), class("c", &[], "Delete"));
    let source = |name: &str| TypedLocalObjectReference {
        api_group: None,
        kind: "PersistentVolumeClaim".into(),
        name: name.into(),
    };
    type Edit = Box<dyn Fn(&mut PersistentVolumeClaimSpec)>;
    let never: Vec<(&str, &str, Edit)> = vec![
        (
            "rwx",
            "access modes [\"ReadWriteMany\"]",
            Box::new(|s| s.access_modes = Some(vec!["ReadWriteMany".into()])),
        ),
        (
            "block",
            "volumeMode Block",
            Box::new(|s| s.volume_mode = Some("Block".into())),
        ),
        (
            "selector",
            "remove spec.selector",
            Box::new(|s| s.selector = Some(Default::default())),
        ),
        (
            "nosize",
            "requests no storage size",
            Box::new(|s| s.resources = None),
        ),
        (
            "snapshot",
            "dataSource is a",
            Box::new(|s| {
                s.data_source = Some(TypedLocalObjectReference {
                    api_group: Some("snapshot.storage.k8s.io".into()),
                    kind: "VolumeSnapshot".into(),
                    name: "s".into(),
                })
            }),
        ),
        (
            "ghost",
            "ns/nothing does not exist",
            Box::new(move |s| s.data_source = Some(source("nothing"))),
        ),
    ];
    let mut wants = Vec::new();
    for (i, (name, says, edit)) in never.into_iter().enumerate() {
        let mut c = claim(name, &format!("u{i}"), "c", Some("node-a"));
        edit(c.spec.as_mut().unwrap());
        rec.cluster.claims.borrow_mut().push(c);
        wants.push((name, says));
    }
    // Waiting: a clone of a claim that is not Bound yet.
    rec.cluster
        .claims
        .borrow_mut()
        .push(claim("unbound", "u-src", "c", None));
    let mut waiting = claim("waiting", "u-w", "c", Some("node-a"));
    waiting.spec.as_mut().unwrap().data_source = Some(source("unbound"));
    rec.cluster.claims.borrow_mut().push(waiting);
    let cfg = config("node-a", &[&root]);
    let r = block_on(rec.pass(&cfg));
    assert!(
        r.provisioned.is_empty() && rec.cluster.volumes.borrow().is_empty(),
        "{r:?}"
    );
    assert!(entries(&root).is_empty(), "{:?}", entries(&root));
    let events = rec.cluster.events.borrow().clone();
    for (name, says) in &wants {
        assert_eq!(selected(&rec, name), None, "{name}: selected-node kept");
        let ev: Vec<_> = events.iter().filter(|e| e.name == *name).collect();
        assert!(
            ev.len() == 1
                && ev[0].warning
                && ev[0].reason == "ProvisioningFailed"
                && ev[0].message.contains(says)
                && ev[0]
                    .message
                    .contains("selected-node annotation was removed"),
            "{name}: {ev:?}"
        );
    }
    let mut refused = r.refused.clone();
    refused.sort();
    assert_eq!(
        refused,
        [
            "ns/block",
            "ns/ghost",
            "ns/nosize",
            "ns/rwx",
            "ns/selector",
            "ns/snapshot"
        ]
    );
    assert_eq!(selected(&rec, "waiting").as_deref(), Some("node-a"));
    let ev: Vec<_> = events.iter().filter(|e| e.name == "waiting").collect();
    assert!(
        ev.len() == 1 && ev[0].message.contains("not Bound yet; waiting"),
        "{ev:?}"
    );
    assert!(!ev[0].message.contains("removed"), "{ev:?}");
    // Written again by hand: sent back again, the same event not said twice.
    for c in rec.cluster.claims.borrow_mut().iter_mut() {
        if c.metadata.name.as_deref() == Some("rwx") {
            c.metadata
                .annotations
                .as_mut()
                .unwrap()
                .insert(ANN_SELECTED_NODE.into(), "node-a".into());
        }
    }
    let r = block_on(rec.pass(&cfg));
    assert_eq!(r.refused, ["ns/rwx"]);
    assert_eq!(selected(&rec, "rwx"), None);
    assert_eq!(
        rec.cluster
            .events
            .borrow()
            .iter()
            .filter(|e| e.name == "rwx")
            .count(),
        1
    );

    // A failure for now (the API server refused the PV): the claim keeps its node.
    let mut rec = setup("node-a");
    rec.cluster
        .classes
        .borrow_mut()
        .insert("c".into(), class("c", &[], "Delete"));
    rec.cluster
        .claims
        .borrow_mut()
        .push(claim("data", "u1", "c", Some("node-a")));
    rec.cluster.fail_create.set(Some(ApiErrorKind::Timeout));
    let r = block_on(rec.pass(&cfg));
    assert!(
        r.provisioned.is_empty() && r.refused.is_empty() && !r.failed.is_empty(),
        "{r:?}"
    );
    assert_eq!(selected(&rec, "data").as_deref(), Some("node-a"));
}

/// A claim author may set `selected-node` themselves (issue #20, 9a): a node the scheduler would
/// not place their pod on — cordoned, a control-plane node by taint or by label — must not make a
/// volume for it; the claim goes back with an event that says why.
#[test]
fn a_cordoned_or_control_plane_node_sends_a_hand_picked_claim_back_and_makes_nothing() {
    use k8s_openapi::api::core::v1::{NodeSpec, Taint};
    let taint = |key: &str, effect: &str| Taint {
        key: key.into(),
        effect: effect.into(),
        ..Default::default()
    };
    type Make = Box<dyn Fn(&mut Node)>;
    let cases: Vec<(&str, Make)> = vec![
        (
            "cordoned",
            Box::new(|n: &mut Node| {
                n.spec = Some(NodeSpec {
                    unschedulable: Some(true),
                    ..Default::default()
                })
            }),
        ),
        (
            "node-role.kubernetes.io/master",
            Box::new(move |n: &mut Node| {
                n.spec = Some(NodeSpec {
                    taints: Some(vec![taint("node-role.kubernetes.io/master", "NoSchedule")]),
                    ..Default::default()
                })
            }),
        ),
        (
            "node-role.kubernetes.io/control-plane",
            Box::new(move |n: &mut Node| {
                n.spec = Some(NodeSpec {
                    taints: Some(vec![taint(
                        "node-role.kubernetes.io/control-plane",
                        "NoExecute",
                    )]),
                    ..Default::default()
                })
            }),
        ),
        (
            "node-role.kubernetes.io/control-plane",
            Box::new(|n: &mut Node| {
                n.metadata
                    .labels
                    .get_or_insert_default()
                    .insert("node-role.kubernetes.io/control-plane".into(), "".into());
            }),
        ),
        (
            "node-role.kubernetes.io/master",
            Box::new(|n: &mut Node| {
                n.metadata
                    .labels
                    .get_or_insert_default()
                    .insert("node-role.kubernetes.io/master".into(), "".into());
            }),
        ),
    ];
    for (why, make) in cases {
        let d = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(d.path()).unwrap();
        let mut rec = setup("node-a");
        make(rec.cluster.nodes.borrow_mut().get_mut("node-a").unwrap());
        rec.cluster
            .classes
            .borrow_mut()
            .insert("c".into(), class("c", &[], "Delete"));
        rec.cluster
            .claims
            .borrow_mut()
            .push(claim("data", "u1", "c", Some("node-a")));
        let r = block_on(rec.pass(&config("node-a", &[&root])));
        assert_eq!(r.provisioned, vec![], "{why}: provisioned");
        assert_eq!(r.rescheduled, vec!["ns/data".to_owned()], "{why}");
        assert!(rec.cluster.volumes.borrow().is_empty(), "{why}: a PV");
        assert_eq!(entries(&root), Vec::<String>::new(), "{why}: a directory");
        let c = rec.cluster.claims.borrow()[0].clone();
        assert!(
            !c.metadata
                .annotations
                .unwrap()
                .contains_key(ANN_SELECTED_NODE),
            "{why}: selected-node kept"
        );
        let ev = rec.cluster.events.borrow()[0].clone();
        assert_eq!(ev.reason, "ProvisioningFailed");
        assert!(ev.warning);
        assert!(
            ev.message.contains(why) && ev.message.contains("the scheduler will pick another node"),
            "{why}: {}",
            ev.message
        );
    }
    // The same node, schedulable and a worker, provisions (the refusal is the node's state).
    let d = tempfile::tempdir().unwrap();
    let root = std::fs::canonicalize(d.path()).unwrap();
    let mut rec = setup("node-a");
    rec.cluster
        .nodes
        .borrow_mut()
        .get_mut("node-a")
        .unwrap()
        .spec = Some(NodeSpec {
        taints: Some(vec![taint("example.com/gpu", "NoSchedule")]),
        ..Default::default()
    });
    rec.cluster
        .classes
        .borrow_mut()
        .insert("c".into(), class("c", &[], "Delete"));
    rec.cluster
        .claims
        .borrow_mut()
        .push(claim("data", "u1", "c", Some("node-a")));
    let r = block_on(rec.pass(&config("node-a", &[&root])));
    assert_eq!(r.provisioned.len(), 1, "{:?}", r.failed);
}

/// Without its Node (a wrong --node-name, an API error) the instance cannot tell whether its node
/// may make node-local volumes: it makes none, and says why.
#[test]
fn without_its_node_object_no_node_local_volume_is_made() {
    let d = tempfile::tempdir().unwrap();
    let root = std::fs::canonicalize(d.path()).unwrap();
    let mut rec = setup("node-a");
    rec.cluster.nodes.borrow_mut().remove("node-a");
    rec.cluster
        .classes
        .borrow_mut()
        .insert("c".into(), class("c", &[], "Delete"));
    rec.cluster
        .claims
        .borrow_mut()
        .push(claim("data", "u1", "c", Some("node-a")));
    let r = block_on(rec.pass(&config("node-a", &[&root])));
    assert_eq!(r.provisioned, vec![]);
    assert!(rec.cluster.volumes.borrow().is_empty());
    assert_eq!(entries(&root), Vec::<String>::new());
    assert!(
        r.failed
            .iter()
            .any(|f| f.contains("Node node-a does not exist")
                && f.contains("no node-local volume is made")),
        "{:?}",
        r.failed
    );
}

// --- The PV finalizer (issue #22, 3): a Delete PV deleted before its claim -------------------

/// A provisioned claim, Bound to its PV, with a file in its directory; the claim still exists.
fn bound(reclaim: &str) -> (tempfile::TempDir, PathBuf, Reconciler<Fake>, Config) {
    let d = tempfile::tempdir().unwrap();
    let root = std::fs::canonicalize(d.path()).unwrap();
    let mut rec = setup("node-a");
    rec.cluster
        .classes
        .borrow_mut()
        .insert("c".into(), class("c", &[], reclaim));
    rec.cluster
        .claims
        .borrow_mut()
        .push(claim("data", "u1", "c", Some("node-a")));
    let cfg = config("node-a", &[&root]);
    assert_eq!(block_on(rec.pass(&cfg)).provisioned.len(), 1);
    std::fs::write(root.join("pvc-u1_ns_data/file"), b"data").unwrap();
    for c in rec.cluster.claims.borrow_mut().iter_mut() {
        c.spec.as_mut().unwrap().volume_name = Some("pvc-u1".into());
        c.status.as_mut().unwrap().phase = Some("Bound".into());
    }
    set_phase(&rec, "pvc-u1", "Bound");
    (d, root, rec, cfg)
}

/// `kubectl delete pv`: the API server marks it deleted (it carries finalizers).
fn delete_pv(rec: &Reconciler<Fake>) {
    block_on(rec.cluster.delete_volume("pvc-u1", "uid-pvc-u1")).unwrap();
    assert!(
        rec.cluster.volumes.borrow()[0]
            .metadata
            .deletion_timestamp
            .is_some()
    );
}

fn finalizers(rec: &Reconciler<Fake>) -> Vec<String> {
    rec.cluster.volumes.borrow()[0]
        .metadata
        .finalizers
        .clone()
        .unwrap_or_default()
}

#[test]
fn a_delete_pv_deleted_while_bound_loses_its_volume_once_its_claim_is_gone() {
    for released in [true, false] {
        let (_d, root, mut rec, cfg) = bound("Delete");
        assert_eq!(finalizers(&rec), vec![FINALIZER]);
        // Another controller's finalizer too (1.20's pv-protection while bound).
        rec.cluster.volumes.borrow_mut()[0]
            .metadata
            .finalizers
            .as_mut()
            .unwrap()
            .insert(0, "kubernetes.io/pv-protection".into());
        delete_pv(&rec);
        // Bound, its claim there: the volume is kept, the PV held.
        let r = block_on(rec.pass(&cfg));
        assert!(r.deleted.is_empty() && r.failed.is_empty(), "{r:?}");
        assert_eq!(entries(&root), vec!["pvc-u1_ns_data"]);
        assert_eq!(rec.cluster.volumes.borrow().len(), 1);
        // The claim deleted: Released by the PV controller, or not yet (its claim gone is enough).
        rec.cluster.claims.borrow_mut().clear();
        if released {
            set_phase(&rec, "pvc-u1", "Released");
        }
        let r = block_on(rec.pass(&cfg));
        assert_eq!(r.deleted.len(), 1, "released={released}: {r:?}");
        assert!(entries(&root).is_empty(), "{:?}", entries(&root));
        // Only our finalizer went; the other controller's is still there.
        assert_eq!(finalizers(&rec), vec!["kubernetes.io/pv-protection"]);
        let last = rec.cluster.patches.borrow().last().cloned().unwrap();
        assert_eq!(
            last,
            serde_json::json!([
                {"op": "test", "path": "/metadata/finalizers/1", "value": FINALIZER},
                {"op": "remove", "path": "/metadata/finalizers/1"},
            ])
        );
        // Nothing more to do.
        let r = block_on(rec.pass(&cfg));
        assert_eq!(
            Report { seen: (0, 0), ..r },
            Report::default(),
            "nothing done"
        );
    }
}

#[test]
fn a_deleted_pv_whose_claim_the_cache_misses_is_kept_while_the_server_has_it() {
    let (_d, root, mut rec, cfg) = bound("Delete");
    delete_pv(&rec);
    // The watch cache misses the claim, the server has it: kept.
    rec.cluster.cached_claims.replace(Some(Vec::new()));
    let r = block_on(rec.pass(&cfg));
    assert!(r.deleted.is_empty() && r.failed.is_empty(), "{r:?}");
    assert_eq!(entries(&root), vec!["pvc-u1_ns_data"]);
    assert_eq!(rec.cluster.volumes.borrow().len(), 1);
    // A claim of the same name but another uid is not its claim: gone.
    rec.cluster.claims.borrow_mut()[0].metadata.uid = Some("u2".into());
    let r = block_on(rec.pass(&cfg));
    assert_eq!(r.deleted.len(), 1, "{r:?}");
    assert!(entries(&root).is_empty());
}

#[test]
fn a_kill_between_the_volume_and_the_finalizer_converges() {
    let (_d, root, mut rec, cfg) = bound("Delete");
    delete_pv(&rec);
    rec.cluster.claims.borrow_mut().clear();
    set_phase(&rec, "pvc-u1", "Released");
    rec.cluster.fail_unguard.set(Some(ApiErrorKind::Timeout));
    let r = block_on(rec.pass(&cfg));
    assert!(entries(&root).is_empty(), "{:?}", entries(&root));
    assert_eq!(
        rec.cluster.volumes.borrow().len(),
        1,
        "held by the finalizer"
    );
    assert!(
        r.failed[0].contains("finalizer") && r.failed[0].contains("retrying"),
        "{r:?}"
    );
    // The next pass: the volume is gone already (success), the finalizer goes, so does the PV.
    let r = block_on(rec.pass(&cfg));
    assert_eq!(r.deleted.len(), 1, "{r:?}");
    assert!(r.failed.is_empty(), "{r:?}");
    assert!(rec.cluster.volumes.borrow().is_empty());
}

#[test]
fn a_released_pv_deleted_by_the_provisioner_loses_its_finalizer_in_the_same_pass() {
    let (_d, root, mut rec, cfg) = bound("Delete");
    rec.cluster.claims.borrow_mut().clear();
    set_phase(&rec, "pvc-u1", "Released");
    let r = block_on(rec.pass(&cfg));
    assert_eq!(r.deleted.len(), 1, "{r:?}");
    assert!(entries(&root).is_empty());
    assert!(rec.cluster.volumes.borrow().is_empty());
}

#[test]
fn a_deleted_retain_pv_loses_its_finalizer_and_keeps_its_volume() {
    let (_d, root, mut rec, cfg) = bound("Retain");
    delete_pv(&rec);
    // Bound or Released, claim there or not: the volume is never touched.
    let r = block_on(rec.pass(&cfg));
    assert_eq!(r.released, vec!["pvc-u1".to_owned()], "{r:?}");
    assert!(r.deleted.is_empty());
    assert!(rec.cluster.volumes.borrow().is_empty());
    assert_eq!(entries(&root), vec!["pvc-u1_ns_data"]);
    assert_eq!(
        std::fs::read(root.join("pvc-u1_ns_data/file")).unwrap(),
        b"data"
    );
}

#[test]
fn pvs_made_before_the_finalizer_get_it_and_keep_working() {
    let (_d, root, mut rec, cfg) = bound("Delete");
    // As an older version made it: no finalizer; another controller's is there.
    {
        let mut v = rec.cluster.volumes.borrow_mut();
        v[0].metadata.finalizers = Some(vec!["kubernetes.io/pv-protection".into()]);
        v[0].metadata.resource_version = Some("41".into());
    }
    let r = block_on(rec.pass(&cfg));
    assert_eq!(r.protected, vec!["pvc-u1".to_owned()], "{r:?}");
    assert_eq!(
        finalizers(&rec),
        vec![
            "kubernetes.io/pv-protection".to_owned(),
            FINALIZER.to_owned()
        ]
    );
    assert_eq!(
        rec.cluster.patches.borrow()[0],
        serde_json::json!([
            {"op": "test", "path": "/metadata/resourceVersion", "value": "41"},
            {"op": "add", "path": "/metadata/finalizers/-", "value": FINALIZER},
        ])
    );
    let r = block_on(rec.pass(&cfg));
    assert_eq!(
        Report { seen: (0, 0), ..r },
        Report::default(),
        "nothing done"
    );
    // A Released legacy PV is deleted as before (policy Delete).
    rec.cluster.volumes.borrow_mut()[0].metadata.finalizers = None;
    rec.cluster.claims.borrow_mut().clear();
    set_phase(&rec, "pvc-u1", "Released");
    let r = block_on(rec.pass(&cfg));
    assert_eq!(r.deleted.len(), 1, "{r:?}");
    assert!(entries(&root).is_empty());
    assert!(rec.cluster.volumes.borrow().is_empty());
}

#[test]
fn finalizer_patches_never_touch_another_entry_or_a_changed_list() {
    use crate::k8s::patch::{add_finalizer_patch, remove_finalizer_patch};
    let meta = |f: &[&str], rv: &str| ObjectMeta {
        name: Some("pv".into()),
        resource_version: Some(rv.into()),
        finalizers: Some(f.iter().map(|s| s.to_string()).collect()),
        ..Default::default()
    };
    let pv = |m: ObjectMeta| PersistentVolume {
        metadata: m,
        ..Default::default()
    };
    // Read with ours at index 1; meanwhile another controller inserted one before it: the test
    // fails, nothing is removed.
    let read = meta(&["a", FINALIZER, "b"], "5");
    let p = remove_finalizer_patch(&read, crate::vocab::FINALIZER).unwrap();
    let mut now = pv(meta(&["x", "a", FINALIZER, "b"], "6"));
    assert_eq!(
        apply_json_patch(&mut now, p.clone()).unwrap_err().kind,
        ApiErrorKind::Conflict
    );
    assert_eq!(now.metadata.finalizers.as_ref().unwrap().len(), 4);
    // Unchanged: exactly our entry goes.
    let mut same = pv(read.clone());
    apply_json_patch(&mut same, p).unwrap();
    assert_eq!(same.metadata.finalizers.unwrap(), vec!["a", "b"]);
    assert_eq!(
        remove_finalizer_patch(&meta(&["a"], "5"), crate::vocab::FINALIZER),
        None
    );
    // Adding: only onto the list as read (resourceVersion test).
    let p = add_finalizer_patch(&meta(&["a"], "5"), crate::vocab::FINALIZER).unwrap();
    let mut moved = pv(meta(&["a", "b"], "6"));
    assert!(apply_json_patch(&mut moved, p).is_err());
    let p = add_finalizer_patch(
        &ObjectMeta {
            resource_version: Some("5".into()),
            ..Default::default()
        },
        crate::vocab::FINALIZER,
    )
    .unwrap();
    let mut none = pv(meta(&[], "5"));
    none.metadata.finalizers = None;
    apply_json_patch(&mut none, p).unwrap();
    assert_eq!(none.metadata.finalizers.unwrap(), vec![FINALIZER]);
    assert_eq!(
        add_finalizer_patch(&meta(&[FINALIZER], "5"), crate::vocab::FINALIZER),
        None
    );
}

// --- Claim conditions (issue #22, 3): a finished resize removes only its own ----------------

fn fixture(name: &str) -> serde_json::Value {
    let text = match name {
        "claim-1.20-pending" => include_str!("fixtures/claim-1.20-pending.json"),
        "claim-1.20-resizing" => include_str!("fixtures/claim-1.20-resizing.json"),
        "claim-1.34-pending" => include_str!("fixtures/claim-1.34-pending.json"),
        "claim-1.34-ga-only" => include_str!("fixtures/claim-1.34-ga-only.json"),
        "claim-1.34-resizing" => include_str!("fixtures/claim-1.34-resizing.json"),
        "claim-1.36-resizing" => include_str!("fixtures/claim-1.36-resizing.json"),
        "pv-1.35-bound" => include_str!("fixtures/pv-1.35-bound.json"),
        _ => panic!("no fixture {name}"),
    };
    serde_json::from_str(text).unwrap()
}

fn condition_types(claim: &serde_json::Value) -> Vec<String> {
    claim
        .pointer("/status/conditions")
        .and_then(|c| c.as_array())
        .map(|c| {
            c.iter()
                .map(|c| c["type"].as_str().unwrap().to_owned())
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn a_finished_resize_keeps_the_conditions_and_status_of_other_controllers_of_1_34() {
    let before = fixture("claim-1.34-resizing");
    let patch =
        crate::provision::cluster::live::finish_resize_patch(&before, &Quantity("2Gi".into()));
    // Guarded by the claim's resourceVersion; only capacity and conditions written.
    assert_eq!(
        patch["metadata"],
        serde_json::json!({"resourceVersion": "51877"})
    );
    assert_eq!(
        patch["status"]
            .as_object()
            .unwrap()
            .keys()
            .collect::<Vec<_>>(),
        vec!["allocatedResourceStatuses", "capacity", "conditions"]
    );
    let mut after = before.clone();
    json_patch::merge(&mut after, &patch);
    assert_eq!(
        condition_types(&after),
        vec!["ModifyVolumeError", "example.com/BackupReady"]
    );
    // Each kept condition is written back whole, as the server returned it.
    assert_eq!(
        after["status"]["conditions"][0],
        before["status"]["conditions"][1]
    );
    assert_eq!(after["status"]["capacity"]["storage"], "2Gi");
    // The resize is over: no storage entry left in allocatedResourceStatuses (kubelet's finish
    // does the same); allocatedResources kept.
    assert_eq!(
        after["status"]["allocatedResourceStatuses"],
        serde_json::json!({})
    );
    assert_status_kept(&after, &before, &[]);
    assert_eq!(after["spec"], before["spec"]);
}

#[test]
fn a_finished_resize_clears_both_conditions_of_1_20_and_leaves_no_list() {
    let before = fixture("claim-1.20-resizing");
    let patch =
        crate::provision::cluster::live::finish_resize_patch(&before, &Quantity("2Gi".into()));
    assert_eq!(patch["status"]["conditions"], serde_json::Value::Null);
    // 1.20 has no allocatedResourceStatuses: nothing written about it.
    assert!(
        patch["status"].get("allocatedResourceStatuses").is_none(),
        "{patch}"
    );
    let mut after = before.clone();
    json_patch::merge(&mut after, &patch);
    assert!(after["status"].get("conditions").is_none(), "{after}");
    assert_eq!(after["status"]["capacity"]["storage"], "2Gi");
    // No resize condition at all: the list is not written.
    let mut clean = before.clone();
    clean["status"]["conditions"] = serde_json::json!([
        {"type": "example.com/BackupReady", "status": "True"}
    ]);
    let patch =
        crate::provision::cluster::live::finish_resize_patch(&clean, &Quantity("2Gi".into()));
    assert!(patch["status"].get("conditions").is_none(), "{patch}");
}

#[test]
fn a_resize_finished_on_a_1_34_claim_through_the_pass_keeps_other_conditions() {
    let (_d, mut rec, cfg) = bound_and_grown(true, "2Gi");
    // The claim's status as 1.34 has it, with other controllers' conditions.
    let rec34 = fixture("claim-1.34-resizing");
    for c in rec.cluster.claims.borrow_mut().iter_mut() {
        let mut st: PersistentVolumeClaimStatus =
            serde_json::from_value(rec34["status"].clone()).unwrap();
        st.capacity = Some(BTreeMap::from([("storage".into(), Quantity("1Gi".into()))]));
        c.status = Some(st);
    }
    // kcm is in the middle of its part (Resizing, ControllerResizeInProgress): held.
    let r = block_on(rec.pass(&cfg));
    assert_eq!(r.resized.len(), 1, "{r:?}");
    assert_eq!(r.deferred.len(), 1, "{r:?}");
    assert_eq!(claim_capacity(&rec), "1Gi");
    // kcm's last write: Resizing becomes FileSystemResizePending, the status NodeResizePending.
    for c in rec.cluster.claims.borrow_mut().iter_mut() {
        let st = c.status.as_mut().unwrap();
        for cond in st.conditions.as_mut().unwrap() {
            if cond.type_ == "Resizing" {
                cond.type_ = "FileSystemResizePending".into();
            }
        }
        mark_node_resize_pending(st);
    }
    let r = block_on(rec.pass(&cfg));
    assert!(r.deferred.is_empty() && r.failed.is_empty(), "{r:?}");
    assert_eq!(claim_capacity(&rec), "2Gi");
    // NodeResizePending is gone with the resize.
    assert!(
        claim_status(&rec)
            .allocated_resource_statuses
            .is_none_or(|m| m.is_empty())
    );
    let c = serde_json::to_value(&rec.cluster.claims.borrow()[0]).unwrap();
    assert_eq!(
        condition_types(&c),
        vec!["ModifyVolumeError", "example.com/BackupReady"]
    );
}

// --- Provisioner annotations (issue #22, 3): 1.20's beta one, 1.23+'s GA one, both ----------

fn from_fixture(name: &str) -> PersistentVolumeClaim {
    serde_json::from_value(fixture(name)).unwrap()
}

#[test]
fn recorded_claims_of_1_20_and_1_34_are_provisioned_whichever_annotations_they_carry() {
    for name in [
        "claim-1.20-pending",
        "claim-1.34-pending",
        "claim-1.34-ga-only",
    ] {
        let d = tempfile::tempdir().unwrap();
        let mut rec = setup("node-a");
        rec.cluster.classes.borrow_mut().insert(
            "flexvol-hostpath".into(),
            class("flexvol-hostpath", &[], "Delete"),
        );
        let c = from_fixture(name);
        let uid = c.metadata.uid.clone().unwrap();
        rec.cluster.claims.borrow_mut().push(c);
        let r = block_on(rec.pass(&config("node-a", &[d.path()])));
        assert_eq!(r.failed, Vec::<String>::new(), "{name}");
        assert_eq!(r.provisioned.len(), 1, "{name}: {r:?}");
        assert_eq!(r.provisioned[0].0, format!("pvc-{uid}"), "{name}");
    }
}

#[test]
fn the_ga_annotation_wins_when_the_two_disagree() {
    let c = from_fixture("claim-1.34-pending");
    assert_eq!(claim_provisioner(&c.metadata), Some(PROV));
    let mut other = c.clone();
    other
        .metadata
        .annotations
        .as_mut()
        .unwrap()
        .insert(ANN_PROVISIONER.into(), "example.com/other".into());
    assert_eq!(
        claim_provisioner(&other.metadata),
        Some("example.com/other")
    );
    // Not ours: nothing made.
    let d = tempfile::tempdir().unwrap();
    let mut rec = setup("node-a");
    rec.cluster.classes.borrow_mut().insert(
        "flexvol-hostpath".into(),
        class("flexvol-hostpath", &[], "Delete"),
    );
    rec.cluster.claims.borrow_mut().push(other);
    let r = block_on(rec.pass(&config("node-a", &[d.path()])));
    assert!(r.provisioned.is_empty(), "{r:?}");
    let beta_only = from_fixture("claim-1.20-pending");
    assert_eq!(claim_provisioner(&beta_only.metadata), Some(PROV));
    let ga_only = from_fixture("claim-1.34-ga-only");
    assert_eq!(claim_provisioner(&ga_only.metadata), Some(PROV));
    assert!(
        !ga_only
            .metadata
            .annotations
            .as_ref()
            .unwrap()
            .contains_key(ANN_PROVISIONER_BETA)
    );
}

// --- Immediate binding on a node-local class (issue #22, 3) ----------------------------------

#[test]
fn a_node_local_class_with_immediate_binding_is_reported_once_per_claim() {
    let d = tempfile::tempdir().unwrap();
    let root = std::fs::canonicalize(d.path()).unwrap();
    let mut rec = setup("node-a");
    for (name, mode) in [("now", Some("Immediate")), ("unset", None)] {
        let mut sc = class(name, &[], "Delete");
        sc.volume_binding_mode = mode.map(Into::into);
        rec.cluster.classes.borrow_mut().insert(name.into(), sc);
        rec.cluster.claims.borrow_mut().push(claim(
            &format!("c-{name}"),
            &format!("u-{name}"),
            name,
            None,
        ));
    }
    // A WaitForFirstConsumer claim still waiting for its pod: nothing said.
    rec.cluster
        .classes
        .borrow_mut()
        .insert("wffc".into(), class("wffc", &[], "Delete"));
    rec.cluster
        .claims
        .borrow_mut()
        .push(claim("c-wait", "u-wait", "wffc", None));
    let cfg = config("node-a", &[&root]);
    let r = block_on(rec.pass(&cfg));
    assert!(r.provisioned.is_empty(), "{r:?}");
    let evs = rec.cluster.events.borrow().clone();
    assert_eq!(evs.len(), 2, "{evs:?}");
    for (ev, (name, mode)) in evs
        .iter()
        .zip([("now", "Immediate"), ("unset", "Immediate")])
    {
        assert_eq!((ev.reason, ev.warning), ("ProvisioningFailed", true));
        assert_eq!(ev.name, format!("c-{name}"));
        assert!(
            ev.message.contains(&format!("volumeBindingMode {mode}"))
                && ev
                    .message
                    .contains("volumeBindingMode: WaitForFirstConsumer")
                && ev.message.contains("selected-node"),
            "{}",
            ev.message
        );
    }
    // Once per claim, not every pass.
    block_on(rec.pass(&cfg));
    block_on(rec.pass(&cfg));
    assert_eq!(rec.cluster.events.borrow().len(), 2);
    // A restarted instance says it once more, then no more.
    let f = std::mem::take(&mut rec.cluster);
    let id = rec.id.clone();
    let backends = crate::provision::provisioners(&id);
    let mut again = Reconciler::new(f, id, backends);
    block_on(again.pass(&cfg));
    block_on(again.pass(&cfg));
    assert_eq!(again.cluster.events.borrow().len(), 4);
    // The instance that says it is the one holding the flexvol-claims Lease, whose cache alone
    // keeps these claims (cache::Scope::keep_claim): it says it whether or not it serves the
    // kind (no root here), since the class is wrong wherever it is read.
    let f = std::mem::take(&mut again.cluster);
    f.events.borrow_mut().clear();
    let id = Identity {
        node: "node-b".into(),
        vendor: "flexvol".into(),
    };
    let backends = crate::provision::provisioners(&id);
    let mut other = Reconciler::new(f, id, backends);
    block_on(other.pass(&config("node-a", &[&root])));
    assert_eq!(other.cluster.events.borrow().len(), 2);
}

/// What a report's ops say, without the durations.
fn ops(r: &Report) -> Vec<(Action, &'static str, Outcome)> {
    r.ops
        .iter()
        .map(|o| (o.action, o.kind, o.outcome))
        .collect()
}

#[test]
fn a_pass_reports_each_attempt_with_its_kind_and_outcome() {
    let d = tempfile::tempdir().unwrap();
    let root = std::fs::canonicalize(d.path()).unwrap();
    let mut rec = setup("node-a");
    rec.cluster
        .classes
        .borrow_mut()
        .insert("c".into(), class("c", &[], "Delete"));
    rec.cluster
        .classes
        .borrow_mut()
        .insert("bad".into(), class("bad", &[("uid", "root")], "Delete"));
    for (name, uid, class, node) in [
        ("data", "u1", "c", "node-a"),
        ("other", "u2", "c", "node-b"),
        ("typo", "u3", "bad", "node-a"),
    ] {
        rec.cluster
            .claims
            .borrow_mut()
            .push(claim(name, uid, class, Some(node)));
    }
    let cfg = config("node-a", &[&root]);
    let r = block_on(rec.pass(&cfg));
    assert_eq!(
        ops(&r),
        vec![
            (Action::Provision, "hostpath", Outcome::Success),
            (Action::Provision, "hostpath", Outcome::Failure),
        ]
    );
    assert_eq!(r.seen, (3, 0));
    // Done is done: the next pass attempts only the failing claim again.
    rec.cluster
        .claims
        .borrow_mut()
        .retain(|c| c.metadata.name.as_deref() != Some("typo"));
    assert_eq!(ops(&block_on(rec.pass(&cfg))), vec![]);
    rec.cluster.claims.borrow_mut().clear();
    set_phase(&rec, "pvc-u1", "Released");
    let r = block_on(rec.pass(&cfg));
    assert_eq!(
        ops(&r),
        vec![(Action::Delete, "hostpath", Outcome::Success)]
    );
    assert_eq!(r.seen, (0, 1));

    // A node without a root sends the claim back.
    let mut rec = setup("node-b");
    rec.cluster
        .classes
        .borrow_mut()
        .insert("c".into(), class("c", &[], "Delete"));
    rec.cluster
        .claims
        .borrow_mut()
        .push(claim("data", "u1", "c", Some("node-b")));
    let r = block_on(rec.pass(&config("node-a", &[d.path()])));
    assert_eq!(
        ops(&r),
        vec![(Action::Provision, "hostpath", Outcome::Rescheduled)]
    );
}

/// A shared backend whose server `dead` never answers: every provision on it is
/// [`Refusal::Unavailable`]; on server `wordy` a step fails with a [`Refusal::Fail`] whose message
/// reads like a dead server's; counts the attempts per server.
struct Servers {
    dead: &'static str,
    wordy: &'static str,
    attempts: std::rc::Rc<RefCell<BTreeMap<String, u32>>>,
}

impl crate::provision::storage::Provisioner for Servers {
    fn kind(&self) -> &'static crate::provision::storage::Kind {
        &crate::provision::storage::nfs::KIND
    }
    fn serves(&self, _: &Config, _: &str) -> bool {
        true
    }
    fn check_class(&self, _: &BTreeMap<String, String>) -> Result<(), ClassError> {
        Ok(())
    }
    fn fault_domain(&self, params: &BTreeMap<String, String>) -> Option<String> {
        params.get("server").cloned()
    }
    fn provision(
        &mut self,
        _: &Config,
        req: &crate::provision::storage::Request<'_>,
    ) -> Result<crate::provision::storage::Provisioned, crate::provision::storage::Refusal> {
        let server = req.params["server"].clone();
        *self
            .attempts
            .borrow_mut()
            .entry(server.clone())
            .or_default() += 1;
        if server == self.dead {
            return Err(crate::provision::storage::Refusal::Unavailable(format!(
                "NFS server {server} did not answer within 30s"
            )));
        }
        if server == self.wordy {
            return Err(crate::provision::storage::Refusal::Fail(format!(
                "cannot create the volume's directory in {server}:/x: NFS server {server} did not answer within 30s: unreachable, mount timed out"
            )));
        }
        Ok(crate::provision::storage::Provisioned {
            capacity_bytes: req.size_bytes,
            location: format!("{server}:/x/{}", req.pv_name),
            ..Default::default()
        })
    }
    fn delete(&mut self, _: &Config, _: &PersistentVolume) -> Result<String, ProvisionError> {
        Ok("gone".into())
    }
    fn expand(&mut self, _: &Config, _: &PersistentVolume, b: u64) -> Result<u64, ProvisionError> {
        Ok(b)
    }
    fn recover(&mut self, _: &Config, _: &str) -> Vec<String> {
        Vec::new()
    }
}

use crate::provision::storage::ProvisionError;

#[test]
fn a_dead_server_costs_one_attempt_and_holds_up_no_other_server() {
    let d = tempfile::tempdir().unwrap();
    let f = Fake::default();
    f.nodes.borrow_mut().insert("node-a".into(), node("node-a"));
    let id = Identity {
        node: "node-a".into(),
        vendor: "flexvol".into(),
    };
    let attempts = std::rc::Rc::new(RefCell::new(BTreeMap::new()));
    let backend = Servers {
        dead: "tarpit",
        wordy: "",
        attempts: attempts.clone(),
    };
    let mut rec = Reconciler::new(f, id, vec![Box::new(backend)]);
    for server in ["tarpit", "healthy"] {
        let mut sc = class(server, &[("server", server)], "Delete");
        sc.provisioner = "flexvol/nfs".into();
        sc.volume_binding_mode = Some("Immediate".into());
        rec.cluster.classes.borrow_mut().insert(server.into(), sc);
    }
    let nfs_claim = |name: &str, uid: &str, class: &str| {
        let mut c = claim(name, uid, class, None);
        c.metadata.annotations = Some(BTreeMap::from([(
            ANN_PROVISIONER.to_owned(),
            "flexvol/nfs".to_owned(),
        )]));
        c
    };
    for i in 0..5 {
        rec.cluster.claims.borrow_mut().push(nfs_claim(
            &format!("t{i}"),
            &format!("t{i}"),
            "tarpit",
        ));
    }
    rec.cluster
        .claims
        .borrow_mut()
        .push(nfs_claim("h", "h", "healthy"));
    let cfg = config("node-a", &[d.path()]);
    let r = block_on(rec.pass(&cfg));
    // One attempt on the dead server; the other four claims fail fast; the healthy server's
    // claim is provisioned in the same pass.
    assert_eq!(attempts.borrow()["tarpit"], 1, "{r:?}");
    assert_eq!(attempts.borrow()["healthy"], 1);
    assert_eq!(r.provisioned.len(), 1, "{r:?}");
    assert_eq!(r.provisioned[0].0, "pvc-h");
    let paused: Vec<&String> = r
        .failed
        .iter()
        .filter(|f| f.contains("not tried"))
        .collect();
    assert_eq!(paused.len(), 4, "{:?}", r.failed);
    assert!(
        paused[0].contains("did not answer within 30s"),
        "{}",
        paused[0]
    );
    assert_eq!(rec.breakers_open(), 1);
    // Each claim is told why, once (the same message again is not a new event).
    let events = |rec: &Reconciler<Fake>| {
        rec.cluster
            .events
            .borrow()
            .iter()
            .filter(|e| e.reason == "ProvisioningFailed")
            .count()
    };
    assert_eq!(events(&rec), 5);
    // The next passes, within the breaker's delay: no new attempt; the first claim is told once
    // that its server's work now waits, and nothing is said again after that.
    let _ = block_on(rec.pass(&cfg));
    assert_eq!(attempts.borrow()["tarpit"], 1);
    assert_eq!(events(&rec), 6);
    let _ = block_on(rec.pass(&cfg));
    assert_eq!(attempts.borrow()["tarpit"], 1);
    assert_eq!(events(&rec), 6);
}

#[test]
fn only_a_typed_server_failure_opens_the_breaker_never_its_words() {
    // A step failure whose message says "did not answer", "unreachable", "mount timed out" is
    // not the server's: each claim on that server is still tried, no breaker opens.
    let d = tempfile::tempdir().unwrap();
    let f = Fake::default();
    f.nodes.borrow_mut().insert("node-a".into(), node("node-a"));
    let id = Identity {
        node: "node-a".into(),
        vendor: "flexvol".into(),
    };
    let attempts = std::rc::Rc::new(RefCell::new(BTreeMap::new()));
    let backend = Servers {
        dead: "",
        wordy: "busy",
        attempts: attempts.clone(),
    };
    let mut rec = Reconciler::new(f, id, vec![Box::new(backend)]);
    let mut sc = class("busy", &[("server", "busy")], "Delete");
    sc.provisioner = "flexvol/nfs".into();
    sc.volume_binding_mode = Some("Immediate".into());
    rec.cluster.classes.borrow_mut().insert("busy".into(), sc);
    for i in 0..3 {
        let mut c = claim(&format!("b{i}"), &format!("b{i}"), "busy", None);
        c.metadata.annotations = Some(BTreeMap::from([(
            ANN_PROVISIONER.to_owned(),
            "flexvol/nfs".to_owned(),
        )]));
        rec.cluster.claims.borrow_mut().push(c);
    }
    let r = block_on(rec.pass(&config("node-a", &[d.path()])));
    assert_eq!(attempts.borrow()["busy"], 3, "{r:?}");
    assert_eq!(rec.breakers_open(), 0, "{r:?}");
    assert_eq!(r.failed.len(), 3, "{r:?}");
    assert!(
        r.failed.iter().all(|f| !f.contains("not tried")),
        "{:?}",
        r.failed
    );
}

#[test]
fn a_key_is_synced_from_the_cache_and_a_gone_object_is_nothing_to_do() {
    let d = tempfile::tempdir().unwrap();
    let mut rec = setup("node-a");
    let cfg = config("node-a", &[d.path()]);
    rec.cluster
        .classes
        .borrow_mut()
        .insert("c".into(), class("c", &[], "Delete"));
    rec.cluster
        .claims
        .borrow_mut()
        .push(claim("data", "u1", "c", Some("node-a")));
    let _ = block_on(rec.refresh(&cfg));
    let r = block_on(rec.sync(&Key::Claim("ns/gone".into()), &cfg));
    assert_eq!(r, Report::default());
    let r = block_on(rec.sync(&Key::Volume("pvc-gone".into()), &cfg));
    assert_eq!(r, Report::default());
    let r = block_on(rec.sync(&Key::Claim("ns/data".into()), &cfg));
    assert_eq!(r.failed, Vec::<String>::new());
    assert_eq!(r.provisioned.len(), 1);
    assert_eq!(rec.cluster.volumes.borrow().len(), 1);
}

#[test]
fn node_names_that_are_not_label_values_are_hashed() {
    assert_eq!(node_label_value("node-a.example.com"), "node-a.example.com");
    let long = "n".repeat(64);
    let h = node_label_value(&long);
    assert!(h.starts_with("h-") && h.len() == 18, "{h}");
    assert_ne!(h, node_label_value(&"n".repeat(65)));
    assert_eq!(h, node_label_value(&long));
    assert!(node_label_value("-x").starts_with("h-"));
}

#[test]
fn the_sweep_labels_our_old_pvs_and_only_this_nodes_node_local_ones() {
    let d = tempfile::tempdir().unwrap();
    let rec = setup("node-a");
    let cfg = config("node-a", &[d.path()]);
    let opts = serde_json::json!({"path": "/x", "capabilityToken": "t"});
    let nfs = serde_json::json!({"server": "s", "share": "/e/x", "capabilityToken": "t"});
    rec.cluster.volumes.borrow_mut().extend([
        legacy_pv("pvc-mine", "hostpath", "node-a", opts.clone()),
        legacy_pv("pvc-theirs", "hostpath", "node-b", opts),
        legacy_pv("pvc-nfs", "nfs", "node-b", nfs),
    ]);
    let kinds = crate::provision::lanes::all_kinds(&rec.id);
    let mut r = Report::default();
    block_on(crate::provision::lanes::sweep(&rec, &kinds, &cfg, &mut r));
    assert_eq!(r.failed, Vec::<String>::new());
    assert_eq!(r.labelled, ["pvc-mine", "pvc-nfs"]);
    let labels = |n: usize| rec.cluster.volumes.borrow()[n].metadata.labels.clone();
    assert_eq!(
        labels(0),
        Some(BTreeMap::from([
            ("flexvol/kind".to_owned(), "hostpath".to_owned()),
            ("flexvol/node".to_owned(), "node-a".to_owned())
        ]))
    );
    assert_eq!(labels(1), None);
    assert_eq!(
        labels(2),
        Some(BTreeMap::from([(
            "flexvol/kind".to_owned(),
            "nfs".to_owned()
        )]))
    );
    // Labelled ones are not labelled again.
    let mut r = Report::default();
    block_on(crate::provision::lanes::sweep(&rec, &kinds, &cfg, &mut r));
    assert!(r.labelled.is_empty(), "{r:?}");
}

/// Issue #24, 4: a claim with `dataSource` naming a provisioned claim of its namespace gets a
/// copy; one of another namespace naming it gets an event and nothing (its source is looked up
/// in its own namespace only); one asking less than the source's size too.
#[test]
fn a_clone_copies_a_claim_of_its_namespace_and_never_another_tenants() {
    let d = tempfile::tempdir().unwrap();
    let root = std::fs::canonicalize(d.path()).unwrap();
    let mut rec = setup("node-a");
    rec.cluster
        .classes
        .borrow_mut()
        .insert("c".into(), class("c", &[], "Delete"));
    rec.cluster
        .claims
        .borrow_mut()
        .push(claim("src", "u1", "c", Some("node-a")));
    let cfg = config("node-a", &[&root]);
    let r = block_on(rec.pass(&cfg));
    assert_eq!(r.provisioned.len(), 1, "{r:?}");
    std::fs::write(root.join("pvc-u1_ns_src/data"), b"tenant a's").unwrap();
    // The PV controller binds it.
    for c in rec.cluster.claims.borrow_mut().iter_mut() {
        c.spec.as_mut().unwrap().volume_name = Some("pvc-u1".into());
        c.status.as_mut().unwrap().phase = Some("Bound".into());
    }
    let with_source = |name: &str, uid: &str, ns: &str, size: &str| {
        let mut c = claim(name, uid, "c", Some("node-a"));
        c.metadata.namespace = Some(ns.into());
        let spec = c.spec.as_mut().unwrap();
        spec.data_source = Some(k8s_openapi::api::core::v1::TypedLocalObjectReference {
            api_group: None,
            kind: "PersistentVolumeClaim".into(),
            name: "src".into(),
        });
        spec.resources.as_mut().unwrap().requests = Some(BTreeMap::from([(
            "storage".to_owned(),
            Quantity(size.into()),
        )]));
        c
    };
    {
        let mut claims = rec.cluster.claims.borrow_mut();
        claims.push(with_source("copy", "u2", "ns", "1Gi"));
        claims.push(with_source("steal", "u3", "other", "1Gi"));
        claims.push(with_source("small", "u4", "ns", "1Mi"));
    }
    let r = block_on(rec.pass(&cfg));
    assert_eq!(
        r.provisioned,
        vec![(
            "pvc-u2".to_owned(),
            root.join("pvc-u2_ns_copy").display().to_string()
        )],
        "{r:?}"
    );
    assert_eq!(
        std::fs::read(root.join("pvc-u2_ns_copy/data")).unwrap(),
        b"tenant a's"
    );
    assert_eq!(entries(&root), vec!["pvc-u1_ns_src", "pvc-u2_ns_copy"]);
    let names: Vec<String> = rec
        .cluster
        .volumes
        .borrow()
        .iter()
        .filter_map(|v| v.metadata.name.clone())
        .collect();
    assert_eq!(names, vec!["pvc-u1", "pvc-u2"]);
    let events = rec.cluster.events.borrow().clone();
    let failed = |name: &str| {
        events
            .iter()
            .filter(|e| e.name == name && e.reason == "ProvisioningFailed")
            .map(|e| e.message.clone())
            .collect::<Vec<_>>()
    };
    let steal = failed("steal");
    assert!(
        steal.len() == 1 && steal[0].contains("its source claim other/src does not exist"),
        "{steal:?}"
    );
    let small = failed("small");
    assert!(
        small.len() == 1 && small[0].contains("less than its source ns/src"),
        "{small:?}"
    );
    let pv2 = rec.cluster.volumes.borrow()[1].clone();
    let note = pv2.metadata.annotations.unwrap()["flexvol/cloned-from"].clone();
    assert!(note.starts_with("pvc-u1 (1 files"), "{note}");
}

/// Issue #35, 2: clones work for CSI PVs as for flexVolume ones: the source's directory read from
/// its CSI PV's volume attributes, the copy made, and the clone a CSI PV of the class's driver
/// with its own handle and token.
#[test]
fn a_clone_of_a_csi_pvs_claim_is_a_csi_pv_with_the_data() {
    let d = tempfile::tempdir().unwrap();
    let root = std::fs::canonicalize(d.path()).unwrap();
    let mut rec = setup("node-a");
    let mut c = class("csi", &[("csiDriver", "hostpath.csi.flexvol.io")], "Delete");
    c.mount_options = None;
    rec.cluster.classes.borrow_mut().insert("csi".into(), c);
    rec.cluster
        .claims
        .borrow_mut()
        .push(claim("src", "u1", "csi", Some("node-a")));
    let cfg = config("node-a", &[&root]);
    let r = block_on(rec.pass(&cfg));
    assert_eq!(r.provisioned.len(), 1, "{r:?}");
    std::fs::write(root.join("pvc-u1_ns_src/data"), b"tenant a's").unwrap();
    for c in rec.cluster.claims.borrow_mut().iter_mut() {
        c.spec.as_mut().unwrap().volume_name = Some("pvc-u1".into());
        c.status.as_mut().unwrap().phase = Some("Bound".into());
    }
    let mut copy = claim("copy", "u2", "csi", Some("node-a"));
    copy.spec.as_mut().unwrap().data_source =
        Some(k8s_openapi::api::core::v1::TypedLocalObjectReference {
            api_group: None,
            kind: "PersistentVolumeClaim".into(),
            name: "src".into(),
        });
    rec.cluster.claims.borrow_mut().push(copy);
    let r = block_on(rec.pass(&cfg));
    assert_eq!(r.provisioned.len(), 1, "{r:?}");
    assert_eq!(
        std::fs::read(root.join("pvc-u2_ns_copy/data")).unwrap(),
        b"tenant a's"
    );
    let vols = rec.cluster.volumes.borrow();
    let (src, pv2) = (&vols[0], &vols[1]);
    let csi = |v: &PersistentVolume| v.spec.as_ref().unwrap().csi.clone().unwrap();
    assert!(pv2.spec.as_ref().unwrap().flex_volume.is_none());
    assert_eq!(
        (csi(pv2).driver.as_str(), csi(pv2).volume_handle.as_str()),
        ("hostpath.csi.flexvol.io", "pvc-u2")
    );
    let attrs = |v: &PersistentVolume| csi(v).volume_attributes.unwrap();
    assert_eq!(
        attrs(pv2)["path"],
        root.join("pvc-u2_ns_copy").display().to_string()
    );
    assert_ne!(attrs(pv2)["capabilityToken"], attrs(src)["capabilityToken"]);
    let note = pv2.metadata.annotations.as_ref().unwrap()["flexvol/cloned-from"].clone();
    assert!(note.starts_with("pvc-u1 (1 files"), "{note}");
}

/// The capacity publisher measures this node's roots, builds a valid record for it, stamped with
/// the given time, and writes it through the API seam.
#[test]
fn capacity_is_published_for_this_node() {
    let d = tempfile::tempdir().unwrap();
    let cfg = Config {
        local_path: serde_json::from_value(serde_json::json!({
            "nodePathMap": [{"node": "node-a", "paths": [d.path()]}]
        }))
        .unwrap(),
        ..Config::default()
    };
    let f = Fake::default();
    let at = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_795_000_000);
    let m = crate::provision::capacity::measure(
        &cfg,
        "node-a",
        "flexvol/lvm",
        crate::provision::capacity::Detail::Record,
    );
    let failed = block_on(crate::provision::capacity::publish(
        &f, &cfg, "node-a", &m, at,
    ));
    assert_eq!(failed, Vec::<String>::new());
    let published = f.published.borrow();
    assert_eq!(published.len(), 1);
    assert_eq!(published[0].0, "node-a");
    let r = crate::vocab::capacity::parse("node-a", Some(&published[0].1)).unwrap();
    assert_eq!(r.published_at, 1_795_000_000);
    assert_eq!(r.hostpath.len(), 1);
    assert_eq!(r.hostpath[0].path, d.path().display().to_string());
    assert!(r.hostpath[0].default && r.hostpath[0].size > 0);
}

/// A hostPath backend whose size checks answer from a script (one answer per check).
struct Drifting {
    answers: std::rc::Rc<RefCell<std::collections::VecDeque<Option<SizeCheck>>>>,
}

use crate::provision::storage::SizeCheck;

impl crate::provision::storage::Provisioner for Drifting {
    fn kind(&self) -> &'static crate::provision::storage::Kind {
        &crate::provision::storage::hostpath::KIND
    }
    fn serves(&self, _: &Config, _: &str) -> bool {
        true
    }
    fn check_class(&self, _: &BTreeMap<String, String>) -> Result<(), ClassError> {
        Ok(())
    }
    fn provision(
        &mut self,
        _: &Config,
        _: &crate::provision::storage::Request<'_>,
    ) -> Result<crate::provision::storage::Provisioned, crate::provision::storage::Refusal> {
        Err(crate::provision::storage::Refusal::Fail("not here".into()))
    }
    fn delete(&mut self, _: &Config, _: &PersistentVolume) -> Result<String, ProvisionError> {
        Ok("gone".into())
    }
    fn expand(&mut self, _: &Config, _: &PersistentVolume, b: u64) -> Result<u64, ProvisionError> {
        Ok(b)
    }
    fn recover(&mut self, _: &Config, _: &str) -> Vec<String> {
        Vec::new()
    }
    fn check_size(&self, _: &Config, _: &PersistentVolume) -> Option<SizeCheck> {
        self.answers
            .borrow_mut()
            .pop_front()
            .expect("asked more often than scripted")
    }
}

/// Each pass asks the backend to check every kept PV's enforced size; a drift is counted in the
/// report (the metric) each time it is found, and said in a QuotaDrift event on the PV once per
/// finding (again after a pass found it clean); what could not be put back or checked is a
/// failure too. A PV being deleted is not checked.
#[test]
fn a_drifted_quota_is_counted_each_pass_and_said_once_per_finding() {
    let d = tempfile::tempdir().unwrap();
    let f = Fake::default();
    f.nodes.borrow_mut().insert("node-a".into(), node("node-a"));
    let id = Identity {
        node: "node-a".into(),
        vendor: "flexvol".into(),
    };
    let moved = "its directory carries project 5 instead of its recorded 7";
    let answers = std::rc::Rc::new(RefCell::new(std::collections::VecDeque::from([
        Some(SizeCheck::Restored(moved.into())),
        Some(SizeCheck::Restored(moved.into())),
        None,
        Some(SizeCheck::Restored(moved.into())),
        Some(SizeCheck::NotRestored(moved.into(), "EPERM".into())),
        Some(SizeCheck::Failed("cannot open it: ENOENT".into())),
    ])));
    let backend = Drifting {
        answers: answers.clone(),
    };
    let mut rec = Reconciler::new(f, id, vec![Box::new(backend)]);
    let pv = |name: &str, uid: &str, deleting: bool| -> PersistentVolume {
        let mut v: PersistentVolume = serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "uid": uid, "finalizers": [FINALIZER],
                         "annotations": {ANN_PROVISIONED_BY: PROV, ANN_NODE: "node-a",
                                         "flexvol/size-enforced": "true"}},
            "spec": {"persistentVolumeReclaimPolicy": "Retain",
                     "claimRef": {"namespace": "ns", "name": "c", "uid": "u1"}},
            "status": {"phase": "Bound"}
        }))
        .unwrap();
        if deleting {
            v.metadata.deletion_timestamp = Some(deleted_now());
        }
        v
    };
    rec.cluster
        .volumes
        .borrow_mut()
        .push(pv("pvc-1", "pv-uid-1", false));
    let cfg = config("node-a", &[d.path()]);
    let said = |rec: &Reconciler<Fake>| -> Vec<EventSpec> {
        rec.cluster
            .events
            .borrow()
            .iter()
            .filter(|e| e.reason == QUOTA_DRIFT)
            .cloned()
            .collect()
    };

    // Found and put back: counted, said on the PV.
    let r = block_on(rec.pass(&cfg));
    assert_eq!(
        r.quota_drift,
        [("pvc-1".to_owned(), format!("{moved}; put back"))]
    );
    assert!(r.failed.is_empty(), "{:?}", r.failed);
    let ev = said(&rec);
    assert_eq!(ev.len(), 1, "{ev:?}");
    assert_eq!(
        (
            ev[0].kind,
            ev[0].name.as_str(),
            ev[0].uid.as_str(),
            ev[0].warning
        ),
        ("PersistentVolume", "pvc-1", "pv-uid-1", true)
    );
    assert_eq!(
        ev[0].message,
        format!("flexvol on node node-a: {moved}; flexvol put it back")
    );
    // The same finding on the next pass (a pod doing it again): counted again, not said again.
    let r = block_on(rec.pass(&cfg));
    assert_eq!(r.quota_drift.len(), 1);
    assert_eq!(said(&rec).len(), 1);
    // Clean: nothing; then found again: said again.
    let r = block_on(rec.pass(&cfg));
    assert!(r.quota_drift.is_empty());
    let r = block_on(rec.pass(&cfg));
    assert_eq!(r.quota_drift.len(), 1);
    assert_eq!(said(&rec).len(), 2);
    // Not put back: counted, a failure (retried), said.
    let r = block_on(rec.pass(&cfg));
    assert_eq!(r.quota_drift.len(), 1);
    assert!(
        r.failed
            .iter()
            .any(|f| f == &format!("PV pvc-1: {moved}; putting it back failed: EPERM; retrying")),
        "{:?}",
        r.failed
    );
    assert_eq!(said(&rec).len(), 3);
    // Not checked at all: a failure, said, not counted as a drift.
    let r = block_on(rec.pass(&cfg));
    assert!(r.quota_drift.is_empty());
    assert!(
        r.failed
            .iter()
            .any(|f| f.contains("cannot check its enforced size: cannot open it")),
        "{:?}",
        r.failed
    );
    assert_eq!(said(&rec).len(), 4);
    assert!(answers.borrow().is_empty());
    // A PV being deleted (kept by its reclaim policy: released) is not checked: the script is
    // empty, so a check would panic.
    rec.cluster.volumes.borrow_mut().clear();
    rec.cluster
        .volumes
        .borrow_mut()
        .push(pv("pvc-2", "pv-uid-2", true));
    let r = block_on(rec.pass(&cfg));
    assert!(r.quota_drift.is_empty());
}

// --- Recorded objects of 1.33-1.37 (issue #34, 5): the v1_33 model reads them whole, and the ---
// --- writes built from them leave every field they do not set ----------------------------------

/// `v` without its `null` members (the model reads a null as absent and writes nothing).
fn without_nulls(mut v: serde_json::Value) -> serde_json::Value {
    match &mut v {
        serde_json::Value::Object(m) => {
            m.retain(|_, x| !x.is_null());
            for x in m.values_mut() {
                *x = without_nulls(x.take());
            }
        }
        serde_json::Value::Array(a) => {
            for x in a.iter_mut() {
                *x = without_nulls(x.take());
            }
        }
        _ => {}
    }
    v
}

/// The fields of the recorded objects that no release of the v1_33 model knows: stand-ins for
/// what a 1.36 or 1.37 API server may add. The typed read drops exactly these and nothing else.
const BEYOND_THE_MODEL: [&str; 2] = [
    "/status/resizeObservedGeneration",
    "/status/conditions/3/observedGeneration",
];

#[test]
fn recorded_claims_and_pvs_of_1_34_to_1_36_decode_whole_into_the_model() {
    for name in [
        "claim-1.34-resizing",
        "claim-1.36-resizing",
        "pv-1.35-bound",
    ] {
        let recorded = without_nulls(fixture(name));
        let again = if name.starts_with("pv-") {
            let v: PersistentVolume = serde_json::from_value(recorded.clone()).unwrap();
            serde_json::to_value(v).unwrap()
        } else {
            let c: PersistentVolumeClaim = serde_json::from_value(recorded.clone()).unwrap();
            serde_json::to_value(c).unwrap()
        };
        let mut expected = recorded.clone();
        for path in BEYOND_THE_MODEL {
            if let Some((parent, key)) = path.rsplit_once('/')
                && let Some(m) = expected.pointer_mut(parent).and_then(|p| p.as_object_mut())
            {
                m.remove(key);
            }
        }
        assert_eq!(
            again, expected,
            "{name}: the typed read lost or changed a field"
        );
    }
    // What the provisioner reads, read right.
    let c: PersistentVolumeClaim = serde_json::from_value(fixture("claim-1.36-resizing")).unwrap();
    let (spec, st) = (c.spec.as_ref().unwrap(), c.status.as_ref().unwrap());
    assert_eq!(spec.volume_attributes_class_name.as_deref(), Some("gold"));
    assert_eq!(
        spec.resources.as_ref().unwrap().requests.as_ref().unwrap()["storage"],
        Quantity("2Gi".into())
    );
    assert_eq!(
        st.allocated_resource_statuses.as_ref().unwrap()["storage"],
        "NodeResizePending"
    );
    let m = st.modify_volume_status.as_ref().unwrap();
    assert_eq!(
        (
            m.status.as_str(),
            m.target_volume_attributes_class_name.as_deref()
        ),
        ("InProgress", Some("gold"))
    );
    assert_eq!(
        st.capacity.as_ref().unwrap()["storage"],
        Quantity("1Gi".into())
    );
    let types: Vec<&str> = st
        .conditions
        .as_deref()
        .unwrap()
        .iter()
        .map(|c| c.type_.as_str())
        .collect();
    assert_eq!(
        types,
        [
            "Resizing",
            "FileSystemResizePending",
            "NodeResizeError",
            "Unused",
            "ModifyingVolume"
        ]
    );
    let v: PersistentVolume = serde_json::from_value(fixture("pv-1.35-bound")).unwrap();
    let vst = v.status.as_ref().unwrap();
    assert_eq!(vst.phase.as_deref(), Some("Bound"));
    assert_eq!(
        serde_json::to_value(vst.last_phase_transition_time.as_ref().unwrap()).unwrap(),
        "2026-11-26T07:10:05Z"
    );
    assert_eq!(
        v.spec
            .as_ref()
            .unwrap()
            .volume_attributes_class_name
            .as_deref(),
        Some("silver")
    );
    assert_eq!(
        claim_provisioner(&c.metadata),
        Some(PROV),
        "the claim is flexvol's"
    );
}

#[test]
fn a_finished_resize_of_a_1_36_claim_writes_capacity_conditions_and_the_storage_status_only() {
    let before = fixture("claim-1.36-resizing");
    let patch =
        crate::provision::cluster::live::finish_resize_patch(&before, &Quantity("2Gi".into()));
    assert_eq!(
        patch,
        serde_json::json!({
            "metadata": {"resourceVersion": "90412"},
            "status": {
                "allocatedResourceStatuses": {"storage": null},
                "capacity": {"storage": "2Gi"},
                "conditions": [
                    before["status"]["conditions"][2],
                    before["status"]["conditions"][3],
                    before["status"]["conditions"][4],
                ],
            },
        })
    );
    let mut after = before.clone();
    json_patch::merge(&mut after, &patch);
    assert_eq!(
        condition_types(&after),
        vec!["NodeResizeError", "Unused", "ModifyingVolume"]
    );
    // The condition type the model does not know, and its field no model knows, kept whole.
    assert_eq!(after["status"]["conditions"][1]["observedGeneration"], 3);
    assert_eq!(after["status"]["conditions"][1]["reason"], "NoConsumer");
    assert_status_kept(&after, &before, &["resizeObservedGeneration"]);
    assert_eq!(after["spec"], before["spec"]);
    assert_eq!(after["metadata"], before["metadata"]);
}

#[test]
fn a_resize_of_a_1_36_claim_through_the_pass_keeps_the_unknown_condition() {
    let (_d, mut rec, cfg) = bound_and_grown(true, "2Gi");
    let rec36 = fixture("claim-1.36-resizing");
    for c in rec.cluster.claims.borrow_mut().iter_mut() {
        let st: PersistentVolumeClaimStatus =
            serde_json::from_value(rec36["status"].clone()).unwrap();
        c.status = Some(st);
    }
    let r = block_on(rec.pass(&cfg));
    assert_eq!(r.resized.len(), 1, "{r:?}");
    assert_eq!(claim_capacity(&rec), "2Gi");
    let c = serde_json::to_value(&rec.cluster.claims.borrow()[0]).unwrap();
    assert_eq!(
        condition_types(&c),
        vec!["NodeResizeError", "Unused", "ModifyingVolume"]
    );
    // The resize is over: kubelet's finish would remove NodeResizePending too.
    assert_eq!(
        c["status"]["allocatedResourceStatuses"]
            .get("storage")
            .cloned()
            .unwrap_or_default(),
        serde_json::Value::Null
    );
    assert_eq!(c["status"]["allocatedResources"]["storage"], "2Gi");
    assert_eq!(c["status"]["modifyVolumeStatus"]["status"], "InProgress");
}

#[test]
fn the_patches_flexvol_sends_to_a_1_35_pv_leave_its_newer_fields() {
    use crate::k8s::patch::{add_finalizer_patch, remove_finalizer_patch};
    use crate::provision::cluster::live::{grow_volume_patch, label_volume_patch};
    let before = fixture("pv-1.35-bound");
    let typed: PersistentVolume = serde_json::from_value(before.clone()).unwrap();
    let mut after = before.clone();
    let merges = [
        label_volume_patch(&BTreeMap::from([(
            "flexvol/node".to_owned(),
            "node-a".to_owned(),
        )])),
        grow_volume_patch(
            &Quantity("2Gi".into()),
            &BTreeMap::from([("flexvol/size-bytes".to_owned(), "2147483648".to_owned())]),
        ),
    ];
    for p in &merges {
        // A merge patch names only what it sets: nothing of the status, nothing newer.
        assert!(p.get("status").is_none(), "{p}");
        assert!(
            p.pointer("/spec/volumeAttributesClassName").is_none(),
            "{p}"
        );
        json_patch::merge(&mut after, p);
    }
    let mut meta = typed.metadata.clone();
    meta.finalizers = Some(vec!["kubernetes.io/pv-protection".into()]);
    let add: json_patch::Patch =
        serde_json::from_value(add_finalizer_patch(&meta, crate::vocab::FINALIZER).unwrap())
            .unwrap();
    after["metadata"]["finalizers"] = serde_json::json!(["kubernetes.io/pv-protection"]);
    json_patch::patch(&mut after, &add).unwrap();
    let remove: json_patch::Patch = serde_json::from_value(
        remove_finalizer_patch(&typed.metadata, crate::vocab::FINALIZER).unwrap(),
    )
    .unwrap();
    json_patch::patch(&mut after, &remove).unwrap();
    assert_eq!(after["status"], before["status"]);
    assert_eq!(
        after["spec"]["volumeAttributesClassName"],
        before["spec"]["volumeAttributesClassName"]
    );
    assert_eq!(after["spec"]["capacity"]["storage"], "2Gi");
    assert_eq!(after["spec"]["flexVolume"], before["spec"]["flexVolume"]);
    assert_eq!(
        after["metadata"]["finalizers"],
        serde_json::json!(["kubernetes.io/pv-protection"])
    );
}

/// A PV flexvol creates names only fields a 1.20 API server has (docs/kubernetes-versions.md's
/// table): nothing of the v1_33 model's newer fields is set, so a 1.20 server stores all of it.
#[test]
fn a_created_pv_names_only_fields_of_1_20() {
    let (_d, rec, _cfg) = bound_and_grown(true, "2Gi");
    let pv = serde_json::to_value(&rec.cluster.volumes.borrow()[0]).unwrap();
    let keys = |p: &str| -> Vec<String> {
        pv.pointer(p)
            .and_then(|v| v.as_object())
            .map(|m| m.keys().cloned().collect())
            .unwrap_or_default()
    };
    let allowed: [(&str, &[&str]); 4] = [
        (
            "/spec",
            &[
                "accessModes",
                "capacity",
                "claimRef",
                "flexVolume",
                "mountOptions",
                "nodeAffinity",
                "persistentVolumeReclaimPolicy",
                "storageClassName",
                "volumeMode",
            ],
        ),
        (
            "/spec/flexVolume",
            &["driver", "fsType", "options", "readOnly"],
        ),
        ("/spec/nodeAffinity", &["required"]),
        (
            "/metadata",
            // resourceVersion and uid: the fake server's, as a real one adds them.
            &[
                "annotations",
                "finalizers",
                "labels",
                "name",
                "resourceVersion",
                "uid",
            ],
        ),
    ];
    for (at, ok) in allowed {
        let k = keys(at);
        assert!(!k.is_empty(), "{at}: nothing there in {pv}");
        for key in k {
            assert!(
                ok.contains(&key.as_str()),
                "{at}/{key} is not a 1.20 field flexvol sets"
            );
        }
    }
}

/// A resize's patch applied to a recorded claim keeps the status fields newer than the model
/// (and `phase`, `accessModes`) as the server returned them, plus `more`.
/// Every status field but capacity, conditions and `allocatedResourceStatuses` (the finish
/// writes those) is `before`'s, and `more` too.
fn assert_status_kept(after: &serde_json::Value, before: &serde_json::Value, more: &[&str]) {
    for k in [
        "allocatedResources",
        "currentVolumeAttributesClassName",
        "modifyVolumeStatus",
        "phase",
        "accessModes",
    ]
    .iter()
    .chain(more)
    {
        assert_eq!(after["status"][k], before["status"][k], "{k}");
    }
}
