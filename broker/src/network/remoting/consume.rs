//! A RocketMQ consumer's requests: PULL_MESSAGE (11) is served by the native pull
//! (`consume::pull_records`: long polling, tag filters) and answered with the four offsets
//! RocketMQ's clients read on every answer and the stored records as the body (ShardMQ's
//! CommitLog record is RocketMQ's MessageExt layout, so the body is slices of the log, not a
//! copy); QUERY_CONSUMER_OFFSET (14), UPDATE_CONSUMER_OFFSET (15), GET_MAX_OFFSET (30),
//! GET_MIN_OFFSET (31) and SEARCH_OFFSET_BY_TIMESTAMP (29) become the native offset requests;
//! GET_EARLIEST_MSG_STORETIME (32) reads the store time of the queue's first message.

use shardmq_remoting::codes::{pull_sys_flag, request, response};
use shardmq_remoting::RemotingCommand;
use shardmq_schema::wire;

use super::dispatch::{
    native_answer, native_request, queue_id, required, required_i64, response_code, Answer, Reply,
};
use super::RemotingSession;
use crate::msgid::located_offset;
use crate::network::consume::{self as native, PullAsk};
use crate::network::request::{refuse, Connection, Refusal};
use crate::network::NetworkShard;

/// RocketMQ's default suspend time of a pull (the client's call times out at 30 s).
const DEFAULT_SUSPEND_TIMEOUT_MS: i64 = 15_000;
/// RocketMQ's default `maxMsgNums`.
const DEFAULT_PULL_MESSAGES: i32 = 32;

pub(super) async fn pull(
    shard: &NetworkShard,
    session: &RemotingSession,
    command: &RemotingCommand,
) -> Answer {
    let group = required(command, "consumerGroup")?;
    let topic = required(command, "topic")?;
    let sys_flag = optional_i32(command, "sysFlag")?.unwrap_or(0);
    let commit_offset = if sys_flag & pull_sys_flag::COMMIT_OFFSET != 0 {
        optional_i64(command, "commitOffset")?.unwrap_or(-1)
    } else {
        -1
    };
    let suspend_timeout_ms = if sys_flag & pull_sys_flag::SUSPEND != 0 {
        optional_i64(command, "suspendTimeoutMillis")?.unwrap_or(DEFAULT_SUSPEND_TIMEOUT_MS)
    } else {
        0
    };
    // The pull's own expression when it carries one, else the heartbeat's.
    let (expression, is_sql) = if sys_flag & pull_sys_flag::SUBSCRIPTION != 0 {
        (
            command
                .ext("subscription")
                .filter(|expression| !expression.is_empty())
                .map(str::to_owned),
            native::is_sql(command.ext("expressionType"))?,
        )
    } else {
        session
            .subscriptions
            .borrow()
            .get(&(group.to_owned(), topic.to_owned()))
            .map_or((None, false), |(expression, is_sql)| {
                (Some(expression.clone()), *is_sql)
            })
    };
    let ask = PullAsk {
        consumer_group: Some(group),
        topic: Some(topic),
        queue_id: queue_id(command, "queueId")?,
        queue_offset: required_i64(command, "queueOffset")?,
        max_messages: u32::try_from(
            optional_i32(command, "maxMsgNums")?.unwrap_or(DEFAULT_PULL_MESSAGES),
        )
        .unwrap_or(1),
        max_bytes: u32::try_from(optional_i32(command, "maxMsgBytes")?.unwrap_or(0)).unwrap_or(0),
        tag_expression: expression.as_deref(),
        is_sql,
        suspend_timeout_ms: u32::try_from(suspend_timeout_ms.max(0)).unwrap_or(u32::MAX),
        commit_offset,
    };
    let storage = shard.shard_of(topic, u32::try_from(ask.queue_id).unwrap_or(0));
    let (result, requested) = native::pull_records(shard, ask).await?;
    let status = native::pull_status(&result, requested);
    let mut reply = Reply::to(command, response_code(status))
        .with_ext("suggestWhichBrokerId", result.suggest_broker_id.max(0))
        .with_ext("nextBeginOffset", result.next_offset)
        .with_ext("minOffset", result.min_offset)
        .with_ext("maxOffset", result.max_offset);
    if status == wire::Status::OK {
        reply.body = located_records(storage, result.records);
    }
    Ok(reply)
}

/// Where the CommitLog offset field lies in a stored record (docs/storage-format.md §4.2).
const PHYSICAL_OFFSET_AT: usize = 28;

