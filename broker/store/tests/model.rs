//! Random interleavings of appends, reads, time/key lookups and reopens against an in-memory
//! model of what each queue must hold.

mod common;

use common::*;
use proptest::prelude::*;
use shardmq_store::record::decode_message;
use shardmq_store::{FlushMode, GetStatus, MessageStore, TagFilter};

#[derive(Debug, Clone)]
enum Op {
    Append {
        queue: u32,
        count: usize,
        size: usize,
    },
    Read {
        queue: u32,
        from_permille: u32,
        max: u32,
    },
    QueryKey {
        queue: u32,
        pick_permille: u32,
    },
    Reopen,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        5 => (0u32..3, 1usize..6, 1usize..5000).prop_map(|(queue, count, size)| Op::Append { queue, count, size }),
        3 => (0u32..3, 0u32..1001, 1u32..40).prop_map(|(queue, from_permille, max)| Op::Read { queue, from_permille, max }),
        1 => (0u32..3, 0u32..1001).prop_map(|(queue, pick_permille)| Op::QueryKey { queue, pick_permille }),
        1 => Just(Op::Reopen),
    ]
}

fn key_of(queue: u32, seq: usize) -> String {
    format!("q{queue}-m{seq}")
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn store_matches_model(ops in proptest::collection::vec(op(), 1..40), is_sync in any::<bool>()) {
        let dir = tempfile::tempdir().unwrap();
        let flush_mode = if is_sync { FlushMode::Sync } else { FlushMode::Async };
        let config = small_config(dir.path(), flush_mode);
        run(|| async move {
            let mut model: Vec<Vec<Vec<u8>>> = vec![Vec::new(); 3];
            let (mut store, _) = MessageStore::open(config.clone()).await.unwrap();
            for op in ops {
                match op {
                    Op::Append { queue, count, size } => {
                        let messages: Vec<Msg> = (0..count)
                            .map(|i| {
                                let seq = model[queue as usize].len() + i;
                                Msg {
                                    body: body_for("model", queue, seq as u64, size),
                                    tags: Some(format!("tag{}", seq % 2)),
                                    keys: Some(key_of(queue, seq)),
                                    unique_id: None,
                                }
                            })
                            .collect();
                        let outcome = store.append(batch("model", queue, &messages)).await.unwrap();
                        for (i, record) in outcome.records.iter().enumerate() {
                            assert_eq!(record.queue_offset as usize, model[queue as usize].len() + i);
                        }
                        for msg in messages {
                            model[queue as usize].push(msg.body);
                        }
                    }
                    Op::Read { queue, from_permille, max } => {
                        let len = model[queue as usize].len();
                        let from = len * from_permille as usize / 1000;
                        let result = store
                            .get_messages("model", queue, from as u64, max, 1 << 20, &TagFilter::All)
                            .await
                            .unwrap();
                        if len == 0 {
                            assert_eq!(result.status, GetStatus::NoMatchedQueue);
                        } else if from == len {
                            assert_eq!(result.status, GetStatus::NoNewMessage);
                        } else {
                            let want = &model[queue as usize][from..(from + max as usize).min(len)];
                            let got: Vec<Vec<u8>> =
                                result.records.iter().map(|r| decode_message(r).unwrap().body().to_vec()).collect();
                            assert_eq!(got.as_slice(), want);
                            assert_eq!(result.next_offset as usize, from + want.len());
                        }
                    }
                    Op::QueryKey { queue, pick_permille } => {
                        let len = model[queue as usize].len();
                        if len == 0 {
                            continue;
                        }
                        let seq = (len - 1) * pick_permille as usize / 1000;
                        let hits = store.query_by_key("model", &key_of(queue, seq), 0, i64::MAX, 4).await.unwrap();
                        assert_eq!(hits.len(), 1, "key {}", key_of(queue, seq));
                        assert_eq!(decode_message(&hits[0]).unwrap().body(), &model[queue as usize][seq][..]);
                    }
                    Op::Reopen => {
                        store.close().await.unwrap();
                        store = MessageStore::open(config.clone()).await.unwrap().0;
                    }
                }
            }
            store.close().await.unwrap();
        });
        let report = shardmq_store::verify::verify_data_dir(dir.path()).unwrap();
        prop_assert!(report.is_clean(), "{:?}", report.problems);
    }
}
