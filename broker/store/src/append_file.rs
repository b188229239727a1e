//! An append-only file written with O_DIRECT through io_uring, with its newest bytes in memory.
//!
//! Owns one file on disk and a "hot tail": the appended bytes as `Bytes` chunks, covering at
//! least everything not yet durable plus up to `hot_tail_bytes` of recent data, so that tailing
//! readers are served from memory without copying. Used for CommitLog segments, ConsumeQueue
//! files and index files. It never interprets the bytes.
//!
//! Data enters by `append_bytes` / `append_copy` (synchronous, memory only) and reaches the disk
//! in `flush`, which writes from the last 4 KiB boundary below the durable length to the end
//! (re-writing the partial last block, zero padded) in one DMA write, then optionally
//! `fdatasync`s. O_DIRECT needs the file offset, the length and the buffer aligned to the
//! device's logical block; we use 4 KiB, which satisfies every device we target. The zero padding
//! past the logical end is why readers of these files find the end by content, not file size.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::io;
use std::path::{Path, PathBuf};
use std::rc::Rc;

use bytes::{Bytes, BytesMut};
use glommio::io::{DmaFile, OpenOptions};

/// Alignment of every O_DIRECT write offset, length and buffer.
pub const DMA_ALIGNMENT_BYTES: u64 = 4096;

/// Largest single O_DIRECT write of a flush (a multiple of the block size).
const MAX_WRITE_PIECE_BYTES: u64 = 1 << 20;

/// Room of the first buffer small appends gather in; each buffer that fills doubles the next,
/// up to [`MAX_OPEN_CHUNK_BYTES`]. A busy file (a ConsumeQueue or index taking a million
/// entries a second) so appends into buffers allocated once per 64 KiB, which the allocator
/// recycles, where a buffer grown by `extend_from_slice` from nothing after every flush was
/// reallocated step by step into fresh pages (the kernel zeroing them was the largest single
/// cost of the storage core); an idle one holds little.
const MIN_OPEN_CHUNK_BYTES: usize = 512;
const MAX_OPEN_CHUNK_BYTES: usize = 64 << 10;

pub fn align_down(value: u64) -> u64 {
    value & !(DMA_ALIGNMENT_BYTES - 1)
}

pub fn align_up(value: u64) -> u64 {
    align_down(value + DMA_ALIGNMENT_BYTES - 1)
}

fn to_io(err: glommio::GlommioError<()>) -> io::Error {
    io::Error::from(err)
}

struct Tail {
    /// Frozen chunks, contiguous, the first starting at `start`.
    chunks: VecDeque<Bytes>,
    start: u64,
    /// Small appends gathered here and frozen into a chunk on the next `append_bytes` or flush.
    open: BytesMut,
    /// Room of the next buffer `open` gets when it is full.
    next_open_bytes: usize,
}

impl Tail {
    fn freeze_open(&mut self) {
        if !self.open.is_empty() {
            let chunk = self.open.split().freeze();
            self.chunks.push_back(chunk);
        }
    }

    /// Copies `[from, to)` (which must lie within the tail) into `out`.
    fn copy_range(&self, from: u64, to: u64, out: &mut [u8]) {
        let mut chunk_start = self.start;
        let mut written = 0usize;
        let pieces = self
            .chunks
            .iter()
            .map(|c| &c[..])
            .chain(std::iter::once(&self.open[..]));
        for chunk in pieces {
            let chunk_end = chunk_start + chunk.len() as u64;
            if chunk_end > from && chunk_start < to {
                let lo = from.max(chunk_start);
                let hi = to.min(chunk_end);
                let piece = &chunk[(lo - chunk_start) as usize..(hi - chunk_start) as usize];
                out[written..written + piece.len()].copy_from_slice(piece);
                written += piece.len();
            }
            chunk_start = chunk_end;
            if chunk_start >= to {
                break;
            }
        }
        debug_assert_eq!(written as u64, to - from);
    }

