//! The watch caches of one instance: only the claims and PVs it works on, so that what a node
//! holds and does follows its own volumes, not the size of the cluster.
//!
//! - **PVs of this node** (node-local kinds): a watch with the label selector
//!   `flexvol/node=<node>` ([`LABEL_NODE`], on every node-local PV we make): the API server
//!   filters, other nodes' PVs never reach this instance.
//! - **PVs of the shared kinds** (NFS): a watch with `flexvol/kind in (<kinds>)` ([`LABEL_KIND`]),
//!   running only while this instance leads the shared work ([`Leads::shared`]); the others hold
//!   none.
//! - **Claims**: no selector can pick them (the node is an annotation the scheduler writes), so
//!   every claim's events pass through, and only those this instance works on are kept
//!   ([`Scope::keep_claim`]): node-local claims whose `selected-node` is this node, claims of the
//!   shared kinds while leading them, and while leading the cluster-wide claim duty, pending
//!   node-local claims without a node (to tell Immediate-binding ones what is wrong). A change to
//!   another node's claim costs one decode and a comparison, and no work.
//! - **StorageClasses**: every one ([`Caches::classes`], by name): the one watch every instance
//!   runs over the whole cluster (the holder of the claim duty also watches every claim, above),
//!   sized by the classes (a few per cluster), not by claims or nodes. The reconciler
//!   reads a claim's class here, never from the server; a class missing from the listed cache is
//!   "not found", and before the first list the lanes do not plan (the read is an error, and the
//!   lanes hold their keys until [`Cache::is_ready`]).
//!
//! Every change of a kept object (or an object that stops being kept) sends its [`Key`] to the
//! lane that works on its kind ([`Routes`]). A class changes no key by itself, except that one
//! appearing (created, or seen again after a list) sends the keys of the kept claims of that
//! class name that still wait for a volume: a claim made before its class is provisioned as soon
//! as the class exists, not at the next resync. When what this instance leads changes, the claim
//! watch lists again with the new filter.
//!
//! PVs made before the labels existed are labelled by the startup sweep of [`crate::provision::lanes`].

use crate::k8s::error::{ApiError, ApiErrorKind, ApiResult};
use crate::k8s::watch::{WatchEvent, watch};
use crate::provision::reconcile::{Key, claim_provisioner, node_label_value};
use crate::provision::telemetry::{LOG_TARGET, WatchEvents};
use crate::vocab::ANN_NODE;
use crate::vocab::{ANN_PROVISIONED_BY, ANN_SELECTED_NODE};
use crate::vocab::{LABEL_KIND, LABEL_NODE};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::Api;
use kube::runtime::watcher;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use tokio::sync::{mpsc::UnboundedSender, watch};
use tracing::warn;

/// Which lane works on a kind (defined with the lanes' queues, which telemetry may name too).
pub(crate) use crate::k8s::queue::Lane;

/// What this instance leads right now (see [`crate::k8s::lease`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Leads {
    /// The cluster-wide claim duty: telling claims of node-local classes with Immediate binding.
    pub(crate) claims: bool,
    /// The shared kinds' work (NFS claims and PVs).
    pub(crate) shared: bool,
}

/// Who this instance is and what it works on.
#[derive(Debug, Clone)]
pub(crate) struct Scope {
    /// This node's name.
    pub node: String,
    /// Provisioner names (`<vendor>/<kind>`) of the node-local kinds.
    pub(crate) local: Vec<String>,
    /// Provisioner names of the shared kinds.
    pub(crate) shared: Vec<String>,
    /// The shared kinds' names (`nfs`), the values of [`LABEL_KIND`] on their PVs.
    pub(crate) shared_kinds: Vec<String>,
    /// What this instance leads, as it changes.
    pub(crate) leads: watch::Receiver<Leads>,
}

fn ann<'a>(meta: &'a ObjectMeta, key: &str) -> Option<&'a str> {
    meta.annotations
        .as_ref()
        .and_then(|a| a.get(key))
        .map(String::as_str)
}

/// The cache key of a claim: `namespace/name`.
pub(crate) fn claim_key(meta: &ObjectMeta) -> String {
    format!(
        "{}/{}",
        meta.namespace.as_deref().unwrap_or(""),
        meta.name.as_deref().unwrap_or("")
    )
}

impl Scope {
    fn lane_of(&self, provisioner: &str) -> Option<Lane> {
        if self.local.iter().any(|p| p == provisioner) {
            Some(Lane::Local)
        } else if self.shared.iter().any(|p| p == provisioner) {
            Some(Lane::Shared)
        } else {
            None
        }
    }

