//! One assigned queue's messages on their way from the puller to the listener (RocketMQ's
//! ProcessQueue).
//!
//! Owns: the messages pulled and not yet consumed successfully (by offset), their count and
//! bytes for flow control, how far the queue has been pulled, the offset that may be committed
//! (the lowest unfinished message, or how far it was pulled when none is unfinished), and for
//! orderly consumption whether a consume loop runs, when the broker last granted this instance
//! the queue's lock, and the lock that keeps a listener call and the queue's hand-over apart.
//! Never: pulling, calling the listener or committing; the pull loop and the consume tasks do,
//! through these methods.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use shardmq_codec::RecordView;

use crate::api::Pending;
use crate::message::MessageExt;
use crate::record::{decode_record, Checks};

/// Limits above which the puller pauses a queue (RocketMQ's pull thresholds), and how far they
/// rise while the queue has a backlog.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FlowLimits {
    /// Most messages cached (`pullThresholdForQueue`, 1000).
    pub max_cached_messages: usize,
    /// Most body bytes cached (`pullThresholdSizeForQueue`, 100 MiB).
    pub max_cached_bytes: usize,
    /// Largest distance between the first and last cached offsets, concurrent mode only
    /// (`consumeConcurrentlyMaxSpan`, 2000).
    pub max_offset_span: i64,
    /// While the broker holds at least one more pull of the queue (a backlog), the message
    /// and span limits rise to this many pulls of `pull_batch` messages when that is more
    /// (default 2): one pull then travels while the answer before it is decoded and consumed,
    /// instead of each pull waiting for the cache to drain (with 1,000 messages and pulls of
    /// about 900, the fixed limit left room for one). The byte limit stays. 0 keeps
    /// RocketMQ's fixed limits.
    pub backlog_pulls: u32,
}

impl Default for FlowLimits {
    fn default() -> Self {
        Self {
            max_cached_messages: 1000,
            max_cached_bytes: 100 * 1024 * 1024,
            max_offset_span: 2000,
            backlog_pulls: 2,
        }
    }
}

impl FlowLimits {
    /// RocketMQ's fixed thresholds (1000 messages, 100 MiB, span 2000), backlog or not.
    #[must_use]
    pub fn rocketmq() -> Self {
        Self {
            backlog_pulls: 0,
            ..Self::default()
        }
    }

    /// The limits in force for a queue pulled `pull_batch` messages at a time, with a backlog
    /// of at least one more pull or not.
    pub(crate) fn in_force(&self, pull_batch: u32, is_backlogged: bool) -> FlowLimits {
        if !is_backlogged || self.backlog_pulls == 0 {
            return *self;
        }
        let room = (self.backlog_pulls as usize).saturating_mul(pull_batch as usize);
        FlowLimits {
            max_cached_messages: self.max_cached_messages.max(room),
            max_offset_span: self
                .max_offset_span
                .max(i64::try_from(room).unwrap_or(i64::MAX)),
            ..*self
        }
    }
}

/// One pull answer's cached messages. The cache keeps the answer's records, not messages: a
/// message is handed to the listener as decoded from the answer (concurrent mode), and decoded
/// again from its record only when it is needed again (a redelivery, a send-back, orderly
/// mode's consume loop), so caching a message costs no copy and no allocation of its own.
#[derive(Debug)]
struct Segment {
    /// The answer's records (the messages' bodies handed out are slices of the same memory).
    records: Bytes,
    broker_name: Arc<str>,
    /// Its cached messages, in offset order.
    entries: Vec<Entry>,
    /// Entries before this one are all finished.
    first_unfinished: usize,
    unfinished: usize,
}

#[derive(Debug, Clone, Copy)]
struct Entry {
    offset: i64,
    /// Where the record starts in the segment's records.
    at: u32,
    body_len: u32,
    /// Local redeliveries after `ReconsumeLater`, added to the stored reconsume times.
    redeliveries: i32,
    is_finished: bool,
}

impl Segment {
    fn first_unfinished_offset(&self) -> Option<i64> {
        self.entries.get(self.first_unfinished).map(|e| e.offset)
    }

    fn last_offset(&self) -> Option<i64> {
        self.entries.last().map(|e| e.offset)
    }

    fn decode(&self, entry: &Entry) -> Option<MessageExt> {
        let (mut message, _) = decode_record(
            &self.records,
            entry.at as usize,
            &self.broker_name,
            Checks::AlreadyChecked,
        )
        .ok()?;
        message.reconsume_times = message.reconsume_times.saturating_add(entry.redeliveries);
        Some(message)
    }
}

