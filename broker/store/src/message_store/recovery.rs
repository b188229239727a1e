//! Opening a shard's files: settling the segment size, carrying out a cut that replication
//! requested, opening the ConsumeQueues and the index, and scanning the CommitLog from the
//! checkpoint to rebuild every derived entry it proves (or everything, when the derived files
//! cannot be trusted).

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::io;
use std::path::Path;
use std::rc::Rc;

use tracing::{info, warn};

use crate::checkpoint::CHECKPOINT_FILE;
use crate::commitlog::{CommitLog, SegmentWrites};
use crate::consume_queue::ConsumeQueue;
use crate::format::{StoreFormat, FORMAT_VERSION};
use crate::index::{IndexEntry, MessageIndex};
use crate::journal::Journal;
use crate::notify::LocalNotify;
use crate::read_ahead::ReadAhead;
use crate::record::{RecordView, BLANK_MIN_BYTES};
use crate::scan::{scan_window, ScanStop};

use super::state::{
    dispatch_info, entry_of, get_or_create_queue, DispatchInfo, Inner, PendingDispatch,
};
use super::types::{io_error, FlushMode, RecoveryReport, StoreConfig, StoreError};

/// The segment size recorded at creation wins over the configured one.
pub(super) fn settle_segment_bytes(dir: &Path, configured: u64) -> Result<u64, StoreError> {
    match StoreFormat::load(dir).map_err(io_error("format file"))? {
        Some(format) => {
            if format.segment_bytes != configured {
                warn!(
                    recorded = format.segment_bytes,
                    configured, "segment size differs from the one the store was created with; keeping the recorded one"
                );
            }
            Ok(format.segment_bytes)
        }
        None => {
            let format = StoreFormat {
                version: FORMAT_VERSION,
                segment_bytes: configured,
            };
            format.save(dir).map_err(io_error("format file"))?;
            Ok(configured)
        }
    }
}

async fn open_consume_queues(
    root: &Path,
    entries_per_file: u64,
    keep_below: u64,
    max_entry_size: u64,
    report: &mut RecoveryReport,
) -> Result<HashMap<String, HashMap<u32, Rc<ConsumeQueue>>>, StoreError> {
    let mut queues: HashMap<String, HashMap<u32, Rc<ConsumeQueue>>> = HashMap::new();
    if !root.exists() {
        return Ok(queues);
    }
    let context = || root.display().to_string();
    for topic_entry in std::fs::read_dir(root).map_err(io_error(context()))? {
        let topic_entry = topic_entry.map_err(io_error(context()))?;
        let Some(topic) = topic_entry.file_name().to_str().map(str::to_owned) else {
            continue;
        };
        if !topic_entry.path().is_dir() {
            continue;
        }
        for queue_entry in std::fs::read_dir(topic_entry.path()).map_err(io_error(context()))? {
            let queue_entry = queue_entry.map_err(io_error(context()))?;
            let Some(queue_id) = queue_entry
                .file_name()
                .to_str()
                .and_then(|n| n.parse::<u32>().ok())
            else {
                continue;
            };
            let (queue, repair) = ConsumeQueue::open(
                queue_entry.path(),
                entries_per_file,
                keep_below,
                max_entry_size,
            )
            .await
            .map_err(io_error(queue_entry.path().display().to_string()))?;
            report.consume_queue_entries_dropped += repair.entries_dropped;
            if let Some(why) = repair.damage {
                warn!(%topic, queue_id, %why, "ConsumeQueue is damaged");
                report.consume_queue_damage = Some(why);
            }
            queues
                .entry(topic.clone())
                .or_default()
                .insert(queue_id, Rc::new(queue));
        }
    }
    Ok(queues)
}

/// The file that asks the next open of a shard to cut its CommitLog (text: the offset).
pub const TRUNCATE_REQUEST_FILE: &str = "truncate-request";

/// Asks the next [`MessageStore::open`] of `shard_dir` to cut the CommitLog at `offset` (a
/// record boundary) and rebuild the derived files: a slave holding bytes its master does not
/// (docs/replication.md, "Divergence"). Durable when it returns.
pub fn request_truncation(shard_dir: &Path, offset: u64) -> io::Result<()> {
    crate::atomic_file::write_atomically(
        &shard_dir.join(TRUNCATE_REQUEST_FILE),
        format!("{offset}\n").as_bytes(),
    )
}

/// The file that asks the next open of a shard to discard its whole CommitLog and begin it
/// again at an offset (text: the offset, a segment base).
pub const START_REQUEST_FILE: &str = "start-request";

