//! The push consumer: pulls the group's share of its subscribed topics in the background and
//! calls the application's listener (RocketMQ's DefaultMQPushConsumer).
//!
//! How it fits together:
//! - `rebalance.rs` decides which queues this instance owns (every 20 s and on a membership
//!   notice; clustering shares queues with `allocate.rs`, broadcasting takes them all), starts
//!   a pull loop per owned queue from where the group left it, and stops the loops of queues
//!   it lost;
//! - each pull loop long-polls its queue into a [`process_queue::ProcessQueue`], pausing when
//!   the queue's cache is over the flow limits, and hands new messages to `consume.rs`;
//! - `consume.rs` runs the listener on a bounded pool (20 at once): concurrently, or one
//!   message at a time per queue in offset order (orderly); a message the listener wants
//!   again (`ReconsumeLater`) stays cached and is redelivered locally after a delay;
//! - `offset_store.rs` keeps each queue's offset (never past its lowest unfinished message)
//!   and persists it every 5 s, on rebalance and on shutdown;
//! - the heartbeat (every 30 s, and on every new connection) keeps the instance in its group.
//!
//! - `builder.rs` holds the settings, their defaults and checks, and starts the consumer.
//!
//! Owns: the consumer's configuration (what it runs with; the builder's settings are in
//! `builder.rs`) and lifecycle (the shared core, its background tasks, shutdown). Never: wire
//! encoding.

mod allocate;
mod builder;
mod consume;
mod offset_store;
mod process_queue;
mod queue_lock;
mod rebalance;

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{Notify, Semaphore};
use tokio::task::JoinHandle;
use tracing::{debug, warn};

pub use allocate::allocate_averagely;
pub use builder::PushConsumerBuilder;
pub use process_queue::FlowLimits;
pub use queue_lock::{DEFAULT_ORDERLY_LOCK_INTERVAL, DEFAULT_ORDERLY_LOCK_TTL};

use crate::api::HeartbeatGroup;
use crate::connection::Notice;
use crate::instance::{ClientInstance, ClientOptions};
use crate::message::MessageExt;
use crate::route::MessageQueue;
use crate::subscription::TagExpression;
use offset_store::OffsetStore;
use process_queue::ProcessQueue;

/// How often queues are shared out again (RocketMQ's `rebalanceInterval`).
pub const REBALANCE_INTERVAL: Duration = Duration::from_secs(20);

/// How often consumed offsets are persisted (`persistConsumerOffsetInterval`).
pub const PERSIST_OFFSETS_INTERVAL: Duration = Duration::from_secs(5);

/// How often the consumer tells its brokers it is alive (`heartbeatBrokerInterval`).
pub const HEARTBEAT_INTERVAL: Duration = Duration::from_secs(30);

/// How long the broker may hold a pull that finds nothing (`brokerSuspendMaxTimeMillis`).
pub const PULL_WAIT: Duration = Duration::from_secs(15);

/// Listener calls running at once (`consumeThreadMin`/`Max`).
pub const DEFAULT_CONSUME_THREADS: usize = 20;

/// Default most messages per pull of a push consumer. RocketMQ pulls 32 at a time, which caps
/// one queue at 32 messages per round trip; the transfer is sized by bytes instead (below),
/// and this only bounds a pull of tiny messages.
pub const DEFAULT_PUSH_PULL_BATCH: u32 = 1024;

/// Default most record bytes per pull of a push consumer: one queue's backlog drains in 1 MiB
/// round trips (measured in `docs/performance.md`: 1 MiB pulls drained one queue about 1.5x as
/// fast as 256 KiB ones). The flow limits still bound what is cached.
pub const DEFAULT_PUSH_PULL_MAX_BYTES: u32 = 1024 * 1024;

/// How long an orderly queue waits before redelivering after `ReconsumeLater`
/// (`suspendCurrentQueueTimeMillis`).
pub const DEFAULT_ORDERLY_SUSPEND: Duration = Duration::from_secs(1);

/// Redeliveries through the retry topic before a message goes to the group's dead-letter topic
/// (`maxReconsumeTimes`).
pub const DEFAULT_MAX_RECONSUME_TIMES: i32 = 16;

/// How long a listener call may hold a message before it is sent back for retry
/// (`consumeTimeout`, concurrent mode).
pub const DEFAULT_CONSUME_TIMEOUT: Duration = Duration::from_secs(15 * 60);

