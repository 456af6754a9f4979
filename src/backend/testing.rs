//! The backends' one unit-test fixture: a node in a temporary directory (state and run dirs in
//! it) whose every seam is a double, reached through one [`Context`] exactly as the real seams
//! are. Scripted tools ([`FakeRunner`]) that change the in-memory mount table ([`FakeMounter`])
//! when `mount.nfs`/`umount` succeed, as the real tools change the kernel's; one fake block device
//! ([`FakeDevices`]); a recording server probe ([`FakeProber`]). Compiled only for unit tests.

use crate::backend::lvm::Devices;
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
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

/// The one block device of the fake node.
pub const DEV: &str = "/dev/vg0/lv1";
/// Its device number: the one the fake mounter gives its first mount (0, 100).
pub const DEVNUM: (u32, u32) = (0, 100);

/// [`DEV`]'s device number (when present), the swap devices and [`DEVNUM`]'s holders.
pub struct FakeDevices(
    pub Mutex<Option<(u32, u32)>>,
    pub Mutex<Vec<(u32, u32)>>,
    pub Mutex<Vec<String>>,
);

impl FakeDevices {
    /// [`DEV`] exists, as [`DEVNUM`].
    pub fn present() -> Self {
        Self(Mutex::new(Some(DEVNUM)), Mutex::default(), Mutex::default())
    }

    /// [`DEV`] does not exist.
    pub fn absent() -> Self {
        Self(Mutex::new(None), Mutex::default(), Mutex::default())
    }
}

impl Devices for FakeDevices {
    fn block_device(&self, path: &Path) -> Result<Option<(u32, u32)>> {
        Ok(if path == Path::new(DEV) {
            *self.0.lock().unwrap()
        } else {
            None
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
}

/// A server probe that records `(server, port)` and answers from `up`, without the network.
pub struct FakeProber {
    /// Every probe, in order.
    pub probes: RefCell<Vec<(String, u16)>>,
    /// Whether the server answers.
    pub up: Cell<bool>,
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
pub struct World {
    _dir: tempfile::TempDir,
    /// The node's temporary directory, canonical.
    pub root: PathBuf,
    /// Node config: defaults, state and run dirs under [`World::root`], no log file.
    pub config: Config,
    /// The scripted tools (every command is recorded here).
    pub runner: FakeRunner,
    /// The mount table and every mount call.
    pub mounter: FakeMounter,
    /// Block devices ([`FakeDevices::present`] to begin with).
    pub devices: FakeDevices,
    /// The server probe (the server is up to begin with).
    pub prober: FakeProber,
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
    pub fn with_ctx<T>(&self, f: impl FnOnce(&Context) -> T) -> T {
        let runner = SimRunner {
            fake: &self.runner,
            mounter: &self.mounter,
        };
        let driver_name = match self.backend {
            Backend::HostPath => "example.com/hostpath",
            Backend::Nfs => "flexvol/nfs",
            Backend::Lvm => "example.com/lvm",
        };
        let ctx = Context {
            config: &self.config,
            runner: &runner,
            mounter: &self.mounter,
            devices: &self.devices,
            prober: &self.prober,
            deadline: Deadline::after(Duration::from_secs(300)),
            driver_name,
        };
        f(&ctx)
    }

    /// One call with kubelet's argv (verb first), answered by the backend's `handle`.
    pub fn call(&self, args: &[&str]) -> Result<Reply> {
        let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        let call = Call::parse(&args).unwrap();
        self.with_ctx(|ctx| match self.backend {
            Backend::HostPath => crate::backend::hostpath::handle(&call, ctx),
            Backend::Nfs => crate::backend::nfs::handle(&call, ctx),
            Backend::Lvm => crate::backend::lvm::handle(&call, ctx),
        })
    }

    /// The command lines run so far.
    pub fn lines(&self) -> Vec<String> {
        self.runner.lines()
    }
}
