//! Crash and corruption: what a torn tail, a flipped byte or a lost checkpoint leaves behind,
//! and what recovery and `verify` make of it. Each test names the invariant it checks.

mod common;

use std::path::{Path, PathBuf};

use common::*;
use shardmq_store::commitlog::list_segments;
use shardmq_store::verify::verify_data_dir;
use shardmq_store::{AppendStatus, FlushMode, MessageStore, StoreError, TagFilter};

/// One acknowledged record of the base data set.
#[derive(Debug, Clone)]
struct Acked {
    topic: &'static str,
    queue_id: u32,
    physical_offset: u64,
    size: u32,
    body: Vec<u8>,
}

const QUEUES: [(&str, u32); 4] = [("alpha", 0), ("alpha", 1), ("beta", 0), ("beta", 3)];

/// Writes ~3 segments of records under sync flush and closes cleanly.
fn build_base(dir: &Path) -> Vec<Acked> {
    let config = small_config(dir, FlushMode::Sync);
    run(|| async move {
        let (store, _) = MessageStore::open(config).await.unwrap();
        let mut acked = Vec::new();
        for seq in 0..280u64 {
            let (topic, queue_id) = QUEUES[(seq % 4) as usize];
            let len = 100 + ((seq * 7919) % 600) as usize;
            let body = body_for(topic, queue_id, seq / 4, len);
            let msg = Msg {
                body: body.clone(),
                tags: Some("T".into()),
                keys: Some(format!("k{seq}")),
                unique_id: Some(format!("U{seq}")),
            };
            let outcome = store.append(batch(topic, queue_id, &[msg])).await.unwrap();
            assert_eq!(outcome.status, AppendStatus::Ok);
            let record = outcome.records[0];
            acked.push(Acked {
                topic,
                queue_id,
                physical_offset: record.physical_offset,
                size: record.size,
                body,
            });
        }
        store.close().await.unwrap();
        acked
    })
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.path().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).unwrap();
        }
    }
}

fn last_segment(dir: &Path) -> (u64, PathBuf) {
    list_segments(&dir.join("commitlog"))
        .unwrap()
        .pop()
        .unwrap()
}

/// A tiny deterministic generator: tests must be reproducible.
struct Lcg(u64);
impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 33
    }
}

/// Reopens `dir`, checks that exactly the records wholly before `cut` are served per queue, and
/// that the store is writable again and verifies clean.
fn check_after_cut(dir: &Path, acked: &[Acked], cut: u64) {
    let expected: Vec<Acked> = acked
        .iter()
        .filter(|a| a.physical_offset + u64::from(a.size) <= cut)
        .cloned()
        .collect();
    let config = small_config(dir, FlushMode::Sync);
    run(|| async move {
        let (store, report) = MessageStore::open(config).await.unwrap();
        let (_, write, _) = store.commitlog_offsets();
        let expected_end = expected
            .last()
            .map(|a| a.physical_offset + u64::from(a.size))
            .unwrap_or(0);
        assert!(
            write >= expected_end,
            "cut at {cut}: recovered end {write} lost intact records (last intact ends at {expected_end}); report {report:?}"
        );
        for (topic, queue_id) in QUEUES {
            let got = read_all(&store, topic, queue_id, 0).await;
            let want: Vec<Vec<u8>> = expected
                .iter()
                .filter(|a| a.topic == topic && a.queue_id == queue_id)
                .map(|a| a.body.clone())
                .collect();
            assert_eq!(got.len(), want.len(), "cut at {cut}: {topic}/{queue_id} serves every record before the cut and none after");
            assert_eq!(got, want, "cut at {cut}: {topic}/{queue_id} bodies intact");
        }
        // Writable again, continuing each queue's offsets.
        for (topic, queue_id) in QUEUES {
            let count = expected
                .iter()
                .filter(|a| a.topic == topic && a.queue_id == queue_id)
                .count() as u64;
            let outcome = store
                .append(batch(topic, queue_id, &[plain(topic, queue_id, 999, 300)]))
                .await
                .unwrap();
            assert_eq!(
                outcome.records[0].queue_offset, count,
                "cut at {cut}: queue offsets continue after recovery"
            );
        }
        store.close().await.unwrap();
    });
    let report = verify_data_dir(dir).unwrap();
    assert!(
        report.is_clean(),
        "cut at {cut}: verify after recovery: {:?}",
        report.problems
    );
}

