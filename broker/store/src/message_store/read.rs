//! The read paths: by queue offset (pulls, with one CommitLog read serving many records), by
//! time (offset reset), by key and by unique id (the index), by physical offset (offset message
//! ids), and the CommitLog bytes served to a replica. Every size read from disk is bounded
//! before it is used; a record read from disk is validated before it is served.

use std::rc::Rc;

use bytes::Bytes;
use glommio::io::ReadResult;
use tracing::warn;

use crate::consume_queue::{ConsumeQueue, ConsumeQueueEntry};
use crate::filter::TagFilter;
use crate::index::{index_hash, IndexKind};
use crate::read_ahead::{Lookup, ReadAheadStats, ReadTicket, SpanRead};
use crate::record::{
    decode_message, peek_total_size, read_head, RecordError, RecordView, MESSAGE_MAGIC_CODE,
    MIN_RECORD_BYTES,
};

use super::state::Inner;
use super::types::{io_error, GetResult, GetStatus, StoreError, MAX_QUERY_ANSWER_BYTES};
use super::MessageStore;

/// Most bytes one pull reads from the CommitLog at once (records of the batch inside it are
/// sliced out of one read); a read asks for what the pull still has room for, at least
/// [`MIN_READ_SPAN_BYTES`]. A 1 MiB pull of one queue's backlog is one O_DIRECT read, and the
/// read ahead of its next pull another.
const READ_SPAN_BYTES: u64 = 1 << 20;
const MIN_READ_SPAN_BYTES: u64 = 64 << 10;

/// Registered I/O memory kept for reads beside the read-ahead cache's own bytes: spans read
/// while the cache is full (served once, then dropped) and ConsumeQueue reads.
pub(super) const READS_BESIDE_CACHE_BYTES: u64 = 4 * READ_SPAN_BYTES;

/// ConsumeQueue entries kept read ahead of a queue's next pull (two pulls' worth at a pull's
/// most); when fewer are kept, the rest are read.
const ENTRIES_AHEAD: u64 = 2048;

/// How many entries ahead of the record a pull is checking it asks the CPU to bring the next
/// record's lines into its cache ([`SpanRead::prefetch_record`]).
const PREFETCH_RECORDS_AHEAD: usize = 4;

/// Pulls whose CommitLog spans are read ahead of a consumer draining a backlog: its next pull
/// and the one after (a 1 MiB O_DIRECT read takes about as long as a pull's round trip here,
/// so with one span ahead about half the pulls still waited for theirs).
const PULLS_AHEAD: usize = 2;

/// What a pull asks for, to find where the pulls after it will start.
struct PullShape {
    max_messages: u32,
    max_bytes: u64,
    filter: TagFilter,
}

impl PullShape {
    fn new(max_messages: u32, max_bytes: u64, filter: &TagFilter) -> PullShape {
        PullShape {
            max_messages,
            max_bytes,
            filter: filter.clone(),
        }
    }

    /// Where each of the next [`PULLS_AHEAD`] pulls shaped like this one will start reading,
    /// as `(physical offset, its first record's size)`, found from the queue's `entries` from
    /// the next pull's offset on with the pull's own rules (entries gone or filtered out are
    /// skipped; a pull ends at `max_messages` records or before passing `max_bytes`).
    fn starts(&self, entries: &[ConsumeQueueEntry], commitlog_min: u64) -> Vec<(u64, u64)> {
        let mut starts = Vec::with_capacity(PULLS_AHEAD);
        let (mut records, mut bytes) = (0u32, 0u64);
        for entry in entries {
            let size = u64::from(entry.size);
            if records > 0 && (records >= self.max_messages || bytes + size > self.max_bytes) {
                (records, bytes) = (0, 0);
            }
            let is_gone =
                *entry == ConsumeQueueEntry::HOLE || entry.commitlog_offset < commitlog_min;
            if is_gone || !self.filter.matches_hash(entry.tags_hash) {
                continue;
            }
            if records == 0 {
                if starts.len() == PULLS_AHEAD {
                    break;
                }
                starts.push((entry.commitlog_offset, size));
            }
            records += 1;
            bytes += size;
        }
        starts
    }
}

