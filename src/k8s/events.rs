//! Events on objects, for people (`kubectl describe`): the one way the daemons write them, so
//! that the provisioner's and the node-loss controller's events have the same shape.
//!
//! **API.** core/v1 `Event` (`involvedObject`, `source`, `firstTimestamp`/`lastTimestamp`,
//! `count`), which every release from 1.x on serves (1.20 included), and which `kubectl describe`
//! shows on every release; not `events.k8s.io/v1` (1.19 on).
//!
//! **Only creates.** [`record`] creates a new Event each time, named by the API server from
//! `generateName` (`<object>.`): it never reads, updates, patches or deletes an Event, so it
//! cannot change another component's event (nor an earlier one of its own), and its RBAC rule is
//! `events` create alone. A repeated note is a new event (`count` 1); the callers say each note
//! once per thing that happened.
//!
//! The message is written as the caller gives it: the callers write it for people and put no
//! secret in it (the rule of the house).

use super::call::call;
use super::error::ApiResult;
use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use kube::api::{Api, PostParams};

/// The namespace of the events of cluster-scoped objects (PVs): where `kubectl describe` looks
/// for them.
pub(crate) const CLUSTER_SCOPED_NAMESPACE: &str = "default";

/// An event to record on an object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct EventSpec {
    /// `PersistentVolumeClaim` or `PersistentVolume` (a core/v1 kind).
    pub(crate) kind: &'static str,
    /// Namespace of the object (`""` for cluster-scoped).
    pub(crate) namespace: String,
    /// Name of the object.
    pub(crate) name: String,
    /// Uid of the object.
    pub(crate) uid: String,
    /// `Warning` if set, else `Normal`.
    pub(crate) warning: bool,
    /// `ProvisioningSucceeded`, `ProvisioningFailed`, `VolumeFailedDelete`, `NodeLost`, ...
    pub(crate) reason: &'static str,
    /// For people: what happened and what to do.
    pub(crate) message: String,
}

/// The Event `spec` makes, as `component` (on `host`, if any) says it at `now`: in the object's
/// namespace ([`CLUSTER_SCOPED_NAMESPACE`] for a cluster-scoped one), named by the API server
/// from `<name>.`, `count` 1, the message as given.
pub(crate) fn build(spec: &EventSpec, component: &str, host: Option<&str>, now: Time) -> Event {
    let ns = if spec.namespace.is_empty() {
        CLUSTER_SCOPED_NAMESPACE
    } else {
        spec.namespace.as_str()
    };
    Event {
        metadata: ObjectMeta {
            generate_name: Some(format!("{}.", spec.name)),
            namespace: Some(ns.to_owned()),
            ..Default::default()
        },
        involved_object: ObjectReference {
            api_version: Some("v1".into()),
            kind: Some(spec.kind.into()),
            namespace: (!spec.namespace.is_empty()).then(|| spec.namespace.clone()),
            name: Some(spec.name.clone()),
            uid: Some(spec.uid.clone()),
            ..Default::default()
        },
        reason: Some(spec.reason.into()),
        message: Some(spec.message.clone()),
        type_: Some(if spec.warning { "Warning" } else { "Normal" }.into()),
        source: Some(EventSource {
            component: Some(component.to_owned()),
            host: host.map(str::to_owned),
        }),
        first_timestamp: Some(now.clone()),
        last_timestamp: Some(now),
        count: Some(1),
        ..Default::default()
    }
}

