//! The `store` scenario: appends through the real storage engine, no network.
//!
//! One glommio executor, pinned like a broker shard, runs one `MessageStore` (default
//! configuration, in `<data-dir>/shard-0`) and `--producers` tasks. Each producer owns one queue
//! of one topic and appends its share of `--messages` in calls of `--batch` records, measuring
//! each call from the moment it is made until it completes (for `--flush sync`, that is after
//! the `fdatasync` that covers it; producers in flight together share one, which is group
//! commit). After a call a producer yields if the executor wants it to, as a network shard's
//! request loop would, so the store's flush task gets the CPU.
//!
//! Records are encoded once per producer, when the scenario starts, and copied for each call:
//! encoding is the network shard's work, and the scenario measures the storage shard's. An
//! append refused with `Busy` (too many bytes wait for the disk) is retried after
//! `BUSY_BACKOFF`; its latency counts from the first try.
//!
//! Throughput is measured from the first append until `close()` returns, so everything
//! appended is on disk when the clock stops, in both flush modes.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use hdrhistogram::Histogram;
use serde_json::{json, Map, Value};
use shardmq_store::{
    AppendOutcome, AppendStatus, BatchBytes, EncodedBatch, FlushMode, MessageStore, RecordInput,
    StoreConfig, StoreError,
};

use crate::data_dir;
use crate::executor::{self, Pinning};
use crate::report::{self, LatencySummary, Throughput};

/// Most messages one run appends.
const MAX_MESSAGES: u64 = 1_000_000_000;
/// Largest message body; a record must fit a CommitLog segment with room to spare.
const MAX_MESSAGE_BYTES: u32 = 4 << 20;
/// Most records in one append call.
const MAX_BATCH_MESSAGES: u32 = 65_536;
/// Largest append call in body bytes; well under the store's `max_unflushed_bytes`, which no
/// single call may exceed.
const MAX_BATCH_BYTES: u64 = 64 << 20;
/// Most concurrent producer tasks.
const MAX_PRODUCERS: u32 = 4_096;
/// Pause before retrying an append the store refused as `Busy`.
const BUSY_BACKOFF: Duration = Duration::from_millis(1);
/// Longest one append may keep being refused as `Busy` before the run fails.
const MAX_BUSY_WAIT: Duration = Duration::from_secs(60);

const TOPIC: &str = "PerfStoreTopic";
/// A fixed born timestamp: it is only carried, never interpreted, by the store.
const BORN_TIMESTAMP_MS: i64 = 1_700_000_000_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Flush {
    /// An append completes once buffered; the store writes in the background.
    Async,
    /// An append completes after the fdatasync that covers it.
    Sync,
}

impl Flush {
    fn name(self) -> &'static str {
        match self {
            Flush::Async => "async",
            Flush::Sync => "sync",
        }
    }

    fn mode(self) -> FlushMode {
        match self {
            Flush::Async => FlushMode::Async,
            Flush::Sync => FlushMode::Sync,
        }
    }
}

#[derive(Args, Debug, Clone)]
pub struct StoreArgs {
    /// Directory for the store's files, on the disk to measure. Created if missing; must be
    /// empty unless --force. The files are left there after the run.
    #[arg(long)]
    data_dir: PathBuf,
    /// Messages to append in total, split evenly among the producers.
    #[arg(long, default_value_t = 100_000, value_parser = clap::value_parser!(u64).range(1..=MAX_MESSAGES))]
    messages: u64,
    /// Body size of each message in bytes (the stored record adds a header of about 100 bytes).
    #[arg(long, default_value_t = 1024, value_parser = clap::value_parser!(u32).range(0..=i64::from(MAX_MESSAGE_BYTES)))]
    size: u32,
    /// When an append completes: `async` once buffered (written by the store's flush task),
    /// `sync` after the fdatasync that covers it.
    #[arg(long, value_enum, default_value_t = Flush::Async)]
    flush: Flush,
    /// Messages per append call (one encoded batch); latency is measured per call.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=i64::from(MAX_BATCH_MESSAGES)))]
    batch: u32,
    /// Concurrent producer tasks on the executor, each appending its share to its own queue.
    /// With --flush sync, appends in flight together share one fdatasync (group commit).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=i64::from(MAX_PRODUCERS)))]
    producers: u32,
    /// CPU to pin the executor to; if pinning fails the run goes on unpinned and says so.
    #[arg(long, default_value_t = 0)]
    cpu: usize,
    /// Pre-allocate CommitLog segment files this many bytes ahead of the data (the broker's
    /// `preallocate_ahead_bytes`); 0 never.
    #[arg(long, default_value_t = 64 << 20)]
    preallocate_ahead_bytes: u64,
    /// Size of the append journal (the broker's `journal_bytes`): under async flush an append
    /// completes once its bytes are in it (the page cache); 0 turns it off.
    #[arg(long, default_value_t = 64 << 20)]
    journal_bytes: u64,
    /// Run in a non-empty data directory anyway, deleting an earlier run's shard-0/ there
    /// (and nothing else).
    #[arg(long)]
    force: bool,
    /// Also print the result as one JSON object, on the last line of stdout.
    #[arg(long)]
    json: bool,
}

