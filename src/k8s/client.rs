//! The provisioner's API client: where it finds the API server, how it checks the server's
//! certificate, and how it keeps a rotating ServiceAccount token current.
//!
//! **Trust comes from the cluster, never from the host.** The server's certificate is checked
//! against the CA the kubeconfig gives (`certificate-authority` or `certificate-authority-data`)
//! or, in a pod, the service account volume's `ca.crt`; with `insecure-skip-tls-verify: true` it
//! is not checked at all (logged once, as a warning). The host's CA store (`/etc/ssl/certs`,
//! `SSL_CERT_FILE`, `SSL_CERT_DIR`) is never read: kube-rs 5 falls back to it (through
//! rustls-platform-verifier) only when its config has no root certificates; kube-rs 0.85's
//! fallback even panicked on a host without one ("could not load platform certs", "no CA
//! certificates found"). [`trust`] makes sure the config always has them (an empty set when
//! nothing is verified or the URL is plain `http://`), or refuses with what to fix.
//!
//! **Tokens are re-read.** kube-rs (5, as 0.85 did) reads a token file (the in-cluster
//! `/var/run/secrets/kubernetes.io/serviceaccount/token`, or a kubeconfig user's `tokenFile`)
//! again on the first request after its copy is 50 s old (`kube_client::client::auth::TokenFile`:
//! a copy is good for 60 s, renewed 10 s early; a failed read keeps the last token). kubelet
//! rewrites a projected token at 80% of its lifetime (at least 10 minutes), so the old one is
//! still valid for two minutes or more after the new one lands: every request carries a valid
//! token across a rotation. A token written inline in a kubeconfig (`token:`) is never re-read.
//! Proven on the real control plane by the `token-rotation` scenario
//! (tests/cluster/provisioner-e2e).

use std::path::Path;
use std::time::Duration;

/// Where the in-cluster config reads the service account (kube-rs's fixed path).
pub(crate) const SERVICE_ACCOUNT_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

/// How long a TCP connection to the API server may take to open.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Why there is no API client: the kind says what to fix (the message says it in words).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum ClientError {
    /// No kubeconfig was given and this is not a pod with a service account (its environment
    /// variables are absent or wrong).
    #[error("{0}")]
    NoKubeconfig(String),
    /// The kubeconfig given cannot be read or used.
    #[error("{0}")]
    Kubeconfig(String),
    /// The cluster's CA is missing or holds no certificate (the host's CA store is never used).
    #[error("{0}")]
    BadCa(String),
    /// The service account's files (token, namespace) cannot be read or used.
    #[error("{0}")]
    ServiceAccount(String),
    /// The client cannot be built from a config that was read.
    #[error("{0}")]
    Build(String),
}

/// How the API server's certificate is checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Trust {
    /// Against this many CA certificates of the cluster's own (kubeconfig or `ca.crt`).
    Ca(usize),
    /// Not at all (`insecure-skip-tls-verify: true`).
    Insecure,
    /// No TLS: the server's URL is `http://`.
    PlainHttp,
}

/// Decides how `config`'s server is checked and makes kube-rs's TLS setup follow it without
/// ever reaching for the host's CA store (see the module docs). `source` names where the config
/// came from, for the error: what to fix, and where.
pub(crate) fn trust(config: &mut kube::Config, source: &str) -> Result<Trust, ClientError> {
    let url = config.cluster_url.to_string();
    if config.cluster_url.scheme_str() == Some("http") {
        config.root_cert.get_or_insert_with(Vec::new);
        return Ok(Trust::PlainHttp);
    }
    if config.accept_invalid_certs {
        // An empty set: kube-rs then builds its config from it, and replaces the verifier with
        // one that accepts any certificate.
        config.root_cert.get_or_insert_with(Vec::new);
        return Ok(Trust::Insecure);
    }
    match config.root_cert.as_deref() {
        Some(cas) if !cas.is_empty() => Ok(Trust::Ca(cas.len())),
        Some(_) => Err(ClientError::BadCa(format!(
            "{source}: the certificate authority given for the cluster at {url} holds no PEM \
             CERTIFICATE block; give the cluster's CA certificate (kubectl config view --raw \
             shows the one kubectl uses)"
        ))),
        None => Err(ClientError::BadCa(format!(
            "{source} names no certificate authority for the cluster at {url}, and the \
             provisioner does not use this host's CA store: add certificate-authority-data \
             (base64 of the cluster's CA, PEM) or certificate-authority (a file) to that cluster \
             entry, or, on a test cluster only, insecure-skip-tls-verify: true"
        ))),
    }
}

