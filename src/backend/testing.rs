//! The backends' one unit-test fixture: a node in a temporary directory (state and run dirs in
//! it) whose every seam is a double, reached through one [`Context`] (and each backend's own
//! seams) exactly as the real seams are. Scripted tools ([`FakeRunner`]) that change the
//! in-memory mount table ([`FakeMounter`]) when `mount.nfs`/`umount` succeed, as the real tools
//! change the kernel's; one fake block device ([`FakeDevices`]); a recording server probe
//! ([`FakeProber`]). The LVM verbs run the real LV service ([`LvmCommands`]) over the scripted
//! tools, so tests see exact `lvm` command lines; [`FakeLvs`] is an in-memory LVM for tests that
//! judge what was done rather than how it was spelled. Compiled only for unit tests.

use crate::backend::lvm::lvs::{self, LvService, LvmCommands, LvmError};
use crate::backend::lvm::report::{LvRow, VgRow};
use crate::backend::lvm::{Devices, Seams};
use crate::backend::nfs::probe::Prober;
use crate::backend::{Backend, Context};
use crate::error::Result;
use crate::node::config::Config;
use crate::protocol::reply::Reply;
use crate::protocol::verb::Call;
use crate::sys::exec::{Cmd, ExecError, Output, Runner};
use crate::sys::mount::{Mounter, UnmountMode};
use crate::sys::process::Deadline;
use crate::sys::testing::{FakeMounter, FakeRunner};
use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

/// The one block device of the fake node.
pub(crate) const DEV: &str = "/dev/vg0/lv1";
/// Its device number: the one the fake mounter gives its first mount (0, 100).
pub(crate) const DEVNUM: (u32, u32) = (0, 100);

/// [`DEV`]'s device number (when present), the swap devices, [`DEVNUM`]'s holders, the
/// block copies made (`<from> <to> <bytes>`), other present devices (device number (0, 200+i)),
/// and what to run while a block copy is made (with its source: a test's look at the node then).
#[allow(clippy::type_complexity)]
pub(crate) struct FakeDevices(
    pub Mutex<Option<(u32, u32)>>,
    pub Mutex<Vec<(u32, u32)>>,
    pub Mutex<Vec<String>>,
    pub Mutex<Vec<String>>,
    pub Mutex<Vec<PathBuf>>,
    pub Mutex<Option<Box<dyn FnMut(&Path) + Send>>>,
);

impl FakeDevices {
    /// [`DEV`] exists, as [`DEVNUM`].
    pub(crate) fn present() -> Self {
        Self(
            Mutex::new(Some(DEVNUM)),
            Mutex::default(),
            Mutex::default(),
            Mutex::default(),
            Mutex::default(),
            Mutex::default(),
        )
    }

    /// [`DEV`] does not exist.
    pub(crate) fn absent() -> Self {
        Self(
            Mutex::new(None),
            Mutex::default(),
            Mutex::default(),
            Mutex::default(),
            Mutex::default(),
            Mutex::default(),
        )
    }
}

impl Devices for FakeDevices {
    fn block_device(&self, path: &Path) -> Result<Option<(u32, u32)>> {
        Ok(if path == Path::new(DEV) {
            *self.0.lock().unwrap()
        } else {
            let others = self.4.lock().unwrap();
            others
                .iter()
                .position(|p| p == path)
                .map(|i| (0, 200 + u32::try_from(i).unwrap_or(0)))
        })
    }
    fn swaps(&self) -> Result<Vec<(u32, u32)>> {
        Ok(self.1.lock().unwrap().clone())
    }
    fn holders(&self, dev: (u32, u32)) -> Result<Vec<String>> {
        Ok(if dev == DEVNUM {
            self.2.lock().unwrap().clone()
        } else {
            Vec::new()
        })
    }
    fn copy_blocks(&self, from: &Path, to: &Path, bytes: u64, _: &Deadline) -> Result<()> {
        if let Some(f) = self.5.lock().unwrap().as_mut() {
            f(from);
        }
        self.3
            .lock()
            .unwrap()
            .push(format!("{} {} {bytes}", from.display(), to.display()));
        Ok(())
    }
}

