//! The hostPath provisioner (`<vendor>/hostpath` StorageClasses): each claim gets a volume
//! directory under one of its node's roots ([`crate::node::localpath`]), served by the hostpath driver
//! with a capability token for exactly that PV and path.
//!
//! The directory work — roots, ownership records, making and deleting a directory without ever
//! adopting or crossing into something that is not ours — is the marked-directory library's
//! ([`crate::provision::storage::volumedir`], whose module doc has the safety rules); this module picks the root
//! (a directory made by an earlier pass for the PV wins, else the most free space), signs the
//! token, and sizes the volume.
//!
//! Sizes: where the root's filesystem enforces project quotas, [`HostPathProvisioner`] gives each new
//! directory a project quota of the claim's size and raises it on a resize ([`crate::provision::storage::quota`]);
//! the project ID is recorded in the record before the quota is set up. Elsewhere the PV says
//! `flexvol/size-enforced: "false"` and why.

use crate::node::capability::{self, Key, Location, node_key_path};
use crate::node::config::Config;
use crate::provision::storage::quota::DriftCheck;
use crate::provision::storage::volumedir::{
    Deleted, DirParams, DirState, MARKER, Marker, Root, VolumeDirError, check_ours,
    create_volume_dir, default_rel_path, delete_volume_dir_then, expand_pattern, finish_deletes,
    locate, read_record, usable_roots,
};
use crate::provision::storage::{
    ClassError, Kind, ProvisionError, Provisioned, Provisioner, Refusal, Request, SizeCheck,
};
use crate::sys::dirfd::free_bytes;
use crate::sys::exec::{Runner, SystemRunner};
use crate::sys::process::checkpoint;
use crate::vocab::{ANN_NODE, ANN_SIZE_ENFORCED};
use k8s_openapi::api::core::v1::PersistentVolume;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use crate::provision::storage::cloning::{self, copy};

/// PV annotation of a clone (the shared one, [`crate::vocab::ANN_CLONED_FROM`]).
pub(crate) use crate::vocab::ANN_CLONED_FROM;

/// Why a hostPath source in use is not copied ([`cloning::check_not_in_use`]).
const IN_USE: &str =
    "a copy of a directory in use would be neither point-in-time nor crash-consistent";

/// The hostPath kind: node-local, one writer node.
pub(crate) const KIND: Kind = Kind {
    name: "hostpath",
    node_local: true,
    access_modes: &["ReadWriteOnce", "ReadWriteOncePod"],
    node_finishes_resize: false,
};

/// The hostPath kind of volume: a marked directory under one of the node's roots
/// ([`crate::node::localpath`]), served by the hostpath driver.
pub struct HostPathProvisioner {
    /// `<vendor>/hostpath`, written into markers.
    pub provisioner: String,
    /// The runner of the quota tool (`xfs_quota`) for the config in force.
    runner: RunnerFor,
}

/// Gives the runner for the external tools under the config in force (its `toolDirs` may change
/// with the ConfigMap between passes).
pub(crate) type RunnerFor = Box<dyn Fn(&Config) -> Arc<dyn Runner> + Send + Sync>;

impl HostPathProvisioner {
    /// The provisioner for name `provisioner`, running tools from the config's `toolDirs`.
    pub fn new(provisioner: String) -> Self {
        Self::with_runner_for(
            provisioner,
            Box::new(|cfg: &Config| -> Arc<dyn Runner> {
                Arc::new(SystemRunner::new(cfg.tool_dirs.clone()))
            }),
        )
    }

    /// The provisioner running every tool through `runner` (tests: the recording runner).
    #[cfg(test)]
    pub(crate) fn with_runner(provisioner: String, runner: Arc<dyn Runner>) -> Self {
        Self::with_runner_for(provisioner, Box::new(move |_: &Config| runner.clone()))
    }

    /// The provisioner taking its runner from `runner` for each piece of work.
    pub(crate) fn with_runner_for(provisioner: String, runner: RunnerFor) -> Self {
        Self {
            provisioner,
            runner,
        }
    }
}