/// Creates the Event of `spec` ([`build`], now) through `client`, under the call deadline
/// ([`super::call::DEADLINE`]).
pub(crate) async fn record(
    client: &kube::Client,
    spec: &EventSpec,
    component: &str,
    host: Option<&str>,
) -> ApiResult<()> {
    let e = build(
        spec,
        component,
        host,
        Time(k8s_openapi::jiff::Timestamp::now()),
    );
    let ns = e.metadata.namespace.clone().unwrap_or_default();
    let api = Api::<Event>::namespaced(client.clone(), &ns);
    call(
        format!(
            "record event {} on {} {}",
            spec.reason, spec.kind, spec.name
        ),
        api.create(&PostParams::default(), &e),
    )
    .await
    .map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at() -> Time {
        Time("2026-01-02T03:04:05Z".parse().unwrap())
    }

    fn claim() -> EventSpec {
        EventSpec {
            kind: "PersistentVolumeClaim",
            namespace: "team-a".into(),
            name: "data".into(),
            uid: "u-1".into(),
            warning: false,
            reason: "ProvisioningSucceeded",
            message: "made pvc-1".into(),
        }
    }

    /// A claim's event: in its namespace, naming it (kind, namespace, name, uid, apiVersion v1),
    /// `Normal`, from the component and host given, `count` 1 at `now`.
    #[test]
    fn a_namespaced_objects_event() {
        let e = build(&claim(), "flexvol-provisioner", Some("node-1"), at());
        assert_eq!(e.metadata.namespace.as_deref(), Some("team-a"));
        assert_eq!(e.metadata.generate_name.as_deref(), Some("data."));
        let o = &e.involved_object;
        assert_eq!(o.api_version.as_deref(), Some("v1"));
        assert_eq!(o.kind.as_deref(), Some("PersistentVolumeClaim"));
        assert_eq!(o.namespace.as_deref(), Some("team-a"));
        assert_eq!(o.name.as_deref(), Some("data"));
        assert_eq!(o.uid.as_deref(), Some("u-1"));
        assert_eq!(e.reason.as_deref(), Some("ProvisioningSucceeded"));
        assert_eq!(e.message.as_deref(), Some("made pvc-1"));
        assert_eq!(e.type_.as_deref(), Some("Normal"));
        let s = e.source.unwrap();
        assert_eq!(s.component.as_deref(), Some("flexvol-provisioner"));
        assert_eq!(s.host.as_deref(), Some("node-1"));
        assert_eq!(e.first_timestamp, Some(at()));
        assert_eq!(e.last_timestamp, Some(at()));
        assert_eq!(e.count, Some(1));
    }

    /// A cluster-scoped object's (a PV's) event goes to "default" and its involvedObject has no
    /// namespace; a warning is `Warning`; no host is no host.
    #[test]
    fn a_cluster_scoped_objects_event_goes_to_default() {
        let pv = EventSpec {
            kind: "PersistentVolume",
            namespace: String::new(),
            name: "pvc-1".into(),
            uid: "u-2".into(),
            warning: true,
            reason: "NodeLost",
            message: "gone".into(),
        };
        let e = build(&pv, "flexvol-controller", None, at());
        assert_eq!(e.metadata.namespace.as_deref(), Some("default"));
        assert_eq!(e.involved_object.namespace, None);
        assert_eq!(e.involved_object.kind.as_deref(), Some("PersistentVolume"));
        assert_eq!(e.metadata.generate_name.as_deref(), Some("pvc-1."));
        assert_eq!(e.type_.as_deref(), Some("Warning"));
        let s = e.source.unwrap();
        assert_eq!(s.component.as_deref(), Some("flexvol-controller"));
        assert_eq!(s.host, None);
    }

    /// The message is written exactly as given (no formatting, trimming or quoting of its own).
    #[test]
    fn the_message_is_passed_as_given() {
        let m = "  {0} %s \"quoted\"\nsecond line\t ";
        let e = build(
            &EventSpec {
                message: m.into(),
                ..claim()
            },
            "c",
            None,
            at(),
        );
        assert_eq!(e.message.as_deref(), Some(m));
    }

    /// Every event is a new object: no name (the API server makes one from generateName), no
    /// resourceVersion, uid or owner, so a create never stands for an update of another event.
    #[test]
    fn every_event_is_a_new_object() {
        let m = build(&claim(), "c", None, at()).metadata;
        assert_eq!(m.name, None);
        assert_eq!(m.resource_version, None);
        assert_eq!(m.uid, None);
        assert_eq!(m.owner_references, None);
    }
}
