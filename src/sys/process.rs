//! The driver's own process: what it needs at start-up ([`start`], in place of std's own, see
//! `main.rs`), its deadline, its signals and the children it must not leave behind.
//!
//! kubelet puts no timeout on most verbs, so a hung driver wedges the volume forever; on the one
//! verb it does time out (`waitforattach`) it sends SIGTERM and, 10 s later, SIGKILL. So:
//! - every call runs under a [`Deadline`]; a guard thread answers Failure when it expires;
//! - SIGTERM, SIGINT and SIGHUP are taken by the same thread, which answers Failure;
//! - in both cases every child process group we started is killed first, so no helper keeps
//!   working on a volume after we have reported failure.
//!
//! # When the guard thread runs
//! A call that can block on something the node does not control (a helper process, a network or
//! FUSE filesystem, a device) must have the guard running *before* it touches that thing:
//! [`arm`] records the deadline, [`start_guards`] starts the thread (once; later calls do
//! nothing). The driver starts it right after parsing for every backend but hostPath.
//!
//! hostPath starts it lazily, because a thread costs every call about as much as the rest of a
//! hostPath mount (measured: a third of the mount+unmount pair), and a hostPath call usually
//! touches nothing but the filesystem kubelet's own pod directories live on. Before touching a
//! volume path the backend asks [`guard_unless_on`] whether that path is on the same
//! filesystem as the pod directory's parent, found by a lookup that cannot block
//! ([`crate::sys::paths::cached_device`]: dentry cache only, no server asked); anything else, or
//! anything that cannot be answered that way, starts the guard first. Waiting forever on
//! kubelet's own filesystem is not something the guard could cure: kubelet waits on it too, and
//! a thread cannot end a process stuck in an uninterruptible wait. Without the guard, SIGTERM
//! stays blocked and pending: the call finishes its local work and answers normally.
//! flexvol's own config, state, lock and log locations are, like the config file, read without
//! the guard: they must be on local filesystems (docs/configuration.md, "The node config file").
//!
//! Children run in their own process groups (see `exec`), so killing the group also reaches the
//! grandchildren a tool may fork.

use crate::protocol::reply::{self, Reply};
use nix::sys::signal::{self, SigSet, Signal};
use nix::unistd::Pid;
use std::collections::BTreeSet;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

static CHILD_GROUPS: Mutex<BTreeSet<i32>> = Mutex::new(BTreeSet::new());
/// What runs after [`fail_and_exit`] wrote its reply (the driver's call record).
static AFTER_REPLY: OnceLock<fn(&Reply)> = OnceLock::new();
/// The exit status [`fail_and_exit`] chose, for a thread whose own reply lost the race to it.
static FAILED_EXIT: AtomicI32 = AtomicI32::new(0);

/// Registers `f` to run after a reply that [`fail_and_exit`] writes (the deadline, a signal, a
/// panic), so that those replies reach the call log too without this layer knowing about it.
/// Caller contract: once per process, before [`start_guards`]; later registrations are ignored.
pub(crate) fn after_reply(f: fn(&Reply)) {
    let _ = AFTER_REPLY.set(f);
}

/// Records a child's process group so a deadline or signal can kill it.
pub(crate) fn register_child(pgid: i32) {
    if let Ok(mut g) = CHILD_GROUPS.lock() {
        g.insert(pgid);
    }
}

/// Forgets a child that has been reaped.
pub(crate) fn unregister_child(pgid: i32) {
    if let Ok(mut g) = CHILD_GROUPS.lock() {
        g.remove(&pgid);
    }
}

/// Sends SIGKILL to every registered child process group.
pub(crate) fn kill_children() {
    let groups: Vec<i32> = CHILD_GROUPS
        .lock()
        .map(|g| g.iter().copied().collect())
        .unwrap_or_default();
    for pgid in groups {
        let _ = signal::killpg(Pid::from_raw(pgid), Signal::SIGKILL);
    }
}

/// Replies Failure (unless a reply went out already), kills our children and exits with
/// [`exit_code_for`] `interrupted` (0 when another reply went out first: the status that goes with
/// it, [`Reply::exit_code`]).
///
/// The reply goes first: killing a helper makes the verb's own thread fail too (its tool died of
/// SIGKILL), and that reply must not win the race against the reason (the signal, the deadline).
/// The children die before the process ends, so the message's "were killed" is true by the time
/// kubelet sees end of file.
#[allow(clippy::exit)]
pub fn fail_and_exit(message: &str, interrupted: bool) -> ! {
    let code = exit_code_for(interrupted);
    FAILED_EXIT.store(code, Ordering::SeqCst);
    let reply = Reply::failure(message);
    let ours = reply::emit(&reply);
    kill_children();
    if ours && let Some(f) = AFTER_REPLY.get() {
        f(&reply);
    }
    std::process::exit(if ours { code } else { 0 })
}

