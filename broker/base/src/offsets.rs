//! Consumer offsets of the queues one storage shard owns: (group, topic, queue) → the next offset
//! the group will consume.
//!
//! Owns `<shard>/offsets`: a first line `crc32=XXXXXXXX` over the rest, then JSON; written
//! atomically every `offsets_persist_interval_ms` (5 s) when changed, and at shutdown. So a
//! kill -9 loses at most the commits of the last interval. A damaged file is moved aside (its
//! name gains `.damaged-<ms>`) and reported; consumers then resume from their configured start
//! point, and no message data is touched.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

pub use crate::layout::OFFSETS_FILE;

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
struct OffsetRow {
    group: String,
    topic: String,
    queue_id: u32,
    offset: u64,
}

#[derive(Debug, Default)]
pub struct ConsumerOffsets {
    offsets: BTreeMap<(String, String, u32), u64>,
    is_dirty: bool,
}

/// What loading found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LoadOutcome {
    Loaded(usize),
    Missing,
    /// The file was damaged and moved to this path.
    MovedAside(PathBuf, String),
}

impl ConsumerOffsets {
    pub fn load(shard_dir: &Path) -> std::io::Result<(ConsumerOffsets, LoadOutcome)> {
        let path = shard_dir.join(OFFSETS_FILE);
        let text = match std::fs::read(&path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Ok((ConsumerOffsets::default(), LoadOutcome::Missing));
            }
            Err(e) => return Err(e),
        };
        match decode(&text) {
            Ok(rows) => {
                let count = rows.len();
                let offsets = rows
                    .into_iter()
                    .map(|r| ((r.group, r.topic, r.queue_id), r.offset))
                    .collect();
                Ok((
                    ConsumerOffsets {
                        offsets,
                        is_dirty: false,
                    },
                    LoadOutcome::Loaded(count),
                ))
            }
            Err(why) => {
                let millis = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_millis())
                    .unwrap_or(0);
                let aside = shard_dir.join(format!("{OFFSETS_FILE}.damaged-{millis}"));
                std::fs::rename(&path, &aside)?;
                Ok((
                    ConsumerOffsets::default(),
                    LoadOutcome::MovedAside(aside, why),
                ))
            }
        }
    }

    pub fn get(&self, group: &str, topic: &str, queue_id: u32) -> Option<u64> {
        self.offsets
            .get(&(group.to_owned(), topic.to_owned(), queue_id))
            .copied()
    }

    pub fn commit(&mut self, group: &str, topic: &str, queue_id: u32, offset: u64) {
        let slot = self
            .offsets
            .entry((group.to_owned(), topic.to_owned(), queue_id))
            .or_insert(offset);
        if *slot != offset {
            *slot = offset;
        }
        self.is_dirty = true;
    }

    pub fn is_dirty(&self) -> bool {
        self.is_dirty
    }

    /// The file contents, and clears the dirty flag (the caller writes them).
    pub fn snapshot(&mut self) -> Vec<u8> {
        self.is_dirty = false;
        let rows: Vec<OffsetRow> = self
            .offsets
            .iter()
            .map(|((group, topic, queue_id), offset)| OffsetRow {
                group: group.clone(),
                topic: topic.clone(),
                queue_id: *queue_id,
                offset: *offset,
            })
            .collect();
        encode(&rows)
    }

    /// Up to `max` rows in (group, topic, queue) order, from the first after `after` (from the
    /// start when `None`), and whether more follow.
    pub fn rows_after(
        &self,
        after: Option<&(String, String, u32)>,
        max: usize,
    ) -> (Vec<(String, String, u32, u64)>, bool) {
        use std::ops::Bound;
        let from = after.map_or(Bound::Unbounded, Bound::Excluded);
        let mut range = self.offsets.range((from, Bound::Unbounded));
        let rows: Vec<_> = range
            .by_ref()
            .take(max)
            .map(|((g, t, q), o)| (g.clone(), t.clone(), *q, *o))
            .collect();
        (rows, range.next().is_some())
    }

    /// Every (group, topic, queue, offset), for admin listings.
    pub fn rows(&self) -> Vec<(String, String, u32, u64)> {
        self.offsets
            .iter()
            .map(|((g, t, q), o)| (g.clone(), t.clone(), *q, *o))
            .collect()
    }
}

