//! What the reliability suites (`reliability_*.rs`) share: a seeded random source, raw pulls
//! whose records are decoded and CRC-checked by the broker's own record decoder, the offline
//! `verify` run, routes at the namesrv, the log and the RSS of a server process.
//!
//! Each test binary uses part of this, so unused items are allowed here.
#![allow(dead_code)]

use std::path::Path;
use std::process::Command;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use shardmq_codec::decode_message;
use shardmq_schema::{wire, VerifiedFrame};
use shardmq_tests::{
    binary_path, pull_request_body, send_request_body, split_records, status_of, upsert_topic_body,
    wait_until, BrokerProcess, ClientError, NamesrvProcess, PullParams, TestClient, TestMessage,
    ROUTE_TIMEOUT,
};

/// Read and write.
pub const PERM_READ_WRITE: u32 = 6;

/// Two storage shards (cores 0 and 1) behind one network shard: a topic's queues alternate
/// between two CommitLogs.
pub const TWO_STORAGE_SHARDS: [&str; 4] = ["--storage-cores", "0,1", "--network-cores", "1"];

/// Records one pull asks for.
const PULL_BATCH: u32 = 256;

// ---------------------------------------------------------------------------------------------
// Randomness that can be replayed

/// Deterministic pseudo-random numbers (xorshift64*). Each test prints its seed; set
/// `SHARDMQ_TEST_SEED` to replay a failure.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// The generator for the test `name`: seeded from `SHARDMQ_TEST_SEED` when set, else from
    /// the clock. Prints the seed so that a failure can be replayed.
    #[must_use]
    pub fn for_test(name: &str) -> Self {
        let seed = std::env::var("SHARDMQ_TEST_SEED")
            .ok()
            .and_then(|text| text.trim().parse::<u64>().ok())
            .unwrap_or_else(|| {
                let since_epoch = SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .expect("the clock is after 1970");
                u64::try_from(since_epoch.as_nanos() % u128::from(u64::MAX)).unwrap_or(1)
            });
        eprintln!("{name}: seed {seed} (replay with SHARDMQ_TEST_SEED={seed})");
        Self::new(seed)
    }

    #[must_use]
    pub fn new(seed: u64) -> Self {
        // Zero is xorshift's fixed point.
        Self(seed.max(1))
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// A number in `range` (inclusive).
    pub fn in_range(&mut self, range: std::ops::RangeInclusive<u64>) -> u64 {
        let span = range.end() - range.start() + 1;
        range.start() + self.next_u64() % span
    }

    /// An index below `bound` (> 0).
    pub fn below(&mut self, bound: usize) -> usize {
        usize::try_from(self.next_u64() % u64::try_from(bound).expect("usize fits u64"))
            .expect("below a usize")
    }

    pub fn bytes(&mut self, count: usize) -> Vec<u8> {
        (0..count)
            .map(|_| self.next_u64().to_le_bytes()[3])
            .collect()
    }

    pub fn fork(&mut self) -> Self {
        Self::new(self.next_u64())
    }
}

// ---------------------------------------------------------------------------------------------
// Topics, pulls and stored records

pub fn temp_dir() -> tempfile::TempDir {
    tempfile::tempdir().expect("a temp dir")
}

/// Creates `name` with `queues` read and write queues; the answer must be OK.
pub fn create_topic(client: &mut TestClient, name: &str, queues: u32) {
    let response = client
        .request(|builder| {
            upsert_topic_body(builder, name, (queues, queues, PERM_READ_WRITE), false)
        })
        .expect("an answer to UpsertTopicRequest");
    assert_eq!(
        status_of(&response).0,
        wire::Status::OK,
        "creating topic {name}: {:?}",
        status_of(&response)
    );
}

/// A record as a pull returned it, after `decode_message` accepted it: its structure, its
/// body CRC and its `__CRC32#` whole-record CRC all check out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredRecord {
    pub topic: String,
    pub queue_id: u32,
    pub queue_offset: u64,
    pub physical_offset: u64,
    pub total_size: u64,
    pub body: Vec<u8>,
}

impl StoredRecord {
    /// The physical offset just past the record.
    #[must_use]
    pub fn end(&self) -> u64 {
        self.physical_offset + self.total_size
    }
}

/// Decodes the records of a pull response with the broker's own decoder. Panics, naming
/// `what`, on a record that fails to decode or to match its CRCs: the broker served a
/// corrupt record.
pub fn decode_pulled_records(records: &[u8], what: &str) -> Vec<StoredRecord> {
    split_records(records)
        .into_iter()
        .map(|bytes| {
            let view = decode_message(bytes).unwrap_or_else(|error| {
                panic!("{what}: the broker served a record that fails its checks ({error})")
            });
            StoredRecord {
                topic: view.topic().to_owned(),
                queue_id: view.queue_id(),
                queue_offset: view.queue_offset(),
                physical_offset: view.physical_offset(),
                total_size: u64::from(view.total_size()),
                body: view.body().to_vec(),
            }
        })
        .collect()
}

