//! What the three kinds of clone (`dataSource: {kind: PersistentVolumeClaim}` of a claim) share:
//! the one decision whether a source is in use on this node ([`in_use`], [`waiting`]), the
//! annotation a clone's PV carries ([`ANN_CLONED_FROM`]), and the descriptor-only directory copy
//! of hostPath and NFS clones ([`copy`]).
//!
//! The reconciler checks the source before a backend sees it
//! ([`crate::provision::storage::check_clone_source`]: same namespace, same class, ours, this node for a
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

use crate::backend::Backend;
use crate::node::config::Config;
use crate::provision::storage::Refusal;

pub(crate) mod copy;

/// What a volume is on this node, as the drivers' records name what they mounted: never a name
/// kubelet takes from the pod (`kubernetes.io/pvOrVolumeName` is the pod's own volume name for an
/// inline volume, so any pod could name one after a PV).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Source<'a> {
    /// A directory (hostPath): a record whose bind source is it, below it or above it uses it.
    Dir(&'a std::path::Path),
    /// A directory `share` on NFS server `server`: a mount of it, below it or above it uses it.
    Nfs {
        /// The server, as the PV's options name it.
        server: &'a str,
        /// The exported directory of the volume.
        share: &'a str,
    },
    /// The logical volume `lv` of volume group `vg`.
    Lv {
        /// Volume group.
        vg: &'a str,
        /// Logical volume.
        lv: &'a str,
    },
}

impl Source<'_> {
    /// Whether the driver record `r` (of this source's backend) mounts this source.
    fn used_by(&self, r: &crate::node::state::VolumeRecord) -> bool {
        use std::path::Path;
        let overlaps = |a: &Path, b: &Path| a.starts_with(b) || b.starts_with(a);
        match self {
            Source::Dir(p) => overlaps(Path::new(&r.source), p),
            Source::Nfs { server, share } => r
                .source
                .split_once(':')
                .is_some_and(|(s, sh)| s == *server && overlaps(Path::new(sh), Path::new(share))),
            Source::Lv { vg, lv } => {
                r.extra.get("vg").map(String::as_str) == Some(*vg)
                    && r.extra.get("lv").map(String::as_str) == Some(*lv)
            }
        }
    }
}

