//! Test doubles for the system seams: a runner that records every command and answers from a
//! script, and a mounter that records every call against an in-memory mount table. Used by the
//! backends' unit tests; the real thing is proven by the root and guest tiers. Compiled only for
//! the unit tests (`#[cfg(test)]`): nothing here is in the release binary.

use crate::sys::exec::{Cmd, ExecError, Output, Runner};
use crate::sys::mount::{MountError, Mounter, UnmountMode};
use crate::sys::mountinfo::{MountInfo, MountTable};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// One scripted answer: used for the first recorded call whose tool matches and whose argv
/// contains every string in `args_contain`.
#[derive(Debug, Clone)]
pub(crate) struct Script {
    /// Tool name as the backend passes it (`lvcreate`, `blkid`, ...).
    pub(crate) tool: String,
    /// Substrings that must all appear among the arguments.
    pub(crate) args_contain: Vec<String>,
    /// What the command returns.
    pub(crate) result: Result<Output, String>,
    /// Use once (true) or for every match (false).
    pub(crate) once: bool,
}

/// A recording, scripted [`Runner`]. Unscripted commands succeed with empty output.
#[derive(Debug, Default)]
pub(crate) struct FakeRunner {
    scripts: Mutex<Vec<Script>>,
    calls: Mutex<Vec<Cmd>>,
    missing_tools: Mutex<Vec<String>>,
}

impl FakeRunner {
    /// A runner with no scripts.
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// Scripts `tool` (for any arguments) to exit with `code` and print `stdout`/`stderr`.
    pub(crate) fn on(
        &self,
        tool: &str,
        args_contain: &[&str],
        code: i32,
        stdout: &str,
        stderr: &str,
    ) -> &Self {
        self.push(tool, args_contain, Ok(output(code, stdout, stderr)), false)
    }

    /// Like [`FakeRunner::on`] but only for the next matching call.
    pub(crate) fn once(
        &self,
        tool: &str,
        args_contain: &[&str],
        code: i32,
        stdout: &str,
        stderr: &str,
    ) -> &Self {
        self.push(tool, args_contain, Ok(output(code, stdout, stderr)), true)
    }

    /// Scripts `tool` to time out.
    pub(crate) fn time_out(&self, tool: &str) -> &Self {
        self.push(tool, &[], Err("timeout".into()), false)
    }

    /// Makes `tool` not installed.
    pub(crate) fn without(&self, tool: &str) -> &Self {
        self.missing_tools
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(tool.into());
        self
    }

    fn push(
        &self,
        tool: &str,
        args_contain: &[&str],
        result: Result<Output, String>,
        once: bool,
    ) -> &Self {
        let s = Script {
            tool: tool.into(),
            args_contain: args_contain.iter().map(|s| s.to_string()).collect(),
            result,
            once,
        };
        // Later scripts take precedence over earlier ones.
        self.scripts
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(0, s);
        self
    }

    /// Every command run so far.
    pub(crate) fn calls(&self) -> Vec<Cmd> {
        self.calls.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The command lines run so far, as `tool arg arg ...`.
    pub(crate) fn lines(&self) -> Vec<String> {
        self.calls().iter().map(|c| c.display()).collect()
    }

    /// How many times `tool` ran.
    pub(crate) fn count(&self, tool: &str) -> usize {
        self.calls().iter().filter(|c| c.tool == tool).count()
    }
}

/// An [`Output`] with the given exit code and text.
pub(crate) fn output(code: i32, stdout: &str, stderr: &str) -> Output {
    Output {
        code: Some(code),
        signal: None,
        stdout: stdout.as_bytes().to_vec(),
        stderr: stderr.as_bytes().to_vec(),
        truncated: false,
    }
}

impl Runner for FakeRunner {
    fn run(&self, cmd: &Cmd) -> Result<Output, ExecError> {
        self.calls
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(cmd.clone());
        if !self.has_tool(&cmd.tool) {
            return Err(ExecError::NotFound {
                tool: cmd.tool.clone(),
                searched: "(fake)".into(),
            });
        }
        let mut scripts = self.scripts.lock().unwrap_or_else(|e| e.into_inner());
        let args: Vec<String> = cmd
            .args
            .iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        let pos = scripts.iter().position(|s| {
            s.tool == cmd.tool
                && s.args_contain
                    .iter()
                    .all(|want| args.iter().any(|a| a.contains(want.as_str())))
        });
        let Some(i) = pos else {
            return Ok(output(0, "", ""));
        };
        let s = if scripts[i].once {
            scripts.remove(i)
        } else {
            scripts[i].clone()
        };
        s.result.map_err(|_| ExecError::TimedOut {
            cmdline: cmd.display(),
            secs: cmd.timeout.as_secs(),
        })
    }

