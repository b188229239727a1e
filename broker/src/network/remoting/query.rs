//! Finding messages for RocketMQ clients and tools: QUERY_MESSAGE (12) by key, or by unique id
//! when its `_UNIQUE_KEY_QUERY` says so, and VIEW_MESSAGE_BY_ID (33) by the CommitLog offset a
//! client took from an offset message id; served by the native queries (every storage shard,
//! bounded in bytes), answered with the records as the body, located as pulls locate them.
//! Also UPDATE_AND_CREATE_TOPIC (17), which admin tools and `mqadmin updateTopic` send.

use shardmq_remoting::codes::response;
use shardmq_remoting::RemotingCommand;
use shardmq_schema::wire;

use super::consume::push_located;
use super::dispatch::{native_answer, native_request, required, required_i64, Answer, Reply};
use crate::msgid::{offset_message_id, split_located_offset};
use crate::network::request::{refuse, Connection};
use crate::network::NetworkShard;
use crate::network::{query as native, topics};
use crate::store::record::RecordView;

/// RocketMQ's default `maxNum` of a query by key.
const DEFAULT_QUERY_RESULTS: u32 = 32;

pub(super) async fn query_message(
    shard: &NetworkShard,
    _connection: &Connection,
    command: &RemotingCommand,
) -> Answer {
    let topic = required(command, "topic")?;
    let key = required(command, "key")?;
    let number = |field: &str| {
        command
            .ext_opt_i64(field)
            .map_err(|bad| refuse(wire::Status::INVALID_ARGUMENT, bad.to_string()))
    };
    let max_results = number("maxNum")?
        .and_then(|max| u32::try_from(max).ok())
        .unwrap_or(DEFAULT_QUERY_RESULTS);
    let range = (
        number("beginTimestamp")?.unwrap_or(0),
        number("endTimestamp")?.unwrap_or(0),
    );
    let by_unique_id = command
        .ext("_UNIQUE_KEY_QUERY")
        .is_some_and(|flag| flag.eq_ignore_ascii_case("true"));
    let records = if by_unique_id {
        native::find_by_id(shard, Some(key), None, range.0, range.1).await?
    } else {
        native::find_by_key(shard, topic, Some(key), range, max_results).await?
    };
    let mut body = Vec::with_capacity(records.len());
    for record in records {
        let storage = RecordView::parse_unchecked(&record)
            .map(|view| shard.shard_of(view.topic(), view.queue_id()))
            .unwrap_or(0);
        push_located(storage, record, &mut body);
    }
    let mut reply = Reply::to(command, response::SUCCESS)
        .with_ext("indexLastUpdateTimestamp", 0)
        .with_ext("indexLastUpdatePhyoffset", 0);
    reply.body = body;
    Ok(reply)
}

pub(super) async fn view_message(
    shard: &NetworkShard,
    _connection: &Connection,
    command: &RemotingCommand,
) -> Answer {
    let located = u64::try_from(required_i64(command, "offset")?).map_err(|_| {
        refuse(
            wire::Status::INVALID_ARGUMENT,
            "offset must not be negative",
        )
    })?;
    let (storage, physical_offset) = split_located_offset(located);
    let offset_id = offset_message_id(shard.store_host.get(), storage, physical_offset);
    let records = native::find_by_id(shard, None, Some(&offset_id), 0, 0).await?;
    let mut reply = Reply::to(command, response::SUCCESS);
    for record in records {
        push_located(storage, record, &mut reply.body);
    }
    Ok(reply)
}

/// UPDATE_AND_CREATE_TOPIC: `topic`, `readQueueNums`, `writeQueueNums`, `perm` (RocketMQ's
/// defaults 16, 16 and read|write), `order`.
pub(super) async fn update_and_create_topic(
    shard: &NetworkShard,
    _connection: &Connection,
    command: &RemotingCommand,
) -> Answer {
    let topic = required(command, "topic")?;
    let number = |field: &str, default: i32| {
        command
            .ext_opt_i32(field)
            .map_err(|bad| refuse(wire::Status::INVALID_ARGUMENT, bad.to_string()))
            .map(|value| value.unwrap_or(default))
            .and_then(|value| {
                u32::try_from(value).map_err(|_| {
                    refuse(
                        wire::Status::INVALID_ARGUMENT,
                        format!("{field} is {value}, below 0"),
                    )
                })
            })
    };
    let read_queues = number("readQueueNums", 16)?;
    let write_queues = number("writeQueueNums", 16)?;
    let perm = number("perm", 6)?;
    let is_ordered = command
        .ext_opt_bool("order")
        .map_err(|bad| refuse(wire::Status::INVALID_ARGUMENT, bad.to_string()))?
        .unwrap_or(false);
    let request = native_request(shard, |b| {
        let name = b.create_string(topic);
        let config = wire::TopicConfig::create(
            b,
            &wire::TopicConfigArgs {
                name: Some(name),
                read_queues,
                write_queues,
                perm,
                is_ordered,
            },
        );
        let body = wire::UpsertTopicRequest::create(
            b,
            &wire::UpsertTopicRequestArgs {
                config: Some(config),
                create_only: false,
            },
        );
        (wire::Body::UpsertTopicRequest, body.as_union_value())
    })?;
    let upsert = request
        .frame()
        .body_as_upsert_topic_request()
        .expect("built as a topic upsert");
    native_answer(shard, topics::upsert_topic(shard, 0, upsert).await)?;
    Ok(Reply::to(command, response::SUCCESS))
}
