//! The provisioner's workers: one lane for the node-local kinds (hostPath, LVM) and one for the
//! shared kinds (NFS), each on its own thread with its own [`Reconciler`], work queue and
//! backends, so that no work of one waits on the other: a dead NFS server delays NFS claims,
//! never a hostPath or LVM claim, a delete or a resize of this node.
//!
//! A lane ([`run`]) waits for keys from the watch caches ([`crate::provision::cache`]: only objects it works
//! on), queues them ([`WorkQueue`]: each key once, per-key exponential backoff after a failure),
//! and works through the due keys in batches: a [`Reconciler::refresh`] (tombstones, this node's
//! Node), then [`Reconciler::sync`] per key. Every `resync` it queues every key it holds again
//! (except those backing off). Within the shared lane, a server that fails opens its breaker
//! ([`crate::k8s::queue::Breakers`]): the next claims on it fail fast until a single attempt after the
//! breaker's delay shows it back.
//!
//! Each lane beats its own heartbeat ([`telemetry::Health`]) after every object and every pass: a
//! lane stuck in a system call turns the probes red and makes the instance give up its Leases,
//! though the other lane still passes. Nothing ever joins a lane's thread.
//!
//! Concurrency is bounded: two lanes, one object at a time in each. The volume work is
//! synchronous (commands, mounts, each under its deadline) and holds only its own lane's thread.
//!
//! The node-local lane also runs the sweep, at start and every [`SWEEP_EVERY`]: a paged list of
//! every PV (never held whole) that labels our PVs made before the labels existed (so the
//! label-selected watches see them), writes the legacy grants of PVs made before capabilities, and
//! removes grants of PVs that are gone.

use crate::k8s::queue::{Backoff, WorkQueue};
use crate::node::config::Config;
use crate::provision::cache::{Lane, Leads};
use crate::provision::cluster::Cluster;
use crate::provision::cluster::live::KubeCluster;
use crate::provision::reconcile::{
    Identity, Key, Reconciler, Report, legacy_grants, node_label_value, sweep_legacy_grants,
};
use crate::provision::storage::{Kind, Provisioner};
use crate::provision::telemetry::{self, LOG_TARGET};
use crate::vocab::ANN_NODE;
use crate::vocab::ANN_PROVISIONED_BY;
use crate::vocab::{LABEL_KIND, LABEL_NODE};
use k8s_openapi::api::core::v1::PersistentVolume;
use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::mpsc::UnboundedReceiver;
use tokio::sync::watch;
use tracing::{info, warn};

/// How often the node-local lane runs the sweep (also once at start).
pub(crate) const SWEEP_EVERY: Duration = Duration::from_secs(30 * 60);

/// After the first key of a burst, how long to wait for the rest before working (watch events of
/// one claim come in quick succession).
const SETTLE: Duration = Duration::from_millis(50);

/// How often a lane looks again whether the StorageClass cache has listed, until it has.
const CLASSES_POLL: Duration = Duration::from_millis(200);

/// A lane's name in logs and metrics.
pub(crate) fn lane_name(lane: Lane) -> &'static str {
    lane.name()
}

/// What a lane needs.
pub(crate) struct LaneArgs {
    /// Which lane.
    pub(crate) lane: Lane,
    /// The cluster seam (its caches are this instance's; its API client is replaced by the
    /// lane's own, see [`KubeCluster::with_client`]).
    pub(crate) cluster: KubeCluster,
    /// The kubeconfig the lane's own API client is made from (`None`: the pod's service account).
    pub(crate) kubeconfig: Option<std::path::PathBuf>,
    /// Where the service account is read without a kubeconfig (`None`: kube-rs's fixed path;
    /// `/proc/self/fd/N` after `--host-mount-namespace`, see `apiclient::client`).
    pub(crate) service_account_dir: Option<std::path::PathBuf>,
    /// Who we are.
    pub(crate) id: Identity,
    /// Keys of changed objects of this lane.
    pub(crate) keys: UnboundedReceiver<Key>,
    /// Metrics and health.
    pub(crate) shared: Arc<telemetry::Shared>,
    /// Every key again at least this often.
    pub(crate) resync: Duration,
    /// What this instance leads (the shared lane works only while it leads the shared kinds).
    pub(crate) leads: watch::Receiver<Leads>,
    /// Set by the shared lane: whether this instance serves a shared kind (it may then lead them).
    pub(crate) serves_shared: Arc<std::sync::atomic::AtomicBool>,
    /// Whether the node-local lane publishes this node's capacity record for the scheduler
    /// extender (with the capacity metrics: at start, after work, at least every minute).
    pub(crate) publish_capacity: bool,
}

