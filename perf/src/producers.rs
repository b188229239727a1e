//! The load generator: P producers, each its own `shardmq_client::Producer` (own client
//! instance and connection, as P separate applications would have), each with one send in
//! flight at a time, as RocketMQ's benchmark producer threads do, or `--inflight N` of them
//! (`send_async`, RocketMQ's asynchronous send).
//!
//! Owns pacing and send-latency measurement. Without `--rate` a producer sends its next call
//! as soon as the previous one is answered (with `--inflight N`, as soon as fewer than N are
//! in flight), and a call's latency runs from the moment it is made until its answer (with
//! `--inflight N`, until the answer is awaited: answers are awaited in call order). With `--rate R` each producer follows a fixed schedule of `R / P`
//! messages per second and a call's latency runs from its *intended* send time on that
//! schedule: when the broker (or the harness) falls behind, the wait for the late call counts,
//! so queueing is not hidden (no coordinated omission, as in wrk2). The schedule uses tokio's
//! timer, whose resolution is 1 ms: a call may start up to about a millisecond after its
//! intended time, and that lateness is part of the rate-mode latency too.
//!
//! Every message carries a benchmark header (`body.rs`); acknowledged sequences are kept per
//! producer so that consumers can count what was lost. Data leaves as a [`LoadResult`].

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use bytes::BytesMut;
use hdrhistogram::Histogram;
use shardmq_client::{
    BatchSendResult, Message, Producer, SendFuture, SendResult, SendStatus, MAX_BATCH_MESSAGES,
};
use tokio::time::Instant;
use tracing::warn;

use crate::body::{self, wall_clock_ns, Header};
use crate::progress::Counters;
use crate::report;
use crate::tracker::SequenceSet;

/// Most producers one run starts.
pub const MAX_PRODUCERS: u32 = 1_024;
/// Most messages one run sends (the delivery bitmaps cost one bit each).
pub const MAX_MESSAGES: u64 = 1_000_000_000;
/// How long a producer keeps trying while every call fails before it gives up (the broker is
/// gone); a failover takes seconds.
const GIVE_UP_AFTER: std::time::Duration = std::time::Duration::from_secs(30);
/// Pause after a failed call, so that a producer does not spin on a broker that is down.
const FAILED_CALL_PAUSE: std::time::Duration = std::time::Duration::from_millis(20);
/// Failed sends logged per producer; the rest are only counted.
const MAX_LOGGED_FAILURES: u64 = 5;
/// The producer group benchmark producers send as.
const PRODUCER_GROUP: &str = "shardmq-perf-producer";

/// When the producers stop.
#[derive(Debug, Clone, Copy)]
pub enum Stop {
    /// After this many messages in total, split evenly among the producers.
    Messages(u64),
    /// When this much time has passed since the start (no call starts after it).
    After(Duration),
}

/// What to send.
#[derive(Debug, Clone)]
pub struct LoadPlan {
    pub namesrv: String,
    pub topic: String,
    pub producers: u32,
    pub size: usize,
    pub batch: u32,
    pub stop: Stop,
    /// Messages per second, all producers together; `None` sends as fast as answers come.
    pub rate: Option<f64>,
    /// Calls each producer keeps in flight (1: each waits for its answer).
    pub inflight: u32,
    pub run_id: u32,
    /// With one call in flight, build the next call's messages while the current one is
    /// answered (`produce`; not `e2e`, whose latency counts from when a message is built).
    pub build_ahead: bool,
    /// Give every message the property [`PERCENT_PROPERTY`] = its sequence mod 100, for
    /// SQL92 filters that match a known share (`consume --match-percent`).
    pub percent_property: bool,
}

/// The property `percent_property` sets: a message's sequence mod 100.
pub const PERCENT_PROPERTY: &str = "perf_pct";

impl LoadPlan {
    /// Checks the plan's limits.
    pub fn validate(&self) -> Result<()> {
        if self.producers == 0 || self.producers > MAX_PRODUCERS {
            bail!("--producers must be 1..={MAX_PRODUCERS}");
        }
        if self.batch == 0 || self.batch as usize > MAX_BATCH_MESSAGES {
            bail!("--batch must be 1..={MAX_BATCH_MESSAGES}");
        }
        if self.inflight == 0 {
            bail!("--inflight must be at least 1");
        }
        if let Some(rate) = self.rate {
            if !(rate.is_finite() && rate > 0.0) {
                bail!("--rate must be a positive number of messages per second");
            }
        }
        match self.stop {
            Stop::Messages(0) => bail!("--messages must be at least 1"),
            Stop::Messages(messages) if messages > MAX_MESSAGES => {
                bail!("--messages must be at most {MAX_MESSAGES}")
            }
            Stop::After(duration) if duration.is_zero() => bail!("--duration must be positive"),
            _ => Ok(()),
        }
    }
}

