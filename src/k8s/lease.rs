//! Exactly one instance at a time for shared work: leader election over a
//! `coordination.k8s.io/v1` Lease, the way client-go's `leaderelection` does it.
//!
//! Every instance runs an elector per Lease ([`spawn`]). While it is eligible, it reads the Lease
//! every [`RETRY_PERIOD`] and
//! - creates it, naming itself, when there is none;
//! - renews it (`renewTime`) when it names this instance;
//! - takes it over when it names nobody (released), or when it names another instance and this
//!   process has seen the record unchanged for the record's `leaseDurationSeconds`
//!   ([`LEASE_DURATION`]) — **as observed locally**: the time this process first saw the record
//!   as it is, on its own monotonic clock. The holder's `renewTime` (another machine's wall clock)
//!   is written for people and never compared with this machine's clock, so clock skew between
//!   nodes cannot hand the Lease over early or hold it forever;
//! - otherwise waits.
//!
//! Every write is a PUT of the object as read, resourceVersion included: of two instances racing
//! for it, one gets a 409 and is not the leader. The object is read and written untyped
//! ([`DynamicObject`]: everything but `metadata` kept as the server's JSON) and only the five
//! fields of client-go's record are set in its `spec` ([`with_spec`]), so a field of a newer
//! Kubernetes than this build's model (`preferredHolder`, `strategy`, or any later one) is
//! written back as it was, never erased. A leader that has not renewed successfully within
//! [`RENEW_DEADLINE`] (counted from when it *sent* its last successful write) stops reporting
//! itself leader, which is [`LEASE_DURATION`] − [`RENEW_DEADLINE`] = 5 s before any other instance
//! can take the Lease (counted from when that one *received* the holder's last write). When the
//! instance stops being eligible while it holds the Lease, it reports `false` first and then
//! releases it (holderIdentity emptied), so another takes over at its next read.
//!
//! The decisions are pure functions ([`observe`], [`decide`], [`spec_for`], [`leading`]); the
//! task ([`spawn`]) only does the API calls, each under a deadline, and reports through a
//! [`Leader`] handle.
//!
//! Cost: the holder one GET and one PUT per [`RETRY_PERIOD`]; a candidate one GET per lease
//! duration while another holds it (it reads again only when that record could have expired); the Lease is a
//! few hundred bytes.
//!
//! An instance with a stuck lane is unfit (`crate::provision::leadership::Leadership::set_fit`): its electors take part in
//! nothing and release what they hold, as when they are no longer eligible.
//!
//! RBAC (drivers/deploy/rbac.yaml): `get` and `update` on the Leases `flexvol-claims` and
//! `flexvol-nfs` only, and `create` of Leases, in the Leases' namespace (kube-system).

use super::LOG_TARGET;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::{Api, ApiResource, DynamicObject, PostParams};
use prometheus_client::metrics::gauge::Gauge;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};
use tokio::sync::watch;
use tracing::{debug, info, warn};

/// How long a holder's record stays valid for the others after they saw it change (written as
/// `leaseDurationSeconds`; client-go's default).
pub(crate) const LEASE_DURATION: Duration = Duration::from_secs(15);
/// A leader that has not renewed successfully for this long stops reporting itself leader
/// (client-go's default). Less than [`LEASE_DURATION`]: the difference is the margin in which no
/// instance leads at all.
pub(crate) const RENEW_DEADLINE: Duration = Duration::from_secs(10);
/// How often the holder renews the Lease (and a candidate without another holder reads it). A
/// candidate that sees another holder reads again only when that record could have expired, so
/// a takeover after the holder died comes at most two [`LEASE_DURATION`]s (30 s) after the
/// holder's last renewal, plus the API calls; 15 to 17 s when the candidate's last read came
/// just after that renewal.
pub(crate) const RETRY_PERIOD: Duration = Duration::from_secs(2);

/// An elector's periods: [`TIMING`], or shorter ones in tests. `renew_deadline` must be less than
/// `lease_duration` (whole seconds: it is written in the record).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Timing {
    /// Written as `leaseDurationSeconds`.
    pub(crate) lease_duration: Duration,
    /// A leader stops this long after it sent its last successful write; also each call's deadline.
    pub(crate) renew_deadline: Duration,
    /// Between two rounds.
    pub(crate) retry_period: Duration,
}

/// The periods every elector of the provisioner uses (client-go's defaults).
pub(crate) const TIMING: Timing = Timing {
    lease_duration: LEASE_DURATION,
    renew_deadline: RENEW_DEADLINE,
    retry_period: RETRY_PERIOD,
};

/// The Lease's record as this process last read it, and since when (this process's monotonic
/// clock) it has read it unchanged.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Observed {
    /// The record (`spec`) as read.
    pub(crate) spec: LeaseSpec,
    /// The object's resourceVersion as read: every write changes it, even one that leaves the
    /// record as it was (a holder whose wall clock stands still).
    pub(crate) version: Option<String>,
    /// When this process first read the object as it is.
    pub(crate) since: Instant,
}

/// What `spec` at `version`, read at `now`, makes of what was observed before (`prev`): the same
/// time as before when neither changed (client-go compares the whole record; the resourceVersion
/// catches a write of an identical one), `now` when either did.
pub(crate) fn observe(
    prev: Option<Observed>,
    spec: &LeaseSpec,
    version: Option<&str>,
    now: Instant,
) -> Observed {
    match prev {
        Some(p) if p.spec == *spec && p.version.as_deref() == version => p,
        _ => Observed {
            spec: spec.clone(),
            version: version.map(str::to_owned),
            since: now,
        },
    }
}

/// The step an elector takes on the Lease it just read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Step {
    /// There is no Lease: create it, naming this instance.
    Create,
    /// The Lease names this instance: renew it.
    Renew,
    /// The Lease names nobody, or another instance that has not renewed it for its duration as
    /// observed here: take it over.
    TakeOver,
    /// Another instance holds it (or this one is not eligible and does not hold it): nothing.
    Wait,
    /// The Lease names this instance, which is no longer eligible: release it.
    Release,
}

/// The holder a record names (`None`: nobody, as after a release).
pub(crate) fn holder(spec: &LeaseSpec) -> Option<&str> {
    spec.holder_identity.as_deref().filter(|h| !h.is_empty())
}

/// The longest a record is honoured unchanged, whatever its `leaseDurationSeconds` says: a
/// record written with the token's `update` right and a duration of years must not stop the
/// shared work for longer (every flexvol holder writes [`LEASE_DURATION`]).
pub(crate) const MAX_LEASE_DURATION: Duration = Duration::from_secs(300);

/// How long the record stays valid after it was observed: its own `leaseDurationSeconds` (at
/// most [`MAX_LEASE_DURATION`]), or [`LEASE_DURATION`] when it gives none.
pub(crate) fn duration_of(spec: &LeaseSpec) -> Duration {
    spec.lease_duration_seconds
        .and_then(|s| u64::try_from(s).ok())
        .filter(|s| *s > 0)
        .map_or(LEASE_DURATION, Duration::from_secs)
        .min(MAX_LEASE_DURATION)
}

