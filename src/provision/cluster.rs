//! The seam between the provisioner's decisions and the API server: the few operations it needs,
//! as a trait ([`Cluster`]), implemented over kube-rs in [`crate::provision::cluster::live`] and by a recording fake
//! in the tests.
//!
//! Contract for implementations: every call has a deadline and returns [`ApiError`] when it
//! passes; `NotFound` on delete and `AlreadyExists` on create are reported as such (the caller
//! decides whether they are success).

pub mod live;

use crate::k8s::error::ApiResult;
use crate::k8s::events::EventSpec;
use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use std::collections::BTreeMap;
use std::sync::Arc;

// Kubernetes' well-known names the provisioner reads and writes (sig-storage's, and the
// scheduler's for WaitForFirstConsumer).

/// The API operations the provisioner uses.
#[allow(async_fn_in_trait)]
pub(crate) trait Cluster {
    /// Every claim (from a watch cache: may be slightly stale).
    async fn claims(&self) -> ApiResult<Vec<PersistentVolumeClaim>>;
    /// Every PV (from a watch cache: may be slightly stale).
    async fn volumes(&self) -> ApiResult<Vec<PersistentVolume>>;
    /// The claim `namespace/name` as the watch cache holds it (`None`: not held: gone, or not
    /// one this instance looks after).
    async fn cached_claim(&self, namespace: &str, name: &str) -> Option<PersistentVolumeClaim> {
        let claims = self.claims().await.ok()?;
        claims.into_iter().find(|c| {
            c.metadata.namespace.as_deref() == Some(namespace)
                && c.metadata.name.as_deref() == Some(name)
        })
    }
    /// The PV `name` as the watch cache holds it (`None`: not held).
    async fn cached_volume(&self, name: &str) -> Option<PersistentVolume> {
        let volumes = self.volumes().await.ok()?;
        volumes
            .into_iter()
            .find(|v| v.metadata.name.as_deref() == Some(name))
    }
    /// One page of every PV in the cluster, read from the server now (for the rare sweeps that
    /// must see PVs no cache holds): the page after `token` (`None`: the first) and the token of
    /// the next (`None`: that was the last).
    async fn volume_page(
        &self,
        token: Option<String>,
    ) -> ApiResult<(Vec<PersistentVolume>, Option<String>)> {
        let _ = token;
        Ok((self.volumes().await?, None))
    }
    /// Adds `labels` to the PV `name` (a merge patch; the rest is kept).
    async fn label_volume(&self, name: &str, labels: &BTreeMap<String, String>) -> ApiResult<()>;
    /// One PV, read from the server now (`None`: not found).
    async fn get_volume(&self, name: &str) -> ApiResult<Option<PersistentVolume>>;
    /// One claim, read from the server now (`None`: not found).
    async fn get_claim(
        &self,
        namespace: &str,
        name: &str,
    ) -> ApiResult<Option<PersistentVolumeClaim>>;
    /// The StorageClass `name` as the class watch cache holds it (`None`: not found, the cache
    /// holding every class); an error while that cache has not listed yet.
    async fn cached_class(&self, name: &str) -> ApiResult<Option<Arc<StorageClass>>>;
    /// Creates a PV.
    async fn create_volume(&self, pv: &PersistentVolume) -> ApiResult<()>;
    /// Deletes a PV if its uid is still `uid` (a precondition).
    async fn delete_volume(&self, name: &str, uid: &str) -> ApiResult<()>;
    /// Adds [`FINALIZER`] to `pv` (as read: the patch applies only while its resourceVersion is
    /// still `pv`'s, `Conflict` otherwise).
    async fn add_volume_finalizer(&self, pv: &PersistentVolume) -> ApiResult<()>;
    /// Removes [`FINALIZER`] from `pv` (as read), and nothing else: the patch names the entry's
    /// index and tests that it still holds [`FINALIZER`] (`Conflict` when not). `Ok` when `pv`
    /// does not carry it.
    async fn remove_volume_finalizer(&self, pv: &PersistentVolume) -> ApiResult<()>;
    /// Removes the `volume.kubernetes.io/selected-node` annotation from a claim, if it still names
    /// `node` (a JSON patch test + remove).
    async fn unselect_node(&self, namespace: &str, name: &str, node: &str) -> ApiResult<()>;
    /// The Node object (`None`: not found). Nodes are only ever read: the provisioner's token
    /// may not write them (drivers/deploy/rbac.yaml).
    async fn get_node(&self, name: &str) -> ApiResult<Option<Node>>;
    /// Sets a PV's capacity to `capacity` and merges `annotations` into its annotations (the
    /// caller never passes less than the PV's capacity).
    async fn grow_volume(
        &self,
        name: &str,
        capacity: &Quantity,
        annotations: &BTreeMap<String, String>,
    ) -> ApiResult<()>;
    /// Records a finished resize in a claim's status: `capacity`, and none of the resize
    /// conditions flexvol finishes ([`RESIZE_CONDITIONS`]) left; every other condition (another
    /// controller's) and the rest of the status are kept. The write is conditional on the
    /// claim's resourceVersion as read just before (`Conflict` when someone wrote it meanwhile).
    async fn finish_claim_resize(
        &self,
        namespace: &str,
        name: &str,
        capacity: &Quantity,
    ) -> ApiResult<()>;
    /// Records an event.
    async fn event(&self, ev: &EventSpec) -> ApiResult<()>;
    /// Writes this node's capacity record (docs/scheduler-extender.md): an update of the
    /// ConfigMap `flexvol-capacity/<node>` whose `capacity.json` becomes `text`. `NotFound` while
    /// the controller has not created it (the node's token may not create it).
    async fn publish_capacity(&self, node: &str, text: &str) -> ApiResult<()>;
}
