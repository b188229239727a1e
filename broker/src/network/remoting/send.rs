//! A RocketMQ producer's sends: SEND_MESSAGE (10, long header names), SEND_MESSAGE_V2 (310,
//! one-letter names) and SEND_BATCH_MESSAGE (320, a body of concatenated messages) are stored
//! by the native send's own path (`produce::store_send`: topic checks, auto-create, delay
//! levels and timers, the stored record, replication), reading each message straight from the
//! remoting frame (`SendMessage`), and are answered with RocketMQ's send header: the offset
//! message id (comma-joined for a batch), the queue and the first queue offset.
//!
//! RocketMQ keeps what ShardMQ has fields for in properties; they move to those fields: `TAGS`,
//! `KEYS` (space-separated), `UNIQ_KEY`, `DELAY` (a level), `TIMER_DELIVER_MS`,
//! `TIMER_DELAY_SEC`/`TIMER_DELAY_MS`. `WAIT` is dropped (the broker's flush mode decides).
//! A transactional half message (`TRAN_MSG`, sys flag PREPARED) becomes a native
//! `SendHalfRequest` of its producer group (`PGROUP`); its answer's queue offset is the half
//! message's, which END_TRANSACTION names it by (`transaction.rs`). The other properties are
//! stored as the message's properties; RocketMQ's reserved names that a client may not set are
//! refused by the native check, naming the property.

use shardmq_remoting::codes::{message_sys_flag, request, response};
use shardmq_remoting::{parse_properties, BatchMessages, RemotingCommand};
use shardmq_schema::wire;

use super::dispatch::{native_answer, native_request, required, Answer, Reply};
use crate::msgid::push_offset_message_id;
use crate::naming::{check_group_name, check_topic_name, RETRY_TOPIC_PREFIX};
use crate::network::produce::{self as native, SendMessage, StoredSend};
use crate::network::request::{refuse, Connection, Refusal};
use crate::network::send_back::{store_copy, CopyOf, Redelivery, DEFAULT_MAX_RECONSUME_TIMES};
use crate::network::NetworkShard;
use crate::store::record::SYS_FLAG_COMPRESSED;

/// Bits 8..10 of a message's sys flag: the compression of a compressed body.
const COMPRESSION_TYPE_SHIFT: i32 = 8;
const COMPRESSION_TYPE_MASK: i32 = 0x7 << COMPRESSION_TYPE_SHIFT;

/// One message of a send, as the native `Message` table takes it.
#[derive(Default)]
struct Outgoing<'a> {
    body: &'a [u8],
    flag: i32,
    born_timestamp_ms: i64,
    tags: Option<&'a str>,
    keys: Vec<&'a str>,
    unique_id: Option<&'a str>,
    delay_level: i32,
    deliver_at_ms: i64,
    delay_ms: i64,
    compression: wire::Compression,
    properties: Vec<(&'a str, &'a str)>,
    /// `TRAN_MSG` is true: a half message.
    is_transactional: bool,
    /// `PGROUP`: a half message's producer group.
    producer_group: Option<&'a str>,
    /// `RETRY_TOPIC`: the topic a message sent to a retry topic was first sent to.
    retry_topic: Option<&'a str>,
    /// `ORIGIN_MESSAGE_ID`, `RECONSUME_TIME`, `MAX_RECONSUME_TIMES` of such a message.
    origin_message_id: Option<&'a str>,
    reconsume_time: Option<i64>,
    max_reconsume_times: Option<i64>,
}

