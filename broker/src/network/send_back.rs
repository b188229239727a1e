//! Retry and dead letters on the broker: a consumer's send-back (RocketMQ's
//! CONSUMER_SEND_MSG_BACK), served on a network shard.
//!
//! Owns: reading the record the consumer names (the pulled queue tells which storage shard's
//! CommitLog holds the offset), deciding retry or dead letter, and building the copy: the
//! stored message with `reconsume_times` one higher and the properties `RETRY_TOPIC` (the topic
//! the message was first sent to), `ORIGIN_MESSAGE_ID` (its first id), `RECONSUME_TIME` and
//! `MAX_RECONSUME_TIMES`. A retry copy is stored for `%RETRY%<group>` queue 0 through delay level
//! `3 + reconsume times` (schedule.rs delivers it); a dead letter goes to `%DLQ%<group>` queue 0
//! at once, where nothing consumes it automatically. Both topics are created on demand, with one
//! queue. Never: file layout (everything goes through `StorageRequest`s).

use shardmq_schema::wire;

use super::request::{encode_ok, refuse, Answer};
use super::{AskError, NetworkShard};
use crate::mesh::StorageRequest;
use crate::msgid::offset_message_id;
use crate::naming::{
    check_group_name, check_topic_name, DLQ_TOPIC_PREFIX, MAX_TOPIC_NAME_BYTES, RETRY_TOPIC_PREFIX,
    SCHEDULE_TOPIC,
};
use crate::schedule::{colocated_queue_id, parse_delay_levels};
use crate::store::record::{
    RecordInput, RecordView, PROPERTY_CRC32, PROPERTY_DELAY, PROPERTY_MAX_RECONSUME_TIMES,
    PROPERTY_ORIGIN_MESSAGE_ID, PROPERTY_REAL_QUEUE_ID, PROPERTY_REAL_TOPIC,
    PROPERTY_RECONSUME_TIME, PROPERTY_RETRY_TOPIC, PROPERTY_TIMER_DELIVER_MS,
};
use crate::store::{EncodedBatch, StoreError};

/// RocketMQ's `maxReconsumeTimes` default for concurrent consumers.
pub const DEFAULT_MAX_RECONSUME_TIMES: i32 = 16;
/// Retry delays start at this level (level 3 = 10 s with the default levels).
pub const FIRST_RETRY_LEVEL: i32 = 3;

/// Properties a copy replaces or drops: its retry bookkeeping is rewritten, scheduling
/// properties never survive, and the CRC is recomputed.
const REWRITTEN_PROPERTIES: [&str; 9] = [
    PROPERTY_RETRY_TOPIC,
    PROPERTY_ORIGIN_MESSAGE_ID,
    PROPERTY_RECONSUME_TIME,
    PROPERTY_MAX_RECONSUME_TIMES,
    PROPERTY_DELAY,
    PROPERTY_REAL_TOPIC,
    PROPERTY_REAL_QUEUE_ID,
    PROPERTY_TIMER_DELIVER_MS,
    PROPERTY_CRC32,
];

/// Where a sent-back message went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SendBackOutcome {
    pub topic: String,
    pub reconsume_times: i32,
    pub is_dead_letter: bool,
}

/// A refused send-back: the wire status and a message naming the thing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SendBackError {
    pub status: wire::Status,
    pub message: String,
}

fn refused(status: wire::Status, message: impl Into<String>) -> SendBackError {
    SendBackError {
        status,
        message: message.into(),
    }
}

fn invalid(message: impl Into<String>) -> SendBackError {
    refused(wire::Status::INVALID_ARGUMENT, message)
}

impl From<AskError> for SendBackError {
    fn from(error: AskError) -> Self {
        match error {
            AskError::Busy => refused(
                wire::Status::SYSTEM_BUSY,
                "storage shard is busy: its request queue is full; retry later",
            ),
            AskError::Gone => refused(
                wire::Status::SERVICE_NOT_AVAILABLE,
                "storage shard is not serving (broker stopping)",
            ),
        }
    }
}

fn append_error(error: StoreError) -> SendBackError {
    let status = match &error {
        StoreError::Busy { .. } => wire::Status::SYSTEM_BUSY,
        StoreError::DiskFull { .. } => wire::Status::DISK_FULL,
        StoreError::Closed | StoreError::Held(_) => wire::Status::SERVICE_NOT_AVAILABLE,
        _ => wire::Status::SYSTEM_ERROR,
    };
    refused(status, format!("storing the retry copy failed: {error}"))
}

/// What the decision needs from the request, checked.
struct Request<'a> {
    group: &'a str,
    topic: &'a str,
    queue_id: u32,
    physical_offset: u64,
    unique_id: Option<&'a str>,
    delay_level: i32,
    max_reconsume_times: i32,
}