/// A glommio read buffer as a span of the read-ahead cache.
struct DirectRead(ReadResult);

impl AsRef<[u8]> for DirectRead {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

/// Largest number of candidates one key/id query examines.
const MAX_INDEX_CANDIDATES: usize = 1024;

/// Who checks a record the store reads back: the store, or the reader it serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Crcs {
    /// The store, everything: the framing, that it is the record its ConsumeQueue entry names
    /// (topic included) and, for a record read from disk, both CRCs. For readers inside the
    /// broker that copy or act on a record (delay and timer delivery, transactions), so that
    /// a record damaged on disk is never stored again under a fresh CRC.
    Checked,
    /// The reader: a consumer's client checks every record end to end (its framing, both
    /// CRCs, and that its topic, queue and queue offsets are those it pulled; storage-format.md
    /// §4.8), so the store reads a record's head only (its first 36 bytes: size, magic, queue
    /// id, queue offset, CommitLog offset) to know that it is the record its ConsumeQueue
    /// entry names, and slices it out without reading the rest.
    LeftToClient,
}

impl MessageStore {
    /// Reads messages of (topic, queue) from `offset`: at most `max_messages` and about
    /// `max_bytes` (at least one message if any matches), skipping entries the filter rejects.
    /// Every record read from disk is fully checked (both CRCs).
    pub async fn get_messages(
        &self,
        topic: &str,
        queue_id: u32,
        offset: u64,
        max_messages: u32,
        max_bytes: u64,
        filter: &TagFilter,
    ) -> Result<GetResult, StoreError> {
        let pull = PullShape::new(max_messages, max_bytes, filter);
        self.read_messages(topic, queue_id, offset, pull, Crcs::Checked)
            .await
    }

    /// [`get_messages`](Self::get_messages) for a consumer's pull: the CRCs of records read
    /// from disk are left to the client's end-to-end check ([`Crcs::LeftToClient`]).
    pub async fn get_messages_for_client(
        &self,
        topic: &str,
        queue_id: u32,
        offset: u64,
        max_messages: u32,
        max_bytes: u64,
        filter: &TagFilter,
    ) -> Result<GetResult, StoreError> {
        let pull = PullShape::new(max_messages, max_bytes, filter);
        self.read_messages(topic, queue_id, offset, pull, Crcs::LeftToClient)
            .await
    }

