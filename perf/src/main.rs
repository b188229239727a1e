//! `shardmq-perf`: ShardMQ's load generator and benchmark reporter.
//!
//! Each subcommand is one scenario: it drives a real ShardMQ component, measures it, and prints
//! a human summary to stdout (with `--json`, the last line of stdout is one JSON object, for
//! scripts). Logs go to stderr (`RUST_LOG` filters them; warnings by default), so stdout stays
//! machine-readable. The numbers and the commands that produced them live in
//! `docs/performance.md`.
//!
//! Scenarios: `store` (the storage engine on one pinned glommio executor, no network).

mod data_dir;
mod executor;
mod report;
mod store;

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use tracing_subscriber::EnvFilter;

#[derive(Parser, Debug)]
#[command(
    name = "shardmq-perf",
    version,
    about = "ShardMQ load generator and benchmark reporter"
)]
struct Cli {
    #[command(subcommand)]
    scenario: Scenario,
}

#[derive(Subcommand, Debug)]
enum Scenario {
    /// Append through the real storage engine (`MessageStore`) on a pinned glommio executor and
    /// report throughput and append-latency percentiles.
    Store(store::StoreArgs),
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let result = match cli.scenario {
        Scenario::Store(args) => store::run(&args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("shardmq-perf: {error:#}");
            ExitCode::FAILURE
        }
    }
}
