//! How the CLI prints results: one text line or one JSON object per item.
//!
//! Owns the output formats (scripts rely on the JSON field names; keep them stable, add
//! rather than rename). Never: talking to servers.

use serde_json::{json, Value};
use shardmq_client::{
    BrokerData, BrokerStatus, ClusterInfo, GroupSummary, MessageExt, OffsetReset, QueueProgress,
    QueueStats, SendResult, TopicConfig, TopicRoute,
};

pub fn print_json(value: &serde_json::Value) {
    println!("{value}");
}

pub fn send_result_json(result: &SendResult) -> Value {
    json!({
        "status": result.status.as_str(),
        "msg_id": result.msg_id.to_string(),
        "offset_msg_id": result.offset_msg_id(),
        "topic": result.queue.topic,
        "broker_name": result.queue.broker_name,
        "queue_id": result.queue.queue_id,
        "queue_offset": result.queue_offset,
        "scheduled": result.is_scheduled(),
    })
}

pub fn send_result_text(result: &SendResult) -> String {
    let offset = if result.is_scheduled() {
        "scheduled".to_owned()
    } else {
        result.queue_offset.to_string()
    };
    format!(
        "{} msg_id={} queue={} offset={offset} offset_msg_id={}",
        result.status,
        result.msg_id,
        result.queue,
        result.offset_msg_id()
    )
}