/// How often queues are shared out again while the group's retry topic has no route yet (the
/// broker creates it at the first heartbeat and registers it moments later).
const RETRY_ROUTE_POLL: Duration = Duration::from_secs(1);

/// How long shutdown waits for listener calls in progress.
pub const SHUTDOWN_WAIT: Duration = Duration::from_secs(30);

/// RocketMQ's delay levels 1..=18; a concurrent `ReconsumeLater` of a message delivered `n`
/// times before waits level `3 + n` (10 s, 30 s, 1 min, … 2 h), as a retry through
/// `%RETRY%<group>` would.
const DELAY_LEVELS_SECONDS: [u64; 18] = [
    1, 5, 10, 30, 60, 120, 180, 240, 300, 360, 420, 480, 540, 600, 1200, 1800, 3600, 7200,
];

/// How a group consumes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum MessageModel {
    /// The group's members share the queues; each message goes to one member.
    #[default]
    Clustering,
    /// Every member gets every message; each keeps its own offsets in a local file.
    Broadcasting,
}

/// Where a group with no stored offset for a queue starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum ConsumeFrom {
    /// After the newest message: only what is sent from now on (RocketMQ's default).
    #[default]
    LastOffset,
    /// From the oldest message still stored.
    FirstOffset,
    /// From the first message stored at or after this time (ms since the epoch).
    Timestamp(i64),
}

/// What the listener says about the messages it was given.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ConsumeResult {
    /// Consumed; the offset may move past them.
    Success,
    /// Not consumed: deliver again later. Concurrent listeners in clustering mode send the
    /// messages back to the broker, which redelivers them through the group's retry topic
    /// (`%RETRY%<group>`) after delay level `3 + reconsume_times` (10 s, 30 s, 1 min, … 2 h),
    /// and after `max_reconsume_times` redeliveries moves them to `%DLQ%<group>`; the
    /// redelivered message shows its original topic and a `reconsume_times` one higher. When
    /// the send-back fails, and in broadcasting mode, the messages stay cached (the offset does
    /// not move past them) and this instance redelivers them after that delay. Orderly
    /// listeners never send back: the queue pauses (`orderly_suspend`) and the same messages
    /// come again, in order. A panicking listener, and a concurrent call that runs past
    /// `consume_timeout`, count as this.
    ReconsumeLater,
}

/// A listener's future.
pub type ListenerFuture = Pin<Box<dyn Future<Output = ConsumeResult> + Send + 'static>>;

type ListenerFn = Arc<dyn Fn(Vec<MessageExt>) -> ListenerFuture + Send + Sync>;

#[derive(Clone)]
enum Listener {
    Concurrently(ListenerFn),
    Orderly(ListenerFn),
}

/// Everything a running consumer was configured with.
#[derive(Debug, Clone)]
struct ConsumerConfig {
    group: String,
    model: MessageModel,
    consume_from: ConsumeFrom,
    consume_threads: usize,
    consume_batch_max: usize,
    pull_batch: u32,
    pull_max_bytes: u32,
    flow_limits: FlowLimits,
    reconsume_delay: Option<Duration>,
    orderly_suspend: Duration,
    orderly_lock_interval: Duration,
    orderly_lock_ttl: Duration,
    max_reconsume_times: i32,
    consume_timeout: Duration,
    rebalance_interval: Duration,
    persist_interval: Duration,
    pull_wait: Duration,
}

impl ConsumerConfig {
    /// The wait before redelivering a message that has failed `failed_deliveries` times.
    fn redelivery_delay(&self, failed_deliveries: i32) -> Duration {
        if let Some(delay) = self.reconsume_delay {
            return delay;
        }
        let level = (2 + failed_deliveries.max(1) as usize).min(DELAY_LEVELS_SECONDS.len());
        Duration::from_secs(DELAY_LEVELS_SECONDS[level - 1])
    }
}

/// The group's retry topic, `%RETRY%<group>`.
pub(crate) fn retry_topic_of(group: &str) -> String {
    format!("{RETRY_TOPIC_PREFIX}{group}")
}

pub(crate) const RETRY_TOPIC_PREFIX: &str = "%RETRY%";

