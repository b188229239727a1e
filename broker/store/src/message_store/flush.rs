//! The flush loop: write-behind of the write ring's chunks with several O_DIRECT writes in
//! flight, group commit (of `fdatasync`s under async flush; under sync flush the segments are
//! written with `O_DSYNC`, and the appends that arrive while a write is in flight go out
//! together in the next one), and publishing what became complete under the flush
//! mode. Also the waits on durability and visibility that replication uses.

use std::cell::Cell;
use std::rc::Rc;
use std::time::Duration;

use futures_lite::future;
use tracing::error;

use super::state::Inner;
use super::types::FlushMode;
use super::MessageStore;

/// The flush loop (write-behind and group commit). It starts every
/// O_DIRECT write the CommitLog plans as soon as it may (a full chunk at once, several in
/// flight; a partly filled chunk when the disk would otherwise idle), each in a task of its own;
/// under sync flush the writes themselves are durable (`O_DSYNC` segments; what arrives while
/// one is in flight goes out with the next: group commit), under async flush it `fdatasync`s
/// at least every `flush_interval_ms`; and makes completed records visible. On close it finishes everything
/// appended, then stops.
pub(super) async fn flush_loop(inner: Rc<Inner>) {
    let interval = Duration::from_millis(inner.config.flush_interval_ms.max(1));
    let retry_delay = Duration::from_millis(100);
    let is_syncing = Rc::new(Cell::new(false));
    let mut last_sync = std::time::Instant::now();
    loop {
        let woken = inner.writer_wake.notified();
        let log = &inner.commit_log;
        if let Some(error) = log.take_write_error() {
            inner.report_flush_failure(error.to_string());
            inner.flushed.notify_all();
            if inner.is_closed.get() {
                error!("store closing with unwritten CommitLog bytes after a write failure");
                break;
            }
            glommio::timer::sleep(retry_delay).await;
            continue;
        }
        if inner.is_closed.get() {
            log.drain();
        }
        while let Some(job) = log.next_write_job() {
            let from = job.from();
            let inner = inner.clone();
            let is_syncing = is_syncing.clone();
            glommio::spawn_local(async move {
                let started = std::time::Instant::now();
                let awake = inner.polls_durable_writes();
                let outcome = inner.commit_log.write(job).await;
                drop(awake);
                if inner.commit_log.finish_write(from, outcome) {
                    inner.observe_flush(started.elapsed());
                    inner.report_flush_recovered();
                    let log = &inner.commit_log;
                    // Sync flush: segments are written with O_DSYNC, so a completed write is
                    // durable and acknowledged now; an fdatasync is needed only for bytes a
                    // plain write left (it starts here, not a loop turn later).
                    let is_last = !log.has_writes_in_flight();
                    match inner.config.flush_mode {
                        FlushMode::Sync if log.written_offset() > log.synced_offset() => {
                            if is_last {
                                start_sync(&inner, &is_syncing);
                            }
                        }
                        // Durable, or (async) what was written is complete: acknowledge it.
                        FlushMode::Sync | FlushMode::Async => inner.publish_progress_or_log(),
                    }
                }
                inner.writer_wake.notify_all();
            })
            .detach();
        }
        let has_unsynced = log.written_offset() > log.synced_offset();
        let is_sync_due = match inner.config.flush_mode {
            FlushMode::Sync => true,
            FlushMode::Async => {
                last_sync.elapsed() >= interval
                    || inner.is_closed.get() && log.written_offset() == log.write_offset()
            }
        };
        if has_unsynced && is_sync_due && !is_syncing.get() {
            last_sync = std::time::Instant::now();
            start_sync(&inner, &is_syncing);
        }
        inner.publish_progress_or_log();
        let is_done = log.synced_offset() == log.write_offset()
            && !log.has_writes_in_flight()
            && !is_syncing.get();
        if inner.is_closed.get() && is_done {
            break;
        }
        if inner.is_closed.get() && inner.flush_error.borrow().is_some() && !is_syncing.get() {
            error!("store closing while CommitLog writes fail; unsynced bytes stay as they are");
            break;
        }
        // Async: wake for the next periodic sync, unless one is running (its end wakes us; a
        // timed wait then would be zero long and spin).
        let is_sync_pending = inner.config.flush_mode == FlushMode::Async
            && log.written_offset() > log.synced_offset()
            && !is_syncing.get();
        let sync_wait = is_sync_pending.then(|| {
            interval
                .saturating_sub(last_sync.elapsed())
                .max(Duration::from_millis(1))
        });
        // A partly filled chunk let fill (journal on) is written when its linger ends; a zero
        // wait means a write in flight holds it, and that write's end wakes us.
        let linger_wait = log.partial_chunk_wait().filter(|wait| !wait.is_zero());
        match sync_wait.into_iter().chain(linger_wait).min() {
            Some(wait) => future::or(woken, glommio::timer::sleep(wait)).await,
            None => woken.await,
        }
    }
}

/// Starts an `fdatasync` of everything written, unless one is running (the next one then
/// covers what was written meanwhile: group commit).
fn start_sync(inner: &Rc<Inner>, is_syncing: &Rc<Cell<bool>>) {
    let log = &inner.commit_log;
    if is_syncing.get() || log.written_offset() <= log.synced_offset() {
        return;
    }
    is_syncing.set(true);
    let inner = inner.clone();
    let syncing = is_syncing.clone();
    glommio::spawn_local(async move {
        let started = std::time::Instant::now();
        let awake = inner.polls_durable_writes();
        let synced = inner.commit_log.sync().await;
        drop(awake);
        match synced {
            Ok(_) => inner.observe_flush(started.elapsed()),
            Err(e) => {
                inner.report_flush_failure(format!("fdatasync: {e}"));
                glommio::timer::sleep(Duration::from_millis(100)).await;
            }
        }
        syncing.set(false);
        // Waiting appends are woken here, not a loop turn later.
        inner.publish_progress_or_log();
        inner.writer_wake.notify_all();
    })
    .detach();
}

impl MessageStore {
    /// Completes once every CommitLog byte appended before this call is durable (flushed and
    /// synced), as the flush loop gets to it; never if the store closes first.
    pub async fn wait_durable_to_current_end(&self) {
        let inner = &self.inner;
        let end = inner.commit_log.write_offset();
        while inner.commit_log.synced_offset() < end && !inner.is_closed.get() {
            inner.flushed.notified().await;
        }
    }

    /// Completes once every CommitLog byte appended before this call is complete under the
    /// flush mode (what a replica acknowledges); at once if the store closes.
    pub async fn wait_visible_to_current_end(&self) {
        let inner = &self.inner;
        let end = inner.commit_log.write_offset();
        while inner.visible_offset() < end && !inner.is_closed.get() {
            inner.flushed.notified().await;
        }
    }
}

impl Inner {
    /// Under sync flush (when configured), keeps the storage core polling while a durable
    /// write or `fdatasync` an acknowledgement waits on is in flight: its completion is then
    /// seen at once instead of after the core's wake-up from sleep. See
    /// `StoreConfig::poll_durable_writes`.
    fn polls_durable_writes(&self) -> Option<glommio::StayAwake> {
        (self.config.flush_mode == FlushMode::Sync && self.config.poll_durable_writes)
            .then(|| glommio::executor().stay_awake())
    }
}
