//! The only place flexvol starts another program.
//!
//! Rules, all enforced here rather than left to callers:
//! - tools are found in a fixed list of system directories (kubelet's environment is not a login
//!   shell, and `PATH` is not to be trusted), never through a shell, always with an argv;
//! - the child's environment is cleared and rebuilt: `PATH`, `LC_ALL=C` (so the text we parse is
//!   not localised) and `LVM_SUPPRESS_FD_WARNINGS=1`, plus what the caller adds;
//! - stdin is `/dev/null` (or bytes the caller supplies, e.g. a secret) and stdout and stderr go to
//!   anonymous memory files, never to our own stdout: a child's chatter cannot corrupt the reply,
//!   and a grandchild that keeps the descriptor open cannot block us the way it blocks a pipe
//!   reader (kubelet's `CombinedOutput` hang, Azure/kubernetes-volume-drivers#32);
//! - each child gets its own process group and a timeout; on timeout the whole group is killed.
//!
//! One deliberate variant, [`SystemRunner::run_combined`], runs a FlexVolume driver the way
//! kubelet does, for the commands that judge drivers (`conformance`, `doctor`, `install`): the
//! environment is inherited (kubelet passes its own) and stdout and stderr share one pipe read to
//! end of file (Go's `CombinedOutput`), so a driver's stray stderr line or a helper it leaves
//! holding the pipe shows up exactly as kubelet would suffer it. It keeps the other rules: argv
//! only, stdin `/dev/null` (or the caller's bytes), its own process group, a timeout that kills
//! the whole group. The driver's own verbs never use it.

use crate::sys::process;
use nix::sys::memfd::{MFdFlags, memfd_create};
use std::ffi::{OsStr, OsString};
use std::fmt;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Where tools are looked up, in order, unless the node config says otherwise.
pub(crate) const DEFAULT_TOOL_DIRS: &[&str] = &["/usr/sbin", "/sbin", "/usr/bin", "/bin"];

/// One command to run.
#[derive(Clone)]
pub struct Cmd {
    /// Tool name (`lvcreate`) or absolute path.
    pub tool: String,
    /// Arguments, never interpreted by a shell.
    pub args: Vec<OsString>,
    /// Extra environment for the child.
    pub env: Vec<(String, String)>,
    /// Bytes fed to stdin (e.g. a credential); `/dev/null` when `None`.
    pub(crate) stdin: Option<Vec<u8>>,
    /// How long the child may run.
    pub(crate) timeout: Duration,
    /// Working directory of the child; `/` when `None`.
    pub(crate) cwd: Option<PathBuf>,
}

impl fmt::Debug for Cmd {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // stdin may hold a secret: never shown.
        write!(f, "{} {:?}", self.tool, self.args)
    }
}

impl Cmd {
    /// A command with a default 60 s timeout.
    pub(crate) fn new(tool: &str) -> Self {
        Self {
            tool: tool.into(),
            args: Vec::new(),
            env: Vec::new(),
            stdin: None,
            timeout: Duration::from_secs(60),
            cwd: None,
        }
    }

    /// Sets the child's working directory (default `/`).
    pub(crate) fn cwd(mut self, dir: impl Into<PathBuf>) -> Self {
        self.cwd = Some(dir.into());
        self
    }

    /// Appends one argument.
    pub(crate) fn arg(mut self, a: impl AsRef<OsStr>) -> Self {
        self.args.push(a.as_ref().to_owned());
        self
    }

    /// Appends arguments.
    pub(crate) fn args<I: IntoIterator<Item = S>, S: AsRef<OsStr>>(mut self, a: I) -> Self {
        self.args
            .extend(a.into_iter().map(|s| s.as_ref().to_owned()));
        self
    }

    /// Adds an environment variable.
    pub(crate) fn env(mut self, k: &str, v: &str) -> Self {
        self.env.push((k.into(), v.into()));
        self
    }

    /// Sets the timeout.
    pub(crate) fn timeout(mut self, t: Duration) -> Self {
        self.timeout = t;
        self
    }

