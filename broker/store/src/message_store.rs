//! The message store of one storage shard: CommitLog + ConsumeQueues + index, joined.
//!
//! Owns: recovery at open (checkpoint → scan → cut → rebuild derived entries), the append path
//! (assign queue and physical offsets, patch records, buffer, complete under the flush mode),
//! the flush loop (group commit), dispatch of completed records into the ConsumeQueues and the
//! index, the checkpoint/housekeeping loop (derived-file flushes, checkpoint, disk usage,
//! retention), and the read paths (by queue offset, by time, by key, by id).
//!
//! Lives on one glommio executor (it is `!Send`); everything in it runs on that core, so there
//! are no locks. It opens no sockets: network shards reach it through the broker's mesh.

use std::cell::{Cell, RefCell};
use std::collections::{HashMap, VecDeque};
use std::io;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use futures_lite::future;
use glommio::task::JoinHandle;
use tracing::{error, info, warn};

use super::append_file::{prime_direct_io_probe, DMA_ALIGNMENT_BYTES};
use super::atomic_file::write_atomically_async;
use super::checkpoint::{Checkpoint, CHECKPOINT_FILE};
use super::commitlog::{CommitLog, RecoveryScan};
use super::consume_queue::{ConsumeQueue, ConsumeQueueEntry};
use super::filter::TagFilter;
use super::format::{StoreFormat, FORMAT_VERSION};
use super::index::{index_hash, IndexEntry, IndexKind, MessageIndex};
use super::notify::LocalNotify;
use super::record::{
    decode_message, encode_record, patch_record, peek_total_size, tags_hash, PendingRecord,
    RecordError, RecordInput, RecordView, StorePatch, BLANK_MIN_BYTES, MESSAGE_MAGIC_CODE,
    MIN_RECORD_BYTES, PROPERTY_KEYS, PROPERTY_TAGS, PROPERTY_UNIQUE_KEY,
};
use super::scan::{scan_window, ScanStop};

/// When an append counts as complete.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FlushMode {
    /// After the `fdatasync` that covers it.
    Sync,
    /// Once the O_DIRECT write that holds it has completed (the bytes are in the kernel: a
    /// crash of the broker process cannot lose them); `fdatasync` follows at least every
    /// `flush_interval_ms`, so a power loss can lose at most that window.
    Async,
}

impl std::str::FromStr for FlushMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "sync" => Ok(FlushMode::Sync),
            "async" => Ok(FlushMode::Async),
            other => Err(format!(
                "flush mode must be `sync` or `async`, not `{other}`"
            )),
        }
    }
}

/// Everything the store can be told; defaults follow RocketMQ (see the reference).
#[derive(Debug, Clone)]
pub struct StoreConfig {
    /// The shard directory (`<data>/shard-N`).
    pub shard_dir: PathBuf,
    pub flush_mode: FlushMode,
    /// CommitLog segment size; a multiple of 4 KiB, at least 64 KiB.
    pub segment_bytes: u64,
    pub flush_interval_ms: u64,
    pub sync_flush_timeout_ms: u64,
    pub checkpoint_interval_ms: u64,
    pub consume_queue_entries_per_file: u64,
    pub index_max_entries_per_file: u64,
    /// Recent CommitLog bytes kept in memory for tailing readers.
    pub hot_tail_bytes: u64,
    /// CommitLog segment files are pre-allocated (`fallocate`) this far ahead of the data; 0
    /// never (each write then extends the file). See `docs/performance.md` for what it costs
    /// and saves on ext4.
    pub preallocate_ahead_bytes: u64,
    /// Appended bytes not yet written (completed O_DIRECT writes) above which appends get `Busy`.
    pub max_unflushed_bytes: u64,
    pub file_reserved_hours: u64,
    pub retention_interval_ms: u64,
    /// Disk use at which the oldest segments are deleted early.
    pub disk_max_used_ratio: f64,
    /// Disk use at which appends are refused.
    pub disk_refuse_ratio: f64,
    /// Most ConsumeQueue entries one read examines when a tag filter skips entries.
    pub max_scanned_entries_per_read: u64,
    /// The largest record appended or read (the broker derives it from `max_message_bytes`
    /// with [`record::max_record_bytes`](shardmq_codec::max_record_bytes)). Every record size
    /// read from disk (a ConsumeQueue entry, a record's own header) is checked against it before
    /// anything is read for it; a larger stored record (written while `max_message_bytes` was
    /// higher) is refused with an error naming the setting, never cut.
    pub max_record_bytes: u64,
    /// Most index entries one query by key or id looks at on this shard, newest first.
    pub max_index_scan_entries_per_query: u64,
}

impl StoreConfig {
    pub fn new(shard_dir: impl Into<PathBuf>) -> StoreConfig {
        StoreConfig {
            shard_dir: shard_dir.into(),
            flush_mode: FlushMode::Async,
            segment_bytes: 1 << 30,
            flush_interval_ms: 500,
            sync_flush_timeout_ms: 5_000,
            checkpoint_interval_ms: 1_000,
            consume_queue_entries_per_file: 300_000,
            index_max_entries_per_file: 2_000_000,
            hot_tail_bytes: 64 << 20,
            preallocate_ahead_bytes: 64 << 20,
            max_unflushed_bytes: 256 << 20,
            file_reserved_hours: 72,
            retention_interval_ms: 10_000,
            disk_max_used_ratio: 0.75,
            disk_refuse_ratio: 0.95,
            max_scanned_entries_per_read: 16_000,
            max_record_bytes: shardmq_codec::max_record_bytes(4 << 20) as u64,
            max_index_scan_entries_per_query: 4_000_000,
        }
    }

    pub fn validate(&self) -> Result<(), StoreError> {
        let fail = |why: String| Err(StoreError::Config(why));
        if !self.segment_bytes.is_multiple_of(DMA_ALIGNMENT_BYTES) || self.segment_bytes < 64 << 10
        {
            return fail(format!(
                "segment_bytes is {}, must be a multiple of 4096 and at least 65536",
                self.segment_bytes
            ));
        }
        if self.consume_queue_entries_per_file == 0 || self.index_max_entries_per_file == 0 {
            return fail("entries per file must be positive".into());
        }
        if self.max_record_bytes < MIN_RECORD_BYTES as u64 {
            return fail(format!(
                "max_record_bytes is {}, under the smallest record ({MIN_RECORD_BYTES})",
                self.max_record_bytes
            ));
        }
        if !(0.0..=1.0).contains(&self.disk_max_used_ratio)
            || !(0.0..=1.0).contains(&self.disk_refuse_ratio)
        {
            return fail("disk ratios must be between 0 and 1".into());
        }
        Ok(())
    }
}

/// Errors a caller can act on; each maps to a wire status.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("I/O error on {context}: {source}")]
    Io { context: String, source: io::Error },
    #[error("disk is full: {used_percent:.1}% used, at or over the refuse threshold {limit_percent:.1}%")]
    DiskFull {
        used_percent: f64,
        limit_percent: f64,
    },
    #[error("CommitLog flush is failing ({0}); appends are refused until it recovers")]
    FlushFailing(String),
    #[error("storage shard is busy: {unflushed_bytes} bytes wait for the disk, over max_unflushed_bytes ({limit})")]
    Busy { unflushed_bytes: u64, limit: u64 },
    #[error("record is {size} bytes, over the largest this store takes ({limit}: max_message_bytes plus the largest header, topic and properties, within a segment)")]
    RecordTooLarge { size: u64, limit: u64 },
    #[error("invalid record in batch: {0}")]
    InvalidRecord(#[from] RecordError),
    #[error("corrupt store: {0}")]
    Corrupt(String),
    #[error("invalid store configuration: {0}")]
    Config(String),
    #[error("store is closed")]
    Closed,
    #[error("replicated bytes start at {got}, but this CommitLog ends at {expected}")]
    ReplicaGap { expected: u64, got: u64 },
    #[error("replication from {from} is outside this CommitLog, which holds [{min}, {end})")]
    ReplicaOutOfRange { from: u64, min: u64, end: u64 },
}

fn io_error(context: impl Into<String>) -> impl FnOnce(io::Error) -> StoreError {
    let context = context.into();
    move |source| StoreError::Io { context, source }
}