    async fn read_messages(
        &self,
        topic: &str,
        queue_id: u32,
        offset: u64,
        pull: PullShape,
        crcs: Crcs,
    ) -> Result<GetResult, StoreError> {
        let PullShape {
            max_messages,
            max_bytes,
            ref filter,
        } = pull;
        let Some(queue) = self.inner.queue(topic, queue_id) else {
            return Ok(GetResult {
                status: GetStatus::NoMatchedQueue,
                records: Vec::new(),
                next_offset: 0,
                min_offset: 0,
                max_offset: 0,
                suggest_broker_id: 0,
            });
        };
        let (min_offset, max_offset) = (queue.min_offset(), queue.max_offset());
        let mut result = GetResult {
            status: GetStatus::NoNewMessage,
            records: Vec::new(),
            next_offset: offset,
            min_offset,
            max_offset,
            suggest_broker_id: 0,
        };
        if offset < min_offset {
            result.status = GetStatus::OffsetTooSmall;
            result.next_offset = min_offset;
            return Ok(result);
        }
        if offset > max_offset {
            result.status = GetStatus::OffsetOverflow;
            result.next_offset = max_offset;
            return Ok(result);
        }
        if offset == max_offset {
            return Ok(result);
        }
        let commitlog_min = self.inner.commit_log.min_offset();
        // One CommitLog read serves every record of the batch that falls inside it: a queue's
        // records sit close together, so a pull costs a read or two, not one per record.
        let mut span: Option<SpanRead> = None;
        let mut next = offset;
        let mut next_entry = None;
        let mut is_from_segment = false;
        let mut bytes_total = 0u64;
        let mut scanned = 0u64;
        'scan: while next < max_offset && scanned < self.inner.config.max_scanned_entries_per_read {
            let want = (self.inner.config.max_scanned_entries_per_read - scanned).min(1024);
            let entries =
                match self
                    .inner
                    .read_ahead
                    .take_entries(topic, queue_id, next, want as usize)
                {
                    Some(entries) => entries,
                    None => queue
                        .read(next, want)
                        .await
                        .map_err(io_error(queue.dir().display().to_string()))?,
                };
            if entries.is_empty() {
                break;
            }
            for (index, &entry) in entries.iter().enumerate() {
                // The records a few entries on are read into the cache meanwhile.
                if let (Some(read), Some(ahead)) =
                    (span.as_ref(), entries.get(index + PREFETCH_RECORDS_AHEAD))
                {
                    read.prefetch_record(ahead.commitlog_offset, ahead.size);
                }
                if result.records.len() >= max_messages as usize
                    || (!result.records.is_empty()
                        && bytes_total + u64::from(entry.size) > max_bytes)
                {
                    next_entry = Some(entry);
                    break 'scan;
                }
                scanned += 1;
                let queue_offset = next;
                next += 1;
                let is_gone =
                    entry == ConsumeQueueEntry::HOLE || entry.commitlog_offset < commitlog_min;
                if is_gone || !filter.matches_hash(entry.tags_hash) {
                    continue;
                }
                let start = entry.commitlog_offset;
                let end = start + u64::from(entry.size);
                let cached = span.as_ref().and_then(|read| {
                    (start >= read.from && end <= read.from + read.bytes.len() as u64).then(|| {
                        let within = (start - read.from) as usize;
                        read.bytes.slice(within..within + entry.size as usize)
                    })
                });
                let first_read = match cached {
                    Some(read) => Some(read),
                    None => match self
                        .inner
                        .read_span(
                            start,
                            u64::from(entry.size),
                            max_bytes.saturating_sub(bytes_total),
                        )
                        .await
                    {
                        Some(read) => {
                            let record = read
                                .bytes
                                .slice(..(entry.size as usize).min(read.bytes.len()));
                            is_from_segment |= !self.inner.commit_log.is_in_ring(start, end);
                            span = Some(read);
                            Some(record)
                        }
                        None => None,
                    },
                };
                let record = self
                    .inner
                    .read_queue_record_from(topic, queue_id, queue_offset, &entry, first_read, crcs)
                    .await?;
                if !filter.matches_record(&record) {
                    continue;
                }
                bytes_total += record.len() as u64;
                result.records.push(record);
            }
        }
        result.next_offset = next;
        result.status = if result.records.is_empty() {
            GetStatus::NoMatchedMessage
        } else {
            GetStatus::Found
        };
        // A consumer reading from segment files is draining a backlog: read what its next
        // pulls will want while this answer is on its way.
        if is_from_segment && next < max_offset && self.inner.read_ahead.is_enabled() {
            Inner::start_read_ahead(&self.inner, queue, topic, queue_id, next, next_entry, pull);
        }
        Ok(result)
    }

    /// What the read-ahead cache did since the store opened.
    pub fn read_ahead_stats(&self) -> ReadAheadStats {
        self.inner.read_ahead.stats()
    }

    /// Bytes the read-ahead cache holds now (spans being read, cached, or still held by
    /// answers on their way out); at most `readahead_bytes`.
    pub fn read_ahead_bytes(&self) -> u64 {
        self.inner.read_ahead.used_bytes()
    }

    /// `(min, max)` queue offsets of (topic, queue), if the queue exists on this shard.
    pub fn queue_offsets(&self, topic: &str, queue_id: u32) -> Option<(u64, u64)> {
        self.inner
            .queue(topic, queue_id)
            .map(|q| (q.min_offset(), q.max_offset()))
    }

    /// Every (topic, queue) this shard has, with min and max offsets.
    pub fn queues(&self) -> Vec<(String, u32, u64, u64)> {
        let mut list: Vec<_> = self
            .inner
            .queues
            .borrow()
            .iter()
            .flat_map(|(topic, queues)| {
                queues
                    .iter()
                    .map(move |(id, q)| (topic.clone(), *id, q.min_offset(), q.max_offset()))
            })
            .collect();
        list.sort();
        list
    }

    /// The first queue offset whose message was stored at or after `timestamp_ms` (the max
    /// offset if none), by binary search over the queue. For offset reset by time.
    pub async fn offset_by_time(
        &self,
        topic: &str,
        queue_id: u32,
        timestamp_ms: i64,
    ) -> Result<u64, StoreError> {
        let Some(queue) = self.inner.queue(topic, queue_id) else {
            return Ok(0);
        };
        let (mut low, mut high) = (queue.min_offset(), queue.max_offset());
        while low < high {
            let mid = low + (high - low) / 2;
            let entry = queue
                .get(mid)
                .await
                .map_err(io_error(queue.dir().display().to_string()))?
                .ok_or_else(|| {
                    StoreError::Corrupt(format!("{topic}/{queue_id}: entry {mid} missing"))
                })?;
            let record = self
                .inner
                .read_queue_record(topic, queue_id, mid, &entry)
                .await?;
            let view = RecordView::parse_unchecked(&record)?;
            if view.store_timestamp_ms() < timestamp_ms {
                low = mid + 1;
            } else {
                high = mid;
            }
        }
        Ok(low)
    }

    /// Messages of `topic` with key `key` stored in `[begin_ms, end_ms]`, newest first.
    pub async fn query_by_key(
        &self,
        topic: &str,
        key: &str,
        begin_ms: i64,
        end_ms: i64,
        max_results: usize,
    ) -> Result<Vec<Bytes>, StoreError> {
        let hash = index_hash(IndexKind::Key, topic, key);
        self.inner
            .query_index(hash, begin_ms, end_ms, max_results, |view| {
                view.topic() == topic && view.keys().any(|k| k == key)
            })
            .await
    }

    /// Messages whose client-generated unique id is `id`, stored in `[begin_ms, end_ms]`.
    pub async fn query_by_unique_id(
        &self,
        id: &str,
        begin_ms: i64,
        end_ms: i64,
        max_results: usize,
    ) -> Result<Vec<Bytes>, StoreError> {
        let hash = index_hash(IndexKind::UniqueId, "", id);
        self.inner
            .query_index(hash, begin_ms, end_ms, max_results, |view| {
                view.unique_key() == Some(id)
            })
            .await
    }

    /// CommitLog bytes for a replica, from `from` (where the replica's log ends): at most
    /// `max_bytes`, only bytes complete under the flush mode (written; synced under sync
    /// flush), never across a segment's end. Empty when the replica has everything. An offset
    /// before the oldest retained byte or past the end is an error (the replica is too far
    /// behind, or holds bytes this log does not).
    pub async fn read_for_replica(&self, from: u64, max_bytes: u64) -> Result<Bytes, StoreError> {
        let inner = &self.inner;
        let log = &inner.commit_log;
        let (min, visible) = (log.min_offset(), inner.visible_offset());
        if from < min || from > log.write_offset() {
            return Err(StoreError::ReplicaOutOfRange {
                from,
                min,
                end: log.write_offset(),
            });
        }
        let segment_end = from - from % log.segment_bytes() + log.segment_bytes();
        let to = visible.min(segment_end).min(from.saturating_add(max_bytes));
        if to <= from {
            return Ok(Bytes::new());
        }
        log.read(from, to - from)
            .await
            .map_err(io_error(format!("CommitLog read for a replica at {from}")))
    }

    /// The validated record at a physical offset (query by offset id).
    pub async fn read_record_at(&self, physical_offset: u64) -> Result<Bytes, StoreError> {
        self.inner.read_record_at(physical_offset).await
    }
}

