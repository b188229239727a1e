//! The broker's services, named as RocketMQ names them so that a RocketMQ reader finds them:
//!
//! - `schedule` (ScheduleMessageService): delay levels, their queues and delivery;
//! - `timer` (the timer wheel of RocketMQ 5): delivery at a time;
//! - `transaction` (TransactionalMessageService): half messages, op records, check-backs;
//! - `queue_locks`: broker-side locks of ordered consumption;
//! - `replication` (HAService): the master's and the slave's sides of CommitLog replication;
//! - `tls_link`: the broker's outbound connections, in TLS when configured.
//! - `peer_auth`: the broker's account on the connections it opens (name servers,
//!   controllers, its master) when those enforce access control.
//!
//! Each runs on a storage shard beside its store (or answers for storage shard 0), and reaches
//! other shards only through what the broker hands it. It depends on base, the store, the codec
//! and the schema, never on the broker's mesh or shards: the compiler refuses a climb.

pub mod peer_auth;
pub mod queue_locks;
pub mod replication;
pub mod schedule;
pub mod timer;
pub mod tls_link;
pub mod transaction;

pub use shardmq_base::{config, groups, layout, meta, naming, role, topics};
pub use shardmq_store as store;
