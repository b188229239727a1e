//! The append journal (`<shard>/journal`): a copy of the CommitLog bytes that are appended but
//! not yet written to their segment, in a file mapped into memory (`MAP_SHARED`), so that they
//! live in the kernel's page cache the moment they are copied. A broker killed before its
//! O_DIRECT write completes leaves them there; the next open reads them back
//! ([`Journal::replay`]) and appends them again. This is what lets an async-flush append be
//! acknowledged without waiting for the disk, with the guarantee RocketMQ's page cache gives: a
//! crash of the process loses nothing acknowledged; a crash of the machine can lose what was
//! not yet synced (`flush_interval_ms`), as before (`docs/storage-format.md` §4.12).
//!
//! Layout: a 4 KiB header page, then `data_bytes` of data. The CommitLog byte at physical offset
//! `p` is kept at data position `p mod data_bytes`, so the journal holds a sliding window of the
//! log; the header's `end` says where the journaled bytes end. The store keeps every byte of
//! `[written, end)` in the journal (it journals only while that window fits), so `[recovered
//! end, end)` is always there after a crash, and nothing older is ever read back. Every replayed
//! record is validated again (both CRCs, its physical offset) before it is appended.
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 8 | magic `SMQJRNL1` |
//! | 8 | 8 | `data_bytes` (u64, big-endian) |
//! | 16 | 8 | `end`: physical offset where the journaled bytes end (u64, big-endian) |
//! | 24 | 8 | `start`: physical offset where they start (u64, big-endian): the write offset when |
//! |    |   | `end` was last set, so the journal vouches for `[start, end)` only |
//!
//! The mapping belongs to the storage shard's executor (`!Send`): nothing here locks.

use std::fs::OpenOptions;
use std::io;
use std::os::unix::io::AsRawFd;
use std::path::Path;

use crate::stream_copy::stream_copy;

/// The journal file's name in a shard directory.
pub const JOURNAL_FILE: &str = "journal";
/// Bytes before the data.
pub const JOURNAL_HEADER_BYTES: usize = 4096;
const MAGIC: &[u8; 8] = b"SMQJRNL1";
const DATA_BYTES_AT: usize = 8;
const END_AT: usize = 16;
const START_AT: usize = 24;

/// See the module documentation.
pub struct Journal {
    map: *mut u8,
    map_len: usize,
    data_bytes: u64,
}

impl Journal {
    /// Opens `<shard_dir>/journal` with `data_bytes` of data (a multiple of 4096), creating or
    /// resizing it as needed. A journal of another size, or one whose header is not this
    /// format's, is started afresh: its contents (which a different size would misplace) are
    /// dropped, with `end` at 0 so that nothing is replayed.
    pub fn open(shard_dir: &Path, data_bytes: u64) -> io::Result<Journal> {
        assert!(
            data_bytes > 0 && data_bytes.is_multiple_of(4096),
            "journal size must be a positive multiple of 4096"
        );
        let path = shard_dir.join(JOURNAL_FILE);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)?;
        let map_len = JOURNAL_HEADER_BYTES + data_bytes as usize;
        let on_disk = file.metadata()?.len();
        let is_same_size = on_disk == map_len as u64;
        if !is_same_size {
            file.set_len(0)?;
            file.set_len(map_len as u64)?;
        }
        // Take the disk blocks now: a full disk is an error at open, not a SIGBUS later.
        // SAFETY: a plain fallocate on an open file descriptor of ours.
        let rc = unsafe { libc::fallocate(file.as_raw_fd(), 0, 0, map_len as libc::off_t) };
        if rc != 0 {
            let error = io::Error::last_os_error();
            if error.raw_os_error() != Some(libc::EOPNOTSUPP) {
                return Err(io::Error::new(
                    error.kind(),
                    format!("cannot allocate the journal {}: {error}", path.display()),
                ));
            }
        }
        // SAFETY: maps the whole file, which is `map_len` long, shared and writable; the file
        // descriptor may be closed afterwards (the mapping keeps the file).
        let map = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                map_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_POPULATE,
                file.as_raw_fd(),
                0,
            )
        };
        if map == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let mut journal = Journal {
            map: map.cast(),
            map_len,
            data_bytes,
        };
        let header = journal.header();
        let is_ours = &header[..8] == MAGIC
            && u64::from_be_bytes(header[DATA_BYTES_AT..DATA_BYTES_AT + 8].try_into().unwrap())
                == data_bytes;
        if !is_ours {
            let header = journal.header_mut();
            header.fill(0);
            header[..8].copy_from_slice(MAGIC);
            header[DATA_BYTES_AT..DATA_BYTES_AT + 8].copy_from_slice(&data_bytes.to_be_bytes());
        }
        Ok(journal)
    }

    fn header(&self) -> &[u8] {
        // SAFETY: the mapping is at least `JOURNAL_HEADER_BYTES` long and lives as long as self.
        unsafe { std::slice::from_raw_parts(self.map, JOURNAL_HEADER_BYTES) }
    }

    fn header_mut(&mut self) -> &mut [u8] {
        // SAFETY: as `header`; `&mut self` makes this the only view.
        unsafe { std::slice::from_raw_parts_mut(self.map, JOURNAL_HEADER_BYTES) }
    }

    fn data_mut(&mut self) -> &mut [u8] {
        // SAFETY: the data follows the header and runs to the end of the mapping.
        unsafe {
            std::slice::from_raw_parts_mut(
                self.map.add(JOURNAL_HEADER_BYTES),
                self.data_bytes as usize,
            )
        }
    }

    fn data(&self) -> &[u8] {
        // SAFETY: as `data_mut`, read only.
        unsafe {
            std::slice::from_raw_parts(self.map.add(JOURNAL_HEADER_BYTES), self.data_bytes as usize)
        }
    }

    /// How many bytes of the log the journal can hold at once.
    pub fn data_bytes(&self) -> u64 {
        self.data_bytes
    }

    /// Where the journaled bytes end (0 for a new journal).
    pub fn end(&self) -> u64 {
        u64::from_be_bytes(self.header()[END_AT..END_AT + 8].try_into().unwrap())
    }

    /// Where the bytes the journal vouches for start.
    pub fn start(&self) -> u64 {
        u64::from_be_bytes(self.header()[START_AT..START_AT + 8].try_into().unwrap())
    }

    /// Records that the journal vouches for no byte below `start` (set before bytes are copied
    /// over older ones).
    pub fn set_start(&mut self, start: u64) {
        self.header_mut()[START_AT..START_AT + 8].copy_from_slice(&start.to_be_bytes());
    }

    /// Records that the journal holds the log's bytes up to `end`. Called after the bytes are
    /// copied in; the header is what a replay trusts.
    pub fn set_end(&mut self, end: u64) {
        self.header_mut()[END_AT..END_AT + 8].copy_from_slice(&end.to_be_bytes());
    }

    /// The bytes `[from, end)` the journal vouches for, when it vouches for every byte from
    /// `from` on (`start <= from < end`) and they fit it.
    pub fn tail_from(&self, from: u64) -> Option<Vec<u8>> {
        let (start, end) = (self.start(), self.end());
        (start <= from && from < end && end - from <= self.data_bytes).then(|| self.read(from, end))
    }

    /// Copies `bytes`, the log's bytes from physical offset `from`, into their place (wrapping
    /// around the end of the data). At most `data_bytes` at a time.
    pub fn copy_in(&mut self, from: u64, bytes: &[u8]) {
        debug_assert!(bytes.len() as u64 <= self.data_bytes);
        let data_bytes = self.data_bytes;
        let data = self.data_mut();
        let at = (from % data_bytes) as usize;
        let first = bytes.len().min(data.len() - at);
        // Read back only after a crash: streamed past the caches (see `stream_copy`).
        stream_copy(&mut data[at..at + first], &bytes[..first]);
        stream_copy(&mut data[..bytes.len() - first], &bytes[first..]);
    }

    /// The log's bytes `[from, to)` as journaled (`to - from` at most `data_bytes`).
    pub fn read(&self, from: u64, to: u64) -> Vec<u8> {
        assert!(
            to >= from && to - from <= self.data_bytes,
            "journal read out of range"
        );
        let data = self.data();
        let at = (from % self.data_bytes) as usize;
        let len = (to - from) as usize;
        let first = len.min(data.len() - at);
        let mut out = Vec::with_capacity(len);
        out.extend_from_slice(&data[at..at + first]);
        out.extend_from_slice(&data[..len - first]);
        out
    }

    /// Forgets what the journal holds: nothing is replayed at the next open (the log was cut
    /// below its end, see `request_truncation`).
    pub fn clear(&mut self) {
        self.set_start(0);
        self.set_end(0);
    }
}