impl Inner {
    /// Bytes from `start`: what the pull has `room` for, between [`MIN_READ_SPAN_BYTES`] and
    /// [`READ_SPAN_BYTES`] (at least `min_len`), within its segment and the written data;
    /// `None` when that cannot be had in one read (the caller reads the record alone). From the
    /// write ring when it holds `start`, else from the read-ahead cache (waiting for a read of
    /// it in flight), else with one O_DIRECT read kept in the cache (or copied, when the cache
    /// has no room).
    async fn read_span(&self, start: u64, min_len: u64, room: u64) -> Option<SpanRead> {
        let limit = self
            .commit_log
            .segment_end(start)?
            .min(self.commit_log.written_offset());
        let mut len = room
            .clamp(MIN_READ_SPAN_BYTES, READ_SPAN_BYTES)
            .min(limit.saturating_sub(start));
        if len < min_len {
            return None;
        }
        // In the write ring, stop at the chunk's end so the span is a slice, not a copy.
        if let Some(chunk_end) = self.commit_log.ring_chunk_end(start) {
            len = len.min(chunk_end - start).max(min_len);
            let bytes = self.commit_log.read(start, len).await.ok()?;
            return Some(SpanRead { from: start, bytes });
        }
        loop {
            match self.read_ahead.lookup(start, min_len) {
                Lookup::Hit(read) => return Some(read),
                Lookup::Reading => {
                    let began = std::time::Instant::now();
                    self.read_ahead.finished().await;
                    self.read_ahead.add_wait(began.elapsed());
                }
                Lookup::Miss => break,
            }
        }
        match self.read_ahead.reserve(start, len) {
            Some(ticket) => self.fill_span(ticket).await,
            None => {
                let bytes = self.commit_log.read(start, len).await.ok()?;
                Some(SpanRead { from: start, bytes })
            }
        }
    }

