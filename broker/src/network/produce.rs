//! The send path on a network shard. A producer's run of records (`send_records`, protocol 2):
//! check it in one pass, hand it to the owning storage shard as a slice of its frame, answer in
//! a constant size. A send of wire messages (`send`: older clients, and messages with a delay
//! or a timer): check it (topic, group, batch limits, reserved properties), place delayed and
//! timer messages in their schedule queue, turn the messages into stored records (the per-byte
//! work, so storage cores only assign offsets and write), and answer one result per record.

use std::net::SocketAddr;

use shardmq_schema::{build_frame, peek_run_head, wire, FrameHeader, HeadPeek, VerifiedFrame};

use super::request::{
    frame_error, invalid, refuse, writable_topic, write_queue, Answer, Connection, Refusal,
};
use super::NetworkShard;
use crate::mesh::{StorageRequest, TIMELINE};
use crate::msgid::offset_message_id;
use crate::naming::check_group_name;
use crate::store::index::{index_hash, IndexKind};
use crate::store::record::{
    tags_hash, PendingRecord, RecordInput, RunChecker, RunError, RunRules, SYS_FLAG_COMPRESSED,
};
use crate::store::{AppendStatus, BatchBytes, EncodedBatch};
use crate::topics::{TopicConfig, UpsertError};

/// Property names the broker sets itself; user properties may not use them.
const RESERVED_PROPERTIES: [&str; 13] = [
    "TAGS",
    "KEYS",
    "UNIQ_KEY",
    "__CRC32#",
    "DELAY",
    "WAIT",
    // Delay, timer and retry bookkeeping (schedule.rs, timer.rs, network/send_back.rs).
    "REAL_TOPIC",
    "REAL_QID",
    "TIMER_DELIVER_MS",
    "RETRY_TOPIC",
    "ORIGIN_MESSAGE_ID",
    "RECONSUME_TIME",
    "MAX_RECONSUME_TIMES",
];

/// The reserved names a producer's run may not hold: all but the four a producer writes itself
/// in its records (`TAGS`, `KEYS`, `UNIQ_KEY`, and `__CRC32#` last, which the run check places).
const BROKER_ONLY_PROPERTIES: &[&str] = RESERVED_PROPERTIES.split_at(4).1;

/// One message of a send as either protocol carries it: a native `Message` table, or a
/// RocketMQ send's message (`remoting::send`). What the broker stores of it.
pub(super) trait SendMessage {
    fn body(&self) -> &[u8];
    fn tags(&self) -> Option<&str>;
    fn keys(&self) -> impl Iterator<Item = &str>;
    fn unique_id(&self) -> Option<&str>;
    /// The user's properties (never the reserved names, which the encoding refuses).
    fn user_properties(&self) -> impl Iterator<Item = (&str, &str)>;
    fn flag(&self) -> i32;
    fn born_timestamp_ms(&self) -> i64;
    fn is_compressed(&self) -> bool;
    fn delay_level(&self) -> i32;
    fn deliver_at_ms(&self) -> i64;
    fn delay_ms(&self) -> i64;
}

impl SendMessage for wire::Message<'_> {
    fn body(&self) -> &[u8] {
        wire::Message::body(self)
            .map(|b| b.bytes())
            .unwrap_or_default()
    }
    fn tags(&self) -> Option<&str> {
        wire::Message::tags(self)
    }
    fn keys(&self) -> impl Iterator<Item = &str> {
        wire::Message::keys(self)
            .into_iter()
            .flat_map(|keys| keys.iter())
    }
    fn unique_id(&self) -> Option<&str> {
        wire::Message::unique_id(self)
    }
    fn user_properties(&self) -> impl Iterator<Item = (&str, &str)> {
        wire::Message::properties(self)
            .into_iter()
            .flat_map(|pairs| pairs.iter())
            .map(|pair| {
                (
                    pair.key().unwrap_or_default(),
                    pair.value().unwrap_or_default(),
                )
            })
    }
    fn flag(&self) -> i32 {
        wire::Message::flag(self)
    }
    fn born_timestamp_ms(&self) -> i64 {
        wire::Message::born_timestamp_ms(self)
    }
    fn is_compressed(&self) -> bool {
        self.compression() != wire::Compression::NONE
    }
    fn delay_level(&self) -> i32 {
        wire::Message::delay_level(self)
    }
    fn deliver_at_ms(&self) -> i64 {
        wire::Message::deliver_at_ms(self)
    }
    fn delay_ms(&self) -> i64 {
        wire::Message::delay_ms(self)
    }
}