    /// The lane of a claim's kind (`None`: not one of ours), kept or not.
    pub(crate) fn claim_lane(&self, c: &PersistentVolumeClaim) -> Option<Lane> {
        claim_provisioner(&c.metadata).and_then(|p| self.lane_of(p))
    }

    /// The lane of the kind that made a PV (`None`: not ours).
    pub(crate) fn volume_lane(&self, v: &PersistentVolume) -> Option<Lane> {
        ann(&v.metadata, ANN_PROVISIONED_BY).and_then(|p| self.lane_of(p))
    }

    /// Whether this instance keeps claim `c` of the claim watch (node-local claims) while
    /// leading `leads`. Decided by the annotations alone: a claim's labels only route it here.
    pub(crate) fn keep_claim(&self, c: &PersistentVolumeClaim, leads: Leads) -> bool {
        match self.claim_lane(c) {
            None | Some(Lane::Shared) => false,
            Some(Lane::Local) => match ann(&c.metadata, ANN_SELECTED_NODE) {
                Some(n) => n == self.node,
                None => {
                    leads.claims
                        && c.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Pending")
                        && c.spec
                            .as_ref()
                            .and_then(|s| s.volume_name.as_deref())
                            .is_none_or(str::is_empty)
                }
            },
        }
    }

    /// Whether this instance keeps claim `c` of the shared-kind claim watch: a claim of a shared
    /// kind, only while leading them.
    pub(crate) fn keep_shared_claim(&self, c: &PersistentVolumeClaim, leads: Leads) -> bool {
        leads.shared && self.claim_lane(c) == Some(Lane::Shared)
    }

    /// The label selector of the claim watch while leading `leads`: none (every claim) for the
    /// holder of the claim duty, which labels them all ([`crate::provision::labeller`]); this node's
    /// claims (`flexvol/node=<node>`, the label the holder writes from `selected-node`) for the
    /// others.
    pub(crate) fn claim_selector(&self, leads: Leads) -> Option<String> {
        (!leads.claims).then(|| self.local_selector())
    }

    /// Whether this instance keeps PV `v` of the node-label watch: a node-local PV of this node.
    pub(crate) fn keep_local_volume(&self, v: &PersistentVolume, _leads: Leads) -> bool {
        self.volume_lane(v) == Some(Lane::Local)
            && ann(&v.metadata, ANN_NODE) == Some(self.node.as_str())
    }

    /// Whether this instance keeps PV `v` of the shared-kind watch (only while leading them).
    pub(crate) fn keep_shared_volume(&self, v: &PersistentVolume, leads: Leads) -> bool {
        leads.shared && self.volume_lane(v) == Some(Lane::Shared)
    }

    /// The label selector of this node's node-local PVs.
    pub(crate) fn local_selector(&self) -> String {
        format!("{LABEL_NODE}={}", node_label_value(&self.node))
    }

    /// The label selector of the shared kinds' PVs (`None`: no shared kind).
    pub(crate) fn shared_selector(&self) -> Option<String> {
        (!self.shared_kinds.is_empty())
            .then(|| format!("{LABEL_KIND} in ({})", self.shared_kinds.join(",")))
    }
}

/// Where the keys of changed objects go: one channel per lane.
#[derive(Debug, Clone)]
pub(crate) struct Routes {
    /// The node-local lane's.
    pub(crate) local: UnboundedSender<Key>,
    /// The shared lane's.
    pub(crate) shared: UnboundedSender<Key>,
}

impl Routes {
    fn send(&self, lane: Option<Lane>, key: Key) {
        // A lane that is gone (the process is ending) has nothing to be told.
        let _ = match lane {
            Some(Lane::Local) => self.local.send(key),
            Some(Lane::Shared) => self.shared.send(key),
            None => Ok(()),
        };
    }
}

/// One cache: the kept objects by key, and whether it holds a first full list.
pub(crate) struct Cache<K> {
    map: Mutex<HashMap<String, Arc<K>>>,
    ready: AtomicBool,
}

impl<K> Default for Cache<K> {
    fn default() -> Self {
        Self {
            map: Mutex::new(HashMap::new()),
            ready: AtomicBool::new(false),
        }
    }
}

impl<K> Cache<K> {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<K>>> {
        // A panic exits the process (the provisioner's hook), so a poisoned lock is never seen
        // by a survivor; take the data either way.
        self.map.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The object of `key`.
    pub(crate) fn get(&self, key: &str) -> Option<Arc<K>> {
        self.lock().get(key).cloned()
    }

