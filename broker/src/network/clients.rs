//! Clients and their groups: heartbeats (a repeat only refreshes liveness; a change is applied on
//! storage shard 0, which owns membership), unregistering, the members of a consumer group, and
//! the push that tells a group's clients to rebalance.

use std::collections::BTreeMap;

use bytes::Bytes;
use shardmq_schema::{build_frame, wire, FrameEncoder, FrameError, FrameHeader};

use super::request::{encode_ok, encode_status, invalid, Answer, Connection};
use super::NetworkShard;
use crate::groups::ConsumerMembership;
use crate::mesh::StorageRequest;
use crate::naming::{check_group_name, check_topic_name};

pub(super) async fn heartbeat(
    shard: &NetworkShard,
    connection: &Connection,
    id: u64,
    r: wire::HeartbeatRequest<'_>,
) -> Answer {
    let client_id = r
        .client_id()
        .filter(|c| !c.is_empty())
        .map(str::to_owned)
        .or_else(|| connection.client_id.borrow().clone())
        .ok_or_else(|| invalid("client_id is missing"))?;
    let mut producer_groups = Vec::new();
    for group in r.producer_groups().iter().flat_map(|v| v.iter()) {
        check_group_name(group).map_err(invalid)?;
        producer_groups.push(group.to_owned());
    }
    let mut consumer_groups = BTreeMap::new();
    for info in r.consumer_groups().iter().flat_map(|v| v.iter()) {
        let group = info.group().unwrap_or_default();
        check_group_name(group).map_err(invalid)?;
        let mut subscriptions = Vec::new();
        for sub in info.subscriptions().iter().flat_map(|v| v.iter()) {
            let topic = sub.topic().unwrap_or_default();
            check_topic_name(topic).map_err(invalid)?;
            let is_sql = super::consume::is_sql(sub.expression_type())?;
            subscriptions.push((
                topic.to_owned(),
                sub.expression().unwrap_or("*").to_owned(),
                is_sql,
            ));
        }
        let held_queues = match info.held_queues() {
            None => None,
            Some(queues) => {
                if queues.len() > shardmq_schema::MAX_HELD_QUEUES {
                    return Err(invalid(format!(
                        "held_queues of group {group} lists {} queues, more than {}",
                        queues.len(),
                        shardmq_schema::MAX_HELD_QUEUES
                    )));
                }
                let mut held = Vec::with_capacity(queues.len());
                for queue in queues.iter() {
                    let topic = queue.topic().unwrap_or_default();
                    check_topic_name(topic).map_err(invalid)?;
                    let broker_name = queue.broker_name().unwrap_or_default();
                    if broker_name.is_empty()
                        || broker_name.len() > shardmq_schema::MAX_BROKER_NAME_BYTES
                    {
                        return Err(invalid(format!(
                            "held_queues of group {group}: a broker name must have 1 to {} bytes",
                            shardmq_schema::MAX_BROKER_NAME_BYTES
                        )));
                    }
                    held.push((topic.to_owned(), broker_name.to_owned(), queue.queue_id()));
                }
                Some(held)
            }
        };
        consumer_groups.insert(
            group.to_owned(),
            ConsumerMembership {
                is_broadcasting: info.message_model() == wire::MessageModel::BROADCASTING,
                is_orderly: info.is_orderly(),
                subscriptions,
                held_queues,
            },
        );
    }
    if shard.connection_push(connection.id).is_none() {
        // The connection closed while this heartbeat waited: its client has left its groups,
        // and must not be registered again by a heartbeat nobody will follow.
        return encode_status(shard, id, wire::Status::OK, "");
    }
    let digest = heartbeat_digest(&client_id, &producer_groups, &consumer_groups);
    if shard.heartbeat_is_repeat(connection.id, digest, &client_id) {
        crate::metrics::broker().heartbeats_refreshed.inc();
        return encode_status(shard, id, wire::Status::OK, "");
    }
    crate::metrics::broker().heartbeats_applied.inc();
    shard.set_client(connection.id, client_id.clone());
    *connection.client_id.borrow_mut() = Some(client_id.clone());
    shard.set_consumer_groups(connection.id, consumer_groups.keys().cloned().collect());
    shard
        .ask(0, |reply| StorageRequest::Heartbeat {
            client_id,
            connection: shard.connection_key(connection.id),
            producer_groups,
            consumer_groups,
            reply,
        })
        .await?;
    shard.heartbeat_applied(connection.id, digest);
    encode_status(shard, id, wire::Status::OK, "")
}

