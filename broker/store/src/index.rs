//! The message index of one storage shard: message key and unique message id → CommitLog
//! offsets.
//!
//! Owns the index files (`<shard>/index/<20-digit ms>`, the first entry's store timestamp, bumped
//! by one when that name is taken) and, for
//! the newest file, its entries in memory (scanned on lookup). Files are append-only sequences of
//! 24-byte entries (key hash u64, commitlog offset u64, store timestamp ms i64; layout in
//! `docs/storage-format.md`); a file holds at most `max_entries_per_file`, then a new one starts.
//! Older files are searched by a sequential scan bounded by the query's time range.
//!
//! Hashes collide, and derived data may lag the CommitLog, so a hit is only a candidate: the
//! message store confirms every candidate against the stored record before answering. It is
//! derived data, rebuilt from the CommitLog after the checkpoint like the ConsumeQueues.

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::io;
use std::path::PathBuf;
use std::rc::Rc;

use super::append_file::AppendFile;
use super::commitlog::{parse_segment_file_name, segment_file_name};

pub const INDEX_ENTRY_BYTES: u64 = 24;
const HOT_TAIL_BYTES: u64 = 64 << 10;

/// What an index entry was made from; the kind is folded into the hash so that a key and an id
/// with the same text never collide by construction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IndexKind {
    /// A message key (`KEYS` property), scoped by topic.
    Key,
    /// The client-generated unique id (`UNIQ_KEY`), global.
    UniqueId,
}

/// FNV-1a 64 over the kind, the topic (keys only) and the text. Stable across versions: it is
/// part of the file format.
pub fn index_hash(kind: IndexKind, topic: &str, text: &str) -> u64 {
    const OFFSET_BASIS: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    let mut hash = OFFSET_BASIS;
    let mut feed = |bytes: &[u8]| {
        for &b in bytes {
            hash ^= u64::from(b);
            hash = hash.wrapping_mul(PRIME);
        }
    };
    match kind {
        IndexKind::Key => {
            feed(b"K");
            feed(topic.as_bytes());
            feed(b"#");
        }
        IndexKind::UniqueId => feed(b"U"),
    }
    feed(text.as_bytes());
    hash
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IndexEntry {
    pub hash: u64,
    pub commitlog_offset: u64,
    pub store_timestamp_ms: i64,
}

impl IndexEntry {
    pub fn encode(&self) -> [u8; INDEX_ENTRY_BYTES as usize] {
        let mut out = [0u8; INDEX_ENTRY_BYTES as usize];
        out[0..8].copy_from_slice(&self.hash.to_be_bytes());
        out[8..16].copy_from_slice(&self.commitlog_offset.to_be_bytes());
        out[16..24].copy_from_slice(&self.store_timestamp_ms.to_be_bytes());
        out
    }

    /// `None` for the zero padding after the last entry (a real entry has a store timestamp).
    pub fn decode(bytes: &[u8]) -> Option<IndexEntry> {
        let entry = IndexEntry {
            hash: u64::from_be_bytes(bytes.get(0..8)?.try_into().ok()?),
            commitlog_offset: u64::from_be_bytes(bytes.get(8..16)?.try_into().ok()?),
            store_timestamp_ms: i64::from_be_bytes(bytes.get(16..24)?.try_into().ok()?),
        };
        (entry.store_timestamp_ms != 0).then_some(entry)
    }
}

struct IndexFile {
    file: Rc<AppendFile>,
    /// Store time of the file's first entry (the name may be later: names are unique, so a
    /// file started in the same millisecond as the previous one gets the next number).
    first_timestamp_ms: i64,
    first_commitlog_offset: u64,
}

/// The newest file's entries in memory, in CommitLog order, searched by a scan from the newest.
///
/// Adding an entry is a push onto a vector, not a hash table insert: with a table, every
/// message (each has a unique id) inserted a new key into a table of millions, two cache misses
/// or about 0.4 µs per message, a tenth of the storage core's time under load. Queries by key
/// or id are rare administrative reads; scanning a full active file (2,000,000 entries, 48 MB)
/// takes a few milliseconds, in steps that let other tasks run (see [`MessageIndex::lookup`]).
#[derive(Default)]
struct ActiveIndex {
    entries: Vec<IndexEntry>,
    /// Bumped when the active file is replaced, so a scan that yielded can tell.
    generation: u64,
}

/// What a lookup found: candidate CommitLog offsets, newest first.
#[derive(Debug, Default)]
pub struct IndexLookup {
    pub offsets: Vec<u64>,
    /// The scan budget ran out before the time range was searched to its start.
    pub is_partial: bool,
}

/// Entries an index scan looks at between chances for other tasks to run.
const SCAN_STEP_ENTRIES: usize = 64 * 1024;

impl ActiveIndex {
    fn insert(&mut self, entry: IndexEntry) {
        self.entries.push(entry);
    }

    /// (commitlog offset, store timestamp) of the entries with `hash` among `entries[range]`,
    /// newest first.
    fn newest_first(
        &self,
        hash: u64,
        range: std::ops::Range<usize>,
    ) -> impl Iterator<Item = (u64, i64)> + '_ {
        self.entries[range]
            .iter()
            .rev()
            .filter(move |e| e.hash == hash)
            .map(|e| (e.commitlog_offset, e.store_timestamp_ms))
    }

    fn clear(&mut self) {
        self.entries.clear();
        self.generation += 1;
    }
}

