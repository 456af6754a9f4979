//! The LVM provisioner's node side: one logical volume per claim, made by the instance on the
//! claim's selected node, in a volume group this node's config grants.
//!
//! - **Class parameters** (`flexvol/lvm` StorageClasses): `volumegroup` (required), `thinpool`,
//!   `fsType`, `mkfsOptions`, validated by the driver's own option parser
//!   ([`LvmOptions::parse`]: LVM's name charset, the filesystem type, the mkfs allow-list), so a
//!   class accepts exactly what a PV may say. Unknown keys are errors.
//! - **Node policy** (`lvm` in the node config, the driver's): the VG must be in
//!   `allowedVolumeGroups`; the size, rounded up to whole extents, must fit `maxVolumeSize`; a thick
//!   LV must leave `vgReserve` free in the VG; a thin LV must keep the virtual sizes of its pool's
//!   thin LVs within `thinOverprovisionRatio` × the pool's size. Anything this node cannot serve
//!   (VG not granted or missing, no thin pool, no room) is [`Refusal::Reschedule`]: another node
//!   may be able to.
//! - **Provision**: the LV is named after the PV (`pvc-<claim uid>`) and created carrying two tags
//!   in the same `lvcreate` (one metadata commit, so there is never an untagged LV of ours):
//!   `flexvol.created` (the driver's mark: it may use the LV) and `flexvol.pv.<pv name>`
//!   ([`pv_tag`], the ownership mark for exactly this PV). The LV is not formatted here: its start
//!   is zeroed and old signatures wiped (`-Zy -Wy`, thin LVs read zeros), so the driver's
//!   `mountdevice` finds it provably blank and runs mkfs with the class's `fsType`/`mkfsOptions`,
//!   which the PV carries (`flexVolume.fsType`, the `mkfsOptions` option; the API server refuses
//!   `kubernetes.io/` keys in a PV's options). The PV's options name the LV (`volumegroup`,
//!   `volumeID`) and carry no `size`, so the driver uses exactly this LV and never creates one.
//!   The options also carry `capabilityToken`: the node key's HMAC over the PV's name and
//!   `<vg>/<lv>` ([`crate::node::capability`]; the key, `<stateDir>/capability.key`, is made on
//!   first use and never leaves the node), without which the driver serves an LV tagged
//!   `flexvol.pv.<pv>` to nobody (an inline volume naming the LV is refused).
//!   A kill after `lvcreate` leaves an LV tagged for the PV: the next pass finds it and reuses it.
//!   An LV of that name without our tag for this PV is never touched (Fail).
//! - **Delete**: only an LV carrying `flexvol.pv.<pv name>` (the tag is computed from the PV's
//!   name, never read from the PV), only when it is mounted nowhere, is no swap, has no device
//!   stacked on it and is not open: the driver's "in use" checks, except that a kubelet mount
//!   counts as use too. Then `lvchange -an` and `lvremove`. An LV already gone is success.
//! - **Expand**: `lvextend` to the size rounded up to extents, after the same room checks as
//!   creation; an LV already big enough is success (the driver's `expandfs` may have grown it).
//!   kubelet then calls the driver's `expandfs`, which grows the filesystem (it skips `lvextend`
//!   when the LV is already big enough).
//!
//! Locks: the driver's (`lvm:<vg>/<lv>`, then `lvm:vg:<vg>` for free-space decisions), so the
//! provisioner and driver verbs creating LVs in one VG check free space one at a time. Every LVM
//! command goes through the driver's LV service ([`LvService`]: absolute paths, argv, deadlines),
//! injected with the block devices ([`LvmProvisioner::with_seams`]), so unit tests run this module
//! against an in-memory LVM as well as against scripted `lvm` command lines.

use crate::backend::lvm::options::key;
use crate::backend::lvm::policy::{self, LvmConfig};
use crate::backend::lvm::{
    Devices, LvRow, LvService, LvmCommands, LvmError, LvmOptions, Seams, SysDevices, TAG_CREATED,
    TAG_FORMATTED, TAG_GROW_FS, check_name, round_up,
};
use crate::backend::{Backend, Context};
use crate::node::capability::{Key, Location, OPTION, node_key_path};
use crate::node::config::Config;
use crate::protocol::options::{Options, keys};
use crate::provision::storage::error::MalformedPv;
use crate::provision::storage::{
    ClassError, Kind, ProvisionError, Provisioned, Provisioner, Refusal, Request,
};
use crate::sys::process::{Deadline, checkpoint};
use crate::vocab::ANN_LV;
use crate::vocab::ANN_VG;
use crate::vocab::{ANN_SIZE, ANN_SIZE_ENFORCED};
use k8s_openapi::api::core::v1::PersistentVolume;
use std::collections::BTreeMap;

