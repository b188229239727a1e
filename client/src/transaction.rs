//! Transactional messages, client side (RocketMQ's TransactionMQProducer): the types of
//! [`Producer::send_in_transaction`](crate::Producer::send_in_transaction) and of the
//! `check_local_transaction` callback, the two requests (SendHalfRequest,
//! EndTransactionRequest), and the answer to a broker's check-back.
//!
//! Owns: encoding those requests and decoding their answers, and serving the broker's
//! CheckTransactionStateRequest (decode the half message, run the group's callback on a task of
//! its own, answer with its state). Never: choosing a broker or retrying (`producer/`).

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use shardmq_schema::{build_frame, wire, FrameEncoder, FrameHeader, VerifiedFrame};
use tracing::warn;

use crate::api::{encode_message, SendResult, Stored};
use crate::connection::{RequestHandler, ServerAnswer};
use crate::error::Result;
use crate::message::{now_ms, Message, MessageExt};
use crate::pool::ConnectionPool;
use crate::record::decode_records;

/// Properties naming the real topic and queue of a half message (as the broker stores it).
use shardmq_codec::{PROPERTY_REAL_QUEUE_ID, PROPERTY_REAL_TOPIC};

/// How a local transaction ended, or what a check-back found (RocketMQ's
/// `LocalTransactionState`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TransactionState {
    /// Deliver the message to its consumers (once).
    Commit,
    /// Drop the message: it is never delivered.
    Rollback,
    /// Not known yet: the broker asks the producer group again later (after its
    /// `transaction_timeout_ms`, every `transaction_check_interval_ms`, at most
    /// `transaction_check_max` times, then drops the message).
    Unknown,
}

impl TransactionState {
    fn to_wire(self) -> wire::TransactionResolution {
        match self {
            TransactionState::Commit => wire::TransactionResolution::COMMIT,
            TransactionState::Rollback => wire::TransactionResolution::ROLLBACK,
            TransactionState::Unknown => wire::TransactionResolution::UNKNOWN,
        }
    }
}

/// The future a transaction callback returns.
pub type TransactionFuture = Pin<Box<dyn Future<Output = TransactionState> + Send + 'static>>;

/// The `check_local_transaction` callback of a producer group.
pub(crate) type CheckFn = Arc<dyn Fn(MessageExt) -> TransactionFuture + Send + Sync>;

/// What [`Producer::send_in_transaction`](crate::Producer::send_in_transaction) did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TransactionSendResult {
    /// Where the half message was stored: `queue` is the queue the message is committed to,
    /// `queue_offset` the half message's offset in the broker's half queue, `msg_id` the id
    /// the committed message will carry.
    pub send_result: SendResult,
    /// What the local transaction decided.
    pub state: TransactionState,
    /// Whether the broker confirmed the end of the transaction. When false (the end request
    /// failed), the broker learns the outcome by checking back with the producer group.
    pub is_end_confirmed: bool,
}

/// Runs a local transaction (or check) future on a task of its own: a panic counts as
/// [`TransactionState::Unknown`], as an exception does in RocketMQ.
pub(crate) async fn run_guarded<Fut>(future: Fut, what: &'static str) -> TransactionState
where
    Fut: Future<Output = TransactionState> + Send + 'static,
{
    match tokio::spawn(future).await {
        Ok(state) => state,
        Err(error) => {
            warn!(%error, "the {what} panicked; the transaction state is unknown");
            TransactionState::Unknown
        }
    }
}

/// Calls a local transaction closure, counting a panic as [`TransactionState::Unknown`].
pub(crate) async fn run_local_transaction<F, Fut>(
    local_transaction: F,
    sent: SendResult,
) -> TransactionState
where
    F: FnOnce(SendResult) -> Fut,
    Fut: Future<Output = TransactionState> + Send + 'static,
{
    match std::panic::catch_unwind(AssertUnwindSafe(|| local_transaction(sent))) {
        Ok(future) => run_guarded(future, "local transaction").await,
        Err(_) => {
            warn!("the local transaction panicked; the transaction state is unknown");
            TransactionState::Unknown
        }
    }
}

/// Names a half message when ending its transaction.
#[derive(Debug, Clone)]
pub(crate) struct EndRequest<'a> {
    pub producer_group: &'a str,
    pub half_queue_offset: i64,
    pub half_commit_log_offset: i64,
    pub unique_id: &'a crate::message_id::MessageId,
    pub state: TransactionState,
}