#[test]
fn torn_tail_at_any_byte_keeps_every_record_before_it_and_nothing_after() {
    let base = tempfile::tempdir().unwrap();
    let acked = build_base(base.path());
    let (last_base, last_path) = last_segment(base.path());
    let last_len = std::fs::metadata(&last_path).unwrap().len();
    let records_in_last: Vec<u64> = acked
        .iter()
        .filter(|a| a.physical_offset >= last_base)
        .map(|a| a.physical_offset - last_base)
        .collect();
    assert!(
        records_in_last.len() > 5 && last_base > 0,
        "base data must span segments"
    );

    // Record boundaries and their neighbours, both ends, and pseudo-random bytes.
    let mut cuts: Vec<u64> = vec![0, 1, 7, 8, last_len];
    for &start in records_in_last
        .iter()
        .take(3)
        .chain(records_in_last.iter().rev().take(2))
    {
        cuts.extend([start, start + 1, start + 4, start.saturating_sub(1)]);
    }
    let mut rng = Lcg(0x5eed);
    let data_end = records_in_last.last().copied().unwrap() + 1;
    for _ in 0..14 {
        cuts.push(rng.next() % data_end.max(1));
    }
    cuts.sort_unstable();
    cuts.dedup();

    for (round, &cut) in cuts.iter().enumerate() {
        let work = tempfile::tempdir().unwrap();
        copy_dir(base.path(), work.path());
        let (_, path) = last_segment(work.path());
        let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        file.set_len(cut.min(last_len)).unwrap();
        drop(file);
        match round % 3 {
            // The checkpoint (which says more is durable) is kept: recovery must not trust it.
            0 => {}
            // No checkpoint: a full scan from the first segment.
            1 => std::fs::remove_file(work.path().join("checkpoint")).unwrap(),
            // A torn write: garbage after the cut.
            _ => {
                use std::io::Write;
                let mut file = std::fs::OpenOptions::new()
                    .append(true)
                    .open(&path)
                    .unwrap();
                let garbage: Vec<u8> = (0..(rng.next() % 5000 + 1))
                    .map(|_| rng.next() as u8)
                    .collect();
                file.write_all(&garbage).unwrap();
            }
        }
        check_after_cut(work.path(), &acked, last_base + cut.min(last_len));
    }
}

