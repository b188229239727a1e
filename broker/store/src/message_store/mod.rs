//! The message store of one storage shard: CommitLog + ConsumeQueues + index, joined.
//!
//! Owns: recovery at open (checkpoint → scan → cut → rebuild derived entries), the append path
//! (assign queue and physical offsets, patch records, buffer, complete under the flush mode),
//! the flush loop (group commit), dispatch of completed records into the ConsumeQueues and the
//! index, the checkpoint/housekeeping loop (derived-file flushes, checkpoint, disk usage,
//! retention), and the read paths (by queue offset, by time, by key, by id).
//!
//! Lives on one glommio executor (it is `!Send`); everything in it runs on that core, so there
//! are no locks. It opens no sockets: network shards reach it through the broker's mesh.
//!
//! This file is the facade (`MessageStore`: open, close, progress); the parts are `impl` blocks
//! in child modules that meet only through `types` and `state`: `append`, `read`, `flush`,
//! `recovery`, `housekeeping`.

mod append;
mod flush;
mod housekeeping;
mod read;
mod recovery;
mod state;
mod types;

pub use housekeeping::{disk_space, disk_used_ratio};
pub use recovery::{
    request_start_at, request_truncation, START_REQUEST_FILE, TRUNCATE_REQUEST_FILE,
};
pub use types::{
    AppendOutcome, AppendStatus, AppendedRecord, BatchBytes, EncodedBatch, FlushMode,
    FlushObserver, GetResult, GetStatus, RecoveryReport, StoreConfig, StoreError,
    MAX_QUERY_ANSWER_BYTES,
};

use std::cell::RefCell;
use std::rc::Rc;

use glommio::task::JoinHandle;
use tracing::{info, warn};

use crate::append_file::prime_direct_io_probe;
use crate::checkpoint::Checkpoint;

use crate::journal::Journal;

use self::flush::flush_loop;
use self::housekeeping::housekeeping_loop;
use self::recovery::{apply_requested_start, apply_requested_truncation, settle_segment_bytes};
use self::state::{Inner, PARTIAL_CHUNK_LINGER};
use self::types::io_error;

/// See the module documentation. Cloning shares the same store.
#[derive(Clone)]
pub struct MessageStore {
    inner: Rc<Inner>,
    tasks: Rc<RefCell<Vec<JoinHandle<()>>>>,
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

impl MessageStore {
    /// Opens (creating if needed) the store in `config.shard_dir`, recovering as described in
    /// the module documentation, and starts its flush and housekeeping tasks.
    pub async fn open(
        mut config: StoreConfig,
    ) -> Result<(MessageStore, RecoveryReport), StoreError> {
        config.validate()?;
        let dir = config.shard_dir.clone();
        std::fs::create_dir_all(&dir).map_err(io_error(dir.display().to_string()))?;
        config.segment_bytes = settle_segment_bytes(&dir, config.segment_bytes)?;
        config.validate()?;
        prime_direct_io_probe(&dir)
            .await
            .map_err(io_error("direct I/O probe"))?;
        let mut report = RecoveryReport {
            started_over_at: apply_requested_start(&dir, config.segment_bytes)
                .map_err(io_error("requested start"))?,
            truncated_for_replica: apply_requested_truncation(&dir, config.segment_bytes)
                .map_err(io_error("requested truncation"))?,
            ..RecoveryReport::default()
        };
        match Checkpoint::load(&dir).map_err(io_error("checkpoint"))? {
            Ok(checkpoint) => report.checkpoint = checkpoint,
            Err(problem) => {
                warn!(%problem, "checkpoint unusable: scanning and rebuilding everything");
                report.checkpoint_problem = Some(problem);
            }
        }
        let keep_below = report
            .checkpoint
            .map(|c| c.derived_durable_offset)
            .unwrap_or(0);
        // What the journal holds past the end of the data on disk is part of the log to
        // recover (async flush: acknowledged, maybe not yet written).
        let journal = if config.flush_mode == FlushMode::Async && config.journal_bytes > 0 {
            Some(Journal::open(&dir, config.journal_bytes).map_err(io_error("journal"))?)
        } else {
            None
        };
        let mut inner = match Inner::recover(&config, keep_below, journal.as_ref(), &mut report)
            .await?
        {
            Some(inner) => inner,
            None => {
                warn!("derived files are inconsistent with the CommitLog: rebuilding them from scratch");
                for sub in ["consumequeue", "index"] {
                    let path = dir.join(sub);
                    if path.exists() {
                        std::fs::remove_dir_all(&path)
                            .map_err(io_error(path.display().to_string()))?;
                    }
                }
                report.rebuilt_derived = true;
                report.records_redispatched = 0;
                let first_scan = report.commitlog.clone();
                let inner = Inner::recover(&config, 0, journal.as_ref(), &mut report)
                    .await?
                    .ok_or_else(|| {
                        StoreError::Corrupt(
                            "CommitLog records disagree with their own queue offsets".into(),
                        )
                    })?;
                if report.commitlog.truncated_at.is_none() {
                    report.commitlog.truncated_at = first_scan.truncated_at;
                    report.commitlog.discarded_bytes += first_scan.discarded_bytes;
                }
                inner
            }
        };
        if let Some(mut journal) = journal {
            // It holds `[written, end)` now: the bytes recovery took back from it, if any.
            let end = inner.commit_log.write_offset();
            journal.set_start(inner.commit_log.written_offset());
            journal.set_end(end);
            inner.journaled_end.set(end);
            inner.journal = Some(RefCell::new(journal));
            inner
                .commit_log
                .set_partial_chunk_linger(Some(PARTIAL_CHUNK_LINGER));
        }
        let inner = Rc::new(inner);
        inner.refresh_disk_usage();
        inner.apply_retention_to_derived().await?;
        inner.checkpoint().await?;
        let store = MessageStore {
            inner: inner.clone(),
            tasks: Rc::new(RefCell::new(Vec::new())),
        };
        inner
            .commit_log
            .preallocate_ahead(inner.config.preallocate_ahead_bytes);
        // The flush loop and its writes run in the executor's default task queue, beside the
        // appends. Appends are short tasks that wait right after copying their batch, so they do
        // not hold the CPU until the preemption tick (what starved the previous engine's flush),
        // and glommio reaps I/O completions whenever the queue drains. A task queue of its own
        // was tried and dropped: glommio 0.9.0 (the latest release) can park an executor that
        // has runnable task queues when its preemption flag is already set as it starts running
        // them, and with two queues that hung a storage shard now and then in the test suite.
        let flush_task = glommio::spawn_local(flush_loop(inner.clone())).detach();
        let housekeeping_task = glommio::spawn_local(housekeeping_loop(inner)).detach();
        store
            .tasks
            .borrow_mut()
            .extend([flush_task, housekeeping_task]);
        Ok((store, report))
    }

