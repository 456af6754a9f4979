//! One reconcile pass: decide from what the API and the node's disks say, then act idempotently.
//!
//! A pass, for this node only:
//! 1. finish deletions a kill left half done (tombstones in the roots);
//! 2. label the Node `<provisioner>=true` while the config gives it a root, remove it otherwise;
//! 3. every pending claim of our class whose `selected-node` is this node and that has no PV yet:
//!    validate the class, pick or find the directory, write the marker, create `pvc-<claim uid>`;
//!    when this node cannot serve it, remove `selected-node` so the scheduler picks again;
//! 4. every Released PV with reclaim policy Delete that we provisioned on this node: re-read it
//!    from the server, check its path lies in a root and its directory's marker, remove the
//!    directory, then delete the PV (with a uid precondition).
//!
//! Restart safety: every step is keyed by names derived from the claim (PV `pvc-<uid>`, the
//! directory path), so a pass after a kill at any point finds what the killed one did and
//! continues: an existing marked directory is reused, `AlreadyExists` for a PV that is ours and
//! bound to this claim is success, a directory already gone is success.

use super::api::{ApiErrorKind, Cluster, EventSpec};
use super::hostpath::{self, ClassParams, DirState, Marker, Root};
use super::localpath::LocalPathConfig;
use crate::sys::process::checkpoint;
use k8s_openapi::api::core::v1::{
    FlexPersistentVolumeSource, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm,
    ObjectReference, PersistentVolume, PersistentVolumeClaim, PersistentVolumeSpec,
    VolumeNodeAffinity,
};
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;

/// Claim annotation naming the provisioner (1.20 sets only this one).
pub const ANN_PROVISIONER_BETA: &str = "volume.beta.kubernetes.io/storage-provisioner";
/// Claim annotation naming the provisioner (1.23+ also set this one).
pub const ANN_PROVISIONER: &str = "volume.kubernetes.io/storage-provisioner";
/// Claim annotation the scheduler sets for WaitForFirstConsumer.
pub const ANN_SELECTED_NODE: &str = "volume.kubernetes.io/selected-node";
/// PV annotation: who provisioned it.
pub const ANN_PROVISIONED_BY: &str = "pv.kubernetes.io/provisioned-by";
/// PV annotation: the node whose provisioner owns it.
pub const ANN_NODE: &str = "flexvol/node";
/// The node label PVs are pinned by.
pub const HOSTNAME_LABEL: &str = "kubernetes.io/hostname";
/// How deep `status`/`gc` look for volume directories below a root.
pub const SCAN_DEPTH: usize = 4;

/// Who this provisioner is.
#[derive(Debug, Clone)]
pub struct Identity {
    /// This node's name.
    pub node: String,
    /// The provisioner name classes use, `<vendor>/hostpath`; also the PV's flexVolume driver and
    /// the Node label key.
    pub provisioner: String,
}

/// What a pass did, for the log and the tests.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Report {
    /// PVs created (or found created) with their directory.
    pub provisioned: Vec<(String, PathBuf)>,
    /// PVs deleted with their directory.
    pub deleted: Vec<String>,
    /// Claims sent back to the scheduler.
    pub rescheduled: Vec<String>,
    /// Failures (also sent as events where there is an object to attach them to).
    pub failed: Vec<String>,
    /// Node label changes (`true` set, `false` removed).
    pub labelled: Option<bool>,
}

/// The reconciler: the cluster seam, who we are, and which events were already said.
pub struct Reconciler<C> {
    /// The API seam.
    pub cluster: C,
    /// Who we are.
    pub id: Identity,
    said: HashMap<(String, &'static str), String>,
}

enum Step {
    /// Nothing to do for this claim (not ours, not this node, already provisioned).
    Skip,
    /// Done.
    Done(String, PathBuf),
    /// This node cannot serve it: send it back to the scheduler.
    Reschedule(String),
    /// It cannot be provisioned as asked; say so and leave nothing behind.
    Fail(String),
}

fn ann<'a>(meta: &'a ObjectMeta, key: &str) -> Option<&'a str> {
    meta.annotations
        .as_ref()
        .and_then(|a| a.get(key))
        .map(String::as_str)
}

fn claim_ref(c: &PersistentVolumeClaim) -> String {
    format!(
        "{}/{}",
        c.metadata.namespace.as_deref().unwrap_or(""),
        c.metadata.name.as_deref().unwrap_or("")
    )
}

