//! `flexvol migrate`: a bound flexVolume PV of flexvol's drivers becomes the equivalent CSI PV
//! (served by `flexvol csi`), the data in place, the claim bound to it again by name and uid;
//! `--rollback` does the reverse. A dry run unless `--apply`.
//!
//! A PV's source is immutable, so the PV is re-created under the **same name**: the capability
//! token of a provisioned volume is bound to the PV's name and its claim's namespace, so it keeps
//! working, and `flexvol csi` takes the PV's name from kubelet's paths (docs/csi.md). The steps:
//!
//! 1. **decide** ([`plan`], no call): the PV must be bound, of a flexvol driver
//!    (`<vendor>/<kind>`), without `mountOptions` or `secretRef` (flexvol csi takes neither); no
//!    pod that has not finished may use its claim (kubelet unmounts a volume only when its pods
//!    are gone: stop them first, e.g. scale their owners to 0), and no node may still list its
//!    volume as attached or in use ([`holders`]: an LV kubelet has not unmounted or the
//!    attach-detach controller has not detached yet);
//! 2. **journal**: the PV as it is, written root-only (0600 in a 0700 directory) before anything
//!    changes; every later step starts by reading it, so a `kill -9` anywhere converges on the
//!    next run (`migrate-after-*` fault checkpoints prove it);
//! 3. the old PV's reclaim policy set to `Retain` (nothing reclaims the volume while no PV names
//!    it), then the PV deleted (only the one with the journal's uid) and its finalizers removed
//!    (`kubernetes.io/pv-protection` holds a bound PV forever otherwise); the claim is `Lost` for
//!    that moment;
//! 4. the new PV created: same name, capacity, access modes, class, node affinity, labels,
//!    annotations, the provisioner's finalizer, `claimRef` by the claim's namespace, name and uid,
//!    reclaim `Retain`; the PV controller binds the claim again (`Lost` → `Bound`);
//! 5. once the claim is bound to it, the journal's reclaim policy restored, the journal removed.
//!
//! **Safety rules.** Nothing but the PV object changes: no volume data, no directory, no LV is
//! touched. Only PVs of flexvol's drivers, only bound ones, only while no pod uses their claim;
//! the old PV is deleted only with the journal's uid as a precondition and only after its
//! reclaim policy reads `Retain`. Values of the PV (options, tokens) are never printed.

#![allow(clippy::print_stdout)]

use crate::k8s::call::call;
use crate::k8s::error::{ApiErrorKind, ApiResult};
use crate::sys::process::checkpoint;
use crate::vocab::FINALIZER;
use clap::Args;
use k8s_openapi::api::core::v1::{
    CSIPersistentVolumeSource, FlexPersistentVolumeSource, Node, ObjectReference, PersistentVolume,
    PersistentVolumeClaim, Pod,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, Preconditions};
use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// PV annotation on a migrated PV: the flexVolume driver it came from (what `--rollback` restores).
pub(crate) const ANN_MIGRATED_FROM: &str = "flexvol/migrated-from";
/// The kinds flexvol's drivers serve.
const KINDS: [&str; 3] = ["hostpath", "nfs", "lvm"];
/// How long the old PV may take to go, and the claim to be bound again.
const STEP_WAIT: Duration = Duration::from_secs(90);

/// Arguments of `flexvol migrate`.
#[derive(Args, Debug, Clone)]
pub(crate) struct MigrateArgs {
    /// The PVs to move (by name).
    #[arg(value_name = "PV")]
    pub(crate) pvs: Vec<String>,
    /// Every PV of flexvol's bound to a claim of this namespace (instead of naming PVs).
    #[arg(long, value_name = "NS", conflicts_with = "pvs")]
    pub(crate) namespace: Option<String>,
    /// Act; without it, only say what would be done.
    #[arg(long)]
    pub(crate) apply: bool,
    /// Move CSI PVs that `flexvol migrate` made back to the flexVolume PVs they were.
    #[arg(long)]
    pub(crate) rollback: bool,
    /// The CSI driver name of each kind's plugin is `<kind>.<DOMAIN>` (`flexvol csi --driver-name`).
    #[arg(long, value_name = "DOMAIN", default_value = "csi.flexvol.io")]
    pub(crate) csi_domain: String,
    /// Vendor part of the flexVolume driver names (as given to `flexvol install`).
    #[arg(long, default_value = "flexvol", value_name = "NAME")]
    pub(crate) vendor: String,
    /// The kubeconfig of a cluster admin (default: in-cluster service account).
    #[arg(long, value_name = "FILE")]
    pub(crate) kubeconfig: Option<PathBuf>,
    /// Where each move's journal is kept until it is done (root-only).
    #[arg(long, value_name = "DIR", default_value = "/var/lib/flexvol/migrate")]
    pub(crate) journal_dir: PathBuf,
}

/// Which way a PV moves.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum To {
    /// To a CSI PV of the kind's driver under this domain (`<kind>.<domain>`, the kind decided
    /// by [`plan`] from the flexVolume driver).
    Csi(String),
    /// Back to the flexVolume PV it was (`--rollback`).
    FlexVolume,
}

