//! [`Cluster`] over kube-rs: claims, PVs and StorageClasses from this instance's watch caches ([`crate::provision::cache`]:
//! only the objects it works on), everything else read or written on the server directly, each
//! call under [`DEADLINE`].
//!
//! Only the `provisioner` subcommand reaches this module (it needs the async runtime).

use crate::k8s::call::call;
use crate::k8s::error::{ApiError, ApiErrorKind, ApiResult};
use crate::k8s::events::EventSpec;
use crate::provision::cache::{Caches, ClaimObserver, Routes, Scope};
use crate::provision::cluster::Cluster;
use crate::provision::telemetry::WatchEvents;
use crate::vocab::{FINALIZER, RESIZE_CONDITIONS};
use k8s_openapi::api::core::v1::{ConfigMap, Node, PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::ListParams;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, Patch, PatchParams, PostParams, Preconditions,
};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

/// PVs per page of a full list (the sweeps): what one instance holds at once.
const PAGE: u32 = 250;

/// The kube-rs implementation.
#[derive(Clone)]
pub(crate) struct KubeCluster {
    client: kube::Client,
    caches: Arc<Caches>,
    /// Who records events (`source.host`).
    pub node: String,
}

/// A failed `test` of a JSON patch (the object changed since it was read) is a conflict: the
/// next pass reads it again.
fn test_failed_is_conflict(e: ApiError) -> ApiError {
    if e.kind == ApiErrorKind::Other && e.message.to_ascii_lowercase().contains("testing value") {
        ApiError {
            kind: ApiErrorKind::Conflict,
            ..e
        }
    } else {
        e
    }
}

/// The status merge patch that records a finished resize on `claim` (the claim as the server
/// returned it, raw JSON: fields this crate's v1_33 model does not know are kept as they are):
/// `capacity`, and the conditions without [`RESIZE_CONDITIONS`]. Other controllers' conditions
/// are written back unchanged; when there is no resize condition the list is not written at all.
/// On 1.34+ (where the claim has `allocatedResourceStatuses`) its `storage` entry is removed, as
/// kubelet's own finish does (`MarkFSResizeFinished`): left behind, `NodeResizePending` would say
/// for ever that the node still has work; `allocatedResources` stays, as kubelet leaves it.
/// A merge patch replaces a list whole, so the patch carries the claim's resourceVersion: the
/// server refuses it (409) if anyone wrote the claim since it was read.
pub fn finish_resize_patch(claim: &serde_json::Value, capacity: &Quantity) -> serde_json::Value {
    let mut status = serde_json::json!({"capacity": {"storage": capacity}});
    if claim
        .pointer("/status/allocatedResourceStatuses/storage")
        .is_some()
    {
        status["allocatedResourceStatuses"] = serde_json::json!({"storage": null});
    }
    if let Some(conds) = claim
        .pointer("/status/conditions")
        .and_then(serde_json::Value::as_array)
    {
        let kept: Vec<&serde_json::Value> = conds
            .iter()
            .filter(|c| {
                !c.get("type")
                    .and_then(serde_json::Value::as_str)
                    .is_some_and(|t| RESIZE_CONDITIONS.contains(&t))
            })
            .collect();
        if kept.len() != conds.len() {
            status["conditions"] = if kept.is_empty() {
                serde_json::Value::Null
            } else {
                serde_json::json!(kept)
            };
        }
    }
    serde_json::json!({
        "metadata": {"resourceVersion": claim.pointer("/metadata/resourceVersion")},
        "status": status,
    })
}

/// The merge patch that adds `labels` to a PV (the rest of its labels kept).
pub fn label_volume_patch(labels: &BTreeMap<String, String>) -> serde_json::Value {
    serde_json::json!({"metadata": {"labels": labels}})
}

