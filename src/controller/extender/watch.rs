//! The extender's view of the cluster: three watches (the capacity ConfigMaps of
//! [`crate::vocab::capacity::NAMESPACE`], every PVC, every StorageClass) kept in
//! [`State`]. The appliers ([`on_capacity`], [`on_claim`], [`on_class`]) are pure and tested; [`run`]
//! feeds them from kube-rs watchers, retrying a failed watch after 2 s, forever.
//!
//! A capacity record's `received_at` is when this version of its text arrived: a relist that
//! brings the same text keeps the old stamp, so a reconnect cannot make old data look fresh.
//! The state is synced once each watch has listed once; until then [`super::server`] decides
//! nothing.
//!
//! Status: the appliers are unit-tested; [`run`] runs against a real API server in
//! tests/cluster/provisioner-e2e.d/extender.sh, under drivers/deploy-overlays/capacity/scheduler-extender.yaml's
//! read-only roles.

use super::decide::Published;
use super::server::State;
use crate::k8s::watch::{WatchEvent, watch};
use crate::vocab::capacity::{DATA_KEY, NAMESPACE};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::Api;
use kube::runtime::watcher;
use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};
use std::time::SystemTime;

/// The names of the three watches, as [`State::listed`] records them.
pub(crate) const WATCHES: [&str; 3] = ["capacity", "claims", "classes"];

fn listed(s: &mut State, what: &'static str) {
    s.listed.insert(what);
    s.synced = WATCHES.iter().all(|w| s.listed.contains(w));
}

fn keep_capacity(s: &mut State, cm: ConfigMap, now: SystemTime) {
    let Some(name) = cm.metadata.name.clone() else {
        return;
    };
    let text = cm.data.as_ref().and_then(|d| d.get(DATA_KEY)).cloned();
    let same = s
        .capacity_text
        .get(&name)
        .is_some_and(|old| Some(old) == text.as_ref());
    if same && s.model.nodes.contains_key(&name) {
        return;
    }
    let record = crate::vocab::capacity::parse(&name, text.as_deref());
    s.capacity_text
        .insert(name.clone(), text.unwrap_or_default());
    s.model.nodes.insert(
        name,
        Published {
            record,
            received_at: now,
        },
    );
}

/// Applies a watch event of the capacity ConfigMaps.
pub(crate) fn on_capacity(s: &mut State, ev: WatchEvent<ConfigMap>, now: SystemTime) {
    match ev {
        WatchEvent::Applied(cm) => keep_capacity(s, cm, now),
        WatchEvent::Deleted(cm) => {
            if let Some(n) = cm.metadata.name {
                s.model.nodes.remove(&n);
                s.capacity_text.remove(&n);
            }
        }
        WatchEvent::Restarted(list) => {
            let names: Vec<String> = list
                .iter()
                .filter_map(|c| c.metadata.name.clone())
                .collect();
            s.model.nodes.retain(|n, _| names.contains(n));
            s.capacity_text.retain(|n, _| names.contains(n));
            for cm in list {
                keep_capacity(s, cm, now);
            }
            listed(s, "capacity");
        }
    }
}

fn claim_key(c: &PersistentVolumeClaim) -> Option<String> {
    Some(format!(
        "{}/{}",
        c.metadata.namespace.as_deref()?,
        c.metadata.name.as_deref()?
    ))
}

/// Applies a watch event of the claims.
pub(crate) fn on_claim(s: &mut State, ev: WatchEvent<PersistentVolumeClaim>) {
    match ev {
        WatchEvent::Applied(c) => {
            if let Some(k) = claim_key(&c) {
                s.claims.insert(k, c);
            }
        }
        WatchEvent::Deleted(c) => {
            if let Some(k) = claim_key(&c) {
                s.claims.remove(&k);
            }
        }
        WatchEvent::Restarted(list) => {
            s.claims = list
                .into_iter()
                .filter_map(|c| Some((claim_key(&c)?, c)))
                .collect();
            listed(s, "claims");
        }
    }
}

/// Applies a watch event of the StorageClasses.
pub(crate) fn on_class(s: &mut State, ev: WatchEvent<StorageClass>) {
    match ev {
        WatchEvent::Applied(c) => {
            if let Some(k) = c.metadata.name.clone() {
                s.classes.insert(k, c);
            }
        }
        WatchEvent::Deleted(c) => {
            if let Some(k) = c.metadata.name {
                s.classes.remove(&k);
            }
        }
        WatchEvent::Restarted(list) => {
            s.classes = list
                .into_iter()
                .filter_map(|c| Some((c.metadata.name.clone()?, c)))
                .collect::<BTreeMap<_, _>>();
            listed(s, "classes");
        }
    }
}

