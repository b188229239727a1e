//! The glommio executor a scenario runs on: one thread pinned to one CPU, as a broker shard is.
//!
//! Owns building the executor and running a scenario's future to completion on the calling
//! thread. Pinning can fail (a CPU outside this process's affinity mask, a container that
//! forbids it); then the scenario still runs, unpinned, and says so, because a number from an
//! unpinned run is worth less but is not wrong.

use std::future::Future;

use anyhow::{Context, Result};
use glommio::{LocalExecutor, LocalExecutorBuilder, Placement};
use tracing::warn;

/// Where the executor ended up running.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pinning {
    Pinned { cpu: usize },
    Unbound,
}

impl Pinning {
    /// The pinned CPU, if any (for reports).
    pub fn cpu(self) -> Option<usize> {
        match self {
            Pinning::Pinned { cpu } => Some(cpu),
            Pinning::Unbound => None,
        }
    }
}

/// Builds an executor pinned to `cpu`, or an unbound one if pinning fails.
fn build(name: &str, cpu: usize) -> Result<(LocalExecutor, Pinning)> {
    match LocalExecutorBuilder::new(Placement::Fixed(cpu))
        .name(name)
        .make()
    {
        Ok(executor) => Ok((executor, Pinning::Pinned { cpu })),
        Err(error) => {
            warn!(cpu, %error, "cannot pin the executor to the CPU; running unbound");
            let executor = LocalExecutorBuilder::new(Placement::Unbound)
                .name(name)
                .make()
                .map_err(std::io::Error::from)
                .context("cannot build a glommio executor")?;
            Ok((executor, Pinning::Unbound))
        }
    }
}

/// Runs `make()` to completion on an executor pinned to `cpu` (unbound if that fails), on the
/// calling thread.
pub fn run_pinned<F, T>(name: &str, cpu: usize, make: impl FnOnce(Pinning) -> F) -> Result<T>
where
    F: Future<Output = T>,
{
    let (executor, pinning) = build(name, cpu)?;
    Ok(executor.run(make(pinning)))
}
