//! The broker's ground floor: what every part of the broker above the store names.
//!
//! - `config` (with `config::delay_levels`): the whole broker configuration and its validation;
//! - `naming`: topic and group name rules, the system topics;
//! - `layout`: every file of a data directory, by name; `meta`: the data directory's identity
//!   and the queue → storage shard function;
//! - `topics`, `groups`, `offsets`: the topic table, client and group membership, consumer
//!   offsets (plain data structures and their files; their owners live in the broker);
//! - `metrics`: the process-wide Prometheus registry (the endpoint is the broker's);
//! - `role`: process-wide role state (restart request, learned master, own address,
//!   SyncStateSet);
//! - `msgid`: offset message ids.
//!
//! It depends on the store (for `StoreConfig`, `FlushMode` and atomic files), the codec and the
//! schema, never on services or the broker: the compiler refuses a climb.

pub mod config;
pub mod groups;
pub mod layout;
pub mod meta;
pub mod metrics;
pub mod msgid;
pub mod naming;
pub mod offsets;
pub mod role;
pub mod topics;

/// The storage engine, named as the broker names it (`crate::store::…` in every layer).
pub use shardmq_store as store;

/// The answer channel of a request sent to another shard (over the mesh) or task.
pub type Reply<T> = futures_channel::oneshot::Sender<T>;
