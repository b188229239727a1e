//! Send requests: a batch of messages to one queue (SendRequest), or one message as a ONE_WAY
//! frame, and the broker's answer.
//!
//! Owns: encoding a [`Message`] as the wire's `Message` table (the half-message request of
//! `transaction.rs` reuses it), reading a send's answer into where each message was stored,
//! and the application's view of a stored send ([`SendResult`], [`SendStatus`], which the
//! producer and the transaction types hand out). Never: choosing the queue or retrying
//! (`producer/`).

use std::time::Duration;

use flatbuffers::{FlatBufferBuilder, WIPOffset};
use shardmq_schema::{wire, VerifiedFrame};

use super::{missing_body, strings};
use crate::error::{Error, Result};
use crate::message::{now_ms, Delay, Message};
use crate::pool::ConnectionPool;
use crate::route::MessageQueue;

/// How a send ended when the message was stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SendStatus {
    /// Stored (and flushed, under sync flush).
    SendOk,
    /// Stored, but the sync flush did not finish in time: may be lost if the broker dies now.
    FlushDiskTimeout,
    /// Stored on the master, the slave did not confirm in time.
    FlushSlaveTimeout,
    /// Stored on the master, no slave to replicate to.
    SlaveNotAvailable,
}

impl SendStatus {
    pub(crate) fn from_wire(status: wire::Status) -> Self {
        match status {
            wire::Status::FLUSH_DISK_TIMEOUT => SendStatus::FlushDiskTimeout,
            wire::Status::FLUSH_SLAVE_TIMEOUT => SendStatus::FlushSlaveTimeout,
            wire::Status::SLAVE_NOT_AVAILABLE => SendStatus::SlaveNotAvailable,
            _ => SendStatus::SendOk,
        }
    }

    /// RocketMQ's name of the status (`SEND_OK`, …).
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            SendStatus::SendOk => "SEND_OK",
            SendStatus::FlushDiskTimeout => "FLUSH_DISK_TIMEOUT",
            SendStatus::FlushSlaveTimeout => "FLUSH_SLAVE_TIMEOUT",
            SendStatus::SlaveNotAvailable => "SLAVE_NOT_AVAILABLE",
        }
    }
}

impl std::fmt::Display for SendStatus {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str(self.as_str())
    }
}

/// Where a sent message was stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SendResult {
    pub status: SendStatus,
    /// The client-generated unique id (the id users see).
    pub msg_id: String,
    /// The broker's offset id (store host and physical offset, hex).
    pub offset_msg_id: String,
    pub queue: MessageQueue,
    /// Index of the message in its queue; -1 for a scheduled message (delay level, delay or
    /// deliver-at time), which gets its index when it is delivered into the queue.
    pub queue_offset: i64,
}

impl SendResult {
    /// The message waits for its delivery time and has no queue offset yet.
    pub fn is_scheduled(&self) -> bool {
        self.queue_offset < 0
    }
}

/// One stored message of a send, as the broker reports it.
#[derive(Debug, Clone)]
pub(crate) struct StoredMessage {
    pub unique_id: String,
    pub offset_msg_id: String,
    pub queue_offset: i64,
    /// Physical offset of the stored record (names a half message when ending a transaction).
    pub commit_log_offset: i64,
}

/// A send's answer: the status (OK or one of the "stored, but" statuses) and where each
/// message went.
#[derive(Debug, Clone)]
pub(crate) struct SendAnswer {
    pub status: wire::Status,
    pub queue_id: u32,
    pub stored: Vec<StoredMessage>,
}

/// The stored outcome of a send (or half-message) answer for `expected` messages, or the
/// broker's refusal as an error.
pub(crate) fn send_answer(
    address: &str,
    frame: &VerifiedFrame,
    expected: usize,
) -> Result<SendAnswer> {
    let header = frame.frame();
    let status = header.status();
    let is_stored = matches!(
        status,
        wire::Status::OK
            | wire::Status::FLUSH_DISK_TIMEOUT
            | wire::Status::FLUSH_SLAVE_TIMEOUT
            | wire::Status::SLAVE_NOT_AVAILABLE
    );
    if !is_stored {
        return Err(Error::from_status(address, status, header.message()));
    }
    let response = header
        .body_as_send_response()
        .ok_or_else(|| missing_body(address, "SendResponse"))?;
    let stored: Vec<StoredMessage> = response
        .results()
        .iter()
        .flat_map(|results| results.iter())
        .map(|result| StoredMessage {
            unique_id: result.unique_id().unwrap_or_default().to_owned(),
            offset_msg_id: result.offset_msg_id().unwrap_or_default().to_owned(),
            queue_offset: result.queue_offset(),
            commit_log_offset: result.commit_log_offset(),
        })
        .collect();
    if stored.len() != expected {
        return Err(Error::UnexpectedResponse {
            address: address.to_owned(),
            detail: format!("{} results for a send of {expected} messages", stored.len()),
        });
    }
    Ok(SendAnswer {
        status,
        queue_id: u32::try_from(response.queue_id()).unwrap_or(0),
        stored,
    })
}

