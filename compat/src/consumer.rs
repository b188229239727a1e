//! RocketMQ push consumers of `rocketmq-client-rust` 1.0.0 on a [`ClientHost`]
//! (`DefaultMQPushConsumer`, clustering, with a concurrent or an orderly listener), and the
//! [`Inbox`] their listener records every delivery in, for the test thread to wait on.
//!
//! Owns: the consumers' set-up ([`PushConsumerOptions`]), the listener (record, then answer
//! success or "later" as the options' rule says), and what a delivery looked like to the
//! application ([`Delivery`]). Never: deciding what a test expects; fixed sleeps (waits poll
//! the inbox with a deadline).
//!
//! Data enters as the client's `MessageExt`s, handed to the listener on the client's runtime
//! threads; it leaves as [`Delivery`] copies, read on the test thread.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rocketmq_client_rust::{
    AclClientRPCHook, ClientResult, ConsumeConcurrentlyContext, ConsumeConcurrentlyStatus,
    ConsumeOrderlyContext, ConsumeOrderlyStatus, DefaultMQPushConsumer, MQPushConsumer,
    MessageSelector, SessionCredentials,
};
use rocketmq_model::common::consumer::consume_from_where::ConsumeFromWhere;
use rocketmq_model::common::message::message_ext::MessageExt;
use rocketmq_model::common::message::MessageTrait;
use rocketmq_protocol::protocol::heartbeat::message_model::MessageModel;

use crate::client::{CallError, ClientHost};
use crate::servers::poll_until;

/// The message property holding the id the producer gave a message (RocketMQ's `UNIQ_KEY`).
pub const PROPERTY_UNIQUE_ID: &str = "UNIQ_KEY";

/// The property a retry copy carries: the topic the message was first sent to.
pub const PROPERTY_RETRY_TOPIC: &str = "RETRY_TOPIC";

/// How long an orderly listener asks its queue to be held back after answering "later".
const ORDERLY_SUSPEND_MILLIS: i64 = 1000;

/// Most deliveries a failed wait prints.
const MAX_DELIVERIES_SHOWN: usize = 60;

/// What the listener answered for a delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    /// `CONSUME_SUCCESS` (concurrent) or `SUCCESS` (orderly).
    Consumed,
    /// `RECONSUME_LATER` (concurrent) or `SUSPEND_CURRENT_QUEUE_A_MOMENT` (orderly).
    Later,
}

/// One message as the consumer's listener received it.
#[derive(Debug, Clone)]
pub struct Delivery {
    /// The topic the client reports (for a retry copy, the original topic, as the client sets
    /// it back).
    pub topic: String,
    pub queue_id: i32,
    pub queue_offset: i64,
    pub body: Vec<u8>,
    pub tags: Option<String>,
    pub keys: Option<String>,
    /// Every property the message carried (user and system ones).
    pub properties: BTreeMap<String, String>,
    pub reconsume_times: i32,
    pub store_timestamp_ms: i64,
    /// When the listener saw it.
    pub received_at: Instant,
    pub answer: Answer,
}

impl Delivery {
    fn of(message: &MessageExt, answer: Answer) -> Self {
        Self {
            topic: message.topic().to_string(),
            queue_id: message.queue_id(),
            queue_offset: message.queue_offset(),
            body: message.body().map(|body| body.to_vec()).unwrap_or_default(),
            tags: message.get_tags().map(|tags| tags.to_string()),
            keys: MessageTrait::get_keys(message).map(|keys| keys.to_string()),
            properties: message
                .properties()
                .iter()
                .map(|(name, value)| (name.to_string(), value.to_string()))
                .collect(),
            reconsume_times: message.reconsume_times(),
            store_timestamp_ms: message.store_timestamp(),
            received_at: Instant::now(),
            answer,
        }
    }

    /// The body as UTF-8 text (lossy).
    #[must_use]
    pub fn body_text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The property `name`, if the message carried it.
    #[must_use]
    pub fn property(&self, name: &str) -> Option<&str> {
        self.properties.get(name).map(String::as_str)
    }

    /// The id the producer gave the message (`UNIQ_KEY`).
    #[must_use]
    pub fn unique_id(&self) -> Option<&str> {
        self.property(PROPERTY_UNIQUE_ID)
    }
}

/// Every delivery a consumer's listener saw, in the order it saw them. Cloned handles share it.
#[derive(Debug, Clone, Default)]
pub struct Inbox {
    deliveries: Arc<Mutex<Vec<Delivery>>>,
}