/// See the module documentation.
pub struct MessageIndex {
    dir: PathBuf,
    max_entries_per_file: u64,
    /// Files by first store timestamp (ties broken by the entry offset in the name order).
    files: RefCell<BTreeMap<(i64, u64), IndexFile>>,
    /// The newest file's entries.
    active: RefCell<ActiveIndex>,
    active_entries: Cell<u64>,
    last_timestamp_ms: Cell<i64>,
    /// Why the newest file cannot be trusted, as found on open (then it is rebuilt).
    damage: RefCell<Option<String>>,
}

impl MessageIndex {
    /// Opens the index in `dir`, dropping every entry that points at or past `keep_below`
    /// (they are rebuilt from the CommitLog): files that start there are deleted, the last file
    /// kept is cut there and becomes the active one.
    pub async fn open(
        dir: PathBuf,
        max_entries_per_file: u64,
        keep_below: u64,
    ) -> io::Result<MessageIndex> {
        std::fs::create_dir_all(&dir)?;
        let mut names = Vec::new();
        for entry in std::fs::read_dir(&dir)? {
            let entry = entry?;
            if let Some(ts) = entry.file_name().to_str().and_then(parse_segment_file_name) {
                names.push((ts, entry.path()));
            }
        }
        names.sort();
        let index = MessageIndex {
            dir,
            max_entries_per_file,
            files: RefCell::new(BTreeMap::new()),
            active: RefCell::new(ActiveIndex::default()),
            active_entries: Cell::new(0),
            last_timestamp_ms: Cell::new(0),
            damage: RefCell::new(None),
        };
        // Entries are appended in CommitLog order across files, so a file's entries all lie
        // below the next file's first entry. Files whose first entry is at or past
        // `keep_below` go entirely; the last file kept is cut there and becomes the active one.
        let mut kept: Vec<(u64, PathBuf, IndexEntry)> = Vec::new();
        for (ts, path) in names {
            match first_entry(&path)? {
                Some(first) if first.commitlog_offset < keep_below => kept.push((ts, path, first)),
                _ => std::fs::remove_file(&path)?,
            }
        }
        let count = kept.len();
        for (position, (ts, path, first)) in kept.into_iter().enumerate() {
            let is_newest = position + 1 == count;
            let on_disk = std::fs::metadata(&path)?.len();
            let (valid_bytes, last_ts) = if is_newest {
                let raw = std::fs::read(&path)?;
                if let Some(why) = check_entries(&raw, keep_below) {
                    *index.damage.borrow_mut() = Some(format!("{}: {why}", path.display()));
                }
                let entries: Vec<IndexEntry> = raw
                    .chunks_exact(INDEX_ENTRY_BYTES as usize)
                    .map_while(IndexEntry::decode)
                    .take_while(|e| e.commitlog_offset < keep_below)
                    .collect();
                let mut active = index.active.borrow_mut();
                active.entries.extend_from_slice(&entries);
                index.active_entries.set(entries.len() as u64);
                let last_ts = entries
                    .iter()
                    .map(|e| e.store_timestamp_ms)
                    .max()
                    .unwrap_or(first.store_timestamp_ms);
                (entries.len() as u64 * INDEX_ENTRY_BYTES, last_ts)
            } else {
                (valid_entry_bytes(&path, on_disk)?, first.store_timestamp_ms)
            };
            let file = AppendFile::open_existing(path, valid_bytes, HOT_TAIL_BYTES).await?;
            if on_disk > valid_bytes && is_newest {
                file.truncate_on_disk(valid_bytes).await?;
            }
            index
                .last_timestamp_ms
                .set(index.last_timestamp_ms.get().max(last_ts));
            index.files.borrow_mut().insert(
                (ts as i64, first.commitlog_offset),
                IndexFile {
                    file: Rc::new(file),
                    first_timestamp_ms: first.store_timestamp_ms,
                    first_commitlog_offset: first.commitlog_offset,
                },
            );
        }
        Ok(index)
    }

