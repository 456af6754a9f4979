//! From a pod to what its claims need ([`needs_of_pod`]) and from every claim to what is already
//! headed to each node ([`reserved`]): pure functions over the extender's caches of claims and
//! StorageClasses.
//!
//! A claim counts only when flexvol will make its volume on the node the scheduler picks: it
//! still waits for a volume (unbound, not being deleted: [`awaits_volume`]), its class exists, is
//! `<vendor>/hostpath` or `<vendor>/lvm` (NFS is not node-local) with `volumeBindingMode:
//! WaitForFirstConsumer`, and the provisioner's own decision ([`plan_claim`], the class's
//! parameters checked by the kind's `check_params`) accepts it: a claim the provisioner refuses
//! for good (Block, ReadWriteMany, a selector, a bad dataSource or request, a bad class) is never
//! counted, whatever its `selected-node` says. A clone counts once its source claim exists in its
//! namespace and is Bound ([`source_claim_ready`], what the provisioner checks first).
//! Everything else is skipped with a note (for the log): a bound claim's node is fixed by its
//! PV's node affinity, which kube-scheduler's own VolumeBinding filter enforces; a claim or class
//! that does not exist (yet) makes VolumeBinding fail the pod anyway. Skipping is the
//! `ignorable` direction: it can only let a node through, never filter one out.
//!
//! Claims headed to a node ([`reserved`]) are capped per namespace and node
//! ([`Caches::max_per_namespace`], `--max-reserved-claims-per-namespace`): a namespace's claims
//! beyond the cap, the newest first, are not counted ([`Reserved::uncounted`]), so one
//! namespace's hand-written `selected-node` annotations cannot fill a node for every other one.

use super::decide::{Need, Target};
use super::wire::Pod;
use crate::provision::storage::{awaits_volume, plan_claim, source_claim_ready};
use crate::provision::storage::{hostpath, lvm};
use crate::vocab::ANN_SELECTED_NODE;
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use k8s_openapi::api::storage::v1::StorageClass;
use std::collections::{BTreeMap, BTreeSet};

/// The default of `--max-reserved-claims-per-namespace`.
pub(crate) const DEFAULT_MAX_RESERVED_PER_NAMESPACE: usize = 16;

/// The extender's view of the cluster: claims by `namespace/name`, classes by name.
pub(crate) struct Caches<'a> {
    /// Claims, keyed `namespace/name`.
    pub(crate) claims: &'a BTreeMap<String, PersistentVolumeClaim>,
    /// StorageClasses, keyed by name.
    pub(crate) classes: &'a BTreeMap<String, StorageClass>,
    /// Vendor part of the provisioner names (`flexvol`).
    pub(crate) vendor: &'a str,
    /// At most this many claims of one namespace count as headed to one node.
    pub(crate) max_per_namespace: usize,
}

/// Why a claim does not count on the node picked for it (a note for people, in the extender's
/// log): the kind says which part of [`need_of`]'s check it failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum NotCounted {
    /// The claim waits for no volume (no spec, bound, being deleted, not Pending).
    #[error("{0}")]
    NotPending(String),
    /// Its StorageClass is missing or is not a node-local flexvol class that waits for the first
    /// consumer.
    #[error("{0}")]
    Class(String),
    /// The provisioner would refuse it for good.
    #[error("{0}")]
    Never(String),
    /// The provisioner would not make it now (its data source is not ready).
    #[error("{0}")]
    NotNow(String),
}