/// A send stored: its outcome and where it went.
pub(super) struct StoredSend {
    pub outcome: crate::store::AppendOutcome,
    pub placement: Placement,
}

pub(super) async fn send(
    shard: &NetworkShard,
    connection: &Connection,
    id: u64,
    r: wire::SendRequest<'_>,
) -> Answer {
    let messages: Vec<wire::Message<'_>> = r
        .messages()
        .map(|messages| messages.iter().collect())
        .unwrap_or_default();
    let topic = r.topic().unwrap_or_default();
    let stored = store_send(
        shard,
        connection,
        topic,
        r.queue_id(),
        r.producer_group(),
        &messages,
    )
    .await?;
    // The answer names each message by the id it was sent with, read from the request.
    let unique_ids: Vec<&str> = messages
        .iter()
        .map(|m| m.unique_id().unwrap_or_default())
        .collect();
    encode_send_response(shard, id, &stored.outcome, &unique_ids, stored.placement)
}

/// Checks and stores a send of `messages` (topic, group, batch limits, reserved properties),
/// placing delayed and timer messages in their schedule queue and turning the messages into
/// stored records (the per-byte work, so storage cores only assign offsets and write).
pub(super) async fn store_send<M: SendMessage>(
    shard: &NetworkShard,
    connection: &Connection,
    topic: &str,
    queue_id: i32,
    producer_group: Option<&str>,
    messages: &[M],
) -> Result<StoredSend, Refusal> {
    let config = topic_for_send(shard, topic).await?;
    if let Some(group) = producer_group.filter(|g| !g.is_empty()) {
        check_group_name(group).map_err(invalid)?;
    }
    if messages.is_empty() {
        return Err(invalid("messages is empty"));
    }
    if messages.len() > shard.config.max_batch_messages {
        return Err(invalid(format!(
            "batch has {} messages, over max_batch_messages ({})",
            messages.len(),
            shard.config.max_batch_messages
        )));
    }
    let queue_id = write_queue(shard, &config, queue_id)?;
    let store_host = shard.store_host.get();
    // A delayed or timer message waits in a schedule queue on its real queue's storage shard.
    let scheduled = crate::schedule::ScheduledSend::for_send(
        &shard.config,
        shard.storage_shards(),
        topic,
        queue_id,
        messages
            .iter()
            .map(|m| (m.delay_level(), m.deliver_at_ms(), m.delay_ms())),
    )
    .map_err(invalid)?;
    let (store_topic, store_queue, scheduling) = match &scheduled {
        Some(s) => (s.topic, s.queue_id, s.property_pairs()),
        None => (topic, queue_id, Vec::new()),
    };
    let batch = encode_batch(
        shard,
        connection.peer,
        store_host,
        store_topic,
        store_queue,
        messages,
        &scheduling,
    )?;
    let storage = shard.shard_of(topic, queue_id);
    let outcome = shard
        .ask(storage, |reply| StorageRequest::Append { batch, reply })
        .await??;
    let body_bytes = messages.iter().map(|m| m.body().len()).sum();
    crate::metrics::broker().stored(topic, messages.len(), body_bytes);
    // A scheduled message has no position in its real queue until it is delivered there: its
    // answer says so (queue offset -1) rather than give the schedule queue's offset under the
    // real topic's name. Its offset id names the scheduled copy, which query-id finds.
    let placement = Placement {
        queue_id,
        storage,
        is_scheduled: scheduled.is_some(),
    };
    Ok(StoredSend { outcome, placement })
}