/// Who has `source` (of `backend`) mounted on this node (`namespace/pod`, or where kubelet staged
/// it when the record names no pod), by the driver's records — by what they mounted, never by
/// the volume name kubelet passed: a record is written before a mount and removed after its
/// unmount, and the provisioner and the drivers share the node's `stateDir`. `Ok(None)`: no
/// record mounts it. `Err`: a record cannot be read (the caller cannot tell, so it does not copy).
pub(crate) fn in_use(
    cfg: &Config,
    backend: Backend,
    source: &Source<'_>,
) -> Result<Option<String>, crate::node::state::StateError> {
    let store = crate::node::state::StateStore::new(&cfg.state_dir, backend.name());
    for (_, rec) in store.list() {
        match rec {
            Ok(r) if source.used_by(&r) => {
                return Ok(Some(match r.pod {
                    Some(p) => format!("pod {p}"),
                    None => format!("kubelet, at {}", r.target.display()),
                }));
            }
            Ok(_) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(None)
}

/// The refusal of a clone whose source `pv` is in use by `user` (what [`in_use`] said): the
/// claim waits (the reconciler retries with backoff), and the event says why and what to do.
/// `what`: why a copy of it now would be wrong.
pub(crate) fn waiting(pv: &str, user: &str, what: &str) -> Refusal {
    Refusal::Wait(format!(
        "waiting: its source volume {pv} is mounted on this node (by {user}); {what}, so it is made once no pod uses the source (stop the source's pods, e.g. scale to 0)"
    ))
}

/// [`in_use`] as the backends ask it before copying the volume of PV `pv`: `Ok(())` when nothing
/// uses `source`, else the refusal to return ([`waiting`], or "cannot tell" when a record cannot
/// be read).
pub(crate) fn check_not_in_use(
    cfg: &Config,
    backend: Backend,
    pv: &str,
    source: &Source<'_>,
    what: &str,
) -> Result<(), Refusal> {
    match in_use(cfg, backend, source) {
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

    fn rec(backend: Backend, volume: &str, source: &str, pod: Option<&str>) -> VolumeRecord {
        let mut r = VolumeRecord {
            volume: Some(volume.to_owned()),
            pod: pod.map(str::to_owned),
            ..crate::backend::record(
                backend,
                "mount",
                std::path::Path::new("/var/lib/kubelet/x"),
                source.into(),
                false,
                None,
            )
        };
        if let Some((vg, lv)) = source.strip_prefix("/dev/").and_then(|s| s.split_once('/')) {
            r.extra.insert("vg".into(), vg.into());
            r.extra.insert("lv".into(), lv.into());
        }
        r
    }

    /// The one decision: a record of the same backend that mounts the source (the directory, a
    /// directory below or above it; the NFS directory; the LV) is a use; another backend's record
    /// or another source is not; the message names the pod, or where kubelet staged it.
    #[test]
    fn a_source_is_in_use_while_a_driver_record_of_its_backend_mounts_it() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = Config {
            state_dir: dir.path().to_owned(),
            ..Config::default()
        };
        let src = std::path::Path::new("/srv/r/ns/pvc-1");
        assert_eq!(
            in_use(&cfg, Backend::HostPath, &Source::Dir(src)).unwrap(),
            None
        );
        let hp = StateStore::new(&cfg.state_dir, Backend::HostPath.name());
        hp.save(&rec(
            Backend::HostPath,
            "data",
            "/srv/r/ns/pvc-1/sub",
            Some("ns/p"),
        ))
        .unwrap();
        StateStore::new(&cfg.state_dir, Backend::Lvm.name())
            .save(&rec(Backend::Lvm, "pv-2", "/dev/vg0/pvc-2", None))
            .unwrap();
        assert_eq!(
            in_use(&cfg, Backend::HostPath, &Source::Dir(src)).unwrap(),
            Some("pod ns/p".into())
        );
        let other = std::path::Path::new("/srv/r/ns/pvc-10");
        assert_eq!(
            in_use(&cfg, Backend::HostPath, &Source::Dir(other)).unwrap(),
            None
        );
        let lv = Source::Lv {
            vg: "vg0",
            lv: "pvc-2",
        };
        let e =
            check_not_in_use(&cfg, Backend::Lvm, "pv-2", &lv, "a block copy of it").unwrap_err();
        assert!(
            matches!(&e, Refusal::Wait(w) if w == "waiting: its source volume pv-2 is mounted on this node (by kubelet, at /var/lib/kubelet/x); a block copy of it, so it is made once no pod uses the source (stop the source's pods, e.g. scale to 0)"),
            "{e:?}"
        );
        assert_eq!(
            check_not_in_use(&cfg, Backend::Nfs, "pv-2", &lv, "x"),
            Ok(())
        );
        let nfs = StateStore::new(&cfg.state_dir, Backend::Nfs.name());
        nfs.save(&rec(Backend::Nfs, "v", "srv:/exp/pvc-3", Some("ns/q")))
            .unwrap();
        let share = |s| Source::Nfs {
            server: "srv",
            share: s,
        };
        assert!(
            in_use(&cfg, Backend::Nfs, &share("/exp/pvc-3"))
                .unwrap()
                .is_some()
        );
        assert!(
            in_use(&cfg, Backend::Nfs, &share("/exp/pvc-30"))
                .unwrap()
                .is_none()
        );
    }

    /// Issue #32, 10: an inline volume a pod names after a PV (kubelet passes the pod's own
    /// volume name as `kubernetes.io/pvOrVolumeName`) but that mounts something else no longer
    /// makes that PV's clones wait for ever; the PV's own directory mounted under any name does.
    #[test]
    fn a_volume_named_after_the_source_pv_does_not_make_it_in_use() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = Config {
            state_dir: dir.path().to_owned(),
            ..Config::default()
        };
        let hp = StateStore::new(&cfg.state_dir, Backend::HostPath.name());
        hp.save(&rec(
            Backend::HostPath,
            "pvc-1",
            "/srv/flexvol/scratch",
            Some("evil/p"),
        ))
        .unwrap();
        let src = Source::Dir(std::path::Path::new("/srv/r/ns/pvc-1"));
        assert_eq!(in_use(&cfg, Backend::HostPath, &src).unwrap(), None);
        hp.save(&rec(
            Backend::HostPath,
            "whatever",
            "/srv/r/ns/pvc-1",
            Some("ns/app"),
        ))
        .unwrap();
        assert_eq!(
            in_use(&cfg, Backend::HostPath, &src).unwrap(),
            Some("pod ns/app".into())
        );
    }
}