fn check_request<'a>(r: &wire::ConsumerSendBackRequest<'a>) -> Result<Request<'a>, SendBackError> {
    let group = r.consumer_group().unwrap_or_default();
    check_group_name(group).map_err(invalid)?;
    let retry_topic_bytes = RETRY_TOPIC_PREFIX.len() + group.len();
    if retry_topic_bytes > MAX_TOPIC_NAME_BYTES {
        return Err(invalid(format!(
            "group name is {} bytes: its retry topic would be {retry_topic_bytes} bytes, over the topic limit of {MAX_TOPIC_NAME_BYTES}",
            group.len()
        )));
    }
    let topic = r.topic().unwrap_or_default();
    check_topic_name(topic).map_err(invalid)?;
    let queue_id = u32::try_from(r.queue_id())
        .map_err(|_| invalid(format!("queue_id {} is negative", r.queue_id())))?;
    let physical_offset = u64::try_from(r.commit_log_offset()).map_err(|_| {
        invalid(format!(
            "commit_log_offset {} is negative",
            r.commit_log_offset()
        ))
    })?;
    if r.delay_level() < -1 {
        return Err(invalid(format!(
            "delay_level {} must be -1 (dead letter), 0 (broker picks) or a level",
            r.delay_level()
        )));
    }
    Ok(Request {
        group,
        topic,
        queue_id,
        physical_offset,
        unique_id: r.unique_id().filter(|id| !id.is_empty()),
        delay_level: r.delay_level(),
        max_reconsume_times: if r.max_reconsume_times() <= 0 {
            DEFAULT_MAX_RECONSUME_TIMES
        } else {
            r.max_reconsume_times()
        },
    })
}

/// Serves a send-back: reads the named record, stores its retry or dead-letter copy.
pub async fn send_back(
    shard: &NetworkShard,
    r: wire::ConsumerSendBackRequest<'_>,
) -> Result<SendBackOutcome, SendBackError> {
    let request = check_request(&r)?;
    let source_shard = shard.shard_of(request.topic, request.queue_id);
    let physical_offset = request.physical_offset;
    let record = shard
        .ask(source_shard, |reply| StorageRequest::ReadAt {
            physical_offset,
            reply,
        })
        .await?
        .map_err(|e| {
            refused(
                wire::Status::QUERY_NOT_FOUND,
                format!(
                    "no message at commit_log_offset {physical_offset} of topic {} queue {}: {e}",
                    request.topic, request.queue_id
                ),
            )
        })?;
    let view = RecordView::parse_unchecked(&record)
        .map_err(|e| refused(wire::Status::SYSTEM_ERROR, format!("stored record: {e}")))?;
    if view.topic() != request.topic || view.queue_id() != request.queue_id {
        return Err(refused(
            wire::Status::QUERY_NOT_FOUND,
            format!(
                "the message at commit_log_offset {physical_offset} belongs to {} queue {}, not {} queue {}",
                view.topic(),
                view.queue_id(),
                request.topic,
                request.queue_id
            ),
        ));
    }
    if let Some(expected) = request.unique_id {
        if view.unique_key() != Some(expected) {
            return Err(refused(
                wire::Status::QUERY_NOT_FOUND,
                format!(
                    "the message at commit_log_offset {physical_offset} has unique id {:?}, not {expected}",
                    view.unique_key().unwrap_or("")
                ),
            ));
        }
    }
    let offset_id = offset_message_id(shard.store_host.get(), source_shard, physical_offset);
    let message = CopyOf {
        delivered_times: view.reconsume_times().max(0),
        original_topic: view
            .property(PROPERTY_RETRY_TOPIC)
            .unwrap_or_else(|| view.topic()),
        origin_id: view
            .property(PROPERTY_ORIGIN_MESSAGE_ID)
            .or_else(|| view.unique_key())
            .unwrap_or(&offset_id),
        unique_id: view.unique_key(),
        properties: view.properties().collect(),
        flag: view.flag(),
        body: view.body(),
        sys_flag: view.sys_flag(),
        born_timestamp_ms: view.born_timestamp_ms(),
        born_host: view.born_host(),
    };
    let redelivery = Redelivery {
        group: request.group,
        delay_level: request.delay_level,
        max_reconsume_times: request.max_reconsume_times,
    };
    store_copy(shard, &redelivery, &message)
        .await
        .map(|(outcome, _)| outcome)
}

