//! Ctrl-C and SIGTERM for the long commands (`train`, `sweep`): the first asks the work to stop
//! after its current step, and the run saves its checkpoint and a summary that says "stopped";
//! a second ends the process at once, as it would without this.

use std::sync::atomic::{AtomicBool, Ordering};

static INTERRUPTED: AtomicBool = AtomicBool::new(false);

#[cfg(unix)]
extern "C" fn on_signal(_: libc::c_int) {
    INTERRUPTED.store(true, Ordering::SeqCst);
    // SAFETY: signal() is async-signal-safe; the next Ctrl-C or SIGTERM gets the default action.
    #[allow(unsafe_code)]
    unsafe {
        libc::signal(libc::SIGINT, libc::SIG_DFL);
        libc::signal(libc::SIGTERM, libc::SIG_DFL);
    }
}

/// Catches Ctrl-C and SIGTERM from now on; the flag they set. Elsewhere than on Unix the flag
/// is never set (the default action ends the process).
pub fn install() -> &'static AtomicBool {
    #[cfg(unix)]
    // SAFETY: the handler only stores to an atomic and resets the dispositions.
    #[allow(unsafe_code)]
    unsafe {
        let handler = on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
        libc::signal(libc::SIGINT, handler);
        libc::signal(libc::SIGTERM, handler);
    }
    &INTERRUPTED
}

/// Whether Ctrl-C or SIGTERM arrived since [`install`].
pub fn interrupted() -> bool {
    INTERRUPTED.load(Ordering::SeqCst)
}
