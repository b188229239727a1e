//! The ConsumeQueue of one (topic, queue): a dense array of 20-byte entries, entry N locating
//! the queue's N-th message in the CommitLog.
//!
//! Owns the queue's files (`consumequeue/<topic>/<queue>/<20-digit start index>`, 300,000
//! entries each by default), the in-memory tail of recent entries, the next queue offset to
//! assign, and the minimum offset still served. It is derived data: everything in it can be
//! rebuilt from the CommitLog, and recovery does so for entries after the checkpoint. It never
//! reads the CommitLog itself; the message store joins the two.
//!
//! Entry layout (big-endian, see `docs/storage-format.md`): commitlog offset u64, size u32,
//! tags hash u64. A size of 0 marks the unwritten zero padding after the last entry.

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};
use std::rc::Rc;

use tracing::warn;

use super::append_file::AppendFile;
use super::commitlog::{parse_segment_file_name, segment_file_name};
use super::record::MIN_RECORD_BYTES;

pub const CONSUME_QUEUE_ENTRY_BYTES: u64 = 20;
/// Recent entries kept in memory per queue for tailing consumers.
const HOT_TAIL_ENTRIES: u64 = 4096;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConsumeQueueEntry {
    pub commitlog_offset: u64,
    pub size: u32,
    pub tags_hash: u64,
}

impl ConsumeQueueEntry {
    /// Placeholder for a queue offset whose message is gone (points below every CommitLog).
    pub const HOLE: ConsumeQueueEntry = ConsumeQueueEntry {
        commitlog_offset: 0,
        size: u32::MAX,
        tags_hash: 0,
    };

    pub fn encode(&self) -> [u8; CONSUME_QUEUE_ENTRY_BYTES as usize] {
        let mut out = [0u8; CONSUME_QUEUE_ENTRY_BYTES as usize];
        out[0..8].copy_from_slice(&self.commitlog_offset.to_be_bytes());
        out[8..12].copy_from_slice(&self.size.to_be_bytes());
        out[12..20].copy_from_slice(&self.tags_hash.to_be_bytes());
        out
    }

    /// Decodes one entry; `None` for the zero padding after the last entry.
    pub fn decode(bytes: &[u8]) -> Option<ConsumeQueueEntry> {
        let entry = ConsumeQueueEntry {
            commitlog_offset: u64::from_be_bytes(bytes[0..8].try_into().ok()?),
            size: u32::from_be_bytes(bytes[8..12].try_into().ok()?),
            tags_hash: u64::from_be_bytes(bytes[12..20].try_into().ok()?),
        };
        (entry.size != 0).then_some(entry)
    }
}

/// See the module documentation.
pub struct ConsumeQueue {
    dir: PathBuf,
    entries_per_file: u64,
    files: RefCell<BTreeMap<u64, Rc<AppendFile>>>,
    min_offset: Cell<u64>,
    /// Entries present (dispatched).
    max_offset: Cell<u64>,
    /// Next queue offset to hand to an append; ahead of `max_offset` while appends wait for
    /// their flush under sync flush.
    next_assign: Cell<u64>,
    /// One past the newest entry found on disk at open, kept or not: recovery must dispatch
    /// the queue at least this far again, or entries were lost to damage.
    on_disk_end: Cell<u64>,
}

/// What opening a queue found and repaired.
#[derive(Debug, Default, Clone)]
pub struct ConsumeQueueRepair {
    pub entries_dropped: u64,
    pub files_dropped: u64,
    /// Why the queue's files cannot be trusted (an entry out of order, or valid entries after
    /// a bad one): the caller rebuilds derived files from the CommitLog.
    pub damage: Option<String>,
}

impl ConsumeQueue {
    /// A queue with no entries yet.
    pub fn new_empty(dir: PathBuf, entries_per_file: u64) -> ConsumeQueue {
        ConsumeQueue {
            dir,
            entries_per_file,
            files: RefCell::new(BTreeMap::new()),
            min_offset: Cell::new(0),
            max_offset: Cell::new(0),
            next_assign: Cell::new(0),
            on_disk_end: Cell::new(0),
        }
    }

