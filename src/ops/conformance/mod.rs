//! `flexvol conformance`: judge any installed FlexVolume driver the way kubelet and
//! kube-controller-manager would run it, and print a table of named checks.
//!
//! It is written against the protocol (reference §1, §2, §12), not against flexvol:
//! - every call is an exec of `<plugin-dir>/<vendor>~<name>/<name>` with argv[0] the full path,
//!   stdin `/dev/null`, and stdout and stderr merged into one pipe read to end of file (Go's
//!   `CombinedOutput`), so stray stderr output or a helper holding the pipe shows up as kubelet
//!   would see it;
//! - the reply is judged with Go's `encoding/json` rules: exactly one JSON value, keys matched
//!   case-insensitively, status strings compared exactly, strict types, `capabilities` never null;
//! - options are built like kubelet's `NewOptionsForDriver`: sorted keys, Go's HTML escaping, the
//!   defaults first and user options last, pod keys only on `mount`;
//! - kubelet's own steps around calls are replayed: create the directory (0750), skip the call when
//!   it is already a mount point by kubelet's device-number test, remove the directory after a
//!   successful teardown, and cache "Not supported" per verb, using kubelet's default instead.

#![allow(clippy::print_stdout)]

use crate::sys::mountinfo::MountTable;
use clap::Args;
use serde_json::Value;
use std::collections::{BTreeMap, HashSet};
use std::io::Read;
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Arguments of `flexvol conformance`.
#[derive(Args, Debug, Clone)]
pub struct ConformanceArgs {
    /// Plugin directory holding `<vendor>~<name>/<name>`.
    #[arg(long, value_name = "DIR", default_value = crate::ops::install::DEFAULT_PLUGIN_DIR)]
    pub plugin_dir: PathBuf,
    /// Driver to judge, as `vendor/name` (repeatable).
    #[arg(long = "driver", value_name = "VENDOR/NAME", required = true)]
    pub drivers: Vec<String>,
    /// User options of a test volume (the `flexVolume.options` map, JSON). With it, a full volume
    /// lifecycle is replayed: attach-side verbs for attachable drivers, mount, unmount and teardown.
    #[arg(long, value_name = "JSON")]
    pub options: Option<String>,
    /// `flexVolume.fsType` of the test volume.
    #[arg(long, default_value = "", value_name = "TYPE")]
    pub fs_type: String,
    /// PV name of the test volume (`kubernetes.io/pvOrVolumeName`).
    #[arg(long, default_value = "conformance-vol", value_name = "NAME")]
    pub volume_name: String,
    /// Node name passed to attach-side verbs.
    #[arg(long, default_value = "conformance-node", value_name = "NAME")]
    pub node: String,
    /// kubelet root to create pod and global mount directories under (default: a temporary one).
    #[arg(long, value_name = "DIR")]
    pub kubelet_root: Option<PathBuf>,
    /// Extra pods mounting the same volume at once (non-attachable drivers).
    #[arg(long, default_value_t = 4, value_name = "N")]
    pub parallel: usize,
    /// Per-call timeout in seconds (kubelet has none for most verbs; we do not wait forever).
    #[arg(long, default_value_t = 120, value_name = "SECONDS")]
    pub timeout: u64,
}

/// Capabilities as kubelet decodes them, defaults included.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Caps {
    /// attach (default true)
    pub attach: bool,
    /// selinuxRelabel (default true)
    pub selinux_relabel: bool,
    /// supportsMetrics (default false)
    pub supports_metrics: bool,
    /// fsGroup (default true)
    pub fs_group: bool,
    /// requiresFSResize (default true)
    pub requires_fs_resize: bool,
}

impl Default for Caps {
    fn default() -> Self {
        Self {
            attach: true,
            selinux_relabel: true,
            supports_metrics: false,
            fs_group: true,
            requires_fs_resize: true,
        }
    }
}

/// A reply decoded the way kubelet's `handleCmdResponse` does.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GoStatus {
    /// `status`, empty when absent.
    pub status: String,
    /// `message`.
    pub message: String,
    /// `device`.
    pub device: String,
    /// `attached` (false when absent: kubelet reads that as detached).
    pub attached: bool,
    /// `capabilities`: `None` absent, `Some(None)` JSON null (kubelet panics on that in init).
    pub capabilities: Option<Option<Caps>>,
}