/// Why a PV is not moved (said, never retried).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum Refusal {
    /// Moved already (nothing to do: not an error).
    #[error("already a {0} PV; nothing to do")]
    Done(&'static str),
    /// Not a PV this tool moves, with why.
    #[error("{0}")]
    NotOurs(String),
    /// A pod that has not finished uses its claim.
    #[error(
        "its claim {claim} is used by pod(s) {pods}: stop them first (delete them, or scale their owners to 0), then run migrate again"
    )]
    InUse {
        /// `namespace/name` of the claim.
        claim: String,
        /// The pods, comma-separated.
        pods: String,
    },
    /// No pod uses the claim any more, but a node still has the volume attached or in use
    /// (kubelet has not finished unmounting it, or the attach-detach controller has not detached
    /// it): moving it now would leave that node's teardown to a PV that no longer exists.
    #[error(
        "its volume is still attached to or in use on node(s) {nodes} (status.volumesAttached, status.volumesInUse): wait until kubelet has unmounted it and it is detached, then run migrate again"
    )]
    OnNode {
        /// The nodes, comma-separated.
        nodes: String,
    },
}

/// The journal of one move: the PV as it was, and the one to create.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Journal {
    /// The PV before the move, as read (its uid is the delete's precondition).
    pub(crate) old: PersistentVolume,
    /// The PV to create.
    pub(crate) new: PersistentVolume,
}

/// The claim `namespace/name` and uid a PV is bound to, when it is bound.
fn bound_claim(pv: &PersistentVolume) -> Option<(String, String, String)> {
    let bound = pv.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound");
    bound_claim_ref(pv).filter(|(_, _, uid)| bound && !uid.is_empty())
}

/// Decides the PV to create for `pv` moving `to` (step 1, no call); `users`: the pods that have
/// not finished and use its claim; `holders`: the nodes that still list its volume as attached
/// or in use ([`holders`]).
pub(crate) fn plan(
    pv: &PersistentVolume,
    to: &To,
    vendor: &str,
    users: &[String],
    holders: &[String],
) -> Result<PersistentVolume, Refusal> {
    let name = pv.metadata.name.clone().unwrap_or_default();
    let spec = pv
        .spec
        .as_ref()
        .ok_or_else(|| Refusal::NotOurs("it has no spec".into()))?;
    let not_ours = |why: &str| Refusal::NotOurs(why.to_owned());
    let anns = pv.metadata.annotations.clone().unwrap_or_default();
    let mut new_anns = anns.clone();
    let (csi, flex) = match to {
        To::Csi(domain) => {
            if spec.csi.is_some() {
                return Err(Refusal::Done("CSI"));
            }
            let f = spec
                .flex_volume
                .as_ref()
                .ok_or_else(|| not_ours("it is neither a flexVolume nor a CSI PV"))?;
            let kind = kind_of(&f.driver, vendor).ok_or_else(|| {
                    not_ours(&format!(
                        "its flexVolume driver {:?} is not one of {vendor}/hostpath, {vendor}/nfs, {vendor}/lvm",
                        crate::protocol::options::bounded(&f.driver)
                    ))
                })?;
            if f.secret_ref.is_some() {
                return Err(not_ours(
                    "it has a flexVolume secretRef, which flexvol csi does not take",
                ));
            }
            let options = f.options.clone().unwrap_or_default();
            let handle = crate::vocab::csi_handle(kind, &name, &options).ok_or_else(|| {
                not_ours(
                    "its options name no volumegroup and volumeID (an LVM CSI volume handle is <vg>/<lv>)",
                )
            })?;
            new_anns.insert(ANN_MIGRATED_FROM.to_owned(), f.driver.clone());
            let csi = CSIPersistentVolumeSource {
                driver: format!("{kind}.{domain}"),
                volume_handle: handle,
                fs_type: f.fs_type.clone(),
                read_only: f.read_only,
                volume_attributes: Some(options),
                ..Default::default()
            };
            (Some(csi), None)
        }
        To::FlexVolume => {
            if spec.flex_volume.is_some() {
                return Err(Refusal::Done("flexVolume"));
            }
            let c = spec
                .csi
                .as_ref()
                .ok_or_else(|| not_ours("it is neither a flexVolume nor a CSI PV"))?;
            let driver = anns
                .get(ANN_MIGRATED_FROM)
                .filter(|d| kind_of(d, vendor).is_some())
                .ok_or_else(|| {
                    not_ours(&format!(
                        "it has no {ANN_MIGRATED_FROM} annotation naming a driver of {vendor}: flexvol migrate did not make it"
                    ))
                })?;
            new_anns.remove(ANN_MIGRATED_FROM);
            let flex = FlexPersistentVolumeSource {
                driver: driver.clone(),
                fs_type: c.fs_type.clone(),
                read_only: c.read_only,
                options: c.volume_attributes.clone(),
                ..Default::default()
            };
            (None, Some(flex))
        }
    };
    if spec.mount_options.as_ref().is_some_and(|m| !m.is_empty()) {
        return Err(not_ours(
            "it has mountOptions, which flexvol csi refuses as mount flags: move them to the volume's mountOptions attribute (nfs, lvm) first",
        ));
    }
    let (ns, claim, uid) = bound_claim(pv).ok_or_else(|| {
        not_ours("it is not bound to a claim (only bound PVs are moved; re-create an unbound one by hand)")
    })?;
    if !users.is_empty() {
        return Err(Refusal::InUse {
            claim: format!("{ns}/{claim}"),
            pods: users.join(", "),
        });
    }
    if !holders.is_empty() {
        return Err(Refusal::OnNode {
            nodes: holders.join(", "),
        });
    }
    let finalizers: Vec<String> = pv
        .metadata
        .finalizers
        .iter()
        .flatten()
        .filter(|f| f.as_str() == FINALIZER)
        .cloned()
        .collect();
    Ok(PersistentVolume {
        metadata: ObjectMeta {
            name: Some(name),
            labels: pv.metadata.labels.clone(),
            annotations: Some(new_anns),
            finalizers: (!finalizers.is_empty()).then_some(finalizers),
            ..Default::default()
        },
        spec: Some(k8s_openapi::api::core::v1::PersistentVolumeSpec {
            access_modes: spec.access_modes.clone(),
            capacity: spec.capacity.clone(),
            claim_ref: Some(ObjectReference {
                api_version: Some("v1".into()),
                kind: Some("PersistentVolumeClaim".into()),
                namespace: Some(ns),
                name: Some(claim),
                uid: Some(uid),
                ..Default::default()
            }),
            csi,
            flex_volume: flex,
            node_affinity: spec.node_affinity.clone(),
            persistent_volume_reclaim_policy: Some("Retain".into()),
            storage_class_name: spec.storage_class_name.clone(),
            volume_mode: spec.volume_mode.clone(),
            ..Default::default()
        }),
        status: None,
    })
}

