//! A storage shard's state (`StorageShard`) and the table that hands each mesh request to the
//! method serving it. Data arms live in `data`, replica arms in `replica`, shard 0's control
//! arms in `shard_zero`, long-poll watches in `watches`.

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;

use glommio::channels::shared_channel::ConnectedSender;
use tracing::warn;

use crate::config::BrokerConfig;
use crate::mesh::{NetworkEvent, Reply, StorageRequest, StorageSnapshot};
use crate::offsets::ConsumerOffsets;
use crate::store::MessageStore;

use super::shard_zero::ShardZero;

pub(super) struct StorageShard {
    pub(super) id: usize,
    pub(super) config: Rc<BrokerConfig>,
    pub(super) store: MessageStore,
    pub(super) offsets: RefCell<ConsumerOffsets>,
    /// topic → queue → bitmask of network shards waiting for an arrival.
    pub(super) watches: RefCell<HashMap<String, HashMap<u32, u64>>>,
    /// Watched queue → its end when the first pull parked (a slave wakes them by growth).
    pub(super) parked_at: RefCell<HashMap<(String, u32), u64>>,
    pub(super) events: Vec<ConnectedSender<NetworkEvent>>,
    pub(super) shard_zero: Option<ShardZero>,
    pub(super) stopping: RefCell<bool>,
    /// Master: its terms and slaves (services `replication`); a sync master's sends wait on it.
    pub(super) master: Rc<crate::replication::MasterSide>,
    /// Slave: what its replication loop knows of the master.
    pub(super) slave_view: Rc<crate::replication::SlaveView>,
}

pub(super) fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

impl StorageShard {
    pub(super) fn broadcast(&self, make: impl Fn() -> NetworkEvent) {
        for sender in &self.events {
            if sender.try_send(make()).is_err() {
                warn!(
                    shard = self.id,
                    "network shard event channel full or closed; event dropped"
                );
            }
        }
    }