/// Records encoded by a network shard, on their way to a storage shard, with everything the
/// storage shard needs to store them: their lengths, queues, tags hashes and index hashes. The
/// storage shard does not parse or re-validate the records (see `docs/storage-format.md`,
/// "Write path").
#[derive(Debug, Default)]
pub struct EncodedBatch {
    pub bytes: BytesMut,
    pub records: Vec<PendingRecord>,
    /// The distinct topics of the records (nearly always one); `PendingRecord::topic` indexes it.
    pub topics: Vec<String>,
    /// Index hashes of every record in order (`PendingRecord::index_hash_count` each).
    pub index_hashes: Vec<u64>,
}

/// The value of the first property named `key`, as a record's readers find it.
fn first_property<'a>(properties: &[(&str, &'a str)], key: &str) -> Option<&'a str> {
    properties.iter().find(|(k, _)| *k == key).map(|(_, v)| *v)
}

impl EncodedBatch {
    pub fn new() -> EncodedBatch {
        EncodedBatch::default()
    }

    pub fn push(&mut self, input: &RecordInput<'_>) -> Result<(), RecordError> {
        let len = encode_record(&mut self.bytes, input)?;
        let topic = match self.topics.iter().position(|t| t == input.topic) {
            Some(index) => index,
            None => {
                self.topics.push(input.topic.to_owned());
                self.topics.len() - 1
            }
        };
        let hashes_before = self.index_hashes.len();
        let keys = first_property(input.properties, PROPERTY_KEYS).unwrap_or("");
        for key in keys.split(' ').filter(|k| !k.is_empty()) {
            self.index_hashes
                .push(index_hash(IndexKind::Key, input.topic, key));
        }
        if let Some(id) = first_property(input.properties, PROPERTY_UNIQUE_KEY) {
            self.index_hashes
                .push(index_hash(IndexKind::UniqueId, "", id));
        }
        let index_hash_count = self.index_hashes.len() - hashes_before;
        if index_hash_count > usize::from(u16::MAX) || self.topics.len() > usize::from(u16::MAX) {
            return Err(RecordError::PropertiesTooLong(index_hash_count));
        }
        self.records.push(PendingRecord {
            len,
            queue_id: input.queue_id,
            tags_hash: first_property(input.properties, PROPERTY_TAGS)
                .map(tags_hash)
                .unwrap_or(0),
            topic: topic as u16,
            index_hash_count: index_hash_count as u16,
        });
        Ok(())
    }

    pub fn len(&self) -> usize {
        self.records.len()
    }

    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    /// (topic, queue) of the first record (a producer's send targets one queue).
    pub fn first_queue(&self) -> Option<(&str, u32)> {
        let first = self.records.first()?;
        Some((self.topics.get(usize::from(first.topic))?, first.queue_id))
    }
}

/// Where one appended record went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AppendedRecord {
    pub physical_offset: u64,
    pub size: u32,
    pub queue_id: u32,
    pub queue_offset: u64,
    pub store_timestamp_ms: i64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AppendStatus {
    Ok,
    /// Sync flush did not confirm within `sync_flush_timeout_ms`; the records are appended and
    /// become visible once flushed.
    FlushDiskTimeout,
    /// Stored here (sync master), but the slave did not acknowledge it within
    /// `sync_flush_timeout_ms`.
    FlushSlaveTimeout,
    /// Stored here (sync master), but no slave is replicating.
    SlaveNotAvailable,
}

#[derive(Debug, Clone)]
pub struct AppendOutcome {
    pub status: AppendStatus,
    pub records: Vec<AppendedRecord>,
}

/// RocketMQ's `GetMessageStatus`, less the states we cannot reach.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GetStatus {
    Found,
    /// Entries were examined but none passed the filter; `next_offset` skips them.
    NoMatchedMessage,
    /// `offset` equals the queue's max offset: nothing new yet.
    NoNewMessage,
    OffsetTooSmall,
    /// `offset` is past the max offset.
    OffsetOverflow,
    /// The queue has never had a message on this shard.
    NoMatchedQueue,
}

#[derive(Debug, Clone)]
pub struct GetResult {
    pub status: GetStatus,
    /// Stored record bytes, exactly as in the CommitLog.
    pub records: Vec<Bytes>,
    pub next_offset: u64,
    pub min_offset: u64,
    pub max_offset: u64,
    /// Which broker of the group the consumer should pull this queue from next (0: the
    /// master); set by the storage shard under `slave_read_enable`, 0 from the store.
    pub suggest_broker_id: i64,
}

/// What recovery found and repaired, for the startup log and for tests.
#[derive(Debug, Clone, Default)]
pub struct RecoveryReport {
    /// The offset the log was cut at because replication asked for it
    /// ([`request_truncation`]), if it was.
    pub truncated_for_replica: Option<u64>,
    pub checkpoint: Option<Checkpoint>,
    pub checkpoint_problem: Option<String>,
    pub commitlog: RecoveryScan,
    pub consume_queue_entries_dropped: u64,
    /// A damaged ConsumeQueue or index file found on open (then every derived file is rebuilt).
    pub consume_queue_damage: Option<String>,
    pub records_redispatched: u64,
    /// Derived files were inconsistent and rebuilt from the whole CommitLog.
    pub rebuilt_derived: bool,
}

/// A record's derived entries, computed once when it is appended or scanned. Its index hashes
/// (`index_hash_count` of them) wait in [`PendingDispatch::index_hashes`], in record order.
struct DispatchInfo {
    queue: Rc<ConsumeQueue>,
    physical_offset: u64,
    size: u32,
    queue_offset: u64,
    tags_hash: u64,
    store_timestamp_ms: i64,
    index_hash_count: u16,
}

/// Appended records not yet visible (their bytes not yet written, or synced under sync flush).
#[derive(Default)]
struct PendingDispatch {
    infos: VecDeque<DispatchInfo>,
    index_hashes: VecDeque<u64>,
}

/// Most bytes one pull reads from the CommitLog at once (records of the batch inside it are
/// sliced out of one read); a read asks for what the pull still has room for, at least
/// [`MIN_READ_SPAN_BYTES`]. A 1 MiB pull of one queue's backlog is one O_DIRECT read.
const READ_SPAN_BYTES: u64 = 1 << 20;
const MIN_READ_SPAN_BYTES: u64 = 64 << 10;

/// Largest number of candidates one key/id query examines.
const MAX_INDEX_CANDIDATES: usize = 1024;
/// A query stops reading records once its results hold this many bytes (at least one record);
/// the network shard caps the answer it merges from all storage shards the same way.
pub const MAX_QUERY_ANSWER_BYTES: usize = 8 << 20;

struct Inner {
    config: StoreConfig,
    commit_log: CommitLog,
    queues: RefCell<HashMap<String, HashMap<u32, Rc<ConsumeQueue>>>>,
    index: MessageIndex,
    dispatched_offset: Cell<u64>,
    /// End of the complete records of the CommitLog: its end, except while the last bytes a
    /// master replicated end inside a record (the rest comes with the next bytes).
    records_end: Cell<u64>,
    /// Appended records waiting for their write (async) or sync (sync) before dispatch.
    pending_dispatch: RefCell<PendingDispatch>,
    last_store_timestamp_ms: Cell<i64>,
    /// Wakes the flush loop: an append, a finished write or sync, closing.
    writer_wake: LocalNotify,
    /// Records became visible (or a write failed): waiting appends re-check.
    flushed: LocalNotify,
    arrivals: LocalNotify,
    closing: LocalNotify,
    flush_error: RefCell<Option<String>>,
    disk_used_ratio: Cell<f64>,
    is_closed: Cell<bool>,
    /// Told the duration of each CommitLog group commit (for metrics; the store keeps none).
    flush_observer: RefCell<Option<FlushObserver>>,
}

/// Receives the duration of each CommitLog group commit.
pub type FlushObserver = Box<dyn Fn(std::time::Duration)>;

