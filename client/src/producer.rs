//! The producer: sends messages to a topic's queues, as RocketMQ's DefaultMQProducer does.
//!
//! Owns: queue selection (round-robin over the route's write queues per topic, avoiding the
//! broker that just failed; or by key for ordered sends), retries within the send timeout, and
//! the producer's heartbeat. Never: encoding frames (see `api.rs`) or keeping routes (see
//! `namesrv.rs`).
//!
//! A [`Producer`] is cheap to clone and every method takes `&self`: many sends may be in flight
//! at once over the same pipelined connections (spawn them, or join their futures).

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use shardmq_schema::{wire, FrameError};
use tokio::time::Instant;
use tracing::{debug, warn};

use crate::api::{SendAnswer, SendResult, SendStatus};
use crate::error::{Error, Result};
use crate::instance::{client_option_setters, ClientInstance, ClientOptions};
use crate::message::{check_group_name, Message, MessageExt, DEFAULT_MAX_MESSAGE_BYTES};
use crate::route::{MessageQueue, TopicRoute};
use crate::transaction::{
    check_back_handler, run_local_transaction, CheckFn, EndRequest, TransactionFuture,
    TransactionSendResult, TransactionState,
};

/// Default producer group (RocketMQ's `DEFAULT_PRODUCER`).
pub const DEFAULT_PRODUCER_GROUP: &str = "DEFAULT_PRODUCER";

/// Default time a send may take, retries included (RocketMQ's `sendMsgTimeout`).
pub const DEFAULT_SEND_TIMEOUT: Duration = Duration::from_secs(3);

/// Default retries after a failed send (RocketMQ's `retryTimesWhenSendFailed`).
pub const DEFAULT_SEND_RETRIES: u32 = 2;

/// Most messages in one batch (the broker's default `max_batch_messages`).
pub const MAX_BATCH_MESSAGES: usize = 1024;

/// How often the producer tells its brokers it is alive.
pub const HEARTBEAT_INTERVAL: Duration = Duration::from_secs(30);

/// Configures and starts a [`Producer`].
#[derive(Clone)]
pub struct ProducerBuilder {
    options: ClientOptions,
    group: String,
    send_timeout: Duration,
    retries: u32,
    max_message_bytes: usize,
    heartbeat_interval: Duration,
    check_local_transaction: Option<CheckFn>,
    compress_over_bytes: usize,
}

impl std::fmt::Debug for ProducerBuilder {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("ProducerBuilder")
            .field("options", &self.options)
            .field("group", &self.group)
            .field("send_timeout", &self.send_timeout)
            .field("retries", &self.retries)
            .field("max_message_bytes", &self.max_message_bytes)
            .field("heartbeat_interval", &self.heartbeat_interval)
            .field("compress_over_bytes", &self.compress_over_bytes)
            .field(
                "check_local_transaction",
                &self.check_local_transaction.is_some(),
            )
            .finish()
    }
}

impl ProducerBuilder {
    client_option_setters!();

    /// The producer group (default `DEFAULT_PRODUCER`).
    #[must_use]
    pub fn group(mut self, group: impl Into<String>) -> Self {
        self.group = group.into();
        self
    }

    /// How long one send may take, all attempts together (default 3 s).
    #[must_use]
    pub fn send_timeout(mut self, timeout: Duration) -> Self {
        self.send_timeout = timeout;
        self
    }

    /// How many times a failed send is tried again on a retriable failure (default 2).
    #[must_use]
    pub fn retries(mut self, retries: u32) -> Self {
        self.retries = retries;
        self
    }

    /// Largest body the producer sends (default 4 MiB; a broker's lower announced limit wins).
    #[must_use]
    pub fn max_message_bytes(mut self, bytes: usize) -> Self {
        self.max_message_bytes = bytes;
        self
    }

