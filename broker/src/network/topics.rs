//! Topic requests: create or update and delete (storage shard 0 owns the table and broadcasts
//! it), the lists a broker serves from its snapshot, and per-queue statistics.

use std::collections::BTreeMap;

use shardmq_schema::wire;

use super::request::{encode_ok, encode_status, invalid, refuse, Answer};
use super::NetworkShard;
use crate::mesh::StorageRequest;
use crate::naming::{check_topic_name, is_system_topic, DLQ_TOPIC_PREFIX, RETRY_TOPIC_PREFIX};
use crate::topics::{TopicConfig, UpsertError};

pub(super) async fn stats(shard: &NetworkShard, id: u64, topic: &str) -> Answer {
    check_topic_name(topic).map_err(invalid)?;
    let table = shard.topics();
    let config = table.get(topic).ok_or_else(|| {
        refuse(
            wire::Status::TOPIC_NOT_FOUND,
            format!("topic {topic} does not exist"),
        )
    })?;
    let queues = config.read_queues.max(config.write_queues);
    let mut by_shard: BTreeMap<usize, Vec<u32>> = BTreeMap::new();
    for queue_id in 0..queues {
        by_shard
            .entry(shard.shard_of(topic, queue_id))
            .or_default()
            .push(queue_id);
    }
    let mut stats = Vec::new();
    for (storage, queue_ids) in by_shard {
        let topic = topic.to_owned();
        stats.extend(
            shard
                .ask(storage, |reply| StorageRequest::QueueStats {
                    topic,
                    queue_ids,
                    reply,
                })
                .await?,
        );
    }
    stats.sort_by_key(|s| s.queue_id);
    encode_ok(shard, id, |b| {
        let name = b.create_string(topic);
        let queues: Vec<_> = stats
            .iter()
            .map(|s| {
                wire::QueueStats::create(
                    b,
                    &wire::QueueStatsArgs {
                        queue_id: s.queue_id as i32,
                        min_offset: s.min_offset as i64,
                        max_offset: s.max_offset as i64,
                        last_update_ms: s.last_update_ms,
                    },
                )
            })
            .collect();
        let queues = b.create_vector(&queues);
        let body = wire::TopicStatsResponse::create(
            b,
            &wire::TopicStatsResponseArgs {
                topic: Some(name),
                queues: Some(queues),
            },
        );
        (wire::Body::TopicStatsResponse, body.as_union_value())
    })
}

/// Creates or updates a topic (on storage shard 0, which owns the table).
pub(super) async fn upsert_topic(
    shard: &NetworkShard,
    id: u64,
    r: wire::UpsertTopicRequest<'_>,
) -> Answer {
    let config = r.config().ok_or_else(|| invalid("config is missing"))?;
    let config = TopicConfig::from_wire(&config);
    let is_create_only = r.create_only();
    let outcome = shard
        .ask(0, |reply| StorageRequest::UpsertTopic {
            config,
            is_create_only,
            reply,
        })
        .await?;
    match outcome {
        Ok(()) => encode_status(shard, id, wire::Status::OK, ""),
        Err(UpsertError::Exists) => Err(refuse(
            wire::Status::TOPIC_ALREADY_EXISTS,
            "the topic already exists",
        )),
        Err(UpsertError::Invalid(why)) => Err(invalid(why)),
    }
}

/// Deletes a topic; system topics only as the broker allows.
pub(super) async fn delete_topic(
    shard: &NetworkShard,
    id: u64,
    r: wire::DeleteTopicRequest<'_>,
) -> Answer {
    let topic = r.topic().unwrap_or_default().to_owned();
    check_topic_name(&topic).map_err(invalid)?;
    if is_system_topic(&topic) {
        // The broker's own machinery reads them (delays, timers, transactions, retries,
        // dead letters); deleting one would lose what is parked there. Only a group's
        // retry or dead-letter topic may go, forced, once the group has no live member.
        let group = topic
            .strip_prefix(RETRY_TOPIC_PREFIX)
            .or_else(|| topic.strip_prefix(DLQ_TOPIC_PREFIX))
            .map(str::to_owned);
        let Some(group) = group.filter(|_| r.force()) else {
            return Err(refuse(
                wire::Status::NO_PERMISSION,
                format!("{topic} is a system topic; the broker owns it and it cannot be deleted (a group's %RETRY%/%DLQ% topic can be, forced, once the group has no live member)"),
            ));
        };
        let members = shard
            .ask(0, |reply| StorageRequest::ConsumerList {
                group: group.clone(),
                reply,
            })
            .await?;
        if !members.is_empty() {
            return Err(refuse(
                wire::Status::NO_PERMISSION,
                format!(
                    "group {group} has {} live member(s); stop its consumers before deleting {topic}",
                    members.len()
                ),
            ));
        }
    }
    let removed = shard
        .ask(0, |reply| StorageRequest::DeleteTopic { topic, reply })
        .await?;
    if removed {
        encode_status(shard, id, wire::Status::OK, "")
    } else {
        Err(refuse(wire::Status::TOPIC_NOT_FOUND, "no such topic"))
    }
}

/// Every topic config of this broker.
pub(super) fn broker_topics(
    shard: &NetworkShard,
    id: u64,
    r: wire::BrokerTopicsRequest<'_>,
) -> Answer {
    let include_system = r.include_system();
    let table = shard.topics();
    encode_ok(shard, id, |b| {
        let configs: Vec<_> = table
            .topics
            .values()
            .filter(|t| include_system || !is_system_topic(&t.name))
            .map(|t| t.to_wire(b))
            .collect();
        let topics = b.create_vector(&configs);
        let body = wire::BrokerTopicsResponse::create(
            b,
            &wire::BrokerTopicsResponseArgs {
                topics: Some(topics),
            },
        );
        (wire::Body::BrokerTopicsResponse, body.as_union_value())
    })
}

/// The names of this broker's user topics.
pub(super) fn topic_list(shard: &NetworkShard, id: u64) -> Answer {
    let table = shard.topics();
    encode_ok(shard, id, |b| {
        let names: Vec<_> = table
            .topics
            .keys()
            .filter(|t| !is_system_topic(t))
            .map(|t| b.create_string(t))
            .collect();
        let names = b.create_vector(&names);
        let body = wire::TopicListResponse::create(
            b,
            &wire::TopicListResponseArgs {
                topics: Some(names),
            },
        );
        (wire::Body::TopicListResponse, body.as_union_value())
    })
}