/// See the module documentation. Cloning shares the same store.
#[derive(Clone)]
pub struct MessageStore {
    inner: Rc<Inner>,
    tasks: Rc<RefCell<Vec<JoinHandle<()>>>>,
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

impl MessageStore {
    /// Opens (creating if needed) the store in `config.shard_dir`, recovering as described in
    /// the module documentation, and starts its flush and housekeeping tasks.
    pub async fn open(
        mut config: StoreConfig,
    ) -> Result<(MessageStore, RecoveryReport), StoreError> {
        config.validate()?;
        let dir = config.shard_dir.clone();
        std::fs::create_dir_all(&dir).map_err(io_error(dir.display().to_string()))?;
        config.segment_bytes = settle_segment_bytes(&dir, config.segment_bytes)?;
        config.validate()?;
        prime_direct_io_probe(&dir)
            .await
            .map_err(io_error("direct I/O probe"))?;
        let mut report = RecoveryReport {
            truncated_for_replica: apply_requested_truncation(&dir, config.segment_bytes)
                .map_err(io_error("requested truncation"))?,
            ..RecoveryReport::default()
        };
        match Checkpoint::load(&dir).map_err(io_error("checkpoint"))? {
            Ok(checkpoint) => report.checkpoint = checkpoint,
            Err(problem) => {
                warn!(%problem, "checkpoint unusable: scanning and rebuilding everything");
                report.checkpoint_problem = Some(problem);
            }
        }
        let keep_below = report
            .checkpoint
            .map(|c| c.derived_durable_offset)
            .unwrap_or(0);
        let inner = match Inner::recover(&config, keep_below, &mut report).await? {
            Some(inner) => inner,
            None => {
                warn!("derived files are inconsistent with the CommitLog: rebuilding them from scratch");
                for sub in ["consumequeue", "index"] {
                    let path = dir.join(sub);
                    if path.exists() {
                        std::fs::remove_dir_all(&path)
                            .map_err(io_error(path.display().to_string()))?;
                    }
                }
                report.rebuilt_derived = true;
                report.records_redispatched = 0;
                let first_scan = report.commitlog.clone();
                let inner = Inner::recover(&config, 0, &mut report)
                    .await?
                    .ok_or_else(|| {
                        StoreError::Corrupt(
                            "CommitLog records disagree with their own queue offsets".into(),
                        )
                    })?;
                if report.commitlog.truncated_at.is_none() {
                    report.commitlog.truncated_at = first_scan.truncated_at;
                    report.commitlog.discarded_bytes += first_scan.discarded_bytes;
                }
                inner
            }
        };
        let inner = Rc::new(inner);
        inner.refresh_disk_usage();
        inner.apply_retention_to_derived().await?;
        inner.checkpoint().await?;
        let store = MessageStore {
            inner: inner.clone(),
            tasks: Rc::new(RefCell::new(Vec::new())),
        };
        inner
            .commit_log
            .preallocate_ahead(inner.config.preallocate_ahead_bytes);
        // The flush loop and its writes run in the executor's default task queue, beside the
        // appends. Appends are short tasks that wait right after copying their batch, so they do
        // not hold the CPU until the preemption tick (what starved the previous engine's flush),
        // and glommio reaps I/O completions whenever the queue drains. A task queue of its own
        // was tried and dropped: glommio 0.9.0 (the latest release) can park an executor that
        // has runnable task queues when its preemption flag is already set as it starts running
        // them, and with two queues that hung a storage shard now and then in the test suite.
        let flush_task = glommio::spawn_local(flush_loop(inner.clone())).detach();
        let housekeeping_task = glommio::spawn_local(housekeeping_loop(inner)).detach();
        store
            .tasks
            .borrow_mut()
            .extend([flush_task, housekeeping_task]);
        Ok((store, report))
    }

    pub fn config(&self) -> &StoreConfig {
        &self.inner.config
    }

