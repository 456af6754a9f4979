//! `flexvol conformance`: judge any installed FlexVolume driver the way kubelet and
//! kube-controller-manager would run it, and print a table of named checks, each PASS, FAIL or
//! SKIP. A check that was not run is SKIP, counted apart and never a pass; the summary says what
//! was not run and how to run it. Any FAIL makes the exit status 1.
//!
//! It is written against the protocol (docs/protocol.md §1, §2, §12), not against flexvol:
//! - every call is an exec of `<plugin-dir>/<vendor>~<name>/<name>` with argv[0] the full path,
//!   stdin `/dev/null`, and stdout and stderr merged into one pipe read to end of file (Go's
//!   `CombinedOutput`), so stray stderr output or a helper holding the pipe shows up as kubelet
//!   would see it ([`harness`]);
//! - the reply is judged with Go's `encoding/json` rules (`protocol::gojson`), and `init` by the
//!   judge `doctor` and `install` use too (`protocol::init`);
//! - options are built like kubelet's `NewOptionsForDriver`: sorted keys, Go's HTML escaping, the
//!   defaults first and user options last, pod keys only on `mount`;
//! - kubelet's own steps around calls are replayed: create the directory (0750), skip the call when
//!   it is already a mount point by kubelet's device-number test, remove the directory after a
//!   successful teardown, and cache "Not supported" per verb, using kubelet's default instead
//!   ([`lifecycle`]);
//! - error paths are exercised with and without options ([`errors`]): a refusal must be a Failure
//!   (any exit status) that mounts and creates nothing.
//!
//! The runner creates its own kubelet root (or uses `--kubelet-root`); anything a judged driver
//! leaves mounted under it is detached at the end and reported, and the temporary root is removed
//! only when nothing is mounted in it any more (never through a mount).

#![allow(clippy::print_stdout)]

mod errors;
mod harness;
mod lifecycle;

use crate::protocol::init::judge_init;
use crate::protocol::verb::Call;
use crate::sys::mount::{Mounter, SysMounter, UnmountMode};
use crate::sys::mountinfo::MountTable;
use clap::Args;
use harness::Driver;
use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Arguments of `flexvol conformance`.
#[derive(Args, Debug, Clone)]
pub(crate) struct ConformanceArgs {
    /// Plugin directory holding `<vendor>~<name>/<name>`.
    #[arg(long, value_name = "DIR", default_value = crate::ops::install::DEFAULT_PLUGIN_DIR)]
    pub(crate) plugin_dir: PathBuf,
    /// Driver to judge, as `vendor/name` (repeatable).
    #[arg(long = "driver", value_name = "VENDOR/NAME", required = true)]
    pub(crate) drivers: Vec<String>,
    /// User options of a test volume (the `flexVolume.options` map, JSON). Without it the volume
    /// lifecycle is not run (reported as SKIP); with it, a full lifecycle is replayed: attach-side
    /// verbs for attachable drivers, mount (repeated and by parallel pods), unmount, teardown.
    #[arg(long, value_name = "JSON")]
    pub(crate) options: Option<String>,
    /// Options this driver must refuse (JSON, repeatable), e.g. a path that does not exist or a
    /// missing required option: each must end in Failure (any exit status), nothing mounted and
    /// nothing created (no option path that did not exist before).
    #[arg(long = "bad-options", value_name = "JSON")]
    pub(crate) bad_options: Vec<String>,
    /// `flexVolume.fsType` of the test volume.
    #[arg(long, default_value = "", value_name = "TYPE")]
    pub fs_type: String,
    /// PV name of the test volume (`kubernetes.io/pvOrVolumeName`).
    #[arg(long, default_value = "conformance-vol", value_name = "NAME")]
    pub(crate) volume_name: String,
    /// Node name passed to attach-side verbs.
    #[arg(long, default_value = "conformance-node", value_name = "NAME")]
    pub node: String,
    /// kubelet root to create pod and global mount directories under (default: a temporary one).
    #[arg(long, value_name = "DIR")]
    pub(crate) kubelet_root: Option<PathBuf>,
    /// Extra pods mounting the same volume at once (non-attachable drivers).
    #[arg(long, default_value_t = 4, value_name = "N")]
    pub(crate) parallel: usize,
    /// Per-call timeout in seconds (kubelet has none for most verbs; we do not wait forever).
    #[arg(long, default_value_t = 120, value_name = "SECONDS")]
    pub(crate) timeout: u64,
}

/// How a check came out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Run, and passed.
    Pass,
    /// Run, and failed.
    Fail,
    /// Not run; the detail says why.
    Skip,
}

