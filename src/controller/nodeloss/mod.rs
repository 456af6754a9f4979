//! Node loss, the calls: one pass reads every Node and every node-local PV flexvol made, asks
//! [`crate::controller::nodeloss::decide::decide`] what to do with each, and does it.
//!
//! Safety rules, in the order they apply:
//! - the kubelets' Leases (`kube-node-lease`), the Node list and the PV list are each read
//!   completely (all pages) in the same pass, the Leases first, or the pass does nothing; an empty
//!   Node list is taken as a broken read, not as every node gone;
//! - every pass records, in memory, whether each existing Node's kubelet was renewing its Lease
//!   ([`Heartbeats`]): a Node that disappears after such a pass is held, never acted on (its Lease
//!   goes with it, so this is the only evidence left that its machine was alive);
//! - before deleting anything for a PV, its node is read again by name (the `flexvol/node` name and
//!   every hostname of the PV's affinity): one that exists stops it; so are its Leases, and the PV,
//!   and it is decided again from what they say now (its mark, its uid, a renewed Lease);
//! - the claim is deleted only while its uid is the one the PV's `claimRef` names (a precondition
//!   on the delete as well); the PV only with its reclaim policy Delete, with a uid precondition;
//!   of the PV's finalizers only the provisioner's is removed (a JSON patch that tests the entry);
//! - events are written only when a delete is about to be issued, so a retried pass does not
//!   repeat them.

pub(crate) mod decide;

use super::LOG_TARGET;
use crate::controller::nodeloss::decide::{
    ClaimStep, ClassGrace, Decision, Heartbeats, LEASE_NAMESPACE, LeaseSeen, Life, Nodes, Target,
    claim_step, class_grace, decide, event_message, target,
};
use crate::k8s::call::call;
use crate::k8s::error::{ApiError, ApiErrorKind, ApiResult};
use crate::k8s::events::{self, EventSpec};
use crate::k8s::patch::remove_finalizer_patch;
use crate::k8s::queue::{Backoff, WorkQueue};
use crate::vocab::LABEL_KIND;
use crate::vocab::{ANN_DELETED_ALIVE, ANN_LEASE_AT_MARK, ANN_MISSING_SINCE};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, Preconditions};
use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};
use tracing::{debug, info, warn};

/// Items per page of a list.
const PAGE: u32 = 500;
/// Event reason when a PV's node is first seen gone.
pub(crate) const REASON_MISSING: &str = "NodeMissing";
/// Event reason when the claim and PV of a lost node are deleted.
pub(crate) const REASON_LOST: &str = "NodeLost";
/// Event reason when a PV's Node is gone but its kubelet was seen alive: nothing will be deleted.
pub(crate) const REASON_HELD: &str = "NodeDeletedAlive";

/// The node-loss worker: its client, what it looks at, and its per-PV backoff.
pub(crate) struct NodeLoss {
    client: kube::Client,
    vendor: String,
    local_kinds: Vec<&'static str>,
    queue: WorkQueue<String>,
    /// (PV, message) said already: an invalid class is logged once, not every pass.
    said: HashSet<(String, String)>,
    /// Whether each Node's kubelet was renewing its Lease when the Node was last seen.
    beats: Heartbeats,
    /// What the last pass did (the controller's metrics).
    pub(crate) last: PassStats,
}

/// What one pass did, for the metrics ([`super::telemetry`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct PassStats {
    /// Whether the Leases, Nodes and PVs were listed completely (else the pass decided nothing).
    pub(crate) listed: bool,
    /// Claims of a lost node deleted.
    pub(crate) claims_deleted: u64,
    /// PVs of a lost node deleted.
    pub(crate) pvs_deleted: u64,
    /// PVs whose work failed (each retried after a backoff), plus a failed list.
    pub(crate) errors: u64,
}

/// A 403 names the controller's manifest, not the provisioner's.
fn ours(e: ApiError) -> ApiError {
    ApiError {
        message: e.message.replace(
            "drivers/deploy/rbac.yaml",
            "drivers/deploy-overlays/node-loss/controller.yaml",
        ),
        ..e
    }
}

