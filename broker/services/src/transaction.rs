//! Transactional messages, storage side (RocketMQ's TransactionalMessageService): the half
//! messages not yet resolved, their resolution records, and the check-back schedule.
//!
//! Owns: the placement of the half queue (`RMQ_SYS_TRANS_HALF_TOPIC`) and the op queue
//! (`RMQ_SYS_TRANS_OP_HALF_TOPIC`), the record rewrites between a sent message, its half
//! message and its committed copy, the op records, and the in-memory table of unresolved half
//! messages, which is derived state: [`Transactions::recover`] rebuilds it from the two queues
//! at startup. Never: sockets, or appending to a real topic (the committed copy's queue may
//! live on another storage shard, so the network shard appends it; see
//! `network/transaction.rs`).
//!
//! Placement: both queues live on storage shard 0, which also keeps the client registry, so
//! the check service finds a live producer of the group (and the connection to reach it on)
//! without crossing the mesh. The queue ids are chosen to map to shard 0
//! (`meta::storage_shard_of`); with one storage shard both are queue 0, as in RocketMQ.
//!
//! Life of a half message (offsets are its queue offset `q` in the half queue):
//! 1. `AppendHalf` stores it and enters `q` as unresolved.
//! 2. `Begin(q, commit)` marks it resolving and hands its record to the network shard, which
//!    appends the committed copy to the real queue (after looking it up by unique id when a
//!    copy may already exist), then `Finish(q, stored)` writes the op record `commit q` and
//!    forgets `q`. `Begin(q, rollback)` writes `rollback q` at once.
//! 3. Unresolved for `transaction_timeout_ms`: the check service asks a live producer of the
//!    group every `transaction_check_interval_ms` (op record `check q` each time, so the count
//!    survives a restart); after `transaction_check_max` checks it writes `discard q` and logs.
//!
//! Exactly once: a committed copy carries the half message's CommitLog offset in its
//! prepared-transaction-offset field. After a restart every unresolved half message is marked
//! "may be committed", and its commit first looks for such a copy (index by unique id) before
//! appending one, so a crash between the copy and its op record never duplicates it.
//!
//! Size: about 840 lines of code and 120 of unit tests; kept whole (LAYERING.md): half
//! messages, op records, recovery and check-backs are one state machine over two queues.

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::{Ipv4Addr, SocketAddr};

use bytes::Bytes;
use tracing::{debug, info, warn};

use crate::config::BrokerConfig;
use crate::groups::{ClientRegistry, ConnectionKey};
use crate::meta::storage_shard_of;
use crate::naming::{TRANSACTION_HALF_TOPIC, TRANSACTION_OP_TOPIC};
use crate::store::record::{
    RecordError, PROPERTY_CRC32, PROPERTY_REAL_QUEUE_ID, PROPERTY_REAL_TOPIC, PROPERTY_TAGS,
    SYS_FLAG_TRANSACTION_COMMIT, SYS_FLAG_TRANSACTION_PREPARED, SYS_FLAG_TRANSACTION_ROLLBACK,
};
use crate::store::{
    AppendOutcome, EncodedBatch, GetStatus, MessageStore, RecordInput, RecordView, StoreError,
    TagFilter,
};
use crate::topics::TopicTable;
use shardmq_base::Reply;

/// Marks a message as transactional (RocketMQ's `TRAN_MSG`).
pub const PROPERTY_TRANSACTION: &str = "TRAN_MSG";
/// The producer group of a transactional message (RocketMQ's `PGROUP`).
pub const PROPERTY_PRODUCER_GROUP: &str = "PGROUP";
/// What an op record records: one of the [`OpKind`] names.
pub const PROPERTY_OP_KIND: &str = "TRAN_OP";
/// Tag of op records (RocketMQ's `REMOVETAG`).
pub const OP_TAG: &str = "d";

/// Half queue offsets one op record lists at most (its body stays within RocketMQ's
/// `transactionOpMsgMaxSize`, 4096 bytes).
pub const MAX_OFFSETS_PER_OP_RECORD: usize = 200;
/// Unresolved half messages kept at once; sends beyond are refused with SYSTEM_BUSY.
pub const MAX_UNRESOLVED_HALF_MESSAGES: usize = 1_000_000;
/// A resolution that has not finished after this long is presumed lost (its network shard
/// task died); the half message can be checked and resolved again.
pub const STALE_RESOLUTION_MS: i64 = 30_000;
/// Records read per step when the queues are scanned at startup.
const RECOVERY_BATCH_MESSAGES: u32 = 256;
const RECOVERY_BATCH_BYTES: u64 = 4 << 20;