/// What one producer task measured.
struct ProducerStats {
    latency_ns: Histogram<u64>,
    messages: u64,
    stored_bytes: u64,
    appends: u64,
    busy_retries: u64,
    flush_timeouts: u64,
}

impl ProducerStats {
    fn new() -> Result<ProducerStats> {
        Ok(ProducerStats {
            latency_ns: report::latency_histogram()?,
            messages: 0,
            stored_bytes: 0,
            appends: 0,
            busy_retries: 0,
            flush_timeouts: 0,
        })
    }

    fn merge(&mut self, other: &ProducerStats) -> Result<()> {
        self.latency_ns
            .add(&other.latency_ns)
            .context("cannot merge latency histograms")?;
        self.messages += other.messages;
        self.stored_bytes += other.stored_bytes;
        self.appends += other.appends;
        self.busy_retries += other.busy_retries;
        self.flush_timeouts += other.flush_timeouts;
        Ok(())
    }
}

/// What one producer appends.
#[derive(Debug, Clone, Copy)]
struct ProducerPlan {
    queue_id: u32,
    messages: u64,
    batch: u32,
    body_bytes: u32,
}

/// The whole run's result.
struct StoreResult {
    pinning: Pinning,
    stats: ProducerStats,
    appended_after: Duration,
    throughput: Throughput,
    lag: LagStats,
}

/// How far the CommitLog's written offset trailed its append point, and its synced offset its
/// written offset, sampled every [`LAG_SAMPLE_INTERVAL`] while the producers ran.
#[derive(Debug, Default, Clone, Copy)]
struct LagStats {
    samples: u64,
    unwritten_sum: u64,
    unwritten_max: u64,
    unsynced_sum: u64,
    unsynced_max: u64,
}

impl LagStats {
    fn add(&mut self, unwritten: u64, unsynced: u64) {
        self.samples += 1;
        self.unwritten_sum += unwritten;
        self.unwritten_max = self.unwritten_max.max(unwritten);
        self.unsynced_sum += unsynced;
        self.unsynced_max = self.unsynced_max.max(unsynced);
    }

    fn mean(sum: u64, samples: u64) -> u64 {
        sum.checked_div(samples).unwrap_or(0)
    }
}

/// How often the lag sampler looks at the CommitLog's offsets.
const LAG_SAMPLE_INTERVAL: Duration = Duration::from_millis(2);

pub fn run(args: &StoreArgs) -> Result<()> {
    let batch_bytes = u64::from(args.batch) * u64::from(args.size);
    if batch_bytes > MAX_BATCH_BYTES {
        bail!(
            "an append call of {} messages of {} bytes is {batch_bytes} bytes, over the \
             largest this scenario makes ({MAX_BATCH_BYTES} bytes); lower --batch or --size",
            args.batch,
            args.size
        );
    }
    let shard_dir = data_dir::prepare(&args.data_dir, args.force)?;
    let mut config = StoreConfig::new(shard_dir);
    config.flush_mode = args.flush.mode();
    config.preallocate_ahead_bytes = args.preallocate_ahead_bytes;
    config.journal_bytes = args.journal_bytes;
    let plans = plan_producers(args);
    let result = executor::run_pinned("perf-store", args.cpu, |pinning| {
        measure(config, plans, pinning)
    })??;
    print_result(args, &result);
    Ok(())
}

/// Splits the messages evenly; the first `messages % producers` producers take one more.
fn plan_producers(args: &StoreArgs) -> Vec<ProducerPlan> {
    let producers = u64::from(args.producers);
    (0..args.producers)
        .map(|queue_id| ProducerPlan {
            queue_id,
            messages: args.messages / producers
                + u64::from(u64::from(queue_id) < args.messages % producers),
            batch: args.batch,
            body_bytes: args.size,
        })
        .collect()
}

