//! The `produce` scenario: P producers send to a topic through the client crate, measuring
//! throughput and send latency (see `producers.rs` for pacing and what a latency spans).
//!
//! With `--verify`, every queue is read back afterwards from where it ended before the run,
//! and each acknowledged message must be there exactly once (lost and duplicates are then
//! reported; without it they are `null`). The read-back is not timed.
//!
//! `client_cpu_us_per_msg` is the CPU time (user + system, all threads, `getrusage`) this
//! process spent over the timed part, per acknowledged message: the client crate's encoding and
//! sending (the kernel's TCP send included, and on loopback the kernel's delivery to the
//! broker's socket, which runs in the sender's context), plus the harness building the
//! messages and its progress line. `client_user_cpu_us_per_msg` and `client_sys_cpu_us_per_msg`
//! split it; `build_cpu_us_per_msg` is the harness's share, building the messages (bodies with
//! the benchmark header, `Message::new`), measured on the producer threads.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Args;
use serde_json::json;
use shardmq_client::{MessageQueue, PullConsumer, PullStatus};

use crate::body::{new_run_id, Header};
use crate::cluster::{self, ClusterArgs};
use crate::producers::{self, LoadPlan, Stop};
use crate::progress::{Counters, Goal, Progress};
use crate::summary::{Latency, Outcome};
use crate::tracker::Receipts;

/// Messages one read-back pull asks for.
const READ_BACK_BATCH: u32 = 256;

#[derive(Args, Debug, Clone)]
pub struct ProduceArgs {
    #[command(flatten)]
    pub cluster: ClusterArgs,
    /// Producers (each its own client and connection).
    #[arg(long, default_value_t = 1)]
    pub producers: u32,
    /// Sends each producer keeps in flight (`send_async`/`send_batch_async`, answers awaited
    /// in call order); 1 waits for each answer before the next call.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub inflight: u32,
    /// Messages per send call (a batch is stored in one queue, all or nothing).
    #[arg(long, default_value_t = 1)]
    pub batch: u32,
    /// Messages to send in total (default 100000 unless --duration is given).
    #[arg(long, conflicts_with = "duration")]
    pub messages: Option<u64>,
    /// Send for this many seconds instead of a message count.
    #[arg(long)]
    pub duration: Option<f64>,
    /// Fixed target rate in messages per second (all producers together); latency is then
    /// measured from each call's intended send time.
    #[arg(long)]
    pub rate: Option<f64>,
    /// Read the topic back afterwards and count lost and duplicate messages.
    #[arg(long)]
    pub verify: bool,
}

/// `--messages` / `--duration` as a stop condition (100,000 messages when neither is given).
pub fn stop_of(messages: Option<u64>, duration: Option<f64>) -> Result<Stop> {
    match (messages, duration) {
        (_, Some(seconds)) => {
            let duration = Duration::try_from_secs_f64(seconds)
                .ok()
                .filter(|duration| !duration.is_zero())
                .context("--duration must be a positive number of seconds")?;
            Ok(Stop::After(duration))
        }
        (Some(messages), None) => Ok(Stop::Messages(messages)),
        (None, None) => Ok(Stop::Messages(100_000)),
    }
}

/// The progress line's goal for a stop condition.
pub fn goal_of(stop: Stop, counts_received: bool) -> Goal {
    match stop {
        Stop::Messages(total) => Goal::Messages {
            total,
            counts_received,
        },
        Stop::After(duration) => Goal::Duration(duration),
    }
}

pub fn run(args: &ProduceArgs) -> Result<()> {
    args.cluster.validate()?;
    let stop = stop_of(args.messages, args.duration)?;
    args.cluster.runtime()?.block_on(produce(args, stop))
}

