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

/// A future that completes on Ctrl-C (SIGINT) or SIGTERM, so a consumer stopped by a service
/// manager or `kill` shuts down cleanly (leaving its group at once) like one stopped at a
/// terminal. Both handlers are installed by this call, before it returns: call it before
/// saying the example is ready, or a signal sent right after would still kill it.
#[allow(dead_code)] // not every example waits for a signal
pub fn stop_signal() -> std::io::Result<impl std::future::Future<Output = ()>> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut interrupt = signal(SignalKind::interrupt())?;
    let mut terminate = signal(SignalKind::terminate())?;
    Ok(async move {
        tokio::select! {
            _ = interrupt.recv() => {}
            _ = terminate.recv() => {}
        }
    })
}