    /// Every kept object.
    pub(crate) fn values(&self) -> Vec<Arc<K>> {
        self.lock().values().cloned().collect()
    }

    /// How many objects are kept.
    pub(crate) fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether nothing is kept.
    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether it holds a first full list.
    pub(crate) fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Acquire)
    }
}

impl Cache<StorageClass> {
    /// The class `name` (`None`: there is none, the cache holding every class); an error while
    /// the cache has not listed yet, so that a class not seen yet is never taken for one that
    /// does not exist.
    pub(crate) fn class(&self, name: &str) -> ApiResult<Option<Arc<StorageClass>>> {
        if !self.is_ready() {
            return Err(ApiError::new(
                format!("read StorageClass {name}"),
                ApiErrorKind::Other,
                "the StorageClass watch has not listed yet",
            ));
        }
        Ok(self.get(name))
    }
}

/// The caches of an instance.
pub(crate) struct Caches {
    /// Node-local claims this instance works on (and, while leading the claim duty, pending ones
    /// without a node).
    pub(crate) claims: Arc<Cache<PersistentVolumeClaim>>,
    /// The shared kinds' claims (empty unless leading them).
    pub(crate) shared_claims: Arc<Cache<PersistentVolumeClaim>>,
    /// This node's node-local PVs.
    pub(crate) local_volumes: Arc<Cache<PersistentVolume>>,
    /// The shared kinds' PVs (empty unless leading them).
    pub(crate) shared_volumes: Arc<Cache<PersistentVolume>>,
    /// Every StorageClass, by name.
    pub(crate) classes: Arc<Cache<StorageClass>>,
    scope: Arc<Scope>,
}

/// The claim watch's observer while leading the claim duty (the labeller's
/// [`crate::provision::labeller::Relabel`]; this module does not depend on it).
pub(crate) type ClaimObserver = Arc<dyn Observer<PersistentVolumeClaim>>;

/// Sees every event of a watch, kept or not (the claim labeller, [`crate::provision::labeller::Relabel`]).
pub(crate) trait Observer<K>: Send + Sync {
    /// An object as it is now.
    fn applied(&self, o: &K);
    /// An object is gone.
    fn deleted(&self, o: &K);
    /// Every object there is (a new list).
    fn restarted(&self, list: &[K]);
}

/// How one watch keeps its cache: which objects, in which lane, under which key, with which
/// label selector, and whether the watch runs at all for what this instance leads.
struct Keeping<K> {
    what: &'static str,
    keep: fn(&Scope, &K, Leads) -> bool,
    lane: fn(&Scope, &K) -> Option<Lane>,
    key: fn(&K) -> (String, Key),
    active: fn(Leads) -> bool,
    /// The label selector for what this instance leads (`None`: every object).
    select: fn(&Scope, Leads) -> Option<String>,
    /// The part of what this instance leads that the filter depends on: the watch lists again
    /// when it changes.
    depends: fn(Leads) -> Leads,
    /// The watch's name in `flexvol_provisioner_watch_events_total{watch=...}`, for what this
    /// instance leads.
    metric: fn(Leads) -> &'static str,
    /// Told every event, while it says so.
    observer: Option<Observing<K>>,
}

/// An [`Observer`] and when it is told: for what this instance leads.
struct Observing<K> {
    observer: Arc<dyn Observer<K>>,
    when: fn(Leads) -> bool,
}

fn claim_keys(c: &PersistentVolumeClaim) -> (String, Key) {
    let k = claim_key(&c.metadata);
    (k.clone(), Key::Claim(k))
}

fn volume_keys(v: &PersistentVolume) -> (String, Key) {
    let k = v.metadata.name.clone().unwrap_or_default();
    (k.clone(), Key::Volume(k))
}

/// The claim watch: every claim while leading the claim duty (and labelling them), else this
/// node's.
fn claims_keeping(relabel: Option<ClaimObserver>) -> Keeping<PersistentVolumeClaim> {
    Keeping {
        what: "claims",
        keep: Scope::keep_claim,
        lane: Scope::claim_lane,
        key: claim_keys,
        active: |_| true,
        select: Scope::claim_selector,
        depends: |l| Leads {
            claims: l.claims,
            shared: false,
        },
        metric: |l| {
            if l.claims {
                "claims-all"
            } else {
                "claims-node"
            }
        },
        observer: relabel.map(|observer| Observing {
            observer,
            when: |l| l.claims,
        }),
    }
}

