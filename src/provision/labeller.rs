//! Routing labels on claims, so that each instance's claim watch can be a label selector: the
//! instance that holds the `flexvol-claims` Lease ([`crate::provision::leadership::CLAIMS_LEASE`]; it alone
//! watches every claim) labels every claim of a flexvol kind with where its work is done:
//!
//! - a claim of a node-local kind (hostPath, LVM) whose `volume.kubernetes.io/selected-node` is
//!   set: `flexvol/node=<node_label_value(selected-node)>` ([`LABEL_NODE`]); the instance of
//!   that node watches `flexvol/node=<its own value>` and receives it;
//! - a claim of a shared kind (NFS): `flexvol/kind=<kind>` ([`LABEL_KIND`]); the instance that
//!   leads that kind watches `flexvol/kind in (<shared kinds>)` while leading.
//!
//! Every other value of those two keys on a flexvol claim is wrong or stale and is corrected: a
//! `flexvol/node` when there is no selected-node (sent back to the scheduler), or naming another
//! node than selected-node, or on a claim of a shared kind; a `flexvol/kind` on a claim of a
//! node-local kind, or naming another kind. Claims of other provisioners are never touched,
//! whatever labels they carry.
//!
//! **The labels are only routing filters.** Tenants may write labels on their own claims (and the
//! `selected-node` annotation, as before). A forged label only makes an instance receive a claim
//! it then does not keep: which instance works on a claim, and whether it is flexvol's at all, is
//! still decided by the claim's annotations (storage-provisioner, selected-node) and the volume
//! markers, exactly as without the labels ([`crate::provision::cache::Scope::keep_claim`]). The worst a
//! tenant can do is make one instance decode the events of its own claims, until the holder puts
//! the label right.
//!
//! The decision is a pure function ([`label_change`]). The holder's claim watch feeds every event
//! to a [`Relabel`] (what is left to label, by claim); [`run`], a task on the watches' runtime,
//! works through it with a [`WorkQueue`] (each claim once, per-claim exponential backoff after a
//! failure), one merge patch of `metadata.labels` (and the claim's uid, which the API server
//! refuses to change: a claim recreated under the same name is never labelled from the old one's
//! decision) per claim, each under [`crate::k8s::call::DEADLINE`]. The patch is idempotent; the event it
//! causes is checked again like any other, so a label written from a stale event is put right at
//! the next event.

use crate::k8s::queue::{Backoff, WorkQueue};
use crate::provision::cache::{Lane, Leads, Scope, claim_key};
use crate::provision::reconcile::node_label_value;
use crate::provision::telemetry::{LOG_TARGET, Metrics};
use crate::vocab::ANN_SELECTED_NODE;
use crate::vocab::{LABEL_KIND, LABEL_NODE};
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::api::{Api, Patch, PatchParams};
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender};
use tokio::sync::watch;
use tracing::{debug, warn};

/// The label changes a claim needs: each key to its value (`None`: remove the label).
pub(crate) type LabelChange = BTreeMap<String, Option<String>>;

/// The labels claim `c` should carry, of [`LABEL_NODE`] and [`LABEL_KIND`] (the rest is never
/// looked at), for this cluster's kinds (`scope`): `None` when `c` is not a claim of a flexvol
/// kind, which is never labelled.
pub(crate) fn wanted_labels(
    scope: &Scope,
    c: &PersistentVolumeClaim,
) -> Option<BTreeMap<&'static str, String>> {
    let provisioner = crate::provision::reconcile::claim_provisioner(&c.metadata)?;
    let mut want = BTreeMap::new();
    match scope.claim_lane(c)? {
        Lane::Local => {
            let node = c
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(ANN_SELECTED_NODE))
                .filter(|n| !n.is_empty());
            if let Some(n) = node {
                want.insert(LABEL_NODE, node_label_value(n));
            }
        }
        Lane::Shared => {
            // `<vendor>/<kind>`: the kind is what follows the last '/' (as on the PVs).
            let kind = provisioner.rsplit_once('/').map_or(provisioner, |(_, k)| k);
            want.insert(LABEL_KIND, kind.to_owned());
        }
    }
    Some(want)
}

/// What to change on claim `c`'s labels (`None`: nothing: right already, or not a flexvol claim).
pub(crate) fn label_change(scope: &Scope, c: &PersistentVolumeClaim) -> Option<LabelChange> {
    let want = wanted_labels(scope, c)?;
    let have = c.metadata.labels.as_ref();
    let mut change = LabelChange::new();
    for key in [LABEL_NODE, LABEL_KIND] {
        let now = have.and_then(|l| l.get(key));
        let wanted = want.get(key);
        if now != wanted {
            change.insert(key.to_owned(), wanted.cloned());
        }
    }
    (!change.is_empty()).then_some(change)
}

