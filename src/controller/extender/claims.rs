//! From a pod to what its claims need ([`needs_of_pod`]) and from every claim to what is already
//! headed to each node ([`reserved`]): pure functions over the extender's caches of claims and
//! StorageClasses.
//!
//! A claim counts only when flexvol will make its volume on the node the scheduler picks: it is
//! unbound (`spec.volumeName` empty), its class exists, is `<vendor>/hostpath` or `<vendor>/lvm`
//! (NFS is not node-local) with `volumeBindingMode: WaitForFirstConsumer`, and its request is a
//! size. Everything else is skipped with a note (for the log): a bound claim's node is fixed by
//! its PV's node affinity, which kube-scheduler's own VolumeBinding filter enforces; a claim or
//! class that does not exist (yet) makes VolumeBinding fail the pod anyway. Skipping is the
//! `ignorable` direction: it can only let a node through, never filter one out.

use super::decide::{Need, Target};
use super::wire::Pod;
use crate::protocol::quantity::parse_size;
use crate::provision::api::ANN_SELECTED_NODE;
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use k8s_openapi::api::storage::v1::StorageClass;
use std::collections::{BTreeMap, BTreeSet};

/// The extender's view of the cluster: claims by `namespace/name`, classes by name.
pub struct Caches<'a> {
    /// Claims, keyed `namespace/name`.
    pub claims: &'a BTreeMap<String, PersistentVolumeClaim>,
    /// StorageClasses, keyed by name.
    pub classes: &'a BTreeMap<String, StorageClass>,
    /// Vendor part of the provisioner names (`flexvol`).
    pub vendor: &'a str,
}

/// What `claim` needs if flexvol will make it on the node picked for it, else why not.
pub fn need_of(c: &Caches<'_>, key: &str, claim: &PersistentVolumeClaim) -> Result<Need, String> {
    let spec = claim
        .spec
        .as_ref()
        .ok_or_else(|| format!("claim {key} has no spec"))?;
    if spec.volume_name.as_deref().is_some_and(|v| !v.is_empty()) {
        return Err(format!("claim {key} is bound"));
    }
    let class_name = spec
        .storage_class_name
        .as_deref()
        .filter(|s| !s.is_empty())
        .ok_or_else(|| format!("claim {key} has no StorageClass"))?;
    let class = c
        .classes
        .get(class_name)
        .ok_or_else(|| format!("claim {key}: StorageClass {class_name} not found"))?;
    let target = match class
        .provisioner
        .strip_prefix(c.vendor)
        .and_then(|s| s.strip_prefix('/'))
    {
        Some("hostpath") => Target::HostPath,
        Some("lvm") => {
            let p = class.parameters.clone().unwrap_or_default();
            let vg = p
                .get("volumegroup")
                .filter(|v| !v.is_empty())
                .cloned()
                .ok_or_else(|| {
                    format!("claim {key}: StorageClass {class_name} has no volumegroup")
                })?;
            Target::Lvm {
                vg,
                thin_pool: p.get("thinpool").filter(|v| !v.is_empty()).cloned(),
            }
        }
        _ => {
            return Err(format!(
                "claim {key}: StorageClass {class_name} is not a node-local flexvol class"
            ));
        }
    };
    if class.volume_binding_mode.as_deref() != Some("WaitForFirstConsumer") {
        return Err(format!(
            "claim {key}: StorageClass {class_name} does not wait for the first consumer"
        ));
    }
    let q = spec
        .resources
        .as_ref()
        .and_then(|r| r.requests.as_ref())
        .and_then(|r| r.get("storage"))
        .ok_or_else(|| format!("claim {key} requests no storage"))?;
    let bytes = parse_size(&q.0).map_err(|e| format!("claim {key}: request {:?} {e}", q.0))?;
    Ok(Need {
        claim: key.to_owned(),
        class: class_name.to_owned(),
        target,
        bytes,
    })
}

/// The pod's claims (each once) that flexvol will make on the picked node, and notes on the ones
/// skipped.
pub fn needs_of_pod(c: &Caches<'_>, pod: &Pod) -> (Vec<Need>, Vec<String>) {
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
            Err(why) => notes.push(why),
        }
    }
    (needs, notes)
}

/// Per node, the claims already headed there: unbound flexvol claims whose
/// `volume.kubernetes.io/selected-node` names it, except those in `exclude` (the pod's own).
pub fn reserved(c: &Caches<'_>, exclude: &[Need]) -> BTreeMap<String, Vec<Need>> {
    let mut out: BTreeMap<String, Vec<Need>> = BTreeMap::new();
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
            out.entry(node.clone()).or_default().push(n);
        }
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
            "ns/junk: request \"lots\"",
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
        };
        assert!(needs_of_pod(&c, &p).0.is_empty());
        let c = Caches {
            claims: &claims,
            classes: &classes,
            vendor: "flex",
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
        };
        let r = reserved(&c, &[]);
        assert_eq!(r.len(), 1);
        assert_eq!(
            r["n1"].iter().map(|n| n.claim.as_str()).collect::<Vec<_>>(),
            ["ns/going"]
        );
        let (own, _) = needs_of_pod(&c, &pod(&["going"]));
        assert!(reserved(&c, &own).is_empty());
    }
}