fn shared_claims_keeping() -> Keeping<PersistentVolumeClaim> {
    Keeping {
        what: "the shared kinds' claims",
        keep: Scope::keep_shared_claim,
        lane: Scope::claim_lane,
        key: claim_keys,
        active: |l| l.shared,
        select: |s, _| s.shared_selector(),
        depends: |l| Leads {
            claims: false,
            shared: l.shared,
        },
        metric: |_| "claims-shared",
        observer: None,
    }
}

impl Caches {
    /// Starts the watches (on the current runtime) that fill the caches and send changed keys
    /// along `routes`; the claim watch tells `relabel` every claim while this instance leads the
    /// claim duty. Each object received is counted in `events`
    /// (`flexvol_provisioner_watch_events_total`).
    pub(crate) fn start(
        client: &kube::Client,
        scope: Scope,
        routes: Routes,
        relabel: Option<ClaimObserver>,
        events: WatchEvents,
    ) -> Self {
        let scope = Arc::new(scope);
        let caches = Self {
            claims: Arc::new(Cache::default()),
            shared_claims: Arc::new(Cache::default()),
            local_volumes: Arc::new(Cache::default()),
            shared_volumes: Arc::new(Cache::default()),
            classes: Arc::new(Cache::default()),
            scope: scope.clone(),
        };
        tokio::spawn(watch_classes(
            Api::<StorageClass>::all(client.clone()),
            caches.classes.clone(),
            [caches.claims.clone(), caches.shared_claims.clone()],
            scope.clone(),
            routes.clone(),
            events.clone(),
        ));
        let spawn = |api, cache, keeping| {
            tokio::spawn(watch_into(
                api,
                cache,
                scope.clone(),
                routes.clone(),
                events.clone(),
                keeping,
            ));
        };
        let spawn_pv = |api, cache, keeping| {
            tokio::spawn(watch_into(
                api,
                cache,
                scope.clone(),
                routes.clone(),
                events.clone(),
                keeping,
            ));
        };
        spawn(
            Api::<PersistentVolumeClaim>::all(client.clone()),
            caches.claims.clone(),
            claims_keeping(relabel),
        );
        spawn_pv(
            Api::<PersistentVolume>::all(client.clone()),
            caches.local_volumes.clone(),
            Keeping {
                what: "this node's PVs",
                keep: Scope::keep_local_volume,
                lane: Scope::volume_lane,
                key: volume_keys,
                active: |_| true,
                select: |s, _| Some(s.local_selector()),
                depends: |_| Leads::default(),
                metric: |_| "pvs-node",
                observer: None,
            },
        );
        if scope.shared_selector().is_some() {
            spawn(
                Api::<PersistentVolumeClaim>::all(client.clone()),
                caches.shared_claims.clone(),
                shared_claims_keeping(),
            );
            spawn_pv(
                Api::<PersistentVolume>::all(client.clone()),
                caches.shared_volumes.clone(),
                Keeping {
                    what: "the shared kinds' PVs",
                    keep: Scope::keep_shared_volume,
                    lane: Scope::volume_lane,
                    key: volume_keys,
                    active: |l| l.shared,
                    select: |s, _| s.shared_selector(),
                    depends: |l| Leads {
                        claims: false,
                        shared: l.shared,
                    },
                    metric: |_| "pvs-shared",
                    observer: None,
                },
            );
        } else {
            caches.shared_claims.ready.store(true, Ordering::Release);
            caches.shared_volumes.ready.store(true, Ordering::Release);
        }
        caches
    }

    /// Whether every cache holds a first full list.
    pub(crate) fn ready(&self) -> bool {
        self.claims.is_ready()
            && self.shared_claims.is_ready()
            && self.local_volumes.is_ready()
            && self.shared_volumes.is_ready()
            && self.classes.is_ready()
    }

    /// The claim `key` (`namespace/name`), of either claim cache.
    pub fn claim(&self, key: &str) -> Option<Arc<PersistentVolumeClaim>> {
        self.claims.get(key).or_else(|| self.shared_claims.get(key))
    }

    /// Every claim kept, of both claim caches.
    pub(crate) fn all_claims(&self) -> Vec<Arc<PersistentVolumeClaim>> {
        let mut v = self.claims.values();
        v.extend(self.shared_claims.values());
        v
    }

    /// The keys of every kept object of `lane` (a resync).
    pub(crate) fn keys(&self, lane: Lane) -> Vec<Key> {
        let s = &self.scope;
        let mut keys: Vec<Key> = self
            .all_claims()
            .iter()
            .filter(|c| s.claim_lane(c) == Some(lane))
            .map(|c| claim_keys(c).1)
            .collect();
        let volumes = match lane {
            Lane::Local => &self.local_volumes,
            Lane::Shared => &self.shared_volumes,
        };
        keys.extend(volumes.values().iter().map(|v| volume_keys(v).1));
        keys
    }
}

