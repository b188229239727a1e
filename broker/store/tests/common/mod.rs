//! Shared helpers for the storage tests: an executor per test, batches, configs, read-all.
#![allow(dead_code)]

use std::future::Future;
use std::path::Path;

use bytes::Bytes;
use glommio::{LocalExecutorBuilder, Placement};
use shardmq_store::record::decode_message;
use shardmq_store::{
    EncodedBatch, FlushMode, GetStatus, MessageStore, RecordInput, StoreConfig, TagFilter,
};

/// Runs `make()` to completion on a fresh glommio executor (one per test thread).
pub fn run<F, T>(make: impl FnOnce() -> F) -> T
where
    F: Future<Output = T>,
{
    LocalExecutorBuilder::new(Placement::Unbound)
        .make()
        .expect("glommio executor")
        .run(make())
}

/// A small-file configuration so that rollover and many files are exercised.
pub fn small_config(dir: &Path, flush_mode: FlushMode) -> StoreConfig {
    let mut config = StoreConfig::new(dir);
    config.flush_mode = flush_mode;
    config.segment_bytes = 64 << 10;
    config.consume_queue_entries_per_file = 64;
    config.index_max_entries_per_file = 100;
    config.flush_interval_ms = 20;
    config.checkpoint_interval_ms = 50;
    config.hot_tail_bytes = 16 << 10;
    config.journal_bytes = 64 << 10;
    config
}

/// The body of message `seq` of (topic, queue): self-describing so reads can be checked.
pub fn body_for(topic: &str, queue_id: u32, seq: u64, len: usize) -> Vec<u8> {
    let head = format!("{topic}/{queue_id}/{seq}:");
    let mut body = head.into_bytes();
    while body.len() < len {
        body.push(b'a' + (body.len() % 26) as u8);
    }
    body
}

pub struct Msg {
    pub body: Vec<u8>,
    pub tags: Option<String>,
    pub keys: Option<String>,
    pub unique_id: Option<String>,
}

pub fn batch(topic: &str, queue_id: u32, messages: &[Msg]) -> EncodedBatch {
    let mut batch = EncodedBatch::new();
    for msg in messages {
        let mut props: Vec<(&str, &str)> = Vec::new();
        if let Some(t) = &msg.tags {
            props.push(("TAGS", t));
        }
        if let Some(k) = &msg.keys {
            props.push(("KEYS", k));
        }
        if let Some(u) = &msg.unique_id {
            props.push(("UNIQ_KEY", u));
        }
        batch
            .push(&RecordInput {
                topic,
                queue_id,
                flag: 0,
                body: &msg.body,
                properties: &props,
                sys_flag: 0,
                born_timestamp_ms: 1_700_000_000_000,
                born_host: "127.0.0.1:40000".parse().unwrap(),
                store_host: "127.0.0.1:10911".parse().unwrap(),
                reconsume_times: 0,
                prepared_transaction_offset: 0,
            })
            .expect("encodable");
    }
    batch
}

pub fn plain(topic: &str, queue_id: u32, seq: u64, len: usize) -> Msg {
    Msg {
        body: body_for(topic, queue_id, seq, len),
        tags: None,
        keys: None,
        unique_id: None,
    }
}

/// Reads every message of a queue from `from`, returning bodies in queue order.
pub async fn read_all(store: &MessageStore, topic: &str, queue_id: u32, from: u64) -> Vec<Vec<u8>> {
    let mut bodies = Vec::new();
    let mut offset = from;
    loop {
        let result = store
            .get_messages(topic, queue_id, offset, 32, 1 << 20, &TagFilter::All)
            .await
            .expect("read");
        match result.status {
            GetStatus::Found => {
                for record in &result.records {
                    bodies.push(
                        decode_message(record)
                            .expect("served records are valid")
                            .body()
                            .to_vec(),
                    );
                }
                offset = result.next_offset;
            }
            GetStatus::NoNewMessage | GetStatus::NoMatchedQueue => return bodies,
            other => panic!("unexpected status {other:?} at offset {offset}"),
        }
    }
}

pub fn body_of(record: &Bytes) -> Vec<u8> {
    decode_message(record).unwrap().body().to_vec()
}

/// Waits (with a deadline) until everything appended is durable.
pub async fn wait_until_durable(store: &MessageStore) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let (_, write, durable) = store.commitlog_offsets();
        if durable == write {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "flush did not catch up: {durable} of {write}"
        );
        glommio::timer::sleep(std::time::Duration::from_millis(5)).await;
    }
}