/// The client: from a kubeconfig file, or the in-cluster service account without one. Every
/// problem of the environment is an error that says what to fix (never a panic).
///
/// `service_account_dir`: where the in-cluster service account is read when there is no
/// kubeconfig; `None` is [`SERVICE_ACCOUNT_DIR`] (kube-rs's own reading). After
/// `--host-mount-namespace` it is `/proc/self/fd/N`, the container's directory held open across
/// the switch (crate::sys::hostns): `token`, `ca.crt` and `namespace` are read through it, the
/// token again on every refresh, as kube-rs reads its fixed path.
pub(crate) async fn client(
    kubeconfig: Option<&Path>,
    service_account_dir: Option<&Path>,
) -> Result<kube::Client, ClientError> {
    let (mut config, source) = match kubeconfig {
        Some(p) => {
            let kc = kube::config::Kubeconfig::read_from(p).map_err(|e| {
                ClientError::Kubeconfig(format!("cannot read kubeconfig {}: {e}", p.display()))
            })?;
            let config = kube::Config::from_custom_kubeconfig(
                kc,
                &kube::config::KubeConfigOptions::default(),
            )
            .await
            .map_err(|e| {
                ClientError::Kubeconfig(format!("kubeconfig {} is not usable: {e}", p.display()))
            })?;
            (config, format!("kubeconfig {}", p.display()))
        }
        None => match service_account_dir {
            None => (
                incluster()?,
                format!("the service account at {SERVICE_ACCOUNT_DIR}"),
            ),
            Some(dir) => (
                incluster_at(dir).await?,
                format!(
                    "the service account at {SERVICE_ACCOUNT_DIR} (in the container's view, {})",
                    dir.display()
                ),
            ),
        },
    };
    // Each lane makes a client of its own: the warnings are said once per process.
    static WARNED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    let trust = trust(&mut config, &source)?;
    if matches!(trust, Trust::Ca(_)) || WARNED.swap(true, std::sync::atomic::Ordering::Relaxed) {
        // Nothing to say, or said already.
    } else if let Trust::Insecure = trust {
        tracing::warn!(
            target: super::LOG_TARGET,
            "warning: {source} sets insecure-skip-tls-verify: the API server's certificate is \
             not checked, so whoever can intercept the connection to {} gets this node's \
             credentials; give the cluster's CA (certificate-authority-data) instead",
            config.cluster_url
        );
    } else {
        tracing::warn!(
            target: super::LOG_TARGET,
            "warning: {source} points at {} over plain HTTP: neither the server nor the \
             credentials are protected",
            config.cluster_url
        );
    }
    config.connect_timeout = Some(CONNECT_TIMEOUT);
    let client = kube::Client::try_from(config)
        .map_err(|e| ClientError::Build(format!("cannot build the API client: {e}")))?;
    if std::env::var_os("FLEXVOL_TEST_PANIC_AT").is_some_and(|v| v == "provisioner-task") {
        // Test hook (tests/suite/provisioner_env.rs): a stand-in for a bug in a spawned task, as a
        // watch's, to show that the provisioner's panic hook ends the process with a log line.
        tokio::spawn(async { panic!("FLEXVOL_TEST_PANIC_AT=provisioner-task") });
    }
    Ok(client)
}