    /// Reads the ticket's range from its segment file into the read-ahead cache. Nothing is
    /// checked here: each record a pull takes from the span is checked as it is served
    /// ([`read_queue_record_from`](Self::read_queue_record_from)), and the span's records of
    /// other queues may never be.
    async fn fill_span(&self, ticket: ReadTicket) -> Option<SpanRead> {
        let read = match self
            .commit_log
            .read_from_segment(ticket.from, ticket.len)
            .await
        {
            Ok(read) => read,
            Err(error) => {
                // The pull reads its records one by one and reports what fails.
                tracing::debug!(from = ticket.from, len = ticket.len, %error, "CommitLog span read failed");
                return None;
            }
        };
        ticket.complete(Box::new(DirectRead(read)))
    }

    /// Reads ahead for a consumer of `queue` whose next pull starts at queue offset `next`
    /// (`next_entry` is that entry when the pull saw it) and is shaped like `pull`: the queue's
    /// entries up to [`ENTRIES_AHEAD`] past `next` (an O_DIRECT read once they are out of the
    /// queue's memory tail), and the CommitLog spans of its next [`PULLS_AHEAD`] pulls, found
    /// from those entries as the pulls will find them and read at once. The next pull's span
    /// is reserved before this returns when its entry is known, so that pull waits for it
    /// rather than reading the same bytes itself.
    fn start_read_ahead(
        inner: &Rc<Inner>,
        queue: Rc<ConsumeQueue>,
        topic: &str,
        queue_id: u32,
        next: u64,
        next_entry: Option<ConsumeQueueEntry>,
        pull: PullShape,
    ) {
        let first = next_entry.and_then(|entry| inner.reserve_read_ahead(&entry, pull.max_bytes));
        let inner = inner.clone();
        let topic = topic.to_owned();
        glommio::spawn_local(async move {
            let read_first = async {
                if let Some(ticket) = first {
                    let _ = inner.fill_span(ticket).await;
                }
            };
            let read_others = async {
                inner
                    .keep_entries_ahead(&queue, &topic, queue_id, next)
                    .await;
                let entries =
                    inner
                        .read_ahead
                        .peek_entries(&topic, queue_id, next, ENTRIES_AHEAD as usize);
                let commitlog_min = inner.commit_log.min_offset();
                for (start, min_len) in pull.starts(&entries, commitlog_min) {
                    if let Some(ticket) = inner.reserve_span(start, min_len, pull.max_bytes) {
                        let inner = inner.clone();
                        glommio::spawn_local(async move {
                            let _ = inner.fill_span(ticket).await;
                        })
                        .detach();
                    }
                }
            };
            futures_lite::future::zip(read_first, read_others).await;
        })
        .detach();
    }

