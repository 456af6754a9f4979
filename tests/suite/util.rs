//! Test harness: runs the real binary the way kubelet does and checks the protocol invariants on
//! every single call (one JSON object plus newline on stdout, nothing on stderr, exit code matching
//! the status), so no test can forget them.

#![allow(dead_code)]

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The binary under test.
pub fn binary() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_flexvol"))
}

/// A parsed reply.
#[derive(Debug, Clone)]
pub struct Reply {
    pub json: Value,
    pub code: i32,
}

impl Reply {
    pub fn status(&self) -> &str {
        self.json["status"].as_str().unwrap_or("")
    }
    pub fn message(&self) -> &str {
        self.json["message"].as_str().unwrap_or("")
    }
    #[track_caller]
    pub fn ok(&self) -> &Self {
        assert_eq!(
            self.status(),
            "Success",
            "expected Success, got {}",
            self.json
        );
        self
    }
    #[track_caller]
    pub fn failed(&self, needle: &str) -> &Self {
        assert_eq!(
            self.status(),
            "Failure",
            "expected Failure, got {}",
            self.json
        );
        assert!(
            self.message().contains(needle),
            "message {:?} should contain {needle:?}",
            self.message()
        );
        self
    }
    #[track_caller]
    pub fn not_supported(&self) -> &Self {
        assert_eq!(self.json, serde_json::json!({"status": "Not supported"}));
        self
    }
}

/// Checks what kubelet's `CombinedOutput` + `json.Unmarshal` would see.
#[track_caller]
pub fn check_protocol(stdout: &[u8], stderr: &[u8], code: Option<i32>) -> Reply {
    assert!(
        stderr.is_empty(),
        "stderr must stay empty, got {:?}",
        String::from_utf8_lossy(stderr)
    );
    let text = std::str::from_utf8(stdout).expect("stdout is UTF-8");
    assert!(
        text.ends_with('\n') && text.matches('\n').count() == 1,
        "exactly one line expected: {text:?}"
    );
    let mut values = serde_json::Deserializer::from_str(text).into_iter::<Value>();
    let json = values.next().expect("one JSON value").expect("valid JSON");
    assert!(
        values.next().is_none(),
        "more than one JSON value: {text:?}"
    );
    assert!(json.is_object(), "reply must be an object: {text:?}");
    let status = json["status"].as_str().expect("status is a string");
    let code = code.expect("exited normally, not by a signal");
    match status {
        "Success" | "Not supported" => assert_eq!(code, 0, "exit code for {status}: {text}"),
        "Failure" => {
            // 0: kubelet returns the same error either way, and logs the whole argv (options,
            // tokens) only after a non-zero exit (issue #32, item 12). 1 only for the answer to a
            // signal, which kubelet's own timeout needs to see as an exec error.
            let interrupted = json["message"]
                .as_str()
                .unwrap_or("")
                .contains(" was interrupted by ");
            assert_eq!(
                code,
                i32::from(interrupted),
                "exit code for Failure: {text}"
            );
            assert!(
                !json["message"].as_str().unwrap_or("").is_empty(),
                "a Failure must say why: {text}"
            );
        }
        other => panic!("status {other:?} is not one kubelet knows"),
    }
    if let Some(c) = json.get("capabilities") {
        assert!(c.is_object(), "capabilities must never be null: {text}");
        assert!(c.as_object().unwrap().values().all(Value::is_boolean));
    }
    if let Some(a) = json.get("attached") {
        assert!(a.is_boolean());
    }
    Reply { json, code }
}

/// A private world: plugin dir with the three driver names, config, state, run and log dirs.
pub struct Env {
    pub dir: tempfile::TempDir,
    pub config: PathBuf,
    pub log: PathBuf,
    pub state: PathBuf,
    pub run: PathBuf,
    pub plugins: PathBuf,
}

impl Env {
    pub fn new() -> Self {
        Self::with_config(serde_json::json!({}))
    }

