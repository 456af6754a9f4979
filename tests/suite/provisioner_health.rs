//! Issue #32, 7: a stuck lane does not look healthy. The real `flexvol provisioner` runs against
//! a small in-process API server (plain HTTP, empty lists, watches that stay open, and Leases
//! kept as the API server keeps them: create, get, conditional update), with its shared lane
//! blocked for good at a test hook (`FLEXVOL_TEST_HANG_AT=lane-shared-pass`: the lane's thread
//! parks at the start of its first pass, as in a system call on an NFS server that never
//! answers). Then:
//! - `/healthz` and `/readyz` answer 503 naming the shared lane, while the node-local lane keeps
//!   passing (its last pass stays recent in the same answer);
//! - the instance gives up the Lease it held (the record names nobody) and does not take it again;
//! - SIGTERM ends the process within the DaemonSet's grace period, the blocked thread
//!   notwithstanding.

use crate::util::binary;
use std::collections::HashMap;
use std::io::{Read, Write};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The fake API server's Leases (name -> object) and every holder each write named, in order.
#[derive(Default)]
struct Api {
    leases: Mutex<HashMap<String, serde_json::Value>>,
    version: Mutex<u64>,
    holders: Mutex<Vec<(String, String)>>,
}

const LEASES: &str = "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases";

/// The collections the provisioner lists or watches (a GET of anything else names one object).
const COLLECTIONS: [&str; 7] = [
    "persistentvolumeclaims",
    "persistentvolumes",
    "nodes",
    "storageclasses",
    "configmaps",
    "events",
    "leases",
];

/// A response body: whole, or a watch's that never ends.
type Body = http_body_util::combinators::BoxBody<hyper::body::Bytes, std::convert::Infallible>;

fn json(code: u16, v: &serde_json::Value) -> hyper::Response<Body> {
    use http_body_util::BodyExt;
    hyper::Response::builder()
        .status(code)
        .header("content-type", "application/json")
        .body(http_body_util::Full::from(v.to_string()).boxed())
        .unwrap()
}

fn status(code: u16, reason: &str) -> hyper::Response<Body> {
    json(
        code,
        &serde_json::json!({"kind": "Status", "apiVersion": "v1", "metadata": {},
            "status": "Failure", "message": reason, "reason": reason, "code": code}),
    )
}

impl Api {
    fn write(&self, name: &str, mut v: serde_json::Value) -> serde_json::Value {
        let mut version = self.version.lock().unwrap();
        *version += 1;
        v["metadata"]["resourceVersion"] = version.to_string().into();
        v["metadata"]["namespace"] = "kube-system".into();
        let holder = v
            .pointer("/spec/holderIdentity")
            .and_then(serde_json::Value::as_str)
            .unwrap_or("")
            .to_owned();
        self.holders.lock().unwrap().push((name.to_owned(), holder));
        self.leases
            .lock()
            .unwrap()
            .insert(name.to_owned(), v.clone());
        v
    }

    fn holder(&self, name: &str) -> Option<String> {
        self.leases.lock().unwrap().get(name).map(|l| {
            l.pointer("/spec/holderIdentity")
                .and_then(serde_json::Value::as_str)
                .unwrap_or("")
                .to_owned()
        })
    }