/// The claim's uid recorded in a PV's `claimRef` (what a marker must name).
fn claim_uid_of(pv: &PersistentVolume) -> String {
    pv.spec
        .as_ref()
        .and_then(|s| s.claim_ref.as_ref())
        .and_then(|r| r.uid.clone())
        .unwrap_or_default()
}

/// The `path` option of a hostPath PV.
fn path_of(pv: &PersistentVolume) -> Option<PathBuf> {
    crate::vocab::pv_options(pv)
        .and_then(|o| o.get("path"))
        .map(PathBuf::from)
}

/// The root (of the config of the node that made it) a hostPath PV's directory lies in, and the
/// directory relative to it; `Err` says why not, ending with `what_to_do`.
fn locate_pv(
    cfg: &Config,
    pv: &PersistentVolume,
    what_to_do: &str,
) -> Result<(Root, PathBuf, PathBuf), ProvisionError> {
    let path = path_of(pv)
        .ok_or_else(|| ProvisionError::Refused("it has no flexVolume path option".to_string()))?;
    let node = pv
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(ANN_NODE))
        .cloned()
        .unwrap_or_default();
    let (roots, _) = usable_roots(&cfg.local_path.node_roots(&node), false);
    match locate(&roots, &path) {
        Some((root, rel)) => Ok((root.clone(), rel, path)),
        None => Err(ProvisionError::Refused(format!(
            "its path {} is not below a root of node {node}'s flexvol config; {what_to_do}",
            path.display()
        ))),
    }
}

impl HostPathProvisioner {
    /// The source of a clone: its root, relative and full path, and the device and inode its
    /// record names (`None` for an old volume without a record) — only when its directory is
    /// that PV's by our own marks (as delete checks) and no pod on this node has it mounted.
    ///
    /// In use: a file-by-file copy of a directory a pod is writing is neither a point-in-time
    /// nor a crash-consistent image (files are copied at different moments), so the claim waits,
    /// with an event, while the hostpath driver's records on this node say a pod has the source
    /// mounted (they are written before the mount and removed after the unmount). The
    /// provisioner and the driver share the node's `stateDir`.
    #[allow(clippy::type_complexity)]
    fn clone_source(
        &self,
        cfg: &Config,
        pv: &PersistentVolume,
    ) -> Result<(Root, PathBuf, PathBuf, Option<(u64, u64)>), Refusal> {
        let name = pv.metadata.name.clone().unwrap_or_default();
        let (root, rel, path) =
            locate_pv(cfg, pv, "it cannot be copied").map_err(|e| Refusal::Fail(e.to_string()))?;
        let state = check_ours(&root, &rel, &name, &claim_uid_of(pv), "nothing was created")
            .map_err(|e| Refusal::Fail(format!("its source: {e}")))?;
        let expect = match state {
            DirState::Owned(r) => Some((r.dev, r.ino)),
            _ => None,
        };
        cloning::check_not_in_use(
            cfg,
            crate::backend::Backend::HostPath,
            &name,
            &cloning::Source::Dir(&path),
            IN_USE,
        )?;
        Ok((root, rel, path, expect))
    }

    /// Copies the source directory `spath` (the very inode `expect`, when recorded) into the new
    /// volume directory `dst`.
    fn copy_from(
        spath: &std::path::Path,
        expect: Option<&(u64, u64)>,
        dst: &std::path::Path,
    ) -> Result<copy::Copied, copy::CopyError> {
        Self::copy_from_with(spath, expect, dst, &mut || {})
    }

