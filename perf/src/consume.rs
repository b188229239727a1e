//! The `consume` scenario: C push consumers in a new group drain a topic's backlog
//! (`--from first`) or tail it (`--from last`), measuring how fast messages arrive at the
//! listener.
//!
//! `--backlog N` first places the group at the topic's end, then fills the topic with N
//! benchmark messages (not timed), so the drain is of exactly those and is checked: every
//! acknowledged message must arrive exactly once. Without it the scenario
//! drains (or tails) whatever the topic holds; duplicates are still counted from the headers,
//! lost cannot be (`null`). A drain ends when as many distinct messages have arrived as the
//! topic held when it started; a tail at `--messages` or `--duration`; both end early when
//! nothing arrives for `--idle-timeout` seconds.
//!
//! The clock starts before the first consumer starts, so group start-up (joining, sharing the
//! queues) counts, and stops at the last message received. Latency here is a message's age
//! when the listener sees it (receive time − born time): for a backlog that is mostly how long
//! it waited, for a tail it is the end-to-end latency of another process's producer.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use serde_json::json;
use shardmq_client::{ConsumeFrom, PullConsumer, ResetTarget};
use tokio::time::Instant;

use crate::body::new_run_id;
use crate::cluster::{self, ClusterArgs};
use crate::consumers::{ConsumerGroup, ConsumerTuning, GroupPlan, WaitEnd};
use crate::producers::{self, LoadPlan, Stop};
use crate::progress::{Counters, Goal, Progress};
use crate::summary::{Latency, Outcome};
use crate::tracker::SequenceSet;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum StartFrom {
    /// From the oldest stored message: drain the backlog.
    First,
    /// Only messages sent from now on: tail the topic.
    Last,
}

#[derive(Args, Debug, Clone)]
pub struct ConsumeArgs {
    #[command(flatten)]
    pub cluster: ClusterArgs,
    /// Consumers in the group (each its own client; the queues are shared among them).
    #[arg(long, default_value_t = 1)]
    pub consumers: u32,
    /// Consumer group (default: a new group for this run, `shardmq-perf-consume-<run id>`).
    #[arg(long)]
    pub group: Option<String>,
    /// Where a new group starts: `first` drains the backlog, `last` tails.
    #[arg(long, value_enum, default_value_t = StartFrom::First)]
    pub from: StartFrom,
    /// First send this many benchmark messages (not timed), then drain and check them.
    #[arg(long)]
    pub backlog: Option<u64>,
    /// Producers filling --backlog.
    #[arg(long, default_value_t = 4)]
    pub fill_producers: u32,
    /// Messages per send call when filling --backlog.
    #[arg(long, default_value_t = 32)]
    pub fill_batch: u32,
    /// Stop after this many distinct messages (default for a drain: what the topic holds).
    #[arg(long, conflicts_with = "duration")]
    pub messages: Option<u64>,
    /// Stop after this many seconds.
    #[arg(long)]
    pub duration: Option<f64>,
    /// Stop when nothing new arrives for this many seconds.
    #[arg(long, default_value_t = 10.0)]
    pub idle_timeout: f64,
    /// Drain through a SQL92 filter that matches this share of the backlog: the fill gives
    /// message n the property `perf_pct` = n mod 100 and the group subscribes with
    /// `perf_pct < P` (the broker needs --enable-property-filter). Needs --backlog.
    #[arg(long, value_name = "P", requires = "backlog",
          value_parser = clap::value_parser!(u64).range(0..=100))]
    pub match_percent: Option<u64>,
    #[command(flatten)]
    pub tuning: ConsumerTuning,
}

pub fn run(args: &ConsumeArgs) -> Result<()> {
    args.cluster.validate()?;
    if args.from == StartFrom::Last && args.messages.is_none() && args.duration.is_none() {
        bail!("tailing (--from last) needs --messages or --duration");
    }
    if args.from == StartFrom::Last && args.backlog.is_some() {
        bail!("--backlog fills the topic before consuming; it needs --from first");
    }
    args.cluster.runtime()?.block_on(consume(args))
}

fn seconds(value: f64, name: &str) -> Result<Duration> {
    Duration::try_from_secs_f64(value)
        .ok()
        .filter(|duration| !duration.is_zero())
        .with_context(|| format!("{name} must be a positive number of seconds"))
}

