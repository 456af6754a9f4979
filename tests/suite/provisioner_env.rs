//! `flexvol provisioner` on a host without a CA store (issue #22, 4): whatever its environment,
//! the daemon says what to fix in its log and exits with a code, or keeps running; it never
//! panics, and never answers like a driver (a JSON reply on stdout). The API server here is a
//! closed port of 127.0.0.1: what is tested is everything before the first connection (the
//! client and its TLS set-up); a real API server with `insecure-skip-tls-verify` is the
//! `insecure-tls` scenario of tests/cluster/provisioner-e2e.

use crate::util::binary;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A port of 127.0.0.1 nobody listens on (bound, then released).
fn closed_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

fn kubeconfig(dir: &Path, cluster_extra: &str) -> std::path::PathBuf {
    let k = dir.join("kubeconfig");
    std::fs::write(
        &k,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: https://127.0.0.1:{}\n{cluster_extra}\
             users:\n- name: u\n  user: {{token: not-a-real-token}}\ncontexts:\n- name: x\n  context: {{cluster: c, user: u}}\n\
             current-context: x\n",
            closed_port()
        ),
    )
    .unwrap();
    k
}

/// The provisioner with the host's CA store pointed at nothing, in each way rustls-native-certs
/// 0.6 reads it: `SSL_CERT_FILE` (read instead of everything else when set: an empty file gives
/// no certificate, a missing one an error) and `SSL_CERT_DIR` (openssl-probe's) an empty
/// directory. stdout and stderr go to files of `dir`.
fn spawn(dir: &Path, kubeconfig: &Path, cert_file: &Path, extra_env: &[(&str, &str)]) -> Child {
    let config = dir.join("config.json");
    std::fs::write(&config, "{}").unwrap();
    let certs = dir.join("certs");
    std::fs::create_dir_all(&certs).unwrap();
    let mut c = Command::new(binary());
    // Any free port for /metrics: the tests run in parallel (and beside other provisioners on a
    // shared machine), and the default 9479 would make all but one fail to listen.
    c.args(["provisioner", "--node-name", "node-x"])
        .args(["--metrics-address", "127.0.0.1:0", "--kubeconfig"])
        .arg(kubeconfig)
        .env("FLEXVOL_CONFIG", &config)
        .env("SSL_CERT_FILE", cert_file)
        .env("SSL_CERT_DIR", &certs)
        .env_remove("KUBECONFIG")
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(dir.join("stdout")).unwrap())
        .stderr(std::fs::File::create(dir.join("stderr")).unwrap());
    for (k, v) in extra_env {
        c.env(k, v);
    }
    c.spawn().unwrap()
}

fn read(dir: &Path, name: &str) -> String {
    std::fs::read_to_string(dir.join(name)).unwrap_or_default()
}

