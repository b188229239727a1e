//! The CommitLog's write ring: the newest CommitLog bytes, in memory, in 4 KiB-aligned DMA
//! chunks addressed by offset arithmetic.
//!
//! Owns the chunks. Appended bytes are copied into the ring once; whole chunks then go to disk
//! as they are (the writer hands the chunk's buffer to an O_DIRECT write without copying), and
//! readers get `Bytes` slices of the same memory. It never touches files: the CommitLog decides
//! what to write and when to let chunks go.
//!
//! Chunk `i` of the ring covers physical offsets `[first_base + i * chunk_bytes, … +
//! chunk_bytes)`, so finding the chunk of an offset is one division. Bytes below `valid_from`
//! (the ring's readable start) are not data. A chunk leaves the ring when the CommitLog trims
//! below it; its memory is reused only once no write and no reader holds it: readers on other
//! threads hold a pin (an `Arc`) that the storage core checks before it reuses or frees a chunk.
//! The buffers themselves (glommio `DmaBuffer`s, `!Send`) never leave the storage core.

use std::collections::VecDeque;
use std::rc::Rc;
use std::sync::Arc;

use bytes::Bytes;
use glommio::io::DmaBuffer;

/// Chunks kept for reuse once they leave the ring (beyond this they are freed). Enough that
/// the ring's window sliding forward after a burst of writes does not free chunks only to map
/// fresh ones a moment later: a new chunk costs a page fault and a zeroed page per 4 KiB, which
/// showed as a fifth of the storage core's time in the store benchmark with 8.
const MAX_SPARE_CHUNKS: usize = 32;

struct Chunk {
    buffer: Rc<DmaBuffer>,
    /// One reference held here; every `Bytes` handed to a reader holds another.
    pin: Arc<()>,
}

impl Chunk {
    /// No write in flight and no reader holds this chunk: it may be reused or freed.
    fn is_free(&mut self) -> bool {
        Rc::strong_count(&self.buffer) == 1 && Arc::get_mut(&mut self.pin).is_some()
    }
}

/// What a reader's `Bytes` owns: a pointer into a chunk, kept valid by the pin.
struct PinnedSlice {
    ptr: *const u8,
    len: usize,
    _pin: Arc<()>,
}

// SAFETY: the memory behind `ptr` is only read through this value and is neither written nor
// freed while the pin is held (the ring writes only past the data it hands out, and reuses or
// frees a chunk only when `Arc::get_mut` on its pin succeeds, i.e. after every `PinnedSlice`
// has been dropped, with acquire ordering on that drop).
unsafe impl Send for PinnedSlice {}

impl AsRef<[u8]> for PinnedSlice {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: see the `Send` impl: the range lies in a live chunk and is immutable.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

/// See the module documentation.
pub struct WriteRing {
    chunk_bytes: u64,
    chunks: VecDeque<Chunk>,
    /// Physical offset of `chunks[0]` (a multiple of `chunk_bytes`).
    first_base: u64,
    /// The first readable byte.
    valid_from: u64,
    /// One past the last appended byte.
    end: u64,
    spare: Vec<Chunk>,
    /// Chunks that left the ring while a write or a reader still held them.
    retired: Vec<Chunk>,
    /// Where a record that spans two chunks is patched before it is copied in.
    scratch: Vec<u8>,
    /// New chunks come from the executor's registered I/O memory (see `new_chunk`).
    is_registered: bool,
}

impl WriteRing {
    /// An empty ring whose next byte is at physical offset `at`.
    pub fn new(chunk_bytes: u64, at: u64) -> WriteRing {
        assert!(
            chunk_bytes.is_power_of_two() && chunk_bytes >= 4096,
            "chunk size must be a power of two of at least 4 KiB"
        );
        WriteRing {
            chunk_bytes,
            chunks: VecDeque::new(),
            first_base: at - at % chunk_bytes,
            valid_from: at,
            end: at,
            spare: Vec::new(),
            retired: Vec::new(),
            scratch: Vec::new(),
            is_registered: false,
        }
    }

    /// From now on new chunks come from the running glommio executor's I/O memory, which is
    /// registered with io_uring: a chunk from there is written with `WRITE_FIXED`, without
    /// pinning its pages for every write. When that memory is full a chunk comes from the
    /// heap. Call it only on the executor that owns the ring (the storage core).
    pub fn use_registered_memory(&mut self) {
        self.is_registered = true;
    }

    pub fn chunk_bytes(&self) -> u64 {
        self.chunk_bytes
    }

    /// The first byte readers can be served from memory.
    pub fn valid_from(&self) -> u64 {
        self.valid_from
    }

    pub fn end(&self) -> u64 {
        self.end
    }