/// How a message is to be delivered again: to which group, after which delay level (-1: to
/// the dead letters at once, 0: the broker's choice) and within how many redeliveries.
pub(super) struct Redelivery<'a> {
    pub group: &'a str,
    pub delay_level: i32,
    pub max_reconsume_times: i32,
}

/// The message a retry or dead-letter copy is made of: a stored record a consumer sent back,
/// or the message a RocketMQ client sends to `%RETRY%<group>` itself when its send-back failed.
pub(super) struct CopyOf<'a> {
    /// How many times the message was redelivered before this delivery failed.
    pub delivered_times: i32,
    /// The topic the message was first sent to.
    pub original_topic: &'a str,
    /// The first id of the message.
    pub origin_id: &'a str,
    pub unique_id: Option<&'a str>,
    /// Its properties (those a copy rewrites are dropped here).
    pub properties: Vec<(&'a str, &'a str)>,
    pub flag: i32,
    pub body: &'a [u8],
    pub sys_flag: u32,
    pub born_timestamp_ms: i64,
    pub born_host: std::net::SocketAddr,
}

/// Stores the retry copy of `message` (or its dead letter): returns where it went and the
/// CommitLog offset and storage shard of the stored copy (`None` when a dead letter already
/// held it).
pub(super) async fn store_copy(
    shard: &NetworkShard,
    redelivery: &Redelivery<'_>,
    message: &CopyOf<'_>,
) -> Result<(SendBackOutcome, Option<(usize, u64)>), SendBackError> {
    let copy = plan_copy(shard, redelivery, message)?;
    ensure_topic(shard, &copy.target_topic).await?;
    if copy.is_dead_letter && is_already_dead(shard, &copy.target_topic, message.unique_id).await? {
        // A send-back repeated after a crash (the consumer had not committed past the message
        // when the broker or it died): the dead letter is kept once.
        let outcome = SendBackOutcome {
            topic: copy.target_topic,
            reconsume_times: copy.reconsume_times,
            is_dead_letter: true,
        };
        return Ok((outcome, None));
    }
    let mut batch = EncodedBatch::new();
    let properties = copy.property_pairs();
    let input = RecordInput {
        topic: &copy.store_topic,
        queue_id: copy.store_queue,
        flag: message.flag,
        body: message.body,
        properties: &properties,
        sys_flag: message.sys_flag,
        born_timestamp_ms: message.born_timestamp_ms,
        born_host: message.born_host,
        store_host: shard.store_host.get(),
        reconsume_times: copy.reconsume_times,
        prepared_transaction_offset: 0,
    };
    batch
        .push(&input)
        .map_err(|e| refused(wire::Status::SYSTEM_ERROR, format!("retry copy: {e}")))?;
    let storage = shard.shard_of(&copy.store_topic, copy.store_queue);
    let outcome = shard
        .ask(storage, |reply| StorageRequest::Append { batch, reply })
        .await?
        .map_err(append_error)?;
    // Stored on the master only: the consumer must not take the original as handled (were
    // the master to die now, the retry copy could be lost with it). It is answered as an
    // error, so the consumer keeps the message and redelivers it; the copy on the master may
    // then be delivered too (at least once).
    let not_replicated = match outcome.status {
        crate::store::AppendStatus::FlushSlaveTimeout => Some(wire::Status::FLUSH_SLAVE_TIMEOUT),
        crate::store::AppendStatus::SlaveNotAvailable => Some(wire::Status::SLAVE_NOT_AVAILABLE),
        _ => None,
    };
    if let Some(status) = not_replicated {
        return Err(refused(
            status,
            "the retry copy is stored on the master but not on its replicas; consume the message again later",
        ));
    }
    let stored = outcome
        .records
        .first()
        .map(|record| (storage, record.physical_offset));
    let outcome = SendBackOutcome {
        topic: copy.target_topic,
        reconsume_times: copy.reconsume_times,
        is_dead_letter: copy.is_dead_letter,
    };
    Ok((outcome, stored))
}

/// The copy to store: where, with which properties and count.
struct Copy {
    /// `%RETRY%<group>` or `%DLQ%<group>`.
    target_topic: String,
    is_dead_letter: bool,
    /// Where the record is appended: the DLQ itself, or a schedule queue for the retry topic.
    store_topic: String,
    store_queue: u32,
    reconsume_times: i32,
    properties: Vec<(String, String)>,
}

impl Copy {
    fn property_pairs(&self) -> Vec<(&str, &str)> {
        self.properties
            .iter()
            .map(|(key, value)| (key.as_str(), value.as_str()))
            .collect()
    }
}