/// The records of a pull from storage shard `storage`, as a RocketMQ client is to see them: a
/// RocketMQ client names a message by the CommitLog offset its record carries (its offset
/// message id, CONSUMER_SEND_MSG_BACK), so a record of a shard other than 0 carries the shard
/// in that offset's top byte, as ShardMQ's offset message ids do. The record is not copied: its
/// first bytes up to and with the offset are, patched, and the rest is sent as a slice of the
/// log. (The record's CRC no longer covers the patched offset; RocketMQ's clients check none.)
fn located_records(storage: usize, records: Vec<bytes::Bytes>) -> Vec<bytes::Bytes> {
    if storage == 0 {
        return records;
    }
    let mut located = Vec::with_capacity(records.len() * 2);
    for record in records {
        push_located(storage, record, &mut located);
    }
    located
}

/// Appends `record` of storage shard `storage` to `out` as a RocketMQ client is to see it (see
/// [`located_records`]): as it is for shard 0, else its patched head and the rest.
pub(super) fn push_located(storage: usize, record: bytes::Bytes, out: &mut Vec<bytes::Bytes>) {
    let head_bytes = PHYSICAL_OFFSET_AT + 8;
    if storage == 0 || record.len() < head_bytes {
        out.push(record);
        return;
    }
    let mut head = bytes::BytesMut::from(&record[..head_bytes]);
    let offset = u64::from_be_bytes(
        record[PHYSICAL_OFFSET_AT..head_bytes]
            .try_into()
            .expect("eight bytes"),
    );
    let offset = located_offset(storage, offset);
    head[PHYSICAL_OFFSET_AT..].copy_from_slice(&offset.to_be_bytes());
    out.push(head.freeze());
    out.push(record.slice(head_bytes..));
}

pub(super) async fn query_consumer_offset(
    shard: &NetworkShard,
    _connection: &Connection,
    command: &RemotingCommand,
) -> Answer {
    let (group, topic) = (
        required(command, "consumerGroup")?,
        required(command, "topic")?,
    );
    let queue_id = queue_id(command, "queueId")?;
    match committed_offset(shard, group, topic, queue_id).await? {
        Some(offset) => Ok(Reply::to(command, response::SUCCESS).with_ext("offset", offset)),
        // RocketMQ's clients then start where the group's consume-from setting says.
        None => {
            let mut reply = Reply::to(command, response::QUERY_NOT_FOUND);
            reply.command.remark = Some(format!(
                "consumer group {group} has no committed offset for {topic} queue {queue_id}"
            ));
            Ok(reply)
        }
    }
}

/// A group's committed offset of one queue through the native query; `None` when the group
/// has none there.
pub(super) async fn committed_offset(
    shard: &NetworkShard,
    group: &str,
    topic: &str,
    queue_id: i32,
) -> Result<Option<i64>, Refusal> {
    let request = native_request(shard, |b| {
        let (group, topic) = (b.create_string(group), b.create_string(topic));
        let body = wire::QueryConsumerOffsetRequest::create(
            b,
            &wire::QueryConsumerOffsetRequestArgs {
                consumer_group: Some(group),
                topic: Some(topic),
                queue_id,
            },
        );
        (
            wire::Body::QueryConsumerOffsetRequest,
            body.as_union_value(),
        )
    })?;
    let query = request
        .frame()
        .body_as_query_consumer_offset_request()
        .expect("built as an offset query");
    match native_answer(shard, native::query_consumer_offset(shard, 0, query).await) {
        Ok(answer) => Ok(answer
            .frame()
            .body_as_offset_response()
            .map(|offset| offset.offset())
            .filter(|offset| *offset >= 0)),
        Err(refusal) if refusal.status == wire::Status::CONSUMER_GROUP_NOT_FOUND => Ok(None),
        Err(refusal) => Err(refusal),
    }
}

pub(super) async fn update_consumer_offset(
    shard: &NetworkShard,
    _connection: &Connection,
    command: &RemotingCommand,
) -> Answer {
    let (group, topic) = (
        required(command, "consumerGroup")?,
        required(command, "topic")?,
    );
    let queue_id = queue_id(command, "queueId")?;
    let offset = required_i64(command, "commitOffset")?;
    let request = native_request(shard, |b| {
        let (group, topic) = (b.create_string(group), b.create_string(topic));
        let body = wire::CommitConsumerOffsetRequest::create(
            b,
            &wire::CommitConsumerOffsetRequestArgs {
                consumer_group: Some(group),
                topic: Some(topic),
                queue_id,
                offset,
            },
        );
        (
            wire::Body::CommitConsumerOffsetRequest,
            body.as_union_value(),
        )
    })?;
    let commit = request
        .frame()
        .body_as_commit_consumer_offset_request()
        .expect("built as an offset commit");
    native_answer(
        shard,
        native::commit_consumer_offset(shard, 0, commit).await,
    )?;
    Ok(Reply::to(command, response::SUCCESS))
}