pub fn message_json(message: &MessageExt) -> Value {
    let properties: serde_json::Map<String, Value> = message
        .user_properties()
        .map(|(name, value)| (name.to_owned(), Value::from(value)))
        .collect();
    json!({
        "topic": message.topic(),
        "broker_name": message.broker_name(),
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
        message.topic(),
        message.broker_name(),
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

pub fn groups_json(groups: &[GroupSummary]) -> Value {
    let groups: Vec<Value> = groups
        .iter()
        .map(
            |g| json!({ "group": g.group, "members": g.members, "topics": g.topics, "lag": g.lag }),
        )
        .collect();
    json!({ "groups": groups })
}

pub fn groups_text(groups: &[GroupSummary]) -> String {
    let mut lines = vec![format!(
        "{:<32} {:>8} {:>12}  topics",
        "group", "members", "lag"
    )];
    for g in groups {
        lines.push(format!(
            "{:<32} {:>8} {:>12}  {}",
            g.group,
            g.members,
            g.lag,
            g.topics.join(",")
        ));
    }
    lines.join("\n")
}

pub fn resets_json(group: &str, resets: &[OffsetReset]) -> Value {
    let queues: Vec<Value> = resets
        .iter()
        .map(|r| {
            json!({
                "topic": r.queue.topic,
                "broker_name": r.queue.broker_name,
                "queue_id": r.queue.queue_id,
                "previous_offset": r.previous,
                "offset": r.offset,
            })
        })
        .collect();
    json!({ "group": group, "queues": queues })
}

pub fn resets_text(resets: &[OffsetReset]) -> String {
    let mut lines = vec![format!(
        "{:<30} {:>16} {:>14}",
        "queue", "previous_offset", "offset"
    )];
    for r in resets {
        lines.push(format!(
            "{:<30} {:>16} {:>14}",
            r.queue.to_string(),
            r.previous.map_or_else(|| "-".to_owned(), |o| o.to_string()),
            r.offset
        ));
    }
    lines.join("\n")
}

/// Per-second rates between two status samples of one broker.
pub struct StatusRates {
    pub messages_in_per_sec: f64,
    pub messages_out_per_sec: f64,
    pub bytes_in_per_sec: f64,
    pub bytes_out_per_sec: f64,
}

impl StatusRates {
    pub fn between(first: &BrokerStatus, second: &BrokerStatus) -> StatusRates {
        let seconds = (second.uptime_ms.saturating_sub(first.uptime_ms) as f64 / 1000.0).max(1e-3);
        let rate = |a: u64, b: u64| b.saturating_sub(a) as f64 / seconds;
        StatusRates {
            messages_in_per_sec: rate(first.messages_in, second.messages_in),
            messages_out_per_sec: rate(first.messages_out, second.messages_out),
            bytes_in_per_sec: rate(first.bytes_in, second.bytes_in),
            bytes_out_per_sec: rate(first.bytes_out, second.bytes_out),
        }
    }
}

pub fn broker_status_json(status: &BrokerStatus, rates: Option<&StatusRates>) -> Value {
    let mut value = json!({
        "address": status.address,
        "cluster_name": status.cluster_name,
        "broker_name": status.broker_name,
        "version": status.version,
        "uptime_ms": status.uptime_ms,
        "storage_shards": status.storage_shards,
        "network_shards": status.network_shards,
        "placement": status.placement,
        "flush": status.flush,
        "role": status.role,
        "replica_lag_bytes": status.replica_lag_bytes,
        "replication": status.replication.iter().map(|r| json!({
            "storage_shard": r.storage_shard,
            "peer": r.peer,
            "epoch": r.epoch,
            "lag_bytes": r.lag_bytes,
            "lag_ms": r.lag_ms,
            "connected": r.connected,
        })).collect::<Vec<_>>(),
        "messages_in": status.messages_in,
        "bytes_in": status.bytes_in,
        "messages_out": status.messages_out,
        "bytes_out": status.bytes_out,
        "connections": status.connections,
        "parked_pulls": status.parked_pulls,
        "topics": status.topics,
        "commitlog_bytes": status.commitlog_bytes,
        "disk_total_bytes": status.disk_total_bytes,
        "disk_free_bytes": status.disk_free_bytes,
    });
    if let Some(rates) = rates {
        value["in_tps"] = json!(rates.messages_in_per_sec);
        value["out_tps"] = json!(rates.messages_out_per_sec);
        value["in_bytes_per_sec"] = json!(rates.bytes_in_per_sec);
        value["out_bytes_per_sec"] = json!(rates.bytes_out_per_sec);
    }
    value
}

pub fn broker_status_text(status: &BrokerStatus, rates: Option<&StatusRates>) -> String {
    let used = status
        .disk_total_bytes
        .saturating_sub(status.disk_free_bytes);
    let used_percent = if status.disk_total_bytes == 0 {
        0.0
    } else {
        100.0 * used as f64 / status.disk_total_bytes as f64
    };
    let mut lines = vec![
        format!(
            "broker      {}/{} at {} (version {}, up {} s)",
            status.cluster_name,
            status.broker_name,
            status.address,
            status.version,
            status.uptime_ms / 1000
        ),
        format!(
            "shards      {} storage, {} network: {}",
            status.storage_shards, status.network_shards, status.placement
        ),
        format!("flush       {}", status.flush),
        format!(
            "role        {}{}",
            status.role,
            match status.replica_lag_bytes {
                Some(lag) => format!(", slave {lag} bytes behind"),
                None if status.role.ends_with("master") => ", no slave replicating".to_owned(),
                None => String::new(),
            }
        ),
    ];
    for r in &status.replication {
        let unknown = |v: Option<u64>| v.map_or("?".to_owned(), |v| v.to_string());
        let side = if status.role == "slave" {
            "master"
        } else {
            "slave"
        };
        lines.push(format!(
            "replication shard {}: epoch {}, {side} {}, lag {} bytes / {} ms{}",
            r.storage_shard,
            r.epoch,
            if r.peer.is_empty() {
                "none"
            } else {
                r.peer.as_str()
            },
            unknown(r.lag_bytes),
            unknown(r.lag_ms),
            if r.connected { "" } else { " (not connected)" }
        ));
    }
    lines.extend([format!(
        "messages    in {} ({} bytes), out {} ({} bytes) since start",
        status.messages_in, status.bytes_in, status.messages_out, status.bytes_out
    )]);
    if let Some(rates) = rates {
        lines.push(format!(
            "tps         in {:.1} msg/s ({:.1} KiB/s), out {:.1} msg/s ({:.1} KiB/s)",
            rates.messages_in_per_sec,
            rates.bytes_in_per_sec / 1024.0,
            rates.messages_out_per_sec,
            rates.bytes_out_per_sec / 1024.0
        ));
    }
    lines.push(format!(
        "clients     {} connections, {} parked pulls, {} topics",
        status.connections, status.parked_pulls, status.topics
    ));
    lines.push(format!(
        "disk        commitlog {} MiB; file system {:.1}% used, {} MiB free of {} MiB",
        status.commitlog_bytes >> 20,
        used_percent,
        status.disk_free_bytes >> 20,
        status.disk_total_bytes >> 20
    ));
    lines.join("\n")
}

/// Milliseconds since the epoch of an RFC 3339 time: `YYYY-MM-DDTHH:MM:SS[.fraction]` then `Z`
/// or `±HH:MM` (a space may stand for `T`).
pub fn parse_rfc3339_ms(text: &str) -> Option<i64> {
    let bytes = text.as_bytes();
    if bytes.len() < 20 {
        return None;
    }
    let number = |range: std::ops::Range<usize>| -> Option<i64> {
        let part = text.get(range)?;
        part.bytes()
            .all(|b| b.is_ascii_digit())
            .then(|| part.parse().ok())
            .flatten()
    };
    let separators_ok = bytes[4] == b'-'
        && bytes[7] == b'-'
        && matches!(bytes[10], b'T' | b't' | b' ')
        && bytes[13] == b':'
        && bytes[16] == b':';
    if !separators_ok {
        return None;
    }
    let (year, month, day) = (number(0..4)?, number(5..7)?, number(8..10)?);
    let (hour, minute, second) = (number(11..13)?, number(14..16)?, number(17..19)?);
    if !(1..=12).contains(&month)
        || !(1..=31).contains(&day)
        || hour > 23
        || minute > 59
        || second > 60
    {
        return None;
    }
    let mut rest = &text[19..];
    let mut millis = 0i64;
    if let Some(fraction) = rest.strip_prefix('.') {
        let digits = fraction.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return None;
        }
        let padded = format!("{:0<3}", &fraction[..digits.min(3)]);
        millis = padded.parse().ok()?;
        rest = &fraction[digits..];
    }
    let offset_minutes = match rest {
        "Z" | "z" => 0,
        _ if rest.len() == 6 && rest.as_bytes()[3] == b':' => {
            let sign = match rest.as_bytes()[0] {
                b'+' => 1,
                b'-' => -1,
                _ => return None,
            };
            let hours: i64 = rest.get(1..3)?.parse().ok()?;
            let minutes: i64 = rest.get(4..6)?.parse().ok()?;
            sign * (hours * 60 + minutes)
        }
        _ => return None,
    };
    // Days from the civil date (Howard Hinnant's algorithm).
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let year_of_era = y - era * 400;
    let shifted_month = (month + 9) % 12;
    let day_of_year = (153 * shifted_month + 2) / 5 + day - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    let days = era * 146_097 + day_of_era - 719_468;
    let seconds = days * 86_400 + hour * 3600 + minute * 60 + second - offset_minutes * 60;
    Some(seconds * 1000 + millis)
}

pub fn controller_status_json(status: &shardmq_client::ControllerStatus) -> Value {
    json!({
        "address": status.address,
        "node_id": status.node_id,
        "leader_id": status.leader_id,
        "members": status.members,
        "term": status.term,
        "last_applied": status.last_applied,
        "alive_from": status.alive_from,
        "groups": status.groups.iter().map(|g| json!({
            "cluster_name": g.cluster_name,
            "broker_name": g.broker_name,
            "master_id": g.master_id,
            "master_address": g.master_address,
            "master_ha_address": g.master_ha_address,
            "epoch": g.epoch,
            "sync_state_set": g.sync_state_set,
            "sync_state_epoch": g.sync_state_epoch,
            "replicas": g.replicas.iter().map(|(id, a)| json!({"id": id, "address": a})).collect::<Vec<_>>(),
            "alive": g.alive,
        })).collect::<Vec<_>>(),
    })
}

pub fn controller_status_text(status: &shardmq_client::ControllerStatus) -> String {
    let leader = if status.leader_id == 0 {
        "none".to_owned()
    } else {
        status.leader_id.to_string()
    };
    let mut lines = vec![
        format!(
            "controller  {} (node {}), leader {leader}, term {}, applied {}",
            status.address, status.node_id, status.term, status.last_applied
        ),
        format!("members     {}", status.members.join(", ")),
        if status.alive_from == 0 {
            "alive       unknown (no leader could be asked)".to_owned()
        } else {
            format!(
                "alive       as the leader (node {}) sees it",
                status.alive_from
            )
        },
    ];
    for g in &status.groups {
        let replicas: Vec<String> = g
            .replicas
            .iter()
            .map(|(id, a)| format!("{id}={a}"))
            .collect();
        lines.push(format!(
            "group       {}/{}: master {} at {} (HA {}), epoch {}, in sync {:?} (set epoch {}), replicas {}, alive {:?}",
            g.cluster_name,
            g.broker_name,
            g.master_id,
            g.master_address,
            g.master_ha_address,
            g.epoch,
            g.sync_state_set,
            g.sync_state_epoch,
            replicas.join(" "),
            g.alive
        ));
    }
    lines.join("\n")
}

#[cfg(test)]
mod tests {
    use super::parse_rfc3339_ms;

    #[test]
    fn rfc3339_times_convert_to_epoch_milliseconds() {
        assert_eq!(parse_rfc3339_ms("1970-01-01T00:00:00Z"), Some(0));
        assert_eq!(
            parse_rfc3339_ms("2026-12-02T10:00:00.5Z"),
            Some(1_796_205_600_500)
        );
        assert_eq!(
            parse_rfc3339_ms("2026-12-02T12:00:00+02:00"),
            Some(1_796_205_600_000)
        );
        assert_eq!(
            parse_rfc3339_ms("2000-02-29 00:00:00Z"),
            Some(951_782_400_000)
        );
        for bad in [
            "2026-13-01T00:00:00Z",
            "2026-12-02T10:00:00",
            "yesterday",
            "2026-12-02T10:00:00+0200",
        ] {
            assert_eq!(parse_rfc3339_ms(bad), None, "{bad}");
        }
    }
}