    /// `extra` keys are merged into the generated config.
    pub fn with_config(extra: Value) -> Self {
        let dir = tempfile::Builder::new()
            .prefix("flexvol-test.")
            .tempdir()
            .unwrap();
        let root = std::fs::canonicalize(dir.path()).unwrap();
        let plugins = root.join("plugins");
        for d in ["hostpath", "nfs", "lvm"] {
            let p = plugins.join(format!("flexvol~{d}"));
            std::fs::create_dir_all(&p).unwrap();
            std::os::unix::fs::symlink(binary(), p.join(d)).unwrap();
        }
        // The test's own directory is the hostPath root (the default root, /srv/flexvol, is
        // the node's); tests of the default policy override "hostpath".
        let mut cfg = serde_json::json!({
            "stateDir": root.join("state"),
            "runDir": root.join("run"),
            "logFile": root.join("flexvol.log"),
            "hostpath": {"allowedRoots": [root]},
        });
        for (k, v) in extra.as_object().unwrap() {
            cfg[k] = v.clone();
        }
        let config = root.join("config.json");
        std::fs::write(&config, serde_json::to_vec(&cfg).unwrap()).unwrap();
        Self {
            config,
            log: root.join("flexvol.log"),
            state: root.join("state"),
            run: root.join("run"),
            plugins,
            dir,
        }
    }

    /// Merges `extra` into the config file.
    pub fn reconfigure(&self, extra: Value) {
        let mut cfg: Value = serde_json::from_slice(&std::fs::read(&self.config).unwrap()).unwrap();
        for (k, v) in extra.as_object().unwrap() {
            cfg[k] = v.clone();
        }
        std::fs::write(&self.config, serde_json::to_vec(&cfg).unwrap()).unwrap();
    }

    pub fn root(&self) -> PathBuf {
        std::fs::canonicalize(self.dir.path()).unwrap()
    }

    /// The installed path of a driver, as kubelet execs it (argv[0] is this full path).
    pub fn driver(&self, name: &str) -> PathBuf {
        self.plugins.join(format!("flexvol~{name}")).join(name)
    }

    pub fn command(&self, driver: &str, args: &[&str]) -> Command {
        let mut c = Command::new(self.driver(driver));
        c.args(args)
            .env("FLEXVOL_CONFIG", &self.config)
            .stdin(Stdio::null());
        c
    }

    #[track_caller]
    pub fn call(&self, driver: &str, args: &[&str]) -> Reply {
        self.call_env(driver, args, &[])
    }

    #[track_caller]
    pub fn call_env(&self, driver: &str, args: &[&str], env: &[(&str, &str)]) -> Reply {
        let mut c = self.command(driver, args);
        for (k, v) in env {
            c.env(k, v);
        }
        let out = c.output().expect("run driver");
        check_protocol(&out.stdout, &out.stderr, out.status.code())
    }

    /// Runs a call that must die by SIGKILL at `checkpoint` (`FLEXVOL_TEST_KILL_AT`), proving the
    /// step was reached; a killed driver has printed nothing.
    #[track_caller]
    pub fn killed_at(&self, driver: &str, args: &[&str], checkpoint: &str) {
        self.killed_at_env(driver, args, checkpoint, &[]);
    }

    /// As [`Env::killed_at`], with `env` added to the driver's environment (e.g.
    /// `FLEXVOL_TEST_KILL_ONCE`).
    #[track_caller]
    pub fn killed_at_env(
        &self,
        driver: &str,
        args: &[&str],
        checkpoint: &str,
        env: &[(&str, &str)],
    ) {
        use std::os::unix::process::ExitStatusExt;
        let mut c = self.command(driver, args);
        for (k, v) in env {
            c.env(k, v);
        }
        let out = c
            .env("FLEXVOL_TEST_KILL_AT", checkpoint)
            .output()
            .expect("run driver");
        assert_eq!(
            out.status.signal(),
            Some(9),
            "{checkpoint} was not reached: {:?}",
            String::from_utf8_lossy(&out.stdout)
        );
        assert!(
            out.stdout.is_empty() && out.stderr.is_empty(),
            "a killed driver prints nothing"
        );
    }

    /// A fresh directory (like kubelet's pod volume dir), created.
    pub fn mkdir(&self, rel: &str) -> PathBuf {
        let p = self.root().join(rel);
        std::fs::create_dir_all(&p).unwrap();
        p
    }