    /// Reads `queue`'s entries on from where those kept for it end, when fewer than
    /// [`ENTRIES_AHEAD`] past `next` are kept.
    async fn keep_entries_ahead(
        &self,
        queue: &ConsumeQueue,
        topic: &str,
        queue_id: u32,
        next: u64,
    ) {
        let from = self
            .read_ahead
            .entries_end(topic, queue_id, next)
            .unwrap_or(next);
        if from >= next + ENTRIES_AHEAD {
            return;
        }
        let entries = queue
            .read(from, ENTRIES_AHEAD - (from - next))
            .await
            .unwrap_or_default();
        self.read_ahead.put_entries(topic, queue_id, from, entries);
    }

    /// Room in the read-ahead cache for the span from `entry`'s record, `room` bytes long
    /// within its segment's written bytes; `None` when the write ring or the cache holds it, a
    /// read of it is in flight, or the cache has no room.
    fn reserve_read_ahead(&self, entry: &ConsumeQueueEntry, room: u64) -> Option<ReadTicket> {
        if *entry == ConsumeQueueEntry::HOLE {
            return None;
        }
        // A record the span cannot hold is read alone by its pull.
        let record_len = u64::from(entry.size).min(self.record_cap());
        self.reserve_span(entry.commitlog_offset, record_len, room)
    }

    /// Room in the read-ahead cache for the span from physical offset `start` (where a record
    /// starts), `room` bytes long within its segment's written bytes and at least `min_len`;
    /// `None` when the write ring or the cache holds it, a read of it is in flight, or the
    /// cache has no room.
    fn reserve_span(&self, start: u64, min_len: u64, room: u64) -> Option<ReadTicket> {
        if start < self.commit_log.min_offset() || self.commit_log.ring_chunk_end(start).is_some() {
            return None;
        }
        let limit = self
            .commit_log
            .segment_end(start)?
            .min(self.commit_log.written_offset());
        let len = room
            .clamp(MIN_READ_SPAN_BYTES, READ_SPAN_BYTES)
            .min(limit.saturating_sub(start));
        if len == 0 || len < min_len || self.read_ahead.holds(start, len) {
            return None;
        }
        self.read_ahead.reserve(start, len)
    }

    /// Reads the record a ConsumeQueue entry points to and checks that it is that record.
    async fn read_queue_record(
        &self,
        topic: &str,
        queue_id: u32,
        queue_offset: u64,
        entry: &ConsumeQueueEntry,
    ) -> Result<Bytes, StoreError> {
        self.read_queue_record_from(topic, queue_id, queue_offset, entry, None, Crcs::Checked)
            .await
    }