/// Class parameter names.
pub(crate) const PARAMS: [&str; 4] = ["volumegroup", "thinpool", "fsType", "mkfsOptions"];
/// Prefix of the tag naming the PV an LV was made for (the driver's, which serves such an LV only
/// through the PV's capability).
pub(crate) const TAG_PV_PREFIX: &str = crate::backend::lvm::TAG_PV_PREFIX;

/// The ownership tag of the LV made for PV `pv`: `flexvol.pv.<pv>`. PV names are DNS subdomain
/// names, inside LVM's tag charset; anything else is refused rather than mangled (two PVs must
/// never share a tag).
pub(crate) fn pv_tag(pv: &str) -> Result<String, MalformedPv> {
    let ok = !pv.is_empty()
        && pv.len() <= 253
        && pv
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-.".contains(&b));
    if ok {
        Ok(format!("{TAG_PV_PREFIX}{pv}"))
    } else {
        Err(MalformedPv(format!(
            "PV name {pv:?} cannot be an LVM tag (expected a Kubernetes object name)"
        )))
    }
}

/// A class's parameters, validated by the driver's option parser.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ClassParams {
    /// The driver's view of a volume of this class (`lv` is a placeholder until [`Self::for_pv`]).
    pub volume: LvmOptions,
    /// `fsType` as written, when set.
    pub fs_type: Option<String>,
    /// `mkfsOptions` as written (validated), when set.
    pub(crate) mkfs_options: Option<String>,
}

impl ClassParams {
    /// Validates a StorageClass's `parameters`; unknown keys are errors.
    pub fn parse(params: &BTreeMap<String, String>) -> Result<Self, ClassError> {
        // nodeLossGracePeriod is the cluster controller's (crate::controller::nodeloss::decide), checked here too.
        let params = &crate::vocab::class::split_param(params)?;
        if let Some(k) = params.keys().find(|k| !PARAMS.contains(&k.as_str())) {
            return Err(ClassError(format!(
                "unknown class parameter {k:?} (names are case-sensitive); the lvm provisioner knows {}, {}, {}",
                PARAMS.join(", "),
                crate::vocab::class::PARAM,
                crate::vocab::class::CSI_DRIVER
            )));
        }
        let mut o = serde_json::Map::new();
        o.insert(key::VOLUME_ID.into(), "pvc-x".into());
        for (k, v) in params {
            let k = if k == "fsType" {
                keys::FS_TYPE
            } else {
                k.as_str()
            };
            o.insert(k.into(), v.clone().into());
        }
        let json = serde_json::Value::Object(o).to_string();
        let volume = Options::parse(&json)
            .and_then(|o| LvmOptions::parse(&o))
            .map_err(|e| ClassError(format!("class parameters: {e}")))?;
        Ok(Self {
            volume,
            fs_type: params.get("fsType").filter(|s| !s.is_empty()).cloned(),
            mkfs_options: params.get("mkfsOptions").filter(|s| !s.is_empty()).cloned(),
        })
    }

    /// The driver's options for the LV of PV `pv` (its name checked as an LV name).
    pub(crate) fn for_pv(&self, pv: &str) -> Result<LvmOptions, MalformedPv> {
        check_name(key::VOLUME_ID, pv, true).map_err(|e| MalformedPv(e.to_string()))?;
        Ok(LvmOptions {
            lv: pv.to_owned(),
            ..self.volume.clone()
        })
    }

    /// The PV's flexVolume options: exactly this LV (no `size`, so the driver creates nothing),
    /// and the mkfs options. The filesystem type goes in the PV's `flexVolume.fsType`
    /// ([`Provisioned::fs_type`]), which kubelet sends as `kubernetes.io/fsType`.
    pub(crate) fn pv_options(&self, o: &LvmOptions) -> BTreeMap<String, String> {
        let mut m = BTreeMap::from([
            (key::VOLUME_GROUP.to_owned(), o.vg.clone()),
            (key::VOLUME_ID.to_owned(), o.lv.clone()),
        ]);
        if let Some(x) = &self.mkfs_options {
            m.insert(key::MKFS_OPTIONS.to_owned(), x.clone());
        }
        m
    }
}

