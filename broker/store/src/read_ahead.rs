//! The read-ahead cache: CommitLog spans read from segment files for pulls, kept in memory so
//! that a consumer draining a backlog finds the records of its next pull already read while
//! its current answer is on the wire.
//!
//! Owns the cached spans (the O_DIRECT read buffers themselves, handed to readers as `Bytes`
//! slices without a copy), the ConsumeQueue entries read ahead for a queue's next pull (one run per queue), and the
//! byte bound (`readahead_bytes`): it counts spans being read, spans cached, spans evicted
//! while a reader (a pull answer on its way out) still holds a slice of them, and entries.
//! Never: reading files, deciding what to read ahead, or validating a record or
//! cross-checking it against its ConsumeQueue entry (the message store's read path does these); it never holds a byte the
//! caller did not read below the CommitLog's written offset.
//!
//! Data enters by [`ReadAhead::reserve`] (room for a read, which also marks the range as being
//! read so that nobody reads it twice) and [`ReadTicket::complete`], and leaves as
//! [`SpanRead`]s from [`ReadAhead::lookup`]. Spans leave oldest first when a reservation needs
//! room, and at once when [`ReadAhead::forget_outside`] says the log no longer holds their
//! bytes (retention deleted the segment, or the log was cut).
//!
//! The buffers are `!Send` (glommio's) and stay on the storage core; a slice handed to another
//! thread holds a pin (an `Arc`), and a buffer is freed only once its pin is unique, checked on
//! this core (as the write ring does with its chunks).

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::rc::Rc;
use std::sync::Arc;

use bytes::Bytes;

use crate::consume_queue::ConsumeQueueEntry;
use crate::notify::{LocalNotify, Notified};
use crate::record::RECORD_HEAD_BYTES;

/// The smallest useful bound: a 1 MiB span being served and the next one read ahead.
pub const MIN_READAHEAD_BYTES: u64 = 2 << 20;

/// Most ConsumeQueue entries kept for one queue (four pulls' worth at a pull's most).
pub const MAX_ENTRIES_PER_QUEUE: usize = 4096;

fn entries_bytes(count: usize) -> u64 {
    (count * std::mem::size_of::<ConsumeQueueEntry>()) as u64
}

/// Counters of the cache's work since the store opened.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ReadAheadStats {
    /// Lookups served from a cached span.
    pub hits: u64,
    /// Lookups that found nothing cached or being read.
    pub misses: u64,
    /// Lookups that found their range still being read (and waited for it).
    pub waits: u64,
    /// Time pulls spent waiting for reads in flight, µs.
    pub waited_us: u64,
    /// Reads reserved (for a pull that missed, or ahead of one).
    pub reads: u64,
    /// Reservations refused for want of room under the bound.
    pub refused: u64,
    /// Spans dropped to make room or because the log no longer holds them.
    pub evicted: u64,
    /// Pulls that found their ConsumeQueue entries read ahead.
    pub entry_hits: u64,
}

/// What [`ReadAhead::lookup`] found for a range.
pub enum Lookup {
    /// A cached span holds the range.
    Hit(SpanRead),
    /// A read that will hold the range is in flight: wait for [`ReadAhead::finished`] (made
    /// before the next await, so that no completion is missed) and look again.
    Reading,
    /// Neither.
    Miss,
}

/// Bytes of a cached span from a looked-up offset to the span's end.
#[derive(Clone)]
pub struct SpanRead {
    /// Physical offset of `bytes[0]`.
    pub from: u64,
    pub bytes: Bytes,
}

impl SpanRead {
    /// Asks the CPU to bring into its cache the lines of the record at physical offset `start`,
    /// `size` bytes, that a client's pull reads: its head (size, magic, queue, offsets; one or
    /// two lines). A span arrives by DMA, not through the cache, so each head read is otherwise
    /// a miss in series; asked a few records ahead, the misses overlap. Nothing is read;
    /// outside the span it does nothing.
    pub fn prefetch_record(&self, start: u64, size: u32) {
        let Some(within) = start.checked_sub(self.from) else {
            return;
        };
        let (within, size) = (within as usize, size as usize);
        if size == 0 || within.saturating_add(size) > self.bytes.len() {
            return;
        }
        let record = &self.bytes[within..within + size];
        for at in [0, RECORD_HEAD_BYTES - 1] {
            prefetch(&record[at.min(size - 1)]);
        }
    }
}