fn plan_copy(
    shard: &NetworkShard,
    request: &Redelivery<'_>,
    message: &CopyOf<'_>,
) -> Result<Copy, SendBackError> {
    let delivered_times = message.delivered_times.max(0);
    let is_dead_letter = request.delay_level < 0 || delivered_times >= request.max_reconsume_times;
    let reconsume_times = delivered_times.saturating_add(1);
    let mut properties: Vec<(String, String)> = message
        .properties
        .iter()
        .filter(|(key, _)| !REWRITTEN_PROPERTIES.contains(key))
        .map(|(key, value)| ((*key).to_owned(), (*value).to_owned()))
        .collect();
    properties.push((
        PROPERTY_RETRY_TOPIC.into(),
        message.original_topic.to_owned(),
    ));
    properties.push((
        PROPERTY_ORIGIN_MESSAGE_ID.into(),
        message.origin_id.to_owned(),
    ));
    properties.push((PROPERTY_RECONSUME_TIME.into(), reconsume_times.to_string()));
    properties.push((
        PROPERTY_MAX_RECONSUME_TIMES.into(),
        request.max_reconsume_times.to_string(),
    ));
    if is_dead_letter {
        let target_topic = format!("{DLQ_TOPIC_PREFIX}{}", request.group);
        return Ok(Copy {
            store_topic: target_topic.clone(),
            target_topic,
            is_dead_letter,
            store_queue: 0,
            reconsume_times,
            properties,
        });
    }
    let level_count = parse_delay_levels(&shard.config.delay_levels)
        .map(|levels| levels.len() as i32)
        .map_err(|e| refused(wire::Status::SYSTEM_ERROR, e))?;
    let level = if request.delay_level > 0 {
        request.delay_level
    } else {
        FIRST_RETRY_LEVEL.saturating_add(delivered_times)
    }
    .clamp(1, level_count);
    let target_topic = format!("{RETRY_TOPIC_PREFIX}{}", request.group);
    let real_shard = shard.shard_of(&target_topic, 0);
    properties.push((PROPERTY_REAL_TOPIC.into(), target_topic.clone()));
    properties.push((PROPERTY_REAL_QUEUE_ID.into(), "0".into()));
    properties.push((PROPERTY_DELAY.into(), level.to_string()));
    Ok(Copy {
        target_topic,
        is_dead_letter,
        store_topic: SCHEDULE_TOPIC.to_owned(),
        store_queue: colocated_queue_id(
            SCHEDULE_TOPIC,
            (level - 1) as u32,
            real_shard,
            shard.storage_shards(),
        ),
        reconsume_times,
        properties,
    })
}

/// Whether `dead_letter_topic` already holds a copy of the message with `unique_id`.
/// The index lists the newest records first, so an existing dead letter, the newest copy of
/// its message, is among the first looked at.
async fn is_already_dead(
    shard: &NetworkShard,
    dead_letter_topic: &str,
    unique_id: Option<&str>,
) -> Result<bool, SendBackError> {
    let Some(unique_id) = unique_id.map(str::to_owned) else {
        return Ok(false);
    };
    let storage = shard.shard_of(dead_letter_topic, 0);
    let records = shard
        .ask(storage, |reply| StorageRequest::QueryByUniqueId {
            unique_id,
            begin_ms: 0,
            end_ms: i64::MAX,
            reply,
        })
        .await?
        .map_err(append_error)?;
    Ok(records.iter().any(|record| {
        RecordView::parse_unchecked(record).is_ok_and(|copy| copy.topic() == dead_letter_topic)
    }))
}

/// Creates the group's retry or dead-letter topic (one queue) unless the topic table has it.
async fn ensure_topic(shard: &NetworkShard, name: &str) -> Result<(), SendBackError> {
    if shard.topics().get(name).is_some() {
        return Ok(());
    }
    let name = name.to_owned();
    shard
        .ask(0, |reply| StorageRequest::EnsureSystemTopic {
            name,
            queues: 1,
            reply,
        })
        .await?;
    Ok(())
}

/// A consumer's send-back: the answer names where the copy went.
pub(super) async fn handle_send_back(
    shard: &NetworkShard,
    id: u64,
    r: wire::ConsumerSendBackRequest<'_>,
) -> Answer {
    let outcome = super::send_back::send_back(shard, r)
        .await
        .map_err(|e| refuse(e.status, e.message))?;
    encode_ok(shard, id, |b| {
        let topic = b.create_string(&outcome.topic);
        let body = wire::ConsumerSendBackResponse::create(
            b,
            &wire::ConsumerSendBackResponseArgs {
                topic: Some(topic),
                reconsume_times: outcome.reconsume_times,
                is_dead_letter: outcome.is_dead_letter,
            },
        );
        (wire::Body::ConsumerSendBackResponse, body.as_union_value())
    })
}