    /// Appends a batch; completes as the flush mode says (async: once its bytes are written,
    /// sync: once they are synced), or with `FlushDiskTimeout` after `sync_flush_timeout_ms`.
    /// On error nothing of the batch is appended.
    pub async fn append(&self, batch: EncodedBatch) -> Result<AppendOutcome, StoreError> {
        let inner = &self.inner;
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
            mut bytes,
            records: pending,
            topics,
            index_hashes,
        } = batch;
        let mut records = Vec::with_capacity(pending.len());
        {
            let mut waiting = inner.pending_dispatch.borrow_mut();
            waiting.index_hashes.extend(index_hashes);
            // A batch nearly always targets one queue: look it up once per run of records.
            let mut last_queue: Option<(u16, u32, Rc<ConsumeQueue>)> = None;
            inner.commit_log.append_batch(
                &mut bytes,
                &mut pending.iter().map(|r| r.len),
                &mut |index, physical_offset, record| {
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
                    patch_record(
                        record,
                        StorePatch {
                            queue_offset,
                            physical_offset,
                            store_timestamp_ms,
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
        let timeout = Duration::from_millis(inner.config.sync_flush_timeout_ms);
        let status = if inner.wait_visible(end, timeout).await {
            AppendStatus::Ok
        } else {
            AppendStatus::FlushDiskTimeout
        };
        Ok(AppendOutcome { status, records })
    }

    /// Reads messages of (topic, queue) from `offset`: at most `max_messages` and about
    /// `max_bytes` (at least one message if any matches), skipping entries the filter rejects.
    pub async fn get_messages(
        &self,
        topic: &str,
        queue_id: u32,
        offset: u64,
        max_messages: u32,
        max_bytes: u64,
        filter: &TagFilter,
    ) -> Result<GetResult, StoreError> {
        let Some(queue) = self.inner.queue(topic, queue_id) else {
            return Ok(GetResult {
                status: GetStatus::NoMatchedQueue,
                records: Vec::new(),
                next_offset: 0,
                min_offset: 0,
                max_offset: 0,
                suggest_broker_id: 0,
            });
        };
        let (min_offset, max_offset) = (queue.min_offset(), queue.max_offset());
        let mut result = GetResult {
            status: GetStatus::NoNewMessage,
            records: Vec::new(),
            next_offset: offset,
            min_offset,
            max_offset,
            suggest_broker_id: 0,
        };
        if offset < min_offset {
            result.status = GetStatus::OffsetTooSmall;
            result.next_offset = min_offset;
            return Ok(result);
        }
        if offset > max_offset {
            result.status = GetStatus::OffsetOverflow;
            result.next_offset = max_offset;
            return Ok(result);
        }
        if offset == max_offset {
            return Ok(result);
        }
        let commitlog_min = self.inner.commit_log.min_offset();
        // One CommitLog read serves every record of the batch that falls inside it: a queue's
        // records sit close together, so a pull costs a read or two, not one per record.
        let mut span: Option<(u64, Bytes)> = None;
        let mut next = offset;
        let mut bytes_total = 0u64;
        let mut scanned = 0u64;
        'scan: while next < max_offset && scanned < self.inner.config.max_scanned_entries_per_read {
            let want = (self.inner.config.max_scanned_entries_per_read - scanned).min(1024);
            let entries = queue
                .read(next, want)
                .await
                .map_err(io_error(queue.dir().display().to_string()))?;
            if entries.is_empty() {
                break;
            }
            for entry in entries {
                if result.records.len() >= max_messages as usize
                    || (!result.records.is_empty()
                        && bytes_total + u64::from(entry.size) > max_bytes)
                {
                    break 'scan;
                }
                scanned += 1;
                let queue_offset = next;
                next += 1;
                let is_gone =
                    entry == ConsumeQueueEntry::HOLE || entry.commitlog_offset < commitlog_min;
                if is_gone || !filter.matches_hash(entry.tags_hash) {
                    continue;
                }
                let start = entry.commitlog_offset;
                let end = start + u64::from(entry.size);
                let cached = span.as_ref().and_then(|(at, bytes)| {
                    (start >= *at && end <= at + bytes.len() as u64)
                        .then(|| bytes.slice((start - at) as usize..(end - at) as usize))
                });
                let first_read = match cached {
                    Some(bytes) => Some(bytes),
                    None => match self
                        .inner
                        .read_span(
                            start,
                            u64::from(entry.size),
                            max_bytes.saturating_sub(bytes_total),
                        )
                        .await
                    {
                        Some(bytes) => {
                            let record = bytes.slice(..(entry.size as usize).min(bytes.len()));
                            span = Some((start, bytes));
                            Some(record)
                        }
                        None => None,
                    },
                };
                let record = self
                    .inner
                    .read_queue_record_from(topic, queue_id, queue_offset, &entry, first_read)
                    .await?;
                bytes_total += record.len() as u64;
                result.records.push(record);
            }
        }
        result.next_offset = next;
        result.status = if result.records.is_empty() {
            GetStatus::NoMatchedMessage
        } else {
            GetStatus::Found
        };
        Ok(result)
    }

    /// `(min, max)` queue offsets of (topic, queue), if the queue exists on this shard.
    pub fn queue_offsets(&self, topic: &str, queue_id: u32) -> Option<(u64, u64)> {
        self.inner
            .queue(topic, queue_id)
            .map(|q| (q.min_offset(), q.max_offset()))
    }

    /// Every (topic, queue) this shard has, with min and max offsets.
    pub fn queues(&self) -> Vec<(String, u32, u64, u64)> {
        let mut list: Vec<_> = self
            .inner
            .queues
            .borrow()
            .iter()
            .flat_map(|(topic, queues)| {
                queues
                    .iter()
                    .map(move |(id, q)| (topic.clone(), *id, q.min_offset(), q.max_offset()))
            })
            .collect();
        list.sort();
        list
    }

    /// The first queue offset whose message was stored at or after `timestamp_ms` (the max
    /// offset if none), by binary search over the queue. For offset reset by time.
    pub async fn offset_by_time(
        &self,
        topic: &str,
        queue_id: u32,
        timestamp_ms: i64,
    ) -> Result<u64, StoreError> {
        let Some(queue) = self.inner.queue(topic, queue_id) else {
            return Ok(0);
        };
        let (mut low, mut high) = (queue.min_offset(), queue.max_offset());
        while low < high {
            let mid = low + (high - low) / 2;
            let entry = queue
                .get(mid)
                .await
                .map_err(io_error(queue.dir().display().to_string()))?
                .ok_or_else(|| {
                    StoreError::Corrupt(format!("{topic}/{queue_id}: entry {mid} missing"))
                })?;
            let record = self
                .inner
                .read_queue_record(topic, queue_id, mid, &entry)
                .await?;
            let view = RecordView::parse_unchecked(&record)?;
            if view.store_timestamp_ms() < timestamp_ms {
                low = mid + 1;
            } else {
                high = mid;
            }
        }
        Ok(low)
    }

    /// Messages of `topic` with key `key` stored in `[begin_ms, end_ms]`, newest first.
    pub async fn query_by_key(
        &self,
        topic: &str,
        key: &str,
        begin_ms: i64,
        end_ms: i64,
        max_results: usize,
    ) -> Result<Vec<Bytes>, StoreError> {
        let hash = index_hash(IndexKind::Key, topic, key);
        self.inner
            .query_index(hash, begin_ms, end_ms, max_results, |view| {
                view.topic() == topic && view.keys().any(|k| k == key)
            })
            .await
    }

    /// Messages whose client-generated unique id is `id`, stored in `[begin_ms, end_ms]`.
    pub async fn query_by_unique_id(
        &self,
        id: &str,
        begin_ms: i64,
        end_ms: i64,
        max_results: usize,
    ) -> Result<Vec<Bytes>, StoreError> {
        let hash = index_hash(IndexKind::UniqueId, "", id);
        self.inner
            .query_index(hash, begin_ms, end_ms, max_results, |view| {
                view.unique_key() == Some(id)
            })
            .await
    }

    /// CommitLog bytes for a replica, from `from` (where the replica's log ends): at most
    /// `max_bytes`, only bytes complete under the flush mode (written; synced under sync
    /// flush), never across a segment's end. Empty when the replica has everything. An offset
    /// before the oldest retained byte or past the end is an error (the replica is too far
    /// behind, or holds bytes this log does not).
    pub async fn read_for_replica(&self, from: u64, max_bytes: u64) -> Result<Bytes, StoreError> {
        let inner = &self.inner;
        let log = &inner.commit_log;
        let (min, visible) = (log.min_offset(), inner.visible_offset());
        if from < min || from > log.write_offset() {
            return Err(StoreError::ReplicaOutOfRange {
                from,
                min,
                end: log.write_offset(),
            });
        }
        let segment_end = from - from % log.segment_bytes() + log.segment_bytes();
        let to = visible.min(segment_end).min(from.saturating_add(max_bytes));
        if to <= from {
            return Ok(Bytes::new());
        }
        log.read(from, to - from)
            .await
            .map_err(io_error(format!("CommitLog read for a replica at {from}")))
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
        // Valid: append the bytes and queue the complete records for dispatch.
        log.append_raw(bytes);
        inner.records_end.set(at);
        inner.last_store_timestamp_ms.set(last_ts);
        {
            let mut waiting = inner.pending_dispatch.borrow_mut();
            waiting.index_hashes.extend(index_hashes);
            waiting.infos.extend(infos);
        }
        inner.writer_wake.notify_all();
        Ok(log.write_offset())
    }

    /// The validated record at a physical offset (query by offset id).
    pub async fn read_record_at(&self, physical_offset: u64) -> Result<Bytes, StoreError> {
        self.inner.read_record_at(physical_offset).await
    }

    /// Completes once every CommitLog byte appended before this call is durable (flushed and
    /// synced), as the flush loop gets to it; never if the store closes first.
    pub async fn wait_durable_to_current_end(&self) {
        let inner = &self.inner;
        let end = inner.commit_log.write_offset();
        while inner.commit_log.synced_offset() < end && !inner.is_closed.get() {
            inner.flushed.notified().await;
        }
    }

    /// Where this store's bytes end under its flush mode: written (async) or synced (sync).
    pub fn visible_offset(&self) -> u64 {
        self.inner.visible_offset()
    }

    /// Completes once every CommitLog byte appended before this call is complete under the
    /// flush mode (what a replica acknowledges); at once if the store closes.
    pub async fn wait_visible_to_current_end(&self) {
        let inner = &self.inner;
        let end = inner.commit_log.write_offset();
        while inner.visible_offset() < end && !inner.is_closed.get() {
            inner.flushed.notified().await;
        }
    }

    /// Completes when a message is next made visible on this shard (for long polling).
    pub fn arrival(&self) -> impl std::future::Future<Output = ()> + '_ {
        self.inner.arrivals.notified()
    }

    /// `(min, write, synced)` physical offsets of the CommitLog.
    pub fn commitlog_offsets(&self) -> (u64, u64, u64) {
        let log = &self.inner.commit_log;
        (log.min_offset(), log.write_offset(), log.synced_offset())
    }

    /// The physical offset below which every byte has completed its O_DIRECT write.
    pub fn commitlog_written_offset(&self) -> u64 {
        self.inner.commit_log.written_offset()
    }

    /// Bytes of CommitLog segments on disk.
    pub fn commitlog_disk_bytes(&self) -> u64 {
        self.inner.commit_log.disk_bytes()
    }

    /// Sets what is told the duration of each CommitLog group commit.
    pub fn set_flush_observer(&self, observer: FlushObserver) {
        *self.inner.flush_observer.borrow_mut() = Some(observer);
    }

    /// Runs one retention pass now (it also runs every `retention_interval_ms`).
    pub async fn run_retention(&self) -> Result<u64, StoreError> {
        self.inner.run_retention().await
    }

    /// Re-reads disk usage now (it is also checked every `checkpoint_interval_ms`).
    pub fn refresh_disk_usage(&self) -> f64 {
        self.inner.refresh_disk_usage()
    }

    /// Flushes everything, writes the checkpoint and stops the background tasks.
    pub async fn close(&self) -> Result<(), StoreError> {
        let inner = &self.inner;
        if inner.is_closed.replace(true) {
            return Ok(());
        }
        inner.writer_wake.notify_all();
        inner.closing.notify_all();
        // The flush loop writes and syncs everything appended before it stops.
        let tasks: Vec<_> = self.tasks.borrow_mut().drain(..).collect();
        for task in tasks {
            task.await;
        }
        let end = inner.commit_log.write_offset();
        inner.checkpoint().await?;
        info!(end_offset = end, "store closed");
        Ok(())
    }
}

/// The segment size recorded at creation wins over the configured one.
fn settle_segment_bytes(dir: &Path, configured: u64) -> Result<u64, StoreError> {
    match StoreFormat::load(dir).map_err(io_error("format file"))? {
        Some(format) => {
            if format.segment_bytes != configured {
                warn!(
                    recorded = format.segment_bytes,
                    configured, "segment size differs from the one the store was created with; keeping the recorded one"
                );
            }
            Ok(format.segment_bytes)
        }
        None => {
            let format = StoreFormat {
                version: FORMAT_VERSION,
                segment_bytes: configured,
            };
            format.save(dir).map_err(io_error("format file"))?;
            Ok(configured)
        }
    }
}

/// The derived entries of a record read back from the CommitLog (recovery); its index hashes
/// are pushed to `index_hashes`. Must agree with [`EncodedBatch::push`].
fn dispatch_info(
    queue: Rc<ConsumeQueue>,
    physical_offset: u64,
    view: &RecordView<'_>,
    index_hashes: &mut Vec<u64>,
) -> DispatchInfo {
    let topic = view.topic();
    let before = index_hashes.len();
    index_hashes.extend(view.keys().map(|k| index_hash(IndexKind::Key, topic, k)));
    if let Some(id) = view.unique_key() {
        index_hashes.push(index_hash(IndexKind::UniqueId, "", id));
    }
    DispatchInfo {
        queue,
        physical_offset,
        size: view.total_size(),
        queue_offset: view.queue_offset(),
        tags_hash: view.tags().map(tags_hash).unwrap_or(0),
        store_timestamp_ms: view.store_timestamp_ms(),
        index_hash_count: (index_hashes.len() - before) as u16,
    }
}

impl Inner {
    /// Opens the CommitLog, ConsumeQueues and index; `None` when the derived files cannot be
    /// brought in line with the CommitLog and must be rebuilt from scratch.
    async fn recover(
        config: &StoreConfig,
        keep_below: u64,
        report: &mut RecoveryReport,
    ) -> Result<Option<Inner>, StoreError> {
        let dir = &config.shard_dir;
        let queues = open_consume_queues(
            &dir.join("consumequeue"),
            config.consume_queue_entries_per_file,
            keep_below,
            config.segment_bytes - BLANK_MIN_BYTES as u64,
            report,
        )
        .await?;
        if report.consume_queue_damage.is_some() && keep_below > 0 {
            return Ok(None);
        }
        let index = MessageIndex::open(
            dir.join("index"),
            config.index_max_entries_per_file,
            keep_below,
        )
        .await
        .map_err(io_error("index"))?;
        if let Some(why) = index.damage() {
            warn!(%why, "index file is damaged");
            if keep_below > 0 {
                report.consume_queue_damage = Some(why);
                return Ok(None);
            }
        }
        let queue_map: RefCell<HashMap<String, HashMap<u32, Rc<ConsumeQueue>>>> =
            RefCell::new(queues);
        let mut pending: Vec<DispatchInfo> = Vec::new();
        let mut pending_hashes: Vec<u64> = Vec::new();
        let mut has_gap = false;
        let (commit_log, scan) = {
            let mut on_record = |physical_offset: u64, view: &RecordView<'_>| {
                if physical_offset < keep_below || has_gap {
                    return;
                }
                let queue = get_or_create_queue(&queue_map, config, view.topic(), view.queue_id());
                let info = dispatch_info(queue, physical_offset, view, &mut pending_hashes);
                // Only a full scan may find a queue starting past 0 (retention took its start);
                // after a checkpoint that means its ConsumeQueue files were lost: rebuild.
                let may_start_past_zero = keep_below == 0;
                if info
                    .queue
                    .put(info.queue_offset, entry_of(&info), may_start_past_zero)
                    .is_err()
                {
                    has_gap = true;
                }
                pending.push(info);
            };
            // Validate whole segments from the one holding the derived offset: a bad byte
            // below the checkpoint (lost or damaged on disk) is then found, not trusted.
            let scan_from = keep_below - keep_below % config.segment_bytes;
            CommitLog::open(
                dir.join("commitlog"),
                config.segment_bytes,
                config.hot_tail_bytes,
                scan_from,
                &mut on_record,
            )
            .await
            .map_err(io_error("commitlog"))?
        };
        // Kept even when this pass gives up: the rebuild's scan then finds the log already
        // cut and must not lose the news.
        report.commitlog = scan.clone();
        if has_gap {
            return Ok(None);
        }
        // Entries dropped at open must have come back from the CommitLog scan; a queue that
        // ends short of what its files held lost entries to damage, not to a crash.
        for (topic, by_queue) in queue_map.borrow().iter() {
            for (queue_id, queue) in by_queue {
                if queue.max_offset() < queue.on_disk_end() {
                    let why = format!(
                        "{topic}/{queue_id} held entries up to {} but only {} are backed by the CommitLog after the checkpoint",
                        queue.on_disk_end(),
                        queue.max_offset()
                    );
                    warn!(%why, "ConsumeQueue is damaged");
                    report.consume_queue_damage = Some(why);
                    return Ok(None);
                }
            }
        }
        let mut hashes = pending_hashes.into_iter();
        for info in &pending {
            for hash in hashes.by_ref().take(usize::from(info.index_hash_count)) {
                index.put(IndexEntry {
                    hash,
                    commitlog_offset: info.physical_offset,
                    store_timestamp_ms: info.store_timestamp_ms,
                });
            }
        }
        report.records_redispatched += pending.len() as u64;
        let end = scan.end_offset;
        // Entries that point past the recovered end can only exist if the CommitLog lost data
        // the checkpoint called durable; then the derived files cannot be trusted.
        if keep_below > end {
            warn!(
                keep_below,
                end, "CommitLog ends before the checkpoint's derived offset"
            );
            return Ok(None);
        }
        // Store timestamps never go backwards, also across a restart (offset-by-time relies on it).
        let last_ts = pending
            .last()
            .map(|i| i.store_timestamp_ms)
            .unwrap_or(0)
            .max(index.last_timestamp_ms());
        report.commitlog = scan;
        Ok(Some(Inner {
            config: config.clone(),
            commit_log,
            queues: queue_map,
            index,
            dispatched_offset: Cell::new(end),
            records_end: Cell::new(end),
            pending_dispatch: RefCell::new(PendingDispatch::default()),
            last_store_timestamp_ms: Cell::new(last_ts),
            writer_wake: LocalNotify::default(),
            flushed: LocalNotify::default(),
            arrivals: LocalNotify::default(),
            closing: LocalNotify::default(),
            flush_observer: RefCell::new(None),
            flush_error: RefCell::new(None),
            disk_used_ratio: Cell::new(0.0),
            is_closed: Cell::new(false),
        }))
    }

    fn queue(&self, topic: &str, queue_id: u32) -> Option<Rc<ConsumeQueue>> {
        self.queues
            .borrow()
            .get(topic)
            .and_then(|q| q.get(&queue_id))
            .cloned()
    }

    fn check_writable(&self, batch_bytes: u64) -> Result<(), StoreError> {
        if self.is_closed.get() {
            return Err(StoreError::Closed);
        }
        let used = self.disk_used_ratio.get();
        if used >= self.config.disk_refuse_ratio {
            return Err(StoreError::DiskFull {
                used_percent: used * 100.0,
                limit_percent: self.config.disk_refuse_ratio * 100.0,
            });
        }
        if let Some(problem) = self.flush_error.borrow().as_ref() {
            return Err(StoreError::FlushFailing(problem.clone()));
        }
        let unflushed =
            self.commit_log.write_offset() - self.commit_log.written_offset() + batch_bytes;
        if unflushed > self.config.max_unflushed_bytes {
            return Err(StoreError::Busy {
                unflushed_bytes: unflushed,
                limit: self.config.max_unflushed_bytes,
            });
        }
        Ok(())
    }

    /// The largest record appended or read: the configured bound, within a segment.
    fn record_cap(&self) -> u64 {
        self.config
            .max_record_bytes
            .min(self.commit_log.max_record_bytes())
    }

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

    fn dispatch(
        &self,
        info: &DispatchInfo,
        index_hashes: &mut VecDeque<u64>,
    ) -> Result<(), String> {
        for _ in 0..info.index_hash_count {
            let hash = index_hashes
                .pop_front()
                .expect("hashes pushed with their record");
            self.index.put(IndexEntry {
                hash,
                commitlog_offset: info.physical_offset,
                store_timestamp_ms: info.store_timestamp_ms,
            });
        }
        info.queue
            .put(info.queue_offset, entry_of(info), false)
            .map_err(|max| {
                format!(
                "queue offset {} dispatched while the queue's max is {max}: offsets out of order",
                info.queue_offset
            )
            })?;
        self.dispatched_offset
            .set(info.physical_offset + u64::from(info.size));
        Ok(())
    }

    /// The offset below which appended records are complete under the flush mode.
    fn visible_offset(&self) -> u64 {
        match self.config.flush_mode {
            FlushMode::Async => self.commit_log.written_offset(),
            FlushMode::Sync => self.commit_log.synced_offset(),
        }
    }

    /// Waits until everything below `end` is complete under the flush mode; `false` on timeout.
    async fn wait_visible(&self, end: u64, timeout: Duration) -> bool {
        let wait = async {
            while self.visible_offset() < end {
                self.flushed.notified().await;
            }
            true
        };
        future::or(wait, async {
            glommio::timer::sleep(timeout).await;
            false
        })
        .await
    }

    /// Dispatches every appended record now complete under the flush mode into its
    /// ConsumeQueue and the index, and wakes waiting appends and long polls.
    fn publish_progress(&self) -> Result<(), StoreError> {
        let visible = self.visible_offset();
        let mut dispatched_any = false;
        {
            let mut pending = self.pending_dispatch.borrow_mut();
            let PendingDispatch {
                infos,
                index_hashes,
            } = &mut *pending;
            while infos
                .front()
                .is_some_and(|info| info.physical_offset < visible)
            {
                let info = infos.pop_front().expect("front");
                self.dispatch(&info, index_hashes)
                    .map_err(StoreError::Corrupt)?;
                dispatched_any = true;
            }
        }
        self.flushed.notify_all();
        if dispatched_any {
            self.arrivals.notify_all();
        }
        Ok(())
    }

    fn publish_progress_or_log(&self) {
        if let Err(e) = self.publish_progress() {
            error!(error = %e, "dispatching appended records failed");
        }
    }

    fn observe_flush(&self, elapsed: Duration) {
        if let Some(observe) = self.flush_observer.borrow().as_ref() {
            observe(elapsed);
        }
    }

    fn report_flush_failure(&self, problem: String) {
        if self.flush_error.borrow().as_deref() != Some(problem.as_str()) {
            error!(error = %problem, "CommitLog write failed; refusing appends until it succeeds");
        }
        *self.flush_error.borrow_mut() = Some(problem);
    }

    fn report_flush_recovered(&self) {
        if self.flush_error.borrow_mut().take().is_some() {
            info!("CommitLog writes recovered");
        }
    }

    async fn flush_derived(&self) -> Result<(), StoreError> {
        let queues: Vec<Rc<ConsumeQueue>> = self
            .queues
            .borrow()
            .values()
            .flat_map(|q| q.values().cloned())
            .collect();
        for queue in queues {
            queue
                .flush()
                .await
                .map_err(io_error(queue.dir().display().to_string()))?;
        }
        self.index.flush().await.map_err(io_error("index"))
    }

    /// Flushes derived files, then records how far they and the CommitLog are durable.
    async fn checkpoint(&self) -> Result<(), StoreError> {
        let dispatched = self.dispatched_offset.get();
        self.flush_derived().await?;
        let synced = self.commit_log.synced_offset();
        let checkpoint = Checkpoint {
            commitlog_durable_offset: synced,
            derived_durable_offset: dispatched.min(synced),
            written_at_ms: now_ms(),
        };
        let path = self.config.shard_dir.join(CHECKPOINT_FILE);
        write_atomically_async(path, checkpoint.encode().to_vec())
            .await
            .map_err(io_error("checkpoint"))
    }

    fn refresh_disk_usage(&self) -> f64 {
        match disk_used_ratio(&self.config.shard_dir) {
            Ok(ratio) => {
                let was_full = self.disk_used_ratio.get() >= self.config.disk_refuse_ratio;
                let is_full = ratio >= self.config.disk_refuse_ratio;
                if is_full && !was_full {
                    warn!(
                        used_percent = ratio * 100.0,
                        "disk nearly full: refusing appends"
                    );
                } else if was_full && !is_full {
                    info!(
                        used_percent = ratio * 100.0,
                        "disk has room again: accepting appends"
                    );
                }
                self.disk_used_ratio.set(ratio);
                ratio
            }
            Err(e) => {
                warn!(error = %e, "cannot read disk usage");
                self.disk_used_ratio.get()
            }
        }
    }

    /// Deletes expired segments (and, above `disk_max_used_ratio`, the oldest ones early), then
    /// the derived entries that pointed into them. Returns segments deleted.
    async fn run_retention(&self) -> Result<u64, StoreError> {
        let mut deleted = 0;
        let reserved = Duration::from_secs(self.config.file_reserved_hours * 3600);
        while let Some((_, _, path)) = self.commit_log.sealed_segments().into_iter().next() {
            let is_expired = std::fs::metadata(&path)
                .and_then(|m| m.modified())
                .map(|modified| modified.elapsed().unwrap_or_default() >= reserved)
                .unwrap_or(false);
            let is_pressed = self.refresh_disk_usage() >= self.config.disk_max_used_ratio;
            if !is_expired && !is_pressed {
                break;
            }
            match self
                .commit_log
                .delete_oldest_segment()
                .await
                .map_err(io_error("CommitLog retention"))?
            {
                Some(_) => {
                    deleted += 1;
                    info!(segment = %path.display(), is_expired, is_pressed, "retention deleted a CommitLog segment");
                }
                None => break,
            }
        }
        if deleted > 0 {
            self.apply_retention_to_derived().await?;
            self.refresh_disk_usage();
        }
        Ok(deleted)
    }

    async fn apply_retention_to_derived(&self) -> Result<(), StoreError> {
        let commitlog_min = self.commit_log.min_offset();
        if commitlog_min == 0 {
            return Ok(());
        }
        let queues: Vec<Rc<ConsumeQueue>> = self
            .queues
            .borrow()
            .values()
            .flat_map(|q| q.values().cloned())
            .collect();
        for queue in queues {
            queue
                .delete_below(commitlog_min)
                .await
                .map_err(io_error(queue.dir().display().to_string()))?;
        }
        self.index
            .delete_below(commitlog_min)
            .await
            .map_err(io_error("index"))?;
        Ok(())
    }

    /// Bytes from `start`: what the pull has `room` for, between [`MIN_READ_SPAN_BYTES`] and
    /// [`READ_SPAN_BYTES`] (at least `min_len`), within its segment and the visible data; `None`
    /// when that cannot be had in one read (the caller reads the record alone).
    async fn read_span(&self, start: u64, min_len: u64, room: u64) -> Option<Bytes> {
        let limit = self
            .commit_log
            .segment_end(start)?
            .min(self.commit_log.written_offset());
        let mut len = room
            .clamp(MIN_READ_SPAN_BYTES, READ_SPAN_BYTES)
            .min(limit.saturating_sub(start));
        if len < min_len {
            return None;
        }
        // In the write ring, stop at the chunk's end so the span is a slice, not a copy.
        if let Some(chunk_end) = self.commit_log.ring_chunk_end(start) {
            len = len.min(chunk_end - start).max(min_len);
        }
        self.commit_log.read(start, len).await.ok()
    }

    /// Reads the record a ConsumeQueue entry points to and checks that it is that record.
    async fn read_queue_record(
        &self,
        topic: &str,
        queue_id: u32,
        queue_offset: u64,
        entry: &ConsumeQueueEntry,
    ) -> Result<Bytes, StoreError> {
        self.read_queue_record_from(topic, queue_id, queue_offset, entry, None)
            .await
    }

    /// Reads and validates the record `entry` names; `first_read` is its bytes when already
    /// read (as the entry's size says).
    async fn read_queue_record_from(
        &self,
        topic: &str,
        queue_id: u32,
        queue_offset: u64,
        entry: &ConsumeQueueEntry,
        first_read: Option<Bytes>,
    ) -> Result<Bytes, StoreError> {
        let read = |size: u64| {
            let commit_log = &self.commit_log;
            async move {
                commit_log
                    .read(entry.commitlog_offset, size)
                    .await
                    .map_err(io_error(format!(
                        "CommitLog read at {}",
                        entry.commitlog_offset
                    )))
            }
        };
        let readable = self
            .commit_log
            .write_offset()
            .saturating_sub(entry.commitlog_offset);
        // Sizes from disk are bounded before they are read: a damaged entry's size, and the
        // record's own, at most the largest record this store takes.
        let cap = self.record_cap();
        let mut bytes = match first_read {
            Some(bytes) => bytes,
            None => read(u64::from(entry.size).min(readable).min(cap)).await?,
        };
        // The CommitLog is the truth: when the entry's size disagrees with the record's own
        // (a damaged ConsumeQueue), the record is read by its own size, so a client never gets
        // a cut record or the next record's bytes.
        let own_size = bytes
            .get(..4)
            .map(|b| u64::from(u32::from_be_bytes([b[0], b[1], b[2], b[3]])));
        if let Some(own_size) = own_size.filter(|&n| n != bytes.len() as u64) {
            if own_size > 0 && own_size <= readable.min(cap) {
                warn!(
                    topic,
                    queue_id,
                    queue_offset,
                    entry_size = entry.size,
                    record_size = own_size,
                    "ConsumeQueue entry size disagrees with its record; serving the record by its own size (run `shardmq-broker verify`)"
                );
                bytes = read(own_size).await?;
            }
        }
        let own_size = own_size.unwrap_or(0);
        if own_size > cap {
            return Err(StoreError::Corrupt(format!(
                "record at CommitLog offset {} ({topic}/{queue_id} entry {queue_offset}) says it is {own_size} bytes, over the largest this store reads ({cap}); if max_message_bytes was lowered since it was written, raise it again to read it, else run `shardmq-broker verify`",
                entry.commitlog_offset
            )));
        }
        // A record read from disk is fully validated (both CRCs): one damaged there is
        // reported, never served. One still in the write ring was encoded and checked by this
        // process moments ago; the client checks its CRC end to end (storage-format.md §4.5).
        let from_ring = self.commit_log.is_in_ring(
            entry.commitlog_offset,
            entry.commitlog_offset + bytes.len() as u64,
        );
        let parsed = if from_ring {
            RecordView::parse_unchecked(&bytes)
        } else {
            decode_message(&bytes)
        };
        let view = parsed.map_err(|e| {
            StoreError::Corrupt(format!(
                "record at CommitLog offset {} ({topic}/{queue_id} entry {queue_offset}) is damaged: {e}; run `shardmq-broker verify`",
                entry.commitlog_offset
            ))
        })?;
        if view.queue_offset() != queue_offset
            || view.queue_id() != queue_id
            || view.topic() != topic
        {
            return Err(StoreError::Corrupt(format!(
                "ConsumeQueue {topic}/{queue_id} entry {queue_offset} points at CommitLog offset {} which holds another record",
                entry.commitlog_offset
            )));
        }
        if view.total_size() as usize != bytes.len() {
            return Err(StoreError::Corrupt(format!(
                "ConsumeQueue {topic}/{queue_id} entry {queue_offset} covers {} bytes but the record at CommitLog offset {} is {} bytes",
                bytes.len(),
                entry.commitlog_offset,
                view.total_size()
            )));
        }
        Ok(bytes)
    }

    async fn read_record_at(&self, physical_offset: u64) -> Result<Bytes, StoreError> {
        let (min, end) = (self.commit_log.min_offset(), self.commit_log.write_offset());
        if physical_offset < min || physical_offset + 8 > end {
            return Err(StoreError::Corrupt(format!(
                "physical offset {physical_offset} is outside the CommitLog [{min}, {end})"
            )));
        }
        let context = || format!("CommitLog read at {physical_offset}");
        let head = self
            .commit_log
            .read(physical_offset, 8)
            .await
            .map_err(io_error(context()))?;
        // The offset comes from the caller (an offset message id): the size found there is
        // checked before anything is read for it, so a query aimed inside a body reads 8 bytes,
        // not whatever length those bytes claim.
        let size = u64::from(peek_total_size(&head).unwrap_or(0));
        let magic = head
            .get(4..8)
            .map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]));
        if magic != Some(MESSAGE_MAGIC_CODE)
            || size < MIN_RECORD_BYTES as u64
            || physical_offset + size > end
        {
            return Err(StoreError::Corrupt(format!(
                "no record starts at physical offset {physical_offset}"
            )));
        }
        let limit = self.record_cap();
        if size > limit {
            return Err(StoreError::RecordTooLarge { size, limit });
        }
        let bytes = self
            .commit_log
            .read(physical_offset, size)
            .await
            .map_err(io_error(context()))?;
        let view = decode_message(&bytes)?;
        if view.physical_offset() != physical_offset {
            return Err(StoreError::Corrupt(format!(
                "no record starts at physical offset {physical_offset}"
            )));
        }
        Ok(bytes)
    }

    async fn query_index(
        &self,
        hash: u64,
        begin_ms: i64,
        end_ms: i64,
        max_results: usize,
        is_match: impl Fn(&RecordView<'_>) -> bool,
    ) -> Result<Vec<Bytes>, StoreError> {
        // Candidates beyond the results allow for hash collisions and cut records, not more.
        let max_candidates = max_results
            .saturating_mul(2)
            .clamp(16, MAX_INDEX_CANDIDATES);
        let lookup = self
            .index
            .lookup(
                hash,
                begin_ms,
                end_ms,
                max_candidates,
                self.config.max_index_scan_entries_per_query,
            )
            .await
            .map_err(io_error("index"))?;
        if lookup.is_partial {
            warn!(
                begin_ms,
                end_ms,
                scanned = self.config.max_index_scan_entries_per_query,
                "index query stopped at its scan budget; older entries of the range were not searched (narrow the time range)"
            );
        }
        let mut found = Vec::new();
        let mut found_bytes = 0usize;
        for offset in lookup.offsets {
            if found.len() >= max_results || found_bytes >= MAX_QUERY_ANSWER_BYTES {
                break;
            }
            // A candidate may point at a deleted or cut record: that is a miss, not an error.
            let Ok(bytes) = self.read_record_at(offset).await else {
                continue;
            };
            let is_hit = decode_message(&bytes).is_ok_and(|view| {
                let ts = view.store_timestamp_ms();
                ts >= begin_ms && ts <= end_ms && is_match(&view)
            });
            if is_hit {
                found_bytes += bytes.len();
                found.push(bytes);
            }
        }
        Ok(found)
    }
}