/// A queue this instance owns now.
struct Assigned {
    process_queue: Arc<ProcessQueue>,
    puller: JoinHandle<()>,
}

/// The running consumer's state, shared by its tasks.
struct ConsumerCore {
    instance: Arc<ClientInstance>,
    config: ConsumerConfig,
    subscriptions: BTreeMap<String, TagExpression>,
    listener: Listener,
    offsets: OffsetStore,
    assigned: Mutex<BTreeMap<MessageQueue, Assigned>>,
    /// One permit per listener call that may run.
    workers: Arc<Semaphore>,
    rebalance_now: Notify,
    /// Held while rebalancing, so the timer, notices and `PushConsumer::rebalance` never
    /// rebalance at once (two would start two pull loops for one queue).
    rebalancing: tokio::sync::Mutex<()>,
    is_stopping: AtomicBool,
    /// The consumer's own loops: rebalance, heartbeat, offset persistence, notices.
    tasks: Mutex<Vec<JoinHandle<()>>>,
}

impl ConsumerCore {
    fn is_stopping(&self) -> bool {
        self.is_stopping.load(Ordering::Acquire)
    }

    fn assigned(&self) -> std::sync::MutexGuard<'_, BTreeMap<MessageQueue, Assigned>> {
        self.assigned
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Clustering: whether the group's retry topic has no queue assigned yet, because its route
    /// is still unknown (its queue is then taken at the next, quicker, rebalance).
    fn is_retry_route_missing(&self) -> bool {
        if self.config.model != MessageModel::Clustering {
            return false;
        }
        let retry_topic = retry_topic_of(&self.config.group);
        !self
            .instance
            .namesrv
            .cached_routes()
            .iter()
            .any(|route| route.topic == retry_topic)
    }

    fn assigned_queues(&self) -> Vec<MessageQueue> {
        self.assigned().keys().cloned().collect()
    }

    fn heartbeat_group(&self) -> HeartbeatGroup {
        HeartbeatGroup {
            group: self.config.group.clone(),
            is_broadcasting: self.config.model == MessageModel::Broadcasting,
            is_orderly: matches!(self.listener, Listener::Orderly(_)),
            subscriptions: self
                .subscriptions
                .iter()
                .map(|(topic, expression)| {
                    (
                        topic.clone(),
                        expression.as_str().to_owned(),
                        expression.expression_type(),
                    )
                })
                .collect(),
            // More than a heartbeat may list: reported as none ("not reported").
            held_queues: Some(self.assigned_queues())
                .filter(|queues| queues.len() <= shardmq_schema::MAX_HELD_QUEUES),
        }
    }

    /// Every broker address of the subscribed topics' cached routes.
    fn broker_addresses(&self) -> Vec<String> {
        let mut addresses: Vec<String> = self
            .instance
            .namesrv
            .cached_routes()
            .iter()
            .filter(|route| self.subscriptions.contains_key(&route.topic))
            .flat_map(|route| {
                route
                    .all_addresses()
                    .into_iter()
                    .map(str::to_owned)
                    .collect::<Vec<_>>()
            })
            .collect();
        addresses.sort();
        addresses.dedup();
        addresses
    }

    async fn heartbeat(&self, address: &str) {
        let groups = [self.heartbeat_group()];
        if let Err(error) = self
            .instance
            .pool
            .heartbeat(address, self.instance.request_timeout(), &[], &groups)
            .await
        {
            warn!(%address, %error, group = %self.config.group, "heartbeat failed");
        }
    }

    /// Heartbeats every broker of the subscribed topics (fetching their routes first).
    async fn heartbeat_all(&self) {
        for topic in self.subscriptions.keys() {
            if let Err(error) = self.instance.namesrv.route(topic).await {
                if topic.starts_with(RETRY_TOPIC_PREFIX) {
                    // Created by the broker at this heartbeat; routed moments later.
                    debug!(%topic, %error, "no route for the retry topic yet");
                } else {
                    warn!(%topic, %error, "no route for a subscribed topic yet");
                }
            }
        }
        for address in self.broker_addresses() {
            self.heartbeat(&address).await;
        }
    }

    fn spawn(&self, task: impl Future<Output = ()> + Send + 'static) {
        self.tasks
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(tokio::spawn(task));
    }