/// The kind of a flexVolume driver of `vendor` (`<vendor>/<kind>`), if it is one of flexvol's.
fn kind_of<'a>(driver: &'a str, vendor: &str) -> Option<&'a str> {
    driver
        .strip_prefix(vendor)
        .and_then(|k| k.strip_prefix('/'))
        .filter(|k| KINDS.contains(k))
}

/// The pods of `namespace` that have not finished and use claim `claim`.
fn users(pods: &[Pod], claim: &str) -> Vec<String> {
    pods.iter()
        .filter(|p| {
            !matches!(
                p.status.as_ref().and_then(|s| s.phase.as_deref()),
                Some("Succeeded" | "Failed")
            )
        })
        .filter(|p| {
            p.spec
                .iter()
                .flat_map(|s| s.volumes.iter().flatten())
                .any(|v| {
                    v.persistent_volume_claim
                        .as_ref()
                        .is_some_and(|c| c.claim_name == claim)
                })
        })
        .filter_map(|p| p.metadata.name.clone())
        .collect()
}

/// The nodes whose status lists `pv`'s volume as attached or in use. kubelet and the
/// attach-detach controller name a volume `<plugin>/<volume name>`: a flexVolume PV's is
/// `<driver>/<PV name>` (the plugin is named by its driver, `flexvol/lvm`; the driver's
/// `getvolumename` answer is ignored: the PV's name is used; seen on kubelet 1.20 in deploy-e2e,
/// which asserts it), a CSI PV's `kubernetes.io/csi/<driver>^<handle>`. kubelet lists attachable
/// (flexvol's LVM) volumes from before they are mounted until they are unmounted; the controller
/// lists them until they are detached. hostPath and NFS volumes are not attachable and never
/// listed: for them the claim's pods are the evidence (kubelet lets a pod go only after its
/// volumes are unmounted).
fn holders(nodes: &[Node], pv: &PersistentVolume) -> Vec<String> {
    let name = pv.metadata.name.as_deref().unwrap_or_default();
    let spec = pv.spec.as_ref();
    let mut names = Vec::new();
    if let Some(f) = spec.and_then(|s| s.flex_volume.as_ref()) {
        names.push(format!("{}/{name}", f.driver));
    }
    if let Some(c) = spec.and_then(|s| s.csi.as_ref()) {
        names.push(format!(
            "kubernetes.io/csi/{}^{}",
            c.driver, c.volume_handle
        ));
    }
    nodes
        .iter()
        .filter(|n| {
            let st = n.status.as_ref();
            let in_use = st
                .and_then(|s| s.volumes_in_use.as_ref())
                .into_iter()
                .flatten();
            let attached = st
                .and_then(|s| s.volumes_attached.as_ref())
                .into_iter()
                .flatten()
                .map(|a| &a.name);
            in_use.chain(attached).any(|v| names.contains(v))
        })
        .filter_map(|n| n.metadata.name.clone())
        .collect()
}

/// A PV name usable as a file name (a DNS subdomain, as the API server requires of PV names).
fn check_pv_name(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= 253
        && name
            .bytes()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-' || c == b'.')
        && !name.starts_with('.');
    if ok {
        Ok(())
    } else {
        Err(format!(
            "{:?} is not a PV name (lowercase letters, digits, '-' and '.')",
            crate::protocol::options::bounded(name)
        ))
    }
}

/// The journals, one file per PV, root-only.
struct Journals(PathBuf);