    /// Bodies longer than this are sent zlib-compressed (default 4 KiB, RocketMQ's
    /// `compressMsgBodyOverHowmuch`); consumers of this crate inflate them transparently. 0
    /// turns compression off.
    #[must_use]
    pub fn compress_over_bytes(mut self, bytes: usize) -> Self {
        self.compress_over_bytes = bytes;
        self
    }

    /// How often the producer tells its brokers it is alive (default 30 s). A broker checks
    /// back transactions only with producers it has heard from.
    #[must_use]
    pub fn heartbeat_interval(mut self, interval: Duration) -> Self {
        self.heartbeat_interval = interval;
        self
    }

    /// The producer group's answer to a broker that asks how a transaction ended (RocketMQ's
    /// `checkLocalTransaction`): called with the half message (its real topic and queue,
    /// properties and body) when the transaction has been unresolved for the broker's
    /// `transaction_timeout_ms`. A panic counts as [`TransactionState::Unknown`]. It runs on
    /// the tokio runtime: move blocking work to `spawn_blocking`.
    #[must_use]
    pub fn check_local_transaction<F, Fut>(mut self, check: F) -> Self
    where
        F: Fn(MessageExt) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = TransactionState> + Send + 'static,
    {
        self.check_local_transaction = Some(Arc::new(move |message| {
            Box::pin(check(message)) as TransactionFuture
        }));
        self
    }

    /// Checks the settings and starts the producer (no connection is made until the first
    /// send).
    pub async fn build(self) -> Result<Producer> {
        check_group_name(&self.group)?;
        if self.send_timeout.is_zero()
            || self.max_message_bytes == 0
            || self.heartbeat_interval.is_zero()
        {
            return Err(Error::Config(
                "send_timeout, max_message_bytes and heartbeat_interval must be positive"
                    .to_owned(),
            ));
        }
        let (instance, _) = ClientInstance::start(self.options, false)?;
        if let Some(check) = self.check_local_transaction {
            instance
                .pool
                .serve_requests(check_back_handler(self.group.clone(), check));
        }
        let inner = Arc::new(ProducerInner {
            instance: Arc::clone(&instance),
            group: self.group,
            send_timeout: self.send_timeout,
            retries: self.retries,
            max_message_bytes: self.max_message_bytes,
            compress_over_bytes: self.compress_over_bytes,
            next_queue: Mutex::new(HashMap::new()),
            is_shut_down: AtomicBool::new(false),
            heartbeated: Mutex::new(HashSet::new()),
        });
        let heartbeat = Arc::downgrade(&inner);
        let heartbeat_interval = self.heartbeat_interval;
        instance.spawn(async move {
            let mut ticks = tokio::time::interval(heartbeat_interval);
            loop {
                ticks.tick().await;
                let Some(inner) = heartbeat.upgrade() else {
                    return;
                };
                inner.heartbeat_all().await;
            }
        });
        Ok(Producer { inner })
    }
}

/// Sends messages. Cheap to clone; clones share connections and routes.
///
/// ```no_run
/// # async fn example() -> shardmq_client::Result<()> {
/// use shardmq_client::{Message, Producer};
/// let producer = Producer::builder().namesrv("127.0.0.1:9876").group("orders-producer").build().await?;
/// let result = producer.send(Message::new("orders", "hello").with_tags("created")).await?;
/// println!("{} stored at {} offset {}", result.msg_id, result.queue, result.queue_offset);
/// producer.shutdown().await;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct Producer {
    inner: Arc<ProducerInner>,
}

impl std::fmt::Debug for Producer {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("Producer")
            .field("group", &self.inner.group)
            .field("client_id", &self.inner.instance.client_id())
            .finish_non_exhaustive()
    }
}

struct ProducerInner {
    instance: Arc<ClientInstance>,
    group: String,
    send_timeout: Duration,
    retries: u32,
    max_message_bytes: usize,
    compress_over_bytes: usize,
    /// Per topic, the round-robin position in its write queues.
    next_queue: Mutex<HashMap<String, Arc<AtomicUsize>>>,
    is_shut_down: AtomicBool,
    /// Brokers told about this producer since it started (check-backs need that).
    heartbeated: Mutex<HashSet<String>>,
}