    /// Why the newest index file looked damaged when it was opened, if it did: entries out of
    /// CommitLog or store-time order, or entries after the padding. (A damaged hash field
    /// cannot be seen this way; older files are not read on open.)
    pub fn damage(&self) -> Option<String> {
        self.damage.borrow().clone()
    }

    /// Adds an entry (in CommitLog order).
    pub fn put(&self, entry: IndexEntry) {
        if self.files.borrow().is_empty() || self.active_entries.get() >= self.max_entries_per_file
        {
            self.start_file(entry);
        }
        let files = self.files.borrow();
        let (_, newest) = files.iter().next_back().expect("an index file exists");
        newest.file.append_copy(&entry.encode());
        self.active_entries.set(self.active_entries.get() + 1);
        self.active.borrow_mut().insert(entry);
        self.last_timestamp_ms
            .set(self.last_timestamp_ms.get().max(entry.store_timestamp_ms));
    }

    fn start_file(&self, first: IndexEntry) {
        // File names are unique timestamps: a newer file never gets an older or equal name.
        let newest_ts = self
            .files
            .borrow()
            .keys()
            .next_back()
            .map(|k| k.0)
            .unwrap_or(i64::MIN);
        let ts = first
            .store_timestamp_ms
            .max(newest_ts.saturating_add(1))
            .max(0);
        let path = self.dir.join(segment_file_name(ts as u64));
        self.files.borrow_mut().insert(
            (ts, first.commitlog_offset),
            IndexFile {
                file: Rc::new(AppendFile::new_lazy(path, HOT_TAIL_BYTES)),
                first_timestamp_ms: first.store_timestamp_ms,
                first_commitlog_offset: first.commitlog_offset,
            },
        );
        self.active.borrow_mut().clear();
        self.active_entries.set(0);
    }