/// The API server's URL from `KUBERNETES_SERVICE_HOST` and `KUBERNETES_SERVICE_PORT`, as
/// kube-rs's in-cluster config makes it (an IPv6 address in brackets).
fn service_url() -> Result<String, ClientError> {
    let var = |n: &str| {
        std::env::var(n).map_err(|e| {
            ClientError::NoKubeconfig(format!(
                "not running in a pod with a service account ({n}: {e}); pass --kubeconfig FILE"
            ))
        })
    };
    let host = var("KUBERNETES_SERVICE_HOST")?;
    let port: u16 = var("KUBERNETES_SERVICE_PORT")?.parse().map_err(|e| {
        ClientError::NoKubeconfig(format!("KUBERNETES_SERVICE_PORT is not a port: {e}"))
    })?;
    Ok(match host.parse::<std::net::IpAddr>() {
        Ok(std::net::IpAddr::V6(ip)) => format!("https://[{ip}]:{port}"),
        _ => format!("https://{host}:{port}"),
    })
}

/// The in-cluster config with the service account read in `dir` instead of kube-rs's fixed path:
/// the same server URL, CA (`ca.crt`), namespace and token file (`token`, re-read by kube-rs like
/// the in-cluster one: both are an `AuthInfo` with a `tokenFile`).
async fn incluster_at(dir: &Path) -> Result<kube::Config, ClientError> {
    let ns_file = dir.join("namespace");
    let namespace = std::fs::read_to_string(&ns_file).map_err(|e| {
        ClientError::ServiceAccount(format!(
            "the service account at {SERVICE_ACCOUNT_DIR} is not usable: cannot read its \
             namespace ({}): {e}",
            ns_file.display()
        ))
    })?;
    let ca = dir.join("ca.crt");
    let kc = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "incluster", "cluster": {
            "server": service_url()?,
            "certificate-authority": ca,
        }}],
        "users": [{"name": "serviceaccount", "user": {"tokenFile": dir.join("token")}}],
        "contexts": [{"name": "incluster", "context": {
            "cluster": "incluster", "user": "serviceaccount", "namespace": namespace.trim(),
        }}],
        "current-context": "incluster",
    });
    let kc: kube::config::Kubeconfig = serde_json::from_value(kc)
        .map_err(|e| ClientError::Build(format!("cannot make the in-cluster config: {e}")))?;
    kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
        .await
        .map_err(|e| {
            ClientError::ServiceAccount(format!(
                "the service account at {SERVICE_ACCOUNT_DIR} (in the container's view, {}) is \
                 not usable: {e}; it needs token, ca.crt (from kube-root-ca.crt) and namespace",
                dir.display()
            ))
        })
}

