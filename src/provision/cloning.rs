//! What the three kinds of clone (`dataSource: {kind: PersistentVolumeClaim}` of a claim) share:
//! the one decision whether a source is in use on this node ([`in_use`], [`waiting`]), the
//! annotation a clone's PV carries ([`ANN_CLONED_FROM`]), and the descriptor-only directory copy
//! of hostPath and NFS clones ([`copy`]).
//!
//! The reconciler checks the source before a backend sees it
//! ([`super::provisioner::check_clone_source`]: same namespace, same class, ours, this node for a
//! node-local kind, not larger than the request); each backend checks its own ownership marks
//! again before it reads a byte, and decides with [`in_use`] whether the source may be read now:
//! - a file-by-file copy (hostPath, NFS) or a block copy (a thick LV) of a volume a pod is
//!   writing is neither point-in-time nor crash-consistent, so such a clone waits while the
//!   source is in use;
//! - a thin LVM snapshot is taken atomically by the kernel: crash-consistent (what a power cut
//!   would leave), so it is taken even while the source is mounted.
//!
//! Dependencies point one way: the backends (`hostpath`, `lvm`, `nfs`) use this module; it uses
//! none of them, only the node's state records (`crate::node::state`) and `crate::sys`.

use super::provisioner::Refusal;
use crate::backend::Backend;
use crate::node::config::Config;

pub mod copy;

/// PV annotation of a clone: the PV it was copied from, and what the copy did.
pub const ANN_CLONED_FROM: &str = "flexvol/cloned-from";

/// Who has the volume `pv` of `backend` mounted on this node (`namespace/pod`, or where kubelet
/// staged it when the record names no pod), by the driver's records: a record is written before
/// a mount and removed after its unmount, and the provisioner and the drivers share the node's
/// `stateDir`. `Ok(None)`: no record names `pv`. `Err`: a record cannot be read (the caller
/// cannot tell, so it does not copy).
pub fn in_use(cfg: &Config, backend: Backend, pv: &str) -> Result<Option<String>, String> {
    let store = crate::node::state::StateStore::new(&cfg.state_dir, backend.name());
    for (_, rec) in store.list() {
        match rec {
            Ok(r) if r.volume.as_deref() == Some(pv) => {
                return Ok(Some(match r.pod {
                    Some(p) => format!("pod {p}"),
                    None => format!("kubelet, at {}", r.target.display()),
                }));
            }
            Ok(_) => {}
            Err(e) => return Err(e.to_string()),
        }
    }
    Ok(None)
}

/// The refusal of a clone whose source `pv` is in use by `user` (what [`in_use`] said): the
/// claim waits (the reconciler retries with backoff), and the event says why and what to do.
/// `what`: why a copy of it now would be wrong.
pub fn waiting(pv: &str, user: &str, what: &str) -> Refusal {
    Refusal::Fail(format!(
        "waiting: its source volume {pv} is mounted on this node (by {user}); {what}, so it is made once no pod uses the source (stop the source's pods, e.g. scale to 0)"
    ))
}

/// [`in_use`] as the backends ask it before copying: `Ok(())` when nothing uses `pv`, else the
/// refusal to return ([`waiting`], or "cannot tell" when a record cannot be read).
pub fn check_not_in_use(
    cfg: &Config,
    backend: Backend,
    pv: &str,
    what: &str,
) -> Result<(), Refusal> {
    match in_use(cfg, backend, pv) {
        Ok(None) => Ok(()),
        Ok(Some(user)) => Err(waiting(pv, &user, what)),
        Err(e) => Err(Refusal::Fail(format!(
            "cannot tell whether its source is in use: {e}; retrying"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node::state::{StateStore, VolumeRecord};

    fn rec(backend: Backend, volume: &str, pod: Option<&str>) -> VolumeRecord {
        VolumeRecord {
            volume: Some(volume.to_owned()),
            pod: pod.map(str::to_owned),
            ..crate::backend::record(
                backend,
                "mount",
                std::path::Path::new("/var/lib/kubelet/x"),
                "/dev/x".into(),
                false,
                None,
            )
        }
    }

    /// The one decision: a record of the same backend naming the PV is a use; another backend's
    /// record, or another PV's, is not; the message names the pod, or where kubelet staged it.
    #[test]
    fn a_source_is_in_use_while_a_driver_record_of_its_backend_names_it() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = Config {
            state_dir: dir.path().to_owned(),
            ..Config::default()
        };
        assert_eq!(in_use(&cfg, Backend::Lvm, "pv-1"), Ok(None));
        StateStore::new(&cfg.state_dir, Backend::HostPath.name())
            .save(&rec(Backend::HostPath, "pv-1", Some("ns/p")))
            .unwrap();
        StateStore::new(&cfg.state_dir, Backend::Lvm.name())
            .save(&rec(Backend::Lvm, "pv-2", None))
            .unwrap();
        assert_eq!(in_use(&cfg, Backend::Lvm, "pv-1"), Ok(None));
        assert_eq!(
            in_use(&cfg, Backend::HostPath, "pv-1"),
            Ok(Some("pod ns/p".into()))
        );
        let e = check_not_in_use(&cfg, Backend::Lvm, "pv-2", "a block copy of it").unwrap_err();
        assert!(
            matches!(&e, Refusal::Fail(w) if w == "waiting: its source volume pv-2 is mounted on this node (by kubelet, at /var/lib/kubelet/x); a block copy of it, so it is made once no pod uses the source (stop the source's pods, e.g. scale to 0)"),
            "{e:?}"
        );
        assert_eq!(check_not_in_use(&cfg, Backend::Nfs, "pv-2", "x"), Ok(()));
    }
}
