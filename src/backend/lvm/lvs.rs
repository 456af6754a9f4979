//! The LV service: the one interface through which the LVM driver verbs and the LVM provisioner
//! (`provision::storage::lvm`) read and change volume groups, as TopoLVM's lvmd serves its CSI driver:
//! list (one report), create, extend, remove, activate and deactivate, tag ([`LvService`]).
//!
//! [`LvmCommands`] is the real service: the one `lvm` binary (`lvm lvs`, `lvm lvcreate`, ...)
//! through the call's runner (tools found in `toolDirs`, argv never a shell, each command capped
//! by `commandTimeoutSeconds` and the call's deadline). Unit tests either script `lvm` through a
//! fake runner (the driver's tests: exact command lines) or use `backend::testing::FakeLvs`, an
//! in-memory LVM.
//!
//! Reports use `--reportformat json --units b --nosuffix -o <fields>`: byte counts as JSON strings
//! (lvm2 2.03), never localised, never rounded ([`super::report`]).
//!
//! Failures are [`LvmError`], as TopoLVM's `lvm_error.go` types LVM's: a volume group that does
//! not exist is [`LvmError::VgNotFound`], which callers match (the provisioner sends such a claim
//! to another node), never its message. Converted to the verbs' [`Error`], every variant keeps its
//! message.

use super::report::{self, LvRow, VgRow};
use crate::backend::Context;
use crate::error::Error;
use crate::sys::exec::{Cmd, ExecError};

/// LV fields every report asks for; one `lvs` of the VG tells existence, activation, path, size,
/// tags and the VG's extent size and free space.
pub(crate) const LV_FIELDS: &str =
    "vg_name,lv_name,lv_path,lv_size,lv_attr,lv_tags,pool_lv,vg_extent_size,vg_free";
/// VG fields, for a VG that has no LV yet (an empty `lvs` report carries no VG columns), and its
/// size for the capacity the provisioner publishes.
pub(crate) const VG_FIELDS: &str = "vg_name,vg_extent_size,vg_free,vg_size";