/// Roots of `node` usable now, creating missing ones when `create`; errors for the others.
pub fn usable_roots(paths: &[PathBuf], create: bool) -> (Vec<Root>, Vec<String>) {
    let (mut ok, mut bad) = (Vec::new(), Vec::new());
    for p in paths {
        let r = if create {
            hostpath::prepare_root(p)
        } else {
            std::fs::canonicalize(p)
                .map(|real| Root {
                    configured: p.clone(),
                    real,
                })
                .map_err(|e| format!("root {} cannot be resolved: {e}", p.display()))
        };
        match r {
            Ok(r) => ok.push(r),
            Err(e) => bad.push(e),
        }
    }
    (ok, bad)
}

impl<C: Cluster> Reconciler<C> {
    /// A reconciler for `id` over `cluster`.
    pub fn new(cluster: C, id: Identity) -> Self {
        Self {
            cluster,
            id,
            said: HashMap::new(),
        }
    }

    /// Records an event unless the same was said last time for this object and reason.
    async fn say(&mut self, ev: EventSpec, report: &mut Report) {
        let key = (ev.uid.clone(), ev.reason);
        if self.said.get(&key) == Some(&ev.message) {
            return;
        }
        if let Err(e) = self.cluster.event(&ev).await {
            report.failed.push(format!("cannot record event: {e}"));
        }
        self.said.insert(key, ev.message);
    }

    fn claim_event(
        c: &PersistentVolumeClaim,
        warning: bool,
        reason: &'static str,
        message: String,
    ) -> EventSpec {
        EventSpec {
            kind: "PersistentVolumeClaim",
            namespace: c.metadata.namespace.clone().unwrap_or_default(),
            name: c.metadata.name.clone().unwrap_or_default(),
            uid: c.metadata.uid.clone().unwrap_or_default(),
            warning,
            reason,
            message,
        }
    }

    /// One pass over the cluster and this node's roots, with the node config `cfg`.
    pub async fn pass(&mut self, cfg: &LocalPathConfig) -> Report {
        let mut report = Report::default();
        let node_roots = cfg.node_roots(&self.id.node);

        let (existing, _) = usable_roots(&node_roots, false);
        for e in hostpath::finish_deletes(&existing).1 {
            report.failed.push(e);
        }

        // Labelled while a root can be used now (a root that is gone takes the label away, so the
        // scheduler stops picking this node).
        let (usable, _) = usable_roots(&node_roots, true);
        let hostname = self.sync_label(!usable.is_empty(), &mut report).await;

        match self.cluster.volumes().await {
            Err(e) => report.failed.push(e.to_string()),
            Ok(volumes) => {
                let names: std::collections::HashSet<String> = volumes
                    .iter()
                    .filter_map(|v| v.metadata.name.clone())
                    .collect();
                match self.cluster.claims().await {
                    Err(e) => report.failed.push(e.to_string()),
                    Ok(claims) => {
                        // Forget what was said about objects that are gone (bounded memory).
                        let live: std::collections::HashSet<&str> = claims
                            .iter()
                            .map(|c| &c.metadata)
                            .chain(volumes.iter().map(|v| &v.metadata))
                            .filter_map(|m| m.uid.as_deref())
                            .collect();
                        self.said.retain(|(uid, _), _| live.contains(uid.as_str()));
                        for c in &claims {
                            self.claim(c, &names, cfg, &hostname, &mut report).await;
                        }
                    }
                }
                for v in &volumes {
                    if self.is_ours_to_delete(v) {
                        self.delete(v, cfg, &mut report).await;
                    }
                }
            }
        }
        report
    }

    /// Sets or removes the Node label; returns the node's hostname label (what PVs pin to).
    async fn sync_label(&mut self, want: bool, report: &mut Report) -> String {
        let node = match self.cluster.get_node(&self.id.node).await {
            Ok(Some(n)) => n,
            Ok(None) => {
                report.failed.push(format!(
                    "Node {} does not exist; check --node-name (the DaemonSet passes spec.nodeName)",
                    self.id.node
                ));
                return self.id.node.clone();
            }
            Err(e) => {
                report.failed.push(e.to_string());
                return self.id.node.clone();
            }
        };
        let labels = node.metadata.labels.unwrap_or_default();
        let has = labels.get(&self.id.provisioner).map(String::as_str) == Some("true");
        if has != want {
            let v = want.then_some("true");
            match self
                .cluster
                .set_node_label(&self.id.node, &self.id.provisioner, v)
                .await
            {
                Ok(()) => report.labelled = Some(want),
                Err(e) => report.failed.push(e.to_string()),
            }
        }
        labels
            .get(HOSTNAME_LABEL)
            .cloned()
            .unwrap_or_else(|| self.id.node.clone())
    }

