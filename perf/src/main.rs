//! `shardmq-perf`: ShardMQ's load generator and benchmark reporter.
//!
//! Each subcommand is one scenario: it drives a real ShardMQ component, measures it, and prints
//! a human summary to stdout (with `--json`, the last line of stdout is one JSON object, for
//! scripts). Logs go to stderr (`RUST_LOG` filters them; warnings by default), so stdout stays
//! machine-readable. The numbers and the commands that produced them live in
//! `docs/performance.md`.
//!
//! Scenarios: `produce`, `consume` and `e2e` drive a running name server and broker through
//! the real client crate (`shardmq-client`, on tokio); `store` drives the storage engine on
//! one pinned glommio executor, no network; `clients` holds many heartbeating clients (the
//! control plane's load). Each network scenario can write a report
//! (`--report DIR`: JSON and an SVG chart).
//!
//! Modules: `cluster` (shared options, topic setup), `body` (the benchmark header every message
//! carries), `producers` and `consumers` (the load and the receiving group), `tracker` (lost and
//! duplicate accounting), `progress` (the progress line and throughput samples), `summary`,
//! `chart` and `report` (results).

mod body;
mod chart;
mod clients;
mod cluster;
mod consume;
mod consumers;
mod cpu;
mod data_dir;
mod e2e;
mod executor;
mod produce;
mod producers;
mod progress;
mod report;
mod store;
mod summary;
mod tracker;

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
    /// Connect in TLS, trusting the CAs of this PEM file (docs/tls.md); without it the clients
    /// read SHARDMQ_TLS_CA and friends.
    #[arg(long, global = true, value_name = "FILE")]
    tls_ca: Option<std::path::PathBuf>,
    /// PEM client certificate for mutual TLS (with --tls-key).
    #[arg(long, global = true, value_name = "FILE", requires = "tls_key")]
    tls_cert: Option<std::path::PathBuf>,
    /// PEM private key of --tls-cert.
    #[arg(long, global = true, value_name = "FILE", requires = "tls_cert")]
    tls_key: Option<std::path::PathBuf>,
    /// Access key of the account every client authenticates as, with servers that enforce
    /// access control (docs/acl.md). Also from SHARDMQ_ACCESS_KEY.
    #[arg(long, global = true, value_name = "KEY", requires = "secret_key")]
    access_key: Option<String>,
    /// Secret key of that account (with --access-key). Also from SHARDMQ_SECRET_KEY.
    #[arg(long, global = true, value_name = "SECRET", requires = "access_key")]
    secret_key: Option<String>,
}

#[derive(Subcommand, Debug)]
enum Scenario {
    /// Send to a topic with P producers through the client crate; report throughput and send
    /// latency (with --rate, from each call's intended send time). --verify reads the topic
    /// back and counts lost and duplicate messages.
    Produce(produce::ProduceArgs),
    /// Drain (--from first) or tail (--from last) a topic with C push consumers in a new
    /// group; --backlog N fills the topic first and checks that every message arrives once.
    Consume(consume::ConsumeArgs),
    /// Produce and consume at once; report end-to-end latency (receive − send time carried in
    /// each message) and lost and duplicate messages.
    E2e(e2e::E2eArgs),
    /// Hold many idle clients that only heartbeat (the control plane's load); run a produce
    /// beside it to see what that costs the data path.
    Clients(clients::ClientsArgs),
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
    if let Some(ca) = &cli.tls_ca {
        let mut files = shardmq_client::TlsFiles::new(ca);
        files.cert_chain = cli.tls_cert.clone();
        files.key = cli.tls_key.clone();
        shardmq_client::set_default_tls(Some(files));
    }
    let credentials = match (&cli.access_key, &cli.secret_key) {
        (Some(access_key), Some(secret_key)) => {
            shardmq_client::Credentials::new(access_key.as_str(), secret_key.as_str()).map(Some)
        }
        _ => shardmq_client::Credentials::from_env(),
    };
    match credentials {
        Ok(credentials) => shardmq_client::set_default_credentials(credentials),
        Err(error) => {
            eprintln!("shardmq-perf: the account: {error}");
            return ExitCode::from(2);
        }
    }
    let result = match cli.scenario {
        Scenario::Produce(args) => produce::run(&args),
        Scenario::Consume(args) => consume::run(&args),
        Scenario::E2e(args) => e2e::run(&args),
        Scenario::Store(args) => store::run(&args),
        Scenario::Clients(args) => clients::run(&args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("shardmq-perf: {error:#}");
            ExitCode::FAILURE
        }
    }
}