#[derive(Debug, Default)]
struct State {
    /// Pulled, not yet consumed successfully: answers in offset order, each dropped once every
    /// message of it is finished.
    segments: VecDeque<Segment>,
    /// Unfinished messages and their body bytes.
    cached_count: usize,
    cached_bytes: usize,
    /// The highest offset ever cached: a message at or below it is a repeat.
    last_cached: Option<i64>,
    /// The offset after everything pulled so far (the last pull's next begin offset).
    pulled_up_to: i64,
    /// Orderly mode: a consume loop is running for this queue.
    is_consuming: bool,
    /// Orderly mode: when the broker last granted (or renewed) this instance the queue's lock.
    locked_at: Option<Instant>,
    /// Orderly mode: whether the start offset was read again after the first lock.
    is_offset_checked: bool,
}

impl State {
    /// Where the unfinished message at `offset` is: its segment's index and its entry's.
    fn find_unfinished(&self, offset: i64) -> Option<(usize, usize)> {
        let at = self
            .segments
            .iter()
            .position(|s| s.last_offset().is_some_and(|last| offset <= last))?;
        let entries = &self.segments[at].entries;
        let index = entries.binary_search_by_key(&offset, |e| e.offset).ok()?;
        (!entries[index].is_finished).then_some((at, index))
    }

    /// The entry of the unfinished message at `offset`, with its segment.
    fn unfinished_mut(&mut self, offset: i64) -> Option<(&mut Segment, usize)> {
        let (at, index) = self.find_unfinished(offset)?;
        Some((&mut self.segments[at], index))
    }

    /// Unfinished messages at `offsets` (in the order asked), with their segments.
    fn unfinished<'a>(
        &'a self,
        offsets: &'a [i64],
    ) -> impl Iterator<Item = (&'a Segment, &'a Entry)> + 'a {
        offsets.iter().filter_map(move |&offset| {
            let (at, index) = self.find_unfinished(offset)?;
            let segment = &self.segments[at];
            Some((segment, &segment.entries[index]))
        })
    }

    /// The first and last unfinished offsets.
    fn unfinished_range(&self) -> Option<(i64, i64)> {
        let first = self
            .segments
            .iter()
            .find_map(Segment::first_unfinished_offset)?;
        let last = self.segments.iter().rev().find_map(|s| {
            s.entries
                .iter()
                .rev()
                .find(|e| !e.is_finished)
                .map(|e| e.offset)
        })?;
        Some((first, last))
    }
}

/// The cached messages of one assigned queue.
#[derive(Debug)]
pub(crate) struct ProcessQueue {
    state: Mutex<State>,
    is_dropped: AtomicBool,
    /// Orderly mode: held for each listener call, and by a rebalance that gives the queue up
    /// (so the offset it persists covers every call, and no call starts after it).
    consuming: tokio::sync::Mutex<()>,
    /// Signalled when consumed messages leave the cache, so a pull loop paused by flow control
    /// pulls again as soon as there is room rather than after a fixed pause.
    drained: tokio::sync::Notify,
}

impl ProcessQueue {
    /// A queue whose consumption starts at `offset`.
    pub(crate) fn new(offset: i64) -> Self {
        Self {
            state: Mutex::new(State {
                pulled_up_to: offset,
                ..State::default()
            }),
            is_dropped: AtomicBool::new(false),
            consuming: tokio::sync::Mutex::new(()),
            drained: tokio::sync::Notify::new(),
        }
    }

    /// Orderly mode: the lock held for a listener call and for giving the queue up.
    pub(crate) fn consuming(&self) -> &tokio::sync::Mutex<()> {
        &self.consuming
    }

    /// Orderly mode: the broker granted or renewed the queue's lock at `at` (`None`: it refused).
    pub(crate) fn set_locked(&self, at: Option<Instant>) {
        self.state().locked_at = at;
    }

    /// Orderly mode: whether this instance holds the queue's lock: granted within `ttl`, which
    /// is shorter than the broker's expiry, so the broker never gives the queue to another
    /// member while this one still consumes it.
    pub(crate) fn is_locked(&self, ttl: Duration) -> bool {
        self.state().locked_at.is_some_and(|at| at.elapsed() < ttl)
    }

