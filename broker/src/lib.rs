//! The ShardMQ broker: storage engine (`store`), shard runtime and request serving.
//!
//! Storage shards (`storage_shard`) own the message stores; network shards (`network`) own the
//! sockets; they talk only through the channel mesh (`mesh`). `runtime` places shards on cores
//! and runs them; `registration` announces the broker to name servers.

pub mod config;
pub mod controller_client;
pub mod groups;
pub mod mesh;
pub mod meta;
pub mod metrics;
pub mod naming;
pub mod network;
pub mod offsets;
pub mod queue_locks;
pub mod registration;
pub mod replication;
pub mod retry;
pub mod runtime;
pub mod schedule;
pub mod storage_shard;
pub mod timer;
pub mod topics;
pub mod transaction;

/// The storage engine, a crate of its own (`broker/store`); named here as the broker's module.
pub use shardmq_store as store;