fn incluster() -> Result<kube::Config, ClientError> {
    use kube::config::InClusterError as E;
    kube::Config::incluster().map_err(|e| match e {
        E::ReadEnvironmentVariable(_) | E::ParseClusterPort(_) | E::ParseClusterUrl(_) => {
            ClientError::NoKubeconfig(format!(
                "not running in a pod with a service account (KUBERNETES_SERVICE_HOST and \
                 KUBERNETES_SERVICE_PORT: {e}); pass --kubeconfig FILE"
            ))
        }
        E::ReadCertificateBundle(_) | E::ParseCertificates(_) => ClientError::BadCa(format!(
            "{SERVICE_ACCOUNT_DIR}/ca.crt: {e}; the API server is checked against this CA only \
             (not the host's CA store): project ca.crt into the service account volume \
             (drivers/deploy/daemonset.yaml takes it from the ConfigMap kube-root-ca.crt)"
        )),
        other => ClientError::ServiceAccount(format!(
            "the service account at {SERVICE_ACCOUNT_DIR} is not usable: {other}"
        )),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn config_of(yaml: &str) -> kube::Config {
        let kc = kube::config::Kubeconfig::from_yaml(yaml).unwrap();
        kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
            .await
            .unwrap()
    }

    fn kubeconfig(server: &str, cluster: &str) -> String {
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: {server}\n{cluster}\
             users:\n- name: u\n  user: {{token: t}}\ncontexts:\n- name: x\n  context: {{cluster: c, user: u}}\n\
             current-context: x\n"
        )
    }

    fn block_on<F: std::future::Future>(f: F) -> F::Output {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(f)
    }

    /// base64 of one PEM CERTIFICATE block (not a real certificate: only the framing is read
    /// before a connection is made).
    const PEM_BASE64: &str = "LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0tCk1JSUJzekNDQVZtZ0F3SUJBZ0lVUTNaawotLS0tLUVORCBDRVJUSUZJQ0FURS0tLS0tCg==";

    #[test]
    fn insecure_gets_an_empty_root_set_never_none() {
        let mut c = block_on(config_of(&kubeconfig(
            "https://127.0.0.1:1",
            "    insecure-skip-tls-verify: true\n",
        )));
        assert!(
            c.root_cert.is_none(),
            "kube-rs leaves it unset: native roots"
        );
        assert_eq!(trust(&mut c, "k").unwrap(), Trust::Insecure);
        assert_eq!(c.root_cert, Some(vec![]));
        assert!(c.accept_invalid_certs);
    }

    #[test]
    fn no_ca_and_no_insecure_is_an_error_that_says_what_to_fix() {
        let mut c = block_on(config_of(&kubeconfig("https://127.0.0.1:1", "")));
        let e = trust(&mut c, "kubeconfig /k").unwrap_err();
        assert!(matches!(e, ClientError::BadCa(_)), "{e:?}");
        let e = e.to_string();
        assert!(
            e.starts_with("kubeconfig /k names no certificate authority"),
            "{e}"
        );
        for fix in [
            "certificate-authority-data",
            "insecure-skip-tls-verify: true",
            "https://127.0.0.1:1",
        ] {
            assert!(e.contains(fix), "{e} should name {fix}");
        }
        assert!(c.root_cert.is_none());
    }

    #[test]
    fn a_ca_of_the_kubeconfig_is_what_is_trusted() {
        let mut c = block_on(config_of(&kubeconfig(
            "https://127.0.0.1:1",
            &format!("    certificate-authority-data: {PEM_BASE64}\n"),
        )));
        assert_eq!(trust(&mut c, "k").unwrap(), Trust::Ca(1));
        assert!(!c.accept_invalid_certs);
    }

    #[test]
    fn a_ca_file_without_a_certificate_is_refused() {
        let d = tempfile::tempdir().unwrap();
        let ca = d.path().join("ca.crt");
        std::fs::write(&ca, "not a certificate\n").unwrap();
        let mut c = block_on(config_of(&kubeconfig(
            "https://127.0.0.1:1",
            &format!("    certificate-authority: {}\n", ca.display()),
        )));
        let e = trust(&mut c, "k").unwrap_err();
        assert!(matches!(e, ClientError::BadCa(_)), "{e:?}");
        assert!(e.to_string().contains("holds no PEM CERTIFICATE"), "{e}");
    }

    #[test]
    fn plain_http_needs_no_ca() {
        let mut c = block_on(config_of(&kubeconfig("http://127.0.0.1:1", "")));
        assert_eq!(trust(&mut c, "k").unwrap(), Trust::PlainHttp);
        assert_eq!(c.root_cert, Some(vec![]));
    }

    /// A service account directory without its files is a service account error (not a CA or
    /// kubeconfig one), and says where it looked.
    #[test]
    fn an_unreadable_service_account_is_its_own_kind() {
        let d = tempfile::tempdir().unwrap();
        let e = block_on(incluster_at(d.path())).unwrap_err();
        assert!(matches!(e, ClientError::ServiceAccount(_)), "{e:?}");
        assert!(e.to_string().contains("cannot read its namespace"), "{e}");
    }

    /// The client itself is built (no panic, no host CA store) for the insecure kubeconfig;
    /// tests/suite/ops.rs runs the binary with the host's store pointed at nothing.
    #[test]
    fn insecure_client_builds() {
        let d = tempfile::tempdir().unwrap();
        let k = d.path().join("kubeconfig");
        std::fs::write(
            &k,
            kubeconfig(
                "https://127.0.0.1:1",
                "    insecure-skip-tls-verify: true\n",
            ),
        )
        .unwrap();
        block_on(client(Some(&k), None)).unwrap();
        let none = d.path().join("none");
        std::fs::write(&none, kubeconfig("https://127.0.0.1:1", "")).unwrap();
        let Err(e) = block_on(client(Some(&none), None)) else {
            panic!("a kubeconfig without a CA gave a client")
        };
        assert!(matches!(e, ClientError::BadCa(_)), "{e:?}");
        assert!(
            e.to_string().contains("names no certificate authority"),
            "{e}"
        );
    }
}
