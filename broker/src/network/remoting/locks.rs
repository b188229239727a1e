//! An orderly RocketMQ consumer's queue locks: LOCK_BATCH_MQ (41) and UNLOCK_BATCH_MQ (42)
//! become the native lock requests (the lock table on storage shard 0, shared with native
//! clients); the lock answer names the queues held with the broker names they were asked with.

use std::collections::HashMap;

use shardmq_remoting::codes::{request, response};
use shardmq_remoting::{
    decode_lock_batch_request, encode_lock_batch_response, LockBatchResponseBody, MessageQueue,
    RemotingCommand,
};
use shardmq_schema::wire;

use super::dispatch::{native_answer, native_request, Answer, Reply};
use crate::network::queue_locks as native;
use crate::network::request::{refuse, Connection};
use crate::network::NetworkShard;

pub(super) async fn lock_or_unlock(
    shard: &NetworkShard,
    connection: &Connection,
    command: &RemotingCommand,
) -> Answer {
    let body = decode_lock_batch_request(&command.body)
        .map_err(|bad| refuse(wire::Status::INVALID_ARGUMENT, bad.to_string()))?;
    let is_lock = command.code == request::LOCK_BATCH_MQ;
    let request = native_request(shard, |b| {
        let group = b.create_string(&body.consumer_group);
        let client_id = b.create_string(&body.client_id);
        let queues: Vec<_> = body
            .mq_set
            .iter()
            .map(|queue| {
                let topic = b.create_string(&queue.topic);
                wire::QueueRef::create(
                    b,
                    &wire::QueueRefArgs {
                        topic: Some(topic),
                        queue_id: queue.queue_id,
                    },
                )
            })
            .collect();
        let queues = b.create_vector(&queues);
        if is_lock {
            let body = wire::LockBatchRequest::create(
                b,
                &wire::LockBatchRequestArgs {
                    consumer_group: Some(group),
                    client_id: Some(client_id),
                    queues: Some(queues),
                },
            );
            (wire::Body::LockBatchRequest, body.as_union_value())
        } else {
            let body = wire::UnlockBatchRequest::create(
                b,
                &wire::UnlockBatchRequestArgs {
                    consumer_group: Some(group),
                    client_id: Some(client_id),
                    queues: Some(queues),
                },
            );
            (wire::Body::UnlockBatchRequest, body.as_union_value())
        }
    })?;
    let frame = request.frame();
    if !is_lock {
        let unlock = frame
            .body_as_unlock_batch_request()
            .expect("built as an unlock");
        native_answer(
            shard,
            native::handle_unlock_batch(shard, connection, 0, unlock).await,
        )?;
        return Ok(Reply::to(command, response::SUCCESS));
    }
    let lock = frame.body_as_lock_batch_request().expect("built as a lock");
    let answer = native_answer(
        shard,
        native::handle_lock_batch(shard, connection, 0, lock).await,
    )?;
    let broker_names: HashMap<(&str, i32), &str> = body
        .mq_set
        .iter()
        .map(|queue| {
            (
                (queue.topic.as_str(), queue.queue_id),
                queue.broker_name.as_str(),
            )
        })
        .collect();
    let locked = answer
        .frame()
        .body_as_lock_batch_response()
        .and_then(|response| response.locked())
        .map(|locked| {
            locked
                .iter()
                .filter_map(|queue| {
                    let topic = queue.topic()?;
                    let broker_name = broker_names.get(&(topic, queue.queue_id()))?;
                    Some(MessageQueue {
                        topic: topic.to_owned(),
                        broker_name: (*broker_name).to_owned(),
                        queue_id: queue.queue_id(),
                    })
                })
                .collect()
        })
        .unwrap_or_default();
    let body = encode_lock_batch_response(&LockBatchResponseBody {
        lock_ok_mq_set: locked,
    })
    .map_err(|error| refuse(wire::Status::SYSTEM_ERROR, error.to_string()))?;
    Ok(Reply::to(command, response::SUCCESS).with_body(body))
}