    /// A kubelet-shaped pod volume directory under a fake kubelet root, created.
    pub fn pod_dir(&self, uid: &str, vol: &str) -> PathBuf {
        self.mkdir(&format!(
            "kubelet/pods/{uid}/volumes/flexvol~hostpath/{vol}"
        ))
    }

    /// Mount points at or below our temp dir.
    pub fn mounts(&self) -> Vec<PathBuf> {
        mounts_under(&self.root())
    }

    pub fn log_lines(&self) -> Vec<Value> {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).expect("log lines are JSON"))
            .collect()
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        // Never leave mounts behind, even when a test failed halfway (deepest first).
        let mut m = self.mounts();
        m.sort_by_key(|p| std::cmp::Reverse(p.as_os_str().len()));
        for p in m {
            let _ = nix::mount::umount2(&p, nix::mount::MntFlags::MNT_DETACH);
        }
    }
}

/// kubelet's options for a pod's `mount` (docs/protocol.md §12.3): kubelet's own keys (pod `web-0`
/// in `team-a`, PV `pv-1`, read-write), then `volume` (the backend's options), then `extra`, each
/// merged over the one before. The suite's one options builder: a test says only what differs.
pub fn mount_options(volume: Value, extra: Value) -> String {
    let mut j = serde_json::json!({
        "kubernetes.io/fsType": "",
        "kubernetes.io/pod.name": "web-0",
        "kubernetes.io/pod.namespace": "team-a",
        "kubernetes.io/pod.uid": "6f3c1b8e",
        "kubernetes.io/pvOrVolumeName": "pv-1",
        "kubernetes.io/readwrite": "rw",
        "kubernetes.io/serviceAccount.name": "default",
    });
    for layer in [volume, extra] {
        for (k, v) in layer.as_object().unwrap() {
            j[k] = v.clone();
        }
    }
    j.to_string()
}

/// [`mount_options`] of a hostPath volume at `path`, with `extra` merged in.
pub fn hostpath_options(path: &Path, extra: Value) -> String {
    mount_options(serde_json::json!({ "path": path }), extra)
}

/// Runs a program and asserts it succeeded; returns its stdout. The guest tests' one runner of
/// system tools (lvm, losetup, mkfs, exportfs, tc, ...); `LVM_SUPPRESS_FD_WARNINGS` keeps lvm's
/// leaked-descriptor chatter out of the output (no other tool reads it).
#[track_caller]
/// Runs `cmd` with stdin closed: its success and its stdout followed by its stderr.
pub fn run_joined(cmd: &mut std::process::Command) -> (bool, String) {
    let out = cmd.stdin(std::process::Stdio::null()).output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr),
    )
}

pub fn run(tool: &str, args: &[&str]) -> String {
    let out = Command::new(tool)
        .args(args)
        .env("LVM_SUPPRESS_FD_WARNINGS", "1")
        .output()
        .unwrap_or_else(|e| panic!("{tool}: {e}"));
    assert!(
        out.status.success(),
        "{tool} {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Mount points at or below `dir`, from mountinfo.
pub fn mounts_under(dir: &Path) -> Vec<PathBuf> {
    let t = flexvol::sys::mountinfo::MountTable::read().unwrap();
    t.entries
        .iter()
        .filter(|e| e.mount_point.starts_with(dir))
        .map(|e| e.mount_point.clone())
        .collect()
}

/// Whether we run as root (the root tier needs it).
pub fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// The root tier runs only as root. Skipping it takes an explicit switch, and says so loudly.
#[macro_export]
macro_rules! require_root {
    () => {
        if !$crate::util::is_root() {
            if std::env::var_os("FLEXVOL_SKIP_ROOT_TESTS").is_some() {
                eprintln!("SKIPPED (FLEXVOL_SKIP_ROOT_TESTS is set): {} needs root", module_path!());
                return;
            }
            panic!("this test needs root (real mounts); run as root or set FLEXVOL_SKIP_ROOT_TESTS=1 to skip it explicitly");
        }
    };
}