    /// Candidate CommitLog offsets for `hash` with store time in `[begin_ms, end_ms]`, newest
    /// first, at most `max_candidates`, without duplicates. The work is bounded: at most
    /// `max_scanned_entries` entries are looked at (newest first, so the budget runs out on the
    /// oldest entries of the range), older files are read a step at a time, and other tasks run
    /// between steps. A query that runs out of budget answers what it found and says so in
    /// `IndexLookup::is_partial`.
    pub async fn lookup(
        &self,
        hash: u64,
        begin_ms: i64,
        end_ms: i64,
        max_candidates: usize,
        max_scanned_entries: u64,
    ) -> io::Result<IndexLookup> {
        let mut found: Vec<u64> = Vec::new();
        let mut budget = max_scanned_entries;
        let mut is_partial = false;
        let in_range = |ts: i64| ts >= begin_ms && ts <= end_ms;
        // The active file, newest first, a step at a time. Store times only grow along the
        // file (checked on open), so the scan ends at the first entry older than the range.
        // If the file is replaced while the scan yields, it has become the newest older file,
        // which the loop below reads (duplicates are dropped at the end).
        let (generation, mut end) = {
            let active = self.active.borrow();
            (active.generation, active.entries.len())
        };
        while end > 0 && found.len() < max_candidates {
            if budget == 0 {
                is_partial = true;
                break;
            }
            let step = SCAN_STEP_ENTRIES.min(usize::try_from(budget).unwrap_or(usize::MAX));
            let start = end.saturating_sub(step);
            let older_than_range = {
                let active = self.active.borrow();
                if active.generation != generation {
                    break;
                }
                found.extend(
                    active
                        .newest_first(hash, start..end)
                        .filter(|(_, ts)| in_range(*ts))
                        .map(|(offset, _)| offset),
                );
                active.entries[start].store_timestamp_ms < begin_ms
            };
            budget -= (end - start) as u64;
            if older_than_range {
                break;
            }
            end = start;
            glommio::yield_if_needed().await;
        }
        // Older files, newest first, skipping those wholly outside the range: a file's entries
        // are no older than its name and older than the next file's name.
        let older: Vec<Rc<AppendFile>> = {
            let files = self.files.borrow();
            let mut next_start = i64::MAX;
            let mut list = Vec::new();
            for (position, file) in files.values().rev().enumerate() {
                if position > 0 && file.first_timestamp_ms <= end_ms && next_start >= begin_ms {
                    list.push(file.file.clone());
                }
                next_start = file.first_timestamp_ms;
            }
            list
        };
        'files: for file in older {
            // Each file from its end, a step at a time: newest entries first.
            let mut end = file.len() / INDEX_ENTRY_BYTES;
            while end > 0 {
                if found.len() >= max_candidates {
                    break 'files;
                }
                if budget == 0 {
                    is_partial = true;
                    break 'files;
                }
                let step = (SCAN_STEP_ENTRIES as u64).min(budget);
                let start = end.saturating_sub(step);
                let bytes = file
                    .read(start * INDEX_ENTRY_BYTES, (end - start) * INDEX_ENTRY_BYTES)
                    .await?;
                let entries: Vec<IndexEntry> = bytes
                    .chunks_exact(INDEX_ENTRY_BYTES as usize)
                    .filter_map(IndexEntry::decode)
                    .collect();
                found.extend(
                    entries
                        .iter()
                        .rev()
                        .filter(|e| e.hash == hash && in_range(e.store_timestamp_ms))
                        .map(|e| e.commitlog_offset),
                );
                budget -= end - start;
                if entries
                    .first()
                    .is_some_and(|e| e.store_timestamp_ms < begin_ms)
                {
                    break;
                }
                end = start;
                glommio::yield_if_needed().await;
            }
        }
        let mut seen = std::collections::HashSet::new();
        found.retain(|offset| seen.insert(*offset));
        found.truncate(max_candidates);
        Ok(IndexLookup {
            offsets: found,
            is_partial,
        })
    }

    /// Writes and syncs the newest file.
    pub async fn flush(&self) -> io::Result<()> {
        let dirty: Vec<Rc<AppendFile>> = self
            .files
            .borrow()
            .values()
            .filter(|f| f.file.len() > f.file.durable_len())
            .map(|f| f.file.clone())
            .collect();
        for file in dirty {
            file.flush(true).await?;
        }
        Ok(())
    }

    /// Deletes files all of whose entries point below `commitlog_min` (a file's entries are
    /// below the next file's first offset). The newest file is never deleted.
    pub async fn delete_below(&self, commitlog_min: u64) -> io::Result<u64> {
        let mut deleted = 0;
        loop {
            let doomed = {
                let files = self.files.borrow();
                let mut iter = files.iter();
                match (iter.next(), iter.next()) {
                    (Some((key, first)), Some((_, second)))
                        if second.first_commitlog_offset <= commitlog_min =>
                    {
                        Some((*key, first.file.clone()))
                    }
                    _ => None,
                }
            };
            let Some((key, file)) = doomed else {
                return Ok(deleted);
            };
            self.files.borrow_mut().remove(&key);
            file.remove().await?;
            deleted += 1;
        }
    }

    /// The newest store timestamp indexed.
    pub fn last_timestamp_ms(&self) -> i64 {
        self.last_timestamp_ms.get()
    }

    /// Entries in the newest file (for reports).
    pub fn active_entries(&self) -> u64 {
        self.active_entries.get()
    }
}

fn first_entry(path: &std::path::Path) -> io::Result<Option<IndexEntry>> {
    use std::io::Read;
    let mut bytes = [0u8; INDEX_ENTRY_BYTES as usize];
    let mut file = std::fs::File::open(path)?;
    match file.read_exact(&mut bytes) {
        Ok(()) => Ok(IndexEntry::decode(&bytes)),
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => Ok(None),
        Err(e) => Err(e),
    }
}

/// Bytes of entries in a sealed file: its length less the zero padding of the last block.
fn valid_entry_bytes(path: &std::path::Path, on_disk: u64) -> io::Result<u64> {
    use std::os::unix::fs::FileExt;
    let file = std::fs::File::open(path)?;
    // Only the last 4 KiB block can hold padding: walk its entries from the entry boundary at or
    // before the block's start.
    let tail_start = super::append_file::align_down(on_disk.saturating_sub(1));
    let first_in_tail = tail_start - tail_start % INDEX_ENTRY_BYTES;
    let mut end = first_in_tail;
    let mut entry = [0u8; INDEX_ENTRY_BYTES as usize];
    while end + INDEX_ENTRY_BYTES <= on_disk {
        file.read_exact_at(&mut entry, end)?;
        if IndexEntry::decode(&entry).is_none() {
            break;
        }
        end += INDEX_ENTRY_BYTES;
    }
    Ok(end)
}

