//! Housekeeping of a shard: the periodic checkpoint (derived files flushed, then how far they
//! and the CommitLog are durable), disk usage (and the refusal of appends on a full disk), and
//! retention (expired or pressed CommitLog segments, then the derived entries into them).

use std::io;
use std::path::Path;
use std::rc::Rc;
use std::time::Duration;

use futures_lite::future;
use tracing::{error, info, warn};

use crate::atomic_file::write_atomically_async;
use crate::checkpoint::{Checkpoint, CHECKPOINT_FILE};
use crate::consume_queue::ConsumeQueue;

use super::state::Inner;
use super::types::{io_error, StoreError};
use super::{now_ms, MessageStore};

/// Checkpoints every `checkpoint_interval_ms`; checks disk usage and runs retention every
/// `retention_interval_ms`.
pub(super) async fn housekeeping_loop(inner: Rc<Inner>) {
    let interval = Duration::from_millis(inner.config.checkpoint_interval_ms.max(1));
    let mut since_retention = Duration::ZERO;
    while !inner.is_closed.get() {
        future::or(inner.closing.notified(), glommio::timer::sleep(interval)).await;
        if inner.is_closed.get() {
            break;
        }
        if let Err(e) = inner.checkpoint().await {
            error!(error = %e, "checkpoint failed");
        }
        inner.refresh_disk_usage();
        since_retention += interval;
        if since_retention.as_millis() as u64 >= inner.config.retention_interval_ms {
            since_retention = Duration::ZERO;
            if let Err(e) = inner.run_retention().await {
                error!(error = %e, "retention failed");
            }
        }
    }
}

/// The file system statistics of the file system holding `path`.
fn statvfs(path: &Path) -> io::Result<libc::statvfs> {
    use std::ffi::CString;
    use std::os::unix::ffi::OsStrExt;
    let c_path = CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path contains a NUL byte"))?;
    let mut stat: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c_path` is a valid NUL-terminated string and `stat` a valid out-pointer.
    let rc = unsafe { libc::statvfs(c_path.as_ptr(), &mut stat) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(stat)
}

/// (total, available to unprivileged writers) bytes of the file system holding `path`.
pub fn disk_space(path: &Path) -> io::Result<(u64, u64)> {
    let stat = statvfs(path)?;
    let fragment = stat.f_frsize as u64;
    Ok((
        stat.f_blocks as u64 * fragment,
        stat.f_bavail as u64 * fragment,
    ))
}

/// Fraction of the file system holding `path` that is in use (as `df` computes it).
pub fn disk_used_ratio(path: &Path) -> io::Result<f64> {
    let stat = statvfs(path)?;
    let available = stat.f_bavail as f64;
    let used = stat.f_blocks.saturating_sub(stat.f_bfree) as f64;
    if used + available == 0.0 {
        return Ok(0.0);
    }
    Ok(used / (used + available))
}

impl MessageStore {
    /// Runs one retention pass now (it also runs every `retention_interval_ms`).
    pub async fn run_retention(&self) -> Result<u64, StoreError> {
        self.inner.run_retention().await
    }

    /// Re-reads disk usage now (it is also checked every `checkpoint_interval_ms`).
    pub fn refresh_disk_usage(&self) -> f64 {
        self.inner.refresh_disk_usage()
    }
}

impl Inner {
    async fn flush_derived(&self) -> Result<(), StoreError> {
        let queues: Vec<Rc<ConsumeQueue>> = self
            .queues
            .borrow()
            .values()
            .flat_map(|q| q.values().cloned())
            .collect();
        for queue in queues {
            queue
                .flush()
                .await
                .map_err(io_error(queue.dir().display().to_string()))?;
        }
        self.index.flush().await.map_err(io_error("index"))
    }

    /// Flushes derived files, then records how far they and the CommitLog are durable.
    pub(super) async fn checkpoint(&self) -> Result<(), StoreError> {
        let dispatched = self.dispatched_offset.get();
        self.flush_derived().await?;
        let synced = self.commit_log.synced_offset();
        let checkpoint = Checkpoint {
            commitlog_durable_offset: synced,
            derived_durable_offset: dispatched.min(synced),
            written_at_ms: now_ms(),
        };
        let path = self.config.shard_dir.join(CHECKPOINT_FILE);
        write_atomically_async(path, checkpoint.encode().to_vec())
            .await
            .map_err(io_error("checkpoint"))
    }

    pub(super) fn refresh_disk_usage(&self) -> f64 {
        match disk_used_ratio(&self.config.shard_dir) {
            Ok(ratio) => {
                let was_full = self.disk_used_ratio.get() >= self.config.disk_refuse_ratio;
                let is_full = ratio >= self.config.disk_refuse_ratio;
                if is_full && !was_full {
                    warn!(
                        used_percent = ratio * 100.0,
                        "disk nearly full: refusing appends"
                    );
                } else if was_full && !is_full {
                    info!(
                        used_percent = ratio * 100.0,
                        "disk has room again: accepting appends"
                    );
                }
                self.disk_used_ratio.set(ratio);
                ratio
            }
            Err(e) => {
                warn!(error = %e, "cannot read disk usage");
                self.disk_used_ratio.get()
            }
        }
    }

    /// Deletes expired segments (and, above `disk_max_used_ratio`, the oldest ones early), then
    /// the derived entries that pointed into them. Returns segments deleted.
    async fn run_retention(&self) -> Result<u64, StoreError> {
        let mut deleted = 0;
        let reserved = Duration::from_secs(self.config.file_reserved_hours * 3600);
        while let Some((_, _, path)) = self.commit_log.sealed_segments().into_iter().next() {
            let is_expired = std::fs::metadata(&path)
                .and_then(|m| m.modified())
                .map(|modified| modified.elapsed().unwrap_or_default() >= reserved)
                .unwrap_or(false);
            let is_pressed = self.refresh_disk_usage() >= self.config.disk_max_used_ratio;
            if !is_expired && !is_pressed {
                break;
            }
            match self
                .commit_log
                .delete_oldest_segment()
                .await
                .map_err(io_error("CommitLog retention"))?
            {
                Some(_) => {
                    deleted += 1;
                    info!(segment = %path.display(), is_expired, is_pressed, "retention deleted a CommitLog segment");
                }
                None => break,
            }
        }
        if deleted > 0 {
            self.read_ahead
                .forget_outside(self.commit_log.min_offset(), self.commit_log.write_offset());
            self.apply_retention_to_derived().await?;
            self.refresh_disk_usage();
        }
        Ok(deleted)
    }

    pub(super) async fn apply_retention_to_derived(&self) -> Result<(), StoreError> {
        let commitlog_min = self.commit_log.min_offset();
        if commitlog_min == 0 {
            return Ok(());
        }
        let queues: Vec<Rc<ConsumeQueue>> = self
            .queues
            .borrow()
            .values()
            .flat_map(|q| q.values().cloned())
            .collect();
        for queue in queues {
            queue
                .delete_below(commitlog_min)
                .await
                .map_err(io_error(queue.dir().display().to_string()))?;
        }
        self.index
            .delete_below(commitlog_min)
            .await
            .map_err(io_error("index"))?;
        Ok(())
    }
}
