//! The per-node capacity ConfigMaps of the scheduler extender (docs/scheduler-extender.md):
//! `flexvol controller --capacity-objects` creates one, empty, for each Node in
//! [`crate::vocab::capacity::NAMESPACE`], and deletes those whose Node is gone, so that a
//! node's token needs only `get`/`update` there (it can falsify records, not add or remove
//! objects).
//!
//! Contract: the decision ([`plan`]) is made only from two complete lists (every Node; every
//! ConfigMap of the namespace carrying [`LABEL`]); a ConfigMap without the label is never touched;
//! a delete carries the object's uid as a precondition, so a node that came back and got a new
//! object meanwhile keeps it. Every call has [`crate::k8s::call::DEADLINE`].
//!
//! Status: the decision is unit-tested; [`sync`] runs in tests/cluster/provisioner-e2e.d/extender.sh
//! under drivers/deploy-overlays/node-loss/controller.yaml's Role (which sets the flag).

use crate::k8s::call::call;
use crate::k8s::error::ApiError;
use crate::vocab::capacity::NAMESPACE;
use k8s_openapi::api::core::v1::{ConfigMap, Node};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Api;
use kube::api::{DeleteParams, ListParams, PostParams, Preconditions};
use std::collections::{BTreeMap, BTreeSet};

/// The label the controller puts on the objects it makes (and the only ones it deletes); the node
/// writes it back with every update.
use crate::vocab::capacity::{LABEL, LABEL_VALUE};

/// What a pass does.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Plan {
    /// Nodes that get an (empty) object.
    pub(crate) create: Vec<String>,
    /// Objects (name, uid) whose Node is gone.
    pub(crate) delete: Vec<(String, String)>,
}

/// From every Node's name and every labelled object (name → uid): what to create and delete.
pub(crate) fn plan(nodes: &BTreeSet<String>, objects: &BTreeMap<String, String>) -> Plan {
    Plan {
        create: nodes
            .iter()
            .filter(|n| !objects.contains_key(*n))
            .cloned()
            .collect(),
        delete: objects
            .iter()
            .filter(|(n, _)| !nodes.contains(*n))
            .map(|(n, u)| (n.clone(), u.clone()))
            .collect(),
    }
}

/// Why a pass of the capacity loop failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SyncError {
    /// A list failed: nothing was decided.
    #[error("{0}")]
    List(#[from] ApiError),
    /// Some of the plan's creates or deletes failed (the others were done).
    #[error("{}", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
    Act(Vec<ApiError>),
}

/// One pass: list, decide, act. Returns what was done, or why the pass failed.
pub(crate) async fn sync(client: &kube::Client) -> Result<Plan, SyncError> {
    let nodes_api = Api::<Node>::all(client.clone());
    let nodes: BTreeSet<String> = call("list Nodes", nodes_api.list(&ListParams::default()))
        .await?
        .items
        .into_iter()
        .filter_map(|n| n.metadata.name)
        .collect();
    let api = Api::<ConfigMap>::namespaced(client.clone(), NAMESPACE);
    let lp = ListParams::default().labels(&format!("{LABEL}={LABEL_VALUE}"));
    let objects: BTreeMap<String, String> =
        call(format!("list ConfigMaps in {NAMESPACE}"), api.list(&lp))
            .await?
            .items
            .into_iter()
            .filter_map(|c| Some((c.metadata.name?, c.metadata.uid?)))
            .collect();
    let p = plan(&nodes, &objects);
    let mut errors = Vec::new();
    for n in &p.create {
        let cm = ConfigMap {
            metadata: ObjectMeta {
                name: Some(n.clone()),
                namespace: Some(NAMESPACE.to_owned()),
                labels: Some(BTreeMap::from([(LABEL.to_owned(), LABEL_VALUE.to_owned())])),
                ..Default::default()
            },
            ..Default::default()
        };
        if let Err(e) = call(
            format!("create ConfigMap {NAMESPACE}/{n}"),
            api.create(&PostParams::default(), &cm),
        )
        .await
        {
            errors.push(e);
        }
    }
    for (n, uid) in &p.delete {
        let dp = DeleteParams {
            preconditions: Some(Preconditions {
                uid: Some(uid.clone()),
                resource_version: None,
            }),
            ..Default::default()
        };
        if let Err(e) = call(
            format!("delete ConfigMap {NAMESPACE}/{n}"),
            api.delete(n, &dp),
        )
        .await
        {
            errors.push(e);
        }
    }
    if errors.is_empty() {
        Ok(p)
    } else {
        Err(SyncError::Act(errors))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A pass whose creates or deletes failed says each failure, in order.
    #[test]
    fn failed_acts_are_each_said() {
        use crate::k8s::error::ApiErrorKind;
        let e = SyncError::Act(vec![
            ApiError::new("create ConfigMap a", ApiErrorKind::Other, "denied"),
            ApiError::new("delete ConfigMap b", ApiErrorKind::Timeout, "slow"),
        ]);
        assert_eq!(
            e.to_string(),
            "create ConfigMap a: denied; delete ConfigMap b: slow"
        );
    }

    /// Each node gets one object; objects of nodes that are gone go, by uid; nothing else moves.
    #[test]
    fn one_object_per_node() {
        let nodes: BTreeSet<String> = ["a", "b", "c"].map(String::from).into();
        let objects: BTreeMap<String, String> = [("b", "u-b"), ("gone", "u-g")]
            .map(|(n, u)| (n.to_owned(), u.to_owned()))
            .into();
        let p = plan(&nodes, &objects);
        assert_eq!(p.create, ["a", "c"]);
        assert_eq!(p.delete, [("gone".to_owned(), "u-g".to_owned())]);
        // Steady state: nothing to do.
        let all: BTreeMap<String, String> = nodes.iter().map(|n| (n.clone(), "u".into())).collect();
        assert_eq!(plan(&nodes, &all), Plan::default());
        // No nodes listed (an empty cluster): every labelled object goes; the caller never
        // calls this with a partial list.
        assert_eq!(plan(&BTreeSet::new(), &objects).delete.len(), 2);
    }
}