/// A server probe that records `(server, port)` and answers from `up`, without the network.
pub(crate) struct FakeProber {
    /// Every probe, in order.
    pub(crate) probes: RefCell<Vec<(String, u16)>>,
    /// Whether the server answers.
    pub(crate) up: Cell<bool>,
}

impl Prober for FakeProber {
    fn reachable(
        &self,
        _: &dyn Runner,
        server: &str,
        port: u16,
        _: Duration,
    ) -> std::result::Result<SocketAddr, String> {
        self.probes.borrow_mut().push((server.to_owned(), port));
        if self.up.get() {
            Ok(SocketAddr::from(([127, 0, 0, 1], port)))
        } else {
            Err(format!(
                "nothing accepted a TCP connection on 127.0.0.1:{port} (the server may be down, not serving NFS on port {port}, or filtered)"
            ))
        }
    }
}

/// A FakeRunner whose successful `mount.nfs` and `umount` change the FakeMounter's table, as the
/// real tools change the kernel's.
struct SimRunner<'a> {
    fake: &'a FakeRunner,
    mounter: &'a FakeMounter,
}

impl Runner for SimRunner<'_> {
    fn run(&self, cmd: &Cmd) -> std::result::Result<Output, ExecError> {
        let out = self.fake.run(cmd)?;
        let args: Vec<String> = cmd
            .args
            .iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        if out.success() {
            match cmd.tool.as_str() {
                "mount.nfs" => {
                    let ro = args[3].split(',').any(|o| o == "ro");
                    let fs = if args[3].contains("vers=3") {
                        "nfs"
                    } else {
                        "nfs4"
                    };
                    self.mounter.add(&args[0], Path::new(&args[1]), fs, ro);
                }
                "umount" => {
                    let mode = if args.iter().any(|a| a == "-f") {
                        UnmountMode::Force
                    } else if args.iter().any(|a| a == "-l") {
                        UnmountMode::Detach
                    } else {
                        UnmountMode::Normal
                    };
                    let _ = self.mounter.unmount(Path::new(&args[args.len() - 1]), mode);
                }
                _ => {}
            }
        }
        Ok(out)
    }

    fn has_tool(&self, tool: &str) -> bool {
        self.fake.has_tool(tool)
    }
}

/// A fake node for one backend's verbs.
pub(crate) struct World {
    _dir: tempfile::TempDir,
    /// The node's temporary directory, canonical.
    pub root: PathBuf,
    /// Node config: defaults, state and run dirs under [`World::root`], no log file.
    pub(crate) config: Config,
    /// The scripted tools (every command is recorded here).
    pub(crate) runner: FakeRunner,
    /// The mount table and every mount call.
    pub(crate) mounter: FakeMounter,
    /// Block devices ([`FakeDevices::present`] to begin with).
    pub(crate) devices: FakeDevices,
    /// The server probe (the server is up to begin with).
    pub(crate) prober: FakeProber,
    backend: Backend,
}