    /// The command line for messages: tool and arguments, shell-quoted for readability only.
    pub(crate) fn display(&self) -> String {
        let mut s = self.tool.clone();
        for a in &self.args {
            let a = a.to_string_lossy();
            if a.is_empty() || a.contains(|c: char| c.is_whitespace() || "'\"\\$`".contains(c)) {
                s.push_str(&format!(" '{}'", a.replace('\'', "'\\''")));
            } else {
                s.push(' ');
                s.push_str(&a);
            }
        }
        s
    }
}

/// What a finished child left behind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Output {
    /// Exit code, `None` when killed by a signal.
    pub code: Option<i32>,
    /// Terminating signal, if any.
    pub signal: Option<i32>,
    /// Captured stdout.
    pub stdout: Vec<u8>,
    /// Captured stderr.
    pub(crate) stderr: Vec<u8>,
    /// The child filled its [`OUTPUT_MAX`] of stdout: what it printed beyond is lost, so the
    /// output cannot be trusted whole (a list, a report) and [`Runner::check`] fails.
    pub(crate) truncated: bool,
}

impl Output {
    /// Exit code 0.
    pub(crate) fn success(&self) -> bool {
        self.code == Some(0)
    }

    /// stdout as text.
    pub(crate) fn stdout_text(&self) -> String {
        String::from_utf8_lossy(&self.stdout).into_owned()
    }

    /// The last few lines of stderr (or stdout when stderr is empty), for messages.
    pub(crate) fn tail(&self) -> String {
        let text = if self.stderr.iter().any(|b| !b.is_ascii_whitespace()) {
            &self.stderr
        } else {
            &self.stdout
        };
        let text = String::from_utf8_lossy(text);
        let lines: Vec<&str> = text
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .collect();
        let start = lines.len().saturating_sub(4);
        lines[start..].join("; ")
    }
}

/// What a program wrote on its one combined stdout+stderr pipe, and how it ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CombinedOutput {
    /// Exit code, `None` when killed by a signal.
    pub(crate) code: Option<i32>,
    /// Terminating signal, if any.
    pub(crate) signal: Option<i32>,
    /// stdout and stderr interleaved as written (at most 1 MiB kept; the rest is read and dropped).
    pub(crate) output: Vec<u8>,
}

/// Why a command did not produce the expected result.
#[derive(Debug, thiserror::Error)]
pub enum ExecError {
    /// The tool is not installed in any searched directory.
    #[error(
        "{tool} is not installed (looked in {searched}); install it on the node (run `flexvol doctor` for the package name)"
    )]
    NotFound { tool: String, searched: String },
    /// The child could not be started.
    #[error("cannot start {path}: {source}")]
    Spawn {
        path: PathBuf,
        source: std::io::Error,
    },
    /// The child ran past its timeout and was killed.
    #[error("`{cmdline}` did not finish within {secs}s and was killed")]
    TimedOut { cmdline: String, secs: u64 },
    /// The child exited non-zero (or by signal). `Display` ends with the tool's own words.
    #[error("`{cmdline}` failed ({}){}", exit_reason(output), tail_suffix(output))]
    Failed { cmdline: String, output: Output },
    /// The child printed more than flexvol keeps ([`OUTPUT_MAX`]): its answer is cut, and a cut
    /// list or report would be read as a shorter one.
    #[error(
        "`{cmdline}` printed more than {} bytes, which flexvol does not read: its answer is incomplete and was not used",
        OUTPUT_MAX
    )]
    TooLong { cmdline: String },
}

fn exit_reason(o: &Output) -> String {
    match (o.code, o.signal) {
        (Some(c), _) => format!("exit status {c}"),
        (None, Some(s)) => format!("killed by signal {s}"),
        _ => "unknown exit".into(),
    }
}

fn tail_suffix(o: &Output) -> String {
    let t = o.tail();
    if t.is_empty() {
        String::new()
    } else {
        format!(": {t}")
    }
}

/// The seam for running programs. Backends hold a `&dyn Runner`; tests substitute a recording
/// double that scripts outputs.
pub trait Runner: Send + Sync {
    /// Runs `cmd` to completion (or timeout) and returns its output whatever its exit code.
    fn run(&self, cmd: &Cmd) -> Result<Output, ExecError>;