/// Starts a lane on its own thread, with its own single-threaded runtime (the volume work blocks
/// it, and only it).
pub(crate) fn spawn(args: LaneArgs) -> std::io::Result<std::thread::JoinHandle<()>> {
    std::thread::Builder::new()
        .name(format!("lane-{}", lane_name(args.lane)))
        .spawn(move || {
            let rt = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(rt) => rt,
                Err(e) => {
                    // Without its runtime the lane cannot work at all: a bug-level failure, and
                    // the provisioner's panic hook exits so the DaemonSet restarts it.
                    panic!(
                        "cannot start the runtime of lane {}: {e}",
                        lane_name(args.lane)
                    )
                }
            };
            rt.block_on(run(args));
        })
}

/// The backends of `lane` (each lane owns its own: a backend's state and tombstone recovery are
/// never shared between threads).
fn backends(id: &Identity, lane: Lane) -> Vec<Box<dyn Provisioner>> {
    crate::provision::provisioners(id)
        .into_iter()
        .filter(|b| b.kind().node_local == (lane == Lane::Local))
        .collect()
}

/// Every kind there is (the sweep looks at every PV; the watches route by kind).
pub(crate) fn all_kinds(id: &Identity) -> Vec<&'static Kind> {
    crate::provision::provisioners(id)
        .iter()
        .map(|b| b.kind())
        .collect()
}

/// Waits until the node config loads (the installer container writes it).
async fn load_config(shared: &telemetry::Shared, lane: Lane) -> Config {
    loop {
        shared.health.beat_lane(lane, Instant::now());
        match Config::load() {
            Ok(c) => return c,
            Err(e) => warn!(target: LOG_TARGET, "{e}; waiting for a valid config"),
        }
        tokio::time::sleep(Duration::from_secs(5)).await;
    }
}