/// Checks the entries of an index file kept below `keep_below`: they are appended in
/// CommitLog order with store times that never go back, and only padding follows the last.
fn check_entries(raw: &[u8], keep_below: u64) -> Option<String> {
    let mut previous: Option<IndexEntry> = None;
    let mut chunks = raw.chunks_exact(INDEX_ENTRY_BYTES as usize).enumerate();
    for (at, chunk) in chunks.by_ref() {
        let Some(entry) = IndexEntry::decode(chunk) else {
            break;
        };
        if entry.commitlog_offset >= keep_below {
            // The first entry written after the checkpoint (rebuilt from the CommitLog): every
            // later one must be too, or this one is a damaged older entry.
            let rest = &raw[at * INDEX_ENTRY_BYTES as usize..];
            let is_older_later = rest
                .chunks_exact(INDEX_ENTRY_BYTES as usize)
                .filter_map(IndexEntry::decode)
                .any(|e| e.commitlog_offset < keep_below);
            return is_older_later.then(|| {
                format!(
                    "entry {at} points at {} past the checkpoint's {keep_below}, yet older entries follow it",
                    entry.commitlog_offset
                )
            });
        }
        if let Some(before) = &previous {
            if entry.commitlog_offset < before.commitlog_offset
                || entry.store_timestamp_ms < before.store_timestamp_ms
            {
                return Some(format!(
                    "entry {at} (offset {}, stored at {}) goes back from the one before it (offset {}, stored at {})",
                    entry.commitlog_offset,
                    entry.store_timestamp_ms,
                    before.commitlog_offset,
                    before.store_timestamp_ms
                ));
            }
        }
        previous = Some(entry);
    }
    chunks
        .find(|(_, chunk)| chunk.iter().any(|&b| b != 0))
        .map(|(at, _)| format!("entry {at} follows the end of the entries"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn active_entries_of_a_hash_come_newest_first_and_others_stay_apart() {
        let mut active = ActiveIndex::default();
        for (offset, hash) in [(0u64, 7u64), (10, 8), (20, 7), (30, 9), (40, 7)] {
            active.insert(IndexEntry {
                hash,
                commitlog_offset: offset,
                store_timestamp_ms: offset as i64 + 1000,
            });
        }
        let offsets = |active: &ActiveIndex, hash, range: std::ops::Range<usize>| {
            active
                .newest_first(hash, range)
                .map(|(offset, _)| offset)
                .collect::<Vec<_>>()
        };
        assert_eq!(offsets(&active, 7, 0..5), [40, 20, 0]);
        assert_eq!(offsets(&active, 7, 1..4), [20], "only the range asked for");
        assert_eq!(offsets(&active, 8, 0..5), [10]);
        assert_eq!(
            active.newest_first(9, 0..5).collect::<Vec<_>>(),
            [(30, 1030)],
            "the timestamp travels with its entry"
        );
        assert!(offsets(&active, 1, 0..5).is_empty());
        let generation = active.generation;
        active.clear();
        assert!(offsets(&active, 7, 0..0).is_empty());
        assert_ne!(
            active.generation, generation,
            "a scan can tell the file changed"
        );
    }

    #[test]
    fn entries_out_of_order_or_after_the_end_are_damage() {
        let entry = |offset: u64, ts: i64| IndexEntry {
            hash: offset * 31,
            commitlog_offset: offset,
            store_timestamp_ms: ts,
        };
        let file = |entries: &[IndexEntry], padding: usize| {
            let mut raw: Vec<u8> = entries.iter().flat_map(|e| e.encode()).collect();
            raw.extend(std::iter::repeat_n(0u8, padding));
            raw
        };
        let good = [entry(0, 10), entry(0, 10), entry(100, 11), entry(200, 11)];
        assert_eq!(check_entries(&file(&good, 48), 1_000), None);
        assert!(check_entries(&file(&[entry(100, 10), entry(50, 11)], 0), 1_000).is_some());
        assert!(check_entries(&file(&[entry(100, 12), entry(150, 11)], 0), 1_000).is_some());
        let mut after_end = file(&good, 48);
        let end = after_end.len();
        after_end[end - 3] = 7;
        assert!(check_entries(&after_end, 1_000).is_some());
        // Entries past the checkpoint are not judged (recovery drops and rebuilds them), but an
        // older one after them means the first was damaged.
        assert_eq!(
            check_entries(&file(&[entry(0, 10), entry(2_000, 9)], 0), 1_000),
            None
        );
        assert!(check_entries(&file(&[entry(9_999, 10), entry(100, 11)], 0), 1_000).is_some());
    }
}