    /// [`Self::copy_from`], running `meanwhile` after the copy and before the source is looked at
    /// again (the tests' pause point, where a pod that mounted the source writes it).
    fn copy_from_with(
        spath: &std::path::Path,
        expect: Option<&(u64, u64)>,
        dst: &std::path::Path,
        meanwhile: &mut dyn FnMut(),
    ) -> Result<copy::Copied, copy::CopyError> {
        let src = crate::sys::dirfd::open_dir(spath)
            .map_err(|e| format!("cannot open {}: {e}", spath.display()))?;
        if let Some(want) = expect {
            let got = crate::sys::dirfd::dev_ino(&src).map_err(|e| e.to_string())?;
            if got != *want {
                return Err(copy::CopyError::Replaced(format!(
                    "{} is not the directory its record names (replaced meanwhile)",
                    spath.display()
                )));
            }
        }
        let dst = crate::sys::dirfd::open_dir(dst)
            .map_err(|e| format!("cannot open {}: {e}", dst.display()))?;
        // "Not in use" was decided before the copy; a pod may mount the source meanwhile. Every
        // change to the tree while it is copied (a write, a new name, a swap) changes its
        // fingerprint (every entry's change time): such a copy is discarded, never kept.
        copy::copy_unchanged(&src, &dst, &[MARKER], meanwhile).map_err(|e| match e {
            copy::Unchanged::Read(e) | copy::Unchanged::Copy(e) => e,
            copy::Unchanged::Changed => copy::CopyError::Changed(format!(
                "{}: a pod mounted and changed it during the copy",
                copy::CHANGED
            )),
        })
    }

    /// Removes this request's own directory (a clone not finished), with its project quota.
    fn discard(
        &self,
        cfg: &Config,
        runner: &dyn crate::sys::exec::Runner,
        root: &Root,
        rel: &std::path::Path,
        req: &Request<'_>,
    ) -> Result<(), Refusal> {
        let project =
            crate::provision::storage::quota::project_of_volume(runner, root, rel, req.pv_name);
        // Released before the record goes (a kill between them leaves the record to retry).
        delete_volume_dir_then(root, rel, req.pv_name, req.uid, &mut || match project {
            Ok(id) => crate::provision::storage::quota::release(
                runner,
                root,
                id,
                req.pv_name,
                &crate::provision::storage::quota::IdScope::of(cfg),
            )
            .map(drop)
            .map_err(Into::into),
            Err(_) => Ok(()),
        })
        .map_err(|e| Refusal::Fail(format!("{e}; retrying")))?;
        Ok(())
    }
}

/// Checks a hostPath class's parameters ([`Provisioner::check_class`]), pure: also what the
/// scheduler extender checks before it counts a claim of the class against a node
/// ([`crate::provision::storage::plan_claim`]).
pub fn check_params(params: &BTreeMap<String, String>) -> Result<(), ClassError> {
    // nodeLossGracePeriod is the cluster controller's (crate::controller::nodeloss::decide), checked here too.
    let rest = crate::vocab::class::split_param(params)?;
    match DirParams::parse(&rest) {
        Ok(_) => Ok(()),
        Err(VolumeDirError::UnknownParam(e)) => Err(ClassError(format!(
            "{e}, {}, {}",
            crate::vocab::class::PARAM,
            crate::vocab::class::CSI_DRIVER
        ))),
        Err(e) => Err(ClassError(e.to_string())),
    }
}

