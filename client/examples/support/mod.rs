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
