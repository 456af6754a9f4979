//! Entry point: guards first (signal mask, panic hook), then dispatch on the name we run as.

#![allow(clippy::exit)]

fn main() {
    // Before any thread exists, so that every thread inherits the mask (see sys::process).
    flexvol::sys::process::block_termination_signals();
    std::panic::set_hook(Box::new(|info| {
        flexvol::sys::process::fail_and_exit(&format!(
            "internal error in flexvol ({info}); please report it with the matching line of the flexvol log"
        ))
    }));
    std::process::exit(flexvol::cli::main_os(std::env::args_os().collect()));
}
