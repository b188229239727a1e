//! The admin calls `mqadmin` and RocketMQ's `DefaultMQAdminExt` make of a broker, each served by
//! the native request it corresponds to: GET_BROKER_RUNTIME_INFO (28) by the broker status,
//! GET_TOPIC_STATS_INFO (202) by the topic stats, GET_CONSUME_STATS (208) by the topic stats and
//! the group's committed offsets, GET_CONSUMER_CONNECTION_LIST (203) by the heartbeat registry
//! (the members of a group and what their heartbeats declared), QUERY_TOPIC_CONSUME_BY_WHO
//! (300) by the group list, DELETE_TOPIC_IN_BROKER (215) by the topic deletion.
//!
//! Read-only except 215. Never: subscription-group configs (UPDATE_AND_CREATE_SUBSCRIPTIONGROUP
//! 200, DELETE_SUBSCRIPTIONGROUP 207): ShardMQ has none (a group exists by its members and
//! offsets), so those codes stay unsupported rather than acknowledged and ignored. The bodies'
//! bytes are `shardmq_remoting::admin`'s.

use std::collections::BTreeMap;
use std::time::{SystemTime, UNIX_EPOCH};

use shardmq_remoting::admin::{
    encode_consume_stats, encode_consumer_connection, encode_group_list, encode_kv_table,
    encode_topic_stats_table, sql_subscription, tag_subscription, ConsumerConnection,
    ConsumerConnectionEntry, OffsetWrapper, TopicOffset,
};
use shardmq_remoting::codes::response;
use shardmq_remoting::{BodyError, MessageQueue, RemotingCommand, SERVER_VERSION};
use shardmq_schema::wire;

use super::dispatch::{native_answer, native_request, required, Answer, Reply};
use crate::config::BrokerRole;
use crate::mesh::StorageRequest;
use crate::naming::{check_group_name, check_topic_name};
use crate::network::request::{invalid, refuse, Connection, Refusal};
use crate::network::NetworkShard;
use crate::network::{admin as native_admin, topics};

/// Most topics one GET_CONSUME_STATS reads (its `topicList`, or the group's topics).
const MAX_CONSUME_STATS_TOPICS: usize = 1024;
/// Most queues one GET_CONSUME_STATS reports, over all its topics: each costs a committed
/// offset lookup.
const MAX_CONSUME_STATS_QUEUES: usize = 65_536;

/// RocketMQ's `CONSUMER_NOT_ONLINE`: GET_CONSUMER_CONNECTION_LIST of a group with no member.
const CONSUMER_NOT_ONLINE: i32 = 206;

/// What a connection entry says where the heartbeat registry does not know: it keeps client
/// ids, not their address, language or version.
const UNKNOWN_LANGUAGE: &str = "OTHER";

pub(super) async fn runtime_info(
    shard: &NetworkShard,
    _connection: &Connection,
    command: &RemotingCommand,
) -> Answer {
    let answer = native_answer(shard, native_admin::broker_status(shard, 0).await)?;
    let status = answer
        .frame()
        .body_as_broker_status_response()
        .ok_or_else(|| no_body("broker status"))?;
    let now_ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| since.as_millis() as u64);
    let uptime_ms = status.uptime_ms();
    let mut table = BTreeMap::new();
    let mut put = |key: &str, value: String| {
        table.insert(key.to_owned(), value);
    };
    // RocketMQ's own names, where the figure means what RocketMQ's does.
    put(
        "brokerVersionDesc",
        format!("ShardMQ {}", status.version().unwrap_or_default()),
    );
    put("brokerVersion", SERVER_VERSION.to_string());
    put(
        "bootTimestamp",
        now_ms.saturating_sub(uptime_ms).to_string(),
    );
    put("runtime", runtime_text(uptime_ms));
    if status.disk_total_bytes() > 0 {
        let used =
            status.disk_total_bytes() - status.disk_free_bytes().min(status.disk_total_bytes());
        put(
            "commitLogDiskRatio",
            (used as f64 / status.disk_total_bytes() as f64).to_string(),
        );
    }
    // ShardMQ's broker status, every field under its own name.
    put(
        "clusterName",
        status.cluster_name().unwrap_or_default().to_owned(),
    );
    put(
        "brokerName",
        status.broker_name().unwrap_or_default().to_owned(),
    );
    put("uptimeMs", uptime_ms.to_string());
    put("storageShards", status.storage_shards().to_string());
    put("networkShards", status.network_shards().to_string());
    put(
        "placement",
        status.placement().unwrap_or_default().to_owned(),
    );
    put("flush", status.flush().unwrap_or_default().to_owned());
    put("messagesIn", status.messages_in().to_string());
    put("bytesIn", status.bytes_in().to_string());
    put("messagesOut", status.messages_out().to_string());
    put("bytesOut", status.bytes_out().to_string());
    put("connections", status.connections().to_string());
    put("parkedPulls", status.parked_pulls().to_string());
    put("topics", status.topics().to_string());
    put("commitlogBytes", status.commitlog_bytes().to_string());
    put("diskTotalBytes", status.disk_total_bytes().to_string());
    put("diskFreeBytes", status.disk_free_bytes().to_string());
    put("role", status.role().unwrap_or_default().to_owned());
    put("replicaLagBytes", status.replica_lag_bytes().to_string());
    let body = encode_kv_table(&table).map_err(body_error)?;
    Ok(Reply::to(command, response::SUCCESS).with_body(body))
}