    async fn claim(
        &mut self,
        c: &PersistentVolumeClaim,
        volumes: &std::collections::HashSet<String>,
        cfg: &LocalPathConfig,
        hostname: &str,
        report: &mut Report,
    ) {
        let step = self.plan_claim(c, volumes, cfg, hostname).await;
        let who = claim_ref(c);
        match step {
            Step::Skip => {}
            Step::Done(pv, path) => {
                let msg = format!(
                    "flexvol provisioned volume {pv} at {} on node {}",
                    path.display(),
                    self.id.node
                );
                self.say(
                    Self::claim_event(c, false, "ProvisioningSucceeded", msg),
                    report,
                )
                .await;
                report.provisioned.push((pv, path));
            }
            Step::Fail(why) => {
                let msg = format!("flexvol on node {}: {why}", self.id.node);
                report.failed.push(format!("{who}: {msg}"));
                self.say(
                    Self::claim_event(c, true, "ProvisioningFailed", msg),
                    report,
                )
                .await;
            }
            Step::Reschedule(why) => {
                let ns = c.metadata.namespace.as_deref().unwrap_or("");
                let name = c.metadata.name.as_deref().unwrap_or("");
                match self.cluster.unselect_node(ns, name, &self.id.node).await {
                    Ok(()) => {
                        let msg = format!(
                            "node {} cannot serve this claim: {why}; the scheduler will pick another node (to use this node, give it a root in its flexvol config)",
                            self.id.node
                        );
                        report.rescheduled.push(who);
                        // Every reschedule is news: never deduplicated.
                        let ev = Self::claim_event(c, true, "ProvisioningFailed", msg);
                        if let Err(e) = self.cluster.event(&ev).await {
                            report.failed.push(format!("cannot record event: {e}"));
                        }
                    }
                    Err(e) => report.failed.push(e.to_string()),
                }
            }
        }
    }