/// The merge patch that removes `volume.kubernetes.io/selected-node` from a claim read at
/// `resource_version`: conditional on it (a 409 if the claim changed meanwhile).
pub fn unselect_node_patch(resource_version: Option<&str>) -> serde_json::Value {
    serde_json::json!({"metadata": {
        "resourceVersion": resource_version,
        "annotations": {crate::vocab::ANN_SELECTED_NODE: null},
    }})
}

/// The merge patch that sets a PV's capacity and merges `annotations` into its annotations.
pub fn grow_volume_patch(
    capacity: &Quantity,
    annotations: &BTreeMap<String, String>,
) -> serde_json::Value {
    serde_json::json!({
        "metadata": {"annotations": annotations},
        "spec": {"capacity": {"storage": capacity}},
    })
}

fn json_patch(v: serde_json::Value) -> Result<json_patch::Patch, ApiError> {
    serde_json::from_value(v)
        .map_err(|e| ApiError::new("build a JSON patch", ApiErrorKind::Other, e.to_string()))
}

impl KubeCluster {
    /// Sends `patch` (a finalizer JSON patch built from `pv` as read; `None`: nothing to do) to
    /// `pv`; a failed `test` is a conflict, retried next pass.
    async fn patch_volume_finalizer(
        &self,
        pv: &PersistentVolume,
        patch: Option<serde_json::Value>,
        verb: &str,
        prep: &str,
    ) -> ApiResult<()> {
        let Some(p) = patch else {
            return Ok(());
        };
        let name = pv.metadata.name.as_deref().unwrap_or_default();
        let api = Api::<PersistentVolume>::all(self.client.clone());
        call(
            format!("{verb} finalizer {FINALIZER} {prep} PersistentVolume {name}"),
            api.patch(
                name,
                &PatchParams::default(),
                &Patch::Json::<()>(json_patch(p)?),
            ),
        )
        .await
        .map(|_| ())
        .map_err(test_failed_is_conflict)
    }

    /// Starts the watches that fill the caches ([`Caches::start`]) for `scope`, sending the key
    /// of every changed object along `routes`.
    /// `relabel` is told every claim while this instance leads the claim duty (the labeller's
    /// `Relabel`); `events` counts what each watch receives.
    pub(crate) fn start(
        client: kube::Client,
        node: String,
        scope: Scope,
        routes: Routes,
        relabel: Option<ClaimObserver>,
        events: WatchEvents,
    ) -> Self {
        let caches = Arc::new(Caches::start(&client, scope, routes, relabel, events));
        Self {
            client,
            caches,
            node,
        }
    }

    /// The same caches with API calls made through `client`. Each lane has a client of its own,
    /// made on its own runtime: hyper runs a connection on the runtime that opened it, so a
    /// connection shared with a lane whose thread is blocked (a mount that hangs) would hold up
    /// every other lane's calls on it.
    pub(crate) fn with_client(&self, client: kube::Client) -> Self {
        Self {
            client,
            caches: self.caches.clone(),
            node: self.node.clone(),
        }
    }

    /// The caches (for the lanes' resync and the readiness check).
    pub(crate) fn caches(&self) -> &Caches {
        &self.caches
    }