impl Provisioner for HostPathProvisioner {
    fn kind(&self) -> &'static Kind {
        &KIND
    }

    fn serves(&self, cfg: &Config, node: &str) -> bool {
        // Serving while a root can be used now (a root that is gone makes the instance advise
        // removing the node's label, and send picked claims back).
        !usable_roots(&cfg.local_path.node_roots(node), true)
            .0
            .is_empty()
    }

    fn check_class(&self, params: &BTreeMap<String, String>) -> Result<(), ClassError> {
        check_params(params)
    }

    fn provision(&mut self, cfg: &Config, req: &Request<'_>) -> Result<Provisioned, Refusal> {
        let params = crate::vocab::class::split_param(req.params)
            .map_err(|e| e.to_string())
            .and_then(|rest| DirParams::parse(&rest).map_err(String::from))
            .map_err(Refusal::Fail)?;
        let rel = match &params.path_pattern {
            Some(p) => expand_pattern(p, req.pv_name, req.namespace, req.name)
                .map_err(|why| Refusal::Fail(format!("StorageClass {}: {why}", req.class_name)))?,
            None => default_rel_path(req.pv_name, req.namespace, req.name),
        };
        // Can this node serve it at all?
        let configured = cfg.local_path.roots_for(req.node, req.class_name);
        if configured.is_empty() {
            return Err(Refusal::Reschedule(format!(
                "its flexvol config has no root for StorageClass {} (to use this node, give it a root in its flexvol config)",
                req.class_name
            )));
        }
        let (roots, bad) = usable_roots(&configured, true);
        // A clone's source, checked before anything exists (ownership marks, not in use).
        let source = match req.source {
            Some(pv) => Some(self.clone_source(cfg, pv)?),
            None => None,
        };
        // A directory made for this PV by an earlier (killed) pass wins; then, for a clone, the
        // source's root (a reflink needs the same filesystem); else the most free space.
        let chosen = roots
            .iter()
            .find(|r| matches!(read_record(r, req.pv_name), Ok(Some(_))))
            .or_else(|| {
                let (sroot, _, _, _) = source.as_ref()?;
                roots.iter().find(|r| r.real == sroot.real)
            })
            .or_else(|| {
                roots
                    .iter()
                    .max_by_key(|r| free_bytes(&r.real).unwrap_or(0))
            });
        let Some(root) = chosen else {
            return Err(Refusal::Reschedule(format!(
                "no usable root ({})",
                bad.join("; ")
            )));
        };
        // The node key first: a Failure leaves nothing behind.
        let key = Key::load_or_create(&node_key_path(&cfg.state_dir))
            .map_err(|e| Refusal::Fail(format!("{e}; retrying")))?;
        let marker = Marker {
            provisioner: self.provisioner.clone(),
            volume: req.pv_name.to_owned(),
            namespace: req.namespace.to_owned(),
            claim: req.name.to_owned(),
            claim_uid: req.uid.to_owned(),
            node: req.node.to_owned(),
            project_id: None,
        };
        let runner = (self.runner)(cfg);
        if source.is_some() && matches!(read_record(root, req.pv_name), Ok(Some(_))) {
            // A clone an earlier pass made but may not have finished copying (the reconciler
            // read from the server that no PV exists for it, so no pod can use it; the driver's
            // records are asked too): removed, and copied again from the start.
            let own = root.real.join(&rel);
            match cloning::in_use(
                cfg,
                crate::backend::Backend::HostPath,
                &cloning::Source::Dir(&own),
            ) {
                Ok(None) => {}
                Ok(Some(pod)) => {
                    return Err(Refusal::Fail(format!(
                        "{} is mounted by {pod} although it has no PV; left alone",
                        req.pv_name
                    )));
                }
                Err(e) => return Err(Refusal::Fail(format!("{e}; retrying"))),
            }
            self.discard(cfg, &*runner, root, &rel, req)?;
        }
        let path = create_volume_dir(root, &rel, params.ownership, &marker)
            .map_err(|e| Refusal::Fail(e.into()))?;
        checkpoint("provisioner-after-directory");
        let size = crate::provision::storage::quota::enforce_volume(
            &*runner,
            root,
            &rel,
            req.size_bytes,
            &crate::provision::storage::quota::IdScope::of(cfg),
        )
        .map_err(|why| Refusal::Fail(format!("{why}; retrying")))?;
        let mut annotations = size.annotations(req.size_bytes);
        if let Some((_, _, spath, expect)) = &source {
            let copied = Self::copy_from(spath, expect.as_ref(), &path);
            checkpoint("provisioner-after-clone-copy");
            match copied {
                Ok(c) => {
                    let src = req.source.and_then(|v| v.metadata.name.clone());
                    annotations.insert(
                        ANN_CLONED_FROM.to_owned(),
                        format!("{} ({})", src.unwrap_or_default(), c.summary()),
                    );
                }
                Err(why) => {
                    // A Failure changes nothing: the half copy goes.
                    let undo = match self.discard(cfg, &*runner, root, &rel, req) {
                        Ok(()) => String::new(),
                        Err(e) => {
                            let e = e.message();
                            format!(
                                " (and removing the half copy failed: {e}; the next pass retries)"
                            )
                        }
                    };
                    return Err(Refusal::Fail(format!(
                        "copying its source {} failed: {why}{undo}",
                        spath.display()
                    )));
                }
            }
        }
        let location = path.display().to_string();
        // The PV alone may use the directory: the driver serves a path inside a provisioning
        // root only with this token for this PV, exactly this path, to pods of the claim's
        // namespace.
        let token = key.sign_for(req.pv_name, req.namespace, &Location::HostPath(&location));
        Ok(Provisioned {
            options: BTreeMap::from([
                ("path".to_owned(), location.clone()),
                ("type".to_owned(), "Directory".to_owned()),
                (capability::OPTION.to_owned(), token),
            ]),
            capacity_bytes: req.size_bytes,
            annotations,
            location,
            fs_type: None,
        })
    }

    fn delete(&mut self, cfg: &Config, pv: &PersistentVolume) -> Result<String, ProvisionError> {
        let name = pv.metadata.name.clone().unwrap_or_default();
        let (root, rel, path) = locate_pv(
            cfg,
            pv,
            "if a root was removed from the config, add it back; otherwise delete the directory by hand and then the PV",
        )?;
        let runner = (self.runner)(cfg);
        // The project to clear afterwards: the record's (or an old marker's), only when the
        // directory really carries it (checked now, while it is there).
        let project =
            crate::provision::storage::quota::project_of_volume(&*runner, &root, &rel, &name);
        // Released once the directory is gone and before its record goes — also when the
        // directory was gone already (a delete killed after it went), whose record still names
        // the limit — so that a kill between them leaves the record for the retry.
        let mut released = String::new();
        let deleted = delete_volume_dir_then(&root, &rel, &name, &claim_uid_of(pv), &mut || {
            released = match &project {
                Ok(id) => crate::provision::storage::quota::release(
                    &*runner,
                    &root,
                    *id,
                    &name,
                    &crate::provision::storage::quota::IdScope::of(cfg),
                )?,
                Err(why) => format!("; no project limit cleared: {why}"),
            };
            Ok(())
        })?;
        match deleted {
            Deleted::Removed => Ok(format!("removed {}{released}", path.display())),
            Deleted::AlreadyGone => Ok(format!("{} was gone already{released}", path.display())),
        }
    }

    fn expand(
        &mut self,
        cfg: &Config,
        pv: &PersistentVolume,
        bytes: u64,
    ) -> Result<u64, ProvisionError> {
        // With a project quota: raise it. Without one, nothing enforces the size of a plain
        // directory: the new size is recorded, no more (and it stays unenforced: a quota is never
        // imposed on a volume in use, whose data may already exceed it).
        let name = pv.metadata.name.clone().unwrap_or_default();
        let (root, rel, _) = locate_pv(cfg, pv, "add the root back to grow it")?;
        let runner = (self.runner)(cfg);
        crate::provision::storage::quota::raise_volume(
            &*runner,
            &root,
            &rel,
            &name,
            &claim_uid_of(pv),
            bytes,
        )
    }

    fn recover(&mut self, cfg: &Config, node: &str) -> Vec<String> {
        let (existing, _) = usable_roots(&cfg.local_path.node_roots(node), false);
        let runner = (self.runner)(cfg);
        let ids = crate::provision::storage::quota::IdScope::of(cfg);
        finish_deletes(&existing, &|_| false, &mut |root, volume, id| {
            crate::provision::storage::quota::release_later(&*runner, root, Some(id), volume, &ids)
                .map(drop)
                .map_err(Into::into)
        })
        .1
    }

    fn adopt(&self, cfg: &Config, pv: &PersistentVolume) -> Option<String> {
        let name = pv.metadata.name.clone().unwrap_or_default();
        let (root, rel, path) = locate_pv(cfg, pv, "").ok()?;
        let runner = (self.runner)(cfg);
        // Asked only for an old volume whose marker names a project (never on the common path).
        let project_ok = |id: u32| {
            let support = crate::provision::storage::quota::detect_with_tool(&*runner, &path);
            matches!(
                crate::provision::storage::quota::checked_id(&*runner, &support, &path, id),
                Ok(Some(_))
            )
        };
        match crate::provision::storage::volumedir::adopt_legacy(
            &root,
            &rel,
            &name,
            &claim_uid_of(pv),
            &project_ok,
        ) {
            Ok(_) => None,
            Err(e) => Some(format!(
                "PV {name}: cannot write the ownership record of its old volume: {e}"
            )),
        }
    }

    fn check_size(&self, cfg: &Config, pv: &PersistentVolume) -> Option<SizeCheck> {
        // Only a PV whose size was enforced with a project: the others cost nothing.
        let ann = |k: &str| pv.metadata.annotations.as_ref().and_then(|a| a.get(k));
        if ann(ANN_SIZE_ENFORCED).map(String::as_str) != Some("true")
            || ann(crate::vocab::ANN_PROJECT).is_none()
        {
            return None;
        }
        let name = pv.metadata.name.clone().unwrap_or_default();
        // A PV not below a root of the config: resize and delete say so when they act.
        let (root, rel, _) = locate_pv(cfg, pv, "").ok()?;
        let runner = (self.runner)(cfg);
        match crate::provision::storage::quota::check_drift(&*runner, &root, &rel, &name) {
            Ok(DriftCheck::Clean) => None,
            Ok(DriftCheck::Restored(d)) => Some(SizeCheck::Restored(d.to_string())),
            Ok(DriftCheck::NotRestored(d, why)) => Some(SizeCheck::NotRestored(d.to_string(), why)),
            Err(why) => Some(SizeCheck::Failed(why.to_string())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sys::testing::FakeRunner;
    use k8s_openapi::api::core::v1::PersistentVolumeClaim;

    /// The parameters a hostPath class may use are listed after an unknown key, chosen by the
    /// error's kind ([`VolumeDirError::UnknownParam`]): a bad value of a known key gets no list,
    /// whatever its message says.
    #[test]
    fn an_unknown_class_parameter_lists_the_grace_period_too() {
        let m = |k: &str, v: &str| BTreeMap::from([(k.to_owned(), v.to_owned())]);
        let suffix = format!(
            ", {}, {}",
            crate::vocab::class::PARAM,
            crate::vocab::class::CSI_DRIVER
        );
        let e = check_params(&m("nodePath", "/x")).unwrap_err().to_string();
        assert!(e.starts_with("unknown class parameter \"nodePath\""), "{e}");
        assert!(e.ends_with(&suffix), "{e}");
        let e = check_params(&m("uid", "bob")).unwrap_err().to_string();
        assert!(e.contains("numeric id") && !e.contains(&suffix), "{e}");
        let e = check_params(&m("pathPattern", "unknown class parameter/.."))
            .unwrap_err()
            .to_string();
        assert!(!e.contains(&suffix), "{e}");
        assert_eq!(check_params(&m(crate::vocab::class::PARAM, "5m")), Ok(()));
        assert_eq!(
            check_params(&m(
                crate::vocab::class::CSI_DRIVER,
                "hostpath.csi.flexvol.io"
            )),
            Ok(())
        );
    }

    #[test]
    fn the_runner_is_the_one_given_and_an_unenforced_root_runs_no_tool() {
        let d = tempfile::tempdir().unwrap();
        let root = d.path().join("root");
        let mut cfg = Config {
            state_dir: d.path().join("state"),
            ..Default::default()
        };
        cfg.local_path = serde_json::from_value(serde_json::json!({
            "nodePathMap": [{"node": "n", "paths": [root]}]
        }))
        .unwrap();
        let fake = Arc::new(FakeRunner::new());
        let mut p = HostPathProvisioner::with_runner("flexvol/hostpath".into(), fake.clone());
        assert!(p.serves(&cfg, "n"));
        let claim = PersistentVolumeClaim::default();
        let params = BTreeMap::new();
        let modes = ["ReadWriteOnce".to_owned()];
        let req = Request {
            pv_name: "pvc-u1",
            claim: &claim,
            namespace: "ns",
            name: "c",
            uid: "u1",
            class_name: "local",
            params: &params,
            size_bytes: 1 << 20,
            access_modes: &modes,
            node: "n",
            source: None,
        };
        let made = p.provision(&cfg, &req).unwrap();
        let dir = root.canonicalize().unwrap().join("pvc-u1_ns_c");
        assert_eq!(made.location, dir.display().to_string());
        assert!(dir.is_dir());
        let pv: PersistentVolume = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "pvc-u1", "annotations": made.annotations.clone()},
            "spec": {"claimRef": {"uid": "u1"},
                     "flexVolume": {"driver": "flexvol/hostpath", "options": made.options}}
        }))
        .unwrap();
        let mut pv = pv;
        pv.metadata
            .annotations
            .get_or_insert_default()
            .insert(ANN_NODE.into(), "n".into());
        if made.annotations.get(crate::vocab::ANN_SIZE_ENFORCED) == Some(&"false".to_owned()) {
            // Not enforced here (tmpfs, ext4 without prjquota...): no tool is run at all.
            assert_eq!(p.expand(&cfg, &pv, 2 << 20), Ok(2 << 20));
            assert!(fake.calls().is_empty(), "{:?}", fake.lines());
        }
        // The size check: nothing for a PV whose size is not enforced, nor for one whose record
        // names no project (whatever its PV's annotations say); no tool runs for either.
        let calls = fake.calls().len();
        let mut enforced = pv.clone();
        enforced
            .metadata
            .annotations
            .get_or_insert_default()
            .insert(
                ANN_SIZE_ENFORCED.into(),
                made.annotations
                    .get(ANN_SIZE_ENFORCED)
                    .cloned()
                    .unwrap_or_default(),
            );
        if made.annotations.get(ANN_SIZE_ENFORCED) != Some(&"true".to_owned()) {
            assert_eq!(p.check_size(&cfg, &enforced), None);
            let a = enforced.metadata.annotations.get_or_insert_default();
            a.insert(ANN_SIZE_ENFORCED.into(), "true".into());
            a.insert(crate::vocab::ANN_PROJECT.into(), "7".into());
            assert_eq!(p.check_size(&cfg, &enforced), None);
            assert_eq!(fake.calls().len(), calls, "{:?}", fake.lines());
        }
        let done = p.delete(&cfg, &pv).unwrap();
        assert!(done.starts_with("removed "), "{done}");
        assert!(!dir.exists());
    }

    /// A clone through the provisioner: the data of a provisioned source, a source the driver
    /// has mounted waits, a directory that is not the source PV's is refused, nothing left.
    #[test]
    fn a_clone_copies_its_source_and_waits_while_it_is_mounted() {
        let d = tempfile::tempdir().unwrap();
        let root = d.path().join("root");
        let mut cfg = Config {
            state_dir: d.path().join("state"),
            ..Default::default()
        };
        cfg.local_path = serde_json::from_value(serde_json::json!({
            "nodePathMap": [{"node": "n", "paths": [root]}]
        }))
        .unwrap();
        let fake = Arc::new(FakeRunner::new());
        let mut p = HostPathProvisioner::with_runner("flexvol/hostpath".into(), fake);
        let claim = PersistentVolumeClaim::default();
        let params = BTreeMap::new();
        let modes = ["ReadWriteOnce".to_owned()];
        let req = |pv: &'static str, uid: &'static str, source| Request {
            pv_name: pv,
            claim: &claim,
            namespace: "ns",
            name: uid,
            uid,
            class_name: "local",
            params: &params,
            size_bytes: 1 << 20,
            access_modes: &modes,
            node: "n",
            source,
        };
        let made = p.provision(&cfg, &req("pvc-u1", "u1", None)).unwrap();
        let src = PathBuf::from(&made.location);
        std::fs::create_dir(src.join("d")).unwrap();
        std::fs::write(src.join("d/f"), b"hello").unwrap();
        let src_pv: PersistentVolume = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "pvc-u1", "annotations": {ANN_NODE: "n"}},
            "spec": {"claimRef": {"uid": "u1"},
                     "flexVolume": {"driver": "flexvol/hostpath", "options": made.options}}
        }))
        .unwrap();

        // Mounted by a pod on this node (the driver's record): waits, nothing made.
        let store = crate::node::state::StateStore::new(&cfg.state_dir, "hostpath");
        let rec = crate::node::state::VolumeRecord {
            backend: "hostpath".into(),
            verb: "mount".into(),
            target: d.path().join("pod-target"),
            mount_point: None,
            source: made.location.clone(),
            read_only: false,
            volume: Some("pvc-u1".into()),
            pod: Some("ns/writer".into()),
            pod_uid: None,
            since: 0,
            extra: BTreeMap::new(),
        };
        store.save(&rec).unwrap();
        let e = p
            .provision(&cfg, &req("pvc-u2", "u2", Some(&src_pv)))
            .unwrap_err();
        assert!(
            matches!(&e, Refusal::Wait(w) if w.starts_with("waiting: its source volume pvc-u1 is mounted") && w.contains("ns/writer")),
            "{e:?}"
        );
        let clone_dir = root.canonicalize().unwrap().join("pvc-u2_ns_u2");
        assert!(!clone_dir.exists());
        store.remove(&rec.target).unwrap();

        // Not mounted: copied.
        let made2 = p
            .provision(&cfg, &req("pvc-u2", "u2", Some(&src_pv)))
            .unwrap();
        assert_eq!(made2.location, clone_dir.display().to_string());
        assert_eq!(std::fs::read(clone_dir.join("d/f")).unwrap(), b"hello");
        let note = &made2.annotations[ANN_CLONED_FROM];
        assert!(note.starts_with("pvc-u1 (1 files"), "{note}");
        // Again (a pass killed after the copy, before the PV): made over, same data.
        std::fs::write(clone_dir.join("stray"), b"half").unwrap();
        let again = p
            .provision(&cfg, &req("pvc-u2", "u2", Some(&src_pv)))
            .unwrap();
        assert_eq!(again.location, made2.location);
        assert!(!clone_dir.join("stray").exists());
        assert_eq!(std::fs::read(clone_dir.join("d/f")).unwrap(), b"hello");

        // A PV whose claim uid is not the one the directory was made for: not ours, refused.
        let mut forged = src_pv.clone();
        forged
            .spec
            .as_mut()
            .unwrap()
            .claim_ref
            .as_mut()
            .unwrap()
            .uid = Some("u9".into());
        let e = p
            .provision(&cfg, &req("pvc-u3", "u3", Some(&forged)))
            .unwrap_err();
        assert!(
            matches!(&e, Refusal::Fail(w) if w.starts_with("its source:")),
            "{e:?}"
        );
        assert!(!root.join("pvc-u3_ns_u3").exists());
    }

    /// Issue #32, 1: "not in use" is decided before the copy, and a pod may mount the source
    /// and write it while it is copied: any change to the source during the copy (here a write
    /// at the pause point after it) fails the copy as changed, so the torn copy is never kept.
    #[test]
    fn a_source_changed_during_the_copy_is_not_kept() {
        let d = tempfile::tempdir().unwrap();
        let d = d.path().canonicalize().unwrap();
        let (src, dst) = (d.join("src"), d.join("dst"));
        std::fs::create_dir_all(src.join("sub")).unwrap();
        std::fs::create_dir_all(&dst).unwrap();
        std::fs::write(src.join("sub/f"), b"one").unwrap();
        let f = src.join("sub/f");
        let e = HostPathProvisioner::copy_from_with(&src, None, &dst, &mut || {
            std::thread::sleep(std::time::Duration::from_millis(20));
            std::fs::write(&f, b"two").unwrap();
        })
        .unwrap_err();
        assert!(matches!(e, copy::CopyError::Changed(_)), "{e:?}");
        let e = e.to_string();
        assert!(e.starts_with(copy::CHANGED), "{e}");
        let dst2 = d.join("dst2");
        std::fs::create_dir_all(&dst2).unwrap();
        let c = HostPathProvisioner::copy_from(&src, None, &dst2).unwrap();
        assert_eq!(c.files, 1, "unchanged, it is kept");
    }
}