/// Decodes driver output as Go's `json.Unmarshal` into kubelet's `DriverStatus` would.
pub fn decode_like_go(output: &[u8]) -> Result<GoStatus, String> {
    let text = std::str::from_utf8(output).map_err(|_| "output is not UTF-8".to_string())?;
    if text.trim().is_empty() {
        return Err("unexpected end of JSON input (the driver printed nothing)".into());
    }
    let value: Value = serde_json::from_str(text).map_err(|e| {
        let first = text.trim_start().chars().next().unwrap_or(' ');
        format!("invalid JSON as kubelet reads it ({e}; output starts with {first:?})")
    })?;
    let mut st = GoStatus::default();
    let obj = match value {
        Value::Object(o) => o,
        Value::Null => return Ok(st),
        other => {
            return Err(format!(
                "json: cannot unmarshal {} into Go value of type DriverStatus",
                go_kind(&other)
            ));
        }
    };
    // Go matches keys case-insensitively; with duplicates the last one wins.
    for (k, v) in obj {
        let field = |name: &str| k.eq_ignore_ascii_case(name);
        let string = |v: &Value, name: &str| match v {
            Value::String(s) => Ok(Some(s.clone())),
            Value::Null => Ok(None),
            other => Err(format!(
                "json: cannot unmarshal {} into field {name} of type string",
                go_kind(other)
            )),
        };
        if field("status") {
            if let Some(s) = string(&v, "status")? {
                st.status = s;
            }
        } else if field("message") {
            if let Some(s) = string(&v, "message")? {
                st.message = s;
            }
        } else if field("device") {
            if let Some(s) = string(&v, "device")? {
                st.device = s;
            }
        } else if field("volumeName") {
            string(&v, "volumeName")?;
        } else if field("attached") {
            match v {
                Value::Bool(b) => st.attached = b,
                Value::Null => {}
                other => {
                    return Err(format!(
                        "json: cannot unmarshal {} into field attached of type bool",
                        go_kind(&other)
                    ));
                }
            }
        } else if field("volumeNewSize") {
            match v {
                Value::Number(n) if n.is_i64() => {}
                Value::Null => {}
                other => {
                    return Err(format!(
                        "json: cannot unmarshal {} into field volumeNewSize of type int64",
                        go_kind(&other)
                    ));
                }
            }
        } else if field("capabilities") {
            st.capabilities = Some(match v {
                Value::Null => None,
                Value::Object(c) => {
                    let mut caps = Caps::default();
                    for (ck, cv) in c {
                        let Value::Bool(b) = cv else {
                            if cv.is_null() {
                                continue;
                            }
                            return Err(format!(
                                "json: cannot unmarshal {} into capability {ck} of type bool",
                                go_kind(&cv)
                            ));
                        };
                        match ck.to_ascii_lowercase().as_str() {
                            "attach" => caps.attach = b,
                            "selinuxrelabel" => caps.selinux_relabel = b,
                            "supportsmetrics" => caps.supports_metrics = b,
                            "fsgroup" => caps.fs_group = b,
                            "requiresfsresize" => caps.requires_fs_resize = b,
                            _ => {}
                        }
                    }
                    Some(caps)
                }
                other => {
                    return Err(format!(
                        "json: cannot unmarshal {} into field capabilities",
                        go_kind(&other)
                    ));
                }
            });
        }
    }
    Ok(st)
}

fn go_kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "bool",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// Serializes an options map byte for byte as Go's `json.Marshal` of `map[string]string` does:
/// sorted keys, no spaces, `<`, `>`, `&`, U+2028 and U+2029 escaped.
pub fn go_json(map: &BTreeMap<String, String>) -> String {
    let s = serde_json::to_string(map).unwrap_or_default();
    s.replace('<', "\\u003c")
        .replace('>', "\\u003e")
        .replace('&', "\\u0026")
        .replace('\u{2028}', "\\u2028")
        .replace('\u{2029}', "\\u2029")
}

/// One named check.
#[derive(Debug, Clone)]
pub struct Check {
    /// Driver it is about.
    pub driver: String,
    /// What was checked.
    pub name: String,
    /// Passed?
    pub ok: bool,
    /// Why it failed, or a note.
    pub detail: String,
}

