//! Timer messages: delivery at an arbitrary time (`deliver_at_ms`, or `delay_ms` from now) up to
//! `timer_max_delay_ms` ahead, through a persisted timer log (the idea of RocketMQ 5's TimerLog,
//! kept as an ordinary system topic).
//!
//! Owns: the timer queue of one storage shard (`SHARDMQ_SYS_TIMER`, one queue per storage shard,
//! placed like the schedule queues so that delivery is a local append), its in-memory index
//! `(due time, queue offset)` of the records not yet delivered, one reader task (log → index)
//! and one delivery task (index → real topic), and `<shard>/timer-progress`. Never: sockets or
//! the topic table. The log is the source of truth; the index is rebuilt from it at start.
//!
//! Progress and restart: the file records `scanned_offset` R (every record below R was indexed or
//! delivered), `delivered_until_ms` T (the latest due time delivered), `min_pending_offset` W and
//! `overdue_offsets` (records still pending although due at or before T: late arrivals). At
//! start the reader re-reads from W; a record in [W, R) is done when its due time is at or before
//! T and it is not listed overdue; every other record is pending. The file is written only once
//! the deliveries it covers are durable (`schedule::persist_when_durable`), so a crash redelivers
//! at most what was delivered during the last `schedule_persist_interval_ms`, and loses nothing.
//!
//! Limits: at most `timer_max_pending` records are indexed; while the index is full the reader
//! waits for deliveries, and records behind it are indexed (and delivered) late.

use std::cell::{Cell, RefCell};
use std::collections::{BTreeSet, HashSet};
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::time::Duration;

use bytes::Bytes;
use futures_lite::future;
use serde::{Deserialize, Serialize};
use tracing::{info, warn};

use crate::config::BrokerConfig;
pub use crate::layout::TIMER_PROGRESS_FILE;
use crate::naming::TIMER_TOPIC;
use crate::schedule::{
    colocated_queue_id, deliver, encode_progress, load_progress, now_ms, persist_when_durable,
    sleep_unless_stopped, ArrivalHook,
};
use crate::store::atomic_file::write_atomically_async;
use crate::store::notify::LocalNotify;
use crate::store::record::{RecordView, PROPERTY_TIMER_DELIVER_MS};
use crate::store::{GetStatus, MessageStore, TagFilter};
const READ_BATCH_MESSAGES: u32 = 64;
const READ_BATCH_BYTES: u64 = 1 << 20;
const RETRY_PAUSE: Duration = Duration::from_millis(500);

/// `<shard>/timer-progress`; see the module documentation.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TimerProgress {
    pub scanned_offset: u64,
    pub delivered_until_ms: i64,
    pub min_pending_offset: u64,
    pub overdue_offsets: Vec<u64>,
}

/// What the progress file says is already delivered, applied while re-reading [W, R).
struct Recovery {
    scanned_offset: u64,
    delivered_until_ms: i64,
    overdue: HashSet<u64>,
}

impl Recovery {
    fn is_delivered(&self, offset: u64, due_ms: i64) -> bool {
        offset < self.scanned_offset
            && due_ms <= self.delivered_until_ms
            && !self.overdue.contains(&offset)
    }
}

/// The timer delivery of one storage shard.
pub struct TimerService {
    shard: usize,
    queue_id: u32,
    max_pending: usize,
    store: MessageStore,
    on_arrival: ArrivalHook,
    path: PathBuf,
    /// Read and not yet delivered, by (due time, queue offset).
    pending: RefCell<BTreeSet<(i64, u64)>>,
    scanned_offset: Cell<u64>,
    delivered_until_ms: Cell<i64>,
    /// Until the reader has passed the persisted R again; no progress is persisted meanwhile
    /// (it would forget which records in [R', R) were delivered).
    recovery: RefCell<Option<Recovery>>,
    /// A record was indexed (the head may be earlier now).
    indexed: LocalNotify,
    /// A record was delivered (the index has room again).
    delivered: LocalNotify,
    stop: LocalNotify,
    stopping: Cell<bool>,
    tasks: RefCell<Vec<glommio::task::JoinHandle<()>>>,
}