/// Keeps `cache` filled from a watch of `api` as `how` says (its selector for what this instance
/// leads), until the process ends; lists again after a watch error (with a pause) and, where the
/// filter depends on it, when what this instance leads changes.
async fn watch_into<K>(
    api: Api<K>,
    cache: Arc<Cache<K>>,
    scope: Arc<Scope>,
    routes: Routes,
    events: WatchEvents,
    how: Keeping<K>,
) where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + 'static,
{
    let mut leads_rx = scope.leads.clone();
    loop {
        let leads = *leads_rx.borrow_and_update();
        if !(how.active)(leads) {
            cache.lock().clear();
            cache.ready.store(true, Ordering::Release);
            if leads_rx.changed().await.is_err() {
                return;
            }
            continue;
        }
        let mut config = watcher::Config::default();
        if let Some(sel) = (how.select)(&scope, leads) {
            config = config.labels(&sel);
        }
        let counter = events
            .get_or_create(&[("watch", (how.metric)(leads))])
            .clone();
        let stream = watch(api.clone(), config);
        let mut stream = std::pin::pin!(stream);
        let mine = (how.depends)(leads);
        loop {
            let next = stream.next();
            let rx = &mut leads_rx;
            let change = async {
                // Only a change of what the filter depends on lists again.
                loop {
                    if rx.changed().await.is_err() {
                        std::future::pending::<()>().await;
                    }
                    if (how.depends)(*rx.borrow()) != mine {
                        return;
                    }
                }
            };
            let change = std::pin::pin!(change);
            match futures::future::select(next, change).await {
                futures::future::Either::Left((Some(Ok(ev)), _)) => {
                    counter.inc_by(match &ev {
                        WatchEvent::Restarted(list) => {
                            u64::try_from(list.len()).unwrap_or(u64::MAX)
                        }
                        _ => 1,
                    });
                    let observer = how
                        .observer
                        .as_ref()
                        .filter(|o| (o.when)(leads))
                        .map(|o| o.observer.as_ref());
                    apply(&cache, &scope, &routes, &how, leads, observer, ev);
                }
                futures::future::Either::Left((Some(Err(e)), _)) => {
                    // The watcher itself waits before it lists again (crate::k8s::watch).
                    warn!(target: LOG_TARGET, "watch of {}: {e}; retrying", how.what);
                }
                futures::future::Either::Left((None, _)) | futures::future::Either::Right(_) => {
                    break;
                }
            }
        }
    }
}

/// Keeps `classes` filled from a watch of every StorageClass until the process ends (the watcher
/// lists again after an error, with a pause); a class that appears sends the keys of the claims
/// kept in `claims` that wait for it ([`apply_class`]).
async fn watch_classes(
    api: Api<StorageClass>,
    classes: Arc<Cache<StorageClass>>,
    claims: [Arc<Cache<PersistentVolumeClaim>>; 2],
    scope: Arc<Scope>,
    routes: Routes,
    events: WatchEvents,
) {
    let counter = events.get_or_create(&[("watch", "classes")]).clone();
    let stream = watch(api, watcher::Config::default());
    let mut stream = std::pin::pin!(stream);
    while let Some(ev) = stream.next().await {
        match ev {
            Ok(ev) => {
                counter.inc_by(match &ev {
                    WatchEvent::Restarted(list) => u64::try_from(list.len()).unwrap_or(u64::MAX),
                    _ => 1,
                });
                apply_class(&classes, &claims, &scope, &routes, ev);
            }
            // The watcher itself waits before it lists again (crate::k8s::watch).
            Err(e) => warn!(target: LOG_TARGET, "watch of StorageClasses: {e}; retrying"),
        }
    }
}