/// One exec's result.
struct Exec {
    output: Vec<u8>,
    code: Option<i32>,
    elapsed: Duration,
    decoded: Result<GoStatus, String>,
}

struct Driver {
    name: String,
    path: PathBuf,
    unsupported: HashSet<String>,
    timeout: Duration,
    checks: Vec<Check>,
    calls: usize,
    disagreements: Vec<String>,
}

/// What a call came to, from kubelet's point of view.
enum Outcome {
    /// Success, with the decoded reply.
    Success(GoStatus),
    /// "Not supported" (now cached): kubelet uses its default.
    NotSupported,
    /// Anything else: the error kubelet would report.
    Error(String),
}

impl Driver {
    fn check(&mut self, name: &str, ok: bool, detail: impl Into<String>) -> bool {
        self.checks.push(Check {
            driver: self.name.clone(),
            name: name.into(),
            ok,
            detail: detail.into(),
        });
        ok
    }

    fn exec(&mut self, args: &[String]) -> Exec {
        self.calls += 1;
        let start = Instant::now();
        let fail = |msg: String, start: Instant| Exec {
            output: Vec::new(),
            code: None,
            elapsed: start.elapsed(),
            decoded: Err(msg),
        };
        // One pipe for both streams, as Go's CombinedOutput.
        let (reader, writer) = match std::io::pipe() {
            Ok(p) => p,
            Err(e) => return fail(format!("pipe: {e}"), start),
        };
        let writer2 = match writer.try_clone() {
            Ok(w) => w,
            Err(e) => return fail(format!("pipe: {e}"), start),
        };
        let mut cmd = Command::new(&self.path);
        cmd.args(args)
            .stdin(Stdio::null())
            .stdout(writer)
            .stderr(writer2);
        let mut child = match cmd.spawn() {
            Ok(c) => c,
            Err(e) => {
                return fail(
                    format!("exec failed ({e}); kubelet reports: unexpected end of JSON input"),
                    start,
                );
            }
        };
        drop(cmd);
        let (tx, rx) = std::sync::mpsc::channel();
        let mut reader = reader;
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            let _ = reader.read_to_end(&mut buf);
            let _ = tx.send(buf);
        });
        // Read to end of pipe, like kubelet: a helper still holding it keeps us waiting.
        let output = match rx.recv_timeout(self.timeout) {
            Ok(b) => b,
            Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                return fail(
                    format!(
                        "no end of output within {}s (the driver, or a helper it left holding stdout/stderr, kept the pipe open; kubelet would wait forever)",
                        self.timeout.as_secs()
                    ),
                    start,
                );
            }
        };
        let status = child.wait().ok();
        let code = status.and_then(|s| s.code());
        let decoded = decode_like_go(&output);
        let elapsed = start.elapsed();
        if let Ok(st) = &decoded {
            let want = match st.status.as_str() {
                "Success" | "Not supported" => Some(0),
                _ => None,
            };
            let agrees = match (want, code) {
                (Some(0), Some(0)) => true,
                (Some(_), _) => false,
                (None, Some(c)) => c != 0,
                (None, None) => false,
            };
            if !agrees {
                self.disagreements.push(format!(
                    "{} -> status {:?} with exit {:?}",
                    args.join(" "),
                    st.status,
                    code
                ));
            }
        }
        Exec {
            output,
            code,
            elapsed,
            decoded,
        }
    }

    /// A call with kubelet's "Not supported" cache in front of it.
    fn call(&mut self, args: &[String]) -> Outcome {
        let verb = args.first().cloned().unwrap_or_default();
        if self.unsupported.contains(&verb) {
            return Outcome::NotSupported;
        }
        let e = self.exec(args);
        match e.decoded {
            Err(msg) => Outcome::Error(msg),
            Ok(st) if st.status == "Success" => Outcome::Success(st),
            Ok(st) if st.status == "Not supported" => {
                self.unsupported.insert(verb);
                Outcome::NotSupported
            }
            Ok(st) => Outcome::Error(format!(
                "{verb} command failed, status: {}, reason: {}",
                st.status, st.message
            )),
        }
    }
}