    /// Whether a tool can be found.
    fn has_tool(&self, tool: &str) -> bool;

    /// Runs `cmd` and turns a non-zero exit into [`ExecError::Failed`].
    fn check(&self, cmd: &Cmd) -> Result<Output, ExecError> {
        let out = self.run(cmd)?;
        if out.truncated {
            return Err(ExecError::TooLong {
                cmdline: cmd.display(),
            });
        }
        if out.success() {
            Ok(out)
        } else {
            Err(ExecError::Failed {
                cmdline: cmd.display(),
                output: out,
            })
        }
    }
}

/// The real runner.
#[derive(Debug, Clone)]
pub struct SystemRunner {
    dirs: Vec<PathBuf>,
}

impl Default for SystemRunner {
    fn default() -> Self {
        Self::new(DEFAULT_TOOL_DIRS.iter().map(PathBuf::from).collect())
    }
}

impl SystemRunner {
    /// A runner that looks for tools in `dirs`, in order.
    pub(crate) fn new(dirs: Vec<PathBuf>) -> Self {
        Self { dirs }
    }

    /// Resolves a tool name to an absolute path.
    pub(crate) fn resolve(&self, tool: &str) -> Result<PathBuf, ExecError> {
        if tool.starts_with('/') {
            return if Path::new(tool).is_file() {
                Ok(PathBuf::from(tool))
            } else {
                Err(ExecError::NotFound {
                    tool: tool.into(),
                    searched: tool.into(),
                })
            };
        }
        for d in &self.dirs {
            let p = d.join(tool);
            if p.is_file() {
                return Ok(p);
            }
        }
        Err(ExecError::NotFound {
            tool: tool.into(),
            searched: self
                .dirs
                .iter()
                .map(|d| d.display().to_string())
                .collect::<Vec<_>>()
                .join(", "),
        })
    }
}

impl SystemRunner {
    /// Runs `cmd` the way kubelet runs a FlexVolume driver: environment inherited plus `cmd.env`,
    /// argv[0] the resolved path, stdout and stderr on one pipe read to end of file, then the exit
    /// status. The timeout covers both: a child that does not exit, or a grandchild that keeps the
    /// pipe open, makes it [`ExecError::TimedOut`] and the child's whole process group is killed
    /// (kubelet itself would wait forever).
    pub(crate) fn run_combined(&self, cmd: &Cmd) -> Result<CombinedOutput, ExecError> {
        let path = self.resolve(&cmd.tool)?;
        let spawn_err = |source| ExecError::Spawn {
            path: path.clone(),
            source,
        };
        let (mut reader, writer) = std::io::pipe().map_err(spawn_err)?;
        let writer2 = writer.try_clone().map_err(spawn_err)?;
        let mut c = Command::new(&path);
        c.args(&cmd.args)
            .stdout(writer)
            .stderr(writer2)
            .process_group(0);
        for (k, v) in &cmd.env {
            c.env(k, v);
        }
        c.stdin(match &cmd.stdin {
            Some(bytes) => {
                let mut f = memfile("stdin").map_err(spawn_err)?;
                f.write_all(bytes).map_err(spawn_err)?;
                f.seek(SeekFrom::Start(0)).map_err(spawn_err)?;
                Stdio::from(f)
            }
            None => Stdio::null(),
        });
        let mut child = c.spawn().map_err(spawn_err)?;
        drop(c); // closes our copies of the pipe's write end: EOF comes when the child's side closes
        let pid = pid_of(&child);
        process::register_child(pid);
        let started = Instant::now();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut kept = Vec::new();
            let _ = (&mut reader).take(1 << 20).read_to_end(&mut kept);
            let _ = std::io::copy(&mut reader, &mut std::io::sink());
            let _ = tx.send((kept, child.wait()));
        });
        match rx.recv_timeout(cmd.timeout) {
            Ok((output, status)) => {
                process::unregister_child(pid);
                let status = status.map_err(spawn_err)?;
                Ok(CombinedOutput {
                    code: status.code(),
                    signal: status.signal(),
                    output,
                })
            }
            Err(_) => {
                let _ = nix::sys::signal::killpg(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
                // Reap it; a grandchild that left the group may still hold the pipe: don't wait long.
                let _ = rx.recv_timeout(Duration::from_secs(2));
                process::unregister_child(pid);
                Err(ExecError::TimedOut {
                    cmdline: cmd.display(),
                    secs: started.elapsed().as_secs(),
                })
            }
        }
    }
}

