//! The scheduler extender's wire format: kube-scheduler 1.20's `k8s.io/kube-scheduler/extender/v1`
//! types as Go's `encoding/json` writes them. **Those types carry no JSON tags** (unlike the
//! older `pkg/scheduler/api/v1` copies many extenders still quote, with `json:"nodenames"`), so
//! the keys are the Go field names:
//!
//! ```go
//! type ExtenderArgs struct {
//!     Pod       *v1.Pod       // "Pod"       (the pod itself is a tagged v1.Pod: "metadata", "spec")
//!     Nodes     *v1.NodeList  // "Nodes"     nodeCacheCapable: false; else null
//!     NodeNames *[]string     // "NodeNames" nodeCacheCapable: true; else null
//! }
//! type ExtenderFilterResult struct {
//!     Nodes       *v1.NodeList   // "Nodes"
//!     NodeNames   *[]string      // "NodeNames"
//!     FailedNodes FailedNodesMap // "FailedNodes", map[string]string
//!     Error       string         // "Error"
//! }
//! type HostPriority struct { Host string; Score int64 } // "Host", "Score"
//! const MaxExtenderPriority int64 = 10
//! ```
//!
//! kube-scheduler sends exactly those keys (nil pointers as `null`), and reads our answers with
//! Go's decoder, which matches keys case-insensitively; we send the Go names. We also read the
//! lower-case names of the tagged copies (`pod`, `nodes`, `nodenames`), which costs nothing.
//! `FailedAndUnresolvableNodes` (newer upstream) is never sent.
//!
//! Only what the decision needs is modelled: the pod's namespace, name and the claims its volumes
//! name. The nodes of the non-cache-capable form are kept as raw JSON and the passing ones are
//! returned verbatim, because kube-scheduler uses the returned `Node` objects as they are; the
//! documented configuration is `nodeCacheCapable: true` (names only, a far smaller request).

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// `MaxExtenderPriority`: the highest score an extender may give (kube-scheduler multiplies it
/// by the extender's `weight` and by `MaxNodeScore / MaxExtenderPriority`).
pub(crate) const MAX_EXTENDER_PRIORITY: i64 = 10;

/// The request of both the filter and the prioritize verbs.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct ExtenderArgs {
    /// The pod being scheduled.
    #[serde(rename = "Pod", alias = "pod", default)]
    pub(crate) pod: Option<Pod>,
    /// The candidate nodes, whole (`nodeCacheCapable: false`).
    #[serde(
        rename = "Nodes",
        alias = "nodes",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub(crate) nodes: Option<NodeList>,
    /// The candidate nodes' names (`nodeCacheCapable: true`).
    #[serde(
        rename = "NodeNames",
        alias = "nodenames",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub(crate) node_names: Option<Vec<String>>,
}

/// `v1.NodeList`, its items kept as they came.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct NodeList {
    /// The `Node` objects.
    #[serde(default)]
    pub(crate) items: Vec<serde_json::Value>,
}

/// The name of a `Node` object given as raw JSON (`metadata.name`), if it has one.
pub(crate) fn node_name(node: &serde_json::Value) -> Option<&str> {
    node.get("metadata")?.get("name")?.as_str()
}

/// The part of a `v1.Pod` the extender reads.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct Pod {
    /// `metadata`.
    #[serde(default)]
    pub(crate) metadata: PodMeta,
    /// `spec`.
    #[serde(default)]
    pub(crate) spec: PodSpec,
}

/// `metadata` of a pod.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct PodMeta {
    /// `name`.
    #[serde(default)]
    pub name: String,
    /// `namespace`.
    #[serde(default)]
    pub namespace: String,
    /// `uid`.
    #[serde(default)]
    pub uid: String,
}

/// `spec` of a pod: its volumes.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct PodSpec {
    /// `volumes`.
    #[serde(default)]
    pub(crate) volumes: Vec<Volume>,
}

/// One of a pod's volumes; only the claim form is read.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct Volume {
    /// `name`.
    #[serde(default)]
    pub name: String,
    /// `persistentVolumeClaim`.
    #[serde(
        rename = "persistentVolumeClaim",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub claim: Option<ClaimSource>,
}

