//! Offline consistency check of a data directory (`shardmq-broker verify --data-dir D`).
//!
//! Owns the rules an operator relies on: every CommitLog record decodes with both CRCs intact
//! and sits where its physical offset says; queue offsets of each queue run without gaps; every
//! ConsumeQueue entry and index entry points at the record it claims; the checkpoint is intact
//! and not ahead of the data. It only reads (plain blocking file I/O: it runs while no broker
//! does) and reports every problem with its file and offset; it never repairs.

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use super::checkpoint::Checkpoint;
use super::commitlog::{list_segments, parse_segment_file_name};
use super::consume_queue::{ConsumeQueueEntry, CONSUME_QUEUE_ENTRY_BYTES};
use super::format::StoreFormat;
use super::index::{index_hash, IndexEntry, IndexKind, INDEX_ENTRY_BYTES};
use super::record::{decode_message, tags_hash, RecordView};
use super::scan::{scan_window, ScanStop};

const WINDOW_BYTES: u64 = 8 << 20;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    pub file: PathBuf,
    pub offset: u64,
    pub what: String,
}

#[derive(Debug, Default, Clone)]
pub struct ShardSummary {
    pub dir: PathBuf,
    pub segments: usize,
    pub records: u64,
    pub first_offset: u64,
    /// End of the last valid record: where the broker would append next.
    pub last_valid_offset: u64,
    pub queues: usize,
    pub consume_queue_entries: u64,
    pub index_entries: u64,
}

#[derive(Debug, Default, Clone)]
pub struct VerifyReport {
    pub shards: Vec<ShardSummary>,
    pub problems: Vec<Problem>,
}

impl VerifyReport {
    pub fn is_clean(&self) -> bool {
        self.problems.is_empty()
    }
}

/// Verifies `data_dir`: either a broker data directory (with `shard-N` subdirectories) or one
/// shard directory.
pub fn verify_data_dir(data_dir: &Path) -> io::Result<VerifyReport> {
    let mut report = VerifyReport::default();
    let mut shard_dirs: Vec<PathBuf> = Vec::new();
    if data_dir.join("commitlog").is_dir() {
        shard_dirs.push(data_dir.to_path_buf());
    } else {
        for entry in std::fs::read_dir(data_dir)? {
            let entry = entry?;
            let name = entry.file_name();
            if name.to_str().is_some_and(|n| n.starts_with("shard-")) && entry.path().is_dir() {
                shard_dirs.push(entry.path());
            }
        }
        shard_dirs.sort();
    }
    if shard_dirs.is_empty() {
        return Err(io::Error::new(
            io::ErrorKind::NotFound,
            format!(
                "{} holds no shard directory (shard-N/) and no commitlog/",
                data_dir.display()
            ),
        ));
    }
    for dir in shard_dirs {
        let summary = verify_shard(&dir, &mut report.problems)?;
        report.shards.push(summary);
    }
    Ok(report)
}

/// What the CommitLog scan learned about one queue.
#[derive(Debug, Default)]
struct QueueSeen {
    next_queue_offset: Option<u64>,
    records: u64,
}

struct Segments {
    files: BTreeMap<u64, (PathBuf, File)>,
    segment_bytes: u64,
}

impl Segments {
    /// The validated record at `offset`, or why not.
    fn record_at(&self, offset: u64) -> Result<Vec<u8>, String> {
        let (base, (_, file)) = self
            .files
            .range(..=offset)
            .next_back()
            .ok_or_else(|| format!("offset {offset} is before the first segment"))?;
        if offset - base >= self.segment_bytes {
            return Err(format!("offset {offset} is in no segment"));
        }
        let mut head = [0u8; 4];
        file.read_exact_at(&mut head, offset - base)
            .map_err(|e| format!("cannot read at {offset}: {e}"))?;
        let size = u32::from_be_bytes(head) as u64;
        if size < 8 || size > self.segment_bytes {
            return Err(format!("no record starts at {offset} (size field {size})"));
        }
        let mut bytes = vec![0u8; size as usize];
        file.read_exact_at(&mut bytes, offset - base)
            .map_err(|e| format!("cannot read record at {offset}: {e}"))?;
        let view =
            decode_message(&bytes).map_err(|e| format!("record at {offset} is invalid: {e}"))?;
        if view.physical_offset() != offset {
            return Err(format!(
                "the record at {offset} says it belongs at {}",
                view.physical_offset()
            ));
        }
        Ok(bytes)
    }
}