    fn start_background(self: &Arc<Self>, notices: Option<tokio::sync::mpsc::Receiver<Notice>>) {
        let core = Arc::clone(self);
        self.spawn(async move {
            loop {
                let interval = if core.is_retry_route_missing() {
                    RETRY_ROUTE_POLL.min(core.config.rebalance_interval)
                } else {
                    core.config.rebalance_interval
                };
                tokio::select! {
                    () = tokio::time::sleep(interval) => {}
                    () = core.rebalance_now.notified() => {}
                }
                core.rebalance().await;
            }
        });
        let core = Arc::clone(self);
        self.spawn(async move {
            let mut ticks = tokio::time::interval(HEARTBEAT_INTERVAL);
            ticks.tick().await;
            loop {
                ticks.tick().await;
                core.heartbeat_all().await;
            }
        });
        if self.uses_queue_locks() {
            let core = Arc::clone(self);
            self.spawn(async move {
                loop {
                    tokio::time::sleep(core.config.orderly_lock_interval).await;
                    core.renew_locks().await;
                }
            });
        }
        let core = Arc::clone(self);
        self.spawn(async move {
            let mut ticks = tokio::time::interval(core.config.persist_interval);
            ticks.tick().await;
            loop {
                ticks.tick().await;
                let queues = core.assigned_queues();
                core.offsets.persist(&core.instance, Some(&queues)).await;
            }
        });
        if let Some(mut notices) = notices {
            let core = Arc::clone(self);
            self.spawn(async move {
                while let Some(notice) = notices.recv().await {
                    match notice {
                        Notice::ConsumerIdsChanged { group } if group == core.config.group => {
                            debug!(%group, "group membership changed; rebalancing");
                            core.rebalance_now.notify_one();
                        }
                        Notice::Connected { address } => {
                            if core.broker_addresses().contains(&address) {
                                core.heartbeat(&address).await;
                            }
                        }
                        Notice::ConsumerIdsChanged { .. } => {}
                    }
                }
            });
        }
    }

    fn stop_tasks(&self) {
        let tasks = std::mem::take(
            &mut *self
                .tasks
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        );
        for task in tasks {
            task.abort();
        }
        for assigned in self.assigned().values() {
            assigned.puller.abort();
        }
    }
}

/// A running push consumer. Dropping it stops it abruptly (no final offset commit); call
/// [`shutdown`](Self::shutdown) to stop cleanly.
///
/// ```no_run
/// # async fn example() -> shardmq_client::Result<()> {
/// use shardmq_client::{ConsumeFrom, ConsumeResult, PushConsumer};
/// let consumer = PushConsumer::builder()
///     .namesrv("127.0.0.1:9876")
///     .group("order-service")
///     .subscribe("orders", "created || paid")
///     .consume_from(ConsumeFrom::FirstOffset)
///     .listen_concurrently(|messages| async move {
///         for message in &messages {
///             println!("{} {}", message.msg_id(), String::from_utf8_lossy(&message.body));
///         }
///         ConsumeResult::Success
///     })
///     .start()
///     .await?;
/// // … later
/// consumer.shutdown().await;
/// # Ok(())
/// # }
/// ```
pub struct PushConsumer {
    core: Arc<ConsumerCore>,
}

impl std::fmt::Debug for PushConsumer {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("PushConsumer")
            .field("group", &self.core.config.group)
            .field("client_id", &self.core.instance.client_id())
            .finish_non_exhaustive()
    }
}

impl PushConsumer {
    /// A builder with RocketMQ's defaults: clustering, from the last offset, 20 listener
    /// calls at once, one message per call, flow limits 1000 messages / 100 MiB / span 2000
    /// (raised to two pulls while a queue has a backlog), rebalance every 20 s, offsets
    /// persisted every 5 s; pulls of up to 1024 messages and 1 MiB.
    #[must_use]
    pub fn builder() -> PushConsumerBuilder {
        PushConsumerBuilder {
            options: ClientOptions::default(),
            group: None,
            subscriptions: Vec::new(),
            offset_store_dir: None,
            listener: None,
            config: ConsumerConfig {
                group: String::new(),
                model: MessageModel::Clustering,
                consume_from: ConsumeFrom::LastOffset,
                consume_threads: DEFAULT_CONSUME_THREADS,
                consume_batch_max: 1,
                pull_batch: DEFAULT_PUSH_PULL_BATCH,
                pull_max_bytes: DEFAULT_PUSH_PULL_MAX_BYTES,
                flow_limits: FlowLimits::default(),
                reconsume_delay: None,
                orderly_suspend: DEFAULT_ORDERLY_SUSPEND,
                orderly_lock_interval: DEFAULT_ORDERLY_LOCK_INTERVAL,
                orderly_lock_ttl: DEFAULT_ORDERLY_LOCK_TTL,
                max_reconsume_times: DEFAULT_MAX_RECONSUME_TIMES,
                consume_timeout: DEFAULT_CONSUME_TIMEOUT,
                rebalance_interval: REBALANCE_INTERVAL,
                persist_interval: PERSIST_OFFSETS_INTERVAL,
                pull_wait: PULL_WAIT,
            },
        }
    }

