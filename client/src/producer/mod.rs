//! The producer: sends messages to a topic's queues, as RocketMQ's DefaultMQProducer does.
//!
//! Owns: the producer's settings and public calls (this file), queue selection (`select.rs`:
//! round-robin over the route's write queues per topic, avoiding the broker that just failed;
//! or by key for ordered sends), the send window and the order of ordered sends
//! (`window.rs`), retries within the send timeout and the choice of request (`send.rs`), and
//! the producer's heartbeat (this file). Never: encoding frames (see `api/`) or keeping routes
//! (see `namesrv.rs`).
//!
//! A [`Producer`] is cheap to clone and every method takes `&self`: many sends may be in flight
//! at once over the same pipelined connections ([`Producer::send_async`] and its siblings, or
//! spawned sends), within the producer's window.

mod select;
mod send;
mod window;

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::BytesMut;
use tokio::task::JoinHandle;
use tracing::{debug, warn};

pub use select::{java_string_hash, queue_index_for_key};
pub use window::{DEFAULT_MAX_BYTES_IN_FLIGHT, DEFAULT_MAX_SENDS_IN_FLIGHT};

use crate::api::{BatchSendResult, SendResult, SendStatus};
use crate::error::{Error, Result};
use crate::instance::{client_option_setters, ClientInstance, ClientOptions};
use crate::message::{check_group_name, Message, MessageExt, DEFAULT_MAX_MESSAGE_BYTES};
use crate::route::MessageQueue;
use crate::transaction::{
    check_back_handler, run_local_transaction, CheckFn, EndRequest, TransactionFuture,
    TransactionSendResult, TransactionState,
};
use select::{master_address, QueueChoice};
use send::Choice;
use window::Window;

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
    max_sends_in_flight: usize,
    max_bytes_in_flight: usize,
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
            .field("max_sends_in_flight", &self.max_sends_in_flight)
            .field("max_bytes_in_flight", &self.max_bytes_in_flight)
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

    /// Most sends (calls, a batch counting once) the producer has in flight at once, across
    /// all its connections (default [`DEFAULT_MAX_SENDS_IN_FLIGHT`], 1,024; RocketMQ's
    /// `backPressureForAsyncSendNum`). A send beyond it waits to be admitted: `send_async`
    /// returns once there is room, so a loop of them runs at the pace of the answers.
    #[must_use]
    pub fn max_sends_in_flight(mut self, sends: usize) -> Self {
        self.max_sends_in_flight = sends;
        self
    }

    /// Most body bytes the producer's sends in flight hold together (default
    /// [`DEFAULT_MAX_BYTES_IN_FLIGHT`], 64 MiB; RocketMQ's `backPressureForAsyncSendSize`). A
    /// send larger than the whole window is admitted alone.
    #[must_use]
    pub fn max_bytes_in_flight(mut self, bytes: usize) -> Self {
        self.max_bytes_in_flight = bytes;
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
            || self.max_sends_in_flight == 0
            || self.max_bytes_in_flight == 0
        {
            return Err(Error::Config(
                "send_timeout, max_message_bytes, heartbeat_interval, max_sends_in_flight and max_bytes_in_flight must be positive"
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
            window: Window::new(self.max_sends_in_flight, self.max_bytes_in_flight),
            run_buffers: Mutex::new(Vec::new()),
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

/// Sends messages. Cheap to clone; clones share connections, routes and the send window.
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
///
/// # Several sends in flight
///
/// Each `send*` call has an `_async` sibling (RocketMQ's asynchronous send): awaiting it
/// admits the send into the producer's **window** and puts it on its way, and returns a
/// [`SendFuture`] that resolves to the result once the broker has answered (retries
/// included, exactly as the plain call would have retried). The window is bounded in sends
/// ([`max_sends_in_flight`](ProducerBuilder::max_sends_in_flight)) and in body bytes
/// ([`max_bytes_in_flight`](ProducerBuilder::max_bytes_in_flight)); a send that does not fit
/// waits to be admitted, so a loop of `send_async` calls slows to the pace of the answers
/// instead of queueing without bound. Plain sends take their place in the same window.
///
/// ```no_run
/// # async fn example(producer: shardmq_client::Producer) -> shardmq_client::Result<()> {
/// use shardmq_client::Message;
/// let mut in_flight = Vec::new();
/// for i in 0..100 {
///     in_flight.push(producer.send_async(Message::new("orders", format!("order {i}"))).await?);
/// }
/// for sent in in_flight {
///     let result = sent.await?;
///     println!("{} → {}", result.msg_id, result.queue);
/// }
/// # Ok(())
/// # }
/// ```
///
/// **Order.** Sends by key ([`send_ordered_async`](Self::send_ordered_async)) and to a given
/// queue ([`send_to_queue_async`](Self::send_to_queue_async)) keep their order per queue: a
/// send to a queue is not put on the wire before the previous such send to that queue has been
/// answered (stored, or failed after its retries), so the queue stores them in the order their
/// `_async` calls were admitted (for one task awaiting each call in turn, the order of the
/// calls). Why this holds whatever happens on the way: the broker stores a queue's sends in
/// the order their requests reach it, and the next request to the queue does not exist on
/// the wire until the previous send has ended, including its retries (a retry of an earlier
/// send can never land behind a later one, and requests racing on the connection or the
/// broker's tasks cannot overtake). [`send_ordered`](Self::send_ordered) and
/// [`send_to_queue`](Self::send_to_queue) take their turn in the same order. An ordered
/// send's queue is chosen when it is admitted, and its send timeout runs from when its turn
/// comes. Ordered sends to one queue therefore go one at a time; sends to different queues,
/// and round-robin sends, overlap freely. Round-robin sends keep no order.
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
    /// Sends in flight, and the order of ordered sends.
    window: Window,
    /// Buffers of finished runs of records, reused by the next sends.
    run_buffers: Mutex<Vec<BytesMut>>,
    /// Per topic, the round-robin position in its write queues.
    next_queue: Mutex<HashMap<String, Arc<AtomicUsize>>>,
    is_shut_down: AtomicBool,
    /// Brokers told about this producer since it started (check-backs need that).
    heartbeated: Mutex<HashSet<String>>,
}

impl Producer {
    /// A builder with RocketMQ's defaults: group `DEFAULT_PRODUCER`, send timeout 3 s, 2
    /// retries, 4 MiB bodies, a window of 1,024 sends and 64 MiB.
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
            max_sends_in_flight: DEFAULT_MAX_SENDS_IN_FLIGHT,
            max_bytes_in_flight: DEFAULT_MAX_BYTES_IN_FLIGHT,
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
        self.send_one(message, Choice::RoundRobin).await
    }

    /// [`send`](Self::send) with the answer awaited later: returns once the send is admitted
    /// into the window (see [several sends in flight](Self#several-sends-in-flight)).
    pub async fn send_async(&self, message: Message) -> Result<SendFuture<SendResult>> {
        self.spawn_one(message, Choice::RoundRobin).await
    }

    /// Sends one message to the queue chosen by `key`, so that every message of one key goes
    /// to one queue and is consumed in order (RocketMQ's `SelectMessageQueueByHash`). The
    /// queue is `write_queues[|java_string_hash(key)| % write_queues.len()]` over the route's
    /// write queues sorted by broker name and queue id: stable while the route is. Retries go
    /// to the same queue.
    pub async fn send_ordered(&self, message: Message, key: &str) -> Result<SendResult> {
        self.send_one(message, Choice::ByKey(key)).await
    }

    /// [`send_ordered`](Self::send_ordered) with the answer awaited later, in order with the
    /// other ordered sends to its queue (see [order](Self#several-sends-in-flight)).
    pub async fn send_ordered_async(
        &self,
        message: Message,
        key: &str,
    ) -> Result<SendFuture<SendResult>> {
        self.spawn_one(message, Choice::ByKey(key)).await
    }

    /// Sends one message to exactly `queue` (which must be of the message's topic).
    pub async fn send_to_queue(
        &self,
        message: Message,
        queue: &MessageQueue,
    ) -> Result<SendResult> {
        self.send_one(message, Choice::Fixed(queue)).await
    }

    /// [`send_to_queue`](Self::send_to_queue) with the answer awaited later, in order with
    /// the other ordered sends to `queue` (see [order](Self#several-sends-in-flight)).
    pub async fn send_to_queue_async(
        &self,
        message: Message,
        queue: &MessageQueue,
    ) -> Result<SendFuture<SendResult>> {
        self.spawn_one(message, Choice::Fixed(queue)).await
    }

    /// Sends messages of one topic as one batch: stored together in one queue, all or none.
    /// At most [`MAX_BATCH_MESSAGES`], and the whole request within the broker's frame limit.
    /// The result holds where each message went, made into a [`SendResult`] when asked.
    pub async fn send_batch(&self, messages: Vec<Message>) -> Result<BatchSendResult> {
        check_batch_size(&messages)?;
        let (target, admission) = self.inner.admit(&messages, Choice::RoundRobin).await?;
        self.inner
            .send_admitted(&messages, &target, admission)
            .await
    }

    /// [`send_batch`](Self::send_batch) with the answer awaited later (see [several sends in
    /// flight](Self#several-sends-in-flight)).
    pub async fn send_batch_async(
        &self,
        messages: Vec<Message>,
    ) -> Result<SendFuture<BatchSendResult>> {
        check_batch_size(&messages)?;
        let (target, admission) = self.inner.admit(&messages, Choice::RoundRobin).await?;
        let inner = Arc::clone(&self.inner);
        Ok(SendFuture::spawn(async move {
            inner.send_admitted(&messages, &target, admission).await
        }))
    }

    async fn send_one(&self, message: Message, choice: Choice<'_>) -> Result<SendResult> {
        let messages = std::slice::from_ref(&message);
        let (target, admission) = self.inner.admit(messages, choice).await?;
        let sent = self
            .inner
            .send_admitted(messages, &target, admission)
            .await?;
        Ok(single(sent))
    }

    async fn spawn_one(
        &self,
        message: Message,
        choice: Choice<'_>,
    ) -> Result<SendFuture<SendResult>> {
        let (target, admission) = self
            .inner
            .admit(std::slice::from_ref(&message), choice)
            .await?;
        let inner = Arc::clone(&self.inner);
        Ok(SendFuture::spawn(async move {
            let messages = std::slice::from_ref(&message);
            inner
                .send_admitted(messages, &target, admission)
                .await
                .map(single)
        }))
    }

    /// Sends one message without waiting for the broker's answer (a ONE_WAY frame): fastest,
    /// but a failure at the broker is never reported and nothing is retried. Returns once the
    /// message is queued on the connection. One-way sends take no place in the window.
    pub async fn send_oneway(&self, message: Message) -> Result<()> {
        let inner = &self.inner;
        inner.check_running()?;
        message.validate(inner.max_message_bytes)?;
        let route = inner.instance.namesrv.route(message.topic()).await?;
        let queue = inner.select_queue(&route, QueueChoice::RoundRobin, None)?;
        let address = master_address(&route, &queue)?;
        inner
            .send_one_way_to(&address, queue.queue_id, &message)
            .await
    }

    /// Sends `message` in a transaction (RocketMQ's `sendMessageInTransaction`): stores it as
    /// a half message, invisible to consumers; runs `local_transaction` with where it was
    /// stored; then commits the message (delivered once), rolls it back (never delivered) or,
    /// for [`TransactionState::Unknown`], leaves it to the broker's check-back, which calls the
    /// group's [`check_local_transaction`](ProducerBuilder::check_local_transaction)
    /// callback. A panicking local transaction counts as `Unknown`. A half message stored
    /// with another status than `SendOk` (a sync master whose replicas do not hold it) is
    /// rolled back without running `local_transaction`, as RocketMQ's producer does.
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
        let (address, sent) = inner.send_half(&message).await?;
        inner.make_known_to(&address).await;
        // As RocketMQ: a half message not stored SEND_OK (a sync master's replicas do not hold
        // it) is rolled back, and the local transaction does not run.
        let state = if sent.status == SendStatus::SendOk {
            run_local_transaction(local_transaction, sent.clone()).await
        } else {
            warn!(msg_id = %sent.msg_id, status = ?sent.status, "the half message was not stored SEND_OK; rolling it back without running the local transaction");
            TransactionState::Rollback
        };
        let end = EndRequest {
            producer_group: &inner.group,
            half_queue_offset: sent.queue_offset,
            half_commit_log_offset: sent.commit_log_offset(),
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
        inner.window.close();
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

/// A send in flight, from [`Producer::send_async`] and its siblings: resolves to the send's
/// result once the broker has answered (after retries), or to the error the plain send would
/// have returned. The send runs on its own task: dropping this future does not cancel it, it
/// only forgoes its result (the send keeps its place in the window until it ends).
#[must_use = "the send goes on without it; await it to learn whether the message was stored"]
pub struct SendFuture<T> {
    task: JoinHandle<Result<T>>,
}

impl<T: Send + 'static> SendFuture<T> {
    fn spawn<F>(send: F) -> Self
    where
        F: Future<Output = Result<T>> + Send + 'static,
    {
        Self {
            task: tokio::spawn(send),
        }
    }
}

impl<T> std::fmt::Debug for SendFuture<T> {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("SendFuture")
            .field("is_finished", &self.task.is_finished())
            .finish()
    }
}

impl<T> Future for SendFuture<T> {
    type Output = Result<T>;

    fn poll(mut self: Pin<&mut Self>, context: &mut Context<'_>) -> Poll<Result<T>> {
        match Pin::new(&mut self.task).poll(context) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(Ok(result)) => Poll::Ready(result),
            Poll::Ready(Err(error)) if error.is_panic() => {
                std::panic::resume_unwind(error.into_panic())
            }
            // Cancelled: the runtime is shutting down.
            Poll::Ready(Err(_)) => Poll::Ready(Err(Error::ShutDown)),
        }
    }
}

/// The result of a send of one message.
fn single(sent: BatchSendResult) -> SendResult {
    sent.into_single()
        .expect("a stored send of one message has one result")
}

/// Refuses a batch over [`MAX_BATCH_MESSAGES`] (an empty one is refused when admitted).
fn check_batch_size(messages: &[Message]) -> Result<()> {
    if messages.len() > MAX_BATCH_MESSAGES {
        return Err(Error::InvalidArgument(format!(
            "batch has {} messages, over MAX_BATCH_MESSAGES ({MAX_BATCH_MESSAGES})",
            messages.len()
        )));
    }
    Ok(())
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