/// Applies one event of the StorageClass watch to `classes`; for each class that was not held
/// before, sends the keys of the claims of that class name kept in `claims` that still wait for
/// a volume to their lanes (a claim made before its class).
fn apply_class(
    classes: &Cache<StorageClass>,
    claims: &[Arc<Cache<PersistentVolumeClaim>>],
    scope: &Scope,
    routes: &Routes,
    ev: WatchEvent<StorageClass>,
) {
    let name = |c: &StorageClass| c.metadata.name.clone().unwrap_or_default();
    let appeared: Vec<String> = match ev {
        WatchEvent::Applied(c) => {
            let n = name(&c);
            let new = classes.lock().insert(n.clone(), Arc::new(c)).is_none();
            if new { vec![n] } else { Vec::new() }
        }
        WatchEvent::Deleted(c) => {
            classes.lock().remove(&name(&c));
            Vec::new()
        }
        WatchEvent::Restarted(list) => {
            let kept: HashMap<String, Arc<StorageClass>> =
                list.into_iter().map(|c| (name(&c), Arc::new(c))).collect();
            let old = std::mem::replace(&mut *classes.lock(), kept);
            classes.ready.store(true, Ordering::Release);
            classes
                .lock()
                .keys()
                .filter(|n| !old.contains_key(*n))
                .cloned()
                .collect()
        }
    };
    if appeared.is_empty() {
        return;
    }
    for c in claims.iter().flat_map(|cache| cache.values()) {
        let class = c
            .spec
            .as_ref()
            .and_then(|s| s.storage_class_name.as_deref());
        if class.is_some_and(|n| appeared.iter().any(|a| a == n))
            && crate::provision::storage::awaits_volume(&c)
        {
            routes.send(scope.claim_lane(&c), claim_keys(&c).1);
        }
    }
}