async fn follow<K, F>(api: Api<K>, what: &'static str, state: Arc<RwLock<State>>, apply: F)
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + 'static,
    F: Fn(&mut State, WatchEvent<K>),
{
    loop {
        let stream = watch(api.clone(), watcher::Config::default());
        let mut stream = std::pin::pin!(stream);
        while let Some(ev) = stream.next().await {
            match ev {
                Ok(ev) => match state.write() {
                    Ok(mut s) => apply(&mut s, ev),
                    Err(_) => return,
                },
                Err(e) => {
                    // The watcher itself waits before it lists again (crate::k8s::watch).
                    tracing::warn!(target: super::server::LOG_TARGET, "watch of {what}: {e}; retrying");
                }
            }
        }
    }
}

/// Keeps `state` up to date from the API server, until the process ends.
pub(crate) async fn run(client: kube::Client, state: Arc<RwLock<State>>) {
    let caps = follow(
        Api::<ConfigMap>::namespaced(client.clone(), NAMESPACE),
        "capacity ConfigMaps",
        state.clone(),
        |s, ev| on_capacity(s, ev, SystemTime::now()),
    );
    let claims = follow(
        Api::<PersistentVolumeClaim>::all(client.clone()),
        "claims",
        state.clone(),
        on_claim,
    );
    let classes = follow(
        Api::<StorageClass>::all(client),
        "StorageClasses",
        state,
        on_class,
    );
    futures::future::join3(caps, claims, classes).await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn cm(name: &str, text: Option<&str>) -> ConfigMap {
        let mut data = serde_json::Map::new();
        if let Some(t) = text {
            data.insert(DATA_KEY.into(), t.into());
        }
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": NAMESPACE}, "data": data}))
        .unwrap()
    }

    fn rec(node: &str, at: u64) -> String {
        format!(r#"{{"version":1,"node":"{node}","publishedAt":{at}}}"#)
    }

    fn t(s: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(s)
    }

    /// Records are parsed on arrival, stamped when their text changes (not on a relist of the
    /// same text), removed with their object or a relist without them; bad ones are kept as
    /// "ignored, because". Synced only once all three watches have listed.
    #[test]
    fn capacity_events_keep_the_model() {
        let mut s = State::new("flexvol".into(), Duration::from_secs(180));
        on_capacity(
            &mut s,
            WatchEvent::Restarted(vec![cm("n1", Some(&rec("n1", 100))), cm("n2", None)]),
            t(110),
        );
        assert!(s.model.nodes["n1"].record.is_ok());
        let e = s.model.nodes["n2"].record.as_ref().unwrap_err();
        assert_eq!(e, &crate::vocab::capacity::RecordError::Missing);
        assert!(e.to_string().contains(DATA_KEY), "{e}");
        assert!(!s.synced);
        // The same text again (a relist): the stamp stays.
        on_capacity(
            &mut s,
            WatchEvent::Restarted(vec![cm("n1", Some(&rec("n1", 100)))]),
            t(500),
        );
        assert_eq!(s.model.nodes["n1"].received_at, t(110));
        assert!(!s.model.nodes.contains_key("n2"), "gone from the relist");
        // New text: a new stamp.
        on_capacity(
            &mut s,
            WatchEvent::Applied(cm("n1", Some(&rec("n1", 560)))),
            t(561),
        );
        assert_eq!(s.model.nodes["n1"].received_at, t(561));
        // A record naming another node, published under this name: ignored.
        on_capacity(
            &mut s,
            WatchEvent::Applied(cm("n3", Some(&rec("n1", 560)))),
            t(561),
        );
        assert!(s.model.nodes["n3"].record.is_err());
        on_capacity(&mut s, WatchEvent::Deleted(cm("n1", None)), t(600));
        assert!(!s.model.nodes.contains_key("n1"));
        on_claim(&mut s, WatchEvent::Restarted(vec![]));
        assert!(!s.synced);
        on_class(&mut s, WatchEvent::Restarted(vec![]));
        assert!(s.synced);
    }

    /// Claims are keyed namespace/name, classes by name; deletes and relists replace.
    #[test]
    fn claim_and_class_events_keep_the_caches() {
        let mut s = State::new("flexvol".into(), Duration::from_secs(180));
        let claim = |ns: &str, n: &str| -> PersistentVolumeClaim {
            serde_json::from_value(serde_json::json!({"metadata": {"name": n, "namespace": ns}}))
                .unwrap()
        };
        on_claim(
            &mut s,
            WatchEvent::Restarted(vec![claim("a", "x"), claim("b", "x")]),
        );
        on_claim(&mut s, WatchEvent::Applied(claim("a", "y")));
        on_claim(&mut s, WatchEvent::Deleted(claim("b", "x")));
        assert_eq!(s.claims.keys().collect::<Vec<_>>(), ["a/x", "a/y"]);
        let class = |n: &str| -> StorageClass {
            serde_json::from_value(serde_json::json!({"metadata": {"name": n}, "provisioner": "p"}))
                .unwrap()
        };
        on_class(&mut s, WatchEvent::Applied(class("c1")));
        on_class(&mut s, WatchEvent::Restarted(vec![class("c2")]));
        assert_eq!(s.classes.keys().collect::<Vec<_>>(), ["c2"]);
        on_class(&mut s, WatchEvent::Deleted(class("c2")));
        assert!(s.classes.is_empty());
    }
}
