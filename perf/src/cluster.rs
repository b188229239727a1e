//! What every network scenario shares: the options that say where the cluster is and what a
//! message looks like ([`ClusterArgs`]), the tokio runtime the client runs on, and making sure
//! the benchmark topic exists.
//!
//! Owns talking to the cluster's administration (topic creation, routes, queue offsets) through
//! the real client crate's `Admin` and `PullConsumer`. Never produces or consumes load.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::Args;
use shardmq_client::{Admin, MessageQueue, PullConsumer, TopicConfig};
use tokio::time::Instant;

use crate::body::HEADER_BYTES;

/// Largest message body a scenario sends (the broker's default limit).
pub const MAX_MESSAGE_BYTES: usize = 4 << 20;
/// How long a newly created topic may take to appear in the name server's routes.
const ROUTE_TIMEOUT: Duration = Duration::from_secs(30);
const ROUTE_POLL_INTERVAL: Duration = Duration::from_millis(50);

#[derive(Args, Debug, Clone)]
pub struct ClusterArgs {
    /// Name server address(es), `host:port`, comma separated.
    #[arg(long, default_value = "127.0.0.1:9876")]
    pub namesrv: String,
    /// Topic to use; created on every master broker with --queues queues when the name server
    /// does not route it yet.
    #[arg(long, default_value = "PerfTopic")]
    pub topic: String,
    /// Queues of the topic when this run creates it.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub queues: u32,
    /// Body size of each message in bytes (at least 40: the benchmark header).
    #[arg(long, default_value_t = 1024)]
    pub size: usize,
    /// Tokio worker threads of the client runtime (default: one per core).
    #[arg(long)]
    pub threads: Option<usize>,
    /// The brokers' flush mode (`sync`/`async`) to record in the results; by default it is
    /// asked from every master broker (`BrokerStatusRequest`).
    #[arg(long)]
    pub broker_flush: Option<String>,
    /// Also print the result as one JSON object, on the last line of stdout.
    #[arg(long)]
    pub json: bool,
    /// Write `<scenario>.json` (the result, latency curve and throughput samples) and
    /// `<scenario>.svg` (latency percentile curve and throughput over time) into this
    /// directory, created if missing.
    #[arg(long)]
    pub report: Option<PathBuf>,
    /// No progress line on stderr.
    #[arg(long)]
    pub quiet: bool,
}

impl ClusterArgs {
    /// Checks the options that clap cannot.
    pub fn validate(&self) -> Result<()> {
        if !(HEADER_BYTES..=MAX_MESSAGE_BYTES).contains(&self.size) {
            bail!(
                "--size {} is outside {HEADER_BYTES}..={MAX_MESSAGE_BYTES} bytes (each body \
                 carries a {HEADER_BYTES}-byte benchmark header)",
                self.size
            );
        }
        if self.threads == Some(0) {
            bail!("--threads must be at least 1");
        }
        Ok(())
    }

    /// A multi-threaded tokio runtime for the client.
    pub fn runtime(&self) -> Result<tokio::runtime::Runtime> {
        let mut builder = tokio::runtime::Builder::new_multi_thread();
        builder.enable_all().thread_name("perf-client");
        if let Some(threads) = self.threads {
            builder.worker_threads(threads);
        }
        builder.build().context("cannot start the tokio runtime")
    }
}

/// An admin client for `args.namesrv`.
pub async fn admin(args: &ClusterArgs) -> Result<Admin> {
    Admin::builder()
        .namesrv(&args.namesrv)
        .build()
        .await
        .context("cannot start the admin client")
}

/// The flush mode to report: `--broker-flush` when given, else what the master brokers say
/// (their modes joined with `,` when they differ); `None` when no broker answers.
pub async fn broker_flush(admin: &Admin, args: &ClusterArgs) -> Option<String> {
    if let Some(flush) = &args.broker_flush {
        return Some(flush.clone());
    }
    let clusters = admin.cluster_info().await.ok()?;
    let mut modes = std::collections::BTreeSet::new();
    for address in clusters.iter().flat_map(|c| c.master_addresses()) {
        if let Ok(status) = admin.broker_status(address).await {
            modes.insert(status.flush);
        }
    }
    (!modes.is_empty()).then(|| modes.into_iter().collect::<Vec<_>>().join(","))
}

/// The topic's readable queues, creating the topic on every master broker first when the name
/// server does not route it.
pub async fn ensure_topic(admin: &Admin, args: &ClusterArgs) -> Result<Vec<MessageQueue>> {
    if let Ok(route) = admin.route(&args.topic).await {
        let queues = route.read_queues();
        if !queues.is_empty() {
            return Ok(queues);
        }
    }
    let config = TopicConfig::new(&args.topic, args.queues);
    let brokers = admin
        .upsert_topic_in_cluster(None, &config, false)
        .await
        .and_then(shardmq_client::Partial::complete)
        .with_context(|| format!("cannot create topic {}", args.topic))?;
    let expected = args.queues as usize * brokers.len();
    let deadline = Instant::now() + ROUTE_TIMEOUT;
    loop {
        if let Ok(route) = admin.route(&args.topic).await {
            let queues = route.read_queues();
            if queues.len() >= expected {
                return Ok(queues);
            }
        }
        if Instant::now() >= deadline {
            bail!(
                "created topic {} on {brokers:?}, but the name server did not route its {expected} \
                 queues within {} s",
                args.topic,
                ROUTE_TIMEOUT.as_secs()
            );
        }
        tokio::time::sleep(ROUTE_POLL_INTERVAL).await;
    }
}

/// Each queue's end offset (one past its newest message) now.
pub async fn end_offsets(
    consumer: &PullConsumer,
    queues: &[MessageQueue],
) -> Result<Vec<(MessageQueue, i64)>> {
    let mut ends = Vec::with_capacity(queues.len());
    for queue in queues {
        let (_, max_offset) = consumer
            .queue_offsets(queue)
            .await
            .with_context(|| format!("cannot read the offsets of {queue}"))?;
        ends.push((queue.clone(), max_offset));
    }
    Ok(ends)
}

/// A group name unique to this run: `<prefix>-<run id in hex>`.
pub fn run_group(prefix: &str, run_id: u32) -> String {
    format!("{prefix}-{run_id:08x}")
}