pub(super) async fn send(
    shard: &NetworkShard,
    connection: &Connection,
    command: &RemotingCommand,
) -> Answer {
    let header = Header::of(command);
    let topic = header.required("topic", "b")?;
    let producer_group = header.optional("producerGroup", "a").unwrap_or_default();
    let queue_id = header
        .optional("queueId", "e")
        .map(|id| id.parse::<i32>())
        .transpose()
        .map_err(|_| refuse(wire::Status::INVALID_ARGUMENT, "queueId is not an integer"))?
        .unwrap_or(-1);
    let sys_flag = i32::try_from(header.number("sysFlag", "f")?).unwrap_or(0);
    let compression = compression_of(sys_flag)?;
    let born_timestamp_ms = header.number("bornTimestamp", "g")?;
    let batch_bodies: Vec<shardmq_remoting::BatchMessage>;
    let header_properties = header.optional("properties", "i").unwrap_or_default();
    let mut messages = Vec::new();
    if command.code == request::SEND_BATCH_MESSAGE {
        batch_bodies = BatchMessages::new(command.body.clone())
            .collect::<Result<_, _>>()
            .map_err(|bad| refuse(wire::Status::INVALID_ARGUMENT, bad.to_string()))?;
        for message in &batch_bodies {
            let mut outgoing = outgoing(&message.properties)?;
            outgoing.body = &message.body;
            outgoing.flag = message.flag;
            outgoing.born_timestamp_ms = born_timestamp_ms;
            outgoing.compression = compression;
            messages.push(outgoing);
        }
    } else {
        let mut outgoing = outgoing(header_properties.as_bytes())?;
        outgoing.body = &command.body;
        outgoing.flag = i32::try_from(header.number("flag", "h")?).unwrap_or(0);
        outgoing.born_timestamp_ms = born_timestamp_ms;
        outgoing.compression = compression;
        messages.push(outgoing);
    }
    let is_half = sys_flag & message_sys_flag::TRANSACTION_TYPE_MASK
        == message_sys_flag::TRANSACTION_PREPARED_TYPE
        || messages.iter().any(|message| message.is_transactional);
    if is_half {
        if messages.len() != 1 {
            return Err(refuse(
                wire::Status::INVALID_ARGUMENT,
                "a transactional message is sent alone, not in a batch",
            ));
        }
        let group = messages[0].producer_group.unwrap_or(producer_group);
        let half = Half {
            topic,
            queue_id,
            producer_group: group,
        };
        return send_half(shard, connection, command, half, &messages[0]).await;
    }
    if let Some(group) = topic.strip_prefix(RETRY_TOPIC_PREFIX) {
        let properties = if command.code == request::SEND_BATCH_MESSAGE {
            None
        } else {
            Some(header_properties.as_bytes())
        };
        let retry = RetrySend {
            group,
            header: &header,
            properties,
        };
        return send_retry(shard, connection, command, retry, &messages).await;
    }
    // Stored as a native send stores its messages, straight from the remoting frame's bytes.
    let stored = native::store_send(
        shard,
        connection,
        topic,
        queue_id,
        Some(producer_group),
        &messages,
    )
    .await?;
    Ok(stored_reply(shard, command, &stored))
}

/// RocketMQ's send header for a stored send: the offset message id of every message
/// (comma-joined), the queue, and the first message's queue offset.
fn stored_reply(shard: &NetworkShard, command: &RemotingCommand, stored: &StoredSend) -> Reply {
    let store_host = shard.store_host.get();
    let mut offset_ids = String::with_capacity(stored.outcome.records.len() * 33);
    for record in &stored.outcome.records {
        if !offset_ids.is_empty() {
            offset_ids.push(',');
        }
        push_offset_message_id(
            &mut offset_ids,
            store_host,
            stored.placement.storage,
            record.physical_offset,
        );
    }
    // A delayed or timer message has no place in its queue until it is delivered there; the
    // header needs a number that is not negative (RocketMQ gives the schedule queue's).
    let queue_offset = match stored.outcome.records.first() {
        Some(record) if !stored.placement.is_scheduled => record.queue_offset,
        _ => 0,
    };
    let (status, message) = native::append_status(&stored.outcome);
    let mut reply = Reply::to(command, super::dispatch::response_code(status))
        .with_ext("msgId", offset_ids)
        .with_ext("queueId", stored.placement.queue_id)
        .with_ext("queueOffset", queue_offset);
    if !message.is_empty() {
        reply.command.remark = Some(message.to_owned());
    }
    reply
}

