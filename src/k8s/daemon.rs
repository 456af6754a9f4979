//! One daemon start for `flexvol provisioner`, `flexvol controller` and
//! `flexvol scheduler-extender`: the signal mask, the levelled logs (text or JSON lines on
//! stderr, filtered by `--log-filter` or `RUST_LOG`), and the process's metrics registry
//! ([`registry`]) with the build-info metric every daemon serves. The driver's verbs never call into this module: kubelet's exec path keeps its own
//! stdout/stderr rules.

use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use std::time::SystemTime;

/// Exit code of a daemon after a panic (EX_SOFTWARE): a bug, as opposed to 1, an environment to
/// fix.
pub(crate) const PANIC_EXIT_CODE: i32 = 70;

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum LogFormat {
    /// `<time> <LEVEL> flexvol-provisioner: <message>`, one line per event.
    Text,
    /// One JSON object per line: `timestamp`, `level`, `target`, `message` and the event's fields.
    Json,
}

/// RFC 3339 UTC times, as the provisioner's lines always had.
struct Rfc3339;

impl tracing_subscriber::fmt::time::FormatTime for Rfc3339 {
    fn format_time(&self, w: &mut tracing_subscriber::fmt::format::Writer<'_>) -> std::fmt::Result {
        w.write_str(&crate::node::calllog::rfc3339(SystemTime::now()))
    }
}

/// Why the logs cannot be set up (the daemon then exits 2, after saying it on stderr).
#[derive(Debug, thiserror::Error)]
pub(crate) enum LogError {
    /// `--log-filter` (or `RUST_LOG`) is not a filter.
    #[error("{0}")]
    Filter(String),
    /// The process's subscriber cannot be set (one is set already).
    #[error("cannot set up logging: {0}")]
    Install(#[from] tracing::subscriber::SetGlobalDefaultError),
}

/// The filter for `spec` (`None`: `default_target`'s and [`super::LOG_TARGET`]'s `info`, nothing of
/// the libraries).
pub(crate) fn log_filter(
    spec: Option<&str>,
    default_target: &str,
) -> Result<tracing_subscriber::filter::Targets, LogError> {
    use tracing_subscriber::filter::{LevelFilter, Targets};
    match spec.map(str::trim).filter(|s| !s.is_empty()) {
        None => Ok(Targets::new()
            .with_target(default_target, LevelFilter::INFO)
            .with_target(super::LOG_TARGET, LevelFilter::INFO)
            .with_default(LevelFilter::OFF)),
        Some(s) => s.parse().map_err(|e| {
            LogError::Filter(format!(
                "log filter {s:?}: {e}; write e.g. info or {default_target}=debug,kube=info"
            ))
        }),
    }
}

/// Sets the process's log subscriber: `format` on stderr, filtered by `filter` (or `RUST_LOG`;
/// with neither, `default_target`'s info and nothing of the libraries).
pub(crate) fn init_logs(
    format: LogFormat,
    filter: Option<&str>,
    default_target: &str,
) -> Result<(), LogError> {
    use tracing_subscriber::layer::SubscriberExt;
    let env = std::env::var("RUST_LOG").ok();
    let targets = log_filter(filter.or(env.as_deref()), default_target)?;
    let fmt = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_timer(Rfc3339);
    let sub = tracing_subscriber::registry().with(targets);
    let set = match format {
        LogFormat::Text => tracing::subscriber::set_global_default(sub.with(fmt)),
        LogFormat::Json => {
            tracing::subscriber::set_global_default(sub.with(fmt.json().flatten_event(true)))
        }
    };
    Ok(set?)
}

/// The start of a daemon command that keeps no signal thread (`flexvol controller`,
/// `flexvol scheduler-extender`), after the caller has set its panic hook (whose log line must
/// name the caller's own target): the termination signals that main() blocks for the driver verbs
/// are unblocked (without it SIGTERM would wait for the kubelet's SIGKILL), and the logs are set
/// up as [`init_logs`] does. `false` when logging cannot be set up, after saying why on stderr
/// (there is no logger yet): the caller exits 2. Call it on the main thread before any other
/// thread exists (threads inherit the signal mask).
#[must_use]
pub(crate) fn start_daemon(format: LogFormat, filter: Option<&str>, default_target: &str) -> bool {
    {
        use nix::sys::signal::{SigSet, Signal};
        let mut set = SigSet::empty();
        for s in [Signal::SIGTERM, Signal::SIGINT, Signal::SIGHUP] {
            set.add(s);
        }
        let _ = set.thread_unblock();
    }
    match init_logs(format, filter, default_target) {
        Ok(()) => true,
        Err(e) => {
            #[allow(clippy::print_stderr)]
            {
                eprintln!("{default_target}: {e}");
            }
            false
        }
    }
}

/// The process's metrics registry, which each daemon's `/metrics` serves ([`super::http::Endpoints`]):
/// `flexvol_build_info{version,commit,target} 1` ([`crate::version`]) is in it already, so a
/// dashboard can tell which build each instance runs. The daemon registers only its own families
/// into it (and so never the build info a second time).
pub(crate) fn registry() -> Registry {
    let mut r = Registry::default();
    register_build_info(&mut r);
    r
}

/// Registers `flexvol_build_info` into `r` (only [`registry`] does).
fn register_build_info(r: &mut Registry) {
    let info: Family<[(&'static str, &'static str); 3], Gauge> = Family::default();
    info.get_or_create(&[
        ("version", crate::version::VERSION),
        ("commit", crate::version::COMMIT),
        ("target", crate::version::TARGET),
    ])
    .set(1);
    r.register(
        "flexvol_build_info",
        "Always 1; the labels say this binary's version, the commit it was built from and its target",
        info,
    );
}

#[cfg(test)]
mod tests {
    /// The registry a daemon starts from holds the build info, once, and nothing else.
    #[test]
    fn the_registry_starts_with_the_build_info_alone() {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &super::registry()).unwrap();
        let types: Vec<&str> = out.lines().filter(|l| l.starts_with("# TYPE ")).collect();
        assert_eq!(types, ["# TYPE flexvol_build_info gauge"], "{out}");
        let sample = format!(
            "flexvol_build_info{{version=\"{}\",commit=\"{}\",target=\"{}\"}} 1",
            crate::version::VERSION,
            crate::version::COMMIT,
            crate::version::TARGET
        );
        assert!(out.lines().any(|l| l == sample), "{sample} not in {out}");
    }
}