/// One named check.
#[derive(Debug, Clone)]
pub(crate) struct Check {
    /// Driver it is about.
    pub(crate) driver: String,
    /// What was checked.
    pub name: String,
    /// How it came out.
    pub(crate) verdict: Verdict,
    /// Why it failed or was skipped, or a note.
    pub(crate) detail: String,
}

/// The name of the lifecycle's SKIP line (the summary looks for it).
const LIFECYCLE: &str = "volume lifecycle (getvolumename, attach side, mount, unmount, teardown)";

/// The name of the SKIP line when no `--bad-options` were given (the summary looks for it).
const BAD_OPTIONS: &str = "--bad-options: options the driver must refuse are refused";

/// Runs `flexvol conformance`; returns the exit code.
pub(crate) fn run(a: &ConformanceArgs) -> i32 {
    // Malformed arguments are refused before any driver is run.
    let user = match a.options.as_deref().map(parse_options).transpose() {
        Ok(u) => u,
        Err(e) => {
            println!("conformance: --options: {e}");
            return 2;
        }
    };
    let mut bad = Vec::new();
    for (i, b) in a.bad_options.iter().enumerate() {
        match parse_options(b) {
            Ok(m) => bad.push(m),
            Err(e) => {
                println!("conformance: --bad-options #{}: {e}", i + 1);
                return 2;
            }
        }
    }
    let root_tmp;
    let kubelet_root = match &a.kubelet_root {
        Some(r) => r.clone(),
        None => match tempfile_dir() {
            Ok(d) => {
                root_tmp = d;
                root_tmp.clone()
            }
            Err(e) => {
                println!("conformance: cannot create a temporary kubelet root: {e}");
                return 2;
            }
        },
    };
    let notes = path_notes(&a.drivers, user.as_ref());
    let mut all = Vec::new();
    for name in &a.drivers {
        all.extend(judge_driver(a, name, user.as_ref(), &bad, &kubelet_root));
    }
    let left = detach_leftovers(&kubelet_root);
    all.push(Check {
        driver: "(all)".into(),
        name: "nothing left mounted under the kubelet root".into(),
        verdict: if left.is_empty() {
            Verdict::Pass
        } else {
            Verdict::Fail
        },
        detail: if left.is_empty() {
            String::new()
        } else {
            format!("detached: {}", left.join(", "))
        },
    });
    // Only a tree with no mount left in it is removed: removing through a mount that a broken
    // driver left behind would delete the volume's data.
    if a.kubelet_root.is_none() && detach_leftovers(&kubelet_root).is_empty() {
        let _ = std::fs::remove_dir_all(&kubelet_root);
    }
    print_report(&all, &notes);
    i32::from(all.iter().any(|c| c.verdict == Verdict::Fail))
}

fn print_report(all: &[Check], notes: &[String]) {
    let width = all.iter().map(|c| c.name.len()).max().unwrap_or(10).min(70);
    for c in all {
        let mark = match c.verdict {
            Verdict::Pass => "PASS",
            Verdict::Fail => "FAIL",
            Verdict::Skip => "SKIP",
        };
        println!("{mark}  {:<16} {:<width$}  {}", c.driver, c.name, c.detail);
    }
    let count = |v: Verdict| all.iter().filter(|c| c.verdict == v).count();
    let no_lifecycle: Vec<&str> = all
        .iter()
        .filter(|c| c.verdict == Verdict::Skip && c.name == LIFECYCLE)
        .map(|c| c.driver.as_str())
        .collect();
    for d in &no_lifecycle {
        let (options, _) = example_options(d);
        println!(
            "\nThe volume lifecycle was NOT run for {d}: only the probe and the error paths were checked. \
             Run it by giving the options of a test volume (its flexVolume.options map): \
             flexvol conformance --driver {d} --options '{options}'"
        );
    }
    let no_bad: Vec<&str> = all
        .iter()
        .filter(|c| c.verdict == Verdict::Skip && c.name == BAD_OPTIONS)
        .map(|c| c.driver.as_str())
        .collect();
    for d in &no_bad {
        let (_, bad) = example_options(d);
        println!(
            "Driver-specific error paths were NOT run for {d}: add --bad-options JSON (repeatable) with options the driver must refuse, \
             e.g. {}",
            bad.iter()
                .map(|b| format!("--bad-options '{b}'"))
                .collect::<Vec<_>>()
                .join(" ")
        );
    }
    for n in notes {
        println!("NOTE: {n}");
    }
    println!(
        "\nconformance: {} passed, {} failed, {} skipped (not run)",
        count(Verdict::Pass),
        count(Verdict::Fail),
        count(Verdict::Skip)
    );
}

/// The first hostPath root of this node's config (the default when there is no usable config).
fn first_hostpath_root() -> PathBuf {
    crate::node::config::Config::load()
        .unwrap_or_default()
        .hostpath
        .roots()
        .into_iter()
        .next()
        .unwrap_or_else(|| PathBuf::from("/srv/flexvol"))
}