/// Sys flag bits of the transaction type (prepared, commit, rollback).
const TRANSACTION_TYPE_MASK: u32 = SYS_FLAG_TRANSACTION_ROLLBACK;

/// The queue of `topic` on storage shard 0 with the smallest id.
fn queue_on_shard_zero(topic: &str, storage_shards: usize) -> u32 {
    (0..storage_shards.max(1) as u32)
        .find(|&queue_id| storage_shard_of(topic, queue_id, storage_shards) == 0)
        .expect("consecutive queue ids map to consecutive shards")
}

/// Queue of `RMQ_SYS_TRANS_HALF_TOPIC` that holds every half message.
pub fn half_queue_id(storage_shards: usize) -> u32 {
    queue_on_shard_zero(TRANSACTION_HALF_TOPIC, storage_shards)
}

/// Queue of `RMQ_SYS_TRANS_OP_HALF_TOPIC` that holds every op record.
pub fn op_queue_id(storage_shards: usize) -> u32 {
    queue_on_shard_zero(TRANSACTION_OP_TOPIC, storage_shards)
}

/// Puts the half and op topics in the topic table (so operators see them), with enough queues
/// to hold [`half_queue_id`] and [`op_queue_id`]. Returns whether the table changed.
pub fn ensure_topics(topics: &mut TopicTable, storage_shards: usize) -> bool {
    let half =
        topics.ensure_system_topic(TRANSACTION_HALF_TOPIC, half_queue_id(storage_shards) + 1);
    let op = topics.ensure_system_topic(TRANSACTION_OP_TOPIC, op_queue_id(storage_shards) + 1);
    half || op
}

/// How a half message was resolved, or that it was checked; the `TRAN_OP` property.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpKind {
    Commit,
    Rollback,
    /// Checked `transaction_check_max` times without an answer: dropped.
    Discard,
    /// One check-back was sent (not a resolution).
    Check,
}

impl OpKind {
    pub fn as_str(self) -> &'static str {
        match self {
            OpKind::Commit => "commit",
            OpKind::Rollback => "rollback",
            OpKind::Discard => "discard",
            OpKind::Check => "check",
        }
    }

    fn parse(text: &str) -> Option<OpKind> {
        match text {
            "commit" => Some(OpKind::Commit),
            "rollback" => Some(OpKind::Rollback),
            "discard" => Some(OpKind::Discard),
            "check" => Some(OpKind::Check),
            _ => None,
        }
    }

    fn is_resolution(self) -> bool {
        self != OpKind::Check
    }
}

// ---------------------------------------------------------------------------------------------
// Record rewrites

/// Re-encodes a stored record into `batch` for `topic`/`queue_id`, with the transaction type
/// bits of its sys flag replaced by `transaction_type`, the given prepared-transaction offset,
/// the properties in `removed` (and the CRC, which the encoder adds again) left out and `added`
/// appended.
#[allow(clippy::too_many_arguments)]
fn rewrite(
    view: &RecordView<'_>,
    topic: &str,
    queue_id: u32,
    transaction_type: u32,
    prepared_transaction_offset: i64,
    removed: &[&str],
    added: &[(&str, &str)],
    batch: &mut EncodedBatch,
) -> Result<(), RecordError> {
    let mut properties: Vec<(&str, &str)> = view
        .properties()
        .filter(|(key, _)| *key != PROPERTY_CRC32 && !removed.contains(key))
        .collect();
    properties.extend_from_slice(added);
    let input = RecordInput {
        topic,
        queue_id,
        flag: view.flag(),
        body: view.body(),
        properties: &properties,
        sys_flag: (view.sys_flag() & !TRANSACTION_TYPE_MASK) | transaction_type,
        born_timestamp_ms: view.born_timestamp_ms(),
        born_host: view.born_host(),
        store_host: view.store_host(),
        reconsume_times: view.reconsume_times(),
        prepared_transaction_offset,
    };
    batch.push(&input)
}