    pub fn config(&self) -> &StoreConfig {
        &self.inner.config
    }

    /// Where this store's bytes end under its flush mode: written (async) or synced (sync).
    pub fn visible_offset(&self) -> u64 {
        self.inner.visible_offset()
    }

    /// Dispatches (into ConsumeQueues and the index, so pulls and queries see them) only the
    /// records that end at or below `limit`, and at once those now allowed: a sync master's
    /// confirmed offset (docs/replication.md). `u64::MAX` lifts the limit. Records already
    /// dispatched stay; a lower limit holds back only what is appended after.
    pub fn set_dispatch_limit(&self, limit: u64) {
        self.inner.dispatch_limit.set(limit);
        self.inner.publish_progress_or_log();
    }

    /// Refuses local appends ([`append`](Self::append)) with [`StoreError::Held`] and `why`
    /// until called with `None`; bytes a master replicates or a slave returns are still
    /// appended. A sync master holds them while it waits for a slave to return the tail it may
    /// have lost (docs/replication.md).
    pub fn hold_appends(&self, why: Option<String>) {
        *self.inner.appends_held.borrow_mut() = why;
    }

    /// Whether local appends are held ([`hold_appends`](Self::hold_appends)).
    pub fn appends_held(&self) -> bool {
        self.inner.appends_held.borrow().is_some()
    }

    /// The limit [`set_dispatch_limit`](Self::set_dispatch_limit) set.
    pub fn dispatch_limit(&self) -> u64 {
        self.inner.dispatch_limit.get()
    }

    /// Completes when bytes are next made visible on this shard (replication's wait).
    pub fn arrival(&self) -> impl std::future::Future<Output = ()> + '_ {
        self.inner.arrivals.notified()
    }

    /// `(min, write, synced)` physical offsets of the CommitLog.
    pub fn commitlog_offsets(&self) -> (u64, u64, u64) {
        let log = &self.inner.commit_log;
        (log.min_offset(), log.write_offset(), log.synced_offset())
    }

    /// The physical offset below which every byte has completed its O_DIRECT write.
    pub fn commitlog_written_offset(&self) -> u64 {
        self.inner.commit_log.written_offset()
    }

    /// Bytes of CommitLog segments on disk.
    pub fn commitlog_disk_bytes(&self) -> u64 {
        self.inner.commit_log.disk_bytes()
    }

    /// Sets what is told the duration of each CommitLog group commit.
    pub fn set_flush_observer(&self, observer: FlushObserver) {
        *self.inner.flush_observer.borrow_mut() = Some(observer);
    }

    /// Flushes everything, writes the checkpoint and stops the background tasks.
    pub async fn close(&self) -> Result<(), StoreError> {
        let inner = &self.inner;
        if inner.is_closed.replace(true) {
            return Ok(());
        }
        inner.writer_wake.notify_all();
        inner.closing.notify_all();
        // The flush loop writes and syncs everything appended before it stops.
        let tasks: Vec<_> = self.tasks.borrow_mut().drain(..).collect();
        for task in tasks {
            task.await;
        }
        let end = inner.commit_log.write_offset();
        if let Some(journal) = &inner.journal {
            // Everything is written and synced: the journal vouches for nothing more.
            let mut journal = journal.borrow_mut();
            journal.set_start(inner.commit_log.written_offset());
            journal.set_end(inner.commit_log.written_offset());
        }
        inner.checkpoint().await?;
        let read_ahead = inner.read_ahead.stats();
        if read_ahead.reads > 0 {
            info!(
                hits = read_ahead.hits,
                misses = read_ahead.misses,
                waits = read_ahead.waits,
                waited_us = read_ahead.waited_us,
                reads = read_ahead.reads,
                refused = read_ahead.refused,
                evicted = read_ahead.evicted,
                entry_hits = read_ahead.entry_hits,
                "read-ahead since the store opened"
            );
        }
        info!(end_offset = end, "store closed");
        Ok(())
    }
}