pub(crate) fn encode_message<'b>(
    builder: &mut FlatBufferBuilder<'b>,
    message: &Message,
    born_timestamp_ms: i64,
) -> WIPOffset<wire::Message<'b>> {
    let body = builder.create_vector(message.body());
    let tags = message.tags().map(|tags| builder.create_string(tags));
    let keys = strings(builder, message.keys());
    let unique_id = builder.create_string(message.unique_id());
    let properties = if message.properties().is_empty() {
        None
    } else {
        let pairs: Vec<_> = message
            .properties()
            .iter()
            .map(|(name, value)| {
                let key = builder.create_string(name);
                let value = builder.create_string(value);
                wire::KeyValue::create(
                    builder,
                    &wire::KeyValueArgs {
                        key: Some(key),
                        value: Some(value),
                    },
                )
            })
            .collect();
        Some(builder.create_vector(&pairs))
    };
    let (delay_level, deliver_at_ms, delay_ms) = match message.delay() {
        Delay::None => (0, 0, 0),
        Delay::Level(level) => (i32::try_from(level).unwrap_or(i32::MAX), 0, 0),
        Delay::At(at_ms) => (0, at_ms, 0),
        Delay::After(delay) => (0, 0, i64::try_from(delay.as_millis()).unwrap_or(i64::MAX)),
    };
    wire::Message::create(
        builder,
        &wire::MessageArgs {
            body: Some(body),
            tags,
            keys,
            flag: message.flag(),
            born_timestamp_ms,
            unique_id: Some(unique_id),
            properties,
            delay_level,
            deliver_at_ms,
            delay_ms,
            compression: if message.is_body_compressed() {
                wire::Compression::ZLIB
            } else {
                wire::Compression::NONE
            },
        },
    )
}

fn send_request<'b>(
    builder: &mut FlatBufferBuilder<'b>,
    topic: &str,
    queue_id: Option<u32>,
    producer_group: &str,
    messages: &[Message],
) -> WIPOffset<wire::SendRequest<'b>> {
    let born_timestamp_ms = now_ms();
    let encoded: Vec<_> = messages
        .iter()
        .map(|message| encode_message(builder, message, born_timestamp_ms))
        .collect();
    let messages = builder.create_vector(&encoded);
    let topic = builder.create_string(topic);
    let group = (!producer_group.is_empty()).then(|| builder.create_string(producer_group));
    wire::SendRequest::create(
        builder,
        &wire::SendRequestArgs {
            topic: Some(topic),
            queue_id: queue_id.map_or(-1, |id| id as i32),
            producer_group: group,
            messages: Some(messages),
        },
    )
}

impl ConnectionPool {
    /// Sends `messages` (one topic) to one queue of the broker at `address` (`None`: the
    /// broker picks one) and waits for the answer.
    pub(crate) async fn send_messages(
        &self,
        address: &str,
        timeout: Duration,
        topic: &str,
        queue_id: Option<u32>,
        producer_group: &str,
        messages: &[Message],
    ) -> Result<SendAnswer> {
        let frame = self
            .request(address, "send", timeout, |builder| {
                let request = send_request(builder, topic, queue_id, producer_group, messages);
                (wire::Body::SendRequest, request.as_union_value())
            })
            .await?;
        send_answer(address, &frame, messages.len())
    }

    /// Sends `message` as a ONE_WAY frame: no answer, so no result and no error from the
    /// broker (it stores the message or drops it).
    pub(crate) async fn send_one_way(
        &self,
        address: &str,
        timeout: Duration,
        producer_group: &str,
        message: &Message,
        queue_id: Option<u32>,
    ) -> Result<()> {
        let connection = self.get(address).await?;
        connection
            .one_way(timeout, |builder| {
                let request = send_request(
                    builder,
                    message.topic(),
                    queue_id,
                    producer_group,
                    std::slice::from_ref(message),
                );
                (wire::Body::SendRequest, request.as_union_value())
            })
            .await
    }
}
