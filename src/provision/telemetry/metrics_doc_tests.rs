//! docs/metrics.md, drivers/deploy/monitoring/*.yaml and what the daemons serve agree: each
//! daemon's registry is built as the daemon builds it at start (no cluster) and rendered.

use std::collections::{BTreeMap, BTreeSet};

fn read(rel: &str) -> String {
    let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(rel);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// What a daemon serves: metric name as a query names it (`_total` for a counter) → type.
fn served(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .map(|l| {
            let (name, ty) = l.split_once(' ').unwrap();
            let name = if ty == "counter" {
                format!("{name}_total")
            } else {
                name.to_owned()
            };
            (name, ty.to_owned())
        })
        .collect()
}

/// The provisioner's registry as at start, plus the families whose labels only data gives (a
/// root's capacity, a Lease, an operation's duration): one sample each.
fn provisioner() -> String {
    use crate::provision::reconcile::{Action, Op, Outcome, Report};
    let m = super::Metrics::new();
    m.set_capacity(&[super::Pool {
        kind: "hostpath",
        pool: "/srv".into(),
        size: Some(1),
        free: 1,
    }]);
    drop(m.leader("flexvol-claims"));
    m.record(
        &Report {
            ops: vec![Op {
                action: Action::Provision,
                kind: "hostpath",
                outcome: Outcome::Success,
                took: std::time::Duration::from_millis(1),
            }],
            ..Report::default()
        },
        std::time::Duration::from_millis(1),
    );
    m.encode().unwrap()
}

/// The daemons' registries as OpenMetrics text.
fn texts() -> BTreeMap<&'static str, String> {
    BTreeMap::from([
        ("flexvol provisioner", provisioner()),
        (
            "flexvol controller",
            crate::controller::telemetry::Metrics::new()
                .encode()
                .unwrap(),
        ),
        (
            "flexvol scheduler-extender",
            crate::controller::extender::metrics::Metrics::new()
                .encode()
                .unwrap(),
        ),
        (
            "flexvol csi",
            crate::k8s::http::Endpoints::metrics(&crate::csi::health::Endpoints::new()).unwrap(),
        ),
    ])
}

/// The daemons' registries, rendered.
fn daemons() -> BTreeMap<&'static str, BTreeMap<String, String>> {
    texts()
        .into_iter()
        .map(|(daemon, text)| (daemon, served(&text)))
        .collect()
}

/// docs/metrics.md's tables: section (the heading's backquoted daemon, or `every`) → name → type.
fn documented() -> BTreeMap<String, BTreeMap<String, String>> {
    let mut out: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
    let mut section = String::new();
    for l in read("docs/metrics.md").lines() {
        if let Some(h) = l.strip_prefix("## ") {
            section = if h == "Every daemon" {
                "every".into()
            } else {
                h.trim_matches('`').to_owned()
            };
            continue;
        }
        let Some(row) = l.strip_prefix("| `flexvol_") else {
            continue;
        };
        let cells: Vec<&str> = row.split('|').map(str::trim).collect();
        let name = format!("flexvol_{}", cells[0].trim_end_matches('`'));
        let ty = cells[1].to_owned();
        assert!(
            ["counter", "gauge", "histogram"].contains(&ty.as_str()),
            "{name}: type {ty:?}"
        );
        assert!(
            out.entry(section.clone())
                .or_default()
                .insert(name.clone(), ty)
                .is_none(),
            "{name} listed twice in {section}"
        );
    }
    out
}

/// Every served metric is documented under its daemon (or "Every daemon") with its type, and
/// every documented one is served.
#[test]
fn docs_list_exactly_what_each_daemon_serves() {
    let doc = documented();
    let every = doc.get("every").cloned().unwrap_or_default();
    assert!(every.contains_key("flexvol_build_info"));
    let daemons = daemons();
    for (daemon, served) in &daemons {
        let mut want = doc
            .get(*daemon)
            .cloned()
            .unwrap_or_else(|| panic!("docs/metrics.md has no section `{daemon}`"));
        want.extend(every.clone());
        assert_eq!(
            served, &want,
            "{daemon}: served (left) and docs/metrics.md (right) differ"
        );
    }
    for section in doc.keys() {
        assert!(
            section == "every" || daemons.contains_key(section.as_str()),
            "docs/metrics.md section {section} is no daemon"
        );
    }
}

/// Counters end in `_total`, durations in `_seconds`, sizes in `_bytes`; every daemon says its
/// build.
#[test]
fn names_follow_the_conventions() {
    for (daemon, served) in daemons() {
        assert!(served.contains_key("flexvol_build_info"), "{daemon}");
        for (name, ty) in served {
            assert!(name.starts_with("flexvol_"), "{name}");
            if ty == "counter" {
                assert!(name.ends_with("_total"), "{name}");
            } else {
                assert!(
                    !name.ends_with("_total"),
                    "a {ty} named like a counter: {name}"
                );
            }
            if name.contains("duration") {
                assert!(name.ends_with("_seconds"), "{name}");
            }
        }
    }
}