    /// Zero-copy slice when `[from, to)` lies in one frozen chunk.
    fn slice(&self, from: u64, to: u64) -> Option<Bytes> {
        let mut chunk_start = self.start;
        for chunk in &self.chunks {
            let chunk_end = chunk_start + chunk.len() as u64;
            if from >= chunk_start && to <= chunk_end {
                return Some(
                    chunk.slice((from - chunk_start) as usize..(to - chunk_start) as usize),
                );
            }
            if chunk_end > from {
                return None;
            }
            chunk_start = chunk_end;
        }
        None
    }
}

/// See the module documentation.
pub struct AppendFile {
    path: PathBuf,
    file: RefCell<Option<Rc<DmaFile>>>,
    len: Cell<u64>,
    durable_len: Cell<u64>,
    hot_tail_bytes: Cell<u64>,
    /// Where the last flush began writing (the durable length before it): the bytes from here
    /// on stay in memory (see `trim_tail`).
    last_flush_from: Cell<u64>,
    is_flushing: Cell<bool>,
    /// Set by [`remove`](Self::remove): nothing more is written, and a flush running when the
    /// file was removed unlinks it when it ends (it may be creating the file right then).
    is_removed: Cell<bool>,
    tail: RefCell<Tail>,
}

impl AppendFile {
    /// A file that does not exist yet; it is created by the first flush.
    pub fn new_lazy(path: PathBuf, hot_tail_bytes: u64) -> AppendFile {
        AppendFile::with_state(path, None, 0, hot_tail_bytes)
    }

    /// Opens an existing file whose valid content is `len` bytes (found by the caller's scan);
    /// anything after `len` is treated as garbage and overwritten by later appends.
    pub async fn open_existing(
        path: PathBuf,
        len: u64,
        hot_tail_bytes: u64,
    ) -> io::Result<AppendFile> {
        let file = open_read_write(&path).await?;
        let append_file = AppendFile::with_state(path, Some(Rc::new(file)), len, hot_tail_bytes);
        // The partial last block must be in memory, since the next flush rewrites it whole.
        let block_start = align_down(len);
        if block_start < len {
            let bytes = append_file
                .read_from_disk(block_start, len - block_start)
                .await?;
            let mut tail = append_file.tail.borrow_mut();
            tail.start = block_start;
            tail.chunks.push_back(bytes);
        }
        Ok(append_file)
    }

