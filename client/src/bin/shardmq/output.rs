//! How the CLI prints results: one text line or one JSON object per item.
//!
//! Owns the output formats (scripts rely on the JSON field names; keep them stable, add
//! rather than rename). Never: talking to servers.

use serde_json::{json, Value};
use shardmq_client::{
    BrokerData, ClusterInfo, MessageExt, QueueProgress, QueueStats, SendResult, TopicConfig,
    TopicRoute,
};

pub fn send_result_json(result: &SendResult) -> Value {
    json!({
        "status": result.status.as_str(),
        "msg_id": result.msg_id,
        "offset_msg_id": result.offset_msg_id,
        "topic": result.queue.topic,
        "broker_name": result.queue.broker_name,
        "queue_id": result.queue.queue_id,
        "queue_offset": result.queue_offset,
    })
}

pub fn send_result_text(result: &SendResult) -> String {
    format!(
        "{} msg_id={} queue={} offset={} offset_msg_id={}",
        result.status, result.msg_id, result.queue, result.queue_offset, result.offset_msg_id
    )
}

pub fn message_json(message: &MessageExt) -> Value {
    let properties: serde_json::Map<String, Value> = message
        .user_properties()
        .map(|(name, value)| (name.to_owned(), Value::from(value)))
        .collect();
    json!({
        "topic": message.topic,
        "broker_name": message.broker_name,
        "queue_id": message.queue_id,
        "queue_offset": message.queue_offset,
        "msg_id": message.msg_id(),
        "tags": message.tags(),
        "keys": message.keys(),
        "born_timestamp_ms": message.born_timestamp_ms,
        "store_timestamp_ms": message.store_timestamp_ms,
        "reconsume_times": message.reconsume_times,
        "properties": properties,
        "body": String::from_utf8_lossy(&message.body),
    })
}

pub fn message_text(message: &MessageExt) -> String {
    format!(
        "queue={}@{}#{} offset={} msg_id={} tags={} keys={} body={}",
        message.topic,
        message.broker_name,
        message.queue_id,
        message.queue_offset,
        message.msg_id(),
        message.tags().unwrap_or("-"),
        if message.keys().is_empty() {
            "-".to_owned()
        } else {
            message.keys().join(",")
        },
        String::from_utf8_lossy(&message.body)
    )
}

pub fn route_json(route: &TopicRoute) -> Value {
    let brokers: Vec<Value> = route
        .brokers
        .values()
        .map(|broker| {
            let queues = route.queues.get(&broker.broker_name);
            json!({
                "cluster_name": broker.cluster_name,
                "broker_name": broker.broker_name,
                "addresses": broker.addresses.iter().map(|(id, address)| json!({"broker_id": id, "address": address})).collect::<Vec<_>>(),
                "read_queues": queues.map(|q| q.read_queues),
                "write_queues": queues.map(|q| q.write_queues),
                "perm": queues.map(|q| q.perm),
            })
        })
        .collect();
    json!({ "topic": route.topic, "brokers": brokers })
}

pub fn route_text(route: &TopicRoute) -> String {
    let mut lines = vec![format!("topic {}", route.topic)];
    for broker in route.brokers.values() {
        let addresses: Vec<String> = broker
            .addresses
            .iter()
            .map(|(id, address)| format!("{id}={address}"))
            .collect();
        let queues = route
            .queues
            .get(&broker.broker_name)
            .map(|q| {
                format!(
                    "read_queues={} write_queues={} perm={}",
                    q.read_queues, q.write_queues, q.perm
                )
            })
            .unwrap_or_else(|| "no queues".to_owned());
        lines.push(format!(
            "  broker {} (cluster {}) addresses {} {queues}",
            broker.broker_name,
            broker.cluster_name,
            addresses.join(",")
        ));
    }
    lines.join("\n")
}

