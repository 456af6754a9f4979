//! The extender's HTTP side: [`answer`] (pure: one request in, status and body out, unit-tested)
//! and [`serve`] (hyper 1 with hyper-util, as `provision::telemetry`'s server, with bounds on
//! everything a caller controls).
//!
//! Routes: `POST /filter` and `POST /prioritize` (kube-scheduler's `urlPrefix` + verb; the verbs
//! are these two words, docs/scheduler-extender.md), `GET /healthz` (the process answers),
//! `GET /readyz` (the caches have synced), `GET /metrics` ([`super::metrics`], in [`serve`]).
//!
//! Bounds: the request head within [`HEADER_TIMEOUT`]; the body at most [`MAX_BODY`] bytes and
//! read within [`BODY_TIMEOUT`]; at most [`MAX_CONCURRENT`] requests decided at once (others wait
//! for a slot up to [`BODY_TIMEOUT`], then get 503); the decision itself is in-memory and bounded
//! by the number of nodes and claims.
//!
//! Failure answers, in the `ignorable` direction: before the caches have synced, on an
//! undecodable request or one without a pod, `/filter` answers HTTP 200 with `{"Error": ...}` and
//! `/prioritize` answers 503: kube-scheduler 1.20 treats both as an extender error, which with
//! `ignorable: true` means "schedule without this extender". Nothing here ever filters a node on
//! a failure.

use super::claims::{self, Caches};
use super::decide::{self, Model};
use super::wire::{ExtenderArgs, ExtenderFilterResult, NodeList, node_name};
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use k8s_openapi::api::storage::v1::StorageClass;
use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};

/// The target of the extender's log events.
pub(crate) const LOG_TARGET: &str = "flexvol-scheduler-extender";

/// The longest request body read (a names-form request for thousands of nodes is far smaller).
pub(crate) const MAX_BODY: usize = 4 << 20;
/// The request head must arrive within this.
pub(crate) const HEADER_TIMEOUT: Duration = Duration::from_secs(5);
/// The body must arrive within this (and a request waits at most this for a decision slot).
pub(crate) const BODY_TIMEOUT: Duration = Duration::from_secs(2);
/// At most this many requests decided at once.
pub(crate) const MAX_CONCURRENT: usize = 16;

/// What the extender decides from; filled by the watches ([`super::watch`]), read by every
/// request.
#[derive(Debug, Clone)]
pub struct State {
    /// Published capacity per node (`reserved` is recomputed per request from `claims`).
    pub(crate) model: Model,
    /// Claims by `namespace/name`.
    pub(crate) claims: BTreeMap<String, PersistentVolumeClaim>,
    /// StorageClasses by name.
    pub(crate) classes: BTreeMap<String, StorageClass>,
    /// Vendor part of the provisioner names.
    pub(crate) vendor: String,
    /// Whether every watch has listed once; until then no decision is made.
    pub(crate) synced: bool,
    /// The watches that have listed once (`super::watch::WATCHES`).
    pub(crate) listed: BTreeSet<&'static str>,
    /// Per node, the capacity text last received (a relist of the same text keeps its stamp).
    pub(crate) capacity_text: BTreeMap<String, String>,
    /// At most this many claims of one namespace count as headed to one node
    /// (`--max-reserved-claims-per-namespace`).
    pub(crate) max_reserved_per_namespace: usize,
}

impl State {
    /// An empty, unsynced state.
    pub fn new(vendor: String, stale_after: Duration) -> Self {
        Self {
            model: Model {
                nodes: BTreeMap::new(),
                reserved: BTreeMap::new(),
                stale_after,
            },
            claims: BTreeMap::new(),
            classes: BTreeMap::new(),
            vendor,
            synced: false,
            listed: BTreeSet::new(),
            capacity_text: BTreeMap::new(),
            max_reserved_per_namespace: claims::DEFAULT_MAX_RESERVED_PER_NAMESPACE,
        }
    }

