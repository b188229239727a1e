//! A RocketMQ consumer's failed message: CONSUMER_SEND_MSG_BACK (36) becomes the native
//! send-back (a copy to `%RETRY%<group>` after its delay level, or to `%DLQ%<group>` past the
//! group's redeliveries). RocketMQ names the message by the CommitLog offset its record carried;
//! a record served to a RocketMQ client carries its storage shard in that offset's top byte, as
//! ShardMQ's offset message ids do (`consume::pull`), so the offset names the record exactly. The
//! record is read there to learn the topic and queue the native request names.

use shardmq_remoting::codes::response;
use shardmq_remoting::RemotingCommand;
use shardmq_schema::wire;

use super::dispatch::{native_answer, native_request, required, required_i64, Answer, Reply};
use crate::mesh::StorageRequest;
use crate::msgid::split_located_offset;
use crate::network::request::{refuse, Connection};
use crate::network::send_back as native;
use crate::network::NetworkShard;
use crate::store::record::RecordView;

/// RocketMQ's default redeliveries before the dead-letter topic.
const DEFAULT_MAX_RECONSUME_TIMES: i32 = 16;

pub(super) async fn send_back(
    shard: &NetworkShard,
    _connection: &Connection,
    command: &RemotingCommand,
) -> Answer {
    let group = required(command, "group")?;
    let offset = required_i64(command, "offset")?;
    let located = u64::try_from(offset).map_err(|_| {
        refuse(
            wire::Status::INVALID_ARGUMENT,
            "offset must not be negative",
        )
    })?;
    let (storage, physical_offset) = split_located_offset(located);
    if storage >= shard.storage_shards() {
        return Err(refuse(
            wire::Status::INVALID_ARGUMENT,
            format!(
                "offset {offset} names storage shard {storage}; this broker has {}",
                shard.storage_shards()
            ),
        ));
    }
    let delay_level = command
        .ext_opt_i32("delayLevel")
        .map_err(|bad| refuse(wire::Status::INVALID_ARGUMENT, bad.to_string()))?
        .unwrap_or(0);
    let max_reconsume_times = command
        .ext_opt_i32("maxReconsumeTimes")
        .map_err(|bad| refuse(wire::Status::INVALID_ARGUMENT, bad.to_string()))?
        .unwrap_or(DEFAULT_MAX_RECONSUME_TIMES);
    let record = shard
        .ask(storage, |reply| StorageRequest::ReadAt {
            physical_offset,
            reply,
        })
        .await?
        .map_err(|error| {
            refuse(
                wire::Status::QUERY_NOT_FOUND,
                format!("no message at CommitLog offset {physical_offset}: {error}"),
            )
        })?;
    let view = RecordView::parse_unchecked(&record).map_err(|error| {
        refuse(
            wire::Status::SYSTEM_ERROR,
            format!("stored record: {error}"),
        )
    })?;
    let request = native_request(shard, |b| {
        let group = b.create_string(group);
        let topic = b.create_string(view.topic());
        let body = wire::ConsumerSendBackRequest::create(
            b,
            &wire::ConsumerSendBackRequestArgs {
                consumer_group: Some(group),
                topic: Some(topic),
                queue_id: view.queue_id() as i32,
                commit_log_offset: physical_offset as i64,
                unique_id: None,
                // RocketMQ: below 0 straight to the dead letters, 0 the broker's choice.
                delay_level: delay_level.max(-1),
                max_reconsume_times,
            },
        );
        (wire::Body::ConsumerSendBackRequest, body.as_union_value())
    })?;
    let send_back = request
        .frame()
        .body_as_consumer_send_back_request()
        .expect("built as a send-back");
    native_answer(shard, native::handle_send_back(shard, 0, send_back).await)?;
    Ok(Reply::to(command, response::SUCCESS))
}
