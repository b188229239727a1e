//! The storage engine's replication primitives (the data half of master/slave replication):
//! a master's CommitLog bytes, read with `read_for_replica` in arbitrary pieces and appended to
//! another store with `append_replicated`, make an identical log there (same bytes at the same
//! offsets, segment rollovers included) with the same ConsumeQueues and index; bytes that do
//! not continue the log or are not records are refused and change nothing.

mod common;

use std::path::Path;

use common::*;
use shardmq_store::verify::verify_data_dir;
use shardmq_store::{FlushMode, MessageStore, StoreConfig, StoreError};

const TOPICS: [&str; 3] = ["orders", "payments", "%RETRY%group-a"];

/// A small deterministic generator (xorshift), so a failure replays.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

fn config(dir: &Path, flush_mode: FlushMode) -> StoreConfig {
    small_config(dir, flush_mode)
}

/// Appends messages `seqs` of varied sizes over three topics and two queues, with keys and
/// unique ids, to `store`.
async fn fill(store: &MessageStore, rng: &mut Rng, seqs: std::ops::Range<u64>) {
    for seq in seqs {
        let topic = TOPICS[(seq % 3) as usize];
        let queue_id = (seq / 3 % 2) as u32;
        let message = Msg {
            body: body_for(topic, queue_id, seq, 40 + rng.below(3000) as usize),
            tags: Some(format!("tag-{}", seq % 4)),
            keys: Some(format!("key-{seq}")),
            unique_id: Some(format!("ID{seq:08}")),
        };
        store
            .append(batch(topic, queue_id, &[message]))
            .await
            .unwrap();
    }
}

/// Copies everything `master` has to `replica`, in pieces of random size (read sizes and
/// sub-splits of each read), as a slave's replication loop would.
async fn replicate(master: &MessageStore, replica: &MessageStore, rng: &mut Rng) -> u64 {
    let mut from = replica.commitlog_offsets().1;
    loop {
        let want = 1 + rng.below(20_000);
        let bytes = master.read_for_replica(from, want).await.unwrap();
        if bytes.is_empty() {
            let (_, master_end, _) = master.commitlog_offsets();
            if from == master_end {
                return from;
            }
            // Not written yet on the master: wait for its flush.
            glommio::timer::sleep(std::time::Duration::from_millis(2)).await;
            continue;
        }
        let mut at = 0usize;
        while at < bytes.len() {
            let piece = (1 + rng.below(bytes.len() as u64) as usize).min(bytes.len() - at);
            from = replica
                .append_replicated(from, &bytes[at..at + piece])
                .await
                .unwrap();
            at += piece;
        }
    }
}

async fn assert_same(master: &MessageStore, replica: &MessageStore, what: &str) {
    let (_, master_end, _) = master.commitlog_offsets();
    let (_, replica_end, _) = replica.commitlog_offsets();
    assert_eq!(replica_end, master_end, "{what}: CommitLog ends");
    for topic in TOPICS {
        for queue_id in 0..2 {
            assert_eq!(
                read_all(replica, topic, queue_id, 0).await,
                read_all(master, topic, queue_id, 0).await,
                "{what}: {topic}/{queue_id}"
            );
            assert_eq!(
                replica.queue_offsets(topic, queue_id),
                master.queue_offsets(topic, queue_id),
                "{what}: offsets of {topic}/{queue_id}"
            );
        }
    }
    for seq in [0u64, 7, 199, 399] {
        let key = format!("key-{seq}");
        let topic = TOPICS[(seq % 3) as usize];
        let on_master = master
            .query_by_key(topic, &key, 0, i64::MAX, 4)
            .await
            .unwrap();
        let on_replica = replica
            .query_by_key(topic, &key, 0, i64::MAX, 4)
            .await
            .unwrap();
        assert_eq!(on_replica, on_master, "{what}: query {key}");
        assert_eq!(on_master.len(), 1, "{what}: {key} is found");
        let physical = shardmq_store::record::decode_message(&on_master[0])
            .unwrap()
            .physical_offset();
        assert_eq!(
            replica.read_record_at(physical).await.unwrap(),
            on_master[0],
            "{what}: the same record at the same offset"
        );
    }
}