/// A producer's run of stored records (`SendRecordsRequest`): checked in one pass without
/// allocating per record, then handed to the storage shard as a slice of the frame (no copy)
/// with what it needs per record; answered in a constant size.
pub(super) async fn send_records(
    shard: &NetworkShard,
    frame: &VerifiedFrame,
    early: Option<EarlyRun>,
    id: u64,
    r: wire::SendRecordsRequest<'_>,
) -> Answer {
    let topic = r.topic().unwrap_or_default();
    let config = topic_for_send(shard, topic).await?;
    if let Some(group) = r.producer_group().filter(|g| !g.is_empty()) {
        check_group_name(group).map_err(invalid)?;
    }
    let run = r.records().map(|v| v.bytes()).unwrap_or_default();
    let expected = r.count() as usize;
    let limits = &shard.config;
    if expected == 0 || expected > limits.max_batch_messages {
        return Err(invalid(format!(
            "count is {expected}; a run holds 1 to max_batch_messages ({}) records",
            limits.max_batch_messages
        )));
    }
    let queue_id = write_queue(shard, &config, r.queue_id())?;
    let store_host = shard.store_host.get();
    let rules = RunRules {
        topic,
        max_body_bytes: limits.max_message_bytes,
        max_records: expected,
        store_host_is_v6: store_host.is_ipv6(),
        reserved_properties: BROKER_ONLY_PROPERTIES,
    };
    // The records checked while the frame arrived count only if the head they were checked
    // under is the verified frame's: the same run at the same place, the same rules.
    let run_at = (run.as_ptr() as usize).wrapping_sub(frame.as_bytes().as_ptr() as usize);
    let early = early.filter(|e| e.is_for(run_at, run.len(), &rules));
    let mut checked = match early {
        Some(early) => early.into_checked()?,
        None => CheckedRun::with_capacity(expected),
    };
    checked.check(run, run.len(), &rules).map_err(run_refusal)?;
    let count = checked.checker.finish(run.len()).map_err(run_refusal)?;
    if count != expected {
        return Err(invalid(format!(
            "the run holds {count} records but count says {expected}"
        )));
    }
    let CheckedRun {
        mut records,
        index_hashes,
        body_bytes,
        ..
    } = checked;
    for record in &mut records {
        record.queue_id = queue_id;
    }
    let bytes = frame
        .share(run)
        .expect("the run is a slice of its own frame");
    let batch = EncodedBatch {
        bytes: BatchBytes::Shared(bytes),
        records,
        topics: vec![topic.to_owned()],
        index_hashes,
        store_host: Some(store_host),
    };
    let storage = shard.shard_of(topic, queue_id);
    tracing::trace!(target: TIMELINE, stage = "run_checked", count);
    let outcome = shard
        .ask(storage, |reply| StorageRequest::Append { batch, reply })
        .await??;
    tracing::trace!(target: TIMELINE, stage = "stored", count);
    crate::metrics::broker().stored(topic, count, body_bytes);
    encode_records_response(shard, id, &outcome, queue_id, storage)
}

fn run_refusal(error: RunError) -> Refusal {
    match error {
        RunError::BodyTooLarge { .. } => refuse(wire::Status::MESSAGE_TOO_LARGE, error.to_string()),
        error => invalid(error.to_string()),
    }
}

/// The check of a run so far, and what it gathered for the storage shard: a record each (its
/// queue is set once the request has been placed) and the index hashes of their keys and ids.
struct CheckedRun {
    checker: RunChecker,
    records: Vec<PendingRecord>,
    index_hashes: Vec<u64>,
    body_bytes: usize,
}

impl CheckedRun {
    fn with_capacity(records: usize) -> Self {
        Self {
            checker: RunChecker::default(),
            records: Vec::with_capacity(records),
            index_hashes: Vec::with_capacity(records),
            body_bytes: 0,
        }
    }

    /// Checks the records of `arrived` (the first bytes of a run of `run_len`) not checked yet.
    fn check(
        &mut self,
        arrived: &[u8],
        run_len: usize,
        rules: &RunRules<'_>,
    ) -> Result<(), RunError> {
        let Self {
            checker,
            records,
            index_hashes,
            body_bytes,
        } = self;
        let topic = rules.topic;
        checker.check_arrived(arrived, run_len, rules, |record| {
            let before = index_hashes.len();
            if let Some(keys) = record.keys {
                index_hashes.extend(
                    keys.split(' ')
                        .map(|key| index_hash(IndexKind::Key, topic, key)),
                );
            }
            if let Some(unique_key) = record.unique_key {
                index_hashes.push(index_hash(IndexKind::UniqueId, "", unique_key));
            }
            *body_bytes += record.body_len as usize;
            records.push(PendingRecord {
                len: record.len,
                queue_id: 0,
                tags_hash: record.tags.map_or(0, tags_hash),
                topic: 0,
                // Keys are bounded by the properties' 64 KiB, so the count fits.
                index_hash_count: (index_hashes.len() - before) as u16,
            });
        })
    }
}

