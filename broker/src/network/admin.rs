//! Operator requests: the broker's runtime status and its consumer groups.
//!
//! Read-only; the figures come from the process metrics (`crate::metrics`) and the storage
//! shards' snapshots, so answering costs one mesh round trip per storage shard.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::Ordering;

use shardmq_schema::wire;

use super::request::{encode_ok, Answer};
use super::NetworkShard;
use crate::mesh::{StorageRequest, StorageSnapshot};
use crate::metrics;
use crate::store::message_store::disk_space;

/// Every storage shard's snapshot (a shard that cannot answer is left out).
pub async fn storage_snapshots(shard: &NetworkShard) -> Vec<StorageSnapshot> {
    let mut snapshots = Vec::new();
    for storage in 0..shard.storage_shards() {
        if let Ok(snapshot) = shard
            .ask(storage, |reply| StorageRequest::MetricsSnapshot { reply })
            .await
        {
            snapshots.push(snapshot);
        }
    }
    snapshots
}

pub async fn broker_status(shard: &NetworkShard, id: u64) -> Answer {
    let snapshots = storage_snapshots(shard).await;
    let commitlog_bytes: u64 = snapshots.iter().map(|s| s.commitlog_bytes).sum();
    let replica_lag_bytes = snapshots
        .iter()
        .map(|s| s.replication.lag_bytes)
        .reduce(|a, b| match (a, b) {
            (Some(a), Some(b)) => Some(a + b),
            (a, b) => a.or(b),
        })
        .flatten()
        .map_or(-1, |lag| lag as i64);
    let (disk_total, disk_free) = disk_space(&shard.config.data_dir).unwrap_or((0, 0));
    let m = metrics::broker();
    let totals = &m.totals;
    let config = &shard.config;
    let topics = shard.topics().topics.len() as u32;
    encode_ok(shard, id, |b| {
        let cluster = b.create_string(&config.cluster_name);
        let broker = b.create_string(&config.broker_name);
        let version = b.create_string(env!("CARGO_PKG_VERSION"));
        let placement = b.create_string(m.placement.get().map_or("", String::as_str));
        let flush = b.create_string(&config.flush);
        let role = b.create_string(config.role().name());
        let replication: Vec<_> = snapshots
            .iter()
            .enumerate()
            .map(|(storage, s)| {
                let r = &s.replication;
                let peer = b.create_string(&r.peer);
                wire::ReplicationShardStatus::create(
                    b,
                    &wire::ReplicationShardStatusArgs {
                        storage_shard: storage as u32,
                        peer: Some(peer),
                        epoch: r.epoch,
                        lag_bytes: r.lag_bytes.map_or(-1, |v| v as i64),
                        lag_ms: r.lag_ms.map_or(-1, |v| v as i64),
                        connected: r.connected,
                    },
                )
            })
            .collect();
        let replication = b.create_vector(&replication);
        let (bounds_us, counts) = m.send_latency_buckets.snapshot();
        let send_latency_bounds_us = b.create_vector(&bounds_us);
        let send_latency_counts = b.create_vector(&counts);
        let body = wire::BrokerStatusResponse::create(
            b,
            &wire::BrokerStatusResponseArgs {
                cluster_name: Some(cluster),
                broker_name: Some(broker),
                version: Some(version),
                uptime_ms: m.uptime().as_millis() as u64,
                storage_shards: shard.storage_shards() as u32,
                network_shards: config.network_cores.len() as u32,
                placement: Some(placement),
                flush: Some(flush),
                messages_in: totals.messages_in.load(Ordering::Relaxed),
                bytes_in: totals.bytes_in.load(Ordering::Relaxed),
                messages_out: totals.messages_out.load(Ordering::Relaxed),
                bytes_out: totals.bytes_out.load(Ordering::Relaxed),
                connections: totals.connections.load(Ordering::Relaxed).max(0) as u64,
                parked_pulls: totals.parked_pulls.load(Ordering::Relaxed).max(0) as u64,
                topics,
                commitlog_bytes,
                disk_total_bytes: disk_total,
                disk_free_bytes: disk_free,
                role: Some(role),
                replica_lag_bytes,
                replication: Some(replication),
                send_latency_bounds_us: Some(send_latency_bounds_us),
                send_latency_counts: Some(send_latency_counts),
            },
        );
        (wire::Body::BrokerStatusResponse, body.as_union_value())
    })
}

/// One group's summary before encoding.
#[derive(Default)]
struct Group {
    members: usize,
    topics: BTreeSet<String>,
    lag: u64,
}

fn merge_groups(snapshots: Vec<StorageSnapshot>) -> BTreeMap<String, Group> {
    let mut groups: BTreeMap<String, Group> = BTreeMap::new();
    for snapshot in snapshots {
        for (group, members, topics) in snapshot.live_groups {
            let entry = groups.entry(group).or_default();
            entry.members += members;
            entry.topics.extend(topics);
        }
        for (group, topic, lag) in snapshot.consumer_lag {
            let entry = groups.entry(group).or_default();
            entry.topics.insert(topic);
            entry.lag += lag;
        }
    }
    groups
}

pub async fn group_list(shard: &NetworkShard, id: u64) -> Answer {
    let groups = merge_groups(storage_snapshots(shard).await);
    encode_ok(shard, id, |b| {
        let summaries: Vec<_> = groups
            .iter()
            .map(|(name, group)| {
                let name = b.create_string(name);
                let topics: Vec<_> = group.topics.iter().map(|t| b.create_string(t)).collect();
                let topics = b.create_vector(&topics);
                wire::GroupSummary::create(
                    b,
                    &wire::GroupSummaryArgs {
                        group: Some(name),
                        members: group.members as u32,
                        topics: Some(topics),
                        lag: group.lag,
                    },
                )
            })
            .collect();
        let groups = b.create_vector(&summaries);
        let body = wire::GroupListResponse::create(
            b,
            &wire::GroupListResponseArgs {
                groups: Some(groups),
            },
        );
        (wire::Body::GroupListResponse, body.as_union_value())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_merge_members_topics_and_lag_across_shards() {
        let shard0 = StorageSnapshot {
            consumer_lag: vec![("g".into(), "a".into(), 3)],
            commitlog_bytes: 0,
            live_groups: vec![("g".into(), 2, vec!["b".into()])],
            replication: Default::default(),
        };
        let shard1 = StorageSnapshot {
            consumer_lag: vec![("g".into(), "a".into(), 4), ("h".into(), "c".into(), 1)],
            commitlog_bytes: 0,
            live_groups: Vec::new(),
            replication: Default::default(),
        };
        let groups = merge_groups(vec![shard0, shard1]);
        let g = &groups["g"];
        assert_eq!(g.members, 2);
        assert_eq!(g.lag, 7);
        assert_eq!(
            g.topics.iter().cloned().collect::<Vec<_>>(),
            ["a".to_string(), "b".to_string()]
        );
        assert_eq!(groups["h"].members, 0);
    }
}