/// The half message for an encoded message of `real_topic`/`real_queue_id`: the same message in
/// the half queue, marked prepared, its real topic, queue and producer group in properties.
pub fn half_record(
    encoded: &[u8],
    producer_group: &str,
    storage_shards: usize,
) -> Result<EncodedBatch, RecordError> {
    let view = RecordView::parse_unchecked(encoded)?;
    let real_queue_id = view.queue_id().to_string();
    let mut batch = EncodedBatch::new();
    rewrite(
        &view,
        TRANSACTION_HALF_TOPIC,
        half_queue_id(storage_shards),
        SYS_FLAG_TRANSACTION_PREPARED,
        0,
        &[
            PROPERTY_REAL_TOPIC,
            PROPERTY_REAL_QUEUE_ID,
            PROPERTY_TRANSACTION,
            PROPERTY_PRODUCER_GROUP,
        ],
        &[
            (PROPERTY_REAL_TOPIC, view.topic()),
            (PROPERTY_REAL_QUEUE_ID, &real_queue_id),
            (PROPERTY_TRANSACTION, "true"),
            (PROPERTY_PRODUCER_GROUP, producer_group),
        ],
        &mut batch,
    )?;
    Ok(batch)
}

/// Real topic and queue a half message is for.
pub fn real_queue_of<'a>(half: &RecordView<'a>) -> Option<(&'a str, u32)> {
    let topic = half.property(PROPERTY_REAL_TOPIC)?;
    let queue_id = half.property(PROPERTY_REAL_QUEUE_ID)?.parse().ok()?;
    Some((topic, queue_id))
}

/// The committed copy of a half message: its real topic and queue, marked committed, with the
/// half message's CommitLog offset as its prepared-transaction offset (what makes the copy
/// recognisable, see [`is_committed_copy_of`]). Keeps `TRAN_MSG` and `PGROUP`, as RocketMQ does.
pub fn committed_record(half: &RecordView<'_>) -> Result<(EncodedBatch, String, u32), String> {
    let (topic, queue_id) = real_queue_of(half).ok_or_else(|| {
        format!(
            "half message at {} names no real topic and queue",
            half.physical_offset()
        )
    })?;
    let mut batch = EncodedBatch::new();
    rewrite(
        half,
        topic,
        queue_id,
        SYS_FLAG_TRANSACTION_COMMIT,
        half.physical_offset() as i64,
        &[PROPERTY_REAL_TOPIC, PROPERTY_REAL_QUEUE_ID],
        &[],
        &mut batch,
    )
    .map_err(|e| e.to_string())?;
    Ok((batch, topic.to_owned(), queue_id))
}

/// Whether `record` is the committed copy of the half message at `half_commit_log_offset`.
pub fn is_committed_copy_of(record: &[u8], topic: &str, half_commit_log_offset: u64) -> bool {
    RecordView::parse_unchecked(record).is_ok_and(|view| {
        view.topic() == topic
            && view.sys_flag() & TRANSACTION_TYPE_MASK == SYS_FLAG_TRANSACTION_COMMIT
            && view.prepared_transaction_offset() == half_commit_log_offset as i64
    })
}

/// Op records for `kind` over `half_offsets`, at most [`MAX_OFFSETS_PER_OP_RECORD`] each.
pub fn op_records(kind: OpKind, half_offsets: &[u64], storage_shards: usize) -> EncodedBatch {
    debug_assert!(!half_offsets.is_empty());
    let unspecified = SocketAddr::from((Ipv4Addr::UNSPECIFIED, 0));
    let mut batch = EncodedBatch::new();
    for chunk in half_offsets.chunks(MAX_OFFSETS_PER_OP_RECORD) {
        let body = chunk
            .iter()
            .map(u64::to_string)
            .collect::<Vec<_>>()
            .join(",");
        let properties = [(PROPERTY_TAGS, OP_TAG), (PROPERTY_OP_KIND, kind.as_str())];
        let input = RecordInput {
            topic: TRANSACTION_OP_TOPIC,
            queue_id: op_queue_id(storage_shards),
            flag: 0,
            body: body.as_bytes(),
            properties: &properties,
            sys_flag: 0,
            born_timestamp_ms: now_ms(),
            born_host: unspecified,
            store_host: unspecified,
            reconsume_times: 0,
            prepared_transaction_offset: 0,
        };
        batch
            .push(&input)
            .expect("an op record is small and has no separators");
    }
    batch
}

/// (kind, half offsets) of an op record; `None` for a record that is not one.
pub fn parse_op_record(record: &[u8]) -> Option<(OpKind, Vec<u64>)> {
    let view = RecordView::parse_unchecked(record).ok()?;
    let kind = OpKind::parse(view.property(PROPERTY_OP_KIND)?)?;
    let body = std::str::from_utf8(view.body()).ok()?;
    let offsets = body
        .split(',')
        .filter(|part| !part.is_empty())
        .map(str::parse)
        .collect::<Result<Vec<u64>, _>>()
        .ok()?;
    Some((kind, offsets))
}

pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

// ---------------------------------------------------------------------------------------------
// Mesh messages

/// What a producer (or its answer to a check-back) asks for a half message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resolution {
    Commit,
    Rollback,
}

/// Network shard → storage shard 0.
pub enum TransactionRequest {
    /// Store a half message (built by [`half_record`]).
    AppendHalf {
        batch: EncodedBatch,
        producer_group: String,
        reply: Reply<Result<AppendOutcome, HalfAppendError>>,
    },
    /// Start resolving a half message.
    Begin {
        half_queue_offset: u64,
        half_commit_log_offset: u64,
        producer_group: String,
        resolution: Resolution,
        reply: Reply<BeginOutcome>,
    },
    /// A commit started with `Begin` ended.
    Finish {
        half_queue_offset: u64,
        outcome: CommitOutcome,
        reply: Reply<()>,
    },
}

/// Why a half message was not stored.
#[derive(Debug)]
pub enum HalfAppendError {
    /// [`MAX_UNRESOLVED_HALF_MESSAGES`] are waiting for their resolution.
    TooManyUnresolved,
    Store(StoreError),
}

/// Answer to `Begin`.
#[derive(Debug)]
pub enum BeginOutcome {
    /// Committed, rolled back or discarded before: nothing to do.
    AlreadyResolved,
    /// No half message has that offset (or its CommitLog offset or group differ).
    NotFound(String),
    /// Another request is resolving it now.
    InProgress,
    /// Rolled back (its op record is written).
    RolledBack,
    /// Append this record's committed copy, then send `Finish`. With `may_be_committed`, a
    /// copy may exist already (the broker restarted, or an earlier attempt's outcome is
    /// unknown): look for it first.
    Commit {
        record: Bytes,
        may_be_committed: bool,
    },
    Failed(StoreError),
}

/// How the append of a committed copy ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CommitOutcome {
    /// The copy is stored (now or before).
    Stored,
    /// Not stored; `may_be_stored` when that is not certain.
    NotStored { may_be_stored: bool },
}

/// Storage shard 0 → the network shard holding `connection`: ask that producer.
#[derive(Debug)]
pub struct CheckBack {
    pub connection: ConnectionKey,
    pub producer_group: String,
    pub half_queue_offset: u64,
    pub half_commit_log_offset: u64,
    /// The half message as stored.
    pub record: Bytes,
}

// ---------------------------------------------------------------------------------------------
// The table of unresolved half messages

#[derive(Debug, Clone)]
struct HalfEntry {
    commit_log_offset: u64,
    store_timestamp_ms: i64,
    producer_group: String,
    check_times: u32,
    /// When a `Begin` started resolving it, until its `Finish`.
    resolving_since_ms: Option<i64>,
    may_be_committed: bool,
}

impl HalfEntry {
    fn is_resolving(&self, now_ms: i64) -> bool {
        self.resolving_since_ms
            .is_some_and(|since| now_ms - since < STALE_RESOLUTION_MS)
    }
}

/// Check-back settings (broker config `transaction_*`).
#[derive(Debug, Clone, Copy)]
pub struct CheckSettings {
    /// Age at which an unresolved half message is first checked (check immunity).
    pub timeout_ms: i64,
    /// Checks before the half message is discarded.
    pub check_max: u32,
}

impl CheckSettings {
    /// The check-back settings a broker configuration asks for.
    pub fn from_config(config: &BrokerConfig) -> CheckSettings {
        CheckSettings {
            timeout_ms: config.transaction_timeout_ms.min(i64::MAX as u64) as i64,
            check_max: config.transaction_check_max,
        }
    }
}

/// What recovery found, for the startup log.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RecoverySummary {
    pub half_messages: u64,
    pub op_records: u64,
    pub unresolved: usize,
}

/// Unresolved half messages of this broker (storage shard 0 only).
pub struct Transactions {
    storage_shards: usize,
    settings: CheckSettings,
    unresolved: RefCell<BTreeMap<u64, HalfEntry>>,
    /// One past the newest half queue offset known: offsets below it that are not in
    /// `unresolved` are resolved.
    next_half_offset: Cell<u64>,
}