    async fn serve(
        self: Arc<Self>,
        req: hyper::Request<hyper::body::Incoming>,
    ) -> Result<hyper::Response<Body>, std::convert::Infallible> {
        let method = req.method().clone();
        let path = req.uri().path().to_owned();
        let query = req.uri().query().unwrap_or("").to_owned();
        let body = http_body_util::BodyExt::collect(req.into_body())
            .await
            .unwrap()
            .to_bytes();
        if let Some(rest) = path.strip_prefix(LEASES) {
            let name = rest.trim_start_matches('/');
            return Ok(match (method.as_str(), name) {
                ("GET", n) if !n.is_empty() => match self.leases.lock().unwrap().get(n) {
                    Some(l) => json(200, l),
                    None => status(404, "NotFound"),
                },
                ("POST", "") => {
                    let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
                    let n = v["metadata"]["name"].as_str().unwrap().to_owned();
                    if self.leases.lock().unwrap().contains_key(&n) {
                        status(409, "AlreadyExists")
                    } else {
                        json(201, &self.write(&n, v))
                    }
                }
                ("PUT", n) if !n.is_empty() => {
                    let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
                    let current = self.leases.lock().unwrap().get(n).cloned();
                    match current {
                        None => status(404, "NotFound"),
                        Some(c)
                            if c["metadata"]["resourceVersion"]
                                != v["metadata"]["resourceVersion"] =>
                        {
                            status(409, "Conflict")
                        }
                        Some(_) => json(200, &self.write(n, v)),
                    }
                }
                _ => status(405, "MethodNotAllowed"),
            });
        }
        let last = path.rsplit('/').next().unwrap_or("");
        Ok(match method.as_str() {
            "GET"
                if query
                    .split('&')
                    .any(|p| p == "watch=true" || p == "watch=1") =>
            {
                // A watch that stays open with nothing to say.
                let body = http_body_util::StreamBody::new(futures::stream::pending::<
                    Result<hyper::body::Frame<hyper::body::Bytes>, std::convert::Infallible>,
                >());
                hyper::Response::builder()
                    .status(200)
                    .header("content-type", "application/json")
                    .body(http_body_util::BodyExt::boxed(body))
                    .unwrap()
            }
            "GET" if COLLECTIONS.contains(&last) => json(
                200,
                &serde_json::json!({"apiVersion": "v1", "kind": "List",
                    "metadata": {"resourceVersion": "1"}, "items": []}),
            ),
            "GET" => status(404, "NotFound"),
            "POST" => json(201, &serde_json::from_slice(&body).unwrap_or_default()),
            _ => status(405, "MethodNotAllowed"),
        })
    }
}

/// Starts the fake API server on a thread of its own; its URL.
fn start_api(api: Arc<Api>) -> String {
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
                let service = hyper::service::service_fn(move |r| api.clone().serve(r));
                tokio::spawn(
                    hyper::server::conn::http1::Builder::new()
                        .serve_connection(hyper_util::rt::TokioIo::new(stream), service),
                );
            }
        });
    });
    url
}

fn read(dir: &Path, name: &str) -> String {
    std::fs::read_to_string(dir.join(name)).unwrap_or_default()
}

/// GET `path` from the provisioner's server: status and body.
fn get(addr: &str, path: &str) -> (u16, String) {
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(s, "GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let code = out.split(' ').nth(1).unwrap().parse().unwrap();
    (code, out.split_once("\r\n\r\n").unwrap().1.to_owned())
}

/// The seconds `body` says the node-local lane's last pass ended ago.
fn local_pass_age(body: &str) -> u64 {
    let line = body
        .lines()
        .find(|l| l.starts_with("lane node-local: last pass ended "))
        .unwrap_or_else(|| panic!("no node-local pass in {body:?}"));
    line.trim_start_matches("lane node-local: last pass ended ")
        .trim_end_matches("s ago")
        .parse()
        .unwrap()
}

fn wait_for(what: &str, limit: Duration, child: &mut Child, mut f: impl FnMut() -> bool) {
    let t0 = Instant::now();
    while !f() {
        assert!(
            child.try_wait().unwrap().is_none(),
            "{what}: the provisioner exited"
        );
        assert!(t0.elapsed() < limit, "{what}: not within {limit:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn contract_provisioner_stuck_lane_turns_health_red_gives_up_the_lease_and_exits_on_sigterm() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let api = Arc::new(Api::default());
    let url = start_api(api.clone());
    let kubeconfig = dir.join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: {url}\n\
             users:\n- name: u\n  user: {{token: not-a-real-token}}\ncontexts:\n- name: x\n  \
             context: {{cluster: c, user: u}}\ncurrent-context: x\n"
        ),
    )
    .unwrap();
    let config = dir.join("config.json");
    std::fs::write(&config, "{}").unwrap();
    let mut child = Command::new(binary())
        .args(["provisioner", "--node-name", "node-x", "--kubeconfig"])
        .arg(&kubeconfig)
        .args(["--metrics-address", "127.0.0.1:0", "--resync-seconds", "1"])
        .args([
            "--lane-timeout-seconds",
            "3",
            "--lease-namespace",
            "kube-system",
        ])
        .env("FLEXVOL_CONFIG", &config)
        .env("FLEXVOL_TEST_HANG_AT", "lane-shared-pass")
        .env_remove("KUBECONFIG")
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(dir.join("stdout")).unwrap())
        .stderr(std::fs::File::create(dir.join("stderr")).unwrap())
        .spawn()
        .unwrap();
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        check(&mut child, dir, &api);
    }));
    let _ = child.kill();
    let _ = child.wait();
    if let Err(e) = result {
        eprintln!("stderr of the provisioner:\n{}", read(dir, "stderr"));
        std::panic::resume_unwind(e);
    }
}