    /// Places `data`, which holds the bytes `[valid_from - data.len(), valid_from)` (the
    /// partial block at the end of the data on disk), before the ring's first byte. Only on an
    /// empty ring whose start is not a chunk boundary.
    pub fn prepend_partial(&mut self, data: &[u8]) {
        assert_eq!(self.valid_from, self.end, "prepend only into an empty ring");
        let from = self.valid_from - data.len() as u64;
        assert!(
            from >= self.first_base,
            "prepended bytes must lie in one chunk"
        );
        self.valid_from = from;
        self.end = from;
        self.append(data);
    }

    fn chunk_index(&self, offset: u64) -> usize {
        ((offset - self.first_base) / self.chunk_bytes) as usize
    }

    fn new_chunk(&mut self) -> Chunk {
        match self.spare.pop() {
            Some(chunk) => chunk,
            None => Chunk {
                // The storage core sizes its I/O memory for the ring
                // (`StoreConfig::io_memory_bytes`).
                buffer: Rc::new(if self.is_registered {
                    glommio::allocate_dma_buffer(self.chunk_bytes as usize)
                } else {
                    glommio::allocate_dma_buffer_global(self.chunk_bytes as usize)
                }),
                pin: Arc::new(()),
            },
        }
    }

    /// Copies `data` to the end of the ring.
    pub fn append(&mut self, mut data: &[u8]) {
        while !data.is_empty() {
            let index = self.chunk_index(self.end);
            if index == self.chunks.len() {
                let chunk = self.new_chunk();
                self.chunks.push_back(chunk);
            }
            let within = (self.end % self.chunk_bytes) as usize;
            let take = data.len().min(self.chunk_bytes as usize - within);
            let chunk = &mut self.chunks[index];
            let buffer = Rc::get_mut(&mut chunk.buffer)
                .expect("a chunk still being filled is never being written");
            // SAFETY: `within + take <= chunk_bytes`, the buffer's length; the bytes written lie
            // past everything handed to readers (who only get bytes below `end`), so no reader
            // sees them change. A raw pointer, not `as_bytes_mut`, so that no `&mut` covers the
            // bytes readers on other threads may be looking at.
            unsafe {
                std::ptr::copy_nonoverlapping(data.as_ptr(), buffer.as_mut_ptr().add(within), take);
            }
            self.end += take as u64;
            data = &data[take..];
        }
    }

    /// Appends `len` bytes that `fill` writes, every one of them, before they become readable
    /// (a record copied from a producer's frame with the storage shard's fields patched in, so
    /// a run is copied once, straight from its frame, and the copy is never read back here).
    /// A record that would span two chunks is filled in a scratch buffer first (at most once
    /// a chunk).
    pub fn append_filled(&mut self, len: usize, fill: impl FnOnce(&mut [u8])) {
        let within = (self.end % self.chunk_bytes) as usize;
        if within + len > self.chunk_bytes as usize {
            let mut scratch = std::mem::take(&mut self.scratch);
            scratch.clear();
            scratch.resize(len, 0);
            fill(&mut scratch);
            self.append(&scratch);
            self.scratch = scratch;
            return;
        }
        let index = self.chunk_index(self.end);
        if index == self.chunks.len() {
            let chunk = self.new_chunk();
            self.chunks.push_back(chunk);
        }
        let chunk = &mut self.chunks[index];
        let buffer = Rc::get_mut(&mut chunk.buffer)
            .expect("a chunk still being filled is never being written");
        // SAFETY: `within + len <= chunk_bytes`, the buffer's length; the bytes lie past `end`,
        // so no reader has been handed them, and `end` moves past them only after `fill`. A raw
        // pointer, not `as_bytes_mut`, so that no `&mut` covers bytes readers on other threads
        // may be looking at. The buffer's bytes are initialized (glommio hands DMA buffers out
        // as byte slices), so the slice may be read as well as written.
        let destination =
            unsafe { std::slice::from_raw_parts_mut(buffer.as_mut_ptr().add(within), len) };
        fill(destination);
        self.end += len as u64;
    }

    /// Appends `len` zero bytes (the body of a segment's blank filler).
    pub fn append_zeros(&mut self, mut len: u64) {
        const ZEROS: [u8; 4096] = [0; 4096];
        while len > 0 {
            let take = len.min(ZEROS.len() as u64);
            self.append(&ZEROS[..take as usize]);
            len -= take;
        }
    }

    fn chunk_ptr(&self, offset: u64) -> *const u8 {
        let chunk = &self.chunks[self.chunk_index(offset)];
        // SAFETY: `offset` lies in this chunk, so the result is inside the buffer.
        unsafe {
            chunk
                .buffer
                .as_ptr()
                .add((offset % self.chunk_bytes) as usize)
        }
    }