impl SendMessage for Outgoing<'_> {
    fn body(&self) -> &[u8] {
        self.body
    }
    fn tags(&self) -> Option<&str> {
        self.tags
    }
    fn keys(&self) -> impl Iterator<Item = &str> {
        self.keys.iter().copied()
    }
    fn unique_id(&self) -> Option<&str> {
        self.unique_id
    }
    fn user_properties(&self) -> impl Iterator<Item = (&str, &str)> {
        self.properties.iter().copied()
    }
    fn flag(&self) -> i32 {
        self.flag
    }
    fn born_timestamp_ms(&self) -> i64 {
        self.born_timestamp_ms
    }
    fn is_compressed(&self) -> bool {
        self.compression != wire::Compression::NONE
    }
    fn delay_level(&self) -> i32 {
        self.delay_level
    }
    fn deliver_at_ms(&self) -> i64 {
        self.deliver_at_ms
    }
    fn delay_ms(&self) -> i64 {
        self.delay_ms
    }
}

/// A send to `%RETRY%<group>`: what a RocketMQ consumer does itself when its
/// CONSUMER_SEND_MSG_BACK fails (the message with `RETRY_TOPIC`, `ORIGIN_MESSAGE_ID`,
/// `RECONSUME_TIME` one above its deliveries, `MAX_RECONSUME_TIMES` and `DELAY` set).
struct RetrySend<'a> {
    group: &'a str,
    header: &'a Header<'a>,
    /// The raw properties of a single send (`None` for a batch, which is refused).
    properties: Option<&'a [u8]>,
}

/// Stores a retry send as the native send-back stores its copy (`send_back::store_copy`):
/// through the delay level it names to the group's retry topic, or to its dead letters past
/// its redeliveries, with the retry bookkeeping rewritten by the broker.
async fn send_retry(
    shard: &NetworkShard,
    connection: &Connection,
    command: &RemotingCommand,
    retry: RetrySend<'_>,
    messages: &[Outgoing<'_>],
) -> Answer {
    let (Some(raw_properties), [message]) = (retry.properties, messages) else {
        return Err(refuse(
            wire::Status::INVALID_ARGUMENT,
            "a message for a retry topic is sent alone, not in a batch",
        ));
    };
    let original_topic = message.retry_topic.ok_or_else(|| {
        refuse(
            wire::Status::NO_PERMISSION,
            format!(
                "{RETRY_TOPIC_PREFIX}{} is the group's retry topic: a message sent to it must carry RETRY_TOPIC (the topic it was first sent to)",
                retry.group
            ),
        )
    })?;
    check_group_name(retry.group).map_err(|why| refuse(wire::Status::INVALID_ARGUMENT, why))?;
    check_topic_name(original_topic).map_err(|why| {
        refuse(
            wire::Status::INVALID_ARGUMENT,
            format!("RETRY_TOPIC: {why}"),
        )
    })?;
    // RECONSUME_TIME (or the header's reconsumeTimes) is one above the deliveries so far.
    let reconsume_time = match message.reconsume_time {
        Some(times) => times,
        None => retry.header.number("reconsumeTimes", "j")?,
    };
    let max_reconsume_times = match message.max_reconsume_times {
        Some(times) => times,
        None => retry.header.number("maxReconsumeTimes", "l")?,
    };
    let properties = parse_properties(raw_properties)
        .map_err(|bad| refuse(wire::Status::INVALID_ARGUMENT, bad.to_string()))?;
    let kept: Vec<(&str, &str)> = properties
        .iter()
        .filter(|(name, _)| !matches!(*name, "WAIT" | "TRAN_MSG" | "PGROUP"))
        .collect();
    let copy_of = CopyOf {
        delivered_times: i32::try_from(reconsume_time.saturating_sub(1).max(0)).unwrap_or(i32::MAX),
        original_topic,
        origin_id: message
            .origin_message_id
            .or(message.unique_id)
            .unwrap_or_default(),
        unique_id: message.unique_id,
        properties: kept,
        flag: message.flag,
        body: message.body,
        sys_flag: if message.compression == wire::Compression::NONE {
            0
        } else {
            SYS_FLAG_COMPRESSED
        },
        born_timestamp_ms: message.born_timestamp_ms,
        born_host: connection.peer,
    };
    let redelivery = Redelivery {
        group: retry.group,
        delay_level: message.delay_level.max(0),
        max_reconsume_times: match i32::try_from(max_reconsume_times).unwrap_or(i32::MAX) {
            times if times > 0 => times,
            _ => DEFAULT_MAX_RECONSUME_TIMES,
        },
    };
    let (_, stored) = store_copy(shard, &redelivery, &copy_of)
        .await
        .map_err(|error| refuse(error.status, error.message))?;
    let mut offset_id = String::new();
    if let Some((storage, physical_offset)) = stored {
        push_offset_message_id(
            &mut offset_id,
            shard.store_host.get(),
            storage,
            physical_offset,
        );
    }
    Ok(Reply::to(command, response::SUCCESS)
        .with_ext("msgId", offset_id)
        .with_ext("queueId", 0)
        .with_ext("queueOffset", 0))
}

/// Where a half message goes.
struct Half<'a> {
    topic: &'a str,
    queue_id: i32,
    producer_group: &'a str,
}