    async fn plan_claim(
        &mut self,
        c: &PersistentVolumeClaim,
        volumes: &std::collections::HashSet<String>,
        cfg: &LocalPathConfig,
        hostname: &str,
    ) -> Step {
        let meta = &c.metadata;
        let ours = [ANN_PROVISIONER_BETA, ANN_PROVISIONER]
            .iter()
            .any(|k| ann(meta, k) == Some(self.id.provisioner.as_str()));
        if !ours
            || ann(meta, ANN_SELECTED_NODE) != Some(self.id.node.as_str())
            || meta.deletion_timestamp.is_some()
        {
            return Step::Skip;
        }
        let spec = c.spec.clone().unwrap_or_default();
        let phase = c.status.as_ref().and_then(|s| s.phase.as_deref());
        if spec.volume_name.as_deref().is_some_and(|v| !v.is_empty())
            || phase.is_some_and(|p| p != "Pending")
        {
            return Step::Skip;
        }
        let (Some(uid), Some(ns), Some(name)) = (&meta.uid, &meta.namespace, &meta.name) else {
            return Step::Skip;
        };
        let pv_name = format!("pvc-{uid}");
        if volumes.contains(&pv_name) {
            return Step::Skip; // made already; the PV controller binds it
        }
        let Some(class_name) = spec.storage_class_name.clone().filter(|s| !s.is_empty()) else {
            return Step::Skip;
        };
        let class = match self.cluster.get_class(&class_name).await {
            Ok(Some(sc)) if sc.provisioner == self.id.provisioner => sc,
            Ok(_) => return Step::Skip,
            Err(e) => {
                return Step::Fail(format!(
                    "cannot read StorageClass {class_name}: {e}; retrying"
                ));
            }
        };

        // Validate everything before anything exists.
        let params = match ClassParams::parse(class.parameters.iter().flatten()) {
            Ok(p) => p,
            Err(why) => {
                return Step::Fail(format!(
                    "StorageClass {class_name}: {why}; fix the class (a new class, since parameters cannot be edited) and recreate the claim; nothing was created"
                ));
            }
        };
        if spec.volume_mode.as_deref() == Some("Block") {
            return Step::Fail(
                "volumeMode Block is not supported by the hostpath provisioner (it makes directories); use volumeMode Filesystem".into(),
            );
        }
        if spec.selector.is_some() {
            return Step::Fail(
                "claims with a selector are not supported by the hostpath provisioner; remove spec.selector".into(),
            );
        }
        let modes = spec.access_modes.clone().unwrap_or_default();
        if modes.is_empty()
            || modes
                .iter()
                .any(|m| m != "ReadWriteOnce" && m != "ReadWriteOncePod")
        {
            return Step::Fail(format!(
                "access modes {modes:?} are not supported: a node-local directory serves one node; use ReadWriteOnce"
            ));
        }
        let Some(size) = spec
            .resources
            .as_ref()
            .and_then(|r| r.requests.as_ref())
            .and_then(|r| r.get("storage"))
            .cloned()
        else {
            return Step::Fail(
                "the claim requests no storage size; set spec.resources.requests.storage".into(),
            );
        };
        let rel = match &params.path_pattern {
            Some(p) => match hostpath::expand_pattern(p, &pv_name, ns, name) {
                Ok(rel) => rel,
                Err(why) => return Step::Fail(format!("StorageClass {class_name}: {why}")),
            },
            None => hostpath::default_rel_path(&pv_name, ns, name),
        };

        // Can this node serve it at all?
        let configured = cfg.roots_for(&self.id.node, &class_name);
        if configured.is_empty() {
            return Step::Reschedule(format!(
                "its flexvol config has no root for StorageClass {class_name}"
            ));
        }
        let (roots, bad) = usable_roots(&configured, true);
        // A directory made for this PV by an earlier (killed) pass wins; else the most free space.
        let chosen = roots
            .iter()
            .find(|r| matches!(hostpath::inspect(r, &rel), DirState::Marked(m) if m.volume == pv_name))
            .or_else(|| {
                roots
                    .iter()
                    .max_by_key(|r| hostpath::free_bytes(&r.real).unwrap_or(0))
            });
        let Some(root) = chosen else {
            return Step::Reschedule(format!("no usable root ({})", bad.join("; ")));
        };
        let marker = Marker {
            provisioner: self.id.provisioner.clone(),
            volume: pv_name.clone(),
            namespace: ns.clone(),
            claim: name.clone(),
            claim_uid: uid.clone(),
            node: self.id.node.clone(),
        };
        let path = match hostpath::create_volume_dir(root, &rel, params.ownership, &marker) {
            Ok(p) => p,
            Err(why) => return Step::Fail(why),
        };
        checkpoint("provisioner-after-directory");

        let pv = self.build_pv(c, &class, &pv_name, &path, hostname, size, modes);
        match self.cluster.create_volume(&pv).await {
            Ok(()) => {
                checkpoint("provisioner-after-pv");
                Step::Done(pv_name, path)
            }
            Err(e) if e.kind == ApiErrorKind::AlreadyExists => {
                match self.cluster.get_volume(&pv_name).await {
                    Ok(Some(v)) if self.is_ours_for(&v, uid) => Step::Done(pv_name, path),
                    Ok(_) => Step::Fail(format!(
                        "a PV named {pv_name} exists and was not provisioned by {} for this claim; delete it",
                        self.id.provisioner
                    )),
                    Err(e) => Step::Fail(format!("{e}; retrying")),
                }
            }
            Err(e) => Step::Fail(format!("{e}; retrying")),
        }
    }

    fn is_ours_for(&self, v: &PersistentVolume, claim_uid: &str) -> bool {
        ann(&v.metadata, ANN_PROVISIONED_BY) == Some(self.id.provisioner.as_str())
            && v.spec
                .as_ref()
                .and_then(|s| s.claim_ref.as_ref())
                .and_then(|r| r.uid.as_deref())
                == Some(claim_uid)
    }