/// What `claim` needs if flexvol will make it on the node picked for it, else why not.
pub(crate) fn need_of(
    c: &Caches<'_>,
    key: &str,
    claim: &PersistentVolumeClaim,
) -> Result<Need, NotCounted> {
    let spec = claim
        .spec
        .as_ref()
        .ok_or_else(|| NotCounted::NotPending(format!("claim {key} has no spec")))?;
    if spec.volume_name.as_deref().is_some_and(|v| !v.is_empty()) {
        return Err(NotCounted::NotPending(format!("claim {key} is bound")));
    }
    if !awaits_volume(claim) {
        return Err(NotCounted::NotPending(format!(
            "claim {key} is being deleted or no longer Pending"
        )));
    }
    let class_name = spec
        .storage_class_name
        .as_deref()
        .filter(|s| !s.is_empty())
        .ok_or_else(|| NotCounted::Class(format!("claim {key} has no StorageClass")))?;
    let class = c.classes.get(class_name).ok_or_else(|| {
        NotCounted::Class(format!("claim {key}: StorageClass {class_name} not found"))
    })?;
    let params = class.parameters.clone().unwrap_or_default();
    let (kind, class_check, target) = match class
        .provisioner
        .strip_prefix(c.vendor)
        .and_then(|s| s.strip_prefix('/'))
    {
        Some("hostpath") => (
            &hostpath::KIND,
            hostpath::check_params(&params),
            Target::HostPath,
        ),
        Some("lvm") => {
            let vg = params
                .get("volumegroup")
                .filter(|v| !v.is_empty())
                .cloned()
                .ok_or_else(|| {
                    NotCounted::Class(format!(
                        "claim {key}: StorageClass {class_name} has no volumegroup"
                    ))
                })?;
            let target = Target::Lvm {
                vg,
                thin_pool: params.get("thinpool").filter(|v| !v.is_empty()).cloned(),
            };
            (&lvm::KIND, lvm::check_params(&params), target)
        }
        _ => {
            return Err(NotCounted::Class(format!(
                "claim {key}: StorageClass {class_name} is not a node-local flexvol class"
            )));
        }
    };
    if class.volume_binding_mode.as_deref() != Some("WaitForFirstConsumer") {
        return Err(NotCounted::Class(format!(
            "claim {key}: StorageClass {class_name} does not wait for the first consumer"
        )));
    }
    let plan = plan_claim(kind, class_name, class_check, claim).map_err(|n| {
        NotCounted::Never(format!(
            "claim {key} is never provisioned ({:?}): {}",
            n.why, n.message
        ))
    })?;
    if let Some(src) = &plan.source {
        let ns = claim.metadata.namespace.as_deref().unwrap_or("");
        source_claim_ready(ns, src, c.claims.get(&format!("{ns}/{src}"))).map_err(|r| {
            NotCounted::NotNow(format!(
                "claim {key} is not provisioned now: {}",
                r.message()
            ))
        })?;
    }
    Ok(Need {
        claim: key.to_owned(),
        class: class_name.to_owned(),
        target,
        bytes: plan.size_bytes,
    })
}

/// The pod's claims (each once) that flexvol will make on the picked node, and notes on the ones
/// skipped.
pub(crate) fn needs_of_pod(c: &Caches<'_>, pod: &Pod) -> (Vec<Need>, Vec<String>) {
    let (mut needs, mut notes) = (Vec::new(), Vec::new());
    let mut seen = BTreeSet::new();
    for v in &pod.spec.volumes {
        let Some(src) = &v.claim else { continue };
        let key = format!("{}/{}", pod.metadata.namespace, src.claim_name);
        if !seen.insert(key.clone()) {
            continue;
        }
        let Some(claim) = c.claims.get(&key) else {
            notes.push(format!("claim {key} not found"));
            continue;
        };
        match need_of(c, &key, claim) {
            Ok(n) => needs.push(n),
            Err(why) => notes.push(why.to_string()),
        }
    }
    (needs, notes)
}

/// The claims headed to each node, as [`reserved`] counts them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Reserved {
    /// Per node, the claims counted there.
    pub(crate) by_node: BTreeMap<String, Vec<Need>>,
    /// Per (namespace, node) over the cap, how many of its claims were not counted.
    pub(crate) uncounted: BTreeMap<(String, String), usize>,
}