/// Producers started and ready to send (routes fetched), so that start-up is not measured.
pub struct ReadyProducers {
    plan: LoadPlan,
    producers: Vec<Producer>,
}

/// What the producers measured.
pub struct LoadResult {
    /// Per call (of `batch` messages): from the call (or its intended time under `--rate`)
    /// until its answer.
    pub latency_ns: Histogram<u64>,
    /// Messages acknowledged.
    pub messages: u64,
    pub calls: u64,
    /// Messages in calls that failed (not acknowledged; they may or may not be stored).
    pub failed: u64,
    /// Messages stored but answered with a flush or replication timeout.
    pub flush_timeouts: u64,
    /// Acknowledged sequences, by producer index.
    pub acknowledged: Vec<SequenceSet>,
    /// From the first call until the last answer.
    pub elapsed: Duration,
    /// CPU time the whole process used over `elapsed`.
    pub cpu: crate::cpu::CpuTime,
    /// Of it, the CPU time the producers spent building the messages they sent (the
    /// harness's share, not the client's).
    pub build_cpu: Duration,
}

/// Starts the producers of `plan` and fetches the topic's route in each.
pub async fn prepare(plan: LoadPlan) -> Result<ReadyProducers> {
    plan.validate()?;
    let mut producers = Vec::with_capacity(plan.producers as usize);
    for _ in 0..plan.producers {
        let producer = Producer::builder()
            .namesrv(&plan.namesrv)
            .group(PRODUCER_GROUP)
            .max_sends_in_flight(plan.inflight as usize)
            .build()
            .await
            .context("cannot start a producer")?;
        producer
            .write_queues(&plan.topic)
            .await
            .with_context(|| format!("no route to topic {}", plan.topic))?;
        producers.push(producer);
    }
    Ok(ReadyProducers { plan, producers })
}

impl ReadyProducers {
    /// Runs every producer to the plan's end and merges what they measured. `counters.sent`
    /// grows as messages are acknowledged.
    pub async fn run(self, counters: Arc<Counters>) -> Result<LoadResult> {
        let ReadyProducers { plan, producers } = self;
        let started = Instant::now();
        let started_wall_ns = wall_clock_ns();
        let cpu_before = crate::cpu::process_cpu_time();
        let count = u64::from(plan.producers);
        let tasks: Vec<_> = producers
            .iter()
            .cloned()
            .enumerate()
            .map(|(index, producer)| {
                let index = u32::try_from(index).expect("producer count fits u32");
                let quota = match plan.stop {
                    Stop::Messages(total) => {
                        Some(total / count + u64::from(u64::from(index) < total % count))
                    }
                    Stop::After(_) => None,
                };
                let worker = Worker {
                    producer,
                    filler: body::filler(plan.size),
                    plan: plan.clone(),
                    index,
                    quota,
                    started,
                    started_wall_ns,
                    counters: Arc::clone(&counters),
                };
                tokio::spawn(worker.run())
            })
            .collect();
        let mut result = LoadResult {
            latency_ns: report::latency_histogram()?,
            messages: 0,
            calls: 0,
            failed: 0,
            flush_timeouts: 0,
            acknowledged: Vec::with_capacity(tasks.len()),
            elapsed: Duration::ZERO,
            cpu: crate::cpu::CpuTime::default(),
            build_cpu: Duration::ZERO,
        };
        let mut first_error = None;
        for task in tasks {
            match task.await.context("a producer task panicked")? {
                Ok(worker) => {
                    result
                        .latency_ns
                        .add(&worker.latency_ns)
                        .context("cannot merge latency histograms")?;
                    result.messages += worker.messages;
                    result.calls += worker.calls;
                    result.failed += worker.failed;
                    result.flush_timeouts += worker.flush_timeouts;
                    result.build_cpu += worker.build_cpu;
                    result.acknowledged.push(worker.acknowledged);
                }
                Err(error) => {
                    first_error.get_or_insert(error);
                    result.acknowledged.push(SequenceSet::default());
                }
            }
        }
        result.elapsed = started.elapsed();
        result.cpu = crate::cpu::process_cpu_time().since(&cpu_before);
        for producer in &producers {
            producer.shutdown().await;
        }
        match first_error {
            Some(error) => Err(error),
            None => Ok(result),
        }
    }
}