    fn with_state(
        path: PathBuf,
        file: Option<Rc<DmaFile>>,
        len: u64,
        hot_tail_bytes: u64,
    ) -> AppendFile {
        AppendFile {
            path,
            file: RefCell::new(file),
            len: Cell::new(len),
            durable_len: Cell::new(len),
            hot_tail_bytes: Cell::new(hot_tail_bytes),
            last_flush_from: Cell::new(len),
            is_flushing: Cell::new(false),
            is_removed: Cell::new(false),
            tail: RefCell::new(Tail {
                chunks: VecDeque::new(),
                start: len,
                open: BytesMut::new(),
                next_open_bytes: MIN_OPEN_CHUNK_BYTES,
            }),
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Bytes appended, durable or not.
    pub fn len(&self) -> u64 {
        self.len.get()
    }

    pub fn is_empty(&self) -> bool {
        self.len.get() == 0
    }

    /// Bytes known to be on disk (written, and synced when the flush asked for it).
    pub fn durable_len(&self) -> u64 {
        self.durable_len.get()
    }

    /// Appends a copy of small data (index and queue entries).
    pub fn append_copy(&self, data: &[u8]) {
        let mut tail = self.tail.borrow_mut();
        if tail.open.capacity() - tail.open.len() < data.len() {
            // Full: what it gathered becomes a chunk and a new buffer takes the appends.
            tail.freeze_open();
            let room = tail.next_open_bytes.max(data.len());
            tail.next_open_bytes = (tail.next_open_bytes * 2).min(MAX_OPEN_CHUNK_BYTES);
            tail.open = BytesMut::with_capacity(room);
        }
        tail.open.extend_from_slice(data);
        drop(tail);
        self.len.set(self.len.get() + data.len() as u64);
    }

    /// Writes everything appended so far to disk; with `is_sync`, also `fdatasync`s. Returns the
    /// durable length. Only one flush of a file may run at a time.
    pub async fn flush(&self, is_sync: bool) -> io::Result<u64> {
        assert!(
            !self.is_flushing.replace(true),
            "concurrent flush of {}",
            self.path.display()
        );
        let result = self.flush_inner(is_sync).await;
        self.is_flushing.set(false);
        if self.is_removed.get() {
            // Removed while this flush ran: what it wrote is not wanted.
            self.unlink().await?;
            return Ok(self.durable_len.get());
        }
        result
    }

    async fn flush_inner(&self, is_sync: bool) -> io::Result<u64> {
        let end = self.len.get();
        let durable = self.durable_len.get();
        if end == durable || self.is_removed.get() {
            return Ok(durable);
        }
        let file = self.file_or_create().await?;
        let write_start = align_down(durable);
        let write_end = align_up(end);
        {
            let mut tail = self.tail.borrow_mut();
            tail.freeze_open();
            debug_assert!(
                tail.start <= write_start,
                "hot tail lost bytes still to be written"
            );
        }
        // Written in pieces of at most MAX_WRITE_PIECE_BYTES: a DMA buffer of that size is
        // recycled by the allocator from one piece to the next, where one buffer the size of the
        // whole unflushed range (up to max_unflushed_bytes) was fresh memory, page-faulted in
        // and unmapped on every flush. A short write (what a filling disk looks like) just
        // continues from where it stopped, and either goes through or fails with the real
        // cause (ENOSPC) for the caller to report.
        let mut at = write_start;
        while at < write_end {
            let piece_len = (write_end - at).min(MAX_WRITE_PIECE_BYTES);
            let mut buffer = file.alloc_dma_buffer(piece_len as usize);
            {
                let tail = self.tail.borrow();
                let out = buffer.as_bytes_mut();
                let data_len = end.saturating_sub(at).min(piece_len) as usize;
                tail.copy_range(at, at + data_len as u64, &mut out[..data_len]);
                out[data_len..].fill(0);
            }
            let written = file.write_at(buffer, at).await.map_err(to_io)? as u64;
            if written == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::WriteZero,
                    format!(
                        "O_DIRECT write to {} made no progress at {at}",
                        self.path.display()
                    ),
                ));
            }
            at += written;
        }
        if is_sync {
            file.fdatasync().await.map_err(to_io)?;
        }
        self.last_flush_from.set(durable);
        self.durable_len.set(end);
        self.trim_tail();
        Ok(end)
    }

    async fn file_or_create(&self) -> io::Result<Rc<DmaFile>> {
        if let Some(file) = self.file.borrow().as_ref() {
            return Ok(file.clone());
        }
        let file = Rc::new(open_read_write(&self.path).await?);
        // The new name must survive a crash as well as the data written under it.
        if let Some(dir) = self.path.parent() {
            std::fs::File::open(dir)?.sync_all()?;
        }
        *self.file.borrow_mut() = Some(file.clone());
        Ok(file)
    }

    /// Drops chunks that are durable, outside the hot window, wholly before the partial last
    /// block (which the next flush rewrites) and wholly before what the last flush wrote. The
    /// last flush's range stays in memory: a consumer catching up on what was just appended
    /// (a ConsumeQueue is flushed once a checkpoint) reads its entries from memory, not with an
    /// O_DIRECT read each. (Kept as it was when every flush froze one chunk of everything
    /// appended since the one before: the drain of a fresh backlog ran a quarter faster.)
    fn trim_tail(&self) {
        let keep_from = align_down(self.durable_len.get())
            .min(self.len.get().saturating_sub(self.hot_tail_bytes.get()))
            .min(self.last_flush_from.get());
        let mut tail = self.tail.borrow_mut();
        while let Some(first) = tail.chunks.front() {
            let first_end = tail.start + first.len() as u64;
            if first_end > keep_from {
                break;
            }
            tail.start = first_end;
            tail.chunks.pop_front();
        }
    }

    /// Reads `[pos, pos + len)`: from memory when the range is in the hot tail (without copying
    /// when it lies in one chunk), else with an O_DIRECT read.
    pub async fn read(&self, pos: u64, len: u64) -> io::Result<Bytes> {
        let end = pos
            .checked_add(len)
            .filter(|&e| e <= self.len.get())
            .ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!(
                        "read of {len} bytes at {pos} is past the end ({}) of {}",
                        self.len.get(),
                        self.path.display()
                    ),
                )
            })?;
        {
            let tail = self.tail.borrow();
            if pos >= tail.start {
                if let Some(bytes) = tail.slice(pos, end) {
                    return Ok(bytes);
                }
                let mut out = vec![0u8; len as usize];
                tail.copy_range(pos, end, &mut out);
                return Ok(Bytes::from(out));
            }
        }
        loop {
            let tail_start = self.tail.borrow().start;
            if end <= tail_start {
                // Everything before the hot tail is on disk.
                return self.read_from_disk(pos, len).await;
            }
            // Begins before the hot tail and ends in it: the end may not be on disk yet (the
            // tail holds everything not flushed), so the two parts are read where they are.
            let on_disk = self.read_from_disk(pos, tail_start - pos).await?;
            let tail = self.tail.borrow();
            if tail.start > tail_start {
                // A flush trimmed the tail meanwhile: what it held is on disk now.
                continue;
            }
            let mut out = vec![0u8; len as usize];
            out[..on_disk.len()].copy_from_slice(&on_disk);
            tail.copy_range(tail_start, end, &mut out[on_disk.len()..]);
            return Ok(Bytes::from(out));
        }
    }

    async fn read_from_disk(&self, pos: u64, len: u64) -> io::Result<Bytes> {
        let file = self.file_or_create().await?;
        read_exact_at(&file, pos, len, &self.path).await
    }

    /// Cuts the file's content to `len` bytes (recovery only: nothing may be appended yet past
    /// a durable point that is cut away).
    pub async fn truncate(&self, len: u64) -> io::Result<()> {
        assert!(!self.is_flushing.get());
        if len >= self.len.get() {
            return Ok(());
        }
        let file = self.file_or_create().await?;
        let block_start = align_down(len);
        let partial = if block_start < len {
            Some(self.read(block_start, len - block_start).await?)
        } else {
            None
        };
        file.truncate(len).await.map_err(to_io)?;
        file.fdatasync().await.map_err(to_io)?;
        self.len.set(len);
        self.durable_len.set(len);
        self.last_flush_from
            .set(self.last_flush_from.get().min(len));
        let mut tail = self.tail.borrow_mut();
        tail.chunks.clear();
        tail.open.clear();
        tail.start = len;
        if let Some(partial) = partial {
            tail.start = block_start;
            tail.chunks.push_back(partial);
        }
        Ok(())
    }

    /// Cuts whatever lies on disk after the valid length (garbage a crash left behind), so that
    /// later appends that end on a block boundary are never followed by stale bytes.
    pub async fn truncate_on_disk(&self, len: u64) -> io::Result<()> {
        assert_eq!(
            len,
            self.len.get(),
            "truncate_on_disk keeps the valid length"
        );
        let file = self.file_or_create().await?;
        file.truncate(len).await.map_err(to_io)?;
        file.fdatasync().await.map_err(to_io)
    }

    /// Closes and deletes the file.
    ///
    /// While a flush runs the file is only marked removed, and that flush unlinks it when it
    /// ends: it may be creating the file at this moment, and unlinking a file glommio is still
    /// opening makes glommio panic.
    pub async fn remove(&self) -> io::Result<()> {
        self.is_removed.set(true);
        if self.is_flushing.get() {
            return Ok(());
        }
        self.unlink().await
    }

    async fn unlink(&self) -> io::Result<()> {
        let file = self.file.borrow_mut().take();
        if let Some(file) = file {
            if let Ok(file) = Rc::try_unwrap(file) {
                let _ = file.close().await;
            }
        }
        match std::fs::remove_file(&self.path) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            other => other,
        }
    }
}