/// A producer's run checked while its frame is still arriving (`connection.rs` calls
/// [`EarlyCheck::advance`] between reads), so the check of a large batch overlaps its
/// transfer instead of following it. What it checked is used only if the verified frame
/// agrees with the head it was checked under ([`send_records`]); otherwise the run is checked
/// again from the start.
pub(super) struct EarlyRun {
    topic: String,
    count: usize,
    run_at: usize,
    run_len: usize,
    max_body_bytes: usize,
    store_host_is_v6: bool,
    checked: CheckedRun,
    /// The refusal found (the run is not checked further).
    refused: Option<RunError>,
}

impl EarlyRun {
    fn is_for(&self, run_at: usize, run_len: usize, rules: &RunRules<'_>) -> bool {
        self.run_at == run_at
            && self.run_len == run_len
            && self.topic == rules.topic
            && self.count == rules.max_records
            && self.max_body_bytes == rules.max_body_bytes
            && self.store_host_is_v6 == rules.store_host_is_v6
    }

    fn into_checked(self) -> Result<CheckedRun, Refusal> {
        match self.refused {
            Some(error) => Err(run_refusal(error)),
            None => Ok(self.checked),
        }
    }

    /// Checks what has arrived of the run (`arrived`: the frame's flatbuffer bytes so far).
    fn advance(&mut self, arrived: &[u8]) {
        if self.refused.is_some() || arrived.len() <= self.run_at {
            return;
        }
        let rules = RunRules {
            topic: &self.topic,
            max_body_bytes: self.max_body_bytes,
            max_records: self.count,
            store_host_is_v6: self.store_host_is_v6,
            reserved_properties: BROKER_ONLY_PROPERTIES,
        };
        let outcome = self
            .checked
            .check(&arrived[self.run_at..], self.run_len, &rules);
        if let Err(error) = outcome {
            self.refused = Some(error);
        }
    }
}

/// The early check of the frame being received on a connection.
#[derive(Default)]
pub(super) enum EarlyCheck {
    /// Its head has not been looked at (or has not arrived).
    #[default]
    Unknown,
    /// Not a run this shard checks early: it is handled once whole, as every frame.
    NotARun,
    Checking(Box<EarlyRun>),
}

impl EarlyCheck {
    /// After a read: `arrived` is what has arrived of the frame's flatbuffer (after its length
    /// prefix), `frame_len` its whole length.
    pub(super) fn advance(&mut self, shard: &NetworkShard, arrived: &[u8], frame_len: usize) {
        if let EarlyCheck::Unknown = self {
            *self = match peek_run_head(arrived, frame_len) {
                HeadPeek::NeedMore => return,
                HeadPeek::NotARun => EarlyCheck::NotARun,
                HeadPeek::Run(head) => {
                    let count = head.count as usize;
                    if count == 0 || count > shard.config.max_batch_messages {
                        // Refused once whole, with the reason.
                        EarlyCheck::NotARun
                    } else {
                        EarlyCheck::Checking(Box::new(EarlyRun {
                            topic: head.topic.to_owned(),
                            count,
                            run_at: head.run_at,
                            run_len: head.run_len,
                            max_body_bytes: shard.config.max_message_bytes,
                            store_host_is_v6: shard.store_host.get().is_ipv6(),
                            checked: CheckedRun::with_capacity(count),
                            refused: None,
                        }))
                    }
                }
            };
        }
        if let EarlyCheck::Checking(early) = self {
            early.advance(arrived);
        }
    }

    /// What was checked of the frame just completed; the next frame starts unknown.
    pub(super) fn take(&mut self) -> Option<EarlyRun> {
        match std::mem::take(self) {
            EarlyCheck::Checking(early) => Some(*early),
            _ => None,
        }
    }
}