/// RocketMQ's `runtime` figure: `[ 0 days, 1 hours, 2 minutes, 3 seconds ]`.
fn runtime_text(uptime_ms: u64) -> String {
    let seconds = uptime_ms / 1000;
    format!(
        "[ {} days, {} hours, {} minutes, {} seconds ]",
        seconds / 86_400,
        seconds / 3_600 % 24,
        seconds / 60 % 60,
        seconds % 60
    )
}

pub(super) async fn topic_stats(
    shard: &NetworkShard,
    _connection: &Connection,
    command: &RemotingCommand,
) -> Answer {
    let topic = required(command, "topic")?;
    let queues = queue_stats(shard, topic).await?;
    let broker_name = &shard.config.broker_name;
    let offsets: Vec<_> = queues
        .iter()
        .map(|queue| {
            (
                message_queue(topic, broker_name, queue.queue_id),
                TopicOffset {
                    min_offset: queue.min_offset,
                    max_offset: queue.max_offset,
                    last_update_timestamp: queue.last_update_ms,
                },
            )
        })
        .collect();
    // ShardMQ keeps no per-topic put rate; RocketMQ's tools read 0 as idle.
    let body = encode_topic_stats_table(&offsets, 0.0).map_err(body_error)?;
    Ok(Reply::to(command, response::SUCCESS).with_body(body))
}

/// One queue of the native topic stats, copied out of the answer's frame.
struct QueueFigures {
    queue_id: i32,
    min_offset: i64,
    max_offset: i64,
    last_update_ms: i64,
}

/// The native topic stats of `topic`: every queue's offsets and last store time.
async fn queue_stats(shard: &NetworkShard, topic: &str) -> Result<Vec<QueueFigures>, Refusal> {
    let answer = native_answer(shard, topics::stats(shard, 0, topic).await)?;
    let stats = answer
        .frame()
        .body_as_topic_stats_response()
        .ok_or_else(|| no_body("topic stats"))?;
    Ok(stats
        .queues()
        .iter()
        .flat_map(|queues| queues.iter())
        .map(|queue| QueueFigures {
            queue_id: queue.queue_id(),
            min_offset: queue.min_offset(),
            max_offset: queue.max_offset(),
            last_update_ms: queue.last_update_ms(),
        })
        .collect())
}

