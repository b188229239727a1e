//! The CommitLog of one storage shard: every record of every queue the shard owns, appended in
//! one sequence of fixed-size segment files.
//!
//! Owns the segment files (`<shard>/commitlog/<20-digit start offset>`), the global write
//! position, rollover with a blank filler, the write ring (`write_ring`) holding the newest bytes,
//! the write-behind plan (which O_DIRECT writes to start, several in flight, never overlapping),
//! the written and synced offsets, reads by physical offset, recovery's scan of the tail, and
//! deleting whole old segments. It knows nothing of queues, indexes or sockets: records arrive
//! encoded and leave as bytes. It runs no task of its own: the message store's flush loop asks
//! it for write jobs, runs them and reports their outcome (see `docs/storage-format.md`,
//! "Write path").
//!
//! Offsets, always `synced <= written <= issued_to <= write_offset`: a byte below `written` has
//! completed its O_DIRECT write (it is in the kernel; a crash of the process cannot lose it), a
//! byte below `synced` has been `fdatasync`ed (a power loss cannot lose it either).
//!
//! Size: about 780 lines of code and 120 of unit tests; kept whole because segments, the write
//! ring hand-off and the recovery scan share one invariant (the log's offsets) that is easiest
//! to check in one place.

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, VecDeque};
use std::io;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use glommio::io::{DmaBuffer, DmaFile, ReadResult};
use tracing::{info, warn};

use super::append_file::{
    align_down, align_up, open_read_write, open_read_write_dsync, read_exact_at,
    DMA_ALIGNMENT_BYTES,
};
use super::record::{blank_header, RecordView, BLANK_MIN_BYTES};
use super::scan::{scan_window, ScanStop};
use super::write_ring::WriteRing;

/// Window of the recovery scan; a record larger than this extends the window to fit it.
const SCAN_WINDOW_BYTES: u64 = 4 << 20;

/// File name of the segment starting at `base`: 20 digits, zero padded, as RocketMQ names them.
pub fn segment_file_name(base: u64) -> String {
    format!("{base:020}")
}

/// Parses a segment file name; `None` for anything else in the directory.
pub fn parse_segment_file_name(name: &str) -> Option<u64> {
    (name.len() == 20 && name.bytes().all(|b| b.is_ascii_digit()))
        .then(|| name.parse().ok())
        .flatten()
}

/// Lists `(base offset, path)` of the segment files in `dir`, oldest first.
pub fn list_segments(dir: &Path) -> io::Result<Vec<(u64, PathBuf)>> {
    let mut segments = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        if let Some(base) = entry.file_name().to_str().and_then(parse_segment_file_name) {
            segments.push((base, entry.path()));
        }
    }
    segments.sort();
    Ok(segments)
}

/// What the recovery scan found.
#[derive(Debug, Clone, Default)]
pub struct RecoveryScan {
    /// Physical offset where valid data ends (the new write position).
    pub end_offset: u64,
    /// Records validated by the scan.
    pub records_scanned: u64,
    /// Where and why the data was cut, if it was.
    pub truncated_at: Option<(u64, String)>,
    /// Bytes thrown away after the cut (in the cut segment and any later ones).
    pub discarded_bytes: u64,
}

/// Most O_DIRECT writes of one CommitLog in flight at once (write-behind).
const MAX_WRITES_IN_FLIGHT: usize = 4;

/// Largest write-ring chunk (and so the largest single write).
const MAX_CHUNK_BYTES: u64 = 1 << 20;

/// One segment file, opened on first use.
struct Segment {
    base: u64,
    path: PathBuf,
    file: RefCell<Option<Rc<DmaFile>>>,
    /// Bytes the file is known to have allocated (written or pre-allocated).
    allocated_len: Cell<Option<u64>>,
    /// Opens of the file in flight: retention does not delete the segment meanwhile (an open
    /// that completes after the unlink would create the file again, or fail inside glommio).
    opens_in_flight: Cell<u32>,
    writes: SegmentWrites,
}

/// How a segment's O_DIRECT writes end.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SegmentWrites {
    /// A completed write is in the kernel and on the device's volatile path; an `fdatasync`
    /// makes it durable (async flush: one `fdatasync` every `flush_interval_ms`).
    Plain,
    /// The file is opened with `O_DSYNC`: a write completes once its bytes and the metadata
    /// needed to read them back are durable (a FUA write or a cache flush by the kernel), so
    /// no `fdatasync` follows (sync flush: one I/O per round instead of two in series).
    Durable,
}

impl Segment {
    fn new(base: u64, path: PathBuf, writes: SegmentWrites) -> Segment {
        Segment {
            base,
            path,
            file: RefCell::new(None),
            allocated_len: Cell::new(None),
            opens_in_flight: Cell::new(0),
            writes,
        }
    }

    async fn file(&self) -> io::Result<Rc<DmaFile>> {
        if let Some(file) = self.file.borrow().as_ref() {
            return Ok(file.clone());
        }
        let is_new = !self.path.exists();
        self.opens_in_flight.set(self.opens_in_flight.get() + 1);
        let opened = match self.writes {
            SegmentWrites::Plain => open_read_write(&self.path).await,
            SegmentWrites::Durable => open_read_write_dsync(&self.path).await,
        };
        self.opens_in_flight.set(self.opens_in_flight.get() - 1);
        let file = Rc::new(opened?);
        if is_new {
            // The new name must survive a crash as well as the data written under it.
            if let Some(dir) = self.path.parent() {
                std::fs::File::open(dir)?.sync_all()?;
            }
        }
        *self.file.borrow_mut() = Some(file.clone());
        Ok(file)
    }