/// One producer's loop.
struct Worker {
    producer: Producer,
    /// What follows the header in every body.
    filler: Vec<u8>,
    plan: LoadPlan,
    index: u32,
    /// Messages to send; `None` under a time limit.
    quota: Option<u64>,
    started: Instant,
    started_wall_ns: u64,
    counters: Arc<Counters>,
}

/// What one producer measured.
struct WorkerResult {
    latency_ns: Histogram<u64>,
    messages: u64,
    calls: u64,
    failed: u64,
    flush_timeouts: u64,
    acknowledged: SequenceSet,
    /// Since when every call has failed (`None` after a success).
    failing_since: Option<std::time::Instant>,
    /// CPU time spent building messages.
    build_cpu: Duration,
}

/// A call of `--inflight N` on its way.
struct CallInFlight {
    sent: Sent,
    /// The call's start, or its intended time under `--rate`.
    latency_from: Instant,
    first_sequence: u64,
    messages: u64,
}

/// What a call returned once admitted.
enum Sent {
    One(SendFuture<SendResult>),
    Batch(SendFuture<BatchSendResult>),
}

impl Sent {
    async fn status(self) -> shardmq_client::Result<SendStatus> {
        match self {
            Sent::One(sent) => sent.await.map(|result| result.status),
            Sent::Batch(sent) => sent.await.map(|result| result.status),
        }
    }
}

impl Worker {
    async fn run(self) -> Result<WorkerResult> {
        let plan = &self.plan;
        let mut result = WorkerResult {
            latency_ns: report::latency_histogram()?,
            messages: 0,
            calls: 0,
            failed: 0,
            flush_timeouts: 0,
            acknowledged: SequenceSet::default(),
            failing_since: None,
            build_cpu: Duration::ZERO,
        };
        // Seconds between two calls of this producer on the --rate schedule.
        let call_interval_s = plan
            .rate
            .map(|rate| f64::from(plan.batch) * f64::from(plan.producers) / rate);
        let deadline = match plan.stop {
            Stop::After(duration) => Some(self.started + duration),
            Stop::Messages(_) => None,
        };
        let mut in_flight: VecDeque<CallInFlight> = VecDeque::new();
        let mut sequence = 0u64;
        // With one call in flight and no --rate schedule, the next call's messages (built
        // while the current call is answered).
        let build_ahead = plan.build_ahead && plan.rate.is_none();
        let mut ahead: Option<Vec<Message>> = None;
        for call in 0u64.. {
            let messages_in_call = match self.quota {
                Some(quota) if sequence >= quota => break,
                Some(quota) => (quota - sequence).min(u64::from(plan.batch)),
                None => u64::from(plan.batch),
            };
            let intended = call_interval_s
                .map(|interval| self.started + Duration::from_secs_f64(call as f64 * interval));
            if let (Some(deadline), Some(intended)) = (deadline, intended) {
                if intended >= deadline {
                    break;
                }
            }
            if let Some(intended) = intended {
                tokio::time::sleep_until(intended).await;
            }
            let call_started = Instant::now();
            if deadline.is_some_and(|deadline| call_started >= deadline) {
                break;
            }
            let born_ns = wall_clock_ns();
            let intended_ns = intended.map_or(born_ns, |intended| {
                self.started_wall_ns + intended.duration_since(self.started).as_nanos() as u64
            });
            let batch = match ahead.take() {
                Some(batch) if batch.len() as u64 == messages_in_call => batch,
                _ => {
                    let build_started = crate::cpu::thread_cpu_time();
                    let batch = self.messages(sequence, messages_in_call, intended_ns, born_ns);
                    result.build_cpu += crate::cpu::thread_cpu_time().saturating_sub(build_started);
                    batch
                }
            };
            let latency_from = intended.unwrap_or(call_started);
            if plan.inflight == 1 && build_ahead && batch.len() > 1 {
                // The next call's messages are built while this one is answered, as an
                // application makes its next messages while a send is on its way: the
                // harness's own work is not in the chain of the call it measures.
                let status = match self.producer.send_batch_async(batch).await {
                    Ok(sent) => {
                        tokio::task::yield_now().await;
                        let next = sequence + messages_in_call;
                        let next_count = match self.quota {
                            Some(quota) => quota.saturating_sub(next).min(u64::from(plan.batch)),
                            None => u64::from(plan.batch),
                        };
                        if next_count > 0 {
                            let build_started = crate::cpu::thread_cpu_time();
                            let born_ns = wall_clock_ns();
                            ahead = Some(self.messages(next, next_count, born_ns, born_ns));
                            result.build_cpu +=
                                crate::cpu::thread_cpu_time().saturating_sub(build_started);
                        }
                        Sent::Batch(sent).status().await
                    }
                    Err(error) => Err(error),
                };
                self.account(
                    &mut result,
                    status,
                    latency_from,
                    sequence,
                    messages_in_call,
                )
                .await?;
            } else if plan.inflight == 1 {
                let status = if batch.len() == 1 {
                    let message = batch.into_iter().next().expect("one message");
                    self.producer.send(message).await.map(|sent| sent.status)
                } else {
                    self.producer
                        .send_batch(batch)
                        .await
                        .map(|sent| sent.status)
                };
                self.account(
                    &mut result,
                    status,
                    latency_from,
                    sequence,
                    messages_in_call,
                )
                .await?;
            } else {
                let admitted = if batch.len() == 1 {
                    let message = batch.into_iter().next().expect("one message");
                    self.producer.send_async(message).await.map(Sent::One)
                } else {
                    self.producer.send_batch_async(batch).await.map(Sent::Batch)
                };
                match admitted {
                    Ok(sent) => in_flight.push_back(CallInFlight {
                        sent,
                        latency_from,
                        first_sequence: sequence,
                        messages: messages_in_call,
                    }),
                    Err(error) => {
                        self.account(
                            &mut result,
                            Err(error),
                            latency_from,
                            sequence,
                            messages_in_call,
                        )
                        .await?;
                    }
                }
                while in_flight.len() >= plan.inflight as usize {
                    let call = in_flight.pop_front().expect("a call in flight");
                    self.settle(&mut result, call).await?;
                }
            }
            sequence += messages_in_call;
        }
        while let Some(call) = in_flight.pop_front() {
            self.settle(&mut result, call).await?;
        }
        Ok(result)
    }