async fn run(mut a: LaneArgs) {
    let lane = a.lane;
    let name = lane_name(lane);
    let mut config = load_config(&a.shared, lane).await;
    // A client of the lane's own, on this runtime (see KubeCluster::with_client).
    let client = loop {
        match crate::k8s::client::client(a.kubeconfig.as_deref(), a.service_account_dir.as_deref())
            .await
        {
            Ok(c) => break c,
            Err(e) => {
                warn!(target: LOG_TARGET, "lane {name}: {e}; retrying");
                a.shared.health.beat_lane(lane, Instant::now());
                tokio::time::sleep(Duration::from_secs(5)).await;
            }
        }
    };
    a.cluster = a.cluster.with_client(client);
    let mut rec = Reconciler::new(a.cluster.clone(), a.id.clone(), backends(&a.id, lane));
    let kinds = all_kinds(&a.id);
    let mut queue: WorkQueue<Key> = WorkQueue::new(Backoff::DEFAULT);
    let mut resync_at = Instant::now();
    let mut sweep_at = (lane == Lane::Local).then(Instant::now);
    let mut capacity_at: Option<Instant> = None;
    let lvm_driver = a.id.provisioner("lvm");
    loop {
        let now = Instant::now();
        // The shared lane works only while leading; keys that come meanwhile are dropped (the
        // cache holds nothing of the shared kinds then, and a new leader lists everything).
        let leading = lane == Lane::Local || a.leads.borrow().shared;
        while let Ok(k) = a.keys.try_recv() {
            if leading {
                queue.add(k);
            }
        }
        let resync = now >= resync_at;
        if resync && leading {
            for k in a.cluster.caches().keys(lane) {
                queue.add_unless_backing_off(k);
            }
            let claims = a.cluster.claims().await.unwrap_or_default();
            let volumes = a.cluster.volumes().await.unwrap_or_default();
            rec.forget_gone(&claims, &volumes);
        }
        // No key is worked on before the StorageClass cache has listed (a class missing from
        // it would otherwise read as not found): they wait in the queue. The rest of a pass
        // (the Node, recovery, the sweep, capacity, the lane's health) goes on meanwhile.
        let classes_listed = a.cluster.caches().classes.is_ready();
        let keys = if classes_listed {
            queue.take(now)
        } else {
            Vec::new()
        };
        if !keys.is_empty() || resync {
            // Test hook (tests/suite/provisioner_health.rs): FLEXVOL_TEST_HANG_AT=lane-shared-pass
            // blocks this lane here for good, as a system call that never returns would.
            crate::sys::process::checkpoint(match lane {
                Lane::Local => "lane-node-local-pass",
                Lane::Shared => "lane-shared-pass",
            });
            match Config::load() {
                Ok(c) => config = c,
                Err(e) => warn!(target: LOG_TARGET, "{e}; keeping the last valid config"),
            }
            let t0 = Instant::now();
            let mut report = rec.refresh(&config).await;
            if lane == Lane::Shared {
                a.serves_shared
                    .store(rec.serves_shared(), std::sync::atomic::Ordering::Release);
            }
            for k in &keys {
                // A lead lost mid-batch: stop at once (the new leader lists everything); the
                // object worked on when it was lost is finished within its deadlines.
                if lane == Lane::Shared && !a.leads.borrow().shared {
                    break;
                }
                let r = rec.sync(k, &config).await;
                // Progress: a long batch of slow objects is not a stuck lane.
                a.shared.health.beat_lane(lane, Instant::now());
                queue.done(
                    k,
                    r.failed.is_empty() && r.deferred.is_empty(),
                    Instant::now(),
                );
                report.merge(r);
            }
            if sweep_at.is_some_and(|t| Instant::now() >= t) {
                sweep(&rec, &kinds, &config, &mut report).await;
                sweep_at = Some(Instant::now() + SWEEP_EVERY);
            }
            report.seen = (
                a.cluster.caches().claims.len() + a.cluster.caches().shared_claims.len(),
                a.cluster.caches().local_volumes.len() + a.cluster.caches().shared_volumes.len(),
            );
            log_report(&report);
            let m = &a.shared.metrics;
            m.record(&report, t0.elapsed());
            m.set_queue(name, queue.depth(), queue.retries(), rec.breakers_open());
            if lane == Lane::Local
                && (!report.ops.is_empty()
                    || capacity_at.is_none_or(|t| t.elapsed() >= Duration::from_secs(60)))
            {
                // Measured once for both the metrics and the published record.
                let detail = if a.publish_capacity {
                    crate::provision::capacity::Detail::Record
                } else {
                    crate::provision::capacity::Detail::Metrics
                };
                let measured =
                    crate::provision::capacity::measure(&config, &a.id.node, &lvm_driver, detail);
                m.set_capacity(&measured.pools());
                for f in &measured.failed {
                    warn!(target: LOG_TARGET, "{f}");
                }
                if a.publish_capacity {
                    let failed = crate::provision::capacity::publish(
                        &rec.cluster,
                        &config,
                        &a.id.node,
                        &measured,
                        std::time::SystemTime::now(),
                    )
                    .await;
                    for f in failed {
                        warn!(target: LOG_TARGET, "{f}");
                    }
                }
                capacity_at = Some(Instant::now());
            }
            a.shared.health.passed(lane, Instant::now());
        }
        if resync {
            resync_at = Instant::now() + a.resync;
        }
        // Wait for a key, the next retry or the next resync, whichever comes first.
        let mut wake = queue.next_retry().map_or(resync_at, |t| t.min(resync_at));
        if !classes_listed {
            wake = wake.min(Instant::now() + CLASSES_POLL);
        }
        let wait = wake.saturating_duration_since(Instant::now());
        match tokio::time::timeout(wait, a.keys.recv()).await {
            Ok(Some(k)) => {
                if lane == Lane::Local || a.leads.borrow().shared {
                    queue.add(k);
                }
                tokio::time::sleep(SETTLE).await;
            }
            Ok(None) => return, // the process is ending
            Err(_) => {}
        }
    }
}