    /// Opens the queue in `dir`, keeping only entries that point below `keep_below` (the
    /// checkpoint's derived offset: entries after it are rebuilt from the CommitLog) and form a
    /// dense run from the first file. An entry whose size no record can have (under the
    /// smallest record, over `max_entry_size`: what a segment holds) is damage.
    pub async fn open(
        dir: PathBuf,
        entries_per_file: u64,
        keep_below: u64,
        max_entry_size: u64,
    ) -> io::Result<(ConsumeQueue, ConsumeQueueRepair)> {
        let queue = ConsumeQueue::new_empty(dir, entries_per_file);
        let mut repair = ConsumeQueueRepair::default();
        let mut names = Vec::new();
        for entry in std::fs::read_dir(&queue.dir)? {
            let entry = entry?;
            if let Some(start) = entry.file_name().to_str().and_then(parse_segment_file_name) {
                names.push((start, entry.path()));
            }
        }
        names.sort();
        let mut expected_start: Option<u64> = None;
        let mut is_cut = false;
        let mut previous_offset: Option<u64> = None;
        for (start, path) in names {
            let is_misplaced =
                start % entries_per_file != 0 || expected_start.is_some_and(|e| e != start);
            if is_cut || is_misplaced {
                let bytes = std::fs::metadata(&path)?.len();
                repair.entries_dropped += bytes / CONSUME_QUEUE_ENTRY_BYTES;
                repair.files_dropped += 1;
                warn!(file = %path.display(), "dropping consume queue file after a gap");
                std::fs::remove_file(&path)?;
                is_cut = true;
                continue;
            }
            // Read once: the scan, the count of entries present and of those dropped all use it.
            let raw = std::fs::read(&path)?;
            let (valid_entries, damage) = scan_entries(
                &raw[..raw
                    .len()
                    .min((entries_per_file * CONSUME_QUEUE_ENTRY_BYTES) as usize)],
                keep_below,
                max_entry_size,
                &mut previous_offset,
            );
            let present = count_entries_after(&raw, 0);
            queue
                .on_disk_end
                .set(queue.on_disk_end.get().max(start + present));
            if let Some(why) = damage {
                repair.damage = Some(format!("{}: {why}", path.display()));
                return Ok((queue, repair));
            }
            let on_disk_bytes = raw.len() as u64;
            let valid_bytes = valid_entries * CONSUME_QUEUE_ENTRY_BYTES;
            if on_disk_bytes > valid_bytes {
                repair.entries_dropped += count_entries_after(&raw, valid_bytes);
            }
            let file = AppendFile::open_existing(path, valid_bytes, hot_bytes()).await?;
            if on_disk_bytes > valid_bytes {
                file.truncate_on_disk(valid_bytes).await?;
            }
            if queue.files.borrow().is_empty() {
                queue.min_offset.set(start);
            }
            queue.max_offset.set(start + valid_entries);
            queue.files.borrow_mut().insert(start, Rc::new(file));
            // Only the newest file may be partly filled: anything after a short file is a gap.
            is_cut = valid_entries < entries_per_file;
            expected_start = Some(start + entries_per_file);
        }
        queue.next_assign.set(queue.max_offset.get());
        Ok((queue, repair))
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Oldest queue offset still served.
    pub fn min_offset(&self) -> u64 {
        self.min_offset.get()
    }

    /// One past the newest dispatched entry.
    pub fn max_offset(&self) -> u64 {
        self.max_offset.get()
    }

    /// One past the newest entry that was on disk when the queue was opened.
    pub fn on_disk_end(&self) -> u64 {
        self.on_disk_end.get()
    }

    /// Hands out the next queue offset for an append.
    pub fn assign_offset(&self) -> u64 {
        let offset = self.next_assign.get();
        self.next_assign.set(offset + 1);
        offset
    }

    /// Adds the entry for queue offset `offset`. Re-dispatch of an entry already present is
    /// ignored; a gap is an error the caller answers with a rebuild. An empty queue may start
    /// past 0 (with holes before) only when `may_start_past_zero`: a full rebuild after
    /// retention deleted the queue's first messages.
    pub fn put(
        &self,
        offset: u64,
        entry: ConsumeQueueEntry,
        may_start_past_zero: bool,
    ) -> Result<(), u64> {
        let max = self.max_offset.get();
        if offset < max {
            return Ok(());
        }
        let file_start = offset - offset % self.entries_per_file;
        if self.files.borrow().is_empty() && offset > max && may_start_past_zero {
            self.start_at(offset);
        } else if offset > max {
            return Err(max);
        }
        let file = self.file_at(file_start);
        debug_assert_eq!(
            file.len(),
            (offset - file_start) * CONSUME_QUEUE_ENTRY_BYTES
        );
        file.append_copy(&entry.encode());
        self.max_offset.set(offset + 1);
        self.next_assign.set(self.next_assign.get().max(offset + 1));
        Ok(())
    }

    /// Recovery of a store that holds its unconfirmed tail back: notes that the record at
    /// queue offset `offset` is in the CommitLog and will be [`put`](Self::put) later, with
    /// `put`'s rules (an offset below the next one is already accounted for; one past it is a
    /// gap, `Err` with the next expected offset; an empty queue may start past 0 only when
    /// `may_start_past_zero`, its holes written now). Appends take offsets after it.
    pub fn hold(&self, offset: u64, may_start_past_zero: bool) -> Result<(), u64> {
        let next = self.next_assign.get();
        if self.files.borrow().is_empty() && offset > next && may_start_past_zero {
            self.start_at(offset);
        } else if offset > next {
            return Err(next);
        }
        self.next_assign.set(next.max(offset + 1));
        Ok(())
    }

    /// A record at queue offset `offset` was appended and waits to be dispatched (a replicated
    /// or returned record, whose offset is its own): appends take offsets after it.
    pub fn note_pending(&self, offset: u64) {
        self.next_assign
            .set(self.next_assign.get().max(offset.saturating_add(1)));
    }

    /// Makes an empty queue start at `offset`: a queue rebuilt after retention deleted its
    /// early messages starts past 0, and holes fill its first file up to the first surviving
    /// entry.
    fn start_at(&self, offset: u64) {
        let file_start = offset - offset % self.entries_per_file;
        let file = self.file_at(file_start);
        for _ in file_start..offset {
            file.append_copy(&ConsumeQueueEntry::HOLE.encode());
        }
        self.min_offset.set(offset);
        self.max_offset.set(offset);
    }

    /// One past the newest queue offset handed out or held back ([`hold`](Self::hold)):
    /// [`max_offset`](Self::max_offset) plus the records still waiting to be dispatched.
    pub fn next_offset(&self) -> u64 {
        self.next_assign.get()
    }

    fn file_at(&self, file_start: u64) -> Rc<AppendFile> {
        self.files
            .borrow_mut()
            .entry(file_start)
            .or_insert_with(|| {
                Rc::new(AppendFile::new_lazy(
                    self.dir.join(segment_file_name(file_start)),
                    hot_bytes(),
                ))
            })
            .clone()
    }

    /// Reads up to `max_entries` entries from `offset` (stops at a file end; call again).
    pub async fn read(&self, offset: u64, max_entries: u64) -> io::Result<Vec<ConsumeQueueEntry>> {
        if offset < self.min_offset.get() || offset >= self.max_offset.get() || max_entries == 0 {
            return Ok(Vec::new());
        }
        let file_start = offset - offset % self.entries_per_file;
        let Some(file) = self.files.borrow().get(&file_start).cloned() else {
            return Ok(Vec::new());
        };
        let available =
            (self.max_offset.get() - offset).min(file_start + self.entries_per_file - offset);
        let count = available.min(max_entries);
        let bytes = file
            .read(
                (offset - file_start) * CONSUME_QUEUE_ENTRY_BYTES,
                count * CONSUME_QUEUE_ENTRY_BYTES,
            )
            .await?;
        Ok(bytes
            .chunks_exact(CONSUME_QUEUE_ENTRY_BYTES as usize)
            .map_while(ConsumeQueueEntry::decode)
            .collect())
    }

    /// The entry at `offset`, if present.
    pub async fn get(&self, offset: u64) -> io::Result<Option<ConsumeQueueEntry>> {
        Ok(self.read(offset, 1).await?.into_iter().next())
    }

    /// Writes every file with new entries to disk and syncs it.
    pub async fn flush(&self) -> io::Result<()> {
        let dirty: Vec<Rc<AppendFile>> = self
            .files
            .borrow()
            .values()
            .filter(|f| f.len() > f.durable_len())
            .cloned()
            .collect();
        if !dirty.is_empty() {
            std::fs::create_dir_all(&self.dir)?;
        }
        for file in dirty {
            file.flush(true).await?;
        }
        Ok(())
    }

    /// Deletes whole files whose entries all point below `commitlog_min` and raises the minimum
    /// offset past entries that point there. Returns the number of files deleted.
    pub async fn delete_below(&self, commitlog_min: u64) -> io::Result<u64> {
        let mut deleted = 0;
        loop {
            let (first_start, first, has_next) = {
                let files = self.files.borrow();
                let mut iter = files.iter();
                let Some((start, file)) = iter.next() else {
                    return Ok(deleted);
                };
                (*start, file.clone(), iter.next().is_some())
            };
            let last_offset = first_start + first.len() / CONSUME_QUEUE_ENTRY_BYTES;
            if !has_next || last_offset == first_start {
                break;
            }
            match self.get(last_offset - 1).await? {
                Some(entry) if entry.commitlog_offset < commitlog_min => {
                    self.files.borrow_mut().remove(&first_start);
                    first.remove().await?;
                    self.min_offset.set(last_offset);
                    deleted += 1;
                }
                _ => break,
            }
        }
        // Within the first file, skip entries whose messages are gone (binary search).
        let (mut low, mut high) = (self.min_offset.get(), self.max_offset.get());
        while low < high {
            let mid = low + (high - low) / 2;
            match self.get(mid).await? {
                Some(entry) if entry.commitlog_offset < commitlog_min => low = mid + 1,
                _ => high = mid,
            }
        }
        self.min_offset.set(low);
        Ok(deleted)
    }
}

/// Counts the dense run of entries at the start of a file that point below `keep_below` in
/// increasing CommitLog order (holes aside), continuing from `previous_offset` (the last
/// entry of the files before). Entries after that run must all be newer than `keep_below`
/// (written after the checkpoint) or padding; anything else is damage, returned as the reason.
fn scan_entries(
    raw: &[u8],
    keep_below: u64,
    max_entry_size: u64,
    previous_offset: &mut Option<u64>,
) -> (u64, Option<String>) {
    let mut entries = raw
        .chunks_exact(CONSUME_QUEUE_ENTRY_BYTES as usize)
        .map(ConsumeQueueEntry::decode)
        .enumerate();
    let mut valid = 0u64;
    for (index, entry) in entries.by_ref() {
        let Some(entry) = entry else { break };
        if entry == ConsumeQueueEntry::HOLE {
            if previous_offset.is_some() {
                return (
                    valid,
                    Some(format!("entry {index} is a hole after real entries")),
                );
            }
            valid += 1;
            continue;
        }
        if entry.commitlog_offset >= keep_below {
            // The first entry written after the checkpoint: the rest must be too.
            let later_older = raw[index * CONSUME_QUEUE_ENTRY_BYTES as usize..]
                .chunks_exact(CONSUME_QUEUE_ENTRY_BYTES as usize)
                .filter_map(ConsumeQueueEntry::decode)
                .any(|e| e.commitlog_offset < keep_below && e != ConsumeQueueEntry::HOLE);
            let damage = later_older.then(|| {
                format!("entry {index} points at {} past the checkpoint's {keep_below}, yet older entries follow it", entry.commitlog_offset)
            });
            return (valid, damage);
        }
        let size = u64::from(entry.size);
        if size < MIN_RECORD_BYTES as u64 || size > max_entry_size {
            return (
                valid,
                Some(format!(
                    "entry {index} says its record is {size} bytes, which no record can be"
                )),
            );
        }
        if previous_offset.is_some_and(|p| entry.commitlog_offset <= p) {
            return (
                valid,
                Some(format!(
                    "entry {index} points at CommitLog offset {}, not after the entry before it ({})",
                    entry.commitlog_offset,
                    previous_offset.unwrap_or_default()
                )),
            );
        }
        *previous_offset = Some(entry.commitlog_offset);
        valid += 1;
    }
    // After padding, nothing but padding.
    if entries.any(|(_, entry)| entry.is_some()) {
        return (
            valid,
            Some(format!("entries follow padding after entry {valid}")),
        );
    }
    (valid, None)
}

fn count_entries_after(raw: &[u8], from_bytes: u64) -> u64 {
    raw.get(from_bytes as usize..)
        .unwrap_or_default()
        .chunks_exact(CONSUME_QUEUE_ENTRY_BYTES as usize)
        .filter(|chunk| ConsumeQueueEntry::decode(chunk).is_some())
        .count() as u64
}

fn hot_bytes() -> u64 {
    HOT_TAIL_ENTRIES * CONSUME_QUEUE_ENTRY_BYTES
}