fn verify_shard(dir: &Path, problems: &mut Vec<Problem>) -> io::Result<ShardSummary> {
    let mut summary = ShardSummary {
        dir: dir.to_path_buf(),
        ..ShardSummary::default()
    };
    let commitlog_dir = dir.join("commitlog");
    let listed = if commitlog_dir.is_dir() {
        list_segments(&commitlog_dir)?
    } else {
        Vec::new()
    };
    summary.segments = listed.len();
    let segment_bytes = match StoreFormat::load(dir) {
        Ok(Some(format)) => format.segment_bytes,
        Ok(None) => infer_segment_bytes(&listed)?,
        Err(e) => {
            problems.push(Problem {
                file: dir.join(super::format::FORMAT_FILE),
                offset: 0,
                what: e.to_string(),
            });
            infer_segment_bytes(&listed)?
        }
    };

    let mut segments = Segments {
        files: BTreeMap::new(),
        segment_bytes,
    };
    for (base, path) in &listed {
        segments
            .files
            .insert(*base, (path.clone(), File::open(path)?));
    }

    // 1. The CommitLog, record by record.
    let mut queues_seen: HashMap<(String, u32), QueueSeen> = HashMap::new();
    let mut expected_base: Option<u64> = None;
    summary.first_offset = listed.first().map(|(b, _)| *b).unwrap_or(0);
    for (position, (base, path)) in listed.iter().enumerate() {
        if base % segment_bytes != 0 {
            problems.push(Problem {
                file: path.clone(),
                offset: *base,
                what: format!(
                    "segment start is not a multiple of the segment size {segment_bytes}"
                ),
            });
        }
        if let Some(expected) = expected_base {
            if expected != *base {
                problems.push(Problem {
                    file: path.clone(),
                    offset: *base,
                    what: format!("segment should start at {expected}: a segment is missing or data ended early"),
                });
            }
        }
        let is_last = position + 1 == listed.len();
        let mut on_record = |record_position: u64, view: &RecordView<'_>| {
            summary.records += 1;
            let seen = queues_seen
                .entry((view.topic().to_owned(), view.queue_id()))
                .or_default();
            if let Some(next) = seen.next_queue_offset {
                if view.queue_offset() != next {
                    problems.push(Problem {
                        file: path.clone(),
                        offset: base + record_position,
                        what: format!(
                            "{}/{}: queue offset {} follows {} (not contiguous)",
                            view.topic(),
                            view.queue_id(),
                            view.queue_offset(),
                            next - 1
                        ),
                    });
                }
            }
            seen.next_queue_offset = Some(view.queue_offset() + 1);
            seen.records += 1;
        };
        let (stop, file_len) = scan_file(path, *base, segment_bytes, &mut on_record)?;
        match stop {
            ScanStop::SegmentEnd { .. } => {
                summary.last_valid_offset = base + segment_bytes;
                expected_base = Some(base + segment_bytes);
            }
            ScanStop::DataEnd { position } => {
                summary.last_valid_offset = base + position;
                expected_base = Some(base + segment_bytes);
                if !is_last {
                    problems.push(Problem {
                        file: path.clone(),
                        offset: base + position,
                        what: "data ends before the segment does, yet later segments exist".into(),
                    });
                }
                if let Some(garbage_at) = first_nonzero_after(path, position, file_len)? {
                    problems.push(Problem {
                        file: path.clone(),
                        offset: base + garbage_at,
                        what: format!(
                            "non-zero bytes after the end of data at {} (torn write?)",
                            base + position
                        ),
                    });
                }
            }
            ScanStop::Invalid { position, error } => {
                summary.last_valid_offset = base + position;
                expected_base = Some(base + segment_bytes);
                problems.push(Problem {
                    file: path.clone(),
                    offset: base + position,
                    what: format!("invalid record: {error}"),
                });
            }
            ScanStop::NeedMore { .. } => unreachable!("scan_file reads to the end"),
        }
    }

    // 2. The checkpoint.
    match Checkpoint::load(dir)? {
        Ok(Some(checkpoint)) if checkpoint.commitlog_durable_offset > summary.last_valid_offset => {
            problems.push(Problem {
                file: dir.join(super::checkpoint::CHECKPOINT_FILE),
                offset: checkpoint.commitlog_durable_offset,
                what: format!(
                    "checkpoint says the CommitLog is durable up to {} but valid data ends at {}",
                    checkpoint.commitlog_durable_offset, summary.last_valid_offset
                ),
            });
        }
        Ok(_) => {}
        Err(why) => problems.push(Problem {
            file: dir.join(super::checkpoint::CHECKPOINT_FILE),
            offset: 0,
            what: why,
        }),
    }

    // 3. ConsumeQueues.
    let commitlog_min = summary.first_offset;
    let queue_root = dir.join("consumequeue");
    let mut queue_dirs: Vec<(String, u32, PathBuf)> = Vec::new();
    if queue_root.is_dir() {
        for topic in std::fs::read_dir(&queue_root)? {
            let topic = topic?;
            let Some(topic_name) = topic.file_name().to_str().map(str::to_owned) else {
                continue;
            };
            if !topic.path().is_dir() {
                continue;
            }
            for queue in std::fs::read_dir(topic.path())? {
                let queue = queue?;
                if let Some(id) = queue
                    .file_name()
                    .to_str()
                    .and_then(|n| n.parse::<u32>().ok())
                {
                    queue_dirs.push((topic_name.clone(), id, queue.path()));
                }
            }
        }
    }
    queue_dirs.sort();
    summary.queues = queue_dirs.len().max(queues_seen.len());
    for (topic, queue_id, queue_dir) in &queue_dirs {
        let seen_next = queues_seen
            .get(&(topic.clone(), *queue_id))
            .and_then(|s| s.next_queue_offset)
            .unwrap_or(0);
        let mut entries_seen_end = 0u64;
        let mut files: Vec<(u64, PathBuf)> = std::fs::read_dir(queue_dir)?
            .filter_map(|e| e.ok())
            .filter_map(|e| {
                e.file_name()
                    .to_str()
                    .and_then(parse_segment_file_name)
                    .map(|s| (s, e.path()))
            })
            .collect();
        files.sort();
        for (start, path) in files {
            let bytes = std::fs::read(&path)?;
            for (i, chunk) in bytes
                .chunks_exact(CONSUME_QUEUE_ENTRY_BYTES as usize)
                .enumerate()
            {
                let Some(entry) = ConsumeQueueEntry::decode(chunk) else {
                    break;
                };
                let queue_offset = start + i as u64;
                entries_seen_end = queue_offset + 1;
                summary.consume_queue_entries += 1;
                if entry == ConsumeQueueEntry::HOLE || entry.commitlog_offset < commitlog_min {
                    continue;
                }
                let check = segments
                    .record_at(entry.commitlog_offset)
                    .and_then(|bytes| {
                        let view =
                            RecordView::parse_unchecked(&bytes).map_err(|e| e.to_string())?;
                        let tag_hash = view.tags().map(tags_hash).unwrap_or(0);
                        if view.topic() != topic
                            || view.queue_id() != *queue_id
                            || view.queue_offset() != queue_offset
                        {
                            Err(format!(
                                "points at a record of {}/{} offset {}",
                                view.topic(),
                                view.queue_id(),
                                view.queue_offset()
                            ))
                        } else if view.total_size() != entry.size || tag_hash != entry.tags_hash {
                            Err("size or tags hash differ from the record".to_string())
                        } else {
                            Ok(())
                        }
                    });
                if let Err(what) = check {
                    problems.push(Problem {
                        file: path.clone(),
                        offset: (queue_offset - start) * CONSUME_QUEUE_ENTRY_BYTES,
                        what: format!(
                            "entry {queue_offset} (commitlog offset {}): {what}",
                            entry.commitlog_offset
                        ),
                    });
                }
            }
        }
        if entries_seen_end != seen_next && seen_next > 0 {
            problems.push(Problem {
                file: queue_dir.clone(),
                offset: entries_seen_end,
                what: format!(
                    "{topic}/{queue_id}: ConsumeQueue ends at offset {entries_seen_end}, CommitLog has messages up to {seen_next}"
                ),
            });
        }
    }

    // 4. The index.
    let index_dir = dir.join("index");
    if index_dir.is_dir() {
        let mut files: Vec<(u64, PathBuf)> = std::fs::read_dir(&index_dir)?
            .filter_map(|e| e.ok())
            .filter_map(|e| {
                e.file_name()
                    .to_str()
                    .and_then(parse_segment_file_name)
                    .map(|s| (s, e.path()))
            })
            .collect();
        files.sort();
        for (_, path) in files {
            let bytes = std::fs::read(&path)?;
            for (i, chunk) in bytes.chunks_exact(INDEX_ENTRY_BYTES as usize).enumerate() {
                let Some(entry) = IndexEntry::decode(chunk) else {
                    break;
                };
                summary.index_entries += 1;
                if entry.commitlog_offset < commitlog_min {
                    continue;
                }
                let check = segments
                    .record_at(entry.commitlog_offset)
                    .and_then(|bytes| {
                        let view =
                            RecordView::parse_unchecked(&bytes).map_err(|e| e.to_string())?;
                        let topic = view.topic();
                        let is_key = view
                            .keys()
                            .any(|k| index_hash(IndexKind::Key, topic, k) == entry.hash);
                        let is_id = view.unique_key().is_some_and(|id| {
                            index_hash(IndexKind::UniqueId, "", id) == entry.hash
                        });
                        if is_key || is_id {
                            Ok(())
                        } else {
                            Err("hash matches none of the record's keys or id".to_string())
                        }
                    });
                if let Err(what) = check {
                    problems.push(Problem {
                        file: path.clone(),
                        offset: i as u64 * INDEX_ENTRY_BYTES,
                        what: format!(
                            "index entry for commitlog offset {}: {what}",
                            entry.commitlog_offset
                        ),
                    });
                }
            }
        }
    }
    Ok(summary)
}