/// How a send picks its queue on each attempt.
#[derive(Debug, Clone, Copy)]
enum QueueChoice<'a> {
    /// Round-robin, avoiding the broker of the last failed attempt when another exists.
    RoundRobin,
    /// The queue `hash(key) % write queue count`.
    ByKey(&'a str),
    /// Exactly this queue.
    Fixed(&'a MessageQueue),
}

impl Producer {
    /// A builder with RocketMQ's defaults: group `DEFAULT_PRODUCER`, send timeout 3 s, 2
    /// retries, 4 MiB bodies.
    #[must_use]
    pub fn builder() -> ProducerBuilder {
        ProducerBuilder {
            options: ClientOptions::default(),
            group: DEFAULT_PRODUCER_GROUP.to_owned(),
            send_timeout: DEFAULT_SEND_TIMEOUT,
            retries: DEFAULT_SEND_RETRIES,
            max_message_bytes: DEFAULT_MAX_MESSAGE_BYTES,
            heartbeat_interval: HEARTBEAT_INTERVAL,
            check_local_transaction: None,
            compress_over_bytes: crate::compression::DEFAULT_COMPRESS_OVER_BYTES,
        }
    }

    /// The client id the producer announces (`ip@instance`).
    #[must_use]
    pub fn client_id(&self) -> &str {
        self.inner.instance.client_id()
    }

    /// Sends one message to the next write queue of its topic (round-robin across brokers),
    /// retrying on a retriable failure on another broker when there is one, within the send
    /// timeout.
    pub async fn send(&self, message: Message) -> Result<SendResult> {
        let mut results = self
            .inner
            .send(std::slice::from_ref(&message), QueueChoice::RoundRobin)
            .await?;
        Ok(results.remove(0))
    }

    /// Sends one message to the queue chosen by `key`, so that every message of one key goes
    /// to one queue and is consumed in order (RocketMQ's `SelectMessageQueueByHash`). The
    /// queue is `write_queues[|java_string_hash(key)| % write_queues.len()]` over the route's
    /// write queues sorted by broker name and queue id: stable while the route is. Retries go
    /// to the same queue.
    pub async fn send_ordered(&self, message: Message, key: &str) -> Result<SendResult> {
        let mut results = self
            .inner
            .send(std::slice::from_ref(&message), QueueChoice::ByKey(key))
            .await?;
        Ok(results.remove(0))
    }

    /// Sends one message to exactly `queue` (which must be of the message's topic).
    pub async fn send_to_queue(
        &self,
        message: Message,
        queue: &MessageQueue,
    ) -> Result<SendResult> {
        let mut results = self
            .inner
            .send(std::slice::from_ref(&message), QueueChoice::Fixed(queue))
            .await?;
        Ok(results.remove(0))
    }

    /// Sends messages of one topic as one batch: stored together in one queue, all or none.
    /// At most [`MAX_BATCH_MESSAGES`], and the whole request within the broker's frame limit.
    pub async fn send_batch(&self, messages: Vec<Message>) -> Result<Vec<SendResult>> {
        let Some(first) = messages.first() else {
            return Err(Error::InvalidArgument(
                "a batch needs at least one message".to_owned(),
            ));
        };
        if messages.len() > MAX_BATCH_MESSAGES {
            return Err(Error::InvalidArgument(format!(
                "batch has {} messages, over MAX_BATCH_MESSAGES ({MAX_BATCH_MESSAGES})",
                messages.len()
            )));
        }
        if let Some(other) = messages.iter().find(|m| m.topic() != first.topic()) {
            return Err(Error::InvalidArgument(format!(
                "a batch goes to one topic; it has {} and {}",
                first.topic(),
                other.topic()
            )));
        }
        self.inner.send(&messages, QueueChoice::RoundRobin).await
    }

    /// Sends one message without waiting for the broker's answer (a ONE_WAY frame): fastest,
    /// but a failure at the broker is never reported and nothing is retried. Returns once the
    /// message is queued on the connection.
    pub async fn send_oneway(&self, message: Message) -> Result<()> {
        let inner = &self.inner;
        inner.check_running()?;
        message.validate(inner.max_message_bytes)?;
        let route = inner.instance.namesrv.route(message.topic()).await?;
        let queue = inner.select_queue(&route, QueueChoice::RoundRobin, None)?;
        let address = master_address(&route, &queue)?;
        inner
            .instance
            .pool
            .send_one_way(
                &address,
                inner.send_timeout,
                &inner.group,
                &message,
                Some(queue.queue_id),
            )
            .await
    }

    /// Sends `message` in a transaction (RocketMQ's `sendMessageInTransaction`): stores it as
    /// a half message, invisible to consumers; runs `local_transaction` with where it was
    /// stored; then commits the message (delivered once), rolls it back (never delivered) or,
    /// for [`TransactionState::Unknown`], leaves it to the broker's check-back, which calls the
    /// group's [`check_local_transaction`](ProducerBuilder::check_local_transaction)
    /// callback. A panicking local transaction counts as `Unknown`.
    ///
    /// The half message's send is retried like [`send`](Self::send), except after a timeout
    /// (the broker may have stored it). An error means no transaction started; once the local
    /// transaction has run, the result says whether the broker confirmed its end (if not, the
    /// check-back resolves it).
    ///
    /// ```no_run
    /// # async fn example() -> shardmq_client::Result<()> {
    /// use shardmq_client::{Message, Producer, TransactionState};
    /// let producer = Producer::builder()
    ///     .namesrv("127.0.0.1:9876")
    ///     .group("payments")
    ///     .check_local_transaction(|message| async move {
    ///         // Look the transaction up in the application's database by message.keys().
    ///         TransactionState::Commit
    ///     })
    ///     .build()
    ///     .await?;
    /// let outcome = producer
    ///     .send_in_transaction(Message::new("payments", "paid"), |sent| async move {
    ///         println!("half message {} stored; committing the payment", sent.msg_id);
    ///         TransactionState::Commit
    ///     })
    ///     .await?;
    /// assert!(outcome.is_end_confirmed);
    /// # Ok(())
    /// # }
    /// ```
    pub async fn send_in_transaction<F, Fut>(
        &self,
        message: Message,
        local_transaction: F,
    ) -> Result<TransactionSendResult>
    where
        F: FnOnce(SendResult) -> Fut,
        Fut: Future<Output = TransactionState> + Send + 'static,
    {
        let inner = &self.inner;
        inner.check_running()?;
        message.validate(inner.max_message_bytes)?;
        let (address, sent, half_commit_log_offset) = inner.send_half(&message).await?;
        inner.make_known_to(&address).await;
        let state = run_local_transaction(local_transaction, sent.clone()).await;
        let end = EndRequest {
            producer_group: &inner.group,
            half_queue_offset: sent.queue_offset,
            half_commit_log_offset,
            unique_id: &sent.msg_id,
            state,
        };
        let is_end_confirmed = match inner
            .instance
            .pool
            .end_transaction(&address, inner.send_timeout, &end)
            .await
        {
            Ok(()) => true,
            Err(error) => {
                warn!(msg_id = %sent.msg_id, ?state, %error, "ending the transaction failed; the broker will check back");
                false
            }
        };
        Ok(TransactionSendResult {
            send_result: sent,
            state,
            is_end_confirmed,
        })
    }

    /// The queues a send to `topic` may use (the route's write queues, sorted).
    pub async fn write_queues(&self, topic: &str) -> Result<Vec<MessageQueue>> {
        Ok(self
            .inner
            .instance
            .namesrv
            .route(topic)
            .await?
            .write_queues())
    }

    /// Leaves the producer group at the brokers and closes every connection. Sends after this
    /// fail with [`Error::ShutDown`].
    pub async fn shutdown(&self) {
        let inner = &self.inner;
        if inner.is_shut_down.swap(true, Ordering::AcqRel) {
            return;
        }
        for address in inner.broker_addresses() {
            if let Err(error) = inner
                .instance
                .pool
                .unregister_client(
                    &address,
                    inner.instance.request_timeout(),
                    Some(&inner.group),
                    None,
                )
                .await
            {
                debug!(%address, %error, "unregistering the producer failed");
            }
        }
        inner.instance.shut_down();
    }
}

fn master_address(route: &TopicRoute, queue: &MessageQueue) -> Result<String> {
    route
        .master_address(&queue.broker_name)
        .map(str::to_owned)
        .ok_or_else(|| Error::NoQueue {
            topic: route.topic.clone(),
            kind: "writable (live master)",
        })
}

/// Java's `String.hashCode()` of `text` (UTF-16 code units): the stable hash ordered sends
/// use, as RocketMQ's `SelectMessageQueueByHash` does.
#[must_use]
pub fn java_string_hash(text: &str) -> i32 {
    text.encode_utf16().fold(0i32, |hash, unit| {
        hash.wrapping_mul(31).wrapping_add(i32::from(unit))
    })
}

/// The index among `queue_count` queues that `key` selects: `|java_string_hash(key)| %
/// queue_count` (the absolute value taken without overflow).
#[must_use]
pub fn queue_index_for_key(key: &str, queue_count: usize) -> usize {
    debug_assert!(queue_count > 0);
    java_string_hash(key).unsigned_abs() as usize % queue_count
}

impl ProducerInner {
    fn check_running(&self) -> Result<()> {
        if self.is_shut_down.load(Ordering::Acquire) {
            Err(Error::ShutDown)
        } else {
            Ok(())
        }
    }

    fn queue_counter(&self, topic: &str) -> Arc<AtomicUsize> {
        let mut counters = self
            .next_queue
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        Arc::clone(
            counters
                .entry(topic.to_owned())
                .or_insert_with(|| Arc::new(AtomicUsize::new(random_start(topic)))),
        )
    }

    fn select_queue(
        &self,
        route: &TopicRoute,
        choice: QueueChoice<'_>,
        failed_broker: Option<&str>,
    ) -> Result<MessageQueue> {
        if let QueueChoice::Fixed(queue) = choice {
            return Ok(queue.clone());
        }
        let queues = route.write_queues();
        if queues.is_empty() {
            return Err(Error::NoQueue {
                topic: route.topic.clone(),
                kind: "writable",
            });
        }
        if let QueueChoice::ByKey(key) = choice {
            return Ok(queues[queue_index_for_key(key, queues.len())].clone());
        }
        let counter = self.queue_counter(&route.topic);
        let start = counter.fetch_add(1, Ordering::Relaxed);
        if let Some(failed) = failed_broker {
            for step in 0..queues.len() {
                let queue = &queues[(start + step) % queues.len()];
                if queue.broker_name != failed {
                    return Ok(queue.clone());
                }
            }
        }
        Ok(queues[start % queues.len()].clone())
    }

    /// Sends `messages` (one topic, checked non-empty) with retries; one result per message.
    async fn send(&self, messages: &[Message], choice: QueueChoice<'_>) -> Result<Vec<SendResult>> {
        self.check_running()?;
        for message in messages {
            message.validate(self.max_message_bytes)?;
        }
        let topic = messages[0].topic();
        if let QueueChoice::Fixed(queue) = choice {
            if queue.topic != topic {
                return Err(Error::InvalidArgument(format!(
                    "queue {queue} is not a queue of topic {topic}"
                )));
            }
        }
        let deadline = Instant::now() + self.send_timeout;
        let mut failed_broker: Option<String> = None;
        let mut last_error = None;
        let mut attempts = 0;
        while attempts <= self.retries {
            let remaining = deadline.saturating_duration_since(Instant::now());
            if remaining.is_zero() {
                break;
            }
            attempts += 1;
            // `queue` is `None` for a topic without a route: the broker picks the queue.
            let (address, queue) = match self.instance.namesrv.route(topic).await {
                Ok(route) => {
                    let queue = self.select_queue(&route, choice, failed_broker.as_deref())?;
                    (master_address(&route, &queue)?, Some(queue))
                }
                Err(Error::TopicNotFound { .. }) if matches!(choice, QueueChoice::RoundRobin) => {
                    let address = self
                        .auto_create_target(topic, failed_broker.as_deref())
                        .await?;
                    (address, None)
                }
                Err(error) => return Err(error),
            };
            let queue_id = queue.as_ref().map(|queue| queue.queue_id);
            match self
                .send_to(&address, topic, queue_id, messages, remaining)
                .await
            {
                Ok(answer) => {
                    let queue = match queue {
                        Some(queue) => queue,
                        None => MessageQueue::new(
                            topic,
                            self.broker_name_at(&address).await,
                            answer.queue_id,
                        ),
                    };
                    return Ok(results(answer, queue, messages));
                }
                Err(Error::Status { status, .. })
                    if status == wire::Status::TOPIC_NOT_FOUND && queue.is_none() =>
                {
                    // The broker does not create topics on first send.
                    return Err(Error::TopicNotFound {
                        topic: topic.to_owned(),
                    });
                }
                Err(error) if error.is_retriable() => {
                    warn!(%topic, %address, attempt = attempts, %error, "send failed; retrying");
                    // The broker may be gone, paused or refusing writes (a master replaced by
                    // failover): look again where the topic lives.
                    let _ = self.instance.namesrv.fetch_route(topic).await;
                    // Broker names to avoid with a route; addresses without one.
                    failed_broker = Some(queue.map_or(address, |queue| queue.broker_name));
                    last_error = Some(error);
                }
                Err(error) => return Err(error),
            }
        }
        let last = last_error.unwrap_or(Error::Timeout {
            operation: "send",
            address: String::new(),
            timeout: self.send_timeout,
        });
        Err(Error::SendFailed {
            topic: topic.to_owned(),
            attempts,
            last: Box::new(last),
        })
    }

    /// For a topic no broker hosts yet: the address of a master broker of the cluster
    /// (round-robin, avoiding the one that just failed) to send to with no queue named, so
    /// that a broker that creates topics on first send (`--auto-create-topics`) creates it.
    /// RocketMQ does the same through the route of its default topic `TBW102`.
    async fn auto_create_target(&self, topic: &str, failed: Option<&str>) -> Result<String> {
        let clusters = self.instance.namesrv.cluster_info().await?;
        let masters: Vec<&str> = clusters
            .iter()
            .flat_map(|cluster| cluster.master_addresses())
            .collect();
        if masters.is_empty() {
            return Err(Error::TopicNotFound {
                topic: topic.to_owned(),
            });
        }
        let start = self.queue_counter(topic).fetch_add(1, Ordering::Relaxed);
        let address = (0..masters.len())
            .map(|step| masters[(start + step) % masters.len()])
            .find(|address| Some(*address) != failed)
            .unwrap_or(masters[start % masters.len()]);
        debug!(%topic, %address, "no route yet; sending where the broker may create the topic");
        Ok(address.to_owned())
    }

    /// The broker name the broker at `address` gave in its handshake.
    async fn broker_name_at(&self, address: &str) -> String {
        match self.instance.pool.get(address).await {
            Ok(connection) => connection
                .server()
                .map(|server| server.broker_name.clone())
                .unwrap_or_default(),
            Err(_) => String::new(),
        }
    }

    async fn send_to(
        &self,
        address: &str,
        topic: &str,
        queue_id: Option<u32>,
        messages: &[Message],
        timeout: Duration,
    ) -> Result<SendAnswer> {
        let connection = self.instance.pool.get(address).await?;
        let messages = &*crate::compression::compress_bodies(messages, self.compress_over_bytes);
        let announced = connection.server().map_or(0, |s| s.max_message_bytes);
        if announced > 0 {
            for message in messages {
                if message.body().len() > announced {
                    return Err(Error::InvalidArgument(format!(
                        "message body is {} bytes, over the broker {address}'s max_message_bytes ({announced})",
                        message.body().len()
                    )));
                }
            }
        }
        let outcome = self
            .instance
            .pool
            .send_messages(address, timeout, topic, queue_id, &self.group, messages)
            .await;
        match outcome {
            Err(Error::Frame {
                source:
                    FrameError::TooLarge {
                        length_bytes,
                        max_frame_bytes,
                    },
                ..
            }) => Err(Error::InvalidArgument(format!(
                "the send request is {length_bytes} bytes, over the broker {address}'s max_frame_bytes ({max_frame_bytes}); send fewer messages per batch"
            ))),
            other => other,
        }
    }

    /// Master addresses of every broker in the cached routes.
    fn broker_addresses(&self) -> Vec<String> {
        let mut addresses: Vec<String> = self
            .instance
            .namesrv
            .cached_routes()
            .iter()
            .flat_map(|route| {
                route
                    .brokers
                    .keys()
                    .filter_map(|name| route.master_address(name).map(str::to_owned))
                    .collect::<Vec<_>>()
            })
            .collect();
        addresses.sort();
        addresses.dedup();
        addresses
    }

    /// Stores a half message, with retries (not after a timeout: the broker may have stored
    /// it). Returns the broker's address, the result and the half message's CommitLog offset.
    async fn send_half(&self, message: &Message) -> Result<(String, SendResult, i64)> {
        let topic = message.topic();
        let deadline = Instant::now() + self.send_timeout;
        let mut failed_broker: Option<String> = None;
        let mut last_error = None;
        let mut attempts = 0;
        while attempts <= self.retries {
            let remaining = deadline.saturating_duration_since(Instant::now());
            if remaining.is_zero() {
                break;
            }
            attempts += 1;
            let route = self.instance.namesrv.route(topic).await?;
            let queue =
                self.select_queue(&route, QueueChoice::RoundRobin, failed_broker.as_deref())?;
            let address = master_address(&route, &queue)?;
            match self
                .instance
                .pool
                .send_half(
                    &address,
                    remaining,
                    Some(queue.queue_id),
                    &self.group,
                    message,
                )
                .await
            {
                Ok(answer) => {
                    let half_commit_log_offset = answer.stored[0].commit_log_offset;
                    let sent = results(answer, queue, std::slice::from_ref(message)).remove(0);
                    return Ok((address, sent, half_commit_log_offset));
                }
                Err(error) if error.is_retriable() && !matches!(error, Error::Timeout { .. }) => {
                    warn!(%topic, %address, attempt = attempts, %error, "half message send failed; retrying");
                    let _ = self.instance.namesrv.fetch_route(topic).await;
                    failed_broker = Some(queue.broker_name);
                    last_error = Some(error);
                }
                Err(error) => return Err(error),
            }
        }
        Err(Error::SendFailed {
            topic: topic.to_owned(),
            attempts,
            last: Box::new(last_error.unwrap_or(Error::Timeout {
                operation: "send half message",
                address: String::new(),
                timeout: self.send_timeout,
            })),
        })
    }

    /// Heartbeats `address` unless it was told about this producer already, so that the
    /// broker can check transactions back with it before the next heartbeat tick.
    async fn make_known_to(&self, address: &str) {
        let is_new = self
            .heartbeated
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(address.to_owned());
        if !is_new {
            return;
        }
        let groups = [self.group.clone()];
        if let Err(error) = self
            .instance
            .pool
            .heartbeat(address, self.instance.request_timeout(), &groups, &[])
            .await
        {
            debug!(%address, %error, "producer heartbeat failed");
        }
    }

    async fn heartbeat_all(&self) {
        let groups = [self.group.clone()];
        for address in self.broker_addresses() {
            if let Err(error) = self
                .instance
                .pool
                .heartbeat(&address, self.instance.request_timeout(), &groups, &[])
                .await
            {
                debug!(%address, %error, "producer heartbeat failed");
            }
        }
    }
}

fn results(answer: SendAnswer, queue: MessageQueue, messages: &[Message]) -> Vec<SendResult> {
    let status = SendStatus::from_wire(answer.status);
    let queue = MessageQueue {
        queue_id: answer.queue_id,
        ..queue
    };
    answer
        .stored
        .into_iter()
        .zip(messages)
        .map(|(stored, message)| SendResult {
            status,
            msg_id: if stored.unique_id.is_empty() {
                message.unique_id().to_owned()
            } else {
                stored.unique_id
            },
            offset_msg_id: stored.offset_msg_id,
            queue: queue.clone(),
            queue_offset: stored.queue_offset,
        })
        .collect()
}

/// Where a new producer's round-robin over a topic's queues starts: a different queue in each
/// producer (RocketMQ starts at a random index too), so one-shot senders (`shardmq send`, each
/// a new producer) spread over the queues instead of all landing on the first.
fn random_start(topic: &str) -> usize {
    use std::hash::BuildHasher;
    // A `RandomState` is seeded from the OS for each process and differs per instance.
    std::collections::hash_map::RandomState::new().hash_one(topic) as usize
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::route::test_route;

    #[test]
    fn java_hash_matches_java() {
        // Values from Java's "…".hashCode().
        assert_eq!(java_string_hash(""), 0);
        assert_eq!(java_string_hash("a"), 97);
        assert_eq!(java_string_hash("hello"), 99_162_322);
        // "polygenelubricants".hashCode() is the classic Integer.MIN_VALUE.
        assert_eq!(java_string_hash("polygenelubricants"), i32::MIN);
        assert_eq!(queue_index_for_key("polygenelubricants", 8), 0);
    }

    #[test]
    fn key_selection_is_stable_and_in_range() {
        for key in ["a", "order-1", "order-2", "ключ"] {
            let index = queue_index_for_key(key, 8);
            assert!(index < 8);
            assert_eq!(index, queue_index_for_key(key, 8));
        }
        assert_eq!(queue_index_for_key("a", 8), 97 % 8);
    }

    #[test]
    fn producers_start_their_round_robin_at_different_queues() {
        let starts: std::collections::BTreeSet<usize> =
            (0..20).map(|_| random_start("t") % 8).collect();
        assert!(
            starts.len() > 1,
            "20 producers all started at queue {starts:?}"
        );
    }

    #[tokio::test]
    async fn round_robin_avoids_the_failed_broker() {
        let producer = Producer::builder()
            .namesrv("127.0.0.1:1")
            .build()
            .await
            .unwrap();
        let route = test_route("t", &[("a", 2, 6), ("b", 2, 6)]);
        let inner = &producer.inner;
        let picked: Vec<String> = (0..4)
            .map(|_| {
                inner
                    .select_queue(&route, QueueChoice::RoundRobin, None)
                    .unwrap()
                    .to_string()
            })
            .collect();
        // Consecutive picks go round the four queues, from wherever this producer started.
        let order = ["t@a#0", "t@a#1", "t@b#0", "t@b#1"];
        let start = order.iter().position(|q| *q == picked[0]).unwrap();
        let expected: Vec<&str> = (0..4).map(|i| order[(start + i) % 4]).collect();
        assert_eq!(picked, expected);
        for _ in 0..4 {
            let queue = inner
                .select_queue(&route, QueueChoice::RoundRobin, Some("a"))
                .unwrap();
            assert_eq!(queue.broker_name, "b");
        }
        let by_key = inner
            .select_queue(&route, QueueChoice::ByKey("a"), None)
            .unwrap();
        // java_string_hash("a") = 97; 97 % 4 = 1: the second of [a#0, a#1, b#0, b#1].
        assert_eq!(by_key.to_string(), "t@a#1");
    }
}