    /// Reads and validates the record `entry` names; `first_read` is its bytes when already
    /// read (as the entry's size says, from a span); `crcs` whether its CRCs are checked here
    /// or left to the client.
    async fn read_queue_record_from(
        &self,
        topic: &str,
        queue_id: u32,
        queue_offset: u64,
        entry: &ConsumeQueueEntry,
        first_read: Option<Bytes>,
        crcs: Crcs,
    ) -> Result<Bytes, StoreError> {
        let read = |size: u64| {
            let commit_log = &self.commit_log;
            async move {
                commit_log
                    .read(entry.commitlog_offset, size)
                    .await
                    .map_err(io_error(format!(
                        "CommitLog read at {}",
                        entry.commitlog_offset
                    )))
            }
        };
        let readable = self
            .commit_log
            .write_offset()
            .saturating_sub(entry.commitlog_offset);
        // Sizes from disk are bounded before they are read: a damaged entry's size, and the
        // record's own, at most the largest record this store takes.
        let cap = self.record_cap();
        let mut bytes = match first_read {
            Some(read) => read,
            None => read(u64::from(entry.size).min(readable).min(cap)).await?,
        };
        // The CommitLog is the truth: when the entry's size disagrees with the record's own
        // (a damaged ConsumeQueue), the record is read by its own size, so a client never gets
        // a cut record or the next record's bytes.
        let own_size = bytes
            .get(..4)
            .map(|b| u64::from(u32::from_be_bytes([b[0], b[1], b[2], b[3]])));
        if let Some(own_size) = own_size.filter(|&n| n != bytes.len() as u64) {
            if own_size > 0 && own_size <= readable.min(cap) {
                warn!(
                    topic,
                    queue_id,
                    queue_offset,
                    entry_size = entry.size,
                    record_size = own_size,
                    "ConsumeQueue entry size disagrees with its record; serving the record by its own size (run `shardmq-broker verify`)"
                );
                bytes = read(own_size).await?;
            }
        }
        let own_size = own_size.unwrap_or(0);
        if own_size > cap {
            return Err(StoreError::Corrupt(format!(
                "record at CommitLog offset {} ({topic}/{queue_id} entry {queue_offset}) says it is {own_size} bytes, over the largest this store reads ({cap}); if max_message_bytes was lowered since it was written, raise it again to read it, else run `shardmq-broker verify`",
                entry.commitlog_offset
            )));
        }
        let damaged = |e: RecordError| {
            StoreError::Corrupt(format!(
                "record at CommitLog offset {} ({topic}/{queue_id} entry {queue_offset}) is damaged: {e}; run `shardmq-broker verify`",
                entry.commitlog_offset
            ))
        };
        // Which record this is, by its head. For a client's pull that is all the store reads
        // of it: the client checks the rest end to end (see `Crcs::LeftToClient`).
        let head = read_head(&bytes).map_err(damaged)?;
        let is_named = head.queue_offset == queue_offset
            && head.queue_id == queue_id
            && head.physical_offset == entry.commitlog_offset;
        let topic_matches = match crcs {
            Crcs::LeftToClient => true,
            Crcs::Checked => {
                // A record read from disk is validated whole; one still in the write ring was
                // encoded and checked by this process moments ago.
                let from_ring = self.commit_log.is_in_ring(
                    entry.commitlog_offset,
                    entry.commitlog_offset + bytes.len() as u64,
                );
                let view = if from_ring {
                    RecordView::parse_unchecked(&bytes)
                } else {
                    decode_message(&bytes)
                }
                .map_err(damaged)?;
                view.topic() == topic
            }
        };
        if !is_named || !topic_matches {
            return Err(StoreError::Corrupt(format!(
                "ConsumeQueue {topic}/{queue_id} entry {queue_offset} points at CommitLog offset {} which holds another record",
                entry.commitlog_offset
            )));
        }
        if head.total_size as usize != bytes.len() {
            return Err(StoreError::Corrupt(format!(
                "ConsumeQueue {topic}/{queue_id} entry {queue_offset} covers {} bytes but the record at CommitLog offset {} is {} bytes",
                bytes.len(),
                entry.commitlog_offset,
                head.total_size
            )));
        }
        Ok(bytes)
    }