fn entry_of(info: &DispatchInfo) -> ConsumeQueueEntry {
    ConsumeQueueEntry {
        commitlog_offset: info.physical_offset,
        size: info.size,
        tags_hash: info.tags_hash,
    }
}

fn get_or_create_queue(
    queues: &RefCell<HashMap<String, HashMap<u32, Rc<ConsumeQueue>>>>,
    config: &StoreConfig,
    topic: &str,
    queue_id: u32,
) -> Rc<ConsumeQueue> {
    if let Some(queue) = queues.borrow().get(topic).and_then(|q| q.get(&queue_id)) {
        return queue.clone();
    }
    let dir = config
        .shard_dir
        .join("consumequeue")
        .join(topic)
        .join(queue_id.to_string());
    let queue = Rc::new(ConsumeQueue::new_empty(
        dir,
        config.consume_queue_entries_per_file,
    ));
    queues
        .borrow_mut()
        .entry(topic.to_owned())
        .or_default()
        .insert(queue_id, queue.clone());
    queue
}

async fn open_consume_queues(
    root: &Path,
    entries_per_file: u64,
    keep_below: u64,
    max_entry_size: u64,
    report: &mut RecoveryReport,
) -> Result<HashMap<String, HashMap<u32, Rc<ConsumeQueue>>>, StoreError> {
    let mut queues: HashMap<String, HashMap<u32, Rc<ConsumeQueue>>> = HashMap::new();
    if !root.exists() {
        return Ok(queues);
    }
    let context = || root.display().to_string();
    for topic_entry in std::fs::read_dir(root).map_err(io_error(context()))? {
        let topic_entry = topic_entry.map_err(io_error(context()))?;
        let Some(topic) = topic_entry.file_name().to_str().map(str::to_owned) else {
            continue;
        };
        if !topic_entry.path().is_dir() {
            continue;
        }
        for queue_entry in std::fs::read_dir(topic_entry.path()).map_err(io_error(context()))? {
            let queue_entry = queue_entry.map_err(io_error(context()))?;
            let Some(queue_id) = queue_entry
                .file_name()
                .to_str()
                .and_then(|n| n.parse::<u32>().ok())
            else {
                continue;
            };
            let (queue, repair) = ConsumeQueue::open(
                queue_entry.path(),
                entries_per_file,
                keep_below,
                max_entry_size,
            )
            .await
            .map_err(io_error(queue_entry.path().display().to_string()))?;
            report.consume_queue_entries_dropped += repair.entries_dropped;
            if let Some(why) = repair.damage {
                warn!(%topic, queue_id, %why, "ConsumeQueue is damaged");
                report.consume_queue_damage = Some(why);
            }
            queues
                .entry(topic.clone())
                .or_default()
                .insert(queue_id, Rc::new(queue));
        }
    }
    Ok(queues)
}

