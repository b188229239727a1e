//! Send requests of protocol 1: a batch of messages to one queue as wire `Message` tables
//! (SendRequest), or one message as a ONE_WAY frame, and the broker's answer; and the
//! application's view of a stored send, whatever the request.
//!
//! Owns: encoding a [`Message`] as the wire's `Message` table (sends with a delay or a timer,
//! brokers of protocol 1, and the half-message request of `transaction.rs`), reading a send's
//! answer into where each message was stored ([`Stored`]), and the results the producer hands
//! out ([`SendResult`], [`BatchSendResult`], [`SendStatus`]), which format their ids only when
//! asked. The run of records of protocol 2 is `records.rs`. Never: choosing the queue or
//! retrying (`producer/`).

use std::net::SocketAddr;
use std::time::Duration;

use flatbuffers::{FlatBufferBuilder, WIPOffset};
use shardmq_schema::{wire, VerifiedFrame};

use super::{missing_body, strings};
use crate::error::{Error, Result};
use crate::message::{now_ms, Delay, Message};
use crate::message_id::{MessageId, OffsetMessageId};
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
///
/// Compact: the ids are kept as values ([`MessageId`] and the store position) and made into
/// text only when asked ([`msg_id`](Self::msg_id)'s `to_string()`,
/// [`offset_msg_id`](Self::offset_msg_id)).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SendResult {
    pub status: SendStatus,
    /// The client-generated unique id (the id users see).
    pub msg_id: MessageId,
    pub queue: MessageQueue,
    /// Index of the message in its queue; -1 for a scheduled message (delay level, delay or
    /// deliver-at time), which gets its index when it is delivered into the queue.
    pub queue_offset: i64,
    /// Where the broker stored the record: its offset id.
    stored_at: OffsetMessageId,
}

impl SendResult {
    /// The message waits for its delivery time and has no queue offset yet.
    #[must_use]
    pub fn is_scheduled(&self) -> bool {
        self.queue_offset < 0
    }

    /// The broker's offset id (RocketMQ's `offsetMsgId`): store host and physical offset (with
    /// the storage shard in its top byte) as upper-case hex, 32 characters for an IPv4 store
    /// host; exactly what the broker would have answered. A query by id finds the message by
    /// it. For a scheduled message it names the scheduled copy.
    #[must_use]
    pub fn offset_msg_id(&self) -> String {
        self.stored_at.to_string()
    }

    /// Physical offset of the record in its storage shard's CommitLog (the scheduled copy's,
    /// for a scheduled message).
    #[must_use]
    pub fn commit_log_offset(&self) -> i64 {
        self.stored_at.physical_offset as i64
    }

    /// The broker's address as its records name it.
    #[must_use]
    pub fn store_host(&self) -> SocketAddr {
        self.stored_at.store_host
    }
}

/// Where a batch was stored: one queue, the messages one after another. Constant in size
/// however large the batch, but for the ids the client made (16 bytes each) and one physical
/// offset per message; each message's [`SendResult`] is made when asked ([`get`](Self::get),
/// [`iter`](Self::iter), or by iterating the result itself).
///
/// ```no_run
/// # async fn example(producer: shardmq_client::Producer) -> shardmq_client::Result<()> {
/// use shardmq_client::Message;
/// let batch = (0..3).map(|i| Message::new("orders", format!("order {i}"))).collect();
/// let sent = producer.send_batch(batch).await?;
/// println!("{} messages in {} from offset {}", sent.len(), sent.queue, sent.queue_offset(0));
/// for result in &sent {
///     println!("{} at {}", result.msg_id, result.offset_msg_id());
/// }
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchSendResult {
    pub status: SendStatus,
    /// The queue that stored the batch.
    pub queue: MessageQueue,
    /// The messages' unique ids, in the order sent.
    ids: Vec<MessageId>,
    /// Queue offset of the first message; -1 for a scheduled batch.
    first_queue_offset: i64,
    store_host: SocketAddr,
    storage_shard: u32,
    /// Each message's physical offset in its storage shard's CommitLog.
    physical_offsets: Vec<u64>,
}