/// The decision: the Lease as read (`None`: there is none) with when it was first seen so,
/// `now`, this instance's identity `me` and whether it may lead. Never looks at the record's
/// times: only at who holds it and how long this process has seen it unchanged.
pub(crate) fn decide(read: Option<&Observed>, now: Instant, me: &str, eligible: bool) -> Step {
    let Some(o) = read else {
        return if eligible { Step::Create } else { Step::Wait };
    };
    match holder(&o.spec) {
        Some(h) if h == me => {
            if eligible {
                Step::Renew
            } else {
                Step::Release
            }
        }
        _ if !eligible => Step::Wait,
        None => Step::TakeOver,
        Some(_) => {
            let expired = o
                .since
                .checked_add(duration_of(&o.spec))
                .is_none_or(|end| end <= now);
            if expired { Step::TakeOver } else { Step::Wait }
        }
    }
}

/// The record to write for `step` over the one read (`read`), with `lease_duration` (whole
/// seconds), at wall-clock time `wall` (only written, for people: never compared). `None` for
/// [`Step::Wait`].
pub(crate) fn spec_for(
    step: Step,
    read: Option<&LeaseSpec>,
    me: &str,
    lease_duration: Duration,
    wall: MicroTime,
) -> Option<LeaseSpec> {
    let transitions = read.and_then(|s| s.lease_transitions).unwrap_or(0);
    let seconds = i32::try_from(lease_duration.as_secs().max(1)).unwrap_or(i32::MAX);
    match step {
        Step::Wait => None,
        Step::Create => Some(LeaseSpec {
            holder_identity: Some(me.to_owned()),
            lease_duration_seconds: Some(seconds),
            acquire_time: Some(wall.clone()),
            renew_time: Some(wall),
            lease_transitions: Some(0),
            ..LeaseSpec::default()
        }),
        Step::Renew => Some(LeaseSpec {
            holder_identity: Some(me.to_owned()),
            lease_duration_seconds: Some(seconds),
            acquire_time: read
                .and_then(|s| s.acquire_time.clone())
                .or_else(|| Some(wall.clone())),
            renew_time: Some(wall),
            lease_transitions: Some(transitions),
            ..LeaseSpec::default()
        }),
        Step::TakeOver => Some(LeaseSpec {
            holder_identity: Some(me.to_owned()),
            lease_duration_seconds: Some(seconds),
            acquire_time: Some(wall.clone()),
            renew_time: Some(wall),
            lease_transitions: Some(transitions.saturating_add(1)),
            ..LeaseSpec::default()
        }),
        // As client-go releases: nobody holds it, for a second.
        Step::Release => Some(LeaseSpec {
            holder_identity: Some(String::new()),
            lease_duration_seconds: Some(1),
            acquire_time: Some(wall.clone()),
            renew_time: Some(wall),
            lease_transitions: Some(transitions),
            ..LeaseSpec::default()
        }),
    }
}

/// Whether an instance whose last successful write as the holder was sent at `renewed` leads at
/// `now`: only within `renew_deadline` ([`RENEW_DEADLINE`]) of it.
pub(crate) fn leading(renewed: Option<Instant>, renew_deadline: Duration, now: Instant) -> bool {
    renewed
        .and_then(|t| t.checked_add(renew_deadline))
        .is_some_and(|end| now < end)
}

/// Whether this process leads for one Lease, as its elector last knew it.
#[derive(Debug, Clone)]
pub(crate) struct Leader {
    rx: watch::Receiver<bool>,
    /// Until when the last successful write as the holder lets it lead (`None`: not holding).
    until: Arc<Mutex<Option<Instant>>>,
    /// Whether the record as last read or written names this instance (it may hold the Lease
    /// without leading: past its renew deadline, or after a stop before the release is written).
    holds: Arc<AtomicBool>,
}

impl Leader {
    /// Whether this process leads right now: checked against the clock, so it turns `false` at
    /// the renew deadline even when the elector's task could not run (a runtime stalled by
    /// blocking work). Ask it before each piece of shared work.
    pub(crate) fn is_leading(&self) -> bool {
        let until = *self.until.lock().unwrap_or_else(PoisonError::into_inner);
        until.is_some_and(|u| Instant::now() < u) && *self.rx.borrow()
    }

    /// Whether the Lease, as this elector last read or wrote it, names this instance.
    pub(crate) fn holds(&self) -> bool {
        self.holds.load(Ordering::Acquire)
    }
}

/// When an elector takes part: while `eligible` and `fit`, and until `stopping` turns true (the
/// process stops: from then on it releases what it holds and takes nothing). `fit` is false while
/// a lane of this instance is stuck (`crate::provision::leadership::Leadership::set_fit`): it releases what it holds and
/// takes nothing until the lane moves again.
pub(crate) struct Part {
    /// Whether this process may lead this Lease now.
    pub(crate) eligible: Arc<AtomicBool>,
    /// Cleared while this process is unfit to lead (a stuck worker).
    pub(crate) fit: Arc<AtomicBool>,
    /// Turns true when the process stops.
    pub(crate) stopping: watch::Receiver<bool>,
}

/// [`spawn`], also setting `gauge` to 1 while leading and 0 otherwise.
pub(crate) fn start(
    client: kube::Client,
    namespace: String,
    name: String,
    holder: String,
    part: Part,
    timing: Timing,
    gauge: Option<Gauge>,
) -> Leader {
    let (tx, rx) = watch::channel(false);
    let until = Arc::new(Mutex::new(None));
    let holds = Arc::new(AtomicBool::new(false));
    let e = Elector {
        api: Api::namespaced_with(client, &namespace, &ApiResource::erase::<Lease>(&())),
        what: format!("Lease {namespace}/{name}"),
        name,
        me: holder,
        seen: None,
        renewed: None,
        shared: until.clone(),
        timing,
        tx,
        gauge,
        failing: None,
        shown_holder: None,
        holds: holds.clone(),
    };
    if let Some(g) = &e.gauge {
        g.set(0);
    }
    tokio::spawn(e.run(part));
    Leader { rx, until, holds }
}

/// Why a call failed.
#[derive(Debug)]
enum Failed {
    /// 409: the object changed since it was read (or was created meanwhile).
    Conflict,
    /// Anything else, with the message to log.
    Other(String),
}