    /// Orderly mode: whether the start offset must be read again (the first time the queue is
    /// locked: the previous owner commits its offset before it releases the lock).
    pub(crate) fn needs_offset_check(&self) -> bool {
        !self.state().is_offset_checked
    }

    pub(crate) fn mark_offset_checked(&self) {
        self.state().is_offset_checked = true;
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Whether the queue was taken away (rebalance, shutdown): nothing more is pulled, and
    /// consumption results no longer move its offset.
    pub(crate) fn is_dropped(&self) -> bool {
        self.is_dropped.load(Ordering::Acquire)
    }

    pub(crate) fn mark_dropped(&self) {
        self.is_dropped.store(true, Ordering::Release);
    }

    /// Whether pulling must pause: over a limit of `limits` (the span only when
    /// `is_span_limited`, i.e. in concurrent mode). Returns which limit, for the log.
    #[cfg(test)]
    pub(crate) fn over_limit(&self, limits: &FlowLimits, is_span_limited: bool) -> Option<String> {
        self.over_limit_with(limits, is_span_limited, Pending::default())
    }

    /// [`over_limit`](Self::over_limit) counting `pending` as cached already: an answer that
    /// arrived and is not decoded yet (so a pipelined pull loop holds no more than one pull
    /// beyond the limits, as a loop with one pull at a time does).
    pub(crate) fn over_limit_with(
        &self,
        limits: &FlowLimits,
        is_span_limited: bool,
        pending: Pending,
    ) -> Option<String> {
        let state = self.state();
        let count = state.cached_count + pending.messages;
        if count > limits.max_cached_messages {
            return Some(format!(
                "{count} cached messages, over {}",
                limits.max_cached_messages
            ));
        }
        let cached_bytes = state.cached_bytes + pending.bytes;
        if cached_bytes > limits.max_cached_bytes {
            return Some(format!(
                "{cached_bytes} cached bytes, over {}",
                limits.max_cached_bytes
            ));
        }
        if is_span_limited {
            if let Some((first, last)) = state.unfinished_range() {
                let last = last.max(pending.last_offset.unwrap_or(last));
                let span = last - first;
                if span > limits.max_offset_span {
                    return Some(format!(
                        "offset span {span} (from {first}), over {}",
                        limits.max_offset_span
                    ));
                }
            }
        }
        None
    }

    /// Adds pulled messages (those at or past `pulled_up_to` and past every offset cached so
    /// far; a repeat is ignored) and records that the queue is pulled up to `next_offset`.
    /// `messages` were decoded, in order, from `records` (the answer's records, pulled from
    /// `broker_name`), which the cache keeps instead of the messages. Leaves in `messages` the
    /// ones added (in place: a message is not moved unless one before it is left out).
    pub(crate) fn put(
        &self,
        records: &Bytes,
        broker_name: &Arc<str>,
        messages: &mut Vec<MessageExt>,
        next_offset: i64,
    ) {
        let mut state = self.state();
        let mut entries = Vec::with_capacity(messages.len());
        let mut at = 0;
        let mut bytes = 0;
        let pulled_up_to = state.pulled_up_to;
        let mut last_cached = state.last_cached;
        messages.retain(|message| {
            let offset = message.queue_offset;
            if offset < pulled_up_to || last_cached.is_some_and(|last| offset <= last) {
                return false;
            }
            let Some(record_at) = record_of(records, &mut at, offset) else {
                // Not from `records`: a caller's mistake, never a message the pull moves past.
                debug_assert!(false, "message at {offset} is not in the answer's records");
                tracing::error!(offset, "a pulled message is not in its answer; not cached");
                return false;
            };
            let body_len = message.body.len();
            bytes += body_len;
            entries.push(Entry {
                offset,
                at: record_at,
                body_len: u32::try_from(body_len).unwrap_or(u32::MAX),
                redeliveries: 0,
                is_finished: false,
            });
            last_cached = Some(offset);
            true
        });
        state.last_cached = last_cached;
        if !entries.is_empty() {
            state.cached_count += entries.len();
            state.cached_bytes += bytes;
            state.segments.push_back(Segment {
                records: records.clone(),
                broker_name: Arc::clone(broker_name),
                unfinished: entries.len(),
                entries,
                first_unfinished: 0,
            });
        }
        state.pulled_up_to = state.pulled_up_to.max(next_offset);
    }

    /// Records a pull that found nothing (or nothing matching) up to `next_offset`.
    pub(crate) fn advance(&self, next_offset: i64) {
        let mut state = self.state();
        state.pulled_up_to = state.pulled_up_to.max(next_offset);
    }

    /// Moves the pull position to `offset` whatever it was (the broker said the offset is
    /// out of range).
    pub(crate) fn reset(&self, offset: i64) {
        self.state().pulled_up_to = offset;
    }

    /// Where pulling continues.
    pub(crate) fn pulled_up_to(&self) -> i64 {
        self.state().pulled_up_to
    }

    /// Removes consumed messages; returns the offset that may now be committed.
    pub(crate) fn remove(&self, offsets: &[i64]) -> i64 {
        let mut state = self.state();
        let mut finished = 0;
        let mut bytes = 0;
        for &offset in offsets {
            let Some((segment, index)) = state.unfinished_mut(offset) else {
                continue;
            };
            segment.entries[index].is_finished = true;
            segment.unfinished -= 1;
            while segment
                .entries
                .get(segment.first_unfinished)
                .is_some_and(|e| e.is_finished)
            {
                segment.first_unfinished += 1;
            }
            finished += 1;
            bytes += segment.entries[index].body_len as usize;
        }
        state.cached_count -= finished;
        state.cached_bytes -= bytes;
        state.segments.retain(|segment| segment.unfinished > 0);
        let committable = committable(&state);
        drop(state);
        self.drained.notify_one();
        committable
    }

    /// Waits until messages leave the cache (or a removal happened since the last wait), at
    /// most `limit`.
    pub(crate) async fn wait_drained(&self, limit: Duration) {
        let _ = tokio::time::timeout(limit, self.drained.notified()).await;
    }

    /// The offset that may be committed: the lowest unfinished message's, or how far the
    /// queue was pulled when none is unfinished.
    pub(crate) fn committable_offset(&self) -> i64 {
        committable(&self.state())
    }

    #[cfg(test)]
    pub(crate) fn cached_count(&self) -> usize {
        self.state().cached_count
    }

    /// The cached messages at `offsets` (those still cached), in the order asked.
    pub(crate) fn cached(&self, offsets: &[i64]) -> Vec<MessageExt> {
        let state = self.state();
        state
            .unfinished(offsets)
            .filter_map(|(segment, entry)| segment.decode(entry))
            .collect()
    }

    /// Counts one more delivery of the cached messages at `offsets` (after ReconsumeLater)
    /// and returns them, for redelivery.
    pub(crate) fn prepare_redelivery(&self, offsets: &[i64]) -> Vec<MessageExt> {
        let mut state = self.state();
        offsets
            .iter()
            .filter_map(|&offset| {
                let (segment, index) = state.unfinished_mut(offset)?;
                let entry = &mut segment.entries[index];
                entry.redeliveries = entry.redeliveries.saturating_add(1);
                let entry = *entry;
                segment.decode(&entry)
            })
            .collect()
    }

    /// Orderly mode: up to `count` cached messages from the lowest offset, left cached.
    pub(crate) fn first_messages(&self, count: usize) -> Vec<MessageExt> {
        let state = self.state();
        state
            .segments
            .iter()
            .flat_map(|segment| {
                segment.entries[segment.first_unfinished..]
                    .iter()
                    .filter(|e| !e.is_finished)
                    .map(move |entry| (segment, entry))
            })
            .take(count)
            .filter_map(|(segment, entry)| segment.decode(entry))
            .collect()
    }

    /// Orderly mode: claims the right to run this queue's consume loop; false when one runs.
    pub(crate) fn try_start_consuming(&self) -> bool {
        let mut state = self.state();
        if state.is_consuming {
            false
        } else {
            state.is_consuming = true;
            true
        }
    }

    /// Orderly mode: ends the consume loop if nothing is cached (true), so that the next
    /// `put` starts a new one; false when messages are waiting.
    pub(crate) fn stop_consuming_if_empty(&self) -> bool {
        let mut state = self.state();
        if state.cached_count == 0 || self.is_dropped() {
            state.is_consuming = false;
            true
        } else {
            false
        }
    }
}

fn committable(state: &State) -> i64 {
    state
        .segments
        .iter()
        .find_map(Segment::first_unfinished_offset)
        .unwrap_or(state.pulled_up_to)
}

/// Where the record of the message at `offset` starts in `records`, searching on from `at`
/// (moved past it): the messages of an answer are its records', in order, some left out.
fn record_of(records: &[u8], at: &mut usize, offset: i64) -> Option<u32> {
    while *at < records.len() {
        let view = RecordView::parse_unchecked(&records[*at..]).ok()?;
        let here = *at;
        *at += (view.total_size() as usize).max(1);
        if view.queue_offset() as i64 == offset {
            return u32::try_from(here).ok();
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::{decode_records, encode_test_record};
    use bytes::Bytes;

    /// Caches an answer of the messages at `offsets` (10-byte bodies), pulled up to `next`.
    fn put(queue: &ProcessQueue, offsets: std::ops::Range<u64>, next: i64) -> Vec<MessageExt> {
        let mut bytes = Vec::new();
        for offset in offsets {
            bytes.extend(encode_test_record("t", 0, offset, b"0123456789", &[]));
        }
        let records = Bytes::from(bytes);
        let mut messages = decode_records(&records, "b").unwrap();
        queue.put(&records, &Arc::from("b"), &mut messages, next);
        messages
    }

    #[test]
    fn commits_stop_at_the_lowest_unfinished_message() {
        let queue = ProcessQueue::new(0);
        assert_eq!(put(&queue, 0..5, 5).len(), 5);
        assert_eq!(queue.committable_offset(), 0);
        assert_eq!(queue.remove(&[1, 2]), 0, "offset 0 is still unfinished");
        assert_eq!(queue.remove(&[0]), 3);
        assert_eq!(queue.remove(&[4]), 3);
        assert_eq!(queue.remove(&[3]), 5, "all done: pulled up to 5");
    }

    #[test]
    fn filtered_pulls_move_the_commit_point() {
        let queue = ProcessQueue::new(10);
        queue.advance(15);
        assert_eq!(queue.committable_offset(), 15);
        assert_eq!(queue.pulled_up_to(), 15);
        assert!(put(&queue, 10..12, 20).is_empty(), "already passed");
    }

    #[test]
    fn flow_control_counts_messages_bytes_and_span() {
        let limits = FlowLimits {
            max_cached_messages: 3,
            max_cached_bytes: 1000,
            max_offset_span: 2,
            backlog_pulls: 0,
        };
        let queue = ProcessQueue::new(0);
        put(&queue, 0..3, 3);
        assert!(queue.over_limit(&limits, false).is_none());
        assert!(queue.over_limit(&limits, true).is_none());
        put(&queue, 3..4, 4);
        assert!(queue
            .over_limit(&limits, false)
            .unwrap()
            .contains("4 cached messages"));
        queue.remove(&[1, 2, 3]);
        assert!(queue.over_limit(&limits, true).is_none());
        put(&queue, 4..6, 6);
        // 0 and 5 cached: span 5.
        assert!(queue.over_limit(&limits, true).unwrap().contains("span 5"));
        assert!(queue.over_limit(&limits, false).is_none());
        let small_bytes = FlowLimits {
            max_cached_bytes: 25,
            ..limits
        };
        assert!(queue
            .over_limit(&small_bytes, false)
            .unwrap()
            .contains("bytes"));
    }

    #[test]
    fn an_answer_not_decoded_yet_counts_against_the_limits() {
        let limits = FlowLimits {
            max_cached_messages: 4,
            max_cached_bytes: 1000,
            max_offset_span: 10,
            backlog_pulls: 0,
        };
        let queue = ProcessQueue::new(0);
        put(&queue, 0..3, 3);
        let pending = |messages, bytes, last| Pending {
            messages,
            bytes,
            last_offset: Some(last),
        };
        assert!(queue
            .over_limit_with(&limits, true, pending(1, 10, 3))
            .is_none());
        assert!(queue
            .over_limit_with(&limits, false, pending(2, 10, 4))
            .unwrap()
            .contains("5 cached messages"));
        assert!(queue
            .over_limit_with(&limits, false, pending(1, 2000, 3))
            .unwrap()
            .contains("bytes"));
        assert!(queue
            .over_limit_with(&limits, true, pending(1, 10, 11))
            .unwrap()
            .contains("span 11"));
    }

    #[test]
    fn a_backlog_raises_the_message_and_span_limits_to_the_pulls_it_allows() {
        let limits = FlowLimits {
            max_cached_messages: 4,
            max_cached_bytes: 1000,
            max_offset_span: 5,
            backlog_pulls: 2,
        };
        assert_eq!(limits.in_force(3, false), limits, "no backlog: as set");
        let raised = limits.in_force(3, true);
        assert_eq!((raised.max_cached_messages, raised.max_offset_span), (6, 6));
        assert_eq!(raised.max_cached_bytes, 1000, "the byte limit stays");
        assert_eq!(
            limits.in_force(1, true),
            limits,
            "never lowered below the limits set"
        );
        let queue = ProcessQueue::new(0);
        put(&queue, 0..3, 3);
        let pending = Pending {
            messages: 3,
            bytes: 10,
            last_offset: Some(5),
        };
        // Three cached and three arriving: over the four set, within two pulls of three.
        assert!(queue.over_limit_with(&limits, true, pending).is_some());
        assert!(queue.over_limit_with(&raised, true, pending).is_none());
        let fixed = FlowLimits::rocketmq();
        assert_eq!(fixed.in_force(1024, true), fixed);
        assert_eq!(fixed.max_cached_messages, 1000);
    }

    #[test]
    fn redelivery_counts_and_keeps_the_message() {
        let queue = ProcessQueue::new(0);
        put(&queue, 0..2, 2);
        let again = queue.prepare_redelivery(&[1]);
        assert_eq!(again.len(), 1);
        assert_eq!(again[0].reconsume_times, 1);
        assert_eq!(queue.cached_count(), 2);
        assert_eq!(queue.first_messages(5).len(), 2);
    }

    #[test]
    fn a_cached_message_decoded_again_is_the_message_handed_out() {
        let queue = ProcessQueue::new(0);
        let mut bytes = Vec::new();
        for offset in 0..4u64 {
            let tag = if offset % 2 == 0 { "even" } else { "odd" };
            let body = format!("body {offset}");
            bytes.extend(encode_test_record(
                "t",
                0,
                offset,
                body.as_bytes(),
                &[("TAGS", tag), ("k", "v")],
            ));
        }
        let records = Bytes::from(bytes);
        // A tag filter left the odd offsets out: the even ones are found among the records.
        let mut added: Vec<_> = decode_records(&records, "b")
            .unwrap()
            .into_iter()
            .filter(|m| m.tags() == Some("even"))
            .collect();
        queue.put(&records, &Arc::from("b"), &mut added, 4);
        assert_eq!(added.len(), 2);
        assert_eq!(queue.cached_count(), 2);
        let again = queue.cached(&[2, 1, 0]);
        assert_eq!(again.len(), 2, "offset 1 was never cached");
        assert_eq!(format!("{:?}", again[0]), format!("{:?}", added[1]));
        assert_eq!(format!("{:?}", again[1]), format!("{:?}", added[0]));
        let redelivered = queue.prepare_redelivery(&[2]);
        assert_eq!(redelivered[0].reconsume_times, added[1].reconsume_times + 1);
        assert_eq!(redelivered[0].body, added[1].body);
        assert_eq!(queue.first_messages(1)[0].queue_offset, 0);
        assert_eq!(queue.first_messages(9)[1].reconsume_times, 1);
    }

    #[test]
    fn answers_leave_the_cache_when_every_message_of_them_is_finished() {
        let queue = ProcessQueue::new(0);
        put(&queue, 0..3, 3);
        put(&queue, 3..6, 6);
        assert_eq!(put(&queue, 4..8, 8).len(), 2, "4 and 5 are repeats");
        assert_eq!(queue.remove(&[3, 4, 5, 6, 7]), 0);
        assert_eq!(queue.cached_count(), 3);
        assert_eq!(
            queue
                .first_messages(9)
                .iter()
                .map(|m| m.queue_offset)
                .collect::<Vec<_>>(),
            vec![0, 1, 2]
        );
        assert_eq!(
            queue.remove(&[1, 1, 7, 9]),
            0,
            "finished, repeated, unknown offsets"
        );
        assert_eq!(queue.remove(&[0]), 2);
        assert_eq!(queue.remove(&[2]), 8, "all finished: pulled up to 8");
        assert_eq!(queue.cached_count(), 0);
        assert!(queue.state().segments.is_empty());
        assert_eq!(queue.state().cached_bytes, 0);
    }

    #[test]
    fn one_orderly_loop_at_a_time() {
        let queue = ProcessQueue::new(0);
        assert!(queue.try_start_consuming());
        assert!(!queue.try_start_consuming());
        put(&queue, 0..1, 1);
        assert!(!queue.stop_consuming_if_empty());
        queue.remove(&[0]);
        assert!(queue.stop_consuming_if_empty());
        assert!(queue.try_start_consuming());
    }
}