impl Transactions {
    pub fn new(storage_shards: usize, settings: CheckSettings) -> Transactions {
        Transactions {
            storage_shards,
            settings,
            unresolved: RefCell::new(BTreeMap::new()),
            next_half_offset: Cell::new(0),
        }
    }

    pub fn unresolved_count(&self) -> usize {
        self.unresolved.borrow().len()
    }

    /// Rebuilds the table from the half and op queues. Every unresolved half message found is
    /// marked "may be committed" (a copy may have been stored before a crash).
    pub async fn recover(&self, store: &MessageStore) -> Result<RecoverySummary, StoreError> {
        let mut summary = RecoverySummary::default();
        let mut resolved: HashSet<u64> = HashSet::new();
        let mut checks: HashMap<u64, u32> = HashMap::new();
        let op_queue = op_queue_id(self.storage_shards);
        scan_queue(store, TRANSACTION_OP_TOPIC, op_queue, |record| {
            summary.op_records += 1;
            match parse_op_record(record) {
                Some((kind, offsets)) if kind.is_resolution() => resolved.extend(offsets),
                Some((_, offsets)) => {
                    for offset in offsets {
                        *checks.entry(offset).or_default() += 1;
                    }
                }
                None => warn!("skipping a record of {TRANSACTION_OP_TOPIC} that is not an op"),
            }
        })
        .await?;
        let half_queue = half_queue_id(self.storage_shards);
        let mut unresolved = BTreeMap::new();
        let mut next_half_offset = 0;
        scan_queue(store, TRANSACTION_HALF_TOPIC, half_queue, |record| {
            summary.half_messages += 1;
            let Ok(view) = RecordView::parse_unchecked(record) else {
                return;
            };
            let offset = view.queue_offset();
            next_half_offset = next_half_offset.max(offset + 1);
            if resolved.contains(&offset) {
                return;
            }
            unresolved.insert(
                offset,
                HalfEntry {
                    commit_log_offset: view.physical_offset(),
                    store_timestamp_ms: view.store_timestamp_ms(),
                    producer_group: view
                        .property(PROPERTY_PRODUCER_GROUP)
                        .unwrap_or_default()
                        .to_owned(),
                    check_times: checks.get(&offset).copied().unwrap_or(0),
                    resolving_since_ms: None,
                    may_be_committed: true,
                },
            );
        })
        .await?;
        if let Some((_, max)) = store.queue_offsets(TRANSACTION_HALF_TOPIC, half_queue) {
            next_half_offset = next_half_offset.max(max);
        }
        summary.unresolved = unresolved.len();
        *self.unresolved.borrow_mut() = unresolved;
        self.next_half_offset.set(next_half_offset);
        Ok(summary)
    }

    /// Serves one request from a network shard.
    pub async fn serve(&self, store: &MessageStore, request: TransactionRequest) {
        match request {
            TransactionRequest::AppendHalf {
                batch,
                producer_group,
                reply,
            } => {
                let _ = reply.send(self.append_half(store, batch, producer_group).await);
            }
            TransactionRequest::Begin {
                half_queue_offset,
                half_commit_log_offset,
                producer_group,
                resolution,
                reply,
            } => {
                let outcome = self
                    .begin(
                        store,
                        half_queue_offset,
                        half_commit_log_offset,
                        &producer_group,
                        resolution,
                    )
                    .await;
                let _ = reply.send(outcome);
            }
            TransactionRequest::Finish {
                half_queue_offset,
                outcome,
                reply,
            } => {
                self.finish(store, half_queue_offset, outcome).await;
                let _ = reply.send(());
            }
        }
    }

    /// Appends a half message and records it unresolved (the answer to `AppendHalf`).
    pub async fn append_half(
        &self,
        store: &MessageStore,
        batch: EncodedBatch,
        producer_group: String,
    ) -> Result<AppendOutcome, HalfAppendError> {
        debug_assert_eq!(batch.len(), 1, "one half message per send");
        if self.unresolved.borrow().len() >= MAX_UNRESOLVED_HALF_MESSAGES {
            return Err(HalfAppendError::TooManyUnresolved);
        }
        let outcome = store.append(batch).await.map_err(HalfAppendError::Store)?;
        for record in &outcome.records {
            self.unresolved.borrow_mut().insert(
                record.queue_offset,
                HalfEntry {
                    commit_log_offset: record.physical_offset,
                    store_timestamp_ms: record.store_timestamp_ms,
                    producer_group: producer_group.clone(),
                    check_times: 0,
                    resolving_since_ms: None,
                    may_be_committed: false,
                },
            );
            let next = self.next_half_offset.get().max(record.queue_offset + 1);
            self.next_half_offset.set(next);
        }
        Ok(outcome)
    }

