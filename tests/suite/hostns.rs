//! Root tier: `flexvol provisioner --host-mount-namespace` (src/sys/hostns.rs) on this machine,
//! started by tests/cluster/hostns-run the way drivers/deploy/daemonset.yaml's container starts:
//! a PID namespace whose PID 1 is in this machine's mount namespace (hostPID), and a private
//! mount namespace (the container's view) in which the paths it must reach on the host are empty
//! tmpfs and the service account is bind-mounted at its in-cluster path. The API server here is a
//! closed port: what is proven is everything before the first connection (which namespace the
//! config, the tools' directory and the token are read in); a real API server and a rotated token
//! are the `in-cluster-token` and `token-rotation` scenarios of tests/cluster/provisioner-e2e with
//! `PROVISIONER_HOSTNS=1`, LVM and NFS its guest scenarios with the same switch.

use crate::require_root;
use crate::util::binary;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn hostns_run() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/cluster/hostns-run")
}

fn closed_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

/// `dir/stderr` and `dir/stdout` of a provisioner started by `cmd`.
fn spawn(mut cmd: Command, dir: &Path) -> Child {
    cmd.stdin(Stdio::null())
        .stdout(std::fs::File::create(dir.join("stdout")).unwrap())
        .stderr(std::fs::File::create(dir.join("stderr")).unwrap())
        .env_remove("KUBECONFIG")
        .spawn()
        .unwrap()
}

fn read(dir: &Path, name: &str) -> String {
    std::fs::read_to_string(dir.join(name)).unwrap_or_default()
}

