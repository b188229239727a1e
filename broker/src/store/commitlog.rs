//! The CommitLog of one storage shard: every record of every queue the shard owns, appended in
//! one sequence of fixed-size segment files.
//!
//! Owns the segment files (`<shard>/commitlog/<20-digit start offset>`), the global write
//! position, rollover with a blank filler, flushing the segments in order, reads by physical
//! offset, recovery's scan of the tail, and deleting whole old segments. It knows nothing of
//! queues, indexes or sockets: records arrive encoded and leave as bytes.

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};
use std::rc::Rc;

use bytes::{Bytes, BytesMut};
use tracing::{info, warn};

use super::append_file::{open_read_write, AppendFile, DMA_ALIGNMENT_BYTES};
use super::record::{encode_blank, RecordView, BLANK_MIN_BYTES};
use super::scan::{scan_window, ScanStop};

/// Window of the recovery scan; a record larger than this extends the window to fit it.
/// Zeros kept written ahead of the newest segment's data, so a sync flush's `fdatasync` does
/// not also commit a larger file size (see `AppendFile::prepare_ahead`).
const PREPARE_AHEAD_BYTES: u64 = 8 << 20;

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

/// See the module documentation.
pub struct CommitLog {
    dir: PathBuf,
    segment_bytes: u64,
    hot_tail_bytes: u64,
    segments: RefCell<BTreeMap<u64, Rc<AppendFile>>>,
    write_offset: Cell<u64>,
}