/// The YAML documents of `rel`, parsed (a syntax error fails).
fn yaml(rel: &str) -> Vec<yaml_rust2::Yaml> {
    yaml_rust2::YamlLoader::load_from_str(&read(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

/// The `flexvol_*` names in a PromQL expression.
fn metric_names(expr: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut rest = expr;
    while let Some(i) = rest.find("flexvol_") {
        let tail = &rest[i..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        out.insert(tail[..end].to_owned());
        rest = &tail[end..];
    }
    out
}

/// The PrometheusRule parses, has the fields the Prometheus Operator needs, and every metric an
/// expression names is served by a daemon (a histogram's `_bucket`, `_sum`, `_count` too).
#[test]
fn alert_rules_name_only_served_metrics() {
    let mut served: BTreeSet<String> = BTreeSet::new();
    for (_, s) in daemons() {
        for (name, ty) in s {
            if ty == "histogram" {
                for suffix in ["_bucket", "_sum", "_count"] {
                    served.insert(format!("{name}{suffix}"));
                }
            }
            served.insert(name);
        }
    }
    let docs = yaml("drivers/deploy/monitoring/alerts.yaml");
    assert_eq!(docs.len(), 1);
    let rule = &docs[0];
    assert_eq!(
        rule["apiVersion"].as_str(),
        Some("monitoring.coreos.com/v1")
    );
    assert_eq!(rule["kind"].as_str(), Some("PrometheusRule"));
    assert!(rule["metadata"]["name"].as_str().is_some());
    let mut alerts = BTreeSet::new();
    let mut named = BTreeSet::new();
    for g in rule["spec"]["groups"].as_vec().unwrap() {
        assert!(g["name"].as_str().is_some());
        for r in g["rules"].as_vec().unwrap() {
            let alert = r["alert"].as_str().unwrap();
            assert!(alerts.insert(alert.to_owned()), "{alert} twice");
            let expr = r["expr"]
                .as_str()
                .unwrap_or_else(|| panic!("{alert}: no expr"));
            assert!(
                ["critical", "warning"].contains(&r["labels"]["severity"].as_str().unwrap()),
                "{alert}"
            );
            assert!(r["annotations"]["summary"].as_str().is_some(), "{alert}");
            assert!(r["for"].as_str().is_some(), "{alert}");
            assert_eq!(
                expr.matches('(').count(),
                expr.matches(')').count(),
                "{alert}: {expr}"
            );
            for m in metric_names(expr) {
                assert!(served.contains(&m), "{alert}: {m} is served by no daemon");
                named.insert(m);
            }
        }
    }
    // The alerts the brief of issue #33 asks for are there.
    for a in [
        "FlexvolProvisionerNotPassing",
        "FlexvolLaneStuck",
        "FlexvolDriverCallFailures",
        "FlexvolNfsBreakerOpen",
        "FlexvolHostPathRootNearlyFull",
        "FlexvolControllerDown",
    ] {
        assert!(alerts.contains(a), "no alert {a}");
    }
    assert!(named.contains("flexvol_driver_calls_total"));
}

/// The PodMonitors parse and select the pods by the labels and port names the manifests give
/// them: the DaemonSet's (checked in daemonset.yaml) and the controller's.
#[test]
fn pod_monitors_select_the_daemons_pods() {
    let docs = yaml("drivers/deploy/monitoring/podmonitor.yaml");
    let ds = read("drivers/deploy/daemonset.yaml");
    let mut names = Vec::new();
    for d in &docs {
        assert_eq!(d["apiVersion"].as_str(), Some("monitoring.coreos.com/v1"));
        assert_eq!(d["kind"].as_str(), Some("PodMonitor"));
        names.push(d["metadata"]["name"].as_str().unwrap().to_owned());
        let ep = &d["spec"]["podMetricsEndpoints"][0];
        assert_eq!(ep["port"].as_str(), Some("metrics"));
        assert_eq!(ep["path"].as_str(), Some("/metrics"));
    }
    assert_eq!(names, ["flexvol-provisioner", "flexvol-controller"]);
    assert_eq!(
        docs[0]["spec"]["selector"]["matchLabels"]["app.kubernetes.io/name"].as_str(),
        Some("flexvol-node")
    );
    assert!(ds.contains("app.kubernetes.io/name: flexvol-node"));
    assert!(
        ds.contains("- name: metrics\n          containerPort: 9479"),
        "the DaemonSet's metrics port is named metrics"
    );
    assert_eq!(
        docs[1]["spec"]["selector"]["matchLabels"]["app"].as_str(),
        Some("flexvol-controller")
    );
}

/// Each daemon serves each family once: the build info comes with the process's registry
/// (`k8s::daemon::registry`) and no daemon registers it (or any family) a second time, which
/// the name-keyed maps above would not see.
#[test]
fn each_family_is_served_once() {
    for (daemon, text) in texts() {
        let types: Vec<&str> = text.lines().filter(|l| l.starts_with("# TYPE ")).collect();
        let unique: BTreeSet<&str> = types.iter().copied().collect();
        assert_eq!(
            types.len(),
            unique.len(),
            "{daemon}: a family twice in\n{text}"
        );
        assert_eq!(
            types
                .iter()
                .filter(|l| l.starts_with("# TYPE flexvol_build_info "))
                .count(),
            1,
            "{daemon}"
        );
    }
}
