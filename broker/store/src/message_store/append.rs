//! The append paths: a producer's batch (assign queue and physical offsets, patch the
//! broker's fields, copy into the write ring, complete under the flush mode) and bytes a
//! master replicated (validated whole, then appended at the same offsets). Nothing is appended
//! of a batch that fails its checks.

use std::rc::Rc;
use std::time::Duration;

use crate::consume_queue::ConsumeQueue;
use crate::record::{copy_patched, RecordError, StorePatch};
use crate::scan::{scan_window, ScanStop};

use super::state::{dispatch_info, get_or_create_queue, DispatchInfo, Inner};
use super::types::{
    io_error, AppendOutcome, AppendStatus, AppendedRecord, EncodedBatch, StoreError,
};
use super::{now_ms, MessageStore};

impl MessageStore {
    /// Appends a batch; completes as the flush mode says (async: once its bytes are written,
    /// sync: once they are synced), or with `FlushDiskTimeout` after `sync_flush_timeout_ms`.
    /// On error nothing of the batch is appended.
    pub async fn append(&self, batch: EncodedBatch) -> Result<AppendOutcome, StoreError> {
        let inner = &self.inner;
        inner.pace().await;
        if let Some(why) = inner.appends_held.borrow().as_ref() {
            return Err(StoreError::Held(why.clone()));
        }
        inner.check_writable(batch.bytes.len() as u64)?;
        if inner.records_end.get() != inner.commit_log.write_offset() {
            return Err(StoreError::Corrupt(format!(
                "the CommitLog ends inside a replicated record (complete records end at {}, the log at {}): appends wait for the rest",
                inner.records_end.get(),
                inner.commit_log.write_offset()
            )));
        }
        inner.check_batch(&batch)?;
        let store_timestamp_ms = now_ms().max(inner.last_store_timestamp_ms.get());
        inner.last_store_timestamp_ms.set(store_timestamp_ms);
        let EncodedBatch {
            bytes,
            records: pending,
            topics,
            index_hashes,
            store_host,
        } = batch;
        let mut records = Vec::with_capacity(pending.len());
        {
            let mut waiting = inner.pending_dispatch.borrow_mut();
            waiting.index_hashes.extend(index_hashes);
            // A batch nearly always targets one queue: look it up once per run of records.
            let mut last_queue: Option<(u16, u32, Rc<ConsumeQueue>)> = None;
            inner.commit_log.append_batch(
                &bytes,
                &mut pending.iter().map(|r| r.len),
                &mut |index, physical_offset, record, destination| {
                    let info = &pending[index];
                    let queue = match &last_queue {
                        Some((topic, queue_id, queue))
                            if *topic == info.topic && *queue_id == info.queue_id =>
                        {
                            queue.clone()
                        }
                        _ => {
                            let queue = get_or_create_queue(
                                &inner.queues,
                                &inner.config,
                                &topics[usize::from(info.topic)],
                                info.queue_id,
                            );
                            last_queue = Some((info.topic, info.queue_id, queue.clone()));
                            queue
                        }
                    };
                    let queue_offset = queue.assign_offset();
                    copy_patched(
                        destination,
                        record,
                        StorePatch {
                            queue_id: info.queue_id,
                            queue_offset,
                            physical_offset,
                            store_timestamp_ms,
                            store_host,
                        },
                    );
                    records.push(AppendedRecord {
                        physical_offset,
                        size: info.len,
                        queue_id: info.queue_id,
                        queue_offset,
                        store_timestamp_ms,
                    });
                    waiting.infos.push_back(DispatchInfo {
                        queue,
                        physical_offset,
                        size: info.len,
                        queue_offset,
                        tags_hash: info.tags_hash,
                        store_timestamp_ms,
                        index_hash_count: info.index_hash_count,
                    });
                },
            );
        }
        let end = inner.commit_log.write_offset();
        inner.records_end.set(end);
        inner.writer_wake.notify_all();
        // In the journal the batch is safe from a crash of the process at once (async flush).
        inner.journal_new_bytes();
        inner.publish_progress_or_log();
        let timeout = Duration::from_millis(inner.config.sync_flush_timeout_ms);
        let status = if inner.wait_visible(end, timeout).await {
            AppendStatus::Ok
        } else {
            AppendStatus::FlushDiskTimeout
        };
        Ok(AppendOutcome { status, records })
    }