fn encode(rows: &[OffsetRow]) -> Vec<u8> {
    let body = serde_json::to_vec(rows).expect("offsets serialize");
    let mut out = format!("crc32={:08x}\n", crc32fast::hash(&body)).into_bytes();
    out.extend_from_slice(&body);
    out
}

fn decode(bytes: &[u8]) -> Result<Vec<OffsetRow>, String> {
    let newline = bytes
        .iter()
        .position(|&b| b == b'\n')
        .ok_or("no header line")?;
    let header = std::str::from_utf8(&bytes[..newline]).map_err(|_| "header is not text")?;
    let stored = header
        .strip_prefix("crc32=")
        .and_then(|h| u32::from_str_radix(h, 16).ok())
        .ok_or("header is not crc32=XXXXXXXX")?;
    let body = &bytes[newline + 1..];
    let computed = crc32fast::hash(body);
    if stored != computed {
        return Err(format!(
            "CRC mismatch: stored {stored:08x}, computed {computed:08x}"
        ));
    }
    serde_json::from_slice(body).map_err(|e| format!("not valid JSON: {e}"))
}

#[cfg(test)]
mod paging_tests {
    use super::ConsumerOffsets;

    #[test]
    fn rows_come_in_pages_in_key_order_until_none_are_left() {
        let mut offsets = ConsumerOffsets::default();
        for (g, q) in [("b", 1), ("a", 2), ("a", 0), ("c", 0), ("b", 0)] {
            offsets.commit(g, "T", q, u64::from(q) + 10);
        }
        let (first, more) = offsets.rows_after(None, 2);
        assert_eq!(
            first,
            vec![
                ("a".into(), "T".into(), 0, 10),
                ("a".into(), "T".into(), 2, 12)
            ]
        );
        assert!(more);
        let cursor = |rows: &[(String, String, u32, u64)]| {
            let (g, t, q, _) = rows.last().unwrap().clone();
            (g, t, q)
        };
        let (second, more) = offsets.rows_after(Some(&cursor(&first)), 2);
        assert_eq!(
            second,
            vec![
                ("b".into(), "T".into(), 0, 10),
                ("b".into(), "T".into(), 1, 11)
            ]
        );
        assert!(more);
        let (third, more) = offsets.rows_after(Some(&cursor(&second)), 2);
        assert_eq!(third, vec![("c".into(), "T".into(), 0, 10)]);
        assert!(!more);
        let (exact, more) = offsets.rows_after(None, 5);
        assert_eq!((exact.len(), more), (5, false));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_damage_is_moved_aside() {
        let dir = tempfile::tempdir().unwrap();
        let mut offsets = ConsumerOffsets::default();
        offsets.commit("g", "t", 3, 42);
        offsets.commit("g", "t", 3, 43);
        assert!(offsets.is_dirty());
        std::fs::write(dir.path().join(OFFSETS_FILE), offsets.snapshot()).unwrap();
        assert!(!offsets.is_dirty());
        let (loaded, outcome) = ConsumerOffsets::load(dir.path()).unwrap();
        assert_eq!(outcome, LoadOutcome::Loaded(1));
        assert_eq!(loaded.get("g", "t", 3), Some(43));

        let mut bytes = std::fs::read(dir.path().join(OFFSETS_FILE)).unwrap();
        let last = bytes.len() - 3;
        bytes[last] ^= 0x01;
        std::fs::write(dir.path().join(OFFSETS_FILE), bytes).unwrap();
        let (loaded, outcome) = ConsumerOffsets::load(dir.path()).unwrap();
        assert!(
            matches!(outcome, LoadOutcome::MovedAside(_, ref why) if why.contains("CRC")),
            "{outcome:?}"
        );
        assert_eq!(loaded.get("g", "t", 3), None);
        assert!(!dir.path().join(OFFSETS_FILE).exists());
    }
}