impl Journals {
    fn path(&self, pv: &str) -> PathBuf {
        self.0.join(format!("{pv}.json"))
    }

    fn load(&self, pv: &str) -> Result<Option<Journal>, String> {
        let p = self.path(pv);
        match std::fs::read(&p) {
            Ok(b) => serde_json::from_slice(&b)
                .map(Some)
                .map_err(|e| format!("journal {} is not readable: {e}; move it away only if the PV is as it should be", p.display())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(format!("cannot read journal {}: {e}", p.display())),
        }
    }

    fn save(&self, pv: &str, j: &Journal) -> Result<(), String> {
        use crate::sys::paths::Place;
        use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
        let err =
            |what: &str, e: std::io::Error| format!("cannot {what} in {}: {e}", self.0.display());
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&self.0)
            .map_err(|e| err("create the journal directory", e))?;
        let md = std::fs::symlink_metadata(&self.0).map_err(|e| err("stat", e))?;
        if !md.is_dir() || md.permissions().mode() & 0o077 != 0 {
            return Err(format!(
                "journal directory {} must be a directory only its owner can use (0700)",
                self.0.display()
            ));
        }
        let data = serde_json::to_vec(j).map_err(|e| format!("cannot encode the journal: {e}"))?;
        crate::sys::paths::write_private(&self.path(pv), &data, 0o600, Place::Replace)
            .map(drop)
            .map_err(|e| err("write the journal", e))
    }

    fn remove(&self, pv: &str) -> Result<(), String> {
        match std::fs::remove_file(self.path(pv)) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(format!(
                "cannot remove journal {}: {e}",
                self.path(pv).display()
            )),
            _ => Ok(()),
        }
    }
}

/// What a run did to one PV, said in one line.
type Outcome = Result<String, String>;

/// Runs `flexvol migrate`; exit status 0 when every PV was moved (or would be, or was already),
/// 1 when one was refused or failed, 2 for bad arguments or no API server.
pub(crate) fn run(a: &MigrateArgs) -> i32 {
    if a.pvs.is_empty() && a.namespace.is_none() {
        println!("flexvol migrate: error: name the PVs to move, or give --namespace");
        return 2;
    }
    for pv in &a.pvs {
        if let Err(e) = check_pv_name(pv) {
            println!("flexvol migrate: error: {e}");
            return 2;
        }
    }
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            println!("flexvol migrate: error: cannot start: {e}");
            return 2;
        }
    };
    rt.block_on(async {
        let client = match crate::k8s::client::client(a.kubeconfig.as_deref(), None).await {
            Ok(c) => c,
            Err(e) => {
                println!("flexvol migrate: error: {e}");
                return 2;
            }
        };
        let pvs = match &a.namespace {
            None => a.pvs.clone(),
            Some(ns) => match select(&client, a, ns).await {
                Ok(p) => p,
                Err(e) => {
                    println!("flexvol migrate: error: {e}");
                    return 2;
                }
            },
        };
        let journals = Journals(a.journal_dir.clone());
        let mut failed = 0;
        for pv in &pvs {
            match one(&client, a, &journals, pv).await {
                Ok(done) => println!("flexvol migrate: PV {pv}: {done}"),
                Err(why) => {
                    failed += 1;
                    println!("flexvol migrate: PV {pv}: not moved: {why}");
                }
            }
        }
        if pvs.is_empty() {
            println!("flexvol migrate: no PV to move");
        }
        i32::from(failed > 0)
    })
}

/// The PVs `--namespace ns` names: bound to a claim of `ns`, of flexvol's drivers (to CSI) or
/// made by `flexvol migrate` (`--rollback`), and those with a journal left by a killed run.
async fn select(client: &kube::Client, a: &MigrateArgs, ns: &str) -> ApiResult<Vec<String>> {
    let api = Api::<PersistentVolume>::all(client.clone());
    let list = call("list PVs", api.list(&ListParams::default())).await?;
    let prefix = format!("{}/", a.vendor);
    Ok(list
        .items
        .iter()
        .filter(|pv| {
            pv.spec
                .as_ref()
                .and_then(|s| s.claim_ref.as_ref())
                .and_then(|r| r.namespace.as_deref())
                == Some(ns)
        })
        .filter(|pv| {
            let spec = pv.spec.as_ref();
            if a.rollback {
                spec.is_some_and(|s| s.csi.is_some())
                    && pv
                        .metadata
                        .annotations
                        .as_ref()
                        .is_some_and(|m| m.contains_key(ANN_MIGRATED_FROM))
            } else {
                spec.and_then(|s| s.flex_volume.as_ref())
                    .is_some_and(|f| f.driver.starts_with(&prefix))
            }
        })
        .filter_map(|pv| pv.metadata.name.clone())
        .collect())
}