/// The LVM kind: node-local; kubelet grows the filesystem (`expandfs`).
pub(crate) const KIND: Kind = Kind {
    name: "lvm",
    node_local: true,
    access_modes: &["ReadWriteOnce"],
    node_finishes_resize: true,
};

/// The `flexvol/lvm` backend of the provisioner.
pub struct LvmProvisioner {
    /// `<vendor>/lvm`: the driver name kubelet knows (its mount directories).
    driver_name: String,
    /// The block devices (the LVM driver's seam).
    devices: Box<dyn Devices>,
    /// The LV service (the LVM driver's).
    lvs: Box<dyn LvService>,
}

impl LvmProvisioner {
    /// The provisioner for driver `<vendor>/lvm`, over the node's devices and `lvm`.
    pub fn new(vendor: &str) -> Self {
        Self::with_seams(vendor, Box::new(SysDevices), Box::new(LvmCommands))
    }

    /// The backend over other devices and another LV service (unit tests).
    pub fn with_seams(vendor: &str, devices: Box<dyn Devices>, lvs: Box<dyn LvService>) -> Self {
        Self {
            driver_name: format!("{vendor}/lvm"),
            devices,
            lvs,
        }
    }

    /// Runs `f` with the node's real seams and this backend's LVM seams, as a driver verb runs
    /// (deadline: the verb timeout).
    fn with_ctx<T>(&self, cfg: &Config, f: impl FnOnce(&Context, &Seams) -> T) -> T {
        let seams = Seams {
            devices: &*self.devices,
            lvs: &*self.lvs,
        };
        let deadline = Deadline::after(cfg.verb_timeout());
        crate::backend::on_node(cfg, deadline, &self.driver_name, |ctx| f(ctx, &seams))
    }
}

/// Checks an LVM class's parameters ([`Provisioner::check_class`]), pure: also what the
/// scheduler extender checks before it counts a claim of the class against a node
/// ([`crate::provision::storage::plan_claim`]).
pub fn check_params(params: &BTreeMap<String, String>) -> Result<(), ClassError> {
    ClassParams::parse(params).map(|_| ())
}

impl Provisioner for LvmProvisioner {
    fn kind(&self) -> &'static Kind {
        &KIND
    }

    fn serves(&self, cfg: &Config, _node: &str) -> bool {
        !cfg.lvm.allowed_volume_groups.is_empty()
    }

    fn check_class(&self, params: &BTreeMap<String, String>) -> Result<(), ClassError> {
        check_params(params)
    }

    fn provision(&mut self, cfg: &Config, req: &Request<'_>) -> Result<Provisioned, Refusal> {
        self.with_ctx(cfg, |ctx, seams| provision(ctx, seams, req))
    }

    // The LVM steps keep their plain messages: a failure to retry.
    fn delete(&mut self, cfg: &Config, pv: &PersistentVolume) -> Result<String, ProvisionError> {
        self.with_ctx(cfg, |ctx, seams| delete(ctx, seams, pv))
    }

    fn expand(
        &mut self,
        cfg: &Config,
        pv: &PersistentVolume,
        bytes: u64,
    ) -> Result<u64, ProvisionError> {
        self.with_ctx(cfg, |ctx, seams| expand(ctx, seams, pv, bytes))
    }

    fn recover(&mut self, _cfg: &Config, _node: &str) -> Vec<String> {
        // Nothing is ever half done: lvcreate makes the LV with its tags in one step, a killed
        // delete leaves the tagged LV, which the next delete pass removes.
        Vec::new()
    }
}

