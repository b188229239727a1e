//! The messages shards exchange over glommio channels (the channel mesh).
//!
//! Network shard → storage shard: `StorageRequest`, each carrying a one-shot reply sender.
//! Storage shard → network shard: `NetworkEvent` (readiness, topic table snapshots, message
//! arrivals that wake parked pulls, group membership changes). Every channel is bounded: a
//! full request channel is answered with SYSTEM_BUSY by the sender, never queued without bound.
//! Everything here is `Send`, since it crosses threads; nothing here does I/O.

use std::collections::BTreeMap;
use std::sync::Arc;

use bytes::Bytes;

use crate::groups::{ConnectionKey, ConsumerMembership};
use crate::store::{AppendOutcome, EncodedBatch, GetResult, StoreError, TagFilter};
use crate::topics::{TopicConfig, TopicTable, UpsertError};

/// The target of the `trace` events that mark where a request is on its way through the
/// broker (`frame_begins`, `frame_complete`, `run_checked`, `stored`, `append_begins`,
/// `append_ends`, `answered`): `RUST_LOG=shardmq::timeline=trace` logs them, and
/// `scripts/timeline.py` turns the logs of a broker and a client into the time between stages
/// (docs/performance.md, "Where one call's time goes").
pub const TIMELINE: &str = "shardmq::timeline";

pub use shardmq_base::Reply;

/// A read of one queue.
#[derive(Debug, Clone)]
pub struct PullQuery {
    pub topic: String,
    pub queue_id: u32,
    pub offset: u64,
    pub max_messages: u32,
    pub max_bytes: u64,
    pub filter: TagFilter,
}

/// One queue's offsets and the store time of its newest message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueStat {
    pub queue_id: u32,
    pub min_offset: u64,
    pub max_offset: u64,
    pub last_update_ms: i64,
}

/// A slave's replica pull: CommitLog bytes from `from` in master term `epoch`, waiting up to
/// `suspend_ms` while there is nothing new.
pub struct ReplicaPull {
    pub from: u64,
    /// Where the slave's bytes end under its flush mode (its acknowledgement).
    pub acknowledged: u64,
    pub max_bytes: u64,
    pub suspend_ms: u64,
    pub epoch: u64,
    pub broker_id: i64,
    /// The connection the pull came on (its acknowledgement counts only from the one the
    /// slave joined on).
    pub link: crate::replication::ReplicaLink,
    pub reply: Reply<Result<crate::replication::ReplicaChunk, String>>,
}