/// How a walk over one queue ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum QueueEnd {
    /// PULL_NOT_FOUND at the queue's end.
    End,
    /// The broker refused a pull at `offset` with `status` (for example when the record there
    /// is damaged).
    Refused {
        offset: i64,
        status: wire::Status,
        message: Option<String>,
    },
}

/// Every record of (`topic`, `queue_id`) from the queue's min offset, pulled in batches until
/// the queue's end or a refusal. Checks that every record is valid (see
/// [`decode_pulled_records`]), belongs to the queue and continues the queue's offsets.
pub fn pull_queue(
    client: &mut TestClient,
    topic: &str,
    queue_id: i32,
) -> (Vec<StoredRecord>, QueueEnd) {
    let place = format!("{topic}/{queue_id}");
    let mut records: Vec<StoredRecord> = Vec::new();
    let mut offset = 0;
    loop {
        let mut params = PullParams::new(topic, queue_id, offset);
        params.max_messages = PULL_BATCH;
        let response = client
            .request(|builder| pull_request_body(builder, &params))
            .unwrap_or_else(|error| panic!("pulling {place} at {offset}: {error}"));
        let (status, message) = status_of(&response);
        let Some(body) = response.frame().body_as_pull_response() else {
            return (
                records,
                QueueEnd::Refused {
                    offset,
                    status,
                    message,
                },
            );
        };
        match status {
            wire::Status::OK => {}
            wire::Status::PULL_NOT_FOUND if body.next_begin_offset() == offset => {
                return (records, QueueEnd::End);
            }
            wire::Status::PULL_OFFSET_MOVED | wire::Status::PULL_NOT_FOUND
                if body.next_begin_offset() > offset && records.is_empty() =>
            {
                // The queue starts past 0 (its oldest records are gone): start there.
                offset = body.next_begin_offset();
                continue;
            }
            _ => {
                return (
                    records,
                    QueueEnd::Refused {
                        offset,
                        status,
                        message,
                    },
                );
            }
        }
        let pulled = decode_pulled_records(
            body.records()
                .map(|bytes| bytes.bytes())
                .unwrap_or_default(),
            &format!("pull of {place} at {offset}"),
        );
        assert!(
            !pulled.is_empty(),
            "{place}: an OK pull at {offset} returned no records"
        );
        let next = offset + i64::try_from(pulled.len()).unwrap();
        for (index, record) in pulled.into_iter().enumerate() {
            let expected_offset = u64::try_from(offset).unwrap() + index as u64;
            assert_eq!(
                (record.topic.as_str(), i64::from(record.queue_id)),
                (topic, i64::from(queue_id)),
                "a pull of {place} returned another queue's record"
            );
            assert_eq!(
                record.queue_offset, expected_offset,
                "{place}: the pull at {offset} returned records out of queue order"
            );
            records.push(record);
        }
        assert_eq!(
            body.next_begin_offset(),
            next,
            "{place}: next_begin_offset is not one past the last record returned"
        );
        offset = next;
    }
}

/// [`pull_queue`] that must reach the queue's end.
pub fn pull_whole_queue(client: &mut TestClient, topic: &str, queue_id: i32) -> Vec<StoredRecord> {
    match pull_queue(client, topic, queue_id) {
        (records, QueueEnd::End) => records,
        (records, refused) => panic!(
            "{topic}/{queue_id}: the pull after {} records was refused: {refused:?}",
            records.len()
        ),
    }
}

/// Sends `messages` as one batch to (`topic`, `queue_id`); the answer must be OK. Returns the
/// queue offset of each message.
pub fn send_batch(
    client: &mut TestClient,
    topic: &str,
    queue_id: i32,
    messages: &[TestMessage],
) -> Vec<u64> {
    let response = client
        .request(|builder| send_request_body(builder, topic, queue_id, messages))
        .unwrap_or_else(|error| panic!("sending to {topic}/{queue_id}: {error}"));
    assert_eq!(
        status(&response),
        wire::Status::OK,
        "sending {} message(s) to {topic}/{queue_id}: {:?}",
        messages.len(),
        status_of(&response)
    );
    let results = response
        .frame()
        .body_as_send_response()
        .expect("a SendResponse")
        .results()
        .expect("SendResponse.results");
    assert_eq!(results.len(), messages.len(), "one SendResult per message");
    results
        .iter()
        .map(|result| u64::try_from(result.queue_offset()).expect("a queue offset"))
        .collect()
}

