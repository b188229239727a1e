//! The store's vocabulary: its configuration (`StoreConfig`, `FlushMode`), its errors
//! (`StoreError`, each mapping to a wire status), what goes in (`EncodedBatch`) and what comes
//! out (`AppendOutcome`, `GetResult`, `RecoveryReport`). This is what the broker's mesh and
//! services see of the store; nothing here does I/O.

use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;

use bytes::{Bytes, BytesMut};

use crate::append_file::DMA_ALIGNMENT_BYTES;
use crate::checkpoint::Checkpoint;
use crate::commitlog::RecoveryScan;
use crate::index::{index_hash, IndexKind};
use crate::read_ahead::MIN_READAHEAD_BYTES;
use crate::record::{
    encode_record, tags_hash, PendingRecord, RecordError, RecordInput, MIN_RECORD_BYTES,
    PROPERTY_KEYS, PROPERTY_TAGS, PROPERTY_UNIQUE_KEY,
};

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
    /// Most bytes of CommitLog spans read from segment files for pulls and kept for the next
    /// ones (the read-ahead cache, `read_ahead.rs`); 0 turns read-ahead off (each pull then
    /// reads what it needs with its own copy).
    pub readahead_bytes: u64,
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
    /// Size of the append journal (`journal.rs`), which lets an async-flush append complete
    /// once its bytes are in the kernel's page cache instead of once its O_DIRECT write is
    /// done; a multiple of 4096. 0 turns it off. Unused under sync flush.
    pub journal_bytes: u64,
    /// Recovery dispatches none of the records past the checkpoint's derived offset (the
    /// ConsumeQueues held nothing past it that was known durable): they wait in the dispatch
    /// queue, with the dispatch limit at that offset, until the owner confirms them again with
    /// [`MessageStore::set_dispatch_limit`](super::MessageStore::set_dispatch_limit). For a
    /// store whose dispatch follows a confirmed offset (a sync master, a slave in controller
    /// mode): the confirmed offset is not persisted, and records dispatched only once confirmed
    /// must not be served after a restart just because they are on the local disk
    /// (docs/replication.md, "The confirmed offset").
    pub hold_unconfirmed_tail: bool,
    /// Under sync flush, the storage core polls instead of sleeping while a CommitLog write
    /// (`O_DSYNC`) or an `fdatasync` is in flight, so that its completion is seen at once rather
    /// than after a wake-up from sleep (tens of µs on a virtual machine): up to 2 ms, and not
    /// while another thread wants the core (the vendored glommio's `StayAwake`). It costs the
    /// core's time while the disk works. On by default; the broker sets it from
    /// `spin_before_park_us > 0`.
    pub poll_durable_writes: bool,
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
            readahead_bytes: 32 << 20,
            preallocate_ahead_bytes: 64 << 20,
            max_unflushed_bytes: 256 << 20,
            file_reserved_hours: 72,
            retention_interval_ms: 10_000,
            disk_max_used_ratio: 0.75,
            disk_refuse_ratio: 0.95,
            max_scanned_entries_per_read: 16_000,
            max_record_bytes: shardmq_codec::max_record_bytes(4 << 20) as u64,
            max_index_scan_entries_per_query: 4_000_000,
            journal_bytes: 64 << 20,
            hold_unconfirmed_tail: false,
            poll_durable_writes: true,
        }
    }

    /// Bytes of the storage core's registered I/O memory (glommio's `io_memory`, registered
    /// with io_uring) that this store uses: its write ring (what is not yet written,
    /// `PACE_UNWRITTEN_BYTES` and the chunks in flight, and the hot tail) and its read-ahead
    /// cache with the spans being read beside it. A ring chunk taken from that memory is
    /// written with `WRITE_FIXED` and a span read into it with `READ_FIXED`, without pinning
    /// the pages for every I/O, and the memory is reused: a read into heap memory instead
    /// faults in and zeroes fresh pages for every span (glibc maps a buffer that large anew).
    /// A buffer that does not fit comes from the heap and works as before.
    pub fn io_memory_bytes(&self) -> usize {
        let ring = self.hot_tail_bytes + super::state::PACE_UNWRITTEN_BYTES + (4 << 20);
        let reads = if self.readahead_bytes == 0 {
            0
        } else {
            self.readahead_bytes + super::read::READS_BESIDE_CACHE_BYTES
        };
        usize::try_from((ring + reads).next_multiple_of(1 << 20)).unwrap_or(usize::MAX)
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
        if !self.journal_bytes.is_multiple_of(DMA_ALIGNMENT_BYTES) {
            return fail(format!(
                "journal_bytes is {}, must be a multiple of 4096 (0 turns the journal off)",
                self.journal_bytes
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
        if self.readahead_bytes != 0 && self.readahead_bytes < MIN_READAHEAD_BYTES {
            return fail(format!(
                "readahead_bytes is {}: 0 (no read-ahead) or at least {MIN_READAHEAD_BYTES} (a span being served and the next one read ahead)",
                self.readahead_bytes
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
    #[error("appends are held: {0}")]
    Held(String),
    #[error("replicated bytes start at {got}, but this CommitLog ends at {expected}")]
    ReplicaGap { expected: u64, got: u64 },
    #[error("replication from {from} is outside this CommitLog, which holds [{min}, {end})")]
    ReplicaOutOfRange { from: u64, min: u64, end: u64 },
}

pub(super) fn io_error(context: impl Into<String>) -> impl FnOnce(io::Error) -> StoreError {
    let context = context.into();
    move |source| StoreError::Io { context, source }
}

/// Records on their way to a storage shard, with everything the storage shard needs to store
/// them: their lengths, queues, tags hashes and index hashes. The records were encoded by a
/// producer (a run checked by the network shard, shared with the frame it arrived in) or by the
/// broker itself (`push`). The storage shard does not parse or re-validate them; it copies them
/// once into the write ring and patches its fields there (`docs/storage-format.md` §4.6).
#[derive(Debug, Default)]
pub struct EncodedBatch {
    pub bytes: BatchBytes,
    pub records: Vec<PendingRecord>,
    /// The distinct topics of the records (nearly always one); `PendingRecord::topic` indexes it.
    pub topics: Vec<String>,
    /// Index hashes of every record in order (`PendingRecord::index_hash_count` each).
    pub index_hashes: Vec<u64>,
    /// The broker's address, written into every record's store host as it is stored; `None`
    /// keeps the encoded one (records the broker encoded or copies).
    pub store_host: Option<SocketAddr>,
}

/// A batch's record bytes: a buffer of the batch's own, or bytes shared with another owner (a
/// producer's run in the frame it arrived in), never copied to be stored.
#[derive(Debug, Clone)]
pub enum BatchBytes {
    Owned(BytesMut),
    Shared(Bytes),
}

impl Default for BatchBytes {
    fn default() -> Self {
        BatchBytes::Owned(BytesMut::new())
    }
}

impl std::ops::Deref for BatchBytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            BatchBytes::Owned(bytes) => bytes,
            BatchBytes::Shared(bytes) => bytes,
        }
    }
}

impl BatchBytes {
    /// The bytes as a buffer of the batch's own (shared bytes are copied first).
    pub fn to_mut(&mut self) -> &mut BytesMut {
        if let BatchBytes::Shared(shared) = self {
            *self = BatchBytes::Owned(BytesMut::from(&shared[..]));
        }
        match self {
            BatchBytes::Owned(bytes) => bytes,
            BatchBytes::Shared(_) => unreachable!("made owned above"),
        }
    }
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
        let len = encode_record(self.bytes.to_mut(), input)?;
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
    /// The offset the log was begun again at, empty, because replication asked for it
    /// ([`request_start_at`]), if it was.
    pub started_over_at: Option<u64>,
    pub checkpoint: Option<Checkpoint>,
    pub checkpoint_problem: Option<String>,
    pub commitlog: RecoveryScan,
    pub consume_queue_entries_dropped: u64,
    /// A damaged ConsumeQueue or index file found on open (then every derived file is rebuilt).
    pub consume_queue_damage: Option<String>,
    pub records_redispatched: u64,
    /// Records past the checkpoint held back from dispatch until confirmed again
    /// ([`StoreConfig::hold_unconfirmed_tail`]).
    pub records_held_unconfirmed: u64,
    /// Derived files were inconsistent and rebuilt from the whole CommitLog.
    pub rebuilt_derived: bool,
    /// Bytes appended again from the journal: acknowledged before a crash, not yet written to
    /// their segment then.
    pub replayed_from_journal: u64,
}

/// A query stops reading records once its results hold this many bytes (at least one record);
/// the network shard caps the answer it merges from all storage shards the same way.
pub const MAX_QUERY_ANSWER_BYTES: usize = 8 << 20;

/// Receives the duration of each CommitLog group commit.
pub type FlushObserver = Box<dyn Fn(std::time::Duration)>;