/// Asks the next [`MessageStore::open`] of `shard_dir` to discard every CommitLog segment and
/// derived file and begin the log, empty, at `offset` (a multiple of the segment size): a
/// slave whose log ends before its master's oldest retained byte, which it can no longer copy
/// from where it is (docs/replication.md, "A slave after retention"). Durable when it returns.
pub fn request_start_at(shard_dir: &Path, offset: u64) -> io::Result<()> {
    crate::atomic_file::write_atomically(
        &shard_dir.join(START_REQUEST_FILE),
        format!("{offset}\n").as_bytes(),
    )
}

/// The offset a request file holds (`None`: no request).
fn read_requested_offset(request: &Path) -> io::Result<Option<u64>> {
    let text = match std::fs::read_to_string(request) {
        Ok(text) => text,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    text.trim().parse().map(Some).map_err(|e| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{}: not an offset: {e}", request.display()),
        )
    })
}

/// Carries out a [`request_start_at`] (every step may be repeated after a crash; the request is
/// removed last): every segment is deleted and an empty one created at the offset (whose name
/// is where the log now begins), the journal, ConsumeQueues, index, checkpoint and epoch log are
/// removed (the log's terms are learned again from the master as its bytes arrive).
pub(super) fn apply_requested_start(
    shard_dir: &Path,
    segment_bytes: u64,
) -> io::Result<Option<u64>> {
    let request = shard_dir.join(START_REQUEST_FILE);
    let Some(offset) = read_requested_offset(&request)? else {
        return Ok(None);
    };
    if !offset.is_multiple_of(segment_bytes) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "{}: {offset} is not a multiple of this store's segment size {segment_bytes} (the master's segment size differs)",
                request.display()
            ),
        ));
    }
    warn!(
        offset,
        "discarding this CommitLog and beginning it again where the master's oldest byte is"
    );
    crate::journal::clear_journal(shard_dir)?;
    let commitlog_dir = shard_dir.join("commitlog");
    std::fs::create_dir_all(&commitlog_dir)?;
    let start_name = crate::commitlog::segment_file_name(offset);
    for (_, path) in crate::commitlog::list_segments(&commitlog_dir)? {
        if path.file_name().and_then(|n| n.to_str()) != Some(start_name.as_str()) {
            std::fs::remove_file(&path)?;
        }
    }
    let start = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(commitlog_dir.join(&start_name))?;
    start.sync_all()?;
    std::fs::File::open(&commitlog_dir)?.sync_all()?;
    for sub in ["consumequeue", "index"] {
        let path = shard_dir.join(sub);
        if path.exists() {
            std::fs::remove_dir_all(&path)?;
        }
    }
    for file in [CHECKPOINT_FILE, crate::epochs::EPOCHS_FILE] {
        match std::fs::remove_file(shard_dir.join(file)) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
    }
    std::fs::remove_file(&request)?;
    std::fs::File::open(shard_dir)?.sync_all()?;
    Ok(Some(offset))
}

/// Carries out a [`request_truncation`] (every step may be repeated after a crash; the request
/// is removed last): segments from `offset` on are deleted, the one holding it is cut there,
/// the ConsumeQueues, index and checkpoint are removed (rebuilt by the scan), and the epoch log
/// forgets the terms that start at or past it.
pub(super) fn apply_requested_truncation(
    shard_dir: &Path,
    segment_bytes: u64,
) -> io::Result<Option<u64>> {
    let request = shard_dir.join(TRUNCATE_REQUEST_FILE);
    let Some(offset) = read_requested_offset(&request)? else {
        return Ok(None);
    };
    warn!(
        offset,
        "cutting the CommitLog where replication asked (the master never had the bytes after it)"
    );
    // Nothing the journal holds may come back past the cut.
    crate::journal::clear_journal(shard_dir)?;
    let commitlog_dir = shard_dir.join("commitlog");
    if commitlog_dir.exists() {
        for (base, path) in crate::commitlog::list_segments(&commitlog_dir)? {
            if base >= offset {
                std::fs::remove_file(&path)?;
            } else if offset < base + segment_bytes {
                let file = std::fs::OpenOptions::new().write(true).open(&path)?;
                if file.metadata()?.len() > offset - base {
                    file.set_len(offset - base)?;
                }
                file.sync_all()?;
            }
        }
        std::fs::File::open(&commitlog_dir)?.sync_all()?;
    }
    for sub in ["consumequeue", "index"] {
        let path = shard_dir.join(sub);
        if path.exists() {
            std::fs::remove_dir_all(&path)?;
        }
    }
    match std::fs::remove_file(shard_dir.join(CHECKPOINT_FILE)) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    let mut epochs = crate::epochs::EpochLog::load(shard_dir)?;
    epochs.truncate(offset);
    epochs.save(shard_dir)?;
    std::fs::remove_file(&request)?;
    std::fs::File::open(shard_dir)?.sync_all()?;
    Ok(Some(offset))
}