/// The flush loop (write-behind and group commit). It starts every
/// O_DIRECT write the CommitLog plans as soon as it may (a full chunk at once, several in
/// flight; a partly filled chunk when the disk would otherwise idle), each in a task of its own;
/// `fdatasync`s whatever is written whenever it can under sync flush (everything that arrived
/// meanwhile goes out with the next one: group commit) and at least every `flush_interval_ms`
/// under async flush; and makes completed records visible. On close it finishes everything
/// appended, then stops.
async fn flush_loop(inner: Rc<Inner>) {
    let interval = Duration::from_millis(inner.config.flush_interval_ms.max(1));
    let retry_delay = Duration::from_millis(100);
    let is_syncing = Rc::new(Cell::new(false));
    let mut last_sync = std::time::Instant::now();
    loop {
        let woken = inner.writer_wake.notified();
        let log = &inner.commit_log;
        if let Some(error) = log.take_write_error() {
            inner.report_flush_failure(error.to_string());
            inner.flushed.notify_all();
            if inner.is_closed.get() {
                error!("store closing with unwritten CommitLog bytes after a write failure");
                break;
            }
            glommio::timer::sleep(retry_delay).await;
            continue;
        }
        while let Some(job) = log.next_write_job() {
            let from = job.from();
            let inner = inner.clone();
            let is_syncing = is_syncing.clone();
            glommio::spawn_local(async move {
                let started = std::time::Instant::now();
                let outcome = inner.commit_log.write(job).await;
                if inner.commit_log.finish_write(from, outcome) {
                    inner.observe_flush(started.elapsed());
                    inner.report_flush_recovered();
                    // Sync flush: the fdatasync starts here, not a loop turn later.
                    let is_last = !inner.commit_log.has_writes_in_flight();
                    match inner.config.flush_mode {
                        FlushMode::Sync if is_last => start_sync(&inner, &is_syncing),
                        FlushMode::Sync => {}
                        // Async: what was written is complete; acknowledge it now.
                        FlushMode::Async => inner.publish_progress_or_log(),
                    }
                }
                inner.writer_wake.notify_all();
            })
            .detach();
        }
        let has_unsynced = log.written_offset() > log.synced_offset();
        let is_sync_due = match inner.config.flush_mode {
            FlushMode::Sync => true,
            FlushMode::Async => {
                last_sync.elapsed() >= interval
                    || inner.is_closed.get() && log.written_offset() == log.write_offset()
            }
        };
        if has_unsynced && is_sync_due && !is_syncing.get() {
            last_sync = std::time::Instant::now();
            start_sync(&inner, &is_syncing);
        }
        inner.publish_progress_or_log();
        let is_done = log.synced_offset() == log.write_offset()
            && !log.has_writes_in_flight()
            && !is_syncing.get();
        if inner.is_closed.get() && is_done {
            break;
        }
        if inner.is_closed.get() && inner.flush_error.borrow().is_some() && !is_syncing.get() {
            error!("store closing while CommitLog writes fail; unsynced bytes stay as they are");
            break;
        }
        // Async: wake for the next periodic sync, unless one is running (its end wakes us; a
        // timed wait then would be zero long and spin).
        let is_sync_pending = inner.config.flush_mode == FlushMode::Async
            && log.written_offset() > log.synced_offset()
            && !is_syncing.get();
        if is_sync_pending {
            let wait = interval
                .saturating_sub(last_sync.elapsed())
                .max(Duration::from_millis(1));
            future::or(woken, glommio::timer::sleep(wait)).await;
        } else {
            woken.await;
        }
    }
}