/// The exit status of a Failure that [`fail_and_exit`] writes: 1 when it answers a signal
/// (`interrupted`), else 0 like every other reply ([`Reply::exit_code`]). kubelet's `DriverCall.Run`
/// (1.20.2 and current) reports its own timeout only when the driver's exit is an error (it sends
/// SIGTERM, then reads `execErr`); that report skips the warning that logs argv. A Failure that
/// exits 0 returns the same error as one that exits 1, without that warning
/// (docs/protocol.md §1.2).
pub(crate) fn exit_code_for(interrupted: bool) -> i32 {
    i32::from(interrupted)
}

/// The exit status [`fail_and_exit`] chose, for the thread whose reply it pre-empted.
pub(crate) fn failed_exit_code() -> i32 {
    FAILED_EXIT.load(Ordering::SeqCst)
}

/// A point in time by which the current call must have answered.
#[derive(Debug, Clone, Copy)]
pub struct Deadline {
    at: Instant,
    total: Duration,
}

impl Deadline {
    /// A deadline `total` from now.
    pub fn after(total: Duration) -> Self {
        Self {
            at: Instant::now() + total,
            total,
        }
    }

    /// Time left, zero when passed.
    pub(crate) fn remaining(&self) -> Duration {
        self.at.saturating_duration_since(Instant::now())
    }

    /// Whether the deadline has passed.
    pub(crate) fn expired(&self) -> bool {
        self.remaining().is_zero()
    }

    /// The whole budget this deadline was created with.
    pub(crate) fn total(&self) -> Duration {
        self.total
    }

    /// The smaller of `limit` and the time left: how long one step may take.
    pub(crate) fn cap(&self, limit: Duration) -> Duration {
        limit.min(self.remaining())
    }
}

/// What the process needs before anything else runs, in place of std's own start-up (`main.rs`
/// says why flexvol's `main` is the C entry point). Caller contract: first thing in `main`,
/// before any other thread exists, so that every thread inherits the signal mask.
///
/// - Descriptors 0, 1 and 2 are open: a closed one is opened on `/dev/null` (std's start-up does
///   the same). Otherwise the first file flexvol opens would take its number, and the reply, or a
///   child's output, would be written into a lock, state or log file.
/// - The termination signals are blocked, so that only [`start_guards`]'s signal thread receives
///   them, and so is SIGPIPE: a write to a closed pipe or socket (kubelet gone, an NFS server that
///   reset the connection) fails with EPIPE instead of killing the process before it answers.
///   std ignores SIGPIPE instead; changing a disposition needs `unsafe`, blocking does not, and a
///   blocked SIGPIPE stays pending and harmless (the signal thread never waits for it).
///
/// Children get a clean mask and default dispositions: std resets the mask between fork and exec
/// (`exec::tests::children_start_with_no_blocked_signals`).
pub fn start() {
    open_standard_fds();
    let mut set = termination_signals();
    set.add(Signal::SIGPIPE);
    let _ = set.thread_block();
}

/// Opens `/dev/null` on each of descriptors 0, 1 and 2 that is closed: one `poll` asks about all
/// three (`POLLNVAL` marks a closed one), and `open` always returns the lowest free number.
fn open_standard_fds() {
    use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
    use rustix::stdio::{stderr, stdin, stdout};
    use std::os::fd::IntoRawFd;
    // rustix's descriptors, not std's handles: `std::io::stdin()` would allocate its 8 KiB buffer.
    let mut fds = [
        PollFd::new(stdin(), PollFlags::empty()),
        PollFd::new(stdout(), PollFlags::empty()),
        PollFd::new(stderr(), PollFlags::empty()),
    ];
    if poll(&mut fds, PollTimeout::ZERO).is_err() {
        return;
    }
    for fd in &fds {
        if fd
            .revents()
            .is_some_and(|r| r.contains(PollFlags::POLLNVAL))
        {
            // Kept open for the life of the process, as the descriptor it stands in for.
            let _ = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open("/dev/null")
                .map(IntoRawFd::into_raw_fd);
        }
    }
}

/// Waits until SIGTERM, SIGINT or SIGHUP arrives (they are blocked, see [`start`]), for commands that run until stopped.
pub(crate) fn wait_for_termination() -> Option<Signal> {
    termination_signals().wait().ok()
}

fn termination_signals() -> SigSet {
    let mut set = SigSet::empty();
    for s in [
        Signal::SIGTERM,
        Signal::SIGINT,
        Signal::SIGHUP,
        Signal::SIGALRM,
    ] {
        set.add(s);
    }
    set
}