    async fn close(&self) {
        let file = self.file.borrow_mut().take();
        if let Some(file) = file.and_then(|f| Rc::try_unwrap(f).ok()) {
            let _ = file.close().await;
        }
    }
}

/// One planned O_DIRECT write: `[from, data_to)` of the CommitLog, within one chunk; `from` is
/// block aligned and the write covers whole blocks (zero padded past `data_to`).
pub struct WriteJob {
    segment: Rc<Segment>,
    from: u64,
    data_to: u64,
    /// A full write-ring chunk, written as it is, or a copy of part of a chunk, zero padded to
    /// the block (a partly filled chunk).
    buffer: Rc<DmaBuffer>,
}

impl WriteJob {
    pub fn from(&self) -> u64 {
        self.from
    }
    pub fn data_to(&self) -> u64 {
        self.data_to
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum WriteState {
    Running,
    Done,
    Failed,
}

struct InFlight {
    from: u64,
    data_to: u64,
    state: WriteState,
}

/// See the module documentation.
pub struct CommitLog {
    dir: PathBuf,
    segment_bytes: u64,
    hot_tail_bytes: u64,
    writes: SegmentWrites,
    /// Pre-allocate segment files this far past the data (0: never).
    preallocate_ahead_bytes: Cell<u64>,
    segments: RefCell<BTreeMap<u64, Rc<Segment>>>,
    ring: RefCell<WriteRing>,
    /// One past the last appended byte.
    write_offset: Cell<u64>,
    /// One past the last byte handed to a write.
    issued_to: Cell<u64>,
    /// Every byte below this is written (in the kernel: a process crash cannot lose it).
    written: Cell<u64>,
    /// Every byte below this is `fdatasync`ed.
    synced: Cell<u64>,
    in_flight: RefCell<VecDeque<InFlight>>,
    /// The first write failure since the last rewind.
    write_error: RefCell<Option<io::Error>>,
    /// `None`: a partly filled chunk is written as soon as it overlaps no write in flight (an
    /// append waits for its write). `Some(linger)`: appends complete in the journal, and a
    /// partly filled chunk is let fill, to be written whole from the ring without a copy; it
    /// is written as it is only when nothing is in flight and its oldest unwritten byte has
    /// waited `linger` (or the log is draining).
    partial_chunk_linger: Cell<Option<Duration>>,
    /// When the oldest appended byte not yet issued to a write was appended.
    unissued_since: Cell<Option<Instant>>,
    /// Closing: every byte is written at once, partly filled chunks included.
    is_draining: Cell<bool>,
}

/// Writes a record into its place in the write ring, every byte: called with the record's
/// index in its batch, its physical offset, the record and its destination.
pub type RecordCopy<'a> = dyn FnMut(usize, u64, &[u8], &mut [u8]) + 'a;

impl CommitLog {
    pub async fn open(
        dir: PathBuf,
        segment_bytes: u64,
        hot_tail_bytes: u64,
        scan_from: u64,
        writes: SegmentWrites,
        on_record: &mut dyn FnMut(u64, &RecordView<'_>),
    ) -> io::Result<(CommitLog, RecoveryScan)> {
        assert!(
            segment_bytes.is_multiple_of(DMA_ALIGNMENT_BYTES),
            "segment size must be 4 KiB aligned"
        );
        std::fs::create_dir_all(&dir)?;
        let files = list_segments(&dir)?;
        let mut scan = RecoveryScan::default();
        let mut kept: Vec<(u64, PathBuf, u64)> = Vec::new();
        let mut is_cut = false;
        for (index, (base, path)) in files.iter().enumerate() {
            let file_len = std::fs::metadata(path)?.len();
            if is_cut {
                scan.discarded_bytes += file_len;
                warn!(segment = %path.display(), "deleting segment after the recovery cut");
                std::fs::remove_file(path)?;
                continue;
            }
            let next_base = files.get(index + 1).map(|(b, _)| *b);
            if base + segment_bytes <= scan_from && next_base.is_some_and(|n| n <= scan_from) {
                // Wholly before the durable point: trusted, and sealed (not the last segment).
                kept.push((*base, path.clone(), segment_bytes));
                continue;
            }
            // A checkpoint beyond this file's data means the file lost bytes the checkpoint
            // called durable: rescan the whole segment rather than trust it.
            let start = if scan_from <= base + file_len {
                scan_from.saturating_sub(*base)
            } else {
                0
            };
            let stop = scan_segment(
                path,
                *base,
                start,
                segment_bytes,
                file_len,
                &mut scan,
                on_record,
            )
            .await?;
            match stop {
                ScanStop::SegmentEnd { .. } if next_base.is_some() => {
                    kept.push((*base, path.clone(), segment_bytes));
                    if next_base != Some(base + segment_bytes) {
                        scan.truncated_at = Some((
                            base + segment_bytes,
                            "segment missing after a full one".into(),
                        ));
                        is_cut = true;
                    }
                }
                ScanStop::SegmentEnd { .. } => kept.push((*base, path.clone(), segment_bytes)),
                ScanStop::DataEnd { position } => {
                    kept.push((*base, path.clone(), position));
                    if next_base.is_some() {
                        scan.truncated_at =
                            Some((base + position, "data ends before the segment does".into()));
                        is_cut = true;
                    }
                }
                ScanStop::Invalid { position, error } => {
                    warn!(offset = base + position, %error, "cutting the CommitLog at an invalid record");
                    scan.discarded_bytes += file_len.saturating_sub(position);
                    scan.truncated_at = Some((base + position, error.to_string()));
                    kept.push((*base, path.clone(), position));
                    is_cut = true;
                }
                ScanStop::NeedMore { .. } => {
                    unreachable!("scan_segment reads to the end of the file")
                }
            }
        }

        let chunk_bytes = MAX_CHUNK_BYTES.min(1 << segment_bytes.trailing_zeros());
        let last = kept.len().saturating_sub(1);
        let mut segments = BTreeMap::new();
        let mut write_offset = 0;
        let mut partial_block: Option<Bytes> = None;
        for (index, (base, path, valid_len)) in kept.into_iter().enumerate() {
            let segment = Rc::new(Segment::new(base, path, writes));
            write_offset = base + valid_len;
            if index == last {
                // Cut garbage after the valid end so a later scan never mistakes it for data.
                let on_disk = file_len_on_disk(&segment.path)?;
                let file = segment.file().await?;
                if on_disk > valid_len && valid_len < segment_bytes {
                    file.truncate(valid_len).await.map_err(io::Error::from)?;
                    file.fdatasync().await.map_err(io::Error::from)?;
                }
                segment.allocated_len.set(Some(valid_len));
                // The partial last block must be in memory: the next write rewrites it whole.
                let block_start = align_down(valid_len);
                if block_start < valid_len && valid_len < segment_bytes {
                    let read = file
                        .read_at(block_start, (valid_len - block_start) as usize)
                        .await
                        .map_err(io::Error::from)?;
                    partial_block = Some(Bytes::copy_from_slice(&read));
                }
            }
            segments.insert(base, segment);
        }
        let mut ring = WriteRing::new(chunk_bytes, write_offset);
        ring.use_registered_memory();
        if let Some(partial) = partial_block {
            ring.prepend_partial(&partial);
        }
        let commit_log = CommitLog {
            dir,
            segment_bytes,
            hot_tail_bytes,
            writes,
            preallocate_ahead_bytes: Cell::new(0),
            segments: RefCell::new(segments),
            ring: RefCell::new(ring),
            write_offset: Cell::new(write_offset),
            issued_to: Cell::new(write_offset),
            written: Cell::new(write_offset),
            synced: Cell::new(write_offset),
            in_flight: RefCell::new(VecDeque::new()),
            write_error: RefCell::new(None),
            partial_chunk_linger: Cell::new(None),
            unissued_since: Cell::new(None),
            is_draining: Cell::new(false),
        };
        scan.end_offset = write_offset;
        if let Some((offset, why)) = &scan.truncated_at {
            warn!(offset, why = %why, discarded_bytes = scan.discarded_bytes, "CommitLog recovered with a cut");
        }
        info!(
            end_offset = scan.end_offset,
            records_scanned = scan.records_scanned,
            "CommitLog opened"
        );
        Ok((commit_log, scan))
    }

    /// Pre-allocates segment files (`fallocate`) up to `ahead_bytes` past the data, so that the
    /// `fdatasync` after a write seldom has to commit a larger file size.
    pub fn preallocate_ahead(&self, ahead_bytes: u64) {
        self.preallocate_ahead_bytes.set(align_down(ahead_bytes));
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn segment_bytes(&self) -> u64 {
        self.segment_bytes
    }

    /// The physical offset the next record will get (unless it rolls over).
    pub fn write_offset(&self) -> u64 {
        self.write_offset.get()
    }

    /// Every byte below this has completed its O_DIRECT write.
    pub fn written_offset(&self) -> u64 {
        self.written.get()
    }

    /// Every byte below this is durable (`fdatasync`ed, or written with `O_DSYNC`).
    pub fn synced_offset(&self) -> u64 {
        self.synced.get()
    }

    /// The oldest physical offset still stored.
    pub fn min_offset(&self) -> u64 {
        // Before the first write creates a segment file, the log's bytes are in the ring only
        // (they can be complete by then: in the journal under async flush).
        self.segments
            .borrow()
            .keys()
            .next()
            .copied()
            .unwrap_or_else(|| self.ring.borrow().valid_from())
    }

    /// Largest record a segment can take (leaving room for a blank filler).
    pub fn max_record_bytes(&self) -> u64 {
        self.segment_bytes - BLANK_MIN_BYTES as u64
    }

    fn segment_base(&self, offset: u64) -> u64 {
        offset - offset % self.segment_bytes
    }

    fn segment(&self, base: u64) -> Rc<Segment> {
        self.segments
            .borrow_mut()
            .entry(base)
            .or_insert_with(|| {
                let path = self.dir.join(segment_file_name(base));
                Rc::new(Segment::new(base, path, self.writes))
            })
            .clone()
    }

    /// Appends the records of `batch` (lengths in `record_lens`, in order), copying each once
    /// into the write ring. `copy(index, physical_offset, record, destination)` writes each
    /// record into its place in the ring (every byte) before it becomes readable, so the
    /// caller copies it with the offsets patched in; `batch` itself is not changed. Rolls over to a new segment, padding the
    /// current one with a blank filler, whenever the next record does not fit.
    pub fn append_batch(
        &self,
        batch: &[u8],
        record_lens: &mut dyn Iterator<Item = u32>,
        copy: &mut RecordCopy<'_>,
    ) {
        self.note_unissued();
        let mut ring = self.ring.borrow_mut();
        let mut at = 0usize;
        for (index, len) in record_lens.enumerate() {
            let len = u64::from(len);
            debug_assert!(len <= self.max_record_bytes());
            let mut position = self.write_offset.get();
            let segment_base = self.segment_base(position);
            if position - segment_base + len + BLANK_MIN_BYTES as u64 > self.segment_bytes {
                let segment_end = segment_base + self.segment_bytes;
                ring.append(&blank_header(segment_end - position));
                ring.append_zeros(segment_end - position - BLANK_MIN_BYTES as u64);
                self.write_offset.set(segment_end);
                info!(
                    segment = segment_base,
                    "CommitLog segment full, rolling over"
                );
                position = segment_end;
            }
            let record = &batch[at..at + len as usize];
            ring.append_filled(record.len(), |destination| {
                copy(index, position, record, destination)
            });
            at += len as usize;
            self.write_offset.set(position + len);
        }
        debug_assert_eq!(at, batch.len());
        debug_assert_eq!(ring.end(), self.write_offset.get());
    }

    /// Appends bytes that already are records and segment-end fillers, laid out by another
    /// CommitLog with the same segment size (a replica's append): the same bytes land at the
    /// same offsets. The caller has checked that they continue this log and are valid.
    pub fn append_raw(&self, bytes: &[u8]) {
        self.note_unissued();
        self.ring.borrow_mut().append(bytes);
        self.write_offset
            .set(self.write_offset.get() + bytes.len() as u64);
        debug_assert_eq!(self.ring.borrow().end(), self.write_offset.get());
    }

    /// Plans the next O_DIRECT write, if one may start now: a full chunk whenever one is
    /// waiting (several in flight), a partly filled chunk whenever it overlaps no write in
    /// flight (with a linger, only as `partial_chunk_wait` allows: see
    /// `set_partial_chunk_linger`). Writes never overlap: a write that would rewrite a block
    /// still being written waits for it.
    pub fn next_write_job(&self) -> Option<WriteJob> {
        let issued = self.issued_to.get();
        let end = self.write_offset.get();
        let in_flight = self.in_flight.borrow().len();
        if issued >= end || in_flight >= MAX_WRITES_IN_FLIGHT || self.write_error.borrow().is_some()
        {
            return None;
        }
        let from = align_down(issued);
        if from < issued && in_flight > 0 {
            return None;
        }
        let ring = self.ring.borrow();
        let chunk_bytes = ring.chunk_bytes();
        let chunk_base = issued - issued % chunk_bytes;
        let chunk_end = chunk_base + chunk_bytes;
        // A partly filled chunk (the newest bytes, nothing queued after them) starts as soon as
        // it overlaps no write in flight, when appends wait for their write: at a block
        // boundary behind full chunks being written, it does not wait for them (a small send
        // is answered sooner). When appends complete in the journal it waits until nothing is in
        // flight, filling meanwhile: a chunk written whole goes out from the ring, uncopied.
        let data_to = end.min(chunk_end);
        if data_to < chunk_end && self.partial_chunk_wait().is_some() {
            return None;
        }
        let buffer = if from == chunk_base && data_to == chunk_end {
            ring.full_chunk(chunk_base)
        } else {
            let write_len = (align_up(data_to) - from) as usize;
            let data_len = (data_to - from) as usize;
            let mut buffer = glommio::allocate_dma_buffer(write_len);
            let out = buffer.as_bytes_mut();
            ring.copy_to(from, &mut out[..data_len]);
            out[data_len..].fill(0);
            Rc::new(buffer)
        };
        drop(ring);
        self.issued_to.set(data_to);
        if data_to == end {
            self.unissued_since.set(None);
        }
        self.in_flight.borrow_mut().push_back(InFlight {
            from,
            data_to,
            state: WriteState::Running,
        });
        Some(WriteJob {
            segment: self.segment(self.segment_base(from)),
            from,
            data_to,
            buffer,
        })
    }

    /// Performs a planned write; then [`CommitLog::finish_write`] must be told its outcome.
    pub async fn write(&self, job: WriteJob) -> io::Result<()> {
        let file = job.segment.file().await?;
        let position = job.from - job.segment.base;
        let expected = job.buffer.len() as u64;
        self.preallocate(&job.segment, &file, position + expected)
            .await;
        let mut done = file
            .write_rc_at(job.buffer.clone(), position)
            .await
            .map_err(io::Error::from)? as u64;
        // A short write continues from where it stopped (block aligned) and either goes
        // through or fails with the real cause (ENOSPC) for the caller to report.
        while done < expected {
            let from = align_down(done);
            let bytes = job.buffer.as_bytes();
            let mut rest = glommio::allocate_dma_buffer((expected - from) as usize);
            rest.as_bytes_mut().copy_from_slice(&bytes[from as usize..]);
            let more = file
                .write_at(rest, position + from)
                .await
                .map_err(io::Error::from)? as u64;
            if more == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::WriteZero,
                    format!(
                        "O_DIRECT write to {} made no progress at {}",
                        job.segment.path.display(),
                        position + from
                    ),
                ));
            }
            done = from + more;
        }
        Ok(())
    }

    async fn preallocate(&self, segment: &Segment, file: &DmaFile, write_end: u64) {
        let ahead = self.preallocate_ahead_bytes.get();
        if ahead == 0 {
            return;
        }
        let allocated = match segment.allocated_len.get() {
            Some(len) => len,
            None => file_len_on_disk(&segment.path).unwrap_or(0),
        };
        segment.allocated_len.set(Some(allocated));
        if write_end <= allocated {
            return;
        }
        let to = (write_end + ahead).min(self.segment_bytes);
        match file.pre_allocate(to, false).await {
            Ok(()) => segment.allocated_len.set(Some(to)),
            Err(e) => {
                // A full disk: data writes go on without preparation (and fail on their own).
                tracing::debug!(segment = %segment.path.display(), error = %e, "cannot pre-allocate the segment");
                segment.allocated_len.set(Some(write_end));
            }
        }
    }

    /// Records the outcome of the write that started at `from`; advances the written offset
    /// over every write completed in order. Returns whether it advanced.
    pub fn finish_write(&self, from: u64, outcome: io::Result<()>) -> bool {
        let mut in_flight = self.in_flight.borrow_mut();
        let Some(entry) = in_flight
            .iter_mut()
            .find(|e| e.from == from && e.state == WriteState::Running)
        else {
            debug_assert!(false, "finished a write that was not running");
            return false;
        };
        match outcome {
            Ok(()) => entry.state = WriteState::Done,
            Err(e) => {
                entry.state = WriteState::Failed;
                let mut error = self.write_error.borrow_mut();
                if error.is_none() {
                    *error = Some(e);
                }
            }
        }
        let mut advanced = false;
        while in_flight
            .front()
            .is_some_and(|e| e.state == WriteState::Done)
        {
            let done = in_flight.pop_front().expect("front");
            if done.data_to > self.written.get() {
                self.written.set(done.data_to);
                if self.writes == SegmentWrites::Durable {
                    self.synced.set(done.data_to);
                }
                advanced = true;
            }
        }
        drop(in_flight);
        if advanced {
            self.trim_ring();
        }
        advanced
    }

    /// After a failed write, once no write is running: takes the error and plans the next
    /// writes from the written offset again (a write after the failed one may have gone
    /// through; writing it again is harmless).
    pub fn take_write_error(&self) -> Option<io::Error> {
        let mut in_flight = self.in_flight.borrow_mut();
        if in_flight.iter().any(|e| e.state == WriteState::Running) {
            return None;
        }
        let error = self.write_error.borrow_mut().take()?;
        in_flight.clear();
        self.issued_to.set(self.written.get());
        Some(error)
    }

    /// Whether writes are planned or running.
    pub fn has_writes_in_flight(&self) -> bool {
        !self.in_flight.borrow().is_empty()
    }

    /// `fdatasync`s every segment holding written bytes not yet synced (none with
    /// [`SegmentWrites::Durable`]: what is written is synced). Returns the offset now synced.
    pub async fn sync(&self) -> io::Result<u64> {
        let target = self.written.get();
        let from = self.synced.get();
        if target <= from {
            return Ok(from);
        }
        let bases: Vec<u64> = self
            .segments
            .borrow()
            .range(self.segment_base(from)..target)
            .map(|(base, _)| *base)
            .collect();
        for base in bases {
            let segment = self.segment(base);
            segment.file().await?.fdatasync().await?;
        }
        self.synced.set(self.synced.get().max(target));
        Ok(target)
    }

    /// Keeps in the ring what is not yet written (a rewrite after a failure needs it) and the
    /// newest `hot_tail_bytes`.
    fn trim_ring(&self) {
        let end = self.write_offset.get();
        let keep_from = align_down(self.written.get()).min(end.saturating_sub(self.hot_tail_bytes));
        self.ring.borrow_mut().trim_below(keep_from);
    }

    /// How partly filled chunks are written: `None` (the default) as soon as they overlap no
    /// write in flight, for appends that wait for their write; `Some(linger)` only when
    /// nothing is in flight and their oldest byte has waited `linger`, for appends the journal
    /// completes (a chunk let fill goes out whole from the ring; one written in parts is
    /// copied for each part).
    pub fn set_partial_chunk_linger(&self, linger: Option<Duration>) {
        self.partial_chunk_linger.set(linger);
    }

    /// From now on every byte is written without lingering (the store is closing).
    pub fn drain(&self) {
        self.is_draining.set(true);
    }

    /// Whether the newest, partly filled chunk is held back now, and for how long at most
    /// (zero: until a write in flight ends); `None` when it may be written.
    pub fn partial_chunk_wait(&self) -> Option<Duration> {
        let linger = self.partial_chunk_linger.get()?;
        if self.is_draining.get() {
            return None;
        }
        if !self.in_flight.borrow().is_empty() {
            return Some(Duration::ZERO);
        }
        let waited = self.unissued_since.get()?.elapsed();
        (waited < linger).then(|| linger - waited)
    }

    fn note_unissued(&self) {
        if self.unissued_since.get().is_none() {
            self.unissued_since.set(Some(Instant::now()));
        }
    }

    /// Calls `visit(offset, bytes)` for the bytes `[from, to)` in the write ring, a chunk's
    /// part at a time (every byte not yet written is there).
    pub fn visit_ring(&self, from: u64, to: u64, visit: &mut dyn FnMut(u64, &[u8])) {
        self.ring.borrow().visit(from, to, visit);
    }

    /// Whether `[from, to)` is in the write ring: bytes this process appended and still holds
    /// (reads of them never touch the disk).
    pub fn is_in_ring(&self, from: u64, to: u64) -> bool {
        let ring = self.ring.borrow();
        from >= ring.valid_from() && to <= ring.end()
    }

    /// End of the write-ring chunk that holds `offset`, when the ring holds it: a read that
    /// stops there is a slice of the ring, with no copy.
    pub fn ring_chunk_end(&self, offset: u64) -> Option<u64> {
        let ring = self.ring.borrow();
        (offset >= ring.valid_from() && offset < ring.end())
            .then(|| (offset - offset % ring.chunk_bytes() + ring.chunk_bytes()).min(ring.end()))
    }

    /// Reads `len` bytes at physical offset `offset` (a record never spans segments): from the
    /// write ring when they are there (a slice of it when they lie in one chunk), else from
    /// the segment file with an O_DIRECT read.
    pub async fn read(&self, offset: u64, len: u64) -> io::Result<Bytes> {
        let end = offset
            .checked_add(len)
            .filter(|&e| e <= self.write_offset.get());
        let Some(end) = end else {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!(
                    "read of {len} bytes at {offset} is past the CommitLog end ({})",
                    self.write_offset.get()
                ),
            ));
        };
        loop {
            if let Some(bytes) = self.ring.borrow().read(offset, end) {
                return Ok(bytes);
            }
            let written = self.written.get();
            if end <= written {
                break;
            }
            if offset >= written {
                return Err(io::Error::other(format!(
                    "CommitLog bytes [{offset}, {end}) are neither written nor in the write ring"
                )));
            }
            // The range begins on disk and ends in the write ring, whose bytes are not in
            // their segment file yet (there they still read as zeros): the two parts, joined.
            let on_disk = self.read_from_disk(offset, written - offset).await?;
            let Some(in_ring) = self.ring.borrow().read(written, end) else {
                // Written and trimmed from the ring while the disk part was read: again.
                continue;
            };
            let mut joined = BytesMut::with_capacity(len as usize);
            joined.extend_from_slice(&on_disk);
            joined.extend_from_slice(&in_ring);
            return Ok(joined.freeze());
        }
        self.read_from_disk(offset, len).await
    }

    /// Reads `[offset, offset + len)`, which must be written, from its segment file.
    async fn read_from_disk(&self, offset: u64, len: u64) -> io::Result<Bytes> {
        let segment = self.segment_holding(offset)?;
        let file = segment.file().await?;
        read_exact_at(&file, offset - segment.base, len, &segment.path).await
    }

    /// Reads `[offset, offset + len)` from its segment file with one O_DIRECT read and returns
    /// the read's own buffer (no copy; it stays on this core): for the read-ahead cache. The
    /// range must lie in one segment and below the written offset.
    pub async fn read_from_segment(&self, offset: u64, len: u64) -> io::Result<ReadResult> {
        let end = offset.checked_add(len);
        if end.is_none_or(|end| {
            end > self.written.get() || end > self.segment_end(offset).unwrap_or(0)
        }) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "read of {len} bytes at {offset} is not within one segment's written bytes"
                ),
            ));
        }
        let segment = self.segment_holding(offset)?;
        let file = segment.file().await?;
        let read = file
            .read_at(offset - segment.base, len as usize)
            .await
            .map_err(io::Error::from)?;
        if (read.len() as u64) < len {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!(
                    "{} is shorter than expected: wanted {len} bytes at {}",
                    segment.path.display(),
                    offset - segment.base
                ),
            ));
        }
        Ok(read)
    }

    fn segment_holding(&self, offset: u64) -> io::Result<Rc<Segment>> {
        let segments = self.segments.borrow();
        let (_, segment) = segments.range(..=offset).next_back().ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::NotFound,
                format!("physical offset {offset} is before the oldest segment"),
            )
        })?;
        Ok(segment.clone())
    }

    /// End offset of the data of the segment holding `offset` (a read must not cross it).
    pub fn segment_end(&self, offset: u64) -> Option<u64> {
        let segments = self.segments.borrow();
        let (base, _) = segments.range(..=offset).next_back()?;
        Some((base + self.segment_bytes).min(self.write_offset.get()))
    }

    /// Segments other than the newest, oldest first, as `(base, end offset, path)`.
    pub fn sealed_segments(&self) -> Vec<(u64, u64, PathBuf)> {
        let segments = self.segments.borrow();
        let current = self.segment_base(self.write_offset.get());
        segments
            .iter()
            .filter(|(base, _)| **base < current)
            .map(|(base, segment)| (*base, base + self.segment_bytes, segment.path.clone()))
            .collect()
    }

    /// Deletes the oldest segment if it is sealed and synced and no reader is opening its file.
    /// Returns its end offset.
    pub async fn delete_oldest_segment(&self) -> io::Result<Option<u64>> {
        let segment = {
            let segments = self.segments.borrow();
            let Some((&base, segment)) = segments.iter().next() else {
                return Ok(None);
            };
            let is_sealed = base + self.segment_bytes <= self.write_offset.get()
                && self.segment_base(self.write_offset.get()) > base;
            if !is_sealed
                || base + self.segment_bytes > self.synced.get()
                || segment.opens_in_flight.get() > 0
            {
                return Ok(None);
            }
            segment.clone()
        };
        self.segments.borrow_mut().remove(&segment.base);
        segment.close().await;
        match std::fs::remove_file(&segment.path) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
        info!(segment = segment.base, "deleted CommitLog segment");
        Ok(Some(segment.base + self.segment_bytes))
    }

    /// Bytes of data in all segments.
    pub fn disk_bytes(&self) -> u64 {
        let min = self.min_offset();
        self.write_offset.get().saturating_sub(min)
    }
}

