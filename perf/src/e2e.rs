//! The `e2e` scenario: producers and a consumer group at once on one topic, measuring
//! end-to-end latency (receive time − send time, from the message's own header) and checking
//! delivery: every acknowledged `(producer, sequence)` must be received, once.
//!
//! Order of events: the group starts (a new group, from the last offset) and settles its
//! queues; the producers start (routes fetched); the clock starts with the first send; after
//! the last send the scenario waits until every acknowledged message has arrived, or nothing
//! new has for `--idle-timeout` seconds; what is still missing then is lost. Throughput is
//! distinct messages received over the time from the first send to the last receipt.
//!
//! Three latencies are reported: end to end from the intended send time (the primary figure:
//! under `--rate` it includes any wait of a late producer, so queueing is not hidden), end to
//! end from the born time (just before the send call: what the broker and client add), and the
//! send latency per call.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Args;
use serde_json::json;
use shardmq_client::ConsumeFrom;

use crate::body::new_run_id;
use crate::cluster::{self, ClusterArgs};
use crate::consumers::{ConsumerGroup, ConsumerTuning, GroupPlan};
use crate::produce::{goal_of, stop_of};
use crate::producers::{self, LoadPlan};
use crate::progress::{Counters, Progress};
use crate::summary::{Latency, Outcome};

#[derive(Args, Debug, Clone)]
pub struct E2eArgs {
    #[command(flatten)]
    pub cluster: ClusterArgs,
    /// Producers (each its own client and connection, one send in flight each).
    #[arg(long, default_value_t = 1)]
    pub producers: u32,
    /// Consumers in the group (each its own client).
    #[arg(long, default_value_t = 1)]
    pub consumers: u32,
    /// Messages per send call.
    #[arg(long, default_value_t = 1)]
    pub batch: u32,
    /// Messages to send in total (default 100000 unless --duration is given).
    #[arg(long, conflicts_with = "duration")]
    pub messages: Option<u64>,
    /// Send for this many seconds instead of a message count.
    #[arg(long)]
    pub duration: Option<f64>,
    /// Fixed target send rate in messages per second (all producers together).
    #[arg(long)]
    pub rate: Option<f64>,
    /// Consumer group (default: a new group for this run, `shardmq-perf-e2e-<run id>`).
    #[arg(long)]
    pub group: Option<String>,
    /// After the last send, wait at most this long without a new receipt before counting the
    /// missing messages as lost.
    #[arg(long, default_value_t = 10.0)]
    pub idle_timeout: f64,
    #[command(flatten)]
    pub tuning: ConsumerTuning,
}

pub fn run(args: &E2eArgs) -> Result<()> {
    args.cluster.validate()?;
    let stop = stop_of(args.messages, args.duration)?;
    let idle = Duration::try_from_secs_f64(args.idle_timeout)
        .ok()
        .filter(|idle| !idle.is_zero())
        .context("--idle-timeout must be a positive number of seconds")?;
    args.cluster
        .runtime()?
        .block_on(end_to_end(args, stop, idle))
}

async fn end_to_end(args: &E2eArgs, stop: producers::Stop, idle: Duration) -> Result<()> {
    let run_id = new_run_id();
    let admin = cluster::admin(&args.cluster).await?;
    let queues = cluster::ensure_topic(&admin, &args.cluster).await?;
    let broker_flush = cluster::broker_flush(&admin, &args.cluster).await;
    admin.shutdown().await;
    let group = args
        .group
        .clone()
        .unwrap_or_else(|| cluster::run_group("shardmq-perf-e2e", run_id));
    let counters = Arc::new(Counters::default());
    let consumers = ConsumerGroup::start(&GroupPlan {
        namesrv: &args.cluster.namesrv,
        topic: &args.cluster.topic,
        queues: &queues,
        group: &group,
        consumers: args.consumers,
        from: ConsumeFrom::LastOffset,
        run_id: Some(run_id),
        counters: Arc::clone(&counters),
        tuning: &args.tuning,
        sql: None,
    })
    .await?;
    let ready = producers::prepare(LoadPlan {
        namesrv: args.cluster.namesrv.clone(),
        topic: args.cluster.topic.clone(),
        producers: args.producers,
        size: args.cluster.size,
        batch: args.batch,
        stop,
        rate: args.rate,
        inflight: 1,
        run_id,
        build_ahead: false,
        percent_property: false,
    })
    .await?;
    let progress = Progress::start(
        "e2e",
        Arc::clone(&counters),
        goal_of(stop, false),
        args.cluster.quiet,
    );
    let started = tokio::time::Instant::now();
    let load = ready.run(counters).await;
    let load = match load {
        Ok(load) => load,
        Err(error) => {
            progress.finish().await;
            consumers.finish().await;
            return Err(error);
        }
    };
    let end = consumers
        .wait_for(load.messages, ConsumerGroup::received_of_run, idle, None)
        .await;
    let received = consumers.finish().await;
    let samples = progress.finish().await;

    let receipts = &received.receipts;
    let messages = receipts.unique_of_run(run_id);
    let elapsed = received
        .last_received
        .map_or(load.elapsed, |last| last.duration_since(started));
    let rate_note = if args.rate.is_some() {
        ", from its intended time"
    } else {
        ""
    };
    let outcome = Outcome {
        scenario: "e2e",
        parameters: vec![
            ("topic", json!(args.cluster.topic)),
            ("size", json!(args.cluster.size)),
            ("producers", json!(args.producers)),
            ("consumers", json!(args.consumers)),
            ("batch", json!(args.batch)),
            ("rate", json!(args.rate)),
            ("group", json!(group)),
            ("broker_flush", json!(broker_flush)),
        ],
        messages,
        body_bytes: args.cluster.size,
        elapsed,
        latencies: vec![
            Latency {
                key: "",
                label: "end to end (receive - intended send time)".to_owned(),
                histogram: received.latency_ns,
            },
            Latency {
                key: "born_",
                label: "end to end (receive - born time)".to_owned(),
                histogram: received.born_latency_ns,
            },
            Latency {
                key: "send_",
                label: format!("send latency per call{rate_note}"),
                histogram: load.latency_ns,
            },
        ],
        lost: Some(receipts.lost(run_id, &load.acknowledged)),
        duplicates: Some(receipts.duplicates),
        figures: vec![
            ("sent", json!(load.messages)),
            (
                "send_msgs_per_sec",
                json!(crate::report::round(
                    load.messages as f64 / load.elapsed.as_secs_f64().max(1e-9)
                )),
            ),
            ("failed", json!(load.failed)),
            ("flush_timeouts", json!(load.flush_timeouts)),
            (
                "all_received",
                json!(end == crate::consumers::WaitEnd::Reached),
            ),
            ("run_id", json!(format!("{run_id:08x}"))),
        ]
        .into_iter()
        .chain(crate::summary::rate_figures(
            args.rate,
            load.messages,
            load.elapsed,
        ))
        .collect(),
        samples,
    };
    outcome.finish(args.cluster.json, args.cluster.report.as_deref())
}