    #[must_use]
    pub fn group(&self) -> &str {
        &self.core.config.group
    }

    /// The client id this instance announces (`ip@instance`); group members are told apart
    /// by it.
    #[must_use]
    pub fn client_id(&self) -> &str {
        self.core.instance.client_id()
    }

    /// The queues of the subscribed topics this instance consumes now, sorted. The group's
    /// retry queue (`%RETRY%<group>`, subscribed automatically in clustering mode) is not
    /// listed, though one member consumes it.
    #[must_use]
    pub fn assigned_queues(&self) -> Vec<MessageQueue> {
        let mut queues = self.core.assigned_queues();
        queues.retain(|queue| !queue.topic.starts_with(RETRY_TOPIC_PREFIX));
        queues
    }

    /// Shares out the queues again now (as the 20 s timer and membership notices do).
    pub async fn rebalance(&self) {
        self.core.rebalance().await;
    }

    /// Stops cleanly: no more pulls, waits (up to 30 s) for listener calls in progress,
    /// persists every offset, leaves the group at the brokers (so the other members take
    /// over at once) and closes the connections.
    pub async fn shutdown(&self) {
        let core = &self.core;
        if core.is_stopping.swap(true, Ordering::AcqRel) {
            return;
        }
        // Let a rebalance in progress finish (a queue it gives up gets its offset persisted);
        // later ones see `is_stopping` and do nothing.
        let _no_rebalance = core.rebalancing.lock().await;
        core.stop_tasks();
        let permits = u32::try_from(core.config.consume_threads).unwrap_or(u32::MAX);
        match tokio::time::timeout(SHUTDOWN_WAIT, core.workers.acquire_many(permits)).await {
            Ok(Ok(permits)) => permits.forget(),
            Ok(Err(_)) => {}
            Err(_) => warn!(
                "listener calls still running after {} s; shutting down anyway",
                SHUTDOWN_WAIT.as_secs()
            ),
        }
        core.workers.close();
        let queues = core.assigned_queues();
        core.offsets.persist(&core.instance, Some(&queues)).await;
        for assigned in core.assigned().values() {
            assigned.process_queue.mark_dropped();
        }
        if core.uses_queue_locks() {
            // Every listener call has ended and the offsets are persisted: the next owners
            // may start now rather than when the locks expire.
            core.unlock_queues(&queues).await;
        }
        for address in core.broker_addresses() {
            if let Err(error) = core
                .instance
                .pool
                .unregister_client(
                    &address,
                    core.instance.request_timeout(),
                    None,
                    Some(&core.config.group),
                )
                .await
            {
                debug!(%address, %error, "leaving the group failed");
            }
        }
        core.instance.shut_down();
    }
}

impl Drop for PushConsumer {
    fn drop(&mut self) {
        self.core.is_stopping.store(true, Ordering::Release);
        self.core.stop_tasks();
        self.core.workers.close();
        self.core.instance.shut_down();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redelivery_follows_rocketmq_levels() {
        let mut config = PushConsumer::builder().config;
        assert_eq!(config.redelivery_delay(1), Duration::from_secs(10));
        assert_eq!(config.redelivery_delay(2), Duration::from_secs(30));
        assert_eq!(config.redelivery_delay(3), Duration::from_secs(60));
        assert_eq!(config.redelivery_delay(100), Duration::from_secs(7200));
        config.reconsume_delay = Some(Duration::from_millis(5));
        assert_eq!(config.redelivery_delay(9), Duration::from_millis(5));
    }
}