async fn call<T>(
    what: String,
    limit: Instant,
    deadline: Duration,
    fut: impl Future<Output = Result<T, kube::Error>>,
) -> Result<T, Failed> {
    let wait = limit.saturating_duration_since(Instant::now());
    match tokio::time::timeout(wait, fut).await {
        Err(_) => Err(Failed::Other(format!(
            "{what}: no answer from the API server in time (at most {}s, and a leader's calls \
             end at its renew deadline)",
            deadline.as_secs_f64()
        ))),
        Ok(Ok(v)) => Ok(v),
        Ok(Err(kube::Error::Api(e))) if e.code == 409 => Err(Failed::Conflict),
        Ok(Err(kube::Error::Api(e))) => {
            let hint = if e.code == 403 {
                " (a missing RBAC rule: drivers/deploy/rbac.yaml grants these Leases in \
                 kube-system only: apply it, and run with --lease-namespace kube-system where the \
                 client's namespace is another; until an instance holds flexvol-claims, no claim \
                 is labelled for its node and no node-local claim is provisioned)"
            } else {
                ""
            };
            Err(Failed::Other(format!("{what}: {}{hint}", e.message)))
        }
        Ok(Err(e)) => Err(Failed::Other(format!("{what}: {e}"))),
    }
}

/// Why a Lease cannot be converted between the typed model and the object written: the Lease
/// as read is not one (another writer), or this build cannot encode its own.
#[derive(Debug, thiserror::Error)]
pub(crate) enum LeaseShape {
    /// The object read does not fit the Lease model.
    #[error("not a Lease: {0}")]
    NotALease(serde_json::Error),
    /// A Lease (or its spec) built here cannot be encoded.
    #[error("cannot encode the Lease: {0}")]
    Encode(serde_json::Error),
    /// The spec built here did not encode to an object.
    #[error("cannot encode the Lease: its spec is not an object")]
    SpecEncodedNotObject,
    /// The Lease as read is not a JSON object.
    #[error("the Lease as read is not an object")]
    ReadNotObject,
    /// The Lease as read has a `spec` that is not an object.
    #[error("the Lease as read has a spec that is not an object")]
    ReadSpecNotObject,
}

/// A Lease as the typed model reads it (for the decisions only: never written back).
fn typed(o: &DynamicObject) -> Result<Lease, LeaseShape> {
    serde_json::to_value(o)
        .and_then(serde_json::from_value)
        .map_err(LeaseShape::NotALease)
}

/// A Lease built here (a new one), untyped for [`Api::create`].
fn untyped(l: &Lease) -> Result<DynamicObject, LeaseShape> {
    serde_json::to_value(l)
        .and_then(serde_json::from_value)
        .map_err(LeaseShape::Encode)
}

/// The Lease `raw` as read, with the fields `spec` sets (client-go's record: holder, duration,
/// acquire and renew times, transitions) written into its `spec`; every other field of it, known
/// to this build's model or not, stays as read.
fn with_spec(mut raw: DynamicObject, spec: &LeaseSpec) -> Result<DynamicObject, LeaseShape> {
    let serde_json::Value::Object(set) = serde_json::to_value(spec).map_err(LeaseShape::Encode)?
    else {
        return Err(LeaseShape::SpecEncodedNotObject);
    };
    let Some(top) = raw.data.as_object_mut() else {
        return Err(LeaseShape::ReadNotObject);
    };
    let spec_v = top
        .entry("spec")
        .or_insert_with(|| serde_json::Value::Object(serde_json::Map::new()));
    if spec_v.is_null() {
        *spec_v = serde_json::Value::Object(serde_json::Map::new());
    }
    let Some(into) = spec_v.as_object_mut() else {
        return Err(LeaseShape::ReadSpecNotObject);
    };
    into.extend(set);
    Ok(raw)
}

struct Elector {
    /// Leases, untyped: see the module docs.
    api: Api<DynamicObject>,
    /// `Lease <namespace>/<name>`, for the logs.
    what: String,
    name: String,
    me: String,
    seen: Option<Observed>,
    /// When the last successful write as the holder was sent (`None`: not holding).
    renewed: Option<Instant>,
    /// Until when that lets it lead, for the [`Leader`] handles.
    shared: Arc<Mutex<Option<Instant>>>,
    timing: Timing,
    tx: watch::Sender<bool>,
    /// `flexvol_provisioner_leader{lease=...}`, when metrics are kept.
    gauge: Option<Gauge>,
    /// The last failure logged (each different one is logged once).
    failing: Option<String>,
    /// The holder last logged.
    shown_holder: Option<String>,
    /// Whether the record names this instance, for [`Leader::holds`].
    holds: Arc<AtomicBool>,
}

impl Elector {
    async fn run(mut self, part: Part) {
        let Part {
            eligible,
            fit,
            mut stopping,
        } = part;
        loop {
            // No handle left: nobody acts on the answer; let go of the Lease and stop. The
            // process stopping: the same, at once.
            let closed = self.tx.is_closed();
            let stop = *stopping.borrow_and_update();
            if stop {
                self.drop_lead("this instance is stopping");
            }
            let may =
                eligible.load(Ordering::Relaxed) && fit.load(Ordering::Relaxed) && !closed && !stop;
            self.tick(may).await;
            self.holds.store(self.holds_record(), Ordering::Release);
            self.report("not renewed within the renew deadline");
            if closed && self.renewed.is_none() && !self.holds_record() {
                debug!(target: LOG_TARGET, "elector of {} stopped", self.what);
                return;
            }
            let sleep = std::pin::pin!(tokio::time::sleep(self.pause(Instant::now())));
            let stopped = std::pin::pin!(stopping.changed());
            // A stop wakes it at once (an error: the sender is gone, nothing will wake it but
            // the time).
            if let futures::future::Either::Right((Err(_), sleep)) =
                futures::future::select(sleep, stopped).await
            {
                sleep.await;
            }
            self.report("not renewed within the renew deadline");
        }
    }

    /// How long to wait before the next round: [`RETRY_PERIOD`], less to report the end of the
    /// lead at its renew deadline, or to try a takeover right when another holder's record
    /// expires as observed here (so a takeover comes at most `RETRY_PERIOD` after the expiry
    /// would have been seen, not two).
    fn pause(&self, now: Instant) -> Duration {
        let mut pause = self.timing.retry_period;
        if let Some(end) = self.until() {
            pause = pause.min(end.saturating_duration_since(now));
        }
        let expiry = self.seen.as_ref().and_then(|o| {
            holder(&o.spec)
                .is_some_and(|h| h != self.me)
                .then(|| o.since.checked_add(duration_of(&o.spec)))
                .flatten()
        });
        if let Some(end) = expiry.filter(|e| *e > now) {
            // Another holder's record: nothing can change for this candidate before it could
            // expire, so it reads again only then (one GET per lease duration per candidate, not
            // one per retry period: with an instance on every node, the reads add up). A renewal
            // seen then restarts the wait, so a takeover comes at most two lease durations after
            // the holder's last renewal.
            return end - now + Duration::from_millis(10);
        }
        pause
    }

    fn holds_record(&self) -> bool {
        self.seen
            .as_ref()
            .and_then(|o| holder(&o.spec))
            .is_some_and(|h| h == self.me)
    }

