//! The shared ground of the message store: `Inner` (the CommitLog, the ConsumeQueues, the
//! index and the progress counters of one shard), and the dispatch of completed records into
//! the ConsumeQueues and the index, which makes them visible and wakes waiting appends and long
//! polls. Every other part of the store works through these types.

use std::cell::{Cell, RefCell};
use std::collections::{BTreeSet, HashMap, VecDeque};
use std::rc::Rc;
use std::time::Duration;

use futures_lite::future;
use tracing::{error, info};

use crate::commitlog::CommitLog;
use crate::consume_queue::{ConsumeQueue, ConsumeQueueEntry};
use crate::index::{index_hash, IndexEntry, IndexKind, MessageIndex};
use crate::journal::Journal;
use crate::notify::LocalNotify;
use crate::read_ahead::ReadAhead;
use crate::record::{tags_hash, RecordView};

use super::types::{FlushMode, FlushObserver, StoreConfig, StoreError};

/// With the journal on, appends wait while more than this waits for its write ([`Inner::pace`]):
/// enough to keep every O_DIRECT write in flight busy, with a chunk filling behind them.
pub(crate) const PACE_UNWRITTEN_BYTES: u64 = 8 << 20;

/// With the journal on, how long the newest, partly filled chunk may wait to fill before it is
/// written as it is (when nothing else is being written). Under a steady load the next append
/// comes sooner and the chunk goes out whole, from the ring, without a copy; the bytes are in
/// the journal meanwhile.
pub(super) const PARTIAL_CHUNK_LINGER: std::time::Duration = std::time::Duration::from_millis(10);

/// An append's place in the order of [`Inner::pace`]; one dropped while waiting (its append
/// was cancelled) gives its turn up rather than holding every later append.
struct PaceTicket<'a> {
    inner: &'a Inner,
    number: u64,
    is_done: bool,
}

impl Drop for PaceTicket<'_> {
    fn drop(&mut self) {
        if self.is_done {
            return;
        }
        if self.inner.pace_serving.get() == self.number {
            self.inner.next_pace_turn();
        } else {
            self.inner.pace_abandoned.borrow_mut().insert(self.number);
        }
    }
}

/// A record's derived entries, computed once when it is appended or scanned. Its index hashes
/// (`index_hash_count` of them) wait in [`PendingDispatch::index_hashes`], in record order.
pub(super) struct DispatchInfo {
    pub(super) queue: Rc<ConsumeQueue>,
    pub(super) physical_offset: u64,
    pub(super) size: u32,
    pub(super) queue_offset: u64,
    pub(super) tags_hash: u64,
    pub(super) store_timestamp_ms: i64,
    pub(super) index_hash_count: u16,
}

/// Appended records not yet visible (their bytes not yet written, or synced under sync flush).
#[derive(Default)]
pub(super) struct PendingDispatch {
    pub(super) infos: VecDeque<DispatchInfo>,
    pub(super) index_hashes: VecDeque<u64>,
}