    /// Appends CommitLog bytes a master sent (see [`read_for_replica`](Self::read_for_replica))
    /// at this log's end, `from`: the same bytes at the same offsets, so offsets and offset
    /// message ids mean the same on both. Every record is validated (both CRCs, its physical
    /// offset) before anything is appended, and dispatched to its ConsumeQueue and the index
    /// as local appends are, once written (async) or synced (sync). A record cut by the end of
    /// `bytes` is appended and completed by the next call. Returns the new end.
    pub async fn append_replicated(&self, from: u64, bytes: &[u8]) -> Result<u64, StoreError> {
        let inner = &self.inner;
        let log = &inner.commit_log;
        let end = log.write_offset();
        if from != end {
            return Err(StoreError::ReplicaGap {
                expected: end,
                got: from,
            });
        }
        if bytes.is_empty() {
            return Ok(end);
        }
        inner.check_writable(bytes.len() as u64)?;
        // The unfinished record (if any) and the new bytes, scanned as one run from
        // `records_end`. A segment-end filler's body may still be coming: `records_end` is then
        // past the log's end, and those bytes are skipped.
        // Only an unfinished record makes a copy; otherwise the new bytes are scanned in place.
        let records_end = inner.records_end.get();
        let run: std::borrow::Cow<'_, [u8]> = if records_end < end {
            let mut run = log
                .read(records_end, end - records_end)
                .await
                .map_err(io_error(
                    "CommitLog read of an unfinished replicated record",
                ))?
                .to_vec();
            run.extend_from_slice(bytes);
            run.into()
        } else {
            let skip = usize::try_from(records_end - end).unwrap_or(usize::MAX);
            bytes.get(skip..).unwrap_or_default().into()
        };
        let mut infos = Vec::new();
        let mut index_hashes = Vec::new();
        let mut last_ts = inner.last_store_timestamp_ms.get();
        let segment_bytes = log.segment_bytes();
        let mut at = records_end;
        let run_end = records_end + run.len() as u64;
        while at < run_end {
            let segment_base = at - at % segment_bytes;
            let window_end = run_end.min(segment_base + segment_bytes);
            let window = &run[(at - records_end) as usize..(window_end - records_end) as usize];
            let stop = scan_window(
                window,
                segment_base,
                at - segment_base,
                segment_bytes,
                false,
                &mut |position, view| {
                    let queue = get_or_create_queue(
                        &inner.queues,
                        &inner.config,
                        view.topic(),
                        view.queue_id(),
                    );
                    last_ts = last_ts.max(view.store_timestamp_ms());
                    infos.push(dispatch_info(
                        queue,
                        segment_base + position,
                        view,
                        &mut index_hashes,
                    ));
                },
            );
            match stop {
                ScanStop::NeedMore { position } => {
                    at = segment_base + position;
                    break;
                }
                ScanStop::SegmentEnd { .. } => at = segment_base + segment_bytes,
                ScanStop::DataEnd { position } => {
                    return Err(StoreError::Corrupt(format!(
                        "replicated bytes hold zeros at {} instead of a record",
                        segment_base + position
                    )));
                }
                ScanStop::Invalid { position, error } => {
                    return Err(StoreError::Corrupt(format!(
                        "replicated bytes at {} are not a valid record: {error}",
                        segment_base + position
                    )));
                }
            }
        }
        // Valid: append the bytes and queue the complete records for dispatch. Their queue
        // offsets are taken: a master's own appends that follow (after a slave returned bytes
        // its log lost) take offsets after them, though they wait to be dispatched.
        for info in &infos {
            info.queue.note_pending(info.queue_offset);
        }
        log.append_raw(bytes);
        inner.records_end.set(at);
        inner.last_store_timestamp_ms.set(last_ts);
        {
            let mut waiting = inner.pending_dispatch.borrow_mut();
            waiting.index_hashes.extend(index_hashes);
            waiting.infos.extend(infos);
        }
        inner.writer_wake.notify_all();
        inner.journal_new_bytes();
        inner.publish_progress_or_log();
        Ok(log.write_offset())
    }
}

impl Inner {
    /// Checks what the encoder promised and the store relies on: record lengths that add up to
    /// the batch and fit a segment, and topics that are safe directory names. It does not parse
    /// the records: the network shard encoded them.
    fn check_batch(&self, batch: &EncodedBatch) -> Result<(), StoreError> {
        let limit = self.record_cap();
        let mut total = 0u64;
        let mut hashes = 0usize;
        for pending in &batch.records {
            if u64::from(pending.len) > limit {
                return Err(StoreError::RecordTooLarge {
                    size: u64::from(pending.len),
                    limit,
                });
            }
            if usize::from(pending.topic) >= batch.topics.len() {
                return Err(StoreError::InvalidRecord(RecordError::InvalidTopic(
                    format!(
                        "topic index {} is outside the batch's {} topics",
                        pending.topic,
                        batch.topics.len()
                    ),
                )));
            }
            total += u64::from(pending.len);
            hashes += usize::from(pending.index_hash_count);
        }
        if total != batch.bytes.len() as u64 || hashes != batch.index_hashes.len() {
            return Err(StoreError::InvalidRecord(RecordError::LengthMismatch {
                computed: total as usize,
                total_size: batch.bytes.len(),
            }));
        }
        for topic in &batch.topics {
            // The topic becomes a directory name: only RocketMQ's name characters may pass.
            if let Err(why) = crate::record::names::check_topic_name(topic) {
                return Err(StoreError::InvalidRecord(RecordError::InvalidTopic(why)));
            }
        }
        Ok(())
    }
}
