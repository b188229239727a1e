//! Queue lock requests of orderly consumers (LockBatchRequest, UnlockBatchRequest): validated
//! here, served by the lock table on storage shard 0 (`crate::queue_locks`).

use shardmq_schema::wire;

use super::request::{encode_ok, encode_status, invalid, Answer, Connection, Refusal};
use super::NetworkShard;
use crate::mesh::StorageRequest;
use crate::naming::{check_group_name, check_topic_name};
use crate::queue_locks::{LockRequest, QueueId};

/// Most queues one lock or unlock request may name.
pub const MAX_QUEUES_PER_LOCK_REQUEST: usize = 1024;

type QueueRefs<'a> = flatbuffers::Vector<'a, flatbuffers::ForwardsUOffset<wire::QueueRef<'a>>>;

pub(super) async fn handle_lock_batch(
    shard: &NetworkShard,
    connection: &Connection,
    id: u64,
    r: wire::LockBatchRequest<'_>,
) -> Answer {
    let (group, client_id, queues) =
        lock_arguments(connection, r.consumer_group(), r.client_id(), r.queues())?;
    let locked = shard
        .ask(0, |reply| {
            StorageRequest::QueueLock(LockRequest::Lock {
                group,
                client_id,
                queues,
                reply,
            })
        })
        .await?;
    encode_ok(shard, id, |b| {
        let refs: Vec<_> = locked
            .iter()
            .map(|(topic, queue_id)| {
                let topic = b.create_string(topic);
                wire::QueueRef::create(
                    b,
                    &wire::QueueRefArgs {
                        topic: Some(topic),
                        queue_id: *queue_id as i32,
                    },
                )
            })
            .collect();
        let locked = b.create_vector(&refs);
        let body = wire::LockBatchResponse::create(
            b,
            &wire::LockBatchResponseArgs {
                locked: Some(locked),
            },
        );
        (wire::Body::LockBatchResponse, body.as_union_value())
    })
}

pub(super) async fn handle_unlock_batch(
    shard: &NetworkShard,
    connection: &Connection,
    id: u64,
    r: wire::UnlockBatchRequest<'_>,
) -> Answer {
    let (group, client_id, queues) =
        lock_arguments(connection, r.consumer_group(), r.client_id(), r.queues())?;
    shard
        .ask(0, |reply| {
            StorageRequest::QueueLock(LockRequest::Unlock {
                group,
                client_id,
                queues,
                reply,
            })
        })
        .await?;
    encode_status(shard, id, wire::Status::OK, "")
}

/// (group, client id, queues) of a lock or unlock request; the client id defaults to the
/// connection's handshake id.
fn lock_arguments(
    connection: &Connection,
    group: Option<&str>,
    client_id: Option<&str>,
    queues: Option<QueueRefs<'_>>,
) -> Result<(String, String, Vec<QueueId>), Refusal> {
    let group = group.unwrap_or_default();
    check_group_name(group).map_err(invalid)?;
    let client_id = client_id
        .filter(|c| !c.is_empty())
        .map(str::to_owned)
        .or_else(|| connection.client_id.borrow().clone())
        .ok_or_else(|| invalid("client_id is missing (and the handshake named none)"))?;
    let queues = queues.ok_or_else(|| invalid("queues is missing"))?;
    if queues.len() > MAX_QUEUES_PER_LOCK_REQUEST {
        return Err(invalid(format!(
            "{} queues in one request, over MAX_QUEUES_PER_LOCK_REQUEST ({MAX_QUEUES_PER_LOCK_REQUEST})",
            queues.len()
        )));
    }
    let mut parsed = Vec::with_capacity(queues.len());
    for queue in queues.iter() {
        let topic = queue.topic().unwrap_or_default();
        check_topic_name(topic).map_err(invalid)?;
        let queue_id = u32::try_from(queue.queue_id())
            .map_err(|_| invalid(format!("queue_id {} is negative", queue.queue_id())))?;
        parsed.push((topic.to_owned(), queue_id));
    }
    Ok((group.to_owned(), client_id, parsed))
}