/// Starts an `fdatasync` of everything written, unless one is running (the next one then
/// covers what was written meanwhile: group commit).
fn start_sync(inner: &Rc<Inner>, is_syncing: &Rc<Cell<bool>>) {
    let log = &inner.commit_log;
    if is_syncing.get() || log.written_offset() <= log.synced_offset() {
        return;
    }
    is_syncing.set(true);
    let inner = inner.clone();
    let syncing = is_syncing.clone();
    glommio::spawn_local(async move {
        let started = std::time::Instant::now();
        match inner.commit_log.sync().await {
            Ok(_) => inner.observe_flush(started.elapsed()),
            Err(e) => {
                inner.report_flush_failure(format!("fdatasync: {e}"));
                glommio::timer::sleep(Duration::from_millis(100)).await;
            }
        }
        syncing.set(false);
        // Waiting appends are woken here, not a loop turn later.
        inner.publish_progress_or_log();
        inner.writer_wake.notify_all();
    })
    .detach();
}

/// Checkpoints every `checkpoint_interval_ms`; checks disk usage and runs retention every
/// `retention_interval_ms`.
async fn housekeeping_loop(inner: Rc<Inner>) {
    let interval = Duration::from_millis(inner.config.checkpoint_interval_ms.max(1));
    let mut since_retention = Duration::ZERO;
    while !inner.is_closed.get() {
        future::or(inner.closing.notified(), glommio::timer::sleep(interval)).await;
        if inner.is_closed.get() {
            break;
        }
        if let Err(e) = inner.checkpoint().await {
            error!(error = %e, "checkpoint failed");
        }
        inner.refresh_disk_usage();
        since_retention += interval;
        if since_retention.as_millis() as u64 >= inner.config.retention_interval_ms {
            since_retention = Duration::ZERO;
            if let Err(e) = inner.run_retention().await {
                error!(error = %e, "retention failed");
            }
        }
    }
}