/// Makes (or finds, made by an earlier pass for this PV) the LV of `req`.
pub(crate) fn provision(
    ctx: &Context,
    seams: &Seams,
    req: &Request<'_>,
) -> Result<Provisioned, Refusal> {
    let params = ClassParams::parse(req.params).map_err(|e| Refusal::Fail(e.to_string()))?;
    let o = params
        .for_pv(req.pv_name)
        .map_err(|e| Refusal::Fail(e.to_string()))?;
    let tag = pv_tag(req.pv_name).map_err(|e| Refusal::Fail(e.to_string()))?;
    let cfg = &ctx.config.lvm;
    if !cfg.vg_allowed(&o.vg) {
        return Err(Refusal::Reschedule(format!(
            "volume group {} is not in node {}'s lvm.allowedVolumeGroups",
            o.vg, req.node
        )));
    }
    let fail = |e: crate::error::Error| Refusal::Fail(e.to_string());
    let lvm_fail = |e: LvmError| Refusal::Fail(e.to_string());
    // The node key signs the PV's capability; read (or made) before anything is created.
    let key = Key::load_or_create(&node_key_path(&ctx.config.state_dir))
        .map_err(|e| Refusal::Fail(e.to_string()))?;
    let _lock = ctx.lock(Backend::Lvm, &o.key()).map_err(fail)?;
    // A clone's source: named by its PV's annotations, in this class's VG, locked (the driver's
    // lock: no mountdevice or expandfs of it meanwhile) before the VG (the driver's order; it
    // never holds two LV locks).
    let source = match req.source {
        Some(pv) => {
            let (svg, slv, stag) = names(pv).map_err(|e| Refusal::Fail(e.to_string()))?;
            if svg != o.vg || slv == o.lv {
                return Err(Refusal::Fail(format!(
                    "its source {svg}/{slv} is not another LV of this class's volume group {}; nothing was created",
                    o.vg
                )));
            }
            let name = pv.metadata.name.clone().unwrap_or_default();
            let lock = ctx
                .lock(Backend::Lvm, &volume(&svg, &slv).key())
                .map_err(fail)?;
            Some((slv, stag, name, lock))
        }
        None => None,
    };
    let _vg_lock = ctx
        .lock(Backend::Lvm, &format!("vg:{}", o.vg))
        .map_err(fail)?;
    let lvs = seams.lvs.list(ctx, &o.vg).map_err(|e| match e {
        LvmError::VgNotFound { .. } => Refusal::Reschedule(format!(
            "volume group {} does not exist on node {}",
            o.vg, req.node
        )),
        e => lvm_fail(e),
    })?;
    let made = |row: &LvRow| -> Result<Provisioned, Refusal> {
        if row.lv_size < req.size_bytes {
            return Err(Refusal::Fail(format!(
                "{} (made for {} by an earlier pass) has {} bytes, less than the {} asked; remove it (lvremove {}) to have it made again",
                o.key(),
                req.pv_name,
                row.lv_size,
                req.size_bytes,
                o.key()
            )));
        }
        Ok(made_for(
            &params,
            &o,
            row.lv_size,
            &key,
            req.pv_name,
            req.namespace,
        ))
    };
    if let Some((slv, stag, sname, _)) = &source {
        let src = lvs
            .iter()
            .find(|r| &r.lv_name == slv && r.has_tag(stag) && r.has_tag(TAG_CREATED))
            .ok_or_else(|| {
                Refusal::Fail(format!(
                    "its source {}/{slv} does not exist on this node with the tags {TAG_CREATED} and {stag}; nothing was created",
                    o.vg
                ))
            })?;
        let p = clone(ctx, seams, req, &o, &tag, &lvs, src, sname)?;
        let mut p = made(&p)?;
        p.annotations.insert(
            crate::vocab::ANN_CLONED_FROM.to_owned(),
            format!(
                "{sname} ({})",
                if src.is_thin() {
                    "thin snapshot"
                } else {
                    "block copy"
                }
            ),
        );
        return Ok(p);
    }
    if let Some(row) = lvs.iter().find(|r| r.lv_name == o.lv) {
        if row.has_tag(&tag) && row.has_tag(TAG_CREATED) {
            return made(row);
        }
        return Err(Refusal::Fail(format!(
            "logical volume {} exists but was not made by flexvol for {} (it lacks the tags {TAG_CREATED} and {tag}); flexvol leaves it alone. Rename or remove it if it is not needed, then the claim is provisioned on the next pass",
            o.key(),
            req.pv_name
        )));
    }
    // Free space and extent size, read under the VG lock.
    let vg = seams.lvs.vg(ctx, &o.vg).map_err(lvm_fail)?;
    let bytes = round_up(req.size_bytes, vg.vg_extent_size.max(1)).map_err(fail)?;
    let resched = |e: String| Refusal::Reschedule(format!("node {}: {e}", req.node));
    policy::check_max_size(cfg, &o, bytes).map_err(|e| resched(e.to_string()))?;
    match &o.thin_pool {
        Some(pool) => {
            thin_room(cfg, &lvs, &o.vg, pool, bytes).map_err(|e| resched(e.to_string()))?;
        }
        None => {
            policy::check_free(cfg, &o, bytes, vg.vg_free).map_err(|e| resched(e.to_string()))?
        }
    }
    seams
        .lvs
        .create(
            ctx,
            &o.vg,
            &o.lv,
            bytes,
            o.thin_pool.as_deref(),
            &[TAG_CREATED, &tag],
        )
        .map_err(lvm_fail)?;
    checkpoint("lvm-provision-after-lvcreate");
    // What LVM really made (it may round further).
    let lvs = seams.lvs.list(ctx, &o.vg).map_err(lvm_fail)?;
    let row = lvs.iter().find(|r| r.lv_name == o.lv).ok_or_else(|| {
        Refusal::Fail(format!(
            "lvcreate of {} succeeded but lvs does not list it; retrying on the next pass",
            o.key()
        ))
    })?;
    made(row)
}