async fn consume(args: &ConsumeArgs) -> Result<()> {
    let run_id = new_run_id();
    let idle = seconds(args.idle_timeout, "--idle-timeout")?;
    let duration = args
        .duration
        .map(|value| seconds(value, "--duration"))
        .transpose()?;
    let group = args
        .group
        .clone()
        .unwrap_or_else(|| cluster::run_group("shardmq-perf-consume", run_id));
    let admin = cluster::admin(&args.cluster).await?;
    let queues = cluster::ensure_topic(&admin, &args.cluster).await?;
    let broker_flush = cluster::broker_flush(&admin, &args.cluster).await;
    if args.backlog.is_some() {
        // The drain is of this run's backlog alone: the group starts where the topic ends now,
        // not at whatever earlier runs left in it.
        let placed = admin
            .reset_offset(&group, &args.cluster.topic, ResetTarget::Last, true)
            .await
            .with_context(|| format!("cannot place group {group} at the topic's end"));
        if let Err(error) = placed {
            admin.shutdown().await;
            return Err(error);
        }
    }
    admin.shutdown().await;

    let acknowledged = match args.backlog {
        Some(backlog) => Some(fill(args, run_id, backlog).await?),
        None => None,
    };
    // Through a filter, only the matching share of the backlog is expected.
    let filter = args
        .match_percent
        .map(|percent| format!("{} < {percent}", crate::producers::PERCENT_PROPERTY));
    let acknowledged = match (acknowledged, args.match_percent) {
        (Some(acked), Some(percent)) => Some(
            acked
                .iter()
                .map(|set| set.filtered(|sequence| sequence % 100 < percent))
                .collect(),
        ),
        (acked, _) => acked,
    };
    let target = match (args.messages, args.from, &acknowledged) {
        (Some(messages), _, _) => messages,
        (None, StartFrom::First, Some(acked)) => acked.iter().map(SequenceSet::len).sum(),
        (None, StartFrom::First, None) => stored_messages(args, run_id, &queues).await?,
        (None, StartFrom::Last, _) => u64::MAX,
    };
    if target == 0 {
        bail!(
            "topic {} is empty: nothing to drain (fill it with --backlog N or `shardmq-perf produce`)",
            args.cluster.topic
        );
    }
    let counters = Arc::new(Counters::default());
    let goal = match duration {
        Some(duration) => Goal::Duration(duration),
        None => Goal::Messages {
            total: target,
            counts_received: true,
        },
    };
    let progress = Progress::start("consume", Arc::clone(&counters), goal, args.cluster.quiet);
    let started = Instant::now();
    let consumers = ConsumerGroup::start(&GroupPlan {
        namesrv: &args.cluster.namesrv,
        topic: &args.cluster.topic,
        queues: &queues,
        group: &group,
        consumers: args.consumers,
        from: match args.from {
            StartFrom::First => ConsumeFrom::FirstOffset,
            StartFrom::Last => ConsumeFrom::LastOffset,
        },
        run_id: Some(run_id),
        counters,
        tuning: &args.tuning,
        sql: filter.as_deref(),
    })
    .await;
    let consumers = match consumers {
        Ok(consumers) => consumers,
        Err(error) => {
            progress.finish().await;
            return Err(error);
        }
    };
    let end = consumers
        .wait_for(
            target,
            ConsumerGroup::received_distinct,
            idle,
            duration.map(|duration| started + duration),
        )
        .await;
    let received = consumers.finish().await;
    let samples = progress.finish().await;

    let receipts = &received.receipts;
    let messages = receipts.unique + receipts.foreign;
    let elapsed = received
        .last_received
        .map_or_else(|| started.elapsed(), |last| last.duration_since(started));
    let lost = acknowledged.map(|acked| receipts.lost(run_id, &acked));
    let outcome = Outcome {
        scenario: "consume",
        parameters: vec![
            ("topic", json!(args.cluster.topic)),
            ("size", json!(args.cluster.size)),
            ("consumers", json!(args.consumers)),
            ("from", json!(format!("{:?}", args.from).to_lowercase())),
            ("backlog", json!(args.backlog)),
            ("group", json!(group)),
            ("broker_flush", json!(broker_flush)),
            ("filter", json!(filter)),
        ],
        messages,
        body_bytes: args.cluster.size,
        elapsed,
        latencies: vec![Latency {
            key: "",
            label: "age at receipt (receive time - born time)".to_owned(),
            histogram: received.born_latency_ns,
        }],
        lost,
        duplicates: Some(receipts.duplicates),
        figures: vec![
            ("target", json!((target != u64::MAX).then_some(target))),
            ("ended", json!(end_name(end))),
            ("without_header", json!(receipts.foreign)),
            ("run_id", json!(format!("{run_id:08x}"))),
        ],
        samples,
    };
    outcome.finish(args.cluster.json, args.cluster.report.as_deref())
}

fn end_name(end: WaitEnd) -> &'static str {
    match end {
        WaitEnd::Reached => "reached target",
        WaitEnd::Idle => "idle timeout",
        WaitEnd::Deadline => "duration",
    }
}

/// Sends `backlog` benchmark messages of run `run_id`; returns the acknowledged sequences.
async fn fill(
    args: &ConsumeArgs,
    run_id: u32,
    backlog: u64,
) -> Result<Vec<crate::tracker::SequenceSet>> {
    let plan = LoadPlan {
        namesrv: args.cluster.namesrv.clone(),
        topic: args.cluster.topic.clone(),
        producers: args.fill_producers,
        size: args.cluster.size,
        batch: args.fill_batch,
        stop: Stop::Messages(backlog),
        rate: None,
        inflight: 1,
        run_id,
        build_ahead: true,
        percent_property: args.match_percent.is_some(),
    };
    let ready = producers::prepare(plan).await?;
    let counters = Arc::new(Counters::default());
    let progress = Progress::start(
        "fill",
        Arc::clone(&counters),
        Goal::Messages {
            total: backlog,
            counts_received: false,
        },
        args.cluster.quiet,
    );
    let load = ready.run(counters).await;
    progress.finish().await;
    let load = load?;
    if load.failed > 0 {
        eprintln!(
            "fill: {} of {backlog} messages were not acknowledged; they are not expected",
            load.failed
        );
    }
    Ok(load.acknowledged)
}

/// Messages the topic holds now (sum over its queues of end − start offsets).
async fn stored_messages(
    args: &ConsumeArgs,
    run_id: u32,
    queues: &[shardmq_client::MessageQueue],
) -> Result<u64> {
    let consumer = PullConsumer::builder()
        .namesrv(&args.cluster.namesrv)
        .group(cluster::run_group("shardmq-perf-count", run_id))
        .build()
        .await
        .context("cannot start a client to count the backlog")?;
    let mut total = 0u64;
    for queue in queues {
        let (min_offset, max_offset) = consumer
            .queue_offsets(queue)
            .await
            .with_context(|| format!("cannot read the offsets of {queue}"))?;
        total += u64::try_from(max_offset - min_offset).unwrap_or(0);
    }
    consumer.shutdown().await;
    Ok(total)
}