    fn has_tool(&self, tool: &str) -> bool {
        !self
            .missing_tools
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .any(|t| t == tool)
    }
}

/// A mount call recorded by [`FakeMounter`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum MountCall {
    /// `bind(source, target, read_only)`
    Bind(PathBuf, PathBuf, bool),
    /// `remount_readonly(target)`
    RemountReadOnly(PathBuf),
    /// `make_slave(target)`
    MakeSlave(PathBuf),
    /// `mount_fs(device, target, fs_type, read_only, data)`
    MountFs(PathBuf, PathBuf, String, bool, String),
    /// `unmount(target, mode)`
    Unmount(PathBuf, UnmountMode),
}

/// A recording [`Mounter`] over an in-memory mount table. Optional errno injection per call kind.
#[derive(Debug, Default)]
pub(crate) struct FakeMounter {
    table: Mutex<Vec<MountInfo>>,
    calls: Mutex<Vec<MountCall>>,
    fail_unmount: Mutex<Vec<(UnmountMode, nix::Error)>>,
    fail_mount: Mutex<Option<nix::Error>>,
}

impl FakeMounter {
    /// An empty table.
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// Adds an entry to the table, as if mounted before this test.
    pub(crate) fn add(&self, source: &str, mount_point: &Path, fs_type: &str, read_only: bool) {
        let mut t = self.table.lock().unwrap_or_else(|e| e.into_inner());
        let id = u32::try_from(t.len()).unwrap() + 100;
        t.push(MountInfo {
            id,
            parent: 1,
            major: 0,
            minor: id,
            root: PathBuf::from("/"),
            mount_point: mount_point.to_path_buf(),
            mount_options: if read_only { "ro".into() } else { "rw".into() },
            fs_type: fs_type.into(),
            source: source.into(),
            super_options: "rw".into(),
        });
    }

    /// Makes unmounts in `mode` fail with `errno` (until cleared by another call with a new list).
    pub(crate) fn fail_unmount(&self, mode: UnmountMode, errno: nix::Error) {
        self.fail_unmount
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((mode, errno));
    }

    /// Every call so far.
    pub(crate) fn calls(&self) -> Vec<MountCall> {
        self.calls.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn record(&self, c: MountCall) {
        self.calls.lock().unwrap_or_else(|e| e.into_inner()).push(c);
    }
}

impl Mounter for FakeMounter {
    fn bind(&self, source: &Path, target: &Path, read_only: bool) -> Result<(), MountError> {
        self.record(MountCall::Bind(source.into(), target.into(), read_only));
        if let Some(errno) = *self.fail_mount.lock().unwrap_or_else(|e| e.into_inner()) {
            return Err(MountError::Mount {
                source_desc: source.display().to_string(),
                target: target.into(),
                errno,
            });
        }
        self.add(&source.display().to_string(), target, "bind", read_only);
        Ok(())
    }

    fn make_slave(&self, target: &Path) -> Result<(), MountError> {
        self.record(MountCall::MakeSlave(target.into()));
        Ok(())
    }

    fn remount_readonly(&self, target: &Path) -> Result<(), MountError> {
        self.record(MountCall::RemountReadOnly(target.into()));
        let mut t = self.table.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(m) = t.iter_mut().rev().find(|m| m.mount_point == target) {
            m.mount_options = "ro".into();
        }
        Ok(())
    }

    fn mount_fs(
        &self,
        device: &Path,
        target: &Path,
        fs_type: &str,
        read_only: bool,
        data: &str,
    ) -> Result<(), MountError> {
        self.record(MountCall::MountFs(
            device.into(),
            target.into(),
            fs_type.into(),
            read_only,
            data.into(),
        ));
        if let Some(errno) = *self.fail_mount.lock().unwrap_or_else(|e| e.into_inner()) {
            return Err(MountError::Mount {
                source_desc: device.display().to_string(),
                target: target.into(),
                errno,
            });
        }
        self.add(&device.display().to_string(), target, fs_type, read_only);
        Ok(())
    }

    fn unmount(&self, target: &Path, mode: UnmountMode) -> Result<bool, MountError> {
        self.record(MountCall::Unmount(target.into(), mode));
        if let Some((_, errno)) = self
            .fail_unmount
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .find(|(m, _)| *m == mode)
        {
            return Err(MountError::Unmount {
                target: target.into(),
                errno: *errno,
            });
        }
        let mut t = self.table.lock().unwrap_or_else(|e| e.into_inner());
        match t.iter().rposition(|m| m.mount_point == target) {
            Some(i) => {
                t.remove(i);
                Ok(true)
            }
            None => Ok(false),
        }
    }

    fn table(&self) -> Result<MountTable, MountError> {
        Ok(MountTable {
            entries: self.table.lock().unwrap_or_else(|e| e.into_inner()).clone(),
        })
    }
}