/// Why a thick source in use is not copied ([`crate::provision::storage::cloning::check_not_in_use`]).
const IN_USE: &str =
    "a block copy of a mounted LV would be neither point-in-time nor crash-consistent";

/// Makes (or finds, made by an earlier pass) the clone `o` of the source LV `src` (of PV
/// `src_pv`, its ownership checked by the caller), under the new LV's, the source's and the VG's
/// locks; returns its row. The reconciler read from the server that the clone's PV does not
/// exist, so nothing uses an LV of ours found under its name: a thick one (whose copy an
/// earlier pass may not have finished) is copied again.
/// - a thin source: a thin snapshot (`lvcreate -s`), taken even while the source is in use:
///   the kernel takes it atomically, a crash-consistent image (what a power cut would leave;
///   the filesystem replays its journal on mount);
/// - a thick source: a new thick LV of the requested size and a block copy of the source, only
///   while no pod uses the source (the driver's records, [`crate::provision::storage::cloning`], and the LV not
///   open); otherwise the claim waits;
/// - larger than the source: the LV is extended and tagged [`TAG_GROW_FS`], so the driver grows
///   the filesystem on its first mount; the clone is never formatted (it carries
///   [`TAG_FORMATTED`] when its source does).
#[allow(clippy::too_many_arguments)]
fn clone(
    ctx: &Context,
    seams: &Seams,
    req: &Request<'_>,
    o: &LvmOptions,
    tag: &str,
    lvs: &[LvRow],
    src: &LvRow,
    src_pv: &str,
) -> Result<LvRow, Refusal> {
    let cfg = &ctx.config.lvm;
    let fail = |e: crate::error::Error| Refusal::Fail(e.to_string());
    let lvm_fail = |e: LvmError| Refusal::Fail(e.to_string());
    // No room is no reason to send the claim elsewhere: the source is here.
    let resched = |e: String| Refusal::Fail(format!("node {}: {e}", req.node));
    let key = |lv: &str| format!("{}/{lv}", o.vg);
    let bytes = round_up(req.size_bytes, src.vg_extent_size.max(1))
        .map_err(fail)?
        .max(src.lv_size);
    policy::check_max_size(cfg, o, bytes).map_err(|e| resched(e.to_string()))?;
    let mut tags = vec![TAG_CREATED, tag];
    if src.has_tag(TAG_FORMATTED) {
        tags.push(TAG_FORMATTED);
    }
    if bytes > src.lv_size {
        tags.push(TAG_GROW_FS);
    }
    let existing = lvs.iter().find(|r| r.lv_name == o.lv);
    if let Some(row) = existing
        && !(row.has_tag(tag) && row.has_tag(TAG_CREATED))
    {
        return Err(Refusal::Fail(format!(
            "logical volume {} exists but was not made by flexvol for {} (it lacks the tags {TAG_CREATED} and {tag}); flexvol leaves it alone",
            o.key(),
            req.pv_name
        )));
    }
    let thin_pool = o.thin_pool.as_deref();
    match (src.is_thin(), thin_pool) {
        (true, Some(pool)) if src.pool_lv == pool => {
            if existing.is_none() {
                thin_room(cfg, lvs, &o.vg, pool, bytes).map_err(|e| resched(e.to_string()))?;
                seams
                    .lvs
                    .snapshot(ctx, &o.vg, &src.lv_name, &o.lv, &tags)
                    .map_err(lvm_fail)?;
                checkpoint("lvm-clone-after-snapshot");
            }
        }
        (false, None) => {
            if src.open() {
                return Err(crate::provision::storage::cloning::waiting(
                    src_pv,
                    &format!("the open LV {}", key(&src.lv_name)),
                    IN_USE,
                ));
            }
            crate::provision::storage::cloning::check_not_in_use(
                ctx.config,
                Backend::Lvm,
                src_pv,
                &crate::provision::storage::cloning::Source::Lv {
                    vg: &o.vg,
                    lv: &src.lv_name,
                },
                IN_USE,
            )?;
            match existing {
                Some(row) if row.open() => {
                    return Err(Refusal::Fail(format!(
                        "{} is open although it has no PV; left alone",
                        o.key()
                    )));
                }
                Some(_) => {}
                None => {
                    policy::check_free(cfg, o, bytes, src.vg_free)
                        .map_err(|e| resched(e.to_string()))?;
                    seams
                        .lvs
                        .create(ctx, &o.vg, &o.lv, bytes, None, &tags)
                        .map_err(lvm_fail)?;
                }
            }
            copy_lv(ctx, seams, o, src, lvs)?;
            checkpoint("lvm-clone-after-copy");
        }
        _ => {
            return Err(Refusal::Fail(format!(
                "its source {} is {} but this class makes {} LVs; a clone is of its source's class; nothing was created",
                key(&src.lv_name),
                if src.is_thin() {
                    format!("a thin LV of pool {}", src.pool_lv)
                } else {
                    "a thick LV".to_owned()
                },
                thin_pool.map_or("thick".to_owned(), |p| format!("thin ({p})"))
            )));
        }
    }
    let row = |lvs: &[LvRow]| {
        lvs.iter()
            .find(|r| r.lv_name == o.lv)
            .cloned()
            .ok_or_else(|| {
                Refusal::Fail(format!(
                    "{} was made but lvs does not list it; retrying on the next pass",
                    o.key()
                ))
            })
    };
    let mut now = row(&seams.lvs.list(ctx, &o.vg).map_err(lvm_fail)?)?;
    // The clone is tagged for its own PV only, whatever an LVM version copies from the origin
    // (a kill before this is finished by the next pass: the reconciler retries until the PV).
    let foreign: Vec<String> = now
        .lv_tags
        .split(',')
        .filter(|t| t.starts_with(TAG_PV_PREFIX) && *t != tag)
        .map(str::to_owned)
        .collect();
    for t in &foreign {
        seams.lvs.del_tag(ctx, &o.key(), t).map_err(lvm_fail)?;
    }
    if now.lv_size < bytes {
        if now.is_thin() {
            let lvs = seams.lvs.list(ctx, &o.vg).map_err(lvm_fail)?;
            thin_room(cfg, &lvs, &o.vg, &now.pool_lv, bytes - now.lv_size)
                .map_err(|e| resched(e.to_string()))?;
        }
        seams.lvs.extend(ctx, &o.key(), bytes).map_err(lvm_fail)?;
        now = row(&seams.lvs.list(ctx, &o.vg).map_err(lvm_fail)?)?;
    }
    Ok(now)
}