/// `persistentVolumeClaim` of a pod volume.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct ClaimSource {
    /// `claimName`.
    #[serde(rename = "claimName", default)]
    pub(crate) claim_name: String,
}

/// The answer of the filter verb.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct ExtenderFilterResult {
    /// The passing nodes, whole (when the request had `Nodes`).
    #[serde(rename = "Nodes", default, skip_serializing_if = "Option::is_none")]
    pub(crate) nodes: Option<NodeList>,
    /// The passing nodes' names (when the request had `NodeNames`).
    #[serde(rename = "NodeNames", default, skip_serializing_if = "Option::is_none")]
    pub(crate) node_names: Option<Vec<String>>,
    /// Nodes filtered out, with why (kube-scheduler shows it in the pod's FailedScheduling event).
    #[serde(
        rename = "FailedNodes",
        default,
        skip_serializing_if = "BTreeMap::is_empty"
    )]
    pub(crate) failed_nodes: BTreeMap<String, String>,
    /// A failure of the whole call (with `ignorable: true`, kube-scheduler then goes on without
    /// this extender).
    #[serde(rename = "Error", default, skip_serializing_if = "String::is_empty")]
    pub(crate) error: String,
}

/// One node's score.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct HostPriority {
    /// The node's name.
    #[serde(rename = "Host")]
    pub(crate) host: String,
    /// 0..=[`MAX_EXTENDER_PRIORITY`].
    #[serde(rename = "Score")]
    pub(crate) score: i64,
}

/// The answer of the prioritize verb.
#[cfg(test)]
pub(crate) type HostPriorityList = Vec<HostPriority>;

#[cfg(test)]
mod tests {
    use super::*;

    /// A request exactly as kube-scheduler 1.20 writes it with `nodeCacheCapable: true`:
    /// `json.Marshal(&extenderv1.ExtenderArgs{Pod: pod, Nodes: nil, NodeNames: &names})` — Go
    /// field names as keys, the nil `Nodes` as `null`, the pod a whole tagged `v1.Pod`. The
    /// fields we do not model are ignored, those we do are read.
    #[test]
    fn reads_the_cache_capable_request() {
        let text = r#"{
          "Pod": {
            "metadata": {"name": "web-0", "namespace": "shop", "uid": "6c1d",
                         "labels": {"app": "web"}, "creationTimestamp": null},
            "spec": {
              "volumes": [
                {"name": "data", "persistentVolumeClaim": {"claimName": "data-web-0"}},
                {"name": "cfg", "configMap": {"name": "web"}},
                {"name": "tok", "projected": {"sources": []}}
              ],
              "containers": [{"name": "c", "image": "nginx", "resources": {}}],
              "schedulerName": "default-scheduler"
            },
            "status": {"phase": "Pending"}
          },
          "Nodes": null,
          "NodeNames": ["n1", "n2"]
        }"#;
        let a: ExtenderArgs = serde_json::from_str(text).unwrap();
        let pod = a.pod.as_ref().unwrap();
        assert_eq!(
            (pod.metadata.namespace.as_str(), pod.metadata.name.as_str()),
            ("shop", "web-0")
        );
        let claims: Vec<_> = pod
            .spec
            .volumes
            .iter()
            .filter_map(|v| v.claim.as_ref())
            .map(|c| c.claim_name.as_str())
            .collect();
        assert_eq!(claims, ["data-web-0"]);
        assert_eq!(
            a.node_names.as_deref(),
            Some(&["n1".to_owned(), "n2".to_owned()][..])
        );
        assert!(a.nodes.is_none());
        // The tagged copies' lower-case keys are read too.
        let lower: ExtenderArgs =
            serde_json::from_str(r#"{"pod":{"metadata":{"name":"p"}},"nodenames":["n1"]}"#)
                .unwrap();
        assert_eq!(lower.pod.unwrap().metadata.name, "p");
        assert_eq!(lower.node_names.unwrap(), ["n1"]);
        // Lower-case keys are not what 1.20 sends: a request read as if tagged would miss the pod.
        let wrong: serde_json::Value = serde_json::from_str(text).unwrap();
        assert!(wrong.get("pod").is_none() && wrong.get("Pod").is_some());
    }