/// Why an LV service call failed.
#[derive(Debug, thiserror::Error)]
pub enum LvmError {
    /// The volume group does not exist on this node; `detail`: what `lvm` said, when it said it.
    #[error("{}", vg_not_found(.vg, .detail.as_ref()))]
    VgNotFound {
        vg: String,
        detail: Option<ExecError>,
    },
    /// An `lvm` command failed (or could not run).
    #[error(transparent)]
    Exec(#[from] ExecError),
    /// A report that cannot be read; the text is the whole message.
    #[error("{0}")]
    Report(String),
}

fn vg_not_found(vg: &str, detail: Option<&ExecError>) -> String {
    match detail {
        Some(e) => format!(
            "volume group {vg} not found on this node ({e}); create it (vgcreate) or fix options.volumegroup"
        ),
        None => format!(
            "volume group {vg} not found on this node; create it (vgcreate) or fix options.volumegroup"
        ),
    }
}

impl From<LvmError> for Error {
    fn from(e: LvmError) -> Self {
        match e {
            LvmError::Exec(e) => Error::Exec(e),
            e @ LvmError::VgNotFound { .. } => Error::Refused(e.to_string()),
            LvmError::Report(msg) => Error::Refused(msg),
        }
    }
}

/// Result of an LV service call.
pub(crate) type Result<T> = std::result::Result<T, LvmError>;

/// Volume groups and their logical volumes. `vg_lv` is `<vg>/<lv>`, names already checked
/// (`options::check_name`). The caller holds the volume's lock (and the VG's, around decisions
/// about free space); the service checks no policy.
pub trait LvService {
    /// Every LV of `vg`, each row with the VG's extent size and free space (one `lvm lvs`).
    fn list(&self, ctx: &Context, vg: &str) -> Result<Vec<LvRow>>;
    /// `vg`'s extent size and free space, also for a VG without LVs (one `lvm vgs`).
    fn vg(&self, ctx: &Context, vg: &str) -> Result<VgRow>;
    /// Creates `lv` in `vg`: a thick LV of `bytes` (already a whole number of extents), or a thin
    /// LV in `pool`, carrying `tags` from the start (one metadata commit: there is never an
    /// untagged LV). Its start is zeroed and old signatures wiped, so it probes blank.
    fn create(
        &self,
        ctx: &Context,
        vg: &str,
        lv: &str,
        bytes: u64,
        pool: Option<&str>,
        tags: &[&str],
    ) -> Result<()>;
    /// Grows the LV to `bytes` (the filesystem is the caller's to grow).
    fn extend(&self, ctx: &Context, vg_lv: &str, bytes: u64) -> Result<()>;
    /// Removes the LV; one that is open is refused (the caller checked it is ours and unused).
    fn remove(&self, ctx: &Context, vg_lv: &str) -> Result<()>;
    /// Activates the LV (activation-skip flags ignored: the volume names this LV on purpose).
    fn activate(&self, ctx: &Context, vg_lv: &str) -> Result<()>;
    /// Deactivates the LV.
    fn deactivate(&self, ctx: &Context, vg_lv: &str) -> Result<()>;
    /// Adds `tag` to the LV.
    fn add_tag(&self, ctx: &Context, vg_lv: &str, tag: &str) -> Result<()>;
    /// Removes `tag` from the LV.
    fn del_tag(&self, ctx: &Context, vg_lv: &str, tag: &str) -> Result<()>;
    /// Takes a thin snapshot `lv` of the thin LV `<vg>/<origin>`: a new thin LV of the origin's
    /// virtual size in the origin's pool, sharing its blocks (the kernel takes it atomically: a
    /// crash-consistent image, also of an origin in use), carrying `tags` from the start (one
    /// metadata commit). It is an independent LV: either may be removed first. LVM marks it
    /// activation-skip ([`LvService::activate`] ignores that).
    fn snapshot(
        &self,
        ctx: &Context,
        vg: &str,
        origin: &str,
        lv: &str,
        tags: &[&str],
    ) -> Result<()>;
}

/// The real LV service: `lvm` commands through the call's runner.
pub(crate) struct LvmCommands;

fn lvm(ctx: &Context, sub: &str) -> Cmd {
    Cmd::new("lvm")
        .arg(sub)
        .timeout(ctx.deadline.cap(ctx.config.command_timeout()))
}

fn report(ctx: &Context, sub: &str, fields: &str, vg: &str) -> Result<(Vec<LvRow>, Vec<VgRow>)> {
    let cmd = lvm(ctx, sub).args([
        "--reportformat",
        "json",
        "--units",
        "b",
        "--nosuffix",
        "-o",
        fields,
        "--",
        vg,
    ]);
    let out = ctx.runner.check(&cmd).map_err(|e| vg_error(vg, e))?;
    report::parse(&out.stdout).map_err(|e| {
        LvmError::Report(format!(
            "cannot read the JSON report of `{}` ({e}); is lvm2 at least 2.02.158?",
            cmd.display()
        ))
    })
}

fn vg_error(vg: &str, e: ExecError) -> LvmError {
    match &e {
        ExecError::Failed { output, .. } if output.tail().contains("not found") => {
            LvmError::VgNotFound {
                vg: vg.to_owned(),
                detail: Some(e),
            }
        }
        _ => e.into(),
    }
}

impl LvService for LvmCommands {
    fn list(&self, ctx: &Context, vg: &str) -> Result<Vec<LvRow>> {
        Ok(report(ctx, "lvs", LV_FIELDS, vg)?.0)
    }

    fn vg(&self, ctx: &Context, vg: &str) -> Result<VgRow> {
        report(ctx, "vgs", VG_FIELDS, vg)?
            .1
            .into_iter()
            .find(|r| r.vg_name == vg)
            .ok_or_else(|| LvmError::VgNotFound {
                vg: vg.to_owned(),
                detail: None,
            })
    }

    /// `lvm lvcreate`. `-Zy -Wy` zero the start and wipe old signatures, so a new LV made of
    /// extents that held someone else's filesystem probes blank instead of exposing the old data.
    fn create(
        &self,
        ctx: &Context,
        vg: &str,
        lv: &str,
        bytes: u64,
        pool: Option<&str>,
        tags: &[&str],
    ) -> Result<()> {
        // No autoactivation for thick LVs: this driver activates the LV in waitforattach and
        // deactivates it in unmountdevice. Otherwise udev's `vgchange -aay` on any later PV event
        // (and every boot) re-activates LVs no pod uses (seen in the guest tier with udev
        // running). Thin LVs refuse the option; their pool's setting (the operator's) governs
        // them.
        let mut cmd = lvm(ctx, "lvcreate").args(["-y", "-Wy"]);
        for tag in tags {
            cmd = cmd.args(["--addtag", tag]);
        }
        cmd = cmd.args(["-n", lv]);
        cmd = match pool {
            Some(p) => cmd.args(["-V", &format!("{bytes}b"), "--thinpool", p]),
            None => cmd.args([
                "--setautoactivation",
                "n",
                "-Zy",
                "-L",
                &format!("{bytes}b"),
            ]),
        };
        ctx.runner.check(&cmd.args(["--", vg]))?;
        Ok(())
    }