pub(super) async fn consume_stats(
    shard: &NetworkShard,
    _connection: &Connection,
    command: &RemotingCommand,
) -> Answer {
    let group = required(command, "consumerGroup")?;
    check_group_name(group).map_err(invalid)?;
    let topics = match (
        command.ext("topic").filter(|topic| !topic.is_empty()),
        command.ext("topicList").filter(|list| !list.is_empty()),
    ) {
        (Some(topic), _) => vec![topic.to_owned()],
        (None, Some(list)) => list
            .split(';')
            .filter(|topic| !topic.is_empty())
            .map(str::to_owned)
            .collect(),
        (None, None) => topics_of_group(shard, group).await?,
    };
    if topics.len() > MAX_CONSUME_STATS_TOPICS {
        return Err(invalid(format!(
            "consume stats of {} topics asked for, over max_consume_stats_topics ({MAX_CONSUME_STATS_TOPICS})",
            topics.len()
        )));
    }
    let broker_name = &shard.config.broker_name;
    let mut offsets = Vec::new();
    for topic in &topics {
        check_topic_name(topic).map_err(invalid)?;
        let queues = match queue_stats(shard, topic).await {
            Ok(queues) => queues,
            // As RocketMQ's brokers do: a topic this broker does not host is left out.
            Err(refusal) if refusal.status == wire::Status::TOPIC_NOT_FOUND => continue,
            Err(refusal) => return Err(refusal),
        };
        if offsets.len() + queues.len() > MAX_CONSUME_STATS_QUEUES {
            return Err(invalid(format!(
                "consume stats would report more than max_consume_stats_queues ({MAX_CONSUME_STATS_QUEUES}) queues"
            )));
        }
        for queue in queues {
            let committed =
                super::consume::committed_offset(shard, group, topic, queue.queue_id).await?;
            let consumer_offset = committed.unwrap_or(0);
            // The store time of the last consumed message is known when the group has consumed
            // the whole queue (it is the newest message's); otherwise 0, RocketMQ's "unknown".
            let last_timestamp = if consumer_offset > 0 && consumer_offset >= queue.max_offset {
                queue.last_update_ms
            } else {
                0
            };
            offsets.push((
                message_queue(topic, broker_name, queue.queue_id),
                OffsetWrapper {
                    broker_offset: queue.max_offset,
                    consumer_offset,
                    last_timestamp,
                    // ShardMQ records no pull offsets; RocketMQ reports the consumer offset then.
                    pull_offset: consumer_offset,
                },
            ));
        }
    }
    // ShardMQ keeps no per-group consume rate.
    let body = encode_consume_stats(&offsets, 0.0).map_err(body_error)?;
    Ok(Reply::to(command, response::SUCCESS).with_body(body))
}

/// The topics a group subscribes to or has committed offsets for (the native group list).
async fn topics_of_group(shard: &NetworkShard, group: &str) -> Result<Vec<String>, Refusal> {
    let answer = native_answer(shard, native_admin::group_list(shard, 0).await)?;
    let groups = answer
        .frame()
        .body_as_group_list_response()
        .ok_or_else(|| no_body("group list"))?;
    Ok(groups
        .groups()
        .iter()
        .flat_map(|groups| groups.iter())
        .find(|summary| summary.group() == Some(group))
        .and_then(|summary| summary.topics())
        .map(|topics| topics.iter().map(str::to_owned).collect())
        .unwrap_or_default())
}

pub(super) async fn consumer_connections(
    shard: &NetworkShard,
    _connection: &Connection,
    command: &RemotingCommand,
) -> Answer {
    let group = required(command, "consumerGroup")?;
    check_group_name(group).map_err(invalid)?;
    let group_name = group.to_owned();
    let members = shard
        .ask(0, |reply| StorageRequest::ConsumerGroupMembers {
            group: group_name,
            reply,
        })
        .await?;
    if members.is_empty() {
        let mut reply = Reply::to(command, CONSUMER_NOT_ONLINE);
        reply.command.remark = Some(format!("the consumer group {group} is not online"));
        return Ok(reply);
    }
    let mut connection = ConsumerConnection {
        // Members agree on the model in practice; the first (by client id) speaks for them.
        message_model: members.first().map(|(_, membership)| {
            if membership.is_broadcasting {
                "BROADCASTING"
            } else {
                "CLUSTERING"
            }
            .to_owned()
        }),
        // The native heartbeat does not carry RocketMQ's consume type (push or pull).
        consume_type: None,
        ..ConsumerConnection::default()
    };
    for (client_id, membership) in &members {
        connection.connection_set.push(ConsumerConnectionEntry {
            client_id: client_id.clone(),
            client_addr: String::new(),
            language: UNKNOWN_LANGUAGE.to_owned(),
            version: 0,
        });
        for (topic, expression, is_sql) in &membership.subscriptions {
            connection
                .subscription_table
                .entry(topic.clone())
                .or_insert_with(|| {
                    if *is_sql {
                        sql_subscription(topic, expression)
                    } else {
                        tag_subscription(topic, expression)
                    }
                });
        }
    }
    let body = encode_consumer_connection(&connection).map_err(body_error)?;
    Ok(Reply::to(command, response::SUCCESS).with_body(body))
}