    async fn begin(
        &self,
        store: &MessageStore,
        half_queue_offset: u64,
        half_commit_log_offset: u64,
        producer_group: &str,
        resolution: Resolution,
    ) -> BeginOutcome {
        let now = now_ms();
        let (commit_log_offset, may_be_committed) = {
            let mut unresolved = self.unresolved.borrow_mut();
            let Some(entry) = unresolved.get_mut(&half_queue_offset) else {
                return if half_queue_offset < self.next_half_offset.get() {
                    BeginOutcome::AlreadyResolved
                } else {
                    BeginOutcome::NotFound(format!(
                        "no half message at half queue offset {half_queue_offset}"
                    ))
                };
            };
            if entry.commit_log_offset != half_commit_log_offset {
                return BeginOutcome::NotFound(format!(
                    "the half message at half queue offset {half_queue_offset} is at CommitLog offset {}, not {half_commit_log_offset}",
                    entry.commit_log_offset
                ));
            }
            if entry.producer_group != producer_group {
                return BeginOutcome::NotFound(format!(
                    "the half message at half queue offset {half_queue_offset} belongs to producer group {}, not {producer_group}",
                    entry.producer_group
                ));
            }
            if entry.is_resolving(now) {
                return BeginOutcome::InProgress;
            }
            if entry.resolving_since_ms.is_some() {
                // A resolution that never finished may have stored the copy.
                entry.may_be_committed = true;
            }
            entry.resolving_since_ms = Some(now);
            (entry.commit_log_offset, entry.may_be_committed)
        };
        match resolution {
            Resolution::Rollback => {
                match self
                    .write_op(store, OpKind::Rollback, &[half_queue_offset])
                    .await
                {
                    Ok(()) => {
                        self.unresolved.borrow_mut().remove(&half_queue_offset);
                        BeginOutcome::RolledBack
                    }
                    Err(error) => {
                        self.release(half_queue_offset, false);
                        BeginOutcome::Failed(error)
                    }
                }
            }
            Resolution::Commit => match store.read_record_at(commit_log_offset).await {
                Ok(record) => BeginOutcome::Commit {
                    record,
                    may_be_committed,
                },
                Err(error) => {
                    self.release(half_queue_offset, false);
                    BeginOutcome::Failed(error)
                }
            },
        }
    }

    fn release(&self, half_queue_offset: u64, may_be_stored: bool) {
        if let Some(entry) = self.unresolved.borrow_mut().get_mut(&half_queue_offset) {
            entry.resolving_since_ms = None;
            entry.may_be_committed |= may_be_stored;
        }
    }

    async fn finish(&self, store: &MessageStore, half_queue_offset: u64, outcome: CommitOutcome) {
        match outcome {
            CommitOutcome::Stored => {
                match self
                    .write_op(store, OpKind::Commit, &[half_queue_offset])
                    .await
                {
                    Ok(()) => {
                        self.unresolved.borrow_mut().remove(&half_queue_offset);
                    }
                    Err(error) => {
                        // The copy is stored; a later check-back finds it and writes the op.
                        warn!(half_queue_offset, %error, "cannot record a transaction commit; it will be checked again");
                        self.release(half_queue_offset, true);
                    }
                }
            }
            CommitOutcome::NotStored { may_be_stored } => {
                self.release(half_queue_offset, may_be_stored)
            }
        }
    }

    async fn write_op(
        &self,
        store: &MessageStore,
        kind: OpKind,
        half_offsets: &[u64],
    ) -> Result<(), StoreError> {
        store
            .append(op_records(kind, half_offsets, self.storage_shards))
            .await
            .map(|_| ())
    }