/// Logs what a batch did, one levelled event per action.
fn log_report(r: &Report) {
    for (pv, at) in &r.provisioned {
        info!(target: LOG_TARGET, pv = %pv, "provisioned {pv} at {at}");
    }
    for (pv, done) in &r.deleted {
        info!(target: LOG_TARGET, pv = %pv, "deleted {pv}: {done}");
    }
    for (pv, bytes) in &r.resized {
        info!(target: LOG_TARGET, pv = %pv, bytes, "grew {pv} to {bytes} bytes");
    }
    for pv in &r.protected {
        info!(target: LOG_TARGET, pv = %pv, "gave {pv} (made before the PV finalizer) the finalizer");
    }
    for pv in &r.released {
        info!(target: LOG_TARGET, pv = %pv, "released {pv}: deleted with a reclaim policy other than Delete, its volume kept");
    }
    for pv in &r.labelled {
        info!(target: LOG_TARGET, pv = %pv, "labelled {pv} (made before the labels) so this instance's watch sees it");
    }
    for c in &r.rescheduled {
        info!(target: LOG_TARGET, claim = %c, "sent claim {c} back to the scheduler");
    }
    for c in &r.refused {
        info!(target: LOG_TARGET, claim = %c, "removed selected-node from claim {c}, which can never be provisioned as written");
    }
    for (pv, what) in &r.quota_drift {
        warn!(target: LOG_TARGET, pv = %pv, "quota drift on {pv}: {what}");
    }
    for a in &r.advice {
        warn!(target: LOG_TARGET, "{a}");
    }
    for f in &r.failed {
        warn!(target: LOG_TARGET, "{f}");
    }
    for d in &r.deferred {
        info!(target: LOG_TARGET, "{d}");
    }
}

/// The labels `v` lacks, if it is a PV of ours this node labels: every PV of a kind of ours gets
/// [`LABEL_KIND`]; a node-local one, of this node only, also [`LABEL_NODE`].
pub(crate) fn missing_labels(
    v: &PersistentVolume,
    id: &Identity,
    kinds: &[&'static Kind],
) -> Option<BTreeMap<String, String>> {
    let ann = |k: &str| v.metadata.annotations.as_ref().and_then(|a| a.get(k));
    let by = ann(ANN_PROVISIONED_BY)?;
    let kind = kinds.iter().find(|k| &id.provisioner(k.name) == by)?;
    let mut want = BTreeMap::from([(LABEL_KIND.to_owned(), kind.name.to_owned())]);
    if kind.node_local {
        if ann(ANN_NODE) != Some(&id.node) {
            return None;
        }
        want.insert(LABEL_NODE.to_owned(), node_label_value(&id.node));
    }
    let have = v.metadata.labels.clone().unwrap_or_default();
    want.retain(|k, val| have.get(k) != Some(val));
    (!want.is_empty()).then_some(want)
}

/// The sweep: every PV, a page at a time, labelled where it lacks our labels, legacy grants
/// written; then grants of PVs that are gone removed (only after a complete list).
pub(crate) async fn sweep<C: Cluster>(
    rec: &Reconciler<C>,
    kinds: &[&'static Kind],
    cfg: &Config,
    report: &mut Report,
) {
    let mut names = HashSet::new();
    let mut token = None;
    loop {
        let (page, next) = match rec.cluster.volume_page(token).await {
            Ok(p) => p,
            Err(e) => {
                report
                    .failed
                    .push(format!("sweep of PVs: {e}; retrying later"));
                return;
            }
        };
        for v in &page {
            let Some(name) = v.metadata.name.clone() else {
                continue;
            };
            if let Some(labels) = missing_labels(v, &rec.id, kinds) {
                match rec.cluster.label_volume(&name, &labels).await {
                    Ok(()) => report.labelled.push(name.clone()),
                    Err(e) => report
                        .failed
                        .push(format!("PV {name}: {e}; retrying later")),
                }
            }
            names.insert(name);
        }
        legacy_grants(&page, &rec.id, kinds, cfg, report);
        rec.adopt_old_volumes(&page, cfg, report);
        token = next;
        if token.is_none() {
            break;
        }
    }
    report
        .failed
        .extend(sweep_legacy_grants(&cfg.state_dir, &names));
}
