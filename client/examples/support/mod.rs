//! What the examples share (not an example itself: cargo builds only `examples/*.rs`).

use std::fmt::Display;
use std::process::ExitCode;

/// The exit status of an example's `run`: an error is printed as its message, not as the
/// `Debug` dump `fn main() -> Result` would print.
pub fn exit_code<E: Display>(result: Result<(), E>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error}");
            ExitCode::FAILURE
        }
    }
}

/// Completes on Ctrl-C (SIGINT) or SIGTERM, so a consumer stopped by a service manager or
/// `kill` shuts down cleanly (leaving its group at once) like one stopped at a terminal.
#[allow(dead_code)] // not every example waits for a signal
pub async fn stop_signal() -> std::io::Result<()> {
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        interrupted = tokio::signal::ctrl_c() => interrupted,
        _ = terminate.recv() => Ok(()),
    }
}