    /// The table: each request to the method that serves it (data arms in `data`, replica arms
    /// in `replica`, storage shard 0's in `shard_zero`).
    pub(super) async fn handle(&self, request: StorageRequest) {
        match request {
            StorageRequest::Append { batch, reply } => self.append(batch, reply).await,
            StorageRequest::Pull {
                query,
                watch_for,
                reply,
            } => self.pull(query, watch_for, reply).await,
            StorageRequest::QueueOffsets {
                topic,
                queue_id,
                reply,
            } => self.queue_offsets(topic, queue_id, reply),
            StorageRequest::QueueStats {
                topic,
                queue_ids,
                reply,
            } => self.queue_stats(topic, queue_ids, reply).await,
            StorageRequest::OffsetByTime {
                topic,
                queue_id,
                timestamp_ms,
                reply,
            } => {
                self.offset_by_time(topic, queue_id, timestamp_ms, reply)
                    .await
            }
            StorageRequest::QueryConsumerOffset {
                group,
                topic,
                queue_id,
                reply,
            } => self.query_consumer_offset(group, topic, queue_id, reply),
            StorageRequest::CommitConsumerOffset {
                group,
                topic,
                queue_id,
                offset,
                reply,
            } => self.commit_consumer_offset(group, topic, queue_id, offset, reply),
            StorageRequest::QueryByKey {
                topic,
                key,
                begin_ms,
                end_ms,
                max_results,
                reply,
            } => {
                self.query_by_key(topic, key, begin_ms, end_ms, max_results, reply)
                    .await
            }
            StorageRequest::QueryByUniqueId {
                unique_id,
                begin_ms,
                end_ms,
                reply,
            } => {
                self.query_by_unique_id(unique_id, begin_ms, end_ms, reply)
                    .await
            }
            StorageRequest::ReadAt {
                physical_offset,
                reply,
            } => self.read_at(physical_offset, reply).await,
            StorageRequest::ReadForReplica(pull) => self.read_for_replica(pull).await,
            StorageRequest::ReadShardFile { name, reply } => {
                self.read_shard_file(name, reply).await
            }
            StorageRequest::StoredQueues { reply } => self.stored_queues(reply),
            StorageRequest::ReplicaSyncView { reply } => self.replica_sync_view(reply),
            StorageRequest::ReplicaProgress { reply } => self.replica_progress(reply),
            StorageRequest::ConsumerOffsetPage { after, max, reply } => {
                let _ = reply.send(self.offsets.borrow().rows_after(after.as_ref(), max));
            }
            StorageRequest::MergeConsumerOffsets { rows, reply } => {
                self.merge_consumer_offsets(rows);
                let _ = reply.send(());
            }
            StorageRequest::ReplicaJoin {
                broker_id,
                peer,
                end,
                epochs,
                link,
                reply,
            } => self.replica_join(broker_id, peer, end, epochs, link, reply),
            StorageRequest::ReplicaReturn {
                broker_id,
                link,
                from,
                data,
                last,
                reply,
            } => {
                self.replica_return(broker_id, link, from, data, last, reply)
                    .await
            }
            StorageRequest::UpsertTopic {
                config,
                is_create_only,
                reply,
            } => self.upsert_topic(config, is_create_only, reply).await,
            StorageRequest::DeleteTopic { topic, reply } => self.delete_topic(topic, reply).await,
            StorageRequest::Heartbeat {
                client_id,
                connection,
                producer_groups,
                consumer_groups,
                reply,
            } => {
                self.heartbeat(
                    client_id,
                    connection,
                    producer_groups,
                    consumer_groups,
                    reply,
                )
                .await
            }
            StorageRequest::UnregisterClient {
                client_id,
                producer_group,
                consumer_group,
                reply,
            } => self.unregister_client(client_id, producer_group, consumer_group, reply),
            StorageRequest::ClientsAlive { clients } => self.clients_alive(clients),
            StorageRequest::ClientGone {
                client_id,
                connection,
            } => self.client_gone(client_id, connection),
            StorageRequest::EnsureSystemTopic {
                name,
                queues,
                reply,
            } => self.ensure_system_topic(name, queues, reply).await,
            StorageRequest::ConsumerList { group, reply } => self.consumer_list(group, reply),
            StorageRequest::ConsumerGroupMembers { group, reply } => {
                self.consumer_group_members(group, reply)
            }
            StorageRequest::MetricsSnapshot { reply } => self.serve_metrics_snapshot(reply),
            StorageRequest::Transaction(request) => self.transaction(request).await,
            StorageRequest::QueueLock(request) => self.queue_lock(request),
        }
    }

    /// Consumer lag per (group, topic) over this shard's queues, and the CommitLog's size.
    fn metrics_snapshot(&self) -> crate::mesh::StorageSnapshot {
        let mut lag: std::collections::BTreeMap<(String, String), u64> = Default::default();
        for (group, topic, queue_id, committed) in self.offsets.borrow().rows() {
            let max = self
                .store
                .queue_offsets(&topic, queue_id)
                .map_or(0, |(_, max)| max);
            *lag.entry((group, topic)).or_default() += max.saturating_sub(committed);
        }
        let live_groups = self
            .shard_zero
            .as_ref()
            .map(|zero| zero.clients.borrow().group_summaries())
            .unwrap_or_default();
        crate::mesh::StorageSnapshot {
            consumer_lag: lag.into_iter().map(|((g, t), n)| (g, t, n)).collect(),
            commitlog_bytes: self.store.commitlog_disk_bytes(),
            live_groups,
            replication: {
                let end = self.store.commitlog_offsets().1;
                if self.config.role() == crate::config::BrokerRole::Slave {
                    self.slave_view.status(end)
                } else {
                    self.master.status(end)
                }
            },
        }
    }

    fn serve_metrics_snapshot(&self, reply: Reply<StorageSnapshot>) {
        let _ = reply.send(self.metrics_snapshot());
    }
}