impl CommitLog {
    /// Opens the CommitLog in `dir`, validating every record from `scan_from` (a physical
    /// offset known durable, e.g. from the checkpoint; 0 scans everything) and cutting the data
    /// at the first torn or invalid record. `on_record` sees each valid record from `scan_from`.
    pub async fn open(
        dir: PathBuf,
        segment_bytes: u64,
        hot_tail_bytes: u64,
        scan_from: u64,
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

        let commit_log = CommitLog {
            dir,
            segment_bytes,
            hot_tail_bytes,
            segments: RefCell::new(BTreeMap::new()),
            write_offset: Cell::new(0),
        };
        let last = kept.len().saturating_sub(1);
        for (index, (base, path, valid_len)) in kept.into_iter().enumerate() {
            let hot = if index == last { hot_tail_bytes } else { 0 };
            let file = AppendFile::open_existing(path, valid_len, hot).await?;
            // Cut garbage after the valid end so a later scan never mistakes it for data.
            let on_disk = file_len_on_disk(file.path())?;
            if on_disk > valid_len && valid_len < segment_bytes {
                file.truncate_on_disk(valid_len).await?;
            }
            file.prepare_ahead(PREPARE_AHEAD_BYTES, segment_bytes);
            commit_log.write_offset.set(base + valid_len);
            commit_log.segments.borrow_mut().insert(base, Rc::new(file));
        }
        if let Some((&base, file)) = commit_log.segments.borrow().iter().next_back() {
            if file.len() >= segment_bytes {
                commit_log.write_offset.set(base + segment_bytes);
            }
        }
        scan.end_offset = commit_log.write_offset.get();
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

    /// The oldest physical offset still stored.
    pub fn min_offset(&self) -> u64 {
        self.segments
            .borrow()
            .keys()
            .next()
            .copied()
            .unwrap_or(self.write_offset.get())
    }

    /// Largest record a segment can take (leaving room for a blank filler).
    pub fn max_record_bytes(&self) -> u64 {
        self.segment_bytes - BLANK_MIN_BYTES as u64
    }

    /// Appends the records of `batch` (lengths in `record_lens`, in order). For each record
    /// `patch(index, physical_offset, record_bytes)` is called before it is frozen, so the
    /// caller can write the offsets into it. Rolls over to a new segment, padding the current
    /// one with a blank filler, whenever the next record does not fit.
    pub fn append_batch(
        &self,
        mut batch: BytesMut,
        record_lens: &[u32],
        patch: &mut dyn FnMut(usize, u64, &mut [u8]),
    ) {
        let mut run_len = 0usize;
        for (index, &len) in record_lens.iter().enumerate() {
            let len = u64::from(len);
            debug_assert!(len <= self.max_record_bytes());
            let mut position = self.write_offset.get();
            let segment_base = position - position % self.segment_bytes;
            if position - segment_base + len + BLANK_MIN_BYTES as u64 > self.segment_bytes {
                self.current_segment()
                    .append_bytes(batch.split_to(run_len).freeze());
                run_len = 0;
                self.seal_with_blank(segment_base, position);
                position = self.write_offset.get();
            }
            patch(index, position, &mut batch[run_len..run_len + len as usize]);
            run_len += len as usize;
            self.write_offset.set(position + len);
        }
        debug_assert_eq!(run_len, batch.len());
        self.current_segment().append_bytes(batch.freeze());
    }

    fn current_segment(&self) -> Rc<AppendFile> {
        let base = {
            let offset = self.write_offset.get();
            offset - offset % self.segment_bytes
        };
        let mut segments = self.segments.borrow_mut();
        segments
            .entry(base)
            .or_insert_with(|| {
                let file = AppendFile::new_lazy(
                    self.dir.join(segment_file_name(base)),
                    self.hot_tail_bytes,
                );
                file.prepare_ahead(PREPARE_AHEAD_BYTES, self.segment_bytes);
                Rc::new(file)
            })
            .clone()
    }

    fn seal_with_blank(&self, segment_base: u64, position: u64) {
        let blank_len = (segment_base + self.segment_bytes - position) as usize;
        let mut blank = vec![0u8; blank_len];
        encode_blank(&mut blank);
        self.current_segment().append_copy(&blank);
        self.write_offset.set(segment_base + self.segment_bytes);
        info!(
            segment = segment_base,
            "CommitLog segment full, rolling over"
        );
    }

    /// Writes every appended byte to disk (and `fdatasync`s with `is_sync`), oldest segment
    /// first. Returns the physical offset up to which everything is now durable.
    pub async fn flush(&self, is_sync: bool) -> io::Result<u64> {
        let target = self.write_offset.get();
        let dirty: Vec<Rc<AppendFile>> = self
            .segments
            .borrow()
            .values()
            .filter(|f| f.len() > f.durable_len())
            .cloned()
            .collect();
        for file in &dirty {
            file.flush(is_sync).await?;
        }
        // Sealed segments no longer need a hot tail once durable.
        let segments = self.segments.borrow();
        let last_base = segments.keys().next_back().copied();
        for (base, file) in segments.iter() {
            if Some(*base) != last_base && file.durable_len() == file.len() {
                file.set_hot_tail_bytes(0);
            }
        }
        Ok(target)
    }

    /// Reads `len` bytes at physical offset `offset` (a record never spans segments).
    pub async fn read(&self, offset: u64, len: u64) -> io::Result<Bytes> {
        let file = {
            let segments = self.segments.borrow();
            let (base, file) = segments.range(..=offset).next_back().ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::NotFound,
                    format!("physical offset {offset} is before the oldest segment"),
                )
            })?;
            (*base, file.clone())
        };
        file.1.read(offset - file.0, len).await
    }

    /// End offset of the segment holding `offset` (a read must not cross it).
    pub fn segment_end(&self, offset: u64) -> Option<u64> {
        let segments = self.segments.borrow();
        let (base, file) = segments.range(..=offset).next_back()?;
        Some(base + file.len())
    }

    /// Segments other than the newest, oldest first, as `(base, end offset, path)`.
    pub fn sealed_segments(&self) -> Vec<(u64, u64, PathBuf)> {
        let segments = self.segments.borrow();
        let count = segments.len();
        segments
            .iter()
            .take(count.saturating_sub(1))
            .map(|(base, file)| (*base, base + file.len(), file.path().to_path_buf()))
            .collect()
    }

    /// Deletes the oldest segment if it is sealed and durable. Returns its end offset.
    pub async fn delete_oldest_segment(&self) -> io::Result<Option<u64>> {
        let file = {
            let segments = self.segments.borrow();
            if segments.len() < 2 {
                return Ok(None);
            }
            let (base, file) = segments.iter().next().expect("two segments");
            if file.durable_len() < file.len() {
                return Ok(None);
            }
            (*base, file.clone())
        };
        self.segments.borrow_mut().remove(&file.0);
        file.1.remove().await?;
        info!(segment = file.0, "deleted CommitLog segment");
        Ok(Some(file.0 + self.segment_bytes))
    }

    /// Bytes on disk in all segments.
    pub fn disk_bytes(&self) -> u64 {
        self.segments.borrow().values().map(|f| f.len()).sum()
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