/// One PV, from wherever its journal says a killed run stopped.
async fn one(client: &kube::Client, a: &MigrateArgs, journals: &Journals, name: &str) -> Outcome {
    let pvs = Api::<PersistentVolume>::all(client.clone());
    let e = |x: crate::k8s::error::ApiError| x.to_string();
    let journal = journals.load(name)?;
    let current = call(format!("get PV {name}"), pvs.get_opt(name))
        .await
        .map_err(e)?;
    let j = match (journal, current) {
        (Some(j), _) => j,
        (None, None) => return Err("no PV of that name".into()),
        (None, Some(pv)) => {
            let to = if a.rollback {
                To::FlexVolume
            } else {
                To::Csi(a.csi_domain.clone())
            };
            let claim = pv
                .spec
                .as_ref()
                .and_then(|s| s.claim_ref.as_ref())
                .and_then(|r| Some((r.namespace.clone()?, r.name.clone()?)));
            let users = match &claim {
                Some((ns, c)) => {
                    let pods = Api::<Pod>::namespaced(client.clone(), ns);
                    let list = call(
                        format!("list pods of {ns}"),
                        pods.list(&ListParams::default()),
                    )
                    .await
                    .map_err(e)?;
                    users(&list.items, c)
                }
                None => Vec::new(),
            };
            let nodes = Api::<Node>::all(client.clone());
            let list = call("list nodes".to_owned(), nodes.list(&ListParams::default()))
                .await
                .map_err(e)?;
            let holders = holders(&list.items, &pv);
            let new = match plan(&pv, &to, &a.vendor, &users, &holders) {
                Ok(n) => n,
                Err(Refusal::Done(api)) => return Ok(format!("already a {api} PV; nothing to do")),
                Err(r) => return Err(r.to_string()),
            };
            let what = describe(&pv, &new);
            if !a.apply {
                return Ok(format!("would move {what} (dry run: add --apply)"));
            }
            let j = Journal { old: pv, new };
            journals.save(name, &j)?;
            checkpoint("migrate-after-journal");
            j
        }
    };
    act(client, &pvs, journals, name, &j).await?;
    Ok(format!("moved {}", describe(&j.old, &j.new)))
}

/// `from <source> to <source>` of a move, for the output (drivers and handles, never options).
fn describe(old: &PersistentVolume, new: &PersistentVolume) -> String {
    let source = |pv: &PersistentVolume| {
        let spec = pv.spec.as_ref();
        if let Some(c) = spec.and_then(|s| s.csi.as_ref()) {
            format!(
                "CSI {} (handle {})",
                c.driver,
                crate::protocol::options::bounded(&c.volume_handle)
            )
        } else if let Some(f) = spec.and_then(|s| s.flex_volume.as_ref()) {
            format!("flexVolume {}", f.driver)
        } else {
            "?".into()
        }
    };
    let claim =
        bound_claim(old).map_or_else(String::new, |(ns, c, _)| format!(" of claim {ns}/{c}"));
    format!("from {} to {}{claim}", source(old), source(new))
}