/// A transactional half message: stored in the half queue until its producer ends it.
async fn send_half(
    shard: &NetworkShard,
    connection: &Connection,
    command: &RemotingCommand,
    half: Half<'_>,
    message: &Outgoing<'_>,
) -> Answer {
    let request = native_request(shard, |b| {
        let topic = b.create_string(half.topic);
        let producer_group = b.create_string(half.producer_group);
        let message = build_message(b, message);
        let messages = b.create_vector(&[message]);
        let body = wire::SendHalfRequest::create(
            b,
            &wire::SendHalfRequestArgs {
                topic: Some(topic),
                queue_id: half.queue_id,
                producer_group: Some(producer_group),
                messages: Some(messages),
            },
        );
        (wire::Body::SendHalfRequest, body.as_union_value())
    })?;
    let request = request
        .frame()
        .body_as_send_half_request()
        .expect("built as a half message");
    let answer = native_answer(
        shard,
        crate::network::transaction::handle_send_half(shard, connection, 0, request).await,
    )?;
    let mut reply = send_reply(command, &answer);
    if let Some(unique_id) = message.unique_id {
        reply = reply.with_ext("transactionId", unique_id);
    }
    Ok(reply)
}

/// RocketMQ's send header from the native send answer `answer`.
fn send_reply(command: &RemotingCommand, answer: &shardmq_schema::VerifiedFrame) -> Reply {
    let frame = answer.frame();
    let sent = frame.body_as_send_response();
    let results = sent.and_then(|sent| sent.results()).unwrap_or_default();
    let offset_ids: Vec<&str> = results
        .iter()
        .map(|result| result.offset_msg_id().unwrap_or_default())
        .collect();
    // A delayed or timer message has no place in its queue until it is delivered there; the
    // header needs a number that is not negative (RocketMQ gives the schedule queue's).
    let queue_offset = results.iter().next().map_or(0, |r| r.queue_offset().max(0));
    let mut reply = Reply::to(command, super::dispatch::response_code(frame.status()))
        .with_ext("msgId", offset_ids.join(","))
        .with_ext("queueId", sent.map_or(-1, |sent| sent.queue_id()))
        .with_ext("queueOffset", queue_offset);
    if let Some(message) = frame.message().filter(|m| !m.is_empty()) {
        reply.command.remark = Some(message.to_owned());
    }
    reply
}

/// The send header's fields, by their long names (SEND_MESSAGE) or their letters (V2, batch).
struct Header<'a> {
    command: &'a RemotingCommand,
    is_short: bool,
}

impl<'a> Header<'a> {
    fn of(command: &'a RemotingCommand) -> Self {
        Self {
            command,
            is_short: command.code != request::SEND_MESSAGE,
        }
    }

    fn optional(&self, long: &str, letter: &str) -> Option<&'a str> {
        self.command.ext(if self.is_short { letter } else { long })
    }

    fn required(&self, long: &str, letter: &str) -> Result<&'a str, Refusal> {
        required(self.command, if self.is_short { letter } else { long })
            .map_err(|refusal| refuse(refusal.status, format!("{} ({long})", refusal.message)))
    }

    /// A numeric field; absent reads as 0.
    fn number(&self, long: &str, letter: &str) -> Result<i64, Refusal> {
        self.optional(long, letter)
            .map(|value| {
                value.parse::<i64>().map_err(|_| {
                    refuse(
                        wire::Status::INVALID_ARGUMENT,
                        format!("send header field {long} is {value:?}, not an integer"),
                    )
                })
            })
            .transpose()
            .map(Option::unwrap_or_default)
    }
}