/// What a heartbeat says, hashed: two heartbeats with the same digest register the same client
/// in the same groups with the same subscriptions.
fn heartbeat_digest(
    client_id: &str,
    producer_groups: &[String],
    consumer_groups: &BTreeMap<String, ConsumerMembership>,
) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    client_id.hash(&mut hasher);
    producer_groups.hash(&mut hasher);
    for (group, membership) in consumer_groups {
        group.hash(&mut hasher);
        membership.is_broadcasting.hash(&mut hasher);
        membership.is_orderly.hash(&mut hasher);
        membership.subscriptions.hash(&mut hasher);
        membership.held_queues.hash(&mut hasher);
    }
    hasher.finish()
}

/// The ONE_WAY notice that a consumer group's members changed.
pub fn encode_consumer_ids_changed(
    encoder: &mut FrameEncoder,
    group: &str,
) -> Result<Bytes, FrameError> {
    encoder.encode(|b| {
        let group = b.create_string(group);
        let body = wire::ConsumerIdsChangedNotice::create(
            b,
            &wire::ConsumerIdsChangedNoticeArgs {
                consumer_group: Some(group),
            },
        );
        build_frame(
            b,
            &FrameHeader::one_way(),
            wire::Body::ConsumerIdsChangedNotice,
            Some(body.as_union_value()),
        )
    })
}

/// A client leaves its groups.
pub(super) async fn unregister_client(
    shard: &NetworkShard,
    connection: &Connection,
    id: u64,
    r: wire::UnregisterClientRequest<'_>,
) -> Answer {
    let client_id = r.client_id().unwrap_or_default().to_owned();
    let producer_group = r
        .producer_group()
        .filter(|g| !g.is_empty())
        .map(str::to_owned);
    let consumer_group = r
        .consumer_group()
        .filter(|g| !g.is_empty())
        .map(str::to_owned);
    shard.forget_heartbeat(connection.id);
    shard
        .ask(0, |reply| StorageRequest::UnregisterClient {
            client_id,
            producer_group,
            consumer_group,
            reply,
        })
        .await?;
    encode_status(shard, id, wire::Status::OK, "")
}

/// The live members of a consumer group.
pub(super) async fn consumer_list(
    shard: &NetworkShard,
    id: u64,
    r: wire::ConsumerListRequest<'_>,
) -> Answer {
    let group = r.consumer_group().unwrap_or_default().to_owned();
    check_group_name(&group).map_err(invalid)?;
    let members = shard
        .ask(0, |reply| StorageRequest::ConsumerGroupMembers {
            group,
            reply,
        })
        .await?;
    encode_ok(shard, id, |b| {
        let ids: Vec<_> = members
            .iter()
            .map(|(client_id, _)| b.create_string(client_id))
            .collect();
        let entries: Vec<_> = members
            .iter()
            .zip(&ids)
            .map(|((_, membership), &client_id)| {
                let held_queues = membership.held_queues.as_ref().map(|queues| {
                    let queues: Vec<_> = queues
                        .iter()
                        .map(|(topic, broker_name, queue_id)| {
                            let topic = b.create_string(topic);
                            let broker_name = b.create_string(broker_name);
                            wire::HeldQueue::create(
                                b,
                                &wire::HeldQueueArgs {
                                    topic: Some(topic),
                                    broker_name: Some(broker_name),
                                    queue_id: *queue_id,
                                },
                            )
                        })
                        .collect();
                    b.create_vector(&queues)
                });
                wire::ConsumerMember::create(
                    b,
                    &wire::ConsumerMemberArgs {
                        client_id: Some(client_id),
                        held_queues,
                    },
                )
            })
            .collect();
        let ids = b.create_vector(&ids);
        let entries = b.create_vector(&entries);
        let body = wire::ConsumerListResponse::create(
            b,
            &wire::ConsumerListResponseArgs {
                client_ids: Some(ids),
                members: Some(entries),
            },
        );
        (wire::Body::ConsumerListResponse, body.as_union_value())
    })
}
