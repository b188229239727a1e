//! The ShardMQ broker: storage engine (`store`), shard runtime and request serving.
//!
//! Storage shards (`storage_shard`) own the message stores; network shards (`network`) own the
//! sockets; they talk only through the channel mesh (`mesh`). `runtime` places shards on cores
//! and runs them; `registration` announces the broker to name servers.

pub mod control;
pub mod mesh;
pub mod network;
pub mod runtime;
pub mod storage;

/// The ground floor (`broker/base`), named here as the broker's own modules.
pub use shardmq_base::{
    config, groups, layout, meta, metrics, msgid, naming, offsets, role, topics,
};

/// The services (`broker/services`), named here as the broker's own modules.
pub use shardmq_services::{queue_locks, replication, schedule, timer, transaction};

/// The storage engine, a crate of its own (`broker/store`); named here as the broker's module.
pub use shardmq_store as store;