    /// The whole-node form (`nodeCacheCapable: false`, `NodeNames` null): names are read from
    /// `metadata.name`, and the objects are kept intact.
    #[test]
    fn reads_the_node_list_request_and_keeps_the_nodes_whole() {
        let text = r#"{"Pod":{"metadata":{"name":"p"}},
          "Nodes":{"metadata":{},"items":[
            {"metadata":{"name":"n1","labels":{"a":"b"}},"status":{"allocatable":{"cpu":"2"}}},
            {"metadata":{}}]},
          "NodeNames":null}"#;
        let a: ExtenderArgs = serde_json::from_str(text).unwrap();
        assert!(a.node_names.is_none());
        let items = &a.nodes.as_ref().unwrap().items;
        assert_eq!(node_name(&items[0]), Some("n1"));
        assert_eq!(node_name(&items[1]), None);
        let back = serde_json::to_value(&a.nodes).unwrap();
        assert_eq!(back["items"][0]["status"]["allocatable"]["cpu"], "2");
    }

    /// The answers carry the Go field names (`NodeNames`, `FailedNodes`, `Error`, `Host`,
    /// `Score`), leave out what is empty, and read back equal; what Go's `json.Marshal` writes
    /// for these types (every field, nil as `null`) reads too.
    #[test]
    fn answers_use_the_upstream_field_names() {
        let r = ExtenderFilterResult {
            nodes: None,
            node_names: Some(vec!["n2".into()]),
            failed_nodes: BTreeMap::from([("n1".into(), "no room".into())]),
            error: String::new(),
        };
        let text = serde_json::to_string(&r).unwrap();
        assert_eq!(
            text,
            r#"{"NodeNames":["n2"],"FailedNodes":{"n1":"no room"}}"#
        );
        assert_eq!(
            serde_json::from_str::<ExtenderFilterResult>(&text).unwrap(),
            r
        );
        let e = ExtenderFilterResult {
            error: "boom".into(),
            ..Default::default()
        };
        assert_eq!(serde_json::to_string(&e).unwrap(), r#"{"Error":"boom"}"#);
        // json.Marshal(extenderv1.HostPriorityList{{Host: "n1", Score: 0}, {Host: "n2", Score: 10}})
        let go = r#"[{"Host":"n1","Score":0},{"Host":"n2","Score":10}]"#;
        let l: HostPriorityList = serde_json::from_str(go).unwrap();
        assert_eq!(
            l[1],
            HostPriority {
                host: "n2".into(),
                score: MAX_EXTENDER_PRIORITY
            }
        );
        assert_eq!(serde_json::to_string(&l).unwrap(), go);
        // json.Marshal of an ExtenderFilterResult with every field set (nil map as null).
        let go = r#"{"Nodes":{"metadata":{},"items":[{"metadata":{"name":"n1"}}]},"NodeNames":["n1"],"FailedNodes":{"n2":"x"},"FailedAndUnresolvableNodes":null,"Error":"e"}"#;
        let r: ExtenderFilterResult = serde_json::from_str(go).unwrap();
        assert_eq!(r.failed_nodes["n2"], "x");
        assert_eq!(r.error, "e");
        assert_eq!(node_name(&r.nodes.unwrap().items[0]), Some("n1"));
    }

    /// Junk never panics: it is a decode error the server answers with `Error`.
    #[test]
    fn junk_is_an_error() {
        for junk in [
            "",
            "7",
            "{\"Pod\":7}",
            "{\"NodeNames\":[1]}",
            "{\"Pod\":{\"spec\":{\"volumes\":{}}}}",
        ] {
            assert!(
                serde_json::from_str::<ExtenderArgs>(junk).is_err(),
                "{junk}"
            );
        }
        // Serde reads a struct from an array too; without a pod the server refuses the call.
        for empty in [
            "{}",
            "[]",
            "{\"Pod\":null,\"Nodes\":null,\"NodeNames\":null}",
        ] {
            let a: ExtenderArgs = serde_json::from_str(empty).unwrap();
            assert!(a.pod.is_none() && a.node_names.is_none() && a.nodes.is_none());
        }
    }
}