/// Example `--options` and `--bad-options` for a driver, by its kind (the part after `/`): each
/// driver's own keys, never another kind's. Other vendors' drivers get placeholders.
fn example_options(driver: &str) -> (String, Vec<String>) {
    match driver.rsplit('/').next().unwrap_or("") {
        "hostpath" => {
            let root = first_hostpath_root();
            let r = root.display();
            (
                format!(r#"{{"path":"{r}/conformance","type":"DirectoryOrCreate"}}"#),
                vec![
                    format!(r#"{{"path":"{r}/does-not-exist","type":"Directory"}}"#),
                    r#"{"type":"Directory"}"#.to_owned(),
                ],
            )
        }
        "nfs" => (
            r#"{"server":"SERVER","share":"/EXPORT"}"#.to_owned(),
            vec![
                r#"{"share":"/EXPORT"}"#.to_owned(),
                r#"{"server":"SERVER","share":"/EXPORT","mountOptions":"suid"}"#.to_owned(),
            ],
        ),
        "lvm" => (
            r#"{"volumegroup":"VG","volumeID":"conformance","size":"64Mi"}"#.to_owned(),
            vec![
                r#"{"volumeID":"conformance","size":"64Mi"}"#.to_owned(),
                r#"{"volumegroup":"VG","volumeID":"../escape","size":"64Mi"}"#.to_owned(),
            ],
        ),
        _ => ("OPTIONS".to_owned(), vec!["OPTIONS".to_owned()]),
    }
}

/// A warning when a flexvol hostPath driver is judged with a `path` outside this node's hostPath
/// roots: its lifecycle then fails by policy, not by a fault of the driver.
fn path_notes(drivers: &[String], user: Option<&BTreeMap<String, String>>) -> Vec<String> {
    let Some(path) = user.and_then(|u| u.get("path")) else {
        return Vec::new();
    };
    if !drivers.iter().any(|d| d.ends_with("/hostpath")) {
        return Vec::new();
    }
    match crate::node::config::Config::load() {
        Ok(c) => outside_roots(path, &c.hostpath.roots())
            .into_iter()
            .collect(),
        Err(_) => Vec::new(),
    }
}

/// The note for a hostPath `path` outside `roots`, if it is.
fn outside_roots(path: &str, roots: &[PathBuf]) -> Option<String> {
    if roots.iter().any(|r| Path::new(path).starts_with(r)) {
        return None;
    }
    let list = roots
        .iter()
        .map(|r| r.display().to_string())
        .collect::<Vec<_>>()
        .join(", ");
    Some(format!(
        "--options path {path} is outside this node's hostPath roots ({list}): flexvol/hostpath refuses it, so its lifecycle fails by policy; use a path under them, or add a root to hostpath.allowedRoots in the node config (docs/configuration.md)"
    ))
}

/// A JSON object of strings, as the `flexVolume.options` map.
fn parse_options(s: &str) -> Result<BTreeMap<String, String>, String> {
    serde_json::from_str(s)
        .map_err(|e| format!("not a JSON object of strings (the flexVolume.options map): {e}"))
}

/// Lazily detaches every mount at or below `root` (deepest first) and names them.
fn detach_leftovers(root: &Path) -> Vec<String> {
    let Ok(table) = MountTable::read() else {
        return vec!["(mount table unreadable)".into()];
    };
    let mut left: Vec<PathBuf> = table
        .entries
        .iter()
        .filter(|e| e.mount_point.starts_with(root))
        .map(|e| e.mount_point.clone())
        .collect();
    left.sort_by_key(|p| std::cmp::Reverse(p.as_os_str().len()));
    for p in &left {
        let _ = SysMounter.unmount(p, UnmountMode::Detach);
    }
    left.iter().map(|p| p.display().to_string()).collect()
}

fn tempfile_dir() -> std::io::Result<PathBuf> {
    let p = std::env::temp_dir().join(format!("flexvol-conformance.{}", std::process::id()));
    std::fs::create_dir_all(&p)?;
    Ok(p)
}

fn judge_driver(
    a: &ConformanceArgs,
    full_name: &str,
    user: Option<&BTreeMap<String, String>>,
    bad: &[BTreeMap<String, String>],
    kubelet_root: &Path,
) -> Vec<Check> {
    let (vendor, exec_name) = match full_name.split_once('/') {
        Some((v, n)) if !v.is_empty() && !n.is_empty() && !n.contains('/') => (v, n),
        _ => {
            return vec![Check {
                driver: full_name.into(),
                name: "driver name is vendor/name".into(),
                verdict: Verdict::Fail,
                detail: "kubelet's detach after a controller restart splits <vendor>/<name>/<volume> into exactly 3 parts".into(),
            }];
        }
    };
    let path = a
        .plugin_dir
        .join(format!("{vendor}~{exec_name}"))
        .join(exec_name);
    let mut d = Driver::new(full_name, path.clone(), Duration::from_secs(a.timeout));
    let meta = std::fs::metadata(&path);
    let exe_ok = meta
        .as_ref()
        .is_ok_and(|m| m.is_file() && m.mode() & 0o111 != 0);
    if !d.check(
        "installed as <dir>/<vendor>~<name>/<name>, executable",
        exe_ok,
        path.display().to_string(),
    ) {
        return d.checks;
    }

    // Probe: init (only Success loads the plugin), twice, fast.
    let e = d.exec(&Call::Init.to_argv());
    let init = match &e.decoded {
        Err(err) => Err(format!(
            "{err}; output: {:?}",
            String::from_utf8_lossy(&e.output)
        )),
        Ok(_) => judge_init(&e.output, e.code, None),
    };
    let caps = match init {
        Ok(r) => {
            d.check(
                "init: Success with a capabilities object, exit 0",
                true,
                if r.announced {
                    format!("{:?}", r.caps)
                } else {
                    "no capabilities: kubelet assumes attach, selinuxRelabel, fsGroup and requiresFSResize".into()
                },
            );
            r.caps
        }
        Err(why) => {
            d.check(
                "init: Success with a capabilities object, exit 0",
                false,
                why,
            );
            return d.checks;
        }
    };
    d.check(
        "init: under 1 s",
        e.elapsed < Duration::from_secs(1),
        format!("{:.1} ms", e.elapsed.as_secs_f64() * 1e3),
    );
    let again = d.exec(&Call::Init.to_argv());
    let same = judge_init(&again.output, again.code, None).is_ok_and(|r| r.caps == caps);
    d.check("init: same answer twice", same, "");

    // Verbs kubelet may send that the driver does not know.
    // Not a verb of the grammar, with an argument, as a newer kubelet might send.
    let unknown = d.exec(&[
        "flexvol-conformance-unknown-verb".to_owned(),
        "{}".to_owned(),
    ]);
    let ok = matches!(&unknown.decoded, Ok(st) if st.status == "Not supported")
        && unknown.code == Some(0);
    d.check(
        "unknown verb: \"Not supported\", exit 0",
        ok,
        format!("{:?}", String::from_utf8_lossy(&unknown.output).trim()),
    );

    match user {
        Some(user) => lifecycle::lifecycle(a, &mut d, caps, vendor, exec_name, user, kubelet_root),
        None => d.skip(
            LIFECYCLE,
            "not run: no --options given (the flexVolume.options of a test volume)",
        ),
    }
    errors::error_paths(a, &mut d, caps, vendor, exec_name, bad, kubelet_root);

    let n = d.calls;
    let dis = d.disagreements.clone();
    d.check(
        "exit code agrees with status on every call (0 for Success and Not supported; any for Failure)",
        dis.is_empty(),
        if dis.is_empty() {
            format!("{n} calls")
        } else {
            dis.join("; ")
        },
    );
    d.checks
}

#[cfg(test)]
mod hint_tests {
    use super::*;

    /// Each kind's hint uses that kind's keys only: no hostPath `path` for NFS or LVM.
    #[test]
    fn hints_are_per_driver() {
        let keys = |j: &str| -> Vec<String> {
            serde_json::from_str::<BTreeMap<String, String>>(j)
                .unwrap()
                .into_keys()
                .collect()
        };
        let (o, bad) = example_options("flexvol/hostpath");
        assert!(keys(&o).contains(&"path".to_owned()), "{o}");
        assert_eq!(bad.len(), 2);
        let (o, bad) = example_options("example.com/nfs");
        assert_eq!(keys(&o), ["server", "share"]);
        for b in bad.iter().chain([&o]) {
            assert!(!keys(b).contains(&"path".to_owned()), "{b}");
        }
        let (o, bad) = example_options("flexvol/lvm");
        assert!(keys(&o).contains(&"volumegroup".to_owned()), "{o}");
        for b in bad.iter().chain([&o]) {
            assert!(!keys(b).contains(&"path".to_owned()), "{b}");
        }
        assert_eq!(example_options("acme/block").0, "OPTIONS");
    }

    #[test]
    fn a_path_outside_the_roots_is_named() {
        let roots = [PathBuf::from("/srv/flexvol")];
        assert_eq!(outside_roots("/srv/flexvol/conformance", &roots), None);
        let n = outside_roots("/srv/conformance", &roots).unwrap();
        assert!(
            n.contains("outside this node's hostPath roots (/srv/flexvol)"),
            "{n}"
        );
        assert!(n.contains("hostpath.allowedRoots"), "{n}");
    }
}