    /// The caches as [`claims`] reads them.
    pub(crate) fn caches(&self) -> Caches<'_> {
        Caches {
            claims: &self.claims,
            classes: &self.classes,
            vendor: &self.vendor,
            max_per_namespace: self.max_reserved_per_namespace,
        }
    }

    /// Claims headed to a node that are not counted because their namespace is over its cap
    /// there (the `flexvol_scheduler_extender_uncounted_claims` gauge, set when scraped).
    pub(crate) fn uncounted_claims(&self) -> usize {
        claims::reserved(&self.caches(), &[])
            .uncounted
            .values()
            .sum()
    }
}

/// An HTTP answer: status, content type, body.
pub(crate) type Answer = (u16, &'static str, String);

const JSON: &str = "application/json";
const TEXT: &str = "text/plain; charset=utf-8";
const METRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

fn json<T: serde::Serialize>(status: u16, v: &T) -> Answer {
    match serde_json::to_string(v) {
        Ok(s) => (status, JSON, s),
        Err(e) => (500, TEXT, format!("cannot encode the answer: {e}\n")),
    }
}

fn filter_error(why: DecodeError) -> Answer {
    json(
        200,
        &ExtenderFilterResult {
            error: format!("flexvol scheduler-extender: {why}"),
            ..Default::default()
        },
    )
}

/// A request ready for the decision.
struct Decoded {
    /// The request as sent.
    args: ExtenderArgs,
    /// Its candidate nodes' names (either form).
    names: Vec<String>,
    /// What the pod's claims need.
    needs: Vec<decide::Need>,
    /// The published capacity, with the claims already headed to each node.
    model: Model,
    /// Per (namespace, node) over its cap, how many of its claims were not counted.
    uncounted: BTreeMap<(String, String), usize>,
}

/// Why a request cannot be decided.
#[derive(Debug, thiserror::Error)]
enum DecodeError {
    /// The caches have not listed yet: nothing is known to decide from.
    #[error("not ready: the capacity, claim and class caches have not synced")]
    NotSynced,
    /// The body is not an `ExtenderArgs` (a bad request).
    #[error("undecodable request: {0}")]
    Undecodable(serde_json::Error),
    /// The request names no pod (a bad request).
    #[error("the request has no pod")]
    NoPod,
}

/// Decodes a request against `state`, or says why it cannot be decided.
fn decode(state: &State, body: &[u8]) -> Result<Decoded, DecodeError> {
    if !state.synced {
        return Err(DecodeError::NotSynced);
    }
    let args: ExtenderArgs = serde_json::from_slice(body).map_err(DecodeError::Undecodable)?;
    let pod = args.pod.as_ref().ok_or(DecodeError::NoPod)?;
    let names: Vec<String> = match (&args.node_names, &args.nodes) {
        (Some(n), _) => n.clone(),
        (None, Some(list)) => list
            .items
            .iter()
            .filter_map(|n| node_name(n).map(str::to_owned))
            .collect(),
        (None, None) => Vec::new(),
    };
    let c = state.caches();
    let (needs, notes) = claims::needs_of_pod(&c, pod);
    for n in notes {
        tracing::debug!(target: LOG_TARGET, "pod {}/{}: {n}", pod.metadata.namespace, pod.metadata.name);
    }
    let mut model = state.model.clone();
    let reserved = if needs.is_empty() {
        claims::Reserved::default()
    } else {
        claims::reserved(&c, &needs)
    };
    model.reserved = reserved.by_node;
    Ok(Decoded {
        args,
        names,
        needs,
        model,
        uncounted: reserved.uncounted,
    })
}

/// Answers one request. `now` is the decision's clock (the caller's `SystemTime::now()`).
pub fn answer(state: &State, method: &str, path: &str, body: &[u8], now: SystemTime) -> Answer {
    match (method, path) {
        ("GET", "/healthz") => (200, TEXT, "ok\n".into()),
        ("GET", "/readyz") if state.synced => (200, TEXT, "ok\n".into()),
        ("GET", "/readyz") => (503, TEXT, "caches not synced\n".into()),
        ("POST", "/filter") => {
            let d = match decode(state, body) {
                Ok(d) => d,
                Err(why) => return filter_error(why),
            };
            let f = decide::filter(&d.model, &d.needs, &d.names, now);
            for (node, why) in &f.unknown {
                tracing::debug!(target: LOG_TARGET, "{node} passes for want of data: {why}");
            }
            if let Some(pod) = d.args.pod.as_ref().filter(|_| !d.needs.is_empty()) {
                // One line per decided pod with flexvol claims (pods without are not logged).
                let failed: Vec<String> =
                    f.failed.iter().map(|(n, w)| format!("{n}: {w}")).collect();
                // Claims of a namespace over its cap on a node: not counted, said with the pod.
                let uncounted: String = d
                    .uncounted
                    .iter()
                    .map(|((ns, node), n)| format!("; {n} claim(s) of namespace {ns} headed to {node} not counted (over --max-reserved-claims-per-namespace)"))
                    .collect();
                tracing::info!(
                    target: LOG_TARGET,
                    "filter pod {}/{} ({} flexvol claim(s)): passed [{}]; filtered [{}]{uncounted}",
                    pod.metadata.namespace,
                    pod.metadata.name,
                    d.needs.len(),
                    f.passed.join(", "),
                    failed.join("; ")
                );
            }
            // Answer in the form asked: names, or the passing Node objects verbatim.
            let result = match d.args.nodes {
                Some(list) if d.args.node_names.is_none() => {
                    let items = list
                        .items
                        .into_iter()
                        .filter(|n| node_name(n).is_some_and(|x| f.passed.iter().any(|p| p == x)))
                        .collect();
                    ExtenderFilterResult {
                        nodes: Some(NodeList { items }),
                        failed_nodes: f.failed,
                        ..Default::default()
                    }
                }
                _ => ExtenderFilterResult {
                    node_names: Some(f.passed),
                    failed_nodes: f.failed,
                    ..Default::default()
                },
            };
            json(200, &result)
        }
        ("POST", "/prioritize") => match decode(state, body) {
            Ok(d) => json(200, &decide::prioritize(&d.model, &d.needs, &d.names, now)),
            Err(why) => (503, TEXT, format!("flexvol scheduler-extender: {why}\n")),
        },
        (_, "/filter" | "/prioritize") => (405, TEXT, "POST only\n".into()),
        (_, "/healthz" | "/readyz") => (405, TEXT, "GET only\n".into()),
        _ => (
            404,
            TEXT,
            "not found: POST /filter, POST /prioritize, GET /healthz, GET /readyz, GET /metrics\n"
                .into(),
        ),
    }
}

/// Why a request's body was not read.
#[derive(Debug, thiserror::Error)]
enum BodyError {
    /// The connection failed while the body was read (a bad request: 400).
    #[error("reading the request: {0}")]
    Read(String),
    /// The body is over [`MAX_BODY`] (413).
    #[error("request larger than {MAX_BODY} bytes")]
    TooLarge,
}

impl BodyError {
    /// The answer's status.
    fn status(&self) -> u16 {
        match self {
            Self::Read(_) => 400,
            Self::TooLarge => 413,
        }
    }
}

/// Reads a body of at most [`MAX_BODY`] bytes.
async fn read_body<B>(body: B) -> Result<Vec<u8>, BodyError>
where
    B: hyper::body::Body<Data = hyper::body::Bytes>,
    B::Error: std::fmt::Display,
{
    use http_body_util::BodyExt;
    let mut body = std::pin::pin!(body);
    let mut out = Vec::new();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| BodyError::Read(e.to_string()))?;
        let Ok(chunk) = frame.into_data() else {
            continue; // trailers
        };
        if out.len().saturating_add(chunk.len()) > MAX_BODY {
            return Err(BodyError::TooLarge);
        }
        out.extend_from_slice(&chunk);
    }
    Ok(out)
}