impl TimerService {
    pub fn start(
        shard: usize,
        config: &BrokerConfig,
        store: MessageStore,
        shard_dir: &Path,
        on_arrival: ArrivalHook,
    ) -> Rc<TimerService> {
        let path = shard_dir.join(TIMER_PROGRESS_FILE);
        let (progress, problem): (TimerProgress, _) = load_progress(&path);
        if let Some(problem) = problem {
            warn!(shard, %problem, "timer progress file was unusable; every stored timer message is delivered again");
        }
        let queue_id = colocated_queue_id(TIMER_TOPIC, 0, shard, config.storage_cores.len());
        let service = Rc::new(TimerService {
            shard,
            queue_id,
            max_pending: config.timer_max_pending,
            store,
            on_arrival,
            path,
            pending: RefCell::new(BTreeSet::new()),
            scanned_offset: Cell::new(progress.min_pending_offset),
            delivered_until_ms: Cell::new(progress.delivered_until_ms),
            recovery: RefCell::new(
                (progress.scanned_offset > progress.min_pending_offset).then(|| Recovery {
                    scanned_offset: progress.scanned_offset,
                    delivered_until_ms: progress.delivered_until_ms,
                    overdue: progress.overdue_offsets.iter().copied().collect(),
                }),
            ),
            indexed: LocalNotify::default(),
            delivered: LocalNotify::default(),
            stop: LocalNotify::default(),
            stopping: Cell::new(false),
            tasks: RefCell::new(Vec::new()),
        });
        let interval = Duration::from_millis(config.schedule_persist_interval_ms);
        *service.tasks.borrow_mut() = vec![
            glommio::spawn_local(service.clone().read_loop()).detach(),
            glommio::spawn_local(service.clone().deliver_loop()).detach(),
            glommio::spawn_local(service.clone().persist_loop(interval)).detach(),
        ];
        service
    }

    /// Stops reading and delivering (a delivery in progress completes first).
    pub async fn stop(&self) {
        self.stopping.set(true);
        self.stop.notify_all();
        let tasks: Vec<_> = self.tasks.borrow_mut().drain(..).collect();
        for task in tasks {
            task.await;
        }
    }

    /// Writes the progress file without waiting for durability: call after the store closed.
    pub async fn persist_final(&self) {
        let Some(snapshot) = self.snapshot() else {
            return;
        };
        if let Err(e) = write_atomically_async(self.path.clone(), encode_progress(&snapshot)).await
        {
            warn!(shard = self.shard, error = %e, "cannot persist timer progress");
        }
    }

    /// The progress to persist now; `None` while recovery has not re-read the persisted range.
    fn snapshot(&self) -> Option<TimerProgress> {
        if self.recovery.borrow().is_some() {
            return None;
        }
        let pending = self.pending.borrow();
        let scanned_offset = self.scanned_offset.get();
        let delivered_until_ms = self.delivered_until_ms.get();
        let min_pending_offset = pending
            .iter()
            .map(|&(_, offset)| offset)
            .min()
            .unwrap_or(scanned_offset);
        let overdue_offsets = pending
            .range(..=(delivered_until_ms, u64::MAX))
            .map(|&(_, offset)| offset)
            .collect();
        Some(TimerProgress {
            scanned_offset,
            delivered_until_ms,
            min_pending_offset,
            overdue_offsets,
        })
    }

    async fn persist_loop(self: Rc<Self>, interval: Duration) {
        let mut persisted: Option<TimerProgress> = None;
        while sleep_unless_stopped(interval, &self.stop, &self.stopping).await {
            let Some(snapshot) = self.snapshot() else {
                continue;
            };
            if persisted.as_ref() == Some(&snapshot) {
                continue;
            }
            let bytes = encode_progress(&snapshot);
            if persist_when_durable(
                &self.store,
                &self.stop,
                &self.stopping,
                self.path.clone(),
                bytes,
            )
            .await
            {
                persisted = Some(snapshot);
            }
        }
    }

    /// Log → index: reads the timer queue in order and indexes every record not yet delivered.
    async fn read_loop(self: Rc<Self>) {
        loop {
            if self.stopping.get() {
                return;
            }
            if self.pending.borrow().len() >= self.max_pending {
                let room = self.delivered.notified();
                let stopped = self.stop.notified();
                future::or(room, stopped).await;
                continue;
            }
            let arrival = self.store.arrival();
            let offset = self.scanned_offset.get();
            let read = self
                .store
                .get_messages(
                    TIMER_TOPIC,
                    self.queue_id,
                    offset,
                    READ_BATCH_MESSAGES,
                    READ_BATCH_BYTES,
                    &TagFilter::All,
                )
                .await;
            let got = match read {
                Ok(got) => got,
                Err(e) => {
                    warn!(shard = self.shard, error = %e, "reading the timer queue failed; retrying");
                    sleep_unless_stopped(RETRY_PAUSE, &self.stop, &self.stopping).await;
                    continue;
                }
            };
            match got.status {
                GetStatus::Found => self.index(&got.records),
                GetStatus::NoNewMessage | GetStatus::NoMatchedQueue => {
                    self.end_recovery_at(offset);
                    let stopped = self.stop.notified();
                    future::or(arrival, stopped).await;
                }
                GetStatus::NoMatchedMessage => self.scanned_offset.set(got.next_offset),
                GetStatus::OffsetTooSmall | GetStatus::OffsetOverflow => {
                    warn!(
                        shard = self.shard,
                        offset,
                        min = got.min_offset,
                        max = got.max_offset,
                        "timer progress was outside the timer queue; moving to its bounds"
                    );
                    let next = if got.status == GetStatus::OffsetTooSmall {
                        got.min_offset
                    } else {
                        got.max_offset
                    };
                    self.scanned_offset.set(next);
                    self.end_recovery_at(next);
                }
            }
        }
    }