    /// `[from, to)` without copying, if it lies in memory and within one chunk.
    pub fn slice(&self, from: u64, to: u64) -> Option<Bytes> {
        if from < self.valid_from || to > self.end || from >= to {
            return None;
        }
        let index = self.chunk_index(from);
        if self.chunk_index(to - 1) != index {
            return None;
        }
        Some(Bytes::from_owner(PinnedSlice {
            ptr: self.chunk_ptr(from),
            len: (to - from) as usize,
            _pin: self.chunks[index].pin.clone(),
        }))
    }

    /// `[from, to)` from memory: a slice when it lies in one chunk, else a copy. `None` when
    /// part of it is not in the ring.
    pub fn read(&self, from: u64, to: u64) -> Option<Bytes> {
        if from < self.valid_from || to > self.end {
            return None;
        }
        if from == to {
            return Some(Bytes::new());
        }
        self.slice(from, to).or_else(|| {
            let mut out = vec![0u8; (to - from) as usize];
            self.copy_to(from, &mut out);
            Some(Bytes::from(out))
        })
    }

    /// Copies the bytes from `from` into `out` (all of them must be in the ring).
    pub fn copy_to(&self, from: u64, out: &mut [u8]) {
        let to = from + out.len() as u64;
        assert!(
            from >= self.valid_from && to <= self.end,
            "copy of [{from}, {to}) outside the ring [{}, {})",
            self.valid_from,
            self.end
        );
        let mut at = from;
        let mut written = 0usize;
        while at < to {
            let within = at % self.chunk_bytes;
            let take = (to - at).min(self.chunk_bytes - within) as usize;
            // SAFETY: `[at, at + take)` lies in one chunk and below `end`.
            let source = unsafe { std::slice::from_raw_parts(self.chunk_ptr(at), take) };
            out[written..written + take].copy_from_slice(source);
            written += take;
            at += take as u64;
        }
    }

    /// Calls `visit(offset, bytes)` for the bytes `[from, to)`, a chunk's part at a time (all of
    /// them must be in the ring).
    pub fn visit(&self, from: u64, to: u64, visit: &mut dyn FnMut(u64, &[u8])) {
        assert!(
            from >= self.valid_from && to <= self.end,
            "visit of [{from}, {to}) outside the ring [{}, {})",
            self.valid_from,
            self.end
        );
        let mut at = from;
        while at < to {
            let within = at % self.chunk_bytes;
            let take = (to - at).min(self.chunk_bytes - within) as usize;
            // SAFETY: `[at, at + take)` lies in one chunk and below `end`.
            let bytes = unsafe { std::slice::from_raw_parts(self.chunk_ptr(at), take) };
            visit(at, bytes);
            at += take as u64;
        }
    }

    /// The buffer of the full chunk starting at `base`, to write without copying.
    pub fn full_chunk(&self, base: u64) -> Rc<DmaBuffer> {
        assert!(
            base.is_multiple_of(self.chunk_bytes)
                && base >= self.first_base
                && base + self.chunk_bytes <= self.end,
            "chunk at {base} is not full"
        );
        self.chunks[self.chunk_index(base)].buffer.clone()
    }

    /// Lets go of every chunk wholly below `offset` (which must not pass `end`).
    pub fn trim_below(&mut self, offset: u64) {
        debug_assert!(offset <= self.end);
        while self.first_base + self.chunk_bytes <= offset && !self.chunks.is_empty() {
            let chunk = self.chunks.pop_front().expect("not empty");
            self.first_base += self.chunk_bytes;
            self.release(chunk);
        }
        self.valid_from = self.valid_from.max(self.first_base.min(self.end));
        let retired = std::mem::take(&mut self.retired);
        for chunk in retired {
            self.release(chunk);
        }
    }

    /// Empties the ring and places its next byte at `at` (recovery's truncation).
    pub fn reset(&mut self, at: u64) {
        while let Some(chunk) = self.chunks.pop_front() {
            self.release(chunk);
        }
        self.first_base = at - at % self.chunk_bytes;
        self.valid_from = at;
        self.end = at;
    }