/// Until the process exits (its code) or `limit` passes (`None`).
fn wait_exit(child: &mut Child, limit: Duration) -> Option<i32> {
    let t0 = Instant::now();
    while t0.elapsed() < limit {
        if let Some(st) = child.try_wait().unwrap() {
            return Some(st.code().unwrap_or(-1));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    None
}

/// The host stores tried: an empty PEM file, a missing file.
fn host_stores(dir: &Path) -> Vec<std::path::PathBuf> {
    let empty = dir.join("empty.pem");
    std::fs::write(&empty, "").unwrap();
    vec![empty, dir.join("no-such-file.pem")]
}

/// `insecure-skip-tls-verify: true` and no CA: before #22 this panicked inside hyper-rustls
/// ("no CA certificates found", "could not load platform certs") and printed a driver's JSON
/// reply. Now the client is built without the host's store, a warning says the server is not
/// verified, and the daemon keeps trying to reach its (closed) API server.
#[test]
fn contract_provisioner_insecure_kubeconfig_needs_no_host_ca_store() {
    let tmp = tempfile::tempdir().unwrap();
    for (i, store) in host_stores(tmp.path()).iter().enumerate() {
        let dir = tmp.path().join(format!("run{i}"));
        std::fs::create_dir_all(&dir).unwrap();
        let k = kubeconfig(&dir, "    insecure-skip-tls-verify: true\n");
        let mut child = spawn(&dir, &k, store, &[]);
        // The warning comes just before the client is built; a panic would follow it at once.
        let t0 = Instant::now();
        while !read(&dir, "stderr").contains("insecure-skip-tls-verify")
            && t0.elapsed() < Duration::from_secs(20)
        {
            if child.try_wait().unwrap().is_some() {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let exited = wait_exit(&mut child, Duration::from_secs(2));
        let _ = child.kill();
        let _ = child.wait();
        let (out, err) = (read(&dir, "stdout"), read(&dir, "stderr"));
        let what = format!(
            "SSL_CERT_FILE={}: exit {exited:?}, stdout {out:?}, stderr {err:?}",
            store.display()
        );
        assert_eq!(exited, None, "the provisioner ended: {what}");
        assert!(out.is_empty(), "a daemon writes nothing on stdout: {what}");
        assert!(
            !err.contains("panicked") && !err.contains("internal error"),
            "{what}"
        );
        assert!(
            err.contains("warning:") && err.contains("certificate is not checked"),
            "no warning that the server is not verified: {what}"
        );
        assert_eq!(
            err.matches("insecure-skip-tls-verify").count(),
            1,
            "warned once: {what}"
        );
    }
}

/// No CA and no `insecure-skip-tls-verify`: an error that says what to add, exit code 1, nothing
/// on stdout (before #22: the same panic as above).
#[test]
fn contract_provisioner_kubeconfig_without_ca_says_what_to_fix() {
    let tmp = tempfile::tempdir().unwrap();
    for (i, store) in host_stores(tmp.path()).iter().enumerate() {
        let dir = tmp.path().join(format!("run{i}"));
        std::fs::create_dir_all(&dir).unwrap();
        let k = kubeconfig(&dir, "");
        let mut child = spawn(&dir, &k, store, &[]);
        let code = wait_exit(&mut child, Duration::from_secs(20));
        let _ = child.kill();
        let _ = child.wait();
        let (out, err) = (read(&dir, "stdout"), read(&dir, "stderr"));
        let what = format!(
            "SSL_CERT_FILE={}: exit {code:?}, stdout {out:?}, stderr {err:?}",
            store.display()
        );
        assert_eq!(code, Some(1), "{what}");
        assert!(out.is_empty(), "{what}");
        assert!(!err.contains("panicked"), "{what}");
        for fix in [
            "names no certificate authority",
            "certificate-authority-data",
            "insecure-skip-tls-verify: true",
        ] {
            assert!(err.contains(fix), "the error should say {fix:?}: {what}");
        }
    }
}

/// A bug in a spawned task (a stand-in through the test hook FLEXVOL_TEST_PANIC_AT) ends the
/// process with a log line and exit code 70, not with a driver's JSON reply on stdout and not
/// with a process that lives on without the task.
#[test]
fn contract_provisioner_panic_is_a_log_line_and_exit_70() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let k = kubeconfig(dir, "    insecure-skip-tls-verify: true\n");
    let store = &host_stores(dir)[0];
    let mut child = spawn(
        dir,
        &k,
        store,
        &[("FLEXVOL_TEST_PANIC_AT", "provisioner-task")],
    );
    let code = wait_exit(&mut child, Duration::from_secs(20));
    let _ = child.kill();
    let _ = child.wait();
    let (out, err) = (read(dir, "stdout"), read(dir, "stderr"));
    let what = format!("exit {code:?}, stdout {out:?}, stderr {err:?}");
    assert_eq!(code, Some(70), "{what}");
    assert!(out.is_empty(), "{what}");
    assert!(
        err.contains("flexvol-provisioner: internal error")
            && err.contains("FLEXVOL_TEST_PANIC_AT=provisioner-task"),
        "{what}"
    );
}