async fn measure(
    config: StoreConfig,
    plans: Vec<ProducerPlan>,
    pinning: Pinning,
) -> Result<StoreResult> {
    let shard_dir = config.shard_dir.clone();
    let (store, _recovery) = MessageStore::open(config)
        .await
        .with_context(|| format!("cannot open the store in {}", shard_dir.display()))?;
    let started = Instant::now();
    let tasks: Vec<_> = plans
        .into_iter()
        .map(|plan| glommio::spawn_local(produce(store.clone(), plan)))
        .collect();
    let is_running = std::rc::Rc::new(std::cell::Cell::new(true));
    let sampler = {
        let store = store.clone();
        let is_running = is_running.clone();
        glommio::spawn_local(async move {
            let mut lag = LagStats::default();
            while is_running.get() {
                let (_, appended, synced) = store.commitlog_offsets();
                let written = store.commitlog_written_offset();
                lag.add(appended - written, written - synced);
                glommio::timer::sleep(LAG_SAMPLE_INTERVAL).await;
            }
            lag
        })
    };
    let mut stats = ProducerStats::new()?;
    for task in tasks {
        stats.merge(&task.await?)?;
    }
    let appended_after = started.elapsed();
    is_running.set(false);
    let lag = sampler.await;
    store.close().await.context("cannot close the store")?;
    let elapsed = started.elapsed();
    let throughput = Throughput {
        messages: stats.messages,
        payload_bytes: 0,
        stored_bytes: stats.stored_bytes,
        elapsed,
    };
    Ok(StoreResult {
        pinning,
        stats,
        appended_after,
        throughput,
        lag,
    })
}

async fn produce(store: MessageStore, plan: ProducerPlan) -> Result<ProducerStats> {
    let mut stats = ProducerStats::new()?;
    let body = body_of(plan.body_bytes);
    let full_batch = encode_batch(plan.queue_id, plan.batch, &body)?;
    let last_batch_len = (plan.messages % u64::from(plan.batch)) as u32;
    let last_batch = encode_batch(plan.queue_id, last_batch_len, &body)?;
    let mut remaining = plan.messages;
    while remaining > 0 {
        let template = if remaining >= u64::from(plan.batch) {
            &full_batch
        } else {
            &last_batch
        };
        let started = Instant::now();
        let outcome = append_until_accepted(&store, template, &mut stats).await?;
        report::record_latency(&mut stats.latency_ns, started.elapsed());
        stats.appends += 1;
        stats.messages += outcome.records.len() as u64;
        stats.stored_bytes += outcome
            .records
            .iter()
            .map(|record| u64::from(record.size))
            .sum::<u64>();
        if outcome.status == AppendStatus::FlushDiskTimeout {
            stats.flush_timeouts += 1;
        }
        remaining -= template.len() as u64;
        glommio::yield_if_needed().await;
    }
    Ok(stats)
}

/// Appends a copy of `template`, retrying while the store answers `Busy`.
async fn append_until_accepted(
    store: &MessageStore,
    template: &EncodedBatch,
    stats: &mut ProducerStats,
) -> Result<AppendOutcome> {
    let first_try = Instant::now();
    loop {
        match store.append(copy_batch(template)).await {
            Ok(outcome) => return Ok(outcome),
            Err(StoreError::Busy { .. }) if first_try.elapsed() < MAX_BUSY_WAIT => {
                stats.busy_retries += 1;
                glommio::timer::sleep(BUSY_BACKOFF).await;
            }
            Err(error) => return Err(error).context("append failed"),
        }
    }
}

/// A message body of `len` bytes: printable, and not one repeated byte.
fn body_of(len: u32) -> Vec<u8> {
    (0..len).map(|i| b'a' + (i % 26) as u8).collect()
}

fn encode_batch(queue_id: u32, messages: u32, body: &[u8]) -> Result<EncodedBatch> {
    let born_host: SocketAddr = ([127, 0, 0, 1], 40_000).into();
    let store_host: SocketAddr = ([127, 0, 0, 1], 10_911).into();
    let mut batch = EncodedBatch::new();
    for _ in 0..messages {
        batch
            .push(&RecordInput {
                topic: TOPIC,
                queue_id,
                flag: 0,
                body,
                properties: &[],
                sys_flag: 0,
                born_timestamp_ms: BORN_TIMESTAMP_MS,
                born_host,
                store_host,
                reconsume_times: 0,
                prepared_transaction_offset: 0,
            })
            .context("cannot encode a benchmark record")?;
    }
    // Shared from here on, as a producer's run is shared with the frame it arrived in.
    batch.bytes = BatchBytes::Shared(std::mem::take(batch.bytes.to_mut()).freeze());
    Ok(batch)
}

