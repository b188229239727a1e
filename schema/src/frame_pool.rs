//! Receive buffers for large frames, kept for reuse once the last `Bytes` of a frame is dropped.
//!
//! A pull answer or a producer's batch is about a megabyte. Read into a new allocation each
//! time, it costs the kernel a page fault and a zeroed page per 4 KiB, and glibc unmaps it again
//! when it is freed; grown step by step in one buffer, it costs a `realloc` that copies the whole
//! old block. A [`PooledBuffer`] is read into once, frozen into `Bytes` without a copy
//! ([`PooledBuffer::into_bytes`]), and its memory goes back to its [`FramePool`] when the last
//! slice of it is dropped, on whichever thread that happens, to be read into again.
//!
//! The pool keeps at most `max_kept_bytes` of buffers; a buffer that would pass that bound, or
//! is larger than it, is freed as usual. Taking a buffer never waits: an empty pool allocates.

use std::sync::Mutex;

use bytes::Bytes;

/// See the module documentation.
#[derive(Debug)]
pub struct FramePool {
    free: Mutex<Vec<Vec<u8>>>,
    max_kept_bytes: usize,
}

/// Buffers are allocated in whole steps of this size, so that frames of slightly different
/// sizes find each other's buffers.
const ALLOCATION_STEP_BYTES: usize = 256 << 10;

impl FramePool {
    /// A pool that keeps at most `max_kept_bytes` of free buffers.
    #[must_use]
    pub const fn new(max_kept_bytes: usize) -> FramePool {
        FramePool {
            free: Mutex::new(Vec::new()),
            max_kept_bytes,
        }
    }

    /// An empty buffer of at least `capacity` bytes: a kept one when one is large enough,
    /// otherwise a new one.
    pub fn take(&'static self, capacity: usize) -> PooledBuffer {
        let kept = {
            let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
            free.iter()
                .position(|buffer| buffer.capacity() >= capacity)
                .map(|at| free.swap_remove(at))
        };
        let buffer = kept.unwrap_or_else(|| {
            Vec::with_capacity(capacity.next_multiple_of(ALLOCATION_STEP_BYTES))
        });
        PooledBuffer { buffer, pool: self }
    }

    /// Bytes of free buffers kept now.
    pub fn kept_bytes(&self) -> usize {
        let free = self.free.lock().unwrap_or_else(|e| e.into_inner());
        free.iter().map(Vec::capacity).sum()
    }

    fn give_back(&self, mut buffer: Vec<u8>) {
        let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
        let kept: usize = free.iter().map(Vec::capacity).sum();
        if kept + buffer.capacity() <= self.max_kept_bytes {
            buffer.clear();
            free.push(buffer);
        }
    }
}

/// A buffer of a [`FramePool`]: fill it through [`PooledBuffer::vec_mut`], then
/// [`into_bytes`](PooledBuffer::into_bytes). Dropped, it goes back to its pool.
#[derive(Debug)]
pub struct PooledBuffer {
    buffer: Vec<u8>,
    pool: &'static FramePool,
}

impl PooledBuffer {
    /// The buffer to read into (empty when taken; its capacity as asked or more).
    pub fn vec_mut(&mut self) -> &mut Vec<u8> {
        &mut self.buffer
    }

    /// Bytes held.
    #[must_use]
    pub fn len(&self) -> usize {
        self.buffer.len()
    }

    /// Whether nothing is held yet.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.buffer.is_empty()
    }

    /// The bytes read, as `Bytes` over this buffer's memory (no copy); the memory returns to
    /// the pool when the last slice of them is dropped.
    #[must_use]
    pub fn into_bytes(self) -> Bytes {
        Bytes::from_owner(self)
    }
}

impl AsRef<[u8]> for PooledBuffer {
    fn as_ref(&self) -> &[u8] {
        &self.buffer
    }
}

impl Drop for PooledBuffer {
    fn drop(&mut self) {
        self.pool.give_back(std::mem::take(&mut self.buffer));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_buffer_returns_when_its_last_slice_is_dropped_and_is_taken_again() {
        static POOL: FramePool = FramePool::new(4 << 20);
        let mut buffer = POOL.take(1 << 20);
        assert!(buffer.is_empty());
        buffer.vec_mut().extend_from_slice(&[5u8; 1000]);
        let address = buffer.as_ref().as_ptr();
        let bytes = buffer.into_bytes();
        let slice = bytes.slice(10..20);
        drop(bytes);
        assert_eq!(POOL.kept_bytes(), 0, "a slice still holds the buffer");
        assert_eq!(&slice[..], &[5u8; 10]);
        drop(slice);
        assert!(POOL.kept_bytes() >= 1 << 20);

        let again = POOL.take(1 << 20);
        assert_eq!(
            again.as_ref().as_ptr(),
            address,
            "the same memory, read into again"
        );
        assert!(again.is_empty());
        drop(again);

        // Larger than any kept buffer: a new one. Given back, it would pass the pool's bound
        // beside the kept one, so it is freed.
        let mut larger = POOL.take(3 << 20 | 1);
        assert!(larger.vec_mut().capacity() > 3 << 20);
        drop(larger);
        assert_eq!(POOL.kept_bytes(), 1 << 20);
    }

    #[test]
    fn a_buffer_dropped_on_another_thread_returns_too() {
        static POOL: FramePool = FramePool::new(2 << 20);
        let mut buffer = POOL.take(512 << 10);
        buffer.vec_mut().push(1);
        let bytes = buffer.into_bytes();
        std::thread::spawn(move || drop(bytes)).join().unwrap();
        assert!(POOL.kept_bytes() >= 512 << 10);
    }
}