/// Copies the thick LV `src` onto the new LV `o` (active for the copy: the source only for it,
/// the clone left inactive as the driver expects an LV no pod uses).
fn copy_lv(
    ctx: &Context,
    seams: &Seams,
    o: &LvmOptions,
    src: &LvRow,
    lvs: &[LvRow],
) -> Result<(), Refusal> {
    let lvm_fail = |e: LvmError| Refusal::Fail(e.to_string());
    let s = volume(&o.vg, &src.lv_name);
    let was_active = src.active();
    if !was_active {
        seams.lvs.activate(ctx, &s.key()).map_err(lvm_fail)?;
    }
    let new_active = lvs
        .iter()
        .find(|r| r.lv_name == o.lv)
        .is_none_or(LvRow::active);
    if !new_active {
        seams.lvs.activate(ctx, &o.key()).map_err(lvm_fail)?;
    }
    let wait = |p: &std::path::Path| {
        crate::backend::lvm::tools::wait_for_device(
            ctx,
            seams.devices,
            p,
            std::time::Duration::from_secs(ctx.config.lvm.device_wait_seconds),
        )
    };
    let copied = wait(&s.device())
        .and_then(|_| wait(&o.device()))
        .and_then(|_| {
            seams
                .devices
                .copy_blocks(&s.device(), &o.device(), src.lv_size, &ctx.deadline)
        });
    // Both as the driver expects: inactive unless a pod uses it.
    let mut undo = Vec::new();
    if !was_active && let Err(e) = seams.lvs.deactivate(ctx, &s.key()) {
        undo.push(format!("deactivating {}: {e}", s.key()));
    }
    if let Err(e) = seams.lvs.deactivate(ctx, &o.key()) {
        undo.push(format!("deactivating {}: {e}", o.key()));
    }
    match (copied, undo.is_empty()) {
        (Ok(()), true) => Ok(()),
        (Ok(()), false) => Err(Refusal::Fail(format!(
            "{} copied, but {}; retrying",
            o.key(),
            undo.join("; ")
        ))),
        (Err(e), _) => Err(Refusal::Fail(format!(
            "copying {} to {} failed: {e}; the copy is made again on the next pass",
            s.key(),
            o.key()
        ))),
    }
}