/// The records a query by `key` in `topic` returns (decoded and CRC-checked, see
/// [`decode_pulled_records`]); empty on QUERY_NOT_FOUND.
pub fn query_by_key(client: &mut TestClient, topic: &str, key: &str) -> Vec<StoredRecord> {
    let response = client
        .request(|builder| {
            let topic = builder.create_string(topic);
            let key = builder.create_string(key);
            let request = wire::QueryByKeyRequest::create(
                builder,
                &wire::QueryByKeyRequestArgs {
                    topic: Some(topic),
                    key: Some(key),
                    begin_ms: 0,
                    end_ms: 0,
                    max_results: 32,
                },
            );
            (wire::Body::QueryByKeyRequest, request.as_union_value())
        })
        .unwrap_or_else(|error| panic!("querying key {key}: {error}"));
    if status(&response) == wire::Status::QUERY_NOT_FOUND {
        return Vec::new();
    }
    assert_eq!(
        status(&response),
        wire::Status::OK,
        "querying key {key}: {:?}",
        status_of(&response)
    );
    let body = response
        .frame()
        .body_as_query_response()
        .expect("a QueryResponse");
    decode_pulled_records(
        body.records()
            .map(|bytes| bytes.bytes())
            .unwrap_or_default(),
        &format!("query by key {key}"),
    )
}

// ---------------------------------------------------------------------------------------------
// Offline verify, routes, processes

/// Runs `shardmq-broker verify --data-dir dir`: whether it exited 0, and what it printed.
#[must_use]
pub fn verify(dir: &Path) -> (bool, String) {
    let output = Command::new(binary_path(BrokerProcess::BINARY))
        .args(["verify", "--data-dir"])
        .arg(dir)
        .output()
        .expect("run shardmq-broker verify");
    (
        output.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        ),
    )
}

/// Panics, saying `when`, unless `verify` finds `dir` clean.
pub fn assert_verify_clean(dir: &Path, when: &str) {
    let (is_clean, output) = verify(dir);
    assert!(
        is_clean,
        "shardmq-broker verify {when} found problems:\n{output}"
    );
}

/// The broker addresses the namesrv routes `topic` to (empty when it has no route).
pub fn routed_addresses(namesrv: &NamesrvProcess, topic: &str) -> Vec<String> {
    let mut client = namesrv.client();
    let Ok(response) = client.request(|builder| {
        let topic = builder.create_string(topic);
        let request = wire::GetRouteRequest::create(
            builder,
            &wire::GetRouteRequestArgs { topic: Some(topic) },
        );
        (wire::Body::GetRouteRequest, request.as_union_value())
    }) else {
        return Vec::new();
    };
    let Some(route) = response.frame().body_as_route_response() else {
        return Vec::new();
    };
    route
        .brokers()
        .into_iter()
        .flatten()
        .flat_map(|broker| broker.addresses().into_iter().flatten())
        .filter_map(|address| address.address().map(str::to_owned))
        .collect()
}

/// Waits until the namesrv routes `topic` to `broker` (a restarted broker listens on a new
/// port and registers again).
pub fn wait_until_routed(namesrv: &NamesrvProcess, topic: &str, broker: &BrokerProcess) {
    let address = broker.addr().to_string();
    wait_until(
        ROUTE_TIMEOUT,
        &format!("the namesrv to route {topic} to {address}"),
        || (routed_addresses(namesrv, topic) == [address.clone()]).then_some(()),
    );
}

/// The resident set size of process `pid`, in KiB (`VmRSS` of `/proc/PID/status`).
#[must_use]
pub fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_else(|error| panic!("reading /proc/{pid}/status: {error}"));
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("no VmRSS line in /proc/{pid}/status"))
}

/// The captured log lines of `broker` that contain every one of `words`.
#[must_use]
pub fn log_lines_with(broker: &BrokerProcess, words: &[&str]) -> Vec<String> {
    broker
        .log_lines()
        .into_iter()
        .filter(|line| words.iter().all(|word| line.contains(word)))
        .collect()
}

/// Whether `error` says the connection is gone (the broker died or closed it).
#[must_use]
pub fn is_connection_lost(error: &ClientError) -> bool {
    matches!(error, ClientError::Closed)
        || matches!(error, ClientError::Io(io) if matches!(
            io.kind(),
            std::io::ErrorKind::ConnectionReset
                | std::io::ErrorKind::BrokenPipe
                | std::io::ErrorKind::UnexpectedEof
                | std::io::ErrorKind::ConnectionRefused
        ))
}

/// A frame's status, for assertions.
#[must_use]
pub fn status(frame: &VerifiedFrame) -> wire::Status {
    status_of(frame).0
}

/// How long a broker may take to answer after a restart.
pub const RESTART_TIMEOUT: Duration = Duration::from_secs(30);