/// The merge patch for `change` on the claim of `uid`: only `metadata.labels` (and the uid, which
/// the API server refuses to change: the patch fails on a claim recreated under the same name).
pub fn label_patch(uid: Option<&str>, change: &LabelChange) -> serde_json::Value {
    let mut meta = serde_json::json!({ "labels": change });
    if let Some(u) = uid {
        meta["uid"] = serde_json::Value::String(u.to_owned());
    }
    serde_json::json!({ "metadata": meta })
}

/// One claim's label work.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Work {
    /// The claim's uid as last seen.
    pub uid: Option<String>,
    /// What to change.
    pub(crate) change: LabelChange,
}

/// What is left to label, by claim key (`namespace/name`), as the holder's watch of every claim
/// sees it; each change is sent to [`run`]. Holds only claims whose labels are wrong: nothing once
/// the cluster's claims are labelled.
pub(crate) struct Relabel {
    scope: Arc<Scope>,
    pending: Mutex<HashMap<String, Work>>,
    tx: UnboundedSender<String>,
}

impl Relabel {
    /// An empty one for `scope`, sending keys along `tx`.
    pub(crate) fn new(scope: Arc<Scope>, tx: UnboundedSender<String>) -> Self {
        Self {
            scope,
            pending: Mutex::new(HashMap::new()),
            tx,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Work>> {
        self.pending.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// What is left to do for `key`.
    pub(crate) fn get(&self, key: &str) -> Option<Work> {
        self.lock().get(key).cloned()
    }

    /// How many claims are left to label.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether no claim is left to label.
    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Forgets everything (this instance stopped holding the Lease; the next holder lists again).
    pub(crate) fn clear(&self) {
        self.lock().clear();
    }

    /// `work` on `key` was written: forgotten unless a newer event changed it meanwhile.
    pub(crate) fn written(&self, key: &str, work: &Work) {
        let mut p = self.lock();
        if p.get(key) == Some(work) {
            p.remove(key);
        }
    }

    fn note(&self, map: &mut HashMap<String, Work>, c: &PersistentVolumeClaim) -> Option<String> {
        let key = claim_key(&c.metadata);
        match label_change(&self.scope, c) {
            Some(change) => {
                map.insert(
                    key.clone(),
                    Work {
                        uid: c.metadata.uid.clone(),
                        change,
                    },
                );
                Some(key)
            }
            None => {
                map.remove(&key);
                None
            }
        }
    }

    /// A claim as it is now.
    pub(crate) fn applied(&self, c: &PersistentVolumeClaim) {
        let key = self.note(&mut self.lock(), c);
        if let Some(k) = key {
            let _ = self.tx.send(k);
        }
    }

    /// A claim is gone.
    pub fn deleted(&self, c: &PersistentVolumeClaim) {
        self.lock().remove(&claim_key(&c.metadata));
    }

    /// Every claim there is (a list: at the start of the lead, and after a watch error).
    pub(crate) fn restarted(&self, list: &[PersistentVolumeClaim]) {
        let mut fresh = HashMap::new();
        let keys: Vec<String> = list
            .iter()
            .filter_map(|c| self.note(&mut fresh, c))
            .collect();
        *self.lock() = fresh;
        for k in keys {
            let _ = self.tx.send(k);
        }
    }
}

impl crate::provision::cache::Observer<PersistentVolumeClaim> for Relabel {
    fn applied(&self, o: &PersistentVolumeClaim) {
        Self::applied(self, o);
    }
    fn deleted(&self, o: &PersistentVolumeClaim) {
        Self::deleted(self, o);
    }
    fn restarted(&self, list: &[PersistentVolumeClaim]) {
        Self::restarted(self, list);
    }
}

/// Labels the claims `relabel` holds while this instance leads the claim duty (`leads`), through
/// `client`: each key once, a failed one again after its backoff; runs until the process ends.
pub(crate) async fn run(
    client: kube::Client,
    relabel: Arc<Relabel>,
    mut keys: UnboundedReceiver<String>,
    mut leads: watch::Receiver<Leads>,
    metrics: Arc<crate::provision::telemetry::Shared>,
) {
    let mut queue: WorkQueue<String> = WorkQueue::new(Backoff::DEFAULT);
    loop {
        let leading = leads.borrow_and_update().claims;
        while let Ok(k) = keys.try_recv() {
            if leading {
                queue.add(k);
            }
        }
        if !leading {
            // Not the holder: nothing to label; whoever holds the Lease lists every claim.
            queue = WorkQueue::new(Backoff::DEFAULT);
            relabel.clear();
        }
        for k in queue.take(Instant::now()) {
            if !leads.borrow().claims {
                break;
            }
            let ok = match relabel.get(&k) {
                None => true,
                Some(w) => {
                    let ok = write(&client, &k, &w, &metrics.metrics).await;
                    if ok {
                        relabel.written(&k, &w);
                    }
                    ok
                }
            };
            queue.done(&k, ok, Instant::now());
        }
        // Wait for a key, the next retry or a change of lead.
        let wait = queue.next_retry().map_or(Duration::from_secs(3600), |t| {
            t.saturating_duration_since(Instant::now())
        });
        let recv = std::pin::pin!(keys.recv());
        let changed = std::pin::pin!(leads.changed());
        match tokio::time::timeout(wait, futures::future::select(recv, changed)).await {
            Ok(futures::future::Either::Left((Some(k), _))) => queue.add(k),
            // The process is ending.
            Ok(
                futures::future::Either::Left((None, _))
                | futures::future::Either::Right((Err(_), _)),
            ) => {
                return;
            }
            Ok(futures::future::Either::Right((Ok(()), _))) | Err(_) => {}
        }
    }
}

/// Writes one claim's labels; whether it is done (written, or the claim is gone).
async fn write(client: &kube::Client, key: &str, w: &Work, metrics: &Metrics) -> bool {
    let (ns, name) = key.split_once('/').unwrap_or(("", key));
    let api = Api::<PersistentVolumeClaim>::namespaced(client.clone(), ns);
    let patch = label_patch(w.uid.as_deref(), &w.change);
    let r = crate::k8s::call::call(
        format!("label claim {key}"),
        api.patch(name, &PatchParams::default(), &Patch::Merge(&patch)),
    )
    .await;
    match r {
        Ok(_) => {
            debug!(target: LOG_TARGET, claim = %key, "labelled claim {key}: {:?}", w.change);
            metrics.claim_labelled("success");
            true
        }
        Err(e) if e.kind == crate::k8s::error::ApiErrorKind::NotFound => true,
        Err(e) => {
            warn!(target: LOG_TARGET, claim = %key, "{e}; retrying after a backoff");
            metrics.claim_labelled("failure");
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn scope() -> Scope {
        let (_tx, rx) = watch::channel(Leads::default());
        Scope {
            node: "node-a".into(),
            local: vec!["flexvol/hostpath".into(), "flexvol/lvm".into()],
            shared: vec!["flexvol/nfs".into()],
            shared_kinds: vec!["nfs".into()],
            leads: rx,
        }
    }

    fn claim(
        prov: Option<&str>,
        node: Option<&str>,
        labels: &[(&str, &str)],
    ) -> PersistentVolumeClaim {
        let mut a = BTreeMap::new();
        if let Some(p) = prov {
            a.insert(crate::vocab::ANN_PROVISIONER_BETA.to_owned(), p.to_owned());
        }
        if let Some(n) = node {
            a.insert(ANN_SELECTED_NODE.to_owned(), n.to_owned());
        }
        PersistentVolumeClaim {
            metadata: ObjectMeta {
                namespace: Some("ns".into()),
                name: Some("c".into()),
                uid: Some("u-1".into()),
                annotations: Some(a),
                labels: Some(
                    labels
                        .iter()
                        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                        .collect(),
                ),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    fn change(pairs: &[(&str, Option<&str>)]) -> Option<LabelChange> {
        Some(
            pairs
                .iter()
                .map(|(k, v)| ((*k).to_owned(), v.map(str::to_owned)))
                .collect(),
        )
    }

    #[test]
    fn a_node_local_claim_is_labelled_with_its_selected_node() {
        let s = scope();
        let hp = Some("flexvol/hostpath");
        // Picked by the scheduler: the node label.
        assert_eq!(
            label_change(&s, &claim(hp, Some("node-b"), &[])),
            change(&[("flexvol/node", Some("node-b"))])
        );
        // Right already: nothing (idempotent: the patch's own event asks for nothing more).
        assert_eq!(
            label_change(
                &s,
                &claim(hp, Some("node-b"), &[("flexvol/node", "node-b")])
            ),
            None
        );
        // Not picked yet: nothing to add.
        assert_eq!(
            label_change(&s, &claim(Some("flexvol/lvm"), None, &[])),
            None
        );
        // A node name that is no label value: its hash, as on the PVs.
        let long = "n".repeat(100);
        assert_eq!(
            label_change(&s, &claim(hp, Some(&long), &[])),
            change(&[("flexvol/node", Some(node_label_value(&long).as_str()))])
        );
        assert!(node_label_value(&long).starts_with("h-"));
        // Other labels are the tenant's: never looked at.
        assert_eq!(
            label_change(
                &s,
                &claim(
                    hp,
                    Some("node-b"),
                    &[
                        ("flexvol/node", "node-b"),
                        ("app", "x"),
                        ("flexvol/other", "y")
                    ]
                )
            ),
            None
        );
    }

    #[test]
    fn stale_and_forged_labels_are_corrected() {
        let s = scope();
        let hp = Some("flexvol/hostpath");
        // Sent back to the scheduler (selected-node removed): the node label goes.
        assert_eq!(
            label_change(&s, &claim(hp, None, &[("flexvol/node", "node-a")])),
            change(&[("flexvol/node", None)])
        );
        // Moved to another node, or a tenant's label naming another node: the right one.
        assert_eq!(
            label_change(
                &s,
                &claim(hp, Some("node-b"), &[("flexvol/node", "node-a")])
            ),
            change(&[("flexvol/node", Some("node-b"))])
        );
        // A tenant's kind label on a node-local claim (to reach the NFS leader): removed.
        assert_eq!(
            label_change(
                &s,
                &claim(
                    hp,
                    Some("node-b"),
                    &[("flexvol/node", "node-b"), ("flexvol/kind", "nfs")]
                )
            ),
            change(&[("flexvol/kind", None)])
        );
        // A shared claim with a node label (and selected-node, as a WaitForFirstConsumer NFS
        // class gives it): the node label goes, the kind label comes.
        assert_eq!(
            label_change(
                &s,
                &claim(
                    Some("flexvol/nfs"),
                    Some("node-b"),
                    &[("flexvol/node", "node-b")]
                )
            ),
            change(&[("flexvol/kind", Some("nfs")), ("flexvol/node", None)])
        );
        // A wrong kind: the right one.
        assert_eq!(
            label_change(
                &s,
                &claim(Some("flexvol/nfs"), None, &[("flexvol/kind", "hostpath")])
            ),
            change(&[("flexvol/kind", Some("nfs"))])
        );
    }

    #[test]
    fn a_shared_claim_gets_its_kind() {
        let s = scope();
        assert_eq!(
            label_change(&s, &claim(Some("flexvol/nfs"), None, &[])),
            change(&[("flexvol/kind", Some("nfs"))])
        );
        assert_eq!(
            label_change(
                &s,
                &claim(Some("flexvol/nfs"), None, &[("flexvol/kind", "nfs")])
            ),
            None
        );
    }

    #[test]
    fn claims_of_other_provisioners_are_never_touched() {
        let s = scope();
        for c in [
            claim(Some("example.com/x"), Some("node-a"), &[]),
            // Forged labels on a claim that is not ours: still not ours to correct.
            claim(
                Some("example.com/x"),
                Some("node-a"),
                &[("flexvol/node", "node-b"), ("flexvol/kind", "nfs")],
            ),
            claim(None, Some("node-a"), &[("flexvol/node", "node-b")]),
            // Another vendor's hostpath.
            claim(Some("other/hostpath"), Some("node-a"), &[]),
        ] {
            assert_eq!(wanted_labels(&s, &c), None);
            assert_eq!(label_change(&s, &c), None);
        }
    }

    #[test]
    fn the_patch_touches_only_the_labels_and_names_the_uid() {
        let p = label_patch(
            Some("u-1"),
            &change(&[("flexvol/node", Some("node-b")), ("flexvol/kind", None)]).unwrap(),
        );
        assert_eq!(
            p,
            serde_json::json!({"metadata": {"uid": "u-1", "labels": {"flexvol/node": "node-b", "flexvol/kind": null}}})
        );
    }

    #[test]
    fn relabel_holds_only_claims_left_to_label() {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let r = Relabel::new(Arc::new(scope()), tx);
        let hp = Some("flexvol/hostpath");
        let mut other = claim(hp, Some("node-b"), &[("flexvol/node", "node-b")]);
        other.metadata.name = Some("d".into());
        r.restarted(&[claim(hp, Some("node-b"), &[]), other.clone()]);
        assert_eq!(r.len(), 1);
        assert_eq!(rx.try_recv().unwrap(), "ns/c");
        assert!(rx.try_recv().is_err());
        let w = r.get("ns/c").unwrap();
        // A newer event before the write: the write does not forget the newer work.
        r.applied(&claim(hp, Some("node-a"), &[]));
        assert_eq!(rx.try_recv().unwrap(), "ns/c");
        r.written("ns/c", &w);
        assert_eq!(r.len(), 1);
        let w2 = r.get("ns/c").unwrap();
        assert_eq!(
            w2.change,
            change(&[("flexvol/node", Some("node-a"))]).unwrap()
        );
        r.written("ns/c", &w2);
        assert!(r.is_empty());
        // The patched claim's event asks for nothing; a deleted one is forgotten.
        r.applied(&claim(hp, Some("node-a"), &[("flexvol/node", "node-a")]));
        assert!(r.is_empty() && rx.try_recv().is_err());
        r.applied(&claim(hp, None, &[("flexvol/node", "node-a")]));
        assert_eq!(r.len(), 1);
        r.deleted(&claim(hp, None, &[]));
        assert!(r.is_empty());
    }
}