#[test]
fn flipped_byte_in_the_commitlog_is_reported_by_verify_and_never_served() {
    let base = tempfile::tempdir().unwrap();
    let acked = build_base(base.path());
    let victim = acked[acked.len() / 3].clone();
    let segments = list_segments(&base.path().join("commitlog")).unwrap();
    let (segment_base, segment_path) = segments
        .iter()
        .rev()
        .find(|(b, _)| *b <= victim.physical_offset)
        .cloned()
        .unwrap();
    // Flip a byte in the middle of the victim's body.
    let at = victim.physical_offset - segment_base + u64::from(victim.size) / 2;
    let mut bytes = std::fs::read(&segment_path).unwrap();
    bytes[at as usize] ^= 0x20;
    std::fs::write(&segment_path, &bytes).unwrap();

    let report = verify_data_dir(base.path()).unwrap();
    assert!(!report.is_clean(), "verify must notice a flipped byte");
    assert!(
        report
            .problems
            .iter()
            .any(|p| p.file == segment_path && p.offset == victim.physical_offset),
        "verify names the file and the damaged record's offset {}: {:?}",
        victim.physical_offset,
        report.problems
    );

    // With the checkpoint, recovery does not rescan the durable region; the read path checks
    // CRCs and refuses the damaged record instead of serving it.
    let config = small_config(base.path(), FlushMode::Sync);
    let victim_clone = victim.clone();
    run(|| async move {
        let (store, _) = MessageStore::open(config).await.unwrap();
        let mut offset = 0;
        let error = loop {
            match store
                .get_messages(
                    victim_clone.topic,
                    victim_clone.queue_id,
                    offset,
                    1,
                    1 << 20,
                    &TagFilter::All,
                )
                .await
            {
                Ok(result) if result.records.is_empty() => {
                    panic!("reached the end without meeting the damaged record")
                }
                Ok(result) => offset = result.next_offset,
                Err(e) => break e,
            }
        };
        assert!(matches!(error, StoreError::Corrupt(_)), "{error}");
        assert!(
            error
                .to_string()
                .contains(&victim_clone.physical_offset.to_string()),
            "{error}"
        );
        store.close().await.unwrap();
    });

    // Without the checkpoint, recovery scans everything and cuts at the damaged record,
    // reporting where and why (it does not skip over it).
    let work = tempfile::tempdir().unwrap();
    copy_dir(base.path(), work.path());
    std::fs::remove_file(work.path().join("checkpoint")).unwrap();
    let config = small_config(work.path(), FlushMode::Sync);
    run(|| async move {
        let (store, report) = MessageStore::open(config).await.unwrap();
        let (offset, why) = report
            .commitlog
            .truncated_at
            .clone()
            .expect("recovery reports the cut");
        assert_eq!(offset, victim.physical_offset);
        assert!(why.contains("CRC"), "{why}");
        assert!(report.commitlog.discarded_bytes > 0);
        store.close().await.unwrap();
    });
}

#[test]
fn damaged_derived_files_and_checkpoint_are_reported_and_rebuilt() {
    let base = tempfile::tempdir().unwrap();
    let acked = build_base(base.path());

    // A flipped byte in a ConsumeQueue entry's commitlog offset.
    let queue_file = base
        .path()
        .join("consumequeue/alpha/1/00000000000000000000");
    let mut bytes = std::fs::read(&queue_file).unwrap();
    bytes[20 * 3 + 6] ^= 0x01;
    std::fs::write(&queue_file, &bytes).unwrap();
    let report = verify_data_dir(base.path()).unwrap();
    assert!(
        report
            .problems
            .iter()
            .any(|p| p.file == queue_file && p.offset == 60),
        "verify points at the damaged ConsumeQueue entry: {:?}",
        report.problems
    );

    // A damaged checkpoint: verify says so; the store rebuilds everything and serves all.
    let checkpoint = base.path().join("checkpoint");
    let mut bytes = std::fs::read(&checkpoint).unwrap();
    bytes[12] ^= 0xff;
    std::fs::write(&checkpoint, &bytes).unwrap();
    let report = verify_data_dir(base.path()).unwrap();
    assert!(
        report.problems.iter().any(|p| p.file == checkpoint),
        "{:?}",
        report.problems
    );

    let config = small_config(base.path(), FlushMode::Sync);
    run(|| async move {
        let (store, report) = MessageStore::open(config).await.unwrap();
        assert!(report.checkpoint_problem.is_some());
        for (topic, queue_id) in QUEUES {
            let want: Vec<Vec<u8>> = acked
                .iter()
                .filter(|a| a.topic == topic && a.queue_id == queue_id)
                .map(|a| a.body.clone())
                .collect();
            assert_eq!(
                read_all(&store, topic, queue_id, 0).await,
                want,
                "{topic}/{queue_id} after rebuild"
            );
        }
        store.close().await.unwrap();
    });
    let report = verify_data_dir(base.path()).unwrap();
    assert!(
        report.is_clean(),
        "rebuild repaired the derived files: {:?}",
        report.problems
    );
}