impl World {
    /// A fresh node for `backend`.
    pub fn new(backend: Backend) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(dir.path()).unwrap();
        let config = Config {
            state_dir: root.join("state"),
            run_dir: root.join("run"),
            log_file: None,
            ..Config::default()
        };
        Self {
            _dir: dir,
            root,
            config,
            runner: FakeRunner::new(),
            mounter: FakeMounter::new(),
            devices: FakeDevices::present(),
            prober: FakeProber {
                probes: RefCell::new(Vec::new()),
                up: Cell::new(true),
            },
            backend,
        }
    }

    /// Runs `f` with a context over this node's doubles, as the driver runs a verb.
    pub(crate) fn with_ctx<T>(&self, f: impl FnOnce(&Context) -> T) -> T {
        let runner = SimRunner {
            fake: &self.runner,
            mounter: &self.mounter,
        };
        let driver_name = match self.backend {
            Backend::HostPath => "example.com/hostpath",
            Backend::Nfs => "flexvol/nfs",
            Backend::Lvm => "example.com/lvm",
        };
        let ctx = Context::new(
            &self.config,
            &runner,
            &self.mounter,
            Deadline::after(Duration::from_secs(300)),
            driver_name,
        );
        f(&ctx)
    }

    /// Runs `f` as [`World::with_ctx`] does, with the LVM backend's seams: this node's
    /// [`FakeDevices`] and the real LV service over the scripted tools.
    pub(crate) fn with_lvm<T>(&self, f: impl FnOnce(&Context, &Seams) -> T) -> T {
        let seams = Seams {
            devices: &self.devices,
            lvs: &LvmCommands,
        };
        self.with_ctx(|ctx| f(ctx, &seams))
    }

    /// [`World::with_lvm`] as the CSI plugin runs it: its context names the CSI driver
    /// `lvm.csi.example.com` (a name without `/`), not a FlexVolume driver.
    pub(crate) fn with_csi_lvm<T>(&self, f: impl FnOnce(&Context, &Seams) -> T) -> T {
        let seams = Seams {
            devices: &self.devices,
            lvs: &LvmCommands,
        };
        let runner = SimRunner {
            fake: &self.runner,
            mounter: &self.mounter,
        };
        let ctx = Context::new(
            &self.config,
            &runner,
            &self.mounter,
            Deadline::after(Duration::from_secs(300)),
            "lvm.csi.example.com",
        );
        f(&ctx, &seams)
    }

    /// One call with kubelet's argv (verb first), answered by the backend's `handle`.
    pub(crate) fn call(&self, args: &[&str]) -> Result<Reply> {
        let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        let call = Call::parse(&args).unwrap();
        match self.backend {
            Backend::HostPath => self.with_ctx(|ctx| crate::backend::hostpath::handle(&call, ctx)),
            Backend::Nfs => {
                self.with_ctx(|ctx| crate::backend::nfs::handle(&call, ctx, &self.prober))
            }
            Backend::Lvm => {
                self.with_lvm(|ctx, seams| crate::backend::lvm::handle(&call, ctx, seams))
            }
        }
    }

    /// The command lines run so far.
    pub(crate) fn lines(&self) -> Vec<String> {
        self.runner.lines()
    }
}

/// One volume group of [`FakeLvs`].
#[derive(Debug, Clone)]
pub(crate) struct FakeVg {
    /// Extent size in bytes.
    pub(crate) extent: u64,
    /// Free bytes.
    pub(crate) free: u64,
    /// Its LVs (their `vg_extent_size`/`vg_free` columns are filled in when listed).
    pub(crate) lvs: Vec<LvRow>,
}

/// An in-memory LVM behind the LV service: volume groups that exist, LVs that `create` adds
/// (thick ones take free space), `extend` grows, `remove` drops and `activate`/`deactivate`
/// flip; a VG that is not there is [`LvmError::VgNotFound`], as `lvm` says it. Every change is
/// recorded in [`FakeLvs::calls`].
#[derive(Default)]
pub(crate) struct FakeLvs {
    /// The volume groups, by name.
    pub(crate) vgs: Mutex<BTreeMap<String, FakeVg>>,
    /// Every call that changes something, in order (`create vg0/lv1 134217728 [pool] tag,tag`,
    /// `extend vg0/lv1 268435456`, `remove vg0/lv1`, `activate vg0/lv1`, ...).
    pub(crate) calls: Mutex<Vec<String>>,
}

impl FakeLvs {
    /// LVM with one empty VG `vg` of 4 MiB extents and `free` bytes free.
    pub(crate) fn with_vg(vg: &str, free: u64) -> Self {
        let lvm = Self::default();
        lvm.vgs.lock().unwrap().insert(
            vg.to_owned(),
            FakeVg {
                extent: 4 << 20,
                free,
                lvs: Vec::new(),
            },
        );
        lvm
    }

