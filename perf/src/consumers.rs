//! The consuming side: C `shardmq_client::PushConsumer`s in one clustering group (each its own
//! client instance, as C applications would be), recording what they receive.
//!
//! Owns the listener (header check, latency and delivery accounting) and bringing the group to
//! a stable queue assignment before anything counts. When several consumers join a group one
//! after another, the queues move between them while they rebalance, and a queue that moves
//! is read again by its new owner from the group's last committed offset: at-least-once
//! delivery shows up as duplicates that a benchmark of a steady group must not report. So each
//! listener call waits until every queue has exactly one owner; then each member counts only
//! messages of the queues it owns in that final assignment. Messages of a queue it lost while
//! they waited are passed over (answered `Success`, which moves no offset of a dropped queue:
//! the new owner reads them again). `ReconsumeLater` is not used for this, as it sends messages
//! through the group's retry topic. The time this takes counts in the elapsed time.
//!
//! Latencies are taken when the listener sees a message, against the times in its header:
//! from the intended send time (the primary figure, without coordinated omission under
//! `--rate`) and from the born time (just before the send call). Data leaves as a
//! [`GroupResult`].

use std::collections::BTreeSet;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use hdrhistogram::Histogram;
use shardmq_client::{ConsumeFrom, ConsumeResult, MessageExt, MessageQueue, PushConsumer};
use tokio::time::Instant;

use crate::body::{wall_clock_ns, Header};
use crate::progress::Counters;
use crate::report;
use crate::tracker::Receipts;

/// Most consumers one run starts.
pub const MAX_CONSUMERS: u32 = 256;
/// How long the group may take to share out its queues.
const STABLE_TIMEOUT: Duration = Duration::from_secs(60);
const STABLE_POLL_INTERVAL: Duration = Duration::from_millis(10);
/// How often to ask every member to rebalance while the group is not stable.
const REBALANCE_NUDGE_INTERVAL: Duration = Duration::from_millis(500);
/// How often [`ConsumerGroup::wait_for`] checks the counts.
const WAIT_POLL_INTERVAL: Duration = Duration::from_millis(5);

/// What the consumers share with their listeners.
struct Shared {
    /// Becomes true once the group is stable.
    is_open: tokio::sync::watch::Sender<bool>,
    state: Mutex<ReceiveState>,
    counters: Arc<Counters>,
    run_id: Option<u32>,
}

struct ReceiveState {
    receipts: Receipts,
    /// From the header's intended send time until the listener saw the message.
    latency_ns: Histogram<u64>,
    /// From the header's born time until the listener saw the message.
    born_latency_ns: Histogram<u64>,
    last_received: Option<Instant>,
    /// Distinct messages of `run_id` (when set) received.
    unique_of_run: u64,
}

impl Shared {
    fn state(&self) -> MutexGuard<'_, ReceiveState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn receive(&self, messages: &[MessageExt]) {
        if messages.is_empty() {
            return;
        }
        let now = Instant::now();
        let now_ns = wall_clock_ns();
        let mut state = self.state();
        for message in messages {
            match Header::parse(&message.body) {
                Some(header) => {
                    let is_new = state
                        .receipts
                        .record((header.run_id, header.producer), header.sequence);
                    if is_new && self.run_id == Some(header.run_id) {
                        state.unique_of_run += 1;
                    }
                    let since = |ns: u64| Duration::from_nanos(now_ns.saturating_sub(ns));
                    report::record_latency(&mut state.latency_ns, since(header.intended_ns));
                    report::record_latency(&mut state.born_latency_ns, since(header.born_ns));
                }
                None => state.receipts.foreign += 1,
            }
        }
        state.last_received = Some(now);
        drop(state);
        self.counters
            .received
            .fetch_add(messages.len() as u64, Ordering::Relaxed);
    }
}

/// What the group received.
pub struct GroupResult {
    pub receipts: Receipts,
    pub latency_ns: Histogram<u64>,
    pub born_latency_ns: Histogram<u64>,
    pub last_received: Option<Instant>,
}