    /// One round of the check service: every unresolved half message older than the check
    /// immunity is checked back (through `send`, to the network shard of a live producer's
    /// connection) or, after `check_max` checks, discarded. Returns (checked, discarded).
    pub async fn check_round(
        &self,
        store: &MessageStore,
        clients: &RefCell<ClientRegistry>,
        send: impl Fn(CheckBack) -> bool,
    ) -> (usize, usize) {
        let now = now_ms();
        let due: Vec<(u64, HalfEntry)> = self
            .unresolved
            .borrow()
            .iter()
            .filter(|(_, entry)| {
                now - entry.store_timestamp_ms >= self.settings.timeout_ms
                    && !entry.is_resolving(now)
            })
            .map(|(offset, entry)| (*offset, entry.clone()))
            .collect();
        let mut checked = Vec::new();
        let mut discarded = Vec::new();
        for (offset, entry) in due {
            if entry.check_times >= self.settings.check_max {
                warn!(
                    half_queue_offset = offset,
                    commit_log_offset = entry.commit_log_offset,
                    producer_group = %entry.producer_group,
                    checks = entry.check_times,
                    "transaction half message discarded: still unresolved after transaction_check_max checks"
                );
                discarded.push(offset);
                continue;
            }
            let record = match store.read_record_at(entry.commit_log_offset).await {
                Ok(record) => record,
                Err(error) => {
                    warn!(half_queue_offset = offset, %error, "transaction half message discarded: it can no longer be read");
                    discarded.push(offset);
                    continue;
                }
            };
            checked.push(offset);
            if let Some(entry) = self.unresolved.borrow_mut().get_mut(&offset) {
                entry.check_times += 1;
            }
            let producers = clients.borrow().producers_of(&entry.producer_group);
            let reachable: Vec<ConnectionKey> = producers
                .iter()
                .filter_map(|(_, connections)| connections.first().copied())
                .collect();
            if reachable.is_empty() {
                debug!(half_queue_offset = offset, producer_group = %entry.producer_group, "no live producer of the group to check a transaction with");
                continue;
            }
            // Spread the checks of one message over the group's members.
            let connection = reachable[entry.check_times as usize % reachable.len()];
            let is_sent = send(CheckBack {
                connection,
                producer_group: entry.producer_group.clone(),
                half_queue_offset: offset,
                half_commit_log_offset: entry.commit_log_offset,
                record,
            });
            if !is_sent {
                debug!(
                    half_queue_offset = offset,
                    "network shard busy; the check-back is skipped this round"
                );
            }
        }
        if !checked.is_empty() {
            if let Err(error) = self.write_op(store, OpKind::Check, &checked).await {
                warn!(%error, "cannot record transaction check-backs");
            }
        }
        if !discarded.is_empty() {
            match self.write_op(store, OpKind::Discard, &discarded).await {
                Ok(()) => {
                    let mut unresolved = self.unresolved.borrow_mut();
                    for offset in &discarded {
                        unresolved.remove(offset);
                    }
                }
                Err(error) => {
                    warn!(%error, "cannot record discarded transactions; they will be discarded again")
                }
            }
        }
        if !checked.is_empty() || !discarded.is_empty() {
            info!(
                checked = checked.len(),
                discarded = discarded.len(),
                unresolved = self.unresolved_count(),
                "transaction check round"
            );
        }
        (checked.len(), discarded.len())
    }
}