/// The file system statistics of the file system holding `path`.
fn statvfs(path: &Path) -> io::Result<libc::statvfs> {
    use std::ffi::CString;
    use std::os::unix::ffi::OsStrExt;
    let c_path = CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path contains a NUL byte"))?;
    let mut stat: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c_path` is a valid NUL-terminated string and `stat` a valid out-pointer.
    let rc = unsafe { libc::statvfs(c_path.as_ptr(), &mut stat) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(stat)
}

/// (total, available to unprivileged writers) bytes of the file system holding `path`.
/// The file that asks the next open of a shard to cut its CommitLog (text: the offset).
pub const TRUNCATE_REQUEST_FILE: &str = "truncate-request";

/// Asks the next [`MessageStore::open`] of `shard_dir` to cut the CommitLog at `offset` (a
/// record boundary) and rebuild the derived files: a slave holding bytes its master does not
/// (docs/replication.md, "Divergence"). Durable when it returns.
pub fn request_truncation(shard_dir: &Path, offset: u64) -> io::Result<()> {
    super::atomic_file::write_atomically(
        &shard_dir.join(TRUNCATE_REQUEST_FILE),
        format!("{offset}\n").as_bytes(),
    )
}

/// Carries out a [`request_truncation`] (every step may be repeated after a crash; the request
/// is removed last): segments from `offset` on are deleted, the one holding it is cut there,
/// the ConsumeQueues, index and checkpoint are removed (rebuilt by the scan), and the epoch log
/// forgets the terms that start at or past it.
fn apply_requested_truncation(shard_dir: &Path, segment_bytes: u64) -> io::Result<Option<u64>> {
    let request = shard_dir.join(TRUNCATE_REQUEST_FILE);
    let text = match std::fs::read_to_string(&request) {
        Ok(text) => text,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let offset: u64 = text.trim().parse().map_err(|e| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{}: not an offset: {e}", request.display()),
        )
    })?;
    warn!(
        offset,
        "cutting the CommitLog where replication asked (the master never had the bytes after it)"
    );
    let commitlog_dir = shard_dir.join("commitlog");
    if commitlog_dir.exists() {
        for (base, path) in super::commitlog::list_segments(&commitlog_dir)? {
            if base >= offset {
                std::fs::remove_file(&path)?;
            } else if offset < base + segment_bytes {
                let file = std::fs::OpenOptions::new().write(true).open(&path)?;
                if file.metadata()?.len() > offset - base {
                    file.set_len(offset - base)?;
                }
                file.sync_all()?;
            }
        }
        std::fs::File::open(&commitlog_dir)?.sync_all()?;
    }
    for sub in ["consumequeue", "index"] {
        let path = shard_dir.join(sub);
        if path.exists() {
            std::fs::remove_dir_all(&path)?;
        }
    }
    match std::fs::remove_file(shard_dir.join(CHECKPOINT_FILE)) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    let mut epochs = super::epochs::EpochLog::load(shard_dir)?;
    epochs.truncate(offset);
    epochs.save(shard_dir)?;
    std::fs::remove_file(&request)?;
    std::fs::File::open(shard_dir)?.sync_all()?;
    Ok(Some(offset))
}

pub fn disk_space(path: &Path) -> io::Result<(u64, u64)> {
    let stat = statvfs(path)?;
    let fragment = stat.f_frsize as u64;
    Ok((
        stat.f_blocks as u64 * fragment,
        stat.f_bavail as u64 * fragment,
    ))
}

/// Fraction of the file system holding `path` that is in use (as `df` computes it).
pub fn disk_used_ratio(path: &Path) -> io::Result<f64> {
    let stat = statvfs(path)?;
    let available = stat.f_bavail as f64;
    let used = stat.f_blocks.saturating_sub(stat.f_bfree) as f64;
    if used + available == 0.0 {
        return Ok(0.0);
    }
    Ok(used / (used + available))
}
