//! One kubelet call, top to bottom: parse argv, load the node config, start the call record, arm
//! the deadline and start the guard thread (hostPath: only when the call leaves kubelet's own
//! filesystem, see `sys::process`), let the backend answer, reply exactly once.
//!
//! Every path out of here, including a config error, a parse error, a deadline, SIGTERM and a
//! panic, ends in exactly one JSON reply on stdout and an exit code that matches it.

use crate::backend::{self, Backend, Context};
use crate::node::calllog;
use crate::node::config::Config;
use crate::protocol::reply::{self, Reply};
use crate::protocol::verb::Call;
use crate::sys::process::{self, Deadline};

/// Runs one call of `backend` with kubelet's `args` (everything after argv[0]) and returns the
/// exit code. The reply has been written when this returns.
pub(crate) fn run(backend: Backend, argv0: &str, args: &[String]) -> i32 {
    let verb = args.first().map(String::as_str).unwrap_or("");
    let config = Config::load();
    match &config {
        Ok(c) => calllog::begin(
            c.log_path().map(Into::into),
            c.call_log_max_bytes,
            c.log_syslog.then(|| c.syslog_socket.clone()),
            backend.name(),
            verb,
            args,
        ),
        Err(_) => calllog::begin(None, 0, None, backend.name(), verb, args),
    }
    // Replies written by the deadline, signal or panic paths are logged like any other.
    process::after_reply(calllog::record_final);
    let reply = answer(backend, &driver_name(backend, argv0), args, config);
    finish(&reply)
}

fn answer(
    backend: Backend,
    driver_name: &str,
    args: &[String],
    config: Result<Config, crate::node::config::ConfigError>,
) -> Reply {
    let call = match Call::parse(args) {
        Ok(c) => c,
        Err(e) => return Reply::failure(e.to_string()),
    };
    // Verbs answered from constants: no node work, so no guard thread and no fault injection.
    let passive = matches!(
        call,
        Call::Init | Call::GetVolumeName { .. } | Call::Unknown { .. }
    );
    // init must work even with a broken config: a failing init unloads the driver entirely, and
    // the real verbs will report the config error where an operator sees it (pod events).
    let config = match (config, &call) {
        (Ok(c), _) => c,
        (Err(_), _) if passive => Config::default(),
        (Err(e), _) => return Reply::failure(e.to_string()),
    };
    let deadline = Deadline::after(config.verb_timeout());
    if !passive {
        process::arm(call.verb(), deadline);
        // hostPath starts the guard itself, only when a call leaves kubelet's own filesystem
        // (see sys::process, "When the guard thread runs").
        if backend != Backend::HostPath {
            process::start_guards();
        }
    }
    backend::on_node(&config, deadline, driver_name, |ctx| {
        if !passive {
            inject_test_fault(ctx);
        }
        match backend::answer(backend, &call, ctx) {
            Ok(r) => r,
            Err(e) => Reply::failure(e.to_string()),
        }
    })
}

/// The driver name kubelet knows this install by (`<vendor>/<driver>`), from the directory the
/// executable runs from (`.../<vendor>~<driver>/<driver>`); `flexvol/<driver>` when run by hand.
pub(crate) fn driver_name(backend: Backend, argv0: &str) -> String {
    let parent = std::path::Path::new(argv0)
        .parent()
        .and_then(|p| p.file_name())
        .map(|n| n.to_string_lossy().into_owned());
    match parent.as_deref().and_then(|d| d.split_once('~')) {
        Some((vendor, drv)) if drv == backend.name() && !vendor.is_empty() => {
            format!("{vendor}/{drv}")
        }
        _ => format!("flexvol/{}", backend.name()),
    }
}

/// Writes the reply (if nothing else has) and the call record; returns the exit code.
pub(crate) fn finish(reply: &Reply) -> i32 {
    if reply::emit(reply) {
        calllog::record_final(reply);
        reply.exit_code()
    } else {
        // The guard thread (deadline or signal) answered first and is exiting with its code.
        crate::sys::process::failed_exit_code()
    }
}

/// Fault injection for the test suites, with the guard started: `FLEXVOL_TEST_FAULT=panic`
/// panics, `hang` blocks forever, `hang-child` blocks in a child process (`sleep`). Tests use it to
/// prove that panics, deadlines and SIGTERM still end in one Failure reply and no orphan children.
/// Unset in production, where it costs one environment lookup.
fn inject_test_fault(ctx: &Context) {
    let fault = std::env::var("FLEXVOL_TEST_FAULT");
    if fault.is_ok() {
        // What these faults stand for (a hung kernel call, a hung helper) is what the guard is
        // for, so it runs whatever the backend would have decided.
        process::start_guards();
    }
    match fault.as_deref() {
        Ok("panic") => panic!("injected test fault"),
        Ok("hang") => loop {
            std::thread::park();
        },
        Ok("hang-child") => {
            let cmd = crate::sys::exec::Cmd::new("sleep")
                .arg("3600")
                .timeout(std::time::Duration::from_secs(3600));
            let _ = ctx.runner.run(&cmd);
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn driver_name_from_install_path() {
        let p = "/usr/libexec/kubernetes/kubelet-plugins/volume/exec/example.com~lvm/lvm";
        assert_eq!(driver_name(Backend::Lvm, p), "example.com/lvm");
        assert_eq!(driver_name(Backend::Lvm, "/tmp/lvm"), "flexvol/lvm");
        assert_eq!(driver_name(Backend::Nfs, "/x/acme~lvm/nfs"), "flexvol/nfs");
    }
}