async fn produce(args: &ProduceArgs, stop: Stop) -> Result<()> {
    let run_id = new_run_id();
    let admin = cluster::admin(&args.cluster).await?;
    let queues = cluster::ensure_topic(&admin, &args.cluster).await?;
    let broker_flush = cluster::broker_flush(&admin, &args.cluster).await;
    admin.shutdown().await;
    let reader = if args.verify {
        let consumer = PullConsumer::builder()
            .namesrv(&args.cluster.namesrv)
            .group(cluster::run_group("shardmq-perf-verify", run_id))
            .build()
            .await
            .context("cannot start the read-back consumer")?;
        let starts = cluster::end_offsets(&consumer, &queues).await?;
        Some((consumer, starts))
    } else {
        None
    };
    let plan = LoadPlan {
        namesrv: args.cluster.namesrv.clone(),
        topic: args.cluster.topic.clone(),
        producers: args.producers,
        size: args.cluster.size,
        batch: args.batch,
        stop,
        rate: args.rate,
        inflight: args.inflight,
        run_id,
        build_ahead: true,
        percent_property: false,
    };
    let ready = producers::prepare(plan).await?;
    let counters = Arc::new(Counters::default());
    let progress = Progress::start(
        "produce",
        Arc::clone(&counters),
        goal_of(stop, false),
        args.cluster.quiet,
    );
    let load = ready.run(counters).await;
    let samples = progress.finish().await;
    let load = load?;

    let (lost, duplicates) = match reader {
        Some((consumer, starts)) => {
            let receipts = read_back(&consumer, &starts, run_id).await?;
            consumer.shutdown().await;
            (
                Some(receipts.lost(run_id, &load.acknowledged)),
                Some(receipts.duplicates),
            )
        }
        None => (None, None),
    };
    let mut latency_label = if args.rate.is_some() {
        "send latency per call, from its intended time".to_owned()
    } else {
        "send latency per call".to_owned()
    };
    if args.inflight > 1 {
        latency_label.push_str(&format!(
            " ({} in flight, answers awaited in call order)",
            args.inflight
        ));
    }
    let outcome = Outcome {
        scenario: "produce",
        parameters: vec![
            ("topic", json!(args.cluster.topic)),
            ("size", json!(args.cluster.size)),
            ("producers", json!(args.producers)),
            ("batch", json!(args.batch)),
            ("inflight", json!(args.inflight)),
            ("rate", json!(args.rate)),
            ("broker_flush", json!(broker_flush)),
        ],
        messages: load.messages,
        body_bytes: args.cluster.size,
        elapsed: load.elapsed,
        latencies: vec![Latency {
            key: "",
            label: latency_label,
            histogram: load.latency_ns,
        }],
        lost,
        duplicates,
        figures: [
            vec![
                ("calls", json!(load.calls)),
                ("failed", json!(load.failed)),
                ("flush_timeouts", json!(load.flush_timeouts)),
                ("run_id", json!(format!("{run_id:08x}"))),
                (
                    "client_cpu_us_per_msg",
                    json!(cpu_us_per_message(load.cpu.total(), load.messages)),
                ),
                (
                    "client_user_cpu_us_per_msg",
                    json!(cpu_us_per_message(load.cpu.user, load.messages)),
                ),
                (
                    "client_sys_cpu_us_per_msg",
                    json!(cpu_us_per_message(load.cpu.system, load.messages)),
                ),
                (
                    "build_cpu_us_per_msg",
                    json!(cpu_us_per_message(load.build_cpu, load.messages)),
                ),
            ],
            crate::summary::rate_figures(args.rate, load.messages, load.elapsed),
        ]
        .concat(),
        samples,
    };
    outcome.finish(args.cluster.json, args.cluster.report.as_deref())
}

/// The client process's CPU time per acknowledged message, in µs (`null` when none was).
fn cpu_us_per_message(cpu: Duration, messages: u64) -> Option<f64> {
    (messages > 0).then(|| crate::report::round(cpu.as_secs_f64() * 1e6 / messages as f64))
}

/// Every benchmark message of `run_id` in each queue from its start offset to its end now.
async fn read_back(
    consumer: &PullConsumer,
    starts: &[(MessageQueue, i64)],
    run_id: u32,
) -> Result<Receipts> {
    let mut receipts = Receipts::default();
    for (queue, start) in starts {
        let (_, end) = consumer
            .queue_offsets(queue)
            .await
            .with_context(|| format!("cannot read the offsets of {queue}"))?;
        let mut offset = *start;
        while offset < end {
            let result = consumer
                .pull(queue, offset, READ_BACK_BATCH)
                .await
                .with_context(|| format!("cannot read back {queue} at offset {offset}"))?;
            if result.status != PullStatus::Found || result.next_begin_offset <= offset {
                anyhow::bail!(
                    "reading back {queue}: pull at offset {offset} (end {end}) answered {} \
                     with next offset {}",
                    result.status.as_str(),
                    result.next_begin_offset
                );
            }
            for message in &result.messages {
                match Header::parse(&message.body) {
                    Some(header) if header.run_id == run_id => {
                        receipts.record((header.run_id, header.producer), header.sequence);
                    }
                    _ => receipts.foreign += 1,
                }
            }
            offset = result.next_begin_offset;
        }
    }
    Ok(receipts)
}