impl Inner {
    /// Opens the CommitLog, ConsumeQueues and index; `None` when the derived files cannot be
    /// brought in line with the CommitLog and must be rebuilt from scratch.
    pub(super) async fn recover(
        config: &StoreConfig,
        keep_below: u64,
        journal: Option<&Journal>,
        report: &mut RecoveryReport,
    ) -> Result<Option<Inner>, StoreError> {
        let dir = &config.shard_dir;
        let queues = open_consume_queues(
            &dir.join("consumequeue"),
            config.consume_queue_entries_per_file,
            keep_below,
            config.segment_bytes - BLANK_MIN_BYTES as u64,
            report,
        )
        .await?;
        if report.consume_queue_damage.is_some() && keep_below > 0 {
            return Ok(None);
        }
        let index = MessageIndex::open(
            dir.join("index"),
            config.index_max_entries_per_file,
            keep_below,
        )
        .await
        .map_err(io_error("index"))?;
        if let Some(why) = index.damage() {
            warn!(%why, "index file is damaged");
            if keep_below > 0 {
                report.consume_queue_damage = Some(why);
                return Ok(None);
            }
        }
        let queue_map: RefCell<HashMap<String, HashMap<u32, Rc<ConsumeQueue>>>> =
            RefCell::new(queues);
        let mut pending: Vec<DispatchInfo> = Vec::new();
        let mut pending_hashes: Vec<u64> = Vec::new();
        let mut has_gap = false;
        let holds = config.hold_unconfirmed_tail;
        let (commit_log, scan) = {
            let mut on_record = |physical_offset: u64, view: &RecordView<'_>| {
                if physical_offset < keep_below || has_gap {
                    return;
                }
                let queue = get_or_create_queue(&queue_map, config, view.topic(), view.queue_id());
                let info = dispatch_info(queue, physical_offset, view, &mut pending_hashes);
                // Only a full scan may find a queue starting past 0 (retention took its start);
                // after a checkpoint that means its ConsumeQueue files were lost: rebuild.
                let may_start_past_zero = keep_below == 0;
                let placed = if holds {
                    info.queue.hold(info.queue_offset, may_start_past_zero)
                } else {
                    info.queue
                        .put(info.queue_offset, entry_of(&info), may_start_past_zero)
                };
                if placed.is_err() {
                    has_gap = true;
                }
                pending.push(info);
            };
            // Validate whole segments from the one holding the derived offset: a bad byte
            // below the checkpoint (lost or damaged on disk) is then found, not trusted.
            let scan_from = keep_below - keep_below % config.segment_bytes;
            let (commit_log, mut scan) = CommitLog::open(
                dir.join("commitlog"),
                config.segment_bytes,
                config.hot_tail_bytes,
                scan_from,
                match config.flush_mode {
                    FlushMode::Sync => SegmentWrites::Durable,
                    FlushMode::Async => SegmentWrites::Plain,
                },
                &mut on_record,
            )
            .await
            .map_err(io_error("commitlog"))?;
            if let Some(journal) = journal {
                let end = scan.end_offset;
                let replayed = replay_journal(journal, &commit_log, end, &mut on_record);
                scan.end_offset = end + replayed;
                report.replayed_from_journal = replayed;
            }
            (commit_log, scan)
        };
        // Kept even when this pass gives up: the rebuild's scan then finds the log already
        // cut and must not lose the news.
        report.commitlog = scan.clone();
        if has_gap {
            return Ok(None);
        }
        // Entries dropped at open must have come back from the CommitLog scan; a queue that
        // ends short of what its files held lost entries to damage, not to a crash.
        for (topic, by_queue) in queue_map.borrow().iter() {
            for (queue_id, queue) in by_queue {
                // (Records held back count: `next_offset` is `max_offset` without a hold.)
                if queue.next_offset() < queue.on_disk_end() {
                    let why = format!(
                        "{topic}/{queue_id} held entries up to {} but only {} are backed by the CommitLog after the checkpoint",
                        queue.on_disk_end(),
                        queue.next_offset()
                    );
                    warn!(%why, "ConsumeQueue is damaged");
                    report.consume_queue_damage = Some(why);
                    return Ok(None);
                }
            }
        }
        let last_scanned_ts = pending.last().map(|info| info.store_timestamp_ms);
        let held = if holds && !pending.is_empty() {
            // Every record past the checkpoint waits for the owner to confirm it again; the
            // index gets their entries as they are dispatched, in order.
            report.records_held_unconfirmed += pending.len() as u64;
            PendingDispatch {
                infos: std::mem::take(&mut pending).into(),
                index_hashes: pending_hashes.into_iter().collect(),
            }
        } else {
            let mut hashes = pending_hashes.into_iter();
            for info in &pending {
                for hash in hashes.by_ref().take(usize::from(info.index_hash_count)) {
                    index.put(IndexEntry {
                        hash,
                        commitlog_offset: info.physical_offset,
                        store_timestamp_ms: info.store_timestamp_ms,
                    });
                }
            }
            report.records_redispatched += pending.len() as u64;
            PendingDispatch::default()
        };
        // What the held records wait behind: none is dispatched until the limit passes it.
        let (dispatched_to, dispatch_limit) = match held.infos.front() {
            Some(first) => (first.physical_offset, first.physical_offset),
            None => (scan.end_offset, u64::MAX),
        };
        let end = scan.end_offset;
        // Entries that point past the recovered end can only exist if the CommitLog lost data
        // the checkpoint called durable; then the derived files cannot be trusted.
        if keep_below > end {
            warn!(
                keep_below,
                end, "CommitLog ends before the checkpoint's derived offset"
            );
            return Ok(None);
        }
        // Store timestamps never go backwards, also across a restart (offset-by-time relies on it).
        let last_ts = last_scanned_ts.unwrap_or(0).max(index.last_timestamp_ms());
        report.commitlog = scan;
        Ok(Some(Inner {
            config: config.clone(),
            commit_log,
            queues: queue_map,
            index,
            read_ahead: ReadAhead::new(config.readahead_bytes),
            dispatched_offset: Cell::new(dispatched_to),
            records_end: Cell::new(end),
            pending_dispatch: RefCell::new(held),
            last_store_timestamp_ms: Cell::new(last_ts),
            writer_wake: LocalNotify::default(),
            flushed: LocalNotify::default(),
            pace_next_ticket: Cell::new(0),
            pace_serving: Cell::new(0),
            pace_abandoned: RefCell::new(Default::default()),
            pace_turn: LocalNotify::default(),
            arrivals: LocalNotify::default(),
            closing: LocalNotify::default(),
            flush_observer: RefCell::new(None),
            flush_error: RefCell::new(None),
            disk_used_ratio: Cell::new(0.0),
            is_closed: Cell::new(false),
            journal: None,
            journaled_end: Cell::new(0),
            dispatch_limit: Cell::new(dispatch_limit),
            published_visible: Cell::new(0),
            appends_held: RefCell::new(None),
        }))
    }
}

