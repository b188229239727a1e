//! Master/slave replication, asynchronous or synchronous (docs/replication.md).
//!
//! A slave pulls its master's CommitLog over an ordinary connection to the master's HA address,
//! one loop per storage shard, run on that storage shard's own executor: the bytes land in that
//! shard's store, so the socket work is done where they are appended and no copy crosses cores.
//! Each `ReplicaPullRequest` names where the slave's log ends (so it also acknowledges what it
//! holds); the master's storage shard answers with the bytes from there
//! ([`MessageStore::read_for_replica`]), holding the request while it has nothing new, and the
//! slave appends them ([`MessageStore::append_replicated`]) and, once they are written (synced
//! under sync flush), acknowledges them with its next pull; a sync master's sends wait for that
//! acknowledgement (the broker's `storage::replica`). Network shard 0 of a slave copies the master's topic
//! table every 2 s and its consumer offsets every 10 s.
//!
//! Owns the slave's side and the master's storage-side answer; the master's request handler is
//! in the broker's `network::replica`.
//!
//! The parts: `master` (the master storage shard's side), `follower` (the slave's loop per
//! storage shard), `link` (the slave's connection to its master); this file holds what they
//! share: limits and the answers that cross the mesh.

mod follower;
mod link;
mod master;

pub use follower::{follow, Follower, SlaveView};
pub use link::MasterLink;
pub use master::{MasterSide, ReplicaLink};

use std::time::Duration;

use bytes::Bytes;

pub use crate::layout::COPIED_FILES;
use crate::store::epochs::Epoch;

/// Most bytes one replica pull asks for.
pub const REPLICA_PULL_BYTES: u32 = 4 << 20;

/// Most consumer offset rows in one `ReplicaOffsetsResponse` (a few hundred bytes each at
/// most: an answer stays well under the frame limit).
pub const MAX_OFFSET_ROWS_PER_PAGE: usize = 4096;

/// (group, topic, queue id, offset).
pub type OffsetRow = (String, String, u32, u64);
/// How long the master holds a replica pull that finds nothing new.
pub const REPLICA_SUSPEND_MS: u32 = 1_000;

/// How often a slave copies its master's topic table.
pub const TOPIC_SYNC_INTERVAL: Duration = Duration::from_secs(2);

/// A slave that has not asked for bytes for this long is not replicating: a sync master's
/// sends answer SLAVE_NOT_AVAILABLE at once instead of waiting for it. (An idle slave asks at
/// least once a second: the master holds its pulls 1 s.)
pub const SLAVE_SILENCE: Duration = Duration::from_secs(3);

/// One storage shard's replication, as its broker sees it (status and metrics).
#[derive(Debug, Clone, Default)]
pub struct ShardReplication {
    pub peer: String,
    pub epoch: u64,
    pub lag_bytes: Option<u64>,
    pub lag_ms: Option<u64>,
    pub connected: bool,
}

/// A storage shard's log end and, per slave, its id, acknowledgement and whether it asked
/// within [`SLAVE_SILENCE`].
pub type SyncView = (u64, Vec<(i64, u64, bool)>);

/// The master's answer to a join (see `ReplicaJoinResponse`).
#[derive(Debug, Clone)]
pub struct JoinAnswer {
    pub epoch: u64,
    pub epochs: Vec<Epoch>,
    pub master_end: u64,
    pub consistent_end: u64,
    /// Where the master's log begins (its oldest retained byte).
    pub log_start: u64,
    /// What the slave does with its bytes past `consistent_end`.
    pub tail: SlaveTail,
}

/// What a joining slave does with its bytes past where they agree with its master's
/// (docs/replication.md, "A master that lost its tail").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SlaveTail {
    /// They were never the master's (another master's term, or bytes no send was
    /// acknowledged for): cut them.
    #[default]
    Cut,
    /// They are the master's own previous term up to `end`, which its log lost, and its new
    /// term holds nothing yet: send them back (`ReplicaReturnRequest`), then join again.
    Return { end: u64 },
    /// A sync master lost them (a slave acknowledged them, so its sends may have been
    /// answered OK) and has written past them since: keep them, do not replicate, and say so.
    Keep { end: u64 },
}

/// One replica pull's answer from the master's storage shard.
#[derive(Debug, Clone)]
pub struct ReplicaChunk {
    pub bytes: Bytes,
    pub master_end: u64,
    pub epoch: u64,
    /// Age of the oldest byte the slave lacks (at `from`), in ms.
    pub lag_ms: u64,
    /// The master's confirmed offset (`ReplicaPullResponse.confirmed`).
    pub confirmed: u64,
}