/// kubelet's `IsLikelyNotMountPoint`: a directory whose device differs from its parent's.
fn likely_mount_point(p: &Path) -> bool {
    match (std::fs::metadata(p), p.parent().map(std::fs::metadata)) {
        (Ok(a), Some(Ok(b))) => a.dev() != b.dev(),
        _ => false,
    }
}

/// Whether anything is mounted at `p` or directly inside it (file-like volumes), by mountinfo.
fn mounted_at_or_in(p: &Path) -> usize {
    MountTable::read()
        .map(|t| {
            t.entries
                .iter()
                .filter(|e| e.mount_point == p || e.mount_point.parent() == Some(p))
                .count()
        })
        .unwrap_or(0)
}

fn mkdir_0750(p: &Path) -> std::io::Result<()> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o750)
        .create(p)
}

/// Runs `flexvol conformance`; returns the exit code.
pub fn run(a: &ConformanceArgs) -> i32 {
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
    let mut all = Vec::new();
    for name in &a.drivers {
        all.extend(judge_driver(a, name, &kubelet_root));
    }
    let left = detach_leftovers(&kubelet_root);
    all.push(Check {
        driver: "(all)".into(),
        name: "nothing left mounted under the kubelet root".into(),
        ok: left.is_empty(),
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
    let width = all.iter().map(|c| c.name.len()).max().unwrap_or(10).min(70);
    for c in &all {
        let mark = if c.ok { "PASS" } else { "FAIL" };
        println!("{mark}  {:<16} {:<width$}  {}", c.driver, c.name, c.detail);
    }
    let failed = all.iter().filter(|c| !c.ok).count();
    println!(
        "\nconformance: {} passed, {} failed",
        all.len() - failed,
        failed
    );
    i32::from(failed > 0)
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
        let _ = nix::mount::umount2(
            p,
            nix::mount::MntFlags::MNT_DETACH | nix::mount::MntFlags::UMOUNT_NOFOLLOW,
        );
    }
    left.iter().map(|p| p.display().to_string()).collect()
}

fn tempfile_dir() -> std::io::Result<PathBuf> {
    let p = std::env::temp_dir().join(format!("flexvol-conformance.{}", std::process::id()));
    std::fs::create_dir_all(&p)?;
    Ok(p)
}

fn judge_driver(a: &ConformanceArgs, full_name: &str, kubelet_root: &Path) -> Vec<Check> {
    let (vendor, exec_name) = match full_name.split_once('/') {
        Some((v, n)) if !v.is_empty() && !n.is_empty() && !n.contains('/') => (v, n),
        _ => {
            return vec![Check {
                driver: full_name.into(),
                name: "driver name is vendor/name".into(),
                ok: false,
                detail: "kubelet's detach after a controller restart splits <vendor>/<name>/<volume> into exactly 3 parts".into(),
            }];
        }
    };
    let path = a
        .plugin_dir
        .join(format!("{vendor}~{exec_name}"))
        .join(exec_name);
    let mut d = Driver {
        name: full_name.into(),
        path: path.clone(),
        unsupported: HashSet::new(),
        timeout: Duration::from_secs(a.timeout),
        checks: Vec::new(),
        calls: 0,
        disagreements: Vec::new(),
    };
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
    let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    let e = d.exec(&s(&["init"]));
    let caps = match &e.decoded {
        Ok(st) if st.status == "Success" => match st.capabilities {
            Some(Some(c)) => {
                d.check(
                    "init: Success with a capabilities object",
                    true,
                    format!("{c:?}"),
                );
                Some(c)
            }
            Some(None) => {
                d.check(
                    "init: Success with a capabilities object",
                    false,
                    "\"capabilities\": null makes kubelet panic (kubernetes#52242)",
                );
                None
            }
            None => {
                d.check("init: Success with a capabilities object", true, "no capabilities: kubelet assumes attach, selinuxRelabel, fsGroup and requiresFSResize");
                Some(Caps::default())
            }
        },
        Ok(st) => {
            d.check(
                "init: Success with a capabilities object",
                false,
                format!(
                    "status {:?} {:?}: kubelet skips this driver",
                    st.status, st.message
                ),
            );
            None
        }
        Err(err) => {
            d.check(
                "init: Success with a capabilities object",
                false,
                format!("{err}; output: {:?}", String::from_utf8_lossy(&e.output)),
            );
            None
        }
    };
    let Some(caps) = caps else { return d.checks };
    d.check(
        "init: under 1 s",
        e.elapsed < Duration::from_secs(1),
        format!("{:.1} ms", e.elapsed.as_secs_f64() * 1e3),
    );
    d.check(
        "init: exit code 0",
        e.code == Some(0),
        format!("exit {:?}", e.code),
    );
    let again = d.exec(&s(&["init"]));
    let same = matches!(&again.decoded, Ok(st) if st.capabilities == Some(Some(caps)));
    d.check("init: same answer twice", same, "");

    // Verbs kubelet may send that the driver does not know.
    let unknown = d.exec(&s(&["flexvol-conformance-unknown-verb", "{}"]));
    let ok = matches!(&unknown.decoded, Ok(st) if st.status == "Not supported")
        && unknown.code == Some(0);
    d.check(
        "unknown verb: \"Not supported\", exit 0",
        ok,
        format!("{:?}", String::from_utf8_lossy(&unknown.output).trim()),
    );

    if let Some(user) = &a.options {
        let user: BTreeMap<String, String> = match serde_json::from_str(user) {
            Ok(m) => m,
            Err(e) => {
                d.check(
                    "--options is a JSON object of strings",
                    false,
                    e.to_string(),
                );
                return d.checks;
            }
        };
        lifecycle(a, &mut d, caps, vendor, exec_name, &user, kubelet_root);
    } else {
        d.check("volume lifecycle", true, "skipped: no --options given");
    }

    let n = d.calls;
    let dis = d.disagreements.clone();
    d.check(
        "exit code agrees with status on every call (0: Success/Not supported, non-0: Failure)",
        dis.is_empty(),
        if dis.is_empty() {
            format!("{n} calls")
        } else {
            dis.join("; ")
        },
    );
    d.checks
}

fn base_options(a: &ConformanceArgs, user: &BTreeMap<String, String>) -> BTreeMap<String, String> {
    let mut m = BTreeMap::new();
    m.insert("kubernetes.io/fsType".to_string(), a.fs_type.clone());
    m.insert(
        "kubernetes.io/pvOrVolumeName".to_string(),
        a.volume_name.clone(),
    );
    m.insert("kubernetes.io/readwrite".to_string(), "rw".to_string());
    // User options last: they override kubelet's own keys, as in NewOptionsForDriver.
    m.extend(user.clone());
    m
}

fn pod_options(base: &BTreeMap<String, String>, uid: &str) -> BTreeMap<String, String> {
    let mut m = base.clone();
    for (k, v) in [
        ("kubernetes.io/pod.name", format!("conformance-{uid}")),
        ("kubernetes.io/pod.namespace", "default".to_string()),
        ("kubernetes.io/pod.uid", uid.to_string()),
        ("kubernetes.io/serviceAccount.name", "default".to_string()),
    ] {
        m.entry(k.to_string()).or_insert(v);
    }
    m
}

fn lifecycle(
    a: &ConformanceArgs,
    d: &mut Driver,
    caps: Caps,
    vendor: &str,
    name: &str,
    user: &BTreeMap<String, String>,
    kubelet_root: &Path,
) {
    let base = base_options(a, user);
    let j = go_json(&base);
    let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();

    match d.call(&s(&["getvolumename", &j])) {
        Outcome::Error(e) => {
            d.check("getvolumename: Success or Not supported", false, e);
        }
        Outcome::Success(_) => {
            d.check(
                "getvolumename: Success or Not supported",
                true,
                "Success (kubelet ignores the name)",
            );
        }
        Outcome::NotSupported => {
            d.check(
                "getvolumename: Success or Not supported",
                true,
                "Not supported (cached)",
            );
        }
    }

    // Attach side (kube-controller-manager), then the node's device steps.
    let mut device = String::new();
    let global = kubelet_root
        .join("plugins/kubernetes.io/flexvolume")
        .join(vendor)
        .join(name)
        .join("mounts")
        .join(&a.volume_name);
    let mut global_mounted = false;
    if caps.attach {
        match d.call(&s(&["attach", &j, &a.node])) {
            Outcome::Success(st) => {
                device = st.device.clone();
                d.check("attach: Success", true, format!("device {:?}", st.device));
            }
            Outcome::NotSupported => {
                d.check(
                    "attach: Success",
                    true,
                    "Not supported: kubelet uses device \"\"",
                );
            }
            Outcome::Error(e) => {
                d.check("attach: Success", false, e);
                return;
            }
        }
        match d.call(&s(&["attach", &j, &a.node])) {
            Outcome::Error(e) => {
                d.check("attach twice: Success with the same device", false, e);
            }
            Outcome::Success(st) => {
                d.check(
                    "attach twice: Success with the same device",
                    st.device == device,
                    format!("{:?} then {:?}", device, st.device),
                );
            }
            Outcome::NotSupported => {}
        }
        match d.call(&s(&["isattached", &j, &a.node])) {
            Outcome::Success(st) => {
                d.check(
                    "isattached: attached true (Success without it means detached)",
                    st.attached,
                    "",
                );
            }
            Outcome::NotSupported => {
                d.check(
                    "isattached: attached true (Success without it means detached)",
                    true,
                    "Not supported (cached)",
                );
            }
            Outcome::Error(e) => {
                d.check(
                    "isattached: attached true (Success without it means detached)",
                    false,
                    e,
                );
            }
        }
        match d.call(&s(&["waitforattach", &device, &j])) {
            Outcome::Success(st) => {
                let ok = !st.device.is_empty() || device.is_empty();
                d.check(
                    "waitforattach: Success echoing the device",
                    ok,
                    format!("device {:?}", st.device),
                );
                device = st.device;
            }
            Outcome::NotSupported => {
                d.check(
                    "waitforattach: Success echoing the device",
                    true,
                    "Not supported: kubelet keeps the device",
                );
            }
            Outcome::Error(e) => {
                d.check("waitforattach: Success echoing the device", false, e);
                return;
            }
        }
        if let Err(e) = mkdir_0750(&global) {
            d.check(
                "mountdevice",
                false,
                format!("cannot create {}: {e}", global.display()),
            );
            return;
        }
        if likely_mount_point(&global) {
            d.check(
                "mountdevice",
                true,
                "skipped: already a mount point (kubelet would skip)",
            );
        } else {
            match d.call(&s(&["mountdevice", &global.to_string_lossy(), &device, &j])) {
                Outcome::Success(_) => {
                    global_mounted = MountTable::read().is_ok_and(|t| t.is_mount_point(&global));
                    d.check("mountdevice: Success and a real mount point (else unmountdevice is never called)", global_mounted, global.display().to_string());
                }
                Outcome::NotSupported => {
                    d.check(
                        "mountdevice",
                        true,
                        "Not supported: kubelet formats and mounts itself; not replayed here",
                    );
                    return;
                }
                Outcome::Error(e) => {
                    d.check("mountdevice: Success and a real mount point (else unmountdevice is never called)", false, e);
                    return;
                }
            }
            if let Outcome::Success(_) | Outcome::NotSupported =
                d.call(&s(&["mountdevice", &global.to_string_lossy(), &device, &j]))
            {
                let n = MountTable::read()
                    .map(|t| t.all_at(&global).count())
                    .unwrap_or(0);
                d.check(
                    "mountdevice twice: Success, still one mount",
                    n == 1,
                    format!("{n} mounts"),
                );
            } else {
                d.check(
                    "mountdevice twice: Success, still one mount",
                    false,
                    "the repeated call failed",
                );
            }
        }
    }

    // Pods: mount, repeat, parallel mounts, unmount, kubelet's rmdir.
    let pods: Vec<(String, PathBuf)> = (0..=if caps.attach { 0 } else { a.parallel })
        .map(|i| {
            let uid = format!("00000000-0000-4000-8000-{:012}", i + 1);
            let dir = kubelet_root
                .join("pods")
                .join(&uid)
                .join("volumes")
                .join(format!("{vendor}~{name}"))
                .join(&a.volume_name);
            (uid, dir)
        })
        .collect();
    let mount_one = |d: &mut Driver, uid: &str, dir: &Path| -> Result<&'static str, String> {
        mkdir_0750(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        if likely_mount_point(dir) {
            return Ok("skipped: already a mount point");
        }
        let jp = go_json(&pod_options(&base, uid));
        match d.call(&[String::from("mount"), dir.to_string_lossy().into_owned(), jp]) {
            Outcome::Success(_) => Ok("Success"),
            Outcome::NotSupported if caps.attach => {
                // kubelet's default: bind the global mount onto the pod dir.
                nix::mount::mount(Some(&global), dir, None::<&str>, nix::mount::MsFlags::MS_BIND, None::<&str>)
                    .map(|_| "Not supported: kubelet bind-mounted the global mount")
                    .map_err(|e| format!("kubelet's default bind failed: {e}"))
            }
            Outcome::NotSupported => Err("Not supported: kubelet would bind-mount an empty global directory (non-attachable drivers must implement mount)".into()),
            Outcome::Error(e) => {
                let _ = std::fs::remove_dir(dir);
                Err(e)
            }
        }
    };
    let (uid0, dir0) = pods[0].clone();
    match mount_one(d, &uid0, &dir0) {
        Ok(how) => {
            let n = mounted_at_or_in(&dir0);
            d.check(
                "mount: Success and the pod directory is mounted",
                n >= 1,
                format!("{how}; {n} mount(s)"),
            );
        }
        Err(e) => {
            d.check("mount: Success and the pod directory is mounted", false, e);
            teardown_global(a, d, &global, global_mounted);
            return;
        }
    }
    let before = mounted_at_or_in(&dir0);
    let jp = go_json(&pod_options(&base, &uid0));
    match d.call(&[
        String::from("mount"),
        dir0.to_string_lossy().into_owned(),
        jp,
    ]) {
        Outcome::Success(_) | Outcome::NotSupported => {
            let after = mounted_at_or_in(&dir0);
            d.check(
                "mount twice: Success, no second mount",
                after == before,
                format!("{before} then {after} mounts"),
            );
        }
        Outcome::Error(e) => {
            d.check("mount twice: Success, no second mount", false, e);
        }
    }
    if pods.len() > 1 {
        let results: Vec<Result<&'static str, String>> = std::thread::scope(|sc| {
            let handles: Vec<_> = pods[1..]
                .iter()
                .map(|(uid, dir)| {
                    let mut local = Driver {
                        name: d.name.clone(),
                        path: d.path.clone(),
                        unsupported: d.unsupported.clone(),
                        timeout: d.timeout,
                        checks: Vec::new(),
                        calls: 0,
                        disagreements: Vec::new(),
                    };
                    let mount_one = &mount_one;
                    sc.spawn(move || mount_one(&mut local, uid, dir))
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap_or_else(|_| Err("panicked".into())))
                .collect()
        });
        let bad: Vec<String> = results
            .iter()
            .filter_map(|r| r.as_ref().err().cloned())
            .collect();
        d.check(
            &format!("{} more pods mount the same volume at once", pods.len() - 1),
            bad.is_empty(),
            bad.join("; "),
        );
    }
    if caps.requires_fs_resize && caps.attach {
        d.check(
            "expandfs",
            true,
            "not replayed (needs a size change; the LVM guest tests cover it)",
        );
    }

    let mut left = Vec::new();
    for (_, dir) in &pods {
        if !dir.exists() {
            continue;
        }
        match d.call(&[String::from("unmount"), dir.to_string_lossy().into_owned()]) {
            Outcome::Success(_) => {}
            Outcome::NotSupported => {
                let _ = nix::mount::umount2(dir, nix::mount::MntFlags::empty());
            }
            Outcome::Error(e) => {
                left.push(format!("{}: {e}", dir.display()));
                continue;
            }
        }
        if mounted_at_or_in(dir) > 0 {
            left.push(format!("{} still mounted", dir.display()));
        } else if let Err(e) = std::fs::remove_dir(dir) {
            left.push(format!("kubelet's rmdir of {} fails: {e}", dir.display()));
        }
    }
    d.check(
        "unmount: Success, nothing left mounted, kubelet can remove the directory",
        left.is_empty(),
        left.join("; "),
    );

    // unmount of a directory that exists but was never mounted (kubelet calls it; it must succeed).
    let never = kubelet_root
        .join("pods/never-mounted/volumes")
        .join(format!("{vendor}~{name}"))
        .join(&a.volume_name);
    if mkdir_0750(&never).is_ok() {
        match d.call(&[
            String::from("unmount"),
            never.to_string_lossy().into_owned(),
        ]) {
            Outcome::Success(_) | Outcome::NotSupported => {
                d.check("unmount of a never-mounted directory: Success", true, "")
            }
            Outcome::Error(e) => d.check("unmount of a never-mounted directory: Success", false, e),
        };
        let _ = std::fs::remove_dir(&never);
    }
    teardown_global(a, d, &global, global_mounted);
}

