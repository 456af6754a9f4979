//! JSON patches that change one entry of an object's finalizers and nothing else, each guarded by
//! a `test` so that a list another controller changed meanwhile is never overwritten.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

/// The JSON patch that adds `finalizer` to an object as read (`meta`): applied only while its
/// resourceVersion is still the one read (a `test`), so a list another controller changed
/// meanwhile is never overwritten. `None` when `meta` carries it already or has no
/// resourceVersion.
pub fn add_finalizer_patch(meta: &ObjectMeta, finalizer: &str) -> Option<serde_json::Value> {
    let rv = meta.resource_version.as_deref()?;
    let list = meta.finalizers.as_deref().unwrap_or_default();
    if list.iter().any(|f| f == finalizer) {
        return None;
    }
    let add = if list.is_empty() {
        serde_json::json!({"op": "add", "path": "/metadata/finalizers", "value": [finalizer]})
    } else {
        serde_json::json!({"op": "add", "path": "/metadata/finalizers/-", "value": finalizer})
    };
    Some(serde_json::json!([
        {"op": "test", "path": "/metadata/resourceVersion", "value": rv},
        add,
    ]))
}

/// The JSON patch that removes `finalizer` from an object as read (`meta`), and only it: a
/// `test` that the entry at its index still is `finalizer`, then a `remove` of that index.
/// `None` when `meta` does not carry it.
pub fn remove_finalizer_patch(meta: &ObjectMeta, finalizer: &str) -> Option<serde_json::Value> {
    let i = meta
        .finalizers
        .as_deref()
        .unwrap_or_default()
        .iter()
        .position(|f| f == finalizer)?;
    let path = format!("/metadata/finalizers/{i}");
    Some(serde_json::json!([
        {"op": "test", "path": path, "value": finalizer},
        {"op": "remove", "path": path},
    ]))
}