/// Appends to `commit_log`, whose recovered data ends at `end`, what `journal` holds past it:
/// bytes acknowledged before a crash whose write to the segment had not completed. Only the
/// whole valid records and fillers at their start are taken, each checked as the recovery scan
/// checks the log (`on_record` is told each record, as the scan tells it); a record the journal
/// holds only in part was never acknowledged. Returns how many bytes were appended.
fn replay_journal(
    journal: &Journal,
    commit_log: &CommitLog,
    end: u64,
    on_record: &mut dyn FnMut(u64, &RecordView<'_>),
) -> u64 {
    let Some(bytes) = journal.tail_from(end) else {
        return 0;
    };
    let journal_end = end + bytes.len() as u64;
    let segment_bytes = commit_log.segment_bytes();
    let mut at = end;
    while at < journal_end {
        let segment_base = at - at % segment_bytes;
        let window_end = journal_end.min(segment_base + segment_bytes);
        let window = &bytes[(at - end) as usize..(window_end - end) as usize];
        let stop = scan_window(
            window,
            segment_base,
            at - segment_base,
            segment_bytes,
            false,
            &mut |position, view| on_record(segment_base + position, view),
        );
        match stop {
            ScanStop::SegmentEnd { .. } => at = segment_base + segment_bytes,
            ScanStop::NeedMore { position }
            | ScanStop::DataEnd { position }
            | ScanStop::Invalid { position, .. } => {
                at = segment_base + position;
                break;
            }
        }
    }
    let valid = at.min(journal_end) - end;
    if valid > 0 {
        commit_log.append_raw(&bytes[..valid as usize]);
        info!(
            from = end,
            bytes = valid,
            "appended again from the journal what was acknowledged but not yet written"
        );
    }
    if end + valid < journal_end {
        warn!(
            at = end + valid,
            ignored_bytes = journal_end - end - valid,
            "the journal holds no whole record from here; ignored (never acknowledged)"
        );
    }
    valid
}