/// How the benchmark's push consumers pull and hand messages to their listener.
#[derive(clap::Args, Debug, Clone)]
pub struct ConsumerTuning {
    /// Most messages per pull (the transfer size; default: the client's default).
    #[arg(long, default_value_t = shardmq_client::DEFAULT_PUSH_PULL_BATCH)]
    pub pull_batch: u32,
    /// Most record bytes per pull (0: only the broker's `max_pull_bytes`; default: the
    /// client's default).
    #[arg(long, default_value_t = shardmq_client::DEFAULT_PUSH_PULL_MAX_BYTES)]
    pub pull_max_bytes: u32,
    /// Most messages per listener call.
    #[arg(long, default_value_t = 32)]
    pub consume_batch: usize,
    /// While a queue has a backlog, its flow limits rise to this many pulls (the client's
    /// `FlowLimits::backlog_pulls`; 0: RocketMQ's fixed 1000 messages).
    #[arg(long, default_value_t = shardmq_client::FlowLimits::default().backlog_pulls)]
    pub backlog_pulls: u32,
}

/// Which consumers to start.
pub struct GroupPlan<'a> {
    pub namesrv: &'a str,
    pub topic: &'a str,
    /// The topic's readable queues: the group is stable when each has one owner.
    pub queues: &'a [MessageQueue],
    pub group: &'a str,
    pub consumers: u32,
    pub from: ConsumeFrom,
    /// Distinct messages of this run are counted for [`ConsumerGroup::received_of_run`].
    pub run_id: Option<u32>,
    pub counters: Arc<Counters>,
    pub tuning: &'a ConsumerTuning,
    /// Subscribe with this SQL92 expression instead of every tag.
    pub sql: Option<&'a str>,
}

/// A running group of push consumers.
pub struct ConsumerGroup {
    consumers: Vec<PushConsumer>,
    shared: Arc<Shared>,
}

/// Why [`ConsumerGroup::wait_for`] returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitEnd {
    Reached,
    Idle,
    Deadline,
}

impl ConsumerGroup {
    /// Starts the plan's members, waits until each queue has exactly one owner, and opens
    /// the listeners.
    pub async fn start(plan: &GroupPlan<'_>) -> Result<ConsumerGroup> {
        let consumers = plan.consumers;
        let group = plan.group;
        if consumers == 0 || consumers > MAX_CONSUMERS {
            bail!("--consumers must be 1..={MAX_CONSUMERS}");
        }
        let shared = Arc::new(Shared {
            is_open: tokio::sync::watch::channel(false).0,
            state: Mutex::new(ReceiveState {
                receipts: Receipts::default(),
                latency_ns: report::latency_histogram()?,
                born_latency_ns: report::latency_histogram()?,
                last_received: None,
                unique_of_run: 0,
            }),
            counters: Arc::clone(&plan.counters),
            run_id: plan.run_id,
        });
        let mut members = Vec::with_capacity(consumers as usize);
        let mut owned_by_member = Vec::with_capacity(consumers as usize);
        for _ in 0..consumers {
            let listener_shared = Arc::clone(&shared);
            // This member's queues in the stable assignment: (broker name, queue id).
            let owned: Arc<Mutex<BTreeSet<(String, u32)>>> = Arc::default();
            owned_by_member.push(Arc::clone(&owned));
            let builder = PushConsumer::builder().namesrv(plan.namesrv).group(group);
            let builder = match plan.sql {
                Some(sql) => builder.subscribe_sql(plan.topic, sql),
                None => builder.subscribe(plan.topic, "*"),
            };
            let consumer = builder
                .consume_from(plan.from)
                .pull_batch(plan.tuning.pull_batch)
                .pull_max_bytes(plan.tuning.pull_max_bytes)
                .consume_batch_max(plan.tuning.consume_batch)
                .flow_limits(shardmq_client::FlowLimits {
                    backlog_pulls: plan.tuning.backlog_pulls,
                    ..shardmq_client::FlowLimits::default()
                })
                .listen_concurrently(move |messages| {
                    let shared = Arc::clone(&listener_shared);
                    let owned = Arc::clone(&owned);
                    async move {
                        let mut is_open = shared.is_open.subscribe();
                        if is_open.wait_for(|open| *open).await.is_err() {
                            return ConsumeResult::Success;
                        }
                        let mine: Vec<MessageExt> = {
                            let owned = owned.lock().unwrap_or_else(PoisonError::into_inner);
                            messages
                                .into_iter()
                                .filter(|message| {
                                    owned.iter().any(|(broker, queue)| {
                                        broker == message.broker_name()
                                            && *queue == message.queue_id
                                    })
                                })
                                .collect()
                        };
                        shared.receive(&mine);
                        ConsumeResult::Success
                    }
                })
                .start()
                .await
                .with_context(|| format!("cannot start a consumer of group {group}"))?;
            members.push(consumer);
        }
        let group = ConsumerGroup {
            consumers: members,
            shared,
        };
        group.wait_until_stable(plan.queues).await?;
        for (member, owned) in group.consumers.iter().zip(&owned_by_member) {
            *owned.lock().unwrap_or_else(PoisonError::into_inner) = member
                .assigned_queues()
                .into_iter()
                .map(|queue| (queue.broker_name, queue.queue_id))
                .collect();
        }
        group.shared.is_open.send_replace(true);
        Ok(group)
    }