    async fn read_record_at(&self, physical_offset: u64) -> Result<Bytes, StoreError> {
        let (min, end) = (self.commit_log.min_offset(), self.commit_log.write_offset());
        if physical_offset < min || physical_offset + 8 > end {
            return Err(StoreError::Corrupt(format!(
                "physical offset {physical_offset} is outside the CommitLog [{min}, {end})"
            )));
        }
        let context = || format!("CommitLog read at {physical_offset}");
        let head = self
            .commit_log
            .read(physical_offset, 8)
            .await
            .map_err(io_error(context()))?;
        // The offset comes from the caller (an offset message id): the size found there is
        // checked before anything is read for it, so a query aimed inside a body reads 8 bytes,
        // not whatever length those bytes claim.
        let size = u64::from(peek_total_size(&head).unwrap_or(0));
        let magic = head
            .get(4..8)
            .map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]));
        if magic != Some(MESSAGE_MAGIC_CODE)
            || size < MIN_RECORD_BYTES as u64
            || physical_offset + size > end
        {
            return Err(StoreError::Corrupt(format!(
                "no record starts at physical offset {physical_offset}"
            )));
        }
        let limit = self.record_cap();
        if size > limit {
            return Err(StoreError::RecordTooLarge { size, limit });
        }
        let bytes = self
            .commit_log
            .read(physical_offset, size)
            .await
            .map_err(io_error(context()))?;
        let view = decode_message(&bytes)?;
        if view.physical_offset() != physical_offset {
            return Err(StoreError::Corrupt(format!(
                "no record starts at physical offset {physical_offset}"
            )));
        }
        Ok(bytes)
    }

    async fn query_index(
        &self,
        hash: u64,
        begin_ms: i64,
        end_ms: i64,
        max_results: usize,
        is_match: impl Fn(&RecordView<'_>) -> bool,
    ) -> Result<Vec<Bytes>, StoreError> {
        // Candidates beyond the results allow for hash collisions and cut records, not more.
        let max_candidates = max_results
            .saturating_mul(2)
            .clamp(16, MAX_INDEX_CANDIDATES);
        let lookup = self
            .index
            .lookup(
                hash,
                begin_ms,
                end_ms,
                max_candidates,
                self.config.max_index_scan_entries_per_query,
            )
            .await
            .map_err(io_error("index"))?;
        if lookup.is_partial {
            warn!(
                begin_ms,
                end_ms,
                scanned = self.config.max_index_scan_entries_per_query,
                "index query stopped at its scan budget; older entries of the range were not searched (narrow the time range)"
            );
        }
        let mut found = Vec::new();
        let mut found_bytes = 0usize;
        for offset in lookup.offsets {
            if found.len() >= max_results || found_bytes >= MAX_QUERY_ANSWER_BYTES {
                break;
            }
            // A candidate may point at a deleted or cut record: that is a miss, not an error.
            let Ok(bytes) = self.read_record_at(offset).await else {
                continue;
            };
            let is_hit = decode_message(&bytes).is_ok_and(|view| {
                let ts = view.store_timestamp_ms();
                ts >= begin_ms && ts <= end_ms && is_match(&view)
            });
            if is_hit {
                found_bytes += bytes.len();
                found.push(bytes);
            }
        }
        Ok(found)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(offset: u64, tags_hash: u64) -> ConsumeQueueEntry {
        ConsumeQueueEntry {
            commitlog_offset: offset * 100,
            size: 100,
            tags_hash,
        }
    }

    #[test]
    fn the_next_pulls_start_where_the_pulls_will_start() {
        let entries: Vec<_> = (10..20).map(|offset| entry(offset, 7)).collect();
        let shape =
            |max_messages, max_bytes| PullShape::new(max_messages, max_bytes, &TagFilter::All);
        // 250 bytes: two records a pull.
        assert_eq!(
            shape(100, 250).starts(&entries, 0),
            vec![(1000, 100), (1200, 100)]
        );
        // One message a pull.
        assert_eq!(
            shape(1, 1 << 20).starts(&entries, 0),
            vec![(1000, 100), (1100, 100)]
        );
        // Entries gone (below the log's start, or holes) are skipped as a pull skips them.
        let mut holed = entries.clone();
        holed[0] = ConsumeQueueEntry::HOLE;
        assert_eq!(
            shape(100, 250).starts(&holed, 1050),
            vec![(1100, 100), (1300, 100)]
        );
        // So are entries the pull's filter leaves out.
        let mut tagged = entries.clone();
        tagged[1].tags_hash = 9;
        let filtered = PullShape::new(1, 1 << 20, &TagFilter::parse("a"));
        let wanted = match &filtered.filter {
            TagFilter::Tags { hashes, .. } => hashes[0],
            TagFilter::All | TagFilter::Sql(_) => unreachable!("a tag was given"),
        };
        tagged[3].tags_hash = wanted;
        tagged[5].tags_hash = wanted;
        assert_eq!(filtered.starts(&tagged, 0), vec![(1300, 100), (1500, 100)]);
    }
}