/// One shard's store state, shared (`Rc`) by the facade and its flush and housekeeping tasks.
pub(super) struct Inner {
    pub(super) config: StoreConfig,
    pub(super) commit_log: CommitLog,
    pub(super) queues: RefCell<HashMap<String, HashMap<u32, Rc<ConsumeQueue>>>>,
    pub(super) index: MessageIndex,
    /// CommitLog spans read from segment files for pulls (`readahead_bytes` of them at most).
    pub(super) read_ahead: ReadAhead,
    pub(super) dispatched_offset: Cell<u64>,
    /// End of the complete records of the CommitLog: its end, except while the last bytes a
    /// master replicated end inside a record (the rest comes with the next bytes).
    pub(super) records_end: Cell<u64>,
    /// Appended records waiting for their write (async) or sync (sync) before dispatch.
    pub(super) pending_dispatch: RefCell<PendingDispatch>,
    pub(super) last_store_timestamp_ms: Cell<i64>,
    /// Wakes the flush loop: an append, a finished write or sync, closing.
    pub(super) writer_wake: LocalNotify,
    /// Records became visible (or a write failed): waiting appends re-check.
    pub(super) flushed: LocalNotify,
    /// Appends pass [`Inner::pace`] in the order they arrived: the ticket the next arrival
    /// takes, the ticket whose turn it is, tickets given up while waiting (their append was
    /// dropped), and the wake-up of a new turn.
    pub(super) pace_next_ticket: Cell<u64>,
    pub(super) pace_serving: Cell<u64>,
    pub(super) pace_abandoned: RefCell<BTreeSet<u64>>,
    pub(super) pace_turn: LocalNotify,
    pub(super) arrivals: LocalNotify,
    pub(super) closing: LocalNotify,
    pub(super) flush_error: RefCell<Option<String>>,
    pub(super) disk_used_ratio: Cell<f64>,
    pub(super) is_closed: Cell<bool>,
    /// Told the duration of each CommitLog group commit (for metrics; the store keeps none).
    pub(super) flush_observer: RefCell<Option<FlushObserver>>,
    /// The append journal, under async flush when `journal_bytes` is not 0.
    pub(super) journal: Option<RefCell<Journal>>,
    /// Where the bytes the journal holds end (it holds every byte of `[written, journaled_end)`).
    pub(super) journaled_end: Cell<u64>,
    /// Records ending past this offset are not dispatched (into ConsumeQueues and the index)
    /// yet, though visible: a sync master's confirmed offset, the bytes every replica it must
    /// wait for holds (docs/replication.md, "The confirmed offset"). `u64::MAX`: no limit.
    pub(super) dispatch_limit: Cell<u64>,
    /// The visible offset when progress was last published: `arrivals` fires when it moves
    /// (replication reads visible bytes, whether or not they are dispatched yet).
    pub(super) published_visible: Cell<u64>,
    /// Why local appends are refused for now (`MessageStore::hold_appends`); replicated bytes
    /// are still taken.
    pub(super) appends_held: RefCell<Option<String>>,
}

/// The derived entries of a record read back from the CommitLog (recovery); its index hashes
/// are pushed to `index_hashes`. Must agree with [`EncodedBatch::push`].
pub(super) fn dispatch_info(
    queue: Rc<ConsumeQueue>,
    physical_offset: u64,
    view: &RecordView<'_>,
    index_hashes: &mut Vec<u64>,
) -> DispatchInfo {
    let topic = view.topic();
    let before = index_hashes.len();
    index_hashes.extend(view.keys().map(|k| index_hash(IndexKind::Key, topic, k)));
    if let Some(id) = view.unique_key() {
        index_hashes.push(index_hash(IndexKind::UniqueId, "", id));
    }
    DispatchInfo {
        queue,
        physical_offset,
        size: view.total_size(),
        queue_offset: view.queue_offset(),
        tags_hash: view.tags().map(tags_hash).unwrap_or(0),
        store_timestamp_ms: view.store_timestamp_ms(),
        index_hash_count: (index_hashes.len() - before) as u16,
    }
}

pub(super) fn entry_of(info: &DispatchInfo) -> ConsumeQueueEntry {
    ConsumeQueueEntry {
        commitlog_offset: info.physical_offset,
        size: info.size,
        tags_hash: info.tags_hash,
    }
}

pub(super) fn get_or_create_queue(
    queues: &RefCell<HashMap<String, HashMap<u32, Rc<ConsumeQueue>>>>,
    config: &StoreConfig,
    topic: &str,
    queue_id: u32,
) -> Rc<ConsumeQueue> {
    if let Some(queue) = queues.borrow().get(topic).and_then(|q| q.get(&queue_id)) {
        return queue.clone();
    }
    let dir = config
        .shard_dir
        .join("consumequeue")
        .join(topic)
        .join(queue_id.to_string());
    let queue = Rc::new(ConsumeQueue::new_empty(
        dir,
        config.consume_queue_entries_per_file,
    ));
    queues
        .borrow_mut()
        .entry(topic.to_owned())
        .or_default()
        .insert(queue_id, queue.clone());
    queue
}