/// Serves on `listener` until the process ends, deciding from `state`.
pub(crate) async fn serve(
    listener: std::net::TcpListener,
    state: Arc<RwLock<State>>,
) -> Result<(), ServerError> {
    let metrics = Arc::new(super::metrics::Metrics::new());
    use hyper::service::service_fn;
    use hyper::{Response, StatusCode, header};
    listener
        .set_nonblocking(true)
        .map_err(ServerError::NonBlocking)?;
    let listener = tokio::net::TcpListener::from_std(listener).map_err(ServerError::Socket)?;
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONCURRENT));
    // HTTP/1 with keep-alive (kube-scheduler reuses its connection), the request head within
    // HEADER_TIMEOUT (the timer makes that bound effective).
    let mut conn = hyper::server::conn::http1::Builder::new();
    conn.timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(HEADER_TIMEOUT);
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(e) => {
                // Out of descriptors, or a connection reset before it was accepted: the
                // listener stays; try again in a second (as hyper 0.14's server did).
                tracing::debug!(target: LOG_TARGET, "accept: {e}");
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        let (state, slots, metrics) = (state.clone(), slots.clone(), metrics.clone());
        let service = service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
            let (state, slots, metrics) = (state.clone(), slots.clone(), metrics.clone());
            async move {
                let t0 = std::time::Instant::now();
                let path = req.uri().path().to_owned();
                let (status, ctype, body) = async {
                    if req.method() == hyper::Method::GET && path == "/metrics" {
                        if let Ok(s) = state.read() {
                            metrics.set_uncounted(s.uncounted_claims());
                        }
                        return match metrics.encode() {
                            Ok(t) => (200, METRICS, t),
                            Err(e) => (500, TEXT, format!("{e}\n")),
                        };
                    }
                    let _slot =
                        match tokio::time::timeout(BODY_TIMEOUT, slots.acquire_owned()).await {
                            Ok(Ok(s)) => s,
                            _ => return (503, TEXT, "busy\n".to_owned()),
                        };
                    let (parts, body) = req.into_parts();
                    let body = match tokio::time::timeout(BODY_TIMEOUT, read_body(body)).await {
                        Ok(Ok(b)) => b,
                        Ok(Err(why)) => return (why.status(), TEXT, format!("{why}\n")),
                        Err(_) => {
                            return (408, TEXT, "the request body was too slow\n".to_owned());
                        }
                    };
                    match state.read() {
                        Ok(s) => answer(
                            &s,
                            parts.method.as_str(),
                            parts.uri.path(),
                            &body,
                            SystemTime::now(),
                        ),
                        Err(_) => (500, TEXT, "internal error: state poisoned\n".to_owned()),
                    }
                }
                .await;
                metrics.observe(&path, status, &body, t0.elapsed());
                let mut resp =
                    Response::new(http_body_util::Full::<hyper::body::Bytes>::from(body));
                *resp.status_mut() =
                    StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
                resp.headers_mut().insert(
                    header::CONTENT_TYPE,
                    header::HeaderValue::from_static(ctype),
                );
                Ok::<_, std::convert::Infallible>(resp)
            }
        });
        let serving = conn.serve_connection(hyper_util::rt::TokioIo::new(stream), service);
        tokio::spawn(async move {
            // A failed connection (reset, a head too slow) ends only itself.
            let _ = serving.await;
        });
    }
}