    /// Awaits a call in flight and accounts for its answer.
    async fn settle(&self, result: &mut WorkerResult, call: CallInFlight) -> Result<()> {
        let status = call.sent.status().await;
        self.account(
            result,
            status,
            call.latency_from,
            call.first_sequence,
            call.messages,
        )
        .await
    }

    /// Counts a call of `messages` messages from `first_sequence` that ended with `status`,
    /// answered now; after a failure pauses a little, and gives up once every call has failed
    /// for [`GIVE_UP_AFTER`].
    async fn account(
        &self,
        result: &mut WorkerResult,
        status: shardmq_client::Result<SendStatus>,
        latency_from: Instant,
        first_sequence: u64,
        messages: u64,
    ) -> Result<()> {
        let answered = Instant::now();
        report::record_latency(
            &mut result.latency_ns,
            answered.duration_since(latency_from),
        );
        result.calls += 1;
        match status {
            Ok(status) => {
                result.failing_since = None;
                result.acknowledged.insert_range(first_sequence, messages);
                result.messages += messages;
                if status != SendStatus::SendOk {
                    result.flush_timeouts += messages;
                }
                self.counters.sent.fetch_add(messages, Ordering::Relaxed);
            }
            Err(error) => {
                result.failed += messages;
                let since = *result
                    .failing_since
                    .get_or_insert_with(std::time::Instant::now);
                if result.failed <= MAX_LOGGED_FAILURES * u64::from(self.plan.batch) {
                    warn!(producer = self.index, %error, "send failed");
                }
                if since.elapsed() >= GIVE_UP_AFTER {
                    return Err(error).with_context(|| {
                        format!(
                            "producer {} gave up after every send failed for {} s",
                            self.index,
                            GIVE_UP_AFTER.as_secs()
                        )
                    });
                }
                tokio::time::sleep(FAILED_CALL_PAUSE).await;
            }
        }
        Ok(())
    }

    /// The messages of one call: sequences `first..first + count`, their bodies slices of one
    /// buffer.
    fn messages(&self, first: u64, count: u64, intended_ns: u64, born_ns: u64) -> Vec<Message> {
        let body_bytes = self.plan.size;
        let mut bodies = BytesMut::with_capacity(body_bytes * count as usize);
        for sequence in first..first + count {
            let header = Header {
                run_id: self.plan.run_id,
                producer: self.index,
                sequence,
                intended_ns,
                born_ns,
            };
            header.write_body(&self.filler, &mut bodies);
        }
        let bodies = bodies.freeze();
        (0..count as usize)
            .map(|index| {
                let body = bodies.slice(index * body_bytes..(index + 1) * body_bytes);
                let message = Message::new(self.plan.topic.as_str(), body);
                if self.plan.percent_property {
                    let share = (first + index as u64) % 100;
                    message.with_property(PERCENT_PROPERTY, share.to_string())
                } else {
                    message
                }
            })
            .collect()
    }
}