pub fn stats_json(topic: &str, stats: &[QueueStats]) -> Value {
    let queues: Vec<Value> = stats
        .iter()
        .map(|queue| {
            json!({
                "broker_name": queue.broker_name,
                "queue_id": queue.queue_id,
                "min_offset": queue.min_offset,
                "max_offset": queue.max_offset,
                "last_update_ms": queue.last_update_ms,
            })
        })
        .collect();
    json!({ "topic": topic, "queues": queues })
}

pub fn stats_text(stats: &[QueueStats]) -> String {
    let mut lines = vec![format!(
        "{:<20} {:>6} {:>14} {:>14} {:>15}",
        "broker", "queue", "min_offset", "max_offset", "last_update_ms"
    )];
    for queue in stats {
        lines.push(format!(
            "{:<20} {:>6} {:>14} {:>14} {:>15}",
            queue.broker_name,
            queue.queue_id,
            queue.min_offset,
            queue.max_offset,
            queue.last_update_ms
        ));
    }
    lines.join("\n")
}

pub fn progress_json(group: &str, progress: &[QueueProgress]) -> Value {
    let queues: Vec<Value> = progress
        .iter()
        .map(|queue| {
            json!({
                "topic": queue.queue.topic,
                "broker_name": queue.queue.broker_name,
                "queue_id": queue.queue.queue_id,
                "committed_offset": queue.committed_offset,
                "max_offset": queue.max_offset,
                "lag": queue.lag(),
            })
        })
        .collect();
    let total: i64 = progress.iter().map(QueueProgress::lag).sum();
    json!({ "group": group, "queues": queues, "total_lag": total })
}

pub fn progress_text(progress: &[QueueProgress]) -> String {
    let mut lines = vec![format!(
        "{:<30} {:>16} {:>14} {:>10}",
        "queue", "committed_offset", "max_offset", "lag"
    )];
    for queue in progress {
        lines.push(format!(
            "{:<30} {:>16} {:>14} {:>10}",
            queue.queue.to_string(),
            queue
                .committed_offset
                .map_or_else(|| "-".to_owned(), |offset| offset.to_string()),
            queue.max_offset,
            queue.lag()
        ));
    }
    let total: i64 = progress.iter().map(QueueProgress::lag).sum();
    lines.push(format!("total lag {total}"));
    lines.join("\n")
}

pub fn topic_config_json(config: &TopicConfig) -> Value {
    json!({
        "name": config.name,
        "read_queues": config.read_queues,
        "write_queues": config.write_queues,
        "perm": config.perm,
        "is_ordered": config.is_ordered,
    })
}

pub fn topic_config_text(config: &TopicConfig) -> String {
    format!(
        "{} read_queues={} write_queues={} perm={}{}",
        config.name,
        config.read_queues,
        config.write_queues,
        config.perm,
        if config.is_ordered { " ordered" } else { "" }
    )
}

fn broker_json(broker: &BrokerData) -> Value {
    json!({
        "broker_name": broker.broker_name,
        "addresses": broker
            .addresses
            .iter()
            .map(|(id, address)| json!({ "broker_id": id, "address": address }))
            .collect::<Vec<_>>(),
    })
}

pub fn clusters_json(clusters: &[ClusterInfo]) -> Value {
    let clusters: Vec<Value> = clusters
        .iter()
        .map(|cluster| {
            json!({
                "cluster_name": cluster.name,
                "brokers": cluster.brokers.iter().map(broker_json).collect::<Vec<_>>(),
            })
        })
        .collect();
    json!({ "clusters": clusters })
}

pub fn clusters_text(clusters: &[ClusterInfo]) -> String {
    let mut lines = Vec::new();
    for cluster in clusters {
        lines.push(format!("cluster {}", cluster.name));
        for broker in &cluster.brokers {
            let addresses: Vec<String> = broker
                .addresses
                .iter()
                .map(|(id, address)| format!("{id}={address}"))
                .collect();
            lines.push(format!(
                "  broker {} addresses {}",
                broker.broker_name,
                addresses.join(",")
            ));
        }
    }
    lines.join("\n")
}