impl BatchSendResult {
    /// The result of a send whose answer is `stored`, for messages with `ids` sent to `queue`
    /// (whose queue id the broker's answer replaces: it may have chosen it). A message sent
    /// without an id is named by its offset id, as the broker names it.
    pub(crate) fn new(stored: Stored, queue: MessageQueue, mut ids: Vec<MessageId>) -> Self {
        debug_assert_eq!(ids.len(), stored.physical_offsets.len());
        for (id, &physical_offset) in ids.iter_mut().zip(&stored.physical_offsets) {
            if id.is_empty() {
                let offset_id = OffsetMessageId {
                    store_host: stored.store_host,
                    storage_shard: stored.storage_shard,
                    physical_offset,
                };
                *id = MessageId::from(offset_id.to_string());
            }
        }
        Self {
            status: SendStatus::from_wire(stored.status),
            queue: MessageQueue {
                queue_id: stored.queue_id,
                ..queue
            },
            ids,
            first_queue_offset: stored.first_queue_offset,
            store_host: stored.store_host,
            storage_shard: stored.storage_shard,
            physical_offsets: stored.physical_offsets,
        }
    }

    /// How many messages the batch held.
    #[must_use]
    pub fn len(&self) -> usize {
        self.ids.len()
    }

    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    /// The unique ids, in the order sent.
    #[must_use]
    pub fn msg_ids(&self) -> &[MessageId] {
        &self.ids
    }

    /// Whether the batch waits for its delivery time (and has no queue offsets yet).
    #[must_use]
    pub fn is_scheduled(&self) -> bool {
        self.first_queue_offset < 0
    }

    /// Queue offset of message `index` (-1 for a scheduled batch).
    #[must_use]
    pub fn queue_offset(&self, index: usize) -> i64 {
        if self.is_scheduled() {
            -1
        } else {
            self.first_queue_offset + index as i64
        }
    }

    /// Physical offset of message `index`'s record (see [`SendResult::commit_log_offset`]).
    #[must_use]
    pub fn commit_log_offset(&self, index: usize) -> Option<i64> {
        self.physical_offsets
            .get(index)
            .map(|&offset| offset as i64)
    }

    /// The broker's offset id of message `index` (see [`SendResult::offset_msg_id`]).
    #[must_use]
    pub fn offset_msg_id(&self, index: usize) -> Option<String> {
        self.stored_at(index).map(|stored_at| stored_at.to_string())
    }

    fn stored_at(&self, index: usize) -> Option<OffsetMessageId> {
        self.physical_offsets
            .get(index)
            .map(|&physical_offset| OffsetMessageId {
                store_host: self.store_host,
                storage_shard: self.storage_shard,
                physical_offset,
            })
    }

    /// The result of message `index`.
    #[must_use]
    pub fn get(&self, index: usize) -> Option<SendResult> {
        Some(SendResult {
            status: self.status,
            msg_id: self.ids.get(index)?.clone(),
            queue: self.queue.clone(),
            queue_offset: self.queue_offset(index),
            stored_at: self.stored_at(index)?,
        })
    }

    /// Each message's result, in the order sent.
    #[must_use]
    pub fn iter(&self) -> BatchSendResults<'_> {
        BatchSendResults {
            batch: self,
            next: 0,
        }
    }

    /// The result of a batch of one, without copying the queue.
    pub(crate) fn into_single(mut self) -> Option<SendResult> {
        let stored_at = self.stored_at(0)?;
        let queue_offset = self.queue_offset(0);
        let msg_id = self.ids.swap_remove(0);
        Some(SendResult {
            status: self.status,
            msg_id,
            queue: self.queue,
            queue_offset,
            stored_at,
        })
    }
}