fn apply<K>(
    cache: &Cache<K>,
    scope: &Scope,
    routes: &Routes,
    how: &Keeping<K>,
    leads: Leads,
    observer: Option<&dyn Observer<K>>,
    ev: WatchEvent<K>,
) {
    match ev {
        WatchEvent::Applied(o) => {
            if let Some(obs) = observer {
                obs.applied(&o);
            }
            let (k, key) = (how.key)(&o);
            let lane = (how.lane)(scope, &o);
            if (how.keep)(scope, &o, leads) {
                cache.lock().insert(k, Arc::new(o));
                routes.send(lane, key);
            } else if cache.lock().remove(&k).is_some() {
                routes.send(lane, key);
            }
        }
        WatchEvent::Deleted(o) => {
            if let Some(obs) = observer {
                obs.deleted(&o);
            }
            let (k, key) = (how.key)(&o);
            if cache.lock().remove(&k).is_some() {
                routes.send((how.lane)(scope, &o), key);
            }
        }
        WatchEvent::Restarted(list) => {
            if let Some(obs) = observer {
                obs.restarted(&list);
            }
            let mut kept = HashMap::new();
            let mut changed = Vec::new();
            for o in list {
                if (how.keep)(scope, &o, leads) {
                    let (k, key) = (how.key)(&o);
                    changed.push(((how.lane)(scope, &o), key));
                    kept.insert(k, Arc::new(o));
                }
            }
            let old = std::mem::replace(&mut *cache.lock(), kept);
            for (k, o) in old {
                if cache.get(&k).is_none() {
                    let (_, key) = (how.key)(&o);
                    changed.push(((how.lane)(scope, &o), key));
                }
            }
            cache.ready.store(true, Ordering::Release);
            for (lane, key) in changed {
                routes.send(lane, key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn scope(leads: Leads) -> (Scope, watch::Sender<Leads>) {
        let (tx, rx) = watch::channel(leads);
        (
            Scope {
                node: "node-a".into(),
                local: vec!["flexvol/hostpath".into(), "flexvol/lvm".into()],
                shared: vec!["flexvol/nfs".into()],
                shared_kinds: vec!["nfs".into()],
                leads: rx,
            },
            tx,
        )
    }

    fn claim(prov: &str, node: Option<&str>, phase: &str) -> PersistentVolumeClaim {
        let mut a = BTreeMap::from([(
            "volume.beta.kubernetes.io/storage-provisioner".to_owned(),
            prov.to_owned(),
        )]);
        if let Some(n) = node {
            a.insert(ANN_SELECTED_NODE.into(), n.into());
        }
        PersistentVolumeClaim {
            metadata: ObjectMeta {
                namespace: Some("ns".into()),
                name: Some("c".into()),
                annotations: Some(a),
                ..Default::default()
            },
            status: Some(k8s_openapi::api::core::v1::PersistentVolumeClaimStatus {
                phase: Some(phase.into()),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn an_instance_keeps_only_the_claims_it_works_on() {
        let (s, _tx) = scope(Leads::default());
        let none = Leads::default();
        let all = Leads {
            claims: true,
            shared: true,
        };
        let mine = claim("flexvol/hostpath", Some("node-a"), "Pending");
        let theirs = claim("flexvol/hostpath", Some("node-b"), "Pending");
        let unscheduled = claim("flexvol/lvm", None, "Pending");
        let nfs = claim("flexvol/nfs", None, "Pending");
        let other = claim("example.com/x", Some("node-a"), "Pending");
        assert!(s.keep_claim(&mine, none));
        assert!(!s.keep_claim(&theirs, all));
        assert!(!s.keep_claim(&other, all));
        // Unscheduled node-local claims: only for the instance with the claim duty.
        assert!(!s.keep_claim(&unscheduled, none));
        assert!(s.keep_claim(&unscheduled, all));
        assert!(!s.keep_claim(&claim("flexvol/lvm", None, "Bound"), all));
        // Shared claims: only in the shared-kind claim cache, only while leading them.
        assert!(!s.keep_claim(&nfs, all));
        assert!(!s.keep_shared_claim(&nfs, none));
        assert!(s.keep_shared_claim(&nfs, all));
        assert!(!s.keep_shared_claim(&mine, all));
        // Labels do not decide: a tenant's flexvol/node=node-a on another node's claim, or on
        // a claim of another provisioner, makes this instance receive it, not keep it.
        let mut forged = theirs.clone();
        forged.metadata.labels = Some(BTreeMap::from([(
            LABEL_NODE.to_owned(),
            "node-a".to_owned(),
        )]));
        assert!(!s.keep_claim(&forged, all));
        let mut forged = other.clone();
        forged.metadata.labels = Some(BTreeMap::from([(LABEL_KIND.to_owned(), "nfs".to_owned())]));
        assert!(!s.keep_claim(&forged, all) && !s.keep_shared_claim(&forged, all));
        assert_eq!(s.claim_lane(&nfs), Some(Lane::Shared));
        assert_eq!(s.claim_lane(&theirs), Some(Lane::Local));
        assert_eq!(s.claim_lane(&other), None);
    }

    fn pv(prov: &str, node: &str) -> PersistentVolume {
        PersistentVolume {
            metadata: ObjectMeta {
                name: Some("pvc-1".into()),
                annotations: Some(BTreeMap::from([
                    (ANN_PROVISIONED_BY.to_owned(), prov.to_owned()),
                    (ANN_NODE.to_owned(), node.to_owned()),
                ])),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    #[test]
    fn an_instance_keeps_its_nodes_pvs_and_the_shared_ones_only_while_leading() {
        let (s, _tx) = scope(Leads::default());
        let lead = Leads {
            claims: false,
            shared: true,
        };
        assert!(s.keep_local_volume(&pv("flexvol/hostpath", "node-a"), Leads::default()));
        // The label selector is only a filter: a PV of another node under a colliding label
        // is still not kept.
        assert!(!s.keep_local_volume(&pv("flexvol/hostpath", "node-b"), lead));
        assert!(!s.keep_local_volume(&pv("flexvol/nfs", "node-a"), lead));
        assert!(!s.keep_shared_volume(&pv("flexvol/nfs", "node-b"), Leads::default()));
        assert!(s.keep_shared_volume(&pv("flexvol/nfs", "node-b"), lead));
        assert_eq!(s.local_selector(), "flexvol/node=node-a");
        // Claims: this node's label, except for the holder of the claim duty (every claim).
        assert_eq!(
            s.claim_selector(Leads::default()).as_deref(),
            Some("flexvol/node=node-a")
        );
        assert_eq!(
            s.claim_selector(lead).as_deref(),
            Some("flexvol/node=node-a")
        );
        assert_eq!(
            s.claim_selector(Leads {
                claims: true,
                shared: false
            }),
            None
        );
        let mut long = s.clone();
        long.node = "n".repeat(100);
        assert_eq!(
            long.claim_selector(Leads::default()),
            Some(format!("flexvol/node={}", node_label_value(&long.node)))
        );
        assert_eq!(
            s.shared_selector().as_deref(),
            Some("flexvol/kind in (nfs)")
        );
    }

    /// Routes to two lanes, with the receiving ends (node-local, shared).
    fn routes() -> (
        Routes,
        tokio::sync::mpsc::UnboundedReceiver<Key>,
        tokio::sync::mpsc::UnboundedReceiver<Key>,
    ) {
        let (local, lrx) = tokio::sync::mpsc::unbounded_channel();
        let (shared, srx) = tokio::sync::mpsc::unbounded_channel();
        (Routes { local, shared }, lrx, srx)
    }

    #[test]
    fn events_keep_the_cache_and_route_the_keys() {
        let (s, _tx) = scope(Leads::default());
        let (routes, mut lrx, mut srx) = routes();
        let cache = Cache::default();
        let how = claims_keeping(None);
        let none = Leads::default();
        let key = Key::Claim("ns/c".into());
        let apply = |ev| apply(&cache, &s, &routes, &how, none, None, ev);
        apply(WatchEvent::Restarted(vec![claim(
            "flexvol/hostpath",
            Some("node-b"),
            "Pending",
        )]));
        assert!(cache.is_ready() && cache.is_empty());
        assert!(lrx.try_recv().is_err());
        // Picked for this node: kept, and its lane told.
        apply(WatchEvent::Applied(claim(
            "flexvol/hostpath",
            Some("node-a"),
            "Pending",
        )));
        assert_eq!(cache.len(), 1);
        assert_eq!(lrx.try_recv().unwrap(), key);
        // Sent back to the scheduler (selected-node removed): dropped, lane told once.
        apply(WatchEvent::Applied(claim(
            "flexvol/hostpath",
            None,
            "Pending",
        )));
        assert!(cache.is_empty());
        assert_eq!(lrx.try_recv().unwrap(), key);
        apply(WatchEvent::Deleted(claim(
            "flexvol/hostpath",
            None,
            "Pending",
        )));
        assert!(lrx.try_recv().is_err());
        assert!(srx.try_recv().is_err());
    }

    fn class(name: &str) -> StorageClass {
        StorageClass {
            metadata: ObjectMeta {
                name: Some(name.into()),
                ..Default::default()
            },
            provisioner: "flexvol/hostpath".into(),
            ..Default::default()
        }
    }

    fn of_class(mut c: PersistentVolumeClaim, name: &str, class: &str) -> PersistentVolumeClaim {
        c.metadata.name = Some(name.into());
        c.spec = Some(k8s_openapi::api::core::v1::PersistentVolumeClaimSpec {
            storage_class_name: Some(class.into()),
            ..Default::default()
        });
        c
    }

    #[test]
    fn a_class_that_appears_sends_the_claims_that_wait_for_it() {
        let (s, _tx) = scope(Leads::default());
        let (routes, mut lrx, mut srx) = routes();
        let claims: [Arc<Cache<PersistentVolumeClaim>>; 2] = Default::default();
        let waiting = of_class(
            claim("flexvol/hostpath", Some("node-a"), "Pending"),
            "w",
            "fast",
        );
        let bound = of_class(
            claim("flexvol/hostpath", Some("node-a"), "Bound"),
            "b",
            "fast",
        );
        let other = of_class(
            claim("flexvol/hostpath", Some("node-a"), "Pending"),
            "o",
            "slow",
        );
        let nfs = of_class(claim("flexvol/nfs", None, "Pending"), "n", "fast");
        for c in [waiting, bound, other] {
            claims[0].lock().insert(claim_key(&c.metadata), Arc::new(c));
        }
        claims[1]
            .lock()
            .insert(claim_key(&nfs.metadata), Arc::new(nfs));
        let classes = Cache::default();
        let apply = |ev| apply_class(&classes, &claims, &s, &routes, ev);
        // Before the first list a read is an error, never "not found".
        assert!(classes.class("slow").is_err());
        // The first list: ready, and every class in it is new.
        apply(WatchEvent::Restarted(vec![class("slow")]));
        assert!(classes.is_ready() && classes.class("slow").unwrap().is_some());
        assert!(classes.class("fast").unwrap().is_none());
        assert_eq!(lrx.try_recv().unwrap(), Key::Claim("ns/o".into()));
        assert!(lrx.try_recv().is_err() && srx.try_recv().is_err());
        // A class created: the claims of that name that still wait, each in its lane; the
        // bound one and the other class's are not sent.
        apply(WatchEvent::Applied(class("fast")));
        assert_eq!(lrx.try_recv().unwrap(), Key::Claim("ns/w".into()));
        assert_eq!(srx.try_recv().unwrap(), Key::Claim("ns/n".into()));
        assert!(lrx.try_recv().is_err() && srx.try_recv().is_err());
        // A change of a class held: nothing is sent.
        apply(WatchEvent::Applied(class("fast")));
        assert!(lrx.try_recv().is_err());
        // Deleted: gone from the cache (a read of it is "not found"), nothing sent.
        apply(WatchEvent::Deleted(class("fast")));
        assert!(classes.get("fast").is_none() && classes.get("slow").is_some());
        assert!(lrx.try_recv().is_err() && srx.try_recv().is_err());
        // A new list without "slow" and with "fast" again: only "fast" is news.
        apply(WatchEvent::Restarted(vec![class("fast")]));
        assert!(classes.get("slow").is_none());
        assert_eq!(lrx.try_recv().unwrap(), Key::Claim("ns/w".into()));
        assert_eq!(srx.try_recv().unwrap(), Key::Claim("ns/n".into()));
        assert!(lrx.try_recv().is_err() && srx.try_recv().is_err());
    }
}
