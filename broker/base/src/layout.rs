//! Every file a broker keeps in its data directory, by name, in one place (the formats are in
//! `docs/storage-format.md` and the modules that own each file):
//!
//! ```text
//! <data>/meta                      meta.rs (shard count, queue mapping)
//! <data>/topics                    topics.rs (topic table)
//! <data>/shard-N/offsets           offsets.rs (consumer offsets)
//! <data>/shard-N/delay-progress    services: schedule (delay-level delivery progress)
//! <data>/shard-N/timer-progress    services: timer (timer delivery progress)
//! <data>/shard-N/format, checkpoint, epochs, journal, truncate-request, start-request, commitlog/, consumequeue/,
//!                index/            the store crate
//! ```

pub use shardmq_store::checkpoint::CHECKPOINT_FILE;
pub use shardmq_store::epochs::EPOCHS_FILE;
pub use shardmq_store::format::FORMAT_FILE;
pub use shardmq_store::journal::JOURNAL_FILE;
pub use shardmq_store::message_store::{START_REQUEST_FILE, TRUNCATE_REQUEST_FILE};

/// The data directory's identity (`meta.rs`).
pub const META_FILE: &str = "meta";
/// The topic table (`topics.rs`).
pub const TOPICS_FILE: &str = "topics";
/// A storage shard's consumer offsets (`offsets.rs`).
pub const OFFSETS_FILE: &str = "offsets";
/// Delivery progress of the delay levels of one storage shard.
pub const DELAY_PROGRESS_FILE: &str = "delay-progress";
/// Delivery progress of the timer of one storage shard.
pub const TIMER_PROGRESS_FILE: &str = "timer-progress";

/// The per-shard state files a slave copies from its master every
/// `replica_metadata_interval_ms` (10 s, RocketMQ's period, as for consumer offsets):
/// delay-level and timer delivery progress.
pub const COPIED_FILES: [&str; 2] = [DELAY_PROGRESS_FILE, TIMER_PROGRESS_FILE];