fn teardown_global(a: &ConformanceArgs, d: &mut Driver, global: &Path, mounted: bool) {
    if !mounted {
        return;
    }
    // kubelet calls unmountdevice only for a real mount point, then removes the directory.
    if likely_mount_point(global) || MountTable::read().is_ok_and(|t| t.is_mount_point(global)) {
        match d.call(&[
            String::from("unmountdevice"),
            global.to_string_lossy().into_owned(),
        ]) {
            Outcome::Success(_) => {
                let still = MountTable::read().is_ok_and(|t| t.is_mount_point(global));
                let rm = if still {
                    Ok(())
                } else {
                    std::fs::remove_dir(global)
                };
                d.check(
                    "unmountdevice: Success, unmounted, directory removable",
                    !still && rm.is_ok(),
                    format!("{rm:?}"),
                );
            }
            Outcome::NotSupported => {
                let _ = nix::mount::umount2(global, nix::mount::MntFlags::empty());
                let _ = std::fs::remove_dir(global);
                d.check(
                    "unmountdevice",
                    true,
                    "Not supported: kubelet unmounted itself",
                );
            }
            Outcome::Error(e) => {
                d.check(
                    "unmountdevice: Success, unmounted, directory removable",
                    false,
                    e,
                );
            }
        }
    }
    match d.call(&[
        String::from("detach"),
        a.volume_name.clone(),
        a.node.clone(),
    ]) {
        Outcome::Success(_) | Outcome::NotSupported => d.check("detach: Success", true, ""),
        Outcome::Error(e) => d.check("detach: Success", false, e),
    };
    match d.call(&[
        String::from("detach"),
        a.volume_name.clone(),
        a.node.clone(),
    ]) {
        Outcome::Success(_) | Outcome::NotSupported => d.check("detach twice: Success", true, ""),
        Outcome::Error(e) => d.check("detach twice: Success", false, e),
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_decoding_rules() {
        let st =
            decode_like_go(br#"{"Status":"Success","CAPABILITIES":{"Attach":false}}"#).unwrap();
        assert_eq!(st.status, "Success");
        assert_eq!(
            st.capabilities,
            Some(Some(Caps {
                attach: false,
                ..Caps::default()
            }))
        );
        assert_eq!(
            decode_like_go(b"  {\"status\":\"Not supported\"}\n\n")
                .unwrap()
                .status,
            "Not supported"
        );
        assert_eq!(
            decode_like_go(br#"{"status":"Success","capabilities":null}"#)
                .unwrap()
                .capabilities,
            Some(None)
        );
        for bad in [
            &b""[..],
            b"I0101 log line\n{\"status\":\"Success\"}",
            b"{\"status\":\"Success\"}\nusage: foo",
            b"{\"status\":\"Success\"}{\"status\":\"Success\"}",
            br#"{"status":"Success","attached":"true"}"#,
            br#"{"status":"Success","capabilities":{"attach":"false"}}"#,
            br#"{"status":"Success","volumeNewSize":"1"}"#,
            b"[]",
        ] {
            assert!(
                decode_like_go(bad).is_err(),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
        // null is a valid document that leaves every field empty: a failure by status.
        assert_eq!(decode_like_go(b"null").unwrap().status, "");
    }

    #[test]
    fn options_are_serialized_like_go() {
        let m: BTreeMap<String, String> = [
            ("z".into(), "a<b>&c".into()),
            ("a".into(), "x\u{2028}".into()),
        ]
        .into_iter()
        .collect();
        assert_eq!(
            go_json(&m),
            r#"{"a":"x\u2028","z":"a\u003cb\u003e\u0026c"}"#
        );
    }
}