impl ConnectionPool {
    /// Stores `message` as a half message of `producer_group` at the broker at `address`, for
    /// `queue_id` of its topic (`None`: the broker picks one).
    pub(crate) async fn send_half(
        &self,
        address: &str,
        timeout: Duration,
        queue_id: Option<u32>,
        producer_group: &str,
        message: &Message,
    ) -> Result<Stored> {
        let frame = self
            .request(address, "send half message", timeout, |builder| {
                let encoded = encode_message(builder, message, now_ms());
                let messages = builder.create_vector(&[encoded]);
                let topic = builder.create_string(message.topic());
                let group = builder.create_string(producer_group);
                let request = wire::SendHalfRequest::create(
                    builder,
                    &wire::SendHalfRequestArgs {
                        topic: Some(topic),
                        queue_id: queue_id.map_or(-1, |id| id as i32),
                        producer_group: Some(group),
                        messages: Some(messages),
                    },
                );
                (wire::Body::SendHalfRequest, request.as_union_value())
            })
            .await?;
        crate::api::send_answer(address, &frame, 1)
    }

    /// Tells the broker at `address` how a transaction ended.
    pub(crate) async fn end_transaction(
        &self,
        address: &str,
        timeout: Duration,
        end: &EndRequest<'_>,
    ) -> Result<()> {
        let frame = self
            .request(address, "end transaction", timeout, |builder| {
                let group = builder.create_string(end.producer_group);
                let unique_id = builder.create_string(&end.unique_id.to_string());
                let request = wire::EndTransactionRequest::create(
                    builder,
                    &wire::EndTransactionRequestArgs {
                        producer_group: Some(group),
                        half_queue_offset: end.half_queue_offset,
                        half_commit_log_offset: end.half_commit_log_offset,
                        unique_id: Some(unique_id),
                        resolution: end.state.to_wire(),
                        is_from_check: false,
                    },
                );
                (wire::Body::EndTransactionRequest, request.as_union_value())
            })
            .await?;
        crate::api::require_ok(address, frame).map(|_| ())
    }
}

/// Serves the broker's check-backs for `group` with `check`.
pub(crate) fn check_back_handler(group: String, check: CheckFn) -> RequestHandler {
    Arc::new(move |frame: VerifiedFrame| {
        let header = frame.frame();
        let request = header.body_as_check_transaction_state_request()?;
        let request_id = header.request_id();
        let message = request
            .records()
            .map(|records| {
                frame
                    .share(records.bytes())
                    .unwrap_or_else(|| Bytes::copy_from_slice(records.bytes()))
            })
            .and_then(|bytes| decode_records(&bytes, "").ok())
            .and_then(|messages| messages.into_iter().next())
            .map(as_real_message);
        if request.producer_group() != Some(group.as_str()) {
            warn!(asked = ?request.producer_group(), %group, "a check-back for another producer group; answering unknown");
        }
        let is_for_us = request.producer_group() == Some(group.as_str());
        let check = Arc::clone(&check);
        Some(Box::pin(async move {
            let state = match message {
                Some(message) if is_for_us => {
                    run_guarded(check(message), "transaction check").await
                }
                _ => TransactionState::Unknown,
            };
            check_answer(request_id, state)
        }) as ServerAnswer)
    })
}

/// The half message as the application sent it: its real topic and queue.
fn as_real_message(mut message: MessageExt) -> MessageExt {
    if let Some(topic) = message.property(PROPERTY_REAL_TOPIC).map(str::to_owned) {
        message.set_topic(&topic);
    }
    if let Some(queue_id) = message
        .property(PROPERTY_REAL_QUEUE_ID)
        .and_then(|q| q.parse().ok())
    {
        message.queue_id = queue_id;
    }
    message
}

fn check_answer(request_id: u64, state: TransactionState) -> Option<Bytes> {
    FrameEncoder::new()
        .encode(|b| {
            let body = wire::CheckTransactionStateResponse::create(
                b,
                &wire::CheckTransactionStateResponseArgs {
                    resolution: state.to_wire(),
                },
            );
            build_frame(
                b,
                &FrameHeader::response(request_id, wire::Status::OK),
                wire::Body::CheckTransactionStateResponse,
                Some(body.as_union_value()),
            )
        })
        .ok()
}