/// GET_MAX_OFFSET (the next offset a queue will write) and GET_MIN_OFFSET.
pub(super) async fn queue_offset(
    shard: &NetworkShard,
    _connection: &Connection,
    command: &RemotingCommand,
) -> Answer {
    let topic = required(command, "topic")?;
    let queue_id = queue_id(command, "queueId")?;
    let (min_offset, max_offset) = queue_offsets(shard, topic, queue_id).await?;
    let offset = if command.code == request::GET_MAX_OFFSET {
        max_offset
    } else {
        min_offset
    };
    Ok(Reply::to(command, response::SUCCESS).with_ext("offset", offset))
}

/// GET_EARLIEST_MSG_STORETIME: the store time (ms) of the oldest message a queue still holds,
/// read from its record; -1 for an empty queue, as RocketMQ answers.
pub(super) async fn earliest_store_time(
    shard: &NetworkShard,
    _connection: &Connection,
    command: &RemotingCommand,
) -> Answer {
    let topic = required(command, "topic")?;
    let queue_id = queue_id(command, "queueId")?;
    let (min_offset, _) = queue_offsets(shard, topic, queue_id).await?;
    let ask = PullAsk {
        consumer_group: None,
        topic: Some(topic),
        queue_id,
        queue_offset: min_offset,
        max_messages: 1,
        max_bytes: 0,
        tag_expression: None,
        is_sql: false,
        suspend_timeout_ms: 0,
        commit_offset: -1,
    };
    let (result, _) = native::pull_records(shard, ask).await?;
    let timestamp = match result.records.first() {
        Some(record) => crate::store::record::RecordView::parse_unchecked(record)
            .map_err(|error| {
                refuse(
                    wire::Status::SYSTEM_ERROR,
                    format!("stored record: {error}"),
                )
            })?
            .store_timestamp_ms(),
        None => -1,
    };
    Ok(Reply::to(command, response::SUCCESS).with_ext("timestamp", timestamp))
}

/// A queue's min and max offsets, through the native request.
async fn queue_offsets(
    shard: &NetworkShard,
    topic: &str,
    queue_id: i32,
) -> Result<(i64, i64), Refusal> {
    let request = native_request(shard, |b| {
        let topic = b.create_string(topic);
        let body = wire::QueueOffsetsRequest::create(
            b,
            &wire::QueueOffsetsRequestArgs {
                topic: Some(topic),
                queue_id,
            },
        );
        (wire::Body::QueueOffsetsRequest, body.as_union_value())
    })?;
    let offsets = request
        .frame()
        .body_as_queue_offsets_request()
        .expect("built as a queue offsets request");
    let answer = native_answer(shard, native::queue_offsets(shard, 0, offsets).await)?;
    Ok(answer
        .frame()
        .body_as_queue_offsets_response()
        .map_or((0, 0), |o| (o.min_offset(), o.max_offset())))
}

pub(super) async fn offset_by_time(
    shard: &NetworkShard,
    _connection: &Connection,
    command: &RemotingCommand,
) -> Answer {
    let topic = required(command, "topic")?;
    let queue_id = queue_id(command, "queueId")?;
    let timestamp_ms = required_i64(command, "timestamp")?;
    let request = native_request(shard, |b| {
        let topic = b.create_string(topic);
        let body = wire::OffsetByTimeRequest::create(
            b,
            &wire::OffsetByTimeRequestArgs {
                topic: Some(topic),
                queue_id,
                timestamp_ms,
            },
        );
        (wire::Body::OffsetByTimeRequest, body.as_union_value())
    })?;
    let by_time = request
        .frame()
        .body_as_offset_by_time_request()
        .expect("built as an offset-by-time request");
    let answer = native_answer(shard, native::offset_by_time(shard, 0, by_time).await)?;
    let offset = answer
        .frame()
        .body_as_offset_response()
        .map_or(0, |o| o.offset().max(0));
    Ok(Reply::to(command, response::SUCCESS).with_ext("offset", offset))
}

fn optional_i32(command: &RemotingCommand, field: &str) -> Result<Option<i32>, Refusal> {
    command
        .ext_opt_i32(field)
        .map_err(|bad| refuse(wire::Status::INVALID_ARGUMENT, bad.to_string()))
}

fn optional_i64(command: &RemotingCommand, field: &str) -> Result<Option<i64>, Refusal> {
    command
        .ext_opt_i64(field)
        .map_err(|bad| refuse(wire::Status::INVALID_ARGUMENT, bad.to_string()))
}