    /// Adds an existing LV (`attr` as `lvs` shows it, `tags` comma-separated, `pool` or "").
    pub(crate) fn add(&self, vg: &str, lv: &str, attr: &str, size: u64, tags: &str, pool: &str) {
        let mut vgs = self.vgs.lock().unwrap();
        let g = vgs.get_mut(vg).unwrap();
        g.lvs.push(LvRow {
            vg_name: vg.to_owned(),
            lv_name: lv.to_owned(),
            lv_path: format!("/dev/{vg}/{lv}"),
            lv_size: size,
            lv_attr: attr.to_owned(),
            lv_tags: tags.to_owned(),
            pool_lv: pool.to_owned(),
            vg_extent_size: 0,
            vg_free: 0,
        });
    }

    /// The LV `vg_lv` (`<vg>/<lv>`) as `lvs` would list it now.
    pub(crate) fn lv(&self, vg_lv: &str) -> Option<LvRow> {
        let (vg, lv) = vg_lv.split_once('/')?;
        self.list_rows(vg)
            .ok()?
            .into_iter()
            .find(|r| r.lv_name == lv)
    }

    /// The calls so far.
    pub(crate) fn calls(&self) -> Vec<String> {
        self.calls.lock().unwrap().clone()
    }

    fn list_rows(&self, vg: &str) -> lvs::Result<Vec<LvRow>> {
        let vgs = self.vgs.lock().unwrap();
        let g = vgs.get(vg).ok_or_else(|| missing(vg))?;
        Ok(g.lvs
            .iter()
            .map(|r| LvRow {
                vg_extent_size: g.extent,
                vg_free: g.free,
                ..r.clone()
            })
            .collect())
    }

    /// Runs `f` on the row of `vg_lv`, after recording `call`.
    fn change(
        &self,
        call: String,
        vg_lv: &str,
        f: impl FnOnce(&mut FakeVg, usize),
    ) -> lvs::Result<()> {
        self.calls.lock().unwrap().push(call);
        let (vg, lv) = vg_lv.split_once('/').unwrap();
        let mut vgs = self.vgs.lock().unwrap();
        let g = vgs.get_mut(vg).ok_or_else(|| missing(vg))?;
        let i = g
            .lvs
            .iter()
            .position(|r| r.lv_name == lv)
            .ok_or_else(|| LvmError::Report(format!("fake lvm: no LV {vg_lv}")))?;
        f(g, i);
        Ok(())
    }
}

fn missing(vg: &str) -> LvmError {
    LvmError::VgNotFound {
        vg: vg.to_owned(),
        detail: None,
    }
}

fn set_attr(row: &mut LvRow, i: usize, c: char) {
    row.lv_attr = row
        .lv_attr
        .chars()
        .enumerate()
        .map(|(j, x)| if j == i { c } else { x })
        .collect();
}

impl LvService for FakeLvs {
    fn list(&self, _: &Context, vg: &str) -> lvs::Result<Vec<LvRow>> {
        self.list_rows(vg)
    }

    fn vg(&self, _: &Context, vg: &str) -> lvs::Result<VgRow> {
        let vgs = self.vgs.lock().unwrap();
        let g = vgs.get(vg).ok_or_else(|| missing(vg))?;
        Ok(VgRow {
            vg_name: vg.to_owned(),
            vg_extent_size: g.extent,
            vg_free: g.free,
            vg_size: 0, // the fake models no VG size
        })
    }

    fn create(
        &self,
        _: &Context,
        vg: &str,
        lv: &str,
        bytes: u64,
        pool: Option<&str>,
        tags: &[&str],
    ) -> lvs::Result<()> {
        self.calls.lock().unwrap().push(format!(
            "create {vg}/{lv} {bytes}{} {}",
            pool.map(|p| format!(" {p}")).unwrap_or_default(),
            tags.join(",")
        ));
        let mut vgs = self.vgs.lock().unwrap();
        let g = vgs.get_mut(vg).ok_or_else(|| missing(vg))?;
        let attr = if pool.is_some() {
            "Vwi-a-tz--"
        } else {
            g.free -= bytes;
            "-wi-a-----"
        };
        g.lvs.push(LvRow {
            vg_name: vg.to_owned(),
            lv_name: lv.to_owned(),
            lv_path: format!("/dev/{vg}/{lv}"),
            lv_size: bytes,
            lv_attr: attr.to_owned(),
            lv_tags: tags.join(","),
            pool_lv: pool.unwrap_or_default().to_owned(),
            vg_extent_size: 0,
            vg_free: 0,
        });
        Ok(())
    }