fn made_for(
    params: &ClassParams,
    o: &LvmOptions,
    size: u64,
    key: &Key,
    pv: &str,
    namespace: &str,
) -> Provisioned {
    let mut options = params.pv_options(o);
    options.insert(
        OPTION.to_owned(),
        key.sign_for(
            pv,
            namespace,
            &Location::Lvm {
                vg: &o.vg,
                lv: &o.lv,
            },
        ),
    );
    Provisioned {
        options,
        capacity_bytes: size,
        annotations: BTreeMap::from([
            (ANN_SIZE.to_owned(), size.to_string()),
            (ANN_SIZE_ENFORCED.to_owned(), "true".to_owned()),
            (ANN_VG.to_owned(), o.vg.clone()),
            (ANN_LV.to_owned(), o.lv.clone()),
        ]),
        location: o.key(),
        fs_type: params.fs_type.clone(),
    }
}

/// Why a thin pool has no room ([`thin_room`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum ThinRoomError {
    /// The class's (or LV's) thin pool is not in the volume group.
    #[error("thin pool {0} does not exist")]
    NoPool(String),
    /// More would pass `lvm.thinOverprovisionRatio`.
    #[error("{0}")]
    Full(String),
}

/// A pool without room is a step that failed: a later pass (or a smaller request) may fit.
impl From<ThinRoomError> for ProvisionError {
    fn from(e: ThinRoomError) -> Self {
        Self::Failed(e.to_string())
    }
}

/// Whether `extra` more virtual bytes fit in thin pool `vg/pool` under
/// `lvm.thinOverprovisionRatio`.
fn thin_room(
    cfg: &LvmConfig,
    lvs: &[LvRow],
    vg: &str,
    pool: &str,
    extra: u64,
) -> Result<(), ThinRoomError> {
    let p = lvs
        .iter()
        .find(|r| r.lv_name == pool && r.is_thin_pool())
        .ok_or_else(|| ThinRoomError::NoPool(format!("{vg}/{pool}")))?;
    let committed: u64 = lvs
        .iter()
        .filter(|r| r.pool_lv == pool)
        .map(|r| r.lv_size)
        .sum();
    let limit =
        u64::try_from(u128::from(p.lv_size) * u128::from(cfg.thin_overprovision_permille) / 1000)
            .unwrap_or(u64::MAX);
    let total = committed.saturating_add(extra);
    if total > limit {
        return Err(ThinRoomError::Full(format!(
            "thin pool {vg}/{pool} ({} bytes) already holds {committed} bytes of thin volumes; {extra} more would make {total}, past the limit of {limit} bytes (lvm.thinOverprovisionRatio {}); grow the pool or ask for less",
            p.lv_size,
            policy::show_ratio(cfg.thin_overprovision_permille)
        )));
    }
    Ok(())
}

/// The VG and LV a PV of ours names (annotations written at provisioning), checked.
/// Anything missing or not as recorded is [`ProvisionError::Refused`].
fn names(pv: &PersistentVolume) -> Result<(String, String, String), ProvisionError> {
    let name = pv.metadata.name.as_deref().unwrap_or_default();
    let ann = pv.metadata.annotations.as_ref();
    let get = |k: &str| {
        ann.and_then(|a| a.get(k)).cloned().ok_or_else(|| {
            ProvisionError::Refused(format!("PV {name} lacks the annotation {k}; it was not made by the flexvol/lvm provisioner, or was edited. Remove the LV by hand if it is not needed"))
        })
    };
    let refused = |e: &dyn std::fmt::Display| ProvisionError::Refused(format!("PV {name}: {e}"));
    let (vg, lv) = (get(ANN_VG)?, get(ANN_LV)?);
    check_name(key::VOLUME_GROUP, &vg, false).map_err(|e| refused(&e))?;
    check_name(key::VOLUME_ID, &lv, true).map_err(|e| refused(&e))?;
    Ok((vg, lv, pv_tag(name)?))
}

fn volume(vg: &str, lv: &str) -> LvmOptions {
    LvmOptions::named(
        vg.to_owned(),
        lv.to_owned(),
        crate::backend::lvm::FsType::Ext4,
    )
}