impl Inbox {
    /// A copy of the deliveries so far.
    #[must_use]
    pub fn deliveries(&self) -> Vec<Delivery> {
        self.lock().clone()
    }

    /// Polls the deliveries until `check` returns `Some`, and returns that. Panics, naming
    /// `what` and listing what did arrive, when `timeout` passes first.
    pub fn wait_for<T>(
        &self,
        timeout: Duration,
        what: &str,
        mut check: impl FnMut(&[Delivery]) -> Option<T>,
    ) -> T {
        poll_until(timeout, || check(&self.lock())).unwrap_or_else(|| {
            panic!(
                "timed out after {} ms waiting for {what}; {}",
                timeout.as_millis(),
                describe(&self.lock())
            )
        })
    }

    /// Records the deliveries of one listener call: `answer_later` decides, for each message
    /// given the deliveries before it, whether to answer "later"; the call answers "later" if
    /// any message asks for it (the client redelivers the whole call's messages then).
    fn record(&self, messages: &[&MessageExt], answer_later: Option<&LaterRule>) -> Answer {
        let mut deliveries = self.lock();
        let mut answer = Answer::Consumed;
        let mut received = Vec::with_capacity(messages.len());
        for message in messages {
            let delivery = Delivery::of(message, Answer::Consumed);
            if answer_later.is_some_and(|rule| rule(&delivery, &deliveries)) {
                answer = Answer::Later;
            }
            received.push(delivery);
        }
        deliveries.extend(
            received
                .into_iter()
                .map(|delivery| Delivery { answer, ..delivery }),
        );
        answer
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Delivery>> {
        self.deliveries
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// A summary of `deliveries` for a failure message.
#[must_use]
pub fn describe(deliveries: &[Delivery]) -> String {
    let mut text = format!("{} deliveries", deliveries.len());
    for delivery in deliveries.iter().take(MAX_DELIVERIES_SHOWN) {
        let _ = write!(
            text,
            "\n  {} q{} @{} body {:?} tags {:?} keys {:?} reconsume {} {:?}",
            delivery.topic,
            delivery.queue_id,
            delivery.queue_offset,
            delivery.body_text(),
            delivery.tags,
            delivery.keys,
            delivery.reconsume_times,
            delivery.answer
        );
    }
    if deliveries.len() > MAX_DELIVERIES_SHOWN {
        let _ = write!(text, "\n  …");
    }
    text
}

/// Whether the listener answers "later" to a delivery, given the deliveries before it.
pub type LaterRule = Arc<dyn Fn(&Delivery, &[Delivery]) -> bool + Send + Sync>;

/// How a [`PushConsumer`] is set up: its group, its one subscription, its listener.
///
/// Every consumer is a clustering consumer that starts, in queues its group has no offset for,
/// at the first message (`CONSUME_FROM_FIRST_OFFSET`): the tests' messages are then received
/// whether they were sent before or after the consumer got its queues.
#[derive(Clone)]
pub struct PushConsumerOptions {
    group: String,
    topic: String,
    expression: String,
    /// `expression` is a SQL92 one (`MessageSelector::by_sql`), not tags.
    is_sql: bool,
    is_orderly: bool,
    answer_later: Option<LaterRule>,
    /// Signs every request (RocketMQ's ACL 1.0: the client's `AclClientRPCHook`).
    credentials: Option<SessionCredentials>,
}

impl PushConsumerOptions {
    /// A consumer of `group` subscribed to `topic` with the tag expression `expression` (`*`,
    /// `TagA`, `TagA || TagB`), with a concurrent listener that consumes everything.
    #[must_use]
    pub fn new(group: &str, topic: &str, expression: &str) -> Self {
        Self {
            group: group.to_owned(),
            topic: topic.to_owned(),
            expression: expression.to_owned(),
            is_sql: false,
            is_orderly: false,
            answer_later: None,
            credentials: None,
        }
    }

    /// Signing every request with `credentials` (RocketMQ's ACL 1.0).
    #[must_use]
    pub fn credentials(mut self, credentials: SessionCredentials) -> Self {
        self.credentials = Some(credentials);
        self
    }

    /// Subscribed with the SQL92 expression `expression` over message properties
    /// (`MessageSelector::by_sql`) instead of a tag expression.
    #[must_use]
    pub fn sql(mut self) -> Self {
        self.is_sql = true;
        self
    }

    /// With an orderly listener (`MessageListenerOrderly`) instead: the client locks its
    /// queues at the broker and hands each queue's messages over one call at a time.
    #[must_use]
    pub fn orderly(mut self) -> Self {
        self.is_orderly = true;
        self
    }

    /// The listener answers "later" to a delivery when `rule` says so (given the deliveries
    /// before it), and consumes it otherwise.
    #[must_use]
    pub fn answer_later_when(
        mut self,
        rule: impl Fn(&Delivery, &[Delivery]) -> bool + Send + Sync + 'static,
    ) -> Self {
        self.answer_later = Some(Arc::new(rule));
        self
    }
}

/// A started `DefaultMQPushConsumer` whose listener records into an [`Inbox`].
pub struct PushConsumer {
    consumer: Option<DefaultMQPushConsumer>,
    host: Arc<ClientHost>,
    inbox: Inbox,
    group: String,
}

impl PushConsumer {
    /// Subscribes and starts a consumer set up by `options` against the name server
    /// `namesrv_addr` on `host`.
    pub fn start(
        host: &Arc<ClientHost>,
        namesrv_addr: &str,
        options: PushConsumerOptions,
    ) -> Result<Self, CallError> {
        let PushConsumerOptions {
            group,
            topic,
            expression,
            is_sql,
            is_orderly,
            answer_later,
            credentials,
        } = options;
        let mut builder = DefaultMQPushConsumer::builder(host.client_runtime())
            .consumer_group(group.as_str())
            .name_server_addr(namesrv_addr)
            .message_model(MessageModel::Clustering)
            .consume_from_where(ConsumeFromWhere::ConsumeFromFirstOffset)
            .consume_message_batch_max_size(1);
        if let Some(credentials) = credentials {
            builder = builder.rpc_hook(Some(Arc::new(AclClientRPCHook::new(credentials))));
        }
        let mut consumer = builder.build();
        let inbox = Inbox::default();
        let what = format!("consumer {group} subscribing to {topic} ({expression})");
        if is_sql {
            host.call(
                &what,
                consumer.subscribe_with_selector(
                    topic.as_str(),
                    Some(MessageSelector::by_sql(expression.as_str())),
                ),
            )?;
        } else {
            host.call(
                &what,
                consumer.subscribe(topic.as_str(), expression.as_str()),
            )?;
        }
        let recorder = inbox.clone();
        if is_orderly {
            consumer.register_message_listener_orderly(
                move |messages: &[&MessageExt],
                      context: &mut ConsumeOrderlyContext|
                      -> ClientResult<ConsumeOrderlyStatus> {
                    match recorder.record(messages, answer_later.as_ref()) {
                        Answer::Consumed => Ok(ConsumeOrderlyStatus::Success),
                        Answer::Later => {
                            context.set_suspend_current_queue_time_millis(ORDERLY_SUSPEND_MILLIS);
                            Ok(ConsumeOrderlyStatus::SuspendCurrentQueueAMoment)
                        }
                    }
                },
            );
        } else {
            consumer.register_message_listener_concurrently(
                move |messages: &[&MessageExt],
                      _context: &ConsumeConcurrentlyContext|
                      -> ClientResult<ConsumeConcurrentlyStatus> {
                    match recorder.record(messages, answer_later.as_ref()) {
                        Answer::Consumed => Ok(ConsumeConcurrentlyStatus::ConsumeSuccess),
                        Answer::Later => Ok(ConsumeConcurrentlyStatus::ReconsumeLater),
                    }
                },
            );
        }
        let started = host.call(&format!("starting consumer {group}"), consumer.start());
        let this = Self {
            consumer: Some(consumer),
            host: Arc::clone(host),
            inbox,
            group,
        };
        started.map(|()| this)
    }

    /// What the listener has received.
    #[must_use]
    pub fn inbox(&self) -> &Inbox {
        &self.inbox
    }

    /// The queue ids of `topic` the consumer holds right now (its rebalance's result, as the
    /// client's running info reports it).
    pub fn assigned_queues(&self, topic: &str) -> Result<BTreeSet<i32>, CallError> {
        let consumer = self.consumer.as_ref().expect("a started consumer");
        let info = self.host.call(
            &format!("consumer {} reporting its queues", self.group),
            consumer.consumer_running_info(),
        )?;
        Ok(info
            .mq_table
            .keys()
            .filter(|queue| queue.topic().as_str() == topic)
            .map(|queue| queue.queue_id())
            .collect())
    }
}

impl Drop for PushConsumer {
    fn drop(&mut self) {
        if let Some(mut consumer) = self.consumer.take() {
            self.host
                .shut_down("push consumer", async move { consumer.shutdown().await });
        }
    }
}