pub enum StorageRequest {
    Append {
        batch: EncodedBatch,
        reply: Reply<Result<AppendOutcome, StoreError>>,
    },
    /// With `watch_for`, an empty answer also registers that network shard to be told when the
    /// queue gets a message (long polling); registering in the same step as the read means no
    /// arrival can slip between them.
    Pull {
        query: PullQuery,
        watch_for: Option<usize>,
        reply: Reply<Result<GetResult, StoreError>>,
    },
    QueueOffsets {
        topic: String,
        queue_id: u32,
        reply: Reply<Option<(u64, u64)>>,
    },
    QueueStats {
        topic: String,
        queue_ids: Vec<u32>,
        reply: Reply<Vec<QueueStat>>,
    },
    OffsetByTime {
        topic: String,
        queue_id: u32,
        timestamp_ms: i64,
        reply: Reply<Result<u64, StoreError>>,
    },
    QueryConsumerOffset {
        group: String,
        topic: String,
        queue_id: u32,
        reply: Reply<Option<u64>>,
    },
    CommitConsumerOffset {
        group: String,
        topic: String,
        queue_id: u32,
        offset: u64,
        reply: Reply<()>,
    },
    QueryByKey {
        topic: String,
        key: String,
        begin_ms: i64,
        end_ms: i64,
        max_results: usize,
        reply: Reply<Result<Vec<Bytes>, StoreError>>,
    },
    QueryByUniqueId {
        unique_id: String,
        begin_ms: i64,
        end_ms: i64,
        reply: Reply<Result<Vec<Bytes>, StoreError>>,
    },
    ReadAt {
        physical_offset: u64,
        reply: Reply<Result<Bytes, StoreError>>,
    },
    /// A slave's replica pull (see [`ReplicaPull`]).
    ReadForReplica(ReplicaPull),
    /// One of this shard's state files a slave copies (`replication::COPIED_FILES`): its bytes
    /// (`None` when absent) and the CommitLog's end when they were read.
    ReadShardFile {
        name: &'static str,
        reply: Reply<(Option<Vec<u8>>, u64)>,
    },
    /// Controller mode: this shard's log end and each slave's acknowledgement and liveness.
    ReplicaSyncView {
        reply: Reply<crate::replication::SyncView>,
    },
    /// Controller mode: the newest master term this shard's log holds and the log's end, which
    /// the controller ranks members by in an election.
    ReplicaProgress {
        reply: Reply<(u64, u64)>,
    },
    /// A page of this shard's committed consumer offsets after a (group, topic, queue), for a
    /// slave's copy; and whether more follow.
    ConsumerOffsetPage {
        after: Option<(String, String, u32)>,
        max: usize,
        reply: Reply<(Vec<crate::replication::OffsetRow>, bool)>,
    },
    /// A slave's copy of its master's offsets: each row moves the local offset only forward
    /// (a group that consumed here while the master was gone is not sent back).
    MergeConsumerOffsets {
        rows: Vec<crate::replication::OffsetRow>,
        reply: Reply<()>,
    },
    /// A slave joins: where the bytes it shares with this master end.
    ReplicaJoin {
        broker_id: i64,
        peer: String,
        end: u64,
        epochs: crate::store::epochs::EpochLog,
        link: crate::replication::ReplicaLink,
        reply: Reply<crate::replication::JoinAnswer>,
    },
    /// A slave returns bytes of this master's previous term that its log lost (asked for by
    /// the join's answer): where the log ends after them.
    ReplicaReturn {
        broker_id: i64,
        link: crate::replication::ReplicaLink,
        from: u64,
        data: Bytes,
        last: bool,
        reply: Reply<Result<u64, String>>,
    },
    // Control requests, served by storage shard 0 only.
    UpsertTopic {
        config: TopicConfig,
        is_create_only: bool,
        reply: Reply<Result<(), UpsertError>>,
    },
    DeleteTopic {
        topic: String,
        reply: Reply<bool>,
    },
    Heartbeat {
        client_id: String,
        connection: ConnectionKey,
        producer_groups: Vec<String>,
        consumer_groups: BTreeMap<String, ConsumerMembership>,
        reply: Reply<()>,
    },
    UnregisterClient {
        client_id: String,
        producer_group: Option<String>,
        consumer_group: Option<String>,
        reply: Reply<()>,
    },
    /// Clients whose heartbeats since the last of these repeated their last full heartbeat
    /// (same groups and subscriptions): only their liveness is refreshed. A network shard sends
    /// one of these a second instead of a request per heartbeat.
    ClientsAlive {
        clients: Vec<(String, ConnectionKey)>,
    },
    /// A client's connection closed.
    ClientGone {
        client_id: String,
        connection: ConnectionKey,
    },
    ConsumerList {
        group: String,
        reply: Reply<Vec<String>>,
    },
    /// A consumer group's live members with their heartbeats' declarations (shard 0).
    ConsumerGroupMembers {
        group: String,
        reply: Reply<Vec<(String, ConsumerMembership)>>,
    },
    /// Creates a broker-owned topic (`%RETRY%<group>`, `%DLQ%<group>`) if absent (shard 0).
    EnsureSystemTopic {
        name: String,
        queues: u32,
        reply: Reply<()>,
    },
    /// On-demand figures for a metrics scrape.
    MetricsSnapshot {
        reply: Reply<StorageSnapshot>,
    },
    /// Every (topic, queue id) this shard's store holds a ConsumeQueue for.
    StoredQueues {
        reply: Reply<Vec<(String, u32)>>,
    },
    /// Half messages and their resolution (shard 0 only; `transaction.rs`).
    Transaction(crate::transaction::TransactionRequest),
    /// Queue locks of orderly consumer groups (shard 0 only; `queue_locks.rs`).
    QueueLock(crate::queue_locks::LockRequest),
}

pub enum NetworkEvent {
    /// The storage shard has recovered its store and serves requests.
    StorageReady { shard: usize },
    /// The topic table changed (from storage shard 0).
    Topics(Arc<TopicTable>),
    /// A watched queue has a new message.
    Arrival { topic: String, queue_id: u32 },
    /// A consumer group's members changed (from storage shard 0).
    ConsumerIdsChanged { group: String },
    /// Ask a producer on one of this shard's connections about a half message (from storage
    /// shard 0; `transaction.rs`).
    TransactionCheck(crate::transaction::CheckBack),
}

/// What a storage shard reports for a scrape.
#[derive(Debug, Default, Clone)]
pub struct StorageSnapshot {
    /// (group, topic, messages behind) summed over the shard's queues.
    pub consumer_lag: Vec<(String, String, u64)>,
    pub commitlog_bytes: u64,
    /// Storage shard 0 only: (group, live members, subscribed topics) of every consumer group
    /// with live members.
    pub live_groups: Vec<(String, usize, Vec<String>)>,
    /// This shard's replication as its broker sees it (master or slave side).
    pub replication: crate::replication::ShardReplication,
}