#[test]
fn replicated_bytes_in_random_pieces_make_an_identical_store() {
    for (seed, flush_mode) in [(1u64, FlushMode::Async), (2, FlushMode::Sync)] {
        let master_dir = tempfile::tempdir().unwrap();
        let replica_dir = tempfile::tempdir().unwrap();
        let master_config = config(master_dir.path(), flush_mode);
        let replica_config = config(replica_dir.path(), flush_mode);
        run(|| async move {
            let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ seed);
            let (master, _) = MessageStore::open(master_config).await.unwrap();
            let (replica, _) = MessageStore::open(replica_config.clone()).await.unwrap();
            // 64 KiB segments: the log rolls over many times, with fillers replicated too.
            fill(&master, &mut rng, 0..200).await;
            replicate(&master, &replica, &mut rng).await;
            fill(&master, &mut rng, 200..400).await;
            replicate(&master, &replica, &mut rng).await;
            wait_until_durable(&replica).await;
            assert_same(&master, &replica, "live").await;

            // Half a record, then a restart: recovery cuts the torn record, and replication
            // resumes from the end the replica reports.
            fill(&master, &mut rng, 400..401).await;
            wait_until_durable(&master).await;
            let end = replica.commitlog_offsets().1;
            let next = master.read_for_replica(end, 1 << 20).await.unwrap();
            assert!(next.len() > 100, "one record to replicate");
            replica
                .append_replicated(end, &next[..next.len() / 2])
                .await
                .unwrap();
            wait_until_durable(&replica).await;
            replica.close().await.unwrap();
            let (replica, _) = MessageStore::open(replica_config.clone()).await.unwrap();
            assert_eq!(replica.commitlog_offsets().1, end, "the torn record is cut");
            replicate(&master, &replica, &mut rng).await;
            wait_until_durable(&replica).await;

            // The replica restarts from its own files and resumes where it ended.
            replica.close().await.unwrap();
            let (replica, _) = MessageStore::open(replica_config).await.unwrap();
            assert_same(&master, &replica, "after a restart").await;
            fill(&master, &mut rng, 401..430).await;
            replicate(&master, &replica, &mut rng).await;
            wait_until_durable(&replica).await;
            let (_, end, _) = master.commitlog_offsets();
            assert_eq!(replica.commitlog_offsets().1, end);
            replica.close().await.unwrap();
            master.close().await.unwrap();
        });
        let report = verify_data_dir(replica_dir.path()).unwrap();
        assert!(report.is_clean(), "{:?}", report.problems);
        let records: u64 = report.shards.iter().map(|s| s.records).sum();
        assert_eq!(records, 430);
    }
}

#[test]
fn bytes_that_do_not_continue_the_log_or_are_not_records_change_nothing() {
    let master_dir = tempfile::tempdir().unwrap();
    let replica_dir = tempfile::tempdir().unwrap();
    let master_config = config(master_dir.path(), FlushMode::Async);
    let replica_config = config(replica_dir.path(), FlushMode::Async);
    run(|| async move {
        let mut rng = Rng(7);
        let (master, _) = MessageStore::open(master_config).await.unwrap();
        let (replica, _) = MessageStore::open(replica_config).await.unwrap();
        fill(&master, &mut rng, 0..20).await;
        wait_until_durable(&master).await;
        let bytes = master.read_for_replica(0, 5_000).await.unwrap();
        assert!(!bytes.is_empty());

        // Not where the replica's log ends.
        let gap = replica.append_replicated(100, &bytes).await;
        assert!(
            matches!(
                gap,
                Err(StoreError::ReplicaGap {
                    expected: 0,
                    got: 100
                })
            ),
            "{gap:?}"
        );
        // A damaged byte inside a record: refused, nothing appended.
        let mut damaged = bytes.to_vec();
        damaged[200] ^= 0x40;
        let refused = replica.append_replicated(0, &damaged).await;
        assert!(
            matches!(refused, Err(StoreError::Corrupt(_))),
            "{refused:?}"
        );
        assert_eq!(
            replica.commitlog_offsets().1,
            0,
            "nothing of it was appended"
        );
        // The good bytes then go in.
        let end = replica.append_replicated(0, &bytes).await.unwrap();
        assert_eq!(end, bytes.len() as u64);

        // A master asked for bytes it does not have: the replica holds bytes it lacks.
        let (_, master_end, _) = master.commitlog_offsets();
        let ahead = master.read_for_replica(master_end + 1, 100).await;
        assert!(
            matches!(ahead, Err(StoreError::ReplicaOutOfRange { .. })),
            "{ahead:?}"
        );
        assert!(master
            .read_for_replica(master_end, 100)
            .await
            .unwrap()
            .is_empty());
        replica.close().await.unwrap();
        master.close().await.unwrap();
    });
}

/// Messages `range` of queue 0 of `topic`, 300-byte bodies.
fn numbered(topic: &str, range: std::ops::Range<u64>) -> Vec<Msg> {
    range.map(|seq| plain(topic, 0, seq, 300)).collect()
}