    /// Until when this instance leads (`None`: it does not).
    fn until(&self) -> Option<Instant> {
        self.renewed
            .and_then(|t| t.checked_add(self.timing.renew_deadline))
    }

    /// The end of the next call: [`CALL_DEADLINE`] from now, and no later than a leader's renew
    /// deadline.
    fn limit(&self, now: Instant) -> Instant {
        let end = now.checked_add(self.timing.renew_deadline).unwrap_or(now);
        match self.until() {
            Some(d) => end.min(d),
            None => end,
        }
    }

    /// Publishes whether this instance leads now; `why` says why it stops, when it does.
    fn report(&mut self, why: &str) {
        if !leading(self.renewed, self.timing.renew_deadline, Instant::now()) {
            self.renewed = None;
        }
        *self.shared.lock().unwrap_or_else(PoisonError::into_inner) = self.until();
        let now = self.renewed.is_some();
        if now != *self.tx.borrow() {
            self.tx.send_replace(now);
            if let Some(g) = &self.gauge {
                g.set(i64::from(now));
            }
            if now {
                info!(target: LOG_TARGET, lease = %self.name, "leading {} ({} as {})", self.name, self.what, self.me);
            } else {
                warn!(target: LOG_TARGET, lease = %self.name, "lost {} ({}): {why}", self.name, self.what);
            }
        }
    }

    /// Stops leading at once, for `why`.
    fn drop_lead(&mut self, why: &str) {
        if self.renewed.take().is_some() {
            self.report(why);
        }
    }

    fn failed(&mut self, msg: String) {
        if self.failing.as_deref() != Some(msg.as_str()) {
            warn!(target: LOG_TARGET, lease = %self.name, "{msg}; retrying every {:?}", self.timing.retry_period);
            self.failing = Some(msg);
        }
    }

    fn show_holder(&mut self) {
        let h = self
            .seen
            .as_ref()
            .and_then(|o| holder(&o.spec))
            .map(str::to_owned);
        if h != self.shown_holder {
            match &h {
                Some(h) if *h != self.me => {
                    info!(target: LOG_TARGET, lease = %self.name, holder = %h, "{} is held by {h}", self.what)
                }
                Some(_) => {}
                None => {
                    info!(target: LOG_TARGET, lease = %self.name, "{} is held by nobody", self.what)
                }
            }
            self.shown_holder = h;
        }
    }