/// Reads exactly `[pos, pos + len)` of `file` (at `path`, for the error) with an O_DIRECT read.
pub async fn read_exact_at(file: &DmaFile, pos: u64, len: u64, path: &Path) -> io::Result<Bytes> {
    let result = file.read_at(pos, len as usize).await.map_err(to_io)?;
    if (result.len() as u64) < len {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            format!(
                "{} is shorter than expected: wanted {len} bytes at {pos}",
                path.display()
            ),
        ));
    }
    Ok(Bytes::copy_from_slice(&result[..len as usize]))
}

/// Opens (creating if needed) a file for O_DIRECT reads and writes.
pub async fn open_read_write(path: &Path) -> io::Result<DmaFile> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .dma_open(path)
        .await
        .map_err(to_io)
}

/// Opens (creating if needed) a file for O_DIRECT reads and `O_DSYNC` writes: a write
/// completes once it is durable.
pub async fn open_read_write_dsync(path: &Path) -> io::Result<DmaFile> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .custom_flags(libc::O_DSYNC)
        .dma_open(path)
        .await
        .map_err(to_io)
}

/// Makes glommio decide correctly whether the device under `dir` supports polled I/O.
///
/// glommio probes this once per device and thread, with a read at offset 0 of the first
/// `DmaFile` opened there; on an empty file that read succeeds without touching the device, the
/// probe wrongly says "pollable", and every later read fails with EOPNOTSUPP on devices without
/// poll queues. Opening a file that has a real block first gives the probe something to read.
/// Call once per executor before opening store files.
pub async fn prime_direct_io_probe(dir: &Path) -> io::Result<()> {
    let path = dir.join(".direct-io-probe");
    std::fs::write(&path, vec![0u8; DMA_ALIGNMENT_BYTES as usize])?;
    let file = open_read_write(&path).await?;
    let _ = file.close().await;
    std::fs::remove_file(&path)
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::run_local as run;

    #[test]
    fn a_read_from_the_disk_into_the_unflushed_tail_returns_both_parts() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("00000000000000000000");
        run(move || async move {
            prime_direct_io_probe(path.parent().unwrap()).await.unwrap();
            // No hot tail beyond what is unflushed: flushed chunks leave memory.
            let file = Rc::new(AppendFile::new_lazy(path.clone(), 0));
            let byte = |p: u64| (p % 251) as u8;
            let mut len = 0u64;
            for _ in 0..3 {
                for _ in 0..40 {
                    let data: Vec<u8> = (len..len + 1000).map(byte).collect();
                    file.append_copy(&data);
                    len += 1000;
                }
                file.flush(false).await.unwrap();
            }
            let data: Vec<u8> = (len..len + 3000).map(byte).collect();
            file.append_copy(&data);
            len += 3000;
            let start = file.tail.borrow().start;
            assert!(start > 0, "flushed chunks left the tail");
            let read = file.read(0, len).await.unwrap();
            assert!(read.iter().enumerate().all(|(p, b)| *b == byte(p as u64)));
        });
    }

    #[test]
    fn a_file_removed_while_its_first_flush_creates_it_is_gone_afterwards() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("00000000000000000000");
        let checked = path.clone();
        run(move || async move {
            let file = Rc::new(AppendFile::new_lazy(path.clone(), 4096));
            file.append_copy(&[7u8; 100]);
            let flushing = Rc::clone(&file);
            let flush = glommio::spawn_local(async move { flushing.flush(true).await });
            // Let the flush start creating the file, then remove it meanwhile (retention
            // deleting a ConsumeQueue file a checkpoint is flushing for the first time).
            glommio::yield_if_needed().await;
            futures_lite::future::yield_now().await;
            assert!(file.is_flushing.get(), "the flush is under way");
            file.remove().await.expect("remove");
            flush.await.expect("the flush ends without error");
            file.append_copy(&[8u8; 10]);
            file.flush(true)
                .await
                .expect("a later flush writes nothing");
        });
        assert!(!checked.exists(), "the removed file stays removed");
    }
}
