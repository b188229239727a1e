//! Delivery accounting: which `(producer, sequence)` pairs were acknowledged to producers and
//! which were received by consumers, hence how many acknowledged messages were lost and how
//! many were delivered more than once.
//!
//! Owns the sets and the counting; never measures time or talks to a broker. Producers enter
//! their acknowledged sequences ([`SequenceSet`], one per producer); consumers enter every
//! received header ([`Receipts::record`]); [`Receipts::lost`] compares the two.
//!
//! A sequence set is a bitmap: one bit per message, so a billion messages cost 125 MB.

use std::collections::HashMap;

/// A set of sequence numbers from 0 up, as a growable bitmap.
#[derive(Debug, Clone, Default)]
pub struct SequenceSet {
    words: Vec<u64>,
    len: u64,
}

impl SequenceSet {
    /// Adds `sequence`; returns whether it was new.
    pub fn insert(&mut self, sequence: u64) -> bool {
        let word = usize::try_from(sequence / 64).expect("sequence fits the address space");
        if word >= self.words.len() {
            self.words.resize(word + 1, 0);
        }
        let bit = 1u64 << (sequence % 64);
        let is_new = self.words[word] & bit == 0;
        self.words[word] |= bit;
        self.len += u64::from(is_new);
        is_new
    }

    /// Adds `count` sequences starting at `first`.
    pub fn insert_range(&mut self, first: u64, count: u64) {
        for sequence in first..first + count {
            self.insert(sequence);
        }
    }

    pub fn len(&self) -> u64 {
        self.len
    }

    /// The members for which `keep` holds.
    #[must_use]
    pub fn filtered(&self, keep: impl Fn(u64) -> bool) -> SequenceSet {
        let mut kept = SequenceSet::default();
        for (index, &word) in self.words.iter().enumerate() {
            let mut bits = word;
            while bits != 0 {
                let sequence = index as u64 * 64 + u64::from(bits.trailing_zeros());
                if keep(sequence) {
                    kept.insert(sequence);
                }
                bits &= bits - 1;
            }
        }
        kept
    }

    /// How many members of `self` are not in `other`.
    pub fn missing_from(&self, other: &SequenceSet) -> u64 {
        self.words
            .iter()
            .enumerate()
            .map(|(index, &word)| {
                let present = other.words.get(index).copied().unwrap_or(0);
                u64::from((word & !present).count_ones())
            })
            .sum()
    }
}

/// Identifies a producer across runs: (run id, producer index).
pub type ProducerKey = (u32, u32);

/// What consumers received.
#[derive(Debug, Default)]
pub struct Receipts {
    received: HashMap<ProducerKey, SequenceSet>,
    /// Deliveries of a `(producer, sequence)` already received.
    pub duplicates: u64,
    /// Distinct benchmark messages received.
    pub unique: u64,
    /// Messages without a benchmark header (not checkable).
    pub foreign: u64,
}

impl Receipts {
    /// Records one delivery; returns whether it was the first of this message.
    pub fn record(&mut self, key: ProducerKey, sequence: u64) -> bool {
        let is_new = self.received.entry(key).or_default().insert(sequence);
        if is_new {
            self.unique += 1;
        } else {
            self.duplicates += 1;
        }
        is_new
    }

    /// Distinct messages received from producers of run `run_id`.
    pub fn unique_of_run(&self, run_id: u32) -> u64 {
        self.received
            .iter()
            .filter(|((run, _), _)| *run == run_id)
            .map(|(_, set)| set.len())
            .sum()
    }

    /// Acknowledged messages (per producer index of run `run_id`) that were never received.
    pub fn lost(&self, run_id: u32, acknowledged: &[SequenceSet]) -> u64 {
        let empty = SequenceSet::default();
        acknowledged
            .iter()
            .enumerate()
            .map(|(producer, acked)| {
                let producer = u32::try_from(producer).expect("producer index fits u32");
                let received = self.received.get(&(run_id, producer)).unwrap_or(&empty);
                acked.missing_from(received)
            })
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sets_count_distinct_members() {
        let mut set = SequenceSet::default();
        assert!(set.insert(0));
        assert!(set.insert(1_000));
        assert!(!set.insert(1_000));
        set.insert_range(10, 5);
        assert_eq!(set.len(), 7);
    }

    #[test]
    fn filtered_keeps_the_members_that_pass() {
        let mut set = SequenceSet::default();
        set.insert_range(0, 300);
        set.insert(1_000);
        let kept = set.filtered(|sequence| sequence % 100 < 10);
        assert_eq!(kept.len(), 31, "0..300 gives 30, and 1,000 mod 100 is 0");
        assert_eq!(set.filtered(|sequence| sequence == 1_000).len(), 1);
        assert_eq!(kept.missing_from(&set), 0);
        assert_eq!(set.missing_from(&kept), 270);
    }

    #[test]
    fn lost_counts_acknowledged_but_never_received() {
        let mut acked = vec![SequenceSet::default(), SequenceSet::default()];
        acked[0].insert_range(0, 100);
        acked[1].insert_range(0, 10);
        let mut receipts = Receipts::default();
        for sequence in 0..100 {
            if sequence != 42 {
                receipts.record((9, 0), sequence);
            }
        }
        receipts.record((9, 1), 3);
        receipts.record((9, 1), 3);
        // Another run's producer 1 does not count for run 9.
        for sequence in 0..10 {
            receipts.record((8, 1), sequence);
        }
        assert_eq!(receipts.lost(9, &acked), 1 + 9);
        assert_eq!(receipts.duplicates, 1);
        assert_eq!(receipts.unique_of_run(9), 100);
        assert_eq!(receipts.unique, 110);
    }
}