fn ok_if_gone<T>(r: ApiResult<T>) -> ApiResult<()> {
    match r {
        Ok(_) => Ok(()),
        Err(e) if e.kind == ApiErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

impl NodeLoss {
    /// A worker for the node-local kinds `local_kinds` of provisioner `vendor`.
    pub(crate) fn new(
        client: kube::Client,
        vendor: String,
        local_kinds: Vec<&'static str>,
    ) -> Self {
        Self {
            client,
            vendor,
            local_kinds,
            queue: WorkQueue::new(Backoff::DEFAULT),
            said: HashSet::new(),
            beats: Heartbeats::default(),
            last: PassStats::default(),
        }
    }

    /// Every kubelet Lease, by name (all pages).
    async fn list_leases(&self) -> ApiResult<HashMap<String, LeaseSeen>> {
        let api = Api::<Lease>::namespaced(self.client.clone(), LEASE_NAMESPACE);
        let mut out = HashMap::new();
        let mut token: Option<String> = None;
        loop {
            let mut lp = ListParams::default().limit(PAGE);
            if let Some(t) = &token {
                lp = lp.continue_token(t);
            }
            let page = call(format!("list Leases in {LEASE_NAMESPACE}"), api.list(&lp))
                .await
                .map_err(ours)?;
            for l in &page.items {
                if let Some(n) = &l.metadata.name {
                    out.insert(n.clone(), LeaseSeen::from_lease(l));
                }
            }
            token = page.metadata.continue_.filter(|t| !t.is_empty());
            if token.is_none() {
                return Ok(out);
            }
        }
    }

    /// The Leases of `t`'s node names, each read by name just now.
    async fn get_leases(&self, t: &Target) -> ApiResult<HashMap<String, LeaseSeen>> {
        let api = Api::<Lease>::namespaced(self.client.clone(), LEASE_NAMESPACE);
        let mut out = HashMap::new();
        for n in t.node_names() {
            let got = call(format!("get Lease {LEASE_NAMESPACE}/{n}"), api.get_opt(n))
                .await
                .map_err(ours)?;
            if let Some(l) = got {
                out.insert(n.to_owned(), LeaseSeen::from_lease(&l));
            }
        }
        Ok(out)
    }

    async fn list_nodes(&self) -> ApiResult<Vec<Node>> {
        let api = Api::<Node>::all(self.client.clone());
        let mut out = Vec::new();
        let mut token: Option<String> = None;
        loop {
            let mut lp = ListParams::default().limit(PAGE);
            if let Some(t) = &token {
                lp = lp.continue_token(t);
            }
            let page = call("list Nodes", api.list(&lp)).await.map_err(ours)?;
            out.extend(page.items);
            token = page.metadata.continue_.filter(|t| !t.is_empty());
            if token.is_none() {
                return Ok(out);
            }
        }
    }

    async fn list_volumes(&self) -> ApiResult<Vec<PersistentVolume>> {
        let api = Api::<PersistentVolume>::all(self.client.clone());
        let selector = format!("{LABEL_KIND} in ({})", self.local_kinds.join(","));
        let mut out = Vec::new();
        let mut token: Option<String> = None;
        loop {
            let mut lp = ListParams::default().labels(&selector).limit(PAGE);
            if let Some(t) = &token {
                lp = lp.continue_token(t);
            }
            let page = call("list PersistentVolumes", api.list(&lp))
                .await
                .map_err(ours)?;
            out.extend(page.items);
            token = page.metadata.continue_.filter(|t| !t.is_empty());
            if token.is_none() {
                return Ok(out);
            }
        }
    }

    /// One pass; returns how soon the next is wanted (the shortest grace left), if sooner than
    /// the caller's resync matters.
    pub(crate) async fn pass(&mut self) -> Option<Duration> {
        self.last = PassStats {
            errors: 1,
            ..PassStats::default()
        };
        // The Leases before the Nodes (Heartbeats::observe says why), and the time before both.
        let read_at = Timestamp::now();
        let leases = match self.list_leases().await {
            Ok(l) => l,
            Err(e) => {
                warn!(target: LOG_TARGET, "{e}; deciding nothing this pass");
                return None;
            }
        };
        let (nodes, pvs) = match (self.list_nodes().await, self.list_volumes().await) {
            (Ok(n), Ok(v)) => (n, v),
            (Err(e), _) | (_, Err(e)) => {
                warn!(target: LOG_TARGET, "{e}; deciding nothing this pass");
                return None;
            }
        };
        if nodes.is_empty() {
            warn!(
                target: LOG_TARGET,
                "the API server lists no Node at all; taking that as a broken read, not as every node gone: deciding nothing"
            );
            return None;
        }
        self.last = PassStats {
            listed: true,
            ..PassStats::default()
        };
        self.beats.observe(&nodes, &leases, read_at);
        let nodes = Nodes::from_list(&nodes);
        let local: Vec<&str> = self.local_kinds.clone();
        let mut targets: HashMap<String, (Target, PersistentVolume)> = HashMap::new();
        for pv in pvs {
            if let Some(t) = target(&pv, &self.vendor, &local) {
                self.queue.add_unless_backing_off(t.pv.clone());
                targets.insert(t.pv.clone(), (t, pv));
            }
        }
        let mut classes: HashMap<String, Option<StorageClass>> = HashMap::new();
        let mut soonest: Option<Duration> = None;
        let now = Instant::now();
        for name in self.queue.take(now) {
            let Some((t, pv)) = targets.get(&name) else {
                self.queue.forget(&name);
                continue;
            };
            let r = self.one(t, pv, &nodes, &leases, &mut classes).await;
            match r {
                Ok(Some(d)) => {
                    soonest = Some(soonest.map_or(d, |s| s.min(d)));
                    self.queue.done(&name, true, now);
                }
                Ok(None) => self.queue.done(&name, true, now),
                Err(e) => {
                    warn!(target: LOG_TARGET, pv = %name, "PV {name}: {e}; retrying after a backoff");
                    self.last.errors += 1;
                    self.queue.done(&name, false, now);
                }
            }
        }
        if let Some(at) = self.queue.next_retry() {
            let d = at.saturating_duration_since(Instant::now());
            soonest = Some(soonest.map_or(d, |s| s.min(d)));
        }
        soonest
    }

    async fn class(
        &self,
        name: &str,
        cache: &mut HashMap<String, Option<StorageClass>>,
    ) -> ApiResult<Option<StorageClass>> {
        if let Some(c) = cache.get(name) {
            return Ok(c.clone());
        }
        let api = Api::<StorageClass>::all(self.client.clone());
        let c = call(format!("get StorageClass {name}"), api.get_opt(name))
            .await
            .map_err(ours)?;
        cache.insert(name.to_owned(), c.clone());
        Ok(c)
    }

    /// Decides and acts on one PV; `Ok(Some(d))`: look again within `d`.
    async fn one(
        &mut self,
        t: &Target,
        pv: &PersistentVolume,
        nodes: &Nodes,
        leases: &HashMap<String, LeaseSeen>,
        classes: &mut HashMap<String, Option<StorageClass>>,
    ) -> ApiResult<Option<Duration>> {
        let annotated =
            t.missing_since.is_some() || t.lease_at_mark.is_some() || t.deleted_alive.is_some();
        if nodes.holds(t) && !annotated {
            return Ok(None); // the usual case: no class read
        }
        let class = if t.class.is_empty() {
            None
        } else {
            self.class(&t.class, classes).await?
        };
        let grace = class_grace(class.as_ref(), &t.provisioner);
        let life = Life::of(t, leases, &self.beats);
        match decide(t, nodes, &life, &grace, Timestamp::now()) {
            Decision::Nothing => Ok(None),
            Decision::Wait(d) => {
                debug!(target: LOG_TARGET, pv = %t.pv, "PV {}: node {} gone, {}s of grace left", t.pv, t.node, d.as_secs());
                Ok(Some(d))
            }
            Decision::Invalid(e) => {
                if self.said.insert((t.pv.clone(), e.clone())) {
                    warn!(target: LOG_TARGET, pv = %t.pv, "PV {}: node {} is gone but its class cannot be used: {e}; nothing is done", t.pv, t.node);
                }
                Ok(None)
            }
            Decision::Clear => {
                self.annotate(pv, None, None, None).await?;
                info!(target: LOG_TARGET, pv = %t.pv, "PV {}: node {} is back (or its class {} no longer sets the grace): {ANN_MISSING_SINCE}, {ANN_LEASE_AT_MARK} and {ANN_DELETED_ALIVE} removed", t.pv, t.node, t.class);
                Ok(None)
            }
            Decision::Hold { at, why } => {
                self.annotate(pv, None, None, Some(&at)).await?;
                let msg = format!(
                    "node {} has no Node object, but {why}: its machine is taken as alive and nothing is deleted for this claim or its PV {}. If the Node was deleted by mistake, restart the kubelet on that machine (it registers the Node again, and this is cleared); if the machine is gone for good, remove the annotation {ANN_DELETED_ALIVE} from PV {} and the class's grace runs from then",
                    t.node, t.pv, t.pv
                );
                warn!(target: LOG_TARGET, pv = %t.pv, "PV {}: {msg}", t.pv);
                if let Some((ns, name, uid)) = &t.claim {
                    self.event("PersistentVolumeClaim", ns, name, uid, REASON_HELD, &msg)
                        .await;
                }
                Ok(None)
            }
            Decision::Mark { since: at, lease } => {
                self.annotate(pv, Some(&at), lease.as_deref(), None).await?;
                let ClassGrace::Grace(g) = grace else {
                    return Ok(None);
                };
                let msg = format!(
                    "node {} has no Node object (since {at}) and its kubelet does not renew its Lease; unless either is back within the class {}'s {} of {}s, this claim and its PV {} are deleted so that the claim can be recreated on another node",
                    t.node,
                    t.class,
                    crate::vocab::class::PARAM,
                    g.as_secs(),
                    t.pv
                );
                info!(target: LOG_TARGET, pv = %t.pv, "PV {}: {msg}", t.pv);
                if let Some((ns, name, uid)) = &t.claim {
                    self.event("PersistentVolumeClaim", ns, name, uid, REASON_MISSING, &msg)
                        .await;
                }
                Ok(Some(g))
            }
            Decision::Act { .. } => self.act(t, nodes, &grace).await.map(|()| None),
        }
    }

    /// Writes (`Some`) or removes (`None`) the mark, the Lease at the mark and the hold, in one
    /// patch conditional on the PV as read.
    async fn annotate(
        &self,
        pv: &PersistentVolume,
        missing_since: Option<&str>,
        lease_at_mark: Option<&str>,
        deleted_alive: Option<&str>,
    ) -> ApiResult<()> {
        let name = pv.metadata.name.as_deref().unwrap_or_default();
        let api = Api::<PersistentVolume>::all(self.client.clone());
        let patch = serde_json::json!({"metadata": {
            "resourceVersion": pv.metadata.resource_version,
            "annotations": {
                ANN_MISSING_SINCE: missing_since,
                ANN_LEASE_AT_MARK: lease_at_mark,
                ANN_DELETED_ALIVE: deleted_alive,
            },
        }});
        ok_if_gone(
            call(
                format!("annotate PersistentVolume {name} (node loss)"),
                api.patch(name, &PatchParams::default(), &Patch::Merge(&patch)),
            )
            .await
            .map_err(ours),
        )
    }

    /// After the grace: read again, then events, claim, PV, finalizer (module docs).
    async fn act(&mut self, t: &Target, nodes: &Nodes, grace: &ClassGrace) -> ApiResult<()> {
        let node_api = Api::<Node>::all(self.client.clone());
        for n in std::iter::once(&t.node).chain(t.hostnames.iter()) {
            let got = call(format!("get Node {n}"), node_api.get_opt(n))
                .await
                .map_err(ours)?;
            if got.is_some() {
                info!(target: LOG_TARGET, pv = %t.pv, "PV {}: Node {n} exists again; nothing deleted", t.pv);
                return Ok(());
            }
        }
        let pv_api = Api::<PersistentVolume>::all(self.client.clone());
        let Some(pv) = call(
            format!("get PersistentVolume {}", t.pv),
            pv_api.get_opt(&t.pv),
        )
        .await
        .map_err(ours)?
        else {
            return Ok(());
        };
        let local: Vec<&str> = self.local_kinds.clone();
        let Some(t) = target(&pv, &self.vendor, &local).filter(|n| n.uid == t.uid) else {
            return Ok(()); // another PV of that name, or no longer ours to judge
        };
        let life = Life::of(&t, &self.get_leases(&t).await?, &self.beats);
        let Decision::Act { since, grace } = decide(&t, nodes, &life, grace, Timestamp::now())
        else {
            return Ok(()); // the next pass decides from what it reads
        };
        let claim_api;
        let mut claim_delete = None;
        if let Some((ns, name, _)) = &t.claim {
            claim_api = Api::<PersistentVolumeClaim>::namespaced(self.client.clone(), ns);
            let c = call(
                format!("get PersistentVolumeClaim {ns}/{name}"),
                claim_api.get_opt(name),
            )
            .await
            .map_err(ours)?;
            match claim_step(&t, c.as_ref()) {
                ClaimStep::Delete(uid) => claim_delete = Some((claim_api, ns, name, uid)),
                ClaimStep::Replaced => {
                    info!(target: LOG_TARGET, pv = %t.pv, "PV {}: claim {ns}/{name} was recreated (another uid): it is left alone", t.pv)
                }
                ClaimStep::Deleting | ClaimStep::None => {}
            }
        }
        let pv_delete = t.reclaim_delete && !t.deleting;
        if claim_delete.is_some() || pv_delete {
            let msg = event_message(&t, &since, grace, claim_delete.is_some());
            warn!(target: LOG_TARGET, pv = %t.pv, "PV {}: {msg}", t.pv);
            if let Some((_, ns, name, uid)) = &claim_delete {
                self.event("PersistentVolumeClaim", ns, name, uid, REASON_LOST, &msg)
                    .await;
            }
            self.event("PersistentVolume", "", &t.pv, &t.uid, REASON_LOST, &msg)
                .await;
        }
        // Whether this call issued anything (the log says what was done, not every look).
        let mut did = claim_delete.is_some() || pv_delete;
        if let Some((api, ns, name, uid)) = claim_delete {
            let dp = precondition(&uid);
            match call(
                format!("delete PersistentVolumeClaim {ns}/{name}"),
                api.delete(name, &dp),
            )
            .await
            .map_err(ours)
            {
                Ok(_) => self.last.claims_deleted += 1,
                // Gone, or its uid changed (a precondition failure is a 409): not ours to delete.
                Err(e) if matches!(e.kind, ApiErrorKind::NotFound | ApiErrorKind::Conflict) => {}
                Err(e) => return Err(e),
            }
        }
        if pv_delete {
            match call(
                format!("delete PersistentVolume {}", t.pv),
                pv_api.delete(&t.pv, &precondition(&t.uid)),
            )
            .await
            .map_err(ours)
            {
                Ok(_) => self.last.pvs_deleted += 1,
                Err(e) if matches!(e.kind, ApiErrorKind::NotFound | ApiErrorKind::Conflict) => {
                    return Ok(());
                }
                Err(e) => return Err(e),
            }
        }
        // The provisioner that would remove its finalizer ran on the lost node.
        let Some(pv) = call(
            format!("get PersistentVolume {}", t.pv),
            pv_api.get_opt(&t.pv),
        )
        .await
        .map_err(ours)?
        else {
            return Ok(());
        };
        if pv.metadata.uid.as_deref() != Some(t.uid.as_str())
            || pv.metadata.deletion_timestamp.is_none()
        {
            return Ok(());
        }
        if let Some(p) = remove_finalizer_patch(&pv.metadata, crate::vocab::FINALIZER) {
            did = true;
            let p: json_patch::Patch = serde_json::from_value(p).map_err(|e| {
                ApiError::new("build a JSON patch", ApiErrorKind::Other, e.to_string())
            })?;
            ok_if_gone(
                call(
                    format!(
                        "remove finalizer {} from PersistentVolume {}",
                        crate::vocab::FINALIZER,
                        t.pv
                    ),
                    pv_api.patch(&t.pv, &PatchParams::default(), &Patch::Json::<()>(p)),
                )
                .await
                .map_err(ours),
            )?;
        }
        if did {
            info!(target: LOG_TARGET, pv = %t.pv, "PV {}: node {} lost; deletes issued and the provisioner's finalizer removed (Kubernetes removes the claim once no pod uses it, then the PV)", t.pv, t.node);
        }
        Ok(())
    }

    /// Records an event (a failure is logged, not retried: the deletes matter, not the notes).
    async fn event(
        &self,
        kind: &'static str,
        namespace: &str,
        name: &str,
        uid: &str,
        reason: &'static str,
        message: &str,
    ) {
        let spec = EventSpec {
            kind,
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            uid: uid.to_owned(),
            warning: true,
            reason,
            message: message.to_owned(),
        };
        if let Err(e) = events::record(&self.client, &spec, LOG_TARGET, None)
            .await
            .map_err(ours)
        {
            warn!(target: LOG_TARGET, "{e}");
        }
    }
}

fn precondition(uid: &str) -> DeleteParams {
    DeleteParams {
        preconditions: Some(Preconditions {
            uid: Some(uid.to_owned()),
            resource_version: None,
        }),
        ..Default::default()
    }
}
