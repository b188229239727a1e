//! The storage engine of a storage shard (see `docs/storage-format.md` for every file format).
//!
//! `message_store` is the entry point and joins the parts: `commitlog` (the only source of
//! truth), `consume_queue` and `index` (derived, rebuildable), `checkpoint`, and the pieces
//! they share: `append_file` (O_DIRECT appends with a hot tail), `record` (the stored message
//! layout), `scan` (validating walks), `read_ahead` (CommitLog spans read for pulls, kept for
//! the next ones), `filter`, `notify`, `atomic_file`. `verify` checks a data
//! directory offline. Nothing here knows about sockets.

pub mod append_file;
pub mod atomic_file;
pub mod checkpoint;
pub mod commitlog;
pub mod consume_queue;
pub mod epochs;
pub mod filter;
pub mod format;
pub mod index;
pub mod journal;
pub mod message_store;
pub mod notify;
pub mod read_ahead;
pub mod scan;
pub mod stream_copy;
pub mod verify;
pub mod write_ring;

/// The stored record format, from the `shardmq-codec` crate (one codec for the broker, the
/// client, `verify` and the fuzz targets), named here as the store's own module.
pub use shardmq_codec as record;

/// Runs `body` on a fresh glommio executor and waits for it (the store's unit tests, and the
/// broker's through the `test-util` feature).
#[cfg(any(test, feature = "test-util"))]
pub fn run_local<F: std::future::Future<Output = ()> + 'static>(
    body: impl FnOnce() -> F + Send + 'static,
) {
    glommio::LocalExecutorBuilder::default()
        .spawn(body)
        .expect("executor")
        .join()
        .expect("executor ran");
}

pub use filter::TagFilter;
pub use message_store::{
    request_start_at, request_truncation, AppendOutcome, AppendStatus, AppendedRecord, BatchBytes,
    EncodedBatch, FlushMode, GetResult, GetStatus, MessageStore, RecoveryReport, StoreConfig,
    StoreError, MAX_QUERY_ANSWER_BYTES,
};
pub use record::{RecordInput, RecordView};