pub(super) async fn topic_consumed_by(
    shard: &NetworkShard,
    _connection: &Connection,
    command: &RemotingCommand,
) -> Answer {
    let topic = required(command, "topic")?;
    check_topic_name(topic).map_err(invalid)?;
    let answer = native_answer(shard, native_admin::group_list(shard, 0).await)?;
    let list = answer
        .frame()
        .body_as_group_list_response()
        .ok_or_else(|| no_body("group list"))?;
    let groups: Vec<String> = list
        .groups()
        .iter()
        .flat_map(|groups| groups.iter())
        .filter(|summary| {
            summary
                .topics()
                .is_some_and(|topics| topics.iter().any(|t| t == topic))
        })
        .filter_map(|summary| summary.group().map(str::to_owned))
        .collect();
    let body = encode_group_list(&groups).map_err(body_error)?;
    Ok(Reply::to(command, response::SUCCESS).with_body(body))
}

/// DELETE_TOPIC_IN_BROKER: the native deletion (system topics are refused as natively). A
/// topic this broker does not host is answered SUCCESS, as RocketMQ's brokers answer it:
/// `mqadmin deleteTopic` sends the request to every broker of the cluster.
pub(super) async fn delete_topic(
    shard: &NetworkShard,
    _connection: &Connection,
    command: &RemotingCommand,
) -> Answer {
    let topic = required(command, "topic")?;
    if shard.config.role() == BrokerRole::Slave {
        return Err(refuse(
            wire::Status::SERVICE_NOT_AVAILABLE,
            format!(
                "this broker is a slave of {} (broker id {}): it takes no topic changes; use the master",
                shard.config.ha_master, shard.config.broker_id
            ),
        ));
    }
    let request = native_request(shard, |b| {
        let topic = b.create_string(topic);
        let body = wire::DeleteTopicRequest::create(
            b,
            &wire::DeleteTopicRequestArgs {
                topic: Some(topic),
                force: false,
            },
        );
        (wire::Body::DeleteTopicRequest, body.as_union_value())
    })?;
    let delete = request
        .frame()
        .body_as_delete_topic_request()
        .expect("built as a topic deletion");
    match native_answer(shard, topics::delete_topic(shard, 0, delete).await) {
        Ok(_) => Ok(Reply::to(command, response::SUCCESS)),
        Err(refusal) if refusal.status == wire::Status::TOPIC_NOT_FOUND => {
            Ok(Reply::to(command, response::SUCCESS))
        }
        Err(refusal) => Err(refusal),
    }
}

fn message_queue(topic: &str, broker_name: &str, queue_id: i32) -> MessageQueue {
    MessageQueue {
        topic: topic.to_owned(),
        broker_name: broker_name.to_owned(),
        queue_id,
    }
}

fn no_body(what: &str) -> Refusal {
    refuse(
        wire::Status::SYSTEM_ERROR,
        format!("the broker's {what} answer has no body"),
    )
}

fn body_error(error: BodyError) -> Refusal {
    refuse(wire::Status::SYSTEM_ERROR, error.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runtime_reads_as_rocketmq_writes_it() {
        assert_eq!(runtime_text(0), "[ 0 days, 0 hours, 0 minutes, 0 seconds ]");
        assert_eq!(
            runtime_text(((2 * 86_400) + (3 * 3_600) + (4 * 60) + 5) * 1000 + 999),
            "[ 2 days, 3 hours, 4 minutes, 5 seconds ]"
        );
    }
}