fn compression_of(sys_flag: i32) -> Result<wire::Compression, Refusal> {
    if sys_flag & message_sys_flag::COMPRESSED == 0 {
        return Ok(wire::Compression::NONE);
    }
    match (sys_flag & COMPRESSION_TYPE_MASK) >> COMPRESSION_TYPE_SHIFT {
        // RocketMQ reads 0 as ZLIB, its default.
        0 | 3 => Ok(wire::Compression::ZLIB),
        1 => Ok(wire::Compression::LZ4),
        2 => Ok(wire::Compression::ZSTD),
        other => Err(refuse(
            wire::Status::INVALID_ARGUMENT,
            format!("compression type {other} in sysFlag is not one RocketMQ defines"),
        )),
    }
}

/// What a message's properties say, moved to the fields ShardMQ keeps them in.
fn outgoing(properties: &[u8]) -> Result<Outgoing<'_>, Refusal> {
    let properties = parse_properties(properties)
        .map_err(|bad| refuse(wire::Status::INVALID_ARGUMENT, bad.to_string()))?;
    let mut message = Outgoing::default();
    let number = |name: &str, value: &str| {
        value.parse::<i64>().map_err(|_| {
            refuse(
                wire::Status::INVALID_ARGUMENT,
                format!("property {name} is {value:?}, not an integer"),
            )
        })
    };
    for (name, value) in properties.iter() {
        match name {
            "TAGS" => message.tags = Some(value).filter(|tags| !tags.is_empty()),
            "KEYS" => message.keys = value.split(' ').filter(|key| !key.is_empty()).collect(),
            "UNIQ_KEY" => message.unique_id = Some(value),
            "DELAY" => {
                message.delay_level = i32::try_from(number(name, value)?).unwrap_or(i32::MAX)
            }
            "TIMER_DELIVER_MS" => message.deliver_at_ms = number(name, value)?,
            "TIMER_DELAY_SEC" => {
                message.delay_ms = number(name, value)?.saturating_mul(1000);
            }
            "TIMER_DELAY_MS" => message.delay_ms = number(name, value)?,
            "TRAN_MSG" => message.is_transactional = value.eq_ignore_ascii_case("true"),
            "PGROUP" => message.producer_group = Some(value),
            "RETRY_TOPIC" => message.retry_topic = Some(value),
            "ORIGIN_MESSAGE_ID" => message.origin_message_id = Some(value),
            "RECONSUME_TIME" => message.reconsume_time = Some(number(name, value)?),
            "MAX_RECONSUME_TIMES" => message.max_reconsume_times = Some(number(name, value)?),
            // The broker's flush mode decides when a send is answered.
            "WAIT" => {}
            _ => message.properties.push((name, value)),
        }
    }
    Ok(message)
}

fn build_message<'b>(
    b: &mut flatbuffers::FlatBufferBuilder<'b>,
    message: &Outgoing<'_>,
) -> flatbuffers::WIPOffset<wire::Message<'b>> {
    let body = b.create_vector(message.body);
    let tags = message.tags.map(|tags| b.create_string(tags));
    let keys: Vec<_> = message
        .keys
        .iter()
        .map(|key| b.create_string(key))
        .collect();
    let keys = (!keys.is_empty()).then(|| b.create_vector(&keys));
    let unique_id = message.unique_id.map(|id| b.create_string(id));
    let properties: Vec<_> = message
        .properties
        .iter()
        .map(|(key, value)| {
            let (key, value) = (b.create_string(key), b.create_string(value));
            wire::KeyValue::create(
                b,
                &wire::KeyValueArgs {
                    key: Some(key),
                    value: Some(value),
                },
            )
        })
        .collect();
    let properties = (!properties.is_empty()).then(|| b.create_vector(&properties));
    wire::Message::create(
        b,
        &wire::MessageArgs {
            body: Some(body),
            tags,
            keys,
            flag: message.flag,
            born_timestamp_ms: message.born_timestamp_ms,
            unique_id,
            properties,
            delay_level: message.delay_level,
            deliver_at_ms: message.deliver_at_ms,
            compression: message.compression,
            delay_ms: message.delay_ms,
        },
    )
}