    /// Waits until the members' assigned queues are disjoint and cover `queues`.
    async fn wait_until_stable(&self, queues: &[MessageQueue]) -> Result<()> {
        let wanted: BTreeSet<&MessageQueue> = queues.iter().collect();
        let deadline = Instant::now() + STABLE_TIMEOUT;
        let mut last_nudge = Instant::now();
        for consumer in &self.consumers {
            consumer.rebalance().await;
        }
        loop {
            let assignments: Vec<Vec<MessageQueue>> = self
                .consumers
                .iter()
                .map(PushConsumer::assigned_queues)
                .collect();
            let assigned_count: usize = assignments.iter().map(Vec::len).sum();
            let assigned: BTreeSet<&MessageQueue> = assignments.iter().flatten().collect();
            if assigned_count == wanted.len() && assigned == wanted {
                return Ok(());
            }
            if Instant::now() >= deadline {
                bail!(
                    "the consumer group did not share out its {} queues within {} s \
                     ({assigned_count} assignments)",
                    wanted.len(),
                    STABLE_TIMEOUT.as_secs()
                );
            }
            if last_nudge.elapsed() >= REBALANCE_NUDGE_INTERVAL {
                last_nudge = Instant::now();
                for consumer in &self.consumers {
                    consumer.rebalance().await;
                }
            }
            tokio::time::sleep(STABLE_POLL_INTERVAL).await;
        }
    }

    /// Distinct messages of this run received so far.
    pub fn received_of_run(&self) -> u64 {
        self.shared.state().unique_of_run
    }

    /// Messages received so far: distinct benchmark messages plus messages without a header.
    pub fn received_distinct(&self) -> u64 {
        let state = self.shared.state();
        state.receipts.unique + state.receipts.foreign
    }

    /// Waits until `count()` reaches `target`, nothing new arrived for `idle`, or `deadline`.
    pub async fn wait_for(
        &self,
        target: u64,
        count: impl Fn(&Self) -> u64,
        idle: Duration,
        deadline: Option<Instant>,
    ) -> WaitEnd {
        let mut last_count = count(self);
        let mut last_change = Instant::now();
        loop {
            let current = count(self);
            if current >= target {
                return WaitEnd::Reached;
            }
            let now = Instant::now();
            if current != last_count {
                last_count = current;
                last_change = now;
            } else if now.duration_since(last_change) >= idle {
                return WaitEnd::Idle;
            }
            if deadline.is_some_and(|deadline| now >= deadline) {
                return WaitEnd::Deadline;
            }
            tokio::time::sleep(WAIT_POLL_INTERVAL).await;
        }
    }

    /// Stops every member cleanly (offsets committed) and returns what was received.
    pub async fn finish(self) -> GroupResult {
        for consumer in &self.consumers {
            consumer.shutdown().await;
        }
        let mut state = self.shared.state();
        GroupResult {
            receipts: std::mem::take(&mut state.receipts),
            latency_ns: state.latency_ns.clone(),
            born_latency_ns: state.born_latency_ns.clone(),
            last_received: state.last_received,
        }
    }
}