    /// The PV for a claim, as the external-provisioner protocol wants it.
    #[allow(clippy::too_many_arguments)]
    pub fn build_pv(
        &self,
        c: &PersistentVolumeClaim,
        class: &StorageClass,
        pv_name: &str,
        path: &std::path::Path,
        hostname: &str,
        size: k8s_openapi::apimachinery::pkg::api::resource::Quantity,
        modes: Vec<String>,
    ) -> PersistentVolume {
        let annotations = BTreeMap::from([
            (ANN_PROVISIONED_BY.to_owned(), self.id.provisioner.clone()),
            (ANN_NODE.to_owned(), self.id.node.clone()),
        ]);
        let options = BTreeMap::from([
            ("path".to_owned(), path.display().to_string()),
            ("type".to_owned(), "Directory".to_owned()),
        ]);
        PersistentVolume {
            metadata: ObjectMeta {
                name: Some(pv_name.to_owned()),
                annotations: Some(annotations),
                ..Default::default()
            },
            spec: Some(PersistentVolumeSpec {
                access_modes: Some(modes),
                capacity: Some(BTreeMap::from([("storage".to_owned(), size)])),
                // Built by hand: selfLink is gone in 1.20.
                claim_ref: Some(ObjectReference {
                    api_version: Some("v1".into()),
                    kind: Some("PersistentVolumeClaim".into()),
                    namespace: c.metadata.namespace.clone(),
                    name: c.metadata.name.clone(),
                    uid: c.metadata.uid.clone(),
                    resource_version: c.metadata.resource_version.clone(),
                    ..Default::default()
                }),
                flex_volume: Some(FlexPersistentVolumeSource {
                    driver: self.id.provisioner.clone(),
                    options: Some(options),
                    ..Default::default()
                }),
                mount_options: class.mount_options.clone(),
                node_affinity: Some(VolumeNodeAffinity {
                    required: Some(NodeSelector {
                        node_selector_terms: vec![NodeSelectorTerm {
                            match_expressions: Some(vec![NodeSelectorRequirement {
                                key: HOSTNAME_LABEL.into(),
                                operator: "In".into(),
                                values: Some(vec![hostname.to_owned()]),
                            }]),
                            ..Default::default()
                        }],
                    }),
                }),
                persistent_volume_reclaim_policy: Some(
                    class
                        .reclaim_policy
                        .clone()
                        .unwrap_or_else(|| "Delete".into()),
                ),
                storage_class_name: Some(class.metadata.name.clone().unwrap_or_default()),
                volume_mode: Some("Filesystem".into()),
                ..Default::default()
            }),
            status: None,
        }
    }

    /// Released, Delete, provisioned by us, on this node, not being deleted.
    fn is_ours_to_delete(&self, v: &PersistentVolume) -> bool {
        let spec = v.spec.as_ref();
        ann(&v.metadata, ANN_PROVISIONED_BY) == Some(self.id.provisioner.as_str())
            && ann(&v.metadata, ANN_NODE) == Some(self.id.node.as_str())
            && v.metadata.deletion_timestamp.is_none()
            && v.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Released")
            && spec.and_then(|s| s.persistent_volume_reclaim_policy.as_deref()) == Some("Delete")
    }

    async fn delete(
        &mut self,
        cached: &PersistentVolume,
        cfg: &LocalPathConfig,
        report: &mut Report,
    ) {
        let Some(name) = cached.metadata.name.clone() else {
            return;
        };
        // The cache may be stale: decide on the object as the server has it now.
        let v = match self.cluster.get_volume(&name).await {
            Ok(Some(v)) if self.is_ours_to_delete(&v) => v,
            Ok(_) => return,
            Err(e) => {
                report.failed.push(e.to_string());
                return;
            }
        };
        let uid = v.metadata.uid.clone().unwrap_or_default();
        let spec = v.spec.clone().unwrap_or_default();
        let claim_uid = spec
            .claim_ref
            .as_ref()
            .and_then(|r| r.uid.clone())
            .unwrap_or_default();
        let path = spec
            .flex_volume
            .as_ref()
            .and_then(|f| f.options.as_ref())
            .and_then(|o| o.get("path"))
            .map(PathBuf::from);
        let result = match path {
            None => Err("it has no flexVolume path option".to_string()),
            Some(path) => {
                let (roots, _) = usable_roots(&cfg.node_roots(&self.id.node), false);
                match hostpath::locate(&roots, &path) {
                    None => Err(format!(
                        "its path {} is not below a root of node {}'s flexvol config; if a root was removed from the config, add it back; otherwise delete the directory by hand and then the PV",
                        path.display(),
                        self.id.node
                    )),
                    Some((root, rel)) => {
                        hostpath::delete_volume_dir(root, &rel, &name, &claim_uid).map(|_| ())
                    }
                }
            }
        };
        let failure = match result {
            Err(why) => Some(why),
            Ok(()) => {
                checkpoint("provisioner-delete-before-pv");
                match self.cluster.delete_volume(&name, &uid).await {
                    Ok(()) => None,
                    Err(e) if e.kind == ApiErrorKind::NotFound => None,
                    Err(e) => Some(format!(
                        "the directory was removed but the PV was not: {e}; retrying"
                    )),
                }
            }
        };
        match failure {
            None => report.deleted.push(name),
            Some(why) => {
                report.failed.push(format!("PV {name}: {why}"));
                let ev = EventSpec {
                    kind: "PersistentVolume",
                    namespace: String::new(),
                    name: name.clone(),
                    uid,
                    warning: true,
                    reason: "VolumeFailedDelete",
                    message: format!("flexvol on node {}: {why}", self.id.node),
                };
                self.say(ev, report).await;
            }
        }
    }
}