    fn index(&self, records: &[Bytes]) {
        let mut earliest_new = i64::MAX;
        for record in records {
            if self.pending.borrow().len() >= self.max_pending {
                break;
            }
            let Ok(view) = RecordView::parse_unchecked(record) else {
                warn!(
                    shard = self.shard,
                    "unreadable timer record; stopping the read here"
                );
                break;
            };
            let offset = view.queue_offset();
            // A record without a due time is delivered at once.
            let due_ms = view
                .property(PROPERTY_TIMER_DELIVER_MS)
                .and_then(|text| text.parse().ok())
                .unwrap_or(0);
            let is_done = self
                .recovery
                .borrow()
                .as_ref()
                .is_some_and(|recovery| recovery.is_delivered(offset, due_ms));
            if !is_done {
                self.pending.borrow_mut().insert((due_ms, offset));
                earliest_new = earliest_new.min(due_ms);
            }
            self.scanned_offset.set(offset + 1);
            self.end_recovery_at(offset + 1);
        }
        if earliest_new != i64::MAX {
            self.indexed.notify_all();
        }
    }

    fn end_recovery_at(&self, scanned: u64) {
        let mut recovery = self.recovery.borrow_mut();
        if recovery
            .as_ref()
            .is_some_and(|r| scanned >= r.scanned_offset)
        {
            *recovery = None;
            info!(
                shard = self.shard,
                pending = self.pending.borrow().len(),
                "timer index rebuilt"
            );
        }
    }

    /// Index → real topic: delivers the earliest record once due; parks until then or until an
    /// earlier record is indexed.
    async fn deliver_loop(self: Rc<Self>) {
        loop {
            if self.stopping.get() {
                return;
            }
            let indexed = self.indexed.notified();
            let head = self.pending.borrow().first().copied();
            let Some((due_ms, offset)) = head else {
                let stopped = self.stop.notified();
                future::or(indexed, stopped).await;
                continue;
            };
            let wait_ms = due_ms - now_ms();
            if wait_ms > 0 {
                let stopped = self.stop.notified();
                future::or(
                    async {
                        glommio::timer::sleep(Duration::from_millis(wait_ms as u64)).await;
                    },
                    future::or(indexed, stopped),
                )
                .await;
                continue;
            }
            if self.deliver_one(offset).await {
                self.pending.borrow_mut().remove(&(due_ms, offset));
                if due_ms > self.delivered_until_ms.get() {
                    self.delivered_until_ms.set(due_ms);
                }
                self.delivered.notify_all();
            } else {
                sleep_unless_stopped(RETRY_PAUSE, &self.stop, &self.stopping).await;
            }
        }
    }

    /// True when the record at `offset` was delivered or can never be (then it is dropped
    /// from the index with a warning).
    async fn deliver_one(&self, offset: u64) -> bool {
        let read = self
            .store
            .get_messages(TIMER_TOPIC, self.queue_id, offset, 1, 1, &TagFilter::All)
            .await;
        let record = match read {
            Ok(got) if got.status == GetStatus::Found => got.records.into_iter().next(),
            Ok(got) if got.status == GetStatus::OffsetTooSmall => {
                warn!(
                    shard = self.shard,
                    offset, "timer record was removed by retention before it was due; dropped"
                );
                return true;
            }
            Ok(_) => None,
            Err(e) => {
                warn!(shard = self.shard, offset, error = %e, "reading a due timer record failed; retrying");
                return false;
            }
        };
        let Some(record) = record else {
            warn!(
                shard = self.shard,
                offset, "due timer record is not readable; retrying"
            );
            return false;
        };
        let Ok(view) = RecordView::parse_unchecked(&record) else {
            warn!(
                shard = self.shard,
                offset, "due timer record is unreadable; dropped"
            );
            return true;
        };
        debug_assert_eq!(view.queue_offset(), offset);
        deliver(&self.store, &self.on_arrival, &view, self.shard).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recovery_skips_only_what_was_delivered() {
        let recovery = Recovery {
            scanned_offset: 10,
            delivered_until_ms: 1_000,
            overdue: [4].into_iter().collect(),
        };
        assert!(recovery.is_delivered(3, 900));
        assert!(recovery.is_delivered(3, 1_000));
        assert!(!recovery.is_delivered(3, 1_001), "due later: still pending");
        assert!(
            !recovery.is_delivered(4, 900),
            "listed overdue: still pending"
        );
        assert!(
            !recovery.is_delivered(10, 900),
            "not scanned before: pending"
        );
    }
}