/// A hint to load the cache line holding `byte`; it never faults and changes nothing.
#[inline]
fn prefetch(byte: &u8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: SSE is part of every x86_64 target, and a prefetch of a valid reference neither
    // reads it architecturally nor writes anything.
    unsafe {
        core::arch::x86_64::_mm_prefetch::<{ core::arch::x86_64::_MM_HINT_T0 }>(
            std::ptr::from_ref(byte).cast(),
        );
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = byte;
}

/// A span's buffer: memory that stays put and is only read once filled.
pub type SpanBuffer = Box<dyn AsRef<[u8]>>;

/// A buffer readers may hold slices of.
struct Held {
    buffer: SpanBuffer,
    /// One reference here; every slice handed out holds another.
    pin: Arc<()>,
}

impl Held {
    /// No reader holds a slice: the buffer may be freed.
    fn is_free(&mut self) -> bool {
        Arc::get_mut(&mut self.pin).is_some()
    }
}

enum Content {
    Reading,
    Ready(Held),
}

struct Span {
    id: u64,
    from: u64,
    /// Bytes held (ready) or being read (reading).
    len: u64,
    /// Bytes charged to the bound (what the read may fill, at least `len`).
    charged: u64,
    content: Content,
}

impl Span {
    fn covers(&self, from: u64, to: u64) -> bool {
        from >= self.from && to <= self.from + self.len
    }

    /// The span's bytes from `from` (which it must hold) to its end; `None` while being read.
    fn read_from(&self, from: u64) -> Option<SpanRead> {
        let Content::Ready(held) = &self.content else {
            return None;
        };
        debug_assert!(from >= self.from && from < self.from + self.len);
        let within = (from - self.from) as usize;
        let data = held.buffer.as_ref().as_ref();
        let slice = PinnedSlice {
            // SAFETY: `within < len <= data.len()`: the span holds `from`.
            ptr: unsafe { data.as_ptr().add(within) },
            len: self.len as usize - within,
            _pin: held.pin.clone(),
        };
        Some(SpanRead {
            from,
            bytes: Bytes::from_owner(slice),
        })
    }
}

struct Evicted {
    held: Held,
    charged: u64,
}

/// ConsumeQueue entries of one queue from queue offset `from`, read for its next pull.
struct EntriesAhead {
    topic: String,
    queue_id: u32,
    from: u64,
    entries: Vec<ConsumeQueueEntry>,
    charged: u64,
}

#[derive(Default)]
struct State {
    /// Oldest first (the eviction order).
    spans: VecDeque<Span>,
    /// Spans evicted while a reader held a slice; freed once it lets go.
    evicted: Vec<Evicted>,
    /// At most one run per queue, oldest first.
    entries: VecDeque<EntriesAhead>,
    /// Bytes charged by reading, cached and evicted-but-held spans.
    used_bytes: u64,
    next_id: u64,
    stats: ReadAheadStats,
}

struct Shared {
    limit_bytes: u64,
    state: RefCell<State>,
    /// A read finished (or was abandoned): waiting lookups look again.
    finished: LocalNotify,
}

/// See the module documentation. Cloning shares the same cache.
#[derive(Clone)]
pub struct ReadAhead {
    shared: Rc<Shared>,
}

/// Room reserved for one read of `[from, from + len)`; the range counts as being read until
/// [`complete`](Self::complete) (or until dropped, when the read failed or was abandoned).
#[must_use]
pub struct ReadTicket {
    shared: Rc<Shared>,
    id: u64,
    pub from: u64,
    pub len: u64,
    is_done: Cell<bool>,
}

/// What a reader's `Bytes` owns: a pointer into a held buffer, kept valid by the pin.
struct PinnedSlice {
    ptr: *const u8,
    len: usize,
    _pin: Arc<()>,
}

// SAFETY: the memory behind `ptr` is only read through this value; it is never written after the
// buffer was filled, and it is freed (on the storage core) only when `Arc::get_mut` on its pin
// succeeds, i.e. after every `PinnedSlice` of it has been dropped (with acquire ordering on that
// drop).
unsafe impl Send for PinnedSlice {}

impl AsRef<[u8]> for PinnedSlice {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: see the `Send` impl: the range lies in a live, immutable buffer.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

impl ReadAhead {
    /// A cache holding at most `limit_bytes` (0: nothing is ever cached).
    pub fn new(limit_bytes: u64) -> ReadAhead {
        ReadAhead {
            shared: Rc::new(Shared {
                limit_bytes,
                state: RefCell::new(State::default()),
                finished: LocalNotify::default(),
            }),
        }
    }

    pub fn limit_bytes(&self) -> u64 {
        self.shared.limit_bytes
    }

    pub fn is_enabled(&self) -> bool {
        self.shared.limit_bytes > 0
    }

    /// Bytes charged to the bound now (reading, cached, evicted but still held by readers).
    pub fn used_bytes(&self) -> u64 {
        let mut state = self.shared.state.borrow_mut();
        release_evicted(&mut state);
        state.used_bytes
    }

    pub fn stats(&self) -> ReadAheadStats {
        self.shared.state.borrow().stats
    }

    /// The cached span holding `[from, from + min_len)`, or the read in flight that will.
    pub fn lookup(&self, from: u64, min_len: u64) -> Lookup {
        let mut state = self.shared.state.borrow_mut();
        let to = from.saturating_add(min_len.max(1));
        let mut is_reading = false;
        let mut best: Option<&Span> = None;
        for span in state.spans.iter().filter(|s| s.covers(from, to)) {
            match span.content {
                Content::Reading => is_reading = true,
                Content::Ready(_) => {
                    if best.is_none_or(|b| span.from + span.len > b.from + b.len) {
                        best = Some(span);
                    }
                }
            }
        }
        let found = best.map(|span| span.read_from(from));
        match found.flatten() {
            Some(read) => {
                state.stats.hits += 1;
                Lookup::Hit(read)
            }
            None if is_reading => {
                state.stats.waits += 1;
                Lookup::Reading
            }
            None => {
                state.stats.misses += 1;
                Lookup::Miss
            }
        }
    }

    /// Whether a cached span or a read in flight holds `[from, from + len)` (not counted as a
    /// lookup: for planning reads ahead).
    pub fn holds(&self, from: u64, len: u64) -> bool {
        let to = from.saturating_add(len.max(1));
        self.shared
            .state
            .borrow()
            .spans
            .iter()
            .any(|span| span.covers(from, to))
    }

    /// Counts `waited` against [`ReadAheadStats::waited_us`].
    pub fn add_wait(&self, waited: std::time::Duration) {
        self.shared.state.borrow_mut().stats.waited_us += waited.as_micros() as u64;
    }

    /// Completes when a read next finishes or is abandoned (after [`Lookup::Reading`]).
    pub fn finished(&self) -> Notified<'_> {
        self.shared.finished.notified()
    }

    /// Reserves room for a read of `[from, from + len)`, evicting the oldest cached spans
    /// (never one being read) as needed. `None` when the bound leaves no room, or a read
    /// in flight already covers the range.
    pub fn reserve(&self, from: u64, len: u64) -> Option<ReadTicket> {
        let shared = &self.shared;
        let mut state = shared.state.borrow_mut();
        if len == 0 || len > shared.limit_bytes {
            state.stats.refused += u64::from(len > 0);
            return None;
        }
        let to = from.saturating_add(len);
        if state
            .spans
            .iter()
            .any(|s| matches!(s.content, Content::Reading) && s.covers(from, to))
        {
            return None;
        }
        if !make_room(&mut state, len, shared.limit_bytes) {
            state.stats.refused += 1;
            return None;
        }
        let id = state.next_id;
        state.next_id += 1;
        state.used_bytes += len;
        state.stats.reads += 1;
        state.spans.push_back(Span {
            id,
            from,
            len,
            charged: len,
            content: Content::Reading,
        });
        Some(ReadTicket {
            shared: shared.clone(),
            id,
            from,
            len,
            is_done: Cell::new(false),
        })
    }

    /// Keeps `entries`, the ConsumeQueue entries of (topic, queue) from queue offset `from`,
    /// for the queue's next pulls: after the run kept for the queue when they continue it,
    /// else instead of it. At most [`MAX_ENTRIES_PER_QUEUE`] are kept (the oldest go first);
    /// none when there is no room.
    pub fn put_entries(
        &self,
        topic: &str,
        queue_id: u32,
        from: u64,
        entries: Vec<ConsumeQueueEntry>,
    ) {
        let mut state = self.shared.state.borrow_mut();
        let mut run = match state
            .entries
            .iter()
            .position(|e| e.queue_id == queue_id && e.topic == topic)
        {
            Some(index) => {
                let old = state.entries.remove(index).expect("index found above");
                state.used_bytes -= old.charged;
                old
            }
            None => EntriesAhead {
                topic: topic.to_owned(),
                queue_id,
                from,
                entries: Vec::new(),
                charged: 0,
            },
        };
        if run.from + run.entries.len() as u64 == from {
            run.entries.extend(entries);
        } else {
            run.from = from;
            run.entries = entries;
        }
        let excess = run.entries.len().saturating_sub(MAX_ENTRIES_PER_QUEUE);
        run.entries.drain(..excess);
        run.from += excess as u64;
        run.charged = entries_bytes(run.entries.len());
        if run.entries.is_empty() || !make_room(&mut state, run.charged, self.shared.limit_bytes) {
            return;
        }
        state.used_bytes += run.charged;
        state.entries.push_back(run);
    }

    /// Up to `max` entries kept for (topic, queue) from queue offset `from` on (those before
    /// `from` are dropped: a queue is pulled forwards).
    pub fn take_entries(
        &self,
        topic: &str,
        queue_id: u32,
        from: u64,
        max: usize,
    ) -> Option<Vec<ConsumeQueueEntry>> {
        let mut state = self.shared.state.borrow_mut();
        let State {
            entries: runs,
            used_bytes,
            stats,
            ..
        } = &mut *state;
        let run = runs.iter_mut().find(|e| {
            e.queue_id == queue_id
                && e.topic == topic
                && from >= e.from
                && from < e.from + e.entries.len() as u64
        })?;
        run.entries.drain(..(from - run.from) as usize);
        run.from = from;
        let charged = entries_bytes(run.entries.len());
        *used_bytes -= run.charged - charged;
        run.charged = charged;
        stats.entry_hits += 1;
        Some(run.entries[..max.min(run.entries.len())].to_vec())
    }

    /// A copy of up to `max` entries kept for (topic, queue) from queue offset `from` on (none
    /// when they do not hold `from`), leaving them kept.
    pub fn peek_entries(
        &self,
        topic: &str,
        queue_id: u32,
        from: u64,
        max: usize,
    ) -> Vec<ConsumeQueueEntry> {
        let state = self.shared.state.borrow();
        state
            .entries
            .iter()
            .find(|e| e.queue_id == queue_id && e.topic == topic)
            .and_then(|e| e.entries.get((from.checked_sub(e.from)?) as usize..))
            .map(|entries| entries[..max.min(entries.len())].to_vec())
            .unwrap_or_default()
    }

    /// Where the entries kept for (topic, queue) that hold queue offset `from` end.
    pub fn entries_end(&self, topic: &str, queue_id: u32, from: u64) -> Option<u64> {
        let state = self.shared.state.borrow();
        state
            .entries
            .iter()
            .find(|e| e.queue_id == queue_id && e.topic == topic)
            .map(|e| e.from + e.entries.len() as u64)
            .filter(|&end| end > from)
    }

    /// Drops every span that does not lie wholly in `[min, end)`: bytes retention deleted
    /// (below the log's new start) or a cut took away (past its new end). A read in flight
    /// over such bytes is discarded when it completes.
    pub fn forget_outside(&self, min: u64, end: u64) {
        let mut state = self.shared.state.borrow_mut();
        let mut kept = VecDeque::with_capacity(state.spans.len());
        let spans = std::mem::take(&mut state.spans);
        for span in spans {
            if span.from >= min && span.from + span.len <= end {
                kept.push_back(span);
            } else {
                evict(&mut state, span);
            }
        }
        state.spans = kept;
        // Entries are cheap to read again; those of deleted records would only be skipped.
        let dropped: u64 = state.entries.drain(..).map(|e| e.charged).sum();
        state.used_bytes -= dropped;
        release_evicted(&mut state);
    }
}

impl ReadTicket {
    /// The read filled `buffer` with `[from, from + buffer.len())` (at most `len`, at least the
    /// bytes the caller will look up). Returns the span from `from` (unless the range was
    /// forgotten meanwhile, when the buffer is dropped).
    pub fn complete(self, buffer: SpanBuffer) -> Option<SpanRead> {
        self.is_done.set(true);
        let shared = self.shared.clone();
        let len = (buffer.as_ref().as_ref().len() as u64).min(self.len);
        let mut state = shared.state.borrow_mut();
        let read = match state.spans.iter_mut().find(|s| s.id == self.id) {
            Some(span) if len > 0 => {
                span.len = len;
                span.content = Content::Ready(Held {
                    buffer,
                    pin: Arc::new(()),
                });
                span.read_from(self.from)
            }
            Some(_) => {
                remove_reading(&mut state, self.id);
                None
            }
            // Forgotten while it was read: give its room back.
            None => {
                state.used_bytes -= self.len;
                None
            }
        };
        drop(state);
        shared.finished.notify_all();
        read
    }
}

impl Drop for ReadTicket {
    fn drop(&mut self) {
        if self.is_done.get() {
            return;
        }
        let mut state = self.shared.state.borrow_mut();
        if !remove_reading(&mut state, self.id) {
            // Forgotten while it was read: its charge is still held.
            state.used_bytes -= self.len;
        }
        drop(state);
        self.shared.finished.notify_all();
    }
}

/// Frees room for `len` more bytes under `limit_bytes`: evicted buffers readers let go, then
/// the oldest cached spans (never one being read), then the oldest entries kept (small, and
/// wanted by the next pulls). False when that is not enough.
fn make_room(state: &mut State, len: u64, limit_bytes: u64) -> bool {
    release_evicted(state);
    while state.used_bytes + len > limit_bytes {
        if let Some(index) = state
            .spans
            .iter()
            .position(|s| matches!(s.content, Content::Ready(_)))
        {
            let span = state.spans.remove(index).expect("index found above");
            evict(state, span);
            continue;
        }
        let Some(entries) = state.entries.pop_front() else {
            return false;
        };
        state.used_bytes -= entries.charged;
    }
    true
}

/// Removes the reading span `id`, giving back its charge; false if it is not there.
fn remove_reading(state: &mut State, id: u64) -> bool {
    let Some(index) = state.spans.iter().position(|s| s.id == id) else {
        return false;
    };
    let span = state.spans.remove(index).expect("index found above");
    state.used_bytes -= span.charged;
    true
}

/// Takes a span out of use: its buffer is freed now or once no reader holds it. A span still
/// being read keeps its charge until its ticket completes or drops.
fn evict(state: &mut State, span: Span) {
    state.stats.evicted += 1;
    match span.content {
        Content::Reading => {}
        Content::Ready(mut held) => {
            if held.is_free() {
                state.used_bytes -= span.charged;
            } else {
                state.evicted.push(Evicted {
                    held,
                    charged: span.charged,
                });
            }
        }
    }
}

/// Frees the evicted buffers no reader holds any more.
fn release_evicted(state: &mut State) {
    let mut freed = 0;
    state.evicted.retain_mut(|evicted| {
        if evicted.held.is_free() {
            freed += evicted.charged;
            false
        } else {
            true
        }
    });
    state.used_bytes -= freed;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn filled(ticket: ReadTicket, byte: u8) -> Option<SpanRead> {
        let len = ticket.len as usize;
        ticket.complete(Box::new(vec![byte; len]))
    }

    fn hit(cache: &ReadAhead, from: u64, len: u64) -> Option<SpanRead> {
        match cache.lookup(from, len) {
            Lookup::Hit(read) => Some(read),
            _ => None,
        }
    }

    #[test]
    fn a_completed_read_is_a_hit_within_it_and_a_miss_outside() {
        let cache = ReadAhead::new(1 << 20);
        assert!(matches!(cache.lookup(1000, 10), Lookup::Miss));
        let ticket = cache.reserve(1000, 4096).expect("room");
        assert!(matches!(cache.lookup(1000, 10), Lookup::Reading));
        assert!(cache.reserve(1000, 100).is_none(), "already being read");
        let ticket_read = ticket.complete(Box::new(vec![7u8; 4096]));
        assert_eq!(ticket_read.expect("the span").bytes.len(), 4096);
        let read = hit(&cache, 1500, 100).expect("inside the span");
        assert_eq!((read.from, read.bytes.len()), (1500, 4096 - 500));
        assert!(read.bytes.iter().all(|&b| b == 7));
        assert!(hit(&cache, 1000 + 4090, 10).is_none(), "runs past the span");
        assert!(hit(&cache, 999, 10).is_none(), "starts before the span");
        let stats = cache.stats();
        assert_eq!((stats.hits, stats.reads), (1, 1));
        assert!(stats.misses >= 2);
    }

    #[test]
    fn a_prefetch_reads_nothing_outside_its_span() {
        let read = SpanRead {
            from: 1000,
            bytes: Bytes::from(vec![1u8; 300]),
        };
        // Whole records at the span's start, its end, and of one byte; then ranges that are
        // not wholly inside it, which must be left alone rather than sliced.
        for (start, size) in [(1000, 300), (1200, 100), (1299, 1), (1000, 40)] {
            read.prefetch_record(start, size);
        }
        for (start, size) in [(999, 10), (1250, 51), (1300, 1), (1000, 0), (0, u32::MAX)] {
            read.prefetch_record(start, size);
        }
        read.prefetch_record(u64::MAX, u32::MAX);
    }

    #[test]
    fn the_byte_bound_holds_and_evicts_oldest_first() {
        let cache = ReadAhead::new(10_000);
        filled(cache.reserve(0, 4000).unwrap(), 1);
        filled(cache.reserve(4000, 4000).unwrap(), 2);
        assert_eq!(cache.used_bytes(), 8000);
        filled(cache.reserve(8000, 4000).unwrap(), 3);
        assert!(cache.used_bytes() <= 10_000);
        assert!(hit(&cache, 0, 10).is_none(), "the oldest span made room");
        assert!(hit(&cache, 4000, 10).is_some() && hit(&cache, 8000, 10).is_some());
        assert!(
            cache.reserve(20_000, 20_000).is_none(),
            "larger than the bound"
        );
        assert_eq!(cache.stats().refused, 1);
    }

    #[test]
    fn a_span_a_reader_holds_counts_until_it_is_let_go() {
        let cache = ReadAhead::new(8000);
        let held = filled(cache.reserve(0, 4000).unwrap(), 1).unwrap().bytes;
        let reading = cache.reserve(4000, 4000).unwrap();
        // The first span is evicted for room, but a reader still holds its memory, and the
        // second is being read: no room.
        assert!(cache.reserve(8000, 4000).is_none());
        assert!(hit(&cache, 0, 10).is_none(), "evicted, though held");
        assert_eq!(cache.used_bytes(), 8000);
        assert!(held.iter().all(|&b| b == 1), "the held slice is intact");
        drop(held);
        assert_eq!(cache.used_bytes(), 4000, "freed once let go");
        assert!(cache.reserve(8000, 4000).is_some());
        drop(reading);
    }

    #[test]
    fn reads_in_flight_are_never_evicted_and_an_abandoned_one_gives_its_room_back() {
        let cache = ReadAhead::new(8000);
        let first = cache.reserve(0, 4000).unwrap();
        let second = cache.reserve(4000, 4000).unwrap();
        assert!(
            cache.reserve(8000, 4000).is_none(),
            "both reads are in flight"
        );
        drop(second);
        assert_eq!(cache.used_bytes(), 4000);
        assert!(matches!(cache.lookup(4000, 1), Lookup::Miss));
        filled(first, 5);
        assert!(hit(&cache, 100, 1).is_some());
    }

    #[test]
    fn retention_and_a_cut_forget_the_spans_they_take_away() {
        let cache = ReadAhead::new(1 << 20);
        filled(cache.reserve(0, 4096).unwrap(), 1);
        filled(cache.reserve(4096, 4096).unwrap(), 2);
        filled(cache.reserve(8192, 4096).unwrap(), 3);
        let reading = cache.reserve(12_288, 4096).unwrap();
        // Retention deleted [0, 4096); a cut left the log ending at 10,000.
        cache.forget_outside(4096, 10_000);
        assert!(hit(&cache, 0, 1).is_none(), "below the log's start");
        assert!(hit(&cache, 4096, 1).is_some(), "still in the log");
        assert!(hit(&cache, 8192, 1).is_none(), "past the cut");
        assert!(matches!(cache.lookup(12_288, 1), Lookup::Miss));
        assert!(
            filled(reading, 4).is_none(),
            "a read over forgotten bytes is discarded"
        );
        assert!(hit(&cache, 12_288, 1).is_none());
        assert_eq!(cache.used_bytes(), 4096);
    }

    #[test]
    fn entries_read_ahead_are_kept_for_the_pulls_that_follow() {
        let cache = ReadAhead::new(2 << 20);
        let entry = |offset: u64| ConsumeQueueEntry {
            commitlog_offset: offset * 100,
            size: 100,
            tags_hash: 0,
        };
        cache.put_entries("t", 1, 10, (10..20).map(entry).collect());
        assert!(
            cache.take_entries("t", 2, 10, 100).is_none(),
            "another queue"
        );
        assert!(cache.take_entries("t", 1, 20, 100).is_none(), "past them");
        assert_eq!(cache.entries_end("t", 1, 12), Some(20));
        assert_eq!(
            cache.peek_entries("t", 1, 18, 100),
            vec![entry(18), entry(19)]
        );
        assert!(cache.peek_entries("t", 1, 9, 100).is_empty());
        assert!(cache.peek_entries("t", 1, 20, 100).is_empty());
        let taken = cache.take_entries("t", 1, 12, 3).expect("held from 10");
        assert_eq!(taken, vec![entry(12), entry(13), entry(14)]);
        // The next pull finds the rest; those before it are gone.
        assert!(cache.take_entries("t", 1, 11, 1).is_none());
        assert_eq!(cache.take_entries("t", 1, 15, 100).unwrap().len(), 5);
        // Entries that continue the run are kept after it; others replace it.
        cache.put_entries("t", 1, 20, (20..25).map(entry).collect());
        assert_eq!(cache.entries_end("t", 1, 15), Some(25));
        assert_eq!(cache.take_entries("t", 1, 19, 100).unwrap().len(), 6);
        cache.put_entries("t", 1, 40, (40..45).map(entry).collect());
        assert!(cache.take_entries("t", 1, 20, 100).is_none());
        assert_eq!(cache.stats().entry_hits, 3);
        // At most MAX_ENTRIES_PER_QUEUE per queue, the newest kept.
        let many = MAX_ENTRIES_PER_QUEUE as u64 + 10;
        cache.put_entries("t", 1, 45, (45..45 + many).map(entry).collect());
        assert!(cache.take_entries("t", 1, 45, 1).is_none());
        assert_eq!(cache.entries_end("t", 1, 60), Some(45 + many));
        assert!(cache.used_bytes() <= entries_bytes(MAX_ENTRIES_PER_QUEUE));
        // Cached spans give way first; entries only when nothing else can.
        filled(cache.reserve(0, 1 << 20).unwrap(), 1);
        let reading = cache.reserve(1 << 20, 1 << 20);
        assert!(reading.is_some(), "the span gave way");
        assert!(cache.take_entries("t", 1, 60, 1).is_some());
        let second = cache.reserve(2 << 20, 1 << 20);
        assert!(second.is_some(), "then the entries did");
        assert!(cache.take_entries("t", 1, 60, 1).is_none());
        drop((reading, second));
    }

    #[test]
    fn a_disabled_cache_reserves_nothing() {
        let cache = ReadAhead::new(0);
        assert!(!cache.is_enabled());
        assert!(cache.reserve(0, 1).is_none());
        assert!(matches!(cache.lookup(0, 1), Lookup::Miss));
    }
}