    fn release(&mut self, mut chunk: Chunk) {
        if !chunk.is_free() {
            self.retired.push(chunk);
        } else if self.spare.len() < MAX_SPARE_CHUNKS {
            self.spare.push(chunk);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_slice_within_one_chunk_is_not_copied_and_outlives_a_trim() {
        {
            let mut ring = WriteRing::new(4096, 0);
            ring.append(&[7u8; 5000]);
            let slice = ring.slice(100, 200).expect("in one chunk");
            assert!(ring.slice(4000, 4200).is_none(), "crosses a chunk boundary");
            assert_eq!(ring.read(4000, 4200).expect("in memory").len(), 200);
            ring.trim_below(4096);
            assert_eq!(ring.valid_from(), 4096);
            assert!(ring.read(100, 200).is_none(), "trimmed away");
            // The pinned chunk was retired, not reused: the slice still reads its bytes.
            ring.append(&[9u8; 8192]);
            assert_eq!(&slice[..], &[7u8; 100][..]);
            drop(slice);
            ring.trim_below(8192);
            assert!(ring.retired.is_empty(), "released once the reader let go");
        }
    }

    #[test]
    fn filled_records_land_within_and_across_chunks() {
        let mut ring = WriteRing::new(4096, 0);
        for i in 0..9u8 {
            // The fifth record (bytes 4000..5000) spans the first chunk boundary.
            ring.append_filled(1000, |copy| {
                assert_eq!(copy.len(), 1000);
                copy.fill(3);
                copy[0] = i;
                copy[999] = i;
            });
        }
        assert_eq!(ring.end(), 9000);
        let mut out = vec![0u8; 9000];
        ring.copy_to(0, &mut out);
        for i in 0..9usize {
            let copy = &out[i * 1000..(i + 1) * 1000];
            assert_eq!((copy[0], copy[999]), (i as u8, i as u8));
            assert!(copy[1..999].iter().all(|&b| b == 3));
        }
    }

    #[test]
    fn a_full_chunk_being_written_is_not_reused() {
        {
            let mut ring = WriteRing::new(4096, 0);
            ring.append(&[1u8; 4096]);
            let in_flight = ring.full_chunk(0);
            ring.trim_below(4096);
            ring.append(&[2u8; 4096]);
            assert!(in_flight.as_bytes().iter().all(|&b| b == 1));
            drop(in_flight);
            ring.trim_below(8192);
            assert!(ring.retired.is_empty());
            assert_eq!(ring.spare.len(), 2);
        }
    }

    #[test]
    fn a_ring_starting_mid_chunk_takes_the_partial_block_before_it() {
        {
            let mut ring = WriteRing::new(8192, 4096 + 100);
            ring.prepend_partial(&[5u8; 100]);
            assert_eq!(ring.valid_from(), 4096);
            ring.append(&[6u8; 10]);
            let bytes = ring.read(4096, 4206).expect("in memory");
            assert_eq!(&bytes[..100], &[5u8; 100][..]);
            assert_eq!(&bytes[100..], &[6u8; 10][..]);
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        /// Random appends, reads and trims against a plain byte vector.
        #[test]
        fn the_ring_reads_back_what_was_appended(
            start in 0u64..20_000,
            appends in proptest::collection::vec(0usize..9_000, 1..40),
            reads in proptest::collection::vec((any::<u16>(), any::<u16>()), 1..40),
            trim_every in 1usize..8,
        ) {
            let outcome = (move || -> Result<(), String> {
                let mut ring = WriteRing::new(4096, start);
                let mut model: Vec<u8> = Vec::new();
                let mut held: Vec<(u64, Bytes)> = Vec::new();
                for (step, len) in appends.iter().enumerate() {
                    let data: Vec<u8> = (0..*len).map(|i| (model.len() + i) as u8 ^ step as u8).collect();
                    ring.append(&data);
                    model.extend_from_slice(&data);
                    let end = start + model.len() as u64;
                    if ring.end() != end {
                        return Err(format!("end {} != {end}", ring.end()));
                    }
                    for (a, b) in &reads {
                        let span = end - ring.valid_from();
                        if span == 0 { continue; }
                        let from = ring.valid_from() + u64::from(*a) % span;
                        let to = (from + u64::from(*b) % 10_000).min(end);
                        let got = ring.read(from, to).ok_or("in memory")?;
                        let want = &model[(from - start) as usize..(to - start) as usize];
                        if &got[..] != want {
                            return Err(format!("read [{from}, {to}) differs"));
                        }
                        if let Some(slice) = ring.slice(from, to) {
                            held.push((from, slice));
                        }
                    }
                    if step % trim_every == 0 {
                        ring.trim_below(end.saturating_sub(5_000).max(start));
                    }
                }
                // Everything handed out is still intact after trims and reuse.
                for (from, bytes) in &held {
                    let at = (from - start) as usize;
                    if bytes[..] != model[at..at + bytes.len()] {
                        return Err(format!("held slice at {from} changed"));
                    }
                }
                Ok(())
            })();
            prop_assert!(outcome.is_ok(), "{:?}", outcome);
        }
    }
}