fn file_len_on_disk(path: &Path) -> io::Result<u64> {
    Ok(std::fs::metadata(path)?.len())
}

/// Scans one segment file from `start` to its end in windows, feeding valid records to
/// `on_record`. Returns why it stopped (never `NeedMore`).
async fn scan_segment(
    path: &Path,
    base: u64,
    start: u64,
    segment_bytes: u64,
    file_len: u64,
    scan: &mut RecoveryScan,
    on_record: &mut dyn FnMut(u64, &RecordView<'_>),
) -> io::Result<ScanStop> {
    let file = open_read_write(path).await?;
    let mut position = start;
    let mut window_bytes = SCAN_WINDOW_BYTES;
    let result = loop {
        if position >= file_len {
            break if position >= segment_bytes {
                ScanStop::SegmentEnd { position }
            } else {
                ScanStop::DataEnd { position }
            };
        }
        let read_len = window_bytes.min(file_len - position);
        let window = file
            .read_at(position, read_len as usize)
            .await
            .map_err(io::Error::from)?;
        let is_file_end = position + window.len() as u64 >= file_len;
        let mut count = 0u64;
        let stop = scan_window(
            &window,
            base,
            position,
            segment_bytes,
            is_file_end,
            &mut |p, view| {
                count += 1;
                on_record(base + p, view);
            },
        );
        scan.records_scanned += count;
        match stop {
            ScanStop::NeedMore { position: next } => {
                if next == position {
                    // One record is larger than the window: widen it for this record.
                    window_bytes *= 2;
                } else {
                    window_bytes = SCAN_WINDOW_BYTES;
                }
                position = next;
            }
            other => break other,
        }
    };
    let _ = file.close().await;
    Ok(result)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEGMENT_BYTES: u64 = 64 << 10;

    use crate::run_local as run;

    async fn open(dir: &Path) -> CommitLog {
        open_with(dir, SegmentWrites::Plain).await
    }

    async fn open_with(dir: &Path, writes: SegmentWrites) -> CommitLog {
        let (log, _) = CommitLog::open(
            dir.to_path_buf(),
            SEGMENT_BYTES,
            1 << 20,
            0,
            writes,
            &mut |_, _| {},
        )
        .await
        .expect("open");
        log
    }

    /// Appends `data` as one "record" (the CommitLog does not parse what it appends).
    fn append(log: &CommitLog, data: &[u8]) {
        log.append_batch(
            data,
            &mut std::iter::once(data.len() as u32),
            &mut |_, _, record, destination| destination.copy_from_slice(record),
        );
    }

    /// Runs every write job the log plans, in order, until nothing is left to write.
    async fn write_all(log: &CommitLog) {
        while let Some(job) = log.next_write_job() {
            let from = job.from();
            let outcome = log.write(job).await;
            assert!(log.finish_write(from, outcome) || log.written_offset() > 0);
        }
    }

    fn file_bytes(dir: &Path, base: u64) -> Vec<u8> {
        std::fs::read(dir.join(segment_file_name(base))).expect("segment file")
    }

    #[test]
    fn a_read_from_the_disk_into_the_unwritten_ring_returns_the_bytes_not_zeros() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().to_path_buf();
        run(move || async move {
            crate::append_file::prime_direct_io_probe(&path)
                .await
                .unwrap();
            let (log, _) = CommitLog::open(
                path.clone(),
                4 << 20,
                0,
                0,
                SegmentWrites::Plain,
                &mut |_, _| {},
            )
            .await
            .expect("open");
            let pattern = |from: u64, len: usize| -> Vec<u8> {
                (from..from + len as u64).map(|p| (p % 251) as u8).collect()
            };
            let mut end = 0u64;
            while end < 1_500_000 {
                append(&log, &pattern(end, 1000));
                end += 1000;
            }
            write_all(&log).await;
            assert_eq!(log.written_offset(), end);
            // Appended, not written yet: only in the ring.
            append(&log, &pattern(end, 3000));
            let from = 100_000;
            let to = end + 3000;
            assert!(
                log.ring.borrow().read(from, to).is_none(),
                "the ring no longer holds the start of the range"
            );
            let read = log.read(from, to - from).await.unwrap();
            assert_eq!(read.len() as u64, to - from);
            assert!(read[..] == pattern(from, (to - from) as usize)[..]);
        });
    }

    /// The open flags of a segment's file descriptor, from /proc/self/fdinfo.
    fn open_flags(log: &CommitLog, base: u64) -> i32 {
        use std::os::fd::AsRawFd;
        let segment = log.segments.borrow().get(&base).cloned().expect("segment");
        let fd = segment.file.borrow().as_ref().expect("opened").as_raw_fd();
        let info = std::fs::read_to_string(format!("/proc/self/fdinfo/{fd}")).expect("fdinfo");
        let octal = info
            .lines()
            .find_map(|line| line.strip_prefix("flags:"))
            .expect("flags line")
            .trim();
        i32::from_str_radix(octal, 8).expect("octal flags")
    }

    #[test]
    fn durable_segment_writes_are_synced_when_they_complete_without_an_fdatasync() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().to_path_buf();
        run(move || async move {
            let log = open_with(&path, SegmentWrites::Durable).await;
            append(&log, &[7u8; 100]);
            write_all(&log).await;
            assert_eq!(log.written_offset(), 100);
            assert_eq!(log.synced_offset(), 100, "an O_DSYNC write is durable");
            assert_ne!(
                open_flags(&log, 0) & libc::O_DSYNC,
                0,
                "opened with O_DSYNC"
            );
            // Across a roll-over into the next segment too.
            append(&log, &vec![8u8; SEGMENT_BYTES as usize - 200]);
            append(&log, &[9u8; 300]);
            write_all(&log).await;
            assert_eq!(log.synced_offset(), log.write_offset());
            assert_ne!(open_flags(&log, SEGMENT_BYTES) & libc::O_DSYNC, 0);
            assert_eq!(log.sync().await.unwrap(), log.write_offset());

            let plain_dir = tempfile::tempdir().unwrap();
            let plain = open_with(plain_dir.path(), SegmentWrites::Plain).await;
            append(&plain, &[7u8; 100]);
            write_all(&plain).await;
            assert_eq!((plain.written_offset(), plain.synced_offset()), (100, 0));
            assert_eq!(open_flags(&plain, 0) & libc::O_DSYNC, 0);
            assert_eq!(plain.sync().await.unwrap(), 100);
        });
    }

    #[test]
    fn a_partly_filled_block_is_written_again_whole_as_it_grows() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().to_path_buf();
        run(move || async move {
            let log = open(&path).await;
            append(&log, &[1u8; 100]);
            write_all(&log).await;
            assert_eq!(log.written_offset(), 100);
            append(&log, &[2u8; 5000]);
            write_all(&log).await;
            assert_eq!(log.written_offset(), 5100);
            let bytes = file_bytes(&path, 0);
            assert_eq!(&bytes[..100], &[1u8; 100][..]);
            assert_eq!(&bytes[100..5100], &[2u8; 5000][..]);
            assert!(
                bytes[5100..8192].iter().all(|&b| b == 0),
                "zero padded to the block"
            );
            assert_eq!(log.sync().await.unwrap(), 5100);
        });
    }

    #[test]
    fn with_a_linger_a_partly_filled_chunk_waits_to_fill_and_goes_out_whole() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().to_path_buf();
        run(move || async move {
            let log = open(&path).await;
            let linger = Duration::from_millis(500);
            log.set_partial_chunk_linger(Some(linger));
            let chunk = 64 << 10;
            append(&log, &vec![6u8; 1000]);
            let wait = log.partial_chunk_wait().expect("the partial chunk lingers");
            assert!(wait > Duration::ZERO && wait <= linger);
            assert!(
                log.next_write_job().is_none(),
                "a young partial chunk waits"
            );
            // Filled before the linger ends (the next record rolls over to the next segment,
            // a filler completes this one): it goes out whole, from the ring (no copy).
            append(
                &log,
                &vec![7u8; chunk as usize - 1000 - BLANK_MIN_BYTES - 1],
            );
            assert!(log.next_write_job().is_none(), "still partly filled");
            append(&log, &[8u8; 10]);
            let job = log.next_write_job().expect("the full chunk");
            assert_eq!((job.from(), job.data_to()), (0, chunk));
            assert!(Rc::ptr_eq(&job.buffer, &log.ring.borrow().full_chunk(0)));
            assert!(
                log.next_write_job().is_none(),
                "the next chunk, partly filled, waits"
            );
            let outcome = log.write(job).await;
            assert!(log.finish_write(0, outcome));
            // A partial chunk left alone is written once its linger is over.
            assert!(log.partial_chunk_wait().is_some());
            assert!(log.next_write_job().is_none());
            glommio::timer::sleep(linger).await;
            assert_eq!(log.partial_chunk_wait(), None);
            write_all(&log).await;
            assert_eq!(log.written_offset(), chunk + 10);
            // Draining (a closing store) writes a young partial chunk at once.
            append(&log, &[9u8; 10]);
            assert!(log.next_write_job().is_none());
            log.drain();
            write_all(&log).await;
            assert_eq!(log.written_offset(), chunk + 20);
            let second = file_bytes(&path, chunk);
            assert_eq!(&second[..10], &[8u8; 10][..]);
            assert_eq!(&second[10..20], &[9u8; 10][..]);
        });
    }

    #[test]
    fn full_chunks_go_out_while_others_are_in_flight_but_a_partial_block_waits() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().to_path_buf();
        run(move || async move {
            let log = open(&path).await;
            // The 64 KiB segment gives 64 KiB chunks: two full chunks and a partial third.
            let chunk = 64 << 10;
            append(&log, &vec![3u8; chunk as usize - BLANK_MIN_BYTES - 1]);
            append(&log, &vec![4u8; 1000]); // rolls over: blank filler, then the next segment
            let first = log.next_write_job().expect("the full first chunk");
            assert_eq!((first.from(), first.data_to()), (0, chunk));
            // The partly filled second chunk starts at a block boundary: it does not wait
            // behind the full chunk's write.
            let second = log
                .next_write_job()
                .expect("the partial chunk, beside the full one");
            assert_eq!((second.from(), second.data_to()), (chunk, chunk + 1000));
            assert!(log.next_write_job().is_none(), "nothing more to write");
            append(&log, &[5u8; 10]);
            assert!(
                log.next_write_job().is_none(),
                "rewriting the block still being written must wait"
            );
            let outcome = log.write(first).await;
            assert!(log.finish_write(0, outcome));
            assert!(
                log.next_write_job().is_none(),
                "the partial block is still being written"
            );
            let outcome = log.write(second).await;
            assert!(log.finish_write(chunk, outcome));
            write_all(&log).await;
            assert_eq!(log.written_offset(), chunk + 1010);
            let read = log.read(chunk, 1010).await.unwrap();
            assert_eq!(&read[..1000], &[4u8; 1000][..]);
            assert_eq!(&read[1000..], &[5u8; 10][..]);
            let second_file = file_bytes(&path, chunk);
            assert_eq!(&second_file[1000..1010], &[5u8; 10][..]);
        });
    }

    #[test]
    fn a_failed_write_rewinds_to_the_written_offset_and_is_written_again() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().to_path_buf();
        run(move || async move {
            let log = open(&path).await;
            append(&log, &[6u8; 3000]);
            let job = log.next_write_job().expect("a job");
            drop(job);
            assert!(!log.finish_write(0, Err(io::Error::other("simulated"))));
            assert!(log.next_write_job().is_none(), "no writes after a failure");
            let error = log
                .take_write_error()
                .expect("the failure is reported once");
            assert_eq!(error.to_string(), "simulated");
            assert!(log.take_write_error().is_none());
            write_all(&log).await;
            assert_eq!(log.written_offset(), 3000);
            assert_eq!(&file_bytes(&path, 0)[..3000], &[6u8; 3000][..]);
        });
    }
}