    /// One round: read, decide, write.
    async fn tick(&mut self, eligible: bool) {
        let limit = self.limit(Instant::now());
        let read = match call(
            format!("get {}", self.what),
            limit,
            self.timing.renew_deadline,
            self.api.get_opt(&self.name),
        )
        .await
        {
            Ok(r) => r,
            Err(Failed::Conflict) => return,
            Err(Failed::Other(m)) => return self.failed(m),
        };
        let read = match read.map(|o| typed(&o).map(|l| (o, l))).transpose() {
            Ok(r) => r,
            Err(m) => return self.failed(format!("get {}: {m}", self.what)),
        };
        self.failing = None;
        let now = Instant::now();
        self.seen = read.as_ref().map(|(_, l)| {
            observe(
                self.seen.take(),
                &l.spec.clone().unwrap_or_default(),
                l.metadata.resource_version.as_deref(),
                now,
            )
        });
        self.show_holder();
        match self.seen.as_ref().map(|o| holder(&o.spec)) {
            None => self.drop_lead("the Lease is gone"),
            Some(h) if h != Some(self.me.as_str()) => {
                let why = format!("the Lease names {}", h.unwrap_or("nobody"));
                self.drop_lead(&why);
            }
            Some(_) => {}
        }
        let step = decide(self.seen.as_ref(), now, &self.me, eligible);
        let wall = MicroTime(k8s_openapi::jiff::Timestamp::now());
        let Some(spec) = spec_for(
            step,
            self.seen.as_ref().map(|o| &o.spec),
            &self.me,
            self.timing.lease_duration,
            wall,
        ) else {
            return;
        };
        if step == Step::Release {
            // Stop working before anyone else can start.
            self.drop_lead("released: this instance is no longer eligible (or a lane is stuck)");
        }
        let sent = Instant::now();
        let limit = self.limit(sent);
        let written = match read {
            None => {
                let lease = Lease {
                    metadata: ObjectMeta {
                        name: Some(self.name.clone()),
                        ..Default::default()
                    },
                    spec: Some(spec),
                };
                match untyped(&lease) {
                    Ok(lease) => {
                        call(
                            format!("create {}", self.what),
                            limit,
                            self.timing.renew_deadline,
                            self.api.create(&PostParams::default(), &lease),
                        )
                        .await
                    }
                    Err(m) => Err(Failed::Other(format!("create {}: {m}", self.what))),
                }
            }
            Some((raw, _)) => match with_spec(raw, &spec) {
                // The object as read: its resourceVersion makes the write conditional.
                Ok(lease) => {
                    call(
                        format!("update {}", self.what),
                        limit,
                        self.timing.renew_deadline,
                        self.api.replace(&self.name, &PostParams::default(), &lease),
                    )
                    .await
                }
                Err(m) => Err(Failed::Other(format!("update {}: {m}", self.what))),
            },
        };
        let written = written.and_then(|o| {
            typed(&o).map_err(|m| Failed::Other(format!("write {}: {m}", self.what)))
        });
        match written {
            Ok(l) => {
                self.failing = None;
                if step != Step::Release {
                    self.renewed = Some(sent);
                }
                self.seen = Some(observe(
                    self.seen.take(),
                    &l.spec.clone().unwrap_or_default(),
                    l.metadata.resource_version.as_deref(),
                    Instant::now(),
                ));
                if step == Step::TakeOver {
                    info!(target: LOG_TARGET, lease = %self.name, "took {} over", self.what);
                }
                self.show_holder();
            }
            Err(Failed::Conflict) => {
                debug!(target: LOG_TARGET, lease = %self.name, "{:?} of {}: changed since read (409)", step, self.what);
                self.drop_lead("another instance wrote the Lease first (409)");
            }
            Err(Failed::Other(m)) => self.failed(m),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(year: i32) -> MicroTime {
        MicroTime(format!("{year}-01-01T00:00:00Z").parse().unwrap())
    }

    fn held_by(h: &str, renew: MicroTime) -> LeaseSpec {
        LeaseSpec {
            holder_identity: Some(h.into()),
            lease_duration_seconds: Some(15),
            acquire_time: Some(renew.clone()),
            renew_time: Some(renew),
            lease_transitions: Some(3),
            ..LeaseSpec::default()
        }
    }

    fn s(n: u64) -> Duration {
        Duration::from_secs(n)
    }

    /// A first sighting of `spec` at resourceVersion "1".
    fn seen(spec: &LeaseSpec, t: Instant) -> Observed {
        observe(None, spec, Some("1"), t)
    }

    #[test]
    fn no_lease_is_created_only_when_eligible() {
        let t = Instant::now();
        assert_eq!(decide(None, t, "node-a", true), Step::Create);
        assert_eq!(decide(None, t, "node-a", false), Step::Wait);
        let spec = spec_for(Step::Create, None, "node-a", LEASE_DURATION, at(2026)).unwrap();
        assert_eq!(spec.holder_identity.as_deref(), Some("node-a"));
        assert_eq!(spec.lease_duration_seconds, Some(15));
        assert_eq!(spec.lease_transitions, Some(0));
        assert_eq!(spec.renew_time, Some(at(2026)));
    }

    #[test]
    fn ours_is_renewed_keeping_acquire_time_and_transitions() {
        let t = Instant::now();
        let read = held_by("node-a", at(2020));
        let o = seen(&read, t);
        assert_eq!(decide(Some(&o), t, "node-a", true), Step::Renew);
        // Long unchanged (this process restarted, its last renewal long ago): still ours.
        assert_eq!(decide(Some(&o), t + s(3600), "node-a", true), Step::Renew);
        let spec = spec_for(Step::Renew, Some(&read), "node-a", LEASE_DURATION, at(2026)).unwrap();
        assert_eq!(spec.acquire_time, Some(at(2020)));
        assert_eq!(spec.renew_time, Some(at(2026)));
        assert_eq!(spec.lease_transitions, Some(3));
        assert_eq!(spec.holder_identity.as_deref(), Some("node-a"));
    }

    #[test]
    fn another_holder_seen_changing_is_waited_for() {
        let t0 = Instant::now();
        let mut o = seen(&held_by("node-b", at(2026)), t0);
        assert_eq!(decide(Some(&o), t0 + s(14), "node-a", true), Step::Wait);
        // node-b renewed, seen at t0 + 10: still fresh at t0 + 24.
        o = observe(Some(o), &held_by("node-b", at(2027)), Some("2"), t0 + s(10));
        assert_eq!(o.since, t0 + s(10));
        assert_eq!(decide(Some(&o), t0 + s(20), "node-a", true), Step::Wait);
        assert_eq!(decide(Some(&o), t0 + s(24), "node-a", true), Step::Wait);
        assert_eq!(decide(Some(&o), t0 + s(25), "node-a", true), Step::TakeOver);
        // A renewal that wrote the very same record (its wall clock stood still) is a change too:
        // the resourceVersion moved.
        let same = o.spec.clone();
        o = observe(Some(o), &same, Some("3"), t0 + s(20));
        assert_eq!(o.since, t0 + s(20));
        assert_eq!(decide(Some(&o), t0 + s(34), "node-a", true), Step::Wait);
        // Not eligible: never taken, whatever its age.
        assert_eq!(decide(Some(&o), t0 + s(999), "node-a", false), Step::Wait);
    }

    #[test]
    fn another_holder_unchanged_for_its_duration_is_taken_over() {
        let t0 = Instant::now();
        let read = held_by("node-b", at(2026));
        let mut o = seen(&read, t0);
        // Read again, unchanged: the first sighting counts.
        o = observe(Some(o), &read.clone(), Some("1"), t0 + s(8));
        assert_eq!(o.since, t0);
        assert_eq!(decide(Some(&o), t0 + s(14), "node-a", true), Step::Wait);
        assert_eq!(decide(Some(&o), t0 + s(15), "node-a", true), Step::TakeOver);
        let spec = spec_for(
            Step::TakeOver,
            Some(&read),
            "node-a",
            LEASE_DURATION,
            at(2026),
        )
        .unwrap();
        assert_eq!(spec.holder_identity.as_deref(), Some("node-a"));
        assert_eq!(spec.acquire_time, Some(at(2026)));
        assert_eq!(spec.lease_transitions, Some(4));
        // The record's own duration counts (a holder configured with 40 s).
        let long = LeaseSpec {
            lease_duration_seconds: Some(40),
            ..read
        };
        let o = seen(&long, t0);
        assert_eq!(decide(Some(&o), t0 + s(39), "node-a", true), Step::Wait);
        assert_eq!(decide(Some(&o), t0 + s(40), "node-a", true), Step::TakeOver);
        // ... up to MAX_LEASE_DURATION: a record claiming years holds for 5 minutes.
        let years = LeaseSpec {
            lease_duration_seconds: Some(i32::MAX),
            ..long
        };
        let o = seen(&years, t0);
        assert_eq!(decide(Some(&o), t0 + s(299), "node-a", true), Step::Wait);
        assert_eq!(
            decide(Some(&o), t0 + s(300), "node-a", true),
            Step::TakeOver
        );
        let negative = LeaseSpec {
            lease_duration_seconds: Some(-5),
            ..years
        };
        assert_eq!(duration_of(&negative), LEASE_DURATION);
    }

    #[test]
    fn a_released_lease_is_taken_at_once() {
        let t0 = Instant::now();
        let held = held_by("node-b", at(2026));
        let released = spec_for(
            Step::Release,
            Some(&held),
            "node-b",
            LEASE_DURATION,
            at(2026),
        )
        .unwrap();
        assert_eq!(released.holder_identity.as_deref(), Some(""));
        assert_eq!(released.lease_transitions, Some(3));
        let o = seen(&released, t0);
        assert_eq!(decide(Some(&o), t0, "node-a", true), Step::TakeOver);
        assert_eq!(decide(Some(&o), t0, "node-a", false), Step::Wait);
        let nobody = seen(&LeaseSpec::default(), t0);
        assert_eq!(decide(Some(&nobody), t0, "node-a", true), Step::TakeOver);
    }

    #[test]
    fn ours_when_no_longer_eligible_is_released() {
        let t = Instant::now();
        let o = seen(&held_by("node-a", at(2026)), t);
        assert_eq!(decide(Some(&o), t, "node-a", false), Step::Release);
        assert_eq!(
            spec_for(
                Step::Wait,
                Some(&o.spec),
                "node-a",
                LEASE_DURATION,
                at(2026)
            ),
            None
        );
    }

    #[test]
    fn clock_skew_does_not_matter() {
        // The holder's renewTime far in the future or the past (its clock, or ours, is off): the
        // decisions are those of a correct clock, for every age observed here.
        let t0 = Instant::now();
        for age in [0, 5, 14, 15, 16, 100] {
            let now = t0 + s(age);
            let right = decide(
                Some(&seen(&held_by("node-b", at(2026)), t0)),
                now,
                "node-a",
                true,
            );
            assert_eq!(
                right,
                if age >= 15 {
                    Step::TakeOver
                } else {
                    Step::Wait
                }
            );
            for skewed in [at(1971), at(2999)] {
                let o = seen(&held_by("node-b", skewed), t0);
                assert_eq!(decide(Some(&o), now, "node-a", true), right, "age {age}");
            }
        }
        // Renewing our own record never depends on its times either.
        for skewed in [at(1971), at(2999)] {
            let o = seen(&held_by("node-a", skewed), t0);
            assert_eq!(decide(Some(&o), t0 + s(100), "node-a", true), Step::Renew);
        }
    }

    #[test]
    fn the_leader_stops_at_the_renew_deadline_before_anyone_can_take_over() {
        let sent = Instant::now();
        assert!(leading(Some(sent), RENEW_DEADLINE, sent));
        assert!(leading(Some(sent), RENEW_DEADLINE, sent + s(9)));
        assert!(!leading(Some(sent), RENEW_DEADLINE, sent + s(10)));
        assert!(!leading(None, RENEW_DEADLINE, sent));
        // Another instance receives that write no earlier than it was sent: it may take over from
        // received + 15 s, after the holder stopped leading (sent + 10 s).
        let received = sent;
        let o = seen(&held_by("node-b", at(2026)), received);
        let first_takeover = (0..60)
            .map(|n| received + s(n))
            .find(|t| decide(Some(&o), *t, "node-a", true) == Step::TakeOver)
            .unwrap();
        let last_leading = (0..60)
            .map(|n| sent + s(n))
            .rfind(|t| leading(Some(sent), RENEW_DEADLINE, *t))
            .unwrap();
        assert_eq!(first_takeover - last_leading, s(6));
    }

    // --- The elector's task against an API server that keeps one Lease the way kube-apiserver does
    // (resourceVersion per write, 409 on a stale update or an existing name), with real HTTP and
    // kube-rs, on shortened periods.

    /// The fake server's Lease (`None`: none) and how many writes it refused with 409.
    #[derive(Default)]
    struct FakeApi {
        lease: Mutex<Option<serde_json::Value>>,
        version: std::sync::atomic::AtomicU64,
        conflicts: std::sync::atomic::AtomicU64,
    }

    const PATH: &str = "/apis/coordination.k8s.io/v1/namespaces/ns/leases";

    fn status(
        code: u16,
        reason: &str,
    ) -> hyper::Response<http_body_util::Full<hyper::body::Bytes>> {
        let body = serde_json::json!({"kind": "Status", "apiVersion": "v1", "metadata": {},
            "status": "Failure", "message": reason, "reason": reason, "code": code});
        hyper::Response::builder()
            .status(code)
            .header("content-type", "application/json")
            .body(http_body_util::Full::from(body.to_string()))
            .unwrap()
    }

    fn ok(
        code: u16,
        v: &serde_json::Value,
    ) -> hyper::Response<http_body_util::Full<hyper::body::Bytes>> {
        hyper::Response::builder()
            .status(code)
            .header("content-type", "application/json")
            .body(http_body_util::Full::from(v.to_string()))
            .unwrap()
    }

    async fn serve_fake(
        api: Arc<FakeApi>,
        req: hyper::Request<hyper::body::Incoming>,
    ) -> Result<hyper::Response<http_body_util::Full<hyper::body::Bytes>>, std::convert::Infallible>
    {
        let method = req.method().clone();
        let path = req.uri().path().to_owned();
        let body = http_body_util::BodyExt::collect(req.into_body())
            .await
            .unwrap()
            .to_bytes();
        let mut lease = api.lease.lock().unwrap();
        let next = || (api.version.fetch_add(1, Ordering::SeqCst) + 1).to_string();
        Ok(match (method.as_str(), path.strip_prefix(PATH)) {
            ("GET", Some("/lease")) => match &*lease {
                Some(l) => ok(200, l),
                None => status(404, "NotFound"),
            },
            ("POST", Some("")) => {
                if lease.is_some() {
                    api.conflicts.fetch_add(1, Ordering::SeqCst);
                    status(409, "AlreadyExists")
                } else {
                    let mut v: serde_json::Value = serde_json::from_slice(&body).unwrap();
                    v["metadata"]["resourceVersion"] = next().into();
                    v["metadata"]["namespace"] = "ns".into();
                    *lease = Some(v.clone());
                    ok(201, &v)
                }
            }
            ("PUT", Some("/lease")) => {
                let mut v: serde_json::Value = serde_json::from_slice(&body).unwrap();
                match &*lease {
                    None => status(404, "NotFound"),
                    Some(cur)
                        if cur["metadata"]["resourceVersion"]
                            != v["metadata"]["resourceVersion"] =>
                    {
                        api.conflicts.fetch_add(1, Ordering::SeqCst);
                        status(409, "Conflict")
                    }
                    Some(_) => {
                        v["metadata"]["resourceVersion"] = next().into();
                        *lease = Some(v.clone());
                        ok(200, &v)
                    }
                }
            }
            _ => status(405, "MethodNotAllowed"),
        })
    }

    /// Starts the fake API server on a thread of its own; its URL.
    fn start_fake(api: Arc<FakeApi>) -> String {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", l.local_addr().unwrap());
        l.set_nonblocking(true).unwrap();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let l = tokio::net::TcpListener::from_std(l).unwrap();
                loop {
                    let (stream, _) = l.accept().await.unwrap();
                    let api = api.clone();
                    let service = hyper::service::service_fn(move |r| serve_fake(api.clone(), r));
                    tokio::spawn(
                        hyper::server::conn::http1::Builder::new()
                            .serve_connection(hyper_util::rt::TokioIo::new(stream), service),
                    );
                }
            });
        });
        url
    }

    /// 2 s lease, 1.2 s renew deadline, rounds every 250 ms.
    const FAST: Timing = Timing {
        lease_duration: Duration::from_secs(2),
        renew_deadline: Duration::from_millis(1200),
        retry_period: Duration::from_millis(250),
    };

    /// An instance named `me` on a runtime of its own (its own client, as a process has); the
    /// sender kills it: the runtime is dropped with the elector in whatever state, as kill -9
    /// leaves it (no release).
    fn instance(
        url: &str,
        me: &str,
        eligible: Arc<AtomicBool>,
    ) -> (Leader, tokio::sync::oneshot::Sender<()>) {
        let (leader, kill, _stop) = stoppable(url, me, eligible, Arc::new(AtomicBool::new(true)));
        (leader, kill)
    }

    /// [`instance`], and the sender that stops it as a signal does ([`Leadership::release`]).
    fn stoppable(
        url: &str,
        me: &str,
        eligible: Arc<AtomicBool>,
        fit: Arc<AtomicBool>,
    ) -> (
        Leader,
        tokio::sync::oneshot::Sender<()>,
        watch::Sender<bool>,
    ) {
        let (stop, stopping) = watch::channel(false);
        let (url, me) = (url.to_owned(), me.to_owned());
        let (give, take) = std::sync::mpsc::channel();
        let (kill, killed) = tokio::sync::oneshot::channel::<()>();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let mut config = kube::Config::new(url.parse().unwrap());
                crate::k8s::client::trust(&mut config, "test").unwrap();
                let client = kube::Client::try_from(config).unwrap();
                let leader = start(
                    client,
                    "ns".into(),
                    "lease".into(),
                    me,
                    Part {
                        eligible,
                        fit,
                        stopping,
                    },
                    FAST,
                    None,
                );
                give.send(leader).unwrap();
                let _ = killed.await;
            });
        });
        (take.recv().unwrap(), kill, stop)
    }

    fn holder_on(api: &FakeApi) -> Option<String> {
        api.lease.lock().unwrap().as_ref().and_then(|l| {
            l.pointer("/spec/holderIdentity")
                .and_then(serde_json::Value::as_str)
                .filter(|h| !h.is_empty())
                .map(str::to_owned)
        })
    }

    /// Watches `leaders` for `d`, every 10 ms: never two leading at once; when one leads, the
    /// server names it. Returns the index of the one leading at the end, if any.
    fn watch_exclusive(api: &FakeApi, leaders: &[(&str, &Leader)], d: Duration) -> Option<usize> {
        let end = Instant::now() + d;
        loop {
            let now_leading: Vec<usize> = (0..leaders.len())
                .filter(|i| leaders[*i].1.is_leading())
                .collect();
            assert!(
                now_leading.len() <= 1,
                "two leaders at once: {now_leading:?}"
            );
            if let Some(i) = now_leading.first() {
                assert_eq!(holder_on(api).as_deref(), Some(leaders[*i].0));
            }
            if Instant::now() >= end {
                return now_leading.first().copied();
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn wait_for(what: &str, limit: Duration, mut f: impl FnMut() -> bool) -> Duration {
        let t0 = Instant::now();
        while !f() {
            assert!(t0.elapsed() < limit, "{what}: not within {limit:?}");
            std::thread::sleep(Duration::from_millis(10));
        }
        t0.elapsed()
    }

    /// A Lease as a 1.37 API server may hold it: the 1.31+ fields of coordinated leader election
    /// and fields no release of this build's model knows, in `spec` and beside it.
    fn newer_lease(holder: &str, rv: &str) -> serde_json::Value {
        serde_json::json!({
            "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": "lease", "namespace": "ns", "resourceVersion": rv,
                "labels": {"team": "storage"}},
            "spec": {"holderIdentity": holder, "leaseDurationSeconds": 2,
                "acquireTime": "2026-01-01T00:00:00.000000Z",
                "renewTime": "2026-01-01T00:00:00.000000Z", "leaseTransitions": 7,
                "preferredHolder": "node-z", "strategy": "OldestEmulationVersion",
                "futureSpecField": {"k": [1, 2]}},
            "futureTopField": "kept"
        })
    }

    /// Every field but the five of the record survives a write, known to the model or not.
    fn assert_newer_fields_kept(v: &serde_json::Value) {
        assert_eq!(v["spec"]["preferredHolder"], "node-z", "{v}");
        assert_eq!(v["spec"]["strategy"], "OldestEmulationVersion", "{v}");
        assert_eq!(
            v["spec"]["futureSpecField"],
            serde_json::json!({"k": [1, 2]}),
            "{v}"
        );
        assert_eq!(v["futureTopField"], "kept", "{v}");
        assert_eq!(v["metadata"]["labels"]["team"], "storage", "{v}");
    }

    #[test]
    fn a_write_sets_the_record_and_keeps_every_other_field_as_read() {
        let raw: DynamicObject = serde_json::from_value(newer_lease("node-b", "41")).unwrap();
        let read = typed(&raw).unwrap();
        let spec = spec_for(
            Step::TakeOver,
            read.spec.as_ref(),
            "node-a",
            Duration::from_secs(15),
            at(2027),
        )
        .unwrap();
        let out = serde_json::to_value(with_spec(raw, &spec).unwrap()).unwrap();
        assert_newer_fields_kept(&out);
        assert_eq!(out["metadata"]["resourceVersion"], "41");
        assert_eq!(out["spec"]["holderIdentity"], "node-a");
        assert_eq!(out["spec"]["leaseDurationSeconds"], 15);
        assert_eq!(out["spec"]["leaseTransitions"], 8);
        assert_eq!(out["spec"]["renewTime"], "2027-01-01T00:00:00.000000Z");
        assert_eq!(out["spec"]["acquireTime"], "2027-01-01T00:00:00.000000Z");
        assert_eq!(out["kind"], "Lease");
        // No spec at all, or a null one: the record alone.
        let bare: DynamicObject = serde_json::from_value(serde_json::json!({
            "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": "lease", "resourceVersion": "1"}, "spec": null}))
        .unwrap();
        let out = serde_json::to_value(with_spec(bare, &spec).unwrap()).unwrap();
        assert_eq!(out["spec"]["holderIdentity"], "node-a");
        // A spec that is not an object is refused, never overwritten.
        let odd: DynamicObject = serde_json::from_value(serde_json::json!({
            "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": "lease"}, "spec": "text"}))
        .unwrap();
        assert!(
            matches!(with_spec(odd, &spec), Err(LeaseShape::ReadSpecNotObject)),
            "refused as a spec that is not an object"
        );
    }

    /// Over HTTP: an instance takes a released Lease written by a newer API server, renews it,
    /// and releases it; the fields beyond its model are on the server after every write.
    #[test]
    fn electors_over_http_never_erase_fields_of_a_newer_lease() {
        let api = Arc::new(FakeApi::default());
        *api.lease.lock().unwrap() = Some(newer_lease("", "5"));
        api.version.store(5, Ordering::SeqCst);
        let url = start_fake(api.clone());
        let eligible = Arc::new(AtomicBool::new(true));
        let (a, _kill, stop) = stoppable(
            &url,
            "node-a",
            eligible.clone(),
            Arc::new(AtomicBool::new(true)),
        );
        wait_for("a leader", Duration::from_secs(3), || a.is_leading());
        let v0 = api.version.load(Ordering::SeqCst);
        wait_for("a renewal", Duration::from_secs(3), || {
            api.version.load(Ordering::SeqCst) > v0
        });
        {
            let lease = api.lease.lock().unwrap();
            let v = lease.as_ref().unwrap();
            assert_eq!(v["spec"]["holderIdentity"], "node-a");
            assert_eq!(v["spec"]["leaseTransitions"], 8);
            assert_newer_fields_kept(v);
        }
        stop.send_replace(true);
        wait_for("released", Duration::from_secs(3), || {
            holder_on(&api).is_none()
        });
        assert_newer_fields_kept(api.lease.lock().unwrap().as_ref().unwrap());
    }

    #[test]
    fn electors_over_http_one_leads_a_dead_one_is_replaced_a_released_one_at_once() {
        let api = Arc::new(FakeApi::default());
        let url = start_fake(api.clone());
        let names = ["node-a", "node-b"];
        let eligible = [
            Arc::new(AtomicBool::new(true)),
            Arc::new(AtomicBool::new(true)),
        ];
        let (a, kill_a) = instance(&url, names[0], eligible[0].clone());
        let (b, kill_b) = instance(&url, names[1], eligible[1].clone());
        let mut kills = [Some(kill_a), Some(kill_b)];

        // Both race for it: exactly one leads, and keeps leading (it renews).
        wait_for("a leader", Duration::from_secs(3), || {
            a.is_leading() || b.is_leading()
        });
        let both = [(names[0], &a), (names[1], &b)];
        let h = watch_exclusive(&api, &both, Duration::from_secs(3)).expect("a leader after 3 s");
        let o = 1 - h;
        let versions = api.version.load(Ordering::SeqCst);
        assert!(versions >= 6, "only {versions} writes in 3 s: no renewals?");

        // The holder dies without releasing: the other takes over once the record it sees has
        // not changed for the lease duration (2 s), not before; the dead one's handle said `false`
        // from its renew deadline on, although its task is gone (checked against the clock).
        let handles = [&a, &b];
        let _ = kills[h].take().unwrap().send(());
        let took = wait_for("the takeover", Duration::from_secs(8), || {
            handles[o].is_leading()
        });
        assert!(!handles[h].is_leading());
        assert!(
            took >= Duration::from_millis(1500),
            "taken over after {took:?}, before the 2 s lease could expire as observed"
        );
        // At most two leases after the last renewal it saw (a candidate reads only when the
        // record it saw could have expired: a renewal seen then restarts its wait), and slack for
        // a busy machine.
        assert!(
            took <= Duration::from_millis(2 * 2000 + 1000),
            "taken over after {took:?}"
        );
        assert_eq!(holder_on(&api).as_deref(), Some(names[o]));
        assert_eq!(
            api.lease.lock().unwrap().as_ref().unwrap()["spec"]["leaseTransitions"],
            1
        );

        // The dead one back (same name, a new process): the live holder keeps it, also after the
        // newcomer has watched it for longer than the lease duration.
        let (back, kill_back) = instance(&url, names[h], eligible[h].clone());
        let pair = [(names[h], &back), (names[o], handles[o])];
        let end = watch_exclusive(&api, &pair, Duration::from_secs(3));
        assert_eq!(
            end,
            Some(1),
            "the holder changed after the dead one came back"
        );

        // The holder no longer eligible: it reports `false`, releases the Lease, and the other
        // takes it over at its next round, without waiting for the lease duration.
        eligible[o].store(false, Ordering::SeqCst);
        let gone = wait_for("the release", Duration::from_secs(1), || {
            !handles[o].is_leading()
        });
        let took = wait_for(
            "the takeover after the release",
            Duration::from_secs(2),
            || back.is_leading(),
        );
        assert!(
            took < Duration::from_millis(1500),
            "taken over {took:?} after the holder stopped (released after {gone:?}): waited for expiry?"
        );
        let end = watch_exclusive(&api, &pair, Duration::from_secs(1));
        assert_eq!(end, Some(0));
        assert_eq!(holder_on(&api).as_deref(), Some(names[h]));
        let _ = kill_back.send(());
        if let Some(k) = kills[o].take() {
            let _ = k.send(());
        }
    }

    #[test]
    fn a_stopping_holder_releases_at_once_and_the_other_takes_over_at_its_next_read() {
        let api = Arc::new(FakeApi::default());
        let url = start_fake(api.clone());
        let names = ["node-a", "node-b"];
        let yes = || Arc::new(AtomicBool::new(true));
        let (a, kill_a, stop_a) = stoppable(&url, names[0], yes(), yes());
        let (b, kill_b, stop_b) = stoppable(&url, names[1], yes(), yes());
        wait_for("a leader", Duration::from_secs(3), || {
            a.is_leading() || b.is_leading()
        });
        let both = [(names[0], &a), (names[1], &b)];
        let h = watch_exclusive(&api, &both, Duration::from_secs(1)).expect("a leader");
        let o = 1 - h;
        let handles = [&a, &b];
        assert!(handles[h].holds() && !handles[o].holds());
        // The holder stops (SIGTERM): it stops leading and the record names nobody, both at once
        // (not at its next round, 250 ms away, nor at its renew deadline).
        let t0 = Instant::now();
        [&stop_a, &stop_b][h].send_replace(true);
        let released = wait_for("the release", Duration::from_secs(1), || {
            holder_on(&api).is_none() && !handles[h].holds()
        });
        assert!(!handles[h].is_leading());
        assert!(
            released < Duration::from_millis(200),
            "released {released:?} after the stop"
        );
        // The other takes over at its next read (at most the 2 s lease after the record it saw
        // changed), not after the released record has aged a lease duration; the stopped one
        // never again.
        wait_for(
            "the takeover",
            Duration::from_millis(2 * 2000 + 500),
            || handles[o].is_leading(),
        );
        let took = t0.elapsed();
        let end = watch_exclusive(&api, &both, Duration::from_secs(1));
        assert_eq!(end, Some(o), "after {took:?}");
        assert_eq!(holder_on(&api).as_deref(), Some(names[o]));
        let _ = kill_a.send(());
        let _ = kill_b.send(());
    }

    /// Issue #32, 7: a holder whose lane is stuck (unfit: `Leadership::set_fit(false)`) stops
    /// leading and releases the Lease at its next round, so the other takes over at its next read;
    /// fit again, it does not take the Lease back from the live holder.
    #[test]
    fn an_unfit_holder_releases_and_the_other_takes_over() {
        let api = Arc::new(FakeApi::default());
        let url = start_fake(api.clone());
        let names = ["node-a", "node-b"];
        let fits = [
            Arc::new(AtomicBool::new(true)),
            Arc::new(AtomicBool::new(true)),
        ];
        let yes = || Arc::new(AtomicBool::new(true));
        let (a, kill_a, _stop_a) = stoppable(&url, names[0], yes(), fits[0].clone());
        let (b, kill_b, _stop_b) = stoppable(&url, names[1], yes(), fits[1].clone());
        wait_for("a leader", Duration::from_secs(3), || {
            a.is_leading() || b.is_leading()
        });
        let both = [(names[0], &a), (names[1], &b)];
        let h = watch_exclusive(&api, &both, Duration::from_secs(1)).expect("a leader");
        let o = 1 - h;
        let handles = [&a, &b];
        fits[h].store(false, Ordering::SeqCst);
        // One round (250 ms) and the write: released, no longer leading.
        wait_for("the release", Duration::from_secs(2), || {
            holder_on(&api).is_none() && !handles[h].is_leading() && !handles[h].holds()
                || handles[o].is_leading()
        });
        wait_for(
            "the takeover",
            Duration::from_millis(2 * 2000 + 500),
            || handles[o].is_leading(),
        );
        fits[h].store(true, Ordering::SeqCst);
        let end = watch_exclusive(&api, &both, Duration::from_secs(1));
        assert_eq!(end, Some(o));
        assert_eq!(holder_on(&api).as_deref(), Some(names[o]));
        let _ = kill_a.send(());
        let _ = kill_b.send(());
    }
}