    fn extend(&self, _: &Context, vg_lv: &str, bytes: u64) -> lvs::Result<()> {
        self.change(format!("extend {vg_lv} {bytes}"), vg_lv, |g, i| {
            if !g.lvs[i].is_thin() {
                g.free -= bytes - g.lvs[i].lv_size;
            }
            g.lvs[i].lv_size = bytes;
        })
    }

    fn remove(&self, _: &Context, vg_lv: &str) -> lvs::Result<()> {
        self.change(format!("remove {vg_lv}"), vg_lv, |g, i| {
            let r = g.lvs.remove(i);
            if !r.is_thin() {
                g.free += r.lv_size;
            }
        })
    }

    fn activate(&self, _: &Context, vg_lv: &str) -> lvs::Result<()> {
        self.change(format!("activate {vg_lv}"), vg_lv, |g, i| {
            set_attr(&mut g.lvs[i], 4, 'a')
        })
    }

    fn deactivate(&self, _: &Context, vg_lv: &str) -> lvs::Result<()> {
        self.change(format!("deactivate {vg_lv}"), vg_lv, |g, i| {
            set_attr(&mut g.lvs[i], 4, '-')
        })
    }

    fn del_tag(&self, _: &Context, vg_lv: &str, tag: &str) -> lvs::Result<()> {
        self.change(format!("deltag {vg_lv} {tag}"), vg_lv, |g, i| {
            let r = &mut g.lvs[i];
            r.lv_tags = r
                .lv_tags
                .split(',')
                .filter(|t| *t != tag && !t.is_empty())
                .collect::<Vec<_>>()
                .join(",");
        })
    }

    /// As LVM does it: the snapshot is a thin LV of the origin's size in its pool, inactive
    /// (activation-skip, `k`), carrying only `tags` (LVM copies no tags; checked in the guest
    /// scenario lvm-clone).
    fn snapshot(
        &self,
        _: &Context,
        vg: &str,
        origin: &str,
        lv: &str,
        tags: &[&str],
    ) -> lvs::Result<()> {
        self.calls.lock().unwrap().push(format!(
            "snapshot {vg}/{origin} {vg}/{lv} {}",
            tags.join(",")
        ));
        let mut vgs = self.vgs.lock().unwrap();
        let g = vgs.get_mut(vg).ok_or_else(|| missing(vg))?;
        let o = g
            .lvs
            .iter()
            .find(|r| r.lv_name == origin)
            .cloned()
            .ok_or_else(|| LvmError::Report(format!("fake lvm: no LV {vg}/{origin}")))?;
        if !o.is_thin() {
            return Err(LvmError::Report(format!(
                "fake lvm: {vg}/{origin} is not thin (a thick snapshot needs a size)"
            )));
        }
        g.lvs.push(LvRow {
            lv_name: lv.to_owned(),
            lv_path: format!("/dev/{vg}/{lv}"),
            lv_attr: "Vwi---tz-k".to_owned(),
            lv_tags: tags.join(","),
            ..o
        });
        Ok(())
    }

    fn add_tag(&self, _: &Context, vg_lv: &str, tag: &str) -> lvs::Result<()> {
        self.change(format!("addtag {vg_lv} {tag}"), vg_lv, |g, i| {
            let r = &mut g.lvs[i];
            r.lv_tags = if r.lv_tags.is_empty() {
                tag.to_owned()
            } else {
                format!("{},{tag}", r.lv_tags)
            };
        })
    }
}