/// Without a format file, the distance between the first two segments, else the largest.
fn infer_segment_bytes(listed: &[(u64, PathBuf)]) -> io::Result<u64> {
    if listed.len() >= 2 {
        return Ok(listed[1].0 - listed[0].0);
    }
    Ok(match listed.first() {
        Some((_, path)) => std::fs::metadata(path)?.len().max(1 << 30),
        None => 1 << 30,
    })
}

fn scan_file(
    path: &Path,
    base: u64,
    segment_bytes: u64,
    on_record: &mut dyn FnMut(u64, &RecordView<'_>),
) -> io::Result<(ScanStop, u64)> {
    let mut file = File::open(path)?;
    let file_len = file.metadata()?.len();
    let mut position = 0u64;
    let mut window_bytes = WINDOW_BYTES;
    loop {
        if position >= file_len {
            let stop = if position >= segment_bytes {
                ScanStop::SegmentEnd { position }
            } else {
                ScanStop::DataEnd { position }
            };
            return Ok((stop, file_len));
        }
        let want = window_bytes.min(file_len - position);
        let mut window = vec![0u8; want as usize];
        file.seek(SeekFrom::Start(position))?;
        file.read_exact(&mut window)?;
        let is_file_end = position + want >= file_len;
        match scan_window(
            &window,
            base,
            position,
            segment_bytes,
            is_file_end,
            on_record,
        ) {
            ScanStop::NeedMore { position: next } => {
                window_bytes = if next == position {
                    window_bytes * 2
                } else {
                    WINDOW_BYTES
                };
                position = next;
            }
            other => return Ok((other, file_len)),
        }
    }
}

fn first_nonzero_after(path: &Path, position: u64, file_len: u64) -> io::Result<Option<u64>> {
    let file = File::open(path)?;
    let mut at = position;
    let mut buffer = vec![0u8; 1 << 20];
    while at < file_len {
        let want = (file_len - at).min(buffer.len() as u64) as usize;
        file.read_exact_at(&mut buffer[..want], at)?;
        if let Some(i) = buffer[..want].iter().position(|&b| b != 0) {
            return Ok(Some(at + i as u64));
        }
        at += want as u64;
    }
    Ok(None)
}

/// The report as one JSON object (for scripts and tests).
pub fn report_json(report: &VerifyReport) -> String {
    let shards: Vec<serde_json::Value> = report
        .shards
        .iter()
        .map(|s| {
            serde_json::json!({
                "dir": s.dir.display().to_string(),
                "segments": s.segments,
                "records": s.records,
                "first_offset": s.first_offset,
                "last_valid_offset": s.last_valid_offset,
                "queues": s.queues,
                "consume_queue_entries": s.consume_queue_entries,
                "index_entries": s.index_entries,
            })
        })
        .collect();
    let problems: Vec<serde_json::Value> = report
        .problems
        .iter()
        .map(|p| serde_json::json!({"file": p.file.display().to_string(), "offset": p.offset, "what": p.what}))
        .collect();
    serde_json::json!({"clean": report.is_clean(), "shards": shards, "problems": problems})
        .to_string()
}
