//! RocketMQ producers of `rocketmq-client-rust` 1.0.0 on a [`ClientHost`]: the plain
//! `DefaultMQProducer` ([`Producer`]: single sends, batches, sends to a chosen queue) and the
//! transactional `TransactionMQProducer` ([`TransactionalProducer`]), each started against one
//! name server and shut down, with a deadline, when dropped.
//!
//! Owns: the producers' set-up (group, name server, send timeout) and one deadline per send.
//! Never: building messages for the tests (they use the client's own `Message::builder()`), or
//! retrying a send the client gave up on: what the broker answered is the test's result.
//!
//! Data enters as `Message`s; it leaves as the client's `SendResult`/`TransactionSendResult`
//! or a [`CallError`].

use std::sync::Arc;

use rocketmq_client_rust::{
    AclClientRPCHook, DefaultMQProducer, SessionCredentials, TransactionListener,
    TransactionMQProducer, TransactionSendResult,
};
pub use rocketmq_model::common::message::message_queue::MessageQueue;
pub use rocketmq_model::common::message::message_single::Message;
pub use rocketmq_model::result::SendResult;

use crate::client::{CallError, ClientHost, REMOTING_TIMEOUT};

/// The send timeout the producers are given (the client's own per-send deadline, retries
/// included): [`REMOTING_TIMEOUT`].
fn send_timeout_millis() -> u32 {
    u32::try_from(REMOTING_TIMEOUT.as_millis()).expect("the send timeout fits in u32 ms")
}

/// A started `DefaultMQProducer` of one producer group.
pub struct Producer {
    producer: Option<DefaultMQProducer>,
    host: Arc<ClientHost>,
    group: String,
}

impl Producer {
    /// Starts a producer of `group` against the name server `namesrv_addr` on `host`.
    pub fn start(
        host: &Arc<ClientHost>,
        namesrv_addr: &str,
        group: &str,
    ) -> Result<Self, CallError> {
        Self::start_with_credentials(host, namesrv_addr, group, None)
    }

    /// Like [`start`](Self::start), signing every request with `credentials` when given
    /// (RocketMQ's ACL 1.0: the client's `AclClientRPCHook`).
    pub fn start_with_credentials(
        host: &Arc<ClientHost>,
        namesrv_addr: &str,
        group: &str,
        credentials: Option<SessionCredentials>,
    ) -> Result<Self, CallError> {
        let mut builder = DefaultMQProducer::builder(host.client_runtime())
            .producer_group(group)
            .name_server_addr(namesrv_addr)
            .send_msg_timeout(send_timeout_millis());
        if let Some(credentials) = credentials {
            builder = builder.rpc_hook(Arc::new(AclClientRPCHook::new(credentials)));
        }
        let mut producer = builder.build();
        let started = host.call(&format!("starting producer {group}"), producer.start());
        let this = Self {
            producer: Some(producer),
            host: Arc::clone(host),
            group: group.to_owned(),
        };
        started.map(|()| this)
    }

    /// Sends `message` synchronously (`SEND_MESSAGE`, 10), to a queue the client picks.
    pub fn send(&self, message: Message) -> Result<SendResult, CallError> {
        let call = format!("producer {} sending to {}", self.group, message.topic());
        let sent = self.host.call(&call, self.producer().send(message))?;
        Ok(sync_result(&call, sent))
    }

    /// Sends `messages`, all of one topic, as one batch (`SEND_BATCH_MESSAGE`, 320).
    pub fn send_batch(&self, messages: Vec<Message>) -> Result<SendResult, CallError> {
        let call = format!(
            "producer {} sending a batch of {}",
            self.group,
            messages.len()
        );
        self.host.call(&call, self.producer().send_batch(messages))
    }

    /// Sends `message` synchronously to its topic's queue `queue_id` of whichever broker the
    /// route lists it for, through a queue selector (RocketMQ's orderly send: one attempt, no
    /// failover to another queue).
    pub fn send_to_queue(&self, message: Message, queue_id: i32) -> Result<SendResult, CallError> {
        let call = format!(
            "producer {} sending to {} queue {queue_id}",
            self.group,
            message.topic()
        );
        let select_queue = |queues: &[MessageQueue], _message: &Message, queue_id: &i32| {
            queues
                .iter()
                .find(|queue| queue.queue_id() == *queue_id)
                .cloned()
        };
        let sent = self.host.call(
            &call,
            self.producer()
                .send_with_selector(message, select_queue, queue_id),
        )?;
        Ok(sync_result(&call, sent))
    }

    fn producer(&self) -> &DefaultMQProducer {
        self.producer.as_ref().expect("a started producer")
    }
}

impl Drop for Producer {
    fn drop(&mut self) {
        if let Some(mut producer) = self.producer.take() {
            self.host
                .shut_down("producer", async move { producer.shutdown().await });
        }
    }
}

/// A started `TransactionMQProducer` of one producer group, with its transaction listener
/// (which both runs the local transaction and answers the broker's check-backs).
pub struct TransactionalProducer {
    producer: Option<TransactionMQProducer>,
    host: Arc<ClientHost>,
    group: String,
}

impl TransactionalProducer {
    /// Starts a transactional producer of `group` against the name server `namesrv_addr` on
    /// `host`, with `listener` as its transaction listener.
    pub fn start(
        host: &Arc<ClientHost>,
        namesrv_addr: &str,
        group: &str,
        listener: impl TransactionListener,
    ) -> Result<Self, CallError> {
        let mut producer = TransactionMQProducer::builder(host.client_runtime())
            .producer_group(group)
            .name_server_addr(namesrv_addr)
            .send_msg_timeout(send_timeout_millis())
            .transaction_listener(listener)
            .build();
        let started = host.call(
            &format!("starting transactional producer {group}"),
            producer.start(),
        );
        let this = Self {
            producer: Some(producer),
            host: Arc::clone(host),
            group: group.to_owned(),
        };
        started.map(|()| this)
    }

    /// Sends `message` as a half message, runs the listener's local transaction and ends the
    /// transaction with its answer (`END_TRANSACTION`, 37, oneway); the result carries that
    /// answer.
    pub fn send_in_transaction(
        &self,
        message: Message,
    ) -> Result<TransactionSendResult, CallError> {
        let call = format!(
            "transactional producer {} sending to {}",
            self.group,
            message.topic()
        );
        let producer = self.producer.as_ref().expect("a started producer");
        self.host.call(
            &call,
            producer.send_message_in_transaction::<(), _>(message, None),
        )
    }
}

impl Drop for TransactionalProducer {
    fn drop(&mut self) {
        if let Some(mut producer) = self.producer.take() {
            self.host.shut_down("transactional producer", async move {
                producer.shutdown().await;
            });
        }
    }
}

/// A sync send's result: 1.0.0 returns `None` only for async and oneway sends.
fn sync_result(call: &str, sent: Option<SendResult>) -> SendResult {
    sent.unwrap_or_else(|| panic!("{call}: a synchronous send returned no result"))
}