impl Inner {
    pub(super) fn queue(&self, topic: &str, queue_id: u32) -> Option<Rc<ConsumeQueue>> {
        self.queues
            .borrow()
            .get(topic)
            .and_then(|q| q.get(&queue_id))
            .cloned()
    }

    pub(super) fn check_writable(&self, batch_bytes: u64) -> Result<(), StoreError> {
        if self.is_closed.get() {
            return Err(StoreError::Closed);
        }
        let used = self.disk_used_ratio.get();
        if used >= self.config.disk_refuse_ratio {
            return Err(StoreError::DiskFull {
                used_percent: used * 100.0,
                limit_percent: self.config.disk_refuse_ratio * 100.0,
            });
        }
        if let Some(problem) = self.flush_error.borrow().as_ref() {
            return Err(StoreError::FlushFailing(problem.clone()));
        }
        let unflushed =
            self.commit_log.write_offset() - self.commit_log.written_offset() + batch_bytes;
        if unflushed > self.config.max_unflushed_bytes {
            return Err(StoreError::Busy {
                unflushed_bytes: unflushed,
                limit: self.config.max_unflushed_bytes,
            });
        }
        Ok(())
    }

    /// The largest record appended or read: the configured bound, within a segment.
    pub(super) fn record_cap(&self) -> u64 {
        self.config
            .max_record_bytes
            .min(self.commit_log.max_record_bytes())
    }

    pub(super) fn dispatch(
        &self,
        info: &DispatchInfo,
        index_hashes: &mut VecDeque<u64>,
    ) -> Result<(), String> {
        for _ in 0..info.index_hash_count {
            let hash = index_hashes
                .pop_front()
                .expect("hashes pushed with their record");
            self.index.put(IndexEntry {
                hash,
                commitlog_offset: info.physical_offset,
                store_timestamp_ms: info.store_timestamp_ms,
            });
        }
        // A log that no longer begins at 0 (retention, or a slave that began its log at its
        // master's oldest byte) may hold a queue's first record past queue offset 0.
        let may_start_past_zero = self.commit_log.min_offset() > 0;
        info.queue
            .put(info.queue_offset, entry_of(info), may_start_past_zero)
            .map_err(|max| {
                format!(
                "queue offset {} dispatched while the queue's max is {max}: offsets out of order",
                info.queue_offset
            )
            })?;
        self.dispatched_offset
            .set(info.physical_offset + u64::from(info.size));
        Ok(())
    }

    /// The offset below which appended records are complete under the flush mode: synced under
    /// sync flush; under async flush written, or in the journal (page cache) when it is on.
    pub(super) fn visible_offset(&self) -> u64 {
        match self.config.flush_mode {
            FlushMode::Async => self
                .commit_log
                .written_offset()
                .max(self.journaled_end.get()),
            FlushMode::Sync => self.commit_log.synced_offset(),
        }
    }

    /// Waits, with the journal on, while more than [`PACE_UNWRITTEN_BYTES`] wait for their
    /// write. An append the journal completes at once never waits for the disk, so without
    /// this a stream of them would keep the storage core busy copying and leave the flush loop
    /// too little of it to keep the disk busy (the store benchmark wrote a third less); paced,
    /// a heavy load waits for the disk as it does without a journal, and a light one not at
    /// all.
    ///
    /// Appends pass in the order they arrived (a ticket each): one arriving while others wait
    /// waits behind them, so a producer's pipelined sends to a queue are stored in the order
    /// it sent them. (Woken together, waiters once raced, and an append arriving just after a
    /// write completed could pass all of them.) The caller appends before its next await.
    pub(super) async fn pace(&self) {
        if self.journal.is_none() {
            return;
        }
        let mut ticket = PaceTicket {
            inner: self,
            number: self.pace_next_ticket.get(),
            is_done: false,
        };
        self.pace_next_ticket.set(ticket.number + 1);
        let log = &self.commit_log;
        loop {
            let is_turn = self.pace_serving.get() == ticket.number;
            let has_room = log.write_offset() - log.written_offset() <= PACE_UNWRITTEN_BYTES
                || self.is_closed.get()
                || self.flush_error.borrow().is_some();
            if is_turn && has_room {
                ticket.is_done = true;
                self.next_pace_turn();
                return;
            }
            let turn = self.pace_turn.notified();
            let flushed = self.flushed.notified();
            if is_turn {
                flushed.await;
            } else {
                futures_lite::future::or(turn, flushed).await;
            }
        }
    }