/// Per node, the claims already headed there: claims flexvol will make ([`need_of`]) whose
/// `volume.kubernetes.io/selected-node` names it, except those in `exclude` (the pod's own);
/// at most [`Caches::max_per_namespace`] of one namespace per node, the oldest first
/// (`creationTimestamp`, which the API server sets, then name).
pub(crate) fn reserved(c: &Caches<'_>, exclude: &[Need]) -> Reserved {
    type Entry<'b> = (
        Option<&'b k8s_openapi::apimachinery::pkg::apis::meta::v1::Time>,
        Need,
    );
    let mut per: BTreeMap<(String, String), Vec<Entry<'_>>> = BTreeMap::new();
    for (key, claim) in c.claims {
        if exclude.iter().any(|n| &n.claim == key) {
            continue;
        }
        let Some(node) = claim
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(ANN_SELECTED_NODE))
        else {
            continue;
        };
        if let Ok(n) = need_of(c, key, claim) {
            let ns = key.split_once('/').map_or("", |(ns, _)| ns).to_owned();
            per.entry((ns, node.clone()))
                .or_default()
                .push((claim.metadata.creation_timestamp.as_ref(), n));
        }
    }
    let mut out = Reserved::default();
    for ((ns, node), mut claims) in per {
        claims.sort_by(|a, b| a.0.cmp(&b.0).then_with(|| a.1.claim.cmp(&b.1.claim)));
        if claims.len() > c.max_per_namespace {
            out.uncounted
                .insert((ns, node.clone()), claims.len() - c.max_per_namespace);
        }
        out.by_node
            .entry(node)
            .or_default()
            .extend(claims.into_iter().take(c.max_per_namespace).map(|(_, n)| n));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::extender::wire::ExtenderArgs;

    fn class(name: &str, provisioner: &str, wait: bool, params: &[(&str, &str)]) -> StorageClass {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name},
            "provisioner": provisioner,
            "volumeBindingMode": if wait { "WaitForFirstConsumer" } else { "Immediate" },
            "parameters": params.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect::<BTreeMap<_, _>>(),
        }))
        .unwrap()
    }

    fn claim(
        name: &str,
        class: &str,
        size: &str,
        bound: bool,
        node: Option<&str>,
    ) -> PersistentVolumeClaim {
        let mut anns = serde_json::Map::new();
        if let Some(n) = node {
            anns.insert(ANN_SELECTED_NODE.into(), n.into());
        }
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": "ns", "annotations": anns},
            "spec": {
                "storageClassName": class,
                "volumeName": if bound { "pv-1" } else { "" },
                "accessModes": ["ReadWriteOnce"],
                "resources": {"requests": {"storage": size}},
            }
        }))
        .unwrap()
    }

    fn world() -> (
        BTreeMap<String, PersistentVolumeClaim>,
        BTreeMap<String, StorageClass>,
    ) {
        let classes = [
            class("local", "flexvol/hostpath", true, &[]),
            class(
                "thin",
                "flexvol/lvm",
                true,
                &[("volumegroup", "vg0"), ("thinpool", "tp")],
            ),
            class("nfs", "flexvol/nfs", false, &[("server", "10.0.0.5")]),
            class("eager", "flexvol/hostpath", false, &[]),
            class("other", "example.com/disk", true, &[]),
            class("novg", "flexvol/lvm", true, &[]),
        ]
        .into_iter()
        .map(|c| (c.metadata.name.clone().unwrap(), c))
        .collect();
        let claims = [
            claim("a", "local", "1Gi", false, None),
            claim("b", "thin", "512Mi", false, None),
            claim("shared", "nfs", "1Gi", false, None),
            claim("done", "local", "1Gi", true, None),
            claim("eager", "eager", "1Gi", false, None),
            claim("foreign", "other", "1Gi", false, None),
            claim("novg", "novg", "1Gi", false, None),
            claim("junk", "local", "lots", false, None),
            claim("ghostclass", "missing", "1Gi", false, None),
            claim("going", "local", "2Gi", false, Some("n1")),
            claim("landed", "local", "2Gi", true, Some("n1")),
        ]
        .into_iter()
        .map(|c| (format!("ns/{}", c.metadata.name.clone().unwrap()), c))
        .collect();
        (claims, classes)
    }

    fn pod(claims: &[&str]) -> Pod {
        let vols: Vec<_> = claims
            .iter()
            .map(|c| serde_json::json!({"name": c, "persistentVolumeClaim": {"claimName": c}}))
            .collect();
        let args: ExtenderArgs = serde_json::from_value(serde_json::json!({
            "Pod": {"metadata": {"name": "p", "namespace": "ns"},
                    "spec": {"volumes": vols}}
        }))
        .unwrap();
        args.pod.unwrap()
    }

    /// Only unbound claims of node-local flexvol classes that wait for the first consumer count,
    /// each once; everything else is skipped with a note saying why.
    #[test]
    fn only_unbound_node_local_flexvol_claims_count() {
        let (claims, classes) = world();
        let c = Caches {
            claims: &claims,
            classes: &classes,
            vendor: "flexvol",
            max_per_namespace: 16,
        };
        let p = pod(&[
            "a",
            "b",
            "a",
            "shared",
            "done",
            "eager",
            "foreign",
            "novg",
            "junk",
            "ghostclass",
            "nope",
        ]);
        let (needs, notes) = needs_of_pod(&c, &p);
        assert_eq!(
            needs,
            [
                Need {
                    claim: "ns/a".into(),
                    class: "local".into(),
                    target: Target::HostPath,
                    bytes: 1 << 30
                },
                Need {
                    claim: "ns/b".into(),
                    class: "thin".into(),
                    target: Target::Lvm {
                        vg: "vg0".into(),
                        thin_pool: Some("tp".into())
                    },
                    bytes: 512 << 20
                },
            ]
        );
        let notes = notes.join("\n");
        for want in [
            "ns/shared: StorageClass nfs is not a node-local",
            "claim ns/done is bound",
            "ns/eager: StorageClass eager does not wait",
            "ns/foreign: StorageClass other is not a node-local",
            "ns/novg: StorageClass novg has no volumegroup",
            "ns/junk is never provisioned (Size): the claim's storage request \"lots\"",
            "StorageClass missing not found",
            "claim ns/nope not found",
        ] {
            assert!(notes.contains(want), "{want:?} not in\n{notes}");
        }
        // Another vendor's classes are not ours.
        let c = Caches {
            claims: &claims,
            classes: &classes,
            vendor: "acme",
            max_per_namespace: 16,
        };
        assert!(needs_of_pod(&c, &p).0.is_empty());
        let c = Caches {
            claims: &claims,
            classes: &classes,
            vendor: "flex",
            max_per_namespace: 16,
        };
        assert!(
            needs_of_pod(&c, &p).0.is_empty(),
            "a vendor prefix is not a match"
        );
    }

    /// Claims headed to a node are held there; bound ones (their volume exists and the node
    /// publishes it) and the pod's own are not.
    #[test]
    fn claims_headed_to_a_node_are_reserved() {
        let (claims, classes) = world();
        let c = Caches {
            claims: &claims,
            classes: &classes,
            vendor: "flexvol",
            max_per_namespace: 16,
        };
        let r = reserved(&c, &[]).by_node;
        assert_eq!(r.len(), 1);
        assert_eq!(
            r["n1"].iter().map(|n| n.claim.as_str()).collect::<Vec<_>>(),
            ["ns/going"]
        );
        let (own, _) = needs_of_pod(&c, &pod(&["going"]));
        assert!(reserved(&c, &own).by_node.is_empty());
    }

    /// A claim `name` of namespace `ns` and class `local`, headed to `n1` by a hand-written
    /// `selected-node`, asking 1 TiB, changed by `edit` (its JSON).
    fn headed(
        ns: &str,
        name: &str,
        edit: impl FnOnce(&mut serde_json::Value),
    ) -> PersistentVolumeClaim {
        let mut v = serde_json::json!({
            "metadata": {"name": name, "namespace": ns,
                         "annotations": {ANN_SELECTED_NODE: "n1"}},
            "spec": {
                "storageClassName": "local",
                "accessModes": ["ReadWriteOnce"],
                "resources": {"requests": {"storage": "1Ti"}},
            },
            "status": {"phase": "Pending"}
        });
        edit(&mut v);
        serde_json::from_value(v).unwrap()
    }

    /// Issue #32, 5: a claim the provisioner refuses for good holds no node, whatever its
    /// `selected-node` says: each refusal kind of `plan_claim`, a class whose parameters the
    /// kind refuses, a claim being deleted, a clone whose source does not exist or is not Bound.
    /// The same claim without the fault (and a clone of a Bound source) is counted.
    #[test]
    fn claims_the_provisioner_refuses_are_never_counted() {
        let (_, mut classes) = world();
        classes.insert(
            "typo".into(),
            class("typo", "flexvol/hostpath", true, &[("pathpattern", "x")]),
        );
        classes.insert(
            "thinbad".into(),
            class(
                "thinbad",
                "flexvol/lvm",
                true,
                &[("volumegroup", "vg0"), ("bogus", "1")],
            ),
        );
        let pvc = |name: &str| serde_json::json!({"kind": "PersistentVolumeClaim", "name": name});
        type Edit = Box<dyn FnOnce(&mut serde_json::Value)>;
        let refused: Vec<(&str, Edit)> = vec![
            (
                "rwx",
                Box::new(|v| v["spec"]["accessModes"] = serde_json::json!(["ReadWriteMany"])),
            ),
            (
                "nomodes",
                Box::new(|v| v["spec"]["accessModes"] = serde_json::json!([])),
            ),
            (
                "block",
                Box::new(|v| v["spec"]["volumeMode"] = "Block".into()),
            ),
            (
                "selector",
                Box::new(|v| {
                    v["spec"]["selector"] = serde_json::json!({"matchLabels": {"a": "b"}})
                }),
            ),
            (
                "nosize",
                Box::new(|v| v["spec"]["resources"] = serde_json::json!({})),
            ),
            (
                "snapshot",
                Box::new(|v| {
                    v["spec"]["dataSource"] = serde_json::json!(
                {"apiGroup": "snapshot.storage.k8s.io", "kind": "VolumeSnapshot", "name": "s"})
                }),
            ),
            (
                "otherns",
                Box::new(move |v| v["spec"]["dataSource"] = pvc("../x")),
            ),
            (
                "nosource",
                Box::new(move |v| v["spec"]["dataSource"] = pvc("ghost")),
            ),
            (
                "waiting",
                Box::new(move |v| v["spec"]["dataSource"] = pvc("unbound")),
            ),
            (
                "badclass",
                Box::new(|v| v["spec"]["storageClassName"] = "typo".into()),
            ),
            (
                "badlvm",
                Box::new(|v| v["spec"]["storageClassName"] = "thinbad".into()),
            ),
            (
                "deleting",
                Box::new(|v| {
                    v["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z".into();
                    v["metadata"]["finalizers"] = serde_json::json!(["example.com/hold"]);
                }),
            ),
            ("lost", Box::new(|v| v["status"]["phase"] = "Lost".into())),
        ];
        let mut claims = BTreeMap::new();
        let names: Vec<&str> = refused.iter().map(|(n, _)| *n).collect();
        for (name, edit) in refused {
            claims.insert(format!("evil/{name}"), headed("evil", name, edit));
        }
        // Sources: one Bound, one not.
        claims.insert(
            "evil/unbound".into(),
            claim("unbound", "local", "1Gi", false, None),
        );
        let mut src = claim("src", "local", "1Gi", true, None);
        src.metadata.namespace = Some("evil".into());
        src.status = Some(serde_json::from_value(serde_json::json!({"phase": "Bound"})).unwrap());
        claims.insert("evil/src".into(), src);
        let c = Caches {
            claims: &claims,
            classes: &classes,
            vendor: "flexvol",
            max_per_namespace: 16,
        };
        let r = reserved(&c, &[]);
        assert!(r.by_node.is_empty(), "{:?}", r.by_node);
        for name in &names {
            let key = format!("evil/{name}");
            let why = need_of(&c, &key, &claims[&key]).unwrap_err();
            assert!(why.to_string().contains(&key), "{why}");
        }
        // Without the fault they count: the refusal, not the annotation, is what is skipped.
        claims.insert("evil/fine".into(), headed("evil", "fine", |_| {}));
        claims.insert(
            "evil/copy".into(),
            headed("evil", "copy", move |v| {
                v["spec"]["dataSource"] = pvc("src")
            }),
        );
        let c = Caches {
            claims: &claims,
            classes: &classes,
            vendor: "flexvol",
            max_per_namespace: 16,
        };
        let r = reserved(&c, &[]);
        let counted: Vec<&str> = r.by_node["n1"].iter().map(|n| n.claim.as_str()).collect();
        assert_eq!(counted, ["evil/copy", "evil/fine"]);
        assert_eq!(r.by_node["n1"][0].bytes, 1 << 40);
    }

    /// Issue #32, 5: at most `max_per_namespace` claims of one namespace count on one node, the
    /// oldest first; the rest are reported, and other namespaces and nodes are not affected.
    #[test]
    fn a_namespace_over_its_cap_counts_only_its_oldest_claims() {
        let (_, classes) = world();
        let mut claims = BTreeMap::new();
        for (ns, name, node, created) in [
            ("greedy", "c", "n1", "2026-01-03T00:00:00Z"),
            ("greedy", "a", "n1", "2026-01-01T00:00:00Z"),
            ("greedy", "b", "n1", "2026-01-02T00:00:00Z"),
            ("greedy", "d", "n2", "2026-01-04T00:00:00Z"),
            ("other", "x", "n1", "2026-01-05T00:00:00Z"),
        ] {
            claims.insert(
                format!("{ns}/{name}"),
                headed(ns, name, |v| {
                    v["metadata"]["creationTimestamp"] = created.into();
                    v["metadata"]["annotations"][ANN_SELECTED_NODE] = node.into();
                }),
            );
        }
        let c = Caches {
            claims: &claims,
            classes: &classes,
            vendor: "flexvol",
            max_per_namespace: 2,
        };
        let r = reserved(&c, &[]);
        let on = |node: &str| -> Vec<&str> {
            r.by_node[node].iter().map(|n| n.claim.as_str()).collect()
        };
        assert_eq!(on("n1"), ["greedy/a", "greedy/b", "other/x"]);
        assert_eq!(on("n2"), ["greedy/d"]);
        assert_eq!(
            r.uncounted,
            BTreeMap::from([(("greedy".to_owned(), "n1".to_owned()), 1)])
        );
        let c = Caches {
            max_per_namespace: 16,
            ..c
        };
        assert!(reserved(&c, &[]).uncounted.is_empty());
    }
}