    /// `lvm lvextend -L <bytes>b` (no `-r`: the filesystem is grown by the caller, with the
    /// mounted path).
    fn extend(&self, ctx: &Context, vg_lv: &str, bytes: u64) -> Result<()> {
        ctx.runner.check(&lvm(ctx, "lvextend").args([
            "-y",
            "-L",
            &format!("{bytes}b"),
            "--",
            vg_lv,
        ]))?;
        Ok(())
    }

    /// `lvm lvremove -y <vg>/<lv>`: `-y` only answers lvremove's "really remove?" question (no
    /// `-f`: lvremove still refuses an LV that is open).
    fn remove(&self, ctx: &Context, vg_lv: &str) -> Result<()> {
        ctx.runner
            .check(&lvm(ctx, "lvremove").args(["-y", "--", vg_lv]))?;
        Ok(())
    }

    /// `lvm lvchange -ay -K`.
    fn activate(&self, ctx: &Context, vg_lv: &str) -> Result<()> {
        ctx.runner
            .check(&lvm(ctx, "lvchange").args(["-ay", "-K", "--", vg_lv]))?;
        Ok(())
    }

    /// `lvm lvchange -an`.
    fn deactivate(&self, ctx: &Context, vg_lv: &str) -> Result<()> {
        ctx.runner
            .check(&lvm(ctx, "lvchange").args(["-an", "--", vg_lv]))?;
        Ok(())
    }

    /// `lvm lvchange --addtag`.
    fn add_tag(&self, ctx: &Context, vg_lv: &str, tag: &str) -> Result<()> {
        ctx.runner
            .check(&lvm(ctx, "lvchange").args(["-y", "--addtag", tag, "--", vg_lv]))?;
        Ok(())
    }

    /// `lvm lvchange --deltag`.
    fn del_tag(&self, ctx: &Context, vg_lv: &str, tag: &str) -> Result<()> {
        ctx.runner
            .check(&lvm(ctx, "lvchange").args(["-y", "--deltag", tag, "--", vg_lv]))?;
        Ok(())
    }

    /// `lvm lvcreate -y -s --addtag … -n <lv> -- <vg>/<origin>` (no size: a thin snapshot).
    fn snapshot(
        &self,
        ctx: &Context,
        vg: &str,
        origin: &str,
        lv: &str,
        tags: &[&str],
    ) -> Result<()> {
        let mut cmd = lvm(ctx, "lvcreate").args(["-y", "-s"]);
        for tag in tags {
            cmd = cmd.args(["--addtag", tag]);
        }
        ctx.runner
            .check(&cmd.args(["-n", lv, "--", &format!("{vg}/{origin}")]))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::Backend;
    use crate::backend::testing::World;

    #[test]
    fn a_missing_vg_is_a_type_with_the_message_it_always_had() {
        let w = World::new(Backend::Lvm);
        w.runner
            .on("lvm", &["lvs"], 5, "", "  Volume group \"vg0\" not found\n");
        let e = w.with_ctx(|ctx| LvmCommands.list(ctx, "vg0")).unwrap_err();
        assert!(
            matches!(&e, LvmError::VgNotFound { vg, detail: Some(_) } if vg == "vg0"),
            "{e:?}"
        );
        let text = e.to_string();
        assert!(
            text.starts_with("volume group vg0 not found on this node (")
                && text.ends_with("); create it (vgcreate) or fix options.volumegroup"),
            "{text}"
        );
        assert_eq!(Error::from(e).to_string(), text);
        // A report that lists no such VG.
        let w = World::new(Backend::Lvm);
        w.runner
            .on("lvm", &["vgs"], 0, r#"{"report": [{"vg": []}]}"#, "");
        let e = w.with_ctx(|ctx| LvmCommands.vg(ctx, "vg0")).unwrap_err();
        assert!(matches!(e, LvmError::VgNotFound { detail: None, .. }));
        assert_eq!(
            e.to_string(),
            "volume group vg0 not found on this node; create it (vgcreate) or fix options.volumegroup"
        );
    }

    #[test]
    fn other_failures_are_not_a_missing_vg() {
        let w = World::new(Backend::Lvm);
        w.runner.on(
            "lvm",
            &["lvs"],
            5,
            "",
            "  Cannot process volume group vg0\n",
        );
        let e = w.with_ctx(|ctx| LvmCommands.list(ctx, "vg0")).unwrap_err();
        assert!(matches!(e, LvmError::Exec(_)), "{e:?}");
        assert!(matches!(Error::from(e), Error::Exec(_)));
        let w = World::new(Backend::Lvm);
        w.runner.on("lvm", &["lvs"], 0, "not json", "");
        let e = w.with_ctx(|ctx| LvmCommands.list(ctx, "vg0")).unwrap_err();
        assert!(matches!(e, LvmError::Report(_)), "{e:?}");
        assert!(e.to_string().contains("is lvm2 at least 2.02.158?"), "{e}");
    }
}