    /// Waits (up to `limit`) until every cache holds a first full list.
    pub(crate) async fn ready(&self, limit: Duration) -> bool {
        let t0 = std::time::Instant::now();
        loop {
            if self.caches.ready() {
                return true;
            }
            if t0.elapsed() >= limit {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

impl Cluster for KubeCluster {
    async fn claims(&self) -> ApiResult<Vec<PersistentVolumeClaim>> {
        Ok(self
            .caches
            .all_claims()
            .iter()
            .map(|c| (**c).clone())
            .collect())
    }

    async fn volumes(&self) -> ApiResult<Vec<PersistentVolume>> {
        let c = &self.caches;
        Ok(c.local_volumes
            .values()
            .iter()
            .chain(c.shared_volumes.values().iter())
            .map(|v| (**v).clone())
            .collect())
    }

    async fn cached_claim(&self, namespace: &str, name: &str) -> Option<PersistentVolumeClaim> {
        self.caches
            .claim(&format!("{namespace}/{name}"))
            .map(|c| (*c).clone())
    }

    async fn cached_volume(&self, name: &str) -> Option<PersistentVolume> {
        let c = &self.caches;
        c.local_volumes
            .get(name)
            .or_else(|| c.shared_volumes.get(name))
            .map(|v| (*v).clone())
    }

    async fn volume_page(
        &self,
        token: Option<String>,
    ) -> ApiResult<(Vec<PersistentVolume>, Option<String>)> {
        let api = Api::<PersistentVolume>::all(self.client.clone());
        let mut lp = ListParams::default().limit(PAGE);
        if let Some(t) = token {
            lp = lp.continue_token(&t);
        }
        let list = call("list PersistentVolumes", api.list(&lp)).await?;
        let next = list.metadata.continue_.filter(|t| !t.is_empty());
        Ok((list.items, next))
    }

    async fn label_volume(&self, name: &str, labels: &BTreeMap<String, String>) -> ApiResult<()> {
        let api = Api::<PersistentVolume>::all(self.client.clone());
        let patch = label_volume_patch(labels);
        call(
            format!("label PersistentVolume {name}"),
            api.patch(name, &PatchParams::default(), &Patch::Merge(&patch)),
        )
        .await
        .map(|_| ())
    }

    async fn get_volume(&self, name: &str) -> ApiResult<Option<PersistentVolume>> {
        let api = Api::<PersistentVolume>::all(self.client.clone());
        call(format!("get PersistentVolume {name}"), api.get_opt(name)).await
    }

    async fn get_claim(
        &self,
        namespace: &str,
        name: &str,
    ) -> ApiResult<Option<PersistentVolumeClaim>> {
        let api = Api::<PersistentVolumeClaim>::namespaced(self.client.clone(), namespace);
        call(
            format!("get PersistentVolumeClaim {namespace}/{name}"),
            api.get_opt(name),
        )
        .await
    }

    async fn add_volume_finalizer(&self, pv: &PersistentVolume) -> ApiResult<()> {
        self.patch_volume_finalizer(
            pv,
            crate::k8s::patch::add_finalizer_patch(&pv.metadata, crate::vocab::FINALIZER),
            "add",
            "to",
        )
        .await
    }

    async fn remove_volume_finalizer(&self, pv: &PersistentVolume) -> ApiResult<()> {
        self.patch_volume_finalizer(
            pv,
            crate::k8s::patch::remove_finalizer_patch(&pv.metadata, crate::vocab::FINALIZER),
            "remove",
            "from",
        )
        .await
    }

    async fn cached_class(&self, name: &str) -> ApiResult<Option<Arc<StorageClass>>> {
        self.caches.classes.class(name)
    }

    async fn create_volume(&self, pv: &PersistentVolume) -> ApiResult<()> {
        let api = Api::<PersistentVolume>::all(self.client.clone());
        let name = pv.metadata.name.clone().unwrap_or_default();
        call(
            format!("create PersistentVolume {name}"),
            api.create(&PostParams::default(), pv),
        )
        .await
        .map(|_| ())
    }

    async fn delete_volume(&self, name: &str, uid: &str) -> ApiResult<()> {
        let api = Api::<PersistentVolume>::all(self.client.clone());
        let dp = DeleteParams {
            preconditions: Some(Preconditions {
                uid: Some(uid.to_owned()),
                resource_version: None,
            }),
            ..Default::default()
        };
        call(
            format!("delete PersistentVolume {name}"),
            api.delete(name, &dp),
        )
        .await
        .map(|_| ())
    }

    async fn unselect_node(&self, namespace: &str, name: &str, node: &str) -> ApiResult<()> {
        let api = Api::<PersistentVolumeClaim>::namespaced(self.client.clone(), namespace);
        let what = format!("remove selected-node from claim {namespace}/{name}");
        let Some(c) = call(what.clone(), api.get_opt(name)).await? else {
            return Ok(());
        };
        let sel = c
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(crate::vocab::ANN_SELECTED_NODE));
        if sel.map(String::as_str) != Some(node) {
            return Ok(()); // the scheduler moved on already
        }
        let patch = unselect_node_patch(c.metadata.resource_version.as_deref());
        call(
            what,
            api.patch(name, &PatchParams::default(), &Patch::Merge(&patch)),
        )
        .await
        .map(|_| ())
    }

    async fn get_node(&self, name: &str) -> ApiResult<Option<Node>> {
        let api = Api::<Node>::all(self.client.clone());
        call(format!("get Node {name}"), api.get_opt(name)).await
    }

    async fn grow_volume(
        &self,
        name: &str,
        capacity: &Quantity,
        annotations: &BTreeMap<String, String>,
    ) -> ApiResult<()> {
        let api = Api::<PersistentVolume>::all(self.client.clone());
        let patch = grow_volume_patch(capacity, annotations);
        call(
            format!("set capacity of PersistentVolume {name} to {}", capacity.0),
            api.patch(name, &PatchParams::default(), &Patch::Merge(&patch)),
        )
        .await
        .map(|_| ())
    }

    async fn finish_claim_resize(
        &self,
        namespace: &str,
        name: &str,
        capacity: &Quantity,
    ) -> ApiResult<()> {
        // Read raw: the conditions written back keep every field, known to this crate or not.
        let ar = ApiResource::erase::<PersistentVolumeClaim>(&());
        let api = Api::<DynamicObject>::namespaced_with(self.client.clone(), namespace, &ar);
        let what = format!("record capacity {} on claim {namespace}/{name}", capacity.0);
        let Some(claim) = call(what.clone(), api.get_opt(name)).await? else {
            return Err(ApiError::new(
                what,
                ApiErrorKind::NotFound,
                "the claim is gone",
            ));
        };
        let raw = serde_json::to_value(&claim)
            .map_err(|e| ApiError::new(what.clone(), ApiErrorKind::Other, e.to_string()))?;
        let patch = finish_resize_patch(&raw, capacity);
        call(
            what,
            api.patch_status(name, &PatchParams::default(), &Patch::Merge(&patch)),
        )
        .await
        .map(|_| ())
    }

    async fn publish_capacity(&self, node: &str, text: &str) -> ApiResult<()> {
        let ns = crate::vocab::capacity::NAMESPACE;
        let api = Api::<ConfigMap>::namespaced(self.client.clone(), ns);
        let cm = ConfigMap {
            metadata: ObjectMeta {
                name: Some(node.to_owned()),
                namespace: Some(ns.to_owned()),
                // An update replaces the labels too: keep the controller's, or it would no
                // longer know the object as its own (it creates and deletes only labelled ones).
                labels: Some(BTreeMap::from([(
                    crate::vocab::capacity::LABEL.to_owned(),
                    crate::vocab::capacity::LABEL_VALUE.to_owned(),
                )])),
                ..Default::default()
            },
            data: Some(BTreeMap::from([(
                crate::vocab::capacity::DATA_KEY.to_owned(),
                text.to_owned(),
            )])),
            ..Default::default()
        };
        // An unconditional update (no resourceVersion), which the API server allows for
        // ConfigMaps: the node is the only writer of its record, and the latest one wins.
        call(
            format!("update ConfigMap {ns}/{node}"),
            api.replace(node, &PostParams::default(), &cm),
        )
        .await
        .map(|_| ())
    }

    async fn event(&self, ev: &EventSpec) -> ApiResult<()> {
        crate::k8s::events::record(&self.client, ev, "flexvol-provisioner", Some(&self.node)).await
    }
}
