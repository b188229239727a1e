//! The data arms of a storage shard: appends (a sync master then waits for its slaves), pulls
//! (an empty one registers its network shard to be woken), queue offsets and statistics,
//! consumer offsets (in memory, persisted every `offsets_persist_interval_ms`), queries and
//! reads at an offset. Each answers through the request's one-shot reply.

use std::rc::Rc;
use std::time::Duration;

use bytes::Bytes;
use tracing::error;

use crate::mesh::{PullQuery, QueueStat, Reply, TIMELINE};
use crate::offsets::OFFSETS_FILE;
use crate::store::atomic_file::write_atomically_async;
use crate::store::record::RecordView;
use crate::store::{AppendOutcome, EncodedBatch, GetResult, GetStatus, StoreError, TagFilter};

use super::shard::StorageShard;

impl StorageShard {
    pub(super) async fn append(
        &self,
        batch: EncodedBatch,
        reply: Reply<Result<AppendOutcome, StoreError>>,
    ) {
        let target = batch_queue(&batch);
        tracing::trace!(target: TIMELINE, stage = "append_begins", bytes = batch.bytes.len());
        let mut result = self.store.append(batch).await;
        if let (Ok(_), Some((topic, queue_id))) = (&result, target) {
            self.notify_appended(&topic, queue_id);
        }
        if let Ok(outcome) = &mut result {
            self.wait_replicated_outcome(outcome).await;
        }
        tracing::trace!(target: TIMELINE, stage = "append_ends");
        let _ = reply.send(result);
    }

    pub(super) async fn pull(
        &self,
        query: PullQuery,
        watch_for: Option<usize>,
        reply: Reply<Result<GetResult, StoreError>>,
    ) {
        let result = self
            .store
            .get_messages_for_client(
                &query.topic,
                query.queue_id,
                query.offset,
                query.max_messages,
                query.max_bytes,
                &query.filter,
            )
            .await;
        let mut result = result;
        if let Ok(got) = &mut result {
            got.suggest_broker_id = self.suggest_reader(&got.records);
        }
        if let (Ok(got), Some(network_shard)) = (&result, watch_for) {
            let is_at_end = matches!(got.status, GetStatus::NoNewMessage)
                || (got.status == GetStatus::NoMatchedQueue && query.offset == 0);
            if is_at_end {
                self.watch(&query.topic, query.queue_id, network_shard);
            }
        }
        let _ = reply.send(result);
    }

    pub(super) fn queue_offsets(
        &self,
        topic: String,
        queue_id: u32,
        reply: Reply<Option<(u64, u64)>>,
    ) {
        let _ = reply.send(self.store.queue_offsets(&topic, queue_id));
    }

    pub(super) async fn queue_stats(
        &self,
        topic: String,
        queue_ids: Vec<u32>,
        reply: Reply<Vec<QueueStat>>,
    ) {
        let mut stats = Vec::with_capacity(queue_ids.len());
        for queue_id in queue_ids {
            let (min_offset, max_offset) =
                self.store.queue_offsets(&topic, queue_id).unwrap_or((0, 0));
            let last_update_ms = if max_offset > min_offset {
                self.last_store_time(&topic, queue_id, max_offset - 1).await
            } else {
                0
            };
            stats.push(QueueStat {
                queue_id,
                min_offset,
                max_offset,
                last_update_ms,
            });
        }
        let _ = reply.send(stats);
    }

    pub(super) async fn offset_by_time(
        &self,
        topic: String,
        queue_id: u32,
        timestamp_ms: i64,
        reply: Reply<Result<u64, StoreError>>,
    ) {
        let _ = reply.send(
            self.store
                .offset_by_time(&topic, queue_id, timestamp_ms)
                .await,
        );
    }

    pub(super) fn query_consumer_offset(
        &self,
        group: String,
        topic: String,
        queue_id: u32,
        reply: Reply<Option<u64>>,
    ) {
        let _ = reply.send(self.offsets.borrow().get(&group, &topic, queue_id));
    }

    pub(super) fn commit_consumer_offset(
        &self,
        group: String,
        topic: String,
        queue_id: u32,
        offset: u64,
        reply: Reply<()>,
    ) {
        self.offsets
            .borrow_mut()
            .commit(&group, &topic, queue_id, offset);
        let _ = reply.send(());
    }

    pub(super) fn merge_consumer_offsets(&self, rows: Vec<crate::replication::OffsetRow>) {
        let mut offsets = self.offsets.borrow_mut();
        for (group, topic, queue_id, offset) in rows {
            if offsets
                .get(&group, &topic, queue_id)
                .is_none_or(|local| local < offset)
            {
                offsets.commit(&group, &topic, queue_id, offset);
            }
        }
    }

    pub(super) async fn query_by_key(
        &self,
        topic: String,
        key: String,
        begin_ms: i64,
        end_ms: i64,
        max_results: usize,
        reply: Reply<Result<Vec<Bytes>, StoreError>>,
    ) {
        let _ = reply.send(
            self.store
                .query_by_key(&topic, &key, begin_ms, end_ms, max_results)
                .await,
        );
    }

    pub(super) async fn query_by_unique_id(
        &self,
        unique_id: String,
        begin_ms: i64,
        end_ms: i64,
        reply: Reply<Result<Vec<Bytes>, StoreError>>,
    ) {
        let _ = reply.send(
            self.store
                .query_by_unique_id(&unique_id, begin_ms, end_ms, 32)
                .await,
        );
    }

    pub(super) async fn read_at(
        &self,
        physical_offset: u64,
        reply: Reply<Result<Bytes, StoreError>>,
    ) {
        let _ = reply.send(self.store.read_record_at(physical_offset).await);
    }

    pub(super) fn stored_queues(&self, reply: Reply<Vec<(String, u32)>>) {
        let queues = self
            .store
            .queues()
            .into_iter()
            .map(|(topic, queue_id, _, _)| (topic, queue_id))
            .collect();
        let _ = reply.send(queues);
    }

    async fn last_store_time(&self, topic: &str, queue_id: u32, offset: u64) -> i64 {
        match self
            .store
            .get_messages(topic, queue_id, offset, 1, 1, &TagFilter::All)
            .await
        {
            Ok(result) => result
                .records
                .first()
                .and_then(|r| {
                    RecordView::parse_unchecked(r)
                        .ok()
                        .map(|v| v.store_timestamp_ms())
                })
                .unwrap_or(0),
            Err(_) => 0,
        }
    }

    pub(super) async fn persist_offsets(&self) {
        if !self.offsets.borrow().is_dirty() {
            return;
        }
        let bytes = self.offsets.borrow_mut().snapshot();
        let path = self
            .config
            .store_config(self.id)
            .shard_dir
            .join(OFFSETS_FILE);
        if let Err(e) = write_atomically_async(path, bytes).await {
            error!(shard = self.id, error = %e, "cannot persist consumer offsets");
        }
    }
}

/// (topic, queue) of a batch: all its records share them (one send = one queue).
fn batch_queue(batch: &crate::store::EncodedBatch) -> Option<(String, u32)> {
    batch
        .first_queue()
        .map(|(topic, queue_id)| (topic.to_owned(), queue_id))
}

pub(super) async fn persist_offsets_loop(shard: Rc<StorageShard>) {
    let interval = Duration::from_millis(shard.config.offsets_persist_interval_ms.max(10));
    loop {
        glommio::timer::sleep(interval).await;
        if *shard.stopping.borrow() {
            return;
        }
        shard.persist_offsets().await;
    }
}