/// Steps 3 to 5 for journal `j`: each one skipped when already done.
async fn act(
    client: &kube::Client,
    pvs: &Api<PersistentVolume>,
    journals: &Journals,
    name: &str,
    j: &Journal,
) -> Result<(), String> {
    let e = |x: crate::k8s::error::ApiError| x.to_string();
    let old_uid = j.old.metadata.uid.clone().unwrap_or_default();
    let is_new = |pv: &PersistentVolume| {
        let spec = pv.spec.as_ref();
        let want_csi = j.new.spec.as_ref().is_some_and(|s| s.csi.is_some());
        pv.metadata.uid.as_deref() != Some(old_uid.as_str())
            && spec.is_some_and(|s| s.csi.is_some() == want_csi)
    };
    // 3. The old PV: Retain, deleted (its uid a precondition), finalizers removed.
    let deadline = Instant::now() + STEP_WAIT;
    loop {
        let cur = call(format!("get PV {name}"), pvs.get_opt(name))
            .await
            .map_err(e)?;
        match cur {
            Some(pv) if pv.metadata.uid.as_deref() == Some(old_uid.as_str()) => {
                let reclaim = pv
                    .spec
                    .as_ref()
                    .and_then(|s| s.persistent_volume_reclaim_policy.as_deref());
                if reclaim != Some("Retain") {
                    let p =
                        serde_json::json!({"spec": {"persistentVolumeReclaimPolicy": "Retain"}});
                    call(
                        format!("set PV {name} to Retain"),
                        pvs.patch(name, &PatchParams::default(), &Patch::Merge(&p)),
                    )
                    .await
                    .map_err(e)?;
                    continue; // read again: delete only what reads Retain
                }
                if pv.metadata.deletion_timestamp.is_none() {
                    checkpoint("migrate-after-retain");
                    let dp = DeleteParams {
                        preconditions: Some(Preconditions {
                            uid: Some(old_uid.clone()),
                            resource_version: None,
                        }),
                        ..Default::default()
                    };
                    match call(format!("delete PV {name}"), pvs.delete(name, &dp)).await {
                        Ok(_) => {}
                        Err(x) if x.kind == ApiErrorKind::NotFound => {}
                        Err(x) => return Err(x.to_string()),
                    }
                    checkpoint("migrate-after-delete");
                }
                if pv
                    .metadata
                    .finalizers
                    .as_ref()
                    .is_some_and(|f| !f.is_empty())
                {
                    let p = serde_json::json!([
                        {"op": "test", "path": "/metadata/uid", "value": old_uid},
                        {"op": "replace", "path": "/metadata/finalizers", "value": []}
                    ]);
                    let patch: json_patch::Patch =
                        serde_json::from_value(p).map_err(|x| x.to_string())?;
                    match call(
                        format!("remove PV {name}'s finalizers"),
                        pvs.patch(name, &PatchParams::default(), &Patch::<()>::Json(patch)),
                    )
                    .await
                    {
                        Ok(_) => {}
                        Err(x)
                            if matches!(x.kind, ApiErrorKind::NotFound | ApiErrorKind::Other) => {}
                        Err(x) => return Err(x.to_string()),
                    }
                }
            }
            Some(pv) if is_new(&pv) => break,
            Some(_) => {
                return Err(format!(
                    "a PV {name} exists that is neither the one journaled (uid {old_uid}) nor the new one; journal {} kept",
                    journals.path(name).display()
                ));
            }
            None => {
                // 4. The new PV.
                match call(
                    format!("create PV {name}"),
                    pvs.create(&PostParams::default(), &j.new),
                )
                .await
                {
                    Ok(_) => {}
                    Err(x) if x.kind == ApiErrorKind::AlreadyExists => {}
                    Err(x) => return Err(x.to_string()),
                }
                checkpoint("migrate-after-create");
                continue;
            }
        }
        if Instant::now() > deadline {
            return Err(format!(
                "PV {name} was not gone within {} s; run migrate again",
                STEP_WAIT.as_secs()
            ));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    // 5. The claim bound to the new PV, then the reclaim policy restored, the journal removed.
    let (ns, claim, uid) = bound_claim_ref(&j.new).ok_or("the journal's new PV has no claimRef")?;
    let claims = Api::<PersistentVolumeClaim>::namespaced(client.clone(), &ns);
    let deadline = Instant::now() + STEP_WAIT;
    loop {
        let c = call(format!("get claim {ns}/{claim}"), claims.get_opt(&claim))
            .await
            .map_err(e)?;
        let bound = c.as_ref().is_some_and(|c| {
            c.metadata.uid.as_deref() == Some(uid.as_str())
                && c.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound")
                && c.spec.as_ref().and_then(|s| s.volume_name.as_deref()) == Some(name)
        });
        if bound {
            break;
        }
        if c.is_none() {
            return Err(format!(
                "claim {ns}/{claim} is gone; PV {name} kept with reclaim policy Retain"
            ));
        }
        if Instant::now() > deadline {
            return Err(format!(
                "claim {ns}/{claim} was not bound to the new PV within {} s; run migrate again",
                STEP_WAIT.as_secs()
            ));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let reclaim = j
        .old
        .spec
        .as_ref()
        .and_then(|s| s.persistent_volume_reclaim_policy.clone())
        .unwrap_or_else(|| "Retain".into());
    let p = serde_json::json!({"spec": {"persistentVolumeReclaimPolicy": reclaim}});
    call(
        format!("restore PV {name}'s reclaim policy"),
        pvs.patch(name, &PatchParams::default(), &Patch::Merge(&p)),
    )
    .await
    .map_err(e)?;
    checkpoint("migrate-after-reclaim");
    journals.remove(name)
}

/// The namespace, name and uid of a PV's `claimRef`.
fn bound_claim_ref(pv: &PersistentVolume) -> Option<(String, String, String)> {
    let r = pv.spec.as_ref()?.claim_ref.as_ref()?;
    Some((r.namespace.clone()?, r.name.clone()?, r.uid.clone()?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{PersistentVolumeSpec, PersistentVolumeStatus};
    use std::collections::BTreeMap;

    fn flex_pv(driver: &str, options: &[(&str, &str)]) -> PersistentVolume {
        PersistentVolume {
            metadata: ObjectMeta {
                name: Some("pvc-1".into()),
                uid: Some("old-uid".into()),
                resource_version: Some("42".into()),
                labels: Some(BTreeMap::from([("flexvol/kind".into(), "lvm".into())])),
                annotations: Some(BTreeMap::from([(
                    "pv.kubernetes.io/provisioned-by".into(),
                    "flexvol/lvm".into(),
                )])),
                finalizers: Some(vec!["kubernetes.io/pv-protection".into(), FINALIZER.into()]),
                ..Default::default()
            },
            spec: Some(PersistentVolumeSpec {
                access_modes: Some(vec!["ReadWriteOnce".into()]),
                claim_ref: Some(ObjectReference {
                    namespace: Some("team-a".into()),
                    name: Some("data".into()),
                    uid: Some("claim-uid".into()),
                    resource_version: Some("7".into()),
                    ..Default::default()
                }),
                flex_volume: Some(FlexPersistentVolumeSource {
                    driver: driver.into(),
                    fs_type: Some("ext4".into()),
                    options: Some(
                        options
                            .iter()
                            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                            .collect(),
                    ),
                    ..Default::default()
                }),
                persistent_volume_reclaim_policy: Some("Delete".into()),
                storage_class_name: Some("fast".into()),
                ..Default::default()
            }),
            status: Some(PersistentVolumeStatus {
                phase: Some("Bound".into()),
                ..Default::default()
            }),
        }
    }

    fn to_csi() -> To {
        To::Csi("csi.flexvol.io".into())
    }

    #[test]
    fn a_bound_flexvolume_pv_becomes_the_same_csi_pv_and_back() {
        let pv = flex_pv(
            "flexvol/lvm",
            &[
                ("volumegroup", "vg0"),
                ("volumeID", "pvc-1"),
                ("capabilityToken", "v2.team-a.x"),
            ],
        );
        let csi = plan(&pv, &to_csi(), "flexvol", &[], &[]).unwrap();
        let spec = csi.spec.as_ref().unwrap();
        assert!(spec.flex_volume.is_none());
        let c = spec.csi.as_ref().unwrap();
        assert_eq!(
            (
                c.driver.as_str(),
                c.volume_handle.as_str(),
                c.fs_type.as_deref()
            ),
            ("lvm.csi.flexvol.io", "vg0/pvc-1", Some("ext4"))
        );
        assert_eq!(
            c.volume_attributes.as_ref(),
            pv.spec
                .as_ref()
                .unwrap()
                .flex_volume
                .as_ref()
                .unwrap()
                .options
                .as_ref()
        );
        // Retain while it moves; the claim by namespace, name and uid, no resourceVersion.
        assert_eq!(
            spec.persistent_volume_reclaim_policy.as_deref(),
            Some("Retain")
        );
        let r = spec.claim_ref.as_ref().unwrap();
        assert_eq!(
            (
                r.namespace.as_deref(),
                r.name.as_deref(),
                r.uid.as_deref(),
                r.resource_version.as_deref()
            ),
            (Some("team-a"), Some("data"), Some("claim-uid"), None)
        );
        assert_eq!(csi.metadata.name.as_deref(), Some("pvc-1"));
        assert_eq!(csi.metadata.uid, None);
        assert_eq!(csi.metadata.finalizers, Some(vec![FINALIZER.to_owned()]));
        assert_eq!(csi.metadata.labels, pv.metadata.labels);
        assert_eq!(
            csi.metadata
                .annotations
                .as_ref()
                .unwrap()
                .get(ANN_MIGRATED_FROM)
                .map(String::as_str),
            Some("flexvol/lvm")
        );
        // Back: the flexVolume source as it was, the annotation gone.
        let mut bound = csi.clone();
        bound.status = pv.status.clone();
        let flex = plan(&bound, &To::FlexVolume, "flexvol", &[], &[]).unwrap();
        assert_eq!(
            flex.spec.as_ref().unwrap().flex_volume,
            pv.spec.as_ref().unwrap().flex_volume
        );
        assert_eq!(flex.metadata.annotations, pv.metadata.annotations);
        // Done already, either way.
        assert_eq!(
            plan(&bound, &to_csi(), "flexvol", &[], &[]),
            Err(Refusal::Done("CSI"))
        );
        assert_eq!(
            plan(&pv, &To::FlexVolume, "flexvol", &[], &[]),
            Err(Refusal::Done("flexVolume"))
        );
    }

    #[test]
    fn only_bound_unused_pvs_of_flexvols_drivers_without_mount_flags_move() {
        let ok = flex_pv("flexvol/hostpath", &[("path", "/srv/x")]);
        let hp = plan(&ok, &To::Csi("csi.flexvol.io".into()), "flexvol", &[], &[]).unwrap();
        assert_eq!(hp.spec.unwrap().csi.unwrap().volume_handle, "pvc-1");
        let refused = |pv: &PersistentVolume, users: &[String], want: &str| {
            let e = plan(pv, &to_csi(), "flexvol", users, &[]).unwrap_err();
            assert!(e.to_string().contains(want), "{e}");
        };
        refused(
            &flex_pv("other/hostpath", &[]),
            &[],
            "is not one of flexvol/hostpath",
        );
        refused(&flex_pv("flexvol/ceph", &[]), &[], "is not one of");
        refused(
            &flex_pv("flexvol/lvm", &[("volumegroup", "vg0")]),
            &[],
            "<vg>/<lv>",
        );
        let mut p = ok.clone();
        p.spec.as_mut().unwrap().mount_options = Some(vec!["noatime".into()]);
        refused(&p, &[], "mountOptions");
        let mut p = ok.clone();
        p.status.as_mut().unwrap().phase = Some("Released".into());
        refused(&p, &[], "not bound");
        let mut p = ok.clone();
        p.spec
            .as_mut()
            .unwrap()
            .flex_volume
            .as_mut()
            .unwrap()
            .secret_ref = Some(Default::default());
        refused(&p, &[], "secretRef");
        refused(
            &ok,
            &["web-0".into(), "web-1".into()],
            "used by pod(s) web-0, web-1",
        );
        // A CSI PV migrate did not make is not rolled back.
        let mut p = plan(&ok, &to_csi(), "flexvol", &[], &[]).unwrap();
        p.status = ok.status.clone();
        p.metadata
            .annotations
            .as_mut()
            .unwrap()
            .remove(ANN_MIGRATED_FROM);
        let e = plan(&p, &To::FlexVolume, "flexvol", &[], &[]).unwrap_err();
        assert!(e.to_string().contains("did not make it"), "{e}");
    }

    /// An LV whose pod is gone is still mounted by kubelet, or attached, for a while: a node that
    /// lists it (by the name kubelet and the attach-detach controller give it) refuses the move.
    #[test]
    fn a_volume_a_node_still_lists_is_not_moved() {
        let node = |name: &str, in_use: &[&str], attached: &[&str]| -> Node {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": name},
                "status": {
                    "volumesInUse": in_use,
                    "volumesAttached": attached.iter().map(|a| serde_json::json!({"name": a, "devicePath": ""})).collect::<Vec<_>>(),
                }
            }))
            .unwrap()
        };
        let pv = flex_pv(
            "flexvol/lvm",
            &[("volumegroup", "vg0"), ("volumeID", "pvc-1")],
        );
        let nodes = [
            node("a", &["flexvol/lvm/pvc-1"], &[]),
            node("b", &[], &["flexvol/lvm/pvc-1"]),
            node(
                "c",
                &[
                    "flexvol/lvm/pvc-10",
                    "kubernetes.io/csi/x^pvc-1",
                    "flexvolume-flexvol/lvm/pvc-1",
                ],
                &[],
            ),
            node("d", &[], &[]),
        ];
        let h = holders(&nodes, &pv);
        assert_eq!(h, ["a", "b"]);
        let e = plan(&pv, &to_csi(), "flexvol", &[], &h).unwrap_err();
        assert!(matches!(e, Refusal::OnNode { .. }), "{e}");
        assert!(e.to_string().contains("node(s) a, b"), "{e}");
        // The CSI PV it became, by its driver and handle (a rollback waits the same way).
        let mut csi = plan(&pv, &to_csi(), "flexvol", &[], &[]).unwrap();
        csi.status = pv.status.clone();
        let c = csi.spec.as_ref().unwrap().csi.clone().unwrap();
        let n = node(
            "e",
            &[&format!(
                "kubernetes.io/csi/{}^{}",
                c.driver, c.volume_handle
            )],
            &[],
        );
        assert_eq!(holders(&[n], &csi), ["e"]);
        assert!(holders(&nodes[2..], &csi).is_empty());
    }

    #[test]
    fn a_pod_uses_a_claim_until_it_has_finished() {
        let pod = |name: &str, claim: &str, phase: &str| -> Pod {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": name},
                "spec": {"containers": [], "volumes": [{"name": "d", "persistentVolumeClaim": {"claimName": claim}}]},
                "status": {"phase": phase}
            }))
            .unwrap()
        };
        let pods = [
            pod("a", "data", "Running"),
            pod("b", "data", "Pending"),
            pod("c", "data", "Succeeded"),
            pod("d", "data", "Failed"),
            pod("e", "other", "Running"),
        ];
        assert_eq!(users(&pods, "data"), ["a", "b"]);
    }

    #[test]
    fn what_is_said_names_drivers_and_handles_never_option_values() {
        let pv = flex_pv(
            "flexvol/hostpath",
            &[
                ("path", "/srv/secret-place"),
                ("capabilityToken", "v2.team-a.deadbeef"),
            ],
        );
        let new = plan(&pv, &To::Csi("csi.flexvol.io".into()), "flexvol", &[], &[]).unwrap();
        let said = describe(&pv, &new);
        assert_eq!(
            said,
            "from flexVolume flexvol/hostpath to CSI hostpath.csi.flexvol.io (handle pvc-1) of claim team-a/data"
        );
        assert!(!said.contains("secret-place") && !said.contains("deadbeef"));
    }

    #[test]
    fn the_journal_is_root_only_and_refuses_a_directory_others_can_use() {
        use std::os::unix::fs::PermissionsExt;
        let d = tempfile::tempdir().unwrap();
        let j = Journals(d.path().join("migrate"));
        let pv = flex_pv("flexvol/hostpath", &[("path", "/srv/x")]);
        let new = plan(&pv, &To::Csi("csi.flexvol.io".into()), "flexvol", &[], &[]).unwrap();
        let journal = Journal { old: pv, new };
        j.save("pvc-1", &journal).unwrap();
        let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&d.path().join("migrate")), 0o700);
        assert_eq!(mode(&j.path("pvc-1")), 0o600);
        let back = j.load("pvc-1").unwrap().unwrap();
        assert_eq!(back.old.metadata.uid.as_deref(), Some("old-uid"));
        // A directory others can write: refused, nothing written.
        std::fs::set_permissions(
            d.path().join("migrate"),
            std::fs::Permissions::from_mode(0o777),
        )
        .unwrap();
        let e = j.save("pvc-2", &journal).unwrap_err();
        assert!(e.contains("0700"), "{e}");
        assert!(!j.path("pvc-2").exists());
        j.remove("pvc-1").unwrap();
        j.remove("pvc-1").unwrap();
        assert!(j.load("pvc-1").unwrap().is_none());
    }

    #[test]
    fn pv_names_are_checked_before_they_name_a_journal_file() {
        for ok in ["pvc-0a1b", "pv.x-1"] {
            assert!(check_pv_name(ok).is_ok());
        }
        for bad in ["", "../etc", "a/b", ".hidden", "Upper"] {
            assert!(check_pv_name(bad).is_err(), "{bad}");
        }
    }
}