    /// Gives the turn to the next ticket still waiting (skipping those given up).
    fn next_pace_turn(&self) {
        let mut next = self.pace_serving.get() + 1;
        {
            let mut abandoned = self.pace_abandoned.borrow_mut();
            while abandoned.remove(&next) {
                next += 1;
            }
        }
        self.pace_serving.set(next);
        self.pace_turn.notify_all();
    }

    /// Copies the appended bytes not yet written and not yet journaled into the journal, when
    /// it is on and they fit (bytes still waiting for their write must stay in it); then they
    /// are complete under async flush. Otherwise they complete when their write does.
    pub(super) fn journal_new_bytes(&self) {
        let Some(journal) = &self.journal else {
            return;
        };
        let log = &self.commit_log;
        let (written, end) = (log.written_offset(), log.write_offset());
        let mut journal = journal.borrow_mut();
        if end - written > journal.data_bytes() {
            return;
        }
        let from = self.journaled_end.get().max(written);
        if from >= end {
            return;
        }
        log.visit_ring(from, end, &mut |offset, bytes| {
            journal.copy_in(offset, bytes)
        });
        journal.set_end(end);
        self.journaled_end.set(end);
    }

    /// Waits until everything below `end` is complete under the flush mode; `false` on timeout.
    pub(super) async fn wait_visible(&self, end: u64, timeout: Duration) -> bool {
        let wait = async {
            while self.visible_offset() < end {
                self.flushed.notified().await;
            }
            true
        };
        future::or(wait, async {
            glommio::timer::sleep(timeout).await;
            false
        })
        .await
    }

    /// Dispatches every appended record now complete under the flush mode into its
    /// ConsumeQueue and the index, and wakes waiting appends and long polls.
    pub(super) fn publish_progress(&self) -> Result<(), StoreError> {
        let visible = self.visible_offset();
        let limit = self.dispatch_limit.get();
        let mut dispatched_any = false;
        {
            let mut pending = self.pending_dispatch.borrow_mut();
            let PendingDispatch {
                infos,
                index_hashes,
            } = &mut *pending;
            while infos.front().is_some_and(|info| {
                info.physical_offset < visible
                    && info.physical_offset + u64::from(info.size) <= limit
            }) {
                let info = infos.pop_front().expect("front");
                self.dispatch(&info, index_hashes)
                    .map_err(StoreError::Corrupt)?;
                dispatched_any = true;
            }
        }
        self.flushed.notify_all();
        if dispatched_any || visible != self.published_visible.get() {
            self.published_visible.set(visible);
            self.arrivals.notify_all();
        }
        Ok(())
    }

    pub(super) fn publish_progress_or_log(&self) {
        if let Err(e) = self.publish_progress() {
            error!(error = %e, "dispatching appended records failed");
        }
    }

    pub(super) fn observe_flush(&self, elapsed: Duration) {
        if let Some(observe) = self.flush_observer.borrow().as_ref() {
            observe(elapsed);
        }
    }

    pub(super) fn report_flush_failure(&self, problem: String) {
        if self.flush_error.borrow().as_deref() != Some(problem.as_str()) {
            error!(error = %problem, "CommitLog write failed; refusing appends until it succeeds");
        }
        *self.flush_error.borrow_mut() = Some(problem);
    }

    pub(super) fn report_flush_recovered(&self) {
        if self.flush_error.borrow_mut().take().is_some() {
            info!("CommitLog writes recovered");
        }
    }
}