/// The topic a send may write to: its config, creating the topic first on storage shard 0
/// when the broker auto-creates topics.
async fn topic_for_send(shard: &NetworkShard, topic: &str) -> Result<TopicConfig, Refusal> {
    Ok(match writable_topic(shard, topic)? {
        Some(config) => config,
        None if shard.config.auto_create_topics => {
            let config = TopicConfig::new(topic, shard.config.default_topic_queues);
            let created = config.clone();
            let outcome = shard
                .ask(0, |reply| StorageRequest::UpsertTopic {
                    config,
                    is_create_only: true,
                    reply,
                })
                .await?;
            match outcome {
                Ok(()) | Err(UpsertError::Exists) => created,
                Err(UpsertError::Invalid(why)) => return Err(invalid(why)),
            }
        }
        None => {
            return Err(refuse(
                wire::Status::TOPIC_NOT_FOUND,
                format!(
                "topic {topic} does not exist on this broker (create it first; auto-create is off)"
            ),
            ))
        }
    })
}

/// Where a stored send went, for its answer.
pub(super) struct Placement {
    /// The queue the producer sent to.
    pub queue_id: u32,
    pub storage: usize,
    /// The messages wait in a schedule queue (delay level or timer).
    pub is_scheduled: bool,
}

/// The answer to a stored send (or half message): one result per record, the status of its
/// flush. A record whose message had no unique id is named by its offset id.
pub(super) fn encode_send_response(
    shard: &NetworkShard,
    id: u64,
    outcome: &crate::store::AppendOutcome,
    unique_ids: &[&str],
    placement: Placement,
) -> Answer {
    let Placement {
        queue_id,
        storage,
        is_scheduled,
    } = placement;
    let store_host = shard.store_host.get();
    let (status, message) = append_status(outcome);
    shard
        .with_encoder(|encoder| {
            encoder.encode(|b| {
                let results: Vec<_> = outcome
                    .records
                    .iter()
                    .zip(unique_ids)
                    .map(|(record, unique_id)| {
                        let offset_id =
                            offset_message_id(store_host, storage, record.physical_offset);
                        let unique = if unique_id.is_empty() {
                            offset_id.as_str()
                        } else {
                            unique_id
                        };
                        let unique = b.create_string(unique);
                        let offset_id = b.create_string(&offset_id);
                        wire::SendResult::create(
                            b,
                            &wire::SendResultArgs {
                                unique_id: Some(unique),
                                offset_msg_id: Some(offset_id),
                                queue_offset: if is_scheduled {
                                    -1
                                } else {
                                    record.queue_offset as i64
                                },
                                commit_log_offset: record.physical_offset as i64,
                            },
                        )
                    })
                    .collect();
                let results = b.create_vector(&results);
                let body = wire::SendResponse::create(
                    b,
                    &wire::SendResponseArgs {
                        queue_id: queue_id as i32,
                        results: Some(results),
                    },
                );
                let header = FrameHeader::response(id, status).with_message(message);
                build_frame(
                    b,
                    &header,
                    wire::Body::SendResponse,
                    Some(body.as_union_value()),
                )
            })
        })
        .map(|frame| vec![frame])
        .map_err(frame_error)
}

/// The flush outcome of an append as a status and its message.
pub(super) fn append_status(outcome: &crate::store::AppendOutcome) -> (wire::Status, &'static str) {
    match outcome.status {
        AppendStatus::Ok => (wire::Status::OK, ""),
        AppendStatus::FlushDiskTimeout => {
            crate::metrics::broker().sync_flush_timeouts.inc();
            (
                wire::Status::FLUSH_DISK_TIMEOUT,
                "stored, but the sync flush did not complete within sync_flush_timeout_ms",
            )
        }
        AppendStatus::FlushSlaveTimeout => (
            wire::Status::FLUSH_SLAVE_TIMEOUT,
            "stored on the master, but the slave did not acknowledge it within sync_flush_timeout_ms",
        ),
        AppendStatus::SlaveNotAvailable => (
            wire::Status::SLAVE_NOT_AVAILABLE,
            "stored on the master, but no slave is replicating from it (sync-master)",
        ),
    }
}