/// The child's pid, which is also its process group (`process_group(0)`), as the signed type
/// kill(2) takes. A Linux pid is at most `PID_MAX_LIMIT` (2^22), so the reinterpretation never
/// wraps.
fn pid_of(child: &std::process::Child) -> i32 {
    child.id().cast_signed()
}

fn memfile(name: &str) -> Result<File, std::io::Error> {
    let fd = memfd_create(name, MFdFlags::MFD_CLOEXEC).map_err(std::io::Error::from)?;
    Ok(File::from(fd))
}

/// The most of a child's stdout, and of its stderr, that is ever kept: in memory while it runs
/// and when read back. Tools print lines per object, and some objects are a tenant's to make
/// (a file name in a walked tree): without a bound, a chatty tool fills the memory of the
/// process that runs it (a container with a memory limit is then killed, again on every retry).
pub(crate) const OUTPUT_MAX: u64 = 1 << 20;

/// A memory file the child writes its output to, holding at most [`OUTPUT_MAX`] bytes: sized to
/// that and sealed against growing (`F_SEAL_GROW`), so that a write past it fails in the child
/// (EPERM) instead of taking more memory. What was written is up to the file offset, which the
/// child's descriptor shares with ours ([`written`]).
fn output_file(name: &str) -> Result<File, std::io::Error> {
    use nix::fcntl::{FcntlArg, SealFlag, fcntl};
    let fd = memfd_create(name, MFdFlags::MFD_CLOEXEC | MFdFlags::MFD_ALLOW_SEALING)
        .map_err(std::io::Error::from)?;
    let f = File::from(fd);
    f.set_len(OUTPUT_MAX)?;
    fcntl(&f, FcntlArg::F_ADD_SEALS(SealFlag::F_SEAL_GROW)).map_err(std::io::Error::from)?;
    Ok(f)
}

/// What the child wrote to an [`output_file`]: the bytes before the shared file offset.
fn written(f: &mut File) -> Vec<u8> {
    let end = f.stream_position().unwrap_or(0).min(OUTPUT_MAX);
    let mut v = Vec::new();
    if f.seek(SeekFrom::Start(0)).is_ok() {
        let _ = f.take(end).read_to_end(&mut v);
    }
    v
}

impl Runner for SystemRunner {
    fn has_tool(&self, tool: &str) -> bool {
        self.resolve(tool).is_ok()
    }