fn check(child: &mut Child, dir: &Path, api: &Api) {
    // Where it serves (port 0: its log line says which).
    let mut addr = String::new();
    wait_for("the metrics server", Duration::from_secs(20), child, || {
        let err = read(dir, "stderr");
        if let Some(rest) = err.split("readyz on http://").nth(1) {
            addr = rest.split_whitespace().next().unwrap_or("").to_owned();
        }
        !addr.is_empty()
    });
    // It leads flexvol-claims (every instance is eligible, and it is the only one) ...
    wait_for("the Lease taken", Duration::from_secs(20), child, || {
        api.holders
            .lock()
            .unwrap()
            .iter()
            .any(|(n, h)| n == "flexvol-claims" && h == "node-x")
    });
    // ... and once the shared lane has made no progress for 3 s, both probes fail naming it,
    // with since when, while the node-local lane's last pass stays recent.
    wait_for("/healthz red", Duration::from_secs(20), child, || {
        get(&addr, "/healthz").0 == 503
    });
    let (_, body) = get(&addr, "/healthz");
    assert!(
        body.contains("lane shared: no progress for ") && body.contains("stuck"),
        "{body}"
    );
    assert!(!body.contains("lane node-local: no progress"), "{body}");
    let (code, ready) = get(&addr, "/readyz");
    assert_eq!(code, 503, "{ready}");
    assert!(ready.contains("lane shared: no progress for "), "{ready}");
    std::thread::sleep(Duration::from_secs(2));
    let (code, body) = get(&addr, "/healthz");
    assert_eq!(code, 503, "{body}");
    assert!(
        local_pass_age(&body) <= 2,
        "the node-local lane stopped passing: {body}"
    );
    // The Lease is released (names nobody) and not taken again while the lane is stuck.
    wait_for("the Lease released", Duration::from_secs(10), child, || {
        api.holder("flexvol-claims").as_deref() == Some("")
    });
    let writes = api.holders.lock().unwrap().len();
    std::thread::sleep(Duration::from_secs(3));
    let holders = api.holders.lock().unwrap().clone();
    assert_eq!(
        holders.len(),
        writes,
        "written again while stuck: {holders:?}"
    );
    assert_eq!(api.holder("flexvol-claims").as_deref(), Some(""));
    let err = read(dir, "stderr");
    assert!(err.contains("giving up the Leases"), "{err}");
    // SIGTERM: the process ends within the DaemonSet's grace period (5 s), though a thread of
    // it is blocked for good.
    let t0 = Instant::now();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(child.id()).unwrap()),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let code = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st.code();
        }
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "still running 5 s after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(code, Some(0), "{}", read(dir, "stderr"));
    assert!(read(dir, "stdout").is_empty());
}