/// The constant-size answer to a stored run: where its first record went and where any record
/// that a segment rollover moved starts.
fn encode_records_response(
    shard: &NetworkShard,
    id: u64,
    outcome: &crate::store::AppendOutcome,
    queue_id: u32,
    storage: usize,
) -> Answer {
    let (status, message) = append_status(outcome);
    let first = outcome.records.first();
    let mut segment_starts = Vec::new();
    let mut expected = first.map_or(0, |r| r.physical_offset);
    for (index, record) in outcome.records.iter().enumerate() {
        if record.physical_offset != expected {
            segment_starts.push(wire::SegmentStart::new(
                index as u32,
                record.physical_offset,
            ));
        }
        expected = record.physical_offset + u64::from(record.size);
    }
    let store_host = shard.store_host.get().to_string();
    shard
        .with_encoder(|encoder| {
            encoder.encode(|b| {
                let starts = b.create_vector(&segment_starts);
                let store_host = b.create_string(&store_host);
                let body = wire::SendRecordsResponse::create(
                    b,
                    &wire::SendRecordsResponseArgs {
                        queue_id: queue_id as i32,
                        count: outcome.records.len() as u32,
                        first_queue_offset: first.map_or(-1, |r| r.queue_offset as i64),
                        first_physical_offset: first.map_or(-1, |r| r.physical_offset as i64),
                        segment_starts: Some(starts),
                        store_host: Some(store_host),
                        storage_shard: storage as u32,
                    },
                );
                let header = FrameHeader::response(id, status).with_message(message);
                build_frame(
                    b,
                    &header,
                    wire::Body::SendRecordsResponse,
                    Some(body.as_union_value()),
                )
            })
        })
        .map(|frame| vec![frame])
        .map_err(frame_error)
}

/// Turns wire messages into stored records (the per-byte work of the send path).
pub(super) fn encode_batch<'m, M: SendMessage + 'm>(
    shard: &NetworkShard,
    born_host: SocketAddr,
    store_host: SocketAddr,
    topic: &str,
    queue_id: u32,
    messages: impl IntoIterator<Item = &'m M>,
    scheduling: &[(&str, &str)],
) -> Result<EncodedBatch, Refusal> {
    let mut batch = EncodedBatch::new();
    for (index, message) in messages.into_iter().enumerate() {
        let body = message.body();
        if body.len() > shard.config.max_message_bytes {
            return Err(refuse(
                wire::Status::MESSAGE_TOO_LARGE,
                format!(
                    "message {index}: body is {} bytes, over max_message_bytes ({})",
                    body.len(),
                    shard.config.max_message_bytes
                ),
            ));
        }
        let mut keys_joined = String::new();
        for key in message.keys() {
            if key.is_empty() || key.contains(' ') {
                return Err(invalid(format!(
                    "message {index}: key `{key}` is empty or contains a space"
                )));
            }
            if !keys_joined.is_empty() {
                keys_joined.push(' ');
            }
            keys_joined.push_str(key);
        }
        let mut properties: Vec<(&str, &str)> = Vec::with_capacity(4);
        if let Some(tags) = message.tags().filter(|t| !t.is_empty()) {
            properties.push(("TAGS", tags));
        }
        if !keys_joined.is_empty() {
            properties.push(("KEYS", &keys_joined));
        }
        if let Some(unique_id) = message.unique_id().filter(|u| !u.is_empty()) {
            properties.push(("UNIQ_KEY", unique_id));
        }
        for (key, value) in message.user_properties() {
            if key.is_empty() || RESERVED_PROPERTIES.contains(&key) {
                return Err(invalid(format!(
                    "message {index}: property name `{key}` is empty or reserved"
                )));
            }
            properties.push((key, value));
        }
        properties.extend_from_slice(scheduling);
        let sys_flag = if message.is_compressed() {
            SYS_FLAG_COMPRESSED
        } else {
            0
        };
        let input = RecordInput {
            topic,
            queue_id,
            flag: message.flag(),
            body,
            properties: &properties,
            sys_flag,
            born_timestamp_ms: message.born_timestamp_ms(),
            born_host,
            store_host,
            reconsume_times: 0,
            prepared_transaction_offset: 0,
        };
        batch
            .push(&input)
            .map_err(|e| invalid(format!("message {index}: {e}")))?;
    }
    Ok(batch)
}