/// The call's verb and deadline, recorded by [`arm`] for [`start_guards`].
static ARMED: OnceLock<(String, Deadline)> = OnceLock::new();
/// Set once the guard thread has been asked for.
static STARTED: OnceLock<()> = OnceLock::new();

/// Records the call's verb and deadline without starting anything. Caller contract: once per
/// process, before any [`start_guards`] or [`guard_unless_on`]; later calls are ignored.
pub(crate) fn arm(verb: &str, deadline: Deadline) {
    let _ = ARMED.set((verb.to_owned(), deadline));
}

/// Whether the guard thread has been started for this call.
pub(crate) fn guarded() -> bool {
    STARTED.get().is_some()
}

/// Starts the guard thread (once per process; later calls return at once) and arms the alarm for
/// the time left before the [`arm`]ed deadline. The thread answers Failure and exits on the
/// deadline (an `alarm(2)`, delivered as SIGALRM) or on a termination signal. Does nothing before
/// [`arm`]. Children never inherit the alarm (fork clears it).
pub(crate) fn start_guards() {
    let Some((verb, deadline)) = ARMED.get() else {
        return;
    };
    if STARTED.set(()).is_err() {
        return;
    }
    let secs = u32::try_from(deadline.total().as_secs())
        .unwrap_or(u32::MAX)
        .max(1);
    // Whole seconds, rounded up: never earlier than the deadline, at least one.
    let left = deadline.remaining();
    let alarm_secs = u32::try_from(left.as_secs() + u64::from(left.subsec_nanos() > 0))
        .unwrap_or(u32::MAX)
        .max(1);
    let verb = verb.clone();
    // Unnamed: a name costs an allocation and a prctl.
    let spawned = std::thread::Builder::new().stack_size(64 * 1024).spawn(move || {
        let Ok(sig) = termination_signals().wait() else { return };
        if sig == Signal::SIGALRM {
            fail_and_exit(&format!(
                "{verb} did not finish within its deadline of {secs}s; its helper processes were killed. \
                 Check the node (a hung NFS server or device?) and the flexvol log; raise verbTimeoutSeconds in the config if the work is legitimately slow"
            ), false);
        }
        fail_and_exit(&format!(
            "{verb} was interrupted by {sig:?} (kubelet sends SIGTERM when a call exceeds its own timeout); its helper processes were killed and the call can be retried"
        ), true);
    });
    if spawned.is_ok() {
        nix::unistd::alarm::set(alarm_secs);
    }
}

/// Starts the guard ([`start_guards`]) unless every path in `paths` is on the filesystem `local`
/// (a device number from [`crate::sys::paths::cached_device`]), as far as a lookup that cannot
/// block can tell. `local` of `None` (unknown) starts it. Costs nothing once the guard runs; three
/// syscalls per path otherwise. Caller contract: call it before touching any of `paths`.
pub(crate) fn guard_unless_on(local: Option<u64>, paths: &[&std::path::Path]) {
    if guarded() {
        return;
    }
    let on_local = local.is_some_and(|dev| {
        paths
            .iter()
            .all(|p| crate::sys::paths::cached_device(p) == Some(dev))
    });
    if !on_local {
        start_guards();
    }
}

/// A named point in a mutating verb where the crash tests kill the driver: when the environment
/// variable `FLEXVOL_TEST_KILL_AT` equals `name`, the process sends itself SIGKILL right here,
/// exactly like a node losing the process mid-call. The next call must converge. When
/// `FLEXVOL_TEST_HANG_AT` equals `name`, the call blocks here forever instead, like a step stuck
/// in the kernel: the deadline tests prove which calls the guard thread answers; with
/// `FLEXVOL_TEST_HANG_WHEN` set to a path as well, only once that path exists (so a daemon that
/// passed the point many times can be stuck there later, from outside). With
/// `FLEXVOL_TEST_KILL_ONCE` set to a path as well, the kill happens only if removing that path
/// succeeds, so a daemon restarted by its supervisor with the same environment (a DaemonSet's
/// container) is killed once per marker the test plants, not on every retry. Costs two
/// environment lookups when unset.
pub(crate) fn checkpoint(name: &str) {
    if std::env::var_os("FLEXVOL_TEST_KILL_AT").is_some_and(|v| v == name)
        && std::env::var_os("FLEXVOL_TEST_KILL_ONCE")
            .is_none_or(|marker| std::fs::remove_file(marker).is_ok())
    {
        let _ = signal::kill(Pid::this(), Signal::SIGKILL);
        // SIGKILL cannot be blocked; never reached.
        std::thread::park();
    }
    if std::env::var_os("FLEXVOL_TEST_HANG_AT").is_some_and(|v| v == name)
        && std::env::var_os("FLEXVOL_TEST_HANG_WHEN")
            .is_none_or(|when| std::path::Path::new(&when).exists())
    {
        loop {
            std::thread::park();
        }
    }
}