/// A store that dispatches by a confirmed offset (a sync master's, a controller-mode slave's)
/// does not serve after a restart what it had not confirmed before: recovery holds every
/// record past the checkpoint back until the owner confirms it again, appends take queue
/// offsets after the held ones, and confirming dispatches them all in order. A store without
/// the hold dispatches them at open, as before.
#[test]
fn records_past_the_checkpoint_wait_to_be_confirmed_again_after_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = config(dir.path(), FlushMode::Sync);
    config.hold_unconfirmed_tail = true;
    let topic = TOPICS[0];
    let expected = |range: std::ops::Range<u64>| -> Vec<Vec<u8>> {
        range.map(|seq| body_for(topic, 0, seq, 300)).collect()
    };
    run(|| async move {
        // Ten messages confirmed (no limit yet), checkpointed by a clean close.
        let (store, _) = MessageStore::open(config.clone()).await.unwrap();
        store
            .append(batch(topic, 0, &numbered(topic, 0..10)))
            .await
            .unwrap();
        store.close().await.unwrap();

        // Five more stored while the confirmed offset stays before them.
        let (store, report) = MessageStore::open(config.clone()).await.unwrap();
        assert_eq!(report.records_held_unconfirmed, 0, "{report:?}");
        assert_eq!(read_all(&store, topic, 0, 0).await, expected(0..10));
        let confirmed = store.commitlog_offsets().1;
        store.set_dispatch_limit(confirmed);
        store
            .append(batch(topic, 0, &numbered(topic, 10..15)))
            .await
            .unwrap();
        assert_eq!(read_all(&store, topic, 0, 0).await, expected(0..10));
        store.close().await.unwrap();

        // After the restart they are still held; a new append takes offset 15.
        let (store, report) = MessageStore::open(config.clone()).await.unwrap();
        assert_eq!(report.records_held_unconfirmed, 5, "{report:?}");
        assert_eq!(store.dispatch_limit(), confirmed);
        assert_eq!(read_all(&store, topic, 0, 0).await, expected(0..10));
        assert_eq!(store.queue_offsets(topic, 0), Some((0, 10)));
        let outcome = store
            .append(batch(topic, 0, &numbered(topic, 15..17)))
            .await
            .unwrap();
        assert_eq!(outcome.records[0].queue_offset, 15);
        assert_eq!(read_all(&store, topic, 0, 0).await, expected(0..10));
        let end = store.commitlog_offsets().1;
        store.set_dispatch_limit(end);
        assert_eq!(read_all(&store, topic, 0, 0).await, expected(0..17));
        // Unconfirmed again before a stop, then opened without the hold (an async master):
        // dispatched at open.
        store
            .append(batch(topic, 0, &numbered(topic, 17..20)))
            .await
            .unwrap();
        assert_eq!(read_all(&store, topic, 0, 0).await, expected(0..17));
        store.close().await.unwrap();
        let mut without_hold = config.clone();
        without_hold.hold_unconfirmed_tail = false;
        let (store, report) = MessageStore::open(without_hold).await.unwrap();
        assert_eq!(report.records_held_unconfirmed, 0, "{report:?}");
        assert_eq!(read_all(&store, topic, 0, 0).await, expected(0..20));
        store.close().await.unwrap();
    });
    let report = verify_data_dir(dir.path()).unwrap();
    assert!(report.is_clean(), "{:?}", report.problems);
}

/// A master taking back what a power loss took from its log appends a slave's bytes with
/// `append_replicated`; they wait to be dispatched until confirmed. Its own appends that follow
/// take queue offsets after the records taken back, never the same ones again.
#[test]
fn records_taken_back_and_not_yet_dispatched_keep_their_queue_offsets_from_new_appends() {
    let master_dir = tempfile::tempdir().unwrap();
    let replica_dir = tempfile::tempdir().unwrap();
    let mut replica_config = config(replica_dir.path(), FlushMode::Async);
    replica_config.hold_unconfirmed_tail = true;
    let master_config = config(master_dir.path(), FlushMode::Async);
    let topic = TOPICS[0];
    run(|| async move {
        let (master, _) = MessageStore::open(master_config).await.unwrap();
        master
            .append(batch(topic, 0, &numbered(topic, 0..8)))
            .await
            .unwrap();
        // The store that takes the bytes back confirms nothing yet: they wait to be dispatched.
        let (replica, _) = MessageStore::open(replica_config).await.unwrap();
        replica.set_dispatch_limit(0);
        let mut rng = Rng(7);
        let end = replicate(&master, &replica, &mut rng).await;
        assert_eq!(
            replica.queue_offsets(topic, 0),
            Some((0, 0)),
            "none dispatched"
        );
        let outcome = replica
            .append(batch(topic, 0, &numbered(topic, 8..10)))
            .await
            .unwrap();
        assert_eq!(outcome.records[0].queue_offset, 8);
        assert_eq!(outcome.records[1].queue_offset, 9);
        replica.set_dispatch_limit(replica.commitlog_offsets().1);
        let expected: Vec<Vec<u8>> = (0..10).map(|seq| body_for(topic, 0, seq, 300)).collect();
        assert_eq!(read_all(&replica, topic, 0, 0).await, expected);
        assert!(end > 0);
        replica.close().await.unwrap();
        master.close().await.unwrap();
    });
}