/// Until `needle` is in `dir/stderr` or the process ends; then it is stopped. Returns the exit
/// code (`None`: it was still running) and stderr.
fn watch(mut child: Child, dir: &Path, needle: &str, limit: Duration) -> (Option<i32>, String) {
    let t0 = Instant::now();
    let mut code = None;
    while t0.elapsed() < limit {
        if let Some(st) = child.try_wait().unwrap() {
            code = Some(st.code().unwrap_or(-1));
            break;
        }
        if read(dir, "stderr").contains(needle) {
            // Give it a moment to fail after the line, if it is going to.
            std::thread::sleep(Duration::from_millis(1500));
            code = child.try_wait().unwrap().map(|st| st.code().unwrap_or(-1));
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    if code.is_none() {
        // hostns-run ends the PID namespace (and the provisioner in it) on SIGTERM.
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(i32::try_from(child.id()).unwrap()),
            nix::sys::signal::Signal::SIGTERM,
        );
    }
    let _ = child.wait();
    (code, read(dir, "stderr"))
}

/// A projected service-account volume as kubelet's atomic writer lays it out: the files in a
/// `..<time>` directory, `..data` a symlink to it, each name a relative symlink through `..data`.
fn projected(dir: &Path, files: &[(&str, &[u8])]) {
    let data = dir.join("..2026_11_26_09_00_00.000000001");
    std::fs::create_dir_all(&data).unwrap();
    for (name, content) in files {
        std::fs::write(data.join(name), content).unwrap();
        std::os::unix::fs::symlink(format!("..data/{name}"), dir.join(name)).unwrap();
    }
    std::os::unix::fs::symlink(data.file_name().unwrap(), dir.join("..data")).unwrap();
}

/// A self-signed CA certificate (`openssl req -x509`, P-256, valid until 2126): parsed when the
/// client is built, never used to verify anything here.
const PEM: &str = "-----BEGIN CERTIFICATE-----
MIIBijCCATGgAwIBAgIUP0SGXFAgCK66v81ZodS8mcg3tAowCgYIKoZIzj0EAwIw
GjEYMBYGA1UEAwwPZmxleHZvbC10ZXN0LWNhMCAXDTI2MTEyNjA5MDk1MVoYDzIx
MjYxMTAyMDkwOTUxWjAaMRgwFgYDVQQDDA9mbGV4dm9sLXRlc3QtY2EwWTATBgcq
hkjOPQIBBggqhkjOPQMBBwNCAATRlFwmRdF1FQymiX7dygj49NNXSkGgt8Lr+oAE
ZH+rlJ394OhohzxVgQUwH8bhRX4vdrbmAaaUyVOJ/8gMm3VHo1MwUTAdBgNVHQ4E
FgQUNai/m1Ajyi7SyscmkqjtwNhIzm4wHwYDVR0jBBgwFoAUNai/m1Ajyi7Syscm
kqjtwNhIzm4wDwYDVR0TAQH/BAUwAwEB/zAKBggqhkjOPQQDAgNHADBEAiAswXtv
RlY0ieDNSOMneCxOEiIxNM2Fyk/J3TTjDc1uvwIgIFjEwE+ciq7y6Ix7wVg4UREk
7TF/z8vjSu2Xjk15vps=
-----END CERTIFICATE-----
";

struct Case {
    tmp: tempfile::TempDir,
    host: PathBuf,
}

fn case() -> Case {
    let tmp = tempfile::tempdir().unwrap();
    let host = std::fs::canonicalize(tmp.path()).unwrap().join("host");
    std::fs::create_dir_all(&host).unwrap();
    Case { tmp, host }
}

impl Case {
    fn run_dir(&self, name: &str) -> PathBuf {
        let d = self.tmp.path().join(name);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    /// The provisioner as daemonset.yaml runs it (or without the flag), through hostns-run with
    /// `sa` bound as the service account ("-": none) and `host` and /usr/sbin hidden from the
    /// container's view; its config is `host/config.json`.
    fn provisioner(&self, sa: &str, flag: bool, extra: &[&str]) -> Command {
        let mut c = Command::new(hostns_run());
        c.args([sa])
            .arg(&self.host)
            .args(["/usr/sbin", "--"])
            .arg(binary())
            .args([
                "provisioner",
                "--node-name",
                "node-x",
                "--metrics-address",
                "127.0.0.1:0",
            ])
            .args(flag.then_some("--host-mount-namespace"))
            .args(extra)
            .env("FLEXVOL_CONFIG", self.host.join("config.json"))
            .env("KUBERNETES_SERVICE_HOST", "127.0.0.1")
            .env("KUBERNETES_SERVICE_PORT", closed_port().to_string());
        c
    }
}

/// Without hostPID, PID 1 is the container's own process: refused at once, exit 1, saying to set
/// hostPID: true; nothing on stdout.
#[test]
fn root_hostns_refused_without_host_pid() {
    require_root!();
    let c = case();
    std::fs::write(c.host.join("config.json"), "{}").unwrap();
    let dir = c.run_dir("run");
    let mut cmd = Command::new("unshare");
    cmd.args(["--pid", "--fork", "--mount-proc"])
        .arg(binary())
        .args([
            "provisioner",
            "--node-name",
            "node-x",
            "--host-mount-namespace",
        ])
        .args(["--metrics-address", "127.0.0.1:0"]);
    let (code, err) = watch(
        spawn(cmd, &dir),
        &dir,
        "\u{0}never",
        Duration::from_secs(20),
    );
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains("is this process's own mount namespace") && err.contains("hostPID: true"),
        "{err}"
    );
    assert!(!err.contains("entered"), "{err}");
    assert!(read(&dir, "stdout").is_empty());
}

/// The config is read in the host's namespace: the same file, hidden in the container's view,
/// is missing without the flag and read (its own error: an unknown key) with it.
#[test]
fn root_hostns_reads_the_hosts_config() {
    require_root!();
    let c = case();
    std::fs::write(c.host.join("config.json"), r#"{"notAKeyOfFlexvol": 1}"#).unwrap();
    let kc = c.host.join("kubeconfig");
    let kc = kc.to_str().unwrap();
    for (flag, expect, not) in [
        (false, "No such file", "notAKeyOfFlexvol"),
        (true, "notAKeyOfFlexvol", "No such file"),
    ] {
        let dir = c.run_dir(&format!("run-{flag}"));
        let child = spawn(c.provisioner("-", flag, &["--kubeconfig", kc]), &dir);
        let (code, err) = watch(
            child,
            &dir,
            "waiting for a valid config",
            Duration::from_secs(20),
        );
        assert_eq!(code, None, "it waits for a valid config: {err}");
        assert!(
            err.contains(expect) && !err.contains(not),
            "flag {flag}: {err}"
        );
        assert_eq!(
            err.contains("entered the host's mount namespace"),
            flag,
            "{err}"
        );
    }
}

/// The service account is read in the container's view, through the directory held open across
/// the switch (`/proc/self/fd/N`, resolving kubelet's `..data` symlinks in the container's mount):
/// with a token the client is built and the provisioner keeps trying the (closed) API server; the
/// same layout without a token fails on the token, at the descriptor's path. The host has no
/// service account at the in-cluster path (checked), so nothing else could have been read.
#[test]
fn root_hostns_reads_the_token_in_the_containers_view() {
    require_root!();
    assert!(
        !Path::new("/var/run/secrets/kubernetes.io/serviceaccount").exists(),
        "this machine has a service account at the in-cluster path: the test cannot tell the views apart"
    );
    let c = case();
    std::fs::write(c.host.join("config.json"), "{}").unwrap();
    let with = c.run_dir("sa-with-token");
    projected(
        &with,
        &[
            ("token", b"a-token"),
            ("ca.crt", PEM.as_bytes()),
            ("namespace", b"kube-system"),
        ],
    );
    let without = c.run_dir("sa-without-token");
    projected(
        &without,
        &[("ca.crt", PEM.as_bytes()), ("namespace", b"kube-system")],
    );

    let dir = c.run_dir("run-with");
    let child = spawn(c.provisioner(with.to_str().unwrap(), true, &[]), &dir);
    let (code, err) = watch(child, &dir, "\u{0}never", Duration::from_secs(6));
    assert_eq!(code, None, "with a token it keeps running: {err}");
    let at = "the service account is read in the container's view at /proc/self/fd/";
    assert!(err.contains(at), "{err}");
    assert!(!err.contains("ERROR"), "{err}");

    let dir = c.run_dir("run-without");
    let child = spawn(c.provisioner(without.to_str().unwrap(), true, &[]), &dir);
    let (code, err) = watch(child, &dir, "\u{0}never", Duration::from_secs(20));
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains(at), "{err}");
    assert!(
        err.contains("cannot build the API client") && err.contains("token"),
        "{err}"
    );
}