/// What a network shard would hand the storage shard: the encoded bytes (shared, as a
/// producer's run is shared with its frame) and what the storage shard needs to store them.
fn copy_batch(template: &EncodedBatch) -> EncodedBatch {
    EncodedBatch {
        bytes: shared_bytes(template),
        records: template.records.clone(),
        topics: template.topics.clone(),
        index_hashes: template.index_hashes.clone(),
        store_host: None,
    }
}

fn shared_bytes(template: &EncodedBatch) -> BatchBytes {
    template.bytes.clone()
}

fn print_result(args: &StoreArgs, result: &StoreResult) {
    let throughput = Throughput {
        payload_bytes: result.stats.messages * u64::from(args.size),
        ..result.throughput
    };
    let latency = LatencySummary::of(&result.stats.latency_ns);
    let placement = match result.pinning.cpu() {
        Some(cpu) => format!("executor pinned to CPU {cpu}"),
        None => "executor NOT pinned".to_owned(),
    };
    println!(
        "store: {} messages of {} B, flush {}, batch {}, {} producer(s), {placement}",
        args.messages,
        args.size,
        args.flush.name(),
        args.batch,
        args.producers
    );
    println!("throughput: {}", throughput.to_human());
    println!(
        "append latency (µs per call of up to {} message(s)): {}",
        args.batch,
        latency.to_human()
    );
    println!(
        "all appended after {:.3} s, all durable after {:.3} s; busy retries {}, flush timeouts {}",
        result.appended_after.as_secs_f64(),
        throughput.elapsed.as_secs_f64(),
        result.stats.busy_retries,
        result.stats.flush_timeouts
    );
    let lag = &result.lag;
    println!(
        "CommitLog lag ({} samples): appended but not yet written mean {} B, max {} B; written but not yet synced mean {} B, max {} B",
        lag.samples,
        LagStats::mean(lag.unwritten_sum, lag.samples),
        lag.unwritten_max,
        LagStats::mean(lag.unsynced_sum, lag.samples),
        lag.unsynced_max
    );
    if args.json {
        let mut object = Map::new();
        object.insert("scenario".into(), json!("store"));
        object.insert(
            "unwritten_mean_bytes".into(),
            json!(LagStats::mean(lag.unwritten_sum, lag.samples)),
        );
        object.insert("unwritten_max_bytes".into(), json!(lag.unwritten_max));
        object.insert(
            "unsynced_mean_bytes".into(),
            json!(LagStats::mean(lag.unsynced_sum, lag.samples)),
        );
        object.insert("unsynced_max_bytes".into(), json!(lag.unsynced_max));
        object.insert("messages".into(), json!(result.stats.messages));
        object.insert("size".into(), json!(args.size));
        object.insert("flush".into(), json!(args.flush.name()));
        object.insert("batch".into(), json!(args.batch));
        object.insert("producers".into(), json!(args.producers));
        object.insert("cpu".into(), json!(result.pinning.cpu()));
        object.insert("appends".into(), json!(result.stats.appends));
        object.insert("busy_retries".into(), json!(result.stats.busy_retries));
        object.insert("flush_timeouts".into(), json!(result.stats.flush_timeouts));
        object.insert(
            "appended_after_s".into(),
            json!(result.appended_after.as_secs_f64()),
        );
        throughput.add_json(&mut object);
        latency.add_json(&mut object);
        println!("{}", Value::Object(object));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Wrapper {
        #[command(flatten)]
        args: StoreArgs,
    }

    fn args(extra: &[&str]) -> StoreArgs {
        let mut argv = vec!["test", "--data-dir", "/nonexistent"];
        argv.extend_from_slice(extra);
        Wrapper::parse_from(argv).args
    }

    #[test]
    fn producers_split_every_message() {
        let plans = plan_producers(&args(&["--messages", "10", "--producers", "4"]));
        let shares: Vec<u64> = plans.iter().map(|p| p.messages).collect();
        assert_eq!(shares, [3, 3, 2, 2]);
        let queues: Vec<u32> = plans.iter().map(|p| p.queue_id).collect();
        assert_eq!(queues, [0, 1, 2, 3]);
    }

    #[test]
    fn copies_are_independent_of_the_template() {
        let template = encode_batch(0, 3, b"body").unwrap();
        let mut copy = copy_batch(&template);
        assert_eq!(&copy.bytes[..], &template.bytes[..]);
        assert_eq!(copy.records, template.records);
        copy.bytes.to_mut()[0] ^= 0xFF;
        assert_ne!(&copy.bytes[..], &template.bytes[..]);
    }
}
