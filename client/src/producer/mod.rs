//! The producer: sends messages to a topic's queues, as RocketMQ's DefaultMQProducer does.
//!
//! Owns: the producer's settings and public calls (this file), queue selection (`select.rs`:
//! round-robin over the route's write queues per topic, avoiding the broker that just failed;
//! or by key for ordered sends), retries within the send timeout (`send.rs`), and the
//! producer's heartbeat (this file). Never: encoding frames (see `api/send.rs`) or keeping
//! routes (see `namesrv.rs`).
//!
//! A [`Producer`] is cheap to clone and every method takes `&self`: many sends may be in flight
//! at once over the same pipelined connections (spawn them, or join their futures).

mod select;
mod send;

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tracing::{debug, warn};

pub use select::{java_string_hash, queue_index_for_key};

use crate::api::SendResult;
use crate::error::{Error, Result};
use crate::instance::{client_option_setters, ClientInstance, ClientOptions};
use crate::message::{check_group_name, Message, MessageExt, DEFAULT_MAX_MESSAGE_BYTES};
use crate::route::MessageQueue;
use crate::transaction::{
    check_back_handler, run_local_transaction, CheckFn, EndRequest, TransactionFuture,
    TransactionSendResult, TransactionState,
};
use select::{master_address, QueueChoice};

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

impl ProducerInner {
    fn check_running(&self) -> Result<()> {
        if self.is_shut_down.load(Ordering::Acquire) {
            Err(Error::ShutDown)
        } else {
            Ok(())
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