impl Drop for Journal {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping `open` made; no view of it outlives `self`.
        unsafe {
            libc::munmap(self.map.cast(), self.map_len);
        }
    }
}

/// Forgets the journal of `shard_dir`, if it has one (before a cut of the log).
pub fn clear_journal(shard_dir: &Path) -> io::Result<()> {
    let path = shard_dir.join(JOURNAL_FILE);
    match std::fs::metadata(&path) {
        Ok(metadata) if metadata.len() >= JOURNAL_HEADER_BYTES as u64 => {}
        Ok(_) => return Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    }
    let file = OpenOptions::new().write(true).open(&path)?;
    std::os::unix::fs::FileExt::write_all_at(&file, &[0u8; 16], END_AT as u64)?;
    file.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_wrap_around_and_the_end_survives_a_reopen() {
        let dir = tempfile::tempdir().unwrap();
        {
            let mut journal = Journal::open(dir.path(), 8192).unwrap();
            assert_eq!(journal.end(), 0);
            let bytes: Vec<u8> = (0..3000u32).map(|i| i as u8).collect();
            // Offsets 7000..10000 wrap: 1192 bytes at the end of the data, the rest at its start.
            journal.copy_in(7000, &bytes);
            journal.set_end(10_000);
            assert_eq!(journal.read(7000, 10_000), bytes);
        }
        let journal = Journal::open(dir.path(), 8192).unwrap();
        assert_eq!(journal.end(), 10_000);
        assert_eq!(journal.read(9000, 9100)[0], ((9000 - 7000) % 256) as u8);
        drop(journal);
        // Another size starts afresh: nothing would be where it is looked for.
        let resized = Journal::open(dir.path(), 16384).unwrap();
        assert_eq!(resized.end(), 0);
        drop(resized);
        let mut journal = Journal::open(dir.path(), 16384).unwrap();
        journal.set_start(100);
        journal.set_end(5000);
        assert!(
            journal.tail_from(99).is_none(),
            "nothing vouched for below start"
        );
        assert_eq!(journal.tail_from(200).unwrap().len(), 4800);
        assert!(journal.tail_from(5000).is_none(), "nothing past the end");
        drop(journal);
        clear_journal(dir.path()).unwrap();
        let journal = Journal::open(dir.path(), 16384).unwrap();
        assert_eq!((journal.start(), journal.end()), (0, 0));
    }
}