    fn run(&self, cmd: &Cmd) -> Result<Output, ExecError> {
        let path = self.resolve(&cmd.tool)?;
        let spawn_err = |source| ExecError::Spawn {
            path: path.clone(),
            source,
        };
        let mut out_f = output_file("stdout").map_err(spawn_err)?;
        let mut err_f = output_file("stderr").map_err(spawn_err)?;
        let mut c = Command::new(&path);
        c.args(&cmd.args)
            .env_clear()
            .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
            .env("LC_ALL", "C")
            .env("LVM_SUPPRESS_FD_WARNINGS", "1")
            .stdout(Stdio::from(out_f.try_clone().map_err(spawn_err)?))
            .stderr(Stdio::from(err_f.try_clone().map_err(spawn_err)?))
            .current_dir(cmd.cwd.as_deref().unwrap_or(Path::new("/")))
            .process_group(0);
        for (k, v) in &cmd.env {
            c.env(k, v);
        }
        let stdin_file = match &cmd.stdin {
            Some(bytes) => {
                let mut f = memfile("stdin").map_err(spawn_err)?;
                f.write_all(bytes).map_err(spawn_err)?;
                f.seek(SeekFrom::Start(0)).map_err(spawn_err)?;
                Some(f)
            }
            None => None,
        };
        c.stdin(match stdin_file {
            Some(f) => Stdio::from(f),
            None => Stdio::null(),
        });
        let mut child = c.spawn().map_err(spawn_err)?;
        drop(c); // closes our copies of the child's descriptors
        let pid = pid_of(&child);
        process::register_child(pid);

        let (tx, rx) = mpsc::channel();
        let started = Instant::now();
        std::thread::spawn(move || {
            let _ = tx.send(child.wait());
        });
        let status = match rx.recv_timeout(cmd.timeout) {
            Ok(r) => r.map_err(spawn_err)?,
            Err(_) => {
                let _ = nix::sys::signal::killpg(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
                // A child stuck in the kernel (a hung NFS mount) may not die at once; don't wait long.
                let _ = rx.recv_timeout(Duration::from_secs(2));
                process::unregister_child(pid);
                return Err(ExecError::TimedOut {
                    cmdline: cmd.display(),
                    secs: started.elapsed().as_secs(),
                });
            }
        };
        process::unregister_child(pid);
        // A tool that ended is progress, whatever it answered (`sys::progress`).
        super::progress::beat();
        let stdout = written(&mut out_f);
        Ok(Output {
            code: status.code(),
            signal: status.signal(),
            truncated: u64::try_from(stdout.len()).is_ok_and(|n| n >= OUTPUT_MAX),
            stdout,
            stderr: written(&mut err_f),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sh(script: &str) -> Cmd {
        Cmd::new("sh")
            .arg("-c")
            .arg(script)
            .timeout(Duration::from_secs(5))
    }

    #[test]
    fn captures_stdout_stderr_and_exit_code() {
        let r = SystemRunner::default();
        let out = r.run(&sh("echo out; echo err >&2; exit 3")).unwrap();
        assert_eq!(out.code, Some(3));
        assert_eq!(out.stdout, b"out\n");
        assert_eq!(out.stderr, b"err\n");
        let e = r
            .check(&sh("echo 'something broke' >&2; exit 5"))
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            "`sh -c 'echo '\\''something broke'\\'' >&2; exit 5'` failed (exit status 5): something broke"
        );
    }

    /// The driver runs with the termination signals and SIGPIPE blocked (`process::start`);
    /// a tool must not inherit that mask, or it could not be stopped by SIGTERM nor see EPIPE
    /// as a shell pipeline expects. Blocked here in this test's own thread, as `start` does.
    #[test]
    fn children_start_with_no_blocked_signals() {
        use nix::sys::signal::{SigSet, Signal};
        let mut set = SigSet::empty();
        for s in [Signal::SIGTERM, Signal::SIGINT, Signal::SIGPIPE] {
            set.add(s);
        }
        let old = set
            .thread_swap_mask(nix::sys::signal::SigmaskHow::SIG_BLOCK)
            .unwrap();
        let out = SystemRunner::default().run(&sh("grep -E '^Sig(Blk|Ign)' /proc/self/status"));
        old.thread_set_mask().unwrap();
        let text = out.unwrap().stdout_text();
        let mask = |name: &str| {
            let line = text.lines().find(|l| l.starts_with(name)).unwrap();
            u64::from_str_radix(line.split_whitespace().nth(1).unwrap(), 16).unwrap()
        };
        assert_eq!(mask("SigBlk:"), 0, "{text}");
        // Whatever started this test may ignore other signals; SIGPIPE (13) must be default.
        assert_eq!(mask("SigIgn:") & (1 << 12), 0, "{text}");
    }

    /// A tool's output is held in memory up to 1 MiB, never more: a write past it fails in the
    /// child (here `head` says so and exits 1), and what was written before it is what comes
    /// back. Fails if the output files could grow (head would write its 8 MiB and exit 0).
    #[test]
    fn a_chatty_tool_cannot_make_us_hold_more_than_a_mebibyte() {
        let r = SystemRunner::default();
        let out = r
            .run(&sh("head -c 8388608 /dev/zero; echo \"head: $?\" >&2"))
            .unwrap();
        assert_eq!(out.stdout.len(), 1 << 20);
        assert!(out.truncated);
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(err.contains("head: 1"), "{err}");
        // A cut answer is never taken for a whole one, even when the tool exits 0 (as
        // `xfs_quota` does when a write fails): a report cut short would read as fewer projects.
        let e = r
            .check(&sh("head -c 2000000 /dev/zero; exit 0"))
            .unwrap_err();
        assert!(matches!(e, ExecError::TooLong { .. }), "{e:?}");
        // Output below the bound is whole.
        let out = r.run(&sh("printf abc; printf xyz >&2")).unwrap();
        assert_eq!((out.stdout, out.stderr), (b"abc".to_vec(), b"xyz".to_vec()));
    }

    #[test]
    fn environment_is_rebuilt() {
        let out = SystemRunner::default()
            .run(&sh("echo $LC_ALL:$LVM_SUPPRESS_FD_WARNINGS:${HOME:-none}").env("X", "1"))
            .unwrap();
        assert_eq!(out.stdout_text(), "C:1:none\n");
    }

    #[test]
    fn stdin_is_null_or_given_bytes() {
        let r = SystemRunner::default();
        assert_eq!(r.run(&sh("cat")).unwrap().stdout, b"");
        let mut c = sh("cat");
        c.stdin = Some(b"secret".to_vec());
        assert_eq!(r.run(&c).unwrap().stdout, b"secret");
    }

    #[test]
    fn timeout_kills_the_whole_group_and_a_lingering_grandchild_does_not_block() {
        let r = SystemRunner::default();
        let t = Instant::now();
        let e = r
            .run(&sh("sleep 30 & sleep 30").timeout(Duration::from_millis(300)))
            .unwrap_err();
        assert!(matches!(e, ExecError::TimedOut { .. }), "{e}");
        assert!(t.elapsed() < Duration::from_secs(3));
        // The parent exits at once but leaves a grandchild holding stdout: we must not wait for it.
        let t = Instant::now();
        let out = r.run(&sh("(sleep 5; echo late) & echo early")).unwrap();
        assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
        assert_eq!(out.stdout, b"early\n");
    }

    #[test]
    fn combined_is_one_pipe_in_order_with_the_environment_inherited() {
        let r = SystemRunner::default();
        let out = r
            .run_combined(
                &sh("echo a; echo b >&2; echo c; echo ${FLEXVOL_TEST_COMBINED:-unset}; exit 4")
                    .env("FLEXVOL_TEST_COMBINED", "given"),
            )
            .unwrap();
        assert_eq!(out.output, b"a\nb\nc\ngiven\n");
        assert_eq!(out.code, Some(4));
        let inherited = r.run_combined(&sh("echo ${PATH:+has-path}")).unwrap();
        assert_eq!(inherited.output, b"has-path\n");
        let mut c = sh("cat");
        c.stdin = Some(b"in".to_vec());
        assert_eq!(r.run_combined(&c).unwrap().output, b"in");
    }

    #[test]
    fn combined_waits_for_the_pipe_like_kubelet_but_not_forever() {
        let r = SystemRunner::default();
        // A helper left holding the pipe keeps kubelet waiting: here, until the timeout, which
        // kills the whole group.
        let t = Instant::now();
        let e = r
            .run_combined(&sh("sleep 30 & echo early").timeout(Duration::from_millis(500)))
            .unwrap_err();
        assert!(matches!(e, ExecError::TimedOut { .. }), "{e}");
        assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
        // A helper that closed its descriptors does not.
        let out = r
            .run_combined(
                &sh("sleep 2 >/dev/null 2>&1 & echo done").timeout(Duration::from_secs(5)),
            )
            .unwrap();
        assert_eq!(out.output, b"done\n");
    }

    #[test]
    fn missing_tools_are_named() {
        let r = SystemRunner::new(vec![PathBuf::from("/nonexistent")]);
        let e = r.run(&Cmd::new("lvcreate")).unwrap_err();
        assert!(
            e.to_string()
                .starts_with("lvcreate is not installed (looked in /nonexistent)"),
            "{e}"
        );
        assert!(!r.has_tool("sh"));
    }
}
