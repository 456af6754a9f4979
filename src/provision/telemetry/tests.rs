use super::*;
use crate::node::config::Config;

/// The metrics' view of one measuring of this node, as the node-local lane takes it.
fn capacity(cfg: &Config, node: &str, lvm_driver: &str) -> (Vec<Pool>, Vec<String>) {
    let m = crate::provision::capacity::measure(
        cfg,
        node,
        lvm_driver,
        crate::provision::capacity::Detail::Metrics,
    );
    (m.pools(), m.failed)
}
use crate::k8s::daemon::log_filter;
use crate::k8s::http::{Limits, serve, serve_within};
use crate::provision::reconcile::Op;
use std::io::{Read, Write};
use std::net::SocketAddr;
use std::sync::Arc;

fn op(action: Action, kind: &'static str, outcome: Outcome, ms: u64) -> Op {
    Op {
        action,
        kind,
        outcome,
        took: Duration::from_millis(ms),
    }
}

/// The value of the sample line `name{labels}` (exactly), `None` when absent.
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .map(|v| v.parse().unwrap())
}

#[test]
fn a_pass_is_counted_by_action_kind_and_outcome() {
    let m = Metrics::new();
    let r = Report {
        failed: vec!["x: failed".into(), "cannot record event".into()],
        ops: vec![
            op(Action::Provision, "hostpath", Outcome::Success, 20),
            op(Action::Provision, "hostpath", Outcome::Success, 30),
            op(Action::Provision, "lvm", Outcome::Failure, 3000),
            op(Action::Provision, "hostpath", Outcome::Rescheduled, 1),
            op(Action::Delete, "nfs", Outcome::Failure, 9),
            op(Action::Resize, "hostpath", Outcome::Success, 9),
        ],
        seen: (7, 5),
        ..Report::default()
    };
    m.record(&r, Duration::from_millis(3100));
    m.set_capacity(&[
        Pool {
            kind: "hostpath",
            pool: "/var/roots/a".into(),
            size: Some(1 << 30),
            free: 1 << 20,
        },
        Pool {
            kind: "lvm",
            pool: "vg0".into(),
            size: None,
            free: 4 << 20,
        },
    ]);
    let t = m.encode().unwrap();
    let ops = "flexvol_provisioner_operations_total";
    assert_eq!(
        sample(
            &t,
            &format!("{ops}{{action=\"provision\",kind=\"hostpath\",outcome=\"success\"}}")
        ),
        Some(2.0),
        "{t}"
    );
    for (labels, want) in [
        (r#"action="provision",kind="lvm",outcome="failure""#, 1.0),
        (
            r#"action="provision",kind="hostpath",outcome="rescheduled""#,
            1.0,
        ),
        (r#"action="delete",kind="nfs",outcome="failure""#, 1.0),
        (r#"action="resize",kind="hostpath",outcome="success""#, 1.0),
    ] {
        assert_eq!(
            sample(&t, &format!("{ops}{{{labels}}}")),
            Some(want),
            "{labels}\n{t}"
        );
    }
    let d = "flexvol_provisioner_operation_duration_seconds";
    let l = r#"action="provision",kind="hostpath",outcome="success""#;
    assert_eq!(sample(&t, &format!("{d}_count{{{l}}}")), Some(2.0), "{t}");
    assert!((sample(&t, &format!("{d}_sum{{{l}}}")).unwrap() - 0.05).abs() < 1e-9);
    // 20 ms and 30 ms: neither in the 5 ms and 10 ms buckets, both in the 40 ms one.
    assert_eq!(
        sample(&t, &format!("{d}_bucket{{le=\"0.01\",{l}}}")),
        Some(0.0),
        "{t}"
    );
    assert_eq!(
        sample(&t, &format!("{d}_bucket{{le=\"0.04\",{l}}}")),
        Some(2.0),
        "{t}"
    );
    assert_eq!(sample(&t, "flexvol_provisioner_passes_total"), Some(1.0));
    assert_eq!(
        sample(&t, "flexvol_provisioner_pass_duration_seconds_count"),
        Some(1.0)
    );
    assert_eq!(sample(&t, "flexvol_provisioner_errors_total"), Some(2.0));
    // A lane's queue: keys queued, retries, open breakers.
    m.set_queue("shared", 3, 5, 1);
    let t = m.encode().unwrap();
    let q = |name: &str| {
        sample(
            &t,
            &format!("flexvol_provisioner_{name}{{lane=\"shared\"}}"),
        )
    };
    assert_eq!(q("queue_depth"), Some(3.0), "{t}");
    assert_eq!(q("retries_total"), Some(5.0), "a counter now: {t}");
    assert_eq!(q("breakers_open"), Some(1.0), "{t}");
    let c = "flexvol_provisioner_cached_objects";
    assert_eq!(
        sample(&t, &format!("{c}{{resource=\"persistentvolumeclaims\"}}")),
        Some(7.0)
    );
    assert_eq!(
        sample(&t, &format!("{c}{{resource=\"persistentvolumes\"}}")),
        Some(5.0)
    );
    let root = r#"{kind="hostpath",pool="/var/roots/a"}"#;
    assert_eq!(
        sample(&t, &format!("flexvol_provisioner_capacity_bytes{root}")),
        Some(1073741824.0)
    );
    assert_eq!(
        sample(&t, &format!("flexvol_provisioner_free_bytes{root}")),
        Some(1048576.0)
    );
    let vg = r#"{kind="lvm",pool="vg0"}"#;
    assert_eq!(
        sample(&t, &format!("flexvol_provisioner_free_bytes{vg}")),
        Some(4194304.0)
    );
    assert_eq!(
        sample(&t, &format!("flexvol_provisioner_capacity_bytes{vg}")),
        None
    );
    assert!(
        t.contains("# TYPE flexvol_provisioner_operations counter"),
        "{t}"
    );
    assert!(t.ends_with("# EOF\n"), "{t}");

    // The next batch: counters add up, the queue gauges are replaced, a root gone is forgotten.
    m.record(&Report::default(), Duration::from_millis(1));
    m.set_queue("shared", 0, 5, 0);
    m.set_capacity(&[]);
    let t = m.encode().unwrap();
    assert_eq!(sample(&t, "flexvol_provisioner_passes_total"), Some(2.0));
    assert_eq!(
        sample(&t, "flexvol_provisioner_queue_depth{lane=\"shared\"}"),
        Some(0.0)
    );
    assert_eq!(
        sample(&t, &format!("flexvol_provisioner_free_bytes{root}")),
        None,
        "{t}"
    );
}

#[test]
fn capacity_is_this_nodes_roots() {
    let d = tempfile::tempdir().unwrap();
    let cfg = Config {
        local_path: serde_json::from_value(serde_json::json!({
            "nodePathMap": [
                {"node": "node-a", "paths": [d.path()]},
                {"node": "node-b", "paths": ["/elsewhere"]},
            ]
        }))
        .unwrap(),
        ..Config::default()
    };
    let (pools, failed) = capacity(&cfg, "node-a", "flexvol/lvm");
    assert_eq!(failed, Vec::<String>::new());
    assert_eq!(pools.len(), 1, "{pools:?}");
    assert_eq!(pools[0].kind, "hostpath");
    assert_eq!(pools[0].pool, d.path().display().to_string());
    let size = pools[0].size.unwrap();
    assert!(size > 0 && pools[0].free <= size, "{pools:?}");
    // A root that cannot be read is said, not a panic.
    let (pools, failed) = capacity(&cfg, "node-b", "flexvol/lvm");
    assert!(pools.is_empty());
    assert!(failed[0].contains("/elsewhere"), "{failed:?}");
}

#[test]
fn liveness_follows_each_lanes_heartbeat() {
    let t0 = Instant::now();
    let h = Health::new(t0, Duration::from_secs(30));
    assert_eq!(h.live_window(), Duration::from_secs(300));
    // Alive from the start (waiting for the config or the first pass).
    assert_eq!(h.live(t0 + Duration::from_secs(299)), Ok(()));
    let e = h.live(t0 + Duration::from_secs(301)).unwrap_err();
    assert!(matches!(e, Unhealthy::Stuck(_)), "{e:?}");
    assert!(e.to_string().contains("stuck"), "{e}");
    h.beat(t0 + Duration::from_secs(290));
    assert_eq!(h.live(t0 + Duration::from_secs(500)), Ok(()));
    h.passed(Lane::Local, t0 + Duration::from_secs(600));
    h.passed(Lane::Shared, t0 + Duration::from_secs(600));
    assert_eq!(h.live(t0 + Duration::from_secs(900)), Ok(()));
    assert!(h.live(t0 + Duration::from_secs(901)).is_err());
    // The window follows a long resync, or --lane-timeout-seconds.
    assert_eq!(
        Health::new(t0, Duration::from_secs(60)).live_window(),
        Duration::from_secs(600)
    );
    let h = Health::new(t0, Duration::from_secs(30)).stuck_after(Some(Duration::from_secs(7)));
    assert_eq!(h.live_window(), Duration::from_secs(7));
    assert_eq!(h.ready_window(), Duration::from_secs(7));
}

/// Issue #32, 7: one lane stuck (no progress: here the shared lane's last beat is old) turns
/// /healthz and /readyz red, naming that lane and since when, while the other lane passing does
/// not hide it (before: one heartbeat for both lanes, which the passing lane kept fresh).
#[test]
fn a_stuck_lane_is_named_while_the_other_passes() {
    let t0 = Instant::now();
    let h = Health::new(t0, Duration::from_secs(30));
    h.synced();
    let at = |s| t0 + Duration::from_secs(s);
    h.passed(Lane::Shared, at(10));
    for s in (20..=400).step_by(20) {
        h.passed(Lane::Local, at(s));
    }
    assert_eq!(h.live(at(310)), Ok(()));
    let e = h.live(at(311)).unwrap_err();
    assert!(matches!(e, Unhealthy::Stuck(_)), "{e:?}");
    let e = e.to_string();
    assert!(
        e.contains("lane shared: no progress for 301s (limit 300s), since "),
        "{e}"
    );
    assert!(e.contains("stuck"), "{e}");
    assert!(!e.contains("lane node-local: no progress"), "{e}");
    assert!(e.contains("lane node-local: last pass ended 0s ago"), "{e}");
    let r = h.ready(at(311)).unwrap_err();
    assert!(
        matches!(r, Unhealthy::Stuck(_)),
        "a stuck lane is stuck on /readyz too: {r:?}"
    );
    assert!(r.to_string().contains("lane shared: no progress"), "{r}");
    // The same, as the metric an alert reads.
    let m = Metrics::new();
    m.set_stuck(&h, at(311));
    let t = m.encode().unwrap();
    let stuck = |lane: &str| {
        sample(
            &t,
            &format!("flexvol_provisioner_lane_stuck{{lane=\"{lane}\"}}"),
        )
    };
    assert_eq!(stuck("shared"), Some(1.0), "{t}");
    assert_eq!(stuck("node-local"), Some(0.0), "{t}");
    // Progress within a pass (one object's work ended) is not stuck; a pass ending clears it.
    h.beat_lane(Lane::Shared, at(311));
    assert_eq!(h.live(at(312)), Ok(()));
    let r = h.ready(at(312)).unwrap_err();
    assert!(matches!(r, Unhealthy::NotReady(_)), "{r:?}");
    assert!(
        r.to_string()
            .contains("lane shared: the last pass ended 302s ago"),
        "{r}"
    );
    h.passed(Lane::Shared, at(312));
    assert_eq!(h.ready(at(312)), Ok(()));
    // And the other way round.
    let e = h.live(at(400 + 301)).unwrap_err().to_string();
    assert!(e.contains("lane node-local: no progress"), "{e}");
    assert!(e.contains("lane shared: no progress"), "{e}");
}

#[test]
fn readiness_needs_synced_caches_and_a_recent_pass_of_each_lane() {
    let t0 = Instant::now();
    let h = Health::new(t0, Duration::from_secs(3));
    assert_eq!(h.ready_window(), Duration::from_secs(60));
    let at = |s| t0 + Duration::from_secs(s);
    let r = h.ready(at(1)).unwrap_err();
    assert!(matches!(r, Unhealthy::NotReady(_)), "{r:?}");
    assert!(r.to_string().contains("not listed"), "{r}");
    h.passed(Lane::Local, at(2)); // a pass on caches not listed yet
    h.passed(Lane::Shared, at(2));
    assert!(
        h.ready(at(3))
            .unwrap_err()
            .to_string()
            .contains("not listed")
    );
    h.synced();
    assert_eq!(h.ready(at(3)), Ok(()));
    assert_eq!(h.ready(at(62)), Ok(()));
    assert!(h.ready(at(63)).unwrap_err().to_string().contains("61s ago"));
    let h = Health::new(t0, Duration::from_secs(3));
    h.synced();
    h.passed(Lane::Local, at(1));
    assert_eq!(
        h.ready(at(1)),
        Err(Unhealthy::NotReady(
            "lane shared: no pass has ended yet".into()
        ))
    );
}

#[test]
fn the_log_filter_defaults_to_info_here_and_nothing_of_the_libraries() {
    use tracing::Level;
    use tracing_subscriber::filter::Targets;
    let f: Targets = log_filter(None, LOG_TARGET).unwrap();
    assert!(f.would_enable(LOG_TARGET, &Level::INFO));
    assert!(!f.would_enable(LOG_TARGET, &Level::DEBUG));
    assert!(f.would_enable(LOG_TARGET, &Level::WARN));
    assert!(!f.would_enable("kube_client::client::builder", &Level::ERROR));
    // The shared layer's own lines (the Lease electors, TLS warnings, the metrics server).
    assert!(f.would_enable(crate::k8s::LOG_TARGET, &Level::INFO));
    assert!(!f.would_enable(crate::k8s::LOG_TARGET, &Level::DEBUG));
    // Another command's default (flexvol controller): its own target, not the provisioner's.
    let f: Targets = log_filter(None, "flexvol-controller").unwrap();
    assert!(f.would_enable("flexvol-controller", &Level::INFO));
    assert!(!f.would_enable(LOG_TARGET, &Level::INFO));
    assert!(f.would_enable(crate::k8s::LOG_TARGET, &Level::INFO));
    let f = log_filter(Some("flexvol-provisioner=debug,kube=info"), LOG_TARGET).unwrap();
    assert!(f.would_enable(LOG_TARGET, &Level::DEBUG));
    assert!(f.would_enable("kube", &Level::INFO));
    let e = log_filter(Some("=nonsense="), LOG_TARGET).unwrap_err();
    assert!(
        matches!(e, crate::k8s::daemon::LogError::Filter(_)),
        "{e:?}"
    );
    assert!(e.to_string().contains("log filter"), "{e}");
}

fn get(addr: SocketAddr, path: &str) -> (u16, String) {
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(s, "GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let status = out.split(' ').nth(1).unwrap().parse().unwrap();
    let body = out.split_once("\r\n\r\n").unwrap().1.to_owned();
    (status, body)
}

#[test]
fn the_server_answers_on_its_own_thread() {
    let shared = Arc::new(Shared {
        metrics: Metrics::new(),
        health: Health::new(Instant::now(), Duration::from_secs(3)),
    });
    let addr = serve("127.0.0.1:0".parse().unwrap(), shared.clone()).unwrap();
    // Nothing runs a runtime on this thread: the server does not need the loop's.
    assert_eq!(get(addr, "/healthz"), (200, "ok\n".into()));
    let (status, body) = get(addr, "/readyz");
    assert_eq!(status, 503);
    assert!(body.contains("not listed"), "{body}");
    shared.health.synced();
    shared.health.passed(Lane::Local, Instant::now());
    shared.health.passed(Lane::Shared, Instant::now());
    assert_eq!(get(addr, "/readyz"), (200, "ok\n".into()));
    shared.metrics.record(
        &Report {
            ops: vec![op(Action::Provision, "hostpath", Outcome::Success, 5)],
            ..Report::default()
        },
        Duration::from_millis(5),
    );
    let (status, body) = get(addr, "/metrics");
    assert_eq!(status, 200);
    assert!(
        body.contains(r#"flexvol_provisioner_operations_total{action="provision",kind="hostpath",outcome="success"} 1"#),
        "{body}"
    );
    assert_eq!(get(addr, "/nope").0, 404);
    // A port in use is an error that says what to change.
    let e = serve(addr, shared).unwrap_err();
    assert!(
        matches!(&e, crate::k8s::http::ServeError::Bind { addr: a, source }
            if *a == addr && source.kind() == std::io::ErrorKind::AddrInUse),
        "{e:?}"
    );
    assert!(e.to_string().contains("--metrics-address"), "{e}");
    // A client that never sends its request is dropped, and the server goes on.
    let _idle = std::net::TcpStream::connect(addr).unwrap();
    assert_eq!(get(addr, "/healthz").0, 200);
}

#[test]
fn capacity_of_the_allowed_volume_groups_is_their_free_bytes() {
    use std::os::unix::fs::PermissionsExt;
    let d = tempfile::tempdir().unwrap();
    // `lvm vgs ... -- VG` as lvm2 answers it: a JSON report, or "not found" for a VG it lacks.
    let lvm = d.path().join("lvm");
    std::fs::write(
        &lvm,
        r#"#!/bin/sh
for a; do vg="$a"; done
case "$vg" in
vg0) echo '{"report":[{"vg":[{"vg_name":"vg0","vg_extent_size":"4194304","vg_free":"8388608","vg_size":"104857600"}]}]}' ;;
*) echo "  Volume group \"$vg\" not found" >&2; exit 5 ;;
esac
"#,
    )
    .unwrap();
    std::fs::set_permissions(&lvm, std::fs::Permissions::from_mode(0o755)).unwrap();
    let mut cfg = Config {
        tool_dirs: vec![d.path().to_owned()],
        ..Config::default()
    };
    cfg.lvm.allowed_volume_groups = vec!["vg0".into(), "gone".into()];
    let (pools, failed) = capacity(&cfg, "node-a", "flexvol/lvm");
    assert_eq!(
        pools,
        vec![Pool {
            kind: "lvm",
            pool: "vg0".into(),
            size: None,
            free: 8 << 20,
        }]
    );
    assert_eq!(failed.len(), 1, "{failed:?}");
    assert!(
        failed[0].contains("capacity of volume group gone"),
        "{failed:?}"
    );
}

/// Connects to `addr` from the loopback address `from` (127.0.0.0/8 is all loopback on Linux:
/// each is another peer to the server).
fn connect_from(from: [u8; 4], addr: SocketAddr) -> std::net::TcpStream {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let s = rt.block_on(async {
        let s = tokio::net::TcpSocket::new_v4().unwrap();
        s.bind(SocketAddr::from((from, 0))).unwrap();
        s.connect(addr).await.unwrap()
    });
    let s = s.into_std().unwrap();
    s.set_nonblocking(false).unwrap();
    s
}

/// GET `path` over `s`: the status, or `None` when the server closed it unanswered.
fn get_on(mut s: std::net::TcpStream, path: &str) -> Option<u16> {
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let _ = write!(s, "GET {path} HTTP/1.1\r\nHost: x\r\n\r\n");
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out.split(' ').nth(1).map(|c| c.parse().unwrap())
}

/// Whether the server closed `s` (EOF or reset) within `limit`, without answering anything.
fn closed_unanswered(s: &mut std::net::TcpStream, limit: Duration) -> bool {
    s.set_read_timeout(Some(limit)).unwrap();
    let mut buf = [0u8; 64];
    match s.read(&mut buf) {
        Ok(0) => true,
        Ok(_) => false,
        Err(e) => e.kind() == std::io::ErrorKind::ConnectionReset,
    }
}

/// Issue #32, 11: any pod can reach /metrics. One peer holding connections open (sending
/// nothing) gets at most `per_peer` of them; the excess is closed at once, and kubelet's probes
/// (another peer) still answer. Peers together get at most `total`. Every connection ends after
/// `connection`, whatever it does.
#[test]
fn the_server_caps_connections_per_peer_and_in_all() {
    let shared = Arc::new(Shared {
        metrics: Metrics::new(),
        health: Health::new(Instant::now(), Duration::from_secs(3)),
    });
    let limits = Limits {
        per_peer: 3,
        total: 6,
        header: Duration::from_secs(30),
        connection: Duration::from_secs(30),
    };
    let addr = serve_within("127.0.0.1:0".parse().unwrap(), shared.clone(), limits).unwrap();
    let probe = [127, 0, 0, 2];
    // A hostile pod (127.0.0.1): 3 idle connections held, then every further one closed unread.
    let mut held: Vec<_> = (0..3).map(|_| connect_from([127, 0, 0, 1], addr)).collect();
    std::thread::sleep(Duration::from_millis(200));
    for s in &mut held {
        assert!(
            !closed_unanswered(s, Duration::from_millis(100)),
            "a held connection was closed"
        );
    }
    for _ in 0..5 {
        let mut extra = connect_from([127, 0, 0, 1], addr);
        assert!(
            closed_unanswered(&mut extra, Duration::from_secs(5)),
            "a connection over the peer's cap was kept"
        );
    }
    // The probe, from another address, is answered.
    assert_eq!(get_on(connect_from(probe, addr), "/healthz"), Some(200));
    // Another peer fills the total (3 + 3): now everyone's excess is closed, the probe's too.
    let more: Vec<_> = (0..3).map(|_| connect_from([127, 0, 0, 3], addr)).collect();
    std::thread::sleep(Duration::from_millis(200));
    let mut over = connect_from([127, 0, 0, 4], addr);
    assert!(
        closed_unanswered(&mut over, Duration::from_secs(5)),
        "over the total cap, kept"
    );
    // A slot given back is taken again.
    drop(more);
    let t0 = Instant::now();
    while get_on(connect_from(probe, addr), "/healthz") != Some(200) {
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "slots not given back"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    drop(held);
}

/// Every connection ends at `connection` (here 1 s), also one that sent half a request and
/// never reads: a slow client holds its slot for at most that long.
#[test]
fn a_connection_lives_at_most_its_limit() {
    let shared = Arc::new(Shared {
        metrics: Metrics::new(),
        health: Health::new(Instant::now(), Duration::from_secs(3)),
    });
    let limits = Limits {
        per_peer: 1,
        total: 4,
        header: Duration::from_secs(30),
        connection: Duration::from_secs(1),
    };
    let addr = serve_within("127.0.0.1:0".parse().unwrap(), shared, limits).unwrap();
    let mut slow = connect_from([127, 0, 0, 1], addr);
    write!(slow, "GET /metrics HTTP/1.1\r\n").unwrap();
    let t0 = Instant::now();
    assert!(closed_unanswered(&mut slow, Duration::from_secs(10)));
    let took = t0.elapsed();
    assert!(took < Duration::from_secs(5), "closed after {took:?}");
    // Its slot is free again: the same peer is answered.
    let t0 = Instant::now();
    while get_on(connect_from([127, 0, 0, 1], addr), "/healthz") != Some(200) {
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "the slot was not given back"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn quota_drift_is_counted() {
    let m = Metrics::new();
    let t = m.encode().unwrap();
    let name = "flexvol_provisioner_quota_drift_total";
    assert_eq!(sample(&t, name), Some(0.0), "{t}");
    let r = Report {
        quota_drift: vec![
            ("pvc-a".into(), "its directory carries project 5 ...".into()),
            ("pvc-b".into(), "its directory lacks ...".into()),
        ],
        ..Report::default()
    };
    m.record(&r, Duration::from_millis(1));
    m.record(&r, Duration::from_millis(1));
    assert_eq!(sample(&m.encode().unwrap(), name), Some(4.0));
}