/// Why the extender does not serve.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ServerError {
    /// `--listen` cannot be bound (an address in use, or not on this host).
    #[error(
        "cannot listen on {addr}: {source}; give a free address with --listen (and the same in kube-scheduler's extenders urlPrefix)"
    )]
    Bind {
        /// The address asked for.
        addr: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
    /// The listener cannot be made non-blocking.
    #[error("cannot make the listener non-blocking: {0}")]
    NonBlocking(std::io::Error),
    /// The listener cannot be registered with the runtime.
    #[error("{0}")]
    Socket(std::io::Error),
}

/// Binds `addr` (an address in use is an error at start); the listener for [`serve`].
pub(crate) fn bind(addr: SocketAddr) -> Result<std::net::TcpListener, ServerError> {
    std::net::TcpListener::bind(addr).map_err(|source| ServerError::Bind { addr, source })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::extender::decide::Published;
    use crate::controller::extender::wire::HostPriority;
    use crate::vocab::capacity::{CapacityRecord, RootCapacity};

    const GI: u64 = 1 << 30;

    /// An address in use is a bind error that names --listen (the process exits at start).
    #[test]
    fn an_address_in_use_is_a_bind_error() {
        let first = bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let at = first.local_addr().unwrap();
        let e = bind(at).unwrap_err();
        assert!(
            matches!(&e, ServerError::Bind { addr, source }
                if *addr == at && source.kind() == std::io::ErrorKind::AddrInUse),
            "{e:?}"
        );
        assert!(e.to_string().contains("--listen"), "{e}");
    }

    fn now() -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_795_000_000)
    }

    fn node(name: &str, available: u64, at: SystemTime) -> (String, Published) {
        let secs = at.duration_since(SystemTime::UNIX_EPOCH).unwrap().as_secs();
        (
            name.into(),
            Published {
                record: Ok(CapacityRecord {
                    version: 1,
                    node: name.into(),
                    published_at: secs - 5,
                    hostpath_classes: vec![],
                    hostpath: vec![RootCapacity {
                        path: "/srv".into(),
                        default: true,
                        classes: vec![],
                        size: 100 * GI,
                        available,
                        promised: 0,
                        quota_enforced: true,
                        error: None,
                    }],
                    lvm: vec![],
                }),
                received_at: at,
            },
        )
    }

    fn state() -> State {
        state_at(now())
    }

    /// Two nodes that published at `at`: "full" (512Mi available) and "roomy" (50Gi); one claim
    /// ns/data of 1Gi in a hostPath class.
    fn state_at(at: SystemTime) -> State {
        let mut s = State::new("flexvol".into(), Duration::from_secs(180));
        s.model.nodes = [node("full", GI / 2, at), node("roomy", 50 * GI, at)].into();
        let class: StorageClass = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "local"}, "provisioner": "flexvol/hostpath",
            "volumeBindingMode": "WaitForFirstConsumer"}))
        .unwrap();
        s.classes.insert("local".into(), class);
        let claim: PersistentVolumeClaim = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "data", "namespace": "ns"},
            "spec": {"storageClassName": "local", "accessModes": ["ReadWriteOnce"],
                     "resources": {"requests": {"storage": "1Gi"}}}}))
        .unwrap();
        s.claims.insert("ns/data".into(), claim);
        s.synced = true;
        s
    }

    const POD: &str = r#""Pod":{"metadata":{"name":"p","namespace":"ns"},"spec":{"volumes":[{"name":"d","persistentVolumeClaim":{"claimName":"data"}}]}}"#;

    /// The names form, end to end through the handler: the full node fails with its reason.
    #[test]
    fn filter_and_prioritize_by_names() {
        let s = state();
        let body = format!(r#"{{{POD},"NodeNames":["full","roomy","ghost"]}}"#);
        let (status, ctype, text) = answer(&s, "POST", "/filter", body.as_bytes(), now());
        assert_eq!((status, ctype), (200, JSON));
        let r: ExtenderFilterResult = serde_json::from_str(&text).unwrap();
        assert_eq!(r.node_names.unwrap(), ["roomy", "ghost"]);
        assert!(
            r.failed_nodes["full"].contains("ns/data needs 1Gi"),
            "{text}"
        );
        assert!(r.error.is_empty() && r.nodes.is_none());
        let (status, _, text) = answer(&s, "POST", "/prioritize", body.as_bytes(), now());
        assert_eq!(status, 200);
        let l: Vec<HostPriority> = serde_json::from_str(&text).unwrap();
        assert_eq!(
            l.iter().map(|h| h.score).collect::<Vec<_>>(),
            [0, 5, 0],
            "{text}"
        );
    }

    /// Issue #32, 5, end to end through the handler: another namespace's claims headed to
    /// "roomy" by a hand-written selected-node, each larger than the node, filter this pod off
    /// it only when the provisioner would make them; a refused one (ReadWriteMany) and the ones
    /// beyond the namespace's cap are not counted, and the cap's excess is a metric.
    #[test]
    fn a_bogus_claim_headed_to_a_node_does_not_filter_other_tenants_off_it() {
        let mut s = state();
        let body = format!(r#"{{{POD},"NodeNames":["roomy"]}}"#);
        let passed = |s: &State| {
            let (_, _, text) = answer(s, "POST", "/filter", body.as_bytes(), now());
            let r: ExtenderFilterResult = serde_json::from_str(&text).unwrap();
            r.node_names.unwrap_or_default() == ["roomy"]
        };
        let bogus = |name: &str, mode: &str| -> PersistentVolumeClaim {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": name, "namespace": "evil",
                             "annotations": {crate::vocab::ANN_SELECTED_NODE: "roomy"}},
                "spec": {"storageClassName": "local", "accessModes": [mode],
                         "resources": {"requests": {"storage": "1Pi"}}}}))
            .unwrap()
        };
        s.claims
            .insert("evil/rwx".into(), bogus("rwx", "ReadWriteMany"));
        assert!(passed(&s), "a claim the provisioner refuses holds no room");
        assert_eq!(s.uncounted_claims(), 0);
        // One it would make holds the node (until it is made, or sent back for want of room).
        s.claims
            .insert("evil/big".into(), bogus("big", "ReadWriteOnce"));
        assert!(!passed(&s));
        // With a cap of none per namespace, it and its like are not counted, and said.
        s.claims
            .insert("evil/big2".into(), bogus("big2", "ReadWriteOnce"));
        s.max_reserved_per_namespace = 0;
        assert!(passed(&s));
        assert_eq!(s.uncounted_claims(), 2);
    }

    /// The whole-node form answers with the passing Node objects, untouched.
    #[test]
    fn filter_by_node_objects() {
        let s = state();
        let body = format!(
            r#"{{{POD},"Nodes":{{"items":[{{"metadata":{{"name":"full"}}}},{{"metadata":{{"name":"roomy","uid":"u2"}},"spec":{{"podCIDR":"10.0.0.0/24"}}}}]}}}}"#
        );
        let (status, _, text) = answer(&s, "POST", "/filter", body.as_bytes(), now());
        assert_eq!(status, 200);
        let r: ExtenderFilterResult = serde_json::from_str(&text).unwrap();
        let items = r.nodes.unwrap().items;
        assert_eq!(items.len(), 1);
        assert_eq!(items[0]["spec"]["podCIDR"], "10.0.0.0/24");
        assert!(r.node_names.is_none());
    }

    /// Not synced, junk, no pod: filter answers an error (ignored by kube-scheduler), prioritize
    /// a 503; never a filtered node, never a panic. Wrong methods and paths are refused.
    #[test]
    fn failures_are_errors_kube_scheduler_ignores() {
        let mut s = state();
        for body in ["", "{", "[1]", "{\"NodeNames\":[\"full\"]}"] {
            let (status, _, text) = answer(&s, "POST", "/filter", body.as_bytes(), now());
            assert_eq!(status, 200);
            let r: ExtenderFilterResult = serde_json::from_str(&text).unwrap();
            assert!(
                !r.error.is_empty() && r.failed_nodes.is_empty(),
                "{body}: {text}"
            );
            assert_eq!(
                answer(&s, "POST", "/prioritize", body.as_bytes(), now()).0,
                503
            );
        }
        s.synced = false;
        let body = format!(r#"{{{POD},"NodeNames":["full"]}}"#);
        let (_, _, text) = answer(&s, "POST", "/filter", body.as_bytes(), now());
        assert!(text.contains("not ready"), "{text}");
        assert_eq!(answer(&s, "GET", "/readyz", b"", now()).0, 503);
        assert_eq!(answer(&s, "GET", "/healthz", b"", now()).0, 200);
        assert_eq!(answer(&s, "GET", "/filter", b"", now()).0, 405);
        assert_eq!(answer(&s, "POST", "/healthz", b"", now()).0, 405);
        assert_eq!(answer(&s, "POST", "/bind", b"", now()).0, 404);
    }

    /// A pod without flexvol claims passes everywhere with no opinion, even on a full node.
    #[test]
    fn pods_without_flexvol_claims_pass() {
        let s = state();
        let body =
            r#"{"Pod":{"metadata":{"name":"p","namespace":"ns"}},"NodeNames":["full","roomy"]}"#;
        let (_, _, text) = answer(&s, "POST", "/filter", body.as_bytes(), now());
        assert_eq!(text, r#"{"NodeNames":["full","roomy"]}"#);
        let (_, _, text) = answer(&s, "POST", "/prioritize", body.as_bytes(), now());
        assert_eq!(
            text,
            r#"[{"Host":"full","Score":0},{"Host":"roomy","Score":0}]"#
        );
    }

    /// One HTTP/1.1 request over a fresh connection (closed after the answer): status and body.
    async fn request(addr: SocketAddr, method: &str, path: &str, body: Vec<u8>) -> (u16, String) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut c = tokio::net::TcpStream::connect(addr).await.unwrap();
        let head = format!(
            "{method} {path} HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
            body.len()
        );
        c.write_all(head.as_bytes()).await.unwrap();
        c.write_all(&body).await.unwrap();
        let mut out = Vec::new();
        c.read_to_end(&mut out).await.unwrap();
        let text = String::from_utf8_lossy(&out).into_owned();
        let (head, body) = text.split_once("\r\n\r\n").unwrap();
        let status = head.split(' ').nth(1).unwrap().parse().unwrap();
        (status, body.to_owned())
    }

    /// The server over a real socket: a filter round trip counted on /metrics, and a body past
    /// the bound is refused.
    #[test]
    fn serves_over_http_with_bounds() {
        let listener = bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let addr = listener.local_addr().unwrap();
        // The server decides with the real clock: data published now.
        let st = Arc::new(RwLock::new(state_at(SystemTime::now())));
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            tokio::spawn(serve(listener, st));
            let post = |path: &'static str, body: Vec<u8>| {
                tokio::time::timeout(Duration::from_secs(10), request(addr, "POST", path, body))
            };
            let body = format!(r#"{{{POD},"NodeNames":["full","roomy"]}}"#);
            let (status, text) = post("/filter", body.into_bytes()).await.unwrap();
            assert_eq!(status, 200);
            assert!(text.contains(r#""NodeNames":["roomy"]"#), "{text}");
            let (status, text) = post("/nowhere", Vec::new()).await.unwrap();
            assert_eq!(status, 404, "{text}");
            // The call above is counted: one filter, decided, one node filtered out.
            let (status, m) = request(addr, "GET", "/metrics", Vec::new()).await;
            assert_eq!(status, 200);
            assert!(
                m.contains(
                    r#"flexvol_scheduler_extender_calls_total{verb="filter",outcome="success"} 1"#
                ),
                "{m}"
            );
            assert!(
                m.contains("flexvol_scheduler_extender_filtered_nodes_total 1"),
                "{m}"
            );
            // The body bound, on the reader itself (over a socket the client may see the
            // connection closed before it reads the 413).
            let body = |n| http_body_util::Full::new(hyper::body::Bytes::from(vec![b' '; n]));
            let e = read_body(body(MAX_BODY + 1)).await.unwrap_err();
            assert!(matches!(e, BodyError::TooLarge), "{e:?}");
            assert_eq!(e.status(), 413);
            let ok = body(MAX_BODY);
            assert_eq!(read_body(ok).await.unwrap().len(), MAX_BODY);
            // A body that fails while it is read is a bad request (400), not a large one.
            let broken = http_body_util::StreamBody::new(futures::stream::iter([Err::<
                hyper::body::Frame<hyper::body::Bytes>,
                _,
            >(
                "connection reset",
            )]));
            let e = read_body(broken).await.unwrap_err();
            assert!(matches!(e, BodyError::Read(_)), "{e:?}");
            assert_eq!(e.status(), 400);
            assert_eq!(e.to_string(), "reading the request: connection reset");
        });
    }
}
