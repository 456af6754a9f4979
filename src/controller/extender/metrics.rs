//! The extender's metrics, served as OpenMetrics text on `GET /metrics` of its own port
//! (`prometheus-client`, as the provisioner's): calls per verb and outcome, nodes filtered out,
//! and the time each call took from its head to its answer.
//!
//! Outcomes, from the answer alone ([`Metrics::observe`]), in the provisioner's words: `success`
//! (decided), `failure` (an answer that kube-scheduler treats as the extender failing, which
//! `ignorable: true` skips: HTTP 200 with `Error`, or any other status), `rejected` (the request
//! itself was refused: 4xx). Every verb × outcome is present from start, at zero, with
//! `flexvol_build_info`.

use super::wire::ExtenderFilterResult;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use std::time::Duration;

type CallLabels = [(&'static str, &'static str); 2];
type VerbLabels = [(&'static str, &'static str); 1];

/// The outcomes (`outcome` label values).
pub(crate) const OUTCOMES: [&str; 3] = ["success", "failure", "rejected"];

/// Every metric of the extender, registered once.
#[derive(Debug)]
pub(crate) struct Metrics {
    calls: Family<CallLabels, Counter>,
    seconds: Family<VerbLabels, Histogram>,
    filtered: Counter,
    uncounted: Gauge,
    registry: Registry,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// A registry with every metric at zero.
    pub(crate) fn new() -> Self {
        fn hist() -> Histogram {
            // 50 µs .. ~1.6 s: the decision is in memory; kube-scheduler waits at most httpTimeout.
            Histogram::new(exponential_buckets(0.000_05, 2.0, 16))
        }
        // The process's registry (the build info is in it); this daemon's families below.
        let mut r = crate::k8s::daemon::registry();
        let m = Self {
            calls: Family::default(),
            seconds: Family::new_with_constructor(hist),
            filtered: Counter::default(),
            uncounted: Gauge::default(),
            registry: Registry::default(),
        };
        r.register(
            "flexvol_scheduler_extender_calls",
            "kube-scheduler's calls by verb (filter, prioritize) and outcome (success; failure: skipped by kube-scheduler as ignorable; rejected: a malformed request)",
            m.calls.clone(),
        );
        r.register(
            "flexvol_scheduler_extender_call_duration_seconds",
            "Time from a call's arrival to its answer, by verb",
            m.seconds.clone(),
        );
        r.register(
            "flexvol_scheduler_extender_filtered_nodes",
            "Nodes the filter removed because the pod's flexvol claims do not fit there",
            m.filtered.clone(),
        );
        r.register(
            "flexvol_scheduler_extender_uncounted_claims",
            "Claims headed to a node (selected-node) that are not counted there because their namespace has more than --max-reserved-claims-per-namespace headed to that node (as of the last scrape)",
            m.uncounted.clone(),
        );
        for verb in ["filter", "prioritize"] {
            for outcome in OUTCOMES {
                drop(
                    m.calls
                        .get_or_create(&[("verb", verb), ("outcome", outcome)]),
                );
            }
            drop(m.seconds.get_or_create(&[("verb", verb)]));
        }
        Self { registry: r, ..m }
    }

    /// Records one answered call of `verb` (`filter` or `prioritize`; other paths are not
    /// counted) that took `took`.
    pub(crate) fn observe(&self, verb: &str, status: u16, body: &str, took: Duration) {
        let verb: &'static str = match verb {
            "/filter" => "filter",
            "/prioritize" => "prioritize",
            _ => return,
        };
        let mut outcome = match status {
            200 => "success",
            400..=499 => "rejected",
            _ => "failure",
        };
        if verb == "filter" && status == 200 {
            match serde_json::from_str::<ExtenderFilterResult>(body) {
                Ok(r) if r.error.is_empty() => {
                    self.filtered
                        .inc_by(u64::try_from(r.failed_nodes.len()).unwrap_or(u64::MAX));
                }
                _ => outcome = "failure",
            }
        }
        self.calls
            .get_or_create(&[("verb", verb), ("outcome", outcome)])
            .inc();
        self.seconds
            .get_or_create(&[("verb", verb)])
            .observe(took.as_secs_f64());
    }

    /// Sets the claims not counted for their namespace's cap ([`super::server::State::uncounted_claims`]).
    pub(crate) fn set_uncounted(&self, n: usize) {
        self.uncounted.set(i64::try_from(n).unwrap_or(i64::MAX));
    }

    /// The registry as OpenMetrics text.
    pub(crate) fn encode(&self) -> Result<String, crate::k8s::http::EncodeError> {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)?;
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn series(text: &str, name: &str) -> Option<f64> {
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
    }

    /// Calls are counted by verb and outcome, filtered nodes by the answer's FailedNodes, errors
    /// (kube-scheduler's "skip this extender") apart from decisions; probes are not calls.
    #[test]
    fn calls_outcomes_and_filtered_nodes() {
        let m = Metrics::new();
        let ms = Duration::from_millis(1);
        m.observe(
            "/filter",
            200,
            r#"{"NodeNames":["b"],"FailedNodes":{"a":"flexvol: no room"}}"#,
            ms,
        );
        m.observe("/filter", 200, r#"{"NodeNames":["a","b"]}"#, ms);
        m.observe("/filter", 200, r#"{"Error":"not ready"}"#, ms);
        m.observe("/prioritize", 200, r#"[{"Host":"a","Score":3}]"#, ms);
        m.observe("/prioritize", 503, "not ready", ms);
        m.observe("/filter", 413, "too large", ms);
        m.observe("/healthz", 200, "ok", ms);
        let t = m.encode().unwrap();
        let get = |s: &str| series(&t, s).unwrap_or_else(|| panic!("no {s} in\n{t}"));
        assert_eq!(
            get(r#"flexvol_scheduler_extender_calls_total{verb="filter",outcome="success"}"#),
            2.0
        );
        assert_eq!(
            get(r#"flexvol_scheduler_extender_calls_total{verb="filter",outcome="failure"}"#),
            1.0
        );
        assert_eq!(
            get(r#"flexvol_scheduler_extender_calls_total{verb="filter",outcome="rejected"}"#),
            1.0
        );
        assert_eq!(
            get(r#"flexvol_scheduler_extender_calls_total{verb="prioritize",outcome="success"}"#),
            1.0
        );
        assert_eq!(
            get(r#"flexvol_scheduler_extender_calls_total{verb="prioritize",outcome="failure"}"#),
            1.0
        );
        assert_eq!(get("flexvol_scheduler_extender_filtered_nodes_total"), 1.0);
        assert_eq!(
            get(r#"flexvol_scheduler_extender_call_duration_seconds_count{verb="filter"}"#),
            4.0
        );
        assert!(!t.contains("healthz"));
    }
}