/// The results of a batch's messages, made one by one ([`BatchSendResult::iter`]).
#[derive(Debug, Clone)]
pub struct BatchSendResults<'a> {
    batch: &'a BatchSendResult,
    next: usize,
}

impl Iterator for BatchSendResults<'_> {
    type Item = SendResult;

    fn next(&mut self) -> Option<SendResult> {
        let result = self.batch.get(self.next)?;
        self.next += 1;
        Some(result)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let left = self.batch.len().saturating_sub(self.next);
        (left, Some(left))
    }
}

impl ExactSizeIterator for BatchSendResults<'_> {}

impl<'a> IntoIterator for &'a BatchSendResult {
    type Item = SendResult;
    type IntoIter = BatchSendResults<'a>;

    fn into_iter(self) -> Self::IntoIter {
        self.iter()
    }
}

impl IntoIterator for BatchSendResult {
    type Item = SendResult;
    type IntoIter = std::vec::IntoIter<SendResult>;

    fn into_iter(self) -> Self::IntoIter {
        self.iter().collect::<Vec<_>>().into_iter()
    }
}

/// What a broker's answer says about a stored send (any protocol): where each record went.
#[derive(Debug, Clone)]
pub(crate) struct Stored {
    /// OK, or one of the "stored, but" statuses.
    pub status: wire::Status,
    pub queue_id: u32,
    /// -1 for a scheduled send.
    pub first_queue_offset: i64,
    pub store_host: SocketAddr,
    pub storage_shard: u32,
    pub physical_offsets: Vec<u64>,
}

/// Whether `status` says the send was stored (with or without a flush or replica).
pub(crate) fn is_stored(status: wire::Status) -> bool {
    matches!(
        status,
        wire::Status::OK
            | wire::Status::FLUSH_DISK_TIMEOUT
            | wire::Status::FLUSH_SLAVE_TIMEOUT
            | wire::Status::SLAVE_NOT_AVAILABLE
    )
}

fn unexpected(address: &str, detail: String) -> Error {
    Error::UnexpectedResponse {
        address: address.to_owned(),
        detail,
    }
}

/// The stored outcome of a send (or half-message) answer for `expected` messages, or the
/// broker's refusal as an error. The per-message results' offset ids are read back into
/// store host, storage shard and physical offsets.
pub(crate) fn send_answer(address: &str, frame: &VerifiedFrame, expected: usize) -> Result<Stored> {
    let header = frame.frame();
    let status = header.status();
    if !is_stored(status) {
        return Err(Error::from_status(address, status, header.message()));
    }
    let response = header
        .body_as_send_response()
        .ok_or_else(|| missing_body(address, "SendResponse"))?;
    let results = response.results().unwrap_or_default();
    if results.len() != expected || expected == 0 {
        return Err(unexpected(
            address,
            format!(
                "{} results for a send of {expected} messages",
                results.len()
            ),
        ));
    }
    let mut physical_offsets = Vec::with_capacity(expected);
    let mut first: Option<(SocketAddr, u32)> = None;
    for result in results.iter() {
        let text = result.offset_msg_id().unwrap_or_default();
        let stored_at = OffsetMessageId::parse(text)
            .ok_or_else(|| unexpected(address, format!("offset id `{text}` does not parse")))?;
        let place = (stored_at.store_host, stored_at.storage_shard);
        if *first.get_or_insert(place) != place {
            return Err(unexpected(
                address,
                "a batch stored on two storage shards or hosts".to_owned(),
            ));
        }
        physical_offsets.push(stored_at.physical_offset);
    }
    let (store_host, storage_shard) = first.expect("at least one result");
    Ok(Stored {
        status,
        queue_id: u32::try_from(response.queue_id()).unwrap_or(0),
        first_queue_offset: results.get(0).queue_offset(),
        store_host,
        storage_shard,
        physical_offsets,
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
    let unique_id = builder.create_string(&message.unique_id().to_string());
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
    ) -> Result<Stored> {
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