/// Calls `visit` with every record of (topic, queue) still stored, oldest first.
async fn scan_queue(
    store: &MessageStore,
    topic: &str,
    queue_id: u32,
    mut visit: impl FnMut(&[u8]),
) -> Result<(), StoreError> {
    let Some((min, _)) = store.queue_offsets(topic, queue_id) else {
        return Ok(());
    };
    let mut offset = min;
    loop {
        let result = store
            .get_messages(
                topic,
                queue_id,
                offset,
                RECOVERY_BATCH_MESSAGES,
                RECOVERY_BATCH_BYTES,
                &TagFilter::All,
            )
            .await?;
        match result.status {
            GetStatus::Found => {
                for record in &result.records {
                    visit(record);
                }
                debug_assert!(result.next_offset > offset, "a found read moves forward");
                offset = result.next_offset;
            }
            GetStatus::OffsetTooSmall if result.next_offset > offset => {
                offset = result.next_offset;
            }
            _ => return Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::record::{patch_record, StorePatch};

    fn stored(mut batch: EncodedBatch, queue_offset: u64, physical_offset: u64) -> Vec<u8> {
        assert_eq!(batch.records.len(), 1);
        let queue_id = batch.records[0].queue_id;
        patch_record(
            batch.bytes.to_mut(),
            StorePatch {
                queue_id,
                queue_offset,
                physical_offset,
                store_timestamp_ms: 1_000,
                store_host: None,
            },
        );
        batch.bytes.to_vec()
    }

    fn sent_message() -> Vec<u8> {
        let host = SocketAddr::from(([127, 0, 0, 1], 4000));
        let properties = [("UNIQ_KEY", "ABC"), ("KEYS", "order-1"), ("color", "red")];
        let mut batch = EncodedBatch::new();
        batch
            .push(&RecordInput {
                topic: "orders",
                queue_id: 3,
                flag: 7,
                body: b"pay 10",
                properties: &properties,
                sys_flag: 0,
                born_timestamp_ms: 5,
                born_host: host,
                store_host: host,
                reconsume_times: 0,
                prepared_transaction_offset: 0,
            })
            .unwrap();
        stored(batch, 0, 0)
    }

    #[test]
    fn half_and_committed_records_round_trip() {
        let sent = sent_message();
        let half = stored(half_record(&sent, "txn-group", 1).unwrap(), 4, 9_000);
        let view = RecordView::parse_unchecked(&half).unwrap();
        assert_eq!(view.topic(), TRANSACTION_HALF_TOPIC);
        assert_eq!(view.queue_id(), half_queue_id(1));
        assert_eq!(
            view.sys_flag() & TRANSACTION_TYPE_MASK,
            SYS_FLAG_TRANSACTION_PREPARED
        );
        assert_eq!(real_queue_of(&view), Some(("orders", 3)));
        assert_eq!(view.property(PROPERTY_PRODUCER_GROUP), Some("txn-group"));
        assert_eq!(view.property("color"), Some("red"));

        let (batch, topic, queue_id) = committed_record(&view).unwrap();
        assert_eq!((topic.as_str(), queue_id), ("orders", 3));
        let committed = stored(batch, 11, 20_000);
        let copy = RecordView::parse_unchecked(&committed).unwrap();
        assert_eq!(copy.topic(), "orders");
        assert_eq!(copy.queue_id(), 3);
        assert_eq!(copy.body(), b"pay 10");
        assert_eq!(copy.flag(), 7);
        assert_eq!(copy.unique_key(), Some("ABC"));
        assert_eq!(copy.property(PROPERTY_REAL_TOPIC), None);
        assert_eq!(copy.property(PROPERTY_TRANSACTION), Some("true"));
        assert_eq!(copy.prepared_transaction_offset(), 9_000);
        assert!(is_committed_copy_of(&committed, "orders", 9_000));
        assert!(!is_committed_copy_of(&committed, "orders", 9_001));
        assert!(!is_committed_copy_of(&committed, "other", 9_000));
        assert!(
            !is_committed_copy_of(&half, TRANSACTION_HALF_TOPIC, 0),
            "a half message is not a committed copy"
        );
        // Exactly one CRC property survives the rewrites, and the record verifies.
        assert_eq!(
            copy.properties()
                .filter(|(key, _)| *key == PROPERTY_CRC32)
                .count(),
            1
        );
        crate::store::record::decode_message(&committed).expect("a valid record");
    }

    #[test]
    fn op_records_round_trip_in_chunks() {
        let offsets: Vec<u64> = (0..450).collect();
        let batch = op_records(OpKind::Check, &offsets, 3);
        assert_eq!(batch.records.len(), 3);
        let mut seen = Vec::new();
        let mut start = 0;
        for pending in batch.records.clone() {
            let end = start + pending.len as usize;
            let mut one = EncodedBatch::new();
            one.bytes
                .to_mut()
                .extend_from_slice(&batch.bytes[start..end]);
            one.records.push(pending);
            let record = stored(one, 0, 0);
            let view = RecordView::parse_unchecked(&record).unwrap();
            assert_eq!(view.topic(), TRANSACTION_OP_TOPIC);
            assert_eq!(storage_shard_of(view.topic(), view.queue_id(), 3), 0);
            assert!(view.body().len() <= 4096);
            let (kind, part) = parse_op_record(&record).unwrap();
            assert_eq!(kind, OpKind::Check);
            seen.extend(part);
            start = end;
        }
        assert_eq!(seen, offsets);
    }

    #[test]
    fn system_queues_live_on_shard_zero() {
        for shards in 1..=16 {
            assert_eq!(
                storage_shard_of(TRANSACTION_HALF_TOPIC, half_queue_id(shards), shards),
                0
            );
            assert_eq!(
                storage_shard_of(TRANSACTION_OP_TOPIC, op_queue_id(shards), shards),
                0
            );
        }
        assert_eq!(half_queue_id(1), 0);
        assert_eq!(op_queue_id(1), 0);
    }
}