/// Removes the LV of a Released PV: only ours for exactly this PV, only when unused. An LV
/// not tagged for it is [`ProvisionError::Refused`]; one in use, or a step that failed,
/// [`ProvisionError::Failed`].
pub(crate) fn delete(
    ctx: &Context,
    seams: &Seams,
    pv: &PersistentVolume,
) -> Result<String, ProvisionError> {
    let (vg, lv, tag) = names(pv)?;
    let o = volume(&vg, &lv);
    let e = |e: crate::error::Error| ProvisionError::Failed(e.to_string());
    let _lock = ctx.lock(Backend::Lvm, &o.key()).map_err(e)?;
    let lvs = seams.lvs.list(ctx, &vg).map_err(|x| x.to_string())?;
    let Some(row) = lvs.iter().find(|r| r.lv_name == lv) else {
        return Ok(format!("{} was already gone", o.key()));
    };
    if !row.has_tag(&tag) {
        return Err(ProvisionError::Refused(format!(
            "{} does not carry the tag {tag}: it was not made for this PV, so flexvol does not remove it. Remove it by hand if it is not needed",
            o.key()
        )));
    }
    if row.active() {
        if let Some(devnum) = seams.devices.block_device(&o.device()).map_err(e)? {
            let table = ctx.mounter.table().map_err(|x| x.to_string())?;
            if let Some(m) = table.entries.iter().find(|m| (m.major, m.minor) == devnum) {
                return Err(ProvisionError::Failed(format!(
                    "{} is still mounted at {}; it is removed once nothing uses it",
                    o.key(),
                    m.mount_point.display()
                )));
            }
            policy::check_not_in_use(
                ctx.driver_name,
                seams.devices,
                &table,
                &o,
                devnum,
                Some(row.open()),
            )
            .map_err(e)?;
        }
        seams.lvs.deactivate(ctx, &o.key()).map_err(|x| {
            format!(
                "{} could not be deactivated before removal ({x}); it is removed once nothing uses it",
                o.key()
            )
        })?;
    }
    checkpoint("lvm-provision-before-lvremove");
    seams.lvs.remove(ctx, &o.key()).map_err(|x| x.to_string())?;
    checkpoint("lvm-provision-after-lvremove");
    Ok(format!("removed {}", o.key()))
}

/// Grows the LV of a bound PV to at least `bytes`; returns its size. No LV tagged for it is
/// [`ProvisionError::NotFound`].
pub(crate) fn expand(
    ctx: &Context,
    seams: &Seams,
    pv: &PersistentVolume,
    bytes: u64,
) -> Result<u64, ProvisionError> {
    let (vg, lv, tag) = names(pv)?;
    let o = volume(&vg, &lv);
    let e = |e: crate::error::Error| ProvisionError::Failed(e.to_string());
    let _lock = ctx.lock(Backend::Lvm, &o.key()).map_err(e)?;
    let _vg_lock = ctx.lock(Backend::Lvm, &format!("vg:{vg}")).map_err(e)?;
    let lvs = seams.lvs.list(ctx, &vg).map_err(|x| x.to_string())?;
    let row = lvs
        .iter()
        .find(|r| r.lv_name == lv && r.has_tag(&tag))
        .ok_or_else(|| {
            ProvisionError::NotFound(format!(
                "{} with the tag {tag} does not exist on this node; cannot grow it",
                o.key()
            ))
        })?;
    if row.lv_size >= bytes {
        return Ok(row.lv_size);
    }
    let target = round_up(bytes, row.vg_extent_size.max(1)).map_err(e)?;
    let cfg = &ctx.config.lvm;
    policy::check_max_size(cfg, &o, target).map_err(e)?;
    let more = target - row.lv_size;
    if row.is_thin() {
        thin_room(cfg, &lvs, &vg, &row.pool_lv, more)?;
    } else {
        policy::check_free(cfg, &o, more, row.vg_free).map_err(e)?;
    }
    seams
        .lvs
        .extend(ctx, &o.key(), target)
        .map_err(|x| x.to_string())?;
    checkpoint("lvm-provision-after-lvextend");
    let lvs = seams.lvs.list(ctx, &vg).map_err(|x| x.to_string())?;
    lvs.iter()
        .find(|r| r.lv_name == lv)
        .map(|r| r.lv_size)
        .ok_or_else(|| ProvisionError::Failed(format!("{} vanished after lvextend", o.key())))
}

#[cfg(test)]
mod tests;
